// Loading the PTX compiler plugin (libflashattn_ptxc.so) and calling it.
#include "backend/ptx_compiler.h"

#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "cache/store_internal.h"
#include "common/error.h"
#include "ptxc/fa_ptxc.h"

namespace fa::ptxc {

struct Plugin {
  int (*abi_version)() = nullptr;
  const char *(*compiler_version)() = nullptr;
  int (*compile)(const char *, size_t, const char *, void **, size_t *, char **) = nullptr;
  void (*free)(void *) = nullptr;
};

namespace {

// The directory of the object this function was linked into
// (libflashattn.so, or a program linking the static library), links of the
// directory resolved later by the trust check. dladdr names the file as it
// was loaded: libflashattn.so.0 through its SONAME link is fine, only the
// plugin's own path may not be a link.
std::string own_directory(bool *is_program) {
  *is_program = false;
  Dl_info info;
  std::memset(&info, 0, sizeof info);
  if (dladdr(reinterpret_cast<void *>(&own_directory), &info) == 0 || info.dli_fname == nullptr ||
      info.dli_fname[0] == '\0') {
    return "";
  }
  std::string file = info.dli_fname;
  if (file.find('/') == std::string::npos) {
    // A program started through PATH: its real path.
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return "";
    file.assign(buf, static_cast<size_t>(n));
  }
  if (file[0] != '/') {
    char *real = realpath(file.c_str(), nullptr);
    if (real == nullptr) return "";
    file = real;
    std::free(real);
  }
  char *real = realpath(file.c_str(), nullptr);
  char *exe = realpath("/proc/self/exe", nullptr);
  *is_program = real != nullptr && exe != nullptr && std::strcmp(real, exe) == 0;
  std::free(real);
  std::free(exe);
  const size_t slash = file.find_last_of('/');
  return slash == 0 ? "/" : file.substr(0, slash);
}

// Where the plugin is looked for when FLASHATTN_PTX_COMPILER is unset, first
// found first: next to libflashattn; for a program linking the static
// library (the flashattn CLI in PREFIX/bin), also PREFIX/lib and
// PREFIX/lib64. Not a build tree's directory above: test programs there
// would pick up the real plugin. The file found still passes the trust check.
std::vector<std::string> plugin_candidates(const std::string &dir, bool is_program) {
  const std::string base = dir == "/" ? "" : dir;
  std::vector<std::string> out = {base + "/" + kPluginName};
  if (is_program) {
    for (const char *rel : {"/../lib/", "/../lib64/"}) out.push_back(base + rel + kPluginName);
  }
  return out;
}

bool turned_off(const char *v) {
  return strcasecmp(v, "off") == 0 || std::strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0 ||
         strcasecmp(v, "no") == 0;
}

// The one load attempt; fills *st.
void load(PluginState *st, Plugin *plugin) {
  const char *env = std::getenv("FLASHATTN_PTX_COMPILER");
  if (env != nullptr && env[0] != '\0') {
    if (turned_off(env)) {
      st->note = std::string("turned off by FLASHATTN_PTX_COMPILER=") + env;
      return;
    }
    if (env[0] != '/') {
      st->note = std::string("FLASHATTN_PTX_COMPILER=") + env +
                 " is not an absolute path (or off): the PTX compiler plugin is not used";
      warn(st->note);
      return;
    }
    st->path = env;
  } else {
    bool is_program = false;
    const std::string dir = own_directory(&is_program);
    if (dir.empty()) {
      st->note = "cannot tell which directory libflashattn was loaded from";
      return;
    }
    const std::vector<std::string> candidates = plugin_candidates(dir, is_program);
    for (const std::string &c : candidates) {
      if (access(c.c_str(), F_OK) == 0) {
        st->path = c;
        break;
      }
    }
    if (st->path.empty()) {
      st->path = candidates.front();
      st->note = "no PTX compiler plugin at " + candidates.front();
      for (size_t i = 1; i < candidates.size(); ++i)
        st->note += (i + 1 == candidates.size() ? " or " : ", ") + candidates[i];
      return;
    }
  }
  int fd = -1;
  std::string real;
  if (std::string why = cache::open_trusted_code_file(st->path, &fd, &real); !why.empty()) {
    st->note = "PTX compiler plugin not used: " + why;
    warn(st->note + " (the driver JIT-compiles instead)");
    return;
  }
  // The descriptor checked is the file loaded (no swap between check and
  // load); the path itself where /proc is missing (its directory passed).
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  void *handle = dlopen(proc.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr && access("/proc/self/fd", F_OK) != 0) {
    handle = dlopen(real.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  const char *err = handle == nullptr ? dlerror() : nullptr;
  close(fd);
  st->path = real;
  if (handle == nullptr) {
    st->note = "cannot load the PTX compiler plugin " + real + ": " + (err ? err : "dlopen failed");
    warn(st->note);
    return;
  }
  // Never dlclose'd: cubins and logs may be in flight on other threads.
  plugin->abi_version = reinterpret_cast<int (*)()>(dlsym(handle, "fa_ptxc_abi_version"));
  plugin->compiler_version =
      reinterpret_cast<const char *(*)()>(dlsym(handle, "fa_ptxc_compiler_version"));
  plugin->compile =
      reinterpret_cast<int (*)(const char *, size_t, const char *, void **, size_t *, char **)>(
          dlsym(handle, "fa_ptxc_compile"));
  plugin->free = reinterpret_cast<void (*)(void *)>(dlsym(handle, "fa_ptxc_free"));
  if (!plugin->abi_version || !plugin->compiler_version || !plugin->compile || !plugin->free) {
    st->note = "PTX compiler plugin " + real +
               " lacks fa_ptxc_abi_version, fa_ptxc_compiler_version, fa_ptxc_compile or "
               "fa_ptxc_free";
    warn(st->note);
    return;
  }
  const int abi = plugin->abi_version();
  if (abi != FA_PTXC_ABI_VERSION) {
    st->note = "PTX compiler plugin " + real + " has ABI version " + std::to_string(abi) +
               ", this libflashattn needs " + std::to_string(FA_PTXC_ABI_VERSION);
    warn(st->note);
    return;
  }
  const char *version = plugin->compiler_version();
  if (version == nullptr || version[0] == '\0' || std::strcmp(version, kDriverJit) == 0 ||
      std::strlen(version) > 120) {
    st->note = "PTX compiler plugin " + real + " gives no usable compiler version";
    warn(st->note);
    return;
  }
  st->version = version;
  st->plugin = plugin;
}

}  // namespace

const PluginState &plugin_state() {
  static PluginState state;
  static Plugin plugin;
  static std::once_flag once;
  std::call_once(once, [] { load(&state, &plugin); });
  return state;
}

std::string cubin_target(const std::string &ptx, int device_sm) {
  size_t at = ptx.find(".target");
  if (at != std::string::npos) at = ptx.find("sm_", at);
  if (at != std::string::npos) {
    size_t end = at + 3;
    while (end < ptx.size() && ptx[end] >= '0' && ptx[end] <= '9') ++end;
    if (end > at + 3 && end < ptx.size() && (ptx[end] == 'a' || ptx[end] == 'f') &&
        (end + 1 == ptx.size() || !std::isalnum(static_cast<unsigned char>(ptx[end + 1])))) {
      if (ptx[end] == 'a') return ptx.substr(at, end + 1 - at);  // sm_90a: exactly that
    }
  }
  return "sm_" + std::to_string(device_sm);
}

bool is_cubin(const std::vector<uint8_t> &binary) {
  return binary.size() >= 4 && std::memcmp(binary.data(),
                                           "\x7f"
                                           "ELF",
                                           4) == 0;
}

fa_status compile_cubin(const Plugin *plugin, const std::string &ptx, const std::string &target,
                        std::vector<uint8_t> *cubin, std::string *log) {
  if (cubin == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "compile_cubin: cubin is null");
  cubin->clear();
  if (log != nullptr) log->clear();
  if (plugin == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "compile_cubin: no plugin");
  if (ptx.empty()) return fail(FA_ERROR_INVALID_ARGUMENT, "compile_cubin: empty PTX");
  void *image = nullptr;
  size_t size = 0;
  char *text = nullptr;
  const int rc = plugin->compile(ptx.data(), ptx.size(), target.c_str(), &image, &size, &text);
  const std::string log_text = text != nullptr ? std::string(text) : std::string();
  plugin->free(text);
  if (log != nullptr) *log = log_text;
  if (rc == FA_PTXC_OK && image != nullptr && size > 0) {
    cubin->assign(static_cast<const uint8_t *>(image), static_cast<const uint8_t *>(image) + size);
    plugin->free(image);
    if (!is_cubin(*cubin)) {
      cubin->clear();
      return fail(FA_ERROR_INTERNAL, "the PTX compiler plugin returned a binary that is not ELF");
    }
    return FA_SUCCESS;
  }
  plugin->free(image);
  const std::string head = log_text.size() > 700 ? log_text.substr(0, 700) + " [...]" : log_text;
  switch (rc) {
    case FA_PTXC_ERROR_COMPILE:
      return fail(FA_ERROR_COMPILE, "the PTX compiler plugin rejected the PTX for %s: %s",
                  target.c_str(), head.empty() ? "(no error log)" : head.c_str());
    case FA_PTXC_ERROR_UNSUPPORTED:
      return fail(FA_ERROR_UNSUPPORTED,
                  "the PTX compiler plugin does not support this PTX or target %s: %s",
                  target.c_str(), head.empty() ? "(no error log)" : head.c_str());
    case FA_PTXC_ERROR_INVALID:
      return fail(FA_ERROR_INVALID_ARGUMENT, "the PTX compiler plugin refused target '%s'",
                  target.c_str());
    default:
      return fail(FA_ERROR_INTERNAL, "the PTX compiler plugin failed (%d) for %s: %s", rc,
                  target.c_str(), head.empty() ? "(no log)" : head.c_str());
  }
}

}  // namespace fa::ptxc

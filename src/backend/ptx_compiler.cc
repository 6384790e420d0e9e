// Loading the PTX compiler plugin (libflashattn_ptxc.so) and calling it.
#include "backend/ptx_compiler.h"

#include <dlfcn.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/error.h"
#include "common/plugin.h"
#include "ptxc/fa_ptxc.h"

namespace fa::ptxc {

struct Plugin {
  int (*abi_version)() = nullptr;
  const char *(*compiler_version)() = nullptr;
  int (*compile)(const char *, size_t, const char *, void **, size_t *, char **) = nullptr;
  void (*free)(void *) = nullptr;
};

namespace {

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
  }
  const PluginFile file = open_plugin(st->path, kPluginName, "PTX compiler plugin");
  st->path = file.path;
  if (file.handle == nullptr) {
    st->note = file.why;
    if (file.untrusted) warn(st->note + " (the driver JIT-compiles instead)");
    if (!file.missing && !file.untrusted) warn(st->note);
    return;
  }
  void *handle = file.handle;
  const std::string &real = file.path;
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

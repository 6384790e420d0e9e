// Locating and loading plugins under the cache's trust rules (plugin.h).
#include "common/plugin.h"

#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "cache/store_internal.h"

namespace fa {

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

// Where a plugin is looked for when no variable names it, first found
// first: next to libflashattn; for a program linking the static library
// (the flashattn CLI in PREFIX/bin), also PREFIX/lib and PREFIX/lib64. Not
// a build tree's directory above: test programs there would pick up the
// real plugin. The file found still passes the trust check.
std::vector<std::string> plugin_candidates(const std::string &dir, bool is_program,
                                           const char *file) {
  const std::string base = dir == "/" ? "" : dir;
  std::vector<std::string> out = {base + "/" + file};
  if (is_program) {
    for (const char *rel : {"/../lib/", "/../lib64/"}) out.push_back(base + rel + file);
  }
  return out;
}

}  // namespace

bool turned_off(const char *v) {
  return strcasecmp(v, "off") == 0 || std::strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0 ||
         strcasecmp(v, "no") == 0;
}

PluginFile open_plugin(const std::string &path, const char *file, const char *what) {
  PluginFile out;
  out.path = path;
  if (out.path.empty()) {
    bool is_program = false;
    const std::string dir = own_directory(&is_program);
    if (dir.empty()) {
      out.why = "cannot tell which directory libflashattn was loaded from";
      out.missing = true;
      return out;
    }
    const std::vector<std::string> candidates = plugin_candidates(dir, is_program, file);
    for (const std::string &c : candidates) {
      if (access(c.c_str(), F_OK) == 0) {
        out.path = c;
        break;
      }
    }
    if (out.path.empty()) {
      out.path = candidates.front();
      out.why = std::string("no ") + what + " at " + candidates.front();
      for (size_t i = 1; i < candidates.size(); ++i)
        out.why += (i + 1 == candidates.size() ? " or " : ", ") + candidates[i];
      out.missing = true;
      return out;
    }
  }
  int fd = -1;
  std::string real;
  if (std::string why = cache::open_trusted_code_file(out.path, &fd, &real); !why.empty()) {
    out.why = std::string(what) + " not used: " + why;
    out.untrusted = true;
    return out;
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
  out.path = real;
  if (handle == nullptr) {
    out.why =
        std::string("cannot load the ") + what + " " + real + ": " + (err ? err : "dlopen failed");
    return out;
  }
  out.handle = handle;
  return out;
}

}  // namespace fa

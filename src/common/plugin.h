// Finding and loading the library's optional plugins (the PTX compiler
// plugin, the Redis kernel store): shared objects next to libflashattn, or
// at an absolute path a variable names, loaded only after the trust checks
// of the kernel cache (cache::open_trusted_code_file), never dlclose'd.
#pragma once

#include <string>
#include <vector>

namespace fa {

// "off", "0", "false" or "no", in any case: a variable turning a plugin off.
bool turned_off(const char *value);

// The outcome of open_plugin.
struct PluginFile {
  void *handle = nullptr;  // dlopen handle (RTLD_NOW | RTLD_LOCAL); null: see why
  std::string path;        // the file loaded (directory links resolved), or looked for
  std::string why;         // why there is none; "" when loaded
  bool missing = false;    // a default location without the file (no warning due)
  bool untrusted = false;  // the file failed the trust check
};

// Loads a plugin. `path`: an absolute path (from a variable), or "" for
// `file` in the directory of the library (or program) libflashattn is
// linked into, and for a program linking the static library (the CLI in
// PREFIX/bin) then <dir>/../lib and <dir>/../lib64, first found first. The
// file must pass cache::open_trusted_code_file; the descriptor checked is
// the one loaded (dlopen of /proc/self/fd/N). `what` names the plugin in
// the messages ("PTX compiler plugin"). Thread-safe; each call loads anew
// (dlopen reference counts): callers keep the handle.
PluginFile open_plugin(const std::string &path, const char *file, const char *what);

}  // namespace fa

// The PTX compiler plugin (libflashattn_ptxc.so, src/ptxc/): NVIDIA's PTX
// compiler library behind a small C ABI (src/ptxc/fa_ptxc.h), dlopen'ed at
// most once per process. It turns PTX into a cubin for an exact target
// (sm_80, sm_90a, sm_100a, ...) whole-program, in-process, with no GPU and
// no driver: the cuda backend uses it on every miss, and an offline warmer
// can call compile_cubin() on a machine without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn.h"

namespace fa::ptxc {

// The file name looked for next to libflashattn.
constexpr const char *kPluginName = "libflashattn_ptxc.so";

// What row compilers are called when the driver JITs the PTX (the row's
// binary is then the PTX and a NUL).
constexpr const char *kDriverJit = "driver-jit";

struct Plugin;  // opaque: the resolved entry points

// The outcome of the one load attempt of this process.
struct PluginState {
  const Plugin *plugin = nullptr;  // null: no plugin (see note)
  std::string version;             // fa_ptxc_compiler_version(), when loaded
  std::string path;                // the file loaded, or looked for
  std::string note;                // why there is none ("" when loaded)
};

// Loads the plugin the first time it is called; later calls return the same
// state. Where: FLASHATTN_PTX_COMPILER, when set and not empty: "off", "0",
// "false" or "no" turn the plugin off; otherwise an absolute path to the
// plugin. Unset or empty: libflashattn_ptxc.so in the directory of the
// library (or program) libflashattn is linked into; for a program linking
// the static library (the CLI in PREFIX/bin) then also in <dir>/../lib and
// <dir>/../lib64. The file must pass
// cache::open_trusted_code_file (never a symbolic link; this user's or
// root's; writable by no one else; the same for its directory and the
// directories above) and export fa_ptxc_abi_version() == FA_PTXC_ABI_VERSION.
// A plugin that is refused or broken gives one warning (fa::warn) and no
// plugin; a default location without the file is silent. Thread-safe.
const PluginState &plugin_state();

// The cubin target for `ptx` on a device of SM `device_sm`: "sm_90a" for
// `.target sm_90a` PTX (arch-specific code runs only on exactly that SM),
// else "sm_<device_sm>" (the exact machine the cubin will run on).
std::string cubin_target(const std::string &ptx, int device_sm);

// Compiles `ptx` into a cubin for `target` with `plugin`, whole-program, -O3.
// *log gets the compiler's error log then its info log (registers, spills).
// Errors: FA_ERROR_COMPILE (the PTX was rejected; the head of the log is in
// the message), FA_ERROR_UNSUPPORTED (a PTX ISA version or target this
// compiler does not know: the caller may fall back to the driver's JIT),
// FA_ERROR_INVALID_ARGUMENT (null plugin, empty PTX, a target that is not
// sm_NN[a|f]), FA_ERROR_INTERNAL (out of memory, a compiler failure).
fa_status compile_cubin(const Plugin *plugin, const std::string &ptx, const std::string &target,
                        std::vector<uint8_t> *cubin, std::string *log);

// True when `binary` starts with an ELF header (a cubin).
bool is_cubin(const std::vector<uint8_t> &binary);

}  // namespace fa::ptxc

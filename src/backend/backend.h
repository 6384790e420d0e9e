// Device backends behind one interface: cuda (libcuda.so.1, dlopen'ed) and
// the emulator (CPU interpreter of the generated PTX). Nothing here knows
// about the C ABI structs, the kernel generators or the cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "emu/profile.h"
#include "flashattn.h"
#include "kernels/launch.h"  // LaunchGeometry, DeviceLimits, published_limits

namespace fa {

struct DeviceInfo {
  std::string name;
  int sm = 0;  // e.g. 80, 86, 90, 120
  int num_sms = 0;
  DeviceLimits limits;     // limits.sm == sm
  int driver_version = 0;  // cuDriverGetVersion; 0 on the emulator
};

// A tiled tensor map (TMA descriptor) to encode: `rank` dimensions, dim 0
// innermost and contiguous. The cuda backend encodes it with
// cuTensorMapEncodeTiled (OOB elements read as zero, L2 promotion 128B), the
// emulator with emu::TensorMap (src/emu/tensor_map.h).
struct TensorMapDesc {
  uint32_t rank = 0;        // 1..5
  uint32_t elem_bytes = 2;  // 2: f16/bf16; 1: fp8 bytes (the sm_100a fp8 forward)
  bool bf16 = false;
  uint64_t base = 0;         // device address, 16-byte aligned
  uint64_t dims[5] = {};     // elements, each >= 1 and < 2^32
  uint64_t strides[5] = {};  // bytes; strides[0] = elem_bytes, others multiples of 16, < 2^40
  uint32_t box[5] = {};  // elements per copy, each 1..256; box[0] * elem_bytes <= 128 when swizzled
  uint32_t swizzle = 0;  // 0 none, 3 = 128-byte (CU_TENSOR_MAP_SWIZZLE_128B)
};

// A loaded kernel entry point. Owned by the runtime's kernel map.
class Kernel {
 public:
  virtual ~Kernel() = default;
};

// How a backend turns PTX into machine code (fa_cache_stats.compiler_mode).
struct CompilerInfo {
  fa_compiler_mode mode = FA_COMPILER_NONE;
  // What cache rows record as their compiler: the plugin's version
  // (FA_COMPILER_PLUGIN), ptxc::kDriverJit (FA_COMPILER_DRIVER_JIT), "" (none).
  std::string version;
  std::string note;  // why the PTX compiler plugin is not used ("" when it is)
};

// Which compiler compile() uses: the backend's best (the plugin when it has
// one), or the driver's JIT (after the driver refused a cubin).
enum class CompileWith { kBest, kDriverJit };

class Backend {
 public:
  virtual ~Backend() = default;

  virtual fa_backend kind() const = 0;
  virtual const DeviceInfo &info() const = 0;
  virtual CompilerInfo compiler() const { return CompilerInfo(); }

  // Turns PTX text into the binary that load() accepts and the cache stores.
  // cuda with the PTX compiler plugin (kBest): a cubin for the device's exact
  // SM (sm_NNa for arch-specific PTX), compiled in-process whole-program;
  // cuda otherwise: the PTX itself and a NUL, after the driver compiled it
  // whole-program (that module is kept for the load() of the same PTX that
  // follows: one JIT per miss); emulator: nothing, *binary left empty.
  // *log receives the compiler's info log (registers, spills, advisories).
  // *used (may be null) gets the compiler that built *binary, as
  // compiler().version names it, or ptxc::kDriverJit when the plugin does
  // not support the target (a GPU newer than the plugin) and the driver
  // compiled instead. Errors: FA_ERROR_COMPILE with the error log in the
  // message, FA_ERROR_CUDA, FA_ERROR_INTERNAL.
  virtual fa_status compile(const std::string &ptx, std::vector<uint8_t> *binary,
                            std::string *log, CompileWith with, std::string *used) = 0;
  fa_status compile(const std::string &ptx, std::vector<uint8_t> *binary, std::string *log) {
    return compile(ptx, binary, log, CompileWith::kBest, nullptr);
  }

  // Loads entry point `entry` from `binary` when non-empty, else from `ptx`.
  // A cubin (ELF) is loaded as it is, with no JIT. `dynamic_smem_bytes` is
  // the largest dynamic shared memory it will be launched with (cuda sets
  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES above 48 KB).
  // Errors: FA_ERROR_COMPILE (the driver refused the image: for a cubin,
  // too new, another SM or damaged; the caller may fall back to the PTX),
  // FA_ERROR_CUDA, FA_ERROR_UNSUPPORTED (more shared memory than the device
  // allows).
  virtual fa_status load(const std::string &ptx, const std::vector<uint8_t> &binary,
                         const std::string &entry, uint32_t dynamic_smem_bytes,
                         std::unique_ptr<Kernel> *out) = 0;

  // Launches with a single kernel parameter: the `params_size` bytes at
  // `params` (every generated kernel takes one `.param .align 8 .b8` array).
  // cuda: asynchronous on `stream`; emulator: runs to completion.
  // Errors: FA_ERROR_LAUNCH (emulator fault: out of bounds, deadlock,
  // divergent collective; message names the PTX line), FA_ERROR_CUDA,
  // FA_ERROR_INVALID_ARGUMENT (parameter block shorter than the kernel's,
  // zero dimension), FA_ERROR_RUNTIME_POISONED after a sticky error.
  virtual fa_status launch(Kernel &kernel, const LaunchGeometry &geometry, const void *params,
                           size_t params_size, void *stream) = 0;

  virtual fa_status mem_alloc(size_t bytes, uint64_t *ptr) = 0;
  virtual fa_status mem_free(uint64_t ptr) = 0;
  virtual fa_status copy_htod(uint64_t dst, const void *src, size_t bytes) = 0;
  virtual fa_status copy_dtoh(void *dst, uint64_t src, size_t bytes) = 0;
  virtual fa_status memset_d8(uint64_t dst, uint8_t value, size_t bytes) = 0;
  virtual fa_status synchronize(void *stream) = 0;

  // Writes the 128-byte tensor map a kernel reads with cp.async.bulk.tensor
  // (host only: no device access, so launches stay CUDA-graph safe).
  // Errors: FA_ERROR_INVALID_ARGUMENT (alignment, stride or box rules of
  // cuTensorMapEncodeTiled), FA_ERROR_UNSUPPORTED (a driver without
  // cuTensorMapEncodeTiled, or a device below sm_90), FA_ERROR_CUDA.
  virtual fa_status encode_tensor_map(const TensorMapDesc &desc, uint8_t out[128]) = 0;

  // Emulator only: the memory counters of this backend's most recent launch
  // (emu/profile.h), kept when that launch ran with profiling on
  // (FLASHATTN_EMU_PROFILE=1). Errors: FA_ERROR_UNSUPPORTED (another
  // backend: no message set; the emulator: no profiled launch yet, or the
  // last launch ran without profiling or faulted).
  virtual fa_status last_profile(emu::LaunchProfile *out) const {
    (void)out;
    return FA_ERROR_UNSUPPORTED;
  }
};

// cuda backend on `device` (primary context); with `ptx_compiler` the PTX
// compiler plugin when ptxc::plugin_state() has one. Errors:
// FA_ERROR_NO_DRIVER (libcuda.so.1 absent or older than the pinned API),
// FA_ERROR_NO_DEVICE, FA_ERROR_CUDA.
fa_status create_cuda_backend(int device, bool ptx_compiler, std::unique_ptr<Backend> *out);
inline fa_status create_cuda_backend(int device, std::unique_ptr<Backend> *out) {
  return create_cuda_backend(device, true, out);
}

// emulator backend pretending to be SM `sm` (one published_limits knows), with its limits.
fa_status create_emulator_backend(int sm, std::unique_ptr<Backend> *out);

}  // namespace fa

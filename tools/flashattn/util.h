// Helpers shared by the commands: handles that free themselves, status checks
// that turn fa_ failures into one-line errors, .npy input loading and the
// report printed by `run` and `decode`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "commands.h"
#include "flashattn.h"
#include "npy.h"

namespace fa::cli {

// Throws Failure(exit_code, "<what>: <fa_last_error() or status text>") unless
// s is FA_SUCCESS.
void check(fa_status s, const std::string &what, int exit_code = kExitFail);

// Throws a usage error unless the directory of `path` is writable ("" passes).
void check_writable(const std::string &path, const char *option);

fa_dtype parse_dtype(const std::string &name);
fa_backend parse_backend(const std::string &name);
const char *backend_name(fa_backend b);

// Owns an fa_runtime.
class Runtime {
 public:
  // emulator_sm: the SM the emulator targets (0 = FLASHATTN_EMU_SM, else 80).
  Runtime(fa_backend backend, const char *cache_dir = nullptr, int emulator_sm = 0);
  ~Runtime() { fa_runtime_destroy(rt_); }
  Runtime(const Runtime &) = delete;
  Runtime &operator=(const Runtime &) = delete;
  fa_runtime *get() const { return rt_; }
  fa_runtime_info info() const;
  fa_cache_stats cache_stats() const;

 private:
  fa_runtime *rt_ = nullptr;
};

// Owns an fa_config; creation failures are usage errors (exit 2).
class Config {
 public:
  explicit Config(const fa_config_desc &desc);
  ~Config() { fa_config_destroy(cfg_); }
  Config(const Config &) = delete;
  Config &operator=(const Config &) = delete;
  const fa_config *get() const { return cfg_; }

 private:
  fa_config *cfg_ = nullptr;
};

// Device memory from fa_malloc, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer(const Runtime &rt, size_t bytes, const char *name);
  ~DeviceBuffer() { fa_free(rt_, ptr_); }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  uint64_t ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void *src, size_t bytes);
  void download(void *dst, size_t bytes) const;
  void fill(uint8_t value);

 private:
  fa_runtime *rt_;
  uint64_t ptr_ = 0;
  size_t bytes_;
  std::string name_;
};

// Reads a .npy input; wrong files and wrong ranks are usage errors.
npy::Array load_array(const std::string &path, const char *option, size_t rank, bool floating);

// An input rounded to fp16/bf16: the device bits and their exact values.
struct Rounded {
  std::vector<uint16_t> bits;
  std::vector<double> values;
};
Rounded round_input(const npy::Array &a, fa_dtype dtype);

// Contiguous element strides of a [d0, d1, d2, d3] tensor.
fa_tensor contiguous(uint64_t data, int64_t d1, int64_t d2, int64_t d3);

// Converts device fp16/bf16 bits to float.
std::vector<float> to_float(const std::vector<uint16_t> &bits, fa_dtype dtype);

// Everything the report of `run` and `decode` needs.
struct Outcome {
  fa_dtype dtype;
  std::vector<int64_t> o_shape;  // [b, sq, hq, dv]
  std::vector<float> o;          // downloaded O
  std::vector<double> o_ref;     // fp64 reference O
  std::vector<float> lse;        // downloaded LSE [b, hq, sq]
  std::vector<double> lse_ref;
  std::vector<double> ref_file;  // --ref contents, if given
  double first_ms = 0, warm_ms = 0;
  // Cache counters for the report, taken before any untimed extra launch
  // (else read when the report is printed).
  bool have_cache_stats = false;
  fa_cache_stats cache_stats{};
  std::vector<std::string> notes;  // lines printed before the verdict
  // The fp8 forward (run --q-dtype): P is rounded to e4m3 in the kernel, so
  // O and LSE pass with atol and rel_l2 3e-2 (kAtolFp8) instead of the
  // dtype's.
  bool fp8_forward = false;
};

// Loads the --ref file ("" = none) and checks its shape against O.
std::vector<double> load_reference(const std::string &path, const std::vector<int64_t> &o_shape);

// Prints device, timing, cache and error lines, writes --out / --lse-out and
// returns kExitOk on PASS, kExitFail on FAIL.
int report(const RunOptions &opts, const Runtime &rt, const Outcome &r);

// Milliseconds taken by fn() followed by fa_synchronize.
template <typename Fn>
double timed_ms(const Runtime &rt, Fn &&fn);

// Prints the backend and device lines.
void print_device(const Runtime &rt);

}  // namespace fa::cli

#include <chrono>

template <typename Fn>
double fa::cli::timed_ms(const Runtime &rt, Fn &&fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  check(fa_synchronize(rt.get(), nullptr), "fa_synchronize");
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

#include "util.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <unistd.h>
#include <limits>

#include "reference.h"

namespace fa::cli {

void check(fa_status s, const std::string &what, int exit_code) {
  if (s == FA_SUCCESS) return;
  const std::string detail = fa_last_error() ? fa_last_error() : "";
  // fa_last_error() usually names the call already ("fa_launch: ...").
  if (detail.rfind("fa_", 0) == 0) throw Failure(exit_code, detail);
  throw Failure(exit_code,
                what + " failed: " + (detail.empty() ? fa_status_string(s) : detail.c_str()));
}

void check_writable(const std::string &path, const char *option) {
  if (path.empty()) return;
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  if (access(dir.c_str(), W_OK) != 0) {
    throw Failure(kExitUsage,
                  std::string(option) + ": cannot write " + path + ": " + std::strerror(errno));
  }
}

fa_dtype parse_dtype(const std::string &name) {
  if (name == "fp16") return FA_DTYPE_FP16;
  if (name == "bf16") return FA_DTYPE_BF16;
  if (name == "fp32") return FA_DTYPE_FP32;
  throw Failure(kExitUsage, "unknown dtype '" + name + "' (fp16, bf16 or fp32)");
}

fa_backend parse_backend(const std::string &name) {
  if (name == "auto") return FA_BACKEND_AUTO;
  if (name == "cuda") return FA_BACKEND_CUDA;
  if (name == "emulator") return FA_BACKEND_EMULATOR;
  throw Failure(kExitUsage, "unknown backend '" + name + "' (auto, cuda or emulator)");
}

const char *backend_name(fa_backend b) {
  switch (b) {
    case FA_BACKEND_AUTO:
      return "auto";
    case FA_BACKEND_CUDA:
      return "cuda";
    case FA_BACKEND_EMULATOR:
      return "emulator";
  }
  return "unknown";
}

Runtime::Runtime(fa_backend backend, const char *cache_dir, int emulator_sm) {
  fa_runtime_options opts = FA_RUNTIME_OPTIONS_INIT;
  opts.backend = backend;
  opts.cache_dir = cache_dir;
  opts.emulator_sm = emulator_sm;
  check(fa_runtime_create(&opts, &rt_), "fa_runtime_create");
}

fa_runtime_info Runtime::info() const {
  fa_runtime_info info = FA_RUNTIME_INFO_INIT;
  check(fa_runtime_get_info(rt_, &info), "fa_runtime_get_info");
  info.device_name[sizeof(info.device_name) - 1] = 0;
  return info;
}

fa_cache_stats Runtime::cache_stats() const {
  fa_cache_stats s = FA_CACHE_STATS_INIT;
  check(fa_cache_stats_get(rt_, &s), "fa_cache_stats_get");
  s.path[sizeof(s.path) - 1] = 0;
  s.note[sizeof(s.note) - 1] = 0;
  return s;
}

Config::Config(const fa_config_desc &desc) {
  check(fa_config_create(&desc, &cfg_), "fa_config_create", kExitUsage);
}

DeviceBuffer::DeviceBuffer(const Runtime &rt, size_t bytes, const char *name)
    : rt_(rt.get()), bytes_(bytes), name_(name) {
  check(fa_malloc(rt_, std::max<size_t>(bytes, 1), &ptr_),
        "fa_malloc(" + name_ + ", " + std::to_string(bytes) + " bytes)");
}

void DeviceBuffer::upload(const void *src, size_t bytes) {
  check(fa_memcpy_htod(rt_, ptr_, src, bytes), "fa_memcpy_htod(" + name_ + ")");
}

void DeviceBuffer::download(void *dst, size_t bytes) const {
  check(fa_memcpy_dtoh(rt_, dst, ptr_, bytes), "fa_memcpy_dtoh(" + name_ + ")");
}

void DeviceBuffer::fill(uint8_t value) {
  check(fa_memset(rt_, ptr_, value, bytes_), "fa_memset(" + name_ + ")");
}

npy::Array load_array(const std::string &path, const char *option, size_t rank, bool floating) {
  npy::Array a;
  std::string err;
  if (!npy::read(path, &a, &err)) throw Failure(kExitUsage, std::string(option) + ": " + err);
  if (a.shape.size() != rank) {
    throw Failure(kExitUsage, std::string(option) + ": " + path + " has shape " + a.shape_string() +
                                  ", expected a " + std::to_string(rank) + "-D array");
  }
  for (int64_t d : a.shape) {
    if (d < 1 || d > INT32_MAX) {
      throw Failure(kExitUsage, std::string(option) + ": " + path + " has shape " +
                                    a.shape_string() + "; every dimension must be in 1..2^31-1");
    }
  }
  if (floating && !npy::dtype_is_float(a.dtype)) {
    throw Failure(kExitUsage, std::string(option) + ": " + path + " holds " +
                                  npy::dtype_descr(a.dtype) +
                                  "; a float array (<f2, <f4, <f8) is needed");
  }
  if (!floating && npy::dtype_is_float(a.dtype)) {
    throw Failure(kExitUsage, std::string(option) + ": " + path + " holds " +
                                  npy::dtype_descr(a.dtype) +
                                  "; an integer array (<i4, <i8) is needed");
  }
  return a;
}

Rounded round_input(const npy::Array &a, fa_dtype dtype) {
  const std::vector<double> x = a.to_f64();
  Rounded r;
  r.bits.resize(x.size());
  r.values.resize(x.size());
  const bool bf16 = dtype == FA_DTYPE_BF16;
  for (size_t i = 0; i < x.size(); ++i) {
    const float f = static_cast<float>(x[i]);
    r.bits[i] = bf16 ? fa::ref::f32_to_bf16(f) : fa::ref::f32_to_f16(f);
    r.values[i] = bf16 ? fa::ref::bf16_to_f32(r.bits[i]) : fa::ref::f16_to_f32(r.bits[i]);
  }
  return r;
}

fa_tensor contiguous(uint64_t data, int64_t d1, int64_t d2, int64_t d3) {
  fa_tensor t;
  t.data = data;
  t.stride[3] = 1;
  t.stride[2] = d3;
  t.stride[1] = d2 * d3;
  t.stride[0] = d1 * d2 * d3;
  return t;
}

std::vector<float> to_float(const std::vector<uint16_t> &bits, fa_dtype dtype) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    out[i] = dtype == FA_DTYPE_BF16 ? fa::ref::bf16_to_f32(bits[i]) : fa::ref::f16_to_f32(bits[i]);
  }
  return out;
}

void print_device(const Runtime &rt) {
  const fa_runtime_info info = rt.info();
  std::printf("backend:     %s (sm_%d, %d SMs", backend_name(info.backend), info.sm, info.num_sms);
  if (info.driver_version) std::printf(", driver %d", info.driver_version);
  std::printf(")\n");
  std::printf("device:      %s\n", info.device_name[0] ? info.device_name : "(unnamed)");
}

namespace {

// LSE errors: a reference of -inf (a row with no visible key) must be matched
// exactly; elsewhere the absolute difference counts.
struct LseStats {
  double max_abs = 0, max_ref = 0;
  long long bad = 0;  // non-finite where the reference is finite, or -inf mismatch
};

LseStats compare_lse(const std::vector<float> &got, const std::vector<double> &ref) {
  LseStats s;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    if (std::isinf(ref[i]) && ref[i] < 0) {
      if (!(std::isinf(got[i]) && got[i] < 0)) ++s.bad;
      continue;
    }
    if (!std::isfinite(got[i])) {
      ++s.bad;
      continue;
    }
    s.max_abs = std::max(s.max_abs, std::fabs(double(got[i]) - ref[i]));
    s.max_ref = std::max(s.max_ref, std::fabs(ref[i]));
  }
  return s;
}

void write_npy(const std::string &path, const npy::Array &a) {
  std::string err;
  if (!npy::write(path, a, &err)) throw Failure(kExitFail, err);
}

}  // namespace

std::vector<double> load_reference(const std::string &path, const std::vector<int64_t> &o_shape) {
  if (path.empty()) return {};
  const npy::Array ref = load_array(path, "--ref", 4, true);
  if (ref.shape != o_shape) {
    npy::Array tmp;
    tmp.shape = o_shape;
    throw Failure(kExitUsage, "--ref: " + path + " has shape " + ref.shape_string() +
                                  ", O has shape " + tmp.shape_string());
  }
  return ref.to_f64();
}

int report(const RunOptions &opts, const Runtime &rt, const Outcome &r) {
  std::printf("launch:      first %.3f ms (includes generation/compile), warm %.3f ms\n",
              r.first_ms, r.warm_ms);
  const fa_cache_stats cs = r.have_cache_stats ? r.cache_stats : rt.cache_stats();
  std::string where = cs.persistent ? std::string("disk ") + cs.path : "memory only";
  if (cs.note[0]) where += std::string(": ") + cs.note;
  std::printf("cache:       memory hits %" PRIu64 ", disk hits %" PRIu64 ", misses %" PRIu64
              ", compiles %" PRIu64 " (%s)\n",
              cs.memory_hits, cs.disk_hits, cs.misses, cs.compiles, where.c_str());

  const double atol = r.fp8_forward ? kAtolFp8 : r.dtype == FA_DTYPE_BF16 ? kAtolBf16 : kAtolFp16;
  const double rel_l2_max = r.fp8_forward ? kAtolFp8 : kRelL2Max;
  const fa::ref::ErrorStats e = fa::ref::compare(r.o.data(), r.o_ref.data(), r.o.size());
  const double o_tol = atol * std::max(1.0, e.max_ref);
  bool pass = e.nonfinite == 0 && e.max_abs <= o_tol && e.rel_l2 < rel_l2_max;
  std::printf("error O:     max_abs %.3e, max|ref| %.3e, rel_l2 %.3e, non-finite %lld\n", e.max_abs,
              e.max_ref, e.rel_l2, e.nonfinite);

  const LseStats l = compare_lse(r.lse, r.lse_ref);
  const double lse_tol = atol * std::max(1.0, l.max_ref);
  pass = pass && l.bad == 0 && l.max_abs <= lse_tol;
  std::printf("error LSE:   max_abs %.3e, max|ref| %.3e, mismatched or non-finite %lld\n",
              l.max_abs, l.max_ref, l.bad);

  if (!opts.ref.empty()) {
    const fa::ref::ErrorStats f = fa::ref::compare(r.o.data(), r.ref_file.data(), r.o.size());
    const double f_tol = atol * std::max(1.0, f.max_ref);
    pass = pass && f.nonfinite == 0 && f.max_abs <= f_tol;
    std::printf("error --ref: max_abs %.3e, max|ref| %.3e, rel_l2 %.3e (%s)\n", f.max_abs,
                f.max_ref, f.rel_l2, opts.ref.c_str());
  }

  for (const std::string &line : r.notes) std::printf("%s\n", line.c_str());

  write_npy(opts.out, npy::from_f32(r.o_shape, r.o.data()));
  if (!opts.lse_out.empty()) {
    const std::vector<int64_t> lse_shape = {r.o_shape[0], r.o_shape[2], r.o_shape[1]};
    write_npy(opts.lse_out, npy::from_f32(lse_shape, r.lse.data()));
  }

  std::printf(
      "%s (tolerance: max_abs <= %.0e * max(1, max|ref|) = %.3e, rel_l2 < %.0e, "
      "no non-finite)\n",
      pass ? "PASS" : "FAIL", atol, o_tol, rel_l2_max);
  std::fflush(stdout);
  return pass ? kExitOk : kExitFail;
}

}  // namespace fa::cli

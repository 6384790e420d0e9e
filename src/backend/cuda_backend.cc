// The cuda backend: the device's primary context, whole-program JIT
// (cuModuleLoadDataEx), modules, launches and memory, all through the
// dlopen'ed driver table.
//
// Every call pushes the primary context and pops it on return, so the
// caller's current context (if any) is left as it was and PyTorch/CuPy
// pointers and streams, which live in the same primary context, work as they
// are. A sticky CUDA error (illegal address and kin) poisons the backend: the
// call that sees it returns FA_ERROR_CUDA, every later call
// FA_ERROR_RUNTIME_POISONED.
#include "backend/backend.h"
#include "backend/cuda_driver.h"
#include "backend/ptx_compiler.h"
#include "backend/tensor_map.h"
#include "common/error.h"

#if FA_CUDA_BACKEND

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#ifndef CU_COMPUTE_ACCELERATED_TARGET_BASE
#define CU_COMPUTE_ACCELERATED_TARGET_BASE 0x10000  // CUjit_target base of sm_NNa targets
#endif

namespace fa {
namespace {

using cuda::Driver;

// Shared memory a block may use without opting in (CUDA's 48 KB default).
constexpr size_t kDefaultSmemLimit = 48 * 1024;
// JIT log buffers; verbose ptxas logs of big kernels run to a few KB.
constexpr size_t kInfoLogBytes = 64 * 1024;
constexpr size_t kErrorLogBytes = 64 * 1024;
// Longest JIT error log quoted in a status message (fa::fail keeps 1 KB).
constexpr size_t kLogInMessage = 700;

// The retained primary context of one device. Shared by the backend and its
// kernels, so a kernel may outlive the backend and still unload its module.
struct Context {
  const Driver *cu = nullptr;
  CUdevice device = 0;
  CUcontext ctx = nullptr;

  ~Context() {
    if (ctx != nullptr) cu->DevicePrimaryCtxRelease(device);
  }
};

// Makes a context current on this thread for one scope (push/pop).
class ScopedContext {
 public:
  explicit ScopedContext(const Context &c) : cu_(c.cu) { result_ = cu_->CtxPushCurrent(c.ctx); }
  ~ScopedContext() {
    if (result_ == CUDA_SUCCESS) {
      CUcontext popped = nullptr;
      cu_->CtxPopCurrent(&popped);
    }
  }
  ScopedContext(const ScopedContext &) = delete;
  ScopedContext &operator=(const ScopedContext &) = delete;
  CUresult result() const { return result_; }

 private:
  const Driver *cu_;
  CUresult result_;
};

// A loaded entry point; owns its module.
class CudaKernel : public Kernel {
 public:
  CudaKernel(std::shared_ptr<Context> context, CUmodule module, CUfunction function,
             std::string entry)
      : context_(std::move(context)),
        module_(module),
        function_(function),
        entry_(std::move(entry)) {}

  ~CudaKernel() override {
    ScopedContext scope(*context_);
    // After a sticky error this fails too; nothing more can be done then.
    if (scope.result() == CUDA_SUCCESS) context_->cu->ModuleUnload(module_);
  }

  const Context *context() const { return context_.get(); }
  CUfunction function() const { return function_; }
  const std::string &entry() const { return entry_; }

  size_t static_smem = 0;       // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
  size_t max_dynamic_smem = 0;  // launches may ask for up to this much
  size_t param_bytes = 0;       // size of parameter 0 (cuFuncGetParamInfo); 0 = unknown

 private:
  std::shared_ptr<Context> context_;
  CUmodule module_;
  CUfunction function_;
  std::string entry_;
};

// `log` cut to its first kLogInMessage bytes for a status message.
std::string clip(const std::string &log) {
  if (log.size() <= kLogInMessage) return log;
  return log.substr(0, kLogInMessage) + " [...]";
}

// The NUL-terminated text a JIT wrote into `buffer`.
std::string log_text(const std::vector<char> &buffer) {
  return std::string(buffer.data(), strnlen(buffer.data(), buffer.size()));
}

// Reads `.target sm_NN[a]` from PTX text. Returns NN, or 0 when absent;
// *accelerated is set for an arch-specific target (sm_90a) (PTX ISA,
// "Target ISA notes": such code runs only on exactly that architecture).
int ptx_target(const std::string &ptx, bool *accelerated) {
  *accelerated = false;
  size_t at = ptx.find(".target");
  if (at == std::string::npos) return 0;
  at = ptx.find("sm_", at);
  if (at == std::string::npos) return 0;
  at += 3;
  int sm = 0;
  while (at < ptx.size() && ptx[at] >= '0' && ptx[at] <= '9') sm = sm * 10 + (ptx[at++] - '0');
  *accelerated = at < ptx.size() && ptx[at] == 'a';
  return sm;
}

class CudaBackend : public Backend {
 public:
  CudaBackend(std::shared_ptr<Context> context, DeviceInfo info, const ptxc::Plugin *plugin,
              CompilerInfo compiler)
      : context_(std::move(context)),
        cu_(*context_->cu),
        info_(std::move(info)),
        plugin_(plugin),
        compiler_(std::move(compiler)) {}
  ~CudaBackend() override { keep_compiled("", nullptr); }

  fa_backend kind() const override { return FA_BACKEND_CUDA; }
  const DeviceInfo &info() const override { return info_; }
  CompilerInfo compiler() const override { return compiler_; }

  using Backend::compile;
  fa_status compile(const std::string &ptx, std::vector<uint8_t> *binary, std::string *log,
                    CompileWith with, std::string *used) override;
  fa_status load(const std::string &ptx, const std::vector<uint8_t> &binary,
                 const std::string &entry, uint32_t dynamic_smem_bytes,
                 std::unique_ptr<Kernel> *out) override;
  fa_status launch(Kernel &kernel, const LaunchGeometry &geometry, const void *params,
                   size_t params_size, void *stream) override;
  fa_status mem_alloc(size_t bytes, uint64_t *ptr) override;
  fa_status mem_free(uint64_t ptr) override;
  fa_status copy_htod(uint64_t dst, const void *src, size_t bytes) override;
  fa_status copy_dtoh(void *dst, uint64_t src, size_t bytes) override;
  fa_status memset_d8(uint64_t dst, uint8_t value, size_t bytes) override;
  fa_status synchronize(void *stream) override;
  fa_status encode_tensor_map(const TensorMapDesc &desc, uint8_t out[128]) override;

 private:
  // FA_SUCCESS, or FA_ERROR_RUNTIME_POISONED after a sticky error.
  fa_status check_poisoned() const;
  // Checks poisoning, then pushes the context (scope must be alive).
  fa_status enter(const ScopedContext &scope);
  // Turns a CUresult of `call` into a status and message; poisons on a
  // sticky error. CUDA_SUCCESS -> FA_SUCCESS.
  fa_status check(CUresult r, const char *call);

  // The driver's whole-program JIT of `ptx` (compile() without the plugin).
  fa_status jit_compile(const std::string &ptx, std::vector<uint8_t> *binary, std::string *log);

  std::shared_ptr<Context> context_;
  const Driver &cu_;
  DeviceInfo info_;
  const ptxc::Plugin *plugin_;  // the PTX compiler plugin, or null
  CompilerInfo compiler_;

  std::atomic<bool> poisoned_{false};
  mutable std::mutex poison_mu_;
  std::string poison_what_;  // "CUDA_ERROR_ILLEGAL_ADDRESS in cuStreamSynchronize"

  // The module of the last compile(), kept for the load() of the same PTX
  // that follows it, so that a miss JIT-compiles once, not twice (the
  // driver's compute cache may be off). Replacing it unloads the old one.
  void keep_compiled(const std::string &ptx, CUmodule module);
  CUmodule take_compiled(const std::string &ptx);
  std::mutex compiled_mu_;
  std::string compiled_ptx_;
  CUmodule compiled_ = nullptr;
};

void CudaBackend::keep_compiled(const std::string &ptx, CUmodule module) {
  CUmodule old = nullptr;
  {
    std::lock_guard<std::mutex> lock(compiled_mu_);
    old = compiled_;
    compiled_ = module;
    compiled_ptx_ = module ? ptx : std::string();
  }
  if (old != nullptr) {
    ScopedContext scope(*context_);
    if (scope.result() == CUDA_SUCCESS) cu_.ModuleUnload(old);
  }
}

CUmodule CudaBackend::take_compiled(const std::string &ptx) {
  std::lock_guard<std::mutex> lock(compiled_mu_);
  if (compiled_ == nullptr || compiled_ptx_ != ptx) return nullptr;
  CUmodule m = compiled_;
  compiled_ = nullptr;
  compiled_ptx_.clear();
  return m;
}

fa_status CudaBackend::check_poisoned() const {
  if (!poisoned_.load(std::memory_order_acquire)) return FA_SUCCESS;
  std::lock_guard<std::mutex> lock(poison_mu_);
  return fail(FA_ERROR_RUNTIME_POISONED,
              "an earlier sticky CUDA error (%s) left the context unusable; destroy the runtime",
              poison_what_.c_str());
}

fa_status CudaBackend::enter(const ScopedContext &scope) {
  if (fa_status s = check_poisoned(); s != FA_SUCCESS) return s;
  return check(scope.result(), "cuCtxPushCurrent");
}

fa_status CudaBackend::check(CUresult r, const char *call) {
  if (r == CUDA_SUCCESS) return FA_SUCCESS;
  std::string text = cuda::result_text(cu_, r);
  if (cuda::is_sticky(r)) {
    {
      std::lock_guard<std::mutex> lock(poison_mu_);
      // The first sticky error is the cause; later ones are its echoes.
      if (poison_what_.empty()) poison_what_ = cuda::result_name(cu_, r) + " in " + call;
    }
    poisoned_.store(true, std::memory_order_release);
    return fail(FA_ERROR_CUDA,
                "%s failed: %s; this sticky error leaves the CUDA context unusable: destroy the "
                "runtime",
                call, text.c_str());
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    return fail(FA_ERROR_OUT_OF_MEMORY, "%s failed: %s", call, text.c_str());
  }
  return fail(FA_ERROR_CUDA, "%s failed: %s", call, text.c_str());
}

// PTX -> the module's binary, compiled whole-program by the driver's JIT in
// cuModuleLoadDataEx (for the context's device, or the exact arch-specific
// target an sm_NNa module names), then unloaded again. Not cuLink*: it
// compiles its inputs as relocatable code (cuda.h, cuLinkCreate), where
// ptxas ignores setmaxnreg (C7504), serializes every wgmma (C7509) and
// spills 255-register mma.sync kernels on sm_80/86 (276 B at d128; none
// whole-program). On an H200 that halved the sm_90a forward's speed
// (bench/results/2026-11-26-h200-lease/NOTES.md). The driver exports no
// cubin from a module load, so the binary is the PTX itself plus a NUL.
// The module stays loaded for the load() that follows (one JIT per miss);
// a later process's load() hands the PTX to the driver again, whose own
// compute cache (~/.nv/ComputeCache unless CUDA_CACHE_DISABLE=1) makes that
// JIT a lookup.
// *log is ptxas's info log (registers, spills, advisories).
fa_status CudaBackend::jit_compile(const std::string &ptx, std::vector<uint8_t> *binary,
                                   std::string *log) {
  ScopedContext scope(*context_);
  if (fa_status s = enter(scope); s != FA_SUCCESS) return s;

  std::vector<char> info_log(kInfoLogBytes, '\0');
  std::vector<char> error_log(kErrorLogBytes, '\0');
  bool accelerated = false;
  const int target_sm = ptx_target(ptx, &accelerated);
  CUjit_option options[6] = {CU_JIT_INFO_LOG_BUFFER,  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                             CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                             CU_JIT_LOG_VERBOSE,      CU_JIT_TARGET};
  void *values[6] = {info_log.data(),
                     reinterpret_cast<void *>(static_cast<uintptr_t>(info_log.size())),
                     error_log.data(),
                     reinterpret_cast<void *>(static_cast<uintptr_t>(error_log.size())),
                     reinterpret_cast<void *>(static_cast<uintptr_t>(1)),
                     nullptr};
  unsigned num_options = 5;
  if (accelerated && target_sm == info_.sm) {
    // sm_90a code needs the arch-specific target (compute_90a), which the
    // context's plain sm_90 target does not imply.
    values[5] = reinterpret_cast<void *>(
        static_cast<uintptr_t>(CU_COMPUTE_ACCELERATED_TARGET_BASE + target_sm));
    num_options = 6;
  }
  CUmodule module = nullptr;
  CUresult r = cu_.ModuleLoadDataEx(&module, ptx.c_str(), num_options, options, values);
  const std::string info_text = log_text(info_log);
  const std::string error_text = log_text(error_log);
  if (log != nullptr) {
    *log = info_text;
    if (r != CUDA_SUCCESS && !error_text.empty()) {
      *log = error_text + (info_text.empty() ? "" : "\n" + info_text);
    }
  }
  if (r == CUDA_SUCCESS) {
    keep_compiled(ptx, module);  // for the load() that follows
    binary->assign(ptx.begin(), ptx.end());
    binary->push_back(0);
    return FA_SUCCESS;
  }
  // A rejected module, or any other non-sticky failure that left a JIT error
  // log, is a compile error; the rest are driver errors.
  if (cuda::is_compile_error(r) ||
      (!error_text.empty() && !cuda::is_sticky(r) && r != CUDA_ERROR_OUT_OF_MEMORY)) {
    return fail(FA_ERROR_COMPILE, "cuModuleLoadDataEx failed: %s: %s",
                cuda::result_text(cu_, r).c_str(),
                error_text.empty() ? "(no JIT error log)" : clip(error_text).c_str());
  }
  return check(r, "cuModuleLoadDataEx");
}

// PTX -> binary: with the plugin a cubin for the device's exact SM (no
// driver call: the load() that follows is the only module load), else the
// driver's JIT (jit_compile). A target the plugin does not know (a GPU newer
// than the plugin) falls back to the JIT with a warning.
fa_status CudaBackend::compile(const std::string &ptx, std::vector<uint8_t> *binary,
                               std::string *log, CompileWith with, std::string *used) {
  if (binary == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "compile: binary is null");
  binary->clear();
  if (log != nullptr) log->clear();
  if (used != nullptr) used->clear();
  if (ptx.empty()) return fail(FA_ERROR_INVALID_ARGUMENT, "compile: empty PTX");
  if (fa_status s = check_poisoned(); s != FA_SUCCESS) return s;
  if (plugin_ != nullptr && with == CompileWith::kBest) {
    const std::string target = ptxc::cubin_target(ptx, info_.sm);
    const fa_status s = ptxc::compile_cubin(plugin_, ptx, target, binary, log);
    if (s == FA_SUCCESS && used != nullptr) *used = compiler_.version;
    if (s != FA_ERROR_UNSUPPORTED) return s;
    warn(std::string("the PTX compiler plugin cannot build ") + target + " (" + last_error() +
         "); the driver JIT-compiles instead");
    clear_error();
  }
  const fa_status s = jit_compile(ptx, binary, log);
  if (s == FA_SUCCESS && used != nullptr) *used = ptxc::kDriverJit;
  return s;
}

// Loads a module (cubin, else PTX JIT'ed by the driver) and resolves `entry`;
// raises the function's dynamic shared memory limit when it needs more than
// the 48 KB default.
fa_status CudaBackend::load(const std::string &ptx, const std::vector<uint8_t> &binary,
                            const std::string &entry, uint32_t dynamic_smem_bytes,
                            std::unique_ptr<Kernel> *out) {
  if (out == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "load: out is null");
  if (binary.empty() && ptx.empty()) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "load: neither PTX nor a binary given");
  }
  // cuModuleLoadData finds a cubin's size in its ELF header; anything else
  // in `binary` would be read past its end. The one other binary is what
  // compile() gives: exactly the PTX and a NUL.
  const bool is_cubin = binary.size() >= 4 && std::memcmp(binary.data(),
                                                          "\x7f"
                                                          "ELF",
                                                          4) == 0;
  const bool is_own_ptx = !binary.empty() && binary.size() == ptx.size() + 1 &&
                          binary.back() == 0 &&
                          std::memcmp(binary.data(), ptx.data(), ptx.size()) == 0;
  if (!binary.empty() && !is_cubin && !is_own_ptx) {
    return fail(FA_ERROR_COMPILE,
                "load: the binary for '%s' is neither a cubin (no ELF header) nor its PTX",
                entry.c_str());
  }
  ScopedContext scope(*context_);
  if (fa_status s = enter(scope); s != FA_SUCCESS) return s;

  std::vector<char> error_log(kErrorLogBytes, '\0');
  CUjit_option options[3] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                             CU_JIT_TARGET};
  void *values[3] = {error_log.data(),
                     reinterpret_cast<void *>(static_cast<uintptr_t>(error_log.size())), nullptr};
  unsigned num_options = 2;
  const bool from_ptx = !is_cubin;
  const void *image =
      from_ptx ? static_cast<const void *>(ptx.c_str()) : static_cast<const void *>(binary.data());
  bool accelerated = false;
  const int target_sm = from_ptx ? ptx_target(ptx, &accelerated) : 0;
  if (accelerated && target_sm == info_.sm) {
    // As in compile: the arch-specific target, which the context's plain
    // sm_NN target does not imply.
    values[2] = reinterpret_cast<void *>(
        static_cast<uintptr_t>(CU_COMPUTE_ACCELERATED_TARGET_BASE + target_sm));
    num_options = 3;
  }
  CUmodule module = from_ptx ? take_compiled(ptx) : nullptr;
  CUresult r = module != nullptr
                   ? CUDA_SUCCESS
                   : cu_.ModuleLoadDataEx(&module, image, num_options, options, values);
  if (r != CUDA_SUCCESS) {
    if (cuda::is_compile_error(r)) {
      const std::string text = log_text(error_log);
      return fail(FA_ERROR_COMPILE, "cuModuleLoadDataEx failed for '%s' (%s): %s: %s",
                  entry.c_str(), from_ptx ? "PTX" : "cubin", cuda::result_text(cu_, r).c_str(),
                  text.empty() ? "(no JIT error log)" : clip(text).c_str());
    }
    return check(r, "cuModuleLoadDataEx");
  }
  // From here on the module is unloaded on every failure.
  auto give_up = [&](fa_status s) {
    cu_.ModuleUnload(module);
    return s;
  };

  CUfunction function = nullptr;
  r = cu_.ModuleGetFunction(&function, module, entry.c_str());
  if (r == CUDA_ERROR_NOT_FOUND) {
    return give_up(
        fail(FA_ERROR_COMPILE, "the module has no entry point named '%s'", entry.c_str()));
  }
  if (r != CUDA_SUCCESS) return give_up(check(r, "cuModuleGetFunction"));

  int static_smem = 0;
  r = cu_.FuncGetAttribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function);
  if (r != CUDA_SUCCESS) return give_up(check(r, "cuFuncGetAttribute"));
  const size_t total = static_cast<size_t>(static_smem) + dynamic_smem_bytes;
  if (total > info_.limits.smem_per_block_optin) {
    return give_up(fail(FA_ERROR_UNSUPPORTED,
                        "kernel '%s' needs %zu bytes of shared memory per block (%d static + %u "
                        "dynamic); %s allows at most %u",
                        entry.c_str(), total, static_smem, dynamic_smem_bytes, info_.name.c_str(),
                        info_.limits.smem_per_block_optin));
  }
  // Without opting in, dynamic shared memory is limited to 48 KB - static.
  const size_t default_dynamic =
      kDefaultSmemLimit > static_cast<size_t>(static_smem) ? kDefaultSmemLimit - static_smem : 0;
  if (dynamic_smem_bytes > default_dynamic) {
    r = cu_.FuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                             static_cast<int>(dynamic_smem_bytes));
    if (r != CUDA_SUCCESS) return give_up(check(r, "cuFuncSetAttribute"));
  }

  auto kernel = std::make_unique<CudaKernel>(context_, module, function, entry);
  kernel->static_smem = static_cast<size_t>(static_smem);
  kernel->max_dynamic_smem = std::max<size_t>(dynamic_smem_bytes, default_dynamic);
#if defined(CUDA_VERSION) && CUDA_VERSION >= 12040
  if (cu_.FuncGetParamInfo != nullptr) {
    // Launches pass kernelParams = { params }: a second parameter would make
    // the driver read past that array, so such a kernel is refused here.
    size_t offset = 0, size = 0;
    if (cu_.FuncGetParamInfo(function, 0, &offset, &size) == CUDA_SUCCESS) {
      kernel->param_bytes = size;
    }
    if (cu_.FuncGetParamInfo(function, 1, &offset, &size) == CUDA_SUCCESS) {
      kernel.reset();  // unloads the module
      return fail(FA_ERROR_UNSUPPORTED,
                  "kernel '%s' takes more than one parameter; flashattn kernels take a single "
                  "parameter block",
                  entry.c_str());
    }
  }
#endif
  *out = std::move(kernel);
  return FA_SUCCESS;
}

// One cuLaunchKernel with kernelParams = { params }: every generated kernel
// takes a single .param byte array, so the address of our parameter block is
// exactly the address of parameter 0, and the driver copies as many bytes as
// the module declares for it (params_size is checked against that size when
// the driver can report it, CUDA 12.4+).
fa_status CudaBackend::launch(Kernel &kernel, const LaunchGeometry &geometry, const void *params,
                              size_t params_size, void *stream) {
  if (fa_status s = check_poisoned(); s != FA_SUCCESS) return s;
  auto *k = dynamic_cast<CudaKernel *>(&kernel);
  if (k == nullptr) return fail(FA_ERROR_INTERNAL, "launch: kernel was not loaded by cuda");
  if (k->context() != context_.get()) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "launch: kernel '%s' belongs to another runtime",
                k->entry().c_str());
  }
  if (params == nullptr && params_size != 0) {
    return fail(FA_ERROR_INVALID_ARGUMENT, "launch: params is null");
  }
  // The driver copies param_bytes from `params`: a shorter block would be
  // read past its end. A longer one is harmless.
  if (params_size < k->param_bytes) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "launch: kernel '%s' takes a %zu-byte parameter block, got only %zu bytes",
                k->entry().c_str(), k->param_bytes, params_size);
  }
  for (int i = 0; i < 3; ++i) {
    if (geometry.grid[i] == 0 || geometry.block[i] == 0) {
      return fail(FA_ERROR_INVALID_ARGUMENT,
                  "launch: kernel '%s' grid (%u, %u, %u) / block (%u, %u, %u) has a zero "
                  "dimension",
                  k->entry().c_str(), geometry.grid[0], geometry.grid[1], geometry.grid[2],
                  geometry.block[0], geometry.block[1], geometry.block[2]);
    }
  }
  if (geometry.smem_bytes > k->max_dynamic_smem) {
    return fail(FA_ERROR_INVALID_ARGUMENT,
                "launch: kernel '%s' asks for %u bytes of dynamic shared memory but was loaded "
                "for at most %zu",
                k->entry().c_str(), geometry.smem_bytes, k->max_dynamic_smem);
  }
  ScopedContext scope(*context_);
  if (fa_status s = enter(scope); s != FA_SUCCESS) return s;
  void *args[1] = {const_cast<void *>(params)};
  // A programmatic dependent launch (cuLaunchKernelEx with
  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) where the driver
  // has it and captures it into CUDA graphs (12.3), on sm_90 and up; a plain
  // launch otherwise, which the kernel's griddepcontrol.wait does not mind.
  if (geometry.programmatic && cu_.LaunchKernelEx != nullptr && info_.driver_version >= 12030 &&
      info_.sm >= 90) {
    CUlaunchAttribute attr;
    std::memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config;
    std::memset(&config, 0, sizeof config);
    config.gridDimX = geometry.grid[0];
    config.gridDimY = geometry.grid[1];
    config.gridDimZ = geometry.grid[2];
    config.blockDimX = geometry.block[0];
    config.blockDimY = geometry.block[1];
    config.blockDimZ = geometry.block[2];
    config.sharedMemBytes = geometry.smem_bytes;
    config.hStream = static_cast<CUstream>(stream);
    config.attrs = &attr;
    config.numAttrs = 1;
    return check(cu_.LaunchKernelEx(&config, k->function(), params_size ? args : nullptr, nullptr),
                 "cuLaunchKernelEx");
  }
  CUresult r =
      cu_.LaunchKernel(k->function(), geometry.grid[0], geometry.grid[1], geometry.grid[2],
                       geometry.block[0], geometry.block[1], geometry.block[2], geometry.smem_bytes,
                       static_cast<CUstream>(stream), params_size ? args : nullptr, nullptr);
  return check(r, "cuLaunchKernel");
}

fa_status CudaBackend::mem_alloc(size_t bytes, uint64_t *ptr) {
  if (ptr == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "mem_alloc: ptr is null");
  *ptr = 0;
  if (bytes == 0) return fail(FA_ERROR_INVALID_ARGUMENT, "mem_alloc: bytes must be > 0");
  ScopedContext scope(*context_);
  if (fa_status s = enter(scope); s != FA_SUCCESS) return s;
  CUdeviceptr p = 0;
  if (fa_status s = check(cu_.MemAlloc(&p, bytes), "cuMemAlloc"); s != FA_SUCCESS) return s;
  *ptr = static_cast<uint64_t>(p);
  return FA_SUCCESS;
}

fa_status CudaBackend::mem_free(uint64_t ptr) {
  if (ptr == 0) return FA_SUCCESS;
  ScopedContext scope(*context_);
  if (fa_status s = enter(scope); s != FA_SUCCESS) return s;
  return check(cu_.MemFree(static_cast<CUdeviceptr>(ptr)), "cuMemFree");
}

fa_status CudaBackend::copy_htod(uint64_t dst, const void *src, size_t bytes) {
  if (fa_status s = check_poisoned(); s != FA_SUCCESS) return s;
  if (bytes == 0) return FA_SUCCESS;
  if (src == nullptr || dst == 0) return fail(FA_ERROR_INVALID_ARGUMENT, "copy_htod: null pointer");
  ScopedContext scope(*context_);
  if (fa_status s = enter(scope); s != FA_SUCCESS) return s;
  return check(cu_.MemcpyHtoD(static_cast<CUdeviceptr>(dst), src, bytes), "cuMemcpyHtoD");
}

fa_status CudaBackend::copy_dtoh(void *dst, uint64_t src, size_t bytes) {
  if (fa_status s = check_poisoned(); s != FA_SUCCESS) return s;
  if (bytes == 0) return FA_SUCCESS;
  if (dst == nullptr || src == 0) return fail(FA_ERROR_INVALID_ARGUMENT, "copy_dtoh: null pointer");
  ScopedContext scope(*context_);
  if (fa_status s = enter(scope); s != FA_SUCCESS) return s;
  return check(cu_.MemcpyDtoH(dst, static_cast<CUdeviceptr>(src), bytes), "cuMemcpyDtoH");
}

// cuMemsetD8 may return before the device memory is written; fa_memset is
// synchronous, so the legacy default stream it ran on is waited for.
fa_status CudaBackend::memset_d8(uint64_t dst, uint8_t value, size_t bytes) {
  if (fa_status s = check_poisoned(); s != FA_SUCCESS) return s;
  if (bytes == 0) return FA_SUCCESS;
  if (dst == 0) return fail(FA_ERROR_INVALID_ARGUMENT, "memset_d8: null pointer");
  ScopedContext scope(*context_);
  if (fa_status s = enter(scope); s != FA_SUCCESS) return s;
  if (fa_status s = check(cu_.MemsetD8(static_cast<CUdeviceptr>(dst), value, bytes), "cuMemsetD8");
      s != FA_SUCCESS) {
    return s;
  }
  return check(cu_.StreamSynchronize(nullptr), "cuStreamSynchronize");
}

fa_status CudaBackend::synchronize(void *stream) {
  ScopedContext scope(*context_);
  if (fa_status s = enter(scope); s != FA_SUCCESS) return s;
  return check(cu_.StreamSynchronize(static_cast<CUstream>(stream)), "cuStreamSynchronize");
}

fa_status CudaBackend::encode_tensor_map(const TensorMapDesc &d, uint8_t out[128]) {
  if (fa_status s = check_tensor_map_desc(d); s != FA_SUCCESS) return s;
  if (info_.sm < 90) return fail(FA_ERROR_UNSUPPORTED, "tensor maps need sm_90 or newer");
  if (cu_.TensorMapEncodeTiled == nullptr)
    return fail(FA_ERROR_UNSUPPORTED, "the driver has no cuTensorMapEncodeTiled");
  CUtensorMap map;
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], estrides[5];
  for (uint32_t i = 0; i < d.rank; ++i) {
    dims[i] = d.dims[i];
    box[i] = d.box[i];
    estrides[i] = 1;
    if (i > 0) strides[i - 1] = d.strides[i];
  }
  // Host-only: no context is needed and nothing touches the device.
  CUresult r = cu_.TensorMapEncodeTiled(
      &map,
      d.elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8  // fp8 bytes (the copy does not convert)
      : d.bf16          ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      d.rank, reinterpret_cast<void *>(static_cast<uintptr_t>(d.base)), dims, strides, box,
      estrides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      d.swizzle == 3 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return fail(FA_ERROR_INVALID_ARGUMENT, "cuTensorMapEncodeTiled failed: %s",
                cuda::result_text(cu_, r).c_str());
  static_assert(sizeof map == 128, "CUtensorMap is 128 bytes");
  std::memcpy(out, &map, 128);
  return FA_SUCCESS;
}

// Turns a failing CUresult met while creating the backend into a status.
fa_status create_fail(const Driver &cu, CUresult r, const char *call) {
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    return fail(FA_ERROR_OUT_OF_MEMORY, "%s failed: %s", call, cuda::result_text(cu, r).c_str());
  }
  return fail(FA_ERROR_CUDA, "%s failed: %s", call, cuda::result_text(cu, r).c_str());
}

}  // namespace

fa_status create_cuda_backend(int device, bool ptx_compiler, std::unique_ptr<Backend> *out) {
  if (out == nullptr) return fail(FA_ERROR_INVALID_ARGUMENT, "create_cuda_backend: out is null");
  out->reset();
  const Driver *cu = nullptr;
  if (fa_status s = cuda::load_driver(&cu); s != FA_SUCCESS) return s;

  int count = 0;
  CUresult r = cu->DeviceGetCount(&count);
  if (r != CUDA_SUCCESS) return create_fail(*cu, r, "cuDeviceGetCount");
  if (count == 0) return fail(FA_ERROR_NO_DEVICE, "the CUDA driver sees no device");
  if (device < 0 || device >= count) {
    return fail(FA_ERROR_NO_DEVICE, "CUDA device %d requested, but the driver sees %d device%s",
                device, count, count == 1 ? "" : "s");
  }
  auto context = std::make_shared<Context>();
  context->cu = cu;
  r = cu->DeviceGet(&context->device, device);
  if (r != CUDA_SUCCESS) return create_fail(*cu, r, "cuDeviceGet");

  DeviceInfo info;
  char name[256] = {0};
  r = cu->DeviceGetName(name, sizeof name - 1, context->device);
  if (r != CUDA_SUCCESS) return create_fail(*cu, r, "cuDeviceGetName");
  info.name = name;
  struct {
    CUdevice_attribute attribute;
    const char *what;
    int value;
  } attributes[] = {
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability major", 0},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability minor", 0},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "multiprocessor count", 0},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "opt-in shared memory per block", 0},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, "shared memory per SM", 0},
      {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, "registers per SM", 0},
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, "threads per SM", 0},
  };
  for (auto &a : attributes) {
    r = cu->DeviceGetAttribute(&a.value, a.attribute, context->device);
    if (r != CUDA_SUCCESS) {
      return fail(FA_ERROR_CUDA, "cuDeviceGetAttribute (%s) failed: %s", a.what,
                  cuda::result_text(*cu, r).c_str());
    }
  }
  info.sm = attributes[0].value * 10 + attributes[1].value;
  info.num_sms = attributes[2].value;
  info.limits.sm = info.sm;
  info.limits.smem_per_block_optin = static_cast<uint32_t>(attributes[3].value);
  info.limits.smem_per_sm = static_cast<uint32_t>(attributes[4].value);
  info.limits.regs_per_sm = static_cast<uint32_t>(attributes[5].value);
  info.limits.threads_per_sm = static_cast<uint32_t>(attributes[6].value);
  info.driver_version = cu->version;
  // The kernels use mma.sync, ldmatrix and cp.async (sm_80 and up).
  if (info.sm < 80) {
    return fail(FA_ERROR_UNSUPPORTED,
                "%s is compute capability %d.%d; flashattn's kernels need 8.0 or newer "
                "(use the emulator backend on this machine)",
                name, info.sm / 10, info.sm % 10);
  }

  // The primary context is shared with the CUDA runtime (PyTorch, CuPy) of
  // this process; retained here, released when the last user goes.
  CUcontext ctx = nullptr;
  r = cu->DevicePrimaryCtxRetain(&ctx, context->device);
  if (r != CUDA_SUCCESS) return create_fail(*cu, r, "cuDevicePrimaryCtxRetain");
  context->ctx = ctx;

  CompilerInfo compiler;
  const ptxc::Plugin *plugin = nullptr;
  if (!ptx_compiler) {
    compiler.note = "turned off (fa_runtime_options.ptx_compiler = FA_PTX_COMPILER_OFF)";
  } else {
    const ptxc::PluginState &ps = ptxc::plugin_state();
    plugin = ps.plugin;
    compiler.note = ps.note;
    if (plugin != nullptr) compiler.version = ps.version;
  }
  compiler.mode = plugin != nullptr ? FA_COMPILER_PLUGIN : FA_COMPILER_DRIVER_JIT;
  if (plugin == nullptr) compiler.version = ptxc::kDriverJit;
  *out = std::make_unique<CudaBackend>(std::move(context), std::move(info), plugin,
                                       std::move(compiler));
  return FA_SUCCESS;
}

}  // namespace fa

#else  // !FA_CUDA_BACKEND

namespace fa {
fa_status create_cuda_backend(int, bool, std::unique_ptr<Backend> *out) {
  if (out != nullptr) out->reset();
  return fail(FA_ERROR_NO_DRIVER,
              "built without cuda.h: this flashattn was compiled without the CUDA 12+ driver "
              "headers, so the cuda backend is unavailable (rebuild with CUDA_HOME set, or use "
              "the emulator backend)");
}
}  // namespace fa

#endif  // FA_CUDA_BACKEND

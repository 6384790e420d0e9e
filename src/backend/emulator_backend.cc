// The emulator backend: device memory is host memory (emu/memory.h), "JIT"
// is parsing the PTX (emu/parser.cc), a launch interprets the entry over the
// whole grid before returning (emu/interp.cc).
//
// Environment: FLASHATTN_EMU_MAX_STEPS (instruction budget per launch),
// FLASHATTN_EMU_THREADS (host threads running CTAs, default 2),
// FLASHATTN_EMU_STATS=1 (print instructions and rate per launch to stderr),
// FLASHATTN_EMU_PROFILE=1 (count memory requests, sectors and shared-memory
// wavefronts per instruction, print a table per launch to stderr and keep
// the counters of the last launch for last_profile; docs/emulator.md),
// FLASHATTN_EMU_NO_FMA=1 (use the software fma path even on FMA CPUs).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "backend/backend.h"
#include "backend/ptx_compiler.h"
#include "backend/tensor_map.h"
#include "common/error.h"
#include "emu/interp.h"
#include "emu/memory.h"
#include "emu/ptx_ir.h"
#include "emu/tensor_map.h"

namespace fa {
namespace {

class EmuKernel : public Kernel {
 public:
  std::shared_ptr<const emu::Module> module;
  const emu::Entry *entry = nullptr;
};

uint64_t env_u64(const char *name, uint64_t fallback) {
  const char *v = std::getenv(name);
  if (!v || !*v) return fallback;
  char *end = nullptr;
  unsigned long long x = std::strtoull(v, &end, 10);
  return (end && *end == 0 && x > 0) ? x : fallback;
}

class EmulatorBackend : public Backend {
 public:
  explicit EmulatorBackend(int sm) {
    info_.name = "flashattn PTX emulator";
    info_.sm = sm;
    info_.num_sms = 108;                  // fixed: an A100-sized device for grid heuristics
    published_limits(sm, &info_.limits);  // that SM's shared memory, registers, threads
    info_.driver_version = 0;
  }

  fa_backend kind() const override { return FA_BACKEND_EMULATOR; }
  // No compiler: the emulator runs the PTX. The note says what a cuda
  // runtime of this process would use (the cache is shared by both).
  CompilerInfo compiler() const override {
    CompilerInfo ci;
    const ptxc::PluginState &ps = ptxc::plugin_state();
    ci.note = ps.plugin != nullptr
                  ? "the emulator runs the PTX; cuda runtimes here use the PTX compiler plugin " +
                        ps.path
                  : "the emulator runs the PTX; cuda runtimes here use the driver's JIT (" +
                        ps.note + ")";
    return ci;
  }
  const DeviceInfo &info() const override { return info_; }

  using Backend::compile;
  // A parse check: the emulator runs the PTX itself (no binary, no compiler).
  fa_status compile(const std::string &ptx, std::vector<uint8_t> *binary, std::string *log,
                    CompileWith, std::string *used) override {
    std::shared_ptr<const emu::Module> mod;
    fa_status st = get_module(ptx, &mod);
    if (st != FA_SUCCESS) return st;
    if (binary) binary->clear();
    if (log) log->clear();
    if (used) used->clear();
    return FA_SUCCESS;
  }

  fa_status load(const std::string &ptx, const std::vector<uint8_t> &binary,
                 const std::string &entry, uint32_t dynamic_smem_bytes,
                 std::unique_ptr<Kernel> *out) override {
    if (!out) return fail(FA_ERROR_INVALID_ARGUMENT, "emulator load: null output");
    if (!binary.empty())
      return fail(FA_ERROR_COMPILE, "emulator load: a non-empty binary is not emulator output");
    std::shared_ptr<const emu::Module> mod;
    fa_status st = get_module(ptx, &mod);
    if (st != FA_SUCCESS) return st;
    const emu::Entry *e = mod->find(entry);
    if (!e)
      return fail(FA_ERROR_COMPILE, "emulator load: no entry '%s' in the module", entry.c_str());
    uint64_t smem = uint64_t{e->dynamic_smem_offset} + dynamic_smem_bytes;
    if (dynamic_smem_bytes == 0) smem = e->static_smem;
    if (smem > info_.limits.smem_per_block_optin)
      return fail(FA_ERROR_UNSUPPORTED,
                  "emulator load: %s needs %llu bytes of shared memory, sm_%d allows %u",
                  entry.c_str(), static_cast<unsigned long long>(smem), info_.sm,
                  info_.limits.smem_per_block_optin);
    auto k = std::make_unique<EmuKernel>();
    k->module = mod;
    k->entry = e;
    *out = std::move(k);
    return FA_SUCCESS;
  }

  fa_status launch(Kernel &kernel, const LaunchGeometry &g, const void *params, size_t params_size,
                   void *) override {
    auto *k = dynamic_cast<EmuKernel *>(&kernel);
    if (!k || !k->entry) return fail(FA_ERROR_INVALID_ARGUMENT, "emulator launch: foreign kernel");
    emu::LaunchConfig c;
    for (int i = 0; i < 3; ++i) {
      c.grid[i] = g.grid[i];
      c.block[i] = g.block[i];
    }
    c.dynamic_smem = g.smem_bytes;
    c.smem_limit = info_.limits.smem_per_block_optin;
    c.max_steps = env_u64("FLASHATTN_EMU_MAX_STEPS", emu::kDefaultMaxSteps);
    unsigned hw = std::thread::hardware_concurrency();
    c.host_threads = static_cast<int>(env_u64("FLASHATTN_EMU_THREADS", hw >= 2 ? 2 : 1));
    c.profile = env_u64("FLASHATTN_EMU_PROFILE", 0) == 1;
    c.programmatic = g.programmatic;
    std::string error;
    emu::LaunchStats stats;
    auto t0 = std::chrono::steady_clock::now();
    bool ok = emu::execute(*k->entry, c, params, params_size, mem_, &error, &stats);
    if (env_u64("FLASHATTN_EMU_STATS", 0) == 1) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr,
                   "flashattn emulator: %s grid (%u,%u,%u) block (%u,%u,%u): %llu instructions "
                   "in %.3f s (%.1f M/s; %.1f M/s per CPU second)\n",
                   k->entry->name.c_str(), c.grid[0], c.grid[1], c.grid[2], c.block[0], c.block[1],
                   c.block[2], static_cast<unsigned long long>(stats.instructions), s,
                   s > 0 ? stats.instructions / s / 1e6 : 0.0,
                   stats.cpu_seconds > 0 ? stats.instructions / stats.cpu_seconds / 1e6 : 0.0);
    }
    std::unique_ptr<emu::LaunchProfile> prof;
    if (c.profile && ok) {
      prof = std::make_unique<emu::LaunchProfile>(
          emu::summarize(*k->entry, std::move(stats.mem_by_pc)));
      std::fprintf(stderr, "%s", emu::format_profile(*k->entry, *prof).c_str());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_profile_ = std::move(prof);
    }
    if (!ok) return fail(FA_ERROR_LAUNCH, "%s", error.c_str());
    return FA_SUCCESS;
  }

  fa_status mem_alloc(size_t bytes, uint64_t *ptr) override { return mem_.alloc(bytes, ptr); }
  fa_status mem_free(uint64_t ptr) override { return mem_.free(ptr); }
  fa_status copy_htod(uint64_t dst, const void *src, size_t bytes) override {
    return mem_.copy_in(dst, src, bytes);
  }
  fa_status copy_dtoh(void *dst, uint64_t src, size_t bytes) override {
    return mem_.copy_out(dst, src, bytes);
  }
  fa_status memset_d8(uint64_t dst, uint8_t value, size_t bytes) override {
    return mem_.set(dst, value, bytes);
  }
  fa_status synchronize(void *) override { return FA_SUCCESS; }

  // The emulator's own format (emu/tensor_map.h), read back by its
  // cp.async.bulk.tensor.
  fa_status encode_tensor_map(const TensorMapDesc &d, uint8_t out[128]) override {
    if (fa_status s = check_tensor_map_desc(d); s != FA_SUCCESS) return s;
    if (info_.sm < 90) return fail(FA_ERROR_UNSUPPORTED, "tensor maps need sm_90 or newer");
    emu::TensorMap m;
    m.rank = d.rank;
    m.base = d.base;
    m.elem_bytes = d.elem_bytes;
    m.swizzle = d.swizzle == 3 ? emu::TmaSwizzle::B128 : emu::TmaSwizzle::None;
    for (uint32_t i = 0; i < d.rank; ++i) {
      m.dims[i] = d.dims[i];
      m.strides[i] = d.strides[i];
      m.box[i] = d.box[i];
    }
    emu::store_tensor_map(m, out);
    return FA_SUCCESS;
  }

  fa_status last_profile(emu::LaunchProfile *out) const override {
    if (!out) return fail(FA_ERROR_INVALID_ARGUMENT, "emulator last_profile: null output");
    std::lock_guard<std::mutex> lock(mu_);
    if (!last_profile_)
      return fail(FA_ERROR_UNSUPPORTED,
                  "no memory profile: the last emulator launch ran without "
                  "FLASHATTN_EMU_PROFILE=1, faulted, or there was none");
    *out = *last_profile_;
    return FA_SUCCESS;
  }

 private:
  // Parses ptx once per distinct text; later calls share the parse.
  fa_status get_module(const std::string &ptx, std::shared_ptr<const emu::Module> *out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = modules_.find(ptx);
      if (it != modules_.end()) {
        *out = it->second;
        return FA_SUCCESS;
      }
    }
    std::string error;
    std::shared_ptr<const emu::Module> mod = emu::parse_module(ptx, &error);
    if (!mod) return fail(FA_ERROR_COMPILE, "PTX %s", error.c_str());
    if (mod->target_sm > info_.sm)
      return fail(FA_ERROR_COMPILE, "PTX targets sm_%d, the emulated device is sm_%d",
                  mod->target_sm, info_.sm);
    // An architecture-specific target (sm_90a) runs on that SM only (PTX ISA
    // ".target"; the driver refuses it elsewhere, so does the emulator).
    if (mod->arch_specific && mod->target_sm != info_.sm)
      return fail(FA_ERROR_COMPILE,
                  "PTX targets sm_%da, which runs only on sm_%d; the emulated device is sm_%d",
                  mod->target_sm, mod->target_sm, info_.sm);
    std::lock_guard<std::mutex> lock(mu_);
    if (modules_.size() >= 512) modules_.clear();  // loaded kernels keep their module alive
    modules_.emplace(ptx, mod);
    *out = mod;
    return FA_SUCCESS;
  }

  DeviceInfo info_;
  emu::DeviceMemory mem_;
  mutable std::mutex mu_;  // guards modules_ and last_profile_
  std::unordered_map<std::string, std::shared_ptr<const emu::Module>> modules_;
  std::unique_ptr<emu::LaunchProfile> last_profile_;  // most recent launch, if profiled
};

}  // namespace

fa_status create_emulator_backend(int sm, std::unique_ptr<Backend> *out) {
  if (!out) return fail(FA_ERROR_INVALID_ARGUMENT, "create_emulator_backend: null output");
  DeviceLimits limits;
  if (!published_limits(sm, &limits))
    return fail(FA_ERROR_UNSUPPORTED,
                "emulator: sm_%d is not supported (80, 86, 87, 89, 90, 100, 103, 110, 120, 121)",
                sm);
  out->reset(new EmulatorBackend(sm));
  return FA_SUCCESS;
}

}  // namespace fa

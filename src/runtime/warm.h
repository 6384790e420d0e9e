// Offline cache warming (fa_cache_warm, `flashattn cache warm`): the rows a
// runtime on another machine would build, written with no GPU and no driver.
// Each kernel spec's PTX is generated and, with the PTX compiler plugin,
// compiled to a whole-program cubin for the exact target; the row is the one
// Runtime::get_kernel would have written there (same key, key material and
// compiler name), so that runtime finds it and compiles nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/ptx_compiler.h"
#include "cache/store.h"
#include "kernels/kernels.h"

namespace fa {

// What warm_store did, so far or in all.
struct WarmCounts {
  uint64_t total = 0;    // kernels asked for (distinct keys)
  uint64_t done = 0;     // of which finished: built + present + failed
  uint64_t built = 0;    // rows written
  uint64_t present = 0;  // rows already there with this compiler's binary: left alone
  uint64_t failed = 0;   // the compiler rejected the PTX (first message: WarmResult)
  uint64_t bytes = 0;    // PTX + binary bytes of the rows written
  double seconds = 0;    // since warm_store began
};

struct WarmResult {
  WarmCounts counts;
  std::string first_failure;  // "<spec>: <message>" of the first failure, or ""
};

// Called on the calling thread after each kernel: counts so far and the
// spec just finished.
using WarmProgressFn = std::function<void(const WarmCounts &, const KernelSpec &)>;

// Writes into `store` the row of every spec that lacks one current for
// `plugin` (a row holding a cubin of plugin->version; without a plugin, a
// row with the PTX, which the device's driver JIT-compiles on first use),
// compiling on `jobs` threads (>= 1). Never fails as a whole: a compile
// failure is counted and the others go on.
void warm_store(cache::Store &store, const std::vector<KernelSpec> &specs,
                const ptxc::PluginState *plugin, int jobs, const WarmProgressFn &progress,
                WarmResult *out);

}  // namespace fa

// The backward (fa_backward; issue 30) on the emulator at SM 80 and SM 90
// (the mma.sync kernels), and at SM 86 the head dims past 128 (whose query
// blocks shrink to 16 there): support/backward.h's cases (plain, causal with
// seqlen_q < and > seqlen_k, windows, softcap, ALiBi, sinks, GQA and MQA,
// head_dim != head_dim_v, head dims 8 .. 256, varlen with an empty
// sequence, both dtypes), each against the fp64 analytic backward, and the
// deterministic mode's bit-identity checks. FA_BWD_CASE="sq sk d hq hkv
// causal bf16" runs one case instead (debugging).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/backward.h"
#include "support/numerics.h"
#include "support/policy.h"

using fa::test::bwd::Case;

int main(void) {
  std::string failures;
  std::vector<Case> cases = fa::test::bwd::cases();
  if (const char *o = std::getenv("FA_BWD_CASE")) {  // debugging: "sq sk d hq hkv causal bf16"
    Case c;
    int causal = 0, bf16 = 0;
    std::sscanf(o, "%d %d %d %d %d %d %d", &c.sq, &c.sk, &c.d, &c.hq, &c.hkv, &causal, &bf16);
    c.causal = causal, c.bf16 = bf16;
    cases = {c};
  }
  for (int sm : {80, 90, 86}) {
    fa_runtime *rt = fa::test::emulator_or_fail(sm);
    if (rt == nullptr) return 1;
    // SM 90: the sm_90a kernel (backward_wgmma.cc) where it applies (head
    // dims multiples of 16 up to 128; varlen: its gather variant); then the first cases
    // again with it off (FLASHATTN_SM90_BACKWARD=0: mma.sync).
    for (bool on : {true, false}) {
      if (sm != 90 && !on) continue;
      fa::test::PolicyScope scope(rt, &fa::KernelPolicy::sm90_backward, on);
      int n = 0;
      for (Case c : fa::test::maybe_quick(cases, 3)) {
        // sm_86 (99 KB of shared memory a block): only head dims past 128,
        // whose query blocks shrink to 16 there.
        const int dv = c.dv ? c.dv : c.d;
        if (sm == 86 && std::max(c.d, dv) <= 128) continue;
        if (!on && n++ >= 3) break;
        const bool wgmma = sm == 90 && on && c.d % 16 == 0 && dv % 16 == 0 && c.d <= 128 &&
                           dv <= 128 && (c.lens_q.empty() || c.d + dv <= 192);
        c.kernel = !wgmma             ? "fa_backward_mma_"
                   : c.lens_q.empty() ? "fa_backward_wgmma_bf16"
                                      : "fa_backward_wgmma_gather_";
        if (wgmma && c.lens_q.empty() && !c.bf16) c.kernel = "fa_backward_wgmma_f16";
        std::printf("  sm%d %s (%s)\n", sm, c.describe().c_str(), c.kernel);
        const std::string e = fa::test::bwd::run_case(rt, c);
        if (!e.empty()) failures += "sm" + std::to_string(sm) + " " + c.describe() + ":\n" + e;
      }
    }
    // Deterministic mode (support/backward.h): three runs bit-identical, a
    // sequence alone as in its batch (at SM 90 also a fixed-length batch:
    // the sm_90a kernel).
    if (!std::getenv("FA_BWD_CASE") && sm != 86) {
      std::string e = fa::test::bwd::deterministic_check(rt);
      if (sm == 90) e += fa::test::bwd::deterministic_check(rt, false);
      if (!e.empty()) failures += "sm" + std::to_string(sm) + " deterministic:\n" + e;
    }
    fa_runtime_destroy(rt);
  }
  if (!failures.empty()) {
    std::printf("FAIL:\n%s", failures.c_str());
    return 1;
  }
  std::printf(
      "backward (mma.sync, sm_90a wgmma) against the fp64 analytic backward on the emulator: ok\n");
  return 0;
}

// Kernel coverage shared by the per-feature suites (attention sinks, ALiBi):
// each case is checked against the fp64 reference (run_forward) and the
// emulator profile must say which kernel ran, with the feature's suffix in
// its entry name. Needs FLASHATTN_EMU_PROFILE=1 while the cases run.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "flashattn.h"
#include "support/cmocka.hh"
#include "support/numerics.h"

namespace fa::test {

// The kernel rt ran last has `want` and `feature` (e.g. "_sinks") in its
// name; else a line for `what` is added to *failures.
inline void expect_feature_kernel(fa_runtime *rt, const char *want, const char *feature,
                                  const std::string &what, std::string *failures) {
  fa_emu_profile prof = FA_EMU_PROFILE_INIT;
  if (fa_emulator_profile(rt, &prof) != FA_SUCCESS || std::strstr(prof.kernel, want) == nullptr ||
      std::strstr(prof.kernel, feature) == nullptr)
    *failures += what + ": ran " + prof.kernel + ", not " + want + "..." + feature + "\n";
}

// Fails the current test with the collected failures, if any.
inline void report_failures(const std::string &failures) {
  if (!failures.empty()) {
    print_error("%s", failures.c_str());
    fail();
  }
}

// Which forward kernel the cases must have run: the mma.sync one, the
// scalar one (FLASHATTN_SCALAR_FORWARD=1) or the sm_90a one (TMA, or the
// gather producer for varlen; FLASHATTN_SM90_WGMMA=1 on an sm_90 runtime).
enum class ForwardKernel { Mma, Scalar, Wgmma };

inline void run_forward_feature(fa_runtime *rt, const std::vector<ForwardCase> &cases,
                                ForwardKernel kernel, const char *feature, std::string *failures) {
  for (const ForwardCase &c : cases) {
    const std::string e = run_forward(rt, c);
    if (!e.empty()) *failures += c.describe() + ":\n" + e;
    const char *want = kernel == ForwardKernel::Mma ? "fa_forward_mma_"
                       : kernel == ForwardKernel::Wgmma
                           ? (c.varlen ? "fa_forward_wgmma_gather_" : "fa_forward_wgmma_")
                       : c.bf16 ? "fa_forward_bf16_"
                                : "fa_forward_f16_";
    expect_feature_kernel(rt, want, feature, c.describe(), failures);
  }
}

}  // namespace fa::test

// The persistent forward's test runs, shared by test_persistent (sm_90a)
// and test_persistent_tc (mma.sync): a case run once on the
// one-CTA-per-item kernel, once persistent (static order) and twice in the
// dynamic order back to back on one workspace; O and LSE of every
// persistent run must equal the first run's bit for bit (each run is also
// checked against fp64 by the numerics runner), and the workspace must be
// zero after each dynamic run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn.h"
#include "kernels/policy.h"
#include "support/numerics.h"

namespace fa::test {

struct PersistentCase {
  ForwardCase c;
  DecodeCase d;         // prefill (d.prefill): through fa_launch against a KV cache
  int grid = 0;         // persistent CTAs at most (0: the emulator's SM count x min_ctas)
  bool gather = false;  // sm_90a: must run the gather variant
  std::string describe() const { return d.prefill ? d.describe() : c.describe(); }
  // Launches the case with O and LSE into o / lse and the workspace given.
  std::string run(fa_runtime *rt, std::vector<float> *o, std::vector<float> *lse, uint64_t ws,
                  size_t ws_size);
};

// A varlen case: sequences of lengths sq[b] / sk[b], launched with the
// maximum lengths max_q / max_k (at least the longest: more pads the item
// grid with m-blocks past every sequence).
ForwardCase varlen_case(const std::vector<int> &sq, const std::vector<int> &sk, int max_q,
                        int max_k, int hq, int hkv, int d, bool bf16, bool causal, uint32_t seed);

// The runs of run_persistent: one CTA per item, static persistent, dynamic,
// dynamic again on the same workspace.
constexpr int kPersistentRuns = 4;
extern const char *const kPersistentRunName[kPersistentRuns];

// Runs x kPersistentRuns times with rt's policy field `on` set for runs 1..3
// and persistent_grid x.grid, the dynamic runs on ws (8 bytes, zero before);
// kernel[run]: the emulated kernel's name (FLASHATTN_EMU_PROFILE must be
// set). Returns the failures: the runner's, O or LSE differing from run 0,
// the workspace left non-zero.
std::string run_persistent(fa_runtime *rt, PersistentCase &x, bool fa::KernelPolicy::*on,
                           uint64_t ws, std::string kernel[kPersistentRuns]);

// fa_forward_workspace_size with rt's policy field `on` set (8) and not
// (0) for a fixed-length problem, and a misaligned or too small workspace
// refused by name with nothing written (the numerics runner's reject path);
// ws: 8 bytes of device memory. Returns the failures.
std::string check_workspace_api(fa_runtime *rt, bool fa::KernelPolicy::*on, uint64_t ws);

}  // namespace fa::test

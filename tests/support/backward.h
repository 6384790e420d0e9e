// The backward's numerics runner (fa_backward; issue 30), shared by
// tests/test_backward.cc (emulator, SM 80 / 90 / 86) and the numerics suite
// (test_numerics*, and test_gpu on a GPU): a case runs the forward
// (fa_launch: O and LSE as training has them) on fresh random inputs, then
// fa_backward with dQ, dK, dV (and dsinks) poisoned with NaN first, and
// compares them with the fp64 analytic backward (fa::ref::attention_backward)
// on the same rounded inputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn.h"

namespace fa::test::bwd {

struct Case {
  int batch = 1, sq = 64, sk = 64, hq = 2, hkv = 2, d = 64, dv = 0;
  bool bf16 = false, causal = false;
  int wl = -1, wr = -1;
  float softcap = 0;
  bool alibi = false, sinks = false;
  std::vector<int> lens_q, lens_k;  // varlen: per sequence (sq, sk the maxima)
  uint32_t seed = 1;
  bool deterministic = false;
  // >= 0: the inputs of the whole (varlen) batch, but only this sequence run
  // (batch 1): a sequence alone against itself among others.
  int only = -1;
  // When set (and not deterministic): the main kernel's entry name must
  // start with this (checked on the emulator by running it once more alone,
  // profiled).
  const char *kernel = nullptr;
  // When set: the gradients as fa_backward wrote them (bit-identity checks).
  std::vector<uint16_t> *dq_out = nullptr, *dk_out = nullptr, *dv_out = nullptr;
  std::string describe() const;
};

// Runs c on rt; the problems found ("" when none). Prints each gradient's
// error against the reference.
std::string run_case(fa_runtime *rt, const Case &c);

// The standard cases (every feature; head dims 8 .. 256).
std::vector<Case> cases();

// Deterministic mode on rt: three runs of a causal GQA case (varlen, or a
// fixed-length batch) bit-identical, and one of its sequences alone
// bit-identical to itself in the batch; the problems found.
std::string deterministic_check(fa_runtime *rt, bool varlen = true);

}  // namespace fa::test::bwd

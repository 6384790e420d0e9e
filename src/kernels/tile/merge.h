// Merging softmax states (FlashAttention-2's rescaling, Flash-Decoding's
// combine): a state is (LSE or running maximum, sum of exponentials, O); two
// or more merge by taking exponentials against a common offset, the largest
// of them. One place for the offset rule (0 when every state is empty), the
// weights, and the attention sink, which joins a row as a state with O = 0.
// Used by OnlineSoftmax (tile.h), the decode kernel's merge of its warps and
// the combine of the splits (combine_row: reduce.cc's kernel and the decode
// kernel's fused combine).
#pragma once

#include <functional>

#include "kernels/codegen.h"

namespace fa::kgen::tile {

// The offset for states of largest LSE (or maximum) m: m, or 0 when m =
// -inf (no state holds a key: no -inf - -inf, every weight 2^-inf = 0).
// none: the predicate m = -inf. New registers (f32, pred).
struct MergeOffset {
  Reg off, none;
};
MergeOffset merge_offset(Emitter &e, Reg m);

// A state's weight against off, into w (f32): 2^(l - off) for a base-2 l,
// e^(l - off) = 2^((l - off) log2 e) for a natural one; the difference
// first, so that large LSEs do not cancel. 0 for l = -inf.
void merge_weight(ptx::Builder &b, Reg w, Reg l, Reg off, bool base2);

// The end of a softmax row with an attention sink (gpt-oss, FlashAttention-3's
// learnable sink): the row's exponentials used the offset m2 (log2 domain;
// -inf for a row that saw no key, l = 0) and sum to l; the sink logit s2
// (log2 domain) joins the denominator once and contributes no value:
//   M = max(m2, s2) (0 when both are -inf), L = l 2^(m2 - M) + 2^(s2 - M),
//   O = acc * inv with inv = 2^(m2 - M) / L, LSE = (M + log2 L) ln 2;
// when L is not > 0, inv = nan0 and LSE = s2 ln 2 instead.
// Every exponent is <= 0, so no finite sink overflows; a row with no key gets
// O = 0 and LSE = sink, and a sink of -inf changes nothing. A non-finite
// sink follows flashattn.h's formula: L is not > 0 exactly when the sink is
// -inf on a row with no key (L = 0: O = 0, LSE = -inf), +inf (L = NaN from
// inf - inf: O = 0, LSE = +inf) or NaN (O = NaN, LSE = NaN), with nan0 =
// sink_nan0(s2). These are the same instructions per row as without them:
// only the selects' second operands are registers.
struct SinkRow {
  Reg inv, lse;
};
SinkRow sink_row(Emitter &e, Reg m2, Reg l, Reg s2, Reg nan0);
// NaN when the sink s2 is NaN, else 0 (f32): sink_row's factor of O in a row
// whose denominator is not > 0. Once per thread (2 instructions).
Reg sink_nan0(Emitter &e, Reg s2);

// One query row of Flash-Decoding's combine (fa_decode_reduce's math and
// rules, flashattn.h), run by one warp: lane j owns O's columns j, j + 32,
// ... of the row. m = max_s LSE_s (and the sink), w_s = 2^(LSE_s - m) in the
// input's base, O = sum_s w_s O_s / sum_s w_s, LSE = m + log(sum_s w_s) in
// the output's base; -inf states weigh 0 (all -inf: O = 0, LSE = -inf),
// +inf states share the weight (a uniform branch: the warp's row), a NaN
// one gives NaN. The states are read with plain global loads in state
// order (the caller orders them after their writers: a kernel boundary, or
// the fused combine's acq_rel counter and CTA barrier). The one copy of the
// combine: the standalone reduce kernel and the decode kernel's fused tail
// run these same instructions per row, so their results are bit-identical.
// Ends by branching to *done, or with exit when done is null.
struct CombineRow {
  Reg lane;          // u32, the lane in the warp
  Reg num_states;    // s32, >= 1
  Reg l0, o0;        // u64 global: state 0's LSE (f32), its O at column `lane` (f32)
  Reg lstep, ostep;  // s64 bytes from one state's LSE / O to the next's
  int head_dim_v = 0;
  Dtype dtype = Dtype::F16;  // O's (fp32: stored unrounded)
  bool lse_in_base2 = false, lse_out_base2 = false;
  // With a sink: the u64 global address of the row's fp32 natural-log sink
  // (called once, after the maximum over the states).
  std::function<Reg()> sink_at;
  // The u64 global address of O[row][lane] (called once, at the store), and
  // of the row's fp32 LSE (called after O's stores; written by lane 0 when
  // the predicate has_lse holds).
  std::function<Reg()> o_at, lse_at;
  Reg has_lse;
};
void combine_row(Emitter &e, const CombineRow &c, const ptx::Label *done);

}  // namespace fa::kgen::tile

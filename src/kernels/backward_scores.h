// The per-key-block logic every backward generator shares (FlashAttention-2's
// Algorithm 2, Dao 2023, section 3.1, in the transposed orientation: a
// warp's accumulator rows are keys, its columns query rows): which query
// rows see a key block, P^T from S^T (softcap, ALiBi, masks, the row's LSE)
// and dS^T = P^T o (dP^T - D), and the deterministic mode's semaphore. The
// accumulator tiles are tile.h's mma C layout, which is also wgmma's
// m64nNk16 accumulator per warp (backward_tc.cc, backward_wgmma.cc).
#pragma once

#include <functional>
#include <vector>

#include "kernels/codegen.h"
#include "kernels/tile/tile.h"

namespace fa::kgen {

// The launch's lengths and windows as a generator reads them: each call
// emits the read where it is used (parameters or special registers), so
// that few registers stay live across the query-block loop.
struct BackwardDims {
  std::function<Reg()> sq, sk, wl, wr;
};

// The query rows [begin, end) that see keys n0 .. min(n0 + block_n, sk) - 1:
// query i sees key j when i + sk - sq - wl <= j <= i + sk - sq + wr, so i
// in [n0 - shift - wr, n1 - 1 - shift + wl] within [0, sq), formed in 64
// bits (windows up to 2^30); begin rounded down to a multiple of block_m.
// New s32 registers.
struct BackwardQueryRange {
  Reg begin, end;
};
BackwardQueryRange backward_query_range(Emitter &e, const BackwardDims &d, Reg n0, int block_n,
                                        int block_m);

// Deterministic mode (BackwardParams::dq_sem): the address (u64) of the
// semaphore of the dQ columns `slice` of the query block at m0 of (bz, h)
// (one u32 per kSemRows rows and kSemSlices slices), and the number of key
// blocks before n0's that add to that block's dQ: those from the first one
// its first row sees, max(0, m0 + shift - wl) / block_n, to n0's (s32).
struct DqSemaphore {
  Reg addr, before;
};
// sem_base (the dq_sem pointer, global), sq_max (the launch's seqlen_q),
// bz and hq (num_heads_q) emit their reads where used.
using RegFn = std::function<Reg()>;
// block_n a power of two.
DqSemaphore dq_semaphore(Emitter &e, const BackwardDims &d, const RegFn &sem_base,
                         const RegFn &sq_max, const RegFn &bz, const RegFn &hq, Reg h, Reg m0,
                         Reg slice, Reg n0, int block_n);

// The two 16-bit values of w (b32) as f32 (lo: the lower half; exact:
// bf16 by a shift into the upper half, f16 by cvt.f32.f16).
void unpack_half2(Emitter &e, Dtype dt, Reg w, Reg lo, Reg hi);

// P^T of a warp's accumulator tile s in place: S^T's row g (+ 8) is key
// n0 + 16 warp_keys + g (+ 8), column 8j + 2q + x query m0 + 8j + 2q + x.
// Softcap (cap valid: scale_score, and 1 - tanh^2 of each score into
// dtanh), ALiBi (alibi_coef() when set), the masks (keys past sk, outside a
// query's window: -inf), then 2^(s c - LSE_log2) with c = score_scale (1
// with softcap). The LSE_log2 of column 2q of fragment j is the f32 pair at
// shared address stats + 8q + lse_off + 32 j, D's at d_off.
// With dtanh16 set instead of dtanh (registers: sm_90a), 1 - tanh^2 is kept
// rounded to the inputs' 16-bit type, (x0, x1) of fragment j's row half h in
// (*dtanh16)[2j + h] (dS^T is rounded to that type for its products anyway).
struct BackwardScores {
  const tile::AccTile *s = nullptr, *dtanh = nullptr;
  const std::vector<Reg> *dtanh16 = nullptr;
  Dtype dtype = Dtype::F16;  // dtanh16's type (F16 or BF16)
  Softcap cap;
  Reg inv_cap;  // 1 / cap_log2 (softcap)
  std::function<Reg()> score_scale, alibi_coef;
  Reg warp_keys, n0, m0;  // u32, s32, s32
  const tile::Lanes *ln = nullptr;
  Reg stats;  // u32 shared address
  int lse_off = 0, d_off = 0;
};
// The fields every generator sets alike: the score scale and ALiBi's
// coefficient of (bz, h) (spec.alibi) emitted where used, the warp's keys,
// the block, the lanes and the statistics' place; s, dtanh / dtanh16 and
// the softcap constants are the caller's.
BackwardScores backward_scores(Emitter &e, const KernelSpec &spec, const RegFn &score_scale,
                               const RegFn &bz, Reg h, Reg warp_keys, Reg n0, Reg m0,
                               const tile::Lanes *ln, Reg stats, int lse_off, int d_off);

void backward_probabilities(Emitter &e, const BackwardDims &d, const BackwardScores &x);

// dS^T = P^T o (dP^T - D) in x.s (times 1 - tanh^2 with softcap), dp the
// warp's dP^T tile (consumed).
void backward_grad_s(Emitter &e, const BackwardScores &x, const tile::AccTile &dp, bool softcap);

// Rows key0 + g (+ 8) (a warp's keys; key0 the row-g key, s32) of a
// warp's accumulator tile acc (dK or dV, cols columns, whole 8-column
// blocks) rounded to `half` and stored at base + key row_bytes + col (col:
// the lane's column 2q in bytes), keys at or past sk() skipped; times scale
// first when scale is valid. w: a b32 scratch register.
void backward_store_keys(Emitter &e, Type half, const tile::AccTile &acc, Reg base, Reg row_bytes,
                         Reg key0, Reg col, const RegFn &sk, int cols, Reg scale, Reg w);

}  // namespace fa::kgen

// The row mask of the attention kernels: which keys a query row sees
// (bottom-right aligned causal masking and sliding windows, as
// FlashAttention-2's window_size), the -inf that hides the others in an
// accumulator tile, and the ALiBi bias by distance from the row's diagonal.
// Every generator's masking is composed from these.
#pragma once

#include "kernels/tile/tile.h"

namespace fa::kgen::tile {

// The keys [lo, hi) = [max(diag - wl, floor), min(diag + wr + 1, ceil)) of
// the query row on diagonal diag (its index + seqlen_k - seqlen_q; s32),
// with the resolved window edges wl, wr (set_masking_and_scale) and the
// bounds of the keys in play: [0, seqlen_k) for a forward row, a split's
// keys for a decode row. New s32 registers.
struct RowRange {
  Reg lo, hi;
};
RowRange row_range(Emitter &e, Reg diag, Reg wl, Reg wr, Operand floor, Operand ceil);

// Masks row half h of s outside r's keys, for a tile whose lane-relative
// first key is kq (the tile's first key + 2q): r is moved to that origin in
// place, then mask_row_half. p and t are scratch predicates.
void mask_row(ptx::Builder &b, const AccTile &s, int h, const RowRange &r, Reg kq, Reg p, Reg t);

// Masks row half h (rows g + 8h) of an accumulator tile: element (j, x)
// holds the column c = 8j + 2q + x relative to the lane's own first column
// (c0 + 2q), and becomes -inf unless lo <= c < hi, with lo and hi given
// relative to that column (s32 registers). p and t are scratch predicates.
void mask_row_half(ptx::Builder &b, const AccTile &s, int h, Reg lo, Reg hi, Reg p, Reg t);

// Masks a row held in one thread's registers (tcgen05 kernels: a row of S
// read from tensor memory): s[x] becomes -inf unless lo <= x < hi (s32
// registers relative to s[0]'s key). p and t are scratch predicates.
void mask_keys(ptx::Builder &b, const std::vector<Reg> &s, Reg lo, Reg hi, Reg p, Reg t);

// ALiBi (Press et al. 2022; FlashAttention-2's alibi_slopes): the logit of
// query i, key j loses slope |i + seqlen_k - seqlen_q - j|. The bias is
// added where the scores are, before the online softmax scales them: a
// kernel without softcap keeps raw q.k scores that OnlineSoftmax multiplies
// by c = softmax_scale log2(e), so the bias there is -slope / softmax_scale
// per key (FlashAttention-2's fold); with softcap the scores are already in
// the log2 domain and the bias is -slope log2(e). Either way one coefficient
// per row, formed once (alibi_coef), and per score
//   x += coef |dist - k|
// (sub, abs, fma in f32: the distance is an integer, exact below 2^24).
// The coefficient of (sequence bz, query head h): slopes_param is the byte
// offset of the {uint64 alibi_slopes, int64 alibi_slopes_stride} pair in
// the parameter block; score_scale the f32 register OnlineSoftmax scales by
// (softmax_scale log2 e), or invalid with softcap.
Reg alibi_coef(Emitter &e, size_t slopes_param, Reg bz, Reg h, Reg score_scale);
// x += coef |dist - k| for one score (dist, coef f32 registers; k a key
// offset in the tile; t f32 scratch). The one place the bias is formed.
void alibi_bias(ptx::Builder &b, Reg x, Reg dist, int k, Reg coef, Reg t);
// Row half h of an accumulator tile (as mask_row_half): element (j, x) holds
// the key at 8j + x from the lane's own first column, whose distance from
// the row's diagonal is dist (f32: diagonal - that key).
void alibi_row_half(ptx::Builder &b, const AccTile &s, int h, Reg dist, Reg coef, Reg t);

}  // namespace fa::kgen::tile

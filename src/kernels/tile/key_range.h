// The key-range schedule of the forward kernels (FlashAttention-2 section
// 3.1, causal block skipping, generalised to sliding windows): which K/V
// tiles a CTA of query rows visits, which of them need a mask, and the loop
// that walks them last tile first, switching between a masked and a lean
// body where the tiles change kind. A generator supplies the loop body; the
// range arithmetic and the control flow exist once, here.
#pragma once

#include <functional>

#include "kernels/codegen.h"

namespace fa::kgen::tile {

// x (>= 0) rounded down to a multiple of n (> 0), in place: an and with
// -n for a power of two, else a division and a multiplication.
void round_down(ptx::Builder &b, Reg x, int n);

// The keys of a CTA owning query rows [m0, min(m0 + block_m, seqlen_q)):
// row i sees keys [i + shift - wl, i + shift + wr] within [0, seqlen_k),
// shift = seqlen_k - seqlen_q (bottom-right aligned), wl and wr the
// resolved window edges (int32, set_masking_and_scale). The CTA visits the
// union of its rows' ranges in tiles of block_n keys starting at n_begin,
// n_begin + block_n, ..., top. A tile starting at n with
// lean_lo <= n <= lean_hi (lean_hi()) holds only keys every row sees.
struct KeyRange {
  Reg dfirst;   // m0 + shift: the first row's diagonal (s32)
  Reg n_begin;  // the first tile: max(dfirst - wl, 0) rounded down to block_n
  Reg empty;    // pred: no row sees any key (n_begin >= the range's end)
  Reg top;      // the last tile's first key
  Reg lean_lo;  // the first lean tile: max(dlast - wl, n_begin), dlast the last row's diagonal
};
KeyRange key_range(Emitter &e, Reg m0, Reg shift, Reg seqlen_q, Reg seqlen_k, Reg wl, Reg wr,
                   int block_m, int block_n);

// Split-KV (Flash-Decoding's split of the key axis; FlashAttention-3 splits
// the forward's the same way): r narrowed to split `split` (s32) of
// split_size keys (s32, a multiple of block_n), keys [split split_size,
// (split + 1) split_size): n_begin and top clamped into it, empty when no
// tile is left, lean_lo at least n_begin. Which tiles need a mask does not
// change (lean_hi is the unsplit one).
void split_keys(Emitter &e, KeyRange *r, Reg split, Reg split_size, int block_n);

// The last lean tile start, min(dfirst + wr + 1, seqlen_k) - block_n: a
// tile starting past it holds a key beyond the first row's range (or past
// seqlen_k).
Reg lean_hi(Emitter &e, Reg dfirst, Reg wr, Reg seqlen_k, int block_n);

// The masked/lean key loop over tiles n = top, top - block_n, ...,
// n_begin (the body steps n down by block_n). The caller has set n to top,
// left when the range is empty, and made the labels and the two predicates
// (p, t: scratch) in its own order. It enters in the body the last tile
// needs; after each tile it goes to `exit` past n_begin, else to the body
// the next tile needs (masked tiles sit at either end of the range: the
// diagonal or window edge, and the seqlen_k tail). `lean_hi` yields the
// bound (a generator may re-derive it at each use rather than hold a
// register across the loops). `uniform`: every thread of the CTA branches
// together (bra.uni). The caller binds `exit`.
struct KeyLoop {
  Reg n, n_begin, lean_lo;
  std::function<Reg()> lean_hi;
  ptx::Label masked, lean, exit;
  Reg p, t;
  bool uniform = false;
};
void key_loop(ptx::Builder &b, const KeyLoop &k, const std::function<void(bool masked)> &body);

}  // namespace fa::kgen::tile

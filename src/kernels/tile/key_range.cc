#include "kernels/tile/key_range.h"

#include <cstdint>

namespace fa::kgen::tile {

void round_down(ptx::Builder &b, Reg x, int n) {
  if ((n & (n - 1)) == 0) {
    b.op(Op::And, Type::B32, x, x, imm(-n));
    return;
  }
  b.op(Op::Div, Type::U32, x, x, imm(n));
  b.op(Op::MulLo, Type::U32, x, x, imm(n));
}

KeyRange key_range(Emitter &e, Reg m0, Reg shift, Reg seqlen_q, Reg seqlen_k, Reg wl, Reg wr,
                   int block_m, int block_n) {
  ptx::Builder &b = e.b;
  KeyRange r;
  Reg last = e.op(Op::Min, Type::S32, e.op(Op::Add, Type::S32, m0, imm(block_m)), seqlen_q);
  b.op(Op::Sub, Type::S32, last, last, imm(1));
  r.dfirst = e.op(Op::Add, Type::S32, m0, shift);
  Reg dlast = e.op(Op::Add, Type::S32, last, shift);
  r.n_begin = e.op(Op::Max, Type::S32, e.op(Op::Sub, Type::S32, r.dfirst, wl), imm(0));
  round_down(b, r.n_begin, block_n);
  // The range's end: one past the last row's last key.
  Reg n_end = e.op(Op::Add, Type::S32, dlast, wr);
  b.op(Op::Add, Type::S32, n_end, n_end, imm(1));
  b.op(Op::Min, Type::S32, n_end, n_end, seqlen_k);
  r.empty = e.setp(Cmp::Ge, Type::S32, r.n_begin, n_end);
  // Last tile: n_begin + floor((n_end - 1 - n_begin) / block_n) block_n.
  r.top = e.op(Op::Sub, Type::S32, e.op(Op::Sub, Type::S32, n_end, imm(1)), r.n_begin);
  b.op(Op::Max, Type::S32, r.top, r.top, imm(0));
  round_down(b, r.top, block_n);
  b.op(Op::Add, Type::S32, r.top, r.top, r.n_begin);
  r.lean_lo = e.op(Op::Max, Type::S32, e.op(Op::Sub, Type::S32, dlast, wl), r.n_begin);
  return r;
}

void split_keys(Emitter &e, KeyRange *r, Reg split, Reg split_size, int block_n) {
  // The split's first key and last tile start in 64 bits, clamped to
  // INT32_MAX (past every key: the range is then empty).
  Reg lo = e.wide_mul(split, split_size);
  Reg last = e.op(Op::Add, Type::S64, lo, e.s64(split_size));
  e.b.op(Op::Sub, Type::S64, last, last, imm(block_n));
  auto s32 = [&](Reg x) { return e.s32(e.op(Op::Min, Type::S64, x, imm(INT32_MAX))); };
  r->n_begin = e.op(Op::Max, Type::S32, r->n_begin, s32(lo));
  r->top = e.op(Op::Min, Type::S32, r->top, s32(last));
  Reg none = e.setp(Cmp::Lt, Type::S32, r->top, r->n_begin);
  r->empty = e.op(Op::Or, Type::Pred, r->empty, none);
  r->lean_lo = e.op(Op::Max, Type::S32, r->lean_lo, r->n_begin);
}

Reg lean_hi(Emitter &e, Reg dfirst, Reg wr, Reg seqlen_k, int block_n) {
  Reg h = e.op(Op::Add, Type::S32, dfirst, wr);
  e.b.op(Op::Add, Type::S32, h, h, imm(1));
  e.b.op(Op::Min, Type::S32, h, h, seqlen_k);
  e.b.op(Op::Sub, Type::S32, h, h, imm(block_n));
  return h;
}

void key_loop(ptx::Builder &b, const KeyLoop &k, const std::function<void(bool masked)> &body) {
  const Reg p = k.p, t = k.t;
  auto is_lean = [&]() {  // p = lean_lo <= n <= lean_hi
    b.setp(Cmp::Ge, Type::S32, p, k.n, k.lean_lo);
    b.setp(Cmp::Le, Type::S32, t, k.n, k.lean_hi());
    b.op(Op::And, Type::Pred, p, p, t);
  };
  // Enter where the last tile belongs; each loop hands over to the other
  // when the tiles change kind.
  is_lean();
  b.when(p).bra(k.lean, k.uniform);
  b.bind(k.masked);
  b.comment("masked K/V tile (diagonal, window edge or seqlen_k tail)");
  body(true);
  b.setp(Cmp::Lt, Type::S32, p, k.n, k.n_begin);
  b.when(p).bra(k.exit, k.uniform);
  is_lean();
  b.unless(p).bra(k.masked, k.uniform);
  b.bind(k.lean);
  b.comment("lean K/V tile: every key visible to every row");
  body(false);
  b.setp(Cmp::Ge, Type::S32, p, k.n, k.lean_lo);
  b.when(p).bra(k.lean, k.uniform);
  b.setp(Cmp::Ge, Type::S32, p, k.n, k.n_begin);
  b.when(p).bra(k.masked, k.uniform);
}

}  // namespace fa::kgen::tile

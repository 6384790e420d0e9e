#include "kernels/tile/row_mask.h"

namespace fa::kgen::tile {

RowRange row_range(Emitter &e, Reg diag, Reg wl, Reg wr, Operand floor, Operand ceil) {
  RowRange r;
  r.lo = e.op(Op::Max, Type::S32, e.op(Op::Sub, Type::S32, diag, wl), floor);
  r.hi = e.op(Op::Add, Type::S32, diag, wr);
  e.b.op(Op::Add, Type::S32, r.hi, r.hi, imm(1));
  e.b.op(Op::Min, Type::S32, r.hi, r.hi, ceil);
  return r;
}

void mask_row(ptx::Builder &b, const AccTile &s, int h, const RowRange &r, Reg kq, Reg p, Reg t) {
  b.op(Op::Sub, Type::S32, r.lo, r.lo, kq);
  b.op(Op::Sub, Type::S32, r.hi, r.hi, kq);
  mask_row_half(b, s, h, r.lo, r.hi, p, t);
}

void mask_row_half(ptx::Builder &b, const AccTile &s, int h, Reg lo, Reg hi, Reg p, Reg t) {
  for (int j = 0; j < s.n(); ++j)
    for (int x = 0; x < 2; ++x) {
      Reg v = s.f[j][2 * h + x];
      b.setp(Cmp::Le, Type::S32, p, lo, imm(8 * j + x));
      b.setp(Cmp::Gt, Type::S32, t, hi, imm(8 * j + x));
      b.op(Op::And, Type::Pred, p, p, t);
      b.selp(Type::F32, v, v, fimm(kNegInf), p);
    }
}

void mask_keys(ptx::Builder &b, const std::vector<Reg> &s, Reg lo, Reg hi, Reg p, Reg t) {
  for (size_t x = 0; x < s.size(); ++x) {
    b.setp(Cmp::Le, Type::S32, p, lo, imm(static_cast<int64_t>(x)));
    b.setp(Cmp::Gt, Type::S32, t, hi, imm(static_cast<int64_t>(x)));
    b.op(Op::And, Type::Pred, p, p, t);
    b.selp(Type::F32, s[x], s[x], fimm(kNegInf), p);
  }
}

Reg alibi_coef(Emitter &e, size_t slopes_param, Reg bz, Reg h, Reg score_scale) {
  Reg slopes = e.global_param(slopes_param);
  Reg stride = e.stride_bytes(slopes_param + 8, 4);  // 0: one row for the batch
  Reg row = e.index(slopes, bz, stride);
  Reg c = e.new_reg(Type::F32);
  e.b.ld(Space::Global, Type::F32, c, ptx::at(e.index(row, h, 4)), true);
  e.b.op(Op::Mul, Type::F32, c, c, fimm(-kLog2e));
  // Raw scores: OnlineSoftmax multiplies by score_scale = softmax_scale log2 e.
  if (score_scale.valid()) e.b.op(Op::DivRn, Type::F32, c, c, score_scale);
  return c;
}

void alibi_bias(ptx::Builder &b, Reg x, Reg dist, int k, Reg coef, Reg t) {
  if (k == 0) {
    b.op(Op::Abs, Type::F32, t, dist);
  } else {
    b.op(Op::Sub, Type::F32, t, dist, fimm(static_cast<float>(k)));
    b.op(Op::Abs, Type::F32, t, t);
  }
  b.op(Op::Fma, Type::F32, x, t, coef, x);
}

void alibi_row_half(ptx::Builder &b, const AccTile &s, int h, Reg dist, Reg coef, Reg t) {
  for (int j = 0; j < s.n(); ++j)
    for (int x = 0; x < 2; ++x) alibi_bias(b, s.f[j][2 * h + x], dist, 8 * j + x, coef, t);
}

}  // namespace fa::kgen::tile

#include "kernels/tile/merge.h"

namespace fa::kgen::tile {

MergeOffset merge_offset(Emitter &e, Reg m) {
  MergeOffset r;
  r.none = e.setp(Cmp::Eq, Type::F32, m, fimm(kNegInf));
  r.off = e.selp(Type::F32, fimm(0.0f), m, r.none);
  return r;
}

void merge_weight(ptx::Builder &b, Reg w, Reg l, Reg off, bool base2) {
  b.op(Op::Sub, Type::F32, w, l, off);
  if (!base2) b.op(Op::Mul, Type::F32, w, w, fimm(kLog2e));
  b.op(Op::Ex2, Type::F32, w, w);
}

SinkRow sink_row(Emitter &e, Reg m2, Reg l, Reg s2, Reg nan0) {
  ptx::Builder &b = e.b;
  Reg mx = e.op(Op::Max, Type::F32, m2, s2);
  Reg none = e.setp(Cmp::Eq, Type::F32, mx, fimm(kNegInf));
  b.selp(Type::F32, mx, fimm(0.0f), mx, none);
  Reg alpha = e.op(Op::Ex2, Type::F32, e.op(Op::Sub, Type::F32, m2, mx));
  Reg beta = e.op(Op::Ex2, Type::F32, e.op(Op::Sub, Type::F32, s2, mx));
  Reg sum = e.op(Op::Fma, Type::F32, l, alpha, beta);
  // Not > 0: no key and no sink (0), or a sink of +inf or NaN (NaN).
  Reg pos = e.setp(Cmp::Gt, Type::F32, sum, fimm(0.0f));
  SinkRow r;
  r.inv = e.op(Op::RcpRn, Type::F32, sum);
  b.op(Op::Mul, Type::F32, r.inv, r.inv, alpha);
  b.selp(Type::F32, r.inv, r.inv, nan0, pos);
  r.lse = e.op(Op::Add, Type::F32, mx, e.op(Op::Lg2, Type::F32, sum));
  b.selp(Type::F32, r.lse, r.lse, s2, pos);  // then -inf, +inf or NaN
  b.op(Op::Mul, Type::F32, r.lse, r.lse, fimm(kLn2));
  return r;
}

Reg sink_nan0(Emitter &e, Reg s2) {
  Reg nan = e.setp(Cmp::Nan, Type::F32, s2, s2);
  return e.selp(Type::F32, s2, fimm(0.0f), nan);
}

}  // namespace fa::kgen::tile

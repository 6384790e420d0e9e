#include "kernels/tile/merge.h"

#include <vector>

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

namespace fa::kgen::tile {

void combine_row(Emitter &e, const CombineRow &c, const ptx::Label *done) {
  ptx::Builder &b = e.b;
  const int nv = (c.head_dim_v + 31) / 32;
  Reg pdim;
  if (c.head_dim_v % 32) pdim = e.setp(Cmp::Lt, Type::U32, c.lane, imm(c.head_dim_v % 32));

  // Pass 1: m = max_s LSE_s.
  b.comment("m = max_s LSE_s");
  Reg m = e.mov(Type::F32, fimm(kNegInf));
  Reg x = b.f32();
  Reg s = b.b32();
  Reg lp = b.b64(), op = b.b64();
  b.mov(Type::S32, s, imm(0));
  b.mov(Type::U64, lp, c.l0);
  ptx::Label loop1 = b.label();
  b.bind(loop1);
  b.ld(Space::Global, Type::F32, x, at(lp));
  b.op(Op::Max, Type::F32, m, m, x);
  b.op(Op::Add, Type::S64, lp, lp, c.lstep);
  b.op(Op::Add, Type::S32, s, s, imm(1));
  Reg more = b.pred();
  b.setp(Cmp::Lt, Type::S32, more, s, c.num_states);
  b.when(more).bra(loop1);

  // Attention sinks (gpt-oss): the sink joins the row's denominator once,
  // as one more state with weight exp(sink) and O = 0, here in the combine
  // (the decode kernels' partial states never hold it). In the input's
  // base: a natural sink times log2 e for base-2 states.
  Reg sink;
  if (c.sink_at) {
    b.comment("m = max(m, sink)");
    Reg sa = c.sink_at();
    sink = b.f32();
    b.ld(Space::Global, Type::F32, sink, at(sa));
    if (c.lse_in_base2) b.op(Op::Mul, Type::F32, sink, sink, fimm(kLog2e));
    b.op(Op::Max, Type::F32, m, m, sink);
  }

  // Pass 2: w_s = 2^((LSE_s - m) log2 e), sums of w_s and w_s O_s. With no
  // finite LSE_s the offset is 0 and every w_s is 0. m = +inf (a state or
  // the sink of +inf; the warp's row, so a uniform branch) takes the loop at
  // `inf_row`, where the +inf states weigh 1 each (the sink as a state with O
  // = 0) and the others 0: inf - inf would be NaN. A NaN LSE_s or sink (max
  // skips it) makes its w_s, so sum, NaN.
  b.comment("O = sum_s w_s O_s / sum_s w_s");
  Reg off = merge_offset(e, m).off;
  Reg sum = b.f32();
  std::vector<Reg> acc;
  for (int i = 0; i < nv; ++i) acc.push_back(b.f32());
  Reg w = b.f32(), v = b.f32();
  Reg is_inf = b.pred();
  // w = 2^(l - off) (l a state's LSE in the input's base; -inf - off weighs
  // 0), or on the +inf row 1 where l = +inf; sum += w.
  auto weight = [&](Reg l, bool inf_row) {
    merge_weight(b, w, l, off, c.lse_in_base2);
    if (inf_row) {
      b.setp(Cmp::Eq, Type::F32, is_inf, l, fimm(-kNegInf));
      b.selp(Type::F32, w, fimm(1.0f), w, is_inf);
    }
    b.op(Op::Add, Type::F32, sum, sum, w);
  };
  auto pass2 = [&](bool inf_row) {
    b.mov(Type::F32, sum, fimm(0.0f));
    for (Reg a : acc) b.mov(Type::F32, a, fimm(0.0f));
    b.mov(Type::S32, s, imm(0));
    b.mov(Type::U64, lp, c.l0);
    b.mov(Type::U64, op, c.o0);
    ptx::Label loop2 = b.label();
    b.bind(loop2);
    b.ld(Space::Global, Type::F32, x, at(lp));
    weight(x, inf_row);
    for (int i = 0; i < nv; ++i) {
      if (pdim.valid() && i == nv - 1) b.when(pdim);
      b.ld(Space::Global, Type::F32, v, at(op, 128 * i));
      b.op(Op::Fma, Type::F32, acc[i], w, v, acc[i]);
    }
    b.op(Op::Add, Type::S64, lp, lp, c.lstep);
    b.op(Op::Add, Type::S64, op, op, c.ostep);
    b.op(Op::Add, Type::S32, s, s, imm(1));
    b.setp(Cmp::Lt, Type::S32, more, s, c.num_states);
    b.when(more).bra(loop2);
    if (sink.valid()) weight(sink, inf_row);
  };
  ptx::Label inf_row = b.label(), store = b.label();
  b.setp(Cmp::Eq, Type::F32, is_inf, m, fimm(-kNegInf));
  b.when(is_inf).bra(inf_row);
  pass2(false);

  b.bind(store);
  b.comment("store O, LSE");
  // sum is not > 0 when no state weighs anything (0: O = 0, and LSE = -inf
  // from lg2 0 = -inf) or when a state is NaN (NaN: O = NaN, LSE = NaN).
  Reg pos = e.setp(Cmp::Gt, Type::F32, sum, fimm(0.0f));
  Reg inv = e.op(Op::RcpRn, Type::F32, sum);
  b.selp(Type::F32, inv, inv, sum, pos);
  // LSE = off + log(sum) in the input's base, converted to the output's:
  // base 2 = natural * log2(e) (flashattn.h, fa_lse_format).
  Reg lse;
  if (!c.lse_in_base2 && !c.lse_out_base2) {
    lse = e.op(Op::Mul, Type::F32, e.op(Op::Lg2, Type::F32, sum), fimm(kLn2));
    b.op(Op::Add, Type::F32, lse, lse, off);
  } else if (!c.lse_in_base2) {
    lse = e.op(Op::Lg2, Type::F32, sum);
    b.op(Op::Fma, Type::F32, lse, off, fimm(kLog2e), lse);
  } else {
    lse = e.op(Op::Add, Type::F32, e.op(Op::Lg2, Type::F32, sum), off);
    if (!c.lse_out_base2) b.op(Op::Mul, Type::F32, lse, lse, fimm(kLn2));
  }
  const int eb = elem_bytes(c.dtype);  // fp32 O: stored unrounded
  Reg orow = c.o_at();
  Reg hv = eb == 2 ? b.b16() : Reg();
  Type cvt_to = c.dtype == Dtype::BF16 ? Type::BF16 : Type::F16;
  for (int i = 0; i < nv; ++i) {
    b.op(Op::Mul, Type::F32, acc[i], acc[i], inv);
    if (eb == 2) b.cvt(cvt_to, Type::F32, ptx::Round::Rn, hv, acc[i]);
    if (pdim.valid() && i == nv - 1) b.when(pdim);
    if (eb == 2)
      b.st(Space::Global, Type::B16, at(orow, 64 * i), hv);
    else
      b.st(Space::Global, Type::F32, at(orow, 128 * i), acc[i]);
  }
  Reg lane0 = e.setp(Cmp::Eq, Type::U32, c.lane, imm(0));
  b.op(Op::And, Type::Pred, lane0, lane0, c.has_lse);
  Reg la = c.lse_at();
  b.when(lane0).st(Space::Global, Type::F32, at(la), lse);
  if (done)
    b.bra(*done);
  else
    b.exit();
  // m = +inf: the +inf states share the weight (LSE = +inf + log(count)).
  b.bind(inf_row);
  pass2(true);
  b.bra(store);
}

}  // namespace fa::kgen::tile

// Decode-reduce generator: combines the per-split partial states
// (O_s normalised within split s, LSE_s natural log, or base 2 with
// spec.lse_in_base2: the weights are computed in base 2 either way, so a
// base-2 input needs no conversion; spec.lse_out_base2 writes log2) of each
// query row:
//   m = max_s LSE_s, w_s = exp(LSE_s - m), O = sum_s w_s O_s / sum_s w_s,
//   LSE = m + log(sum_s w_s);
// splits with LSE_s = -inf weigh nothing; no finite LSE_s: O = 0, LSE = -inf.
// Non-finite LSE_s as flashattn.h's fa_decode_reduce: a NaN one gives O =
// NaN, LSE = NaN; +inf ones take all the weight, shared equally (O = their
// mean, LSE = +inf).
// With spec.sinks, sinks[h] is one more term of m and of sum_s w_s (with O
// = 0): the attention sink joins the denominator once per row.
// One warp per (batch, token, head) row, lane j owns dims j, j+32, ...
// With spec.varlen (the varlen forward's combine) the partial states are
// padded to seqlen_q rows per sequence: a row past its sequence's length
// (cu_seqlens_q) is skipped, and O and LSE are the packed ones
// (ReduceParams::cu_seqlens_q).
#include <utility>
#include <vector>

#include "kernels/codegen.h"
#include "kernels/tile/merge.h"

namespace fa {
namespace kgen {

std::string generate_reduce(const KernelSpec &spec) {
  using P = ReduceParams;
  ptx::Builder b(entry_name(spec), reduce_params_size(spec));
  Emitter e(b);
  const int W = spec.num_warps, nv = (spec.head_dim_v + 31) / 32;
  b.comment(spec.describe());
  Reg tid = e.mov(Type::U32, ptx::sreg(ptx::Special::TidX));
  Reg lane = e.op(Op::And, Type::B32, tid, imm(31));
  Reg warp = e.op(Op::Shr, Type::U32, tid, imm(5));
  Reg cta = e.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX));
  Reg ns = e.param(Type::S32, offsetof(P, num_splits));
  Reg batch = e.param(Type::S32, offsetof(P, batch));
  Reg sq = e.param(Type::S32, offsetof(P, seqlen_q));
  Reg hq = e.param(Type::S32, offsetof(P, num_heads_q));
  // Rows are (batch, token, head) in 64 bits: batch * seqlen_q *
  // num_heads_q may pass 2^31.
  Reg warp64 = b.b64(), row = b.b64();
  b.cvt(Type::U64, Type::U32, ptx::Round::None, warp64, warp);
  b.mad_wide(Type::U32, row, cta, imm(W), warp64);
  Reg sq64 = e.s64(sq), hq64 = e.s64(hq);
  Reg total = e.op(Op::MulLo, Type::S64, e.wide_mul(batch, sq), hq64);
  // Warps past the last row leave (whole warps: no collective follows).
  Reg past = e.setp(Cmp::Ge, Type::S64, row, total);
  b.when(past).exit();
  Reg bt64 = e.op(Op::Div, Type::S64, row, hq64);
  Reg h = e.s32(e.op(Op::Rem, Type::S64, row, hq64));
  Reg t = e.s32(e.op(Op::Rem, Type::S64, bt64, sq64));
  Reg bz = e.s32(e.op(Op::Div, Type::S64, bt64, sq64));
  // spec.pdl: the partial states are the previous kernel's (a programmatic
  // dependent launch): nothing in global memory before it has completed.
  if (spec.pdl) b.griddepcontrol_wait();
  Reg q0, total_q;  // spec.varlen: the sequence's first packed row, cu[batch]
  if (spec.varlen) {
    b.comment("varlen: rows past the sequence's length leave");
    Reg cuq = e.global_param(offsetof(P, cu_seqlens_q));
    Reg aq = e.index(cuq, bz, 4);
    q0 = b.b32();
    Reg q1 = b.b32();
    total_q = b.b32();
    b.ld(Space::Global, Type::S32, q0, at(aq), true);
    b.ld(Space::Global, Type::S32, q1, at(aq, 4), true);
    b.ld(Space::Global, Type::S32, total_q, at(e.index(cuq, batch, 4)), true);
    // Clamped as the forward clamps it (seq_len): the rows it wrote.
    Reg beyond = e.setp(Cmp::Ge, Type::S32, t, seq_len(e, q0, q1, sq));
    b.when(beyond).exit();
  }

  Reg opart = e.global_param(offsetof(P, o_partial));
  Reg lpart = e.global_param(offsetof(P, lse_partial));
  Reg o = e.global_param(offsetof(P, o));
  Reg lse_raw = e.param(Type::U64, offsetof(P, lse));
  Reg has_lse = e.setp(Cmp::Ne, Type::U64, lse_raw, imm(0));
  Reg lse_out = b.b64();
  b.cvta_to_global(lse_out, lse_raw);
  Reg ops[5], lps[4], os[3];
  for (int i = 0; i < 5; ++i) ops[i] = e.stride_bytes(offsetof(P, o_partial_stride) + 8 * i, 4);
  for (int i = 0; i < 4; ++i) lps[i] = e.stride_bytes(offsetof(P, lse_partial_stride) + 8 * i, 4);
  for (int i = 0; i < 3; ++i)
    os[i] = e.stride_bytes(offsetof(P, o_stride) + 8 * i, elem_bytes(spec.dtype));
  // Split 0 of this row: lse_partial[0][b][h][t], o_partial[0][b][t][h][lane].
  Reg l0 = e.index(e.index(e.index(lpart, bz, lps[1]), h, lps[2]), t, lps[3]);
  Reg o0 = e.index(e.index(e.index(e.index(opart, bz, ops[1]), t, ops[2]), h, ops[3]), lane, 4);
  Reg pdim;
  if (spec.head_dim_v % 32) pdim = e.setp(Cmp::Lt, Type::U32, lane, imm(spec.head_dim_v % 32));

  // Pass 1: m = max_s LSE_s.
  b.comment("m = max_s LSE_s");
  Reg m = e.mov(Type::F32, fimm(kNegInf));
  Reg x = b.f32();
  Reg s = b.b32();
  Reg lp = b.b64(), op = b.b64();
  b.mov(Type::S32, s, imm(0));
  b.mov(Type::U64, lp, l0);
  ptx::Label loop1 = b.label();
  b.bind(loop1);
  b.ld(Space::Global, Type::F32, x, at(lp));
  b.op(Op::Max, Type::F32, m, m, x);
  b.op(Op::Add, Type::S64, lp, lp, lps[0]);
  b.op(Op::Add, Type::S32, s, s, imm(1));
  Reg more = b.pred();
  b.setp(Cmp::Lt, Type::S32, more, s, ns);
  b.when(more).bra(loop1);

  // Attention sinks (spec.sinks, gpt-oss): sinks[h] joins the row's
  // denominator once, as one more state with weight exp(sink) and O = 0,
  // here in the combine (the decode kernels' partial states never hold it).
  // In the input's base: a natural sink times log2 e for base-2 states.
  Reg sink;
  if (spec.sinks) {
    b.comment("m = max(m, sink)");
    Reg sinks = e.global_param(offsetof(P, sinks));
    sink = b.f32();
    b.ld(Space::Global, Type::F32, sink, at(e.index(sinks, h, 4)));
    if (spec.lse_in_base2) b.op(Op::Mul, Type::F32, sink, sink, fimm(kLog2e));
    b.op(Op::Max, Type::F32, m, m, sink);
  }

  // Pass 2: w_s = 2^((LSE_s - m) log2 e), sums of w_s and w_s O_s. With no
  // finite LSE_s the offset is 0 and every w_s is 0. m = +inf (a state or
  // the sink of +inf; the warp's row, so a uniform branch) takes the loop at
  // `inf_row`, where the +inf states weigh 1 each (the sink as a state with O
  // = 0) and the others 0: inf - inf would be NaN. A NaN LSE_s or sink (max
  // skips it) makes its w_s, so sum, NaN.
  b.comment("O = sum_s w_s O_s / sum_s w_s");
  Reg off = tile::merge_offset(e, m).off;
  Reg sum = b.f32();
  std::vector<Reg> acc;
  for (int i = 0; i < nv; ++i) acc.push_back(b.f32());
  Reg w = b.f32(), v = b.f32();
  Reg is_inf = b.pred();
  // w = 2^(l - off) (l a state's LSE in the input's base; -inf - off weighs
  // 0), or on the +inf row 1 where l = +inf; sum += w.
  auto weight = [&](Reg l, bool inf_row) {
    tile::merge_weight(b, w, l, off, spec.lse_in_base2);
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
    b.mov(Type::U64, lp, l0);
    b.mov(Type::U64, op, o0);
    ptx::Label loop2 = b.label();
    b.bind(loop2);
    b.ld(Space::Global, Type::F32, x, at(lp));
    weight(x, inf_row);
    for (int i = 0; i < nv; ++i) {
      if (pdim.valid() && i == nv - 1) b.when(pdim);
      b.ld(Space::Global, Type::F32, v, at(op, 128 * i));
      b.op(Op::Fma, Type::F32, acc[i], w, v, acc[i]);
    }
    b.op(Op::Add, Type::S64, lp, lp, lps[0]);
    b.op(Op::Add, Type::S64, op, op, ops[0]);
    b.op(Op::Add, Type::S32, s, s, imm(1));
    b.setp(Cmp::Lt, Type::S32, more, s, ns);
    b.when(more).bra(loop2);
    if (spec.sinks) weight(sink, inf_row);
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
  if (!spec.lse_in_base2 && !spec.lse_out_base2) {
    lse = e.op(Op::Mul, Type::F32, e.op(Op::Lg2, Type::F32, sum), fimm(kLn2));
    b.op(Op::Add, Type::F32, lse, lse, off);
  } else if (!spec.lse_in_base2) {
    lse = e.op(Op::Lg2, Type::F32, sum);
    b.op(Op::Fma, Type::F32, lse, off, fimm(kLog2e), lse);
  } else {
    lse = e.op(Op::Add, Type::F32, e.op(Op::Lg2, Type::F32, sum), off);
    if (!spec.lse_out_base2) b.op(Op::Mul, Type::F32, lse, lse, fimm(kLn2));
  }
  const int eb = elem_bytes(spec.dtype);  // fp32 O: stored unrounded
  // varlen: packed row q0 + t (< cu[b+1], so no s32 overflow).
  Reg orow =
      spec.varlen
          ? e.index(e.index(e.index(o, e.op(Op::Add, Type::S32, q0, t), os[1]), h, os[2]), lane, eb)
          : e.index(e.index(e.index(e.index(o, bz, os[0]), t, os[1]), h, os[2]), lane, eb);
  Reg hv = eb == 2 ? b.b16() : Reg();
  Type cvt_to = spec.dtype == Dtype::BF16 ? Type::BF16 : Type::F16;
  for (int i = 0; i < nv; ++i) {
    b.op(Op::Mul, Type::F32, acc[i], acc[i], inv);
    if (eb == 2) b.cvt(cvt_to, Type::F32, ptx::Round::Rn, hv, acc[i]);
    if (pdim.valid() && i == nv - 1) b.when(pdim);
    if (eb == 2)
      b.st(Space::Global, Type::B16, at(orow, 64 * i), hv);
    else
      b.st(Space::Global, Type::F32, at(orow, 128 * i), acc[i]);
  }
  Reg lane0 = e.setp(Cmp::Eq, Type::U32, lane, imm(0));
  b.op(Op::And, Type::Pred, lane0, lane0, has_lse);
  // LSE [batch, num_heads_q, seqlen_q]: element (bz * hq + h) * sq + t;
  // varlen [num_heads_q, total_q]: h * total_q + q0 + t, past 2^31 for long
  // packed batches.
  Reg lrow = spec.varlen ? e.wide_mad(h, total_q, e.op(Op::Add, Type::S64, e.s64(q0), e.s64(t)))
                         : e.op(Op::MadLo, Type::S64, e.wide_mad(bz, hq, e.s64(h)), sq64, e.s64(t));
  Reg la = e.index64(lse_out, lrow, 4);
  b.when(lane0).st(Space::Global, Type::F32, at(la), lse);
  b.exit();
  // m = +inf: the +inf states share the weight (LSE = +inf + log(count)).
  b.bind(inf_row);
  pass2(true);
  b.bra(store);
  return std::move(b).emit(ptx_isa_version(spec), spec.sm, static_cast<uint32_t>(32 * W));
}

}  // namespace kgen
}  // namespace fa

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
// One warp per (batch, token, head) row, lane j owns dims j, j+32, ...: the
// row is tile::combine_row, which the decode kernel's fused combine runs too.
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
  const int W = spec.num_warps;
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
  tile::CombineRow c;
  c.lane = lane;
  c.num_states = ns;
  c.l0 = l0;
  c.o0 = o0;
  c.lstep = lps[0];
  c.ostep = ops[0];
  c.head_dim_v = spec.head_dim_v;
  c.dtype = spec.dtype;
  c.lse_in_base2 = spec.lse_in_base2;
  c.lse_out_base2 = spec.lse_out_base2;
  // spec.sinks: sinks[h] joins the row's denominator (tile::combine_row).
  if (spec.sinks)
    c.sink_at = [&] { return e.index(e.global_param(offsetof(P, sinks)), h, 4); };
  const int eb = elem_bytes(spec.dtype);
  // varlen: packed row q0 + t (< cu[b+1], so no s32 overflow).
  c.o_at = [&] {
    return spec.varlen ? e.index(e.index(e.index(o, e.op(Op::Add, Type::S32, q0, t), os[1]), h,
                                         os[2]),
                                 lane, eb)
                       : e.index(e.index(e.index(e.index(o, bz, os[0]), t, os[1]), h, os[2]),
                                 lane, eb);
  };
  // LSE [batch, num_heads_q, seqlen_q]: element (bz * hq + h) * sq + t;
  // varlen [num_heads_q, total_q]: h * total_q + q0 + t, past 2^31 for long
  // packed batches.
  c.lse_at = [&] {
    Reg lrow = spec.varlen
                   ? e.wide_mad(h, total_q, e.op(Op::Add, Type::S64, e.s64(q0), e.s64(t)))
                   : e.op(Op::MadLo, Type::S64, e.wide_mad(bz, hq, e.s64(h)), sq64, e.s64(t));
    return e.index64(lse_out, lrow, 4);
  };
  c.has_lse = has_lse;
  tile::combine_row(e, c, nullptr);
  return std::move(b).emit(ptx_isa_version(spec), spec.sm, static_cast<uint32_t>(32 * W));
}

}  // namespace kgen
}  // namespace fa

// Helpers the kernel generators share (declared in codegen.h): softcap
// scaling, attention sinks, varlen sequence lengths, KV cache rows (paged,
// pointer arrays), fp8 descales, and the forward kernels' row bases and
// outputs. Moved out of the scalar generator (attention.cc), unchanged.
#include <vector>

#include "kernels/codegen.h"

namespace fa {
namespace kgen {

Softcap softcap_consts(Reg softcap_neg2, Reg softcap_log2) {
  Softcap c;
  c.neg2 = softcap_neg2;
  c.cap_log2 = softcap_log2;
  return c;
}

void scale_score(Emitter &e, Reg s, Reg score_scale, const Softcap &cap) {
  ptx::Builder &b = e.b;
  if (!cap.neg2.valid()) {
    b.op(Op::Mul, Type::F32, s, s, score_scale);
    return;
  }
  // x = s score_scale; t = 2^(min(-2 x log2 e, 32)) = e^(-2x), clamped where
  // tanh(x) is -1 in f32 already; tanh(x) = 2 r - 1 with r = 1 / (1 + t), in
  // [-1, 1] for any s (sign included), then times cap_log2. 1 + t lies in
  // [1, 2^32 + 1], where rcp.approx is within 1 ulp (PTX ISA "rcp").
  Reg t = e.op(Op::Min, Type::F32, e.op(Op::Mul, Type::F32, s, cap.neg2), fimm(32.0f));
  b.op(Op::Ex2, Type::F32, t, t);
  b.op(Op::Add, Type::F32, t, t, fimm(1.0f));
  Reg r = e.op(Op::RcpApprox, Type::F32, t);
  b.op(Op::Fma, Type::F32, r, r, fimm(2.0f), fimm(-1.0f));
  b.op(Op::Mul, Type::F32, s, r, cap.cap_log2);
}

Reg sink_log2(Emitter &e, Reg h, size_t params_base) {
  return sink_log2_at(e, h, params_base + offsetof(ForwardParams, sinks));
}

Reg sink_log2_at(Emitter &e, Reg h, size_t sinks_param) {
  Reg sinks = e.global_param(sinks_param);
  Reg v = e.new_reg(Type::F32);
  e.b.ld(Space::Global, Type::F32, v, at(e.index(sinks, h, 4)));
  e.b.op(Op::Mul, Type::F32, v, v, fimm(kLog2e));
  return v;
}

Reg seq_len(Emitter &e, Reg start, Reg end, Reg max_len) {
  Reg d = e.op(Op::Sub, Type::S64, e.s64(end), e.s64(start));
  e.b.op(Op::Max, Type::S64, d, d, imm(0));
  e.b.op(Op::Min, Type::S64, d, d, e.s64(max_len));
  return e.s32(d);
}

Reg KvRows::at(Emitter &e, Reg j) const {
  if (!paged()) return e.index(base, j, row);
  ptx::Builder &b = e.b;
  Reg pi, off;
  page_of(e, j, &pi, &off);
  Reg pg = b.b32();
  b.ld(Space::Global, Type::S32, pg, ptx::at(e.index(table, pi, 4)), true);
  return e.index(e.index(base, pg, page), off, row);
}

void KvRows::page_of(Emitter &e, Reg j, Reg *pi, Reg *off) const {
  // Page entry j / page_size (u32: 0 <= j), token j % page_size within it.
  if (page_shift.valid()) {
    *pi = e.op(Op::Shr, Type::U32, j, page_shift);
    *off = e.op(Op::And, Type::B32, j, page_mask);
    return;
  }
  *pi = e.op(Op::Div, Type::U32, j, page_size);
  *off = e.op(Op::Rem, Type::U32, j, page_size);
}

void kv_rows(Emitter &e, const KernelSpec &spec, size_t params_kv, Reg k, Reg v, const Reg ks[3],
             const Reg vs[3], Reg bz, Reg kvh, KvRows *kr, KvRows *vr) {
  ptx::Builder &b = e.b;
  kr->layout = vr->layout = spec.kv_layout;
  kr->row = ks[1];
  vr->row = vs[1];
  switch (spec.kv_layout) {
    case KvLayout::Contiguous:
      kr->base = e.index(e.index(k, bz, ks[0]), kvh, ks[2]);
      vr->base = e.index(e.index(v, bz, vs[0]), kvh, vs[2]);
      break;
    case KvLayout::PtrArray: {
      // Sequence b's keys at k_ptrs[b], values at v_ptrs[b].
      Reg kp = e.global_param(params_kv + offsetof(KvPages, k_ptrs));
      Reg vp = e.global_param(params_kv + offsetof(KvPages, v_ptrs));
      Reg kb = b.b64(), vb = b.b64();
      b.ld(Space::Global, Type::U64, kb, at(e.index(kp, bz, 8)), true);
      b.ld(Space::Global, Type::U64, vb, at(e.index(vp, bz, 8)), true);
      Reg kg = b.b64(), vg = b.b64();
      b.cvta_to_global(kg, kb);
      b.cvta_to_global(vg, vb);
      kr->base = e.index(kg, kvh, ks[2]);
      vr->base = e.index(vg, kvh, vs[2]);
      break;
    }
    case KvLayout::Paged: {
      kr->base = e.index(k, kvh, ks[2]);
      vr->base = e.index(v, kvh, vs[2]);
      kr->page = ks[0];
      vr->page = vs[0];
      Reg bt = e.global_param(params_kv + offsetof(KvPages, block_table));
      Reg bts = e.stride_bytes(params_kv + offsetof(KvPages, block_table_stride), 4);
      kr->table = vr->table = e.index(bt, bz, bts);
      kr->page_size = vr->page_size = e.param(Type::S32, params_kv + offsetof(KvPages, page_size));
      if (spec.page_pow2) {
        kr->page_shift = vr->page_shift =
            e.param(Type::U32, params_kv + offsetof(KvPages, page_shift));
        kr->page_mask = vr->page_mask = e.op(Op::Sub, Type::S32, kr->page_size, imm(1));
      }
      break;
    }
  }
}

Reg load_descale(Emitter &e, size_t ptr_param, size_t stride_param, Reg bz, Reg kvh) {
  ptx::Builder &b = e.b;
  Reg raw = e.param(Type::U64, ptr_param);
  Reg set = e.setp(Cmp::Ne, Type::U64, raw, imm(0));
  Reg p = b.b64();
  b.cvta_to_global(p, raw);
  Reg i = e.op(Op::MulLo, Type::S64, e.s64(bz), e.param(Type::S64, stride_param));
  b.op(Op::MadLo, Type::S64, i, e.s64(kvh), e.param(Type::S64, stride_param + 8), i);
  Reg a = e.index64(p, i, 4);
  Reg d = e.mov(Type::F32, fimm(1.0f));
  b.when(set).ld(Space::Global, Type::F32, d, at(a), true);
  return d;
}

Reg fp8_descale(Emitter &e, const KernelSpec &spec, size_t member, Reg bz, Reg kvh) {
  const size_t d = fp8_descales_offset(spec);
  return load_descale(e, d + member, d + offsetof(Fp8Descales, descale_stride), bz, kvh);
}

void fp8_scale_scores(Emitter &e, const KernelSpec &spec, Reg bz, Reg kvh, Reg scale) {
  Reg qk = e.op(Op::Mul, Type::F32, fp8_descale(e, spec, offsetof(Fp8Descales, q_descale), bz, kvh),
                fp8_descale(e, spec, offsetof(Fp8Descales, k_descale), bz, kvh));
  e.b.op(Op::Mul, Type::F32, scale, scale, qk);
}

ForwardBases forward_bases(Emitter &e, const KernelSpec &spec, Reg q, Reg k, Reg v, Reg bz, Reg h,
                           Reg kvh, Reg m0, const ptx::Label *past) {
  using P = ForwardParams;
  ptx::Builder &b = e.b;
  Reg qs[3], ks[3], vs[3];
  // fp8 Q, K, V (the fp8 forward): one byte per element.
  const int qb = spec.q_fp8 != KvFp8::None ? 1 : elem_bytes(spec.dtype);
  const int kvb = spec.kv_fp8 != KvFp8::None ? 1 : elem_bytes(spec.dtype);
  for (int i = 0; i < 3; ++i) {
    qs[i] = e.stride_bytes(offsetof(P, q_stride) + 8 * i, qb);
    ks[i] = e.stride_bytes(offsetof(P, k_stride) + 8 * i, kvb);
    vs[i] = e.stride_bytes(offsetof(P, v_stride) + 8 * i, kvb);
  }
  ForwardBases fb;
  fb.q_row = qs[1];
  fb.k_row = ks[1];
  fb.v_row = vs[1];
  Reg sk_max = e.param(Type::S32, offsetof(P, seqlen_k));
  // Keys from cu_seqlens_k only for a contiguous K/V without seqused_k
  // (the API allows cu_seqlens_k nowhere else).
  const bool cu_k = spec.varlen && spec.kv_layout == KvLayout::Contiguous && !spec.seqused_k;
  if (spec.varlen) {
    // Sequence b spans rows cu[b] .. cu[b+1]-1 of dim 1.
    Reg cuq = e.global_param(offsetof(P, cu_seqlens_q));
    Reg aq = e.index(cuq, bz, 4);
    Reg q0 = b.b32(), q1 = b.b32();
    b.ld(Space::Global, Type::S32, q0, at(aq), true);
    b.ld(Space::Global, Type::S32, q1, at(aq, 4), true);
    // cu_seqlens live on the device and cannot be validated on the host: each
    // length is formed in 64 bits and clamped to [0, the launch's maximum],
    // so a bad value truncates a sequence instead of overflowing an index.
    fb.sq = seq_len(e, q0, q1, e.param(Type::S32, offsetof(P, seqlen_q)));
    fb.q_bh = e.index(e.index(q, q0, qs[1]), h, qs[2]);
    if (cu_k) {
      Reg cuk = e.global_param(offsetof(P, cu_seqlens_k));
      Reg ak = e.index(cuk, bz, 4);
      Reg k0 = b.b32(), k1 = b.b32();
      b.ld(Space::Global, Type::S32, k0, at(ak), true);
      b.ld(Space::Global, Type::S32, k1, at(ak, 4), true);
      fb.sk = seq_len(e, k0, k1, sk_max);
      // Packed keys: sequence b's row 0 is row k0 of "batch" 0.
      fb.kr.layout = fb.vr.layout = KvLayout::Contiguous;
      fb.kr.row = ks[1];
      fb.vr.row = vs[1];
      fb.kr.base = e.index(e.index(k, k0, ks[1]), kvh, ks[2]);
      fb.vr.base = e.index(e.index(v, k0, vs[1]), kvh, vs[2]);
    }
    // The whole CTA leaves before any barrier when its m-block is past the
    // sequence (a persistent kernel's roles skip the work item).
    Reg beyond = e.setp(Cmp::Ge, Type::S32, m0, fb.sq);
    if (past)
      b.when(beyond).bra(*past);
    else
      b.when(beyond).exit();
  } else {
    fb.sq = e.param(Type::S32, offsetof(P, seqlen_q));
    fb.q_bh = e.index(e.index(q, bz, qs[0]), h, qs[2]);
  }
  if (!cu_k) {
    kv_rows(e, spec, offsetof(P, kv), k, v, ks, vs, bz, kvh, &fb.kr, &fb.vr);
    if (spec.seqused_k) {
      // Device data like cu_seqlens: clamped to [0, seqlen_k].
      Reg su = e.global_param(offsetof(P, seqused_k));
      Reg n = b.b32();
      b.ld(Space::Global, Type::S32, n, at(e.index(su, bz, 4)), true);
      fb.sk = e.op(Op::Max, Type::S32, e.op(Op::Min, Type::S32, n, sk_max), imm(0));
    } else {
      fb.sk = sk_max;
    }
  }
  fb.k_bh = fb.kr.base;
  fb.v_bh = fb.vr.base;
  return fb;
}

Reg decode_seqlen(Emitter &e, const KernelSpec &spec, Reg bz, Reg seqlens) {
  if (spec.fixed_len) return e.param(Type::S32, offsetof(DecodeParams, seqlen_k_max));
  Reg sk = e.b.b32();
  e.b.ld(Space::Global, Type::S32, sk, at(e.index(seqlens, bz, 4)), true);
  return sk;
}

WarpgroupFrame warpgroup_frame(Emitter &e) {
  e.b.set_arch_specific(true);
  e.b.set_min_ctas_per_sm(1);  // the register cap setmaxnreg redistributes
  WarpgroupFrame f;
  f.tid = e.mov(Type::U32, ptx::sreg(ptx::Special::TidX));
  f.warp = e.op(Op::Shr, Type::U32, f.tid, imm(5));
  f.smem = e.mov(Type::U32, ptx::sym(e.b.extern_shared("smem", 1024)));
  return f;
}

std::string warpgroup_roles(Emitter &e, const KernelSpec &spec, Reg warp,
                            const std::function<void()> &producer,
                            const std::function<void()> &consumers) {
  ptx::Builder &b = e.b;
  ptx::Label consumer = b.label(), done = b.label();
  b.when(e.setp(Cmp::Ge, Type::U32, warp, imm(4))).bra(consumer);
  producer();
  b.bra(done);
  b.bind(consumer);
  consumers();
  b.bind(done);
  b.exit();
  return std::move(b).emit(ptx_isa_version(spec), spec.sm, 384);
}

Reg forward_m_blocks(Emitter &e, const KernelSpec &spec) {
  Reg sq = e.param(Type::S32, offsetof(ForwardParams, seqlen_q));
  return e.op(Op::Div, Type::U32, e.op(Op::Add, Type::U32, sq, imm(spec.block_m - 1)),
              imm(spec.block_m));
}

Reg forward_split_index(Emitter &e, const KernelSpec &spec) {
  Reg per_split = forward_m_blocks(e, spec);
  if (spec.dv_split > 1) e.b.op(Op::MulLo, Type::U32, per_split, per_split, imm(spec.dv_split));
  return e.op(Op::Div, Type::U32, e.mov(Type::U32, ptx::sreg(ptx::Special::CtaidX)), per_split);
}

// spec.split_kv's forward_out: the partial state's rows (codegen.h).
static ForwardOut partial_out(Emitter &e, const KernelSpec &spec, Reg bz, Reg h, Reg seqlen_q) {
  const size_t t = forward_tail_offset(spec);
  ForwardOut out;
  // varlen: sequences padded to the launch's seqlen_q rows (the host cannot
  // read cu_seqlens to pack them), not this sequence's length.
  if (spec.varlen) seqlen_q = e.param(Type::S32, offsetof(ForwardParams, seqlen_q));
  Reg opart = e.global_param(t + offsetof(ForwardTail, o_partial));
  Reg lpart = e.global_param(t + offsetof(ForwardTail, lse_partial));
  Reg batch = e.param(Type::S32, offsetof(ForwardParams, batch));
  Reg hq = e.s64(e.param(Type::S32, offsetof(ForwardParams, num_heads_q)));
  Reg sb = e.wide_mad(forward_split_index(e, spec), batch, e.s64(bz));  // split batch + b
  Reg o_row0 = e.op(Op::MulLo, Type::S64, sb, e.s64(seqlen_q));
  e.b.op(Op::MadLo, Type::S64, o_row0, o_row0, hq, e.s64(h));
  out.o_bh = e.index64(opart, o_row0, spec.head_dim_v * 4);
  out.o_row = e.op(Op::MulLo, Type::S64, hq, imm(spec.head_dim_v * 4));
  Reg sbh = e.op(Op::MadLo, Type::S64, sb, hq, e.s64(h));
  out.lse_row0 = e.index64(lpart, e.op(Op::MulLo, Type::S64, sbh, e.s64(seqlen_q)), 4);
  out.has_lse = e.setp(Cmp::Ne, Type::U64, opart, imm(0));  // always (a launch's pointers)
  return out;
}

ForwardOut forward_out(Emitter &e, const KernelSpec &spec, Reg bz, Reg h, Reg seqlen_q) {
  using P = ForwardParams;
  if (spec.split_kv) return partial_out(e, spec, bz, h, seqlen_q);
  ptx::Builder &b = e.b;
  ForwardOut out;
  Reg o = e.global_param(offsetof(P, o));
  Reg os[3];
  for (int i = 0; i < 3; ++i)
    os[i] = e.stride_bytes(offsetof(P, o_stride) + 8 * i, elem_bytes(spec.dtype));
  out.o_row = os[1];
  Reg lse_raw = e.param(Type::U64, offsetof(P, lse));
  out.has_lse = e.setp(Cmp::Ne, Type::U64, lse_raw, imm(0));
  Reg lse = b.b64();
  b.cvta_to_global(lse, lse_raw);
  Reg hq = e.param(Type::S32, offsetof(P, num_heads_q));
  if (spec.varlen) {
    Reg cuq = e.global_param(offsetof(P, cu_seqlens_q));
    Reg q0 = b.b32(), total = b.b32();
    b.ld(Space::Global, Type::S32, q0, at(e.index(cuq, bz, 4)), true);
    out.o_bh = e.index(e.index(o, q0, os[1]), h, os[2]);
    // LSE [num_heads_q, total_q], total_q = cu_q[batch]: element
    // h * total_q + q0, which passes 2^31 for long packed batches.
    Reg batch = e.param(Type::S32, offsetof(P, batch));
    b.ld(Space::Global, Type::S32, total, at(e.index(cuq, batch, 4)), true);
    out.lse_row0 = e.index64(lse, e.wide_mad(h, total, e.s64(q0)), 4);
  } else {
    out.o_bh = e.index(e.index(o, bz, os[0]), h, os[2]);
    // LSE [batch, num_heads_q, seqlen_q]: element (bz * hq + h) * seqlen_q.
    Reg bh = e.wide_mad(bz, hq, e.s64(h));
    Reg row = e.op(Op::MulLo, Type::S64, bh, e.s64(seqlen_q));
    out.lse_row0 = e.index64(lse, row, 4);
  }
  return out;
}

}  // namespace kgen
}  // namespace fa

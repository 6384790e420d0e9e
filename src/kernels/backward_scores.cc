// The backward generators' shared per-key-block logic (backward_scores.h).
#include "kernels/backward_scores.h"

#include <cstddef>

#include "kernels/kernels.h"
#include "kernels/tile/row_mask.h"

namespace fa::kgen {

namespace {
Reg shift(Emitter &e, const BackwardDims &d) { return e.op(Op::Sub, Type::S32, d.sk(), d.sq()); }
}  // namespace

BackwardQueryRange backward_query_range(Emitter &e, const BackwardDims &d, Reg n0, int block_n,
                                        int block_m) {
  ptx::Builder &b = e.b;
  Reg sh = shift(e, d);
  Reg n1 = e.op(Op::Min, Type::S32, e.op(Op::Add, Type::S32, n0, imm(block_n)), d.sk());
  Reg lo = e.op(Op::Sub, Type::S64, e.s64(n0), e.s64(sh));
  b.op(Op::Sub, Type::S64, lo, lo, e.s64(d.wr()));
  b.op(Op::Max, Type::S64, lo, lo, imm(0));
  Reg hi = e.op(Op::Sub, Type::S64, e.s64(n1), e.s64(sh));
  b.op(Op::Add, Type::S64, hi, hi, e.s64(d.wl()));
  b.op(Op::Min, Type::S64, hi, hi, e.s64(d.sq()));
  b.op(Op::Max, Type::S64, hi, hi, imm(0));
  b.op(Op::Min, Type::S64, lo, lo, hi);
  BackwardQueryRange r;
  r.begin = e.s32(lo);
  b.op(Op::Div, Type::S32, r.begin, r.begin, imm(block_m));
  b.op(Op::MulLo, Type::S32, r.begin, r.begin, imm(block_m));
  r.end = e.s32(hi);
  return r;
}

DqSemaphore dq_semaphore(Emitter &e, const BackwardDims &d, const RegFn &sem_base,
                         const RegFn &sq_max, const RegFn &bz, const RegFn &hq, Reg h, Reg m0,
                         Reg slice, Reg n0, int block_n) {
  ptx::Builder &b = e.b;
  // One u32 per kSemRows rows (the smallest block_m; BackwardPre zeroes
  // them, whatever the kernel's block_m) and kSemSlices column slices.
  Reg nqb = e.op(Op::Add, Type::S32, sq_max(), imm(kSemRows - 1));
  b.op(Op::Div, Type::S32, nqb, nqb, imm(kSemRows));
  Reg idx = e.op(Op::MulLo, Type::S64, e.wide_mad(bz(), hq(), e.s64(h)), e.s64(nqb));
  b.op(Op::Add, Type::S64, idx, idx, e.s64(e.op(Op::Div, Type::S32, m0, imm(kSemRows))));
  b.op(Op::MadLo, Type::S64, idx, idx, imm(kSemSlices), e.s64(slice));
  DqSemaphore s;
  s.addr = e.index64(sem_base(), idx, 4);
  Reg first = e.op(Op::Add, Type::S64, e.s64(m0), e.s64(shift(e, d)));
  b.op(Op::Sub, Type::S64, first, first, e.s64(d.wl()));
  b.op(Op::Max, Type::S64, first, first, imm(0));
  // / block_n (a power of two; the value is not negative): a shift, not
  // div.s64's call.
  int lg = 0;
  while ((1 << lg) < block_n) ++lg;
  b.op(Op::Shr, Type::S64, first, first, imm(lg));
  s.before = e.op(Op::Sub, Type::S32, e.op(Op::Div, Type::S32, n0, imm(block_n)), e.s32(first));
  return s;
}

BackwardScores backward_scores(Emitter &e, const KernelSpec &spec, const RegFn &score_scale,
                               const RegFn &bz, Reg h, Reg warp_keys, Reg n0, Reg m0,
                               const tile::Lanes *ln, Reg stats, int lse_off, int d_off) {
  BackwardScores x;
  x.score_scale = score_scale;
  if (spec.alibi)
    x.alibi_coef = [&e, score_scale, bz, h, softcap = spec.softcap] {
      return tile::alibi_coef(e, offsetof(ForwardParams, alibi_slopes), bz(), h,
                              softcap ? Reg() : score_scale());
    };
  x.warp_keys = warp_keys;
  x.n0 = n0;
  x.m0 = m0;
  x.ln = ln;
  x.stats = stats;
  x.lse_off = lse_off;
  x.d_off = d_off;
  return x;
}

void backward_probabilities(Emitter &e, const BackwardDims &d, const BackwardScores &x) {
  ptx::Builder &b = e.b;
  const tile::AccTile &s = *x.s;
  const int nS = s.n();
  const bool softcap = x.cap.cap_log2.valid();
  if (softcap) {
    Reg t16[4];
    if (x.dtanh16)
      for (Reg &r : t16) r = b.f32();
    for (int j = 0; j < nS; ++j)
      for (int i = 0; i < 4; ++i) {
        Reg v = s.f[j][i], t = x.dtanh16 ? t16[i] : x.dtanh->f[j][i];
        scale_score(e, v, x.score_scale(), x.cap);
        // tanh = s / cap_log2; d tanh / dx factor 1 - tanh^2
        b.op(Op::Mul, Type::F32, t, v, x.inv_cap);
        b.op(Op::Fma, Type::F32, t, t, e.op(Op::Neg, Type::F32, t), fimm(1.0f));
        if (x.dtanh16 && i % 2 == 1)
          b.cvt_pack(x.dtype == Dtype::BF16 ? Type::BF16 : Type::F16, (*x.dtanh16)[2 * j + i / 2],
                     t16[i], t16[i - 1]);
      }
  }
  Reg key0 = e.op(Op::MadLo, Type::S32, x.warp_keys, imm(16), x.n0);
  b.op(Op::Add, Type::S32, key0, key0, x.ln->g);
  Reg col0 = e.op(Op::MadLo, Type::S32, x.ln->q, imm(2), x.m0);  // the lane's first query
  Reg p = b.pred(), t = b.pred();
  Reg tf = b.f32();
  // ALiBi's coefficient of (sequence, head), formed per block (held across
  // the loops it spilled at head dim 256).
  Reg alibi_coef = x.alibi_coef ? x.alibi_coef() : Reg();
  for (int h = 0; h < 2; ++h) {
    Reg key = e.op(Op::Add, Type::S32, key0, imm(8 * h));
    if (alibi_coef.valid()) {
      // |i + shift - key| = |dist - (8j + x)| with dist = key - col0 - shift
      Reg dd = e.op(Op::Sub, Type::S32, e.op(Op::Sub, Type::S32, key, col0), shift(e, d));
      Reg df = b.f32();
      b.cvt(Type::F32, Type::S32, ptx::Round::Rn, df, dd);
      tile::alibi_row_half(b, s, h, df, alibi_coef, tf);
    }
    // Key `key` is seen by queries [max(key - shift - wr, 0), min(key -
    // shift + wl + 1, sq)) (tile::row_range with the windows swapped);
    // none past seqlen_k.
    const tile::RowRange r = tile::row_range(e, e.op(Op::Sub, Type::S32, key, shift(e, d)), d.wr(),
                                             d.wl(), imm(0), d.sq());
    Reg lo = e.op(Op::Sub, Type::S32, r.lo, col0), hi = e.op(Op::Sub, Type::S32, r.hi, col0);
    b.selp(Type::S32, hi, imm(0), hi, e.setp(Cmp::Ge, Type::S32, key, d.sk()));
    tile::mask_row_half(b, s, h, lo, hi, p, t);
  }
  // c: score_scale (raw scores), 1 with softcap (already log2).
  Reg lse = e.op(Op::MadLo, Type::U32, x.ln->q, imm(8), x.stats);
  Reg l2[2] = {b.f32(), b.f32()};
  for (int j = 0; j < nS; ++j) {
    b.ld_v(Space::Shared, Type::F32, {l2[0], l2[1]}, at(lse, x.lse_off + 32 * j));
    for (int i = 0; i < 4; ++i) {
      Reg v = s.f[j][i];
      Reg nl = e.op(Op::Neg, Type::F32, l2[i & 1]);
      if (softcap)
        b.op(Op::Add, Type::F32, v, v, nl);
      else
        b.op(Op::Fma, Type::F32, v, v, x.score_scale(), nl);
      b.op(Op::Ex2, Type::F32, v, v);
    }
  }
}

void backward_grad_s(Emitter &e, const BackwardScores &x, const tile::AccTile &dp, bool softcap) {
  ptx::Builder &b = e.b;
  const tile::AccTile &s = *x.s;
  Reg da = e.op(Op::MadLo, Type::U32, x.ln->q, imm(8), x.stats);
  Reg d[2] = {b.f32(), b.f32()};
  Reg t16[2];
  if (softcap && x.dtanh16) t16[0] = b.f32(), t16[1] = b.f32();
  for (int j = 0; j < s.n(); ++j) {
    b.ld_v(Space::Shared, Type::F32, {d[0], d[1]}, at(da, x.d_off + 32 * j));
    for (int i = 0; i < 4; ++i) {
      Reg v = s.f[j][i], y = dp.f[j][i];
      b.op(Op::Sub, Type::F32, y, y, d[i & 1]);
      b.op(Op::Mul, Type::F32, v, v, y);
      if (softcap && x.dtanh16) {
        if (i % 2 == 0) unpack_half2(e, x.dtype, (*x.dtanh16)[2 * j + i / 2], t16[0], t16[1]);
        b.op(Op::Mul, Type::F32, v, v, t16[i % 2]);
      } else if (softcap) {
        b.op(Op::Mul, Type::F32, v, v, x.dtanh->f[j][i]);
      }
    }
  }
}

void backward_store_keys(Emitter &e, Type half, const tile::AccTile &acc, Reg base, Reg row_bytes,
                         Reg key0, Reg col, const RegFn &sk, int cols, Reg scale, Reg w) {
  ptx::Builder &b = e.b;
  for (int h = 0; h < 2; ++h) {
    Reg key = e.op(Op::Add, Type::S32, key0, imm(8 * h));
    Reg in = e.setp(Cmp::Lt, Type::S32, key, sk());
    Reg a = e.index(e.index(base, key, row_bytes), col, 1);
    for (int j = 0; j < acc.n(); ++j) {
      if (8 * j >= cols) break;  // whole 8-column blocks: cols % 8 == 0
      Reg x0 = acc.f[j][2 * h], x1 = acc.f[j][2 * h + 1];
      if (scale.valid()) {
        b.op(Op::Mul, Type::F32, x0, x0, scale);
        b.op(Op::Mul, Type::F32, x1, x1, scale);
      }
      b.cvt_pack(half, w, x1, x0);
      b.when(in).st(Space::Global, Type::B32, at(a, 16 * j), w);
    }
  }
}

void unpack_half2(Emitter &e, Dtype dt, Reg w, Reg lo, Reg hi) {
  ptx::Builder &b = e.b;
  if (dt == Dtype::BF16) {
    b.op(Op::Shl, Type::B32, lo, w, imm(16));
    b.op(Op::And, Type::B32, hi, w, imm(-65536));
    return;
  }
  Reg l16 = b.b16(), h16 = b.b16();
  b.unpack_b32(l16, h16, w);
  b.cvt(Type::F32, Type::F16, ptx::Round::None, lo, l16);
  b.cvt(Type::F32, Type::F16, ptx::Round::None, hi, h16);
}

}  // namespace fa::kgen

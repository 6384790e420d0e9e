// Tile primitives of the mma.sync kernels; layouts in tile.h and
// docs/kernels.md ("Tile primitives").
#include "kernels/tile/tile.h"

#include "kernels/tile/merge.h"

namespace fa::kgen::tile {

Lanes make_lanes(Emitter &e, Reg lane) {
  Lanes l;
  l.lane = lane;
  l.g = e.op(Op::Shr, Type::U32, lane, imm(2));
  l.q = e.op(Op::And, Type::B32, lane, imm(3));
  l.l8 = e.op(Op::And, Type::B32, lane, imm(7));
  l.h1 = e.op(Op::And, Type::B32, e.op(Op::Shr, Type::U32, lane, imm(3)), imm(1));
  l.h2 = e.op(Op::Shr, Type::U32, lane, imm(4));
  return l;
}

Frag4 frag4(ptx::Builder &b) { return {b.b32(), b.b32(), b.b32(), b.b32()}; }

AccTile acc_tile(ptx::Builder &b, int n) {
  AccTile t;
  for (int j = 0; j < n; ++j) t.f.push_back({b.f32(), b.f32(), b.f32(), b.f32()});
  return t;
}

void zero(ptx::Builder &b, const AccTile &t) {
  for (const Frag4 &f : t.f)
    for (Reg r : f) b.mov(Type::F32, r, fimm(0.0f));
}

void mma(ptx::Builder &b, Type half, const AccTile &d, int j, const Frag4 &a, const Reg *b2,
         const Frag4 *c) {
  b.mma_m16n8k16(half, d.f[j].data(), a.data(), b2, c ? c->data() : d.f[j].data());
}

void mma_fp8(ptx::Builder &b, ptx::Fp8 ta, ptx::Fp8 tb, const AccTile &d, int j, const Frag4 &a,
             const Reg *b2, const Frag4 *c) {
  b.mma_m16n8k32_f8(ta, tb, d.f[j].data(), a.data(), b2, c ? c->data() : d.f[j].data());
}

Exp2Poly3::Exp2Poly3(Emitter &e) : e_(e) {
  // Remez minimax of 2^f / relative error on [-0.5, 0.5], f32 coefficients.
  constexpr float kC[4] = {0.99992806f, 0.69326097f, 0.24261113f, 0.05517167f};
  // 1.5 x 2^23 + 127: x + it rounds x to an integer j and leaves j + 127
  // (the biased exponent of 2^j) in the sum's low mantissa bits.
  constexpr float kRound = 12582912.0f + 127.0f;
  auto pair = [&](float v) {
    Reg f = e.mov(Type::F32, fimm(v));
    Reg d = e.b.b64();
    e.b.pack_f32x2(d, f, f);
    return d;
  };
  round_ = pair(kRound);
  for (int i = 0; i < 4; ++i) c_[i] = pair(kC[i]);
}

void Exp2Poly3::operator()(Reg d0, Reg d1, Reg x0, Reg x1) const {
  ptx::Builder &b = e_.b;
  Reg x = b.b64(), t = b.b64(), f = b.b64(), p = b.b64();
  b.pack_f32x2(x, e_.op(Op::Max, Type::F32, x0, fimm(-127.0f)),
               e_.op(Op::Max, Type::F32, x1, fimm(-127.0f)));
  b.f32x2(Op::Add, t, x, round_);
  b.f32x2(Op::Sub, f, t, round_);
  b.f32x2(Op::Sub, f, x, f);
  b.f32x2(Op::Fma, p, f, c_[3], c_[2]);
  b.f32x2(Op::Fma, p, p, f, c_[1]);
  b.f32x2(Op::Fma, p, p, f, c_[0]);
  // 2^j as f32 (its exponent field j + 127; 0 at j = -127: +0), times p.
  Reg t0 = b.f32(), t1 = b.f32(), s = b.b64();
  b.unpack_f32x2(t0, t1, t);
  Reg s0 = b.f32(), s1 = b.f32();
  b.op(Op::Shl, Type::B32, s0, t0, imm(23));
  b.op(Op::Shl, Type::B32, s1, t1, imm(23));
  b.pack_f32x2(s, s0, s1);
  b.f32x2(Op::Mul, p, p, s);
  b.unpack_f32x2(d0, d1, p);
}

void pack_a(ptx::Builder &b, Type half, const AccTile &t, int j, const Frag4 &a) {
  // a0 = row g, columns 2q, 2q+1 of block j; a1 = row g+8; a2, a3 the same
  // of block j + 1 (the higher column lands in the upper 16 bits).
  b.cvt_pack(half, a[0], t.f[j][1], t.f[j][0]);
  b.cvt_pack(half, a[1], t.f[j][3], t.f[j][2]);
  b.cvt_pack(half, a[2], t.f[j + 1][1], t.f[j + 1][0]);
  b.cvt_pack(half, a[3], t.f[j + 1][3], t.f[j + 1][2]);
}

void pack_a_fp8(ptx::Builder &b, const AccTile &t, int j, const Frag4 &a, int regs) {
  // Register r: row g + 8 (r % 2), keys of blocks j + 2 (r / 2) and the next
  // (two each: 2q, 2q + 1), lowest byte first.
  for (int r = 0; r < regs; ++r) {
    const Frag4 &lo = t.f[j + 2 * (r / 2)], &hi = t.f[j + 2 * (r / 2) + 1];
    const int e = 2 * (r % 2);
    Reg h0 = b.b16(), h1 = b.b16();
    b.cvt_f8x2_f32(false, h0, lo[e + 1], lo[e]);
    b.cvt_f8x2_f32(false, h1, hi[e + 1], hi[e]);
    b.pack_b32(a[r], h0, h1);
  }
}

void v_frags_fp8(ptx::Builder &b, const Frag4 &r, Reg even[2], Reg odd[2], int halves) {
  // r[i] of lane (g, q): bytes 2g, 2g + 1 of key 8i + 2q, then of key
  // 8i + 2q + 1. Register h of a B fragment: the column's bytes of keys
  // 16h + {2q, 2q + 1, 8 + 2q, 9 + 2q}, from r[2h] and r[2h + 1].
  for (int h = 0; h < halves; ++h) {
    b.op(Op::Prmt, Type::B32, even[h], r[2 * h], r[2 * h + 1], imm(0x6420));
    b.op(Op::Prmt, Type::B32, odd[h], r[2 * h], r[2 * h + 1], imm(0x7531));
  }
}

SmemTile smem_tile(uint32_t offset, int rows, int cols) {
  SmemTile t;
  t.offset = offset;
  t.rows = rows;
  t.cols = cols;
  t.cols_pad = (cols + 15) / 16 * 16;
  t.pitch = 2 * t.cols_pad + 16;
  return t;
}

Reg ldsm_base(Emitter &e, const Lanes &l, const SmemTile &t, Role role, Reg smem_base, Reg row0) {
  ptx::Builder &b = e.b;
  if (role == Role::B_KN_T8) {  // row = lane, chunk 0
    Reg a =
        e.op(Op::MadLo, Type::U32, row0.valid() ? e.op(Op::Add, Type::U32, l.lane, row0) : l.lane,
             imm(t.pitch), smem_base);
    if (t.offset) b.op(Op::Add, Type::U32, a, a, imm(t.offset));
    return a;
  }
  const bool nk = role == Role::B_NK || role == Role::A_T;
  const Reg hi_row = nk ? l.h2 : l.h1;
  const Reg chunk = nk ? l.h1 : l.h2;
  Reg row = e.op(Op::MadLo, Type::U32, hi_row, imm(8), l.l8);
  if (row0.valid()) b.op(Op::Add, Type::U32, row, row, row0);
  Reg a = e.op(Op::MadLo, Type::U32, row, imm(t.pitch), smem_base);
  b.op(Op::MadLo, Type::U32, a, chunk, imm(16), a);
  if (t.offset) b.op(Op::Add, Type::U32, a, a, imm(t.offset));
  return a;
}

void ldsm(ptx::Builder &b, Role role, const Frag4 &d, Reg base, int offset, int n) {
  b.ldmatrix(role == Role::B_KN_T || role == Role::B_KN_T8 || role == Role::A_T, d.data(), n,
             at(base, offset));
}

// ---------------------------------------------------------------- copies ---

namespace {
// Threads per row of a copy plan: the largest power of two dividing the
// row's 16-byte chunks (and the thread count).
int lanes_per_row(int threads, int chunks) {
  int l = 1;
  while (chunks % (2 * l) == 0 && threads % (2 * l) == 0) l *= 2;
  return l;
}
}  // namespace

int CopyPlan::round_rows(int threads, const SmemTile &dst) {
  return threads / lanes_per_row(threads, dst.cols_pad / 8);
}

CopyPlan::CopyPlan(Emitter &e, Reg tid, int threads, const SmemTile &dst, Reg smem_base, Reg stride,
                   const CopyPlan *share, Reg round_bytes, bool src_f32, int src_fp8)
    : e_(&e),
      dst_(dst),
      threads_(threads),
      tid_(tid),
      smem_(smem_base),
      stride_(stride),
      f32_(src_f32 || src_fp8 != 0),
      fp8_(src_fp8),
      src_chunk_(src_f32   ? 32
                 : src_fp8 ? 8
                           : 16) {
  ptx::Builder &b = e.b;
  const int C = dst.cols_pad / 8, valid = dst.cols / 8;
  L_ = lanes_per_row(threads, C);
  J_ = C / L_;
  step_ = threads / L_;
  rounds_ = (dst.rows + step_ - 1) / step_;
  pad_ = C - valid;
  ga_ = b.b64();
  src_ = b.b64();
  size_ = b.b32();
  ok_ = b.pred();
  rl_ = b.b32();
  if (f32_) {
    if (fp8_) {
      for (Reg &r : y_) r = b.b32();
      for (Reg &r : h_) r = b.b16();
    } else {
      for (Reg &r : x_) r = b.f32();
    }
    for (Reg &r : w_) r = b.b32();
    lp_ = b.pred();
  }
  const bool shared = share && share->L_ == L_ && share->J_ == J_ && share->pad_ == pad_ &&
                      share->f32_ == f32_ && share->fp8_ == fp8_ && share->threads_ == threads &&
                      share->dst_.rows == dst.rows && share->dst_.pitch == dst.pitch;
  Reg col = e.op(Op::And, Type::B32, tid, imm(L_ - 1));  // first chunk; then + L, + 2L, ...
  if (shared) {
    row0_ = share->row0_;
    saddr0_ = share->saddr0_;
    // share->saddr0_ addresses tile offset share->dst_.offset - share->delta_.
    delta_ = static_cast<int>(dst.offset) - static_cast<int>(share->dst_.offset) + share->delta_;
  } else {
    row0_ = e.op(Op::Shr, Type::U32, tid, imm(__builtin_ctz(static_cast<unsigned>(L_))));
    saddr0_ = e.op(Op::MadLo, Type::U32, row0_, imm(dst.pitch), smem_base);
    b.op(Op::MadLo, Type::U32, saddr0_, col, imm(16), saddr0_);
    if (dst.offset) b.op(Op::Add, Type::U32, saddr0_, saddr0_, imm(dst.offset));
  }
  goff0_ = e.op(Op::MulLo, Type::S64, e.s64(row0_), stride);
  Reg cb = b.b64();
  b.mul_wide(Type::U32, cb, col, imm(src_chunk_));
  b.op(Op::Add, Type::S64, goff0_, goff0_, cb);
  step_bytes_ = round_bytes.valid() ? round_bytes : e.op(Op::MulLo, Type::S64, stride, imm(step_));
  if (shared) {
    last_ok_ = share->last_ok_;
    rows_ok_ = share->rows_ok_;
    return;
  }
  // Only the last chunk of a row can be padding (pad < 2 <= L when any).
  if (pad_ > 0) last_ok_ = e.setp(Cmp::Lt, Type::U32, col, imm(valid - L_ * (J_ - 1)));
  // A last round that covers only part of the tile.
  if (rounds_ * step_ > dst.rows)
    rows_ok_ = e.setp(Cmp::Lt, Type::U32, row0_, imm(dst.rows - (rounds_ - 1) * step_));
}

// Guard of chunk j of round k: the row exists and the chunk is not padding.
Reg CopyPlan::guard(int k, int j) const {
  const bool last_round = k == rounds_ - 1 && rows_ok_.valid();
  const bool last_chunk = j == J_ - 1 && last_ok_.valid();
  if (last_round && last_chunk) {
    Reg g = e_->b.pred();
    e_->b.op(Op::And, Type::Pred, g, rows_ok_, last_ok_);
    return g;
  }
  if (last_round) return rows_ok_;
  if (last_chunk) return last_ok_;
  return Reg();
}

Reg CopyPlan::thread_index() const {
  Reg tid = e_->mov(Type::U32, ptx::sreg(ptx::Special::TidX));
  if (threads_ == 32) e_->b.op(Op::And, Type::B32, tid, tid, imm(31));  // a warp's own plan
  return tid;
}

void CopyPlan::f32_rows(int k, int j, Reg ga, bool rows_checked) const {
  Reg g = guard(k, j), lp = g;
  if (rows_checked) {
    lp = ok_;
    if (g.valid()) {
      e_->b.op(Op::And, Type::Pred, lp_, ok_, g);
      lp = lp_;
    }
  }
  f32_chunk(ga, src_chunk_ * L_ * j, soff(k, j), lp, g, rows_checked);
  // A warp's own plan copies many chunks per lane (a 16-row tile): a
  // bar.warp.sync after every kF32Batch of them keeps the assembler from
  // hoisting all the loads at once (which spilled at head dims >= 216).
  const int idx = k * J_ + j;
  if (threads_ == 32 && idx % kF32Batch == kF32Batch - 1 && idx + 1 < rounds_ * J_)
    e_->b.bar_warp_sync(0xffffffffu);
}

void CopyPlan::f32_chunk(Reg ga, int goff, int soff, Reg lp, Reg g, bool zero) const {
  ptx::Builder &b = e_->b;
  if (fp8_) {  // 8 fp8 bytes -> 8 f16 (exact)
    if (zero)
      for (Reg y : y_) b.mov(Type::B32, y, imm(0));
    if (lp.valid()) b.when(lp);
    b.ld_v(Space::Global, Type::B32, {y_[0], y_[1]}, at(ga, goff));
    for (int i = 0; i < 2; ++i) {
      b.unpack_b32(h_[0], h_[1], y_[i]);
      b.cvt_f16x2_f8x2(fp8_ == 2, w_[2 * i], h_[0]);
      b.cvt_f16x2_f8x2(fp8_ == 2, w_[2 * i + 1], h_[1]);
    }
    if (g.valid()) b.when(g);
    b.st_v(Space::Shared, Type::B32, at(saddr0_, soff), {w_[0], w_[1], w_[2], w_[3]});
    return;
  }
  if (zero)
    for (Reg x : x_) b.mov(Type::F32, x, fimm(0.0f));  // a row past the end reads as zeros
  for (int h = 0; h < 2; ++h) {
    if (lp.valid()) b.when(lp);
    b.ld_v(Space::Global, Type::F32, {x_[4 * h], x_[4 * h + 1], x_[4 * h + 2], x_[4 * h + 3]},
           at(ga, goff + 16 * h));
  }
  for (int i = 0; i < 4; ++i) b.cvt_pack(Type::BF16, w_[i], x_[2 * i + 1], x_[2 * i]);
  if (g.valid()) b.when(g);
  b.st_v(Space::Shared, Type::B32, at(saddr0_, soff), {w_[0], w_[1], w_[2], w_[3]});
}

void CopyPlan::interior(Reg tp) const {
  ptx::Builder &b = e_->b;
  b.mov(Type::B64, ga_, tp);
  for (int k = 0; k < rounds_; ++k) {
    if (k > 0) b.op(Op::Add, Type::S64, ga_, ga_, step_bytes_);
    for (int j = 0; j < J_; ++j) {
      Reg g = guard(k, j);
      if (f32_) {
        f32_rows(k, j, ga_, false);
        continue;
      }
      if (g.valid()) b.when(g);
      b.cp_async_cg16(at(saddr0_, soff(k, j)), at(ga_, 16 * L_ * j));
    }
  }
}

void CopyPlan::boundary(Reg tp, Reg rows_left, Reg safe) const {
  ptx::Builder &b = e_->b;
  // The thread's first row, re-derived from %tid.x: the boundary path runs
  // on few tiles, so its row need not stay live across a loop.
  Reg tid = thread_index();
  Reg row0 = e_->op(Op::Shr, Type::U32, tid, imm(__builtin_ctz(static_cast<unsigned>(L_))));
  b.op(Op::Sub, Type::S32, rl_, rows_left, row0);
  b.mov(Type::B64, ga_, tp);
  for (int k = 0; k < rounds_; ++k) {
    if (k > 0) b.op(Op::Add, Type::S64, ga_, ga_, step_bytes_);
    b.setp(Cmp::Gt, Type::S32, ok_, rl_, imm(k * step_));
    if (f32_) {
      for (int j = 0; j < J_; ++j) f32_rows(k, j, ga_, true);
      continue;
    }
    b.selp(Type::B64, src_, ga_, safe, ok_);
    b.selp(Type::B32, size_, imm(16), imm(0), ok_);
    for (int j = 0; j < J_; ++j) {
      Reg g = guard(k, j);
      if (g.valid()) b.when(g);
      // A zero-filled chunk reads nothing from `safe`, so its offset is moot.
      b.cp_async_cg16(at(saddr0_, soff(k, j)), at(src_, 16 * L_ * j), size_);
    }
  }
}

void CopyPlan::gather(const std::function<Reg(Reg)> &row_addr, Reg rows_left, Reg safe) const {
  ptx::Builder &b = e_->b;
  Reg tid = thread_index();
  Reg row0 = e_->op(Op::Shr, Type::U32, tid, imm(__builtin_ctz(static_cast<unsigned>(L_))));
  Reg coff = b.b64();
  b.mul_wide(Type::U32, coff, e_->op(Op::And, Type::B32, tid, imm(L_ - 1)), imm(src_chunk_));
  for (int k = 0; k < rounds_; ++k) {
    Reg r = k ? e_->op(Op::Add, Type::S32, row0, imm(k * step_)) : row0;
    b.op(Op::Add, Type::S64, ga_, row_addr(r), coff);
    if (f32_) {
      if (rows_left.valid()) b.setp(Cmp::Lt, Type::S32, ok_, r, rows_left);
      for (int j = 0; j < J_; ++j) f32_rows(k, j, ga_, rows_left.valid());
      continue;
    }
    Reg size;
    if (rows_left.valid()) {
      b.setp(Cmp::Lt, Type::S32, ok_, r, rows_left);
      b.selp(Type::B64, ga_, ga_, safe, ok_);
      b.selp(Type::B32, size_, imm(16), imm(0), ok_);
      size = size_;
    }
    for (int j = 0; j < J_; ++j) {
      Reg g = guard(k, j);
      if (g.valid()) b.when(g);
      if (size.valid())
        b.cp_async_cg16(at(saddr0_, soff(k, j)), at(ga_, 16 * L_ * j), size);
      else
        b.cp_async_cg16(at(saddr0_, soff(k, j)), at(ga_, 16 * L_ * j));
    }
  }
}

void CopyPlan::zero_padding() const {
  ptx::Builder &b = e_->b;
  const int pad = pad_, valid_ = dst_.cols / 8;
  if (pad == 0) return;
  const int total = dst_.rows * pad;
  Reg z = e_->mov(Type::B32, imm(0));
  for (int k = 0; k * threads_ < total; ++k) {
    Reg idx = k ? e_->op(Op::Add, Type::U32, tid_, imm(k * threads_)) : tid_;
    Reg row = e_->op(Op::Div, Type::U32, idx, imm(pad));
    Reg pc = e_->op(Op::Rem, Type::U32, idx, imm(pad));
    Reg a = e_->op(Op::MadLo, Type::U32, row, imm(dst_.pitch), smem_);
    b.op(Op::MadLo, Type::U32, a, pc, imm(16), a);
    Reg in;
    if ((k + 1) * threads_ > total) in = e_->setp(Cmp::Lt, Type::U32, idx, imm(total));
    if (in.valid()) b.when(in);
    b.st_v(Space::Shared, Type::B32, at(a, static_cast<int>(dst_.offset) + 16 * valid_),
           {z, z, z, z});
  }
}

// ------------------------------------------------------------ fp8 tiles --

SmemTile byte_tile(uint32_t offset, int rows, int bytes) {
  SmemTile t;
  t.offset = offset;
  t.rows = rows;
  t.cols = t.cols_pad = bytes / 2;
  t.pitch = bytes / 16 % 2 ? bytes : bytes + 16;  // an odd count of 16-byte chunks
  return t;
}

void kperm_rows(Emitter &e, Reg tid, int threads, const SmemTile &t, Reg smem_base) {
  ptx::Builder &b = e.b;
  const int per_row = t.cols_pad / 16, total = t.rows * per_row;
  Reg w[8];
  for (Reg &r : w) r = b.b32();
  for (int i = 0; i * threads < total; ++i) {
    Reg c = e.op(Op::Add, Type::U32, tid, imm(i * threads));
    Reg in = (i + 1) * threads > total ? e.setp(Cmp::Lt, Type::U32, c, imm(total)) : Reg();
    Reg a = e.op(Op::MadLo, Type::U32, e.op(Op::Div, Type::U32, c, imm(per_row)), imm(t.pitch),
                 smem_base);
    b.op(Op::MadLo, Type::U32, a, e.op(Op::Rem, Type::U32, c, imm(per_row)), imm(32), a);
    const int o = static_cast<int>(t.offset);
    for (int h = 0; h < 2; ++h) {
      if (in.valid()) b.when(in);
      b.ld_v(Space::Shared, Type::B32, {w[4 * h], w[4 * h + 1], w[4 * h + 2], w[4 * h + 3]},
             at(a, o + 16 * h));
    }
    for (int h = 0; h < 2; ++h) {  // words h, h + 2, h + 4, h + 6
      if (in.valid()) b.when(in);
      b.st_v(Space::Shared, Type::B32, at(a, o + 16 * h), {w[h], w[h + 2], w[h + 4], w[h + 6]});
    }
  }
}

void fp8x8_to_half(ptx::Builder &b, bool e5m2, Type half, const Reg bytes[2], const Reg halves[4],
                   const Reg out[4], Reg lo16, Reg hi16, Reg lo, Reg hi) {
  for (int i = 0; i < 2; ++i) {
    b.unpack_b32(halves[2 * i], halves[2 * i + 1], bytes[i]);
    b.cvt_f16x2_f8x2(e5m2, out[2 * i], halves[2 * i]);  // bytes 4i, 4i+1
    b.cvt_f16x2_f8x2(e5m2, out[2 * i + 1], halves[2 * i + 1]);
  }
  if (half != Type::BF16) return;
  for (int i = 0; i < 4; ++i) {
    b.unpack_b32(lo16, hi16, out[i]);
    b.cvt(Type::F32, Type::F16, ptx::Round::None, lo, lo16);
    b.cvt(Type::F32, Type::F16, ptx::Round::None, hi, hi16);
    b.cvt_pack(Type::BF16, out[i], hi, lo);
  }
}

void b_frag_fp8_nk(ptx::Builder &b, bool e5m2, Reg raw, const Reg b2[2]) {
  Reg lo = b.b16(), hi = b.b16();
  b.unpack_b32(lo, hi, raw);
  b.cvt_f16x2_f8x2(e5m2, b2[0], lo);
  b.cvt_f16x2_f8x2(e5m2, b2[1], hi);
}

void b_frags_fp8_kn(ptx::Builder &b, bool e5m2, Reg lo, Reg hi, const Reg even[2],
                    const Reg odd[2]) {
  // r: bytes (V[2q][2g], V[2q][2g + 1], V[2q + 1][2g], V[2q + 1][2g + 1]);
  // 0x3120 gives (V[2q][2g], V[2q + 1][2g]) low, the 2g + 1 pair high:
  // register x of the B fragment is keys 8x + 2q, 8x + 2q + 1.
  const Reg r[2] = {lo, hi};
  Reg w = b.b32(), e = b.b16(), o = b.b16();
  for (int x = 0; x < 2; ++x) {
    b.op(Op::Prmt, Type::B32, w, r[x], r[x], imm(0x3120));
    b.unpack_b32(e, o, w);
    b.cvt_f16x2_f8x2(e5m2, even[x], e);
    b.cvt_f16x2_f8x2(e5m2, odd[x], o);
  }
}

int acc_col(AccCols order, int j, int i, int q) {
  if (order == AccCols::Natural) return 8 * j + 2 * q + (i & 1);
  return 16 * (j / 2) + 4 * q + 2 * (i & 1) + j % 2;
}

void st_acc_row(ptx::Builder &b, const Lanes &l, const AccTile &t, AccCols order, int h, Reg row,
                int cols) {
  if (order == AccCols::Natural) {
    b.op(Op::MadLo, Type::U32, row, l.q, imm(8), row);
    for (int j = 0; j < t.n() && 8 * j < cols; ++j)
      b.st_v(Space::Shared, Type::F32, at(row, 32 * j), {t.f[j][2 * h], t.f[j][2 * h + 1]});
    return;
  }
  b.op(Op::MadLo, Type::U32, row, l.q, imm(16), row);
  for (int c = 0; 2 * c + 1 < t.n() && 16 * c < cols; ++c) {
    const Frag4 &ev = t.f[2 * c], &od = t.f[2 * c + 1];
    b.st_v(Space::Shared, Type::F32, at(row, 64 * c),
           {ev[2 * h], od[2 * h], ev[2 * h + 1], od[2 * h + 1]});
  }
}

namespace {
// A 16-row tile's per-row power-of-two scales (rows_bf16_to_f16,
// rows_to_e4m3): the lane's rows g, g + 8 (base: their addresses in q),
// the quad's maximum magnitude of each (bits of |x| as f32; u32 order is
// the magnitude order, NaN above infinity), then 2^k (scale) and 2^-k
// (unscale) with k = bias - the maximum's exponent field, less one when
// `top` (e4m3: a maximum past 1.75 2^e would round past 448), clamped to
// [-126, 126].
struct RowScales {
  Reg base[2], scale[2], unscale[2];
  Reg w[4], t, p;  // scratch (b32, b32, pred) for the caller's pass
};
RowScales row_pow2_scales(Emitter &e, const Lanes &ln, Type half, const SmemTile &q, Reg smem_base,
                          int bias, bool top) {
  ptx::Builder &b = e.b;
  const int C = q.cols / 8;          // 16-byte chunks (8 values) per row
  const int per_lane = (C + 3) / 4;  // the max pass: quad lane q reads q, q + 4, ...
  RowScales rs;
  for (int h = 0; h < 2; ++h) {
    Reg row = e.op(Op::Add, Type::U32, ln.g, imm(8 * h));
    rs.base[h] = e.op(Op::MadLo, Type::U32, row, imm(q.pitch), smem_base);
    b.op(Op::Add, Type::U32, rs.base[h], rs.base[h], imm(static_cast<int>(q.offset)));
  }
  // bf16: |x| as f32 bits (the value in the high half of a b32). f16: |x|
  // as f16 bits, the maximum converted to f32 (cvt.f32.f16) once.
  Reg(&w)[4] = rs.w;
  Reg &t = rs.t, &p = rs.p;
  for (Reg &x : rs.w) x = b.b32();
  t = b.b32();
  p = b.pred();
  for (int h = 0; h < 2; ++h) {
    Reg m = e.mov(Type::U32, imm(0));
    Reg a = e.op(Op::MadLo, Type::U32, ln.q, imm(16), rs.base[h]);
    for (int i = 0; i < per_lane; ++i) {
      const bool tail = 4 * (i + 1) > C;
      if (tail) b.setp(Cmp::Lt, Type::U32, p, ln.q, imm(C - 4 * i));
      if (tail) b.when(p);
      b.ld_v(Space::Shared, Type::B32, {w[0], w[1], w[2], w[3]}, at(a, 64 * i));
      if (tail)
        for (Reg x : w) b.selp(Type::B32, x, x, imm(0), p);
      for (Reg x : w) {
        if (half == Type::F16) {
          b.op(Op::And, Type::B32, t, x, imm(0x7fff));
          b.op(Op::Max, Type::U32, m, m, t);
          b.op(Op::Shr, Type::U32, t, x, imm(16));
          b.op(Op::And, Type::B32, t, t, imm(0x7fff));
          b.op(Op::Max, Type::U32, m, m, t);
          continue;
        }
        b.op(Op::Shl, Type::B32, t, x, imm(16));
        b.op(Op::And, Type::B32, t, t, imm(0x7fffffff));
        b.op(Op::Max, Type::U32, m, m, t);
        b.op(Op::And, Type::B32, t, x, imm(0x7fff0000));
        b.op(Op::Max, Type::U32, m, m, t);
      }
    }
    for (int off = 1; off < 4; off <<= 1) {
      b.shfl(ptx::Shfl::Bfly, t, m, imm(off), imm(31), 0xffffffffu);
      b.op(Op::Max, Type::U32, m, m, t);
    }
    if (half == Type::F16) {  // the f16 maximum's bits as f32 bits
      Reg lo = b.b16(), hi = b.b16(), f = b.f32();
      b.unpack_b32(lo, hi, m);
      b.cvt(Type::F32, Type::F16, ptx::Round::None, f, lo);
      b.mov(Type::B32, m, f);
    }
    Reg kexp = e.op(Op::Shr, Type::U32, m, imm(23));
    b.op(Op::Sub, Type::S32, kexp, imm(bias), kexp);
    if (top) {  // mantissa past 1.75: one binade lower
      b.op(Op::And, Type::B32, t, m, imm(0x7fffff));
      b.setp(Cmp::Gt, Type::U32, p, t, imm(0x600000));
      b.when(p).op(Op::Sub, Type::S32, kexp, kexp, imm(1));
    }
    b.op(Op::Min, Type::S32, kexp, kexp, imm(126));
    b.op(Op::Max, Type::S32, kexp, kexp, imm(-126));
    Reg bits = e.op(Op::Add, Type::S32, kexp, imm(127));
    b.op(Op::Shl, Type::B32, bits, bits, imm(23));
    rs.scale[h] = e.mov(Type::F32, fimm(0.0f));
    b.mov(Type::B32, rs.scale[h], bits);
    Reg ubits = e.op(Op::Sub, Type::S32, imm(127), kexp);
    b.op(Op::Shl, Type::B32, ubits, ubits, imm(23));
    rs.unscale[h] = e.mov(Type::F32, fimm(0.0f));
    b.mov(Type::B32, rs.unscale[h], ubits);
  }
  return rs;
}

// The two `half` values of w (b32) as f32 (lo: bits 0..15) times scale.
// Scratch: t (b32; bf16), l16, h16 (b16; f16).
void half2_scaled(ptx::Builder &b, Type half, Reg w, Reg lo, Reg hi, Reg scale, Reg t, Reg l16,
                  Reg h16) {
  if (half == Type::F16) {
    b.unpack_b32(l16, h16, w);
    b.cvt(Type::F32, Type::F16, ptx::Round::None, lo, l16);
    b.cvt(Type::F32, Type::F16, ptx::Round::None, hi, h16);
  } else {
    b.op(Op::Shl, Type::B32, t, w, imm(16));
    b.mov(Type::B32, lo, t);
    b.op(Op::And, Type::B32, t, w, imm(-65536));
    b.mov(Type::B32, hi, t);
  }
  b.op(Op::Mul, Type::F32, lo, lo, scale);
  b.op(Op::Mul, Type::F32, hi, hi, scale);
}
// The conversion pass of rows_bf16_to_f16 and rows_to_e4m3: chunk c = q +
// 4 warp + W4 i (W4 = 4 num_warps) of rows g and g + 8 of q, loaded into
// rs.w (16 bytes at a + step i, a = the row's chunk q + 4 warp) and turned
// into 8 f32 times the row's 2^k in f (pair j: f[2j], f[2j + 1]); the
// callbacks place the result: row(h, lane_chunk) once per row half,
// pair(j) after each pair, store(h, i, tail, a, step) after the chunk
// (tail: only lanes whose chunk exists, rs.p, may store).
struct ChunkPass {
  std::function<void(int, Reg)> row;
  std::function<void(int)> pair;
  std::function<void(int, int, bool, Reg, int)> store;
};
void scaled_chunks(Emitter &e, const Lanes &ln, Reg warp, int num_warps, const SmemTile &q,
                   Type half, const RowScales &rs, const Reg f[8], Reg l16, Reg h16,
                   const ChunkPass &cp) {
  ptx::Builder &b = e.b;
  const int C = q.cols / 8;  // 16-byte chunks (8 values) per row
  const int W4 = 4 * num_warps;
  const int per_conv = (C + W4 - 1) / W4;
  Reg lane_chunk = e.op(Op::MadLo, Type::U32, warp, imm(4), ln.q);
  for (int h = 0; h < 2; ++h) {
    Reg a = e.op(Op::MadLo, Type::U32, lane_chunk, imm(16), rs.base[h]);
    if (cp.row) cp.row(h, lane_chunk);
    for (int i = 0; i < per_conv; ++i) {
      const bool tail = W4 * (i + 1) > C;
      if (tail) b.setp(Cmp::Lt, Type::U32, rs.p, lane_chunk, imm(C - W4 * i));
      if (tail) b.when(rs.p);
      b.ld_v(Space::Shared, Type::B32, {rs.w[0], rs.w[1], rs.w[2], rs.w[3]}, at(a, 16 * W4 * i));
      for (int j = 0; j < 4; ++j) {
        half2_scaled(b, half, rs.w[j], f[2 * j], f[2 * j + 1], rs.scale[h], rs.t, l16, h16);
        cp.pair(j);
      }
      cp.store(h, i, tail, a, 16 * W4);
    }
  }
}
}  // namespace

std::array<Reg, 2> rows_bf16_to_f16(Emitter &e, const Lanes &ln, Reg warp, int num_warps,
                                    const SmemTile &q, Reg smem_base) {
  ptx::Builder &b = e.b;
  // k = 141 - exponent field (14 - unbiased exponent): the maximum in
  // [2^14, 2^15).
  const RowScales rs = row_pow2_scales(e, ln, Type::BF16, q, smem_base, 141, false);
  const Reg *w = rs.w, p = rs.p;
  b.bar_sync();  // every lane has read its rows before any is rewritten
  // 8 bf16 -> 8 f32, times 2^k, -> 4 f16x2, in place.
  Reg f[8];
  for (Reg &x : f) x = b.f32();
  ChunkPass cp;
  cp.pair = [&](int j) { b.cvt_pack(Type::F16, w[j], f[2 * j + 1], f[2 * j]); };
  cp.store = [&](int, int i, bool tail, Reg a, int step) {
    if (tail) b.when(p);
    b.st_v(Space::Shared, Type::B32, at(a, step * i), {w[0], w[1], w[2], w[3]});
  };
  scaled_chunks(e, ln, warp, num_warps, q, Type::BF16, rs, f, Reg(), Reg(), cp);
  b.bar_sync();  // the f16 rows are in
  return {rs.unscale[0], rs.unscale[1]};
}

std::array<Reg, 2> rows_to_e4m3(Emitter &e, const Lanes &ln, Reg warp, int num_warps, Type half,
                                const SmemTile &q, const SmemTile &q8, Reg smem_base) {
  ptx::Builder &b = e.b;
  // k = 135 - exponent field (8 - unbiased exponent): the maximum in
  // [2^8, 448], or in (224, 256) when its mantissa is past 1.75.
  const RowScales rs = row_pow2_scales(e, ln, half, q, smem_base, 135, true);
  // 8 values -> 8 f32, times 2^k, -> 8 e4m3 bytes (cvt.rn.satfinite) at
  // byte 8c of the row in q8. q is only read: no barrier before the writes.
  Reg l16 = b.b16(), h16 = b.b16();
  Reg f[8], y[4] = {b.b16(), b.b16(), b.b16(), b.b16()}, o[2] = {b.b32(), b.b32()};
  for (Reg &x : f) x = b.f32();
  Reg d;  // this row's chunk c in q8
  ChunkPass cp;
  cp.row = [&](int h, Reg lane_chunk) {
    d = e.op(Op::MadLo, Type::U32, e.op(Op::Add, Type::U32, ln.g, imm(8 * h)), imm(q8.pitch),
             smem_base);
    b.op(Op::Add, Type::U32, d, d, imm(static_cast<int>(q8.offset)));
    b.op(Op::MadLo, Type::U32, d, lane_chunk, imm(8), d);
  };
  cp.pair = [&](int j) { b.cvt_f8x2_f32(false, y[j], f[2 * j + 1], f[2 * j]); };
  cp.store = [&](int, int i, bool tail, Reg, int step) {
    b.pack_b32(o[0], y[0], y[1]);
    b.pack_b32(o[1], y[2], y[3]);
    if (tail) b.when(rs.p);
    b.st_v(Space::Shared, Type::B32, at(d, step / 2 * i), {o[0], o[1]});
  };
  scaled_chunks(e, ln, warp, num_warps, q, half, rs, f, l16, h16, cp);
  b.bar_sync();  // the e4m3 rows are in
  return {rs.unscale[0], rs.unscale[1]};
}

// --------------------------------------------------------- online softmax --

OnlineSoftmax::OnlineSoftmax(Emitter &e, int m_tiles, Reg scale_log2, Form form)
    : e_(e), rows_(2 * m_tiles), c_(scale_log2), form_(form) {
  for (int r = 0; r < rows_; ++r) {
    m_.push_back(e.mov(Type::F32, fimm(kNegInf)));
    l_.push_back(e.mov(Type::F32, fimm(0.0f)));
  }
}

void OnlineSoftmax::reset() {
  for (int r = 0; r < rows_; ++r) {
    e_.b.mov(Type::F32, m_[size_t(r)], fimm(kNegInf));
    e_.b.mov(Type::F32, l_[size_t(r)], fimm(0.0f));
  }
}

void OnlineSoftmax::step(const std::vector<AccTile> &s, const std::vector<AccTile> &o) {
  step_impl(s, &o);
}

void OnlineSoftmax::step_scores(const std::vector<AccTile> &s) { step_impl(s, nullptr); }

void OnlineSoftmax::rescale(const std::vector<AccTile> &o) {
  ptx::Builder &b = e_.b;
  ptx::Label keep = b.label();
  b.unless(any_).bra(keep, true);
  for (size_t mi = 0; mi < o.size(); ++mi)
    for (const Frag4 &f : o[mi].f)
      for (int i = 0; i < 4; ++i) b.op(Op::Mul, Type::F32, f[i], f[i], alpha_[2 * mi + i / 2]);
  b.bind(keep);
}

void OnlineSoftmax::step_impl(const std::vector<AccTile> &s, const std::vector<AccTile> *o) {
  ptx::Builder &b = e_.b;
  Reg t = b.f32();
  // 1. Each row's new maximum (this lane's scores, then the quad's), and
  //    whether it passed the one the exponentials use by more than
  //    kRescaleLog2 (a row's first key always does).
  std::vector<Reg> mnew(rows_);
  Reg need = b.pred(), grew = b.pred();
  for (int r = 0; r < rows_; ++r) {
    const AccTile &sr = s[r / 2];
    const int h = r % 2;
    Reg mx = e_.mov(Type::F32, m_[r]);
    for (const Frag4 &f : sr.f) {
      b.op(Op::Max, Type::F32, mx, mx, f[2 * h]);
      b.op(Op::Max, Type::F32, mx, mx, f[2 * h + 1]);
    }
    for (int off = 1; off <= 2; off <<= 1) {
      b.shfl(ptx::Shfl::Bfly, t, mx, imm(off), imm(31), 0xffffffffu);
      b.op(Op::Max, Type::F32, mx, mx, t);
    }
    mnew[r] = mx;
    Reg d = e_.op(Op::Sub, Type::F32, mx, m_[r]);  // +inf for a first key, NaN for none yet
    if (c_.valid()) b.op(Op::Mul, Type::F32, d, d, c_);
    b.setp(Cmp::Gt, Type::F32, r == 0 ? need : grew, d, fimm(form_.rescale_log2));
    if (r > 0) b.op(Op::Or, Type::Pred, need, need, grew);
  }
  // 2. Only when some row of the warp grew that much (a warp-uniform branch):
  //    move every row's maximum up, O and l by alpha = 2^((m - m') c).
  Reg any = b.pred();
  b.vote(false, any, need, 0xffffffffu);
  ptx::Label keep = b.label();
  b.unless(any).bra(keep, true);
  std::vector<Reg> alpha(rows_);
  for (int r = 0; r < rows_; ++r) {
    alpha[r] = b.f32();
    to_log2(alpha[r], m_[r], row_offset(mnew[r], 0.0f), 0.0f);
    b.op(Op::Ex2, Type::F32, alpha[r], alpha[r]);
    b.mov(Type::F32, m_[r], mnew[r]);
    b.op(Op::Mul, Type::F32, l_[r], l_[r], alpha[r]);
  }
  if (o != nullptr) {
    for (size_t mi = 0; mi < o->size(); ++mi)
      for (const Frag4 &f : (*o)[mi].f)
        for (int i = 0; i < 4; ++i) b.op(Op::Mul, Type::F32, f[i], f[i], alpha[2 * mi + i / 2]);
  } else {
    any_ = any;
    alpha_ = alpha;
  }
  b.bind(keep);
  // 3. p = 2^((s - m) c) <= 2^kRescaleLog2; l += sum p (this lane's part).
  for (int r = 0; r < rows_; ++r) {
    const AccTile &sr = s[r / 2];
    const int h = r % 2;
    Reg off = row_offset(m_[r], form_.p_offset_log2);
    Reg sum = b.f32();
    bool first = true;
    for (const Frag4 &f : sr.f) {
      for (int x = 0; x < 2; ++x) {
        Reg p = f[2 * h + x];
        to_log2(p, p, off, form_.p_offset_log2);
        b.op(Op::Ex2, Type::F32, p, p);
        if (first)
          b.mov(Type::F32, sum, p);
        else
          b.op(Op::Add, Type::F32, sum, sum, p);
        first = false;
      }
    }
    b.op(Op::Add, Type::F32, l_[r], l_[r], sum);
  }
}

Reg OnlineSoftmax::row_offset(Reg m, float add) {
  Reg off = merge_offset(e_, m).off;
  if (!c_.valid() && add != 0.0f) e_.b.op(Op::Sub, Type::F32, off, off, fimm(add));
  return off;
}

// (x - m) c, not x c - m c (see the class comment): one FP32 instruction per
// score more than the FFMA, the fp8 form's add riding in an FFMA.
void OnlineSoftmax::to_log2(Reg d, Reg x, Reg off, float add) {
  ptx::Builder &b = e_.b;
  b.op(Op::Sub, Type::F32, d, x, off);
  if (!c_.valid()) return;
  if (add != 0.0f)
    b.op(Op::Fma, Type::F32, d, d, c_, fimm(add));
  else
    b.op(Op::Mul, Type::F32, d, d, c_);
}

void OnlineSoftmax::finish(const std::vector<AccTile> &o, std::vector<Reg> *lse) {
  ptx::Builder &b = e_.b;
  Reg t = b.f32();
  for (int r = 0; r < rows_; ++r) {
    const int h = r % 2;
    for (int off = 1; off <= 2; off <<= 1) {
      b.shfl(ptx::Shfl::Bfly, t, l_[r], imm(off), imm(31), 0xffffffffu);
      b.op(Op::Add, Type::F32, l_[r], l_[r], t);
    }
    const RowEnd end = row_end(e_, m_[r], c_, l_[r], form_.p_offset_log2);
    lse->push_back(end.lse);
    for (const Frag4 &f : o[r / 2].f) {
      b.op(Op::Mul, Type::F32, f[2 * h], f[2 * h], end.inv);
      b.op(Op::Mul, Type::F32, f[2 * h + 1], f[2 * h + 1], end.inv);
    }
  }
}

RowSoftmax::RowSoftmax(Emitter &e, Reg c, SoftmaxForm form, int poly, int partner_xor)
    : e_(e), c_(c), form_(form), poly_(poly), xor_(partner_xor), exp2_(e) {
  if (c_.valid()) {
    c2_ = e_.b.b64();
    e_.b.pack_f32x2(c2_, c_, c_);
  }
  m = e_.mov(Type::F32, fimm(kNegInf));
  l = e_.mov(Type::F32, fimm(0.0f));
}

RowSoftmax::Step RowSoftmax::step(const std::vector<Reg> &s) {
  ptx::Builder &b = e_.b;
  const size_t nb = s.size();
  // The row maximum: four independent chains of max3 over pairs.
  Reg mx = e_.mov(Type::F32, m);
  {
    Reg acc[4];
    for (int a = 0; a < 4; ++a) acc[a] = b.f32();
    for (size_t a = 0; a < 4; ++a) b.op(Op::Max, Type::F32, acc[a], s[2 * a], s[2 * a + 1]);
    for (size_t x = 8; x < nb; x += 2) {
      Reg &a = acc[(x / 2) % 4];
      b.op(Op::Max3, Type::F32, a, a, s[x], s[x + 1]);
    }
    b.op(Op::Max3, Type::F32, mx, mx, acc[0], acc[1]);
    b.op(Op::Max3, Type::F32, mx, mx, acc[2], acc[3]);
  }
  if (xor_) {
    Reg t = b.f32();
    b.shfl(ptx::Shfl::Bfly, t, mx, imm(xor_), imm(31), 0xffffffffu);
    b.op(Op::Max, Type::F32, mx, mx, t);
  }
  Step st;
  Reg grow = b.f32();
  b.op(Op::Sub, Type::F32, grow, mx, m);
  if (c_.valid()) b.op(Op::Mul, Type::F32, grow, grow, c_);
  st.moved = e_.setp(Cmp::Gt, Type::F32, grow, fimm(form_.rescale_log2));
  st.alpha = e_.mov(Type::F32, fimm(1.0f));
  {
    // alpha = 2^((m - mx) c); m = -inf: 0 (l is 0 then, and O unwritten)
    Reg d = e_.op(Op::Sub, Type::F32, m, mx);
    if (c_.valid()) b.op(Op::Mul, Type::F32, d, d, c_);
    Reg a = e_.op(Op::Ex2, Type::F32, d);
    b.selp(Type::F32, st.alpha, a, st.alpha, st.moved);
    b.selp(Type::F32, m, mx, m, st.moved);
    b.op(Op::Mul, Type::F32, l, l, st.alpha);
  }
  // The exponentials' offset: m c, or 0 for a row with no key yet.
  Reg off = c_.valid() ? e_.op(Op::Mul, Type::F32, m, c_) : e_.mov(Type::F32, m);
  Reg none = e_.setp(Cmp::Eq, Type::F32, m, fimm(kNegInf));
  b.selp(Type::F32, off, fimm(0.0f), off, none);
  // p = 2^(s c - off) on pairs (f32x2): MUFU, or the polynomial for poly of
  // each 16 pairs (the fp8 form: 2^(s c - off + 8), p <= 2^8, SoftmaxForm).
  Reg noff = form_.p_offset_log2 != 0.0f ? e_.op(Op::Sub, Type::F32, fimm(form_.p_offset_log2), off)
                                         : e_.op(Op::Neg, Type::F32, off);
  Reg noff2 = b.b64();
  b.pack_f32x2(noff2, noff, noff);
  Reg s2 = b.b64();
  Reg sum2[2];
  for (size_t x = 0; x < nb / 2; ++x) {
    const Reg &s0 = s[2 * x], &s1 = s[2 * x + 1];
    b.pack_f32x2(s2, s0, s1);
    if (c_.valid())
      b.f32x2(Op::Fma, s2, s2, c2_, noff2);
    else
      b.f32x2(Op::Add, s2, s2, noff2);
    b.unpack_f32x2(s0, s1, s2);
    if (static_cast<int>(x % 16) < poly_) {
      exp2_(s0, s1, s0, s1);
    } else {
      b.op(Op::Ex2, Type::F32, s0, s0);
      b.op(Op::Ex2, Type::F32, s1, s1);
    }
    // l's two pair sums (independent chains)
    Reg &acc = sum2[x % 2];
    if (x < 2) {
      acc = b.b64();
      b.pack_f32x2(acc, s0, s1);
    } else {
      b.pack_f32x2(s2, s0, s1);
      b.f32x2(Op::Add, acc, acc, s2);
    }
  }
  b.f32x2(Op::Add, sum2[0], sum2[0], sum2[1]);
  Reg lo = b.f32(), hi = b.f32();
  b.unpack_f32x2(lo, hi, sum2[0]);
  b.op(Op::Add, Type::F32, lo, lo, hi);
  b.op(Op::Add, Type::F32, l, l, lo);
  return st;
}

Reg RowSoftmax::row_l() {
  Reg t = e_.mov(Type::F32, l);
  if (xor_) {
    Reg o = e_.b.f32();
    e_.b.shfl(ptx::Shfl::Bfly, o, t, imm(xor_), imm(31), 0xffffffffu);
    e_.b.op(Op::Add, Type::F32, t, t, o);
  }
  return t;
}

RowEnd row_end(Emitter &e, Reg m, Reg c, Reg l, float p_offset_log2) {
  ptx::Builder &b = e.b;
  Reg pos = e.setp(Cmp::Gt, Type::F32, l, fimm(0.0f));
  Reg inv = e.op(Op::RcpRn, Type::F32, l);
  b.selp(Type::F32, inv, inv, fimm(0.0f), pos);
  Reg lg = e.op(Op::Lg2, Type::F32, l);
  Reg v = c.valid() ? e.op(Op::Fma, Type::F32, m, c, lg) : e.op(Op::Add, Type::F32, m, lg);
  if (p_offset_log2 != 0.0f) b.op(Op::Sub, Type::F32, v, v, fimm(p_offset_log2));
  b.op(Op::Mul, Type::F32, v, v, fimm(kLn2));
  b.selp(Type::F32, v, v, fimm(kNegInf), pos);
  return {inv, v};
}

void OnlineSoftmax::finish(const std::vector<AccTile> &o, std::vector<Reg> *lse, Reg sink_log2) {
  ptx::Builder &b = e_.b;
  Reg t = b.f32();
  Reg nan0 = sink_nan0(e_, sink_log2);
  for (int r = 0; r < rows_; ++r) {
    const int h = r % 2;
    for (int off = 1; off <= 2; off <<= 1) {
      b.shfl(ptx::Shfl::Bfly, t, l_[r], imm(off), imm(31), 0xffffffffu);
      b.op(Op::Add, Type::F32, l_[r], l_[r], t);
    }
    // The exponentials' offset m c (-inf for a row with no key: l = 0).
    Reg m2 = c_.valid() ? e_.op(Op::Mul, Type::F32, m_[r], c_) : m_[r];
    if (form_.p_offset_log2 != 0.0f)
      m2 = e_.op(Op::Sub, Type::F32, m2, fimm(form_.p_offset_log2));  // -inf stays -inf
    const SinkRow sr = sink_row(e_, m2, l_[r], sink_log2, nan0);
    lse->push_back(sr.lse);
    for (const Frag4 &f : o[r / 2].f) {
      b.op(Op::Mul, Type::F32, f[2 * h], f[2 * h], sr.inv);
      b.op(Op::Mul, Type::F32, f[2 * h + 1], f[2 * h + 1], sr.inv);
    }
  }
}

namespace {
// A 16-bit value (the low or high half of a b32) as f32: bf16 by a shift,
// f16 by cvt.f32.f16 (PTX ISA "cvt").
Reg half_to_f32(Emitter &e, Type half, Reg x32, bool high) {
  ptx::Builder &b = e.b;
  Reg f = b.f32();
  if (half == Type::BF16) {
    Reg t =
        high ? e.op(Op::And, Type::B32, x32, imm(-65536)) : e.op(Op::Shl, Type::B32, x32, imm(16));
    b.mov(Type::B32, f, t);
  } else {
    Reg h = b.b16();
    b.cvt(Type::U16, Type::U32, ptx::Round::None, h,
          high ? e.op(Op::Shr, Type::U32, x32, imm(16)) : x32);
    b.cvt(Type::F32, Type::F16, ptx::Round::None, f, h);
  }
  return f;
}

// Entry i of the table row at `base`: f32, or a 16-bit value.
Reg rope_entry(Emitter &e, const RopeTable &t, Reg base, Reg i) {
  ptx::Builder &b = e.b;
  if (!t.half_table) {
    Reg f = b.f32();
    b.ld(Space::Global, Type::F32, f, ptx::at(e.index(base, i, 4)), true);
    return f;
  }
  Reg h = b.b16();
  b.ld(Space::Global, Type::U16, h, ptx::at(e.index(base, i, 2)), true);
  Reg w = b.b32();
  b.cvt(Type::U32, Type::U16, ptx::Round::None, w, h);
  return half_to_f32(e, t.half, w, false);
}
}  // namespace

void rope_chunk(Emitter &e, const RopeTable &t, Reg row, Reg col8, Reg pos,
                const std::array<Reg, 4> &x) {
  ptx::Builder &b = e.b;
  b.comment("RoPE of a 16-byte chunk");
  ptx::Label skip = b.label();
  b.when(e.setp(Cmp::Ge, Type::S32, col8, t.rotary_dim)).bra(skip);
  Reg half_dim = e.op(Op::Shr, Type::S32, t.rotary_dim, imm(1));
  Reg p = e.op(Op::Min, Type::S32, e.op(Op::Max, Type::S32, pos, imm(0)), t.last_row);
  // Row p of each table, in 64 bits.
  const int eb = t.half_table ? 2 : 4;
  Reg row_bytes = e.s64(e.op(Op::MulLo, Type::S32, half_dim, imm(eb)));
  Reg cos_row = e.index(t.cos, p, row_bytes), sin_row = e.index(t.sin, p, row_bytes);
  Reg first, partner[4], ib;
  if (t.interleaved) {
    ib = e.op(Op::Shr, Type::S32, col8, imm(1));
  } else {
    // Columns below rotary_dim / 2 pair with + rotary_dim / 2, the rest with -.
    first = e.setp(Cmp::Lt, Type::S32, col8, half_dim);
    Reg pcol = e.op(Op::Sub, Type::S32, col8, half_dim);
    Reg up = e.op(Op::Add, Type::S32, col8, half_dim);
    b.selp(Type::S32, pcol, up, pcol, first);
    ib = e.selp(Type::S32, col8, e.op(Op::Sub, Type::S32, col8, half_dim), first);
    for (Reg &r : partner) r = b.b32();
    b.ld_v(Space::Global, Type::U32, {partner[0], partner[1], partner[2], partner[3]},
           ptx::at(e.index(row, pcol, 2)), true);
  }
  Reg sgn;  // NeoX: -1 for the first half's elements, +1 for the second's
  if (!t.interleaved) sgn = e.selp(Type::F32, fimm(-1.0f), fimm(1.0f), first);
  Reg y[8];
  for (int k = 0; k < 8; ++k) {
    const bool hi = k % 2;
    Reg own = half_to_f32(e, t.half, x[k / 2], hi);
    Reg other = t.interleaved ? half_to_f32(e, t.half, x[k / 2], !hi)
                              : half_to_f32(e, t.half, partner[k / 2], hi);
    Reg i = e.op(Op::Add, Type::S32, ib, imm(t.interleaved ? k / 2 : k));
    Reg c = rope_entry(e, t, cos_row, i), sn = rope_entry(e, t, sin_row, i);
    if (t.interleaved) {
      if (!hi) b.op(Op::Neg, Type::F32, sn, sn);
    } else {
      b.op(Op::Mul, Type::F32, sn, sn, sgn);  // exact: a sign change
    }
    // rn(own cos) (fma with -0 adds nothing and keeps the sign of a zero),
    // then one fma with the partner's term.
    Reg a = e.op(Op::Fma, Type::F32, own, c, fimm(-0.0f));
    y[k] = e.op(Op::Fma, Type::F32, other, sn, a);
  }
  for (int k = 0; k < 4; ++k) b.cvt_pack(t.half, x[k], y[2 * k + 1], y[2 * k]);
  b.bind(skip);
}

std::array<Reg, 2> quantise_fp8_chunk(Emitter &e, Type half, const std::array<Reg, 4> &x,
                                      Reg descale, bool e5m2) {
  ptx::Builder &b = e.b;
  b.comment("fp8 quantisation of a 16-byte chunk");
  std::array<Reg, 2> out;
  for (int w = 0; w < 2; ++w) {
    Reg pair[2];  // bytes 4w, 4w + 1 and 4w + 2, 4w + 3
    for (int i = 0; i < 2; ++i) {
      Reg lo = half_to_f32(e, half, x[2 * w + i], false);
      Reg hi = half_to_f32(e, half, x[2 * w + i], true);
      b.op(Op::DivRn, Type::F32, lo, lo, descale);
      b.op(Op::DivRn, Type::F32, hi, hi, descale);
      pair[i] = b.b16();
      b.cvt_f8x2_f32(e5m2, pair[i], hi, lo);
    }
    Reg a = b.b32(), c = b.b32();
    b.cvt(Type::U32, Type::U16, ptx::Round::None, a, pair[0]);
    b.cvt(Type::U32, Type::U16, ptx::Round::None, c, pair[1]);
    out[w] = e.op(Op::Or, Type::B32, a, e.op(Op::Shl, Type::B32, c, imm(16)));
  }
  return out;
}

}  // namespace fa::kgen::tile

#include "kernels/tile/swizzle.h"

namespace fa::kgen::tile {

Reg Swizzle128::addr(Emitter &e, Reg base, Reg row, Reg chunk) const {
  ptx::Builder &b = e.b;
  Reg sw = e.op(Op::Xor, Type::B32, e.op(Op::And, Type::B32, chunk, imm(7)), row);
  b.op(Op::And, Type::B32, sw, sw, imm(7));
  Reg a = e.op(Op::Shr, Type::U32, chunk, imm(3));
  b.op(Op::MadLo, Type::U32, a, a, imm(atom_bytes), base);
  b.op(Op::MadLo, Type::U32, a, row, imm(kRowBytes), a);
  b.op(Op::MadLo, Type::U32, a, sw, imm(kChunkBytes), a);
  return a;
}

Reg Swizzle128::slot_bytes(Emitter &e, Reg chunk, Reg row8) {
  if (!row8.valid()) return e.op(Op::Shl, Type::B32, chunk, imm(4));
  Reg s = e.op(Op::Xor, Type::B32, chunk, row8);
  e.b.op(Op::Shl, Type::B32, s, s, imm(4));
  return s;
}

Reg Swizzle128::descriptor(Emitter &e, Reg addr, uint32_t off, uint64_t bits) {
  ptx::Builder &b = e.b;
  Reg a = e.op(Op::Add, Type::U32, addr, imm(off));
  b.op(Op::Shr, Type::U32, a, a, imm(4));
  b.op(Op::And, Type::B32, a, a, imm(0x3fff));
  Reg d = b.b64();
  b.cvt(Type::U64, Type::U32, ptx::Round::None, d, a);
  b.op(Op::Or, Type::B64, d, d, imm(static_cast<int64_t>(bits)));
  return d;
}

void pack_acc(Emitter &e, const AccTile &t, Type half, const std::vector<Reg> &dst) {
  for (int j = 0; j < t.n(); ++j)
    for (int h = 0; h < 2; ++h)
      e.b.cvt_pack(half, dst[2 * j + h], t.f[j][2 * h + 1], t.f[j][2 * h]);
}

void store_acc(Emitter &e, const Lanes &ln, const AccTile &t, Type half, const Swizzle128 &lay,
               Reg base, Reg row0, uint32_t off, const std::vector<Reg> *packed) {
  ptx::Builder &b = e.b;
  // The lane's row and its swizzle: chunk 2i + h2 of it sits in slot
  // ((2i + h2) % 8) ^ (row % 8) = (2i % 8) ^ (h2 ^ row % 8).
  Reg row = e.op(Op::MadLo, Type::U32, ln.h1, imm(8), ln.l8);
  b.op(Op::Add, Type::U32, row, row, row0);
  Reg hsx = Swizzle128::slot_bytes(e, ln.h2, e.op(Op::And, Type::B32, row, imm(7)));
  Reg rowa = e.op(Op::MadLo, Type::U32, row, imm(Swizzle128::kRowBytes), base);
  Reg r[4] = {b.b32(), b.b32(), b.b32(), b.b32()};
  const int n = t.n();
  for (int j = 0; j < n; j += 2) {
    const int count = j + 1 < n ? 4 : 2;  // the last 8 columns alone: .x2
    for (int m = 0; m < count; ++m) {
      const Frag4 &fr = t.f[j + m / 2];
      if (packed)
        r[m] = (*packed)[2 * (j + m / 2) + m % 2];
      else
        b.cvt_pack(half, r[m], fr[2 * (m % 2) + 1], fr[2 * (m % 2)]);
    }
    Reg a = e.op(Op::Xor, Type::B32, hsx, imm(Swizzle128::flip(j % 8)));
    b.op(Op::Add, Type::U32, a, a, rowa);
    b.stmatrix(false, r, count, at(a, off + static_cast<uint32_t>(j / 8) * lay.atom_bytes));
  }
}

void gather_rows(Emitter &e, Reg tid, Reg dst, uint32_t base, uint32_t atom_bytes, int rows,
                 int chunks, int data, Reg first, Reg limit,
                 const std::function<Reg(Reg)> &row_addr, int fp8, Type half, int threads) {
  ptx::Builder &b = e.b;
  int lg = 0;
  while ((1 << lg) < chunks) ++lg;
  const int T = 1 << lg, R = threads / T;
  Reg c = e.op(Op::And, Type::B32, tid, imm(T - 1));
  Reg r = e.op(Op::Shr, Type::U32, tid, imm(lg));
  Reg live = chunks < T ? e.setp(Cmp::Lt, Type::U32, c, imm(chunks)) : Reg();
  Reg real = data < T ? e.setp(Cmp::Lt, Type::U32, c, imm(data)) : Reg();
  // Smem address of (row r, chunk c); rows 8 apart share the swizzle, and
  // pass p (row r + p R, r % 8 & p R % 8 = 0) flips it by p R % 8
  // (Swizzle128::flip): with R = 4 alternate passes flip bit 2 (d[4]); with
  // R = 2 or 1 (more than 32 chunks a row) each of 8 / R passes its own.
  const Swizzle128 sw{atom_bytes};
  Reg d[8];
  d[0] = sw.addr(e, dst, r, c);
  for (int k = R; k < 8; k += R) d[k] = e.op(Op::Xor, Type::B32, d[0], imm(Swizzle128::flip(k)));
  Reg coff = b.b64();
  b.mul_wide(Type::U32, coff, c, imm(fp8 ? 8 : 16));
  Reg last = e.op(Op::Sub, Type::S32, limit, imm(1));
  Reg y[2], hw[2], w[4];   // fp8: a chunk's bytes, their halves, the 16-bit pairs
  Reg lo16, hi16, lo, hi;  // fp8 to bf16: through f32
  if (fp8) {
    for (Reg &x : y) x = b.b32();
    for (Reg &x : hw) x = b.b16();
    for (Reg &x : w) x = b.b32();
    if (half == Type::BF16) lo16 = b.b16(), hi16 = b.b16(), lo = b.f32(), hi = b.f32();
  }
  Reg j0 = e.op(Op::Add, Type::S32, first, r);
  Reg ok = b.pred(), in = b.pred();
  // Pass p copies row r + p R. Up to 4 passes are unrolled; more run as a
  // loop of U unrolled passes, U the largest divisor of the count up to 4
  // (rows is then a multiple of R; with R = 4, of 16), which keeps the
  // producer within its 56 registers; with R < 4, U = 8 / R passes (a
  // loop's step of 8 rows keeps each pass's flip), or all of them.
  const int passes = (rows + R - 1) / R;
  int U = std::min(passes, 4);
  while (passes % U != 0) --U;
  if (R < 4) U = passes % (8 / R) == 0 ? 8 / R : passes;
  auto pass = [&](int p, Reg jb) {
    Reg j = e.op(Op::Add, Type::S32, jb, imm(p * R));
    b.setp(Cmp::Lt, Type::S32, ok, j, limit);
    if (real.valid()) b.op(Op::And, Type::Pred, ok, ok, real);
    Reg src = row_addr(e.op(Op::Min, Type::S32, j, last));
    b.op(Op::Add, Type::S64, src, src, coff);
    const Reg size = fp8 ? Reg() : e.selp(Type::U32, imm(16), imm(0), ok);
    ptx::Addr at_d = at(d[p * R % 8], static_cast<int64_t>(base) + int64_t(p) * R * 128);
    Reg guard;
    if (live.valid()) guard = live;
    if ((p + 1) * R > rows) {  // rows is not a multiple of R: the last pass is partial
      b.setp(Cmp::Lt, Type::U32, in, r, imm(rows - p * R));
      if (guard.valid()) b.op(Op::And, Type::Pred, in, in, guard);
      guard = in;
    }
    if (fp8) {
      for (Reg x : y) b.mov(Type::B32, x, imm(0));
      b.when(ok).ld_v(Space::Global, Type::B32, {y[0], y[1]}, at(src));
      const Reg halves[4] = {hw[0], hw[1], hw[0], hw[1]};
      fp8x8_to_half(b, fp8 == 2, half, y, halves, w, lo16, hi16, lo, hi);
      if (guard.valid()) b.when(guard);
      b.st_v(Space::Shared, Type::B32, at_d, {w[0], w[1], w[2], w[3]});
      return;
    }
    if (guard.valid())
      b.when(guard).cp_async_cg16(at_d, at(src), size);
    else
      b.cp_async_cg16(at_d, at(src), size);
  };
  if (U == passes) {
    for (int p = 0; p < passes; ++p) pass(p, j0);
    return;
  }
  Reg left = e.mov(Type::U32, imm(passes / U));
  ptx::Label top = b.label();
  b.bind(top);
  for (int p = 0; p < U; ++p) pass(p, j0);
  b.op(Op::Add, Type::S32, j0, j0, imm(U * R));
  for (Reg x : d)
    if (x.valid()) b.op(Op::Add, Type::U32, x, x, imm(U * R * 128));
  b.op(Op::Sub, Type::U32, left, left, imm(1));
  b.when(e.setp(Cmp::Ne, Type::U32, left, imm(0))).bra(top);
}

}  // namespace fa::kgen::tile

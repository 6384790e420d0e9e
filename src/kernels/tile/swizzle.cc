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

}  // namespace fa::kgen::tile

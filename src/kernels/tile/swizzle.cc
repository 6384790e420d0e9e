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

}  // namespace fa::kgen::tile

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

}  // namespace fa::kgen::tile

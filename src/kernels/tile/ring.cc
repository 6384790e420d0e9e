#include "kernels/tile/ring.h"

namespace fa::kgen::tile {

Ring::Slot Ring::slot(Reg it) const {
  Slot s;
  s.stage = e_.op(Op::Rem, Type::U32, it, imm(stages_));
  s.parity = e_.op(Op::And, Type::B32, e_.op(Op::Div, Type::U32, it, imm(stages_)), imm(1));
  return s;
}

Reg Ring::free_parity(Reg parity) const { return e_.op(Op::Xor, Type::B32, parity, imm(1)); }

Reg Ring::bars(Reg stage) const { return e_.op(Op::MadLo, Type::U32, stage, imm(8), smem_); }

void Ring::wait(Reg bars, int off, Reg parity) const {
  ptx::Builder &b = e_.b;
  ptx::Label spin = b.label();
  Reg p = b.pred();
  b.bind(spin);
  b.mbarrier_try_wait_parity(p, at(bars, off), parity);
  b.unless(p).bra(spin);
}

Ring::Cursor Ring::begin() const {
  Cursor c;
  c.stage = e_.mov(Type::U32, imm(0));
  c.parity = e_.mov(Type::U32, imm(0));
  c.prev_stage = e_.b.b32();
  c.prev_parity = e_.b.b32();
  return c;
}

void Ring::advance(const Cursor &c) const {
  ptx::Builder &b = e_.b;
  b.mov(Type::U32, c.prev_stage, c.stage);
  b.mov(Type::U32, c.prev_parity, c.parity);
  b.op(Op::Add, Type::U32, c.stage, c.stage, imm(1));
  Reg wrap = e_.setp(Cmp::Eq, Type::U32, c.stage, imm(stages_));
  b.selp(Type::U32, c.stage, imm(0), c.stage, wrap);
  Reg flipped = e_.op(Op::Xor, Type::B32, c.parity, imm(1));
  b.selp(Type::U32, c.parity, flipped, c.parity, wrap);
}

}  // namespace fa::kgen::tile

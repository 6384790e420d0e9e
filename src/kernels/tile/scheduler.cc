#include "kernels/tile/scheduler.h"

#include <algorithm>

namespace fa::kgen::tile {

WorkItem Schedule::decode(int64_t t) const {
  const int64_t pairs = int64_t(heads) * batch, sec_heads = section * (heads / heads_kv);
  const int64_t sec_tiles = sec_heads * m_blocks;
  const int64_t sec = t / sec_tiles, l = t - sec * sec_tiles, start = sec * sec_heads;
  const int64_t cur = std::min(sec_heads, pairs - start);
  const int64_t mi = l / cur, bh = start + (l - mi * cur);
  WorkItem w;
  w.m_block = reverse ? m_blocks - 1 - mi : mi;
  w.batch = static_cast<int>(bh / heads);
  w.head = static_cast<int>(bh - int64_t(w.batch) * heads);
  return w;
}

Schedule make_schedule(int64_t seqlen_q, int64_t seqlen_k, int heads, int heads_kv, int batch,
                       int64_t wl, int64_t wr, int block_m, int kv_row_bytes) {
  Schedule s;
  s.m_blocks = (seqlen_q + block_m - 1) / block_m;
  s.heads = heads;
  s.heads_kv = heads_kv;
  s.batch = batch;
  s.section = (kL2Bytes / kv_row_bytes) / std::max<int64_t>(seqlen_k, 1);
  s.section = std::min(std::max<int64_t>(s.section, 1), int64_t(heads_kv) * batch);
  s.reverse = wr <= wl;
  return s;
}

TileScheduler::TileScheduler(Emitter &e, Reg seqlen_q, Reg seqlen_k, Reg heads, Reg heads_kv,
                             Reg batch, Reg wl, Reg wr, int block_m, int kv_row_bytes)
    : e_(e), heads_(heads) {
  ptx::Builder &b = e.b;
  // u32 throughout: seqlen_q + block_m - 1 < 2^32, and every product below
  // is at most total() < 2^31 (the runtime's condition).
  m_blocks_ = e.op(Op::Add, Type::U32, seqlen_q, imm(block_m - 1));
  b.op(Op::Div, Type::U32, m_blocks_, m_blocks_, imm(block_m));
  pairs_ = e.op(Op::MulLo, Type::U32, heads, batch);
  Reg kv_pairs = e.op(Op::MulLo, Type::U32, heads_kv, batch);
  Reg sk1 = e.op(Op::Max, Type::S32, seqlen_k, imm(1));
  Reg sec = e.mov(Type::U32, imm(kL2Bytes / kv_row_bytes));
  b.op(Op::Div, Type::U32, sec, sec, sk1);
  b.op(Op::Max, Type::U32, sec, sec, imm(1));
  b.op(Op::Min, Type::U32, sec, sec, kv_pairs);
  Reg group = e.op(Op::Div, Type::U32, heads, heads_kv);
  sec_heads_ = e.op(Op::MulLo, Type::U32, sec, group);
  sec_tiles_ = e.op(Op::MulLo, Type::U32, sec_heads_, m_blocks_);
  reverse_ = e.setp(Cmp::Le, Type::S32, wr, wl);
  total_ = e.op(Op::MulLo, Type::U32, m_blocks_, pairs_);
}

TileScheduler::Item TileScheduler::decode(Reg t) const {
  ptx::Builder &b = e_.b;
  Reg sec = e_.op(Op::Div, Type::U32, t, sec_tiles_);
  Reg l = e_.op(Op::Sub, Type::U32, t, e_.op(Op::MulLo, Type::U32, sec, sec_tiles_));
  Reg start = e_.op(Op::MulLo, Type::U32, sec, sec_heads_);
  // This section's pairs: sec_heads, fewer in the last section.
  Reg cur = e_.op(Op::Min, Type::U32, sec_heads_, e_.op(Op::Sub, Type::U32, pairs_, start));
  Reg mi = e_.op(Op::Div, Type::U32, l, cur);
  Reg bh = e_.op(Op::Sub, Type::U32, l, e_.op(Op::MulLo, Type::U32, mi, cur));
  b.op(Op::Add, Type::U32, bh, bh, start);
  Item it;
  Reg last = e_.op(Op::Sub, Type::U32, m_blocks_, imm(1));
  it.m_block = e_.selp(Type::U32, e_.op(Op::Sub, Type::U32, last, mi), mi, reverse_);
  it.batch = e_.op(Op::Div, Type::U32, bh, heads_);
  it.head = e_.op(Op::Sub, Type::U32, bh, e_.op(Op::MulLo, Type::U32, it.batch, heads_));
  return it;
}

}  // namespace fa::kgen::tile

#include "kernels/tile/scheduler.h"

#include <algorithm>

namespace fa::kgen::tile {

namespace {

// KV heads per section: as many as kL2Bytes holds at seqlen_k keys, 1 ..
// kv_pairs.
int64_t section_kv_heads(int64_t seqlen_k, int kv_row_bytes, int64_t kv_pairs) {
  const int64_t s = (kL2Bytes / kv_row_bytes) / std::max<int64_t>(seqlen_k, 1);
  return std::min(std::max<int64_t>(s, 1), kv_pairs);
}

// Item l of m_blocks x pairs items cut into sections of sec_heads pairs
// (the last may be shorter), m-block by m-block within a section.
WorkItem in_sections(int64_t l, int64_t m_blocks, int64_t pairs, int64_t sec_heads, bool reverse,
                     int64_t *pair) {
  const int64_t sec_tiles = sec_heads * m_blocks;
  const int64_t sec = l / sec_tiles, r = l - sec * sec_tiles, start = sec * sec_heads;
  const int64_t cur = std::min(sec_heads, pairs - start);
  const int64_t mi = r / cur;
  *pair = start + (r - mi * cur);
  WorkItem w;
  w.m_block = reverse ? m_blocks - 1 - mi : mi;
  return w;
}

// The same in PTX (u32): the section's query heads x KV heads per section,
// and an item's m-block and pair.
Reg section_heads(Emitter &e, Reg seqlen_k, Reg heads, Reg heads_kv, Reg kv_pairs,
                  int kv_row_bytes) {
  ptx::Builder &b = e.b;
  Reg sk1 = e.op(Op::Max, Type::S32, seqlen_k, imm(1));
  Reg sec = e.mov(Type::U32, imm(kL2Bytes / kv_row_bytes));
  b.op(Op::Div, Type::U32, sec, sec, sk1);
  b.op(Op::Max, Type::U32, sec, sec, imm(1));
  b.op(Op::Min, Type::U32, sec, sec, kv_pairs);
  Reg group = e.op(Op::Div, Type::U32, heads, heads_kv);
  return e.op(Op::MulLo, Type::U32, sec, group);
}

TileScheduler::Item in_sections(Emitter &e, Reg l, Reg m_blocks, Reg pairs, Reg sec_heads,
                                Reg reverse) {
  ptx::Builder &b = e.b;
  Reg sec_tiles = e.op(Op::MulLo, Type::U32, sec_heads, m_blocks);
  Reg sec = e.op(Op::Div, Type::U32, l, sec_tiles);
  Reg r = e.op(Op::Sub, Type::U32, l, e.op(Op::MulLo, Type::U32, sec, sec_tiles));
  Reg start = e.op(Op::MulLo, Type::U32, sec, sec_heads);
  // This section's pairs: sec_heads, fewer in the last section.
  Reg cur = e.op(Op::Min, Type::U32, sec_heads, e.op(Op::Sub, Type::U32, pairs, start));
  Reg mi = e.op(Op::Div, Type::U32, r, cur);
  TileScheduler::Item it;
  it.head = e.op(Op::Sub, Type::U32, r, e.op(Op::MulLo, Type::U32, mi, cur));  // the pair
  b.op(Op::Add, Type::U32, it.head, it.head, start);
  Reg last = e.op(Op::Sub, Type::U32, m_blocks, imm(1));
  it.m_block = e.selp(Type::U32, e.op(Op::Sub, Type::U32, last, mi), mi, reverse);
  return it;
}

}  // namespace

WorkItem Schedule::decode(int64_t t) const {
  int64_t bh = 0;
  WorkItem w =
      in_sections(t, m_blocks, int64_t(heads) * batch, section * (heads / heads_kv), reverse, &bh);
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
  s.section = section_kv_heads(seqlen_k, kv_row_bytes, int64_t(heads_kv) * batch);
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
  sec_heads_ = section_heads(e, seqlen_k, heads, heads_kv, kv_pairs, kv_row_bytes);
  reverse_ = e.setp(Cmp::Le, Type::S32, wr, wl);
  total_ = e.op(Op::MulLo, Type::U32, m_blocks_, pairs_);
}

TileScheduler::Item TileScheduler::decode(Reg t) const {
  Item it = in_sections(e_, t, m_blocks_, pairs_, sec_heads_, reverse_);
  Reg bh = it.head;
  it.batch = e_.op(Op::Div, Type::U32, bh, heads_);
  it.head = e_.op(Op::Sub, Type::U32, bh, e_.op(Op::MulLo, Type::U32, it.batch, heads_));
  return it;
}

// ---- by work ----

WorkItem WorkSchedule::decode(int64_t t) const {
  const int64_t g = t / heads;
  // The sequence: the last b with prefix[b] <= g (prefix[b + 1] > g).
  const int b =
      static_cast<int>(std::upper_bound(prefix.begin(), prefix.end(), g) - prefix.begin()) - 1;
  const int64_t base = prefix[size_t(b)], n = prefix[size_t(b) + 1] - base;
  int64_t head = 0;
  WorkItem w =
      in_sections(t - base * heads, n, heads, section * (heads / heads_kv), reverse, &head);
  w.head = static_cast<int>(head);
  w.batch = b;
  return w;
}

WorkSchedule make_work_schedule(const std::vector<int64_t> &seqlens_q, int64_t seqlen_q,
                                int64_t seqlen_k, int heads, int heads_kv, int64_t wl, int64_t wr,
                                int block_m, int kv_row_bytes) {
  WorkSchedule s;
  s.heads = heads;
  s.heads_kv = heads_kv;
  s.batch = static_cast<int>(seqlens_q.size());
  s.section = section_kv_heads(seqlen_k, kv_row_bytes, heads_kv);
  s.reverse = wr <= wl;
  s.by_work = s.batch <= kWorkBatchMax;
  const int64_t padded = (seqlen_q + block_m - 1) / block_m;
  s.prefix.assign(1, 0);
  for (int64_t len : seqlens_q) {
    len = std::min(std::max<int64_t>(len, 0), seqlen_q);
    s.prefix.push_back(s.prefix.back() + (s.by_work ? (len + block_m - 1) / block_m : padded));
  }
  return s;
}

void build_work_prefix(Emitter &e, Reg prefix, Reg cu_seqlens_q, Reg seqlen_q, Reg batch, Reg lane,
                       int block_m) {
  ptx::Builder &b = e.b;
  b.comment("varlen by work: the m-block prefix of the batch, 32 sequences a step");
  Reg carry = e.mov(Type::U32, imm(0));
  Reg i = e.mov(Type::U32, lane);  // this lane's sequence
  Reg in = b.pred(), up = b.pred();
  Reg q0 = b.b32(), q1 = b.b32(), x = b.b32(), y = b.b32();
  ptx::Label top = b.label(), done = b.label();
  b.bind(top);
  // Warp-uniform: i - lane is the step's first sequence.
  b.when(e.setp(Cmp::Ge, Type::S32, e.op(Op::Sub, Type::U32, i, lane), batch)).bra(done);
  b.setp(Cmp::Lt, Type::S32, in, i, batch);
  b.mov(Type::U32, q0, imm(0));
  b.mov(Type::U32, q1, imm(0));
  Reg a = e.index(cu_seqlens_q, i, 4);
  b.when(in).ld(Space::Global, Type::S32, q0, at(a), true);
  b.when(in).ld(Space::Global, Type::S32, q1, at(a, 4), true);
  // forward_bases' length: clamped to [0, seqlen_q]; zero past the batch.
  b.op(Op::Add, Type::U32, x, seq_len(e, q0, q1, seqlen_q), imm(block_m - 1));
  b.op(Op::Div, Type::U32, x, x, imm(block_m));
  for (int d = 1; d < 32; d *= 2) {
    b.shfl(ptx::Shfl::Up, y, x, imm(d), imm(0), 0xffffffffu);
    b.setp(Cmp::Ge, Type::U32, up, lane, imm(d));
    b.when(up).op(Op::Add, Type::U32, x, x, y);
  }
  b.op(Op::Add, Type::U32, y, x, carry);
  Reg dst = e.op(Op::MadLo, Type::U32, i, imm(4), prefix);
  b.when(in).st(Space::Shared, Type::U32, at(dst, 4), y);
  b.shfl(ptx::Shfl::Idx, y, x, imm(31), imm(31), 0xffffffffu);
  b.op(Op::Add, Type::U32, carry, carry, y);
  b.op(Op::Add, Type::U32, i, i, imm(32));
  b.bra(top);
  b.bind(done);
  Reg zero = e.mov(Type::U32, imm(0));
  b.when(e.setp(Cmp::Eq, Type::U32, lane, imm(0))).st(Space::Shared, Type::U32, at(prefix), zero);
}

WorkScheduler::WorkScheduler(Emitter &e, Reg prefix, Reg seqlen_q, Reg seqlen_k, Reg heads,
                             Reg heads_kv, Reg batch, Reg wl, Reg wr, int block_m, int kv_row_bytes)
    : e_(e), prefix_(prefix), heads_(heads), batch_(batch) {
  ptx::Builder &b = e.b;
  m_blocks_ = e.op(Op::Add, Type::U32, seqlen_q, imm(block_m - 1));
  b.op(Op::Div, Type::U32, m_blocks_, m_blocks_, imm(block_m));
  sec_heads_ = section_heads(e, seqlen_k, heads, heads_kv, heads_kv, kv_row_bytes);
  reverse_ = e.setp(Cmp::Le, Type::S32, wr, wl);
  by_work_ = e.setp(Cmp::Le, Type::S32, batch, imm(kWorkBatchMax));
  // The prefix's last entry (its bound kept in range for the fallback).
  Reg last = b.b32();
  Reg bl = e.op(Op::Min, Type::S32, batch, imm(kWorkBatchMax));
  b.ld(Space::Shared, Type::U32, last, at(e.op(Op::MadLo, Type::U32, bl, imm(4), prefix)));
  Reg n = e.selp(Type::U32, last, e.op(Op::MulLo, Type::U32, m_blocks_, batch), by_work_);
  total_ = e.op(Op::MulLo, Type::U32, n, heads);
}

TileScheduler::Item WorkScheduler::decode(Reg t) const {
  ptx::Builder &b = e_.b;
  Reg g = e_.op(Op::Div, Type::U32, t, heads_);
  Reg seq = b.b32(), base = b.b32(), n = b.b32();
  ptx::Label pad = b.label(), found = b.label(), done = b.label(), top = b.label();
  b.unless(by_work_).bra(pad);
  b.comment("varlen by work: the item's sequence, a binary search of the prefix");
  // prefix[lo] <= g < prefix[hi]
  Reg lo = e_.mov(Type::U32, imm(0)), hi = e_.mov(Type::U32, batch_);
  Reg mid = b.b32(), v = b.b32(), p = b.pred();
  b.bind(top);
  b.when(e_.setp(Cmp::Le, Type::U32, e_.op(Op::Sub, Type::U32, hi, lo), imm(1))).bra(found);
  b.op(Op::Add, Type::U32, mid, lo, hi);
  b.op(Op::Shr, Type::U32, mid, mid, imm(1));
  b.ld(Space::Shared, Type::U32, v, at(e_.op(Op::MadLo, Type::U32, mid, imm(4), prefix_)));
  b.setp(Cmp::Le, Type::U32, p, v, g);
  b.selp(Type::U32, lo, mid, lo, p);
  b.selp(Type::U32, hi, hi, mid, p);
  b.bra(top);
  b.bind(found);
  b.mov(Type::U32, seq, lo);
  Reg at_lo = e_.op(Op::MadLo, Type::U32, lo, imm(4), prefix_);
  b.ld(Space::Shared, Type::U32, base, at(at_lo));
  b.ld(Space::Shared, Type::U32, n, at(at_lo, 4));
  b.op(Op::Sub, Type::U32, n, n, base);
  b.bra(done);
  b.bind(pad);
  b.op(Op::Div, Type::U32, seq, g, m_blocks_);
  b.op(Op::MulLo, Type::U32, base, seq, m_blocks_);
  b.mov(Type::U32, n, m_blocks_);
  b.bind(done);
  Reg l = e_.op(Op::Sub, Type::U32, t, e_.op(Op::MulLo, Type::U32, base, heads_));
  TileScheduler::Item it = in_sections(e_, l, n, heads_, sec_heads_, reverse_);
  it.batch = seq;
  return it;
}

}  // namespace fa::kgen::tile

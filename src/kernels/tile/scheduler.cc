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

// A u32 product of the item numbering: every factor and the product is at
// most the launch's item count, which the runtime keeps below 2^31
// (Runtime::forward_spec), so it cannot wrap. The comment line before it
// tells test_index_arith so (its one exemption from "products of run-time
// values in 64 bits").
Reg items_mul(Emitter &e, Reg a, Reg b) {
  e.b.comment(kItemsProduct);
  return e.op(Op::MulLo, Type::U32, a, b);
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
  return items_mul(e, sec, group);
}

TileScheduler::Item in_sections(Emitter &e, Reg l, Reg m_blocks, Reg pairs, Reg sec_heads,
                                Reg reverse) {
  ptx::Builder &b = e.b;
  Reg sec_tiles = items_mul(e, sec_heads, m_blocks);
  Reg sec = e.op(Op::Div, Type::U32, l, sec_tiles);
  Reg r = e.op(Op::Sub, Type::U32, l, items_mul(e, sec, sec_tiles));
  Reg start = items_mul(e, sec, sec_heads);
  // This section's pairs: sec_heads, fewer in the last section.
  Reg cur = e.op(Op::Min, Type::U32, sec_heads, e.op(Op::Sub, Type::U32, pairs, start));
  Reg mi = e.op(Op::Div, Type::U32, r, cur);
  TileScheduler::Item it;
  it.head = e.op(Op::Sub, Type::U32, r, items_mul(e, mi, cur));  // the pair
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
  pairs_ = items_mul(e, heads, batch);
  Reg kv_pairs = items_mul(e, heads_kv, batch);
  sec_heads_ = section_heads(e, seqlen_k, heads, heads_kv, kv_pairs, kv_row_bytes);
  reverse_ = e.setp(Cmp::Le, Type::S32, wr, wl);
  total_ = items_mul(e, m_blocks_, pairs_);
}

TileScheduler::Item TileScheduler::decode(Reg t) const {
  Item it = in_sections(e_, t, m_blocks_, pairs_, sec_heads_, reverse_);
  Reg bh = it.head;
  it.batch = e_.op(Op::Div, Type::U32, bh, heads_);
  it.head = e_.op(Op::Sub, Type::U32, bh, items_mul(e_, it.batch, heads_));
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
                                int block_m, int kv_row_bytes, int cap) {
  WorkSchedule s;
  s.heads = heads;
  s.heads_kv = heads_kv;
  s.batch = static_cast<int>(seqlens_q.size());
  s.section = section_kv_heads(seqlen_k, kv_row_bytes, heads_kv);
  s.reverse = wr <= wl;
  s.by_work = s.batch <= cap;
  const int64_t padded = (seqlen_q + block_m - 1) / block_m;
  s.prefix.assign(1, 0);
  for (int64_t len : seqlens_q) {
    len = std::min(std::max<int64_t>(len, 0), seqlen_q);
    s.prefix.push_back(s.prefix.back() + (s.by_work ? (len + block_m - 1) / block_m : padded));
  }
  return s;
}

void build_work_prefix(Emitter &e, Reg prefix, Reg cu_seqlens_q, Reg seqlen_q, Reg batch, Reg lane,
                       int block_m, int cap) {
  ptx::Builder &b = e.b;
  b.comment("varlen by work: the m-block prefix of the batch, 32 sequences a step");
  Reg zero = e.mov(Type::U32, imm(0));
  b.when(e.setp(Cmp::Eq, Type::U32, lane, imm(0))).st(Space::Shared, Type::U32, at(prefix), zero);
  Reg carry = e.mov(Type::U32, imm(0));
  Reg in = b.pred(), up = b.pred();
  Reg q0 = b.b32(), q1 = b.b32(), x = b.b32(), y = b.b32();
  ptx::Label done = b.label();
  // Unrolled (cap / 32 steps, each left when the batch ends): a loop here
  // made ptxas spill in the persistent kernel's item loops.
  for (int step = 0; step * 32 < cap; ++step) {
    b.when(e.setp(Cmp::Le, Type::S32, batch, imm(32 * step))).bra(done);
    Reg i = e.op(Op::Add, Type::U32, lane, imm(32 * step));  // this lane's sequence
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
  }
  b.bind(done);
}

WorkScheduler::WorkScheduler(Emitter &e, Reg prefix, Reg seqlen_q, Reg seqlen_k, Reg heads,
                             Reg heads_kv, Reg batch, Reg wl, Reg wr, int block_m, int kv_row_bytes,
                             int cap)
    : e_(e),
      prefix_(prefix),
      seqlen_q_(seqlen_q),
      seqlen_k_(seqlen_k),
      heads_(heads),
      heads_kv_(heads_kv),
      batch_(batch),
      wl_(wl),
      wr_(wr),
      block_m_(block_m),
      kv_row_bytes_(kv_row_bytes),
      cap_(cap) {
  // Only the total here: decode derives the rest after its search (the
  // gather producer runs it in 56 registers).
  ptx::Builder &b = e.b;
  Reg by_work = e.setp(Cmp::Le, Type::S32, batch, imm(cap));
  // The prefix's last entry (its index kept in range for the fallback).
  Reg last = b.b32();
  Reg bl = e.op(Op::Min, Type::S32, batch, imm(cap));
  b.ld(Space::Shared, Type::U32, last, at(e.op(Op::MadLo, Type::U32, bl, imm(4), prefix)));
  Reg n = e.selp(Type::U32, last, items_mul(e, m_blocks(), batch), by_work);
  total_ = items_mul(e, n, heads);
}

Reg WorkScheduler::m_blocks() const {
  Reg m = e_.op(Op::Add, Type::U32, seqlen_q_, imm(block_m_ - 1));
  e_.b.op(Op::Div, Type::U32, m, m, imm(block_m_));
  return m;
}

TileScheduler::Item WorkScheduler::decode(Reg t) const {
  ptx::Builder &b = e_.b;
  Reg g = e_.op(Op::Div, Type::U32, t, heads_);
  Reg seq = b.b32(), base = b.b32(), n = b.b32();
  ptx::Label pad = b.label(), done = b.label();
  b.when(e_.setp(Cmp::Gt, Type::S32, batch_, imm(cap_))).bra(pad);
  b.comment("varlen by work: the item's sequence, a binary search of the prefix");
  // The last b with prefix[b] <= g (then prefix[b + 1] > g, as g < the
  // total): power-of-two steps from the largest <= cap down, unrolled (no
  // loop nested in the item loop), entries past the batch never read.
  Reg lo = e_.mov(Type::U32, imm(0));
  Reg v = b.b32(), p = b.pred(), q = b.pred();
  int top_step = 1;
  while (top_step * 2 <= cap_) top_step *= 2;
  for (int step = top_step; step >= 1 && cap_ > 0; step /= 2) {
    Reg next = e_.op(Op::Add, Type::U32, lo, imm(step));
    b.setp(Cmp::Le, Type::U32, p, next, batch_);
    Reg a =
        e_.op(Op::MadLo, Type::U32, e_.op(Op::Min, Type::U32, next, imm(cap_)), imm(4), prefix_);
    b.ld(Space::Shared, Type::U32, v, at(a));
    b.setp(Cmp::Le, Type::U32, q, v, g);
    b.op(Op::And, Type::Pred, p, p, q);
    b.selp(Type::U32, lo, next, lo, p);
  }
  b.mov(Type::U32, seq, lo);
  Reg at_lo = e_.op(Op::MadLo, Type::U32, lo, imm(4), prefix_);
  b.ld(Space::Shared, Type::U32, base, at(at_lo));
  b.ld(Space::Shared, Type::U32, n, at(at_lo, 4));
  b.op(Op::Sub, Type::U32, n, n, base);
  b.bra(done);
  b.bind(pad);
  b.mov(Type::U32, n, m_blocks());
  b.op(Op::Div, Type::U32, seq, g, n);
  b.mov(Type::U32, base, items_mul(e_, seq, n));
  b.bind(done);
  Reg l = e_.op(Op::Sub, Type::U32, t, items_mul(e_, base, heads_));
  Reg sec_heads = section_heads(e_, seqlen_k_, heads_, heads_kv_, heads_kv_, kv_row_bytes_);
  TileScheduler::Item it =
      in_sections(e_, l, n, heads_, sec_heads, e_.setp(Cmp::Le, Type::S32, wr_, wl_));
  it.batch = seq;
  return it;
}

TileScheduler::Item persistent_item(Emitter &e, Reg t, ptx::Label past_last, Reg prefix,
                                    Reg seqlen_q, Reg seqlen_k, Reg heads, Reg heads_kv, Reg batch,
                                    Reg wl, Reg wr, int block_m, int kv_row_bytes, int cap) {
  if (prefix.valid()) {
    const WorkScheduler sched(e, prefix, seqlen_q, seqlen_k, heads, heads_kv, batch, wl, wr,
                              block_m, kv_row_bytes, cap);
    e.b.when(e.setp(Cmp::Ge, Type::U32, t, sched.total())).bra(past_last);
    return sched.decode(t);
  }
  const TileScheduler sched(e, seqlen_q, seqlen_k, heads, heads_kv, batch, wl, wr, block_m,
                            kv_row_bytes);
  e.b.when(e.setp(Cmp::Ge, Type::U32, t, sched.total())).bra(past_last);
  return sched.decode(t);
}

void retire_dynamic(Emitter &e, Reg ws) {
  ptx::Builder &b = e.b;
  Reg old = b.b32();
  b.atom_add(true, Type::U32, old, at(ws, 4), imm(1));
  Reg last = e.op(Op::Sub, Type::U32, e.mov(Type::U32, ptx::sreg(ptx::Special::NctaidX)), imm(1));
  Reg zero = e.mov(Type::U32, imm(0));
  Reg is_last = e.setp(Cmp::Eq, Type::U32, old, last);
  b.when(is_last).st(ptx::Space::Global, Type::U32, at(ws, 0), zero);
  b.when(is_last).st(ptx::Space::Global, Type::U32, at(ws, 4), zero);
}

}  // namespace fa::kgen::tile

// The sm_90 state of a CTA (emu/sm90.h). docs/emulator.md, "Hopper
// (sm_90a)", has the model and its sources in the PTX ISA.
#include "emu/sm90.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "emu/atomic.h"
#include "emu/cluster.h"
#include "emu/numeric.h"
#include "emu/sm100.h"
#include "emu/smem_matrix.h"
#include "emu/tensor_map.h"

namespace fa {
namespace emu {
namespace {

inline float F(uint64_t v) { return bits_f32(static_cast<uint32_t>(v)); }
inline uint64_t FB(float f) { return f32_bits(f); }

// Shared address of byte offset `off` of a box at the swizzle-aligned dst:
// 16-byte chunk bits [4, 4+bits) XOR bits [7, 7+bits) (PTX ISA "Swizzling
// Modes"; Swizzle<bits,4,3>).
inline uint32_t swizzle_addr(uint32_t addr, uint32_t bits) {
  if (!bits) return addr;
  return addr ^ (((addr >> 7) & ((1u << bits) - 1)) << 4);
}

// Row rr (0 .. box elements / box[0]) of the box at coordinates c of map:
// the part of it inside the tensor (PTX ISA "Tensors": tiled mode, bounding
// box, out-of-bound access) is *bytes at global *src, at byte *at of the box
// laid out row-major. False: the row lies wholly outside the tensor.
inline bool box_row(const TensorMap &map, const int64_t *c, uint64_t rr, uint64_t *src,
                    uint64_t *at, uint64_t *bytes) {
  uint64_t q = rr, off = 0;
  for (uint32_t d = 1; d < map.rank; ++d) {
    const int64_t x = c[d] + static_cast<int64_t>(q % map.box[d]);
    q /= map.box[d];
    if (x < 0 || x >= static_cast<int64_t>(map.dims[d])) return false;
    off += static_cast<uint64_t>(x) * map.strides[d];
  }
  const int64_t x0 = std::max<int64_t>(c[0], 0);
  const int64_t x1 = std::min<int64_t>(c[0] + map.box[0], static_cast<int64_t>(map.dims[0]));
  if (x1 <= x0) return false;
  const uint64_t eb = map.elem_bytes;
  *src = map.base + off + static_cast<uint64_t>(x0) * eb;
  *at = rr * map.box[0] * eb + static_cast<uint64_t>(x0 - c[0]) * eb;
  *bytes = static_cast<uint64_t>(x1 - x0) * eb;
  return true;
}

// Byte address in shared memory of element (mn, k) of a wgmma operand
// (emu/smem_matrix.h: the canonical layouts).
inline uint32_t wgmma_elem_addr(uint64_t desc, bool mn_major, uint32_t mn, uint32_t k,
                                uint32_t esz) {
  return smem_matrix_addr(wgmma_smem_matrix(desc), mn_major, mn, k, esz);
}

// Element bytes of a wgmma's A and B (1 for the fp8 forms, else 2) and its K
// (32 / bytes: m64nNk32 for fp8, m64nNk16 for f16 / bf16).
inline uint32_t wgmma_esz(const Inst &in) { return (in.flags & kWgFp8) ? 1 : 2; }

}  // namespace

Sm90State::Sm90State(Cta &cta) : cta_(cta) {
  const Entry &e = cta_.e_;
  for (const Inst &in : e.code)
    if (is_warpgroup_collective(in.op)) has_wg_ = true;
  if (has_wg_) {
    wgs_.resize((cta_.nthreads_ + 127) / 128);
    pend_.assign(static_cast<size_t>(cta_.nthreads_) * cta_.ns_, 0);
    pend_count_.assign(cta_.nthreads_, 0);
    chunk_reads_.assign(cta_.smem_size_ / 16 + 1, 0);
  }
  for (const Inst &in : e.code) {
    // Async-proxy readers of shared memory: wgmma operands, bulk reduction sources.
    const bool bulk = in.op == Op::kBulkReduce || in.op == Op::kBulkTensorReduce;
    has_bulk_ = has_bulk_ || bulk;
    if (in.op == Op::kWgmma || bulk) track_proxy_ = e.code.size() < (1u << (32 - kProxyTidBits));
  }
  if (has_bulk_) bulk_chunk_.assign(cta_.smem_size_ / 16 + 1, 0);
  if (track_proxy_) {
    unfenced_.assign(cta_.smem_size_ + 16, 0);
    proxy_writes_.resize(cta_.nthreads_);
  }
}

void Sm90State::reset_block() {
  mbars_.clear();
  if (has_wg_) {
    for (Warpgroup &g : wgs_) g.clear();
    std::fill(pend_.begin(), pend_.end(), 0);
    std::fill(pend_count_.begin(), pend_count_.end(), 0);
    std::fill(chunk_reads_.begin(), chunk_reads_.end(), 0);
  }
  if (proxy_dirty_) {
    std::fill(unfenced_.begin(), unfenced_.end(), 0);
    for (ProxyWrites &w : proxy_writes_) w.clear();
    proxy_dirty_ = false;
  }
  for (BulkQueue &q : bulkq_) q = BulkQueue();
  if (bulk_reading_) std::fill(bulk_chunk_.begin(), bulk_chunk_.end(), 0);
  bulk_reading_ = 0;
}

Step Sm90State::exec(uint32_t t, uint32_t pc, uint64_t *r) {
  switch (cta_.e_.code[pc].op) {
    case Op::kMbarInit:
      return mbar_init(t, pc, r) ? Step::kNext : Step::kFault;
    case Op::kMbarInval:
      return mbar_inval(t, pc, r) ? Step::kNext : Step::kFault;
    case Op::kMbarArrive:
      return mbar_arrive(t, pc, r) ? Step::kNext : Step::kFault;
    case Op::kMbarTryWait: {  // an incomplete phase: the thread waits for it
      const int rc = mbar_try_wait(t, pc, r);
      return rc == 0 ? Step::kFault : rc == 2 ? Step::kBlock : Step::kNext;
    }
    case Op::kBulkTensor:
      return bulk_tensor(t, pc, r) ? Step::kNext : Step::kFault;
    case Op::kBulkReduce:
      return bulk_reduce(t, pc, r) ? Step::kNext : Step::kFault;
    case Op::kBulkTensorReduce:
      return bulk_tensor_reduce(t, pc, r) ? Step::kNext : Step::kFault;
    case Op::kBulkCommit:
      if (bulkq_.empty()) bulkq_.resize(cta_.nthreads_);
      bulkq_[t].group_end.push_back(bulkq_[t].ops.size());
      return Step::kNext;
    case Op::kBulkWait:  // .read and not: the emulator retires the ops alike
      return bulk_wait(t, static_cast<size_t>(cta_.e_.code[pc].imm)) ? Step::kNext : Step::kFault;
    case Op::kFenceProxyAsync:
      if (track_proxy_) proxy_fence(t);
      return Step::kNext;
    case Op::kFenceMbarInit:
      publish_inits(t);
      return Step::kNext;
    default:
      cta_.fail_at(pc, t, "not an sm_90 per-thread op (emulator bug: emu/ops.def handler)");
      return Step::kFault;
  }
}
// ------------------------------------------------------------ proxies ----
// PTX ISA "Memory Consistency Model" (proxies; proxy fences) and
// "membar/fence": shared memory written through the generic proxy (st,
// stmatrix, cp.async) and read through the async proxy (wgmma operands)
// needs a fence.proxy.async in between. Model: the writing thread's own
// fence, after its write, clears its marks; async-proxy writes (TMA) clear
// the bytes they write; wgmma_issue checks its operand bytes.

// Thread t's generic-proxy write of [addr, addr + n) by the instruction at pc.
void Sm90State::proxy_mark(uint32_t t, uint32_t pc, uint32_t addr, uint32_t n) {
  std::fill_n(unfenced_.data() + addr, n, pc << kProxyTidBits | (t + 1));
  ProxyWrites &w = proxy_writes_[t];
  if (w.segs.size() < kProxySegs)
    w.segs.push_back(addr | uint64_t{n} << 32);
  else
    w.overflow = true;
  w.lo = std::min(w.lo, addr);
  w.hi = std::max(w.hi, addr + n);
  proxy_dirty_ = true;
}

// fence.proxy.async by thread t: its generic writes so far are ordered
// before later async-proxy accesses.
void Sm90State::proxy_fence(uint32_t t) {
  ProxyWrites &w = proxy_writes_[t];
  const uint32_t me = t + 1, mask = (1u << kProxyTidBits) - 1;
  auto clear = [&](uint32_t a, uint32_t n) {
    uint32_t *u = unfenced_.data() + a;
    for (uint32_t i = 0; i < n; ++i)
      if ((u[i] & mask) == me) u[i] = 0;
  };
  if (w.overflow) {
    if (w.hi > w.lo) clear(w.lo, w.hi - w.lo);
  } else {
    for (uint64_t sg : w.segs) clear(static_cast<uint32_t>(sg), static_cast<uint32_t>(sg >> 32));
  }
  w.clear();
}

// A generic st: marks it when it lands in the shared window.
void Sm90State::generic_store_hook(uint32_t t, uint32_t pc, const uint8_t *p, uint32_t n) {
  const uint8_t *s0 = cta_.smem_.data();
  if (p >= s0 && p < s0 + cta_.smem_size_) proxy_mark(t, pc, static_cast<uint32_t>(p - s0), n);
}

// The unfenced generic write of shared byte a (0: none) as an error text:
// "st.shared.v4.u32 at PTX line N (thread ...)".
std::string Sm90State::proxy_writer_text(uint32_t v) const {
  const uint32_t pc = v >> kProxyTidBits, t = (v & ((1u << kProxyTidBits) - 1)) - 1;
  return cta_.e_.op_text[pc] + " at PTX line " + std::to_string(cta_.e_.code[pc].line) + " (" +
         cta_.thread_text(t) + ")";
}
// ------------------------------------------------------------ mbarrier ----

Sm90State::Mbarrier *Sm90State::find_mbar(uint32_t addr) {
  for (Mbarrier &m : mbars_)
    if (m.addr == addr) return &m;
  return nullptr;
}

// The mbarrier operand [a + imm] of the instruction at pc: 8-byte aligned,
// inside shared memory, an initialized mbarrier. nullptr: fault (cta_.error_ set).
Sm90State::Mbarrier *Sm90State::mbar_operand(uint32_t t, uint32_t pc, const uint64_t *r) {
  const Inst &in = cta_.e_.code[pc];
  const int64_t addr = static_cast<int64_t>(static_cast<uint32_t>(r[in.a])) + in.imm;
  if (!cta_.shared_ptr(addr, 8, t, pc)) return nullptr;
  Mbarrier *m = find_mbar(static_cast<uint32_t>(addr));
  if (!m)
    cta_.fail_at(pc, t, "no initialized mbarrier at shared address 0x%x (mbarrier.init first)",
                 static_cast<uint32_t>(addr));
  return m;
}

bool Sm90State::mbar_init(uint32_t t, uint32_t pc, const uint64_t *r) {
  const Inst &in = cta_.e_.code[pc];
  const int64_t addr = static_cast<int64_t>(static_cast<uint32_t>(r[in.a])) + in.imm;
  if (!cta_.shared_ptr(addr, 8, t, pc)) return false;
  const Mbarrier *m = find_mbar(static_cast<uint32_t>(addr));
  if (m)
    return cta_.fail_at(pc, t,
                        "shared 0x%x already holds a valid mbarrier (initialized at PTX line %u); "
                        "mbarrier.inval it first",
                        static_cast<uint32_t>(addr), m->init_line);
  const uint32_t count = static_cast<uint32_t>(r[cta_.e_.code[pc].b]);
  if (count == 0 || count > (1u << 20) - 1)
    return cta_.fail_at(pc, t, "count %u is outside 1..2^20-1", count);
  Mbarrier nm;
  nm.addr = static_cast<uint32_t>(addr);
  nm.expected = nm.pending = count;
  nm.init_line = cta_.e_.code[pc].line;
  if (track_seen_) nm.seen.assign(cta_.nthreads_, 0);
  nm.init_thread = t;
  mbars_.push_back(std::move(nm));
  return true;
}

bool Sm90State::mbar_inval(uint32_t t, uint32_t pc, const uint64_t *r) {
  Mbarrier *m = mbar_operand(t, pc, r);
  if (!m) return false;
  if (!m->copies.empty() || m->tx != 0)
    return cta_.fail_at(pc, t,
                        "the mbarrier at shared 0x%x still tracks copies (tx-count %" PRId64 ")",
                        m->addr, m->tx);
  mbars_.erase(mbars_.begin() + (m - mbars_.data()));
  return true;
}

// ------------------------------------------------ mbarriers of the cluster ----
// PTX ISA "mbarrier" (an mbarrier in shared::cluster: remote arrive-on and
// complete-tx), "fence.mbarrier_init", "barrier.cluster"; docs/emulator.md,
// "Clusters". Another CTA may use an mbarrier only once its init is visible
// to the cluster: the initializing thread's fence.mbarrier_init (or
// barrier.cluster.arrive.release), then a completed barrier.cluster phase.

void Sm90State::publish_inits(uint32_t t) {
  for (Mbarrier &m : mbars_)
    if (m.init_thread == t && m.visible_phase == UINT32_MAX)
      m.visible_phase = cta_.cluster_->bar_phase;
}

// The mbarrier at shared offset off of owner's CTA, used by thread t of this
// CTA (the instruction at pc). nullptr: fault (cta_.error_ set).
Sm90State::Mbarrier *Sm90State::mbar_of_cta(Sm90State &owner, uint32_t off, uint32_t t,
                                            uint32_t pc) {
  Mbarrier *m = owner.find_mbar(off);
  if (!m) {
    cta_.fail_at(pc, t, "no initialized mbarrier at shared 0x%x of CTA rank %u", off,
                 owner.cta_.rank_);
    return nullptr;
  }
  if (&owner != this &&
      !(m->visible_phase != UINT32_MAX && cta_.cluster_->bar_phase > m->visible_phase)) {
    cta_.fail_at(pc, t,
                 "the mbarrier at shared 0x%x of CTA rank %u (initialized at PTX line %u) is used "
                 "from CTA rank %u before its initialization is visible to the cluster: the "
                 "initializing thread's fence.mbarrier_init.release.cluster (or "
                 "barrier.cluster.arrive.release), then a completed barrier.cluster phase, must "
                 "come first (PTX ISA \"fence.mbarrier_init\")",
                 off, owner.cta_.rank_, m->init_line, cta_.rank_);
    return nullptr;
  }
  return m;
}

// The mbarrier operand [a + imm] of the instruction at pc as a
// shared::cluster address; *owner: the sm_90 state of its CTA.
Sm90State::Mbarrier *Sm90State::mbar_cluster_operand(uint32_t t, uint32_t pc, const uint64_t *r,
                                                     Sm90State **owner) {
  const Inst &in = cta_.e_.code[pc];
  const uint32_t addr = static_cast<uint32_t>(static_cast<uint32_t>(r[in.a]) + in.imm);
  uint32_t off;
  Cta *c = cta_.cluster_target(addr, 8, t, pc, &off);
  if (!c) return nullptr;
  *owner = cta_.cluster_->sm90[c->rank_];
  return mbar_of_cta(**owner, off, t, pc);
}

// Phase completion of owner's mbarrier m (this CTA's or another's), its
// fault reported as this CTA's.
bool Sm90State::complete_on(Sm90State &owner, Mbarrier &m, uint32_t t) {
  if (owner.mbar_maybe_complete(m, t)) return true;
  if (&owner != this) cta_.error_ = owner.cta_.error_;
  return false;
}

// mbarrier.arrive{.expect_tx} / mbarrier.expect_tx: expect-tx (tx-count +=
// txCount), then arrive-on (pending -= count), then maybe phase completion.
// kClusterSpace: the mbarrier is [a + imm] in shared::cluster.
bool Sm90State::mbar_arrive(uint32_t t, uint32_t pc, uint64_t *r) {
  const Inst &in = cta_.e_.code[pc];
  Sm90State *owner = this;
  Mbarrier *m =
      (in.flags & kClusterSpace) ? mbar_cluster_operand(t, pc, r, &owner) : mbar_operand(t, pc, r);
  if (!m) return false;
  if (in.c != kNoSlot) {
    const uint32_t tx = static_cast<uint32_t>(r[in.c]);
    if (tx > (1u << 20) - 1) return cta_.fail_at(pc, t, "tx count %u is outside 0..2^20-1", tx);
    m->tx += tx;
    if (m->tx > (1 << 20) - 1)
      return cta_.fail_at(pc, t,
                          "tx-count %" PRId64 " of the mbarrier at shared 0x%x exceeds 2^20-1",
                          m->tx, m->addr);
  }
  if (in.sub == 0) {  // arrive-on
    const uint32_t count = in.b == kNoSlot ? 1 : static_cast<uint32_t>(r[in.b]);
    if (in.d != kNoSlot) r[in.d] = m->phase;  // state: the phase before the arrival
    return arrive_on(*owner, *m, t, pc, count);
  }
  return complete_on(*owner, *m, t);
}

// Arrive-on (pending -= count) on owner's mbarrier m (this CTA's or, a
// remote arrive, another's), then maybe phase completion.
bool Sm90State::arrive_on(Sm90State &owner, Mbarrier &m, uint32_t t, uint32_t pc, uint32_t count) {
  if (count == 0 || count > (1u << 20) - 1)
    return cta_.fail_at(pc, t, "count %u is outside 1..2^20-1", count);
  if (!m.observed)
    return cta_.fail_at(pc, t,
                        "arrive-on in phase %u of the mbarrier at shared 0x%x before any try_wait "
                        "returned True for phase %u (PTX ISA \"Phase of the mbarrier object\")",
                        m.phase, m.addr, m.phase - 1);
  if (count > m.pending)
    return cta_.fail_at(pc, t,
                        "%u arrival(s) on the mbarrier at shared 0x%x, whose phase %u has %u "
                        "pending (expected count %u, tx-count %" PRId64 ")",
                        count, m.addr, m.phase, m.pending, m.expected, m.tx);
  m.pending -= count;
  return complete_on(owner, m, t);
}

bool Sm90State::async_arrive(uint32_t t, uint32_t pc, Sm90State &owner, uint32_t addr,
                             uint32_t *phase) {
  Mbarrier *m;
  if (&owner != this) {
    m = mbar_of_cta(owner, addr, t, pc);
    if (!m) return false;
  } else {
    if (!cta_.shared_ptr(addr, 8, t, pc)) return false;
    m = find_mbar(addr);
    if (!m)
      return cta_.fail_at(
          pc, t, "no initialized mbarrier at shared address 0x%x (mbarrier.init first)", addr);
  }
  *phase = m->phase;
  return arrive_on(owner, *m, t, pc, 1);
}

uint32_t Sm90State::observed(uint32_t t, uint32_t addr) const {
  for (const Mbarrier &m : mbars_)
    if (m.addr == addr) return m.seen.empty() ? 0 : m.seen[t];
  return 0;
}

// Phase completion (PTX ISA "Phase Completion of the mbarrier object"): no
// pending arrival and tx-count 0. The phase's bulk copies become visible,
// the waiting try_waits return True.
bool Sm90State::mbar_maybe_complete(Mbarrier &m, uint32_t t) {
  if (m.pending != 0 || m.tx != 0) return true;
  for (const BulkCopy &c : m.copies)
    if (!bulk_write(c, t)) return false;
  m.copies.clear();
  ++m.phase;
  m.pending = m.expected;
  m.observed = false;
  for (uint32_t u = 0; u < cta_.nthreads_; ++u) {
    if (cta_.state_[u] != ThreadState::kWaiting) continue;
    const Inst &o = cta_.e_.code[cta_.pc_[u]];
    if (o.op != Op::kMbarTryWait) continue;
    uint64_t *ru = cta_.regs_of(u);
    if (static_cast<uint32_t>(static_cast<uint32_t>(ru[o.a]) + o.imm) != m.addr) continue;
    ru[o.d] = 1;  // it waited for the parity of the phase that just completed
    if (!m.seen.empty()) m.seen[u] = m.phase;
    ++cta_.pc_[u];
    cta_.wake(u);
    m.observed = true;
  }
  return true;
}

// mbarrier.try_wait.parity: 1 = done (p set), 2 = the thread waits, 0 = fault.
int Sm90State::mbar_try_wait(uint32_t t, uint32_t pc, uint64_t *r) {
  const Inst &in = cta_.e_.code[pc];
  Mbarrier *m = mbar_operand(t, pc, r);
  if (!m) return 0;
  const uint32_t parity = static_cast<uint32_t>(r[in.b]);
  if (parity > 1) {
    cta_.fail_at(pc, t, "phaseParity %u is not 0 or 1", parity);
    return 0;
  }
  // Valid only for the current incomplete phase (False: wait) and the
  // immediately preceding one (True).
  if (parity == (m->phase & 1)) return 2;
  r[in.d] = 1;
  m->observed = true;
  if (!m->seen.empty()) m->seen[t] = m->phase;
  return 1;
}

// ------------------------------------------------ cp.async.bulk.tensor ----
// PTX ISA "cp.async.bulk.tensor" (tile mode), "Tensors: Tiled Mode" (bounding
// box, zero fill out of bounds), "Swizzling Modes"; the map is the
// emulator's (emu/tensor_map.h). The box is read at issue, laid out row-major
// by box in shared memory, and written when its mbarrier phase completes;
// its complete-tx (the whole box's bytes) is performed at issue.

// The tensor map at generic address ga, for an instruction with dims
// coordinates: 128 bytes, 64-byte aligned, in the parameter block or
// global memory; rank, element size, base, box, strides and swizzle
// checked. False: fault (error set).
bool Sm90State::tensor_map_operand(uint32_t t, uint32_t pc, uint64_t ga, uint32_t dims,
                                   TensorMap *out) {
  const uint64_t p0 = reinterpret_cast<uint64_t>(cta_.sh_.params);
  const uint8_t *mp = nullptr;
  if (ga & 63)
    return cta_.fail_at(pc, t, "tensor map address 0x%" PRIx64 " is not 64-byte aligned", ga);
  if (ga >= p0 && ga + 128 <= p0 + cta_.sh_.param_size) {
    mp = reinterpret_cast<const uint8_t *>(ga);
  } else {
    uint64_t b, e;
    if (!cta_.sh_.mem->find_locked(ga, 128, &b, &e))
      return cta_.fail_at(pc, t,
                          "tensor map address 0x%" PRIx64
                          " is neither in the parameter block nor in a global allocation",
                          ga);
    mp = reinterpret_cast<const uint8_t *>(ga);
  }
  TensorMap &map = *out;
  if (!load_tensor_map(mp, &map))
    return cta_.fail_at(pc, t, "no tensor map at 0x%" PRIx64 " (magic 0x%08x, rank %u)", ga,
                        map.magic, map.rank);
  if (map.rank != dims)
    return cta_.fail_at(pc, t, "the tensor map has rank %u, the instruction %u", map.rank, dims);
  const uint32_t eb = map.elem_bytes;
  if (eb != 1 && eb != 2 && eb != 4 && eb != 8)
    return cta_.fail_at(pc, t, "tensor map element size %u", eb);
  if (map.base & 15)
    return cta_.fail_at(pc, t, "tensor map base 0x%" PRIx64 " is not 16-byte aligned", map.base);
  for (uint32_t d = 0; d < dims; ++d) {
    if (map.box[d] < 1 || map.box[d] > 256)
      return cta_.fail_at(pc, t, "box[%u] = %u is outside 1..256", d, map.box[d]);
    if (map.dims[d] < 1) return cta_.fail_at(pc, t, "tensor dimension %u is empty", d);
    if (d > 0 && (map.strides[d] & 15))
      return cta_.fail_at(pc, t, "tensor stride[%u] = %" PRIu64 " is not a multiple of 16", d,
                          map.strides[d]);
  }
  const uint32_t row = map.box[0] * eb;
  if (row % 16)
    return cta_.fail_at(pc, t, "the box's inner dimension is %u bytes, not a multiple of 16", row);
  const uint32_t swz = static_cast<uint32_t>(map.swizzle);
  if (swz > 3) return cta_.fail_at(pc, t, "tensor map swizzle mode %u", swz);
  const uint32_t span = swz ? 16u << swz : 0;  // 32, 64, 128 bytes
  if (swz && row > span)
    return cta_.fail_at(pc, t, "the box's inner dimension (%u bytes) exceeds the %u-byte swizzle",
                        row, span);
  return true;
}

bool Sm90State::bulk_tensor(uint32_t t, uint32_t pc, uint64_t *r) {
  const Inst &in = cta_.e_.code[pc];
  const uint32_t dims = in.sub;
  const uint32_t *s = cta_.e_.operand_slots.data() + in.c;
  const Cluster &cl = *cta_.cluster_;
  // The destination and the mbarrier are shared::cluster addresses
  // (docs/emulator.md, "Clusters"): without .multicast::cluster both in one
  // CTA; with it, CTA-relative offsets used in every CTA of the ctaMask.
  const int64_t dst_raw = static_cast<int64_t>(static_cast<uint32_t>(r[in.a])) + in.imm;
  int64_t dst = dst_raw;
  uint32_t dst_rank = cta_.rank_;
  if (dst_raw >= (int64_t{1} << kClusterRankShift) && dst_raw <= int64_t{UINT32_MAX}) {
    dst_rank = static_cast<uint32_t>(dst_raw >> kClusterRankShift) - 1;
    dst = dst_raw & ((1 << kClusterRankShift) - 1);
    if (dst_rank >= cl.size)
      return cta_.fail_at(pc, t,
                          "destination shared::cluster address 0x%x names CTA rank %u, but the "
                          "cluster has %u CTAs",
                          static_cast<uint32_t>(dst_raw), dst_rank, cl.size);
  }
  const uint32_t ma_raw = static_cast<uint32_t>(static_cast<uint32_t>(r[s[dims]]) + r[s[dims + 1]]);
  uint32_t ma = 0;  // the mbarrier's offset
  const Cta *mc = cta_.cluster_target(ma_raw, 8, t, pc, &ma);
  if (!mc) return false;
  uint32_t mask = 1u << dst_rank;
  if (in.flags & kMulticast) {
    mask = static_cast<uint32_t>(r[s[dims + 2]]) & 0xffff;
    if (mask == 0 || (mask >> cl.size) != 0)
      return cta_.fail_at(pc, t, "ctaMask 0x%04x names no CTA or a rank outside the cluster's %u",
                          mask, cl.size);
  } else if (mc->rank_ != dst_rank) {
    return cta_.fail_at(pc, t,
                        "the mbarrier (CTA rank %u) is not in the destination's CTA (rank %u)",
                        mc->rank_, dst_rank);
  }
  const uint64_t ga = r[in.b];
  if (!cta_.dependency_met(t, pc)) return false;  // the box's global reads
  TensorMap map;
  if (!tensor_map_operand(t, pc, ga, dims, &map)) return false;
  const uint32_t eb = map.elem_bytes, row = map.box[0] * eb;
  uint64_t total = eb;
  for (uint32_t d = 0; d < dims; ++d) total *= map.box[d];
  const uint32_t swz = static_cast<uint32_t>(map.swizzle);
  const uint32_t span = swz ? 16u << swz : 0;  // 32, 64, 128 bytes
  const uint32_t align = swz ? span * 8 : 128;
  if (dst & (align - 1))
    return cta_.fail_at(pc, t, "destination shared address 0x%x is not %u-byte aligned%s",
                        static_cast<uint32_t>(dst), align,
                        swz ? " (the swizzle pattern's repeat)" : "");
  const uint64_t extent = swz ? (total + 127) / 128 * 128 : total;
  if (dst < 0 || dst + extent > cta_.smem_size_)
    return cta_.fail_at(pc, t,
                        "the %" PRIu64
                        "-byte box at shared 0x%x runs past the block's %u bytes of "
                        "shared memory",
                        total, static_cast<uint32_t>(dst), cta_.smem_size_);
  // Read the box (out-of-bounds elements are zeros).
  int64_t c[kTensorMapMaxRank] = {0, 0, 0, 0, 0};
  for (uint32_t d = 0; d < dims; ++d) c[d] = static_cast<int32_t>(r[s[d]]);
  BulkCopy copy;
  copy.dst = static_cast<uint32_t>(dst);
  copy.swizzle_bits = swz;
  copy.pc = pc;
  copy.data.assign(total, 0);
  const uint64_t rows = total / row;
  if (cta_.prof_) tma_rows_.clear();
  for (uint64_t rr = 0; rr < rows; ++rr) {
    uint64_t src, at, bytes;
    if (!box_row(map, c, rr, &src, &at, &bytes)) continue;
    if (!cta_.in_allocation(src, bytes))
      return cta_.fail_at(pc, t, "box row at global 0x%" PRIx64 " (%" PRIu64 " bytes) %s", src,
                          bytes, cta_.sh_.mem->describe_locked(src, bytes).c_str());
    std::memcpy(copy.data.data() + at, reinterpret_cast<const void *>(src), bytes);
    if (cta_.prof_) tma_rows_.push_back({0, static_cast<uint32_t>(bytes), src});
  }
  if (cta_.prof_ && !tma_rows_.empty()) {  // the bytes read inside the tensor (no zero fill)
    uint64_t sectors, used;
    cost_global(tma_rows_.data(), tma_rows_.size(), &sectors, &used);
    InstProfile &ip = cta_.inst_[pc];
    ++ip.global_requests;
    ip.global_sectors += sectors;
    ip.global_bytes += used;
  }
  // The box and its complete-tx go to each CTA of the mask, in rank order.
  uint32_t last = 31 - static_cast<uint32_t>(__builtin_clz(mask));
  if (g_cluster_bug == kClusterBugMulticastSkip && (mask & (mask - 1))) mask &= ~(1u << last--);
  for (uint32_t k = 0; k <= last; ++k) {
    if (!((mask >> k) & 1)) continue;
    Sm90State &owner = *cl.sm90[k];
    if (owner.cta_.done_) return cta_.fail_at(pc, t, "the destination CTA rank %u has exited", k);
    if (!bulk_deliver(owner, k == last ? std::move(copy) : copy, ma, t, pc, extent)) return false;
  }
  return true;
}

// One destination of a box: owner's CTA (this one or another of the
// cluster) takes the copy, and its mbarrier at mbar_off the complete-tx of
// the whole box; extent: the shared bytes the box covers from copy.dst.
bool Sm90State::bulk_deliver(Sm90State &owner, BulkCopy copy, uint32_t mbar_off, uint32_t t,
                             uint32_t pc, uint64_t extent) {
  // Into this CTA: the writes are the issuing thread t's (tcgen05 operands
  // it has not seen complete are an error now, whoever completes the phase).
  if (&owner == this && sm100_) {
    for (uint32_t off = 0; off < copy.data.size(); off += 16)
      if (!sm100_->shared_write(t, pc, swizzle_addr(copy.dst + off, copy.swizzle_bits), 16))
        return false;
    copy.checked = true;
  }
  Mbarrier *m = mbar_of_cta(owner, mbar_off, t, pc);
  if (!m) return false;
  for (const Mbarrier &o : owner.mbars_)
    if (o.addr + 8 > copy.dst && o.addr < copy.dst + extent)
      return cta_.fail_at(pc, t,
                          "the box [0x%x, 0x%x) overwrites the mbarrier at shared 0x%x of CTA "
                          "rank %u",
                          copy.dst, static_cast<uint32_t>(copy.dst + extent), o.addr,
                          owner.cta_.rank_);
  m->tx -= static_cast<int64_t>(copy.data.size());
  if (m->tx < -((1 << 20) - 1))
    return cta_.fail_at(pc, t,
                        "tx-count %" PRId64 " of the mbarrier at shared 0x%x is below -(2^20-1)",
                        m->tx, m->addr);
  m->copies.push_back(std::move(copy));
  return complete_on(owner, *m, t);
}

bool Sm90State::bulk_write(const BulkCopy &c, uint32_t t) {
  for (uint32_t off = 0; off < c.data.size(); off += 16) {
    const uint32_t a = swizzle_addr(c.dst + off, c.swizzle_bits);
    if (has_wg_ && chunk_reads_[a / 16]) {
      const WgmmaOp *op = reader_of_chunk(a / 16);
      return cta_.fail_at(c.pc, t,
                          "the copy lands on shared 0x%x, which the wgmma.mma_async at PTX line %u "
                          "still reads (no wgmma.wait_group has retired it)",
                          a, op ? cta_.e_.code[op->pc].line : 0);
    }
    if (sm100_ && !c.checked && !sm100_->shared_write(t, c.pc, a, 16)) return false;
    if (!bulk_source_write(t, c.pc, a, 16)) return false;
    std::memcpy(cta_.smem_.data() + a, c.data.data() + off, 16);
    if (proxy_dirty_) std::fill_n(unfenced_.data() + a, 16, 0);  // an async-proxy write
  }
  return true;
}

// ------------------------------------------------ bulk reductions ----
// PTX ISA "cp.reduce.async.bulk", "cp.reduce.async.bulk.tensor",
// "cp.async.bulk.commit_group", "cp.async.bulk.wait_group"; docs/emulator.md,
// "Floating-point reductions". At issue the operands are checked and the
// source is read (through the async proxy: its generic writes must have been
// fenced); until a wait_group{.read} of the issuing thread retires the op,
// a write into the source is an error. The retiring wait performs the
// element-wise adds into global memory (host atomics).

namespace {
// Calls f(chunk) for each 16-byte shared chunk op reads.
template <class F>
void for_source_chunks(uint32_t src, size_t bytes, uint32_t swizzle_bits, F f) {
  for (uint32_t off = 0; off < bytes; off += 16) f(swizzle_addr(src + off, swizzle_bits) / 16);
}
}  // namespace

bool Sm90State::bulk_reduce(uint32_t t, uint32_t pc, const uint64_t *r) {
  const Inst &in = cta_.e_.code[pc];
  const int64_t src = static_cast<int64_t>(static_cast<uint32_t>(r[in.a])) + in.imm;
  const uint64_t dst = r[in.b] + r[in.c];
  const uint32_t size = static_cast<uint32_t>(r[in.e]);
  if (size % 16) return cta_.fail_at(pc, t, "size %u is not a multiple of 16", size);
  if (src & 15)
    return cta_.fail_at(pc, t, "source shared address 0x%x is not 16-byte aligned",
                        static_cast<uint32_t>(src));
  if (dst & 15)
    return cta_.fail_at(pc, t, "destination global address 0x%" PRIx64 " is not 16-byte aligned",
                        dst);
  if (src < 0 || src + size > cta_.smem_size_)
    return cta_.fail_at(pc, t,
                        "the %u-byte source at shared 0x%x runs past the block's %u bytes of "
                        "shared memory",
                        size, static_cast<uint32_t>(src), cta_.smem_size_);
  if (!cta_.dependency_met(t, pc)) return false;
  if (size && !cta_.in_allocation(dst, size))
    return cta_.fail_at(pc, t, "destination [0x%" PRIx64 ", +%u) %s", dst, size,
                        cta_.sh_.mem->describe_locked(dst, size).c_str());
  BulkOp op;
  op.pc = pc;
  op.src = static_cast<uint32_t>(src);
  op.extent = size;
  op.type = in.sub;
  op.data.resize(size);
  op.segs.push_back({dst, 0, size});
  return bulk_issue(t, pc, std::move(op));
}

bool Sm90State::bulk_tensor_reduce(uint32_t t, uint32_t pc, const uint64_t *r) {
  const Inst &in = cta_.e_.code[pc];
  const uint32_t dims = in.sub;
  const uint32_t *s = cta_.e_.operand_slots.data() + in.c;
  const int64_t src = static_cast<int64_t>(static_cast<uint32_t>(r[in.a])) + in.imm;
  if (!cta_.dependency_met(t, pc)) return false;
  TensorMap map;
  if (!tensor_map_operand(t, pc, r[in.b], dims, &map)) return false;
  BulkOp op;
  if (map.elem_bytes == 4 && map.dtype == TmaDtype::F32)
    op.type = kBulkRedF32;
  else if (map.elem_bytes == 4 && (map.dtype == TmaDtype::U32 || map.dtype == TmaDtype::S32))
    op.type = kBulkRedU32;
  else
    return cta_.fail_at(pc, t,
                        ".add is modelled for tensor maps of type f32, u32 or s32 (4-byte "
                        "elements); this one has type %u, %u-byte elements",
                        static_cast<uint32_t>(map.dtype), map.elem_bytes);
  uint64_t total = map.elem_bytes;
  for (uint32_t d = 0; d < dims; ++d) total *= map.box[d];
  const uint32_t swz = static_cast<uint32_t>(map.swizzle);
  const uint32_t align = swz ? (16u << swz) * 8 : 128;
  if (src & (align - 1))
    return cta_.fail_at(pc, t, "source shared address 0x%x is not %u-byte aligned%s",
                        static_cast<uint32_t>(src), align,
                        swz ? " (the swizzle pattern's repeat)" : "");
  const uint64_t extent = swz ? (total + 127) / 128 * 128 : total;
  if (src < 0 || src + extent > cta_.smem_size_)
    return cta_.fail_at(pc, t,
                        "the %" PRIu64
                        "-byte box at shared 0x%x runs past the block's %u bytes of shared memory",
                        total, static_cast<uint32_t>(src), cta_.smem_size_);
  int64_t c[kTensorMapMaxRank] = {0, 0, 0, 0, 0};
  for (uint32_t d = 0; d < dims; ++d) c[d] = static_cast<int32_t>(r[s[d]]);
  op.pc = pc;
  op.src = static_cast<uint32_t>(src);
  op.extent = static_cast<uint32_t>(extent);
  op.swizzle_bits = static_cast<uint8_t>(swz);
  op.data.resize(total);
  // Tile mode: only the box's elements inside the tensor are reduced (PTX
  // ISA "Tensors": out-of-bound access).
  const uint64_t rows = total / (map.box[0] * map.elem_bytes);
  for (uint64_t rr = 0; rr < rows; ++rr) {
    BulkSeg g;
    if (!box_row(map, c, rr, &g.global, &g.at, &g.bytes)) continue;
    if (!cta_.in_allocation(g.global, g.bytes))
      return cta_.fail_at(pc, t, "box row at global 0x%" PRIx64 " (%" PRIu64 " bytes) %s", g.global,
                          g.bytes, cta_.sh_.mem->describe_locked(g.global, g.bytes).c_str());
    op.segs.push_back(g);
  }
  return bulk_issue(t, pc, std::move(op));
}

// Reads op's source (checking that its generic writes were fenced), marks
// it read by an unretired op and queues op for thread t.
bool Sm90State::bulk_issue(uint32_t t, uint32_t pc, BulkOp op) {
  const uint8_t *smem = cta_.smem_.data();
  for (uint32_t off = 0; off < op.data.size(); off += 16) {
    const uint32_t a = swizzle_addr(op.src + off, op.swizzle_bits);
    if (proxy_dirty_) {
      for (uint32_t i = 0; i < 16; ++i)
        if (unfenced_[a + i])
          return cta_.fail_at(
              pc, t,
              "source byte at shared 0x%x is read through the async proxy, but its generic-proxy "
              "write by %s was not followed by a fence.proxy.async of the writing thread (PTX ISA "
              "\"Memory Consistency Model\": proxies)",
              a + i, proxy_writer_text(unfenced_[a + i]).c_str());
    }
    std::memcpy(op.data.data() + off, smem + a, 16);
  }
  bool full = false;
  for_source_chunks(op.src, op.data.size(), op.swizzle_bits,
                    [&](uint32_t c) { full = full || bulk_chunk_[c] == UINT16_MAX; });
  if (full) return cta_.fail_at(pc, t, "more than 65535 unretired bulk reductions read a chunk");
  for_source_chunks(op.src, op.data.size(), op.swizzle_bits, [&](uint32_t c) { ++bulk_chunk_[c]; });
  ++bulk_reading_;
  if (bulkq_.empty()) bulkq_.resize(cta_.nthreads_);
  bulkq_[t].ops.push_back(std::move(op));
  return true;
}

// cp.async.bulk.wait_group{.read} n by thread t: the ops of all its
// committed groups but the newest n are retired: their source is released
// and their adds are performed, in issue order.
bool Sm90State::bulk_wait(uint32_t t, size_t n) {
  if (bulkq_.empty()) return true;
  BulkQueue &q = bulkq_[t];
  if (q.group_end.size() <= n) return true;
  const size_t end = q.group_end[q.group_end.size() - 1 - n];
  for (; q.done < end; ++q.done) {
    BulkOp &op = q.ops[q.done];
    for_source_chunks(op.src, op.data.size(), op.swizzle_bits,
                      [&](uint32_t c) { --bulk_chunk_[c]; });
    --bulk_reading_;
    bulk_perform(op);
    op.data = std::vector<uint8_t>();
    op.segs = std::vector<BulkSeg>();
  }
  if (q.done == q.ops.size()) q = BulkQueue();
  return true;
}

// The element-wise adds of op into global memory: host atomics, since CTAs
// on other host threads may add into the same words.
void Sm90State::bulk_perform(const BulkOp &op) {
  const uint8_t how = op.type == kBulkRedF32 ? kAtomAddF32 : kAtomAdd;
  for (const BulkSeg &g : op.segs) {
    uint32_t *w = reinterpret_cast<uint32_t *>(g.global);
    for (uint64_t k = 0; k < g.bytes / 4; ++k) {
      uint32_t v;
      std::memcpy(&v, op.data.data() + g.at + 4 * k, 4);
      atom_word(w + k, how, v, 0, true);
    }
  }
}

bool Sm90State::fault_bulk_source(uint32_t t, uint32_t pc, uint32_t addr, uint32_t n,
                                  uint32_t chunk) {
  for (uint32_t u = 0; u < bulkq_.size(); ++u) {
    const BulkQueue &q = bulkq_[u];
    for (size_t i = q.done; i < q.ops.size(); ++i) {
      const BulkOp &op = q.ops[i];
      bool hit = false;
      for_source_chunks(op.src, op.data.size(), op.swizzle_bits,
                        [&](uint32_t c) { hit = hit || c == chunk; });
      if (!hit) continue;
      return cta_.fail_at(pc, t,
                          "writes shared [0x%x, 0x%x), the source of the %s at PTX line %u "
                          "(%s), which no cp.async.bulk.wait_group{.read} of its thread has "
                          "retired (PTX ISA \"cp.async.bulk.wait_group\")",
                          addr, addr + n, cta_.e_.op_text[op.pc].c_str(), cta_.e_.code[op.pc].line,
                          cta_.thread_text(u).c_str());
    }
  }
  return cta_.fail_at(pc, t,
                      "writes shared 0x%x, the source of a bulk reduction (emulator bug: "
                      "no op found)",
                      addr);
}

// ------------------------------------------------------------ wgmma ----

const Sm90State::WgmmaOp *Sm90State::reader_of_chunk(uint32_t chunk) const {
  for (const Warpgroup &g : wgs_)
    for (size_t i = g.head; i < g.ops.size(); ++i)
      if (std::binary_search(g.ops[i].chunks.begin(), g.ops[i].chunks.end(), chunk))
        return &g.ops[i];
  return nullptr;
}

// The warpgroup collective at pc, for warpgroup g (all 128 threads there).
bool Sm90State::run_warpgroup_collective(uint32_t g, const Inst &in, uint32_t pc) {
  Warpgroup &wg = wgs_[g];
  switch (in.op) {
    case Op::kWgmmaFence:
      wg.fenced = true;
      return true;
    case Op::kWgmmaCommit:
      wg.group_end.push_back(wg.ops.size());
      return true;
    case Op::kWgmmaWait:
      return wgmma_wait(g, static_cast<size_t>(in.imm));
    case Op::kWgmma:
      return wgmma_issue(g, in, pc);
    default: {  // kSetmaxnreg
      const uint32_t n = static_cast<uint32_t>(in.imm);
      if (wg.maxnreg && (in.sub ? n < wg.maxnreg : n > wg.maxnreg))
        return cta_.fail_at(pc, UINT32_MAX,
                            "warpgroup %u %s its register count from %u to %u (PTX ISA setmaxnreg: "
                            ".inc must not lower it, .dec must not raise it)",
                            g, in.sub ? "increases" : "decreases", wg.maxnreg, n);
      wg.maxnreg = n;
      wg.maxnreg_pc = pc;
      return true;
    }
  }
}

// Records a wgmma.mma_async: descriptors and scale-d (the same in all 128
// threads), its shared-memory reads (checked now), its operand registers
// marked in flight. It is performed by the wait_group that retires it.
bool Sm90State::wgmma_issue(uint32_t g, const Inst &in, uint32_t pc) {
  Warpgroup &wg = wgs_[g];
  const uint32_t base = g * 128;
  if (!wg.fenced)
    return cta_.fail_at(pc, UINT32_MAX,
                        "warpgroup %u issues wgmma.mma_async without a wgmma.fence since its last "
                        "wgmma.wait_group (PTX ISA wgmma.fence: required before the first "
                        "wgmma.mma_async and between register accesses and a wgmma.mma_async using "
                        "them)",
                        g);
  const bool rs = in.sub & kWgRegA;
  const uint64_t *r0 = cta_.regs_of(base);
  WgmmaOp op;
  op.pc = pc;
  op.desc_a = rs ? 0 : r0[in.a];
  op.desc_b = r0[in.b];
  op.accumulate = r0[in.c] != 0;
  for (uint32_t u = base + 1; u < base + 128; ++u) {
    const uint64_t *ru = cta_.regs_of(u);
    if ((!rs && ru[in.a] != op.desc_a) || ru[in.b] != op.desc_b)
      return cta_.fail_at(
          pc, u,
          "the matrix descriptors differ across the warpgroup (thread %u: a 0x%" PRIx64
          " b 0x%" PRIx64 "; this thread: a 0x%" PRIx64 " b 0x%" PRIx64 ")",
          base, op.desc_a, op.desc_b, rs ? 0 : ru[in.a], ru[in.b]);
    if ((ru[in.c] != 0) != op.accumulate)
      return cta_.fail_at(pc, u, "scale-d differs across the warpgroup");
  }
  const uint32_t n = in.vec * 8u, nd = n / 2;
  const uint32_t *s = cta_.e_.operand_slots.data() + in.imm;
  // Registers of in-flight wgmmas (PTX ISA wgmma.wait_group, wgmma.fence):
  // only the accumulators of one of the same shape (m64nNk16 / m64nNk32: N and
  // K, whatever the input types) may be shared.
  const uint8_t *pd = pend_.data() + static_cast<size_t>(base) * cta_.ns_;
  for (uint32_t i = 0; i < nd + (rs ? 4 : 0); ++i) {
    if (!pd[s[i]]) continue;
    for (size_t j = wg.head; j < wg.ops.size(); ++j) {
      const Inst &o = cta_.e_.code[wg.ops[j].pc];
      const uint32_t *os = cta_.e_.operand_slots.data() + o.imm;
      const uint32_t ond = o.vec * 4u, on = ond + ((o.sub & kWgRegA) ? 4 : 0);
      for (uint32_t q = 0; q < on; ++q) {
        if (os[q] != s[i]) continue;
        const bool both_d = i < nd && q < ond;
        const bool both_a = i >= nd && q >= ond;
        if ((both_d && o.vec == in.vec && wgmma_esz(o) == wgmma_esz(in)) || both_a) continue;
        return cta_.fail_at(
            pc, UINT32_MAX,
            "register %s is %s of the wgmma.mma_async at PTX line %u, still in flight "
            "(only accumulators of the same shape may be shared before its "
            "wgmma.wait_group); warpgroup %u",
            cta_.e_.slot_name[s[i]].c_str(), q < ond ? "an accumulator" : "an A input", o.line, g);
      }
    }
  }
  // Shared-memory operands: every element inside the block's shared memory.
  const uint32_t esz = wgmma_esz(in), kk = 32 / esz;
  auto collect = [&](uint64_t desc, bool mn_major, uint32_t rows, const char *what) {
    for (uint32_t mn = 0; mn < rows; ++mn) {
      for (uint32_t k = 0; k < kk; ++k) {
        const uint32_t a = wgmma_elem_addr(desc, mn_major, mn, k, esz);
        if (a + esz > cta_.smem_size_)
          return cta_.fail_at(
              pc, UINT32_MAX,
              "%s element (%u, %u) at shared 0x%x lies outside the block's %u bytes of "
              "shared memory (descriptor 0x%016" PRIx64 "); warpgroup %u",
              what, mn, k, a, cta_.smem_size_, desc, g);
        op.chunks.push_back(a / 16);
        if (cta_.prof_) wg_elems_.push_back(a);
      }
    }
    return true;
  };
  wg_elems_.clear();
  if (!rs && !collect(op.desc_a, in.sub & kWgTransA, 64, "A")) return false;
  if (!collect(op.desc_b, in.sub & kWgTransB, n, "B")) return false;
  std::sort(op.chunks.begin(), op.chunks.end());
  op.chunks.erase(std::unique(op.chunks.begin(), op.chunks.end()), op.chunks.end());
  // Unfenced generic writes among the operands (the 16-byte chunks of the
  // canonical layouts are read whole).
  if (proxy_dirty_) {
    for (uint32_t c : op.chunks) {
      const uint32_t *u = unfenced_.data() + 16 * c;
      uint32_t any = 0;
      for (int i = 0; i < 16; ++i) any |= u[i];
      if (any) return fault_unfenced(g, in, pc, op);
    }
  }
  if (cta_.prof_) {  // distinct bytes (esz per element) and 128-byte lines read
    std::sort(wg_elems_.begin(), wg_elems_.end());
    wg_elems_.erase(std::unique(wg_elems_.begin(), wg_elems_.end()), wg_elems_.end());
    InstProfile &ip = cta_.inst_[pc];
    ++ip.wgmma_requests;
    ip.wgmma_bytes += esz * wg_elems_.size();
    uint32_t last = UINT32_MAX;
    for (uint32_t a : wg_elems_) {
      if (a / 128 != last) ++ip.wgmma_wavefronts;
      last = a / 128;
    }
  }
  for (uint32_t c : op.chunks) ++chunk_reads_[c];
  // Mark the registers in flight in all 128 threads.
  for (uint32_t u = base; u < base + 128; ++u) {
    uint8_t *p = pend_.data() + static_cast<size_t>(u) * cta_.ns_;
    for (uint32_t i = 0; i < nd + (rs ? 4 : 0); ++i) {
      if (p[s[i]] == 255)
        return cta_.fail_at(pc, UINT32_MAX,
                            "more than 255 wgmma.mma_async in flight on register %s",
                            cta_.e_.slot_name[s[i]].c_str());
      if (p[s[i]]++ == 0) ++pend_count_[u];
    }
  }
  wg.ops.push_back(std::move(op));
  return true;
}

// The error of a wgmma whose operand holds an unfenced generic write: the
// first such element, its writer and line.
bool Sm90State::fault_unfenced(uint32_t g, const Inst &in, uint32_t pc, const WgmmaOp &op) {
  const bool rs = in.sub & kWgRegA;
  const uint32_t esz = wgmma_esz(in), kk = 32 / esz;
  for (int m = rs ? 1 : 0; m < 2; ++m) {
    const uint64_t desc = m == 0 ? op.desc_a : op.desc_b;
    const bool mn_major = in.sub & (m == 0 ? kWgTransA : kWgTransB);
    for (uint32_t mn = 0; mn < (m == 0 ? 64u : in.vec * 8u); ++mn) {
      for (uint32_t k = 0; k < kk; ++k) {
        const uint32_t a = wgmma_elem_addr(desc, mn_major, mn, k, esz);
        const uint32_t v = unfenced_[a] ? unfenced_[a] : esz == 2 ? unfenced_[a + 1] : 0;
        if (!v) continue;
        return cta_.fail_at(pc, UINT32_MAX,
                            "%s element (%u, %u) at shared 0x%x is read through the async proxy, "
                            "but its generic-proxy write by %s was not followed by a "
                            "fence.proxy.async of the writing thread (PTX ISA memory model: "
                            "proxies); warpgroup %u",
                            m == 0 ? "A" : "B", mn, k, a, proxy_writer_text(v).c_str(), g);
      }
    }
  }
  return cta_.fail_at(pc, UINT32_MAX, "an operand holds an unfenced generic-proxy write");
}

// wgmma.wait_group n: performs every wgmma of the committed groups but the
// newest n, in issue order; their registers leave flight.
bool Sm90State::wgmma_wait(uint32_t g, size_t n) {
  Warpgroup &wg = wgs_[g];
  while (wg.group_end.size() - wg.group_head > n) {
    const size_t end = wg.group_end[wg.group_head++];
    for (; wg.head < end; ++wg.head)
      if (!wgmma_perform(g, wg.ops[wg.head])) return false;
  }
  if (wg.head == wg.ops.size() && wg.group_head == wg.group_end.size()) {
    wg.ops.clear();
    wg.head = 0;
    wg.group_end.clear();
    wg.group_head = 0;
  }
  wg.fenced = false;
  return true;
}

// D (64 x N, f32) = A (64 x K) B (K x N) + (accumulate ? D : 0) for the
// warpgroup g, K = 16 (f16 / bf16) or 32 (fp8) (PTX ISA "Register Fragments
// and Shared Memory Matrix Layouts"). Warp w holds rows 16w..16w+15; with
// gr = lane / 4, tq = lane % 4 its d[4j + i] is (16w + gr + 8 (i / 2), 8j +
// 2 tq + i % 2) and (rs) its A register r holds, 16-bit: (16w + gr + 8 (r %
// 2), 2 tq + 8 (r / 2) + {0, 1}), low half first (the mma.m16n8k16 A
// fragment); fp8: byte i (0..15, register i / 4, lowest byte first) is (16w
// + gr + 8 ((i / 4) % 2), 4 tq + i % 4 + 16 (i / 8)) (the mma.m16n8k32 A
// fragment). fp8 bytes are decoded exactly (fp8_table). Arithmetic:
// mma_dot_f32, the chain mma.sync uses.
bool Sm90State::wgmma_perform(uint32_t g, const WgmmaOp &op) {
  const Inst &in = cta_.e_.code[op.pc];
  const uint32_t base = g * 128, n = in.vec * 8u, nd = n / 2;
  const uint32_t *s = cta_.e_.operand_slots.data() + in.imm;
  const bool bf = in.sub & kWgBF16, rs = in.sub & kWgRegA, f8 = in.flags & kWgFp8;
  const uint32_t esz = wgmma_esz(in), kk = 32 / esz;
  const float sa = (in.sub & kWgNegA) ? -1.0f : 1.0f, sb = (in.sub & kWgNegB) ? -1.0f : 1.0f;
  const float *ta = fp8_table((in.flags & kWgE5M2A) != 0),
              *tb = fp8_table((in.flags & kWgE5M2B) != 0);
  auto half = [bf](uint16_t h) { return bf ? bf16_to_f32(h) : f16_to_f32(h); };
  // Element (mn, k) of the operand at desc: A (ta) or B (tb).
  auto elem = [&](uint64_t desc, bool mn_major, uint32_t mn, uint32_t k, const float *t8) {
    const uint8_t *p = cta_.smem_.data() + wgmma_elem_addr(desc, mn_major, mn, k, esz);
    if (f8) return t8[*p];
    uint16_t h;
    std::memcpy(&h, p, 2);
    return half(h);
  };
  wg_a_.assign(64 * kk, 0.0f);
  wg_bt_.assign(static_cast<size_t>(n) * kk, 0.0f);
  wg_d_.assign(static_cast<size_t>(64) * n, 0.0f);
  for (uint32_t w = 0; w < 4; ++w) {
    for (uint32_t lane = 0; lane < 32; ++lane) {
      uint64_t *r = cta_.regs_of(base + 32 * w + lane);
      const uint32_t gr = lane / 4, tq = lane % 4;
      if (rs && f8) {
        for (uint32_t i = 0; i < 16; ++i) {
          const uint8_t x =
              static_cast<uint8_t>(static_cast<uint32_t>(r[s[nd + i / 4]]) >> (8 * (i & 3)));
          wg_a_[(16 * w + gr + 8 * ((i >> 2) & 1)) * 32 + 4 * tq + (i & 3) + 16 * (i >> 3)] =
              sa * ta[x];
        }
      } else if (rs) {
        for (uint32_t i = 0; i < 8; ++i) {
          const uint16_t h =
              static_cast<uint16_t>(static_cast<uint32_t>(r[s[nd + i / 2]]) >> (16 * (i & 1)));
          wg_a_[(16 * w + gr + 8 * ((i >> 1) & 1)) * 16 + 2 * tq + (i & 1) + 8 * (i >> 2)] =
              sa * half(h);
        }
      }
      if (op.accumulate) {
        for (uint32_t i = 0; i < nd; ++i)
          wg_d_[(16 * w + gr + 8 * ((i >> 1) & 1)) * n + 8 * (i / 4) + 2 * tq + (i & 1)] =
              F(r[s[i]]);
      }
    }
  }
  if (!rs) {
    for (uint32_t m = 0; m < 64; ++m)
      for (uint32_t k = 0; k < kk; ++k)
        wg_a_[m * kk + k] = sa * elem(op.desc_a, in.sub & kWgTransA, m, k, ta);
  }
  for (uint32_t c = 0; c < n; ++c)
    for (uint32_t k = 0; k < kk; ++k)
      wg_bt_[c * kk + k] = sb * elem(op.desc_b, in.sub & kWgTransB, c, k, tb);
  for (uint32_t m = 0; m < 64; ++m)
    for (uint32_t c = 0; c < n; ++c)
      wg_d_[m * n + c] =
          mma_dot_f32(wg_d_[m * n + c], &wg_a_[m * kk], &wg_bt_[c * kk], static_cast<int>(kk), 1);
  for (uint32_t w = 0; w < 4; ++w) {
    for (uint32_t lane = 0; lane < 32; ++lane) {
      const uint32_t u = base + 32 * w + lane;
      uint64_t *r = cta_.regs_of(u);
      uint8_t *p = pend_.data() + static_cast<size_t>(u) * cta_.ns_;
      const uint32_t gr = lane / 4, tq = lane % 4;
      for (uint32_t i = 0; i < nd; ++i)
        r[s[i]] =
            FB(wg_d_[(16 * w + gr + 8 * ((i >> 1) & 1)) * n + 8 * (i / 4) + 2 * tq + (i & 1)]);
      for (uint32_t i = 0; i < nd + (rs ? 4 : 0); ++i)
        if (--p[s[i]] == 0) --pend_count_[u];
    }
  }
  for (uint32_t c : op.chunks) --chunk_reads_[c];
  return true;
}

// Resolves each warpgroup collective whose 128 threads all wait at it.
// Returns the number resolved or -1 (cta_.error_ set); a warpgroup that cannot
// run yet leaves its message in *stuck (if empty).
int Sm90State::resolve_collectives(std::string *stuck) {
  if (!has_wg_) return 0;
  int resolved = 0;
  for (uint32_t g = 0; g * 128 < cta_.nthreads_; ++g) {
    const uint32_t base = g * 128, cnt = std::min<uint32_t>(128, cta_.nthreads_ - base);
    uint32_t first = UINT32_MAX;
    for (uint32_t u = base; u < base + cnt && first == UINT32_MAX; ++u)
      if (cta_.state_[u] == ThreadState::kWaiting &&
          is_warpgroup_collective(cta_.e_.code[cta_.pc_[u]].op))
        first = u;
    if (first == UINT32_MAX) continue;
    const uint32_t pc = cta_.pc_[first];
    if (cnt < 128) {
      cta_.fail_at(pc, first,
                   "warpgroup %u has %u threads; warpgroup instructions need all four warps (128 "
                   "threads)",
                   g, cnt);
      return -1;
    }
    uint32_t exited = 0, elsewhere = 0, running = 0, other_line = 0;
    for (uint32_t u = base; u < base + 128; ++u) {
      if (cta_.state_[u] == ThreadState::kExited) {
        ++exited;
      } else if (cta_.state_[u] == ThreadState::kReady) {
        ++running;
      } else if (cta_.pc_[u] != pc) {
        ++elsewhere;
        if (!other_line) other_line = cta_.e_.code[cta_.pc_[u]].line;
      }
    }
    if (exited || elsewhere || running) {
      if (stuck->empty()) {
        char buf[400];
        std::snprintf(buf, sizeof buf,
                      "%s at PTX line %u: %u of the 128 threads of warpgroup %u arrived (%u "
                      "exited, %u wait at PTX line %u); block %s",
                      cta_.e_.op_text[pc].c_str(), cta_.e_.code[pc].line,
                      128 - exited - elsewhere - running, g, exited, elsewhere, other_line,
                      cta_.block_text().c_str());
        *stuck = buf;
      }
      continue;
    }
    if (!run_warpgroup_collective(g, cta_.e_.code[pc], pc)) return -1;
    for (uint32_t u = base; u < base + 128; ++u) {
      ++cta_.pc_[u];
      cta_.state_[u] = ThreadState::kReady;
    }
    ++resolved;
  }
  return resolved;
}

void Sm90State::fault_pending(uint32_t t, uint32_t pc) {
  const Inst &in = cta_.e_.code[pc];
  const uint8_t *pend = pend_.data() + static_cast<size_t>(t) * cta_.ns_;
  std::vector<uint32_t> slots = {in.d, in.a, in.b, in.c, in.e, in.v[0], in.v[1], in.v[2], in.v[3]};
  if (in.op == Op::kMma)
    for (uint32_t i = 0; i < 14; ++i) slots.push_back(cta_.e_.operand_slots[in.imm + i]);
  if (in.op == Op::kBulkTensor || in.op == Op::kBulkTensorReduce) {
    slots = {in.a, in.b};
    const uint32_t n = in.op == Op::kBulkTensor ? bulk_tensor_operands(in) : in.sub;
    for (uint32_t i = 0; i < n; ++i) slots.push_back(cta_.e_.operand_slots[in.c + i]);
  }
  uint32_t slot = kNoSlot, line = 0;
  for (uint32_t s : slots)
    if (s < cta_.ns_ && pend[s] && slot == kNoSlot) slot = s;
  const Warpgroup &g = wgs_[t / 128];
  for (size_t j = g.head; j < g.ops.size() && !line; ++j) {
    const Inst &o = cta_.e_.code[g.ops[j].pc];
    const uint32_t *os = cta_.e_.operand_slots.data() + o.imm;
    for (uint32_t q = 0; q < o.vec * 4u + ((o.sub & kWgRegA) ? 4 : 0); ++q)
      if (os[q] == slot) line = o.line;
  }
  cta_.fail_at(pc, t,
               "register %s belongs to the wgmma.mma_async at PTX line %u, still in flight: access "
               "it only after a wgmma.wait_group retires that wgmma (PTX ISA wgmma.wait_group)",
               slot == kNoSlot ? "?" : cta_.e_.slot_name[slot].c_str(), line);
}

// The deadlock report of thread t waiting at mbarrier.try_wait.parity
// (nwait threads wait at try_waits).
std::string Sm90State::wait_text(uint32_t t, uint32_t nwait) {
  const uint32_t pc = cta_.pc_[t];
  const Inst &in = cta_.e_.code[pc];
  const uint64_t *r = cta_.regs_of(t);
  const uint32_t addr = static_cast<uint32_t>(static_cast<uint32_t>(r[in.a]) + in.imm);
  const Mbarrier *m = find_mbar(addr);
  char buf[500];
  std::snprintf(buf, sizeof buf,
                "%s at PTX line %u: deadlock: %u thread(s) wait on mbarriers; the first waits for "
                "phase %u of the mbarrier at shared 0x%x (%u of %u arrivals pending, tx-count "
                "%" PRId64 ") and no thread can arrive or complete bytes",
                cta_.e_.op_text[pc].c_str(), in.line, nwait, m ? m->phase : 0, addr,
                m ? m->pending : 0, m ? m->expected : 0, m ? m->tx : 0);
  return buf;
}

// ------------------------------------------------------ end of block ----

// The block's threads all exited: nothing asynchronous may be left over.
bool Sm90State::finish_block() {
  // setmaxnreg moves registers between warpgroups within the CTA's own
  // allocation (PTX ISA "setmaxnreg": .inc waits until the pool has them):
  // the warpgroups' final counts must fit the registers the CTA started
  // with, at most ptxas's cap min(255, 65536 / threads) rounded down to 8
  // (threads: .maxntid, else the block), or an .inc waits for ever.
  uint32_t sum = 0, inc_pc = UINT32_MAX, last = 0;
  bool any = false;
  const uint32_t *mx = cta_.e_.maxntid;
  const uint32_t ntid = mx[0] ? mx[0] * std::max(mx[1], 1u) * std::max(mx[2], 1u) : cta_.nthreads_;
  const uint32_t cap = std::min<uint32_t>(255, 65536 / std::max(ntid, 1u)) / 8 * 8;
  for (const Warpgroup &wg : wgs_) {
    any = any || wg.maxnreg != 0;
    sum += 128 * (wg.maxnreg ? wg.maxnreg : cap);
    if (wg.maxnreg > last) last = wg.maxnreg, inc_pc = wg.maxnreg_pc;
  }
  if (any && sum > cap * ntid)
    return cta_.fail_at(inc_pc, UINT32_MAX,
                        "the warpgroups' setmaxnreg counts need %u registers, the CTA has %u "
                        "(%u threads x %u, ptxas's most): an .inc would wait for ever (PTX ISA "
                        "\"setmaxnreg\")",
                        sum, cap * ntid, ntid, cap);
  for (uint32_t g = 0; g < wgs_.size(); ++g) {
    const Warpgroup &wg = wgs_[g];
    if (wg.head < wg.ops.size())
      return cta_.fail_at(
          wg.ops[wg.head].pc, UINT32_MAX,
          "still in flight when warpgroup %u exited (no wgmma.wait_group retired it)", g);
  }
  for (uint32_t u = 0; u < bulkq_.size(); ++u) {
    const BulkQueue &q = bulkq_[u];
    if (q.done == q.ops.size()) continue;
    const bool committed = !q.group_end.empty() && q.group_end.back() > q.done;
    return cta_.fail_at(q.ops[q.done].pc, u,
                        "the thread exited before a cp.async.bulk.wait_group{.read} retired this "
                        "bulk reduction%s (its source must stay until then: PTX ISA "
                        "\"cp.async.bulk.wait_group\")",
                        committed ? "" : ", never committed (cp.async.bulk.commit_group)");
  }
  for (const Mbarrier &m : mbars_) {
    if (!m.copies.empty())
      return cta_.fail_at(
          m.copies.front().pc, UINT32_MAX,
          "the block exited before the copy's mbarrier (shared 0x%x) completed phase "
          "%u (%u of %u arrivals pending, tx-count %" PRId64 ")",
          m.addr, m.phase, m.pending, m.expected, m.tx);
    if (m.tx != 0) {
      char buf[400];
      std::snprintf(buf, sizeof buf,
                    "mbarrier at shared 0x%x (initialized at PTX line %u): the block exited with "
                    "tx-count %" PRId64
                    " in phase %u: the bytes of expect_tx and of the completed copies never "
                    "balanced; block %s",
                    m.addr, m.init_line, m.tx, m.phase, cta_.block_text().c_str());
      cta_.error_ = buf;
      return false;
    }
  }
  return true;
}

}  // namespace emu
}  // namespace fa

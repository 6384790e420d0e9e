// The sm_100 state of a CTA (emu/sm100.h). docs/emulator.md, "Blackwell
// (sm_100a)", has the model and its sources in the PTX ISA.
#include "emu/sm100.h"

#include "emu/sm90.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace fa {
namespace emu {

int g_sm100_bug = kSm100BugNone;

namespace {

// Calls f(slot, written) for the register slots instruction in reads
// (written false) or writes (true) until f returns true; returns whether
// one did. os: Entry::operand_slots. Slots may be kNoSlot (f filters them).
template <class F>
bool any_slot(const Inst &in, const uint32_t *os, F f) {
  switch (in.op) {
    case Op::kTmemLd:
    case Op::kTmemSt: {
      const uint32_t *l = os + in.imm;
      for (uint32_t j = 0; j < in.vec; ++j)
        if (f(l[j], in.op == Op::kTmemLd)) return true;
      return f(in.a, false);
    }
    case Op::kMma:  // d[4] written; a[4], b[2], c[4] read
      for (uint32_t j = 0; j < 14; ++j)
        if (f(os[in.imm + j], j < 4)) return true;
      return false;
    case Op::kBulkTensor:
    case Op::kBulkTensorReduce:
      for (uint32_t j = 0; j < in.sub + (in.op == Op::kBulkTensor ? 2u : 0u); ++j)
        if (f(os[in.c + j], false)) return true;
      return f(in.a, false) || f(in.b, false);
    default:
      break;
  }
  // The ops whose v[] are destinations (the others read theirs).
  const bool v_written = in.op == Op::kUnpack32 || in.op == Op::kUnpack64 ||
                         in.op == Op::kLdGlobal || in.op == Op::kLdShared ||
                         in.op == Op::kLdGeneric || in.op == Op::kShfl || in.op == Op::kElect ||
                         in.op == Op::kLdmatrix;
  for (uint32_t s : in.v)
    if (f(s, v_written)) return true;
  return f(in.d, true) || f(in.a, false) || f(in.b, false) || f(in.c, false) || f(in.e, false);
}

}  // namespace

Sm100State::Sm100State(Cta &cta, Sm90State &sm90) : cta_(cta), sm90_(sm90) {
  for (const Inst &in : cta_.e_.code) {
    if (op_handler(in.op) == OpHandler::kSm100) has_tmem_ = true;
    if (in.op == Op::kUmma || in.op == Op::kUtcCp) has_async_ = true;
  }
  if (!has_tmem_) return;
  if (has_async_) {
    cell_wr_.assign(kLanes * kColumns, 0);
    cell_rd_.assign(kLanes * kColumns, 0);
    chunk_op_.assign(cta_.smem_size_ / 16 + 1, 0);
    uncommitted_.resize(cta_.nthreads_);
    own_.ops.resize(1);
    sm90_.track_observed();
  }
  tmem_.assign(kLanes * kColumns, 0);
  st_cell_.assign(kLanes * kColumns, 0);
  pend_.assign(static_cast<size_t>(cta_.nthreads_) * cta_.ns_, 0);
  pend_count_.assign(cta_.nthreads_, 0);
  lds_.resize((cta_.nthreads_ + 31) / 32);
  sts_.resize(lds_.size());
}

void Sm100State::reset_block() {
  if (!has_tmem_) return;
  // Fresh tensor memory holds no value a test could mistake for data.
  std::fill(tmem_.begin(), tmem_.end(), 0xffbadbadu);
  std::fill(st_cell_.begin(), st_cell_.end(), 0);
  std::fill(pend_.begin(), pend_.end(), 0);
  std::fill(pend_count_.begin(), pend_count_.end(), 0);
  for (auto &v : lds_) v.clear();
  for (auto &v : sts_) v.clear();
  allocs_.clear();
  freed_.clear();
  relinquish_pc_ = UINT32_MAX;
  req_ = PairReq();
  // The cluster's CTAs start their blocks before any runs: rank 0's ledger
  // is cleared before any op is recorded in it.
  const Cluster *cl = cta_.cluster_;
  led_ = cl && cl->sm100.size() == cl->size ? &cl->sm100[0]->own_ : &own_;
  if (own_.ops.size() > 1 || !own_.commits.empty()) {
    own_.ops.resize(1);
    own_.commits.clear();
  }
  if (touched_) {  // the previous block's asynchronous ops used these cells
    std::fill(cell_wr_.begin(), cell_wr_.end(), 0);
    std::fill(cell_rd_.begin(), cell_rd_.end(), 0);
    std::fill(chunk_op_.begin(), chunk_op_.end(), 0);
    for (auto &v : uncommitted_) v.clear();
    touched_ = false;
  }
  any_reader_ = false;
}

Step Sm100State::exec(uint32_t t, uint32_t pc, uint64_t *r) {
  bool ok;
  switch (cta_.e_.code[pc].op) {
    case Op::kUmma:
      ok = umma(t, pc, r);
      break;
    case Op::kUtcCp:
      ok = utc_cp(t, pc, r);
      break;
    case Op::kUmmaCommit:
      ok = commit(t, pc, r);
      break;
    default:
      ok = cta_.fail_at(pc, t, "not an sm_100 per-thread op (emulator bug: emu/ops.def handler)");
      break;
  }
  return ok ? Step::kNext : Step::kFault;
}

int Sm100State::resolve_collectives(std::string *) { return 0; }

int Sm100State::run_warp(uint32_t w, uint32_t pc) {
  const Inst &in = cta_.e_.code[pc];
  switch (in.op) {
    case Op::kTmemAlloc:
      return tmem_alloc(w, pc);
    case Op::kTmemDealloc:
      return tmem_dealloc(w, pc);
    case Op::kTmemRelinquish:
      relinquish_pc_ = pc;
      return 1;
    case Op::kTmemLd:
      return tmem_ld(w, pc) ? 1 : -1;
    case Op::kTmemSt:
      return tmem_st(w, pc) ? 1 : -1;
    case Op::kTmemWait:
      tmem_wait(w, in.sub == 1);
      return 1;
    default:
      cta_.fail_at(pc, 32 * w, "not an sm_100 warp collective (emulator bug: emu/ops.def handler)");
      return -1;
  }
}

// ------------------------------------------------- allocation ----
// PTX ISA "Tensor Memory" (allocation in units of 32 columns, all 128
// lanes of each; everything allocated freed before the kernel exits) and
// "tcgen05.alloc, tcgen05.dealloc, tcgen05.relinquish_alloc_permit" (nCols a
// power of 2 in 32..512; alloc blocks until the columns are free; no alloc
// after relinquish_alloc_permit). Placement is first fit: programs must use
// the address alloc writes, never assume one. .cta_group::2 ("Issue
// Granularity"): one warp of each CTA of the pair performs the instruction,
// the first to get there waiting for the other; the emulator gives the
// pair the same columns in both CTAs' tensor memory (first fit over both)
// and frees them in both, and refuses a pair whose warps disagree (another
// instruction, nCols, taddr). relinquish_alloc_permit.cta_group::2 acts on
// the executing CTA only.

// "columns [0, 64) (PTX line 12), [64, 96) (PTX line 14)" or "none".
std::string Sm100State::allocs_text() const {
  std::string s;
  for (const Alloc &a : allocs_) {
    s += s.empty() ? "columns " : ", ";
    s += "[" + std::to_string(a.col) + ", " + std::to_string(a.col + a.ncols) + ") (PTX line " +
         std::to_string(cta_.e_.code[a.pc].line) + ")";
  }
  return s.empty() ? "none" : s;
}

// The live allocation holding columns [col, col + n), or nullptr.
const Sm100State::Alloc *Sm100State::alloc_at(uint32_t col, uint32_t n) const {
  for (const Alloc &a : allocs_)
    if (col >= a.col && col + n <= a.col + a.ncols) return &a;
  return nullptr;
}

// No live allocation overlaps columns [col, col + n).
bool Sm100State::cols_free(uint32_t col, uint32_t n) const {
  for (const Alloc &a : allocs_)
    if (col < a.col + a.ncols && a.col < col + n) return false;
  return true;
}

// The 32-bit operand slot of the warp collective at pc holds one value in
// every lane of warp w (false: error set).
bool Sm100State::uniform(uint32_t w, uint32_t pc, uint32_t slot, const char *what) {
  const uint32_t v0 = static_cast<uint32_t>(cta_.regs_of(32 * w)[slot]);
  for (uint32_t i = 1; i < 32; ++i) {
    const uint32_t v = static_cast<uint32_t>(cta_.regs_of(32 * w + i)[slot]);
    if (v != v0)
      return cta_.fail_at(pc, 32 * w + i,
                          "%s differs across the warp (lane 0: 0x%x, lane %u: 0x%x); every thread "
                          "of the warp must give the same one",
                          what, v0, i, v);
  }
  return true;
}

// The states of the CTA pair of this CTA for the .cta_group::2 op thread t
// runs at pc: half[0] the even rank's, half[1] the odd's (PTX ISA
// "tcgen05": "CTA Pair": the CTAs whose %cluster_ctarank differ in bit 0).
// False (error set): the cluster has an odd size, or the peer exited
// ("Issue Granularity": the peer CTA must be active).
bool Sm100State::pair_states(uint32_t t, uint32_t pc, Sm100State **half) {
  const Cluster *cl = cta_.cluster_;
  const uint32_t size = cl ? cl->size : 1;
  if (!cl || size % 2 || cl->sm100.size() != size)
    return cta_.fail_at(pc, t,
                        ".cta_group::2 needs a CTA pair, but the cluster has %u CTA(s): the pairs "
                        "are the CTAs of ranks 2k and 2k + 1 of a cluster of even size (PTX ISA "
                        "\"tcgen05\": \"CTA Pair\")",
                        size);
  Sm100State *peer = cl->sm100[cta_.rank_ ^ 1];
  if (peer->cta_.done_)
    return cta_.fail_at(pc, t,
                        "the peer CTA (rank %u) has exited: a .cta_group::2 op needs its peer "
                        "CTA active (PTX ISA \"tcgen05\": \"Issue Granularity\")",
                        cta_.rank_ ^ 1);
  half[cta_.rank_ & 1] = this;
  half[(cta_.rank_ & 1) ^ 1] = peer;
  return true;
}

// The start of warp w's .cta_group::2 alloc / dealloc at pc: 1 when the
// peer already performed it for both (done), 0 while another warp of the
// CTA has one pending (w waits), 2 to go on.
int Sm100State::pair_begin(uint32_t w, uint32_t pc) {
  if (req_.pc == UINT32_MAX) return 2;
  if (req_.pc != pc || req_.w != w) return 0;
  if (!req_.done) return 2;
  req_ = PairReq();
  return 1;
}

// The peer's pending request (peer.req_) is the same instruction with the
// same operands as warp w's (req_). False: error set, naming both lines.
bool Sm100State::pair_match(uint32_t w, uint32_t pc, const Sm100State &peer) {
  const PairReq &o = peer.req_;
  const Inst &a = cta_.e_.code[pc], &b = cta_.e_.code[o.pc];
  const char *what = a.op == Op::kTmemAlloc ? "tcgen05.alloc" : "tcgen05.dealloc";
  if (a.op != b.op || b.sub != 1)
    return cta_.fail_at(pc, 32 * w,
                        "the peer CTA (rank %u) waits at the %s at PTX line %u: the two warps of a "
                        ".cta_group::2 %s must perform the same instruction together (PTX ISA "
                        "\"tcgen05\": \"Issue Granularity\")",
                        peer.cta_.rank_, cta_.e_.op_text[o.pc].c_str(), b.line, what);
  if (o.ncols != req_.ncols || o.taddr != req_.taddr)
    return cta_.fail_at(pc, 32 * w,
                        "taddr 0x%08x, nCols %u differ from the peer CTA (rank %u)'s taddr 0x%08x, "
                        "nCols %u (its %s at PTX line %u): the pair %s the same columns in both "
                        "CTAs",
                        req_.taddr, req_.ncols, peer.cta_.rank_, o.taddr, o.ncols, what, b.line,
                        a.op == Op::kTmemAlloc ? "allocates" : "frees");
  return true;
}

// 1: allocated, 0: no room yet, or (.cta_group::2) the peer's warp not yet
// there (the warp waits), -1: fault.
int Sm100State::tmem_alloc(uint32_t w, uint32_t pc) {
  const Inst &in = cta_.e_.code[pc];
  const bool pair = in.sub == 1;
  if (pair) {
    const int b = pair_begin(w, pc);
    if (b < 2) return b;
  }
  if (!uniform(w, pc, in.a, "the shared address") || !uniform(w, pc, in.b, "nCols")) return -1;
  const uint64_t *r = cta_.regs_of(32 * w);
  const uint32_t ncols = static_cast<uint32_t>(r[in.b]);
  if (relinquish_pc_ != UINT32_MAX) {
    cta_.fail_at(pc, 32 * w,
                 "the CTA gave up its right to allocate tensor memory with the "
                 "tcgen05.relinquish_alloc_permit at PTX line %u (PTX ISA "
                 "\"tcgen05.relinquish_alloc_permit\")",
                 cta_.e_.code[relinquish_pc_].line);
    return -1;
  }
  if (ncols < 32 || ncols > kColumns || (ncols & (ncols - 1))) {
    cta_.fail_at(pc, 32 * w, "nCols %u is not a power of 2 in 32..512 (PTX ISA \"tcgen05.alloc\")",
                 ncols);
    return -1;
  }
  const int64_t dst = static_cast<int64_t>(static_cast<uint32_t>(r[in.a])) + in.imm;
  uint8_t *p = cta_.shared_ptr(dst, 4, 32 * w, pc);
  if (!p) return -1;
  if (pair) return pair_alloc(w, pc, ncols, p);
  for (uint32_t c = 0; c + ncols <= kColumns; c += 32) {
    if (!cols_free(c, ncols)) continue;
    allocs_.push_back(Alloc{c, ncols, pc});
    std::memcpy(p, &c, 4);  // lane 0, column c
    return 1;
  }
  return 0;
}

// tcgen05.alloc.cta_group::2 by warp w: performed (for both warps) by the
// second of the pair to get there, once both CTAs have the columns free.
int Sm100State::pair_alloc(uint32_t w, uint32_t pc, uint32_t ncols, uint8_t *dst) {
  Sm100State *half[2];
  if (!pair_states(32 * w, pc, half)) return -1;
  Sm100State &peer = *half[(cta_.rank_ & 1) ^ 1];
  req_ = PairReq{pc, w, ncols, 0, dst, false};
  PairReq &o = peer.req_;
  if (o.pc == UINT32_MAX || o.done) return 0;
  if (!pair_match(w, pc, peer)) return -1;
  for (uint32_t c = 0; c + ncols <= kColumns; c += 32) {
    if (!cols_free(c, ncols) || !peer.cols_free(c, ncols)) continue;
    allocs_.push_back(Alloc{c, ncols, pc});
    peer.allocs_.push_back(Alloc{c, ncols, o.pc});
    std::memcpy(dst, &c, 4);
    std::memcpy(o.dst, &c, 4);
    o.done = true;
    req_ = PairReq();
    return 1;
  }
  return 0;
}

// 1: freed, 0 (.cta_group::2): the peer's warp not yet there, -1: fault.
int Sm100State::tmem_dealloc(uint32_t w, uint32_t pc) {
  const Inst &in = cta_.e_.code[pc];
  const bool pair = in.sub == 1;
  if (pair) {
    const int b = pair_begin(w, pc);
    if (b < 2) return b;
  }
  if (!uniform(w, pc, in.a, "taddr") || !uniform(w, pc, in.b, "nCols")) return -1;
  const uint64_t *r = cta_.regs_of(32 * w);
  const uint32_t taddr = static_cast<uint32_t>(r[in.a]), ncols = static_cast<uint32_t>(r[in.b]);
  if (!pair) return dealloc_cols(w, pc, taddr, ncols, false) ? 1 : -1;
  Sm100State *half[2];
  if (!pair_states(32 * w, pc, half)) return -1;
  Sm100State &peer = *half[(cta_.rank_ & 1) ^ 1];
  req_ = PairReq{pc, w, ncols, taddr, nullptr, false};
  PairReq &o = peer.req_;
  if (o.pc == UINT32_MAX || o.done) return 0;
  if (!pair_match(w, pc, peer) || !dealloc_cols(w, pc, taddr, ncols, true)) return -1;
  if (!peer.dealloc_cols(o.w, o.pc, taddr, ncols, true)) {
    cta_.error_ = peer.cta_.error_;
    return -1;
  }
  o.done = true;
  req_ = PairReq();
  return 1;
}

// Frees the allocation at taddr (nCols ncols) of this CTA for warp w's
// dealloc at pc; pair: a .cta_group::2 one (an op's completion observed by
// any thread of the pair will do). False: error set.
bool Sm100State::dealloc_cols(uint32_t w, uint32_t pc, uint32_t taddr, uint32_t ncols, bool pair) {
  if (ncols < 32 || ncols > kColumns || (ncols & (ncols - 1)))
    return cta_.fail_at(
        pc, 32 * w, "nCols %u is not a power of 2 in 32..512 (PTX ISA \"tcgen05.dealloc\")", ncols);
  const uint32_t col = taddr & 0xffff;
  for (size_t i = 0; i < allocs_.size() && (taddr >> 16) == 0; ++i) {
    const Alloc a = allocs_[i];
    if (a.col != col) continue;
    // No unfinished tcgen05.mma / cp may still use the columns (observed
    // by any thread: the deallocating warp may have learned it through a
    // barrier).
    if (has_async_ && !check_cells(UINT32_MAX, pc, 0, kLanes, a.col, a.ncols, true, pair))
      return false;
    if (a.ncols != ncols)
      return cta_.fail_at(pc, 32 * w,
                          "nCols %u differs from the %u columns the tcgen05.alloc at PTX line %u "
                          "allocated at taddr 0x%08x: a dealloc frees one whole allocation",
                          ncols, a.ncols, cta_.e_.code[a.pc].line, taddr);
    allocs_.erase(allocs_.begin() + static_cast<std::ptrdiff_t>(i));
    freed_.push_back(Freed{a.col, a.ncols, pc});
    return true;
  }
  for (auto f = freed_.rbegin(); f != freed_.rend(); ++f)
    if (f->col == col && (taddr >> 16) == 0)
      return cta_.fail_at(pc, 32 * w,
                          "taddr 0x%08x was already deallocated by the tcgen05.dealloc at PTX line "
                          "%u (live allocations: %s)",
                          taddr, cta_.e_.code[f->pc].line, allocs_text().c_str());
  return cta_.fail_at(pc, 32 * w,
                      "taddr 0x%08x is not the address of a live allocation (lane 0, its first "
                      "column); live allocations: %s",
                      taddr, allocs_text().c_str());
}

std::string Sm100State::wait_text(uint32_t t, uint32_t) {
  const uint32_t pc = cta_.pc_[t];
  const Inst &in = cta_.e_.code[pc];
  char buf[700];
  const Cluster *cl = cta_.cluster_;
  const Sm100State *peer =
      cl && cl->size % 2 == 0 && cl->sm100.size() == cl->size ? cl->sm100[cta_.rank_ ^ 1] : nullptr;
  if (in.sub == 1 && peer && req_.pc == pc &&
      (in.op == Op::kTmemDealloc || peer->req_.pc == UINT32_MAX)) {
    std::snprintf(buf, sizeof buf,
                  "%s at PTX line %u: deadlock: warp %u waits for a warp of the peer CTA (rank %u) "
                  "to perform this .cta_group::2 instruction too (PTX ISA \"tcgen05\": \"Issue "
                  "Granularity\"); block %s",
                  cta_.e_.op_text[pc].c_str(), in.line, t / 32, cta_.rank_ ^ 1,
                  cta_.block_text().c_str());
    return buf;
  }
  std::snprintf(buf, sizeof buf,
                "%s at PTX line %u: deadlock: warp %u waits for %u contiguous free columns of "
                "tensor memory%s; allocated: %s; no warp can reach a tcgen05.dealloc; block %s",
                cta_.e_.op_text[pc].c_str(), in.line, t / 32,
                static_cast<uint32_t>(cta_.regs_of(t)[in.b]),
                in.sub == 1 ? " (the same in both CTAs of the pair)" : "", allocs_text().c_str(),
                cta_.block_text().c_str());
  return buf;
}

// Every allocation must be freed before the CTA exits.
bool Sm100State::finish_block() {
  if (has_async_ && !finish_async()) return false;
  if (allocs_.empty() || g_sm100_bug == kSm100BugNoLeakCheck) return true;
  const Alloc &a = allocs_.front();
  return cta_.fail_at(a.pc, UINT32_MAX,
                      "the block exited with columns [%u, %u) of tensor memory still allocated: "
                      "free every allocation with tcgen05.dealloc before the CTA exits (PTX ISA "
                      "\"Tensor Memory\"); live allocations: %s",
                      a.col, a.col + a.ncols, allocs_text().c_str());
}

// ------------------------------------------------ ld / st ----
// PTX ISA "Matrix and Data Movement Shape" (.32x32b: the warp accesses 32
// lanes, 32 x .num bits of each: thread i of the warp <-> lane taddr.lane +
// i, register j <-> column taddr.column + j), "Tensor Memory" (access
// restrictions: warp w of a warpgroup, w = %warpid % 4, accesses lanes 32w
// .. 32w + 31 only), "tcgen05.ld", "tcgen05.st", "tcgen05.wait" (both are
// asynchronous: wait::ld before using the destination registers, wait::st
// before reusing the source registers or reading the written cells). The
// emulator performs each at issue and checks the waits.

// The lanes and columns of the ld / st at pc for warp w, checked (false:
// error set).
bool Sm100State::tmem_access(uint32_t w, uint32_t pc, uint32_t *lane, uint32_t *col) {
  const Inst &in = cta_.e_.code[pc];
  if (!uniform(w, pc, in.a, "taddr")) return false;
  const uint32_t taddr = static_cast<uint32_t>(cta_.regs_of(32 * w)[in.a]);
  const uint32_t n = in.vec, q = w % 4;
  *lane = taddr >> 16;
  *col = taddr & 0xffff;
  if (*lane + 32 > kLanes || (*lane != 32 * q && g_sm100_bug != kSm100BugNoQuarter))
    return cta_.fail_at(pc, 32 * w,
                        "taddr 0x%08x addresses lanes %u..%u, but warp %u (warp id %% 4 = %u) may "
                        "access tensor memory lanes %u..%u only (PTX ISA \"Tensor Memory\": "
                        "access restrictions)",
                        taddr, *lane, *lane + 31, w, q, 32 * q, 32 * q + 31);
  if (*col + n > kColumns)
    return cta_.fail_at(pc, 32 * w, "taddr 0x%08x: columns %u..%u run past column %u", taddr, *col,
                        *col + n - 1, kColumns - 1);
  if (!alloc_at(*col, n))
    return cta_.fail_at(pc, 32 * w,
                        "taddr 0x%08x: columns %u..%u are not inside one allocation (live "
                        "allocations: %s)",
                        taddr, *col, *col + n - 1, allocs_text().c_str());
  return true;
}

// Marks the instruction's register list in flight (flag) in warp w.
void Sm100State::mark(uint32_t w, const Inst &in, uint8_t flag) {
  const uint32_t *s = cta_.e_.operand_slots.data() + in.imm;
  for (uint32_t u = 32 * w; u < 32 * w + 32; ++u) {
    uint8_t *row = pend_.data() + static_cast<size_t>(u) * cta_.ns_;
    for (uint32_t j = 0; j < in.vec; ++j) {
      if (!row[s[j]]) ++pend_count_[u];
      row[s[j]] |= flag;
    }
  }
}

bool Sm100State::tmem_ld(uint32_t w, uint32_t pc) {
  const Inst &in = cta_.e_.code[pc];
  uint32_t lane, col;
  if (!tmem_access(w, pc, &lane, &col)) return false;
  const uint32_t n = in.vec;
  if (has_async_ && !check_cells(w, pc, lane, 32, col, n, false)) return false;
  const uint32_t *s = cta_.e_.operand_slots.data() + in.imm;
  for (uint32_t i = 0; i < 32; ++i) {
    for (uint32_t j = 0; j < n; ++j) {
      const uint64_t m = st_cell_[(lane + i) * kColumns + col + j];
      if (m)
        return cta_.fail_at(pc, 32 * w + i,
                            "tensor memory lane %u column %u was written by the tcgen05.st at PTX "
                            "line %u (warp %u), not yet waited for: tcgen05.wait::st first (PTX "
                            "ISA \"tcgen05.wait\")",
                            lane + i, col + j, cta_.e_.code[static_cast<uint32_t>(m) - 1].line,
                            static_cast<uint32_t>(m >> 32));
    }
  }
  const bool off = g_sm100_bug == kSm100BugLaneOffByOne;
  for (uint32_t i = 0; i < 32; ++i) {
    uint64_t *r = cta_.regs_of(32 * w + i);
    const uint32_t *cell = tmem_.data() + (lane + (off ? (i + 1) % 32 : i)) * kColumns + col;
    for (uint32_t j = 0; j < n; ++j) r[s[j]] = cell[j];
  }
  if (g_sm100_bug != kSm100BugNoWaitLd) {
    mark(w, in, kPendLd);
    lds_[w].push_back(pc);
  }
  return true;
}

bool Sm100State::tmem_st(uint32_t w, uint32_t pc) {
  const Inst &in = cta_.e_.code[pc];
  uint32_t lane, col;
  if (!tmem_access(w, pc, &lane, &col)) return false;
  const uint32_t n = in.vec;
  if (has_async_ && !check_cells(w, pc, lane, 32, col, n, true)) return false;
  const uint32_t *s = cta_.e_.operand_slots.data() + in.imm;
  const bool swap = g_sm100_bug == kSm100BugColumnSwap && n > 1;
  const uint64_t marker = uint64_t{w} << 32 | (pc + 1);
  for (uint32_t i = 0; i < 32; ++i) {
    const uint64_t *r = cta_.regs_of(32 * w + i);
    const size_t row = static_cast<size_t>(lane + i) * kColumns + col;
    for (uint32_t j = 0; j < n; ++j) {
      tmem_[row + j] = static_cast<uint32_t>(r[s[swap ? j ^ 1 : j]]);
      if (g_sm100_bug != kSm100BugNoWaitSt) st_cell_[row + j] = marker;
    }
  }
  sts_[w].push_back(StRec{pc, lane, col, n});
  mark(w, in, kPendSt);
  return true;
}

// tcgen05.wait::ld / ::st by warp w: its earlier lds (sts) are complete.
void Sm100State::tmem_wait(uint32_t w, bool st) {
  const uint8_t flag = st ? kPendSt : kPendLd;
  for (uint32_t u = 32 * w; u < 32 * w + 32; ++u) {
    if (!pend_count_[u]) continue;
    uint8_t *row = pend_.data() + static_cast<size_t>(u) * cta_.ns_;
    for (uint32_t k = 0; k < cta_.ns_; ++k) {
      if (!(row[k] & flag)) continue;
      row[k] = static_cast<uint8_t>(row[k] & ~flag);
      if (!row[k]) --pend_count_[u];
    }
  }
  if (!st) {
    lds_[w].clear();
    return;
  }
  for (const StRec &sr : sts_[w]) {
    const uint64_t marker = uint64_t{w} << 32 | (sr.pc + 1);
    for (uint32_t i = 0; i < 32; ++i)
      for (uint32_t j = 0; j < sr.n; ++j) {
        uint64_t &m = st_cell_[(sr.lane + i) * kColumns + sr.col + j];
        if (m == marker) m = 0;
      }
  }
  sts_[w].clear();
}

// ------------------------------------------------ register hazards ----

bool Sm100State::touches_pending(const Inst &in, const uint8_t *pend, uint32_t ns,
                                 const uint32_t *os) {
  return any_slot(in, os, [&](uint32_t s, bool written) {
    return s < ns && ((pend[s] & kPendLd) || (written && (pend[s] & kPendSt)));
  });
}

void Sm100State::fault_pending(uint32_t t, uint32_t pc) {
  const Inst &in = cta_.e_.code[pc];
  const uint8_t *pend = pending_row(t);
  const uint32_t *os = cta_.e_.operand_slots.data();
  uint32_t slot = kNoSlot;
  bool ld = false;
  any_slot(in, os, [&](uint32_t s, bool written) {
    if (s >= cta_.ns_) return false;
    if (pend[s] & kPendLd) {
      slot = s;
      ld = true;
      return true;
    }
    if (written && (pend[s] & kPendSt)) {
      slot = s;
      return true;
    }
    return false;
  });
  // The newest unwaited ld / st of the warp naming the register.
  const uint32_t w = t / 32;
  uint32_t line = 0;
  auto names = [&](uint32_t opc) {
    const Inst &o = cta_.e_.code[opc];
    for (uint32_t j = 0; j < o.vec; ++j)
      if (os[o.imm + j] == slot) return true;
    return false;
  };
  if (ld) {
    for (auto p = lds_[w].rbegin(); p != lds_[w].rend() && !line; ++p)
      if (names(*p)) line = cta_.e_.code[*p].line;
  } else {
    for (auto p = sts_[w].rbegin(); p != sts_[w].rend() && !line; ++p)
      if (names(p->pc)) line = cta_.e_.code[p->pc].line;
  }
  const char *name = slot == kNoSlot ? "?" : cta_.e_.slot_name[slot].c_str();
  if (ld)
    cta_.fail_at(pc, t,
                 "register %s is a destination of the tcgen05.ld at PTX line %u, not yet waited "
                 "for: read or write it only after tcgen05.wait::ld (PTX ISA \"tcgen05.wait\")",
                 name, line);
  else
    cta_.fail_at(pc, t,
                 "register %s is a source of the tcgen05.st at PTX line %u, not yet waited for: "
                 "overwrite it only after tcgen05.wait::st (PTX ISA \"tcgen05.wait\")",
                 name, line);
}

}  // namespace emu
}  // namespace fa

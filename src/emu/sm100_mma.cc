// The asynchronous tcgen05 ops of the sm_100 state (emu/sm100.h):
// tcgen05.mma (kind::f16, kind::f8f6f4; cta_group::1 and ::2, dense, no
// .ws), tcgen05.cp (cta_group::1: 128x256b, 128x128b) and tcgen05.commit
// (.multicast::cluster too), with the checks of what a program may rely on
// only once a commit's mbarrier phase is observed. docs/emulator.md,
// "Blackwell (sm_100a)", has the model and its sources in the PTX ISA.
//
// Model: an op is performed when it is issued (its operands read, its
// tensor memory written) and recorded (AsyncOp) with the cells it writes
// (cell_wr_) or reads as A (cell_rd_) and the shared chunks it reads
// (chunk_op_). tcgen05.commit arrives on its mbarrier at once (the op is
// already complete); the ops it covers, every earlier one of the issuing
// thread ("tcgen05.commit": "all prior async tcgen05 operations initiated
// by the executing thread"), become observable to a thread once that thread
// has seen the phase the arrive landed on complete (mbarrier try_wait,
// emu/sm90.h observed). Until then, reading their D, overwriting their A /
// D, or writing their shared operands is a fault naming both lines. One
// thread's tcgen05.mma / cp are ordered among themselves ("Memory
// consistency: tcgen05 instructions", pipelined tcgen05 instructions:
// mma -> mma with the same accumulator and shape, cp -> mma), so its own
// later ops may use the same cells; another thread's may not until it has
// observed their completion. A thread observes an op through a commit
// arrive that landed in its own CTA (the commit's mbarrier, or for a
// multicast one each CTA of its ctaMask). The ops and commits of a cluster
// are one ledger (rank 0's), so the cells of a pair's MMA in either CTA
// name it.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

#include "emu/numeric.h"
#include "emu/sm100.h"
#include "emu/sm90.h"

namespace fa {
namespace emu {

// ------------------------------------------------------ descriptors ----

bool decode_umma_smem_desc(uint64_t desc, SmemMatrix *m, std::string *why) {
  auto field = [desc](int lo, int bits) {
    return static_cast<uint32_t>((desc >> lo) & ((uint64_t{1} << bits) - 1));
  };
  if (field(14, 2) || field(30, 2)) {
    *why = "bits 14-15 and 30-31 are reserved (0)";
    return false;
  }
  if (field(46, 3) != 1) {
    *why =
        "bits 46-48 must hold the fixed value 0b001 (the sm_100 descriptor; a wgmma "
        "descriptor has 0 there)";
    return false;
  }
  if (field(53, 8)) {
    *why = "bits 53-60 must hold the fixed value 0";
    return false;
  }
  if (field(52, 1)) {
    *why = "leading-dimension stride mode 1 (absolute address, sm_103a) is not modelled";
    return false;
  }
  // Mode -> SmemMatrix::bits (-1: not modelled, -2: invalid).
  static const int kBits[8] = {0, -1, 3, -2, 2, -2, 1, -2};
  const uint32_t mode = field(61, 3);
  if (kBits[mode] == -1) {
    *why = "swizzle mode 1 (128-byte with 32-byte atomic swizzling) is not modelled";
    return false;
  }
  if (kBits[mode] < 0) {
    *why = "swizzle mode " + std::to_string(mode) + " is invalid (3, 5 and 7 are)";
    return false;
  }
  m->bits = static_cast<uint32_t>(kBits[mode]);
  m->start = field(0, 14) << 4;
  m->lbo = field(16, 14) << 4;
  m->sbo = (g_sm100_bug == kSm100BugSboAsLbo ? field(16, 14) : field(32, 14)) << 4;
  m->base = field(49, 3);
  return true;
}

bool decode_umma_idesc(uint32_t idesc, bool f8f6f4, UmmaInstr *d, std::string *why,
                       uint32_t cta_group) {
  auto field = [idesc](int lo, int bits) { return (idesc >> lo) & ((1u << bits) - 1); };
  if (field(2, 1)) {
    *why = "sparsity (bit 2) is not modelled";
    return false;
  }
  if (field(0, 2)) {
    *why = "the sparsity selector (bits 0-1) must be 0 for a dense MMA";
    return false;
  }
  if (field(3, 1)) {
    *why = "saturate (bit 3) is for kind::i8 only";
    return false;
  }
  if (field(6, 1) || field(23, 1) || field(29, 1)) {
    *why = "bits 6, 23 and 29 are reserved (0)";
    return false;
  }
  if (field(30, 2)) {
    *why = "the maximum shift (bits 30-31) is for .ws only";
    return false;
  }
  const uint32_t dtype = field(4, 2), at = field(7, 3), bt = field(10, 3);
  if (dtype == 0 && !f8f6f4) {
    *why = "dtype F16 (bits 4-5 = 0) is not modelled: only F32 D";
    return false;
  }
  if (dtype != 1) {
    *why = "dtype (bits 4-5) " + std::to_string(dtype) + " is not F32 (1)";
    return false;
  }
  if (!f8f6f4) {
    if (at > 1 || bt > 1 || at != bt) {
      *why = "kind::f16 takes atype = btype = F16 (0) or BF16 (1) (bits 7-9, 10-12: " +
             std::to_string(at) + ", " + std::to_string(bt) + ")";
      return false;
    }
    d->bf16 = at == 1;
    d->esz = 2;
    d->k = 16;
  } else {
    for (uint32_t t : {at, bt}) {
      if (t >= 3 && t <= 5) {
        *why = "the fp6 / fp4 types (atype / btype 3, 4, 5) are not modelled";
        return false;
      }
      if (t > 1) {
        *why = "atype / btype " + std::to_string(t) + " is invalid for kind::f8f6f4";
        return false;
      }
    }
    d->a_e5m2 = at == 1;
    d->b_e5m2 = bt == 1;
    d->esz = 1;
    d->k = 32;
  }
  d->neg_a = field(13, 1);
  d->neg_b = field(14, 1);
  d->trans_a = field(15, 1);
  d->trans_b = field(16, 1);
  d->n = field(17, 6) << 3;
  d->m = field(24, 5) << 4;
  const uint32_t mlo = cta_group == 2 ? 128 : 64, nstep = cta_group == 2 ? 16 : 8;
  if (d->m != mlo && d->m != 2 * mlo) {
    *why = "M = " + std::to_string(d->m) +
           " (bits 24-28: M >> 4): cta_group::" + std::to_string(cta_group) +
           " takes M = " + std::to_string(mlo) + " or " + std::to_string(2 * mlo) +
           " (\"Matrix Shape\")";
    return false;
  }
  if (d->n < nstep || d->n > 256 || d->n % nstep) {
    *why = "N = " + std::to_string(d->n) + " (bits 17-22: N >> 3) is not one of " +
           std::to_string(nstep) + ".." + "256 step " + std::to_string(nstep) +
           " (cta_group::" + std::to_string(cta_group) + ")";
    return false;
  }
  return true;
}

namespace {

// TMEM lane of row r of an M-row D or A at lane0 (PTX ISA "Data Path
// Layout", cta_group::1): M = 128, row r in lane r; M = 64, rows 16q..16q+15
// in lanes 32q + lane0 .. (lane0 0 or 16: the lower or upper half of each
// warp's 32 lanes).
inline uint32_t row_lane(uint32_t m, uint32_t lane0, uint32_t r) {
  return m == 128 ? r : lane0 + (r % 16) + 32 * (r / 16);
}

}  // namespace

// --------------------------------------------------- bookkeeping ----

uint32_t Sm100State::new_op(uint32_t t, uint32_t pc) {
  const uint32_t id = static_cast<uint32_t>(led_->ops.size());
  AsyncOp o;
  o.pc = pc;
  o.thread = t;
  o.rank = cta_.rank_;
  led_->ops.push_back(o);
  uncommitted_[t].push_back(id);
  return id;
}

// Whether thread u (of this CTA) has observed the completion of op id: the
// phase, in this CTA, of a commit the issuing thread made after it.
bool Sm100State::async_observed(uint32_t u, uint32_t id) const {
  if (g_sm100_bug == kSm100BugCommitEarly) return true;
  const AsyncOp &o = led_->ops[id];
  if (o.commit == UINT32_MAX) return false;
  for (size_t c = o.commit; c < led_->commits.size(); ++c) {
    const Commit &k = led_->commits[c];
    if (k.rank == o.rank && k.thread == o.thread && k.dest == cta_.rank_ &&
        sm90_.observed(u, k.mbar) > k.phase)
      return true;
  }
  return false;
}

// Some thread of warp w (w = UINT32_MAX: of the CTA; pair: of the CTA or
// its peer) has observed it.
bool Sm100State::warp_observed(uint32_t w, uint32_t id, bool pair) const {
  const uint32_t lo = w == UINT32_MAX ? 0 : 32 * w;
  const uint32_t hi = w == UINT32_MAX ? cta_.nthreads_ : std::min(32 * w + 32, cta_.nthreads_);
  for (uint32_t u = lo; u < hi; ++u)
    if (async_observed(u, id)) return true;
  return pair && cta_.cluster_->sm100[cta_.rank_ ^ 1]->warp_observed(UINT32_MAX, id, false);
}

// "tcgen05.mma.cta_group::1.kind::f16 at PTX line N (thread (..) block (..))".
std::string Sm100State::op_text(uint32_t id) const {
  const AsyncOp &o = led_->ops[id];
  const Cluster *cl = cta_.cluster_;
  const Cta &c = cl && o.rank < cl->size ? *cl->ctas[o.rank] : cta_;
  return cta_.e_.op_text[o.pc] + " at PTX line " + std::to_string(cta_.e_.code[o.pc].line) + " (" +
         c.thread_text(o.thread) + ")";
}

// Warp w's tcgen05.ld (write false) or st / dealloc (write true) of lanes
// [lane, lane + nlanes) x columns [col, col + n): no cell written by an
// async op (nor, write, read by one as A) whose completion the warp (w =
// UINT32_MAX: any thread; pair: of the CTA pair) has not observed.
bool Sm100State::check_cells(uint32_t w, uint32_t pc, uint32_t lane, uint32_t nlanes, uint32_t col,
                             uint32_t n, bool write, bool pair) {
  uint32_t ok_wr = 0, ok_rd = 0;  // the last ids found observed
  for (uint32_t i = lane; i < lane + nlanes; ++i) {
    for (uint32_t j = col; j < col + n; ++j) {
      const size_t cell = static_cast<size_t>(i) * kColumns + j;
      for (int rd = 0; rd < (write ? 2 : 1); ++rd) {
        const uint32_t id = rd ? cell_rd_[cell] : cell_wr_[cell];
        uint32_t &ok = rd ? ok_rd : ok_wr;
        if (!id || id == ok) continue;
        if (warp_observed(w, id, pair)) {
          ok = id;
          continue;
        }
        const char *who = w != UINT32_MAX ? "no thread of this warp"
                          : pair          ? "no thread of the CTA pair"
                                          : "no thread";
        return cta_.fail_at(
            pc, w == UINT32_MAX ? UINT32_MAX : 32 * w,
            "tensor memory lane %u column %u (CTA rank %u) is %s by the %s, whose completion %s "
            "has observed: wait on the mbarrier phase of a tcgen05.commit its thread issued after "
            "it (PTX ISA \"tcgen05.commit\", \"Memory consistency: tcgen05 instructions\")",
            i, j, cta_.rank_, rd ? "read as A" : "written", op_text(id).c_str(), who);
      }
    }
  }
  return true;
}

bool Sm100State::shared_write_slow(uint32_t t, uint32_t pc, uint32_t chunk) {
  const uint32_t id = chunk_op_[chunk];
  if (async_observed(t, id)) {
    chunk_op_[chunk] = 0;  // the writer knows the op is done: the chunk is free
    return true;
  }
  return cta_.fail_at(pc, t,
                      "writes shared [0x%x, 0x%x), an operand of the %s, whose completion this "
                      "thread has not observed: overwrite it only after waiting on the mbarrier "
                      "phase of a tcgen05.commit issued after it (PTX ISA \"tcgen05.commit\", "
                      "\"Memory consistency: tcgen05 instructions\")",
                      16 * chunk, 16 * chunk + 16, op_text(id).c_str());
}

// The tensor memory operand at taddr, in CTA x's tensor memory, of an op
// of M rows and ncols columns (D, A, or the cp destination): *lane0 its
// lane field (M = 128: 0; M = 64: 0 or 16), its columns inside one live
// allocation.
bool Sm100State::umma_cells(const Sm100State &x, uint32_t t, uint32_t pc, uint32_t taddr,
                            uint32_t m, uint32_t ncols, const char *what, uint32_t *lane0) {
  *lane0 = taddr >> 16;
  const uint32_t col = taddr & 0xffff;
  if (m == 128 ? *lane0 != 0 : (*lane0 != 0 && *lane0 != 16))
    return cta_.fail_at(pc, t,
                        "%s taddr 0x%08x: lane %u; an M = %u operand starts at lane 0%s (PTX ISA "
                        "\"Data Path Layout\")",
                        what, taddr, *lane0, m, m == 64 ? " or 16" : "");
  if (col + ncols > kColumns || !x.alloc_at(col, ncols))
    return cta_.fail_at(pc, t,
                        "%s taddr 0x%08x: columns %u..%u are not inside one live allocation of CTA "
                        "rank %u (live allocations: %s)",
                        what, taddr, col, col + ncols - 1, x.cta_.rank_, x.allocs_text().c_str());
  return true;
}

// The issuing thread t's op uses the cells of CTA x's rows 0..m-1
// (row_lane) x [col, col + ncols), writing them (write) or reading them:
// none is the source of an unwaited tcgen05.st, none is used by an
// unobserved op of another thread (one thread's ops are ordered; two
// threads' are not).
bool Sm100State::issuer_cells(Sm100State &x, uint32_t t, uint32_t pc, uint32_t lane0, uint32_t m,
                              uint32_t col, uint32_t ncols, bool write) {
  uint32_t ok = 0;
  for (uint32_t r = 0; r < m; ++r) {
    const uint32_t lane = row_lane(m, lane0, r);
    for (uint32_t j = col; j < col + ncols; ++j) {
      const size_t cell = static_cast<size_t>(lane) * kColumns + j;
      if (x.st_cell_[cell])
        return cta_.fail_at(pc, t,
                            "tensor memory lane %u column %u (CTA rank %u) was written by the "
                            "tcgen05.st at PTX line %u (warp %u), not yet waited for: "
                            "tcgen05.wait::st, then tcgen05.fence::before_thread_sync and a "
                            "barrier, first",
                            lane, j, x.cta_.rank_,
                            cta_.e_.code[static_cast<uint32_t>(x.st_cell_[cell]) - 1].line,
                            static_cast<uint32_t>(x.st_cell_[cell] >> 32));
      for (int rd = 0; rd < (write ? 2 : 1); ++rd) {
        const uint32_t id = rd ? x.cell_rd_[cell] : x.cell_wr_[cell];
        if (!id || id == ok) continue;
        const AsyncOp &o = led_->ops[id];
        if ((o.thread == t && o.rank == cta_.rank_) || async_observed(t, id)) {
          ok = id;
          continue;
        }
        return cta_.fail_at(pc, t,
                            "tensor memory lane %u column %u (CTA rank %u) is %s by the %s, issued "
                            "by another thread and not observed complete by this one: tcgen05 ops "
                            "of different threads are not ordered (PTX ISA \"Memory consistency: "
                            "tcgen05 instructions\"); issue them from one thread or wait on its "
                            "commit's mbarrier",
                            lane, j, x.cta_.rank_, rd ? "read as A" : "written",
                            op_text(id).c_str());
      }
    }
  }
  return true;
}

bool Sm100State::smem_desc(uint32_t t, uint32_t pc, uint64_t desc, const char *what,
                           SmemMatrix *m) {
  std::string why;
  if (decode_umma_smem_desc(desc, m, &why)) return true;
  return cta_.fail_at(pc, t,
                      "%s shared memory descriptor 0x%016" PRIx64
                      ": %s (PTX ISA \"Shared Memory Descriptor\")",
                      what, desc, why.c_str());
}

// The shared address of element (mn, k) of the operand, inside the
// block's shared memory (every CTA of the launch has the same size).
bool Sm100State::smem_element(uint32_t t, uint32_t pc, const SmemMatrix &d, bool mn_major,
                              uint32_t mn, uint32_t k, uint32_t esz, const char *what,
                              uint32_t *addr) {
  *addr = smem_matrix_addr(d, mn_major, mn, k, esz);
  if (*addr + esz <= cta_.smem_size_) return true;
  return cta_.fail_at(pc, t,
                      "%s element (%u, %u) at shared 0x%x lies outside the block's %u bytes of "
                      "shared memory",
                      what, mn, k, *addr, cta_.smem_size_);
}

// -------------------------------------------------------- tcgen05.mma ----
// PTX ISA "tcgen05.mma": D (M x N, f32, tensor memory at d_taddr) = A (M x
// K) * B (K x N) + (enable-input-d ? D : 0); A from a shared memory
// descriptor or tensor memory, B from a shared memory descriptor; shapes,
// types, negation and transposes from the instruction descriptor. A in
// tensor memory: row r in lane row_lane(r), its K elements packed low to
// high in K * esz / 4 consecutive 32-bit columns (element k in column k *
// esz / 4, bits 8 esz (k % (4 / esz)) up). Arithmetic: each D element is
// mma_dot_f32 over k = 0..K-1 in order (an exact product, one f32 rounding
// per add), the chain wgmma and mma.sync use.
//
// .cta_group::2 ("CTA Pair", "Issue Granularity": one thread of either CTA
// of the pair issues it; CUTLASS's SM100_MMA_*_2x1SM_* layouts, the ISA's
// "Data Path Layout" for the pair): CTA h of the pair (h = rank & 1) holds
// rows h M/2 .. h M/2 + M/2 - 1 of A (its shared memory at the same
// descriptor, or its tensor memory at the same taddr) and of D (its tensor
// memory at the same taddr), and columns h N/2 .. h N/2 + N/2 - 1 of B (its
// shared memory at the same descriptor, element (j, k) of the local matrix
// being column h N/2 + j). D's lanes: M = 256, local row r in lane r, N
// columns; M = 128, local row r (< 64), column c in lane r + 64 (c >= N/2),
// column c mod N/2 (N/2 columns), and A in tensor memory is read for
// column c from the same lane, so its 64 rows are duplicated in lanes
// 64..127 (CUTLASS's TmemAllocMode::Duplicated).
bool Sm100State::umma(uint32_t t, uint32_t pc, const uint64_t *r) {
  const Inst &in = cta_.e_.code[pc];
  const bool atm = in.sub & kUmmaATmem, pair = in.sub & kUmmaPair;
  Sm100State *half[2] = {this, this};
  if (pair && !pair_states(t, pc, half)) return false;
  UmmaInstr id;
  std::string why;
  const uint32_t idesc = static_cast<uint32_t>(r[in.e]);
  if (!decode_umma_idesc(idesc, in.sub & kUmmaF8F6F4, &id, &why, pair ? 2 : 1))
    return cta_.fail_at(pc, t,
                        "instruction descriptor 0x%08x: %s (PTX ISA \"Instruction Descriptor\")",
                        idesc, why.c_str());
  if (g_sm100_bug == kSm100BugNoTransB) id.trans_b = false;
  const uint32_t nh = pair ? 2 : 1, m = id.m, n = id.n, kk = id.k, esz = id.esz;
  const uint32_t mh = m / nh;                // rows of A and D per CTA
  const bool split = pair && m == 128;       // D's column halves in lanes 0-63 / 64-127
  const uint32_t dcols = split ? n / 2 : n;  // D columns per CTA
  const uint32_t lm = pair ? 128 : m;        // the lanes used: the pair's all 128
  const uint32_t acols = kk * esz / 4;
  const uint32_t dt = static_cast<uint32_t>(r[in.a]);
  uint32_t d_lane0 = 0, a_lane0 = 0, a_col = 0;
  for (uint32_t h = 0; h < nh; ++h)
    if (!umma_cells(*half[h], t, pc, dt, lm, dcols, "D", &d_lane0) ||
        !issuer_cells(*half[h], t, pc, d_lane0, lm, dt & 0xffff, dcols, true))
      return false;
  SmemMatrix da, db;
  // A in tensor memory (CUTLASS SM100_MMA_*_TS, whose shapes ptxas does not
  // police): K-major only; N a multiple of 16 for M = 128 (cta_group::1),
  // of 32 for the pair (SM100_MMA_F16BF16_2x1SM_TS).
  if (atm && id.trans_a)
    return cta_.fail_at(pc, t,
                        "instruction descriptor 0x%08x: A in tensor memory cannot be transposed "
                        "(bit 15 must be 0)",
                        idesc);
  const uint32_t nmul = pair ? 32 : m == 128 ? 16 : 8;
  if (atm && n % nmul)
    return cta_.fail_at(pc, t,
                        "instruction descriptor 0x%08x: N = %u; with A in tensor memory and M = "
                        "%u%s, N is a multiple of %u",
                        idesc, n, m, pair ? " (cta_group::2)" : "", nmul);
  if (atm) {
    const uint32_t at = static_cast<uint32_t>(r[in.b]);
    a_col = at & 0xffff;
    for (uint32_t h = 0; h < nh; ++h)
      if (!umma_cells(*half[h], t, pc, at, lm, acols, "A", &a_lane0) ||
          !issuer_cells(*half[h], t, pc, a_lane0, lm, a_col, acols, false))
        return false;
  } else if (!smem_desc(t, pc, r[in.b], "A", &da)) {
    return false;
  }
  if (!smem_desc(t, pc, r[in.c], "B", &db)) return false;
  const uint32_t op = new_op(t, pc);
  const float *ta = fp8_table(id.a_e5m2), *tb = fp8_table(id.b_e5m2);
  const float sa = id.neg_a ? -1.0f : 1.0f, sb = id.neg_b ? -1.0f : 1.0f;
  auto value = [&](uint32_t bits, const float *t8) {
    if (esz == 1) return t8[bits & 0xff];
    const uint16_t h = static_cast<uint16_t>(bits);
    return id.bf16 ? bf16_to_f32(h) : f16_to_f32(h);
  };
  // A shared operand's element (mn, k) in CTA x: its bits; its chunk marked read.
  auto load = [&](Sm100State &x, const SmemMatrix &dm, bool mn_major, uint32_t mn, uint32_t k,
                  const char *what, uint32_t *bits) {
    uint32_t a;
    if (!smem_element(t, pc, dm, mn_major, mn, k, esz, what, &a)) return false;
    uint16_t h = 0;
    std::memcpy(&h, x.cta_.smem_.data() + a, esz);
    *bits = h;
    x.chunk_op_[a / 16] = op;
    return true;
  };
  // A's rows (copy 1: M = 128 pair, A in tensor memory, the lanes 64.. copy).
  const uint32_t ncopy = split && atm ? 2 : 1;
  mma_a_.assign(static_cast<size_t>(ncopy) * m * kk, 0.0f);
  mma_b_.assign(static_cast<size_t>(n) * kk, 0.0f);
  for (uint32_t h = 0; h < nh; ++h) {
    Sm100State &x = *half[h];
    x.any_reader_ = x.touched_ = true;
    for (uint32_t row = 0; row < mh; ++row) {
      for (uint32_t k = 0; k < kk; ++k) {
        for (uint32_t cp = 0; cp < ncopy; ++cp) {
          uint32_t bits;
          if (atm) {
            const uint32_t lane = pair ? row + 64 * cp : row_lane(m, a_lane0, row);
            const size_t cell = static_cast<size_t>(lane) * kColumns + a_col + k * esz / 4;
            bits = x.tmem_[cell] >> (8 * esz * (k % (4 / esz)));
            x.cell_rd_[cell] = op;
          } else if (!load(x, da, id.trans_a, row, k, "A", &bits)) {
            return false;
          }
          mma_a_[(static_cast<size_t>(cp) * m + h * mh + row) * kk + k] = sa * value(bits, ta);
        }
      }
    }
  }
  const uint32_t nb = n / nh;  // B columns per CTA
  for (uint32_t c = 0; c < n; ++c) {
    uint32_t h = c / nb;
    if (pair && g_sm100_bug == kSm100BugPairBSwap) h ^= 1;
    for (uint32_t k = 0; k < kk; ++k) {
      uint32_t bits;
      if (!load(*half[h], db, id.trans_b, c % nb, k, "B", &bits)) return false;
      mma_b_[c * kk + k] = sb * value(bits, tb);
    }
  }
  const bool accumulate = r[in.v[0]] != 0;
  const uint32_t d_col = dt & 0xffff;
  for (uint32_t h = 0; h < nh; ++h) {
    Sm100State &x = *half[g_sm100_bug == kSm100BugPairDEven ? 0 : h];
    for (uint32_t row = 0; row < mh; ++row) {
      const uint32_t grow = h * mh + row;
      for (uint32_t c = 0; c < n; ++c) {
        const uint32_t hi = split && c >= dcols ? 1 : 0;
        uint32_t lane = pair ? row + 64 * hi : row_lane(m, d_lane0, row);
        if (g_sm100_bug == kSm100BugDLaneOff) lane = (lane + 1) % kLanes;
        const size_t cell = static_cast<size_t>(lane) * kColumns + d_col + c - hi * dcols;
        const float d0 = accumulate ? bits_f32(x.tmem_[cell]) : 0.0f;
        const float *arow = &mma_a_[(static_cast<size_t>(ncopy > 1 ? hi : 0) * m + grow) * kk];
        x.tmem_[cell] = f32_bits(mma_dot_f32(d0, arow, &mma_b_[c * kk], static_cast<int>(kk), 1));
        x.cell_wr_[cell] = op;
      }
    }
  }
  return true;
}

// --------------------------------------------------------- tcgen05.cp ----
// PTX ISA "tcgen05.cp": an asynchronous copy from shared memory (the matrix
// the descriptor describes) into tensor memory at taddr: .128x256b fills
// lanes 0..127 x 8 columns, .128x128b lanes 0..127 x 4 columns. The
// emulator's reading of the source: row l of a K-major matrix of bytes in
// the descriptor's canonical layout (emu/smem_matrix.h) goes to lane l, its
// 16-byte core-matrix rows in column order, bytes low to high in each
// 32-bit cell.
bool Sm100State::utc_cp(uint32_t t, uint32_t pc, const uint64_t *r) {
  const Inst &in = cta_.e_.code[pc];
  const uint32_t ncols = in.sub == 1 ? 4 : 8;
  const uint32_t taddr = static_cast<uint32_t>(r[in.a]), col = taddr & 0xffff;
  uint32_t lane0 = 0;
  SmemMatrix d;
  if (!umma_cells(*this, t, pc, taddr, 128, ncols, "the destination", &lane0) ||
      !issuer_cells(*this, t, pc, 0, 128, col, ncols, true) ||
      !smem_desc(t, pc, r[in.b], "s-desc", &d))
    return false;
  const uint32_t op = new_op(t, pc);
  for (uint32_t l = 0; l < kLanes; ++l) {
    for (uint32_t j = 0; j < ncols / 4; ++j) {
      uint32_t a;
      if (!smem_element(t, pc, d, false, l, 16 * j, 1, "source", &a)) return false;
      if (a + 16 > cta_.smem_size_)
        return cta_.fail_at(pc, t, "source row %u at shared 0x%x runs past the block's %u bytes", l,
                            a, cta_.smem_size_);
      const size_t cell = static_cast<size_t>(l) * kColumns + col + 4 * j;
      std::memcpy(tmem_.data() + cell, cta_.smem_.data() + a, 16);
      for (uint32_t q = 0; q < 4; ++q) cell_wr_[cell + q] = op;
      chunk_op_[a / 16] = op;
    }
  }
  any_reader_ = touched_ = true;
  return true;
}

// ----------------------------------------------------- tcgen05.commit ----
// PTX ISA "tcgen05.commit": the mbarrier tracks the completion of every
// prior asynchronous tcgen05 op (mma, cp) of the executing thread; one
// arrive-on when they complete (.mbarrier::arrive::one). Here they are
// complete already: the arrive happens now. A commit with nothing to track
// arrives all the same (the ISA makes no exception for it). The mbarrier:
// .shared::cluster, its address names a CTA of the cluster (mapa) or is
// the executing CTA's; .multicast::cluster, the arrive goes to the mbarrier
// at the same offset in each CTA whose %cluster_ctarank bit is set in the
// 16-bit ctaMask. .cta_group::2 needs the CTA pair.
bool Sm100State::commit(uint32_t t, uint32_t pc, const uint64_t *r) {
  const Inst &in = cta_.e_.code[pc];
  Sm100State *half[2];
  if (in.sub == 1 && !pair_states(t, pc, half)) return false;
  const uint32_t addr = static_cast<uint32_t>(static_cast<uint32_t>(r[in.a]) + in.imm);
  uint32_t off = addr, mask = 1u << cta_.rank_;
  if (in.flags & kClusterSpace) {
    const Cta *c = cta_.cluster_target(addr, 8, t, pc, &off);
    if (!c) return false;
    mask = 1u << c->rank_;
  }
  const Cluster &cl = *cta_.cluster_;
  if (in.flags & kMulticast) {
    mask = static_cast<uint32_t>(r[in.b]) & 0xffff;
    if (mask >> cl.size)
      return cta_.fail_at(pc, t,
                          "ctaMask 0x%04x names CTA rank %u, but the cluster has %u CTAs (ranks "
                          "0..%u)",
                          mask, 31 - __builtin_clz(mask), cl.size, cl.size - 1);
    if (g_sm100_bug == kSm100BugMulticastSkip && (mask & (mask - 1)))
      mask &= ~(1u << (31 - __builtin_clz(mask)));
  }
  const uint32_t first = static_cast<uint32_t>(led_->commits.size());
  for (uint32_t dest = 0; dest < cl.size; ++dest) {
    if (!((mask >> dest) & 1)) continue;
    uint32_t phase = 0;
    if (!sm90_.async_arrive(t, pc, *cl.sm90[dest], off, &phase)) return false;
    if (has_async_) led_->commits.push_back(Commit{t, cta_.rank_, dest, off, phase, pc});
  }
  if (!has_async_) return true;
  for (uint32_t id : uncommitted_[t]) led_->ops[id].commit = first;
  uncommitted_[t].clear();
  return true;
}

// The block exits: every tcgen05.mma / cp was committed.
bool Sm100State::finish_async() {
  for (uint32_t u = 0; u < cta_.nthreads_; ++u) {
    if (uncommitted_[u].empty()) continue;
    const AsyncOp &o = led_->ops[uncommitted_[u].front()];
    return cta_.fail_at(o.pc, u,
                        "the block exited with this op never committed: no tcgen05.commit after "
                        "it, so nothing tracked its completion (PTX ISA \"tcgen05.commit\")");
  }
  return true;
}

}  // namespace emu
}  // namespace fa

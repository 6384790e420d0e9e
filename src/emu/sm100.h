// The sm_100 state of a CTA (emu/arch.h): tensor memory (TMEM) and the
// tcgen05 instructions: tcgen05.alloc / dealloc / relinquish_alloc_permit,
// tcgen05.ld / st (.32x32b), tcgen05.wait (::ld, ::st), and the
// asynchronous tcgen05.mma (kind::f16, kind::f8f6f4), tcgen05.cp (128x256b,
// 128x128b) and tcgen05.commit (an arrive on an mbarrier of emu/sm90.h,
// .multicast::cluster to several CTAs), with their hazards checked; alloc,
// dealloc, mma and commit also with .cta_group::2, the CTA pair (ranks 2k,
// 2k + 1 of a cluster: each reaches the other's state through
// Cluster::sm100). docs/emulator.md, "Blackwell (sm_100a)", has the model
// and its sources in the PTX ISA (section "tcgen05": "Tensor Memory", "CTA
// Pair", "Issue Granularity", "Matrix and Data Movement Shape", "Matrix
// Descriptors", "Matrix Shape", "Data Path Layout", the instructions' own
// sections). .ws, sparsity, block scaling and tcgen05.cp.cta_group::2 are
// not modelled. Internal to the emulator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "emu/arch.h"
#include "emu/cta.h"
#include "emu/smem_matrix.h"

namespace fa {
namespace emu {

class Sm90State;

// Deliberate emulator bugs, for the tests that must catch each one
// (tests/test_emulator_blackwell.cc); kSm100BugNone in normal use. Read at
// each instruction, so a test sets it around one launch.
enum Sm100Bug : int {
  kSm100BugNone = 0,
  kSm100BugLaneOffByOne,  // tcgen05.ld: thread lane i reads TMEM lane + i + 1 (mod 32)
  kSm100BugColumnSwap,    // tcgen05.st: registers j and j ^ 1 swap columns
  kSm100BugNoWaitLd,      // tcgen05.ld: its registers are not marked in flight
  kSm100BugNoWaitSt,      // tcgen05.st: its cells are not marked in flight
  kSm100BugNoLeakCheck,   // the block's exit does not check for live allocations
  kSm100BugNoQuarter,     // tcgen05.ld / st: the warp's lane quarter is not checked
  kSm100BugSboAsLbo,      // tcgen05 descriptors: the stride byte offset reads the LBO field
  kSm100BugNoTransB,      // tcgen05.mma: the instruction descriptor's transpose-B bit is ignored
  kSm100BugCommitEarly,   // every tcgen05.mma / cp counts as observed complete (no hazard checks)
  kSm100BugDLaneOff,      // tcgen05.mma: D row m goes to TMEM lane (its lane + 1) mod 128
  // (tests/test_emulator_umma2.cc, cta_group::2)
  kSm100BugPairBSwap,      // B's column halves read from the other CTA of the pair
  kSm100BugPairDEven,      // the odd CTA's D rows written into the even CTA's tensor memory
  kSm100BugMulticastSkip,  // a multicast tcgen05.commit skips the highest CTA of its ctaMask
};

// The tcgen05 shared memory descriptor (PTX ISA "tcgen05": "Shared Memory
// Descriptor", Table 40), decoded: start 0-13, LBO 16-29, SBO 32-45 (each
// >> 4), the fixed 0b001 at 46-48, base offset 49-51, leading-dimension
// stride mode 52 (0 relative; 1 absolute is sm_103a), 0 at 53-60, swizzle
// 61-63 (0 none, 1 128B with 32B atom, 2 128B, 4 64B, 6 32B; 3, 5, 7
// invalid). False: *why says which field is invalid or not modelled (the
// 32B-atom 128B swizzle, the absolute leading-dimension mode).
bool decode_umma_smem_desc(uint64_t desc, SmemMatrix *m, std::string *why);

// The instruction descriptor of kind::f16 / kind::f8f6f4 (PTX ISA
// "Instruction Descriptor", Table 42), decoded and checked against "Matrix
// Shape" (Table 39), dense, no .ws: cta_group::1 M 64 / 128, N 8..256 step
// 8; cta_group::2 M 128 / 256 (M >> 4 = 16 fits the 5-bit field at 24-28),
// N 16..256 step 16 (CUTLASS SM100_MMA_F16BF16_2x1SM_SS's bounds).
struct UmmaInstr {
  uint32_t m = 0, n = 0, k = 0;         // M, N as above, K 16 (f16) / 32 (f8f6f4)
  uint32_t esz = 2;                     // bytes per A / B element
  bool bf16 = false;                    // kind::f16: bf16 A and B (else f16)
  bool a_e5m2 = false, b_e5m2 = false;  // kind::f8f6f4: e5m2 (else e4m3)
  bool neg_a = false, neg_b = false;
  bool trans_a = false, trans_b = false;  // MN-major A / B (else K-major)
};
// False: *why names the field. f8f6f4: kind::f8f6f4; cta_group 1 or 2.
bool decode_umma_idesc(uint32_t idesc, bool f8f6f4, UmmaInstr *d, std::string *why,
                       uint32_t cta_group = 1);
extern int g_sm100_bug;

class Sm100State final : public ArchState {
 public:
  // Tensor memory geometry per CTA (PTX ISA "Tensor Memory"): 128 lanes of
  // 512 columns of 32-bit cells; an address is lane << 16 | column.
  static constexpr uint32_t kLanes = 128, kColumns = 512;

  Sm100State(Cta &cta, Sm90State &sm90);

  void reset_block() override;
  // tcgen05.mma, tcgen05.cp, tcgen05.commit (the tcgen05 fences are parsed
  // away: the emulator runs one thread's tcgen05 ops in program order).
  Step exec(uint32_t t, uint32_t pc, uint64_t *r) override;
  // No collectives of its own beyond run_warp's: 0.
  int resolve_collectives(std::string *stuck) override;
  // The tcgen05 warp collectives.
  int run_warp(uint32_t w, uint32_t pc) override;
  // A warp blocked at tcgen05.alloc.
  std::string wait_text(uint32_t t, uint32_t nwait) override;
  bool finish_block() override;

  // --- hooks of the interpreter loop

  // Whether thread t has registers of a tcgen05.ld or st not yet waited
  // for: it then runs the interpreter variant that checks each instruction
  // with touches_pending.
  bool in_flight(uint32_t t) const { return __builtin_expect(has_tmem_, 0) && pend_count_[t]; }
  const uint8_t *pending_row(uint32_t t) const {
    return pend_.data() + static_cast<size_t>(t) * cta_.ns_;
  }
  // Whether the instruction reads or writes a register of an unwaited
  // tcgen05.ld (flag kPendLd) or writes a source register of an unwaited
  // tcgen05.st (kPendSt). pend: the thread's row, ns slots, os:
  // Entry::operand_slots.
  static bool touches_pending(const Inst &in, const uint8_t *pend, uint32_t ns, const uint32_t *os);
  // The fault of an instruction touches_pending caught.
  __attribute__((noinline, cold)) void fault_pending(uint32_t t, uint32_t pc);

  static constexpr uint8_t kPendLd = 1, kPendSt = 2;

  // Whether writes into shared memory must be reported with shared_write
  // (the entry has tcgen05.mma or cp, which read shared memory
  // asynchronously).
  bool watches_shared() const { return has_async_; }
  // Thread t's write of shared [addr, addr + n) by the instruction at pc
  // (st.shared, st, stmatrix, a performed cp.async, a TMA box landing).
  // False (error set, naming both lines): it overwrites an operand of a
  // tcgen05.mma / cp whose completion t has not observed.
  bool shared_write(uint32_t t, uint32_t pc, uint32_t addr, uint32_t n) {
    if (!has_async_ || !any_reader_) return true;
    for (uint32_t c = addr / 16; c <= (addr + n - 1) / 16; ++c)
      if (chunk_op_[c] && !shared_write_slow(t, pc, c)) return false;
    return true;
  }

 private:
  // A live allocation (PTX ISA "tcgen05.alloc"): columns [col, col + ncols)
  // of all 128 lanes.
  struct Alloc {
    uint32_t col = 0, ncols = 0;
    uint32_t pc = 0;  // the tcgen05.alloc
  };
  // A deallocated one, for the message of a second dealloc.
  struct Freed {
    uint32_t col = 0, ncols = 0, pc = 0;  // pc: the tcgen05.dealloc
  };

  // A .cta_group::2 alloc / dealloc of warp w (the instruction at pc) not
  // yet performed: the pair's first warp waits at it for the other's
  // (PTX ISA "Issue Granularity"); done once the other performed both.
  struct PairReq {
    uint32_t pc = UINT32_MAX, w = 0, ncols = 0, taddr = 0;
    uint8_t *dst = nullptr;  // alloc: where the address goes
    bool done = false;
  };

  std::string allocs_text() const;
  const Alloc *alloc_at(uint32_t col, uint32_t n) const;
  bool cols_free(uint32_t col, uint32_t n) const;
  bool uniform(uint32_t w, uint32_t pc, uint32_t slot, const char *what);
  bool pair_states(uint32_t t, uint32_t pc, Sm100State **half);
  int pair_begin(uint32_t w, uint32_t pc);
  bool pair_match(uint32_t w, uint32_t pc, const Sm100State &peer);
  int tmem_alloc(uint32_t w, uint32_t pc);
  int pair_alloc(uint32_t w, uint32_t pc, uint32_t ncols, uint8_t *dst);
  int tmem_dealloc(uint32_t w, uint32_t pc);
  bool dealloc_cols(uint32_t w, uint32_t pc, uint32_t taddr, uint32_t ncols, bool pair);
  bool tmem_access(uint32_t w, uint32_t pc, uint32_t *lane, uint32_t *col);
  bool tmem_ld(uint32_t w, uint32_t pc);
  bool tmem_st(uint32_t w, uint32_t pc);
  void tmem_wait(uint32_t w, bool st);
  void mark(uint32_t w, const Inst &in, uint8_t flag);

  // --- the asynchronous ops (emu/sm100_mma.cc)
  // One issued tcgen05.mma or cp, by thread `thread` of CTA rank `rank`;
  // ops[0] is a placeholder (id 0: none).
  struct AsyncOp {
    uint32_t pc = 0, thread = 0, rank = 0;
    uint32_t commit = UINT32_MAX;  // commits index of the first commit after it
  };
  // One arrive of a tcgen05.commit (thread `thread` of CTA rank `rank`): it
  // landed on phase `phase` of the mbarrier at shared offset mbar of CTA
  // rank dest (a multicast commit makes one per CTA of its mask).
  struct Commit {
    uint32_t thread = 0, rank = 0, dest = 0, mbar = 0, phase = 0, pc = 0;
  };
  // The cluster's ops and commits (a pair's MMA writes both CTAs' cells):
  // rank 0's own_, which every CTA of the cluster points to (led_).
  struct Ledger {
    std::vector<AsyncOp> ops;
    std::vector<Commit> commits;
  };
  bool async_observed(uint32_t u, uint32_t id) const;
  bool warp_observed(uint32_t w, uint32_t id, bool pair = false) const;
  std::string op_text(uint32_t id) const;
  bool check_cells(uint32_t w, uint32_t pc, uint32_t lane, uint32_t nlanes, uint32_t col,
                   uint32_t n, bool write, bool pair = false);
  bool shared_write_slow(uint32_t t, uint32_t pc, uint32_t chunk);
  bool umma_cells(const Sm100State &x, uint32_t t, uint32_t pc, uint32_t taddr, uint32_t m,
                  uint32_t ncols, const char *what, uint32_t *lane0);
  bool issuer_cells(Sm100State &x, uint32_t t, uint32_t pc, uint32_t lane0, uint32_t m,
                    uint32_t col, uint32_t ncols, bool write);
  bool smem_desc(uint32_t t, uint32_t pc, uint64_t desc, const char *what, SmemMatrix *m);
  bool smem_element(uint32_t t, uint32_t pc, const SmemMatrix &d, bool mn_major, uint32_t mn,
                    uint32_t k, uint32_t esz, const char *what, uint32_t *addr);
  uint32_t new_op(uint32_t t, uint32_t pc);
  bool umma(uint32_t t, uint32_t pc, const uint64_t *r);
  bool utc_cp(uint32_t t, uint32_t pc, const uint64_t *r);
  bool commit(uint32_t t, uint32_t pc, const uint64_t *r);
  bool finish_async();

  Cta &cta_;
  Sm90State &sm90_;
  bool has_async_ = false;   // the entry has tcgen05.mma or cp
  bool any_reader_ = false;  // some chunk_op_ is set in this block
  bool touched_ = false;     // some cell_wr_ / cell_rd_ / chunk_op_ is set in this block
  Ledger own_;
  Ledger *led_ = &own_;
  std::vector<std::vector<uint32_t>> uncommitted_;  // per thread: ops not yet committed
  // Per TMEM cell: the newest async op writing it (cell_wr_) / reading it
  // as A (cell_rd_); per 16-byte shared chunk: the newest reading it. 0: none.
  std::vector<uint32_t> cell_wr_, cell_rd_, chunk_op_;
  std::vector<float> mma_a_, mma_b_, mma_d_;  // umma scratch
  bool has_tmem_ = false;                     // the entry has tcgen05 instructions
  std::vector<uint32_t> tmem_;                // [lane][column]
  std::vector<Alloc> allocs_;
  std::vector<Freed> freed_;
  uint32_t relinquish_pc_ = UINT32_MAX;  // tcgen05.relinquish_alloc_permit run, or none
  PairReq req_;
  // Registers of unwaited tcgen05.ld (kPendLd) / st (kPendSt): [thread][slot].
  std::vector<uint8_t> pend_;
  std::vector<uint32_t> pend_count_;  // per thread: slots with pend_ != 0
  // An unwaited tcgen05.st: its pc and the cells it wrote (lanes [lane,
  // lane + 32), columns [col, col + n)).
  struct StRec {
    uint32_t pc, lane, col, n;
  };
  // Per warp, its unwaited tcgen05.ld (pcs) and st, in issue order.
  std::vector<std::vector<uint32_t>> lds_;
  std::vector<std::vector<StRec>> sts_;
  // Per TMEM cell: 0, or warp << 32 | (pc + 1) of the unwaited tcgen05.st
  // that wrote it.
  std::vector<uint64_t> st_cell_;
};

}  // namespace emu
}  // namespace fa

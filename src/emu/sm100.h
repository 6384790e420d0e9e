// The sm_100 state of a CTA (emu/arch.h): tensor memory (TMEM) and the
// tcgen05 data-movement instructions of cta_group::1: tcgen05.alloc /
// dealloc / relinquish_alloc_permit, tcgen05.ld / st (.32x32b), tcgen05.wait
// (::ld, ::st), with their asynchronous hazards checked.
// docs/emulator.md, "Blackwell (sm_100a)", has the model and its sources in
// the PTX ISA (section "tcgen05": "Tensor Memory", "Matrix and Data Movement
// Shape", the instructions' own sections). tcgen05.mma, commit, cp, clusters
// and cta_group::2 are not modelled yet: mma and commit will take the
// mbarriers of emu/sm90.h. Internal to the emulator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "emu/arch.h"
#include "emu/cta.h"

namespace fa {
namespace emu {

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
};
extern int g_sm100_bug;

class Sm100State final : public ArchState {
 public:
  // Tensor memory geometry per CTA (PTX ISA "Tensor Memory"): 128 lanes of
  // 512 columns of 32-bit cells; an address is lane << 16 | column.
  static constexpr uint32_t kLanes = 128, kColumns = 512;

  explicit Sm100State(Cta &cta);

  void reset_block() override;
  // No per-thread sm_100 op yet (the tcgen05 fences are parsed away).
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

  std::string allocs_text() const;
  const Alloc *alloc_at(uint32_t col, uint32_t n) const;
  bool uniform(uint32_t w, uint32_t pc, uint32_t slot, const char *what);
  int tmem_alloc(uint32_t w, uint32_t pc);
  bool tmem_dealloc(uint32_t w, uint32_t pc);
  bool tmem_access(uint32_t w, uint32_t pc, uint32_t *lane, uint32_t *col);
  bool tmem_ld(uint32_t w, uint32_t pc);
  bool tmem_st(uint32_t w, uint32_t pc);
  void tmem_wait(uint32_t w, bool st);
  void mark(uint32_t w, const Inst &in, uint8_t flag);

  Cta &cta_;
  bool has_tmem_ = false;       // the entry has tcgen05 instructions
  std::vector<uint32_t> tmem_;  // [lane][column]
  std::vector<Alloc> allocs_;
  std::vector<Freed> freed_;
  uint32_t relinquish_pc_ = UINT32_MAX;  // tcgen05.relinquish_alloc_permit run, or none
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

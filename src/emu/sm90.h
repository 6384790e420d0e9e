// The sm_90 state of a CTA (emu/arch.h): mbarriers with transaction
// counts, cp.async.bulk.tensor (TMA, tile mode), the bulk reductions
// cp.reduce.async.bulk{.tensor} with their bulk async-groups, the warpgroup collectives
// (wgmma.fence / commit_group / wait_group / mma_async, setmaxnreg), and the
// missing-proxy-fence check (generic shared writes read by wgmma without
// fence.proxy.async). docs/emulator.md, "Hopper (sm_90a)", has the model and
// its sources in the PTX ISA. Generic addressing, cvta and named barriers
// with counts are the interpreter's (emu/cta.h, emu/interp.cc). Internal to
// the emulator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "emu/arch.h"
#include "emu/cta.h"
#include "emu/tensor_map.h"

namespace fa {
namespace emu {

class Sm100State;

// The operand_slots of a cp.async.bulk.tensor (Op::kBulkTensor): its sub
// coordinates, the mbarrier's base and offset, and (kMulticast) the ctaMask.
inline uint32_t bulk_tensor_operands(const Inst &in) {
  return in.sub + 2u + ((in.flags & kMulticast) ? 1u : 0u);
}

class Sm90State final : public ArchState {
 public:
  // For the CTA's entry and geometry (fixed for the launch).
  explicit Sm90State(Cta &cta);

  void reset_block() override;
  // mbarrier.init / inval / arrive / expect_tx / try_wait,
  // cp.async.bulk.tensor, fence.proxy.async.
  Step exec(uint32_t t, uint32_t pc, uint64_t *r) override;
  // The warpgroup collectives.
  int resolve_collectives(std::string *stuck) override;
  // A thread at mbarrier.try_wait.
  std::string wait_text(uint32_t t, uint32_t nwait) override;
  bool finish_block() override;

  // --- hooks of the interpreter loop (inline where they are hot)

  // Whether thread t has registers of an in-flight wgmma.mma_async: it
  // then runs the interpreter variant that checks every instruction with
  // touches_pending.
  bool in_flight(uint32_t t) const { return __builtin_expect(has_wg_, 0) && pend_count_[t]; }
  // Thread t's row of in-flight counts (one per register slot).
  const uint8_t *pending_row(uint32_t t) const {
    return pend_.data() + static_cast<size_t>(t) * cta_.ns_;
  }
  // Whether the instruction reads or writes a register of an in-flight
  // wgmma (thread row pend; ns slots; os: Entry::operand_slots). Static, its
  // arguments hoisted by the caller: it runs before every instruction of a
  // thread in flight.
  static bool touches_pending(const Inst &in, const uint8_t *pend, uint32_t ns,
                              const uint32_t *os) {
    auto hit = [&](uint32_t s) { return s < ns && pend[s]; };
    if (in.op == Op::kWgmma) return hit(in.a) || hit(in.b) || hit(in.c);
    if (in.op == Op::kBulkTensor || in.op == Op::kBulkTensorReduce) {
      if (hit(in.a) || hit(in.b)) return true;
      const uint32_t n = in.op == Op::kBulkTensor ? bulk_tensor_operands(in) : in.sub;
      for (uint32_t i = 0; i < n; ++i)
        if (hit(os[in.c + i])) return true;
      return false;
    }
    if (in.op == Op::kMma)
      for (uint32_t i = 0; i < 14; ++i)
        if (hit(os[static_cast<size_t>(in.imm) + i])) return true;
    return hit(in.d) || hit(in.a) || hit(in.b) || hit(in.c) || hit(in.e) || hit(in.v[0]) ||
           hit(in.v[1]) || hit(in.v[2]) || hit(in.v[3]);
  }
  // The fault of an instruction touches_pending caught.
  __attribute__((noinline, cold)) void fault_pending(uint32_t t, uint32_t pc);

  // The proxy check is on (the entry has wgmma): generic-proxy writes to
  // shared memory must be reported with proxy_mark.
  bool track_proxy() const { return track_proxy_; }
  // Thread t's generic-proxy write of shared [addr, addr + n) by the
  // instruction at pc (st.shared, stmatrix, a performed cp.async).
  void proxy_mark(uint32_t t, uint32_t pc, uint32_t addr, uint32_t n);
  // Thread t's mbarrier.inits so far become visible to the other CTAs of
  // the cluster once the current barrier.cluster phase completes
  // (fence.mbarrier_init, or a barrier.cluster.arrive.release).
  void publish_inits(uint32_t t);

  // The entry has cp.reduce.async.bulk{.tensor}: writes into shared memory
  // must be checked with bulk_source_write.
  bool watches_bulk() const { return has_bulk_; }
  // Thread t's write of shared [addr, addr + n) by the instruction at pc
  // (st.shared, st, atom / red .shared, stmatrix, a performed cp.async, a
  // TMA box landing). False (error set, naming both lines): it overwrites
  // the source of a bulk reduction that no cp.async.bulk.wait_group{.read}
  // of its thread has retired (PTX ISA "cp.async.bulk.wait_group").
  bool bulk_source_write(uint32_t t, uint32_t pc, uint32_t addr, uint32_t n) {
    if (!bulk_reading_) return true;
    for (uint32_t c = addr / 16; c <= (addr + n - 1) / 16; ++c)
      if (bulk_chunk_[c]) return fault_bulk_source(t, pc, addr, n, c);
    return true;
  }

  // A generic st (track_proxy() on): marks it when it lands in the shared window.
  __attribute__((noinline)) void generic_store_hook(uint32_t t, uint32_t pc, const uint8_t *p,
                                                    uint32_t n);

  // --- for the sm_100 state (emu/sm100.h: tcgen05.commit and the checks
  // of what a program may rely on once a commit's phase is observed)

  // The sm_100 state of the CTA: TMA writes into shared memory are reported
  // to its shared_write check.
  void set_sm100(Sm100State *s) { sm100_ = s; }
  // Records, per thread, the mbarrier phases it observed (a try_wait that
  // returned True); set before the first block.
  void track_observed() { track_seen_ = true; }
  // One arrive-on (count 1) by thread t, for the tcgen05.commit at pc, on
  // the mbarrier at shared offset addr of owner's CTA (this one's, or
  // another of the cluster's: a remote arrive, its init visible to the
  // cluster first): *phase is the phase it arrived on. The same checks as
  // mbarrier.arrive (initialized, a pending arrival, the preceding phase
  // observed). False: fault (error set).
  bool async_arrive(uint32_t t, uint32_t pc, Sm90State &owner, uint32_t addr, uint32_t *phase);
  // How many phases of the mbarrier at addr thread t has seen complete
  // (track_observed): phase p's completion is observed when this is > p.
  // 0 when no mbarrier is there.
  uint32_t observed(uint32_t t, uint32_t addr) const;

 private:
  // A cp.async.bulk.tensor box waiting for its mbarrier phase to complete:
  // the bytes (logical, row-major by box) and where they land.
  struct BulkCopy {
    uint32_t dst = 0;
    uint32_t swizzle_bits = 0;  // 0 none, 1/2/3: 32/64/128-byte swizzle
    uint32_t pc = 0;
    // A copy into the issuing CTA's own shared memory: its writes were
    // checked against tcgen05 operands at issue, as the issuing thread's
    // (ordered after what that thread had observed then), not again when
    // another thread's arrival (maybe another CTA's) completes the phase
    // that delivers them.
    bool checked = false;
    std::vector<uint8_t> data;
  };

  // An mbarrier object (PTX ISA "mbarrier": contents, phase, tx-count).
  struct Mbarrier {
    uint32_t addr = 0;           // shared address (8-byte aligned)
    uint32_t expected = 0;       // expected arrival count
    uint32_t pending = 0;        // pending arrivals of the current phase
    int64_t tx = 0;              // tx-count of the current phase
    uint32_t phase = 0;          // current (incomplete) phase
    bool observed = true;        // a try_wait returned True for the preceding phase
    std::vector<uint32_t> seen;  // track_observed: per thread, phases it saw complete
    uint32_t init_line = 0;
    uint32_t init_thread = 0;
    // The barrier.cluster phase whose completion makes the init visible to
    // the other CTAs of the cluster (publish_inits); UINT32_MAX: not yet.
    uint32_t visible_phase = UINT32_MAX;
    std::vector<BulkCopy> copies;  // become visible when the phase completes
  };

  // One issued cp.reduce.async.bulk{.tensor}: its source at shared src (the
  // box's extent bytes; data.size() bytes read at issue, logical order), and
  // the global words it adds into: segs of {global address, byte offset in
  // data, bytes}. Performed by the cp.async.bulk.wait_group that retires it.
  struct BulkSeg {
    uint64_t global = 0, at = 0, bytes = 0;
  };
  struct BulkOp {
    uint32_t pc = 0;
    uint32_t src = 0, extent = 0;
    uint8_t type = kBulkRedF32;  // BulkRedType
    uint8_t swizzle_bits = 0;    // the box's swizzle (0: none; 1/2/3: 32/64/128-byte)
    std::vector<uint8_t> data;
    std::vector<BulkSeg> segs;
  };
  // A thread's bulk async-groups (PTX ISA "cp.async.bulk.commit_group",
  // "cp.async.bulk.wait_group"): ops in issue order, ops[done..) not yet
  // retired; group_end: the ends of the committed groups (ops past the last
  // one are uncommitted).
  struct BulkQueue {
    std::vector<BulkOp> ops;
    size_t done = 0;
    std::vector<size_t> group_end;
  };

  // One issued wgmma.mma_async, performed by the wait_group that retires it.
  struct WgmmaOp {
    uint32_t pc = 0;
    uint64_t desc_a = 0, desc_b = 0;
    bool accumulate = false;
    std::vector<uint32_t> chunks;  // 16-byte shared chunks it reads (sorted, distinct)
  };

  struct Warpgroup {
    std::vector<WgmmaOp> ops;  // in issue order; ops[head..) in flight
    size_t head = 0;
    std::vector<size_t> group_end;  // ends of committed groups; [group_head..) pending
    size_t group_head = 0;
    bool fenced = false;      // wgmma.fence since the last wgmma.wait_group
    uint32_t maxnreg = 0;     // last setmaxnreg value (0: none yet)
    uint32_t maxnreg_pc = 0;  // its setmaxnreg
    void clear() {
      ops.clear();
      head = 0;
      group_end.clear();
      group_head = 0;
      fenced = false;
      maxnreg = 0;
    }
  };

  // Proxy check (PTX ISA "Memory Consistency Model": proxies, proxy fences).
  // Per shared byte: 0, or pc << 11 | (thread + 1) of the generic-proxy write
  // the writer has not yet followed with fence.proxy.async. Kept only for
  // entries with wgmma (the async-proxy reader of shared memory).
  // One thread's unfenced writes:
  struct ProxyWrites {
    std::vector<uint64_t> segs;  // address | bytes << 32, at most kProxySegs
    bool overflow = false;       // more than kProxySegs: the fence scans [lo, hi)
    uint32_t lo = UINT32_MAX, hi = 0;
    void clear() {  // keeps the capacity
      segs.clear();
      overflow = false;
      lo = UINT32_MAX;
      hi = 0;
    }
  };
  static constexpr size_t kProxySegs = 64;
  static constexpr uint32_t kProxyTidBits = 11;  // thread + 1 <= 1024

  void proxy_fence(uint32_t t);
  std::string proxy_writer_text(uint32_t v) const;
  Mbarrier *find_mbar(uint32_t addr);
  Mbarrier *mbar_operand(uint32_t t, uint32_t pc, const uint64_t *r);
  Mbarrier *mbar_of_cta(Sm90State &owner, uint32_t off, uint32_t t, uint32_t pc);
  Mbarrier *mbar_cluster_operand(uint32_t t, uint32_t pc, const uint64_t *r, Sm90State **owner);
  bool complete_on(Sm90State &owner, Mbarrier &m, uint32_t t);
  bool bulk_deliver(Sm90State &owner, BulkCopy copy, uint32_t mbar_off, uint32_t t, uint32_t pc,
                    uint64_t extent);
  bool mbar_init(uint32_t t, uint32_t pc, const uint64_t *r);
  bool mbar_inval(uint32_t t, uint32_t pc, const uint64_t *r);
  bool mbar_arrive(uint32_t t, uint32_t pc, uint64_t *r);
  bool arrive_on(Sm90State &owner, Mbarrier &m, uint32_t t, uint32_t pc, uint32_t count);
  bool mbar_maybe_complete(Mbarrier &m, uint32_t t);
  int mbar_try_wait(uint32_t t, uint32_t pc, uint64_t *r);
  bool tensor_map_operand(uint32_t t, uint32_t pc, uint64_t ga, uint32_t dims, TensorMap *out);
  bool bulk_tensor(uint32_t t, uint32_t pc, uint64_t *r);
  bool bulk_reduce(uint32_t t, uint32_t pc, const uint64_t *r);
  bool bulk_tensor_reduce(uint32_t t, uint32_t pc, const uint64_t *r);
  bool bulk_issue(uint32_t t, uint32_t pc, BulkOp op);
  bool bulk_wait(uint32_t t, size_t n);
  void bulk_perform(const BulkOp &op);
  __attribute__((noinline, cold)) bool fault_bulk_source(uint32_t t, uint32_t pc, uint32_t addr,
                                                         uint32_t n, uint32_t chunk);
  bool bulk_write(const BulkCopy &c, uint32_t t);
  const WgmmaOp *reader_of_chunk(uint32_t chunk) const;
  bool run_warpgroup_collective(uint32_t g, const Inst &in, uint32_t pc);
  bool wgmma_issue(uint32_t g, const Inst &in, uint32_t pc);
  __attribute__((noinline, cold)) bool fault_unfenced(uint32_t g, const Inst &in, uint32_t pc,
                                                      const WgmmaOp &op);
  bool wgmma_wait(uint32_t g, size_t n);
  bool wgmma_perform(uint32_t g, const WgmmaOp &op);

  Cta &cta_;
  Sm100State *sm100_ = nullptr;
  bool track_seen_ = false;
  std::vector<Mbarrier> mbars_;
  bool has_wg_ = false;  // the entry has warpgroup instructions
  std::vector<Warpgroup> wgs_;
  std::vector<uint8_t> pend_;          // [thread][slot]: in-flight wgmma operands using it
  std::vector<uint32_t> pend_count_;   // per thread: slots with pend_ != 0
  std::vector<uint16_t> chunk_reads_;  // per 16-byte shared chunk: in-flight wgmma reading it
  bool track_proxy_ = false;
  bool proxy_dirty_ = false;  // some byte may be marked
  std::vector<uint32_t> unfenced_;
  std::vector<ProxyWrites> proxy_writes_;
  std::vector<uint32_t> wg_elems_;          // wgmma_issue scratch (profile)
  std::vector<float> wg_a_, wg_bt_, wg_d_;  // wgmma_perform scratch
  std::vector<LaneAccess> tma_rows_;        // bulk_tensor scratch (profile)
  // Bulk reductions: the entry has them; per thread, its queue (sized on
  // first use); per 16-byte shared chunk, the unretired ops reading it;
  // how many unretired ops there are in the CTA.
  bool has_bulk_ = false;
  std::vector<BulkQueue> bulkq_;
  std::vector<uint16_t> bulk_chunk_;
  uint32_t bulk_reading_ = 0;
};

}  // namespace emu
}  // namespace fa

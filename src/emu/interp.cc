#include "emu/interp.h"

#include <time.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "emu/arch.h"
#include "emu/atomic.h"
#include "emu/cluster.h"
#include "emu/cta.h"
#include "emu/numeric.h"
#include "emu/sm100.h"
#include "emu/sm90.h"

namespace fa {
namespace emu {
namespace {

inline float F(uint64_t v) { return bits_f32(static_cast<uint32_t>(v)); }
inline uint64_t FB(float f) { return f32_bits(f); }

inline uint64_t extend(uint64_t v, int bits, bool is_signed) {
  if (bits >= 64) return v;
  uint64_t mask = (uint64_t{1} << bits) - 1;
  v &= mask;
  if (is_signed && (v >> (bits - 1)) & 1) v |= ~mask;
  return v;
}

template <typename T>
inline bool compare_int(T a, T b, uint8_t cmp) {
  switch (cmp) {
    case kEq:
      return a == b;
    case kNe:
      return a != b;
    case kLt:
      return a < b;
    case kLe:
      return a <= b;
    case kGt:
      return a > b;
    default:
      return a >= b;
  }
}

inline bool compare_f32(float a, float b, uint8_t cmp) {
  bool unord = std::isnan(a) || std::isnan(b);
  switch (cmp) {
    case kEq:
      return a == b;
    case kNe:
      return !unord && a != b;
    case kLt:
      return a < b;
    case kLe:
      return a <= b;
    case kGt:
      return a > b;
    case kGe:
      return a >= b;
    case kEqu:
      return unord || a == b;
    case kNeu:
      return a != b;
    case kLtu:
      return !(a >= b);
    case kLeu:
      return !(a > b);
    case kGtu:
      return !(a <= b);
    case kGeu:
      return !(a < b);
    case kNum:
      return !unord;
    default:
      return unord;
  }
}

// PTX min/max.f32: a NaN operand yields the other one; -0 < +0.
inline float fmin_ptx(float a, float b) {
  if (std::isnan(a)) return std::isnan(b) ? bits_f32(0x7fffffffu) : b;
  if (std::isnan(b)) return a;
  if (a == b) return bits_f32(f32_bits(a) | f32_bits(b));
  return a < b ? a : b;
}
inline float fmax_ptx(float a, float b) {
  if (std::isnan(a)) return std::isnan(b) ? bits_f32(0x7fffffffu) : b;
  if (std::isnan(b)) return a;
  if (a == b) return bits_f32(f32_bits(a) & f32_bits(b));
  return a > b ? a : b;
}

inline uint64_t load_bytes(const uint8_t *p, uint32_t bytes, bool is_signed) {
  switch (bytes) {
    case 1:
      return is_signed ? static_cast<uint64_t>(static_cast<int64_t>(static_cast<int8_t>(*p))) : *p;
    case 2: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return is_signed ? static_cast<uint64_t>(static_cast<int64_t>(static_cast<int16_t>(v))) : v;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return is_signed ? static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(v))) : v;
    }
    default: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}

inline void store_bytes(uint8_t *p, uint32_t bytes, uint64_t v) {
  switch (bytes) {
    case 1:
      *p = static_cast<uint8_t>(v);
      break;
    case 2: {
      uint16_t x = static_cast<uint16_t>(v);
      std::memcpy(p, &x, 2);
      break;
    }
    case 4: {
      uint32_t x = static_cast<uint32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    default:
      std::memcpy(p, &v, 8);
      break;
  }
}

// "3, 5, 16-31" from a lane mask.
std::string lane_list(uint32_t mask) {
  std::string s;
  for (int l = 0; l < 32;) {
    if (!((mask >> l) & 1)) {
      ++l;
      continue;
    }
    int e = l;
    while (e + 1 < 32 && ((mask >> (e + 1)) & 1)) ++e;
    if (!s.empty()) s += ", ";
    s += std::to_string(l);
    if (e > l) s += "-" + std::to_string(e);
    l = e + 1;
  }
  return s;
}

// One queued cp.async: [dst, dst + size) in shared memory receives src_size
// bytes from global src, then zeros.
struct AsyncCopy {
  uint64_t src;
  uint32_t dst;
  uint32_t size;
  uint32_t src_size;
  uint32_t pc;
};

// A thread's cp.async state (PTX ISA "cp.async.commit_group",
// "cp.async.wait_group"): copies in issue order; ops[head..) are not yet
// performed; group_end[group_head..) are the ends of the committed groups
// still pending, oldest first; copies past the last end are uncommitted.
struct AsyncQueue {
  std::vector<AsyncCopy> ops;
  size_t head = 0;
  std::vector<size_t> group_end;
  size_t group_head = 0;
  void clear() {
    ops.clear();
    head = 0;
    group_end.clear();
    group_head = 0;
  }
};

// A named barrier (PTX ISA "bar, barrier"): arrivals of the current phase.
struct NamedBarrier {
  uint32_t expected = 0;  // thread count of the phase (set by its first arrival)
  uint32_t arrived = 0;
  uint32_t line = 0;  // PTX line of the phase's first arrival
};

// Runs one CTA at a time, for a Worker (below), which runs one cluster of
// them at a time. The CTA core (registers, shared memory, the scheduler,
// cp.async, named barriers, warp collectives) is here; what an architecture
// adds is an ArchState (emu/arch.h) the runner owns: sm90_ (emu/sm90.h),
// sm100_ (emu/sm100.h), cluster_state_ (emu/cluster.h).
class CtaRunner : public Cta {
 public:
  explicit CtaRunner(LaunchShared &sh)
      : Cta(sh), sm90_(*this), sm100_(*this, sm90_), cluster_state_(*this) {
    bar_words_ = (nthreads_ + 63) / 64;
    bar_seen_.assign(16 * static_cast<size_t>(bar_words_), 0);
    sm90_.set_sm100(&sm100_);
    watch_shared_ = sm100_.watches_shared() || sm90_.watches_bulk();
    st_hook_ = prof_ || sm90_.track_proxy() || watch_shared_;
    if (prof_) occ_.assign(e_.code.size(), 0);
  }

  // What one scheduler step of the block did (step_block).
  enum class Progress { kProgress, kIdle, kDone, kFault };

  // Adds the runner's counters (instructions, profile) to the launch's.
  void flush_stats() {
    sh_.instructions.fetch_add(executed_);
    executed_ = 0;
    if (prof_) {
      std::lock_guard<std::mutex> lock(sh_.profile_mu);
      for (size_t pc = 0; pc < inst_.size(); ++pc) sh_.by_pc[pc].add(inst_[pc]);
      std::fill(inst_.begin(), inst_.end(), InstProfile());
    }
  }

  Sm90State *sm90() { return &sm90_; }
  Sm100State *sm100() { return &sm100_; }
  ClusterState *cluster_state() { return &cluster_state_; }

  // Runs the block begun by begin_block to its end, alone (a cluster of
  // one). False: error_ set.
  bool run_to_end() {
    for (;;) {
      switch (step_block()) {
        case Progress::kProgress:
          continue;
        case Progress::kDone:
          return true;
        default:  // kIdle: error_ holds the deadlock report
          return false;
      }
    }
  }

  // Starts block b (grid position ctaid, cluster position cctaid) as a CTA
  // of cluster cl: registers, special registers, states.
  void begin_block(Cluster &cl, uint64_t b, const uint32_t ctaid[3], const uint32_t cctaid[3]) {
    block_ = b;
    cluster_ = &cl;
    rank_ = cctaid[0] + cl.dims[0] * (cctaid[1] + cl.dims[1] * cctaid[2]);
    done_ = false;
    nexited_ = 0;
    woke_ = false;
    for (int k = 0; k < 3; ++k) ctaid_[k] = ctaid[k];
    std::memset(smem_.data(), 0xff, smem_.size());
    if (async_used_) {  // copies left pending at exit die with the block
      for (AsyncQueue &q : async_) q.clear();
      async_used_ = false;
    }
    recs_.clear();
    for (NamedBarrier &nb : bars_) nb = NamedBarrier();
    std::fill(bar_seen_.begin(), bar_seen_.end(), 0);
    for (ArchState *a : arch_)
      if (a) a->reset_block();
    const uint32_t bx = cfg_.block[0], by = cfg_.block[1];
    const uint32_t nwarps = (nthreads_ + 31) / 32;
    // The block-uniform special registers, kCtaidX.. (PTX ISA "Special
    // Registers"; a launch without clusters is one of 1x1x1 clusters).
    uint64_t uni[kNumSpecialSlots - kCtaidX];
    auto u = [&uni](uint32_t slot) -> uint64_t & { return uni[slot - kCtaidX]; };
    for (uint32_t k = 0; k < 3; ++k) {
      u(kCtaidX + k) = ctaid[k];
      u(kNctaidX + k) = cfg_.grid[k];
      u(kClusteridX + k) = ctaid[k] / cl.dims[k];
      u(kNclusteridX + k) = cfg_.grid[k] / cl.dims[k];
      u(kClusterCtaidX + k) = cctaid[k];
      u(kClusterNctaidX + k) = cl.dims[k];
    }
    u(kLaneid) = u(kWarpid) = 0;  // per thread, set below
    u(kNwarpid) = nwarps;
    u(kClusterCtarank) = g_cluster_bug == kClusterBugRankOffByOne ? (rank_ + 1) % cl.size : rank_;
    u(kClusterNctarank) = cl.size;
    u(kIsExplicitCluster) = cl.is_explicit ? 1 : 0;
    for (uint32_t t = 0; t < nthreads_; ++t) {
      uint64_t *r = regs_of(t);
      std::memcpy(r, e_.slot_init.data(), ns_ * sizeof(uint64_t));
      std::memcpy(r + kCtaidX, uni, sizeof uni);
      r[kTidX] = t % bx;
      r[kTidY] = (t / bx) % by;
      r[kTidZ] = t / (bx * by);
      r[kNtidX] = cfg_.block[0];
      r[kNtidY] = cfg_.block[1];
      r[kNtidZ] = cfg_.block[2];
      r[kLaneid] = t % 32;
      r[kWarpid] = t / 32;
      state_[t] = ThreadState::kReady;
      pc_[t] = 0;
      if (pdl_) early_[t] = 1;
    }
  }

  // One scheduler step: a pass over the ready threads, then (when it
  // released none) the collectives. kIdle: nothing could proceed, error_
  // holds the block's deadlock report (a cluster's other CTAs may still
  // release it); kDone: every thread exited (the states' end-of-block
  // checks passed); kFault: error_ set.
  Progress step_block() {
    // Threads released during the previous step, by this CTA or (clusters)
    // another, run from this pass on.
    if (woke_) {
      for (uint32_t t = 0; t < nthreads_; ++t)
        if (state_[t] == ThreadState::kWoken) state_[t] = ThreadState::kReady;
      woke_ = false;
    }
    bool ran = false;
    for (uint32_t t = 0; t < nthreads_; ++t) {
      if (state_[t] == ThreadState::kReady) {
        ran = true;
        RunResult rr = run_thread(t);
        if (rr == RunResult::kFault) return Progress::kFault;
        if (rr == RunResult::kExited) {
          state_[t] = ThreadState::kExited;
          cluster_state_.thread_exited(t);
          // The CTA's shared memory leaves the cluster with its last thread.
          if (++nexited_ == nthreads_) done_ = true;
        } else {
          state_[t] = ThreadState::kWaiting;
          // bar.sync: the arrival counts now; it may complete the barrier.
          if (e_.code[pc_[t]].op == Op::kBarSync && !bar_arrive(t, pc_[t])) return Progress::kFault;
        }
      }
      // A warp's lanes have all run up to their next collective.
      if (prof_ && ((t & 31) == 31 || t + 1 == nthreads_)) profile_warp();
    }
    // Threads released during the pass run before any collective is
    // resolved: asynchronous work (wgmma) stays in flight as long as the
    // ISA allows, so races with it show.
    if (woke_) return Progress::kProgress;
    int progress = resolve_warp_collectives();
    if (progress < 0) return Progress::kFault;
    const bool warp_stuck = stuck_thread_ != UINT32_MAX && progress == 0;
    const std::string warp_msg = warp_stuck ? error_ : std::string();
    std::string arch_stuck;  // the first collective of an architecture state that cannot run
    for (ArchState *a : arch_) {
      if (!a) continue;
      const int n = a->resolve_collectives(&arch_stuck);
      if (n < 0) return Progress::kFault;
      progress += n;
    }
    if (progress > 0 || ran) return Progress::kProgress;
    // Every thread waits or has exited, and nothing was released.
    // first_mbar: the first thread stopped at a kBlocking op (mbarrier.try_wait).
    uint32_t exited = 0, first_bar = UINT32_MAX, first_mbar = UINT32_MAX, at_mbar = 0;
    bool same_id = true;
    for (uint32_t t = 0; t < nthreads_; ++t) {
      if (state_[t] == ThreadState::kExited) {
        ++exited;
      } else if (e_.code[pc_[t]].op == Op::kBarSync) {
        if (first_bar == UINT32_MAX) first_bar = t;
        if (e_.code[pc_[t]].imm != e_.code[pc_[first_bar]].imm) same_id = false;
      } else if (op_scope(e_.code[pc_[t]].op) == OpScope::kBlocking) {
        if (first_mbar == UINT32_MAX) first_mbar = t;
        ++at_mbar;
      }
    }
    if (exited == nthreads_) {
      for (ArchState *a : arch_)
        if (a && !a->finish_block()) return Progress::kFault;
      return Progress::kDone;
    }
    if (warp_stuck) {
      error_ = warp_msg;
      return Progress::kIdle;
    }
    if (!arch_stuck.empty()) {
      error_ = arch_stuck;
      return Progress::kIdle;
    }
    if (first_bar != UINT32_MAX) {
      char buf[320];
      const Inst &in = e_.code[pc_[first_bar]];
      const NamedBarrier &b = bars_[in.imm];
      std::snprintf(buf, sizeof buf,
                    "barrier deadlock at PTX line %u: %u of %u threads arrived (%u exited)%s "
                    "in block %s",
                    in.line, b.arrived, b.expected, exited,
                    same_id ? "" : ", waiting at different barrier ids", block_text().c_str());
      error_ = buf;
      if (first_mbar != UINT32_MAX) error_ += "; " + wait_text(first_mbar, at_mbar);
      return Progress::kIdle;
    }
    if (first_mbar != UINT32_MAX) {
      error_ = wait_text(first_mbar, at_mbar) + " (" + std::to_string(exited) +
               " threads exited); block " + block_text();
      return Progress::kIdle;
    }
    error_ = "emulator scheduler: no thread can proceed in block " + block_text();
    return Progress::kIdle;
  }

 private:
  // The architecture state that runs op (ops.def handler), nullptr for the interpreter's.
  ArchState *arch_of(Op op) const { return arch_[static_cast<size_t>(op_handler(op))]; }

  // Why thread t, stopped at a kBlocking op, waits (nwait threads do).
  std::string wait_text(uint32_t t, uint32_t nwait) {
    ArchState *a = arch_of(e_.code[pc_[t]].op);
    return a ? a->wait_text(t, nwait) : "thread " + thread_text(t) + " waits";
  }

  // ----------------------------------------------------- named barriers ----
  // PTX ISA "bar, barrier": 16 barriers per CTA; an arrival counts one thread;
  // the phase completes when its thread count has arrived (all threads of the
  // CTA without a count); bar.sync waits for that, bar.arrive does not.

  // Arrival of thread t at the barrier of the instruction at pc (bar.sync: the
  // thread waits there; bar.arrive: it goes on). False on a fault.
  bool bar_arrive(uint32_t t, uint32_t pc) {
    const Inst &in = e_.code[pc];
    const uint32_t id = static_cast<uint32_t>(in.imm);
    uint32_t count = nthreads_;
    if (in.b != kNoSlot) {
      count = static_cast<uint32_t>(regs_of(t)[in.b]);
      if (count == 0 || count % 32)
        return fail_at(pc, t, "thread count %u is not a multiple of the warp size", count);
      if (count > nthreads_)
        return fail_at(pc, t,
                       "thread count %u exceeds the block's %u threads: barrier %u can never "
                       "complete",
                       count, nthreads_, id);
    }
    NamedBarrier &b = bars_[id];
    if (b.arrived == 0) {
      b.expected = count;
      b.line = in.line;
    } else if (b.expected != count) {
      return fail_at(pc, t,
                     "thread count %u differs from the %u of barrier %u's current phase (first "
                     "arrival at PTX line %u)",
                     count, b.expected, id, b.line);
    }
    uint64_t &w = bar_seen_[id * static_cast<size_t>(bar_words_) + t / 64];
    if ((w >> (t % 64)) & 1)
      return fail_at(pc, t,
                     "the thread arrives a second time at barrier %u before its phase completed "
                     "(%u of %u arrived; first arrival at PTX line %u)",
                     id, b.arrived, b.expected, b.line);
    w |= uint64_t{1} << (t % 64);
    if (++b.arrived < b.expected) return true;
    // Complete: release the threads waiting at bar.sync on it.
    for (uint32_t u = 0; u < nthreads_; ++u) {
      if (state_[u] != ThreadState::kWaiting) continue;
      const Inst &o = e_.code[pc_[u]];
      if (o.op == Op::kBarSync && static_cast<uint32_t>(o.imm) == id) {
        ++pc_[u];
        wake(u);
      }
    }
    b = NamedBarrier();
    std::fill_n(bar_seen_.begin() + id * static_cast<size_t>(bar_words_), bar_words_, 0);
    return true;
  }

  // Resolves every warp collective whose participants have all arrived.
  // Returns the number resolved, or -1 on an error (error_ set). A group
  // that cannot run yet is remembered in stuck_thread_ with its message.
  int resolve_warp_collectives() {
    int resolved = 0;
    stuck_thread_ = UINT32_MAX;
    std::string stuck_msg;
    for (uint32_t w = 0; w * 32 < nthreads_; ++w) {
      const uint32_t base = w * 32;
      const uint32_t lanes = std::min<uint32_t>(32, nthreads_ - base);
      uint32_t handled = 0;
      for (uint32_t l = 0; l < lanes; ++l) {
        uint32_t t = base + l;
        if (state_[t] != ThreadState::kWaiting || ((handled >> l) & 1)) continue;
        const uint32_t pc = pc_[t];
        const Inst &in = e_.code[pc];
        if (!is_warp_collective(in.op)) continue;
        const uint32_t mslot = in.op == Op::kBarWarpSync ? in.a : in.e;
        const uint32_t mask = static_cast<uint32_t>(regs_of(t)[mslot]);
        char buf[400];
        if (!((mask >> l) & 1)) {
          std::snprintf(buf, sizeof buf,
                        "%s at PTX line %u: executing lane %u is not in membermask 0x%08x (%s)",
                        e_.op_text[pc].c_str(), in.line, l, mask, thread_text(t).c_str());
          error_ = buf;
          return -1;
        }
        uint32_t missing = 0, exited = 0, elsewhere = 0, absent = 0, other_line = 0;
        for (uint32_t m = 0; m < 32; ++m) {
          if (!((mask >> m) & 1)) continue;
          uint32_t u = base + m;
          if (m >= lanes) {
            missing |= 1u << m;
            absent |= 1u << m;
          } else if (state_[u] == ThreadState::kExited) {
            missing |= 1u << m;
            exited |= 1u << m;
          } else {
            const Inst &o = e_.code[pc_[u]];
            bool same = in.op == Op::kBarWarpSync ? o.op == Op::kBarWarpSync : pc_[u] == pc;
            if (!same || static_cast<uint32_t>(regs_of(u)[mslot]) != mask) {
              missing |= 1u << m;
              elsewhere |= 1u << m;
              if (!other_line) other_line = o.line;
            }
          }
        }
        if (missing) {
          if (stuck_thread_ == UINT32_MAX) {
            std::string why;
            if (exited) why += "lanes " + lane_list(exited) + " exited";
            if (elsewhere) {
              if (!why.empty()) why += "; ";
              why += "lanes " + lane_list(elsewhere) + " wait at PTX line " +
                     std::to_string(other_line);
            }
            if (absent) {
              if (!why.empty()) why += "; ";
              why += "lanes " + lane_list(absent) + " do not exist";
            }
            std::snprintf(buf, sizeof buf,
                          "%s at PTX line %u: lanes %s of membermask 0x%08x did not arrive (%s); "
                          "warp %u block %s",
                          e_.op_text[pc].c_str(), in.line, lane_list(missing).c_str(), mask,
                          why.c_str(), w, block_text().c_str());
            stuck_thread_ = t;
            stuck_msg = buf;
          }
          handled |= 1u << l;
          continue;
        }
        // A collective of an architecture state (tcgen05) may not run yet
        // (tcgen05.alloc waits for free columns): the warp stays.
        if (ArchState *a = arch_of(in.op)) {
          const int rc = a->run_warp(w, pc);
          if (rc < 0) return -1;
          if (rc == 0) {
            if (stuck_thread_ == UINT32_MAX) {
              stuck_thread_ = t;
              stuck_msg = a->wait_text(t, 32);
            }
            handled |= mask;
            continue;
          }
        } else if (!run_warp_collective(in, base, mask)) {
          return -1;
        }
        for (uint32_t m = 0; m < 32; ++m) {
          if (!((mask >> m) & 1)) continue;
          pc_[base + m] = pc_[base + m] + 1;
          state_[base + m] = ThreadState::kReady;
        }
        handled |= mask;
        ++resolved;
      }
    }
    if (resolved == 0 && stuck_thread_ != UINT32_MAX) error_ = stuck_msg;
    return resolved;
  }

  // Executes a warp collective for the lanes in mask (all present at it).
  // PTX ISA "Data Movement: shfl.sync", "bar.warp.sync", "mma", "ldmatrix".
  // mma.sync and ldmatrix carry a constant full-warp membermask, so the
  // arrival check above is the .aligned check.
  bool run_warp_collective(const Inst &in, uint32_t base, uint32_t mask) {
    if (in.op == Op::kBarWarpSync) return true;
    if (in.op == Op::kMma) return run_mma(in, base);
    if (in.op == Op::kLdmatrix) return run_ldmatrix(in, base);
    if (in.op == Op::kStmatrix) return run_stmatrix(in, base);
    if (in.op == Op::kElect) return run_elect(in, base, mask);
    if (in.op == Op::kVote) {
      bool any = false, all = true;
      for (uint32_t m = 0; m < 32; ++m) {
        if (!((mask >> m) & 1)) continue;
        const bool v = regs_of(base + m)[in.a] != 0;
        any = any || v;
        all = all && v;
      }
      const uint64_t r = (in.sub == 0 ? any : all) ? 1 : 0;
      for (uint32_t m = 0; m < 32; ++m)
        if ((mask >> m) & 1) regs_of(base + m)[in.d] = r;
      return true;
    }
    // kShfl
    uint32_t val[32], res[32];
    bool pv[32];
    for (uint32_t m = 0; m < 32; ++m)
      if ((mask >> m) & 1) val[m] = static_cast<uint32_t>(regs_of(base + m)[in.a]);
    for (uint32_t m = 0; m < 32; ++m) {
      if (!((mask >> m) & 1)) continue;
      const uint64_t *r = regs_of(base + m);
      const int lane = static_cast<int>(m);
      const int bval = static_cast<int>(r[in.b] & 0x1f);
      const uint32_t c = static_cast<uint32_t>(r[in.c]);
      const int cval = static_cast<int>(c & 0x1f);
      const int segmask = static_cast<int>((c >> 8) & 0x1f);
      const int max_lane = (lane & segmask) | (cval & ~segmask);
      const int min_lane = lane & segmask;
      int j;
      bool p;
      switch (in.sub) {
        case kShflUp:
          j = lane - bval;
          p = j >= max_lane;
          break;
        case kShflDown:
          j = lane + bval;
          p = j <= max_lane;
          break;
        case kShflBfly:
          j = lane ^ bval;
          p = j <= max_lane;
          break;
        default:
          j = min_lane | (bval & ~segmask);
          p = j <= max_lane;
          break;
      }
      if (!p) j = lane;
      if (!((mask >> j) & 1)) {
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "%s at PTX line %u: lane %d reads lane %d, which is outside membermask "
                      "0x%08x (undefined); warp %u block %s",
                      "shfl.sync", in.line, lane, j, mask, base / 32, block_text().c_str());
        error_ = buf;
        return false;
      }
      res[m] = val[j];
      pv[m] = p;
    }
    for (uint32_t m = 0; m < 32; ++m) {
      if (!((mask >> m) & 1)) continue;
      uint64_t *r = regs_of(base + m);
      r[in.d] = res[m];
      if (in.v[0] != kNoSlot) r[in.v[0]] = pv[m] ? 1 : 0;
    }
    return true;
  }

  // mma.sync.aligned.m16n8k{16,8}.row.col.f32.{f16,bf16}.{f16,bf16}.f32 for
  // the warp at base (PTX ISA "Matrix Fragments for mma.m16n8k16 / m16n8k8
  // with floating point type"). With g = lane >> 2 and q = lane % 4:
  //   A element i of a lane (halves of its regs, low half first):
  //     row g + 8 * ((i >> 1) & 1), col 2q + (i & 1) + 8 * (i >> 2)
  //   B element i: row (k) 2q + (i & 1) + 8 * (i >> 1), col g
  //   C/D element i: row g + 8 * (i >> 1), col 2q + (i & 1)
  // Arithmetic: every product is formed exactly in f32 (f16 x f16 and
  // bf16 x bf16 need at most 22 / 16 significand bits; bf16 products beyond
  // f32's range round as IEEE f32 does); D = C, then D += A[m][k] * B[k][n]
  // for k = 0, 1, ..., K-1, each sum rounded to nearest even in f32. All
  // inputs of all lanes are read before any D register is written.
  bool run_mma(const Inst &in, uint32_t base) {
    if (in.sub >= kMmaF8K32) return run_mma_f8(in, base);
    const uint32_t *s = e_.operand_slots.data() + in.imm;
    const bool k16 = in.sub == kMmaF16K16 || in.sub == kMmaBF16K16;
    const bool bf = in.sub == kMmaBF16K16 || in.sub == kMmaBF16K8;
    const int kk = k16 ? 16 : 8;
    float a[16][16], b[16][8], acc[16][8];
    for (uint32_t lane = 0; lane < 32; ++lane) {
      const uint64_t *r = regs_of(base + lane);
      const int g = static_cast<int>(lane >> 2), q = static_cast<int>(lane & 3);
      for (int i = 0; i < kk / 2; ++i) {
        uint32_t w = static_cast<uint32_t>(r[s[4 + i / 2]]) >> (16 * (i & 1));
        uint16_t h = static_cast<uint16_t>(w);
        a[g + 8 * ((i >> 1) & 1)][2 * q + (i & 1) + 8 * (i >> 2)] =
            bf ? bf16_to_f32(h) : f16_to_f32(h);
      }
      for (int i = 0; i < kk / 4; ++i) {
        uint32_t w = static_cast<uint32_t>(r[s[8 + i / 2]]) >> (16 * (i & 1));
        uint16_t h = static_cast<uint16_t>(w);
        b[2 * q + (i & 1) + 8 * (i >> 1)][g] = bf ? bf16_to_f32(h) : f16_to_f32(h);
      }
      for (int i = 0; i < 4; ++i) acc[g + 8 * (i >> 1)][2 * q + (i & 1)] = F(r[s[10 + i]]);
    }
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) acc[m][n] = mma_dot_f32(acc[m][n], a[m], &b[0][n], kk, 8);
    for (uint32_t lane = 0; lane < 32; ++lane) {
      uint64_t *r = regs_of(base + lane);
      const int g = static_cast<int>(lane >> 2), q = static_cast<int>(lane & 3);
      for (int i = 0; i < 4; ++i) r[s[i]] = FB(acc[g + 8 * (i >> 1)][2 * q + (i & 1)]);
    }
    return true;
  }

  // mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32 for the
  // warp at base (PTX ISA "Matrix Fragments for mma.m16n8k32" with .e4m3 /
  // .e5m2, the same figures as .s8 / .u8). With g = lane >> 2, q = lane % 4,
  // byte j of a register its j-th element (lowest byte first):
  //   A element i (0..15; register i / 4): row g + 8 * ((i >> 2) & 1),
  //     col (k) 4q + (i & 3) + 16 * (i >> 3)
  //   B element i (0..7; register i / 4): row (k) 4q + (i & 3) + 16 * (i >> 2),
  //     col (n) g
  //   C/D element i: row g + 8 * (i >> 1), col 2q + (i & 1) (as m16n8k16)
  // Arithmetic as the f16 forms (mma_dot_f32): each byte decoded exactly
  // (fp8_to_f32); every product is exact in f32 (at most 4 x 4 significand
  // bits, magnitudes 2^-32 .. 57344^2, inside f32's normal range); D = C, then
  // D += A[m][k] * B[k][n] for k = 0, 1, ..., 31, each sum rounded to nearest
  // even in f32. NaN and infinite inputs (e4m3 S.1111.111, e5m2 exponent 31)
  // take part as those f32 values. All inputs are read before D is written.
  bool run_mma_f8(const Inst &in, uint32_t base) {
    const uint32_t *s = e_.operand_slots.data() + in.imm;
    const int kind = in.sub - kMmaF8K32;
    const float *ta = fp8_table(kind >> 1), *tb = fp8_table(kind & 1);
    float a[16][32], b[32][8], acc[16][8];
    for (uint32_t lane = 0; lane < 32; ++lane) {
      const uint64_t *r = regs_of(base + lane);
      const int g = static_cast<int>(lane >> 2), q = static_cast<int>(lane & 3);
      for (int i = 0; i < 16; ++i) {
        const uint8_t x =
            static_cast<uint8_t>(static_cast<uint32_t>(r[s[4 + i / 4]]) >> (8 * (i & 3)));
        a[g + 8 * ((i >> 2) & 1)][4 * q + (i & 3) + 16 * (i >> 3)] = ta[x];
      }
      for (int i = 0; i < 8; ++i) {
        const uint8_t x =
            static_cast<uint8_t>(static_cast<uint32_t>(r[s[8 + i / 4]]) >> (8 * (i & 3)));
        b[4 * q + (i & 3) + 16 * (i >> 2)][g] = tb[x];
      }
      for (int i = 0; i < 4; ++i) acc[g + 8 * (i >> 1)][2 * q + (i & 1)] = F(r[s[10 + i]]);
    }
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) acc[m][n] = mma_dot_f32(acc[m][n], a[m], &b[0][n], 32, 8);
    for (uint32_t lane = 0; lane < 32; ++lane) {
      uint64_t *r = regs_of(base + lane);
      const int g = static_cast<int>(lane >> 2), q = static_cast<int>(lane & 3);
      for (int i = 0; i < 4; ++i) r[s[i]] = FB(acc[g + 8 * (i >> 1)][2 * q + (i & 1)]);
    }
    return true;
  }

  // The row addresses of ldmatrix / stmatrix at pc for the warp at base
  // (PTX ISA "ldmatrix", "stmatrix"): lane 8j + r gives the address of row r
  // of matrix j (16 bytes, 16-byte aligned); lanes past 8 * count are
  // ignored. Checks them, counts the request (each matrix is one phase of 8
  // rows x 16 bytes) and returns the 8 * count row pointers; false on a fault.
  bool matrix_rows(const Inst &in, uint32_t base, uint32_t pc, uint8_t **rows) {
    const uint32_t count = in.sub;
    for (uint32_t lane = 0; lane < 8 * count; ++lane) {
      const int64_t addr =
          static_cast<int64_t>(static_cast<uint32_t>(regs_of(base + lane)[in.a])) + in.imm;
      rows[lane] = shared_ptr(addr, 16, base + lane, pc);
      if (!rows[lane]) return false;
    }
    if (prof_) {
      LaneAccess acc[32];
      for (uint32_t lane = 0; lane < 8 * count; ++lane)
        acc[lane] = {lane, 16, static_cast<uint64_t>(rows[lane] - smem_.data())};
      uint64_t wf, ph;
      cost_shared(acc, 8 * count, 16, &wf, &ph);
      InstProfile &ip = inst_[pc];
      ++ip.shared_requests;
      ip.shared_wavefronts += wf;
      ip.shared_phases += ph;
    }
    return true;
  }

  // ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16 for the warp at
  // base (PTX ISA "ldmatrix"), rows as matrix_rows. Lane l receives in its
  // j-th register elements (l / 4, 2(l % 4)) and (l / 4, 2(l % 4) + 1) of
  // matrix j (low half first); with .trans the elements at (2(l % 4), l / 4)
  // and (2(l % 4) + 1, l / 4).
  bool run_ldmatrix(const Inst &in, uint32_t base) {
    const uint32_t pc = static_cast<uint32_t>(&in - e_.code.data());
    const uint32_t count = in.sub;
    uint8_t *rows[32];
    if (!matrix_rows(in, base, pc, rows)) return false;
    uint16_t mat[4][8][8];
    for (uint32_t lane = 0; lane < 8 * count; ++lane)
      std::memcpy(mat[lane / 8][lane % 8], rows[lane], 16);
    const bool trans = in.flags & kTrans;
    for (uint32_t lane = 0; lane < 32; ++lane) {
      uint64_t *r = regs_of(base + lane);
      const uint32_t row = lane >> 2, col = 2 * (lane & 3);
      for (uint32_t j = 0; j < count; ++j) {
        uint32_t lo = trans ? mat[j][col][row] : mat[j][row][col];
        uint32_t hi = trans ? mat[j][col + 1][row] : mat[j][row][col + 1];
        r[in.v[j]] = lo | (hi << 16);
      }
    }
    return true;
  }

  // stmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16 (PTX ISA
  // "stmatrix"): the inverse of ldmatrix. Lane l's j-th register holds
  // elements (l / 4, 2(l % 4)) and (l / 4, 2(l % 4) + 1) of matrix j (low half
  // first; .trans: (2(l % 4), l / 4) and (2(l % 4) + 1, l / 4)); row r of
  // matrix j goes to the address of lane 8j + r. Rows are written in lane
  // order (overlapping rows: the ISA leaves the result undefined).
  bool run_stmatrix(const Inst &in, uint32_t base) {
    const uint32_t pc = static_cast<uint32_t>(&in - e_.code.data());
    const uint32_t count = in.sub;
    uint8_t *rows[32];
    if (!matrix_rows(in, base, pc, rows)) return false;
    uint16_t mat[4][8][8];
    const bool trans = in.flags & kTrans;
    for (uint32_t lane = 0; lane < 32; ++lane) {
      const uint64_t *r = regs_of(base + lane);
      const uint32_t row = lane >> 2, col = 2 * (lane & 3);
      for (uint32_t j = 0; j < count; ++j) {
        const uint32_t v = static_cast<uint32_t>(r[in.v[j]]);
        (trans ? mat[j][col][row] : mat[j][row][col]) = static_cast<uint16_t>(v);
        (trans ? mat[j][col + 1][row] : mat[j][row][col + 1]) = static_cast<uint16_t>(v >> 16);
      }
    }
    for (uint32_t lane = 0; lane < 8 * count; ++lane) {
      std::memcpy(rows[lane], mat[lane / 8][lane % 8], 16);
      const uint32_t a = static_cast<uint32_t>(rows[lane] - smem_.data());
      if (sm90_.track_proxy()) sm90_.proxy_mark(base + lane, pc, a, 16);
      if (!shared_written(base + lane, pc, a, 16)) return false;
    }
    return true;
  }

  // elect.sync d|p, membermask (PTX ISA "elect.sync") for the lanes in mask,
  // all present: the leader is the lowest lane of the mask (the ISA only
  // promises a deterministic choice); d = its lane id, p = (lane == leader).
  bool run_elect(const Inst &in, uint32_t base, uint32_t mask) {
    const uint32_t leader = static_cast<uint32_t>(__builtin_ctz(mask));
    for (uint32_t m = 0; m < 32; ++m) {
      if (!((mask >> m) & 1)) continue;
      uint64_t *r = regs_of(base + m);
      if (in.d != kNoSlot) r[in.d] = leader;
      if (in.v[0] != kNoSlot) r[in.v[0]] = m == leader ? 1 : 0;
    }
    return true;
  }

  // cp.async issue: checks both addresses now (alignment to cp-size, bounds
  // of the cp-size shared bytes and the src-size global bytes) and queues
  // the copy; nothing is written until a wait retires its group.
  bool cp_async_issue(uint32_t t, uint32_t pc, const uint64_t *r) {
    const Inst &in = e_.code[pc];
    const uint32_t size = in.sub;
    const int64_t dst = static_cast<int64_t>(static_cast<uint32_t>(r[in.a])) + in.imm;
    const uint64_t src = r[in.b] + r[in.c];
    uint64_t src_size = size;
    if (in.e != kNoSlot) src_size = static_cast<uint32_t>(r[in.e]);
    if (in.v[0] != kNoSlot && r[in.v[0]]) src_size = 0;
    if (src_size > size) {
      char buf[400];
      std::snprintf(buf, sizeof buf,
                    "%s at PTX line %u: src-size %" PRIu64 " exceeds cp-size %u (undefined); %s",
                    e_.op_text[pc].c_str(), in.line, src_size, size, thread_text(t).c_str());
      error_ = buf;
      return false;
    }
    if (!shared_ptr(dst, size, t, pc)) return false;
    if (src & (size - 1)) {
      fault_global(t, pc, src, size, true);
      return false;
    }
    if (!dependency_met(t, pc)) return false;
    if (src_size && !in_allocation(src, src_size)) {
      fault_global(t, pc, src, static_cast<uint32_t>(src_size), false);
      return false;
    }
    if (async_.empty()) async_.resize(nthreads_);
    async_used_ = true;
    async_[t].ops.push_back(
        {src, static_cast<uint32_t>(dst), size, static_cast<uint32_t>(src_size), pc});
    if (prof_) profile_access(t, pc, src, static_cast<uint32_t>(src_size), dst, size);
    return true;
  }

  // cp.async.commit_group: the uncommitted copies (possibly none) become
  // the newest group.
  void cp_async_commit(uint32_t t) {
    if (async_.empty()) async_.resize(nthreads_);
    async_used_ = true;
    async_[t].group_end.push_back(async_[t].ops.size());
  }

  // cp.async.wait_group n: performs the copies of all but the newest n
  // committed groups, in issue order. n < 0 is cp.async.wait_all (commit,
  // then wait_group 0).
  // False: a copy lands on an operand of an unfinished tcgen05 op (error set).
  bool cp_async_wait(uint32_t t, int64_t n) {
    if (async_.empty()) return true;  // nothing was ever issued in this launch
    AsyncQueue &q = async_[t];
    if (n < 0) {
      q.group_end.push_back(q.ops.size());
      n = 0;
    }
    while (q.group_end.size() - q.group_head > static_cast<size_t>(n)) {
      const size_t end = q.group_end[q.group_head++];
      for (; q.head < end; ++q.head) {
        const AsyncCopy &c = q.ops[q.head];
        uint8_t *d = smem_.data() + c.dst;
        if (c.src_size) std::memcpy(d, reinterpret_cast<const void *>(c.src), c.src_size);
        std::memset(d + c.src_size, 0, c.size - c.src_size);
        if (sm90_.track_proxy()) sm90_.proxy_mark(t, c.pc, c.dst, c.size);  // a generic-proxy write
        if (!shared_written(t, c.pc, c.dst, c.size)) return false;
      }
    }
    if (q.head == q.ops.size() && q.group_head == q.group_end.size()) q.clear();
    return true;
  }

  // --- memory profile (LaunchConfig::profile; emu/profile.h)

  // One lane's access of one executed instruction: global [gaddr, +gbytes)
  // and/or shared [saddr, +sbytes). key = pc << 37 | occurrence << 5 | lane;
  // the occurrence (this lane's n-th execution of pc since the warp's last
  // flush) is filled in by profile_warp.
  struct MemRec {
    uint64_t key;
    uint64_t gaddr;
    uint32_t saddr;
    uint16_t gbytes, sbytes;
  };
  static constexpr int kRecPcShift = 37;

  __attribute__((noinline)) void profile_access(uint32_t t, uint32_t pc, uint64_t gaddr,
                                                uint32_t gbytes, int64_t saddr, uint32_t sbytes) {
    recs_.push_back({(uint64_t{pc} << kRecPcShift) | (t & 31), gaddr, static_cast<uint32_t>(saddr),
                     static_cast<uint16_t>(gbytes), static_cast<uint16_t>(sbytes)});
  }

  // st.shared (atom / red .shared) with profiling, proxy marks or the
  // asynchronous readers' checks on (the interpreter's one branch). False: a
  // fault (error set).
  __attribute__((noinline)) bool shared_store_hook(uint32_t t, uint32_t pc, int64_t addr,
                                                   uint32_t n) {
    if (prof_) profile_access(t, pc, 0, 0, addr, n);
    if (sm90_.track_proxy()) sm90_.proxy_mark(t, pc, static_cast<uint32_t>(addr), n);
    return shared_written(t, pc, static_cast<uint32_t>(addr), n);
  }

  // Thread t's write of shared [addr, addr + n) by the instruction at pc,
  // checked against the asynchronous readers of shared memory: tcgen05.mma /
  // cp operands (emu/sm100.h) and cp.reduce.async.bulk sources (emu/sm90.h).
  // False: a fault (error set, naming both lines).
  bool shared_written(uint32_t t, uint32_t pc, uint32_t addr, uint32_t n) {
    return sm100_.shared_write(t, pc, addr, n) && sm90_.bulk_source_write(t, pc, addr, n);
  }

  // Turns the records of the warp whose lanes just ran into warp requests:
  // the k-th execution of pc by each lane is one request (converged SIMT
  // execution), costed with cost_global / cost_shared.
  void profile_warp() {
    if (recs_.empty()) return;
    // Records come lane after lane; number each lane's executions of a pc.
    size_t seg = 0;
    for (size_t i = 0; i <= recs_.size(); ++i) {
      if (i == recs_.size() || (recs_[i].key & 31) != (recs_[seg].key & 31)) {
        for (size_t j = seg; j < i; ++j) occ_[recs_[j].key >> kRecPcShift] = 0;
        seg = i;
        if (i == recs_.size()) break;
      }
      uint32_t &n = occ_[recs_[i].key >> kRecPcShift];
      recs_[i].key |= uint64_t{n} << 5;
      if (n < UINT32_MAX) ++n;
    }
    std::sort(recs_.begin(), recs_.end(),
              [](const MemRec &a, const MemRec &b) { return a.key < b.key; });
    LaneAccess g[32], s[32];
    for (size_t i = 0; i < recs_.size();) {
      const uint64_t group = recs_[i].key >> 5;
      size_t ng = 0, ns = 0;
      uint32_t sbytes = 0;
      for (; i < recs_.size() && (recs_[i].key >> 5) == group; ++i) {
        const MemRec &r = recs_[i];
        const uint32_t lane = static_cast<uint32_t>(r.key & 31);
        if (r.gbytes && ng < 32) g[ng++] = {lane, r.gbytes, r.gaddr};
        if (r.sbytes && ns < 32) {
          s[ns++] = {lane, r.sbytes, r.saddr};
          sbytes = r.sbytes;
        }
      }
      InstProfile &ip = inst_[group >> (kRecPcShift - 5)];
      if (ng) {
        uint64_t sectors, bytes;
        cost_global(g, ng, &sectors, &bytes);
        ++ip.global_requests;
        ip.global_sectors += sectors;
        ip.global_bytes += bytes;
      }
      if (ns) {
        uint64_t wf, ph;
        cost_shared(s, ns, sbytes, &wf, &ph);
        ++ip.shared_requests;
        ip.shared_wavefronts += wf;
        ip.shared_phases += ph;
      }
    }
    recs_.clear();
  }

  // --- faults (cold paths)

  __attribute__((noinline, cold)) void fault_overflow(uint32_t t, uint32_t pc, int64_t value) {
    char buf[500];
    std::snprintf(buf, sizeof buf,
                  "%s at PTX line %u: signed 32-bit overflow (exact result %" PRId64
                  "); flashattn kernels never rely on wrap-around, so this is an index "
                  "overflow; %s",
                  e_.op_text[pc].c_str(), e_.code[pc].line, value, thread_text(t).c_str());
    error_ = buf;
  }

  __attribute__((noinline, cold)) void fault_budget(uint32_t t, uint32_t pc) {
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "instruction budget of %" PRId64
                  " steps exhausted at PTX line %u (%s): infinite loop? "
                  "(raise FLASHATTN_EMU_MAX_STEPS)",
                  sh_.budget.total, e_.code[pc].line, thread_text(t).c_str());
    error_ = buf;
  }

#define FA_EMU_RUN_THREAD_NAME run_thread_generic
#define FA_EMU_RUN_THREAD_ATTRS __attribute__((optimize("no-crossjumping", "no-gcse")))
#define FA_EMU_FMA(a, b, c) fma_f32(a, b, c)
#include "emu/run_thread.inc"
#undef FA_EMU_RUN_THREAD_NAME
#undef FA_EMU_RUN_THREAD_ATTRS
#undef FA_EMU_FMA

// The variant for threads with registers of an in-flight wgmma.mma_async
// or of an unwaited tcgen05.ld / st: every executed instruction first
// checks that it touches none of them.
#define FA_EMU_RUN_THREAD_NAME run_thread_checked
#define FA_EMU_RUN_THREAD_ATTRS __attribute__((cold, optimize("no-crossjumping", "no-gcse")))
#define FA_EMU_FMA(a, b, c) fma_f32(a, b, c)
#define FA_EMU_CHECK_PENDING 1
#include "emu/run_thread.inc"
#undef FA_EMU_RUN_THREAD_NAME
#undef FA_EMU_RUN_THREAD_ATTRS
#undef FA_EMU_FMA
#undef FA_EMU_CHECK_PENDING

#if defined(__x86_64__) && defined(__GNUC__)
#define FA_EMU_HAVE_FMA_PATH 1
#define FA_EMU_RUN_THREAD_NAME run_thread_fma
#define FA_EMU_RUN_THREAD_ATTRS \
  __attribute__((target("fma"), optimize("no-crossjumping", "no-gcse")))
#define FA_EMU_FMA(a, b, c) __builtin_fmaf(a, b, c)
#include "emu/run_thread.inc"
#undef FA_EMU_RUN_THREAD_NAME
#undef FA_EMU_RUN_THREAD_ATTRS
#undef FA_EMU_FMA
#endif

  // Runs thread t until a collective, exit or fault, with the fastest
  // interpreter loop this CPU supports.
  RunResult run_thread(uint32_t t) {
    // A thread with registers of an in-flight wgmma or an unwaited
    // tcgen05.ld / st runs with their checks.
    if (sm90_.in_flight(t) || sm100_.in_flight(t)) return run_thread_checked(t);
#ifdef FA_EMU_HAVE_FMA_PATH
    if (has_fma_) return run_thread_fma(t);
#endif
    return run_thread_generic(t);
  }

  int64_t steps_ = 0;  // remaining steps of the current grant
  uint64_t executed_ = 0;
  uint32_t stuck_thread_ = UINT32_MAX;
  uint32_t nexited_ = 0;           // threads of the block that exited
  std::vector<AsyncQueue> async_;  // per thread, sized on first cp.async
  bool async_used_ = false;
  bool st_hook_ = false;       // st.shared calls shared_store_hook (profile or proxy marks)
  bool watch_shared_ = false;  // shared writes go through shared_written (async readers)
  std::vector<MemRec> recs_;   // the current warp's accesses since its last flush
  std::vector<uint32_t> occ_;  // per pc, scratch of profile_warp
  NamedBarrier bars_[16];
  std::vector<uint64_t> bar_seen_;  // [16][words]: threads arrived in the current phase
  uint32_t bar_words_ = 0;
  // The architecture states (emu/arch.h), and arch_ by OpHandler (ops.def's
  // handler column; kInterp: none).
  Sm90State sm90_;
  Sm100State sm100_;
  ClusterState cluster_state_;
  ArchState *const arch_[kNumOpHandlers] = {nullptr, &sm90_, &sm100_, &cluster_state_};
#ifdef FA_EMU_HAVE_FMA_PATH
  const bool has_fma_ =
      __builtin_cpu_supports("fma") && std::getenv("FLASHATTN_EMU_NO_FMA") == nullptr;
#endif
};

// Runs whole clusters, one at a time; one per host worker thread
// (docs/emulator.md, "Clusters"). The CTAs of a cluster, one CtaRunner per
// rank, take scheduler steps in turn until all have exited or none can
// proceed (a deadlock naming each CTA's waiting lines); a cluster of one
// runs its CTA straight to its end, as without clusters.
class Worker {
 public:
  explicit Worker(LaunchShared &sh) : sh_(sh) {
    for (int k = 0; k < 3; ++k) cl_.dims[k] = sh.cluster[k];
    cl_.size = cl_.dims[0] * cl_.dims[1] * cl_.dims[2];
    cl_.is_explicit = sh.explicit_cluster;
    for (uint32_t r = 0; r < cl_.size; ++r) {
      runners_.push_back(std::make_unique<CtaRunner>(sh));
      cl_.ctas.push_back(runners_.back().get());
      cl_.sm90.push_back(runners_.back()->sm90());
      cl_.sm100.push_back(runners_.back()->sm100());
      cl_.state.push_back(runners_.back()->cluster_state());
    }
  }

  // Runs the clusters handed out by the shared counter until none are left.
  void work() {
    timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    std::string err;
    for (;;) {
      uint64_t c = sh_.next_block.fetch_add(1);
      if (c >= sh_.num_clusters || c > sh_.first_error_block.load()) break;
      if (!run_cluster(c, &err)) {
        sh_.report(c, err);
        break;
      }
    }
    for (auto &r : runners_) r->flush_stats();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    sh_.cpu_ns.fetch_add(
        static_cast<uint64_t>((c1.tv_sec - c0.tv_sec) * 1000000000ll + (c1.tv_nsec - c0.tv_nsec)));
  }

 private:
  bool run_cluster(uint64_t c, std::string *err) {
    const LaunchConfig &cfg = *sh_.cfg;
    const uint32_t *d = cl_.dims;
    const uint64_t ncx = cfg.grid[0] / d[0], ncy = cfg.grid[1] / d[1];
    const uint64_t cid[3] = {c % ncx, (c / ncx) % ncy, c / (ncx * ncy)};
    cl_.bar_phase = cl_.bar_arrived = 0;
    cl_.live = 0;
    for (uint32_t r = 0; r < cl_.size; ++r) {
      const uint32_t cc[3] = {r % d[0], (r / d[0]) % d[1], r / (d[0] * d[1])};
      uint32_t ct[3];
      for (int k = 0; k < 3; ++k) ct[k] = static_cast<uint32_t>(cid[k] * d[k] + cc[k]);
      const uint64_t b = ct[0] + uint64_t{cfg.grid[0]} * (ct[1] + uint64_t{cfg.grid[1]} * ct[2]);
      runners_[r]->begin_block(cl_, b, ct, cc);
      cl_.live += runners_[r]->nthreads_;
    }
    if (cl_.size == 1) {
      if (runners_[0]->run_to_end()) return true;
      *err = runners_[0]->error_;
      return false;
    }
    std::vector<uint8_t> done(cl_.size, 0);
    for (;;) {
      bool progress = false, all_done = true;
      for (uint32_t r = 0; r < cl_.size; ++r) {
        if (done[r]) continue;
        switch (runners_[r]->step_block()) {
          case CtaRunner::Progress::kProgress:
            progress = true;
            all_done = false;
            break;
          case CtaRunner::Progress::kDone:
            done[r] = 1;
            progress = true;
            break;
          case CtaRunner::Progress::kIdle:
            all_done = false;
            break;
          case CtaRunner::Progress::kFault:
            *err = runners_[r]->error_;
            return false;
        }
      }
      if (all_done) return true;
      if (progress) continue;
      // No CTA can proceed: each one's own report.
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "cluster deadlock: no CTA of cluster (%u,%u,%u) (%u CTAs) can proceed",
                    static_cast<uint32_t>(cid[0]), static_cast<uint32_t>(cid[1]),
                    static_cast<uint32_t>(cid[2]), cl_.size);
      *err = buf;
      for (uint32_t r = 0; r < cl_.size; ++r)
        if (!done[r]) *err += "; rank " + std::to_string(r) + ": " + runners_[r]->error_;
      return false;
    }
  }

  LaunchShared &sh_;
  Cluster cl_;
  std::vector<std::unique_ptr<CtaRunner>> runners_;
};

bool check_geometry(const Entry &e, const LaunchConfig &c, std::string *error) {
  char buf[300];
  const uint64_t nthreads = uint64_t{c.block[0]} * c.block[1] * c.block[2];
  if (!c.block[0] || !c.block[1] || !c.block[2] || nthreads > 1024 || c.block[0] > 1024 ||
      c.block[1] > 1024 || c.block[2] > 64) {
    std::snprintf(buf, sizeof buf, "invalid block (%u,%u,%u): at most (1024,1024,64), 1024 threads",
                  c.block[0], c.block[1], c.block[2]);
    *error = buf;
    return false;
  }
  if (!c.grid[0] || !c.grid[1] || !c.grid[2] || c.grid[0] > 0x7fffffffu || c.grid[1] > 65535 ||
      c.grid[2] > 65535) {
    std::snprintf(buf, sizeof buf, "invalid grid (%u,%u,%u)", c.grid[0], c.grid[1], c.grid[2]);
    *error = buf;
    return false;
  }
  if (e.maxntid[0]) {
    uint64_t m = uint64_t{e.maxntid[0]} * e.maxntid[1] * e.maxntid[2];
    if (nthreads > m || c.block[0] > e.maxntid[0] || c.block[1] > e.maxntid[1] ||
        c.block[2] > e.maxntid[2]) {
      std::snprintf(buf, sizeof buf, "block (%u,%u,%u) exceeds .maxntid %u, %u, %u of %s",
                    c.block[0], c.block[1], c.block[2], e.maxntid[0], e.maxntid[1], e.maxntid[2],
                    e.name.c_str());
      *error = buf;
      return false;
    }
  }
  if (e.reqntid[0] &&
      (c.block[0] != e.reqntid[0] || c.block[1] != e.reqntid[1] || c.block[2] != e.reqntid[2])) {
    std::snprintf(buf, sizeof buf, "block (%u,%u,%u) differs from .reqntid %u, %u, %u of %s",
                  c.block[0], c.block[1], c.block[2], e.reqntid[0], e.reqntid[1], e.reqntid[2],
                  e.name.c_str());
    *error = buf;
    return false;
  }
  // Clusters (PTX ISA "Cluster of Cooperative Thread Arrays",
  // "Performance-Tuning Directives"): the grid is a whole number of them.
  const uint32_t *q = e.reqnctapercluster;
  if (q[0]) {
    const uint64_t n = uint64_t{q[0]} * q[1] * q[2];
    if (!q[1] || !q[2] || n > 16 || (e.maxclusterrank && n > e.maxclusterrank)) {
      std::snprintf(buf, sizeof buf,
                    ".reqnctapercluster %u, %u, %u of %s: %" PRIu64 " CTAs (at most 16%s%u)", q[0],
                    q[1], q[2], e.name.c_str(), n, e.maxclusterrank ? ", .maxclusterrank " : "",
                    e.maxclusterrank);
      *error = buf;
      return false;
    }
    if (c.grid[0] % q[0] || c.grid[1] % q[1] || c.grid[2] % q[2]) {
      std::snprintf(buf, sizeof buf,
                    "grid (%u,%u,%u) is not a multiple of the cluster shape (.reqnctapercluster "
                    "%u, %u, %u of %s)",
                    c.grid[0], c.grid[1], c.grid[2], q[0], q[1], q[2], e.name.c_str());
      *error = buf;
      return false;
    }
  } else if (e.explicitcluster) {
    std::snprintf(buf, sizeof buf,
                  "%s is .explicitcluster without .reqnctapercluster: the emulator's launches "
                  "give no cluster shape",
                  e.name.c_str());
    *error = buf;
    return false;
  }
  uint64_t smem = c.dynamic_smem ? uint64_t{e.dynamic_smem_offset} + c.dynamic_smem : e.static_smem;
  if (c.smem_limit && smem > c.smem_limit) {
    std::snprintf(buf, sizeof buf,
                  "%s needs %" PRIu64
                  " bytes of shared memory (%u static + %u dynamic), the "
                  "device allows %zu per block",
                  e.name.c_str(), smem, e.static_smem, c.dynamic_smem, c.smem_limit);
    *error = buf;
    return false;
  }
  return true;
}

}  // namespace

bool execute(const Entry &entry, const LaunchConfig &config, const void *params, size_t params_size,
             DeviceMemory &memory, std::string *error, LaunchStats *stats) {
  if (!check_geometry(entry, config, error)) return false;
  if (params_size < entry.param_size || (entry.param_size && !params)) {
    *error = "parameter buffer has " + std::to_string(params_size) + " bytes, " + entry.name +
             " declares " + std::to_string(entry.param_size);
    return false;
  }
  // 128-byte aligned: its generic address (cvta.param) holds tensor maps,
  // which must be 64-byte aligned.
  std::vector<uint64_t> param_copy((entry.param_size + 7) / 8 + 1 + 16, 0);
  uint8_t *param_base = reinterpret_cast<uint8_t *>(
      (reinterpret_cast<uintptr_t>(param_copy.data()) + 127) & ~uintptr_t{127});
  if (entry.param_size) std::memcpy(param_base, params, entry.param_size);

  LaunchShared sh;
  sh.entry = &entry;
  sh.cfg = &config;
  sh.params = param_base;
  sh.param_size = entry.param_size;
  sh.mem = &memory;
  sh.budget.total = static_cast<int64_t>(
      std::min<uint64_t>(config.max_steps ? config.max_steps : kDefaultMaxSteps, INT64_MAX / 2));
  sh.budget.remaining = sh.budget.total;
  sh.num_blocks = uint64_t{config.grid[0]} * config.grid[1] * config.grid[2];
  if (entry.reqnctapercluster[0]) {
    for (int k = 0; k < 3; ++k) sh.cluster[k] = entry.reqnctapercluster[k];
    sh.explicit_cluster = true;
  }
  sh.num_clusters = sh.num_blocks / (uint64_t{sh.cluster[0]} * sh.cluster[1] * sh.cluster[2]);
  if (config.profile) sh.by_pc.assign(entry.code.size(), InstProfile());

  std::shared_lock<std::shared_mutex> lock(memory.mutex());
  int workers = std::max(1, std::min<int>(config.host_threads, 16));
  if (static_cast<uint64_t>(workers) > sh.num_clusters) workers = static_cast<int>(sh.num_clusters);
  std::vector<std::thread> pool;
  for (int k = 1; k < workers; ++k) {
    pool.emplace_back([&sh] {
      Worker worker(sh);
      worker.work();
    });
  }
  {
    Worker worker(sh);
    worker.work();
  }
  for (auto &th : pool) th.join();
  if (stats) {
    stats->instructions = sh.instructions.load();
    stats->blocks = sh.num_blocks;
    stats->cpu_seconds = sh.cpu_ns.load() * 1e-9;
    stats->mem_by_pc = std::move(sh.by_pc);
  }
  if (sh.error_block != UINT64_MAX) {
    *error = sh.error;
    return false;
  }
  return true;
}

}  // namespace emu
}  // namespace fa

// The CTA the interpreter runs, as the per-architecture states
// (emu/arch.h) see it: the entry, the launch, the threads' registers,
// states and pcs, shared memory, and the checked address helpers and error
// texts they share with the interpreter (emu/interp.cc, CtaRunner, derives
// from Cta). Internal to the emulator.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "emu/interp.h"

namespace fa {
namespace emu {

// kWoken: released by a barrier or mbarrier completion during the current
// pass; it becomes kReady when the pass ends (warps stay together).
enum class ThreadState : uint8_t { kReady, kWaiting, kExited, kWoken };
enum class RunResult { kBlocked, kExited, kFault };

// Instruction budget shared by every worker of a launch, handed out in chunks.
struct Budget {
  std::atomic<int64_t> remaining{0};
  int64_t total = 0;
  static constexpr int64_t kChunk = 1 << 16;
  // Steps granted (0 when exhausted).
  int64_t take() {
    int64_t before = remaining.fetch_sub(kChunk, std::memory_order_relaxed);
    if (before <= 0) return 0;
    return std::min(before, kChunk);
  }
};

class Cta;
class Sm90State;
class Sm100State;
class ClusterState;

// The cluster a worker runs (PTX ISA "Cluster of Cooperative Thread
// Arrays"; docs/emulator.md, "Clusters"): its CTAs by rank (%cluster_ctarank
// = x + y * dims[0] + z * dims[0] * dims[1] of %cluster_ctaid) and the
// cluster barrier. A launch without clusters runs each CTA as a cluster of
// one (the ISA's implicit 1x1x1 cluster).
struct Cluster {
  uint32_t dims[3] = {1, 1, 1};
  uint32_t size = 1;
  bool is_explicit = false;  // %is_explicit_cluster
  std::vector<Cta *> ctas;   // by rank
  std::vector<Sm90State *> sm90;
  std::vector<Sm100State *> sm100;  // the CTA pairs' tcgen05 (cta_group::2) reach the peer's
  std::vector<ClusterState *> state;
  // barrier.cluster: the current phase, the arrivals of non-exited threads
  // in it, and the non-exited threads of the cluster.
  uint32_t bar_phase = 0, bar_arrived = 0, live = 0;
};

// shared::cluster addresses in the emulator (docs/emulator.md, "Clusters"):
// (rank + 1) << kClusterRankShift | offset is byte `offset` of the shared
// memory of the cluster's CTA `rank`; an address below 1 <<
// kClusterRankShift is a shared::cta address, the executing CTA's own (the
// ISA: a shared::cta address is a valid shared::cluster address of the
// executing CTA).
constexpr uint32_t kClusterRankShift = 24;
inline uint32_t cluster_address(uint32_t rank, uint32_t offset) {
  return ((rank + 1) << kClusterRankShift) | offset;
}

// Per-launch state shared by the workers.
struct LaunchShared {
  const Entry *entry;
  const LaunchConfig *cfg;
  const uint8_t *params;
  size_t param_size = 0;
  DeviceMemory *mem;
  Budget budget;
  uint64_t num_blocks = 0;
  uint32_t cluster[3] = {1, 1, 1};  // the cluster shape (1x1x1 without clusters)
  bool explicit_cluster = false;
  uint64_t num_clusters = 0;            // workers take whole clusters, in order
  std::atomic<uint64_t> next_block{0};  // the next cluster to take
  std::atomic<uint64_t> first_error_block{UINT64_MAX};
  std::mutex error_mu;
  std::string error;
  uint64_t error_block = UINT64_MAX;
  std::atomic<uint64_t> instructions{0};
  std::atomic<uint64_t> cpu_ns{0};
  std::mutex profile_mu;
  std::vector<InstProfile> by_pc;  // LaunchConfig::profile: workers' counters, summed

  // Records msg as the error of block (the lowest block's error wins).
  void report(uint64_t block, const std::string &msg);
};

class Cta {
 public:
  explicit Cta(LaunchShared &sh);

  // Thread t's registers (Entry::num_slots slots).
  uint64_t *regs_of(uint32_t t) { return regs_.data() + static_cast<size_t>(t) * ns_; }

  // "(x,y,z)" of the block; "thread (x,y,z) block (x,y,z)" of thread t.
  std::string block_text() const;
  std::string thread_text(uint32_t t) const;

  // Sets error_ to "<op> at PTX line N: <fmt...>; <thread t>" (t =
  // UINT32_MAX: "; block (x,y,z)") and returns false.
  __attribute__((noinline, cold)) bool fail_at(uint32_t pc, uint32_t t, const char *fmt, ...)
      __attribute__((format(printf, 4, 5)));
  __attribute__((noinline, cold)) void fault_global(uint32_t t, uint32_t pc, uint64_t addr,
                                                    uint32_t size, bool misaligned);
  __attribute__((noinline, cold)) void fault_shared(uint32_t t, uint32_t pc, int64_t addr,
                                                    uint32_t size, bool misaligned);

  // Whether one live allocation holds [addr, addr + size), the last one hit
  // first (then it becomes the one hit). Written without addr + size, which
  // wraps for an address within size of 2^64 (device data such as a k_ptrs
  // entry can hold one).
  inline bool in_allocation(uint64_t addr, uint64_t size) {
    if (addr >= hit_base_ && addr <= hit_end_ && size <= hit_end_ - addr) return true;
    uint64_t b, e;
    if (!sh_.mem->find_locked(addr, size, &b, &e)) return false;
    hit_base_ = b;
    hit_end_ = e;
    return true;
  }

  // Global address check: one live allocation holds [addr, addr+size).
  // nullptr: fault (error_ set).
  inline uint8_t *global_ptr(uint64_t addr, uint32_t size, uint32_t t, uint32_t pc) {
    if (!dependency_met(t, pc)) return nullptr;
    if (addr & (size - 1)) {
      fault_global(t, pc, addr, size, true);
      return nullptr;
    }
    if (!in_allocation(addr, size)) {
      fault_global(t, pc, addr, size, false);
      return nullptr;
    }
    return reinterpret_cast<uint8_t *>(addr);
  }

  // LaunchConfig::programmatic: thread t has run griddepcontrol.wait, so it
  // may touch global memory (false: error_ set).
  inline bool dependency_met(uint32_t t, uint32_t pc) {
    if (__builtin_expect(pdl_ && early_[t], 0)) return early_global(t, pc);
    return true;
  }

  // Shared address check: [addr, addr + size) inside the block's shared
  // memory, naturally aligned. nullptr: fault (error_ set).
  inline uint8_t *shared_ptr(int64_t addr, uint32_t size, uint32_t t, uint32_t pc) {
    if (addr & (size - 1)) {
      fault_shared(t, pc, addr, size, true);
      return nullptr;
    }
    if (addr < 0 || addr + size > static_cast<int64_t>(smem_size_)) {
      fault_shared(t, pc, addr, size, false);
      return nullptr;
    }
    return smem_.data() + addr;
  }

  // PTX ISA "Generic Addressing": the parameter block (cvta.param), the
  // shared window (cvta.shared) and global memory, which is identity-mapped.
  // nullptr: fault (error_ set).
  inline uint8_t *generic_ptr(uint64_t addr, uint32_t size, uint32_t t, uint32_t pc, bool store) {
    const uint64_t p0 = reinterpret_cast<uint64_t>(sh_.params);
    const uint64_t s0 = reinterpret_cast<uint64_t>(smem_.data());
    if (addr & (size - 1)) {
      generic_fault(addr, size, t, pc, 0);
      return nullptr;
    }
    if (addr >= p0 && addr < p0 + sh_.param_size) {
      if (store || addr + size > p0 + sh_.param_size) {
        generic_fault(addr, size, t, pc, store ? 1 : 2);
        return nullptr;
      }
      return reinterpret_cast<uint8_t *>(addr);
    }
    if (addr >= s0 && addr < s0 + smem_size_) {
      if (addr + size > s0 + smem_size_) {
        fault_shared(t, pc, static_cast<int64_t>(addr - s0), size, false);
        return nullptr;
      }
      return reinterpret_cast<uint8_t *>(addr);
    }
    return global_ptr(addr, size, t, pc);
  }

  // The CTA of the cluster that the shared::cluster address addr names, and
  // the offset in its shared memory (*off) of [addr, addr + size): inside
  // its shared memory, naturally aligned, the rank inside the cluster, the
  // CTA still running. nullptr: fault (error_ set, naming the instruction at
  // pc and thread t).
  Cta *cluster_target(uint32_t addr, uint32_t size, uint32_t t, uint32_t pc, uint32_t *off);

  // A waiting thread released by a completion: it runs from the next pass on.
  void wake(uint32_t u) {
    state_[u] = ThreadState::kWoken;
    woke_ = true;
  }

  LaunchShared &sh_;
  const Entry &e_;
  const LaunchConfig &cfg_;
  const bool prof_;             // LaunchConfig::profile
  const bool pdl_;              // LaunchConfig::programmatic
  std::vector<uint8_t> early_;  // pdl_: 1 until the thread's griddepcontrol.wait
  uint32_t nthreads_ = 0, ns_ = 0, smem_size_ = 0;
  std::vector<uint64_t> regs_;
  std::vector<ThreadState> state_;
  std::vector<uint32_t> pc_;
  std::vector<uint8_t> smem_;
  uint64_t block_ = 0;
  uint32_t ctaid_[3] = {0, 0, 0};
  Cluster *cluster_ = nullptr;  // the cluster the CTA runs in (set by its worker)
  uint32_t rank_ = 0;           // %cluster_ctarank
  bool done_ = false;           // every thread of the block exited (its shared memory is gone)
  uint64_t hit_base_ = 1, hit_end_ = 0;  // last allocation hit (empty)
  bool woke_ = false;                    // a thread was released (kWoken) during the current pass
  std::string error_;
  std::vector<InstProfile> inst_;  // LaunchConfig::profile: counters per pc

 private:
  // The fault of generic_ptr: why 0 misaligned, 1 store to the parameter
  // block, 2 past the parameter block's end.
  __attribute__((noinline, cold)) void generic_fault(uint64_t addr, uint32_t size, uint32_t t,
                                                     uint32_t pc, int why);
  __attribute__((noinline, cold)) bool early_global(uint32_t t, uint32_t pc);
};

}  // namespace emu
}  // namespace fa

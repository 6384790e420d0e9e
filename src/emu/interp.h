// Executes one decoded PTX entry over a whole grid on the CPU.
//
// Model: each thread of a CTA owns a flat register file (Entry::num_slots
// 64-bit slots). A thread runs alone until it reaches a collective
// (bar.sync, bar.warp.sync, shfl.sync) or exits. When every thread of the
// CTA is blocked or exited, the scheduler resolves collectives: a warp
// collective runs once all lanes of its membermask wait at the same
// instruction (it then reads and writes all participants' registers: that is
// how mma.sync and ldmatrix run, with a full-warp membermask), a barrier
// counts arrivals and releases its bar.sync waiters when its thread count
// (all threads without one) has arrived; the sm_90 warpgroup collectives,
// mbarriers and TMA are in emu/sm90.h (docs/emulator.md). cp.async is
// per thread: checked and queued at issue, performed (copy + zero-fill) when
// a cp.async.wait_group / wait_all retires its group, so a missing wait reads
// stale shared memory. If nothing can proceed the
// launch fails with a deadlock / divergence report naming the PTX line.
// Independent CTAs may run on several host threads; the reported error is the
// one of the lowest block index, so reports are deterministic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "emu/memory.h"
#include "emu/profile.h"
#include "emu/ptx_ir.h"

namespace fa {
namespace emu {

struct LaunchConfig {
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t dynamic_smem = 0;
  size_t smem_limit = 0;   // static + dynamic must fit
  uint64_t max_steps = 0;  // instruction budget of the launch (0 = default)
  int host_threads = 1;    // CTAs run in parallel on this many host threads
  bool profile = false;    // count memory requests per instruction (emu/profile.h)
  // A programmatic dependent launch (LaunchGeometry::programmatic): the
  // previous kernel may still run, so a thread's global memory access
  // (ld/st/atom, cp.async, TMA) before its griddepcontrol.wait is an error.
  bool programmatic = false;
};

struct LaunchStats {
  uint64_t instructions = 0;  // executed (guarded-off ones included)
  uint64_t blocks = 0;
  double cpu_seconds = 0;  // host thread CPU time, summed over workers
  // With LaunchConfig::profile: memory counters per pc (Entry::code.size()).
  std::vector<InstProfile> mem_by_pc;
};

// Runs entry over the grid. Returns true on success; false with *error set
// (a one-line message) on a fault, a deadlock, a bad geometry or an
// exhausted budget. Takes the memory lock shared for the whole run.
bool execute(const Entry &entry, const LaunchConfig &config, const void *params, size_t params_size,
             DeviceMemory &memory, std::string *error, LaunchStats *stats = nullptr);

// Default instruction budget (FLASHATTN_EMU_MAX_STEPS overrides it).
constexpr uint64_t kDefaultMaxSteps = 20000000000ull;

}  // namespace emu
}  // namespace fa

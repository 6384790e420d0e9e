// Memory counters of one emulated launch (the emulator is our profiler).
//
// The interpreter runs one thread at a time, so it records each thread's
// memory accesses and regroups them into warp instructions: the k-th
// execution of instruction pc by each lane of a warp, between two points
// where the whole CTA waits at collectives, is one warp request (what the
// hardware issues for converged code). Each warp request is then costed with
// NVIDIA's rules (docs/emulator.md, "Memory counters"):
//  - global (ld/st.global, cp.async source): the distinct 32-byte sectors
//    the active lanes touch, and the distinct bytes they use; a
//    cp.async.bulk.tensor (TMA) issue is one request of the box rows that lie
//    inside the tensor (zero fill reads nothing);
//  - shared (ld/st.shared, cp.async destination, ldmatrix, stmatrix): 32
//    banks of 4 bytes; accesses of 8 and 16 bytes per lane are split into
//    phases of 16 and 8 lanes (ldmatrix / stmatrix: each 8-row matrix is one
//    phase of 8 x 16 bytes); a phase takes as many wavefronts as the most
//    distinct 4-byte words any one bank holds (the same word is a
//    broadcast), at least one; bank conflicts = wavefronts - phases;
//  - wgmma.mma_async shared operands (A and B through descriptors): per
//    issue, the distinct bytes read and the 128-byte lines they lie in
//    (wavefronts), counted apart from the shared counters above.
// Counters are kept per static instruction (pc), so any instruction range
// can be summed: the whole kernel and its main loop (find_main_loop).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "emu/ptx_ir.h"

namespace fa {
namespace emu {

// Counters of one static instruction, summed over the launch.
struct InstProfile {
  uint64_t global_requests = 0;  // warp requests that touched global memory
  uint64_t global_sectors = 0;   // 32-byte sectors touched (per request, distinct)
  uint64_t global_bytes = 0;     // distinct bytes used (per request)
  uint64_t shared_requests = 0;  // warp requests to shared memory
  uint64_t shared_wavefronts = 0;
  uint64_t shared_phases = 0;  // the minimum wavefronts (one per active phase)
  // wgmma.mma_async issues (per warpgroup), the distinct shared operand bytes
  // they read and the 128-byte lines those lie in (per issue).
  uint64_t wgmma_requests = 0, wgmma_bytes = 0, wgmma_wavefronts = 0;
  void add(const InstProfile &o) {
    global_requests += o.global_requests;
    global_sectors += o.global_sectors;
    global_bytes += o.global_bytes;
    shared_requests += o.shared_requests;
    shared_wavefronts += o.shared_wavefronts;
    shared_phases += o.shared_phases;
    wgmma_requests += o.wgmma_requests;
    wgmma_bytes += o.wgmma_bytes;
    wgmma_wavefronts += o.wgmma_wavefronts;
  }
};

// Totals over a set of instructions. Loads are ld.global, cp.async and
// cp.async.bulk.tensor; cp_async_* is the cp.async part of them, tma_* the
// cp.async.bulk.tensor part. wgmma_* are the shared-memory operand reads of
// wgmma.mma_async (not in shared_*).
struct MemCounters {
  uint64_t global_load_requests = 0, global_load_sectors = 0, global_load_bytes = 0;
  uint64_t cp_async_requests = 0, cp_async_sectors = 0, cp_async_bytes = 0;
  uint64_t tma_requests = 0, tma_sectors = 0, tma_bytes = 0;
  uint64_t wgmma_requests = 0, wgmma_shared_bytes = 0, wgmma_shared_wavefronts = 0;
  uint64_t global_store_requests = 0, global_store_sectors = 0, global_store_bytes = 0;
  uint64_t shared_requests = 0, shared_wavefronts = 0, shared_bank_conflicts = 0;
  void add(Op op, const InstProfile &p);
};

// One lane's access as the warp request sees it.
struct LaneAccess {
  uint32_t lane;
  uint32_t bytes;
  uint64_t addr;
};

// Distinct 32-byte sectors touched and distinct bytes used by the accesses
// of one global warp request (sorts `a` by address).
void cost_global(LaneAccess *a, size_t n, uint64_t *sectors, uint64_t *bytes);
// Wavefronts and active phases of one shared-memory warp request whose
// lanes each access `bytes` bytes (1, 2, 4, 8 or 16); lanes in [0, 32).
void cost_shared(const LaneAccess *a, size_t n, uint32_t bytes, uint64_t *wavefronts,
                 uint64_t *phases);

// The main loop: the union of the innermost loops that contain mma.sync,
// wgmma.mma_async or cp.async.bulk.tensor (a loop is the pc range [target,
// bra] of a backward branch; innermost: no other such loop inside it), so a
// warp-specialized kernel's producer (TMA) and consumer (wgmma) loops.
// Kernels without them: the innermost loops containing ld.global or
// cp.async. Empty when there is none.
struct MainLoop {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive pc ranges
  uint32_t first_line = 0, last_line = 0;             // PTX lines of the hull
  std::vector<uint8_t> member;                        // per pc: 1 inside
  bool contains(uint32_t pc) const { return pc < member.size() && member[pc]; }
};
MainLoop find_main_loop(const Entry &e);

struct LaunchProfile {
  std::string entry;
  std::vector<InstProfile> by_pc;  // size Entry::code.size()
  MemCounters total, main_loop;
  MainLoop loop;
  // The main-loop instruction with the most bank conflicts, and the one
  // wasting the most sector bytes (global): PTX lines, 0 = none.
  uint32_t loop_worst_conflict_line = 0, loop_worst_sector_line = 0;
};

// Sums by_pc into the totals of the whole kernel and of its main loop.
LaunchProfile summarize(const Entry &e, std::vector<InstProfile> by_pc);

// A short table for stderr: totals, main loop, and the instructions with
// bank conflicts or wasted sectors (at most `max_lines` of each).
std::string format_profile(const Entry &e, const LaunchProfile &p, int max_lines = 6);

}  // namespace emu
}  // namespace fa

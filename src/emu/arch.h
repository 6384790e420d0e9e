// The interface of a per-architecture state of the emulator: what one GPU
// generation adds to a CTA beyond the interpreter's core (registers, shared
// memory, cp.async, named barriers, warp collectives). emu/sm90.h (mbarriers,
// TMA, wgmma, setmaxnreg, the async-proxy check) is one, emu/sm100.h
// (tcgen05, tensor memory) and emu/cluster.h (mapa, distributed shared
// memory, barrier.cluster) are the others. The interpreter (emu/interp.cc)
// owns one of each, constructed for the entry and CTA (emu/cta.h) it runs,
// and calls:
//   exec           for the per-thread ops (scope kThread / kBlocking) whose
//                  ops.def handler names the state,
//   resolve_collectives  once per scheduler pass, for the collectives it owns,
//   run_warp       for a warp collective (scope kWarp) whose ops.def handler
//                  names the state, once the scheduler has seen all 32 lanes
//                  arrive at it (the .aligned check),
//   reset_block / finish_block  around each block,
//   wait_text      for a deadlock report of a thread stopped at one of its
//                  kBlocking ops.
// Internal to the emulator.
#pragma once

#include <cstdint>
#include <string>

namespace fa {
namespace emu {

// What a per-thread op asks of the interpreter: go on with the next
// instruction, stop the thread at this one (it is resumed by the scheduler,
// woken with its pc advanced), or fault (Cta::error_ set).
enum class Step : uint8_t { kNext, kBlock, kFault };

class ArchState {
 public:
  virtual ~ArchState() = default;
  // A block starts: forget the previous one's state.
  virtual void reset_block() = 0;
  // Thread t (registers r) runs the instruction at pc, one of this state's
  // per-thread ops.
  virtual Step exec(uint32_t t, uint32_t pc, uint64_t *r) = 0;
  // Runs each of this state's collectives whose participants all wait at
  // it. Returns the number run, or -1 on a fault (error set). A collective
  // that cannot run yet puts its message in *stuck if *stuck is empty.
  virtual int resolve_collectives(std::string *stuck) = 0;
  // Runs the warp collective at pc for warp w (all 32 lanes wait at it).
  // Returns 1 when it ran, 0 when it cannot run yet (the warp stays; a
  // deadlock report is wait_text of the warp's first thread), -1 on a fault
  // (error set).
  virtual int run_warp(uint32_t w, uint32_t pc) {
    (void)w;
    (void)pc;
    return -1;
  }
  // Why thread t, stopped at one of this state's kBlocking ops (or at a
  // warp collective run_warp could not run), cannot go on (nwait threads
  // are stopped at such ops): a deadlock report.
  virtual std::string wait_text(uint32_t t, uint32_t nwait) = 0;
  // Every thread of the block exited: nothing asynchronous may be left
  // over. False: error set.
  virtual bool finish_block() = 0;
};

}  // namespace emu
}  // namespace fa

// A ring of shared-memory stages between a producer and its consumers
// (FlashAttention-3's K/V pipeline; PTX ISA "Parallel Synchronization and
// Communication Instructions: mbarrier"). Tile number `it` lives in stage
// it % stages. Each stage has mbarriers of 8 bytes at bars(stage) + offset,
// the offsets of stage 0 coming from the kernel's layout: a "full" barrier
// (the producer's data landed) and an "empty" one (every consumer is done
// with the stage). A barrier completes one phase per use, so the phase
// parity of tile it's use is (it / stages) & 1, flipping each time the ring
// wraps; the producer waits on "empty" for the opposite parity (a fresh
// stage counts as freed: try_wait.parity on the phase before the first
// completes at once). Generators keep their own barrier offsets, arrival
// counts and copies; the stage and parity arithmetic and the waits are
// here, for every kernel with a ring (sm_90a today, tcgen05 next).
#pragma once

#include "kernels/codegen.h"

namespace fa::kgen::tile {

class Ring {
 public:
  // A ring of `stages` stages whose barriers start at smem (u32 shared
  // address) + 8 stage.
  Ring(Emitter &e, Reg smem, int stages) : e_(e), smem_(smem), stages_(stages) {}

  // The producer's view of tile number it (u32): its stage and the parity
  // its full barrier completes (new u32 registers).
  struct Slot {
    Reg stage, parity;
  };
  Slot slot(Reg it) const;
  // parity ^ 1: the parity the producer waits for on an empty barrier.
  Reg free_parity(Reg parity) const;
  // smem + 8 stage: the address barrier offsets are relative to (u32).
  Reg bars(Reg stage) const;
  // Spins until the mbarrier at bars + off has completed the phase of
  // `parity` (mbarrier.try_wait.parity in a loop).
  void wait(Reg bars, int off, Reg parity) const;

  // A consumer's running position: this tile's stage and parity and the
  // previous tile's (for a pipeline that releases a stage one tile late).
  struct Cursor {
    Reg stage, parity, prev_stage, prev_parity;
  };
  // Tile 0: stage 0, parity 0; the previous position unset until advance.
  Cursor begin() const;
  // The next tile: this position becomes the previous one; the stage wraps
  // at `stages`, flipping the parity.
  void advance(const Cursor &c) const;

 private:
  Emitter &e_;
  Reg smem_;
  int stages_;
};

}  // namespace fa::kgen::tile

// The read-modify-write of one 32-bit word that atom, red and
// cp.reduce.async.bulk perform (PTX ISA "atom", "red",
// "cp.reduce.async.bulk"; docs/emulator.md, "Floating-point reductions").
// Global memory is shared by the CTAs that run on other host threads
// (FLASHATTN_EMU_THREADS), so there the update is a host atomic: a
// sequentially consistent fetch-add, exchange or compare-and-swap, and for
// .f32 a compare-and-swap loop, so no concurrent update is lost. Shared
// memory belongs to one CTA, whose cluster one host thread runs: a plain
// read-modify-write. Internal to the emulator.
#pragma once

#include <cstdint>

#include "emu/numeric.h"
#include "emu/ptx_ir.h"

namespace fa {
namespace emu {

// The f32 sum of the words a and b, rounded to nearest even (the host's
// mode); ftz: subnormal inputs and result flushed to sign-preserving zero,
// as atom / red .add.f32 on global memory and cp.reduce.async.bulk
// .add.f32 do ("Current implementation ..." in each one's ISA section).
inline uint32_t f32_add_word(uint32_t a, uint32_t b, bool ftz) {
  float x = bits_f32(a), y = bits_f32(b);
  if (ftz) return f32_bits(flush_subnormal(flush_subnormal(x) + flush_subnormal(y)));
  return f32_bits(x + y);
}

// One atom / red on the word at w: op an AtomOp, b the operand, c the new
// value of .cas. global: a host atomic and .f32 flushing subnormals; else a
// plain update (shared memory). Returns the word's old value.
inline uint32_t atom_word(uint32_t *w, uint8_t op, uint32_t b, uint32_t c, bool global) {
  if (!global) {
    const uint32_t old = *w;
    switch (op) {
      case kAtomAdd:
        *w = old + b;
        break;
      case kAtomAddF32:
        *w = f32_add_word(old, b, false);
        break;
      case kAtomExch:
        *w = b;
        break;
      default:  // kAtomCas
        if (old == b) *w = c;
        break;
    }
    return old;
  }
  switch (op) {
    case kAtomAdd:
      return __atomic_fetch_add(w, b, __ATOMIC_SEQ_CST);
    case kAtomAddF32: {
      uint32_t old = __atomic_load_n(w, __ATOMIC_RELAXED);
      while (!__atomic_compare_exchange_n(w, &old, f32_add_word(old, b, true), true,
                                          __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
      }
      return old;
    }
    case kAtomExch:
      return __atomic_exchange_n(w, b, __ATOMIC_SEQ_CST);
    default: {  // kAtomCas
      uint32_t old = b;
      __atomic_compare_exchange_n(w, &old, c, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      return old;
    }
  }
}

}  // namespace emu
}  // namespace fa

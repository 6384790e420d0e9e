// Kernel numerics on the emulator against the fp64 reference: random inputs
// over FlashAttention's test shapes, the real-model fixtures, decode and
// reduce. Outputs are poisoned first and every element checked written.
#include "support/numerics.h"

int main(void) {
  return fa::test::run_numerics_suite("numerics_emulator", FA_BACKEND_EMULATOR, false);
}

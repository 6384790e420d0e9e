// The numerics suite's short case list on an emulated sm_86, whose smaller
// shared memory (99 KB per block) gives the tensor-core forward kernel a
// different pipeline depth (2 stages where sm_80 gets 3) at some head dims.
#include <cstdlib>

#include "support/numerics.h"

int main(void) {
  setenv("FA_TEST_QUICK", "1", 1);
  return fa::test::run_numerics_suite("numerics_emulator_sm86", FA_BACKEND_EMULATOR, false, 86);
}

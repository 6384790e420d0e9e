// The numerics suite's short case list on an emulated sm_86, whose smaller
// shared memory (100 KB per SM, 1536 threads) gives the tensor-core forward
// kernel other tiles than sm_80 at some head dims (docs/kernels.md, "Tile
// choice").
#include <cstdlib>

#include "support/numerics.h"

int main(void) {
  setenv("FA_TEST_QUICK", "1", 1);
  return fa::test::run_numerics_suite("numerics_emulator_sm86", FA_BACKEND_EMULATOR, false, 86);
}

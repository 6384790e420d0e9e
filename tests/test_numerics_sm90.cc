// The numerics suite's short case list on an emulated sm_90 (228 KB of
// shared memory per SM: 64-row CTAs at head dim 256 where sm_80 gets
// 128-row CTAs of 8 warps; docs/kernels.md, "Tile choice").
#include <cstdlib>

#include "support/numerics.h"

int main(void) {
  setenv("FA_TEST_QUICK", "1", 1);
  return fa::test::run_numerics_suite("numerics_emulator_sm90", FA_BACKEND_EMULATOR, false, 90);
}

// The numerics suite's short case list on an emulated sm_120 (RTX 50 /
// RTX PRO 6000 Blackwell: 99 KB per block, 100 KB per SM, 1536 threads): the
// tiles its own limits choose must launch and be right.
#include <cstdlib>

#include "support/numerics.h"

int main(void) {
  setenv("FA_TEST_QUICK", "1", 1);
  return fa::test::run_numerics_suite("numerics_emulator_sm120", FA_BACKEND_EMULATOR, false, 120);
}

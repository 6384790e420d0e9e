// The numerics suite on a real GPU (cuda backend), with longer sequences.
// Every test is reported as skipped, with the reason, when no GPU is there.
#include "support/numerics.h"

int main(void) { return fa::test::run_numerics_suite("numerics_gpu", FA_BACKEND_CUDA, true); }

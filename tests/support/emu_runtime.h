// One emulator runtime (memory-only kernel cache) shared by the tests of a
// CMocka group: pass emu_runtime_setup / emu_runtime_teardown to
// cmocka_run_group_tests; each test calls need_runtime() first, which skips
// it, printing why, when the runtime could not be made.
#pragma once

#include <cstdio>
#include <string>

#include "support/cmocka.hh"
#include "support/numerics.h"

namespace fa::test {

inline fa_runtime *g_rt = nullptr;
inline std::string g_why;

inline int emu_runtime_setup(void **) {
  g_rt = make_runtime(FA_BACKEND_EMULATOR, &g_why);
  return 0;
}

inline int emu_runtime_teardown(void **) {
  fa_runtime_destroy(g_rt);
  g_rt = nullptr;
  return 0;
}

inline void need_runtime() {
  if (!g_rt) {
    std::printf("SKIP: emulator unavailable: %s\n", g_why.c_str());
    skip();
  }
}

}  // namespace fa::test

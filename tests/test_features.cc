// The feature descriptions (tests/features/<feature>.cases) through the C
// API on the emulator: one test per file, every line through the shared
// runners (support/feature_cases: ForwardCase, DecodeCase, the fp8 decode
// runner, run_reduce) against the fp64 reference with fresh random inputs
// (seeded by the line) and poisoned outputs; reject lines check the status
// and fa_last_error(). A failure names the file and line; a key or value
// the parser does not know fails the line. Lines with kv_dtype run on an
// emulated sm_89, the others on sm_80. The kernel-by-kernel checks stay in
// the per-feature suites (test_alibi, test_sinks, ...).
#include "support/cmocka.hh"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/feature_cases.h"
#include "support/feature_suite.h"
#include "support/numerics.h"

namespace {

namespace ft = fa::test::features;

fa_runtime *g_rt = nullptr, *g_rt89 = nullptr;
std::string g_why;

int setup(void **) {
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);  // the fp8 decode runner names its kernels
  g_rt = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why);
  g_rt89 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 89);
  return 0;
}

int teardown(void **) {
  fa_runtime_destroy(g_rt);
  fa_runtime_destroy(g_rt89);
  return 0;
}

void test_feature(void **state) {
  if (!g_rt || !g_rt89) {
    std::printf("SKIP: emulator unavailable: %s\n", g_why.c_str());
    skip();
  }
  const std::string name = static_cast<const char *>(*state);
  std::vector<ft::Line> lines;
  std::string failures;
  if (!ft::load(name, &lines, &failures)) failures += "\n";
  if (lines.empty() && failures.empty()) failures = name + ".cases: no lines\n";
  for (const ft::Line &l : lines) {
    std::printf("%s: %s\n", l.where().c_str(), l.text.c_str());
    ft::Spec s;
    std::string e;
    if (!ft::parse(l, &s, &e))
      e += "\n";
    else
      e = ft::run_c(s, g_rt, g_rt89);
    if (!e.empty()) failures += l.where() + ": " + l.text + "\n" + e;
  }
  if (!failures.empty()) {
    print_error("%s", failures.c_str());
    fail();
  }
}

}  // namespace

int main() { return ft::run_suite("test_features", test_feature, setup, teardown); }

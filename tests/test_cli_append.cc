// `flashattn decode --k-new --v-new --rotary-cos --rotary-sin` (FA_CLI_PATH)
// as a child process on the emulator: a cache too full for the new tokens
// is a usage error that writes nothing. (The appends with and without RoPE
// against the fp64 reference, tables that are not a multiple of 16 and
// rotary without --k-new: tests/features/append.cases through
// test_cli_features.)
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "flashattn.h"
#include "npy.h"
#include "reference.h"
// Last: it includes cmocka.
#include "support/cli_harness.h"

namespace {

using namespace fa::test::cli;

constexpr int kB = 2, kSq = 2, kSk = 70, kHq = 4, kHkv = 2, kD = 64, kRd = 32;
const std::vector<int32_t> kLens = {60, 11};  // before the append of kSq tokens

// Writes every input: q/k/v/lens, two new tokens per sequence and NeoX
// tables over kRd dims.
void write_case() {
  write_qkv(41, kB, kSq, kSk, kHq, kHkv, kD, &kLens);
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> kn(size_t(kB) * kSq * kHkv * kD), vn(kn.size());
  for (float &x : kn) x = nd(rng);
  for (float &x : vn) x = nd(rng);
  write_npy("k_new.npy", fa::npy::from_f32({kB, kSq, kHkv, kD}, kn.data()));
  write_npy("v_new.npy", fa::npy::from_f32({kB, kSq, kHkv, kD}, vn.data()));
  std::vector<float> cs(size_t(kSk) * kRd / 2, 0.6f), sn(cs.size(), 0.8f);
  write_npy("cos.npy", fa::npy::from_f32({kSk, kRd / 2}, cs.data()));
  write_npy("sin.npy", fa::npy::from_f32({kSk, kRd / 2}, sn.data()));
}

// The decode command line; `layout` is a --kv-layout ("paged" with pages of
// 16 tokens).
std::vector<std::string> cli_args(bool rope, bool interleaved,
                                  const std::string &layout = "paged") {
  std::vector<std::string> a =
      emulator_decode_args({"--k-new", path_of("k_new.npy"), "--v-new", path_of("v_new.npy"),
                            "--num-splits", "3", "--kv-layout", layout, "--causal"});
  if (layout == "paged") a.insert(a.end(), {"--page-size", "16"});
  if (rope)
    a.insert(a.end(), {"--rotary-cos", path_of("cos.npy"), "--rotary-sin", path_of("sin.npy")});
  if (interleaved) a.push_back("--rotary-interleaved");
  return a;
}

void test_bad_append(void **) {
  skip_without_cli();
  write_case();
  const std::vector<int32_t> full = {70, 11};
  write_npy("full.npy", fa::npy::from_i32({kB}, full.data()));
  struct Case {
    std::vector<std::string> args;
    const char *needle;
  };
  // (rotary tables of 8 dims and rotary without --k-new: append.cases
  // through test_cli_features)
  std::vector<Case> cases;
  Case c{cli_args(true, false), "would pass seqlen_k_max"};
  c.args[8] = path_of("full.npy");
  cases.push_back(c);
  for (const Case &b : cases) {
    std::remove(path_of("o.npy").c_str());
    const Result r = run_cli(b.args);
    expect(r.exited && r.code == 2, b.args, r, "exit status 2 expected");
    expect(contains(r.err, b.needle), b.args, r, b.needle);
    struct stat st;
    expect(stat(path_of("o.npy").c_str(), &st) != 0, b.args, r, "--out written on a usage error");
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_append),
  };
  return run_cli_suite("test_cli_append", tests);
}

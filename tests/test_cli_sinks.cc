// `flashattn run --sinks` and `flashattn decode --sinks` (FA_CLI_PATH), run
// as a child process on the emulator (the runs with sinks against the fp64
// reference: tests/features/sinks.cases through test_cli_features): bad
// sinks files are usage errors that write nothing;
// `generate --sinks` gives the sink kernels for forward and reduce and is a
// usage error for decode.

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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

constexpr int kB = 2, kSq = 6, kSk = 70, kHq = 4, kHkv = 2, kD = 64, kWindow = 20;
const std::vector<int32_t> kLens = {70, 11};

// Writes q/k/v/lens and random sinks.npy [kHq].
void write_case() {
  write_qkv(16, kB, kSq, kSk, kHq, kHkv, kD, &kLens);
  std::mt19937 rng(26);
  std::uniform_real_distribution<float> us(-1.0f, 5.0f);
  std::vector<float> sinks(kHq);
  for (float &s : sinks) s = us(rng);
  write_npy("sinks.npy", fa::npy::from_f32({kHq}, sinks.data()));
}

std::vector<std::string> cli_args(bool decode, const std::string &sinks) {
  std::vector<std::string> a = emulator_args(
      decode,
      {"--causal", "--window-left", std::to_string(kWindow), "--lse-out", path_of("lse.npy")});
  if (!sinks.empty()) a.insert(a.end(), {"--sinks", path_of(sinks)});
  return a;
}

void test_bad_sinks(void **) {
  skip_without_cli();
  write_case();
  const std::vector<float> five(5, 1.0f), two_d(kHq * 2, 1.0f);
  write_npy("s_len.npy", fa::npy::from_f32({5}, five.data()));
  write_npy("s_rank.npy", fa::npy::from_f32({kHq, 2}, two_d.data()));
  const std::vector<int32_t> ints(kHq, 1);
  write_npy("s_int.npy", fa::npy::from_i32({kHq}, ints.data()));
  const struct {
    const char *file, *needle;
  } kBad[] = {{"s_len.npy", "expected [4] (heads_q of q)"},
              {"s_rank.npy", "--sinks"},
              {"s_int.npy", "--sinks"},
              {"missing.npy", "--sinks"}};
  for (bool decode : {false, true})
    for (const auto &b : kBad) {
      std::remove(path_of("o.npy").c_str());
      const std::vector<std::string> args = cli_args(decode, b.file);
      const Result r = run_cli(args);
      expect(r.exited && r.code == 2, args, r, "exit status 2 expected");
      expect(contains(r.err, b.needle), args, r, b.needle);
      struct stat st;
      expect(stat(path_of("o.npy").c_str(), &st) != 0, args, r, "--out written on a usage error");
    }
}

void test_generate_sinks(void **) {
  skip_without_cli();
  for (const char *kind : {"forward", "reduce"}) {
    const std::vector<std::string> g = {
        "generate",  "--kind", kind,         "--dtype", "bf16", "--head-dim", "128",
        "--heads-q", "8",      "--heads-kv", "2",       "--sm", "80"};
    const Result plain = run_cli(g);
    expect(plain.code == 0 && contains(plain.out, ".entry") && !contains(plain.out, "sinks"), g,
           plain, "plain generate");
    std::vector<std::string> s = g;
    s.push_back("--sinks");
    const Result r = run_cli(s);
    expect(r.code == 0 && contains(r.out, "_sinks_param") && r.out != plain.out, s, r,
           "--sinks: the sink kernel");
  }
  const std::vector<std::string> bad = {
      "generate",  "--kind", "decode",     "--dtype", "fp16", "--head-dim", "64",
      "--heads-q", "4",      "--heads-kv", "4",       "--sm", "80",         "--sinks"};
  const Result r = run_cli(bad);
  expect(r.exited && r.code == 2 &&
             contains(r.err, "--sinks is for --kind forward, reduce or the backward kinds"),
         bad, r, "decode --sinks");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_sinks),
      cmocka_unit_test(test_generate_sinks),
  };
  return run_cli_suite("test_cli_sinks", tests);
}

// `flashattn run` and `flashattn decode` with `--alibi-slopes` and `--alibi`
// (FA_CLI_PATH), run as a child process on the emulator: the standard
// slopes, a causal window and GQA, forward over a contiguous cache and
// decode with splits over a paged one, each checked against an fp64
// reference with the slopes computed here (and differing from the run
// without them; slopes from a file: tests/features/alibi.cases through
// test_cli_features); bad slope files and both options at once are usage errors
// that write nothing; `generate --alibi` gives the ALiBi kernels for forward
// and decode and is a usage error for reduce.

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

// Writes q/k/v/lens and the slopes ("given": random [kB, kHq] slopes in
// slopes.npy; else the standard ones of --alibi) and returns the fp64
// reference O and LSE of a causal window (decode: the queries are the last
// of kLens[b] keys).
void write_case(bool decode, bool given, std::vector<double> *o_ref, std::vector<double> *lse_ref) {
  const QkvInputs in = write_qkv(decode ? 37 : 36, kB, kSq, kSk, kHq, kHkv, kD, &kLens);
  std::mt19937 rng(decode ? 47 : 46);
  std::uniform_real_distribution<float> us(0.01f, 0.5f);
  std::vector<float> slopes(size_t(kB) * kHq);
  for (float &s : slopes) s = us(rng);
  write_npy("slopes.npy", fa::npy::from_f32({kB, kHq}, slopes.data()));
  const std::vector<float> standard = fa::ref::standard_alibi_slopes(kHq);
  fa::ref::Problem p;
  p.batch = kB;
  p.seqlen_q = kSq;
  p.seqlen_k = kSk;
  p.num_heads_q = kHq;
  p.num_heads_kv = kHkv;
  p.head_dim = p.head_dim_v = kD;
  p.causal = true;
  p.window_left = kWindow;
  p.alibi_slopes = given ? slopes.data() : standard.data();
  p.alibi_stride = given ? kHq : 0;
  o_ref->assign(size_t(kB) * kSq * kHq * kD, 0);
  lse_ref->assign(size_t(kB) * kHq * kSq, 0);
  fa::ref::attention(p, in.q.data(), in.k.data(), in.v.data(), o_ref->data(), lse_ref->data(),
                     decode ? kLens.data() : nullptr);
}

// alibi: "" = none, "std" = --alibi, else --alibi-slopes FILE.
std::vector<std::string> cli_args(bool decode, const std::string &alibi) {
  std::vector<std::string> a = emulator_args(
      decode,
      {"--causal", "--window-left", std::to_string(kWindow), "--lse-out", path_of("lse.npy")});
  if (alibi == "std")
    a.push_back("--alibi");
  else if (!alibi.empty())
    a.insert(a.end(), {"--alibi-slopes", path_of(alibi)});
  return a;
}

// Runs args after removing the outputs; expects PASS and outputs within
// the program's tolerance of o_ref / lse_ref. Returns O.
std::vector<float> run_and_check(const std::vector<std::string> &args,
                                 const std::vector<double> &o_ref,
                                 const std::vector<double> &lse_ref) {
  std::remove(path_of("o.npy").c_str());
  std::remove(path_of("lse.npy").c_str());
  const Result r = run_cli(args);
  expect(r.exited && r.code == 0, args, r, "exit status is not 0");
  expect(contains(r.out, "\nPASS"), args, r, "no PASS line");
  expect(contains(r.out, "alibi:"), args, r, "no alibi line");
  const std::vector<float> o = read_npy("o.npy").to_f32();
  const fa::ref::ErrorStats e = fa::ref::compare(o.data(), o_ref.data(), o.size());
  if (e.nonfinite || e.max_abs > 1e-2 * std::max(1.0, e.max_ref) || e.rel_l2 >= 1e-2)
    expect(false, args, r, "O outside tolerance");
  const std::vector<float> lse = read_npy("lse.npy").to_f32();
  assert_int_equal(lse.size(), lse_ref.size());
  for (size_t i = 0; i < lse.size(); ++i) {
    const bool ok = std::isfinite(lse[i]) &&
                    std::fabs(lse[i] - lse_ref[i]) <= 2e-3 * std::max(1.0, std::fabs(lse_ref[i]));
    if (!ok) expect(false, args, r, "LSE outside tolerance");
  }
  return o;
}

// The standard slopes of --alibi (slopes from a file: tests/features/
// alibi.cases through test_cli_features).
void test_run_and_decode_standard_alibi(void **) {
  skip_without_cli();
  for (bool decode : {false, true}) {
    std::vector<double> o_ref, lse_ref;
    write_case(decode, false, &o_ref, &lse_ref);
    const std::vector<float> with = run_and_check(cli_args(decode, "std"), o_ref, lse_ref);
    // Without ALiBi the program runs (and passes) the plain softmax,
    // whose O differs.
    const std::vector<std::string> plain = cli_args(decode, "");
    const Result r = run_cli(plain);
    expect(r.exited && r.code == 0 && !contains(r.out, "alibi:"), plain, r, "plain run");
    assert_true(read_npy("o.npy").to_f32() != with);
  }
}

void test_bad_alibi(void **) {
  skip_without_cli();
  std::vector<double> o_ref, lse_ref;
  write_case(false, true, &o_ref, &lse_ref);
  const std::vector<float> five(5, 0.5f), three_d(kB * kHq, 0.5f), wrong_b(3 * kHq, 0.5f);
  write_npy("a_len.npy", fa::npy::from_f32({5}, five.data()));
  write_npy("a_rank.npy", fa::npy::from_f32({kB, kHq, 1}, three_d.data()));
  write_npy("a_batch.npy", fa::npy::from_f32({3, kHq}, wrong_b.data()));
  const std::vector<int32_t> ints(kHq, 1);
  write_npy("a_int.npy", fa::npy::from_i32({kHq}, ints.data()));
  const struct {
    const char *file, *needle;
  } kBad[] = {{"a_len.npy", "expected [4] or [2, 4]"},
              {"a_rank.npy", "--alibi-slopes"},
              {"a_batch.npy", "expected [4] or [2, 4]"},
              {"a_int.npy", "--alibi-slopes"},
              {"missing.npy", "--alibi-slopes"}};
  for (bool decode : {false, true}) {
    for (const auto &b : kBad) {
      std::remove(path_of("o.npy").c_str());
      const std::vector<std::string> args = cli_args(decode, b.file);
      const Result r = run_cli(args);
      expect(r.exited && r.code == 2, args, r, "exit status 2 expected");
      expect(contains(r.err, b.needle), args, r, b.needle);
      struct stat st;
      expect(stat(path_of("o.npy").c_str(), &st) != 0, args, r, "--out written on a usage error");
    }
    std::vector<std::string> both = cli_args(decode, "slopes.npy");
    both.push_back("--alibi");
    const Result r = run_cli(both);
    expect(r.exited && r.code == 2 && contains(r.err, "give one of them"), both, r, "both");
  }
}

void test_generate_alibi(void **) {
  skip_without_cli();
  for (const char *kind : {"forward", "decode"}) {
    const std::vector<std::string> g = {
        "generate",  "--kind", kind,         "--dtype", "bf16", "--head-dim", "128",
        "--heads-q", "8",      "--heads-kv", "2",       "--sm", "80"};
    const Result plain = run_cli(g);
    expect(plain.code == 0 && contains(plain.out, ".entry") && !contains(plain.out, "alibi"), g,
           plain, "plain generate");
    std::vector<std::string> s = g;
    s.push_back("--alibi");
    const Result r = run_cli(s);
    expect(r.code == 0 && contains(r.out, "_alibi_param") && r.out != plain.out, s, r,
           "--alibi: the ALiBi kernel");
  }
  const std::vector<std::string> bad = {
      "generate",  "--kind", "reduce",     "--dtype", "fp16", "--head-dim", "64",
      "--heads-q", "4",      "--heads-kv", "4",       "--sm", "80",         "--alibi"};
  const Result r = run_cli(bad);
  expect(r.exited && r.code == 2 &&
             contains(r.err, "--alibi is for --kind forward, decode or the backward kinds"),
         bad, r, "reduce --alibi");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_run_and_decode_standard_alibi),
      cmocka_unit_test(test_bad_alibi),
      cmocka_unit_test(test_generate_alibi),
  };
  return run_cli_suite("test_cli_alibi", tests);
}

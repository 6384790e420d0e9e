// `flashattn run --sinks` and `flashattn decode --sinks` (FA_CLI_PATH), run
// as a child process on the emulator: random sinks in a float32 .npy, a
// causal window (gpt-oss's banded layers) and GQA, forward over a contiguous
// cache and decode with splits over a paged one, each checked against an
// fp64 reference with the sinks computed here (and differing from the run
// without them); bad sinks files are usage errors that write nothing;
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

// Writes q/k/v/lens/sinks and returns the fp64 reference O and LSE of a
// causal window; decode: the queries are the last of kLens[b] keys.
void write_case(bool decode, std::vector<double> *o_ref, std::vector<double> *lse_ref) {
  const QkvInputs in = write_qkv(decode ? 17 : 16, kB, kSq, kSk, kHq, kHkv, kD, &kLens);
  std::mt19937 rng(decode ? 27 : 26);
  std::uniform_real_distribution<float> us(-1.0f, 5.0f);
  std::vector<float> sinks(kHq);
  for (float &s : sinks) s = us(rng);
  write_npy("sinks.npy", fa::npy::from_f32({kHq}, sinks.data()));
  fa::ref::Problem p;
  p.batch = kB;
  p.seqlen_q = kSq;
  p.seqlen_k = kSk;
  p.num_heads_q = kHq;
  p.num_heads_kv = kHkv;
  p.head_dim = p.head_dim_v = kD;
  p.causal = true;
  p.window_left = kWindow;
  p.sinks = sinks.data();
  o_ref->assign(size_t(kB) * kSq * kHq * kD, 0);
  lse_ref->assign(size_t(kB) * kHq * kSq, 0);
  fa::ref::attention(p, in.q.data(), in.k.data(), in.v.data(), o_ref->data(), lse_ref->data(),
                     decode ? kLens.data() : nullptr);
}

std::vector<std::string> cli_args(bool decode, const std::string &sinks) {
  std::vector<std::string> a;
  if (decode) {
    a = {"decode",
         "--q",
         path_of("q.npy"),
         "--k-cache",
         path_of("k.npy"),
         "--v-cache",
         path_of("v.npy"),
         "--cache-seqlens",
         path_of("lens.npy"),
         "--num-splits",
         "3",
         "--kv-layout",
         "paged",
         "--page-size",
         "16"};
  } else {
    a = {"run", "--q", path_of("q.npy"), "--k", path_of("k.npy"), "--v", path_of("v.npy")};
  }
  a.insert(a.end(), {"--backend", "emulator", "--causal", "--window-left", std::to_string(kWindow),
                     "--out", path_of("o.npy"), "--lse-out", path_of("lse.npy")});
  if (!sinks.empty()) a.insert(a.end(), {"--sinks", path_of(sinks)});
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
  expect(contains(r.out, "sinks:"), args, r, "no sinks line");
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

void test_run_and_decode_sinks(void **) {
  skip_without_cli();
  for (bool decode : {false, true}) {
    std::vector<double> o_ref, lse_ref;
    write_case(decode, &o_ref, &lse_ref);
    const std::vector<float> with = run_and_check(cli_args(decode, "sinks.npy"), o_ref, lse_ref);
    // Without --sinks the program runs (and passes) the plain softmax, whose
    // O differs.
    const std::vector<std::string> plain = cli_args(decode, "");
    const Result r = run_cli(plain);
    expect(r.exited && r.code == 0 && !contains(r.out, "sinks:"), plain, r, "plain run");
    assert_true(read_npy("o.npy").to_f32() != with);
  }
}

void test_bad_sinks(void **) {
  skip_without_cli();
  std::vector<double> o_ref, lse_ref;
  write_case(false, &o_ref, &lse_ref);
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
  expect(r.exited && r.code == 2 && contains(r.err, "--sinks is for --kind forward or reduce"), bad,
         r, "decode --sinks");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_run_and_decode_sinks),
      cmocka_unit_test(test_bad_sinks),
      cmocka_unit_test(test_generate_sinks),
  };
  return run_cli_suite("test_cli_sinks", tests);
}

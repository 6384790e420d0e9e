// `flashattn decode --k-new --v-new --rotary-cos --rotary-sin` (FA_CLI_PATH)
// as a child process on the emulator: a paged cache with splits, GQA and
// two new tokens per sequence appended at --cache-seqlens with NeoX and
// GPT-J rotary embedding; O is checked against an fp64 reference computed
// here over the host's rotate-then-copy (fa::ref::rope_row), and differs
// from the run without rotary. Bad append inputs (a cache too full for the
// new tokens, a table whose rotary_dim is not a multiple of 16, rotary
// without --k-new) are usage errors that write nothing.
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

// Writes every input; returns the fp64 reference O of the causal decode
// after the append (rotary when `rope`, GPT-J pairs when `interleaved`).
std::vector<double> write_case(bool rope, bool interleaved) {
  QkvInputs in = write_qkv(41, kB, kSq, kSk, kHq, kHkv, kD, &kLens);
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> kn(size_t(kB) * kSq * kHkv * kD), vn(kn.size());
  for (float &x : kn) x = fa::ref::round_to(nd(rng), false);
  for (float &x : vn) x = fa::ref::round_to(nd(rng), false);
  write_npy("k_new.npy", fa::npy::from_f32({kB, kSq, kHkv, kD}, kn.data()));
  write_npy("v_new.npy", fa::npy::from_f32({kB, kSq, kHkv, kD}, vn.data()));
  std::vector<float> cs(size_t(kSk) * kRd / 2), sn(cs.size());
  for (int p = 0; p < kSk; ++p)
    for (int i = 0; i < kRd / 2; ++i) {
      const double th = p * std::pow(100000.0, -2.0 * i / kRd);  // SmolLM2's theta
      cs[size_t(p) * kRd / 2 + i] = float(std::cos(th));
      sn[size_t(p) * kRd / 2 + i] = float(std::sin(th));
    }
  write_npy("cos.npy", fa::npy::from_f32({kSk, kRd / 2}, cs.data()));
  write_npy("sin.npy", fa::npy::from_f32({kSk, kRd / 2}, sn.data()));
  auto rot = [&](double *row, int pos) {
    if (!rope) return;
    std::vector<float> x(row, row + kD);
    fa::ref::rope_row(x.data(), kRd, interleaved, &cs[size_t(pos) * kRd / 2],
                      &sn[size_t(pos) * kRd / 2], false);
    std::copy(x.begin(), x.end(), row);
  };
  std::vector<int32_t> lens = kLens;
  for (int b = 0; b < kB; ++b) {
    for (int t = 0; t < kSq; ++t) {
      for (int h = 0; h < kHq; ++h) rot(&in.q[((size_t(b) * kSq + t) * kHq + h) * kD], lens[b] + t);
      for (int h = 0; h < kHkv; ++h) {
        const size_t dst = ((size_t(b) * kSk + lens[b] + t) * kHkv + h) * kD;
        const size_t src = ((size_t(b) * kSq + t) * kHkv + h) * kD;
        std::copy_n(&kn[src], kD, &in.k[dst]);
        std::copy_n(&vn[src], kD, &in.v[dst]);
        rot(&in.k[dst], lens[b] + t);
      }
    }
    lens[b] += kSq;
  }
  fa::ref::Problem p;
  p.batch = kB;
  p.seqlen_q = kSq;
  p.seqlen_k = kSk;
  p.num_heads_q = kHq;
  p.num_heads_kv = kHkv;
  p.head_dim = p.head_dim_v = kD;
  p.causal = true;
  std::vector<double> o(size_t(kB) * kSq * kHq * kD), lse(size_t(kB) * kHq * kSq);
  fa::ref::attention(p, in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), lens.data());
  return o;
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

// Paged: no rotary, NeoX, GPT-J; then NeoX on one allocation per sequence
// (ptrs, each holding its valid keys and the appended rows, no more: a
// write past them is an out-of-bounds store on the emulator) and on the
// contiguous cache.
void test_decode_append(void **) {
  skip_without_cli();
  std::vector<float> plain;
  for (int mode = 0; mode < 5; ++mode) {
    const bool rope = mode > 0, interleaved = mode == 2;
    const char *layout = mode == 3 ? "ptrs" : mode == 4 ? "contiguous" : "paged";
    const std::vector<double> o_ref = write_case(rope, interleaved);
    const std::vector<std::string> args = cli_args(rope, interleaved, layout);
    std::remove(path_of("o.npy").c_str());
    const Result r = run_cli(args);
    expect(r.exited && r.code == 0, args, r, "exit status is not 0");
    expect(contains(r.out, "\nPASS"), args, r, "no PASS line");
    expect(contains(r.out, "kv append:"), args, r, "no kv append line");
    const std::vector<float> o = read_npy("o.npy").to_f32();
    const fa::ref::ErrorStats e = fa::ref::compare(o.data(), o_ref.data(), o.size());
    if (e.nonfinite || e.max_abs > 1e-2 * std::max(1.0, e.max_ref) || e.rel_l2 >= 1e-2)
      expect(false, args, r, "O outside tolerance");
    if (mode == 0) plain = o;
    if (mode > 0) assert_true(o != plain);  // the rotation changes O
  }
}

void test_bad_append(void **) {
  skip_without_cli();
  write_case(true, false);
  const std::vector<int32_t> full = {70, 11};
  write_npy("full.npy", fa::npy::from_i32({kB}, full.data()));
  std::vector<float> t(size_t(kSk) * 12, 0.5f);
  write_npy("cos24.npy", fa::npy::from_f32({kSk, 12}, t.data()));
  write_npy("sin24.npy", fa::npy::from_f32({kSk, 12}, t.data()));
  struct Case {
    std::vector<std::string> args;
    const char *needle;
  };
  std::vector<Case> cases;
  Case c{cli_args(true, false), "would pass seqlen_k_max"};
  c.args[8] = path_of("full.npy");
  cases.push_back(c);
  c = {cli_args(true, false), "multiple of 16"};
  std::replace(c.args.begin(), c.args.end(), path_of("cos.npy"), path_of("cos24.npy"));
  std::replace(c.args.begin(), c.args.end(), path_of("sin.npy"), path_of("sin24.npy"));
  cases.push_back(c);
  c = {cli_args(true, false), "need --k-new"};
  const auto k_new = std::find(c.args.begin(), c.args.end(), "--k-new");
  c.args.erase(k_new, k_new + 4);  // --k-new, --v-new and their files
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
      cmocka_unit_test(test_decode_append),
      cmocka_unit_test(test_bad_append),
  };
  return run_cli_suite("test_cli_append", tests);
}

// `flashattn decode --tree-mask` and the 0.4 options of `flashattn generate`
// (FA_CLI_PATH), run as a child process on the emulator: a random tree per
// sequence in an int32 .npy, checked against an fp64 reference with the
// mask computed here (uint8 masks, one for the batch, paged caches:
// tests/features/tree_mask.cases through test_cli_features); bad masks are usage errors that write
// nothing; `generate --tree-mask` gives the tree kernel and leaves the default one alone; `generate
// --lse-partial-format/--lse-format` the reduce variants.

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

constexpr int kB = 2, kSq = 5, kSk = 40, kHq = 4, kHkv = 2, kD = 64;
const std::vector<int32_t> kLens = {40, 9};

// Random trees (bit (i, j): j is i or an ancestor of i), [trees][sq][sq].
std::vector<uint8_t> random_trees(int trees, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> m(size_t(trees) * kSq * kSq, 0);
  for (int t = 0; t < trees; ++t) {
    std::vector<int> parent(kSq, -1);
    for (int i = 0; i < kSq; ++i) {
      if (i) parent[i] = std::uniform_int_distribution<int>(-1, i - 1)(gen);
      for (int j = i; j >= 0; j = parent[j]) m[(size_t(t) * kSq + i) * kSq + j] = 1;
    }
  }
  return m;
}

// Writes q/k/v/lens and returns the fp64 reference O and LSE under `tree`
// ([kB][sq][sq]); causal as given.
void write_case(const std::vector<uint8_t> &tree, bool causal, std::vector<double> *o_ref,
                std::vector<double> *lse_ref) {
  const QkvInputs in = write_qkv(5, kB, kSq, kSk, kHq, kHkv, kD, &kLens);
  fa::ref::Problem p;
  p.batch = kB;
  p.seqlen_q = kSq;
  p.seqlen_k = kSk;
  p.num_heads_q = kHq;
  p.num_heads_kv = kHkv;
  p.head_dim = p.head_dim_v = kD;
  p.causal = causal;
  p.tree_mask = tree.data();
  o_ref->assign(size_t(kB) * kSq * kHq * kD, 0);
  lse_ref->assign(size_t(kB) * kHq * kSq, 0);
  fa::ref::attention(p, in.q.data(), in.k.data(), in.v.data(), o_ref->data(), lse_ref->data(),
                     kLens.data());
}

fa::npy::Array u8_array(const std::vector<int64_t> &shape, const std::vector<uint8_t> &bits) {
  fa::npy::Array a;
  a.dtype = fa::npy::DType::U8;
  a.shape = shape;
  a.data = bits;
  return a;
}

std::vector<std::string> decode_args(const std::string &mask, bool causal) {
  std::vector<std::string> a =
      emulator_decode_args({"--lse-out", path_of("lse.npy"), "--tree-mask", path_of(mask)});
  if (causal) a.push_back("--causal");
  return a;
}

// Runs args after removing the outputs; expects PASS and outputs within
// the program's tolerance of o_ref / lse_ref.
void run_and_check(const std::vector<std::string> &args, const std::vector<double> &o_ref,
                   const std::vector<double> &lse_ref) {
  std::remove(path_of("o.npy").c_str());
  std::remove(path_of("lse.npy").c_str());
  const Result r = run_cli(args);
  expect(r.exited && r.code == 0, args, r, "exit status is not 0");
  expect(contains(r.out, "\nPASS"), args, r, "no PASS line");
  expect(contains(r.out, "tree mask:"), args, r, "no tree mask line");
  const std::vector<float> o = read_npy("o.npy").to_f32();
  const fa::ref::ErrorStats e = fa::ref::compare(o.data(), o_ref.data(), o.size());
  if (e.nonfinite || e.max_abs > 1e-2 * std::max(1.0, e.max_ref) || e.rel_l2 >= 1e-2)
    expect(false, args, r, "O outside tolerance");
  const std::vector<float> lse = read_npy("lse.npy").to_f32();
  assert_int_equal(lse.size(), lse_ref.size());
  for (size_t i = 0; i < lse.size(); ++i) {
    const bool ok = std::isinf(lse_ref[i]) ? std::isinf(lse[i]) && lse[i] < 0
                                           : std::fabs(lse[i] - lse_ref[i]) <=
                                                 2e-3 * std::max(1.0, std::fabs(lse_ref[i]));
    if (!ok) expect(false, args, r, "LSE outside tolerance");
  }
}

// An int32 mask (any nonzero value means visible), causal on top (a tree in
// topological order is unchanged by it). (uint8 masks per sequence and for
// the batch, contiguous and paged: tests/features/tree_mask.cases through
// test_cli_features.)
void test_decode_tree_mask_int32(void **) {
  skip_without_cli();
  const std::vector<uint8_t> trees = random_trees(kB, 11);
  std::vector<double> o_ref, lse_ref, o_c, lse_c;
  write_case(trees, false, &o_ref, &lse_ref);
  write_case(trees, true, &o_c, &lse_c);
  std::vector<int32_t> ints(trees.begin(), trees.end());
  for (int32_t &x : ints) x *= 7;
  write_npy("mask_i4.npy", fa::npy::from_i32({kB, kSq, kSq}, ints.data()));
  run_and_check(decode_args("mask_i4.npy", true), o_c, lse_c);
  assert_true(o_c == o_ref);
}

void test_bad_tree_mask(void **) {
  skip_without_cli();
  std::vector<double> o_ref, lse_ref;
  write_case(random_trees(kB, 3), false, &o_ref, &lse_ref);
  write_npy("m_shape.npy", u8_array({kB, kSq, kSq + 1}, std::vector<uint8_t>(kB * kSq * 6, 1)));
  write_npy("m_batch.npy", u8_array({3, kSq, kSq}, std::vector<uint8_t>(3 * kSq * kSq, 1)));
  const std::vector<float> f(size_t(kB) * kSq * kSq, 1.0f);
  write_npy("m_float.npy", fa::npy::from_f32({kB, kSq, kSq}, f.data()));
  const struct {
    const char *file, *needle;
  } kBad[] = {{"m_shape.npy", "expected [2 or 1, 5, 5]"},
              {"m_batch.npy", "expected [2 or 1, 5, 5]"},
              {"m_float.npy", "an integer array"},
              {"missing.npy", "--tree-mask"}};
  for (const auto &b : kBad) {
    std::remove(path_of("o.npy").c_str());
    const std::vector<std::string> args = decode_args(b.file, false);
    const Result r = run_cli(args);
    expect(r.exited && r.code == 2, args, r, "exit status 2 expected");
    expect(contains(r.err, b.needle), args, r, b.needle);
    struct stat st;
    expect(stat(path_of("o.npy").c_str(), &st) != 0, args, r, "--out written on a usage error");
  }
}

void test_generate_options(void **) {
  skip_without_cli();
  const std::vector<std::string> dec = {
      "generate",  "--kind", "decode",     "--dtype", "fp16", "--head-dim", "128",
      "--heads-q", "8",      "--heads-kv", "2",       "--sm", "80"};
  const Result plain = run_cli(dec);
  expect(plain.code == 0 && contains(plain.out, ".entry"), dec, plain, "plain generate");
  std::vector<std::string> tree = dec;
  tree.push_back("--tree-mask");
  const Result t = run_cli(tree);
  expect(t.code == 0 && contains(t.out, "_tree_param") && t.out != plain.out, tree, t,
         "--tree-mask: the tree kernel");
  tree.insert(tree.end(), {"--kv-layout", "paged", "--page-size", "16"});
  const Result tp = run_cli(tree);
  expect(tp.code == 0 && contains(tp.out, "_paged_tiles_tree_param"), tree, tp, "paged tree");
  std::vector<std::string> red = dec;
  red[2] = "reduce";
  const Result rp = run_cli(red);
  red.insert(red.end(), {"--lse-partial-format", "base2", "--lse-format", "natural"});
  const Result r2 = run_cli(red);
  expect(r2.code == 0 && contains(r2.out, "_lse2in_param") && r2.out != rp.out, red, r2,
         "reduce with base-2 input");
  const std::vector<std::vector<std::string>> bad = {
      [&] {
        auto a = dec;
        a[2] = "forward";
        a.push_back("--tree-mask");
        return a;
      }(),
      [&] {
        auto a = dec;
        a.insert(a.end(), {"--lse-format", "base2"});
        return a;
      }(),
      [&] {
        auto a = dec;
        a[2] = "reduce";
        a.insert(a.end(), {"--lse-format", "base10"});
        return a;
      }(),
  };
  for (const auto &a : bad) {
    const Result r = run_cli(a);
    expect(r.exited && r.code == 2, a, r, "exit status 2 expected");
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_tree_mask_int32),
      cmocka_unit_test(test_bad_tree_mask),
      cmocka_unit_test(test_generate_options),
  };
  return run_cli_suite("test_cli_tree_mask", tests);
}

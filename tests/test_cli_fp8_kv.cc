// `flashattn decode --kv-dtype e4m3|e5m2 [--kv-scale head|tensor]`
// (FA_CLI_PATH), run as a child process on an sm_89 emulator: the program
// quantises the K/V .npy values to fp8 bytes with descales amax / 448 (e4m3)
// or amax / 57344 (e5m2) per (batch, KV head) or per tensor; each run is
// checked against an fp64 reference over the values those bytes hold,
// quantised here (the same rule, over the valid rows), over a paged and a
// contiguous cache; a bad --kv-dtype is a usage error that writes nothing,
// and sm_80 is refused (UNSUPPORTED).

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "flashattn.h"
#include "npy.h"
#include "reference.h"

// Last: it includes cmocka.
#include "support/cli_harness.h"

namespace {

using namespace fa::test::cli;

constexpr int kB = 2, kSq = 3, kSk = 70, kHq = 4, kHkv = 2, kD = 64;
const std::vector<int32_t> kLens = {70, 29};

// The fp8 values of a cache read back from its .npy, quantised per the
// CLI's rule (descale = amax / fp8 max over each group's valid rows).
std::vector<double> quantized(const char *file, bool e5m2, bool per_head) {
  const std::vector<float> x = read_npy(file).to_f32();
  auto at = [&](int b, int j, int h) { return ((size_t(b) * kSk + j) * kHkv + h) * kD; };
  std::vector<double> amax(per_head ? kB * kHkv : 1, 0.0);
  for (int b = 0; b < kB; ++b)
    for (int j = 0; j < kLens[b]; ++j)
      for (int h = 0; h < kHkv; ++h)
        for (int e = 0; e < kD; ++e) {
          double &m = amax[per_head ? b * kHkv + h : 0];
          m = std::max(m, std::fabs(double(x[at(b, j, h) + e])));
        }
  std::vector<double> out(x.size(), 0.0);
  for (int b = 0; b < kB; ++b)
    for (int j = 0; j < kLens[b]; ++j)
      for (int h = 0; h < kHkv; ++h) {
        const double m = amax[per_head ? b * kHkv + h : 0];
        const double ds = double(float(m > 0 ? m / fa::ref::fp8_max(e5m2) : 1.0));
        for (int e = 0; e < kD; ++e) {
          const size_t i = at(b, j, h) + e;
          out[i] = fa::ref::fp8_to_double(fa::ref::fp8_from_double(x[i] / ds, e5m2), e5m2) * ds;
        }
      }
  return out;
}

std::vector<std::string> cli_args(const std::string &kv_dtype, const std::string &scale, bool paged,
                                  const char *sm) {
  std::vector<std::string> a = {"decode",
                                "--q",
                                path_of("q.npy"),
                                "--k-cache",
                                path_of("k.npy"),
                                "--v-cache",
                                path_of("v.npy"),
                                "--cache-seqlens",
                                path_of("lens.npy"),
                                "--backend",
                                "emulator",
                                "--emulator-sm",
                                sm,
                                "--causal",
                                "--num-splits",
                                "2",
                                "--out",
                                path_of("o.npy"),
                                "--lse-out",
                                path_of("lse.npy"),
                                "--kv-dtype",
                                kv_dtype,
                                "--kv-scale",
                                scale};
  if (paged) a.insert(a.end(), {"--kv-layout", "paged", "--page-size", "16"});
  return a;
}

void test_decode_fp8(void **) {
  skip_without_cli();
  const QkvInputs in = write_qkv(31, kB, kSq, kSk, kHq, kHkv, kD, &kLens);
  const struct {
    const char *dtype, *scale;
    bool paged;
  } kCases[] = {{"e4m3", "head", true}, {"e5m2", "tensor", false}, {"e4m3", "tensor", false}};
  for (const auto &c : kCases) {
    const bool e5m2 = std::string(c.dtype) == "e5m2", per_head = std::string(c.scale) == "head";
    const std::vector<double> k = quantized("k.npy", e5m2, per_head);
    const std::vector<double> v = quantized("v.npy", e5m2, per_head);
    fa::ref::Problem p;
    p.batch = kB;
    p.seqlen_q = kSq;
    p.seqlen_k = kSk;
    p.num_heads_q = kHq;
    p.num_heads_kv = kHkv;
    p.head_dim = p.head_dim_v = kD;
    p.causal = true;
    std::vector<double> o_ref(size_t(kB) * kSq * kHq * kD), lse_ref(size_t(kB) * kHq * kSq);
    fa::ref::attention(p, in.q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data(),
                       kLens.data());
    std::remove(path_of("o.npy").c_str());
    const std::vector<std::string> args = cli_args(c.dtype, c.scale, c.paged, "89");
    const Result r = run_cli(args);
    expect(r.exited && r.code == 0, args, r, "exit status is not 0");
    expect(contains(r.out, "\nPASS"), args, r, "no PASS line");
    expect(contains(r.out, std::string("kv dtype:    ") + c.dtype), args, r, "no kv dtype line");
    const std::vector<float> o = read_npy("o.npy").to_f32();
    const fa::ref::ErrorStats e = fa::ref::compare(o.data(), o_ref.data(), o.size());
    std::printf("  %s %s %s: O max_abs %.3g (max|ref| %.3g)\n", c.dtype, c.scale,
                c.paged ? "paged" : "contiguous", e.max_abs, e.max_ref);
    if (e.nonfinite || e.max_abs > 4e-3 * std::max(1.0, e.max_ref) || e.rel_l2 >= 1e-2)
      expect(false, args, r, "O outside tolerance of the fp8 reference");
    const std::vector<float> lse = read_npy("lse.npy").to_f32();
    for (size_t i = 0; i < lse.size(); ++i)
      if (!(std::fabs(lse[i] - lse_ref[i]) <= 2e-3 * std::max(1.0, std::fabs(lse_ref[i]))))
        expect(false, args, r, "LSE outside tolerance");
  }
}

void test_fp8_refused(void **) {
  skip_without_cli();
  write_qkv(32, kB, kSq, kSk, kHq, kHkv, kD, &kLens);
  struct stat st;
  std::remove(path_of("o.npy").c_str());
  std::vector<std::string> args = cli_args("e3m4", "head", false, "89");
  Result r = run_cli(args);
  expect(r.exited && r.code == 2 && contains(r.err, "--kv-dtype"), args, r, "bad --kv-dtype");
  expect(stat(path_of("o.npy").c_str(), &st) != 0, args, r, "--out written on a usage error");
  args = cli_args("e4m3", "head", false, "80");
  r = run_cli(args);
  expect(r.exited && r.code != 0 && contains(r.err, "sm_89"), args, r, "sm_80 refused");
  expect(stat(path_of("o.npy").c_str(), &st) != 0, args, r, "--out written on a refusal");
}

}  // namespace

int main() {
  g_dir = std::string(FA_TEST_BINARY_DIR) + "/test_cli_fp8_kv_work";
  mkdir(g_dir.c_str(), 0755);
  setenv("FLASHATTN_CACHE_DIR", (g_dir + "/cache").c_str(), 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_fp8),
      cmocka_unit_test(test_fp8_refused),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}

// `flashattn decode --kv-dtype e4m3|e5m2 [--kv-scale head|tensor]`
// (FA_CLI_PATH), run as a child process on an sm_89 emulator: the program
// quantises the K/V .npy values to fp8 bytes with descales amax / 448 (e4m3)
// or amax / 57344 (e5m2) per (batch, KV head) or per tensor (the runs of
// each format and descale form against the fp64 reference:
// tests/features/fp8_kv.cases through test_cli_features); --k-new/--v-new
// (with NeoX RoPE, some new values past the cache's amax) appended into the
// fp8 cache, the new rows quantised with the cache's descales (K after
// RoPE, rounded to fp16 first), checked against an fp64 reference over the
// values the bytes hold (quantised here by the same rule); a bad --kv-dtype is a usage error that
// writes nothing, and sm_80 is refused (UNSUPPORTED).

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

constexpr int kB = 2, kSq = 3, kSk = 70, kHq = 4, kHkv = 2, kD = 64;
const std::vector<int32_t> kLens = {70, 29};        // test_fp8_refused
const std::vector<int32_t> kLensAppend = {60, 29};  // before appending kSq tokens

// The fp8 values of a cache read back from its .npy as the program
// quantises it over the first valid[b] rows (*descales: its descales).
std::vector<double> quantized(const char *file, bool e5m2, bool per_head,
                              const std::vector<int32_t> &valid,
                              std::vector<double> *descales = nullptr) {
  return cli_fp8_values(read_npy(file).to_f32(), kB, kSk, kHkv, kD, 1, e5m2, per_head, &valid,
                        descales);
}

std::vector<std::string> cli_args(const std::string &kv_dtype, const std::string &scale, bool paged,
                                  const char *sm) {
  std::vector<std::string> a =
      emulator_decode_args({"--emulator-sm", sm, "--causal", "--num-splits", "2", "--lse-out",
                            path_of("lse.npy"), "--kv-dtype", kv_dtype, "--kv-scale", scale});
  if (paged) a.insert(a.end(), {"--kv-layout", "paged", "--page-size", "16"});
  return a;
}

// Append kSq new tokens (fp16 .npy values) into the e4m3 cache with NeoX
// RoPE over 32 of 64 dims, per-(batch, kv head) descales of the old rows.
void test_decode_fp8_append(void **) {
  skip_without_cli();
  constexpr int kRd = 32;
  QkvInputs in = write_qkv(33, kB, kSq, kSk, kHq, kHkv, kD, &kLensAppend);
  std::vector<double> kds, vds;
  std::vector<double> k = quantized("k.npy", false, true, kLensAppend, &kds);
  std::vector<double> v = quantized("v.npy", false, true, kLensAppend, &vds);
  std::mt19937 rng(34);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> kn(size_t(kB) * kSq * kHkv * kD), vn(kn.size());
  for (float &x : kn) x = fa::ref::round_to(1.5f * nd(rng), false);  // some past amax: clamped
  for (float &x : vn) x = fa::ref::round_to(nd(rng), false);
  write_npy("k_new.npy", fa::npy::from_f32({kB, kSq, kHkv, kD}, kn.data()));
  write_npy("v_new.npy", fa::npy::from_f32({kB, kSq, kHkv, kD}, vn.data()));
  std::vector<float> cs(size_t(kSk) * kRd / 2), sn(cs.size());
  for (int p = 0; p < kSk; ++p)
    for (int i = 0; i < kRd / 2; ++i) {
      const double th = p * std::pow(10000.0, -2.0 * i / kRd);
      cs[size_t(p) * kRd / 2 + i] = float(std::cos(th));
      sn[size_t(p) * kRd / 2 + i] = float(std::sin(th));
    }
  write_npy("cos.npy", fa::npy::from_f32({kSk, kRd / 2}, cs.data()));
  write_npy("sin.npy", fa::npy::from_f32({kSk, kRd / 2}, sn.data()));
  std::vector<int32_t> lens = kLensAppend;
  std::vector<float> row(kD);
  for (int b = 0; b < kB; ++b) {
    for (int t = 0; t < kSq; ++t) {
      const int pos = lens[b] + t;
      for (int h = 0; h < kHq; ++h) {
        double *qr = &in.q[((size_t(b) * kSq + t) * kHq + h) * kD];
        std::copy(qr, qr + kD, row.begin());
        fa::ref::rope_row(row.data(), kRd, false, &cs[size_t(pos) * kRd / 2],
                          &sn[size_t(pos) * kRd / 2], false);
        std::copy(row.begin(), row.end(), qr);
      }
      for (int h = 0; h < kHkv; ++h) {
        const size_t dst = ((size_t(b) * kSk + pos) * kHkv + h) * kD;
        const size_t src = ((size_t(b) * kSq + t) * kHkv + h) * kD;
        for (int kv = 0; kv < 2; ++kv) {
          std::copy_n(&(kv ? vn : kn)[src], kD, row.begin());
          if (!kv)
            fa::ref::rope_row(row.data(), kRd, false, &cs[size_t(pos) * kRd / 2],
                              &sn[size_t(pos) * kRd / 2], false);
          const float ds = float((kv ? vds : kds)[size_t(b) * kHkv + h]);
          for (int e = 0; e < kD; ++e)
            (kv ? v : k)[dst + e] =
                fa::ref::fp8_to_double(fa::ref::fp8_from_double(row[e] / ds, false), false) * ds;
        }
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
  std::vector<double> o_ref(size_t(kB) * kSq * kHq * kD), lse_ref(size_t(kB) * kHq * kSq);
  fa::ref::attention(p, in.q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data(), lens.data());
  std::remove(path_of("o.npy").c_str());
  std::vector<std::string> args = cli_args("e4m3", "head", true, "89");
  args.insert(args.end(), {"--k-new", path_of("k_new.npy"), "--v-new", path_of("v_new.npy"),
                           "--rotary-cos", path_of("cos.npy"), "--rotary-sin", path_of("sin.npy")});
  const Result r = run_cli(args);
  expect(r.exited && r.code == 0, args, r, "exit status is not 0");
  expect(contains(r.out, "\nPASS"), args, r, "no PASS line");
  expect(contains(r.out, "kv append:"), args, r, "no kv append line");
  const std::vector<float> o = read_npy("o.npy").to_f32();
  const fa::ref::ErrorStats e = fa::ref::compare(o.data(), o_ref.data(), o.size());
  std::printf("  e4m3 append + NeoX: O max_abs %.3g (max|ref| %.3g)\n", e.max_abs, e.max_ref);
  if (e.nonfinite || e.max_abs > 4e-3 * std::max(1.0, e.max_ref) || e.rel_l2 >= 1e-2)
    expect(false, args, r, "O outside tolerance of the fp8 reference");
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
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_fp8_append),
      cmocka_unit_test(test_fp8_refused),
  };
  return run_cli_suite("test_cli_fp8_kv", tests);
}

// `flashattn run --q-dtype e4m3|e5m2 [--kv-dtype ...] [--kv-scale
// head|tensor]` (the fp8 forward, C API 0.6; FA_CLI_PATH), run as a child
// process on the sm_89 and sm_90 emulators: the program quantises the Q, K and V .npy
// values to fp8 bytes with descales amax / 448 (e4m3) or amax / 57344 (e5m2)
// per (batch, KV head) (Q's group: the KV head's queries) or per tensor; each
// run is checked against an fp64 reference over the values those bytes hold,
// quantised here by the same rule, with the project's rule: within twice the
// error of the same attention with P rounded as the kernel rounds it
// (lowp_attention's p_e4m3: max abs, and relative L2 or 1e-2). `generate
// --kind forward --q-dtype` writes its kernel. Bad combinations are usage
// errors; sm_80 is refused (UNSUPPORTED).

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "flashattn.h"
#include "npy.h"
#include "reference.h"
#include "support/numerics.h"

// Last: it includes cmocka.
#include "support/cli_harness.h"

namespace {

using namespace fa::test::cli;

constexpr int kB = 2, kSq = 24, kSk = 200, kHq = 4, kHkv = 2, kD = 64;

// The fp8 values of a [kB, s, h, kD] .npy read back, as the program
// quantises it (group: heads per descale).
std::vector<double> quantized(const char *file, int s, int h, int group, bool e5m2, bool per_head) {
  return cli_fp8_values(read_npy(file).to_f32(), kB, s, h, kD, group, e5m2, per_head, nullptr);
}

std::vector<std::string> run_args(const char *sm, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--emulator-sm", sm});
  return emulator_run_args(extra);
}

void test_run_fp8(void **) {
  skip_without_cli();
  write_qkv(41, kB, kSq, kSk, kHq, kHkv, kD, nullptr);
  const struct {
    const char *q, *kv, *scale, *dtype, *page_size, *sm;
    bool causal;
  } kCases[] = {{"e4m3", "e4m3", "head", "fp16", "16", "89", true},
                // (one format per tensor, contiguous: fp8_forward.cases
                // through test_cli_features)
                {"e4m3", "e5m2", "head", "bf16", nullptr, "89", true},
                // sm_90's fp8 wgmma: its producer transposes V from pages
                // looked up per row (16) and per tile (128)
                {"e4m3", "e5m2", "head", "bf16", "16", "90", true},
                {"e5m2", "e4m3", "head", "fp16", "128", "90", false}};
  for (const auto &c : kCases) {
    const bool qe5 = std::string(c.q) == "e5m2", kve5 = std::string(c.kv) == "e5m2";
    const bool per_head = std::string(c.scale) == "head";
    const std::vector<double> q = quantized("q.npy", kSq, kHq, kHq / kHkv, qe5, per_head);
    const std::vector<double> k = quantized("k.npy", kSk, kHkv, 1, kve5, per_head);
    const std::vector<double> v = quantized("v.npy", kSk, kHkv, 1, kve5, per_head);
    fa::ref::Problem p;
    p.batch = kB;
    p.seqlen_q = kSq;
    p.seqlen_k = kSk;
    p.num_heads_q = kHq;
    p.num_heads_kv = kHkv;
    p.head_dim = p.head_dim_v = kD;
    p.causal = c.causal;
    std::vector<double> o_ref(size_t(kB) * kSq * kHq * kD), lse_ref(size_t(kB) * kHq * kSq);
    fa::ref::attention(p, q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data(), nullptr);
    std::remove(path_of("o.npy").c_str());
    std::vector<std::string> extra = {"--q-dtype",  c.q,     "--kv-dtype", c.kv,
                                      "--kv-scale", c.scale, "--dtype",    c.dtype};
    if (c.page_size)
      extra.insert(extra.end(), {"--kv-layout", "paged", "--page-size", c.page_size});
    if (c.causal) extra.push_back("--causal");
    const std::vector<std::string> args = run_args(c.sm, extra);
    const Result r = run_cli(args);
    expect(r.exited && r.code == 0, args, r, "exit status is not 0");
    expect(contains(r.out, "\nPASS"), args, r, "no PASS line");
    expect(contains(r.out, std::string("fp8:         Q ") + c.q), args, r, "no fp8 line");
    const std::vector<float> o = read_npy("o.npy").to_f32();
    const fa::ref::ErrorStats e = fa::ref::compare(o.data(), o_ref.data(), o.size());
    // The yardstick: P rounded as the kernel rounds it, O to the dtype.
    const std::vector<double> yard =
        fa::test::lowp_attention(p, q, k, v, std::string(c.dtype) == "bf16", nullptr, true);
    const std::vector<float> yard_f(yard.begin(), yard.end());
    const fa::ref::ErrorStats base = fa::ref::compare(yard_f.data(), o_ref.data(), o.size());
    const double tol = 2 * base.max_abs + 1e-5, rel_max = std::max(1e-2, 2 * base.rel_l2);
    std::printf("  sm_%s Q %s K/V %s %s %s%s: O max_abs %.3g (tol %.3g), rel_l2 %.3g (max %.3g)\n",
                c.sm, c.q, c.kv, c.scale, c.page_size ? "paged " : "contiguous",
                c.page_size ? c.page_size : "", e.max_abs, tol, e.rel_l2, rel_max);
    if (e.nonfinite || e.max_abs > tol || e.rel_l2 >= rel_max)
      expect(false, args, r, "O outside twice the error of P rounded to e4m3");
  }
}

void test_generate_fp8(void **) {
  skip_without_cli();
  const std::vector<std::string> args = {"generate",
                                         "--kind",
                                         "forward",
                                         "--dtype",
                                         "bf16",
                                         "--head-dim",
                                         "128",
                                         "--heads-q",
                                         "8",
                                         "--heads-kv",
                                         "2",
                                         "--sm",
                                         "89",
                                         "--q-dtype",
                                         "e4m3",
                                         "--kv-dtype",
                                         "e5m2",
                                         "-o",
                                         path_of("fwd8.ptx")};
  const Result r = run_cli(args);
  expect(r.exited && r.code == 0, args, r, "exit status is not 0");
  const std::string ptx = read_text(path_of("fwd8.ptx"));
  expect(contains(ptx, ".target sm_89"), args, r, "no .target sm_89 in the PTX");
  expect(contains(ptx, "m16n8k32"), args, r, "no fp8 mma (m16n8k32) in the PTX");
}

void test_fp8_forward_refused(void **) {
  skip_without_cli();
  write_qkv(42, kB, kSq, kSk, kHq, kHkv, kD, nullptr);
  struct stat st;
  std::remove(path_of("o.npy").c_str());
  const struct {
    std::vector<std::string> extra;
    const char *err;
  } kUsage[] = {{{"--q-dtype", "e3m4"}, "--q-dtype"}, {{"--kv-dtype", "e4m3"}, "needs --q-dtype"}};
  for (const auto &c : kUsage) {
    const std::vector<std::string> args = run_args("89", c.extra);
    const Result r = run_cli(args);
    expect(r.exited && r.code == 2 && contains(r.err, c.err), args, r, "not a usage error");
    expect(stat(path_of("o.npy").c_str(), &st) != 0, args, r, "--out written on a usage error");
  }
  std::vector<std::string> args = run_args("80", {"--q-dtype", "e4m3"});
  Result r = run_cli(args);
  expect(r.exited && r.code != 0 && contains(r.err, "sm_89"), args, r, "sm_80 refused");
  expect(stat(path_of("o.npy").c_str(), &st) != 0, args, r, "--out written on a refusal");
  args = {"generate", "--kind",     "decode", "--dtype", "fp16", "--head-dim", "64",  "--heads-q",
          "2",        "--heads-kv", "2",      "--sm",    "89",   "--q-dtype",  "e4m3"};
  r = run_cli(args);
  expect(r.exited && r.code == 2 && contains(r.err, "--kind forward"), args, r,
         "generate --kind decode --q-dtype");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_run_fp8),
      cmocka_unit_test(test_generate_fp8),
      cmocka_unit_test(test_fp8_forward_refused),
  };
  return run_cli_suite("test_cli_fp8_forward", tests);
}

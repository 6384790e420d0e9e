// ALiBi (fa_forward_args.alibi_slopes, fa_decode_args.alibi_slopes) on the
// emulator, against the fp64 reference (tools/common/reference.cc with
// alibi) through the shared runners (fresh random inputs and slopes,
// poisoned O, LSE and workspace):
// - every forward kernel, each checked by the emulator profile's kernel
//   name to have run with "_alibi": the mma.sync forward, the scalar
//   fallback (FLASHATTN_SCALAR_FORWARD=1), and on an emulated sm_90 the
//   wgmma forward's TMA and gather variants; causal and not, sliding
//   windows, softcap, GQA (one slope per query head), d != dv, sq > sk (rows
//   with no key), varlen with empty sequences, per-sequence slopes
//   (alibi_slopes_stride), a slope of 0 and a steep one, with sinks;
// - decode on both decode kernels (the partial states, checked against the
//   reference merged on the host, and the combine's O and LSE): forced,
//   automatic and batch-invariant splits, GQA rows packed in one tile,
//   windows, softcap, paged and pointer-array caches, tree masks, chunked
//   prefill over a paged cache;
// - the standard slopes (tools/common, standard_alibi_slopes) for powers of
//   two and other head counts;
// - slopes of 0 give the output bits of no ALiBi; 0.4.1-sized args ignore
//   the fields; the host checks (alignment, stride); a kernel without ALiBi
//   is fa_generate's PTX and one with it another module.
#include "support/cmocka.hh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "reference.h"
#include "support/policy.h"
#include "support/feature_kernels.h"
#include "support/numerics.h"
#include "support/small_problem.h"

namespace {

using fa::test::DecodeCase;
using fa::test::ForwardCase;
using fa::test::KvCase;

fa_runtime *g_rt = nullptr, *g_rt90 = nullptr;
std::string g_why;

int setup(void **) {
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  g_rt = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why);
  g_rt90 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 90);
  return 0;
}
int teardown(void **) {
  fa_runtime_destroy(g_rt);
  fa_runtime_destroy(g_rt90);
  unsetenv("FLASHATTN_EMU_PROFILE");
  return 0;
}

void need_runtime() {
  if (!g_rt || !g_rt90) {
    std::printf("SKIP: emulator unavailable: %s\n", g_why.c_str());
    skip();
  }
}

// Random slopes for `rows` x `heads` (rows 1: one [heads] row): most in
// [0.01, 0.3] (the range of the standard slopes), the first 0 (no bias) and
// the third (when present) 2.0 (a steep bias: a row sees little beyond its
// diagonal's neighbours).
std::vector<float> random_slopes(int heads, uint32_t seed, int rows = 1, int stride = 0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(0.01f, 0.3f);
  const int w = stride ? stride : heads;
  std::vector<float> s(static_cast<size_t>(rows) * w, NAN);  // padding: never read
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h) s[size_t(r) * w + h] = u(gen);
  s[0] = 0.0f;
  if (heads > 2) s[2] = 2.0f;
  return s;
}

// The kernel the runtime's last launch ran contains `want` and "_alibi".
void expect_kernel(fa_runtime *rt, const char *want, const std::string &what,
                   std::string *failures) {
  fa::test::expect_feature_kernel(rt, want, "_alibi", what, failures);
}

void report(const std::string &failures) { fa::test::report_failures(failures); }

// The forward cases every forward kernel runs.
std::vector<ForwardCase> forward_cases() {
  std::vector<ForwardCase> cases;
  auto add = [&](int b, int sq, int sk, int hq, int hkv, int d, int dv, bool bf16, bool causal,
                 int wl, int wr, float cap) {
    ForwardCase c;
    c.batch = b, c.seqlen_q = sq, c.seqlen_k = sk, c.heads_q = hq, c.heads_kv = hkv;
    c.head_dim = d, c.head_dim_v = dv, c.bf16 = bf16, c.causal = causal;
    c.window_left = wl, c.window_right = wr, c.softcap = cap;
    c.seed = static_cast<uint32_t>(500 + cases.size());
    c.alibi = random_slopes(hq, c.seed + 77);
    cases.push_back(c);
    return &cases.back();
  };
  add(2, 70, 133, 4, 2, 64, 64, false, true, -1, -1, 0);    // GQA, causal
  add(1, 60, 150, 4, 1, 128, 128, true, false, -1, -1, 0);  // not causal: keys on both sides
  add(1, 40, 97, 3, 3, 96, 64, false, false, 10, 20, 30);   // two-sided window, softcap, d != dv
  add(1, 90, 20, 4, 4, 64, 64, true, true, -1, -1, 0);      // sq > sk: rows with no key
  ForwardCase *s = add(2, 33, 70, 4, 2, 64, 64, false, true, 24, 0, 0);  // window, per-seq slopes
  s->alibi_stride = 6;
  s->alibi = random_slopes(4, 588, 2, 6);
  s->sinks = {1.0f, -INFINITY, 3.0f, 0.5f};  // the sink is not biased
  ForwardCase v;                             // varlen with an empty query and an empty key sequence
  v.batch = 3, v.varlen = true, v.seqlens_q = {33, 0, 17}, v.seqlens_k = {80, 9, 0};
  v.seqlen_q = 33, v.seqlen_k = 80, v.heads_q = 4, v.heads_kv = 2, v.head_dim = 64;
  v.causal = false, v.seed = 590, v.alibi_stride = 4, v.alibi = random_slopes(4, 591, 3, 4);
  cases.push_back(v);
  return cases;
}

void run_forward_cases(bool scalar) {
  std::string failures;
  fa::test::run_forward_feature(
      g_rt, forward_cases(),
      scalar ? fa::test::ForwardKernel::Scalar : fa::test::ForwardKernel::Mma, "_alibi", &failures);
  report(failures);
}

void test_forward_mma(void **) {
  need_runtime();
  run_forward_cases(false);
}

void test_forward_scalar(void **) {
  need_runtime();
  const fa::test::PolicyScope policy(g_rt, &fa::KernelPolicy::scalar_forward);
  run_forward_cases(true);
}

void test_forward_wgmma(void **) {
  need_runtime();
  const fa::test::PolicyScope policy(g_rt90, &fa::KernelPolicy::sm90_wgmma);
  std::string failures;
  fa::test::run_forward_feature(g_rt90, forward_cases(), fa::test::ForwardKernel::Wgmma, "_alibi",
                                &failures);
  // The gather variant on a paged cache (chunked prefill).
  DecodeCase p;
  p.prefill = true, p.batch = 2, p.seqlen_q = 40, p.seqlen_k_max = 200;
  p.cache_seqlens = {200, 47}, p.heads_q = 4, p.heads_kv = 2, p.head_dim = 64, p.causal = true;
  p.window_left = 60, p.kv.layout = FA_KV_PAGED, p.kv.page_size = 16, p.seed = 595;
  p.alibi = random_slopes(4, 596);
  const std::string e = fa::test::run_decode(g_rt90, p);
  if (!e.empty()) failures += p.describe() + ":\n" + e;
  expect_kernel(g_rt90, "fa_forward_wgmma_gather_", p.describe(), &failures);
  report(failures);
}

// A random tree over seqlen_q new tokens for each of `batch` sequences: token
// i sees itself and each earlier token with probability 1/2.
std::vector<uint8_t> random_tree(int batch, int sq, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> t(size_t(batch) * sq * sq, 0);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < sq; ++i)
      for (int j = 0; j <= i; ++j) t[(size_t(b) * sq + i) * sq + j] = j == i || (gen() & 1);
  return t;
}

// The decode cases both decode kernels run. partials_only cases check the
// workspace's partial states (the bias is in every split's scores) and let
// the test name the decode kernel that ran; the others the combine's output.
std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> cases;
  DecodeCase c;
  c.batch = 3, c.seqlen_q = 1, c.seqlen_k_max = 300, c.cache_seqlens = {300, 9, 0};
  c.heads_q = 8, c.heads_kv = 2, c.head_dim = 64, c.num_splits = 3, c.causal = true;
  c.seed = 600, c.alibi = random_slopes(8, 601), c.partials_only = true;
  cases.push_back(c);  // forced splits, GQA rows, an empty sequence
  c.num_splits = 0, c.seqlen_q = 4, c.window_left = 50, c.bf16 = true, c.seed = 602;
  c.cache_seqlens = {300, 120, 2}, c.alibi_stride = 9, c.alibi = random_slopes(8, 603, 3, 9);
  cases.push_back(c);  // automatic splits, window, per-sequence slopes, sq > cache for one
  c.kv.layout = FA_KV_PAGED, c.kv.page_size = 16, c.window_left = -1, c.softcap = 20;
  c.seed = 604, c.causal = false;
  cases.push_back(c);  // paged, softcap, not causal
  c.kv = KvCase(), c.kv.layout = FA_KV_PTR_ARRAY, c.softcap = 0, c.num_splits = 2, c.seed = 605;
  c.head_dim_v = 32, c.causal = true;
  c.tree = random_tree(3, 4, 606);
  cases.push_back(c);  // pointer arrays, d != dv, tree mask
  c.kv = KvCase(), c.head_dim_v = 0, c.num_splits = 0, c.batch_invariant = true, c.seed = 607;
  c.seqlen_k_max = 2100, c.cache_seqlens = {2100, 2049, 5}, c.tree.clear();
  c.partials_only = false;
  cases.push_back(c);  // batch-invariant splits of 2048 keys, through the combine
  c.batch_invariant = false, c.num_splits = 3, c.seed = 608, c.seqlen_k_max = 300;
  c.cache_seqlens = {300, 77, 1}, c.tree = random_tree(3, 4, 609),
  c.sinks = {1, 2, 0, -1, 3, 0, 1, 2};
  cases.push_back(c);  // tree mask, sinks, through the combine
  return cases;
}

void run_decode_cases(bool scalar) {
  std::string failures;
  for (const DecodeCase &c : decode_cases()) {
    const std::string e = fa::test::run_decode(g_rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
    if (c.partials_only) {
      fa_emu_profile prof = FA_EMU_PROFILE_INIT;
      const bool mma = fa_emulator_profile(g_rt, &prof) == FA_SUCCESS &&
                       std::strstr(prof.kernel, "fa_decode_mma_") != nullptr;
      if (std::strstr(prof.kernel, "fa_decode_") == nullptr || mma == scalar ||
          std::strstr(prof.kernel, "_alibi") == nullptr)
        failures += c.describe() + ": ran " + prof.kernel + "\n";
    }
  }
  report(failures);
}

void test_decode_tc(void **) {
  need_runtime();
  run_decode_cases(false);
}

void test_decode_scalar(void **) {
  need_runtime();
  const fa::test::PolicyScope policy(g_rt, &fa::KernelPolicy::scalar_decode);
  run_decode_cases(true);
}

void test_prefill(void **) {
  need_runtime();
  std::string failures;
  DecodeCase p;
  p.prefill = true, p.batch = 2, p.seqlen_q = 24, p.seqlen_k_max = 160;
  p.cache_seqlens = {160, 30}, p.heads_q = 6, p.heads_kv = 3, p.head_dim = 64, p.causal = true;
  p.kv.layout = FA_KV_PAGED, p.kv.page_size = 64, p.seed = 610;
  p.alibi_stride = 7, p.alibi = random_slopes(6, 611, 2, 7);
  const std::string e = fa::test::run_decode(g_rt, p);
  if (!e.empty()) failures += p.describe() + ":\n" + e;
  expect_kernel(g_rt, "fa_forward_mma_", p.describe(), &failures);
  report(failures);
}

// The standard slopes: 2^(-8 (h + 1) / n) for n a power of two; otherwise
// those of the largest power of two p below n, then the odd ones of 2p.
void test_standard_slopes(void **) {
  const std::vector<float> s8 = fa::ref::standard_alibi_slopes(8);
  assert_int_equal(s8.size(), 8);
  for (int h = 0; h < 8; ++h) assert_true(s8[h] == std::exp2f(-float(h + 1)));
  const std::vector<float> s1 = fa::ref::standard_alibi_slopes(1);
  assert_int_equal(s1.size(), 1);
  assert_true(s1[0] == 1.0f / 256);
  // n = 12 (BLOOM's rule): the 8 slopes of 8 heads, then 2^-0.5, 2^-1.5,
  // 2^-2.5, 2^-3.5 (the odd slopes of 16 heads).
  const std::vector<float> s12 = fa::ref::standard_alibi_slopes(12);
  assert_int_equal(s12.size(), 12);
  for (int h = 0; h < 8; ++h) assert_true(s12[h] == s8[h]);
  for (int k = 0; k < 4; ++k)
    assert_true(std::fabs(s12[8 + k] - std::exp2f(-0.5f - float(k))) <= 1e-7f);
  const std::vector<float> s6 = fa::ref::standard_alibi_slopes(6);
  const float want6[6] = {0.25f, 0.0625f, 1.0f / 64, 1.0f / 256, 0.5f, 0.125f};
  for (int h = 0; h < 6; ++h) assert_true(std::fabs(s6[h] - want6[h]) <= 1e-9f);
  assert_true(fa::ref::standard_alibi_slopes(0).empty());
}

// ---- exact properties and host checks on one small problem ----

using Small = fa::test::SmallProblem;

// Slopes of 0 change no bit of O or LSE (x + 0 |d| = x); a 0.4.1-sized
// struct ignores whatever follows it; nonzero slopes change O. Forward
// (mma.sync and scalar) and decode.
void test_zero_slopes_are_none(void **) {
  need_runtime();
  for (int path = 0; path < 4; ++path) {
    const bool decode = path >= 2;
    const fa::test::PolicyScope policy(g_rt, decode ? &fa::KernelPolicy::scalar_decode : &fa::KernelPolicy::scalar_forward,
                                   path % 2 != 0);
    Small s(g_rt);
    s.set_heads(0.0f, 0.0f);
    fa_forward_args a = s.fwd();
    fa_decode_args d = s.dec();
    auto run = [&]() {
      s.poison_and_read(true);
      if (decode)
        assert_int_equal(fa_decode(g_rt, s.cfg, &d, nullptr), FA_SUCCESS);
      else
        assert_int_equal(fa_launch(g_rt, s.cfg, &a, nullptr), FA_SUCCESS);
      return s.poison_and_read(false);
    };
    const std::vector<uint8_t> plain = run();
    a.alibi_slopes = d.alibi_slopes = s.heads;
    const std::vector<uint8_t> with = run();
    assert_memory_equal(plain.data(), with.data(), plain.size());
    s.set_heads(0.25f, 0.5f);
    a.struct_size = FA_FORWARD_ARGS_SIZE_0_4_1;
    d.struct_size = FA_DECODE_ARGS_SIZE_0_4_1;
    const std::vector<uint8_t> old = run();
    assert_memory_equal(plain.data(), old.data(), plain.size());
    a.struct_size = sizeof a;
    d.struct_size = sizeof d;
    const std::vector<uint8_t> biased = run();
    assert_true(std::memcmp(plain.data(), biased.data(), s.o_bytes) != 0);
  }
}

void expect_bad(fa_status st, const char *needle) {
  assert_int_equal(st, FA_ERROR_INVALID_ARGUMENT);
  if (std::strstr(fa_last_error(), needle) == nullptr) {
    print_error("message \"%s\" lacks \"%s\"\n", fa_last_error(), needle);
    fail();
  }
}

void test_bad_args(void **) {
  need_runtime();
  Small s(g_rt);
  s.set_heads(0.5f, 0.25f);
  s.poison_and_read(true);
  fa_forward_args f = s.fwd();
  f.alibi_slopes = s.heads + 2;
  expect_bad(fa_launch(g_rt, s.cfg, &f, nullptr), "fa_launch: alibi_slopes 0x");
  assert_non_null(std::strstr(fa_last_error(), "not 4-byte aligned"));
  f.alibi_slopes = s.heads;
  f.alibi_slopes_stride = -2;
  expect_bad(fa_launch(g_rt, s.cfg, &f, nullptr), "alibi_slopes_stride must be >= 0");
  f.alibi_slopes_stride = 1;  // < num_heads_q = 2
  expect_bad(fa_launch(g_rt, s.cfg, &f, nullptr), "at least num_heads_q = 2");
  f.alibi_slopes = 0;
  f.alibi_slopes_stride = 2;
  expect_bad(fa_launch(g_rt, s.cfg, &f, nullptr), "alibi_slopes is 0");
  fa_decode_args d = s.dec();
  d.alibi_slopes = s.heads + 1;
  expect_bad(fa_decode(g_rt, s.cfg, &d, nullptr), "fa_decode: alibi_slopes 0x");
  d.alibi_slopes = s.heads;
  d.alibi_slopes_stride = 1;
  expect_bad(fa_decode(g_rt, s.cfg, &d, nullptr), "at least num_heads_q = 2");
  d.alibi_slopes = 0;
  d.alibi_slopes_stride = 4;
  expect_bad(fa_decode(g_rt, s.cfg, &d, nullptr), "alibi_slopes is 0");
  // Nothing was written by any rejected call.
  const std::vector<uint8_t> after = s.poison_and_read(false);
  for (uint8_t x : after) assert_int_equal(x, 0xFF);
  // A stride of exactly num_heads_q is one row per sequence.
  f = s.fwd();
  f.alibi_slopes = s.heads, f.alibi_slopes_stride = Small::H;
  assert_int_equal(fa_launch(g_rt, s.cfg, &f, nullptr), FA_SUCCESS);
  fa_generate_options g = FA_GENERATE_OPTIONS_INIT;
  g.alibi = 1;
  size_t n = 0;
  expect_bad(fa_generate_for(s.cfg, FA_KERNEL_REDUCE, 80, &g, nullptr, 0, &n), "opts->alibi");
  g.alibi = 2;
  expect_bad(fa_generate_for(s.cfg, FA_KERNEL_FORWARD, 80, &g, nullptr, 0, &n), "opts->alibi");
}

std::string generate(const fa_config *cfg, fa_kernel_kind kind, int sm,
                     const fa_generate_options *o) {
  size_t n = 0;
  assert_int_equal(fa_generate_for(cfg, kind, sm, o, nullptr, 0, &n), FA_SUCCESS);
  std::string s(n + 1, '\0');
  assert_int_equal(fa_generate_for(cfg, kind, sm, o, &s[0], s.size(), &n), FA_SUCCESS);
  s.resize(n);
  return s;
}

// Off, the module is fa_generate's (0.4.1-sized options give it too); on,
// another one whose entry is named _alibi. (The byte identity with the
// generators before ALiBi existed is checked over every spec of the grid by
// tests/stress/ptx_identity.cc.)
void test_alibi_ptx(void **) {
  setenv("FLASHATTN_SM90_WGMMA", "1", 1);
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.head_dim = 128;
  d.num_heads_q = 8;
  d.num_heads_kv = 2;
  d.causal = 1;
  fa_config *cfg = nullptr;
  assert_int_equal(fa_config_create(&d, &cfg), FA_SUCCESS);
  for (int scalar = 0; scalar < 2; ++scalar) {
    if (scalar) {
      setenv("FLASHATTN_SCALAR_FORWARD", "1", 1);
      setenv("FLASHATTN_SCALAR_DECODE", "1", 1);
    }
    for (int sm : {80, 90}) {
      for (fa_kernel_kind kind : {FA_KERNEL_FORWARD, FA_KERNEL_DECODE}) {
        fa_generate_options off = FA_GENERATE_OPTIONS_INIT, on = FA_GENERATE_OPTIONS_INIT;
        on.alibi = 1;
        fa_generate_options old = off;
        old.struct_size = FA_GENERATE_OPTIONS_SIZE_0_4_1;
        const std::string plain = generate(cfg, kind, sm, nullptr);
        assert_true(generate(cfg, kind, sm, &off) == plain);
        assert_true(generate(cfg, kind, sm, &old) == plain);
        const std::string with = generate(cfg, kind, sm, &on);
        assert_true(with != plain);
        assert_non_null(std::strstr(with.c_str(), "_alibi_param"));
        assert_null(std::strstr(plain.c_str(), "alibi"));
      }
    }
    unsetenv("FLASHATTN_SCALAR_FORWARD");
    unsetenv("FLASHATTN_SCALAR_DECODE");
  }
  fa_config_destroy(cfg);
  unsetenv("FLASHATTN_SM90_WGMMA");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_mma),     cmocka_unit_test(test_forward_scalar),
      cmocka_unit_test(test_forward_wgmma),   cmocka_unit_test(test_decode_tc),
      cmocka_unit_test(test_decode_scalar),   cmocka_unit_test(test_prefill),
      cmocka_unit_test(test_standard_slopes), cmocka_unit_test(test_zero_slopes_are_none),
      cmocka_unit_test(test_bad_args),        cmocka_unit_test(test_alibi_ptx),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

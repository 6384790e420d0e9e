// Attention sinks (gpt-oss; fa_forward_args.sinks, fa_decode_args.sinks,
// fa_reduce_args.sinks) on the emulator, against the fp64 reference
// (tools/common/reference.cc with sinks) through the shared runners
// (fresh random inputs and sinks, poisoned O, LSE and workspace):
// - every forward kernel, each checked by the emulator profile's kernel
//   name to have run: the mma.sync forward, the scalar fallback
//   (FLASHATTN_SCALAR_FORWARD=1), and on an emulated sm_90 the wgmma
//   forward's TMA and gather variants; causal, sliding windows (gpt-oss's
//   banded layers), softcap, GQA, d != dv, varlen with empty sequences,
//   rows that see no key (O = 0, LSE = sink), a sink of -inf and one that
//   dominates every score;
// - decode on both decode kernels with forced, automatic and
//   batch-invariant splits, windows, paged and pointer-array caches, the
//   partial states alone (they never hold the sinks; merged with them on
//   the host), and chunked prefill over a paged cache; fa_decode_reduce with
//   sinks over random partial states, and with base-2 partial states and
//   outputs (the same merge as natural logs);
// - non-finite sinks, as flashattn.h's formula defines them, next to finite
//   ones in the same launch (the heads cycle finite, +inf, NaN, -inf): +inf
//   gives O = 0, LSE = +inf and NaN gives O = NaN, LSE = NaN on every row of
//   the head, rows with no key included, in every forward kernel (sm_80 and
//   emulated sm_90), in decode (the combine) with splits and in
//   fa_decode_reduce, which also merges +inf and NaN partial states (+inf
//   states share the weight, NaN gives NaN) in both LSE formats; a finite
//   poison then tells a written NaN from an unwritten one;
// - sinks of -inf give the output bits of no sinks (forward);
// - the host checks (misaligned pointers, sinks without a combine), 0.4-sized
//   args that ignore the field; a kernel without sinks is fa_generate's PTX
//   and one with them another module.
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

// Random sinks for `heads` query heads: most in [-2, 6] (the range of the
// LSE of these shapes, so the sink takes a real share), head 1 -inf (no
// sink), head 2 (when present) 40 (the sink outweighs every score: O near 0,
// LSE near 40, which no exponential may overflow on).
std::vector<float> random_sinks(int heads, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-2.0f, 6.0f);
  std::vector<float> s(static_cast<size_t>(heads));
  for (float &x : s) x = u(gen);
  if (heads > 1) s[1] = -INFINITY;
  if (heads > 2) s[2] = 40.0f;
  return s;
}

// Sinks for `heads` heads that cycle finite (random, as random_sinks), +inf,
// NaN, -inf (head 3 only; later heads of that slot finite): every kind of
// sink in one launch.
std::vector<float> nonfinite_sinks(int heads, uint32_t seed) {
  std::vector<float> s = random_sinks(heads, seed);
  for (int h = 0; h < heads; ++h) {
    if (h % 4 == 1) s[size_t(h)] = INFINITY;
    if (h % 4 == 2) s[size_t(h)] = NAN;
    if (h == 3) s[size_t(h)] = -INFINITY;
  }
  return s;
}

// The sinks of a case: random_sinks, or nonfinite_sinks.
std::vector<float> case_sinks(bool nonfinite, int heads, uint32_t seed) {
  return nonfinite ? nonfinite_sinks(heads, seed) : random_sinks(heads, seed);
}

// The kernel the runtime's last launch ran contains `want` and "_sinks".
void expect_kernel(fa_runtime *rt, const char *want, const std::string &what,
                   std::string *failures) {
  fa::test::expect_feature_kernel(rt, want, "_sinks", what, failures);
}

void report(const std::string &failures) { fa::test::report_failures(failures); }

// The forward cases every forward kernel runs (with nonfinite_sinks when
// nonfinite).
std::vector<ForwardCase> forward_cases(bool nonfinite) {
  std::vector<ForwardCase> cases;
  auto add = [&](int b, int sq, int sk, int hq, int hkv, int d, int dv, bool bf16, bool causal,
                 int wl, int wr, float cap) {
    ForwardCase c;
    c.batch = b, c.seqlen_q = sq, c.seqlen_k = sk, c.heads_q = hq, c.heads_kv = hkv;
    c.head_dim = d, c.head_dim_v = dv, c.bf16 = bf16, c.causal = causal;
    c.window_left = wl, c.window_right = wr, c.softcap = cap;
    c.seed = static_cast<uint32_t>(300 + cases.size());
    c.sinks = case_sinks(nonfinite, hq, c.seed + 77);
    cases.push_back(c);
  };
  add(2, 70, 133, 4, 2, 64, 64, false, true, -1, -1, 0);   // GQA, causal (gpt-oss full layer)
  add(1, 150, 150, 4, 1, 128, 128, true, true, 31, 0, 0);  // banded layer: window 32, causal
  add(1, 40, 97, 3, 3, 96, 64, false, false, 10, 20, 30);  // two-sided window, softcap, d != dv
  add(1, 90, 20, 4, 4, 64, 64, true, true, -1, -1, 0);     // sq > sk: rows with no key
  ForwardCase v;  // varlen with an empty query and an empty key sequence
  v.batch = 3, v.varlen = true, v.seqlens_q = {33, 0, 17}, v.seqlens_k = {80, 9, 0};
  v.seqlen_q = 33, v.seqlen_k = 80, v.heads_q = 4, v.heads_kv = 2, v.head_dim = 64;
  v.causal = true, v.seed = 390, v.sinks = case_sinks(nonfinite, 4, 391);
  cases.push_back(v);
  return cases;
}

// Every forward kernel on forward_cases(nonfinite): the mma.sync one and the
// scalar one on sm_80, the sm_90a TMA and gather variants on an emulated
// sm_90 (plus the gather variant on a paged cache: chunked prefill).
// Returns the failures.
std::string run_forward_kernel(fa::test::ForwardKernel kernel, bool nonfinite) {
  using fa::test::ForwardKernel;
  fa_runtime *rt = kernel == ForwardKernel::Wgmma ? g_rt90 : g_rt;
  // Scalar: the scalar forward; Mma: the defaults; Wgmma: the sm_90a one.
  const fa::test::PolicyScope policy(rt,
                   kernel == ForwardKernel::Scalar ? &fa::KernelPolicy::scalar_forward : &fa::KernelPolicy::sm90_wgmma,
                   kernel != ForwardKernel::Mma || rt == g_rt90);
  std::string failures;
  fa::test::run_forward_feature(rt, forward_cases(nonfinite), kernel, "_sinks", &failures);
  if (kernel == ForwardKernel::Wgmma) {
    DecodeCase p;
    p.prefill = true, p.batch = 2, p.seqlen_q = 40, p.seqlen_k_max = 200;
    p.cache_seqlens = {200, 47}, p.heads_q = 4, p.heads_kv = 2, p.head_dim = 64, p.causal = true;
    p.window_left = 60, p.kv.layout = FA_KV_PAGED, p.kv.page_size = 16, p.seed = 395;
    p.sinks = case_sinks(nonfinite, 4, 396);
    const std::string e = fa::test::run_decode(rt, p);
    if (!e.empty()) failures += p.describe() + ":\n" + e;
    expect_kernel(rt, "fa_forward_wgmma_gather_", p.describe(), &failures);
  }
  return failures;
}

void test_forward_mma(void **) {
  need_runtime();
  report(run_forward_kernel(fa::test::ForwardKernel::Mma, false));
}

void test_forward_scalar(void **) {
  need_runtime();
  report(run_forward_kernel(fa::test::ForwardKernel::Scalar, false));
}

void test_forward_wgmma(void **) {
  need_runtime();
  report(run_forward_kernel(fa::test::ForwardKernel::Wgmma, false));
}

void test_forward_nonfinite(void **) {
  need_runtime();
  std::string failures;
  for (auto k : {fa::test::ForwardKernel::Mma, fa::test::ForwardKernel::Scalar,
                 fa::test::ForwardKernel::Wgmma})
    failures += run_forward_kernel(k, true);
  report(failures);
}

// The decode cases both decode kernels run (sinks join in the combine; with
// nonfinite, nonfinite_sinks).
std::vector<DecodeCase> decode_cases(bool nonfinite) {
  std::vector<DecodeCase> cases;
  DecodeCase c;
  c.batch = 3, c.seqlen_q = 1, c.seqlen_k_max = 300, c.cache_seqlens = {300, 9, 0};
  c.heads_q = 8, c.heads_kv = 2, c.head_dim = 64, c.num_splits = 3, c.causal = true;
  c.seed = 400, c.sinks = case_sinks(nonfinite, 8, 401);
  cases.push_back(c);  // forced splits, an empty sequence (O = 0, LSE = sink)
  c.num_splits = 0, c.seqlen_q = 4, c.window_left = 50, c.bf16 = true, c.seed = 402;
  c.cache_seqlens = {300, 120, 2};
  cases.push_back(c);  // automatic splits, banded window, seqlen_q > cache for one sequence
  c.kv.layout = FA_KV_PAGED, c.kv.page_size = 16, c.window_left = -1, c.softcap = 20;
  c.seed = 403;
  cases.push_back(c);  // paged, softcap
  c.kv = KvCase(), c.kv.layout = FA_KV_PTR_ARRAY, c.softcap = 0, c.num_splits = 2, c.seed = 404;
  c.head_dim_v = 32;
  cases.push_back(c);  // pointer arrays, d != dv
  c.kv = KvCase(), c.head_dim_v = 0, c.num_splits = 0, c.batch_invariant = true, c.seed = 405;
  c.seqlen_k_max = 2100, c.cache_seqlens = {2100, 2049, 5};
  cases.push_back(c);  // batch-invariant splits of 2048 keys
  c.batch_invariant = false, c.num_splits = 4, c.partials_only = true, c.seed = 406;
  cases.push_back(c);  // the partial states alone: merged with the sinks on the host
  return cases;
}

// Returns the failures.
std::string run_decode_cases(const char *kernel, bool nonfinite = false) {
  std::string failures;
  for (const DecodeCase &c : decode_cases(nonfinite)) {
    const std::string e = fa::test::run_decode(g_rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
    if (!c.partials_only) {
      // fa_decode launches the combine last: it carries the sinks.
      fa_emu_profile prof = FA_EMU_PROFILE_INIT;
      if (fa_emulator_profile(g_rt, &prof) != FA_SUCCESS ||
          std::strstr(prof.kernel, "fa_reduce_") == nullptr ||
          std::strstr(prof.kernel, "_sinks") == nullptr)
        failures += c.describe() + ": the combine ran " + prof.kernel + "\n";
    }
  }
  // The decode kernel itself (o.data = 0 profiles it): never the sinks.
  DecodeCase c = decode_cases(nonfinite)[0];
  c.partials_only = true;
  const std::string e = fa::test::run_decode(g_rt, c);
  if (!e.empty()) failures += c.describe() + ":\n" + e;
  fa_emu_profile prof = FA_EMU_PROFILE_INIT;
  if (fa_emulator_profile(g_rt, &prof) != FA_SUCCESS ||
      std::strstr(prof.kernel, kernel) == nullptr || std::strstr(prof.kernel, "_sinks") != nullptr)
    failures += std::string("decode kernel: ran ") + prof.kernel + ", not " + kernel + "\n";
  return failures;
}

void test_decode_tc(void **) {
  need_runtime();
  report(run_decode_cases("fa_decode_mma_"));
}

void test_decode_scalar(void **) {
  need_runtime();
  const fa::test::PolicyScope policy(g_rt, &fa::KernelPolicy::scalar_decode);
  const std::string failures = run_decode_cases("fa_decode_f16_");
  report(failures);
}

void test_decode_nonfinite(void **) {
  need_runtime();
  std::string failures = run_decode_cases("fa_decode_mma_", true);
  {
    const fa::test::PolicyScope policy(g_rt, &fa::KernelPolicy::scalar_decode);
    failures += run_decode_cases("fa_decode_f16_", true);
  }
  report(failures);
}

// fa_decode_reduce with +inf and NaN partial states (rows with one +inf,
// two, a NaN, +inf and NaN, +inf among -inf), without sinks and with
// nonfinite_sinks, in each pair of LSE formats.
void test_reduce_nonfinite(void **) {
  need_runtime();
  std::string failures;
  const std::vector<float> s = nonfinite_sinks(5, 440);
  for (int formats = 0; formats < 4; ++formats)
    for (int with_sinks = 0; with_sinks < 2; ++with_sinks) {
      const std::string e =
          fa::test::run_reduce(g_rt, 4, 2, 3, 5, 40, formats % 2 != 0, 450 + formats,
                               with_sinks ? &s : nullptr, true, formats);
      if (!e.empty()) failures += "reduce, non-finite states:\n" + e;
    }
  report(failures);
}

void test_prefill_and_reduce(void **) {
  need_runtime();
  std::string failures;
  DecodeCase p;
  p.prefill = true, p.batch = 2, p.seqlen_q = 24, p.seqlen_k_max = 160;
  p.cache_seqlens = {160, 30}, p.heads_q = 6, p.heads_kv = 3, p.head_dim = 64, p.causal = true;
  p.kv.layout = FA_KV_PAGED, p.kv.page_size = 64, p.seed = 410, p.sinks = random_sinks(6, 411);
  std::string e = fa::test::run_decode(g_rt, p);
  if (!e.empty()) failures += p.describe() + ":\n" + e;
  expect_kernel(g_rt, "fa_forward_mma_", p.describe(), &failures);
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    const std::vector<float> s = random_sinks(5, 420 + bf16);
    e = fa::test::run_reduce(g_rt, 4, 2, 3, 5, 72, bf16 != 0, 430 + bf16, &s);
    if (!e.empty()) failures += "reduce with sinks:\n" + e;
    expect_kernel(g_rt, "fa_reduce_", "reduce", &failures);
  }
  report(failures);
}

// fa_decode_reduce with base-2 partial states and sinks (natural logs, as
// the API says) gives the natural-log merge's O and LSE: the kernel scales
// the sink by log2 e for base-2 input, and a base-2 output is the natural
// one times log2 e.
void test_reduce_sinks_base2(void **) {
  need_runtime();
  constexpr int S = 3, B = 2, SQ = 2, H = 3, DV = 32, ROWS = B * SQ * H;
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.head_dim = DV;
  d.num_heads_q = d.num_heads_kv = H;
  fa_config *cfg = nullptr;
  assert_int_equal(fa_config_create(&d, &cfg), FA_SUCCESS);
  std::mt19937 gen(55);
  std::uniform_real_distribution<float> uo(-1.0f, 1.0f), ul(-4.0f, 4.0f);
  std::vector<float> op(size_t(S) * ROWS * DV), lp(size_t(S) * ROWS), lp2(lp.size());
  for (float &x : op) x = uo(gen);
  for (float &x : lp) x = ul(gen);
  lp[0] = lp[ROWS] = lp[2 * ROWS] = -INFINITY;  // a row with no state: O = 0, LSE = sink
  for (size_t i = 0; i < lp.size(); ++i) lp2[i] = lp[i] * float(M_LOG2E);
  const std::vector<float> sinks = {2.0f, -1.0f, 0.5f};
  uint64_t dop = 0, dlp = 0, dlp2 = 0, ds = 0, o = 0, lse = 0;
  assert_int_equal(fa_malloc(g_rt, op.size() * 4, &dop), FA_SUCCESS);
  assert_int_equal(fa_malloc(g_rt, lp.size() * 4, &dlp), FA_SUCCESS);
  assert_int_equal(fa_malloc(g_rt, lp.size() * 4, &dlp2), FA_SUCCESS);
  assert_int_equal(fa_malloc(g_rt, 16, &ds), FA_SUCCESS);
  assert_int_equal(fa_malloc(g_rt, ROWS * DV * 2, &o), FA_SUCCESS);
  assert_int_equal(fa_malloc(g_rt, ROWS * 4, &lse), FA_SUCCESS);
  fa_memcpy_htod(g_rt, dop, op.data(), op.size() * 4);
  fa_memcpy_htod(g_rt, dlp, lp.data(), lp.size() * 4);
  fa_memcpy_htod(g_rt, dlp2, lp2.data(), lp2.size() * 4);
  fa_memcpy_htod(g_rt, ds, sinks.data(), sinks.size() * 4);
  auto run = [&](uint64_t lpart, int in_fmt, int out_fmt) {
    fa_reduce_args a = FA_REDUCE_ARGS_INIT;
    a.num_splits = S, a.batch = B, a.seqlen_q = SQ;
    a.o_partial = dop;
    const int64_t ops[5] = {int64_t(B) * SQ * H * DV, int64_t(SQ) * H * DV, H * DV, DV, 1};
    const int64_t lps[4] = {int64_t(B) * H * SQ, int64_t(H) * SQ, SQ, 1};
    std::memcpy(a.o_partial_stride, ops, sizeof ops);
    a.lse_partial = lpart;
    std::memcpy(a.lse_partial_stride, lps, sizeof lps);
    a.o = fa_tensor{o, {int64_t(SQ) * H * DV, int64_t(H) * DV, DV, 1}};
    a.lse = lse;
    a.lse_partial_format = in_fmt, a.lse_format = out_fmt;
    a.sinks = ds;
    fa_memset(g_rt, o, 0xFF, ROWS * DV * 2);
    fa_memset(g_rt, lse, 0xFF, ROWS * 4);
    assert_int_equal(fa_decode_reduce(g_rt, cfg, &a, nullptr), FA_SUCCESS);
    std::vector<uint16_t> ob(ROWS * DV);
    std::vector<float> lb(ROWS);
    fa_memcpy_dtoh(g_rt, ob.data(), o, ob.size() * 2);
    fa_memcpy_dtoh(g_rt, lb.data(), lse, lb.size() * 4);
    return std::make_pair(ob, lb);
  };
  const auto nat = run(dlp, FA_LSE_NATURAL, FA_LSE_NATURAL);
  const auto b2 = run(dlp2, FA_LSE_BASE2, FA_LSE_NATURAL);
  const auto b22 = run(dlp2, FA_LSE_BASE2, FA_LSE_BASE2);
  for (int i = 0; i < ROWS * DV; ++i) {
    const float x = fa::ref::f16_to_f32(nat.first[i]), y = fa::ref::f16_to_f32(b2.first[i]);
    assert_true(std::isfinite(x) && std::fabs(x - y) <= 2e-3f);
    assert_int_equal(b2.first[i], b22.first[i]);
  }
  for (int r = 0; r < ROWS; ++r) {
    assert_true(std::isfinite(nat.second[r]));
    assert_true(std::fabs(nat.second[r] - b2.second[r]) <=
                1e-4f * std::max(1.0f, std::fabs(nat.second[r])));
    assert_true(std::fabs(b22.second[r] - nat.second[r] * float(M_LOG2E)) <=
                1e-4f * std::max(1.0f, std::fabs(b22.second[r])));
  }
  // Row 0 (b 0, t 0, h 0) has no state: its LSE is the sink, its O zero.
  assert_true(std::fabs(nat.second[0] - sinks[0]) <= 1e-6f);
  for (int c = 0; c < DV; ++c) assert_int_equal(nat.first[c] & 0x7FFF, 0);
  for (uint64_t p : {dop, dlp, dlp2, ds, o, lse}) fa_free(g_rt, p);
  fa_config_destroy(cfg);
}

// ---- exact properties and host checks on one small problem ----

using Small = fa::test::SmallProblem;

// Sinks of -inf change no bit of O (the kernels' sink path multiplies by
// 2^0 and adds 2^-inf = 0), and LSE by at most an ulp; a 0.4-sized struct
// ignores whatever follows it.
void test_neg_inf_sinks_are_none(void **) {
  need_runtime();
  for (int scalar = 0; scalar < 2; ++scalar) {
    const fa::test::PolicyScope policy(g_rt, &fa::KernelPolicy::scalar_forward, scalar != 0);
    Small s(g_rt);
    s.set_heads(-INFINITY, -INFINITY);
    fa_forward_args a = s.fwd();
    s.poison_and_read(true);
    assert_int_equal(fa_launch(g_rt, s.cfg, &a, nullptr), FA_SUCCESS);
    const std::vector<uint8_t> plain = s.poison_and_read(false);
    a.sinks = s.heads;
    s.poison_and_read(true);
    assert_int_equal(fa_launch(g_rt, s.cfg, &a, nullptr), FA_SUCCESS);
    const std::vector<uint8_t> with = s.poison_and_read(false);
    assert_memory_equal(plain.data(), with.data(), s.o_bytes);
    for (size_t i = 0; i < s.lse_bytes / 4; ++i) {
      float x, y;
      std::memcpy(&x, plain.data() + s.o_bytes + 4 * i, 4);
      std::memcpy(&y, with.data() + s.o_bytes + 4 * i, 4);
      assert_true(std::fabs(x - y) <= 1e-6f * std::fabs(x));
    }
    // 0.4-sized args: the sinks field is past the struct (here finite sinks
    // that would change O): the result is that of no sinks.
    s.set_heads(3.0f, 1.0f);
    a.struct_size = FA_FORWARD_ARGS_SIZE_0_4;
    s.poison_and_read(true);
    assert_int_equal(fa_launch(g_rt, s.cfg, &a, nullptr), FA_SUCCESS);
    const std::vector<uint8_t> old = s.poison_and_read(false);
    assert_memory_equal(plain.data(), old.data(), s.o_bytes);
    // And with the full struct, finite sinks do change O.
    a.struct_size = sizeof a;
    s.poison_and_read(true);
    assert_int_equal(fa_launch(g_rt, s.cfg, &a, nullptr), FA_SUCCESS);
    const std::vector<uint8_t> sunk = s.poison_and_read(false);
    assert_true(std::memcmp(plain.data(), sunk.data(), s.o_bytes) != 0);
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
  s.set_heads(1.0f, 2.0f);
  s.poison_and_read(true);
  fa_forward_args f = s.fwd();
  f.sinks = s.heads + 2;
  expect_bad(fa_launch(g_rt, s.cfg, &f, nullptr), "fa_launch: sinks 0x");
  assert_non_null(std::strstr(fa_last_error(), "not 4-byte aligned"));
  fa_decode_args d = s.dec();
  d.sinks = s.heads + 1;
  expect_bad(fa_decode(g_rt, s.cfg, &d, nullptr), "fa_decode: sinks 0x");
  d.sinks = s.heads;
  d.o.data = 0;
  d.lse = 0;
  expect_bad(fa_decode(g_rt, s.cfg, &d, nullptr), "sinks is set but o.data is 0");
  fa_reduce_args r = FA_REDUCE_ARGS_INIT;
  r.num_splits = 1, r.batch = 1, r.seqlen_q = 1;
  r.o_partial = s.ws, r.lse_partial = s.ws + 4096, r.o_partial_stride[4] = 1;
  r.o = s.view(s.o, Small::SQ);
  r.sinks = s.heads + 3;
  expect_bad(fa_decode_reduce(g_rt, s.cfg, &r, nullptr), "fa_decode_reduce: sinks 0x");
  // Nothing was written by any rejected call.
  const std::vector<uint8_t> after = s.poison_and_read(false);
  for (uint8_t x : after) assert_int_equal(x, 0xFF);
  // 0.4-sized decode and reduce args are still accepted (no sinks).
  d = s.dec();
  d.struct_size = FA_DECODE_ARGS_SIZE_0_4;
  d.sinks = 1;  // past the struct: ignored
  assert_int_equal(fa_decode(g_rt, s.cfg, &d, nullptr), FA_SUCCESS);
  fa_generate_options g = FA_GENERATE_OPTIONS_INIT;
  g.sinks = 1;
  size_t n = 0;
  expect_bad(fa_generate_for(s.cfg, FA_KERNEL_DECODE, 80, &g, nullptr, 0, &n), "opts->sinks");
  g.sinks = 2;
  expect_bad(fa_generate_for(s.cfg, FA_KERNEL_FORWARD, 80, &g, nullptr, 0, &n), "opts->sinks");
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

// Off, the module is fa_generate's (0.4.0-sized options give it too); on,
// another one that reads the sinks. (The byte identity with the
// generators before sinks existed is checked over every spec of the grid by
// comparing two builds: docs/kernels.md, "Attention sinks".)
void test_sinks_ptx(void **) {
  setenv("FLASHATTN_SM90_WGMMA", "1", 1);
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.head_dim = 128;
  d.num_heads_q = 8;
  d.num_heads_kv = 2;
  d.causal = 1;
  fa_config *cfg = nullptr;
  assert_int_equal(fa_config_create(&d, &cfg), FA_SUCCESS);
  for (int scalar = 0; scalar < 2; ++scalar) {
    if (scalar) setenv("FLASHATTN_SCALAR_FORWARD", "1", 1);
    for (int sm : {80, 90}) {
      for (fa_kernel_kind kind : {FA_KERNEL_FORWARD, FA_KERNEL_REDUCE}) {
        fa_generate_options off = FA_GENERATE_OPTIONS_INIT, on = FA_GENERATE_OPTIONS_INIT;
        on.sinks = 1;
        fa_generate_options old = off;
        old.struct_size = FA_GENERATE_OPTIONS_SIZE_0_4;
        const std::string plain = generate(cfg, kind, sm, nullptr);
        assert_true(generate(cfg, kind, sm, &off) == plain);
        assert_true(generate(cfg, kind, sm, &old) == plain);
        const std::string with = generate(cfg, kind, sm, &on);
        assert_true(with != plain);
        assert_non_null(std::strstr(with.c_str(), "_sinks_param"));
        assert_null(std::strstr(plain.c_str(), "sinks"));
      }
    }
    unsetenv("FLASHATTN_SCALAR_FORWARD");
  }
  fa_config_destroy(cfg);
  unsetenv("FLASHATTN_SM90_WGMMA");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_mma),        cmocka_unit_test(test_forward_scalar),
      cmocka_unit_test(test_forward_wgmma),      cmocka_unit_test(test_decode_tc),
      cmocka_unit_test(test_decode_scalar),      cmocka_unit_test(test_prefill_and_reduce),
      cmocka_unit_test(test_reduce_sinks_base2), cmocka_unit_test(test_neg_inf_sinks_are_none),
      cmocka_unit_test(test_bad_args),           cmocka_unit_test(test_sinks_ptx),
      cmocka_unit_test(test_forward_nonfinite),  cmocka_unit_test(test_decode_nonfinite),
      cmocka_unit_test(test_reduce_nonfinite),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

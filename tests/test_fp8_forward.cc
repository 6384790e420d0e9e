// The fp8 forward (fa_config_desc.q_dtype with an fp8 kv_dtype: Q, K and V
// fp8 bytes, O in bf16 / fp16; FlashAttention-3's fp8 forward) in fa_launch
// on the emulator (sm_89, sm_90 and sm_120), against the fp64 reference on
// the values the fp8 bytes hold (fp8(byte) * descale, decoded by
// tools/common/reference.cc's own fp8 decoder):
// - e4m3 and e5m2 (and Q e5m2 over e4m3 K/V), fp16 and bf16 O; descales
//   absent, per tensor, per (batch, KV head) with a gap and transposed;
// - causal and not, GQA, windows, softcap, varlen (per-sequence descales),
//   sinks, ALiBi, strided views with gaps, head dims 16 .. 256 and past it
//   (576 / 512 and 512: O in 16-byte-aligned slices), head_dim_v != head_dim;
// - O and LSE poisoned first: every element written and finite, every gap
//   of O still poisoned; O within twice the error of the same attention at
//   the kernel's precision (P rounded to e4m3, f32 sums: the yardstick of
//   support/numerics.cc), LSE within 2e-3 (the row sums stay f32);
// - where the fp8 mma is native (sm_89, sm_120) the module runs mma.sync
//   m16n8k32 .e4m3/.e5m2 for both products; on sm_90 the wgmma kernel runs
//   wgmma m64nNk32 .e4m3/.e5m2 for both (V transposed by its producer), and
//   the same cases run on its form converting Q, K, V to f16 on load
//   (FLASHATTN_SM90_FP8_F16=1); on sm_100 (mma.sync), where ptxas would
//   expand the fp8 mma, converted to f16 on load;
// - UNSUPPORTED below sm_89, from fa_decode and from the scalar forward;
//   INVALID_ARGUMENT for q_dtype without an fp8 kv_dtype, a q_descale
//   without an fp8 Q, fp8 strides that are not whole 16-byte granules; a
//   0.5-sized desc and args still work, and a 16-bit forward's PTX is
//   unchanged by the feature.
#include "support/cmocka.hh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "reference.h"
#include "support/numerics.h"
#include "support/policy.h"

namespace {

using fa::test::ForwardCase;

fa_runtime *g_rt89 = nullptr, *g_rt90 = nullptr, *g_rt120 = nullptr, *g_rt80 = nullptr,
           *g_rt100 = nullptr;
std::string g_why;

int setup(void **) {
  g_rt89 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 89);
  g_rt90 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 90);
  g_rt120 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 120);
  g_rt80 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 80);
  g_rt100 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 100);
  return 0;
}
int teardown(void **) {
  for (fa_runtime *rt : {g_rt89, g_rt90, g_rt120, g_rt80, g_rt100}) fa_runtime_destroy(rt);
  return 0;
}
void need_runtime() {
  if (!g_rt89 || !g_rt90 || !g_rt120 || !g_rt80 || !g_rt100) {
    std::printf("SKIP: emulator unavailable: %s\n", g_why.c_str());
    skip();
  }
}

// FA_TEST_QUICK=1 (the sanitizer build): fewer cases where forms repeat.
bool quick() {
  const char *q = std::getenv("FA_TEST_QUICK");
  return q && q[0] == '1';
}

ForwardCase fp8_case(int b, int sq, int sk, int hq, int hkv, int d, int dv, bool causal) {
  ForwardCase c;
  c.batch = b;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.heads_q = hq;
  c.heads_kv = hkv;
  c.head_dim = d;
  c.head_dim_v = dv;
  c.causal = causal;
  c.bf16 = true;
  c.q_fp8 = c.kv_fp8 = FA_DTYPE_FP8_E4M3;
  return c;
}

void run_all(fa_runtime *rt, const std::vector<ForwardCase> &cases) {
  int failed = 0;
  for (const ForwardCase &c : cases) {
    const std::string err = fa::test::run_forward(rt, c);
    if (!err.empty()) {
      std::printf("FAILED: %s\n%s", c.describe().c_str(), err.c_str());
      ++failed;
    }
  }
  assert_int_equal(failed, 0);
}

// Formats, dtypes, descales, masks and layouts at the common head dims.
std::vector<ForwardCase> common_cases() {
  std::vector<ForwardCase> cs;
  {
    ForwardCase c = fp8_case(2, 70, 100, 4, 2, 128, 128, true);  // GQA, causal, tails
    cs.push_back(c);
  }
  {
    ForwardCase c = fp8_case(1, 33, 77, 2, 2, 64, 64, false);  // fp16 O, no descale, strided
    c.bf16 = false;
    c.descale = 0;
    c.padded_strides = true;
    c.seed = 2;
    cs.push_back(c);
  }
  {
    ForwardCase c = fp8_case(2, 40, 64, 2, 1, 64, 64, false);  // e5m2, one descale per tensor
    c.q_fp8 = c.kv_fp8 = FA_DTYPE_FP8_E5M2;
    c.descale = 1;
    c.seed = 3;
    cs.push_back(c);
  }
  {
    ForwardCase c = fp8_case(1, 48, 96, 3, 1, 96, 80, true);  // Q e5m2 over e4m3 K/V, dv != d
    c.q_fp8 = FA_DTYPE_FP8_E5M2;
    c.descale = 3;
    c.seed = 4;
    cs.push_back(c);
  }
  {
    ForwardCase c = fp8_case(3, 0, 0, 4, 2, 128, 128, true);  // varlen, per-sequence descales
    c.varlen = true;
    c.seqlens_q = {17, 1, 40};
    c.seqlens_k = {90, 33, 40};
    c.seqlen_q = 40;
    c.seqlen_k = 90;
    c.descale = 3;
    c.seed = 5;
    cs.push_back(c);
  }
  {
    ForwardCase c = fp8_case(1, 64, 150, 2, 2, 64, 64, false);  // window and softcap
    c.window_left = 40;
    c.window_right = 7;
    c.softcap = 20.0f;
    c.seed = 6;
    cs.push_back(c);
  }
  {
    ForwardCase c = fp8_case(2, 37, 70, 4, 2, 128, 128, true);  // sinks and ALiBi
    c.sinks = {0.5f, -1.0f, 2.0f, -INFINITY};
    c.alibi = fa::ref::standard_alibi_slopes(4);
    c.seed = 7;
    cs.push_back(c);
  }
  {
    ForwardCase c = fp8_case(1, 20, 45, 1, 1, 16, 16, false);  // the smallest head dim
    c.seed = 8;
    cs.push_back(c);
  }
  return cs;
}

// sm_89: the fp8 mma (QMMA) with P in e4m3.
void test_fp8_forward_sm89(void **) {
  need_runtime();
  run_all(g_rt89, common_cases());
}

// sm_90: the wgmma kernel on fp8 wgmma (P in e4m3, V transposed by the
// producer), and its form converting fp8 to f16 on load
// (FLASHATTN_SM90_FP8_F16=1, P in f16); sm_100: the mma.sync kernel, its
// copy plans converting (fp8_forward_mma: the fp8 mma.sync is not native
// there), P in f16.
void test_fp8_forward_sm90(void **) {
  need_runtime();
  run_all(g_rt90, common_cases());
}
void test_fp8_forward_sm90_f16(void **) {
  need_runtime();
  std::vector<ForwardCase> cs = common_cases();
  if (quick()) cs.resize(3);
  const fa::test::PolicyScope policy(g_rt90, &fa::KernelPolicy::sm90_fp8_f16);
  run_all(g_rt90, cs);
}
void test_fp8_forward_sm100(void **) {
  need_runtime();
  std::vector<ForwardCase> cs = common_cases();
  if (quick()) cs.resize(3);  // the sanitizer build: the mma.sync form's first cases
  run_all(g_rt100, cs);
}

// The largest dims: 256, and past it O in slices of whole 16-byte chunks
// (576 / 512: MLA's shape, 512: Gemma's), on sm_89.
void test_fp8_forward_large_heads(void **) {
  need_runtime();
  std::vector<ForwardCase> cs;
  cs.push_back(fp8_case(1, 20, 40, 2, 1, 256, 256, true));
  {
    ForwardCase c = fp8_case(1, 17, 40, 2, 1, 576, 512, false);
    c.seed = 11;
    cs.push_back(c);
  }
  {
    ForwardCase c = fp8_case(1, 24, 33, 2, 2, 512, 512, true);
    c.softcap = 30.0f;
    c.seed = 12;
    cs.push_back(c);
  }
  {
    ForwardCase c = fp8_case(1, 16, 40, 1, 1, 304, 272, false);  // 17 slices of 16 columns
    c.seed = 13;
    cs.push_back(c);
  }
  if (quick()) cs.resize(2);
  run_all(g_rt89, cs);
}

// sm_120 (the fp8 mma; its smaller shared memory picks other tiles), sm_90
// at head dim 256 (the fp8 wgmma with 64-key tiles, 32 with softcap) and
// past it (converted on load, O in slices).
void test_fp8_forward_other_sms(void **) {
  need_runtime();
  ForwardCase c = fp8_case(2, 50, 80, 4, 2, 256, 256, true);
  c.seed = 22;
  run_all(g_rt120, {c});
  c = fp8_case(1, 40, 150, 2, 1, 256, 256, true);
  c.seed = 24;
  ForwardCase capped = fp8_case(1, 20, 70, 2, 2, 192, 256, false);
  capped.softcap = 25.0f;
  capped.kv_fp8 = FA_DTYPE_FP8_E5M2;
  capped.seed = 25;
  run_all(g_rt90, {c, capped});
  c = fp8_case(1, 17, 40, 2, 1, 576, 512, true);
  c.q_fp8 = FA_DTYPE_FP8_E5M2;
  c.seed = 23;
  run_all(g_rt90, {c});
}

fa_config *make_config(int q_dtype, int kv_dtype, int d) {
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = FA_DTYPE_BF16;
  desc.head_dim = d;
  desc.num_heads_q = 2;
  desc.num_heads_kv = 1;
  desc.q_dtype = q_dtype;
  desc.kv_dtype = kv_dtype;
  fa_config *cfg = nullptr;
  if (fa_config_create(&desc, &cfg) != FA_SUCCESS) return nullptr;
  return cfg;
}

std::string generate(const fa_config *cfg, fa_kernel_kind kind, int sm, fa_status *st) {
  size_t n = 0;
  *st = fa_generate(cfg, kind, sm, nullptr, 0, &n);
  if (*st != FA_SUCCESS) return {};
  std::string s(n + 1, '\0');
  *st = fa_generate(cfg, kind, sm, s.data(), s.size(), &n);
  s.resize(n);
  return s;
}

size_t count(const std::string &s, const char *what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// The module: both products on the fp8 mma, P as e4m3, the permuted V read.
void test_fp8_forward_ptx(void **) {
  fa_config *cfg = make_config(FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E5M2, 128);
  assert_non_null(cfg);
  fa_status st;
  const std::string ptx = generate(cfg, FA_KERNEL_FORWARD, 89, &st);
  assert_int_equal(st, FA_SUCCESS);
  assert_true(count(ptx, "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32") > 0);  // S, P V
  assert_int_equal(count(ptx, "mma.sync.aligned.m16n8k16"), 0);
  assert_true(count(ptx, "cvt.rn.satfinite.e4m3x2.f32") > 0);  // P
  assert_true(count(ptx, "prmt.b32") > 0);                     // V's byte order
  assert_true(count(ptx, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") > 0);
  // sm_90: the wgmma kernel on fp8 wgmma: S on the bytes of Q and K, P V
  // on e4m3 P and V's bytes (transposed by prmt.b32), nothing converted to
  // f16; with FLASHATTN_SM90_FP8_F16=1 its producer converts to f16 (exact)
  // and the 16-bit wgmma runs. sm_100: the mma.sync copy plans converting,
  // the 16-bit mma in f16.
  const std::string ptx90 = generate(cfg, FA_KERNEL_FORWARD, 90, &st);
  assert_int_equal(st, FA_SUCCESS);
  assert_int_equal(count(ptx90, "m16n8k32"), 0);
  assert_true(count(ptx90, "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e5m2") > 0);  // S
  assert_true(count(ptx90, "k32.f32.e4m3.e5m2 {") > 0);
  assert_int_equal(count(ptx90, ".f16.f16"), 0);
  assert_true(count(ptx90, "cvt.rn.satfinite.e4m3x2.f32") > 0);  // P
  assert_true(count(ptx90, "prmt.b32") > 0);                     // V transposed
  assert_int_equal(count(ptx90, "cvt.rn.f16x2"), 0);
  setenv("FLASHATTN_SM90_FP8_F16", "1", 1);
  const std::string ptx90h = generate(cfg, FA_KERNEL_FORWARD, 90, &st);
  unsetenv("FLASHATTN_SM90_FP8_F16");
  assert_int_equal(st, FA_SUCCESS);
  assert_int_equal(count(ptx90h, "k32"), 0);
  assert_true(count(ptx90h, "wgmma.mma_async.sync.aligned.m64n") > 0);
  assert_true(count(ptx90h, ".f32.f16.f16") > 0);
  assert_true(count(ptx90h, "cvt.rn.f16x2.e4m3x2") > 0 && count(ptx90h, "cvt.rn.f16x2.e5m2x2") > 0);
  // sm_100: the tcgen05 forward on the bytes (kind::f8f6f4, P in e4m3);
  // with FLASHATTN_SM100_FORWARD=0 the mma.sync forward converts to f16.
  const std::string ptx100 = generate(cfg, FA_KERNEL_FORWARD, 100, &st);
  assert_int_equal(st, FA_SUCCESS);
  assert_true(count(ptx100, "tcgen05.mma.cta_group::1.kind::f8f6f4") > 0);
  assert_true(count(ptx100, "cvt.rn.satfinite.e4m3x2.f32") > 0);  // P
  assert_int_equal(count(ptx100, "cvt.rn.f16x2"), 0);
  setenv("FLASHATTN_SM100_FORWARD", "0", 1);
  const std::string ptx100m = generate(cfg, FA_KERNEL_FORWARD, 100, &st);
  unsetenv("FLASHATTN_SM100_FORWARD");
  assert_int_equal(st, FA_SUCCESS);
  assert_int_equal(count(ptx100m, "m16n8k32"), 0);
  assert_true(count(ptx100m, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") > 0);
  assert_true(count(ptx100m, "cvt.rn.f16x2.e4m3x2") > 0 &&
              count(ptx100m, "cvt.rn.f16x2.e5m2x2") > 0);
  // Every SM from 89 up generates it; below, UNSUPPORTED with the reason.
  for (int sm : {89, 90, 100, 120})
    generate(cfg, FA_KERNEL_FORWARD, sm, &st), assert_int_equal(st, FA_SUCCESS);
  for (int sm : {80, 86}) {
    generate(cfg, FA_KERNEL_FORWARD, sm, &st);
    assert_int_equal(st, FA_ERROR_UNSUPPORTED);
    assert_non_null(std::strstr(fa_last_error(), "sm_89"));
  }
  // fa_decode's kernel is not the fp8 forward's.
  generate(cfg, FA_KERNEL_DECODE, 89, &st);
  assert_int_equal(st, FA_ERROR_UNSUPPORTED);
  fa_config_destroy(cfg);
  // A 16-bit forward's module is the same from a 0.5-sized desc.
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = FA_DTYPE_BF16;
  desc.head_dim = 128;
  desc.num_heads_q = 2;
  desc.num_heads_kv = 1;
  fa_config *now = nullptr, *old = nullptr;
  assert_int_equal(fa_config_create(&desc, &now), FA_SUCCESS);
  desc.struct_size = FA_CONFIG_DESC_SIZE_0_5;
  assert_int_equal(fa_config_create(&desc, &old), FA_SUCCESS);
  assert_string_equal(generate(now, FA_KERNEL_FORWARD, 89, &st).c_str(),
                      generate(old, FA_KERNEL_FORWARD, 89, &st).c_str());
  fa_config_destroy(now);
  fa_config_destroy(old);
}

// The host's checks of the new fields.
void test_fp8_forward_refusals(void **) {
  need_runtime();
  // q_dtype without an fp8 kv_dtype; a q_dtype that is not fp8.
  assert_null(make_config(FA_DTYPE_FP8_E4M3, 0, 128));
  assert_non_null(std::strstr(fa_last_error(), "kv_dtype"));
  assert_null(make_config(FA_DTYPE_BF16, FA_DTYPE_FP8_E4M3, 128));
  // fa_launch: sm_80 UNSUPPORTED; strides; q_descale on a 16-bit config.
  fa_config *cfg = make_config(FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E4M3, 64);
  assert_non_null(cfg);
  uint64_t buf = 0;
  assert_int_equal(fa_malloc(g_rt89, 1 << 16, &buf), FA_SUCCESS);
  fa_forward_args a = FA_FORWARD_ARGS_INIT;
  a.batch = 1;
  a.seqlen_q = a.seqlen_k = 16;
  fa_tensor t = {buf, {16 * 2 * 64, 2 * 64, 64, 1}};
  a.q = a.k = a.v = a.o = t;
  a.k.stride[1] = a.v.stride[1] = 64;
  a.k.stride[0] = a.v.stride[0] = 16 * 64;
  a.o.data = buf + 32768;
  assert_int_equal(fa_launch(g_rt80, cfg, &a, nullptr), FA_ERROR_UNSUPPORTED);
  assert_non_null(std::strstr(fa_last_error(), "sm_89"));
  assert_int_equal(fa_launch(g_rt89, cfg, &a, nullptr), FA_SUCCESS);
  fa_forward_args bad = a;
  bad.q.stride[2] = 72;  // 8 bytes past a granule
  bad.q.stride[1] = 144;
  assert_int_equal(fa_launch(g_rt89, cfg, &bad, nullptr), FA_ERROR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(fa_last_error(), "q.stride"));
  bad = a;
  bad.q_descale = buf + 2;  // not 4-byte aligned
  assert_int_equal(fa_launch(g_rt89, cfg, &bad, nullptr), FA_ERROR_INVALID_ARGUMENT);
  // A 0.5-sized args struct: no q_descale (1.0).
  bad = a;
  bad.struct_size = FA_FORWARD_ARGS_SIZE_0_5;
  assert_int_equal(fa_launch(g_rt89, cfg, &bad, nullptr), FA_SUCCESS);
  fa_config_destroy(cfg);
  // q_descale on a 16-bit config.
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = FA_DTYPE_BF16;
  desc.head_dim = 64;
  desc.num_heads_q = 2;
  desc.num_heads_kv = 2;
  assert_int_equal(fa_config_create(&desc, &cfg), FA_SUCCESS);
  bad = a;
  bad.q.stride[0] = 16 * 128, bad.q.stride[1] = 128;
  bad.q_descale = buf;
  assert_int_equal(fa_launch(g_rt89, cfg, &bad, nullptr), FA_ERROR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(fa_last_error(), "q_descale"));
  fa_config_destroy(cfg);
  // fa_decode with an fp8 Q config.
  cfg = make_config(FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E4M3, 64);
  fa_decode_args d = FA_DECODE_ARGS_INIT;
  d.batch = 1;
  d.seqlen_q = 1;
  d.seqlen_k_max = 16;
  d.q = t;
  d.k_cache = d.v_cache = a.k;
  d.cache_seqlens = buf + 40000;
  d.o = a.o;
  size_t ws = 0;
  int32_t splits = 0;
  assert_int_equal(fa_decode_workspace_size(g_rt89, cfg, &d, &ws, &splits), FA_SUCCESS);
  uint64_t w = 0;
  assert_int_equal(fa_malloc(g_rt89, ws + 16, &w), FA_SUCCESS);
  d.workspace = w;
  d.workspace_size = ws;
  assert_int_equal(fa_decode(g_rt89, cfg, &d, nullptr), FA_ERROR_UNSUPPORTED);
  assert_non_null(std::strstr(fa_last_error(), "q_dtype"));
  fa_free(g_rt89, w);
  fa_free(g_rt89, buf);
  fa_config_destroy(cfg);
  // The scalar forward does not take it.
  setenv("FLASHATTN_SCALAR_FORWARD", "1", 1);
  cfg = make_config(FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E4M3, 64);
  fa_status st;
  generate(cfg, FA_KERNEL_FORWARD, 89, &st);
  unsetenv("FLASHATTN_SCALAR_FORWARD");
  assert_int_equal(st, FA_ERROR_UNSUPPORTED);
  fa_config_destroy(cfg);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp8_forward_ptx),       cmocka_unit_test(test_fp8_forward_refusals),
      cmocka_unit_test(test_fp8_forward_sm89),      cmocka_unit_test(test_fp8_forward_sm90),
      cmocka_unit_test(test_fp8_forward_sm90_f16),  cmocka_unit_test(test_fp8_forward_sm100),
      cmocka_unit_test(test_fp8_forward_other_sms), cmocka_unit_test(test_fp8_forward_large_heads),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

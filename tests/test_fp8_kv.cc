// fp8 KV cache (fa_config_desc.kv_dtype FA_DTYPE_FP8_E4M3 / _E5M2, the
// descales of fa_decode_args) in fa_decode on the emulator (sm_89 and
// sm_90), against the fp64 reference on the values the fp8 bytes hold
// (decoded by tools/common/reference.cc's own fp8 decoder, times the
// descales):
// - e4m3 and e5m2, fp16 and bf16 Q/O; descales absent (1.0), per tensor and
//   per (batch, KV head) with non-trivial strides;
// - every KV layout (contiguous with padded strides, paged NHD and HND with
//   per-row and per-tile page lookups, pointer arrays), GQA packing, chunked
//   prefill (seqlen_q > 1, causal), windows, softcap, ALiBi, tree masks, sinks
//   (in the combine), forced, automatic and batch-invariant splits;
//   cache rows past cache_seqlens hold NaN bytes (never read);
// - each case checks by name that the tensor-core decode kernel with the
//   fp8 variant ran (o.data = 0 profiles it; fa_decode_reduce combines);
//   O and LSE poisoned first;
// - the emulator's memory counters: the fp8 cache reads exactly half the
//   K/V sectors of the fp16 cache of the same shape;
// - UNSUPPORTED on sm_80/86 and from fa_launch; the host checks of the new
//   fields; a 0.4-sized desc and 0.4.1-sized args still work;
// - the PTX of a 16-bit decode is unchanged by the feature (fa_generate of
//   a 0.4-sized desc's config equals the current one's);
// - mode (b) (KernelPolicy::decode_fp8_mma: Q and P in e4m3 on the fp8
//   mma): the formats, layouts, features and append cases on sm_89 and
//   sm_120, the kernel checked by name ("_f8mma"), within twice the error of
//   a yardstick that rounds Q and P as the kernel does (run_case); head_dim
//   80 and sm_90 run mode (a).
#include "support/cmocka.hh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reference.h"
#include "support/fp8_kv.h"
#include "support/numerics.h"
#include "support/policy.h"

namespace {

using namespace fa::test::fp8kv;

fa_runtime *g_rt89 = nullptr, *g_rt90 = nullptr, *g_rt80 = nullptr, *g_rt120 = nullptr;
std::string g_why;

int setup(void **) {
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  g_rt89 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 89);
  g_rt90 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 90);
  g_rt80 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 80);
  g_rt120 = fa::test::make_runtime(FA_BACKEND_EMULATOR, &g_why, 120);
  return 0;
}
int teardown(void **) {
  fa_runtime_destroy(g_rt89);
  fa_runtime_destroy(g_rt90);
  fa_runtime_destroy(g_rt80);
  fa_runtime_destroy(g_rt120);
  unsetenv("FLASHATTN_EMU_PROFILE");
  return 0;
}
void need_runtime() {
  if (!g_rt89 || !g_rt90 || !g_rt80 || !g_rt120) {
    std::printf("SKIP: emulator unavailable: %s\n", g_why.c_str());
    skip();
  }
}

void report(const std::string &failures) {
  if (!failures.empty()) {
    print_error("%s", failures.c_str());
    fail();
  }
}

void run_all(fa_runtime *rt, const std::vector<Case> &cases) {
  std::string failures;
  for (const Case &c : cases) {
    const std::string e = run_case(rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
  }
  report(failures);
}

// e4m3 and e5m2, fp16 and bf16, each descale form, contiguous.
std::vector<Case> format_cases() {
  std::vector<Case> cases;
  uint32_t seed = 10;
  for (int e5 = 0; e5 < 2; ++e5)
    for (int bf = 0; bf < 2; ++bf) {
      Case c = base(2, 1, 150, 4, 2, 64, seed++);
      c.e5m2 = e5;
      c.bf16 = bf;
      c.descale = (e5 + 2 * bf) % 3;
      c.descale_transposed = bf;
      cases.push_back(c);
    }
  Case c = base(1, 1, 100, 2, 1, 128, seed++);
  c.dv = 64;
  c.splits = 3;
  cases.push_back(c);
  // bf16 Q over 48 binades (rows of 2^-30 .. 2^18 N(0, 1); f16 holds 2^-24
  // .. 65504): its f16 copy is scaled per row, so each row's scores are
  // those of the bf16 row.
  for (int e5 = 0; e5 < 2; ++e5) {
    Case w = base(2, 3, 120, 10, 2, 64, seed++);
    w.bf16 = true;
    w.e5m2 = e5;
    w.causal = true;
    w.q_spread = true;
    cases.push_back(w);
  }
  return cases;
}

void test_formats(void **) {
  need_runtime();
  run_all(g_rt89, format_cases());
}

// Every KV layout, page sizes below and at a multiple of the key tile.
std::vector<Case> layout_cases() {
  std::vector<Case> cases;
  uint32_t seed = 30;
  const struct {
    Layout l;
    int ps;
  } lays[] = {{kPagedNhd, 5}, {kPagedNhd, 16}, {kPagedHnd, 32}, {kPagedHnd, 7}, {kPtrs, 0}};
  for (const auto &l : lays) {
    Case c = base(2, 2, 90, 4, 2, 64, seed++);
    c.layout = l.l;
    c.page_size = l.ps;
    c.e5m2 = seed % 2;
    c.bf16 = seed % 3 == 0;
    c.causal = true;
    cases.push_back(c);
  }
  return cases;
}

void test_layouts(void **) {
  need_runtime();
  run_all(g_rt90, layout_cases());
}

// Chunked prefill, GQA packing, windows, softcap, ALiBi, tree masks, sinks,
// splits, MLA's head dims.
std::vector<Case> feature_cases() {
  std::vector<Case> cases;
  Case c = base(2, 9, 120, 8, 2, 64, 50);  // prefill chunk, GQA 4: 36 packed rows
  c.causal = true;
  c.splits = 2;
  cases.push_back(c);
  c = base(1, 1, 200, 2, 2, 96, 51);  // window, e5m2, bf16
  c.window_left = 40;
  c.e5m2 = true;
  c.bf16 = true;
  cases.push_back(c);
  c = base(2, 2, 100, 2, 1, 64, 55);  // softcap
  c.softcap = 15.0f;
  cases.push_back(c);
  c = base(2, 3, 90, 8, 2, 128, 60);  // ALiBi, GQA 4, chunked prefill, window
  c.alibi = true;
  c.causal = true;
  c.window_left = 50;
  c.bf16 = true;
  cases.push_back(c);
  c = base(2, 5, 80, 2, 1, 64, 52);  // tree mask
  c.tree = true;
  c.layout = kPagedNhd;
  c.page_size = 16;
  cases.push_back(c);
  c = base(2, 1, 70, 4, 2, 64, 53);  // sinks through the combine, fa_decode's own
  c.sinks = true;
  c.direct = true;
  cases.push_back(c);
  c = base(3, 2, 48, 4, 2, 64, 56);  // an empty sequence whose descales are +inf
  c.lens = {48, 0, 20};
  c.inf_descale_seq = 1;
  c.splits = 2;
  cases.push_back(c);
  c = base(1, 3, 64, 4, 4, 64, 54);  // sinks through fa_decode_reduce, invariant splits
  c.sinks = true;
  c.batch_invariant = true;
  c.causal = true;
  cases.push_back(c);
  c = base(2, 1, 140, 16, 1, 576, 57);  // MLA: 576 / 512 over one KV head, O in two slices
  c.dv = 512;
  c.bf16 = true;
  c.layout = kPagedNhd;
  c.page_size = 64;
  c.splits = 2;
  cases.push_back(c);
  // dv 272: O in slices of whole 16-byte chunks of fp8 bytes (not 136 +
  // 136); V its own tensor, then V in K (a slice's columns start in K's
  // row at a multiple of 16 bytes).
  c = base(1, 2, 90, 4, 2, 288, 58);
  c.dv = 272;
  cases.push_back(c);
  c.v_in_k = true;
  c.seed = 59;
  cases.push_back(c);
  return cases;
}

void test_features(void **) {
  need_runtime();
  run_all(g_rt89, feature_cases());
}

// The decode kernel's K/V global traffic: the fp8 cache reads exactly half
// the bytes of the fp16 cache, and (rows on sector boundaries) half the
// sectors an fp16 cache needs at least (one split; Q the same in both).
void test_sectors_halved(void **) {
  need_runtime();
  Case c = base(2, 1, 256, 2, 2, 128, 70);
  c.lens = {256, 256};
  c.splits = 1;
  c.tight = true;
  fa_emu_mem_counters f8{};
  std::string failures = run_case(g_rt89, c, &f8);
  // The same shape with a 16-bit cache, through the shared decode runner
  // (partials only: the decode kernel's counters stay the last ones).
  fa::test::DecodeCase d;
  d.batch = 2;
  d.seqlen_q = 1;
  d.seqlen_k_max = 256;
  d.cache_seqlens = {256, 256};
  d.heads_q = d.heads_kv = 2;
  d.head_dim = 128;
  d.num_splits = 1;
  d.partials_only = true;
  failures += fa::test::run_decode(g_rt89, d);
  fa_emu_profile prof = FA_EMU_PROFILE_INIT;
  if (fa_emulator_profile(g_rt89, &prof) != FA_SUCCESS) failures += "no profile\n";
  const unsigned long long s16 = prof.total.cp_async_sectors, s8 = f8.cp_async_sectors;
  const unsigned long long b16 = prof.total.cp_async_bytes, b8 = f8.cp_async_bytes;
  // Q: one 256-byte row (8 sectors) per CTA, batch * heads CTAs.
  const unsigned long long q = 2ull * 2 * 8;
  std::printf("  cp.async: fp16 cache %llu sectors %llu bytes, fp8 cache %llu sectors %llu bytes\n",
              s16, b16, s8, b8);
  // K and V: 2 sequences x 2 heads x 256 keys x 128 x (2 bytes | 1 byte).
  const unsigned long long kv16_bytes = 2ull * 2 * 256 * 2 * 256, kv16_min = kv16_bytes / 32;
  if (b16 != kv16_bytes + 32 * q || b8 != kv16_bytes / 2 + 32 * q)
    failures += "K/V bytes: fp16 " + std::to_string(b16 - 32 * q) + ", fp8 " +
                std::to_string(b8 - 32 * q) + " (want " + std::to_string(kv16_bytes) +
                " and half)\n";
  if (s16 < kv16_min + q || s8 != kv16_min / 2 + q)
    failures += "K/V sectors: fp16 " + std::to_string(s16 - q) + " (at least " +
                std::to_string(kv16_min) + "), fp8 " + std::to_string(s8 - q) + " (want " +
                std::to_string(kv16_min / 2) + ")\n";
  report(failures);
}

// UNSUPPORTED where no fp8 kernel runs; INVALID_ARGUMENT for bad fields.
void test_statuses(void **) {
  need_runtime();
  Case c = base(1, 1, 32, 2, 1, 64, 80);
  g_last_fail = FA_SUCCESS;
  const std::string e80 = run_case(g_rt80, c);
  std::printf("    sm_80: %s", e80.c_str());
  if (e80.find("fa_decode") == std::string::npos || g_last_fail != FA_ERROR_UNSUPPORTED)
    report("sm_80 fp8 decode: expected UNSUPPORTED, got: " + e80);
  // The scalar decode has no fp8 path either.
  std::string es;
  {
    const fa::test::PolicyScope policy(g_rt89, &fa::KernelPolicy::scalar_decode);
    g_last_fail = FA_SUCCESS;
    es = run_case(g_rt89, c);
  }
  std::printf("    scalar decode: %s", es.c_str());
  if (es.find("scalar") == std::string::npos || g_last_fail != FA_ERROR_UNSUPPORTED)
    report("scalar fp8 decode: expected UNSUPPORTED, got: " + es);
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = FA_DTYPE_FP16;
  desc.head_dim = 64;
  desc.num_heads_q = desc.num_heads_kv = 1;
  fa_config *cfg = nullptr;
  desc.kv_dtype = 3;
  assert_int_equal(fa_config_create(&desc, &cfg), FA_ERROR_INVALID_ARGUMENT);
  desc.kv_dtype = FA_DTYPE_FP16;
  assert_int_equal(fa_config_create(&desc, &cfg), FA_ERROR_INVALID_ARGUMENT);
  desc.kv_dtype = FA_DTYPE_FP8_E4M3;
  desc.head_dim = 72;
  assert_int_equal(fa_config_create(&desc, &cfg), FA_ERROR_UNSUPPORTED);
  desc.head_dim = 64;
  // 0.4-sized desc: kv_dtype not read (16-bit cache).
  fa_config_desc old = desc;
  old.struct_size = FA_CONFIG_DESC_SIZE_0_4;
  assert_int_equal(fa_config_create(&old, &cfg), FA_SUCCESS);
  fa_config_destroy(cfg);
  assert_int_equal(fa_config_create(&desc, &cfg), FA_SUCCESS);
  // fa_generate: the forward refuses, sm_86 refuses, sm_89 decode works.
  size_t n = 0;
  assert_int_equal(fa_generate(cfg, FA_KERNEL_FORWARD, 89, nullptr, 0, &n), FA_ERROR_UNSUPPORTED);
  assert_int_equal(fa_generate(cfg, FA_KERNEL_DECODE, 86, nullptr, 0, &n), FA_ERROR_UNSUPPORTED);
  assert_int_equal(fa_generate(cfg, FA_KERNEL_DECODE, 89, nullptr, 0, &n), FA_SUCCESS);
  std::string ptx(n + 1, '\0');
  assert_int_equal(fa_generate(cfg, FA_KERNEL_DECODE, 89, &ptx[0], ptx.size(), &n), FA_SUCCESS);
  assert_non_null(std::strstr(ptx.c_str(), "cvt.rn.f16x2.e4m3x2"));
  assert_non_null(std::strstr(ptx.c_str(), ".version 8.1"));

  // Bad args on a valid fp8 config (rejected before any launch).
  uint64_t buf = 0;
  assert_int_equal(fa_malloc(g_rt89, 1 << 16, &buf), FA_SUCCESS);
  fa_decode_args a = FA_DECODE_ARGS_INIT;
  a.batch = 1;
  a.seqlen_q = 1;
  a.seqlen_k_max = 32;
  fa_tensor t{};
  t.data = buf;
  t.stride[3] = 1;
  t.stride[2] = 64;
  t.stride[1] = 64;
  t.stride[0] = 64 * 32;
  a.q = a.k_cache = a.v_cache = t;
  a.cache_seqlens = buf;
  a.workspace = buf + 32768;
  a.workspace_size = 1 << 15;
  auto expect = [&](const fa_decode_args &x, fa_status want, const char *what) {
    const fa_status st = fa_decode(g_rt89, cfg, &x, nullptr);
    std::printf("    %s: %d %s\n", what, st, fa_last_error());
    if (st != want) report(std::string(what) + ": unexpected status");
  };
  fa_decode_args x = a;
  x.k_descale = buf + 2;
  expect(x, FA_ERROR_INVALID_ARGUMENT, "misaligned k_descale");
  x = a;
  x.v_descale = buf + 6;
  expect(x, FA_ERROR_INVALID_ARGUMENT, "misaligned v_descale");
  x = a;
  x.struct_size = FA_DECODE_ARGS_SIZE_0_4_1;  // descales read as 0 (1.0): runs
  x.k_descale = 2;                            // past the 0.4.1 struct: not read
  assert_int_equal(fa_memset(g_rt89, buf, 0, 32768), FA_SUCCESS);
  expect(x, FA_SUCCESS, "0.4.1-sized args");
  x = a;
  x.k_cache.stride[2] = 72;  // 8-element multiple, not 16
  expect(x, FA_ERROR_INVALID_ARGUMENT, "fp8 stride not a multiple of 16");
  // (A negative descale_stride and descales on a 16-bit cache:
  // fp8_kv.cases through test_features.)
  // fa_launch with an fp8 config: UNSUPPORTED (fa_decode only).
  fa_forward_args f = FA_FORWARD_ARGS_INIT;
  f.batch = 1;
  f.seqlen_q = f.seqlen_k = 32;
  f.q = f.k = f.v = f.o = t;
  const fa_status fs = fa_launch(g_rt89, cfg, &f, nullptr);
  std::printf("    fa_launch: %d %s\n", fs, fa_last_error());
  assert_int_equal(fs, FA_ERROR_UNSUPPORTED);
  fa_config_destroy(cfg);
  fa_free(g_rt89, buf);
}

// KV append into the fp8 cache (k_new/v_new 16-bit, quantised by the
// kernel with the descales; K after RoPE): the cache bytes bit for bit
// against the host quantisation, everything else unchanged, then attention
// over the decoded cache. lens: before the append.
Case app(int b, int sq, int sk, int hq, int hkv, int d, int sn, uint32_t seed) {
  Case c = base(b, sq, sk, hq, hkv, d, seed);
  c.seqlen_new = sn;
  for (int &l : c.lens) l = std::min(l, sk - sn) - (seed % 3);
  c.lens.back() = 0;  // an empty cache
  if (b > 1) c.lens[0] = sk - sn;
  return c;
}

// The sm_89 cases (first) and the sm_90 ones (*later).
std::vector<Case> append_cases(std::vector<Case> *later) {
  std::vector<Case> cases;
  uint32_t seed = 90;
  // e4m3 fp16, contiguous, per (batch, KV head), no RoPE, decode step.
  Case c = app(3, 1, 70, 8, 2, 64, 1, seed++);
  c.causal = true;
  cases.push_back(c);
  // e5m2 bf16, paged 16, per tensor, NeoX.
  c = app(3, 1, 70, 8, 2, 64, 1, seed++);
  c.e5m2 = c.bf16 = c.causal = true;
  c.layout = kPagedNhd;
  c.page_size = 16;
  c.descale = 1;
  c.rotary = 1;
  cases.push_back(c);
  // e4m3 bf16, paged 5 (HND), per (b, h) transposed, GPT-J, 3 splits.
  c = app(2, 1, 60, 4, 2, 64, 1, seed++);
  c.bf16 = c.causal = true;
  c.layout = kPagedHnd;
  c.page_size = 5;
  c.descale_transposed = true;
  c.rotary = 2;
  c.splits = 3;
  cases.push_back(c);
  // e5m2 fp16, pointer arrays, no descales, NeoX on 32 of 128, 4 new tokens.
  c = app(2, 4, 50, 4, 1, 128, 4, seed++);
  c.e5m2 = c.causal = true;
  c.layout = kPtrs;
  c.descale = 0;
  c.rotary = 1;
  c.rotary_dim = 32;
  cases.push_back(c);
  std::vector<Case> &c90 = *later;
  c90.clear();
  // sm_90: chunked prefill (40 new tokens, causal, GQA 2: three m-blocks),
  // paged 16, GPT-J, splits cutting the new tokens; and fp16 paged 5.
  c = app(2, 40, 110, 4, 2, 64, 40, seed++);
  c.causal = true;
  c.layout = kPagedNhd;
  c.page_size = 16;
  c.rotary = 2;
  c.splits = 4;
  c90.push_back(c);
  c = app(2, 3, 40, 2, 2, 64, 3, seed++);
  c.e5m2 = c.bf16 = c.causal = true;
  c.layout = kPagedNhd;
  c.page_size = 5;
  c.rotary = 1;
  c90.push_back(c);
  // O in column slices (dv 320: two CTAs write the same whole rows), direct.
  c = app(1, 1, 40, 2, 1, 64, 2, seed++);
  c.dv = 320;
  c.direct = true;
  c90.push_back(c);
  // Beyond e4m3's range: |x / descale| up to ~10^4, satfinite clamps to
  // +-448 (the host quantisation does the same).
  c = app(2, 2, 40, 2, 1, 64, 2, seed++);
  c.descale = 0;
  c.new_scale = 2000;
  c.causal = true;
  c90.push_back(c);
  // Descales 0 (+-448 / +-57344), +inf (+-0), NaN (NaN) and
  // negative (the sign flipped): the bytes only.
  for (int e5 = 0; e5 < 2; ++e5) {
    c = app(3, 1, 40, 2, 2, 64, 2, seed++);
    c.e5m2 = e5;
    c.odd_descales = true;
    c.lens = {0, 0, 0};  // old rows would be quantised with these descales too
    c90.push_back(c);
  }
  return cases;
}

void test_append(void **) {
  need_runtime();
  std::vector<Case> later;
  run_all(g_rt89, append_cases(&later));
  run_all(g_rt90, later);
}

// The 16-bit decode PTX is the same for a 0.4-sized desc's config and a
// current one's (kv_dtype 0), and holds no fp8 conversion.
void test_old_sizes(void **) {
  need_runtime();
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = FA_DTYPE_BF16;
  desc.head_dim = 128;
  desc.num_heads_q = 8;
  desc.num_heads_kv = 2;
  fa_config *a = nullptr, *b = nullptr;
  fa_config_desc old = desc;
  old.struct_size = FA_CONFIG_DESC_SIZE_0_4;
  assert_int_equal(fa_config_create(&desc, &a), FA_SUCCESS);
  assert_int_equal(fa_config_create(&old, &b), FA_SUCCESS);
  for (int sm : {80, 89, 90}) {
    size_t na = 0, nb = 0;
    assert_int_equal(fa_generate(a, FA_KERNEL_DECODE, sm, nullptr, 0, &na), FA_SUCCESS);
    assert_int_equal(fa_generate(b, FA_KERNEL_DECODE, sm, nullptr, 0, &nb), FA_SUCCESS);
    std::string pa(na + 1, '\0'), pb(nb + 1, '\0');
    fa_generate(a, FA_KERNEL_DECODE, sm, &pa[0], pa.size(), &na);
    fa_generate(b, FA_KERNEL_DECODE, sm, &pb[0], pb.size(), &nb);
    assert_true(pa == pb);
    assert_null(std::strstr(pa.c_str(), "e4m3"));
  }
  fa_config_destroy(a);
  fa_config_destroy(b);
}

// Mode (b) (KernelPolicy::decode_fp8_mma: Q and P in e4m3 on the fp8
// mma) on the SMs where the fp8 mma is native, sm_89 and sm_120: the
// formats, layouts, features and append cases, each checked by name
// ("_f8mma") against fp64 under the tolerance run_case derives for it;
// head_dim 80 (not whole k32 steps) and sm_90 (no native fp8 mma.sync)
// fall back to mode (a).
void test_fp8_mma(void **) {
  need_runtime();
  std::vector<Case> cases = format_cases(), more = layout_cases(), later;
  for (const std::vector<Case> &v : {more, feature_cases(), append_cases(&later), later})
    cases.insert(cases.end(), v.begin(), v.end());
  for (Case &c : cases) c.fp8_mma = true;
  Case a = base(2, 2, 70, 4, 2, 80, 120);  // d 80: mode (a)
  a.causal = true;
  std::string failures;
  for (fa_runtime *rt : {g_rt89, g_rt120}) {
    const fa::test::PolicyScope policy(rt, &fa::KernelPolicy::decode_fp8_mma);
    std::printf("  sm_%d\n", rt == g_rt89 ? 89 : 120);
    for (const Case &c : cases) {
      const std::string e = run_case(rt, c);
      if (!e.empty()) failures += c.describe() + ":\n" + e;
    }
    const std::string e = run_case(rt, a);
    if (!e.empty()) failures += a.describe() + ":\n" + e;
  }
  {
    const fa::test::PolicyScope policy(g_rt90, &fa::KernelPolicy::decode_fp8_mma);
    const std::string e = run_case(g_rt90, format_cases()[0]);
    if (!e.empty()) failures += "sm_90: " + e;
  }
  report(failures);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_formats),  cmocka_unit_test(test_layouts),
      cmocka_unit_test(test_features), cmocka_unit_test(test_sectors_halved),
      cmocka_unit_test(test_statuses), cmocka_unit_test(test_old_sizes),
      cmocka_unit_test(test_append),   cmocka_unit_test(test_fp8_mma),
  };
  return cmocka_run_group_tests_name("fp8_kv", tests, setup, teardown);
}

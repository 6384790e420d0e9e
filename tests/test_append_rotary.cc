// KV append with rotary embedding in fa_decode (fa_decode_args.k_new, since
// 0.5; as FlashAttention's flash_attn_with_kvcache) on the emulator, through
// the shared decode runner: the new keys/values are random, Q and the new K
// are rotated on the host by a separate rotate-then-copy (ref::rope_row),
// the fp64 reference attends over that cache, and afterwards every cache
// element of every sequence must hold exactly the rotate-then-copy bits
// (rows past the new length untouched). Outputs and workspace poisoned.
// - NeoX and GPT-J pairing, rotary_dim < head_dim, fp32 and 16-bit tables,
//   fp16 and bf16, explicit per-token positions, non-causal queries (all at
//   cache_seqlens, FlashAttention's rule), no rotary (append only);
// - every KV layout (contiguous, paged with per-row and per-tile lookups,
//   NHD/HND, pointer arrays), GQA, splits that cut the new tokens, chunked
//   prefill (seqlen_new 40 over several m-blocks), an empty cache, the
//   partial states alone, tree masks and sinks on top;
// - the kernel that ran is the tensor-core decode with the append;
// - the host checks of the new fields; a decode without k_new is the PTX of
//   fa_generate (the feature costs nothing when off).
#include "support/cmocka.hh"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support/emu_runtime.h"
#include "support/numerics.h"

namespace {

using fa::test::DecodeCase;
using fa::test::g_rt;
using fa::test::KvCase;
using fa::test::need_runtime;

KvCase paged(int page_size, bool hnd = false) {
  KvCase k;
  k.layout = FA_KV_PAGED;
  k.page_size = page_size;
  k.hnd = hnd;
  k.seed = 5;
  return k;
}

void run_all(const std::vector<DecodeCase> &cases) {
  std::string failures;
  for (const DecodeCase &c : cases) {
    const std::string e = fa::test::run_decode(g_rt, c);
    if (!e.empty()) failures += c.describe() + ":\n" + e;
  }
  if (!failures.empty()) {
    print_error("%s", failures.c_str());
    fail();
  }
}

DecodeCase base() {
  DecodeCase c;
  c.batch = 3;
  c.seqlen_q = 1;
  c.seqlen_new = 1;
  c.seqlen_k_max = 80;
  c.cache_seqlens = {70, 9, 0};  // before the append
  c.heads_q = 8;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.rotary_dim = 64;
  c.causal = true;
  c.seed = 31;
  return c;
}

void test_append_decode(void **) {
  need_runtime();
  std::vector<DecodeCase> cases;
  DecodeCase c = base();
  cases.push_back(c);           // NeoX, full rotary, fp32 table, contiguous
  c.rotary_interleaved = true;  // GPT-J pairs, paged per-row lookups, bf16
  c.bf16 = true;
  c.kv = paged(5);
  c.seed = 32;
  cases.push_back(c);
  c = base();  // partial rotary (32 of 128), 16-bit table, paged tiles HND, splits
  c.head_dim = 128;
  c.rotary_dim = 32;
  c.rotary_half_table = true;
  c.kv = paged(16, true);
  c.num_splits = 3;
  c.seed = 33;
  cases.push_back(c);
  c = base();  // pointer arrays, speculative: 4 new tokens, explicit positions, tree
  c.kv.layout = FA_KV_PTR_ARRAY;
  c.seqlen_q = c.seqlen_new = 4;
  c.rotary_positions = true;
  c.causal = false;
  c.tree = {1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1};
  c.tree_shared = true;
  c.seed = 34;
  cases.push_back(c);
  c = base();  // non-causal: every query rotated at cache_seqlens; no rotary dims off
  c.causal = false;
  c.seqlen_q = c.seqlen_new = 3;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 96;
  c.head_dim_v = 64;
  c.rotary_dim = 48;
  c.sinks = {0.5f, -1.0f};
  c.seed = 35;
  cases.push_back(c);
  c = base();  // append only, no rotary; batch-invariant splits
  c.rotary_dim = 0;
  c.batch_invariant = true;
  c.seed = 36;
  cases.push_back(c);
  c = base();  // ALiBi on top: the key distances count the appended tokens
  c.seqlen_q = c.seqlen_new = 3;
  c.alibi = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03f, 0.02f, 0.01f, 0.005f};
  c.kv = paged(16);
  c.num_splits = 2;
  c.seed = 37;
  cases.push_back(c);
  run_all(cases);
}

// Chunked prefill: 40 new tokens per sequence (three m-blocks of packed
// rows with GQA 2), splits that cut them, windows, and the partial states.
void test_append_prefill(void **) {
  need_runtime();
  std::vector<DecodeCase> cases;
  DecodeCase c = base();
  c.batch = 2;
  c.seqlen_q = c.seqlen_new = 40;
  c.seqlen_k_max = 120;
  c.cache_seqlens = {50, 0};
  c.heads_q = 4;
  c.heads_kv = 2;
  c.num_splits = 4;
  c.kv = paged(16);
  c.seed = 41;
  cases.push_back(c);
  c.kv = {};
  c.window_left = 20;
  c.rotary_interleaved = true;
  c.partials_only = true;
  c.seed = 42;
  cases.push_back(c);
  run_all(cases);
}

// The decode kernel that ran (o.data = 0: the last kernel is the decode).
void test_append_kernel(void **) {
  need_runtime();
  DecodeCase c = base();
  c.partials_only = true;
  setenv("FLASHATTN_EMU_PROFILE", "1", 1);
  const std::string e = fa::test::run_decode(g_rt, c);
  unsetenv("FLASHATTN_EMU_PROFILE");
  assert_string_equal(e.c_str(), "");
  fa_emu_profile prof = FA_EMU_PROFILE_INIT;
  assert_int_equal(fa_emulator_profile(g_rt, &prof), FA_SUCCESS);
  std::printf("  kernel %s\n", prof.kernel);
  assert_non_null(std::strstr(prof.kernel, "fa_decode_mma_"));
  assert_non_null(std::strstr(prof.kernel, "_append_ropeneox"));
}

fa_config *config(int d) {
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.head_dim = d;
  desc.num_heads_q = 4;
  desc.num_heads_kv = 2;
  fa_config *cfg = nullptr;
  assert_int_equal(fa_config_create(&desc, &cfg), FA_SUCCESS);
  return cfg;
}

void expect(fa_status got, const fa_decode_args &a, fa_config *cfg, const char *needle) {
  (void)a;
  (void)cfg;
  if (got != FA_ERROR_INVALID_ARGUMENT || std::strstr(fa_last_error(), needle) == nullptr) {
    print_error("want INVALID_ARGUMENT with '%s', got %s: %s\n", needle, fa_status_string(got),
                fa_last_error());
    fail();
  }
}

// Host checks (no kernel runs: every case is rejected first).
void test_append_bad_args(void **) {
  need_runtime();
  fa_config *cfg = config(64);
  fa_decode_args good = FA_DECODE_ARGS_INIT;
  good.batch = 1;
  good.seqlen_q = 1;
  good.seqlen_k_max = 16;
  const uint64_t p = 1 << 20;  // never dereferenced
  for (fa_tensor *t : {&good.q, &good.k_cache, &good.v_cache, &good.k_new, &good.v_new}) {
    t->data = p;
    t->stride[0] = 1024;
    t->stride[1] = 128;
    t->stride[2] = 64;
    t->stride[3] = 1;
  }
  good.cache_seqlens = p;
  good.workspace = p;
  good.workspace_size = 1 << 20;
  good.seqlen_new = 1;
  good.rotary_dim = 64;
  good.rotary_cos = good.rotary_sin = p;
  good.seqlen_ro = 16;
  struct Bad {
    const char *needle;
    void (*edit)(fa_decode_args *);
  };
  const Bad bad[] = {
      {"seqlen_new", [](fa_decode_args *a) { a->seqlen_new = 0; }},
      {"seqlen_new", [](fa_decode_args *a) { a->seqlen_new = 17; }},
      {"v_new.data", [](fa_decode_args *a) { a->v_new.data = 0; }},
      {"k_new.data", [](fa_decode_args *a) { a->k_new.data = 8; }},
      // (rotary_dim 8, rotary without k_new: append.cases, test_features)
      {"rotary_dim", [](fa_decode_args *a) { a->rotary_dim = 80; }},
      {"rotary_cos", [](fa_decode_args *a) { a->rotary_cos = 0; }},
      {"aligned", [](fa_decode_args *a) { a->rotary_sin = p + 2; }},
      {"seqlen_ro", [](fa_decode_args *a) { a->seqlen_ro = 0; }},
      {"rotary_interleaved", [](fa_decode_args *a) { a->rotary_interleaved = 2; }},
      {"rotary_dtype", [](fa_decode_args *a) { a->rotary_dtype = FA_DTYPE_BF16; }},
      {"rotary_reserved", [](fa_decode_args *a) { a->rotary_reserved = 1; }},
      {"rotary_positions", [](fa_decode_args *a) { a->rotary_positions = p + 1; }},
      {"rotary_positions_stride", [](fa_decode_args *a) { a->rotary_positions_stride = 4; }},
      {"rotary field is set", [](fa_decode_args *a) { a->rotary_dim = 0; }},
  };
  for (const Bad &b : bad) {
    fa_decode_args a = good;
    b.edit(&a);
    expect(fa_decode(g_rt, cfg, &a, nullptr), a, cfg, b.needle);
  }
  fa_config_destroy(cfg);
}

// Off, the decode kernel is fa_generate's module (byte for byte); with the
// append another module, whose name says so.
void test_append_ptx(void **) {
  fa_config *cfg = config(64);
  auto gen = [&](const fa_generate_options *o, int sm = 80) {
    size_t n = 0;
    assert_int_equal(fa_generate_for(cfg, FA_KERNEL_DECODE, sm, o, nullptr, 0, &n), FA_SUCCESS);
    std::string s(n + 1, '\0');
    assert_int_equal(fa_generate_for(cfg, FA_KERNEL_DECODE, sm, o, s.data(), s.size(), &n),
                     FA_SUCCESS);
    s.resize(n);
    return s;
  };
  size_t n = 0;
  assert_int_equal(fa_generate(cfg, FA_KERNEL_DECODE, 80, nullptr, 0, &n), FA_SUCCESS);
  std::string plain(n + 1, '\0');
  assert_int_equal(fa_generate(cfg, FA_KERNEL_DECODE, 80, plain.data(), plain.size(), &n),
                   FA_SUCCESS);
  plain.resize(n);
  fa_generate_options o = FA_GENERATE_OPTIONS_INIT;
  assert_true(gen(&o) == plain);
  o.append_kv = 1;
  const std::string app = gen(&o);
  assert_true(app != plain && app.find("_append") != std::string::npos);
  o.rotary = 2;
  o.rotary_dtype = FA_DTYPE_FP16;
  const std::string rope = gen(&o);
  assert_true(rope.find("_append_ropeint16") != std::string::npos);
  fa_config_destroy(cfg);
  // Into an fp8 cache (since the fp8 append): the quantising store; still
  // UNSUPPORTED below sm_89 (no fp8 cvt).
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.head_dim = 64;
  desc.num_heads_q = 4;
  desc.num_heads_kv = 2;
  desc.kv_dtype = FA_DTYPE_FP8_E4M3;
  assert_int_equal(fa_config_create(&desc, &cfg), FA_SUCCESS);
  o.rotary = 0;
  o.rotary_dtype = 0;
  const std::string fp8 = gen(&o, 90);
  assert_true(fp8.find("_kve4m3_append") != std::string::npos);
  assert_true(fp8.find("cvt.rn.satfinite.e4m3x2.f32") != std::string::npos);
  n = 0;
  assert_int_equal(fa_generate_for(cfg, FA_KERNEL_DECODE, 86, &o, nullptr, 0, &n),
                   FA_ERROR_UNSUPPORTED);
  o.append_kv = 0;
  const std::string fp8_plain = gen(&o, 89);
  assert_true(fp8_plain.find("satfinite") == std::string::npos);
  fa_config_destroy(cfg);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_append_decode), cmocka_unit_test(test_append_prefill),
      cmocka_unit_test(test_append_kernel), cmocka_unit_test(test_append_bad_args),
      cmocka_unit_test(test_append_ptx),
  };
  return cmocka_run_group_tests_name("append_rotary", tests, fa::test::emu_runtime_setup,
                                     fa::test::emu_runtime_teardown);
}

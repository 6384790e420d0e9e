// Speculative-decoding tree masks in fa_decode (fa_decode_args.tree_mask)
// on the emulator, against the fp64 reference (tools/common/reference.cc
// with the mask) through the shared decode runner (poisoned O, LSE and
// workspace; partial states checked too):
// - random trees (each new token sees its ancestors and itself) per
//   sequence, and one tree shared by the batch; arbitrary bit patterns with
//   and without causal (the rules intersect); rows that see no key;
// - every KV layout (contiguous, paged with page sizes 5 and 16, pointer
//   arrays), GQA groups, seqlen_q past 32 (two words per row), padded rows,
//   cache_seqlens shorter than seqlen_q, forced and automatic splits, the
//   partial states alone, batch-invariant splits; the tensor-core and the
//   scalar decode kernels;
// - a chain tree without causal gives causal's output bit for bit;
// - the host checks of the new fields; 0.3- and 0.2-sized args still work;
// - a decode kernel without the mask is the PTX of fa_generate (the mask
//   costs nothing when off); with it, another module.
#include "support/cmocka.hh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reference.h"
#include "support/policy.h"
#include "support/emu_runtime.h"
#include "support/numerics.h"

namespace {

using fa::test::DecodeCase;
using fa::test::KvCase;

using fa::test::g_rt;
using fa::test::need_runtime;

// A random tree over n new tokens, in topological order (a parent precedes
// its children; token 0 hangs off the cached prefix, later ones off any
// earlier token or the prefix): bit (i, j) = j is i or an ancestor of i.
std::vector<uint8_t> random_tree(int n, std::mt19937 &gen) {
  std::vector<int> parent(n, -1);
  std::vector<uint8_t> m(size_t(n) * n, 0);
  for (int i = 0; i < n; ++i) {
    if (i > 0) parent[i] = std::uniform_int_distribution<int>(-1, i - 1)(gen);
    for (int j = i; j >= 0; j = parent[j]) m[size_t(i) * n + j] = 1;
  }
  return m;
}

// Random trees for each sequence of c (or one shared).
void add_trees(DecodeCase *c, uint32_t seed, bool shared = false) {
  std::mt19937 gen(seed);
  c->tree.clear();
  c->tree_shared = shared;
  for (int b = 0; b < (shared ? 1 : c->batch); ++b) {
    const std::vector<uint8_t> t = random_tree(c->seqlen_q, gen);
    c->tree.insert(c->tree.end(), t.begin(), t.end());
  }
}

KvCase paged(int page_size, uint32_t seed) {
  KvCase k;
  k.layout = FA_KV_PAGED;
  k.page_size = page_size;
  k.seed = seed;
  return k;
}

KvCase ptrs() {
  KvCase k;
  k.layout = FA_KV_PTR_ARRAY;
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

// The case list of both kernels.
std::vector<DecodeCase> tree_cases() {
  std::vector<DecodeCase> cases;
  DecodeCase c;
  // GQA 4, 5 new tokens, three sequences: a long one, one shorter than a
  // key tile, one shorter than seqlen_q (its first new tokens are not in
  // the cache).
  c.batch = 3;
  c.seqlen_q = 5;
  c.seqlen_k_max = 150;
  c.cache_seqlens = {150, 9, 3};
  c.heads_q = 8;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.seed = 21;
  add_trees(&c, 1);
  cases.push_back(c);
  // The same over a paged cache (pages of 5: per-row lookups) with 3
  // splits, and causal (a topological tree is unchanged by it).
  c.kv = paged(5, 3);
  c.num_splits = 3;
  c.causal = true;
  c.seed = 22;
  add_trees(&c, 2);
  cases.push_back(c);
  // Pointer arrays, bf16, one tree for the batch in padded rows.
  c = {};
  c.batch = 2;
  c.seqlen_q = 7;
  c.seqlen_k_max = 90;
  c.cache_seqlens = {90, 40};
  c.heads_q = 4;
  c.heads_kv = 1;
  c.head_dim = 128;
  c.bf16 = true;
  c.kv = ptrs();
  c.tree_pad_words = 2;
  c.batch_invariant = true;
  c.seed = 23;
  add_trees(&c, 3, /*shared=*/true);
  cases.push_back(c);
  // seqlen_q 40 (two words per row, rows spanning several m-blocks), paged
  // 16 (per-tile lookups), forced splits that cut the new tokens, softcap.
  c = {};
  c.batch = 2;
  c.seqlen_q = 40;
  c.seqlen_k_max = 128;
  c.cache_seqlens = {128, 61};
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.softcap = 20.0f;
  c.num_splits = 4;
  c.kv = paged(16, 5);
  c.seed = 24;
  add_trees(&c, 4);
  cases.push_back(c);
  // Arbitrary bits (not a tree: some queries see later tokens and not
  // themselves) without causal, then with causal (the intersection), then
  // a window; partial states alone for one.
  c = {};
  c.batch = 2;
  c.seqlen_q = 6;
  c.seqlen_k_max = 70;
  c.cache_seqlens = {70, 6};  // sequence 1 holds only the new tokens
  c.heads_q = 3;
  c.heads_kv = 1;
  c.head_dim = 32;
  c.seed = 25;
  {
    std::mt19937 gen(6);
    c.tree.resize(size_t(c.batch) * 36);
    for (uint8_t &x : c.tree) x = std::uniform_int_distribution<int>(0, 1)(gen);
    // Sequence 1's query 2 sees nothing (no prefix, no bit): O = 0, LSE = -inf.
    for (int j = 0; j < 6; ++j) c.tree[36 + 2 * 6 + j] = 0;
  }
  cases.push_back(c);
  c.causal = true;
  c.seed = 26;
  cases.push_back(c);
  c.causal = false;
  c.window_left = 20;
  c.partials_only = true;
  c.num_splits = 2;
  c.seed = 27;
  cases.push_back(c);
  // seqlen_q 1 (a mask of one bit): cleared, the new token is hidden from
  // itself; sequence 1 then sees no key.
  c = {};
  c.batch = 2;
  c.seqlen_q = 1;
  c.seqlen_k_max = 33;
  c.cache_seqlens = {33, 1};
  c.heads_q = 4;
  c.heads_kv = 4;
  c.head_dim = 64;
  c.tree = {0, 0};
  c.seed = 28;
  cases.push_back(c);
  return cases;
}

void test_tree_tc(void **) {
  need_runtime();
  run_all(tree_cases());
}

void test_tree_scalar(void **) {
  need_runtime();
  const fa::test::PolicyScope policy(g_rt, &fa::KernelPolicy::scalar_decode);
  run_all(tree_cases());
}

// Device memory freed at scope exit.
struct Mem {
  std::vector<uint64_t> ptrs;
  ~Mem() {
    for (uint64_t p : ptrs) fa_free(g_rt, p);
  }
  template <typename T>
  uint64_t upload(const std::vector<T> &v) {
    uint64_t p = 0;
    assert_int_equal(fa_malloc(g_rt, v.size() * sizeof(T), &p), FA_SUCCESS);
    ptrs.push_back(p);
    assert_int_equal(fa_memcpy_htod(g_rt, p, v.data(), v.size() * sizeof(T)), FA_SUCCESS);
    return p;
  }
  uint64_t poisoned(size_t bytes) {
    uint64_t p = 0;
    assert_int_equal(fa_malloc(g_rt, bytes, &p), FA_SUCCESS);
    ptrs.push_back(p);
    assert_int_equal(fa_memset(g_rt, p, 0xFF, bytes), FA_SUCCESS);
    return p;
  }
};

fa_config *config(bool causal, int hq, int hkv, int d) {
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.head_dim = d;
  desc.num_heads_q = hq;
  desc.num_heads_kv = hkv;
  desc.causal = causal;
  fa_config *cfg = nullptr;
  assert_int_equal(fa_config_create(&desc, &cfg), FA_SUCCESS);
  return cfg;
}

// A decode problem on random fp16 data with its outputs poisoned.
struct Problem {
  Mem mem;
  fa_decode_args a = FA_DECODE_ARGS_INIT;
  int batch = 2, sq = 6, skmax = 100, hq = 4, hkv = 2, d = 64;
  size_t o_bytes = 0, lse_bytes = 0;
  Problem() {
    std::mt19937 gen(99);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto half = [&](size_t n) {
      std::vector<uint16_t> v(n);
      for (uint16_t &x : v) x = fa::ref::f32_to_f16(nd(gen));
      return v;
    };
    a.batch = batch;
    a.seqlen_q = sq;
    a.seqlen_k_max = skmax;
    a.num_splits = 2;
    a.q = {mem.upload(half(size_t(batch) * sq * hq * d)), {sq * hq * d, hq * d, d, 1}};
    const int64_t ks = int64_t(skmax) * hkv * d;
    a.k_cache = {mem.upload(half(size_t(batch) * ks)), {ks, hkv * d, d, 1}};
    a.v_cache = {mem.upload(half(size_t(batch) * ks)), {ks, hkv * d, d, 1}};
    a.cache_seqlens = mem.upload(std::vector<int32_t>{skmax, 37});
    o_bytes = size_t(batch) * sq * hq * d * 2;
    lse_bytes = size_t(batch) * hq * sq * 4;
    a.o = {mem.poisoned(o_bytes), {sq * hq * d, hq * d, d, 1}};
    a.lse = mem.poisoned(lse_bytes);
  }
  void with_workspace(const fa_config *cfg) {
    size_t ws = 0;
    assert_int_equal(fa_decode_workspace_size(g_rt, cfg, &a, &ws, nullptr), FA_SUCCESS);
    a.workspace = mem.poisoned(ws);
    a.workspace_size = ws;
  }
  std::vector<uint8_t> out() {
    std::vector<uint8_t> v(o_bytes + lse_bytes);
    assert_int_equal(fa_memcpy_dtoh(g_rt, v.data(), a.o.data, o_bytes), FA_SUCCESS);
    assert_int_equal(fa_memcpy_dtoh(g_rt, v.data() + o_bytes, a.lse, lse_bytes), FA_SUCCESS);
    return v;
  }
};

// A chain (token i sees tokens 0..i) without causal is causal decoding:
// the same output bits, through both kernels.
void test_chain_tree_is_causal(void **) {
  need_runtime();
  for (int scalar = 0; scalar < 2; ++scalar) {
    const fa::test::PolicyScope policy(g_rt, &fa::KernelPolicy::scalar_decode, scalar != 0);
    Problem p;
    fa_config *causal = config(true, p.hq, p.hkv, p.d), *plain = config(false, p.hq, p.hkv, p.d);
    p.with_workspace(causal);
    assert_int_equal(fa_decode(g_rt, causal, &p.a, nullptr), FA_SUCCESS);
    const std::vector<uint8_t> want = p.out();
    std::vector<uint8_t> chain(size_t(p.sq) * p.sq, 0);
    for (int i = 0; i < p.sq; ++i)
      for (int j = 0; j <= i; ++j) chain[size_t(i) * p.sq + j] = 1;
    const std::vector<uint32_t> packed = fa::test::pack_tree_mask(chain, p.sq, p.sq, 1);
    p.a.tree_mask = p.mem.upload(packed);
    p.a.tree_mask_stride[0] = 0;
    p.a.tree_mask_stride[1] = 4;
    assert_int_equal(fa_memset(g_rt, p.a.o.data, 0xFF, p.o_bytes), FA_SUCCESS);
    assert_int_equal(fa_memset(g_rt, p.a.lse, 0xFF, p.lse_bytes), FA_SUCCESS);
    assert_int_equal(fa_decode(g_rt, plain, &p.a, nullptr), FA_SUCCESS);
    const std::vector<uint8_t> got = p.out();
    assert_memory_equal(got.data(), want.data(), want.size());
    // Without the mask and without causal the output differs (the test
    // would notice a mask that did nothing).
    p.a.tree_mask = 0;
    p.a.tree_mask_stride[1] = 0;
    assert_int_equal(fa_decode(g_rt, plain, &p.a, nullptr), FA_SUCCESS);
    assert_memory_not_equal(p.out().data(), want.data(), want.size());
    fa_config_destroy(causal);
    fa_config_destroy(plain);
  }
}

// The host checks of tree_mask and its strides: INVALID_ARGUMENT with a
// message naming the field, nothing written; 0.3/0.2-sized args ignore the
// bytes past their struct.
void test_tree_bad_args(void **) {
  need_runtime();
  Problem p;
  fa_config *cfg = config(false, p.hq, p.hkv, p.d);
  p.with_workspace(cfg);
  const uint64_t mask = p.mem.upload(std::vector<uint32_t>(64, 0xFFFFFFFFu));
  struct Bad {
    const char *what, *needle;
    uint64_t mask;
    int64_t s0, s1;
  } bad[] = {
      {"stride without mask", "tree_mask is 0", 0, 0, 4},
      {"batch stride without mask", "tree_mask is 0", 0, 8, 0},
      {"unaligned mask", "not 4-byte aligned", mask + 2, 0, 4},
      {"row stride 0", "tree_mask_stride[1]", mask, 0, 0},
      {"row stride not words", "tree_mask_stride[1]", mask, 0, 2},
      {"row stride odd", "tree_mask_stride[1]", mask, 0, 6},
      {"negative batch stride", "tree_mask_stride[0]", mask, -4, 4},
      {"batch stride not words", "tree_mask_stride[0]", mask, 6, 4},
  };
  for (const Bad &b : bad) {
    p.a.tree_mask = b.mask;
    p.a.tree_mask_stride[0] = b.s0;
    p.a.tree_mask_stride[1] = b.s1;
    assert_int_equal(fa_decode(g_rt, cfg, &p.a, nullptr), FA_ERROR_INVALID_ARGUMENT);
    std::printf("  %s: %s\n", b.what, fa_last_error());
    if (!std::strstr(fa_last_error(), b.needle)) {
      print_error("%s: message lacks \"%s\"\n", b.what, b.needle);
      fail();
    }
  }
  // seqlen_q 33 needs two words per row.
  p.a.seqlen_q = 33;
  p.a.tree_mask = mask;
  p.a.tree_mask_stride[0] = 0;
  p.a.tree_mask_stride[1] = 4;
  assert_int_equal(fa_decode(g_rt, cfg, &p.a, nullptr), FA_ERROR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(fa_last_error(), "= 8"));
  p.a.seqlen_q = p.sq;
  for (uint8_t x : p.out()) assert_int_equal(x, 0xFF);  // nothing written
  // A caller built against 0.3 or 0.2: whatever follows its struct is
  // not read (here a mask that would fail the checks).
  p.a.tree_mask = mask + 1;
  p.a.tree_mask_stride[1] = 3;
  for (size_t size : {size_t(FA_DECODE_ARGS_SIZE_0_3), size_t(FA_DECODE_ARGS_SIZE_0_2)}) {
    fa_decode_args old = p.a;
    old.struct_size = size;
    if (size == FA_DECODE_ARGS_SIZE_0_2) {
      std::memset(&old.kv, 0x5A, sizeof old.kv);
      old.batch_invariant = 7;
    }
    assert_int_equal(fa_decode(g_rt, cfg, &old, nullptr), FA_SUCCESS);
    size_t ws = 0;
    assert_int_equal(fa_decode_workspace_size(g_rt, cfg, &old, &ws, nullptr), FA_SUCCESS);
  }
  fa_config_destroy(cfg);
}

std::string generate(const fa_config *cfg, int tree, int sm = 80) {
  fa_generate_options o = FA_GENERATE_OPTIONS_INIT;
  o.tree_mask = tree;
  size_t n = 0;
  assert_int_equal(fa_generate_for(cfg, FA_KERNEL_DECODE, sm, &o, nullptr, 0, &n), FA_SUCCESS);
  std::string s(n + 1, '\0');
  assert_int_equal(fa_generate_for(cfg, FA_KERNEL_DECODE, sm, &o, s.data(), s.size(), &n),
                   FA_SUCCESS);
  s.resize(n);
  return s;
}

std::string generate_plain(const fa_config *cfg, int sm = 80) {
  size_t n = 0;
  assert_int_equal(fa_generate(cfg, FA_KERNEL_DECODE, sm, nullptr, 0, &n), FA_SUCCESS);
  std::string s(n + 1, '\0');
  assert_int_equal(fa_generate(cfg, FA_KERNEL_DECODE, sm, s.data(), s.size(), &n), FA_SUCCESS);
  s.resize(n);
  return s;
}

// Off, the decode kernels are fa_generate's (the mask adds nothing); on,
// another module that reads the mask parameters; both kernels.
void test_tree_ptx(void **) {
  for (int scalar = 0; scalar < 2; ++scalar) {
    if (scalar) setenv("FLASHATTN_SCALAR_DECODE", "1", 1);
    fa_config *cfg = config(true, 8, 2, 128);
    const std::string plain = generate_plain(cfg), off = generate(cfg, 0), on = generate(cfg, 1);
    assert_true(off == plain);
    assert_true(on != plain);
    assert_non_null(std::strstr(on.c_str(), "tree mask among the new tokens"));
    assert_null(std::strstr(off.c_str(), "tree mask"));
    assert_non_null(std::strstr(on.c_str(), "_tree_param"));
    fa_config_destroy(cfg);
    unsetenv("FLASHATTN_SCALAR_DECODE");
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tree_tc),
      cmocka_unit_test(test_tree_scalar),
      cmocka_unit_test(test_chain_tree_is_causal),
      cmocka_unit_test(test_tree_bad_args),
      cmocka_unit_test(test_tree_ptx),
  };
  return cmocka_run_group_tests(tests, fa::test::emu_runtime_setup, fa::test::emu_runtime_teardown);
}

// KV cache layouts (flashattn.h, fa_kv_layout) on the emulator against the
// fp64 reference: paged caches (NHD and HND strides, page sizes from 1 to
// past a key tile, shuffled pages, spare pages of NaN, a page shared by two
// sequences, cache_seqlens of 0, 1 and ending inside a page), pointer
// arrays, through fa_decode and through fa_launch (chunked prefill with
// seqused_k); batch-invariant decode compared bit for bit across batches;
// the host checks of every new argument; 0.2-sized args still accepted.
#include "support/cmocka.hh"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reference.h"
#include "support/emu_runtime.h"
#include "support/numerics.h"

namespace {

using fa::test::DecodeCase;
using fa::test::KvCase;

using fa::test::g_rt;
using fa::test::need_runtime;

bool quick() {
  const char *q = std::getenv("FA_TEST_QUICK");
  return q && q[0] == '1';
}

KvCase paged(int page_size, bool hnd = false, bool share = false, uint32_t seed = 7) {
  KvCase k;
  k.layout = FA_KV_PAGED;
  k.page_size = page_size;
  k.hnd = hnd;
  k.share_prefix = share;
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

// Decode over page sizes x GQA x seqlen_q x head_dim x dtype, subsampled
// (each page size meets every other dimension over the list).
void test_decode_paged(void **) {
  need_runtime();
  std::vector<DecodeCase> cases;
  const int page_sizes[] = {1, 3, 8, 16, 64, 256};
  const int groups[] = {1, 4, 8};
  const int sqs[] = {1, 2, 5};
  const int dims[] = {64, 128, 256};
  int i = 0;
  for (int ps : page_sizes)
    for (int gi = 0; gi < 3; ++gi) {
      if (quick() && gi != (i % 3)) {
        ++i;
        continue;
      }
      DecodeCase c;
      c.batch = 3;
      c.seqlen_q = sqs[(i + gi) % 3];
      c.heads_kv = 2;
      c.heads_q = 2 * groups[gi];
      c.head_dim = dims[(i / 3 + gi) % 3];
      c.bf16 = (i % 2) == 1;
      c.causal = (i % 4) != 3;
      c.seqlen_k_max = 150 + 37 * (i % 3);
      // Full, one key, and a length that ends inside a page.
      c.cache_seqlens = {c.seqlen_k_max, 1, std::max(0, c.seqlen_k_max - ps / 2 - 5)};
      if (i % 5 == 2) c.cache_seqlens[1] = 0;
      c.kv = paged(ps, /*hnd=*/(i % 3) == 1, /*share=*/(i % 2) == 0, 11 + i);
      c.seed = 100 + i;
      cases.push_back(c);
      ++i;
    }
  run_all(cases);
}

// The page lookup's three forms, by page size: one per key tile (a
// multiple of the tile), per row by shift and mask (a power of two, from
// KvPages::page_shift), per row by div / rem (any other).
void test_page_lookup_forms(void **) {
  fa_config_desc desc = FA_CONFIG_DESC_INIT;
  desc.dtype = FA_DTYPE_BF16;
  desc.head_dim = 128;
  desc.num_heads_q = 8;
  desc.num_heads_kv = 2;
  fa_config *cfg = nullptr;
  assert_int_equal(fa_config_create(&desc, &cfg), FA_SUCCESS);
  auto ptx_of = [&](fa_kernel_kind kind, int sm, int page_size) {
    fa_generate_options o;
    std::memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.kv_layout = FA_KV_PAGED;
    o.page_size = page_size;
    size_t n = 0;
    assert_int_equal(fa_generate_for(cfg, kind, sm, &o, nullptr, 0, &n), FA_SUCCESS);
    std::string t(n + 1, '\0');
    assert_int_equal(fa_generate_for(cfg, kind, sm, &o, t.data(), t.size(), &n), FA_SUCCESS);
    t.resize(n);
    return t;
  };
  // A div or rem by a register (the page size parameter), not a constant.
  auto divides_by_register = [](const std::string &t) {
    for (const char *op : {"div.u32", "rem.u32"})
      for (size_t at = t.find(op); at != std::string::npos; at = t.find(op, at + 1)) {
        const size_t end = t.find(';', at);
        const size_t comma = t.rfind(',', end);
        if (t.compare(comma + 1, 3, " %r") == 0) return true;
      }
    return false;
  };
  for (int sm : {80, 90}) {
    for (fa_kernel_kind kind : {FA_KERNEL_FORWARD, FA_KERNEL_DECODE}) {
      const std::string pow2 = ptx_of(kind, sm, kind == FA_KERNEL_DECODE ? 8 : 16);
      const std::string odd = ptx_of(kind, sm, kind == FA_KERNEL_DECODE ? 12 : 24);
      const std::string tiles = ptx_of(kind, sm, 256);
      assert_non_null(std::strstr(pow2.c_str(), " paged rows pow2"));
      assert_false(divides_by_register(pow2));
      assert_non_null(std::strstr(odd.c_str(), " paged rows\n"));
      assert_true(divides_by_register(odd));
      assert_non_null(std::strstr(tiles.c_str(), " paged tiles"));
    }
  }
  fa_config_destroy(cfg);
}

void test_decode_ptrs_and_features(void **) {
  need_runtime();
  std::vector<DecodeCase> cases;
  DecodeCase c;
  c.batch = 3;
  c.seqlen_q = 2;
  c.seqlen_k_max = 170;
  c.cache_seqlens = {170, 0, 64};
  c.heads_q = 8;
  c.heads_kv = 2;
  c.head_dim = 128;
  c.causal = true;
  c.kv = ptrs();
  cases.push_back(c);
  // Windows, softcap, forced splits and head_dim_v != head_dim, paged.
  c = {};
  c.batch = 2;
  c.seqlen_q = 3;
  c.seqlen_k_max = 200;
  c.cache_seqlens = {200, 33};
  c.heads_q = 4;
  c.heads_kv = 1;
  c.head_dim = 64;
  c.head_dim_v = 32;
  c.window_left = 40;
  c.softcap = 30.0f;
  c.num_splits = 3;
  c.bf16 = true;
  c.kv = paged(5, true);
  cases.push_back(c);
  // Partial states only.
  c = {};
  c.batch = 2;
  c.seqlen_q = 1;
  c.seqlen_k_max = 96;
  c.cache_seqlens = {96, 50};
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.partials_only = true;
  c.kv = paged(16);
  cases.push_back(c);
  run_all(cases);
}

// Chunked prefill: fa_launch with seqused_k against each layout; page
// sizes that are multiples of the forward's key tile take the per-tile
// lookup, others the per-row one.
void test_prefill_layouts(void **) {
  need_runtime();
  std::vector<DecodeCase> cases;
  const KvCase layouts[] = {
      KvCase(),       paged(64), paged(128, true), paged(16, false, true), paged(1),
      paged(3, true), ptrs()};
  int i = 0;
  for (const KvCase &kv : layouts) {
    DecodeCase c;
    c.prefill = true;
    c.batch = 3;
    c.seqlen_q = i % 2 ? 5 : 37;
    c.seqlen_k_max = 160 + 32 * (i % 3);
    c.cache_seqlens = {c.seqlen_k_max, c.seqlen_q + 3, c.seqlen_k_max - 41};
    c.heads_q = i % 3 == 0 ? 4 : 2;
    c.heads_kv = 2;
    c.head_dim = i % 2 ? 128 : 64;
    c.bf16 = i % 2 == 0;
    c.causal = i != 4;
    c.window_left = i == 5 ? 50 : -1;
    c.kv = kv;
    c.seed = 300 + i;
    cases.push_back(c);
    ++i;
  }
  run_all(cases);
}

// The bits of O (fp16, 32 heads x 128) and LSE of one sequence (fixed
// keys, length 3000, GQA 32/4) decoded in a
// batch of `batch` sequences (it is the last), the others of other lengths;
// seqlen_k_max grows with the batch, so the automatic split count changes.
std::vector<uint16_t> output_in_batch(fa_config *cfg, int batch, int invariant, int *splits) {
  const int dh = 128, hq = 32, hkv = 4, L = 3000;
  const int skmax = 3000 + 1500 * (batch - 1);
  std::mt19937 mine(5), others(50 + batch);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto fill = [&](std::vector<uint16_t> &x, size_t at, size_t n, bool own) {
    for (size_t i = 0; i < n; ++i) x[at + i] = fa::ref::f32_to_f16(nd(own ? mine : others));
  };
  const size_t row = size_t(hkv) * dh;  // one key of every KV head
  std::vector<uint16_t> q(size_t(batch) * hq * dh), k(size_t(batch) * skmax * row), v(k.size());
  std::vector<int32_t> lens(batch);
  for (int b = 0; b < batch; ++b) {
    const bool own = b == batch - 1;
    fill(q, size_t(b) * hq * dh, size_t(hq) * dh, own);
    fill(k, size_t(b) * skmax * row, size_t(L) * row, own);
    fill(v, size_t(b) * skmax * row, size_t(L) * row, own);
    if (!own) {
      fill(k, size_t(b) * skmax * row + size_t(L) * row, size_t(skmax - L) * row, false);
      fill(v, size_t(b) * skmax * row + size_t(L) * row, size_t(skmax - L) * row, false);
    }
    lens[b] = own ? L : 700 + (1900 * b) % (skmax - 700);
  }
  auto put = [&](const void *src, size_t bytes) {
    uint64_t p = 0;
    assert_int_equal(fa_malloc(g_rt, bytes, &p), FA_SUCCESS);
    assert_int_equal(fa_memcpy_htod(g_rt, p, src, bytes), FA_SUCCESS);
    return p;
  };
  auto view = [](uint64_t p, int s, int h, int d) {
    fa_tensor t = FA_TENSOR_INIT;
    t.data = p;
    t.stride[3] = 1;
    t.stride[2] = d;
    t.stride[1] = int64_t(h) * d;
    t.stride[0] = int64_t(s) * t.stride[1];
    return t;
  };
  fa_decode_args a = FA_DECODE_ARGS_INIT;
  a.batch = batch;
  a.seqlen_q = 1;
  a.seqlen_k_max = skmax;
  a.q = view(put(q.data(), q.size() * 2), 1, hq, dh);
  a.k_cache = view(put(k.data(), k.size() * 2), skmax, hkv, dh);
  a.v_cache = view(put(v.data(), v.size() * 2), skmax, hkv, dh);
  a.cache_seqlens = put(lens.data(), lens.size() * 4);
  a.batch_invariant = invariant;
  std::vector<uint16_t> o(size_t(batch) * hq * dh);
  a.o = view(put(o.data(), o.size() * 2), 1, hq, dh);
  std::vector<float> lse(size_t(batch) * hq);
  a.lse = put(lse.data(), lse.size() * 4);
  size_t ws = 0;
  assert_int_equal(fa_decode_workspace_size(g_rt, cfg, &a, &ws, splits), FA_SUCCESS);
  uint64_t w = 0;
  assert_int_equal(fa_malloc(g_rt, ws, &w), FA_SUCCESS);
  a.workspace = w;
  a.workspace_size = ws;
  assert_int_equal(fa_memset(g_rt, a.o.data, 0xFF, o.size() * 2), FA_SUCCESS);
  assert_int_equal(fa_memset(g_rt, a.lse, 0xFF, lse.size() * 4), FA_SUCCESS);
  assert_int_equal(fa_decode(g_rt, cfg, &a, nullptr), FA_SUCCESS);
  assert_int_equal(fa_memcpy_dtoh(g_rt, o.data(), a.o.data, o.size() * 2), FA_SUCCESS);
  assert_int_equal(fa_memcpy_dtoh(g_rt, lse.data(), a.lse, lse.size() * 4), FA_SUCCESS);
  for (uint64_t p : {a.q.data, a.k_cache.data, a.v_cache.data, a.cache_seqlens, a.o.data, a.lse, w})
    fa_free(g_rt, p);
  // O (bf16) and LSE (fp32, which shows any change of the partition) bits.
  std::vector<uint16_t> bits(o.end() - hq * dh, o.end());
  for (uint16_t x : bits) assert_true((x & 0x7c00) != 0x7c00);  // written, finite
  for (int h = 0; h < hq; ++h) {
    const float l = lse[size_t(batch - 1) * hq + h];
    assert_true(std::isfinite(l));
    uint32_t u;
    std::memcpy(&u, &l, 4);
    bits.push_back(uint16_t(u));
    bits.push_back(uint16_t(u >> 16));
  }
  return bits;
}

// batch_invariant: the same sequence's output bits (O and LSE) in batches
// of 1, 2 and 4 (2, 3 and 4 splits). The control: without it the automatic
// split size follows the batch and the LSE bits change, which shows the
// comparison can fail (deterministic on the emulator; if a new split
// heuristic makes the control equal, pick sizes where it differs).
void test_batch_invariant(void **) {
  need_runtime();
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.dtype = FA_DTYPE_FP16;
  d.head_dim = 128;
  d.num_heads_q = 32;
  d.num_heads_kv = 4;
  fa_config *cfg = nullptr;
  assert_int_equal(fa_config_create(&d, &cfg), FA_SUCCESS);
  std::vector<uint16_t> first, free_first;
  bool any_free_differs = false;
  for (int batch : {1, 2, 4}) {
    int splits = 0, free_splits = 0;
    const std::vector<uint16_t> o = output_in_batch(cfg, batch, 1, &splits);
    const std::vector<uint16_t> f = output_in_batch(cfg, batch, 0, &free_splits);
    if (first.empty()) {
      first = o;
      free_first = f;
    }
    const bool same_free = f == free_first;
    std::printf("  batch %d: invariant %d splits, bits %s; automatic %d splits, bits %s\n", batch,
                splits, o == first ? "equal" : "DIFFER", free_splits,
                same_free ? "equal" : "differ");
    assert_true(o == first);
    any_free_differs = any_free_differs || !same_free;
  }
  assert_true(any_free_differs);
  fa_config_destroy(cfg);
}

// Host checks of the new arguments: each a clear INVALID_ARGUMENT.
void test_bad_args(void **) {
  need_runtime();
  fa_config_desc d = FA_CONFIG_DESC_INIT;
  d.dtype = FA_DTYPE_FP16;
  d.head_dim = 64;
  d.num_heads_q = 2;
  d.num_heads_kv = 2;
  fa_config *cfg = nullptr;
  assert_int_equal(fa_config_create(&d, &cfg), FA_SUCCESS);
  uint64_t buf = 0;
  assert_int_equal(fa_malloc(g_rt, 1 << 20, &buf), FA_SUCCESS);
  auto tensor = [&](int s, int h, int dim) {
    fa_tensor t = FA_TENSOR_INIT;
    t.data = buf;
    t.stride[3] = 1;
    t.stride[2] = dim;
    t.stride[1] = int64_t(h) * dim;
    t.stride[0] = int64_t(s) * t.stride[1];
    return t;
  };
  fa_decode_args base = FA_DECODE_ARGS_INIT;
  base.batch = 2;
  base.seqlen_q = 1;
  base.seqlen_k_max = 64;
  base.q = tensor(1, 2, 64);
  base.k_cache = tensor(16, 2, 64);  // pages of 16
  base.v_cache = tensor(16, 2, 64);
  base.o = tensor(1, 2, 64);
  base.cache_seqlens = buf;
  base.kv.layout = FA_KV_PAGED;
  base.kv.page_size = 16;
  base.kv.num_pages = 8;
  base.kv.max_pages_per_seq = 4;
  base.kv.block_table = buf;
  base.kv.block_table_stride = 4;
  size_t ws = 0;
  assert_int_equal(fa_decode_workspace_size(g_rt, cfg, &base, &ws, nullptr), FA_SUCCESS);
  base.workspace = buf + 65536;
  base.workspace_size = ws;
  struct Bad {
    const char *what, *needle;
    void (*edit)(fa_decode_args *);
  };
  const Bad bads[] = {
      {"layout 3", "fa_kv_layout", [](fa_decode_args *a) { a->kv.layout = 3; }},
      {"page_size 0", "kv.page_size", [](fa_decode_args *a) { a->kv.page_size = 0; }},
      {"num_pages 0", "kv.num_pages", [](fa_decode_args *a) { a->kv.num_pages = 0; }},
      {"no table", "kv.block_table", [](fa_decode_args *a) { a->kv.block_table = 0; }},
      {"table misaligned", "kv.block_table", [](fa_decode_args *a) { a->kv.block_table += 2; }},
      {"short stride", "block_table_stride",
       [](fa_decode_args *a) { a->kv.block_table_stride = 3; }},
      {"too few pages", "max_pages_per_seq",
       [](fa_decode_args *a) { a->kv.max_pages_per_seq = 3; }},
      {"ptrs with paged", "k_ptrs", [](fa_decode_args *a) { a->kv.k_ptrs = 64; }},
      {"page fields when contiguous", "FA_KV_PAGED only",
       [](fa_decode_args *a) { a->kv.layout = FA_KV_CONTIGUOUS; }},
      {"ptr array without ptrs", "k_ptrs",
       [](fa_decode_args *a) {
         a->kv = fa_kv_cache_layout FA_KV_CACHE_LAYOUT_INIT;
         a->kv.layout = FA_KV_PTR_ARRAY;
         a->k_cache.data = a->v_cache.data = 0;
       }},
      {"ptr array with k data", "k_cache.data",
       [](fa_decode_args *a) {
         a->kv = fa_kv_cache_layout FA_KV_CACHE_LAYOUT_INIT;
         a->kv.layout = FA_KV_PTR_ARRAY;
         a->kv.k_ptrs = a->kv.v_ptrs = a->cache_seqlens;
       }},
      {"batch_invariant 2", "batch_invariant", [](fa_decode_args *a) { a->batch_invariant = 2; }},
      {"batch_invariant with splits", "num_splits",
       [](fa_decode_args *a) {
         a->batch_invariant = 1;
         a->num_splits = 2;
       }},
  };
  for (const Bad &b : bads) {
    fa_decode_args a = base;
    b.edit(&a);
    const fa_status st = fa_decode(g_rt, cfg, &a, nullptr);
    std::printf("  %-28s -> %s: %s\n", b.what, fa_status_string(st), fa_last_error());
    assert_int_equal(st, FA_ERROR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(fa_last_error(), b.needle));
  }
  // Forward: seqused_k with cu_seqlens_k, cu_seqlens_k with a paged cache.
  fa_forward_args f = FA_FORWARD_ARGS_INIT;
  f.batch = 2;
  f.seqlen_q = 4;
  f.seqlen_k = 64;
  f.q = tensor(4, 2, 64);
  f.k = base.k_cache;
  f.v = base.v_cache;
  f.o = tensor(4, 2, 64);
  f.kv = base.kv;
  f.cu_seqlens_q = f.cu_seqlens_k = buf;
  assert_int_equal(fa_launch(g_rt, cfg, &f, nullptr), FA_ERROR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(fa_last_error(), "seqused_k"));
  f.kv = fa_kv_cache_layout FA_KV_CACHE_LAYOUT_INIT;
  f.k = f.v = tensor(64, 2, 64);
  f.seqused_k = buf;
  assert_int_equal(fa_launch(g_rt, cfg, &f, nullptr), FA_ERROR_INVALID_ARGUMENT);
  assert_non_null(std::strstr(fa_last_error(), "seqused_k and cu_seqlens_k"));
  // A 0.2-sized struct is still accepted, a size between the two is not.
  fa_decode_args old = base;
  old.kv = fa_kv_cache_layout FA_KV_CACHE_LAYOUT_INIT;
  old.k_cache = old.v_cache = tensor(64, 2, 64);
  old.struct_size = FA_DECODE_ARGS_SIZE_0_2;
  size_t ws_old = 0;
  assert_int_equal(fa_decode_workspace_size(g_rt, cfg, &old, &ws_old, nullptr), FA_SUCCESS);
  old.struct_size = FA_DECODE_ARGS_SIZE_0_2 + 8;
  assert_int_equal(fa_decode_workspace_size(g_rt, cfg, &old, &ws_old, nullptr),
                   FA_ERROR_INVALID_ARGUMENT);
  fa_free(g_rt, buf);
  fa_config_destroy(cfg);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_paged),
      cmocka_unit_test(test_page_lookup_forms),
      cmocka_unit_test(test_decode_ptrs_and_features),
      cmocka_unit_test(test_prefill_layouts),
      cmocka_unit_test(test_batch_invariant),
      cmocka_unit_test(test_bad_args),
  };
  return cmocka_run_group_tests(tests, fa::test::emu_runtime_setup, fa::test::emu_runtime_teardown);
}

/*
 * A paged decode call (fa_decode), as docs/api.md "Decode" shows it:
 *   cc paged_decode_example.c $(pkg-config --cflags --libs flashattn)
 *   ./a.out
 * One new token per sequence (seqlen_q 1) of a GQA layer (8 query heads over
 * 2 KV heads, head_dim 64) attends to a KV cache of pages of 16 tokens
 * (vLLM's layout: a pool [num_pages, page_size, num_heads_kv, head_dim] and
 * a block_table [batch, max_pages_per_seq] of pool page numbers, here in a
 * shuffled order). O is checked against a double-precision reference on
 * the same fp16 values. Runs on the emulator (FA_BACKEND_AUTO picks a GPU
 * when there is one; this program asks for the emulator so it runs anywhere).
 */
#include <flashattn.h>
#include <math.h>

#include "fixture.h"

#define CHECK(call) FIXTURE_CHECK(call, fa_status_string, fa_last_error)

enum { B = 3, HQ = 8, HKV = 2, D = 64, PAGE = 16, MAX_PAGES = 5, NUM_PAGES = B * MAX_PAGES + 1 };

/* A fixed linear congruential generator: values in [-1, 1), fp16-exact. */
static float next_value(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return f16_to_f32(f32_to_f16((float)(*s >> 8) / 8388608.0f - 1.0f));
}

/* The pool element index of key j (head hk, element 0) of sequence b. */
static size_t key_at(const int32_t *block_table, int b, int j, int hk) {
  const size_t page = (size_t)block_table[b * MAX_PAGES + j / PAGE];
  return ((page * PAGE + (size_t)(j % PAGE)) * HKV + (size_t)hk) * D;
}

int main(void) {
  const int32_t seqlens[B] = {70, 1, 33}; /* valid keys, <= MAX_PAGES * PAGE */
  const size_t pool_n = (size_t)NUM_PAGES * PAGE * HKV * D, q_n = (size_t)B * HQ * D;
  static uint16_t k_pool[NUM_PAGES * PAGE * HKV * D], v_pool[NUM_PAGES * PAGE * HKV * D];
  static uint16_t q_h[B * HQ * D], o_h[B * HQ * D];
  int32_t block_table[B * MAX_PAGES];
  uint32_t seed = 7;
  size_t i;
  int b, h, j, e;

  /* Sequence b's page p is pool page (7 * (b * MAX_PAGES + p) + 3) % NUM_PAGES:
   * a permutation, so pages are scattered and one pool page is unused. */
  for (i = 0; i < (size_t)B * MAX_PAGES; i++) block_table[i] = (int32_t)((7 * i + 3) % NUM_PAGES);
  for (i = 0; i < pool_n; i++) k_pool[i] = f32_to_f16(next_value(&seed));
  for (i = 0; i < pool_n; i++) v_pool[i] = f32_to_f16(next_value(&seed));
  for (i = 0; i < q_n; i++) q_h[i] = f32_to_f16(next_value(&seed));

  fa_runtime_options opts = FA_RUNTIME_OPTIONS_INIT;
  opts.backend = FA_BACKEND_EMULATOR;
  fa_runtime *rt = NULL;
  CHECK(fa_runtime_create(&opts, &rt));
  fa_config_desc desc = FA_CONFIG_DESC_INIT; /* fp16, scale 1/sqrt(head_dim) */
  desc.head_dim = D;
  desc.num_heads_q = HQ;
  desc.num_heads_kv = HKV;
  desc.causal = 1; /* the new token sees the whole cache */
  fa_config *cfg = NULL;
  CHECK(fa_config_create(&desc, &cfg));

  uint64_t q, k, v, o, table, lens, ws;
  CHECK(fa_malloc(rt, sizeof q_h, &q));
  CHECK(fa_malloc(rt, sizeof k_pool, &k));
  CHECK(fa_malloc(rt, sizeof v_pool, &v));
  CHECK(fa_malloc(rt, sizeof o_h, &o));
  CHECK(fa_malloc(rt, sizeof block_table, &table));
  CHECK(fa_malloc(rt, sizeof seqlens, &lens));
  CHECK(fa_memcpy_htod(rt, q, q_h, sizeof q_h));
  CHECK(fa_memcpy_htod(rt, k, k_pool, sizeof k_pool));
  CHECK(fa_memcpy_htod(rt, v, v_pool, sizeof v_pool));
  CHECK(fa_memcpy_htod(rt, table, block_table, sizeof block_table));
  CHECK(fa_memcpy_htod(rt, lens, seqlens, sizeof seqlens));
  CHECK(fa_memset(rt, o, 0xff, sizeof o_h)); /* NaN: an unwritten element shows */

  /* --- the call, as in docs/api.md --- */
  fa_decode_args a = FA_DECODE_ARGS_INIT;
  a.batch = B;
  a.seqlen_q = 1;
  a.seqlen_k_max = MAX_PAGES * PAGE;
  a.q = (fa_tensor){q, {HQ * D, HQ * D, D, 1}};              /* [B, 1, HQ, D] */
  a.k_cache = (fa_tensor){k, {PAGE * HKV * D, HKV * D, D, 1}}; /* [pages, PAGE, HKV, D] */
  a.v_cache = (fa_tensor){v, {PAGE * HKV * D, HKV * D, D, 1}};
  a.kv.layout = FA_KV_PAGED;
  a.kv.page_size = PAGE;
  a.kv.num_pages = NUM_PAGES;
  a.kv.max_pages_per_seq = MAX_PAGES;
  a.kv.block_table = table; /* int32 [B, MAX_PAGES] */
  a.kv.block_table_stride = MAX_PAGES;
  a.cache_seqlens = lens; /* int32 [B] */
  a.o = (fa_tensor){o, {HQ * D, HQ * D, D, 1}};
  size_t ws_bytes = 0;
  int32_t splits = 0;
  CHECK(fa_decode_workspace_size(rt, cfg, &a, &ws_bytes, &splits));
  CHECK(fa_malloc(rt, ws_bytes, &ws));
  a.workspace = ws;
  a.workspace_size = ws_bytes;
  CHECK(fa_decode(rt, cfg, &a, NULL)); /* split-KV partials, then the combine */
  CHECK(fa_synchronize(rt, NULL));
  /* --- */
  CHECK(fa_memcpy_dtoh(rt, o_h, o, sizeof o_h));

  /* The reference: softmax(q . k / sqrt(D)) v over each sequence's valid keys. */
  double max_err = 0, max_ref = 0;
  for (b = 0; b < B; b++)
    for (h = 0; h < HQ; h++) {
      const int hk = h / (HQ / HKV);
      const uint16_t *qr = &q_h[((size_t)b * HQ + h) * D];
      double s[MAX_PAGES * PAGE], m = -INFINITY, l = 0, out[D] = {0};
      for (j = 0; j < seqlens[b]; j++) {
        const size_t at = key_at(block_table, b, j, hk);
        s[j] = 0;
        for (e = 0; e < D; e++) s[j] += (double)f16_to_f32(qr[e]) * f16_to_f32(k_pool[at + (size_t)e]);
        s[j] /= sqrt((double)D);
        if (s[j] > m) m = s[j];
      }
      for (j = 0; j < seqlens[b]; j++) {
        const size_t at = key_at(block_table, b, j, hk);
        const double p = exp(s[j] - m);
        l += p;
        for (e = 0; e < D; e++) out[e] += p * f16_to_f32(v_pool[at + (size_t)e]);
      }
      for (e = 0; e < D; e++) {
        const double ref = out[e] / l, got = f16_to_f32(o_h[((size_t)b * HQ + h) * D + (size_t)e]);
        const double err = isnan(got) ? INFINITY : fabs(got - ref);
        if (err > max_err) max_err = err;
        if (fabs(ref) > max_ref) max_ref = fabs(ref);
      }
    }
  const int ok = max_err <= 1e-2 * (max_ref > 1 ? max_ref : 1);
  printf("paged_decode_example: %d splits, workspace %zu bytes, max_abs %.3g: %s\n", splits,
         ws_bytes, max_err, ok ? "PASS" : "FAIL");

  uint64_t bufs[7] = {q, k, v, o, table, lens, ws};
  for (i = 0; i < 7; i++) CHECK(fa_free(rt, bufs[i]));
  fa_config_destroy(cfg);
  fa_runtime_destroy(rt);
  return ok ? 0 : 1;
}

// One small causal problem on a runtime (the test's emulator runtime),
// for tests of exact properties and host checks of a per-query-head fp32
// input (attention sinks, ALiBi slopes): batch 1, seqlen_q 9, seqlen_k 40,
// 2 heads, head_dim 64, fp16 random inputs. `heads` holds the two per-head
// floats (set_heads) and, 32 bytes on, the decode's cache_seqlens {SK};
// fwd() / dec() are arguments over it; poison_and_read(true) poisons O and
// LSE, (false) reads their bytes back.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "flashattn.h"
#include "reference.h"
#include "support/cmocka.hh"

namespace fa::test {

struct SmallProblem {
  fa_config *cfg = nullptr;
  uint64_t q = 0, k = 0, v = 0, o = 0, lse = 0, heads = 0, ws = 0;
  static constexpr int B = 1, SQ = 9, SK = 40, H = 2, D = 64;
  size_t o_bytes = size_t(B) * SQ * H * D * 2, lse_bytes = size_t(B) * H * SQ * 4;
  fa_runtime *rt;
  explicit SmallProblem(fa_runtime *runtime) : rt(runtime) {
    fa_config_desc d = FA_CONFIG_DESC_INIT;
    d.head_dim = D;
    d.num_heads_q = d.num_heads_kv = H;
    d.causal = 1;
    assert_int_equal(fa_config_create(&d, &cfg), FA_SUCCESS);
    std::mt19937 gen(77);
    std::normal_distribution<float> n(0.0f, 1.0f);
    auto upload = [&](size_t elems) {
      std::vector<uint16_t> h(elems);
      for (uint16_t &x : h) x = fa::ref::f32_to_f16(n(gen));
      uint64_t p = 0;
      assert_int_equal(fa_malloc(rt, elems * 2, &p), FA_SUCCESS);
      assert_int_equal(fa_memcpy_htod(rt, p, h.data(), elems * 2), FA_SUCCESS);
      return p;
    };
    q = upload(size_t(B) * SQ * H * D);
    k = upload(size_t(B) * SK * H * D);
    v = upload(size_t(B) * SK * H * D);
    assert_int_equal(fa_malloc(rt, o_bytes, &o), FA_SUCCESS);
    assert_int_equal(fa_malloc(rt, lse_bytes, &lse), FA_SUCCESS);
    assert_int_equal(fa_malloc(rt, 64, &heads), FA_SUCCESS);
    assert_int_equal(fa_malloc(rt, 1 << 20, &ws), FA_SUCCESS);
  }
  ~SmallProblem() {
    for (uint64_t p : {q, k, v, o, lse, heads, ws}) fa_free(rt, p);
    fa_config_destroy(cfg);
  }
  fa_tensor view(uint64_t p, int s) const {
    return fa_tensor{p, {int64_t(s) * H * D, int64_t(H) * D, D, 1}};
  }
  fa_forward_args fwd() const {
    fa_forward_args a = FA_FORWARD_ARGS_INIT;
    a.batch = B, a.seqlen_q = SQ, a.seqlen_k = SK;
    a.q = view(q, SQ), a.k = view(k, SK), a.v = view(v, SK), a.o = view(o, SQ);
    a.lse = lse;
    return a;
  }
  fa_decode_args dec() const {
    fa_decode_args a = FA_DECODE_ARGS_INIT;
    a.batch = B, a.seqlen_q = SQ, a.seqlen_k_max = SK;
    a.q = view(q, SQ), a.k_cache = view(k, SK), a.v_cache = view(v, SK), a.o = view(o, SQ);
    a.lse = lse, a.workspace = ws, a.workspace_size = 1 << 20, a.num_splits = 2;
    a.cache_seqlens = heads + 32;  // int32 [1] = SK, set by set_heads
    return a;
  }
  void set_heads(float a, float b) const {
    const float s[2] = {a, b};
    const int32_t len = SK;
    assert_int_equal(fa_memcpy_htod(rt, heads, s, 8), FA_SUCCESS);
    assert_int_equal(fa_memcpy_htod(rt, heads + 32, &len, 4), FA_SUCCESS);
  }
  std::vector<uint8_t> poison_and_read(bool poison) const {
    if (poison) {
      fa_memset(rt, o, 0xFF, o_bytes);
      fa_memset(rt, lse, 0xFF, lse_bytes);
      return {};
    }
    std::vector<uint8_t> out(o_bytes + lse_bytes);
    fa_memcpy_dtoh(rt, out.data(), o, o_bytes);
    fa_memcpy_dtoh(rt, out.data() + o_bytes, lse, lse_bytes);
    return out;
  }
};

}  // namespace fa::test

// The numerics case lists: FlashAttention's own test grid shapes, scaled to
// what the emulator runs in seconds, covering every semantic the API offers.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "npy.h"
#include "support/numerics.h"

namespace fa::test {
namespace {

}  // namespace

std::vector<ForwardCase> forward_cases(bool gpu) {
  std::vector<ForwardCase> v;
  auto add = [&](ForwardCase c) { v.push_back(c); };
  const int m = gpu ? 4 : 1;  // GPU runs longer sequences
  ForwardCase c;
  c = {};
  c.batch = 2;
  c.seqlen_q = 113 * m;
  c.seqlen_k = 203 * m;
  c.heads_q = 4;
  c.heads_kv = 4;
  c.head_dim = 64;
  add(c);
  c = {};
  c.seqlen_q = 128 * m;
  c.seqlen_k = 217 * m;
  c.heads_q = 2;
  c.heads_kv = 1;
  c.head_dim = 128;
  c.bf16 = true;
  c.causal = true;
  c.seed = 2;
  add(c);
  c = {};
  c.seqlen_q = 1;
  c.seqlen_k = 239 * m;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 32;
  c.causal = true;
  c.seed = 3;
  add(c);
  c = {};
  c.seqlen_q = 108;
  c.seqlen_k = 256;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 80;
  c.window_left = 32;
  c.window_right = 8;
  c.seed = 4;
  add(c);
  c = {};
  c.seqlen_q = 64;
  c.seqlen_k = 80;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 256;
  c.bf16 = true;
  c.softcap = 30;
  c.input_scale = 3;
  c.seed = 5;
  add(c);
  c = {};
  c.seqlen_q = 200;
  c.seqlen_k = 100;
  c.heads_q = 1;
  c.heads_kv = 1;
  c.head_dim = 40;
  c.causal = true;
  c.seed = 6;
  add(c);  // rows with no key
  c = {};
  c.batch = 2;
  c.seqlen_q = 50;
  c.seqlen_k = 70;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.head_dim_v = 32;
  c.seed = 7;
  add(c);
  c = {};
  c.batch = 2;
  c.seqlen_q = 33;
  c.seqlen_k = 47;
  c.heads_q = 6;
  c.heads_kv = 2;
  c.head_dim = 96;
  c.padded_strides = true;
  c.seed = 8;
  add(c);
  c = {};
  c.batch = 3;
  c.varlen = true;
  c.seqlens_q = {17, 1, 40};
  c.seqlens_k = {30, 9, 40};
  c.seqlen_q = 40;
  c.seqlen_k = 40;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.causal = true;
  c.seed = 9;
  add(c);
  c = {};
  c.seqlen_q = 96;
  c.seqlen_k = 96;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.bf16 = true;
  c.causal = true;
  c.window_left = 16;
  c.seed = 10;
  add(c);
  c = {};
  c.seqlen_q = 40;
  c.seqlen_k = 64;
  c.heads_q = 8;
  c.heads_kv = 1;
  c.head_dim = 64;
  c.seed = 11;
  add(c);  // MQA
  c = {};
  c.seqlen_q = 70;
  c.seqlen_k = 90;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.input_scale = 4;
  c.seed = 12;
  add(c);  // peaked softmax
  c = {};
  c.seqlen_q = 37;
  c.seqlen_k = 45;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.softmax_scale = 0.05f;
  c.window_left = 0;
  c.window_right = 0;
  c.seed = 13;
  add(c);
  for (int d : {8, 16, 24, 48, 72, 120, 136, 200, 248}) {
    c = {};
    c.seqlen_q = 17;
    c.seqlen_k = 19;
    c.heads_q = 2;
    c.heads_kv = 1;
    c.head_dim = d;
    c.bf16 = d % 16 == 0;
    c.causal = d % 24 == 0;
    c.seed = 100 + d;
    add(c);
  }
  // What the tensor-core tiling makes special (docs/kernels.md): CTAs of 128
  // rows, 4 warps x 2 m-tiles of 16 rows, K/V tiles of 64 keys visited from
  // the last, a masked loop at either end of the key range and a lean loop
  // between.
  c = {};
  c.seqlen_q = 9;  // shorter than one m-tile: 3 warps have no valid row
  c.seqlen_k = 150;
  c.heads_q = 2;
  c.heads_kv = 1;
  c.head_dim = 64;
  c.seed = 20;
  add(c);
  c = {};
  c.seqlen_q = 300;  // sq > sk causal: rows 0..219 see no key
  c.seqlen_k = 80;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 128;
  c.causal = true;
  c.seed = 21;
  add(c);
  c = {};
  c.seqlen_q = 200;  // windows starting and ending inside K/V tiles
  c.seqlen_k = 330;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.bf16 = true;
  c.window_left = 70;
  c.window_right = 37;
  c.seed = 22;
  add(c);
  c = {};
  c.seqlen_q = 257;  // a long window: masked tiles at both ends, lean ones between
  c.seqlen_k = 700;
  c.heads_q = 1;
  c.heads_kv = 1;
  c.head_dim = 128;
  c.window_left = 300;
  c.window_right = 5;
  c.seed = 23;
  add(c);
  c = {};
  c.batch = 4;  // sequences ending inside a warp's second m-tile (rows 16..31)
  c.varlen = true;
  c.seqlens_q = {20, 150, 53, 27};
  c.seqlens_k = {90, 130, 64, 200};
  c.seqlen_q = 150;
  c.seqlen_k = 200;
  c.heads_q = 4;
  c.heads_kv = 1;
  c.head_dim = 96;
  c.causal = true;
  c.seed = 24;
  add(c);
  c = {};
  c.seqlen_q = 160;  // the rescale threshold crossed in later tiles
  c.seqlen_k = 512;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.input_scale = 6;
  c.seed = 25;
  add(c);
  // FlashAttention's test grid: its (seqlen_q, seqlen_k) pairs, scaled down
  // where the emulator would take long, crossed with head dims, causal,
  // dtype and GQA, rotating so each dimension meets the others.
  const int pairs[][2] = {{113, 203}, {128, 217}, {113, 211}, {108, 256}, {256, 512},
                          {512, 256}, {200, 200}, {199, 200}, {200, 199}, {1, 239},
                          {239, 1},   {3, 199},   {127, 129}, {65, 33}};
  const int dims[] = {32, 64, 96, 128, 160, 192, 224, 256};
  int n = 0;
  for (const auto &pr : pairs) {
    for (int j = 0; j < 2; ++j, ++n) {
      c = {};
      c.head_dim = dims[n % 8];
      const double shrink = c.head_dim >= 160 && !gpu ? 0.5 : 1.0;  // keep emulator time flat
      c.seqlen_q = std::max(1, int(pr[0] * shrink * m));
      c.seqlen_k = std::max(1, int(pr[1] * shrink * m));
      c.causal = (n % 2) == 0;
      c.bf16 = (n % 3) == 0;
      c.heads_q = (n % 4) < 2 ? 2 : 4;
      c.heads_kv = (n % 4) == 3 ? 1 : 2;
      c.seed = 1000 + n;
      add(c);
    }
  }
  return maybe_quick(v, 3);
}

std::vector<DecodeCase> decode_cases(bool gpu) {
  std::vector<DecodeCase> v;
  const int m = gpu ? 8 : 1;
  DecodeCase c;
  c = {};
  c.batch = 3;
  c.seqlen_q = 1;
  c.seqlen_k_max = 300 * m;
  c.cache_seqlens = {300 * m, 1, 0};
  c.heads_q = 8;
  c.heads_kv = 2;
  c.head_dim = 64;
  v.push_back(c);
  c = {};
  c.batch = 2;
  c.seqlen_q = 2;
  c.seqlen_k_max = 200;
  c.cache_seqlens = {200, 77};
  c.heads_q = 4;
  c.heads_kv = 4;
  c.head_dim = 128;
  c.bf16 = true;
  c.causal = true;
  c.num_splits = 3;
  c.seed = 2;
  v.push_back(c);
  c = {};
  c.batch = 1;
  c.seqlen_q = 1;
  c.seqlen_k_max = 520 * m;
  c.cache_seqlens = {517 * m};
  c.heads_q = 32;
  c.heads_kv = 4;
  c.head_dim = 128;
  c.num_splits = 7;
  c.seed = 3;
  v.push_back(c);
  c = {};
  c.batch = 2;
  c.seqlen_q = 1;
  c.seqlen_k_max = 256;
  c.cache_seqlens = {250, 30};
  c.heads_q = 4;
  c.heads_kv = 1;
  c.head_dim = 64;
  c.window_left = 64;
  c.seed = 4;
  v.push_back(c);
  c = {};
  c.batch = 1;
  c.seqlen_q = 3;
  c.seqlen_k_max = 100;
  c.cache_seqlens = {100};
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 80;
  c.softcap = 20;
  c.causal = true;
  c.seed = 5;
  v.push_back(c);
  c = {};
  c.batch = 2;
  c.seqlen_q = 1;
  c.seqlen_k_max = 128;
  c.cache_seqlens = {100, 128};
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.head_dim_v = 96;
  c.num_splits = 64;
  c.seed = 6;
  v.push_back(c);
  // Partial states only (o.data = 0), as a caller merging KV segments uses them.
  c = {};
  c.batch = 2;
  c.seqlen_q = 2;
  c.seqlen_k_max = 190;
  c.cache_seqlens = {190, 45};
  c.heads_q = 6;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.causal = true;
  c.num_splits = 6;
  c.partials_only = true;
  c.seed = 7;
  v.push_back(c);
  return maybe_quick(v, 2);
}

bool load_fixture(const std::string &name, const std::string &file, std::vector<float> *out,
                  std::vector<int64_t> *shape) {
  npy::Array a;
  std::string err;
  if (!npy::read(std::string(FA_TEST_DATA_DIR) + "/" + name + "/" + file + ".npy", &a, &err)) {
    return false;
  }
  *out = a.to_f32();
  *shape = a.shape;
  return true;
}

// Every feature once more, at GPU sizes on a GPU (small on the emulator,
// where each feature also has its own suite): sinks, ALiBi, the KV append
// with RoPE, tree masks, chunked prefill and the paged / pointer-array
// layouts, so that a GPU run exercises their kernels too.
std::vector<ForwardCase> feature_forward_cases(bool gpu) {
  std::vector<ForwardCase> v;
  const int m = gpu ? 4 : 1;
  ForwardCase c;
  c = {};  // gpt-oss: sinks with a sliding window, causal, GQA
  c.batch = 2;
  c.seqlen_q = 150 * m;
  c.seqlen_k = 150 * m;
  c.heads_q = 8;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.causal = true;
  c.window_left = 128;
  c.window_right = 0;
  c.sinks = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -3.0f, 0.25f, 4.0f};
  c.seed = 201;
  v.push_back(c);
  c = {};  // ALiBi, causal, bf16, head_dim 128
  c.batch = 2;
  c.seqlen_q = 97 * m;
  c.seqlen_k = 161 * m;
  c.heads_q = 4;
  c.heads_kv = 1;
  c.head_dim = 128;
  c.bf16 = true;
  c.causal = true;
  c.alibi = {0.25f, 0.0625f, 0.015625f, 0.00390625f};
  c.seed = 202;
  v.push_back(c);
  c = {};  // ALiBi per sequence, not causal, with softcap
  c.batch = 2;
  c.seqlen_q = 64 * m;
  c.seqlen_k = 90 * m;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 96;
  c.softcap = 30;
  c.alibi = {0.1f, 0.3f, 0.0f, 0.02f};
  c.alibi_stride = 2;
  c.seed = 203;
  v.push_back(c);
  c = {};  // varlen with sinks, head_dim 256
  c.batch = 3;
  c.varlen = true;
  c.seqlens_q = {30 * m, 1, 77 * m};
  c.seqlens_k = {45 * m, 60 * m, 77 * m};
  c.seqlen_q = 77 * m;
  c.seqlen_k = 77 * m;
  c.heads_q = 2;
  c.heads_kv = 1;
  c.head_dim = 256;
  c.causal = true;
  c.sinks = {1.0f, -0.5f};
  c.seed = 204;
  v.push_back(c);
  return v;
}

std::vector<DecodeCase> feature_decode_cases(bool gpu) {
  std::vector<DecodeCase> v;
  const int m = gpu ? 8 : 1;
  DecodeCase c;
  c = {};  // the engine's step: append one token with NeoX RoPE into 16-key pages
  c.batch = 3;
  c.seqlen_q = 1;
  c.seqlen_k_max = 160 * m;
  c.cache_seqlens = {159 * m, 31, 0};
  c.heads_q = 8;
  c.heads_kv = 2;
  c.head_dim = 128;
  c.bf16 = true;
  c.causal = true;
  c.seqlen_new = 1;
  c.rotary_dim = 128;
  c.kv.layout = FA_KV_PAGED;
  c.kv.page_size = 16;
  c.seed = 301;
  v.push_back(c);
  c = {};  // chunked append, GPT-J pairs on part of the head, explicit positions, pointer arrays
  c.batch = 2;
  c.seqlen_q = 5;
  c.seqlen_k_max = 100 * m;
  c.cache_seqlens = {90 * m, 7};
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.causal = true;
  c.seqlen_new = 5;
  c.rotary_dim = 32;
  c.rotary_interleaved = true;
  c.rotary_half_table = true;
  c.rotary_positions = true;
  c.kv.layout = FA_KV_PTR_ARRAY;
  c.num_splits = 3;
  c.seed = 302;
  v.push_back(c);
  c = {};  // speculative decoding: a tree of 6 drafted tokens, sinks, HND pages of 3
  c.batch = 2;
  c.seqlen_q = 6;
  c.seqlen_k_max = 120 * m;
  c.cache_seqlens = {120 * m, 50};
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.causal = true;
  c.tree.assign(size_t(2) * 6 * 6, 0);
  for (int b = 0; b < 2; ++b) {
    for (int i = 0; i < 6; ++i) {
      for (int j = 0; j <= i; ++j)
        c.tree[(size_t(b) * 6 + i) * 6 + j] = (j == i || (i + j + b) % 3 != 0);
    }
  }
  c.sinks = {0.5f, 1.0f, -2.0f, 3.0f};
  c.kv.layout = FA_KV_PAGED;
  c.kv.page_size = 3;
  c.kv.hnd = true;
  c.seed = 303;
  v.push_back(c);
  c = {};  // ALiBi in decode with splits, shared-prefix pages
  c.batch = 2;
  c.seqlen_q = 1;
  c.seqlen_k_max = 256 * m;
  c.cache_seqlens = {256 * m, 200 * m};
  c.heads_q = 8;
  c.heads_kv = 1;
  c.head_dim = 128;
  c.alibi = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f, 0.0078125f, 0.00390625f};
  c.kv.layout = FA_KV_PAGED;
  c.kv.page_size = 32;
  c.kv.share_prefix = true;
  c.num_splits = 4;
  c.seed = 304;
  v.push_back(c);
  c = {};  // chunked prefill through fa_launch on a paged cache
  c.batch = 2;
  c.seqlen_q = 40;
  c.seqlen_k_max = 200 * m;
  c.cache_seqlens = {200 * m, 64};
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.causal = true;
  c.prefill = true;
  c.kv.layout = FA_KV_PAGED;
  c.kv.page_size = 16;
  c.seed = 305;
  v.push_back(c);
  c = {};  // batch-invariant splits
  c.batch = 2;
  c.seqlen_q = 1;
  c.seqlen_k_max = 600 * m;
  c.cache_seqlens = {600 * m, 300};
  c.heads_q = 4;
  c.heads_kv = 4;
  c.head_dim = 64;
  c.bf16 = true;
  c.batch_invariant = true;
  c.seed = 306;
  v.push_back(c);
  return v;
}

std::vector<ForwardCase> fp8_forward_cases(bool gpu) {
  std::vector<ForwardCase> v;
  ForwardCase c;  // e4m3, GQA, causal, per-(batch, KV head) descales, bf16 O
  c.batch = 2;
  c.seqlen_q = gpu ? 700 : 40;
  c.seqlen_k = gpu ? 900 : 70;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = gpu ? 128 : 64;
  c.bf16 = true;
  c.causal = true;
  c.q_fp8 = c.kv_fp8 = FA_DTYPE_FP8_E4M3;
  c.descale = 2;
  c.seed = 801;
  v.push_back(c);
  if (!gpu) return v;
  c = {};  // e5m2, one descale per tensor, fp16 O, head_dim 64, softcap, strided
  c.batch = 1;
  c.seqlen_q = c.seqlen_k = 1000;
  c.heads_q = c.heads_kv = 8;
  c.head_dim = 64;
  c.softcap = 30;
  c.padded_strides = true;
  c.q_fp8 = c.kv_fp8 = FA_DTYPE_FP8_E5M2;
  c.descale = 1;
  c.seed = 802;
  v.push_back(c);
  c = {};  // varlen, transposed descales, head_dim 256 with a window, sinks
  c.batch = 3;
  c.varlen = true;
  c.seqlens_q = {300, 1, 517};
  c.seqlens_k = {640, 200, 517};
  c.seqlen_q = 517;
  c.seqlen_k = 640;
  c.heads_q = 8;
  c.heads_kv = 2;
  c.head_dim = 256;
  c.bf16 = true;
  c.window_left = 256;
  c.window_right = 0;
  c.sinks = {0.5f, -1.0f, 1.5f, 0.0f, -2.0f, 1.0f, 0.25f, -0.5f};
  c.q_fp8 = c.kv_fp8 = FA_DTYPE_FP8_E4M3;
  c.descale = 3;
  c.seed = 803;
  v.push_back(c);
  c = {};  // MLA-shaped 576 / 512 (O in slices), Q e5m2 over e4m3 K/V
  c.batch = 1;
  c.seqlen_q = 200;
  c.seqlen_k = 400;
  c.heads_q = 8;
  c.heads_kv = 1;
  c.head_dim = 576;
  c.head_dim_v = 512;
  c.bf16 = true;
  c.q_fp8 = FA_DTYPE_FP8_E5M2;
  c.kv_fp8 = FA_DTYPE_FP8_E4M3;
  c.seed = 804;
  v.push_back(c);
  return v;
}

std::vector<ForwardCase> large_head_forward_cases(bool gpu) {
  std::vector<ForwardCase> v;
  const int m = gpu ? 8 : 1;
  ForwardCase c;
  c = {};  // Gemma-class: head_dim 512, GQA, causal, softcap, bf16
  c.batch = 2;
  c.seqlen_q = 70 * m;
  c.seqlen_k = 90 * m;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 512;
  c.bf16 = true;
  c.causal = true;
  c.softcap = 50;
  c.seed = 501;
  v.push_back(c);
  c = {};  // MLA-shaped (576 / 512) over one KV head, sliding window, strided views
  c.batch = 1;
  c.seqlen_q = 33 * m;
  c.seqlen_k = 60 * m;
  c.heads_q = 4;
  c.heads_kv = 1;
  c.head_dim = 576;
  c.head_dim_v = 512;
  c.causal = true;
  c.window_left = 40 * m;
  c.window_right = 0;
  c.padded_strides = true;
  c.seed = 502;
  v.push_back(c);
  c = {};  // head_dim 264: a K tile padded to 272 columns, O in three slices of 88
  c.batch = 2;
  c.seqlen_q = 17;
  c.seqlen_k = 50 * m;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 264;
  c.seed = 503;
  v.push_back(c);
  c = {};  // varlen, head_dim 384 with ALiBi and sinks
  c.batch = 2;
  c.varlen = true;
  c.seqlens_q = {25 * m, 9};
  c.seqlens_k = {31 * m, 40};
  c.seqlen_q = 25 * m;
  c.seqlen_k = 40 * m;
  c.heads_q = 2;
  c.heads_kv = 1;
  c.head_dim = 384;
  c.bf16 = true;
  c.alibi = {0.25f, 0.0625f};
  c.sinks = {1.0f, -2.0f};
  c.seed = 504;
  v.push_back(c);
  return v;
}

std::vector<DecodeCase> large_head_decode_cases(bool gpu) {
  std::vector<DecodeCase> v;
  const int m = gpu ? 8 : 1;
  DecodeCase c;
  c = {};  // MLA decode: 16 query heads over one latent KV head, 576 / 512, pages of 64
  c.batch = 2;
  c.seqlen_q = 1;
  c.seqlen_k_max = 200 * m;
  c.cache_seqlens = {200 * m, 77};
  c.heads_q = 16;
  c.heads_kv = 1;
  c.head_dim = 576;
  c.head_dim_v = 512;
  c.bf16 = true;
  c.causal = true;
  c.kv.layout = FA_KV_PAGED;
  c.kv.page_size = 64;
  c.num_splits = 3;
  c.seed = 601;
  v.push_back(c);
  c.v_in_k = true;  // the same, V read from the latent K tile
  c.seed = 605;
  v.push_back(c);
  c = {};  // MLA with V in K on pages of 5 (rows gathered one by one), no slices of O
  c.batch = 2;
  c.seqlen_q = 1;
  c.seqlen_k_max = 70 * m;
  c.cache_seqlens = {70 * m, 41};
  c.heads_q = 8;
  c.heads_kv = 1;
  c.head_dim = 192;
  c.head_dim_v = 128;
  c.bf16 = true;
  c.v_in_k = true;
  c.kv.layout = FA_KV_PAGED;
  c.kv.page_size = 5;
  c.seed = 606;
  v.push_back(c);
  c = {};  // MLA with two speculative tokens (32 packed rows: two m-blocks)
  c.batch = 1;
  c.seqlen_q = 2;
  c.seqlen_k_max = 90 * m;
  c.cache_seqlens = {90 * m};
  c.heads_q = 16;
  c.heads_kv = 1;
  c.head_dim = 576;
  c.head_dim_v = 512;
  c.causal = true;
  c.seed = 602;
  v.push_back(c);
  c = {};  // Gemma-class decode step: append one token with NeoX RoPE, head_dim 512
  c.batch = 2;
  c.seqlen_q = 1;
  c.seqlen_k_max = 64 * m;
  c.cache_seqlens = {63 * m, 20};
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 512;
  c.causal = true;
  c.seqlen_new = 1;
  c.rotary_dim = 256;
  c.kv.layout = FA_KV_PAGED;
  c.kv.page_size = 16;
  c.seed = 603;
  v.push_back(c);
  c = {};  // head_dim 320 with ALiBi and softcap, pointer arrays
  c.batch = 2;
  c.seqlen_q = 1;
  c.seqlen_k_max = 100 * m;
  c.cache_seqlens = {100 * m, 33};
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = 320;
  c.bf16 = true;
  c.softcap = 30;
  c.alibi = {0.125f, 0.5f};
  c.kv.layout = FA_KV_PTR_ARRAY;
  c.num_splits = 2;
  c.seed = 604;
  v.push_back(c);
  return v;
}

fa_runtime *make_runtime(fa_backend backend, std::string *why, int emulator_sm) {
  fa_runtime_options o = FA_RUNTIME_OPTIONS_INIT;
  o.backend = backend;
  o.cache_mode = FA_CACHE_MEMORY;
  o.emulator_sm = emulator_sm;
  fa_runtime *rt = nullptr;
  if (fa_runtime_create(&o, &rt) != FA_SUCCESS) {
    *why = fa_last_error();
    return nullptr;
  }
  return rt;
}

}  // namespace fa::test

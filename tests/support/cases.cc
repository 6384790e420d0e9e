// The numerics case lists: FlashAttention's own test grid shapes, scaled to
// what the emulator runs in seconds, covering every semantic the API offers.
//
// Each case is one line of a table in the line format of
// tests/features/README.md (`forward|decode key=value ...`): split by
// features::split, typed by features::parse and mapped onto ForwardCase /
// DecodeCase by features::to_forward_case / to_decode_case, exactly as the C
// API's feature suite runs a .cases line (so `num_splits` defaults to 1, as
// there: automatic is num_splits=0; decode's `seqlen_k` is seqlen_k_max).
//
// Keys the shared runners take but the feature vocabulary lacks are read here
// only (no front end accepts them in a .cases file); each applies after the
// shared mapping:
//   both ops:
//     on=gpu|emulator        the line is in the list only on a GPU / only on
//                            the emulator (every line is parsed either way)
//     softmax_scale=x        fa_config_desc.softmax_scale (x > 0)
//     sink_values=a,b,...    these fp32 sinks [num_heads_q] (sinks=random
//                            draws them instead)
//     alibi_values=a,b,...   these ALiBi slopes: [num_heads_q], or
//     alibi_stride=n           [batch][n] with n >= num_heads_q
//   forward:
//     padded_strides=1       non-contiguous Q/K/V/O views with gaps
//     input_scale=x          the random N(0, 1) inputs times x
//     seqlens_q=a,b,...      varlen: sequences of these lengths (batch of
//     seqlens_k=a,b,...        each) packed via cu_seqlens; seqlen_q and
//                              seqlen_k bound them
//     descale_transposed=1   with descale=batch_heads: the [batch, heads_kv]
//                            descales transposed (strides {1, batch})
//   decode:
//     hnd=1                  kv_layout=paged: pages [num_pages, heads_kv,
//                            page_size, d]
//     share_prefix=1         kv_layout=paged: sequence 1's first page is
//                            sequence 0's
//     partials_only=1        o.data = 0: only the workspace's partial states
//     batch_invariant=1      fa_decode's batch-invariant splits
//     prefill=1              through fa_launch instead (chunked prefill)
//     rotary_half_table=1    the RoPE table in the dtype, not fp32
//     rotary_positions=1     explicit random per-token RoPE positions
//     v_in_k=1               MLA: V is the first head_dim_v columns of K
//     tree_rule=mod3         tree mask [batch][seqlen_q][seqlen_q]: query i
//                            sees new token j <= i iff j == i or
//                            (i + j + b) % 3 != 0
// A value `N*m`, alone or in a list, is N times the table's GPU scale m: 1
// on the emulator, the m its function names on a GPU (longer sequences).
// An unknown key or value, a key of the other op, or a line the mapping
// cannot express aborts with the line: nothing is skipped.
//
// Two computed lists stay loops below: the head-dim sweep (each dim once,
// dtype and causal derived from it) and FlashAttention's (seqlen_q,
// seqlen_k) pairs crossed with head dims, where the rule is the point.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "npy.h"
#include "support/feature_cases.h"
#include "support/numerics.h"

namespace fa::test {
namespace {

using features::Line;

[[noreturn]] void fail(const Line &l, const std::string &why) {
  const std::string w = why.substr(0, why.find_last_not_of('\n') + 1);  // one line
  std::fprintf(stderr, "%s: %s\n  %s\n", l.where().c_str(), w.c_str(), l.text.c_str());
  std::abort();
}

// v with each element `N*m` of its comma-separated list replaced by N x m
// (anything else is left for the parser to judge).
std::string scaled(const std::string &v, int m) {
  std::string out;
  for (size_t start = 0;;) {
    const size_t comma = v.find(',', start);
    std::string part = v.substr(start, comma == std::string::npos ? comma : comma - start);
    int n = 0;
    if (part.size() > 2 && part.compare(part.size() - 2, 2, "*m") == 0 &&
        features::to_int(part.substr(0, part.size() - 2), &n))
      part = std::to_string(n * m);
    out += part;
    if (comma == std::string::npos) return out;
    out += ',';
    start = comma + 1;
  }
}

bool flag(const std::string &v, bool *b) {
  if (v != "0" && v != "1") return false;
  *b = v == "1";
  return true;
}

// A varlen case's sequence lengths.
bool lens(const std::string &v, bool *varlen, std::vector<int> *out) {
  *varlen = true;
  return features::to_ints(v, out);
}

// A numerics-only key: how it sets the mapped case (false: a bad value).
template <typename Case>
struct Key {
  const char *name;
  bool (*set)(const std::string &v, Case *c);
};

template <typename Case>
std::vector<Key<Case>> with_common(std::vector<Key<Case>> keys) {
  keys.insert(keys.end(), {{"softmax_scale",
                            [](const std::string &v, Case *c) {
                              return features::to_float(v, &c->softmax_scale) &&
                                     c->softmax_scale > 0;
                            }},
                           {"sink_values",
                            [](const std::string &v, Case *c) {
                              return c->sinks.empty() && features::to_floats(v, &c->sinks);
                            }},
                           {"alibi_values",
                            [](const std::string &v, Case *c) {
                              return c->alibi.empty() && features::to_floats(v, &c->alibi);
                            }},
                           {"alibi_stride", [](const std::string &v, Case *c) {
                              return features::to_int(v, &c->alibi_stride) && c->alibi_stride > 0;
                            }}});
  return keys;
}

// The problems of the keys both ops take ("" when none).
template <typename Case>
std::string check_common(const Case &c) {
  if (!c.sinks.empty() && int(c.sinks.size()) != c.heads_q) return "sinks: not num_heads_q values";
  const size_t n = c.alibi_stride ? size_t(c.batch) * c.alibi_stride : size_t(c.heads_q);
  if (!c.alibi.empty() && (c.alibi.size() != n || (c.alibi_stride && c.alibi_stride < c.heads_q)))
    return "alibi: not num_heads_q values, nor batch rows of alibi_stride >= num_heads_q";
  if (c.alibi.empty() && c.alibi_stride) return "alibi_stride without alibi_values";
  return "";
}

template <typename Case>
struct Op;

template <>
struct Op<ForwardCase> {
  static constexpr const char *name = "forward";
  static std::string map(const features::Spec &s, ForwardCase *c) {
    return features::to_forward_case(s, c);
  }
  static const std::vector<Key<ForwardCase>> &keys() {
    using C = ForwardCase;
    static const auto k = with_common<C>({
        {"padded_strides", [](const std::string &v, C *c) { return flag(v, &c->padded_strides); }},
        {"input_scale",
         [](const std::string &v, C *c) {
           return features::to_float(v, &c->input_scale) && c->input_scale > 0;
         }},
        {"seqlens_q",
         [](const std::string &v, C *c) { return lens(v, &c->varlen, &c->seqlens_q); }},
        {"seqlens_k",
         [](const std::string &v, C *c) { return lens(v, &c->varlen, &c->seqlens_k); }},
        {"descale_transposed",
         [](const std::string &v, C *c) {
           bool t = false;
           if (!flag(v, &t) || (t && (!c->kv_fp8 || c->descale != 2))) return false;
           if (t) c->descale = 3;
           return true;
         }},
    });
    return k;
  }
  static std::string check(const ForwardCase &c) {
    auto fits = [&](const std::vector<int> &lens, int max) {
      return int(lens.size()) == c.batch &&
             std::all_of(lens.begin(), lens.end(), [&](int l) { return l >= 0 && l <= max; });
    };
    if (c.varlen && !(fits(c.seqlens_q, c.seqlen_q) && fits(c.seqlens_k, c.seqlen_k)))
      return "varlen: seqlens_q and seqlens_k need batch values in [0, seqlen_q / seqlen_k]";
    return check_common(c);
  }
};

template <>
struct Op<DecodeCase> {
  static constexpr const char *name = "decode";
  static std::string map(const features::Spec &s, DecodeCase *c) {
    return features::to_decode_case(s, c);
  }
  static const std::vector<Key<DecodeCase>> &keys() {
    using C = DecodeCase;
    static const auto k = with_common<C>({
        {"hnd", [](const std::string &v, C *c) { return flag(v, &c->kv.hnd); }},
        {"share_prefix", [](const std::string &v, C *c) { return flag(v, &c->kv.share_prefix); }},
        {"partials_only", [](const std::string &v, C *c) { return flag(v, &c->partials_only); }},
        {"batch_invariant",
         [](const std::string &v, C *c) { return flag(v, &c->batch_invariant); }},
        {"prefill", [](const std::string &v, C *c) { return flag(v, &c->prefill); }},
        {"rotary_half_table",
         [](const std::string &v, C *c) { return flag(v, &c->rotary_half_table); }},
        {"rotary_positions",
         [](const std::string &v, C *c) { return flag(v, &c->rotary_positions); }},
        {"v_in_k", [](const std::string &v, C *c) { return flag(v, &c->v_in_k); }},
        {"tree_rule",
         [](const std::string &v, C *c) {
           if (v != "mod3" || !c->tree.empty()) return false;
           const size_t sq = size_t(c->seqlen_q);
           c->tree.assign(size_t(c->batch) * sq * sq, 0);
           for (size_t b = 0; b < size_t(c->batch); ++b)
             for (size_t i = 0; i < sq; ++i)
               for (size_t j = 0; j <= i; ++j)
                 c->tree[(b * sq + i) * sq + j] = j == i || (i + j + b) % 3 != 0;
           return true;
         }},
    });
    return k;
  }
  static std::string check(const DecodeCase &c) {
    if ((c.kv.hnd || c.kv.share_prefix) && c.kv.layout != FA_KV_PAGED)
      return "hnd, share_prefix need kv_layout=paged";
    if ((c.rotary_half_table || c.rotary_positions) && !c.rotary_dim)
      return "rotary_half_table, rotary_positions need rotary_dim";
    if (c.v_in_k && (c.seqlen_new || (c.head_dim_v && c.head_dim_v > c.head_dim)))
      return "v_in_k needs head_dim_v <= head_dim and no seqlen_new";
    return check_common(c);
  }
};

// The cases of a table's lines (each `Op<Case>::name ...`) in order, for a
// GPU run (`N*m` values times m) or the emulator's.
template <typename Case, size_t N>
std::vector<Case> table(const char *name, const char *const (&lines)[N], bool gpu, int m) {
  using O = Op<Case>;
  std::vector<Case> out;
  for (size_t i = 0; i < N; ++i) {
    Line l;
    l.file = std::string("cases.cc ") + name;
    l.number = int(i) + 1;
    l.text = lines[i];
    std::string err;
    if (!features::split(&l, &err)) fail(l, err);
    if (l.op != O::name) fail(l, std::string("not a ") + O::name + " line");
    auto key = [](const std::string &k) {
      return std::find_if(O::keys().begin(), O::keys().end(),
                          [&](const Key<Case> &x) { return k == x.name; });
    };
    std::string on;
    std::map<std::string, std::string> own;  // the numerics-only keys
    for (auto it = l.keys.begin(); it != l.keys.end();) {
      it->second = scaled(it->second, gpu ? m : 1);
      if (it->first == "on") {
        on = it->second;
      } else if (key(it->first) != O::keys().end()) {
        own.insert(*it);
      } else {
        ++it;
        continue;
      }
      it = l.keys.erase(it);
    }
    if (!on.empty() && on != "gpu" && on != "emulator")
      fail(l, "key on=" + on + ": not gpu or emulator");
    features::Spec s;
    if (!features::parse(l, &s, &err)) fail(l, err);
    Case c;
    if (const std::string why = O::map(s, &c); !why.empty()) fail(l, why);
    for (const auto &[k, v] : own)
      if (!key(k)->set(v, &c)) fail(l, "key " + k + "=" + v + ": not accepted (cases.cc's keys)");
    if (const std::string why = O::check(c); !why.empty()) fail(l, why);
    if (on.empty() || (on == "gpu") == gpu) out.push_back(std::move(c));
  }
  return out;
}

template <typename T>
void append(std::vector<T> *v, std::vector<T> more) {
  v->insert(v->end(), more.begin(), more.end());
}

const char *const kForward[] = {
    "forward batch=2 seqlen_q=113*m seqlen_k=203*m num_heads_q=4 head_dim=64",
    "forward seqlen_q=128*m seqlen_k=217*m num_heads_q=2 num_heads_kv=1 head_dim=128 dtype=bf16 "
    "causal=1 seed=2",
    "forward seqlen_q=1 seqlen_k=239*m num_heads_q=2 head_dim=32 causal=1 seed=3",
    "forward seqlen_q=108 seqlen_k=256 num_heads_q=2 head_dim=80 window_left=32 window_right=8 "
    "seed=4",
    "forward seqlen_q=64 seqlen_k=80 num_heads_q=2 head_dim=256 dtype=bf16 softcap=30 "
    "input_scale=3 seed=5",
    // rows with no key
    "forward seqlen_q=200 seqlen_k=100 num_heads_q=1 head_dim=40 causal=1 seed=6",
    "forward batch=2 seqlen_q=50 seqlen_k=70 num_heads_q=2 head_dim=64 head_dim_v=32 seed=7",
    "forward batch=2 seqlen_q=33 seqlen_k=47 num_heads_q=6 num_heads_kv=2 head_dim=96 "
    "padded_strides=1 seed=8",
    "forward batch=3 seqlens_q=17,1,40 seqlens_k=30,9,40 seqlen_q=40 seqlen_k=40 num_heads_q=4 "
    "num_heads_kv=2 head_dim=64 causal=1 seed=9",
    "forward seqlen_q=96 seqlen_k=96 num_heads_q=2 head_dim=64 dtype=bf16 causal=1 window_left=16 "
    "seed=10",
    // MQA
    "forward seqlen_q=40 seqlen_k=64 num_heads_q=8 num_heads_kv=1 head_dim=64 seed=11",
    // peaked softmax
    "forward seqlen_q=70 seqlen_k=90 num_heads_q=2 head_dim=64 input_scale=4 seed=12",
    "forward seqlen_q=37 seqlen_k=45 num_heads_q=2 head_dim=64 softmax_scale=0.05 window_left=0 "
    "window_right=0 seed=13",
};

// What the tensor-core tiling makes special (docs/kernels.md): CTAs of 128
// rows, 4 warps x 2 m-tiles of 16 rows, K/V tiles of 64 keys visited from
// the last, a masked loop at either end of the key range and a lean loop
// between.
const char *const kTiling[] = {
    // shorter than one m-tile: 3 warps have no valid row
    "forward seqlen_q=9 seqlen_k=150 num_heads_q=2 num_heads_kv=1 head_dim=64 seed=20",
    // sq > sk causal: rows 0..219 see no key
    "forward seqlen_q=300 seqlen_k=80 num_heads_q=2 head_dim=128 causal=1 seed=21",
    // windows starting and ending inside K/V tiles
    "forward seqlen_q=200 seqlen_k=330 num_heads_q=2 head_dim=64 dtype=bf16 window_left=70 "
    "window_right=37 seed=22",
    // a long window: masked tiles at both ends, lean ones between
    "forward seqlen_q=257 seqlen_k=700 num_heads_q=1 head_dim=128 window_left=300 window_right=5 "
    "seed=23",
    // sequences ending inside a warp's second m-tile (rows 16..31)
    "forward batch=4 seqlens_q=20,150,53,27 seqlens_k=90,130,64,200 seqlen_q=150 seqlen_k=200 "
    "num_heads_q=4 num_heads_kv=1 head_dim=96 causal=1 seed=24",
    // the rescale threshold crossed in later tiles
    "forward seqlen_q=160 seqlen_k=512 num_heads_q=2 head_dim=64 input_scale=6 seed=25",
};

const char *const kDecode[] = {
    "decode batch=3 seqlen_q=1 seqlen_k=300*m cache_seqlens=300*m,1,0 num_heads_q=8 "
    "num_heads_kv=2 head_dim=64 num_splits=0",
    "decode batch=2 seqlen_q=2 seqlen_k=200 cache_seqlens=200,77 num_heads_q=4 head_dim=128 "
    "dtype=bf16 causal=1 num_splits=3 seed=2",
    "decode seqlen_q=1 seqlen_k=520*m cache_seqlens=517*m num_heads_q=32 num_heads_kv=4 "
    "head_dim=128 num_splits=7 seed=3",
    "decode batch=2 seqlen_q=1 seqlen_k=256 cache_seqlens=250,30 num_heads_q=4 num_heads_kv=1 "
    "head_dim=64 window_left=64 num_splits=0 seed=4",
    "decode seqlen_q=3 seqlen_k=100 cache_seqlens=100 num_heads_q=2 head_dim=80 softcap=20 "
    "causal=1 num_splits=0 seed=5",
    "decode batch=2 seqlen_q=1 seqlen_k=128 cache_seqlens=100,128 num_heads_q=2 head_dim=64 "
    "head_dim_v=96 num_splits=64 seed=6",
    // Partial states only (o.data = 0), as a caller merging KV segments uses them.
    "decode batch=2 seqlen_q=2 seqlen_k=190 cache_seqlens=190,45 num_heads_q=6 num_heads_kv=2 "
    "head_dim=64 causal=1 num_splits=6 partials_only=1 seed=7",
};

// Every feature once more, at GPU sizes on a GPU (small on the emulator,
// where each feature also has its own suite): sinks, ALiBi, the KV append
// with RoPE, tree masks, chunked prefill and the paged / pointer-array
// layouts, so that a GPU run exercises their kernels too.
const char *const kFeatureForward[] = {
    // gpt-oss: sinks with a sliding window, causal, GQA
    "forward batch=2 seqlen_q=150*m seqlen_k=150*m num_heads_q=8 num_heads_kv=2 head_dim=64 "
    "causal=1 window_left=128 window_right=0 sink_values=0.5,-1,2,0,1.5,-3,0.25,4 seed=201",
    // ALiBi, causal, bf16, head_dim 128
    "forward batch=2 seqlen_q=97*m seqlen_k=161*m num_heads_q=4 num_heads_kv=1 head_dim=128 "
    "dtype=bf16 causal=1 alibi_values=0.25,0.0625,0.015625,0.00390625 seed=202",
    // ALiBi per sequence, not causal, with softcap
    "forward batch=2 seqlen_q=64*m seqlen_k=90*m num_heads_q=2 head_dim=96 softcap=30 "
    "alibi_values=0.1,0.3,0,0.02 alibi_stride=2 seed=203",
    // varlen with sinks, head_dim 256
    "forward batch=3 seqlens_q=30*m,1,77*m seqlens_k=45*m,60*m,77*m seqlen_q=77*m seqlen_k=77*m "
    "num_heads_q=2 num_heads_kv=1 head_dim=256 causal=1 sink_values=1,-0.5 seed=204",
};

const char *const kFeatureDecode[] = {
    // the engine's step: append one token with NeoX RoPE into 16-key pages
    "decode batch=3 seqlen_q=1 seqlen_k=160*m cache_seqlens=159*m,31,0 num_heads_q=8 "
    "num_heads_kv=2 head_dim=128 dtype=bf16 causal=1 seqlen_new=1 rotary_dim=128 kv_layout=paged "
    "page_size=16 num_splits=0 seed=301",
    // chunked append, GPT-J pairs on part of the head, explicit positions, pointer arrays
    "decode batch=2 seqlen_q=5 seqlen_k=100*m cache_seqlens=90*m,7 num_heads_q=4 num_heads_kv=2 "
    "head_dim=64 causal=1 seqlen_new=5 rotary_dim=32 rotary_interleaved=1 rotary_half_table=1 "
    "rotary_positions=1 kv_layout=ptr_array num_splits=3 seed=302",
    // speculative decoding: a tree of 6 drafted tokens, sinks, HND pages of 3
    "decode batch=2 seqlen_q=6 seqlen_k=120*m cache_seqlens=120*m,50 num_heads_q=4 num_heads_kv=2 "
    "head_dim=64 causal=1 tree_rule=mod3 sink_values=0.5,1,-2,3 kv_layout=paged page_size=3 hnd=1 "
    "num_splits=0 seed=303",
    // ALiBi in decode with splits, shared-prefix pages
    "decode batch=2 seqlen_q=1 seqlen_k=256*m cache_seqlens=256*m,200*m num_heads_q=8 "
    "num_heads_kv=1 head_dim=128 "
    "alibi_values=0.5,0.25,0.125,0.0625,0.03125,0.015625,0.0078125,0.00390625 kv_layout=paged "
    "page_size=32 share_prefix=1 num_splits=4 seed=304",
    // chunked prefill through fa_launch on a paged cache
    "decode batch=2 seqlen_q=40 seqlen_k=200*m cache_seqlens=200*m,64 num_heads_q=4 "
    "num_heads_kv=2 head_dim=64 causal=1 prefill=1 kv_layout=paged page_size=16 num_splits=0 "
    "seed=305",
    // batch-invariant splits
    "decode batch=2 seqlen_q=1 seqlen_k=600*m cache_seqlens=600*m,300 num_heads_q=4 head_dim=64 "
    "dtype=bf16 batch_invariant=1 num_splits=0 seed=306",
};

const char *const kFp8Forward[] = {
    // e4m3, GQA, causal, per-(batch, KV head) descales, bf16 O
    "forward on=emulator batch=2 seqlen_q=40 seqlen_k=70 num_heads_q=4 num_heads_kv=2 head_dim=64 "
    "dtype=bf16 causal=1 q_dtype=e4m3 kv_dtype=e4m3 descale=batch_heads seed=801",
    "forward on=gpu batch=2 seqlen_q=700 seqlen_k=900 num_heads_q=4 num_heads_kv=2 head_dim=128 "
    "dtype=bf16 causal=1 q_dtype=e4m3 kv_dtype=e4m3 descale=batch_heads seed=801",
    // e5m2, one descale per tensor, fp16 O, head_dim 64, softcap, strided
    "forward on=gpu seqlen_q=1000 seqlen_k=1000 num_heads_q=8 head_dim=64 softcap=30 "
    "padded_strides=1 q_dtype=e5m2 kv_dtype=e5m2 descale=tensor seed=802",
    // varlen, transposed descales, head_dim 256 with a window, sinks
    "forward on=gpu batch=3 seqlens_q=300,1,517 seqlens_k=640,200,517 seqlen_q=517 seqlen_k=640 "
    "num_heads_q=8 num_heads_kv=2 head_dim=256 dtype=bf16 window_left=256 window_right=0 "
    "sink_values=0.5,-1,1.5,0,-2,1,0.25,-0.5 q_dtype=e4m3 kv_dtype=e4m3 descale=batch_heads "
    "descale_transposed=1 seed=803",
    // MLA-shaped 576 / 512 (O in slices), Q e5m2 over e4m3 K/V
    "forward on=gpu seqlen_q=200 seqlen_k=400 num_heads_q=8 num_heads_kv=1 head_dim=576 "
    "head_dim_v=512 dtype=bf16 q_dtype=e5m2 kv_dtype=e4m3 descale=batch_heads seed=804",
};

const char *const kLargeHeadForward[] = {
    // Gemma-class: head_dim 512, GQA, causal, softcap, bf16
    "forward batch=2 seqlen_q=70*m seqlen_k=90*m num_heads_q=4 num_heads_kv=2 head_dim=512 "
    "dtype=bf16 causal=1 softcap=50 seed=501",
    // MLA-shaped (576 / 512) over one KV head, sliding window, strided views
    "forward seqlen_q=33*m seqlen_k=60*m num_heads_q=4 num_heads_kv=1 head_dim=576 head_dim_v=512 "
    "causal=1 window_left=40*m window_right=0 padded_strides=1 seed=502",
    // head_dim 264: a K tile padded to 272 columns, O in three slices of 88
    "forward batch=2 seqlen_q=17 seqlen_k=50*m num_heads_q=2 head_dim=264 seed=503",
    // varlen, head_dim 384 with ALiBi and sinks
    "forward batch=2 seqlens_q=25*m,9 seqlens_k=31*m,40 seqlen_q=25*m seqlen_k=40*m num_heads_q=2 "
    "num_heads_kv=1 head_dim=384 dtype=bf16 alibi_values=0.25,0.0625 sink_values=1,-2 seed=504",
};

const char *const kLargeHeadDecode[] = {
    // MLA decode: 16 query heads over one latent KV head, 576 / 512, pages of 64
    "decode batch=2 seqlen_q=1 seqlen_k=200*m cache_seqlens=200*m,77 num_heads_q=16 "
    "num_heads_kv=1 head_dim=576 head_dim_v=512 dtype=bf16 causal=1 kv_layout=paged page_size=64 "
    "num_splits=3 seed=601",
    // the same, V read from the latent K tile
    "decode batch=2 seqlen_q=1 seqlen_k=200*m cache_seqlens=200*m,77 num_heads_q=16 "
    "num_heads_kv=1 head_dim=576 head_dim_v=512 dtype=bf16 causal=1 kv_layout=paged page_size=64 "
    "num_splits=3 v_in_k=1 seed=605",
    // MLA with V in K on pages of 5 (rows gathered one by one), no slices of O
    "decode batch=2 seqlen_q=1 seqlen_k=70*m cache_seqlens=70*m,41 num_heads_q=8 num_heads_kv=1 "
    "head_dim=192 head_dim_v=128 dtype=bf16 v_in_k=1 kv_layout=paged page_size=5 num_splits=0 "
    "seed=606",
    // MLA with two speculative tokens (32 packed rows: two m-blocks)
    "decode seqlen_q=2 seqlen_k=90*m cache_seqlens=90*m num_heads_q=16 num_heads_kv=1 "
    "head_dim=576 head_dim_v=512 causal=1 num_splits=0 seed=602",
    // Gemma-class decode step: append one token with NeoX RoPE, head_dim 512
    "decode batch=2 seqlen_q=1 seqlen_k=64*m cache_seqlens=63*m,20 num_heads_q=4 num_heads_kv=2 "
    "head_dim=512 causal=1 seqlen_new=1 rotary_dim=256 kv_layout=paged page_size=16 num_splits=0 "
    "seed=603",
    // head_dim 320 with ALiBi and softcap, pointer arrays
    "decode batch=2 seqlen_q=1 seqlen_k=100*m cache_seqlens=100*m,33 num_heads_q=2 head_dim=320 "
    "dtype=bf16 softcap=30 alibi_values=0.125,0.5 kv_layout=ptr_array num_splits=2 seed=604",
};

}  // namespace

std::vector<ForwardCase> forward_cases(bool gpu) {
  const int m = gpu ? 4 : 1;  // GPU runs longer sequences
  std::vector<ForwardCase> v = table<ForwardCase>("kForward", kForward, gpu, m);
  ForwardCase c;
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
    v.push_back(c);
  }
  append(&v, table<ForwardCase>("kTiling", kTiling, gpu, m));
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
      v.push_back(c);
    }
  }
  return maybe_quick(v, 3);
}

std::vector<DecodeCase> decode_cases(bool gpu) {
  return maybe_quick(table<DecodeCase>("kDecode", kDecode, gpu, 8), 2);
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

std::vector<ForwardCase> feature_forward_cases(bool gpu) {
  return table<ForwardCase>("kFeatureForward", kFeatureForward, gpu, 4);
}

std::vector<DecodeCase> feature_decode_cases(bool gpu) {
  return table<DecodeCase>("kFeatureDecode", kFeatureDecode, gpu, 8);
}

// One small case on the emulator (the full grid is tests/test_fp8_forward),
// larger ones on a GPU.
std::vector<ForwardCase> fp8_forward_cases(bool gpu) {
  return table<ForwardCase>("kFp8Forward", kFp8Forward, gpu, 1);
}

std::vector<ForwardCase> large_head_forward_cases(bool gpu) {
  return table<ForwardCase>("kLargeHeadForward", kLargeHeadForward, gpu, 8);
}

std::vector<DecodeCase> large_head_decode_cases(bool gpu) {
  return table<DecodeCase>("kLargeHeadDecode", kLargeHeadDecode, gpu, 8);
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

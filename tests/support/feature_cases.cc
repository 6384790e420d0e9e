#include "support/feature_cases.h"

#include <dirent.h>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "support/fp8_kv.h"
#include "support/numerics.h"

namespace fa::test::features {
namespace {

// v is one of `names`; *index its position.
bool one_of(const std::string &v, std::initializer_list<const char *> names, int *index) {
  int i = 0;
  for (const char *n : names) {
    if (v == n) {
      *index = i;
      return true;
    }
    ++i;
  }
  return false;
}

const struct {
  const char *name;
  fa_status status;
} kStatuses[] = {{"INVALID_ARGUMENT", FA_ERROR_INVALID_ARGUMENT},
                 {"UNSUPPORTED", FA_ERROR_UNSUPPORTED},
                 {"OUT_OF_MEMORY", FA_ERROR_OUT_OF_MEMORY},
                 {"BUFFER_TOO_SMALL", FA_ERROR_BUFFER_TOO_SMALL}};

}  // namespace

bool to_int(const std::string &v, int *out) {
  const char *end = v.data() + v.size();
  const auto r = std::from_chars(v.data(), end, *out);
  return !v.empty() && r.ec == std::errc() && r.ptr == end;
}

bool to_float(const std::string &v, float *out) {
  char *end = nullptr;
  *out = std::strtof(v.c_str(), &end);
  return !v.empty() && end == v.c_str() + v.size() && std::isfinite(*out);
}

namespace {
template <typename T, typename Parse>
bool to_list(const std::string &v, std::vector<T> *out, Parse parse) {
  out->clear();
  std::stringstream in(v);
  T x;
  for (std::string part; std::getline(in, part, ',');) {
    if (!parse(part, &x)) return false;
    out->push_back(x);
  }
  return !v.empty() && v.back() != ',';
}
}  // namespace

bool to_ints(const std::string &v, std::vector<int> *out) { return to_list(v, out, to_int); }
bool to_floats(const std::string &v, std::vector<float> *out) { return to_list(v, out, to_float); }

std::vector<std::string> feature_names() {
  std::vector<std::string> out;
  if (DIR *d = opendir(FA_TEST_FEATURES_DIR)) {
    while (const dirent *e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 6 && n.compare(n.size() - 6, 6, ".cases") == 0)
        out.push_back(n.substr(0, n.size() - 6));
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool split(Line *l, std::string *err) {
  l->op.clear();
  l->keys.clear();
  std::istringstream in(l->text);
  if (!(in >> l->op)) return true;
  if (l->op != "forward" && l->op != "decode" && l->op != "reduce" && l->op != "reject") {
    *err = l->where() + ": unknown op \"" + l->op + "\"";
    return false;
  }
  for (std::string tok; in >> tok;) {
    const size_t eq = tok.find('=');
    if (eq == std::string::npos || eq == 0) {
      *err = l->where() + ": \"" + tok + "\" is not key=value";
      return false;
    }
    if (!l->keys.emplace(tok.substr(0, eq), tok.substr(eq + 1)).second) {
      *err = l->where() + ": key " + tok.substr(0, eq) + " given twice";
      return false;
    }
  }
  return true;
}

bool load(const std::string &name, std::vector<Line> *lines, std::string *err) {
  const std::string path = std::string(FA_TEST_FEATURES_DIR) + "/" + name + ".cases";
  std::ifstream f(path);
  if (!f) {
    *err = path + ": cannot be read";
    return false;
  }
  std::string text;
  for (int number = 1; std::getline(f, text); ++number) {
    Line l;
    l.file = name + ".cases";
    l.number = number;
    l.text = text.substr(0, text.find('#'));
    if (!split(&l, err)) return false;
    if (l.op.empty()) continue;  // blank or comment
    l.text = text;
    lines->push_back(std::move(l));
  }
  return true;
}

std::vector<int> Spec::lens() const {
  // Without cache_seqlens the cache is full after an append of seqlen_new.
  return cache_seqlens.empty() ? std::vector<int>(size_t(std::max(batch, 0)), seqlen_k - seqlen_new)
                               : cache_seqlens;
}

bool parse(const Line &line, Spec *s, std::string *err) {
  *s = Spec();
  s->op = line.op;
  s->reject = line.op == "reject";
  std::map<std::string, int *> ints = {{"batch", &s->batch},
                                       {"seqlen_q", &s->seqlen_q},
                                       {"seqlen_k", &s->seqlen_k},
                                       {"num_heads_q", &s->heads_q},
                                       {"num_heads_kv", &s->heads_kv},
                                       {"head_dim", &s->head_dim},
                                       {"head_dim_v", &s->head_dim_v},
                                       {"num_splits", &s->num_splits},
                                       {"window_left", &s->window_left},
                                       {"window_right", &s->window_right},
                                       {"page_size", &s->page_size},
                                       {"seqlen_new", &s->seqlen_new},
                                       {"rotary_dim", &s->rotary_dim}};
  // Keys whose value may be any int >= lowest.
  const std::map<std::string, int> lowest = {{"window_left", -1}, {"window_right", -1},
                                             {"num_splits", 0},   {"page_size", 0},
                                             {"seqlen_new", 0},   {"rotary_dim", 0}};
  for (const auto &[key, v] : line.keys) {
    auto bad = [&](const char *why) {
      *err = "key " + key + "=" + v + ": " + why;
      return false;
    };
    int i = 0;
    if (auto it = ints.find(key); it != ints.end()) {
      const auto lo = lowest.find(key);
      if (!to_int(v, it->second) || *it->second < (lo == lowest.end() ? 1 : lo->second))
        return bad("not an integer in range");
    } else if (key == "seed") {
      if (!to_int(v, &i) || i < 0) return bad("not an integer >= 0");
      s->seed = uint32_t(i);
    } else if (key == "softcap") {
      if (!to_float(v, &s->softcap) || s->softcap < 0) return bad("not a number >= 0");
    } else if (key == "dtype") {
      if (!one_of(v, {"fp16", "bf16"}, &i)) return bad("not fp16 or bf16");
      s->bf16 = i == 1;
    } else if (key == "causal" || key == "rotary_interleaved") {
      if (!one_of(v, {"0", "1"}, &i)) return bad("not 0 or 1");
      (key == "causal" ? s->causal : s->rotary_interleaved) = i == 1;
    } else if (key == "cache_seqlens") {
      if (!to_ints(v, &s->cache_seqlens) ||
          std::any_of(s->cache_seqlens.begin(), s->cache_seqlens.end(),
                      [](int l) { return l < 0; }))
        return bad("not a list of integers >= 0");
    } else if (key == "kv_layout") {
      if (!one_of(v, {"contiguous", "paged", "ptr_array"}, &i)) return bad("unknown layout");
      s->kv_layout = i == 0 ? FA_KV_CONTIGUOUS : i == 1 ? FA_KV_PAGED : FA_KV_PTR_ARRAY;
    } else if (key == "alibi_slopes") {
      if (!one_of(v, {"heads", "batch"}, &i)) return bad("not heads or batch");
      s->alibi = v;
    } else if (key == "sinks") {
      if (v != "random") return bad("not random");
      s->sinks = true;
    } else if (key == "tree_mask") {
      if (!one_of(v, {"batch", "shared", "chain"}, &i)) return bad("not batch, shared or chain");
      s->tree = v;
    } else if (key == "kv_dtype" || key == "q_dtype") {
      if (!one_of(v, {"e4m3", "e5m2"}, &i)) return bad("not e4m3 or e5m2");
      (key == "kv_dtype" ? s->kv_dtype : s->q_dtype) = i ? FA_DTYPE_FP8_E5M2 : FA_DTYPE_FP8_E4M3;
    } else if (key == "descale") {
      if (!one_of(v, {"tensor", "batch_heads"}, &i)) return bad("not tensor or batch_heads");
      s->descale = v;
    } else if (key == "lse_partial_format" || key == "lse_format") {
      if (!one_of(v, {"natural", "base2"}, &i)) return bad("not natural or base2");
      (key == "lse_format" ? s->lse_base2 : s->lse_partial_base2) = i == 1;
    } else if (s->reject && key == "of") {
      if (!one_of(v, {"forward", "decode", "reduce"}, &i))
        return bad("not forward, decode or reduce");
      s->op = v;
    } else if (s->reject && key == "bad") {
      s->bad = v;  // checked by the front end's mutation table
    } else if (s->reject && key == "message") {
      s->message = v;
    } else if (s->reject && key == "status") {
      const auto *st = std::find_if(std::begin(kStatuses), std::end(kStatuses),
                                    [&](const auto &x) { return v == x.name; });
      if (st == std::end(kStatuses)) return bad("unknown status");
      s->status = st->status;
      s->status_name = v;
    } else {
      *err = "unknown key " + key;
      return false;
    }
  }
  const char *alone = s->rotary_dim > 0 && s->seqlen_new == 0 && s->bad != "rotary_without_new"
                          ? "rotary_dim needs seqlen_new"
                      : !s->descale.empty() && !s->kv_dtype && s->bad != "descale_without_fp8"
                          ? "descale needs kv_dtype"
                      : s->q_dtype && !s->kv_dtype ? "q_dtype needs kv_dtype"
                                                   : nullptr;
  if (alone) {
    *err = alone;
    return false;
  }
  if (s->reject && (s->op == "reject" || s->bad.empty() || s->message.empty())) {
    *err = "a reject line needs of=, bad= and message=";
    return false;
  }
  for (int l : s->lens()) {
    if (s->op != "reduce" && (l < 0 || l + s->seqlen_new > s->seqlen_k)) {
      *err = "cache_seqlens + seqlen_new outside [0, seqlen_k]";
      return false;
    }
  }
  if (!s->cache_seqlens.empty() && int(s->cache_seqlens.size()) != s->batch) {
    *err = "cache_seqlens has " + std::to_string(s->cache_seqlens.size()) + " values, batch is " +
           std::to_string(s->batch);
    return false;
  }
  return true;
}

std::vector<float> alibi_slopes(const Spec &s) {
  if (s.alibi.empty()) return {};
  std::mt19937 gen(s.seed + 1000);
  std::uniform_real_distribution<float> u(0.01f, 0.5f);
  std::vector<float> out(size_t(s.alibi == "batch" ? s.batch : 1) * s.heads_q);
  for (float &x : out) x = u(gen);
  return out;
}

std::vector<float> sinks(const Spec &s) {
  if (!s.sinks) return {};
  std::mt19937 gen(s.seed + 2000);
  std::uniform_real_distribution<float> u(-2.0f, 6.0f);
  std::vector<float> out(size_t(s.heads_q));
  for (float &x : out) x = u(gen);
  if (s.heads_q > 1) out[1] = -INFINITY;
  return out;
}

std::vector<uint8_t> tree_bits(const Spec &s) {
  if (s.tree.empty()) return {};
  const int n = s.tree == "shared" ? 1 : s.batch, sq = s.seqlen_q;
  std::mt19937 gen(s.seed + 3000);
  std::vector<uint8_t> bits(size_t(n) * sq * sq, 0);
  for (int t = 0; t < n; ++t) {
    std::vector<int> parent(size_t(sq), -1);
    for (int i = 0; i < sq; ++i) {
      if (i > 0 && s.tree != "chain") parent[i] = std::uniform_int_distribution<int>(0, i - 1)(gen);
      for (int j = 0; j <= i; ++j) {  // chain: every earlier token
        if (s.tree == "chain") bits[(size_t(t) * sq + i) * sq + j] = 1;
      }
      for (int j = i; s.tree != "chain" && j >= 0; j = parent[j])
        bits[(size_t(t) * sq + i) * sq + j] = 1;
    }
  }
  return bits;
}

namespace {

// The C mutation of `bad` on the arguments of s.op; false when it has none.
bool c_mutation(const Spec &s, Reject *r) {
  const int hq = s.heads_q, sq = s.seqlen_q, rd = s.rotary_dim;
  const std::string &b = s.bad, &op = s.op;
  auto both = [&](auto f) {  // forward and decode share the field
    r->forward = [f](fa_forward_args *a) { f(a); };
    r->decode = [f](fa_decode_args *a) { f(a); };
  };
  if (b == "alibi_slopes_misaligned" && op != "reduce") {
    both([](auto *a) { a->alibi_slopes += 2; });
  } else if (b == "alibi_slopes_stride" && op != "reduce") {
    both([hq](auto *a) { a->alibi_slopes_stride = hq - 1; });
  } else if (b == "sinks_misaligned") {
    both([](auto *a) { a->sinks += 2; });
    r->reduce = [](fa_reduce_args *a) { a->sinks += 2; };
  } else if (b == "sinks_without_combine" && op == "decode") {
    r->decode = [](fa_decode_args *a) { a->o.data = 0, a->lse = 0; };  // no output at all
  } else if (b == "tree_mask_row_stride" && op == "decode") {
    r->decode = [sq](fa_decode_args *a) { a->tree_mask_stride[1] = 4 * ((sq + 31) / 32) - 4; };
  } else if (b == "lse_format" && op == "reduce") {
    r->reduce = [](fa_reduce_args *a) { a->lse_format = static_cast<fa_lse_format>(7); };
  } else if (b == "descale_stride" && op != "reduce") {
    both([](auto *a) { a->descale_stride[0] = -1, a->descale_stride[1] = 0; });
  } else if (b == "descale_without_fp8" && op == "decode") {
    // Any 4-byte aligned device pointer: the call must refuse before reading.
    r->decode = [](fa_decode_args *a) { a->k_descale = a->v_descale = a->cache_seqlens; };
  } else if (b == "rotary_dim" && op == "decode") {
    r->decode = [](fa_decode_args *a) { a->rotary_dim = 8; };
  } else if (b == "rotary_without_new" && op == "decode") {
    // A whole rotary setup (tables at a valid pointer, one row) but no k_new.
    r->decode = [rd](fa_decode_args *a) {
      a->rotary_dim = rd;
      a->rotary_cos = a->rotary_sin = a->q.data;
      a->seqlen_ro = 1;
    };
  } else if (b == "page_size" && op != "reduce") {
    both([](auto *a) { a->kv.page_size = 0; });
  } else {
    return false;
  }
  r->status = s.status;
  r->message = s.message;
  return true;
}

std::string not_expressible(const std::string &why) { return "not expressible: " + why + "\n"; }

// The sizes every op needs; "" when present.
std::string need_sizes(const Spec &s, bool forward_or_decode) {
  if (s.seqlen_q < 1 || s.heads_q < 1) return "missing seqlen_q or num_heads_q\n";
  if (forward_or_decode && (s.seqlen_k < 1 || s.head_dim < 1))
    return "missing seqlen_k or head_dim\n";
  if (!forward_or_decode && s.dv() < 1) return "missing head_dim_v\n";
  return "";
}

// The problems of a forward or decode line's keys common to both mappings.
std::string forward_or_decode_keys(const Spec &s) {
  const std::string sizes = need_sizes(s, true);
  if (!sizes.empty()) return sizes;
  if (s.lse_base2 || s.lse_partial_base2)
    return not_expressible("lse_partial_format, lse_format are reduce's");
  return "";
}

}  // namespace

std::string to_forward_case(const Spec &s, ForwardCase *c) {
  const std::string keys = forward_or_decode_keys(s);
  if (!keys.empty()) return keys;
  if (!s.cache_seqlens.empty() || s.kv_layout != FA_KV_CONTIGUOUS || !s.tree.empty() ||
      s.seqlen_new || s.rotary_dim)
    return not_expressible(
        "cache_seqlens, kv_layout, tree_mask, seqlen_new, rotary_dim are decode's");
  if ((s.kv_dtype != 0) != (s.q_dtype != 0))
    return not_expressible("the fp8 forward takes q_dtype and kv_dtype together");
  *c = ForwardCase();
  c->batch = s.batch, c->seqlen_q = s.seqlen_q, c->seqlen_k = s.seqlen_k;
  c->heads_q = s.heads_q, c->heads_kv = s.hkv(), c->head_dim = s.head_dim;
  c->head_dim_v = s.head_dim_v > 0 ? s.head_dim_v : 0;
  c->bf16 = s.bf16, c->causal = s.causal, c->window_left = s.window_left;
  c->window_right = s.window_right, c->softcap = s.softcap, c->seed = s.seed;
  c->alibi = alibi_slopes(s);
  c->alibi_stride = s.alibi == "batch" ? s.heads_q : 0;
  c->sinks = sinks(s);
  c->q_fp8 = s.q_dtype, c->kv_fp8 = s.kv_dtype;
  // descale 2: [batch, num_heads_kv] rows (with a gap after each); without
  // fp8 the field is unused and keeps its default.
  if (s.kv_dtype) c->descale = s.descale.empty() ? 0 : s.descale == "tensor" ? 1 : 2;
  return "";
}

std::string to_decode_case(const Spec &s, DecodeCase *c) {
  const std::string keys = forward_or_decode_keys(s);
  if (!keys.empty()) return keys;
  if (s.window_right != -1)
    return not_expressible("window_right on decode (the decode runner has no field)");
  if (s.q_dtype || s.kv_dtype)
    return not_expressible("q_dtype, kv_dtype on decode (fp8 caches: fp8_kv.h's runner)");
  *c = DecodeCase();
  c->batch = s.batch, c->seqlen_q = s.seqlen_q, c->seqlen_k_max = s.seqlen_k;
  c->cache_seqlens = s.lens();
  c->heads_q = s.heads_q, c->heads_kv = s.hkv(), c->head_dim = s.head_dim;
  c->head_dim_v = s.head_dim_v > 0 ? s.head_dim_v : 0;
  c->bf16 = s.bf16, c->causal = s.causal, c->window_left = s.window_left, c->softcap = s.softcap;
  c->num_splits = s.num_splits, c->seed = s.seed;
  c->kv.layout = s.kv_layout;
  c->kv.page_size = s.kv_layout == FA_KV_PAGED ? s.page_size : 0;  // paged only
  c->tree = tree_bits(s);
  c->tree_shared = s.tree == "shared";
  c->sinks = sinks(s);
  c->alibi = alibi_slopes(s);
  c->alibi_stride = s.alibi == "batch" ? s.heads_q : 0;
  c->seqlen_new = s.seqlen_new, c->rotary_dim = s.rotary_dim;
  c->rotary_interleaved = s.rotary_interleaved;
  return "";
}

namespace {

std::string run_forward_line(const Spec &s, const Reject *rej, fa_runtime *rt, fa_runtime *rt89) {
  ForwardCase c;
  const std::string why = to_forward_case(s, &c);
  if (!why.empty()) return why;
  c.reject = rej;
  return run_forward(s.kv_dtype ? rt89 : rt, c);
}

std::string run_decode16_line(const Spec &s, const Reject *rej, fa_runtime *rt) {
  DecodeCase c;
  const std::string why = to_decode_case(s, &c);
  if (!why.empty()) return why;
  c.reject = rej;
  return run_decode(rt, c);
}

std::string run_decode8_line(const Spec &s, const Reject *rej, fa_runtime *rt89) {
  if (!s.alibi.empty()) return not_expressible("the fp8 decode runner has no alibi_slopes");
  if (!s.tree.empty() && s.tree != "batch")
    return not_expressible("the fp8 decode runner draws its own tree per sequence only");
  fp8kv::Case c;
  c.batch = s.batch, c.seqlen_q = s.seqlen_q, c.skmax = s.seqlen_k, c.lens = s.lens();
  c.hq = s.heads_q, c.hkv = s.hkv(), c.d = s.head_dim, c.dv = s.head_dim_v > 0 ? s.head_dim_v : 0;
  c.bf16 = s.bf16, c.e5m2 = s.kv_dtype == FA_DTYPE_FP8_E5M2, c.causal = s.causal;
  c.window_left = s.window_left, c.softcap = s.softcap, c.splits = s.num_splits;
  c.layout = s.kv_layout == FA_KV_PAGED       ? fp8kv::kPagedNhd
             : s.kv_layout == FA_KV_PTR_ARRAY ? fp8kv::kPtrs
                                              : fp8kv::kContig;
  c.page_size = s.page_size;
  c.descale = s.descale.empty() ? 0 : s.descale == "tensor" ? 1 : 2;
  c.tree = !s.tree.empty(), c.sinks = s.sinks;
  c.direct = true;  // fa_decode with its own combine, as the line says
  c.seqlen_new = s.seqlen_new;
  c.rotary = s.rotary_dim ? (s.rotary_interleaved ? 2 : 1) : 0;
  c.rotary_dim = s.rotary_dim;
  c.seed = s.seed;
  c.reject = rej;
  return fp8kv::run_case(rt89, c);
}

}  // namespace

std::string run_c(const Spec &s, fa_runtime *rt, fa_runtime *rt89) {
  const std::string sizes = need_sizes(s, s.op != "reduce");
  if (!sizes.empty()) return sizes;
  if (s.window_right != -1 && s.op != "forward")
    return not_expressible("window_right on " + s.op + " (the decode runner has no field)");
  Reject r;
  if (s.reject && !c_mutation(s, &r)) return not_expressible("bad=" + s.bad + " for of=" + s.op);
  const Reject *rej = s.reject ? &r : nullptr;
  if (s.op == "forward") return run_forward_line(s, rej, rt, rt89);
  if (s.op == "decode") {
    if (s.q_dtype) return not_expressible("q_dtype on decode");
    return s.kv_dtype ? run_decode8_line(s, rej, rt89) : run_decode16_line(s, rej, rt);
  }
  // reduce
  if (s.seqlen_k > 0 || s.head_dim > 0 || s.heads_kv > 0 || !s.alibi.empty() || !s.tree.empty() ||
      s.kv_dtype || s.q_dtype || s.causal || s.seqlen_new || s.rotary_dim ||
      s.kv_layout != FA_KV_CONTIGUOUS || !s.cache_seqlens.empty())
    return not_expressible(
        "reduce takes batch, seqlen_q, num_heads_q, head_dim_v, num_splits, "
        "dtype, sinks, lse formats, seed");
  const std::vector<float> sk = sinks(s);
  return run_reduce(rt, s.num_splits, s.batch, s.seqlen_q, s.heads_q, s.dv(), s.bf16, s.seed,
                    s.sinks ? &sk : nullptr, false,
                    (s.lse_partial_base2 ? 1 : 0) | (s.lse_base2 ? 2 : 0), rej);
}

}  // namespace fa::test::features

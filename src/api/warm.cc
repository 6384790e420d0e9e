// fa_cache_warm and its presets: spec lines -> kernel specs per target SM ->
// fa::warm_store. The spec language (cache/README.md, "Warming") names the
// fields of fa_config_desc and fa_generate_options, so a line means exactly
// what fa_config_create + fa_generate_for would build.
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "api/api_internal.h"
#include "backend/ptx_compiler.h"
#include "cache/store.h"
#include "runtime/warm.h"

namespace {

using fa::fail;
using namespace fa::api;

// ---- Presets --------------------------------------------------------------

// The attention of a model, as served: what its layers ask of flashattn.
struct Model {
  const char *name, *description;
  const char *dtype;
  int head_dim, head_dim_v, num_heads_q, num_heads_kv;
  const char *softcap;  // "" = off
  bool sinks;
  // MLA (DeepSeek): prefill on the decompressed heads (head_dim / head_dim_v
  // above), decode on the latent cache: K of mla_dim, V its first
  // head_dim_v_latent columns (v_in_k), one KV head, mla_heads_q query heads.
  int mla_dim = 0, mla_dim_v = 0;
  const char *mla_heads_q = "";
};

const Model kModels[] = {
    {"llama-3-8b", "Llama 3 / 3.1 8B: 32 query heads, 8 KV heads, head_dim 128", "bf16", 128, 128,
     32, 8, "", false},
    {"llama-3-70b", "Llama 3 / 3.1 / 3.3 70B: 64 query heads, 8 KV heads, head_dim 128", "bf16",
     128, 128, 64, 8, "", false},
    {"qwen2.5-7b", "Qwen2.5 7B: 28 query heads, 4 KV heads, head_dim 128", "bf16", 128, 128, 28, 4,
     "", false},
    {"qwen3-32b", "Qwen3 32B: 64 query heads, 8 KV heads, head_dim 128", "bf16", 128, 128, 64, 8,
     "", false},
    {"mistral-7b",
     "Mistral 7B: 32 query heads, 8 KV heads, head_dim 128 (sliding window: a launch value)",
     "bf16", 128, 128, 32, 8, "", false},
    {"gemma-2-9b", "Gemma 2 9B: 16 query heads, 8 KV heads, head_dim 256, softcap 50", "bf16", 256,
     256, 16, 8, "50", false},
    {"gemma-3-12b", "Gemma 3 12B: 16 query heads, 8 KV heads, head_dim 256", "bf16", 256, 256, 16,
     8, "", false},
    {"gpt-oss", "gpt-oss 20B / 120B: 64 query heads, 8 KV heads, head_dim 64, attention sinks",
     "bf16", 64, 64, 64, 8, "", true},
    {"deepseek-v3",
     "DeepSeek V3 / R1 MLA: prefill head_dim 192 / 128 over 128 heads; decode on "
     "the latent cache (576 / 512, one KV head; 16 or 128 query heads per GPU)",
     "bf16", 192, 128, 128, 128, "", false, 576, 512, "16,128"},
};

// A preset's spec lines: the forward (fixed-length and varlen, and varlen
// over a paged cache: chunked prefill), the decode over a contiguous and a
// paged cache (16-token pages; 64 for MLA, FlashMLA's) in 16-bit and e4m3,
// and the combine (fa_decode_reduce; fa_decode runs it too).
std::string preset_text(const Model &m) {
  std::ostringstream s;
  char head[160];
  std::snprintf(head, sizeof head,
                "dtype=%s head_dim=%d head_dim_v=%d num_heads_q=%d num_heads_kv=%d", m.dtype,
                m.head_dim, m.head_dim_v, m.num_heads_q, m.num_heads_kv);
  std::string extra;
  if (m.softcap[0]) extra += std::string(" softcap=") + m.softcap;
  const std::string sinks = m.sinks ? " sinks=1" : "";
  s << "# " << m.name << ": " << m.description << "\n";
  s << "forward " << head << extra << sinks << " varlen=0,1\n";
  s << "forward " << head << extra << sinks << " varlen=1 kv_layout=paged page_size=16\n";
  std::string dec = head + extra;
  int page = 16;
  if (m.mla_dim) {
    char mla[160];
    std::snprintf(mla, sizeof mla,
                  "dtype=%s head_dim=%d head_dim_v=%d num_heads_q=%s num_heads_kv=1 v_in_k=1",
                  m.dtype, m.mla_dim, m.mla_dim_v, m.mla_heads_q);
    dec = mla;
    page = 64;
  }
  s << "decode " << dec << " kv_dtype=0,e4m3\n";
  s << "decode " << dec << " kv_dtype=0,e4m3 kv_layout=paged page_size=" << page << "\n";
  s << "reduce dtype=" << m.dtype << " head_dim=" << (m.mla_dim ? m.mla_dim : m.head_dim)
    << " head_dim_v=" << (m.mla_dim ? m.mla_dim_v : m.head_dim_v) << sinks << "\n";
  return s.str();
}

struct Presets {
  std::string list;                          // "<name>: <description>\n" per preset
  std::map<std::string, std::string> texts;  // name -> spec lines
  Presets() {
    for (const Model &m : kModels) {
      list += std::string(m.name) + ": " + m.description + "\n";
      texts[m.name] = preset_text(m);
    }
  }
};

const Presets &presets() {
  static const Presets p;
  return p;
}

// ---- Spec lines -------------------------------------------------------------

// One field of a spec line: where its value goes and how it is read.
struct Setting {
  fa_config_desc desc;
  fa_generate_options opts;
};
enum class Kind { kInt, kFloat, kDtype, kFp8, kLayout, kRotary, kLse };
struct Field {
  const char *name;
  Kind kind;
  void (*set)(Setting *s, double v);
};

#define FA_FIELD(NAME, KIND, TARGET)                                                   \
  {                                                                                    \
#NAME, Kind::KIND,                                                                 \
        [](Setting * s, double v) { s->TARGET = static_cast<decltype(s->TARGET)>(v); } \
  }
const Field kFields[] = {
    FA_FIELD(dtype, kDtype, desc.dtype),
    FA_FIELD(head_dim, kInt, desc.head_dim),
    FA_FIELD(head_dim_v, kInt, desc.head_dim_v),
    FA_FIELD(num_heads_q, kInt, desc.num_heads_q),
    FA_FIELD(num_heads_kv, kInt, desc.num_heads_kv),
    FA_FIELD(softcap, kFloat, desc.softcap),
    FA_FIELD(kv_dtype, kFp8, desc.kv_dtype),
    FA_FIELD(q_dtype, kFp8, desc.q_dtype),
    FA_FIELD(kv_layout, kLayout, opts.kv_layout),
    FA_FIELD(page_size, kInt, opts.page_size),
    FA_FIELD(varlen, kInt, opts.varlen),
    FA_FIELD(seqused_k, kInt, opts.seqused_k),
    FA_FIELD(tree_mask, kInt, opts.tree_mask),
    FA_FIELD(lse_partial_format, kLse, opts.lse_partial_format),
    FA_FIELD(lse_format, kLse, opts.lse_format),
    FA_FIELD(sinks, kInt, opts.sinks),
    FA_FIELD(alibi, kInt, opts.alibi),
    FA_FIELD(append_kv, kInt, opts.append_kv),
    FA_FIELD(rotary, kRotary, opts.rotary),
    FA_FIELD(rotary_dtype, kDtype, opts.rotary_dtype),
    FA_FIELD(v_in_k, kInt, opts.v_in_k),
};
#undef FA_FIELD

// Named values of the enum-like fields (a number is taken too).
struct Name {
  Kind kind;
  const char *name;
  int value;
};
const Name kNames[] = {
    {Kind::kDtype, "fp16", FA_DTYPE_FP16},
    {Kind::kDtype, "bf16", FA_DTYPE_BF16},
    {Kind::kDtype, "fp32", FA_DTYPE_FP32},
    {Kind::kFp8, "e4m3", FA_DTYPE_FP8_E4M3},
    {Kind::kFp8, "e5m2", FA_DTYPE_FP8_E5M2},
    {Kind::kLayout, "contiguous", FA_KV_CONTIGUOUS},
    {Kind::kLayout, "paged", FA_KV_PAGED},
    {Kind::kLayout, "ptr_array", FA_KV_PTR_ARRAY},
    {Kind::kRotary, "neox", 1},
    {Kind::kRotary, "gptj", 2},
    {Kind::kLse, "natural", FA_LSE_NATURAL},
    {Kind::kLse, "base2", FA_LSE_BASE2},
};

// *v from text: a name of the field's kind, else a number (an integer for
// all but kFloat). False when neither.
bool parse_value(Kind kind, const std::string &text, double *v) {
  for (const Name &n : kNames) {
    if (n.kind == kind && text == n.name) {
      *v = n.value;
      return true;
    }
  }
  if (text.empty()) return false;
  errno = 0;
  char *end = nullptr;
  if (kind == Kind::kFloat) {
    *v = std::strtod(text.c_str(), &end);
    return errno == 0 && *end == '\0' && std::isfinite(*v);
  }
  const long long x = std::strtoll(text.c_str(), &end, 10);
  *v = static_cast<double>(x);
  return errno == 0 && *end == '\0' && x >= INT32_MIN && x <= INT32_MAX;
}

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

// One expanded spec line: what fa_generate_for would be called with.
struct Item {
  fa::AttentionConfig cfg;
  int kind = 0;  // fa_kernel_kind
  fa_generate_options opts;
  std::string where;  // "<source> line N"
};

// Appends the items of one line: the product of its comma-separated
// alternatives. Errors: INVALID_ARGUMENT naming `where` and the key.
fa_status parse_line(const std::string &line, const std::string &where, std::vector<Item> *out) {
  std::istringstream in(line);
  std::string kind_word, word;
  in >> kind_word;
  const int kind = kind_word == "forward"  ? FA_KERNEL_FORWARD
                   : kind_word == "decode" ? FA_KERNEL_DECODE
                   : kind_word == "reduce" ? FA_KERNEL_REDUCE
                                           : -1;
  FA_REQUIRE(kind >= 0, "%s: the first word must be forward, decode or reduce, got '%s'",
             where.c_str(), kind_word.c_str());
  // Each key's alternatives, in line order.
  std::vector<std::pair<const Field *, std::vector<double>>> keys;
  while (in >> word) {
    const size_t eq = word.find('=');
    FA_REQUIRE(eq != std::string::npos && eq > 0, "%s: '%s' is not key=value", where.c_str(),
               word.c_str());
    const std::string key = word.substr(0, eq);
    const Field *field = nullptr;
    for (const Field &f : kFields) {
      if (key == f.name) field = &f;
    }
    FA_REQUIRE(field != nullptr,
               "%s: unknown key '%s' (the fields of fa_config_desc and fa_generate_options: "
               "dtype, head_dim, head_dim_v, num_heads_q, num_heads_kv, softcap, kv_dtype, "
               "q_dtype, kv_layout, page_size, varlen, seqused_k, tree_mask, lse_partial_format, "
               "lse_format, sinks, alibi, append_kv, rotary, rotary_dtype, v_in_k)",
               where.c_str(), key.c_str());
    for (const auto &k : keys) {
      FA_REQUIRE(k.first != field, "%s: '%s' given twice", where.c_str(), key.c_str());
    }
    std::vector<double> values;
    for (const std::string &text : split(word.substr(eq + 1), ',')) {
      double v = 0;
      FA_REQUIRE(parse_value(field->kind, text, &v), "%s: '%s' is not a value of %s", where.c_str(),
                 text.c_str(), key.c_str());
      values.push_back(v);
    }
    keys.emplace_back(field, std::move(values));
  }
  std::vector<size_t> pick(keys.size(), 0);
  for (;;) {
    Setting s;
    s.desc = FA_CONFIG_DESC_INIT;
    s.desc.num_heads_q = s.desc.num_heads_kv = 1;
    s.opts = FA_GENERATE_OPTIONS_INIT;
    for (size_t i = 0; i < keys.size(); ++i) keys[i].first->set(&s, keys[i].second[pick[i]]);
    Item item;
    item.kind = kind;
    item.opts = s.opts;
    item.where = where;
    if (fa_status st = config_from_desc(&s.desc, &item.cfg); st != FA_SUCCESS) {
      fa::prefix_error(where.c_str());
      return st;
    }
    out->push_back(item);
    size_t i = 0;  // the next combination, the last key fastest
    for (; i < keys.size(); ++i) {
      size_t k = keys.size() - 1 - i;
      if (++pick[k] < keys[k].second.size()) break;
      pick[k] = 0;
    }
    if (i == keys.size()) break;
  }
  return FA_SUCCESS;
}

// The items of a text of spec lines ('#' starts a comment).
fa_status parse_text(const std::string &text, const std::string &source, std::vector<Item> *out) {
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    FA_CHECK(parse_line(line, source + " line " + std::to_string(n), out));
  }
  return FA_SUCCESS;
}

void copy_text(char *dst, size_t cap, const std::string &src) {
  std::snprintf(dst, cap, "%s", src.c_str());
}

fa_status warm(const fa_cache_warm_options *options, fa_cache_warm_progress *result) {
  FA_REQUIRE(options != nullptr, "options is NULL");
  FA_CHECK(check_struct_size("options", options->struct_size, sizeof(fa_cache_warm_options)));
  if (result != nullptr) {
    FA_CHECK(check_struct_size("result", result->struct_size, sizeof(fa_cache_warm_progress)));
  }
  const fa_cache_warm_options &o = *options;
  FA_REQUIRE(o.sms != nullptr && o.num_sms >= 1, "sms must name at least one SM (num_sms %d)",
             o.num_sms);
  FA_REQUIRE(o.jobs >= 0, "jobs must be >= 0 (0 = the online CPUs), got %d", o.jobs);
  FA_REQUIRE(o.ptx_compiler == FA_PTX_COMPILER_AUTO || o.ptx_compiler == FA_PTX_COMPILER_OFF,
             "ptx_compiler must be FA_PTX_COMPILER_AUTO or _OFF, got %lld",
             static_cast<long long>(o.ptx_compiler));
  FA_REQUIRE(o.presets != nullptr || o.specs != nullptr, "neither presets nor specs is set");
  for (int i = 0; i < o.num_sms; ++i) {
    fa::DeviceLimits lim;
    if (!fa::published_limits(o.sms[i], &lim)) {
      return fail(FA_ERROR_UNSUPPORTED, "sms[%d] must be one of %s, got %d", i, kSupportedSms,
                  o.sms[i]);
    }
  }
  std::vector<Item> items;
  if (o.presets != nullptr) {
    for (const std::string &name : split(o.presets, ',')) {
      auto it = presets().texts.find(name);
      FA_REQUIRE(it != presets().texts.end(), "unknown preset '%s'; the presets:\n%s", name.c_str(),
                 presets().list.c_str());
      FA_CHECK(parse_text(it->second, "preset " + name, &items));
    }
  }
  if (o.specs != nullptr) FA_CHECK(parse_text(o.specs, "specs", &items));

  // One kernel policy for the whole warm, the environment's as a runtime's.
  const fa::KernelPolicy policy = fa::KernelPolicy::from_env();
  std::vector<fa::KernelSpec> specs;
  uint64_t skipped = 0;
  for (int i = 0; i < o.num_sms; ++i) {
    for (const Item &item : items) {
      fa::KernelSpec spec;
      const fa_status st =
          kernel_spec_for(item.cfg, item.kind, o.sms[i], &item.opts, policy, &spec);
      if (st == FA_ERROR_UNSUPPORTED) {  // this SM cannot run it: not an error
        fa::clear_error();
        ++skipped;
        continue;
      }
      if (st != FA_SUCCESS) {
        fa::prefix_error(item.where.c_str());
        return st;
      }
      specs.push_back(spec);
    }
  }

  fa::cache::Options copts;
  if (o.cache_dir != nullptr) copts.dir = o.cache_dir;
  std::unique_ptr<fa::cache::Store> store = fa::cache::open_store(copts);
  const fa::cache::Stats cs = store->stats();
  if (!cs.persistent || cs.read_only) {
    return fail(FA_ERROR_CACHE, "the cache %s cannot be written: %s",
                cs.path.empty() ? (o.cache_dir ? o.cache_dir : "(default)") : cs.path.c_str(),
                cs.note.c_str());
  }
  const fa::ptxc::PluginState *plugin = nullptr;
  if (o.ptx_compiler == FA_PTX_COMPILER_AUTO && fa::ptxc::plugin_state().plugin != nullptr) {
    plugin = &fa::ptxc::plugin_state();
  }
  fa_cache_warm_progress p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  copy_text(p.compiler, sizeof p.compiler, plugin ? plugin->version : "");
  auto fill = [&](const fa::WarmCounts &c) {
    p.total = c.total;
    p.done = c.done;
    p.built = c.built;
    p.present = c.present;
    p.failed = c.failed;
    p.skipped = skipped;
    p.bytes = c.bytes;
    p.seconds = c.seconds;
  };
  fa::WarmProgressFn report;
  if (o.progress != nullptr) {
    report = [&](const fa::WarmCounts &c, const fa::KernelSpec &spec) {
      fill(c);
      const std::string text = spec.describe();
      p.spec = text.c_str();
      p.sm = spec.sm;
      o.progress(&p, o.user);
    };
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const int jobs = o.jobs > 0 ? o.jobs : static_cast<int>(cpus > 0 ? cpus : 1);
  fa::WarmResult r;
  fa::warm_store(*store, specs, plugin, jobs, report, &r);
  fill(r.counts);
  p.spec = nullptr;
  p.sm = 0;
  if (result != nullptr) *result = p;
  if (r.counts.failed > 0) {
    return fail(FA_ERROR_COMPILE, "%llu of %llu kernels failed to compile; the first: %s",
                static_cast<unsigned long long>(r.counts.failed),
                static_cast<unsigned long long>(r.counts.total), r.first_failure.c_str());
  }
  return FA_SUCCESS;
}

}  // namespace

extern "C" {

FA_API fa_status fa_cache_warm(const fa_cache_warm_options *options,
                               fa_cache_warm_progress *result) {
  return guarded("fa_cache_warm", [&]() -> fa_status { return warm(options, result); });
}

FA_API const char *fa_cache_warm_presets(void) {
  fa::clear_error();
  try {
    return presets().list.c_str();
  } catch (...) {
    return "";
  }
}

FA_API const char *fa_cache_warm_preset(const char *name) {
  const char *text = nullptr;
  guarded("fa_cache_warm_preset", [&]() -> fa_status {
    FA_REQUIRE(name != nullptr, "name is NULL");
    auto it = presets().texts.find(name);
    FA_REQUIRE(it != presets().texts.end(), "unknown preset '%s'; the presets:\n%s", name,
               presets().list.c_str());
    text = it->second.c_str();
    return FA_SUCCESS;
  });
  return text;
}

}  // extern "C"

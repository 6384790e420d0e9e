// The feature descriptions (tests/features/<feature>.cases, format in its
// README.md) for the C API and CLI suites: the line parser, the typed keys
// of a line (every key known, every value in range: anything else is an
// error, never skipped), the random inputs a line names (ALiBi slopes,
// sinks, tree masks; seeded with the line's seed), and the C API's run of a
// line through the shared runners (numerics.h, fp8_kv.h) on the emulator.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "flashattn.h"

namespace fa::test {
struct ForwardCase;
struct DecodeCase;
}  // namespace fa::test

namespace fa::test::features {

// One non-comment line of a .cases file.
struct Line {
  std::string file;  // "alibi.cases"
  int number = 0;    // 1-based line number
  std::string text;
  std::string op;  // forward, decode, reduce, reject
  std::map<std::string, std::string> keys;
  std::string where() const { return file + ":" + std::to_string(number); }
};

// The feature files' names without ".cases" (FA_TEST_FEATURES_DIR), sorted.
std::vector<std::string> feature_names();

// Splits line->text (a '#' comment already cut off) into line->op and
// line->keys: false with *err (naming line->where()) when the op is not
// forward, decode, reduce or reject, a token is not key=value or a key
// repeats. A blank text leaves op "".
bool split(Line *line, std::string *err);

// Reads tests/features/<name>.cases, each line through split(). false with
// *err (naming the file and line) when unreadable or a line does not split.
bool load(const std::string &name, std::vector<Line> *lines, std::string *err);

// A key's value as an int, a finite float, or a comma-separated list of
// either (no spaces); false when it is not one.
bool to_int(const std::string &v, int *out);
bool to_float(const std::string &v, float *out);
bool to_ints(const std::string &v, std::vector<int> *out);
bool to_floats(const std::string &v, std::vector<float> *out);

// A line's keys, typed. Sizes absent from the line are -1 (the op's mapping
// requires what it needs); other fields hold the README's defaults.
struct Spec {
  std::string op;  // forward, decode, reduce (reject: the op of `of`)
  bool reject = false;
  int batch = 1, seqlen_q = -1, seqlen_k = -1, heads_q = -1, heads_kv = -1;
  int head_dim = -1, head_dim_v = -1, num_splits = 1;
  bool bf16 = false, causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0;
  uint32_t seed = 1;
  std::vector<int> cache_seqlens;  // empty: lens()
  int kv_layout = FA_KV_CONTIGUOUS;
  int page_size = 16;
  std::string alibi;  // "", "heads", "batch"
  bool sinks = false;
  std::string tree;               // "", "batch", "shared", "chain"
  int kv_dtype = 0, q_dtype = 0;  // FA_DTYPE_FP8_E4M3 / _E5M2, 0 = none
  std::string descale;            // "", "tensor", "batch_heads"
  int seqlen_new = 0, rotary_dim = 0;
  bool rotary_interleaved = false;
  bool lse_partial_base2 = false, lse_base2 = false;
  // reject
  std::string bad, message;
  fa_status status = FA_ERROR_INVALID_ARGUMENT;
  std::string status_name = "INVALID_ARGUMENT";
  int hkv() const { return heads_kv > 0 ? heads_kv : heads_q; }
  int dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  // cache_seqlens, or seqlen_k - seqlen_new each (full after the append)
  std::vector<int> lens() const;
};

// Types and checks a line's keys; false with *err naming the key.
bool parse(const Line &line, Spec *spec, std::string *err);

// ALiBi slopes uniform in [0.01, 0.5]: [heads_q] for "heads", [batch,
// heads_q] for "batch"; empty without alibi_slopes.
std::vector<float> alibi_slopes(const Spec &s);
// Sinks uniform in [-2, 6], head 1 -inf (heads_q > 1); empty without sinks.
std::vector<float> sinks(const Spec &s);
// The tree mask bits [n][seqlen_q][seqlen_q] (n = 1 for "shared", else
// batch; 1 = query i sees new token j); empty without tree_mask.
std::vector<uint8_t> tree_bits(const Spec &s);

// The shared runners' case (numerics.h) of a forward line, or of a decode
// line with a 16-bit cache (decode: seqlen_k is seqlen_k_max): "" with *c
// set, or why the line is not one ("not expressible: ...", or the size
// missing). Fields no key sets keep the struct's defaults.
std::string to_forward_case(const Spec &s, ForwardCase *c);
std::string to_decode_case(const Spec &s, DecodeCase *c);

// Runs a line through the C API on rt (sm_80) or, for fp8 lines, rt89;
// the problems found ("" = passed; "not expressible: ..." for a line the C
// runners cannot express, which fails too).
std::string run_c(const Spec &s, fa_runtime *rt, fa_runtime *rt89);

}  // namespace fa::test::features

// The subcommands of the `flashattn` program. main.cc parses the command line
// (CLI11) into these option structs; each command uses only the public C API.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "flashattn.h"

namespace fa::cli {

// Exit codes: 0 success / PASS, 1 runtime failure / FAIL, 2 usage error.
constexpr int kExitOk = 0;
constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;

// Thrown by the commands; main() prints what() as one line and exits with code.
struct Failure : std::runtime_error {
  Failure(int exit_code, const std::string &message)
      : std::runtime_error(message), code(exit_code) {}
  int code;
};

// Options shared by `generate`, `run` and `decode`.
struct AttentionOptions {
  std::string dtype = "fp16";  // fp16 | bf16
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  double softcap = 0;
  double softmax_scale = 0;  // 0 = 1/sqrt(head_dim)
};

struct GenerateOptions {
  AttentionOptions attn;
  std::string kind;  // forward | decode | reduce | backward-pre | backward | backward-post
  int head_dim = 0;
  int head_dim_v = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int sm = 80;
  std::string kv_layout;                       // "" | contiguous | paged | ptrs (forward, decode)
  int page_size = 0;                           // paged: tokens per page (selects per-tile lookups)
  bool varlen = false;                         // forward, backward: cu_seqlens_q/k
  bool seqused_k = false;                      // forward: per-sequence key counts
  bool tree_mask = false;                      // decode: the tree-mask variant
  bool sinks = false;                          // forward, reduce, backward: attention sinks
  bool alibi = false;                          // forward, decode, backward: the ALiBi variant
  bool append_kv = false;                      // decode: the KV-append variant
  bool v_in_k = false;                         // decode: V read from the K tile (MLA)
  std::string rotary;                          // decode: "" | neox | gptj (implies append_kv)
  bool rotary_table16 = false;                 // decode: rotary tables in the dtype, not fp32
  std::string kv_dtype;                        // decode: "" | e4m3 | e5m2 (an fp8 KV cache)
  std::string q_dtype;                         // forward: "" | e4m3 | e5m2 (the fp8 forward)
  std::string lse_partial_format = "natural";  // reduce: natural | base2
  std::string lse_format = "natural";          // reduce: natural | base2
  std::string output;                          // "" = stdout
};

struct RunOptions {
  AttentionOptions attn;
  std::string backend = "auto";  // auto | cuda | emulator
  int emulator_sm = 0;           // emulator target SM; 0 = FLASHATTN_EMU_SM or 80
  std::string q, k, v;           // input .npy paths (decode: k/v caches)
  std::string cache_seqlens;     // decode only
  int num_splits = 0;            // decode only; 0 = automatic
  bool batch_invariant = false;  // decode only
  std::string kv_layout;     // "" (contiguous, or paged with page_size) | contiguous | paged | ptrs
  int page_size = 0;         // paged: tokens per page
  uint32_t seed = 1;         // paged: block_table shuffle
  std::string seqused_k;     // run only: keys per sequence .npy ("" = seqlen_k)
  std::string tree_mask;     // decode only: bool/int [batch or 1, seqlen_q, seqlen_q] .npy
  std::string sinks;         // attention sinks: float [heads_q] .npy ("" = none)
  std::string alibi_slopes;  // ALiBi: float [heads_q] or [batch, heads_q] .npy ("" = none)
  bool alibi = false;        // ALiBi with the standard slopes
  // decode only, KV append (fa_decode_args.k_new): new keys/values
  // [batch, seqlen_new, heads_kv, d] appended at cache_seqlens; RoPE tables
  // float [seqlen_ro, rotary_dim / 2] and optional int positions [batch, n].
  std::string k_new, v_new, rotary_cos, rotary_sin, rotary_positions;
  bool rotary_interleaved = false;
  // decode only: "" (the cache in dtype) | e4m3 | e5m2: the K/V .npy values
  // quantised to fp8 bytes with descales per kv_scale ("head": per (batch,
  // KV head), "tensor": one per cache) = amax / 448 (e4m3) or amax / 57344.
  // run: "" | e4m3 | e5m2 (kv_dtype defaults to it): the fp8 forward, the
  // Q .npy values quantised as K/V (Q's descale group: a KV head's queries).
  std::string kv_dtype;
  std::string kv_scale = "head";
  std::string q_dtype;
  std::string out;
  std::string lse_out;
  std::string ref;  // optional reference O .npy
};

struct CacheOptions {
  std::string action;     // stats | list | clear | warm | presets
  std::string cache_dir;  // "" = the default location
  // warm
  std::string sms;        // "80,86,89,90a,100a,120"
  std::string presets;    // comma-separated preset names
  std::string spec_file;  // spec lines (cache/README.md, "Warming")
  int jobs = 0;           // 0 = the online CPUs
  bool ptx_only = false;  // no cubins even with the plugin
  // presets
  std::string preset;  // print this preset's spec lines ("" = list them)
};

int cmd_generate(const GenerateOptions &o);
int cmd_run(const RunOptions &o);
int cmd_decode(const RunOptions &o);
int cmd_cache(const CacheOptions &o);

// Tolerance documented in `run --help`: max_abs <= atol * max(1, max|ref|)
// with atol = 1e-2 (fp16) or 2e-2 (bf16), rel_l2 < 1e-2, no non-finite value.
constexpr double kAtolFp16 = 1e-2;
constexpr double kAtolBf16 = 2e-2;
// run --q-dtype (the fp8 forward, P rounded to e4m3): atol and rel_l2 3e-2.
constexpr double kAtolFp8 = 3e-2;
constexpr double kRelL2Max = 1e-2;

}  // namespace fa::cli

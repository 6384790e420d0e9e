// `flashattn`: generate kernels, run attention on .npy files against an fp64
// reference, and inspect the kernel cache. This file only parses the command
// line; the commands live in commands.h.
#include <CLI/CLI.hpp>

#include <climits>
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "flashattn.h"

namespace {

using fa::cli::AttentionOptions;

const char kToleranceText[] =
    "Check: the output is compared with an fp64 reference computed on the same\n"
    "rounded inputs. PASS needs, for O: max_abs <= atol * max(1, max|ref|) with\n"
    "atol = 1e-2 for fp16 and 2e-2 for bf16, rel_l2 < 1e-2 and no non-finite\n"
    "value; the same max_abs rule for LSE (where -inf must match exactly) and,\n"
    "with --ref, for O against that file.\n"
    "Exit status: 0 PASS, 1 FAIL or runtime failure, 2 usage error.";

// Options common to generate, run and decode.
void add_attention_options(CLI::App *app, AttentionOptions *a, bool dtype_required) {
  auto *dt = app->add_option("--dtype", a->dtype,
                             "Element type of Q, K, V and O: fp16 or bf16 (generate: also fp32, "
                             "fp32 tensors rounded to bf16 on load)")
                 ->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
  if (dtype_required) {
    dt->required();
  } else {
    dt->capture_default_str();
  }
  app->add_flag("--causal", a->causal, "Causal mask, bottom-right aligned");
  app->add_option("--window-left", a->window_left,
                  "Sliding window: keys left of the diagonal (-1 = unbounded)")
      ->check(CLI::Range(-1, INT_MAX))
      ->capture_default_str();
  app->add_option("--window-right", a->window_right,
                  "Sliding window: keys right of the diagonal (-1 = unbounded)")
      ->check(CLI::Range(-1, INT_MAX))
      ->capture_default_str();
  app->add_option("--softcap", a->softcap, "Score soft-capping: s = X * tanh(s / X); 0 = off")
      ->capture_default_str();
  app->add_option("--softmax-scale", a->softmax_scale, "Score scale; 0 = 1/sqrt(head_dim)")
      ->capture_default_str();
}

// --kv-layout / --page-size / --seed of run and decode.
void add_kv_options(CLI::App *app, fa::cli::RunOptions *o) {
  app->add_option("--kv-layout", o->kv_layout,
                  "How K/V reach the kernel: contiguous (the .npy as it is), paged (pages of "
                  "--page-size tokens in a pool, shuffled block_table, unused rows NaN) or ptrs "
                  "(one allocation per sequence). Default: paged with --page-size, else "
                  "contiguous. A paged or ptrs run is also compared with the same launch on the "
                  "contiguous cache")
      ->check(CLI::IsMember({"contiguous", "paged", "ptrs"}));
  app->add_option("--page-size", o->page_size,
                  "Tokens per page of the paged layout (>= 1; 0 = not paged; at most the power "
                  "of two at or above seqlen_k_max)")
      ->check(CLI::Range(0, INT_MAX))
      ->capture_default_str();
  app->add_option("--seed", o->seed, "Seed of the paged layout's page shuffle")
      ->capture_default_str();
}

void add_backend_option(CLI::App *app, std::string *backend) {
  app->add_option("--backend", *backend,
                  "auto (cuda when a GPU exists, else emulator), cuda or emulator")
      ->check(CLI::IsMember({"auto", "cuda", "emulator"}))
      ->capture_default_str();
}

void add_emulator_sm_option(CLI::App *app, int *sm) {
  app->add_option("--emulator-sm", *sm,
                  "SM the emulator runs as (80, 86, 87, 89, 90, 100, 103, 110, 120, 121): its "
                  "limits and kernels, as the runtime picks them; 0 = $FLASHATTN_EMU_SM or 80")
      ->check(CLI::IsMember({0, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121}))
      ->capture_default_str();
}

// Makes a parse error one line.
std::string one_line(std::string s) {
  for (char &c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// The deepest subcommand named on the command line ("flashattn cache list").
std::string command_path(const CLI::App &app) {
  std::string path = "flashattn";
  const CLI::App *cur = &app;
  while (cur) {
    const auto subs = cur->get_subcommands();
    if (subs.empty()) break;
    cur = subs.front();
    path += " " + cur->get_name();
  }
  return path;
}

bool has_subcommand(CLI::App *app, const std::string &name) {
  return !app->get_subcommands([&](CLI::App *s) { return s->get_name() == name; }).empty();
}

int run_main(int argc, char **argv) {
  CLI::App app{
      "flashattn: generate, run and cache FlashAttention kernels (PTX, CUDA or the CPU emulator)",
      "flashattn"};
  app.set_version_flag("--version", std::string("flashattn ") + fa_version_string());
  app.require_subcommand(1);
  app.footer(
      "Run 'flashattn SUBCOMMAND --help' for its options.\n"
      "Exit status: 0 success (PASS), 1 FAIL or runtime failure, 2 usage error.");

  // generate
  fa::cli::GenerateOptions gen;
  gen.attn.dtype = "";
  CLI::App *g = app.add_subcommand("generate", "Print the PTX module of a kernel (needs no GPU)");
  g->add_option("--kind", gen.kind,
                "Kernel: forward, decode or reduce; or one of fa_backward's three, in launch "
                "order: backward-pre (per row: D, LSE in log2 units), backward (the main kernel: "
                "dK, dV, dQ accumulated), backward-post (per row: dQ, dsinks)")
      ->required()
      ->check(CLI::IsMember(
          {"forward", "decode", "reduce", "backward-pre", "backward", "backward-post"}));
  add_attention_options(g, &gen.attn, true);
  g->add_option("--head-dim", gen.head_dim,
                "head_dim of Q and K (multiple of 8, 8..576; past 256 on sm_80+)")
      ->required();
  g->add_option("--head-dim-v", gen.head_dim_v, "head_dim of V and O; 0 = head_dim")
      ->capture_default_str();
  g->add_option("--heads-q", gen.heads_q, "num_heads_q")->required();
  g->add_option("--heads-kv", gen.heads_kv, "num_heads_kv (divides num_heads_q)")->required();
  g->add_option("--sm", gen.sm, "Target SM: 80, 86, 87, 89, 90, 100, 103, 110, 120 or 121")
      ->required();
  g->add_option("--kv-layout", gen.kv_layout,
                "KV cache layout the kernel reads (forward, decode): contiguous, paged or ptrs "
                "(default: paged with --page-size, else contiguous)")
      ->check(CLI::IsMember({"contiguous", "paged", "ptrs"}));
  g->add_option("--page-size", gen.page_size,
                "Paged layout: tokens per page; multiples of the kernel's key tile (decode 16, "
                "forward its block_n) look the page up once per tile, others once per row")
      ->check(CLI::Range(0, INT_MAX))
      ->capture_default_str();
  g->add_flag("--varlen", gen.varlen,
              "Forward, backward: the kernel of a varlen launch (packed sequences: "
              "cu_seqlens_q/k)");
  g->add_flag("--seqused-k", gen.seqused_k,
              "Forward: the kernel reads per-sequence key counts (seqused_k)");
  g->add_flag("--tree-mask", gen.tree_mask,
              "Decode: the kernel applies a speculative-decoding tree mask (tree_mask)");
  g->add_flag("--sinks", gen.sinks,
              "Forward, reduce, backward: the kernel adds attention sinks (gpt-oss) to each "
              "row's denominator (backward: and their gradient)");
  g->add_flag("--alibi", gen.alibi,
              "Forward, decode, backward: the kernel adds ALiBi's linear bias");
  g->add_flag("--append-kv", gen.append_kv,
              "Decode: the kernel appends k_new/v_new to the cache in the same launch");
  g->add_flag("--v-in-k", gen.v_in_k,
              "Decode: V is K's first head_dim_v columns (the same cache: MLA's latent cache), "
              "read from the K tile; forward: v is k's memory (on sm_100/103 at MLA's dims, the "
              "MLA kernel fa_launch runs)");
  g->add_option("--rotary", gen.rotary,
                "Decode: ... and rotates Q and the new keys first (RoPE): neox or gptj pairs "
                "(implies --append-kv)")
      ->check(CLI::IsMember({"neox", "gptj"}));
  g->add_flag("--rotary-table16", gen.rotary_table16,
              "Decode with --rotary: cos/sin tables in the config's dtype instead of fp32");
  g->add_option("--kv-dtype", gen.kv_dtype,
                "Decode: the kernel for an fp8 KV cache (fa_config_desc.kv_dtype; sm_89 and up); "
                "forward with --q-dtype: K/V's fp8 format (default: --q-dtype's)")
      ->check(CLI::IsMember({"e4m3", "e5m2"}))
      ->type_name("e4m3|e5m2");
  g->add_option("--q-dtype", gen.q_dtype,
                "Forward: the fp8 forward's kernel, Q, K and V fp8 (fa_config_desc.q_dtype; sm_89 "
                "and up)")
      ->check(CLI::IsMember({"e4m3", "e5m2"}))
      ->type_name("e4m3|e5m2");
  g->add_option("--lse-partial-format", gen.lse_partial_format,
                "Reduce: the base of the partial LSEs read: natural or base2 (FlashInfer)")
      ->check(CLI::IsMember({"natural", "base2"}))
      ->capture_default_str();
  g->add_option("--lse-format", gen.lse_format,
                "Reduce: the base of the LSE written: natural or base2")
      ->check(CLI::IsMember({"natural", "base2"}))
      ->capture_default_str();
  g->add_option("-o,--output", gen.output, "Write the PTX to FILE instead of stdout")
      ->type_name("FILE");

  // run
  fa::cli::RunOptions run;
  CLI::App *r = app.add_subcommand(
      "run", "Run the forward kernel on Q/K/V .npy files and check it against an fp64 reference");
  r->add_option("--q", run.q, "Q [batch, seqlen_q, heads_q, head_dim], any float dtype")
      ->required()
      ->type_name("Q.npy");
  r->add_option("--k", run.k, "K [batch, seqlen_k, heads_kv, head_dim]")
      ->required()
      ->type_name("K.npy");
  r->add_option("--v", run.v, "V [batch, seqlen_k, heads_kv, head_dim_v]")
      ->required()
      ->type_name("V.npy");
  r->add_option("--seqused-k", run.seqused_k,
                "Keys per sequence, integer [batch], each in [0, seqlen_k] (default: seqlen_k); "
                "the queries are the last seqlen_q of them (chunked prefill)")
      ->type_name("S.npy");
  r->add_option("--sinks", run.sinks,
                "Attention sinks (gpt-oss): float [heads_q], one natural-log logit per query "
                "head in each row's softmax denominator, compared with the scaled scores")
      ->type_name("SINKS.npy");
  r->add_option("--alibi-slopes", run.alibi_slopes,
                "ALiBi: float [heads_q] or [batch, heads_q] slopes; the logit of query i, key j "
                "loses slope * |i + seqlen_k - seqlen_q - j|")
      ->type_name("SLOPES.npy");
  r->add_flag("--alibi", run.alibi,
              "ALiBi with the standard slopes 2^(-8(h+1)/heads_q) (BLOOM's rule when heads_q is "
              "not a power of two)");
  CLI::Option *run_q_dtype =
      r->add_option(
           "--q-dtype", run.q_dtype,
           "The fp8 forward (sm_89+): quantise the Q, K and V .npy values to e4m3 or e5m2 "
           "bytes (round to nearest even, saturating) with descales amax / 448 (e4m3) or "
           "amax / 57344 (e5m2) per --kv-scale group (Q's: the queries of a KV head); O in "
           "--dtype; the reference uses the values the bytes hold; tolerance 3e-2 (P is "
           "rounded to e4m3)")
          ->check(CLI::IsMember({"e4m3", "e5m2"}))
          ->type_name("e4m3|e5m2");
  r->add_option("--kv-dtype", run.kv_dtype, "With --q-dtype: K/V's fp8 format (default: Q's)")
      ->check(CLI::IsMember({"e4m3", "e5m2"}))
      ->type_name("e4m3|e5m2");
  r->add_option("--kv-scale", run.kv_scale,
                "With --q-dtype: one descale per (batch, kv head) (head, the default) or per "
                "tensor (tensor)")
      ->needs(run_q_dtype)
      ->check(CLI::IsMember({"head", "tensor"}))
      ->type_name("head|tensor");
  add_kv_options(r, &run);
  add_attention_options(r, &run.attn, false);
  add_backend_option(r, &run.backend);
  add_emulator_sm_option(r, &run.emulator_sm);
  r->add_option("--out", run.out, "Write O as float32 [batch, seqlen_q, heads_q, head_dim_v]")
      ->required()
      ->type_name("O.npy");
  r->add_option("--lse-out", run.lse_out, "Write LSE as float32 [batch, heads_q, seqlen_q]")
      ->type_name("LSE.npy");
  r->add_option("--ref", run.ref, "Also compare O with this reference output")
      ->type_name("O_ref.npy");
  r->footer(kToleranceText);

  // decode
  fa::cli::RunOptions dec;
  CLI::App *d = app.add_subcommand("decode",
                                   "Run Flash-Decoding (split-KV + combine) on .npy files and "
                                   "check it against an fp64 reference");
  d->add_option("--q", dec.q, "Q [batch, seqlen_q, heads_q, head_dim], any float dtype")
      ->required()
      ->type_name("Q.npy");
  d->add_option("--k-cache", dec.k, "K cache [batch, seqlen_k_max, heads_kv, head_dim]")
      ->required()
      ->type_name("K.npy");
  d->add_option("--v-cache", dec.v, "V cache [batch, seqlen_k_max, heads_kv, head_dim_v]")
      ->required()
      ->type_name("V.npy");
  d->add_option("--cache-seqlens", dec.cache_seqlens,
                "Valid keys per sequence, integer [batch], each in [0, seqlen_k_max]")
      ->required()
      ->type_name("S.npy");
  d->add_option("--num-splits", dec.num_splits, "KV splits per sequence; 0 = automatic")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  d->add_flag("--batch-invariant", dec.batch_invariant,
              "Splits of a fixed " + std::to_string(FA_DECODE_INVARIANT_SPLIT) +
                  " keys, so a sequence's output bits do not depend on the rest of the batch "
                  "(needs --num-splits 0)");
  d->add_option("--tree-mask", dec.tree_mask,
                "Speculative decoding: bool or integer [batch, seqlen_q, seqlen_q] (or [1, ...] "
                "for one tree): query i sees new token j iff element [b, i, j] is nonzero; the "
                "cached prefix stays visible; --causal and windows still apply on top")
      ->type_name("MASK.npy");
  d->add_option("--sinks", dec.sinks,
                "Attention sinks (gpt-oss): float [heads_q], one natural-log logit per query "
                "head, added to each row's denominator once, in the combine")
      ->type_name("SINKS.npy");
  d->add_option("--alibi-slopes", dec.alibi_slopes,
                "ALiBi: float [heads_q] or [batch, heads_q] slopes; new token i, key j of a "
                "sequence with cache_seqlens L: bias -slope * |i + L - seqlen_q - j|")
      ->type_name("SLOPES.npy");
  d->add_flag("--alibi", dec.alibi,
              "ALiBi with the standard slopes 2^(-8(h+1)/heads_q) (BLOOM's rule when heads_q is "
              "not a power of two)");
  d->add_option("--k-new", dec.k_new,
                "KV append (as flash_attn_with_kvcache): new keys [batch, seqlen_new, heads_kv, "
                "head_dim] written into the cache at --cache-seqlens (the lengths before the "
                "append) and attended to in the same launch")
      ->type_name("K_NEW.npy");
  d->add_option("--v-new", dec.v_new,
                "KV append: new values [batch, seqlen_new, heads_kv, "
                "head_dim_v] (with --k-new)")
      ->type_name("V_NEW.npy");
  d->add_option("--rotary-cos", dec.rotary_cos,
                "Rotary embedding of Q and the new keys: cos table float [seqlen_ro, rotary_dim "
                "/ 2] (rotary_dim a multiple of 16, <= head_dim; needs --k-new)")
      ->type_name("COS.npy");
  d->add_option("--rotary-sin", dec.rotary_sin, "Rotary embedding: sin table, as --rotary-cos")
      ->type_name("SIN.npy");
  d->add_flag("--rotary-interleaved", dec.rotary_interleaved,
              "Rotary pairs (2i, 2i+1) (GPT-J) instead of (i, i + rotary_dim / 2) (GPT-NeoX)");
  d->add_option("--rotary-positions", dec.rotary_positions,
                "Rotary position of each query / new token: integer [batch, n], n >= seqlen_q "
                "and seqlen_new (default: cache_seqlens + t)")
      ->type_name("POS.npy");
  CLI::Option *dec_kv_dtype =
      d->add_option("--kv-dtype", dec.kv_dtype,
                    "fp8 KV cache (sm_89+): quantise the K/V .npy values to e4m3 or e5m2 bytes "
                    "(round to nearest even, saturating) with descales amax / 448 (e4m3) or amax / "
                    "57344 (e5m2) over each --kv-scale group of valid rows; the reference uses the "
                    "values the bytes hold")
          ->check(CLI::IsMember({"e4m3", "e5m2"}))
          ->type_name("e4m3|e5m2");
  d->add_option("--kv-scale", dec.kv_scale,
                "With --kv-dtype: one descale per (batch, kv head) (head, the default) or per "
                "cache tensor (tensor)")
      ->needs(dec_kv_dtype)
      ->check(CLI::IsMember({"head", "tensor"}))
      ->type_name("head|tensor");
  add_kv_options(d, &dec);
  add_attention_options(d, &dec.attn, false);
  add_backend_option(d, &dec.backend);
  add_emulator_sm_option(d, &dec.emulator_sm);
  d->add_option("--out", dec.out, "Write O as float32 [batch, seqlen_q, heads_q, head_dim_v]")
      ->required()
      ->type_name("O.npy");
  d->add_option("--lse-out", dec.lse_out, "Write LSE as float32 [batch, heads_q, seqlen_q]")
      ->type_name("LSE.npy");
  d->add_option("--ref", dec.ref, "Also compare O with this reference output")
      ->type_name("O_ref.npy");
  d->footer(kToleranceText);

  // cache
  fa::cli::CacheOptions cache;
  CLI::App *c = app.add_subcommand(
      "cache",
      "Inspect or clear the on-disk kernel cache (uses the emulator runtime: no GPU needed)");
  c->require_subcommand(1);
  const struct {
    const char *name, *help;
  } kCacheActions[] = {
      {"stats",
       "Print the cache path, whether it is on disk (or why not), entries, bytes, counters"},
      {"list", "Print one line per stored kernel: key, spec, sm, sizes, hits, last used"},
      {"clear", "Delete every stored kernel"},
      {"warm",
       "Fill the cache for GPUs this machine need not have (no GPU, no driver): the kernels of "
       "presets or spec lines, for each --sm, as PTX and (with the PTX compiler plugin) cubins"}};
  for (const auto &a : kCacheActions) {
    CLI::App *s = c->add_subcommand(a.name, a.help);
    s->add_option("--cache-dir", cache.cache_dir,
                  "Cache directory (default: $FLASHATTN_CACHE_DIR, $XDG_CACHE_HOME/flashattn, "
                  "~/.cache/flashattn)")
        ->type_name("DIR");
    s->callback([&cache, s] { cache.action = s->get_name(); });
    if (std::string(a.name) != "warm") continue;
    s->add_option("--sm", cache.sms,
                  "Target SMs, comma-separated: 80, 86, 87, 89, 90 (or 90a), 100 (100a), 103, "
                  "110, 120, 121")
        ->required()
        ->type_name("LIST");
    s->add_option("--preset", cache.presets,
                  "Presets, comma-separated ('flashattn cache presets' lists them)")
        ->type_name("NAMES");
    s->add_option("--spec", cache.spec_file,
                  "A file of kernel spec lines ('flashattn cache presets NAME' prints examples)")
        ->type_name("FILE");
    s->add_option("--jobs,-j", cache.jobs, "Kernels compiled at once (default: the CPUs)")
        ->check(CLI::NonNegativeNumber);
    s->add_flag("--ptx-only", cache.ptx_only,
                "Store PTX only, no cubins (the GPU's driver JIT-compiles them on first use)");
  }
  CLI::App *cp =
      c->add_subcommand("presets", "List the warm presets, or print one preset's spec lines");
  cp->add_option("name", cache.preset, "A preset to print")->type_name("NAME");
  cp->callback([&cache] { cache.action = "presets"; });

  // CLI11 reports an unknown subcommand as a missing one; name it instead.
  if (argc > 1 && argv[1][0] != '-' && !has_subcommand(&app, argv[1])) {
    std::fprintf(stderr,
                 "flashattn: error: unknown subcommand '%s' (generate, run, decode or cache; see "
                 "'flashattn --help')\n",
                 argv[1]);
    return fa::cli::kExitUsage;
  }
  if (argc > 1 && argv[1][0] == '-') {
    const std::string a = argv[1];
    if (a != "-h" && a != "--help" && a != "--version") {
      std::fprintf(stderr, "flashattn: error: unknown option '%s' (see 'flashattn --help')\n",
                   argv[1]);
      return fa::cli::kExitUsage;
    }
  }
  if (argc > 2 && std::string(argv[1]) == "cache" && argv[2][0] != '-' &&
      !has_subcommand(c, argv[2])) {
    std::fprintf(
        stderr,
        "flashattn cache: error: unknown action '%s' (stats, list, clear, warm or presets; see "
        "'flashattn cache --help')\n",
        argv[2]);
    return fa::cli::kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    const std::string name = e.get_name();
    if (name == "CallForHelp" || name == "CallForAllHelp" || name == "CallForVersion") {
      return app.exit(e);
    }
    std::fprintf(stderr, "%s: error: %s (see '%s --help')\n", command_path(app).c_str(),
                 one_line(e.what()).c_str(), command_path(app).c_str());
    return fa::cli::kExitUsage;
  }

  try {
    if (*g) {
      gen.attn.dtype = gen.attn.dtype.empty() ? "fp16" : gen.attn.dtype;
      return fa::cli::cmd_generate(gen);
    }
    if (*r) return fa::cli::cmd_run(run);
    if (*d) return fa::cli::cmd_decode(dec);
    if (*c) return fa::cli::cmd_cache(cache);
  } catch (const fa::cli::Failure &f) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", command_path(app).c_str(), one_line(f.what()).c_str());
    return f.code;
  }
  return fa::cli::kExitUsage;  // unreachable: a subcommand is required
}

}  // namespace

int main(int argc, char **argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception &e) {
    std::fflush(stdout);
    std::fprintf(stderr, "flashattn: internal error: %s\n", one_line(e.what()).c_str());
    return fa::cli::kExitFail;
  }
}

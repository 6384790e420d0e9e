// Numerics checks shared by the emulator suite (test_numerics) and the GPU
// suite (test_gpu): run a case through the public API on a runtime, compare
// with the fp64 reference on the same rounded inputs, with poisoned outputs.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "flashattn.h"
#include "reference.h"

namespace fa::test {

// FA_TEST_QUICK=1 (the sanitizer pass) keeps every `every`-th case: the
// emulator is several times slower under ASan.
template <typename T>
std::vector<T> maybe_quick(std::vector<T> v, size_t every) {
  const char *q = std::getenv("FA_TEST_QUICK");
  if (!q || q[0] != '1') return v;
  std::vector<T> out;
  for (size_t i = 0; i < v.size(); i += every) out.push_back(v[i]);
  return out;
}

// A call that must be refused (tests/features' `reject` lines): the runner
// builds the case as usual, hands the call's arguments to the mutation of its
// op just before the call (fa_launch, fa_decode, fa_decode_reduce), and
// checks that the call returns `status` with `message` in fa_last_error()
// and wrote nothing to O or LSE; nothing is compared with the reference.
struct Reject {
  std::function<void(fa_forward_args *)> forward;
  std::function<void(fa_decode_args *)> decode;
  std::function<void(fa_reduce_args *)> reduce;
  fa_status status = FA_ERROR_INVALID_ARGUMENT;
  std::string message;
};
// The problems with a refused call's status st ("" when it is r's).
std::string check_reject(fa_status st, const Reject &r, const char *call);

struct ForwardCase {
  int batch = 1, seqlen_q = 1, seqlen_k = 1;
  int heads_q = 1, heads_kv = 1, head_dim = 64, head_dim_v = 0;
  bool bf16 = false, causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0, softmax_scale = 0;
  bool padded_strides = false;            // non-contiguous Q/K/V/O views with gaps
  bool varlen = false;                    // pack sequences of lengths seqlens_q/k via cu_seqlens
  std::vector<int> seqlens_q, seqlens_k;  // varlen only, size batch
  // varlen only: cu_seqlens start at this row, not 0. Q/K/V/O views start
  // that many rows before their allocations (rows never touched) and LSE
  // [heads_q, first_row + total_q] is allocated whole (lazily past 1 GiB
  // on the emulator): index arithmetic past 2^31 at little cost.
  int32_t varlen_first_row = 0;
  uint32_t seed = 1;
  float input_scale = 1.0f;  // multiplies the random N(0,1) inputs
  // Inputs from a fixture instead of random data ([b, s, h, d] float32).
  const std::vector<float> *q = nullptr, *k = nullptr, *v = nullptr;
  // Attention sinks (fa_forward_args.sinks): fp32 [heads_q], or empty = none.
  std::vector<float> sinks;
  // ALiBi (fa_forward_args.alibi_slopes): fp32 [heads_q] (alibi_stride 0) or
  // [batch][alibi_stride], or empty = none.
  std::vector<float> alibi;
  int alibi_stride = 0;
  // The fp8 forward (fa_config_desc.q_dtype / kv_dtype): FA_DTYPE_FP8_E4M3
  // or _E5M2 for Q (q_fp8) and for K, V (kv_fp8), both or neither; O stays
  // bf16 / fp16. The inputs are quantised on the host (value / descale,
  // rounded to the nearest fp8) and the reference runs on the dequantised
  // values. descale: 0 none (1.0), 1 one per tensor, 2 per (batch, KV head)
  // ([batch, heads_kv] rows with a gap), 3 per (batch, KV head) transposed
  // (strides {1, batch}).
  int q_fp8 = 0, kv_fp8 = 0;
  int descale = 2;
  // When set, receive O (each element as a float: exact for fp16 / bf16)
  // and LSE as the launch wrote them: bit-identity checks between kernels.
  std::vector<float> *o_out = nullptr, *lse_out = nullptr;
  // fa_forward_args.workspace / workspace_size as given (the caller's
  // device memory; 0 = none; kAutoWorkspace: the runner's, see there).
  uint64_t workspace = 0;
  size_t workspace_size = 0;
  const Reject *reject = nullptr;  // a refused fa_launch: nothing runs
  std::string describe() const;
};

// A random-input case of that shape and masking (wl, wr: -1 unbounded;
// cap: softcap, 0 off).
ForwardCase forward_case(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                         int head_dim, int head_dim_v, bool bf16, bool causal, int wl, int wr,
                         float cap, uint32_t seed);

// How a case lays out its KV cache (flashattn.h, fa_kv_layout).
struct KvCase {
  int layout = FA_KV_CONTIGUOUS;
  int page_size = 0;          // FA_KV_PAGED
  bool hnd = false;           // FA_KV_PAGED: pages [num_pages, heads_kv, page_size, d]
  bool share_prefix = false;  // FA_KV_PAGED: sequence 1's first page is sequence 0's
  uint32_t seed = 7;          // page order
  std::string describe() const;
};

// ForwardCase::workspace (and DecodeCase's, prefill) kAutoWorkspace: the
// runner allocates what fa_forward_workspace_size asks for, the persistent
// counters' 256 bytes zero and the rest poisoned (so a split-KV partial
// state read before it is written shows), and passes it with that size.
constexpr uint64_t kAutoWorkspace = ~uint64_t(0);

struct DecodeCase {
  int batch = 1, seqlen_q = 1, seqlen_k_max = 1;
  std::vector<int> cache_seqlens;  // size batch, each in [0, seqlen_k_max]
  int heads_q = 1, heads_kv = 1, head_dim = 64, head_dim_v = 0;
  bool bf16 = false, causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0;
  int num_splits = 0;
  float softmax_scale = 0;     // fa_config_desc.softmax_scale (0: 1 / sqrt(head_dim))
  bool partials_only = false;  // o.data = 0: only the workspace's partial states
  uint32_t seed = 1;
  const std::vector<float> *q = nullptr, *k = nullptr, *v = nullptr;  // fixture inputs
  KvCase kv;
  bool batch_invariant = false;
  // Run through fa_launch instead (chunked prefill): seqused_k =
  // cache_seqlens, the same bottom-right causal alignment.
  bool prefill = false;
  // prefill only: no seqused_k (a fixed-length forward: every
  // cache_seqlens[b] must be seqlen_k_max).
  bool prefill_fixed = false;
  // prefill only: queries per sequence (each at most seqlen_q, 0 allowed),
  // packed through cu_seqlens_q (fa_launch's seqlen_q their maximum):
  // sequence b's are the last prefill_q[b] of its seqlen_q query rows, so
  // their reference rows are those. Empty: seqlen_q each, no cu_seqlens_q.
  std::vector<int> prefill_q;
  // Tree mask (fa_decode_args.tree_mask): bool [batch][seqlen_q][seqlen_q]
  // (1 = query i sees new token j), or empty = none. tree_shared: one
  // [seqlen_q][seqlen_q] mask for every sequence (tree_mask_stride[0] = 0);
  // tree_pad_words: extra 32-bit words per packed row.
  std::vector<uint8_t> tree;
  bool tree_shared = false;
  int tree_pad_words = 0;
  // Attention sinks (fa_decode_args.sinks; with prefill fa_forward_args.sinks):
  // fp32 [heads_q], or empty = none. With partials_only the partial states
  // (which never hold the sinks) are merged with them on the host.
  std::vector<float> sinks;
  // ALiBi (fa_decode_args.alibi_slopes; with prefill fa_forward_args'), as
  // ForwardCase::alibi.
  std::vector<float> alibi;
  int alibi_stride = 0;
  // KV append (fa_decode_args.k_new, seqlen_new > 0): seqlen_new random new
  // keys/values per sequence are appended at cache_seqlens[b] (the length
  // before the append; cache_seqlens[b] + seqlen_new <= seqlen_k_max) and
  // checked bit for bit in the cache afterwards; rotary_dim > 0 rotates Q
  // and the new K with a RoPE table (base 10000, rows seqlen_k_max) of fp32
  // or, with rotary_half_table, the dtype; rotary_positions: explicit
  // per-token positions (random, not cache_seqlens + t).
  int seqlen_new = 0;
  int rotary_dim = 0;
  bool rotary_interleaved = false, rotary_half_table = false, rotary_positions = false;
  // MLA's latent cache: V is the first head_dim_v columns of K's rows, passed
  // as the same memory, strides and page table (fa_decode reads V from the K
  // tile: KernelSpec::v_in_k). head_dim_v <= head_dim, no append.
  bool v_in_k = false;
  // fa_decode_args.split_counters (the fused combine, since 0.8): zeroed
  // int32 counters, FA_DECODE_SPLIT_COUNTERS of them, which must be zero
  // again after every call. calls: fa_decode runs this many times on the
  // same workspace and counters (O and LSE poisoned before each; the last
  // call's results are judged). counters_preset != 0: before the last call
  // every counter is set to it (what a broken reset would leave).
  bool split_counters = false;
  int calls = 1;
  int32_t counters_preset = 0;
  // O and LSE as the (last) call wrote them (ForwardCase::o_out, lse_out);
  // prefill only: fa_forward_args.workspace / workspace_size as given.
  std::vector<float> *o_out = nullptr, *lse_out = nullptr;
  uint64_t workspace = 0;
  size_t workspace_size = 0;
  const Reject *reject = nullptr;  // a refused fa_decode: nothing runs
  std::string describe() const;
};
// Packs a bool [rows][seqlen_q] tree mask into rows of `row_words` 32-bit
// little-endian words (bit j % 32 of word j / 32; the bytes are those of
// numpy.packbits(bitorder="little")), padding bits and words 0.
std::vector<uint32_t> pack_tree_mask(const std::vector<uint8_t> &bits, int rows, int seqlen_q,
                                     int row_words);

// Errors found; empty when the case passed. Prints a one-line summary.
std::string run_forward(fa_runtime *rt, const ForwardCase &c);
// A varlen forward case (cu_seqlens_q/k): sequences of sq[b] queries and
// sk[b] keys, the launch's seqlen_q / seqlen_k their maxima.
ForwardCase varlen_case(const std::vector<int> &sq, const std::vector<int> &sk, int heads_q,
                        int heads_kv, int head_dim, int head_dim_v, bool bf16, bool causal, int wl,
                        float cap, uint32_t seed);
// Chunked prefill through fa_launch (DecodeCase::prefill), one case per KV
// layout: contiguous, paged by tile (pages of 128, and 256 HND with a
// shared prefix page) and by row (16 with a shared prefix, 1, 3 HND),
// pointer arrays; 3 sequences with seqused_k (one empty), short_q queries
// on odd cases, causal but one, a window, softcap, seeds seed, seed + 1, ..
std::vector<DecodeCase> prefill_layout_cases(int short_q, uint32_t seed);
// A decode case of `batch` sequences, sequence b holding max_k - len_step b
// keys of a contiguous cache of max_k rows, head_dim d (head_dim_v d).
DecodeCase decode_case(int batch, int seqlen_q, int max_k, int hq, int hkv, int d, bool bf16,
                       uint32_t seed, int len_step);
// A chunked-prefill case (DecodeCase::prefill, through fa_launch): seqlen_q
// new queries per sequence over a cache of lens[b] keys (seqused_k), causal,
// in layout `layout` with pages of page_size in a block table shuffled by
// seed + 1.
DecodeCase prefill_case(const std::vector<int> &lens, int seqlen_q, int max_k, int hq, int hkv,
                        int d, bool bf16, int layout, int page_size, uint32_t seed);
// A fixed-length fp16 problem's config (*cfg, the caller's to destroy) and
// forward arguments with host fields only: contiguous [batch, seq, heads,
// dim] tensors at `data` (never read), for calls that read no device memory
// (fa_forward_workspace_size). False when fa_config_create fails.
bool host_forward_problem(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                          int head_dim, bool causal, uint64_t data, fa_config **cfg,
                          fa_forward_args *a);
// A test program's exit: "FAIL:" and the failures (1), else the summary (0).
int finish(const std::string &failures, const std::string &summary);
// The entry name of rt's last emulated launch (FLASHATTN_EMU_PROFILE=1 set
// before it), or "(no profile)".
std::string emulated_kernel(fa_runtime *rt);
// Runs each case (run_forward, or run_decode for chunked prefill) on rt and
// checks that its last launch's entry name (emulated_kernel;
// FLASHATTN_EMU_PROFILE=1 set by the caller) contains `kernel`, else a
// "<case>: ran <entry>, not <what>" line. Returns the failures.
std::string run_on_kernel(fa_runtime *rt, const std::vector<ForwardCase> &cases,
                          const std::string &kernel, const std::string &what);
std::string run_on_kernel(fa_runtime *rt, const std::vector<DecodeCase> &cases,
                          const std::string &kernel, const std::string &what);
std::string run_decode(fa_runtime *rt, const DecodeCase &c);
// Random partial states (some splits -inf, some rows all -inf) through
// fa_decode_reduce against fa::ref::merge_states.
// sinks: fp32 [heads] (fa_reduce_args.sinks), or null = none.
// nonfinite: rows with +inf and NaN states too (splits >= 2).
// lse_formats: bit 0 = the partial states' LSE in base 2
// (lse_partial_format FA_LSE_BASE2), bit 1 = the LSE written in base 2.
// reject: a refused fa_decode_reduce (nothing runs).
std::string run_reduce(fa_runtime *rt, int splits, int batch, int seqlen_q, int heads, int dv,
                       bool bf16, uint32_t seed, const std::vector<float> *sinks = nullptr,
                       bool nonfinite = false, int lse_formats = 0, const Reject *reject = nullptr);

}  // namespace fa::test

namespace fa::test {

// The case lists both suites run. `gpu` selects larger shapes.
std::vector<ForwardCase> forward_cases(bool gpu);
std::vector<DecodeCase> decode_cases(bool gpu);
// Each feature (sinks, ALiBi, append + RoPE, tree mask, prefill, layouts) once.
std::vector<ForwardCase> feature_forward_cases(bool gpu);
std::vector<DecodeCase> feature_decode_cases(bool gpu);
// Head dims past 256 (Gemma's 512, MLA's 576 / 512, O in slices) once each.
std::vector<ForwardCase> large_head_forward_cases(bool gpu);
// The fp8 forward (q_dtype + kv_dtype): one small case on the emulator (the
// full grid is tests/test_fp8_forward), larger ones on a GPU.
std::vector<ForwardCase> fp8_forward_cases(bool gpu);
std::vector<DecodeCase> large_head_decode_cases(bool gpu);

// Loads tests/data/<name>/<file>.npy as float32; false if absent.
bool load_fixture(const std::string &name, const std::string &file, std::vector<float> *out,
                  std::vector<int64_t> *shape);

// A runtime on `backend` with a memory-only cache, or nullptr with *why set.
fa_runtime *make_runtime(fa_backend backend, std::string *why, int emulator_sm = 0);
// An emulator runtime at emulator_sm for a test program's main, or null
// after printing "FAIL:" and why.
fa_runtime *emulator_or_fail(int emulator_sm);

}  // namespace fa::test

namespace fa::test {
// The same attention computed the way a framework does it at low precision:
// S in fp32, P rounded to dtype (bf16, else fp16), O accumulated in fp32 and
// rounded to dtype. Its error against fp64 is the yardstick (FlashAttention's
// test rule: twice it). p_e4m3: P as the fp8 forward rounds it instead (each
// 2^8 e^(s - rowmax) to e4m3, divided by 2^8 and by the unrounded row sum).
// q [b, sq, hq, d], k [b, sk, hkv, d], v [b, sk, hkv, dv] as p gives them;
// seqlens_k: valid keys per sequence, or null for p.seqlen_k.
std::vector<double> lowp_attention(const ref::Problem &p, const std::vector<double> &q,
                                   const std::vector<double> &k, const std::vector<double> &v,
                                   bool bf16, const int32_t *seqlens_k, bool p_e4m3 = false);

// O [b, sq, hq, dv] and LSE [b, hq, sq] (as floats, e.g. a program's
// output files) against the fp64 reference under the runners' rule: O
// within twice the error of o_lowp (lowp_attention) and relative L2 below
// 1e-2 (fp8: or twice o_lowp's), LSE within 2e-3 relative, each non-finite
// reference value matched. The problems found, "" when none.
std::string check_output(const std::vector<float> &o, const std::vector<double> &o_ref,
                         const std::vector<double> &o_lowp, const std::vector<float> &lse,
                         const std::vector<double> &lse_ref, bool fp8 = false);

// Runs the numerics suite (random cases, fixtures, decode, reduce) as a
// CMocka group on `backend` (emulating `emulator_sm`, 0 = 80); every test skips with the reason
// when the backend cannot be created. Returns the CMocka exit status.
// forward_kernel: each forward case that kernel can take (not a refused
// launch, head dims up to 256, fp8 head dims whole k16 steps) must have run
// it (its entry name contains forward_kernel; FLASHATTN_EMU_PROFILE=1 set
// by the caller).
int run_numerics_suite(const char *group, fa_backend backend, bool gpu_shapes, int emulator_sm = 0,
                       const char *forward_kernel = nullptr);
}  // namespace fa::test

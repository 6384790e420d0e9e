// The runtime object: one backend (device binding), its loaded kernels and
// the kernel store. Turns a validated problem into kernel specs, finds or
// builds each kernel (in-process map -> store -> generator -> backend JIT)
// and launches it. Arguments arrive validated by src/api/.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backend/backend.h"
#include "cache/store.h"
#include "kernels/kernels.h"

namespace fa {

// The canonical bytes a kernel key hashes: the spec's serialization, the
// generator version and source hash, the target SM and the PTX ISA version.
// Stored with each cache row so a key collision is detected.
std::string kernel_key_material(const KernelSpec &spec,
                                uint32_t generator_version = kGeneratorVersion);

// XXH3-128 of key material.
cache::Key key_of_material(const std::string &material);

// key_of_material(kernel_key_material(spec)).
cache::Key kernel_key(const KernelSpec &spec);

// A new row for spec (whose kernel_key_material is `material`): its
// generated PTX, no binary yet. The PTX is empty when no generator takes
// the spec.
cache::Record new_record(const KernelSpec &spec, const std::string &material);

// The compiler a row records after the driver refused the cubin of the PTX
// compiler plugin `plugin_version` and JIT-compiled its PTX instead.
std::string refused_by_driver(const std::string &plugin_version);

// Whether a cache row's binary can be loaded as it is by a cuda backend that
// compiles with `compiler` on driver version `driver`; else it is rebuilt
// (docs: cache/README.md, "Binaries and compilers").
bool binary_current(const cache::Record &rec, const CompilerInfo &compiler, int driver);

// Resolved decode plan: number of splits and keys per split.
struct DecodePlan {
  int num_splits = 1;
  int split_size = 0;
  size_t o_partial_bytes = 0;  // offset of LSE_partial = round_up(this, 256)
  size_t lse_offset = 0;
  size_t workspace_bytes = 0;
  bool too_large = false;  // the workspace size overflows 64 bits (sizes above unset)
};

// Split-KV for the sm_90a forward (KernelSpec::split_kv): the splits and
// where their partial states go in the caller's workspace (decode's layout),
// after its first 256 bytes: those hold the persistent kernel's counters,
// which a split launch never touches, so one workspace serves both.
struct ForwardSplitPlan {
  int num_splits = 1;  // 1: no split
  int split_size = 0;  // keys per split, a multiple of the kernel's block_n
  size_t o_offset = 0, lse_offset = 0, workspace_bytes = 0;
};

// FA_ERROR_UNSUPPORTED with the message for a DecodePlan that is too_large.
fa_status decode_too_large();

// Flash-Decoding's split count when the caller leaves it to the runtime
// (fa_decode_args.num_splits 0, no batch_invariant), from the real work:
// ctas = batch x KV heads x m-blocks x O column slices (the CTAs of one
// split), key_tiles = ceil(seqlen_k_max / block_n), and the device's
// num_sms x ctas_per_sm resident CTAs (the decode tile's min_ctas). A model,
// not a measurement (docs/kernels.md, "Split heuristic"): 1 when the CTAs
// alone put one on every SM (a large batch: splitting only adds partial
// state traffic and a combine); else as many splits as one wave of resident
// CTAs holds (a CTA's time falls with its share of the keys while the wave
// does not grow), but at least enough for a CTA on every SM, and never a
// split under kDecodeMinSplitTiles key tiles (each CTA pays a fixed cost:
// prologue, Q load, warp merge, partial store, its part of the combine) nor
// more than 128: min(key_tiles / 4 (>= 1), 128, max(ceil(num_sms / ctas),
// floor(num_sms ctas_per_sm / ctas))). >= 1.
constexpr int kDecodeMinSplitTiles = 4;
int decode_num_splits(int64_t ctas, int64_t key_tiles, int num_sms, int ctas_per_sm);

// An fp8 KV cache (cfg.kv_fp8) runs only in the tensor-core decode on sm_89+
// (the fp8 cvt): FA_ERROR_UNSUPPORTED with the reason when `spec` (a kernel
// for cfg) is not that kernel, FA_SUCCESS otherwise (and for a 16-bit cache).
fa_status check_fp8_kv(const AttentionConfig &cfg, const KernelSpec &spec);

// fp32 Q/K/V/O (cfg.dtype F32) run in the mma.sync forward and decode
// (without a KV append) and the combine only: FA_ERROR_UNSUPPORTED with the
// reason for any other kernel (the scalar ones), FA_SUCCESS otherwise (and
// for 16-bit dtypes).
fa_status check_fp32(const AttentionConfig &cfg, const KernelSpec &spec);
// UNSUPPORTED when a head dim past 256 (FA_MAX_HEAD_DIM) met a kernel that
// takes 256 at most: the scalar fallbacks (below sm_80, or forced).
fa_status check_head_dims(const AttentionConfig &cfg, const KernelSpec &spec);

// The backward's workspace (fa_backward_workspace_size; BackwardParams):
// fp32 dq_accum [rows][head_dim] at offset 0, then fp32 row_stats
// [2][rows] at the next 256-byte boundary; rows = batch heads_q seqlen_q
// (varlen: seqlen_q the longest sequence, every sequence padded to it).
struct BackwardPlan {
  int64_t rows = 0;
  size_t row_stats_offset = 0;
  // deterministic: the dQ semaphores (BackwardParams::dq_sem), u32 [batch]
  // [heads_q][ceil(seqlen_q / kSemRows)][kSemSlices], else 0.
  size_t sem_offset = 0;
  size_t workspace_bytes = 0;
  bool too_large = false;  // the bytes overflow 64 bits (sizes above unset)
};
BackwardPlan plan_backward(const AttentionConfig &cfg, const fa_backward_args &args);

// What fa_backward cannot run: FA_ERROR_UNSUPPORTED with the reason for an
// fp8 config (kv_dtype, q_dtype), fp32 Q/K/V/O, head_dim or head_dim_v past
// 128, or a device below sm_80 (the kernels run on mma.sync); else
// FA_SUCCESS. The forward's kernel policy plays no part: the backward has
// one kernel family.
fa_status check_backward(const AttentionConfig &cfg, int sm);

// The launch shape of fa_backward's kernels for args: varlen
// (fwd.cu_seqlens_q), sinks and ALiBi (fwd.sinks, fwd.alibi_slopes); the
// rest of LaunchShape is the default (contiguous K/V, no seqused_k).
LaunchShape backward_shape(const fa_backward_args &args);
// The backward kernel of `kind` (BackwardPre, Backward, BackwardPost) for a
// launch of that shape on a device with these limits, under `policy`: the
// per-row kinds without the fields they do not read (softcap, ALiBi, group,
// tile). Runtime::backward_spec (the kernels fa_backward launches) and
// fa_generate (FA_KERNEL_BACKWARD*) both take their specs from here.
KernelSpec backward_spec(const AttentionConfig &cfg, KernelKind kind, const DeviceLimits &dev,
                         const LaunchShape &shape, const KernelPolicy &policy);

class Runtime {
 public:
  struct Counters {
    std::atomic<uint64_t> memory_hits{0}, disk_hits{0}, misses{0}, compiles{0};
    std::atomic<uint64_t> cubin_refusals{0};      // cubins the driver refused (PTX JIT instead)
    std::atomic<uint64_t> forwards_as_decode{0};  // fa_launch calls run by forward_as_decode
  };

  static fa_status create(const fa_runtime_options &options, std::unique_ptr<Runtime> *out);

  Backend &backend() { return *backend_; }
  const Backend &backend() const { return *backend_; }
  cache::Store &store() { return *store_; }
  const Counters &counters() const { return counters_; }

  // Finds or builds the kernel for spec. The pointer stays valid for the
  // runtime's lifetime. On a store miss it takes the store's compile lease
  // so that processes starting cold together build each kernel once; the
  // lease never fails a launch (a timeout builds locally).
  fa_status get_kernel(const KernelSpec &spec, Kernel **out);

  // The JIT info log (ptxas resource usage and warnings) of the last
  // compilation of the kernel described by spec_text, or "" (emulator,
  // or loaded from the cache).
  std::string jit_log(const std::string &spec_text) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jit_logs_.find(spec_text);
    return it == jit_logs_.end() ? std::string() : it->second;
  }

  // The kernel policy of every launch: KernelPolicy::from_env() when the
  // runtime was created (the variables are read once). set_policy replaces
  // it (tests; not concurrently with launches).
  const KernelPolicy &policy() const { return policy_; }
  void set_policy(const KernelPolicy &policy) { policy_ = policy; }

  fa_status forward(const AttentionConfig &cfg, const fa_forward_args &args, void *stream);
  // The bytes of args.workspace forward() uses (fa_forward_workspace_size):
  // 8 when it would run args on the persistent kernel, the split-KV plan's
  // when it would split args' keys, else 0.
  size_t forward_workspace_bytes(const AttentionConfig &cfg, const fa_forward_args &args) const;
  // cu_seqlens_q (not in fa_decode_args): a varlen forward run by the
  // decode kernel (forward_as_decode): int32 [batch + 1] device prefix sums
  // of the queries per sequence, args.seqlen_q their maximum; 0 = none.
  DecodePlan plan_decode(const AttentionConfig &cfg, const fa_decode_args &args,
                         uint64_t cu_seqlens_q = 0) const;
  // The decode kernel's spec for args' KV layout on this device; fused: with
  // the combine fused in (KernelSpec::fused_combine, args.sinks with it),
  // where the kernel has that form; direct: one split writing O and the LSE
  // itself (KernelSpec::direct_out, args.sinks with it), likewise.
  KernelSpec decode_spec(const AttentionConfig &cfg, const fa_decode_args &args,
                         uint64_t cu_seqlens_q = 0, bool fused = false, bool direct = false) const;
  // Whether decode() fuses the combine for args run as `plan`: the caller's
  // split_counters and o, more than one split, the policy's decode_fused,
  // and a kernel with the fused form (tensor-core, fixed-length queries).
  bool decode_fuses(const AttentionConfig &cfg, const fa_decode_args &args, const DecodePlan &plan,
                    uint64_t cu_seqlens_q = 0) const;
  // direct: args.num_splits is 1 and the kernel has the direct_out form
  // (the MLA forward, forward_as_decode): no workspace, no combine.
  fa_status decode(const AttentionConfig &cfg, const fa_decode_args &args, void *stream,
                   uint64_t cu_seqlens_q = 0, bool direct = false);
  fa_status reduce(const AttentionConfig &cfg, const fa_reduce_args &args, void *stream);

  // The TMA descriptors of a's Q, K and V (head_dim, head_dim, head_dim_v
  // columns) in the boxes spec's kernel reads (wgmma_tma_box), into tq, tk,
  // tv (128 bytes each); the first failure's status (the backend's message).
  fa_status encode_qkv_maps(const KernelSpec &spec, const AttentionConfig &cfg,
                            const fa_forward_args &a, uint8_t *tq, uint8_t *tk, uint8_t *tv) const;
  // The backward kernel of `kind` (BackwardPre, Backward, BackwardPost) for
  // args on this device under this runtime's policy: fa::backward_spec of
  // backward_shape(args).
  KernelSpec backward_spec(const AttentionConfig &cfg, const fa_backward_args &args,
                           KernelKind kind) const;
  // plan_backward(cfg, args).workspace_bytes (0 when too large).
  size_t backward_workspace_bytes(const AttentionConfig &cfg, const fa_backward_args &args) const;
  // fa_backward on validated args: BackwardPre, Backward and BackwardPost
  // on `stream`, each kernel found or built before the first launch (a
  // kernel that cannot be had launches nothing). `kernels`: which of them
  // run (kBackwardAll; tests run the per-row ones alone).
  static constexpr unsigned kBackwardPre = 1, kBackwardMain = 2, kBackwardPost = 4,
                            kBackwardAll = 7;
  fa_status backward(const AttentionConfig &cfg, const fa_backward_args &args, void *stream,
                     unsigned kernels = kBackwardAll);

 private:
  // The forward kernel for args with this launch shape: make_spec's, one CTA
  // per item when a persistent kernel's items would need 2^31 or more, and
  // dynamic (KernelSpec::dynamic) when persistent with args.workspace set.
  KernelSpec forward_spec(const AttentionConfig &cfg, const fa_forward_args &args,
                          const LaunchShape &shape) const;
  // The split of args' keys for the forward kernel spec (one split: none):
  // KernelPolicy::forward_splits, the sm_90a kernel with one CTA per
  // m-block, and CTAs that leave SMs idle (forward_num_splits); varlen
  // counts its CTAs as the launch's grid does (seqlen_q the maximum).
  ForwardSplitPlan plan_forward_split(const AttentionConfig &cfg, const fa_forward_args &args,
                                      const KernelSpec &spec) const;
  // GQA packing (issue 27 item 3): when args (fixed-length, any KV layout,
  // seqused_k or not, no fp8, seqlen_q x num_heads_q / num_heads_kv <= 16)
  // run better on the decode kernel, which packs a KV head's seqlen_q x
  // group query rows into one CTA (K and V read once per KV head instead of
  // once per query head) and splits the keys, its arguments into *d with
  // the workspace after args' first 256 bytes (the persistent counter's;
  // *d's workspace_size then counts from there) and true; false when it
  // does not apply (KernelPolicy::forward_gqa_pack, the tensor-core decode).
  // Also, at any seqlen_q, a fixed-length forward over MLA's latent cache
  // (V the first head_dim_v columns of K's memory, the MLA dims) where the
  // sm_100a MLA kernel takes it and its grid fits: *mla true, and the
  // forward runs it with one split writing O (KernelSpec::direct_out) unless
  // the caller's workspace holds more splits' partial states.
  bool forward_as_decode(const AttentionConfig &cfg, const fa_forward_args &args, fa_decode_args *d,
                         bool *mla) const;
  // The split kernel's spec for args when the unsplit one (`unsplit`, of
  // launch shape `shape`) would split (its tile chosen for split_kv, sinks
  // left to the combine) and *plan the split of that spec (one split: none,
  // and `unsplit` is returned).
  KernelSpec forward_split_spec(const AttentionConfig &cfg, const fa_forward_args &args,
                                const LaunchShape &shape, const KernelSpec &unsplit,
                                ForwardSplitPlan *plan) const;
  // The combine of a split launch (sinks join each row's denominator
  // there): its kernel, fetched before the split kernel runs, and its launch
  // over partial states [splits, batch, seqlen_q, heads_q, head_dim_v] and
  // [splits, batch, heads_q, seqlen_q] (fp32, contiguous) into o and lse.
  // varlen (cu_seqlens_q set): the varlen forward's combine (padded partial
  // states, packed o [total_q, heads_q, head_dim_v] and lse [heads_q,
  // total_q]; ReduceParams::cu_seqlens_q).
  fa_status combine_kernel(const AttentionConfig &cfg, bool sinks, bool varlen, Kernel **kernel,
                           KernelSpec *spec);
  fa_status combine(Kernel &kernel, const KernelSpec &spec, const AttentionConfig &cfg,
                    uint64_t o_partial, uint64_t lse_partial, int num_splits, int batch,
                    int seqlen_q, const fa_tensor &o, uint64_t lse, uint64_t sinks,
                    uint64_t cu_seqlens_q, void *stream);
  // Rebuilds rec's binary unless binary_current(); sets *dirty when it did.
  // Errors: those of Backend::compile.
  fa_status ensure_binary(const KernelSpec &spec, cache::Record *rec, bool *dirty);
  // Warns about what the compile log flags and keeps it for jit_log().
  void note_compile(const std::string &spec_text, const std::string &log);

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<cache::Store> store_;
  std::mutex mu_;  // guards kernels_ and kernel building
  std::map<std::pair<uint64_t, uint64_t>, std::unique_ptr<Kernel>> kernels_;
  std::map<std::string, std::string> jit_logs_;  // spec text -> last JIT info log
  Counters counters_;
  KernelPolicy policy_;
};

}  // namespace fa

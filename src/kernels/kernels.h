// Kernel generators: KernelSpec -> PTX text, plus the parameter block and the
// launch geometry of each kernel. Nothing here knows about CUDA, SQLite or
// the C ABI structs. Algorithms and layouts: docs/kernels.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/launch.h"
#include "kernels/policy.h"

namespace fa {

// Q/K/V/O element types; F32: fp32 in global memory, rounded to
// bf16 on the way into shared memory, O written as fp32 (flashattn.h,
// FA_DTYPE_FP32).
enum class Dtype : uint8_t { F16 = 1, BF16 = 2, F32 = 3 };
// Bytes of one Q/K/V/O element in global memory.
inline int elem_bytes(Dtype d) { return d == Dtype::F32 ? 4 : 2; }
// The backward (fa_backward) runs three kernels: BackwardPre (per query row:
// D = rowsum(dO o O) and the LSE in log2 units, dQ's accumulators zeroed),
// Backward (per key block and KV head: dK, dV, and dQ added to the
// accumulators) and BackwardPost (dQ from its accumulators; dsinks).
enum class KernelKind : uint8_t {
  Forward = 0,
  Decode = 1,
  Reduce = 2,
  BackwardPre = 3,
  Backward = 4,
  BackwardPost = 5
};
inline bool is_backward(KernelKind k) {
  return k == KernelKind::BackwardPre || k == KernelKind::Backward || k == KernelKind::BackwardPost;
}
// How a kernel finds a key's K/V row (flashattn.h, fa_kv_layout): same values.
enum class KvLayout : uint8_t { Contiguous = 0, Paged = 1, PtrArray = 2 };
// The KV cache's element type when it is not the config's 16-bit dtype
// (flashattn.h, fa_config_desc.kv_dtype): fp8 bytes, same values as fa_dtype.
enum class KvFp8 : uint8_t { None = 0, E4M3 = 4, E5M2 = 5 };

// Bumped whenever any generator's output can change: it is part of every
// cache key, so stale kernels are never reused.
constexpr uint32_t kGeneratorVersion = 9;
// Head dims the tensor-core kernels take (FA_MAX_HEAD_DIM, FA_MAX_HEAD_DIM_V).
constexpr int kMaxHeadDim = 576, kMaxHeadDimV = 512;

// "Unbounded" for a resolved window edge.
constexpr int32_t kUnboundedWindow = 1 << 30;

// A validated attention problem (the content of an fa_config).
struct AttentionConfig {
  Dtype dtype = Dtype::F16;
  int head_dim = 0;
  int head_dim_v = 0;
  int num_heads_q = 0;
  int num_heads_kv = 0;
  bool causal = false;
  int window_left = -1;        // -1 = unbounded
  int window_right = -1;       // -1 = unbounded
  float softmax_scale = 0;     // resolved (> 0)
  float softcap = 0;           // 0 = off
  KvFp8 kv_fp8 = KvFp8::None;  // K and V (the KV cache) hold fp8 bytes
  KvFp8 q_fp8 = KvFp8::None;   // Q holds fp8 bytes too: the fp8 forward (with kv_fp8)
};

// A config of the given shape, no masking (tests and benchmarks).
inline AttentionConfig attention_config(Dtype dtype, int head_dim, int head_dim_v, int num_heads_q,
                                        int num_heads_kv, float softmax_scale, float softcap) {
  AttentionConfig c;
  c.dtype = dtype;
  c.head_dim = head_dim;
  c.head_dim_v = head_dim_v;
  c.num_heads_q = num_heads_q;
  c.num_heads_kv = num_heads_kv;
  c.softmax_scale = softmax_scale;
  c.softcap = softcap;
  return c;
}

// Everything that changes the generated PTX. Launch-time values (sizes,
// strides, window, scale) are kernel parameters, not part of the spec.
struct KernelSpec {
  KernelKind kind = KernelKind::Forward;
  Dtype dtype = Dtype::F16;
  int sm = 80;
  int head_dim = 0;  // unused (0) for Reduce
  int head_dim_v = 0;
  int group_size = 1;  // num_heads_q / num_heads_kv (Decode rows per KV head)
  bool softcap = false;
  // Forward with cu_seqlens_q/k; Reduce: the varlen forward's combine
  // (ReduceParams::cu_seqlens_q; padded partial states, packed O and LSE).
  bool varlen = false;
  int block_m = 0;    // query rows per CTA
  int block_n = 0;    // keys per K/V tile
  int num_warps = 0;  // threads per CTA / 32
  bool mma = false;   // Forward: tensor-core kernel (mma.sync, ldmatrix, cp.async; sm_80+)
  int stages = 0;     // mma: 1 = one K and one V buffer, FlashAttention-2's overlap; 0 otherwise
                      // (Backward: 2 = Q and dO double-buffered, 0 one buffer)
  int m_tiles = 1;    // mma: 16-row m-tiles per warp (block_m = 16 m_tiles num_warps)
  bool q_in_regs = false;  // mma: Q's A fragments stay in registers across K/V tiles
  int min_ctas = 0;        // mma: CTAs per SM the tile is sized for (.minnctapersm)
  KvLayout kv_layout = KvLayout::Contiguous;
  // Paged with page_size a multiple of block_n: one block_table lookup per
  // K/V tile (else one per row).
  bool page_tiles = false;
  // Paged, looked up per row (not page_tiles), with a power-of-two
  // page_size: a key's page and slot by shift and mask (KvPages::page_shift)
  // instead of div / rem. Off: the PTX and serialize() are those of a spec
  // without it.
  bool page_pow2 = false;
  bool seqused_k = false;  // Forward: per-sequence key counts (ForwardParams::seqused_k)
  // Forward on sm_90a (FlashAttention-3's structure): wgmma, TMA into a
  // stages-deep K/V ring guarded by mbarriers, a producer warpgroup and two
  // consumer warpgroups (num_warps 12, block_m 128). Implies mma.
  // Decode: the sm_90a MLA decode (kgen::generate_decode_mla; gather and
  // v_in_k, block_m 64, the two consumer warpgroups splitting d and dv).
  bool wgmma = false;
  // Forward on sm_100a / sm_103a (FlashAttention-4's structure,
  // kgen::generate_forward_sm100): tcgen05.mma with S, P and O in tensor
  // memory, TMA into a ring of `stages` K/V slots, 12 warps (8 softmax, an
  // MMA and a load warp), block_m 256 (two Q tiles of 128), block_n 128.
  // Implies mma; the TMA operands of the sm_90a forward (WgmmaParams). Off:
  // the PTX and serialize() are those of a spec without it.
  bool tcgen05 = false;
  // wgmma: Q, K and V copied by cp.async from the producer warpgroup (row
  // by row, any KV layout, varlen, seqused_k, strides TMA cannot address)
  // instead of TMA; the consumers are the same.
  bool gather = false;
  // wgmma (TMA or gather), or the mma.sync forward with dv_split 1 and no
  // split_kv (min_ctas CTAs per SM, forward_tc.cc): a persistent grid whose
  // CTAs loop over the launch's work items (m-block, head, batch) in
  // tile::TileScheduler's order, CTA c taking items c, c + nctaid, ...;
  // wgmma: the K/V ring runs on across items and a Q buffer is refilled once
  // the epilogue of the item that used it has read O out of it (q_stages;
  // docs/kernels.md, "Persistent variant"); mma.sync: each item runs the
  // one-CTA kernel's body, a CTA barrier between items ("Persistent
  // mma.sync forward"). Varlen: scheduled by work, only the batch's real
  // items, from an m-block prefix each CTA builds from cu_seqlens_q. Off:
  // the PTX and serialize() are those of a spec without it.
  bool persistent = false;
  // persistent only: work items handed out dynamically by an atomic counter
  // in the caller's workspace (ForwardTail::workspace, {u32 next, u32
  // exited}; fa_forward_args.workspace) instead of CTA c taking c, c +
  // nctaid, ...; the last CTA out resets the counter to zero. Off: the PTX
  // and serialize() are those of a spec without it.
  bool dynamic = false;
  // persistent only: Q's buffers, a tile::Ring of 1 or 2 stages. With 2
  // the producer copies the next work item's Q into the other buffer while
  // the consumers still run this one (the epilogue stages O in the item's
  // own buffer); choose_wgmma_tile takes 2 where shared memory holds them
  // with at least two K/V stages. 1 with persistent off.
  int q_stages = 1;
  // Forward on tensor cores (wgmma with one CTA per m-block, or mma.sync;
  // not persistent or sinks): split-KV. The keys are cut into
  // ForwardTail::num_splits ranges of split_size; CTA x = (m-block x
  // dv_split + slice) + m-blocks x dv_split x split runs its rows over its
  // range and writes their partial state (O / l in fp32 and the natural
  // LSE; decode's o_partial / lse_partial layout; forward_out) for the
  // reduce kernel, which combines them into O and LSE (and adds sinks).
  // With varlen the partial states are padded (seqlen_q = the launch's
  // maximum, the padding rows never written) and the varlen reduce packs
  // the rows. Off: the PTX and serialize() are those of a spec without it.
  bool split_kv = false;

  // Decode: every sequence holds seqlen_k_max keys (no cache_seqlens read;
  // a fixed-length forward run by the decode kernel, the runtime's GQA
  // packing). Off: the PTX and serialize() are those of a spec without it.
  bool fixed_len = false;
  // Decode (tensor-core) and Reduce, sm_90 and up: launched as a
  // programmatic dependent (LaunchGeometry::programmatic, KernelPolicy::pdl):
  // griddepcontrol.wait before the kernel's first global memory access, and
  // the decode kernel's griddepcontrol.launch_dependents once its K/V loop
  // is done. Off: the PTX and serialize() are those of a spec without it.
  bool pdl = false;
  // Decode (tensor-core, without cu_seqlens_q): the combine fused into the
  // decode kernel. Each CTA, its split's partial state written, adds 1 to
  // its (batch, KV head, m-block)'s int32 counter (DecodeParams::
  // split_counters, atom.add.acq_rel.gpu); the CTA that sees nctaid.x - 1
  // (the row's last of num_splits x dv_split) combines the splits of its
  // 16 packed rows into O and LSE (tile::combine_row, the reduce kernel's
  // instructions per row) and sets the counter back to 0. With sinks (only
  // here does a Decode spec take them). Off: the PTX and serialize() are
  // those of a spec without it.
  bool fused_combine = false;
  // Decode (the sm_100a MLA kernel, spec.tcgen05): the launch has one
  // split, and each CTA writes its rows' O (spec.dtype, DecodeParams::o)
  // and LSE (::lse, natural; none when 0) itself, with sinks (spec.sinks),
  // instead of the partial state: the runtime's forward over MLA's latent
  // cache (Runtime::forward_as_decode) at any seqlen_q, with no workspace
  // and no combine. Off: the PTX and serialize() are those of a spec
  // without it.
  bool direct_out = false;
  // Decode: speculative-decoding tree mask among the new tokens
  // (DecodeParams::tree_mask). Off: the PTX is byte-identical to a spec
  // without the field.
  bool tree_mask = false;
  // Reduce: the partial LSEs are read (written) as base-2 logarithms
  // (flashattn.h, fa_lse_format) instead of natural ones.
  bool lse_in_base2 = false, lse_out_base2 = false;
  // Forward and Reduce: attention sinks (gpt-oss), one fp32 logit per query
  // head in the softmax denominator (ForwardParams::sinks,
  // ReduceParams::sinks). Decode kernels take them only with
  // fused_combine: fa_decode adds them in its combine. Off: the PTX is byte-identical to a spec
  // without the field.
  bool sinks = false;
  // Forward and Decode: ALiBi, a per-(sequence, query head) fp32 slope times
  // |i + seqlen_k - seqlen_q - j| subtracted from each score
  // (ForwardParams::alibi_slopes, DecodeParams::alibi_slopes; tile::alibi).
  // Off: the PTX and serialize() are byte-identical to a spec without it.
  bool alibi = false;
  // Decode: K and V hold fp8 bytes (e4m3 or e5m2), converted to the 16-bit
  // dtype on their way into shared memory; descales in DecodeParams. None:
  // the PTX and the serialisation are those of a spec without the field.
  KvFp8 kv_fp8 = KvFp8::None;
  // Decode: KV append (DecodeParams::k_new): the new keys and values are
  // written into the cache and attended to in the same launch, Q and the
  // new K rotated (RoPE) first when rotary != 0 (1: GPT-NeoX pairs, 2: GPT-J
  // interleaved pairs) with a cos/sin table of fp32 (or the dtype when
  // rotary_half_table). Off: the PTX is byte-identical to a spec without
  // the fields.
  bool append_kv = false;
  int rotary = 0;
  bool rotary_half_table = false;
  // mma Forward and Decode with head_dim_v above 256: O's columns are cut
  // into dv_split slices of head_dim_v / dv_split (<= 256, a multiple of 8),
  // one CTA per slice (grid x times dv_split, the slice fastest); each slice
  // recomputes S = Q K^T over the whole head_dim and slice 0 writes the LSE
  // (dv_slice()). 1: the PTX and serialize() are those of a spec without it.
  int dv_split = 1;
  // Decode: V's rows are the first head_dim_v columns of K's rows (fa_decode
  // given the same cache, strides and page table for both: MLA's latent
  // cache, as FlashMLA reads it), so the loop copies K only and reads V from
  // the K tile in shared memory. Off: the PTX and serialize() are those of a
  // spec without it.
  bool v_in_k = false;
  // Forward: the fp8 forward (FlashAttention-3's): Q (q_fp8) and K, V
  // (kv_fp8) hold fp8 bytes and both products run on fp8 tensor cores
  // (mma.sync m16n8k32, sm_89+), P rounded to e4m3; O in dtype. Descales in
  // Fp8ForwardParams. None: the PTX and serialize() are those of a spec
  // without the field.
  KvFp8 q_fp8 = KvFp8::None;
  // wgmma with q_fp8: the producer converts Q, K and V to f16 and the
  // 16-bit wgmma runs (FLASHATTN_SM90_FP8_F16=1, for comparison) instead of
  // the fp8 wgmma on the bytes (V transposed by the producer). Off: the PTX
  // and serialize() are those of a spec without the field.
  bool fp8_f16 = false;
  // Decode with kv_fp8 on a native fp8 mma.sync (fp8_mma_native: sm_89,
  // sm_120/121): mode (b) of the fp8 KV decode (KernelPolicy::decode_fp8_mma).
  // Q is quantised per (token, head) row to e4m3 in the kernel (a power of
  // two per row), S = Q K^T runs on mma.sync m16n8k32 e4m3 x {e4m3, e5m2}
  // straight on the cache bytes, P is rounded to e4m3 and O += P V runs on
  // the same fp8 mma. head_dim a multiple of 32 (whole k32 steps). Off: the
  // PTX and serialize() are those of a spec without it (mode (a)).
  bool kv_fp8_mma = false;
  // Forward on sm_100a (spec.tcgen05, two Q tiles, head_dim_v 128, TMA):
  // the CTAs of a cluster of two (m-blocks 2p and 2p + 1, grid x rounded up
  // to even) run every product as one tcgen05.mma.cta_group::2 of M = 256
  // (Q tile i of both CTAs) issued by the even CTA, each CTA holding half of
  // each K tile's keys and half of each V tile's columns; the pair iterates
  // the key tiles of both its m-blocks (FlashAttention-4's 2-CTA MMA). Off:
  // the PTX and serialize() are those of a spec without it.
  bool cta_pair = false;

  // Canonical bytes (fixed field order, little-endian) hashed into the key.
  std::string serialize() const;
  // Human-readable, e.g. "forward f16 sm80 d128 dv128 g1 bm4 bn32 w4".
  std::string describe() const;
};

// The fp8 forward's two forms (KernelSpec::q_fp8). Where the fp8 mma is
// native (sm_89, sm_120/121: QMMA) both products run on mma.sync m16n8k32
// with P in e4m3. On sm_90 .. sm_110 ptxas expands that mma into two f16
// HMMA with the operands unpacked on every use (and runs out of
// registers), so there Q, K and V are converted exactly to f16 on their way
// into shared memory and the 16-bit kernel runs in f16 (P in f16).
inline bool fp8_mma_native(int sm) { return sm == 89 || sm >= 120; }
inline bool fp8_forward_mma(const KernelSpec &s) {
  return s.q_fp8 != KvFp8::None && fp8_mma_native(s.sm);
}

// The sm_90a fp8 forward on fp8 wgmma (m64nNk32 e4m3/e5m2): Q and K tiles
// of bytes, V transposed into [head_dim_v][keys] by the producer (fp8 wgmma
// reads B K-major only), P in e4m3.
inline bool wgmma_fp8(const KernelSpec &s) {
  return s.wgmma && s.q_fp8 != KvFp8::None && !s.fp8_f16;
}

// O columns one CTA computes: head_dim_v / dv_split.
inline int dv_slice(const KernelSpec &s) { return s.head_dim_v / s.dv_split; }

// Chooses the spec (tiles included) for `kind` of cfg on a device with
// these limits (docs/kernels.md, "Tile choice"), with the environment's
// KernelPolicy.
KernelSpec make_spec(const AttentionConfig &cfg, KernelKind kind, const DeviceLimits &dev,
                     bool varlen);
// What a launch's arguments add to the spec (beyond the config).
struct LaunchShape {
  bool varlen = false;     // cu_seqlens_q/k
  bool seqused_k = false;  // Forward: seqused_k
  KvLayout kv_layout = KvLayout::Contiguous;
  int page_size = 0;  // Paged
  // Q, K and V are addressable by TMA (16-byte aligned bases, strides of
  // whole 16-byte units): the sm_90a forward may run. fa_generate assumes so.
  bool tma_ok = true;
  bool tree_mask = false;                            // Decode: DecodeParams::tree_mask is set
  bool lse_in_base2 = false, lse_out_base2 = false;  // Reduce: fa_lse_format BASE2
  bool sinks = false;  // Forward, Reduce: ForwardParams::sinks / ReduceParams::sinks is set
  bool alibi = false;  // Forward, Decode: alibi_slopes is set
  // Decode: DecodeParams::k_new is set; rotary 0/1/2 and its table type as
  // KernelSpec's.
  bool append_kv = false;
  int rotary = 0;
  bool rotary_half_table = false;
  // Decode: V is K's first head_dim_v columns (KernelSpec::v_in_k).
  bool v_in_k = false;
  // Decode: no cache_seqlens (KernelSpec::fixed_len).
  bool fixed_len = false;
  // Decode: split counters given (KernelSpec::fused_combine).
  bool fused_combine = false;
  // Decode: one split writing O and the LSE (KernelSpec::direct_out).
  bool direct_out = false;
  // Forward on tensor cores, one CTA per m-block: the keys split
  // (KernelSpec::split_kv; its tile keeps a margin of registers for it).
  bool split_kv = false;
};
// The spec is a function of its arguments alone: `policy` picks the kernel
// family (kernels/policy.h).
KernelSpec make_spec(const AttentionConfig &cfg, KernelKind kind, const DeviceLimits &dev,
                     const LaunchShape &shape, const KernelPolicy &policy);
// The same with the environment's policy (KernelPolicy::from_env(); tests
// and tools).
KernelSpec make_spec(const AttentionConfig &cfg, KernelKind kind, const DeviceLimits &dev,
                     const LaunchShape &shape);
// The same with the published limits of `sm` (sm_80's for an unknown SM).
KernelSpec make_spec(const AttentionConfig &cfg, KernelKind kind, int sm, bool varlen);

// The PTX ISA version a spec's module declares, times 10 (e.g. 70 for 7.0):
// the lowest its target and instructions allow.
int ptx_isa_version(const KernelSpec &spec);

// Entry point name, e.g. "fa_forward_f16_d128_dv128".
std::string entry_name(const KernelSpec &spec);

// The PTX module for spec; byte-identical for identical specs.
std::string generate_ptx(const KernelSpec &spec);

// ---------------------------------------------------------------------------
// Parameter blocks. Each kernel takes exactly one parameter, `.param .align 8
// .b8 <entry>_param[sizeof(Params)]`, read with ld.param at offsetof() of
// these fields, so C++ and PTX agree by construction. Pointers are device
// addresses, strides are in elements.
// ---------------------------------------------------------------------------

// The paged and pointer-array KV layouts (flashattn.h, fa_kv_cache_layout).
// Paged: k/v point at page 0 and their stride[0] is the page stride.
struct KvPages {
  uint64_t block_table;        // int32 [batch, block_table_stride]
  uint64_t k_ptrs, v_ptrs;     // uint64 [batch]
  int64_t block_table_stride;  // elements
  int32_t page_size;
  // log2(page_size) when it is a power of two, else 0 (read by the
  // spec.page_pow2 kernels only).
  int32_t page_shift;
};

struct ForwardParams {
  uint64_t q, k, v, o;  // Q/K/V/O as in flashattn.h
  uint64_t lse;         // fp32 [batch, heads_q, seqlen_q] or 0 (varlen: [heads_q, total_q])
  uint64_t cu_seqlens_q, cu_seqlens_k;  // int32 [batch + 1] or 0 (spec.varlen)
  int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];  // batch, seq, head
  int32_t batch, seqlen_q, seqlen_k;                           // varlen: maxima (grid sizing only)
  int32_t num_heads_q, num_heads_kv;
  int32_t window_left, window_right;  // resolved, >= 0 (kUnboundedWindow); causal -> right = 0
  float score_scale;   // no softcap: softmax_scale * log2(e); softcap: softmax_scale / softcap
  float softcap_log2;  // softcap * log2(e); 0 without softcap
  float softcap_neg2;  // -2 log2(e) score_scale with softcap; 0 without
  // Tensor-core kernel (set by set_forward_steps): bytes between K (V) tiles
  // of block_n rows, and between the rows one cp.async round of the CTA
  // covers. Read in the loop as kernel parameters, which the assembler takes
  // from the constant bank, so they hold no register.
  int64_t k_tile_bytes, v_tile_bytes, k_round_bytes, v_round_bytes;
  KvPages kv;          // spec.kv_layout != Contiguous
  uint64_t seqused_k;  // int32 [batch] (spec.seqused_k)
  // spec.sinks only (a kernel without it declares its parameter block to
  // end at sinks): fp32 [num_heads_q], natural-log logits, 4-byte aligned.
  uint64_t sinks;
  // spec.alibi only (a kernel without it declares its parameter block to end
  // at alibi_slopes): fp32, the slope of (b, h) at alibi_slopes[b *
  // alibi_slopes_stride + h], 4-byte aligned; stride 0 = one row.
  uint64_t alibi_slopes;
  int64_t alibi_slopes_stride;
};

// The fp8 forward's descales (spec.q_fp8): fp32 descales of Q, K and V (0 =
// 1.0), the one of (b, h_kv) at element b descale_stride[0] + h_kv
// descale_stride[1], 4-byte aligned. They follow the kernel's usual block
// (Fp8ForwardParams, WgmmaFp8Params; fp8_descales_offset).
struct Fp8Descales {
  uint64_t q_descale, k_descale, v_descale;
  int64_t descale_stride[2];
};
struct Fp8ForwardParams {
  ForwardParams f;
  Fp8Descales d;
};

// The sm_90a forward's parameter block: ForwardParams, then the TMA
// descriptors of Q, K and V (128 bytes each, 64-byte aligned; the driver's
// CUtensorMap on a GPU, emu::TensorMap on the emulator), read by
// cp.async.bulk.tensor through the block's generic address.
struct WgmmaParams {
  ForwardParams f;
  alignas(64) uint8_t tmap_q[128];
  alignas(64) uint8_t tmap_k[128];
  alignas(64) uint8_t tmap_v[128];
};

// The box one TMA copy of the sm_90a forward moves (the runtime encodes the
// tensor maps of Q, K and V with it; the kernel's shared layout assumes it):
// box_rows rows of [batch, seq, heads, dim] x box_cols 16-bit columns, with
// the 128-byte swizzle (CU_TENSOR_MAP_SWIZZLE_128B) its wgmma descriptors
// read. Q's rows are the CTA's block_m queries, K's and V's a tile's block_n
// keys; a head dim wider than box_cols takes several boxes.
enum class TmaOperand { Q, K, V };
struct TmaBox {
  uint32_t box_cols = 0, box_rows = 0;
  bool swizzle_128b = true;
  uint32_t elem_bytes = 2;  // 1: fp8 bytes (the sm_100a fp8 forward: 128 a box row)
};
TmaBox wgmma_tma_box(const KernelSpec &spec, TmaOperand which);

struct DecodeParams {
  uint64_t q, k, v;        // q [b, sq, hq, d], k/v cache [b, sk_max, hkv, d]
  uint64_t cache_seqlens;  // int32 [batch]
  uint64_t o_partial;      // fp32 [num_splits, batch, seqlen_q, heads_q, head_dim_v], contiguous
  uint64_t lse_partial;    // fp32 [num_splits, batch, heads_q, seqlen_q], contiguous
  int64_t q_stride[3], k_stride[3], v_stride[3];  // batch, seq, head
  int32_t batch, seqlen_q, seqlen_k_max;
  int32_t num_heads_q, num_heads_kv;
  int32_t num_splits;
  int32_t split_size;                 // keys per split, a multiple of spec.block_n
  int32_t window_left, window_right;  // as ForwardParams
  float score_scale, softcap_log2;    // as ForwardParams
  float softcap_neg2;                 // as ForwardParams
  KvPages kv;                         // spec.kv_layout != Contiguous
  // spec.tree_mask only (a kernel without it declares its parameter block
  // to end at tree_mask): row (b, i) of 32-bit words at tree_mask +
  // b tree_mask_stride[0] + i tree_mask_stride[1] bytes (4-byte aligned);
  // bit j % 32 of word j / 32 = query i sees new token j.
  uint64_t tree_mask;
  int64_t tree_mask_stride[2];  // bytes: batch, query row
  // spec.alibi only (as ForwardParams; a kernel without it declares its
  // parameter block to end at alibi_slopes, or at tree_mask without a tree
  // mask either).
  uint64_t alibi_slopes;
  int64_t alibi_slopes_stride;
  // spec.kv_fp8 only (a kernel without it declares its parameter block to
  // end at k_descale): fp32 descales, 0 = 1.0; (b, h_kv) at element
  // b descale_stride[0] + h_kv descale_stride[1].
  uint64_t k_descale, v_descale;
  int64_t descale_stride[2];
  // spec.append_kv only (a kernel without it declares its parameter block
  // to end before k_new): new keys/values [b, seqlen_new, hkv, d], written
  // into the cache at cache_seqlens[b] + t (then the sequence's length is
  // cache_seqlens[b] + seqlen_new); spec.rotary: cos/sin [seqlen_ro,
  // rotary_dim / 2] contiguous, positions int32 [b, *] or 0.
  uint64_t k_new, v_new;
  int64_t k_new_stride[3], v_new_stride[3];  // elements: batch, token, head
  uint64_t rotary_cos, rotary_sin, rotary_positions;
  int64_t rotary_positions_stride;  // elements
  int32_t seqlen_new, rotary_dim, seqlen_ro;
  int32_t rotary_pos_causal;  // 1: query t at cache_seqlens + t, else at cache_seqlens
  // spec.varlen only (the runtime's GQA packing of a varlen forward; a
  // kernel without it declares its block to end before, as above):
  // int32 [batch + 1] prefix sums. Sequence b's queries are rows cu[b] ..
  // cu[b+1] - 1 of q ([total_q, heads_q, d]: q_stride[1], [2]; [0] unused),
  // at most seqlen_q of them (the launch's maximum; clamped), aligned to
  // the bottom right of its keys; the partial states stay padded to seqlen_q
  // rows (the varlen combine packs them).
  uint64_t cu_seqlens_q;
  // spec.fused_combine only (a kernel without it declares its block to end
  // before): int32 [batch, num_heads_kv * m-blocks] counters (%ctaid.z
  // nctaid.y + %ctaid.y), zero before the launch and after it; O and LSE
  // as ReduceParams' (fixed-length), sinks with spec.sinks. spec.direct_out
  // reads O, LSE and sinks (and no counters).
  uint64_t split_counters;
  uint64_t o;           // spec.dtype [batch, seqlen_q, heads_q, head_dim_v]
  int64_t o_stride[3];  // elements: batch, seq, head
  uint64_t lse;         // fp32 [batch, heads_q, seqlen_q] contiguous, or 0
  uint64_t sinks;       // fp32 [heads_q] natural-log logits (spec.sinks)
};

// The backward kernels' parameter block (all three kinds; fa_backward):
// the forward's (q, k, v, o, lse as the forward wrote it, cu_seqlens,
// sizes, heads, resolved windows, scales, sinks, ALiBi; k_tile_bytes etc.
// unused), then the gradients' tensors and the workspace's parts.
// BackwardParams::dq_sem: a semaphore per this many rows and column slice.
constexpr int kSemRows = 32, kSemSlices = 2;
struct BackwardParams {
  ForwardParams f;
  uint64_t dout, dq, dk, dv;  // spec.dtype; dout like o, dq like q, dk like k, dv like v
  int64_t dout_stride[3], dq_stride[3], dk_stride[3], dv_stride[3];  // batch, seq, head (elements)
  // Workspace, fp32, rows r = (b heads_q + h) seqlen_q + i (varlen: padded
  // to seqlen_q, the longest, a sequence): dq_accum [rows][head_dim], and
  // row_stats [2][rows]: D_i = rowsum(dO_i o O_i), then the LSE times
  // log2(e) (+inf for a row that sees no key: every p of it 0).
  uint64_t dq_accum, row_stats;
  uint64_t dsinks;      // fp32 [heads_q] (spec.sinks)
  float softmax_scale;  // dQ and dK: dX = dZ softmax_scale (times 1 - tanh^2 with softcap)
  // 1: the key blocks add to a query block's dQ accumulators in key-block
  // order (dq_sem), so dQ's bits do not depend on scheduling.
  int32_t deterministic;
  // Workspace, deterministic only: u32 [batch][heads_q][ceil(seqlen_q /
  // kSemRows)][kSemSlices], zeroed by BackwardPre: the key blocks that have
  // added to the dQ columns of slice s of the query block starting at row
  // kSemRows i (one per block_m rows used) so far.
  uint64_t dq_sem;
};

// The sm_90a backward main kernel's parameter block (spec.wgmma;
// backward_wgmma.cc): BackwardParams, then the TMA descriptors of Q, K, V
// (wgmma_tma_box: Q rows block_m, K and V rows block_n) and dO (Q's box),
// 128 bytes each, 64-byte aligned.
struct BackwardWgmmaParams {
  BackwardParams p;
  alignas(64) uint8_t tmap_q[128];
  alignas(64) uint8_t tmap_k[128];
  alignas(64) uint8_t tmap_v[128];
  alignas(64) uint8_t tmap_do[128];
};

struct ReduceParams {
  uint64_t o_partial;    // fp32 [num_splits, batch, seqlen_q, heads_q, head_dim_v]
  uint64_t lse_partial;  // fp32 [num_splits, batch, heads_q, seqlen_q]
  uint64_t o;            // spec.dtype [batch, seqlen_q, heads_q, head_dim_v]
  uint64_t lse;          // fp32 [batch, heads_q, seqlen_q] contiguous, or 0
  int64_t o_partial_stride[5];
  int64_t lse_partial_stride[4];
  int64_t o_stride[3];  // batch, seq, head
  int32_t num_splits, batch, seqlen_q, num_heads_q;
  // spec.sinks only (a kernel without it declares its parameter block to
  // end at sinks): fp32 [num_heads_q], natural-log logits, 4-byte aligned.
  uint64_t sinks;
  // spec.varlen only (the varlen forward's combine; a kernel without it
  // declares its block to end here): int32 [batch + 1]. Row t of sequence b
  // (partial states padded to seqlen_q rows, the launch's maximum) exists
  // when t < cu[b+1] - cu[b]; O is then the varlen forward's [total_q,
  // heads_q, head_dim_v] (o_stride[1], [2]; [0] unused), row cu[b] + t, and
  // LSE [heads_q, total_q], element h total_q + cu[b] + t, total_q =
  // cu[batch].
  uint64_t cu_seqlens_q;
};

// The sm_90a forward's descriptors stay where they were before
// ForwardParams::sinks (its PTX reads them at these offsets).
static_assert(offsetof(WgmmaParams, tmap_q) == 320, "WgmmaParams layout changed");

// The sm_90a forward's block for fp8 inputs (converted to f16 by its gather
// producer): WgmmaParams, then the descales.
struct WgmmaFp8Params {
  WgmmaParams w;
  Fp8Descales d;
};

// What follows a forward's block with spec.dynamic or spec.split_kv (never
// both).
struct ForwardTail {
  // spec.dynamic: {u32 next, u32 exited}, 8-byte aligned device memory,
  // zero before the launch and zero after it.
  uint64_t workspace;
  // spec.split_kv: fp32 [num_splits, batch, seqlen_q, heads_q, head_dim_v]
  // and fp32 [num_splits, batch, heads_q, seqlen_q], contiguous (DecodeParams').
  uint64_t o_partial, lse_partial;
  int32_t num_splits, split_size;  // split_size: keys, a multiple of spec.block_n
};
// The sm_90a forward's block with a tail: WgmmaParams (WgmmaFp8Params with
// spec.q_fp8), then ForwardTail.
struct WgmmaTailParams {
  WgmmaParams w;
  ForwardTail t;
};
struct WgmmaFp8TailParams {
  WgmmaFp8Params w;
  ForwardTail t;
};
// The mma.sync forward's block with spec.split_kv or spec.dynamic: the
// whole ForwardParams (Fp8ForwardParams with spec.q_fp8), then ForwardTail.
struct ForwardTailParams {
  ForwardParams f;
  ForwardTail t;
};
struct Fp8ForwardTailParams {
  Fp8ForwardParams f;
  ForwardTail t;
};
// Where a forward's ForwardTail sits in its block.
inline size_t forward_tail_offset(const KernelSpec &spec) {
  if (!spec.wgmma && !spec.tcgen05)
    return spec.q_fp8 != KvFp8::None ? offsetof(Fp8ForwardTailParams, t)
                                     : offsetof(ForwardTailParams, t);
  return spec.q_fp8 != KvFp8::None ? offsetof(WgmmaFp8TailParams, t) : offsetof(WgmmaTailParams, t);
}

// Whether (head_dim, head_dim_v) are MLA's latent-cache dims the MLA
// decodes take (576 / 512: DeepSeek-V2/V3's; spec.cc).
bool mla_decode_dims(int head_dim, int head_dim_v);

// The parameter block a decode kernel declares: DecodeParams up to its last
// feature's fields, in their order (tree mask, ALiBi, fp8 descales, append,
// varlen, fused combine),
// so a kernel's PTX is unchanged by the features it does not use; a launch
// passes the whole struct either way.
inline size_t decode_params_size(const KernelSpec &spec) {
  if (spec.fused_combine || spec.direct_out) return sizeof(DecodeParams);
  if (spec.varlen) return offsetof(DecodeParams, split_counters);
  if (spec.append_kv) return offsetof(DecodeParams, cu_seqlens_q);
  if (spec.kv_fp8 != KvFp8::None) return offsetof(DecodeParams, k_new);
  if (spec.alibi) return offsetof(DecodeParams, k_descale);
  return spec.tree_mask ? offsetof(DecodeParams, alibi_slopes) : offsetof(DecodeParams, tree_mask);
}

// The parameter block a forward kernel declares: Fp8ForwardParams for the
// fp8 forward; ForwardParams with ALiBi;
// else with sinks its fields before alibi_slopes, without them those
// before sinks (the sm_90a forward: WgmmaParams, whose size neither
// changes: its descriptors stay at offset 320).
inline size_t forward_params_size(const KernelSpec &spec) {
  if (!spec.wgmma && !spec.tcgen05 && (spec.split_kv || spec.dynamic))
    return spec.q_fp8 != KvFp8::None ? sizeof(Fp8ForwardTailParams) : sizeof(ForwardTailParams);
  if ((spec.wgmma || spec.tcgen05) && (spec.dynamic || spec.split_kv))
    return spec.q_fp8 != KvFp8::None ? sizeof(WgmmaFp8TailParams) : sizeof(WgmmaTailParams);
  if (spec.wgmma || spec.tcgen05)
    return spec.q_fp8 != KvFp8::None ? sizeof(WgmmaFp8Params) : sizeof(WgmmaParams);
  if (spec.q_fp8 != KvFp8::None) return sizeof(Fp8ForwardParams);
  if (spec.alibi) return sizeof(ForwardParams);
  return spec.sinks ? offsetof(ForwardParams, alibi_slopes) : offsetof(ForwardParams, sinks);
}
// Where an fp8 forward's Fp8Descales sit in its parameter block.
inline size_t fp8_descales_offset(const KernelSpec &spec) {
  return spec.wgmma || spec.tcgen05 ? offsetof(WgmmaFp8Params, d) : offsetof(Fp8ForwardParams, d);
}

// The parameter block a reduce kernel declares: the whole ReduceParams
// with varlen, else without sinks only the fields before sinks, with them
// those before cu_seqlens_q.
inline size_t reduce_params_size(const KernelSpec &spec) {
  if (spec.varlen) return sizeof(ReduceParams);
  return spec.sinks ? offsetof(ReduceParams, cu_seqlens_q) : offsetof(ReduceParams, sinks);
}

// Fills the ForwardParams step fields of the tensor-core forward kernel
// from its spec and the strides already set; no-op for other specs.
void set_forward_steps(const KernelSpec &spec, ForwardParams *p);

// Grid, block and dynamic shared memory for a launch. A persistent forward
// (spec.persistent) gets min(work items, ctas) CTAs in x (ctas: the SM
// count, or a test's smaller grid; 0: one CTA per item); a split-KV one
// (spec.split_kv) num_splits times the m-blocks in x.
LaunchGeometry forward_geometry(const KernelSpec &spec, const ForwardParams &p, int64_t ctas = 0,
                                int num_splits = 1);
// The work items of a persistent forward launch (tile::Schedule::total):
// ceil(seqlen_q / block_m) x num_heads_q x batch; for varlen an upper bound
// (the kernel runs only the real items: tile::WorkScheduler).
int64_t forward_work_items(const KernelSpec &spec, const ForwardParams &p);
LaunchGeometry decode_geometry(const KernelSpec &spec, const DecodeParams &p);
LaunchGeometry reduce_geometry(const KernelSpec &spec, const ReduceParams &p);
// The backward kernels' grids (kind BackwardPre / Backward / BackwardPost).
LaunchGeometry backward_geometry(const KernelSpec &spec, const BackwardParams &p);

// Largest dynamic shared memory any launch of spec uses (for Backend::load).
uint32_t max_dynamic_smem(const KernelSpec &spec);

}  // namespace fa

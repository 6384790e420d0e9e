// Kernel specs: tile choice, canonical serialisation, names, PTX ISA
// version, launch geometry, and the generate_ptx dispatch.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <vector>

#include "kernels/codegen.h"

namespace fa {
namespace {

const char *kind_name(KernelKind k) {
  switch (k) {
    case KernelKind::Forward:
      return "forward";
    case KernelKind::Decode:
      return "decode";
    case KernelKind::BackwardPre:
      return "bwdpre";
    case KernelKind::Backward:
      return "backward";
    case KernelKind::BackwardPost:
      return "bwdpost";
    default:
      return "reduce";
  }
}
const char *dtype_name(Dtype d) {
  return d == Dtype::BF16 ? "bf16" : d == Dtype::F32 ? "f32" : "f16";
}
const char *kv_fp8_name(KvFp8 f) { return f == KvFp8::E5M2 ? "e5m2" : "e4m3"; }
const char *kv_text(const KernelSpec &s) {
  switch (s.kv_layout) {
    case KvLayout::Paged:
      return s.page_tiles ? " paged tiles" : s.page_pow2 ? " paged rows pow2" : " paged rows";
    case KvLayout::PtrArray:
      return " ptrs";
    default:
      return "";
  }
}

void put32(std::string &o, int32_t v) {
  uint32_t u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) o.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

// ceil(a / b) for a >= 0, b > 0, without overflow.
int64_t ceil_div(int64_t a, int64_t b) { return a > 0 ? (a - 1) / b + 1 : 0; }

// A grid dimension; values past UINT32_MAX saturate there, so the runtime's
// limit check (grid x < 2^31, y and z <= 65535) rejects them instead of
// launching a truncated grid.
uint32_t grid_dim(int64_t n) {
  return n > int64_t(UINT32_MAX) ? UINT32_MAX : static_cast<uint32_t>(n < 0 ? 0 : n);
}

// Largest rows_per_warp in {4, 2, 1} whose layout fits static shared memory.
int fit_rows_per_warp(KernelSpec s, int max_rows) {
  for (int r = max_rows; r > 1; r /= 2) {
    s.block_m = s.num_warps * r;
    if (kgen::attention_layout(s).total() <= kgen::kStaticSmemLimit) return r;
  }
  return 1;
}

// The sm_100a forward's smallest ring (forward_sm100.cc): the gather
// warps' one-item lag needs a third slot (two Q tiles: V_{j+1} is copied
// while K_{j+1}, V_j, and K_{j+1}'s arrival waits for V_{j+1}'s copies;
// one: V_{j+1} takes V_j's slot of two, freed by O += P(j) V_j, which the
// MMA issues after S(j + 1), which waits for K_{j+1}'s arrival).
static int sm100_min_stages(const KernelSpec &s) { return s.gather ? 3 : 2; }

// The backward kernels (backward_tc.cc): mma.sync on sm_80+, 16-bit
// Q/K/V, head dims up to 128 (a warp's 16 keys of dK and dV stay in
// registers), contiguous K/V, no decode or forward-only option; the main
// kernel's CTA is 4 warps over 64 keys, query blocks of 32 or 64.
bool backward_spec_valid(const KernelSpec &s) {
  if (s.kind == KernelKind::Backward && s.wgmma) {
    // The sm_90a main kernel (backward_wgmma.cc): 128 keys over two
    // consumer warpgroups, query blocks of 64, head dims multiples of 16 up
    // to 128, K/V/Q/dO by TMA (spec.gather, varlen or tensors TMA cannot
    // address: by cp.async).
    return s.sm == 90 && !s.mma && !s.tcgen05 && s.dtype != Dtype::F32 && s.head_dim >= 16 &&
           s.head_dim <= 128 && s.head_dim % 16 == 0 && s.head_dim_v >= 16 && s.head_dim_v <= 128 &&
           s.head_dim_v % 16 == 0 && s.dv_split == 1 && (!s.varlen || s.gather) &&
           (!s.gather || s.head_dim + s.head_dim_v <= 192) && s.kv_fp8 == KvFp8::None &&
           s.q_fp8 == KvFp8::None && s.kv_layout == KvLayout::Contiguous && !s.seqused_k &&
           !s.split_kv && !s.persistent && !s.dynamic && !s.pdl && !s.tree_mask && !s.append_kv &&
           !s.v_in_k && !s.fixed_len && !s.fused_combine && !s.page_tiles && s.rotary == 0 &&
           s.group_size >= 1 && s.num_warps == 12 && s.block_m == 64 && s.block_n == 128 &&
           !s.lse_in_base2 && !s.lse_out_base2;
  }
  // Head dims past 128: the main kernel in dv_split = 2 column slices of dK,
  // dV and dQ (each CTA recomputes S and dP), of whole 8-column blocks.
  const int split = s.kind == KernelKind::Backward ? s.dv_split : 1;
  const bool dims = s.head_dim >= 8 && s.head_dim <= 256 && s.head_dim % (8 * split) == 0 &&
                    s.head_dim_v >= 8 && s.head_dim_v <= 256 && s.head_dim_v % (8 * split) == 0 &&
                    (s.kind != KernelKind::Backward ||
                     (s.head_dim / split <= 128 && s.head_dim_v / split <= 128)) &&
                    (split == 1 || split == 2);
  return dims && s.mma && !s.wgmma && !s.tcgen05 && s.sm >= 80 && s.dtype != Dtype::F32 &&
         s.kv_fp8 == KvFp8::None && s.q_fp8 == KvFp8::None && s.kv_layout == KvLayout::Contiguous &&
         !s.seqused_k && !s.split_kv && !s.persistent && !s.dynamic && !s.pdl && !s.tree_mask &&
         !s.append_kv && !s.v_in_k && !s.fixed_len && !s.fused_combine && !s.gather &&
         !s.page_tiles && s.rotary == 0 && (s.dv_split == 1 || s.kind == KernelKind::Backward) &&
         s.group_size >= 1 && s.num_warps == 4 && s.block_n == 64 &&
         (s.block_m == 16 || s.block_m == 32 || s.block_m == 64) && !s.lse_in_base2 &&
         !s.lse_out_base2 && (s.stages == 0 || (s.kind == KernelKind::Backward && s.stages == 2));
}

bool spec_valid(const KernelSpec &s) {
  if (is_backward(s.kind)) return backward_spec_valid(s);
  if (s.fixed_len && s.kind != KernelKind::Decode) return false;
  if (s.tree_mask && s.kind != KernelKind::Decode) return false;
  if ((s.lse_in_base2 || s.lse_out_base2) && s.kind != KernelKind::Reduce) return false;
  if (s.sinks && s.kind == KernelKind::Decode && !s.fused_combine && !s.direct_out) return false;
  // One split writing O: the sm_100a MLA decode (below), not with the fused
  // combine.
  if (s.direct_out && !(s.kind == KernelKind::Decode && s.tcgen05 && !s.fused_combine))
    return false;
  // The fused combine: the tensor-core decode with fixed-length queries.
  if (s.fused_combine &&
      !(s.kind == KernelKind::Decode && s.mma && !s.wgmma && !s.tcgen05 && !s.varlen))
    return false;
  if (s.alibi && s.kind == KernelKind::Reduce) return false;
  // fp8 KV: the tensor-core decode on SMs with the fp8 cvt (sm_89+), rows of
  // whole 16-byte chunks of fp8 bytes (the decode's O slices too).
  // The fp8 forward (q_fp8, with kv_fp8): the mma.sync forward on sm_89+.
  const bool fp8_fwd = s.q_fp8 != KvFp8::None;
  if (s.kv_fp8 != KvFp8::None &&
      ((s.kv_fp8 != KvFp8::E4M3 && s.kv_fp8 != KvFp8::E5M2) ||
       !((s.kind == KernelKind::Decode || fp8_fwd) && s.mma && s.sm >= 89 && s.head_dim % 16 == 0 &&
         s.head_dim_v % 16 == 0 && (fp8_fwd || dv_slice(s) % 16 == 0))))
    return false;
  // On the fp8 mma its P V steps are k32 and O's slices whole 16-byte chunks;
  // on sm_90a the wgmma kernel's gather variant converts on load.
  if (fp8_fwd &&
      ((s.q_fp8 != KvFp8::E4M3 && s.q_fp8 != KvFp8::E5M2) || s.kind != KernelKind::Forward ||
       s.kv_fp8 == KvFp8::None || (s.wgmma && !s.gather) || s.dtype == Dtype::F32 ||
       (fp8_forward_mma(s) && (s.block_n % 32 != 0 || dv_slice(s) % 16 != 0))))
    return false;
  // The fp8 wgmma's P V steps are k32 and its V transpose takes key tiles of
  // 32, 64 or 128; fp8_f16 only selects between the two sm_90a fp8 forms.
  if (s.fp8_f16 && !(s.wgmma && fp8_fwd)) return false;
  // The fp8 KV decode's mode (b): the mma.sync decode where the fp8 mma is
  // native, whole k32 steps of K's bytes (head_dim % 32), 16-bit Q.
  if (s.kv_fp8_mma &&
      !(s.kind == KernelKind::Decode && s.mma && !s.wgmma && s.kv_fp8 != KvFp8::None &&
        fp8_mma_native(s.sm) && s.head_dim % 32 == 0 && s.dtype != Dtype::F32))
    return false;
  if (wgmma_fp8(s) && s.block_n != 32 && s.block_n != 64 && s.block_n != 128) return false;
  // KV append and RoPE: the tensor-core decode only; rotary needs the append.
  if (s.append_kv && !(s.kind == KernelKind::Decode && s.mma)) return false;
  if (s.rotary < 0 || s.rotary > 2 || (s.rotary && !s.append_kv)) return false;
  if (s.rotary_half_table && !s.rotary) return false;
  // V read from the K tile: the tensor-core decode, no append (it would
  // write the same rows twice), V no wider than K.
  if (s.v_in_k &&
      !(s.kind == KernelKind::Decode && s.mma && !s.append_kv && s.head_dim_v <= s.head_dim))
    return false;
  // fp32 Q/K/V/O: the mma.sync forward and decode (rounding to bf16 on
  // load; no KV append) and the combine (writing fp32 O) only.
  if (s.dtype == Dtype::F32 &&
      !(s.kind == KernelKind::Reduce || (s.kind != KernelKind::Reduce && s.mma && !s.wgmma &&
                                         s.kv_fp8 == KvFp8::None && !s.append_kv)))
    return false;
  // (The fp32 forward's loads spill past head_dim 384 on some tiles.)
  if (s.dtype == Dtype::F32 && s.kind == KernelKind::Forward && s.head_dim > 384) return false;
  // Head dims: the mma.sync forward and decode take head_dim up to 576 and
  // head_dim_v up to 512 (in dv_split slices of at most 256 columns), the
  // combine head_dim_v up to 512, the others 256.
  // The sm_90a MLA decode (kgen::generate_decode_mla): O's columns split
  // between its two consumer warpgroups, not in dv_split slices.
  const bool mla = (s.wgmma || s.tcgen05) && s.kind == KernelKind::Decode;
  const bool big = (s.mma && !s.wgmma) || mla;
  const int max_d = big ? kMaxHeadDim : 256;
  const int max_dv = big || s.kind == KernelKind::Reduce ? kMaxHeadDimV : 256;
  if (s.dv_split < 1 || (s.dv_split > 1 && !big) || s.head_dim_v % (8 * s.dv_split) != 0 ||
      (s.kind != KernelKind::Reduce && !mla && dv_slice(s) > 256) ||
      (s.kind == KernelKind::Reduce && s.dv_split != 1))
    return false;
  bool dv_ok = s.head_dim_v >= 8 && s.head_dim_v <= max_dv && s.head_dim_v % 8 == 0;
  bool w_ok = s.num_warps >= 1 && s.num_warps <= 32;
  // Decode with cu_seqlens_q: the tensor-core one, without KV append or
  // tree mask.
  if (s.kind == KernelKind::Decode && s.varlen && (!s.mma || s.append_kv || s.tree_mask))
    return false;
  // griddepcontrol: sm_90 and up; the tensor-core decode and the combine.
  if (s.pdl && (s.sm < 90 || !(s.kind == KernelKind::Reduce ||
                               (s.kind == KernelKind::Decode && s.mma && !s.wgmma))))
    return false;
  if (s.kind == KernelKind::Reduce) return dv_ok && w_ok && s.block_m == s.num_warps;
  bool d_ok = s.head_dim >= 8 && s.head_dim <= max_d && s.head_dim % 8 == 0;
  // The MLA decode: V in K, head_dim whole 64-column atoms, each consumer
  // warpgroup's O half whole atoms of at most 256 columns; 16-bit Q (K/V
  // 16-bit or fp8), no decode option but windows; 64 rows, 12 warps, key
  // tiles of 16..64.
  // On sm_100a (spec.tcgen05, not wgmma): key tiles of 32 or 64 (each
  // 16-lane half of S takes half of the keys, N = block_n / 2), O's halves
  // at most 256 columns (M = 64's N).
  if (mla)
    return d_ok && dv_ok && mla_decode_dims(s.head_dim, s.head_dim_v) && s.mma && s.gather &&
           s.v_in_k && s.wgmma != s.tcgen05 &&
           (s.tcgen05 ? (s.sm == 100 || s.sm == 103) && (s.block_n == 32 || s.block_n == 64)
                      : s.sm == 90 && s.block_n >= 16 && s.block_n <= 64 && s.block_n % 16 == 0) &&
           s.dtype != Dtype::F32 && (!s.varlen || (s.tcgen05 && s.direct_out)) && !s.tree_mask &&
           !s.alibi && !s.softcap && !s.append_kv && !s.pdl && !s.persistent && !s.dynamic &&
           !s.split_kv && s.q_stages == 1 && s.dv_split == 1 && s.block_m == 64 &&
           s.num_warps == 12 && s.stages >= 2 && s.stages <= 4 && s.group_size >= 1 &&
           s.q_fp8 == KvFp8::None;
  // The sm_100a forward (forward_sm100.cc): one or two 128-row Q tiles
  // (S and O of every tile in tensor memory's 512 columns: two up to
  // head_dim_v 128), key tiles of 128 (64 with one Q tile), head dims up to 256, TMA operands:
  // 16-bit, or fp8 Q, K and V together (kind::f8f6f4).
  if (s.tcgen05)
    return s.kind == KernelKind::Forward && s.mma && !s.wgmma && (s.sm == 100 || s.sm == 103) &&
           s.dtype != Dtype::F32 && d_ok && dv_ok && s.head_dim <= 256 && s.head_dim_v <= 256 &&
           ((s.block_m == 256 && s.head_dim_v <= 128) || s.block_m == 128) &&
           s.num_warps == s.block_m / 32 + 4 &&
           (s.block_n == 128 || (s.block_n == 64 && s.block_m == 128)) &&
           s.stages >= sm100_min_stages(s) && s.stages <= 8 &&
           (s.gather || (!s.varlen && !s.seqused_k && s.kv_layout == KvLayout::Contiguous)) &&
           !s.persistent && !s.dynamic && (!s.split_kv || !s.sinks) && s.q_stages == 1 &&
           s.dv_split == 1 && (s.q_fp8 == KvFp8::None) == (s.kv_fp8 == KvFp8::None) &&
           (!s.cta_pair ||
            (s.block_m == 256 && s.block_n == 128 && s.head_dim_v == 128 && s.head_dim >= 128 &&
             !s.gather && !s.split_kv && s.q_fp8 == KvFp8::None));
  if (s.cta_pair) return false;
  if (s.wgmma)
    return d_ok && dv_ok && s.kind == KernelKind::Forward && s.mma && s.sm == 90 &&
           s.block_m == 128 && s.num_warps == 12 && s.block_n >= 16 && s.block_n <= 256 &&
           s.block_n % 16 == 0 && s.stages >= 2 && s.stages <= 4 &&
           (s.gather || (!s.varlen && !s.seqused_k && s.kv_layout == KvLayout::Contiguous)) &&
           (s.persistent || !s.dynamic) && (!s.split_kv || (!s.persistent && !s.sinks)) &&
           (s.q_stages == 1 || (s.persistent && s.q_stages == 2));
  if (s.gather || (s.dynamic && !s.persistent) || s.q_stages != 1) return false;
  // The persistent mma.sync forward: O in one slice, keys not split.
  if (s.persistent && !(s.mma && s.kind == KernelKind::Forward && s.dv_split == 1 && !s.split_kv))
    return false;
  if (s.split_kv && !(s.mma && s.kind == KernelKind::Forward && !s.sinks)) return false;
  if (s.mma && s.kind == KernelKind::Decode)
    return d_ok && dv_ok && w_ok && s.sm >= 80 && s.block_m == 16 &&
           s.block_n == 16 * s.num_warps && s.stages >= 2 && s.stages <= 4 && s.group_size >= 1 &&
           s.min_ctas >= 1 && s.min_ctas <= 32;
  if (s.mma)
    return d_ok && dv_ok && w_ok && s.kind == KernelKind::Forward && s.sm >= 80 &&
           (s.m_tiles == 1 || s.m_tiles == 2) && s.block_m == 16 * s.m_tiles * s.num_warps &&
           s.block_n >= 16 && s.block_n % 16 == 0 && s.block_n <= 128 && s.stages == 1 &&
           s.min_ctas >= 1 && s.min_ctas <= 32;
  return d_ok && dv_ok && w_ok && s.block_n == 32 && s.group_size >= 1 &&
         s.block_m % s.num_warps == 0 && s.block_m > 0;
}

// O's column slices for head_dim_v (KernelSpec::dv_split): none up to
// 256, else the fewest slices of equal width (a multiple of `unit`) of at
// most 256 columns: 2 for 272, 288, .., 512; 3 for 264 (88 each). The fp8
// forward's slices are whole 16-byte chunks (unit 16): 17 for 272.
int choose_dv_split(int dv, int unit = 8) {
  if (dv <= 256) return 1;
  for (int n = 2; unit * n <= dv; ++n)
    if (dv % (unit * n) == 0 && dv / n <= 256) return n;
  return dv / unit;
}

// Registers per thread a forward mma tile needs, estimated: f32
// accumulators O (16 m_tiles x dv per warp) and S (16 m_tiles x block_n), Q
// fragments (all of them when kept, else one k-step's), and 48 for
// addresses, indices, softmax state and the assembler's scheduling (the
// margin that keeps every tile of tests/test_ptxas free of spills).
int forward_regs(int dpad, int dvpad, int m_tiles, int block_n, bool q_in_regs) {
  const int o = m_tiles * dvpad / 2, s = m_tiles * block_n / 2;
  const int q = q_in_regs ? m_tiles * dpad / 4 : 4 * m_tiles;
  return o + s + q + 48;
}

// The forward tensor-core tile for a device (docs/kernels.md, "Tile
// choice"). Candidates in order of preference: two m-tiles per warp (every K
// and V fragment read from shared memory feeds two mma), then one; 4 warps,
// then 8. Feasible: shared memory within the per-block opt-in, at most 255
// registers. Chosen: the most resident warps per SM up to 8 (FlashAttention-2's
// occupancy), then the earliest candidate.
void choose_forward_tile(const DeviceLimits &dev, KernelSpec *s) {
  const int dpad = (s->head_dim + 15) / 16 * 16, dvpad = (dv_slice(*s) + 15) / 16 * 16;
  struct Cand {
    int m_tiles, warps, block_n;
    bool q_in_regs;
  };
  // Q stays in registers only for head dims up to 64: larger sets of Q
  // fragments crowd the accumulators into spills.
  // An fp8 Q row of d bytes is held as d / 2 16-bit columns: its fragments
  // take half the registers where the fp8 mma runs (fp8_forward_mma); else
  // Q is converted to f16 on load.
  const bool fp8 = s->q_fp8 != KvFp8::None;
  const bool fp8_native = fp8_mma_native(s->sm);
  const int qpad = fp8 && fp8_native ? dpad / 2 : dpad;
  const bool qr = qpad <= 64;
  // Past 256 one more, smallest: 2 warps (32 rows) x 32 keys, so that Q,
  // K and V at 576 fit the 99 KB of sm_86/89/120 (4 warps x 32 keys: 126 KB).
  const Cand base[] = {{2, 4, 64, qr},    {2, 4, 64, false}, {1, 4, 64, qr},   {1, 4, 64, false},
                       {1, 8, 64, false}, {1, 4, 32, false}, {1, 2, 32, false}};
  const std::vector<Cand> cands(
      base, base + (dpad > 256 || s->dv_split > 1 ? std::size(base) : std::size(base) - 1));
  int best_score = -1, fallback_regs = 1 << 30;
  bool have_fallback = false;
  // A device that reports no limits (a driver mock) gets its SM's published
  // ones; and some tile is always chosen: the last, smallest candidate, which
  // the backend's load then accepts or refuses by the device's own limit.
  DeviceLimits lim = dev;
  if (lim.smem_per_sm == 0 || lim.regs_per_sm == 0 || lim.threads_per_sm == 0) {
    if (!published_limits(dev.sm, &lim)) published_limits(80, &lim);
  }
  if (lim.smem_per_block_optin == 0) lim.smem_per_block_optin = lim.smem_per_sm - 1024;
  for (const Cand &c : cands) {
    // Softcap's tanh keeps more values in flight (about 32 registers more at
    // the same tile in ptxas 13.0's allocation). fp32 inputs are loaded into
    // registers (8 per 16-byte chunk of the tile) and the assembler hoists
    // those loads: 16 plus 4 per chunk a thread copies of a K or V tile
    // (the margin that keeps every fp32 head dim of tests/test_ptxas free of
    // spills; d 112 and 216 spilled with 16 alone).
    const int chunks = (c.block_n * std::max(dpad, dvpad) / 8 + 32 * c.warps - 1) / (32 * c.warps);
    // The fp8 mma forward: 8 more (V's permuted fragments, P's halves); fp8
    // converted on load: 8 plus 2 per chunk (the loaded bytes).
    const int fp8_regs = !fp8 ? 0 : fp8_native ? 8 : 8 + 2 * chunks;
    // Split-KV: 16 more (the split's key range and the partial state's
    // 64-bit addresses; sm_80 d128 paged by row with ALiBi spilled without).
    const int regs = forward_regs(qpad, dvpad, c.m_tiles, c.block_n, c.q_in_regs) + fp8_regs +
                     (s->softcap ? 32 : 0) + (s->dtype == Dtype::F32 ? 16 + 4 * chunks : 0) +
                     (s->split_kv ? 24 : 0);
    // An estimate past 255 is only a fallback: when no candidate fits
    // within 255, the one with the fewest estimated registers among those
    // that fit shared memory (then ptxas caps the registers at 255).
    const bool last = &c == &cands.back();
    KernelSpec t = *s;
    t.m_tiles = c.m_tiles;
    t.num_warps = c.warps;
    t.block_m = 16 * c.m_tiles * c.warps;
    t.block_n = c.block_n;
    t.q_in_regs = c.q_in_regs;
    t.persistent = false;  // the tile's memory (the persistent scheduler area fits beside it)
    const uint32_t smem = kgen::tc_layout(t).total;
    t.persistent = s->persistent;  // the same tile either way: bit-identical results
    const uint32_t threads = 32u * c.warps;
    const uint32_t alloc = (static_cast<uint32_t>(std::min(regs, 255)) + 7) / 8 * 8 * threads;
    uint32_t ctas = std::min({lim.smem_per_sm / (smem + 16 + 1024), lim.regs_per_sm / alloc,
                              lim.threads_per_sm / threads, 32u});
    if (smem + 16 > lim.smem_per_block_optin) ctas = 0;  // + static: varlen's sequence lengths
    if (ctas == 0) {
      if (best_score < 0 && !have_fallback && last) {
        t.min_ctas = 1;  // nothing fits: the smallest tile, for the backend to judge
        *s = t;
      }
      continue;
    }
    if (regs > 255) {
      if (best_score < 0 && regs < fallback_regs) {
        fallback_regs = regs;
        have_fallback = true;
        t.min_ctas = static_cast<int>(ctas);
        *s = t;
      }
      continue;
    }
    const int score = std::min<int>(static_cast<int>(ctas) * c.warps, 8);
    if (score > best_score) {
      have_fallback = false;
      best_score = score;
      t.min_ctas = static_cast<int>(ctas);
      *s = t;
    }
  }
}

// The sm_90a forward tile (docs/kernels.md, "Forward on sm_90a"): block_m
// 128 (two consumer warpgroups of 64 rows), block_n from the consumers'
// registers (S: block_n / 2, O: head_dim_v / 2, P: block_n / 4 per thread,
// 48 more for addresses and softmax state, 16 with softcap, within 232; the
// gather variant within 216), stages as many as shared
// memory holds (2..4), after a second Q buffer when persistent
// (KernelSpec::q_stages).
// The sm_100a forward's tile (forward_sm100.cc): two 128-row Q tiles where
// they fit (tensor memory: S and both O tiles in 512 columns, head_dim_v up
// to 128; shared memory: both Q tiles and the smallest ring), else one;
// 128 keys, four warps a Q tile and four more, and as many ring slots as
// shared memory holds (up to 6).
void choose_sm100_tile(const DeviceLimits &dev, KernelSpec *s) {
  DeviceLimits lim = dev;
  if (lim.smem_per_block_optin == 0) published_limits(100, &lim);
  s->block_n = 128;
  for (int q_tiles = s->head_dim_v > 128 ? 1 : 2; q_tiles >= 1; --q_tiles) {
    s->block_m = 128 * q_tiles;
    s->num_warps = 4 * q_tiles + 4;
    s->stages = sm100_min_stages(*s);
    if (kgen::sm100_smem(*s) <= lim.smem_per_block_optin) break;
  }
  // One Q tile: key tiles of 64 where 128 keeps a 16-bit Q out of tensor
  // memory (beside two S buffers and O; d 256: S then reads only K from
  // shared memory, and the loop is no longer bound there) or where the
  // ring's smallest form does not fit with 128.
  if (s->block_m == 128) {
    const bool fits = kgen::sm100_smem(*s) <= lim.smem_per_block_optin;
    if (!fits || (s->q_fp8 == KvFp8::None && !kgen::sm100_q_in_tmem(*s))) {
      KernelSpec t = *s;
      t.block_n = 64;
      t.stages = sm100_min_stages(t);
      if (kgen::sm100_smem(t) <= lim.smem_per_block_optin && (!fits || kgen::sm100_q_in_tmem(t)))
        s->block_n = 64;
    }
  }
  for (s->stages = 6; s->stages > sm100_min_stages(*s); --s->stages)
    if (kgen::sm100_smem(*s) <= lim.smem_per_block_optin) break;
}

void choose_wgmma_tile(const DeviceLimits &dev, KernelSpec *s) {
  DeviceLimits lim = dev;
  if (lim.smem_per_block_optin == 0 && !published_limits(dev.sm, &lim)) published_limits(90, &lim);
  s->block_m = 128;
  s->num_warps = 12;
  s->m_tiles = 1;
  s->min_ctas = 1;
  const int dv8 = (s->head_dim_v + 7) / 8 * 8;
  // The gather producer keeps 56 registers, leaving the consumers 224, 8 of
  // them held back; with softcap block_n stays below 128 there (d 96 spilled
  // at 128): the margins that keep every head dim free of spills.
  // fp8 inputs (the gather producer converts them) leave the consumers 216:
  // 208 of them.
  // The fp8 wgmma (wgmma_fp8) holds P in e4m3 (block_n / 8), takes key
  // tiles of 128, 64 or 32 and has the gather producer's 56 registers
  // (consumers 224, within 216; softcap too: no spill up to 128 keys).
  const bool f8 = wgmma_fp8(*s);
  const int budget = f8                        ? 216
                     : s->q_fp8 != KvFp8::None ? 208
                     : s->gather               ? 216
                                               : 232,
            max_bn = s->gather && s->softcap && !f8 ? 112 : 128;
  s->block_n = f8 ? 32 : 16;
  for (int bn : {128, 112, 96, 80, 64, 48, 32, 16}) {
    if (f8 && bn != 128 && bn != 64 && bn != 32) continue;
    if (bn <= max_bn &&
        bn / 2 + dv8 / 2 + bn / (f8 ? 8 : 4) + 48 + (s->softcap ? 16 : 0) <= budget) {
      s->block_n = bn;
      break;
    }
  }
  // Persistent: two Q buffers (the next item's Q in flight) before a third
  // or fourth K/V stage; FlashAttention-3 runs head_dim 128 on two stages.
  for (int q = s->persistent ? 2 : 1; q >= 1; --q) {
    s->q_stages = q;
    for (int st = 4; st >= 2; --st) {
      s->stages = st;
      if (kgen::wgmma_smem(*s) <= lim.smem_per_block_optin) return;
    }
  }
  // Nothing fits with two stages: smaller key tiles.
  while (s->block_n > (f8 ? 32 : 16) && kgen::wgmma_smem(*s) > lim.smem_per_block_optin)
    s->block_n = f8 ? s->block_n / 2 : s->block_n - 16;
}

// The sm_90a MLA decode (docs/kernels.md, "MLA decode on sm_90a") where the
// policy asks for it and the shape is one it takes: 64 packed rows, key
// tiles of 48 in two stages (Q 72 KB + 2 x 54 KB of K + 24 KB of partial
// scores at 576 / 512: 203 KB), else false (the mma.sync decode).
bool choose_mla_tile(const DeviceLimits &dev, const KernelPolicy &policy, const LaunchShape &shape,
                     KernelSpec *s) {
  const bool sm100 = (dev.sm == 100 || dev.sm == 103) && policy.sm100_mla;
  // (cu_seqlens_q: only the sm_100a kernel's one-split form writing O,
  // the forward's.)
  if (!(sm100 || (policy.sm90_mla && dev.sm == 90)) || !s->v_in_k || s->dtype == Dtype::F32 ||
      (s->varlen && !(sm100 && shape.direct_out)) || s->softcap || shape.alibi || shape.tree_mask ||
      shape.append_kv || !mla_decode_dims(s->head_dim, s->head_dim_v))
    return false;
  KernelSpec t = *s;
  t.gather = true;
  t.dv_split = 1;
  t.block_m = 64;
  t.num_warps = 12;
  t.min_ctas = 1;
  t.q_in_regs = false;
  t.kv_fp8_mma = false;
  DeviceLimits lim = dev;
  if (lim.smem_per_block_optin == 0 && !published_limits(dev.sm, &lim)) return false;
  if (sm100) {
    // Key tiles of 32 in as many stages as fit (up to 4: 72 KB of Q and 4 x
    // 36 KB of K at 576): a K tile stays until its P V, so the copies run
    // ahead by the stages.
    t.tcgen05 = true;
    t.block_n = 32;
    for (t.stages = 4; t.stages >= 2; --t.stages)
      if (kgen::decode_mla_smem(t) <= lim.smem_per_block_optin) break;
    // The forward's one-split form (many rows a key: the products read
    // shared memory, not HBM, per FLOP): key tiles of 64 where two stages
    // fit, so each S product's N (block_n / 2) reads Q for twice the keys.
    if (shape.direct_out) {
      KernelSpec w = t;
      w.block_n = 64;
      w.stages = 2;
      if (kgen::decode_mla_smem(w) <= lim.smem_per_block_optin) t = w;
    }
  } else {
    t.wgmma = true;
    t.block_n = 48;
    t.stages = 2;
  }
  if (t.stages < 2 || kgen::decode_mla_smem(t) > lim.smem_per_block_optin) return false;
  *s = t;
  return true;
}

// The tensor-core decode tile (docs/kernels.md, "Decode on tensor cores"):
// 16 packed rows per CTA; warps x stages from shared memory, preferring 4
// warps with 3 stages (two warp tiles in flight per warp), then fewer
// stages, then fewer warps. Q stays in registers up to head_dim 128.
void choose_decode_tile(const DeviceLimits &dev, KernelSpec *s) {
  DeviceLimits lim = dev;
  if (lim.smem_per_sm == 0 || lim.regs_per_sm == 0 || lim.threads_per_sm == 0) {
    if (!published_limits(dev.sm, &lim)) published_limits(80, &lim);
  }
  if (lim.smem_per_block_optin == 0) lim.smem_per_block_optin = lim.smem_per_sm - 1024;
  const int dpad = (s->head_dim + 15) / 16 * 16, dvpad = (dv_slice(*s) + 15) / 16 * 16;
  s->block_m = 16;
  s->q_in_regs = dpad <= 128;
  // fp32 K/V: 8 loaded values per chunk in flight, 16 more.
  const int regs = dvpad / 2 + 8 + (s->q_in_regs ? dpad / 4 : 4) + 64 + (s->softcap ? 16 : 0) +
                   (s->dtype == Dtype::F32 ? 16 : 0);
  const int cands[][2] = {{4, 3}, {4, 2}, {2, 2}, {1, 2}};
  for (const auto &c : cands) {
    KernelSpec t = *s;
    t.num_warps = c[0];
    t.stages = c[1];
    t.block_n = 16 * c[0];
    const uint32_t smem = kgen::decode_tc_smem(t);
    const uint32_t threads = 32u * c[0];
    const uint32_t alloc = (static_cast<uint32_t>(std::min(regs, 255)) + 7) / 8 * 8 * threads;
    const uint32_t ctas = std::min({lim.smem_per_sm / (smem + 1024), lim.regs_per_sm / alloc,
                                    lim.threads_per_sm / threads, 32u});
    *s = t;
    s->min_ctas = std::max<int>(1, static_cast<int>(ctas));
    if (smem <= lim.smem_per_block_optin && ctas >= 1) return;
  }
}

}  // namespace

// Head dims the MLA decodes take: K rows of whole 64-column atoms, V (K's
// first head_dim_v columns) halves of whole atoms, each at most 256 columns
// (a consumer warpgroup's wgmma N, an M = 64 tcgen05.mma's N) and wider
// than one O slice of the mma.sync decode (256) so that sharing S pays:
// DeepSeek's 576 / 512.
bool mla_decode_dims(int head_dim, int head_dim_v) {
  return head_dim % 64 == 0 && head_dim_v % 128 == 0 && head_dim_v > 256 && head_dim_v <= 512 &&
         head_dim_v <= head_dim;
}

std::string KernelSpec::serialize() const {
  std::string o = "FASPEC3";
  o.push_back(static_cast<char>(kind));
  o.push_back(static_cast<char>(dtype));
  put32(o, sm);
  put32(o, head_dim);
  put32(o, head_dim_v);
  put32(o, group_size);
  o.push_back(softcap ? 1 : 0);
  o.push_back(varlen ? 1 : 0);
  put32(o, block_m);
  put32(o, block_n);
  put32(o, num_warps);
  o.push_back(mma ? 1 : 0);
  put32(o, stages);
  put32(o, m_tiles);
  o.push_back(q_in_regs ? 1 : 0);
  put32(o, min_ctas);
  o.push_back(static_cast<char>(kv_layout));
  o.push_back(page_tiles ? 1 : 0);
  o.push_back(seqused_k ? 1 : 0);
  o.push_back(wgmma ? 1 : 0);
  if (tcgen05) o += "tc05";  // only when on: the keys of other kernels are unchanged
  o.push_back(gather ? 1 : 0);
  o.push_back(tree_mask ? 1 : 0);
  o.push_back(lse_in_base2 ? 1 : 0);
  o.push_back(lse_out_base2 ? 1 : 0);
  o.push_back(sinks ? 1 : 0);
  if (alibi) o += "alibi";  // only when on: the keys of other kernels are unchanged
  if (kv_fp8 != KvFp8::None) o.push_back(static_cast<char>(kv_fp8));  // only when on
  if (append_kv) {  // absent when off: older keys stay valid
    o.push_back('A');
    o.push_back(static_cast<char>(rotary));
    o.push_back(rotary_half_table ? 1 : 0);
  }
  if (dv_split != 1) {  // absent for head_dim_v <= 256: older keys stay valid
    o.push_back('V');
    put32(o, dv_split);
  }
  if (v_in_k) o.push_back('K');  // only when on
  if (q_fp8 != KvFp8::None) {    // only when on
    o.push_back('Q');
    o.push_back(static_cast<char>(q_fp8));
  }
  if (fp8_f16) o.push_back('F');        // only when on
  if (kv_fp8_mma) o.push_back('M');     // only when on
  if (page_pow2) o.push_back('P');      // only when on
  if (persistent) o.push_back('T');     // only when on
  if (dynamic) o.push_back('D');        // only when on
  if (split_kv) o.push_back('S');       // only when on
  if (fixed_len) o.push_back('L');      // only when on
  if (pdl) o.push_back('G');            // only when on
  if (fused_combine) o.push_back('C');  // only when on
  if (direct_out) o.push_back('O');     // only when on
  if (cta_pair) o.push_back('Y');       // only when on
  if (q_stages != 1) {                  // only when on
    o.push_back('B');
    o.push_back(static_cast<char>(q_stages));
  }
  return o;
}

std::string KernelSpec::describe() const {
  char buf[200], st[48] = "";
  if (mma)
    std::snprintf(st, sizeof st, " s%d mt%d%s c%d", stages, m_tiles, q_in_regs ? " qr" : "",
                  min_ctas);
  std::snprintf(buf, sizeof buf, "%s %s sm%d d%d dv%d g%d bm%d bn%d w%d%s%s%s%s%s%s",
                kind_name(kind), dtype_name(dtype), sm, head_dim, head_dim_v, group_size, block_m,
                block_n, num_warps, softcap ? " softcap" : "", varlen ? " varlen" : "",
                tcgen05 ? (gather ? " tcgen05 gather" : " tcgen05")
                : wgmma ? (gather ? " wgmma gather" : " wgmma")
                : mma   ? " mma"
                        : "",
                st, kv_text(*this), seqused_k ? " seqused_k" : "");
  return std::string(buf) + (tree_mask ? " tree_mask" : "") +
         (lse_in_base2 ? " lse_in_base2" : "") + (lse_out_base2 ? " lse_out_base2" : "") +
         (sinks ? " sinks" : "") + (alibi ? " alibi" : "") +
         (kv_fp8 != KvFp8::None ? std::string(" kv_") + kv_fp8_name(kv_fp8) : "") +
         (append_kv ? " append" : "") +
         (rotary == 1   ? " rope_neox"
          : rotary == 2 ? " rope_interleaved"
                        : "") +
         (rotary_half_table ? " rope_table16" : "") +
         (dv_split != 1 ? " dv_split" + std::to_string(dv_split) : "") + (v_in_k ? " v_in_k" : "") +
         (q_fp8 != KvFp8::None ? std::string(" q_") + kv_fp8_name(q_fp8) : "") +
         (fp8_f16 ? " fp8_f16" : "") + (kv_fp8_mma ? " fp8_mma" : "") +
         (persistent ? " persistent" : "") + (dynamic ? " dynamic" : "") +
         (split_kv ? " split" : "") + (fixed_len ? " fixed_len" : "") + (pdl ? " pdl" : "") +
         (fused_combine ? " fused_combine" : "") + (direct_out ? " direct_out" : "") +
         (cta_pair ? " cta_pair" : "") + (q_stages != 1 ? " q" + std::to_string(q_stages) : "");
}

// Tiles (scalar fp32 kernels, docs/kernels.md): block_n = 32 (lane = key);
// forward: 4 warps x up to 4 rows each, fewer rows when shared memory is
// short; decode: one warp per query head of the GQA group (at most 4), up
// to 4 rows each; reduce: 4 warps, one row each. group_size is only part of
// the spec for decode (forward reads the head ratio at run time).
KernelSpec make_spec(const AttentionConfig &cfg, KernelKind kind, const DeviceLimits &dev,
                     bool varlen) {
  LaunchShape shape;
  shape.varlen = varlen;
  return make_spec(cfg, kind, dev, shape);
}

KernelSpec make_spec(const AttentionConfig &cfg, KernelKind kind, const DeviceLimits &dev,
                     const LaunchShape &shape) {
  return make_spec(cfg, kind, dev, shape, KernelPolicy::from_env());
}

KernelSpec make_spec(const AttentionConfig &cfg, KernelKind kind, const DeviceLimits &dev,
                     const LaunchShape &shape, const KernelPolicy &policy) {
  const bool varlen = shape.varlen;
  KernelSpec s;
  s.kind = kind;
  s.dtype = cfg.dtype;
  s.sm = dev.sm;
  s.head_dim_v = cfg.head_dim_v > 0 ? cfg.head_dim_v : cfg.head_dim;
  if (is_backward(kind)) {
    // One tile for every backward kernel of a config (backward_spec_valid):
    // 64 keys over 4 warps; query blocks of 64 up to head dims of 64, else
    // 32 (registers: a warp's dK and dV, 16 keys x head_dim f32 each).
    int g = cfg.num_heads_kv > 0 ? cfg.num_heads_q / cfg.num_heads_kv : 1;
    s.group_size = g < 1 ? 1 : g;
    s.head_dim = cfg.head_dim;
    s.softcap = cfg.softcap > 0;
    s.varlen = varlen;
    s.alibi = shape.alibi;
    s.sinks = shape.sinks;
    s.mma = true;
    s.num_warps = 4;
    s.block_n = 64;
    s.block_m = s.head_dim <= 64 && s.head_dim_v <= 64 ? 64 : 32;
    DeviceLimits lim = dev;
    if (lim.smem_per_block_optin == 0 && !published_limits(dev.sm, &lim))
      published_limits(80, &lim);
    if (kind == KernelKind::Backward && (s.head_dim > 128 || s.head_dim_v > 128)) {
      // Two column slices of dK, dV and dQ (backward_tc.cc); query blocks of
      // 32 where the SM's shared memory holds the full K, V, Q and dO tiles
      // (104 KB at 256), else 16 (88 KB: sm_86, 89, 120).
      s.dv_split = 2;
      if (kgen::backward_smem(s) > lim.smem_per_block_optin) s.block_m = 16;
    }
    // Softcap (1 - tanh^2 of each score kept) or ALiBi past 96 columns a
    // slice: the registers of query blocks of 32 spill; 16.
    if (kind == KernelKind::Backward && s.block_m == 32 && (s.softcap || s.alibi) &&
        std::max(s.head_dim, s.head_dim_v) / s.dv_split > 96)
      s.block_m = 16;
    // FlashAttention-3's structure on wgmma and TMA (backward_wgmma.cc);
    // varlen, or tensors TMA cannot address: rows copied by cp.async, whose
    // warp's registers leave the consumers 224, enough for dK and dV of
    // head_dim + head_dim_v <= 192 (else the mma.sync kernel).
    const bool gather = varlen || !shape.tma_ok;
    if (kind == KernelKind::Backward && dev.sm == 90 && policy.sm90_backward &&
        s.head_dim % 16 == 0 && s.head_dim_v % 16 == 0 && s.head_dim <= 128 &&
        s.head_dim_v <= 128 && (!gather || s.head_dim + s.head_dim_v <= 192)) {
      s.mma = false;
      s.wgmma = true;
      s.gather = gather;
      s.num_warps = 12;
      s.block_m = 64;
      s.block_n = 128;
      s.dv_split = 1;
    }
    if (kind == KernelKind::Backward && s.mma) {
      // Q, dO and their statistics double-buffered (stages 2) where the
      // second buffer fits a block and costs none of the two CTAs an SM the
      // kernel asks for (1 KB reserved a CTA; e.g. not at head dim 64 on the
      // 100 KB SMs); block_m as chosen above, for one buffer.
      auto ctas = [&](const KernelSpec &t) {
        const uint32_t smem = kgen::backward_smem(t);
        return smem > lim.smem_per_block_optin ? 0u : std::min(2u, lim.smem_per_sm / (smem + 1024));
      };
      KernelSpec two = s;
      two.stages = 2;
      if (ctas(two) >= std::max(1u, ctas(s))) s.stages = 2;
    }
    return s;
  }
  if (kind == KernelKind::Reduce) {
    s.num_warps = 4;
    s.block_m = 4;
    s.lse_in_base2 = shape.lse_in_base2;
    s.lse_out_base2 = shape.lse_out_base2;
    s.sinks = shape.sinks;
    s.varlen = varlen;  // the varlen forward's combine
    s.pdl = policy.pdl && dev.sm >= 90;
    return s;
  }
  s.head_dim = cfg.head_dim;
  s.softcap = cfg.softcap > 0;
  s.block_n = 32;
  // The sm_90a forward reads 16-bit tiles by TMA: fp32 inputs (converted
  // on their way into shared memory) take the mma.sync forward there too.
  // head_dim_v past 256: O in slices (KernelSpec::dv_split), on mma.sync.
  const bool big = s.head_dim > 256 || s.head_dim_v > 256;
  // The fp8 forward: on sm_90a the wgmma kernel's gather variant, whose
  // producer converts the bytes to f16 (fp8_forward_mma: the fp8 mma.sync is
  // not native there); elsewhere the mma.sync forward.
  const bool fp8_fwd = kind == KernelKind::Forward && cfg.q_fp8 != KvFp8::None;
  s.split_kv = kind == KernelKind::Forward && shape.split_kv;  // before the tile choice
  if (kind == KernelKind::Forward && dev.sm == 90 && !policy.scalar_forward && policy.sm90_wgmma &&
      cfg.dtype != Dtype::F32 && !big) {
    // TMA where it can address Q, K and V as boxes; else the producer
    // gathers rows with cp.async (FlashAttention-3 does so for paged KV).
    s.varlen = varlen;
    s.mma = true;
    s.wgmma = true;
    s.gather = varlen || shape.seqused_k || shape.kv_layout != KvLayout::Contiguous ||
               !shape.tma_ok || fp8_fwd;
    if (fp8_fwd) {
      s.q_fp8 = cfg.q_fp8;
      s.kv_fp8 = cfg.kv_fp8;
      s.fp8_f16 = policy.sm90_fp8_f16;
    }
    s.persistent = policy.sm90_persistent;
    choose_wgmma_tile(dev, &s);
  } else if (kind == KernelKind::Forward && (dev.sm == 100 || dev.sm == 103) &&
             policy.sm100_forward && !policy.scalar_forward && cfg.dtype != Dtype::F32 &&
             (!fp8_fwd ||
              (cfg.kv_fp8 != KvFp8::None && s.head_dim % 16 == 0 && s.head_dim_v % 16 == 0)) &&
             s.head_dim % 8 == 0 && s.head_dim_v % 8 == 0 && !big) {
    // TMA where it can address Q, K and V as boxes; else two warps gather
    // rows with cp.async (varlen, seqused_k, paged and pointer-array KV).
    s.varlen = varlen;
    s.mma = true;
    s.tcgen05 = true;
    s.gather =
        varlen || shape.seqused_k || shape.kv_layout != KvLayout::Contiguous || !shape.tma_ok;
    if (fp8_fwd) {  // kind::f8f6f4 on the bytes (its atoms hold 128 columns)
      s.q_fp8 = cfg.q_fp8;
      s.kv_fp8 = cfg.kv_fp8;
    }
    choose_sm100_tile(dev, &s);
    // CTA pairs where every row sees every key (the pair's two m-blocks
    // then share their key tiles exactly), as FlashAttention-4 runs them.
    if (policy.sm100_cta_pair && !cfg.causal && cfg.window_left < 0 && cfg.window_right < 0 &&
        !s.gather && !s.split_kv && !fp8_fwd && s.block_m == 256 && s.head_dim_v == 128 &&
        s.head_dim >= 128) {
      s.cta_pair = true;
      choose_sm100_tile(dev, &s);  // the pair's ring: half of each K and V tile a CTA
    }
  } else if (kind == KernelKind::Forward && dev.sm >= 80 && !policy.scalar_forward) {
    s.varlen = varlen;
    s.mma = true;
    s.stages = 1;
    s.dv_split = choose_dv_split(s.head_dim_v, fp8_fwd && fp8_mma_native(dev.sm) ? 16 : 8);
    if (fp8_fwd) {  // its shared-memory layout differs: before the tile choice
      s.q_fp8 = cfg.q_fp8;
      s.kv_fp8 = cfg.kv_fp8;
    }
    s.persistent = policy.sm80_persistent && s.dv_split == 1 && !s.split_kv;
    choose_forward_tile(dev, &s);
  } else if (kind == KernelKind::Forward) {
    s.varlen = varlen;
    s.num_warps = 4;
    s.block_m = s.num_warps * fit_rows_per_warp(s, 4);
  } else if (dev.sm >= 80 && !policy.scalar_decode) {
    int g = cfg.num_heads_kv > 0 ? cfg.num_heads_q / cfg.num_heads_kv : 1;
    s.group_size = g < 1 ? 1 : g;
    s.mma = true;
    s.kv_fp8 = cfg.kv_fp8;  // its shared-memory layout differs: before the tile choice
    // fp8: slices of whole 16-byte chunks of V's bytes (ldmatrix rows).
    s.dv_split = choose_dv_split(s.head_dim_v, s.kv_fp8 != KvFp8::None ? 16 : 8);
    s.v_in_k = shape.v_in_k && !shape.append_kv && s.head_dim_v <= s.head_dim;  // likewise
    // fp8 KV mode (b) (policy.decode_fp8_mma): where the fp8 mma is native
    // and head_dim is whole k32 steps; else mode (a). Likewise before the tile.
    s.kv_fp8_mma = policy.decode_fp8_mma && s.kv_fp8 != KvFp8::None && fp8_mma_native(dev.sm) &&
                   s.head_dim % 32 == 0;
    // Queries through cu_seqlens_q (the runtime's GQA packing of a varlen
    // forward; not with a KV append or a tree mask).
    s.varlen = varlen && !shape.append_kv && !shape.tree_mask;
    if (!choose_mla_tile(dev, policy, shape, &s)) choose_decode_tile(dev, &s);
  } else {
    int g = cfg.num_heads_kv > 0 ? cfg.num_heads_q / cfg.num_heads_kv : 1;
    s.group_size = g < 1 ? 1 : g;
    s.num_warps = s.group_size < 4 ? s.group_size : 4;
    int want = static_cast<int>(ceil_div(s.group_size, s.num_warps));
    s.block_m = s.num_warps * fit_rows_per_warp(s, want > 4 ? 4 : want);
  }
  s.kv_layout = shape.kv_layout;
  // The scalar kernels look a page up per row (they are not tuned for it).
  const int tile_keys = kind == KernelKind::Decode ? 16 : s.block_n;  // a warp's tile in decode
  // The MLA decode's tiles start block_n keys apart from a split's first
  // key, which need not be on a page boundary: it looks pages up per row.
  s.page_tiles = s.kv_layout == KvLayout::Paged && s.mma &&
                 !(kind == KernelKind::Decode && s.wgmma) && shape.page_size > 0 &&
                 shape.page_size % tile_keys == 0;
  s.page_pow2 = s.kv_layout == KvLayout::Paged && !s.page_tiles && shape.page_size > 0 &&
                (shape.page_size & (shape.page_size - 1)) == 0;
  s.seqused_k = kind == KernelKind::Forward && shape.seqused_k;
  s.tree_mask = kind == KernelKind::Decode && shape.tree_mask;
  s.fixed_len = kind == KernelKind::Decode && shape.fixed_len && !shape.append_kv;
  s.pdl =
      kind == KernelKind::Decode && s.mma && !s.wgmma && !s.tcgen05 && policy.pdl && dev.sm >= 90;
  // The MLA decodes (spec.wgmma, spec.tcgen05) always leave their combine
  // to the reduce kernel.
  s.fused_combine = kind == KernelKind::Decode && s.mma && !s.wgmma && !s.tcgen05 && !s.varlen &&
                    shape.fused_combine;
  // One split writing O (the runtime's MLA forward): the sm_100a MLA kernel.
  s.direct_out = kind == KernelKind::Decode && s.tcgen05 && shape.direct_out;
  s.sinks = (kind == KernelKind::Forward || s.fused_combine || s.direct_out) && shape.sinks;
  s.alibi = kind != KernelKind::Reduce && shape.alibi;
  s.append_kv = kind == KernelKind::Decode && shape.append_kv;
  s.rotary = s.append_kv ? shape.rotary : 0;
  s.rotary_half_table = s.rotary && shape.rotary_half_table;
  // The persistent mma.sync forward holds the item's block-table row and
  // page bases across its loops (the one-CTA kernel re-derives them from
  // %ctaid and the constant bank): over a paged cache on a tile of two
  // m-tiles per warp (sm_80 d128: 255 registers one CTA per item) it
  // spilled, so that runs one CTA per item.
  if (s.persistent && !s.wgmma && s.kv_layout == KvLayout::Paged && s.m_tiles == 2)
    s.persistent = false;
  return s;
}

KernelSpec make_spec(const AttentionConfig &cfg, KernelKind kind, int sm, bool varlen) {
  DeviceLimits dev;
  if (!published_limits(sm, &dev)) {
    published_limits(80, &dev);
    dev.sm = sm;
  }
  return make_spec(cfg, kind, dev, varlen);
}

int ptx_isa_version(const KernelSpec &spec) {
  // tcgen05 (8.6 on sm_100a, 8.8 on sm_103a) and the three-input max.f32
  // (8.8).
  if (spec.tcgen05) return 88;
  if (spec.wgmma) return 80;  // wgmma, setmaxnreg, cp.async.bulk.tensor: PTX ISA 8.0, sm_90a
  // The lowest PTX ISA version whose .target accepts the SM (PTX ISA, "PTX
  // Module Directives: .target"; sm_100 8.6, sm_103 8.8, sm_110 9.0, sm_120
  // 8.7, sm_121 8.8); every instruction used is older (cvt.rn.bf16.f32:
  // 7.0 with sm_80).
  if (spec.sm <= 80) return 70;
  if (spec.sm <= 86) return 71;
  if (spec.sm <= 87) return 74;
  // The fp8 cvt (cvt.rn.f16x2.{e4m3x2,e5m2x2}): PTX ISA 8.1 on sm_89, 7.8 on
  // sm_90 (as ptxas 13 applies them).
  // The fp8 mma (mma.sync.aligned.m16n8k32 with e4m3/e5m2): PTX ISA 8.4 on
  // sm_89 and sm_90 (as ptxas 13 applies it).
  if ((spec.q_fp8 != KvFp8::None || spec.kv_fp8_mma) && spec.sm <= 90) return 84;
  if (spec.sm == 89 && spec.kv_fp8 != KvFp8::None) return 81;
  if (spec.sm <= 90) return 78;
  if (spec.sm == 100) return 86;
  if (spec.sm == 120) return 87;
  if (spec.sm == 103 || spec.sm == 121) return 88;
  return 90;
}

std::string entry_name(const KernelSpec &s) {
  char buf[128];
  if (s.kind == KernelKind::Reduce) {
    std::snprintf(buf, sizeof buf, "fa_reduce_%s_dv%d_w%d%s", dtype_name(s.dtype), s.head_dim_v,
                  s.num_warps, s.varlen ? "_varlen" : "");
  } else {
    char st[32] = "";
    if (s.mma)
      std::snprintf(st, sizeof st, "_s%d_mt%d%s_c%d", s.stages, s.m_tiles, s.q_in_regs ? "q" : "",
                    s.min_ctas);
    std::snprintf(buf, sizeof buf, "fa_%s%s_%s_d%d_dv%d_g%d_bm%d_bn%d_w%d%s%s%s", kind_name(s.kind),
                  s.tcgen05 ? (s.gather ? "_tc05_gather" : "_tc05")
                  : s.wgmma ? (s.gather ? "_wgmma_gather" : "_wgmma")
                  : s.mma   ? "_mma"
                            : "",
                  dtype_name(s.dtype), s.head_dim, s.head_dim_v, s.group_size, s.block_m, s.block_n,
                  s.num_warps, st, s.softcap ? "_softcap" : "", s.varlen ? "_varlen" : "");
    std::string kv = kv_text(s);
    for (char &c : kv) c = c == ' ' ? '_' : c;
    std::snprintf(buf + std::strlen(buf), sizeof buf - std::strlen(buf), "%s%s", kv.c_str(),
                  s.seqused_k ? "_seqused" : "");
  }
  return std::string(buf) + (s.tree_mask ? "_tree" : "") + (s.lse_in_base2 ? "_lse2in" : "") +
         (s.lse_out_base2 ? "_lse2out" : "") + (s.sinks ? "_sinks" : "") +
         (s.alibi ? "_alibi" : "") +
         (s.kv_fp8 != KvFp8::None ? std::string("_kv") + kv_fp8_name(s.kv_fp8) : "") +
         (s.append_kv ? "_append" : "") +
         (s.rotary == 1   ? "_ropeneox"
          : s.rotary == 2 ? "_ropeint"
                          : "") +
         (s.rotary_half_table ? "16" : "") +
         (s.dv_split != 1 ? "_dvs" + std::to_string(s.dv_split) : "") + (s.v_in_k ? "_vink" : "") +
         (s.q_fp8 != KvFp8::None ? std::string("_q") + kv_fp8_name(s.q_fp8) : "") +
         (s.fp8_f16 ? "_f16" : "") + (s.kv_fp8_mma ? "_f8mma" : "") +
         (s.persistent ? "_persistent" : "") + (s.dynamic ? "_dynamic" : "") +
         (s.split_kv ? "_split" : "") + (s.fixed_len ? "_fixedlen" : "") + (s.pdl ? "_pdl" : "") +
         (s.fused_combine ? "_fused" : "") + (s.direct_out ? "_out" : "") +
         (s.cta_pair ? "_pair" : "") + (s.q_stages != 1 ? "_q" + std::to_string(s.q_stages) : "");
}

std::string generate_ptx(const KernelSpec &spec) {
  if (!spec_valid(spec)) return {};
  if (spec.kind == KernelKind::Reduce) return kgen::generate_reduce(spec);
  if (spec.kind == KernelKind::Backward && spec.wgmma) return kgen::generate_backward_wgmma(spec);
  if (spec.kind == KernelKind::Backward) return kgen::generate_backward(spec);
  if (is_backward(spec.kind)) return kgen::generate_backward_rows(spec);
  if ((spec.wgmma || spec.tcgen05) && spec.kind == KernelKind::Decode)
    return kgen::generate_decode_mla(spec);
  if (spec.mma && spec.kind == KernelKind::Decode) return kgen::generate_decode_tc(spec);
  if (spec.tcgen05) return kgen::generate_forward_sm100(spec);
  if (spec.wgmma) return kgen::generate_forward_wgmma(spec);
  if (spec.mma) return kgen::generate_forward_tc(spec);
  return kgen::generate_attention(spec);
}

int64_t forward_work_items(const KernelSpec &spec, const ForwardParams &p) {
  return ceil_div(p.seqlen_q, spec.block_m) * p.num_heads_q * p.batch;
}

LaunchGeometry forward_geometry(const KernelSpec &spec, const ForwardParams &p, int64_t ctas,
                                int num_splits) {
  LaunchGeometry g;
  if (spec.persistent) {
    const int64_t items = forward_work_items(spec, p);
    g.grid[0] = grid_dim(ctas > 0 ? std::min(items, ctas) : items);
  } else {
    // (cta_pair: m-blocks rounded up to whole clusters of two)
    const int64_t mblocks = ceil_div(p.seqlen_q, spec.block_m);
    g.grid[0] = grid_dim((spec.cta_pair ? (mblocks + 1) / 2 * 2 : mblocks) * spec.dv_split *
                         (spec.split_kv ? std::max(num_splits, 1) : 1));
    g.grid[1] = grid_dim(p.num_heads_q);
    g.grid[2] = grid_dim(p.batch);
  }
  g.block[0] = static_cast<uint32_t>(32 * spec.num_warps);
  g.smem_bytes = max_dynamic_smem(spec);
  return g;
}

LaunchGeometry decode_geometry(const KernelSpec &spec, const DecodeParams &p) {
  LaunchGeometry g;
  g.grid[0] = grid_dim(int64_t(p.num_splits) * spec.dv_split);
  g.grid[1] = grid_dim(int64_t(p.num_heads_kv) *
                       ceil_div(int64_t(spec.group_size) * p.seqlen_q, spec.block_m));
  g.grid[2] = grid_dim(p.batch);
  g.block[0] = static_cast<uint32_t>(32 * spec.num_warps);
  g.smem_bytes = max_dynamic_smem(spec);
  g.programmatic = spec.pdl;
  return g;
}

LaunchGeometry backward_geometry(const KernelSpec &spec, const BackwardParams &p) {
  LaunchGeometry g;
  const ForwardParams &f = p.f;
  if (spec.kind == KernelKind::Backward) {
    // (key block, KV head, batch): a CTA loops over the group's query heads.
    // (key block x column slice, KV head, batch): a CTA loops over the
    // group's query heads.
    g.grid[0] = grid_dim(ceil_div(f.seqlen_k, spec.block_n) * spec.dv_split);
    g.grid[1] = grid_dim(f.num_heads_kv);
  } else {
    // (query block, query head, batch): a thread per query row.
    g.grid[0] = grid_dim(ceil_div(f.seqlen_q, 32 * spec.num_warps));
    g.grid[1] = grid_dim(f.num_heads_q);
  }
  g.grid[2] = grid_dim(f.batch);
  g.block[0] = static_cast<uint32_t>(32 * spec.num_warps);
  g.smem_bytes = max_dynamic_smem(spec);
  return g;
}

LaunchGeometry reduce_geometry(const KernelSpec &spec, const ReduceParams &p) {
  LaunchGeometry g;
  int64_t rows;  // batch * seqlen_q * num_heads_q, which may pass 2^63
  if (__builtin_mul_overflow(int64_t(p.batch) * p.seqlen_q, int64_t(p.num_heads_q), &rows)) {
    g.grid[0] = UINT32_MAX;
  } else {
    g.grid[0] = grid_dim(ceil_div(rows, spec.num_warps));
  }
  g.block[0] = static_cast<uint32_t>(32 * spec.num_warps);
  g.programmatic = spec.pdl;
  return g;
}

// The tensor-core forward kernel uses dynamic shared memory only
// (kgen::tc_layout); the scalar kernels static memory only (<= 48 KB, see
// kgen::attention_layout).
uint32_t max_dynamic_smem(const KernelSpec &spec) {
  if (spec.kind == KernelKind::Backward && spec.wgmma) return kgen::backward_wgmma_smem(spec);
  if (spec.kind == KernelKind::Backward) return kgen::backward_smem(spec);
  if (is_backward(spec.kind)) return 0;
  if ((spec.wgmma || spec.tcgen05) && spec.kind == KernelKind::Decode)
    return kgen::decode_mla_smem(spec);
  if (spec.tcgen05) return kgen::sm100_smem(spec);
  if (spec.wgmma) return kgen::wgmma_smem(spec);
  if (spec.kind == KernelKind::Forward && spec.mma) return kgen::tc_layout(spec).total;
  if (spec.kind == KernelKind::Decode && spec.mma) return kgen::decode_tc_smem(spec);
  return 0;
}

}  // namespace fa

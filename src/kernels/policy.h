// Which kernel family runs where, as a value (issue 26): the tensor-core
// kernels unless told otherwise. make_spec takes it, so a spec depends only
// on its arguments; the environment is read in one place, from_env(): once
// per runtime (fa_runtime_create), once per fa_generate / fa_cache_warm call.
#pragma once

namespace fa {

struct KernelPolicy {
  // The scalar (CUDA-core, fp32) forward / decode kernels instead of the
  // tensor-core ones (debugging and comparison; FLASHATTN_SCALAR_FORWARD=1,
  // FLASHATTN_SCALAR_DECODE=1).
  bool scalar_forward = false;
  bool scalar_decode = false;
  // sm_90 runs the sm_90a forward (wgmma, TMA; FlashAttention-3's
  // structure); false keeps the mma.sync one there
  // (FLASHATTN_FORCE_SM80_FORWARD=1 or FLASHATTN_SM90_WGMMA=0).
  bool sm90_wgmma = true;
  // The sm_90a fp8 forward converts Q, K, V to f16 and runs the 16-bit
  // wgmma instead of the fp8 one (comparison; FLASHATTN_SM90_FP8_F16=1).
  bool sm90_fp8_f16 = false;
  // The sm_90a forward (TMA and gather variants) runs persistent
  // (KernelSpec::persistent; FLASHATTN_SM90_PERSISTENT=1). Off by default: it is proven on the
  // emulator only, never timed on a GPU.
  bool sm90_persistent = false;
  // The mma.sync forward (sm_80 and up, where the sm_90a one does not run)
  // runs persistent (KernelSpec::persistent: a grid of SMs x min_ctas CTAs
  // looping over work items; FLASHATTN_SM80_PERSISTENT=1), except with O in
  // column slices (dv_split > 1) or split keys. Off by default: proven on the
  // emulator only, never timed on a GPU, and persistence has been reported
  // to cost 14-33% on cp.async / mma.sync kernels (issue 27).
  bool sm80_persistent = false;
  // The sm_90a forward splits its keys (KernelSpec::split_kv, then the
  // reduce kernel) when its CTAs would leave SMs idle and the caller's
  // workspace holds the partial states (fa_forward_workspace_size); false
  // never splits (FLASHATTN_FORWARD_SPLITS=0).
  bool forward_splits = true;
  // A fixed-length fa_launch with few queries per sequence (seqlen_q x the
  // GQA group <= 16) runs the decode kernel, which packs a
  // KV head's query rows into one CTA (Runtime::forward_as_decode), when the
  // caller's workspace holds its partial states; false never
  // (FLASHATTN_FORWARD_GQA_PACK=0).
  bool forward_gqa_pack = true;
  // sm_90 and up: the tensor-core decode and the combine after it (and after
  // a split forward) are launched as programmatic dependents
  // (KernelSpec::pdl, LaunchGeometry::programmatic): each waits
  // (griddepcontrol.wait) before touching global memory, so its launch and
  // prologue overlap the previous kernel's tail; the decode kernel lets its
  // combine launch once its K/V loop is done (griddepcontrol.launch_dependents).
  // Off by default: proven on the emulator only, never timed on a GPU
  // (FLASHATTN_PDL=1).
  bool pdl = false;
  // sm_90: an MLA decode (V in K, head_dim a multiple of 64, head_dim_v
  // 256 < dv <= 512 in 128-column halves; 16-bit Q, a 16-bit or fp8 cache,
  // none of softcap, ALiBi, tree mask, KV append or cu_seqlens_q) runs the sm_90a MLA kernel
  // (kgen::generate_decode_mla: wgmma, the two consumer warpgroups sharing
  // every K tile) instead of the mma.sync decode's two O slices. Off by
  // default: proven on the emulator only, never timed on a GPU
  // (FLASHATTN_SM90_MLA=1).
  bool sm90_mla = false;
  // sm_100 / sm_103: the same MLA decodes run the sm_100a MLA kernel
  // (kgen::generate_decode_mla with spec.tcgen05: tcgen05.mma, S and O in
  // tensor memory, 64 rows as M = 64 with O's two column halves in each
  // warp's two 16-lane halves) instead of the mma.sync decode, whose MODEL
  // on a B200 is bound by the tensor pipe (docs/kernels.md, "MLA decode on
  // sm_100a"). On by default (issue 29: chosen automatically there); proven
  // on the emulator, not yet run on a Blackwell GPU: FLASHATTN_SM100_MLA=0
  // keeps the mma.sync decode.
  bool sm100_mla = true;
  // sm_90 / sm_90a: the training backward's main kernel in FlashAttention-3's
  // structure on wgmma and TMA (backward_wgmma.cc) where it applies; false
  // keeps the mma.sync one (env FLASHATTN_SM90_BACKWARD=0).
  bool sm90_backward = true;
  // fa_decode with split_counters (the caller's opt-in) and more than one
  // split fuses the combine into the decode kernel's last CTA of each row
  // (KernelSpec::fused_combine: no second launch); false runs the two
  // launches anyway, the counters untouched (comparison;
  // FLASHATTN_DECODE_FUSED=0).
  bool decode_fused = true;
  // The tensor-core decode over an fp8 KV cache on SMs with a native fp8
  // mma.sync (sm_89, sm_120/121) runs mode (b) (KernelSpec::kv_fp8_mma): Q
  // quantised per (token, head) to e4m3 in the kernel, both products on the
  // fp8 mma (m16n8k32), P in e4m3. Off by default: mode (a) (the cache bytes
  // converted to f16 in registers, the mma in f16) is exact where mode (b)
  // rounds Q and P to e4m3, and the decode is bound by HBM, not the mma
  // (docs/kernels.md, "fp8 KV cache") (FLASHATTN_DECODE_FP8_MMA=1).
  bool decode_fp8_mma = false;
  // sm_100 / sm_103 run the sm_100a forward (kgen::generate_forward_sm100:
  // FlashAttention-4's structure on tcgen05.mma and tensor memory) where it
  // covers the call (16-bit or fp8, head dims up to 256); else the mma.sync
  // forward. On by default (issue 29: chosen automatically there); proven
  // on the emulator, not yet run on a Blackwell GPU: FLASHATTN_SM100_FORWARD=0
  // keeps the mma.sync forward.
  bool sm100_forward = true;
  // ... and, there, a non-causal forward without a window at head_dim_v 128
  // and head_dim 128..256 over TMA-addressable tensors runs on CTA pairs
  // (KernelSpec::cta_pair: tcgen05.mma.cta_group::2, M = 256 across a
  // cluster of two, each CTA reading half of every K and V tile;
  // FlashAttention-4's 2-CTA MMA). Proven on the emulator only:
  // FLASHATTN_SM100_CTA_PAIR=0 keeps one CTA.
  bool sm100_cta_pair = true;
  // Tests: the persistent grid's CTAs at most (0: the device's SM count),
  // so that each CTA runs several work items. No variable sets it.
  int persistent_grid = 0;

  // The defaults above with the environment's overrides: each variable
  // counts when its first character is '1' (FLASHATTN_SM90_WGMMA and
  // FLASHATTN_FORWARD_SPLITS, FLASHATTN_FORWARD_GQA_PACK,
  // FLASHATTN_DECODE_FUSED, FLASHATTN_SM100_FORWARD and FLASHATTN_SM100_MLA:
  // '1' on, anything else off;
  // FLASHATTN_FORCE_SM80_FORWARD wins over FLASHATTN_SM90_WGMMA).
  static KernelPolicy from_env();
};

}  // namespace fa

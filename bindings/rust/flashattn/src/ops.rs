//! Forward, decode and reduce: unsafe variants on raw device pointers (u64)
//! for callers with their own allocator, and safe variants on DeviceBuffer
//! views whose extents are checked against the buffers before any launch.
use std::ffi::c_void;

use flashattn_sys as sys;

use crate::config::Config;
use crate::error::{check, to_i32, Error, Result};
use crate::runtime::{DeviceBuffer, Runtime};

// ---------------------------------------------------------------------------
// Raw arguments (device pointers as u64, strides in elements)

/// A 4-D tensor on raw device memory: data pointer and strides in elements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawTensor {
    pub data: u64,
    pub strides: [i64; 4],
}

impl RawTensor {
    fn to_sys(self) -> sys::fa_tensor {
        sys::fa_tensor { data: self.data, stride: self.strides }
    }
}

/// How a KV cache is laid out (fa_kv_layout, since 0.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvLayout {
    /// k/v [batch, seqlen_k, num_heads_kv, head_dim].
    #[default]
    Contiguous,
    /// k/v pages [num_pages, page_size, num_heads_kv, head_dim] and a block table.
    Paged,
    /// Per-sequence k/v at addresses from k_ptrs / v_ptrs (k/v data must be 0).
    PtrArray,
}

impl KvLayout {
    fn to_raw(self) -> i32 {
        match self {
            KvLayout::Contiguous => sys::FA_KV_CONTIGUOUS,
            KvLayout::Paged => sys::FA_KV_PAGED,
            KvLayout::PtrArray => sys::FA_KV_PTR_ARRAY,
        }
    }
}

/// fa_kv_cache_layout on raw device pointers. Fields as in flashattn.h; the
/// default is a contiguous cache. block_table, k_ptrs and v_ptrs are device
/// data the caller vouches for: every page a valid key uses in
/// [0, num_pages), every pointer 16-byte aligned and covering its sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawKvLayout {
    pub layout: KvLayout,
    /// Paged: tokens per page, >= 1.
    pub page_size: i32,
    /// Paged: pages in k and v, >= 1.
    pub num_pages: i32,
    /// Paged: used columns of block_table, >= ceil(seqlen_k / page_size).
    pub max_pages_per_seq: i32,
    /// Paged: int32 [batch, max_pages_per_seq], 4-byte aligned.
    pub block_table: u64,
    /// Paged: elements between block_table rows, >= max_pages_per_seq.
    pub block_table_stride: i64,
    /// PtrArray: uint64 [batch] each, 8-byte aligned.
    pub k_ptrs: u64,
    pub v_ptrs: u64,
}

impl RawKvLayout {
    fn to_sys(self) -> sys::fa_kv_cache_layout {
        sys::fa_kv_cache_layout {
            layout: self.layout.to_raw(),
            page_size: self.page_size,
            num_pages: self.num_pages,
            max_pages_per_seq: self.max_pages_per_seq,
            block_table: self.block_table,
            block_table_stride: self.block_table_stride,
            k_ptrs: self.k_ptrs,
            v_ptrs: self.v_ptrs,
        }
    }
}

/// fa_forward_args without struct_size. Fields as in flashattn.h.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawForwardArgs {
    pub batch: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub q: RawTensor,
    pub k: RawTensor,
    pub v: RawTensor,
    pub o: RawTensor,
    /// fp32 [batch, num_heads_q, seqlen_q]; 0 = not written.
    pub lse: u64,
    /// int32 [batch + 1] prefix sums, or 0. Device data, not read by these
    /// bindings: the caller guarantees cu_seqlens[0] == 0, non-decreasing
    /// values and a last value within the packed tensors. The kernel clamps
    /// each length to [0, seqlen_q/k], so a wrong maximum truncates a
    /// sequence, but offsets past the tensors are out-of-bounds accesses.
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    /// How k and v are addressed (paged / pointer array: chunked prefill
    /// over a KV cache, with seqused_k rather than cu_seqlens_k).
    pub kv: RawKvLayout,
    /// int32 [batch] or 0: sequence b has keys 0..seqused_k[b]-1 (clamped to
    /// [0, seqlen_k]); 0 = seqlen_k keys each. Not with cu_seqlens_k.
    pub seqused_k: u64,
    /// Since 0.4.1: attention sinks (gpt-oss), fp32 [num_heads_q], or 0 =
    /// none (see `Runtime::forward_kv_sinks`).
    pub sinks: u64,
    /// Since 0.5: ALiBi slopes, fp32, the slope of (b, h) at
    /// alibi_slopes[b * alibi_slopes_stride + h], or 0 = none (see `Alibi`).
    pub alibi_slopes: u64,
    /// Elements between sequences' slopes (>= num_heads_q), or 0 = one row.
    pub alibi_slopes_stride: i64,
    /// Since 0.5 (used since 0.6, by the fp8 forward): fp8 K/V descales, fp32
    /// (0 = 1.0); (b, h_kv) at b * descale_strides[0] + h_kv *
    /// descale_strides[1] elements.
    pub k_descale: u64,
    pub v_descale: u64,
    pub descale_strides: [i64; 2],
    /// Since 0.6: the fp8 Q's descale, as k_descale (a query head uses its
    /// KV head's), or 0 = 1.0.
    pub q_descale: u64,
    /// Since 0.8: the persistent sm_90a forward's work counter, or 0 = none:
    /// device memory of at least `Runtime::forward_workspace_size` bytes (8:
    /// two u32), 8-byte aligned, zeroed by the caller once before its first
    /// use; every launch that uses it leaves it zero again, so it serves
    /// back-to-back launches with no memset. Not to be shared by launches
    /// that may run at the same time (one per stream). With it the
    /// persistent kernel (FLASHATTN_SM90_PERSISTENT=1 when the runtime was
    /// created) hands out work items dynamically; a fixed-length launch
    /// whose CTAs would leave SMs idle splits its keys into partial states
    /// held from byte 256 (256-byte aligned and as large as
    /// `forward_workspace_size` says, else it runs unsplit); every other
    /// kernel ignores it. A workspace that was not zero gives wrong output.
    pub workspace: u64,
    /// Bytes at workspace: >= 8 with one, 0 without.
    pub workspace_size: usize,
}

impl RawForwardArgs {
    fn to_sys(&self) -> sys::fa_forward_args {
        sys::fa_forward_args {
            batch: self.batch,
            seqlen_q: self.seqlen_q,
            seqlen_k: self.seqlen_k,
            q: self.q.to_sys(),
            k: self.k.to_sys(),
            v: self.v.to_sys(),
            o: self.o.to_sys(),
            lse: self.lse,
            cu_seqlens_q: self.cu_seqlens_q,
            cu_seqlens_k: self.cu_seqlens_k,
            kv: self.kv.to_sys(),
            seqused_k: self.seqused_k,
            sinks: self.sinks,
            alibi_slopes: self.alibi_slopes,
            alibi_slopes_stride: self.alibi_slopes_stride,
            k_descale: self.k_descale,
            v_descale: self.v_descale,
            descale_stride: self.descale_strides,
            q_descale: self.q_descale,
            workspace: self.workspace,
            workspace_size: self.workspace_size,
            ..Default::default()
        }
    }
}

/// fa_backward_args without struct_size (since 0.9). Fields as in flashattn.h.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawBackwardArgs {
    /// The forward's arguments as given to `forward_raw`, with `o` its output
    /// and `lse` its LSE (both required); contiguous K/V; no seqused_k; its
    /// workspace is ignored.
    pub fwd: RawForwardArgs,
    /// dO, like fwd.o.
    pub dout: RawTensor,
    /// Written: like fwd.q, fwd.k (summed over each KV head's query heads)
    /// and fwd.v.
    pub dq: RawTensor,
    pub dk: RawTensor,
    pub dv: RawTensor,
    /// fp32 [num_heads_q], written, with fwd.sinks (required then); else 0.
    pub dsinks: u64,
    /// `Runtime::backward_workspace_size` bytes, 256-byte aligned; contents
    /// on entry do not matter; not shared by launches that may run at the
    /// same time.
    pub workspace: u64,
    pub workspace_size: usize,
    /// The same bits on every run (dQ summed over key blocks in a fixed
    /// order) rather than atomic accumulation.
    pub deterministic: bool,
}

impl RawBackwardArgs {
    fn to_sys(&self) -> sys::fa_backward_args {
        sys::fa_backward_args {
            fwd: self.fwd.to_sys(),
            dout: self.dout.to_sys(),
            dq: self.dq.to_sys(),
            dk: self.dk.to_sys(),
            dv: self.dv.to_sys(),
            dsinks: self.dsinks,
            workspace: self.workspace,
            workspace_size: self.workspace_size,
            deterministic: self.deterministic as i32,
            ..Default::default()
        }
    }
}

/// fa_decode_args without struct_size. Fields as in flashattn.h.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawDecodeArgs {
    pub batch: i32,
    pub seqlen_q: i32,
    pub seqlen_k_max: i32,
    pub q: RawTensor,
    pub k_cache: RawTensor,
    pub v_cache: RawTensor,
    /// int32 [batch].
    pub cache_seqlens: u64,
    /// 0 = automatic.
    pub num_splits: i32,
    pub workspace: u64,
    pub workspace_size: usize,
    /// data 0 = leave the partial states in the workspace.
    pub o: RawTensor,
    pub lse: u64,
    /// How k_cache and v_cache are addressed.
    pub kv: RawKvLayout,
    /// Splits of FA_DECODE_INVARIANT_SPLIT keys: a sequence's output bits do
    /// not depend on the rest of the batch (num_splits must be 0).
    pub batch_invariant: bool,
    /// Since 0.4: packed tree mask (see `TreeMask`), or 0 = none.
    pub tree_mask: u64,
    /// Bytes between sequences (0 = one mask for the batch) and query rows.
    pub tree_mask_strides: [i64; 2],
    /// Since 0.4.1: attention sinks fp32 [num_heads_q], or 0 = none; they
    /// join each row's denominator in the combine (o must be set).
    pub sinks: u64,
    /// Since 0.5: ALiBi slopes as in `RawForwardArgs`, or 0 = none.
    pub alibi_slopes: u64,
    pub alibi_slopes_stride: i64,
    /// Since 0.5: fp8 KV cache descales, fp32 (0 = 1.0); (b, h_kv) at
    /// b * descale_strides[0] + h_kv * descale_strides[1] elements.
    pub k_descale: u64,
    pub v_descale: u64,
    pub descale_strides: [i64; 2],
    /// Since 0.5: KV append (see `KvAppend`): new keys [batch, seqlen_new,
    /// num_heads_kv, head_dim] written into the cache at cache_seqlens[b]
    /// (then the length BEFORE the append), or data 0 = no append (every
    /// field below 0).
    pub k_new: RawTensor,
    /// [batch, seqlen_new, num_heads_kv, head_dim_v].
    pub v_new: RawTensor,
    pub seqlen_new: i32,
    /// 0 = no rotary; else a multiple of 16, <= head_dim.
    pub rotary_dim: i32,
    /// [seqlen_ro, rotary_dim / 2] contiguous, fp32 or the cfg dtype.
    pub rotary_cos: u64,
    pub rotary_sin: u64,
    pub seqlen_ro: i32,
    /// GPT-J pairs (2i, 2i+1); false = GPT-NeoX pairs (i, i + rotary_dim / 2).
    pub rotary_interleaved: bool,
    /// fa_dtype of the tables (sys::FA_DTYPE_FP32 or the cfg dtype; 0 = FP32).
    pub rotary_dtype: i32,
    /// int32 [batch, max(seqlen_q, seqlen_new)] explicit positions, or 0.
    pub rotary_positions: u64,
    /// Elements between sequences of rotary_positions (>= 0).
    pub rotary_positions_stride: i64,
    /// Since 0.8: int32 counters the caller zeroed once (every decode leaves
    /// them zero), at least `sys::fa_decode_split_counters(batch,
    /// num_heads_q, num_heads_kv, seqlen_q)` of them, 4-byte aligned: the
    /// combine fused into the decode kernel (one launch); 0 = two launches.
    pub split_counters: u64,
    /// Bytes at split_counters (0 when it is 0).
    pub split_counters_size: usize,
}

/// The descales of an fp8 KV cache (since 0.5): fp32 buffers, K's value is
/// fp8(byte) * k[b * strides[0] + h_kv * strides[1]] (V's likewise); None =
/// 1.0; strides [0, 0] = one value per tensor. The fp8 forward's Q descale
/// (since 0.6, `Runtime::forward_fp8`) uses the same strides.
#[derive(Debug, Clone, Copy)]
pub struct Descales<'a> {
    pub k: Option<&'a DeviceBuffer>,
    pub v: Option<&'a DeviceBuffer>,
    pub strides: [i64; 2],
}

impl Descales<'_> {
    /// (k_descale, v_descale, q_descale) device addresses (0 = none), each
    /// buffer checked to hold [batch, num_heads_kv] with `strides`.
    fn checked(
        &self,
        rt: &Runtime,
        cfg: &Config,
        batch: usize,
        q: Option<&DeviceBuffer>,
    ) -> Result<[u64; 3]> {
        let dims = [batch, cfg.num_heads_kv()];
        let mut ptrs = [0u64; 3];
        for (i, (name, buf)) in
            [("k_descale", self.k), ("v_descale", self.v), ("q_descale", q)].into_iter().enumerate()
        {
            if let Some(buf) = buf {
                ptrs[i] = checked_ptr(rt, name, buf, 0, &self.strides, &dims, 4)?;
            }
        }
        Ok(ptrs)
    }
}

impl RawDecodeArgs {
    fn to_sys(self) -> sys::fa_decode_args {
        sys::fa_decode_args {
            batch: self.batch,
            seqlen_q: self.seqlen_q,
            seqlen_k_max: self.seqlen_k_max,
            q: self.q.to_sys(),
            k_cache: self.k_cache.to_sys(),
            v_cache: self.v_cache.to_sys(),
            cache_seqlens: self.cache_seqlens,
            num_splits: self.num_splits,
            workspace: self.workspace,
            workspace_size: self.workspace_size,
            o: self.o.to_sys(),
            lse: self.lse,
            kv: self.kv.to_sys(),
            batch_invariant: self.batch_invariant as i32,
            tree_mask: self.tree_mask,
            tree_mask_stride: self.tree_mask_strides,
            sinks: self.sinks,
            alibi_slopes: self.alibi_slopes,
            alibi_slopes_stride: self.alibi_slopes_stride,
            k_descale: self.k_descale,
            v_descale: self.v_descale,
            descale_stride: self.descale_strides,
            k_new: self.k_new.to_sys(),
            v_new: self.v_new.to_sys(),
            seqlen_new: self.seqlen_new,
            rotary_dim: self.rotary_dim,
            rotary_cos: self.rotary_cos,
            rotary_sin: self.rotary_sin,
            seqlen_ro: self.seqlen_ro,
            rotary_interleaved: self.rotary_interleaved as i32,
            rotary_dtype: self.rotary_dtype,
            rotary_reserved: 0,
            rotary_positions: self.rotary_positions,
            rotary_positions_stride: self.rotary_positions_stride,
            split_counters: self.split_counters,
            split_counters_size: self.split_counters_size,
            ..Default::default()
        }
    }
}

/// Rotary embedding (RoPE) of a KV append (fa_decode_args.rotary_*, since
/// 0.5): Q and the new keys are rotated before attention; the cache receives
/// the rotated keys. Pair (x0, x1) = columns (i, i + rotary_dim / 2)
/// (GPT-NeoX) or (2i, 2i + 1) (GPT-J, `interleaved`) at position p becomes
/// (x0 cos - x1 sin, x0 sin + x1 cos) in fp32 with cos/sin = table[p][i],
/// rounded to the cache dtype (exact rule in flashattn.h); columns >=
/// rotary_dim are copied. New token t of sequence b is at position
/// cache_seqlens[b] + t, query t likewise when the config is causal or
/// windowed (else at cache_seqlens[b]), unless `positions` says otherwise.
#[derive(Debug, Clone, Copy)]
pub struct Rotary<'a> {
    /// fp32 [seqlen_ro, rotary_dim / 2], contiguous.
    pub cos: &'a DeviceBuffer,
    /// fp32 [seqlen_ro, rotary_dim / 2], contiguous.
    pub sin: &'a DeviceBuffer,
    /// Rotated columns: a multiple of 16, <= head_dim.
    pub rotary_dim: usize,
    /// Rows of the tables (>= 1; a later position reads the last row).
    pub seqlen_ro: usize,
    /// true = GPT-J pairs (2i, 2i + 1), false = GPT-NeoX (i, i + rotary_dim / 2).
    pub interleaved: bool,
    /// int32 positions and the elements between sequences (>= 0; 0 = one
    /// row for the batch): token / query t of sequence b is at
    /// positions[b * stride + t], t < max(seqlen_q, seqlen_new) (speculative
    /// trees: each token's depth). None = the default positions above.
    pub positions: Option<(&'a DeviceBuffer, usize)>,
}

/// A KV append of `Runtime::decode_append` (fa_decode_args.k_new, since 0.5;
/// as FlashAttention's flash_attn_with_kvcache): the seqlen_new new keys
/// and values of sequence b are written into the cache at positions
/// cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 (any cache
/// layout) and attended to in the same launch. cache_seqlens are then the
/// lengths BEFORE the append (the kernel clamps them to [0, seqlen_k_max -
/// seqlen_new]) and are not updated.
#[derive(Debug, Clone, Copy)]
pub struct KvAppend<'a> {
    /// New tokens per sequence, 1..=seqlen_k_max.
    pub seqlen_new: usize,
    /// [batch, seqlen_new, num_heads_kv, head_dim], cfg dtype.
    pub k_new: Tensor<'a>,
    /// [batch, seqlen_new, num_heads_kv, head_dim_v], cfg dtype.
    pub v_new: Tensor<'a>,
    /// Rotate Q and k_new first (None = append as given).
    pub rotary: Option<Rotary<'a>>,
}

/// ALiBi slopes (fa_forward_args / fa_decode_args.alibi_slopes, since 0.5;
/// Press et al. 2022, FlashAttention-2's alibi_slopes): fp32 [num_heads_q]
/// for the whole batch, or with `per_sequence` [batch, num_heads_q]
/// (contiguous). The logit of query i, key j loses
/// slope[b, h] * |i + seqlen_k - seqlen_q - j|.
#[derive(Debug, Clone, Copy)]
pub struct Alibi<'a> {
    pub slopes: &'a DeviceBuffer,
    pub per_sequence: bool,
}

impl Alibi<'_> {
    /// (device address, alibi_slopes_stride) after checking the extent.
    fn checked(&self, rt: &Runtime, batch: usize, hq: usize) -> Result<(u64, i64)> {
        if self.per_sequence {
            let p =
                checked_ptr(rt, "alibi_slopes", self.slopes, 0, &[hq as i64, 1], &[batch, hq], 4)?;
            Ok((p, hq as i64))
        } else {
            Ok((checked_ptr(rt, "alibi_slopes", self.slopes, 0, &[1], &[hq], 4)?, 0))
        }
    }
}

/// A speculative-decoding tree mask (fa_decode_args.tree_mask, since 0.4):
/// 32-bit words [trees, seqlen_q, words] on the device, trees = batch or 1
/// (one tree for the batch), words >= ceil(seqlen_q / 32), last dim
/// contiguous: query i of sequence b sees new token j (key cache_seqlens[b]
/// - seqlen_q + j) iff bit j % 32 of word j / 32 of row (b, i) is set
/// (`pack_tree_mask` makes them from bools). The cached prefix stays
/// visible; the config's causal and window apply on top.
#[derive(Debug, Clone, Copy)]
pub struct TreeMask<'a> {
    /// u32 words, strides in words (strides[2] must be 1).
    pub words: View<'a, 3>,
    /// batch, or 1 for one tree shared by the batch.
    pub trees: usize,
    /// Words per row as laid out (>= ceil(seqlen_q / 32)).
    pub row_words: usize,
}

/// Packs bool masks [trees][seqlen_q][seqlen_q] (true = query i sees new
/// token j) into rows of ceil(seqlen_q / 32) little-endian u32 words, the
/// layout `TreeMask` reads (the bytes of numpy.packbits(bitorder="little"),
/// rows padded to whole words).
pub fn pack_tree_mask(bits: &[bool], seqlen_q: usize) -> Vec<u32> {
    let words = seqlen_q.div_ceil(32);
    let rows = if seqlen_q == 0 { 0 } else { bits.len() / seqlen_q };
    let mut out = vec![0u32; rows * words];
    for r in 0..rows {
        for j in 0..seqlen_q {
            if bits[r * seqlen_q + j] {
                out[r * words + j / 32] |= 1 << (j % 32);
            }
        }
    }
    out
}

/// The logarithm base of an LSE (fa_lse_format, since 0.4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LseFormat {
    /// ln of the softmax denominator (flashattn, FlashAttention).
    #[default]
    Natural,
    /// log2 of it, lse2 = lse * log2(e) (FlashInfer's attention states).
    Base2,
}

impl LseFormat {
    /// The fa_lse_format value.
    pub fn to_sys(self) -> i32 {
        match self {
            LseFormat::Natural => sys::FA_LSE_NATURAL,
            LseFormat::Base2 => sys::FA_LSE_BASE2,
        }
    }
}

/// fa_reduce_args without struct_size. Fields as in flashattn.h.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawReduceArgs {
    pub num_splits: i32,
    pub batch: i32,
    pub seqlen_q: i32,
    /// fp32 [num_splits, batch, seqlen_q, num_heads_q, head_dim_v].
    pub o_partial: u64,
    pub o_partial_strides: [i64; 5],
    /// fp32 [num_splits, batch, num_heads_q, seqlen_q].
    pub lse_partial: u64,
    pub lse_partial_strides: [i64; 4],
    pub o: RawTensor,
    pub lse: u64,
    /// Since 0.4: the base of the LSE values in lse_partial ...
    pub lse_partial_format: LseFormat,
    /// ... and of those written to lse.
    pub lse_format: LseFormat,
    /// Since 0.4.1: attention sinks fp32 [num_heads_q] (natural logs), one
    /// more state per row with O = 0, or 0 = none.
    pub sinks: u64,
}

/// Workspace bytes and split count of a decode (fa_decode_workspace_size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    pub workspace_bytes: usize,
    pub num_splits: i32,
}

// ---------------------------------------------------------------------------
// Views on DeviceBuffers

/// Row-major (C-order) strides in elements for `shape`.
pub fn contiguous_strides<const N: usize>(shape: [usize; N]) -> [i64; N] {
    let mut s = [0i64; N];
    let mut acc = 1i64;
    for i in (0..N).rev() {
        s[i] = acc;
        acc = acc.saturating_mul(shape[i] as i64);
    }
    s
}

/// A read-only N-D view of a DeviceBuffer: start offset in bytes and strides
/// in elements. `Tensor` is the 4-D one.
#[derive(Debug, Clone, Copy)]
pub struct View<'a, const N: usize> {
    pub buf: &'a DeviceBuffer,
    pub byte_offset: usize,
    pub strides: [i64; N],
}

/// A writable N-D view of a DeviceBuffer.
#[derive(Debug)]
pub struct ViewMut<'a, const N: usize> {
    pub buf: &'a mut DeviceBuffer,
    pub byte_offset: usize,
    pub strides: [i64; N],
}

pub type Tensor<'a> = View<'a, 4>;
pub type TensorMut<'a> = ViewMut<'a, 4>;

impl<'a, const N: usize> View<'a, N> {
    /// The view at the start of `buf` with `strides`.
    pub fn new(buf: &'a DeviceBuffer, strides: [i64; N]) -> Self {
        View { buf, byte_offset: 0, strides }
    }
    /// A C-order view of `shape` at the start of `buf`.
    pub fn contiguous(buf: &'a DeviceBuffer, shape: [usize; N]) -> Self {
        View::new(buf, contiguous_strides(shape))
    }
    /// The same view starting `byte_offset` bytes into the buffer.
    pub fn at_byte_offset(mut self, byte_offset: usize) -> Self {
        self.byte_offset = byte_offset;
        self
    }
}

impl<'a, const N: usize> ViewMut<'a, N> {
    pub fn new(buf: &'a mut DeviceBuffer, strides: [i64; N]) -> Self {
        ViewMut { buf, byte_offset: 0, strides }
    }
    pub fn contiguous(buf: &'a mut DeviceBuffer, shape: [usize; N]) -> Self {
        ViewMut::new(buf, contiguous_strides(shape))
    }
    pub fn at_byte_offset(mut self, byte_offset: usize) -> Self {
        self.byte_offset = byte_offset;
        self
    }
}

/// Checks that `buf` belongs to `rt` and holds every element a view of
/// `dims` with `strides` (elements of `elem` bytes) at `byte_offset` can
/// touch; returns the view's device address. Negative strides are left to
/// the library, which rejects them before touching memory.
fn checked_ptr(
    rt: &Runtime,
    name: &str,
    buf: &DeviceBuffer,
    byte_offset: usize,
    strides: &[i64],
    dims: &[usize],
    elem: usize,
) -> Result<u64> {
    if buf.runtime_id() != rt.id() {
        return Err(Error::invalid(format!("flashattn-rs: {name} is memory of another runtime")));
    }
    let overflow = || Error::invalid(format!("flashattn-rs: {name} extent overflows"));
    if strides.iter().all(|&s| s >= 0) && dims.iter().all(|&d| d > 0) {
        let mut last = 0usize; // index of the farthest element
        for (&d, &s) in dims.iter().zip(strides) {
            let step = (d - 1).checked_mul(s as usize).ok_or_else(overflow)?;
            last = last.checked_add(step).ok_or_else(overflow)?;
        }
        let need = last
            .checked_add(1)
            .and_then(|n| n.checked_mul(elem))
            .and_then(|n| n.checked_add(byte_offset))
            .ok_or_else(overflow)?;
        if need > buf.len() {
            return Err(Error::invalid(format!(
                "flashattn-rs: {name} of shape {dims:?} with strides {strides:?} at byte offset \
                 {byte_offset} needs {need} bytes, the buffer has {}",
                buf.len()
            )));
        }
    } else if byte_offset > buf.len() {
        return Err(Error::invalid(format!("flashattn-rs: {name} byte offset is past the buffer")));
    }
    Ok(buf.as_ptr() + byte_offset as u64)
}

fn tensor(
    rt: &Runtime,
    name: &str,
    v: &Tensor<'_>,
    dims: [usize; 4],
    elem: usize,
) -> Result<RawTensor> {
    let data = checked_ptr(rt, name, v.buf, v.byte_offset, &v.strides, &dims, elem)?;
    Ok(RawTensor { data, strides: v.strides })
}

fn tensor_mut(
    rt: &Runtime,
    name: &str,
    v: &TensorMut<'_>,
    dims: [usize; 4],
    elem: usize,
) -> Result<RawTensor> {
    let data = checked_ptr(rt, name, v.buf, v.byte_offset, &v.strides, &dims, elem)?;
    Ok(RawTensor { data, strides: v.strides })
}

/// An optional contiguous fp32 buffer of `count` elements (LSE).
fn fp32_out(
    rt: &Runtime,
    name: &str,
    buf: &Option<&mut DeviceBuffer>,
    count: usize,
) -> Result<u64> {
    match buf {
        None => Ok(0),
        Some(b) => checked_ptr(rt, name, b, 0, &[1], &[count], 4),
    }
}

/// Arguments of `Runtime::forward` (fixed-length batches; packed varlen
/// batches go through `forward_raw`).
#[derive(Debug)]
pub struct ForwardArgs<'a> {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    /// [batch, seqlen_q, num_heads_q, head_dim]
    pub q: Tensor<'a>,
    /// [batch, seqlen_k, num_heads_kv, head_dim]
    pub k: Tensor<'a>,
    /// [batch, seqlen_k, num_heads_kv, head_dim_v]
    pub v: Tensor<'a>,
    /// [batch, seqlen_q, num_heads_q, head_dim_v], written
    pub o: TensorMut<'a>,
    /// fp32 [batch, num_heads_q, seqlen_q], written if given
    pub lse: Option<&'a mut DeviceBuffer>,
    /// Since 0.8: the persistent forward's work counter (see
    /// `RawForwardArgs::workspace`): at least 8 bytes, zeroed once before its
    /// first use (`fill_bytes(0)`) and then reused as the kernel leaves it;
    /// None = the persistent kernel's static order. A runtime created
    /// with FLASHATTN_SM90_PERSISTENT=1 on sm_90 uses it, and the split-KV
    /// forward when it is as large as `Runtime::forward_workspace_size`
    /// says (the partial states), else that launch runs unsplit.
    pub workspace: Option<&'a mut DeviceBuffer>,
}

/// Arguments of `Runtime::backward` (since 0.9; fixed-length batches, packed
/// varlen batches go through `backward_raw`): the forward's q, k, v, its
/// output o and LSE, and the upstream gradient dout.
#[derive(Debug)]
pub struct BackwardArgs<'a> {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    /// [batch, seqlen_q, num_heads_q, head_dim]
    pub q: Tensor<'a>,
    /// [batch, seqlen_k, num_heads_kv, head_dim]
    pub k: Tensor<'a>,
    /// [batch, seqlen_k, num_heads_kv, head_dim_v]
    pub v: Tensor<'a>,
    /// The forward's O: [batch, seqlen_q, num_heads_q, head_dim_v]
    pub o: Tensor<'a>,
    /// The forward's LSE: fp32 [batch, num_heads_q, seqlen_q]
    pub lse: &'a DeviceBuffer,
    /// dO: [batch, seqlen_q, num_heads_q, head_dim_v]
    pub dout: Tensor<'a>,
    /// Written: dQ like q, dK like k, dV like v.
    pub dq: TensorMut<'a>,
    pub dk: TensorMut<'a>,
    pub dv: TensorMut<'a>,
    /// The same bits on every run (a fixed summation order for dQ).
    pub deterministic: bool,
    /// At least `Runtime::backward_workspace_size` bytes (a DeviceBuffer is
    /// 256-byte aligned); None = a temporary one is allocated (and the call
    /// waits for the kernels before freeing it).
    pub workspace: Option<&'a mut DeviceBuffer>,
}

/// Arguments of `Runtime::decode`.
#[derive(Debug)]
pub struct DecodeArgs<'a> {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k_max: usize,
    /// [batch, seqlen_q, num_heads_q, head_dim]
    pub q: Tensor<'a>,
    /// [batch, seqlen_k_max, num_heads_kv, head_dim]
    pub k_cache: Tensor<'a>,
    /// [batch, seqlen_k_max, num_heads_kv, head_dim_v]
    pub v_cache: Tensor<'a>,
    /// int32 [batch]; values outside [0, seqlen_k_max] are clamped by the kernel.
    pub cache_seqlens: &'a DeviceBuffer,
    /// 0 = automatic.
    pub num_splits: usize,
    /// Workspace for the partial states; None = a temporary one is allocated.
    /// Required when `o` is None (the partial states are then the result).
    pub workspace: Option<&'a mut DeviceBuffer>,
    /// [batch, seqlen_q, num_heads_q, head_dim_v]; None = skip the combine.
    pub o: Option<TensorMut<'a>>,
    /// fp32 [batch, num_heads_q, seqlen_q]; only with `o`.
    pub lse: Option<&'a mut DeviceBuffer>,
}

/// Arguments of `Runtime::decode_reduce`.
#[derive(Debug)]
pub struct ReduceArgs<'a> {
    pub num_splits: usize,
    pub batch: usize,
    pub seqlen_q: usize,
    /// fp32 [num_splits, batch, seqlen_q, num_heads_q, head_dim_v]
    pub o_partial: View<'a, 5>,
    /// fp32 [num_splits, batch, num_heads_q, seqlen_q]
    pub lse_partial: View<'a, 4>,
    /// [batch, seqlen_q, num_heads_q, head_dim_v], written
    pub o: TensorMut<'a>,
    /// fp32 [batch, num_heads_q, seqlen_q], written if given
    pub lse: Option<&'a mut DeviceBuffer>,
}

/// A paged KV cache (vLLM / FlashAttention layout): key j of sequence b is
/// token j % page_size of page block_table[b][j / page_size].
#[derive(Debug, Clone, Copy)]
pub struct PagedKv<'a> {
    /// [num_pages, page_size, num_heads_kv, head_dim], any strides (NHD; for
    /// FlashInfer's HND pages [num_pages, num_heads_kv, page_size, head_dim]
    /// swap strides[1] and strides[2]).
    pub k_pages: Tensor<'a>,
    /// [num_pages, page_size, num_heads_kv, head_dim_v], any strides.
    pub v_pages: Tensor<'a>,
    /// Pages in k_pages and v_pages (>= 1).
    pub num_pages: usize,
    /// Tokens per page (>= 1, any value; fastest a multiple of 64).
    pub page_size: usize,
    /// int32 [batch, max_pages_per_seq], strides [row stride, 1].
    pub block_table: View<'a, 2>,
    /// Used columns of block_table (>= ceil(keys / page_size)).
    pub max_pages_per_seq: usize,
}

/// One sequence of a pointer-array cache.
#[derive(Debug, Clone, Copy)]
pub struct SeqKv<'a> {
    /// [len, num_heads_kv, head_dim]; every sequence's k has the same strides.
    pub k: View<'a, 3>,
    /// [len, num_heads_kv, head_dim_v]; every sequence's v has the same strides.
    pub v: View<'a, 3>,
    /// Keys k and v hold.
    pub len: usize,
}

/// A KV cache in one of the layouts of fa_kv_layout.
#[derive(Debug, Clone, Copy)]
pub enum KvCache<'a> {
    /// k [batch, keys, num_heads_kv, head_dim], v [batch, keys,
    /// num_heads_kv, head_dim_v] (keys: seqlen_k, or decode's seqlen_k_max).
    Contiguous { k: Tensor<'a>, v: Tensor<'a> },
    /// Pages and a block table.
    Paged(PagedKv<'a>),
    /// One entry per sequence (their views must start 16-byte aligned).
    PtrArray(&'a [SeqKv<'a>]),
}

/// Arguments of `Runtime::forward_kv`: a fixed-length batch of queries over
/// keys in any layout (chunked prefill over a KV cache: the queries are the
/// last seqlen_q tokens of each sequence).
#[derive(Debug)]
pub struct ForwardKvArgs<'a> {
    pub batch: usize,
    pub seqlen_q: usize,
    /// Keys per sequence (the most, with seqused_k).
    pub seqlen_k: usize,
    /// [batch, seqlen_q, num_heads_q, head_dim]
    pub q: Tensor<'a>,
    pub kv: KvCache<'a>,
    /// int32 [batch]: sequence b has keys 0..seqused_k[b]-1 (clamped to
    /// [0, seqlen_k]); None = seqlen_k keys each.
    pub seqused_k: Option<&'a DeviceBuffer>,
    /// [batch, seqlen_q, num_heads_q, head_dim_v], written
    pub o: TensorMut<'a>,
    /// fp32 [batch, num_heads_q, seqlen_q], written if given
    pub lse: Option<&'a mut DeviceBuffer>,
    /// As `ForwardArgs::workspace`.
    pub workspace: Option<&'a mut DeviceBuffer>,
}

/// Arguments of `Runtime::decode_kv`: `DecodeArgs` with the cache in any
/// layout and batch-invariant splits.
#[derive(Debug)]
pub struct DecodeKvArgs<'a> {
    pub batch: usize,
    pub seqlen_q: usize,
    /// Keys a sequence may hold (paged: at most max_pages_per_seq * page_size).
    pub seqlen_k_max: usize,
    /// [batch, seqlen_q, num_heads_q, head_dim]
    pub q: Tensor<'a>,
    pub kv: KvCache<'a>,
    /// int32 [batch]; each clamped to [0, seqlen_k_max] by the kernel.
    pub cache_seqlens: &'a DeviceBuffer,
    /// 0 = automatic (must be 0 with batch_invariant).
    pub num_splits: usize,
    /// Splits of FA_DECODE_INVARIANT_SPLIT (2048) keys, so a sequence's
    /// output bits do not depend on the rest of the batch or its size.
    pub batch_invariant: bool,
    /// As `DecodeArgs::workspace`.
    pub workspace: Option<&'a mut DeviceBuffer>,
    /// [batch, seqlen_q, num_heads_q, head_dim_v]; None = skip the combine.
    pub o: Option<TensorMut<'a>>,
    /// fp32 [batch, num_heads_q, seqlen_q]; only with `o`.
    pub lse: Option<&'a mut DeviceBuffer>,
}

impl<'a> From<DecodeArgs<'a>> for DecodeKvArgs<'a> {
    /// The same decode over the contiguous cache, without batch invariance.
    fn from(a: DecodeArgs<'a>) -> Self {
        DecodeKvArgs {
            batch: a.batch,
            seqlen_q: a.seqlen_q,
            seqlen_k_max: a.seqlen_k_max,
            q: a.q,
            kv: KvCache::Contiguous { k: a.k_cache, v: a.v_cache },
            cache_seqlens: a.cache_seqlens,
            num_splits: a.num_splits,
            batch_invariant: false,
            workspace: a.workspace,
            o: a.o,
            lse: a.lse,
        }
    }
}

/// A cache resolved for a call: raw k/v, the layout, and the pointer arrays
/// it uploaded (to be kept until the work is done).
struct ResolvedKv {
    k: RawTensor,
    v: RawTensor,
    layout: RawKvLayout,
    ptrs: Option<DeviceBuffer>,
}

/// Keys per sequence from an int32 [batch] buffer, clamped as the kernel
/// clamps them to [0, keys] (a synchronous copy to the host).
fn read_lengths(
    rt: &Runtime,
    name: &str,
    buf: &DeviceBuffer,
    batch: usize,
    keys: usize,
) -> Result<Vec<usize>> {
    checked_ptr(rt, name, buf, 0, &[1], &[batch], 4)?;
    let mut v = vec![0i32; batch];
    buf.download(&mut v)?;
    Ok(v.iter().map(|&n| (n.max(0) as usize).min(keys)).collect())
}

/// Checks the extents of a cache in any layout and, for paged and
/// pointer-array caches, the device data the kernel will follow: every
/// block-table entry a sequence reads (ceil(len / page_size) of them) lies
/// in [0, num_pages), every sequence's tensors hold its keys. `lengths`
/// gives the keys per sequence (read only for those two layouts); a
/// pointer-array cache's address arrays are uploaded here. `names` label
/// a contiguous k and v in errors.
fn resolve_kv(
    rt: &Runtime,
    cfg: &Config,
    cache: &KvCache<'_>,
    names: [&str; 2],
    (batch, keys): (usize, usize),
    lengths: impl FnOnce() -> Result<Vec<usize>>,
) -> Result<ResolvedKv> {
    let (hkv, d, dv) = (cfg.num_heads_kv(), cfg.head_dim(), cfg.head_dim_v());
    let e = cfg.kv_elem_size();
    match cache {
        KvCache::Contiguous { k, v } => Ok(ResolvedKv {
            k: tensor(rt, names[0], k, [batch, keys, hkv, d], e)?,
            v: tensor(rt, names[1], v, [batch, keys, hkv, dv], e)?,
            layout: RawKvLayout::default(),
            ptrs: None,
        }),
        KvCache::Paged(p) => {
            let (np, ps, mp) = (p.num_pages, p.page_size, p.max_pages_per_seq);
            let bt = &p.block_table;
            if mp > 1 && bt.strides[1] != 1 {
                return Err(Error::invalid(format!(
                    "flashattn-rs: block_table rows must be contiguous (strides[1] = 1), got \
                     strides {:?}",
                    bt.strides
                )));
            }
            let layout = RawKvLayout {
                layout: KvLayout::Paged,
                page_size: to_i32("page_size", ps)?,
                num_pages: to_i32("num_pages", np)?,
                max_pages_per_seq: to_i32("max_pages_per_seq", mp)?,
                block_table: checked_ptr(
                    rt,
                    "block_table",
                    bt.buf,
                    bt.byte_offset,
                    &bt.strides,
                    &[batch, mp],
                    4,
                )?,
                block_table_stride: bt.strides[0],
                ..Default::default()
            };
            let resolved = ResolvedKv {
                k: tensor(rt, "k_pages", &p.k_pages, [np, ps, hkv, d], e)?,
                v: tensor(rt, "v_pages", &p.v_pages, [np, ps, hkv, dv], e)?,
                layout,
                ptrs: None,
            };
            // Empty or negative shapes are the library's to reject.
            if ps == 0 || mp == 0 || batch == 0 || bt.strides[0] < 0 {
                return Ok(resolved);
            }
            let lens = lengths()?;
            let row = bt.strides[0] as usize;
            let mut table = vec![0i32; (batch - 1) * row + mp];
            bt.buf.download_at(bt.byte_offset, &mut table)?;
            for (b, &n) in lens.iter().enumerate() {
                let pages = n.div_ceil(ps).min(mp);
                for (i, &page) in table[b * row..b * row + pages].iter().enumerate() {
                    if page < 0 || page as usize >= np {
                        return Err(Error::invalid(format!(
                            "flashattn-rs: block_table[{b}][{i}] = {page} is outside \
                             [0, num_pages={np}) (sequence {b} has {n} keys)"
                        )));
                    }
                }
            }
            Ok(resolved)
        }
        KvCache::PtrArray(seqs) => {
            if seqs.len() != batch {
                return Err(Error::invalid(format!(
                    "flashattn-rs: a pointer-array cache needs one entry per sequence (batch = \
                     {batch}), got {}",
                    seqs.len()
                )));
            }
            let first = seqs.first().ok_or_else(|| Error::invalid("flashattn-rs: batch is 0"))?;
            let lens = lengths()?;
            let mut ptrs = Vec::with_capacity(2 * batch);
            for (which, dim) in [("k", d), ("v", dv)] {
                for (b, s) in seqs.iter().enumerate() {
                    let (view, strides0) = if which == "k" {
                        (&s.k, first.k.strides)
                    } else {
                        (&s.v, first.v.strides)
                    };
                    let name = format!("{which}[{b}]");
                    if view.strides != strides0 {
                        return Err(Error::invalid(format!(
                            "flashattn-rs: {name} has strides {:?}, {which}[0] {strides0:?}: \
                             every sequence needs the same strides",
                            view.strides
                        )));
                    }
                    let ptr = checked_ptr(
                        rt,
                        &name,
                        view.buf,
                        view.byte_offset,
                        &view.strides,
                        &[s.len, hkv, dim],
                        e,
                    )?;
                    if ptr % 16 != 0 {
                        return Err(Error::invalid(format!(
                            "flashattn-rs: {name} at {ptr:#x} is not 16-byte aligned"
                        )));
                    }
                    if lens[b] > s.len {
                        return Err(Error::invalid(format!(
                            "flashattn-rs: sequence {b} has {} keys, {name} holds {}",
                            lens[b], s.len
                        )));
                    }
                    ptrs.push(ptr);
                }
            }
            let buf = rt.alloc_from(&ptrs)?;
            let base = buf.as_ptr();
            let raw = |st: [i64; 3]| RawTensor { data: 0, strides: [0, st[0], st[1], st[2]] };
            Ok(ResolvedKv {
                k: raw(first.k.strides),
                v: raw(first.v.strides),
                layout: RawKvLayout {
                    layout: KvLayout::PtrArray,
                    k_ptrs: base,
                    v_ptrs: base + 8 * batch as u64,
                    ..Default::default()
                },
                ptrs: Some(buf),
            })
        }
    }
}

impl Runtime {
    /// Attention forward pass on raw device pointers (fa_launch).
    ///
    /// # Safety
    /// Every pointer must be device memory of this runtime's device holding
    /// the extents flashattn.h describes for these args, `o`/`lse` must not be
    /// in use elsewhere until the work is done, and `stream` must be NULL or a
    /// live CUstream of this runtime's context.
    pub unsafe fn forward_raw(
        &self,
        cfg: &Config,
        args: &RawForwardArgs,
        stream: *mut c_void,
    ) -> Result<()> {
        check(sys::fa_launch(self.as_raw(), cfg.as_raw(), &args.to_sys(), stream))
    }

    /// The bytes of `RawForwardArgs::workspace` a forward with `args` uses on
    /// this runtime (fa_forward_workspace_size, since 0.8): 8 when it would
    /// run on the persistent sm_90a kernel (the runtime created with
    /// FLASHATTN_SM90_PERSISTENT=1 on an sm_90 device), which then takes its
    /// work items from the workspace's counter; 256 plus the split-KV
    /// partial states when it would split the keys of a fixed-length launch
    /// whose CTAs leave SMs idle (FLASHATTN_FORWARD_SPLITS=0: never); else 0
    /// (a workspace given is ignored). Reads only host fields (sizes, strides, layout, which
    /// pointers are set; not `workspace`), touches no memory. For the safe
    /// API (`ForwardArgs::workspace`), a zeroed DeviceBuffer of 8 bytes
    /// always serves. Errors: InvalidArgument for sizes and strides
    /// fa_launch would refuse.
    pub fn forward_workspace_size(&self, cfg: &Config, args: &RawForwardArgs) -> Result<usize> {
        let mut bytes = 0usize;
        // SAFETY: valid handles and out pointer; no device memory is read.
        check(unsafe {
            sys::fa_forward_workspace_size(self.as_raw(), cfg.as_raw(), &args.to_sys(), &mut bytes)
        })?;
        Ok(bytes)
    }

    /// O = softmax(scale * Q K^T) V on DeviceBuffers, on the default stream.
    /// Every view's extent is checked against its buffer first.
    pub fn forward(&self, cfg: &Config, args: ForwardArgs<'_>) -> Result<()> {
        self.forward_kv(
            cfg,
            ForwardKvArgs {
                batch: args.batch,
                seqlen_q: args.seqlen_q,
                seqlen_k: args.seqlen_k,
                q: args.q,
                kv: KvCache::Contiguous { k: args.k, v: args.v },
                seqused_k: None,
                o: args.o,
                lse: args.lse,
                workspace: args.workspace,
            },
        )
    }

    /// Forward over keys in any layout, on the default stream: with a paged
    /// or pointer-array cache this is chunked prefill (the queries are the
    /// last seqlen_q tokens of each sequence, keys counted by seqused_k).
    /// Shapes as in `ForwardKvArgs`. Every extent is checked against its
    /// buffer; for a paged or pointer-array cache seqused_k and the block
    /// table are also read back (a synchronous copy) to check the pages and
    /// tensors each sequence uses, and with a pointer array the call waits
    /// for the kernel (its address arrays are temporary).
    /// With `workspace` (since 0.8) the persistent forward, when it runs,
    /// takes its work items from it (see `ForwardArgs::workspace`).
    /// Errors: InvalidArgument from these checks (prefix "flashattn-rs:";
    /// a workspace of another runtime) or the library's (sizes, strides,
    /// alignment, page fields; a workspace under 8 bytes: "workspace_size
    /// ..."), then as `forward_raw`.
    pub fn forward_kv(&self, cfg: &Config, args: ForwardKvArgs<'_>) -> Result<()> {
        self.forward_kv_impl(cfg, args, None, None, None)
    }

    /// The fp8 forward (since 0.6; FlashAttention-3's): `forward_kv` with a
    /// Config whose `q_dtype` and `kv_dtype` are E4M3 / E5M2. q, k and v hold
    /// fp8 bytes; an element's value is fp8(byte) * descale, `q_descale`
    /// and `descales.k` / `descales.v` fp32 [batch, num_heads_kv] with
    /// `descales.strides` (shared; [0, 0] = one value per tensor), None =
    /// 1.0; a query head uses its KV head's q_descale. o is the Config's
    /// dtype (F16 or BF16). S = Q K^T and P V run on fp8 tensor cores with
    /// f32 accumulation, P rounded to e4m3. Errors: as `forward_kv`, plus
    /// InvalidArgument when a descale buffer is too short or memory of
    /// another runtime; Unsupported below sm_89.
    pub fn forward_fp8(
        &self,
        cfg: &Config,
        args: ForwardKvArgs<'_>,
        q_descale: Option<&DeviceBuffer>,
        descales: Descales<'_>,
    ) -> Result<()> {
        self.forward_kv_impl(cfg, args, None, None, Some((q_descale, descales)))
    }

    /// `forward_kv` with attention sinks (since 0.4.1; gpt-oss): `sinks` holds
    /// fp32 [num_heads_q], one natural-log logit per query head that joins
    /// every row's softmax denominator and contributes no value, compared
    /// with the scaled scores as it is (not multiplied by the softmax scale,
    /// outside every mask and window): O = sum_j e^(s_j) v_j / (sum_j e^(s_j)
    /// + e^(sink)); the LSE includes it (a row with no key: O = 0, LSE =
    /// sink). Errors: as `forward_kv`, plus InvalidArgument when `sinks` is
    /// too short or memory of another runtime.
    pub fn forward_kv_sinks(
        &self,
        cfg: &Config,
        args: ForwardKvArgs<'_>,
        sinks: &DeviceBuffer,
    ) -> Result<()> {
        self.forward_kv_impl(cfg, args, Some(sinks), None, None)
    }

    /// `forward_kv` (with attention sinks when `sinks` is given) and ALiBi
    /// (since 0.5; see `Alibi`): the logit of query i, key j loses
    /// slope * |i + seqlen_k - seqlen_q - j| (after softcap, per sequence
    /// with seqused_k), causal or not; the sink is not biased. Errors: as
    /// `forward_kv_sinks`, plus InvalidArgument when the slopes are too
    /// short or memory of another runtime.
    pub fn forward_kv_alibi(
        &self,
        cfg: &Config,
        args: ForwardKvArgs<'_>,
        sinks: Option<&DeviceBuffer>,
        alibi: Alibi<'_>,
    ) -> Result<()> {
        self.forward_kv_impl(cfg, args, sinks, Some(alibi), None)
    }

    fn forward_kv_impl(
        &self,
        cfg: &Config,
        args: ForwardKvArgs<'_>,
        sinks: Option<&DeviceBuffer>,
        alibi: Option<Alibi<'_>>,
        fp8: Option<(Option<&DeviceBuffer>, Descales<'_>)>,
    ) -> Result<()> {
        let (b, sq, sk) = (args.batch, args.seqlen_q, args.seqlen_k);
        let (hq, d, dv) = (cfg.num_heads_q(), cfg.head_dim(), cfg.head_dim_v());
        let e = cfg.dtype().size();
        let q = tensor(self, "q", &args.q, [b, sq, hq, d], cfg.q_elem_size())?;
        let kv = resolve_kv(self, cfg, &args.kv, ["k", "v"], (b, sk), || match args.seqused_k {
            Some(buf) => read_lengths(self, "seqused_k", buf, b, sk),
            None => Ok(vec![sk; b]),
        })?;
        let raw = RawForwardArgs {
            batch: to_i32("batch", b)?,
            seqlen_q: to_i32("seqlen_q", sq)?,
            seqlen_k: to_i32("seqlen_k", sk)?,
            q,
            k: kv.k,
            v: kv.v,
            o: tensor_mut(self, "o", &args.o, [b, sq, hq, dv], e)?,
            lse: fp32_out(self, "lse", &args.lse, b * hq * sq)?,
            cu_seqlens_q: 0,
            cu_seqlens_k: 0,
            kv: kv.layout,
            seqused_k: match args.seqused_k {
                Some(buf) => checked_ptr(self, "seqused_k", buf, 0, &[1], &[b], 4)?,
                None => 0,
            },
            sinks: match sinks {
                Some(buf) => checked_ptr(self, "sinks", buf, 0, &[1], &[hq], 4)?,
                None => 0,
            },
            ..Default::default()
        };
        let mut raw = raw;
        if let Some(a) = alibi {
            (raw.alibi_slopes, raw.alibi_slopes_stride) = a.checked(self, b, hq)?;
        }
        if let Some((q_descale, ds)) = fp8 {
            raw.descale_strides = ds.strides;
            [raw.k_descale, raw.v_descale, raw.q_descale] = ds.checked(self, cfg, b, q_descale)?;
        }
        if let Some(w) = &args.workspace {
            if w.runtime_id() != self.id() {
                return Err(Error::invalid("flashattn-rs: workspace is memory of another runtime"));
            }
            // Its size and alignment are the library's to check.
            (raw.workspace, raw.workspace_size) = (w.as_ptr(), w.len());
        }
        // SAFETY: every extent lies in a live buffer of this runtime, and the
        // pages and pointers the kernel follows were checked above; outputs
        // are borrowed mutably; NULL is the default stream.
        unsafe { self.forward_raw(cfg, &raw, std::ptr::null_mut()) }?;
        if kv.ptrs.is_some() {
            self.synchronize()?; // the address arrays are freed on return
        }
        Ok(())
    }

    /// The attention backward on raw device pointers (fa_backward, since
    /// 0.9): dQ, dK, dV (and dsinks) of the forward in `args.fwd` for the
    /// upstream gradient `args.dout`.
    ///
    /// # Safety
    /// As `forward_raw` for `args.fwd` (whose o and lse are read here), and
    /// dout, dq, dk, dv, dsinks and the workspace must be device memory of
    /// this runtime's device holding the extents flashattn.h describes;
    /// dq/dk/dv/dsinks/workspace must not be in use elsewhere until the
    /// work is done.
    pub unsafe fn backward_raw(
        &self,
        cfg: &Config,
        args: &RawBackwardArgs,
        stream: *mut c_void,
    ) -> Result<()> {
        check(sys::fa_backward(self.as_raw(), cfg.as_raw(), &args.to_sys(), stream))
    }

    /// The bytes of `RawBackwardArgs::workspace` a backward with `args` uses
    /// on this runtime (fa_backward_workspace_size, since 0.9): fp32 dQ
    /// accumulators and per-row statistics. Reads only host fields, touches
    /// no memory. Errors: InvalidArgument for sizes and strides fa_backward
    /// would refuse, Unsupported for what it does not take.
    pub fn backward_workspace_size(&self, cfg: &Config, args: &RawBackwardArgs) -> Result<usize> {
        let mut bytes = 0usize;
        // SAFETY: valid handles and out pointer; no device memory is read.
        check(unsafe {
            sys::fa_backward_workspace_size(self.as_raw(), cfg.as_raw(), &args.to_sys(), &mut bytes)
        })?;
        Ok(bytes)
    }

    /// The attention backward on DeviceBuffers, on the default stream
    /// (FlashAttention-2's, since 0.9): writes dQ, dK and dV of the forward
    /// (q, k, v) -> (o, lse) for the upstream gradient dout, under the
    /// Config's causal, window, softcap, scale and GQA (dK and dV summed
    /// over each KV head's query heads). Every view's extent is checked
    /// against its buffer first. Errors: InvalidArgument from these checks
    /// (prefix "flashattn-rs:") or the library's; Unsupported for fp8 and
    /// fp32 configs and head dims past 256 (past 128: multiples of 16).
    pub fn backward(&self, cfg: &Config, args: BackwardArgs<'_>) -> Result<()> {
        self.backward_impl(cfg, args, None, None)
    }

    /// `backward` of a forward with attention sinks (see
    /// `forward_kv_sinks`): also writes their gradient into `dsinks`, fp32
    /// [num_heads_q]: dsinks[h] = -sum over the head's rows of
    /// e^(sinks[h] - LSE_i) D_i, D_i = rowsum(dO_i o O_i).
    pub fn backward_sinks(
        &self,
        cfg: &Config,
        args: BackwardArgs<'_>,
        sinks: &DeviceBuffer,
        dsinks: &mut DeviceBuffer,
    ) -> Result<()> {
        self.backward_impl(cfg, args, Some((sinks, dsinks)), None)
    }

    /// `backward` (with sinks when given) of a forward with ALiBi (the same
    /// slopes; they get no gradient).
    pub fn backward_alibi(
        &self,
        cfg: &Config,
        args: BackwardArgs<'_>,
        sinks: Option<(&DeviceBuffer, &mut DeviceBuffer)>,
        alibi: Alibi<'_>,
    ) -> Result<()> {
        self.backward_impl(cfg, args, sinks, Some(alibi))
    }

    fn backward_impl(
        &self,
        cfg: &Config,
        args: BackwardArgs<'_>,
        sinks: Option<(&DeviceBuffer, &mut DeviceBuffer)>,
        alibi: Option<Alibi<'_>>,
    ) -> Result<()> {
        let (b, sq, sk) = (args.batch, args.seqlen_q, args.seqlen_k);
        let (hq, hkv, d, dv) =
            (cfg.num_heads_q(), cfg.num_heads_kv(), cfg.head_dim(), cfg.head_dim_v());
        let e = cfg.dtype().size();
        let mut fwd = RawForwardArgs {
            batch: to_i32("batch", b)?,
            seqlen_q: to_i32("seqlen_q", sq)?,
            seqlen_k: to_i32("seqlen_k", sk)?,
            q: tensor(self, "q", &args.q, [b, sq, hq, d], e)?,
            k: tensor(self, "k", &args.k, [b, sk, hkv, d], e)?,
            v: tensor(self, "v", &args.v, [b, sk, hkv, dv], e)?,
            o: tensor(self, "o", &args.o, [b, sq, hq, dv], e)?,
            lse: checked_ptr(self, "lse", args.lse, 0, &[1], &[b * hq * sq], 4)?,
            ..Default::default()
        };
        let mut dsinks = 0;
        if let Some((s, ds)) = &sinks {
            fwd.sinks = checked_ptr(self, "sinks", s, 0, &[1], &[hq], 4)?;
            dsinks = checked_ptr(self, "dsinks", ds, 0, &[1], &[hq], 4)?;
        }
        if let Some(a) = alibi {
            (fwd.alibi_slopes, fwd.alibi_slopes_stride) = a.checked(self, b, hq)?;
        }
        let mut raw = RawBackwardArgs {
            fwd,
            dout: tensor(self, "dout", &args.dout, [b, sq, hq, dv], e)?,
            dq: tensor_mut(self, "dq", &args.dq, [b, sq, hq, d], e)?,
            dk: tensor_mut(self, "dk", &args.dk, [b, sk, hkv, d], e)?,
            dv: tensor_mut(self, "dv", &args.dv, [b, sk, hkv, dv], e)?,
            dsinks,
            deterministic: args.deterministic,
            ..Default::default()
        };
        let temp = match &args.workspace {
            Some(w) => {
                if w.runtime_id() != self.id() {
                    return Err(Error::invalid(
                        "flashattn-rs: workspace is memory of another runtime",
                    ));
                }
                // Its size is the library's to check.
                (raw.workspace, raw.workspace_size) = (w.as_ptr(), w.len());
                None
            }
            None => {
                let n = self.backward_workspace_size(cfg, &raw)?;
                let w = self.alloc(n.max(256))?;
                (raw.workspace, raw.workspace_size) = (w.as_ptr(), w.len());
                Some(w)
            }
        };
        // SAFETY: every extent lies in a live buffer of this runtime; the
        // outputs are borrowed mutably; NULL is the default stream.
        unsafe { self.backward_raw(cfg, &raw, std::ptr::null_mut()) }?;
        if temp.is_some() {
            self.synchronize()?; // the temporary workspace is freed on return
        }
        Ok(())
    }

    /// Workspace bytes and split count fa_decode will use for `args` (reads
    /// only the sizes and num_splits, touches no memory).
    pub fn decode_workspace_size(&self, cfg: &Config, args: &RawDecodeArgs) -> Result<DecodePlan> {
        let a = args.to_sys();
        let (mut bytes, mut splits) = (0usize, 0i32);
        // SAFETY: valid handles and out pointers; no device memory is read.
        check(unsafe {
            sys::fa_decode_workspace_size(self.as_raw(), cfg.as_raw(), &a, &mut bytes, &mut splits)
        })?;
        Ok(DecodePlan { workspace_bytes: bytes, num_splits: splits })
    }

    /// Flash-Decoding on raw device pointers (fa_decode); the caller provides
    /// the workspace (see `decode_workspace_size`).
    ///
    /// # Safety
    /// As `forward_raw`, for the decode tensors, cache_seqlens and workspace.
    pub unsafe fn decode_raw(
        &self,
        cfg: &Config,
        args: &RawDecodeArgs,
        stream: *mut c_void,
    ) -> Result<()> {
        check(sys::fa_decode(self.as_raw(), cfg.as_raw(), &args.to_sys(), stream))
    }

    /// Flash-Decoding over a KV cache on DeviceBuffers, on the default stream.
    /// Allocates a temporary workspace unless one is given. Returns the plan
    /// (splits used, workspace bytes).
    pub fn decode(&self, cfg: &Config, args: DecodeArgs<'_>) -> Result<DecodePlan> {
        self.decode_kv(cfg, args.into())
    }

    /// Flash-Decoding over a cache in any layout (contiguous, paged, pointer
    /// array), optionally batch-invariant, on the default stream. Shapes as
    /// in `DecodeKvArgs`. Allocates a temporary workspace unless one is
    /// given, and returns the plan (splits used, workspace bytes). Every
    /// extent is checked against its buffer; for a paged or pointer-array
    /// cache cache_seqlens and the block table are also read back (a
    /// synchronous copy) to check the pages and tensors each sequence uses.
    /// The call waits for the kernel when it allocated the workspace or
    /// uploaded pointer arrays (both temporary).
    /// Errors: InvalidArgument from these checks (prefix "flashattn-rs:") or
    /// the library's (e.g. num_splits with batch_invariant, page fields),
    /// then as `decode_raw`.
    pub fn decode_kv(&self, cfg: &Config, args: DecodeKvArgs<'_>) -> Result<DecodePlan> {
        self.decode_kv_impl(cfg, args, None, None, None, None, None)
    }

    /// `decode_kv` over an fp8 KV cache (a Config with `kv_dtype` E4M3 or
    /// E5M2, since 0.5): the cache buffers hold the fp8 bytes, `descales`
    /// scales them (each extent [batch, num_heads_kv] checked against its
    /// buffer). Errors: as `decode_kv`; Unsupported below sm_89.
    pub fn decode_kv_fp8(
        &self,
        cfg: &Config,
        args: DecodeKvArgs<'_>,
        descales: Descales<'_>,
    ) -> Result<DecodePlan> {
        self.decode_kv_impl(cfg, args, None, None, None, Some(descales), None)
    }

    /// `decode_kv` with a speculative-decoding tree mask among the new
    /// tokens (since 0.4; see `TreeMask`). Errors: as `decode_kv`, plus
    /// InvalidArgument for a mask whose extent, trees, row_words or last
    /// stride do not fit.
    pub fn decode_tree(
        &self,
        cfg: &Config,
        args: DecodeKvArgs<'_>,
        tree: TreeMask<'_>,
    ) -> Result<DecodePlan> {
        self.decode_kv_impl(cfg, args, Some(tree), None, None, None, None)
    }

    /// `decode_kv` (with a tree mask when `tree` is given) and attention
    /// sinks (since 0.4.1; see `forward_kv_sinks`): fp32 [num_heads_q], each
    /// row's sink joins its denominator once, in the combine (so `o` must be
    /// given). Errors: as `decode_tree`, plus InvalidArgument when `sinks` is
    /// too short or `o` is None.
    pub fn decode_kv_sinks(
        &self,
        cfg: &Config,
        args: DecodeKvArgs<'_>,
        tree: Option<TreeMask<'_>>,
        sinks: &DeviceBuffer,
    ) -> Result<DecodePlan> {
        self.decode_kv_impl(cfg, args, tree, Some(sinks), None, None, None)
    }

    /// `decode_kv` with a KV append (since 0.5; see `KvAppend`): the new
    /// keys (rotated when `append.rotary` is given) and values are written
    /// into the cache at cache_seqlens[b] and attended to in the same
    /// launch, Q rotated likewise. The cache in `args.kv` is WRITTEN (its
    /// rows cache_seqlens[b] .. + seqlen_new - 1), though borrowed shared:
    /// k_new / v_new must not overlap it. cache_seqlens are the lengths
    /// before the append: the cache needs room for cache_seqlens[b] +
    /// seqlen_new keys. Errors: as `decode_kv`, plus InvalidArgument when
    /// seqlen_new is 0 or above seqlen_k_max, or k_new, v_new, the tables
    /// or the positions are too short.
    pub fn decode_append(
        &self,
        cfg: &Config,
        args: DecodeKvArgs<'_>,
        append: KvAppend<'_>,
    ) -> Result<DecodePlan> {
        self.decode_kv_impl(cfg, args, None, None, None, None, Some(append))
    }

    /// `decode_append` with a tree mask and / or attention sinks (as
    /// `decode_kv_sinks`).
    pub fn decode_append_with(
        &self,
        cfg: &Config,
        args: DecodeKvArgs<'_>,
        append: KvAppend<'_>,
        tree: Option<TreeMask<'_>>,
        sinks: Option<&DeviceBuffer>,
    ) -> Result<DecodePlan> {
        self.decode_kv_impl(cfg, args, tree, sinks, None, None, Some(append))
    }

    /// `decode_kv` (with a tree mask and attention sinks when given) and
    /// ALiBi (since 0.5; see `Alibi`): new token i of sequence b, key j,
    /// bias -slope * |i + cache_seqlens[b] - seqlen_q - j|, in every split's
    /// scores. Errors: as `decode_kv_sinks`, plus InvalidArgument when the
    /// slopes are too short or memory of another runtime.
    pub fn decode_kv_alibi(
        &self,
        cfg: &Config,
        args: DecodeKvArgs<'_>,
        tree: Option<TreeMask<'_>>,
        sinks: Option<&DeviceBuffer>,
        alibi: Alibi<'_>,
    ) -> Result<DecodePlan> {
        self.decode_kv_impl(cfg, args, tree, sinks, Some(alibi), None, None)
    }

    fn decode_kv_impl(
        &self,
        cfg: &Config,
        args: DecodeKvArgs<'_>,
        tree: Option<TreeMask<'_>>,
        sinks: Option<&DeviceBuffer>,
        alibi: Option<Alibi<'_>>,
        descales: Option<Descales<'_>>,
        append: Option<KvAppend<'_>>,
    ) -> Result<DecodePlan> {
        let (b, sq, sk) = (args.batch, args.seqlen_q, args.seqlen_k_max);
        let (hq, d, dv) = (cfg.num_heads_q(), cfg.head_dim(), cfg.head_dim_v());
        let e = cfg.dtype().size();
        let q = tensor(self, "q", &args.q, [b, sq, hq, d], e)?;
        let sn = match &append {
            None => 0,
            Some(a) if a.seqlen_new == 0 || a.seqlen_new > sk => {
                return Err(Error::invalid(format!(
                    "flashattn-rs: seqlen_new = {} must be in [1, seqlen_k_max = {sk}]",
                    a.seqlen_new
                )));
            }
            Some(a) => a.seqlen_new,
        };
        // With the append, cache_seqlens[b] (clamped to [0, sk - sn]) are
        // the lengths before it: the sequence holds that plus sn keys.
        let kv = resolve_kv(self, cfg, &args.kv, ["k_cache", "v_cache"], (b, sk), || {
            let lens = read_lengths(self, "cache_seqlens", args.cache_seqlens, b, sk - sn)?;
            Ok(lens.into_iter().map(|n| n + sn).collect())
        })?;
        let cache_seqlens =
            checked_ptr(self, "cache_seqlens", args.cache_seqlens, 0, &[1], &[b], 4)?;
        let mut raw = RawDecodeArgs {
            batch: to_i32("batch", b)?,
            seqlen_q: to_i32("seqlen_q", sq)?,
            seqlen_k_max: to_i32("seqlen_k_max", sk)?,
            q,
            k_cache: kv.k,
            v_cache: kv.v,
            cache_seqlens,
            num_splits: to_i32("num_splits", args.num_splits)?,
            kv: kv.layout,
            batch_invariant: args.batch_invariant,
            ..Default::default()
        };
        if let Some(s) = sinks {
            raw.sinks = checked_ptr(self, "sinks", s, 0, &[1], &[hq], 4)?;
        }
        if let Some(a) = alibi {
            (raw.alibi_slopes, raw.alibi_slopes_stride) = a.checked(self, b, hq)?;
        }
        if let Some(ds) = descales {
            raw.descale_strides = ds.strides;
            [raw.k_descale, raw.v_descale, _] = ds.checked(self, cfg, b, None)?;
        }
        if let Some(a) = &append {
            let hkv = cfg.num_heads_kv();
            raw.k_new = tensor(self, "k_new", &a.k_new, [b, sn, hkv, d], e)?;
            raw.v_new = tensor(self, "v_new", &a.v_new, [b, sn, hkv, dv], e)?;
            raw.seqlen_new = to_i32("seqlen_new", sn)?;
            if let Some(r) = &a.rotary {
                let (rd, ro) = (r.rotary_dim, r.seqlen_ro);
                if rd == 0 || ro == 0 {
                    return Err(Error::invalid(format!(
                        "flashattn-rs: rotary_dim = {rd} (a multiple of 16) and seqlen_ro = {ro} \
                         must be >= 1"
                    )));
                }
                raw.rotary_dim = to_i32("rotary_dim", rd)?;
                raw.seqlen_ro = to_i32("seqlen_ro", ro)?;
                raw.rotary_cos =
                    checked_ptr(self, "rotary_cos", r.cos, 0, &[1], &[ro * rd / 2], 4)?;
                raw.rotary_sin =
                    checked_ptr(self, "rotary_sin", r.sin, 0, &[1], &[ro * rd / 2], 4)?;
                raw.rotary_interleaved = r.interleaved;
                raw.rotary_dtype = sys::FA_DTYPE_FP32;
                if let Some((p, stride)) = r.positions {
                    let n = sq.max(sn);
                    raw.rotary_positions = checked_ptr(
                        self,
                        "rotary_positions",
                        p,
                        0,
                        &[stride as i64, 1],
                        &[b, n],
                        4,
                    )?;
                    raw.rotary_positions_stride = stride as i64;
                }
            }
        }
        if let Some(t) = &tree {
            let w = &t.words;
            if (t.trees != b && t.trees != 1) || t.row_words < sq.div_ceil(32) || w.strides[2] != 1
            {
                return Err(Error::invalid(format!(
                    "flashattn-rs: tree mask of {} trees x {} words per row, last stride {}; \
                     expected {b} or 1 trees, >= {} words, stride 1",
                    t.trees,
                    t.row_words,
                    w.strides[2],
                    sq.div_ceil(32)
                )));
            }
            raw.tree_mask = checked_ptr(
                self,
                "tree_mask",
                w.buf,
                w.byte_offset,
                &w.strides,
                &[t.trees, sq, t.row_words],
                4,
            )?;
            raw.tree_mask_strides =
                [if t.trees == 1 { 0 } else { w.strides[0] * 4 }, w.strides[1] * 4];
        }
        match &args.o {
            Some(o) => {
                raw.o = tensor_mut(self, "o", o, [b, sq, hq, dv], e)?;
                raw.lse = fp32_out(self, "lse", &args.lse, b * hq * sq)?;
            }
            None if args.workspace.is_none() => {
                return Err(Error::invalid(
                    "flashattn-rs: decode without o leaves its result in the workspace: pass one",
                ));
            }
            None if args.lse.is_some() => {
                return Err(Error::invalid("flashattn-rs: decode: lse is set but o is None"));
            }
            None => {}
        }
        let plan = self.decode_workspace_size(cfg, &raw)?;
        let mut temp = None;
        let ws: &DeviceBuffer = match args.workspace {
            Some(w) => {
                if w.runtime_id() != self.id() {
                    return Err(Error::invalid(
                        "flashattn-rs: workspace is memory of another runtime",
                    ));
                }
                w
            }
            None => temp.insert(self.alloc(plan.workspace_bytes.max(1))?),
        };
        if ws.len() < plan.workspace_bytes {
            return Err(Error::invalid(format!(
                "flashattn-rs: decode needs a {}-byte workspace, got {}",
                plan.workspace_bytes,
                ws.len()
            )));
        }
        raw.workspace = ws.as_ptr();
        raw.workspace_size = ws.len();
        // SAFETY: extents checked above, and the pages and pointers the
        // kernel follows; outputs and workspace borrowed mutably (or owned);
        // NULL is the default stream.
        unsafe { self.decode_raw(cfg, &raw, std::ptr::null_mut()) }?;
        if temp.is_some() || kv.ptrs.is_some() {
            // The temporary workspace and address arrays are freed on return.
            self.synchronize()?;
        }
        Ok(plan)
    }

    /// Combines partial states on raw device pointers (fa_decode_reduce).
    ///
    /// # Safety
    /// As `forward_raw`, for the partial states and outputs.
    pub unsafe fn decode_reduce_raw(
        &self,
        cfg: &Config,
        args: &RawReduceArgs,
        stream: *mut c_void,
    ) -> Result<()> {
        let a = sys::fa_reduce_args {
            num_splits: args.num_splits,
            batch: args.batch,
            seqlen_q: args.seqlen_q,
            o_partial: args.o_partial,
            o_partial_stride: args.o_partial_strides,
            lse_partial: args.lse_partial,
            lse_partial_stride: args.lse_partial_strides,
            o: args.o.to_sys(),
            lse: args.lse,
            lse_partial_format: args.lse_partial_format.to_sys(),
            lse_format: args.lse_format.to_sys(),
            sinks: args.sinks,
            ..Default::default()
        };
        check(sys::fa_decode_reduce(self.as_raw(), cfg.as_raw(), &a, stream))
    }

    /// Combines `num_splits` partial states per row into `o` (and `lse`):
    /// m = max LSE_s, w_s = exp(LSE_s - m), O = sum w_s O_s / sum w_s,
    /// LSE = m + log sum w_s. On DeviceBuffers, default stream. Natural-log
    /// LSEs in and out (see `decode_reduce_formats`).
    pub fn decode_reduce(&self, cfg: &Config, args: ReduceArgs<'_>) -> Result<()> {
        self.decode_reduce_formats(cfg, args, LseFormat::Natural, LseFormat::Natural)
    }

    /// `decode_reduce` with the base of the partial LSEs read and of the LSE
    /// written (since 0.4): states from FlashInfer (base 2) merge with
    /// flashattn's or FlashAttention's (natural); the kernel converts on
    /// load and store.
    pub fn decode_reduce_formats(
        &self,
        cfg: &Config,
        args: ReduceArgs<'_>,
        lse_partial_format: LseFormat,
        lse_format: LseFormat,
    ) -> Result<()> {
        self.decode_reduce_impl(cfg, args, lse_partial_format, lse_format, None)
    }

    /// `decode_reduce_formats` with attention sinks (since 0.4.1): fp32
    /// [num_heads_q] natural-log logits, one more state per row with O = 0
    /// (so each row's sink joins the denominator once, however many states
    /// merge). Errors: as `decode_reduce_formats`, plus InvalidArgument when
    /// `sinks` is too short.
    pub fn decode_reduce_sinks(
        &self,
        cfg: &Config,
        args: ReduceArgs<'_>,
        lse_partial_format: LseFormat,
        lse_format: LseFormat,
        sinks: &DeviceBuffer,
    ) -> Result<()> {
        self.decode_reduce_impl(cfg, args, lse_partial_format, lse_format, Some(sinks))
    }

    fn decode_reduce_impl(
        &self,
        cfg: &Config,
        args: ReduceArgs<'_>,
        lse_partial_format: LseFormat,
        lse_format: LseFormat,
        sinks: Option<&DeviceBuffer>,
    ) -> Result<()> {
        let (s, b, sq) = (args.num_splits, args.batch, args.seqlen_q);
        let (hq, dv) = (cfg.num_heads_q(), cfg.head_dim_v());
        let op = &args.o_partial;
        let lp = &args.lse_partial;
        let raw = RawReduceArgs {
            num_splits: to_i32("num_splits", s)?,
            batch: to_i32("batch", b)?,
            seqlen_q: to_i32("seqlen_q", sq)?,
            o_partial: checked_ptr(
                self,
                "o_partial",
                op.buf,
                op.byte_offset,
                &op.strides,
                &[s, b, sq, hq, dv],
                4,
            )?,
            o_partial_strides: op.strides,
            lse_partial: checked_ptr(
                self,
                "lse_partial",
                lp.buf,
                lp.byte_offset,
                &lp.strides,
                &[s, b, hq, sq],
                4,
            )?,
            lse_partial_strides: lp.strides,
            o: tensor_mut(self, "o", &args.o, [b, sq, hq, dv], cfg.dtype().size())?,
            lse: fp32_out(self, "lse", &args.lse, b * hq * sq)?,
            lse_partial_format,
            lse_format,
            sinks: match sinks {
                Some(buf) => checked_ptr(self, "sinks", buf, 0, &[1], &[hq], 4)?,
                None => 0,
            },
        };
        // SAFETY: extents checked above; outputs borrowed mutably.
        unsafe { self.decode_reduce_raw(cfg, &raw, std::ptr::null_mut()) }
    }
}

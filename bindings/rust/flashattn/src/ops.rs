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
            ..Default::default()
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
        let a = sys::fa_forward_args {
            batch: args.batch,
            seqlen_q: args.seqlen_q,
            seqlen_k: args.seqlen_k,
            q: args.q.to_sys(),
            k: args.k.to_sys(),
            v: args.v.to_sys(),
            o: args.o.to_sys(),
            lse: args.lse,
            cu_seqlens_q: args.cu_seqlens_q,
            cu_seqlens_k: args.cu_seqlens_k,
            ..Default::default()
        };
        check(sys::fa_launch(self.as_raw(), cfg.as_raw(), &a, stream))
    }

    /// O = softmax(scale * Q K^T) V on DeviceBuffers, on the default stream.
    /// Every view's extent is checked against its buffer first.
    pub fn forward(&self, cfg: &Config, args: ForwardArgs<'_>) -> Result<()> {
        let (b, sq, sk) = (args.batch, args.seqlen_q, args.seqlen_k);
        let (hq, hkv, d, dv) =
            (cfg.num_heads_q(), cfg.num_heads_kv(), cfg.head_dim(), cfg.head_dim_v());
        let e = cfg.dtype().size();
        let raw = RawForwardArgs {
            batch: to_i32("batch", b)?,
            seqlen_q: to_i32("seqlen_q", sq)?,
            seqlen_k: to_i32("seqlen_k", sk)?,
            q: tensor(self, "q", &args.q, [b, sq, hq, d], e)?,
            k: tensor(self, "k", &args.k, [b, sk, hkv, d], e)?,
            v: tensor(self, "v", &args.v, [b, sk, hkv, dv], e)?,
            o: tensor_mut(self, "o", &args.o, [b, sq, hq, dv], e)?,
            lse: fp32_out(self, "lse", &args.lse, b * hq * sq)?,
            cu_seqlens_q: 0,
            cu_seqlens_k: 0,
        };
        // SAFETY: every extent lies in a live buffer of this runtime; outputs
        // are borrowed mutably; NULL is the default stream.
        unsafe { self.forward_raw(cfg, &raw, std::ptr::null_mut()) }
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
        let (b, sq, sk) = (args.batch, args.seqlen_q, args.seqlen_k_max);
        let (hq, hkv, d, dv) =
            (cfg.num_heads_q(), cfg.num_heads_kv(), cfg.head_dim(), cfg.head_dim_v());
        let e = cfg.dtype().size();
        let mut raw = RawDecodeArgs {
            batch: to_i32("batch", b)?,
            seqlen_q: to_i32("seqlen_q", sq)?,
            seqlen_k_max: to_i32("seqlen_k_max", sk)?,
            q: tensor(self, "q", &args.q, [b, sq, hq, d], e)?,
            k_cache: tensor(self, "k_cache", &args.k_cache, [b, sk, hkv, d], e)?,
            v_cache: tensor(self, "v_cache", &args.v_cache, [b, sk, hkv, dv], e)?,
            cache_seqlens: checked_ptr(
                self,
                "cache_seqlens",
                args.cache_seqlens,
                0,
                &[1],
                &[b],
                4,
            )?,
            num_splits: to_i32("num_splits", args.num_splits)?,
            ..Default::default()
        };
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
        // SAFETY: extents checked above; outputs and workspace borrowed
        // mutably (or owned); NULL is the default stream.
        unsafe { self.decode_raw(cfg, &raw, std::ptr::null_mut()) }?;
        if temp.is_some() {
            // The temporary workspace is freed on return: let the work finish.
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
            ..Default::default()
        };
        check(sys::fa_decode_reduce(self.as_raw(), cfg.as_raw(), &a, stream))
    }

    /// Combines `num_splits` partial states per row into `o` (and `lse`):
    /// m = max LSE_s, w_s = exp(LSE_s - m), O = sum w_s O_s / sum w_s,
    /// LSE = m + log sum w_s. On DeviceBuffers, default stream.
    pub fn decode_reduce(&self, cfg: &Config, args: ReduceArgs<'_>) -> Result<()> {
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
        };
        // SAFETY: extents checked above; outputs borrowed mutably.
        unsafe { self.decode_reduce_raw(cfg, &raw, std::ptr::null_mut()) }
    }
}

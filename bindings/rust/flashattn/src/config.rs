//! Configs (validated attention problem families) and PTX generation.
use std::ptr::NonNull;

use flashattn_sys as sys;

use crate::error::{check, Error, Result, Status};

/// Element type of Q, K, V and O. `F32`: f32 tensors (no conversion pass);
/// the kernels round Q, K and V to bf16 on load (at most 2^-9 relative per
/// element) and write O as f32; forward, decode without a KV append and
/// decode_reduce, not with an fp8 `KvDtype` (Unsupported).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Dtype {
    #[default]
    F16,
    BF16,
    F32,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            _ => 2,
        }
    }
}

/// The KV cache's element type (fa_config_desc.kv_dtype, since 0.5): the
/// config's dtype, or fp8 bytes (sm_89+, head dims multiples of 16) whose
/// values the descales of `Descales` scale: fa_decode, and fa_launch with an
/// fp8 Q. Also Q's element type (fa_config_desc.q_dtype, since 0.6, with an
/// fp8 kv_dtype: the fp8 forward, `Runtime::forward_fp8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    #[default]
    Same,
    E4M3,
    E5M2,
}

impl KvDtype {
    fn to_sys(self) -> i64 {
        match self {
            KvDtype::Same => 0,
            KvDtype::E4M3 => sys::FA_DTYPE_FP8_E4M3 as i64,
            KvDtype::E5M2 => sys::FA_DTYPE_FP8_E5M2 as i64,
        }
    }
}

/// Which kernel `generate` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// Prefill / forward pass.
    Forward,
    /// Split-KV partial states.
    Decode,
    /// Combine partial states.
    Reduce,
    /// The backward's per-row statistics (D, the LSE in log2 units; dQ's
    /// accumulators zeroed): the first kernel `Runtime::backward` launches.
    BackwardPre,
    /// The backward's main kernel (dK, dV, dQ accumulated).
    Backward,
    /// The backward's per-row dQ (and dsinks): its last kernel.
    BackwardPost,
}

impl KernelKind {
    fn to_raw(self) -> sys::fa_kernel_kind {
        match self {
            KernelKind::Forward => sys::FA_KERNEL_FORWARD,
            KernelKind::Decode => sys::FA_KERNEL_DECODE,
            KernelKind::Reduce => sys::FA_KERNEL_REDUCE,
            KernelKind::BackwardPre => sys::FA_KERNEL_BACKWARD_PRE,
            KernelKind::Backward => sys::FA_KERNEL_BACKWARD,
            KernelKind::BackwardPost => sys::FA_KERNEL_BACKWARD_POST,
        }
    }
}

/// The fields of fa_config_desc; defaults as FA_CONFIG_DESC_INIT
/// (fp16, no causal mask, unbounded window, default scale, no softcap).
#[derive(Debug, Clone)]
pub struct ConfigBuilder {
    dtype: Dtype,
    head_dim: i32,
    head_dim_v: i32,
    num_heads_q: i32,
    num_heads_kv: i32,
    causal: bool,
    window_left: i32,
    window_right: i32,
    softmax_scale: f32,
    softcap: f32,
    kv_dtype: KvDtype,
    q_dtype: KvDtype,
}

impl Default for ConfigBuilder {
    fn default() -> Self {
        ConfigBuilder {
            dtype: Dtype::F16,
            head_dim: 0,
            head_dim_v: 0,
            num_heads_q: 0,
            num_heads_kv: 0,
            causal: false,
            window_left: -1,
            window_right: -1,
            softmax_scale: 0.0,
            softcap: 0.0,
            kv_dtype: KvDtype::Same,
            q_dtype: KvDtype::Same,
        }
    }
}

impl ConfigBuilder {
    pub fn dtype(mut self, dtype: Dtype) -> Self {
        self.dtype = dtype;
        self
    }
    /// head_dim (multiple of 8 in 8..576, past 256 on sm_80+ tensor-core
    /// kernels only); head_dim_v (8..512) defaults to it.
    pub fn head_dim(mut self, d: i32) -> Self {
        self.head_dim = d;
        self
    }
    pub fn head_dim_v(mut self, d: i32) -> Self {
        self.head_dim_v = d;
        self
    }
    /// num_heads_q and num_heads_kv (which must divide num_heads_q).
    pub fn heads(mut self, q: i32, kv: i32) -> Self {
        self.num_heads_q = q;
        self.num_heads_kv = kv;
        self
    }
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }
    /// Sliding window (left, right); -1 = unbounded.
    pub fn window(mut self, left: i32, right: i32) -> Self {
        self.window_left = left;
        self.window_right = right;
        self
    }
    /// Softmax scale; 0 = 1/sqrt(head_dim).
    pub fn softmax_scale(mut self, scale: f32) -> Self {
        self.softmax_scale = scale;
        self
    }
    /// Softcap; 0 = off.
    pub fn softcap(mut self, softcap: f32) -> Self {
        self.softcap = softcap;
        self
    }
    /// The KV cache's element type (since 0.5); `KvDtype::Same` = dtype.
    pub fn kv_dtype(mut self, kv: KvDtype) -> Self {
        self.kv_dtype = kv;
        self
    }
    /// Q's element type (since 0.6); `KvDtype::Same` = dtype. E4M3 / E5M2
    /// need an fp8 `kv_dtype` (else InvalidArgument): the fp8 forward
    /// (`Runtime::forward_fp8` only), O stays dtype (F16 or BF16).
    pub fn q_dtype(mut self, q: KvDtype) -> Self {
        self.q_dtype = q;
        self
    }

    /// Validates and creates the config (fa_config_create).
    pub fn build(self) -> Result<Config> {
        let desc = sys::fa_config_desc {
            dtype: match self.dtype {
                Dtype::F16 => sys::FA_DTYPE_FP16,
                Dtype::BF16 => sys::FA_DTYPE_BF16,
                Dtype::F32 => sys::FA_DTYPE_FP32,
            },
            head_dim: self.head_dim,
            head_dim_v: self.head_dim_v,
            num_heads_q: self.num_heads_q,
            num_heads_kv: self.num_heads_kv,
            causal: self.causal as i32,
            window_left: self.window_left,
            window_right: self.window_right,
            softmax_scale: self.softmax_scale,
            softcap: self.softcap,
            kv_dtype: self.kv_dtype.to_sys(),
            q_dtype: self.q_dtype.to_sys(),
            ..Default::default()
        };
        let mut cfg = std::ptr::null_mut();
        // SAFETY: desc is a valid, correctly sized struct; cfg an out pointer.
        check(unsafe { sys::fa_config_create(&desc, &mut cfg) })?;
        let raw = NonNull::new(cfg)
            .ok_or_else(|| Error::new(Status::Internal, "fa_config_create returned NULL"))?;
        Ok(Config {
            raw,
            dtype: self.dtype,
            kv_dtype: self.kv_dtype,
            q_dtype: self.q_dtype,
            head_dim: self.head_dim,
            head_dim_v: if self.head_dim_v == 0 { self.head_dim } else { self.head_dim_v },
            num_heads_q: self.num_heads_q,
            num_heads_kv: self.num_heads_kv,
        })
    }
}

/// A validated attention problem family (device-independent, immutable).
/// Shareable between threads and runtimes.
///
/// `fa_config_destroy` runs in `Drop`, which needs the `Config` itself: it
/// cannot happen while a call borrows `&Config` (share one between threads
/// by reference in a scope, or in an `Arc`, whose last owner drops it).
///
/// ```compile_fail,E0505
/// use flashattn::{Backend, Config, Runtime};
/// let rt = Runtime::builder().backend(Backend::Emulator).build().unwrap();
/// let cfg = Config::builder().head_dim(32).heads(2, 2).build().unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| cfg.generate(flashattn::KernelKind::Forward, 80));
///     drop(cfg); // error[E0505]: cannot move out of `cfg` because it is borrowed
/// });
/// # drop(rt);
/// ```
///
/// ```no_run
/// use flashattn::{Backend, Config, Runtime};
/// let rt = Runtime::builder().backend(Backend::Emulator).build().unwrap();
/// let cfg = Config::builder().head_dim(32).heads(2, 2).build().unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| cfg.generate(flashattn::KernelKind::Forward, 80));
/// });
/// drop(cfg);
/// # drop(rt);
/// ```
///
/// It is not `Clone` (a copy of the handle would be destroyed twice):
///
/// ```compile_fail,E0599
/// let cfg = flashattn::Config::builder().head_dim(32).heads(2, 2).build().unwrap();
/// let copy = cfg.clone(); // error[E0599]: no method named `clone`
/// ```
#[derive(Debug)]
pub struct Config {
    raw: NonNull<sys::fa_config>,
    dtype: Dtype,
    kv_dtype: KvDtype,
    q_dtype: KvDtype,
    head_dim: i32,
    head_dim_v: i32,
    num_heads_q: i32,
    num_heads_kv: i32,
}

// SAFETY: a config is immutable once created and the C API allows its use
// from any thread; destroy happens only in Drop.
unsafe impl Send for Config {}
unsafe impl Sync for Config {}

impl Drop for Config {
    fn drop(&mut self) {
        // SAFETY: created by fa_config_create, destroyed once.
        unsafe { sys::fa_config_destroy(self.raw.as_ptr()) }
    }
}

impl Config {
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// The C handle, for calls through flashattn-sys. Valid while self lives.
    pub fn as_raw(&self) -> *const sys::fa_config {
        self.raw.as_ptr()
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    /// The KV cache's element type (since 0.5).
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }
    /// Q's element type (since 0.6).
    pub fn q_dtype(&self) -> KvDtype {
        self.q_dtype
    }
    /// Bytes per Q element: 1 for an fp8 Q, else the dtype's.
    pub fn q_elem_size(&self) -> usize {
        if self.q_dtype == KvDtype::Same {
            self.dtype.size()
        } else {
            1
        }
    }
    /// Bytes per K/V element: 1 for an fp8 cache, else the dtype's.
    pub fn kv_elem_size(&self) -> usize {
        if self.kv_dtype == KvDtype::Same {
            self.dtype.size()
        } else {
            1
        }
    }
    pub fn head_dim(&self) -> usize {
        self.head_dim as usize
    }
    /// head_dim_v with 0 resolved to head_dim.
    pub fn head_dim_v(&self) -> usize {
        self.head_dim_v as usize
    }
    pub fn num_heads_q(&self) -> usize {
        self.num_heads_q as usize
    }
    pub fn num_heads_kv(&self) -> usize {
        self.num_heads_kv as usize
    }

    /// The PTX module for `kind` on SM `sm`; see `generate`.
    pub fn generate(&self, kind: KernelKind, sm: i32) -> Result<String> {
        generate(self, kind, sm)
    }
}

/// The PTX the runtime would use for `kind` of `cfg` on SM `sm` (80, 86, 89,
/// 90); needs no GPU (fa_generate).
pub fn generate(cfg: &Config, kind: KernelKind, sm: i32) -> Result<String> {
    let mut size = 0usize;
    // SAFETY: size query with buf NULL / size 0.
    check(unsafe {
        sys::fa_generate(cfg.as_raw(), kind.to_raw(), sm, std::ptr::null_mut(), 0, &mut size)
    })?;
    let mut buf = vec![0u8; size + 1];
    // SAFETY: buf holds size + 1 bytes.
    check(unsafe {
        sys::fa_generate(
            cfg.as_raw(),
            kind.to_raw(),
            sm,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut size,
        )
    })?;
    buf.truncate(size);
    String::from_utf8(buf)
        .map_err(|_| Error::new(Status::Internal, "fa_generate: PTX is not UTF-8"))
}

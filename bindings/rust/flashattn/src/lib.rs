//! Safe Rust bindings of flashattn, an embeddable FlashAttention runtime
//! (PTX kernels generated at run time, JIT-compiled through the CUDA driver
//! or run on a CPU PTX emulator, cached on disk).
//!
//! ```no_run
//! use flashattn::{Backend, Config, ForwardArgs, Runtime, Tensor, TensorMut};
//! # fn main() -> flashattn::Result<()> {
//! let rt = Runtime::builder().backend(Backend::Emulator).build()?;
//! let cfg = Config::builder().head_dim(64).heads(8, 8).causal(true).build()?;
//! let shape = [1, 128, 8, 64]; // [batch, seqlen, heads, head_dim]
//! let n: usize = shape.iter().product();
//! let x = flashattn::f32_slice_to_f16(&vec![0.5; n]);
//! let (q, k, v) = (rt.alloc_from(&x)?, rt.alloc_from(&x)?, rt.alloc_from(&x)?);
//! let mut o = rt.alloc(2 * n)?;
//! rt.forward(&cfg, ForwardArgs { batch: 1, seqlen_q: 128, seqlen_k: 128,
//!     q: Tensor::contiguous(&q, shape), k: Tensor::contiguous(&k, shape),
//!     v: Tensor::contiguous(&v, shape), o: TensorMut::contiguous(&mut o, shape), lse: None,
//!     workspace: None })?;
//! let out = flashattn::f16_slice_to_f32(&o.to_vec::<u16>()?);
//! # Ok(()) }
//! ```
//!
//! Every failure is an [`Error`] with the C status and the library's message.
//! Safe calls check tensor extents against their [`DeviceBuffer`]s; the
//! `*_raw` unsafe calls take device pointers as `u64` for other allocators.
//! [`Runtime::decode_kv`] and [`Runtime::forward_kv`] read paged and
//! pointer-array KV caches ([`KvCache`]; see examples/paged_decode.rs).
//! [`cache_warm`] fills a kernel cache with no GPU for the SMs a fleet runs
//! (since 0.7).

mod cache;
mod config;
mod error;
mod half;
mod ops;
mod runtime;
mod warm;

pub use flashattn_sys as sys;

pub use cache::{CacheEntry, CacheStats, CompilerMode};
pub use config::{generate, Config, ConfigBuilder, Dtype, KernelKind, KvDtype};
pub use error::{Error, Result, Status};
pub use half::{
    bf16_bits_to_f32, f16_bits_to_f32, f16_slice_to_f32, f32_slice_to_f16, f32_to_bf16_bits,
    f32_to_f16_bits,
};
pub use ops::{
    contiguous_strides, pack_tree_mask, Alibi, BackwardArgs, DecodeArgs, DecodeKvArgs, DecodePlan,
    Descales, ForwardArgs, ForwardKvArgs, KvAppend, KvCache, KvLayout, LseFormat, PagedKv,
    RawBackwardArgs, RawDecodeArgs, RawForwardArgs, RawKvLayout, RawReduceArgs, RawTensor,
    ReduceArgs, Rotary, SeqKv, Tensor, TensorMut, TreeMask, View, ViewMut,
};
pub use runtime::{
    version_number, version_string, Backend, CacheMode, DeviceBuffer, Element, PtxCompiler,
    Runtime, RuntimeBuilder, RuntimeInfo,
};
pub use warm::{
    cache_warm, cache_warm_preset, cache_warm_presets, cache_warm_with_progress, parse_sms,
    WarmCounts, WarmOptions, WarmProgress,
};

#[cfg(test)]
mod thread_safety {
    fn assert_send_sync<T: Send + Sync>() {}
    #[test]
    fn handles_are_send_and_sync() {
        assert_send_sync::<super::Runtime>();
        assert_send_sync::<super::Config>();
        assert_send_sync::<super::DeviceBuffer>();
        assert_send_sync::<super::Error>();
    }
}

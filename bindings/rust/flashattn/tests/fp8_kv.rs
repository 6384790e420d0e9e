//! fp8 KV cache (C API 0.5: `KvDtype`, `decode_kv_fp8` with `Descales`)
//! beyond tests/features/fp8_kv.cases (features.rs): the Config's kv_dtype
//! getter, a descale buffer shorter than [batch, num_heads_kv] rejected by
//! the bindings, and Unsupported on an sm_80 emulator (no fp8 conversion).
mod common;

use common::emulator_sm;
use flashattn::{
    Config, DecodeKvArgs, Descales, DeviceBuffer, KvCache, KvDtype, Runtime, Status, Tensor,
    TensorMut,
};

const B: usize = 2;
const SQ: usize = 2;
const SK: usize = 80;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 64;

/// An fp8 decode on `rt` over zeroed buffers with these descales.
fn decode(rt: &Runtime, cfg: &Config, ds: &[f32], strides: [i64; 2]) -> flashattn::Result<()> {
    let q = rt.alloc(2 * B * SQ * HQ * D)?;
    let kv: DeviceBuffer = rt.alloc(B * SK * HKV * D)?;
    let lens = rt.alloc_from(&[SK as i32, 50])?;
    let d = rt.alloc_from(ds)?;
    let mut o = rt.alloc(2 * B * SQ * HQ * D)?;
    let args = DecodeKvArgs {
        batch: B,
        seqlen_q: SQ,
        seqlen_k_max: SK,
        q: Tensor::contiguous(&q, [B, SQ, HQ, D]),
        kv: KvCache::Contiguous {
            k: Tensor::contiguous(&kv, [B, SK, HKV, D]),
            v: Tensor::contiguous(&kv, [B, SK, HKV, D]),
        },
        cache_seqlens: &lens,
        num_splits: 0,
        batch_invariant: false,
        workspace: None,
        o: Some(TensorMut::contiguous(&mut o, [B, SQ, HQ, D])),
        lse: None,
    };
    rt.decode_kv_fp8(cfg, args, Descales { k: Some(&d), v: Some(&d), strides }).map(|_| ())
}

#[test]
fn fp8_kv_bad_arguments() {
    let cfg = Config::builder().head_dim(D as i32).heads(HQ as i32, HKV as i32);
    let cfg = cfg.kv_dtype(KvDtype::E4M3).build().unwrap();
    assert_eq!(cfg.kv_dtype(), KvDtype::E4M3);
    let rt = emulator_sm(89);
    decode(&rt, &cfg, &[0.01; B * HKV], [HKV as i64, 1]).unwrap();
    // A descale buffer shorter than [batch, num_heads_kv] is rejected.
    let e = decode(&rt, &cfg, &[0.01], [HKV as i64, 1]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.message.contains("flashattn-rs: k_descale"), "{e}");
    // No fp8 conversion below sm_89.
    let e = decode(&emulator_sm(80), &cfg, &[0.01], [0, 0]).unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
}

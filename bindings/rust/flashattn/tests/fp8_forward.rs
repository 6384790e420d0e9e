//! The fp8 forward (C API 0.6: `ConfigBuilder::q_dtype`, `forward_fp8` with a
//! Q descale and `Descales`) beyond tests/features/fp8_forward.cases
//! (features.rs, the numerics): the Config's getters and bad arguments (an
//! fp8 Q without an fp8 K/V, a short descale, sm_80).
mod common;

use flashattn::{
    Config, Descales, DeviceBuffer, Dtype, ForwardKvArgs, KvCache, KvDtype, Runtime, Status,
    Tensor, TensorMut,
};

const B: usize = 2;
const SQ: usize = 40;
const SK: usize = 70;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 64;

fn runtime(sm: i32) -> Runtime {
    common::emulator_sm(sm)
}

fn args<'a>(b: [&'a DeviceBuffer; 3], o: &'a mut DeviceBuffer) -> ForwardKvArgs<'a> {
    ForwardKvArgs {
        batch: B,
        seqlen_q: SQ,
        seqlen_k: SK,
        q: Tensor::contiguous(b[0], [B, SQ, HQ, D]),
        kv: KvCache::Contiguous {
            k: Tensor::contiguous(b[1], [B, SK, HKV, D]),
            v: Tensor::contiguous(b[2], [B, SK, HKV, D]),
        },
        seqused_k: None,
        o: TensorMut::contiguous(o, [B, SQ, HQ, D]),
        lse: None,
        workspace: None,
    }
}

#[test]
fn fp8_forward_bad_arguments() {
    // An fp8 Q needs an fp8 K and V.
    let e = Config::builder().head_dim(64).heads(2, 2).q_dtype(KvDtype::E4M3).build();
    assert_eq!(e.unwrap_err().status, Status::InvalidArgument);
    let cfg = Config::builder().head_dim(D as i32).heads(HQ as i32, HKV as i32).dtype(Dtype::BF16);
    let cfg = cfg.q_dtype(KvDtype::E5M2).kv_dtype(KvDtype::E4M3).build().unwrap();
    assert_eq!(
        (cfg.q_dtype(), cfg.kv_dtype(), cfg.q_elem_size()),
        (KvDtype::E5M2, KvDtype::E4M3, 1)
    );
    // A descale buffer shorter than [batch, num_heads_kv] is rejected first.
    let rt = runtime(89);
    let q = rt.alloc(B * SQ * HQ * D).unwrap();
    let kv = rt.alloc(B * SK * HKV * D).unwrap();
    let mut o = rt.alloc(2 * B * SQ * HQ * D).unwrap();
    let (short, full) =
        (rt.alloc_from(&[0.01f32]).unwrap(), rt.alloc_from(&[0.01f32; B * HKV]).unwrap());
    let per_head = Descales { k: Some(&full), v: Some(&full), strides: [HKV as i64, 1] };
    let e = rt.forward_fp8(&cfg, args([&q, &kv, &kv], &mut o), Some(&short), per_head);
    let e = e.unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.message.contains("flashattn-rs: q_descale"), "{e}");
    // No fp8 mma below sm_89.
    let rt = runtime(80);
    let cfg = Config::builder().head_dim(D as i32).heads(HQ as i32, HKV as i32);
    let cfg = cfg.q_dtype(KvDtype::E4M3).kv_dtype(KvDtype::E4M3).build().unwrap();
    let q = rt.alloc(B * SQ * HQ * D).unwrap();
    let kv = rt.alloc(B * SK * HKV * D).unwrap();
    let mut o = rt.alloc(2 * B * SQ * HQ * D).unwrap();
    let none = Descales { k: None, v: None, strides: [0, 0] };
    let e = rt.forward_fp8(&cfg, args([&q, &kv, &kv], &mut o), None, none).unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{}", e.message);
    assert!(e.message.contains("sm_89"), "{}", e.message);
}

//! fp8 KV cache (C API 0.5: `KvDtype`, `decode_kv_fp8` with `Descales`) on an
//! sm_89 emulator: e4m3 and e5m2 bytes with per-(batch, KV head) and
//! per-tensor descales against an f64 reference over the values the bytes
//! hold (decoded here from the formats' definitions), outputs poisoned
//! first; Unsupported on sm_80; a too-short descale buffer rejected.
mod common;

use common::{fp8_value, max_abs_err, quantize, reference, Problem, Rng};
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

fn runtime(sm: i32) -> Runtime {
    common::emulator_sm(sm)
}

/// Contiguous decode arguments over q, k, v and cache_seqlens (`b`).
fn args<'a>(
    b: [&'a DeviceBuffer; 4],
    o: &'a mut DeviceBuffer,
    lse: &'a mut DeviceBuffer,
) -> DecodeKvArgs<'a> {
    DecodeKvArgs {
        batch: B,
        seqlen_q: SQ,
        seqlen_k_max: SK,
        q: Tensor::contiguous(b[0], [B, SQ, HQ, D]),
        kv: KvCache::Contiguous {
            k: Tensor::contiguous(b[1], [B, SK, HKV, D]),
            v: Tensor::contiguous(b[2], [B, SK, HKV, D]),
        },
        cache_seqlens: b[3],
        num_splits: 2,
        batch_invariant: false,
        workspace: None,
        o: Some(TensorMut::contiguous(o, [B, SQ, HQ, D])),
        lse: Some(lse),
    }
}

fn run(e5m2: bool, per_head: bool) {
    let rt = runtime(89);
    let kvd = if e5m2 { KvDtype::E5M2 } else { KvDtype::E4M3 };
    let cfg = Config::builder().head_dim(D as i32).heads(HQ as i32, HKV as i32).causal(true);
    let cfg = cfg.kv_dtype(kvd).build().unwrap();
    assert_eq!(cfg.kv_dtype(), kvd);
    let mut rng = Rng::new(if e5m2 { 91 } else { 90 });
    let (qb, qv) = rng.f16_tensor(B * SQ * HQ * D);
    let fmax = if e5m2 { 57344.0 } else { 448.0 };
    let nd = if per_head { B * HKV } else { 1 };
    let kd: Vec<f32> = (0..nd).map(|_| 2.0 / fmax * rng.uniform(0.5, 2.0)).collect();
    let vd: Vec<f32> = (0..nd).map(|_| 2.0 / fmax * rng.uniform(0.5, 2.0)).collect();
    let lens = [SK, 50];
    let mut cache = |ds: &[f32]| {
        let mut codes = vec![0x7fu8; B * SK * HKV * D]; // NaN past a sequence
        let mut vals = vec![0f32; codes.len()];
        for b in 0..B {
            for s in 0..lens[b] {
                for h in 0..HKV {
                    let d = ds[if per_head { b * HKV + h } else { 0 }] as f64;
                    for x in 0..D {
                        let i = ((b * SK + s) * HKV + h) * D + x;
                        codes[i] = quantize(rng.uniform(-2.0, 2.0) as f64 / d, e5m2);
                        vals[i] = (fp8_value(codes[i], e5m2) * d) as f32;
                    }
                }
            }
        }
        (codes, vals)
    };
    let (kc, kv) = cache(&kd);
    let (vc, vv) = cache(&vd);
    let (q, k, v) =
        (rt.alloc_from(&qb).unwrap(), rt.alloc_from(&kc).unwrap(), rt.alloc_from(&vc).unwrap());
    let (kdb, vdb) = (rt.alloc_from(&kd).unwrap(), rt.alloc_from(&vd).unwrap());
    let dl = rt.alloc_from(&[lens[0] as i32, lens[1] as i32]).unwrap();
    let mut o = rt.alloc(2 * B * SQ * HQ * D).unwrap();
    let mut lse = rt.alloc(4 * B * HQ * SQ).unwrap();
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    let strides = if per_head { [HKV as i64, 1] } else { [0, 0] };
    let ds = Descales { k: Some(&kdb), v: Some(&vdb), strides };
    rt.decode_kv_fp8(&cfg, args([&q, &k, &v, &dl], &mut o, &mut lse), ds).unwrap();
    let p = Problem {
        batch: B,
        seqlen_q: SQ,
        seqlen_k: SK,
        hq: HQ,
        hkv: HKV,
        d: D,
        dv: D,
        causal: true,
        scale: 1.0 / (D as f64).sqrt(),
    };
    let (ro, rl) = reference(&p, &qv, &kv, &vv, &lens);
    let got = flashattn::f16_slice_to_f32(&o.to_vec::<u16>().unwrap());
    let err = max_abs_err(&got, &ro);
    assert!(err <= 4e-3, "o max abs error {err}");
    for (g, w) in lse.to_vec::<f32>().unwrap().iter().zip(&rl) {
        assert!((*g as f64 - w).abs() <= 2e-3 * w.abs().max(1.0), "lse {g} vs {w}");
    }
    // A descale buffer shorter than [batch, num_heads_kv] is rejected.
    if per_head {
        let short = rt.alloc_from(&kd[..1]).unwrap();
        let ds = Descales { k: Some(&short), v: None, strides };
        let e = rt.decode_kv_fp8(&cfg, args([&q, &k, &v, &dl], &mut o, &mut lse), ds).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument);
    }
    // No fp8 conversion below sm_89.
    let rt80 = runtime(80);
    let (q8, k8, v8, d8) = (
        rt80.alloc_from(&qb).unwrap(),
        rt80.alloc_from(&kc).unwrap(),
        rt80.alloc_from(&vc).unwrap(),
        rt80.alloc_from(&[lens[0] as i32, lens[1] as i32]).unwrap(),
    );
    let mut o8 = rt80.alloc(2 * B * SQ * HQ * D).unwrap();
    let e = rt80
        .decode_kv_fp8(
            &cfg,
            DecodeKvArgs {
                batch: B,
                seqlen_q: SQ,
                seqlen_k_max: SK,
                q: Tensor::contiguous(&q8, [B, SQ, HQ, D]),
                kv: KvCache::Contiguous {
                    k: Tensor::contiguous(&k8, [B, SK, HKV, D]),
                    v: Tensor::contiguous(&v8, [B, SK, HKV, D]),
                },
                cache_seqlens: &d8,
                num_splits: 0,
                batch_invariant: false,
                workspace: None,
                o: Some(TensorMut::contiguous(&mut o8, [B, SQ, HQ, D])),
                lse: None,
            },
            Descales { k: None, v: None, strides: [0, 0] },
        )
        .unwrap_err();
    assert_eq!(e.status, Status::Unsupported);
}

#[test]
fn fp8_e4m3_per_head_descales() {
    run(false, true);
}

#[test]
fn fp8_e5m2_per_tensor_descales() {
    run(true, false);
}

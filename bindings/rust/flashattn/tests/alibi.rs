//! ALiBi (C API 0.5) on the emulator: `forward_kv_alibi` (one row of slopes
//! for the batch) and `decode_kv_alibi` (per-sequence slopes, 3 splits)
//! against an f64 reference with the bias |i + sk - sq - j| computed here,
//! outputs poisoned first; a sequence with no key (O = 0, LSE = -inf);
//! slopes too short rejected.
mod common;

use common::{emulator, max_abs_err, Rng};
use flashattn::{Alibi, Config, DecodeKvArgs, ForwardKvArgs, KvCache, Tensor, TensorMut};

const B: usize = 2;
const SQ: usize = 3;
const SK: usize = 150;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 32;

/// f64 causal attention with ALiBi: slopes [HQ] (stride 0) or [B, HQ].
fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    lens: &[usize],
    slopes: &[f32],
    stride: usize,
) -> (Vec<f64>, Vec<f64>) {
    let scale = 1.0 / (D as f64).sqrt();
    let mut o = vec![0.0; B * SQ * HQ * D];
    let mut lse = vec![f64::NEG_INFINITY; B * HQ * SQ];
    for b in 0..B {
        let sk = lens[b];
        for h in 0..HQ {
            let slope = slopes[b * stride + h] as f64;
            let hk = h / (HQ / HKV);
            for i in 0..SQ {
                let diag = i as i64 + sk as i64 - SQ as i64;
                let keys: Vec<usize> = (0..sk).filter(|&j| j as i64 <= diag).collect();
                if keys.is_empty() {
                    continue;
                }
                let s: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let mut dot = 0.0;
                        for c in 0..D {
                            dot += q[((b * SQ + i) * HQ + h) * D + c] as f64
                                * k[((b * SK + j) * HKV + hk) * D + c] as f64;
                        }
                        dot * scale - slope * (diag - j as i64).abs() as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for (t, &j) in keys.iter().enumerate() {
                    let w = (s[t] - m).exp() / l;
                    for c in 0..D {
                        o[((b * SQ + i) * HQ + h) * D + c] +=
                            w * v[((b * SK + j) * HKV + hk) * D + c] as f64;
                    }
                }
                lse[(b * HQ + h) * SQ + i] = m + l.ln();
            }
        }
    }
    (o, lse)
}

fn check(o: &flashattn::DeviceBuffer, lse: &flashattn::DeviceBuffer, want: &(Vec<f64>, Vec<f64>)) {
    let got = flashattn::f16_slice_to_f32(&o.to_vec::<u16>().unwrap());
    let err = max_abs_err(&got, &want.0);
    assert!(err <= 4e-3, "o max abs error {err}");
    for (g, w) in lse.to_vec::<f32>().unwrap().iter().zip(&want.1) {
        if w.is_finite() {
            assert!((*g as f64 - w).abs() <= 2e-3 * w.abs().max(1.0), "lse {g} vs {w}");
        } else {
            assert!(*g == f32::NEG_INFINITY, "lse {g} for a row with no key");
        }
    }
}

#[test]
fn alibi_forward_and_decode() {
    let rt = emulator();
    let cfg = Config::builder().head_dim(D as i32).heads(HQ as i32, HKV as i32).causal(true);
    let cfg = cfg.build().unwrap();
    let mut rng = Rng::new(81);
    let (qb, qv) = rng.f16_tensor(B * SQ * HQ * D);
    let (kb, kv) = rng.f16_tensor(B * SK * HKV * D);
    let (vb, vv) = rng.f16_tensor(B * SK * HKV * D);
    let slopes: Vec<f32> = (0..B * HQ).map(|_| rng.uniform(0.05, 0.5)).collect();
    let (q, k, v) =
        (rt.alloc_from(&qb).unwrap(), rt.alloc_from(&kb).unwrap(), rt.alloc_from(&vb).unwrap());
    let s = rt.alloc_from(&slopes).unwrap();
    let mut o = rt.alloc(2 * B * SQ * HQ * D).unwrap();
    let mut lse = rt.alloc(4 * B * HQ * SQ).unwrap();

    // Forward, one row of slopes (the first HQ) for the batch.
    let want = reference(&qv, &kv, &vv, &[SK; B], &slopes, 0);
    let plain = reference(&qv, &kv, &vv, &[SK; B], &[0.0; HQ], 0);
    assert!(max_abs_err(&want.0.iter().map(|&x| x as f32).collect::<Vec<_>>(), &plain.0) > 0.05);
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    rt.forward_kv_alibi(
        &cfg,
        ForwardKvArgs {
            batch: B,
            seqlen_q: SQ,
            seqlen_k: SK,
            q: Tensor::contiguous(&q, [B, SQ, HQ, D]),
            kv: KvCache::Contiguous {
                k: Tensor::contiguous(&k, [B, SK, HKV, D]),
                v: Tensor::contiguous(&v, [B, SK, HKV, D]),
            },
            seqused_k: None,
            o: TensorMut::contiguous(&mut o, [B, SQ, HQ, D]),
            lse: Some(&mut lse),
        },
        None,
        Alibi { slopes: &s, per_sequence: false },
    )
    .unwrap();
    check(&o, &lse, &want);

    // Decode with 3 splits and per-sequence slopes; sequence 1 is empty.
    let lens = [SK, 0];
    let dl = rt.alloc_from(&[SK as i32, 0]).unwrap();
    let want = reference(&qv, &kv, &vv, &lens, &slopes, HQ);
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    let plan = rt
        .decode_kv_alibi(
            &cfg,
            DecodeKvArgs {
                batch: B,
                seqlen_q: SQ,
                seqlen_k_max: SK,
                q: Tensor::contiguous(&q, [B, SQ, HQ, D]),
                kv: KvCache::Contiguous {
                    k: Tensor::contiguous(&k, [B, SK, HKV, D]),
                    v: Tensor::contiguous(&v, [B, SK, HKV, D]),
                },
                cache_seqlens: &dl,
                num_splits: 3,
                batch_invariant: false,
                workspace: None,
                o: Some(TensorMut::contiguous(&mut o, [B, SQ, HQ, D])),
                lse: Some(&mut lse),
            },
            None,
            None,
            Alibi { slopes: &s, per_sequence: true },
        )
        .unwrap();
    assert!(plan.num_splits >= 2);
    check(&o, &lse, &want);

    // Per-sequence slopes shorter than [B, HQ] are rejected before anything runs.
    let short = rt.alloc_from(&slopes[..HQ]).unwrap();
    let e = rt
        .forward_kv_alibi(
            &cfg,
            ForwardKvArgs {
                batch: B,
                seqlen_q: SQ,
                seqlen_k: SK,
                q: Tensor::contiguous(&q, [B, SQ, HQ, D]),
                kv: KvCache::Contiguous {
                    k: Tensor::contiguous(&k, [B, SK, HKV, D]),
                    v: Tensor::contiguous(&v, [B, SK, HKV, D]),
                },
                seqused_k: None,
                o: TensorMut::contiguous(&mut o, [B, SQ, HQ, D]),
                lse: None,
            },
            None,
            Alibi { slopes: &short, per_sequence: true },
        )
        .unwrap_err();
    assert!(e.to_string().contains("alibi_slopes"), "{e}");
}

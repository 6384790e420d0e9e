//! Attention sinks (gpt-oss; C API 0.4.1) on the emulator: `forward_kv_sinks`,
//! `decode_kv_sinks` (with splits) and `decode_reduce_sinks` against an f64
//! reference built from the plain softmax (the sink is one more term
//! e^sink[h] of each row's denominator, with no value: LSE' = logaddexp(LSE,
//! sink), O' = O e^(LSE - LSE')), outputs poisoned first; rows with no key
//! (O = 0, LSE = sink); too-short sinks rejected.
mod common;

use common::{emulator, max_abs_err, reference, Problem, Rng};
use flashattn::{
    Config, DecodeKvArgs, ForwardKvArgs, KvCache, LseFormat, ReduceArgs, Tensor, TensorMut, View,
};

const B: usize = 2;
const SQ: usize = 3;
const SK: usize = 200;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 32;

/// (o, lse) of the plain softmax -> with sinks.
fn with_sinks(o: &[f64], lse: &[f64], sinks: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let mut o2 = o.to_vec();
    let mut lse2 = lse.to_vec();
    for b in 0..B {
        for h in 0..HQ {
            for i in 0..SQ {
                let li = (b * HQ + h) * SQ + i;
                let (l, s) = (lse[li], sinks[h] as f64);
                let m = l.max(s);
                let new = m + ((l - m).exp() + (s - m).exp()).ln();
                lse2[li] = new;
                let f = if l.is_finite() { (l - new).exp() } else { 0.0 };
                for x in &mut o2[((b * SQ + i) * HQ + h) * D..][..D] {
                    *x *= f;
                }
            }
        }
    }
    (o2, lse2)
}

fn check(o: &flashattn::DeviceBuffer, lse: &flashattn::DeviceBuffer, want: &(Vec<f64>, Vec<f64>)) {
    let got = flashattn::f16_slice_to_f32(&o.to_vec::<u16>().unwrap());
    let err = max_abs_err(&got, &want.0);
    assert!(err <= 4e-3, "o max abs error {err}");
    for (g, w) in lse.to_vec::<f32>().unwrap().iter().zip(&want.1) {
        assert!((*g as f64 - w).abs() <= 2e-3 * w.abs().max(1.0), "lse {g} vs {w}");
    }
}

#[test]
fn sinks_forward_decode_reduce() {
    let rt = emulator();
    let cfg = Config::builder().head_dim(D as i32).heads(HQ as i32, HKV as i32).causal(true);
    let cfg = cfg.build().unwrap();
    let mut rng = Rng::new(71);
    let (qb, qv) = rng.f16_tensor(B * SQ * HQ * D);
    let (kb, kv) = rng.f16_tensor(B * SK * HKV * D);
    let (vb, vv) = rng.f16_tensor(B * SK * HKV * D);
    let sinks: Vec<f32> = (0..HQ).map(|_| rng.uniform(-1.0, 3.0)).collect();
    let (q, k, v) =
        (rt.alloc_from(&qb).unwrap(), rt.alloc_from(&kb).unwrap(), rt.alloc_from(&vb).unwrap());
    let s = rt.alloc_from(&sinks).unwrap();
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
    let mut o = rt.alloc(2 * B * SQ * HQ * D).unwrap();
    let mut lse = rt.alloc(4 * B * HQ * SQ).unwrap();

    // Forward: all keys.
    let (ro, rl) = reference(&p, &qv, &kv, &vv, &[SK; B]);
    let want = with_sinks(&ro, &rl, &sinks);
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    rt.forward_kv_sinks(
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
        &s,
    )
    .unwrap();
    check(&o, &lse, &want);

    // Decode with 3 splits; sequence 1 is empty (O = 0, LSE = sink).
    let lens = [SK, 0];
    let dl = rt.alloc_from(&[SK as i32, 0]).unwrap();
    let (ro, rl) = reference(&p, &qv, &kv, &vv, &lens);
    let want = with_sinks(&ro, &rl, &sinks);
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    let plan = rt
        .decode_kv_sinks(
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
            &s,
        )
        .unwrap();
    assert!(plan.num_splits >= 2);
    check(&o, &lse, &want);
    for h in 0..HQ {
        for i in 0..SQ {
            assert_eq!(lse.to_vec::<f32>().unwrap()[(HQ + h) * SQ + i], sinks[h]);
        }
    }

    // decode_reduce_sinks over one state per row (the plain softmax of the
    // forward): the sink joins once.
    let (ro, rl) = reference(&p, &qv, &kv, &vv, &[SK; B]);
    let want = with_sinks(&ro, &rl, &sinks);
    let op: Vec<f32> = ro.iter().map(|&x| x as f32).collect();
    let lp: Vec<f32> = rl.iter().map(|&x| x as f32).collect();
    let (op, lp) = (rt.alloc_from(&op).unwrap(), rt.alloc_from(&lp).unwrap());
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    rt.decode_reduce_sinks(
        &cfg,
        ReduceArgs {
            num_splits: 1,
            batch: B,
            seqlen_q: SQ,
            o_partial: View::contiguous(&op, [1, B, SQ, HQ, D]),
            lse_partial: View::contiguous(&lp, [1, B, HQ, SQ]),
            o: TensorMut::contiguous(&mut o, [B, SQ, HQ, D]),
            lse: Some(&mut lse),
        },
        LseFormat::Natural,
        LseFormat::Natural,
        &s,
    )
    .unwrap();
    check(&o, &lse, &want);

    // Sinks shorter than num_heads_q are rejected before anything runs.
    let short = rt.alloc_from(&sinks[..HQ - 1]).unwrap();
    let e = rt
        .decode_reduce_sinks(
            &cfg,
            ReduceArgs {
                num_splits: 1,
                batch: B,
                seqlen_q: SQ,
                o_partial: View::contiguous(&op, [1, B, SQ, HQ, D]),
                lse_partial: View::contiguous(&lp, [1, B, HQ, SQ]),
                o: TensorMut::contiguous(&mut o, [B, SQ, HQ, D]),
                lse: None,
            },
            LseFormat::Natural,
            LseFormat::Natural,
            &short,
        )
        .unwrap_err();
    assert!(e.to_string().contains("sinks"), "{e}");
}

//! Numerics on the emulator against an f64 reference: forward (MHA, GQA,
//! causal, rows with no key, head_dim_v != head_dim, head dims 576 / 512),
//! decode (cache_seqlens including 0, automatic and fixed splits), decode
//! without combine followed by decode_reduce, and the reduce formula on
//! host-made partial states.
mod common;

use common::{
    check_lse, decode_case, emulator, forward_case, forward_contiguous, max_abs_err,
    problem_config, reference, Problem, Rng,
};
use flashattn::{Config, DecodeArgs, Dtype, ReduceArgs, Tensor, TensorMut, View, ViewMut};

/// f32 Q/K/V/O (Dtype::F32): f32 buffers in and out; the reference runs on
/// the inputs rounded to bf16 as the kernel rounds them; O is not rounded.
#[test]
fn forward_f32() {
    let rt = emulator();
    let p = Problem {
        batch: 2,
        seqlen_q: 33,
        seqlen_k: 47,
        hq: 4,
        hkv: 2,
        d: 64,
        dv: 64,
        causal: true,
        scale: 0.125,
    };
    let mut rng = Rng::new(11);
    let mut gen = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect() };
    let (qf, kf, vf) = (
        gen(p.batch * p.seqlen_q * p.hq * p.d),
        gen(p.batch * p.seqlen_k * p.hkv * p.d),
        gen(p.batch * p.seqlen_k * p.hkv * p.dv),
    );
    let bf = |x: &[f32]| -> Vec<f32> {
        x.iter().map(|&y| flashattn::bf16_bits_to_f32(flashattn::f32_to_bf16_bits(y))).collect()
    };
    let cfg = problem_config(&p, Dtype::F32);
    let (q, k, v) =
        (rt.alloc_from(&qf).unwrap(), rt.alloc_from(&kf).unwrap(), rt.alloc_from(&vf).unwrap());
    let (o, lse) = forward_contiguous(&rt, &cfg, &p, &q, &k, &v, 4);
    let (want_o, want_lse) =
        reference(&p, &bf(&qf), &bf(&kf), &bf(&vf), &vec![p.seqlen_k; p.batch]);
    let got_o = o.to_vec::<f32>().unwrap();
    let err = max_abs_err(&got_o, &want_o);
    eprintln!("forward f32 {p:?}: o err {err}");
    assert!(err <= 4e-3, "{p:?}: o max abs error {err}"); // P in bf16: observed ~1e-3
    check_lse(&lse.to_vec::<f32>().unwrap(), &want_lse);
    // Written as f32: most outputs are not bf16 numbers.
    let rounded = got_o
        .iter()
        .filter(|&&x| flashattn::bf16_bits_to_f32(flashattn::f32_to_bf16_bits(x)) == x)
        .count();
    assert!(rounded * 4 < got_o.len(), "{rounded} of {} outputs are bf16 numbers", got_o.len());
}

#[test]
fn forward_mha_noncausal() {
    let rt = emulator();
    forward_case(
        &rt,
        Problem {
            batch: 2,
            seqlen_q: 40,
            seqlen_k: 40,
            hq: 2,
            hkv: 2,
            d: 32,
            dv: 32,
            causal: false,
            scale: 1.0 / 32f64.sqrt(),
        },
        1,
    );
}

#[test]
fn forward_gqa_causal_longer_keys() {
    let rt = emulator();
    forward_case(
        &rt,
        Problem {
            batch: 1,
            seqlen_q: 17,
            seqlen_k: 70,
            hq: 4,
            hkv: 2,
            d: 64,
            dv: 64,
            causal: true,
            scale: 0.2,
        },
        2,
    );
}

#[test]
fn forward_causal_rows_without_keys() {
    // seqlen_q > seqlen_k with causal: the first 12 queries see no key (O = 0, LSE = -inf).
    let rt = emulator();
    forward_case(
        &rt,
        Problem {
            batch: 1,
            seqlen_q: 20,
            seqlen_k: 8,
            hq: 2,
            hkv: 1,
            d: 16,
            dv: 32,
            causal: true,
            scale: 0.25,
        },
        3,
    );
}

#[test]
fn forward_mla_head_dims_576_512() {
    // Past 256 (0.5): Q/K 576 and V/O 512 (DeepSeek MLA's shape), four query
    // heads over one KV head, O computed in two column slices of 256.
    let rt = emulator();
    forward_case(
        &rt,
        Problem {
            batch: 1,
            seqlen_q: 33,
            seqlen_k: 60,
            hq: 4,
            hkv: 1,
            d: 576,
            dv: 512,
            causal: true,
            scale: 1.0 / 576f64.sqrt(),
        },
        4,
    );
}

#[test]
fn decode_with_empty_and_full_caches() {
    let rt = emulator();
    let p = Problem {
        batch: 3,
        seqlen_q: 1,
        seqlen_k: 160,
        hq: 4,
        hkv: 1,
        d: 32,
        dv: 32,
        causal: false,
        scale: 1.0 / 32f64.sqrt(),
    };
    decode_case(&rt, p, &[0, 37, 160], 0, 10);
    let plan = decode_case(&rt, p, &[5, 0, 129], 3, 11);
    assert!(plan.num_splits <= 3);
}

#[test]
fn decode_causal_two_queries() {
    let rt = emulator();
    let p = Problem {
        batch: 2,
        seqlen_q: 2,
        seqlen_k: 64,
        hq: 2,
        hkv: 2,
        d: 64,
        dv: 64,
        causal: true,
        scale: 0.125,
    };
    decode_case(&rt, p, &[1, 50], 2, 12);
}

#[test]
fn decode_partials_then_reduce_match_decode() {
    // decode with o = None leaves partial states in the workspace; reducing
    // them must give what decode's own combine gives.
    let rt = emulator();
    let (b, sq, sk, hq, d) = (2usize, 1usize, 256usize, 2usize, 32usize);
    let mut rng = Rng::new(20);
    let (qb, _) = rng.f16_tensor(b * sq * hq * d);
    let (kb, _) = rng.f16_tensor(b * sk * hq * d);
    let (vb, _) = rng.f16_tensor(b * sk * hq * d);
    let cfg = Config::builder().head_dim(d as i32).heads(hq as i32, hq as i32).build().unwrap();
    let (q, k, v) =
        (rt.alloc_from(&qb).unwrap(), rt.alloc_from(&kb).unwrap(), rt.alloc_from(&vb).unwrap());
    let lens = rt.alloc_from(&[200i32, 3]).unwrap();
    let shape_q = [b, sq, hq, d];
    let shape_k = [b, sk, hq, d];
    let args = |ws, o, lse| DecodeArgs {
        batch: b,
        seqlen_q: sq,
        seqlen_k_max: sk,
        q: Tensor::contiguous(&q, shape_q),
        k_cache: Tensor::contiguous(&k, shape_k),
        v_cache: Tensor::contiguous(&v, shape_k),
        cache_seqlens: &lens,
        num_splits: 4,
        workspace: ws,
        o,
        lse,
    };
    // Reference: decode with its own combine.
    let mut o_ref = rt.alloc(2 * b * sq * hq * d).unwrap();
    let mut lse_ref = rt.alloc(4 * b * hq * sq).unwrap();
    let plan = rt
        .decode(
            &cfg,
            args(None, Some(TensorMut::contiguous(&mut o_ref, shape_q)), Some(&mut lse_ref)),
        )
        .unwrap();
    let s = plan.num_splits as usize;
    assert!(s >= 2, "want several splits, got {s}");
    // Partial states only.
    let mut ws = rt.alloc(plan.workspace_bytes).unwrap();
    ws.fill_bytes(0xff).unwrap();
    let plan2 = rt.decode(&cfg, args(Some(&mut ws), None, None)).unwrap();
    assert_eq!(plan, plan2);
    let o_part_bytes = 4 * s * b * sq * hq * d;
    let lse_off = o_part_bytes.div_ceil(256) * 256;
    let mut o = rt.alloc(2 * b * sq * hq * d).unwrap();
    let mut lse = rt.alloc(4 * b * hq * sq).unwrap();
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    rt.decode_reduce(
        &cfg,
        ReduceArgs {
            num_splits: s,
            batch: b,
            seqlen_q: sq,
            o_partial: View::contiguous(&ws, [s, b, sq, hq, d]),
            lse_partial: View::contiguous(&ws, [s, b, hq, sq]).at_byte_offset(lse_off),
            o: TensorMut::contiguous(&mut o, shape_q),
            lse: Some(&mut lse),
        },
    )
    .unwrap();
    let got = flashattn::f16_slice_to_f32(&o.to_vec::<u16>().unwrap());
    let want: Vec<f64> = flashattn::f16_slice_to_f32(&o_ref.to_vec::<u16>().unwrap())
        .iter()
        .map(|&x| x as f64)
        .collect();
    assert!(max_abs_err(&got, &want) <= 1e-3);
    let want_lse: Vec<f64> = lse_ref.to_vec::<f32>().unwrap().iter().map(|&x| x as f64).collect();
    assert!(max_abs_err(&lse.to_vec::<f32>().unwrap(), &want_lse) <= 1e-5);
}

#[test]
fn reduce_follows_the_formula() {
    // Host-made partial states with padded strides, some -inf, one row all -inf.
    let rt = emulator();
    let (s, b, sq, hq, dv) = (3usize, 2usize, 2usize, 2usize, 16usize);
    let cfg = Config::builder().head_dim(dv as i32).heads(hq as i32, hq as i32).build().unwrap();
    // o_partial padded: each split's block gets 64 spare elements.
    let block = b * sq * hq * dv + 64;
    let o_strides = [block as i64, (sq * hq * dv) as i64, (hq * dv) as i64, dv as i64, 1];
    let lse_strides = [(b * hq * sq + 8) as i64, (hq * sq) as i64, sq as i64, 1];
    let mut rng = Rng::new(30);
    let mut o_part = vec![0f32; s * block];
    for x in o_part.iter_mut() {
        *x = rng.uniform(-1.0, 1.0);
    }
    let mut lse_part = vec![0f32; s * lse_strides[0] as usize];
    for x in lse_part.iter_mut() {
        *x = rng.uniform(-3.0, 3.0);
    }
    let li = |sp: usize, bb: usize, h: usize, t: usize| {
        sp * lse_strides[0] as usize
            + bb * lse_strides[1] as usize
            + h * lse_strides[2] as usize
            + t
    };
    lse_part[li(1, 0, 1, 0)] = f32::NEG_INFINITY; // one split weighs nothing
    for sp in 0..s {
        lse_part[li(sp, 1, 0, 1)] = f32::NEG_INFINITY; // row (b1, h0, t1) has no state
    }
    let mut want_o = vec![0f64; b * sq * hq * dv];
    let mut want_lse = vec![0f64; b * hq * sq];
    for bb in 0..b {
        for t in 0..sq {
            for h in 0..hq {
                let l: Vec<f64> = (0..s).map(|sp| lse_part[li(sp, bb, h, t)] as f64).collect();
                let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let out = &mut want_o[((bb * sq + t) * hq + h) * dv..][..dv];
                if m == f64::NEG_INFINITY {
                    want_lse[(bb * hq + h) * sq + t] = f64::NEG_INFINITY;
                    continue; // O = 0
                }
                let w: Vec<f64> = l.iter().map(|&x| (x - m).exp()).collect();
                let sum: f64 = w.iter().sum();
                want_lse[(bb * hq + h) * sq + t] = m + sum.ln();
                for (e, x) in out.iter_mut().enumerate() {
                    *x = (0..s)
                        .map(|sp| {
                            w[sp] * o_part[sp * block + ((bb * sq + t) * hq + h) * dv + e] as f64
                        })
                        .sum::<f64>()
                        / sum;
                }
            }
        }
    }
    let op = rt.alloc_from(&o_part).unwrap();
    let lp = rt.alloc_from(&lse_part).unwrap();
    let mut o = rt.alloc(2 * b * sq * hq * dv).unwrap();
    let mut lse = rt.alloc(4 * b * hq * sq).unwrap();
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    rt.decode_reduce(
        &cfg,
        ReduceArgs {
            num_splits: s,
            batch: b,
            seqlen_q: sq,
            o_partial: View::new(&op, o_strides),
            lse_partial: View::new(&lp, lse_strides),
            o: ViewMut::contiguous(&mut o, [b, sq, hq, dv]),
            lse: Some(&mut lse),
        },
    )
    .unwrap();
    let got = flashattn::f16_slice_to_f32(&o.to_vec::<u16>().unwrap());
    let err = max_abs_err(&got, &want_o);
    assert!(err <= 1e-3, "o max abs error {err}");
    check_lse(&lse.to_vec::<f32>().unwrap(), &want_lse);
    // The all -inf row: O exactly 0.
    let row = ((sq + 1) * hq) * dv;
    assert!(got[row..row + dv].iter().all(|&x| x == 0.0));
}

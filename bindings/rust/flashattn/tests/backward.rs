//! The training backward (fa_backward, C API 0.9) on the emulator: dQ, dK and
//! dV of a forward with GQA and causal masking (seqlen_q != seqlen_k) and of
//! one with attention sinks, element by element against an f64 host
//! computation (FlashAttention-2's Algorithm 2 over the forward's own O);
//! deterministic runs give the same bits; the bindings' and the library's
//! checks.
mod common;

use common::{emulator, Rng};
use flashattn::{
    BackwardArgs, Config, DeviceBuffer, ForwardArgs, Runtime, Status, Tensor, TensorMut,
};

struct Shape {
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
}

/// f64 gradients (dq, dk, dv, dsinks) of O = softmax(scale q k^T (+ causal
/// mask, bottom-right)) v for upstream `dout`, D_i from the forward's `o`.
#[allow(clippy::too_many_arguments)]
fn host_backward(
    s: &Shape,
    causal: bool,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &[f32],
    dout: &[f32],
    sinks: Option<&[f32]>,
) -> [Vec<f64>; 4] {
    let Shape { b: nb, sq, sk, hq, hkv, d } = *s;
    let scale = 1.0 / (d as f64).sqrt();
    let g = hq / hkv;
    let iq = |b: usize, i: usize, h: usize| ((b * sq + i) * hq + h) * d;
    let ik = |b: usize, j: usize, h: usize| ((b * sk + j) * hkv + h) * d;
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let mut dsinks = vec![0.0; hq];
    for b in 0..nb {
        for h in 0..hq {
            let hk = h / g;
            for i in 0..sq {
                let seen: Vec<usize> = (0..sk).filter(|&j| !causal || j + sq <= i + sk).collect();
                let x: Vec<f64> = seen
                    .iter()
                    .map(|&j| {
                        scale
                            * (0..d)
                                .map(|c| q[iq(b, i, h) + c] as f64 * k[ik(b, j, hk) + c] as f64)
                                .sum::<f64>()
                    })
                    .collect();
                let mut m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if let Some(sk_) = sinks {
                    m = m.max(sk_[h] as f64);
                }
                let mut den: f64 = x.iter().map(|&t| (t - m).exp()).sum();
                if let Some(sk_) = sinks {
                    den += (sk_[h] as f64 - m).exp();
                }
                let row_d: f64 =
                    (0..d).map(|c| dout[iq(b, i, h) + c] as f64 * o[iq(b, i, h) + c] as f64).sum();
                if let Some(sk_) = sinks {
                    dsinks[h] -= (sk_[h] as f64 - m).exp() / den * row_d;
                }
                for (&j, &t) in seen.iter().zip(&x) {
                    let p = (t - m).exp() / den;
                    let mut dp = 0.0;
                    for c in 0..d {
                        let go = dout[iq(b, i, h) + c] as f64;
                        dp += go * v[ik(b, j, hk) + c] as f64;
                        dv[ik(b, j, hk) + c] += p * go;
                    }
                    let ds = p * (dp - row_d) * scale;
                    for c in 0..d {
                        dq[iq(b, i, h) + c] += ds * k[ik(b, j, hk) + c] as f64;
                        dk[ik(b, j, hk) + c] += ds * q[iq(b, i, h) + c] as f64;
                    }
                }
            }
        }
    }
    [dq, dk, dv, dsinks]
}

/// max |got - want| <= tol * max |want|, every element finite.
fn check(name: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}");
    assert!(got.iter().all(|x| x.is_finite()), "{name}: not finite");
    let big = want.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    let err = got.iter().zip(want).fold(0.0f64, |a, (&g, &w)| a.max((g as f64 - w).abs()));
    assert!(big > 0.0 && err <= tol * big, "{name}: max abs err {err}, max |ref| {big}");
}

struct Case {
    cfg: Config,
    s: Shape,
    host: [Vec<f32>; 4], // q, k, v, dout (the fp16 values)
    dev: [DeviceBuffer; 4],
    o: DeviceBuffer,
    lse: DeviceBuffer,
}

/// fp16 inputs, and the forward's O and LSE (with sinks when given).
fn setup(rt: &Runtime, s: Shape, causal: bool, seed: u64, sinks: Option<&DeviceBuffer>) -> Case {
    let cfg = Config::builder()
        .head_dim(s.d as i32)
        .heads(s.hq as i32, s.hkv as i32)
        .causal(causal)
        .build()
        .unwrap();
    let mut rng = Rng::new(seed);
    let qn = s.b * s.sq * s.hq * s.d;
    let kn = s.b * s.sk * s.hkv * s.d;
    let (qb, qf) = rng.f16_tensor(qn);
    let (kb, kf) = rng.f16_tensor(kn);
    let (vb, vf) = rng.f16_tensor(kn);
    let (gb, gf) = rng.f16_tensor(qn);
    let dev = [&qb, &kb, &vb, &gb].map(|x| rt.alloc_from(x).unwrap());
    let mut o = rt.alloc(2 * qn).unwrap();
    let mut lse = rt.alloc(4 * s.b * s.hq * s.sq).unwrap();
    let (qs, ks) = ([s.b, s.sq, s.hq, s.d], [s.b, s.sk, s.hkv, s.d]);
    let args = ForwardArgs {
        batch: s.b,
        seqlen_q: s.sq,
        seqlen_k: s.sk,
        q: Tensor::contiguous(&dev[0], qs),
        k: Tensor::contiguous(&dev[1], ks),
        v: Tensor::contiguous(&dev[2], ks),
        o: TensorMut::contiguous(&mut o, qs),
        lse: Some(&mut lse),
        workspace: None,
    };
    match sinks {
        None => rt.forward(&cfg, args).unwrap(),
        Some(sb) => {
            let kv = flashattn::KvCache::Contiguous { k: args.k, v: args.v };
            let a = flashattn::ForwardKvArgs {
                batch: s.b,
                seqlen_q: s.sq,
                seqlen_k: s.sk,
                q: args.q,
                kv,
                seqused_k: None,
                o: args.o,
                lse: args.lse,
                workspace: None,
            };
            rt.forward_kv_sinks(&cfg, a, sb).unwrap()
        }
    }
    Case { cfg, s, host: [qf, kf, vf, gf], dev, o, lse }
}

/// Runs the backward into fresh (NaN-filled) buffers and returns dq, dk, dv
/// as f32.
fn run(
    rt: &Runtime,
    c: &Case,
    deterministic: bool,
    sinks: Option<(&DeviceBuffer, &mut DeviceBuffer)>,
    workspace: Option<&mut DeviceBuffer>,
) -> flashattn::Result<[Vec<f32>; 3]> {
    let s = &c.s;
    let (qs, ks) = ([s.b, s.sq, s.hq, s.d], [s.b, s.sk, s.hkv, s.d]);
    let nan = |n: usize| rt.alloc_from(&vec![0x7e00u16; n]).unwrap();
    let (mut dq, mut dk, mut dv) =
        (nan(qs.iter().product()), nan(ks.iter().product()), nan(ks.iter().product()));
    let args = BackwardArgs {
        batch: s.b,
        seqlen_q: s.sq,
        seqlen_k: s.sk,
        q: Tensor::contiguous(&c.dev[0], qs),
        k: Tensor::contiguous(&c.dev[1], ks),
        v: Tensor::contiguous(&c.dev[2], ks),
        o: Tensor::contiguous(&c.o, qs),
        lse: &c.lse,
        dout: Tensor::contiguous(&c.dev[3], qs),
        dq: TensorMut::contiguous(&mut dq, qs),
        dk: TensorMut::contiguous(&mut dk, ks),
        dv: TensorMut::contiguous(&mut dv, ks),
        deterministic,
        workspace,
    };
    match sinks {
        None => rt.backward(&c.cfg, args)?,
        Some((sb, ds)) => rt.backward_sinks(&c.cfg, args, sb, ds)?,
    }
    let f = |x: &DeviceBuffer| flashattn::f16_slice_to_f32(&x.to_vec::<u16>().unwrap());
    Ok([f(&dq), f(&dk), f(&dv)])
}

#[test]
fn gqa_causal_matches_host() {
    let rt = emulator();
    let s = Shape { b: 2, sq: 24, sk: 40, hq: 4, hkv: 2, d: 32 };
    let c = setup(&rt, s, true, 7, None);
    let got = run(&rt, &c, false, None, None).unwrap();
    let o = flashattn::f16_slice_to_f32(&c.o.to_vec::<u16>().unwrap());
    let [q, k, v, g] = &c.host;
    let want = host_backward(&c.s, true, q, k, v, &o, g, None);
    for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
        check(name, &got[i], &want[i], 1e-2);
    }
}

#[test]
fn sinks_and_deterministic_bits() {
    let rt = emulator();
    let s = Shape { b: 1, sq: 32, sk: 32, hq: 2, hkv: 2, d: 64 };
    let sinks_host = [0.25f32, 1.5];
    let sinks = rt.alloc_from(&sinks_host).unwrap();
    let c = setup(&rt, s, true, 11, Some(&sinks));
    let mut dsinks = rt.alloc_from(&[f32::NAN; 2]).unwrap();
    let a = run(&rt, &c, true, Some((&sinks, &mut dsinks)), None).unwrap();
    let o = flashattn::f16_slice_to_f32(&c.o.to_vec::<u16>().unwrap());
    let [q, k, v, g] = &c.host;
    let want = host_backward(&c.s, true, q, k, v, &o, g, Some(&sinks_host));
    for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
        check(name, &a[i], &want[i], 1e-2);
    }
    check("dsinks", &dsinks.to_vec::<f32>().unwrap(), &want[3], 1e-2);
    // deterministic: the same bits again, with a caller's workspace (64 KiB:
    // more than the 16 KiB of dQ accumulators and the row statistics).
    let mut ws = rt.alloc(64 << 10).unwrap();
    let b = run(&rt, &c, true, Some((&sinks, &mut dsinks)), Some(&mut ws)).unwrap();
    for i in 0..3 {
        assert!(a[i].iter().zip(&b[i]).all(|(x, y)| x.to_bits() == y.to_bits()), "run {i}");
    }
}

#[test]
fn checks() {
    let rt = emulator();
    let s = Shape { b: 1, sq: 16, sk: 16, hq: 2, hkv: 1, d: 32 };
    let c = setup(&rt, s, false, 13, None);
    // A workspace far too small: the library's message names it.
    let mut tiny = rt.alloc(256).unwrap();
    let e = run(&rt, &c, false, None, Some(&mut tiny)).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.message.contains("workspace"), "{e}");
    // An LSE buffer too short: the bindings' extent check, before any launch.
    let short = rt.alloc(4).unwrap();
    let (qs, ks) = ([1, 16, 2, 32], [1, 16, 1, 32]);
    let (mut dq, mut dk, mut dv) =
        (rt.alloc(2 * 1024).unwrap(), rt.alloc(1024).unwrap(), rt.alloc(1024).unwrap());
    let e = rt
        .backward(
            &c.cfg,
            BackwardArgs {
                batch: 1,
                seqlen_q: 16,
                seqlen_k: 16,
                q: Tensor::contiguous(&c.dev[0], qs),
                k: Tensor::contiguous(&c.dev[1], ks),
                v: Tensor::contiguous(&c.dev[2], ks),
                o: Tensor::contiguous(&c.o, qs),
                lse: &short,
                dout: Tensor::contiguous(&c.dev[3], qs),
                dq: TensorMut::contiguous(&mut dq, qs),
                dk: TensorMut::contiguous(&mut dk, ks),
                dv: TensorMut::contiguous(&mut dv, ks),
                deterministic: false,
                workspace: None,
            },
        )
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.message.contains("flashattn-rs: lse"), "{e}");
}

//! The fp8 forward (C API 0.6: `ConfigBuilder::q_dtype`, `forward_fp8` with a
//! Q descale and `Descales`) on an sm_89 emulator: e4m3 / e5m2 Q, K and V
//! with per-(batch, KV head) and per-tensor descales against an f64
//! reference over the values the bytes hold, O poisoned first, within the
//! project's rule: twice the error of the same attention with P rounded as
//! the kernel rounds it (`reference_p_fp8`); bad arguments (an fp8 Q without
//! an fp8 K/V, a short descale, sm_80).
mod common;

use common::{fp8_value, quantize, reference, reference_p_fp8, Problem, Rng};
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

/// fp8 codes of N(0, 1)-like data scaled by 1 / descale(index), and the
/// values the codes hold (times the descale).
fn fp8_data(
    rng: &mut Rng,
    n: usize,
    e5m2: bool,
    descale: impl Fn(usize) -> f32,
) -> (Vec<u8>, Vec<f32>) {
    let mut codes = vec![0u8; n];
    let mut vals = vec![0f32; n];
    for i in 0..n {
        let d = descale(i) as f64;
        codes[i] = quantize(rng.uniform(-2.0, 2.0) as f64 / d, e5m2);
        vals[i] = (fp8_value(codes[i], e5m2) * d) as f32;
    }
    (codes, vals)
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
    }
}

fn run(qf: KvDtype, kvf: KvDtype, dtype: Dtype, per_head: bool) {
    let rt = runtime(89);
    let cfg = Config::builder().head_dim(D as i32).heads(HQ as i32, HKV as i32).dtype(dtype);
    let cfg = cfg.causal(per_head).q_dtype(qf).kv_dtype(kvf).build().unwrap();
    assert_eq!((cfg.q_dtype(), cfg.kv_dtype(), cfg.q_elem_size()), (qf, kvf, 1));
    let (qe5, kve5) = (qf == KvDtype::E5M2, kvf == KvDtype::E5M2);
    let mut rng = Rng::new(95);
    let fmax = |e5: bool| if e5 { 57344.0 } else { 448.0 };
    let nd = if per_head { B * HKV } else { 1 };
    let mut ds = |e5: bool| -> Vec<f32> {
        (0..nd).map(|_| 2.0 / fmax(e5) * rng.uniform(0.5, 2.0)).collect()
    };
    let (qd, kd, vd) = (ds(qe5), ds(kve5), ds(kve5));
    // Element i of [B, S, H, D] belongs to batch i / (S H D), head i / D % H.
    let at = |d: &[f32], s: usize, h: usize, i: usize| {
        if per_head {
            d[i / (s * h * D) * HKV + i / D % h * HKV / h]
        } else {
            d[0]
        }
    };
    let (qc, qv) = fp8_data(&mut rng, B * SQ * HQ * D, qe5, |i| at(&qd, SQ, HQ, i));
    let (kc, kv) = fp8_data(&mut rng, B * SK * HKV * D, kve5, |i| at(&kd, SK, HKV, i));
    let (vc, vv) = fp8_data(&mut rng, B * SK * HKV * D, kve5, |i| at(&vd, SK, HKV, i));
    let (q, k, v) =
        (rt.alloc_from(&qc).unwrap(), rt.alloc_from(&kc).unwrap(), rt.alloc_from(&vc).unwrap());
    let (qdb, kdb, vdb) =
        (rt.alloc_from(&qd).unwrap(), rt.alloc_from(&kd).unwrap(), rt.alloc_from(&vd).unwrap());
    let mut o = rt.alloc(2 * B * SQ * HQ * D).unwrap();
    o.fill_bytes(0xff).unwrap(); // NaN in fp16 and bf16
    let strides = if per_head { [HKV as i64, 1] } else { [0, 0] };
    let descales = Descales { k: Some(&kdb), v: Some(&vdb), strides };
    // A descale buffer shorter than [batch, num_heads_kv] is rejected first.
    if per_head {
        let short = rt.alloc_from(&qd[..1]).unwrap();
        let e = rt.forward_fp8(&cfg, args([&q, &k, &v], &mut o), Some(&short), descales);
        assert_eq!(e.unwrap_err().status, Status::InvalidArgument);
    }
    rt.forward_fp8(&cfg, args([&q, &k, &v], &mut o), Some(&qdb), descales).unwrap();
    let p = Problem {
        batch: B,
        seqlen_q: SQ,
        seqlen_k: SK,
        hq: HQ,
        hkv: HKV,
        d: D,
        dv: D,
        causal: per_head,
        scale: 1.0 / (D as f64).sqrt(),
    };
    let (ro, _) = reference(&p, &qv, &kv, &vv, &[SK; B]);
    let (yard, _) = reference_p_fp8(&p, &qv, &kv, &vv, &[SK; B]);
    let bits = o.to_vec::<u16>().unwrap();
    let got = match dtype {
        Dtype::BF16 => bits.iter().map(|&x| flashattn::bf16_bits_to_f32(x)).collect(),
        _ => flashattn::f16_slice_to_f32(&bits),
    };
    // Within twice the error of P rounded to e4m3 (the yardstick; its O is
    // not rounded to the dtype: 1e-3 more in max abs, as the Python tests).
    let (mut err2, mut ref2, mut yard2, mut err_max, mut yard_max) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for ((&g, &r), &y) in got.iter().zip(&ro).zip(&yard) {
        assert!(g.is_finite(), "o has a non-finite element");
        let (d, dy) = (g as f64 - r, y - r);
        err2 += d * d;
        ref2 += r * r;
        yard2 += dy * dy;
        err_max = err_max.max(d.abs());
        yard_max = yard_max.max(dy.abs());
    }
    let (err, yard_l2) = (err2.sqrt(), yard2.sqrt());
    assert!(
        err <= (2.0 * yard_l2).max(1e-2 * ref2.sqrt()),
        "L2 error {err} over twice the yardstick's {yard_l2}"
    );
    assert!(
        err_max <= 2.0 * yard_max + 1e-3,
        "max abs error {err_max} over twice the yardstick's {yard_max} + 1e-3"
    );
}

#[test]
fn fp8_forward_e4m3_per_head_descales() {
    run(KvDtype::E4M3, KvDtype::E4M3, Dtype::F16, true);
}

#[test]
fn fp8_forward_e5m2_per_tensor_descales() {
    run(KvDtype::E5M2, KvDtype::E5M2, Dtype::BF16, false);
}

#[test]
fn fp8_forward_bad_arguments() {
    // An fp8 Q needs an fp8 K and V.
    let e = Config::builder().head_dim(64).heads(2, 2).q_dtype(KvDtype::E4M3).build();
    assert_eq!(e.unwrap_err().status, Status::InvalidArgument);
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

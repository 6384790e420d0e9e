//! LSE interchange (fa_lse_format, C API 0.4) on the emulator: partial
//! states with natural-log or base-2 (FlashInfer) LSEs merged by
//! `decode_reduce_formats` in every input/output pair against an f64 merge,
//! outputs poisoned first; a bad format through the raw C struct.
mod common;

use common::{emulator, max_abs_err, Rng};
use flashattn::{sys, Config, LseFormat, ReduceArgs, Status, View, ViewMut};

const LOG2E: f64 = std::f64::consts::LOG2_E;

#[test]
fn reduce_formats_match_f64_merge() {
    let rt = emulator();
    let (s, b, sq, hq, dv) = (3usize, 2usize, 2usize, 2usize, 32usize);
    let cfg = Config::builder().head_dim(dv as i32).heads(hq as i32, hq as i32).build().unwrap();
    let rows = b * sq * hq;
    let mut rng = Rng::new(91);
    let o_part: Vec<f32> = (0..s * rows * dv).map(|_| rng.uniform(-1.0, 1.0)).collect();
    // Natural-log states [s, b, hq, sq], one empty split and one row with none.
    let mut lse_nat: Vec<f32> = (0..s * rows).map(|_| rng.uniform(-6.0, 6.0)).collect();
    let li = |sp: usize, bb: usize, h: usize, t: usize| ((sp * b + bb) * hq + h) * sq + t;
    lse_nat[li(1, 0, 1, 0)] = f32::NEG_INFINITY;
    for sp in 0..s {
        lse_nat[li(sp, 1, 0, 1)] = f32::NEG_INFINITY;
    }
    for (fin, fout) in [
        (LseFormat::Natural, LseFormat::Natural),
        (LseFormat::Natural, LseFormat::Base2),
        (LseFormat::Base2, LseFormat::Natural),
        (LseFormat::Base2, LseFormat::Base2),
    ] {
        // The values handed over, and the natural logs they stand for.
        let lse_in: Vec<f32> = match fin {
            LseFormat::Natural => lse_nat.clone(),
            LseFormat::Base2 => lse_nat.iter().map(|&x| (x as f64 * LOG2E) as f32).collect(),
        };
        let as_nat = |x: f32| match fin {
            LseFormat::Natural => x as f64,
            LseFormat::Base2 => x as f64 / LOG2E,
        };
        let mut want_o = vec![0f64; rows * dv];
        let mut want_lse = vec![f64::NEG_INFINITY; rows];
        for bb in 0..b {
            for t in 0..sq {
                for h in 0..hq {
                    let l: Vec<f64> = (0..s).map(|sp| as_nat(lse_in[li(sp, bb, h, t)])).collect();
                    let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    if m == f64::NEG_INFINITY {
                        continue;
                    }
                    let w: Vec<f64> = l.iter().map(|&x| (x - m).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    let lse = m + sum.ln();
                    want_lse[(bb * hq + h) * sq + t] = match fout {
                        LseFormat::Natural => lse,
                        LseFormat::Base2 => lse * LOG2E,
                    };
                    let r = (bb * sq + t) * hq + h;
                    for e in 0..dv {
                        want_o[r * dv + e] = (0..s)
                            .map(|sp| w[sp] * o_part[(sp * rows + r) * dv + e] as f64)
                            .sum::<f64>()
                            / sum;
                    }
                }
            }
        }
        let op = rt.alloc_from(&o_part).unwrap();
        let lp = rt.alloc_from(&lse_in).unwrap();
        let mut o = rt.alloc(2 * rows * dv).unwrap();
        let mut lse = rt.alloc(4 * rows).unwrap();
        o.fill_bytes(0xff).unwrap(); // poison: fp16 NaN
        lse.fill_bytes(0xff).unwrap(); // poison: f32 NaN
        rt.decode_reduce_formats(
            &cfg,
            ReduceArgs {
                num_splits: s,
                batch: b,
                seqlen_q: sq,
                o_partial: View::contiguous(&op, [s, b, sq, hq, dv]),
                lse_partial: View::contiguous(&lp, [s, b, hq, sq]),
                o: ViewMut::contiguous(&mut o, [b, sq, hq, dv]),
                lse: Some(&mut lse),
            },
            fin,
            fout,
        )
        .unwrap();
        let got = flashattn::f16_slice_to_f32(&o.to_vec::<u16>().unwrap());
        let err = max_abs_err(&got, &want_o);
        assert!(err <= 1e-3, "{fin:?} -> {fout:?}: o max abs error {err}");
        let got_lse = lse.to_vec::<f32>().unwrap();
        for (g, w) in got_lse.iter().zip(&want_lse) {
            if w.is_infinite() {
                assert_eq!(*g, f32::NEG_INFINITY, "{fin:?} -> {fout:?}");
            } else {
                assert!(
                    (*g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{fin:?} -> {fout:?}: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn bad_lse_format_is_invalid_argument() {
    let rt = emulator();
    let cfg = Config::builder().head_dim(32).heads(2, 2).build().unwrap();
    let op = rt.alloc_from(&vec![0.5f32; 2 * 2 * 32]).unwrap();
    let lp = rt.alloc_from(&vec![0.0f32; 4]).unwrap();
    let mut o = rt.alloc(2 * 2 * 32).unwrap();
    o.fill_bytes(0xab).unwrap();
    let a = sys::fa_reduce_args {
        num_splits: 2,
        batch: 1,
        seqlen_q: 1,
        o_partial: op.as_ptr(),
        o_partial_stride: [64, 64, 64, 32, 1],
        lse_partial: lp.as_ptr(),
        lse_partial_stride: [2, 2, 1, 1],
        o: sys::fa_tensor { data: o.as_ptr(), stride: [64, 64, 32, 1] },
        lse_partial_format: 2,
        ..Default::default()
    };
    // SAFETY: valid handles; the call is rejected before any memory access.
    let st = unsafe { sys::fa_decode_reduce(rt.as_raw(), cfg.as_raw(), &a, std::ptr::null_mut()) };
    assert_eq!(st, sys::FA_ERROR_INVALID_ARGUMENT);
    let msg =
        unsafe { std::ffi::CStr::from_ptr(sys::fa_last_error()) }.to_string_lossy().into_owned();
    assert!(msg.contains("lse_partial_format must be an fa_lse_format"), "{msg}");
    assert!(o.to_vec::<u8>().unwrap().iter().all(|&x| x == 0xab), "nothing written");
    assert_eq!(Status::from_code(st), Status::InvalidArgument);
}

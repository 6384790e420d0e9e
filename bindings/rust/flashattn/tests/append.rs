//! KV append with rotary embedding (C API 0.5; as FlashAttention's
//! flash_attn_with_kvcache) on the emulator, beyond
//! tests/features/append.cases (features.rs): `decode_append` over a
//! contiguous GQA cache with 2 new tokens per sequence, GPT-J rotary with
//! fp32 tables and explicit positions (`Rotary::positions`), against an f64
//! reference that rotates Q and k_new in f64; the cache is then downloaded:
//! new V rows equal v_new bit for bit, new K rows within 1e-2 of the f64
//! rotation, every other row unchanged. Bad append arguments are rejected;
//! a paged cache's block table is checked for cache_seqlens + seqlen_new
//! keys (the lengths before the append) and the new rows land in its pages.
mod common;

use common::{emulator, max_abs_err, reference, Problem, Rng};
use flashattn::{
    Config, DecodeKvArgs, DeviceBuffer, KvAppend, KvCache, PagedKv, Rotary, Runtime, Tensor,
    TensorMut, View,
};

const B: usize = 2;
const SN: usize = 2; // new tokens = queries
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 64;
const SK: usize = 48; // seqlen_k_max
const RD: usize = 32; // rotary_dim
const LENS: [usize; B] = [30, 5]; // before the append

/// fp32 cos/sin tables [rows, RD / 2] (theta 10000), as the C and Python tests.
fn tables(rows: usize) -> (Vec<f32>, Vec<f32>) {
    let half = RD / 2;
    let (mut c, mut s) = (Vec::new(), Vec::new());
    for p in 0..rows {
        for i in 0..half {
            let inv = 10000f64.powf(-((2 * i) as f64) / RD as f64);
            let a = p as f64 * inv;
            c.push(a.cos() as f32);
            s.push(a.sin() as f32);
        }
    }
    (c, s)
}

/// One row of D values rotated in f64 at position `pos`.
fn rope(x: &[f32], pos: usize, cos: &[f32], sin: &[f32], interleaved: bool) -> Vec<f64> {
    let half = RD / 2;
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for i in 0..half {
        let (c, s) = (cos[pos * half + i] as f64, sin[pos * half + i] as f64);
        let (i0, i1) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
        let (x0, x1) = (x[i0] as f64, x[i1] as f64);
        y[i0] = x0 * c - x1 * s;
        y[i1] = x0 * s + x1 * c;
    }
    y
}

fn run(rt: &Runtime, cfg: &Config, interleaved: bool, explicit_positions: bool, seed: u64) {
    let mut rng = Rng::new(seed);
    let (qb, qv) = rng.f16_tensor(B * SN * HQ * D);
    let (kb, kv) = rng.f16_tensor(B * SK * HKV * D);
    let (vb, vv) = rng.f16_tensor(B * SK * HKV * D);
    let (knb, knv) = rng.f16_tensor(B * SN * HKV * D);
    let (vnb, vnv) = rng.f16_tensor(B * SN * HKV * D);
    let (cos, sin) = tables(SK);

    // The expected cache (f64 rotation of k_new, v_new as is) and rotated Q.
    let mut want_k: Vec<f64> = kv.iter().map(|&x| x as f64).collect();
    let mut want_v: Vec<f64> = vv.iter().map(|&x| x as f64).collect();
    let mut q_rot = vec![0f32; qv.len()];
    for b in 0..B {
        for t in 0..SN {
            let pos = LENS[b] + t;
            for h in 0..HKV {
                let src = ((b * SN + t) * HKV + h) * D;
                let dst = ((b * SK + pos) * HKV + h) * D;
                let r = rope(&knv[src..src + D], pos, &cos, &sin, interleaved);
                want_k[dst..dst + D].copy_from_slice(&r);
                for (w, &x) in want_v[dst..dst + D].iter_mut().zip(&vnv[src..src + D]) {
                    *w = x as f64;
                }
            }
            for h in 0..HQ {
                let i = ((b * SN + t) * HQ + h) * D;
                let r = rope(&qv[i..i + D], pos, &cos, &sin, interleaved);
                for (o, x) in q_rot[i..i + D].iter_mut().zip(r) {
                    *o = x as f32;
                }
            }
        }
    }
    let p = Problem {
        batch: B,
        seqlen_q: SN,
        seqlen_k: SK,
        hq: HQ,
        hkv: HKV,
        d: D,
        dv: D,
        causal: true,
        scale: 1.0 / (D as f64).sqrt(),
    };
    let wk32: Vec<f32> = want_k.iter().map(|&x| x as f32).collect();
    let wv32: Vec<f32> = want_v.iter().map(|&x| x as f32).collect();
    let valid: Vec<usize> = LENS.iter().map(|&n| n + SN).collect();
    let (ro, rl) = reference(&p, &q_rot, &wk32, &wv32, &valid);

    let q = rt.alloc_from(&qb).unwrap();
    let kc = rt.alloc_from(&kb).unwrap();
    let vc = rt.alloc_from(&vb).unwrap();
    let kn = rt.alloc_from(&knb).unwrap();
    let vn = rt.alloc_from(&vnb).unwrap();
    let (cb, sb) = (rt.alloc_from(&cos).unwrap(), rt.alloc_from(&sin).unwrap());
    let lens: Vec<i32> = LENS.iter().map(|&n| n as i32).collect();
    let dl = rt.alloc_from(&lens).unwrap();
    // Explicit positions equal to the default ones (row stride 3 > SN).
    let pos: Vec<i32> = (0..B).flat_map(|b| [lens[b], lens[b] + 1, -7]).collect();
    let pb = rt.alloc_from(&pos).unwrap();
    let mut o = rt.alloc(2 * B * SN * HQ * D).unwrap();
    let mut lse = rt.alloc(4 * B * HQ * SN).unwrap();
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    let plan = rt
        .decode_append(
            cfg,
            DecodeKvArgs {
                batch: B,
                seqlen_q: SN,
                seqlen_k_max: SK,
                q: Tensor::contiguous(&q, [B, SN, HQ, D]),
                kv: KvCache::Contiguous {
                    k: Tensor::contiguous(&kc, [B, SK, HKV, D]),
                    v: Tensor::contiguous(&vc, [B, SK, HKV, D]),
                },
                cache_seqlens: &dl,
                num_splits: 2,
                batch_invariant: false,
                workspace: None,
                o: Some(TensorMut::contiguous(&mut o, [B, SN, HQ, D])),
                lse: Some(&mut lse),
            },
            KvAppend {
                seqlen_new: SN,
                k_new: Tensor::contiguous(&kn, [B, SN, HKV, D]),
                v_new: Tensor::contiguous(&vn, [B, SN, HKV, D]),
                rotary: Some(Rotary {
                    cos: &cb,
                    sin: &sb,
                    rotary_dim: RD,
                    seqlen_ro: SK,
                    interleaved,
                    positions: if explicit_positions { Some((&pb, 3)) } else { None },
                }),
            },
        )
        .unwrap();
    assert!(plan.num_splits >= 1);

    let got = flashattn::f16_slice_to_f32(&o.to_vec::<u16>().unwrap());
    let err = max_abs_err(&got, &ro);
    assert!(err <= 4e-3, "interleaved={interleaved}: o max abs error {err}");
    for (g, w) in lse.to_vec::<f32>().unwrap().iter().zip(&rl) {
        assert!((*g as f64 - w).abs() <= 2e-3 * w.abs().max(1.0), "lse {g} vs {w}");
    }

    // The cache was written in place: only rows LENS[b] .. LENS[b] + SN.
    let gk_bits = kc.to_vec::<u16>().unwrap();
    let gv_bits = vc.to_vec::<u16>().unwrap();
    let gk = flashattn::f16_slice_to_f32(&gk_bits);
    for b in 0..B {
        for j in 0..SK {
            for h in 0..HKV {
                let at = ((b * SK + j) * HKV + h) * D;
                let row = at..at + D;
                if (LENS[b]..LENS[b] + SN).contains(&j) {
                    let src = ((b * SN + (j - LENS[b])) * HKV + h) * D;
                    assert_eq!(&gv_bits[row.clone()], &vnb[src..src + D], "v row {b} {j} {h}");
                    for (c, (&g, &w)) in gk[row.clone()].iter().zip(&want_k[row]).enumerate() {
                        assert!(
                            (g as f64 - w).abs() <= 1e-2,
                            "interleaved={interleaved}: k[{b}][{j}][{h}][{c}] = {g}, want {w}"
                        );
                    }
                } else {
                    assert_eq!(&gk_bits[row.clone()], &kb[row.clone()], "k row {b} {j} {h}");
                    assert_eq!(&gv_bits[row.clone()], &vb[row], "v row {b} {j} {h}");
                }
            }
        }
    }
}

#[test]
fn append_rotary_gptj_explicit_positions() {
    let rt = emulator();
    let cfg = Config::builder().head_dim(D as i32).heads(HQ as i32, HKV as i32).causal(true);
    run(&rt, &cfg.build().unwrap(), true, true, 92);
}

#[test]
fn append_bad_arguments() {
    let rt = emulator();
    let cfg = Config::builder().head_dim(D as i32).heads(HQ as i32, HKV as i32).build().unwrap();
    let q = rt.alloc(2 * HQ * D).unwrap();
    let kc = rt.alloc(2 * 8 * HKV * D).unwrap();
    let vc = rt.alloc(2 * 8 * HKV * D).unwrap();
    let kn = rt.alloc(2 * HKV * D).unwrap();
    let dl = rt.alloc_from(&[3i32]).unwrap();
    let (c, s) = tables(8);
    let (cb, sb) = (rt.alloc_from(&c).unwrap(), rt.alloc_from(&s).unwrap());
    let short = rt.alloc_from(&c[..RD / 2]).unwrap();
    let call = |sn: usize, kn: &DeviceBuffer, cos: &DeviceBuffer| {
        let mut o = rt.alloc(2 * HQ * D).unwrap();
        rt.decode_append(
            &cfg,
            DecodeKvArgs {
                batch: 1,
                seqlen_q: 1,
                seqlen_k_max: 8,
                q: Tensor::contiguous(&q, [1, 1, HQ, D]),
                kv: KvCache::Contiguous {
                    k: Tensor::contiguous(&kc, [1, 8, HKV, D]),
                    v: Tensor::contiguous(&vc, [1, 8, HKV, D]),
                },
                cache_seqlens: &dl,
                num_splits: 0,
                batch_invariant: false,
                workspace: None,
                o: Some(TensorMut::contiguous(&mut o, [1, 1, HQ, D])),
                lse: None,
            },
            KvAppend {
                seqlen_new: sn,
                k_new: Tensor::contiguous(kn, [1, sn, HKV, D]),
                v_new: Tensor::contiguous(kn, [1, sn, HKV, D]),
                rotary: Some(Rotary {
                    cos,
                    sin: &sb,
                    rotary_dim: RD,
                    seqlen_ro: 8,
                    interleaved: false,
                    positions: None,
                }),
            },
        )
        .map(|_| ())
    };
    let e = call(0, &kn, &cb).unwrap_err();
    assert!(e.to_string().contains("seqlen_new"), "{e}");
    let e = call(9, &kn, &cb).unwrap_err();
    assert!(e.to_string().contains("seqlen_new"), "{e}");
    let e = call(2, &kn, &cb).unwrap_err(); // k_new holds one token
    assert!(e.to_string().contains("k_new"), "{e}");
    let e = call(1, &kn, &short).unwrap_err(); // the table has one row
    assert!(e.to_string().contains("rotary_cos"), "{e}");
    call(1, &kn, &cb).unwrap();
}

#[test]
fn append_paged_checks_pages_after_the_append() {
    const PS: usize = 16;
    const NP: usize = 4;
    let rt = emulator();
    let cfg = Config::builder().head_dim(D as i32).heads(HQ as i32, HKV as i32).causal(true);
    let cfg = cfg.build().unwrap();
    let mut rng = Rng::new(93);
    let (qb, _) = rng.f16_tensor(B * SN * HQ * D);
    let (pb, _) = rng.f16_tensor(NP * PS * HKV * D);
    let (knb, _) = rng.f16_tensor(B * SN * HKV * D);
    let (vnb, _) = rng.f16_tensor(B * SN * HKV * D);
    let q = rt.alloc_from(&qb).unwrap();
    let kp = rt.alloc_from(&pb).unwrap();
    let vp = rt.alloc_from(&pb).unwrap();
    let kn = rt.alloc_from(&knb).unwrap();
    let vn = rt.alloc_from(&vnb).unwrap();
    // Sequence 0 (30 + 2 keys) uses pages 2, 0; sequence 1 (5 + 2) page 3.
    let table = rt.alloc_from(&[2i32, 0, -1, 3, -1, -1]).unwrap();
    let call = |lens: [i32; B]| {
        let dl = rt.alloc_from(&lens).unwrap();
        let mut o = rt.alloc(2 * B * SN * HQ * D).unwrap();
        rt.decode_append(
            &cfg,
            DecodeKvArgs {
                batch: B,
                seqlen_q: SN,
                seqlen_k_max: SK,
                q: Tensor::contiguous(&q, [B, SN, HQ, D]),
                kv: KvCache::Paged(PagedKv {
                    k_pages: Tensor::contiguous(&kp, [NP, PS, HKV, D]),
                    v_pages: Tensor::contiguous(&vp, [NP, PS, HKV, D]),
                    num_pages: NP,
                    page_size: PS,
                    block_table: View::contiguous(&table, [B, SK / PS]),
                    max_pages_per_seq: SK / PS,
                }),
                cache_seqlens: &dl,
                num_splits: 0,
                batch_invariant: false,
                workspace: None,
                o: Some(TensorMut::contiguous(&mut o, [B, SN, HQ, D])),
                lse: None,
            },
            KvAppend {
                seqlen_new: SN,
                k_new: Tensor::contiguous(&kn, [B, SN, HKV, D]),
                v_new: Tensor::contiguous(&vn, [B, SN, HKV, D]),
                rotary: None,
            },
        )
        .map(|_| ())
    };
    // 31 + 2 keys need a third page of sequence 0: block_table[0][2] = -1.
    let e = call([31, 5]).unwrap_err();
    assert!(e.to_string().contains("block_table[0][2]"), "{e}");
    call([30, 5]).unwrap();
    // Without rotary the new rows are copied: keys 30, 31 of sequence 0 are
    // rows 14, 15 of page 0, keys 5, 6 of sequence 1 rows 5, 6 of page 3.
    let (gk, gv) = (kp.to_vec::<u16>().unwrap(), vp.to_vec::<u16>().unwrap());
    let row = HKV * D;
    for (b, page, first) in [(0, 0, 14), (1, 3, 5)] {
        for t in 0..SN {
            let at = (page * PS + first + t) * row;
            let src = (b * SN + t) * row;
            assert_eq!(&gk[at..at + row], &knb[src..src + row], "k seq {b} token {t}");
            assert_eq!(&gv[at..at + row], &vnb[src..src + row], "v seq {b} token {t}");
        }
    }
}

//! Speculative-decoding tree masks (`Runtime::decode_tree`, C API 0.4) on the
//! emulator: random trees per sequence and one for the batch against an f64
//! reference, outputs poisoned first; a chain tree without causal equals
//! causal decoding bit for bit; a mask that does not fit is InvalidArgument.
mod common;

use common::{emulator, max_abs_err, Rng};
use flashattn::{
    pack_tree_mask, Config, DecodeKvArgs, DeviceBuffer, KvCache, Runtime, Status, Tensor,
    TensorMut, TreeMask, View,
};

const B: usize = 2;
const SQ: usize = 5;
const SK: usize = 48;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 32;

/// Random trees [trees][SQ][SQ]: token i sees itself and its ancestors.
fn random_trees(rng: &mut Rng, trees: usize) -> Vec<bool> {
    let mut m = vec![false; trees * SQ * SQ];
    for t in 0..trees {
        let mut parent = vec![-1i64; SQ];
        for i in 0..SQ {
            if i > 0 {
                parent[i] = (rng.next_u64() % (i as u64 + 1)) as i64 - 1;
            }
            let mut j = i as i64;
            while j >= 0 {
                m[(t * SQ + i) * SQ + j as usize] = true;
                j = parent[j as usize];
            }
        }
    }
    m
}

/// f64 decode with a tree mask (prefix visible; causal on top if asked).
#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    lens: &[usize],
    tree: &[bool],
    trees: usize,
    causal: bool,
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let mut o = vec![0f64; B * SQ * HQ * D];
    let mut lse = vec![f64::NEG_INFINITY; B * HQ * SQ];
    for b in 0..B {
        let l = lens[b];
        for h in 0..HQ {
            let kh = h / (HQ / HKV);
            for i in 0..SQ {
                let mut s = Vec::new();
                for j in 0..l {
                    let jn = j as i64 - (l as i64 - SQ as i64);
                    let t = if trees == 1 { 0 } else { b };
                    if jn >= 0 && !tree[(t * SQ + i) * SQ + jn as usize] {
                        continue;
                    }
                    if causal && jn > i as i64 {
                        continue;
                    }
                    let qr = &q[((b * SQ + i) * HQ + h) * D..][..D];
                    let kr = &k[((b * SK + j) * HKV + kh) * D..][..D];
                    let dot: f64 = qr.iter().zip(kr).map(|(&x, &y)| x as f64 * y as f64).sum();
                    s.push((j, dot * scale));
                }
                if s.is_empty() {
                    continue;
                }
                let m = s.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
                let den: f64 = s.iter().map(|x| (x.1 - m).exp()).sum();
                lse[(b * HQ + h) * SQ + i] = m + den.ln();
                for &(j, sj) in &s {
                    let w = (sj - m).exp() / den;
                    for e in 0..D {
                        o[((b * SQ + i) * HQ + h) * D + e] +=
                            w * v[((b * SK + j) * HKV + kh) * D + e] as f64;
                    }
                }
            }
        }
    }
    (o, lse)
}

struct Inputs {
    q: DeviceBuffer,
    k: DeviceBuffer,
    v: DeviceBuffer,
    lens: DeviceBuffer,
    qf: Vec<f32>,
    kf: Vec<f32>,
    vf: Vec<f32>,
    lens_host: Vec<usize>,
}

fn inputs(rt: &Runtime) -> Inputs {
    let mut rng = Rng::new(71);
    let (qb, qf) = rng.f16_tensor(B * SQ * HQ * D);
    let (kb, kf) = rng.f16_tensor(B * SK * HKV * D);
    let (vb, vf) = rng.f16_tensor(B * SK * HKV * D);
    let lens_host = vec![SK, 9];
    let lens32: Vec<i32> = lens_host.iter().map(|&x| x as i32).collect();
    Inputs {
        q: rt.alloc_from(&qb).unwrap(),
        k: rt.alloc_from(&kb).unwrap(),
        v: rt.alloc_from(&vb).unwrap(),
        lens: rt.alloc_from(&lens32).unwrap(),
        qf,
        kf,
        vf,
        lens_host,
    }
}

/// decode (or decode_tree) into NaN-poisoned outputs: (O bits, LSE).
fn run(
    rt: &Runtime,
    cfg: &Config,
    x: &Inputs,
    tree: Option<TreeMask<'_>>,
) -> flashattn::Result<(Vec<u16>, Vec<f32>)> {
    let mut o = rt.alloc(2 * B * SQ * HQ * D).unwrap();
    let mut lse = rt.alloc(4 * B * HQ * SQ).unwrap();
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    let args = DecodeKvArgs {
        batch: B,
        seqlen_q: SQ,
        seqlen_k_max: SK,
        q: Tensor::contiguous(&x.q, [B, SQ, HQ, D]),
        kv: KvCache::Contiguous {
            k: Tensor::contiguous(&x.k, [B, SK, HKV, D]),
            v: Tensor::contiguous(&x.v, [B, SK, HKV, D]),
        },
        cache_seqlens: &x.lens,
        num_splits: 2,
        batch_invariant: false,
        workspace: None,
        o: Some(TensorMut::contiguous(&mut o, [B, SQ, HQ, D])),
        lse: Some(&mut lse),
    };
    match tree {
        Some(t) => rt.decode_tree(cfg, args, t)?,
        None => rt.decode_kv(cfg, args)?,
    };
    Ok((o.to_vec().unwrap(), lse.to_vec().unwrap()))
}

fn cfg(causal: bool) -> Config {
    Config::builder()
        .head_dim(D as i32)
        .heads(HQ as i32, HKV as i32)
        .causal(causal)
        .softmax_scale(0.2)
        .build()
        .unwrap()
}

#[test]
fn tree_mask_matches_reference() {
    let rt = emulator();
    let x = inputs(&rt);
    let mut rng = Rng::new(5);
    for trees in [B, 1] {
        let tree = random_trees(&mut rng, trees);
        let words = rt.alloc_from(&pack_tree_mask(&tree, SQ)).unwrap();
        let mask =
            TreeMask { words: View::contiguous(&words, [trees, SQ, 1]), trees, row_words: 1 };
        let (o, lse) = run(&rt, &cfg(false), &x, Some(mask)).unwrap();
        let (wo, wl) = reference(&x.qf, &x.kf, &x.vf, &x.lens_host, &tree, trees, false, 0.2);
        let got = flashattn::f16_slice_to_f32(&o);
        let err = max_abs_err(&got, &wo);
        assert!(err <= 1e-3, "trees {trees}: O max abs error {err}");
        let lerr = max_abs_err(&lse, &wl);
        assert!(lerr <= 1e-4, "trees {trees}: LSE max abs error {lerr}");
    }
}

#[test]
fn chain_tree_is_causal() {
    let rt = emulator();
    let x = inputs(&rt);
    let chain: Vec<bool> = (0..SQ * SQ).map(|e| e % SQ <= e / SQ).collect();
    let words = rt.alloc_from(&pack_tree_mask(&chain, SQ)).unwrap();
    let mask = TreeMask { words: View::contiguous(&words, [1, SQ, 1]), trees: 1, row_words: 1 };
    let with_tree = run(&rt, &cfg(false), &x, Some(mask)).unwrap();
    let causal = run(&rt, &cfg(true), &x, None).unwrap();
    assert_eq!(with_tree.0, causal.0);
    assert_eq!(with_tree.1, causal.1);
}

#[test]
fn bad_tree_masks() {
    let rt = emulator();
    let x = inputs(&rt);
    let words = rt.alloc_from(&vec![u32::MAX; 4]).unwrap();
    // Too few trees, a buffer too short for B x SQ rows, a non-unit last stride.
    let cases = [
        TreeMask { words: View::contiguous(&words, [3, SQ, 1]), trees: 3, row_words: 1 },
        TreeMask { words: View::contiguous(&words, [B, SQ, 1]), trees: B, row_words: 1 },
        TreeMask { words: View::new(&words, [0, 1, 2]), trees: 1, row_words: 1 },
    ];
    for t in cases {
        let e = run(&rt, &cfg(false), &x, Some(t)).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{e}");
    }
}

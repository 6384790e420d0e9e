//! Speculative-decoding tree masks (`Runtime::decode_tree`, C API 0.4) on the
//! emulator, beyond tests/features/tree_mask.cases (features.rs): a chain
//! tree without causal equals causal decoding bit for bit; a mask whose
//! trees, extent or last stride do not fit is InvalidArgument (the
//! bindings' checks).
mod common;

use common::{emulator, Rng};
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

struct Inputs {
    q: DeviceBuffer,
    k: DeviceBuffer,
    v: DeviceBuffer,
    lens: DeviceBuffer,
}

fn inputs(rt: &Runtime) -> Inputs {
    let mut rng = Rng::new(71);
    let (q, _) = rng.f16_tensor(B * SQ * HQ * D);
    let (k, _) = rng.f16_tensor(B * SK * HKV * D);
    let (v, _) = rng.f16_tensor(B * SK * HKV * D);
    Inputs {
        q: rt.alloc_from(&q).unwrap(),
        k: rt.alloc_from(&k).unwrap(),
        v: rt.alloc_from(&v).unwrap(),
        lens: rt.alloc_from(&[SK as i32, 9]).unwrap(),
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

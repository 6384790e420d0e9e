//! Attention sinks (gpt-oss; C API 0.4.1) beyond tests/features/sinks.cases
//! (features.rs): sinks shorter than num_heads_q are rejected by the
//! bindings' extent check before anything runs, and nothing is written.
mod common;

use common::emulator;
use flashattn::{Config, LseFormat, ReduceArgs, Status, TensorMut, View};

const B: usize = 2;
const SQ: usize = 3;
const HQ: usize = 4;
const D: usize = 32;

#[test]
fn short_sinks_rejected() {
    let rt = emulator();
    let cfg = Config::builder().head_dim(D as i32).heads(HQ as i32, 2).build().unwrap();
    let op = rt.alloc_from(&vec![0.5f32; B * SQ * HQ * D]).unwrap();
    let lp = rt.alloc_from(&vec![0.0f32; B * HQ * SQ]).unwrap();
    let short = rt.alloc_from(&vec![1.0f32; HQ - 1]).unwrap();
    let mut o = rt.alloc(2 * B * SQ * HQ * D).unwrap();
    o.fill_bytes(0xff).unwrap();
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
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.message.contains("flashattn-rs: sinks"), "{e}");
    assert!(o.to_vec::<u8>().unwrap().iter().all(|&x| x == 0xff), "nothing written");
}

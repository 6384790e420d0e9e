//! Decoding over a paged KV cache (vLLM / FlashAttention style) on the
//! emulator: 3 sequences of 100, 37 and 64 tokens in pages of 16 tokens
//! handed out in a shuffled order, GQA 8:2, one new query token each. The
//! same cache laid out contiguously must give the same output.
//!
//!   cargo run --example paged_decode
//!
//! Prints PASS (exit 0) or FAIL.
use std::process::ExitCode;

use flashattn::{
    Backend, Config, DecodeKvArgs, KvCache, PagedKv, Runtime, Tensor, TensorMut, View,
};

const BATCH: usize = 3;
const HQ: usize = 8;
const HKV: usize = 2;
const D: usize = 64;
const PAGE: usize = 16;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("paged_decode: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> flashattn::Result<bool> {
    let lens = [100usize, 37, 64]; // tokens in each sequence's cache
    let max_len = 100;
    // Deterministic values in [-1, 1): k/v [BATCH, max_len, HKV, D], q [BATCH, 1, HQ, D].
    let mut state = 1u32;
    let mut next = move || {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (state >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    };
    let mut values =
        |n: usize| flashattn::f32_slice_to_f16(&(0..n).map(|_| next()).collect::<Vec<_>>());
    let k = values(BATCH * max_len * HKV * D);
    let v = values(BATCH * max_len * HKV * D);
    let q = values(BATCH * HQ * D);

    // The page pool [num_pages, PAGE, HKV, D] and the block table: sequence
    // b's token j is token j % PAGE of page block_table[b][j / PAGE].
    let pages_per_seq = max_len.div_ceil(PAGE);
    let num_pages = BATCH * pages_per_seq;
    // A shuffled page order: i -> (5 i + 3) mod 21 is a permutation (5 and 21 are coprime).
    let block_table: Vec<i32> = (0..num_pages).map(|i| ((i * 5 + 3) % num_pages) as i32).collect();
    let row = HKV * D; // one token
    let (mut k_pages, mut v_pages) =
        (vec![0u16; num_pages * PAGE * row], vec![0u16; num_pages * PAGE * row]);
    for (b, &len) in lens.iter().enumerate() {
        for j in 0..len {
            let page = block_table[b * pages_per_seq + j / PAGE] as usize;
            let (dst, src) = ((page * PAGE + j % PAGE) * row, (b * max_len + j) * row);
            k_pages[dst..dst + row].copy_from_slice(&k[src..src + row]);
            v_pages[dst..dst + row].copy_from_slice(&v[src..src + row]);
        }
    }

    let rt = Runtime::builder().backend(Backend::Emulator).build()?;
    let cfg = Config::builder().head_dim(D as i32).heads(HQ as i32, HKV as i32).build()?;
    let dq = rt.alloc_from(&q)?;
    let lens_i32: Vec<i32> = lens.iter().map(|&n| n as i32).collect();
    let dlens = rt.alloc_from(&lens_i32)?;
    let (dkp, dvp) = (rt.alloc_from(&k_pages)?, rt.alloc_from(&v_pages)?);
    let dtable = rt.alloc_from(&block_table)?;
    let page_shape = [num_pages, PAGE, HKV, D];
    let mut o = rt.alloc(2 * BATCH * HQ * D)?;
    rt.decode_kv(
        &cfg,
        DecodeKvArgs {
            batch: BATCH,
            seqlen_q: 1,
            seqlen_k_max: pages_per_seq * PAGE,
            q: Tensor::contiguous(&dq, [BATCH, 1, HQ, D]),
            kv: KvCache::Paged(PagedKv {
                k_pages: Tensor::contiguous(&dkp, page_shape),
                v_pages: Tensor::contiguous(&dvp, page_shape),
                num_pages,
                page_size: PAGE,
                block_table: View::contiguous(&dtable, [BATCH, pages_per_seq]),
                max_pages_per_seq: pages_per_seq,
            }),
            cache_seqlens: &dlens,
            num_splits: 0,
            batch_invariant: false,
            workspace: None,
            o: Some(TensorMut::contiguous(&mut o, [BATCH, 1, HQ, D])),
            lse: None,
        },
    )?;

    // The same cache, contiguous [BATCH, max_len, HKV, D].
    let (dk, dv) = (rt.alloc_from(&k)?, rt.alloc_from(&v)?);
    let cache_shape = [BATCH, max_len, HKV, D];
    let mut o_ref = rt.alloc(2 * BATCH * HQ * D)?;
    rt.decode_kv(
        &cfg,
        DecodeKvArgs {
            batch: BATCH,
            seqlen_q: 1,
            seqlen_k_max: max_len,
            q: Tensor::contiguous(&dq, [BATCH, 1, HQ, D]),
            kv: KvCache::Contiguous {
                k: Tensor::contiguous(&dk, cache_shape),
                v: Tensor::contiguous(&dv, cache_shape),
            },
            cache_seqlens: &dlens,
            num_splits: 0,
            batch_invariant: false,
            workspace: None,
            o: Some(TensorMut::contiguous(&mut o_ref, [BATCH, 1, HQ, D])),
            lse: None,
        },
    )?;
    let got = flashattn::f16_slice_to_f32(&o.to_vec::<u16>()?);
    let want = flashattn::f16_slice_to_f32(&o_ref.to_vec::<u16>()?);
    let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let ok = got.iter().all(|x| x.is_finite()) && err <= 2e-3;
    println!(
        "paged decode (page_size {PAGE}, {num_pages} pages, GQA {HQ}:{HKV}) vs contiguous: \
         max_abs_err {err:.3e}"
    );
    println!("{}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}

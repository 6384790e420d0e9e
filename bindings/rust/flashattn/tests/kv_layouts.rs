//! KV cache layouts (C API 0.3) on the emulator, beyond
//! tests/features/kv_layouts.cases (features.rs): paged caches (page size
//! 1, HND pages, shuffled block tables with padded rows) and
//! pointer arrays through decode_kv and forward_kv (chunked prefill with
//! seqused_k), each compared with the same data laid out contiguously;
//! batch-invariant decode bit for bit; the checks of the new arguments.
mod common;

use common::{emulator, max_abs_err, reference, Problem, Rng};
use flashattn::{
    sys, Config, DecodeKvArgs, DecodePlan, DeviceBuffer, ForwardKvArgs, KvCache, KvLayout, PagedKv,
    RawDecodeArgs, RawKvLayout, RawTensor, Runtime, SeqKv, Status, Tensor, TensorMut, View,
};

const HQ: usize = 8; // GQA: 4 query heads per KV head
const HKV: usize = 2;
const D: usize = 64;
const F16_NAN: u16 = 0x7e00;

fn cfg(causal: bool) -> Config {
    Config::builder()
        .head_dim(D as i32)
        .heads(HQ as i32, HKV as i32)
        .causal(causal)
        .build()
        .unwrap()
}

/// A contiguous cache k/v [batch, skmax, HKV, D] (fp16 bits and values), V
/// NaN past each sequence's length (never read).
fn cache(rng: &mut Rng, batch: usize, skmax: usize, lens: &[usize]) -> [(Vec<u16>, Vec<f32>); 2] {
    let k = rng.f16_tensor(batch * skmax * HKV * D);
    let mut v = rng.f16_tensor(batch * skmax * HKV * D);
    for (b, &n) in lens.iter().enumerate() {
        let past = (b * skmax + n) * HKV * D..(b + 1) * skmax * HKV * D;
        v.0[past.clone()].fill(F16_NAN);
        v.1[past].fill(f32::NAN);
    }
    [k, v]
}

/// The same cache as shuffled pages: every sequence owns ceil(skmax /
/// page_size) pages in random order, 3 spare pages hold NaN; table rows are
/// `row` = max_pages + 2 entries apart, the tail -1.
struct Pages {
    k: Vec<u16>,
    v: Vec<u16>,
    table: Vec<i32>,
    num_pages: usize,
    max_pages: usize,
    row: usize,
    page_size: usize,
    hnd: bool,
}

fn paged(
    rng: &mut Rng,
    kv: &[Vec<u16>; 2],
    batch: usize,
    skmax: usize,
    ps: usize,
    hnd: bool,
) -> Pages {
    let mp = skmax.div_ceil(ps);
    let np = batch * mp + 3;
    let mut perm: Vec<usize> = (0..np).collect();
    for i in (1..np).rev() {
        perm.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let row = mp + 2;
    let mut table = vec![-1i32; batch * row];
    let mut pages = [vec![F16_NAN; np * ps * HKV * D], vec![F16_NAN; np * ps * HKV * D]];
    for b in 0..batch {
        for i in 0..mp {
            table[b * row + i] = perm[b * mp + i] as i32;
        }
        for j in 0..skmax {
            let (page, t) = (table[b * row + j / ps] as usize, j % ps);
            for h in 0..HKV {
                let src = ((b * skmax + j) * HKV + h) * D;
                let dst = if hnd {
                    ((page * HKV + h) * ps + t) * D
                } else {
                    ((page * ps + t) * HKV + h) * D
                };
                for (p, x) in pages.iter_mut().zip(kv) {
                    p[dst..dst + D].copy_from_slice(&x[src..src + D]);
                }
            }
        }
    }
    let [k, v] = pages;
    Pages { k, v, table, num_pages: np, max_pages: mp, row, page_size: ps, hnd }
}

/// Device copies of a paged cache: (k pages, v pages, block table).
fn upload_pages(rt: &Runtime, p: &Pages) -> [DeviceBuffer; 3] {
    [rt.alloc_from(&p.k).unwrap(), rt.alloc_from(&p.v).unwrap(), rt.alloc_from(&p.table).unwrap()]
}

fn paged_kv<'a>(p: &Pages, bufs: &'a [DeviceBuffer; 3]) -> KvCache<'a> {
    let (np, ps) = (p.num_pages, p.page_size);
    let strides = if p.hnd {
        [(HKV * ps * D) as i64, D as i64, (ps * D) as i64, 1] // HND memory, NHD indexing
    } else {
        flashattn::contiguous_strides([np, ps, HKV, D])
    };
    KvCache::Paged(PagedKv {
        k_pages: Tensor::new(&bufs[0], strides),
        v_pages: Tensor::new(&bufs[1], strides),
        num_pages: np,
        page_size: ps,
        block_table: View::new(&bufs[2], [p.row as i64, 1]),
        max_pages_per_seq: p.max_pages,
    })
}

/// decode_kv into NaN-poisoned outputs: (O bits, LSE, plan).
#[allow(clippy::too_many_arguments)]
fn decode(
    rt: &Runtime,
    cfg: &Config,
    q: &DeviceBuffer,
    kv: KvCache<'_>,
    lens: &DeviceBuffer,
    (batch, sq, skmax): (usize, usize, usize),
    batch_invariant: bool,
) -> (Vec<u16>, Vec<f32>, DecodePlan) {
    let mut o = rt.alloc(2 * batch * sq * HQ * D).unwrap();
    let mut lse = rt.alloc(4 * batch * HQ * sq).unwrap();
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    let plan = rt
        .decode_kv(
            cfg,
            DecodeKvArgs {
                batch,
                seqlen_q: sq,
                seqlen_k_max: skmax,
                q: Tensor::contiguous(q, [batch, sq, HQ, D]),
                kv,
                cache_seqlens: lens,
                num_splits: 0,
                batch_invariant,
                workspace: None,
                o: Some(TensorMut::contiguous(&mut o, [batch, sq, HQ, D])),
                lse: Some(&mut lse),
            },
        )
        .unwrap();
    (o.to_vec().unwrap(), lse.to_vec().unwrap(), plan)
}

/// Every element written (finite) and within 2e-3 of the contiguous result.
fn assert_close(what: &str, got: &[u16], want: &[u16]) {
    let got = flashattn::f16_slice_to_f32(got);
    let want: Vec<f64> = flashattn::f16_slice_to_f32(want).iter().map(|&x| x as f64).collect();
    let err = max_abs_err(&got, &want);
    eprintln!("{what}: max abs err {err} vs contiguous");
    assert!(err <= 2e-3, "{what}: max abs err {err} vs contiguous");
}

/// LSE: -inf in the same places, else within 1e-4.
fn assert_lse(what: &str, got: &[f32], want: &[f32]) {
    let want: Vec<f64> = want.iter().map(|&x| x as f64).collect();
    let err = max_abs_err(got, &want);
    assert!(err <= 1e-4, "{what}: LSE max abs err {err}");
}

#[test]
fn paged_decode_matches_contiguous() {
    let rt = emulator();
    // Page sizes 16 and 3 (NHD) are tests/features/kv_layouts.cases's.
    for (i, &(ps, hnd, causal, sq)) in
        [(1, false, true, 1), (16, true, false, 1)].iter().enumerate()
    {
        let (b, skmax) = (3, 90);
        let lens = [skmax, 1, skmax - ps / 2 - 5]; // full, one key, ends mid-page
        let mut rng = Rng::new(40 + i as u64);
        let (qb, qf) = rng.f16_tensor(b * sq * HQ * D);
        let [k, v] = cache(&mut rng, b, skmax, &lens);
        let cfg = cfg(causal);
        let q = rt.alloc_from(&qb).unwrap();
        let lens_i32: Vec<i32> = lens.iter().map(|&n| n as i32).collect();
        let dlens = rt.alloc_from(&lens_i32).unwrap();
        let (kc, vc) = (rt.alloc_from(&k.0).unwrap(), rt.alloc_from(&v.0).unwrap());
        let shape = [b, skmax, HKV, D];
        let contiguous = KvCache::Contiguous {
            k: Tensor::contiguous(&kc, shape),
            v: Tensor::contiguous(&vc, shape),
        };
        let dims = (b, sq, skmax);
        let (o_ref, lse_ref, _) = decode(&rt, &cfg, &q, contiguous, &dlens, dims, false);
        let pages = paged(&mut rng, &[k.0.clone(), v.0.clone()], b, skmax, ps, hnd);
        let bufs = upload_pages(&rt, &pages);
        let (o, lse, _) = decode(&rt, &cfg, &q, paged_kv(&pages, &bufs), &dlens, dims, false);
        let what = format!("paged page_size {ps} hnd {hnd} causal {causal} seqlen_q {sq}");
        assert_close(&what, &o, &o_ref);
        assert_lse(&what, &lse, &lse_ref);
        // ... and the f64 reference agrees.
        let p = Problem {
            batch: b,
            seqlen_q: sq,
            seqlen_k: skmax,
            hq: HQ,
            hkv: HKV,
            d: D,
            dv: D,
            causal,
            scale: 1.0 / (D as f64).sqrt(),
        };
        let (want, _) = reference(&p, &qf, &k.1, &v.1, &lens);
        let err = max_abs_err(&flashattn::f16_slice_to_f32(&o), &want);
        assert!(err <= 1e-3, "{what}: max abs err {err} vs the f64 reference");
    }
}

#[test]
fn raw_paged_decode_matches_safe() {
    // decode_raw with a RawKvLayout: the same bits as decode_kv.
    let rt = emulator();
    let cfg = cfg(false);
    let (b, skmax, ps) = (3, 40, 8);
    let lens = [40usize, 17, 8];
    let mut rng = Rng::new(7);
    let (qb, _) = rng.f16_tensor(b * HQ * D);
    let [k, v] = cache(&mut rng, b, skmax, &lens);
    let pages = paged(&mut rng, &[k.0, v.0], b, skmax, ps, false);
    let bufs = upload_pages(&rt, &pages);
    let q = rt.alloc_from(&qb).unwrap();
    let dlens = rt.alloc_from(&[40i32, 17, 8]).unwrap();
    let (o_safe, _, plan) =
        decode(&rt, &cfg, &q, paged_kv(&pages, &bufs), &dlens, (b, 1, skmax), false);
    let mut o = rt.alloc(2 * b * HQ * D).unwrap();
    o.fill_bytes(0xff).unwrap();
    let ws = rt.alloc(plan.workspace_bytes).unwrap();
    let t = |buf: &DeviceBuffer, shape: [usize; 4]| RawTensor {
        data: buf.as_ptr(),
        strides: flashattn::contiguous_strides(shape),
    };
    let raw = RawDecodeArgs {
        batch: b as i32,
        seqlen_q: 1,
        seqlen_k_max: skmax as i32,
        q: t(&q, [b, 1, HQ, D]),
        k_cache: t(&bufs[0], [pages.num_pages, ps, HKV, D]),
        v_cache: t(&bufs[1], [pages.num_pages, ps, HKV, D]),
        cache_seqlens: dlens.as_ptr(),
        workspace: ws.as_ptr(),
        workspace_size: ws.len(),
        o: t(&o, [b, 1, HQ, D]),
        kv: RawKvLayout {
            layout: KvLayout::Paged,
            page_size: ps as i32,
            num_pages: pages.num_pages as i32,
            max_pages_per_seq: pages.max_pages as i32,
            block_table: bufs[2].as_ptr(),
            block_table_stride: pages.row as i64,
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(rt.decode_workspace_size(&cfg, &raw).unwrap(), plan);
    // SAFETY: live buffers of these extents; every table entry in range.
    unsafe { rt.decode_raw(&cfg, &raw, std::ptr::null_mut()) }.unwrap();
    assert_eq!(o.to_vec::<u16>().unwrap(), o_safe);
}

#[test]
fn pointer_array_decode_matches_contiguous() {
    // One buffer per sequence, each only as long as it needs (the last empty).
    let rt = emulator();
    let cfg = cfg(true);
    let (b, sq, skmax) = (3, 2, 75);
    let lens = [75usize, 20, 0];
    let caps = [75usize, 24, 8];
    let mut rng = Rng::new(11);
    let (qb, _) = rng.f16_tensor(b * sq * HQ * D);
    let [k, v] = cache(&mut rng, b, skmax, &lens);
    let q = rt.alloc_from(&qb).unwrap();
    let dlens = rt.alloc_from(&[75i32, 20, 0]).unwrap();
    let (kc, vc) = (rt.alloc_from(&k.0).unwrap(), rt.alloc_from(&v.0).unwrap());
    let shape = [b, skmax, HKV, D];
    let contiguous = KvCache::Contiguous {
        k: Tensor::contiguous(&kc, shape),
        v: Tensor::contiguous(&vc, shape),
    };
    let dims = (b, sq, skmax);
    let (o_ref, lse_ref, _) = decode(&rt, &cfg, &q, contiguous, &dlens, dims, false);
    let row = HKV * D;
    let per_seq = |x: &[u16], s: usize| rt.alloc_from(&x[s * skmax * row..][..caps[s] * row]);
    let kb: Vec<DeviceBuffer> = (0..b).map(|s| per_seq(&k.0, s).unwrap()).collect();
    let vb: Vec<DeviceBuffer> = (0..b).map(|s| per_seq(&v.0, s).unwrap()).collect();
    let seqs: Vec<SeqKv> = (0..b)
        .map(|s| SeqKv {
            k: View::contiguous(&kb[s], [caps[s], HKV, D]),
            v: View::contiguous(&vb[s], [caps[s], HKV, D]),
            len: caps[s],
        })
        .collect();
    let (o, lse, _) = decode(&rt, &cfg, &q, KvCache::PtrArray(&seqs), &dlens, dims, false);
    assert_close("pointer array", &o, &o_ref);
    assert_lse("pointer array", &lse, &lse_ref);
    // The empty sequence: O = 0, LSE = -inf.
    assert!(o[2 * sq * HQ * D..].iter().all(|&x| x == 0));
    assert!(lse[2 * HQ * sq..].iter().all(|&x| x == f32::NEG_INFINITY));
}

#[test]
fn batch_invariant_bits_alone_and_in_a_batch() {
    // A sequence of 3000 keys (paged, page_size 16) alone and as the last of
    // a batch of 3 (others 4500 and 700 keys): with batch_invariant the
    // splits are FA_DECODE_INVARIANT_SPLIT keys (2 alone, 3 for the batch's
    // 4500-key capacity) and its O and LSE bits are identical.
    let rt = emulator();
    let cfg = cfg(false);
    let (len, others) = (3000usize, [4500usize, 700]);
    let mut rng = Rng::new(21);
    let (q_own, _) = rng.f16_tensor(HQ * D);
    let [k_own, v_own] = cache(&mut rng, 1, len, &[len]);
    let run = |rng: &mut Rng, batch: usize, skmax: usize, q: Vec<u16>, k: Vec<u16>, v: Vec<u16>| {
        let mut lens: Vec<usize> = others[..batch - 1].to_vec();
        lens.push(len);
        let lens_i32: Vec<i32> = lens.iter().map(|&n| n as i32).collect();
        let pages = paged(rng, &[k, v], batch, skmax, 16, false);
        let bufs = upload_pages(&rt, &pages);
        let (dq, dl) = (rt.alloc_from(&q).unwrap(), rt.alloc_from(&lens_i32).unwrap());
        let (o, lse, plan) =
            decode(&rt, &cfg, &dq, paged_kv(&pages, &bufs), &dl, (batch, 1, skmax), true);
        let own_o = o[(batch - 1) * HQ * D..].to_vec();
        let own_lse: Vec<u32> = lse[(batch - 1) * HQ..].iter().map(|x| x.to_bits()).collect();
        assert!(flashattn::f16_slice_to_f32(&own_o).iter().all(|x| x.is_finite()));
        assert!(lse.iter().all(|x| x.is_finite()));
        (own_o, own_lse, plan.num_splits)
    };
    let alone = run(&mut rng, 1, len, q_own.clone(), k_own.0.clone(), v_own.0.clone());
    // The batch: two other sequences, then ours in a 4500-key row.
    let skmax = others[0];
    let (mut q, _) = rng.f16_tensor(3 * HQ * D);
    q[2 * HQ * D..].copy_from_slice(&q_own);
    let [mut k, mut v] = cache(&mut rng, 3, skmax, &[skmax, others[1], len]);
    let row = HKV * D;
    k.0[2 * skmax * row..][..len * row].copy_from_slice(&k_own.0);
    v.0[2 * skmax * row..][..len * row].copy_from_slice(&v_own.0);
    let batched = run(&mut rng, 3, skmax, q, k.0, v.0);
    let split = sys::FA_DECODE_INVARIANT_SPLIT as usize;
    assert_eq!((alone.2, batched.2), (len.div_ceil(split) as i32, skmax.div_ceil(split) as i32));
    assert_eq!((alone.2, batched.2), (2, 3));
    assert_eq!(alone.0, batched.0, "O bits differ");
    assert_eq!(alone.1, batched.1, "LSE bits differ");
}

/// forward_kv into a NaN-poisoned O: (O bits, LSE).
fn prefill(
    rt: &Runtime,
    cfg: &Config,
    q: &DeviceBuffer,
    kv: KvCache<'_>,
    used: &DeviceBuffer,
    (b, sq, sk): (usize, usize, usize),
) -> (Vec<u16>, Vec<f32>) {
    let mut o = rt.alloc(2 * b * sq * HQ * D).unwrap();
    let mut lse = rt.alloc(4 * b * HQ * sq).unwrap();
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    rt.forward_kv(
        cfg,
        ForwardKvArgs {
            batch: b,
            seqlen_q: sq,
            seqlen_k: sk,
            q: Tensor::contiguous(q, [b, sq, HQ, D]),
            kv,
            seqused_k: Some(used),
            o: TensorMut::contiguous(&mut o, [b, sq, HQ, D]),
            lse: Some(&mut lse),
            workspace: None,
        },
    )
    .unwrap();
    (o.to_vec().unwrap(), lse.to_vec().unwrap())
}

#[test]
fn chunked_prefill_matches_contiguous() {
    // 5 queries per sequence, the last tokens of 70, 9 and 41 keys (causal,
    // bottom-right): paged (page_size 16 and 3) and pointer-array caches
    // against contiguous k/v with the same seqused_k.
    let rt = emulator();
    let cfg = cfg(true);
    let (b, sq, sk) = (3, 5, 70);
    let used = [70usize, 9, 41];
    let mut rng = Rng::new(31);
    let (qb, qf) = rng.f16_tensor(b * sq * HQ * D);
    let [k, v] = cache(&mut rng, b, sk, &used);
    let q = rt.alloc_from(&qb).unwrap();
    let dused = rt.alloc_from(&[70i32, 9, 41]).unwrap();
    let (kc, vc) = (rt.alloc_from(&k.0).unwrap(), rt.alloc_from(&v.0).unwrap());
    let shape = [b, sk, HKV, D];
    let contiguous = KvCache::Contiguous {
        k: Tensor::contiguous(&kc, shape),
        v: Tensor::contiguous(&vc, shape),
    };
    let dims = (b, sq, sk);
    let (o_ref, lse_ref) = prefill(&rt, &cfg, &q, contiguous, &dused, dims);
    let p = Problem {
        batch: b,
        seqlen_q: sq,
        seqlen_k: sk,
        hq: HQ,
        hkv: HKV,
        d: D,
        dv: D,
        causal: true,
        scale: 1.0 / (D as f64).sqrt(),
    };
    let (want, _) = reference(&p, &qf, &k.1, &v.1, &used);
    assert!(max_abs_err(&flashattn::f16_slice_to_f32(&o_ref), &want) <= 1e-3);
    for ps in [16, 3] {
        let pages = paged(&mut rng, &[k.0.clone(), v.0.clone()], b, sk, ps, false);
        let bufs = upload_pages(&rt, &pages);
        let (o, lse) = prefill(&rt, &cfg, &q, paged_kv(&pages, &bufs), &dused, dims);
        assert_close(&format!("prefill paged {ps}"), &o, &o_ref);
        assert_lse(&format!("prefill paged {ps}"), &lse, &lse_ref);
    }
    let row = HKV * D;
    let kb: Vec<DeviceBuffer> =
        (0..b).map(|s| rt.alloc_from(&k.0[s * sk * row..][..used[s] * row]).unwrap()).collect();
    let vb: Vec<DeviceBuffer> =
        (0..b).map(|s| rt.alloc_from(&v.0[s * sk * row..][..used[s] * row]).unwrap()).collect();
    let seqs: Vec<SeqKv> = (0..b)
        .map(|s| SeqKv {
            k: View::contiguous(&kb[s], [used[s], HKV, D]),
            v: View::contiguous(&vb[s], [used[s], HKV, D]),
            len: used[s],
        })
        .collect();
    let (o, lse) = prefill(&rt, &cfg, &q, KvCache::PtrArray(&seqs), &dused, dims);
    assert_close("prefill pointer array", &o, &o_ref);
    assert_lse("prefill pointer array", &lse, &lse_ref);
}

#[test]
fn kv_layout_errors() {
    let rt = emulator();
    let cfg = cfg(false);
    let b = 2;
    let q = rt.alloc(2 * b * HQ * D).unwrap();
    let pages = rt.alloc(2 * 6 * 4 * HKV * D).unwrap(); // 6 pages of 4 tokens
    let table = rt.alloc_from(&[0i32, 1, 2, 3, 4, -1]).unwrap();
    let mut o = rt.alloc(2 * b * HQ * D).unwrap();
    o.fill_bytes(0xff).unwrap();
    let page_shape = [6, 4, HKV, D];
    let paged = |strides: [i64; 2]| {
        KvCache::Paged(PagedKv {
            k_pages: Tensor::contiguous(&pages, page_shape),
            v_pages: Tensor::contiguous(&pages, page_shape),
            num_pages: 6,
            page_size: 4,
            block_table: View::new(&table, strides),
            max_pages_per_seq: 3,
        })
    };
    let run =
        |kv: KvCache<'_>, lens: &[i32], invariant: bool, splits: usize, o: &mut DeviceBuffer| {
            let dl = rt.alloc_from(lens).unwrap();
            rt.decode_kv(
                &cfg,
                DecodeKvArgs {
                    batch: b,
                    seqlen_q: 1,
                    seqlen_k_max: 12,
                    q: Tensor::contiguous(&q, [b, 1, HQ, D]),
                    kv,
                    cache_seqlens: &dl,
                    num_splits: splits,
                    batch_invariant: invariant,
                    workspace: None,
                    o: Some(TensorMut::contiguous(o, [b, 1, HQ, D])),
                    lse: None,
                },
            )
        };
    let expect = |r: flashattn::Result<DecodePlan>, status: Status, text: &str| {
        let e = r.expect_err("call should fail");
        assert_eq!(e.status, status, "{e}");
        assert!(e.message.contains(text), "message {:?} lacks {:?}", e.message, text);
    };
    // Only the pages a sequence reads are checked: 8 keys use pages 0..1.
    run(paged([3, 1]), &[12, 8], false, 0, &mut o).unwrap();
    o.fill_bytes(0xff).unwrap();
    expect(
        run(paged([3, 1]), &[12, 9], false, 0, &mut o),
        Status::InvalidArgument,
        "flashattn-rs: block_table[1][2] = -1 is outside [0, num_pages=6) (sequence 1 has 9 keys)",
    );
    // Lengths are clamped to seqlen_k_max as the kernel clamps them.
    run(paged([3, 1]), &[99, -4], false, 0, &mut o).unwrap();
    o.fill_bytes(0xff).unwrap();
    expect(
        run(paged([1, 3]), &[1, 1], false, 0, &mut o),
        Status::InvalidArgument,
        "block_table rows must be contiguous",
    );
    expect(
        run(paged([4, 1]), &[1, 1], false, 0, &mut o),
        Status::InvalidArgument,
        "flashattn-rs: block_table of shape [2, 3] with strides [4, 1]",
    );
    // The library's own checks: num_splits with batch_invariant, a short table stride.
    expect(run(paged([3, 1]), &[1, 1], true, 2, &mut o), Status::InvalidArgument, "num_splits");
    expect(
        run(paged([2, 1]), &[1, 1], false, 0, &mut o),
        Status::InvalidArgument,
        "block_table_stride",
    );
    // Pointer arrays.
    let seq = rt.alloc(2 * 4 * HKV * D + 16).unwrap();
    let s = |len: usize, off: usize| SeqKv {
        k: View::contiguous(&seq, [len, HKV, D]).at_byte_offset(off),
        v: View::contiguous(&seq, [len, HKV, D]),
        len,
    };
    expect(
        run(KvCache::PtrArray(&[s(4, 0), s(3, 0)]), &[4, 4], false, 0, &mut o),
        Status::InvalidArgument,
        "flashattn-rs: sequence 1 has 4 keys, k[1] holds 3",
    );
    expect(
        run(KvCache::PtrArray(&[s(4, 0), s(4, 2)]), &[1, 1], false, 0, &mut o),
        Status::InvalidArgument,
        "flashattn-rs: k[1] at ",
    );
    expect(
        run(KvCache::PtrArray(&[s(4, 0)]), &[1, 1], false, 0, &mut o),
        Status::InvalidArgument,
        "one entry per sequence (batch = 2), got 1",
    );
    let mut odd = s(4, 0);
    odd.v.strides[0] = 2 * (HKV * D) as i64;
    expect(
        run(KvCache::PtrArray(&[s(2, 0), odd]), &[1, 1], false, 0, &mut o),
        Status::InvalidArgument,
        "every sequence needs the same strides",
    );
    // No rejected call wrote anything.
    assert!(o.to_vec::<u16>().unwrap().iter().all(|&x| x == 0xffff));
}

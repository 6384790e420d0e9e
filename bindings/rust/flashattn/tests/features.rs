//! The feature descriptions (tests/features/*.cases, format in its README)
//! through the Rust bindings on the emulator: one test per file; each line
//! builds its inputs from its seed (common::Rng), poisons the outputs (NaN)
//! and runs forward / decode / decode_reduce through the safe API, then
//! compares O and LSE with common's f64 reference (a KV append also checks
//! the cache it wrote), or for `reject` checks the status, the message and
//! that nothing was written. An unknown key or value fails the line. The
//! few lines the safe API cannot express go through the raw API (said in the
//! output): a misaligned pointer (`*_misaligned`), rotary without an append
//! (`rotary_without_new`), an fp8 cache with an append, and
//! fa_lse_format 7 (`lse_format`, through flashattn-sys).
mod common;

use common::{emulator, emulator_sm, fp8_value, quantize, reference_with, Extras, Problem, Rng};
use flashattn::{
    contiguous_strides, sys, Alibi, Config, DecodeKvArgs, DecodePlan, Descales, DeviceBuffer,
    Dtype, Error, ForwardKvArgs, KvAppend, KvCache, KvDtype, LseFormat, PagedKv, RawDecodeArgs,
    RawForwardArgs, RawTensor, ReduceArgs, Rotary, Runtime, SeqKv, Status, Tensor, TensorMut,
    TreeMask, View,
};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

// ---------------------------------------------------------------- parsing

thread_local! {
    /// "file.cases:line" of the line this thread runs, for `note`.
    static AT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Progress on stderr, prefixed with the line (the tests run in parallel).
fn note(msg: String) {
    AT.with(|at| eprintln!("{}: {msg}", at.borrow()));
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Forward,
    Decode,
    Reduce,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Contiguous,
    Paged,
    PtrArray,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Slopes {
    Heads,
    Batch,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Tree {
    Batch,
    Shared,
    Chain,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Bad {
    AlibiMisaligned,
    AlibiStride,
    SinksMisaligned,
    SinksWithoutCombine,
    TreeRowStride,
    LseFormat,
    DescaleStride,
    DescaleWithoutFp8,
    RotaryDim,
    RotaryWithoutNew,
    PageSize,
}

/// One line of a .cases file.
#[derive(Clone, Debug)]
struct Case {
    op: Op,
    batch: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    dv: usize,
    splits: usize,
    dtype: Dtype,
    causal: bool,
    window: (i32, i32),
    softcap: f32,
    seed: u64,
    cache_seqlens: Option<Vec<usize>>,
    layout: Layout,
    page_size: usize,
    alibi: Option<Slopes>,
    sinks: bool,
    tree: Option<Tree>,
    kv_dtype: KvDtype,
    q_dtype: KvDtype,
    /// Some(true): [batch, num_heads_kv]; Some(false): one per tensor.
    descale: Option<bool>,
    seqlen_new: usize,
    rotary_dim: usize,
    interleaved: bool,
    lse_in: LseFormat,
    lse_out: LseFormat,
    bad: Option<Bad>,
    status: Status,
    message: String,
}

fn pick<T: Copy>(key: &str, value: &str, names: &[(&str, T)]) -> Result<T, String> {
    names.iter().find(|(n, _)| *n == value).map(|(_, t)| *t).ok_or_else(|| {
        let known: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
        format!("unknown value {key}={value} (known: {})", known.join(", "))
    })
}

fn status_named(name: &str) -> Result<Status, String> {
    let codes = [
        ("INVALID_ARGUMENT", sys::FA_ERROR_INVALID_ARGUMENT),
        ("UNSUPPORTED", sys::FA_ERROR_UNSUPPORTED),
        ("OUT_OF_MEMORY", sys::FA_ERROR_OUT_OF_MEMORY),
        ("NO_DRIVER", sys::FA_ERROR_NO_DRIVER),
        ("NO_DEVICE", sys::FA_ERROR_NO_DEVICE),
        ("CUDA", sys::FA_ERROR_CUDA),
        ("COMPILE", sys::FA_ERROR_COMPILE),
        ("LAUNCH", sys::FA_ERROR_LAUNCH),
        ("RUNTIME_POISONED", sys::FA_ERROR_RUNTIME_POISONED),
        ("BUFFER_TOO_SMALL", sys::FA_ERROR_BUFFER_TOO_SMALL),
        ("INTERNAL", sys::FA_ERROR_INTERNAL),
        ("CACHE", sys::FA_ERROR_CACHE),
    ];
    pick("status", name, &codes).map(Status::from_code)
}

fn parse(line: &str) -> Result<Case, String> {
    let mut words = line.split_whitespace();
    let op_word = words.next().ok_or("empty line")?;
    let mut kv = BTreeMap::new();
    for w in words {
        let (k, v) = w.split_once('=').ok_or_else(|| format!("{w:?} is not key=value"))?;
        if kv.insert(k, v).is_some() {
            return Err(format!("key {k} given twice"));
        }
    }
    let reject = op_word == "reject";
    let op_name = if reject { kv.remove("of").ok_or("reject without of=")? } else { op_word };
    let ops = [("forward", Op::Forward), ("decode", Op::Decode), ("reduce", Op::Reduce)];
    let op = pick("op", op_name, &ops)?;
    let num = |k: &str, v: &str| v.parse::<usize>().map_err(|_| format!("{k}={v}: not a count"));
    let flag = |k: &str, v: &str| pick(k, v, &[("0", false), ("1", true)]);
    let fp8 = [("e4m3", KvDtype::E4M3), ("e5m2", KvDtype::E5M2)];
    let lse = [("natural", LseFormat::Natural), ("base2", LseFormat::Base2)];
    let mut c = Case {
        op,
        batch: 1,
        sq: 0,
        sk: 0,
        hq: 0,
        hkv: 0,
        d: 0,
        dv: 0,
        splits: 1,
        dtype: Dtype::F16,
        causal: false,
        window: (-1, -1),
        softcap: 0.0,
        seed: 0,
        cache_seqlens: None,
        layout: Layout::Contiguous,
        page_size: 16,
        alibi: None,
        sinks: false,
        tree: None,
        kv_dtype: KvDtype::Same,
        q_dtype: KvDtype::Same,
        descale: None,
        seqlen_new: 0,
        rotary_dim: 0,
        interleaved: false,
        lse_in: LseFormat::Natural,
        lse_out: LseFormat::Natural,
        bad: None,
        status: Status::InvalidArgument,
        message: String::new(),
    };
    let mut seen_seed = false;
    for (&k, &v) in &kv {
        match k {
            "batch" => c.batch = num(k, v)?,
            "seqlen_q" => c.sq = num(k, v)?,
            "seqlen_k" => c.sk = num(k, v)?,
            "num_heads_q" => c.hq = num(k, v)?,
            "num_heads_kv" => c.hkv = num(k, v)?,
            "head_dim" => c.d = num(k, v)?,
            "head_dim_v" => c.dv = num(k, v)?,
            "num_splits" => c.splits = num(k, v)?,
            "dtype" => c.dtype = pick(k, v, &[("fp16", Dtype::F16), ("bf16", Dtype::BF16)])?,
            "causal" => c.causal = flag(k, v)?,
            "window_left" => c.window.0 = v.parse().map_err(|_| format!("{k}={v}"))?,
            "window_right" => c.window.1 = v.parse().map_err(|_| format!("{k}={v}"))?,
            "softcap" => c.softcap = v.parse().map_err(|_| format!("{k}={v}"))?,
            "seed" => {
                c.seed = v.parse().map_err(|_| format!("{k}={v}"))?;
                seen_seed = true;
            }
            "cache_seqlens" => {
                let lens: Result<Vec<usize>, String> = v.split(',').map(|x| num(k, x)).collect();
                c.cache_seqlens = Some(lens?);
            }
            "kv_layout" => {
                let names = [
                    ("contiguous", Layout::Contiguous),
                    ("paged", Layout::Paged),
                    ("ptr_array", Layout::PtrArray),
                ];
                c.layout = pick(k, v, &names)?;
            }
            "page_size" => c.page_size = num(k, v)?,
            "alibi_slopes" => {
                c.alibi = Some(pick(k, v, &[("heads", Slopes::Heads), ("batch", Slopes::Batch)])?)
            }
            "sinks" => c.sinks = pick(k, v, &[("random", true)])?,
            "tree_mask" => {
                let names =
                    [("batch", Tree::Batch), ("shared", Tree::Shared), ("chain", Tree::Chain)];
                c.tree = Some(pick(k, v, &names)?);
            }
            "kv_dtype" => c.kv_dtype = pick(k, v, &fp8)?,
            "q_dtype" => c.q_dtype = pick(k, v, &fp8)?,
            "descale" => c.descale = Some(pick(k, v, &[("tensor", false), ("batch_heads", true)])?),
            "seqlen_new" => c.seqlen_new = num(k, v)?,
            "rotary_dim" => c.rotary_dim = num(k, v)?,
            "rotary_interleaved" => c.interleaved = flag(k, v)?,
            "lse_partial_format" => c.lse_in = pick(k, v, &lse)?,
            "lse_format" => c.lse_out = pick(k, v, &lse)?,
            "bad" if reject => {
                let names = [
                    ("alibi_slopes_misaligned", Bad::AlibiMisaligned),
                    ("alibi_slopes_stride", Bad::AlibiStride),
                    ("sinks_misaligned", Bad::SinksMisaligned),
                    ("sinks_without_combine", Bad::SinksWithoutCombine),
                    ("tree_mask_row_stride", Bad::TreeRowStride),
                    ("lse_format", Bad::LseFormat),
                    ("descale_stride", Bad::DescaleStride),
                    ("descale_without_fp8", Bad::DescaleWithoutFp8),
                    ("rotary_dim", Bad::RotaryDim),
                    ("rotary_without_new", Bad::RotaryWithoutNew),
                    ("page_size", Bad::PageSize),
                ];
                c.bad = Some(pick(k, v, &names)?);
            }
            "status" if reject => c.status = status_named(v)?,
            "message" if reject => c.message = v.to_string(),
            _ => return Err(format!("unknown key {k} (op {op_word})")),
        }
    }
    if reject && c.bad.is_none() {
        return Err("reject without bad=".into());
    }
    if c.d == 0 {
        c.d = c.dv;
    }
    if c.dv == 0 {
        c.dv = c.d;
    }
    if c.hkv == 0 {
        c.hkv = c.hq;
    }
    let sizes_ok = c.batch > 0 && c.sq > 0 && c.hq > 0 && c.d > 0;
    if !(seen_seed || reject) || !sizes_ok || (op != Op::Reduce && c.sk == 0) {
        return Err(
            "needs seed (not reject), seqlen_q, num_heads_q, head_dim and (not reduce) seqlen_k"
                .into(),
        );
    }
    if c.cache_seqlens.as_ref().is_some_and(|l| l.len() != c.batch) {
        return Err("cache_seqlens needs batch values".into());
    }
    Ok(c)
}

// ---------------------------------------------------------- element types

/// The element format of a tensor: the 16-bit dtype or an fp8 format.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Elem {
    F16,
    BF16,
    E4M3,
    E5M2,
}

impl Elem {
    fn of(dtype: Dtype, fp8: KvDtype) -> Elem {
        match (fp8, dtype) {
            (KvDtype::E4M3, _) => Elem::E4M3,
            (KvDtype::E5M2, _) => Elem::E5M2,
            (_, Dtype::BF16) => Elem::BF16,
            _ => Elem::F16,
        }
    }
    fn fp8(self) -> bool {
        matches!(self, Elem::E4M3 | Elem::E5M2)
    }
    fn encode(self, x: f64) -> u16 {
        match self {
            Elem::F16 => flashattn::f32_to_f16_bits(x as f32),
            Elem::BF16 => flashattn::f32_to_bf16_bits(x as f32),
            Elem::E4M3 => quantize(x, false) as u16,
            Elem::E5M2 => quantize(x, true) as u16,
        }
    }
    fn value(self, code: u16) -> f64 {
        match self {
            Elem::F16 => flashattn::f16_bits_to_f32(code) as f64,
            Elem::BF16 => flashattn::bf16_bits_to_f32(code) as f64,
            Elem::E4M3 => fp8_value(code as u8, false),
            Elem::E5M2 => fp8_value(code as u8, true),
        }
    }
    fn nan(self) -> u16 {
        match self {
            Elem::F16 => 0x7e00,
            Elem::BF16 => 0x7fc0,
            _ => 0x7f,
        }
    }
    fn upload(self, rt: &Runtime, codes: &[u16]) -> DeviceBuffer {
        if self.fp8() {
            rt.alloc_from(&codes.iter().map(|&c| c as u8).collect::<Vec<u8>>()).unwrap()
        } else {
            rt.alloc_from(codes).unwrap()
        }
    }
    fn download(self, buf: &DeviceBuffer) -> Vec<u16> {
        if self.fp8() {
            buf.to_vec::<u8>().unwrap().into_iter().map(u16::from).collect()
        } else {
            buf.to_vec::<u16>().unwrap()
        }
    }
}

/// fmax of an fp8 format (e4m3 for a descale without one).
fn fp8_max(f: KvDtype) -> f32 {
    if f == KvDtype::E5M2 {
        57344.0
    } else {
        448.0
    }
}

/// A host tensor: element codes and the values they stand for (times the
/// descale for fp8).
#[derive(Clone, Default)]
struct Host {
    codes: Vec<u16>,
    vals: Vec<f32>,
}

/// `rows` rows of `heads` x `dim` standard normal values rounded to `elem`
/// (fp8: divided by descale(row, head) first).
fn draw(
    rng: &mut Rng,
    elem: Elem,
    (rows, heads, dim): (usize, usize, usize),
    descale: impl Fn(usize, usize) -> f32,
) -> Host {
    let mut h = Host::default();
    for i in 0..rows * heads * dim {
        let ds = if elem.fp8() { descale(i / (heads * dim), i / dim % heads) as f64 } else { 1.0 };
        let code = elem.encode(rng.normal() / ds);
        h.codes.push(code);
        h.vals.push((elem.value(code) * ds) as f32);
    }
    h
}

// ------------------------------------------------------------------ inputs

/// Everything a line's call reads, on the host.
struct Inputs {
    q: Host,
    /// Contiguous [batch, seqlen_k, num_heads_kv, head_dim(_v)]; NaN past
    /// cache_seqlens.
    k: Host,
    v: Host,
    /// Keys per sequence before an append.
    lens: Vec<usize>,
    k_new: Host,
    v_new: Host,
    /// Descales (empty: none): q [1 or batch * hkv], k, v.
    qd: Vec<f32>,
    kd: Vec<f32>,
    vd: Vec<f32>,
    slopes: Vec<f32>,
    sinks: Vec<f32>,
    /// Bits [trees][sq][sq].
    tree: Vec<bool>,
    trees: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// A random tree over `n` tokens (token j > 0's parent uniform in [0, j)):
/// bits [n][n], i sees j iff j is i or an ancestor of i.
fn random_tree(rng: &mut Rng, n: usize) -> Vec<bool> {
    let mut bits = vec![false; n * n];
    let mut parent = vec![0usize; n];
    for i in 0..n {
        if i > 0 {
            parent[i] = (rng.next_u64() % i as u64) as usize;
        }
        let mut j = i;
        loop {
            bits[i * n + j] = true;
            if j == 0 {
                break;
            }
            j = parent[j];
        }
    }
    bits
}

impl Inputs {
    fn new(c: &Case) -> Inputs {
        let mut rng = Rng::new(c.seed);
        let per_head = c.descale == Some(true);
        let nd = if per_head { c.batch * c.hkv } else { 1 };
        let mut descales = |f: KvDtype, on: bool| -> Vec<f32> {
            let n = if on { nd } else { 0 };
            (0..n).map(|_| 4.0 / fp8_max(f) * rng.uniform(0.5, 2.0)).collect()
        };
        let qd = descales(c.q_dtype, c.descale.is_some() && c.q_dtype != KvDtype::Same);
        let kd = descales(c.kv_dtype, c.descale.is_some());
        let vd = descales(c.kv_dtype, c.descale.is_some());
        let (qe, kve) = (Elem::of(c.dtype, c.q_dtype), Elem::of(c.dtype, c.kv_dtype));
        // The descale of (row, head) of a [batch, rows_per_seq, heads, ..] tensor.
        let at = |d: &[f32], rows_per_seq: usize, group: usize| {
            let d = d.to_vec();
            move |row: usize, head: usize| match d.len() {
                0 => 1.0,
                1 => d[0],
                _ => d[row / rows_per_seq * c.hkv + head / group],
            }
        };
        let group = c.hq / c.hkv.max(1);
        let q = draw(&mut rng, qe, (c.batch * c.sq, c.hq, c.d), at(&qd, c.sq, group));
        let sk = c.sk;
        let mut k = draw(&mut rng, kve, (c.batch * sk, c.hkv, c.d), at(&kd, sk, 1));
        let mut v = draw(&mut rng, kve, (c.batch * sk, c.hkv, c.dv), at(&vd, sk, 1));
        let lens = c.cache_seqlens.clone().unwrap_or(vec![c.sk; c.batch]);
        for (b, &n) in lens.iter().enumerate() {
            for (t, dim) in [(&mut k, c.d), (&mut v, c.dv)] {
                let past = (b * sk + n.min(sk)) * c.hkv * dim..(b + 1) * sk * c.hkv * dim;
                t.codes[past.clone()].fill(kve.nan());
                t.vals[past].fill(f32::NAN);
            }
        }
        let new = (c.batch * c.seqlen_new, c.hkv);
        let k_new =
            draw(&mut rng, Elem::of(c.dtype, KvDtype::Same), (new.0, new.1, c.d), |_, _| 1.0);
        let v_new =
            draw(&mut rng, Elem::of(c.dtype, KvDtype::Same), (new.0, new.1, c.dv), |_, _| 1.0);
        let rows = if c.alibi == Some(Slopes::Batch) { c.batch } else { 1 };
        let n_slopes = if c.alibi.is_some() { rows * c.hq } else { 0 };
        let slopes = (0..n_slopes).map(|_| rng.uniform(0.01, 0.5)).collect();
        let n_sinks = if c.sinks { c.hq } else { 0 };
        let mut sinks: Vec<f32> = (0..n_sinks).map(|_| rng.uniform(-2.0, 6.0)).collect();
        if sinks.len() > 1 {
            sinks[1] = f32::NEG_INFINITY;
        }
        let (tree, trees) = match c.tree {
            None => (Vec::new(), 0),
            Some(Tree::Chain) => ((0..c.sq * c.sq).map(|e| e % c.sq <= e / c.sq).collect(), 1),
            Some(Tree::Shared) => (random_tree(&mut rng, c.sq), 1),
            Some(Tree::Batch) => {
                ((0..c.batch).flat_map(|_| random_tree(&mut rng, c.sq)).collect(), c.batch)
            }
        };
        let angles: Vec<f32> = (0..c.sk * c.rotary_dim / 2)
            .map(|_| rng.uniform(-std::f32::consts::PI, std::f32::consts::PI))
            .collect();
        let cos = angles.iter().map(|a| a.cos()).collect();
        let sin = angles.iter().map(|a| a.sin()).collect();
        Inputs { q, k, v, lens, k_new, v_new, qd, kd, vd, slopes, sinks, tree, trees, cos, sin }
    }
}

/// One row rotated (RoPE, in f64) at position `pos` over its first
/// rotary_dim columns: pairs (i, i + rotary_dim / 2), or (2i, 2i + 1) with
/// rotary_interleaved; cos/sin [seqlen_k, rotary_dim / 2].
fn rope(c: &Case, x: &[f32], pos: usize, cos: &[f32], sin: &[f32]) -> Vec<f64> {
    let half = c.rotary_dim / 2;
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for i in 0..half {
        let (co, si) = (cos[pos * half + i] as f64, sin[pos * half + i] as f64);
        let (i0, i1) = if c.interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
        let (x0, x1) = (x[i0] as f64, x[i1] as f64);
        y[i0] = x0 * co - x1 * si;
        y[i1] = x0 * si + x1 * co;
    }
    y
}

// ---------------------------------------------------------- device caches

/// A KV cache in the line's layout; `rows[b]` rows of sequence b are
/// addressable (the capacity seqlen_k, or a pointer array's allocation).
enum Cache {
    Contiguous { k: DeviceBuffer, v: DeviceBuffer },
    Paged { k: DeviceBuffer, v: DeviceBuffer, table: DeviceBuffer, host: Vec<i32>, np: usize },
    PtrArray { k: Vec<DeviceBuffer>, v: Vec<DeviceBuffer>, rows: Vec<usize> },
}

impl Cache {
    /// Uploads x.k / x.v: paged as pages of `page_size` rows in shuffled
    /// order with 3 spare pages of NaN; a pointer array as one allocation
    /// per sequence of its keys (after an append) plus 2 rows, at most
    /// seqlen_k.
    fn new(rt: &Runtime, c: &Case, x: &Inputs, elem: Elem, rng: &mut Rng) -> Cache {
        let (sk, ps) = (c.sk, c.page_size.max(1));
        let (rk, rv) = (c.hkv * c.d, c.hkv * c.dv);
        match c.layout {
            Layout::Contiguous => {
                Cache::Contiguous { k: elem.upload(rt, &x.k.codes), v: elem.upload(rt, &x.v.codes) }
            }
            Layout::Paged => {
                let mp = sk.div_ceil(ps);
                let np = c.batch * mp + 3;
                let mut perm: Vec<usize> = (0..np).collect();
                for i in (1..np).rev() {
                    perm.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
                }
                let host: Vec<i32> = perm[..c.batch * mp].iter().map(|&p| p as i32).collect();
                let pages = |src: &[u16], row: usize| {
                    let mut out = vec![elem.nan(); np * ps * row];
                    for b in 0..c.batch {
                        for j in 0..sk {
                            let dst = (host[b * mp + j / ps] as usize * ps + j % ps) * row;
                            out[dst..dst + row].copy_from_slice(&src[(b * sk + j) * row..][..row]);
                        }
                    }
                    elem.upload(rt, &out)
                };
                let (k, v) = (pages(&x.k.codes, rk), pages(&x.v.codes, rv));
                Cache::Paged { k, v, table: rt.alloc_from(&host).unwrap(), host, np }
            }
            Layout::PtrArray => {
                let rows: Vec<usize> =
                    x.lens.iter().map(|&n| (n + c.seqlen_new + 2).min(sk).max(1)).collect();
                let seq = |src: &[u16], row: usize, b: usize| {
                    elem.upload(rt, &src[b * sk * row..][..rows[b] * row])
                };
                Cache::PtrArray {
                    k: (0..c.batch).map(|b| seq(&x.k.codes, rk, b)).collect(),
                    v: (0..c.batch).map(|b| seq(&x.v.codes, rv, b)).collect(),
                    rows,
                }
            }
        }
    }

    /// The safe API's view (page_size 0 with bad=page_size).
    fn kv<'a>(&'a self, c: &Case, seqs: &'a mut Vec<SeqKv<'a>>) -> KvCache<'a> {
        let (sk, ps) = (c.sk, c.page_size.max(1));
        match self {
            Cache::Contiguous { k, v } => KvCache::Contiguous {
                k: Tensor::contiguous(k, [c.batch, sk, c.hkv, c.d]),
                v: Tensor::contiguous(v, [c.batch, sk, c.hkv, c.dv]),
            },
            Cache::Paged { k, v, table, np, .. } => {
                let mp = sk.div_ceil(ps);
                KvCache::Paged(PagedKv {
                    k_pages: Tensor::contiguous(k, [*np, ps, c.hkv, c.d]),
                    v_pages: Tensor::contiguous(v, [*np, ps, c.hkv, c.dv]),
                    num_pages: *np,
                    page_size: if c.bad == Some(Bad::PageSize) { 0 } else { ps },
                    block_table: View::contiguous(table, [c.batch, mp]),
                    max_pages_per_seq: mp,
                })
            }
            Cache::PtrArray { k, v, rows } => {
                *seqs = (0..c.batch)
                    .map(|b| SeqKv {
                        k: View::contiguous(&k[b], [rows[b], c.hkv, c.d]),
                        v: View::contiguous(&v[b], [rows[b], c.hkv, c.dv]),
                        len: rows[b],
                    })
                    .collect();
                KvCache::PtrArray(seqs)
            }
        }
    }

    /// The cache as contiguous [batch, seqlen_k, hkv, dim] codes (rows a
    /// pointer array does not hold: NaN) for K (`which` 0) or V (1).
    fn download(&self, c: &Case, elem: Elem, which: usize) -> Vec<u16> {
        let (sk, ps) = (c.sk, c.page_size.max(1));
        let row = c.hkv * if which == 0 { c.d } else { c.dv };
        let mut out = vec![elem.nan(); c.batch * sk * row];
        match self {
            Cache::Contiguous { k, v } => out = elem.download([k, v][which]),
            Cache::Paged { k, v, host, .. } => {
                let pages = elem.download([k, v][which]);
                let mp = sk.div_ceil(ps);
                for b in 0..c.batch {
                    for j in 0..sk {
                        let src = (host[b * mp + j / ps] as usize * ps + j % ps) * row;
                        out[(b * sk + j) * row..][..row].copy_from_slice(&pages[src..src + row]);
                    }
                }
            }
            Cache::PtrArray { k, v, rows } => {
                for b in 0..c.batch {
                    let seq = elem.download(&[k, v][which][b]);
                    out[b * sk * row..][..rows[b] * row].copy_from_slice(&seq);
                }
            }
        }
        out
    }
}

/// The device copies of `Inputs` (None where the line has no such input).
struct Dev {
    q: DeviceBuffer,
    cache: Cache,
    lens: DeviceBuffer,
    k_new: Option<DeviceBuffer>,
    v_new: Option<DeviceBuffer>,
    qd: Option<DeviceBuffer>,
    kd: Option<DeviceBuffer>,
    vd: Option<DeviceBuffer>,
    /// Slopes and sinks hold one value more than needed (room for the
    /// misaligned pointer of bad=*_misaligned).
    slopes: Option<DeviceBuffer>,
    sinks: Option<DeviceBuffer>,
    tree: Option<DeviceBuffer>,
    cos: Option<DeviceBuffer>,
    sin: Option<DeviceBuffer>,
}

fn upload_opt<T: flashattn::Element>(rt: &Runtime, data: &[T]) -> Option<DeviceBuffer> {
    (!data.is_empty()).then(|| rt.alloc_from(data).unwrap())
}

fn padded(data: &[f32]) -> Vec<f32> {
    let mut v = data.to_vec();
    if !v.is_empty() {
        v.push(0.0);
    }
    v
}

impl Dev {
    fn new(rt: &Runtime, c: &Case, x: &Inputs) -> Dev {
        let mut rng = Rng::new(c.seed ^ 0x5eed);
        let qe = Elem::of(c.dtype, c.q_dtype);
        let ne = Elem::of(c.dtype, KvDtype::Same);
        let lens: Vec<i32> = x.lens.iter().map(|&n| n as i32).collect();
        Dev {
            q: qe.upload(rt, &x.q.codes),
            cache: Cache::new(rt, c, x, Elem::of(c.dtype, c.kv_dtype), &mut rng),
            lens: rt.alloc_from(&lens).unwrap(),
            k_new: (c.seqlen_new > 0).then(|| ne.upload(rt, &x.k_new.codes)),
            v_new: (c.seqlen_new > 0).then(|| ne.upload(rt, &x.v_new.codes)),
            qd: upload_opt(rt, &x.qd),
            kd: upload_opt(rt, &x.kd),
            vd: upload_opt(rt, &x.vd),
            slopes: if c.bad == Some(Bad::AlibiStride) {
                // One slope short per sequence: a [batch, num_heads_q - 1] array.
                upload_opt(rt, &x.slopes[..c.batch * (c.hq - 1)])
            } else {
                upload_opt(rt, &padded(&x.slopes))
            },
            sinks: upload_opt(rt, &padded(&x.sinks)),
            tree: upload_opt(rt, &flashattn::pack_tree_mask(&x.tree, c.sq)),
            cos: upload_opt(rt, &x.cos),
            sin: upload_opt(rt, &x.sin),
        }
    }

    fn descales(&self, c: &Case) -> Descales<'_> {
        let strides = match (c.bad, c.descale) {
            (Some(Bad::DescaleStride), _) => [-1, 0],
            (_, Some(true)) => [c.hkv as i64, 1],
            _ => [0, 0],
        };
        Descales { k: self.kd.as_ref(), v: self.vd.as_ref(), strides }
    }

    fn alibi(&self, c: &Case) -> Option<Alibi<'_>> {
        let per_sequence = c.alibi == Some(Slopes::Batch);
        self.slopes.as_ref().map(|slopes| Alibi { slopes, per_sequence })
    }
}

/// An output buffer of `bytes` poisoned with 0xff (NaN in every format).
fn poisoned(rt: &Runtime, bytes: usize) -> DeviceBuffer {
    let mut b = rt.alloc(bytes).unwrap();
    b.fill_bytes(0xff).unwrap();
    b
}

fn raw4(buf: &DeviceBuffer, shape: [usize; 4]) -> RawTensor {
    RawTensor { data: buf.as_ptr(), strides: contiguous_strides(shape) }
}

/// (pointer, byte offset 2 when `misaligned`) of an optional buffer.
fn ptr(buf: &Option<DeviceBuffer>, misaligned: bool) -> u64 {
    buf.as_ref().map_or(0, |b| b.as_ptr() + if misaligned { 2 } else { 0 })
}

fn unexpressible(c: &Case, what: &str) -> ! {
    panic!("not expressible through the Rust bindings: {what} ({c:?})")
}

// ------------------------------------------------------------------- calls

fn config(c: &Case) -> flashattn::Result<Config> {
    Config::builder()
        .dtype(c.dtype)
        .head_dim(c.d as i32)
        .head_dim_v(c.dv as i32)
        .heads(c.hq as i32, c.hkv as i32)
        .causal(c.causal)
        .window(c.window.0, c.window.1)
        .softcap(c.softcap)
        .kv_dtype(c.kv_dtype)
        .q_dtype(c.q_dtype)
        .build()
}

/// What a call reads: the runtime, config, line and device inputs.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    rt: &'a Runtime,
    cfg: &'a Config,
    c: &'a Case,
    dev: &'a Dev,
}

fn forward_call(x: Ctx, o: &mut DeviceBuffer, lse: &mut DeviceBuffer) -> flashattn::Result<()> {
    let Ctx { rt, cfg, c, dev } = x;
    let (b, sq, sk, hq) = (c.batch, c.sq, c.sk, c.hq);
    if matches!(c.bad, Some(Bad::AlibiMisaligned | Bad::SinksMisaligned)) {
        note("through the raw API (the safe API takes no misaligned pointer)".into());
        let Cache::Contiguous { k, v } = &dev.cache else {
            unexpressible(c, "a misaligned pointer with a non-contiguous cache")
        };
        let raw = RawForwardArgs {
            batch: b as i32,
            seqlen_q: sq as i32,
            seqlen_k: sk as i32,
            q: raw4(&dev.q, [b, sq, hq, c.d]),
            k: raw4(k, [b, sk, c.hkv, c.d]),
            v: raw4(v, [b, sk, c.hkv, c.dv]),
            o: raw4(o, [b, sq, hq, c.dv]),
            lse: lse.as_ptr(),
            sinks: ptr(&dev.sinks, c.bad == Some(Bad::SinksMisaligned)),
            alibi_slopes: ptr(&dev.slopes, c.bad == Some(Bad::AlibiMisaligned)),
            alibi_slopes_stride: if c.alibi == Some(Slopes::Batch) { hq as i64 } else { 0 },
            ..Default::default()
        };
        // SAFETY: live contiguous buffers of these extents (slopes and sinks
        // one value longer than read, so the offset stays inside).
        return unsafe { rt.forward_raw(cfg, &raw, std::ptr::null_mut()) };
    }
    let alibi = dev.alibi(c);
    let mut seqs = Vec::new();
    let args = ForwardKvArgs {
        batch: b,
        seqlen_q: sq,
        seqlen_k: sk,
        q: Tensor::contiguous(&dev.q, [b, sq, hq, c.d]),
        kv: dev.cache.kv(c, &mut seqs),
        seqused_k: None,
        o: TensorMut::contiguous(o, [b, sq, hq, c.dv]),
        lse: Some(lse),
        workspace: None,
    };
    match (c.kv_dtype != KvDtype::Same || c.descale.is_some(), alibi) {
        (true, None) if !c.sinks => rt.forward_fp8(cfg, args, dev.qd.as_ref(), dev.descales(c)),
        (true, _) => unexpressible(c, "fp8 forward with sinks or ALiBi"),
        (false, Some(a)) => rt.forward_kv_alibi(cfg, args, dev.sinks.as_ref(), a),
        (false, None) => match &dev.sinks {
            Some(s) => rt.forward_kv_sinks(cfg, args, s),
            None => rt.forward_kv(cfg, args),
        },
    }
}

/// The decode through the raw API (fa_decode_args filled here): the lines
/// the safe API cannot express, contiguous caches only.
fn decode_raw_call(
    x: Ctx,
    o: &mut DeviceBuffer,
    lse: &mut DeviceBuffer,
) -> flashattn::Result<DecodePlan> {
    let Ctx { rt, cfg, c, dev } = x;
    let (b, sq, sk, hq, hkv) = (c.batch, c.sq, c.sk, c.hq, c.hkv);
    let Cache::Contiguous { k, v } = &dev.cache else {
        unexpressible(c, "a raw decode over a non-contiguous cache")
    };
    let rw = sq.div_ceil(32);
    let mut raw = RawDecodeArgs {
        batch: b as i32,
        seqlen_q: sq as i32,
        seqlen_k_max: sk as i32,
        q: raw4(&dev.q, [b, sq, hq, c.d]),
        k_cache: raw4(k, [b, sk, hkv, c.d]),
        v_cache: raw4(v, [b, sk, hkv, c.dv]),
        cache_seqlens: dev.lens.as_ptr(),
        num_splits: c.splits as i32,
        o: raw4(o, [b, sq, hq, c.dv]),
        lse: lse.as_ptr(),
        tree_mask: ptr(&dev.tree, false),
        sinks: ptr(&dev.sinks, c.bad == Some(Bad::SinksMisaligned)),
        alibi_slopes: ptr(&dev.slopes, false),
        alibi_slopes_stride: if c.alibi == Some(Slopes::Batch) { hq as i64 } else { 0 },
        k_descale: ptr(&dev.kd, false),
        v_descale: ptr(&dev.vd, false),
        descale_strides: dev.descales(c).strides,
        rotary_dim: c.rotary_dim as i32,
        rotary_cos: ptr(&dev.cos, false),
        rotary_sin: ptr(&dev.sin, false),
        seqlen_ro: if c.rotary_dim > 0 { sk as i32 } else { 0 },
        rotary_interleaved: c.interleaved,
        rotary_dtype: if c.rotary_dim > 0 { sys::FA_DTYPE_FP32 } else { 0 },
        ..Default::default()
    };
    if dev.tree.is_some() {
        raw.tree_mask_strides =
            [if c.tree == Some(Tree::Batch) { 4 * (sq * rw) as i64 } else { 0 }, 4 * rw as i64];
    }
    if let (Some(kn), Some(vn)) = (&dev.k_new, &dev.v_new) {
        raw.k_new = raw4(kn, [b, c.seqlen_new, hkv, c.d]);
        raw.v_new = raw4(vn, [b, c.seqlen_new, hkv, c.dv]);
        raw.seqlen_new = c.seqlen_new as i32;
    }
    let plan = rt.decode_workspace_size(cfg, &raw)?;
    let ws = rt.alloc(plan.workspace_bytes.max(1))?;
    (raw.workspace, raw.workspace_size) = (ws.as_ptr(), ws.len());
    // SAFETY: live contiguous buffers of these extents (sinks one value
    // longer than read), the workspace as sized; synchronized before the
    // workspace is freed.
    unsafe { rt.decode_raw(cfg, &raw, std::ptr::null_mut()) }?;
    rt.synchronize()?;
    Ok(plan)
}

fn decode_call(
    x: Ctx,
    o: &mut DeviceBuffer,
    lse: &mut DeviceBuffer,
) -> flashattn::Result<DecodePlan> {
    let Ctx { rt, cfg, c, dev } = x;
    let (b, sq, sk, hq, hkv) = (c.batch, c.sq, c.sk, c.hq, c.hkv);
    let fp8 = c.kv_dtype != KvDtype::Same || c.descale.is_some();
    let append = c.seqlen_new > 0 || c.rotary_dim > 0;
    let others = dev.tree.is_some() || c.sinks || c.alibi.is_some();
    let raw_only = matches!(c.bad, Some(Bad::SinksMisaligned | Bad::RotaryWithoutNew));
    if raw_only || (fp8 && (append || others)) || (append && c.alibi.is_some()) {
        note("through the raw API (the safe API has no call for this)".into());
        return decode_raw_call(x, o, lse);
    }
    let alibi = dev.alibi(c);
    let rw = sq.div_ceil(32);
    let tree = dev.tree.as_ref().map(|words| {
        let row = if c.bad == Some(Bad::TreeRowStride) { 0 } else { rw as i64 };
        TreeMask {
            words: View::new(words, [(sq * rw) as i64, row, 1]),
            trees: if c.tree == Some(Tree::Batch) { b } else { 1 },
            row_words: rw,
        }
    });
    let rotary = dev.cos.as_ref().zip(dev.sin.as_ref()).map(|(cos, sin)| Rotary {
        cos,
        sin,
        rotary_dim: if c.bad == Some(Bad::RotaryDim) { 8 } else { c.rotary_dim },
        seqlen_ro: sk,
        interleaved: c.interleaved,
        positions: None,
    });
    let kv_append = dev.k_new.as_ref().zip(dev.v_new.as_ref()).map(|(kn, vn)| KvAppend {
        seqlen_new: c.seqlen_new,
        k_new: Tensor::contiguous(kn, [b, c.seqlen_new, hkv, c.d]),
        v_new: Tensor::contiguous(vn, [b, c.seqlen_new, hkv, c.dv]),
        rotary,
    });
    let without_o = c.bad == Some(Bad::SinksWithoutCombine);
    let mut ws = rt.alloc(1 << 20).unwrap();
    let mut seqs = Vec::new();
    let args = DecodeKvArgs {
        batch: b,
        seqlen_q: sq,
        seqlen_k_max: sk,
        q: Tensor::contiguous(&dev.q, [b, sq, hq, c.d]),
        kv: dev.cache.kv(c, &mut seqs),
        cache_seqlens: &dev.lens,
        num_splits: c.splits,
        batch_invariant: false,
        workspace: if without_o { Some(&mut ws) } else { None },
        o: (!without_o).then(|| TensorMut::contiguous(o, [b, sq, hq, c.dv])),
        lse: (!without_o).then_some(lse),
    };
    let sinks = dev.sinks.as_ref();
    if fp8 {
        return rt.decode_kv_fp8(cfg, args, dev.descales(c));
    }
    match (kv_append, alibi) {
        (Some(a), _) => rt.decode_append_with(cfg, args, a, tree, sinks),
        (None, Some(a)) => rt.decode_kv_alibi(cfg, args, tree, sinks, a),
        (None, None) => match (sinks, tree) {
            (Some(s), t) => rt.decode_kv_sinks(cfg, args, t, s),
            (None, Some(t)) => rt.decode_tree(cfg, args, t),
            (None, None) => rt.decode_kv(cfg, args),
        },
    }
}

// ----------------------------------------------------------------- checks

/// O's allowance for |got - want|: rounding to the dtype (and P to it in
/// P V), plus the kernels' fp32 error.
fn o_tol(c: &Case, want: f64) -> f64 {
    match c.dtype {
        Dtype::BF16 => 8e-3 + want.abs() / 128.0,
        _ => 2e-3 + want.abs() / 1024.0,
    }
}

/// LSE (fp32): -inf exactly where expected, else within 2e-5 relative.
fn check_lse(got: &[f32], want: &[f64]) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_infinite() {
            g as f64 == w
        } else {
            (g as f64 - w).abs() <= 2e-5 * w.abs().max(1.0)
        };
        assert!(ok, "lse[{i}] = {g}, want {w}");
    }
}

fn o_values(c: &Case, o: &DeviceBuffer) -> Vec<f64> {
    let e = Elem::of(c.dtype, KvDtype::Same);
    e.download(o).into_iter().map(|x| e.value(x)).collect()
}

/// Every O element within `o_tol` of the reference (finite where it is).
fn check_o(c: &Case, got: &[f64], want: &[f64]) {
    let mut worst = (0.0, 0);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let r = (g - w).abs() / o_tol(c, w);
        assert!(r <= 1.0, "o[{i}] = {g}, want {w} (tolerance {})", o_tol(c, w));
        if r > worst.0 {
            worst = (r, i);
        }
    }
    note(format!(
        "o: worst error {:.2} of the tolerance at {} ({} vs {})",
        worst.0, worst.1, got[worst.1], want[worst.1]
    ));
}

/// The fp8 forward's O: within twice the error of the same attention with P
/// rounded to e4m3 (`yard`, not rounded to the dtype), plus an ulp of the
/// dtype per element in L2, plus o_tol(0) in max.
fn check_o_fp8(c: &Case, got: &[f64], want: &[f64], yard: &[f64]) {
    let (mut err2, mut yard2, mut tol2, mut err_max, mut yard_max) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for ((&g, &w), &y) in got.iter().zip(want).zip(yard) {
        assert!(g.is_finite(), "o has a non-finite element");
        let (e, ey) = (g - w, y - w);
        (err2, yard2, tol2) =
            (err2 + e * e, yard2 + ey * ey, tol2 + (o_tol(c, w) - o_tol(c, 0.0)).powi(2));
        (err_max, yard_max) = (err_max.max(e.abs()), yard_max.max(ey.abs()));
    }
    let (err, yard_l2) = (err2.sqrt(), yard2.sqrt());
    note(format!(
        "o: L2 error {err:.3e} (yardstick {yard_l2:.3e}), max {err_max:.3e} ({yard_max:.3e})"
    ));
    assert!(
        err <= 2.0 * yard_l2 + tol2.sqrt(),
        "L2 error {err} over twice the yardstick's {yard_l2}"
    );
    let limit = 2.0 * yard_max + o_tol(c, 0.0);
    assert!(err_max <= limit, "max error {err_max} over twice the yardstick's {yard_max} + tol");
}

/// A reject: the status, the message, and nothing written into `outs`.
fn check_reject<T>(c: &Case, r: flashattn::Result<T>, outs: &[&DeviceBuffer]) {
    let Err(e) = r else { panic!("the call succeeded; expected {:?}", c.status) };
    note(format!("rejected: {e}"));
    assert_eq!(e.status, c.status, "status of {e}");
    assert!(e.message.contains(&c.message), "message {:?} lacks {:?}", e.message, c.message);
    for o in outs {
        assert!(o.to_vec::<u8>().unwrap().iter().all(|&x| x == 0xff), "a rejected call wrote");
    }
}

fn problem(c: &Case) -> Problem {
    Problem {
        batch: c.batch,
        seqlen_q: c.sq,
        seqlen_k: c.sk,
        hq: c.hq,
        hkv: c.hkv,
        d: c.d,
        dv: c.dv,
        causal: c.causal,
        scale: 1.0 / (c.d as f64).sqrt(),
    }
}

fn extras(c: &Case, x: &Inputs) -> Extras {
    let w = |v: i32| (v >= 0).then_some(v as usize);
    let stride = if c.alibi == Some(Slopes::Batch) { c.hq } else { 0 };
    let f64s = |v: &[f32]| v.iter().map(|&s| s as f64).collect::<Vec<f64>>();
    Extras {
        window_left: w(c.window.0),
        window_right: w(c.window.1),
        softcap: c.softcap as f64,
        alibi: c.alibi.map(|_| (f64s(&x.slopes), stride)),
        sinks: c.sinks.then(|| f64s(&x.sinks)),
        tree: c.tree.map(|_| (x.tree.clone(), x.trees)),
        p_fp8: false,
    }
}

// -------------------------------------------------------------------- ops

/// A line's call on fresh inputs and devices with O and LSE poisoned: a
/// reject line is checked here (None); else the inputs, devices, outputs and
/// what the call returned.
struct Launched<T> {
    x: Inputs,
    dev: Dev,
    o: DeviceBuffer,
    lse: DeviceBuffer,
    ret: T,
}

type Call<T> = fn(Ctx, &mut DeviceBuffer, &mut DeviceBuffer) -> flashattn::Result<T>;

fn launch<T>(rt: &Runtime, c: &Case, call: Call<T>, what: &str) -> Option<Launched<T>> {
    let x = Inputs::new(c);
    let cfg = config(c).unwrap();
    let dev = Dev::new(rt, c, &x);
    let mut o = poisoned(rt, 2 * c.batch * c.sq * c.hq * c.dv);
    let mut lse = poisoned(rt, 4 * c.batch * c.hq * c.sq);
    let r = call(Ctx { rt, cfg: &cfg, c, dev: &dev }, &mut o, &mut lse);
    if c.bad.is_some() {
        check_reject(c, r, &[&o, &lse]);
        return None;
    }
    let ret = r.unwrap_or_else(|e| panic!("{what} failed: {e}"));
    Some(Launched { x, dev, o, lse, ret })
}

fn run_forward(rt: &Runtime, c: &Case) {
    let Some(Launched { x, o, lse, .. }) = launch(rt, c, forward_call, "forward") else {
        return;
    };
    let p = problem(c);
    let ex = extras(c, &x);
    let (want, want_lse) = reference_with(&p, &x.q.vals, &x.k.vals, &x.v.vals, &x.lens, &ex);
    let got = o_values(c, &o);
    if c.q_dtype != KvDtype::Same {
        let yard = Extras { p_fp8: true, ..ex };
        let (yard, _) = reference_with(&p, &x.q.vals, &x.k.vals, &x.v.vals, &x.lens, &yard);
        check_o_fp8(c, &got, &want, &yard);
    } else {
        check_o(c, &got, &want);
    }
    check_lse(&lse.to_vec::<f32>().unwrap(), &want_lse);
}

/// Q, K and V as the attention sees them: with an append, the new keys and
/// values at lens[b] (rotated in f64 with rotary, rounded to the cache's
/// format) and Q rotated at its positions (rounded to the dtype).
fn appended(c: &Case, x: &Inputs) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut k, mut v, mut q) = (x.k.vals.clone(), x.v.vals.clone(), x.q.vals.clone());
    let (kve, e16) = (Elem::of(c.dtype, c.kv_dtype), Elem::of(c.dtype, KvDtype::Same));
    // The kernel rotates in fp32 and rounds to the cache's format.
    let round = |y: f64, d: f64| {
        let e = if kve.fp8() { kve } else { e16 };
        (e.value(e.encode(y / d)) * d) as f32
    };
    let windowed = c.causal || c.window.0 >= 0 || c.window.1 >= 0;
    for b in 0..c.batch {
        for t in 0..c.seqlen_new {
            let pos = x.lens[b] + t;
            for h in 0..c.hkv {
                let src = ((b * c.seqlen_new + t) * c.hkv + h) * c.d;
                let dst = ((b * c.sk + pos) * c.hkv + h) * c.d;
                let kr = rope(c, &x.k_new.vals[src..src + c.d], pos, &x.cos, &x.sin);
                let srcv = ((b * c.seqlen_new + t) * c.hkv + h) * c.dv;
                let dstv = ((b * c.sk + pos) * c.hkv + h) * c.dv;
                let vr: Vec<f64> =
                    x.v_new.vals[srcv..srcv + c.dv].iter().map(|&y| y as f64).collect();
                for (out, row, d) in [
                    (&mut k[dst..dst + c.d], kr, descale_of(c, &x.kd, b, h)),
                    (&mut v[dstv..dstv + c.dv], vr, descale_of(c, &x.vd, b, h)),
                ] {
                    for (o, y) in out.iter_mut().zip(row) {
                        *o = round(y, d);
                    }
                }
            }
        }
        for t in (0..c.sq).filter(|_| c.seqlen_new > 0 && c.rotary_dim > 0) {
            let pos = x.lens[b] + if windowed { t } else { 0 };
            for h in 0..c.hq {
                let at = ((b * c.sq + t) * c.hq + h) * c.d;
                let r = rope(c, &x.q.vals[at..at + c.d], pos, &x.cos, &x.sin);
                for (o, y) in q[at..at + c.d].iter_mut().zip(r) {
                    *o = (e16.value(e16.encode(y))) as f32;
                }
            }
        }
    }
    (q, k, v)
}

/// The descale of (b, h_kv) (1 without descales).
fn descale_of(c: &Case, d: &[f32], b: usize, h: usize) -> f64 {
    match d.len() {
        0 => 1.0,
        1 => d[0] as f64,
        _ => d[b * c.hkv + h] as f64,
    }
}

/// The cache the append left: rows lens[b] .. + seqlen_new hold `want`
/// (rotated keys of a 16-bit cache within an ulp, as the kernel rotates in
/// fp32, the rest exactly), every other row its old codes.
fn check_cache(c: &Case, x: &Inputs, dev: &Dev, want_k: &[f32], want_v: &[f32]) {
    let kve = Elem::of(c.dtype, c.kv_dtype);
    let ulp = if c.dtype == Dtype::BF16 { 1.0 / 128.0 } else { 1.0 / 1024.0 };
    for (which, old, want, dim, ds) in
        [(0, &x.k, want_k, c.d, &x.kd), (1, &x.v, want_v, c.dv, &x.vd)]
    {
        let rotated = which == 0 && c.rotary_dim > 0 && !kve.fp8();
        let got = dev.cache.download(c, kve, which);
        let row = c.hkv * dim;
        for b in 0..c.batch {
            let cap = match &dev.cache {
                Cache::PtrArray { rows, .. } => rows[b],
                _ => c.sk,
            };
            for j in 0..cap {
                let r = (b * c.sk + j) * row..(b * c.sk + j + 1) * row;
                if !(x.lens[b]..x.lens[b] + c.seqlen_new).contains(&j) {
                    assert_eq!(got[r.clone()], old.codes[r], "cache {which} row {b} {j} changed");
                    continue;
                }
                for i in r {
                    let g = kve.value(got[i]) * descale_of(c, ds, b, i % row / dim);
                    let w = want[i] as f64;
                    let tol = if rotated { ulp * w.abs() + 1e-6 } else { 1e-6 * w.abs() };
                    assert!(
                        (g - w).abs() <= tol,
                        "cache {which} [{b}][{j}] element {i}: {g}, want {w}"
                    );
                }
            }
        }
    }
}

fn run_decode(rt: &Runtime, c: &Case) {
    let Some(Launched { x, dev, o, lse, ret: plan }) = launch(rt, c, decode_call, "decode") else {
        return;
    };
    note(format!("splits {} (asked {})", plan.num_splits, c.splits));
    let valid: Vec<usize> = x.lens.iter().map(|&n| n + c.seqlen_new).collect();
    let (q, k, v) = appended(c, &x);
    if c.seqlen_new > 0 {
        check_cache(c, &x, &dev, &k, &v);
    }
    let (want, want_lse) = reference_with(&problem(c), &q, &k, &v, &valid, &extras(c, &x));
    check_o(c, &o_values(c, &o), &want);
    check_lse(&lse.to_vec::<f32>().unwrap(), &want_lse);
}

fn run_reduce(rt: &Runtime, c: &Case) {
    let (s, b, sq, hq, dv) = (c.splits, c.batch, c.sq, c.hq, c.dv);
    assert!(s >= 1, "reduce needs num_splits >= 1");
    let rows = b * sq * hq;
    let x = Inputs::new(c); // sinks
    let mut rng = Rng::new(c.seed ^ 0xfeed);
    let o_part: Vec<f32> = (0..s * rows * dv).map(|_| rng.normal() as f32).collect();
    // Natural-log states [s, b, hq, sq]: split 1 of row 0 empty, and the
    // last row empty in every split.
    let mut lse_nat: Vec<f32> = (0..s * rows).map(|_| rng.uniform(-6.0, 6.0)).collect();
    if s > 1 {
        lse_nat[rows] = f32::NEG_INFINITY;
    }
    if rows > 1 {
        for sp in 0..s {
            lse_nat[sp * rows + rows - 1] = f32::NEG_INFINITY;
        }
    }
    let log2e = std::f64::consts::LOG2_E;
    let lse_in: Vec<f32> = match c.lse_in {
        LseFormat::Natural => lse_nat.clone(),
        LseFormat::Base2 => lse_nat.iter().map(|&l| (l as f64 * log2e) as f32).collect(),
    };
    let as_nat = |l: f32| if c.lse_in == LseFormat::Base2 { l as f64 / log2e } else { l as f64 };
    let cfg = Config::builder().dtype(c.dtype).head_dim(dv as i32).heads(hq as i32, hq as i32);
    let cfg = cfg.build().unwrap();
    let (op, lp) = (rt.alloc_from(&o_part).unwrap(), rt.alloc_from(&lse_in).unwrap());
    let sinks = upload_opt(rt, &padded(&x.sinks));
    let mut o = poisoned(rt, 2 * rows * dv);
    let mut lse = poisoned(rt, 4 * rows);
    if c.bad == Some(Bad::LseFormat) {
        let a = sys::fa_reduce_args {
            num_splits: s as i32,
            batch: b as i32,
            seqlen_q: sq as i32,
            o_partial: op.as_ptr(),
            o_partial_stride: contiguous_strides([s, b, sq, hq, dv]),
            lse_partial: lp.as_ptr(),
            lse_partial_stride: contiguous_strides([s, b, hq, sq]),
            o: sys::fa_tensor { data: o.as_ptr(), stride: contiguous_strides([b, sq, hq, dv]) },
            lse: lse.as_ptr(),
            lse_format: 7,
            sinks: ptr(&sinks, false),
            ..Default::default()
        };
        // SAFETY: valid handles and live buffers of these extents.
        let st =
            unsafe { sys::fa_decode_reduce(rt.as_raw(), cfg.as_raw(), &a, std::ptr::null_mut()) };
        let r = if st == sys::FA_SUCCESS {
            Ok(())
        } else {
            // SAFETY: fa_last_error returns a valid NUL-terminated string.
            let m = unsafe { std::ffi::CStr::from_ptr(sys::fa_last_error()) };
            Err(Error { status: Status::from_code(st), message: m.to_string_lossy().into_owned() })
        };
        return check_reject(c, r, &[&o, &lse]);
    }
    let args = ReduceArgs {
        num_splits: s,
        batch: b,
        seqlen_q: sq,
        o_partial: View::contiguous(&op, [s, b, sq, hq, dv]),
        lse_partial: View::contiguous(&lp, [s, b, hq, sq]),
        o: TensorMut::contiguous(&mut o, [b, sq, hq, dv]),
        lse: Some(&mut lse),
    };
    let r = match &sinks {
        Some(sk) => rt.decode_reduce_sinks(&cfg, args, c.lse_in, c.lse_out, sk),
        None => rt.decode_reduce_formats(&cfg, args, c.lse_in, c.lse_out),
    };
    if c.bad.is_some() {
        return check_reject(c, r, &[&o, &lse]);
    }
    r.unwrap_or_else(|e| panic!("reduce failed: {e}"));
    let mut want = vec![0f64; rows * dv];
    let mut want_lse = vec![f64::NEG_INFINITY; rows];
    for bb in 0..b {
        for h in 0..hq {
            let sink = if c.sinks { x.sinks[h] as f64 } else { f64::NEG_INFINITY };
            for t in 0..sq {
                let li = (bb * hq + h) * sq + t;
                let l: Vec<f64> = (0..s).map(|sp| as_nat(lse_in[sp * rows + li])).collect();
                let m = l.iter().cloned().fold(sink, f64::max);
                if m == f64::NEG_INFINITY {
                    continue;
                }
                let w: Vec<f64> = l.iter().map(|&x| (x - m).exp()).collect();
                let sum = w.iter().sum::<f64>() + (sink - m).exp();
                let nat = m + sum.ln();
                want_lse[li] = if c.lse_out == LseFormat::Base2 { nat * log2e } else { nat };
                let r = (bb * sq + t) * hq + h;
                for e in 0..dv {
                    let acc = (0..s).map(|sp| w[sp] * o_part[(sp * rows + r) * dv + e] as f64);
                    want[r * dv + e] = acc.sum::<f64>() / sum;
                }
            }
        }
    }
    check_o(c, &o_values(c, &o), &want);
    check_lse(&lse.to_vec::<f32>().unwrap(), &want_lse);
}

// ------------------------------------------------------------------ driver

fn features_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tests/features")
}

/// Runs every line of tests/features/<name>.cases; fails naming each line
/// that failed (file:line: why).
fn run_file(name: &str) {
    let path = features_dir().join(format!("{name}.cases"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut runtimes: BTreeMap<i32, Runtime> = BTreeMap::new();
    let (mut failures, mut ran) = (Vec::new(), 0);
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap().trim();
        if line.is_empty() {
            continue;
        }
        let at = format!("{name}.cases:{}", n + 1);
        AT.with(|a| *a.borrow_mut() = at.clone());
        note(line.to_string());
        ran += 1;
        let case = match parse(line) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{at}: {e}"));
                continue;
            }
        };
        let sm = if case.kv_dtype != KvDtype::Same { 89 } else { 80 };
        let rt =
            runtimes
                .entry(sm)
                .or_insert_with(|| if sm == 80 { emulator() } else { emulator_sm(sm) });
        let r = catch_unwind(AssertUnwindSafe(|| match case.op {
            Op::Forward => run_forward(rt, &case),
            Op::Decode => run_decode(rt, &case),
            Op::Reduce => run_reduce(rt, &case),
        }));
        if let Err(p) = r {
            let why = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{at}: {why}"));
        }
    }
    assert!(ran > 0, "{} has no cases", path.display());
    assert!(
        failures.is_empty(),
        "{} of {ran} lines failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn alibi() {
    run_file("alibi");
}

#[test]
fn sinks() {
    run_file("sinks");
}

#[test]
fn tree_mask() {
    run_file("tree_mask");
}

#[test]
fn lse_formats() {
    run_file("lse_formats");
}

#[test]
fn kv_layouts() {
    run_file("kv_layouts");
}

#[test]
fn fp8_kv() {
    run_file("fp8_kv");
}

#[test]
fn fp8_forward() {
    run_file("fp8_forward");
}

#[test]
fn append() {
    run_file("append");
}

//! Helpers shared by the integration tests: an emulator runtime, a small
//! PRNG, fp16 test data and an f64 reference attention.
#![allow(dead_code)]

use flashattn::{
    Backend, CacheMode, Config, DecodeArgs, DeviceBuffer, ForwardArgs, Runtime, Tensor, TensorMut,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// A scratch directory unique to this process and call.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let base = std::env::var_os("FLASHATTN_TEST_TMP")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let d = base.join(format!(
        "fa-rs-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// An emulator runtime with an in-memory kernel cache.
pub fn emulator() -> Runtime {
    Runtime::builder().backend(Backend::Emulator).cache_mode(CacheMode::Memory).build().unwrap()
}

/// The same for an emulated SM (the fp8 kernels need sm_89 and up).
pub fn emulator_sm(sm: i32) -> Runtime {
    Runtime::builder()
        .backend(Backend::Emulator)
        .cache_mode(CacheMode::Memory)
        .emulator_sm(sm)
        .build()
        .unwrap()
}

/// SplitMix64: a tiny deterministic generator.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64; // (0, 1]
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    /// `n` values in [-1, 1) rounded to fp16: (bits, exact f32 values).
    pub fn f16_tensor(&mut self, n: usize) -> (Vec<u16>, Vec<f32>) {
        let bits: Vec<u16> =
            (0..n).map(|_| flashattn::f32_to_f16_bits(self.uniform(-1.0, 1.0))).collect();
        let vals = flashattn::f16_slice_to_f32(&bits);
        (bits, vals)
    }
}

/// The value of an fp8 code (OCP formats: e4m3 bias 7, e5m2 bias 15).
pub fn fp8_value(code: u8, e5m2: bool) -> f64 {
    let (mb, bias) = if e5m2 { (2, 15) } else { (3, 7) };
    let e = ((code & 0x7f) >> mb) as i32;
    let m = (code & ((1 << mb) - 1)) as f64;
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    if (e5m2 && e == 31) || (!e5m2 && e == 15 && m == 7.0) {
        return f64::NAN;
    }
    if e == 0 {
        sign * m * 2f64.powi(1 - bias - mb)
    } else {
        sign * ((1 << mb) as f64 + m) * 2f64.powi(e - bias - mb)
    }
}

/// The finite code nearest to x (ties: the lower code, so +0 for 0 and the
/// smaller magnitude between two codes).
pub fn quantize(x: f64, e5m2: bool) -> u8 {
    static TABLES: OnceLock<[Vec<(f64, u8)>; 2]> = OnceLock::new();
    let tables = TABLES.get_or_init(|| {
        [false, true].map(|e5| {
            // (value, code) of the finite codes, ascending; -0 after +0 dropped.
            let mut t: Vec<(f64, u8)> =
                (0..=255u8).map(|c| (fp8_value(c, e5), c)).filter(|v| v.0.is_finite()).collect();
            t.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap().then(a.1.cmp(&b.1)));
            t.dedup_by(|a, b| a.0 == b.0);
            t
        })
    });
    let t = &tables[e5m2 as usize];
    let i = t.partition_point(|v| v.0 < x);
    let near = t[i.saturating_sub(1)..(i + 1).min(t.len())].iter();
    near.min_by(|a, b| (a.0 - x).abs().total_cmp(&(b.0 - x).abs()).then(a.1.cmp(&b.1))).unwrap().1
}

/// Problem description of the reference.
#[derive(Clone, Copy, Debug)]
pub struct Problem {
    pub batch: usize,
    pub seqlen_q: usize,
    /// Row capacity of K/V along dim 1.
    pub seqlen_k: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    pub dv: usize,
    pub causal: bool,
    pub scale: f64,
}

/// Masks and score terms beyond `Problem` (FlashAttention's semantics, as
/// flashattn.h states them), for `reference_with`.
#[derive(Clone, Debug, Default)]
pub struct Extras {
    /// Sliding window in keys around the diagonal, None = unbounded.
    pub window_left: Option<usize>,
    pub window_right: Option<usize>,
    /// S = softcap * tanh(S / softcap) when > 0.
    pub softcap: f64,
    /// ALiBi: (slopes, stride); (b, h) loses slopes[b * stride + h] *
    /// |i + sk - sq - j| after softcap.
    pub alibi: Option<(Vec<f64>, usize)>,
    /// Attention sinks [hq] (natural-log logits in every row's denominator).
    pub sinks: Option<Vec<f64>>,
    /// Tree masks (bits [trees][sq][sq], trees): query i sees new token j
    /// (key sk - sq + j) iff bit (t, i, j), t = b or 0 for one tree; the
    /// prefix stays visible.
    pub tree: Option<(Vec<bool>, usize)>,
    /// P as the fp8 forward rounds it (each 2^8 e^(s - rowmax) to e4m3,
    /// divided by 2^8 and by the unrounded row sum): the yardstick of the
    /// fp8 forward's tolerance (twice this attention's error).
    pub p_fp8: bool,
}

/// Reference attention in f64 for C-order q [B, Sq, Hq, D], k [B, Sk, Hkv, D],
/// v [B, Sk, Hkv, Dv]. `valid_k[b]` keys of batch b are used (forward: Sk);
/// queries are the last positions (bottom-right causal alignment).
/// Returns (o [B, Sq, Hq, Dv], lse [B, Hq, Sq]).
pub fn reference(
    p: &Problem,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    valid_k: &[usize],
) -> (Vec<f64>, Vec<f64>) {
    reference_with(p, q, k, v, valid_k, &Extras::default())
}

/// Whether query i of batch b sees key j of its `sk` (causal, window, tree).
fn visible(p: &Problem, x: &Extras, b: usize, i: usize, j: usize, sk: usize) -> bool {
    let (i, j) = (i as i64, j as i64);
    let diag = i + sk as i64 - p.seqlen_q as i64;
    let tree_ok = x.tree.as_ref().map_or(true, |(bits, trees)| {
        let jn = j - (sk as i64 - p.seqlen_q as i64);
        let t = if *trees == 1 { 0 } else { b };
        jn < 0 || bits[(t * p.seqlen_q + i as usize) * p.seqlen_q + jn as usize]
    });
    !(p.causal && j > diag)
        && x.window_left.map_or(true, |w| j >= diag - w as i64)
        && x.window_right.map_or(true, |w| j <= diag + w as i64)
        && tree_ok
}

/// `reference` with the masks and terms of `x`; a row with no visible key
/// gets O = 0 and LSE = its sink (-inf without one).
pub fn reference_with(
    p: &Problem,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    valid_k: &[usize],
    x: &Extras,
) -> (Vec<f64>, Vec<f64>) {
    let mut o = vec![0f64; p.batch * p.seqlen_q * p.hq * p.dv];
    let mut lse = vec![f64::NEG_INFINITY; p.batch * p.hq * p.seqlen_q];
    let group = p.hq / p.hkv;
    for b in 0..p.batch {
        let sk = valid_k[b];
        for h in 0..p.hq {
            let kh = h / group;
            let sink = x.sinks.as_ref().map_or(f64::NEG_INFINITY, |s| s[h]);
            let slope = x.alibi.as_ref().map_or(0.0, |(s, stride)| s[b * stride + h]);
            for i in 0..p.seqlen_q {
                let diag = i as i64 + sk as i64 - p.seqlen_q as i64;
                let qrow = &q[((b * p.seqlen_q + i) * p.hq + h) * p.d..][..p.d];
                let mut s = Vec::new();
                for j in (0..sk).filter(|&j| visible(p, x, b, i, j, sk)) {
                    let krow = &k[((b * p.seqlen_k + j) * p.hkv + kh) * p.d..][..p.d];
                    let dot: f64 = qrow.iter().zip(krow).map(|(&x, &y)| x as f64 * y as f64).sum();
                    let mut sj = p.scale * dot;
                    if x.softcap > 0.0 {
                        sj = x.softcap * (sj / x.softcap).tanh();
                    }
                    s.push((j, sj - slope * (diag - j as i64).abs() as f64));
                }
                let smax = s.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
                let m = smax.max(sink);
                if m == f64::NEG_INFINITY {
                    continue;
                }
                let denom: f64 = s.iter().map(|x| (x.1 - m).exp()).sum::<f64>() + (sink - m).exp();
                lse[(b * p.hq + h) * p.seqlen_q + i] = m + denom.ln();
                let orow = &mut o[((b * p.seqlen_q + i) * p.hq + h) * p.dv..][..p.dv];
                for &(j, sj) in &s {
                    let w = if x.p_fp8 {
                        let e = (sj - smax).exp();
                        fp8_value(quantize(256.0 * e, false), false) / 256.0 * (smax - m).exp()
                    } else {
                        (sj - m).exp()
                    } / denom;
                    let vrow = &v[((b * p.seqlen_k + j) * p.hkv + kh) * p.dv..][..p.dv];
                    for (x, &y) in orow.iter_mut().zip(vrow) {
                        *x += w * y as f64;
                    }
                }
            }
        }
    }
    (o, lse)
}

/// Largest |got - want| (inf if any got is not finite where want is).
pub fn max_abs_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            if w.is_infinite() {
                if g as f64 == w {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else if g.is_finite() {
                (g as f64 - w).abs()
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

pub const F16_TOL: f64 = 1e-3; // outputs are averages of values in [-1, 1]; observed ~2.5e-4
pub const LSE_TOL: f64 = 1e-5; // fp32; observed ~6e-7

/// Checks LSE values: -inf exactly where expected, else within tolerance.
pub fn check_lse(got: &[f32], want: &[f64]) {
    let err = max_abs_err(got, want);
    eprintln!("lse err {err}");
    assert!(err <= LSE_TOL, "lse max abs error {err}");
}

/// Forward on contiguous [b, s, h, d] tensors of problem p: O (o_bytes per
/// element) and LSE, both poisoned with 0xff bytes (NaN) first.
pub fn forward_contiguous(
    rt: &Runtime,
    cfg: &Config,
    p: &Problem,
    q: &DeviceBuffer,
    k: &DeviceBuffer,
    v: &DeviceBuffer,
    o_bytes: usize,
) -> (DeviceBuffer, DeviceBuffer) {
    let (o, lse, r) = forward_contiguous_ws(rt, cfg, p, [q, k, v], o_bytes, None);
    r.unwrap();
    (o, lse)
}

/// `forward_contiguous` with `ForwardArgs::workspace`: the poisoned O and
/// LSE, and the call's result.
pub fn forward_contiguous_ws(
    rt: &Runtime,
    cfg: &Config,
    p: &Problem,
    [q, k, v]: [&DeviceBuffer; 3],
    o_bytes: usize,
    workspace: Option<&mut DeviceBuffer>,
) -> (DeviceBuffer, DeviceBuffer, flashattn::Result<()>) {
    let mut o = rt.alloc(o_bytes * p.batch * p.seqlen_q * p.hq * p.dv).unwrap();
    let mut lse = rt.alloc(4 * p.batch * p.hq * p.seqlen_q).unwrap();
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    let r = rt.forward(
        cfg,
        ForwardArgs {
            batch: p.batch,
            seqlen_q: p.seqlen_q,
            seqlen_k: p.seqlen_k,
            q: Tensor::contiguous(q, [p.batch, p.seqlen_q, p.hq, p.d]),
            k: Tensor::contiguous(k, [p.batch, p.seqlen_k, p.hkv, p.d]),
            v: Tensor::contiguous(v, [p.batch, p.seqlen_k, p.hkv, p.dv]),
            o: TensorMut::contiguous(&mut o, [p.batch, p.seqlen_q, p.hq, p.dv]),
            lse: Some(&mut lse),
            workspace,
        },
    );
    (o, lse, r)
}

/// The config of a problem's shape, mask and scale in `dtype`.
pub fn problem_config(p: &Problem, dtype: flashattn::Dtype) -> Config {
    Config::builder()
        .dtype(dtype)
        .head_dim(p.d as i32)
        .head_dim_v(p.dv as i32)
        .heads(p.hq as i32, p.hkv as i32)
        .causal(p.causal)
        .softmax_scale(p.scale as f32)
        .build()
        .unwrap()
}

/// Random fp16 Q [b, sq, hq, d], K [b, sk, hkv, d], V [b, sk, hkv, dv]
/// from `seed`: ([q, k, v] bits, [q, k, v] as f32).
pub fn f16_qkv(p: &Problem, seed: u64) -> ([Vec<u16>; 3], [Vec<f32>; 3]) {
    let mut rng = Rng::new(seed);
    let (qb, qf) = rng.f16_tensor(p.batch * p.seqlen_q * p.hq * p.d);
    let (kb, kf) = rng.f16_tensor(p.batch * p.seqlen_k * p.hkv * p.d);
    let (vb, vf) = rng.f16_tensor(p.batch * p.seqlen_k * p.hkv * p.dv);
    ([qb, kb, vb], [qf, kf, vf])
}

pub fn forward_case(rt: &Runtime, p: Problem, seed: u64) {
    let ([qb, kb, vb], [qf, kf, vf]) = f16_qkv(&p, seed);
    let cfg = problem_config(&p, flashattn::Dtype::F16);
    let (q, k, v) =
        (rt.alloc_from(&qb).unwrap(), rt.alloc_from(&kb).unwrap(), rt.alloc_from(&vb).unwrap());
    let (o, lse) = forward_contiguous(rt, &cfg, &p, &q, &k, &v, 2);
    let (want_o, want_lse) = reference(&p, &qf, &kf, &vf, &vec![p.seqlen_k; p.batch]);
    let got_o = flashattn::f16_slice_to_f32(&o.to_vec::<u16>().unwrap());
    let err = max_abs_err(&got_o, &want_o);
    eprintln!("forward {p:?}: o err {err}");
    assert!(err <= F16_TOL, "{p:?}: o max abs error {err}");
    check_lse(&lse.to_vec::<f32>().unwrap(), &want_lse);
}

/// Uploads a KV cache and queries, runs decode and compares with the reference.
pub fn decode_case(
    rt: &Runtime,
    p: Problem,
    seqlens: &[i32],
    num_splits: usize,
    seed: u64,
) -> flashattn::DecodePlan {
    let ([qb, kb, vb], [qf, kf, vf]) = f16_qkv(&p, seed);
    let cfg = problem_config(&p, flashattn::Dtype::F16);
    let (q, k, v) =
        (rt.alloc_from(&qb).unwrap(), rt.alloc_from(&kb).unwrap(), rt.alloc_from(&vb).unwrap());
    let lens = rt.alloc_from(seqlens).unwrap();
    let mut o = rt.alloc(2 * p.batch * p.seqlen_q * p.hq * p.dv).unwrap();
    let mut lse = rt.alloc(4 * p.batch * p.hq * p.seqlen_q).unwrap();
    o.fill_bytes(0xff).unwrap();
    lse.fill_bytes(0xff).unwrap();
    let plan = rt
        .decode(
            &cfg,
            DecodeArgs {
                batch: p.batch,
                seqlen_q: p.seqlen_q,
                seqlen_k_max: p.seqlen_k,
                q: Tensor::contiguous(&q, [p.batch, p.seqlen_q, p.hq, p.d]),
                k_cache: Tensor::contiguous(&k, [p.batch, p.seqlen_k, p.hkv, p.d]),
                v_cache: Tensor::contiguous(&v, [p.batch, p.seqlen_k, p.hkv, p.dv]),
                cache_seqlens: &lens,
                num_splits,
                workspace: None,
                o: Some(TensorMut::contiguous(&mut o, [p.batch, p.seqlen_q, p.hq, p.dv])),
                lse: Some(&mut lse),
            },
        )
        .unwrap();
    assert!(plan.num_splits >= 1 && plan.workspace_bytes > 0);
    let valid: Vec<usize> = seqlens.iter().map(|&s| s as usize).collect();
    let (want_o, want_lse) = reference(&p, &qf, &kf, &vf, &valid);
    let got_o = flashattn::f16_slice_to_f32(&o.to_vec::<u16>().unwrap());
    let err = max_abs_err(&got_o, &want_o);
    eprintln!("decode splits {num_splits} used {}: o err {err}", plan.num_splits);
    assert!(err <= F16_TOL, "{p:?} splits {num_splits}: o max abs error {err}");
    check_lse(&lse.to_vec::<f32>().unwrap(), &want_lse);
    plan
}

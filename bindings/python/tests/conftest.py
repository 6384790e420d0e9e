"""Shared fixtures and the NumPy fp64 references for the flashattn tests.

The tests use the emulator backend; FLASHATTN_LIBRARY selects the library
(bindings/python/test.sh points it at the installed prefix)."""

import ctypes
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import flashattn as fa  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "data")


@pytest.fixture
def rt(tmp_path):
    with fa.Runtime(backend="emulator", cache="disk", cache_dir=str(tmp_path / "cache")) as r:
        yield r


def rng(seed):
    return np.random.default_rng(seed)


def round_to(x, dtype):
    """x rounded to the storage type, back as float64."""
    if dtype == "fp16":
        return np.asarray(x, dtype=np.float16).astype(np.float64)
    return fa.bf16_bits_to_float32(fa.float32_to_bf16_bits(x)).astype(np.float64)


def as_float(out, dtype):
    if dtype == "bf16":
        return fa.bf16_bits_to_float32(out).astype(np.float64)
    return np.asarray(out).astype(np.float64)


def visible_mask(sq, sk_valid, sk_cap, causal, window):
    """[sq, sk_cap] bool: which keys query i sees (bottom-right aligned)."""
    i = np.arange(sq)[:, None]
    j = np.arange(sk_cap)[None, :]
    shift = sk_valid - sq
    m = np.broadcast_to(j < sk_valid, (sq, sk_cap)).copy()
    wl, wr = window
    if causal:
        wr = 0 if wr < 0 else min(wr, 0)
    if wl >= 0:
        m &= j >= i + shift - wl
    if wr >= 0:
        m &= j <= i + shift + wr
    return m


def ref_attention(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, seqlens_k=None,
                  alibi=None, p_fp8=False, mask=None):
    """fp64 attention. q [B,Sq,H,D], k/v [B,Sk,Hk,D(v)]; seqlens_k[b] valid
    keys (default Sk); alibi: ALiBi slopes [H] or [B,H] (the logit of query
    i, key j loses slope * |i + L - Sq - j|). Returns O [B,Sq,H,Dv] and LSE
    [B,H,Sq] (-inf, O=0 for rows that see no key). p_fp8: the fp8 forward's
    rounding, each 2^8 e^(s - max) to e4m3 in P V (the row sums unrounded).
    mask: bool [B,Sq,Sk], more keys hidden (False) on top of the others
    (tree_mask_visible's)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, Sq, H, _ = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    g = H // Hk
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    o = np.zeros((B, Sq, H, v.shape[3]))
    lse = np.full((B, H, Sq), -np.inf)
    for b in range(B):
        L = Sk if seqlens_k is None else int(seqlens_k[b])
        vis = visible_mask(Sq, L, Sk, causal, window)
        if mask is not None:
            vis = vis & mask[b]
        sb = s[b]
        if alibi is not None:
            sl = np.asarray(alibi, np.float64)
            sl = sl if sl.ndim == 1 else sl[b]
            dist = np.abs(np.arange(Sq)[:, None] + L - Sq - np.arange(Sk)[None, :])
            sb = sb - sl[:, None, None] * dist[None]
        sb = np.where(vis[None], sb, -np.inf)
        m = sb.max(axis=-1, keepdims=True)
        seen = np.isfinite(m)
        p = np.where(seen, np.exp(sb - np.where(seen, m, 0)), 0.0)
        l = p.sum(axis=-1, keepdims=True)
        vb = vv[b].copy()
        vb[L:] = 0  # keys past seqlens_k[b] are never read (they may hold NaN)
        pv = fp8_values(False)[quantize(256 * p, False)] / 256 if p_fp8 else p
        ob = np.einsum("hqk,khd->qhd", pv / np.where(seen, l, 1), vb)
        o[b] = ob
        lse[b] = np.where(seen[..., 0], m[..., 0] + np.log(np.where(seen, l, 1)[..., 0]), -np.inf)
    return o, lse


def ref_attention_backward(q, k, v, dout, scale, causal=False, window=(-1, -1), softcap=0.0,
                           seqlens_k=None, alibi=None, sinks=None, out=None):
    """fp64 gradients of ref_attention's O (with sinks: with_sinks's) for the
    upstream gradient dout [B,Sq,H,Dv] (FlashAttention-2's Algorithm 2):
    dV = P^T dO, dP = dO V^T, D_i = rowsum(dO_i o O_i) (O: `out` when given,
    e.g. the kernel's, else the fp64 one), dZ = P o (dP - D), through the
    softcap dS = dZ (1 - tanh^2(s / softcap)), dQ = scale dS K, dK = scale
    dS^T Q, dK/dV summed over each KV head's query heads; dsinks[h] =
    -sum_i e^(sinks[h] - LSE_i) D_i. Rows that see no key get zeros.
    Returns (dq, dk, dv) or, with sinks, (dq, dk, dv, dsinks)."""
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    B, Sq, H, _ = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    g = H // Hk
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    x = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    s = softcap * np.tanh(x / softcap) if softcap > 0 else x
    dq, dk, dv = np.zeros_like(q), np.zeros(kk.shape), np.zeros(vv.shape)
    dsinks = np.zeros(H)
    for b in range(B):
        L = Sk if seqlens_k is None else int(seqlens_k[b])
        vis = visible_mask(Sq, L, Sk, causal, window)
        sb = s[b]
        if alibi is not None:
            sl = np.asarray(alibi, np.float64)
            sl = sl if sl.ndim == 1 else sl[b]
            dist = np.abs(np.arange(Sq)[:, None] + L - Sq - np.arange(Sk)[None, :])
            sb = sb - sl[:, None, None] * dist[None]
        sb = np.where(vis[None], sb, -np.inf)
        m = sb.max(axis=-1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, np.asarray(sinks, np.float64)[:, None, None])
        seen = np.isfinite(m)
        e = np.where(seen, np.exp(sb - np.where(seen, m, 0)), 0.0)
        den = e.sum(axis=-1, keepdims=True)
        if sinks is not None:
            ps = np.exp(np.asarray(sinks, np.float64)[:, None, None] - np.where(seen, m, 0))
            den = den + np.where(seen, ps, 0.0)
        p = e / np.where(den > 0, den, 1)  # [H, Sq, Sk]
        vb = vv[b].copy()
        vb[L:] = 0
        ob = np.einsum("hqk,khd->qhd", p, vb) if out is None else \
            np.asarray(out[b], np.float64)
        dob = dout[b]
        dv[b] = np.einsum("hqk,qhd->khd", p, dob)
        dp = np.einsum("qhd,khd->hqk", dob, vb)
        D = np.einsum("qhd,qhd->hq", dob, ob)[..., None]
        dz = p * (dp - D)
        if softcap > 0:
            dz = dz * (1 - np.tanh(x[b] / softcap) ** 2)
        dq[b] = np.einsum("hqk,khd->qhd", dz, kk[b]) * scale
        dk[b] = np.einsum("hqk,qhd->khd", dz, q[b]) * scale
        if sinks is not None:
            psink = np.where(seen, ps, 0.0) / np.where(den > 0, den, 1)  # [H, Sq, 1]
            dsinks -= (psink * D)[..., 0].sum(axis=-1)
    dk = dk.reshape(B, Sk, Hk, g, -1).sum(axis=3)
    dv = dv.reshape(B, Sk, Hk, g, -1).sum(axis=3)
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)


def to_pages(g, k, v, page_size, spare=3, fill=np.nan):
    """A contiguous cache k/v [batch, skmax, heads, d(_v)] as shuffled pages
    [num_pages, page_size, heads, d(_v)] of k's dtype: every sequence owns
    ceil(skmax / page_size) pages in a random order, spare pages (and the
    last page's tail) hold fill (NaN; pass the NaN bits for integer storage).
    Returns (k_pages, v_pages, block_table int32 [batch, pages])."""
    batch, skmax = k.shape[:2]
    m = -(-skmax // page_size)
    pages = batch * m + spare
    table = g.permutation(pages)[:batch * m].reshape(batch, m).astype(np.int32)
    kp = np.full((pages, page_size) + k.shape[2:], fill, k.dtype)
    vp = np.full((pages, page_size) + v.shape[2:], fill, v.dtype)
    for b in range(batch):
        for j in range(skmax):
            kp[table[b, j // page_size], j % page_size] = k[b, j]
            vp[table[b, j // page_size], j % page_size] = v[b, j]
    return kp, vp, table


def from_pages(pages, table, skmax):
    """The inverse of to_pages: pages [num_pages, page_size, ...] read through
    block_table [batch, m] as [batch, skmax, ...]."""
    ps = pages.shape[1]
    rows = pages[table].reshape((table.shape[0], table.shape[1] * ps) + pages.shape[2:])
    return rows[:, :skmax]


def tol(dtype):
    return 4e-3 if dtype == "fp16" else 2.5e-2


def check_attention(out, lse, ref_o, ref_lse, dtype, lse_rtol=2e-3):
    """out (dtype, a DeviceArray or NumPy) and lse (fp32 [B,H,Sq]) against the
    fp64 reference: every element of O written and within tol(dtype) of the
    largest |O|; LSE -inf exactly where the reference's is (rows that see no
    key), else within lse_rtol of the largest |LSE|."""
    got = as_float(out.numpy() if hasattr(out, "numpy") else out, dtype)
    assert np.isfinite(got).all(), "O: NaN left (an element not written, or a NaN key read)"
    err = np.abs(got - ref_o).max()
    assert err <= tol(dtype) * max(1.0, np.abs(ref_o).max()), "O: max abs err %g" % err
    got_lse = lse.numpy() if hasattr(lse, "numpy") else np.asarray(lse)
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(got_lse), fin), "LSE: -inf rows differ from the reference's"
    assert (got_lse[~fin] == -np.inf).all(), "LSE: not -inf for rows that see no key"
    if fin.any():
        err = np.abs(got_lse[fin] - ref_lse[fin]).max()
        assert err <= lse_rtol * max(1.0, np.abs(ref_lse[fin]).max()), "LSE: max abs err %g" % err


def with_sinks(o, lse, sinks):
    """The fp64 softmax without sinks -> with them: the sink is one more
    term e^sink[h] of each row's denominator (no value), so
    LSE' = logaddexp(LSE, sink) and O' = O * e^(LSE - LSE')."""
    s = np.asarray(sinks, np.float64)[None, :, None]
    lse2 = np.logaddexp(lse, s)
    scale = np.where(np.isfinite(lse), np.exp(lse - np.where(np.isfinite(lse2), lse2, 0)), 0.0)
    return o * np.transpose(scale, (0, 2, 1))[..., None], lse2


def random_trees(g, n_trees, n):
    """bool [n_trees, n, n] token trees: token j > 0's parent uniform in
    [0, j); token i sees j iff j is i or an ancestor of i."""
    m = np.zeros((n_trees, n, n), bool)
    for t in range(n_trees):
        parent = [-1] + [int(g.integers(0, j)) for j in range(1, n)]
        for i in range(n):
            j = i
            while j >= 0:
                m[t, i, j] = True
                j = parent[j]
    return m


def tree_mask_visible(tree, lens, sq, skmax):
    """bool [B, sq, skmax] for ref_attention(mask=): the new tokens of
    sequence b are its last sq keys (of lens[b]); query i sees new token j
    iff tree[b or 0, i, j], every earlier key stays visible."""
    B = len(lens)
    m = np.ones((B, sq, skmax), bool)
    for b in range(B):
        first = int(lens[b]) - sq  # key of new token 0
        for j in range(max(first, 0), int(lens[b])):
            m[b, :, j] = tree[b if tree.shape[0] > 1 else 0, :, j - first]
    return m


def rope_tables(rows, rd, theta=10000.0):
    """RoPE's cos and sin [rows, rd / 2] (fp32) at base theta."""
    inv = theta ** (-np.arange(0, rd, 2) / rd)
    ang = np.arange(rows)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rope(x, pos, cos, sin, interleaved):
    """x [..., D] rotated at positions pos (same leading shape minus the last
    axis), in float64 (the kernel rounds once in fp32 then to fp16: within
    one fp16 step of this)."""
    half = cos.shape[1]
    rd = 2 * half
    x = x.astype(np.float64).copy()
    c, s = cos[pos].astype(np.float64), sin[pos].astype(np.float64)
    if interleaved:
        x0, x1 = x[..., 0:rd:2].copy(), x[..., 1:rd:2].copy()
        x[..., 0:rd:2], x[..., 1:rd:2] = x0 * c - x1 * s, x0 * s + x1 * c
    else:
        x0, x1 = x[..., :half].copy(), x[..., half:rd].copy()
        x[..., :half], x[..., half:rd] = x0 * c - x1 * s, x0 * s + x1 * c
    return x


def fp8_values(e5m2):
    """The value of every fp8 code (NaN for the NaN codes, +-inf for e5m2's)."""
    codes = np.arange(256)
    mb, bias = (2, 15) if e5m2 else (3, 7)
    e = (codes & 0x7F) >> mb
    m = codes & ((1 << mb) - 1)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    val = np.where(e == 0, m * 2.0 ** (1 - bias - mb), (2 ** mb + m) * 2.0 ** (e - bias - mb))
    val = sign * val
    if e5m2:
        val = np.where(e == 31, np.where(m == 0, sign * np.inf, np.nan), val)
    else:
        val = np.where((e == 15) & (m == 7), np.nan, val)
    return val


def quantize(x, e5m2):
    """The nearest finite fp8 code of each value (saturating)."""
    vals = fp8_values(e5m2)
    finite = np.flatnonzero(np.isfinite(vals))
    d = np.abs(x.reshape(-1, 1) - vals[finite][None, :])
    return finite[d.argmin(axis=1)].astype(np.uint8).reshape(x.shape)


def quantize_even(x, e5m2):
    """quantize() with ties to the even code (cvt.rn.satfinite)."""
    vals = fp8_values(e5m2)
    finite = np.flatnonzero(np.isfinite(vals))
    d = np.abs(x.reshape(-1, 1).astype(np.float64) - vals[finite][None, :])
    best = d.min(axis=1, keepdims=True)
    tie_odd = (d == best) & (finite[None, :] % 2 == 1)
    d = np.where(tie_odd & ((d == best).sum(axis=1, keepdims=True) > 1), np.inf, d)
    return finite[d.argmin(axis=1)].astype(np.uint8).reshape(x.shape)


FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def fp8_descales(g, fmt, shape):
    """fp32 descales that spread N(0, 1) data over fmt's range: 4 / fmax x
    uniform[0.5, 2]."""
    return (4.0 / FP8_MAX[fmt] * g.uniform(0.5, 2.0, shape)).astype(np.float32)


def fp8_tensor(g, shape, fmt, descale):
    """(codes uint8, values float64): random normal values quantised with
    descale (a scalar or broadcastable), and the values the codes hold."""
    e5 = fmt == "e5m2"
    codes = quantize(g.standard_normal(shape) / descale, e5)
    return codes, fp8_values(e5)[codes] * descale


def check_fp8_forward(got, q, k, v, scale, **kw):
    """The fp8 forward's O (float64) against the fp64 reference, within twice
    the error of the same attention with P rounded to e4m3 (the kernel's
    rounding; 2^-4 relative per probability): max |err| and ||err||_2 (or
    1e-2 ||ref||_2)."""
    assert np.isfinite(got).all(), "O: not every element written (NaN left)"
    ref = ref_attention(q, k, v, scale, **kw)[0]
    yard = ref_attention(q, k, v, scale, p_fp8=True, **kw)[0] - ref
    err = got - ref
    norm, bound = np.linalg.norm(err), 2 * np.linalg.norm(yard)
    assert norm <= max(bound, 1e-2 * np.linalg.norm(ref)), \
        "O: ||err|| %g, twice the e4m3 rounding's %g" % (norm, bound)
    worst, bound = np.abs(err).max(), 2 * np.abs(yard).max()
    assert worst <= bound + 1e-3, "O: max abs err %g, twice the e4m3 rounding's %g" % (worst, bound)


class FakeCAI:
    """A minimal __cuda_array_interface__ v3 exporter (device pointer, shape,
    byte strides, typestr, stream): on the emulator, device pointers are
    host addresses of fa_malloc'd memory."""

    def __init__(self, ptr, shape, typestr, strides=None, stream=None, version=3):
        self._cai = {"data": (ptr, False), "shape": tuple(shape), "typestr": typestr,
                     "strides": None if strides is None else tuple(strides),
                     "version": version}
        if version >= 3:
            self._cai["stream"] = stream

    @property
    def __cuda_array_interface__(self):
        return dict(self._cai)


def nan_out(rt, shape, dtype):
    """A DeviceArray output poisoned with NaN, to check every element gets written."""
    if dtype == "fp32":
        return rt.upload(np.full(shape, np.nan, np.float32))
    if dtype == "fp16":
        return rt.upload(np.full(shape, np.nan, np.float16))
    return rt.upload(np.full(shape, 0x7FC0, np.uint16), dtype="bf16")


# ---- a DLPack producer over fa_malloc'd memory --------------------------------

from flashattn import _tensors as _t  # noqa: E402

_capi = ctypes.pythonapi
_capi.PyCapsule_New.restype = ctypes.py_object
_capi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capi.PyCapsule_GetName.restype = ctypes.c_char_p
_capi.PyCapsule_GetName.argtypes = [ctypes.py_object]
_NAME = b"dltensor"


class FakeDLPack:
    """Exports a DeviceArray through __dlpack__ as kDLCUDA (emulator memory),
    with explicit or NULL strides, recording the stream asked for and every
    deleter call."""

    def __init__(self, darr, code, bits, strides=None, shape=None, device_type=2):
        self.darr = darr
        self.code, self.bits = code, bits
        self.shape = tuple(shape or darr.shape)
        self.strides = strides
        self.device_type = device_type
        self.streams, self.deleted, self.capsules = [], [], []
        self._keep = []

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        n = len(self.shape)
        shape = (ctypes.c_int64 * n)(*self.shape)
        strides = None if self.strides is None else (ctypes.c_int64 * n)(*self.strides)
        m = _t._DLManagedTensor()
        t = m.dl_tensor
        t.data = self.darr.ptr
        t.device.device_type, t.device.device_id = self.device_type, 0
        t.ndim = n
        t.dtype.code, t.dtype.bits, t.dtype.lanes = self.code, self.bits, 1
        t.shape = shape
        t.strides = strides
        t.byte_offset = 0

        def deleter(_p):
            self.deleted.append(True)

        cb = _t._DLDeleter(deleter)
        m.deleter = cb
        self._keep.append((m, shape, strides, cb))
        cap = _capi.PyCapsule_New(ctypes.addressof(m), _NAME, None)
        self.capsules.append(cap)
        return cap


def capsule_name(cap):
    return _capi.PyCapsule_GetName(cap)

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
                  alibi=None, p_fp8=False):
    """fp64 attention. q [B,Sq,H,D], k/v [B,Sk,Hk,D(v)]; seqlens_k[b] valid
    keys (default Sk); alibi: ALiBi slopes [H] or [B,H] (the logit of query
    i, key j loses slope * |i + L - Sq - j|). Returns O [B,Sq,H,Dv] and LSE
    [B,H,Sq] (-inf, O=0 for rows that see no key). p_fp8: the fp8 forward's
    rounding, each 2^8 e^(s - max) to e4m3 in P V (the row sums unrounded)."""
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
        mask = visible_mask(Sq, L, Sk, causal, window)
        sb = s[b]
        if alibi is not None:
            sl = np.asarray(alibi, np.float64)
            sl = sl if sl.ndim == 1 else sl[b]
            dist = np.abs(np.arange(Sq)[:, None] + L - Sq - np.arange(Sk)[None, :])
            sb = sb - sl[:, None, None] * dist[None]
        sb = np.where(mask[None], sb, -np.inf)
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


def to_pages(g, k, v, page_size, spare=3):
    """A contiguous cache k/v [batch, skmax, heads, d(_v)] as shuffled pages
    [num_pages, page_size, heads, d(_v)] (float32): every sequence owns
    ceil(skmax / page_size) pages in a random order, spare pages hold NaN.
    Returns (k_pages, v_pages, block_table int32 [batch, pages])."""
    batch, skmax = k.shape[:2]
    m = -(-skmax // page_size)
    pages = batch * m + spare
    table = g.permutation(pages)[:batch * m].reshape(batch, m).astype(np.int32)
    kp = np.full((pages, page_size) + k.shape[2:], np.nan, np.float32)
    vp = np.full((pages, page_size) + v.shape[2:], np.nan, np.float32)
    for b in range(batch):
        for j in range(skmax):
            kp[table[b, j // page_size], j % page_size] = k[b, j]
            vp[table[b, j // page_size], j % page_size] = v[b, j]
    return kp, vp, table


def tol(dtype):
    return 4e-3 if dtype == "fp16" else 2.5e-2


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

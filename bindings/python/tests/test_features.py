"""The feature descriptions, tests/features/*.cases (the line format is in
tests/features/README.md), through the Python binding: one test per line,
named file:line, on the emulator (sm_89 for lines with kv_dtype). Inputs
come from numpy's generator seeded with the line's seed; outputs are
poisoned (NaN) first and compared with conftest's fp64 references. A
reject line first runs its call unmutated (it must succeed), then with the
bad argument: the error's status and message are checked. An unknown op,
key or value fails the line; a line the binding cannot express is skipped
with the reason (pytest -rs prints it)."""

import glob
import os

import numpy as np
import pytest

from conftest import (FakeCAI, REPO, as_float, check_attention, check_fp8_forward, fp8_descales,
                      fp8_tensor, fp8_values, from_pages, nan_out, quantize, quantize_even,
                      random_trees, ref_attention, rope, round_to, to_pages, tree_mask_visible,
                      with_sinks)
import flashattn as fa
from flashattn import _lib

FEATURES = os.path.join(REPO, "tests", "features")
LOG2E = 1.0 / np.log(2.0)

# ---- the line format ---------------------------------------------------------

INTS = ("batch", "seqlen_q", "seqlen_k", "num_heads_q", "num_heads_kv", "head_dim", "head_dim_v",
        "num_splits", "window_left", "window_right", "seed", "page_size", "seqlen_new",
        "rotary_dim")
CHOICES = {
    "dtype": ("fp16", "bf16"), "causal": ("0", "1"), "rotary_interleaved": ("0", "1"),
    "kv_layout": ("contiguous", "paged", "ptr_array"), "alibi_slopes": ("heads", "batch"),
    "sinks": ("random",), "tree_mask": ("batch", "shared", "chain"),
    "kv_dtype": ("e4m3", "e5m2"), "q_dtype": ("e4m3", "e5m2"),
    "descale": ("tensor", "batch_heads"),
    "lse_partial_format": ("natural", "base2"), "lse_format": ("natural", "base2"),
}
COMMON = {"batch", "seqlen_q", "num_heads_q", "dtype", "seed", "sinks"}
ATTENTION = COMMON | {"seqlen_k", "num_heads_kv", "head_dim", "head_dim_v", "causal",
                      "window_left", "window_right", "softcap", "alibi_slopes", "kv_dtype",
                      "descale"}
OPS = {
    "forward": ATTENTION | {"q_dtype"},
    "decode": ATTENTION | {"num_splits", "cache_seqlens", "tree_mask", "kv_layout",
                           "page_size", "seqlen_new", "rotary_dim", "rotary_interleaved"},
    "reduce": COMMON | {"head_dim_v", "num_splits", "lse_partial_format", "lse_format"},
}
REQUIRED = {"forward": ("seqlen_q", "seqlen_k", "num_heads_q", "head_dim"),
            "decode": ("seqlen_q", "seqlen_k", "num_heads_q", "head_dim"),
            "reduce": ("seqlen_q", "num_heads_q", "head_dim_v")}
# bad= -> the ops it applies to
BAD = {"alibi_slopes_misaligned": ("forward", "decode"),
       "alibi_slopes_stride": ("forward", "decode"),
       "sinks_misaligned": ("forward", "decode", "reduce"), "sinks_without_combine": ("decode",),
       "tree_mask_row_stride": ("decode",), "lse_format": ("reduce",),
       "descale_stride": ("forward", "decode"), "descale_without_fp8": ("forward", "decode"),
       "rotary_dim": ("decode",), "rotary_without_new": ("decode",), "page_size": ("decode",)}


class CaseError(Exception):
    """A line this driver does not understand (it fails the test)."""


class Case(dict):
    """A parsed line: op and its keys (typed, defaults filled in)."""

    def need(self, cond, why):
        if not cond:
            raise CaseError(why)


def parse(text):
    op, *words = text.split()
    raw = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq or not key or not value:
            raise CaseError("%r is not key=value" % w)
        if key in raw:
            raise CaseError("key %s given twice" % key)
        raw[key] = value
    c = Case(op=op)
    if op == "reject":
        for key in ("of", "bad"):
            if key not in raw:
                raise CaseError("reject needs %s=" % key)
        c["of"], c["bad"] = raw.pop("of"), raw.pop("bad")
        c["status"] = raw.pop("status", "INVALID_ARGUMENT")
        c["message"] = raw.pop("message", "")
        if c["of"] not in OPS:
            raise CaseError("of=%s: not forward, decode or reduce" % c["of"])
        if c["bad"] not in BAD or c["of"] not in BAD[c["bad"]]:
            raise CaseError("bad=%s: unknown, or not a mutation of %s" % (c["bad"], c["of"]))
        if "FA_ERROR_" + c["status"] not in _lib.STATUS_NAMES.values():
            raise CaseError("status=%s: not an fa_status" % c["status"])
        call = c["of"]
    elif op in OPS:
        call = op
        c["bad"] = None
    else:
        raise CaseError("unknown op %r" % op)
    for key, value in raw.items():
        if key not in OPS[call]:
            raise CaseError("unknown key %r for %s" % (key, call))
        if key in INTS:
            try:
                c[key] = int(value)
            except ValueError:
                raise CaseError("%s=%s: not an integer" % (key, value)) from None
        elif key in CHOICES:
            if value not in CHOICES[key]:
                raise CaseError("%s=%s: not one of %s" % (key, value, "|".join(CHOICES[key])))
            c[key] = int(value) if CHOICES[key] == ("0", "1") else value
        elif key == "softcap":
            c[key] = float(value)
        elif key == "cache_seqlens":
            try:
                c[key] = [int(x) for x in value.split(",")]
            except ValueError:
                raise CaseError("cache_seqlens=%s: not integers" % value) from None
        else:  # a key of OPS that no branch reads: a driver defect
            raise CaseError("key %r is not mapped" % key)
    for key in REQUIRED[call]:
        c.need(key in c, "%s needs %s=" % (call, key))
    defaults = {"batch": 1, "dtype": "fp16", "causal": 0, "window_left": -1, "window_right": -1,
                "softcap": 0.0, "num_splits": 1, "seed": 0, "kv_layout": "contiguous",
                "seqlen_new": 0, "rotary_dim": 0, "rotary_interleaved": 0,
                "lse_partial_format": "natural", "lse_format": "natural"}
    for key, value in defaults.items():
        c.setdefault(key, value)
    c.setdefault("num_heads_kv", c["num_heads_q"])
    if "head_dim" in c:
        c.setdefault("head_dim_v", c["head_dim"])
    c["call"] = call
    _validate(c)
    return c


def _validate(c):
    """Combinations of keys this driver gives a meaning to."""
    bad = c["bad"]
    if c["call"] == "decode":
        lens = c.setdefault("cache_seqlens", [c["seqlen_k"]] * c["batch"])
        c.need(len(lens) == c["batch"], "cache_seqlens: %d values for batch %d"
               % (len(lens), c["batch"]))
        c.need("page_size" not in c or c["kv_layout"] == "paged" and c["page_size"] >= 1,
               "page_size is for kv_layout=paged, >= 1")
        c.setdefault("page_size", 16)
        c.need(c["rotary_dim"] == 0 or c["seqlen_new"] > 0 or bad == "rotary_without_new",
               "rotary_dim needs seqlen_new")
        c.need(not c["rotary_interleaved"] or c["rotary_dim"],
               "rotary_interleaved needs rotary_dim")
    c.need("descale" not in c or "kv_dtype" in c or bad == "descale_without_fp8",
           "descale needs kv_dtype")
    if c["call"] == "forward":
        c.need(("q_dtype" in c) == ("kv_dtype" in c),
               "forward: kv_dtype and q_dtype go together (the fp8 forward)")


# ---- inputs ------------------------------------------------------------------

def _store(x, dtype):
    """fp64 values (already rounded) in the binding's host storage type."""
    if dtype == "fp16":
        return x.astype(np.float16)
    return fa.float32_to_bf16_bits(x.astype(np.float32))


NAN_BITS = {"fp16": np.nan, "bf16": 0x7FC0, "fp8": 0x7F}


class Run:
    """One line's call: the function, its arguments, how to check its result."""

    def __init__(self, c, g, rt):
        self.c, self.g, self.rt = c, g, rt
        self.kw = {}
        self.keep = []  # device memory the mutated arguments point into

    def descales(self, names, fmts):
        """The fp8 descales of the line's descale= (None without one) into
        kw under names; returns them broadcastable to [B, S, Hk, D]."""
        c = self.c
        if "descale" not in c:
            return None
        shape = (c["batch"], c["num_heads_kv"]) if c["descale"] == "batch_heads" else ()
        ds = [fp8_descales(self.g, f, shape) for f in fmts]
        self.kw.update(zip(names, ds))
        return [d.reshape(c["batch"], 1, c["num_heads_kv"], 1) if d.ndim else d for d in ds]

    def features(self):
        """alibi_slopes and sinks, drawn as the README says."""
        c, g = self.c, self.g
        H = c["num_heads_q"]
        if "alibi_slopes" in c:
            shape = (H,) if c["alibi_slopes"] == "heads" else (c["batch"], H)
            self.kw["alibi_slopes"] = g.uniform(0.01, 0.5, shape).astype(np.float32)
        if "sinks" in c:
            s = g.uniform(-2.0, 6.0, H).astype(np.float32)
            if H > 1:
                s[1] = -np.inf
            self.kw["sinks"] = s

    def reference_sinks(self, o, lse):
        sinks = self.kw.get("sinks")
        return (o, lse) if sinks is None else with_sinks(o, lse, sinks)


def config(c, **extra):
    return fa.Config(head_dim=c.get("head_dim", c["head_dim_v"]), head_dim_v=c["head_dim_v"],
                     num_heads_q=c["num_heads_q"], num_heads_kv=c["num_heads_kv"],
                     dtype=c["dtype"], causal=bool(c.get("causal")),
                     window=(c.get("window_left", -1), c.get("window_right", -1)),
                     softcap=c.get("softcap", 0.0), **extra)


def build_forward(r):
    c, g, rt = r.c, r.g, r.rt
    B, Sq, Sk, H, Hk = (c[k] for k in ("batch", "seqlen_q", "seqlen_k", "num_heads_q",
                                        "num_heads_kv"))
    D, Dv, dt = c["head_dim"], c["head_dim_v"], c["dtype"]
    cfg = config(c, q_dtype=c.get("q_dtype"), kv_dtype=c.get("kv_dtype"))
    if "q_dtype" in c:
        qf, kvf = c["q_dtype"], c["kv_dtype"]
        dq, dk, dv = r.descales(("q_descale", "k_descale", "v_descale"), (qf, kvf, kvf)) or \
            (1.0, 1.0, 1.0)
        # a query head uses its KV head's q_descale
        dq5 = dq[..., None] if np.ndim(dq) else dq
        qc, q = fp8_tensor(g, (B, Sq, Hk, H // Hk, D), qf, dq5)
        qc, q = qc.reshape(B, Sq, H, D), q.reshape(B, Sq, H, D)
        kc, k = fp8_tensor(g, (B, Sk, Hk, D), kvf, dk)
        vc, v = fp8_tensor(g, (B, Sk, Hk, Dv), kvf, dv)
        args = (qc, kc, vc)
    else:
        q, k, v = (round_to(g.standard_normal(s), dt) for s in
                   ((B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, Dv)))
        args = tuple(_store(x, dt) for x in (q, k, v))
    r.features()
    out, lse = nan_out(rt, (B, Sq, H, Dv), dt), nan_out(rt, (B, H, Sq), "fp32")
    r.call = lambda kw: fa.forward(rt, cfg, *args, out=out, lse=lse, **kw)
    ref = dict(causal=bool(c["causal"]), window=(c["window_left"], c["window_right"]),
               softcap=c["softcap"], alibi=r.kw.get("alibi_slopes"))

    def check():
        if "q_dtype" in c:
            check_fp8_forward(as_float(out.numpy(), dt), q, k, v, cfg.softmax_scale, **ref)
            ref_lse = r.reference_sinks(*ref_attention(q, k, v, cfg.softmax_scale, **ref))[1]
            err = np.abs(lse.numpy() - ref_lse).max()
            assert err <= 3e-2 * max(1.0, np.abs(ref_lse).max()), "LSE: max abs err %g" % err
            return
        ref_o, ref_lse = r.reference_sinks(*ref_attention(q, k, v, cfg.softmax_scale, **ref))
        check_attention(out, lse, ref_o, ref_lse, dt)

    r.check = check


def _tables(g, rows, rd):
    """RoPE cos/sin fp32 [rows, rd / 2] of random angles."""
    ang = g.uniform(0.0, 2 * np.pi, (rows, rd // 2))
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def build_decode(r):
    c, g, rt = r.c, r.g, r.rt
    B, Sq, Sk, H, Hk = (c[k] for k in ("batch", "seqlen_q", "seqlen_k", "num_heads_q",
                                        "num_heads_kv"))
    D, Dv, dt, n = c["head_dim"], c["head_dim_v"], c["dtype"], c["seqlen_new"]
    kvf = c.get("kv_dtype")
    cfg = config(c, kv_dtype=kvf)
    lens = np.array(c["cache_seqlens"], np.int32)
    total = lens + n  # keys after the append
    c.need((total <= Sk).all() and (lens >= 0).all(),
           "cache_seqlens %s (default seqlen_k each) + seqlen_new %d must lie in [0, seqlen_k "
           "%d]: the cache has no room for the new keys" % (c["cache_seqlens"], n, Sk))
    past = np.arange(Sk)[None, :] >= lens[:, None]  # [B, Sk]: keys that hold NaN
    q = round_to(g.standard_normal((B, Sq, H, D)), dt)
    if kvf:
        e5 = kvf == "e5m2"
        dk, dv = r.descales(("k_descale", "v_descale"), (kvf, kvf)) or (1.0, 1.0)
        kst = quantize(g.standard_normal((B, Sk, Hk, D)) / dk, e5)
        vst = quantize(g.standard_normal((B, Sk, Hk, Dv)) / dv, e5)
        kst[past], vst[past] = NAN_BITS["fp8"], NAN_BITS["fp8"]
        fill = NAN_BITS["fp8"]
    else:
        k64, v64 = (round_to(g.standard_normal(s), dt) for s in ((B, Sk, Hk, D), (B, Sk, Hk, Dv)))
        k64[past], v64[past] = np.nan, np.nan
        kst, vst = _store(k64, dt), _store(v64, dt)
        fill = NAN_BITS[dt]
    k_before, v_before = kst.copy(), vst.copy()
    if n:
        k_new = round_to(g.standard_normal((B, n, Hk, D)), dt)
        v_new = round_to(g.standard_normal((B, n, Hk, Dv)), dt)
        r.kw.update(k_new=_store(k_new, dt), v_new=_store(v_new, dt))
    rd = c["rotary_dim"]
    cos = sin = None
    if rd:
        cos, sin = _tables(g, Sk, rd)
        if n:
            r.kw.update(rotary_cos=cos, rotary_sin=sin,
                        rotary_interleaved=bool(c["rotary_interleaved"]))
        r.tables = cos, sin
    tree = None
    if "tree_mask" in c:
        kind = c["tree_mask"]
        tree = (random_trees(g, B if kind == "batch" else 1, Sq) if kind != "chain"
                else np.tril(np.ones((Sq, Sq), bool))[None])
        r.kw["tree_mask"] = tree if kind == "batch" else tree[0]
    r.features()
    layout = c["kv_layout"]
    table = None
    if layout == "paged":
        k_in, v_in, table = to_pages(g, kst, vst, c["page_size"], fill=fill)
        r.kw["block_table"] = table
    elif layout == "ptr_array":
        k_in = [np.ascontiguousarray(kst[b]) for b in range(B)]
        v_in = [np.ascontiguousarray(vst[b]) for b in range(B)]
    else:
        k_in, v_in = kst, vst
    r.caches = k_in, v_in
    out, lse = nan_out(rt, (B, Sq, H, Dv), dt), nan_out(rt, (B, H, Sq), "fp32")

    def call(kw):
        kw = dict(kw)  # k_cache / v_cache: a mutated cache
        return fa.decode(rt, cfg, _store(q, dt), kw.pop("k_cache", k_in), kw.pop("v_cache", v_in),
                         lens, num_splits=c["num_splits"], out=out, lse=lse, **kw)

    r.call = call

    def cache_after():
        if layout == "paged":
            return from_pages(k_in, table, Sk), from_pages(v_in, table, Sk)
        if layout == "ptr_array":
            return np.stack(k_in), np.stack(v_in)
        return k_in, v_in

    def check():
        k_after, v_after = cache_after()
        want_k, want_v = k_before.copy(), v_before.copy()
        qr = q
        if n:  # the new rows, in storage; every other byte unchanged
            pos = lens[:, None] + np.arange(n)[None, :]
            k_rows = k_new
            if rd:
                k_rows = np.stack([rope(k_new[b], pos[b][:, None], cos, sin,
                                        c["rotary_interleaved"]) for b in range(B)])
                moving = c["causal"] or c["window_left"] >= 0 or c["window_right"] >= 0
                qpos = lens[:, None] + (np.arange(Sq)[None, :] if moving else 0)
                qr = np.stack([rope(q[b], np.broadcast_to(qpos[b], (Sq,))[:, None], cos, sin,
                                    c["rotary_interleaved"]) for b in range(B)])
            for b in range(B):
                rows = slice(lens[b], total[b])
                if kvf:  # fp8(float32(x) / descale), ties to even
                    want_k[b, rows] = quantize_even(k_rows[b].astype(np.float32) / _seq(dk, b), e5)
                    want_v[b, rows] = quantize_even(v_new[b].astype(np.float32) / _seq(dv, b), e5)
                else:
                    want_k[b, rows] = _store(k_rows[b], dt)
                    want_v[b, rows] = _store(v_new[b], dt)
            check_cache(k_after, want_k, v_after, want_v, lens, total, dt, exact=kvf or not rd)
        if kvf:
            kref, vref = fp8_values(e5)[want_k] * dk, fp8_values(e5)[want_v] * dv
        else:
            kref, vref = as_float(want_k, dt), as_float(want_v, dt)
            if n and rd:  # the fp64 rotation, not its rounding
                for b in range(B):
                    kref[b, lens[b]:total[b]] = k_rows[b]
        mask = None if tree is None else tree_mask_visible(tree, total, Sq, Sk)
        ref_o, ref_lse = ref_attention(qr, kref, vref, cfg.softmax_scale,
                                       causal=bool(c["causal"]),
                                       window=(c["window_left"], c["window_right"]),
                                       softcap=c["softcap"], seqlens_k=total,
                                       alibi=r.kw.get("alibi_slopes"), mask=mask)
        check_attention(out, lse, *r.reference_sinks(ref_o, ref_lse), dt)

    r.check = check


def _seq(d, b):
    """Sequence b's descale of d (a scalar or [B, 1, Hk, 1])."""
    return d[b] if np.ndim(d) else d


def check_cache(k_after, want_k, v_after, want_v, lens, total, dt, exact):
    """The KV append: V's new rows and every untouched row bit for bit; K's
    new rows too, or (RoPE into a 16-bit cache) within one rounding of the
    fp64 rotation."""
    def bits(x):
        return x.view(np.uint16) if x.dtype == np.float16 else x

    assert np.array_equal(bits(v_after), bits(want_v)), "v cache after the append"
    if exact:
        assert np.array_equal(bits(k_after), bits(want_k)), "k cache after the append"
        return
    for b in range(len(lens)):
        rows = slice(lens[b], total[b])
        keep = np.ones(k_after.shape[1], bool)
        keep[rows] = False
        assert np.array_equal(bits(k_after[b, keep]), bits(want_k[b, keep])), \
            "k cache: rows outside the append changed (sequence %d)" % b
        got, want = as_float(k_after[b, rows], dt), as_float(want_k[b, rows], dt)
        step = 2.0 ** (-10 if dt == "fp16" else -7)
        assert np.abs(got - want).max() <= step * max(1.0, np.abs(want).max()), \
            "k cache: the rotated rows of sequence %d" % b


def ref_merge(o_p, lse_p):
    """fp64 merge of partial states with natural-log LSE: O [S,B,Sq,H,Dv],
    LSE [S,B,H,Sq] -> O [B,Sq,H,Dv], LSE [B,H,Sq] (-inf, O = 0: no state)."""
    lse_r = np.moveaxis(lse_p, 3, 2)  # [S,B,Sq,H]
    m = lse_r.max(axis=0)
    seen = np.isfinite(m)
    w = np.where(seen, np.exp(lse_r - np.where(seen, m, 0)), 0.0)
    s = w.sum(axis=0)
    o = np.einsum("sbqh,sbqhd->bqhd", w, o_p) / np.where(seen, s, 1)[..., None]
    lse = np.where(seen, m + np.log(np.where(seen, s, 1)), -np.inf)
    return o, np.moveaxis(lse, 2, 1)


def build_reduce(r):
    c, g, rt = r.c, r.g, r.rt
    S, B, Sq, H, Dv, dt = (c["num_splits"], c["batch"], c["seqlen_q"], c["num_heads_q"],
                           c["head_dim_v"], c["dtype"])
    c.need(S >= 1, "reduce: num_splits >= 1")
    cfg = config(c)
    o_p = g.standard_normal((S, B, Sq, H, Dv)).astype(np.float32)
    lse_nat = (g.standard_normal((S, B, H, Sq)) * 4).astype(np.float32)
    lse_nat[S - 1, 0, 0, Sq - 1] = -np.inf  # an empty split
    if B * H * Sq > 1:
        lse_nat[:, B - 1, H - 1, 0] = -np.inf  # a row with no state
    base2 = c["lse_partial_format"] == "base2"
    lse_in = (lse_nat * np.float32(LOG2E)).astype(np.float32) if base2 else lse_nat
    r.features()
    out, lse = nan_out(rt, (B, Sq, H, Dv), dt), nan_out(rt, (B, H, Sq), "fp32")
    r.kw.update(lse_partial_format=c["lse_partial_format"], lse_format=c["lse_format"])
    r.call = lambda kw: fa.decode_reduce(rt, cfg, o_p, lse_in, out=out, lse=lse, **kw)

    def check():
        nat = lse_in.astype(np.float64) / (LOG2E if base2 else 1.0)
        ref_o, ref_lse = r.reference_sinks(*ref_merge(o_p.astype(np.float64), nat))
        if c["lse_format"] == "base2":
            ref_lse = ref_lse * LOG2E
        check_attention(out, lse, ref_o, ref_lse, dt, lse_rtol=1e-5)

    r.check = check


BUILD = {"forward": build_forward, "decode": build_decode, "reduce": build_reduce}

# ---- reject mutations ----------------------------------------------------------


def _misaligned(r, values):
    """fp32 values in device memory 2 bytes past a 4-byte boundary, as a
    __cuda_array_interface__ view."""
    raw = np.zeros(values.nbytes + 8, np.uint8)
    raw[2:2 + values.nbytes] = np.ascontiguousarray(values).view(np.uint8).ravel()
    dev = r.rt.upload(raw)
    r.keep.append(dev)
    return FakeCAI(dev.ptr + 2, values.shape, "<f4")


def _strided(r, values, strides):
    """fp32 values in device memory seen through element strides (any sign)."""
    dev = r.rt.upload(np.ascontiguousarray(values, np.float32).ravel())
    r.keep.append(dev)
    last = sum((n - 1) * s for n, s in zip(values.shape, strides) if s < 0)
    return FakeCAI(dev.ptr - 4 * last, values.shape, "<f4",
                   strides=tuple(4 * s for s in strides))


def mutate(r):
    """r.kw with the line's bad= argument; returns None when the binding
    cannot express it (the reason in r.skip)."""
    c, kw = r.c, dict(r.kw)
    bad, B, Sq, H = c["bad"], c["batch"], c["seqlen_q"], c["num_heads_q"]
    if bad == "alibi_slopes_misaligned":
        c.need("alibi_slopes" in kw, "%s needs alibi_slopes" % bad)
        kw["alibi_slopes"] = _misaligned(r, kw["alibi_slopes"])
    elif bad == "alibi_slopes_stride":  # rows num_heads_q - 1 apart
        c.need(c.get("alibi_slopes") == "batch", "%s needs alibi_slopes=batch" % bad)
        kw["alibi_slopes"] = _strided(r, kw["alibi_slopes"], (H - 1, 1))
    elif bad == "sinks_misaligned":
        c.need("sinks" in kw, "%s needs sinks" % bad)
        kw["sinks"] = _misaligned(r, kw["sinks"])
    elif bad == "sinks_without_combine":
        r.skip = ("python: decode() always writes O (the combine always runs): "
                  "sinks_without_combine (o.data = 0) cannot be expressed")
        return None
    elif bad == "tree_mask_row_stride":  # device words, rows 0 bytes apart (< 4 * ceil(Sq / 32))
        c.need("tree_mask" in kw, "%s needs tree_mask" % bad)
        words = -(-Sq // 32)
        shape = (B if c["tree_mask"] == "batch" else 1, Sq, words)
        dev = r.rt.upload(np.zeros(shape, np.int32))  # the bits are never read
        r.keep.append(dev)
        kw["tree_mask"] = FakeCAI(dev.ptr, shape, "<i4", strides=(4 * Sq * words, 0, 4))
    elif bad == "lse_format":
        kw["lse_format"] = 7
    elif bad == "descale_stride":  # descale_stride {-1, 0} for every descale
        c.need(c.get("descale") == "batch_heads", "%s needs descale=batch_heads" % bad)
        for name in ("q_descale", "k_descale", "v_descale"):
            if name in kw:
                kw[name] = _strided(r, kw[name], (-1, 0))
    elif bad == "descale_without_fp8":
        c.need("descale" in c and "kv_dtype" not in c, "%s needs descale and no kv_dtype" % bad)
        shape = () if c["descale"] == "tensor" else (B, c["num_heads_kv"])
        kw["k_descale"] = kw["v_descale"] = np.ones(shape, np.float32)
    elif bad == "rotary_dim":  # rotary_dim 8
        c.need("rotary_cos" in kw, "%s needs rotary_dim and seqlen_new" % bad)
        kw["rotary_cos"], kw["rotary_sin"] = (np.ascontiguousarray(t[:, :4]) for t in r.tables)
    elif bad == "rotary_without_new":
        c.need(c["rotary_dim"] and not c["seqlen_new"], "%s needs rotary_dim, no seqlen_new" % bad)
        kw["rotary_cos"], kw["rotary_sin"] = r.tables
    elif bad == "page_size":  # pages of 0 keys
        c.need(c["kv_layout"] == "paged", "%s needs kv_layout=paged" % bad)
        kw["k_cache"], kw["v_cache"] = (x[:, :0] for x in r.caches)
    return kw


# ---- the test ------------------------------------------------------------------


def _lines():
    params = []
    for path in sorted(glob.glob(os.path.join(FEATURES, "*.cases"))):
        name = os.path.basename(path)
        with open(path) as f:
            for lineno, text in enumerate(f, 1):
                text = text.split("#", 1)[0].strip()
                if text:
                    params.append(pytest.param(name, lineno, text, id="%s:%d" % (name, lineno)))
    return params or [pytest.param(None, 0, "", id="no-cases")]


def run_line(text, rt_for):
    c = parse(text)
    r = Run(c, np.random.default_rng(c["seed"]), rt_for(89 if "kv_dtype" in c else 0))
    BUILD[c["call"]](r)
    if c["bad"] is None:
        r.call(r.kw)
        r.check()
        return None
    kw = mutate(r)
    if kw is None:
        return r.skip
    try:  # unmutated, the call succeeds: the mutation is what the status is for
        r.call(r.kw)
        r.rt.synchronize()
    except fa.Error as e:
        raise AssertionError("without bad=%s the call fails too: %s" % (c["bad"], e)) from None
    try:
        r.call(kw)
    except fa.Error as e:
        got = e
    else:
        raise AssertionError("bad=%s: the call succeeded" % c["bad"])
    assert got.status_name == "FA_ERROR_" + c["status"], \
        "status %s, expected %s (%s)" % (got.status_name, c["status"], got.message)
    assert c["message"] in got.message, "message %r lacks %r" % (got.message, c["message"])
    return None


@pytest.mark.parametrize("name,lineno,text", _lines())
def test_feature(name, lineno, text):
    assert name is not None, "no tests/features/*.cases under %s" % FEATURES
    runtimes = {}

    def rt_for(sm):
        if sm not in runtimes:
            runtimes[sm] = fa.Runtime(backend="emulator", cache="memory", emulator_sm=sm)
        return runtimes[sm]

    where = "%s:%d: %s" % (name, lineno, text)
    failure = skip = None
    try:
        skip = run_line(text, rt_for)
    except (AssertionError, CaseError, fa.Error) as e:
        failure = "%s\n%s: %s" % (where, type(e).__name__, e)
    finally:
        for rt in runtimes.values():
            rt.close()
    if failure:
        pytest.fail(failure, pytrace=False)
    if skip:
        pytest.skip("%s: %s" % (where, skip))

"""decode_reduce(lse_partial_format=, lse_format=) (fa_lse_format, since 0.4):
natural-log and base-2 (FlashInfer) partial states against the fp64 merge."""

import numpy as np
import pytest

from conftest import as_float, nan_out, rng, tol
import flashattn as fa
from flashattn import _lib

LOG2E = 1.0 / np.log(2.0)


def ref_merge_nat(o_p, lse_p):
    """fp64 merge of states with natural-log LSE: O [B,Sq,H,Dv], LSE [B,H,Sq]."""
    o_p, lse_p = np.asarray(o_p, np.float64), np.asarray(lse_p, np.float64)
    lse_r = np.moveaxis(lse_p, 3, 2)                       # [S,B,Sq,H]
    m = lse_r.max(axis=0)
    seen = np.isfinite(m)
    w = np.where(seen, np.exp(lse_r - np.where(seen, m, 0)), 0.0)
    s = w.sum(axis=0)
    o = np.einsum("sbqh,sbqhd->bqhd", w, o_p) / np.where(seen, s, 1)[..., None]
    lse = np.where(seen, m + np.log(np.where(seen, s, 1)), -np.inf)
    return o, np.moveaxis(lse, 2, 1)


@pytest.mark.parametrize("in_fmt", ["natural", "base2"])
@pytest.mark.parametrize("out_fmt", ["natural", "base2"])
def test_reduce_lse_formats_vs_fp64(rt, in_fmt, out_fmt):
    S, B, Sq, H, Dv = 4, 2, 3, 2, 32
    dtype = "fp16"
    cfg = fa.Config(dtype=dtype, head_dim=Dv, num_heads_q=H)
    g = rng(40 + len(in_fmt) + 3 * len(out_fmt))
    o_p = g.standard_normal((S, B, Sq, H, Dv)).astype(np.float32)
    lse_nat = (g.standard_normal((S, B, H, Sq)) * 4).astype(np.float32)
    lse_nat[2, 0, 1, 2] = -np.inf       # an empty split
    lse_nat[:, 1, 0, 1] = -np.inf       # a row with no state
    lse_in = (lse_nat * np.float32(LOG2E)).astype(np.float32) if in_fmt == "base2" else lse_nat
    ref_o, ref_lse = ref_merge_nat(o_p, lse_in / (LOG2E if in_fmt == "base2" else 1.0))
    out, lse = nan_out(rt, (B, Sq, H, Dv), dtype), nan_out(rt, (B, H, Sq), "fp32")
    fa.decode_reduce(rt, cfg, o_p, lse_in, out=out, lse=lse, lse_partial_format=in_fmt,
                     lse_format=out_fmt)
    got, got_lse = as_float(out.numpy(), dtype), lse.numpy()
    assert np.isfinite(got).all()
    assert np.abs(got - ref_o).max() <= tol(dtype) * max(1.0, np.abs(ref_o).max())
    want = ref_lse * (LOG2E if out_fmt == "base2" else 1.0)
    fin = np.isfinite(want)
    assert np.array_equal(np.isfinite(got_lse), fin)
    assert (got_lse[~fin] == -np.inf).all()
    assert np.abs(got_lse[fin] - want[fin]).max() < 1e-5 * max(1.0, np.abs(want[fin]).max())


def test_decode_states_merge_in_base2(rt):
    """fa.decode's own partial states with their LSE converted to base 2 merge
    to the natural result."""
    B, Sq, H, Hk, D, Sk = 2, 2, 4, 2, 32, 200
    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=True)
    g = rng(77)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float16)
    kc = g.standard_normal((B, Sk, Hk, D)).astype(np.float16)
    vc = g.standard_normal((B, Sk, Hk, D)).astype(np.float16)
    lens = np.array([Sk, 50], np.int32)
    o_ref, lse_ref = fa.decode(rt, cfg, q, kc, vc, lens, num_splits=3)
    # The partial states, from a workspace the test owns: O_partial fp32
    # [S, B, Sq, H, D], then at the next 256-byte boundary LSE_partial fp32
    # [S, B, H, Sq] (docs/api.md).
    held = {}

    def workspace(n):
        held["ws"] = rt.empty(((n + 3) // 4,), "fp32")
        return held["ws"]

    fa.decode(rt, cfg, q, kc, vc, lens, num_splits=3, workspace=workspace)
    ws = held["ws"].numpy()
    rows = B * Sq * H
    S = next(s for s in range(1, 4)
             if (s * rows * D * 4 + 255) // 256 * 256 + s * rows * 4 == ws.nbytes)
    off = (S * rows * D * 4 + 255) // 256 * 256 // 4
    o_p = ws[: S * rows * D].reshape(S, B, Sq, H, D)
    lse_p = ws[off: off + S * rows].reshape(S, B, H, Sq)
    assert S > 1 and np.isinf(lse_p).any()  # sequence 1's last split is empty
    lse2 = (np.asarray(lse_p) * np.float32(LOG2E)).astype(np.float32)
    o, lse = fa.decode_reduce(rt, cfg, o_p, lse2, lse_partial_format="base2")
    assert np.abs(as_float(o, "fp16") - as_float(o_ref, "fp16")).max() <= 1e-3
    fin = np.isfinite(lse_ref)
    assert np.array_equal(np.isfinite(lse), fin)
    assert np.abs(lse[fin] - lse_ref[fin]).max() < 1e-5 * max(1.0, np.abs(lse_ref[fin]).max())


def test_reduce_bad_lse_format(rt):
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    o_p = np.zeros((2, 1, 1, 2, 32), np.float32)
    l_p = np.zeros((2, 1, 2, 1), np.float32)
    for kw in ({"lse_partial_format": "base10"}, {"lse_format": 2}, {"lse_format": True}):
        with pytest.raises(fa.InvalidArgumentError) as e:
            fa.decode_reduce(rt, cfg, o_p, l_p, **kw)
        assert "must be 'natural' or 'base2'" in e.value.message
    # The C library's own check, reached through the raw struct.
    a = _lib.new(_lib.fa_reduce_args)
    assert a.lse_partial_format == 0 and a.lse_format == 0
    assert _lib.LSE_NATURAL == 0 and _lib.LSE_BASE2 == 1

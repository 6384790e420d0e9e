"""decode_reduce(lse_partial_format=, lse_format=) (fa_lse_format, since 0.4):
fa.decode's own partial states (from a workspace the test owns) merged in
base 2; the binding's checks of the format names. Every input/output
format pair against the fp64 merge is tests/features/lse_formats.cases
(test_features.py)."""

import numpy as np
import pytest

from conftest import as_float, rng
import flashattn as fa
from flashattn import _lib

LOG2E = 1.0 / np.log(2.0)


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
    for kw in ({"lse_partial_format": "base10"}, {"lse_format": True}):
        with pytest.raises(fa.InvalidArgumentError) as e:
            fa.decode_reduce(rt, cfg, o_p, l_p, **kw)
        assert "must be 'natural' or 'base2'" in e.value.message
    # The C library's own check, reached through the raw struct.
    a = _lib.new(_lib.fa_reduce_args)
    assert a.lse_partial_format == 0 and a.lse_format == 0
    assert _lib.LSE_NATURAL == 0 and _lib.LSE_BASE2 == 1

"""dtype='fp32': float32 NumPy arrays in, float32 O out, no conversion pass;
the kernels round Q/K/V to bf16 on load (the reference does the same)."""

import numpy as np
import pytest

from conftest import ref_attention, rng, round_to
import flashattn as fa


def _not_16bit(o, ref):
    """The share of nonzero outputs that are not fp16 or bf16 numbers."""
    x = o[ref != 0].astype(np.float32)
    bf = fa.bf16_bits_to_float32(fa.float32_to_bf16_bits(x))
    h = x.astype(np.float16).astype(np.float32)
    return np.mean((bf != x) & (h != x))


@pytest.mark.parametrize("B,Sq,Sk,H,Hk,D,causal", [
    (2, 37, 53, 4, 2, 64, True),
    (1, 20, 70, 2, 2, 96, False),
])
def test_forward_fp32(rt, B, Sq, Sk, H, Hk, D, causal):
    cfg = fa.Config(dtype="fp32", head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=causal)
    g = rng(D + Sq)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float32)
    k = g.standard_normal((B, Sk, Hk, D)).astype(np.float32)
    v = g.standard_normal((B, Sk, Hk, D)).astype(np.float32)
    o, lse = fa.forward(rt, cfg, q, k, v, return_lse=True)
    assert o.dtype == np.float32 and o.shape == (B, Sq, H, D)
    ref_o, ref_lse = ref_attention(round_to(q, "bf16"), round_to(k, "bf16"), round_to(v, "bf16"),
                                   cfg.softmax_scale, causal)
    assert np.isfinite(o).all()
    assert np.abs(o - ref_o).max() <= 1e-2 * max(1.0, np.abs(ref_o).max())
    assert np.abs(lse - ref_lse).max() < 2e-3 * max(1.0, np.abs(ref_lse).max())
    assert _not_16bit(o, ref_o) > 0.75  # O is written as fp32, not rounded


def test_decode_fp32(rt):
    B, Skmax, H, Hk, D = 3, 80, 4, 2, 64
    seqlens = np.array([0, 33, Skmax], np.int32)
    cfg = fa.Config(dtype="fp32", head_dim=D, num_heads_q=H, num_heads_kv=Hk)
    g = rng(5)
    q = g.standard_normal((B, 1, H, D)).astype(np.float32)
    kc = g.standard_normal((B, Skmax, Hk, D)).astype(np.float32)
    vc = g.standard_normal((B, Skmax, Hk, D)).astype(np.float32)
    for b, L in enumerate(seqlens):
        kc[b, L:] = np.nan
        vc[b, L:] = np.nan
    o, lse = fa.decode(rt, cfg, q, kc, vc, seqlens, num_splits=2)
    assert o.dtype == np.float32
    ref_o, ref_lse = ref_attention(round_to(q, "bf16"), round_to(np.nan_to_num(kc), "bf16"),
                                   round_to(np.nan_to_num(vc), "bf16"), cfg.softmax_scale,
                                   seqlens_k=seqlens)
    ref_o = np.nan_to_num(ref_o)
    assert np.isfinite(o).all()
    assert np.abs(o - ref_o).max() <= 1e-2 * max(1.0, np.abs(ref_o).max())
    assert (lse[0] == -np.inf).all() and (o[0] == 0).all()
    fin = np.isfinite(ref_lse)
    assert np.abs(lse[fin] - ref_lse[fin]).max() < 2e-3
    assert _not_16bit(o[1:], ref_o[1:]) > 0.75


def test_fp32_generate():
    cfg = fa.Config(dtype="fp32", head_dim=64, num_heads_q=4)
    for sm in (80, 90):
        ptx = fa.generate(cfg, "forward", sm)
        assert "cvt.rn.bf16x2.f32" in ptx and "wgmma" not in ptx

"""alibi_slopes= (fa_forward_args/fa_decode_args.alibi_slopes, since 0.5):
ALiBi in forward and decode against an fp64 reference, with one row of
slopes for the batch and one per sequence; bad slopes."""

import numpy as np
import pytest

from conftest import as_float, nan_out, ref_attention, rng, round_to, tol
import flashattn as fa


def check(out, lse, ref_o, ref_lse, dtype):
    got = as_float(out.numpy() if hasattr(out, "numpy") else out, dtype)
    assert np.isfinite(got).all()
    assert np.abs(got - ref_o).max() <= tol(dtype) * max(1.0, np.abs(ref_o).max())
    got_lse = lse.numpy() if hasattr(lse, "numpy") else lse
    fin = np.isfinite(ref_lse)
    assert (np.isfinite(got_lse) == fin).all()
    assert np.abs(got_lse[fin] - ref_lse[fin]).max() < 2e-3 * max(1.0, np.abs(ref_lse[fin]).max())


@pytest.mark.parametrize("dtype,causal,per_seq", [("fp16", True, False), ("bf16", False, True)])
def test_forward_alibi(rt, dtype, causal, per_seq):
    B, Sq, Sk, H, Hk, D = 2, 40, 70, 4, 2, 64
    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=causal, dtype=dtype)
    g = rng(50)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float32)
    k = g.standard_normal((B, Sk, Hk, D)).astype(np.float32)
    v = g.standard_normal((B, Sk, Hk, D)).astype(np.float32)
    slopes = g.uniform(0.01, 0.5, (B, H) if per_seq else (H,)).astype(np.float32)
    ref_o, ref_lse = ref_attention(round_to(q, dtype), round_to(k, dtype), round_to(v, dtype),
                                   cfg.softmax_scale, causal=causal, alibi=slopes)
    plain_o, _ = ref_attention(round_to(q, dtype), round_to(k, dtype), round_to(v, dtype),
                               cfg.softmax_scale, causal=causal)
    assert np.abs(plain_o - ref_o).max() > 0.1  # the bias matters at this size
    out, lse = nan_out(rt, (B, Sq, H, D), dtype), nan_out(rt, (B, H, Sq), "fp32")
    qq, kk, vv = (rt.upload(fa.float32_to_bf16_bits(x), dtype="bf16") if dtype == "bf16"
                  else x.astype(np.float16) for x in (q, k, v))
    fa.forward(rt, cfg, qq, kk, vv, out=out, lse=lse, alibi_slopes=slopes)
    check(out, lse, ref_o, ref_lse, dtype)


def test_decode_alibi(rt):
    B, Sq, H, Hk, D, Sk = 3, 2, 8, 2, 32, 90
    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=True)
    g = rng(51)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float16)
    kc = g.standard_normal((B, Sk, Hk, D)).astype(np.float16)
    vc = g.standard_normal((B, Sk, Hk, D)).astype(np.float16)
    lens = np.array([Sk, 17, 0], np.int32)  # an empty sequence: O = 0, LSE = -inf
    for slopes in (g.uniform(0.01, 0.5, H).astype(np.float32),
                   g.uniform(0.01, 0.5, (B, H)).astype(np.float32)):
        ref_o, ref_lse = ref_attention(q, kc, vc, cfg.softmax_scale, causal=True, seqlens_k=lens,
                                       alibi=slopes)
        for splits in (1, 3):
            o, lse = fa.decode(rt, cfg, q, kc, vc, lens, num_splits=splits, alibi_slopes=slopes)
            check(o, lse, ref_o, ref_lse, "fp16")


def test_bad_alibi(rt):
    B, Sq, H, D, Sk = 1, 3, 2, 32, 16
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    q = np.zeros((B, Sq, H, D), np.float16)
    kc = np.zeros((B, Sk, H, D), np.float16)
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.forward(rt, cfg, q, kc, kc, alibi_slopes=np.zeros(H + 1, np.float32))
    assert "alibi_slopes" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode(rt, cfg, q, kc, kc, np.array([Sk], np.int32),
                  alibi_slopes=np.zeros((2, H), np.float32))
    assert "alibi_slopes" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.forward(rt, cfg, q, kc, kc, alibi_slopes=np.zeros((1, H, 1), np.float32))
    assert "alibi_slopes" in e.value.message

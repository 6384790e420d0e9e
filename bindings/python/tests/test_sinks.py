"""sinks= (fa_forward_args/fa_decode_args/fa_reduce_args.sinks, since 0.4.1):
gpt-oss attention sinks in forward, decode and decode_reduce, against an
fp64 reference; bad sinks."""

import numpy as np
import pytest

from conftest import as_float, nan_out, ref_attention, rng, round_to, tol
import flashattn as fa


def with_sinks(o, lse, sinks):
    """The fp64 softmax without sinks -> with them: the sink is one more
    term e^sink[h] of each row's denominator (no value), so
    LSE' = logaddexp(LSE, sink) and O' = O * e^(LSE - LSE')."""
    s = np.asarray(sinks, np.float64)[None, :, None]
    lse2 = np.logaddexp(lse, s)
    scale = np.where(np.isfinite(lse), np.exp(lse - lse2), 0.0)  # [B, H, Sq]
    return o * np.transpose(scale, (0, 2, 1))[..., None], lse2


def check(out, lse, ref_o, ref_lse, dtype):
    got = as_float(out.numpy() if hasattr(out, "numpy") else out, dtype)
    assert np.isfinite(got).all()
    assert np.abs(got - ref_o).max() <= tol(dtype) * max(1.0, np.abs(ref_o).max())
    got_lse = lse.numpy() if hasattr(lse, "numpy") else lse
    assert np.isfinite(got_lse).all()
    assert np.abs(got_lse - ref_lse).max() < 2e-3 * max(1.0, np.abs(ref_lse).max())


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_forward_sinks_window(rt, dtype):
    """A banded causal layer (gpt-oss), GQA, a query block longer than the
    keys (rows with no key: O = 0, LSE = sink)."""
    B, Sq, Sk, H, Hk, D, W = 2, 40, 30, 4, 2, 64, 8
    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=True, window=(W, -1),
                    dtype=dtype)
    g = rng(40)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float32)
    k = g.standard_normal((B, Sk, Hk, D)).astype(np.float32)
    v = g.standard_normal((B, Sk, Hk, D)).astype(np.float32)
    sinks = g.uniform(-1.0, 4.0, H).astype(np.float32)
    o0, l0 = ref_attention(round_to(q, dtype), round_to(k, dtype), round_to(v, dtype),
                           cfg.softmax_scale, causal=True, window=(W, -1))
    ref_o, ref_lse = with_sinks(o0, l0, sinks)
    assert not np.isfinite(l0).all()  # some rows see no key
    out, lse = nan_out(rt, (B, Sq, H, D), dtype), nan_out(rt, (B, H, Sq), "fp32")
    qq, kk, vv = (rt.upload(fa.float32_to_bf16_bits(x), dtype="bf16") if dtype == "bf16"
                  else x.astype(np.float16) for x in (q, k, v))
    fa.forward(rt, cfg, qq, kk, vv, out=out, lse=lse, sinks=sinks)
    check(out, lse, ref_o, ref_lse, dtype)
    rows = ~np.isfinite(l0)
    assert np.allclose(lse.numpy()[rows], np.broadcast_to(sinks[None, :, None], l0.shape)[rows])


def test_decode_and_reduce_sinks(rt):
    B, Sq, H, Hk, D, Sk = 3, 2, 4, 2, 32, 90
    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=True)
    g = rng(41)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float16)
    kc = g.standard_normal((B, Sk, Hk, D)).astype(np.float16)
    vc = g.standard_normal((B, Sk, Hk, D)).astype(np.float16)
    lens = np.array([Sk, 17, 0], np.int32)  # an empty sequence: O = 0, LSE = sink
    sinks = g.uniform(0.0, 5.0, H).astype(np.float32)
    o0, l0 = ref_attention(q, kc, vc, cfg.softmax_scale, causal=True, seqlens_k=lens)
    ref_o, ref_lse = with_sinks(o0, l0, sinks)
    for splits in (1, 3):
        o, lse = fa.decode(rt, cfg, q, kc, vc, lens, num_splits=splits, sinks=sinks)
        check(o, lse, ref_o, ref_lse, "fp16")
    # decode_reduce with sinks over two segments' states (the keys split in
    # two halves, each attended to by a forward without sinks).
    parts_o, parts_l = [], []
    for lo, hi in ((0, 45), (45, Sk)):
        seg_lens = np.clip(lens - lo, 0, hi - lo).astype(np.int32)
        c = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk)
        po, pl = ref_attention(q, kc[:, lo:hi], vc[:, lo:hi], c.softmax_scale, seqlens_k=seg_lens)
        parts_o.append(po)
        parts_l.append(pl)
    o_part = np.stack(parts_o).astype(np.float32)
    l_part = np.stack(parts_l).astype(np.float32)
    o0m, l0m = ref_attention(q, kc, vc, cfg.softmax_scale, seqlens_k=lens)
    ref_o, ref_lse = with_sinks(o0m, l0m, sinks)
    o, lse = fa.decode_reduce(rt, cfg, o_part, l_part, sinks=sinks)
    check(o, lse, ref_o, ref_lse, "fp16")


def test_bad_sinks(rt):
    B, Sq, H, D, Sk = 1, 3, 2, 32, 16
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    q = np.zeros((B, Sq, H, D), np.float16)
    kc = np.zeros((B, Sk, H, D), np.float16)
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.forward(rt, cfg, q, kc, kc, sinks=np.zeros(H + 1, np.float32))
    assert "sinks" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode(rt, cfg, q, kc, kc, np.array([Sk], np.int32), sinks=np.zeros((1, H), np.float32))
    assert "sinks" in e.value.message

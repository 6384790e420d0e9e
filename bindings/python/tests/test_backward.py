"""fa.backward (fa_backward, library 0.9) on the emulator: dQ, dK, dV (and
dsinks) element by element against conftest.ref_attention_backward (fp64,
itself checked against central differences), with the forward's own O and
LSE from fa.forward; varlen against each sequence alone; deterministic
bits; the binding's checks.

Skipped (with the reason) while the loaded library has no fa_backward."""

import numpy as np
import pytest

from conftest import as_float, ref_attention_backward, rng, round_to
import flashattn as fa
from flashattn import _lib

pytestmark = pytest.mark.skipif(not _lib.has_backward(),
                                reason="the loaded libflashattn has no fa_backward (before 0.9)")

# max |got - ref| <= GRAD_TOL * max |ref|, per tensor: the kernels round P and
# dS to the input dtype before the tensor-core products (FlashAttention-2).
GRAD_TOL = {"fp16": 1e-2, "bf16": 4e-2}


def _inputs(g, dtype, shapes):
    """Random inputs rounded to dtype: (storage arrays, fp64 values)."""
    store, vals = [], []
    for shape in shapes:
        x = round_to(g.standard_normal(shape), dtype)
        vals.append(x)
        store.append(x.astype(np.float16) if dtype == "fp16" else fa.float32_to_bf16_bits(x))
    return store, vals


def _check_grad(name, got, ref, dtype):
    got = as_float(got, dtype) if got.dtype != np.float32 else got.astype(np.float64)
    assert np.isfinite(got).all(), "%s: not finite (an element not written?)" % name
    err = np.abs(got - ref).max()
    assert err <= GRAD_TOL[dtype] * np.abs(ref).max(), \
        "%s: max abs err %g, max |ref| %g" % (name, err, np.abs(ref).max())


@pytest.mark.parametrize("dtype,B,Sq,Sk,H,Hk,D,causal,window,softcap,alibi", [
    ("fp16", 2, 20, 36, 4, 2, 32, True, (-1, -1), 0.0, False),    # GQA, causal, Sq != Sk
    ("bf16", 1, 33, 33, 2, 2, 64, False, (8, 4), 5.0, False),     # window, softcap
    ("fp16", 1, 24, 17, 2, 1, 40, False, (-1, -1), 0.0, True),    # MQA, ALiBi, head_dim 40
])
def test_backward_vs_reference(rt, dtype, B, Sq, Sk, H, Hk, D, causal, window, softcap, alibi):
    g = rng(B * 100 + Sq + D)
    (q, k, v, do), (qf, kf, vf, dof) = _inputs(
        g, dtype, [(B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, D), (B, Sq, H, D)])
    scale = D ** -0.5
    slopes = (0.1 + 0.4 * g.random(H)).astype(np.float32) if alibi else None
    cfg = fa.Config(dtype=dtype, head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=causal,
                    window=window, softcap=softcap)
    o, lse = fa.forward(rt, cfg, q, k, v, return_lse=True, alibi_slopes=slopes)
    dq, dk, dv = fa.backward(rt, cfg, q, k, v, o, lse, do, alibi_slopes=slopes)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    ref = ref_attention_backward(qf, kf, vf, dof, scale, causal, window, softcap, alibi=slopes,
                                 out=as_float(o, dtype))
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        _check_grad(name, got, want, dtype)


@pytest.mark.parametrize("Sq,Sk,causal,window", [
    (24, 16, True, (-1, -1)),   # rows 0..7 see no key (bottom-right causal)
    (8, 24, False, (2, 0)),     # keys 0..13 are seen by no row
])
def test_backward_unseen_rows_and_keys_are_zero(rt, Sq, Sk, causal, window):
    """Rows that see no key get dQ = 0 exactly, keys no row sees dK = dV = 0
    exactly; the rest as the reference."""
    g = rng(Sq + Sk)
    H, D = 2, 32
    (q, k, v, do), (qf, kf, vf, dof) = _inputs(
        g, "fp16", [(1, Sq, H, D), (1, Sk, H, D), (1, Sk, H, D), (1, Sq, H, D)])
    cfg = fa.Config(head_dim=D, num_heads_q=H, causal=causal, window=window)
    o, lse = fa.forward(rt, cfg, q, k, v, return_lse=True)
    dq, dk, dv = fa.backward(rt, cfg, q, k, v, o, lse, do)
    ref = ref_attention_backward(qf, kf, vf, dof, D ** -0.5, causal, window,
                                 out=as_float(o, "fp16"))
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        _check_grad(name, got, want, "fp16")
    if causal:
        assert not dq[:, :Sq - Sk].any()
    else:
        assert not dk[:, :Sk - Sq - window[0]].any() and not dv[:, :Sk - Sq - window[0]].any()


def test_backward_varlen_vs_each_sequence(rt):
    """Packed sequences (host cu_seqlens, one empty) equal the fp64 gradients
    of each sequence alone; causal with GQA."""
    g = rng(11)
    H, Hk, D = 4, 2, 32
    lq, lk = [5, 0, 19, 12], [9, 4, 19, 30]
    cq, ck = np.cumsum([0] + lq).astype(np.int32), np.cumsum([0] + lk).astype(np.int32)
    (q, k, v, do), (qf, kf, vf, dof) = _inputs(
        g, "bf16", [(cq[-1], H, D), (ck[-1], Hk, D), (ck[-1], Hk, D), (cq[-1], H, D)])
    cfg = fa.Config(dtype="bf16", head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=True)
    o, lse = fa.forward(rt, cfg, q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, return_lse=True)
    assert lse.shape == (H, cq[-1])
    dq, dk, dv = fa.backward(rt, cfg, q, k, v, o, lse, do, cu_seqlens_q=cq, cu_seqlens_k=ck)
    of = as_float(o, "bf16")
    for b in range(len(lq)):
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if lq[b] == 0:
            # No query row: every key of the sequence gets zero gradients.
            assert not as_float(dk[sk], "bf16").any() and not as_float(dv[sk], "bf16").any()
            continue
        ref = ref_attention_backward(qf[None, sq], kf[None, sk], vf[None, sk], dof[None, sq],
                                     D ** -0.5, causal=True, out=of[None, sq])
        for name, got, want in zip(("dq", "dk", "dv"), (dq[sq], dk[sk], dv[sk]), ref):
            _check_grad("%s of sequence %d" % (name, b), got, want[0], "bf16")


def test_backward_sinks(rt):
    """Attention sinks: dsinks[h] = -sum_i e^(sink_h - LSE_i) D_i, and the
    sinks in P's denominator for dQ/dK/dV."""
    g = rng(13)
    B, S, H, D = 2, 16, 2, 32
    (q, k, v, do), (qf, kf, vf, dof) = _inputs(g, "fp16", [(B, S, H, D)] * 4)
    sinks = np.array([0.5, 2.0], np.float32)
    cfg = fa.Config(head_dim=D, num_heads_q=H, causal=True)
    o, lse = fa.forward(rt, cfg, q, k, v, return_lse=True, sinks=sinks)
    dq, dk, dv, dsinks = fa.backward(rt, cfg, q, k, v, o, lse, do, sinks=sinks)
    assert dsinks.shape == (H,) and dsinks.dtype == np.float32
    ref = ref_attention_backward(qf, kf, vf, dof, D ** -0.5, causal=True, sinks=sinks,
                                 out=as_float(o, "fp16"))
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref[:3]):
        _check_grad(name, got, want, "fp16")
    err = np.abs(dsinks - ref[3]).max()
    assert err <= 1e-2 * max(1.0, np.abs(ref[3]).max()), (dsinks, ref[3])


def test_backward_deterministic_bits(rt):
    """deterministic=True: the same bits on every run; the atomic path agrees
    within rounding."""
    g = rng(17)
    B, S, H, D = 1, 40, 2, 64
    (q, k, v, do), _ = _inputs(g, "fp16", [(B, S, H, D)] * 4)
    cfg = fa.Config(head_dim=D, num_heads_q=H, causal=True)
    o, lse = fa.forward(rt, cfg, q, k, v, return_lse=True)
    a = fa.backward(rt, cfg, q, k, v, o, lse, do, deterministic=True)
    b = fa.backward(rt, cfg, q, k, v, o, lse, do, deterministic=True)
    for x, y in zip(a, b):
        assert np.array_equal(x.view(np.uint16), y.view(np.uint16))
    c = fa.backward(rt, cfg, q, k, v, o, lse, do)
    for x, y in zip(a, c):
        x, y = x.astype(np.float64), y.astype(np.float64)
        assert np.abs(x - y).max() <= 2e-3 * np.abs(x).max()


def test_backward_device_buffers_and_workspace(rt):
    """DeviceArray inputs and outputs, and a caller's workspace of exactly
    the size asked (too small: the library's InvalidArgumentError)."""
    g = rng(19)
    B, S, H, D = 1, 16, 2, 32
    (q, k, v, do), (qf, kf, vf, dof) = _inputs(g, "fp16", [(B, S, H, D)] * 4)
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    qd, kd, vd, dod = (rt.upload(x) for x in (q, k, v, do))
    o, lse = fa.forward(rt, cfg, qd, kd, vd, return_lse=True)
    grads = [rt.empty(x.shape, "fp16") for x in (q, k, v)]
    asked = []

    def workspace(n):
        asked.append(n)
        return rt.empty(((n + 3) // 4,), "fp32")

    got = fa.backward(rt, cfg, qd, kd, vd, o, lse, dod, dq=grads[0], dk=grads[1], dv=grads[2],
                      workspace=workspace)
    assert asked and asked[0] > 0 and all(x is y for x, y in zip(got, grads))
    ref = ref_attention_backward(qf, kf, vf, dof, D ** -0.5, out=as_float(o.numpy(), "fp16"))
    for name, x, want in zip(("dq", "dk", "dv"), got, ref):
        _check_grad(name, x.numpy(), want, "fp16")
    small = rt.empty((asked[0] // 4 - 64,), "fp32")
    with pytest.raises(fa.InvalidArgumentError, match="workspace"):
        fa.backward(rt, cfg, qd, kd, vd, o, lse, dod, workspace=small)


def test_backward_binding_checks(rt):
    g = rng(23)
    (q, k, v, do), _ = _inputs(g, "fp16", [(1, 8, 2, 32)] * 4)
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    o, lse = fa.forward(rt, cfg, q, k, v, return_lse=True)
    with pytest.raises(fa.InvalidArgumentError, match="dout: shape"):
        fa.backward(rt, cfg, q, k, v, o, lse, do[:, :4])
    with pytest.raises(fa.InvalidArgumentError, match="lse: shape"):
        fa.backward(rt, cfg, q, k, v, o, lse[:, :1], do)
    with pytest.raises(fa.InvalidArgumentError, match="dsinks is the gradient of sinks"):
        fa.backward(rt, cfg, q, k, v, o, lse, do, dsinks=np.zeros(2, np.float32))
    with pytest.raises(fa.InvalidArgumentError, match="cu_seqlens_q and cu_seqlens_k"):
        fa.backward(rt, cfg, q[0], k[0], v[0], o[0], lse[0], do[0],
                    cu_seqlens_q=np.array([0, 8], np.int32))
    with pytest.raises(fa.InvalidArgumentError, match="deterministic must be a bool"):
        fa.backward(rt, cfg, q, k, v, o, lse, do, deterministic=2)


def test_backward_unsupported_head_dim(rt):
    """Head dims past 128 that are not multiples of 16: the library's
    UnsupportedError, nothing written."""
    g = rng(29)
    (q, k, v, do), _ = _inputs(g, "fp16", [(1, 8, 1, 136)] * 4)
    cfg = fa.Config(head_dim=136, num_heads_q=1)
    o, lse = fa.forward(rt, cfg, q, k, v, return_lse=True)
    with pytest.raises(fa.UnsupportedError, match="head_dim"):
        fa.backward(rt, cfg, q, k, v, o, lse, do)

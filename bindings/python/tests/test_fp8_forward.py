"""q_dtype= / q_descale= (fa_config_desc.q_dtype and fa_forward_args.q_descale,
since 0.6): the fp8 forward (FlashAttention-3's) with Q, K and V given as fp8
bytes, on an sm_89 emulator: an e4m3 Q with an e5m2 K/V, NumPy in and out,
DLPack fp8 codes, the binding's checks. The same-format forwards (e4m3 and
e5m2, per-tensor and per-head descales, causal, bf16 O) against the fp64
reference and the library's descale_stride check are
tests/features/fp8_forward.cases (test_features.py). The tolerance is the
project's rule: twice the error of the same attention at the kernel's
precision (P rounded to e4m3, sums in full precision)."""

import numpy as np
import pytest

from conftest import (FakeDLPack, as_float, check_fp8_forward, fp8_descales, fp8_tensor, nan_out,
                      ref_attention, rng)
import flashattn as fa


@pytest.fixture
def rt89():
    with fa.Runtime(backend="emulator", cache="memory", emulator_sm=89) as r:
        yield r


@pytest.mark.parametrize("qf,kvf,dtype,per_head,causal", [
    ("e4m3", "e5m2", "bf16", True, False),
])
def test_forward_fp8(rt89, qf, kvf, dtype, per_head, causal):
    B, Sq, Sk, H, Hk, D = 2, 40, 70, 4, 2, 64
    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=causal, dtype=dtype,
                    q_dtype=qf, kv_dtype=kvf)
    assert (cfg.q_dtype, cfg.kv_dtype) == (qf, kvf)
    g = rng(70)
    shape = (B, Hk) if per_head else ()
    qd, kd, vd = (fp8_descales(g, f, shape) for f in (qf, kvf, kvf))

    def bcast(d):  # [B, Hk] -> [B, 1, Hk, 1]; Q's heads use their KV head's descale
        return d.reshape(B, 1, Hk, 1) if per_head else d

    qc, q = fp8_tensor(g, (B, Sq, Hk, H // Hk, D), qf, bcast(qd)[..., None])
    qc, q = qc.reshape(B, Sq, H, D), q.reshape(B, Sq, H, D)
    kc, k = fp8_tensor(g, (B, Sk, Hk, D), kvf, bcast(kd))
    vc, v = fp8_tensor(g, (B, Sk, Hk, D), kvf, bcast(vd))
    out = nan_out(rt89, (B, Sq, H, D), dtype)
    o, lse = fa.forward(rt89, cfg, rt89.upload(qc), rt89.upload(kc), rt89.upload(vc),
                     out=out, return_lse=True, q_descale=qd, k_descale=kd, v_descale=vd)
    assert o is out
    rt89.synchronize()
    ref_lse = ref_attention(q, k, v, cfg.softmax_scale, causal=causal)[1]
    check_fp8_forward(as_float(o.numpy(), dtype), q, k, v, cfg.softmax_scale, causal=causal)
    assert np.abs(lse.numpy() - ref_lse).max() <= 3e-2 * max(1.0, np.abs(ref_lse).max())


def test_forward_fp8_numpy(rt89):
    """uint8 NumPy q/k/v in, NumPy O (the Config's dtype) out; no descales = 1."""
    B, Sq, Sk, H, D = 1, 17, 33, 2, 32
    cfg = fa.Config(head_dim=D, num_heads_q=H, q_dtype="e4m3", kv_dtype="e4m3")
    g = rng(71)
    qc, q = fp8_tensor(g, (B, Sq, H, D), "e4m3", 1.0)
    kc, k = fp8_tensor(g, (B, Sk, H, D), "e4m3", 1.0)
    vc, v = fp8_tensor(g, (B, Sk, H, D), "e4m3", 1.0)
    o = fa.forward(rt89, cfg, qc, kc, vc)
    assert o.dtype == np.float16 and o.shape == (B, Sq, H, D)
    check_fp8_forward(o.astype(np.float64), q, k, v, cfg.softmax_scale)


@pytest.mark.parametrize("qcode,kvcode,ok", [(10, 10, True), (1, 1, True), (12, 10, False),
                                             (10, 12, False)])
def test_forward_fp8_dlpack_codes(rt89, qcode, kvcode, ok):
    """q/k/v as DLPack kDLFloat8_e4m3fn (10, torch.float8_e4m3fn),
    kDLFloat8_e5m2 (12) or uint8 (1): a format that contradicts the Config's
    q_dtype / kv_dtype is an error, not a reinterpretation."""
    B, S, H, D = 1, 24, 2, 32
    cfg = fa.Config(head_dim=D, num_heads_q=H, q_dtype="e4m3", kv_dtype="e4m3")
    g = rng(72)
    qc, q = fp8_tensor(g, (B, S, H, D), "e4m3", 1.0)
    kc, k = fp8_tensor(g, (B, S, H, D), "e4m3", 1.0)
    vc, v = fp8_tensor(g, (B, S, H, D), "e4m3", 1.0)
    fq = FakeDLPack(rt89.upload(qc), code=qcode, bits=8)
    fk = FakeDLPack(rt89.upload(kc), code=kvcode, bits=8)
    fv = FakeDLPack(rt89.upload(vc), code=kvcode, bits=8)
    out = nan_out(rt89, (B, S, H, D), "fp16")
    if not ok:
        with pytest.raises(fa.InvalidArgumentError, match="q_dtype" if qcode == 12 else "kv_dtype"):
            fa.forward(rt89, cfg, fq, fk, fv, out=out)
        return
    fa.forward(rt89, cfg, fq, fk, fv, out=out)
    rt89.synchronize()
    check_fp8_forward(out.numpy().astype(np.float64), q, k, v, cfg.softmax_scale)


def test_fp8_forward_bad_arguments(rt89):
    with pytest.raises(fa.InvalidArgumentError, match="kv_dtype"):  # an fp8 Q alone
        fa.Config(head_dim=64, num_heads_q=2, q_dtype="e4m3")
    with pytest.raises(fa.InvalidArgumentError, match="q_dtype"):
        fa.Config(head_dim=64, num_heads_q=2, q_dtype="e3m4", kv_dtype="e4m3")
    B, S, H, D = 2, 16, 2, 64
    cfg = fa.Config(head_dim=D, num_heads_q=H, q_dtype="e4m3", kv_dtype="e4m3")
    b8 = np.zeros((B, S, H, D), np.uint8)
    h16 = np.zeros((B, S, H, D), np.float16)
    with pytest.raises(fa.InvalidArgumentError, match="uint8"):  # fp16 values for an fp8 Q
        fa.forward(rt89, cfg, h16, b8, b8)
    with pytest.raises(fa.InvalidArgumentError, match="q_descale"):  # neither scalar nor [B, Hk]
        fa.forward(rt89, cfg, b8, b8, b8, q_descale=np.ones(3, np.float32))
    with pytest.raises(fa.InvalidArgumentError, match="descale_stride"):  # one stride for all
        fa.forward(rt89, cfg, b8, b8, b8, q_descale=1.0, k_descale=np.ones((B, H), np.float32))
    cfg16 = fa.Config(head_dim=D, num_heads_q=H)
    with pytest.raises(fa.InvalidArgumentError, match="q_dtype"):  # descales on a 16-bit config
        fa.forward(rt89, cfg16, h16, h16, h16, q_descale=1.0)
    with pytest.raises(fa.InvalidArgumentError, match="kv_dtype"):
        fa.forward(rt89, cfg16, h16, h16, h16, k_descale=1.0, v_descale=1.0)
    cfg_kv = fa.Config(head_dim=D, num_heads_q=H, kv_dtype="e4m3")
    with pytest.raises(fa.InvalidArgumentError, match="q_dtype"):  # q_descale with a 16-bit Q
        fa.forward(rt89, cfg_kv, h16, b8, b8, q_descale=1.0)
    lens = np.array([S, S], np.int32)
    with pytest.raises(fa.UnsupportedError, match="fa_launch"):  # decode takes a 16-bit Q
        fa.decode(rt89, cfg, h16[:, :1], b8, b8, lens)
    with fa.Runtime(backend="emulator", cache="memory", emulator_sm=80) as rt80:
        with pytest.raises(fa.UnsupportedError, match="sm_89"):  # no fp8 mma below sm_89
            fa.forward(rt80, cfg, b8, b8, b8)

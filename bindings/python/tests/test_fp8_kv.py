"""kv_dtype= / k_descale= / v_descale= (fa_config_desc.kv_dtype and the
fa_decode_args descales, since 0.5): an fp8 KV cache given as NumPy uint8
bytes or DLPack fp8 codes, on an sm_89 emulator; the binding's checks; an
e5m2 append. Decode over e4m3 / e5m2 caches with per-tensor and per-head
descales (contiguous and paged) against the fp64 reference, an e4m3 append,
and the library's descale checks are tests/features/fp8_kv.cases
(test_features.py)."""

import numpy as np
import pytest

from conftest import as_float, fp8_values, quantize, quantize_even, ref_attention, rng, tol
import flashattn as fa


@pytest.fixture
def rt89(tmp_path):
    with fa.Runtime(backend="emulator", cache="memory", emulator_sm=89) as r:
        yield r


def test_fp8_bad_arguments(rt89, tmp_path):
    with pytest.raises(fa.InvalidArgumentError):
        fa.Config(head_dim=64, num_heads_q=2, kv_dtype="e3m4")
    with pytest.raises(fa.UnsupportedError):
        fa.Config(head_dim=72, num_heads_q=2, kv_dtype="e4m3")
    cfg = fa.Config(head_dim=64, num_heads_q=2, kv_dtype="e4m3")
    q = np.zeros((1, 1, 2, 64), np.float16)
    kc = np.zeros((1, 32, 2, 64), np.uint8)
    lens = np.array([32], np.int32)
    with pytest.raises(fa.InvalidArgumentError):  # fp16 values for an fp8 cache
        fa.decode(rt89, cfg, q, kc.astype(np.float16), kc.astype(np.float16), lens)
    with pytest.raises(fa.InvalidArgumentError):  # a descale of the wrong shape
        fa.decode(rt89, cfg, q, kc, kc, lens, k_descale=np.ones(3, np.float32))
    with fa.Runtime(backend="emulator", cache="memory", emulator_sm=80) as rt80:
        with pytest.raises(fa.UnsupportedError):  # no fp8 cvt below sm_89
            fa.decode(rt80, cfg, q, kc, kc, lens)


@pytest.mark.parametrize("code,kv,ok", [(10, "e4m3", True), (12, "e5m2", True), (1, "e4m3", True),
                                        (12, "e4m3", False), (10, "e5m2", False)])
def test_fp8_dlpack_codes(rt89, code, kv, ok):
    """A device cache handed over by DLPack as kDLFloat8_e4m3fn (10, what
    torch.float8_e4m3fn exports), kDLFloat8_e5m2 (12) or uint8 (1) decodes
    the same bytes; a format that contradicts the Config's kv_dtype is an
    error, not a reinterpretation."""
    from conftest import FakeDLPack
    B, H, Hk, D, Sk = 1, 2, 1, 64, 40
    e5 = kv == "e5m2"
    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk, kv_dtype=kv)
    g = rng(61)
    q = g.standard_normal((B, 1, H, D)).astype(np.float16)
    kc = quantize(g.standard_normal((B, Sk, Hk, D)), e5)
    vc = quantize(g.standard_normal((B, Sk, Hk, D)), e5)
    lens = np.array([Sk], np.int32)
    dk, dv = rt89.upload(kc), rt89.upload(vc)
    fk, fv = FakeDLPack(dk, code=code, bits=8), FakeDLPack(dv, code=code, bits=8)
    dq = rt89.upload(q)
    do = rt89.upload(np.full(q.shape, np.nan, np.float16))
    if not ok:
        with pytest.raises(fa.InvalidArgumentError, match="kv_dtype"):
            fa.decode(rt89, cfg, dq, fk, fv, lens, out=do)
        return
    fa.decode(rt89, cfg, dq, fk, fv, lens, out=do)
    rt89.synchronize()
    k = fp8_values(e5)[kc]
    v = fp8_values(e5)[vc]
    ref_o, _ = ref_attention(q.astype(np.float32), k, v, cfg.softmax_scale, seqlens_k=lens)
    got = do.numpy().astype(np.float32)
    assert np.isfinite(got).all()
    assert np.abs(got - ref_o).max() <= tol("fp16") * max(1.0, np.abs(ref_o).max())


# e4m3 (seqlen_new 2, per-head descales) is fp8_kv.cases' append line.
@pytest.mark.parametrize("kv", ["e5m2"])
def test_decode_fp8_append(rt89, kv):
    """k_new/v_new (fp16) appended into a uint8 fp8 cache updated in place:
    the new rows are fp8(float32(x) / descale) bit for bit, every other
    byte unchanged, and O attends over them."""
    B, Sq, H, Hk, D, Sk = 2, 3, 4, 2, 64, 40
    e5 = kv == "e5m2"
    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=True, kv_dtype=kv)
    g = rng(61)
    fmax = 57344.0 if e5 else 448.0
    kd = (4.0 / fmax * g.uniform(0.5, 2.0, (B, Hk))).astype(np.float32)
    vd = (4.0 / fmax * g.uniform(0.5, 2.0, (B, Hk))).astype(np.float32)
    kd_b, vd_b = kd.reshape(B, 1, Hk, 1), vd.reshape(B, 1, Hk, 1)
    lens = np.array([30, 0], np.int32)  # before the append
    kc = np.full((B, Sk, Hk, D), 0x7F, np.uint8)
    vc = kc.copy()
    kc[0, :30] = quantize(g.standard_normal((30, Hk, D)) / kd_b[0], e5)
    vc[0, :30] = quantize(g.standard_normal((30, Hk, D)) / vd_b[0], e5)
    k_old, v_old = kc.copy(), vc.copy()
    q = g.standard_normal((B, Sq, H, D)).astype(np.float16)
    kn = g.standard_normal((B, Sq, Hk, D)).astype(np.float16)
    vn = g.standard_normal((B, Sq, Hk, D)).astype(np.float16)
    out, lse = fa.decode(rt89, cfg, q, kc, vc, lens, k_descale=kd, v_descale=vd,
                         k_new=kn, v_new=vn)
    want_k, want_v = k_old.copy(), v_old.copy()
    for b in range(B):
        rows = slice(lens[b], lens[b] + Sq)
        want_k[b, rows] = quantize_even(kn[b].astype(np.float32) / kd_b[b], e5)
        want_v[b, rows] = quantize_even(vn[b].astype(np.float32) / vd_b[b], e5)
    assert np.array_equal(kc, want_k)
    assert np.array_equal(vc, want_v)
    k = np.where(np.arange(Sk)[None, :, None, None] < (lens + Sq)[:, None, None, None],
                 fp8_values(e5)[kc] * kd_b, 0.0)
    v = np.where(np.arange(Sk)[None, :, None, None] < (lens + Sq)[:, None, None, None],
                 fp8_values(e5)[vc] * vd_b, 0.0)
    ref_o, _ = ref_attention(q.astype(np.float64), k, v, 1.0 / np.sqrt(D), causal=True,
                             seqlens_k=lens + Sq)
    got = as_float(out.numpy() if hasattr(out, "numpy") else out, "fp16")
    assert np.isfinite(got).all()
    assert np.abs(got - ref_o).max() <= tol("fp16") * max(1.0, np.abs(ref_o).max())

"""forward() against an fp64 NumPy reference, through every input path."""

import ctypes
import gc

import numpy as np
import pytest

from conftest import (FakeCAI, FakeDLPack, as_float, capsule_name, nan_out, ref_attention,
                      rng, round_to, tol)
import flashattn as fa
from flashattn import _lib


def _inputs(seed, B, Sq, Sk, H, Hk, D, Dv, dtype):
    g = rng(seed)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float32)
    k = g.standard_normal((B, Sk, Hk, D)).astype(np.float32)
    v = g.standard_normal((B, Sk, Hk, Dv)).astype(np.float32)
    return q, k, v


CASES = [
    # dtype, B, Sq, Sk, H, Hk, D, Dv, causal, window, softcap
    ("fp16", 2, 37, 53, 4, 4, 32, 32, False, (-1, -1), 0.0),
    ("fp16", 1, 40, 40, 4, 2, 64, 64, True, (-1, -1), 0.0),   # GQA, causal
    ("fp16", 1, 19, 70, 2, 1, 32, 16, True, (-1, -1), 0.0),   # MQA, Sq < Sk, Dv < D
    ("fp16", 1, 70, 19, 2, 2, 32, 32, True, (-1, -1), 0.0),   # rows without keys
    ("fp16", 1, 33, 33, 2, 2, 32, 32, False, (8, 4), 0.0),    # sliding window
    ("fp16", 1, 25, 31, 2, 2, 32, 32, False, (-1, -1), 5.0),  # softcap
    ("bf16", 2, 29, 29, 4, 2, 32, 32, True, (-1, -1), 0.0),
    ("bf16", 1, 16, 48, 2, 2, 128, 128, False, (-1, -1), 0.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_forward_numpy_vs_reference(rt, case):
    dtype, B, Sq, Sk, H, Hk, D, Dv, causal, window, softcap = case
    cfg = fa.Config(dtype=dtype, head_dim=D, head_dim_v=Dv, num_heads_q=H, num_heads_kv=Hk,
                    causal=causal, window=window, softcap=softcap)
    q, k, v = _inputs(hash(case) % 1000, B, Sq, Sk, H, Hk, D, Dv, dtype)
    o, lse = fa.forward(rt, cfg, q, k, v, return_lse=True)
    assert o.shape == (B, Sq, H, Dv) and lse.shape == (B, H, Sq) and lse.dtype == np.float32
    assert o.dtype == (np.float16 if dtype == "fp16" else np.uint16)
    ref_o, ref_lse = ref_attention(round_to(q, dtype), round_to(k, dtype), round_to(v, dtype),
                                   cfg.softmax_scale, causal, window, softcap)
    got = as_float(o, dtype)
    assert np.isfinite(got).all()
    err = np.abs(got - ref_o).max()
    assert err <= tol(dtype) * max(1.0, np.abs(ref_o).max()), err
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse), fin)  # -inf exactly where no key is seen
    assert np.abs(lse[fin] - ref_lse[fin]).max() < 2e-3 * max(1.0, np.abs(ref_lse[fin]).max())
    if not fin.all():
        assert (lse[~fin] == -np.inf).all()
        b, h, i = np.nonzero(~fin)
        assert (got[b, i, h] == 0).all()


def test_forward_device_outputs_poisoned(rt):
    """Outputs as NaN-poisoned DeviceArrays: every element gets written."""
    B, S, H, D = 1, 45, 3, 32
    cfg = fa.Config(head_dim=D, num_heads_q=H, causal=True)
    q, k, v = (rt.upload(x.astype(np.float16)) for x in _inputs(5, B, S, S, H, H, D, D, "fp16"))
    o = nan_out(rt, (B, S, H, D), "fp16")
    lse = nan_out(rt, (B, H, S), "fp32")
    o2, lse2 = fa.forward(rt, cfg, q, k, v, out=o, lse=lse)
    assert o2 is o and lse2 is lse
    got, got_lse = o.numpy(), lse.numpy()
    assert np.isfinite(got).all() and np.isfinite(got_lse).all()
    ref, ref_lse = ref_attention(q.numpy(), k.numpy(), v.numpy(), D ** -0.5, True)
    assert np.abs(got - ref).max() < 4e-3
    assert np.abs(got_lse - ref_lse).max() < 1e-3


def test_forward_numpy_out_written_in_place(rt):
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    q, k, v = _inputs(6, 1, 20, 20, 2, 2, 32, 32, "fp16")
    out = np.full((1, 20, 2, 32), np.nan, np.float16)
    res = fa.forward(rt, cfg, q, k, v, out=out)
    assert res is out and np.isfinite(out).all()
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.forward(rt, cfg, q, k, v, out=np.zeros((1, 20, 2, 32), np.float32))
    assert "NumPy output for fp16 must have dtype float16" in e.value.message


def test_forward_varlen(rt):
    H, D = 2, 32
    cfg = fa.Config(head_dim=D, num_heads_q=H, causal=True)
    lq, lk = [5, 17, 9], [12, 17, 30]
    cq, ck = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lk)])
    g = rng(7)
    q = g.standard_normal((cq[-1], H, D)).astype(np.float16)
    k = g.standard_normal((ck[-1], H, D)).astype(np.float16)
    v = g.standard_normal((ck[-1], H, D)).astype(np.float16)
    o, lse = fa.forward(rt, cfg, q, k, v, cu_seqlens_q=cq.astype(np.int32),
                        cu_seqlens_k=list(ck), return_lse=True)
    assert o.shape == q.shape and lse.shape == (H, cq[-1])
    for b in range(3):
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        ro, rl = ref_attention(q[None, sq], k[None, sk], v[None, sk], D ** -0.5, True)
        assert np.abs(o[sq] - ro[0]).max() < 4e-3
        assert np.abs(lse[:, sq] - rl[0]).max() < 1e-3
    with pytest.raises(fa.InvalidArgumentError):
        fa.forward(rt, cfg, q, k, v, cu_seqlens_q=cq.astype(np.int32))


def test_forward_strided_cai(rt):
    """A __cuda_array_interface__ view into a padded buffer: byte strides
    become element strides (head_dim 32 inside rows of 40)."""
    B, S, H, D, P = 1, 24, 2, 32, 40
    g = rng(8)
    big = g.standard_normal((B, S, H, P)).astype(np.float16)
    p = rt.malloc(big.nbytes)
    rt.memcpy_htod(p, big)
    bstrides = tuple(s for s in big.strides)  # bytes
    q = FakeCAI(p, (B, S, H, D), "<f2", strides=bstrides)
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    o = fa.forward(rt, cfg, q, q, q)
    x = big[..., :D]
    ref, _ = ref_attention(x, x, x, D ** -0.5)
    assert np.abs(o.numpy() - ref).max() < 4e-3
    rt.free(p)


def test_cai_stream_is_used(rt, monkeypatch):
    """The launch runs on the CAI 'stream' unless stream= is given; 1 (legacy
    default) becomes NULL."""
    lib = _lib.lib()
    seen = []
    real = lib.fa_launch

    def spy(r, c, a, s):
        seen.append(s)
        return real(r, c, a, s)

    monkeypatch.setattr(lib, "fa_launch", spy)
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    x = rt.upload(rng(9).standard_normal((1, 8, 2, 32)).astype(np.float16))
    o = rt.empty((1, 8, 2, 32), "fp16")
    for stream, explicit, want in [(0x5000, None, 0x5000), (1, None, None),
                                   (None, None, None), (0x5000, 0x7000, 0x7000)]:
        qv = FakeCAI(x.ptr, x.shape, "<f2", stream=stream)
        fa.forward(rt, cfg, qv, x, x, out=o, stream=explicit)
        assert seen[-1] == want, (stream, explicit, seen[-1])

    class TorchLikeStream:
        cuda_stream = 0x9000

    fa.forward(rt, cfg, x, x, x, out=o, stream=TorchLikeStream())
    assert seen[-1] == 0x9000


def test_dlpack_inputs(rt):
    """DLPack kDLCUDA capsules (fa_malloc'd emulator memory): NULL and
    explicit strides, bf16 by DLPack code; capsules are consumed and their
    deleter called exactly once."""
    B, S, H, D = 1, 21, 2, 32
    g = rng(10)
    x = g.standard_normal((B, S, H, D)).astype(np.float32)
    bits = fa.float32_to_bf16_bits(x)
    d = rt.upload(bits, dtype="bf16")
    q = FakeDLPack(d, code=4, bits=16)  # NULL strides
    k = FakeDLPack(d, code=4, bits=16, strides=d.strides)
    v = FakeDLPack(d, code=4, bits=16)
    cfg = fa.Config(dtype="bf16", head_dim=D, num_heads_q=H)
    o = fa.forward(rt, cfg, q, k, v)
    xr = round_to(x, "bf16")
    ref, _ = ref_attention(xr, xr, xr, D ** -0.5)
    assert np.abs(as_float(o.numpy(), "bf16") - ref).max() < 2.5e-2
    for t in (q, k, v):
        assert t.streams == [1]  # legacy default stream asked for
        assert t.deleted == [True]
        assert capsule_name(t.capsules[0]) == b"used_dltensor"
    # a DLPack fp16 tensor where the config wants bf16 is refused, still released
    h = FakeDLPack(d, code=2, bits=16)
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.forward(rt, cfg, h, k, v)
    assert e.value.message == "forward: q: dtype fp16 does not match the expected bf16"
    assert h.deleted == [True]


def test_dlpack_cpu_goes_through_numpy(rt):
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    x = rng(11).standard_normal((1, 9, 2, 32)).astype(np.float16)

    class CpuDL:
        def __dlpack__(self, stream=None):
            return x.__dlpack__()

        def __dlpack_device__(self):
            return (1, 0)

    o = fa.forward(rt, cfg, CpuDL(), x, x)
    assert isinstance(o, np.ndarray)  # host input: staged, NumPy output
    ref, _ = ref_attention(x, x, x, 32 ** -0.5)
    assert np.abs(o - ref).max() < 4e-3


def test_bf16_cai_needs_override(rt):
    cfg = fa.Config(dtype="bf16", head_dim=32, num_heads_q=2)
    x = rng(12).standard_normal((1, 8, 2, 32)).astype(np.float32)
    d = rt.upload(x, dtype="bf16")
    raw = FakeCAI(d.ptr, d.shape, "<u2")
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.forward(rt, cfg, raw, d, d)
    assert "as_tensor(x, dtype='bf16')" in e.value.message
    o = fa.forward(rt, cfg, fa.as_tensor(raw, dtype="bf16"), d, d)
    xr = round_to(x, "bf16")
    ref, _ = ref_attention(xr, xr, xr, 32 ** -0.5)
    assert np.abs(as_float(o.numpy(), "bf16") - ref).max() < 2.5e-2
    # NumPy uint16 bit patterns are bf16 too
    o2 = fa.forward(rt, cfg, fa.float32_to_bf16_bits(x), d, d)
    assert np.array_equal(o2, o.numpy())


def _assert_error(exc_info, cls, status, text):
    err = exc_info.value
    assert type(err) is cls and err.status == status, (type(err), err.status)
    assert text in err.message, err.message


def test_forward_errors(rt):
    D, H = 32, 2
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    x = rng(13).standard_normal((1, 16, H, D)).astype(np.float16)
    # q.stride[3] != 1: a CAI whose last byte stride is 4 (every other element)
    big = rt.upload(np.repeat(x, 2, axis=3))
    bad = FakeCAI(big.ptr, x.shape, "<f2", strides=(16 * H * 2 * D * 2, H * 2 * D * 2, 2 * D * 2, 4))
    good = rt.upload(x)
    with pytest.raises(fa.Error) as e:
        fa.forward(rt, cfg, bad, good, good)
    _assert_error(e, fa.InvalidArgumentError, 1, "fa_launch: q.stride[3] must be 1, got 2")
    # strides not multiples of 8 elements (rejected by the C API)
    odd = FakeCAI(big.ptr, x.shape, "<f2", strides=(0, 128, 72, 2))
    with pytest.raises(fa.Error) as e:
        fa.forward(rt, cfg, odd, good, good)
    _assert_error(e, fa.InvalidArgumentError, 1,
                  "fa_launch: q.stride[2] must be a non-negative multiple of 8 elements, got 36")
    # byte strides that are not whole elements (rejected by the binding)
    half = FakeCAI(big.ptr, x.shape, "<f2", strides=(0, 128, 64, 1))
    with pytest.raises(fa.Error) as e:
        fa.forward(rt, cfg, half, good, good)
    _assert_error(e, fa.InvalidArgumentError, 1, "not multiples of the item size 2")
    # wrong shapes (checked by the binding)
    with pytest.raises(fa.Error) as e:
        fa.forward(rt, cfg, x, x[:, :, :1], x)
    _assert_error(e, fa.InvalidArgumentError, 1,
                  "forward: k: shape (1, 16, 1, 32) does not match [batch=1, seqlen_k, "
                  "num_heads_kv=2, head_dim=32]")
    with pytest.raises(fa.Error) as e:
        fa.forward(rt, cfg, x[0], x, x)
    _assert_error(e, fa.InvalidArgumentError, 1, "forward: q: shape (16, 2, 32)")
    with pytest.raises(fa.Error) as e:
        fa.forward(rt, cfg, x, x, x[:, :8])
    _assert_error(e, fa.InvalidArgumentError, 1, "forward: v: shape (1, 8, 2, 32)")
    # dtype mismatches
    with pytest.raises(fa.Error) as e:
        fa.forward(rt, cfg, good, rt.upload(x.astype(np.float32)), good)
    _assert_error(e, fa.InvalidArgumentError, 1, "forward: k: dtype fp32 does not match the expected fp16")
    with pytest.raises(fa.Error) as e:
        fa.forward(rt, cfg, x.astype(np.int32), x, x)
    _assert_error(e, fa.InvalidArgumentError, 1, "must be floating")
    with pytest.raises(fa.Error) as e:
        fa.forward(rt, cfg, "q", x, x)
    _assert_error(e, fa.InvalidArgumentError, 1, "forward: q: expected a NumPy array")
    # unaligned data pointer, rejected by the C API
    un = FakeCAI(good.ptr + 2, x.shape, "<f2")
    with pytest.raises(fa.Error) as e:
        fa.forward(rt, cfg, un, good, good)
    _assert_error(e, fa.InvalidArgumentError, 1, "fa_launch:")
    assert "align" in e.value.message
    # the failed calls leaked no staging buffer: only big and good are live
    del e
    gc.collect()
    assert set(rt._allocs) == {big.ptr, good.ptr}


def test_out_of_bounds_access_is_a_launch_error(tmp_path):
    """The emulator bounds-checks every access: a CAI claiming more memory
    than was allocated fails the launch with FA_ERROR_LAUNCH."""
    with fa.Runtime(backend="emulator", cache="memory") as r:
        cfg = fa.Config(head_dim=32, num_heads_q=2)
        small = r.malloc(256)
        r.memset(small, 0, 256)
        ok = r.upload(np.zeros((1, 64, 2, 32), np.float16))
        q = FakeCAI(small, (1, 64, 2, 32), "<f2")
        with pytest.raises(fa.LaunchError) as e:
            fa.forward(r, cfg, q, ok, ok)
        assert e.value.status == 8 and e.value.message.startswith("fa_launch")


def test_struct_passed_to_c_has_struct_size(rt, monkeypatch):
    lib = _lib.lib()
    sizes = []
    real = lib.fa_launch

    def spy(r, c, a, s):
        args = ctypes.cast(a, ctypes.POINTER(_lib.fa_forward_args)).contents
        sizes.append(args.struct_size)
        return real(r, c, a, s)

    monkeypatch.setattr(lib, "fa_launch", spy)
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    x = np.ones((1, 8, 2, 32), np.float16)
    fa.forward(rt, cfg, x, x, x)
    assert sizes == [ctypes.sizeof(_lib.fa_forward_args)]

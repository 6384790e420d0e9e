"""decode() and decode_reduce() against fp64 references."""

import numpy as np
import pytest

from conftest import FakeCAI, as_float, nan_out, ref_attention, rng, round_to, tol
import flashattn as fa


@pytest.mark.parametrize("dtype,Sq,H,Hk,D,causal,splits", [
    ("fp16", 1, 4, 2, 64, False, 0),
    ("fp16", 2, 4, 4, 32, True, 3),
    ("bf16", 1, 2, 1, 32, True, 1),
    ("fp16", 3, 2, 2, 32, True, 0),
])
def test_decode_vs_reference(rt, dtype, Sq, H, Hk, D, causal, splits):
    B, Skmax = 4, 96
    seqlens = np.array([0, 1, 37, Skmax], np.int32)  # includes an empty cache
    cfg = fa.Config(dtype=dtype, head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=causal)
    g = rng(Sq * 100 + H)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float32)
    kc = g.standard_normal((B, Skmax, Hk, D)).astype(np.float32)
    vc = g.standard_normal((B, Skmax, Hk, D)).astype(np.float32)
    # positions past cache_seqlens hold (finite) garbage that must be ignored
    for b, L in enumerate(seqlens):
        kc[b, L:] = 1e4
        vc[b, L:] = -1e3
    o, lse = fa.decode(rt, cfg, q, kc, vc, seqlens, num_splits=splits)
    assert o.shape == (B, Sq, H, D) and lse.shape == (B, H, Sq)
    ref_o, ref_lse = ref_attention(round_to(q, dtype), round_to(kc, dtype), round_to(vc, dtype),
                                   cfg.softmax_scale, causal, seqlens_k=seqlens)
    got = as_float(o, dtype)
    assert np.isfinite(got).all()
    ref_o = np.nan_to_num(ref_o)
    assert np.abs(got - ref_o).max() <= tol(dtype) * max(1.0, np.abs(ref_o).max())
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse), fin)
    assert (lse[0] == -np.inf).all() and (got[0] == 0).all()  # cache_seqlens 0
    assert np.abs(lse[fin] - ref_lse[fin]).max() < 2e-3 * max(1.0, np.abs(ref_lse[fin]).max())


def test_decode_ignores_nan_past_cache_seqlens(rt):
    B, Skmax, H, D = 2, 64, 2, 32
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    g = rng(6)
    q = g.standard_normal((B, 1, H, D)).astype(np.float16)
    kc = g.standard_normal((B, Skmax, H, D)).astype(np.float16)
    vc = g.standard_normal((B, Skmax, H, D)).astype(np.float16)
    seqlens = np.array([1, 37], np.int32)
    for b, L in enumerate(seqlens):
        vc[b, L:] = np.nan
    o, _ = fa.decode(rt, cfg, q, kc, vc, seqlens)
    ref, _ = ref_attention(q, kc, vc, D ** -0.5, seqlens_k=seqlens)
    assert np.isfinite(o).all()
    assert np.abs(o - ref).max() < 4e-3


def test_decode_device_tensors_poisoned(rt):
    B, Sq, H, D, Skmax = 2, 1, 2, 32, 64
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    g = rng(3)
    q = rt.upload(g.standard_normal((B, Sq, H, D)).astype(np.float16))
    kc = rt.upload(g.standard_normal((B, Skmax, H, D)).astype(np.float16))
    vc = rt.upload(g.standard_normal((B, Skmax, H, D)).astype(np.float16))
    cs = rt.upload(np.array([64, 5], np.int32))
    o, lse = nan_out(rt, (B, Sq, H, D), "fp16"), nan_out(rt, (B, H, Sq), "fp32")
    o2, lse2 = fa.decode(rt, cfg, q, kc, vc, cs, out=o, lse=lse, num_splits=2)
    assert o2 is o and lse2 is lse
    ref_o, ref_lse = ref_attention(q.numpy(), kc.numpy(), vc.numpy(), D ** -0.5,
                                   seqlens_k=[64, 5])
    assert np.isfinite(o.numpy()).all() and np.isfinite(lse.numpy()).all()
    assert np.abs(o.numpy() - ref_o).max() < 4e-3
    assert np.abs(lse.numpy() - ref_lse).max() < 1e-3
    # the workspace is reused on the same stream and thread, and grows when needed
    ws = dict(rt._workspaces)
    assert len(ws) == 1
    fa.decode(rt, cfg, q, kc, vc, cs, out=o, lse=lse, num_splits=2)
    assert rt._workspaces == ws
    q4 = g.standard_normal((B, 4, H, D)).astype(np.float16)  # 4x the partial states
    o4, _ = fa.decode(rt, cfg, q4, kc, vc, cs, num_splits=2)
    (_, (_, size)), = rt._workspaces.items()
    assert size > list(ws.values())[0][1]
    ref4, _ = ref_attention(q4, kc.numpy(), vc.numpy(), D ** -0.5, seqlens_k=[64, 5])
    assert np.abs(o4 - ref4).max() < 4e-3


def test_decode_split_counters(rt):
    """split_counters (0.8): the combine fused into the decode kernel gives
    the bits of the two launches; the binding's counters (True) and the
    caller's (zeroed device memory) are zero after each call; a short
    array is refused naming split_counters_size."""
    B, Sq, H, Hk, D, Skmax = 2, 1, 4, 2, 64, 300
    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk)
    g = rng(11)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float16)
    kc = g.standard_normal((B, Skmax, Hk, D)).astype(np.float16)
    vc = g.standard_normal((B, Skmax, Hk, D)).astype(np.float16)
    seqlens = np.array([300, 123], np.int32)
    o0, lse0 = fa.decode(rt, cfg, q, kc, vc, seqlens, num_splits=3)
    o1, lse1 = fa.decode(rt, cfg, q, kc, vc, seqlens, num_splits=3, split_counters=True)
    assert np.array_equal(o0.view(np.uint16), o1.view(np.uint16))
    assert np.array_equal(lse0.view(np.uint32), lse1.view(np.uint32))
    ref, _ = ref_attention(q, kc, vc, D ** -0.5, seqlens_k=seqlens)
    assert np.abs(o1 - ref).max() < 4e-3
    (ptr, size), = [v for k, v in rt._workspaces.items() if k[0] == "counters"]
    assert size >= 4 * B * Hk
    ctr = rt.upload(np.zeros(B * Hk, np.int32))
    for _ in range(2):  # one array, two calls in a row
        o2, _ = fa.decode(rt, cfg, q, kc, vc, seqlens, num_splits=3, split_counters=ctr)
        assert np.array_equal(o0.view(np.uint16), o2.view(np.uint16))
        assert (ctr.numpy() == 0).all()
    short = rt.upload(np.zeros(B * Hk - 1, np.int32))
    with pytest.raises(fa.InvalidArgumentError, match="split_counters_size"):
        fa.decode(rt, cfg, q, kc, vc, seqlens, num_splits=3, split_counters=short)


def test_decode_threads_share_a_runtime(rt):
    """Concurrent decodes from several threads on one runtime (each thread
    gets its own workspace) all match the reference."""
    import threading

    B, H, D, Skmax = 2, 2, 32, 64
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    results, errors = {}, []

    def work(i):
        try:
            g = rng(100 + i)
            q = g.standard_normal((B, 1, H, D)).astype(np.float16)
            kc = g.standard_normal((B, Skmax, H, D)).astype(np.float16)
            vc = g.standard_normal((B, Skmax, H, D)).astype(np.float16)
            cs = np.array([Skmax, 9 + i], np.int32)
            o, _ = fa.decode(rt, cfg, q, kc, vc, cs, num_splits=4)
            ref, _ = ref_attention(q, kc, vc, D ** -0.5, seqlens_k=cs)
            results[i] = np.abs(o - ref).max()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 4 and max(results.values()) < 4e-3


def test_decode_errors(rt):
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    q = np.zeros((2, 1, 2, 32), np.float16)
    kc = np.zeros((2, 16, 2, 32), np.float16)
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode(rt, cfg, q, kc, kc, np.array([1], np.int32))
    assert e.value.status == 1 and "decode: cache_seqlens: shape (1,)" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode(rt, cfg, q, kc, kc, np.array([1, 2.5]))
    assert "must be an integer array" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode(rt, cfg, q, kc[:1], kc, [1, 1])
    assert "decode: k_cache: shape (1, 16, 2, 32)" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode(rt, cfg, q, kc, kc, [1, 1], num_splits=-1)
    assert e.value.message.startswith("fa_decode") and "num_splits" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode(rt, cfg, q, kc, kc, [1, 17])  # > seqlen_k_max
    assert e.value.message == "decode: cache_seqlens[1] = 17 is outside [0, seqlen_k_max=16]"


def ref_merge(o_p, lse_p):
    """m = max_s LSE_s, w_s = exp(LSE_s - m), O = sum w_s O_s / sum w_s,
    LSE = m + log sum w_s; all -inf gives O = 0, LSE = -inf."""
    lse_t = np.transpose(lse_p, (0, 1, 3, 2)).astype(np.float64)  # [S,B,Sq,H]
    m = lse_t.max(axis=0)
    seen = np.isfinite(m)
    w = np.where(seen, np.exp(lse_t - np.where(seen, m, 0)), 0.0)
    sw = w.sum(axis=0)
    o = (w[..., None] * o_p).sum(axis=0) / np.where(seen, sw, 1)[..., None]
    lse = np.where(seen, m + np.log(np.where(seen, sw, 1)), -np.inf)
    return np.where(seen[..., None], o, 0.0), np.transpose(lse, (0, 2, 1))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_decode_reduce_vs_merge_formula(rt, dtype):
    S, B, Sq, H, Dv = 3, 2, 2, 4, 32
    cfg = fa.Config(dtype=dtype, head_dim=64, head_dim_v=Dv, num_heads_q=H)
    g = rng(4)
    o_p = g.standard_normal((S, B, Sq, H, Dv)).astype(np.float32)
    lse_p = (g.standard_normal((S, B, H, Sq)) * 3).astype(np.float32)
    lse_p[1, 0, 1, 0] = -np.inf          # one empty split
    lse_p[:, 1, 2, 1] = -np.inf          # a row with no state at all
    o_p[:, 1, 1, 2] = 7.0                 # its O must not leak
    o, lse = fa.decode_reduce(rt, cfg, o_p, lse_p)
    ref_o, ref_lse = ref_merge(o_p, lse_p)
    got = as_float(o, dtype)
    assert np.abs(got - ref_o).max() <= tol(dtype) * max(1.0, np.abs(ref_o).max())
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse), fin)
    assert np.abs(lse[fin] - ref_lse[fin]).max() < 1e-5 * max(1.0, np.abs(ref_lse).max() if
                                                               fin.all() else 10)
    assert lse[1, 2, 1] == -np.inf and (got[1, 1, 2] == 0).all()


def test_decode_reduce_strided_device_partials(rt):
    """Partial states with non-contiguous strides (a CAI over split-major
    buffers laid out [B, S, ...]) and poisoned device outputs."""
    S, B, Sq, H, Dv = 4, 2, 1, 2, 32
    cfg = fa.Config(head_dim=Dv, num_heads_q=H)
    g = rng(5)
    o_bs = g.standard_normal((B, S, Sq, H, Dv)).astype(np.float32)  # memory order B,S
    l_bs = g.standard_normal((B, S, H, Sq)).astype(np.float32)
    do, dl = rt.upload(o_bs), rt.upload(l_bs)
    ob = np.array(o_bs.strides)
    lb = np.array(l_bs.strides)
    o_view = FakeCAI(do.ptr, (S, B, Sq, H, Dv), "<f4",
                     strides=(ob[1], ob[0], ob[2], ob[3], ob[4]))
    l_view = FakeCAI(dl.ptr, (S, B, H, Sq), "<f4", strides=(lb[1], lb[0], lb[2], lb[3]))
    out, lse = nan_out(rt, (B, Sq, H, Dv), "fp16"), nan_out(rt, (B, H, Sq), "fp32")
    fa.decode_reduce(rt, cfg, o_view, l_view, out=out, lse=lse)
    ref_o, ref_lse = ref_merge(np.swapaxes(o_bs, 0, 1), np.swapaxes(l_bs, 0, 1))
    assert np.abs(out.numpy() - ref_o).max() < 4e-3
    assert np.abs(lse.numpy() - ref_lse).max() < 1e-5 * 10


def test_decode_reduce_errors(rt):
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    o_p = np.zeros((2, 1, 1, 2, 32), np.float32)
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode_reduce(rt, cfg, o_p, np.zeros((2, 1, 1, 2), np.float32))
    assert "decode_reduce: lse_partial: shape (2, 1, 1, 2) does not match" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode_reduce(rt, cfg, o_p[:, :, :, :, :16], np.zeros((2, 1, 2, 1), np.float32))
    assert "head_dim_v=32" in e.value.message

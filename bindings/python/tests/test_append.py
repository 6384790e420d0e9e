"""k_new/v_new and rotary_* of decode() (fa_decode_args since 0.5, as
flash_attn_with_kvcache): the new keys/values are appended to the cache in
place (NumPy caches copied back, paged caches through the block table), Q
and the new K rotated (NeoX and GPT-J pairs), against an fp64 reference of
the same rotation; bad append arguments."""

import numpy as np
import pytest

from conftest import ref_attention, rng, tol
import flashattn as fa


def rope(x, pos, cos, sin, interleaved):
    """x [..., D] rotated at positions pos (same leading shape minus the last
    axis), in float64 (the kernel rounds once in fp32 then to fp16: within
    one fp16 step of this)."""
    half = cos.shape[1]
    rd = 2 * half
    x = x.astype(np.float64).copy()
    c, s = cos[pos].astype(np.float64), sin[pos].astype(np.float64)
    if interleaved:
        x0, x1 = x[..., 0:rd:2].copy(), x[..., 1:rd:2].copy()
        x[..., 0:rd:2], x[..., 1:rd:2] = x0 * c - x1 * s, x0 * s + x1 * c
    else:
        x0, x1 = x[..., :half].copy(), x[..., half:rd].copy()
        x[..., :half], x[..., half:rd] = x0 * c - x1 * s, x0 * s + x1 * c
    return x


def tables(rows, rd, theta=10000.0):
    inv = theta ** (-np.arange(0, rd, 2) / rd)
    ang = np.arange(rows)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("paged", [False, True])
def test_decode_append_rotary(rt, interleaved, paged):
    B, Sq, H, Hk, D, Skmax, RD, PS = 2, 2, 4, 2, 64, 48, 32, 16
    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=True)
    g = rng(50 + interleaved + 2 * paged)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float16)
    cache_k = g.standard_normal((B, Skmax, Hk, D)).astype(np.float16)
    cache_v = g.standard_normal((B, Skmax, Hk, D)).astype(np.float16)
    k_new = g.standard_normal((B, Sq, Hk, D)).astype(np.float16)
    v_new = g.standard_normal((B, Sq, Hk, D)).astype(np.float16)
    lens = np.array([30, 5], np.int32)  # before the append
    cos, sin = tables(Skmax, RD)
    # Expected cache and rotated Q (positions lens[b] + t).
    pos = lens[:, None] + np.arange(Sq)[None, :]
    want_k, want_v = cache_k.astype(np.float64), cache_v.astype(np.float64)
    for b in range(B):
        want_k[b, lens[b]:lens[b] + Sq] = rope(k_new[b], pos[b][:, None], cos, sin, interleaved)
        want_v[b, lens[b]:lens[b] + Sq] = v_new[b]
    q_rot = np.stack([rope(q[b], pos[b][:, None], cos, sin, interleaved) for b in range(B)])
    ref_o, ref_lse = ref_attention(q_rot, want_k, want_v, cfg.softmax_scale, causal=True,
                                   seqlens_k=lens + Sq)
    kw = dict(k_new=k_new, v_new=v_new, rotary_cos=cos, rotary_sin=sin,
              rotary_interleaved=interleaved)
    if paged:
        P = B * Skmax // PS
        table = g.permutation(P).astype(np.int32).reshape(B, Skmax // PS)
        kp = np.empty((P, PS, Hk, D), np.float16)
        vp = np.empty((P, PS, Hk, D), np.float16)
        kp[table.ravel()] = cache_k.reshape(B * Skmax // PS, PS, Hk, D)
        vp[table.ravel()] = cache_v.reshape(B * Skmax // PS, PS, Hk, D)
        out, lse = fa.decode(rt, cfg, q, kp, vp, lens, block_table=table, num_splits=2, **kw)
        got_k = kp[table.ravel()].reshape(B, Skmax, Hk, D)
        got_v = vp[table.ravel()].reshape(B, Skmax, Hk, D)
    else:
        out, lse = fa.decode(rt, cfg, q, cache_k, cache_v, lens, num_splits=2, **kw)
        got_k, got_v = cache_k, cache_v
    o = out.astype(np.float64)
    assert np.isfinite(o).all()
    assert np.abs(o - ref_o).max() <= tol("fp16") * max(1.0, np.abs(ref_o).max())
    assert np.abs(lse - ref_lse).max() < 2e-3 * max(1.0, np.abs(ref_lse).max())
    # The cache was updated in place: new rows within one fp16 step of the
    # fp64 rotation, V rows exact, every other row untouched.
    for b in range(B):
        rows = slice(lens[b], lens[b] + Sq)
        assert np.allclose(got_k[b, rows], want_k[b, rows], rtol=2e-3, atol=2e-3)
        assert (got_v[b, rows] == v_new[b]).all()
        keep = np.ones(Skmax, bool)
        keep[rows] = False
        assert (got_k[b, keep] == want_k[b, keep]).all()


def test_decode_append_bad(rt):
    cfg = fa.Config(head_dim=64, num_heads_q=2, num_heads_kv=1)
    q = np.zeros((1, 1, 2, 64), np.float16)
    kc = np.zeros((1, 8, 1, 64), np.float16)
    kn = np.zeros((1, 1, 1, 64), np.float16)
    cos, sin = tables(8, 32)
    with pytest.raises(fa.InvalidArgumentError, match="need k_new"):
        fa.decode(rt, cfg, q, kc, kc.copy(), [3], rotary_cos=cos, rotary_sin=sin)
    with pytest.raises(fa.InvalidArgumentError, match="needs v_new"):
        fa.decode(rt, cfg, q, kc, kc.copy(), [3], k_new=kn)
    with pytest.raises(fa.InvalidArgumentError, match="seqlen_k_max - seqlen_new"):
        fa.decode(rt, cfg, q, kc, kc.copy(), [8], k_new=kn, v_new=kn)
    with pytest.raises(fa.InvalidArgumentError, match="updated in place"):
        fa.decode(rt, cfg, q, kc.astype(np.float32), kc.copy(), [3], k_new=kn, v_new=kn)
    c24, s24 = tables(8, 24)
    with pytest.raises(fa.InvalidArgumentError, match="rotary_dim"):
        fa.decode(rt, cfg, q, kc, kc.copy(), [3], k_new=kn, v_new=kn, rotary_cos=c24,
                  rotary_sin=s24)

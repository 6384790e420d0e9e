"""KV cache layouts (C API 0.3): paged and pointer-array caches through
decode() and forward() (chunked prefill with seqused_k), compared with the
same data laid out contiguously through the same binding; batch_invariant
decode compared bit for bit; the host checks of the new arguments."""

import math

import numpy as np
import pytest

from conftest import FakeCAI, as_float, nan_out, ref_attention, rng, round_to, to_pages
import flashattn as fa
from flashattn import _lib

B, HQ, HK, D = 3, 8, 2, 64  # GQA: 4 query heads per KV head


def _cache(g, batch, skmax, lens, dtype, d=D):
    """Contiguous k/v [batch, skmax, HK, d] with NaN in V past each length
    (never read) and their values rounded to dtype (float32)."""
    k = round_to(g.standard_normal((batch, skmax, HK, d)), dtype).astype(np.float32)
    v = round_to(g.standard_normal((batch, skmax, HK, d)), dtype).astype(np.float32)
    for b, n in enumerate(lens):
        v[b, n:] = np.nan
    return k, v


def _host(x, dtype):
    return x.astype(np.float16) if dtype == "fp16" else fa.float32_to_bf16_bits(x)


def _check_lse(got, want):
    """fp32 LSE: -inf in the same places (rows that see no key), else close."""
    fin = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), fin)
    assert (got[~fin] == -np.inf).all() and (want[~fin] == -np.inf).all()
    assert not fin.any() or np.abs(got[fin] - want[fin]).max() < 1e-4


def _check_close(got, want, dtype, what):
    got, want = as_float(got, dtype), as_float(want, dtype)
    assert np.isfinite(got).all(), "%s: not every element written" % what
    err = np.abs(got - want).max()
    assert err <= 2e-3, "%s: max abs err %g vs contiguous" % (what, err)


# page_size 16 and 3 (fp16 and bf16, causal, GQA, split or not) against the
# fp64 reference are tests/features/kv_layouts.cases (test_features.py).
@pytest.mark.parametrize("page_size,dtype,causal,sq", [
    (1, "fp16", True, 1),
    (64, "bf16", False, 1),
])
def test_paged_decode_matches_contiguous(rt, page_size, dtype, causal, sq):
    g = rng(page_size)
    skmax = 90
    lens = np.array([skmax, 1, skmax - page_size // 2 - 5], np.int32)  # full, one key, mid-page
    cfg = fa.Config(dtype=dtype, head_dim=D, num_heads_q=HQ, num_heads_kv=HK, causal=causal)
    q = g.standard_normal((B, sq, HQ, D)).astype(np.float32)
    k, v = _cache(g, B, skmax, lens, dtype)
    o_ref, lse_ref = fa.decode(rt, cfg, q, _host(k, dtype), _host(v, dtype), lens)
    kp, vp, table = to_pages(g, k, v, page_size)
    dk, dv = rt.upload(_host(kp, dtype), dtype), rt.upload(_host(vp, dtype), dtype)
    o, lse = nan_out(rt, (B, sq, HQ, D), dtype), nan_out(rt, (B, HQ, sq), "fp32")
    o2, lse2 = fa.decode(rt, cfg, q, dk, dv, lens, block_table=table, out=o, lse=lse)
    assert o2 is o and lse2 is lse
    _check_close(o.numpy(), o_ref, dtype, "paged O")
    _check_lse(lse.numpy(), lse_ref)
    # and both agree with the fp64 reference
    want, _ = ref_attention(q.astype(np.float16) if dtype == "fp16" else round_to(q, dtype),
                            k, v, cfg.softmax_scale, causal, seqlens_k=lens)
    assert np.abs(as_float(o.numpy(), dtype) - want).max() < (4e-3 if dtype == "fp16" else 2.5e-2)


def test_paged_decode_hnd_pages_and_strided_table(rt):
    """FlashInfer's HND pages [num_pages, HK, page_size, D] as a view with
    swapped strides, and a device block table whose rows are longer than
    max_pages_per_seq (unused tail -1)."""
    g = rng(7)
    ps, skmax = 16, 80
    lens = np.array([80, 33, 5], np.int32)
    cfg = fa.Config(head_dim=D, num_heads_q=HQ, num_heads_kv=HK)
    q = g.standard_normal((B, 1, HQ, D)).astype(np.float16)
    k, v = _cache(g, B, skmax, lens, "fp16")
    o_ref, lse_ref = fa.decode(rt, cfg, q, k.astype(np.float16), v.astype(np.float16), lens)
    kp, vp, table = to_pages(g, k, v, ps)
    P, M = kp.shape[0], table.shape[1]
    hnd_k = rt.upload(np.ascontiguousarray(kp.transpose(0, 2, 1, 3)).astype(np.float16))
    hnd_v = rt.upload(np.ascontiguousarray(vp.transpose(0, 2, 1, 3)).astype(np.float16))
    nhd = (P, ps, HK, D)
    byte = lambda s: tuple(2 * x for x in s)  # noqa: E731
    hnd_strides = byte((HK * ps * D, D, ps * D, 1))  # token stride D, head stride ps * D
    kview = FakeCAI(hnd_k.ptr, nhd, "<f2", strides=hnd_strides)
    vview = FakeCAI(hnd_v.ptr, nhd, "<f2", strides=hnd_strides)
    wide = np.full((B, M + 5), -1, np.int32)
    wide[:, :M] = table
    dt = rt.upload(wide)
    tview = FakeCAI(dt.ptr, (B, M), "<i4", strides=(4 * (M + 5), 4))
    o = nan_out(rt, (B, 1, HQ, D), "fp16")
    fa.decode(rt, cfg, q, kview, vview, rt.upload(lens), block_table=tview, out=o)
    _check_close(o.numpy(), o_ref, "fp16", "HND pages")


def test_pointer_array_decode_matches_contiguous(rt):
    """One tensor per sequence, each only as long as it needs (NumPy and
    device tensors mixed), GQA 8:2, against the contiguous cache."""
    g = rng(11)
    skmax = 75
    lens = np.array([75, 20, 0], np.int32)
    cfg = fa.Config(head_dim=D, num_heads_q=HQ, num_heads_kv=HK, causal=True)
    q = g.standard_normal((B, 2, HQ, D)).astype(np.float16)
    k, v = _cache(g, B, skmax, lens, "fp16")
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    o_ref, lse_ref = fa.decode(rt, cfg, q, k16, v16, lens)
    caps = [75, 24, 8]
    ks = [k16[0, :caps[0]], rt.upload(np.ascontiguousarray(k16[1, :caps[1]])), k16[2, :caps[2]]]
    vs = [rt.upload(np.ascontiguousarray(v16[0, :caps[0]])), v16[1, :caps[1]], v16[2, :caps[2]]]
    o = nan_out(rt, (B, 2, HQ, D), "fp16")
    lse = nan_out(rt, (B, HQ, 2), "fp32")
    fa.decode(rt, cfg, q, ks, vs, lens, out=o, lse=lse)
    _check_close(o.numpy(), o_ref, "fp16", "pointer-array O")
    _check_lse(lse.numpy(), lse_ref)
    assert (lse.numpy()[2] == -np.inf).all() and (o.numpy()[2] == 0).all()  # empty sequence


@pytest.fixture
def splits_seen(monkeypatch):
    """Records the split count fa_decode_workspace_size reports for each decode."""
    lib = _lib.lib()
    real = lib.fa_decode_workspace_size
    seen = []

    def spy(rt_h, cfg_h, args, nbytes, splits):
        st = real(rt_h, cfg_h, args, nbytes, splits)
        seen.append(splits._obj.value)
        return st

    monkeypatch.setattr(lib, "fa_decode_workspace_size", spy)
    return seen


def test_batch_invariant_bits_alone_and_in_a_batch(rt, splits_seen):
    """A sequence of 3000 keys (paged, page_size 16) decoded alone and as the
    last of a batch of 3 with other lengths: with batch_invariant its O and
    LSE bits are identical, and the splits are FA_DECODE_INVARIANT_SPLIT keys
    each (2 alone, 3 for the batch's 4500-key capacity)."""
    g = rng(21)
    ps, L, others = 16, 3000, (4500, 700)
    cfg = fa.Config(head_dim=D, num_heads_q=HQ, num_heads_kv=HK)
    qs = g.standard_normal((1, 1, HQ, D)).astype(np.float16)
    ks = g.standard_normal((1, L, HK, D)).astype(np.float16)
    vs = g.standard_normal((1, L, HK, D)).astype(np.float16)

    def run(batch_q, k, v, lens):
        kp, vp, table = to_pages(g, k.astype(np.float32), v.astype(np.float32), ps)
        o, lse = fa.decode(rt, cfg, batch_q, kp.astype(np.float16), vp.astype(np.float16), lens,
                           block_table=table, batch_invariant=True)
        assert np.isfinite(o).all() and np.isfinite(lse).all()
        return o[-1].view(np.uint16), lse[-1].view(np.uint32)

    alone = run(qs, ks, vs, np.array([L], np.int32))
    skmax = max(others)
    kb = g.standard_normal((3, skmax, HK, D)).astype(np.float16)
    vb = g.standard_normal((3, skmax, HK, D)).astype(np.float16)
    kb[2, :L], vb[2, :L] = ks[0], vs[0]
    qb = np.concatenate([g.standard_normal((2, 1, HQ, D)).astype(np.float16), qs])
    batched = run(qb, kb, vb, np.array(others + (L,), np.int32))
    assert splits_seen == [math.ceil(L / fa.DECODE_INVARIANT_SPLIT),
                           math.ceil(skmax / fa.DECODE_INVARIANT_SPLIT)] == [2, 3]
    assert np.array_equal(alone[0], batched[0])
    assert np.array_equal(alone[1], batched[1])


@pytest.mark.parametrize("layout", ["paged16", "paged3", "ptrs"])
def test_chunked_prefill_matches_contiguous(rt, layout):
    """forward() over a cache with seqused_k: the 5 queries of each sequence
    are its last tokens (causal, bottom-right), as contiguous k/v with the
    same seqused_k give."""
    g = rng(31)
    sq, skmax = 5, 70
    used = np.array([70, 9, 41], np.int32)
    cfg = fa.Config(head_dim=D, num_heads_q=HQ, num_heads_kv=HK, causal=True)
    q = g.standard_normal((B, sq, HQ, D)).astype(np.float16)
    k, v = _cache(g, B, skmax, used, "fp16")
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    o_ref, lse_ref = fa.forward(rt, cfg, q, k16, v16, seqused_k=used, return_lse=True)
    want, _ = ref_attention(q, k, v, cfg.softmax_scale, True, seqlens_k=used)
    assert np.abs(o_ref - want).max() < 4e-3
    if layout == "ptrs":
        kc = [k16[b, :n] for b, n in enumerate(used)]
        vc = [v16[b, :n] for b, n in enumerate(used)]
        table = None
    else:
        kp, vp, table = to_pages(g, k, v, int(layout[5:]))
        kc, vc = kp.astype(np.float16), vp.astype(np.float16)
    o = nan_out(rt, (B, sq, HQ, D), "fp16")
    _, lse = fa.forward(rt, cfg, q, kc, vc, block_table=table, seqused_k=used, out=o,
                        return_lse=True)
    _check_close(o.numpy(), o_ref, "fp16", layout)
    _check_lse(lse, lse_ref)


def test_chunked_prefill_packed_queries(rt):
    """Packed queries (cu_seqlens_q alone) over a paged cache: query counts
    3, 0 and 6, the last tokens of sequences of 30, 12 and 50 keys."""
    g = rng(41)
    lq, used = [3, 0, 6], np.array([30, 12, 50], np.int32)
    cq = np.cumsum([0] + lq).astype(np.int32)
    cfg = fa.Config(head_dim=D, num_heads_q=HQ, num_heads_kv=HK, causal=True)
    q = g.standard_normal((int(cq[-1]), HQ, D)).astype(np.float16)
    k, v = _cache(g, B, 50, used, "fp16")
    kp, vp, table = to_pages(g, k, v, 8)
    o = fa.forward(rt, cfg, q, kp.astype(np.float16), vp.astype(np.float16), cu_seqlens_q=cq,
                   block_table=table, seqused_k=used)
    assert o.shape == q.shape
    for b in range(B):
        if lq[b]:
            want, _ = ref_attention(q[None, cq[b]:cq[b + 1]], k[b:b + 1, :used[b]],
                                    v[b:b + 1, :used[b]], cfg.softmax_scale, True)
            assert np.abs(o[cq[b]:cq[b + 1]] - want[0]).max() < 4e-3


def test_kv_layout_errors(rt, monkeypatch):
    lib = _lib.lib()
    launches = []
    for name in ("fa_decode", "fa_launch"):
        real = getattr(lib, name)
        monkeypatch.setattr(lib, name, lambda *a, _r=real, _n=name: launches.append(_n) or _r(*a))
    cfg = fa.Config(head_dim=D, num_heads_q=HQ, num_heads_kv=HK)
    q = np.zeros((2, 1, HQ, D), np.float16)
    pages = np.zeros((6, 4, HK, D), np.float16)
    table = np.array([[0, 1, 2], [3, 4, -1]], np.int32)

    def rejected(text, fn, *args, **kw):
        with pytest.raises(fa.InvalidArgumentError) as e:
            fn(rt, cfg, *args, **kw)
        assert text in e.value.message, e.value.message
        return e.value.message

    # host block table: only the pages a sequence reads are checked
    fa.decode(rt, cfg, q, pages, pages, [12, 8], block_table=table)
    assert launches == ["fa_decode"]
    msg = rejected("decode: block_table[1, 2] = -1 is outside [0, num_pages=6)", fa.decode,
                   q, pages, pages, [12, 9], block_table=table)
    assert "sequence 1 has 9 keys in pages 0..2" in msg
    rejected("decode: cache_seqlens[0] = 13 is outside [0, seqlen_k_max=12]", fa.decode,
             q, pages, pages, [13, 1], block_table=table)
    rejected("decode: v_cache: shape (5, 4, 2, 64) does not match [num_pages=6", fa.decode,
             q, pages, pages[:5], [1, 1], block_table=table)
    rejected("decode: block_table: shape (1, 3) does not match [batch=2", fa.decode,
             q, pages, pages, [1, 1], block_table=table[:1])
    rejected("not lists", fa.decode, q, [pages[0]] * 2, [pages[0]] * 2, [1, 1],
             block_table=table)
    # pointer arrays
    seq = np.zeros((4, HK, D), np.float16)
    rejected("need one tensor per sequence (batch = 2), got 3 and 3", fa.decode,
             q, [seq] * 3, [seq] * 3, [1, 1])
    rejected("both as lists", fa.decode, q, [seq, seq], pages, [1, 1])
    rejected("decode: cache_seqlens[1] = 4 exceeds the 3 keys k_cache[1] holds", fa.decode,
             q, [seq, seq[:3]], [seq, seq[:3]], [4, 4])
    dseq = rt.upload(np.zeros((2, 4, HK, D), np.float16))
    odd = FakeCAI(dseq.ptr + 2, (4, HK, D), "<f2")
    rejected("decode: k_cache[1] at 0x%x is not 16-byte aligned" % (dseq.ptr + 2), fa.decode,
             q, [seq, odd], [seq, seq], [1, 1])
    # forward: cu_seqlens_k is for contiguous k/v; seqused_k within seqlen_k
    rejected("forward: cu_seqlens_k is for contiguous k/v", fa.forward, q[0], pages, pages,
             cu_seqlens_q=[0, 1], cu_seqlens_k=[0, 1], block_table=table[:1])
    rejected("forward: seqused_k[0] = 13 is outside [0, seqlen_k=12]", fa.forward, q, pages,
             pages, block_table=table, seqused_k=[13, 1])
    rejected("forward: block_table[1, 2] = -1 is outside", fa.forward, q, pages, pages,
             block_table=table)  # no seqused_k: every sequence has seqlen_k keys
    assert launches == ["fa_decode"]  # nothing else ran
    # the library's own checks come through with its message
    msg = rejected("num_splits", fa.decode, q, pages, pages, [1, 1], block_table=table,
                   batch_invariant=True, num_splits=2)
    assert msg.startswith("fa_decode")

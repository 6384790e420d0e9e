"""decode(tree_mask=) (fa_decode_args.tree_mask, since 0.4): speculative
decoding with tree attention among the new tokens, against an fp64
reference; host masks packed by the binding, device masks of packed words;
bad masks."""

import numpy as np
import pytest

from conftest import as_float, nan_out, ref_attention, rng, round_to, tol
import flashattn as fa


def random_trees(g, n_trees, n):
    """bool [n_trees, n, n]: token i sees itself and its ancestors (parents
    precede children)."""
    m = np.zeros((n_trees, n, n), bool)
    for t in range(n_trees):
        parent = [-1] + [int(g.integers(-1, i)) for i in range(1, n)]
        for i in range(n):
            j = i
            while j >= 0:
                m[t, i, j] = True
                j = parent[j]
    return m


def ref_tree(q, k, v, scale, lens, tree, causal=False):
    """fp64 decode with a tree mask: prefix keys visible, new token j seen by
    query i iff tree[b, i, j]."""
    B, Sq = q.shape[:2]
    Sk = k.shape[1]
    H, Hk = q.shape[2], k.shape[2]
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    kk, vv = np.repeat(k, H // Hk, axis=2), np.repeat(v, H // Hk, axis=2)
    o = np.zeros(q.shape[:3] + (v.shape[3],))
    lse = np.full((B, H, Sq), -np.inf)
    for b in range(B):
        L = int(lens[b])
        for i in range(Sq):
            vis = np.zeros(Sk, bool)
            vis[:L] = True
            for j in range(L):
                jn = j - (L - Sq)
                if jn >= 0 and not tree[b if tree.shape[0] > 1 else 0, i, jn]:
                    vis[j] = False
                if causal and j > i + L - Sq:
                    vis[j] = False
            if not vis.any():
                continue
            s = np.einsum("hd,khd->hk", q[b, i], kk[b, vis]) * scale
            m = s.max(axis=-1, keepdims=True)
            p = np.exp(s - m)
            l = p.sum(axis=-1, keepdims=True)
            o[b, i] = np.einsum("hk,khd->hd", p / l, vv[b, vis])
            lse[b, :, i] = (m + np.log(l))[:, 0]
    return o, lse


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("shared", [False, True])
def test_decode_tree_vs_reference(rt, layout, shared):
    B, Sq, H, Hk, D, Sk = 3, 6, 4, 2, 32, 80
    dtype = "fp16"
    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk)
    g = rng(300 + shared)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float32)
    kc = g.standard_normal((B, Sk, Hk, D)).astype(np.float32)
    vc = g.standard_normal((B, Sk, Hk, D)).astype(np.float32)
    lens = np.array([Sk, 20, 4], np.int32)  # the last holds fewer keys than new tokens
    tree = random_trees(g, 1 if shared else B, Sq)
    ref_o, ref_lse = ref_tree(round_to(q, dtype), round_to(kc, dtype), round_to(vc, dtype),
                              cfg.softmax_scale, lens, tree)
    kw = {}
    if layout == "paged":
        P = 16
        pages_per = Sk // P
        order = g.permutation(B * pages_per).astype(np.int32)
        kw["block_table"] = order.reshape(B, pages_per)
        kp = np.zeros((B * pages_per, P, Hk, D), np.float32)
        vp = np.zeros_like(kp)
        for b in range(B):
            for p in range(pages_per):
                kp[order[b * pages_per + p]] = kc[b, p * P:(p + 1) * P]
                vp[order[b * pages_per + p]] = vc[b, p * P:(p + 1) * P]
        k_in, v_in = kp.astype(np.float16), vp.astype(np.float16)
    else:
        k_in, v_in = kc.astype(np.float16), vc.astype(np.float16)
    out, lse = nan_out(rt, (B, Sq, H, D), dtype), nan_out(rt, (B, H, Sq), "fp32")
    fa.decode(rt, cfg, q.astype(np.float16), k_in, v_in, lens, num_splits=2, out=out, lse=lse,
              tree_mask=tree[0] if shared else tree, **kw)
    got = as_float(out.numpy(), dtype)
    assert np.isfinite(got).all()
    assert np.abs(got - ref_o).max() <= tol(dtype) * max(1.0, np.abs(ref_o).max())
    got_lse = lse.numpy()
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(got_lse), fin)
    assert np.abs(got_lse[fin] - ref_lse[fin]).max() < 2e-3 * max(1.0, np.abs(ref_lse[fin]).max())


def test_chain_tree_equals_causal(rt):
    B, Sq, H, D, Sk = 2, 5, 2, 32, 40
    g = rng(8)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float16)
    kc = g.standard_normal((B, Sk, H, D)).astype(np.float16)
    vc = g.standard_normal((B, Sk, H, D)).astype(np.float16)
    lens = np.array([Sk, 11], np.int32)
    o_c, l_c = fa.decode(rt, fa.Config(head_dim=D, num_heads_q=H, causal=True), q, kc, vc, lens)
    chain = np.tril(np.ones((Sq, Sq), bool))
    o_t, l_t = fa.decode(rt, fa.Config(head_dim=D, num_heads_q=H), q, kc, vc, lens,
                         tree_mask=chain)
    assert np.array_equal(o_t.view(np.uint16), o_c.view(np.uint16))
    assert np.array_equal(l_t, l_c)


def test_device_packed_words(rt):
    """A device int32 tensor of packed words, padded rows (stride 3 words)."""
    B, Sq, H, D, Sk = 2, 4, 2, 32, 30
    g = rng(9)
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    q = g.standard_normal((B, Sq, H, D)).astype(np.float16)
    kc = g.standard_normal((B, Sk, H, D)).astype(np.float16)
    vc = g.standard_normal((B, Sk, H, D)).astype(np.float16)
    lens = np.array([Sk, 7], np.int32)
    tree = random_trees(g, B, Sq)
    words = np.zeros((B, Sq, 3), np.int32)
    words[..., 0] = (tree * (1 << np.arange(Sq))).sum(-1)
    dev = rt.upload(words)
    o_d, l_d = fa.decode(rt, cfg, q, kc, vc, lens, tree_mask=dev)
    o_h, l_h = fa.decode(rt, cfg, q, kc, vc, lens, tree_mask=tree)
    assert np.array_equal(o_d.view(np.uint16), o_h.view(np.uint16))
    assert np.array_equal(l_d, l_h)
    ref_o, _ = ref_tree(q, kc, vc, cfg.softmax_scale, lens, tree)
    assert np.abs(as_float(o_d, "fp16") - ref_o).max() <= tol("fp16") * max(1.0, np.abs(ref_o).max())


def test_bad_tree_masks(rt):
    B, Sq, H, D, Sk = 2, 3, 2, 32, 16
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    q = np.zeros((B, Sq, H, D), np.float16)
    kc = np.zeros((B, Sk, H, D), np.float16)
    lens = np.array([Sk, 5], np.int32)
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode(rt, cfg, q, kc, kc, lens, tree_mask=np.ones((B, Sq, Sq + 1), bool))
    assert "expected [2 or 1, 3, 3]" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode(rt, cfg, q, kc, kc, lens, tree_mask=np.ones((B, Sq, Sq), np.float32))
    assert "bool or integer" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode(rt, cfg, q, kc, kc, lens, tree_mask=rt.upload(np.zeros((B, Sq, 0 + 1, 2),
                                                                         np.int32)))
    assert "packed words" in e.value.message

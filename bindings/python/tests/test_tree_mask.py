"""decode(tree_mask=) (fa_decode_args.tree_mask, since 0.4): speculative
decoding with tree attention among the new tokens. Here: a sequence with
fewer keys than new tokens, the chain mask bit for bit equal to causal,
device masks of packed words, the binding's checks of host masks. Trees
against the fp64 reference (batch, shared, chain, paged, with causal,
window, ALiBi and sinks) are tests/features/tree_mask.cases
(test_features.py)."""

import numpy as np
import pytest

from conftest import (as_float, check_attention, nan_out, random_trees, ref_attention, rng,
                      round_to, to_pages, tol, tree_mask_visible)
import flashattn as fa


def test_decode_tree_short_sequence(rt):
    """A shared tree over a paged cache; the last sequence holds fewer keys
    (4) than new tokens (6): its new tokens 0 and 1 are not in the cache."""
    B, Sq, H, Hk, D, Sk = 3, 6, 4, 2, 32, 80
    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk)
    g = rng(301)
    q = round_to(g.standard_normal((B, Sq, H, D)), "fp16")
    kc = round_to(g.standard_normal((B, Sk, Hk, D)), "fp16")
    vc = round_to(g.standard_normal((B, Sk, Hk, D)), "fp16")
    lens = np.array([Sk, 20, 4], np.int32)
    tree = random_trees(g, 1, Sq)
    ref_o, ref_lse = ref_attention(q, kc, vc, cfg.softmax_scale, seqlens_k=lens,
                                   mask=tree_mask_visible(tree, lens, Sq, Sk))
    kp, vp, table = to_pages(g, kc.astype(np.float16), vc.astype(np.float16), 16)
    out, lse = nan_out(rt, (B, Sq, H, D), "fp16"), nan_out(rt, (B, H, Sq), "fp32")
    fa.decode(rt, cfg, q.astype(np.float16), kp, vp, lens, num_splits=2, out=out, lse=lse,
              tree_mask=tree[0], block_table=table)
    check_attention(out, lse, ref_o, ref_lse, "fp16")


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
    ref_o, _ = ref_attention(q, kc, vc, cfg.softmax_scale, seqlens_k=lens,
                             mask=tree_mask_visible(tree, lens, Sq, Sk))
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

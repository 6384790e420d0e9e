"""Head dims past 256 (0.5: head_dim up to 576, head_dim_v up to 512) through
the binding on the emulator, against the fp64 reference, outputs poisoned
with NaN: DeepSeek MLA decode (Q/K 576 over one latent KV head, V a view of
its first 512 columns) and a Gemma-class forward (512, GQA, causal). The
limits themselves: test_config.py."""

import numpy as np

from conftest import FakeCAI, as_float, nan_out, ref_attention, rng, round_to, to_pages, tol
import flashattn as fa


def _check(o, lse, ref_o, ref_lse, dtype):
    """Poisoned device outputs: every element written, O and LSE as the reference."""
    got, got_lse = as_float(o.numpy(), dtype), lse.numpy()
    assert np.isfinite(got).all() and np.isfinite(got_lse).all()
    err = np.abs(got - ref_o).max()
    assert err <= tol(dtype) * max(1.0, np.abs(ref_o).max()), err
    assert np.abs(got_lse - ref_lse).max() < 2e-3 * max(1.0, np.abs(ref_lse).max())


def test_mla_paged_decode(rt):
    """16 query heads over one KV head of 576 (latent 512 + rotary 64) in
    shuffled 64-token pages, V the first 512 columns of the same pages (a
    strided view, as MLA reads its latent cache), 2 splits, bf16."""
    B, H, D, Dv, ps, skmax, dtype = 2, 16, 576, 512, 64, 320, "bf16"
    lens = np.array([300, 77], np.int32)  # 5 pages, the last part-full; 2 pages
    g = rng(576)
    cfg = fa.Config(dtype=dtype, head_dim=D, head_dim_v=Dv, num_heads_q=H, num_heads_kv=1)
    q = round_to(g.standard_normal((B, 1, H, D)), dtype).astype(np.float32)
    latent = round_to(g.standard_normal((B, skmax, 1, D)), dtype).astype(np.float32)
    for b, n in enumerate(lens):
        latent[b, n:] = np.nan  # past cache_seqlens: masked, never in O
    kp, _, table = to_pages(g, latent, latent, ps)
    pages = rt.upload(kp, dtype)
    v = fa.as_tensor(FakeCAI(pages.ptr, kp.shape[:3] + (Dv,), "<u2",
                             strides=[2 * s for s in pages.strides]), dtype=dtype)
    o, lse = nan_out(rt, (B, 1, H, Dv), dtype), nan_out(rt, (B, H, 1), "fp32")
    fa.decode(rt, cfg, q, pages, v, lens, block_table=table, num_splits=2, out=o, lse=lse)
    ref_o, ref_lse = ref_attention(q, latent, latent[..., :Dv], cfg.softmax_scale,
                                   seqlens_k=lens)
    _check(o, lse, ref_o, ref_lse, dtype)


def test_gemma_forward(rt):
    """head_dim 512, 4 query heads over 2 KV heads, causal with more keys
    than queries (bottom-right), fp16 device tensors."""
    B, Sq, Sk, H, Hk, D, dtype = 2, 40, 72, 4, 2, 512, "fp16"
    g = rng(512)
    cfg = fa.Config(dtype=dtype, head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=True)
    q, k, v = (rt.upload(g.standard_normal(s).astype(np.float16))
               for s in ((B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, D)))
    o, lse = nan_out(rt, (B, Sq, H, D), dtype), nan_out(rt, (B, H, Sq), "fp32")
    fa.forward(rt, cfg, q, k, v, out=o, lse=lse)
    ref_o, ref_lse = ref_attention(q.numpy(), k.numpy(), v.numpy(), cfg.softmax_scale, True)
    _check(o, lse, ref_o, ref_lse, dtype)

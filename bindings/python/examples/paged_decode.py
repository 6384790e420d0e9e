#!/usr/bin/env python3
"""Decoding over a paged KV cache (vLLM / FlashAttention style) on the
emulator: 3 sequences of 100, 37 and 64 tokens in pages of 16 tokens handed
out in a shuffled order, GQA 8:2, one new query token each. The same cache,
laid out contiguously, must give the same output.

    python3 examples/paged_decode.py

Exit status 0 on PASS."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import flashattn as fa  # noqa: E402


def main():
    batch, heads_q, heads_kv, head_dim, page_size = 3, 8, 2, 64, 16
    lens = np.array([100, 37, 64], np.int32)  # tokens in each sequence's cache
    g = np.random.default_rng(0)
    max_len = int(lens.max())
    k = g.standard_normal((batch, max_len, heads_kv, head_dim)).astype(np.float16)
    v = g.standard_normal((batch, max_len, heads_kv, head_dim)).astype(np.float16)
    q = g.standard_normal((batch, 1, heads_q, head_dim)).astype(np.float16)

    # The page pool [num_pages, page_size, heads_kv, head_dim] and the block
    # table: sequence b's token j is token j % page_size of page
    # block_table[b, j // page_size].
    pages_per_seq = -(-max_len // page_size)
    num_pages = batch * pages_per_seq
    block_table = g.permutation(num_pages).reshape(batch, pages_per_seq).astype(np.int32)
    k_pages = np.zeros((num_pages, page_size, heads_kv, head_dim), np.float16)
    v_pages = np.zeros_like(k_pages)
    for b in range(batch):
        for j in range(lens[b]):
            page, slot = block_table[b, j // page_size], j % page_size
            k_pages[page, slot], v_pages[page, slot] = k[b, j], v[b, j]

    with fa.Runtime(backend="emulator") as rt:
        cfg = fa.Config(dtype="fp16", head_dim=head_dim, num_heads_q=heads_q,
                        num_heads_kv=heads_kv)
        o, lse = fa.decode(rt, cfg, q, k_pages, v_pages, lens, block_table=block_table)
        o_ref, _ = fa.decode(rt, cfg, q, k, v, lens)  # contiguous [batch, max_len, ...]
    err = float(np.abs(o.astype(np.float64) - o_ref.astype(np.float64)).max())
    ok = np.isfinite(o).all() and err <= 2e-3
    print("paged decode (page_size %d, %d pages, GQA %d:%d) vs contiguous: max_abs_err %.3g %s"
          % (page_size, num_pages, heads_q, heads_kv, err, "PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

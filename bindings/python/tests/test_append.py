"""k_new/v_new and rotary_* of decode() (fa_decode_args since 0.5, as
flash_attn_with_kvcache): the binding's checks of the append arguments.
The append itself (contiguous, paged and pointer-array caches updated in
place, NeoX and GPT-J RoPE) against the fp64 reference, and rotary without
new keys, are tests/features/append.cases (test_features.py)."""

import numpy as np
import pytest

import flashattn as fa


def test_decode_append_bad(rt):
    cfg = fa.Config(head_dim=64, num_heads_q=2, num_heads_kv=1)
    q = np.zeros((1, 1, 2, 64), np.float16)
    kc = np.zeros((1, 8, 1, 64), np.float16)
    kn = np.zeros((1, 1, 1, 64), np.float16)
    with pytest.raises(fa.InvalidArgumentError, match="needs v_new"):
        fa.decode(rt, cfg, q, kc, kc.copy(), [3], k_new=kn)
    with pytest.raises(fa.InvalidArgumentError, match="seqlen_k_max - seqlen_new"):
        fa.decode(rt, cfg, q, kc, kc.copy(), [8], k_new=kn, v_new=kn)
    with pytest.raises(fa.InvalidArgumentError, match="updated in place"):
        fa.decode(rt, cfg, q, kc.astype(np.float32), kc.copy(), [3], k_new=kn, v_new=kn)
    # rotary_dim 24, not a multiple of 16 (append.cases' reject of rotary_dim 8
    # cannot run as written: its default cache_seqlens leave no room for k_new)
    c24 = np.ones((8, 12), np.float32)
    with pytest.raises(fa.InvalidArgumentError, match="rotary_dim"):
        fa.decode(rt, cfg, q, kc, kc.copy(), [3], k_new=kn, v_new=kn, rotary_cos=c24,
                  rotary_sin=c24)

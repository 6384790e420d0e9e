"""alibi_slopes= (fa_forward_args/fa_decode_args.alibi_slopes, since 0.5):
the binding's shape checks of the slopes. ALiBi against the fp64 reference,
misaligned slopes and overlapping rows are tests/features/alibi.cases
(test_features.py)."""

import numpy as np
import pytest

import flashattn as fa


def test_bad_alibi(rt):
    B, Sq, H, D, Sk = 1, 3, 2, 32, 16
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    q = np.zeros((B, Sq, H, D), np.float16)
    kc = np.zeros((B, Sk, H, D), np.float16)
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.forward(rt, cfg, q, kc, kc, alibi_slopes=np.zeros(H + 1, np.float32))
    assert "alibi_slopes" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode(rt, cfg, q, kc, kc, np.array([Sk], np.int32),
                  alibi_slopes=np.zeros((2, H), np.float32))
    assert "alibi_slopes" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.forward(rt, cfg, q, kc, kc, alibi_slopes=np.zeros((1, H, 1), np.float32))
    assert "alibi_slopes" in e.value.message

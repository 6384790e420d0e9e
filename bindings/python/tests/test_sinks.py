"""sinks= (fa_forward_args/fa_decode_args/fa_reduce_args.sinks, since 0.4.1):
the binding's shape checks of the sinks. Sinks in forward, decode and
decode_reduce against the fp64 reference, and misaligned sinks, are
tests/features/sinks.cases (test_features.py)."""

import numpy as np
import pytest

import flashattn as fa


def test_bad_sinks(rt):
    B, Sq, H, D, Sk = 1, 3, 2, 32, 16
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    q = np.zeros((B, Sq, H, D), np.float16)
    kc = np.zeros((B, Sk, H, D), np.float16)
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.forward(rt, cfg, q, kc, kc, sinks=np.zeros(H + 1, np.float32))
    assert "sinks" in e.value.message
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.decode(rt, cfg, q, kc, kc, np.array([Sk], np.int32), sinks=np.zeros((1, H), np.float32))
    assert "sinks" in e.value.message

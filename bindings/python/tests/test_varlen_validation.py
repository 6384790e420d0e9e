"""Varlen forward: host cu_seqlens and max_seqlen are validated before
anything is launched (issue 9, part 3); device cu_seqlens are trusted."""

import numpy as np
import pytest

from conftest import ref_attention, rng
import flashattn as fa
from flashattn import _lib

H, D = 2, 32


@pytest.fixture
def launches(monkeypatch):
    """Counts fa_launch calls (a rejected call must launch nothing)."""
    lib = _lib.lib()
    real = lib.fa_launch
    count = [0]

    def spy(*args):
        count[0] += 1
        return real(*args)

    monkeypatch.setattr(lib, "fa_launch", spy)
    return count


def _packed(total_q, total_k, seed=3):
    g = rng(seed)
    q = g.standard_normal((total_q, H, D)).astype(np.float16)
    k = g.standard_normal((total_k, H, D)).astype(np.float16)
    v = g.standard_normal((total_k, H, D)).astype(np.float16)
    return q, k, v


def _rejected(rt, launches, text, q, k, v, **kw):
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    before = set(rt._allocs)
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.forward(rt, cfg, q, k, v, **kw)
    assert text in e.value.message, e.value.message
    assert e.value.status == 1
    assert launches[0] == 0  # nothing ran
    assert set(rt._allocs) == before  # no staging buffer leaked
    return e.value.message


def test_decreasing_cu_seqlens_are_rejected(rt, launches):
    q, k, v = _packed(20, 20)
    good = np.array([0, 10, 20], np.int32)
    msg = _rejected(rt, launches, "forward: cu_seqlens_q must be non-decreasing", q, k, v,
                    cu_seqlens_q=np.array([0, 12, 8, 20], np.int32),
                    cu_seqlens_k=np.array([0, 5, 10, 20], np.int32))
    assert "cu_seqlens_q[1] = 12 > cu_seqlens_q[2] = 8" in msg
    _rejected(rt, launches, "forward: cu_seqlens_k must be non-decreasing", q, k, v,
              cu_seqlens_q=good, cu_seqlens_k=[0, 15, 3])


def test_max_seqlen_smaller_than_a_sequence_is_rejected(rt, launches):
    q, k, v = _packed(30, 40)
    cq, ck = np.array([0, 5, 30], np.int32), np.array([0, 32, 40], np.int32)
    msg = _rejected(rt, launches, "forward: max_seqlen_q = 24 is smaller than sequence 1's "
                    "length 25", q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=24)
    assert "cu_seqlens_q[2] - cu_seqlens_q[1]" in msg
    _rejected(rt, launches, "forward: max_seqlen_k = 31 is smaller than sequence 0's length 32",
              q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_k=31)
    _rejected(rt, launches, "forward: max_seqlen_q must be an int", q, k, v,
              cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=25.5)


def test_bad_first_last_and_types_are_rejected(rt, launches):
    q, k, v = _packed(20, 20)
    good = np.array([0, 10, 20], np.int32)
    _rejected(rt, launches, "forward: cu_seqlens_q[0] must be 0, got 2", q, k, v,
              cu_seqlens_q=[2, 10, 20], cu_seqlens_k=good)
    _rejected(rt, launches, "forward: cu_seqlens_k[2] = 21 exceeds total_k = 20", q, k, v,
              cu_seqlens_q=good, cu_seqlens_k=[0, 10, 21])
    _rejected(rt, launches, "forward: cu_seqlens_q: must be an integer array", q, k, v,
              cu_seqlens_q=[0.0, 10.0, 20.0], cu_seqlens_k=good)
    _rejected(rt, launches, "values do not fit int32", q, k, v,
              cu_seqlens_q=np.array([0, 10, 2**33], np.int64), cu_seqlens_k=good)
    _rejected(rt, launches, "must both be int32 [batch + 1]", q, k, v,
              cu_seqlens_q=good.reshape(1, 3), cu_seqlens_k=good.reshape(1, 3))
    _rejected(rt, launches, "forward: cu_seqlens_q: every sequence is empty", q, k, v,
              cu_seqlens_q=[0, 0, 0], cu_seqlens_k=good)


def test_lse_needs_the_whole_packed_q(rt, launches):
    """The kernel lays the varlen LSE out [num_heads_q, cu_seqlens_q[batch]]:
    with padding rows after the last sequence it cannot fill [H, total_q]."""
    q, k, v = _packed(24, 20)
    cq, ck = np.array([0, 6, 20], np.int32), np.array([0, 10, 20], np.int32)
    _rejected(rt, launches, "forward: with an LSE, cu_seqlens_q[2] (20) must equal total_q (24)",
              q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, return_lse=True)
    # Without an LSE the padded tensor is fine: the sequences' rows are right.
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    o = fa.forward(rt, cfg, q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert launches[0] == 1
    for b in range(2):
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        ro, _ = ref_attention(q[None, sq], k[None, sk], v[None, sk], D ** -0.5)
        assert np.abs(o[sq] - ro[0]).max() < 4e-3


def test_valid_host_cu_seqlens_with_larger_max_and_empty_sequence(rt, launches):
    """A max_seqlen above the longest sequence and an empty sequence are valid."""
    lq, lk = [7, 0, 12], [9, 4, 16]
    cq, ck = np.cumsum([0] + lq).astype(np.int32), np.cumsum([0] + lk).astype(np.int32)
    q, k, v = _packed(int(cq[-1]), int(ck[-1]), seed=5)
    cfg = fa.Config(head_dim=D, num_heads_q=H, causal=True)
    o, lse = fa.forward(rt, cfg, q, k, v, cu_seqlens_q=cq, cu_seqlens_k=list(ck),
                        max_seqlen_q=40, max_seqlen_k=16, return_lse=True)
    assert launches[0] == 1
    for b in range(3):
        if not lq[b]:
            continue
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        ro, rl = ref_attention(q[None, sq], k[None, sk], v[None, sk], D ** -0.5, True)
        assert np.abs(o[sq] - ro[0]).max() < 4e-3
        assert np.abs(lse[:, sq] - rl[0]).max() < 1e-3


def test_device_cu_seqlens_are_trusted(rt, launches):
    """Device cu_seqlens are not read by the binding (no synchronisation):
    they need max_seqlen_q/k, and are passed to the kernel as they are."""
    lq, lk = [5, 11], [8, 13]
    cq, ck = np.cumsum([0] + lq).astype(np.int32), np.cumsum([0] + lk).astype(np.int32)
    q, k, v = _packed(int(cq[-1]), int(ck[-1]), seed=9)
    cfg = fa.Config(head_dim=D, num_heads_q=H)
    dcq, dck = rt.upload(cq), rt.upload(ck)
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.forward(rt, cfg, q, k, v, cu_seqlens_q=dcq, cu_seqlens_k=dck, max_seqlen_k=13)
    assert "max_seqlen_q is needed with device cu_seqlens_q" in e.value.message
    o = fa.forward(rt, cfg, q, k, v, cu_seqlens_q=dcq, cu_seqlens_k=dck, max_seqlen_q=11,
                   max_seqlen_k=13)
    assert launches[0] == 1
    for b in range(2):
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        ro, _ = ref_attention(q[None, sq], k[None, sk], v[None, sk], D ** -0.5)
        assert np.abs(o[sq] - ro[0]).max() < 4e-3
    # A decreasing pair on the device is not caught by the binding: the call
    # reaches the kernel (which clamps the negative length to an empty
    # sequence) and never crashes the process.
    bad = rt.upload(np.array([0, 12, 5], np.int32))
    try:
        fa.forward(rt, cfg, q, k, v, cu_seqlens_q=bad, cu_seqlens_k=dck, max_seqlen_q=12,
                   max_seqlen_k=13)
    except fa.Error:
        pass
    assert launches[0] == 2

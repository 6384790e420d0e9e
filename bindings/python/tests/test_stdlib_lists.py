"""Plain Python lists for the integer (and fp32) arguments work without
NumPy (issue 24, 8): the stdlib-only wheel's decode(..., cache_seqlens=[5])
raised ModuleNotFoundError. A child process (stdlib_lists_child.py) with
`import numpy` blocked runs decode (contiguous, paged, pointer-array),
chunked prefill and varlen forward on list arguments; here the results are
compared, bit for bit, with the same calls on NumPy arrays, and with the
fp64 reference."""

import json
import os
import subprocess
import sys

import numpy as np

from conftest import ref_attention, rng
import flashattn as fa

HERE = os.path.dirname(os.path.abspath(__file__))


def test_lists_without_numpy(rt, tmp_path):
    g = rng(24)
    B, H, Hk, D, Smax, page = 3, 4, 2, 32, 40, 8
    lens = [int(x) for x in g.integers(1, Smax + 1, B)]
    lens[0] = 5  # the cache_seqlens=[5], here for sequence 0
    slopes = [float(x) for x in g.uniform(0.05, 0.5, H).astype(np.float32)]
    t = {n: g.standard_normal(s).astype(np.float16) for n, s in
         [("q1", (B, 1, H, D)), ("kc", (B, Smax, Hk, D)), ("vc", (B, Smax, Hk, D))]}
    pages = Smax // page
    table = g.permutation(B * pages).reshape(B, pages).astype(np.int32)
    t["kp"] = np.empty((B * pages, page, Hk, D), np.float16)
    t["vp"] = np.empty_like(t["kp"])
    for b in range(B):
        for j in range(Smax):
            t["kp"][table[b, j // page], j % page] = t["kc"][b, j]
            t["vp"][table[b, j // page], j % page] = t["vc"][b, j]
        t["kseq%d" % b] = np.ascontiguousarray(t["kc"][b, :lens[b]])
        t["vseq%d" % b] = np.ascontiguousarray(t["vc"][b, :lens[b]])
    lq, lk = [3, 0, 7], [9, 4, 7]
    cu_q, cu_k = np.cumsum([0] + lq).tolist(), np.cumsum([0] + lk).tolist()
    for n, rows, heads in (("qv", sum(lq), H), ("kv", sum(lk), Hk), ("vv", sum(lk), Hk)):
        t[n] = g.standard_normal((rows, heads, D)).astype(np.float16)
    spec = dict(H=H, Hk=Hk, D=D, cache_seqlens=lens, alibi_slopes=slopes,
                block_table=table.tolist(), cu_q=cu_q, cu_k=cu_k,
                shapes={n: list(a.shape) for n, a in t.items()})
    json.dump(spec, open(tmp_path / "spec.json", "w"))
    for n, a in t.items():
        (tmp_path / (n + ".bin")).write_bytes(a.tobytes())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, os.path.join(HERE, "stdlib_lists_child.py"),
                        str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr

    def got(name, like):
        return np.frombuffer((tmp_path / (name + ".bin")).read_bytes(),
                             np.float16).reshape(like.shape)

    cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=True)
    lens_np, table_np = np.array(lens, np.int32), table
    want = {
        "decode": fa.decode(rt, cfg, t["q1"], t["kc"], t["vc"], lens_np,
                            alibi_slopes=np.array(slopes, np.float32))[0],
        "paged": fa.decode(rt, cfg, t["q1"], t["kp"], t["vp"], lens_np,
                           block_table=table_np)[0],
        "chunked": fa.forward(rt, cfg, t["q1"], t["kp"], t["vp"], block_table=table_np,
                              seqused_k=lens_np),
        "varlen": fa.forward(rt, cfg, t["qv"], t["kv"], t["vv"],
                             cu_seqlens_q=np.array(cu_q, np.int32),
                             cu_seqlens_k=np.array(cu_k, np.int32)),
        "ptrs": fa.decode(rt, cfg, t["q1"], [t["kseq%d" % b] for b in range(B)],
                          [t["vseq%d" % b] for b in range(B)], lens_np)[0],
    }
    for name, w in want.items():
        assert np.array_equal(got(name, w)[:sum(lq)] if name == "varlen" else got(name, w),
                              w[:sum(lq)] if name == "varlen" else w), name
    # The list results against fp64, so that equal-but-wrong cannot pass.
    ref, _ = ref_attention(t["q1"], t["kc"], t["vc"], D ** -0.5, True, seqlens_k=lens)
    for name in ("paged", "chunked", "ptrs"):
        err = np.abs(got(name, want[name]).astype(np.float64) - ref).max()
        assert err < 4e-3 * max(1, np.abs(ref).max()), (name, err)
    ref_alibi, _ = ref_attention(t["q1"], t["kc"], t["vc"], D ** -0.5, True, seqlens_k=lens,
                                 alibi=np.array(slopes))
    assert np.abs(got("decode", want["decode"]).astype(np.float64) - ref_alibi).max() < 1e-2
    bad = (tmp_path / "bad.txt").read_text().split("\n")
    assert "cache_seqlens[%d] = 1000000 is outside" % (B - 1) in bad[0], bad[0]
    assert "cu_seqlens_q[0] must be 0" in bad[1], bad[1]
    assert "cache_seqlens" in bad[2] and "shape" in bad[2], bad[2]

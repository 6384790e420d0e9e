"""Child of test_stdlib_lists.py: the calls with plain Python lists for the
integer arguments (cache_seqlens, block_table, seqused_k, cu_seqlens) and an
fp32 list (alibi_slopes), with `import numpy` made to fail, as in a venv that
holds only the stdlib wheel.

    python3 stdlib_lists_child.py DIR

DIR holds spec.json (shapes and the lists) and the fp16 inputs as raw
bytes; the outputs are written there as raw bytes, and bad.txt gets the
message of a refused list."""

import json
import os
import sys


class _NoNumpy:
    """A meta path finder that makes `import numpy` fail."""

    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ImportError("numpy is blocked in this test (the stdlib-only wheel)")
        return None


sys.meta_path.insert(0, _NoNumpy())
sys.modules.pop("numpy", None)

import flashattn as fa  # noqa: E402


def main(d):
    spec = json.load(open(os.path.join(d, "spec.json")))
    H, Hk, D = spec["H"], spec["Hk"], spec["D"]
    with fa.Runtime(backend="emulator", cache="memory") as rt:
        def load(name):
            data = open(os.path.join(d, name + ".bin"), "rb").read()
            t = rt.empty(spec["shapes"][name], "fp16")
            rt.memcpy_htod(t.ptr, data)
            return t

        def save(name, t):
            rt.synchronize()
            raw = bytearray(t.nbytes)
            rt.memcpy_dtoh(raw, t.ptr)
            open(os.path.join(d, name + ".bin"), "wb").write(raw)

        cfg = fa.Config(head_dim=D, num_heads_q=H, num_heads_kv=Hk, causal=True)
        q1, kc, vc = load("q1"), load("kc"), load("vc")
        o, _ = fa.decode(rt, cfg, q1, kc, vc, spec["cache_seqlens"],
                         alibi_slopes=spec["alibi_slopes"])
        save("decode", o)
        kp, vp = load("kp"), load("vp")
        o, _ = fa.decode(rt, cfg, q1, kp, vp, spec["cache_seqlens"],
                         block_table=spec["block_table"])
        save("paged", o)
        o = fa.forward(rt, cfg, q1, kp, vp, block_table=spec["block_table"],
                       seqused_k=spec["cache_seqlens"])
        save("chunked", o)
        qv, kv, vv = load("qv"), load("kv"), load("vv")
        o = fa.forward(rt, cfg, qv, kv, vv, cu_seqlens_q=spec["cu_q"], cu_seqlens_k=spec["cu_k"])
        save("varlen", o)
        ks = [load("kseq%d" % b) for b in range(len(spec["cache_seqlens"]))]
        vs = [load("vseq%d" % b) for b in range(len(spec["cache_seqlens"]))]
        o, _ = fa.decode(rt, cfg, q1, ks, vs, spec["cache_seqlens"])
        save("ptrs", o)
        bad = []
        for call in (lambda: fa.decode(rt, cfg, q1, kc, vc, [1] * (len(ks) - 1) + [10**6]),
                     lambda: fa.forward(rt, cfg, qv, kv, vv, cu_seqlens_q=spec["cu_q"][::-1],
                                        cu_seqlens_k=spec["cu_k"]),
                     lambda: fa.decode(rt, cfg, q1, kc, vc, [[1, 2]] * len(ks))):
            try:
                call()
                bad.append("accepted")
            except fa.InvalidArgumentError as e:
                bad.append(e.message)
        open(os.path.join(d, "bad.txt"), "w").write("\n".join(bad))
    assert "numpy" not in sys.modules, "numpy was imported"
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])

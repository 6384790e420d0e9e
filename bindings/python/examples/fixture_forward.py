#!/usr/bin/env python3
"""The shared example: attention of a real model layer (all-MiniLM-L6-v2,
layer 4) on the emulator in fp16, compared with the model's own output.

    python3 examples/fixture_forward.py [FIXTURE_DIR]

FIXTURE_DIR defaults to tests/data/minilm_l6 of the repository (q/k/v/out
.npy, float32 [1, 145, 12, 32]). Exit status 0 on PASS."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import flashattn as fa  # noqa: E402


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    data = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        here, "..", "..", "..", "tests", "data", "minilm_l6")
    q, k, v, ref = (np.load(os.path.join(data, n + ".npy")) for n in ("q", "k", "v", "out"))
    batch, seqlen, heads, head_dim = q.shape
    with fa.Runtime(backend="emulator") as rt:
        cfg = fa.Config(dtype="fp16", head_dim=head_dim, num_heads_q=heads,
                        num_heads_kv=k.shape[2], causal=False)
        o = fa.forward(rt, cfg, q, k, v)  # float32 inputs are rounded to fp16
    max_abs = float(np.abs(o.astype(np.float64) - ref).max())
    limit = 1e-2 * max(1.0, float(np.abs(ref).max()))
    ok = max_abs <= limit
    print("minilm_l6 forward [%d,%d,%d,%d] fp16 on the emulator: max_abs_err %.3g (limit %.3g) %s"
          % (batch, seqlen, heads, head_dim, max_abs, limit, "PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The MiniLM fixture example (see fixture_forward.py) with the standard
library alone: no NumPy. The .npy files are read with struct, rounded to fp16
with struct's 'e' format, copied into device memory (fa_malloc) and the
forward pass runs on DeviceArrays on the emulator; the output is compared
with the model's own attention output.

    python3 examples/fixture_forward_stdlib.py [FIXTURE_DIR]

FIXTURE_DIR defaults to tests/data/minilm_l6 of the repository. Exit status
0 on PASS. This is what the wheel's test runs in a virtual environment that
holds nothing but the wheel."""

import ast
import os
import struct
import sys

import flashattn as fa


def load_npy_f32(path):
    """(shape, list of floats) of a little-endian float32 C-order .npy file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        raise ValueError("%s: not a .npy file" % path)
    major = data[6]
    if major == 1:
        (hlen,), start = struct.unpack_from("<H", data, 8), 10
    else:
        (hlen,), start = struct.unpack_from("<I", data, 8), 12
    header = ast.literal_eval(data[start:start + hlen].decode("latin1"))
    if header["descr"] != "<f4" or header["fortran_order"]:
        raise ValueError("%s: expected little-endian float32 in C order, got %r" % (path, header))
    shape = tuple(header["shape"])
    count = 1
    for n in shape:
        count *= n
    values = struct.unpack_from("<%df" % count, data, start + hlen)
    return shape, values


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    data = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        here, "..", "..", "..", "tests", "data", "minilm_l6")
    (shape, q), (kshape, k), (_, v), (_, ref) = (
        load_npy_f32(os.path.join(data, n + ".npy")) for n in ("q", "k", "v", "out"))
    batch, seqlen, heads, head_dim = shape
    with fa.Runtime(backend="emulator") as rt:
        cfg = fa.Config(dtype="fp16", head_dim=head_dim, num_heads_q=heads,
                        num_heads_kv=kshape[2], causal=False)

        def upload(values, dims):
            d = rt.empty(dims, "fp16")
            rt.memcpy_htod(d.ptr, struct.pack("<%de" % len(values), *values))
            return d

        dq, dk, dv = upload(q, shape), upload(k, kshape), upload(v, kshape)
        do = rt.empty(shape, "fp16")
        fa.forward(rt, cfg, dq, dk, dv, out=do)
        rt.synchronize()
        raw = bytearray(do.nbytes)
        rt.memcpy_dtoh(raw, do.ptr)
        backend = rt.info.backend
    o = struct.unpack("<%de" % (len(raw) // 2), bytes(raw))
    max_abs = max(abs(a - b) for a, b in zip(o, ref))
    limit = 1e-2 * max(1.0, max(abs(x) for x in ref))
    ok = max_abs <= limit
    print("minilm_l6 forward [%d,%d,%d,%d] fp16 on the %s (standard library only): "
          "max_abs_err %.3g (limit %.3g) %s"
          % (batch, seqlen, heads, head_dim, backend, max_abs, limit, "PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

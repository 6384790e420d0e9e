#!/usr/bin/env python3
"""Compiles PTX files through the driver's JIT (cuLinkCreate/AddData/Complete,
as src/backend/cuda_backend.cc does) under several option sets, and through
the toolkit's ptxas when one is on the machine, printing each register /
spill summary and the driver's whole info log: to see why the driver JIT
spills where an offline ptxas of the same version does not.

    python3 bench/jit_probe.py FILE.ptx [FILE.ptx ...]

Needs libcuda and a GPU of the PTX's target (sm_90a for the wgmma forward).
"""

import ctypes
import os
import re
import shutil
import subprocess
import sys

CU_JIT_MAX_REGISTERS = 0
CU_JIT_THREADS_PER_BLOCK = 1
CU_JIT_INFO_LOG_BUFFER = 3
CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
CU_JIT_OPTIMIZATION_LEVEL = 7
CU_JIT_TARGET = 9
CU_JIT_LOG_VERBOSE = 12
CU_JIT_MIN_CTA_PER_SM = 31
CU_JIT_MAX_THREADS_PER_BLOCK = 32
CU_JIT_OVERRIDE_DIRECTIVE_VALUES = 33
CU_JIT_INPUT_PTX = 1
COMPUTE_90A = 0x10000 + 90

cu = ctypes.CDLL("libcuda.so.1")


def ck(r, what):
    if r != 0:
        s = ctypes.c_char_p()
        cu.cuGetErrorString(r, ctypes.byref(s))
        raise RuntimeError("%s: %d %s" % (what, r, s.value))


def jit(ptx, extra):
    info = ctypes.create_string_buffer(1 << 16)
    err = ctypes.create_string_buffer(1 << 16)
    opts = [CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_LOG_VERBOSE, CU_JIT_TARGET]
    vals = [ctypes.cast(info, ctypes.c_void_p).value, len(info),
            ctypes.cast(err, ctypes.c_void_p).value, len(err), 1, COMPUTE_90A]
    for k, v in extra:
        opts.append(k)
        vals.append(v)
    n = len(opts)
    o = (ctypes.c_int * n)(*opts)
    v = (ctypes.c_void_p * n)(*vals)
    link = ctypes.c_void_p()
    ck(cu.cuLinkCreate_v2(n, o, v, ctypes.byref(link)), "cuLinkCreate")
    data = ptx + b"\0"
    r = cu.cuLinkAddData_v2(link, CU_JIT_INPUT_PTX, data, len(data), b"p.ptx", 0, None, None)
    cubin, size = ctypes.c_void_p(), ctypes.c_size_t()
    if r == 0:
        r = cu.cuLinkComplete(link, ctypes.byref(cubin), ctypes.byref(size))
    log = info.value.decode(errors="replace") + err.value.decode(errors="replace")
    cu.cuLinkDestroy(link)
    return r, log


def summary(log):
    out = []
    for pat in (r"Used \d+ registers[^\n]*", r"\d+ bytes stack frame, \d+ bytes spill stores, "
                r"\d+ bytes spill loads"):
        m = re.findall(pat, log)
        out += m[:1]
    return "; ".join(out) or log.strip()[:200]


def main(paths):
    ck(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ver = ctypes.c_int()
    cu.cuDriverGetVersion(ctypes.byref(ver))
    print("driver API version", ver.value)
    ptxas = shutil.which("ptxas") or ("/usr/local/cuda/bin/ptxas"
                                      if os.path.exists("/usr/local/cuda/bin/ptxas") else None)
    sets = [("as flashattn", []),
            ("-O4 explicit", [(CU_JIT_OPTIMIZATION_LEVEL, 4)]),
            ("O3", [(CU_JIT_OPTIMIZATION_LEVEL, 3)]),
            ("max regs 168", [(CU_JIT_MAX_REGISTERS, 168)]),
            ("threads 384", [(CU_JIT_THREADS_PER_BLOCK, 384)]),
            ("override 384/1", [(CU_JIT_MAX_THREADS_PER_BLOCK, 384), (CU_JIT_MIN_CTA_PER_SM, 1),
                                (CU_JIT_OVERRIDE_DIRECTIVE_VALUES, 1)])]
    for p in paths:
        ptx = open(p, "rb").read()
        print("==", os.path.basename(p))
        if ptxas:
            r = subprocess.run([ptxas, "-arch=sm_90a", "-v", p, "-o", "/tmp/probe.cubin"],
                               capture_output=True, text=True)
            print("  offline ptxas (%s): %s" % (
                subprocess.run([ptxas, "--version"], capture_output=True,
                               text=True).stdout.strip().splitlines()[-1], summary(r.stderr)))
        for name, extra in sets:
            r, log = jit(ptx, extra)
            print("  jit %-16s rc %d: %s" % (name, r, summary(log)))
            if name == "as flashattn":
                print("    | " + log.strip().replace("\n", "\n    | "))


if __name__ == "__main__":
    main(sys.argv[1:])

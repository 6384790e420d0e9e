"""The ctypes mirrors of the C structs have the C compiler's sizes and offsets."""

import os
import shutil
import subprocess

import pytest

from conftest import REPO
import flashattn as fa
from flashattn import _lib


def _include_dir():
    env = os.environ.get("FLASHATTN_INCLUDE_DIR")
    if env:
        return env
    lib = os.path.realpath(fa.library_path()) if os.sep in fa.library_path() else ""
    if lib:
        cand = os.path.join(os.path.dirname(os.path.dirname(lib)), "include")
        if os.path.exists(os.path.join(cand, "flashattn.h")):
            return cand
    return os.path.join(REPO, "include")


def test_struct_layout_matches_c(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to compare struct layouts with")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "flashattn.h"',
             "int main(void) {"]
    expect = []
    for s in _lib.STRUCTS:
        name = s.__name__
        lines.append('  printf("%s %%zu\\n", sizeof(%s));' % (name, name))
        expect.append("%s %d" % (name, __import__("ctypes").sizeof(s)))
        for field, _ in s._fields_:
            lines.append('  printf("%s.%s %%zu\\n", offsetof(%s, %s));'
                         % (name, field, name, field))
            expect.append("%s.%s %d" % (name, field, getattr(s, field).offset))
    consts = {"FA_FORWARD_ARGS_SIZE_0_2": _lib.fa_forward_args.kv.offset,
              "FA_FORWARD_ARGS_SIZE_0_5": _lib.fa_forward_args.q_descale.offset,
              "FA_FORWARD_ARGS_SIZE_0_7": _lib.fa_forward_args.workspace.offset,
              "FA_CONFIG_DESC_SIZE_0_4": _lib.fa_config_desc.kv_dtype.offset,
              "FA_CONFIG_DESC_SIZE_0_5": _lib.fa_config_desc.q_dtype.offset,
              "FA_DECODE_ARGS_SIZE_0_2": _lib.fa_decode_args.kv.offset,
              "FA_DECODE_ARGS_SIZE_0_5": _lib.fa_decode_args.split_counters.offset,
              "FA_RUNTIME_OPTIONS_SIZE_0_5": _lib.fa_runtime_options.ptx_compiler.offset,
              "FA_RUNTIME_OPTIONS_SIZE_0_6": _lib.fa_runtime_options.kernel_store.offset,
              "FA_CACHE_STATS_SIZE_0_5": _lib.fa_cache_stats.compiler_mode.offset,
              "FA_CACHE_STATS_SIZE_0_6": _lib.fa_cache_stats.remote_hits.offset,
              "FA_CACHE_STATS_SIZE_0_1": _lib.fa_cache_stats.collisions.offset,
              "FA_PTX_COMPILER_OFF": _lib.PTX_COMPILER_OFF,
              "FA_COMPILER_DRIVER_JIT": _lib.COMPILER_DRIVER_JIT,
              "FA_COMPILER_PLUGIN": _lib.COMPILER_PLUGIN,
              "FA_DECODE_INVARIANT_SPLIT": _lib.DECODE_INVARIANT_SPLIT,
              "FA_KV_CONTIGUOUS": _lib.KV_CONTIGUOUS, "FA_KV_PAGED": _lib.KV_PAGED,
              "FA_KV_PTR_ARRAY": _lib.KV_PTR_ARRAY,
              "sizeof(fa_kv_layout)": __import__("ctypes").sizeof(_lib.c_int)}
    for name, value in consts.items():
        lines.append('  printf("%s %%lld\\n", (long long)(%s));' % (name, name))
        expect.append("%s %d" % (name, value))
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", _include_dir(), str(src), "-o",
                    str(exe)], check=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    got = [g for g in got if g]
    assert len(got) == len(expect) > 9
    mismatches = [(e, g) for e, g in zip(expect, got) if e != g]
    assert not mismatches, mismatches


def test_struct_size_fields_are_filled():
    for s in _lib.STRUCTS:
        if s in (_lib.fa_tensor, _lib.fa_kv_cache_layout):
            continue
        assert _lib.new(s).struct_size == __import__("ctypes").sizeof(s)


def test_version_and_library():
    assert fa.version().split(".")[0] == str(_lib.ABI_MAJOR)
    assert _lib.lib().fa_version_number() // 10000 == _lib.ABI_MAJOR
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        assert fa.library_path() == env


def test_0_5_sized_config_desc_is_accepted():
    """A caller built against 0.5 passes FA_CONFIG_DESC_SIZE_0_5: q_dtype, past
    its struct_size, is not read (0.5 has no fp8 Q)."""
    import ctypes
    lib = _lib.lib()
    d = _lib.new(_lib.fa_config_desc)
    d.dtype, d.head_dim, d.num_heads_q, d.num_heads_kv = _lib.DTYPE_FP16, 64, 2, 2
    d.window_left = d.window_right = -1
    d.q_dtype = 99  # garbage past a 0.5 struct
    d.struct_size = _lib.fa_config_desc.q_dtype.offset
    h = ctypes.c_void_p()
    assert lib.fa_config_create(ctypes.byref(d), ctypes.byref(h)) == _lib.SUCCESS
    lib.fa_config_destroy(h)
    d.struct_size = ctypes.sizeof(d)  # the whole 0.6 struct: q_dtype 99 is read and refused
    assert lib.fa_config_create(ctypes.byref(d), ctypes.byref(h)) != _lib.SUCCESS

"""cache_warm (fa_cache_warm, library 0.7): a cache warmed with no GPU for
sm_80 and sm_90 serves an emulator Runtime at that SM with no kernel built;
bad input raises the library's errors naming the line and key; progress is
called once per kernel and its exceptions come back after the call."""

import os

import numpy as np
import pytest

from conftest import ref_attention, rng
import flashattn as fa
from flashattn import _warm

H, D = 2, 64
# The kernels _run below launches: the forward, the decode and its combine.
SPECS = [
    "# fp16, head_dim 64, 2 heads",
    "forward dtype=fp16 head_dim=64 num_heads_q=2 num_heads_kv=2",
    "decode  dtype=fp16 head_dim=64 num_heads_q=2 num_heads_kv=2",
    "reduce  dtype=fp16 head_dim=64",
]


def _scratch(tmp_path, name):
    d = tmp_path / name
    os.mkdir(d, 0o700)
    return str(d)


def _run(sm, cache_dir, seed):
    """A forward and a 2-split decode (fresh inputs, checked against fp64) on
    an emulator Runtime at `sm` over cache_dir (None: memory only); returns
    its cache_stats()."""
    mode = "memory" if cache_dir is None else "disk"
    with fa.Runtime(backend="emulator", emulator_sm=sm, cache=mode, cache_dir=cache_dir) as r:
        g = rng(seed)
        cfg = fa.Config(dtype="fp16", head_dim=D, num_heads_q=H, causal=True)
        q, k, v = (g.standard_normal((2, 24, H, D)).astype(np.float16) for _ in range(3))
        o = np.full(q.shape, np.nan, np.float16)
        r.forward(cfg, q, k, v, out=o)
        ref, _ = ref_attention(q, k, v, D ** -0.5, causal=True)
        assert np.abs(o.astype(np.float64) - ref).max() < 4e-3
        lens = np.array([130, 77], np.int32)
        q1 = g.standard_normal((2, 1, H, D)).astype(np.float16)
        kc, vc = (g.standard_normal((2, 160, H, D)).astype(np.float16) for _ in range(2))
        o1, _ = r.decode(cfg, q1, kc, vc, lens, num_splits=2)
        ref1, _ = ref_attention(q1, kc, vc, D ** -0.5, causal=True, seqlens_k=lens)
        assert np.abs(o1.astype(np.float64) - ref1).max() < 4e-3
        return r.cache_stats()


def test_warm_then_run_builds_nothing(tmp_path):
    cache = _scratch(tmp_path, "cache")
    calls = []
    c = fa.cache_warm([80, "sm_90a"], specs=SPECS, cache_dir=cache, jobs=2, ptx_only=True,
                      progress=calls.append)
    assert isinstance(c, fa.WarmCounts)
    assert (c.total, c.done, c.built, c.present, c.failed, c.skipped) == (6, 6, 6, 0, 0, 0)
    assert c.bytes > 0 and c.seconds >= 0 and c.spec == "" and c.sm == 0 and c.compiler == ""
    # progress: once per kernel, in order, consistent counts
    assert len(calls) == c.total
    for i, p in enumerate(calls):
        assert p.done == i + 1 and p.total == 6
        assert p.built + p.present + p.failed == p.done
        assert p.sm in (80, 90) and p.spec
    assert sorted(p.sm for p in calls) == [80, 80, 80, 90, 90, 90]
    assert calls[-1].built == c.built and calls[-1].bytes == c.bytes
    for sm in (80, 90):
        s = _run(sm, cache, seed=sm)
        assert s.persistent and s.path.startswith(cache)
        assert (s.misses, s.compiles, s.disk_hits) == (0, 0, 3), s
        control = _run(sm, None, seed=sm + 1)  # the same calls build their kernels
        assert control.misses == 3
    # Again: every row present; sm_120's rows are added beside.
    again = fa.cache_warm("80,90a,120f", specs="\n".join(SPECS), cache_dir=cache, ptx_only=True)
    assert (again.total, again.present, again.built) == (9, 6, 3)


def test_presets():
    presets = fa.cache_warm_presets()
    assert len(presets) >= 9
    assert {"llama-3-8b", "gpt-oss", "deepseek-v3"} <= set(presets)
    assert "sinks" in presets["gpt-oss"]
    for name in presets:
        text = fa.cache_warm_preset(name)
        assert text.startswith("# " + name + ":")
        kinds = {line.split()[0] for line in text.splitlines() if line and line[0] != "#"}
        assert kinds == {"forward", "decode", "reduce"}
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.cache_warm_preset("llama-9")
    assert "unknown preset 'llama-9'" in e.value.message and "gpt-oss:" in e.value.message


def test_preset_skips_what_an_sm_cannot_run(tmp_path):
    """gpt-oss on sm_80 and sm_86: its e4m3 KV decodes (2 lines) need sm_89."""
    e4m3_lines = sum("kv_dtype=0,e4m3" in line
                     for line in fa.cache_warm_preset("gpt-oss").splitlines())
    c = fa.cache_warm(["80", 86], presets=["gpt-oss"], cache_dir=_scratch(tmp_path, "c"),
                      ptx_only=True)
    assert e4m3_lines == 2
    assert c.skipped == 2 * e4m3_lines
    assert c.total > 0 and c.built == c.total and c.failed == 0


def test_sm_forms():
    assert _warm._sms(["sm_100a", "90a", "120f", 89, "86"]) == [100, 90, 120, 89, 86]
    assert _warm._sms("80,sm_90a") == [80, 90]
    assert _warm._sms(103) == [103]


@pytest.mark.parametrize("kwargs,error,words", [
    (dict(sms=[], specs=SPECS), fa.InvalidArgumentError, ["sms names no SM"]),
    (dict(sms=["80", "9x"], specs=SPECS), fa.InvalidArgumentError, ["sms[1]", "'9x' is not an SM"]),
    (dict(sms=[80, True], specs=SPECS), fa.InvalidArgumentError, ["sms[1]"]),
    (dict(sms=[80, 75], specs=SPECS), fa.UnsupportedError, ["sms[1]", "got 75"]),
    (dict(sms=[80]), fa.InvalidArgumentError, ["neither presets nor specs"]),
    (dict(sms=[80], presets="llama-3-8b,llama-9"), fa.InvalidArgumentError,
     ["unknown preset 'llama-9'", "gpt-oss:"]),
    (dict(sms=[80], presets=["gpt-oss", 3]), fa.InvalidArgumentError, ["presets[1]"]),
    (dict(sms=[80], specs=["forward dtype=fp16 head_dim=64", "decode dtype=fp16 heads=2"]),
     fa.InvalidArgumentError, ["specs line 2", "unknown key 'heads'"]),
    (dict(sms=[80], specs="forward dtype=fp15 head_dim=64"), fa.InvalidArgumentError,
     ["specs line 1", "'fp15' is not a value of dtype"]),
    (dict(sms=[80], specs="\nreduce dtype=fp16 head_dim=64 varlen=1"), fa.InvalidArgumentError,
     ["specs line 2", "varlen"]),
    (dict(sms=[80], specs=SPECS, jobs=-1), fa.InvalidArgumentError, ["jobs"]),
    (dict(sms=[80], specs=SPECS, progress=3), fa.InvalidArgumentError, ["progress"]),
])
def test_bad_input(tmp_path, kwargs, error, words):
    cache = _scratch(tmp_path, "bad")
    with pytest.raises(error) as e:
        fa.cache_warm(cache_dir=cache, ptx_only=True, **kwargs)
    for w in words:
        assert w in e.value.message, e.value.message
    assert os.listdir(cache) == []  # nothing written


def test_untrusted_dir_is_a_cache_error(tmp_path):
    cache = _scratch(tmp_path, "open")
    os.chmod(cache, 0o777)  # others may write: not a cache to run code from
    with pytest.raises(fa.CacheError) as e:
        fa.cache_warm([80], specs=SPECS, cache_dir=cache, ptx_only=True)
    assert "cannot be written" in e.value.message
    assert os.listdir(cache) == []


def test_progress_exception_is_raised_after_the_call(tmp_path):
    cache = _scratch(tmp_path, "cache")
    calls = []

    class Boom(Exception):
        pass

    def progress(p):
        calls.append(p)
        if len(calls) == 2:
            raise Boom("from progress")

    with pytest.raises(Boom):
        fa.cache_warm([80, 89], specs=SPECS, cache_dir=cache, ptx_only=True, progress=progress)
    assert len(calls) == 2  # not called again once it raised
    # the call itself ran to the end: every kernel was written
    c = fa.cache_warm([80, 89], specs=SPECS, cache_dir=cache, ptx_only=True)
    assert c.total == 6 and c.present == 6 and c.built == 0

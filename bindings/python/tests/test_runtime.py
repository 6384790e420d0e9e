"""Runtime lifetime, info, memory helpers and the kernel cache."""

import gc

import numpy as np
import pytest

from conftest import FakeCAI, ref_attention, rng
import flashattn as fa


def test_info(rt):
    info = rt.info
    assert info.backend == "emulator"
    assert info.sm == 80
    assert info.num_sms > 0
    assert info.driver_version == 0
    assert info.device_name
    assert "emulator" in repr(rt)


def test_emulator_sm_option(tmp_path):
    with fa.Runtime(backend="emulator", cache="memory", emulator_sm=89) as r:
        assert r.info.sm == 89


def test_ptx_compiler_option():
    # "off" reaches the C struct (an emulator runtime accepts it and compiles nothing)
    for mode in ("auto", "off"):
        with fa.Runtime(backend="emulator", cache="memory", ptx_compiler=mode) as r:
            assert r.cache_stats().compiler_mode == "none"


def test_bad_options_raise():
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.Runtime(backend="tpu")
    assert e.value.status == 1 and "backend" in e.value.message
    with pytest.raises(fa.InvalidArgumentError):
        fa.Runtime(cache="cloud")
    with pytest.raises(fa.InvalidArgumentError) as e:
        fa.Runtime(backend="emulator", ptx_compiler="nvcc")
    assert "ptx_compiler" in e.value.message
    with pytest.raises(fa.Error) as e:
        fa.Runtime(backend="emulator", emulator_sm=75)
    assert e.value.status in (1, 2) and "75" in e.value.message


def test_context_manager_closes():
    with fa.Runtime(backend="emulator", cache="memory") as r:
        d = r.empty((4, 8), "fp16")
        assert not r.closed
    assert r.closed
    r.close()  # idempotent
    with pytest.raises(fa.InvalidArgumentError) as e:
        r.info
    assert "closed" in e.value.message
    with pytest.raises(fa.InvalidArgumentError):
        r.malloc(16)
    with pytest.raises(fa.InvalidArgumentError):
        d.__cuda_array_interface__
    d.free()  # no-op after close
    assert repr(r) == "<flashattn.Runtime closed>"


def test_del_backstop_frees():
    r = fa.Runtime(backend="emulator", cache="memory")
    d = r.empty((128,), "fp32")
    assert d.ptr in r._allocs
    del d
    gc.collect()
    assert not r._allocs  # DeviceArray.__del__ freed it
    r.empty((16,), "fp32")  # left for close() to free
    del r
    gc.collect()  # Runtime.__del__ closes without error


def test_memory_helpers(rt):
    data = bytes(range(256)) * 4
    p = rt.malloc(len(data))
    assert p % 256 == 0
    rt.memcpy_htod(p, data)
    back = bytearray(len(data))
    rt.memcpy_dtoh(back, p)
    assert bytes(back) == data
    rt.memset(p, 0xAB, 100)
    rt.memcpy_dtoh(back, p)
    assert back[:100] == b"\xab" * 100 and back[100:] == data[100:]
    arr = np.arange(64, dtype=np.float32)
    rt.memcpy_htod(p, arr)
    out = np.zeros(64, dtype=np.float32)
    rt.memcpy_dtoh(out, p, out.nbytes)
    assert np.array_equal(out, arr)
    rt.synchronize()
    rt.free(p)
    with pytest.raises(fa.InvalidArgumentError):
        rt.free(p)  # no longer an allocation of rt
    with pytest.raises(fa.InvalidArgumentError):
        rt.memcpy_dtoh(b"readonly", p)
    with pytest.raises(fa.Error) as e:
        rt.malloc(0)
    assert e.value.status == 1


@pytest.mark.parametrize("shape,dtype,name", [
    ((2**63 + 8,), "fp16", r"shape\[0\]"),              # the issue's: bytes wrap past 2^64
    ((2**62 + 4,), "fp16", "more than one buffer"),      # 2^63 + 8 bytes
    ((2**62, 2), "fp32", "more than one buffer"),        # the byte count, not the count
    ((2**32, 2**32), "fp8", "more than one buffer"),     # elements alone: 2^64
    ((2**64 + 1,), "fp8", r"shape\[0\]"),              # one dimension past size_t
    ((4, -1), "fp16", r"shape\[1\]"),
    ((4, 2.5), "fp16", r"shape\[1\]"),
    (16, "fp16", "shape must be a sequence"),
])
def test_empty_refuses_sizes_that_overflow(rt, shape, dtype, name):
    """No wrapped byte count reaches fa_malloc: a shape whose elements or
    bytes do not fit is refused, naming the shape, and nothing is allocated."""
    before = dict(rt._allocs)
    with pytest.raises(fa.InvalidArgumentError, match=name) as e:
        rt.empty(shape, dtype)
    assert "DeviceArray" in e.value.message
    assert rt._allocs == before


def test_empty_largest_lazy_buffer_is_exact(rt):
    """A big (lazily committed) buffer keeps its exact byte count."""
    d = rt.empty((2**30 + 8,), "fp16")
    assert d.nbytes == 2 * (2**30 + 8) and rt._allocs[d.ptr] == d.nbytes
    d.free()


@pytest.mark.parametrize("call", [
    lambda rt: rt.malloc(2**64 + 16),
    lambda rt: rt.malloc(-16),
    lambda rt: rt.memset(0, 0, 2**64 + 1),
    lambda rt: rt.memcpy_dtoh(bytearray(8), 0, -1),
    lambda rt: rt.memcpy_htod(0, b"12345678", 2**64),
])
def test_memory_helpers_refuse_sizes_ctypes_would_wrap(rt, call):
    with pytest.raises(fa.InvalidArgumentError, match="nbytes"):
        call(rt)


def test_device_array_roundtrip(rt):
    x = rng(1).standard_normal((3, 5)).astype(np.float32)
    d = rt.upload(x)
    assert d.dtype == "fp32" and d.shape == (3, 5) and d.strides == (5, 1)
    cai = d.__cuda_array_interface__
    assert cai["data"][0] == d.ptr and cai["typestr"] == "<f4" and cai["version"] == 3
    assert np.array_equal(d.numpy(), x)
    b = rt.upload(x, dtype="bf16")
    assert b.numpy().dtype == np.uint16
    assert np.array_equal(b.numpy(), fa.float32_to_bf16_bits(x))
    d.free()
    d.free()
    with pytest.raises(fa.InvalidArgumentError):
        d.numpy()
    with pytest.raises(fa.InvalidArgumentError):
        rt.upload(np.zeros(3, np.int64))


def test_bf16_rounding_helpers():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf, np.nan, 3.0e38], np.float32)
    bits = fa.float32_to_bf16_bits(x)
    back = fa.bf16_bits_to_float32(bits)
    assert back[0] == 1.0
    assert back[1] == 1.0  # tie rounds to even
    assert back[2] == 1.015625  # tie rounds to even (up)
    assert back[3] == -2.5 and back[4] == np.inf and np.isnan(back[5])
    assert np.isfinite(back[6]) or back[6] == np.inf


def _run_small_forward(r, seed=0):
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    g = rng(seed)
    q, k, v = (g.standard_normal((1, 8, 2, 32)).astype(np.float16) for _ in range(3))
    o = r.forward(cfg, q, k, v)
    ref, _ = ref_attention(q, k, v, 32 ** -0.5)
    assert np.abs(o - ref).max() < 4e-3


def test_cache_disk_stats_list_clear(tmp_path):
    cache_dir = tmp_path / "kcache"
    with fa.Runtime(backend="emulator", cache="disk", cache_dir=str(cache_dir)) as r:
        s0 = r.cache_stats()
        assert s0.persistent and s0.path.startswith(str(cache_dir)) and s0.entries == 0
        _run_small_forward(r)
        s1 = r.cache_stats()
        assert s1.misses == 1 and s1.entries == 1 and s1.bytes > 0
        # the cold kernel was built under a compile lease; the default cap is on
        assert s1.leases == 1 and s1.lease_waits == 0 and s1.max_bytes > 0
        assert s1.collisions == 0 and s1.resets == 0 and s1.evicted == 0
        # 0.6: the emulator compiles nothing; its note names what cuda would use
        assert s1.compiler_mode == "none" and s1.compiler == "" and s1.cubin_refusals == 0
        assert s1.compiler_note.startswith("the emulator runs the PTX")
        _run_small_forward(r, seed=1)
        assert r.cache_stats().memory_hits >= 1
        entries = r.cache_list()
        assert len(entries) == 1
        e = entries[0]
        assert len(e.key) == 32 and int(e.key, 16) >= 0
        assert "forward" in e.spec and e.sm == 80 and e.ptx_bytes > 0 and e.cubin_bytes == 0
        assert e.created > 0 and e.last_used >= e.created and e.compiler == ""
    with fa.Runtime(backend="emulator", cache="disk", cache_dir=str(cache_dir)) as r:
        _run_small_forward(r)
        s = r.cache_stats()
        assert s.disk_hits == 1 and s.misses == 0
        r.cache_clear()
        assert r.cache_stats().entries == 0
        assert r.cache_list() == []
        _run_small_forward(r)  # loaded kernels stay usable


def test_cache_memory_mode():
    with fa.Runtime(backend="emulator", cache="memory") as r:
        s = r.cache_stats()
        assert not s.persistent and s.path == ""
        assert s.max_bytes == 0 and s.leases == 0
        _run_small_forward(r)
        assert r.cache_stats().misses == 1


def test_cache_list_callback_error_propagates(rt, monkeypatch):
    _run_small_forward(rt)
    import flashattn._api as api

    class Boom(Exception):
        pass

    def bad_entry(*a):
        raise Boom()

    monkeypatch.setattr(api, "CacheEntry", bad_entry)
    with pytest.raises(Boom):
        rt.cache_list()


def test_fake_cai_on_fa_malloc_memory(rt):
    """A foreign __cuda_array_interface__ object over fa_malloc'd memory."""
    g = rng(2)
    x = g.standard_normal((1, 16, 2, 32)).astype(np.float16)
    p = rt.malloc(x.nbytes)
    rt.memcpy_htod(p, x)
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    qv = FakeCAI(p, x.shape, "<f2")
    o = rt.forward(cfg, qv, qv, qv)
    assert isinstance(o, fa.DeviceArray)
    ref, _ = ref_attention(x, x, x, 32 ** -0.5)
    assert np.abs(o.numpy() - ref).max() < 4e-3
    rt.free(p)

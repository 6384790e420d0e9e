"""Runtime, Config, DeviceArray and the attention calls."""

import array
import ctypes
import math
import numbers
import sys
import threading
from dataclasses import dataclass

from . import _lib
from ._errors import Error, check, invalid, make_error
from ._tensors import (ITEMSIZE, HostList, contiguous_strides, host_dtype, host_storage,
                       is_ndarray, resolve)

_BACKENDS = {"auto": _lib.BACKEND_AUTO, "cuda": _lib.BACKEND_CUDA,
             "emulator": _lib.BACKEND_EMULATOR}
_BACKEND_NAMES = {v: k for k, v in _BACKENDS.items()}
_CACHE_MODES = {"default": _lib.CACHE_DEFAULT, "disk": _lib.CACHE_DISK,
                "memory": _lib.CACHE_MEMORY}
_PTX_COMPILERS = {"auto": _lib.PTX_COMPILER_AUTO, "off": _lib.PTX_COMPILER_OFF}
_COMPILER_MODE_NAMES = {_lib.COMPILER_NONE: "none", _lib.COMPILER_DRIVER_JIT: "driver-jit",
                        _lib.COMPILER_PLUGIN: "plugin"}
_DTYPES = {"fp16": _lib.DTYPE_FP16, "bf16": _lib.DTYPE_BF16, "fp32": _lib.DTYPE_FP32}
_KV_DTYPES = {None: 0, "e4m3": _lib.DTYPE_FP8_E4M3, "e5m2": _lib.DTYPE_FP8_E5M2}
_KINDS = {"forward": _lib.KERNEL_FORWARD, "decode": _lib.KERNEL_DECODE,
          "reduce": _lib.KERNEL_REDUCE, "backward-pre": _lib.KERNEL_BACKWARD_PRE,
          "backward": _lib.KERNEL_BACKWARD, "backward-post": _lib.KERNEL_BACKWARD_POST}
_INT32 = (-2**31, 2**31 - 1)
# The most bytes (or elements) one buffer may have: fa_malloc takes a size_t,
# and fa_tensor strides and the emulator's offsets are int64, so 2^63 - 1.
MAX_BYTES = 2**63 - 1


def _int32(value, what):
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = value.__index__()
        except AttributeError:
            raise invalid("%s must be an int, got %r" % (what, value)) from None
    if not _INT32[0] <= value <= _INT32[1]:
        raise invalid("%s = %d does not fit int32" % (what, value))
    return int(value)


def _size(value, what, limit=MAX_BYTES):
    """A count (bytes or elements) as an int in [0, limit]: an int or an
    object with __index__, never wrapped to size_t the way ctypes would."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = value.__index__()
        except AttributeError:
            raise invalid("%s must be an int, got %r" % (what, value)) from None
    if not 0 <= value <= limit:
        raise invalid("%s = %d is outside [0, %d]" % (what, value, limit))
    return int(value)


def _stream_handle(stream):
    """A CUstream as an int (0 = legacy default) from None, an int, a
    torch.cuda.Stream (.cuda_stream) or a CuPy stream (.ptr)."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise invalid("stream must be an int CUstream, a torch/CuPy stream or None, got %r"
                  % (stream,))


def _buffer(buf, writable, what):
    """(address, nbytes, keepalive) of a C-contiguous host buffer."""
    if isinstance(buf, HostList):
        buf = buf.data
    if is_ndarray(buf):
        if not buf.flags.c_contiguous:
            raise invalid("%s: the array must be C-contiguous" % what)
        if writable and not buf.flags.writeable:
            raise invalid("%s: the array is read-only" % what)
        return buf.ctypes.data, buf.nbytes, buf
    try:
        mv = memoryview(buf).cast("B")
    except TypeError as e:
        raise invalid("%s: needs a C-contiguous buffer (%s)" % (what, e)) from None
    if mv.readonly:
        if writable:
            raise invalid("%s: the buffer is read-only" % what)
        tmp = (ctypes.c_char * len(mv)).from_buffer_copy(mv)
        return ctypes.addressof(tmp), len(mv), tmp
    c = (ctypes.c_char * len(mv)).from_buffer(mv)
    return ctypes.addressof(c), len(mv), c


# ---- results ---------------------------------------------------------------

@dataclass(frozen=True)
class RuntimeInfo:
    backend: str
    sm: int
    num_sms: int
    driver_version: int
    device_name: str


@dataclass(frozen=True)
class CacheStats:
    memory_hits: int
    disk_hits: int
    misses: int
    compiles: int
    discarded: int
    entries: int
    bytes: int
    persistent: bool
    path: str
    note: str
    collisions: int
    evicted: int
    resets: int
    leases: int
    leases_reclaimed: int
    lease_waits: int
    lease_timeouts: int
    max_bytes: int
    compiler_mode: str  # since 0.6: "none" (emulator), "driver-jit" or "plugin"
    compiler: str  # the plugin's compiler version, "driver-jit", or ""
    compiler_note: str  # why the PTX compiler plugin is not used; "" when it is
    cubin_refusals: int  # cubins the driver refused (their PTX was JIT-compiled)


@dataclass(frozen=True)
class CacheEntry:
    key: str
    spec: str
    sm: int
    generator_version: int
    ptx_bytes: int
    cubin_bytes: int
    hits: int
    created: int
    last_used: int
    compiler: str  # since 0.6: what built the binary ("" for older rows)


# ---- handle lifetime -----------------------------------------------------------

class _Handle:
    """A C handle (fa_runtime* / fa_config*) and the calls in flight on it.

    The C API's destroy functions are not thread-safe with other calls on
    the same handle, so every call holds a use (acquire/release, or the
    use() context manager) and close() marks the handle closing, waits until
    no call holds a use, then destroys it. A call starting on another thread
    once closing has begun raises InvalidArgumentError("the X is closed");
    uses nested inside a call already in flight on the same thread (a
    forward's staging mallocs and frees) still succeed, so that call
    completes. close() from inside a call on the same thread raises instead
    of waiting for itself. The lock is reentrant: a finalizer run by the
    garbage collector while this thread holds it cannot deadlock."""

    __slots__ = ("_cond", "_handle", "_what", "_closing", "_users")

    def __init__(self, handle, what):
        self._cond = threading.Condition(threading.RLock())
        self._handle = handle
        self._what = what
        self._closing = False
        self._users = {}  # thread ident -> uses held by that thread

    @property
    def closed(self):
        return self._handle is None or self._closing

    def acquire(self):
        """The handle, counted as in use by this thread until release()."""
        with self._cond:
            me = threading.get_ident()
            held = self._users.get(me, 0)
            if self._handle is None or (self._closing and not held):
                raise invalid("the %s is closed" % self._what)
            self._users[me] = held + 1
            return self._handle

    def try_acquire(self):
        """Like acquire(), but None instead of an error when closed."""
        try:
            return self.acquire()
        except Error:
            return None

    def release(self):
        with self._cond:
            me = threading.get_ident()
            n = self._users[me] - 1
            if n:
                self._users[me] = n
            else:
                del self._users[me]
                if not self._users:
                    self._cond.notify_all()

    def use(self):
        return _Use(self)

    def close(self, destroy):
        """Waits for the calls in flight, then destroy(handle). Idempotent;
        a second closer waits for the first. Returns True if it destroyed."""
        with self._cond:
            if self._handle is None:
                return False
            if self._closing:
                while self._handle is not None:
                    self._cond.wait()
                return False
            if self._users.get(threading.get_ident()):
                raise invalid("the %s cannot be closed from inside a call on it (on the same "
                              "thread)" % self._what)
            self._closing = True
            while self._users:
                self._cond.wait()
            handle = self._handle
        try:
            destroy(handle)
        finally:
            with self._cond:
                self._handle = None
                self._closing = False
                self._cond.notify_all()
        return True


class _Use:
    """with handle.use() as h: ... (a use held for the block)."""

    __slots__ = ("_owner",)

    def __init__(self, owner):
        self._owner = owner

    def __enter__(self):
        return self._owner.acquire()

    def __exit__(self, *exc):
        self._owner.release()


# ---- Runtime -----------------------------------------------------------------

class Runtime:
    """A device binding (fa_runtime): backend 'auto' | 'cuda' | 'emulator',
    CUDA device ordinal, kernel cache 'default' | 'disk' | 'memory' with an
    optional cache_dir, the SM the emulator targets (0 = 80), and ptx_compiler
    'auto' (the PTX compiler plugin when present and trusted, cuda only) |
    'off' (always the driver's JIT).

    Use it as a context manager, or call close() (idempotent). close() frees
    every fa_malloc'd buffer still owned by the binding (DeviceArrays,
    decode workspaces) before destroying the runtime; __del__ is a backstop.

    Thread safety: every method may be called from any thread concurrently.
    close() waits for the calls in flight on other threads (the runtime is
    destroyed only once they have returned); calls started after close()
    began raise InvalidArgumentError("the Runtime is closed")."""

    def __init__(self, backend="auto", device=0, cache="default", cache_dir=None,
                 emulator_sm=0, ptx_compiler="auto"):
        self._guard = _Handle(None, "Runtime")  # closed until created
        lib = _lib.lib()
        self._lib = lib  # kept for __del__ during interpreter teardown
        if backend not in _BACKENDS:
            raise invalid("Runtime: backend must be one of %s, got %r" % (sorted(_BACKENDS), backend))
        if cache not in _CACHE_MODES:
            raise invalid("Runtime: cache must be one of %s, got %r" % (sorted(_CACHE_MODES), cache))
        if ptx_compiler not in _PTX_COMPILERS:
            raise invalid("Runtime: ptx_compiler must be one of %s, got %r"
                          % (sorted(_PTX_COMPILERS), ptx_compiler))
        opts = _lib.new(_lib.fa_runtime_options)
        opts.backend = _BACKENDS[backend]
        opts.device = _int32(device, "Runtime: device")
        opts.cache_mode = _CACHE_MODES[cache]
        self._cache_dir = None if cache_dir is None else str(cache_dir).encode()
        opts.cache_dir = self._cache_dir
        opts.emulator_sm = _int32(emulator_sm, "Runtime: emulator_sm")
        opts.ptx_compiler = _PTX_COMPILERS[ptx_compiler]
        handle = ctypes.c_void_p()
        check(lib.fa_runtime_create(ctypes.byref(opts), ctypes.byref(handle)))
        self._lock = threading.RLock()
        self._allocs = {}  # ptr -> bytes, owned by the binding
        # (kind, stream, thread) -> (ptr, bytes): decode's split-KV buffers
        # and the persistent forward's zeroed work counters
        self._workspaces = {}
        self._guard = _Handle(handle.value, "Runtime")

    # lifetime
    def _h(self):
        """The handle while open (for callers already holding a use)."""
        h = self._guard._handle
        if h is None:
            raise invalid("the Runtime is closed")
        return h

    def _use(self):
        """with self._use() as h: one call on the runtime (see _Handle)."""
        return self._guard.use()

    @property
    def closed(self):
        """True once close() has begun."""
        return self._guard.closed

    def close(self):
        """Waits for the calls in flight on other threads, frees the binding's
        buffers, then destroys the runtime. Idempotent. Raises
        InvalidArgumentError when called from inside a call on this runtime
        on the same thread (it would wait for itself)."""
        guard = getattr(self, "_guard", None)
        if guard is None:
            return

        def destroy(handle):
            lib = self._lib
            with self._lock:
                for ptr in list(self._allocs):
                    lib.fa_free(handle, ptr)
                self._allocs.clear()
                self._workspaces.clear()
                lib.fa_runtime_destroy(handle)

        guard.close(destroy)

    def __enter__(self):
        self._h()
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        try:
            i = self.info
        except Error:
            if self.closed:
                return "<flashattn.Runtime closed>"
            raise
        return "<flashattn.Runtime %s sm_%d %r>" % (i.backend, i.sm, i.device_name)

    @property
    def handle(self):
        """The fa_runtime* as an int (for callers mixing in their own ctypes).
        Calls made through it are not counted: close() does not wait for
        them, keep them from racing with close() yourself."""
        return self._h()

    @property
    def info(self):
        info = _lib.new(_lib.fa_runtime_info)
        with self._use() as h:
            check(self._lib.fa_runtime_get_info(h, ctypes.byref(info)))
        return RuntimeInfo(_BACKEND_NAMES.get(info.backend, str(info.backend)), info.sm,
                           info.num_sms, info.driver_version,
                           info.device_name.decode("utf-8", "replace"))

    # memory helpers
    def malloc(self, nbytes):
        """fa_malloc: device memory (256-byte aligned) as an int pointer. The
        runtime frees it at close() unless free() is called first."""
        nbytes = _size(nbytes, "malloc: nbytes")
        ptr = ctypes.c_uint64()
        with self._use() as h, self._lock:
            check(self._lib.fa_malloc(h, nbytes, ctypes.byref(ptr)))
            self._allocs[ptr.value] = nbytes
        return ptr.value

    def free(self, ptr):
        """fa_free of a pointer from malloc(); 0 is a no-op."""
        with self._use() as h, self._lock:
            check(self._lib.fa_free(h, ptr))
            self._allocs.pop(ptr, None)

    def _free_owned(self, ptr):
        """Frees ptr if the binding still owns it; a no-op once closed (close()
        freed it). For DeviceArray.free and finalizers."""
        h = self._guard.try_acquire()
        if h is None:
            return
        try:
            with self._lock:
                if ptr in self._allocs:
                    check(self._lib.fa_free(h, ptr))
                    del self._allocs[ptr]
        finally:
            self._guard.release()

    def memcpy_htod(self, dst, src, nbytes=None):
        """Copies a host buffer (bytes-like or C-contiguous NumPy array) to dst."""
        addr, size, keep = _buffer(src, False, "memcpy_htod")
        n = size if nbytes is None else _size(nbytes, "memcpy_htod: nbytes")
        if n > size:
            raise invalid("memcpy_htod: nbytes %d exceeds the source's %d" % (n, size))
        with self._use() as h:
            check(self._lib.fa_memcpy_htod(h, dst, addr, n))
        del keep

    def memcpy_dtoh(self, dst, src, nbytes=None):
        """Copies device memory at src into a writable host buffer."""
        addr, size, keep = _buffer(dst, True, "memcpy_dtoh")
        n = size if nbytes is None else _size(nbytes, "memcpy_dtoh: nbytes")
        if n > size:
            raise invalid("memcpy_dtoh: nbytes %d exceeds the destination's %d" % (n, size))
        with self._use() as h:
            check(self._lib.fa_memcpy_dtoh(h, addr, src, n))
        del keep

    def memset(self, dst, value, nbytes):
        with self._use() as h:
            check(self._lib.fa_memset(h, dst, value, _size(nbytes, "memset: nbytes")))

    def synchronize(self, stream=None):
        s = _stream_handle(stream)
        with self._use() as h:
            check(self._lib.fa_synchronize(h, s or None))

    def empty(self, shape, dtype):
        """An uninitialised DeviceArray of `dtype` ('fp16', 'bf16', 'fp32',
        'int32', 'fp8') and `shape` (a sequence of ints >= 0). Raises
        InvalidArgumentError naming the shape when a dimension is negative or
        not an int, or when the element or byte count exceeds MAX_BYTES
        (2^63 - 1: fa_malloc's size_t, int64 strides), instead of letting the
        byte count wrap."""
        return DeviceArray(self, shape, dtype)

    def upload(self, array, dtype=None):
        """Copies a NumPy array into a new DeviceArray. dtype defaults to the
        array's (float16 -> fp16, float32 -> fp32, int32 -> int32); uint16
        bit patterns or floats become bf16 with dtype='bf16'."""
        import numpy as np
        array = np.asarray(array)
        if dtype is None:
            dtype = {np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32",
                     np.dtype(np.int32): "int32", np.dtype(np.uint8): "fp8"}.get(array.dtype)
            if dtype is None:
                raise invalid("upload: pass dtype= for a %s array" % array.dtype)
        host = host_storage(array, dtype, "upload")
        d = DeviceArray(self, host.shape, dtype)
        self.memcpy_htod(d.ptr, host)
        return d

    # cache
    def cache_stats(self):
        s = _lib.new(_lib.fa_cache_stats)
        with self._use() as h:
            check(self._lib.fa_cache_stats_get(h, ctypes.byref(s)))
        return CacheStats(s.memory_hits, s.disk_hits, s.misses, s.compiles, s.discarded,
                          s.entries, s.bytes, bool(s.persistent),
                          s.path.decode("utf-8", "replace"), s.note.decode("utf-8", "replace"),
                          s.collisions, s.evicted, s.resets, s.leases, s.leases_reclaimed,
                          s.lease_waits, s.lease_timeouts, s.max_bytes,
                          _COMPILER_MODE_NAMES.get(s.compiler_mode, str(s.compiler_mode)),
                          s.compiler.decode("utf-8", "replace"),
                          s.compiler_note.decode("utf-8", "replace"), s.cubin_refusals)

    def cache_list(self):
        """Every stored kernel as a CacheEntry (copied during the walk)."""
        entries, failure = [], []

        def visit(entry_p, _user):
            try:
                e = entry_p.contents
                entries.append(CacheEntry(
                    e.key.decode("ascii", "replace"),
                    (e.spec or b"").decode("utf-8", "replace"), e.sm, e.generator_version,
                    e.ptx_bytes, e.cubin_bytes, e.hits, e.created, e.last_used,
                    (e.compiler or b"").decode("utf-8", "replace")))
                return 0
            except BaseException as exc:  # never unwind through C
                failure.append(exc)
                return 1

        cb = _lib.fa_cache_entry_fn(visit)
        with self._use() as h:
            check(self._lib.fa_cache_list(h, cb, None))
        if failure:
            raise failure[0]
        return entries

    def cache_clear(self):
        with self._use() as h:
            check(self._lib.fa_cache_clear(h))

    # Workspaces: one grow-only buffer per (kind, stream, thread). Work on one
    # stream is ordered; the thread is part of the key because the emulator
    # runs launches in the calling thread whatever the stream. kind "decode":
    # fa_decode's partial states (256-byte aligned); "forward": the
    # persistent forward's work counter, and "counters": fa_decode's
    # split_counters, each zeroed once when allocated (every launch that uses
    # them leaves them zero again, so calls reuse them as they are).
    def _workspace(self, stream, nbytes, kind="decode"):
        key = (kind, stream, threading.get_ident())
        with self._lock:
            ptr, size = self._workspaces.get(key, (0, 0))
            if size >= nbytes and ptr in self._allocs:
                return ptr, size
            if ptr in self._allocs:
                self.synchronize(stream)  # earlier launches may still use it
                self.free(ptr)
            self._workspaces.pop(key, None)
            size = max(nbytes, 256)
            ptr = self.malloc(size)
            if kind in ("forward", "counters"):
                try:
                    self.memset(ptr, 0, size)  # synchronous: zero before any launch
                except BaseException:
                    self.free(ptr)
                    raise
            self._workspaces[key] = (ptr, size)
            return ptr, size

    # the attention calls, as methods
    def forward(self, config, q, k, v, **kw):
        return forward(self, config, q, k, v, **kw)

    launch = forward

    def backward(self, config, q, k, v, out, lse, dout, **kw):
        return backward(self, config, q, k, v, out, lse, dout, **kw)

    def decode(self, config, q, k_cache, v_cache, cache_seqlens, **kw):
        return decode(self, config, q, k_cache, v_cache, cache_seqlens, **kw)

    def decode_reduce(self, config, o_partial, lse_partial, **kw):
        return decode_reduce(self, config, o_partial, lse_partial, **kw)


class DeviceArray:
    """fa_malloc'd memory with a shape and dtype, owned by a Runtime.
    Exposes __cuda_array_interface__ v3 (bf16 as typestr '<u2'); on the
    emulator the pointer is a host address checked by the emulator."""

    def __init__(self, runtime, shape, dtype):
        if dtype not in ITEMSIZE:
            raise invalid("DeviceArray: dtype must be one of %s, got %r" % (sorted(ITEMSIZE), dtype))
        try:
            dims = tuple(shape)
        except TypeError:
            raise invalid("DeviceArray: shape must be a sequence of ints, got %r"
                          % (shape,)) from None
        self.shape = tuple(_size(n, "DeviceArray: shape[%d]" % i) for i, n in enumerate(dims))
        count = math.prod(self.shape)
        if count * ITEMSIZE[dtype] > MAX_BYTES:
            raise invalid("DeviceArray: shape %r holds %d %s elements = %d bytes, more than "
                          "one buffer can hold (%d bytes: fa_malloc's size_t, int64 strides)"
                          % (self.shape, count, dtype, count * ITEMSIZE[dtype], MAX_BYTES))
        self.dtype = dtype
        self.nbytes = count * ITEMSIZE[dtype]
        self.runtime = runtime
        self.ptr = 0
        self.ptr = runtime.malloc(max(self.nbytes, 16))

    @property
    def strides(self):
        """Strides in elements (C order)."""
        return contiguous_strides(self.shape)

    @property
    def __cuda_array_interface__(self):
        self._check_live()
        return {"shape": self.shape,
                "typestr": {"fp16": "<f2", "bf16": "<u2", "fp32": "<f4", "int32": "<i4",
                            "fp8": "|u1"}[self.dtype],
                "data": (self.ptr, False), "version": 3, "strides": None, "stream": None}

    def _check_live(self):
        rt = self.runtime
        if not self.ptr or rt.closed or self.ptr not in rt._allocs:
            raise invalid("DeviceArray: its memory was freed (or its Runtime closed)")

    def numpy(self):
        """A host copy (bf16 as uint16 bit patterns)."""
        import numpy as np
        self._check_live()
        out = np.empty(self.shape, dtype=host_dtype(self.dtype))
        if self.nbytes:
            self.runtime.memcpy_dtoh(out, self.ptr, self.nbytes)
        return out

    def free(self):
        """Returns the memory now; idempotent (the Runtime frees it at close)."""
        ptr, self.ptr = self.ptr, 0
        if ptr:
            self.runtime._free_owned(ptr)

    def __del__(self):
        try:
            self.free()
        except Exception:
            pass

    def __repr__(self):
        return "<flashattn.DeviceArray %s %r at 0x%x>" % (self.dtype, self.shape, self.ptr)


# ---- Config ------------------------------------------------------------------

class Config:
    """A validated attention problem family (fa_config), device-independent.
    dtype 'fp16' | 'bf16' | 'fp32' (fp32: Q/K/V/O are float32 arrays, no
    conversion pass; the kernels round Q/K/V to bf16 on load, at most 2^-9
    relative per element, and write O as float32; forward, decode without a
    KV append, decode_reduce; not with kv_dtype); head_dim_v 0 = head_dim; num_heads_kv None =
    num_heads_q; window = (left, right), -1 = unbounded; softmax_scale 0 =
    1/sqrt(head_dim); softcap 0 = off. kv_dtype (since 0.5) None = dtype, or
    'e4m3' | 'e5m2': the KV cache holds fp8 bytes (uint8 arrays) for
    decode(), whose k_descale/v_descale scale them; Q and O stay dtype (sm_89+,
    head dims multiples of 16). q_dtype (since 0.6) None = dtype, or 'e4m3' |
    'e5m2' with an fp8 kv_dtype: the fp8 forward (forward() only): Q, K and V
    are fp8 bytes scaled by q_descale/k_descale/v_descale, O is dtype (fp16
    or bf16)."""

    def __init__(self, *, head_dim, num_heads_q, num_heads_kv=None, dtype="fp16",
                 head_dim_v=0, causal=False, window=(-1, -1), softmax_scale=0.0,
                 softcap=0.0, kv_dtype=None, q_dtype=None):
        self._guard = _Handle(None, "Config")  # closed until created
        lib = _lib.lib()
        self._lib = lib
        if dtype not in _DTYPES:
            raise invalid("Config: dtype must be 'fp16', 'bf16' or 'fp32', got %r" % (dtype,))
        if num_heads_kv is None:
            num_heads_kv = num_heads_q
        if window is None:
            window = (-1, -1)
        try:
            wl, wr = window
        except (TypeError, ValueError):
            raise invalid("Config: window must be a (left, right) pair, got %r" % (window,)) from None
        d = _lib.new(_lib.fa_config_desc)
        d.dtype = _DTYPES[dtype]
        d.head_dim = _int32(head_dim, "Config: head_dim")
        d.head_dim_v = _int32(head_dim_v, "Config: head_dim_v")
        d.num_heads_q = _int32(num_heads_q, "Config: num_heads_q")
        d.num_heads_kv = _int32(num_heads_kv, "Config: num_heads_kv")
        d.causal = 1 if causal else 0
        d.window_left = _int32(wl, "Config: window[0]")
        d.window_right = _int32(wr, "Config: window[1]")
        d.softmax_scale = float(softmax_scale)
        d.softcap = float(softcap)
        if kv_dtype not in _KV_DTYPES:
            raise invalid("Config: kv_dtype must be None, 'e4m3' or 'e5m2', got %r" % (kv_dtype,))
        d.kv_dtype = _KV_DTYPES[kv_dtype]
        if q_dtype not in _KV_DTYPES:
            raise invalid("Config: q_dtype must be None, 'e4m3' or 'e5m2', got %r" % (q_dtype,))
        if q_dtype is not None and kv_dtype is None:
            raise invalid("Config: q_dtype %r (an fp8 Q, the fp8 forward) needs an fp8 K and V "
                          "too: kv_dtype must be 'e4m3' or 'e5m2'" % (q_dtype,))
        d.q_dtype = _KV_DTYPES[q_dtype]
        handle = ctypes.c_void_p()
        check(lib.fa_config_create(ctypes.byref(d), ctypes.byref(handle)))
        self._guard = _Handle(handle.value, "Config")
        self.dtype = dtype
        self.head_dim = d.head_dim
        self.head_dim_v = d.head_dim_v or d.head_dim
        self.num_heads_q = d.num_heads_q
        self.num_heads_kv = d.num_heads_kv
        self.causal = bool(causal)
        self.window = (d.window_left, d.window_right)
        self.softmax_scale = float(softmax_scale) or 1.0 / math.sqrt(self.head_dim)
        self.softcap = float(softcap)
        self.kv_dtype = kv_dtype
        self.q_dtype = q_dtype

    @property
    def _kv_elem(self):
        """The element type of K/V tensors: the dtype, or 'fp8' (bytes)."""
        return "fp8" if self.kv_dtype else self.dtype

    @property
    def _q_elem(self):
        """The element type of Q in forward(): the dtype, or 'fp8' (bytes)."""
        return "fp8" if self.q_dtype else self.dtype

    def _h(self):
        h = self._guard._handle
        if h is None:
            raise invalid("the Config is closed")
        return h

    def _use(self):
        return self._guard.use()

    @property
    def closed(self):
        """True once close() has begun."""
        return self._guard.closed

    def close(self):
        """Destroys the config once no call in flight uses it (calls on other
        threads are waited for; later calls raise InvalidArgumentError).
        Idempotent."""
        guard = getattr(self, "_guard", None)
        if guard is not None:
            guard.close(lambda handle: self._lib.fa_config_destroy(handle))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return ("Config(dtype=%r, head_dim=%d, head_dim_v=%d, num_heads_q=%d, num_heads_kv=%d, "
                "causal=%r, window=%r, softmax_scale=%g, softcap=%g)"
                % (self.dtype, self.head_dim, self.head_dim_v, self.num_heads_q,
                   self.num_heads_kv, self.causal, self.window, self.softmax_scale,
                   self.softcap))

    def generate(self, kind="forward", sm=80):
        return generate(self, kind, sm)


def generate(config, kind="forward", sm=80):
    """The PTX module (str) for kind 'forward' | 'decode' | 'reduce' | 'backward-pre' |
    'backward' | 'backward-post' (fa_backward's kernels, in its launch order) on sm."""
    k = _KINDS.get(kind, kind)
    if k not in _KINDS.values():
        raise invalid("generate: kind must be one of %s, got %r" % (sorted(_KINDS), kind))
    lib = _lib.lib()
    size = ctypes.c_size_t()
    sm = _int32(sm, "generate: sm")
    if not isinstance(config, Config):
        raise invalid("generate: config must be a flashattn.Config")
    with config._use() as h:
        check(lib.fa_generate(h, k, sm, None, 0, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(size.value + 1)
        check(lib.fa_generate(h, k, sm, buf, len(buf), ctypes.byref(size)))
    return buf.raw[: size.value].decode("ascii")


# ---- one call: argument resolution, staging, copy-back ------------------------

_TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "int32": "int32"}


class _Call:
    """Resolves the arguments of one attention call. NumPy inputs are staged
    in fa_malloc'd memory and NumPy outputs copied back after a synchronize;
    DLPack capsules are released at the end. The launch stream is the
    caller's stream=, else the first __cuda_array_interface__ 'stream' met
    (q first), else the legacy default stream."""

    def __init__(self, rt, cfg, name, stream):
        if not isinstance(rt, Runtime):
            raise invalid("%s: runtime must be a flashattn.Runtime" % name)
        if not isinstance(cfg, Config):
            raise invalid("%s: config must be a flashattn.Config" % name)
        rt._h()
        cfg._h()
        self.rt, self.cfg, self.name = rt, cfg, name
        self.h = self.ch = None  # the handles, held in use from __enter__ to __exit__
        self.stream = _stream_handle(stream)
        self.explicit = self.stream is not None
        self.views, self.staged, self.copy_back = [], [], []
        self.host_mode = False
        self.launched = False

    def __enter__(self):
        # Uses of the runtime and the config for the whole call (staging,
        # launch, copy-back, frees): close() on another thread waits for it.
        self.h = self.rt._guard.acquire()
        try:
            self.ch = self.cfg._guard.acquire()
        except BaseException:
            self.rt._guard.release()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self._finish(exc_type)
        finally:
            self.cfg._guard.release()
            self.rt._guard.release()

    def _finish(self, exc_type):
        try:
            if exc_type is None and (self.staged or self.copy_back):
                self.rt.synchronize(self.stream)
                for ptr, arr in self.copy_back:
                    if arr.nbytes:
                        self.rt.memcpy_dtoh(arr, ptr, arr.nbytes)
            elif exc_type is not None and self.launched and self.staged:
                try:
                    self.rt.synchronize(self.stream)
                except Error:
                    pass
        finally:
            for ptr in self.staged:
                try:
                    self.rt.free(ptr)
                except Error:
                    pass
            for v in self.views:
                v.release()

    @property
    def launch_stream(self):
        return self.stream or None

    def _stage(self, view, nbytes):
        ptr = self.rt.malloc(max(nbytes, 16))
        self.staged.append(ptr)
        view.ptr = ptr
        return ptr

    def stage_host(self, values, ctype):
        """Stages `values` as a host array of array.array type code `ctype`
        (e.g. 'Q': uint64) for this call; returns its device address."""
        host = array.array(ctype, values)
        nbytes = len(host) * host.itemsize
        ptr = self.rt.malloc(max(nbytes, 16))
        self.staged.append(ptr)
        if nbytes:
            self.rt.memcpy_htod(ptr, host)
        return ptr

    def input(self, obj, what, dtype, first=False):
        """A device-resident View of an input of element type dtype."""
        label = "%s: %s" % (self.name, what)
        v = resolve(obj, label, stream=self.stream)
        self.views.append(v)
        if v.host is not None:
            if v.dtype is not None and v.dtype != dtype:
                raise invalid("%s: dtype %s does not match the expected %s" % (label, v.dtype, dtype))
            host = host_storage(v.host, dtype, label)
            v.host, v.dtype = host, dtype
            v.strides = contiguous_strides(host.shape)
            self._stage(v, host.nbytes)
            if host.nbytes:
                self.rt.memcpy_htod(v.ptr, host)
            if first:
                self.host_mode = True
        else:
            if v.dtype != dtype:
                raise invalid("%s: dtype %s does not match the expected %s" % (label, v.dtype, dtype))
            if v.stream is not None and not self.explicit and self.stream is None:
                self.stream = 0 if v.stream == 1 else int(v.stream)
        return v

    def output(self, obj, what, dtype, shape, like):
        """(View, returned object) for an output; allocates it when obj is None:
        NumPy in host mode, torch.empty for torch inputs, else a DeviceArray."""
        label = "%s: %s" % (self.name, what)
        if obj is None:
            src = like.source
            torch = sys.modules.get("torch")
            if self.host_mode:
                import numpy as np
                obj = np.empty(shape, dtype=host_dtype(dtype))
            elif torch is not None and isinstance(src, torch.Tensor):
                obj = torch.empty(shape, dtype=getattr(torch, _TORCH_DTYPES[dtype]),
                                  device=src.device)
            else:
                obj = DeviceArray(self.rt, shape, dtype)
        v = resolve(obj, label, stream=self.stream)
        self.views.append(v)
        if v.host is not None:
            arr = v.host
            if not is_ndarray(arr) or arr is not obj:
                raise invalid("%s: a host output must be a NumPy array" % label)
            if arr.dtype != host_dtype(dtype):
                raise invalid("%s: a NumPy output for %s must have dtype %s, got %s"
                              % (label, dtype, host_dtype(dtype).__name__, arr.dtype))
            if not arr.flags.c_contiguous or not arr.flags.writeable:
                raise invalid("%s: a NumPy output must be C-contiguous and writable" % label)
            v.dtype = dtype
            self._stage(v, arr.nbytes)
            self.copy_back.append((v.ptr, arr))
        elif v.dtype != dtype:
            raise invalid("%s: dtype %s does not match the expected %s" % (label, v.dtype, dtype))
        if v.shape != tuple(shape):
            raise invalid("%s: shape %r, expected %r" % (label, v.shape, tuple(shape)))
        return v, obj


def _expect(view, label, dims, names):
    """Checks view.shape against dims (None = any) and returns the shape."""
    if len(view.shape) != len(dims) or any(
            d is not None and d != n for d, n in zip(dims, view.shape)):
        want = ", ".join(n if d is None else "%s=%d" % (n, d) for d, n in zip(dims, names))
        raise invalid("%s: shape %r does not match [%s]" % (label, view.shape, want))
    return view.shape


def _need_contiguous(view, label):
    if not view.is_contiguous():
        raise invalid("%s: must be contiguous, strides %r (elements) for shape %r"
                      % (label, view.strides, view.shape))


def _ft(view, strides=None):
    """An fa_tensor of a View (None: data 0, for pointer-array caches)."""
    t = _lib.fa_tensor()
    t.data = 0 if view is None else view.ptr
    for i, s in enumerate(view.strides if strides is None else strides):
        t.stride[i] = s
    return t


def _host_cu_seqlens(view, name, total, total_name, max_seqlen, max_name):
    """Validates cu_seqlens held on the host (view.host: the int32 array the
    call stages) against the packed tensor's `total` rows and returns
    max_seqlen (the longest sequence when None). Device cu_seqlens are not
    read (that would need a synchronisation): see forward()'s docstring."""
    cu = view.host.tolist()
    label = "forward: " + name
    if cu[0] != 0:
        raise invalid("%s[0] must be 0, got %d" % (label, cu[0]))
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    if min(lengths) < 0:
        b = min(i for i, n in enumerate(lengths) if n < 0)
        raise invalid("%s must be non-decreasing: %s[%d] = %d > %s[%d] = %d"
                      % (label, name, b, cu[b], name, b + 1, cu[b + 1]))
    if cu[-1] > total:
        raise invalid("%s[%d] = %d exceeds %s = %d (the packed tensor's rows)"
                      % (label, len(cu) - 1, cu[-1], total_name, total))
    longest = max(lengths)
    if max_seqlen is None:
        if longest == 0:
            raise invalid("%s: every sequence is empty" % label)
        return longest
    max_seqlen = _int32(max_seqlen, "forward: " + max_name)
    if max_seqlen < longest:
        b = lengths.index(longest)
        raise invalid("forward: %s = %d is smaller than sequence %d's length %d (%s[%d] - %s[%d])"
                      % (max_name, max_seqlen, b, longest, name, b + 1, name, b))
    return max_seqlen


def _is_seq_list(obj):
    """True for a list or tuple of per-sequence tensors (a pointer-array
    cache); nested lists of numbers are one tensor, as everywhere else."""
    return isinstance(obj, (list, tuple)) and len(obj) > 0 and all(
        not isinstance(e, (list, tuple, numbers.Number)) for e in obj)


class _KvCache:
    """A paged or pointer-array KV cache, resolved: the k/v fa_tensors, the
    fa_kv_cache_layout, the keys one sequence can hold (capacity), and the
    host block table or per-sequence capacities for the length checks."""

    __slots__ = ("k", "v", "layout", "capacity", "table", "page_size", "num_pages", "seq_caps")


def _seq_strides(views, label, what):
    """The [seqlen, heads, dim] strides shared by per-sequence views
    (dimensions of extent 1 may have any stride)."""
    strides = list(views[0].strides)
    for i in range(3):
        for x in views:
            if x.shape[i] > 1:
                strides[i] = x.strides[i]
                break
    for b, x in enumerate(views):
        if any(x.shape[i] > 1 and x.strides[i] != strides[i] for i in range(3)):
            raise invalid("%s: %s[%d] has strides %r, expected %r: every sequence's tensor "
                          "needs the same strides" % (label, what, b, x.strides, tuple(strides)))
    return tuple(strides)


def _kv_cache(call, k, v, block_table, batch, dims, names):
    """Resolves a paged cache (block_table set; k/v pages [num_pages,
    page_size, num_heads_kv, head_dim(_v)]) or a pointer-array cache (k and v
    lists of `batch` tensors [seqlen_b, num_heads_kv, head_dim(_v)]).
    dims = (num_heads_kv, head_dim, head_dim_v), names = the k/v labels."""
    label, dt = call.name, call.cfg._kv_elem
    Hk, D, Dv = dims
    kname, vname = names
    c = _KvCache()
    c.layout = _lib.fa_kv_cache_layout()
    c.table = c.seq_caps = None
    c.page_size = c.num_pages = 0
    if block_table is not None:
        if _is_seq_list(k) or _is_seq_list(v):
            raise invalid("%s: block_table is for a paged cache: %s and %s must be page "
                          "tensors, not lists" % (label, kname, vname))
        kp = call.input(k, kname, dt)
        vp = call.input(v, vname, dt)
        P, ps, _, _ = _expect(kp, "%s: %s" % (label, kname), (None, None, Hk, D),
                              ("num_pages", "page_size", "num_heads_kv", "head_dim"))
        if ps < 1:  # named here: the library would see seqlen_k_max = 0 first
            raise invalid("%s: page_size must be >= 1, got %s pages of shape %r"
                          % (label, kname, kp.shape))
        _expect(vp, "%s: %s" % (label, vname), (P, ps, Hk, Dv),
                ("num_pages", "page_size", "num_heads_kv", "head_dim_v"))
        btv = call.input(block_table, "block_table", "int32")
        _, M = _expect(btv, label + ": block_table", (batch, None), ("batch", "max_pages_per_seq"))
        if M > 1 and btv.strides[1] != 1:
            raise invalid("%s: block_table rows must be contiguous, strides %r (elements)"
                          % (label, btv.strides))
        c.layout.layout = _lib.KV_PAGED
        c.layout.page_size = _int32(ps, label + ": page_size")
        c.layout.num_pages = _int32(P, label + ": num_pages")
        c.layout.max_pages_per_seq = _int32(M, label + ": max_pages_per_seq")
        c.layout.block_table = btv.ptr
        c.layout.block_table_stride = btv.strides[0] if batch > 1 else M
        c.k, c.v = _ft(kp), _ft(vp)
        c.capacity = M * ps
        c.table, c.page_size, c.num_pages = btv.host, ps, P
        return c
    if not (_is_seq_list(k) and _is_seq_list(v)):
        raise invalid("%s: a pointer-array cache needs %s and %s both as lists of per-sequence "
                      "tensors" % (label, kname, vname))
    if len(k) != batch or len(v) != batch:
        raise invalid("%s: %s and %s need one tensor per sequence (batch = %d), got %d and %d"
                      % (label, kname, vname, batch, len(k), len(v)))
    kvs = [call.input(x, "%s[%d]" % (kname, b), dt) for b, x in enumerate(k)]
    vvs = [call.input(x, "%s[%d]" % (vname, b), dt) for b, x in enumerate(v)]
    caps = []
    for b in range(batch):
        cap, _, _ = _expect(kvs[b], "%s: %s[%d]" % (label, kname, b), (None, Hk, D),
                            ("seqlen", "num_heads_kv", "head_dim"))
        _expect(vvs[b], "%s: %s[%d]" % (label, vname, b), (cap, Hk, Dv),
                ("seqlen", "num_heads_kv", "head_dim_v"))
        caps.append(cap)
    ptrs = []
    for views, what in ((kvs, kname), (vvs, vname)):
        for b, x in enumerate(views):
            if x.ptr % 16:
                raise invalid("%s: %s[%d] at 0x%x is not 16-byte aligned" % (label, what, b, x.ptr))
        ptrs.append(call.stage_host([x.ptr for x in views], "Q"))
    c.layout.layout = _lib.KV_PTR_ARRAY
    c.layout.k_ptrs, c.layout.v_ptrs = ptrs
    c.k = _ft(None, (0,) + _seq_strides(kvs, label, kname))
    c.v = _ft(None, (0,) + _seq_strides(vvs, label, vname))
    c.capacity = max(caps)
    c.seq_caps = caps
    return c


def _check_cache_lengths(c, label, lengths, what, names):
    """Host checks of a cache against host per-sequence key counts: every
    block_table entry a sequence reads lies in [0, num_pages), every
    per-sequence tensor holds its keys."""
    table = None if c.table is None else c.table.tolist()
    for b, n in enumerate(int(x) for x in lengths):
        if table is not None:
            pages = -(-n // c.page_size)
            row = table[b][:pages]
            bad = [j for j, p in enumerate(row) if not 0 <= p < c.num_pages]
            if bad:
                raise invalid("%s: block_table[%d, %d] = %d is outside [0, num_pages=%d) "
                              "(sequence %d has %d keys in pages 0..%d)"
                              % (label, b, bad[0], row[bad[0]], c.num_pages, b, n, pages - 1))
        if c.seq_caps is not None and n > c.seq_caps[b]:
            raise invalid("%s: %s[%d] = %d exceeds the %d keys %s[%d] holds"
                          % (label, what, b, n, c.seq_caps[b], names[0], b))


def _raw_device_memory(obj, label):
    """(address, bytes) of device memory given as a DeviceArray or a
    C-contiguous __cuda_array_interface__ object of any element type."""
    if isinstance(obj, DeviceArray):
        obj._check_live()
        return obj.ptr, obj.nbytes
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        raise invalid("%s: expected a DeviceArray or an object with __cuda_array_interface__, "
                      "got %s" % (label, type(obj).__name__)) from None
    code = cai["typestr"][2:]
    if not code.isdigit():
        raise invalid("%s: typestr %r" % (label, cai["typestr"]))
    itemsize = int(code)
    shape = tuple(int(n) for n in cai["shape"])
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != tuple(
            s * itemsize for s in contiguous_strides(shape)):
        raise invalid("%s: must be C-contiguous" % label)
    return int(cai["data"][0] or 0), math.prod(shape) * itemsize


def _lengths(view, label, what, limit, limit_name):
    """Checks a host int32 [batch] of key counts against [0, limit]; returns
    them as a list."""
    counts = view.host.tolist()
    bad = [i for i, n in enumerate(counts) if not 0 <= n <= limit]
    if bad:
        raise invalid("%s: %s[%d] = %d is outside [0, %s=%d]"
                      % (label, what, bad[0], counts[bad[0]], limit_name, limit))
    return counts


def forward(runtime, config, q, k, v, *, out=None, lse=None, return_lse=False,
            cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
            block_table=None, seqused_k=None, sinks=None, alibi_slopes=None, q_descale=None,
            k_descale=None, v_descale=None, workspace=None, stream=None):
    """Attention forward (fa_launch): O = softmax(scale * Q K^T) V.

    Fixed length: q [batch, seqlen_q, num_heads_q, head_dim], k/v [batch,
    seqlen_k, num_heads_kv, head_dim(_v)]. Varlen: cu_seqlens_q/k int32
    [batch + 1] and packed q/k/v [total, heads, dim]; max_seqlen_q/k are
    needed when the cu_seqlens are on the device. Returns O, or (O, LSE)
    with return_lse=True or an lse= buffer (LSE fp32 [batch, num_heads_q,
    seqlen_q], varlen [num_heads_q, total_q]).

    KV cache (chunked prefill, since 0.3): with block_table (int32 [batch,
    max_pages_per_seq]) k/v are pages [num_pages, page_size, num_heads_kv,
    head_dim(_v)] (any strides, so HND pages as a transposed view work);
    with k and v lists of `batch` tensors [seqlen_b, num_heads_kv,
    head_dim(_v)] (one stride set for all) they are a pointer array. The
    queries (fixed length, or packed with cu_seqlens_q alone) are the last
    tokens of each sequence; seqlen_k is max_seqlen_k, else the cache's
    capacity (max_pages_per_seq * page_size, or the longest tensor).
    seqused_k (int32 [batch], also with fixed-length contiguous k/v, not
    with cu_seqlens_k): sequence b has keys 0..seqused_k[b]-1, else seqlen_k.

    sinks (since 0.4.1; gpt-oss attention sinks): fp32 [num_heads_q], one
    natural-log logit per query head that joins every row's softmax
    denominator and adds no value: O = sum_j e^(s_j) v_j / (sum_j e^(s_j) +
    e^(sinks[h])) with s_j = scale * q.k_j (after softcap), the sink neither
    scaled nor masked; the LSE includes it (a row with no key: O = 0, LSE =
    sinks[h]); -inf = no sink for that head.

    alibi_slopes (since 0.5; ALiBi, as FlashAttention-2's alibi_slopes):
    fp32 [num_heads_q] or [batch, num_heads_q] (last dim contiguous); the
    logit of query i, key j loses slope * |i + seqlen_k - seqlen_q - j|
    (after softcap; bottom-right aligned, per sequence with varlen or
    seqused_k), causal or not. The sink is not biased.

    The fp8 forward (since 0.6; FlashAttention-3's): with a Config of
    q_dtype and kv_dtype 'e4m3' | 'e5m2', q, k and v hold fp8 bytes (NumPy
    or torch uint8, or torch.float8_e4m3fn / float8_e5m2, whose DLPack
    format must match the Config's); an element's value is fp8(byte) *
    descale, with q_descale / k_descale / v_descale fp32, a scalar or
    [batch, num_heads_kv] (any strides, the same for all three; a query
    head uses its KV head's q_descale), or None = 1, as decode()'s
    descales. O (and out=) is the Config's dtype. S and P V run on fp8
    tensor cores with f32 accumulation, P rounded to e4m3 (sm_89+).

    Host cu_seqlens (NumPy, list, CPU DLPack) are validated before anything
    runs: 1-D integers of length batch + 1 that fit int32, starting at 0,
    non-decreasing, the last at most the packed tensor's rows (total_q /
    total_k; equal to total_q when an LSE is asked for, since the kernel lays
    the LSE out [num_heads_q, cu_seqlens_q[batch]]); max_seqlen_q/k default
    to the longest sequence and, when given, must not be smaller. Rows of
    out past cu_seqlens_q[batch] are not written. Host seqused_k must lie in
    [0, seqlen_k]; with host key counts (seqused_k, or none: seqlen_k each)
    every block_table entry a sequence reads must lie in [0, num_pages) and
    every per-sequence tensor must hold its keys.

    Device cu_seqlens (__cuda_array_interface__, CUDA DLPack, DeviceArray)
    are trusted: reading them would need a synchronisation. The caller
    guarantees the same rules; the kernel clamps each sequence's length to
    [0, max_seqlen_q/k], so a max_seqlen that is too small truncates
    sequences (their later rows are not written) and a decreasing pair
    gives an empty sequence, but offsets past the packed tensors make the
    kernel read and write out of bounds (the emulator reports a LaunchError;
    on a GPU that is an illegal address that poisons the runtime). Device
    block tables and device seqused_k with a cache are trusted the same way.

    workspace (since 0.8; fa_forward_args.workspace): scratch for the
    forward, as many bytes as fa_forward_workspace_size says (0: none). The
    persistent kernel's work counter (8 bytes: two uint32), through which it
    hands out work items dynamically, when the runtime was created with
    FLASHATTN_SM90_PERSISTENT=1 in the environment (experimental, off by
    default); or, for a fixed-length launch whose CTAs would leave SMs idle,
    256 bytes plus the split-KV partial states (the keys split, then the
    combine kernel), or the GQA-packing decode kernel's for a few queries
    per sequence with a GQA group (docs/api.md "Forward
    workspace"; a workspace smaller than asked for, or not 256-byte aligned,
    runs the plain forward; off with FLASHATTN_FORWARD_SPLITS=0 /
    FLASHATTN_FORWARD_GQA_PACK=0). None (the default): when the launch needs one,
    the binding uses a workspace it owns, one per (stream, thread) and
    Runtime, zeroed once when allocated and freed with the Runtime; the
    kernel leaves it zero after each launch, so repeated calls and benchmark
    loops reuse it with no memset, and launches on different streams never
    share one. Else device memory the caller owns (a DeviceArray or a
    C-contiguous __cuda_array_interface__ object), 8-byte aligned (256 for
    the split), at least 8 bytes, zeroed once before its first use and not used by two launches
    that may run at the same time; it is passed on even when the launch
    does not need it (the library checks it either way). Or a callable that
    takes the byte count and returns such memory, called only when the
    launch needs a workspace. A workspace that was not zero gives wrong
    output (device data the library cannot check). The library refuses one
    that is too small or misaligned (InvalidArgumentError naming workspace /
    workspace_size).

    Errors: InvalidArgumentError for shapes, dtypes and the host checks
    above (nothing runs), else the library's status."""
    cfg = config
    with _Call(runtime, cfg, "forward", stream) as call:
        dt = cfg.dtype
        cache = block_table is not None or _is_seq_list(k) or _is_seq_list(v)
        if cache and cu_seqlens_k is not None:
            raise invalid("forward: cu_seqlens_k is for contiguous k/v; give a paged or "
                          "pointer-array cache's key counts in seqused_k")
        varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
        if varlen and not cache and (cu_seqlens_q is None or cu_seqlens_k is None):
            raise invalid("forward: cu_seqlens_q and cu_seqlens_k go together")
        qv = call.input(q, "q", cfg._q_elem, first=True)
        H, Hk, D, Dv = cfg.num_heads_q, cfg.num_heads_kv, cfg.head_dim, cfg.head_dim_v
        a = _lib.new(_lib.fa_forward_args)
        want_lse = return_lse or lse is not None

        def packed(view, label, heads, dim, names):
            if len(view.shape) == 4 and view.shape[0] == 1:
                return _expect(view, label, (1, None, heads, dim), ("1",) + names)[1]
            return _expect(view, label, (None, heads, dim), names)[0]

        def widen(view):
            return view.strides if len(view.strides) == 4 else (0,) + view.strides

        def cu_q(cqv, Tq):
            _need_contiguous(cqv, "forward: cu_seqlens_q")
            B = cqv.shape[0] - 1
            Sq = max_seqlen_q
            if cqv.host is not None:
                Sq = _host_cu_seqlens(cqv, "cu_seqlens_q", Tq, "total_q", max_seqlen_q,
                                      "max_seqlen_q")
                last = cqv.host.tolist()[-1]
                if want_lse and last != Tq:
                    raise invalid("forward: with an LSE, cu_seqlens_q[%d] (%d) must equal total_q "
                                  "(%d): the LSE is laid out [num_heads_q, cu_seqlens_q[batch]]"
                                  % (B, last, Tq))
            elif Sq is None:
                raise invalid("forward: max_seqlen_q is needed with device cu_seqlens_q")
            a.cu_seqlens_q = cqv.ptr
            return B, Sq

        kvc = None
        if not varlen:
            B, Sq, _, _ = _expect(qv, "forward: q", (None, None, H, D),
                                  ("batch", "seqlen_q", "num_heads_q", "head_dim"))
            o_shape, lse_shape = (B, Sq, H, Dv), (B, H, Sq)
        else:
            Tq = packed(qv, "forward: q", H, D, ("total_q", "num_heads_q", "head_dim"))
            o_shape, lse_shape = qv.shape[:-1] + (Dv,), (H, Tq)
        if cache:
            if varlen:
                cqv = call.input(cu_seqlens_q, "cu_seqlens_q", "int32")
                if len(cqv.shape) != 1 or cqv.shape[0] < 2:
                    raise invalid("forward: cu_seqlens_q must be int32 [batch + 1], got %r"
                                  % (cqv.shape,))
                B, Sq = cu_q(cqv, Tq)
            kvc = _kv_cache(call, k, v, block_table, B, (Hk, D, Dv), ("k", "v"))
            Sk = kvc.capacity if max_seqlen_k is None else _int32(max_seqlen_k,
                                                                  "forward: max_seqlen_k")
            kt, vt = kvc.k, kvc.v
            a.kv = kvc.layout
        elif not varlen:
            kv = call.input(k, "k", cfg._kv_elem)
            vv = call.input(v, "v", cfg._kv_elem)
            _, Sk, _, _ = _expect(kv, "forward: k", (B, None, Hk, D),
                                  ("batch", "seqlen_k", "num_heads_kv", "head_dim"))
            _expect(vv, "forward: v", (B, Sk, Hk, Dv),
                    ("batch", "seqlen_k", "num_heads_kv", "head_dim_v"))
            kt, vt = _ft(kv), _ft(vv)
        else:
            kv = call.input(k, "k", cfg._kv_elem)
            vv = call.input(v, "v", cfg._kv_elem)
            Tk = packed(kv, "forward: k", Hk, D, ("total_k", "num_heads_kv", "head_dim"))
            if packed(vv, "forward: v", Hk, Dv, ("total_k", "num_heads_kv", "head_dim_v")) != Tk:
                raise invalid("forward: v has %d rows, k has %d" % (vv.shape[-3], Tk))
            cqv = call.input(cu_seqlens_q, "cu_seqlens_q", "int32")
            ckv = call.input(cu_seqlens_k, "cu_seqlens_k", "int32")
            if len(cqv.shape) != 1 or len(cqv.shape) != len(ckv.shape) or \
                    cqv.shape != ckv.shape or cqv.shape[0] < 2:
                raise invalid("forward: cu_seqlens_q/k must both be int32 [batch + 1], got %r "
                              "and %r" % (cqv.shape, ckv.shape))
            _need_contiguous(ckv, "forward: cu_seqlens_k")
            B, Sq = cu_q(cqv, Tq)
            if ckv.host is not None:
                max_seqlen_k = _host_cu_seqlens(ckv, "cu_seqlens_k", Tk, "total_k",
                                                max_seqlen_k, "max_seqlen_k")
            elif max_seqlen_k is None:
                raise invalid("forward: max_seqlen_k is needed with device cu_seqlens_k")
            Sk = max_seqlen_k
            a.cu_seqlens_k = ckv.ptr
            kt, vt = _ft(kv, widen(kv)), _ft(vv, widen(vv))
        lengths = [Sk] * B
        if seqused_k is not None:
            suv = call.input(seqused_k, "seqused_k", "int32")
            _expect(suv, "forward: seqused_k", (B,), ("batch",))
            _need_contiguous(suv, "forward: seqused_k")
            lengths = None
            if suv.host is not None:
                lengths = _lengths(suv, "forward", "seqused_k", Sk, "seqlen_k")
            a.seqused_k = suv.ptr
        a.sinks = _sinks(call, sinks, H, "forward")
        a.alibi_slopes, a.alibi_slopes_stride = _alibi(call, alibi_slopes, B, H, "forward")
        _descales(call, a, B, Hk, q_descale=q_descale, k_descale=k_descale,
                  v_descale=v_descale)
        _check_fp8_formats(call, qv)
        if kvc is not None and lengths is not None:
            _check_cache_lengths(kvc, "forward", lengths,
                                 "seqused_k" if seqused_k is not None else "seqlen_k", ("k", "v"))
        ov, o_obj = call.output(out, "out", dt, o_shape, qv)
        lse_obj = None
        if want_lse:
            lv, lse_obj = call.output(lse, "lse", "fp32", lse_shape, qv)
            _need_contiguous(lv, "forward: lse")
            a.lse = lv.ptr
        a.batch = _int32(B, "forward: batch")
        a.seqlen_q = _int32(Sq, "forward: seqlen_q")
        a.seqlen_k = _int32(Sk, "forward: seqlen_k")
        a.q, a.o = (_ft(x, widen(x) if varlen else None) for x in (qv, ov))
        a.k, a.v = kt, vt
        ws = _forward_workspace(call, a, workspace)
        call.launched = True
        check(_lib.lib().fa_launch(call.h, call.ch, ctypes.byref(a), call.launch_stream))
        del ws  # kept alive until the launch is queued
    return (o_obj, lse_obj) if want_lse else o_obj


def _forward_workspace(call, a, workspace):
    """Sets a.workspace / a.workspace_size (see forward()'s workspace);
    returns the object holding the memory, to be kept until the launch."""
    if workspace is not None and not callable(workspace):
        a.workspace, a.workspace_size = _raw_device_memory(workspace, "forward: workspace")
        if a.workspace == 0:
            raise invalid("forward: workspace is a null pointer (pass None for none)")
        return workspace
    nbytes = ctypes.c_size_t()
    if _lib.lib().fa_forward_workspace_size(call.h, call.ch, ctypes.byref(a),
                                            ctypes.byref(nbytes)) != _lib.SUCCESS:
        return None  # fa_launch refuses the same arguments, with its own message
    if nbytes.value == 0:
        return None
    if workspace is None:
        a.workspace, a.workspace_size = call.rt._workspace(call.stream or 0, nbytes.value,
                                                           "forward")
        return None
    ws = workspace(nbytes.value)
    a.workspace, a.workspace_size = _raw_device_memory(ws, "forward: workspace")
    return ws


def backward(runtime, config, q, k, v, out, lse, dout, *, dq=None, dk=None, dv=None,
             cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
             seqused_k=None, sinks=None, dsinks=None, alibi_slopes=None, deterministic=False,
             workspace=None, stream=None):
    """The attention backward (fa_backward, library 0.9): the gradients of
    forward()'s O with respect to Q, K and V, given the upstream gradient
    dout (FlashAttention-2's Algorithm 2: P recomputed from Q, K and the
    forward's LSE).

    q, k, v, out (the forward's O) and dout as forward() takes them, fixed
    length [batch, seqlen, heads, dim] or varlen (cu_seqlens_q and
    cu_seqlens_k, packed [total, heads, dim]); lse: the forward's fp32 LSE
    (forward(..., return_lse=True)), [batch, num_heads_q, seqlen_q] or
    varlen [num_heads_q, total_q]. K and V are contiguous tensors (no
    paged or pointer-array cache). seqused_k, sinks and alibi_slopes as
    forward(), the same values the forward ran with; the Config too
    (causal, window, softcap, scale, GQA). Returns (dq, dk, dv) shaped like
    q, k, v (dk and dv summed over each KV head's query heads with GQA), and
    with sinks (dq, dk, dv, dsinks), dsinks fp32 [num_heads_q]. dq=, dk=,
    dv=, dsinks= are output buffers, allocated like q when None.

    deterministic=True: the same bits on every run (dQ summed over key
    blocks in a fixed order); False: atomic accumulation, faster.
    workspace: None = a buffer the binding owns (one per stream and
    thread, freed with the Runtime); else device memory of at least the
    bytes fa_backward_workspace_size gives, 256-byte aligned (a DeviceArray
    or a C-contiguous __cuda_array_interface__ object), or a callable taking
    the byte count and returning it. Its contents on entry do not matter.

    Errors: UnsupportedError when the library has no fa_backward (before
    0.9) and for what the backward kernels do not take (fp8 and fp32
    configs, head dims past 256 (past 128: multiples of 16), SMs below 8.0); InvalidArgumentError for
    shapes and dtypes (nothing runs); else the library's status."""
    cfg = config
    if not _lib.has_backward():
        raise make_error(2, "backward: the loaded library (%s) has no fa_backward: it needs "
                         "flashattn 0.9 or later" % _lib.library_path())
    with _Call(runtime, cfg, "backward", stream) as call:
        dt = cfg.dtype
        varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
        if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
            raise invalid("backward: cu_seqlens_q and cu_seqlens_k go together")
        if _is_seq_list(k) or _is_seq_list(v):
            raise invalid("backward: k and v must be contiguous tensors (no pointer-array "
                          "cache)")
        H, Hk, D, Dv = cfg.num_heads_q, cfg.num_heads_kv, cfg.head_dim, cfg.head_dim_v
        qv = call.input(q, "q", cfg._q_elem, first=True)
        kv = call.input(k, "k", cfg._kv_elem)
        vv = call.input(v, "v", cfg._kv_elem)
        ov = call.input(out, "out", dt)
        gv = call.input(dout, "dout", dt)
        lv = call.input(lse, "lse", "fp32")
        a = _lib.new(_lib.fa_backward_args)
        f = a.fwd
        f.struct_size = ctypes.sizeof(_lib.fa_forward_args)

        def widen(view):
            return view.strides if len(view.strides) == 4 else (0,) + view.strides

        def packed(view, label, heads, dim, names):
            if len(view.shape) == 4 and view.shape[0] == 1:
                return _expect(view, label, (1, None, heads, dim), ("1",) + names)[1]
            return _expect(view, label, (None, heads, dim), names)[0]

        if not varlen:
            B, Sq, _, _ = _expect(qv, "backward: q", (None, None, H, D),
                                  ("batch", "seqlen_q", "num_heads_q", "head_dim"))
            _, Sk, _, _ = _expect(kv, "backward: k", (B, None, Hk, D),
                                  ("batch", "seqlen_k", "num_heads_kv", "head_dim"))
            _expect(vv, "backward: v", (B, Sk, Hk, Dv),
                    ("batch", "seqlen_k", "num_heads_kv", "head_dim_v"))
            o_dims = (B, Sq, H, Dv)
            o_names = ("batch", "seqlen_q", "num_heads_q", "head_dim_v")
            lse_shape = (B, H, Sq)
        else:
            Tq = packed(qv, "backward: q", H, D, ("total_q", "num_heads_q", "head_dim"))
            Tk = packed(kv, "backward: k", Hk, D, ("total_k", "num_heads_kv", "head_dim"))
            if packed(vv, "backward: v", Hk, Dv, ("total_k", "num_heads_kv", "head_dim_v")) != Tk:
                raise invalid("backward: v has %d rows, k has %d" % (vv.shape[-3], Tk))
            cqv = call.input(cu_seqlens_q, "cu_seqlens_q", "int32")
            ckv = call.input(cu_seqlens_k, "cu_seqlens_k", "int32")
            if len(cqv.shape) != 1 or cqv.shape != ckv.shape or cqv.shape[0] < 2:
                raise invalid("backward: cu_seqlens_q/k must both be int32 [batch + 1], got %r "
                              "and %r" % (cqv.shape, ckv.shape))
            _need_contiguous(cqv, "backward: cu_seqlens_q")
            _need_contiguous(ckv, "backward: cu_seqlens_k")
            B = cqv.shape[0] - 1
            Sq, Sk = max_seqlen_q, max_seqlen_k
            if cqv.host is not None:
                Sq = _host_cu_seqlens(cqv, "cu_seqlens_q", Tq, "total_q", max_seqlen_q,
                                      "max_seqlen_q")
                last = cqv.host.tolist()[-1]
                if last != Tq:
                    raise invalid("backward: cu_seqlens_q[%d] (%d) must equal total_q (%d): the "
                                  "LSE is laid out [num_heads_q, cu_seqlens_q[batch]]"
                                  % (B, last, Tq))
            elif Sq is None:
                raise invalid("backward: max_seqlen_q is needed with device cu_seqlens_q")
            if ckv.host is not None:
                Sk = _host_cu_seqlens(ckv, "cu_seqlens_k", Tk, "total_k", max_seqlen_k,
                                      "max_seqlen_k")
            elif Sk is None:
                raise invalid("backward: max_seqlen_k is needed with device cu_seqlens_k")
            f.cu_seqlens_q, f.cu_seqlens_k = cqv.ptr, ckv.ptr
            o_dims = qv.shape[:-1] + (Dv,)
            o_names = ("total_q", "num_heads_q", "head_dim_v")
            if len(o_dims) == 4:
                o_names = ("1",) + o_names
            lse_shape = (H, Tq)
        for view, name in ((ov, "out"), (gv, "dout")):
            _expect(view, "backward: " + name, o_dims, o_names)
        _expect(lv, "backward: lse", lse_shape,
                ("num_heads_q", "total_q") if varlen else ("batch", "num_heads_q", "seqlen_q"))
        _need_contiguous(lv, "backward: lse")
        if seqused_k is not None:
            suv = call.input(seqused_k, "seqused_k", "int32")
            _expect(suv, "backward: seqused_k", (B,), ("batch",))
            _need_contiguous(suv, "backward: seqused_k")
            if suv.host is not None:
                _lengths(suv, "backward", "seqused_k", Sk, "seqlen_k")
            f.seqused_k = suv.ptr
        f.sinks = _sinks(call, sinks, H, "backward")
        if dsinks is not None and sinks is None:
            raise invalid("backward: dsinks is the gradient of sinks: pass sinks too")
        f.alibi_slopes, f.alibi_slopes_stride = _alibi(call, alibi_slopes, B, H, "backward")
        dqv, dq_obj = call.output(dq, "dq", dt, qv.shape, qv)
        dkv, dk_obj = call.output(dk, "dk", dt, kv.shape, qv)
        dvv, dv_obj = call.output(dv, "dv", dt, vv.shape, qv)
        ds_obj = None
        if sinks is not None:
            dsv, ds_obj = call.output(dsinks, "dsinks", "fp32", (H,), qv)
            _need_contiguous(dsv, "backward: dsinks")
            a.dsinks = dsv.ptr
        f.batch = _int32(B, "backward: batch")
        f.seqlen_q = _int32(Sq, "backward: seqlen_q")
        f.seqlen_k = _int32(Sk, "backward: seqlen_k")
        w = widen if varlen else (lambda x: None)
        f.q, f.k, f.v, f.o = (_ft(x, w(x)) for x in (qv, kv, vv, ov))
        f.lse = lv.ptr
        a.dout, a.dq, a.dk, a.dv = (_ft(x, w(x)) for x in (gv, dqv, dkv, dvv))
        if not isinstance(deterministic, bool):
            raise invalid("backward: deterministic must be a bool, got %r" % (deterministic,))
        a.deterministic = int(deterministic)
        ws = _backward_workspace(call, a, workspace)
        call.launched = True
        check(_lib.lib().fa_backward(call.h, call.ch, ctypes.byref(a), call.launch_stream))
        del ws  # kept alive until the launch is queued
    grads = (dq_obj, dk_obj, dv_obj)
    return grads + (ds_obj,) if sinks is not None else grads


def _backward_workspace(call, a, workspace):
    """Sets a.workspace / a.workspace_size (see backward()'s workspace);
    returns the object holding the memory, to be kept until the launch."""
    if workspace is not None and not callable(workspace):
        a.workspace, a.workspace_size = _raw_device_memory(workspace, "backward: workspace")
        return workspace
    nbytes = ctypes.c_size_t()
    check(_lib.lib().fa_backward_workspace_size(call.h, call.ch, ctypes.byref(a),
                                                ctypes.byref(nbytes)))
    if nbytes.value == 0:
        return None
    if workspace is None:
        a.workspace, a.workspace_size = call.rt._workspace(call.stream or 0, nbytes.value,
                                                           "backward")
        return None
    ws = workspace(nbytes.value)
    a.workspace, a.workspace_size = _raw_device_memory(ws, "backward: workspace")
    return ws


def _sinks(call, sinks, H, what):
    """The device address of attention sinks fp32 [H] (contiguous), or 0."""
    if sinks is None:
        return 0
    sv = call.input(sinks, "sinks", "fp32")
    _expect(sv, what + ": sinks", (H,), ("num_heads_q",))
    _need_contiguous(sv, what + ": sinks")
    return sv.ptr


def _alibi(call, slopes, B, H, what):
    """(device address, stride) of ALiBi slopes fp32 [H] or [B, H], or (0, 0)."""
    if slopes is None:
        return 0, 0
    sv = call.input(slopes, "alibi_slopes", "fp32")
    if len(sv.shape) == 1:
        _expect(sv, what + ": alibi_slopes", (H,), ("num_heads_q",))
        _need_contiguous(sv, what + ": alibi_slopes")
        return sv.ptr, 0
    _expect(sv, what + ": alibi_slopes", (B, H), ("batch", "num_heads_q"))
    if sv.strides[1] != 1 or (B > 1 and sv.strides[0] < H):
        raise invalid("%s: alibi_slopes: the last dim must be contiguous and rows must not "
                      "overlap, strides %r (elements)" % (what, sv.strides))
    return sv.ptr, (sv.strides[0] if B > 1 else H)


def _descales(call, a, B, Hk, **descales):
    """Fills a's fp8 descales (q_descale, k_descale, v_descale, the given
    ones) and descale_stride: fp32 scalars (one value per tensor) or [B, Hk]
    tensors, all of one shape and strides; None = 1.0. k/v descales need an
    fp8 kv_dtype, q_descale an fp8 q_dtype."""
    cfg, what = call.cfg, call.name
    given = [(n, x) for n, x in descales.items() if x is not None]
    if not given:
        return
    for name, x in given:
        fmt = cfg.q_dtype if name == "q_descale" else cfg.kv_dtype
        if not fmt:
            raise invalid("%s: %s is for an fp8 %s (Config %s 'e4m3' or 'e5m2')"
                          % (what, name, "Q" if name == "q_descale" else "KV cache",
                             "q_dtype" if name == "q_descale" else "kv_dtype"))
    strides = set()
    for name, x in given:
        if isinstance(x, (int, float)) or type(x).__module__ == "numpy" and \
                not is_ndarray(x):  # a Python or NumPy scalar: one value
            x = [float(x)]
        dv_ = call.input(x, name, "fp32")
        if dv_.shape in ((), (1,)):
            strides.add((0, 0))
        elif dv_.shape == (B, Hk):
            strides.add(tuple(dv_.strides))
        else:
            raise invalid("%s: %s: shape %r, expected a scalar or [%d, %d] (batch, num_heads_kv)"
                          % (what, name, dv_.shape, B, Hk))
        setattr(a, name, dv_.ptr)
    if len(strides) != 1:
        raise invalid("%s: %s must have the same shape and strides (one descale_stride)"
                      % (what, " and ".join(n for n, _ in given)))
    a.descale_stride[0], a.descale_stride[1] = strides.pop()


def _check_fp8_formats(call, qv):
    """A DLPack fp8 format (torch.float8_e4m3fn / float8_e5m2) must be the
    Config's: q_dtype for the view qv (None: no fp8 Q), kv_dtype for the
    others (e.g. a torch.float8_e5m2 cache with kv_dtype 'e4m3' is an error,
    not a reinterpretation)."""
    cfg = call.cfg
    for v in call.views:
        if v.fp8_format is None:
            continue
        if v is qv:
            if v.fp8_format != cfg.q_dtype:
                raise invalid("%s: q holds %s values (its DLPack dtype) but the Config's q_dtype "
                              "is %r" % (call.name, v.fp8_format, cfg.q_dtype))
        elif v.fp8_format != cfg.kv_dtype:
            raise invalid("%s: the KV cache holds %s values (its DLPack dtype) but the Config's "
                          "kv_dtype is %r" % (call.name, v.fp8_format, cfg.kv_dtype))


def _pack_tree_mask(mask, B, Sq):
    """A host [B or 1, Sq, Sq] (or [Sq, Sq]) bool/integer mask as int32 words
    [B or 1, Sq, ceil(Sq / 32)]: bit j % 32 of word j / 32 of row (b, i) is
    mask[b, i, j] != 0 (numpy.packbits(bitorder='little') bytes, rows padded
    to whole words)."""
    import numpy as np
    m = np.asarray(mask)
    if m.ndim == 2:
        m = m[None]
    if m.ndim != 3 or m.shape[0] not in (1, B) or m.shape[1:] != (Sq, Sq):
        raise invalid("decode: tree_mask: shape %r, expected [%d or 1, %d, %d] (batch, seqlen_q, "
                      "seqlen_q)" % (np.shape(mask), B, Sq, Sq))
    if not (m.dtype == np.bool_ or np.issubdtype(m.dtype, np.integer)):
        raise invalid("decode: tree_mask: a host mask must be bool or integer, got %s" % m.dtype)
    words = (Sq + 31) // 32
    packed = np.packbits(m != 0, axis=-1, bitorder="little")
    padded = np.zeros(m.shape[:2] + (words * 4,), np.uint8)
    padded[..., : packed.shape[-1]] = packed
    return padded.view("<i4")


def decode(runtime, config, q, k_cache, v_cache, cache_seqlens, *, num_splits=0, out=None,
           lse=None, block_table=None, batch_invariant=False, workspace=None, stream=None,
           tree_mask=None, sinks=None, alibi_slopes=None, k_descale=None, v_descale=None,
           k_new=None, v_new=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=False,
           rotary_positions=None, split_counters=None):
    """Flash-Decoding (fa_decode) with the combine; returns (O, LSE).

    q [batch, seqlen_q, num_heads_q, head_dim]; cache_seqlens int32 [batch]
    (NumPy, list or device): sequence b's valid keys, the queries being its
    last seqlen_q positions. The KV cache, one of (since 0.3 for the last
    two):
      contiguous: k_cache/v_cache [batch, seqlen_k_max, num_heads_kv,
        head_dim(_v)];
      paged: block_table int32 [batch, max_pages_per_seq] (rows contiguous)
        and k_cache/v_cache pages [num_pages, page_size, num_heads_kv,
        head_dim(_v)], any strides (HND pages as a transposed view); key j
        of sequence b is token j % page_size of page block_table[b, j //
        page_size]; seqlen_k_max = max_pages_per_seq * page_size;
      pointer array: k_cache and v_cache lists of `batch` tensors
        [seqlen_b, num_heads_kv, head_dim(_v)], 16-byte aligned, one stride
        set for all; seqlen_k_max = the longest.
    tree_mask (since 0.4; speculative decoding, tree attention among the
    seqlen_q new tokens): a NumPy bool/integer array [batch or 1, seqlen_q,
    seqlen_q] (or [seqlen_q, seqlen_q]: one tree for the batch), nonzero
    where query i sees new token j (key cache_seqlens[b] - seqlen_q + j);
    the binding packs it (numpy.packbits(bitorder='little'), rows padded to
    32-bit words). Or a device int32 tensor [batch or 1, seqlen_q, words]
    of packed words (bit j % 32 of word j / 32, words >= ceil(seqlen_q /
    32), last dim contiguous). The cached prefix stays visible; the config's
    causal and window still apply on top.
    sinks (since 0.4.1): gpt-oss attention sinks fp32 [num_heads_q], as in
    forward(); they join each row's denominator once, in the combine.
    alibi_slopes (since 0.5): ALiBi slopes fp32 [num_heads_q] or [batch,
    num_heads_q], as in forward(): new token i of sequence b, key j, bias
    -slope * |i + L - seqlen_q - j|, L = cache_seqlens[b] (+ seqlen_new with k_new).
    With a Config of kv_dtype 'e4m3' or 'e5m2' (since 0.5) the cache tensors
    hold the fp8 bytes (NumPy or torch uint8); a K element's
    value is fp8(byte) * k_descale (V's likewise): k_descale / v_descale
    fp32, a scalar (one value per tensor) or [batch, num_heads_kv] (any
    strides), or None = 1.
    k_new, v_new (since 0.5; as flash_attn_with_kvcache): new keys and
    values [batch, seqlen_new, num_heads_kv, head_dim(_v)], written into the
    cache at cache_seqlens[b] (then the length BEFORE the append; the cache
    needs room for them) and attended to in the same launch; the cache is
    updated in place (a NumPy cache must then be a writable C-contiguous
    array of the storage dtype: float16, uint16 bits for bf16, uint8 for
    an fp8 kv_dtype; the binding copies it back). Into an fp8 cache k_new
    and v_new stay dtype and the kernel writes fp8(float32(x) / descale)
    (K after RoPE; round to nearest even, saturating). rotary_cos/rotary_sin [seqlen_ro, rotary_dim /
    2] (fp32, or the config's dtype) rotate Q and the new keys first (RoPE;
    rotary_dim a multiple of 16, <= head_dim): GPT-NeoX pairs (i, i +
    rotary_dim / 2), or GPT-J pairs (2i, 2i + 1) with
    rotary_interleaved=True; new token t at position cache_seqlens[b] + t,
    queries likewise when causal or windowed (else at cache_seqlens[b]),
    or each token's position from rotary_positions int32 [batch, n >=
    max(seqlen_q, seqlen_new)]. The cache rows written are exactly the bits
    flashattn.h documents (fa_decode_args.rotary_dim).
    batch_invariant=True splits every sequence into chunks of
    FA_DECODE_INVARIANT_SPLIT (2048) keys, so its output bits do not depend
    on the rest of the batch (num_splits must be 0). The split-KV workspace
    is allocated by the binding (one grow-only buffer per stream, freed with
    the Runtime), unless `workspace` gives it: device memory of at least the
    bytes needed (a DeviceArray or a C-contiguous __cuda_array_interface__
    object, 256-byte aligned), or a callable that takes the byte count and
    returns such memory (e.g. lambda n: torch.empty(n, dtype=torch.uint8,
    device=q.device), so that the memory comes from the caller's allocator,
    as CUDA-graph capture needs). The caller keeps it alive until the
    launch has run on the stream.
    split_counters (since 0.8): the combine fused into the decode kernel
    (fa_decode_args.split_counters: one launch instead of two when the keys
    are split; the same bits). True: the binding's own int32 counters (one
    grow-only buffer per stream, zeroed once when allocated; every call
    leaves them zero). Or device memory of at least
    4 * batch * num_heads_kv * ceil(num_heads_q / num_heads_kv * seqlen_q /
    16) bytes that the caller zeroed once (as `workspace`, not a callable),
    not used by launches that may run at the same time. None: two launches.

    Host cache_seqlens are checked to lie in [0, seqlen_k_max], and then
    every block_table entry a sequence reads to lie in [0, num_pages) (host
    block tables) and every per-sequence tensor to hold its keys. Device
    cache_seqlens are trusted (not read: that would need a synchronisation);
    the kernel clamps each to [0, seqlen_k_max], so with a contiguous cache
    an out-of-range value never reads past the cache, it only changes which
    keys are attended to. Device block tables, and a paged or pointer-array
    cache with device cache_seqlens, are the caller's to get right, as in C
    (an out-of-range page or a short tensor is an out-of-bounds read).

    Errors: InvalidArgumentError for shapes, dtypes and the host checks
    above and for pages of page_size 0 (nothing runs), else the library's
    status (num_splits with batch_invariant, ...)."""
    cfg = config
    with _Call(runtime, cfg, "decode", stream) as call:
        dt = cfg.dtype
        H, Hk, D, Dv = cfg.num_heads_q, cfg.num_heads_kv, cfg.head_dim, cfg.head_dim_v
        qv = call.input(q, "q", dt, first=True)
        B, Sq, _, _ = _expect(qv, "decode: q", (None, None, H, D),
                              ("batch", "seqlen_q", "num_heads_q", "head_dim"))
        kvc = None
        if block_table is None and not _is_seq_list(k_cache) and not _is_seq_list(v_cache):
            kv = call.input(k_cache, "k_cache", cfg._kv_elem)
            vv = call.input(v_cache, "v_cache", cfg._kv_elem)
            _, Skmax, _, _ = _expect(kv, "decode: k_cache", (B, None, Hk, D),
                                     ("batch", "seqlen_k_max", "num_heads_kv", "head_dim"))
            _expect(vv, "decode: v_cache", (B, Skmax, Hk, Dv),
                    ("batch", "seqlen_k_max", "num_heads_kv", "head_dim_v"))
            kt, vt = _ft(kv), _ft(vv)
        else:
            kvc = _kv_cache(call, k_cache, v_cache, block_table, B, (Hk, D, Dv),
                            ("k_cache", "v_cache"))
            Skmax, kt, vt = kvc.capacity, kvc.k, kvc.v
        a = _lib.new(_lib.fa_decode_args)
        Sn = _append(call, a, B, Sq, (Hk, D, Dv), k_new, v_new, rotary_cos, rotary_sin,
                     rotary_interleaved, rotary_positions)
        csv = call.input(cache_seqlens, "cache_seqlens", "int32")
        _expect(csv, "decode: cache_seqlens", (B,), ("batch",))
        _need_contiguous(csv, "decode: cache_seqlens")
        if csv.host is not None:  # values on the device are the caller's to check
            counts = _lengths(csv, "decode", "cache_seqlens", Skmax - Sn,
                              "seqlen_k_max - seqlen_new" if Sn else "seqlen_k_max")
            if kvc is not None:
                _check_cache_lengths(kvc, "decode", [n + Sn for n in counts], "cache_seqlens",
                                     ("k_cache", "v_cache"))
        if Sn:
            caches = [k_cache, v_cache] if kvc is None or block_table is not None \
                else list(k_cache) + list(v_cache)
            _write_back(call, caches)
        ov, o_obj = call.output(out, "out", dt, (B, Sq, H, Dv), qv)
        lv, lse_obj = call.output(lse, "lse", "fp32", (B, H, Sq), qv)
        _need_contiguous(lv, "decode: lse")
        a.batch, a.seqlen_q = B, Sq
        a.seqlen_k_max = _int32(Skmax, "decode: seqlen_k_max")
        a.q, a.k_cache, a.v_cache, a.o = _ft(qv), kt, vt, _ft(ov)
        if kvc is not None:
            a.kv = kvc.layout
        a.batch_invariant = 1 if batch_invariant else 0
        a.cache_seqlens = csv.ptr
        a.num_splits = _int32(num_splits, "decode: num_splits")
        a.lse = lv.ptr
        if tree_mask is not None:
            tm = tree_mask
            if is_ndarray(tm) or isinstance(tm, (list, tuple)):
                tm = _pack_tree_mask(tm, B, Sq)
            tv = call.input(tm, "tree_mask", "int32")
            if len(tv.shape) != 3 or tv.shape[0] not in (1, B) or tv.shape[1] != Sq \
                    or tv.shape[2] < (Sq + 31) // 32 or tv.strides[2] != 1:
                raise invalid("decode: tree_mask: packed words of shape %r, strides %r; expected "
                              "[%d or 1, %d, >= %d] with the last dim contiguous"
                              % (tv.shape, tv.strides, B, Sq, (Sq + 31) // 32))
            a.tree_mask = tv.ptr
            a.tree_mask_stride[0] = 0 if tv.shape[0] == 1 else tv.strides[0] * 4
            a.tree_mask_stride[1] = tv.strides[1] * 4
        a.sinks = _sinks(call, sinks, cfg.num_heads_q, "decode")
        _descales(call, a, B, Hk, k_descale=k_descale, v_descale=v_descale)
        a.alibi_slopes, a.alibi_slopes_stride = _alibi(call, alibi_slopes, B, cfg.num_heads_q,
                                                       "decode")
        _check_fp8_formats(call, None)
        lib = _lib.lib()
        nbytes, splits = ctypes.c_size_t(), ctypes.c_int32()
        check(lib.fa_decode_workspace_size(call.h, call.ch, ctypes.byref(a),
                                           ctypes.byref(nbytes), ctypes.byref(splits)))
        if workspace is None:
            a.workspace, a.workspace_size = runtime._workspace(call.stream or 0, nbytes.value)
        else:
            ws = workspace(nbytes.value) if callable(workspace) else workspace
            a.workspace, a.workspace_size = _raw_device_memory(ws, "decode: workspace")
            if a.workspace_size < nbytes.value:
                raise invalid("decode: workspace holds %d bytes, %d are needed"
                              % (a.workspace_size, nbytes.value))
            if a.workspace % 256:
                raise invalid("decode: workspace at 0x%x is not 256-byte aligned" % a.workspace)
        if split_counters is True:
            need = 4 * B * Hk * ((H // Hk * Sq + 15) // 16)
            a.split_counters, a.split_counters_size = runtime._workspace(
                call.stream or 0, need, kind="counters")
        elif split_counters is not None and split_counters is not False:
            a.split_counters, a.split_counters_size = _raw_device_memory(
                split_counters, "decode: split_counters")
        call.launched = True
        check(lib.fa_decode(call.h, call.ch, ctypes.byref(a), call.launch_stream))
    return o_obj, lse_obj


def _append(call, a, B, Sq, dims, k_new, v_new, rotary_cos, rotary_sin, rotary_interleaved,
            rotary_positions):
    """Fills a's KV-append and rotary fields (decode's k_new ... arguments);
    returns seqlen_new (0 without k_new)."""
    Hk, D, Dv = dims
    dt = call.cfg.dtype
    rotary = rotary_cos is not None or rotary_sin is not None
    if k_new is None:
        if v_new is not None or rotary or rotary_positions is not None or rotary_interleaved:
            raise invalid("decode: v_new and the rotary arguments need k_new (the rotary "
                          "embedding rides on the KV append, as flash_attn_with_kvcache)")
        return 0
    if v_new is None:
        raise invalid("decode: k_new needs v_new")
    kn = call.input(k_new, "k_new", dt)
    vn = call.input(v_new, "v_new", dt)
    _, Sn, _, _ = _expect(kn, "decode: k_new", (B, None, Hk, D),
                          ("batch", "seqlen_new", "num_heads_kv", "head_dim"))
    _expect(vn, "decode: v_new", (B, Sn, Hk, Dv),
            ("batch", "seqlen_new", "num_heads_kv", "head_dim_v"))
    a.k_new, a.v_new = _ft(kn), _ft(vn)
    a.seqlen_new = _int32(Sn, "decode: seqlen_new")
    if not rotary:
        if rotary_positions is not None or rotary_interleaved:
            raise invalid("decode: rotary_positions and rotary_interleaved need rotary_cos")
        return Sn
    if rotary_cos is None or rotary_sin is None:
        raise invalid("decode: rotary_cos and rotary_sin go together")
    # The table's type: fp32, or the config's (NumPy float16 / uint16 bits).
    rdt = "fp32"
    src = rotary_cos
    if is_ndarray(src):
        if str(src.dtype) != "float32" and str(src.dtype) != "float64":
            rdt = dt
    else:
        probe = resolve(src, "decode: rotary_cos", stream=call.stream)
        if probe.dtype not in (None, "fp32"):
            rdt = probe.dtype
        probe.release()
    cv = call.input(rotary_cos, "rotary_cos", rdt)
    sv = call.input(rotary_sin, "rotary_sin", rdt)
    R, half = _expect(cv, "decode: rotary_cos", (None, None), ("seqlen_ro", "rotary_dim / 2"))
    _expect(sv, "decode: rotary_sin", (R, half), ("seqlen_ro", "rotary_dim / 2"))
    _need_contiguous(cv, "decode: rotary_cos")
    _need_contiguous(sv, "decode: rotary_sin")
    a.rotary_dim = _int32(2 * half, "decode: rotary_dim")
    a.rotary_cos, a.rotary_sin = cv.ptr, sv.ptr
    a.seqlen_ro = _int32(R, "decode: seqlen_ro")
    a.rotary_interleaved = 1 if rotary_interleaved else 0
    a.rotary_dtype = {"fp32": _lib.DTYPE_FP32, "fp16": _lib.DTYPE_FP16,
                      "bf16": _lib.DTYPE_BF16}[rdt]
    if rotary_positions is not None:
        pv = call.input(rotary_positions, "rotary_positions", "int32")
        _, n = _expect(pv, "decode: rotary_positions", (B, None), ("batch", "n"))
        if n < max(Sq, Sn) or (n > 1 and pv.strides[1] != 1):
            raise invalid("decode: rotary_positions: shape %r, strides %r; expected [%d, n >= %d] "
                          "with rows contiguous" % (pv.shape, pv.strides, B, max(Sq, Sn)))
        a.rotary_positions = pv.ptr
        a.rotary_positions_stride = pv.strides[0] if B > 1 else n
    return Sn


def _write_back(call, caches):
    """With the KV append the kernel writes the cache: a host (NumPy) cache
    staged for the call is copied back into the caller's array afterwards,
    which must therefore be that very array (writable, C-contiguous, of the
    storage dtype)."""
    for obj in caches:
        for v in call.views:
            if v.source is obj and v.host is not None:
                if v.host is not obj or not obj.flags.writeable:
                    raise invalid("decode: with k_new a NumPy KV cache is updated in place: it "
                                  "must be a writable C-contiguous array of the storage dtype "
                                  "(float16, uint16 bits for bf16, uint8 for fp8), got %s" % obj.dtype)
                call.copy_back.append((v.ptr, obj))
                break


_LSE_FORMATS = {"natural": _lib.LSE_NATURAL, "base2": _lib.LSE_BASE2}


def _lse_format(value, name):
    """fa_lse_format of 'natural' | 'base2' (or the C value 0 | 1)."""
    if isinstance(value, str) and value in _LSE_FORMATS:
        return _LSE_FORMATS[value]
    if isinstance(value, int) and not isinstance(value, bool) and value in _LSE_FORMATS.values():
        return value
    raise invalid("decode_reduce: %s must be 'natural' or 'base2', got %r" % (name, value))


def decode_reduce(runtime, config, o_partial, lse_partial, *, out=None, lse=None, stream=None,
                  lse_partial_format="natural", lse_format="natural", sinks=None):
    """Combines partial states (fa_decode_reduce); returns (O, LSE).

    o_partial fp32 [num_splits, batch, seqlen_q, num_heads_q, head_dim_v],
    lse_partial fp32 [num_splits, batch, num_heads_q, seqlen_q], any
    strides (o_partial's last one 1). lse_partial_format / lse_format
    (since 0.4): 'natural' (ln, flashattn's and FlashAttention's) or 'base2'
    (log2, FlashInfer's: lse2 = lse * log2(e)) for the partial LSEs read and
    the LSE written. sinks (since 0.4.1): gpt-oss attention sinks fp32
    [num_heads_q] (natural logs, as in forward()), one more state per row
    with O = 0: each row's sink joins the denominator once."""
    cfg = config
    in_fmt = _lse_format(lse_partial_format, "lse_partial_format")
    out_fmt = _lse_format(lse_format, "lse_format")
    with _Call(runtime, cfg, "decode_reduce", stream) as call:
        H, Dv = cfg.num_heads_q, cfg.head_dim_v
        opv = call.input(o_partial, "o_partial", "fp32", first=True)
        lpv = call.input(lse_partial, "lse_partial", "fp32")
        S, B, Sq, _, _ = _expect(opv, "decode_reduce: o_partial", (None, None, None, H, Dv),
                                 ("num_splits", "batch", "seqlen_q", "num_heads_q", "head_dim_v"))
        _expect(lpv, "decode_reduce: lse_partial", (S, B, H, Sq),
                ("num_splits", "batch", "num_heads_q", "seqlen_q"))
        ov, o_obj = call.output(out, "out", cfg.dtype, (B, Sq, H, Dv), opv)
        lv, lse_obj = call.output(lse, "lse", "fp32", (B, H, Sq), opv)
        _need_contiguous(lv, "decode_reduce: lse")
        a = _lib.new(_lib.fa_reduce_args)
        a.num_splits, a.batch, a.seqlen_q = S, B, Sq
        a.o_partial = opv.ptr
        for i, s in enumerate(opv.strides):
            a.o_partial_stride[i] = s
        a.lse_partial = lpv.ptr
        for i, s in enumerate(lpv.strides):
            a.lse_partial_stride[i] = s
        a.o = _ft(ov)
        a.lse = lv.ptr
        a.lse_partial_format, a.lse_format = in_fmt, out_fmt
        a.sinks = _sinks(call, sinks, H, "decode_reduce")
        call.launched = True
        check(_lib.lib().fa_decode_reduce(call.h, call.ch, ctypes.byref(a),
                                          call.launch_stream))
    return o_obj, lse_obj


launch = forward

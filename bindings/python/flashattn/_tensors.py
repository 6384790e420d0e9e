"""Turns caller tensors into (pointer, shape, element strides, dtype) views.

Accepted inputs, tried in this order:
  1. flashattn.Tensor (from as_tensor(obj, dtype=...)): obj with a dtype override.
  2. flashattn.DeviceArray: memory from Runtime.empty / Runtime.upload.
  3. numpy.ndarray: a host array; the caller stages it in fa_malloc'd memory.
  4. __cuda_array_interface__ (v0..v3): data pointer, shape, byte strides
     (None = C-contiguous) divided by the item size; typestr '<f2' = fp16,
     '<f4' = fp32, '<i4' = int32; a 2-byte integer typestr ('<u2', '<i2')
     is bf16 bits only with dtype='bf16'. A 'stream' entry (v3) is
     remembered: the launch runs on it unless stream= is given.
  5. DLPack (__dlpack__ / __dlpack_device__): kDLCUDA and kDLCUDAManaged
     tensors are used in place (the producer is asked to order its work
     before the launch stream); kDLCPU tensors go through numpy.from_dlpack
     and are staged like numpy arrays. The capsule is consumed as the
     protocol asks: renamed "used_dltensor", and its deleter called once the
     call no longer needs the memory.
"""

import array
import ctypes
import sys

from ._errors import invalid

# "fp8": the bytes of an fp8 KV cache or Q (e4m3 or e5m2 as the Config says),
# uint8 on the host.
ITEMSIZE = {"fp16": 2, "bf16": 2, "fp32": 4, "int32": 4, "fp8": 1}
_TYPESTR = {"f2": "fp16", "f4": "fp32", "i4": "int32", "u1": "fp8"}
_TWO_BYTE_INT = ("u2", "i2", "V2")


class Tensor:
    """Wraps a tensor-like object with an explicit element type. Use it for
    bf16 data whose exporter cannot say bf16 (a __cuda_array_interface__
    with typestr '<u2'/'<i2', or a NumPy uint16 array of bf16 bit patterns)."""

    __slots__ = ("obj", "dtype")

    def __init__(self, obj, dtype=None):
        if dtype is not None and dtype not in ITEMSIZE:
            raise invalid("as_tensor: dtype must be one of %s, got %r"
                          % (sorted(ITEMSIZE), dtype))
        self.obj = obj
        self.dtype = dtype


def as_tensor(obj, dtype=None):
    return Tensor(obj, dtype)


class View:
    """A resolved argument: device pointer, shape, element strides, dtype.
    host is a NumPy array still to be staged (ptr 0 until then)."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "stream", "host", "source", "_release",
                 "fp8_format")

    def __init__(self, ptr, shape, strides, dtype, stream=None, host=None, source=None):
        self.ptr = int(ptr)
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self.dtype = dtype
        self.stream = stream
        self.host = host
        self.source = source
        self._release = None
        self.fp8_format = None  # 'e4m3' / 'e5m2' when the producer's dtype says which

    def release(self):
        if self._release is not None:
            rel, self._release = self._release, None
            rel()

    def is_contiguous(self):
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True


def contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= int(n)
    return tuple(reversed(strides))


def _numpy():
    return sys.modules.get("numpy")


def _numpy_or_none():
    """NumPy, imported if it is installed, else None (the stdlib-only wheel)."""
    np = _numpy()
    if np is None:
        try:
            import numpy as np
        except ImportError:
            return None
    return np


class HostList:
    """A nested list or tuple of numbers as a C-order host array, for callers
    without NumPy (the stdlib-only wheel): what a list argument becomes when
    NumPy cannot be imported. Holds int32 or fp32 values in an array.array
    (the buffer staged into fa_malloc'd memory); the checks read tolist()."""

    __slots__ = ("shape", "values", "data")

    _CODES = {"int32": "i", "fp32": "f"}

    def __init__(self, obj, what):
        shape, x = [], obj
        while isinstance(x, (list, tuple)):  # the shape, along the first elements
            shape.append(len(x))
            x = x[0] if x else None
        flat = []

        def walk(x, depth):
            if depth < len(shape):
                if not isinstance(x, (list, tuple)) or len(x) != shape[depth]:
                    raise invalid("%s: a ragged nested list (shape %r)" % (what, tuple(shape)))
                for e in x:
                    walk(e, depth + 1)
            elif isinstance(x, bool) or not isinstance(x, (int, float)):
                raise invalid("%s: list elements must be ints or floats, got %s"
                              % (what, type(x).__name__))
            else:
                flat.append(x)

        walk(obj, 0)
        self.shape = tuple(shape)
        self.values = flat
        self.data = None

    @property
    def nbytes(self):
        return 0 if self.data is None else len(self.data) * self.data.itemsize

    def tolist(self):
        def nest(flat, dims):
            if not dims:
                return flat[0]
            step = len(flat) // dims[0] if dims[0] else 0
            return [nest(flat[i * step:(i + 1) * step], dims[1:]) for i in range(dims[0])]
        return nest(self.values, self.shape) if self.shape else self.values[0]

    def storage(self, dtype, what):
        """Itself, its values converted to dtype's C type in self.data."""
        code = self._CODES.get(dtype)
        if code is None:
            raise invalid("%s: a list of %s values needs NumPy (not installed): pass a NumPy "
                          "array, a DeviceArray or a device tensor" % (what, dtype))
        if code == "i":
            if any(isinstance(x, float) for x in self.values):
                raise invalid("%s: must be integers, got a float in the list" % what)
            if any(not -2**31 <= x < 2**31 for x in self.values):
                raise invalid("%s: values do not fit int32" % what)
        self.data = array.array(code, self.values)
        return self


def is_ndarray(obj):
    np = _numpy()
    return np is not None and isinstance(obj, np.ndarray)


def _torch_dtype(obj):
    """'bf16'/'fp16'/... for a torch tensor, without importing torch."""
    dt = getattr(obj, "dtype", None)
    if dt is None or type(dt).__module__ != "torch":
        return None
    return {"torch.float16": "fp16", "torch.bfloat16": "bf16",
            "torch.float32": "fp32", "torch.int32": "int32", "torch.uint8": "fp8",
            "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8"}.get(str(dt))


# ---- host (NumPy) conversion ------------------------------------------------

def float32_to_bf16_bits(a):
    """Rounds float values to bf16 (round to nearest even) and returns the
    uint16 bit patterns. NaN stays a quiet NaN."""
    np = _numpy()
    f = np.ascontiguousarray(a, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_bits_to_float32(bits):
    """uint16 bf16 bit patterns -> float32 values (exact)."""
    np = _numpy()
    b = np.ascontiguousarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def host_storage(arr, dtype, what):
    """A C-contiguous NumPy array holding arr in flashattn's storage type:
    fp16 -> float16 (floats are cast), bf16 -> uint16 bit patterns (uint16
    taken as bits, floats rounded), fp32 -> float32, int32 -> int32."""
    if isinstance(arr, HostList):
        return arr.storage(dtype, what)
    np = _numpy()
    kind = arr.dtype.kind
    if dtype == "fp16":
        if kind != "f":
            raise invalid("%s: a NumPy array for fp16 must be floating, got %s" % (what, arr.dtype))
        return np.ascontiguousarray(arr, dtype=np.float16)
    if dtype == "bf16":
        if arr.dtype == np.uint16:
            return np.ascontiguousarray(arr)
        if kind != "f":
            raise invalid("%s: a NumPy array for bf16 must be uint16 bit patterns or "
                          "floating, got %s" % (what, arr.dtype))
        return float32_to_bf16_bits(arr)
    if dtype == "fp32":
        if kind != "f":
            raise invalid("%s: must be floating for fp32, got %s" % (what, arr.dtype))
        return np.ascontiguousarray(arr, dtype=np.float32)
    if dtype == "fp8":
        if arr.dtype != np.uint8:
            raise invalid("%s: a NumPy array of fp8 values (an fp8 kv_dtype / q_dtype) must be "
                          "uint8 (the fp8 bytes), got %s" % (what, arr.dtype))
        return np.ascontiguousarray(arr)
    if dtype == "int32":
        if kind not in "iu":
            raise invalid("%s: must be an integer array, got %s" % (what, arr.dtype))
        if arr.size and (arr.min() < -2**31 or arr.max() >= 2**31):
            raise invalid("%s: values do not fit int32" % what)
        return np.ascontiguousarray(arr, dtype=np.int32)
    raise AssertionError(dtype)


def host_dtype(dtype):
    np = _numpy()
    return {"fp16": np.float16, "bf16": np.uint16, "fp32": np.float32,
            "int32": np.int32, "fp8": np.uint8}[dtype]


# ---- __cuda_array_interface__ ------------------------------------------------

def _from_cai(obj, cai, override, what):
    if cai.get("mask") is not None:
        raise invalid("%s: masked __cuda_array_interface__ arrays are not supported" % what)
    typestr = cai["typestr"]
    if typestr[0] == ">":
        raise invalid("%s: big-endian typestr %r" % (what, typestr))
    code = typestr[1:]
    natural = _TYPESTR.get(code)
    torch_dt = _torch_dtype(obj)
    dtype = override or torch_dt or natural
    if dtype is None:
        if code in _TWO_BYTE_INT:
            raise invalid("%s: typestr %r: pass as_tensor(x, dtype='bf16') for bf16 bit "
                          "patterns" % (what, typestr))
        raise invalid("%s: unsupported typestr %r" % (what, typestr))
    itemsize = int(code[1:]) if code[1:].isdigit() else 0
    if itemsize != ITEMSIZE[dtype]:
        raise invalid("%s: typestr %r does not hold %s elements" % (what, typestr, dtype))
    if natural is not None and natural != dtype and not (
            natural == "fp16" and dtype == "bf16" and override):
        raise invalid("%s: typestr %r is %s, not %s" % (what, typestr, natural, dtype))
    shape = tuple(cai["shape"])
    bstrides = cai.get("strides")
    if bstrides is None:
        strides = contiguous_strides(shape)
    else:
        if any(s % itemsize for s in bstrides):
            raise invalid("%s: byte strides %r are not multiples of the item size %d"
                          % (what, tuple(bstrides), itemsize))
        strides = tuple(s // itemsize for s in bstrides)
    ptr = cai["data"][0] or 0
    stream = cai.get("stream") if cai.get("version", 0) >= 3 else None
    if stream == 0:
        stream = None  # forbidden by the protocol; treat as "no stream"
    return View(ptr, shape, strides, dtype, stream=stream, source=obj)


# ---- DLPack -----------------------------------------------------------------

kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DLDeleter),
]

_DLTENSOR = b"dltensor"
_USED_DLTENSOR = b"used_dltensor"  # module lifetime: the capsule keeps this pointer

_capi = ctypes.pythonapi
_capi.PyCapsule_IsValid.restype = ctypes.c_int
_capi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_SetName.restype = ctypes.c_int
_capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

# (code, bits) -> dtype; DLPack 1.x codes 10 (kDLFloat8_e4m3fn, torch.float8_e4m3fn)
# and 12 (kDLFloat8_e5m2) are fp8 caches of a known format, uint8 of either.
_DL_FP8_FORMATS = {10: "e4m3", 12: "e5m2"}
_DL_DTYPES = {(2, 16): "fp16", (4, 16): "bf16", (2, 32): "fp32", (0, 32): "int32", (1, 8): "fp8",
              (10, 8): "fp8", (12, 8): "fp8"}


def _from_dlpack(obj, override, what, stream):
    dev_type, _ = obj.__dlpack_device__()
    dev_type = int(dev_type)
    if dev_type == kDLCPU:
        np = _numpy()
        if np is None:
            import numpy as np  # noqa: F811 (only needed for host DLPack tensors)
        return None, np.from_dlpack(obj)
    if dev_type not in (kDLCUDA, kDLCUDAManaged):
        raise invalid("%s: DLPack device type %d is not CUDA" % (what, dev_type))
    # The producer orders its pending work before `stream` (legacy default = 1).
    capsule = obj.__dlpack__(stream=stream if stream else 1)
    if not _capi.PyCapsule_IsValid(capsule, _DLTENSOR):
        raise invalid("%s: __dlpack__ did not return an unused 'dltensor' capsule" % what)
    addr = _capi.PyCapsule_GetPointer(capsule, _DLTENSOR)
    managed = ctypes.cast(addr, ctypes.POINTER(_DLManagedTensor))
    # Consume it: the capsule's destructor must no longer free the tensor;
    # we call the deleter when done (View.release).
    _capi.PyCapsule_SetName(capsule, _USED_DLTENSOR)

    def release():
        deleter = managed.contents.deleter
        if deleter:
            deleter(managed)

    try:
        t = managed.contents.dl_tensor
        if t.dtype.lanes != 1:
            raise invalid("%s: DLPack vector dtypes (lanes %d) are not supported"
                          % (what, t.dtype.lanes))
        key = (t.dtype.code, t.dtype.bits)
        natural = _DL_DTYPES.get(key)
        dtype = override or natural
        if dtype is None:
            raise invalid("%s: unsupported DLPack dtype code %d bits %d" % ((what,) + key))
        if natural is not None and natural != dtype:
            raise invalid("%s: DLPack dtype is %s, not %s" % (what, natural, dtype))
        if t.dtype.bits != 8 * ITEMSIZE[dtype]:
            raise invalid("%s: DLPack dtype has %d bits, %s needs %d"
                          % (what, t.dtype.bits, dtype, 8 * ITEMSIZE[dtype]))
        shape = tuple(t.shape[i] for i in range(t.ndim))
        if t.strides:
            strides = tuple(t.strides[i] for i in range(t.ndim))
        else:
            strides = contiguous_strides(shape)  # NULL strides = row-major compact
        ptr = (t.data or 0) + t.byte_offset
        view = View(ptr, shape, strides, dtype, source=obj)
        view.fp8_format = _DL_FP8_FORMATS.get(t.dtype.code)
    except BaseException:
        release()
        raise
    view._release = release
    return view, None


def resolve(obj, what, dtype=None, stream=None):
    """Resolves one argument into a View (see the module docstring).
    `stream` is the launch stream given by the caller (int) for DLPack."""
    from ._api import DeviceArray

    if isinstance(obj, Tensor):
        obj, dtype = obj.obj, obj.dtype or dtype
        override = dtype
    else:
        override = None
    if isinstance(obj, DeviceArray):
        obj._check_live()
        if override and override != obj.dtype and not (
                {override, obj.dtype} <= {"fp16", "bf16"}):
            raise invalid("%s: DeviceArray holds %s, not %s" % (what, obj.dtype, override))
        return View(obj.ptr, obj.shape, contiguous_strides(obj.shape), override or obj.dtype,
                    source=obj)
    if is_ndarray(obj):
        return View(0, obj.shape, contiguous_strides(obj.shape), override, host=obj, source=obj)
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        cai = None
    except (TypeError, KeyError):
        cai = None  # e.g. torch bf16 tensors have no typestr: use DLPack
    if cai is not None:
        return _from_cai(obj, cai, override, what)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        view, host = _from_dlpack(obj, override, what, stream)
        if view is not None:
            return view
        return View(0, host.shape, contiguous_strides(host.shape), override, host=host,
                    source=obj)
    if isinstance(obj, (list, tuple)):
        np = _numpy_or_none()
        arr = HostList(obj, what) if np is None else np.asarray(obj)
        return View(0, arr.shape, contiguous_strides(arr.shape), override, host=arr, source=obj)
    raise invalid("%s: expected a NumPy array, an object with __cuda_array_interface__ or "
                  "__dlpack__, or a flashattn.DeviceArray; got %s" % (what, type(obj).__name__))

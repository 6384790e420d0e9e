"""The one place that loads libflashattn and declares its C functions.

Every C struct of include/flashattn.h is mirrored as a ctypes.Structure with
the same field order; struct_size is always filled from ctypes.sizeof, and
tests/test_abi.py checks each size and field offset against the C compiler.
"""

import ctypes
import ctypes.util
import os
import threading

c_size_t = ctypes.c_size_t
c_int32 = ctypes.c_int32
c_uint32 = ctypes.c_uint32
c_int64 = ctypes.c_int64
c_uint64 = ctypes.c_uint64
c_float = ctypes.c_float
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
c_int = ctypes.c_int  # C enums (fa_status, fa_dtype, ...) have int size

ABI_MAJOR = 0  # FLASHATTN_VERSION_MAJOR this binding was written against

# fa_status
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_COMPILE = 7
STATUS_NAMES = {
    0: "FA_SUCCESS",
    1: "FA_ERROR_INVALID_ARGUMENT",
    2: "FA_ERROR_UNSUPPORTED",
    3: "FA_ERROR_OUT_OF_MEMORY",
    4: "FA_ERROR_NO_DRIVER",
    5: "FA_ERROR_NO_DEVICE",
    6: "FA_ERROR_CUDA",
    7: "FA_ERROR_COMPILE",
    8: "FA_ERROR_LAUNCH",
    9: "FA_ERROR_RUNTIME_POISONED",
    10: "FA_ERROR_BUFFER_TOO_SMALL",
    11: "FA_ERROR_INTERNAL",
    12: "FA_ERROR_CACHE",
}

DTYPE_FP16, DTYPE_BF16, DTYPE_FP32 = 1, 2, 3
DTYPE_FP8_E4M3, DTYPE_FP8_E5M2 = 4, 5  # since 0.5: fa_config_desc.kv_dtype
BACKEND_AUTO, BACKEND_CUDA, BACKEND_EMULATOR = 0, 1, 2
KERNEL_FORWARD, KERNEL_DECODE, KERNEL_REDUCE = 0, 1, 2
KERNEL_BACKWARD_PRE, KERNEL_BACKWARD, KERNEL_BACKWARD_POST = 3, 4, 5  # fa_backward's (0.9)
CACHE_DEFAULT, CACHE_DISK, CACHE_MEMORY = 0, 1, 2
KV_CONTIGUOUS, KV_PAGED, KV_PTR_ARRAY = 0, 1, 2  # fa_kv_layout (0.3)
LSE_NATURAL, LSE_BASE2 = 0, 1  # fa_lse_format (0.4)
PTX_COMPILER_AUTO, PTX_COMPILER_OFF = 0, 1  # fa_ptx_compiler (0.6)
COMPILER_NONE, COMPILER_DRIVER_JIT, COMPILER_PLUGIN = 0, 1, 2  # fa_compiler_mode (0.6)
DECODE_INVARIANT_SPLIT = 2048  # FA_DECODE_INVARIANT_SPLIT: keys per split, batch_invariant


class fa_runtime_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int),
        ("device", c_int32),
        ("cache_mode", c_int),
        ("cache_dir", c_char_p),
        ("emulator_sm", c_int32),
        ("ptx_compiler", c_int64),  # since 0.6: fa_ptx_compiler
        ("kernel_store", ctypes.c_void_p),  # since 0.7: NULL ($FLASHATTN_KERNEL_STORE)
    ]


class fa_runtime_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int),
        ("sm", c_int32),
        ("num_sms", c_int32),
        ("driver_version", c_int32),
        ("device_name", ctypes.c_char * 128),
    ]


class fa_config_desc(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("dtype", c_int),
        ("head_dim", c_int32),
        ("head_dim_v", c_int32),
        ("num_heads_q", c_int32),
        ("num_heads_kv", c_int32),
        ("causal", c_int32),
        ("window_left", c_int32),
        ("window_right", c_int32),
        ("softmax_scale", c_float),
        ("softcap", c_float),
        ("kv_dtype", c_int64),  # since 0.5
        ("q_dtype", c_int64),  # since 0.6
    ]


class fa_tensor(ctypes.Structure):
    _fields_ = [("data", c_uint64), ("stride", c_int64 * 4)]


class fa_kv_cache_layout(ctypes.Structure):
    _fields_ = [
        ("layout", c_int32),
        ("page_size", c_int32),
        ("num_pages", c_int32),
        ("max_pages_per_seq", c_int32),
        ("block_table", c_uint64),
        ("block_table_stride", c_int64),
        ("k_ptrs", c_uint64),
        ("v_ptrs", c_uint64),
    ]


class fa_generate_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("kv_layout", c_int32),
        ("page_size", c_int32),
        ("varlen", c_int32),
        ("seqused_k", c_int32),
        ("tree_mask", c_int32),  # since 0.4
        ("lse_partial_format", c_int32),
        ("lse_format", c_int32),
        ("sinks", c_int64),  # since 0.4.1
        ("alibi", c_int32),  # since 0.5
        ("append_kv", c_int32),  # since 0.5
        ("rotary", c_int32),
        ("rotary_dtype", c_int32),
        ("v_in_k", c_int32),  # since 0.5.1
    ]


class fa_forward_args(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("batch", c_int32),
        ("seqlen_q", c_int32),
        ("seqlen_k", c_int32),
        ("q", fa_tensor),
        ("k", fa_tensor),
        ("v", fa_tensor),
        ("o", fa_tensor),
        ("lse", c_uint64),
        ("cu_seqlens_q", c_uint64),
        ("cu_seqlens_k", c_uint64),
        ("kv", fa_kv_cache_layout),  # since 0.3
        ("seqused_k", c_uint64),
        ("sinks", c_uint64),  # since 0.4.1
        ("alibi_slopes", c_uint64),  # since 0.5
        ("alibi_slopes_stride", c_int64),
        ("k_descale", c_uint64),  # since 0.5
        ("v_descale", c_uint64),
        ("descale_stride", c_int64 * 2),
        ("q_descale", c_uint64),  # since 0.6
        ("workspace", c_uint64),  # since 0.8: 0 (the persistent forward's work counter)
        ("workspace_size", c_size_t),
    ]


class fa_backward_args(ctypes.Structure):  # since 0.9
    _fields_ = [
        ("struct_size", c_size_t),
        ("fwd", fa_forward_args),  # the forward's arguments, with o and lse
        ("dout", fa_tensor),
        ("dq", fa_tensor),
        ("dk", fa_tensor),
        ("dv", fa_tensor),
        ("dsinks", c_uint64),
        ("workspace", c_uint64),
        ("workspace_size", c_size_t),
        ("deterministic", c_int32),
    ]


class fa_decode_args(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("batch", c_int32),
        ("seqlen_q", c_int32),
        ("seqlen_k_max", c_int32),
        ("q", fa_tensor),
        ("k_cache", fa_tensor),
        ("v_cache", fa_tensor),
        ("cache_seqlens", c_uint64),
        ("num_splits", c_int32),
        ("workspace", c_uint64),
        ("workspace_size", c_size_t),
        ("o", fa_tensor),
        ("lse", c_uint64),
        ("kv", fa_kv_cache_layout),  # since 0.3
        ("batch_invariant", c_int32),
        ("tree_mask", c_uint64),  # since 0.4
        ("tree_mask_stride", c_int64 * 2),
        ("sinks", c_uint64),  # since 0.4.1
        ("alibi_slopes", c_uint64),  # since 0.5
        ("alibi_slopes_stride", c_int64),
        ("k_descale", c_uint64),  # since 0.5
        ("v_descale", c_uint64),
        ("descale_stride", c_int64 * 2),
        ("k_new", fa_tensor),  # since 0.5
        ("v_new", fa_tensor),
        ("seqlen_new", c_int32),
        ("rotary_dim", c_int32),
        ("rotary_cos", c_uint64),
        ("rotary_sin", c_uint64),
        ("seqlen_ro", c_int32),
        ("rotary_interleaved", c_int32),
        ("rotary_dtype", c_int32),
        ("rotary_reserved", c_int32),
        ("rotary_positions", c_uint64),
        ("rotary_positions_stride", c_int64),
        # Since 0.8
        ("split_counters", c_uint64),
        ("split_counters_size", c_size_t),
    ]


class fa_reduce_args(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("num_splits", c_int32),
        ("batch", c_int32),
        ("seqlen_q", c_int32),
        ("o_partial", c_uint64),
        ("o_partial_stride", c_int64 * 5),
        ("lse_partial", c_uint64),
        ("lse_partial_stride", c_int64 * 4),
        ("o", fa_tensor),
        ("lse", c_uint64),
        ("lse_partial_format", c_int32),  # since 0.4
        ("lse_format", c_int32),
        ("sinks", c_uint64),  # since 0.4.1
    ]


class fa_cache_stats(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("memory_hits", c_uint64),
        ("disk_hits", c_uint64),
        ("misses", c_uint64),
        ("compiles", c_uint64),
        ("discarded", c_uint64),
        ("entries", c_uint64),
        ("bytes", c_uint64),
        ("persistent", c_int32),
        ("path", ctypes.c_char * 512),
        ("note", ctypes.c_char * 256),
        ("collisions", c_uint64),
        ("evicted", c_uint64),
        ("resets", c_uint64),
        ("leases", c_uint64),
        ("leases_reclaimed", c_uint64),
        ("lease_waits", c_uint64),
        ("lease_timeouts", c_uint64),
        ("max_bytes", c_uint64),
        ("compiler_mode", c_int32),  # since 0.6: fa_compiler_mode
        ("compiler", ctypes.c_char * 128),
        ("compiler_note", ctypes.c_char * 256),
        ("cubin_refusals", c_uint64),
        ("remote_hits", c_uint64),  # since 0.7: the kernel store tier
        ("remote_misses", c_uint64),
        ("remote_puts", c_uint64),
        ("remote_errors", c_uint64),
        ("remote_discarded", c_uint64),
        ("kernel_store", ctypes.c_char * 128),
        ("kernel_store_note", ctypes.c_char * 256),
    ]


class fa_cache_entry(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("key", ctypes.c_char * 33),
        ("spec", c_char_p),
        ("sm", c_int32),
        ("generator_version", c_uint32),
        ("ptx_bytes", c_uint64),
        ("cubin_bytes", c_uint64),
        ("hits", c_uint64),
        ("created", c_int64),
        ("last_used", c_int64),
        ("compiler", c_char_p),  # since 0.6
    ]


class fa_cache_warm_progress(ctypes.Structure):  # since 0.7
    _fields_ = [
        ("struct_size", c_size_t),
        ("total", c_uint64),
        ("done", c_uint64),
        ("built", c_uint64),
        ("present", c_uint64),
        ("failed", c_uint64),
        ("skipped", c_uint64),
        ("bytes", c_uint64),
        ("seconds", ctypes.c_double),
        ("spec", c_char_p),
        ("sm", c_int32),
        ("compiler", ctypes.c_char * 128),
    ]


fa_cache_warm_progress_fn = ctypes.CFUNCTYPE(None, ctypes.POINTER(fa_cache_warm_progress),
                                             c_void_p)


class fa_cache_warm_options(ctypes.Structure):  # since 0.7
    _fields_ = [
        ("struct_size", c_size_t),
        ("cache_dir", c_char_p),
        ("sms", ctypes.POINTER(c_int32)),
        ("num_sms", c_int32),
        ("jobs", c_int32),
        ("presets", c_char_p),
        ("specs", c_char_p),
        ("ptx_compiler", c_int64),  # fa_ptx_compiler
        ("progress", fa_cache_warm_progress_fn),
        ("user", c_void_p),
    ]


STRUCTS = (
    fa_runtime_options,
    fa_runtime_info,
    fa_config_desc,
    fa_tensor,
    fa_kv_cache_layout,
    fa_generate_options,
    fa_forward_args,
    fa_backward_args,
    fa_decode_args,
    fa_reduce_args,
    fa_cache_stats,
    fa_cache_entry,
    fa_cache_warm_progress,
    fa_cache_warm_options,
)


def new(struct_type):
    """A zeroed instance of a struct_size-led struct with struct_size set."""
    s = struct_type()
    s.struct_size = ctypes.sizeof(struct_type)
    return s


fa_cache_entry_fn = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(fa_cache_entry), c_void_p)

_P = ctypes.POINTER
_lock = threading.Lock()
_lib = None
_lib_path = None


def _declare(lib):
    """Declares argtypes/restype of every C function the binding calls."""

    def fn(name, restype, *argtypes):
        f = getattr(lib, name)
        f.restype = restype
        f.argtypes = list(argtypes)

    fn("fa_status_string", c_char_p, c_int)
    fn("fa_last_error", c_char_p)
    fn("fa_version_number", c_uint32)
    fn("fa_version_string", c_char_p)
    fn("fa_runtime_create", c_int, _P(fa_runtime_options), _P(c_void_p))
    fn("fa_runtime_destroy", None, c_void_p)
    fn("fa_runtime_get_info", c_int, c_void_p, _P(fa_runtime_info))
    fn("fa_malloc", c_int, c_void_p, c_size_t, _P(c_uint64))
    fn("fa_free", c_int, c_void_p, c_uint64)
    fn("fa_memcpy_htod", c_int, c_void_p, c_uint64, c_void_p, c_size_t)
    fn("fa_memcpy_dtoh", c_int, c_void_p, c_void_p, c_uint64, c_size_t)
    fn("fa_memset", c_int, c_void_p, c_uint64, ctypes.c_uint8, c_size_t)
    fn("fa_synchronize", c_int, c_void_p, c_void_p)
    fn("fa_config_create", c_int, _P(fa_config_desc), _P(c_void_p))
    fn("fa_config_destroy", None, c_void_p)
    fn("fa_generate", c_int, c_void_p, c_int, c_int32, c_char_p, c_size_t, _P(c_size_t))
    fn("fa_generate_for", c_int, c_void_p, c_int, c_int32, _P(fa_generate_options), c_char_p,
       c_size_t, _P(c_size_t))
    fn("fa_launch", c_int, c_void_p, c_void_p, _P(fa_forward_args), c_void_p)
    fn("fa_forward_workspace_size", c_int, c_void_p, c_void_p, _P(fa_forward_args),
       _P(c_size_t))
    # Since 0.9 (the backward): optional, so that the binding still loads an
    # older library; backward() says what is missing (has_backward).
    if hasattr(lib, "fa_backward"):
        fn("fa_backward_workspace_size", c_int, c_void_p, c_void_p, _P(fa_backward_args),
           _P(c_size_t))
        fn("fa_backward", c_int, c_void_p, c_void_p, _P(fa_backward_args), c_void_p)
    fn("fa_decode_workspace_size", c_int, c_void_p, c_void_p, _P(fa_decode_args),
       _P(c_size_t), _P(c_int32))
    fn("fa_decode", c_int, c_void_p, c_void_p, _P(fa_decode_args), c_void_p)
    fn("fa_decode_reduce", c_int, c_void_p, c_void_p, _P(fa_reduce_args), c_void_p)
    fn("fa_cache_stats_get", c_int, c_void_p, _P(fa_cache_stats))
    fn("fa_cache_list", c_int, c_void_p, fa_cache_entry_fn, c_void_p)
    fn("fa_cache_clear", c_int, c_void_p)
    fn("fa_cache_warm", c_int, _P(fa_cache_warm_options), _P(fa_cache_warm_progress))
    fn("fa_cache_warm_presets", c_char_p)
    fn("fa_cache_warm_preset", c_char_p, c_char_p)


BUNDLED_NAME = "libflashattn.so.0"


def bundled_library():
    """The library a wheel ships inside the package (flashattn/libflashattn.so.0),
    or None when there is none (a source checkout on PYTHONPATH)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), BUNDLED_NAME)
    return path if os.path.isfile(path) else None


def _candidates():
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        return [env]  # an explicit choice: no silent fallback
    bundled = bundled_library()
    if bundled:
        return [bundled]  # a wheel's own library: never one from the system instead
    names = ["libflashattn.so.0"]
    found = ctypes.util.find_library("flashattn")
    if found and found not in names:
        names.append(found)
    return names


def _use_ptxc_package():
    """When the flashattn-ptxc wheel is installed (pip install flashattn[cubin])
    and FLASHATTN_PTX_COMPILER is unset, names its libflashattn_ptxc.so to
    libflashattn through that variable (read at the first cuda runtime; the
    library checks the file as it checks any plugin). Returns the path set,
    or None."""
    if os.environ.get("FLASHATTN_PTX_COMPILER"):
        return None
    try:
        import importlib.util
        spec = importlib.util.find_spec("flashattn_ptxc")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    plugin = os.path.join(os.path.dirname(os.path.abspath(spec.origin)), "libflashattn_ptxc.so")
    if not os.path.isfile(plugin):
        return None
    os.environ["FLASHATTN_PTX_COMPILER"] = plugin
    return plugin


def load(path=None):
    """Loads the library once and returns it: FLASHATTN_LIBRARY (a full path)
    when set, else the library bundled in the package (a wheel), else
    libflashattn.so.0 on the dynamic loader's path, else
    ctypes.util.find_library("flashattn")."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None and path is None:
            return _lib
        errors = []
        _use_ptxc_package()
        for cand in [path] if path else _candidates():
            try:
                lib = ctypes.CDLL(cand)
            except OSError as e:
                errors.append("%s: %s" % (cand, e))
                continue
            _declare(lib)
            major = lib.fa_version_number() // 10000
            if major != ABI_MAJOR:
                raise OSError("%s has ABI major %d, this binding needs %d"
                              % (cand, major, ABI_MAJOR))
            _lib, _lib_path = lib, cand
            return lib
        raise OSError("flashattn: cannot load libflashattn (set FLASHATTN_LIBRARY to "
                      "its full path): " + "; ".join(errors))


def lib():
    return _lib if _lib is not None else load()


def has_backward():
    """True when the loaded library exports fa_backward (flashattn 0.9+)."""
    return hasattr(lib(), "fa_backward")


def library_path():
    lib()
    return _lib_path

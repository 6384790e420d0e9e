"""flashattn: Python bindings (ctypes, standard library only) for the
flashattn C API (include/flashattn.h).

    import flashattn as fa
    with fa.Runtime(backend="emulator") as rt:
        cfg = fa.Config(head_dim=32, num_heads_q=12)
        o = fa.forward(rt, cfg, q, k, v)      # NumPy in, NumPy out
        o, lse = fa.decode(rt, cfg, q1, k_pages, v_pages, lens,
                           block_table=table)  # a paged KV cache
        dq, dk, dv = fa.backward(rt, cfg, q, k, v, o, lse, do)  # training
    fa.cache_warm(["80", "90a"], presets="llama-3-8b")  # fill the kernel cache, no GPU

See README.md for the tensor types accepted and how errors look.

flashattn.torch (imported only on request; needs PyTorch >= 2.4) has
FlashAttention's functions (flash_attn_func, flash_attn_varlen_func,
flash_attn_with_kvcache, ...) as torch custom ops on these kernels.
"""

from ._api import (MAX_BYTES, CacheEntry, CacheStats, Config, DeviceArray, Runtime,
                   RuntimeInfo, backward, decode, decode_reduce, forward, generate, launch)
from ._errors import (BufferTooSmallError, CacheError, CompileError, CudaError, Error,
                      InternalError, InvalidArgumentError, LaunchError, NoDeviceError,
                      NoDriverError, OutOfMemoryError, RuntimePoisonedError, UnsupportedError)
from ._lib import DECODE_INVARIANT_SPLIT, load as load_library, library_path
from ._tensors import Tensor, as_tensor, bf16_bits_to_float32, float32_to_bf16_bits
from ._warm import WarmCounts, cache_warm, cache_warm_preset, cache_warm_presets

__version__ = "0.9.0"


def version():
    """The loaded library's "MAJOR.MINOR.PATCH"."""
    from . import _lib
    return _lib.lib().fa_version_string().decode()


__all__ = [
    "Runtime", "RuntimeInfo", "Config", "DeviceArray", "CacheStats", "CacheEntry",
    "forward", "launch", "backward", "decode", "decode_reduce", "generate", "version",
    "Tensor", "as_tensor", "float32_to_bf16_bits", "bf16_bits_to_float32",
    "load_library", "library_path", "DECODE_INVARIANT_SPLIT", "MAX_BYTES",
    "Error", "InvalidArgumentError", "UnsupportedError", "OutOfMemoryError", "NoDriverError",
    "NoDeviceError", "CudaError", "CompileError", "LaunchError", "RuntimePoisonedError",
    "BufferTooSmallError", "InternalError", "CacheError",
    "cache_warm", "cache_warm_presets", "cache_warm_preset", "WarmCounts",
]

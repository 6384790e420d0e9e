"""FlashAttention's Python API (flash_attn 2.x) on flashattn's kernels.

    from flashattn.torch import flash_attn_func   # was: from flash_attn import ...
    out = flash_attn_func(q, k, v, causal=True)

The functions take FlashAttention's arguments, in its order, with its
defaults, and return what it returns. They run on torch CUDA tensors on the
current stream (flashattn's cuda backend on the tensors' device), and on CPU
tensors through flashattn's CPU emulator (slow; for tests without a GPU; needs
NumPy). The work is done by torch.library custom ops,
torch.ops.flashattn_rt.fwd, .bwd and .decode, with fake (meta)
implementations: torch.compile traces through them without graph breaks, and
on a GPU they neither synchronise nor allocate outside torch's allocator, so
they can be captured in CUDA graphs (after a warm-up call has compiled the
kernel).

Training (library 0.9): flash_attn_func, flash_attn_varlen_func and the packed
forms (qkvpacked, kvpacked and their varlen versions) have a backward pass
(autograd through torch.ops.flashattn_rt.bwd, FlashAttention-2's backward,
fa_backward), also under torch.compile(fullgraph=True): when a gradient may
flow the forward keeps its LSE, and the backward recomputes P from Q, K and
it. It takes fp16 and bf16, causal, window_size, softcap, alibi_slopes (no
gradient for the slopes, as FlashAttention), GQA/MQA (dk/dv summed over each
KV head's group) and varlen; head dims up to 256 (past 128 multiples of 16;
past that the backward raises NotImplementedError naming head_dim; the
forward takes larger ones).
deterministic=True makes dq the same bits on every run (a fixed summation
order; else atomic adds). return_attn_probs returns (out, softmax_lse, None)
as FlashAttention 2.x with dropout_p=0 (no probabilities); the LSE's own
gradient is not propagated (as FlashAttention 2.x). No backward, each raising
NotImplementedError that names it when a backward pass runs:
flash_attn_varlen_func with block_table (a paged cache) and
flash_attn_with_kvcache (as in FlashAttention).

Not supported, each raising NotImplementedError that names it: dropout_p != 0
and cache_leftpad in flash_attn_with_kvcache. alibi_slopes (since 0.5) and
flash_attn_with_kvcache's k/v append with rotary_cos/ rotary_sin (since 0.5:
the cache is updated in place, in the same launch) are supported.

Importing this module imports torch; `import flashattn` alone never does.
PyTorch >= 2.4 (torch.library.custom_op) is needed.
"""

import threading
import warnings
from typing import List, Optional, Tuple

try:
    import torch
except ImportError as _e:  # pragma: no cover - exercised where torch is absent
    raise ImportError("flashattn.torch needs PyTorch (>= 2.4), which is not installed: "
                      "import torch failed (%s)" % _e) from _e

if not hasattr(torch.library, "custom_op") or not hasattr(torch.library, "register_fake"):
    raise ImportError("flashattn.torch needs PyTorch >= 2.4 (torch.library.custom_op); "
                      "found torch %s" % torch.__version__)

from . import _api
from ._tensors import as_tensor

__all__ = [
    "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
    "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
    "runtime",
]

_NS = "flashattn_rt"
_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_TYPESTR = {torch.float16: "<f2", torch.bfloat16: "<u2", torch.float32: "<f4",
            torch.int32: "<i4", torch.uint8: "|u1"}

# ---- runtimes and configs, made once --------------------------------------------

_lock = threading.Lock()
_runtimes = {}
_configs = {}


def runtime(device):
    """The flashattn.Runtime the functions use for a torch device: the cuda
    backend on CUDA device N, the emulator for 'cpu'. Made at first use and
    kept for the life of the process. runtime(q.device).info says which
    backend runs (backend 'cuda' or 'emulator', sm, device_name);
    .cache_stats() the kernel cache (its .path: where kernels are stored).
    The first call of a function on CPU tensors issues one RuntimeWarning
    (per process): they run on flashattn's CPU emulator, which is slow."""
    device = torch.device(device)
    if device.type == "cuda":
        key = ("cuda", device.index if device.index is not None else torch.cuda.current_device())
    elif device.type == "cpu":
        key = ("cpu", 0)
    else:
        raise ValueError("flashattn.torch: tensors must be on a CUDA device or the CPU "
                         "(the emulator), got %s" % device)
    with _lock:
        rt = _runtimes.get(key)
        if rt is None:
            if key[0] == "cuda":
                rt = _api.Runtime(backend="cuda", device=key[1])
            else:
                rt = _api.Runtime(backend="emulator")
            _runtimes[key] = rt
    return rt


_emulator_warned = False


def _warn_if_emulated(q, stacklevel):
    """One RuntimeWarning per process, the first time a function gets CPU
    tensors (the emulator runs them), pointing at the caller's line."""
    global _emulator_warned
    if q.device.type == "cpu" and not _emulator_warned:
        _emulator_warned = True
        warnings.warn("flashattn.torch: CPU tensors run on flashattn's CPU emulator (it runs "
                      "the PTX kernels on the host: correct but slow, meant for tests); move "
                      "the tensors to a CUDA device for the GPU kernels. "
                      "flashattn.torch.runtime(device).info says which backend runs.",
                      RuntimeWarning, stacklevel=stacklevel + 1)


def _config(dtype, head_dim, head_dim_v, heads_q, heads_kv, causal, wl, wr, scale, softcap):
    key = (dtype, head_dim, head_dim_v, heads_q, heads_kv, bool(causal), int(wl), int(wr),
           float(scale), float(softcap))
    cfg = _configs.get(key)
    if cfg is None:
        cfg = _api.Config(dtype=dtype, head_dim=head_dim, head_dim_v=head_dim_v,
                          num_heads_q=heads_q, num_heads_kv=heads_kv, causal=causal,
                          window=(wl, wr), softmax_scale=scale, softcap=softcap)
        with _lock:
            cfg = _configs.setdefault(key, cfg)
    return cfg


# ---- torch tensors as flashattn arguments ------------------------------------------

class _Cuda:
    """A torch CUDA tensor seen through __cuda_array_interface__ (pointer,
    shape, byte strides), with no stream entry: the launch stream is given
    explicitly. Avoids torch's own exporters (no bf16 typestr, DLPack's
    stream handshake, requires_grad refusals)."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, t):
        size = t.element_size()
        self.__cuda_array_interface__ = {
            "data": (t.data_ptr(), False), "shape": tuple(t.shape),
            "strides": tuple(s * size for s in t.stride()),
            "typestr": _TYPESTR[t.dtype], "version": 2}


def _dev(t):
    if t is None:
        return None
    v = _Cuda(t)
    return as_tensor(v, "bf16") if t.dtype == torch.bfloat16 else v


def _host(t):
    """A CPU tensor as NumPy (bf16 as uint16 bits), sharing its memory."""
    if t is None:
        return None
    import numpy as np
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _from_host(a, dtype):
    """A NumPy array from _host back as a CPU tensor of dtype (bf16 bits)."""
    import numpy as np
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _fit(t):
    """t, or a contiguous copy when its layout breaks the C API's rules (last
    stride 1, other strides multiples of 8 elements, 16-byte aligned)."""
    if t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(
            s % 8 == 0 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _check_device(name, t, device):
    if t is not None and t.device != device:
        raise ValueError("flashattn.torch: %s is on %s, q on %s" % (name, t.device, device))


def _int32(t):
    if t is None:
        return None
    if t.dtype != torch.int32:
        t = t.to(torch.int32)
    return t if t.is_contiguous() else t.contiguous()


# ---- the custom ops ------------------------------------------------------------------

@torch.library.custom_op(_NS + "::fwd", mutates_args=())
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
         cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
         seqused_k: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
         max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
         window_left: int, window_right: int, softcap: float, return_lse: bool,
         alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False
         ) -> Tuple[torch.Tensor, torch.Tensor]:
    """fa_launch: (out, softmax_lse). Fixed length: q [b, sq, h, d]; varlen
    (cu_seqlens_q): q [total_q, h, d]; block_table: k/v are pages. Without
    return_lse the LSE is an empty tensor (not computed). deterministic is
    for the backward (fa_backward_args.deterministic), kept by autograd."""
    out_shape, lse_shape = _fwd_shapes(q, v, cu_seqlens_q, return_lse)
    out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    varlen = cu_seqlens_q is not None
    cfg = _config(_DTYPES[q.dtype], q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2],
                  causal, window_left, window_right, softmax_scale, softcap)
    rt = runtime(q.device)
    kw = dict(max_seqlen_q=max_seqlen_q if varlen else None,
              max_seqlen_k=max_seqlen_k if (varlen or block_table is not None) else None)
    if q.device.type == "cuda":
        cast, kw["stream"] = _dev, torch.cuda.current_stream(q.device).cuda_stream
        kw["workspace"] = _forward_workspace(q.device, kw["stream"])
        q = _fit(q)
        if block_table is None:  # a paged cache is used as it is
            k, v = _fit(k), _fit(v)
    else:
        cast = _host
    _api.forward(rt, cfg, cast(q), cast(k), cast(v), out=cast(out),
                 lse=cast(lse) if return_lse else None,
                 cu_seqlens_q=cast(cu_seqlens_q), cu_seqlens_k=cast(cu_seqlens_k),
                 seqused_k=cast(seqused_k), block_table=cast(block_table),
                 alibi_slopes=cast(alibi_slopes), **kw)
    return out, lse


_forward_workspaces = {}  # (device index, stream handle) -> zeroed uint8 tensor


def _forward_workspace(device, stream):
    """forward()'s workspace= for a launch on `stream` of CUDA `device`: a
    callable the binding calls with the byte count when the launch needs one
    (the persistent sm_90a forward's work counter, with
    FLASHATTN_SM90_PERSISTENT=1, or the split-KV forward's partial states).
    It returns a torch.zeros buffer made on
    that stream (so zeroed before the launch, in stream order) and cached per
    (device, stream): the kernel leaves it zero after each launch, so later
    calls on the stream reuse it, and launches on different streams never
    share one. While the stream is being captured into a CUDA graph each
    call gets a fresh buffer instead (its zeroing is captured with it, and a
    graph replayed on another stream shares nothing with eager calls)."""
    key = (device.index, stream)
    keep = []  # a fresh buffer lives until the launch is queued (then stream order)

    def get(nbytes):
        nbytes = max(nbytes, 8)
        if torch.cuda.is_current_stream_capturing():
            keep.append(torch.zeros(nbytes, dtype=torch.uint8, device=device))
            return _dev(keep[-1])
        with _lock:
            ws = _forward_workspaces.get(key)
            if ws is None or ws.numel() < nbytes:
                ws = _forward_workspaces[key] = torch.zeros(nbytes, dtype=torch.uint8,
                                                            device=device)
        return _dev(ws)

    return get


def _fwd_shapes(q, v, cu_seqlens_q, return_lse):
    if cu_seqlens_q is None:
        b, sq, h, _ = q.shape
        out, lse = (b, sq, h, v.shape[-1]), (b, h, sq)
    else:
        tq, h, _ = q.shape
        out, lse = (tq, h, v.shape[-1]), (h, tq)
    return out, (lse if return_lse else (0,))


@_fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q,
              max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
              return_lse, alibi_slopes=None, deterministic=False):
    out_shape, lse_shape = _fwd_shapes(q, v, cu_seqlens_q, return_lse)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


def _decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal,
                 window_left, window_right, softcap, num_splits, alibi_slopes=None, **append):
    b, sq, h, _ = q.shape
    out = torch.empty((b, sq, h, v_cache.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    cfg = _config(_DTYPES[q.dtype], q.shape[-1], v_cache.shape[-1], h, k_cache.shape[-2],
                  causal, window_left, window_right, softmax_scale, softcap)
    rt = runtime(q.device)
    if q.device.type == "cuda":
        device = q.device
        q = _fit(q)
        keep = []  # the workspace lives until the launch is queued (then stream order)

        def workspace(nbytes):
            keep.append(torch.empty(max(nbytes, 256), dtype=torch.uint8, device=device))
            return _dev(keep[-1])

        extra = {k_: (_dev(t) if isinstance(t, torch.Tensor) else t)
                 for k_, t in append.items()}
        _api.decode(rt, cfg, _dev(q), _dev(k_cache), _dev(v_cache), _dev(cache_seqlens),
                    num_splits=num_splits, out=_dev(out), lse=_dev(lse),
                    block_table=_dev(block_table), workspace=workspace,
                    alibi_slopes=_dev(alibi_slopes),
                    stream=torch.cuda.current_stream(device).cuda_stream, **extra)
    else:
        caches = (k_cache, v_cache)
        if append:  # the emulator's copies of the caches come back into them
            caches = tuple(_host(t) for t in caches)
        extra = {k_: (_host(t) if isinstance(t, torch.Tensor) else t)
                 for k_, t in append.items()}
        _api.decode(rt, cfg, _host(q), caches[0] if append else _host(k_cache),
                    caches[1] if append else _host(v_cache), _host(cache_seqlens),
                    num_splits=num_splits, out=_host(out), lse=_host(lse),
                    block_table=_host(block_table), alibi_slopes=_host(alibi_slopes), **extra)
        for t, a in zip((k_cache, v_cache), caches if append else ()):
            if not t.is_contiguous():  # _host copied it: the written rows come back
                t.copy_(_from_host(a, t.dtype).reshape(t.shape))
    return out, lse


@torch.library.custom_op(_NS + "::decode", mutates_args=())
def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor],
            softmax_scale: float, causal: bool, window_left: int, window_right: int,
            softcap: float, num_splits: int, alibi_slopes: Optional[torch.Tensor] = None
            ) -> Tuple[torch.Tensor, torch.Tensor]:
    """fa_decode (Flash-Decoding, split-KV, with the combine): (out, lse)."""
    return _decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal,
                        window_left, window_right, softcap, num_splits, alibi_slopes)


@_decode.register_fake
def _decode_fake(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal,
                 window_left, window_right, softcap, num_splits, alibi_slopes=None):
    b, sq, h, _ = q.shape
    return (q.new_empty((b, sq, h, v_cache.shape[-1])),
            q.new_empty((b, h, sq), dtype=torch.float32))


@torch.library.custom_op(_NS + "::decode_append", mutates_args=("k_cache", "v_cache"))
def _decode_append(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   cache_seqlens: torch.Tensor, block_table: Optional[torch.Tensor],
                   softmax_scale: float, causal: bool, window_left: int, window_right: int,
                   softcap: float, num_splits: int, alibi_slopes: Optional[torch.Tensor],
                   k: torch.Tensor, v: torch.Tensor, rotary_cos: Optional[torch.Tensor],
                   rotary_sin: Optional[torch.Tensor], rotary_interleaved: bool
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """fa_decode with k_new/v_new (and RoPE): the new keys/values written into
    the caches at cache_seqlens (the lengths before), attended to in the same
    launch: (out, lse)."""
    append = dict(k_new=k, v_new=v)
    if rotary_cos is not None:
        append.update(rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                      rotary_interleaved=rotary_interleaved)
    return _decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal,
                        window_left, window_right, softcap, num_splits, alibi_slopes, **append)


@_decode_append.register_fake
def _decode_append_fake(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal,
                        window_left, window_right, softcap, num_splits, alibi_slopes, k, v,
                        rotary_cos, rotary_sin, rotary_interleaved):
    b, sq, h, _ = q.shape
    return (q.new_empty((b, sq, h, v_cache.shape[-1])),
            q.new_empty((b, h, sq), dtype=torch.float32))


@torch.library.custom_op(_NS + "::bwd", mutates_args=())
def _bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
         out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
         cu_seqlens_k: Optional[torch.Tensor], seqused_k: Optional[torch.Tensor],
         max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
         window_left: int, window_right: int, softcap: float,
         alibi_slopes: Optional[torch.Tensor], deterministic: bool
         ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fa_backward: (dq, dk, dv) of the forward (q, k, v) -> (out, lse) for
    the upstream gradient dout; dq/dk/dv contiguous, shaped like q/k/v."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    varlen = cu_seqlens_q is not None
    cfg = _config(_DTYPES[q.dtype], q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2],
                  causal, window_left, window_right, softmax_scale, softcap)
    rt = runtime(q.device)
    kw = dict(max_seqlen_q=max_seqlen_q if varlen else None,
              max_seqlen_k=max_seqlen_k if varlen else None)
    if q.device.type == "cuda":
        device = q.device
        keep = []  # the workspace lives until the launch is queued (then stream order)

        def workspace(nbytes):
            keep.append(torch.empty(max(nbytes, 256), dtype=torch.uint8, device=device))
            return _dev(keep[-1])

        cast, kw["stream"] = _dev, torch.cuda.current_stream(device).cuda_stream
        kw["workspace"] = workspace
        q, k, v, out, dout = (_fit(t) for t in (q, k, v, out, dout))
    else:
        cast = _host
    _api.backward(rt, cfg, cast(q), cast(k), cast(v), cast(out), cast(lse), cast(dout),
                  dq=cast(dq), dk=cast(dk), dv=cast(dv), cu_seqlens_q=cast(cu_seqlens_q),
                  cu_seqlens_k=cast(cu_seqlens_k), seqused_k=cast(seqused_k),
                  alibi_slopes=cast(alibi_slopes), deterministic=bool(deterministic), **kw)
    return dq, dk, dv


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
              max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
              alibi_slopes, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# The backward kernels take head dims up to this (fa_backward: UNSUPPORTED past it).
_BWD_MAX_HEAD_DIM = 256
_FWD_INPUTS = 17  # the inputs of flashattn_rt::fwd, each given a gradient (or None)


def _setup_fwd(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q, max_seqlen_k,
     softmax_scale, causal, window_left, window_right, softcap, return_lse, alibi_slopes,
     deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                          alibi_slopes)
    ctx.paged = block_table is not None
    ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                softcap)
    ctx.deterministic = deterministic


def _fwd_backward(ctx, grad_out, grad_lse):
    """Gradients of q, k and v (FlashAttention-2's backward, fa_backward).
    The LSE's own gradient (return_attn_probs=True, then used in a loss) is
    not propagated, as in FlashAttention 2.x."""
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes = ctx.saved_tensors
    if ctx.paged:
        raise NotImplementedError(
            "flashattn.torch.flash_attn_varlen_func: block_table (a paged KV cache) has no "
            "backward pass (fa_backward reads contiguous K/V); detach k and v or run under "
            "torch.no_grad()")
    for name, d in (("head_dim", q.shape[-1]), ("head_dim_v", v.shape[-1])):
        if d > _BWD_MAX_HEAD_DIM or (d > 128 and d % 16 != 0):
            raise NotImplementedError(
                "flashattn.torch: %s=%d: the backward pass takes head dims up to %d (past 128 "
                "multiples of 16; the forward takes others)" % (name, d, _BWD_MAX_HEAD_DIM))
    if lse.numel() == 0 and out.numel() != 0:
        raise RuntimeError("flashattn.torch: flashattn_rt::fwd ran with return_lse=False, so "
                           "its backward has no LSE: call it with return_lse=True")
    dq, dk, dv = torch.ops.flashattn_rt.bwd(grad_out, q, k, v, out, lse, cu_seqlens_q,
                                            cu_seqlens_k, seqused_k, *ctx.args, alibi_slopes,
                                            ctx.deterministic)
    return (dq, dk, dv) + (None,) * (_FWD_INPUTS - 3)


# flash_attn_with_kvcache has no backward pass (nor has FlashAttention's): an
# op that raises when one runs, so that a forward on tensors requiring grad
# works and torch.compile can trace the joint graph.
@torch.library.custom_op(_NS + "::no_backward", mutates_args=())
def _no_backward(grad: torch.Tensor, q_shape: List[int], k_shape: List[int],
                 v_shape: List[int]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError(
        "flashattn.torch.flash_attn_with_kvcache: no backward pass (decoding over a KV cache "
        "is inference only, as in FlashAttention); run it under torch.no_grad() / "
        "torch.inference_mode(), or detach its inputs")


@_no_backward.register_fake
def _no_backward_fake(grad, q_shape, k_shape, v_shape):
    return grad.new_empty(q_shape), grad.new_empty(k_shape), grad.new_empty(v_shape)


def _setup_decode(ctx, inputs, output):
    q, k, v = inputs[:3]
    ctx.qkv_shapes = (list(q.shape), list(k.shape), list(v.shape))
    ctx.n_other = len(inputs) - 3


def _decode_backward(ctx, grad_out, grad_lse):
    dq, dk, dv = torch.ops.flashattn_rt.no_backward(grad_out, *ctx.qkv_shapes)
    return (dq, dk, dv) + (None,) * ctx.n_other


_fwd.register_autograd(_fwd_backward, setup_context=_setup_fwd)
_decode.register_autograd(_decode_backward, setup_context=_setup_decode)


# ---- FlashAttention's functions ----------------------------------------------------------

def _unsupported(fn, dropout_p=0.0):
    if dropout_p:
        raise NotImplementedError(
            "flashattn.torch.%s: dropout_p=%r is not supported (flashattn has no attention "
            "dropout, forward or backward); pass dropout_p=0.0" % (fn, dropout_p))


def _slopes(fn, alibi_slopes, device):
    """FlashAttention's alibi_slopes: fp32 (nheads,) or (batch, nheads)."""
    if alibi_slopes is None:
        return None
    _check_device("alibi_slopes", alibi_slopes, device)
    if alibi_slopes.dtype != torch.float32:
        raise TypeError("flashattn.torch.%s: alibi_slopes must be float32, got %s"
                        % (fn, alibi_slopes.dtype))
    return alibi_slopes


def _check_dtypes(fn, q, same=(), rotary=()):
    """Before anything is dispatched, on every device: q is float16 or
    bfloat16, each tensor of `same` ((name, tensor or None) pairs: k, v,
    the caches, the new k/v) has q's dtype, as FlashAttention requires
    ("query and key must have the same dtype"), and each of `rotary` is
    float32 or q's dtype. Raises TypeError naming the function and the
    argument."""
    if q.dtype not in _DTYPES:
        raise TypeError("flashattn.torch.%s: q must be float16 or bfloat16, got %s"
                        % (fn, q.dtype))
    for name, t in same:
        if t is not None and t.dtype != q.dtype:
            raise TypeError("flashattn.torch.%s: %s is %s but q is %s: q, k and v (and the "
                            "caches) must have the same dtype, float16 or bfloat16"
                            % (fn, name, t.dtype, q.dtype))
    for name, t in rotary:
        if t is not None and t.dtype not in (torch.float32, q.dtype):
            raise TypeError("flashattn.torch.%s: %s must be float32 or q's dtype (%s), got %s"
                            % (fn, name, q.dtype, t.dtype))


def _window(window_size):
    if window_size is None:
        return -1, -1
    wl, wr = window_size
    return int(wl), int(wr)


def _pad8(x):
    """FlashAttention pads head dims that are not multiples of 8."""
    d = x.shape[-1]
    return x if d % 8 == 0 else torch.nn.functional.pad(x, [0, 8 - d % 8])


def _kv_names(fn, k, v):
    """(name, tensor) of k and v as the caller passed them: slices of qkv or
    kv in the packed functions."""
    name = "qkv" if "qkvpacked" in fn else "kv" if "kvpacked" in fn else None
    return ((name or "k", k), (name or "v", v))


def _needs_grad(*ts):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def _attention(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
               softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
               return_attn_probs, block_table=None):
    _unsupported(fn, dropout_p)
    _check_dtypes(fn, q, _kv_names(fn, k, v))
    _warn_if_emulated(q, 3)  # the caller of flash_attn_*_func
    alibi_slopes = _slopes(fn, alibi_slopes, q.device)
    for name, t in (("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k", cu_seqlens_k), ("block_table", block_table)):
        _check_device(name, t, q.device)
    dv = v.shape[-1]
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** (-0.5)
    wl, wr = _window(window_size)
    seqused_k = None
    if block_table is not None:
        # FlashAttention's paged varlen: cu_seqlens_k gives each sequence's
        # keys in the cache; flashattn takes the counts (seqused_k).
        seqused_k = _int32(cu_seqlens_k[1:] - cu_seqlens_k[:-1])
        cu_seqlens_k = None
    # The backward needs the LSE: the forward writes it when a gradient may flow.
    return_lse = bool(return_attn_probs) or _needs_grad(q, k, v)
    out, lse = torch.ops.flashattn_rt.fwd(
        _pad8(q), _pad8(k), _pad8(v), _int32(cu_seqlens_q), _int32(cu_seqlens_k), seqused_k,
        _int32(block_table), max_seqlen_q, max_seqlen_k, float(softmax_scale), bool(causal),
        wl, wr, float(softcap), return_lse, alibi_slopes, bool(deterministic))
    if out.shape[-1] != dv:
        out = out[..., :dv]
    return (out, lse, None) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k,
    headdim); GQA/MQA when nheads_k divides nheads; causal is bottom-right
    aligned; window_size (left, right), -1 = unbounded; softcap > 0 caps the
    scores. Returns out (batch, seqlen_q, nheads, headdim), or with
    return_attn_probs (out, softmax_lse (batch, nheads, seqlen_q) fp32,
    None)."""
    return _attention("flash_attn_func", q, k, v, None, None, 0, 0, dropout_p, softmax_scale,
                      causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """Packed sequences: q (total_q, nheads, headdim), k/v (total_k, nheads_k,
    headdim), cu_seqlens_q/k int32 (batch + 1,). With block_table (batch,
    max_blocks) int32, k/v are a paged cache (num_blocks, block_size,
    nheads_k, headdim) and cu_seqlens_k gives each sequence's keys in it; the
    queries are each sequence's last tokens. Returns out (total_q, nheads,
    headdim), or with return_attn_probs (out, softmax_lse (nheads, total_q),
    None). CUDA cu_seqlens are trusted (not read on the host)."""
    return _attention("flash_attn_varlen_func", q, k, v, cu_seqlens_q, cu_seqlens_k,
                      max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                      window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                      block_table)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """qkv (batch, seqlen, 3, nheads, headdim); as flash_attn_func."""
    return _attention("flash_attn_qkvpacked_func", qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2],
                      None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """kv (batch, seqlen_k, 2, nheads_k, headdim); as flash_attn_func."""
    return _attention("flash_attn_kvpacked_func", q, kv[:, :, 0], kv[:, :, 1], None, None, 0,
                      0, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                      deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv (total, 3, nheads, headdim); as flash_attn_varlen_func."""
    return _attention("flash_attn_varlen_qkvpacked_func", qkv[:, 0], qkv[:, 1], qkv[:, 2],
                      cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                      causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """kv (total_k, 2, nheads_k, headdim); as flash_attn_varlen_func."""
    return _attention("flash_attn_varlen_kvpacked_func", q, kv[:, 0], kv[:, 1], cu_seqlens_q,
                      cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                      causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """Decoding over a KV cache (Flash-Decoding). q (batch, seqlen_q, nheads,
    headdim): each sequence's last seqlen_q positions. k_cache/v_cache
    (batch_cache, seqlen_cache, nheads_k, headdim), or pages (num_blocks,
    block_size, nheads_k, headdim) with block_table (batch, max_blocks)
    int32 (any block size). cache_seqlens: int or int32 (batch,), the keys of
    each sequence (None: the whole cache). cache_batch_idx (batch,): which
    cache row each sequence uses. num_splits: 0 = chosen for you, 1 = no
    split, N = up to N. Returns out (batch, seqlen_q, nheads, headdim), or
    with return_softmax_lse (out, softmax_lse (batch, nheads, seqlen_q)).
    k, v (batch, seqlen_new, nheads_k, headdim): written into the caches at
    cache_seqlens (then the lengths before; required) and attended to, in
    the same launch; rotary_cos/rotary_sin (seqlen_ro, rotary_dim / 2),
    fp32 or q's dtype, rotate q and k first (rotary_interleaved: GPT-J
    pairs, else GPT-NeoX), q at cache_seqlens (+ i when causal or local).
    alibi_slopes fp32 (nheads,) or (batch, nheads). Not supported:
    cache_leftpad."""
    fn = "flash_attn_with_kvcache"
    if (k is None) != (v is None):
        raise ValueError("flashattn.torch.%s: k and v come together" % fn)
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("flashattn.torch.%s: rotary_cos and rotary_sin come together" % fn)
    if rotary_cos is not None and k is None:
        raise ValueError("flashattn.torch.%s: rotary_cos/rotary_sin rotate the new k: pass k "
                         "and v" % fn)
    if k is not None and cache_seqlens is None:
        raise ValueError("flashattn.torch.%s: with k/v, cache_seqlens (the lengths before "
                         "the append) is required" % fn)
    if cache_leftpad is not None:
        raise NotImplementedError("flashattn.torch.%s: cache_leftpad is not supported" % fn)
    _check_dtypes(fn, q, (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)),
                  (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)))
    _warn_if_emulated(q, 2)
    alibi_slopes = _slopes(fn, alibi_slopes, q.device)
    for name, t in (("k", k), ("v", v), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        _check_device(name, t, q.device)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("cache_batch_idx", cache_batch_idx)):
        _check_device(name, t, q.device)
    if cache_batch_idx is not None:
        if block_table is not None:
            raise ValueError("flashattn.torch.%s: cache_batch_idx and block_table cannot be "
                             "used together" % fn)
        # Row cache_batch_idx[b] of the cache is one page of seqlen_cache keys.
        block_table = cache_batch_idx.reshape(-1, 1)
    block_table = _int32(block_table)
    batch = q.shape[0]
    if isinstance(cache_seqlens, torch.Tensor):
        _check_device("cache_seqlens", cache_seqlens, q.device)
        cache_seqlens = _int32(cache_seqlens)
    else:
        if cache_seqlens is None:  # every key of the cache
            cache_seqlens = k_cache.shape[1] * (1 if block_table is None else
                                                block_table.shape[1])
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** (-0.5)
    wl, wr = _window(window_size)
    if k_cache.shape[-1] % 8 or v_cache.shape[-1] % 8:
        raise NotImplementedError("flashattn.torch.%s: head dims must be multiples of 8 for a "
                                  "KV cache (got %d and %d)" % (fn, k_cache.shape[-1],
                                                                v_cache.shape[-1]))
    if k is not None:
        out, lse = torch.ops.flashattn_rt.decode_append(
            q, k_cache, v_cache, cache_seqlens, block_table, float(softmax_scale), bool(causal),
            wl, wr, float(softcap), int(num_splits), alibi_slopes, k, v, rotary_cos, rotary_sin,
            bool(rotary_interleaved))
    else:
        out, lse = torch.ops.flashattn_rt.decode(
            q, k_cache, v_cache, cache_seqlens, block_table, float(softmax_scale), bool(causal),
            wl, wr, float(softcap), int(num_splits), alibi_slopes)
    return (out, lse) if return_softmax_lse else out

"""flashattn as an attention implementation of Hugging Face transformers.

    import torch
    from transformers import AutoModelForCausalLM
    from flashattn.integrations.transformers import register

    name = register()                                  # "fa_runtime"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16,
                                                 attn_implementation=name).cuda()
    # or, on a model already loaded: model.set_attn_implementation(name)

register() puts two functions into transformers' public registries: the
attention function (AttentionInterface) and its mask function
(AttentionMaskInterface). Both are needed: without the mask function
transformers gives the attention no mask at all for an implementation it
does not know, and padded batches (and static caches, whose key tensors
hold unwritten rows) come out silently wrong.

The name must not contain "flash": transformers takes any such name for
one of its own FlashAttention flavours and tries to load that package or a
Hub kernel for it. Any other name transformers refuses until it is
registered, so call register() before loading the model.

What the attention does, per call (flashattn.torch's functions, on the
GPU kernels for CUDA tensors and on the CPU emulator for CPU tensors):
  - the mask function hands over, per layer type, one int8 code per key row
    of the key tensor the layer will see: 0 = not written yet (a static
    cache's free rows), 1 = padding, 2 = a real token, shaped [batch, 1, 1,
    keys] (4-D, so that transformers passes it through as it is when
    generate() makes it ahead of the model, as it does for static caches,
    instead of reading it again as a padding mask). It is built from
    transformers' own cache sizes (get_mask_sizes: kv_length, kv_offset, and
    the query offset), so it is right for DynamicCache, StaticCache and the
    sliding-window layers of both (hybrid caches: Gemma 2/3, Mistral);
  - one new token per sequence (decode): flash_attn_with_kvcache on the
    layer's key/value tensors as transformers holds them ([batch, heads,
    seq, dim], the cache storage itself: no copy on a GPU), cache_seqlens
    the real tokens of each row; when padding or free rows come first (left
    padding, a sliding layer's static storage) the real rows are addressed
    through a block_table of page size 1 over that same storage;
  - otherwise (prefill, several new tokens): the real queries and keys are
    packed and run through flash_attn_varlen_func (or flash_attn_func when
    nothing is padded); the outputs of padding queries are zeros.
    transformers' eager attention gives a query that sees no key (left
    padding) the mean of all the row's values instead (its additive mask
    lifts every score alike). Only those rows differ, but a causal-LM loss
    reads one of them per left-padded row: the last padding position's
    logits predict the first real token. So Gemma 2's padded training loss
    differs from eager's (4.6089 against 4.6311 in tests/test_transformers.py;
    an fp64 reference with zeros there: 4.6089); sdpa gives zeros too.
  - sliding_window W (transformers: key j visible from query i when
    i - j < W) is window_size (W - 1, W - 1), softcap and scaling are
    passed on, GQA/MQA needs no repeat; is_causal=False (bidirectional
    masks) runs non-causal.
  - fp32 query/key/value (e.g. layer norms kept in fp32) run in the
    autocast dtype when autocast is on, else in bfloat16, and the output
    is cast back.

Not supported (each raises NotImplementedError naming it): attention sinks
(s_aux, gpt-oss), dropout in training, 4-D masks given by the caller,
mask functions combined with others (or_mask_function / and_mask_function:
e.g. image-token masks of multimodal models) and packed sequences
(position_ids restarting inside one row). The windows are counted in real
tokens, which equals transformers' positions when a row's padding is all
at its start or all at its end (left or right padding), not for padding in
the middle of a row. Training works through flashattn.torch's backward
(library 0.9: fa_backward), except over a KV cache.
"""

import torch

from .. import torch as fat

__all__ = ["NAME", "register", "attention_forward", "attention_mask"]

NAME = "fa_runtime"
_UNWRITTEN, _PADDING, _REAL = 0, 1, 2


def register(name=NAME):
    """Registers attention_forward and attention_mask under `name` with
    transformers' AttentionInterface and AttentionMaskInterface (for every
    model of the process) and returns the name, to pass as
    attn_implementation=. Raises ValueError for a name containing "flash"
    (transformers would try to load a FlashAttention package for it)."""
    if not isinstance(name, str) or not name:
        raise ValueError("flashattn.integrations.transformers.register: name must be a "
                         "non-empty str, got %r" % (name,))
    if "flash" in name.lower():
        raise ValueError(
            "flashattn.integrations.transformers.register: name %r contains 'flash': "
            "transformers treats such names as its own FlashAttention implementations and "
            "tries to import flash_attn or a Hub kernel for them; pick another name "
            "(default %r)" % (name, NAME))
    from transformers import AttentionInterface, AttentionMaskInterface
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, attention_mask)
    return name


# ---- the mask function --------------------------------------------------------------

def attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                   mask_function=None, attention_mask=None, use_vmap=False, device=None,
                   **kwargs):
    """transformers' mask interface (masking_utils.create_causal_mask and
    friends call it with the sizes from the cache): int8 [batch_size, 1, 1,
    kv_length], per row of the key tensor the layer will see (absolute
    positions kv_offset .. kv_offset + kv_length - 1): 0 = not written
    (position >= q_offset + q_length), 1 = padding (attention_mask, the 2-D
    [batch, positions] padding mask, is 0 there), 2 = a real token."""
    if use_vmap:
        raise NotImplementedError(
            "flashattn.integrations.transformers: the model combines its mask with another "
            "mask function (or_mask_function / and_mask_function, e.g. image tokens); only "
            "causal, sliding-window and bidirectional masks with padding are supported")
    if device is None:
        device = attention_mask.device if attention_mask is not None else "cpu"
    pos = torch.arange(kv_length, device=device) + kv_offset
    written = (pos < q_offset + q_length).unsqueeze(0)  # q_offset may be a 0-d tensor
    if attention_mask is None:
        codes = (written.to(torch.int8) * _REAL).expand(batch_size, kv_length)
        return codes.reshape(batch_size, 1, 1, kv_length).contiguous()
    if attention_mask.dim() != 2:
        raise NotImplementedError(
            "flashattn.integrations.transformers: attention_mask of shape %s: a 2-D "
            "[batch, positions] padding mask is supported" % (tuple(attention_mask.shape),))
    pad = attention_mask.to(device=device, dtype=torch.bool)
    need = kv_offset + kv_length
    if pad.shape[1] < need:  # a static cache: positions not seen yet
        pad = torch.nn.functional.pad(pad, (0, need - pad.shape[1]))
    pad = pad[:, kv_offset:need]
    codes = written.to(torch.int8) + (written & pad).to(torch.int8)
    return codes.reshape(batch_size, 1, 1, kv_length).contiguous()


# ---- the attention function -----------------------------------------------------------

def _codes(attention_mask, batch, keys):
    """The int8 codes [batch, keys] of attention_mask: ours (int8 [batch, 1,
    1, keys]), a 2-D padding mask (nonzero = token, right-aligned with the
    keys as FlashAttention 2's integration takes it), or None (no mask:
    every key is a real token)."""
    if attention_mask is None:
        return None
    t = attention_mask if isinstance(attention_mask, torch.Tensor) else None
    if t is not None and t.dtype == torch.int8 and t.dim() == 4 and t.shape[1:3] == (1, 1):
        codes = t.reshape(t.shape[0], -1)
    elif t is not None and t.dim() == 2:
        codes = (t[:, -keys:] != 0).to(torch.int8) * _REAL
        if codes.shape[1] < keys:
            codes = torch.nn.functional.pad(codes, (0, keys - codes.shape[1]))
    else:
        raise NotImplementedError(
            "flashattn.integrations.transformers: got a %s attention mask; expected the "
            "mask of flashattn's mask function (register() installs it with the attention) "
            "or a 2-D padding mask; other 4-D masks are not supported"
            % (str(tuple(t.shape)) if t is not None else type(attention_mask).__name__))
    if tuple(codes.shape) != (batch, keys):
        raise ValueError("flashattn.integrations.transformers: the mask covers %s keys, the "
                         "layer has [batch=%d, keys=%d]; was the mask made for another cache?"
                         % (tuple(codes.shape), batch, keys))
    return codes


def _compute_dtype(dtype, device):
    if dtype in (torch.float16, torch.bfloat16):
        return dtype
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return torch.bfloat16


def _token_pages(kv):
    """kv [batch, heads, seq, dim] (transformers' layout) as pages of one
    token, [pages, 1, heads, dim], over the same storage; page b * step + j
    is token j of sequence b. Returns (pages, step)."""
    s0, s1, s2, s3 = kv.stride()
    if s3 != 1 or s2 <= 0 or s0 % s2:
        kv = kv.contiguous()
        s0, s1, s2, s3 = kv.stride()
    B, H, L, D = kv.shape
    count = ((B - 1) * s0 + (L - 1) * s2) // s2 + 1
    pages = kv.as_strided((count, 1, H, D), (s2, s2, s1, 1), kv.storage_offset())
    return pages, s0 // s2


def _decode(q, key, value, real, kw):
    """One new token per row over the layer's own key/value storage
    ([batch, heads, seq, dim]): the rows real[b] are attended to."""
    B, L = real.shape
    n = real.sum(1, dtype=torch.int32)
    prefix = torch.arange(L, device=real.device).unsqueeze(0) < n.unsqueeze(1)
    if torch.equal(real, prefix):  # the real tokens come first in every row
        return fat.flash_attn_with_kvcache(q, key.transpose(1, 2), value.transpose(1, 2),
                                           cache_seqlens=n, **kw)
    kp, step = _token_pages(key)
    vp, vstep = _token_pages(value)
    if vstep != step:
        kp, step = _token_pages(key.contiguous())
        vp, vstep = _token_pages(value.contiguous())
    # Row b's real tokens first, in order: its block table (pages of one token).
    order = torch.argsort((~real).to(torch.int8), dim=1, stable=True)
    table = (order + step * torch.arange(B, device=real.device).unsqueeze(1)).to(torch.int32)
    return fat.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=n, block_table=table, **kw)


def _packed(q, k, v, codes, causal, kw):
    """Prefill: the real queries and keys of each row packed and run through
    flash_attn_varlen_func; padding queries get zeros."""
    B, Sq, H, _ = q.shape
    real = codes == _REAL
    written = (codes != _UNWRITTEN).sum(1)
    # Query i of row b is the row's key nw - Sq + i (the newest written rows).
    at = written.unsqueeze(1) - Sq + torch.arange(Sq, device=q.device).unsqueeze(0)
    real_q = real.gather(1, at.clamp(min=0)) & (at >= 0)
    nk = real.sum(1, dtype=torch.int32)
    nq = real_q.sum(1, dtype=torch.int32)
    cu_k = torch.nn.functional.pad(torch.cumsum(nk, 0, dtype=torch.int32), (1, 0))
    cu_q = torch.nn.functional.pad(torch.cumsum(nq, 0, dtype=torch.int32), (1, 0))
    out = fat.flash_attn_varlen_func(q[real_q], k[real], v[real], cu_q, cu_k,
                                     int(nq.max()), int(nk.max()), causal=causal, **kw)
    full = q.new_zeros((B, Sq, H, v.shape[-1]))
    full[real_q] = out
    return full


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, s_aux=None, **kwargs):
    """transformers' attention interface: query [batch, heads, seq_q, dim],
    key/value [batch, heads_kv, keys, dim(_v)] (after the cache update: the
    cache's own tensors), attention_mask from attention_mask() (or None /
    a 2-D padding mask); returns (out [batch, seq_q, heads, dim_v], None).
    Errors: NotImplementedError for s_aux (sinks), dropout and masks that
    are not supported (see the module docstring)."""
    if s_aux is not None:
        raise NotImplementedError("flashattn.integrations.transformers: attention sinks "
                                  "(s_aux) are not supported by flashattn.torch")
    if dropout:
        raise NotImplementedError("flashattn.integrations.transformers: dropout=%r (training); "
                                  "flashattn runs inference only: call model.eval()" % dropout)
    pos = kwargs.get("position_ids")
    if pos is not None and query.shape[0] == 1 and pos.shape[-1] > 1 and attention_mask is None \
            and bool((pos.reshape(-1).diff() < 0).any()):
        raise NotImplementedError("flashattn.integrations.transformers: packed sequences "
                                  "(position_ids restarting inside a row) are not supported")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    in_dtype = query.dtype
    dt = _compute_dtype(in_dtype, query.device)
    query, key, value = (x if x.dtype == dt else x.to(dt) for x in (query, key, value))
    B, _, Sq, D = query.shape
    L = key.shape[2]
    w = -1 if not sliding_window else int(sliding_window) - 1
    kw = dict(softmax_scale=scaling, window_size=(w, w), softcap=float(softcap or 0.0))
    codes = _codes(attention_mask, B, L)
    q = query.transpose(1, 2)
    if Sq == 1 and D % 8 == 0 and value.shape[-1] % 8 == 0:
        real = torch.ones((B, L), dtype=torch.bool, device=q.device) if codes is None \
            else codes == _REAL
        out = _decode(q, key, value, real, dict(kw, causal=causal))
    elif codes is None or (L == Sq and bool((codes == _REAL).all())):
        out = fat.flash_attn_func(q, key.transpose(1, 2), value.transpose(1, 2), causal=causal,
                                  **kw)
    else:
        out = _packed(q, key.transpose(1, 2), value.transpose(1, 2), codes, causal, kw)
    return (out if out.dtype == in_dtype else out.to(in_dtype)), None

"""flashattn.torch: FlashAttention's Python API on flashattn's kernels.

Without PyTorch: the signature table below against flashattn/torch.py read
as source (ast), `import flashattn` importing no torch, and `import
flashattn.torch` failing with a message that names PyTorch.
With PyTorch (CPU): every function on CPU tensors through the emulator
against fp64 references and the C API, the unsupported arguments, fake-tensor
shape propagation and torch.compile(fullgraph=True) tracing (the backward
pass: test_torch_backward.py).
The GPU checks (C API equality, torch.compile with Inductor, CUDA graphs) are
in test_torch_gpu.py."""

import ast
import importlib.util
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ref_attention, rng
import flashattn as fa

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = os.path.join(HERE, "..", "flashattn", "torch.py")
REQUIRED = inspect.Parameter.empty

_FUNC_TAIL = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
              ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
              ("deterministic", False), ("return_attn_probs", False)]

# FlashAttention 2.x (flash_attn/flash_attn_interface.py, the functions the
# README documents): parameter names in order and defaults (REQUIRED = none),
# and what each returns.
FA_SIGNATURES = {
    "flash_attn_func": [("q", REQUIRED), ("k", REQUIRED), ("v", REQUIRED)] + _FUNC_TAIL,
    "flash_attn_qkvpacked_func": [("qkv", REQUIRED)] + _FUNC_TAIL,
    "flash_attn_kvpacked_func": [("q", REQUIRED), ("kv", REQUIRED)] + _FUNC_TAIL,
    "flash_attn_varlen_func": [
        ("q", REQUIRED), ("k", REQUIRED), ("v", REQUIRED), ("cu_seqlens_q", REQUIRED),
        ("cu_seqlens_k", REQUIRED), ("max_seqlen_q", REQUIRED), ("max_seqlen_k", REQUIRED),
    ] + _FUNC_TAIL + [("block_table", None)],
    "flash_attn_varlen_qkvpacked_func": [
        ("qkv", REQUIRED), ("cu_seqlens", REQUIRED), ("max_seqlen", REQUIRED)] + _FUNC_TAIL,
    "flash_attn_varlen_kvpacked_func": [
        ("q", REQUIRED), ("kv", REQUIRED), ("cu_seqlens_q", REQUIRED), ("cu_seqlens_k", REQUIRED),
        ("max_seqlen_q", REQUIRED), ("max_seqlen_k", REQUIRED)] + _FUNC_TAIL,
    "flash_attn_with_kvcache": [
        ("q", REQUIRED), ("k_cache", REQUIRED), ("v_cache", REQUIRED), ("k", None), ("v", None),
        ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
        ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
        ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
        ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None),
        ("num_splits", 0), ("return_softmax_lse", False)],
}
# return_attn_probs=True: (out, softmax_lse, S_dmask); flashattn gives None
# for S_dmask. flash_attn_with_kvcache(return_softmax_lse=True): (out, lse).


def _ast_signatures():
    tree = ast.parse(open(MODULE).read())
    sigs = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in FA_SIGNATURES:
            a = node.args
            assert not a.posonlyargs and not a.kwonlyargs and a.vararg is None \
                and a.kwarg is None, node.name
            defaults = [REQUIRED] * (len(a.args) - len(a.defaults)) + [
                ast.literal_eval(d) for d in a.defaults]
            sigs[node.name] = [(p.arg, d) for p, d in zip(a.args, defaults)]
    return sigs


@pytest.mark.parametrize("name", sorted(FA_SIGNATURES))
def test_signature_matches_flash_attn(name):
    """Names, order and defaults, from the source (no torch needed)."""
    assert _ast_signatures().get(name) == FA_SIGNATURES[name]


def test_import_flashattn_never_imports_torch():
    code = ("import sys, flashattn; flashattn.Config(head_dim=32, num_heads_q=2); "
            "assert 'torch' not in sys.modules and 'flashattn.torch' not in sys.modules, "
            "[m for m in sys.modules if 'torch' in m]")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_flashattn_torch_without_torch_says_why():
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed (this checks the message when it is not)")
    with pytest.raises(ImportError, match="needs PyTorch"):
        import flashattn.torch  # noqa: F401


# ---- with PyTorch, on the CPU (the emulator) ---------------------------------------------

@pytest.fixture(scope="module")
def fat():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed (tools/setup.sh and CI do not install it)")
    import flashattn.torch as fat
    return fat


def _t(torch, g, shape, dtype):
    return torch.from_numpy(g.standard_normal(shape).astype(np.float32)).to(dtype)


def _np64(x):
    return x.float().numpy().astype(np.float64)


def _tol(torch, dtype):
    return 4e-3 if dtype == torch.float16 else 2.5e-2


def _check(torch, out, ref, dtype):
    assert torch.isfinite(out.float()).all()
    scale = max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(_np64(out) - np.nan_to_num(ref)).max())
    assert err <= _tol(torch, dtype) * scale, err


@pytest.mark.parametrize("dtype,hk,d,causal,window,softcap", [
    ("fp16", 4, 32, False, (-1, -1), 0.0),
    ("fp16", 2, 64, True, (-1, -1), 0.0),
    ("bf16", 1, 32, False, (8, 4), 0.0),
    ("fp16", 2, 36, True, (-1, -1), 5.0),   # head_dim 36: padded to 40 as FlashAttention does
])
def test_flash_attn_func_vs_reference(fat, dtype, hk, d, causal, window, softcap):
    import torch
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    g = rng(d + hk)
    B, Sq, Sk, H = 2, 19, 45, 4
    q, k, v = _t(torch, g, (B, Sq, H, d), tdt), _t(torch, g, (B, Sk, hk, d), tdt), \
        _t(torch, g, (B, Sk, hk, d), tdt)
    out, lse, probs = fat.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                          softcap=softcap, return_attn_probs=True)
    assert out.shape == (B, Sq, H, d) and out.dtype == tdt and probs is None
    assert lse.shape == (B, H, Sq) and lse.dtype == torch.float32
    ref, ref_lse = ref_attention(_np64(q), _np64(k), _np64(v), d ** -0.5, causal, window,
                                 softcap)
    _check(torch, out, ref, tdt)
    fin = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse.numpy()), fin)
    assert np.abs(lse.numpy()[fin] - ref_lse[fin]).max() < 2e-3 * max(1, np.abs(ref_lse).max())
    plain = fat.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap)
    assert torch.equal(plain, out)


def test_flash_attn_func_equals_c_api(fat, tmp_path):
    """Same kernel, same bits: flashattn.torch and fa.forward on NumPy."""
    import torch
    g = rng(3)
    q, k, v = (_t(torch, g, (1, 24, 2, 32), torch.float16) for _ in range(3))
    out = fat.flash_attn_func(q, k, v, softmax_scale=0.3, causal=True)
    with fa.Runtime(backend="emulator", cache="memory") as rt:
        cfg = fa.Config(head_dim=32, num_heads_q=2, causal=True, softmax_scale=0.3)
        ref = fa.forward(rt, cfg, q.numpy(), k.numpy(), v.numpy())
    assert np.array_equal(out.numpy(), ref)


def test_persistent_dynamic_forward(fat, monkeypatch):
    """flash_attn_func on an emulated sm_90 runtime made with
    FLASHATTN_SM90_PERSISTENT=1 (swapped in as runtime('cpu')): the
    persistent forward takes its work items from the binding's own workspace
    (160 items on 108 CTAs), equal to the fp64 reference and bit-identical to
    the same runtime without the policy, twice in a row on one workspace that
    the kernel leaves zero."""
    import torch
    monkeypatch.setenv("FLASHATTN_SM90_PERSISTENT", "1")
    dyn = fa.Runtime(backend="emulator", emulator_sm=90, cache="memory")
    monkeypatch.delenv("FLASHATTN_SM90_PERSISTENT")
    plain = fa.Runtime(backend="emulator", emulator_sm=90, cache="memory")
    g = rng(160)
    B, Sq, Sk, H, Hk, D = 5, 19, 45, 32, 8, 64
    q, k, v = (_t(torch, g, (B, s, h, D), torch.float16)
               for s, h in ((Sq, H), (Sk, Hk), (Sk, Hk)))
    ref, ref_lse = ref_attention(_np64(q), _np64(k), _np64(v), D ** -0.5, True)
    got = {}
    with dyn, plain:
        for name, r in (("plain", plain), ("dyn", dyn)):
            monkeypatch.setitem(fat._runtimes, ("cpu", 0), r)
            got[name] = [fat.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)[:2]
                         for _ in range(2)]
        ws = [val for key, val in dyn._workspaces.items() if key[0] == "forward"]
        assert len(ws) == 1 and ws[0][1] >= 8, dyn._workspaces
        counters = np.full(2, 7, np.uint32)
        dyn.memcpy_dtoh(counters, ws[0][0])
        assert counters.tolist() == [0, 0]
        assert not [key for key in plain._workspaces if key[0] == "forward"]
    for out, lse in got["dyn"]:
        _check(torch, out, ref, torch.float16)
        assert np.abs(lse.numpy() - ref_lse).max() < 2e-3 * max(1, np.abs(ref_lse).max())
        assert torch.equal(out, got["plain"][0][0]) and torch.equal(lse, got["plain"][0][1])


def test_packed_variants_equal_unpacked(fat):
    import torch
    g = rng(4)
    qkv = _t(torch, g, (2, 17, 3, 2, 32), torch.float16)
    q, k, v = qkv.unbind(2)
    ref = fat.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(fat.flash_attn_qkvpacked_func(qkv, causal=True), ref)
    assert torch.equal(fat.flash_attn_kvpacked_func(q, qkv[:, :, 1:], causal=True), ref)
    cu = torch.tensor([0, 17, 34], dtype=torch.int32)
    flat = qkv.reshape(34, 3, 2, 32)
    got = fat.flash_attn_varlen_qkvpacked_func(flat, cu, 17, causal=True)
    assert torch.equal(got.reshape(2, 17, 2, 32), ref)
    got = fat.flash_attn_varlen_kvpacked_func(flat[:, 0], flat[:, 1:], cu, cu, 17, 17,
                                              causal=True)
    assert torch.equal(got.reshape(2, 17, 2, 32), ref)


def test_varlen_vs_per_sequence(fat):
    import torch
    g = rng(5)
    lq, lk = [5, 0, 23], [9, 4, 23]
    H, Hk, D = 4, 2, 32
    q = _t(torch, g, (sum(lq), H, D), torch.bfloat16)
    k = _t(torch, g, (sum(lk), Hk, D), torch.bfloat16)
    v = _t(torch, g, (sum(lk), Hk, D), torch.bfloat16)
    cq = torch.tensor(np.cumsum([0] + lq), dtype=torch.int32)
    ck = torch.tensor(np.cumsum([0] + lk), dtype=torch.int32)
    out, lse, _ = fat.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), causal=True,
                                             return_attn_probs=True)
    assert out.shape == (sum(lq), H, D) and lse.shape == (H, sum(lq))
    for b in range(3):
        if not lq[b]:
            continue
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        ref, ref_lse = ref_attention(_np64(q[None, sq]), _np64(k[None, sk]), _np64(v[None, sk]),
                                     D ** -0.5, True)
        _check(torch, out[None, sq], ref, torch.bfloat16)
        got_lse = lse[:, sq].numpy()
        fin = np.isfinite(ref_lse[0])
        assert np.abs(got_lse[fin] - ref_lse[0][fin]).max() < 2e-3 * 10


def test_varlen_padded_rows(fat):
    """Rows of q past cu_seqlens_q[batch] (padding) are allowed, as in
    FlashAttention, when no LSE is asked for."""
    import torch
    g = rng(11)
    q = _t(torch, g, (12, 2, 32), torch.float16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    out = fat.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6)
    want = fat.flash_attn_varlen_func(q[:10], q[:10], q[:10], cu, cu, 6, 6)
    assert out.shape == (12, 2, 32) and torch.equal(out[:10], want)


def test_varlen_paged_kv(fat):
    """flash_attn_varlen_func with block_table: the queries are each
    sequence's last tokens over a paged cache; equal to the contiguous run."""
    import torch
    g = rng(6)
    H, Hk, D, page = 4, 2, 32, 8
    lq, lk = [3, 6], [21, 6]
    q = _t(torch, g, (sum(lq), H, D), torch.float16)
    kc = _t(torch, g, (2, 24, Hk, D), torch.float16)
    vc = _t(torch, g, (2, 24, Hk, D), torch.float16)
    table = torch.tensor([[4, 0, 2], [5, 1, 3]], dtype=torch.int32)
    kp = torch.zeros(6, page, Hk, D, dtype=torch.float16)
    vp = torch.zeros_like(kp)
    for b in range(2):
        for j in range(24):
            kp[table[b, j // page], j % page] = kc[b, j]
            vp[table[b, j // page], j % page] = vc[b, j]
    cq = torch.tensor(np.cumsum([0] + lq), dtype=torch.int32)
    ck = torch.tensor(np.cumsum([0] + lk), dtype=torch.int32)
    got = fat.flash_attn_varlen_func(q, kp, vp, cq, ck, max(lq), 24, causal=True,
                                     block_table=table)
    kflat = torch.cat([kc[0, :21], kc[1, :6]])
    vflat = torch.cat([vc[0, :21], vc[1, :6]])
    want = fat.flash_attn_varlen_func(q, kflat, vflat, cq, ck, max(lq), max(lk), causal=True)
    assert (got.float() - want.float()).abs().max() < 2e-3


@pytest.mark.parametrize("layout", ["contiguous", "paged", "batch_idx"])
def test_with_kvcache(fat, layout):
    import torch
    g = rng(7)
    B, Sq, H, Hk, D, Smax, page = 3, 2, 4, 2, 32, 40, 8
    q = _t(torch, g, (B, Sq, H, D), torch.float16)
    kc = _t(torch, g, (B, Smax, Hk, D), torch.float16)
    vc = _t(torch, g, (B, Smax, Hk, D), torch.float16)
    lens = torch.tensor([7, 40, 19], dtype=torch.int32)
    kw = {}
    if layout == "paged":
        pages = Smax // page
        table = torch.randperm(B * pages, generator=torch.Generator().manual_seed(0))
        table = table.reshape(B, pages).to(torch.int32)
        kp = torch.empty(B * pages, page, Hk, D, dtype=torch.float16)
        vp = torch.empty_like(kp)
        for b in range(B):
            for j in range(Smax):
                kp[table[b, j // page], j % page] = kc[b, j]
                vp[table[b, j // page], j % page] = vc[b, j]
        args, kw["block_table"] = (q, kp, vp), table
    elif layout == "batch_idx":
        idx = torch.tensor([2, 0, 1], dtype=torch.int32)
        perm = torch.empty_like(kc), torch.empty_like(vc)
        for b in range(B):
            perm[0][idx[b]], perm[1][idx[b]] = kc[b], vc[b]
        args, kw["cache_batch_idx"] = (q, perm[0], perm[1]), idx
    else:
        args = (q, kc, vc)
    out, lse = fat.flash_attn_with_kvcache(*args, cache_seqlens=lens, causal=True,
                                           return_softmax_lse=True, **kw)
    assert out.shape == (B, Sq, H, D) and lse.shape == (B, H, Sq)
    ref, ref_lse = ref_attention(_np64(q), _np64(kc), _np64(vc), D ** -0.5, True,
                                 seqlens_k=lens.numpy())
    _check(torch, out, ref, torch.float16)
    assert np.abs(lse.numpy() - ref_lse).max() < 2e-2
    one = fat.flash_attn_with_kvcache(*args, cache_seqlens=lens, causal=True, num_splits=1,
                                      **kw)
    assert (one.float() - out.float()).abs().max() < 2e-3


def test_with_kvcache_int_and_default_seqlens(fat):
    import torch
    g = rng(8)
    q = _t(torch, g, (2, 1, 2, 32), torch.float16)
    kc = _t(torch, g, (2, 24, 2, 32), torch.float16)
    vc = _t(torch, g, (2, 24, 2, 32), torch.float16)
    full = fat.flash_attn_with_kvcache(q, kc, vc)
    assert torch.equal(full, fat.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=24))
    part = fat.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=9)
    ref, _ = ref_attention(_np64(q), _np64(kc[:, :9]), _np64(vc[:, :9]), 32 ** -0.5)
    _check(torch, part, ref, torch.float16)


def test_unsupported_arguments_are_named(fat):
    import torch
    q = torch.zeros(1, 8, 2, 32, dtype=torch.float16)
    cases = [
        (lambda: fat.flash_attn_func(q, q, q, dropout_p=0.1), "dropout_p"),
        (lambda: fat.flash_attn_with_kvcache(q, q, q, cache_leftpad=torch.zeros(1)),
         "cache_leftpad"),
    ]
    for call, name in cases:
        with pytest.raises(NotImplementedError, match=name):
            call()
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        fat.flash_attn_func(q.float(), q.float(), q.float())
    with pytest.raises(TypeError, match="alibi_slopes must be float32"):
        fat.flash_attn_func(q, q, q, alibi_slopes=torch.zeros(2, dtype=torch.float16))
    bad = [  # the append's arguments come together, and need the lengths before it
        (lambda: fat.flash_attn_with_kvcache(q, q, q, k=q[:, :1]), "k and v"),
        (lambda: fat.flash_attn_with_kvcache(q, q, q, k=q[:, :1], v=q[:, :1]), "cache_seqlens"),
        (lambda: fat.flash_attn_with_kvcache(q, q, q, rotary_cos=q), "rotary_sin"),
        (lambda: fat.flash_attn_with_kvcache(q, q, q, rotary_cos=q, rotary_sin=q), "pass k"),
    ]
    for call, name in bad:
        with pytest.raises(ValueError, match=name):
            call()


def _mixed_dtype_calls(fat, torch, device):
    """(function name, the argument that differs, call) for every public
    function, each with one tensor whose dtype is not q's."""
    f16, b16, f32 = torch.float16, torch.bfloat16, torch.float32

    def t(*shape, dtype=f16):
        return torch.zeros(*shape, dtype=dtype, device=device)

    q = t(2, 8, 4, 32)
    qb = q.to(b16)
    cu = torch.tensor([0, 8, 16], dtype=torch.int32, device=device)
    flat = t(16, 4, 32)
    lens = torch.tensor([3, 5], dtype=torch.int32, device=device)
    kc = t(2, 16, 4, 32)
    return [
        ("flash_attn_func", "k", lambda: fat.flash_attn_func(qb, q, q)),  # the issue's
        ("flash_attn_func", "k", lambda: fat.flash_attn_func(q, q.float(), q.float())),
        ("flash_attn_func", "v", lambda: fat.flash_attn_func(q, q, qb)),
        ("flash_attn_kvpacked_func", "kv", lambda: fat.flash_attn_kvpacked_func(
            qb, t(2, 8, 2, 4, 32))),
        ("flash_attn_varlen_func", "k", lambda: fat.flash_attn_varlen_func(
            flat, flat.float(), flat, cu, cu, 8, 8)),
        ("flash_attn_varlen_func", "v", lambda: fat.flash_attn_varlen_func(
            flat, flat, flat.to(b16), cu, cu, 8, 8)),
        ("flash_attn_varlen_kvpacked_func", "kv", lambda: fat.flash_attn_varlen_kvpacked_func(
            flat.to(b16), t(16, 2, 4, 32), cu, cu, 8, 8)),
        ("flash_attn_with_kvcache", "k_cache", lambda: fat.flash_attn_with_kvcache(
            qb[:, :1], kc, kc.to(b16), cache_seqlens=lens)),   # an fp16 cache, bf16 q
        ("flash_attn_with_kvcache", "v_cache", lambda: fat.flash_attn_with_kvcache(
            q[:, :1], kc, kc.float(), cache_seqlens=lens)),
        ("flash_attn_with_kvcache", "k", lambda: fat.flash_attn_with_kvcache(
            q[:, :1], kc, kc, k=t(2, 1, 4, 32, dtype=b16), v=t(2, 1, 4, 32),
            cache_seqlens=lens)),
        ("flash_attn_with_kvcache", "v", lambda: fat.flash_attn_with_kvcache(
            q[:, :1], kc, kc, k=t(2, 1, 4, 32), v=t(2, 1, 4, 32, dtype=f32),
            cache_seqlens=lens)),
        ("flash_attn_with_kvcache", "rotary_cos", lambda: fat.flash_attn_with_kvcache(
            qb[:, :1], kc.to(b16), kc.to(b16), k=t(2, 1, 4, 32, dtype=b16),
            v=t(2, 1, 4, 32, dtype=b16), rotary_cos=t(16, 8), rotary_sin=t(16, 8),
            cache_seqlens=lens)),
    ]


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_mixed_dtypes_raise_before_dispatch(fat, device, monkeypatch):
    """Every function checks k/v (and the caches, the new k/v, the rotary
    tables) against q's dtype and raises TypeError naming the function and
    the argument before any op is dispatched, on every device: the CPU path
    no longer converts them silently (FlashAttention: "query and key must
    have the same dtype")."""
    import torch
    dispatched = []
    for op in ("fwd", "decode", "decode_append"):
        monkeypatch.setattr(torch.ops.flashattn_rt, op,
                            lambda *a, _op=op, **k: dispatched.append(_op))
    calls = _mixed_dtype_calls(fat, torch, device)
    assert {c[0] for c in calls} | {"flash_attn_qkvpacked_func",
                                    "flash_attn_varlen_qkvpacked_func"} == set(FA_SIGNATURES)
    for fn, arg, call in calls:
        with pytest.raises(TypeError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith("flashattn.torch.%s: %s " % (fn, arg)), msg
        assert "dtype" in msg, msg
    assert dispatched == []


@pytest.mark.parametrize("causal,per_seq", [(True, False), (False, True)])
def test_alibi_vs_reference(fat, causal, per_seq):
    """alibi_slopes (FlashAttention's: fp32 (nheads,) or (batch, nheads)) in
    flash_attn_func and flash_attn_with_kvcache, against the fp64 reference."""
    import torch
    g = rng(31 + causal)
    B, Sq, Sk, H, Hk, D = 2, 9, 37, 4, 2, 32
    q = _t(torch, g, (B, Sq, H, D), torch.float16)
    k = _t(torch, g, (B, Sk, Hk, D), torch.float16)
    v = _t(torch, g, (B, Sk, Hk, D), torch.float16)
    slopes = torch.from_numpy(g.uniform(0.01, 0.5, (B, H) if per_seq else (H,)).astype(np.float32))
    out = fat.flash_attn_func(q, k, v, causal=causal, alibi_slopes=slopes)
    ref, _ = ref_attention(_np64(q), _np64(k), _np64(v), D ** -0.5, causal,
                           alibi=slopes.numpy())
    _check(torch, out, ref, torch.float16)
    noalibi, _ = ref_attention(_np64(q), _np64(k), _np64(v), D ** -0.5, causal)
    assert np.abs(ref - noalibi).max() > 10 * _tol(torch, torch.float16)  # the bias matters
    lens = torch.tensor([Sk, 20], dtype=torch.int32)
    outd = fat.flash_attn_with_kvcache(q[:, -1:], k, v, cache_seqlens=lens, alibi_slopes=slopes)
    refd, _ = ref_attention(_np64(q[:, -1:]), _np64(k), _np64(v), D ** -0.5,
                            seqlens_k=lens.numpy(), alibi=slopes.numpy())
    _check(torch, outd, refd, torch.float16)


@pytest.mark.parametrize("interleaved,paged", [(True, False), (False, True)])
def test_with_kvcache_append_rotary(fat, interleaved, paged):
    """k/v with rotary_cos/rotary_sin: the caches updated in place (the new
    rows rotated), Q rotated at cache_seqlens + i, against fp64."""
    import torch
    from conftest import rope, rope_tables as tables
    g = rng(40 + 2 * interleaved + paged)
    B, Sq, H, Hk, D, Smax, RD, PS = 2, 2, 4, 2, 32, 32, 16, 8
    q = _t(torch, g, (B, Sq, H, D), torch.float16)
    kc = _t(torch, g, (B, Smax, Hk, D), torch.float16)
    vc = _t(torch, g, (B, Smax, Hk, D), torch.float16)
    kn = _t(torch, g, (B, Sq, Hk, D), torch.float16)
    vn = _t(torch, g, (B, Sq, Hk, D), torch.float16)
    lens = np.array([20, 3], np.int32)
    cos, sin = tables(Smax, RD)
    pos = lens[:, None] + np.arange(Sq)[None, :]
    want_k, want_v = _np64(kc), _np64(vc)
    for b in range(B):
        want_k[b, lens[b]:lens[b] + Sq] = rope(kn[b].float().numpy(), pos[b][:, None], cos, sin,
                                               interleaved)
        want_v[b, lens[b]:lens[b] + Sq] = _np64(vn[b])
    q_rot = np.stack([rope(q[b].float().numpy(), pos[b][:, None], cos, sin, interleaved)
                      for b in range(B)])
    ref, _ = ref_attention(q_rot, want_k, want_v, D ** -0.5, True, seqlens_k=lens + Sq)
    kw = dict(k=kn, v=vn, rotary_cos=torch.from_numpy(cos), rotary_sin=torch.from_numpy(sin),
              cache_seqlens=torch.from_numpy(lens), causal=True, rotary_interleaved=interleaved)
    if paged:
        pages = Smax // PS
        table = torch.randperm(B * pages, generator=torch.Generator().manual_seed(1))
        table = table.reshape(B, pages).to(torch.int32)
        kp = kc.reshape(B * pages, PS, Hk, D)[torch.argsort(table.reshape(-1))].clone()
        vp = vc.reshape(B * pages, PS, Hk, D)[torch.argsort(table.reshape(-1))].clone()
        out = fat.flash_attn_with_kvcache(q, kp, vp, block_table=table, **kw)
        got_k = kp[table.reshape(-1).long()].reshape(B, Smax, Hk, D)
        got_v = vp[table.reshape(-1).long()].reshape(B, Smax, Hk, D)
    else:
        out = fat.flash_attn_with_kvcache(q, kc, vc, **kw)
        got_k, got_v = kc, vc
    _check(torch, out, ref, torch.float16)
    step = np.abs(want_k).max() * 2.0 ** -10  # within one fp16 step of the fp64 rotation
    assert np.abs(_np64(got_k) - want_k).max() <= step
    assert np.array_equal(_np64(got_v), want_v)


def test_kvcache_backward_raises(fat):
    """flash_attn_with_kvcache has no backward pass (as FlashAttention's): the
    forward works on tensors that require grad, a backward raises naming it.
    (The training functions' backward: test_torch_backward.py.)"""
    import torch
    g = rng(9)
    q = _t(torch, g, (1, 1, 2, 32), torch.float16).requires_grad_()
    k = _t(torch, g, (1, 8, 2, 32), torch.float16)
    out = fat.flash_attn_with_kvcache(q, k, k)
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="flash_attn_with_kvcache: no backward pass"):
        out.float().sum().backward()


def test_fake_tensor_shapes(fat):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 100, 8, 36, dtype=torch.bfloat16)
        k = torch.empty(2, 300, 2, 36, dtype=torch.bfloat16)
        out, lse, _ = fat.flash_attn_func(q, k, k, causal=True, return_attn_probs=True)
        assert out.shape == (2, 100, 8, 36) and out.dtype == torch.bfloat16
        assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
        qv = torch.empty(70, 8, 64, dtype=torch.float16)
        kv = torch.empty(90, 2, 64, dtype=torch.float16)
        vv = torch.empty(90, 2, 32, dtype=torch.float16)  # head_dim_v != head_dim
        cu = torch.empty(4, dtype=torch.int32)
        out, lse, _ = fat.flash_attn_varlen_func(qv, kv, vv, cu, cu, 40, 50,
                                                 return_attn_probs=True)
        assert out.shape == (70, 8, 32) and lse.shape == (8, 70)
        pages = torch.empty(11, 16, 2, 64, dtype=torch.float16)
        out, lse = fat.flash_attn_with_kvcache(
            torch.empty(3, 1, 8, 64, dtype=torch.float16), pages, pages,
            cache_seqlens=torch.empty(3, dtype=torch.int32),
            block_table=torch.empty(3, 4, dtype=torch.int32), return_softmax_lse=True)
        assert out.shape == (3, 1, 8, 64) and lse.shape == (3, 8, 1)
    meta = torch.empty(1, 5, 4, 64, dtype=torch.float16, device="meta")
    assert fat.flash_attn_func(meta, meta[:, :, :2], meta[:, :, :2]).shape == (1, 5, 4, 64)


def test_opcheck(fat):
    """torch.library.opcheck: schema, fake implementation and autograd
    registration agree with the real implementation (CPU, the emulator)."""
    import torch
    g = rng(10)
    q = _t(torch, g, (1, 16, 2, 32), torch.float16)
    for lse in (True, False):
        args = (q, q, q, None, None, None, None, 0, 0, 0.2, True, -1, -1, 0.0, lse)
        torch.library.opcheck(torch.ops.flashattn_rt.fwd.default, args,
                              test_utils=("test_schema", "test_autograd_registration",
                                          "test_faketensor"))
    lens = torch.tensor([9], dtype=torch.int32)
    torch.library.opcheck(torch.ops.flashattn_rt.decode.default,
                          (q[:, :1], q, q, lens, None, 0.2, False, -1, -1, 0.0, 0),
                          test_utils=("test_schema", "test_faketensor"))
    # The append mutates the caches, as its schema declares.
    kc, vc = q.clone(), q.clone()
    torch.library.opcheck(torch.ops.flashattn_rt.decode_append.default,
                          (q[:, :1], kc, vc, lens, None, 0.2, True, -1, -1, 0.0, 0, None,
                           q[:, :1], q[:, :1], None, None, False),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph(fat):
    """A transformer attention block traced by torch.compile(fullgraph=True)
    (aot_eager: the tracing, without compiling C++ here) equals eager."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self, dim=64, heads=2):
            super().__init__()
            self.heads = heads
            self.qkv = torch.nn.Linear(dim, 3 * dim, dtype=torch.float16)
            self.proj = torch.nn.Linear(dim, dim, dtype=torch.float16)

        def forward(self, x):
            b, s, dim = x.shape
            qkv = self.qkv(x).view(b, s, 3, self.heads, dim // self.heads)
            o = fat.flash_attn_qkvpacked_func(qkv, causal=True)
            return self.proj(o.reshape(b, s, dim))

    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(2, 24, 64).to(torch.float16)
    with torch.no_grad():
        want = block(x)
        torch._dynamo.reset()
        got = torch.compile(block, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(got, want)


def test_emulator_fallback_warns_once(fat):
    """The first call on CPU tensors says (one RuntimeWarning per process)
    that the emulator runs them; runtime(device).info names the backend.
    In a child process, so that no earlier test has made the CPU runtime."""
    code = """if True:
        import warnings, torch
        warnings.simplefilter("always")
        import flashattn.torch as fat
        q = torch.randn(1, 8, 2, 32).half()
        with warnings.catch_warnings(record=True) as w:
            fat.flash_attn_func(q, q, q)
            fat.flash_attn_with_kvcache(q[:, :1], q, q)
            fat.flash_attn_func(q, q, q, causal=True)
        emu = [x for x in w if issubclass(x.category, RuntimeWarning)
               and "emulator" in str(x.message)]
        assert len(emu) == 1, [str(x.message) for x in w]
        assert emu[0].filename == "<string>" and emu[0].lineno == 7, (emu[0].filename,
                                                                      emu[0].lineno)
        assert fat.runtime("cpu").info.backend == "emulator"
        print("ok")
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr

"""On a CUDA GPU with PyTorch: forward on torch tensors and torch's current
stream against torch.nn.functional.scaled_dot_product_attention."""

import pytest

import flashattn as fa


def _torch_cuda():
    try:
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to PyTorch")
    try:
        r = fa.Runtime(backend="cuda", cache="memory")
    except fa.Error as e:
        pytest.skip("flashattn has no CUDA device: %s" % e)
    return torch, r


@pytest.mark.parametrize("dtype,causal,hk", [("fp16", False, 8), ("bf16", True, 2)])
def test_forward_matches_torch_sdpa(dtype, causal, hk):
    torch, r = _torch_cuda()
    with r:
        tdt = torch.float16 if dtype == "fp16" else torch.bfloat16
        B, Sq, Sk, H, D = 2, 129, 257, 8, 64
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, Sq, H, D, device="cuda", dtype=tdt, generator=g)
        k = torch.randn(B, Sk, hk, D, device="cuda", dtype=tdt, generator=g)
        v = torch.randn(B, Sk, hk, D, device="cuda", dtype=tdt, generator=g)
        cfg = fa.Config(dtype=dtype, head_dim=D, num_heads_q=H, num_heads_kv=hk, causal=causal)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            out = torch.full((B, Sq, H, D), float("nan"), device="cuda", dtype=tdt)
            o = fa.forward(r, cfg, q, k, v, out=out)  # CAI stream (fp16) or DLPack (bf16)
            assert o is out
        torch.cuda.synchronize()
        kk = k.repeat_interleave(H // hk, dim=2)
        vv = v.repeat_interleave(H // hk, dim=2)
        mask = None
        if causal:  # bottom-right aligned
            i = torch.arange(Sq, device="cuda")[:, None]
            j = torch.arange(Sk, device="cuda")[None, :]
            mask = j <= i + Sk - Sq
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2).float(), kk.transpose(1, 2).float(), vv.transpose(1, 2).float(),
            attn_mask=mask).transpose(1, 2)
        err = (out.float() - ref).abs().max().item()
        assert torch.isfinite(out).all()
        assert err < (4e-3 if dtype == "fp16" else 2.5e-2), err
        o2 = fa.forward(r, cfg, q, k, v)
        torch.cuda.synchronize()
        assert isinstance(o2, torch.Tensor) and o2.dtype == tdt


def test_cuda_backend_numpy_and_device_arrays():
    """Without PyTorch: the cuda backend through NumPy staging and through
    DeviceArrays on an explicit stream (NULL), against the fp64 reference."""
    import numpy as np

    from conftest import ref_attention, rng

    try:
        r = fa.Runtime(backend="cuda", cache="memory")
    except (fa.NoDriverError, fa.NoDeviceError, fa.CudaError) as e:
        pytest.skip("no CUDA device: %s" % e.message)
    with r:
        assert r.info.backend == "cuda" and r.info.sm >= 80
        cfg = fa.Config(head_dim=64, num_heads_q=8, num_heads_kv=2, causal=True)
        g = rng(20)
        q = g.standard_normal((2, 77, 8, 64)).astype(np.float16)
        k = g.standard_normal((2, 131, 2, 64)).astype(np.float16)
        v = g.standard_normal((2, 131, 2, 64)).astype(np.float16)
        ref, ref_lse = ref_attention(q, k, v, 0.125, causal=True)
        o, lse = fa.forward(r, cfg, q, k, v, return_lse=True)
        assert np.abs(o - ref).max() < 4e-3 and np.abs(lse - ref_lse).max() < 1e-3
        dq, dk, dv = r.upload(q), r.upload(k), r.upload(v)
        do = r.upload(np.full(q.shape, np.nan, np.float16))
        fa.forward(r, cfg, dq, dk, dv, out=do, stream=0)
        r.synchronize(0)
        assert np.abs(do.numpy() - ref).max() < 4e-3

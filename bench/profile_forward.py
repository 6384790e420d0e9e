#!/usr/bin/env python3
"""A forward pass to profile with ncu: bf16, batch 4, seqlen 4096, 16 heads,
head_dim 128 (bench_sdpa's grid point), non-causal; flashattn then (with
--sdpa) torch SDPA on the cuDNN backend, 3 runs each.

    ncu --clock-control none -k regex:fa_forward -s 2 -c 1 python3 bench/profile_forward.py
"""
import sys

import torch

sys.path.insert(0, "bindings/python")
import flashattn as fa  # noqa: E402

B, S, H, D = 4, 4096, 16, 128
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
           for _ in range(3))
if "--sdpa" in sys.argv:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(3):
            torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
else:
    rt = fa.Runtime(backend="cuda", cache="memory")
    cfg = fa.Config(dtype="bf16", head_dim=D, num_heads_q=H, num_heads_kv=H)
    out = torch.empty_like(q)
    for _ in range(3):
        fa.forward(rt, cfg, q, k, v, out=out)
    try:
        print("kernels:", rt.cache_list())
    except Exception as ex:  # the listing is a convenience
        print("cache_list:", ex)
torch.cuda.synchronize()
print("done")

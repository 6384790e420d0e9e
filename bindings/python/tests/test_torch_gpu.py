"""flashattn.torch on a CUDA GPU (skipped without PyTorch, a GPU, or
flashattn's cuda backend): results equal to the C API's (fa.forward /
fa.decode on the same tensors) and close to PyTorch's SDPA, the current
stream, torch.compile(fullgraph=True) with Inductor over a model block, and
CUDA graphs captured once and replayed with new inputs; the training backward
against SDPA's gradients and fa.backward (library 0.9)."""

import pytest

import flashattn as fa


@pytest.fixture(scope="module")
def env():
    try:
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to PyTorch")
    try:
        import flashattn.torch as fat
        rt = fat.runtime("cuda")
    except fa.Error as e:
        pytest.skip("flashattn has no CUDA device: %s" % e)
    return torch, fat, rt


def _sdpa(torch, q, k, v, causal):
    """fp32 reference, GQA expanded, bottom-right causal."""
    h, hk = q.shape[2], k.shape[2]
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    mask = None
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        mask = j <= i + sk - sq
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
        attn_mask=mask).transpose(1, 2)


@pytest.mark.parametrize("dtype,hk,d,causal", [("fp16", 8, 64, False), ("bf16", 2, 128, True),
                                              ("fp16", 4, 96, True)])
def test_func_equals_c_api_and_sdpa(env, dtype, hk, d, causal):
    torch, fat, rt = env
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 200, 8, d, device="cuda", dtype=tdt, generator=g)
    k = torch.randn(2, 333, hk, d, device="cuda", dtype=tdt, generator=g)
    v = torch.randn(2, 333, hk, d, device="cuda", dtype=tdt, generator=g)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # runs on the current stream
        out, lse, _ = fat.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    side.synchronize()
    cfg = fa.Config(dtype=dtype, head_dim=d, num_heads_q=8, num_heads_kv=hk, causal=causal)
    want, want_lse = fa.forward(rt, cfg, q, k, v, return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    err = (out.float() - _sdpa(torch, q, k, v, causal)).abs().max().item()
    assert err < (4e-3 if dtype == "fp16" else 2.5e-2), err


def test_varlen_and_kvcache_equal_c_api(env):
    torch, fat, rt = env
    g = torch.Generator(device="cuda").manual_seed(1)
    lens = [37, 1, 250]
    cu = torch.tensor([0, 37, 38, 288], dtype=torch.int32, device="cuda")
    q = torch.randn(288, 8, 64, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(288, 2, 64, device="cuda", dtype=torch.float16, generator=g)
    out = fat.flash_attn_varlen_func(q, k, k, cu, cu, max(lens), max(lens), causal=True)
    cfg = fa.Config(head_dim=64, num_heads_q=8, num_heads_kv=2, causal=True)
    want = fa.forward(rt, cfg, q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cu,
                      max_seqlen_q=max(lens), max_seqlen_k=max(lens))
    torch.cuda.synchronize()
    assert torch.equal(out, want)

    qd = torch.randn(3, 1, 8, 64, device="cuda", dtype=torch.float16, generator=g)
    kc = torch.randn(3, 512, 2, 64, device="cuda", dtype=torch.float16, generator=g)
    vc = torch.randn(3, 512, 2, 64, device="cuda", dtype=torch.float16, generator=g)
    seqlens = torch.tensor([5, 512, 300], dtype=torch.int32, device="cuda")
    out, lse = fat.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens, causal=True,
                                           return_softmax_lse=True)
    want, want_lse = fa.decode(rt, cfg, qd, kc, vc, seqlens)
    torch.cuda.synchronize()
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_torch_compile_inductor_fullgraph(env):
    torch, fat, _ = env

    class Block(torch.nn.Module):
        def __init__(self, dim=512, heads=8, kv_heads=2):
            super().__init__()
            self.h, self.hk, self.d = heads, kv_heads, dim // heads
            self.q = torch.nn.Linear(dim, dim)
            self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.d)
            self.o = torch.nn.Linear(dim, dim)
            self.norm = torch.nn.LayerNorm(dim)

        def forward(self, x):
            b, s, _ = x.shape
            y = self.norm(x)
            q = self.q(y).view(b, s, self.h, self.d)
            kv = self.kv(y).view(b, s, 2, self.hk, self.d)
            a = fat.flash_attn_kvpacked_func(q, kv, causal=True)
            return x + self.o(a.reshape(b, s, -1))

    torch.manual_seed(0)
    block = Block().cuda().half().eval()
    x = torch.randn(2, 256, 512, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        want = block(x)
        torch._dynamo.reset()
        compiled = torch.compile(block, fullgraph=True)
        got = compiled(x)
        got2 = compiled(x + 1)
        want2 = block(x + 1)
    assert (got.float() - want.float()).abs().max().item() < 2e-2
    assert (got2.float() - want2.float()).abs().max().item() < 2e-2


def test_cuda_graph_replay_with_new_inputs(env):
    torch, fat, _ = env
    g = torch.Generator(device="cuda").manual_seed(2)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float16, generator=g)

    q, k, v = rand(2, 128, 8, 64), rand(2, 384, 2, 64), rand(2, 384, 2, 64)
    qd, kc, vc = rand(4, 1, 8, 64), rand(4, 1024, 2, 64), rand(4, 1024, 2, 64)
    lens = torch.tensor([1, 1024, 77, 500], dtype=torch.int32, device="cuda")

    def step():
        o1 = fat.flash_attn_func(q, k, v, causal=True)
        o2, lse2 = fat.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens,
                                               return_softmax_lse=True)
        return o1, o2, lse2

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels compiled and loaded
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for seed in range(3):
        g.manual_seed(100 + seed)
        for t in (q, k, v, qd, kc, vc):
            t.copy_(torch.randn(t.shape, device="cuda", dtype=t.dtype, generator=g))
        lens.copy_(torch.tensor([3 + seed, 1000, 64 * (seed + 1), 1], dtype=torch.int32))
        graph.replay()
        want = step()
        torch.cuda.synchronize()
        for got, exp in zip(static, want):
            assert torch.equal(got, exp)


def test_compile_reduce_overhead(env):
    """torch.compile's CUDA-graph mode (Inductor cudagraph trees)."""
    torch, fat, _ = env

    def attn(q, k, v):
        return fat.flash_attn_func(q, k, v, causal=True) * 0.5

    q = torch.randn(1, 64, 4, 64, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    f = torch.compile(attn, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        got = f(q, q, q).clone()
    assert torch.equal(got, attn(q, q, q))


def test_persistent_dynamic_forward(env, monkeypatch):
    """On an sm_90 GPU, a runtime made with FLASHATTN_SM90_PERSISTENT=1
    (swapped in as runtime('cuda')) runs the persistent forward, which takes
    its work items (512, more than the SMs) from the workspace flashattn.torch
    makes with torch.zeros, one per stream: bit-identical to fa.forward on the
    runtime without the policy, on the default stream and on two side
    streams, every workspace zero afterwards; a workspace left non-zero skips
    items (the dynamic order ran); a captured CUDA graph replays right."""
    torch, fat, rt = env
    if rt.info.sm != 90:
        pytest.skip("the persistent forward is sm_90a's; this GPU is sm_%d" % rt.info.sm)
    idx = torch.cuda.current_device()
    monkeypatch.setenv("FLASHATTN_SM90_PERSISTENT", "1")
    dyn = fa.Runtime(backend="cuda", device=idx)
    monkeypatch.delenv("FLASHATTN_SM90_PERSISTENT")
    monkeypatch.setitem(fat._runtimes, ("cuda", idx), dyn)
    monkeypatch.setattr(fat, "_forward_workspaces", {})
    g = torch.Generator(device="cuda").manual_seed(27)
    q = torch.randn(4, 1000, 16, 128, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(4, 1000, 4, 128, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(4, 1000, 4, 128, device="cuda", dtype=torch.float16, generator=g)
    cfg = fa.Config(dtype="fp16", head_dim=128, num_heads_q=16, num_heads_kv=4, causal=True)
    with dyn:
        want = fa.forward(rt, cfg, q, k, v)
        sides = [torch.cuda.Stream(), torch.cuda.Stream()]
        outs = [fat.flash_attn_func(q, k, v, causal=True)]
        for s in sides:
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                outs += [fat.flash_attn_func(q, k, v, causal=True) for _ in range(2)]
        torch.cuda.synchronize()
        for out in outs:
            assert torch.equal(out, want)
        ws = fat._forward_workspaces
        assert sorted(key[1] for key in ws) == sorted(
            [torch.cuda.current_stream().cuda_stream] + [s.cuda_stream for s in sides])
        assert all(int(w.count_nonzero()) == 0 for w in ws.values())
        counter = ws[(idx, torch.cuda.current_stream().cuda_stream)]
        counter.view(torch.int32)[0] = 5
        assert not torch.equal(fat.flash_attn_func(q, k, v, causal=True), want)
        counter.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = fat.flash_attn_func(q, k, v, causal=True)
        assert len(ws) == 3  # capture makes its own workspace, not cached
        for _ in range(2):
            static.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static, want)
        del graph


@pytest.mark.parametrize("dtype,hk,d,causal", [("fp16", 2, 64, True), ("bf16", 4, 128, False)])
def test_backward_vs_sdpa_and_c_api(env, dtype, hk, d, causal):
    """The training backward (library 0.9) on the GPU, on a side stream:
    gradients within bf16/fp16 tolerance of fp32 SDPA's, and bit for bit
    fa.backward's on the same tensors (deterministic=True)."""
    torch, fat, rt = env
    if not fa._lib.has_backward():
        pytest.skip("the loaded libflashattn has no fa_backward (before 0.9)")
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(2, 150, 8, d, device="cuda", dtype=tdt, generator=g)
    k = torch.randn(2, 230, hk, d, device="cuda", dtype=tdt, generator=g)
    v = torch.randn(2, 230, hk, d, device="cuda", dtype=tdt, generator=g)
    dout = torch.randn(2, 150, 8, d, device="cuda", dtype=tdt, generator=g)
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fat.flash_attn_func(*xs, causal=causal, deterministic=True)
        out.backward(dout)
    side.synchronize()
    refs = [t.float().clone().requires_grad_() for t in (q, k, v)]
    _sdpa(torch, *refs, causal).backward(dout.float())
    tol = 1e-2 if dtype == "fp16" else 4e-2
    for x, r in zip(xs, refs):
        err = (x.grad.float() - r.grad).abs().max().item()
        assert err <= tol * r.grad.abs().max().item(), err
    cfg = fa.Config(dtype=dtype, head_dim=d, num_heads_q=8, num_heads_kv=hk, causal=causal)
    o, lse = fa.forward(rt, cfg, q, k, v, return_lse=True)
    dq, dk, dv = fa.backward(rt, cfg, q, k, v, o, lse, dout, deterministic=True)
    torch.cuda.synchronize()
    assert all(torch.equal(x.grad, y) for x, y in zip(xs, (dq, dk, dv)))

"""flashattn.torch's backward pass (library 0.9, fa_backward) on CPU tensors
through the emulator: gradients of flash_attn_func, flash_attn_varlen_func and
the packed forms against torch's SDPA in float64 (a float64 softmax where SDPA
has no softcap), deterministic bits, a tiny transformer trained 20 steps
with flashattn and with SDPA (the same loss curve and gradients within bf16
tolerance), one training step under torch.compile(fullgraph=True), the
backward op's schema and fake, and the arguments without a backward.

Needs PyTorch (skipped without it) and a library with fa_backward (skipped,
with the reason, before 0.9). The training test is marked `slow` (about
half the file's time)."""

import numpy as np
import pytest

from conftest import rng
from flashattn import _lib

torch = pytest.importorskip("torch")
F = torch.nn.functional
fat = pytest.importorskip("flashattn.torch")

pytestmark = pytest.mark.skipif(not _lib.has_backward(),
                                reason="the loaded libflashattn has no fa_backward (before 0.9)")

# max |got - ref| <= tol * max |ref| per gradient: the kernels round P and dS
# to the input dtype before the tensor-core products (FlashAttention-2).
GRAD_TOL = {torch.float16: 1e-2, torch.bfloat16: 4e-2}


def _rand(g, shape, dtype):
    return torch.from_numpy(g.standard_normal(shape).astype(np.float32)).to(dtype)


def _mask(sq, sk, causal, window):
    """[sq, sk] bool, bottom-right aligned (flashattn.h, Semantics)."""
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    shift = sk - sq
    wl, wr = window
    if causal:
        wr = 0 if wr < 0 else min(wr, 0)
    m = torch.ones(sq, sk, dtype=torch.bool)
    if wl >= 0:
        m &= j >= i + shift - wl
    if wr >= 0:
        m &= j <= i + shift + wr
    return m


def _ref(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0, alibi=None):
    """O [B, Sq, H, Dv] in float64 from float64 q/k/v (autograd-able):
    torch's SDPA with the mask (and ALiBi) as an additive float mask and
    enable_gqa; with softcap, the same math written out (SDPA has none)."""
    B, Sq, H, _ = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    m = _mask(Sq, Sk, causal, window)
    bias = torch.zeros(H, Sq, Sk, dtype=torch.float64).masked_fill(~m, float("-inf"))
    if alibi is not None:
        dist = (torch.arange(Sq)[:, None] + Sk - Sq - torch.arange(Sk)[None, :]).abs()
        bias = bias - alibi.double()[:, None, None] * dist
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    if softcap == 0:
        return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias, scale=scale,
                                              enable_gqa=H != Hk).transpose(1, 2)
    kt, vt = (x.repeat_interleave(H // Hk, dim=1) for x in (kt, vt))
    s = softcap * torch.tanh(qt @ kt.transpose(-1, -2) * scale / softcap) + bias
    return (torch.softmax(s, dim=-1) @ vt).transpose(1, 2)


def _ref_grads(tensors, dout, **kw):
    """float64 gradients of _ref at the (rounded) values of tensors."""
    xs = [t.detach().double().requires_grad_() for t in tensors]
    _ref(*xs, **kw).backward(dout.double())
    return [x.grad for x in xs]


def _check(name, got, ref, dtype):
    assert got.dtype == dtype and torch.isfinite(got).all(), name
    err = (got.double() - ref).abs().max().item()
    big = ref.abs().max().item()
    assert err <= GRAD_TOL[dtype] * big, "%s: max abs err %g, max |ref| %g" % (name, err, big)


def _leaves(*ts):
    return [t.clone().requires_grad_() for t in ts]


@pytest.mark.parametrize("dtype,B,Sq,Sk,H,Hk,D,causal,window,softcap,alibi", [
    (torch.float16, 2, 32, 32, 4, 2, 32, True, (-1, -1), 0.0, False),     # GQA, causal
    (torch.bfloat16, 1, 24, 40, 2, 1, 64, False, (8, 0), 5.0, False),     # MQA, window, softcap
    (torch.float16, 1, 20, 20, 2, 2, 36, True, (-1, -1), 0.0, True),      # ALiBi, d 36 (padded)
])
def test_flash_attn_func_grads_vs_sdpa(dtype, B, Sq, Sk, H, Hk, D, causal, window, softcap,
                                       alibi):
    g = rng(Sq * 7 + D)
    q, k, v = _leaves(_rand(g, (B, Sq, H, D), dtype), _rand(g, (B, Sk, Hk, D), dtype),
                      _rand(g, (B, Sk, Hk, D), dtype))
    dout = _rand(g, (B, Sq, H, D), dtype)
    slopes = torch.rand(H, generator=torch.Generator().manual_seed(D)) * 0.5 if alibi else None
    scale = D ** -0.5
    out = fat.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                              alibi_slopes=slopes)
    out.backward(dout)
    ref = _ref_grads((q, k, v), dout, scale=scale, causal=causal, window=window,
                     softcap=softcap, alibi=slopes)
    for name, x, want in zip("qkv", (q, k, v), ref):
        assert x.grad.shape == x.shape
        _check("d" + name, x.grad, want, dtype)


def test_varlen_grads_vs_each_sequence():
    """flash_attn_varlen_func: each packed sequence's gradients equal the
    float64 SDPA gradients of that sequence alone (causal, GQA)."""
    g = rng(31)
    H, Hk, D, dtype = 4, 2, 32, torch.bfloat16
    lq, lk = [5, 12, 23], [9, 12, 30]
    cq = torch.tensor(np.cumsum([0] + lq), dtype=torch.int32)
    ck = torch.tensor(np.cumsum([0] + lk), dtype=torch.int32)
    q, k, v = _leaves(_rand(g, (int(cq[-1]), H, D), dtype), _rand(g, (int(ck[-1]), Hk, D), dtype),
                      _rand(g, (int(ck[-1]), Hk, D), dtype))
    dout = _rand(g, (int(cq[-1]), H, D), dtype)
    out = fat.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), causal=True)
    out.backward(dout)
    for b in range(len(lq)):
        sq, sk = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        ref = _ref_grads((q[None, sq], k[None, sk], v[None, sk]), dout[None, sq],
                         scale=D ** -0.5, causal=True)
        for name, got, want in zip("qkv", (q.grad[sq], k.grad[sk], v.grad[sk]), ref):
            _check("d%s of sequence %d" % (name, b), got, want[0], dtype)


def test_packed_forms_grads_equal_unpacked():
    """qkvpacked / kvpacked (and their varlen forms) give the gradients of
    the unpacked calls bit for bit (deterministic=True, the same kernels)."""
    g = rng(37)
    B, S, H, D, dtype = 2, 16, 2, 32, torch.float16
    qkv = _rand(g, (B, S, 3, H, D), dtype)
    dout = _rand(g, (B, S, H, D), dtype)
    kw = dict(causal=True, deterministic=True)

    def grads(fn, *args):
        xs = _leaves(*args)
        fn(*xs, **kw).backward(dout)
        return [x.grad for x in xs]

    q, k, v = qkv.unbind(2)
    want = grads(fat.flash_attn_func, q, k, v)
    (dqkv,) = grads(fat.flash_attn_qkvpacked_func, qkv)
    assert all(torch.equal(dqkv[:, :, i], want[i]) for i in range(3))
    dq, dkv = grads(fat.flash_attn_kvpacked_func, q, qkv[:, :, 1:])
    assert torch.equal(dq, want[0]) and torch.equal(dkv[:, :, 0], want[1]) \
        and torch.equal(dkv[:, :, 1], want[2])
    # varlen: the batch as two packed sequences of S tokens; the packed forms
    # against flash_attn_varlen_func, bit for bit, and that within rounding
    # of the fixed-length gradients.
    cu = torch.tensor([0, S, 2 * S], dtype=torch.int32)
    flat = qkv.reshape(B * S, 3, H, D)
    d = dout.reshape(B * S, H, D)
    xs = _leaves(flat[:, 0], flat[:, 1], flat[:, 2])
    fat.flash_attn_varlen_func(*xs, cu, cu, S, S, **kw).backward(d)
    want_v = [x.grad for x in xs]
    for i in range(3):
        _check("varlen d" + "qkv"[i], want_v[i].reshape(B, S, H, D), want[i].double(), dtype)
    (x,) = _leaves(flat)
    fat.flash_attn_varlen_qkvpacked_func(x, cu, S, **kw).backward(d)
    assert all(torch.equal(x.grad[:, i], want_v[i]) for i in range(3))
    xs = _leaves(flat[:, 0], flat[:, 1:])
    fat.flash_attn_varlen_kvpacked_func(xs[0], xs[1], cu, cu, S, S, **kw).backward(d)
    assert torch.equal(xs[0].grad, want_v[0])
    assert torch.equal(xs[1].grad[:, 0], want_v[1]) and torch.equal(xs[1].grad[:, 1], want_v[2])


def test_deterministic_bits():
    g = rng(41)
    q, k, v = (_rand(g, (1, 48, 2, 64), torch.bfloat16) for _ in range(3))
    dout = _rand(g, (1, 48, 2, 64), torch.bfloat16)
    runs = []
    for _ in range(2):
        xs = _leaves(q, k, v)
        fat.flash_attn_func(*xs, causal=True, deterministic=True).backward(dout)
        runs.append([x.grad for x in xs])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_return_attn_probs_keeps_the_lse_and_trains():
    """return_attn_probs=True: (out, lse, None) as FlashAttention 2.x; the
    output's gradient flows (the LSE's is not propagated, as there)."""
    g = rng(43)
    q, k, v = _leaves(*(_rand(g, (1, 16, 2, 32), torch.float16) for _ in range(3)))
    out, lse, probs = fat.flash_attn_func(q, k, v, return_attn_probs=True)
    assert probs is None and lse.shape == (1, 2, 16)
    out.float().sum().backward()
    ref = _ref_grads((q, k, v), torch.ones(1, 16, 2, 32), scale=32 ** -0.5)
    for name, x, want in zip("qkv", (q, k, v), ref):
        _check("d" + name, x.grad, want, torch.float16)


def test_no_backward_is_named():
    """What has no backward raises NotImplementedError naming it, when the
    backward runs (the forward on tensors requiring grad works)."""
    g = rng(47)
    q = _rand(g, (1, 8, 1, 136), torch.float16).requires_grad_()
    out = fat.flash_attn_func(q, q, q)
    with pytest.raises(NotImplementedError, match="head_dim=136"):
        out.float().sum().backward()
    kc = _rand(g, (1, 8, 2, 32), torch.float16)
    qd = _rand(g, (1, 1, 2, 32), torch.float16).requires_grad_()
    out = fat.flash_attn_with_kvcache(qd, kc, kc)
    with pytest.raises(NotImplementedError, match="flash_attn_with_kvcache: no backward"):
        out.float().sum().backward()
    pages = _rand(g, (4, 16, 2, 32), torch.float16).requires_grad_()
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32)
    cu_k = torch.tensor([0, 20, 40], dtype=torch.int32)
    out = fat.flash_attn_varlen_func(qd[0].expand(2, 2, 32), pages, pages, cu_q, cu_k, 1, 32,
                                     block_table=table)
    with pytest.raises(NotImplementedError, match="block_table"):
        out.float().sum().backward()
    with pytest.raises(NotImplementedError, match="dropout_p"):
        fat.flash_attn_func(q, q, q, dropout_p=0.1)


def test_bwd_opcheck():
    """torch.library.opcheck of flashattn_rt::bwd: schema and fake
    implementation against the real one (the emulator)."""
    g = rng(53)
    q, k, v = (_rand(g, (1, 16, 2, 32), torch.float16) for _ in range(3))
    out, lse = torch.ops.flashattn_rt.fwd(q, k, v, None, None, None, None, 0, 0, 0.2, True,
                                          -1, -1, 0.0, True)
    args = (torch.ones_like(out), q, k, v, out, lse, None, None, None, 0, 0, 0.2, True, -1, -1,
            0.0, None, True)
    torch.library.opcheck(torch.ops.flashattn_rt.bwd.default, args,
                          test_utils=("test_schema", "test_faketensor"))


# ---- a tiny model trained with flashattn and with SDPA -----------------------------------

class _Block(torch.nn.Module):
    def __init__(self, dim, heads, flash):
        super().__init__()
        self.heads, self.flash = heads, flash
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(2 * dim, dim))

    def attention(self, x):
        b, s, dim = x.shape
        # Attention in bf16 on both paths: the same rounded q, k, v.
        q, k, v = self.qkv(x).to(torch.bfloat16).view(b, s, 3, self.heads, -1).unbind(2)
        if self.flash:
            o = fat.flash_attn_func(q, k, v, causal=True)
        else:
            o = F.scaled_dot_product_attention(*(t.float().transpose(1, 2) for t in (q, k, v)),
                                               is_causal=True).transpose(1, 2)
            o = o.to(torch.bfloat16)
        return self.proj(o.float().reshape(b, s, dim))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class _Tiny(torch.nn.Module):
    """Embedding, 2 blocks (d_model 64, 2 heads of 32), LM head."""

    def __init__(self, flash, vocab=64, dim=64, heads=2, layers=2):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(_Block(dim, heads, flash) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def _data(batch=2, seq=32, vocab=64):
    """Next-token data with structure to learn: each row counts up from a
    random start with a random stride (mod vocab)."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, 4, (batch, 1), generator=gen)
    tokens = (start + stride * torch.arange(seq + 1)) % vocab
    return tokens[:, :-1], tokens[:, 1:]


def _models():
    torch.manual_seed(1)
    flash = _Tiny(flash=True)
    sdpa = _Tiny(flash=False)
    sdpa.load_state_dict(flash.state_dict())
    return flash, sdpa


def _loss(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@pytest.mark.slow
def test_tiny_model_trains_like_sdpa():
    """Issue 30's check: 20 Adam steps of the same model, init and data with
    flash_attn_func and with SDPA give the same loss curve (within bf16
    tolerance), the same gradients at the first step, and the loss falls."""
    x, y = _data()
    models = _models()
    opts = [torch.optim.Adam(m.parameters(), lr=3e-3) for m in models]
    curves = ([], [])
    for step in range(20):
        for m, opt, curve in zip(models, opts, curves):
            opt.zero_grad()
            loss = _loss(m, x, y)
            loss.backward()
            curve.append(loss.item())
        if step == 0:
            named = dict(models[1].named_parameters())
            for name, p in models[0].named_parameters():
                want = named[name].grad
                err = (p.grad - want).abs().max().item()
                assert err <= 4e-2 * want.abs().max().item() + 1e-6, (name, err)
        for opt in opts:
            opt.step()
    flash, sdpa = (np.array(c) for c in curves)
    assert np.abs(flash - sdpa).max() <= 2e-2 * sdpa.max(), (flash, sdpa)
    assert flash[-1] < 0.7 * flash[0] and sdpa[-1] < 0.7 * sdpa[0], (flash, sdpa)


def test_training_step_under_torch_compile():
    """One training step of the tiny model under torch.compile(fullgraph=True)
    (aot_eager: the joint graph traced through fwd and bwd's fakes, without
    compiling C++): the same loss and gradients as eager."""
    x, y = _data()
    eager, _ = _models()
    compiled, _ = _models()
    loss = _loss(eager, x, y)
    loss.backward()
    torch._dynamo.reset()
    step = torch.compile(_loss, fullgraph=True, backend="aot_eager")
    closs = step(compiled, x, y)
    closs.backward()
    assert abs(closs.item() - loss.item()) <= 1e-5 * abs(loss.item())
    named = dict(eager.named_parameters())
    for name, p in compiled.named_parameters():
        want = named[name].grad
        assert p.grad is not None, name
        assert (p.grad - want).abs().max().item() <= 1e-4 * want.abs().max().item() + 1e-7, name

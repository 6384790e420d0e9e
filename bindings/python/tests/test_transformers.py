"""flashattn.integrations.transformers (issue 24): greedy generation of tiny
random-weight models (from_config, fixed seeds; nothing is downloaded) with
attn_implementation=register() gives the same tokens as transformers' own
attention (sdpa; eager for Gemma 2, which has no sdpa path because of its
softcap), fp16 on the CPU (the emulator), for batches with left padding,
DynamicCache and StaticCache, full and sliding-window (Mistral) and hybrid
sliding/full layers with softcap (Gemma 2). Needs torch and transformers:
bindings/python/test.sh runs it with $FA_TORCH_PYTHON or the venv of
tools/setup_torch.sh; without them it is skipped."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashattn.torch as fat  # noqa: E402
import flashattn.integrations.transformers as fa_hf  # noqa: E402

VOCAB, PROMPT, NEW = 96, 11, 8
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _config(kind):
    if kind == "llama":
        return transformers.LlamaConfig(**_COMMON), "sdpa"
    if kind == "mistral":  # every layer a sliding window of 5 (< prompt + new tokens)
        return transformers.MistralConfig(sliding_window=5, **_COMMON), "sdpa"
    if kind == "qwen2":
        return transformers.Qwen2Config(**_COMMON), "sdpa"
    # Gemma 2: sliding and full layers alternate (a hybrid cache), softcap on the
    # attention logits, its own scaling (query_pre_attn_scalar).
    return (transformers.Gemma2Config(sliding_window=5, attn_logit_softcapping=5.0,
                                      final_logit_softcapping=30.0, query_pre_attn_scalar=16,
                                      **_COMMON), "eager")


def _model(kind, seed):
    cfg, ref = _config(kind)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float16).eval()
    return model, ref


def _batch(seed):
    """3 prompts: unpadded, 4 and 9 tokens of left padding. The padding
    positions hold random tokens too (not a zero embedding), so that only
    the mask keeps them out."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (3, PROMPT), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :9] = 0
    return ids, mask


def _generate(model, impl, ids, mask, cache):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW,
                             do_sample=False, cache_implementation=cache,
                             output_scores=True, return_dict_in_generate=True)
    return out.sequences[:, PROMPT:], torch.stack(out.scores).float()


@pytest.fixture(scope="module")
def name():
    import warnings
    warnings.filterwarnings("ignore", "flashattn.torch: CPU tensors run", RuntimeWarning)
    return fa_hf.register()


@pytest.fixture
def paths(monkeypatch):
    """Counts the flashattn.torch calls the integration makes, by path."""
    seen = {"kvcache": 0, "kvcache_paged": 0, "varlen": 0, "func": 0}
    for fn, key in (("flash_attn_with_kvcache", "kvcache"), ("flash_attn_varlen_func", "varlen"),
                    ("flash_attn_func", "func")):
        real = getattr(fat, fn)

        def spy(*a, _real=real, _key=key, **kw):
            seen[_key + ("_paged" if kw.get("block_table") is not None else "")] += 1
            return _real(*a, **kw)
        monkeypatch.setattr(fat, fn, spy)
    return seen


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "gemma2"])
def test_generation_matches_transformers(name, paths, kind, cache):
    model, ref = _model(kind, seed=1)
    ids, mask = _batch(seed=1)
    want, want_scores = _generate(model, ref, ids, mask, cache)
    got, got_scores = _generate(model, name, ids, mask, cache)
    assert torch.equal(got, want), (got.tolist(), want.tolist())
    # The scores agree to fp16 accuracy, not only the argmax.
    assert (got_scores - want_scores).abs().max() <= 2e-2 * max(1.0, want_scores.abs().max())
    # Decode ran through flash_attn_with_kvcache on the cache's storage; the
    # padded rows need the page-size-1 block table, the prefill the varlen.
    assert paths["kvcache_paged"] > 0 and paths["varlen"] > 0, paths
    # The padding matters: the padded prompts read without their mask differ.
    unmasked, _ = _generate(model, ref, ids, torch.ones_like(mask), cache)
    assert not torch.equal(unmasked[1:], want[1:])


def test_unpadded_batch_uses_the_contiguous_cache(name, paths):
    model, ref = _model("mistral", seed=2)
    ids, _ = _batch(seed=2)
    mask = torch.ones_like(ids)
    want, _ = _generate(model, ref, ids, mask, "dynamic")
    got, _ = _generate(model, name, ids, mask, "dynamic")
    assert torch.equal(got, want)
    assert paths["func"] > 0 and paths["kvcache"] > 0 and paths["kvcache_paged"] == 0, paths


def test_right_padded_prefill_matches(name):
    """One forward over right-padded prompts: the logits of the real
    positions match sdpa's (the padding queries' outputs are not used)."""
    model, _ = _model("mistral", seed=3)
    ids, mask = _batch(seed=3)
    ids, mask = ids.flip(1), mask.flip(1)
    outs = {}
    for impl in ("sdpa", name):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            outs[impl] = model(input_ids=ids, attention_mask=mask).logits.float()
    real = mask.bool()
    diff = (outs[name][real] - outs["sdpa"][real]).abs().max()
    assert diff <= 2e-2 * max(1.0, outs["sdpa"][real].abs().max()), diff


def test_register_refuses_flash_names():
    with pytest.raises(ValueError, match="contains 'flash'"):
        fa_hf.register("my_flashattn")
    with pytest.raises(ValueError, match="non-empty"):
        fa_hf.register("")


def test_unsupported_masks_are_named(name):
    q = torch.zeros(1, 4, 3, 16, dtype=torch.float16)
    k = torch.zeros(1, 2, 3, 16, dtype=torch.float16)
    mod = torch.nn.Module()
    with pytest.raises(NotImplementedError, match="4-D masks"):
        fa_hf.attention_forward(mod, q, k, k, torch.zeros(1, 1, 3, 3, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="s_aux"):
        fa_hf.attention_forward(mod, q, k, k, None, s_aux=torch.zeros(4))
    with pytest.raises(NotImplementedError, match="or_mask_function"):
        fa_hf.attention_mask(1, 3, 3, use_vmap=True)


def _train_step(model, impl, ids, mask, labels):
    """The causal-LM loss of one forward with attn_implementation=impl and
    every parameter's gradient after its backward."""
    model.set_attn_implementation(impl)
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    return out.loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                             if p.grad is not None}


def _assert_close_grads(got, want, tol=3e-2):
    assert want.keys() == got.keys() and len(want) > 0
    for n in want:
        a, b = got[n].float(), want[n].float()
        scale = b.abs().max().item() + 1e-6
        assert (a - b).abs().max().item() <= tol * scale, n


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_training_gradients_match_transformers(name, kind):
    """Training through the integration (library 0.9, fa_backward): a
    causal-LM loss over a left-padded batch, backward, and every parameter's
    gradient close to transformers' own attention's (fp32 weights, bf16
    attention inputs on the emulator: within bf16 tolerance). Gemma 2:
    test_gemma2_left_padded_training_matches_fp64_reference."""
    cfg, ref = _config(kind)
    torch.manual_seed(71)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.train()
    ids, mask = _batch(72)
    labels = ids.masked_fill(mask == 0, -100)
    l_ref, g_ref = _train_step(model, ref, ids, mask, labels)
    l_fa, g_fa = _train_step(model, name, ids, mask, labels)
    assert abs(l_fa - l_ref) < 1e-2 * max(1.0, abs(l_ref))
    _assert_close_grads(g_fa, g_ref)


_REF64 = "fa_test_reference_fp64"
_SCORE_GAIN = 10


def _reference_mask(*args, **kwargs):
    """transformers' own boolean mask [batch, 1, queries, keys] (causal,
    sliding window, padding), always made (no is_causal shortcut)."""
    from transformers.masking_utils import sdpa_mask
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def _reference_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                         softcap=None, **kwargs):
    """Attention in fp64 over _reference_mask's keys, softcap and scaling as
    the model passes them; a query that sees no key (a left-padding
    position) gets zeros, as FlashAttention defines it (a softmax over no
    keys is undefined)."""
    assert not dropout
    g = query.shape[1] // key.shape[1]
    q = query.double()
    k = key.double().repeat_interleave(g, 1)
    v = value.double().repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * scaling
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    seen = attention_mask.bool()
    s = torch.where(seen.any(-1, keepdim=True), s.masked_fill(~seen, float("-inf")), 0.0)
    p = torch.softmax(s, -1) * seen
    return (p @ v).transpose(1, 2).to(query.dtype), None


def test_gemma2_left_padded_training_matches_fp64_reference(name):
    """Gemma 2 (softcap, query_pre_attn_scalar, sliding and full layers)
    trained on a left-padded batch: loss and gradients match a model whose
    attention is computed in fp64 (_reference_attention). transformers' eager
    attention differs from both at the padding queries only (they see no key;
    eager's additive mask gives them the mean of all the row's values, we give
    zeros), and those reach the loss through one term per padded row: the last
    padding position's logits predict the first real token (labels shift).
    Measured here: fp64 4.60887, ours 4.60889, eager 4.63110 (gradients up to
    75% off); without those terms eager 4.62505, ours 4.62507."""
    from transformers import AttentionInterface, AttentionMaskInterface
    AttentionInterface.register(_REF64, _reference_attention)
    AttentionMaskInterface.register(_REF64, _reference_mask)
    cfg, ref = _config("gemma2")
    cfg.query_pre_attn_scalar = 40  # a scale other than head_dim ** -0.5
    torch.manual_seed(71)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.train()
    with torch.no_grad():  # scores of a few units, so that the softcap (5) bends them
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(_SCORE_GAIN)
            layer.self_attn.k_proj.weight.mul_(_SCORE_GAIN)
    ids, mask = _batch(72)
    labels = ids.masked_fill(mask == 0, -100)
    l_64, g_64 = _train_step(model, _REF64, ids, mask, labels)
    l_fa, g_fa = _train_step(model, name, ids, mask, labels)
    assert abs(l_fa - l_64) <= 5e-4, (l_fa, l_64)  # bf16 attention; eager: 2e-2
    _assert_close_grads(g_fa, g_64)
    # With the padding positions' predictions out of the loss, transformers'
    # eager attention agrees too.
    first = (mask == 0).sum(1)
    padded = first > 0
    labels[padded, first[padded]] = -100
    l_ref, g_ref = _train_step(model, ref, ids, mask, labels)
    l_fa, g_fa = _train_step(model, name, ids, mask, labels)
    assert abs(l_fa - l_ref) <= 5e-4, (l_fa, l_ref)
    _assert_close_grads(g_fa, g_ref)

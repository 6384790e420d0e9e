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


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_training_gradients_match_transformers(name, kind):
    """Training through the integration (library 0.9, fa_backward): a
    causal-LM loss over a left-padded batch, backward, and every parameter's
    gradient close to transformers' own attention's (fp32 weights, fp16
    attention inputs on the emulator: within fp16 tolerance). (Gemma 2 with
    left padding: its eager forward's loss differs from ours already, 4.624
    against 4.603 here, unpadded they agree; not the backward's.)"""
    cfg, ref = _config(kind)
    torch.manual_seed(71)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.train()
    ids, mask = _batch(72)
    labels = ids.masked_fill(mask == 0, -100)
    grads = {}
    for impl in (ref, name):
        model.set_attn_implementation(impl)
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        grads[impl] = (out.loss.item(),
                       {n: p.grad.detach().clone() for n, p in model.named_parameters()
                        if p.grad is not None})
    (l_ref, g_ref), (l_fa, g_fa) = grads[ref], grads[name]
    assert abs(l_fa - l_ref) < 1e-2 * max(1.0, abs(l_ref))
    assert g_ref.keys() == g_fa.keys() and len(g_ref) > 0
    for n in g_ref:
        a, b = g_fa[n].float(), g_ref[n].float()
        scale = b.abs().max().item() + 1e-6
        assert (a - b).abs().max().item() <= 3e-2 * scale, n

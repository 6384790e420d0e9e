"""Config validation and PTX generation."""

import pytest

import flashattn as fa


def test_config_fields():
    c = fa.Config(dtype="bf16", head_dim=64, head_dim_v=32, num_heads_q=8, num_heads_kv=2,
                  causal=True, window=(16, -1), softmax_scale=0.1, softcap=30.0)
    assert (c.dtype, c.head_dim, c.head_dim_v, c.num_heads_q, c.num_heads_kv) == \
        ("bf16", 64, 32, 8, 2)
    assert c.causal and c.window == (16, -1)
    assert abs(c.softmax_scale - 0.1) < 1e-7 and c.softcap == 30.0
    assert "bf16" in repr(c)
    d = fa.Config(head_dim=64, num_heads_q=4)
    assert d.num_heads_kv == 4 and d.head_dim_v == 64 and d.dtype == "fp16"
    assert abs(d.softmax_scale - 0.125) < 1e-12
    with d:
        pass
    d.close()
    with pytest.raises(fa.InvalidArgumentError):
        d.generate()


@pytest.mark.parametrize("kw,exc,status,text", [
    (dict(head_dim=32, num_heads_q=6, num_heads_kv=4), fa.InvalidArgumentError, 1,
     "fa_config_create: num_heads_q (6) must be a multiple of num_heads_kv (4)"),
    (dict(head_dim=36, num_heads_q=4), fa.UnsupportedError, 2,
     "fa_config_create: head_dim must be a multiple of 8"),
    (dict(head_dim=584, num_heads_q=4), fa.UnsupportedError, 2,
     "fa_config_create: head_dim must be a multiple of 8 in 8..576, got 584"),
    (dict(head_dim=576, head_dim_v=520, num_heads_q=4), fa.UnsupportedError, 2,
     "fa_config_create: head_dim_v must be a multiple of 8 in 8..512, got 520"),
    (dict(head_dim=32, num_heads_q=4, window=(-2, 0)), fa.InvalidArgumentError, 1,
     "window_left"),
    (dict(head_dim=32, num_heads_q=4, softmax_scale=float("inf")), fa.InvalidArgumentError, 1,
     "softmax_scale"),
    (dict(head_dim=32, num_heads_q=4, softcap=-1.0), fa.InvalidArgumentError, 1, "softcap"),
    (dict(head_dim=32, num_heads_q=4, dtype="fp64"), fa.InvalidArgumentError, 1, "dtype"),
    (dict(head_dim=32, num_heads_q=4, dtype="fp32", kv_dtype="e4m3"), fa.UnsupportedError, 2,
     "FA_DTYPE_FP32"),
    (dict(head_dim=32, num_heads_q=2**40), fa.InvalidArgumentError, 1, "int32"),
    (dict(head_dim=32, num_heads_q=4, window=3), fa.InvalidArgumentError, 1, "window"),
])
def test_config_errors(kw, exc, status, text):
    with pytest.raises(exc) as e:
        fa.Config(**kw)
    err = e.value
    assert isinstance(err, fa.Error)
    assert err.status == status
    assert text in err.message
    assert err.status_name in str(err)


@pytest.mark.parametrize("kind,entry", [("forward", "fa_forward_"), ("decode", "fa_decode_"),
                                        ("reduce", "fa_reduce_"),
                                        ("backward-pre", "fa_bwdpre_mma_f16_d64_dv64_g1_"),
                                        ("backward", "fa_backward_mma_f16_d64_dv64_g4_"),
                                        ("backward-post", "fa_bwdpost_mma_f16_d64_dv64_g1_")])
@pytest.mark.parametrize("sm", [80, 86, 89, 90])
def test_generate_all_kinds(kind, entry, sm):
    if kind == "backward" and sm == 90:  # sm_90: FlashAttention-3's structure (wgmma)
        entry = "fa_backward_wgmma_f16_d64_dv64_g4_"
    cfg = fa.Config(head_dim=64, num_heads_q=8, num_heads_kv=2, causal=True)
    ptx = fa.generate(cfg, kind, sm)
    assert isinstance(ptx, str)
    assert ".version " in ptx and (".target sm_%d" % sm) in ptx
    assert ".visible .entry " + entry in ptx
    assert ptx.rstrip().endswith("}")
    assert ptx == cfg.generate(kind, sm)  # byte-identical
    assert "\0" not in ptx


def test_generate_kinds_differ_and_int_kind():
    cfg = fa.Config(head_dim=32, num_heads_q=4, dtype="bf16")
    kinds = ("forward", "decode", "reduce", "backward-pre", "backward", "backward-post")
    ptx = [fa.generate(cfg, k) for k in kinds]
    assert len(set(ptx)) == 6
    assert fa.generate(cfg, 1) == ptx[1]
    assert fa.generate(cfg, 4) == ptx[4]


def test_generate_errors():
    cfg = fa.Config(head_dim=32, num_heads_q=4)
    with pytest.raises(fa.UnsupportedError) as e:
        fa.generate(cfg, "forward", 75)
    assert e.value.status == 2 and e.value.message == "fa_generate: sm must be one of 80, 86, 87, 89, 90, 100, 103, 110, 120, 121, got 75"
    with pytest.raises(fa.InvalidArgumentError):
        fa.generate(cfg, "sideways")
    with pytest.raises(fa.InvalidArgumentError):
        fa.generate(cfg, 6)
    with pytest.raises(fa.UnsupportedError) as e:  # the backward takes 16-bit configs
        fa.generate(fa.Config(head_dim=32, num_heads_q=4, dtype="fp32"), "backward")
    assert "FA_DTYPE_FP32 is not supported" in e.value.message

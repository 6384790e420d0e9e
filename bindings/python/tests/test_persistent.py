"""forward()'s workspace (since 0.8): the persistent sm_90a forward's dynamic
scheduler on an emulated sm_90.

The persistent kernel runs only on a runtime created with
FLASHATTN_SM90_PERSISTENT=1 (read by fa_runtime_create), so the module makes
two emulator runtimes (emulator_sm=90): one with the variable set, one
without. The problem has 160 work items (5 batches x 32 query heads x one
m-block), more than the emulator's 108 SMs: CTAs take their second item from
the workspace's counter, so a workspace that is not zero skips items (the
poisoned outputs show it) and one the kernel did not leave zero would break
the next call."""

import numpy as np
import pytest

from conftest import (FakeCAI, check_attention, nan_out, ref_attention, rng, round_to,
                      to_pages)
import flashattn as fa

B, SQ, SK, H, HK, D = 5, 19, 45, 32, 8, 64


def asking_workspace(rt):
    """A workspace callable for fa.forward (zeroed device memory of the size
    asked) and the list of the sizes it was asked for."""
    asked = []

    def workspace(nbytes):
        asked.append(nbytes)
        return rt.upload(np.zeros(nbytes // 4, np.int32))

    return asked, workspace


@pytest.fixture(scope="module")
def runtimes():
    """{False: a runtime without the persistent policy, True: with it}."""
    rts = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("FLASHATTN_SM90_PERSISTENT", raising=False)
        rts[False] = fa.Runtime(backend="emulator", emulator_sm=90, cache="memory")
        mp.setenv("FLASHATTN_SM90_PERSISTENT", "1")
        rts[True] = fa.Runtime(backend="emulator", emulator_sm=90, cache="memory")
    yield rts
    for r in rts.values():
        r.close()


def make_problem(seed, b, sq, sk, h, hk, d):
    """A causal fp16 problem: its Config, random (q, k, v) and the fp64
    reference's (O, LSE)."""
    g = rng(seed)
    q = g.standard_normal((b, sq, h, d)).astype(np.float16)
    k = g.standard_normal((b, sk, hk, d)).astype(np.float16)
    v = g.standard_normal((b, sk, hk, d)).astype(np.float16)
    cfg = fa.Config(dtype="fp16", head_dim=d, num_heads_q=h, num_heads_kv=hk, causal=True)
    ref = ref_attention(round_to(q, "fp16"), round_to(k, "fp16"), round_to(v, "fp16"),
                        cfg.softmax_scale, causal=True)
    return cfg, (q, k, v), ref


@pytest.fixture(scope="module")
def problem():
    return make_problem(8108, B, SQ, SK, H, HK, D)


def run(rt, problem, **kw):
    """O and LSE as NumPy, both written into NaN-poisoned device outputs."""
    cfg, (q, k, v), _ = problem
    o, lse = nan_out(rt, (B, SQ, H, D), "fp16"), nan_out(rt, (B, H, SQ), "fp32")
    fa.forward(rt, cfg, q, k, v, out=o, lse=lse, **kw)
    return o.numpy(), lse.numpy()


def forward_workspaces(rt):
    return {key: val for key, val in rt._workspaces.items() if key[0] == "forward"}


def counters(rt, ptr):
    w = np.full(2, 7, np.uint32)
    rt.memcpy_dtoh(w, ptr)
    return w.tolist()


def same_bits(a, b):
    return a[0].tobytes() == b[0].tobytes() and a[1].tobytes() == b[1].tobytes()


@pytest.fixture(scope="module")
def static(runtimes, problem):
    """The one-CTA-per-item kernel's O and LSE (no policy), checked against
    the fp64 reference."""
    got = run(runtimes[False], problem)
    check_attention(got[0], got[1], *problem[2], "fp16")
    return got


def test_dynamic_equals_reference_and_static(runtimes, problem, static):
    rt = runtimes[True]
    first = run(rt, problem)  # the binding's own workspace, zeroed when made
    check_attention(first[0], first[1], *problem[2], "fp16")
    assert same_bits(first, static), "dynamic order: O/LSE not bit-identical to one CTA per item"
    ws = forward_workspaces(rt)
    assert len(ws) == 1, ws
    (ptr, size), = ws.values()
    assert size >= 8 and ptr % 8 == 0
    assert counters(rt, ptr) == [0, 0], "the kernel did not leave its workspace zero"
    second = run(rt, problem)  # the same workspace, as the kernel left it
    assert forward_workspaces(rt) == ws, "the binding made another workspace"
    check_attention(second[0], second[1], *problem[2], "fp16")
    assert same_bits(second, static)
    assert counters(rt, ptr) == [0, 0]


def test_user_workspace(runtimes, problem, static):
    rt = runtimes[True]
    ws = rt.upload(np.zeros(2, np.int32))
    for _ in range(2):  # zeroed once, reused
        got = run(rt, problem, workspace=ws)
        check_attention(got[0], got[1], *problem[2], "fp16")
        assert same_bits(got, static)
        assert ws.numpy().tolist() == [0, 0]


def test_workspace_size(runtimes, problem, static):
    """A callable workspace is asked for fa_forward_workspace_size bytes: 8
    with the policy; without it, never (and no workspace is made)."""
    for persistent, want in ((True, [8]), (False, [])):
        rt = runtimes[persistent]
        asked = []

        def workspace(nbytes):
            asked.append(nbytes)
            return rt.upload(np.zeros(2, np.int32))

        got = run(rt, problem, workspace=workspace)
        assert asked == want, (persistent, asked)
        assert same_bits(got, static)
    assert forward_workspaces(runtimes[False]) == {}


def test_workspace_not_zero_skips_items(runtimes, problem, static):
    """A workspace left non-zero (the caller's, or the binding's own) is
    read by the kernel: CTAs' later tickets start past items they should
    have run, whose O rows stay poisoned."""
    rt = runtimes[True]
    ws = rt.upload(np.array([5, 0], np.int32))
    got = run(rt, problem, workspace=ws)
    assert np.isnan(got[0].astype(np.float32)).any() and not same_bits(got, static)
    run(rt, problem)  # the binding's own workspace exists
    (ptr, _), = forward_workspaces(rt).values()
    rt.memcpy_htod(ptr, np.array([5, 0], np.uint32))
    got = run(rt, problem)
    assert np.isnan(got[0].astype(np.float32)).any() and not same_bits(got, static)
    rt.memset(ptr, 0, 8)  # zero again for the other tests
    assert same_bits(run(rt, problem), static)


@pytest.mark.parametrize("persistent", [True, False])
def test_bad_workspace_rejected(runtimes, problem, persistent):
    """Too small or misaligned: the library's InvalidArgumentError names the
    workspace, and nothing is written (with or without the policy)."""
    rt = runtimes[persistent]
    cfg, (q, k, v), _ = problem
    base = rt.upload(np.zeros(4, np.int32))
    bads = [(rt.upload(np.zeros(1, np.int32)), "workspace_size is 4"),
            (FakeCAI(base.ptr + 4, (8,), "|u1"), "not 8-byte aligned")]
    for ws, msg in bads:
        o = nan_out(rt, (B, SQ, H, D), "fp16")
        with pytest.raises(fa.InvalidArgumentError, match="workspace") as e:
            fa.forward(rt, cfg, q, k, v, out=o, workspace=ws)
        assert msg in str(e.value)
        assert np.isnan(o.numpy().astype(np.float32)).all()
    with pytest.raises(fa.InvalidArgumentError, match="forward: workspace is a null pointer"):
        fa.forward(rt, cfg, q, k, v, workspace=FakeCAI(0, (8,), "|u1"))


def test_owned_workspace_per_stream(runtimes, problem):
    """One binding-owned workspace per stream (here the emulator's stream
    handles), each zeroed; freed with the Runtime."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLASHATTN_SM90_PERSISTENT", "1")
        rt = fa.Runtime(backend="emulator", emulator_sm=90, cache="memory")
    with rt:
        cfg, (q, k, v), ref = problem
        for stream in (0, 0, 0x1000):
            o, lse = fa.forward(rt, cfg, q, k, v, return_lse=True, stream=stream)
            check_attention(o, lse, *ref, "fp16")
        ws = forward_workspaces(rt)
        assert sorted(key[1] for key in ws) == [0, 0x1000]
        assert len({ptr for ptr, _ in ws.values()}) == 2
        for ptr, _ in ws.values():
            assert ptr in rt._allocs and counters(rt, ptr) == [0, 0]
    assert rt._workspaces == {} and rt._allocs == {}



def test_split_kv(runtimes):
    """A launch whose CTAs leave most of the emulator's 108 SMs idle (one
    m-block x 4 heads) over 1500 keys splits them (docs/api.md, "Forward
    workspace"): fa_forward_workspace_size asks for 256 bytes plus the
    partial states, the binding's own workspace and a callable's serve, and
    the combined O and LSE match the fp64 reference. An 8-byte workspace
    runs unsplit (and right); FLASHATTN_FORWARD_SPLITS=0 asks for none."""
    b, sq, sk, h, hk, d = 1, 16, 1500, 4, 2, 64
    cfg, (q, k, v), ref = make_problem(8109, b, sq, sk, h, hk, d)

    def run_split(rt, **kw):
        o, lse = nan_out(rt, (b, sq, h, d), "fp16"), nan_out(rt, (b, h, sq), "fp32")
        fa.forward(rt, cfg, q, k, v, out=o, lse=lse, **kw)
        check_attention(o.numpy(), lse.numpy(), *ref, "fp16")

    rt = runtimes[False]
    run_split(rt)  # the binding's own workspace
    sizes = [size for key, (_, size) in rt._workspaces.items()
             if key[0] == "forward" and size > 256]
    assert sizes, "no split-KV workspace was made"
    asked, workspace = asking_workspace(rt)

    run_split(rt, workspace=workspace)
    assert len(asked) == 1 and asked[0] > 256 and asked[0] % 4 == 0
    run_split(rt, workspace=rt.upload(np.zeros(2, np.int32)))  # too small: unsplit
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLASHATTN_FORWARD_SPLITS", "0")
        off = fa.Runtime(backend="emulator", emulator_sm=90, cache="memory")
    with off:
        asked.clear()
        run_split(off, workspace=workspace)
        assert asked == []


def test_split_kv_varlen(runtimes):
    """A varlen launch (host cu_seqlens) whose CTAs leave the SMs idle splits
    too (docs/api.md, "Forward workspace"): fa_forward_workspace_size asks
    for 256 bytes plus the partial states (padded to the longest sequence),
    and each sequence's packed O and LSE match the fp64 reference, an empty
    sequence and one with more queries than keys (rows with no key: O 0,
    LSE -inf) included."""
    lens_q, lens_k, h, hk, d = [16, 0, 5, 30], [1500, 40, 900, 20], 4, 2, 64
    cu_q = np.cumsum([0] + lens_q).astype(np.int32)
    cu_k = np.cumsum([0] + lens_k).astype(np.int32)
    g = rng(8112)
    q = g.standard_normal((cu_q[-1], h, d)).astype(np.float16)
    k = g.standard_normal((cu_k[-1], hk, d)).astype(np.float16)
    v = g.standard_normal((cu_k[-1], hk, d)).astype(np.float16)
    cfg = fa.Config(dtype="fp16", head_dim=d, num_heads_q=h, num_heads_kv=hk, causal=True)
    rt = runtimes[False]
    asked, workspace = asking_workspace(rt)

    o, lse = nan_out(rt, (cu_q[-1], h, d), "fp16"), nan_out(rt, (h, cu_q[-1]), "fp32")
    fa.forward(rt, cfg, q, k, v, out=o, lse=lse, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
               workspace=workspace)
    assert len(asked) == 1 and asked[0] > 256, asked
    got_o, got_lse = o.numpy(), lse.numpy()
    for b in range(len(lens_q)):
        if lens_q[b] == 0:
            continue
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ref = ref_attention(round_to(q[None, rq], "fp16"), round_to(k[None, rk], "fp16"),
                            round_to(v[None, rk], "fp16"), cfg.softmax_scale, causal=True)
        check_attention(got_o[None, rq], got_lse[None, :, rq], *ref, "fp16")


def test_gqa_pack(runtimes):
    """Two new queries per sequence x 8 query heads per KV head over a cache
    with seqused_k run on the decode kernel (docs/api.md, "GQA packing"):
    fa_forward_workspace_size asks for 256 bytes plus the decode kernel's
    partial states, and O and LSE match the fp64 reference over each
    sequence's keys (one sequence has none: O 0, LSE -inf)."""
    b, sq, sk, h, hk, d = 3, 2, 700, 16, 2, 64
    cfg, (q, k, v), _ = make_problem(8110, b, sq, sk, h, hk, d)
    lens = np.array([700, 0, 333], np.int32)
    rt = runtimes[False]
    asked, workspace = asking_workspace(rt)

    o, lse = nan_out(rt, (b, sq, h, d), "fp16"), nan_out(rt, (b, h, sq), "fp32")
    fa.forward(rt, cfg, q, k, v, out=o, lse=lse, seqused_k=lens, workspace=workspace)
    assert len(asked) == 1 and asked[0] > 256
    got_o, got_lse = o.numpy(), lse.numpy()
    for i, n in enumerate(lens):
        if n == 0:
            assert (got_o[i] == 0).all() and np.isneginf(got_lse[i]).all()
            continue
        ref = ref_attention(round_to(q[i:i + 1], "fp16"), round_to(k[i:i + 1, :n], "fp16"),
                            round_to(v[i:i + 1, :n], "fp16"), cfg.softmax_scale, causal=True)
        check_attention(got_o[i:i + 1], got_lse[i:i + 1], *ref, "fp16")


def test_gqa_pack_varlen(runtimes):
    """A varlen batch of at most one query per sequence (cu_seqlens_q, one
    sequence with none) x 8 query heads per KV head over a paged cache with
    seqused_k, as vLLM's decode steps call flash_attn_varlen_func, runs on
    the decode kernel (docs/api.md, "GQA packing"): the workspace asked for
    is 256 bytes plus the decode kernel's partial states, and each
    sequence's packed O and LSE match the fp64 reference over its keys
    (bottom-right aligned)."""
    b, sk, h, hk, d = 4, 700, 16, 2, 64
    lens_q, lens_k = [1, 0, 1, 1], np.array([700, 500, 0, 333], np.int32)
    cu_q = np.cumsum([0] + lens_q).astype(np.int32)
    g = rng(8113)
    q = g.standard_normal((cu_q[-1], h, d)).astype(np.float16)
    k = g.standard_normal((b, sk, hk, d)).astype(np.float16)
    v = g.standard_normal((b, sk, hk, d)).astype(np.float16)
    kp, vp, table = to_pages(g, k, v, 16)  # shuffled pages of 16, NaN in the spare ones
    cfg = fa.Config(dtype="fp16", head_dim=d, num_heads_q=h, num_heads_kv=hk, causal=True)
    rt = runtimes[False]
    asked, workspace = asking_workspace(rt)

    o, lse = nan_out(rt, (cu_q[-1], h, d), "fp16"), nan_out(rt, (h, cu_q[-1]), "fp32")
    fa.forward(rt, cfg, q, kp, vp, out=o, lse=lse, cu_seqlens_q=cu_q, seqused_k=lens_k,
               block_table=table, workspace=workspace)
    assert len(asked) == 1 and asked[0] > 256, asked
    got_o, got_lse = o.numpy(), lse.numpy()
    for i in range(b):
        rq = slice(cu_q[i], cu_q[i + 1])
        if lens_q[i] == 0:
            continue
        if lens_k[i] == 0:
            assert (got_o[rq] == 0).all() and np.isneginf(got_lse[:, rq]).all()
            continue
        n = lens_k[i]
        ref = ref_attention(round_to(q[None, rq], "fp16"), round_to(k[i:i + 1, :n], "fp16"),
                            round_to(v[i:i + 1, :n], "fp16"), cfg.softmax_scale, causal=True)
        check_attention(got_o[None, rq], got_lse[None, :, rq], *ref, "fp16")

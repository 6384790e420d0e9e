"""Torch-free parts of bench/bench_decode.py: grid, byte and FLOP counts,
GB/s and % of copy, input-set rotation under a memory budget, the page
re-layout (block table, pool rows, FlashInfer's CSR table), CSV and
markdown, the --mla mode (grid, bytes and FLOPs, rows, names, options, its
gpu_lease.sh stage); and, when NumPy and a built library are there, the page re-layout
fed through the Python binding on the emulator against the contiguous cache."""

import math
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_decode as b  # noqa: E402
import lease_stage  # noqa: E402  (beside this file)


def test_module_does_not_import_torch():
    assert "torch" not in sys.modules


def test_grid_covers_every_point_smallest_first():
    g = b.decode_grid()
    assert len(g) == 4 * 3 * 2
    assert {(c.batch, c.context, c.page_size) for c in g} == {
        (x, y, z) for x in (1, 8, 64, 256) for y in (512, 4096, 32768) for z in (1, 16)}
    sizes = [c.batch * c.context for c in g]
    assert sizes == sorted(sizes)  # a time budget cuts the largest caches
    for c in g:
        assert (c.heads_q, c.heads_kv, c.head_dim, c.head_dim_v, c.seqlen_q, c.dtype) == (
            32, 8, 128, 128, 1, "bf16")
    # the two page sizes of one (batch, context) are neighbours
    for i in range(0, len(g), 2):
        assert (g[i].batch, g[i].context) == (g[i + 1].batch, g[i + 1].context)
        assert {g[i].page_size, g[i + 1].page_size} == {1, 16}


def test_bytes_and_flops():
    c = b.DecodeConfig(8, 4096, 16)
    kv = 8 * 4096 * 8 * (128 + 128) * 2
    assert c.kv_bytes == kv == 134217728
    assert c.q_bytes == c.o_bytes == 8 * 32 * 128 * 2
    assert c.bytes_moved == kv + 2 * 8 * 32 * 128 * 2
    assert c.flops == 2 * 32 * 8 * 4096 * 256
    # Only the valid keys count: shorter sequences read fewer bytes.
    s = b.DecodeConfig(3, 100, 16, heads_q=4, heads_kv=2, head_dim=64, head_dim_v=32,
                       lens=[100, 7, 0])
    assert s.kv_bytes == 107 * 2 * (64 + 32) * 2
    assert s.q_bytes == 3 * 4 * 64 * 2 and s.o_bytes == 3 * 4 * 32 * 2
    assert s.flops == 2 * 4 * 107 * 96
    # The caches the GPU part allocates: contiguous at full length, and pages.
    assert s.contiguous_bytes() == 3 * 100 * 2 * 96 * 2
    assert s.pool_pages() == 3 * 7 + b.SPARE_PAGES
    assert s.pool_bytes() == s.pool_pages() * 16 * 2 * 96 * 2
    assert s.set_bytes() == s.contiguous_bytes() + s.pool_bytes() + s.q_bytes + s.o_bytes
    # --append: the new token's K/V rows are read (k_new/v_new) and written once more.
    a = b.DecodeConfig(8, 4096, 16, append=True)
    new = 8 * 8 * (128 + 128) * 2
    assert a.new_kv_bytes == new and c.new_kv_bytes == 0
    assert a.bytes_moved == c.bytes_moved + 2 * new
    assert a.set_bytes() == c.set_bytes() + new
    assert a.describe() == "b8 ctx4096 ps16 append"
    assert all(x.append for x in b.decode_grid((1,), (512,), (16,), append=True))
    with pytest.raises(ValueError):
        b.DecodeConfig(2, 10, 1, lens=[11, 1])
    with pytest.raises(ValueError):
        b.DecodeConfig(2, 10, 0)
    with pytest.raises(ValueError):
        b.DecodeConfig(2, 10, 1, heads_q=12, heads_kv=8)


def test_gbps_and_pct_of_copy():
    assert b.gbps(3e9, 1000.0) == pytest.approx(3.0)
    assert b.gbps(2e9, 0.5) == pytest.approx(4000.0)
    assert b.gbps(1, None) is None and b.gbps(1, 0.0) is None
    # a copy moves its bytes twice (read + write)
    assert b.copy_gbps(1e9, 1.0) == pytest.approx(2000.0)
    assert b.pct(1500.0, 3000.0) == pytest.approx(50.0)
    assert b.pct(None, 3000.0) is None and b.pct(1.0, 0.0) is None


def test_input_sets_fill_l2_and_respect_memory():
    gib = 1 << 30
    small = b.DecodeConfig(1, 512, 16)  # 2 MiB of K/V per set
    assert small.kv_bytes == 2 << 20
    n = b.n_sets_for(small.kv_bytes, small.set_bytes(), 70 * gib)
    assert n == b.MAX_SETS and n * small.kv_bytes >= 50e6  # over an H100's L2
    mid = b.DecodeConfig(8, 4096, 16)  # 128 MiB per set: two sets reach 256 MiB
    assert b.n_sets_for(mid.kv_bytes, mid.set_bytes(), 70 * gib) == 2
    assert b.n_sets_for(mid.kv_bytes, mid.set_bytes(), mid.set_bytes() + 1) == 1
    big = b.DecodeConfig(256, 32768, 16)
    assert big.kv_bytes == 256 * 32768 * 8 * 256 * 2  # 32 GiB
    assert big.set_bytes() > 64 * gib
    assert b.n_sets_for(big.kv_bytes, big.set_bytes(), 70 * gib) == 1
    assert b.n_sets_for(big.kv_bytes, big.set_bytes(), 40 * gib) == 0
    why = b.mem_reason(big, 40 * gib)
    assert "GiB" in why and "40.0 GiB usable" in why


def test_plan_pages_shuffles_distinct_pages():
    lens = [40, 17, 0, 33]
    num_pages, table = b.plan_pages(lens, 16, seed=3)
    assert len(table) == 4 and all(len(r) == 3 for r in table)  # ceil(40 / 16)
    assert num_pages == 4 * 3 + b.SPARE_PAGES
    flat = [p for r in table for p in r]
    assert len(set(flat)) == len(flat) and all(0 <= p < num_pages for p in flat)
    assert len(set(range(num_pages)) - set(flat)) == b.SPARE_PAGES
    assert flat != sorted(flat)  # shuffled
    assert b.plan_pages(lens, 16, seed=3) == (num_pages, table)  # deterministic
    assert b.plan_pages(lens, 16, seed=4)[1] != table
    n2, t2 = b.plan_pages(lens, 16, max_pages=5, spare=0)
    assert n2 == 20 and all(len(r) == 5 for r in t2)
    with pytest.raises(ValueError):
        b.plan_pages(lens, 16, max_pages=2)
    with pytest.raises(ValueError):
        b.plan_pages(lens, 0)
    assert b.plan_pages([1, 1], 1)[0] == 2 + b.SPARE_PAGES


@pytest.mark.parametrize("page_size", [1, 5, 16])
def test_token_rows_map_keys_to_their_page_and_slot(page_size):
    lens = [40, 17, 0, 33]
    num_pages, table = b.plan_pages(lens, page_size, seed=11)
    rows = b.token_rows(table, lens, page_size)
    assert [len(r) for r in rows] == lens
    every = [x for r in rows for x in r]
    assert len(set(every)) == len(every)  # no two keys share a row
    assert all(0 <= x < num_pages * page_size for x in every)
    for bi, r in enumerate(rows):
        for j, x in enumerate(r):
            assert x // page_size == table[bi][j // page_size] and x % page_size == j % page_size
    # the rows of a sequence's keys fill its first pages, in order within a page
    for bi, n in enumerate(lens):
        used = {x // page_size for x in rows[bi]}
        assert used == set(table[bi][:b.pages_per_seq(n, page_size)])


def test_flashinfer_csr_matches_block_table():
    lens = [40, 16, 0, 1]
    _, table = b.plan_pages(lens, 16, seed=2)
    indptr, indices, last = b.flashinfer_csr(table, lens, 16)
    assert indptr == [0, 3, 4, 4, 5]
    assert indices == table[0][:3] + table[1][:1] + table[3][:1]
    assert last == [8, 16, 0, 1]
    # page size 1: every page full
    _, t1 = b.plan_pages([3, 2], 1)
    ip, ix, lp = b.flashinfer_csr(t1, [3, 2], 1)
    assert ip == [0, 3, 5] and ix == t1[0] + t1[1][:2] and lp == [1, 1]


def test_judge_uses_the_other_libraries_as_baseline():
    others = {"sdpa": (1e-3, 2e-3), "fa2": (8e-4, 2e-3), "flashinfer": (9e-4, 2e-3)}
    ok, note = b.judge(dict(others, flashattn=(1.5e-3, 3e-3), flashattn_contig=(1.5e-3, 3e-3)))
    assert ok is True and note == ""
    # 2 x FA2's 8e-4 < 1.7e-3; flashattn's own contiguous run is no baseline
    ok, note = b.judge(dict(others, flashattn=(1.7e-3, 3e-3), flashattn_contig=(1e-4, 1e-4)))
    assert ok is False and "max err" in note
    ok, note = b.judge(dict(others, flashattn=(1e-3, 3e-3),
                            flashattn_contig=(float("nan"), float("nan"))))
    assert ok is False and note.startswith("contiguous: non-finite")
    ok, note = b.judge({"flashattn": (1e-3, 3e-3)})  # nothing else ran
    assert ok is True and "rel err only" in note
    assert b.judge({"sdpa": (1e-3, 1e-3)})[0] is None


def _row(cfg, ms, copy_bw=3000.0, mla=False):
    r = (b.mla_config_row if mla else b.config_row)(cfg, 4)
    for i, t in zip(b.MLA_IMPLS if mla else b.IMPLS, ms):
        if t is None:
            r[i + "_status"], r[i + "_note"] = "n/a", "RuntimeError: %s not importable: x" % (
                "flash_mla" if mla else "flash_attn")
        else:
            r[i + "_status"], r[i + "_median_ms"], r[i + "_min_ms"] = "ok", t, t * 0.9
            r[i + "_max_ms"], r[i + "_reps"] = t * 1.2, 40
            r[i + "_max_err"], r[i + "_rel_err"] = 2e-3, 3e-3
    if mla:
        r["sdpa_backend"] = "efficient_attention"
    r["tol_ok"], r["tol_note"] = True, ""
    return (b.finish_mla_row if mla else b.finish_row)(r, copy_bw)


def test_finish_row_ratios():
    cfg = b.DecodeConfig(64, 4096, 16)
    r = _row(cfg, [0.5, 0.55, 1.0, None, 0.4])
    assert r["flashattn_gbps"] == pytest.approx(cfg.bytes_moved / 0.5e-3 / 1e9)
    assert r["flashattn_pct_copy"] == pytest.approx(100 * r["flashattn_gbps"] / 3000.0)
    assert r["ratio_vs_sdpa"] == pytest.approx(2.0)  # half the time
    assert r["ratio_vs_flashinfer"] == pytest.approx(0.8)
    assert r["ratio_vs_fa2"] is None and r["fa2_gbps"] is None
    assert r["copy_gbps"] == 3000.0


def test_csv_round_trip(tmp_path):
    rows = [_row(c, [0.1 + i, 0.2, 0.3, None, 0.15]) for i, c in enumerate(b.decode_grid()[:6])]
    rows[2]["tol_ok"], rows[2]["tol_note"] = False, "rel err 0.02 > 1e-02"
    meta = {"commit": "abc (+ uncommitted changes)", "gpu": "NVIDIA H100 80GB HBM3",
            "driver": "580.1", "copy_gbps": "2900.5", "date": "2026-11-25"}
    p = tmp_path / "d.csv"
    b.write_csv(str(p), rows, meta)
    assert p.read_text().startswith("# commit: abc")
    m2, r2 = b.read_csv(str(p))
    assert m2 == meta and len(r2) == len(rows)
    for a, c in zip(rows, r2):
        for k in b.FIELDS:
            va = a.get(k)  # floats round-trip exactly (repr); empty text reads back as None
            assert c[k] == (None if va == "" else va), k
    assert r2[2]["tol_ok"] is False and r2[0]["tol_ok"] is True
    assert "not importable" in r2[0]["fa2_note"]
    with pytest.raises(ValueError):
        b.write_csv(str(tmp_path / "e.csv"), [{"batch": 1, "bogus": 2}], {})


def test_markdown(tmp_path):
    g = b.decode_grid(batches=(8,), contexts=(4096,))
    rows = [_row(c, [0.5, 0.55, 1.0, None, 0.4]) for c in g]
    rows[1]["tol_ok"], rows[1]["tol_note"] = False, "max err 1 > 2x x"
    skipped = b.finish_row(b.config_row(b.DecodeConfig(256, 32768, 16), 0), 3000.0)
    for i in b.IMPLS:
        skipped[i + "_status"], skipped[i + "_note"] = "skipped", "needs 64.0 GiB"
    p = tmp_path / "d.md"
    b.write_markdown(str(p), {"gpu": "G", "date": "D", "commit": "C", "copy_gbps": "3000.0"},
                     rows + [skipped], [("GPU tests", "test_gpu: Passed")])
    t = p.read_text()
    gb = rows[0]["bytes"] / 0.5e-3 / 1e9
    assert "| 8 | 4096 | 1 | %.1f | %.0f (%.0f%%) |" % (
        rows[0]["bytes"] / 1e6, gb, 100 * gb / 3000.0) in t
    assert "n/a (RuntimeError: flash_attn not importable: x)" in t
    assert "| 0.800 | n/a | 2.000 |" in t  # fa/FlashInfer, fa/FA2, fa/SDPA
    assert "skipped (needs 64.0 GiB)" in t
    assert "**FAIL**" in t and "Out of tolerance: b8 ctx4096 ps16" in t
    assert "- copy_gbps: 3000.0" in t and "test_gpu: Passed" in t
    for label in b.LABELS.values():
        assert label in t


def test_result_base_and_args():
    assert b.result_base("2026-11-25", "NVIDIA H100 80GB HBM3") == "2026-11-25-h100-80gb-hbm3-decode"
    a = b.parse_args(["--quick"])
    assert (a.batches, a.contexts, a.page_sizes) == ("1,64", "512,4096", "1,16")
    assert not a.append and b.parse_args(["--append"]).append
    assert b.result_base("2026-11-25", "NVIDIA H100", True) == "2026-11-25-h100-decode-append"
    for bad in (["--min-reps", "5"], ["--page-sizes", "0,16"], ["--batches", "x"]):
        with pytest.raises(SystemExit):
            b.parse_args(bad)


# ---- the re-layout through the library (emulator) ------------------------------

def _binding():
    np = pytest.importorskip("numpy")
    lib = b.common.library_path()
    if lib is None:
        pytest.skip("no built libflashattn.so.0 (build/ or FLASHATTN_LIBRARY)")
    os.environ["FLASHATTN_LIBRARY"] = lib
    sys.path.insert(0, os.path.join(b.common.ROOT, "bindings", "python"))
    try:
        import flashattn as fa
        fa.load_library()
    except Exception as ex:  # the binding or library cannot load here
        pytest.skip("flashattn binding: %s" % ex)
    return np, fa


@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_relayout_matches_contiguous_on_emulator(page_size, tmp_path, monkeypatch):
    """The bench's page pool (plan_pages + token_rows, NaN in every row no
    key uses) decodes to exactly the contiguous cache's bits through the
    binding's block_table path, as the GPU part calls it."""
    np, fa = _binding()
    monkeypatch.setenv("FLASHATTN_CACHE_DIR", str(tmp_path))
    B, L, Hq, Hk, D = 3, 40, 8, 2, 64
    lens = [40, 17, 33]
    rng = np.random.default_rng(page_size)
    q = rng.standard_normal((B, 1, Hq, D)).astype(np.float32)
    k = rng.standard_normal((B, L, Hk, D)).astype(np.float32)
    v = rng.standard_normal((B, L, Hk, D)).astype(np.float32)
    num_pages, table = b.plan_pages(lens, page_size, seed=5)
    rows = b.token_rows(table, lens, page_size)
    kp = np.full((num_pages * page_size, Hk, D), np.nan, dtype=np.float32)
    vp = np.full_like(kp, np.nan)
    for bi, r in enumerate(rows):
        kp[r] = k[bi, :lens[bi]]
        vp[r] = v[bi, :lens[bi]]
    kp = kp.reshape(num_pages, page_size, Hk, D)
    vp = vp.reshape(num_pages, page_size, Hk, D)
    seqlens = np.array(lens, dtype=np.int32)
    with fa.Runtime(backend="emulator", cache="memory") as rt:
        cfg = fa.Config(dtype="fp16", head_dim=D, num_heads_q=Hq, num_heads_kv=Hk)
        o_flat, lse_flat = fa.decode(rt, cfg, q, k, v, seqlens)
        o_paged, lse_paged = fa.decode(rt, cfg, q, kp, vp, seqlens,
                                       block_table=np.array(table, dtype=np.int32))
        cfg.close()
    assert np.isfinite(np.asarray(o_paged, dtype=np.float32)).all()
    assert np.array_equal(np.asarray(o_paged), np.asarray(o_flat))
    assert np.array_equal(lse_paged, lse_flat)
    # and the values are attention over each sequence's keys (fp64 on the
    # fp16-rounded inputs the binding uploads)
    r16 = lambda x: x.astype(np.float16).astype(np.float64)  # noqa: E731
    for bi, n in enumerate(lens):
        qq = r16(q[bi, 0]).reshape(Hk, Hq // Hk, D)
        kk, vv = r16(k[bi, :n]), r16(v[bi, :n])
        s = np.einsum("hgd,nhd->hgn", qq, kk) / math.sqrt(D)
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = np.einsum("hgn,nhd->hgd", p / p.sum(-1, keepdims=True), vv).reshape(Hq, D)
        got = np.asarray(o_paged, dtype=np.float64)[bi, 0]
        assert np.abs(got - ref).max() < 1e-2


def test_fp8_column():
    """The fp8 contender's GB/s counts one byte per K/V element, its speed-up
    is bf16 paged time / fp8 time, and its error is judged on its own."""
    cfg = b.DecodeConfig(64, 4096, 16)
    assert cfg.fp8_bytes_moved == cfg.kv_bytes // 2 + cfg.q_bytes + cfg.o_bytes
    r = _row(cfg, [0.5, 0.55, 1.0, None, 0.4, 0.3])
    assert r["flashattn_fp8_gbps"] == pytest.approx(cfg.fp8_bytes_moved / 0.3e-3 / 1e9)
    assert r["fp8_speedup"] == pytest.approx(0.5 / 0.3)
    assert "| 1.67 |" in b.markdown_table([r])
    others = {"sdpa": (1e-3, 3e-3), "flashattn": (1e-3, 3e-3), "flashattn_contig": (1e-3, 3e-3)}
    assert b.judge(dict(others, flashattn_fp8=(5e-3, 4e-3)))[0] is True
    ok, note = b.judge(dict(others, flashattn_fp8=(0.5, 0.2)))
    assert ok is False and note.startswith("fp8: rel err 0.2")
    ok, note = b.judge(dict(others, flashattn_fp8=(float("nan"), float("nan"))))
    assert ok is False


def test_fp16_result_name():
    assert b.result_base("2026-11-26", "NVIDIA H200") == "2026-11-26-h200-decode"
    assert b.result_base("2026-11-26", "NVIDIA H200", dtype="fp16") == "2026-11-26-h200-decode-fp16"
    assert b.result_base("2026-11-26", "NVIDIA H200", True, "fp16") == \
        "2026-11-26-h200-decode-append-fp16"


# ---- --mla: DeepSeek MLA decode (576 / 512, one KV head, V in K) -------------------

def test_mla_grid():
    g = b.mla_grid()
    assert len(g) == 2 * 4 * 3
    assert {(c.heads_q, c.batch, c.context) for c in g} == {
        (h, x, y) for h in (16, 128) for x in (1, 8, 64, 128) for y in (512, 4096, 32768)}
    for c in g:
        assert (c.heads_kv, c.head_dim, c.head_dim_v, c.page_size, c.seqlen_q, c.dtype) == (
            1, 576, 512, 64, 1, "bf16")
        assert c.v_in_k and not c.append
    sizes = [c.batch * c.context for c in g]
    assert sizes == sorted(sizes)  # a time budget cuts the largest caches
    for i in range(0, len(g), 2):  # the two head counts of one (batch, context) adjacent
        assert (g[i].batch, g[i].context) == (g[i + 1].batch, g[i + 1].context)
        assert (g[i].heads_q, g[i + 1].heads_q) == (16, 128)
    assert g[1].describe() == "b1 ctx512 ps64 h128"
    assert [c.heads_q for c in b.mla_grid((8,), (4096,), (64,))] == [64]
    with pytest.raises(ValueError):  # V in K: head_dim_v <= head_dim, no append
        b.DecodeConfig(1, 64, 64, heads_kv=1, head_dim=256, head_dim_v=512, v_in_k=True)
    with pytest.raises(ValueError):
        b.DecodeConfig(1, 64, 64, heads_kv=1, head_dim=576, head_dim_v=512, v_in_k=True,
                       append=True)


def test_mla_bytes_and_flops():
    """Every contender is charged what MLA must read at least: the K rows
    once (V is inside them), Q and O; FLOPs count Q K^T (576) and P V (512)."""
    c = [x for x in b.mla_grid((8,), (4096,)) if x.heads_q == 128][0]
    k = 8 * 4096 * 576 * 2
    assert c.kv_bytes == k == 37748736
    assert c.q_bytes == 8 * 128 * 576 * 2 and c.o_bytes == 8 * 128 * 512 * 2
    assert c.bytes_moved == k + 8 * 128 * (576 + 512) * 2 == 39976960
    assert c.flops == 8 * 2 * 128 * 4096 * (576 + 512) == 9126805504
    # separate V would read 512 more columns per key: 1.89x the K bytes
    sep = b.DecodeConfig(8, 4096, 64, heads_q=128, heads_kv=1, head_dim=576, head_dim_v=512)
    assert sep.kv_bytes == 8 * 4096 * (576 + 512) * 2 and sep.flops == c.flops
    # memory of one set: contiguous K only (V a view), K pages + the separate V pages
    assert c.contiguous_bytes() == k
    assert c.pool_pages() == 8 * 64 + b.SPARE_PAGES
    assert c.pool_bytes() == c.pool_pages() * 64 * (576 + 512) * 2
    assert c.set_bytes() == k + c.pool_bytes() + c.q_bytes + c.o_bytes
    big = b.mla_grid((128,), (32768,), (128,))[0]
    assert big.set_bytes() < 15 * (1 << 30)  # fits an 80 GB card with room to spare
    # rotation: the smallest point needs more than 64 sets to exceed a 50 MB L2
    small = b.mla_grid((1,), (512,), (16,))[0]
    n = b.n_sets_for(small.kv_bytes, small.set_bytes(), 70 << 30, max_sets=b.MLA_MAX_SETS)
    assert n == b.MLA_MAX_SETS and n * small.kv_bytes > 50e6


def test_mla_row_rates_and_ratios():
    cfg = b.mla_grid((64,), (4096,), (128,))[0]
    r = _row(cfg, [0.2, 0.3, 0.8, None], mla=True)
    assert "fp8_bytes" not in r and r["head_dim_v"] == 512
    for i, t in (("flashattn_mla", 0.2), ("flashattn_mla_sepv", 0.3), ("sdpa", 0.8)):
        assert r[i + "_gbps"] == pytest.approx(cfg.bytes_moved / (t * 1e-3) / 1e9)
        assert r[i + "_pct_copy"] == pytest.approx(100 * r[i + "_gbps"] / 3000.0)
        assert r[i + "_tflops"] == pytest.approx(cfg.flops / (t * 1e-3) / 1e12)
    assert r["ratio_vs_sepv"] == pytest.approx(1.5)
    assert r["ratio_vs_sdpa"] == pytest.approx(4.0)
    assert r["ratio_vs_flash_mla"] is None and r["flash_mla_tflops"] is None


def test_mla_judge():
    ok, note = b.judge({"flashattn_mla": (3e-3, 4e-3), "flashattn_mla_sepv": (3e-3, 4e-3),
                        "sdpa": (2e-3, 3e-3), "flash_mla": (4e-3, 4e-3)}, mla=True)
    assert ok is True and note == ""
    ok, note = b.judge({"flashattn_mla": (1e-3, 4e-3), "flashattn_mla_sepv": (5e-3, 4e-3),
                        "sdpa": (2e-3, 3e-3)}, mla=True)
    assert ok is False and note.startswith("separate V: max err")
    ok, note = b.judge({"flashattn_mla": (1e-3, 2e-2), "flashattn_mla_sepv": (1e-3, 3e-3)},
                       mla=True)  # SDPA and FlashMLA n/a: relative error alone
    assert ok is False and "rel err" in note
    assert b.judge({"sdpa": (1e-3, 1e-3)}, mla=True)[0] is None
    # the GQA mode's names are no baseline here, nor the other way round
    assert b.judge({"flashattn_mla": (1e-2, 3e-3), "fa2": (1e-4, 1e-4)}, mla=True)[0] is True
    assert b.judge({"flashattn": (1e-2, 3e-3), "flash_mla": (1e-4, 1e-4)})[0] is True


def test_mla_csv_round_trip_and_markdown(tmp_path):
    rows = [_row(c, [0.1 + i, 0.2, 0.5, None], mla=True) for i, c in enumerate(b.mla_grid()[:4])]
    rows[3]["tol_ok"], rows[3]["tol_note"] = False, "rel err 0.02 > 1e-02"
    meta = {"commit": "abc", "gpu": "NVIDIA H200", "flash_mla": "not importable (x)",
            "date": "2026-12-01", "copy_gbps": "4000.0"}
    p = tmp_path / "m.csv"
    b.write_csv(str(p), rows, meta, b.MLA_FIELDS)
    m2, r2 = b.read_csv(str(p))
    assert m2 == meta and len(r2) == len(rows)
    for a, c in zip(rows, r2):
        for k in b.MLA_FIELDS:
            va = a.get(k)
            assert c[k] == (None if va == "" else va), k
    assert r2[0]["flashattn_mla_reps"] == 40 and r2[0]["head_dim_v"] == 512
    with pytest.raises(ValueError):  # the GQA mode's fields are not MLA's
        b.write_csv(str(tmp_path / "e.csv"), [b.config_row(b.DecodeConfig(1, 16, 16), 1)], {},
                    b.MLA_FIELDS)
    md = tmp_path / "m.md"
    b.write_markdown(str(md), meta, rows, [("GPU tests", "ok")], mla=True)
    t = md.read_text()
    assert t.startswith("# flashattn MLA decode vs SDPA / FlashMLA: NVIDIA H200, 2026-12-01")
    r = rows[1]
    assert "| 128 | 1 | 512 | 64 | %.1f | %.2f | %.0f (%.0f%%), %.1f TF |" % (
        r["bytes"] / 1e6, r["flops"] / 1e9, r["flashattn_mla_gbps"], r["flashattn_mla_pct_copy"],
        r["flashattn_mla_tflops"]) in t
    assert "n/a (RuntimeError: flash_mla not importable: x)" in t
    assert "| efficient_attention | 2.000 | 5.000 | n/a |" in t
    assert "Out of tolerance: b8 ctx512 ps64 h128" in t and "- flash_mla: not importable" in t
    assert "576 * 2" in t and "2 * heads * context * (576 + 512)" in t
    for label in b.MLA_LABELS.values():
        assert label in t


def test_mla_args_and_result_name():
    a = b.parse_args(["--mla"])
    assert a.mla and (a.batches, a.contexts, a.page_sizes, a.mla_heads) == (
        "1,8,64,128", "512,4096,32768", "64", "16,128")
    a = b.parse_args(["--mla", "--quick", "--mla-heads", "128", "--time-budget", "100"])
    assert (a.batches, a.contexts, a.page_sizes, a.mla_heads, a.time_budget) == (
        "1,64", "512,4096", "64", "128", 100.0)
    assert b.parse_args(["--mla", "--page-sizes", "16,64"]).page_sizes == "16,64"
    a = b.parse_args([])  # the GQA mode's defaults stay
    assert not a.mla and (a.batches, a.page_sizes) == ("1,8,64,256", "1,16")
    for bad in (["--mla", "--append"], ["--mla", "--mla-heads", "0"],
                ["--mla", "--mla-heads", "x"]):
        with pytest.raises(SystemExit):
            b.parse_args(bad)
    assert b.int_list("16,128") == (16, 128)
    assert b.result_base("2026-12-01", "NVIDIA H200", mla=True) == "2026-12-01-h200-decode-mla"
    assert b.result_base("2026-12-01", "NVIDIA H200", dtype="fp16", mla=True) == \
        "2026-12-01-h200-decode-mla-fp16"


def test_mla_lease_stage():
    """gpu_lease.sh runs --mla as its own stage (in the default list), with
    options this parser takes and a budget under the stage's limit."""
    assert "mla" in lease_stage.default_stages()
    limit, budget, args = lease_stage.stage("mla", "bench/bench_decode.py")
    assert 90 <= limit <= 150
    a = b.parse_args(args + ["--time-budget", str(budget)])
    assert a.mla and a.page_sizes == "64" and budget < limit
    assert len(b.mla_grid(b.int_list(a.batches), b.int_list(a.contexts))) >= 8


def _stage_pair(on, off):
    """The parsed options of gpu_lease.sh's bench_decode.py stages `on` and
    `off`: adjacent in the default list, the same options and budget (under
    the limit), batch 1/8 decode."""
    stages = lease_stage.default_stages()
    assert on in stages and stages.index(off) == stages.index(on) + 1
    got = [lease_stage.stage(s, "bench/bench_decode.py") for s in (on, off)]
    assert got[0] == got[1]
    limit, budget, args = got[0]
    a = b.parse_args(args + ["--time-budget", str(budget)])
    assert not a.mla and budget < limit and b.int_list(a.batches) == (1, 8)
    return a


def test_pdl_lease_stages():
    """gpu_lease.sh times the programmatic dependent launches as a pair of
    stages in the default list, pdl then pdloff, over the same points with
    options this parser takes and budgets under the stages' limits."""
    _stage_pair("pdl", "pdloff")
    assert "FLASHATTN_PDL=1" in lease_stage.lease_text().split("stage pdl ", 1)[1].split("\n")[0]


def test_mla90_lease_stage():
    """gpu_lease.sh times the sm_90a MLA decode (FLASHATTN_SM90_MLA=1) right
    after the mla stage, over the same points, so the pair says what it
    buys; testsmla runs test_gpu with it."""
    stages = lease_stage.default_stages()
    assert stages.index("mla90") == stages.index("mla") + 1 and "testsmla" in stages
    got = [lease_stage.stage(s, "bench/bench_decode.py") for s in ("mla", "mla90")]
    assert got[0] == got[1]
    line = lease_stage.lease_text().split("stage mla90 ", 1)[1].split("\n")[0]
    assert "FLASHATTN_SM90_MLA=1" in line


def test_fused_lease_stages():
    """gpu_lease.sh times the fused decode combine as a pair of stages in the
    default list, fused then fusedoff, both with --fused (the same calls,
    split_counters passed), fusedoff with FLASHATTN_DECODE_FUSED=0, over the
    batch 1/8 points with budgets under the stages' limits."""
    a = _stage_pair("fused", "fusedoff")
    assert a.fused and b.int_list(a.contexts) == (4096, 32768)
    text = lease_stage.lease_text()
    assert "FLASHATTN_DECODE_FUSED=0" in text.split("stage fusedoff ", 1)[1].split("\n")[0]
    assert "FLASHATTN_DECODE_FUSED" not in text.split("stage fused ", 1)[1].split("\n")[0]

"""bench/bench_varlen.py: the ragged batch's length distribution, cu_seqlens,
document ids, padded positions and key mask, FLOP and byte counts, the
chunked-prefill FLOPs (bottom-right causal pairs), its paged block table and
gather, the tolerance rule, rows, CSV, markdown, names, options and the
gpu_lease.sh stages, without torch. With torch (CPU) also the GPU part's
mask, pad, page and reference helpers; with torch and a built library the
--self-test end to end, and that it fails when a mask is wrong."""

import math
import os
import statistics
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_sdpa as s  # noqa: E402
import bench_varlen as b  # noqa: E402
import lease_stage  # noqa: E402  (beside this file)


def test_module_does_not_import_torch():
    assert "torch" not in sys.modules


# ---- the ragged batch ------------------------------------------------------------------

def test_default_lengths_fill_the_batch_within_the_clip():
    lens = b.draw_lengths()
    assert sum(lens) == b.TOKENS == 16384
    assert all(b.LEN_MIN <= n <= b.LEN_MAX for n in lens)
    assert lens == b.draw_lengths()  # seeded
    assert lens != b.draw_lengths(seed=b.SEED + 1)
    assert 8 <= len(lens) <= 60  # mean length ~ 600 * e^(0.8^2 / 2) = 826: about 20


def test_lengths_follow_the_stated_lognormal():
    """Median 600, sigma 0.8 (of ln length), over many draws (the clip at
    16 and 8192 cuts less than 0.1% of them)."""
    lens = b.draw_lengths(total=3_000_000, seed=5)
    logs = [math.log(n) for n in lens]
    assert abs(statistics.median(lens) / 600 - 1) < 0.05
    assert abs(statistics.pstdev(logs) - 0.8) < 0.03
    assert abs(statistics.mean(logs) - math.log(600)) < 0.03
    wide = b.draw_lengths(total=3_000_000, sigma=2.0, seed=5)  # clipping now bites
    assert min(wide) == 16 and max(wide) == 8192
    assert all(16 <= n <= 8192 for n in wide)


def test_lengths_remainder_and_errors():
    # lo = hi: every draw is 10, the last cut to the remainder
    assert b.draw_lengths(total=30, lo=10, hi=10) == [10, 10, 10]
    assert b.draw_lengths(total=25, lo=5, hi=10) == [10, 10, 5]
    with pytest.raises(ValueError):  # 10 + 10 + 3: the 3 fits nowhere under hi 10
        b.draw_lengths(total=23, lo=10, hi=10)
    for bad in (dict(lo=0), dict(lo=20, hi=10), dict(total=3, lo=4), dict(median=0),
                dict(sigma=-1)):
        with pytest.raises(ValueError):
            b.draw_lengths(**bad)


def test_remainder_joins_the_shortest():
    """sigma 0: every draw is the median, so the remainder's fate is known."""
    assert b.draw_lengths(total=2 * 50 + 7, median=50, sigma=0, lo=8, hi=100) == [57, 50]
    assert b.draw_lengths(total=2 * 50 + 8, median=50, sigma=0, lo=8, hi=100) == [50, 50, 8]


def test_cu_seqlens_doc_ids_pad_positions_and_mask():
    lens = [3, 1, 4]
    assert b.cu_seqlens(lens) == [0, 3, 4, 8]
    assert b.doc_ids(lens) == [0, 0, 0, 1, 2, 2, 2, 2]
    assert b.pad_positions(lens, 4) == [0, 1, 2, 4, 8, 9, 10, 11]
    assert b.key_mask_rows(lens, 4) == [[True, True, True, False], [True, False, False, False],
                                        [True] * 4]
    with pytest.raises(ValueError):
        b.pad_positions(lens, 3)
    lens = b.draw_lengths(total=4000, seed=3)
    L = max(lens)
    pos = b.pad_positions(lens, L)
    mask = b.key_mask_rows(lens, L)
    # every packed token lands on a distinct padded row, exactly the real ones
    assert len(set(pos)) == len(pos) == sum(lens)
    assert set(pos) == {r * L + j for r in range(len(lens)) for j in range(L) if mask[r][j]}
    cu, doc = b.cu_seqlens(lens), b.doc_ids(lens)
    for r, n in enumerate(lens):
        assert doc[cu[r]:cu[r + 1]] == [r] * n
        assert pos[cu[r]:cu[r + 1]] == list(range(r * L, r * L + n))
    assert b.reference_seqs([5, 9, 2, 9, 4]) == [0, 1, 4]
    assert b.reference_seqs([7]) == [0]


def test_varlen_flops_bytes_and_config():
    lens = (100, 37, 512)
    c = b.VarlenConfig("bf16", 64, False, lens)
    assert c.num_heads == 32 and c.tokens == 649 and c.batch == 3 and c.max_len == 512
    assert c.flops == sum(4 * 32 * n * n * 64 for n in lens)
    cc = b.VarlenConfig("bf16", 64, True, lens)
    assert cc.flops == sum(2 * 32 * n * n * 64 for n in lens)  # halved per sequence
    # equal lengths: bench_sdpa.py's count for the same batch
    eq = b.VarlenConfig("fp16", 128, True, (1024,) * 16)
    assert eq.flops == s.BenchConfig("fp16", 128, True, 1024, 16, 16).flops == eq.padded_flops
    assert c.padded_tokens == 3 * 512 and c.padded_flops == 4 * 32 * 3 * 512 * 512 * 64
    assert c.bytes == 4 * 649 * 2048 * 2
    assert c.describe() == "bf16 d64 full 3 seqs (max 512)"
    g = b.varlen_grid(lens)
    assert len(g) == 8 and {(x.dtype, x.head_dim, x.causal) for x in g} == {
        (dt, d, cz) for dt in ("fp16", "bf16") for d in (64, 128) for cz in (False, True)}
    assert all(x.lens == lens for x in g)
    with pytest.raises(ValueError):
        b.varlen_grid(lens, head_dims=(96,))


# ---- chunked prefill ------------------------------------------------------------------------

def test_causal_pairs_is_the_bottom_right_count():
    for n_q in range(0, 9):
        for n_k in range(0, 12):
            brute = sum(b.visible(i, j, n_q, n_k) for i in range(n_q) for j in range(n_k))
            assert b.causal_pairs(n_q, n_k) == brute, (n_q, n_k)
    assert b.causal_pairs(2048, 2048) == 2048 * 2049 // 2
    assert b.causal_pairs(2048, 4096 + 2048) == 2048 * 4096 + 2048 * 2049 // 2
    # the last query sees every key, the first context + 1
    assert all(b.visible(2047, j, 2048, 6144) for j in range(6144))
    assert b.visible(0, 4096, 2048, 6144) and not b.visible(0, 4097, 2048, 6144)


def test_chunked_config_counts():
    c = b.ChunkedConfig("bf16", 128, 4096)
    assert (c.batch, c.new, c.page_size, c.heads_q, c.heads_kv) == (4, 2048, 16, 32, 8)
    assert c.keys == 6144 and c.pages_per_seq == 384 and c.num_pages == 4 * 384 + 2
    assert c.flops == 4 * 32 * 128 * 4 * (2048 * 4096 + 2048 * 2049 // 2)
    assert c.bytes == 2 * (2 * 4 * 2048 * 32 * 128 + 2 * 4 * 6144 * 8 * 128)
    assert c.describe() == "bf16 d128 b4 ctx4096+2048 ps16"
    g = b.chunked_grid()
    assert [(x.context, x.dtype) for x in g] == [
        (ctx, dt) for ctx in (4096, 8192, 16384, 32768) for dt in ("fp16", "bf16")]
    assert b.chunked_grid((100,), ("bf16",), (64,), batch=2, new=7, page_size=3)[0].num_pages == \
        2 * math.ceil(107 / 3) + 2


def test_chunk_pages_shuffled_distinct_and_gathered_back():
    c = b.ChunkedConfig("bf16", 128, 40, batch=3, new=9, page_size=16)
    table, rows = b.chunk_page_rows(c, seed=1)
    assert len(table) == 3 and all(len(t) == c.pages_per_seq == 4 for t in table)
    used = [p for t in table for p in t]
    assert len(set(used)) == len(used) and all(0 <= p < c.num_pages for p in used)
    assert len(set(range(c.num_pages)) - set(used)) == 2  # the spare pages
    assert used != sorted(used)  # shuffled
    assert len(rows) == 3 * c.keys and len(set(rows)) == len(rows)
    for seq in range(3):
        for j in range(c.keys):
            assert rows[seq * c.keys + j] == table[seq][j // 16] * 16 + j % 16
    # scatter into a pool of rows, gather back: the keys in order
    pool = [None] * (c.num_pages * 16)
    keys = [(seq, j) for seq in range(3) for j in range(c.keys)]
    for r, key in zip(rows, keys):
        pool[r] = key
    assert [pool[r] for r in rows] == keys
    assert sum(x is None for x in pool) == c.num_pages * 16 - 3 * c.keys


# ---- tolerance, rows, CSV, markdown, names, options -------------------------------------

def test_judge():
    ok, note = b.judge({"flashattn": (1e-3, 2e-3), "sdpa_cudnn_padded": (8e-4, 2e-3),
                        "flex": (6e-4, 2e-3)}, ["flashattn"], ["sdpa_cudnn_padded", "flex"])
    assert ok is True and note == ""
    ok, note = b.judge({"flashattn": (1.3e-3, 2e-3), "flex": (6e-4, 2e-3)}, ["flashattn"],
                       ["sdpa_cudnn_padded", "flex"])
    assert ok is False and "max err" in note
    assert b.judge({"flex": (1e-3, 1e-3)}, ["flashattn"], ["flex"])[0] is None
    # both flashattn layouts judged (chunked): the second's failure fails the row
    errs = {"flashattn": (1e-3, 2e-3), "flashattn_contig": (5e-3, 2e-3), "sdpa_flash": (1e-3, 2e-3)}
    ok, note = b.judge(errs, ["flashattn", "flashattn_contig"], ["sdpa_flash", "sdpa_cudnn"])
    assert ok is False and note.startswith("flashattn_contig: max err")
    ok, note = b.judge({"flashattn": (1e-3, 2e-2)}, ["flashattn", "flashattn_contig"], ["sdpa_flash"])
    assert ok is False and "rel err" in note


def _varlen_rows():
    lens = tuple(b.draw_lengths(total=2000, seed=2))
    rows = []
    for n, c in enumerate(b.varlen_grid(lens, ("bf16",))):
        r = b.varlen_row(c, 4)
        for i, ms in zip(b.VARLEN_IMPLS, (0.5 + n, 0.8, None)):
            r[i + "_status"] = "ok" if ms else "n/a"
            r[i + "_median_ms"], r[i + "_tflops"] = ms, s.tflops(c.flops, ms)
            r[i + "_max_err"], r[i + "_rel_err"] = (1e-3, 2e-3) if ms else (None, None)
        r["flex_note"] = "RuntimeError: no Triton | x"
        errs = {i: (r[i + "_max_err"], r[i + "_rel_err"]) for i in b.VARLEN_IMPLS if r[i + "_max_err"]}
        rows.append(b.finish_row(r, errs, False))
    return rows


def _chunked_rows():
    rows = []
    for n, c in enumerate(b.chunked_grid((4096, 32768), ("bf16",))):
        r = b.chunked_row(c, 4)
        for i, ms in zip(b.CHUNK_IMPLS, (10.0 + n, 11.0, 12.0, 20.0)):
            r[i + "_status"], r[i + "_median_ms"] = "ok", ms
            r[i + "_tflops"], r[i + "_reps"] = s.tflops(c.flops, ms), 20
            r[i + "_max_err"], r[i + "_rel_err"] = 2e-3, 3e-3
        errs = {i: (2e-3, 3e-3) for i in b.CHUNK_IMPLS}
        errs["flashattn_contig"] = (5e-3, 3e-3) if n else errs["flashattn_contig"]
        rows.append(b.finish_row(r, errs, True))
    return rows


def test_rows_ratios_and_verdict():
    v = _varlen_rows()
    assert v[0]["ratio_vs_sdpa_cudnn_padded"] == pytest.approx(0.8 / 0.5)
    assert v[0]["ratio_vs_flex"] is None and v[0]["tol_ok"] is True
    assert v[0]["baseline_err"] == 1e-3
    ch = _chunked_rows()
    assert ch[0]["ratio_vs_sdpa_cudnn"] == pytest.approx(2.0)
    assert ch[0]["tol_ok"] is True and ch[1]["tol_ok"] is False
    sk = b.skipped_row(b.chunked_grid((4096,))[0], True, 4, "time budget")
    assert sk["sdpa_flash_status"] == "skipped" and sk["tol_ok"] is None


@pytest.mark.parametrize("chunked", [False, True])
def test_csv_round_trip(tmp_path, chunked):
    rows = _chunked_rows() if chunked else _varlen_rows()
    meta = {"commit": "abc", "gpu": "NVIDIA H200", "date": "2026-11-29"}
    p = tmp_path / "x.csv"
    b.write_csv(str(p), rows, meta, chunked)
    m2, r2 = b.read_csv(str(p))
    assert m2 == meta and len(r2) == len(rows)
    for a, c in zip(rows, r2):
        for k in b.fields(chunked):
            va = a.get(k)
            assert c[k] == (None if va == "" else va), k
    with pytest.raises(ValueError):
        b.write_csv(str(tmp_path / "y.csv"), [dict(rows[0], bogus=1)], meta, chunked)
    with pytest.raises(ValueError):  # the other mode's fields are not this one's
        b.write_csv(str(tmp_path / "z.csv"), rows, meta, not chunked)


def test_markdown(tmp_path):
    v, ch = _varlen_rows(), _chunked_rows()
    p = tmp_path / "v.md"
    b.write_markdown(str(p), {"gpu": "G", "date": "D", "lengths": "L"}, v, False,
                     [("GPU tests", "ok")])
    t = p.read_text()
    r = v[0]
    assert t.startswith("# flashattn varlen forward vs SDPA / FlexAttention: G, D")
    assert "| bf16 | 64 | no | 32 | %d | %d | %.2f | %.1f | %.1f | %.1f | n/a (RuntimeError: no " \
        "Triton / x) | 1.600 | n/a |" % (r["seqs"], r["max_len"], r["padded_tokens"] / r["tokens"],
                                          r["flops"] / 1e9, r["flashattn_tflops"],
                                          r["sdpa_cudnn_padded_tflops"]) in t
    assert "LogNormal(ln 600, 0.8)) clipped to [16, 8192]" in t and "Out of tolerance: none" in t
    for label in b.VARLEN_LABELS.values():
        assert label in t
    p = tmp_path / "c.md"
    b.write_markdown(str(p), {"gpu": "G", "date": "D"}, ch, True)
    t = p.read_text()
    assert "| bf16 | 128 | 4 | 32768 | 2048 | %.1f |" % (ch[1]["flops"] / 1e9) in t
    assert "Out of tolerance: bf16 ctx32768" in t and "causal_lower_right" in t
    for label in b.CHUNK_LABELS.values():
        assert label in t


def test_names_and_options(monkeypatch, capsys):
    assert b.result_base("2026-11-29", "NVIDIA H200") == "2026-11-29-h200-varlen"
    assert b.result_base("2026-11-29", "NVIDIA H200", True) == "2026-11-29-h200-chunked-prefill"
    monkeypatch.setattr(s, "gpu_name", lambda: "NVIDIA H200")
    assert b.main(["--chunked", "--quick", "--print-base-name"]) == 0
    assert capsys.readouterr().out.strip() == "%s-h200-chunked-prefill" % s.today()
    a = b.parse_args([])
    assert (a.dtypes, a.head_dims, a.tokens, a.len_median, a.len_sigma) == (
        "fp16,bf16", "64,128", 16384, 600, 0.8)
    a = b.parse_args(["--chunked", "--quick"])
    assert (a.dtypes, a.head_dims, a.contexts, a.batch, a.new_tokens, a.page_size) == (
        "bf16", "128", "4096,8192,16384,32768", 4, 2048, 16)
    assert len(b.make_grid(a, None)) == 4
    assert len(b.make_grid(b.parse_args(["--quick"]), b.draw_lengths())) == 4
    for bad in (["--min-reps", "5"], ["--dtypes", "fp32"], ["--head-dims", "x"],
                ["--contexts", "0"], ["--page-size", "0"], ["--len-min", "900", "--len-max", "10"]):
        with pytest.raises(SystemExit):
            b.parse_args(bad)


def test_lease_stages():
    """gpu_lease.sh runs both modes as stages varlen and chunked (default
    list and header), --quick, with options this parser takes and budgets
    under their limits."""
    stages = lease_stage.default_stages()
    text = lease_stage.lease_text()
    for name, chunked, lo, hi in (("varlen", False, 90, 200), ("chunked", True, 45, 120)):
        assert name in stages
        assert "#   %s " % name in text
        limit, budget, args = lease_stage.stage(name, "bench/bench_varlen.py")
        a = b.parse_args(args + ["--time-budget", str(budget)])
        assert a.chunked == chunked and a.quick and a.dtypes == "bf16"
        assert lo <= limit <= hi and budget <= limit - 30  # a config started late still fits
    assert "*varlen*.md" in text and "*chunked-prefill*.md" in text


# ---- the GPU part's helpers on CPU tensors (torch) -----------------------------------------

def _torch():
    return pytest.importorskip("torch")


def test_masks_and_bias():
    torch = _torch()
    for n_q, n_k in ((5, 9), (4, 4), (7, 3)):
        m = b.visible_mask(torch, n_q, n_k, "cpu")
        assert m.tolist() == [[b.visible(i, j, n_q, n_k) for j in range(n_k)] for i in range(n_q)]
        assert int(m.sum()) == b.causal_pairs(n_q, n_k)
        bias = b.bottom_right_bias(torch, n_q, n_k, torch.float16, "cpu")
        assert bias.shape == (1, 1, n_q, n_k) and bias.dtype == torch.float16
        assert torch.equal(bias[0, 0] == 0, m) and bool(torch.isinf(bias[0, 0][~m]).all())


def test_pages_pad_and_reference():
    torch = _torch()
    c = b.ChunkedConfig("fp16", 8, 21, batch=2, new=5, page_size=4, heads_q=4, heads_kv=2)
    _, rows = b.chunk_page_rows(c, seed=3)
    rows = torch.tensor(rows)
    x = torch.randn(2, c.keys, 2, 8)
    pool = b.scatter_pages(torch, x, rows, c.num_pages, 4)
    assert pool.shape == (c.num_pages, 4, 2, 8)
    assert int(torch.isnan(pool).any(-1).any(-1).sum()) == c.num_pages * 4 - 2 * c.keys
    assert torch.equal(b.gather_pages(torch, pool, rows, 2, c.keys), x)
    # padded batch: real rows hold the packed tokens, the rest zeros
    lens = [3, 1, 4]
    pk = torch.randn(8, 2, 8)
    pad = b.pad_batch(torch, pk, torch.tensor(b.pad_positions(lens, 4)), 3, 4)
    assert torch.equal(pad[0, :3], pk[:3]) and torch.equal(pad[1, :1], pk[3:4])
    assert torch.equal(pad[2], pk[4:]) and not pad[0, 3].any() and not pad[1, 1:].any()
    # the chunked reference against SDPA's math in fp64 on the bottom-right mask
    q = torch.randn(2, 5, 4, 8)
    kc, vc = torch.randn(2, c.keys, 2, 8), torch.randn(2, c.keys, 2, 8)
    idx = (torch.tensor([0, 1]), torch.tensor([0, 3]), torch.tensor([0, 2, 4]))
    ref = b.chunked_reference(torch, c, q, kc, vc, idx)
    mask = b.visible_mask(torch, 5, c.keys, "cpu")
    want = torch.nn.functional.scaled_dot_product_attention(
        q.double().transpose(1, 2), kc.double().repeat_interleave(2, 2).transpose(1, 2),
        vc.double().repeat_interleave(2, 2).transpose(1, 2), attn_mask=mask).transpose(1, 2)
    want = want.index_select(0, idx[0]).index_select(1, idx[2]).index_select(2, idx[1])
    assert torch.allclose(ref.double(), want, atol=1e-5)


def test_varlen_reference_against_per_sequence_sdpa():
    torch = _torch()
    lens = (7, 30, 12)
    cu = b.cu_seqlens(lens)
    for causal in (False, True):
        c = b.VarlenConfig("fp16", 8, causal, lens, hidden=40)  # 5 heads
        q, k, v = (torch.randn(49, 5, 8) for _ in range(3))
        ref, tok, pad, hs = b.varlen_reference(torch, c, q, k, v, max_rows=4)
        full = torch.cat([torch.nn.functional.scaled_dot_product_attention(
            *(x[cu[r]:cu[r + 1]].double().transpose(0, 1) for x in (q, k, v)),
            is_causal=causal).transpose(0, 1) for r in range(3)])  # [49, 5, 8] in fp64
        assert torch.allclose(ref.double(), full.index_select(0, tok).index_select(1, hs),
                              atol=1e-5)
        seqs = b.reference_seqs(list(lens))
        assert seqs == [0, 1, 2] and hs.tolist() == s.reference_subset(1, 5, 1)[1]
        rows = [s.reference_subset(1, 1, lens[r], max_rows=4)[2] for r in seqs]
        assert tok.tolist() == [cu[r] + j for r, rs in zip(seqs, rows) for j in rs]
        assert pad.tolist() == [r * 30 + j for r, rs in zip(seqs, rows) for j in rs]


# ---- --self-test (torch and a built library) ------------------------------------------------

def _self_test(tmp_path):
    _torch()
    lib = s.library_path()
    if lib is None:
        pytest.skip("no built libflashattn.so.0 (build/ or FLASHATTN_LIBRARY)")
    try:
        s.import_flashattn()
    except BaseException as ex:  # the binding or library cannot load here
        pytest.skip("flashattn binding: %s" % ex)
    return b.main(["--self-test", "--out-dir", str(tmp_path)])


def test_self_test_passes(tmp_path):
    assert _self_test(tmp_path) == 0
    _, rows = b.read_csv(str(tmp_path / "selftest-chunked-prefill.csv"))
    assert all(rows[0][i + "_status"] == "ok" for i in b.CHUNK_IMPLS)
    _, rows = b.read_csv(str(tmp_path / "selftest-varlen.csv"))
    assert [r["causal"] for r in rows] == [False, True]
    assert all(r[i + "_rel_err"] < 1e-2 for r in rows for i in b.VARLEN_IMPLS)


@pytest.mark.parametrize("wrong", ["top_left_bias", "no_key_mask", "one_document"])
def test_self_test_catches_a_wrong_mask(tmp_path, monkeypatch, wrong):
    """The self-test compares every contender with the reference: a dense
    mask aligned top-left, a padded batch without its key mask, or a
    document mask that joins all sequences, each fails it."""
    if wrong == "top_left_bias":
        def top_left(torch, n_q, n_k, dtype, device):  # SDPA's is_causal alignment
            i, j = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
            return torch.zeros((n_q, n_k), dtype=dtype).masked_fill_(
                j > i, float("-inf")).view(1, 1, n_q, n_k)
        monkeypatch.setattr(b, "bottom_right_bias", top_left)
    elif wrong == "no_key_mask":
        monkeypatch.setattr(b, "key_mask_rows", lambda lens, L: [[True] * L for _ in lens])
    else:
        monkeypatch.setattr(b, "doc_ids", lambda lens: [0] * sum(lens))
    assert _self_test(tmp_path) == 4

"""Torch-free parts of bench/bench_sdpa.py: grid, FLOPs, TFLOP/s and ratios,
median with rotation, CSV round trip, the stdlib PNG writer, tolerance."""

import math
import os
import struct
import sys
import zlib

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_sdpa as b  # noqa: E402
import lease_stage  # noqa: E402  (beside this file)


def test_module_does_not_import_torch():
    assert "torch" not in sys.modules


def test_grid_shapes_and_order():
    g = b.config_grid()
    assert len(g) == 2 * 3 * 2 * 6
    for c in g:
        assert c.batch * c.seqlen == 16384
        assert c.num_heads * c.head_dim == 2048
    assert {c.seqlen for c in g} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {(c.dtype, c.head_dim, c.causal) for c in g} == {
        (d, h, cz) for d in ("fp16", "bf16") for h in (64, 128, 256) for cz in (False, True)}
    seqs = [c.seqlen for c in g]
    assert seqs == sorted(seqs)  # seqlen outermost: the budget cuts the longest first
    assert len(set(g)) == len(g)
    c = [x for x in g if x.seqlen == 2048 and x.head_dim == 128][0]
    assert (c.batch, c.num_heads) == (8, 16)


def test_grid_rejects_bad_sizes():
    with pytest.raises(ValueError):
        b.config_grid(seqlens=(3000,))
    with pytest.raises(ValueError):
        b.config_grid(head_dims=(96 * 7,))


def test_flops_formula_and_causal_halving():
    assert b.attention_flops(2, 3, 5, 7, 11, False) == 4 * 2 * 3 * 5 * 7 * 11
    assert b.attention_flops(2, 3, 5, 7, 11, True) == 2 * 2 * 3 * 5 * 7 * 11
    c = b.BenchConfig("fp16", 128, False, 4096, 4, 16)
    assert c.flops == 4 * 4 * 16 * 4096 * 4096 * 128
    cc = b.BenchConfig("fp16", 128, True, 4096, 4, 16)
    assert cc.flops * 2 == c.flops
    # In the grid the FLOPs grow linearly with seqlen (batch * seqlen fixed).
    assert b.BenchConfig("bf16", 64, False, 1024, 16, 32).flops == 4 * 16384 * 1024 * 2048


def test_tflops_and_ratio():
    assert b.tflops(2e12, 10.0) == pytest.approx(200.0)
    assert b.tflops(1e12, 0.5) == pytest.approx(2000.0)
    assert b.tflops(1e12, None) is None and b.tflops(1e12, 0.0) is None
    assert b.ratio(150.0, 300.0) == pytest.approx(0.5)
    assert b.ratio(None, 3.0) is None and b.ratio(3.0, None) is None and b.ratio(3.0, 0.0) is None
    # ratio of TFLOP/s equals the inverse ratio of times on the same config
    f = b.attention_flops(1, 16, 16384, 16384, 128, True)
    assert b.ratio(b.tflops(f, 4.0), b.tflops(f, 3.0)) == pytest.approx(0.75)


def test_median():
    assert b.median([3.0, 1.0, 2.0]) == 2.0
    assert b.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert b.median([None, 5.0]) == 5.0
    with pytest.raises(ValueError):
        b.median([])


def test_rotation_bookkeeping():
    r = b.Rotation(3)
    seen = []
    for k in range(7):
        i = r.next()
        seen.append(i)
        r.record(i, 10.0 + i + (100.0 if k == 6 else 0.0))  # one outlier on set 0
    assert seen == [0, 1, 2, 0, 1, 2, 0]
    assert r.counts() == [3, 2, 2] and r.balanced()
    assert r.median() == 11.0  # times 10,11,12,10,11,12,110 -> median 11
    assert r.per_set_median() == [10.0, 11.0, 12.0]
    s = r.summary()
    assert s == {"median_ms": 11.0, "min_ms": 10.0, "max_ms": 110.0, "reps": 7}
    r2 = b.Rotation(4)
    r2.record(0, 1.0)
    assert not r2.balanced() and r2.per_set_median()[1] is None
    with pytest.raises(ValueError):
        r2.record(4, 1.0)
    with pytest.raises(ValueError):
        b.Rotation(0)


def test_choose_reps():
    assert b.choose_reps(0.1, 150.0) == 100  # capped
    assert b.choose_reps(5.0, 150.0) == 30
    assert b.choose_reps(50.0, 150.0) == 20  # never under the minimum
    assert b.choose_reps(None, 150.0) == 20


def test_tolerance_judgement():
    ok, note = b.judge_tolerance((1e-3, 2e-3), {"sdpa_flash": (9e-4, 1e-3), "sdpa_cudnn": (6e-4, 1e-3)})
    assert ok is True and note == ""
    # the baseline is the best SDPA backend: 2 * 6e-4 < 1.3e-3
    ok, note = b.judge_tolerance((1.3e-3, 2e-3), {"sdpa_flash": (9e-4, 1e-3), "sdpa_cudnn": (6e-4, 1e-3)})
    assert ok is False and "max err" in note
    ok, note = b.judge_tolerance((1e-3, 2e-2), {"sdpa_flash": (1e-3, 1e-3)})
    assert ok is False and "rel err" in note
    ok, note = b.judge_tolerance((float("nan"), 1e-3), {"sdpa_flash": (1e-3, 1e-3)})
    assert ok is False and "non-finite" in note
    ok, _ = b.judge_tolerance((1e-3, float("inf")), {})
    assert ok is False
    # no SDPA ran: torch's same-dtype math is the baseline, else rel only
    ok, note = b.judge_tolerance((3e-3, 1e-3), {}, baseline_err=1e-3)
    assert ok is False and "torch math" in note
    ok, note = b.judge_tolerance((3e-3, 1e-3), {})
    assert ok is True and "rel err only" in note
    ok, note = b.judge_tolerance(None, {"sdpa_flash": (1e-3, 1e-3)})
    assert ok is None
    # a NaN SDPA error is not used as a baseline
    ok, _ = b.judge_tolerance((3e-3, 1e-3), {"sdpa_cudnn": (float("nan"), 1.0), "sdpa_flash": (1e-3, 1e-3)})
    assert ok is False


def test_reference_subset_bounds():
    bs, hs, rows = b.reference_subset(1, 8, 16384)
    assert bs == [0] and hs == [0, 2, 5, 7] and len(rows) == 2048
    assert rows[0] == 0 and rows[-1] == 16383 and rows == sorted(set(rows))
    bs, hs, rows = b.reference_subset(32, 32, 512)
    assert bs == [0, 31] and len(hs) == 4 and rows == list(range(512))


def _row(c, fa_ms, fl_ms, cu_status="n/a"):
    r = {"dtype": c.dtype, "head_dim": c.head_dim, "causal": c.causal, "seqlen": c.seqlen,
         "batch": c.batch, "num_heads": c.num_heads, "flops": c.flops, "n_sets": 4,
         "flashattn_status": "ok", "flashattn_median_ms": fa_ms, "flashattn_reps": 20,
         "flashattn_tflops": b.tflops(c.flops, fa_ms), "flashattn_max_err": 1.5e-3,
         "flashattn_rel_err": 3e-4, "sdpa_flash_status": "ok", "sdpa_flash_median_ms": fl_ms,
         "sdpa_flash_tflops": b.tflops(c.flops, fl_ms), "sdpa_flash_max_err": 1e-3,
         "sdpa_cudnn_status": cu_status, "sdpa_cudnn_note": "RuntimeError: No available kernel, x",
         "tol_ok": True, "tol_note": ""}
    r["ratio_vs_sdpa_flash"] = b.ratio(r["flashattn_tflops"], r["sdpa_flash_tflops"])
    return r


def test_csv_round_trip(tmp_path):
    g = b.config_grid(seqlens=(512, 16384), head_dims=(64, 256))
    rows = [_row(c, 1.25 + i, 0.5 + i / 3) for i, c in enumerate(g)]
    rows[1]["tol_ok"], rows[1]["tol_note"] = False, "rel err 0.02 > 1e-02"
    meta = {"commit": "abc123 (+ uncommitted changes)", "gpu": "NVIDIA H100 80GB HBM3",
            "driver": "580.159.04", "torch": "2.11.0+cu130", "cuda": "13.0", "date": "2026-11-21"}
    p = tmp_path / "x.csv"
    b.write_csv(str(p), rows, meta)
    text = p.read_text()
    assert text.startswith("# commit: abc123")
    m2, r2 = b.read_csv(str(p))
    assert m2 == meta
    assert len(r2) == len(rows)
    for a, c in zip(rows, r2):
        for k in b.FIELDS:
            va = a.get(k)
            if isinstance(va, float):
                assert c[k] == va, k  # repr() round-trips floats exactly
            else:  # empty text reads back as None
                assert c[k] == (None if va == "" else va), (k, va, c[k])
    assert r2[1]["tol_ok"] is False and r2[0]["causal"] is False and r2[1]["causal"] is True
    assert r2[0]["sdpa_cudnn_tflops"] is None and "No available kernel, x" in r2[0]["sdpa_cudnn_note"]


def test_csv_rejects_unknown_field(tmp_path):
    with pytest.raises(ValueError):
        b.write_csv(str(tmp_path / "y.csv"), [{"dtype": "fp16", "bogus": 1}], {})


def _png_parts(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        n, = struct.unpack(">I", data[pos:pos + 4])
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        crc, = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF
        chunks.append((tag, body))
        pos += 12 + n
    assert pos == len(data)
    return chunks


def test_png_writer_valid():
    w, h = 7, 3
    px = b"".join(bytes((x * 30, y * 80, 200)) for y in range(h) for x in range(w))
    chunks = _png_parts(b.png_bytes(w, h, px))
    assert [t for t, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    W, H, depth, ctype, comp, filt, inter = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (W, H, depth, ctype, comp, filt, inter) == (w, h, 8, 2, 0, 0, 0)
    raw = zlib.decompress(chunks[1][1])
    assert len(raw) == h * (1 + 3 * w)
    for y in range(h):  # filter byte 0, then the pixels as given
        line = raw[y * (1 + 3 * w):(y + 1) * (1 + 3 * w)]
        assert line[0] == 0 and line[1:] == px[y * 3 * w:(y + 1) * 3 * w]
    with pytest.raises(ValueError):
        b.png_bytes(2, 2, b"\x00" * 11)


def test_canvas_text_and_rect():
    c = b.Canvas(40, 12)
    c.rect(-5, -5, 3, 3, (1, 2, 3))  # clipped
    assert c.pixel(0, 0) == (1, 2, 3) and c.pixel(3, 3) == (255, 255, 255)
    wdt = c.text(10, 2, "l1", color=(0, 0, 0))
    assert wdt == 12
    # 'L' is a vertical stroke in column 0 and a full bottom row
    assert all(c.pixel(10, 2 + y) == (0, 0, 0) for y in range(7))
    assert all(c.pixel(10 + x, 8) == (0, 0, 0) for x in range(5))
    assert c.pixel(11, 2) == (255, 255, 255)
    for ch, g in b._GLYPHS.items():
        rows = g.split()
        assert len(rows) == 7 and all(len(r) == 5 and set(r) <= {"#", "."} for r in rows), ch


def test_chart_png(tmp_path):
    g = b.config_grid()
    rows = [_row(c, 2.0 + i % 5, 1.0 + i % 3) for i, c in enumerate(g)]
    rows[3]["flashattn_tflops"] = None  # n/a bar
    p = tmp_path / "c.png"
    data = b.render_chart_png(rows, "flashattn vs SDPA test", str(p))
    assert p.read_bytes() == data
    chunks = _png_parts(data)
    W, H = struct.unpack(">II", chunks[0][1][:8])
    assert W >= 460 and H > 4 * 200
    raw = zlib.decompress(b"".join(body for t, body in chunks if t == b"IDAT"))
    assert len(raw) == H * (1 + 3 * W)
    # every implementation's colour appears (bars were drawn)
    for impl in b.IMPLS:
        assert bytes(b.COLORS[impl]) in raw


def test_markdown(tmp_path):
    g = b.config_grid(seqlens=(512,), head_dims=(128,), dtypes=("bf16",))
    rows = [_row(c, 2.0, 1.0) for c in g]
    rows[1]["tol_ok"], rows[1]["tol_note"] = False, "max err 1 > 2x SDPA's 0.1"
    p = tmp_path / "r.md"
    b.write_markdown(str(p), {"gpu": "G", "date": "D", "commit": "C"}, rows,
                     [{"kernel": "k", "gen_us": 90.0, "cold_first_ms": 40.0, "warm_ms": 0.1,
                       "disk_first_ms": 2.0, "inproc_first_ms": 0.12, "cold_mem_first_ms": 20.0,
                       "disk_drvcache_first_ms": 0.5, "disk_jit_first_ms": 300.0,
                       "compiler_mode": "plugin", "compiler": "nvPTXCompiler 13.5"}],
                     [("GPU tests", "test_gpu: Passed")])
    t = p.read_text()
    assert "| bf16 | 128 | no | 512 | 32 x 16 |" in t
    assert "**FAIL**" in t and "Out of tolerance: bf16 d128 causal s512" in t
    assert "0.500" in t  # fa/flash ratio
    assert "n/a (RuntimeError: No available kernel, x)" in t
    assert ("| k | 90.0 | 40.00 | 0.100 | 39.90 | 20.00 | 19.81 | 2.00 | 1.90 | 0.50 | 300.00 | "
            "0.120 | plugin nvPTXCompiler 13.5 |") in t
    assert "test_gpu: Passed" in t


def test_slug_and_base():
    assert b.slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert b.result_base("2026-11-21", "NVIDIA H200") == "2026-11-21-h200-sdpa"
    assert b.slug("") == "unknown-gpu"


def test_args_enforce_min_reps():
    a = b.parse_args(["--quick"])
    assert a.seqlens == "512,2048" and a.min_reps >= 20
    with pytest.raises(SystemExit):
        b.parse_args(["--min-reps", "5"])


def test_sdpa_lease_stage():
    """gpu_lease.sh's sdpa stage runs the script's whole seqlen grid (512
    to 16k, issue 27) at head_dim 64/128/256, within its budget."""
    assert "sdpa" in lease_stage.default_stages()
    limit, budget, args = lease_stage.stage("sdpa", "bench/bench_sdpa.py")
    i = args.index("--dtypes")
    del args[i:i + 2]  # ${FA_LEASE_DTYPES:-bf16}: the shell's to expand
    a = b.parse_args(args + ["--time-budget", str(budget)])
    assert a.seqlens == ",".join(map(str, b.SEQLENS)) == "512,1024,2048,4096,8192,16384"
    assert a.head_dims == "64,128,256" and a.no_coldstart and budget < limit

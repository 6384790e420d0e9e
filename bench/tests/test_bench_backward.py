"""bench/bench_backward.py (bench_sdpa.py --backward) without torch: the
backward's FLOP count, grid and skipped head dims, rows and ratios, the
tolerance rule per gradient and for the deterministic bits, issue 30's
summary, CSV, markdown, chart, options, result names and the gpu_lease.sh
stage. With torch and a built library (a child process: the other bench
tests check that torch is not imported) also the GPU part on the CPU
through the emulator: the fp32 reference gradients against fp64 autograd,
and a scaled or unwritten flashattn gradient caught."""

import dataclasses
import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
import zlib

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_backward as b  # noqa: E402
import bench_sdpa as s  # noqa: E402
import lease_stage  # noqa: E402  (beside this file)


def test_module_does_not_import_torch():
    assert "torch" not in sys.modules


# ---- FLOPs, grid, rows ------------------------------------------------------------------

def test_backward_flops_are_two_and_a_half_forwards():
    assert b.backward_flops(2, 3, 5, 7, 11, False) == 10 * 2 * 3 * 5 * 7 * 11
    assert b.backward_flops(2, 3, 5, 7, 11, True) == 5 * 2 * 3 * 5 * 7 * 11
    for causal in (False, True):
        f = b.backward_flops(1, 16, 16384, 16384, 128, causal)
        assert isinstance(f, int)
        assert f == 2.5 * s.attention_flops(1, 16, 16384, 16384, 128, causal)
    c = s.BenchConfig("bf16", 128, True, 4096, 4, 16)
    r = b.config_row(c, 4)
    assert r["flops"] == 5 * 4 * 16 * 4096 * 4096 * 128 and r["flops"] == 2.5 * c.flops
    assert r["n_sets"] == 4 and "flashattn_det_status" not in r


def test_grid_is_bench_sdpa_s_and_head_dims_past_256_are_skipped():
    g = b.backward_grid()
    assert g == s.config_grid()
    assert all(b.runnable(c) for c in g)  # bench_sdpa's head dims: 64, 128, 256
    c = [x for x in g if x.head_dim == 256][0]
    c = dataclasses.replace(c, head_dim=320)
    assert not b.runnable(c)
    r = b.skipped_row(c, 4, b.HEAD_DIM_SKIP)
    assert all(r[i + "_status"] == "skipped" and r[i + "_note"] == b.HEAD_DIM_SKIP
               for i in b.IMPLS)
    assert "256" in b.HEAD_DIM_SKIP and r["ratio_vs_sdpa_cudnn"] is None
    # the order given is kept: the lease puts issue 30's seqlens first
    g2 = b.backward_grid(("bf16",), (128,), (4096, 1024))
    assert [c.seqlen for c in g2] == [4096, 4096, 1024, 1024]


def test_deterministic_mode_only_with_the_flag():
    assert b.measured_impls(True) == b.IMPLS
    assert b.measured_impls(False) == ("flashattn", "sdpa_flash", "sdpa_cudnn")
    c = s.BenchConfig("bf16", 64, False, 1024, 16, 32)
    r = b.config_row(c, 4, deterministic=False)
    assert (r["flashattn_det_status"], r["flashattn_det_note"]) == ("skipped", b.NO_DET)
    r = b.skipped_row(c, 4, "time budget", deterministic=False)
    assert r["flashattn_note"] == "time budget" and r["flashattn_det_note"] == b.NO_DET


def test_ratios_and_det_slowdown():
    c = s.BenchConfig("bf16", 128, False, 4096, 4, 16)
    r = b.config_row(c, 4)
    for impl, ms in (("flashattn", 2.0), ("flashattn_det", 2.2), ("sdpa_flash", 3.5),
                     ("sdpa_cudnn", 2.5)):
        r[impl + "_median_ms"], r[impl + "_tflops"] = ms, s.tflops(r["flops"], ms)
    b.finish_row(r)
    assert r["ratio_vs_sdpa_flash"] == pytest.approx(1.75)  # time ratio, inverted
    assert r["ratio_vs_sdpa_cudnn"] == pytest.approx(1.25)
    assert r["det_slowdown"] == pytest.approx(1.1)
    r["flashattn_det_median_ms"] = None
    assert b.finish_row(r)["det_slowdown"] is None


def test_fields():
    assert len(set(b.FIELDS)) == len(b.FIELDS)
    for i in b.IMPLS:
        for g in b.GRADS:
            assert "%s_%s_max_err" % (i, g) in b.FIELDS and "%s_%s_rel_err" % (i, g) in b.FIELDS
        assert i + "_tflops" in b.FIELDS and i + "_median_ms" in b.FIELDS
    for f in ("flops", "ratio_vs_sdpa_flash", "ratio_vs_sdpa_cudnn", "det_slowdown",
              "det_bitwise", "tol_ok", "tol_note"):
        assert f in b.FIELDS


# ---- tolerance ------------------------------------------------------------------------------

def _errs(dq=(1e-3, 2e-3), dk=(1e-3, 2e-3), dv=(1e-3, 2e-3)):
    return {"dq": dq, "dk": dk, "dv": dv}


def test_judge_backward_per_gradient():
    sdpa = {"sdpa_flash": _errs(), "sdpa_cudnn": _errs(dk=(6e-4, 1e-3))}
    assert b.judge_backward(_errs(), sdpa) == (True, "")
    # dk's baseline is the better backend's: 2 * 6e-4 < 1.3e-3
    ok, note = b.judge_backward(_errs(dk=(1.3e-3, 2e-3)), sdpa)
    assert ok is False and note.startswith("dk: max err") and "dq" not in note
    ok, note = b.judge_backward(_errs(dv=(1e-3, 2e-2)), sdpa)
    assert ok is False and note.startswith("dv: rel err")
    ok, note = b.judge_backward(_errs(dq=(float("nan"), float("nan"))), sdpa)
    assert ok is False and "dq: non-finite" in note
    ok, note = b.judge_backward(_errs(dq=(1.0, 0.5)), sdpa)  # both rules, one gradient
    assert ok is False and note.count("dq:") == 1 and "rel err" in note and "max err" in note
    # no SDPA backward: relative error only, said once
    ok, note = b.judge_backward(_errs(dq=(1.0, 2e-3)), {})
    assert ok is True and note == "rel err only (no SDPA backward ran)"
    assert b.judge_backward(None, sdpa)[0] is None


def test_judge_row_both_modes_and_the_bits():
    sdpa = {"sdpa_flash": _errs(), "sdpa_cudnn": None}  # cuDNN n/a
    assert b.judge_row(dict(sdpa, flashattn=_errs(), flashattn_det=_errs()), True) == (True, "")
    ok, note = b.judge_row(dict(sdpa, flashattn=_errs(), flashattn_det=_errs(dq=(5e-3, 2e-3))))
    assert ok is False and note.startswith("det: dq: max err")
    ok, note = b.judge_row(dict(sdpa, flashattn=_errs(), flashattn_det=_errs()), False)
    assert ok is False and "different bits" in note
    ok, note = b.judge_row(dict(sdpa, flashattn=None, flashattn_det=None))
    assert ok is None and "no flashattn output" in note
    ok, note = b.judge_row(dict(sdpa, flashattn=_errs(), flashattn_det=None))
    assert ok is True and note == "det: no output"
    # without --deterministic only the default mode is judged
    assert b.judge_row(dict(sdpa, flashattn=_errs())) == (True, "")
    assert b.judge_row({})[0] is None


# ---- issue 30's summary --------------------------------------------------------------------

def _row(dtype, d, causal, seqlen, cudnn=1.1, flash=1.7, det=1.05, tol=True):
    c = s.BenchConfig(dtype, d, causal, seqlen, 16384 // seqlen, 2048 // d)
    r = b.config_row(c, 4)
    fa_ms = 1.0
    r.update({"flashattn_status": "ok", "flashattn_median_ms": fa_ms,
              "flashattn_tflops": s.tflops(r["flops"], fa_ms), "tol_ok": tol, "tol_note": "",
              "det_bitwise": True})
    for g in b.GRADS:
        r["flashattn_%s_rel_err" % g], r["flashattn_%s_max_err" % g] = 2e-3, 1e-2
        r["sdpa_flash_%s_rel_err" % g] = 1.5e-3
    for impl, ratio in (("sdpa_cudnn", cudnn), ("sdpa_flash", flash)):
        if ratio is not None:
            r[impl + "_status"], r[impl + "_median_ms"] = "ok", fa_ms * ratio
            r[impl + "_tflops"] = s.tflops(r["flops"], fa_ms * ratio)
        else:
            r[impl + "_status"], r[impl + "_note"] = "n/a", "RuntimeError: No available kernel"
    if det is not None:
        r["flashattn_det_status"], r["flashattn_det_median_ms"] = "ok", fa_ms * det
        r["flashattn_det_tflops"] = s.tflops(r["flops"], fa_ms * det)
    return b.finish_row(r)


def test_summary_met_missed_incomplete():
    rows = [_row("bf16", 128, False, sl) for sl in (1024, 4096, 8192, 16384)]
    rows += [_row("bf16", 128, True, 4096), _row("bf16", 128, True, 8192, flash=1.5),
             _row("bf16", 128, True, 16384, det=1.2)]
    rows += [_row("fp16", 128, False, 4096), _row("fp16", 128, False, 8192, cudnn=None),
             _row("fp16", 128, False, 16384)]
    rows += [_row("fp16", 128, True, sl, tol=False if sl == 8192 else True)
             for sl in (4096, 8192, 16384)]
    rows += [_row("bf16", 64, False, 4096, cudnn=0.5)]  # not an issue-30 point
    e = {(x["dtype"], x["causal"]): x for x in b.issue30_summary(rows)}
    assert set(e) == {("bf16", False), ("bf16", True), ("fp16", False), ("fp16", True)}
    full = e[("bf16", False)]
    assert full["verdict"] == "met" and full["why"] == [] and full["seqlens"] == [4096, 8192, 16384]
    assert full["ratio_vs_sdpa_cudnn"] == (pytest.approx(1.1), pytest.approx(1.1), 3)
    assert full["ratio_vs_sdpa_flash"][0] == pytest.approx(1.7)
    assert full["det_slowdown"][0] == pytest.approx(1.05) and full["det_slowdown"][2] == 3
    causal = e[("bf16", True)]
    assert causal["verdict"] == "missed"
    assert causal["why"] == ["fa/flash 1.500 < 1.6 at s8192", "det/default 1.200 > 1.15 at s16384"]
    assert causal["ratio_vs_sdpa_flash"][0] == pytest.approx(1.5)
    assert e[("fp16", False)]["verdict"] == "incomplete"
    assert e[("fp16", False)]["why"] == ["fa/cuDNN at 2 of 3 seqlens"]
    assert e[("fp16", True)]["verdict"] == "missed"
    assert e[("fp16", True)]["why"] == ["out of tolerance at s8192"]
    # a seqlen missing from the grid, or no --deterministic: incomplete
    e = b.issue30_summary([_row("bf16", 128, False, 4096, det=None),
                           _row("bf16", 128, False, 8192, det=None)])[0]
    assert e["verdict"] == "incomplete" and e["seqlens"] == [4096, 8192]
    assert "det/default at 0 of 3 seqlens" in e["why"] and "fa/cuDNN at 2 of 3 seqlens" in e["why"]
    assert b.issue30_summary([_row("bf16", 64, False, 4096)]) == []
    assert "no head_dim 128 rows" in b.summary_table([])


def test_summary_table_and_overall_line():
    rows = [_row("bf16", 128, False, sl, cudnn=1.0 + sl / 16384) for sl in (4096, 8192, 16384)]
    t = b.summary_table(b.issue30_summary(rows))
    lines = t.splitlines()
    assert lines[0].startswith("| dtype | causal | seqlens | fa/cuDNN min / geomean (>= 1) |")
    assert "fa/flash min / geomean (>= 1.6)" in lines[0] and "(<= 1.15)" in lines[0]
    geo = (1.25 * 1.5 * 2.0) ** (1 / 3)
    assert lines[2] == ("| bf16 | no | 4096,8192,16384 | 1.250 / %.3f | 1.700 / 1.700 | "
                        "1.050 / 1.050 | met |" % geo)
    line = b.overall_line(rows + [_row("bf16", 64, True, 1024, cudnn=None, det=None)])
    assert "fa/cuDNN %.3f (3 configs)" % geo in line and "fa/flash 1.700 (4 configs)" in line
    assert "det/default time 1.050 (3 configs)" in line
    assert b.geomean([]) is None and b.geomean([None, 4.0, 1.0]) == pytest.approx(2.0)


# ---- CSV, markdown, chart ------------------------------------------------------------------

def test_csv_round_trip(tmp_path):
    rows = [_row("bf16", 128, False, 4096), _row("bf16", 128, True, 8192, cudnn=None),
            b.skipped_row(s.BenchConfig("bf16", 256, False, 4096, 4, 8), 4, b.HEAD_DIM_SKIP)]
    rows[1]["det_bitwise"], rows[1]["tol_ok"] = False, False
    rows[1]["tol_note"] = "deterministic mode: two runs gave different bits"
    meta = {"commit": "abc", "gpu": "NVIDIA H200", "date": "2026-12-01", "deterministic": "yes"}
    p = tmp_path / "r.csv"
    b.write_csv(str(p), rows, meta)
    m2, r2 = b.read_csv(str(p))
    assert m2 == meta and len(r2) == 3
    for a, c in zip(rows, r2):
        for k in b.FIELDS:
            want = None if a.get(k) == "" else a.get(k)  # "" reads back as None
            assert c[k] == want, (k, want, c[k])  # floats round-trip exactly
    assert r2[0]["det_bitwise"] is True and r2[1]["det_bitwise"] is False
    assert r2[2]["det_bitwise"] is None and r2[2]["flashattn_status"] == "skipped"
    assert isinstance(r2[0]["flashattn_dq_rel_err"], float) and isinstance(r2[0]["flops"], int)


def test_markdown_leads_with_issue_30(tmp_path):
    rows = [_row("bf16", 128, c, sl) for sl in (4096, 8192, 16384) for c in (False, True)]
    rows[3]["tol_ok"], rows[3]["tol_note"] = False, "dq: rel err 0.02 > 1e-02"
    rows[3]["det_bitwise"] = False
    rows.append(b.skipped_row(s.BenchConfig("bf16", 256, False, 4096, 4, 8), 4, b.HEAD_DIM_SKIP))
    rows.append(_row("bf16", 64, False, 1024, cudnn=None))
    p = tmp_path / "r.md"
    b.write_markdown(str(p), {"gpu": "G", "date": "D", "commit": "C", "cudnn": 91000}, rows,
                     [("GPU tests", "test_gpu: Passed")])
    t = p.read_text()
    assert t.index("## Issue 30") < t.index("| dtype | causal | seqlens |") < t.index(
        "| dtype | d | causal | seqlen |")
    assert "| bf16 | yes | 4096,8192,16384 |" in t and "missed (out of tolerance at s8192)" in t
    assert "| bf16 | 128 | no | 4096 | 4 x 16 | %.1f |" % (rows[0]["flops"] / 1e9) in t
    assert "**FAIL** dq: rel err 0.02 > 1e-02" in t and "**differ**" in t
    assert "skipped (%s)" % b.HEAD_DIM_SKIP in t
    assert "n/a (RuntimeError: No available kernel)" in t
    assert "| 1.700 | 1.100 | 1.050 | same | 2.0e-03 / 2.0e-03 / 2.0e-03 |" in t
    assert "Out of tolerance: bf16 d128 causal s8192" in t and "- cudnn: 91000" in t
    assert "2.5 x 4 * batch * heads" in t and "test_gpu: Passed" in t


def test_chart_has_the_deterministic_bars():
    rows = [_row("bf16", 128, c, sl) for sl in (4096, 8192) for c in (False, True)]
    data = s.render_chart_png(rows, "backward", None, b.IMPLS, b.LABELS, b.COLORS)
    pos, idat = 8, b""
    while pos < len(data):
        n, = struct.unpack(">I", data[pos:pos + 4])
        if data[pos + 4:pos + 8] == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    raw = zlib.decompress(idat)
    for impl in b.IMPLS:
        assert bytes(b.COLORS[impl]) in raw, impl
    assert len(set(map(tuple, b.COLORS.values()))) == len(b.COLORS)


# ---- options, names, lease stage -------------------------------------------------------------

def test_options():
    a = s.parse_args(["--backward"])
    assert a.backward and not a.deterministic and a.no_coldstart and not a.fp8
    assert s.parse_args(["--backward", "--deterministic", "--quick"]).head_dims == "64,128"
    assert not s.parse_args([]).backward
    for bad in (["--deterministic"], ["--backward", "--fp8"]):
        with pytest.raises(SystemExit):
            s.parse_args(bad)
    want = "2026-12-01-h200-sdpa-backward"
    assert s.result_base("2026-12-01", "NVIDIA H200", backward=True) == want
    assert s.run_base(a, "2026-12-01", "NVIDIA H200") == want


def test_main_implies_backward(monkeypatch, capsys):
    monkeypatch.setattr(s, "gpu_name", lambda: "NVIDIA H200")
    assert b.main(["--print-base-name", "--deterministic"]) == 0
    assert capsys.readouterr().out.strip() == "%s-h200-sdpa-backward" % s.today()


def test_bwd_lease_stage():
    """gpu_lease.sh's stage bwd (in the default list and the header): the
    backward with --deterministic, bf16, head_dim 64 and 128, seqlen 1k..16k
    with issue 30's points (d128, 4k..16k) before any 1k/2k config, a
    budget under its limit."""
    assert "bwd" in lease_stage.default_stages()
    assert re.search(r"^#   bwd ", lease_stage.lease_text(), re.M)
    limit, budget, args = lease_stage.stage("bwd", "bench/bench_sdpa.py")
    a = s.parse_args(args + ["--time-budget", str(budget)])
    assert a.backward and a.deterministic and a.dtypes == "bf16" and budget < limit <= 180
    head_dims = tuple(map(int, a.head_dims.split(",")))
    seqlens = tuple(map(int, a.seqlens.split(",")))
    assert set(head_dims) == {64, 128} and set(seqlens) == {1024, 2048, 4096, 8192, 16384}
    grid = b.backward_grid(("bf16",), head_dims, seqlens)
    assert all(b.runnable(c) for c in grid)
    points = [n for n, c in enumerate(grid) if c.head_dim == 128 and c.seqlen in b.TARGET_SEQLENS]
    short = [n for n, c in enumerate(grid) if c.seqlen < 4096]
    assert len(points) == 6 and max(points) < min(short)


def test_bwd90off_lease_stage():
    """gpu_lease.sh's stage bwd90off (sm_90 only; in the default list and the
    header): the bwd stage's head_dim 128 points (issue 30's 4k and 16k) with
    FLASHATTN_SM90_BACKWARD=0, files suffixed -sm90-backward-off, a budget
    under its limit."""
    text = lease_stage.lease_text()
    assert "bwd90off" in lease_stage.default_stages()
    assert re.search(r"^#   bwd90off ", text, re.M)
    assert re.search(r"FLASHATTN_SM90_BACKWARD=0 stage bwd90off ", text)
    assert "bwd90off:sm90-backward-off" in text
    limit, budget, args = lease_stage.stage("bwd90off", "bench/bench_sdpa.py")
    a = s.parse_args(args + ["--time-budget", str(budget)])
    assert a.backward and a.dtypes == "bf16" and budget < limit <= 120
    assert a.head_dims == "128" and set(map(int, a.seqlens.split(","))) <= set(b.TARGET_SEQLENS)


# ---- the GPU part on the CPU (torch and a built library, in a child process) ----------------

def test_gpu_part_on_the_emulator():
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("numpy") is None:
        pytest.skip("needs torch and numpy (CPU builds are enough)")
    lib = s.library_path()
    if lib is None:
        pytest.skip("no built libflashattn.so.0 (build/ or FLASHATTN_LIBRARY)")
    p = subprocess.run([sys.executable, os.path.join(HERE, "backward_child.py"), "scaled_dq",
                        "unwritten_dk"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, FLASHATTN_LIBRARY=lib))
    line = [x for x in p.stdout.splitlines() if x.startswith("CHILD ")]
    if p.returncode != 0 and "has no fa_backward" in p.stderr + p.stdout:
        pytest.skip("the library has no fa_backward")
    assert p.returncode == 0 and line, p.stderr[-3000:]
    out = json.loads(line[0][len("CHILD "):])
    assert out["reference_max_diff"] < 1e-5  # fp32 vs fp64 autograd, |grads| ~ 1
    good = out["rows"]["good"]
    assert [r["causal"] for r in good] == [False, True]
    for r in good:
        assert all(r[i + "_status"] == "ok" for i in b.IMPLS), r
        assert r["det_bitwise"] is True
        for i in b.IMPLS:
            for g in b.GRADS:
                assert 0 < r["%s_%s_rel_err" % (i, g)] < 1e-2, (i, g)
        # on the CPU SDPA's math runs in fp32 (one rounding), so the max-error
        # rule may flag flashattn's fp16 P and dS; relative errors must pass
        assert "rel err" not in (r["tol_note"] or "") and "non-finite" not in (r["tol_note"] or "")
    scaled = out["rows"]["scaled_dq"][0]
    assert scaled["tol_ok"] is False and "dq: rel err 0.05" in scaled["tol_note"]
    assert "det: dq: rel err" in scaled["tol_note"] and "dk: rel" not in scaled["tol_note"]
    unwritten = out["rows"]["unwritten_dk"][0]
    assert unwritten["tol_ok"] is False and "dk: non-finite" in unwritten["tol_note"]
    assert unwritten["flashattn_note"] == "non-finite dk (unwritten or NaN)"
    assert unwritten["det_bitwise"] is True  # the same bits (NaN) twice

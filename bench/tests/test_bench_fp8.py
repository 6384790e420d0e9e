"""Torch-free parts of bench/bench_fp8.py (bench_sdpa.py --fp8): grid, FLOPs
and bytes, the descales' exactness, the error rule, the Config it asks
for, rows, CSV, markdown, options and the lease stage."""

import math
import os
import re
import struct
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_fp8 as b  # noqa: E402
import bench_sdpa as s  # noqa: E402
import lease_stage  # noqa: E402  (beside this file)


def test_module_does_not_import_torch():
    assert "torch" not in sys.modules


def test_grid_is_bench_sdpa_shapes_in_e4m3():
    g = b.fp8_grid()
    assert len(g) == 3 * 2 * 6
    assert {c.dtype for c in g} == {"e4m3"}
    want = [(c.head_dim, c.causal, c.seqlen, c.batch, c.num_heads)
            for c in s.config_grid(dtypes=("bf16",))]
    assert [(c.head_dim, c.causal, c.seqlen, c.batch, c.num_heads) for c in g] == want
    t = b.bf16_twin(g[5])
    assert t.dtype == "bf16" and t.key == ("bf16", g[5].head_dim, g[5].causal)
    assert t.flops == g[5].flops


def test_flops_and_bytes():
    c = s.BenchConfig("e4m3", 128, False, 4096, 4, 16)
    r = b.config_row(c, 4)
    assert r["flops"] == 4 * 4 * 16 * 4096 * 4096 * 128
    assert b.config_row(s.BenchConfig("e4m3", 128, True, 4096, 4, 16), 4)["flops"] * 2 == r["flops"]
    n = 4 * 4096 * 16 * 128  # elements of each of Q, K, V, O
    assert r["bytes_fp8"] == 3 * n + 2 * n  # Q, K, V 1 byte, O bf16
    assert r["bytes_bf16"] == 3 * 2 * n + 2 * n
    assert r["num_heads_kv"] == 16 and r["n_sets"] == 4
    # GQA and seqlen_q != seqlen_k: K/V count their own heads and keys
    assert b.io_bytes(2, 3, 5, 8, 2, 64, 1) == 2 * 3 * 8 * 64 + 2 * 2 * 5 * 2 * 64 + 2 * 2 * 3 * 8 * 64


def test_e4m3_decoder():
    assert b.e4m3_value(0x7E) == 448.0 and b.e4m3_value(0xFE) == -448.0
    assert b.e4m3_value(0x38) == 1.0 and b.e4m3_value(0x08) == 2.0 ** -6
    assert b.e4m3_value(0x01) == 2.0 ** -9 and b.e4m3_value(0x00) == 0.0
    assert math.isnan(b.e4m3_value(0x7F)) and math.isnan(b.e4m3_value(0xFF))
    finite = [b.e4m3_value(x) for x in range(256) if not math.isnan(b.e4m3_value(x))]
    assert len(finite) == 254 and len(set(finite)) == 253  # +0 and -0


def _bf16_exact(x):
    """x is a float32 whose low 16 bits are zero (a bf16 value)."""
    f = struct.unpack("<f", struct.pack("<f", x))[0]
    return f == x and struct.unpack("<I", struct.pack("<f", x))[0] & 0xFFFF == 0


def test_descales_dequantise_exactly_in_bf16():
    """Every contender reads the same values: code x descale is exact in
    bf16 for every finite e4m3 code and every descale drawn."""
    assert min(b.DESCALES) == 0.5 and max(b.DESCALES) == 2.0 and len(b.DESCALES) == 17
    assert list(b.DESCALES) == sorted(set(b.DESCALES))
    for d in b.DESCALES:
        m, _ = math.frexp(d)
        assert (m * 16).is_integer()  # at most 4 significant bits
    codes = [b.e4m3_value(x) for x in range(256) if not math.isnan(b.e4m3_value(x))]
    for d in b.DESCALES:
        for v in codes:
            assert _bf16_exact(v * d), (v, d)
    assert not _bf16_exact(b.e4m3_value(0x3F) * 1.9375)  # a 5-bit descale would not be


def test_error_rule():
    # no FA3: a fixed rel-L2 bound of 5e-2
    ok, note, bound = b.judge_fp8((0.2, 0.03), None)
    assert ok is True and note == "" and "5e-02" not in bound and "0.05" in bound
    ok, note, _ = b.judge_fp8((0.2, 0.06), None)
    assert ok is False and "rel err" in note
    # FA3 ran: 2x its max and its rel error
    ok, note, bound = b.judge_fp8((0.1, 0.03), (0.06, 0.025))
    assert ok is True and "FA3" in bound
    ok, note, _ = b.judge_fp8((0.13, 0.03), (0.06, 0.025))
    assert ok is False and "FA3 fp8's" in note
    ok, note, _ = b.judge_fp8((0.1, 0.055), (0.06, 0.025))
    assert ok is False and "rel err" in note
    # a NaN FA3 error is no baseline: the fixed bound applies
    ok, _, bound = b.judge_fp8((0.5, 0.04), (float("nan"), float("nan")))
    assert ok is True and "no FA3" in bound
    # flashattn's NaN fails; no output is no verdict
    assert b.judge_fp8((float("nan"), float("nan")), (0.06, 0.025))[0] is False
    ok, note, _ = b.judge_fp8(None, (0.06, 0.025))
    assert ok is None and "no flashattn fp8 output" in note
    assert b.FP8_REL_LIMIT == 5e-2 and b.FP8_ERR_FACTOR == 2.0


def test_fp8_config_asks_for_the_lead_s_keywords():
    seen = {}

    class FakeFa:
        @staticmethod
        def Config(**kw):
            seen.update(kw)
            return "cfg"

    c = s.BenchConfig("e4m3", 256, True, 2048, 8, 8)
    assert b.fp8_config(FakeFa, c) == "cfg"
    assert seen == {"dtype": "bf16", "head_dim": 256, "num_heads_q": 8, "num_heads_kv": 8,
                    "causal": True, "kv_dtype": "e4m3", "q_dtype": "e4m3"}

    class OldFa:  # today's binding: q_dtype is an unknown keyword
        @staticmethod
        def Config(*, head_dim, num_heads_q, num_heads_kv=None, dtype="fp16", causal=False,
                   kv_dtype=None):
            return "cfg"

    with pytest.raises(TypeError, match="q_dtype"):
        b.fp8_config(OldFa, c)


def _row(c, ms):
    r = b.config_row(c, 4)
    for i, t in zip(b.IMPLS, ms):
        if t is None:
            r[i + "_status"] = "n/a"
            r[i + "_note"] = ("TypeError: Config.__init__() got an unexpected keyword argument "
                              "'q_dtype'" if i == "flashattn_fp8" else "RuntimeError: x | y")
            continue
        r.update({i + "_status": "ok", i + "_median_ms": t, i + "_min_ms": t * 0.9,
                  i + "_max_ms": t * 1.2, i + "_reps": 20, i + "_tflops": s.tflops(c.flops, t),
                  i + "_max_err": 0.05, i + "_rel_err": 0.025})
    r["tol_ok"], r["tol_note"], r["err_bound"] = b.judge_fp8(
        (r.get("flashattn_fp8_max_err"), r.get("flashattn_fp8_rel_err"))
        if r.get("flashattn_fp8_max_err") is not None else None,
        (r["fa3_fp8_max_err"], r["fa3_fp8_rel_err"]) if r.get("fa3_fp8_max_err") else None)
    return b.finish_row(r)


def test_ratios_are_fp8_over_each_other():
    c = s.BenchConfig("e4m3", 128, False, 4096, 4, 16)
    r = _row(c, (1.0, 1.5, 2.0, 1.25, 4.0))
    assert r["ratio_vs_flashattn_fp8_f16"] == pytest.approx(1.5)  # native / f16 form
    assert r["ratio_vs_flashattn_bf16"] == pytest.approx(2.0)
    assert r["ratio_vs_fa3_fp8"] == pytest.approx(1.25)
    assert r["ratio_vs_sdpa_flash"] == pytest.approx(4.0)
    r = _row(c, (None, 1.5, 2.0, None, 4.0))
    assert r["ratio_vs_flashattn_bf16"] is None and r["ratio_vs_fa3_fp8"] is None
    assert r["ratio_vs_flashattn_fp8_f16"] is None
    assert r["tol_ok"] is None
    r = _row(c, (1.0, None, 2.0, 1.25, 4.0))  # f16 form skipped (not sm_90)
    assert r["ratio_vs_flashattn_fp8_f16"] is None and r["ratio_vs_fa3_fp8"] == pytest.approx(1.25)


def test_contenders_and_columns():
    """The f16 form right after flashattn_fp8, the others in their old
    order; flashattn_fp8's ratios are taken against all of them."""
    assert b.IMPLS == ("flashattn_fp8", "flashattn_fp8_f16", "flashattn_bf16", "fa3_fp8",
                       "sdpa_flash")
    assert b.OTHERS == b.IMPLS[1:]
    assert "flashattn_fp8_f16" in b.FP8_IMPLS
    assert b.LABELS["flashattn_fp8_f16"] == "flashattn fp8 (f16 form)"
    assert set(b.LABELS) == set(b.IMPLS)
    f = b.FIELDS
    assert f.index("flashattn_fp8_f16_status") > f.index("flashattn_fp8_status")
    assert f.index("flashattn_fp8_f16_tflops") < f.index("flashattn_bf16_status")
    assert f[-8:] == ["ratio_vs_flashattn_fp8_f16", "ratio_vs_flashattn_bf16", "ratio_vs_fa3_fp8",
                      "ratio_vs_sdpa_flash", "err_bound", "tol_ok", "tol_note", "n_sets"]
    assert "flashattn_fp8_f16_reps" in b._INT_FIELDS
    assert "ratio_vs_flashattn_fp8_f16" in b._FLOAT_SUFFIXES
    assert b.f16_form_applies(90)
    assert not any(b.f16_form_applies(sm) for sm in (80, 89, 100, 120))


def test_env_var_sets_and_restores(monkeypatch):
    name = b.F16_FORM_ENV
    monkeypatch.delenv(name, raising=False)
    with b.env_var(name, "1"):
        assert os.environ[name] == "1"
    assert name not in os.environ
    monkeypatch.setenv(name, "0")
    with pytest.raises(RuntimeError):
        with b.env_var(name, "1"):
            assert os.environ[name] == "1"
            raise RuntimeError("boom")
    assert os.environ[name] == "0"
    with b.env_var(name, None):  # removed, then put back
        assert name not in os.environ
    assert os.environ[name] == "0"


class _FakeTorch:
    class cuda:
        @staticmethod
        def current_stream():
            return "stream"

    @staticmethod
    def empty_like(x):
        return "out"


class _FakeFa:
    """Config and forward; forward records the form variable it saw."""

    def __init__(self):
        self.seen = []
        self.runtimes = []

    @staticmethod
    def Config(**kw):
        return dict(kw)

    def Runtime(self, **kw):
        """A runtime remembers the form variable at its creation (the
        library reads it then)."""
        self.runtimes.append(os.environ.get(b.F16_FORM_ENV))
        return ("rt", os.environ.get(b.F16_FORM_ENV))

    def forward(self, rt, cfg, q, k, v, out=None, stream=None, q_descale=None, k_descale=None,
                v_descale=None):
        self.seen.append((os.environ.get(b.F16_FORM_ENV), rt[1]))
        return out


def _fake_bench(sm, measure):
    """An Fp8Bench without torch or a GPU: fake sets, reference and
    16-bit calls; measure(bench, row, impl, make_run) stands in for
    GpuBench.measure."""
    class A:
        sets = 2

    fb = object.__new__(b.Fp8Bench)
    fb.torch, fb.fa, fb.args, fb.rt, fb.sm = _FakeTorch, _FakeFa(), A, "rt", sm
    fb.fp8_configs, fb.fa3, fb.fa3_why = {}, None, "no FA3 here"
    sets8 = [("q8", "k8", "v8", "qd", "kd", "vd")] * 2
    fb.make_sets = lambda c: (sets8, [("q", "k", "v")] * 2)
    fb.reference = lambda c, q, k, v, subset: ("ref", "idx")
    fb.make_call = lambda impl, c, sets, outs: (lambda i: outs[i])
    fb.measure = lambda row, impl, make_run, poison, ref, idx, flops, budget: measure(
        fb, row, impl, make_run)
    return fb


def test_f16_form_is_measured_with_the_variable_set(monkeypatch):
    """On sm_90 FLASHATTN_SM90_FP8_F16=1 holds for the whole of
    flashattn_fp8_f16's measurement (making run(i) and every launch) and
    for nothing else; run(i) does not set it; the caller's value is back
    after, and flashattn_fp8 runs without it (the native form)."""
    monkeypatch.setenv(b.F16_FORM_ENV, "caller's")
    log = []

    def measure(fb, row, impl, make_run):
        env = os.environ.get(b.F16_FORM_ENV)
        try:
            run = make_run()
            for i in (0, 1, 0):  # checked run, then timing
                run(i)
        except RuntimeError as ex:  # fa3_fp8: n/a, as GpuBench.measure has it
            assert impl == "fa3_fp8" and "no FA3" in str(ex)
        log.append((impl, env, os.environ.get(b.F16_FORM_ENV)))
        if impl in ("flashattn_fp8", "flashattn_fp8_f16"):
            return (0.01, 0.02)
        return None

    fb = _fake_bench(90, measure)
    c = s.BenchConfig("e4m3", 128, False, 1024, 16, 16)
    row = fb.run_config(c, 100.0)
    assert [x[0] for x in log] == list(b.IMPLS)
    want = {"flashattn_fp8": None, "flashattn_fp8_f16": "1"}
    for impl, before, after in log:
        assert before == after == want.get(impl, "caller's"), impl
    # the same call on each form's runtime, made with the variable as the
    # form needs it (and set during the measurement too); one runtime a form
    assert fb.fa.seen == [(None, None)] * 3 + [("1", "1")] * 3
    assert fb.fa.runtimes == [None, "1"]
    assert os.environ[b.F16_FORM_ENV] == "caller's"
    assert row["tol_ok"] is True and "flashattn_fp8_f16_status" not in row  # measure's job
    # the same Config for both forms (the spec, not the Config, differs)
    assert list(fb.fp8_configs) == [c.key]


def test_f16_form_restores_the_variable_on_an_exception(monkeypatch):
    monkeypatch.delenv(b.F16_FORM_ENV, raising=False)

    def measure(fb, row, impl, make_run):
        if impl == "flashattn_fp8_f16":
            assert os.environ[b.F16_FORM_ENV] == "1"
            raise KeyboardInterrupt
        return None

    fb = _fake_bench(90, measure)
    with pytest.raises(KeyboardInterrupt):
        fb.run_config(s.BenchConfig("e4m3", 64, True, 512, 32, 32), 100.0)
    assert b.F16_FORM_ENV not in os.environ


def test_f16_form_skipped_off_sm90(monkeypatch):
    monkeypatch.delenv(b.F16_FORM_ENV, raising=False)
    measured = []
    fb = _fake_bench(89, lambda fb, row, impl, make_run: measured.append(impl))
    row = fb.run_config(s.BenchConfig("e4m3", 128, True, 2048, 8, 16), 100.0)
    assert measured == [i for i in b.IMPLS if i != "flashattn_fp8_f16"]
    assert row["flashattn_fp8_f16_status"] == "skipped"
    assert "not sm_90" in row["flashattn_fp8_f16_note"]
    assert row["ratio_vs_flashattn_fp8_f16"] is None


def test_csv_round_trip_and_markdown(tmp_path):
    g = b.fp8_grid(head_dims=(64, 128), seqlens=(1024,))
    rows = [_row(c, (1.0 + i, 1.25, 2.0, 1.5, 3.0)) for i, c in enumerate(g)]
    rows[1] = _row(g[1], (None, None, 2.0, None, 3.0))  # the binding without q_dtype, no FA3
    rows[2]["tol_ok"], rows[2]["tol_note"] = False, "rel err 0.06 > 5e-02"
    meta = {"commit": "abc", "gpu": "NVIDIA H100 80GB HBM3", "date": "2026-12-01",
            "fa3": "not importable (ModuleNotFoundError: x)"}
    p = tmp_path / "r.csv"
    b.write_csv(str(p), rows, meta)
    m2, r2 = b.read_csv(str(p))
    assert m2 == meta and len(r2) == len(rows)
    for a, c in zip(rows, r2):
        for k in b.FIELDS:
            va = a.get(k)
            assert c[k] == (None if va == "" else va), (k, va, c[k])  # "" reads back as None
    md = tmp_path / "r.md"
    b.write_markdown(str(md), meta, rows, [("GPU tests", "test_gpu: Passed")])
    t = md.read_text()
    assert "| 64 | no | 1024 | 16 x 32 |" in t
    assert "n/a (TypeError: Config.__init__() got an unexpected keyword argu" in t
    assert "n/a (RuntimeError: x / y)" in t  # '|' in a note cannot break the table
    assert "**FAIL**" in t and "Out of tolerance: fp8 d128 full s1024" in t
    # fp8/f16 form, fp8/bf16, fp8/FA3, fp8/SDPA of row 0
    assert "| 1.250 | 2.000 | 1.500 | 3.000 |" in t
    assert "| fp8/f16 form | fp8/bf16 | fp8/FA3 | fp8/SDPA |" in t
    assert "FLASHATTN_SM90_FP8_F16=1" in t
    mb = b.config_row(g[0], 4)
    assert "| %.0f / %.0f |" % (mb["bytes_fp8"] / 1e6, mb["bytes_bf16"] / 1e6) in t
    assert "- fa3: not importable" in t and "test_gpu: Passed" in t
    for label in b.LABELS.values():
        assert label in t


def test_fp8_option_and_result_name():
    a = s.parse_args(["--fp8", "--quick"])
    assert a.fp8 and a.no_coldstart and (a.seqlens, a.head_dims) == ("512,2048", "64,128")
    assert s.parse_args([]).dtypes == "fp16,bf16" and not s.parse_args([]).fp8
    with pytest.raises(SystemExit):
        s.parse_args(["--fp8", "--dtypes", "bf16"])
    assert s.result_base("2026-12-01", "NVIDIA H200", fp8=True) == "2026-12-01-h200-sdpa-fp8"
    assert s.run_base(a, "2026-12-01", "NVIDIA H200") == "2026-12-01-h200-sdpa-fp8"
    assert s.run_base(s.parse_args([]), "2026-12-01", "NVIDIA H200") == "2026-12-01-h200-sdpa"


def test_fp8_lease_stage():
    """gpu_lease.sh runs the fp8 forward as stage fp8fwd (in the default
    list and the header), with options bench_sdpa.py takes, head_dim 128
    first, seqlen 1k..8k, and a budget under the stage's limit."""
    assert "fp8fwd" in lease_stage.default_stages()
    assert re.search(r"^#   fp8fwd ", lease_stage.lease_text(), re.M)
    limit, budget, args = lease_stage.stage("fp8fwd", "bench/bench_sdpa.py")
    assert 60 <= limit <= 120
    a = s.parse_args(args + ["--time-budget", str(budget)])
    assert a.fp8 and budget < limit
    assert a.head_dims.split(",")[0] == "128" and a.seqlens == "1024,2048,4096,8192"
    grid = b.fp8_grid(tuple(map(int, a.head_dims.split(","))), tuple(map(int, a.seqlens.split(","))))
    assert {(c.causal, c.seqlen) for c in grid if c.head_dim == 128} == {
        (cz, sl) for cz in (False, True) for sl in (1024, 2048, 4096, 8192)}

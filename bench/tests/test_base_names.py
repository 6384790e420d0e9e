"""--print-base-name follows the mode options (bench_sdpa.py --fp8, --backward,
bench_decode.py --mla / --append / --dtype fp16), and bench/run_gpu.sh asks
with the options its run gets, so the files a run writes are the ones it
copies to $OUT. Torch-free: run_gpu.sh runs in a copy of bench/ with a fake
python (the real scripts answer --print-base-name; a benchmark run writes
empty result files under the name the real run would use) and a fake
nvidia-smi."""

import contextlib
import io
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, BENCH)
import bench_decode as d  # noqa: E402
import bench_sdpa as s  # noqa: E402
import bench_varlen as v  # noqa: E402

GPU = "NVIDIA H100 80GB HBM3"
SLUG = "h100-80gb-hbm3"


def _printed(main, argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue().strip()


@pytest.mark.parametrize("argv,suffix", [
    ([], "sdpa"), (["--fp8"], "sdpa-fp8"), (["--fp8", "--quick", "--time-budget", "60"], "sdpa-fp8"),
    (["--dtypes", "bf16", "--head-dims", "128"], "sdpa"), (["--backward"], "sdpa-backward"),
    (["--backward", "--deterministic", "--dtypes", "bf16"], "sdpa-backward")])
def test_sdpa_print_base_name_honours_options(argv, suffix, monkeypatch):
    monkeypatch.setattr(s, "gpu_name", lambda: GPU)
    name = _printed(s.main, argv + ["--print-base-name"])
    assert name == "%s-%s-%s" % (s.today(), SLUG, suffix)
    assert name == s.run_base(s.parse_args(argv), s.today(), GPU)


@pytest.mark.parametrize("argv,suffix", [
    ([], "decode"), (["--mla"], "decode-mla"), (["--append"], "decode-append"),
    (["--dtype", "fp16"], "decode-fp16"), (["--append", "--dtype", "fp16"], "decode-append-fp16"),
    (["--mla", "--dtype", "fp16", "--quick"], "decode-mla-fp16")])
def test_decode_print_base_name_honours_options(argv, suffix, monkeypatch):
    monkeypatch.setattr(d.common, "gpu_name", lambda: GPU)
    name = _printed(d.main, argv + ["--print-base-name"])
    assert name == "%s-%s-%s" % (s.today(), SLUG, suffix)
    assert name == d.run_base(d.parse_args(argv), s.today(), GPU)


@pytest.mark.parametrize("argv,suffix", [
    ([], "varlen"), (["--chunked"], "chunked-prefill"),
    (["--chunked", "--quick"], "chunked-prefill"),
    (["--chunked", "--batch", "1", "--new-tokens", "128"], "chunked-prefill-b1-q128")])
def test_varlen_print_base_name_honours_options(argv, suffix, monkeypatch):
    """A chunked run of other sizes (the lease's split stage) writes files of
    its own, not over the default run's."""
    monkeypatch.setattr(v.common, "gpu_name", lambda: GPU)
    name = _printed(v.main, argv + ["--print-base-name"])
    assert name == "%s-%s-%s" % (s.today(), SLUG, suffix)
    assert name == v.run_base(v.parse_args(argv), s.today(), GPU)


FAKE_PYTHON = textwrap.dedent("""\
    #!{python}
    # run_gpu.sh's $PYTHON in the test: --print-base-name goes to the real
    # script; a benchmark run writes empty result files where the real run
    # would (run_base of its own options); pytest passes.
    import os, sys
    argv = sys.argv[1:]
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(" ".join(argv) + "\\n")
    if argv[:2] == ["-m", "pytest"]:
        print("1 passed")
        sys.exit(0)
    if "--print-base-name" in argv:
        os.execv(sys.executable, [sys.executable] + argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    mod = __import__(os.path.basename(argv[0])[:-3])
    a = mod.parse_args(argv[1:])
    common = getattr(mod, "common", mod)
    base = os.path.join(a.out_dir, mod.run_base(a, common.today(), common.gpu_name()))
    for ext in (".csv", ".json", ".md"):
        open(base + ext, "w").close()
    print("wrote " + base)
    """)


@pytest.fixture
def sandbox(tmp_path):
    """A copy of bench/'s scripts, a fake python and nvidia-smi on PATH, an
    empty build directory and $OUT; returns run(*args, env=...) -> (rc,
    files in $OUT, log of the python calls)."""
    if shutil.which("ldd") is None:
        pytest.skip("no ldd (run_gpu.sh checks the library with it)")
    root = tmp_path / "repo"
    (root / "bench").mkdir(parents=True)
    for f in ("run_gpu.sh", "bench_sdpa.py", "bench_decode.py", "bench_fp8.py"):
        shutil.copy(os.path.join(BENCH, f), root / "bench" / f)
    (root / "build").mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    py = bindir / "fakepython"
    py.write_text(FAKE_PYTHON.format(python=sys.executable))
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '%s, 580.00'\n" % GPU)
    for f in (py, smi):
        f.chmod(0o755)

    def run(*args, env=None):
        out = tmp_path / ("out%d" % len(list(tmp_path.glob("out*"))))
        out.mkdir()
        log = tmp_path / "calls.log"
        log.write_text("")
        e = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]), PYTHON=str(py),
                 FA_BUILD_DIR="build", FLASHATTN_LIBRARY=shutil.which("sh"), OUT=str(out),
                 FAKE_LOG=str(log))
        e.pop("FA_DECODE_ARGS", None)
        e.update(env or {})
        p = subprocess.run(["bash", str(root / "bench" / "run_gpu.sh")] + list(args), env=e,
                           capture_output=True, text=True, timeout=120)
        return p.returncode, sorted(os.listdir(out)), log.read_text(), p.stdout + p.stderr
    return run


def _results(files):
    return {f for f in files if f.endswith((".csv", ".json", ".md"))}


@pytest.mark.parametrize("args,env,want", [
    (["--bench", "sdpa", "--fp8", "--quick"], None, ["sdpa-fp8"]),
    (["--bench", "decode", "--mla"], None, ["decode-mla"]),
    (["--bench", "decode", "--append", "--dtype", "fp16"], None, ["decode-append-fp16"]),
    (["--fp8"], {"FA_DECODE_ARGS": "--mla --quick"}, ["sdpa-fp8", "decode-mla"]),
    (["--bench", "sdpa"], None, ["sdpa"]),
    (["--bench", "sdpa", "--backward", "--deterministic"], None, ["sdpa-backward"]),
])
def test_run_gpu_copies_the_files_the_run_wrote(sandbox, args, env, want):
    rc, files, log, text = sandbox(*args, env=env)
    assert rc == 0, text
    names = ["%s-%s-%s" % (s.today(), SLUG, w) for w in want]
    assert _results(files) == {n + ext for n in names for ext in (".csv", ".json", ".md")}, text
    # the benchmark logs are named by the same base
    assert {n + "-bench.log" for n in names} <= set(files), files
    calls = [c for c in log.splitlines() if c.startswith("bench/")]
    for script in ("bench/bench_sdpa.py", "bench/bench_decode.py"):
        asked = [c for c in calls if c.startswith(script) and "--print-base-name" in c]
        ran = [c for c in calls if c.startswith(script) and "--print-base-name" not in c]
        assert len(asked) == 1
        for r in ran:  # the run's mode options were in the question too
            opts = r.split()[5:]  # after the script, --out-dir D and --tests-summary F
            assert asked[0].split()[1:-1] == opts, (asked, r)

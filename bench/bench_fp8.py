#!/usr/bin/env python3
"""flashattn's fp8 forward (e4m3 Q/K/V, bf16 O) vs flashattn bf16, FlashAttention-3 fp8 and SDPA.

    python3 bench/bench_sdpa.py --fp8 [--quick] [--time-budget S] [--out-dir bench/results]
    python3 bench/bench_fp8.py [the same options]

bench_sdpa.py's grid (head_dim 64/128/256 x causal/not x seqlen 512..16k,
batch * seqlen = 16384, num_heads * head_dim = 2048, num_heads_kv =
num_heads) with Q, K, V in float8 e4m3 and one fp32 descale per (batch, KV
head) for each (drawn from DESCALES, in [0.5, 2]); the value a contender
reads is e4m3 code x descale. In one process, on the same values:

  flashattn_fp8   flashattn.forward with Config(dtype='bf16', kv_dtype='e4m3',
                  q_dtype='e4m3') and q/k/v_descale [batch, num_heads_kv]
                  (n/a with the reason until the binding takes q_dtype); on
                  sm_90 the fp8 wgmma on the bytes (FLASHATTN_SM90_FP8_F16
                  is removed from the environment while it is measured)
  flashattn_fp8_f16  the same call with FLASHATTN_SM90_FP8_F16=1 set for
                  the whole of its measurement (warm-up, checked run,
                  timing; the previous value or absence restored after,
                  exceptions too): on sm_90 the producer converts Q, K, V to
                  f16 and the 16-bit wgmma runs (the previous form), so
                  ratio_vs_flashattn_fp8_f16 is native / f16-form. Elsewhere
                  the variable has no effect (the same kernel as
                  flashattn_fp8): skipped with that note, not measured
  flashattn_bf16  flashattn.forward, bf16, on the dequantised tensors
  fa3_fp8         flash_attn_interface.flash_attn_func(q, k, v, causal=...,
                  q_descale=..., k_descale=..., v_descale=...) (FlashAttention-3)
                  when importable, else n/a with the reason
  sdpa_flash      SDPA with SDPBackend.FLASH_ATTENTION, bf16, on the
                  dequantised tensors

FLOPs as bench_sdpa.py (4 * batch * heads * seqlen_q * seqlen_k * head_dim,
halved for causal); TFLOP/s from medians; ratios flashattn_fp8 / each other.
Bytes per call: Q, K, V read once (1 byte an element for fp8, 2 for bf16)
plus O written once (bf16, 2 bytes); the descales (12 bytes per (batch, KV
head)) are left out. Correctness first: fp32 reference on the dequantised
values (bench_sdpa.py's subset), flashattn's outputs poisoned with NaN and
checked finite, the error rule below. Timing, rotation over input sets and
the sleep hold are bench_sdpa.py's (GpuBench.measure). Writes CSV, JSON and
markdown named <date>-<gpu>-sdpa-fp8.* under --out-dir.

Everything above the "GPU part" marker needs only the standard library.
"""

import contextlib
import json
import math
import os
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_sdpa as common  # noqa: E402  (grid, timing, correctness and CSV helpers)

IMPLS = ("flashattn_fp8", "flashattn_fp8_f16", "flashattn_bf16", "fa3_fp8", "sdpa_flash")
OTHERS = IMPLS[1:]  # what flashattn_fp8's ratios are taken against
FP8_IMPLS = ("flashattn_fp8", "flashattn_fp8_f16", "fa3_fp8")  # read the e4m3 tensors
LABELS = {"flashattn_fp8": "flashattn fp8", "flashattn_fp8_f16": "flashattn fp8 (f16 form)",
          "flashattn_bf16": "flashattn bf16", "fa3_fp8": "FA3 fp8", "sdpa_flash": "SDPA flash bf16"}
IN_DTYPE = "e4m3"

# The library reads this when a runtime is created: "1" on sm_90 selects the
# fp8 forward's f16 form; each form's spec has its own cache entry. ENV_FORMS:
# its value when each flashattn fp8 contender's runtime is made, and while it
# is measured (None: removed).
F16_FORM_ENV = "FLASHATTN_SM90_FP8_F16"
ENV_FORMS = {"flashattn_fp8": None, "flashattn_fp8_f16": "1"}
F16_FORM_SKIP = "not sm_90: %s has no effect (the flashattn fp8 kernel)" % F16_FORM_ENV

# Error rule for the fp8 forward. The reference is fp32 attention on the
# dequantised values (e4m3 code x descale, exactly what every contender reads;
# see DESCALES), so input quantisation is no error here: what is left is the
# kernel's own rounding. Q K^T of e4m3 operands accumulates in fp32 (exact
# products) and the softmax runs in fp32, but P is rounded to e4m3 for the
# P V mma: 3 mantissa bits, round to nearest, so each p carries a relative
# error of up to 2^-4 (more for p under e4m3's smallest normal, 2^-6, unless
# the kernel scales P up first as FA3 does). O = sum_j p_j v_j / l mixes
# these errors with random signs, so ||O - ref|| / ||ref|| is about their rms:
# at most 2^-4 / sqrt(3) = 0.036 for uniform rounding, 0.024-0.028 in a NumPy
# simulation of this rounding on randn inputs (d 128, 512-8k keys, with or
# without FA3's offset); O's bf16 rounding adds 2^-9. Hence:
# - FA3's fp8 ran on the same inputs (the same P rounding): FlashAttention's
#   rule, max |err| <= 2x FA3's and rel-L2 <= 2x FA3's;
# - else a fixed rel-L2 bound of 5e-2 (twice the simulated figure, over the
#   uniform-rounding rms); an ignored or misapplied descale (a factor of 0.5
#   to 2 on a (batch, head)) or P rounded coarser lands well above it.
# NaN fails. The other contenders' errors (the f16 form's too) are reported
# beside it, unjudged.
FP8_REL_LIMIT = 5e-2
FP8_ERR_FACTOR = common.ERR_FACTOR

# ---- values and arithmetic ---------------------------------------------------------


@contextlib.contextmanager
def env_var(name, value):
    """os.environ[name] = value (None: removed) inside the block; its
    previous value or absence restored on the way out, exceptions too."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def f16_form_applies(sm):
    """Whether FLASHATTN_SM90_FP8_F16 picks another kernel on this SM
    (sm_90 only: elsewhere flashattn_fp8_f16 is skipped)."""
    return sm == 90


def e4m3_value(code):
    """The value of an e4m3 (float8_e4m3fn) byte: 1 sign, 4 exponent (bias
    7), 3 mantissa bits, subnormals, no infinities, S.1111.111 NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 7
    if e == 0xF and m == 7:
        return float("nan")
    if e == 0:
        return sign * m * 2.0 ** -9
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


def _descales():
    """Every value in [0.5, 2] with at most 4 significant bits (1.xxx x 2^e):
    e4m3 has 4, so code x descale has at most 8 and is exact in bf16 (8
    significant bits); the bf16 contenders then read exactly the values the
    fp8 ones do."""
    vals = {(8 + m) / 8 * 2.0 ** e for e in (-1, 0) for m in range(8)} | {2.0}
    return tuple(sorted(vals))


DESCALES = _descales()


def io_bytes(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, in_bytes, out_bytes=2):
    """Bytes a forward must move at least: Q, K, V read once at in_bytes an
    element, O written once at out_bytes."""
    return (in_bytes * (batch * seqlen_q * heads_q * head_dim
                        + 2 * batch * seqlen_k * heads_kv * head_dim)
            + out_bytes * batch * seqlen_q * heads_q * head_dim)


def fp8_grid(head_dims=common.HEAD_DIMS, seqlens=common.SEQLENS):
    """bench_sdpa.py's shapes with e4m3 inputs (seqlen outermost)."""
    return common.config_grid((IN_DTYPE,), head_dims, (False, True), seqlens)


def bf16_twin(c):
    """The bf16 config of the same shape (the 16-bit contenders')."""
    return common.BenchConfig("bf16", c.head_dim, c.causal, c.seqlen, c.batch, c.num_heads)


def fp8_config(fa, c):
    """flashattn's fp8 forward Config for c (raises while the binding has no
    q_dtype: the column is then n/a with that reason)."""
    return fa.Config(dtype="bf16", head_dim=c.head_dim, num_heads_q=c.num_heads,
                     num_heads_kv=c.num_heads, causal=c.causal, kv_dtype=IN_DTYPE,
                     q_dtype=IN_DTYPE)


def judge_fp8(fa_err, fa3_err):
    """(ok, note, bound) for flashattn_fp8's (max_abs, rel) error against the
    reference (the rule above). bound says which rule applied."""
    fa3_ok = fa3_err is not None and all(x is not None and math.isfinite(x) for x in fa3_err)
    if fa3_ok:
        ok, note = common.judge_tolerance(fa_err, {"fa3_fp8": fa3_err},
                                          rel_limit=FP8_ERR_FACTOR * fa3_err[1],
                                          factor=FP8_ERR_FACTOR, baseline_name="FA3 fp8")
        bound = "%gx FA3 fp8 (max %.3g, rel %.3g)" % (FP8_ERR_FACTOR, fa3_err[0], fa3_err[1])
    else:
        ok, note = common.judge_tolerance(fa_err, {}, rel_limit=FP8_REL_LIMIT)
        if ok and note.startswith("rel err only"):
            note = ""
        bound = "rel %g (no FA3 fp8)" % FP8_REL_LIMIT
    if fa_err is None:
        note = "no flashattn fp8 output"
    return ok, note, bound


# ---- rows, CSV, markdown ---------------------------------------------------------------

CONFIG_FIELDS = ["dtype", "head_dim", "causal", "seqlen", "batch", "num_heads", "num_heads_kv",
                 "flops", "bytes_fp8", "bytes_bf16"]
TAIL_FIELDS = ["ratio_vs_%s" % i for i in OTHERS] + ["err_bound", "tol_ok", "tol_note", "n_sets"]
FIELDS = CONFIG_FIELDS + ["%s_%s" % (i, f) for i in IMPLS for f in common.IMPL_FIELDS] + \
    TAIL_FIELDS
_INT_FIELDS = {"head_dim", "seqlen", "batch", "num_heads", "num_heads_kv", "flops", "bytes_fp8",
               "bytes_bf16", "n_sets"} | {"%s_reps" % i for i in IMPLS}
_FLOAT_SUFFIXES = ("_ms", "tflops", "_err") + tuple("ratio_vs_%s" % i for i in OTHERS)


def config_row(c, n_sets):
    """The columns known before anything runs (FLOPs and bytes first)."""
    hk = c.num_heads
    return {"dtype": c.dtype, "head_dim": c.head_dim, "causal": c.causal, "seqlen": c.seqlen,
            "batch": c.batch, "num_heads": c.num_heads, "num_heads_kv": hk, "flops": c.flops,
            "bytes_fp8": io_bytes(c.batch, c.seqlen, c.seqlen, c.num_heads, hk, c.head_dim, 1),
            "bytes_bf16": io_bytes(c.batch, c.seqlen, c.seqlen, c.num_heads, hk, c.head_dim, 2),
            "n_sets": n_sets}


def finish_row(row):
    """flashattn_fp8's TFLOP/s over each other contender's (same process,
    same values)."""
    for i in OTHERS:
        row["ratio_vs_" + i] = common.ratio(row.get("flashattn_fp8_tflops"), row.get(i + "_tflops"))
    return row


_parse = common.csv_parser(_INT_FIELDS, _FLOAT_SUFFIXES)


def write_csv(path, rows, meta):
    common.write_csv(path, rows, meta, FIELDS)


def read_csv(path):
    return common.read_csv(path, _parse)


def _err_cell(r, impl):
    return "%s / %s" % (common._f(r.get(impl + "_max_err"), "%.2e"),
                        common._f(r.get(impl + "_rel_err"), "%.2e"))


def markdown_table(rows):
    head = ("| d | causal | seqlen | batch x heads | GFLOP | MB fp8 / bf16 | %s | "
            "fp8/f16 form | fp8/bf16 | fp8/FA3 | fp8/SDPA | fa fp8 err max / rel | "
            "FA3 fp8 err max / rel | fa bf16 / SDPA rel err | tol |"
            % " | ".join(LABELS[i] for i in IMPLS))
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        tol = {True: "ok", False: "**FAIL**", None: "-"}[r.get("tol_ok")]
        if r.get("tol_note"):
            tol += " " + r["tol_note"].replace("|", "/")
        lines.append("| %d | %s | %d | %d x %d | %.1f | %.0f / %.0f | %s | %s | %s | %s | %s | %s |" % (
                         r["head_dim"], "yes" if r["causal"] else "no", r["seqlen"], r["batch"],
                         r["num_heads"], r["flops"] / 1e9, r["bytes_fp8"] / 1e6,
                         r["bytes_bf16"] / 1e6,
                         " | ".join(common.impl_cell(r, i) for i in IMPLS),
                         " | ".join(common._f(r.get("ratio_vs_" + i), "%.3f") for i in OTHERS),
                         _err_cell(r, "flashattn_fp8"), _err_cell(r, "fa3_fp8"),
                         "%s / %s" % (common._f(r.get("flashattn_bf16_rel_err"), "%.2e"),
                                      common._f(r.get("sdpa_flash_rel_err"), "%.2e")), tol))
    return "\n".join(lines)


def write_markdown(path, meta, rows, extra_sections=()):
    out = ["# flashattn fp8 forward: %s, %s" % (meta.get("gpu", "?"), meta.get("date", "?")), ""]
    for k in ("commit", "gpu", "sm", "driver", "torch", "cuda", "fa3", "flashattn_library",
              "flashattn_version", "date", "n_sets", "min_reps", "grid", "descales", "f16_form"):
        if k in meta:
            out.append("- %s: %s" % (k, meta[k]))
    out += ["",
            "Q, K, V e4m3 with fp32 descales [batch, num_heads_kv] (q/k/v each), O bf16; the bf16 "
            "contenders read the dequantised values (exact in bf16). FLOPs = 4 * batch * heads * "
            "seqlen_q * seqlen_k * head_dim, halved for causal; batch * seqlen = %d, heads * "
            "head_dim = %d. MB = Q, K, V read once (fp8: 1 byte, bf16: 2) + O written once "
            "(2 bytes). Figures are TFLOP/s from the median of CUDA-event times (warm-up first; "
            "inputs rotated over several sets); ratios are flashattn fp8 / the other. "
            "flashattn fp8 (f16 form): the same call with %s=1 (sm_90: Q, K, V converted to "
            "f16 for the 16-bit wgmma; elsewhere skipped, no effect), so fp8/f16 form is the "
            "native fp8 wgmma's speed-up over it. Errors are vs an fp32 reference on the "
            "dequantised values on a subset of batches/heads/rows. "
            "tol: flashattn fp8's max and relative error at most %gx FA3 fp8's on the same "
            "subset, else (no FA3) relative error at most %g (P is rounded to e4m3 in the "
            "kernel: up to 2^-4 relative per element; bench_fp8.py says why)." % (
                common.TOKENS, common.HIDDEN, F16_FORM_ENV, FP8_ERR_FACTOR, FP8_REL_LIMIT),
            "", markdown_table(rows), ""]
    fails = [r for r in rows if r.get("tol_ok") is False]
    out.append("Out of tolerance: %s" % (", ".join(
        "fp8 d%d %s s%d" % (r["head_dim"], "causal" if r["causal"] else "full", r["seqlen"])
        for r in fails) if fails else "none"))
    out.append("")
    for title, body in extra_sections:
        out += ["## %s" % title, "", "```", body.rstrip(), "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


# ======================================================================================
# GPU part: everything below needs torch.
# ======================================================================================

class Fp8Bench(common.GpuBench):
    """bench_sdpa.py's GpuBench (runtime, SDPA backends, timing, reference)
    with the fp8 contenders."""

    def __init__(self, torch, fa, args):
        super().__init__(torch, fa, args)
        self.f8 = torch.float8_e4m3fn
        self.fp8_configs = {}
        try:
            from flash_attn_interface import flash_attn_func
            self.fa3, self.fa3_why = flash_attn_func, None
        except Exception as ex:  # not installed, or built for another torch or GPU
            self.fa3, self.fa3_why = None, "flash_attn_interface: %s" % common._reason(ex, [])

    def fa3_version(self):
        if self.fa3 is None:
            return "not importable (%s)" % self.fa3_why
        for mod in ("flash_attn_3", "flash_attn_interface"):
            v = getattr(sys.modules.get(mod), "__version__", None)
            if v:
                return v
        return "importable (version unknown)"

    def quantise(self, x, ds, group):
        """(e4m3(x / descale), the dequantised bf16 tensor) for x fp32 [b, s,
        h, d] and descales [b, h_kv] (query head h uses KV head h // group).
        Raises if a dequantised value is not exact in bf16."""
        torch = self.torch
        d = ds.repeat_interleave(group, dim=1)[:, None, :, None]
        x8 = (x / d).to(self.f8)
        deq = x8.float() * d
        x16 = deq.to(torch.bfloat16)
        if not torch.equal(x16.float(), deq):
            raise RuntimeError("e4m3 x descale not exact in bf16 (descales %s)" % DESCALES)
        return x8, x16

    def make_sets(self, c):
        """Per input set: (q8, k8, v8, q_descale, k_descale, v_descale) and
        the dequantised bf16 (q, k, v)."""
        torch, a = self.torch, self.args
        g = torch.Generator(device="cuda").manual_seed(zlib.crc32(("fp8 " + c.describe()).encode()))
        shape, hk = (c.batch, c.seqlen, c.num_heads, c.head_dim), c.num_heads
        vals = torch.tensor(DESCALES, device="cuda", dtype=torch.float32)
        sets8, sets16 = [], []
        for _ in range(a.sets):
            ds = [vals[torch.randint(len(DESCALES), (c.batch, hk), device="cuda", generator=g)]
                  for _ in range(3)]
            t8, t16 = [], []
            for d in ds:
                x8, x16 = self.quantise(
                    torch.randn(shape, device="cuda", dtype=torch.float32, generator=g), d,
                    c.num_heads // hk)
                t8.append(x8)
                t16.append(x16)
            sets8.append(tuple(t8) + tuple(ds))
            sets16.append(tuple(t16))
        return sets8, sets16

    def form_runtime(self, impl):
        """The runtime flashattn fp8 contender impl runs on: the library reads
        F16_FORM_ENV once, when a runtime is created, so each form has its
        own, made with the variable as ENV_FORMS says (cached)."""
        rts = self.__dict__.setdefault("form_rts", {})
        if impl not in rts:
            with env_var(F16_FORM_ENV, ENV_FORMS[impl]):
                rts[impl] = self.fa.Runtime(backend="cuda", cache="memory")
        return rts[impl]

    def make_fp8_call(self, impl, c, sets8, outs):
        """run(i) for flashattn_fp8, flashattn_fp8_f16 (the same call on the
        form's runtime, see form_runtime) or fa3_fp8 on fp8 input set i."""
        stream = self.torch.cuda.current_stream()
        if impl in ENV_FORMS:
            if c.key not in self.fp8_configs:
                self.fp8_configs[c.key] = fp8_config(self.fa, c)
            cfg, fwd, rt = self.fp8_configs[c.key], self.fa.forward, self.form_runtime(impl)

            def run(i):
                q, k, v, qd, kd, vd = sets8[i]
                fwd(rt, cfg, q, k, v, out=outs[i], stream=stream, q_descale=qd, k_descale=kd,
                    v_descale=vd)
                return outs[i]
            return run
        if self.fa3 is None:
            raise RuntimeError(self.fa3_why)
        fa3 = self.fa3

        def run(i):
            q, k, v, qd, kd, vd = sets8[i]
            o = fa3(q, k, v, causal=c.causal, q_descale=qd, k_descale=kd, v_descale=vd)
            return o[0] if isinstance(o, tuple) else o  # older FA3: (out, lse)
        return run

    def run_config(self, c, budget_left_s):
        """One CSV row for config c (dtype e4m3)."""
        a = self.args
        row = config_row(c, a.sets)
        sets8, sets16 = self.make_sets(c)
        # flashattn fp8 and bf16 both write these (poisoned before each checked run)
        outs = [self.torch.empty_like(s[0]) for s in sets16]
        ref, idx = self.reference(c, *sets16[0], common.reference_subset(
            c.batch, c.num_heads, c.seqlen))
        cb = bf16_twin(c)
        makers = {"flashattn_fp8": lambda: self.make_fp8_call("flashattn_fp8", c, sets8, outs),
                  "flashattn_fp8_f16": lambda: self.make_fp8_call("flashattn_fp8_f16", c, sets8,
                                                                  outs),
                  "flashattn_bf16": lambda: self.make_call("flashattn", cb, sets16, outs),
                  "fa3_fp8": lambda: self.make_fp8_call("fa3_fp8", c, sets8, outs),
                  "sdpa_flash": lambda: self.make_call("sdpa_flash", cb, sets16, outs)}
        errs = {}
        for impl in IMPLS:
            if impl == "flashattn_fp8_f16" and not f16_form_applies(self.sm):
                row[impl + "_status"], row[impl + "_note"] = "skipped", F16_FORM_SKIP
                errs[impl] = None
                continue
            poison = outs[0] if impl.startswith("flashattn") else None
            # the form is its runtime's (form_runtime); the variable is also set
            # for the whole measurement (warm-up, checked run, timing)
            form = (env_var(F16_FORM_ENV, ENV_FORMS[impl]) if impl in ENV_FORMS
                    else contextlib.nullcontext())
            with form:
                errs[impl] = self.measure(row, impl, makers[impl], poison, ref, idx, c.flops,
                                          budget_left_s)
        row["tol_ok"], row["tol_note"], row["err_bound"] = judge_fp8(
            errs["flashattn_fp8"], errs["fa3_fp8"])
        del sets8, sets16, outs, ref
        return finish_row(row)


def run_bench(args):
    torch = common.import_torch_gpu("bench_fp8")
    if not hasattr(torch, "float8_e4m3fn"):
        raise SystemExit("bench_fp8: this torch (%s) has no float8_e4m3fn" % torch.__version__)
    fa = common.import_flashattn()
    t_start = time.time()
    bench = Fp8Bench(torch, fa, args)
    gpu, info, date, meta = common.run_meta(torch, fa, bench, args)
    meta["fa3"] = bench.fa3_version()
    seqlens = tuple(int(s) for s in args.seqlens.split(","))
    head_dims = tuple(int(d) for d in args.head_dims.split(","))
    grid = fp8_grid(head_dims, seqlens)
    meta["grid"] = "e4m3 in, bf16 out, head_dims %s, seqlens %s, causal/not: %d configs" % (
        ",".join(map(str, head_dims)), ",".join(map(str, seqlens)), len(grid))
    meta["descales"] = ("q/k/v fp32 [batch, num_heads_kv], each drawn from %d values in [0.5, 2] "
                        "with 4 significant bits" % len(DESCALES))
    meta["f16_form"] = ("flashattn_fp8_f16: %s=1 while measured%s" % (
        F16_FORM_ENV, "" if f16_form_applies(info.sm) else
        "; skipped (sm_%d: no effect)" % info.sm))
    meta["error_rule"] = "max and rel <= %gx FA3 fp8's, else rel <= %g" % (
        FP8_ERR_FACTOR, FP8_REL_LIMIT)
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, common.run_base(args, date.strftime("%Y-%m-%d"), gpu))
    print("bench_fp8: %s (sm_%d, %d SMs), torch %s, CUDA %s, FA3 %s, %d configs -> %s.*" % (
        gpu, info.sm, info.num_sms, torch.__version__, torch.version.cuda, meta["fa3"], len(grid),
        base), flush=True)
    rows = []
    deadline = time.time() + args.time_budget
    for n, c in enumerate(grid):
        t0 = time.time()
        left = deadline - t0
        if left <= 0:
            row = config_row(c, args.sets)
            for i in IMPLS:
                row[i + "_status"], row[i + "_note"] = "skipped", "time budget"
            row = finish_row(row)
        else:
            try:
                row = bench.run_config(c, left)
            except Exception as ex:  # e.g. out of memory building the sets
                row = finish_row(config_row(c, args.sets))
                for i in IMPLS:
                    row[i + "_status"], row[i + "_note"] = "error", common._reason(ex, [])
        rows.append(row)
        print("[%2d/%d] %-30s %s TFLOP/s  fp8/f16form %s  fp8/FA3 %s  err %s  tol %s (%.1fs)" % (
            n + 1, len(grid), c.describe(),
            "  ".join("%s %s" % (i, common._f(row.get(i + "_tflops"))) for i in IMPLS),
            common._f(row.get("ratio_vs_flashattn_fp8_f16"), "%.3f"),
            common._f(row.get("ratio_vs_fa3_fp8"), "%.3f"),
            common._f(row.get("flashattn_fp8_rel_err"), "%.1e"),
            {True: "ok", False: "FAIL", None: "-"}[row.get("tol_ok")] +
            (" (" + row["tol_note"] + ")" if row.get("tol_note") else ""),
            time.time() - t0), flush=True)
        torch.cuda.empty_cache()
    meta["wall_s"] = "%.0f" % (time.time() - t_start)
    write_csv(base + ".csv", rows, meta)
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows, "files": [
            os.path.basename(base) + x for x in (".csv", ".md")]}, f, indent=1, default=str)
    extra = []
    if args.tests_summary and os.path.exists(args.tests_summary):
        with open(args.tests_summary) as f:
            extra.append(("GPU tests (bench/run_gpu.sh)", f.read()))
    write_markdown(base + ".md", meta, rows, extra)
    print("\n" + markdown_table(rows))
    print("\nwrote %s.{csv,json,md} in %.0f s" % (base, time.time() - t_start))
    return 3 if any(r.get("tol_ok") is False for r in rows) else 0


def main(argv=None):
    """bench_sdpa.py's options with --fp8 implied."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return common.main(argv if "--fp8" in argv else ["--fp8"] + argv)


if __name__ == "__main__":
    sys.exit(main())

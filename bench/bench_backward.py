#!/usr/bin/env python3
"""flashattn's training backward (fa_backward) vs PyTorch SDPA's flash and cuDNN backwards.

    python3 bench/bench_sdpa.py --backward [--deterministic] [--quick] [--time-budget S]
    python3 bench/bench_backward.py [the same options]

bench_sdpa.py's grid (fp16/bf16 x head_dim 64/128/256 x causal/not x seqlen
512..16k, batch * seqlen = 16384, num_heads * head_dim = 2048); head dims
past 256, which fa_backward does not take, are rows marked skipped with
that note. Per config, each input set holds Q, K, V and the upstream
gradient dO, drawn once. Each contender's forward runs once per set before
its backward is measured, outside the timed region; only the backward is
timed:

  flashattn      flashattn.backward (the binding's fa_backward) on the torch
                 tensors with the O and LSE of flashattn.forward(...,
                 lse=...) run beforehand, into preallocated dQ, dK, dV; the
                 workspace is the binding's own (allocated by the checked
                 run, then reused): the backward's kernels alone (row
                 statistics, main kernel, dQ conversion). flashattn.torch's
                 autograd (flash_attn_func) makes this same call, plus
                 torch.empty for its outputs (bindings/python/tests/
                 test_torch_gpu.py checks that the bits are equal)
  flashattn_det  the same with deterministic=True (--deterministic only)
  sdpa_flash     torch.autograd.grad(o, (q, k, v), dO, retain_graph=True) on
  sdpa_cudnn     a graph whose F.scaled_dot_product_attention ran once under
                 sdpa_kernel(SDPBackend.FLASH_ATTENTION or CUDNN_ATTENTION)
                 on [b, h, s, d] transpose views of leaf [b, s, h, d]
                 tensors: that backend's backward node (checked by name)
                 with its allocations from torch's caching allocator; dO is
                 laid out in the strides of SDPA's own O

FLOPs, FlashAttention's convention: the backward counts 2.5x the forward's
4 * batch * heads * seqlen_q * seqlen_k * head_dim (five matmuls to the
forward's two: S = Q K^T again, dV = P^T dO, dP = dO V^T, dQ = dS K,
dK = dS^T Q), halved with causal; so 10 * batch * heads * seqlen_q *
seqlen_k * head_dim, 5 * ... causal (backward_flops). TFLOP/s from
medians; ratio_vs_sdpa_* = flashattn's TFLOP/s over that backend's;
det_slowdown = flashattn_det's median time over flashattn's.

Correctness first: every contender's dQ, dK and dV against fp32 gradients
(TF32 off) of the same Q, K, V and dO, on at most 2 batches x 4 heads
(every row and key: dK and dV sum over all rows); flashattn's outputs are
poisoned with NaN before its checked run and must come back finite. Each
gradient is judged as bench_sdpa.py judges O (judge_tolerance: max error at
most 2x the best SDPA backend's on the same gradient, relative error under
1e-2, NaN fails), for both flashattn modes; the deterministic mode must
also give the same bits in two runs. A config that fails is FAIL, exit
status 3. Timing (warm-up, median of >= 20 runs, input sets rotated, sleep
hold) is bench_sdpa.py's (GpuBench.time_into). Writes CSV, JSON, PNG and
markdown named <date>-<gpu>-sdpa-backward.* under --out-dir (all but the
PNG after every config), the markdown led by issue 30's summary: at
head_dim 128 and seqlen 4k..16k, flashattn >= 1.0x SDPA cuDNN's and
>= 1.6x SDPA flash's backward, deterministic mode within 15% of the
default (det_slowdown <= 1.15).

Everything above the "GPU part" marker needs only the standard library.
"""

import json
import math
import os
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_sdpa as common  # noqa: E402  (grid, timing, correctness, CSV and chart helpers)

IMPLS = ("flashattn", "flashattn_det", "sdpa_flash", "sdpa_cudnn")
FA_IMPLS = IMPLS[:2]
SDPA_IMPLS = common.SDPA_IMPLS
GRADS = ("dq", "dk", "dv")
LABELS = dict(common.LABELS, flashattn_det="flashattn det")
COLORS = dict(common.COLORS, flashattn_det=(255, 127, 14))
# The backward node each SDPA backend's forward records (a prefix: torch
# numbers them); another node means torch ran something else.
SDPA_NODES = {"sdpa_flash": "ScaledDotProductFlashAttentionBackward",
              "sdpa_cudnn": "ScaledDotProductCudnnAttentionBackward"}

# fa_backward returns UNSUPPORTED past this head dim (include/flashattn.h).
BWD_MAX_HEAD_DIM = 256
HEAD_DIM_SKIP = "fa_backward takes head dims up to %d" % BWD_MAX_HEAD_DIM
NO_DET = "no --deterministic"

# Issue 30's done-when, on the H200: at head_dim 128 and seqlen 4k..16k the
# backward >= 1.0x SDPA cuDNN's and >= 1.6x SDPA flash's (TFLOP/s ratios),
# the deterministic mode within 15% of the default (time ratio <= 1.15).
TARGET_HEAD_DIM = 128
TARGET_SEQLENS = (4096, 8192, 16384)
TARGET_RATIOS = (("ratio_vs_sdpa_cudnn", "fa/cuDNN", 1.0), ("ratio_vs_sdpa_flash", "fa/flash", 1.6))
DET_MAX_SLOWDOWN = 1.15


# ---- configs and arithmetic ------------------------------------------------------------

def backward_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal):
    """2.5 x the forward's 4 * batch * heads * seqlen_q * seqlen_k *
    head_dim (five matmuls to its two), halved for causal: FlashAttention's
    convention. Exact: the forward's count is even."""
    return common.attention_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal) * 5 // 2


def backward_grid(dtypes=common.DTYPES, head_dims=common.HEAD_DIMS, seqlens=common.SEQLENS):
    """bench_sdpa.py's configs in its order (seqlen outermost, in the order
    given), head dims past BWD_MAX_HEAD_DIM included (run_bench records
    them as skipped)."""
    return common.config_grid(dtypes, head_dims, (False, True), seqlens)


def runnable(c):
    """Whether fa_backward takes config c's head dim."""
    return c.head_dim <= BWD_MAX_HEAD_DIM


def measured_impls(deterministic):
    """The contenders a run measures, in order."""
    return IMPLS if deterministic else tuple(i for i in IMPLS if i != "flashattn_det")


def geomean(values):
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


# ---- tolerance ---------------------------------------------------------------------------

def judge_backward(fa_errs, sdpa_errs):
    """(ok, note) for one flashattn mode. fa_errs: {grad: (max_abs, rel)}
    against the fp32 reference, or None when it produced no output;
    sdpa_errs: {impl: {grad: (max_abs, rel)}} of the SDPA backends that ran.
    Each of dq, dk, dv is judged by bench_sdpa.judge_tolerance against the
    SDPA backends' errors on that gradient; ok when all three pass."""
    if fa_errs is None:
        return None, "no flashattn output"
    oks, notes = [], []
    for g in GRADS:
        base = {i: e[g] for i, e in sdpa_errs.items() if e is not None and e.get(g) is not None}
        ok, note = common.judge_tolerance(fa_errs.get(g), base)
        oks.append(ok)
        if note and not note.startswith("rel err only"):
            notes.append("%s: %s" % (g, note.replace("; ", ", ")))
    if not sdpa_errs:
        notes.append("rel err only (no SDPA backward ran)")
    return all(o is True for o in oks), "; ".join(notes)


def judge_row(errs, det_bitwise=None):
    """(tol_ok, tol_note) of a config: each flashattn mode in errs (impl ->
    its judge_backward errors, None when it did not run) judged against the
    SDPA backends in errs, and det_bitwise (False: the deterministic mode
    gave different bits in two runs) a failure. ok is False when anything
    failed, None when no flashattn mode was judged."""
    sdpa = {i: errs[i] for i in SDPA_IMPLS if errs.get(i) is not None}
    oks, notes = [], []
    for impl in FA_IMPLS:
        if impl not in errs:
            continue
        ok, note = judge_backward(errs[impl], sdpa)
        if ok is None and impl != "flashattn":
            note = "no output"  # the det mode's reason is in its status note
        oks.append(ok)
        if note:
            notes.append(note if impl == "flashattn" else "det: " + note)
    if det_bitwise is False:
        oks.append(False)
        notes.append("deterministic mode: two runs gave different bits")
    if False in oks:
        ok = False
    elif any(o is True for o in oks):
        ok = True
    else:
        ok = None
    if ok is None and not notes:
        notes.append("no flashattn output")
    return ok, "; ".join(notes)


# ---- rows, CSV ---------------------------------------------------------------------------

CONFIG_FIELDS = common.CONFIG_FIELDS  # flops: the backward's (backward_flops)
IMPL_FIELDS = ["status", "note", "median_ms", "min_ms", "max_ms", "reps", "tflops"] + [
    "%s_%s" % (g, e) for g in GRADS for e in ("max_err", "rel_err")]
TAIL_FIELDS = ["ratio_vs_sdpa_flash", "ratio_vs_sdpa_cudnn", "det_slowdown", "det_bitwise",
               "tol_ok", "tol_note", "n_sets"]
FIELDS = CONFIG_FIELDS + ["%s_%s" % (i, f) for i in IMPLS for f in IMPL_FIELDS] + TAIL_FIELDS
_INT_FIELDS = {"head_dim", "seqlen", "batch", "num_heads", "flops", "n_sets"} | {
    "%s_reps" % i for i in IMPLS}
_FLOAT_SUFFIXES = ("_ms", "tflops", "_err", "ratio_vs_sdpa_flash", "ratio_vs_sdpa_cudnn",
                   "det_slowdown")
_parse_common = common.csv_parser(_INT_FIELDS, _FLOAT_SUFFIXES)


def _parse(field, text):
    if field == "det_bitwise" and text != "":
        return text == "1"
    return _parse_common(field, text)


def config_row(c, n_sets, deterministic=True):
    """The columns known before anything runs (FLOPs first); without
    --deterministic flashattn_det is skipped with that note."""
    row = {"dtype": c.dtype, "head_dim": c.head_dim, "causal": c.causal, "seqlen": c.seqlen,
           "batch": c.batch, "num_heads": c.num_heads,
           "flops": backward_flops(c.batch, c.num_heads, c.seqlen, c.seqlen, c.head_dim, c.causal),
           "n_sets": n_sets}
    if not deterministic:
        row["flashattn_det_status"], row["flashattn_det_note"] = "skipped", NO_DET
    return row


def skipped_row(c, n_sets, note, deterministic=True):
    """A config nothing ran on (a head dim past fa_backward's, the time budget)."""
    row = config_row(c, n_sets, deterministic)
    for i in measured_impls(deterministic):
        row[i + "_status"], row[i + "_note"] = "skipped", note
    return finish_row(row)


def finish_row(row):
    """The ratios: flashattn's TFLOP/s over each SDPA backend's (same
    process, same values), and det_slowdown, flashattn_det's median time
    over flashattn's."""
    for i in SDPA_IMPLS:
        row["ratio_vs_" + i] = common.ratio(row.get("flashattn_tflops"), row.get(i + "_tflops"))
    row["det_slowdown"] = common.ratio(row.get("flashattn_det_median_ms"),
                                       row.get("flashattn_median_ms"))
    return row


def write_csv(path, rows, meta):
    common.write_csv(path, rows, meta, FIELDS)


def read_csv(path):
    return common.read_csv(path, _parse)


# ---- issue 30's summary ------------------------------------------------------------------

def issue30_summary(rows):
    """Issue 30's done-when, per (dtype, causal) that has head_dim 128 rows
    at seqlen 4k..16k: a dict with dtype, causal, the seqlens present, for
    each target ratio key (min, geomean, points measured), det_slowdown
    (max, geomean, points), why (the misses and gaps) and verdict: 'missed'
    when a measured point misses a target or a row is out of tolerance,
    else 'incomplete' when a point or figure is missing, else 'met'."""
    groups, order = {}, []
    for r in rows:
        if r["head_dim"] != TARGET_HEAD_DIM or r["seqlen"] not in TARGET_SEQLENS:
            continue
        key = (r["dtype"], bool(r["causal"]))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(r)
    out = []
    for key in order:
        rs = sorted(groups[key], key=lambda r: r["seqlen"])
        e = {"dtype": key[0], "causal": key[1], "seqlens": [r["seqlen"] for r in rs]}
        missed, gaps = [], []
        for field, label, target in TARGET_RATIOS:
            got = [(r["seqlen"], r.get(field)) for r in rs if r.get(field) is not None]
            vals = [v for _, v in got]
            e[field] = (min(vals) if vals else None, geomean(vals), len(vals))
            missed += ["%s %.3f < %g at s%d" % (label, v, target, s) for s, v in got if v < target]
            if len(vals) < len(TARGET_SEQLENS):
                gaps.append("%s at %d of %d seqlens" % (label, len(vals), len(TARGET_SEQLENS)))
        got = [(r["seqlen"], r["det_slowdown"]) for r in rs if r.get("det_slowdown") is not None]
        vals = [v for _, v in got]
        e["det_slowdown"] = (max(vals) if vals else None, geomean(vals), len(vals))
        missed += ["det/default %.3f > %g at s%d" % (v, DET_MAX_SLOWDOWN, s)
                   for s, v in got if v > DET_MAX_SLOWDOWN]
        if len(vals) < len(TARGET_SEQLENS):
            gaps.append("det/default at %d of %d seqlens" % (len(vals), len(TARGET_SEQLENS)))
        missed += ["out of tolerance at s%d" % r["seqlen"] for r in rs if r.get("tol_ok") is False]
        e["why"] = missed + gaps
        e["verdict"] = "missed" if missed else ("incomplete" if gaps else "met")
        out.append(e)
    return out


def summary_table(entries):
    if not entries:
        return "(no head_dim %d rows at seqlen %s in this grid)" % (
            TARGET_HEAD_DIM, "/".join(map(str, TARGET_SEQLENS)))
    head = ("| dtype | causal | seqlens | %s | det/default time max / geomean (<= %g) | "
            "issue 30 |" % (" | ".join("%s min / geomean (>= %g)" % (label, t)
                                       for _, label, t in TARGET_RATIOS), DET_MAX_SLOWDOWN))
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for e in entries:
        cells = ["%s / %s" % (common._f(e[f][0], "%.3f"), common._f(e[f][1], "%.3f"))
                 for f, _, _ in TARGET_RATIOS]
        det = "%s / %s" % (common._f(e["det_slowdown"][0], "%.3f"),
                           common._f(e["det_slowdown"][1], "%.3f"))
        verdict = e["verdict"] + (" (%s)" % "; ".join(e["why"]) if e["why"] else "")
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            e["dtype"], "yes" if e["causal"] else "no", ",".join(map(str, e["seqlens"])),
            " | ".join(cells), det, verdict.replace("|", "/")))
    return "\n".join(lines)


def overall_line(rows):
    """Geomeans of the ratios over every config measured."""
    parts = []
    for field, label, _ in TARGET_RATIOS:
        vals = [r[field] for r in rows if r.get(field) is not None]
        parts.append("%s %s (%d configs)" % (label, common._f(geomean(vals), "%.3f"), len(vals)))
    vals = [r["det_slowdown"] for r in rows if r.get("det_slowdown") is not None]
    parts.append("det/default time %s (%d configs)" % (common._f(geomean(vals), "%.3f"), len(vals)))
    return "Geomean over all configs measured: " + ", ".join(parts)


# ---- markdown ----------------------------------------------------------------------------

def _rel_cell(r, impls):
    """dq / dk / dv relative errors: impls' (the smallest among them)."""
    out = []
    for g in GRADS:
        vals = [r.get("%s_%s_rel_err" % (i, g)) for i in impls]
        vals = [v for v in vals if v is not None]
        out.append(common._f(min(vals) if vals else None, "%.1e"))
    return " / ".join(out)


def markdown_table(rows):
    head = ("| dtype | d | causal | seqlen | batch x heads | GFLOP | %s | fa/flash | fa/cuDNN | "
            "det/default time | det bits | fa rel err dq / dk / dv | det rel err | "
            "best SDPA rel err | tol |" % " | ".join(LABELS[i] for i in IMPLS))
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        tol = {True: "ok", False: "**FAIL**", None: "-"}[r.get("tol_ok")]
        if r.get("tol_note"):
            tol += " " + r["tol_note"].replace("|", "/")
        bits = {True: "same", False: "**differ**", None: "-"}[r.get("det_bitwise")]
        lines.append("| %s | %d | %s | %d | %d x %d | %.1f | %s | %s | %s | %s | %s | %s | %s | %s "
                     "| %s |" % (
                         r["dtype"], r["head_dim"], "yes" if r["causal"] else "no", r["seqlen"],
                         r["batch"], r["num_heads"], r["flops"] / 1e9,
                         " | ".join(common.impl_cell(r, i) for i in IMPLS),
                         common._f(r.get("ratio_vs_sdpa_flash"), "%.3f"),
                         common._f(r.get("ratio_vs_sdpa_cudnn"), "%.3f"),
                         common._f(r.get("det_slowdown"), "%.3f"), bits,
                         _rel_cell(r, ("flashattn",)), _rel_cell(r, ("flashattn_det",)),
                         _rel_cell(r, SDPA_IMPLS), tol))
    return "\n".join(lines)


def write_markdown(path, meta, rows, extra_sections=()):
    out = ["# flashattn backward vs PyTorch SDPA: %s, %s" % (meta.get("gpu", "?"),
                                                            meta.get("date", "?")), ""]
    out += ["## Issue 30 (head_dim %d, seqlen %s)" % (
        TARGET_HEAD_DIM, "/".join(map(str, TARGET_SEQLENS))), "",
        summary_table(issue30_summary(rows)), "", overall_line(rows), ""]
    for k in ("commit", "gpu", "sm", "driver", "torch", "cuda", "cudnn", "flashattn_library",
              "flashattn_version", "date", "n_sets", "min_reps", "grid", "skipped", "deterministic",
              "sdpa_backward_nodes", "chart"):
        if k in meta:
            out.append("- %s: %s" % (k, meta[k]))
    out += ["",
            "Only the backward is timed (each contender's forward ran once per input set "
            "before). FLOPs = 2.5 x 4 * batch * heads * seqlen_q * seqlen_k * head_dim, halved "
            "for causal (FlashAttention's convention); batch * seqlen = %d, heads * head_dim = "
            "%d. Figures are TFLOP/s from the median of CUDA-event times (warm-up first; inputs "
            "rotated over several sets). fa/flash and fa/cuDNN are flashattn / SDPA backend; "
            "det/default time is flashattn det's median time over flashattn's; det bits: two "
            "deterministic runs compared bit for bit. Errors are relative L2 errors of dq / dk / "
            "dv vs fp32 gradients on at most 2 batches x 4 heads (every row and key); tol fails "
            "when a flashattn mode's max error on a gradient exceeds %gx the best SDPA "
            "backend's, its relative error exceeds %g, or the deterministic bits differ." % (
                common.TOKENS, common.HIDDEN, common.ERR_FACTOR, common.REL_ERR_LIMIT),
            "", markdown_table(rows), ""]
    fails = [r for r in rows if r.get("tol_ok") is False]
    out.append("Out of tolerance: %s" % (", ".join(
        "%s d%d %s s%d" % (r["dtype"], r["head_dim"], "causal" if r["causal"] else "full",
                            r["seqlen"]) for r in fails) if fails else "none"))
    out.append("")
    for title, body in extra_sections:
        out += ["## %s" % title, "", "```", body.rstrip(), "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def write_results(base, meta, rows, extra_sections=()):
    """CSV, JSON (meta, rows, issue 30's summary) and markdown: after
    every config, so a run cut off keeps what it measured."""
    write_csv(base + ".csv", rows, meta)
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows, "issue30": issue30_summary(rows), "files": [
            os.path.basename(base) + x for x in (".csv", ".png", ".md")]}, f, indent=1,
            default=str)
    write_markdown(base + ".md", meta, rows, extra_sections)


def progress_line(n, total, c, row, seconds):
    def t(i):
        return common._f(row.get(i + "_tflops"))
    tol = {True: "ok", False: "FAIL", None: "-"}[row.get("tol_ok")]
    if row.get("tol_note"):
        tol += " (" + row["tol_note"] + ")"
    return ("[%2d/%d] %-30s fa %s det %s flash %s cudnn %s TFLOP/s  fa/cudnn %s fa/flash %s "
            "det/def %s  rel err %s  tol %s (%.1fs)" % (
                n, total, c.describe(), t("flashattn"), t("flashattn_det"), t("sdpa_flash"),
                t("sdpa_cudnn"), common._f(row.get("ratio_vs_sdpa_cudnn"), "%.3f"),
                common._f(row.get("ratio_vs_sdpa_flash"), "%.3f"),
                common._f(row.get("det_slowdown"), "%.3f"), _rel_cell(row, ("flashattn",)), tol,
                seconds))


# ======================================================================================
# GPU part: everything below needs torch.
# ======================================================================================

class BackwardBench(common.GpuBench):
    """bench_sdpa.py's GpuBench (runtime, SDPA backends, timing) with the
    backward contenders. device "cpu": the emulator runtime and SDPA's math
    backend (no backend-node check), for a test of this code without a GPU;
    time_impl and one_run_ms then need replacing (they use CUDA events)."""

    def __init__(self, torch, fa, args, device="cuda"):
        super().__init__(torch, fa, args, backend="cuda" if device == "cuda" else "emulator")
        self.device = device
        self.nodes = {}  # impl -> the backward node SDPA recorded
        if device != "cuda" and self.sdpa_kernel is not None:
            from torch.nn.attention import SDPBackend
            self.backends = {k: SDPBackend.MATH for k in self.backends}

    def stream(self):
        return self.torch.cuda.current_stream() if self.device == "cuda" else None

    def dst(self, t):
        """What the binding writes into: the torch tensor, or on the CPU its
        NumPy view (the binding's host outputs)."""
        return t if self.device == "cuda" else t.numpy()

    def make_sets(self, c):
        """Per input set (q, k, v, dout), [b, s, h, d] each, drawn once."""
        torch = self.torch
        tdt = torch.float16 if c.dtype == "fp16" else torch.bfloat16
        g = torch.Generator(device=self.device).manual_seed(
            zlib.crc32(("backward " + c.describe()).encode()))
        shape = (c.batch, c.seqlen, c.num_heads, c.head_dim)
        return [tuple(torch.randn(shape, device=self.device, dtype=tdt, generator=g)
                      for _ in range(4)) for _ in range(self.args.sets)]

    def reference_grads(self, c, q, k, v, dout, subset):
        """fp32 (dq, dk, dv), each [nb, seqlen, nh, d], for the batches and
        heads of subset (reference_subset's first two lists; every row and
        key), and the index tensors (bs, hs) pick_grad takes. One (batch,
        head) at a time: P = softmax(scale Q K^T) (causal: key after query
        masked; seqlen_q == seqlen_k), dV = P^T dO, dP = dO V^T, dS = P o
        (dP - rowsum(dO o O)), dQ = scale dS K, dK = scale dS^T Q."""
        torch = self.torch
        bl, hl = subset[0], subset[1]
        bs, hs = (torch.tensor(x, device=q.device) for x in (bl, hl))
        shape = (len(bl), c.seqlen, len(hl), c.head_dim)
        refs = [torch.empty(shape, device=q.device, dtype=torch.float32) for _ in GRADS]
        scale = 1.0 / math.sqrt(c.head_dim)
        later = None
        if c.causal:
            i = torch.arange(c.seqlen, device=q.device)
            later = i[None, :] > i[:, None]
        for x, b in enumerate(bl):
            for y, h in enumerate(hl):
                qf, kf, vf, df = (t[b, :, h, :].float() for t in (q, k, v, dout))
                s = torch.matmul(qf, kf.t()).mul_(scale)
                if later is not None:
                    s.masked_fill_(later, float("-inf"))
                p = torch.softmax(s, dim=-1)
                del s
                o = torch.matmul(p, vf)
                refs[2][x, :, y] = torch.matmul(p.t(), df)
                ds = torch.matmul(df, vf.t())
                ds.sub_((df * o).sum(-1, keepdim=True)).mul_(p)
                del p, o
                refs[0][x, :, y] = torch.matmul(ds, kf).mul_(scale)
                refs[1][x, :, y] = torch.matmul(ds.t(), qf).mul_(scale)
                del ds
        return refs, (bs, hs)

    @staticmethod
    def pick_grad(x, idx):
        """reference_grads' batches and heads of a gradient [b, s, h, d]."""
        bs, hs = idx
        return x.index_select(0, bs).index_select(2, hs)

    def measure_backward(self, row, impl, make_run, poison, refs, idx, flops, budget_left_s):
        """measure() for a backward: make_run() returns run(i) (the backward
        on input set i, returning (dq, dk, dv) [b, s, h, d]); poison: the
        tensors run(0) writes, filled with NaN first. Each gradient's
        (max_abs, rel) against refs goes into impl_<grad>_max_err / _rel_err.
        Returns {grad: (max_abs, rel)} (NaNs for a gradient not finite
        everywhere), or None when it did not run (n/a with the reason)."""
        torch = self.torch
        p = impl + "_"
        try:
            with common._Warnings() as w:
                run = make_run()
                for t in poison:
                    t.fill_(float("nan"))  # every element must be written
                grads = run(0)
                self.sync()
        except Exception as ex:  # unavailable for this config: n/a with the reason
            row[p + "status"] = "n/a"
            row[p + "note"] = common._reason(ex, w.messages)
            return None
        errs, bad = {}, []
        for g, x, ref in zip(GRADS, grads, refs):
            err = self.error(self.pick_grad(x, idx), ref, None)
            row[p + g + "_max_err"], row[p + g + "_rel_err"] = err
            if not bool(torch.isfinite(x).all().item()):
                bad.append(g)
                err = (float("nan"), float("nan"))
            errs[g] = err
        if bad:
            row[p + "note"] = "non-finite %s (unwritten or NaN)" % "/".join(bad)
        del grads
        self.time_into(row, impl, run, flops, budget_left_s)
        return errs

    def fa_forward(self, c, sets):
        """flashattn's (O, LSE) of each set, run once before any backward."""
        torch, cfg = self.torch, self.fa_config(c)
        outs = []
        for q, k, v, _ in sets:
            o = torch.empty_like(q)
            lse = torch.empty((c.batch, c.num_heads, c.seqlen), device=self.device,
                              dtype=torch.float32)
            self.fa.forward(self.rt, cfg, q, k, v, out=self.dst(o), lse=self.dst(lse),
                            stream=self.stream())
            outs.append((o, lse))
        self.sync()
        return outs

    def make_fa_run(self, c, sets, fwd, grads, deterministic):
        """run(i): flashattn.backward on set i (its forward's O and LSE in
        fwd[i]) into grads[i] = (dq, dk, dv)."""
        cfg, bwd, rt, stream = self.fa_config(c), self.fa.backward, self.rt, self.stream()
        dst = [tuple(self.dst(t) for t in g) for g in grads]

        def run(i):
            q, k, v, dout = sets[i]
            o, lse = fwd[i]
            dq, dk, dv = dst[i]
            bwd(rt, cfg, q, k, v, o, lse, dout, dq=dq, dk=dk, dv=dv, deterministic=deterministic,
                stream=stream)
            return grads[i]
        return run

    def make_sdpa_run(self, impl, c, sets):
        """run(i): torch.autograd.grad through SDPA's backward on set i, its
        forward (impl's backend forced) run here, once per set."""
        torch, F = self.torch, self.F
        backend = self.backends.get(impl)
        if self.sdpa_kernel is None or backend is None:
            raise RuntimeError("this torch has no %s" % ("sdpa_kernel" if self.sdpa_kernel is None
                                                         else "SDPBackend for " + impl))
        want = SDPA_NODES[impl] if self.device == "cuda" else None
        leaves, outs, douts = [], [], []
        for q, k, v, dout in sets:
            x = tuple(t.detach().requires_grad_() for t in (q, k, v))
            with self.sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in x),
                                                   is_causal=c.causal)
            node = type(o.grad_fn).__name__
            if want and not node.startswith(want):
                raise RuntimeError("SDPA recorded %s, not %s" % (node, want))
            self.nodes[impl] = node
            d = torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=o.device)
            d.copy_(dout.transpose(1, 2))  # dO in the strides of SDPA's O
            leaves.append(x)
            outs.append(o)
            douts.append(d)
        self.sync()

        def run(i):
            return torch.autograd.grad(outs[i], leaves[i], douts[i], retain_graph=True)
        return run

    def det_bitwise(self, c, sets, fwd):
        """Two deterministic backwards on set 0 into fresh buffers: the same
        bits? (Compared as 16-bit integers: a NaN is equal to itself.)"""
        torch = self.torch
        got = []
        for _ in range(2):
            grads = [tuple(torch.empty_like(t) for t in sets[0][:3])]
            got.append(self.make_fa_run(c, sets[:1], fwd[:1], grads, True)(0))
        self.sync()
        return all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(*got))

    def run_config(self, c, budget_left_s, predicted_ms=None):
        """One CSV row for config c (fa_backward's head dims only)."""
        a = self.args
        deadline = time.time() + budget_left_s
        row = config_row(c, a.sets, a.deterministic)
        sets = self.make_sets(c)
        refs, idx = self.reference_grads(c, *sets[0], common.reference_subset(
            c.batch, c.num_heads, c.seqlen))
        grads = [tuple(self.torch.empty_like(t) for t in s[:3]) for s in sets]
        state = {}

        def fa_maker(deterministic):
            def make():
                if "fwd" not in state:
                    state["fwd"] = self.fa_forward(c, sets)
                return self.make_fa_run(c, sets, state["fwd"], grads, deterministic)
            return make

        errs = {}
        for impl in measured_impls(a.deterministic):
            left = deadline - time.time()
            if impl in FA_IMPLS:
                if predicted_ms is not None and \
                        predicted_ms * (a.min_reps + a.warmup + 2) / 1e3 > left:
                    row[impl + "_status"] = "skipped"
                    row[impl + "_note"] = "time budget (predicted %.0f ms/run)" % predicted_ms
                    continue
                make, poison = fa_maker(impl == "flashattn_det"), grads[0]
            else:
                make, poison = (lambda impl=impl: self.make_sdpa_run(impl, c, sets)), ()
            errs[impl] = self.measure_backward(row, impl, make, poison, refs, idx, row["flops"],
                                               left)
        if errs.get("flashattn_det") is not None:
            try:
                row["det_bitwise"] = self.det_bitwise(c, sets, state["fwd"])
            except Exception as ex:
                row["flashattn_det_note"] = "; ".join(x for x in (
                    row.get("flashattn_det_note"), "bits check: " + common._reason(ex, [])) if x)
        row["tol_ok"], row["tol_note"] = judge_row(errs, row.get("det_bitwise"))
        return finish_row(row)


def run_bench(args):
    torch = common.import_torch_gpu("bench_backward")
    fa = common.import_flashattn()
    if not fa._lib.has_backward():
        raise SystemExit("bench_backward: the loaded library (%s) has no fa_backward (flashattn "
                         "0.9 or later)" % fa.library_path())
    t_start = time.time()
    bench = BackwardBench(torch, fa, args)
    gpu, info, date, meta = common.run_meta(torch, fa, bench, args)
    seqlens = tuple(int(s) for s in args.seqlens.split(","))
    head_dims = tuple(int(d) for d in args.head_dims.split(","))
    dtypes = tuple(args.dtypes.split(","))
    grid = backward_grid(dtypes, head_dims, seqlens)
    meta["grid"] = "dtypes %s, head_dims %s, seqlens %s, causal/not: %d configs" % (
        ",".join(dtypes), ",".join(map(str, head_dims)), ",".join(map(str, seqlens)), len(grid))
    skipped = [d for d in head_dims if d > BWD_MAX_HEAD_DIM]
    if skipped:
        meta["skipped"] = "head_dim %s: %s" % (",".join(map(str, skipped)), HEAD_DIM_SKIP)
    meta["deterministic"] = ("flashattn_det: deterministic=True, and two of its runs compared "
                             "bit for bit" if args.deterministic else "not measured (%s)" % NO_DET)
    meta["flops"] = "backward: 2.5 x 4 * b * h * s_q * s_k * d, halved for causal"
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, common.run_base(args, date.strftime("%Y-%m-%d"), gpu))
    print("bench_backward: %s (sm_%d, %d SMs), torch %s, CUDA %s, cuDNN %s, %d configs -> %s.*" % (
        gpu, info.sm, info.num_sms, torch.__version__, torch.version.cuda, meta["cudnn"],
        len(grid), base), flush=True)
    extra = []
    if args.tests_summary and os.path.exists(args.tests_summary):
        with open(args.tests_summary) as f:
            extra.append(("GPU tests (bench/run_gpu.sh)", f.read()))
    rows, last = [], {}
    deadline = time.time() + args.time_budget
    for n, c in enumerate(grid):
        t0 = time.time()
        left = deadline - t0
        prev = last.get(c.key)
        predicted = prev[1] * (c.seqlen / prev[0]) if prev else None
        if not runnable(c):
            row = skipped_row(c, args.sets, HEAD_DIM_SKIP, args.deterministic)
        elif left <= 0:
            row = skipped_row(c, args.sets, "time budget", args.deterministic)
        else:
            try:
                row = bench.run_config(c, left, predicted)
            except Exception as ex:  # e.g. out of memory building the sets or the reference
                row = skipped_row(c, args.sets, "", args.deterministic)
                for i in measured_impls(args.deterministic):
                    row[i + "_status"], row[i + "_note"] = "error", common._reason(ex, [])
        if row.get("flashattn_median_ms"):
            last[c.key] = (c.seqlen, row["flashattn_median_ms"])
        rows.append(row)
        print(progress_line(n + 1, len(grid), c, row, time.time() - t0), flush=True)
        meta["sdpa_backward_nodes"] = ", ".join("%s %s" % kv for kv in sorted(bench.nodes.items()))
        meta["wall_s"] = "%.0f" % (time.time() - t_start)
        write_results(base, meta, rows, extra)
        torch.cuda.empty_cache()
    title = "flashattn backward vs SDPA %s %s" % (gpu.replace("NVIDIA ", ""),
                                                  date.strftime("%Y-%m-%d"))
    meta["chart"] = os.path.basename(base) + ".png (%s)" % common.render_chart(
        rows, title, base + ".png", IMPLS, LABELS, COLORS)
    write_results(base, meta, rows, extra)
    print("\n" + markdown_table(rows))
    print("\n" + summary_table(issue30_summary(rows)))
    print(overall_line(rows))
    print("\nwrote %s.{csv,json,png,md} in %.0f s" % (base, time.time() - t_start))
    return 3 if any(r.get("tol_ok") is False for r in rows) else 0


def main(argv=None):
    """bench_sdpa.py's options with --backward implied."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return common.main(argv if "--backward" in argv else ["--backward"] + argv)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""flashattn forward vs PyTorch SDPA (flash and cuDNN backends) on one GPU.

    python3 bench/bench_sdpa.py [--quick] [--time-budget S] [--out-dir bench/results]

Times flashattn.forward on torch tensors against
torch.nn.functional.scaled_dot_product_attention with SDPBackend.FLASH_ATTENTION
and SDPBackend.CUDNN_ATTENTION forced, in one process on the same tensors
(SDPA gets [b, h, s, d] transpose views of the [b, s, h, d] tensors). Grid:
fp16/bf16 x head_dim 64/128/256 x causal/not x seqlen 512..16k, with
batch * seqlen = 16384 and num_heads * head_dim = 2048. Each config: error
vs an fp32 reference on a subset of batches/heads/rows, then CUDA-event
timing (warm-up, median of >= 20 runs, inputs rotated over several sets).
Also cold-start figures (PTX generation, driver JIT, warm disk cache,
in-process hit). Writes CSV, JSON sidecar, PNG and markdown under --out-dir.

--fp8: the fp8 forward (e4m3 Q/K/V, bf16 O) on the same shapes, in
bench_fp8.py (which shares this file's timing and correctness parts);
results named ...-sdpa-fp8.

--backward [--deterministic]: the training backward (fa_backward) against
SDPA's flash and cuDNN backwards on the same grid (head dims past 128
skipped), in bench_backward.py; results named ...-sdpa-backward.

Everything above the "GPU part" marker needs only the standard library (the
tests in bench/tests import it without torch); torch is imported in main().
"""

import argparse
import csv
import datetime
import json
import math
import os
import re
import statistics
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

TOKENS = 16384  # batch * seqlen
HIDDEN = 2048  # num_heads * head_dim
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128, 256)
DTYPES = ("fp16", "bf16")
IMPLS = ("flashattn", "sdpa_flash", "sdpa_cudnn")
SDPA_IMPLS = IMPLS[1:]
LABELS = {"flashattn": "flashattn", "sdpa_flash": "SDPA flash", "sdpa_cudnn": "SDPA cuDNN"}
COLORS = {"flashattn": (214, 39, 40), "sdpa_flash": (31, 119, 180), "sdpa_cudnn": (44, 160, 44)}
REL_ERR_LIMIT = 1e-2  # design.md: relative error < 1e-2 for fp16/bf16
ERR_FACTOR = 2.0  # design.md: no worse than twice PyTorch's error at the same dtype


# ---- configs and arithmetic --------------------------------------------------

def attention_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal):
    """4 * batch * heads * seqlen_q * seqlen_k * head_dim (two matmuls of
    2 flops per multiply-add), halved for causal (design.md)."""
    f = 4 * batch * heads * seqlen_q * seqlen_k * head_dim
    return f // 2 if causal else f


@dataclass(frozen=True)
class BenchConfig:
    dtype: str
    head_dim: int
    causal: bool
    seqlen: int
    batch: int
    num_heads: int

    @property
    def flops(self):
        return attention_flops(self.batch, self.num_heads, self.seqlen, self.seqlen,
                               self.head_dim, self.causal)

    @property
    def key(self):
        """The kernel family (what one flashattn kernel covers)."""
        return (self.dtype, self.head_dim, self.causal)

    def describe(self):
        return "%s d%d %s s%d b%d h%d" % (self.dtype, self.head_dim,
                                          "causal" if self.causal else "full",
                                          self.seqlen, self.batch, self.num_heads)


def config_grid(dtypes=DTYPES, head_dims=HEAD_DIMS, causals=(False, True), seqlens=SEQLENS,
                tokens=TOKENS, hidden=HIDDEN):
    """Every config, seqlen outermost (so a time budget cuts the longest
    sequences first, never a whole dtype or head_dim)."""
    out = []
    for s in seqlens:
        if tokens % s or s <= 0:
            raise ValueError("seqlen %d does not divide %d tokens" % (s, tokens))
        for dt in dtypes:
            for d in head_dims:
                if hidden % d:
                    raise ValueError("head_dim %d does not divide %d" % (d, hidden))
                for c in causals:
                    out.append(BenchConfig(dt, d, bool(c), s, tokens // s, hidden // d))
    return out


def tflops(flops, ms):
    """TFLOP/s for `flops` done in `ms` milliseconds; None if unknown."""
    if ms is None or not ms > 0 or flops is None:
        return None
    return flops / (ms * 1e-3) / 1e12


def ratio(a, b):
    """a / b (e.g. flashattn TFLOP/s over an SDPA backend's); None if either is
    missing or b is not positive."""
    if a is None or b is None or not b > 0:
        return None
    return a / b


def median(values):
    vals = [v for v in values if v is not None]
    if not vals:
        raise ValueError("median of no values")
    return statistics.median(vals)


class Rotation:
    """Round-robin over n_sets input sets: next() gives the set for the next
    run, record() stores that run's time. Keeps per-set samples so the
    report can show every set was used equally."""

    def __init__(self, n_sets):
        if n_sets < 1:
            raise ValueError("n_sets must be >= 1")
        self.n_sets = n_sets
        self._i = 0
        self.samples = []  # (set index, ms) in run order

    def next(self):
        idx = self._i % self.n_sets
        self._i += 1
        return idx

    def record(self, idx, ms):
        if not 0 <= idx < self.n_sets:
            raise ValueError("set index %d outside [0, %d)" % (idx, self.n_sets))
        self.samples.append((idx, float(ms)))

    def times(self):
        return [ms for _, ms in self.samples]

    def counts(self):
        c = [0] * self.n_sets
        for idx, _ in self.samples:
            c[idx] += 1
        return c

    def balanced(self):
        """Every set used, counts differing by at most one."""
        c = self.counts()
        return min(c) > 0 and max(c) - min(c) <= 1

    def per_set_median(self):
        return [median([ms for i, ms in self.samples if i == s]) if n else None
                for s, n in enumerate(self.counts())]

    def median(self):
        return median(self.times())

    def summary(self):
        t = sorted(self.times())
        return {"median_ms": median(t), "min_ms": t[0], "max_ms": t[-1], "reps": len(t)}


def choose_reps(est_ms, target_ms, min_reps=20, max_reps=100):
    """Runs to time: enough for target_ms of work, clamped to [min_reps, max_reps]."""
    if est_ms is None or not est_ms > 0:
        return min_reps
    return int(max(min_reps, min(max_reps, math.ceil(target_ms / est_ms))))


def judge_tolerance(fa_err, sdpa_errs, rel_limit=REL_ERR_LIMIT, factor=ERR_FACTOR,
                    baseline_err=None, baseline_name="SDPA"):
    """(ok, note) for flashattn's error against the fp32 reference.

    fa_err and each sdpa_errs value are (max_abs, rel) or None. The baseline
    is the smallest max_abs among the SDPA backends that ran (else
    baseline_err, PyTorch's same-dtype math on the subset). Fails on NaN,
    max_abs > factor * baseline, or rel > rel_limit. ok is None when
    flashattn produced no output. baseline_name names sdpa_errs' source in
    the note (--fp8: FlashAttention-3's fp8)."""
    if fa_err is None:
        return None, "no flashattn output"
    fa_abs, fa_rel = fa_err
    if fa_abs is None or fa_rel is None or math.isnan(fa_abs) or math.isnan(fa_rel) \
            or math.isinf(fa_abs) or math.isinf(fa_rel):
        return False, "non-finite error"
    base = [e[0] for e in sdpa_errs.values() if e is not None and e[0] is not None
            and math.isfinite(e[0])]
    if base:
        ref_abs, src = min(base), baseline_name
    elif baseline_err is not None:
        ref_abs, src = baseline_err, "torch math"
    else:
        ref_abs, src = None, None
    notes = []
    if fa_rel > rel_limit:
        notes.append("rel err %.3g > %.0e" % (fa_rel, rel_limit))
    if ref_abs is not None and fa_abs > factor * ref_abs:
        notes.append("max err %.3g > %gx %s's %.3g" % (fa_abs, factor, src, ref_abs))
    if notes:
        return False, "; ".join(notes)
    if ref_abs is None:
        return True, "rel err only (no PyTorch baseline)"
    return True, ""


def reference_subset(batch, heads, seqlen, max_batches=2, max_heads=4, max_rows=2048):
    """Indices (batches, heads, query rows) the fp32 reference is computed on:
    bounded so its score matrix stays small at any seqlen. Rows are evenly
    spread and include the first and last query."""
    def spread(n, k):
        if n <= k:
            return list(range(n))
        return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})
    return spread(batch, max_batches), spread(heads, max_heads), spread(seqlen, max_rows)


def slug(text):
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3' (file-name safe)."""
    s = text.lower().replace("nvidia", " ")
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "unknown-gpu"


def result_base(date, gpu_name, fp8=False, backward=False):
    """The result files' base name; --fp8 runs are ...-sdpa-fp8, --backward
    runs ...-sdpa-backward."""
    return "%s-%s-sdpa%s%s" % (date, slug(gpu_name), "-fp8" if fp8 else "",
                               "-backward" if backward else "")


def run_base(args, date, gpu_name):
    """The base name a run with these options writes (the run and
    --print-base-name both take it from here)."""
    return result_base(date, gpu_name, args.fp8, args.backward)


# ---- CSV -----------------------------------------------------------------------

CONFIG_FIELDS = ["dtype", "head_dim", "causal", "seqlen", "batch", "num_heads", "flops"]
IMPL_FIELDS = ["status", "note", "median_ms", "min_ms", "max_ms", "reps", "tflops",
               "max_err", "rel_err"]
TAIL_FIELDS = ["ratio_vs_sdpa_flash", "ratio_vs_sdpa_cudnn", "sdpa_baseline_err", "tol_ok",
               "tol_note", "n_sets"]
FIELDS = CONFIG_FIELDS + ["%s_%s" % (i, f) for i in IMPLS for f in IMPL_FIELDS] + TAIL_FIELDS
_INT_FIELDS = {"head_dim", "seqlen", "batch", "num_heads", "flops", "n_sets"} | {
    "%s_reps" % i for i in IMPLS}
_FLOAT_SUFFIXES = ("_ms", "tflops", "_err", "ratio_vs_sdpa_flash", "ratio_vs_sdpa_cudnn")


def _fmt(v):
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def calibrate_sleep(torch):
    """GPU cycles per ms of torch.cuda._sleep (None without it): timed once
    with CUDA events."""
    if not hasattr(torch.cuda, "_sleep"):
        return None
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    s.record()
    torch.cuda._sleep(2_000_000)
    e.record()
    e.synchronize()
    ms = s.elapsed_time(e)
    return 2_000_000 / ms if ms > 0 else None


def write_csv(path, rows, meta, fields=None):
    """rows: dicts keyed by fields (default FIELDS; missing = empty). meta:
    dict written first as '# key: value' lines."""
    fields = FIELDS if fields is None else fields
    with open(path, "w", newline="") as f:
        for k, v in meta.items():
            f.write("# %s: %s\n" % (k, str(v).replace("\n", " ")))
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            unknown = set(r) - set(fields)
            if unknown:
                raise ValueError("unknown CSV fields %s" % sorted(unknown))
            w.writerow({k: _fmt(r.get(k)) for k in fields})


def csv_parser(int_fields, float_suffixes):
    """A CSV cell parser: "" -> None, causal/tol_ok -> bool, int_fields ->
    int, fields ending in float_suffixes -> float, else the text."""
    def parse(field, text):
        if text == "":
            return None
        if field in ("causal", "tol_ok"):
            return text == "1"
        if field in int_fields:
            return int(text)
        if field.endswith(float_suffixes):
            return float(text)
        return text
    return parse


_parse = csv_parser(_INT_FIELDS, _FLOAT_SUFFIXES)


def read_csv(path, parse=None):
    """(meta, rows) as written by write_csv, with numbers parsed back by
    parse(field, text) (default: this benchmark's fields)."""
    parse = _parse if parse is None else parse
    meta, lines = {}, []
    with open(path, newline="") as f:
        for line in f:
            if line.startswith("# ") and not lines:
                k, _, v = line[2:].rstrip("\n").partition(": ")
                meta[k] = v
            else:
                lines.append(line)
    rows = [{k: parse(k, v) for k, v in r.items()} for r in csv.DictReader(lines)]
    return meta, rows


# ---- PNG (standard library only) -------------------------------------------------

def png_bytes(width, height, rgb):
    """An 8-bit RGB PNG of rgb (bytes, row-major, 3 per pixel)."""
    if len(rgb) != width * height * 3:
        raise ValueError("pixel buffer is %d bytes, want %d" % (len(rgb), width * height * 3))

    def chunk(tag, data):
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    stride = width * 3
    raw = bytearray()
    for y in range(height):
        raw.append(0)  # filter: none
        raw += rgb[y * stride:(y + 1) * stride]
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(raw), 9))
            + chunk(b"IEND", b""))


# 5x7 glyphs ('#' = ink), our own drawing; text is drawn upper-case.
_GLYPHS = {
    "A": ".###. #...# #...# ##### #...# #...# #...#",
    "B": "####. #...# #...# ####. #...# #...# ####.",
    "C": ".###. #...# #.... #.... #.... #...# .###.",
    "D": "####. #...# #...# #...# #...# #...# ####.",
    "E": "##### #.... #.... ####. #.... #.... #####",
    "F": "##### #.... #.... ####. #.... #.... #....",
    "G": ".###. #...# #.... #.### #...# #...# .####",
    "H": "#...# #...# #...# ##### #...# #...# #...#",
    "I": ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###.",
    "J": "..### ...#. ...#. ...#. ...#. #..#. .##..",
    "K": "#...# #..#. #.#.. ##... #.#.. #..#. #...#",
    "L": "#.... #.... #.... #.... #.... #.... #####",
    "M": "#...# ##.## #.#.# #.#.# #...# #...# #...#",
    "N": "#...# #...# ##..# #.#.# #..## #...# #...#",
    "O": ".###. #...# #...# #...# #...# #...# .###.",
    "P": "####. #...# #...# ####. #.... #.... #....",
    "Q": ".###. #...# #...# #...# #.#.# #..#. .##.#",
    "R": "####. #...# #...# ####. #.#.. #..#. #...#",
    "S": ".#### #.... #.... .###. ....# ....# ####.",
    "T": "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    "U": "#...# #...# #...# #...# #...# #...# .###.",
    "V": "#...# #...# #...# #...# #...# .#.#. ..#..",
    "W": "#...# #...# #...# #.#.# #.#.# #.#.# .#.#.",
    "X": "#...# #...# .#.#. ..#.. .#.#. #...# #...#",
    "Y": "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#..",
    "Z": "##### ....# ...#. ..#.. .#... #.... #####",
    "0": ".###. #...# #..## #.#.# ##..# #...# .###.",
    "1": "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2": ".###. #...# ....# ...#. ..#.. .#... #####",
    "3": "##### ...#. ..#.. ...#. ....# #...# .###.",
    "4": "...#. ..##. .#.#. #..#. ##### ...#. ...#.",
    "5": "##### #.... ####. ....# ....# #...# .###.",
    "6": "..##. .#... #.... ####. #...# #...# .###.",
    "7": "##### ....# ...#. ..#.. .#... .#... .#...",
    "8": ".###. #...# #...# .###. #...# #...# .###.",
    "9": ".###. #...# #...# .#### ....# ...#. .##..",
    " ": "..... ..... ..... ..... ..... ..... .....",
    ".": "..... ..... ..... ..... ..... .##.. .##..",
    ",": "..... ..... ..... ..... .##.. ..#.. .#...",
    ":": "..... .##.. .##.. ..... .##.. .##.. .....",
    "/": "..... ....# ...#. ..#.. .#... #.... .....",
    "-": "..... ..... ..... ##### ..... ..... .....",
    "_": "..... ..... ..... ..... ..... ..... #####",
    "(": "...#. ..#.. .#... .#... .#... ..#.. ...#.",
    ")": ".#... ..#.. ...#. ...#. ...#. ..#.. .#...",
    "%": "##... ##..# ...#. ..#.. .#... #..## ...##",
    "=": "..... ..... ##### ..... ##### ..... .....",
    "+": "..... ..#.. ..#.. ##### ..#.. ..#.. .....",
    "?": ".###. #...# ....# ...#. ..#.. ..... ..#..",
}
GLYPH_W, GLYPH_H = 5, 7


class Canvas:
    """An RGB raster with rectangles, lines and 5x7 bitmap text."""

    def __init__(self, width, height, bg=(255, 255, 255)):
        self.w, self.h = width, height
        self.px = bytearray(bytes(bg) * (width * height))

    def rect(self, x0, y0, x1, y1, color):
        """Fills [x0, x1) x [y0, y1), clipped."""
        x0, x1 = max(0, int(x0)), min(self.w, int(x1))
        y0, y1 = max(0, int(y0)), min(self.h, int(y1))
        if x0 >= x1 or y0 >= y1:
            return
        row = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            o = (y * self.w + x0) * 3
            self.px[o:o + len(row)] = row

    def pixel(self, x, y):
        o = (y * self.w + x) * 3
        return tuple(self.px[o:o + 3])

    def text(self, x, y, s, color=(0, 0, 0), scale=1):
        """Draws s with its top-left at (x, y); returns the width drawn."""
        cx = x
        for ch in s.upper():
            g = _GLYPHS.get(ch, _GLYPHS["?"])
            for ry, row in enumerate(g.split()):
                for rx, c in enumerate(row):
                    if c == "#":
                        self.rect(cx + rx * scale, y + ry * scale, cx + (rx + 1) * scale,
                                  y + (ry + 1) * scale, color)
            cx += (GLYPH_W + 1) * scale
        return cx - x

    @staticmethod
    def text_width(s, scale=1):
        return len(s) * (GLYPH_W + 1) * scale

    def png(self):
        return png_bytes(self.w, self.h, bytes(self.px))


def _nice_step(vmax, ticks=5):
    if vmax <= 0:
        return 1.0
    raw = vmax / ticks
    p = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * p >= raw:
            return m * p
    return 10 * p


def _panels(rows, impls=IMPLS):
    """[(title, [(group label lines, {impl: tflops or None})])] per (dtype, causal)."""
    order = []
    groups = {}
    for r in rows:
        key = (r["dtype"], bool(r["causal"]))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(r)
    out = []
    for key in order:
        rs = sorted(groups[key], key=lambda r: (r["head_dim"], r["seqlen"]))
        items = []
        for r in rs:
            s = r["seqlen"]
            label = ("D%d" % r["head_dim"], "%dK" % (s // 1024) if s >= 1024 else str(s))
            items.append((label, {i: r.get("%s_tflops" % i) for i in impls}))
        out.append(("%s %s" % (key[0], "causal" if key[1] else "non-causal"), items))
    return out


def render_chart_png(rows, title, path=None, impls=IMPLS, labels=LABELS, colors=COLORS):
    """A grouped bar chart (TFLOP/s per config, one bar per implementation
    of impls), one panel per (dtype, causal), drawn with the stdlib only.
    Returns the PNG bytes and writes them to path if given."""
    panels = _panels(rows, impls)
    bar, gap, left, right = 9, 9, 56, 16
    ngroups = max([len(items) for _, items in panels] or [1])
    width = left + right + ngroups * (len(impls) * bar + gap)
    width = max(width, 460)
    plot_h, panel_h, top = 170, 170 + 56, 44
    height = top + max(1, len(panels)) * panel_h + 10
    c = Canvas(width, height)
    c.text(8, 8, title[: (width - 16) // 12], scale=2)
    lx = 8
    for impl in impls:  # legend
        c.rect(lx, 28, lx + 10, 38, colors[impl])
        lx += 14 + c.text(lx + 14, 30, labels[impl]) + 10
    c.text(lx + 6, 30, "Y: TFLOP/S   -: N/A OR SKIPPED", color=(90, 90, 90))
    for p, (ptitle, items) in enumerate(panels):
        y0 = top + p * panel_h + 14
        base = y0 + plot_h
        vals = [v for _, d in items for v in d.values() if v is not None]
        step = _nice_step(max(vals) if vals else 1.0)
        vmax = step * max(1, math.ceil((max(vals) if vals else 1.0) / step))
        c.text(left, y0 - 12, ptitle)
        k = 0
        while k * step <= vmax + 1e-9:  # grid and y labels
            y = base - int(round(k * step / vmax * plot_h))
            c.rect(left, y, width - right, y + 1, (225, 225, 225))
            lab = ("%g" % (k * step))[:7]
            c.text(left - 4 - c.text_width(lab), y - 3, lab, color=(60, 60, 60))
            k += 1
        c.rect(left, y0, left + 1, base + 1, (0, 0, 0))
        c.rect(left, base, width - right, base + 1, (0, 0, 0))
        for g, (label, d) in enumerate(items):
            gx = left + gap // 2 + g * (len(impls) * bar + gap)
            for b, impl in enumerate(impls):
                v = d.get(impl)
                x = gx + b * bar
                if v is None:
                    c.text(x + 1, base - 9, "-", color=colors[impl])
                    continue
                hgt = max(1, int(round(v / vmax * plot_h)))
                c.rect(x, base - hgt, x + bar - 1, base, colors[impl])
            for li, line in enumerate(label):
                c.text(gx, base + 4 + li * 9, line, color=(40, 40, 40))
    data = c.png()
    if path:
        with open(path, "wb") as f:
            f.write(data)
    return data


def render_chart(rows, title, path, impls=IMPLS, labels=LABELS, colors=COLORS):
    """matplotlib when importable, else the stdlib renderer (bars for impls,
    the forward's contenders by default). Returns which."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        render_chart_png(rows, title, path, impls, labels, colors)
        return "stdlib"
    panels = _panels(rows, impls)
    fig, axes = plt.subplots(len(panels), 1, figsize=(14, 3.2 * len(panels) + 1), squeeze=False)
    for ax, (ptitle, items) in zip(axes[:, 0], panels):
        n = len(items)
        w = 0.8 / len(impls)
        for b, impl in enumerate(impls):
            xs = [g + (b - (len(impls) - 1) / 2) * w for g in range(n)]
            ys = [d.get(impl) or 0.0 for _, d in items]
            ax.bar(xs, ys, w, label=labels[impl],
                   color=tuple(ch / 255 for ch in colors[impl]))
        ax.set_xticks(range(n))
        ax.set_xticklabels(["%s\n%s" % lab for lab, _ in items], fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(ptitle, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "matplotlib"


# ---- markdown ----------------------------------------------------------------------

def _f(v, fmt="%.1f", none="n/a"):
    return none if v is None else fmt % v


def impl_cell(row, impl):
    """TFLOP/s, or the status and reason when there is no figure."""
    t = row.get("%s_tflops" % impl)
    if t is not None:
        return "%.1f" % t
    st = row.get("%s_status" % impl) or "n/a"
    note = (row.get("%s_note" % impl) or "").replace("|", "/")
    return "%s (%s)" % (st, note[:60]) if note else st


def markdown_table(rows):
    head = ("| dtype | d | causal | seqlen | batch x heads | GFLOP | flashattn | SDPA flash | "
            "SDPA cuDNN | fa/flash | fa/cuDNN | fa err max / rel | SDPA err max | tol |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        sd = [r.get("%s_max_err" % i) for i in SDPA_IMPLS]
        sd = [e for e in sd if e is not None]
        tol = {True: "ok", False: "**FAIL**", None: "-"}[r.get("tol_ok")]
        if r.get("tol_note"):
            tol += " " + r["tol_note"].replace("|", "/")
        lines.append("| %s | %d | %s | %d | %d x %d | %.1f | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["dtype"], r["head_dim"], "yes" if r["causal"] else "no", r["seqlen"], r["batch"],
            r["num_heads"], r["flops"] / 1e9, impl_cell(r, "flashattn"),
            impl_cell(r, "sdpa_flash"), impl_cell(r, "sdpa_cudnn"),
            _f(r.get("ratio_vs_sdpa_flash"), "%.3f"), _f(r.get("ratio_vs_sdpa_cudnn"), "%.3f"),
            "%s / %s" % (_f(r.get("flashattn_max_err"), "%.2e"), _f(r.get("flashattn_rel_err"), "%.2e")),
            _f(min(sd) if sd else r.get("sdpa_baseline_err"), "%.2e"), tol))
    return "\n".join(lines)


def coldstart_table(entries):
    head = ("| kernel | PTX gen us (median) | cold first launch ms (empty disk cache) | "
            "warm launch ms | cold - warm ms | cold first launch ms (memory cache, no store "
            "write) | driver JIT ~ that - warm - gen ms | warm-disk first launch ms (new "
            "process, driver JIT cache off) | disk-hit overhead ms | warm-disk first launch ms "
            "(driver JIT cache on, warmed) | warm-disk first launch ms, PTX compiler plugin off "
            "(driver JIT cache off) | in-process hit first launch ms | compiler | note |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for e in entries:
        cold, warm, disk, mem, cmem, ddc, djit = (e.get(k) for k in (
            "cold_first_ms", "warm_ms", "disk_first_ms", "inproc_first_ms", "cold_mem_first_ms",
            "disk_drvcache_first_ms", "disk_jit_first_ms"))
        gen_us = e.get("gen_us")
        d = None if cold is None or warm is None else cold - warm
        jit = None if cmem is None or warm is None or gen_us is None else cmem - warm - gen_us / 1000
        dd = None if disk is None or warm is None else disk - warm
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            e["kernel"], _f(gen_us), _f(cold, "%.2f"), _f(warm, "%.3f"), _f(d, "%.2f"),
            _f(cmem, "%.2f"), _f(jit, "%.2f"), _f(disk, "%.2f"), _f(dd, "%.2f"), _f(ddc, "%.2f"),
            _f(djit, "%.2f"), _f(mem, "%.3f"),
            ("%s %s" % (e.get("compiler_mode", ""), e.get("compiler", ""))).strip().replace("|", "/"),
            (e.get("note") or "").replace("|", "/")))
    return "\n".join(lines)


def write_markdown(path, meta, rows, coldstart, extra_sections=()):
    out = ["# flashattn forward vs PyTorch SDPA: %s, %s" % (meta.get("gpu", "?"), meta.get("date", "?")),
           ""]
    for k in ("commit", "gpu", "sm", "driver", "torch", "cuda", "cudnn", "flashattn_library",
              "flashattn_version", "ptx_compiler", "date", "n_sets", "min_reps", "grid", "chart"):
        if k in meta:
            out.append("- %s: %s" % (k, meta[k]))
    out += ["",
            "FLOPs = 4 * batch * heads * seqlen_q * seqlen_k * head_dim, halved for causal. "
            "batch * seqlen = %d, heads * head_dim = %d. Figures are TFLOP/s from the median of "
            "CUDA-event times (warm-up first; inputs rotated over several sets). Ratios are "
            "flashattn / SDPA backend. Errors are vs an fp32 reference on a subset of "
            "batches/heads/rows; tol fails when flashattn's max error exceeds %gx the best SDPA "
            "backend's on the same subset or its relative error exceeds %g." % (
                TOKENS, HIDDEN, ERR_FACTOR, REL_ERR_LIMIT),
            "", markdown_table(rows), ""]
    fails = [r for r in rows if r.get("tol_ok") is False]
    out.append("Out of tolerance: %s" % (", ".join(
        "%s d%d %s s%d" % (r["dtype"], r["head_dim"], "causal" if r["causal"] else "full",
                            r["seqlen"]) for r in fails) if fails else "none"))
    out += ["", "## Cold start", "", coldstart_table(coldstart) if coldstart else "(not measured)",
            ""]
    for title, body in extra_sections:
        out += ["## %s" % title, "", "```", body.rstrip(), "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


# ---- environment ---------------------------------------------------------------------

def _run(cmd, timeout=20, cwd=None):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        return p.stdout.strip() if p.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit():
    # The commit the carried build was packed from (bench/run_gpu.sh --pack
    # writes it; a device machine's copy of .git may be older than its tree).
    packed = os.environ.get("FLASHATTN_BUILD_COMMIT")
    if packed:
        return packed
    rev = _run(["git", "rev-parse", "HEAD"], cwd=ROOT)
    if rev is None:
        return "unknown"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT)
    return rev + (" (+ uncommitted changes)" if dirty else "")


def nvidia_smi():
    """(name, driver version) from nvidia-smi, or (None, None)."""
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if not out:
        return None, None
    name, _, drv = out.splitlines()[0].rpartition(",")
    return name.strip(), drv.strip()


def library_path():
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        return env
    for d in ("build-gpu", "build"):
        p = os.path.join(ROOT, d, "libflashattn.so.0")
        if os.path.exists(p):
            return p
    return None


def import_flashattn():
    """The Python binding from bindings/python (or $FLASHATTN_PYTHON_DIR),
    loading FLASHATTN_LIBRARY or build/libflashattn.so.0."""
    lib = library_path()
    if lib is None:
        raise SystemExit("bench_sdpa: no library: set FLASHATTN_LIBRARY or build build/libflashattn.so.0")
    os.environ["FLASHATTN_LIBRARY"] = lib
    # FLASHATTN_PYTHON_DIR: another version's binding, for its library.
    sys.path.insert(0, os.environ.get("FLASHATTN_PYTHON_DIR") or os.path.join(ROOT, "bindings", "python"))
    import flashattn as fa
    fa.load_library()
    return fa


# ======================================================================================
# GPU part: everything below needs torch (except the cold-start child, which
# needs only numpy and the binding).
# ======================================================================================

def coldstart_child(spec, cache_dir, mode="disk"):
    """Runs in a fresh process: first launch on cache_dir, warm launches, and a
    first launch through a new Config (in-process hit). Prints JSON."""
    import numpy as np
    fa = import_flashattn()
    dtype, d, causal = spec.split(":")
    d, causal = int(d), causal == "1"
    # The environment overrides exist to test this path on the emulator.
    B, S, H = 1, int(os.environ.get("FA_BENCH_COLDSTART_SEQLEN", 1024)), HIDDEN // int(d)
    if "FA_BENCH_COLDSTART_HEADS" in os.environ:
        H = int(os.environ["FA_BENCH_COLDSTART_HEADS"])
    res = {}
    t0 = time.perf_counter()
    rt = fa.Runtime(backend=os.environ.get("FA_BENCH_COLDSTART_BACKEND", "cuda"), cache=mode,
                    cache_dir=cache_dir)
    res["runtime_create_ms"] = (time.perf_counter() - t0) * 1e3
    with rt:
        g = np.random.default_rng(1)
        q, k, v = (rt.upload(g.standard_normal((B, S, H, d)).astype(np.float32), dtype=dtype)
                   for _ in range(3))
        o = rt.empty((B, S, H, d), dtype)
        cfg = fa.Config(dtype=dtype, head_dim=d, num_heads_q=H, causal=causal)
        rt.synchronize()
        s0 = rt.cache_stats()

        def launch(c):
            t = time.perf_counter()
            fa.forward(rt, c, q, k, v, out=o)
            rt.synchronize()
            return (time.perf_counter() - t) * 1e3

        res["first_ms"] = launch(cfg)
        s1 = rt.cache_stats()
        res["warm_ms"] = median([launch(cfg) for _ in range(15)])
        cfg2 = fa.Config(dtype=dtype, head_dim=d, num_heads_q=H, causal=causal)
        res["inproc_first_ms"] = launch(cfg2)
        s2 = rt.cache_stats()
        res["first_stats"] = {k2: getattr(s1, k2) - getattr(s0, k2)
                              for k2 in ("memory_hits", "disk_hits", "misses", "compiles")}
        res["inproc_stats"] = {k2: getattr(s2, k2) - getattr(s1, k2) - (15 if k2 == "memory_hits" else 0)
                               for k2 in ("memory_hits", "disk_hits", "misses", "compiles")}
        res["persistent"] = s2.persistent
        res["sm"] = rt.info.sm
        res["compiler_mode"] = s2.compiler_mode
        res["compiler"] = s2.compiler
        res["cubin_refusals"] = s2.cubin_refusals
    print("COLDSTART " + json.dumps(res))


def _child(spec, cache_dir, mode="disk", driver_cache=None, ptx_compiler=None):
    """One cold-start child; the driver's JIT cache is off unless
    driver_cache names a directory for it (CUDA_CACHE_PATH). ptx_compiler
    sets FLASHATTN_PTX_COMPILER ("off": the driver-JIT path)."""
    env = dict(os.environ, CUDA_CACHE_DISABLE="1", FLASHATTN_CACHE_DIR=cache_dir)
    if ptx_compiler is not None:
        env["FLASHATTN_PTX_COMPILER"] = ptx_compiler
    if driver_cache:
        env.update(CUDA_CACHE_DISABLE="0", CUDA_CACHE_PATH=driver_cache)
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--coldstart-child", spec,
                        "--cache-dir", cache_dir, "--cache-mode", mode], capture_output=True,
                       text=True, env=env, timeout=300)
    for line in p.stdout.splitlines():
        if line.startswith("COLDSTART "):
            return json.loads(line[len("COLDSTART "):]), None
    return None, (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1][:200]


def measure_coldstart(fa, sm, specs=("fp16:64:0", "fp16:128:0", "bf16:128:1", "fp16:256:0"),
                      gen_runs=50):
    """PTX generation (in process) and driver-JIT / warm-disk / in-process-hit
    first launches (fresh subprocesses, driver JIT cache off)."""
    import tempfile
    out = []
    for spec in specs:
        dtype, d, causal = spec.split(":")
        d = int(d)
        e = {"kernel": "forward %s d%d %s (s1024 h%d)" % (dtype, d, "causal" if causal == "1" else "full",
                                                          HIDDEN // d)}
        cfg = fa.Config(dtype=dtype, head_dim=d, num_heads_q=HIDDEN // d, causal=causal == "1")
        ts = []
        for _ in range(gen_runs):
            t = time.perf_counter()
            fa.generate(cfg, "forward", sm)
            ts.append((time.perf_counter() - t) * 1e6)
        e["gen_us"] = median(ts)
        with tempfile.TemporaryDirectory(prefix="fa-coldstart-") as tmp:
            cold, err = _child(spec, tmp)
            if cold is None:
                e["note"] = "cold child failed: " + err
                out.append(e)
                print("  cold start %s: %s" % (spec, e["note"]), flush=True)
                continue
            warm, err2 = _child(spec, tmp)
            # The same warm disk cache with the driver's JIT cache on: the
            # first child fills it, the second is what a restarted server sees.
            _child(spec, tmp, driver_cache=os.path.join(tmp, "nv"))
            warm_dc, _ = _child(spec, tmp, driver_cache=os.path.join(tmp, "nv"))
        with tempfile.TemporaryDirectory(prefix="fa-coldstart-") as tmp:
            mem, err3 = _child(spec, tmp, "memory")
        # A cold and a warm-disk child with the PTX compiler plugin off (rows
        # hold PTX only: every first launch in a process is a driver JIT).
        with tempfile.TemporaryDirectory(prefix="fa-coldstart-") as tmp:
            _child(spec, tmp, ptx_compiler="off")
            warm_jit, _ = _child(spec, tmp, ptx_compiler="off")
        if warm_dc is not None:
            e["disk_drvcache_first_ms"] = warm_dc["first_ms"]
        if warm_jit is not None:
            e["disk_jit_first_ms"] = warm_jit["first_ms"]
        e["compiler_mode"] = cold.get("compiler_mode", "?")
        e["compiler"] = cold.get("compiler", "")
        e["cold_first_ms"] = cold["first_ms"]
        e["warm_ms"] = cold["warm_ms"]
        e["inproc_first_ms"] = cold["inproc_first_ms"]
        e["runtime_create_ms"] = cold["runtime_create_ms"]
        notes = ["runtime create %.0f ms" % cold["runtime_create_ms"]]
        if warm is not None and warm.get("cubin_refusals"):
            notes.append("the driver refused %d cubin(s)" % warm["cubin_refusals"])
        if cold["first_stats"].get("compiles", 0) < 1:
            notes.append("cold launch did not compile?")
        if cold["inproc_stats"].get("memory_hits", 0) < 1:
            notes.append("in-process launch not a memory hit")
        if mem is None:
            notes.append("memory-cache child failed: " + err3)
        else:
            e["cold_mem_first_ms"] = mem["first_ms"]
        if warm is None:
            notes.append("warm child failed: " + err2)
        else:
            e["disk_first_ms"] = warm["first_ms"]
            if warm["first_stats"].get("disk_hits", 0) < 1:
                notes.append("warm-disk launch not a disk hit (%s)" % warm["first_stats"])
            if not warm.get("persistent"):
                notes.append("cache not persistent")
        e["note"] = "; ".join(notes)
        print("  cold start %-40s gen %.0f us, cold %.1f ms, disk %s ms, in-proc %.3f ms, warm %.3f ms"
              % (e["kernel"], e["gen_us"], e["cold_first_ms"], _f(e.get("disk_first_ms"), "%.2f"),
                 e["inproc_first_ms"], e["warm_ms"]), flush=True)
        out.append(e)
    return out


class GpuBench:
    """The timed comparison on one GPU (torch imported by the caller)."""

    def __init__(self, torch, fa, args, backend="cuda"):
        """backend: the flashattn Runtime's ("emulator" for a CPU self-test:
        no sleep hold then)."""
        self.torch, self.fa, self.args = torch, fa, args
        import torch.nn.functional as F
        self.F = F
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            self.sdpa_kernel = sdpa_kernel
            self.backends = {"sdpa_flash": getattr(SDPBackend, "FLASH_ATTENTION", None),
                             "sdpa_cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None)}
        except ImportError:
            self.sdpa_kernel, self.backends = None, {}
        self.rt = fa.Runtime(backend=backend, cache="memory")
        self.sm = self.rt.info.sm
        self.cycles_per_ms = calibrate_sleep(self.torch) if backend == "cuda" else None
        self.configs = {}

    def fa_config(self, c):
        key = c.key
        if key not in self.configs:
            self.configs[key] = self.fa.Config(dtype=c.dtype, head_dim=c.head_dim,
                                               num_heads_q=c.num_heads, causal=c.causal)
        return self.configs[key]

    def make_call(self, impl, c, sets, outs):
        """A function run(i) that launches impl on input set i."""
        torch, F = self.torch, self.F
        if impl == "flashattn":
            cfg = self.fa_config(c)
            stream = torch.cuda.current_stream()
            fwd = self.fa.forward

            def run(i):
                q, k, v = sets[i]
                fwd(self.rt, cfg, q, k, v, out=outs[i], stream=stream)
                return outs[i]
            return run
        backend = self.backends.get(impl)
        if self.sdpa_kernel is None or backend is None:
            raise RuntimeError("this torch has no %s" % ("sdpa_kernel" if self.sdpa_kernel is None
                                                         else "SDPBackend for " + impl))
        views = [tuple(x.transpose(1, 2) for x in s) for s in sets]  # [b, h, s, d] views
        sdpa_kernel = self.sdpa_kernel

        def run(i):
            q, k, v = views[i]
            with sdpa_kernel(backend):  # a fresh context manager per call (not re-entrant)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=c.causal)
            return o.transpose(1, 2)  # back to [b, s, h, d]
        return run

    def reference(self, c, q, k, v, subset):
        """fp32 reference on the subset: [nb, nrows, nh, d]."""
        torch = self.torch
        bs, hs, rows = (torch.tensor(x, device=q.device) for x in subset)
        qs = q.index_select(0, bs).index_select(1, rows).index_select(2, hs).float().permute(0, 2, 1, 3)
        ks = k.index_select(0, bs).index_select(2, hs).float().permute(0, 2, 1, 3)
        vs = v.index_select(0, bs).index_select(2, hs).float().permute(0, 2, 1, 3)
        s = torch.matmul(qs, ks.transpose(-1, -2)) * (1.0 / math.sqrt(c.head_dim))
        if c.causal:  # seqlen_q == seqlen_k: bottom-right == top-left
            keys = torch.arange(c.seqlen, device=q.device)
            s.masked_fill_(keys[None, None, None, :] > rows[None, None, :, None], float("-inf"))
        ref = torch.matmul(torch.softmax(s, dim=-1), vs).permute(0, 2, 1, 3)
        del s
        return ref, (bs, hs, rows)

    def lowp_math_err(self, c, q, k, v, ref, idx):
        """PyTorch's same-dtype math on the subset (baseline when no SDPA
        backend ran)."""
        torch = self.torch
        bs, hs, rows = idx
        qs = q.index_select(0, bs).index_select(1, rows).index_select(2, hs).permute(0, 2, 1, 3)
        ks = k.index_select(0, bs).index_select(2, hs).permute(0, 2, 1, 3)
        vs = v.index_select(0, bs).index_select(2, hs).permute(0, 2, 1, 3)
        s = torch.matmul(qs, ks.transpose(-1, -2)) * (1.0 / math.sqrt(c.head_dim))
        if c.causal:
            keys = torch.arange(c.seqlen, device=q.device)
            s.masked_fill_(keys[None, None, None, :] > rows[None, None, :, None], float("-inf"))
        o = torch.matmul(torch.softmax(s.float(), dim=-1).to(q.dtype), vs).permute(0, 2, 1, 3)
        return self.error(o, ref, None)[0]

    def error(self, out_subset, ref, _):
        d = out_subset.float() - ref
        max_abs = d.abs().max().item()
        rel = (d.norm() / ref.norm()).item()
        return max_abs, rel

    def sync(self):
        """Waits for the device (a CPU subclass has nothing to wait for)."""
        self.torch.cuda.synchronize()

    def one_run_ms(self, run, i):
        """One run between CUDA events (the estimate warm-up and reps are sized by)."""
        torch = self.torch
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        s.record()
        run(i)
        e.record()
        e.synchronize()
        return s.elapsed_time(e)

    def time_impl(self, run, n_sets, est_ms):
        """Warm-up, then reps runs rotated over the sets, each between two CUDA
        events; the GPU is held by a sleep kernel while the host queues them,
        so host overhead stays out of the figures. Returns Rotation."""
        torch, a = self.torch, self.args
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        nw = max(a.warmup, min(20, int(math.ceil(25.0 / max(est_ms, 1e-3)))))
        t0 = time.perf_counter()
        s.record()
        for i in range(nw):
            run(i % n_sets)
        e.record()
        host_ms = (time.perf_counter() - t0) * 1e3 / nw
        e.synchronize()
        gpu_ms = s.elapsed_time(e) / nw
        reps = choose_reps(gpu_ms, a.target_ms, a.min_reps, a.max_reps)
        rot = Rotation(n_sets)
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(reps)]
        if self.cycles_per_ms:
            hold = min(500.0, reps * host_ms * 1.5 + 2.0)
            torch.cuda._sleep(int(hold * self.cycles_per_ms))
        idx = []
        for (es, ee) in evs:
            i = rot.next()
            idx.append(i)
            es.record()
            run(i)
            ee.record()
        torch.cuda.synchronize()
        for i, (es, ee) in zip(idx, evs):
            rot.record(i, es.elapsed_time(ee))
        return rot

    @staticmethod
    def pick(o, idx):
        """The reference subset (reference()'s idx) of an output [b, s, h, d]."""
        bs, hs, rows = idx
        return o.index_select(0, bs).index_select(1, rows).index_select(2, hs)

    def measure(self, row, impl, make_run, poison, ref, idx, flops, budget_left_s):
        """Correctness first, then timing, of one implementation, into row's
        impl_* columns. make_run() returns run(i) (launch on input set i,
        return O [b, s, h, d]); poison (the tensor run(0) writes, or None)
        is filled with NaN first, so every element must be written. An
        exception in make_run or the checked run is n/a with the reason;
        one over budget_left_s is skipped. Returns (max_abs, rel) against
        ref on idx (NaNs when the output is not finite), or None when it
        did not run."""
        torch = self.torch
        p = impl + "_"
        try:
            with _Warnings() as w:
                run = make_run()
                if poison is not None:
                    poison.fill_(float("nan"))  # poison: every element must be written
                o = run(0)
                self.sync()
        except Exception as ex:  # unavailable for this config: n/a with the reason
            row[p + "status"] = "n/a"
            row[p + "note"] = _reason(ex, w.messages)
            return None
        finite = bool(torch.isfinite(o).all().item())
        err = self.error(self.pick(o, idx), ref, None)
        row[p + "max_err"], row[p + "rel_err"] = err
        if not finite:
            row[p + "note"] = "non-finite output (unwritten or NaN)"
            err = (float("nan"), float("nan"))
        del o
        self.time_into(row, impl, run, flops, budget_left_s)
        return err

    def time_into(self, row, impl, run, flops, budget_left_s):
        """Times run (after its checked run) into row's impl_* columns:
        status ok with the median, min, max, reps and TFLOP/s of flops;
        skipped when warm-up and the fewest reps would not fit
        budget_left_s; error with the reason when a run raises."""
        a = self.args
        p = impl + "_"
        try:
            est = self.one_run_ms(run, 1 % a.sets)
            if est * (a.min_reps + a.warmup) / 1e3 > budget_left_s:
                row[p + "status"] = "skipped"
                row[p + "note"] = "time budget (one run %.1f ms)" % est
                return
            rot = self.time_impl(run, a.sets, est)
        except Exception as ex:
            row[p + "status"] = "error"
            row[p + "note"] = _reason(ex, [])
            return
        sm = rot.summary()
        row[p + "status"] = "ok"
        row[p + "median_ms"], row[p + "min_ms"] = sm["median_ms"], sm["min_ms"]
        row[p + "max_ms"], row[p + "reps"] = sm["max_ms"], sm["reps"]
        row[p + "tflops"] = tflops(flops, sm["median_ms"])
        if not rot.balanced():
            row[p + "note"] = (row.get(p + "note") or "") + " unbalanced rotation %s" % rot.counts()

    def run_config(self, c, budget_left_s, predicted_ms):
        """One CSV row for config c."""
        torch, a = self.torch, self.args
        tdt = torch.float16 if c.dtype == "fp16" else torch.bfloat16
        row = {"dtype": c.dtype, "head_dim": c.head_dim, "causal": c.causal, "seqlen": c.seqlen,
               "batch": c.batch, "num_heads": c.num_heads, "flops": c.flops, "n_sets": a.sets}
        g = torch.Generator(device="cuda").manual_seed(zlib.crc32(c.describe().encode()))
        shape = (c.batch, c.seqlen, c.num_heads, c.head_dim)
        sets = [tuple(torch.randn(shape, device="cuda", dtype=tdt, generator=g) for _ in range(3))
                for _ in range(a.sets)]
        outs = [torch.empty(shape, device="cuda", dtype=tdt) for _ in range(a.sets)]
        subset = reference_subset(c.batch, c.num_heads, c.seqlen)
        ref, idx = self.reference(c, *sets[0], subset)

        errs = {}
        for impl in IMPLS:
            p = impl + "_"
            if impl == "flashattn" and predicted_ms is not None and \
                    predicted_ms * (a.min_reps + a.warmup + 2) / 1e3 > budget_left_s:
                row[p + "status"] = "skipped"
                row[p + "note"] = "time budget (predicted %.0f ms/run)" % predicted_ms
                continue
            err = self.measure(row, impl, lambda: self.make_call(impl, c, sets, outs),
                               outs[0] if impl == "flashattn" else None, ref, idx, c.flops,
                               budget_left_s)
            if err is not None:
                errs[impl] = err
        base = None
        if not any(i in errs for i in SDPA_IMPLS) and "flashattn" in errs:
            try:
                base = self.lowp_math_err(c, *sets[0], ref, idx)
            except Exception:
                base = None
        sdpa_abs = [errs[i][0] for i in SDPA_IMPLS if i in errs and math.isfinite(errs[i][0])]
        row["sdpa_baseline_err"] = min(sdpa_abs) if sdpa_abs else base
        row["tol_ok"], row["tol_note"] = judge_tolerance(
            errs.get("flashattn"), {i: errs[i] for i in SDPA_IMPLS if i in errs}, baseline_err=base)
        for i in SDPA_IMPLS:
            row["ratio_vs_" + i] = ratio(row.get("flashattn_tflops"), row.get(i + "_tflops"))
        del sets, outs, ref
        return row


class _Warnings:
    """Records warnings (torch says why an SDPA backend refused) in a block."""

    def __enter__(self):
        import warnings
        self._cm = warnings.catch_warnings(record=True)
        self._rec = self._cm.__enter__()
        warnings.simplefilter("always")
        self.messages = []
        return self

    def __exit__(self, *exc):
        self.messages[:] = [str(r.message) for r in self._rec]
        self._cm.__exit__(*exc)
        return False


def _reason(ex, warn_msgs):
    msg = getattr(ex, "message", None) or str(ex) or type(ex).__name__
    msg = msg.strip().splitlines()[0] if msg.strip() else type(ex).__name__
    extra = [m.strip().splitlines()[0] for m in warn_msgs if m.strip()]
    text = "%s: %s" % (type(ex).__name__, msg)
    if extra:
        text += " [" + " / ".join(extra[:3]) + "]"
    return re.sub(r"\s+", " ", text)[:300]


def run_meta(torch, fa, bench, args):
    """(GPU name, runtime info, UTC date, the metadata dict) of a run: the
    CSV's '# key: value' header (both modes)."""
    _, smi_driver = nvidia_smi()
    gpu = torch.cuda.get_device_name(0)
    info = bench.rt.info
    date = datetime.datetime.now(datetime.timezone.utc)
    meta = {
        "commit": git_commit(), "gpu": gpu, "sm": info.sm, "num_sms": info.num_sms,
        "driver": smi_driver or "cuDriverGetVersion %d (no nvidia-smi)" % info.driver_version,
        "cuda_driver_api": info.driver_version, "torch": torch.__version__,
        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "flashattn_library": os.path.realpath(fa.library_path()), "flashattn_version": fa.version(),
        "date": date.strftime("%Y-%m-%d %H:%M:%S UTC"), "n_sets": args.sets,
        "min_reps": args.min_reps, "python": sys.version.split()[0],
        "sleep_hold": "torch.cuda._sleep" if bench.cycles_per_ms else "none",
    }
    meta["ptx_compiler"] = ptx_compiler_meta(bench.rt)
    return gpu, info, date, meta


def ptx_compiler_meta(rt):
    """Which compiler fills the cache's rows: the mode, the compiler's
    version and why the plugin is not used (libflashattn 0.6+)."""
    try:
        st = rt.cache_stats()
        return " ".join(x for x in (st.compiler_mode, st.compiler, st.compiler_note) if x)
    except Exception as ex:  # an older library: no such fields
        return "unknown (%s)" % type(ex).__name__


def import_torch_gpu(prog, hint=""):
    """torch, which must see a CUDA GPU (else SystemExit naming prog, hint
    appended), with TF32 off for matmuls and cuDNN (the references are fp32)."""
    try:
        import torch
    except ImportError as ex:
        raise SystemExit("%s: needs PyTorch (%s)" % (prog, ex))
    if not torch.cuda.is_available():
        raise SystemExit("%s: torch sees no CUDA GPU%s" % (prog, hint))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def run_bench(args):
    torch = import_torch_gpu("bench_sdpa")
    fa = import_flashattn()
    t_start = time.time()
    bench = GpuBench(torch, fa, args)
    gpu, info, date, meta = run_meta(torch, fa, bench, args)
    seqlens = tuple(int(s) for s in args.seqlens.split(","))
    head_dims = tuple(int(d) for d in args.head_dims.split(","))
    dtypes = tuple(args.dtypes.split(","))
    grid = config_grid(dtypes, head_dims, (False, True), seqlens)
    meta["grid"] = "dtypes %s, head_dims %s, seqlens %s, causal/not: %d configs" % (
        ",".join(dtypes), ",".join(map(str, head_dims)), ",".join(map(str, seqlens)), len(grid))
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, run_base(args, date.strftime("%Y-%m-%d"), gpu))
    print("bench_sdpa: %s (sm_%d, %d SMs), torch %s, CUDA %s, driver %s, %d configs -> %s.*"
          % (gpu, info.sm, info.num_sms, torch.__version__, torch.version.cuda, meta["driver"],
             len(grid), base), flush=True)

    coldstart = []
    if not args.no_coldstart:
        print("cold start:", flush=True)
        try:
            coldstart = measure_coldstart(fa, info.sm)
        except Exception as ex:
            print("  cold start failed: %s" % _reason(ex, []), flush=True)

    rows, last = [], {}
    deadline = time.time() + args.time_budget
    for n, c in enumerate(grid):
        left = deadline - time.time()
        prev = last.get(c.key)
        predicted = prev[1] * (c.seqlen / prev[0]) if prev else None
        t0 = time.time()
        if left <= 0:
            row = {"dtype": c.dtype, "head_dim": c.head_dim, "causal": c.causal,
                   "seqlen": c.seqlen, "batch": c.batch, "num_heads": c.num_heads,
                   "flops": c.flops, "n_sets": args.sets}
            for i in IMPLS:
                row[i + "_status"], row[i + "_note"] = "skipped", "time budget"
        else:
            row = bench.run_config(c, left, predicted)
        if row.get("flashattn_median_ms"):
            last[c.key] = (c.seqlen, row["flashattn_median_ms"])
        rows.append(row)
        print("[%2d/%d] %-34s fa %8s  flash %8s  cudnn %8s TFLOP/s  fa/flash %6s  err %s tol %s (%.1fs)"
              % (n + 1, len(grid), c.describe(), _f(row.get("flashattn_tflops")),
                 _f(row.get("sdpa_flash_tflops")), _f(row.get("sdpa_cudnn_tflops")),
                 _f(row.get("ratio_vs_sdpa_flash"), "%.3f"), _f(row.get("flashattn_max_err"), "%.1e"),
                 {True: "ok", False: "FAIL", None: "-"}[row.get("tol_ok")] +
                 (" (" + row["tol_note"] + ")" if row.get("tol_note") else ""),
                 time.time() - t0), flush=True)
        torch.cuda.empty_cache()

    extra = []
    gen_bin = None
    for d in ("build-gpu", "build"):
        p = os.path.join(ROOT, d, "bench", "bench_generate")
        if os.access(p, os.X_OK):
            gen_bin = p
            break
    if gen_bin and not args.no_coldstart:
        txt = _run([gen_bin, "200"], timeout=120)
        if txt:
            extra.append(("PTX generation, %s" % os.path.relpath(gen_bin, ROOT), txt))
    if args.tests_summary and os.path.exists(args.tests_summary):
        with open(args.tests_summary) as f:
            extra.append(("GPU tests (bench/run_gpu.sh)", f.read()))

    meta["wall_s"] = "%.0f" % (time.time() - t_start)
    write_csv(base + ".csv", rows, meta)
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "coldstart": coldstart, "files": [
            os.path.basename(base) + x for x in (".csv", ".png", ".md")]}, f, indent=1, default=str)
    title = "flashattn vs SDPA %s %s" % (gpu.replace("NVIDIA ", ""), date.strftime("%Y-%m-%d"))
    meta["chart"] = os.path.basename(base) + ".png (%s)" % render_chart(rows, title, base + ".png")
    write_markdown(base + ".md", meta, rows, coldstart, extra)
    print("\n" + markdown_table(rows))
    print("\nwrote %s.{csv,json,png,md} in %.0f s" % (base, time.time() - t_start))
    fails = [r for r in rows if r.get("tol_ok") is False]
    return 3 if fails else 0


def gpu_name():
    """nvidia-smi's name of GPU 0, else torch's, else 'unknown-gpu' (for
    --print-base-name, before the run)."""
    name, _ = nvidia_smi()
    if name is None:
        try:
            import torch
            name = torch.cuda.get_device_name(0)
        except Exception:
            name = "unknown-gpu"
    return name


def today():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def print_base_name(args):
    """The base name the run with the same options writes (run_gpu.sh copies
    those files to $OUT)."""
    print(run_base(args, today(), gpu_name()))


def add_timing_args(p, max_reps, target_ms, time_budget):
    """The timing options every benchmark here takes (GpuBench.time_impl and
    the grid loops read them); p: a parser or an argument group."""
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--min-reps", type=int, default=20)
    p.add_argument("--max-reps", type=int, default=max_reps)
    p.add_argument("--target-ms", type=float, default=target_ms,
                   help="timed GPU work per implementation and config")
    p.add_argument("--time-budget", type=float, default=time_budget,
                   help="seconds for the grid; later configs are recorded as skipped")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--dtypes", default=None, help="default %s (not with --fp8)" % ",".join(DTYPES))
    p.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    p.add_argument("--seqlens", default=",".join(map(str, SEQLENS)))
    p.add_argument("--sets", type=int, default=4, help="input sets rotated over")
    add_timing_args(p, max_reps=100, target_ms=150.0, time_budget=300.0)
    p.add_argument("--quick", action="store_true", help="seqlens 512,2048 and head_dim 64,128")
    p.add_argument("--no-coldstart", action="store_true")
    p.add_argument("--tests-summary", default=None, help="text file appended to the markdown")
    p.add_argument("--print-base-name", action="store_true",
                   help="print the result files' base name for these options and exit")
    p.add_argument("--fp8", action="store_true",
                   help="the fp8 forward (bench_fp8.py): e4m3 Q/K/V with per-(batch, KV head) "
                        "descales, bf16 O, against flashattn bf16, FlashAttention-3 fp8 and SDPA "
                        "flash on the dequantised values; results named ...-sdpa-fp8")
    p.add_argument("--backward", action="store_true",
                   help="the training backward (bench_backward.py): fa_backward against SDPA's "
                        "flash and cuDNN backwards, the forward run once outside the timing; "
                        "head dims past 128 skipped; results named ...-sdpa-backward")
    p.add_argument("--deterministic", action="store_true",
                   help="with --backward: also time fa_backward's deterministic mode (and check "
                        "that two of its runs give the same bits)")
    p.add_argument("--coldstart-child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--cache-mode", default="disk", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.fp8 and a.dtypes is not None:
        p.error("--fp8 runs e4m3 Q/K/V (bf16 O); --dtypes does not apply")
    if a.fp8 and a.backward:
        p.error("--backward has no fp8 form (fa_backward refuses fp8 configs)")
    if a.deterministic and not a.backward:
        p.error("--deterministic is a mode of the backward: give --backward too")
    if a.dtypes is None:
        a.dtypes = ",".join(DTYPES)
    if a.fp8 or a.backward:
        a.no_coldstart = True  # the cold-start figures are the 16-bit forward kernels'
    if a.quick:
        a.seqlens, a.head_dims = "512,2048", "64,128"
    if a.min_reps < 20:
        p.error("--min-reps must be >= 20 (the method asks for a median of at least 20 runs)")
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.coldstart_child:
        coldstart_child(a.coldstart_child, a.cache_dir, a.cache_mode)
        return 0
    if a.print_base_name:
        print_base_name(a)
        return 0
    if a.fp8:
        if HERE not in sys.path:
            sys.path.insert(0, HERE)
        import bench_fp8  # beside this file (it imports this module for the shared parts)
        return bench_fp8.run_bench(a)
    if a.backward:
        if HERE not in sys.path:
            sys.path.insert(0, HERE)
        import bench_backward  # beside this file, as bench_fp8
        return bench_backward.run_bench(a)
    return run_bench(a)


if __name__ == "__main__":
    sys.exit(main())

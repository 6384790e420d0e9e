#!/usr/bin/env python3
"""flashattn varlen and chunked-prefill forward vs PyTorch SDPA and FlexAttention on one GPU.

    python3 bench/bench_varlen.py [--quick] [--time-budget S] [--out-dir bench/results]
    python3 bench/bench_varlen.py --chunked [--quick] ...
    python3 bench/bench_varlen.py --self-test     # no GPU: the emulator on tiny shapes

Ragged batch (default; results ...-varlen.*): one batch of sequences whose
lengths are drawn, seeded, as round(LogNormal(mu = ln 600, sigma = 0.8))
clipped to [16, 8192], drawn until the batch holds exactly 16384 tokens (the
draw that would overflow is cut to the remainder; a remainder under 16 joins
the shortest sequence). num_heads * head_dim = 2048 as bench_sdpa.py; fp16
and bf16 x head_dim 64 and 128 x causal and not. The same lengths for every
config, so the configs compare. Contenders, on the same values:

  flashattn          flashattn.forward on the packed [total, heads, d]
                     tensors with cu_seqlens_q = cu_seqlens_k (device int32)
                     and max_seqlen_q/k
  sdpa_cudnn_padded  SDPA with SDPBackend.CUDNN_ATTENTION on the zero-padded
                     [batch, max_len] batch ([b, h, s, d] transpose views):
                     causal: is_causal=True (right padding: a real query sees
                     real keys only); not causal: a boolean key-padding mask
                     [b, 1, 1, max_len]. Padding is done beforehand, not timed;
                     padded query rows are computed and ignored
  flex               torch.nn.attention.flex_attention, torch.compile'd
                     (fullgraph, static shapes; its bundled Triton), on the
                     packed tensors as one [1, h, total, d] sequence with a
                     document mask (doc[q] == doc[kv], and q >= kv when causal)
                     built by create_block_mask from the lengths, not timed;
                     compile time is kept out of the timing (warm-up)

FLOPs, for every contender, are the ragged batch's useful FLOPs: the sum over
sequences of 4 * heads * len^2 * head_dim, halved for causal (bench_sdpa.py's
rule per sequence); the padded batch's own count is in the CSV
(padded_flops) to show what padding wastes. Bytes (the floor): Q, K, V read
once, O written once, 2 bytes an element.

--chunked (results ...-chunked-prefill.*): chunked prefill. batch 4
sequences, each with `context` keys already in a paged KV cache (4k, 8k,
16k, 32k) and a chunk of 2048 new query tokens whose K/V are the cache's
last 2048 keys (keys = context + 2048); pages of 16 keys in a shuffled
block table (bench_decode.py's plan_pages, 2 spare NaN pages); bf16 and
fp16, head_dim 128, GQA 32/8. Causal bottom-right: new token i sees keys
0 .. context + i. Contenders:

  flashattn          forward(q [b, 2048, 32, 128], k/v pages, block_table=
                     (device int32), seqused_k= (device int32, = keys))
  flashattn_contig   forward on the contiguous K/V (fixed length, seqlen_q
                     2048 < seqlen_k: causal is bottom-right)
  sdpa_flash         SDPA, SDPBackend.FLASH_ATTENTION, attn_mask=
                     torch.nn.attention.bias.causal_lower_right(2048, keys):
                     FlashAttention-2's own bottom-right causal, no dense mask
  sdpa_cudnn         SDPA, SDPBackend.CUDNN_ATTENTION: SDPA's is_causal is
                     top-left, so a dense mask: the boolean visibility [2048,
                     keys] (key j <= i + context) as the additive 0 / -inf
                     bias SDPA makes of a boolean mask, made once outside the
                     timing, [1, 1, 2048, keys] broadcast

SDPA reads contiguous K/V gathered from the pages beforehand (not timed),
with enable_gqa=True; where a backend refuses GQA, K/V expanded to 32 heads
beforehand (noted in the row). FLOPs = 4 * heads_q * head_dim * the visible
(query, key) pairs, 2048 * context + 2048 * 2049 / 2 per sequence; bytes =
Q + O + K/V of every key once.

Both modes, as bench_sdpa.py (METHOD.md): each output is compared with an
fp32 reference on a subset (ragged: the first, the longest and the last
sequence; chunked: the first and last sequence; 4 heads, at most 1024
query rows spread over each, all keys); flashattn's outputs are poisoned
with NaN first and must come back finite. flashattn is judged against the
best other contender (max error at most 2x, relative error < 1e-2; exit
status 3 otherwise). Timing: CUDA events per call, warm-up, median of
20..100 runs, inputs rotated over --sets sets, a sleep kernel holding the
GPU while the host queues. A contender that cannot run is n/a with the
reason, never a crash.

--self-test runs both modes on the CPU with the flashattn emulator, fp16,
a few sequences of a few tokens (lognormal, median 24, in [4, 64]), SDPA's
math backend standing in for the GPU backends (the masks are the ones
above), FlexAttention eager, host-clock timing; it fails unless every
contender ran and is within tolerance. No figure from it means anything.

Everything above the "GPU part" marker needs only the standard library (the
tests in bench/tests import it without torch).
"""

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_decode as dec  # noqa: E402  (the page table)
import bench_sdpa as common  # noqa: E402  (timing, tolerance, CSV helpers)

TOKENS = 16384  # tokens per ragged batch
HIDDEN = common.HIDDEN  # num_heads * head_dim
LEN_MEDIAN, LEN_SIGMA, LEN_MIN, LEN_MAX = 600, 0.8, 16, 8192
SEED = 27
DTYPES = ("fp16", "bf16")
HEAD_DIMS = (64, 128)
VARLEN_IMPLS = ("flashattn", "sdpa_cudnn_padded", "flex")
VARLEN_LABELS = {"flashattn": "flashattn varlen", "sdpa_cudnn_padded": "SDPA cuDNN (padded)",
                 "flex": "FlexAttention (doc mask)"}

CHUNK_CONTEXTS = (4096, 8192, 16384, 32768)
CHUNK_NEW = 2048
CHUNK_BATCH = 4
CHUNK_PAGE = 16
CHUNK_HEADS_Q, CHUNK_HEADS_KV, CHUNK_HEAD_DIM = 32, 8, 128
CHUNK_IMPLS = ("flashattn", "flashattn_contig", "sdpa_flash", "sdpa_cudnn")
CHUNK_LABELS = {"flashattn": "flashattn paged", "flashattn_contig": "flashattn contiguous",
                "sdpa_flash": "SDPA flash (lower-right)", "sdpa_cudnn": "SDPA cuDNN (dense mask)"}
REF_ROWS = 1024  # query rows of the reference per sequence, at most


# ---- the ragged batch ----------------------------------------------------------------

def draw_lengths(total=TOKENS, median=LEN_MEDIAN, sigma=LEN_SIGMA, lo=LEN_MIN, hi=LEN_MAX,
                 seed=SEED):
    """Sequence lengths summing to exactly `total`: round(LogNormal(ln median,
    sigma)) clipped to [lo, hi], drawn with random.Random(seed) until the
    next draw would overflow; that one is cut to the remainder, and a
    remainder under lo joins the shortest sequence (ValueError if that
    passes hi)."""
    if not 1 <= lo <= hi or total < lo or median <= 0 or sigma < 0:
        raise ValueError("need 1 <= lo <= hi, total >= lo, median > 0, sigma >= 0")
    rng, mu = random.Random(seed), math.log(median)
    lens, left = [], total
    while left > 0:
        n = min(hi, max(lo, int(round(rng.lognormvariate(mu, sigma)))), left)
        if n < lo:  # only the remainder can be short
            i = lens.index(min(lens))
            if lens[i] + n > hi:
                raise ValueError("a remainder of %d tokens fits no sequence under %d" % (n, hi))
            lens[i] += n
        else:
            lens.append(n)
        left -= n
    return lens


def cu_seqlens(lens):
    """[0, l0, l0 + l1, ..., total]: the packed offsets (cu_seqlens)."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def doc_ids(lens):
    """The sequence (document) each packed token belongs to."""
    return [b for b, n in enumerate(lens) for _ in range(n)]


def pad_positions(lens, max_len):
    """Row of each packed token in the padded batch seen as [batch * max_len]:
    token j of sequence b -> b * max_len + j."""
    if max(lens) > max_len:
        raise ValueError("a sequence of %d tokens does not fit max_len %d" % (max(lens), max_len))
    return [b * max_len + j for b, n in enumerate(lens) for j in range(n)]


def key_mask_rows(lens, max_len):
    """The padded batch's key-padding mask [batch][max_len]: True where the
    key is a real token (SDPA's boolean attn_mask: True = take part)."""
    return [[j < n for j in range(max_len)] for n in lens]


def varlen_flops(lens, heads, head_dim, causal):
    """The ragged batch's useful FLOPs: bench_sdpa.py's count per sequence
    (4 * heads * len^2 * head_dim, halved for causal), summed."""
    return sum(common.attention_flops(1, heads, n, n, head_dim, causal) for n in lens)


def reference_seqs(lens):
    """The sequences the fp32 reference covers: first, longest, last."""
    return sorted({0, lens.index(max(lens)), len(lens) - 1})


@dataclass(frozen=True)
class VarlenConfig:
    dtype: str
    head_dim: int
    causal: bool
    lens: tuple
    hidden: int = HIDDEN

    @property
    def num_heads(self):
        return self.hidden // self.head_dim

    @property
    def tokens(self):
        return sum(self.lens)

    @property
    def batch(self):
        return len(self.lens)

    @property
    def max_len(self):
        return max(self.lens)

    @property
    def padded_tokens(self):
        return self.batch * self.max_len

    @property
    def flops(self):
        return varlen_flops(self.lens, self.num_heads, self.head_dim, self.causal)

    @property
    def padded_flops(self):
        """What attention over the padded batch counts (not charged)."""
        return common.attention_flops(self.batch, self.num_heads, self.max_len, self.max_len,
                                      self.head_dim, self.causal)

    @property
    def bytes(self):
        """Q, K, V read once and O written once, 2 bytes an element."""
        return 4 * self.tokens * self.hidden * 2

    def describe(self):
        return "%s d%d %s %d seqs (max %d)" % (self.dtype, self.head_dim,
                                               "causal" if self.causal else "full",
                                               self.batch, self.max_len)


def varlen_grid(lens, dtypes=DTYPES, head_dims=HEAD_DIMS, causals=(False, True), hidden=HIDDEN):
    for d in head_dims:
        if hidden % d:
            raise ValueError("head_dim %d does not divide %d" % (d, hidden))
    return [VarlenConfig(dt, d, bool(c), tuple(lens), hidden) for dt in dtypes
            for d in head_dims for c in causals]


# ---- chunked prefill -------------------------------------------------------------------

def visible(i, j, n_q, n_k):
    """Causal, bottom-right aligned: query i of n_q (the last n_q of n_k
    positions) sees key j when j <= i + n_k - n_q."""
    return 0 <= j < n_k and j <= i + n_k - n_q


def causal_pairs(n_q, n_k):
    """The visible (query, key) pairs of bottom-right causal attention:
    sum over queries of max(0, n_k - n_q + i + 1)."""
    off = n_k - n_q
    if off >= 0:
        return n_q * off + n_q * (n_q + 1) // 2
    return n_k * (n_k + 1) // 2  # queries before the first key see nothing


@dataclass(frozen=True)
class ChunkedConfig:
    dtype: str
    head_dim: int
    context: int
    batch: int = CHUNK_BATCH
    new: int = CHUNK_NEW
    page_size: int = CHUNK_PAGE
    heads_q: int = CHUNK_HEADS_Q
    heads_kv: int = CHUNK_HEADS_KV

    @property
    def keys(self):
        """Keys per sequence: the context and the chunk's own (the new
        tokens' K/V are in the cache before the attention)."""
        return self.context + self.new

    @property
    def pages_per_seq(self):
        return dec.pages_per_seq(self.keys, self.page_size)

    @property
    def num_pages(self):
        return self.batch * self.pages_per_seq + dec.SPARE_PAGES

    @property
    def flops(self):
        return 4 * self.heads_q * self.head_dim * self.batch * causal_pairs(self.new, self.keys)

    @property
    def bytes(self):
        """Q read + O written + K and V of every key read once (2 bytes)."""
        return 2 * (2 * self.batch * self.new * self.heads_q * self.head_dim +
                    2 * self.batch * self.keys * self.heads_kv * self.head_dim)

    def describe(self):
        return "%s d%d b%d ctx%d+%d ps%d" % (self.dtype, self.head_dim, self.batch, self.context,
                                            self.new, self.page_size)


def chunked_grid(contexts=CHUNK_CONTEXTS, dtypes=DTYPES, head_dims=(CHUNK_HEAD_DIM,), **shape):
    """Smallest context first (a time budget cuts the largest)."""
    return [ChunkedConfig(dt, d, ctx, **shape) for ctx in contexts for dt in dtypes
            for d in head_dims]


def chunk_page_rows(cfg, seed=0):
    """(block table [batch][pages_per_seq], the pool row of each key of each
    sequence, flattened sequence by sequence): bench_decode.py's shuffled
    plan_pages / token_rows for `batch` sequences of `keys` keys."""
    lens = [cfg.keys] * cfg.batch
    num_pages, table = dec.plan_pages(lens, cfg.page_size, seed=seed)
    assert num_pages == cfg.num_pages
    rows = dec.token_rows(table, lens, cfg.page_size)
    return table, [r for seq in rows for r in seq]


# ---- tolerance, rows, CSV, markdown -----------------------------------------------------

def judge(errs, judged, baselines):
    """(ok, note): each impl in `judged` (flashattn's) against the fp32
    reference by bench_sdpa.py's rule, the best of `baselines` that ran as
    the bar. ok is None when the first judged impl produced no output."""
    base = {i: errs[i] for i in baselines if i in errs}
    ok, notes = None, []
    for n, impl in enumerate(judged):
        o, note = common.judge_tolerance(errs.get(impl), base, baseline_name="the best other")
        if n == 0:
            if o is None:
                return None, note
            ok = o
        elif o is False:
            ok = False
        if note and o is not None:
            notes.append(note if n == 0 else "%s: %s" % (impl, note))
    return ok, "; ".join(notes)


VARLEN_CONFIG_FIELDS = ["dtype", "head_dim", "causal", "num_heads", "seqs", "tokens", "max_len",
                        "padded_tokens", "flops", "padded_flops", "bytes", "lengths", "n_sets"]
CHUNK_CONFIG_FIELDS = ["dtype", "head_dim", "batch", "context", "new", "keys", "heads_q",
                       "heads_kv", "page_size", "num_pages", "flops", "bytes", "n_sets"]
TAIL_FIELDS = ["baseline_err", "tol_ok", "tol_note"]


def _ratio_fields(impls):
    return ["ratio_vs_" + i for i in impls[1:]]


def fields(chunked):
    impls = CHUNK_IMPLS if chunked else VARLEN_IMPLS
    return ((CHUNK_CONFIG_FIELDS if chunked else VARLEN_CONFIG_FIELDS) +
            ["%s_%s" % (i, f) for i in impls for f in common.IMPL_FIELDS] +
            _ratio_fields(impls) + TAIL_FIELDS)


_INT_FIELDS = set(VARLEN_CONFIG_FIELDS + CHUNK_CONFIG_FIELDS) - {"dtype", "causal", "lengths"} | {
    "%s_reps" % i for i in VARLEN_IMPLS + CHUNK_IMPLS}
_FLOAT_SUFFIXES = ("_ms", "tflops", "_err") + tuple(
    _ratio_fields(VARLEN_IMPLS) + _ratio_fields(CHUNK_IMPLS))
_parse = common.csv_parser(_INT_FIELDS, _FLOAT_SUFFIXES)


def varlen_row(c, n_sets):
    return {"dtype": c.dtype, "head_dim": c.head_dim, "causal": c.causal,
            "num_heads": c.num_heads, "seqs": c.batch, "tokens": c.tokens, "max_len": c.max_len,
            "padded_tokens": c.padded_tokens, "flops": c.flops, "padded_flops": c.padded_flops,
            "bytes": c.bytes, "lengths": " ".join(map(str, c.lens)), "n_sets": n_sets}


def chunked_row(c, n_sets):
    return {"dtype": c.dtype, "head_dim": c.head_dim, "batch": c.batch, "context": c.context,
            "new": c.new, "keys": c.keys, "heads_q": c.heads_q, "heads_kv": c.heads_kv,
            "page_size": c.page_size, "num_pages": c.num_pages, "flops": c.flops,
            "bytes": c.bytes, "n_sets": n_sets}


def finish_row(row, errs, chunked):
    """Ratios (flashattn's TFLOP/s over each other's: the same FLOPs, so
    inverse time ratios), the bar and the verdict."""
    impls = CHUNK_IMPLS if chunked else VARLEN_IMPLS
    for i in impls[1:]:
        row["ratio_vs_" + i] = common.ratio(row.get("flashattn_tflops"), row.get(i + "_tflops"))
    baselines = [i for i in impls if not i.startswith("flashattn")]
    best = [errs[i][0] for i in baselines if i in errs and math.isfinite(errs[i][0])]
    row["baseline_err"] = min(best) if best else None
    judged = [i for i in impls if i.startswith("flashattn")]
    row["tol_ok"], row["tol_note"] = judge(errs, judged, baselines)
    return row


def skipped_row(c, chunked, n_sets, why):
    row = chunked_row(c, n_sets) if chunked else varlen_row(c, n_sets)
    for i in CHUNK_IMPLS if chunked else VARLEN_IMPLS:
        row[i + "_status"], row[i + "_note"] = "skipped", why
    return finish_row(row, {}, chunked)


def write_csv(path, rows, meta, chunked):
    common.write_csv(path, rows, meta, fields(chunked))


def read_csv(path):
    return common.read_csv(path, _parse)


def _cells(r, impls):
    return " | ".join(common.impl_cell(r, i) for i in impls)


def _err_cells(r):
    return "%s / %s" % (common._f(r.get("flashattn_max_err"), "%.2e"),
                        common._f(r.get("flashattn_rel_err"), "%.2e"))


def markdown_table(rows, chunked):
    impls = CHUNK_IMPLS if chunked else VARLEN_IMPLS
    labels = CHUNK_LABELS if chunked else VARLEN_LABELS
    ratios = " | ".join("fa/%s" % labels[i].split(" (")[0] for i in impls[1:])
    if chunked:
        head = "| dtype | d | batch | context | new | GFLOP | MB | "
    else:
        head = "| dtype | d | causal | heads | seqs | max len | padded / tokens | GFLOP | "
    lines = dec._head_lines(head + " | ".join(labels[i] for i in impls) + " | " + ratios +
                            " | fa err max / rel | others' best err | tol |")
    for r in rows:
        if chunked:
            cfg = "| %s | %d | %d | %d | %d | %.1f | %.1f |" % (
                r["dtype"], r["head_dim"], r["batch"], r["context"], r["new"], r["flops"] / 1e9,
                r["bytes"] / 1e6)
        else:
            cfg = "| %s | %d | %s | %d | %d | %d | %.2f | %.1f |" % (
                r["dtype"], r["head_dim"], "yes" if r["causal"] else "no", r["num_heads"],
                r["seqs"], r["max_len"], r["padded_tokens"] / r["tokens"], r["flops"] / 1e9)
        lines.append("%s %s | %s | %s | %s | %s |" % (
            cfg, _cells(r, impls),
            " | ".join(common._f(r.get("ratio_vs_" + i), "%.3f") for i in impls[1:]),
            _err_cells(r), common._f(r.get("baseline_err"), "%.2e"), dec._tol_cell(r)))
    return "\n".join(lines)


VARLEN_ABOUT = (
    "Ragged batch: lengths round(LogNormal(ln %(median)s, %(sigma)s)) clipped to [%(lo)d, %(hi)d], "
    "seed %(seed)d, drawn until the batch holds %(tokens)d tokens (lengths in the CSV); "
    "heads * head_dim = %(hidden)d. GFLOP = the ragged batch's useful FLOPs, sum over sequences "
    "of 4 * heads * len^2 * head_dim, halved for causal, charged to every contender (padded / "
    "tokens: how much larger the padded batch SDPA reads is). flashattn: varlen forward "
    "(cu_seqlens). SDPA cuDNN: the zero-padded [batch, max_len] batch, is_causal=True when causal "
    "(right padding), else a boolean key-padding mask; padding not timed. FlexAttention: "
    "torch.compile'd flex_attention on the packed batch as one sequence with a document mask "
    "(create_block_mask, not timed). Cells: TFLOP/s from the median CUDA-event time; ratios "
    "flashattn / the other. Errors vs an fp32 reference on the first, longest and last sequence; "
    "tol fails when flashattn's max error exceeds %(factor)gx the best other contender's or its "
    "relative error exceeds %(rel)g.")
CHUNK_ABOUT = (
    "Chunked prefill: `new` query tokens per sequence over `context` cached keys plus their own "
    "(keys = context + new), pages of %(page)d keys in a shuffled block table, GQA %(hq)d/%(hk)d; "
    "causal bottom-right (new token i sees keys 0 .. context + i). GFLOP = 4 * heads_q * head_dim "
    "* visible pairs (new * context + new * (new + 1) / 2 per sequence); MB = Q + O + K/V of every "
    "key once. flashattn paged: forward with block_table and seqused_k; contiguous: the same on "
    "the gathered K/V. SDPA (K/V gathered from the pages beforehand, enable_gqa, or K/V expanded "
    "where a backend refuses it, noted): flash with causal_lower_right (FlashAttention-2's "
    "bottom-right causal), cuDNN with a dense [new, keys] mask (the boolean visibility as SDPA's "
    "additive 0/-inf bias, made outside the timing). Cells: TFLOP/s from the median CUDA-event "
    "time; ratios flashattn paged / the other. Errors vs an fp32 reference on the first and last "
    "sequence; tol as bench_sdpa.py (%(factor)gx the best SDPA error, relative < %(rel)g), both "
    "flashattn layouts judged.")
META_KEYS = ("commit", "gpu", "sm", "driver", "torch", "cuda", "cudnn", "triton",
             "flashattn_library", "flashattn_version", "ptx_compiler", "date", "n_sets",
             "min_reps", "grid", "lengths", "sleep_hold")


def about(chunked, **kw):
    p = dict(median=LEN_MEDIAN, sigma=LEN_SIGMA, lo=LEN_MIN, hi=LEN_MAX, seed=SEED,
             tokens=TOKENS, hidden=HIDDEN, page=CHUNK_PAGE, hq=CHUNK_HEADS_Q,
             hk=CHUNK_HEADS_KV, factor=common.ERR_FACTOR, rel=common.REL_ERR_LIMIT)
    p.update(kw)
    return (CHUNK_ABOUT if chunked else VARLEN_ABOUT) % p


def write_markdown(path, meta, rows, chunked, extra_sections=(), **about_kw):
    out = ["# flashattn %s vs SDPA%s: %s, %s" % (
        "chunked prefill" if chunked else "varlen forward", "" if chunked else " / FlexAttention",
        meta.get("gpu", "?"), meta.get("date", "?")), ""]
    out += ["- %s: %s" % (k, meta[k]) for k in META_KEYS if k in meta]
    out += ["", about(chunked, **about_kw), "", markdown_table(rows, chunked), ""]
    fails = [r for r in rows if r.get("tol_ok") is False]
    what = (lambda r: "%s ctx%d" % (r["dtype"], r["context"])) if chunked else (
        lambda r: "%s d%d %s" % (r["dtype"], r["head_dim"], "causal" if r["causal"] else "full"))
    out += ["Out of tolerance: %s" % (", ".join(map(what, fails)) if fails else "none"), ""]
    for title, body in extra_sections:
        out += ["## %s" % title, "", "```", body.rstrip(), "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def result_base(date, gpu_name, chunked=False):
    return "%s-%s-%s" % (date, common.slug(gpu_name), "chunked-prefill" if chunked else "varlen")


def run_base(args, date, gpu_name):
    """The base name a run with these options writes (the run and
    --print-base-name both take it from here)."""
    base = result_base(date, gpu_name, args.chunked)
    if args.chunked and (args.batch, args.new_tokens) != (CHUNK_BATCH, CHUNK_NEW):
        base += "-b%d-q%d" % (args.batch, args.new_tokens)  # not the default run's files
    return base


int_list = dec.int_list


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunked", action="store_true",
                   help="chunked prefill over a paged KV cache (see above); results named "
                        "...-chunked-prefill")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--dtypes", default=",".join(DTYPES), help="(%(default)s)")
    p.add_argument("--head-dims", default=None, help="default %s (--chunked: %d)" % (
        ",".join(map(str, HEAD_DIMS)), CHUNK_HEAD_DIM))
    p.add_argument("--quick", action="store_true",
                   help="bf16 only (the lease's stages): 4 ragged configs, or the 4 contexts")
    g = p.add_argument_group("ragged batch")
    g.add_argument("--tokens", type=int, default=TOKENS, help="tokens per batch (%(default)s)")
    g.add_argument("--len-median", type=float, default=LEN_MEDIAN,
                   help="the lognormal's median, exp(mu) (%(default)s)")
    g.add_argument("--len-sigma", type=float, default=LEN_SIGMA,
                   help="the lognormal's sigma (%(default)s)")
    g.add_argument("--len-min", type=int, default=LEN_MIN, help="clip below (%(default)s)")
    g.add_argument("--len-max", type=int, default=LEN_MAX, help="clip above (%(default)s)")
    g.add_argument("--seed", type=int, default=SEED, help="random.Random seed (%(default)s)")
    g = p.add_argument_group("--chunked")
    g.add_argument("--contexts", default=",".join(map(str, CHUNK_CONTEXTS)),
                   help="cached keys before the chunk (%(default)s)")
    g.add_argument("--batch", type=int, default=CHUNK_BATCH, help="sequences (%(default)s)")
    g.add_argument("--new-tokens", type=int, default=CHUNK_NEW,
                   help="the chunk's query tokens per sequence (%(default)s)")
    g.add_argument("--page-size", type=int, default=CHUNK_PAGE,
                   help="keys per page (%(default)s)")
    g = p.add_argument_group("timing")
    g.add_argument("--sets", type=int, default=4, help="input sets rotated over")
    common.add_timing_args(g, max_reps=100, target_ms=100.0, time_budget=300.0)
    p.add_argument("--tests-summary", default=None, help="text file appended to the markdown")
    p.add_argument("--print-base-name", action="store_true",
                   help="print the result files' base name for these options and exit")
    p.add_argument("--self-test", action="store_true",
                   help="no GPU: both modes on tiny shapes through the emulator (CPU torch), SDPA's "
                        "math backend, FlexAttention eager; checks correctness only")
    p.add_argument("--flex-eager", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.head_dims is None:
        a.head_dims = str(CHUNK_HEAD_DIM) if a.chunked else ",".join(map(str, HEAD_DIMS))
    if a.quick:
        a.dtypes = "bf16"
    if a.min_reps < 20:
        p.error("--min-reps must be >= 20 (the method asks for a median of at least 20 runs)")
    dec.check_int_lists(p, a, "head_dims", "contexts")
    if set(a.dtypes.split(",")) - set(DTYPES):
        p.error("--dtypes: fp16 and/or bf16")
    for name in ("batch", "new_tokens", "page_size", "sets", "tokens", "len_min"):
        if getattr(a, name) < 1:
            p.error("--%s must be >= 1" % name.replace("_", "-"))
    try:
        draw_lengths(a.tokens, a.len_median, a.len_sigma, a.len_min, a.len_max, a.seed)
    except ValueError as ex:
        p.error("the length distribution: %s" % ex)
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.print_base_name:
        print(run_base(a, common.today(), common.gpu_name()))
        return 0
    if a.self_test:
        return run_self_test(a)
    return run_bench(a)


# ======================================================================================
# GPU part: everything below needs torch (the helpers take it as an argument,
# so the tests can run them on CPU tensors).
# ======================================================================================

def scatter_pages(torch, x, rows, num_pages, page_size):
    """A page pool [num_pages, page_size, heads, d] holding x [batch, keys,
    heads, d] at the pool rows `rows` (a long tensor, chunk_page_rows()'s
    order); every other row NaN (a kernel reading one poisons its output)."""
    b, n, h, d = x.shape
    pool = torch.full((num_pages, page_size, h, d), float("nan"), dtype=x.dtype, device=x.device)
    pool.view(num_pages * page_size, h, d)[rows] = x.reshape(b * n, h, d)
    return pool


def gather_pages(torch, pool, rows, batch, keys):
    """The contiguous [batch, keys, heads, d] cache read back from the pool
    rows `rows` (what SDPA reads)."""
    p, ps, h, d = pool.shape
    return pool.view(p * ps, h, d).index_select(0, rows).view(batch, keys, h, d)


def visible_mask(torch, n_q, n_k, device):
    """bool [n_q, n_k]: visible() for every (query, key)."""
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    return j <= i + (n_k - n_q)


def bottom_right_bias(torch, n_q, n_k, dtype, device):
    """The dense mask SDPA's cuDNN backend gets: [1, 1, n_q, n_k] of dtype,
    0 where visible, -inf elsewhere (what SDPA makes of the boolean mask)."""
    bias = torch.zeros((n_q, n_k), dtype=dtype, device=device)
    bias.masked_fill_(~visible_mask(torch, n_q, n_k, device), float("-inf"))
    return bias.view(1, 1, n_q, n_k)


def pad_batch(torch, x, pos, batch, max_len):
    """The zero-padded [batch, max_len, heads, d] copy of packed x [total,
    heads, d]; pos: pad_positions() as a long tensor."""
    t, h, d = x.shape
    out = torch.zeros((batch * max_len, h, d), dtype=x.dtype, device=x.device)
    out.index_copy_(0, pos, x)
    return out.view(batch, max_len, h, d)


def attention_ref(torch, q, k, v, vis):
    """fp32 softmax(q k^T / sqrt(d)) v for q [r, h, d], k/v [n, h, d] and
    vis bool [r, n] (None: all keys): [r, h, d]."""
    s = torch.einsum("rhd,nhd->hrn", q.float(), k.float()) / math.sqrt(q.shape[-1])
    if vis is not None:
        s = s.masked_fill(~vis[None], float("-inf"))
    return torch.einsum("hrn,nhd->rhd", torch.softmax(s, dim=-1), v.float())


def varlen_reference(torch, c, q, k, v, max_rows=REF_ROWS):
    """fp32 reference of the first, longest and last sequence (4 heads, at
    most max_rows query rows spread over each, all its keys): (ref [rows,
    heads, d], packed token index, padded row index, head index), the
    indices as long tensors on q's device."""
    cu = cu_seqlens(c.lens)
    toks, pads, refs = [], [], []
    _, hs, _ = common.reference_subset(1, c.num_heads, 1)
    hs_t = torch.tensor(hs, device=q.device)
    for b in reference_seqs(list(c.lens)):
        n = c.lens[b]
        _, _, rows = common.reference_subset(1, 1, n, max_rows=max_rows)
        rows_t = torch.tensor(rows, device=q.device)
        tok = cu[b] + rows_t
        keys = slice(cu[b], cu[b + 1])
        vis = rows_t[:, None] >= torch.arange(n, device=q.device)[None, :] if c.causal else None
        refs.append(attention_ref(torch, q.index_select(0, tok).index_select(1, hs_t),
                                  k[keys].index_select(1, hs_t), v[keys].index_select(1, hs_t),
                                  vis))
        toks.append(tok)
        pads.append(b * c.max_len + rows_t)
    return torch.cat(refs), torch.cat(toks), torch.cat(pads), hs_t


def chunked_reference(torch, c, q, kc, vc, idx):
    """fp32 reference on bench_sdpa.py's subset idx = (batches, heads, query
    rows) of q [batch, new, heads_q, d] over the contiguous kc/vc [batch,
    keys, heads_kv, d] (GQA: query head h reads KV head h // (heads_q /
    heads_kv)): [batches, rows, heads, d], GpuBench.pick's layout."""
    bs, hs, rows = idx
    kvh = hs // (c.heads_q // c.heads_kv)
    vis = visible_mask(torch, c.new, c.keys, q.device).index_select(0, rows)
    out = [attention_ref(torch, q[b].index_select(0, rows).index_select(1, hs),
                         kc[b].index_select(1, kvh), vc[b].index_select(1, kvh), vis)
           for b in bs.tolist()]
    return torch.stack(out)


class PrefillBench(common.GpuBench):
    """bench_sdpa.py's GpuBench (runtime, SDPA backends, reference error,
    timing, measure()) with the ragged and chunked contenders. device "cpu"
    (the self-test): the emulator runtime and SDPA's math backend."""

    def __init__(self, torch, fa, args, device="cuda"):
        super().__init__(torch, fa, args, backend="cuda" if device == "cuda" else "emulator")
        self.device = device
        self.fa_cfgs = {}
        if device != "cuda" and self.sdpa_kernel is not None:
            from torch.nn.attention import SDPBackend
            self.backends = {k: SDPBackend.MATH for k in self.backends}

    def pick(self, o, idx):
        """idx: a function of the output (the ragged contenders' layouts
        differ), else bench_sdpa.py's (batches, heads, rows)."""
        return idx(o) if callable(idx) else super().pick(o, idx)

    def fa_config(self, dtype, head_dim, heads_q, heads_kv, causal):
        key = (dtype, head_dim, heads_q, heads_kv, causal)
        if key not in self.fa_cfgs:
            self.fa_cfgs[key] = self.fa.Config(dtype=dtype, head_dim=head_dim,
                                               num_heads_q=heads_q, num_heads_kv=heads_kv,
                                               causal=causal)
        return self.fa_cfgs[key]

    def fa_call(self, cfg, outs, **kw):
        """run(i): flashattn.forward into outs[i] (a NumPy view on the CPU:
        the binding's host outputs) on the current stream; kw maps argument
        name -> per-set list (q, k, v) or one value."""
        torch, fwd, rt = self.torch, self.fa.forward, self.rt
        cuda = self.device == "cuda"
        stream = torch.cuda.current_stream() if cuda else None
        dst = outs if cuda else [o.numpy() for o in outs]
        per_set = {n: x for n, x in kw.items() if n in ("q", "k", "v")}
        fixed = {n: x for n, x in kw.items() if n not in per_set}

        def run(i):
            fwd(rt, cfg, per_set["q"][i], per_set["k"][i], per_set["v"][i], out=dst[i],
                stream=stream, **fixed)
            return outs[i]
        return run

    def sdpa_backend(self, impl):
        backend = self.backends.get(impl)
        if self.sdpa_kernel is None or backend is None:
            raise RuntimeError("this torch has no %s" % (
                "sdpa_kernel" if self.sdpa_kernel is None else "SDPBackend for " + impl))
        return backend

    def generator(self, seed):
        return self.torch.Generator(device=self.device).manual_seed(seed)

    def tdt(self, dtype):
        return self.torch.float16 if dtype == "fp16" else self.torch.bfloat16

    def measure_all(self, row, impls, calls, flops, budget_left_s):
        """measure() each contender: calls[impl] = (make_run, poison, idx,
        ref); a variant note make_run leaves in row['_variant_' + impl] is
        put before the contender's note. Returns the errors."""
        errs = {}
        for impl in impls:
            make_run, poison, idx, ref = calls[impl]
            err = self.measure(row, impl, make_run, poison, ref, idx, flops, budget_left_s)
            variant = row.pop("_variant_" + impl, None)
            if variant:
                row[impl + "_note"] = "; ".join(x for x in (variant, row.get(impl + "_note")) if x)
            if err is not None:
                errs[impl] = err
        return errs

    # ---- the ragged batch -----------------------------------------------------------------

    def run_varlen(self, c, budget_left_s):
        torch, a = self.torch, self.args
        dt, h, d, T, L = self.tdt(c.dtype), c.num_heads, c.head_dim, c.tokens, c.max_len
        row = varlen_row(c, a.sets)
        g = self.generator(1000003 * d + 2 * c.causal + (c.dtype == "bf16"))
        sets = [tuple(torch.randn((T, h, d), device=self.device, dtype=dt, generator=g)
                      for _ in range(3)) for _ in range(a.sets)]
        outs = [torch.empty((T, h, d), device=self.device, dtype=dt) for _ in range(a.sets)]
        ref, tok, pad, hs = varlen_reference(torch, c, *sets[0])
        cu = torch.tensor(cu_seqlens(c.lens), dtype=torch.int32, device=self.device)

        def packed(o):  # [T, h, d]
            return o.index_select(0, tok).index_select(1, hs)

        def padded(o):  # [b, h, L, d] (SDPA's layout)
            return o.transpose(1, 2).reshape(c.batch * L, h, d).index_select(0, pad).index_select(1, hs)

        def flex_out(o):  # [1, h, T, d]
            return packed(o[0].transpose(0, 1))

        cfg = self.fa_config(c.dtype, d, h, h, c.causal)
        calls = {
            "flashattn": (lambda: self.fa_call(cfg, outs, q=[s[0] for s in sets],
                                               k=[s[1] for s in sets], v=[s[2] for s in sets],
                                               cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=L,
                                               max_seqlen_k=L),
                          outs[0], packed, ref),
            "sdpa_cudnn_padded": (lambda: self.padded_call(c, sets), None, padded, ref),
            "flex": (lambda: self.flex_call(c, sets), None, flex_out, ref),
        }
        errs = self.measure_all(row, VARLEN_IMPLS, calls, c.flops, budget_left_s)
        return finish_row(row, errs, False)

    def padded_call(self, c, sets):
        """SDPA cuDNN on the zero-padded batch ([b, h, L, d] views): causal
        is is_causal (right padding), else a boolean key-padding mask."""
        torch, F = self.torch, self.F
        backend, sdpa_kernel = self.sdpa_backend("sdpa_cudnn"), self.sdpa_kernel
        pos = torch.tensor(pad_positions(c.lens, c.max_len), device=self.device)
        views = [tuple(pad_batch(torch, x, pos, c.batch, c.max_len).transpose(1, 2) for x in s)
                 for s in sets]
        mask = None if c.causal else torch.tensor(
            key_mask_rows(c.lens, c.max_len), device=self.device).view(c.batch, 1, 1, c.max_len)

        def run(i):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(*views[i], attn_mask=mask,
                                                      is_causal=c.causal)
        return run

    def flex_call(self, c, sets):
        """torch.compile'd flex_attention over the packed batch as one
        sequence, with the document mask (block mask built here, untimed)."""
        torch = self.torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        doc = torch.tensor(doc_ids(c.lens), device=self.device, dtype=torch.int32)
        causal = c.causal

        def document(b, h, q_idx, kv_idx):
            same = doc[q_idx] == doc[kv_idx]
            return same & (q_idx >= kv_idx) if causal else same

        block_mask = create_block_mask(document, None, None, c.tokens, c.tokens,
                                       device=self.device)
        if self.args.flex_eager:
            fn = flex_attention
        else:
            torch._dynamo.reset()  # one compile per config, never the recompile limit's eager fallback
            fn = torch.compile(flex_attention, fullgraph=True, dynamic=False)
        views = [tuple(x.unsqueeze(0).transpose(1, 2) for x in s) for s in sets]  # [1, h, T, d]

        def run(i):
            return fn(*views[i], block_mask=block_mask)
        return run

    # ---- chunked prefill ------------------------------------------------------------------

    def chunk_sets(self, c, rows):
        """Per set: q [b, new, hq, d]; the K/V pools (drawn contiguous,
        scattered to the shuffled pages, NaN elsewhere); kc/vc gathered back
        from the pools (checked equal to what was drawn on the first set)."""
        torch, dt = self.torch, self.tdt(c.dtype)
        g = self.generator(7919 * c.context + 31 * c.head_dim + (c.dtype == "bf16"))
        out = []
        for n in range(self.args.sets):
            s = {"q": torch.randn((c.batch, c.new, c.heads_q, c.head_dim), device=self.device,
                                  dtype=dt, generator=g)}
            for name in ("k", "v"):
                x = torch.randn((c.batch, c.keys, c.heads_kv, c.head_dim), device=self.device,
                                dtype=dt, generator=g)
                s[name + "p"] = scatter_pages(torch, x, rows, c.num_pages, c.page_size)
                s[name + "c"] = gather_pages(torch, s[name + "p"], rows, c.batch, c.keys)
                if n == 0 and not torch.equal(s[name + "c"], x):
                    raise RuntimeError("the page gather does not give the drawn %s back" % name)
                del x
            out.append(s)
        return out

    def run_chunked(self, c, budget_left_s):
        torch, a = self.torch, self.args
        row = chunked_row(c, a.sets)
        table, rows = chunk_page_rows(c, seed=c.context + c.batch)
        rows = torch.tensor(rows, device=self.device)
        sets = self.chunk_sets(c, rows)
        shape = (c.batch, c.new, c.heads_q, c.head_dim)
        outs = {i: [torch.empty(shape, device=self.device, dtype=self.tdt(c.dtype))
                    for _ in sets] for i in ("flashattn", "flashattn_contig")}
        idx = tuple(torch.tensor(x, device=self.device) for x in common.reference_subset(
            c.batch, c.heads_q, c.new, max_rows=REF_ROWS))
        ref = chunked_reference(torch, c, sets[0]["q"], sets[0]["kc"], sets[0]["vc"], idx)
        cfg = self.fa_config(c.dtype, c.head_dim, c.heads_q, c.heads_kv, True)
        table_t = torch.tensor(table, dtype=torch.int32, device=self.device)
        used = torch.full((c.batch,), c.keys, dtype=torch.int32, device=self.device)

        def qkv(k, v):
            return dict(q=[s["q"] for s in sets], k=[s[k] for s in sets], v=[s[v] for s in sets])

        calls = {
            "flashattn": (lambda: self.fa_call(cfg, outs["flashattn"], block_table=table_t,
                                               seqused_k=used, **qkv("kp", "vp")),
                          outs["flashattn"][0], idx, ref),
            "flashattn_contig": (lambda: self.fa_call(cfg, outs["flashattn_contig"],
                                                      **qkv("kc", "vc")),
                                 outs["flashattn_contig"][0], idx, ref),
        }
        masks = {"sdpa_flash": lambda: self.causal_lower_right(c.new, c.keys),
                 "sdpa_cudnn": lambda: bottom_right_bias(torch, c.new, c.keys,
                                                         self.tdt(c.dtype), self.device)}
        for impl in ("sdpa_flash", "sdpa_cudnn"):
            calls[impl] = ((lambda impl=impl: self.chunk_sdpa_call(impl, c, sets, masks[impl](),
                                                                   row)),
                           None, idx, ref)
        errs = self.measure_all(row, CHUNK_IMPLS, calls, c.flops, budget_left_s)
        return finish_row(row, errs, True)

    def causal_lower_right(self, n_q, n_k):
        from torch.nn.attention.bias import causal_lower_right
        return causal_lower_right(n_q, n_k)

    def chunk_sdpa_call(self, impl, c, sets, mask, row):
        """SDPA with the forced backend on [b, h, s, d] views of q and the
        gathered K/V, GQA through enable_gqa; if the backend refuses that,
        K/V expanded to heads_q beforehand (row['_variant_' + impl] says so)."""
        F = self.F
        backend, sdpa_kernel = self.sdpa_backend(impl), self.sdpa_kernel
        g = c.heads_q // c.heads_kv
        qs = [s["q"].transpose(1, 2) for s in sets]

        def build(expand):
            kv = [tuple((s[n].repeat_interleave(g, dim=2) if expand else s[n]).transpose(1, 2)
                        for n in ("kc", "vc")) for s in sets]

            def run(i):
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(qs[i], *kv[i], attn_mask=mask,
                                                       enable_gqa=not expand)
                return o.transpose(1, 2)  # [b, new, hq, d]
            return run

        run = build(False)
        try:
            run(0)
            self.sync()
            return run
        except Exception as ex:  # e.g. no GQA in this backend: the expanded K/V
            why = common._reason(ex, [])
        run = build(True)
        row["_variant_" + impl] = "K/V expanded to %d heads beforehand (enable_gqa: %s)" % (
            c.heads_q, why[:120])
        return run


class SelfTestBench(PrefillBench):
    """On the CPU: the emulator, SDPA math, host-clock times (no figure)."""

    def __init__(self, torch, fa, args):
        super().__init__(torch, fa, args, device="cpu")

    def sync(self):
        pass

    @staticmethod
    def host_run_ms(run, i):
        t = time.perf_counter()
        run(i)
        return (time.perf_counter() - t) * 1e3

    def one_run_ms(self, run, i):
        return self.host_run_ms(run, i)

    def time_impl(self, run, n_sets, est_ms):
        rot = common.Rotation(n_sets)
        for _ in range(self.args.min_reps):
            i = rot.next()
            rot.record(i, self.host_run_ms(run, i))
        return rot


def run_grid(bench, grid, chunked, time_budget, torch, on_row=None):
    """Every config through bench.run_chunked / run_varlen until the budget
    is spent (the rest recorded as skipped); a config that raises (e.g. out
    of memory building its inputs) is recorded as an error. on_row(rows)
    after each config (the results so far survive a stage's time limit).
    Returns rows."""
    rows = []
    impls = CHUNK_IMPLS if chunked else VARLEN_IMPLS
    deadline = time.time() + time_budget
    for n, c in enumerate(grid):
        t0, left = time.time(), deadline - time.time()
        if left <= 0:
            row = skipped_row(c, chunked, bench.args.sets, "time budget")
        else:
            try:
                row = (bench.run_chunked if chunked else bench.run_varlen)(c, left)
            except Exception as ex:
                row = skipped_row(c, chunked, bench.args.sets, "")
                for i in impls:
                    row[i + "_status"], row[i + "_note"] = "error", common._reason(ex, [])
        rows.append(row)
        print("[%2d/%d] %-34s %s TFLOP/s  tol %s (%.1fs)" % (
            n + 1, len(grid), c.describe(),
            "  ".join("%s %s" % (i, common._f(row.get(i + "_tflops"))) for i in impls),
            {True: "ok", False: "FAIL", None: "-"}[row.get("tol_ok")] +
            (" (" + row["tol_note"] + ")" if row.get("tol_note") else ""),
            time.time() - t0), flush=True)
        if on_row is not None:
            on_row(rows)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def make_grid(a, lens):
    dtypes, head_dims = tuple(a.dtypes.split(",")), int_list(a.head_dims)
    if a.chunked:
        return chunked_grid(int_list(a.contexts), dtypes, head_dims, batch=a.batch,
                            new=a.new_tokens, page_size=a.page_size)
    return varlen_grid(lens, dtypes, head_dims)


def write_results(base, rows, meta, chunked, extra=(), **about_kw):
    write_csv(base + ".csv", rows, meta, chunked)
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
    write_markdown(base + ".md", meta, rows, chunked, extra, **about_kw)


def length_meta(a, lens):
    return "round(LogNormal(ln %g, %g)) in [%d, %d], seed %d, %d tokens: %d seqs, max %d, mean %.0f" % (
        a.len_median, a.len_sigma, a.len_min, a.len_max, a.seed, a.tokens, len(lens), max(lens),
        sum(lens) / len(lens))


def run_bench(args):
    torch = common.import_torch_gpu("bench_varlen", " (--self-test runs without one)")
    fa = common.import_flashattn()
    t_start = time.time()
    bench = PrefillBench(torch, fa, args)
    gpu, info, date, meta = common.run_meta(torch, fa, bench, args)
    try:
        import triton
        meta["triton"] = triton.__version__
    except Exception as ex:
        meta["triton"] = "not importable (%s)" % common._reason(ex, [])[:100]
    lens = draw_lengths(args.tokens, args.len_median, args.len_sigma, args.len_min,
                        args.len_max, args.seed)
    grid = make_grid(args, lens)
    meta["grid"] = "%d configs: %s" % (len(grid), ", ".join(c.describe() for c in grid))
    if not args.chunked:
        meta["lengths"] = length_meta(args, lens)
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, run_base(args, date.strftime("%Y-%m-%d"), gpu))
    print("bench_varlen%s: %s (sm_%d), torch %s, %d configs -> %s.*" % (
        " --chunked" if args.chunked else "", gpu, info.sm, torch.__version__, len(grid), base),
        flush=True)
    if not args.chunked:
        print("  lengths: " + meta["lengths"], flush=True)
    extra = []
    if args.tests_summary and os.path.exists(args.tests_summary):
        with open(args.tests_summary) as f:
            extra.append(("GPU tests", f.read()))

    def write(rows):
        meta["wall_s"] = "%.0f" % (time.time() - t_start)
        write_results(base, rows, meta, args.chunked, extra, **about_kw(args))

    rows = run_grid(bench, grid, args.chunked, args.time_budget, torch, write)
    print("\n" + markdown_table(rows, args.chunked))
    print("\nwrote %s.{csv,json,md} in %.0f s" % (base, time.time() - t_start))
    return 3 if any(r.get("tol_ok") is False for r in rows) else 0


def about_kw(a):
    return dict(median=a.len_median, sigma=a.len_sigma, lo=a.len_min, hi=a.len_max,
                seed=a.seed, tokens=a.tokens, page=a.page_size)


# The self-test's shapes: a few short sequences, pages of 16 over 4 per
# sequence, GQA 4/2, head_dim 64, fp16 (the binding's host path has no bf16).
SELF_TEST_LENS = dict(total=160, median=24, sigma=0.8, lo=4, hi=64, seed=SEED)
SELF_TEST_CHUNK = dict(batch=2, new=24, page_size=16, heads_q=4, heads_kv=2)
SELF_TEST_ABOUT = dict(SELF_TEST_LENS, tokens=SELF_TEST_LENS["total"], hidden=128, page=16,
                       hq=4, hk=2)


def run_self_test(args):
    """Both modes on the CPU (see the module's docstring). 0 when every
    contender ran and every error is within tolerance, else 4."""
    try:
        import torch
    except ImportError as ex:
        raise SystemExit("bench_varlen --self-test: needs PyTorch (%s)" % ex)
    fa = common.import_flashattn()
    args.flex_eager = True
    args.sets, args.warmup, args.min_reps, args.max_reps = 2, 1, 2, 2
    bench = SelfTestBench(torch, fa, args)
    lens = draw_lengths(**SELF_TEST_LENS)
    out_dir = args.out_dir if args.out_dir != os.path.join(HERE, "results") else \
        tempfile.mkdtemp(prefix="bench-varlen-selftest-")
    os.makedirs(out_dir, exist_ok=True)
    meta = {"gpu": "CPU self-test (flashattn emulator, SDPA math, FlexAttention eager)",
            "date": common.today(), "torch": torch.__version__,
            "flashattn_library": os.path.realpath(fa.library_path()),
            "lengths": "%s: %s" % (SELF_TEST_LENS, lens)}
    bad = []
    for chunked in (False, True):
        grid = (chunked_grid((40,), ("fp16",), (64,), **SELF_TEST_CHUNK) if chunked else
                varlen_grid(lens, ("fp16",), (64,), hidden=128))
        rows = run_grid(bench, grid, chunked, 600.0, torch)
        write_results(os.path.join(out_dir, "selftest-" + ("chunked-prefill" if chunked else
                                                           "varlen")),
                      rows, meta, chunked, **SELF_TEST_ABOUT)
        print(markdown_table(rows, chunked) + "\n")
        for r in rows:
            for i in CHUNK_IMPLS if chunked else VARLEN_IMPLS:
                rel = r.get(i + "_rel_err")
                if r.get(i + "_status") != "ok" or rel is None or not rel < common.REL_ERR_LIMIT:
                    bad.append("%s %s: %s %s rel err %s" % (
                        "chunked" if chunked else "varlen", i, r.get(i + "_status"),
                        r.get(i + "_note") or "", rel))
            if r.get("tol_ok") is not True:
                bad.append("tol %s: %s" % (r.get("tol_ok"), r.get("tol_note")))
    print("results in %s" % out_dir)
    print("self-test: %s" % ("ok" if not bad else "FAILED\n  " + "\n  ".join(bad)))
    return 4 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""flashattn decode (fa_decode, paged KV cache) vs PyTorch SDPA, FlashAttention-2 and FlashInfer.

    python3 bench/bench_decode.py [--quick] [--mla] [--time-budget S] [--out-dir bench/results]

One new token per sequence (seqlen_q = 1), bf16, head_dim 128, GQA 32/8, every
sequence of the batch `context` keys long. Grid: batch {1, 8, 64, 256} x
context {512, 4096, 32768} x page size {1, 16}. Per (batch, context) the
K/V cache is drawn once per input set as a contiguous [batch, context, 8,
128] cache and scattered into a shuffled page pool [num_pages, page_size, 8,
128] (NHD; spare pages NaN), so every contender reads the same values:

  flashattn        fa_decode on the page pool (block_table), through the
                   Python binding (bindings/python) on the torch tensors
  flashattn_contig fa_decode on the contiguous cache
  sdpa             torch.nn.functional.scaled_dot_product_attention on the
                   contiguous cache (GQA as 4 query rows per KV head), the
                   backend torch picks
  fa2              flash_attn.flash_attn_with_kvcache on the contiguous cache
                   (its paged path needs page sizes that are multiples of 256)
  flashinfer       flashinfer.BatchDecodeWithPagedKVCacheWrapper on the same
                   page pool (plan() outside the timing, as an engine does
                   once per step for all layers)

Figures: GB/s = (K/V bytes read for the valid keys + Q + O) / median time,
and that as % of the device-to-device copy bandwidth measured in the same
run (a large torch copy, bytes read + written). Correctness first: each
output is poisoned with NaN before its checked run, must come back finite,
and is compared with an fp32 reference on a subset of sequences. Timing:
CUDA events around each call, warm-up, median of >= 20 runs, inputs rotated
over enough sets to exceed L2, the GPU held by a sleep kernel while the host
queues the runs. Writes CSV, JSON and markdown under --out-dir.

--append: the decode step of an engine that appends the new token's K/V
with rotary embedding in the same call (flash_attn_with_kvcache with k=, v=,
rotary_cos=, rotary_sin=): each sequence holds context - 1 cached keys,
the new token's k/v [batch, 1, 8, 128] are rotated (GPT-NeoX pairs, bf16
cos/sin tables, rotary_dim 128) and written at position context - 1, and
the query (rotated at that position) attends to all `context` keys.
Contenders: flashattn (paged and contiguous, fa_decode with k_new/v_new) and
fa2; SDPA and FlashInfer have no fused append (n/a). Bytes add the new
rows' read and write.

--mla: DeepSeek MLA decode (results ...-decode-mla.*): seqlen_q 1,
num_heads_q in --mla-heads (16, 128) over ONE KV head, head_dim 576 (Q, K),
head_dim_v 512, V = the first 512 columns of each latent K row; batch {1, 8,
64, 128} x context {512, 4096, 32768}, pages of 64 keys (FlashMLA's) plus
the contiguous cache [batch, context, 1, 576]:

  flashattn_mla      fa_decode on the page pool, v_cache a view of the K
                     pages (kp[..., :512]: same memory and strides, the
                     library's V-in-K path: each K tile read once)
  flashattn_mla_sepv the same with V a separate copy of K's first 512
                     columns in its own pages (what V in K saves)
  sdpa               SDPA on the contiguous cache, the H query heads as H
                     query rows of the one head: q [b, 1, H, 576], k [b, 1,
                     ctx, 576], v [b, 1, ctx, 512] (a view of k); the
                     backend torch picks is recorded (sdpa_backend)
  flash_mla          flash_mla.flash_mla_with_kvcache on the same K pages
                     when `import flash_mla` works (else n/a)

Every contender is charged the bytes MLA must read at least: K once (batch *
context * 576 * 2; V is inside it) + Q (batch * H * 576 * 2) + O (batch * H
* 512 * 2); FLOPs = 2 * H * context * (576 + 512) per sequence. GB/s, % of
copy and TFLOP/s are reported; flashattn_mla is judged against SDPA and
FlashMLA as above.

Everything above the "GPU part" marker needs only the standard library (the
tests in bench/tests import it without torch).
"""

import argparse
import datetime
import json
import math
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_sdpa as common  # noqa: E402  (torch-free helpers shared with the forward bench)

BATCHES = (1, 8, 64, 256)
CONTEXTS = (512, 4096, 32768)
PAGE_SIZES = (1, 16)
HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
DTYPE = "bf16"
ELEM_BYTES = 2
SPARE_PAGES = 2  # pool pages no sequence uses (NaN): a kernel reading one poisons its output
IMPLS = ("flashattn", "flashattn_contig", "sdpa", "fa2", "flashinfer", "flashattn_fp8")
LABELS = {"flashattn": "flashattn paged", "flashattn_contig": "flashattn contiguous",
          "sdpa": "SDPA (contiguous)", "fa2": "FA2 kvcache (contiguous)",
          "flashinfer": "FlashInfer paged", "flashattn_fp8": "flashattn paged fp8 KV"}
PAGED_IMPLS = ("flashattn", "flashinfer", "flashattn_fp8")  # the others: the contiguous cache
FP8_IMPLS = ("flashattn_fp8",)  # e4m3 cache: its own byte count and reference
FP8_SCALE = 2.0  # the cache holds e4m3(2 * x); descale 0.5 gives x back
ROTATE_BYTES = 256 << 20  # K/V bytes over all input sets: several times any L2 (H100: 50 MB)
MAX_SETS = 64
REL_ERR_LIMIT = common.REL_ERR_LIMIT
ERR_FACTOR = common.ERR_FACTOR

# --mla: DeepSeek MLA decode. One latent KV head of 576 (512 "nope" + 64 rope)
# shared by every query head; V is the first 512 columns of each K row.
MLA_HEADS = (16, 128)
MLA_BATCHES = (1, 8, 64, 128)
MLA_PAGE_SIZES = (64,)  # FlashMLA's page size
MLA_HEAD_DIM, MLA_HEAD_DIM_V = 576, 512
MLA_IMPLS = ("flashattn_mla", "flashattn_mla_sepv", "sdpa", "flash_mla")
MLA_LABELS = {"flashattn_mla": "flashattn paged (V in K)",
              "flashattn_mla_sepv": "flashattn paged (separate V)",
              "sdpa": "SDPA (contiguous)", "flash_mla": "FlashMLA paged"}
MLA_MAX_SETS = 128  # b1 ctx512 holds 0.6 MB of K: 128 sets exceed a 50 MB L2


# ---- configs and arithmetic --------------------------------------------------

class DecodeConfig:
    """One grid point: `batch` sequences of `context` keys each (lens gives
    other lengths), one query token, pages of `page_size` keys."""

    def __init__(self, batch, context, page_size, heads_q=HEADS_Q, heads_kv=HEADS_KV,
                 head_dim=HEAD_DIM, head_dim_v=None, seqlen_q=1, dtype=DTYPE, lens=None,
                 append=False, v_in_k=False):
        if heads_q % heads_kv:
            raise ValueError("heads_q %d is not a multiple of heads_kv %d" % (heads_q, heads_kv))
        if page_size < 1 or batch < 1 or context < 1:
            raise ValueError("batch, context and page_size must be >= 1")
        self.batch, self.context, self.page_size = batch, context, page_size
        self.heads_q, self.heads_kv = heads_q, heads_kv
        self.head_dim, self.head_dim_v = head_dim, head_dim_v or head_dim
        self.seqlen_q, self.dtype = seqlen_q, dtype
        self.append = append  # the last key of each sequence is appended in the call
        # MLA: V is K's first head_dim_v columns (the contiguous cache holds K
        # only; the page pool also gets a separate V copy for the _sepv run).
        self.v_in_k = v_in_k
        if v_in_k and (append or self.head_dim_v > head_dim):
            raise ValueError("v_in_k needs head_dim_v <= head_dim and no append")
        self.fp8 = False  # the GPU part also builds an e4m3 copy of the page pool
        self.lens = list(lens) if lens is not None else [context] * batch
        if len(self.lens) != batch or any(not 0 <= n <= context for n in self.lens):
            raise ValueError("lens must be %d values in [0, %d]" % (batch, context))

    @property
    def kv_width(self):
        """Elements per key and KV head the cache holds: K + V, or with V in
        K (MLA) K's head_dim alone."""
        return self.head_dim + (0 if self.v_in_k else self.head_dim_v)

    @property
    def kv_bytes(self):
        """K and V bytes of the valid keys: each read once (V in K: the K
        rows once, V being part of them)."""
        return sum(self.lens) * self.heads_kv * self.kv_width * ELEM_BYTES

    @property
    def fp8_bytes_moved(self):
        """bytes_moved with a 1-byte (fp8) K/V cache and no append (Q and O
        stay 16-bit)."""
        return self.kv_bytes // ELEM_BYTES + self.q_bytes + self.o_bytes

    @property
    def q_bytes(self):
        return self.batch * self.seqlen_q * self.heads_q * self.head_dim * ELEM_BYTES

    @property
    def o_bytes(self):
        return self.batch * self.seqlen_q * self.heads_q * self.head_dim_v * ELEM_BYTES

    @property
    def bytes_moved(self):
        """The fewest bytes a decode must move: K/V read + Q read + O written
        (block tables, sequence lengths and split-KV partials not counted);
        with the append also the new K/V rows read and written once."""
        return self.kv_bytes + self.q_bytes + self.o_bytes + 2 * self.new_kv_bytes

    @property
    def new_kv_bytes(self):
        """K and V bytes of the appended tokens (one per sequence), or 0."""
        if not self.append:
            return 0
        return self.batch * self.heads_kv * (self.head_dim + self.head_dim_v) * ELEM_BYTES

    @property
    def flops(self):
        """2 FLOP per multiply-add of Q K^T and P V over the valid keys."""
        return 2 * self.seqlen_q * self.heads_q * sum(self.lens) * (self.head_dim + self.head_dim_v)

    def contiguous_bytes(self):
        """K + V of the contiguous cache [batch, context, heads_kv, d] (V in
        K: K alone, V being a view of it)."""
        return self.batch * self.context * self.heads_kv * self.kv_width * ELEM_BYTES

    def pool_pages(self):
        return self.batch * pages_per_seq(self.context, self.page_size) + SPARE_PAGES

    def pool_bytes(self):
        """K + V of the page pool [num_pages, page_size, heads_kv, d] (V in
        K: V is the separate copy the _sepv contender reads)."""
        return self.pool_pages() * self.page_size * self.heads_kv * \
            (self.head_dim + self.head_dim_v) * ELEM_BYTES

    def set_bytes(self):
        """Device memory of one input set: both caches, Q and O (and with fp8
        set, the fp8 page pool)."""
        return (self.contiguous_bytes() + self.pool_bytes() + self.q_bytes + self.o_bytes +
                self.new_kv_bytes + (self.pool_bytes() // ELEM_BYTES if self.fp8 else 0))

    def describe(self):
        return "b%d ctx%d ps%d%s%s" % (self.batch, self.context, self.page_size,
                                       " append" if self.append else "",
                                       " h%d" % self.heads_q if self.v_in_k else "")


def decode_grid(batches=BATCHES, contexts=CONTEXTS, page_sizes=PAGE_SIZES, append=False,
                heads=(HEADS_Q,), **shape):
    """Every grid point, the smallest caches first (a time budget cuts the
    largest), the page sizes (then head counts) of one (batch, context) next
    to each other. shape: more DecodeConfig arguments (mla_grid)."""
    out = [DecodeConfig(b, c, p, heads_q=h, append=append, **shape) for c in contexts
           for b in batches for p in page_sizes for h in heads]
    return sorted(out, key=lambda x: (x.batch * x.context, x.context, x.page_size, x.heads_q))


def mla_grid(batches=MLA_BATCHES, contexts=CONTEXTS, heads=MLA_HEADS, page_sizes=MLA_PAGE_SIZES):
    """--mla: DeepSeek MLA decode points (one KV head of 576, V = its first
    512 columns), the query-head counts of one (batch, context) adjacent."""
    return decode_grid(batches, contexts, page_sizes, heads=heads, heads_kv=1,
                       head_dim=MLA_HEAD_DIM, head_dim_v=MLA_HEAD_DIM_V, v_in_k=True)


def gbps(nbytes, ms):
    """GB/s (1e9 bytes per second) for nbytes moved in ms milliseconds."""
    if ms is None or not ms > 0 or nbytes is None:
        return None
    return nbytes / (ms * 1e-3) / 1e9


def copy_gbps(nbytes, ms):
    """Bandwidth of a device-to-device copy of nbytes: read + written."""
    return gbps(2 * nbytes, ms)


def pct(value, of):
    if value is None or of is None or not of > 0:
        return None
    return 100.0 * value / of


def n_sets_for(kv_bytes_per_set, set_bytes, mem_budget, rotate_bytes=ROTATE_BYTES,
               max_sets=MAX_SETS):
    """Input sets to rotate over: enough that their K/V bytes exceed
    rotate_bytes (so repeated runs do not measure L2), at most max_sets, and
    no more than fit mem_budget. 0 when not even one fits."""
    if set_bytes > mem_budget:
        return 0
    want = max(1, min(max_sets, math.ceil(rotate_bytes / max(1, kv_bytes_per_set))))
    return int(min(want, mem_budget // set_bytes))


def mem_reason(cfg, budget):
    gib = 1024 ** 3
    return "needs %.1f GiB for one input set (contiguous %.1f + pages %.1f), %.1f GiB usable" % (
        cfg.set_bytes() / gib, cfg.contiguous_bytes() / gib, cfg.pool_bytes() / gib, budget / gib)


# ---- the page re-layout ------------------------------------------------------

def pages_per_seq(length, page_size):
    return -(-length // page_size)


def plan_pages(lens, page_size, max_pages=None, seed=0, spare=SPARE_PAGES):
    """(num_pages, block_table): sequence b's page i (keys i*page_size ..
    (i+1)*page_size-1) is pool page block_table[b][i]. Every sequence gets
    max_pages columns (default: the longest sequence's pages); pool pages
    are a seeded shuffle of 0..num_pages-1, num_pages = batch * max_pages +
    spare, so no two entries share a page and `spare` pages are never used."""
    if page_size < 1:
        raise ValueError("page_size must be >= 1")
    need = max([pages_per_seq(n, page_size) for n in lens] + [1])
    max_pages = need if max_pages is None else max_pages
    if max_pages < need:
        raise ValueError("max_pages %d < %d pages of the longest sequence" % (max_pages, need))
    num_pages = len(lens) * max_pages + spare
    perm = list(range(num_pages))
    random.Random(seed).shuffle(perm)
    table = [perm[b * max_pages:(b + 1) * max_pages] for b in range(len(lens))]
    return num_pages, table


def token_rows(block_table, lens, page_size):
    """Per sequence, the pool row (page * page_size + slot, in the pool seen
    as [num_pages * page_size, heads, d]) of each valid key: key j of
    sequence b is row block_table[b][j // page_size] * page_size + j %
    page_size. The GPU part computes the same with torch indexing."""
    return [[block_table[b][j // page_size] * page_size + j % page_size for j in range(n)]
            for b, n in enumerate(lens)]


def flashinfer_csr(block_table, lens, page_size):
    """FlashInfer's page table for the same pages: (indptr [batch + 1],
    indices [sum of pages], last_page_len [batch]) with last_page_len in
    [1, page_size] for a non-empty sequence (0 for an empty one)."""
    indptr, indices, last = [0], [], []
    for row, n in zip(block_table, lens):
        k = pages_per_seq(n, page_size)
        indices.extend(row[:k])
        indptr.append(indptr[-1] + k)
        last.append(0 if n == 0 else n - (k - 1) * page_size)
    return indptr, indices, last


# ---- tolerance -----------------------------------------------------------------

BASELINE_IMPLS = ("sdpa", "fa2", "flashinfer")  # the others' errors set the bar
MLA_BASELINE_IMPLS = ("sdpa", "flash_mla")


def judge(errs, mla=False):
    """(ok, note) for flashattn, paged and contiguous (--mla: V in K and
    separate V), against the fp32 reference: bench_sdpa's rule (relative
    error < 1e-2, max error at most 2x the best of SDPA / FA2 / FlashInfer
    (--mla: SDPA / FlashMLA), never NaN). errs maps impl -> (max_abs, rel).
    ok is None when flashattn paged produced no output."""
    first, second, label = (("flashattn_mla", "flashattn_mla_sepv", "separate V") if mla else
                            ("flashattn", "flashattn_contig", "contiguous"))
    base = {i: errs[i] for i in (MLA_BASELINE_IMPLS if mla else BASELINE_IMPLS) if i in errs}
    ok, note = common.judge_tolerance(errs.get(first), base)
    if ok is None:
        return None, note
    ok2, note2 = common.judge_tolerance(errs.get(second), base)
    notes = [n for n in (note, ("%s: %s" % (label, note2)) if ok2 is False else "") if n]
    # fp8: against the reference on the same fp8 values, relative error only
    # (no other library here reads the same e4m3 cache).
    ok3 = True
    e8 = errs.get("flashattn_fp8")
    if e8 is not None and not (e8[1] < REL_ERR_LIMIT):
        ok3 = False
        notes.append("fp8: rel err %s > %g" % (common._f(e8[1], "%.3g"), REL_ERR_LIMIT))
    return ok and ok2 is not False and ok3, "; ".join(notes)


# ---- CSV and markdown --------------------------------------------------------

CONFIG_FIELDS = ["dtype", "batch", "context", "page_size", "heads_q", "heads_kv", "head_dim",
                 "seqlen_q", "num_pages", "bytes", "kv_bytes", "flops", "n_sets"]
IMPL_FIELDS = ["status", "note", "median_ms", "min_ms", "max_ms", "reps", "gbps", "pct_copy",
               "max_err", "rel_err"]
TAIL_FIELDS = ["copy_gbps", "ratio_vs_flashinfer", "ratio_vs_fa2", "ratio_vs_sdpa",
               "fp8_speedup", "fp8_bytes", "tol_ok", "tol_note"]
FIELDS = CONFIG_FIELDS + ["%s_%s" % (i, f) for i in IMPLS for f in IMPL_FIELDS] + TAIL_FIELDS
# --mla: its own contenders, head_dim_v, TFLOP/s beside GB/s, SDPA's backend.
MLA_CONFIG_FIELDS = CONFIG_FIELDS[:7] + ["head_dim_v"] + CONFIG_FIELDS[7:]
MLA_TAIL_FIELDS = ["copy_gbps", "sdpa_backend", "ratio_vs_sepv", "ratio_vs_sdpa",
                   "ratio_vs_flash_mla", "tol_ok", "tol_note"]
MLA_FIELDS = MLA_CONFIG_FIELDS + ["%s_%s" % (i, f) for i in MLA_IMPLS
                                  for f in IMPL_FIELDS + ["tflops"]] + MLA_TAIL_FIELDS
_INT_FIELDS = {"batch", "context", "page_size", "heads_q", "heads_kv", "head_dim", "seqlen_q",
               "num_pages", "bytes", "kv_bytes", "flops", "n_sets", "fp8_bytes", "head_dim_v"} | \
    {"%s_reps" % i for i in IMPLS + MLA_IMPLS}
_FLOAT_SUFFIXES = ("_ms", "gbps", "pct_copy", "_err", "ratio_vs_flashinfer", "ratio_vs_fa2",
                   "ratio_vs_sdpa", "fp8_speedup", "_tflops", "ratio_vs_sepv",
                   "ratio_vs_flash_mla")


def config_row(cfg, n_sets):
    return {"dtype": cfg.dtype, "batch": cfg.batch, "context": cfg.context,
            "page_size": cfg.page_size, "heads_q": cfg.heads_q, "heads_kv": cfg.heads_kv,
            "head_dim": cfg.head_dim, "seqlen_q": cfg.seqlen_q, "num_pages": cfg.pool_pages(),
            "bytes": cfg.bytes_moved, "kv_bytes": cfg.kv_bytes, "flops": cfg.flops,
            "n_sets": n_sets, "fp8_bytes": cfg.fp8_bytes_moved}


def mla_config_row(cfg, n_sets):
    row = config_row(cfg, n_sets)
    del row["fp8_bytes"]
    row["head_dim_v"] = cfg.head_dim_v
    return row


def _fill_rates(row, impls, copy_bw):
    """Each impl's GB/s and % of copy from its median and the row's bytes."""
    row["copy_gbps"] = copy_bw
    for i in impls:
        nbytes = row.get("fp8_bytes") if i in FP8_IMPLS else row["bytes"]
        row[i + "_gbps"] = gbps(nbytes, row.get(i + "_median_ms"))
        row[i + "_pct_copy"] = pct(row[i + "_gbps"], copy_bw)


def finish_mla_row(row, copy_bw):
    """finish_row for --mla: GB/s (the same bytes for every contender: K
    read once, Q, O), % of copy, TFLOP/s, and flashattn V-in-K's ratios."""
    _fill_rates(row, MLA_IMPLS, copy_bw)
    for i in MLA_IMPLS:
        row[i + "_tflops"] = common.tflops(row["flops"], row.get(i + "_median_ms"))
    for other, key in (("flashattn_mla_sepv", "sepv"), ("sdpa", "sdpa"),
                       ("flash_mla", "flash_mla")):
        row["ratio_vs_" + key] = common.ratio(row.get("flashattn_mla_gbps"),
                                              row.get(other + "_gbps"))
    return row


def finish_row(row, copy_bw):
    """Fills GB/s, % of copy and the ratios from the medians and bytes."""
    _fill_rates(row, IMPLS, copy_bw)
    for other in ("flashinfer", "fa2", "sdpa"):
        row["ratio_vs_" + other] = common.ratio(row.get("flashattn_gbps"), row.get(other + "_gbps"))
    # bf16 paged time / fp8 paged time: 2 would be the halved bytes in full.
    row["fp8_speedup"] = common.ratio(row.get("flashattn_median_ms"),
                                      row.get("flashattn_fp8_median_ms"))
    return row


def write_csv(path, rows, meta, fields=FIELDS):
    """rows: dicts keyed by fields (FIELDS, or MLA_FIELDS; missing = empty);
    meta first as '# key: value'."""
    common.write_csv(path, rows, meta, fields)


def _parse(field, text):
    if text == "":
        return None
    if field == "tol_ok":
        return text == "1"
    if field in _INT_FIELDS:
        return int(text)
    if field.endswith(_FLOAT_SUFFIXES) or field == "copy_gbps":
        return float(text)
    return text


def read_csv(path):
    """(meta, rows) as written by write_csv, numbers parsed back."""
    return common.read_csv(path, _parse)


def impl_cell(row, impl):
    """'GB/s (% of copy)', or the status and its reason."""
    g = row.get(impl + "_gbps")
    if g is not None:
        p = row.get(impl + "_pct_copy")
        return "%.0f (%s)" % (g, "%.0f%%" % p if p is not None else "?")
    st = row.get(impl + "_status") or "n/a"
    note = (row.get(impl + "_note") or "").replace("|", "/")
    return "%s (%s)" % (st, note[:60]) if note else st


def _tol_cell(r):
    tol = {True: "ok", False: "**FAIL**", None: "-"}[r.get("tol_ok")]
    if r.get("tol_note"):
        tol += " " + r["tol_note"].replace("|", "/")
    return tol


def _head_lines(head):
    return [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]


def markdown_table(rows):
    lines = _head_lines(
        "| batch | context | page | MB moved | " + " | ".join(LABELS[i] for i in IMPLS) +
        " | fa/FlashInfer | fa/FA2 | fa/SDPA | fp8/bf16 speed | fa err max / rel | tol |")
    for r in rows:
        tol = _tol_cell(r)
        lines.append("| %d | %d | %d | %.1f | %s | %s | %s | %s | %s | %s / %s | %s |" % (
            r["batch"], r["context"], r["page_size"], r["bytes"] / 1e6,
            " | ".join(impl_cell(r, i) for i in IMPLS),
            common._f(r.get("ratio_vs_flashinfer"), "%.3f"), common._f(r.get("ratio_vs_fa2"), "%.3f"),
            common._f(r.get("ratio_vs_sdpa"), "%.3f"), common._f(r.get("fp8_speedup"), "%.2f"),
            common._f(r.get("flashattn_max_err"), "%.2e"),
            common._f(r.get("flashattn_rel_err"), "%.2e"), tol))
    return "\n".join(lines)


def mla_impl_cell(row, impl):
    """'GB/s (% of copy), TFLOP/s', or the status and its reason."""
    cell = impl_cell(row, impl)
    t = row.get(impl + "_tflops")
    return cell if t is None else "%s, %.1f TF" % (cell, t)


def mla_markdown_table(rows):
    lines = _head_lines(
        "| heads | batch | context | page | MB moved | GFLOP | " +
        " | ".join(MLA_LABELS[i] for i in MLA_IMPLS) +
        " | SDPA backend | fa/sepV | fa/SDPA | fa/FlashMLA | fa err max / rel | tol |")
    for r in rows:
        lines.append("| %d | %d | %d | %d | %.1f | %.2f | %s | %s | %s | %s / %s | %s |" % (
            r["heads_q"], r["batch"], r["context"], r["page_size"], r["bytes"] / 1e6,
            r["flops"] / 1e9, " | ".join(mla_impl_cell(r, i) for i in MLA_IMPLS),
            r.get("sdpa_backend") or "-",
            " | ".join(common._f(r.get("ratio_vs_" + k), "%.3f")
                       for k in ("sepv", "sdpa", "flash_mla")),
            common._f(r.get("flashattn_mla_max_err"), "%.2e"),
            common._f(r.get("flashattn_mla_rel_err"), "%.2e"), _tol_cell(r)))
    return "\n".join(lines)


MLA_ABOUT = (
    "DeepSeek MLA decode: one query token, num_heads_q = `heads` over ONE KV head, head_dim 576 "
    "(Q, K), head_dim_v 512, V = the first 512 columns of each K row, pages of `page` keys. "
    "Bytes (every contender, what MLA must read at least) = batch * context * 576 * 2 (K read "
    "once, V in it) + Q (batch * heads * 576 * 2) + O (batch * heads * 512 * 2); FLOPs = "
    "2 * heads * context * (576 + 512) per sequence. Cells: GB/s (%% of the measured "
    "device-to-device copy bandwidth), TFLOP/s. flashattn V in K: V passed as a view of the K "
    "pages (one K read per tile); separate V: a copy of K's first 512 columns in its own pages. "
    "SDPA: the heads as query rows of one head on the contiguous cache, the backend torch picks. "
    "Ratios are flashattn V in K / the other's GB/s. Errors vs an fp32 reference on the first "
    "and last sequence; tol fails when flashattn's max error exceeds %gx the best of SDPA / "
    "FlashMLA or its relative error exceeds %g." % (ERR_FACTOR, REL_ERR_LIMIT))


META_KEYS = ("commit", "gpu", "sm", "driver", "torch", "cuda", "flash_attn", "flashinfer",
             "flash_mla", "flashattn_library", "flashattn_version", "ptx_compiler", "date", "copy_gbps",
             "copy",
             "n_sets", "min_reps", "grid", "timing")


def write_markdown(path, meta, rows, extra_sections=(), mla=False):
    out = ["# flashattn %s vs SDPA / %s: %s, %s" % (
        "MLA decode" if mla else "decode", "FlashMLA" if mla else "FA2 / FlashInfer",
        meta.get("gpu", "?"), meta.get("date", "?")), ""]
    out += ["- %s: %s" % (k, meta[k]) for k in META_KEYS if k in meta]
    about = (". " + MLA_ABOUT if mla else
             ", head_dim 128, GQA 32/8, one query token, every "
             "sequence `context` keys. Cells: "
             "GB/s = (K/V bytes of the valid keys + Q + O) / median CUDA-event time (fp8 KV: its "
             "K/V bytes are one per element; fp8/bf16 speed = flashattn paged bf16 time / fp8 "
             "time, 2 being the halved bytes in full), and that as %% "
             "of the measured device-to-device copy bandwidth. Ratios are flashattn paged / the "
             "other's GB/s (same bytes, so inverse time ratios). Errors are vs an fp32 reference "
             "on a subset of sequences; tol fails when flashattn's max error exceeds %gx the best "
             "other implementation's or its relative error exceeds %g." % (ERR_FACTOR,
                                                                           REL_ERR_LIMIT))
    out += ["", meta.get("dtype", DTYPE) + about, "",
            (mla_markdown_table if mla else markdown_table)(rows), ""]
    fails = [r for r in rows if r.get("tol_ok") is False]
    out.append("Out of tolerance: %s" % (", ".join(
        "b%d ctx%d ps%d%s" % (r["batch"], r["context"], r["page_size"],
                              " h%d" % r["heads_q"] if mla else "") for r in fails)
        if fails else "none"))
    out.append("")
    for title, body in extra_sections:
        out += ["## %s" % title, "", "```", body.rstrip(), "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def result_base(date, gpu_name, append=False, dtype=DTYPE, mla=False):
    return "%s-%s-decode%s%s%s" % (date, common.slug(gpu_name), "-mla" if mla else "",
                                   "-append" if append else "",
                                   "" if dtype == DTYPE else "-" + dtype)


def run_base(args, date, gpu_name):
    """The base name a run with these options writes (the run and
    --print-base-name both take it from here)."""
    return result_base(date, gpu_name, args.append, args.dtype, args.mla)


# ======================================================================================
# GPU part: everything below needs torch.
# ======================================================================================

class DecodeBench:
    def __init__(self, torch, fa, args):
        self.torch, self.fa, self.args = torch, fa, args
        import torch.nn.functional as F
        self.F = F
        self.rt = fa.Runtime(backend="cuda", cache="memory")
        self.dtype = getattr(args, "dtype", DTYPE)
        self.tdt = torch.bfloat16 if self.dtype == "bf16" else torch.float16
        self.cfg = fa.Config(dtype=self.dtype, head_dim=HEAD_DIM, num_heads_q=HEADS_Q,
                             num_heads_kv=HEADS_KV)
        self.cycles_per_ms = common.calibrate_sleep(self.torch)
        # fp8 (e4m3) KV cache: sm_89+ and a torch with float8_e4m3fn.
        self.fp8, self.fp8_why = False, "no torch.float8_e4m3fn"
        if self.rt.info.sm < 89:
            self.fp8_why = "fp8 KV needs sm_89+, this is sm_%d" % self.rt.info.sm
        elif hasattr(torch, "float8_e4m3fn"):
            self.cfg8 = fa.Config(dtype=self.dtype, head_dim=HEAD_DIM, num_heads_q=HEADS_Q,
                                  num_heads_kv=HEADS_KV, kv_dtype="e4m3")
            self.fp8, self.fp8_why = True, None
        try:
            from flash_attn import flash_attn_with_kvcache
            self.fa2, self.fa2_why = flash_attn_with_kvcache, None
        except Exception as ex:  # not installed, or built for another torch
            self.fa2, self.fa2_why = None, common._reason(ex, [])
        try:
            import flashinfer
            self.flashinfer, self.flashinfer_why = flashinfer, None
            self.fi_workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        except Exception as ex:
            self.flashinfer, self.flashinfer_why = None, common._reason(ex, [])
        if getattr(args, "mla", False):
            try:
                import flash_mla
                self.flash_mla, self.flash_mla_why = flash_mla, None
            except Exception as ex:
                self.flash_mla, self.flash_mla_why = None, common._reason(ex, [])
        self.mla_cfgs = {}  # num_heads_q -> the MLA fa.Config

    def copy_bandwidth(self, nbytes):
        """Device-to-device copy of nbytes (torch copy_), median of 20 after
        warm-up: (median ms, GB/s counting bytes read + written)."""
        torch = self.torch
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        torch.cuda.synchronize()
        times = []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dst.copy_(src)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        ok = bool(torch.equal(src[-4096:], dst[-4096:]))
        del src, dst
        ms = common.median(times)
        return ms, copy_gbps(nbytes, ms), ok

    # ---- inputs ---------------------------------------------------------------------

    def make_set(self, cfg, gen, table):
        """One input set: q, the contiguous caches, the page pools (the same
        values scattered to the shuffled pages, NaN elsewhere), O buffers."""
        torch = self.torch
        bf = self.tdt
        B, L, H, D, Dv = cfg.batch, cfg.context, cfg.heads_kv, cfg.head_dim, cfg.head_dim_v
        q = torch.randn((B, 1, cfg.heads_q, D), device="cuda", dtype=bf, generator=gen)
        k = torch.randn((B, L, H, D), device="cuda", dtype=bf, generator=gen)
        if cfg.v_in_k:  # MLA: V is a view of K's first Dv columns (same memory and strides)
            v = k[..., :Dv]
        else:
            v = torch.randn((B, L, H, Dv), device="cuda", dtype=bf, generator=gen)
        P, ps = cfg.pool_pages(), cfg.page_size
        # Row of key j of sequence b in the pool seen as [P * ps, H, D]
        # (token_rows() above); every sequence here has all L keys.
        j = torch.arange(L, device="cuda")
        rows = (table[:, j // ps].long() * ps + (j % ps)).reshape(-1)
        kp = torch.full((P, ps, H, D), float("nan"), device="cuda", dtype=bf)
        kp.view(P * ps, H, D)[rows] = k.reshape(B * L, H, D)
        if cfg.v_in_k:  # the separate V pages (_sepv): a copy of K's columns, NaN pages too
            vp = kp[..., :Dv].clone()
        else:
            vp = torch.full((P, ps, H, Dv), float("nan"), device="cuda", dtype=bf)
            vp.view(P * ps, H, Dv)[rows] = v.reshape(B * L, H, Dv)
        # flashattn writes into these (poisoned before its checked run); the
        # others return fresh tensors, taken as they are (no extra copy kernel
        # in the timed region).
        o = {i: torch.empty((B, 1, cfg.heads_q, Dv), device="cuda", dtype=bf)
             for i in (MLA_IMPLS[:2] if cfg.v_in_k else ("flashattn", "flashattn_contig"))}
        out = {"q": q, "k": k, "v": v, "kp": kp, "vp": vp, "o": o}
        if cfg.fp8:  # e4m3(2 x) pools, the same pages, NaN spare pages
            out["kp8"], out["vp8"] = self.to_fp8(kp), self.to_fp8(vp)
            out["o"]["flashattn_fp8"] = torch.empty((B, 1, cfg.heads_q, D), device="cuda", dtype=bf)
        if cfg.append:  # the new token's K/V, written at key L - 1 by the call
            out["k_new"] = torch.randn((B, 1, H, D), device="cuda", dtype=bf, generator=gen)
            out["v_new"] = torch.randn((B, 1, H, D), device="cuda", dtype=bf, generator=gen)
        return out

    def to_fp8(self, x):
        """e4m3(FP8_SCALE * x), converted in slices of the first dim (no
        full-size temporary)."""
        torch = self.torch
        out = torch.empty(x.shape, device="cuda", dtype=torch.float8_e4m3fn)
        step = max(1, (64 << 20) // max(1, x[0].numel()))
        for i in range(0, x.shape[0], step):
            out[i:i + step] = (x[i:i + step].float() * FP8_SCALE).to(torch.float8_e4m3fn)
        return out

    def rope_tables(self, cfg):
        """bf16 cos/sin [context, head_dim / 2] (theta 10000), as FA2 wants
        them (the q dtype)."""
        torch = self.torch
        inv = 10000.0 ** (-torch.arange(0, cfg.head_dim, 2, device="cuda").double() / cfg.head_dim)
        ang = torch.arange(cfg.context, device="cuda").double()[:, None] * inv[None, :]
        return ang.cos().to(self.tdt), ang.sin().to(self.tdt)

    def rotate(self, x, cos, sin):
        """GPT-NeoX rotation of x [..., d] (fp32) by cos/sin rows [..., d/2]."""
        h = x.shape[-1] // 2
        x0, x1 = x[..., :h], x[..., h:]
        c, s = cos.float(), sin.float()
        return self.torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)

    def reference(self, cfg, s, seqs, fp8=False):
        """fp32 reference O [len(seqs), 1, heads_q, d] of sequences seqs (fp8:
        on the e4m3 values the fp8 cache holds, descaled)."""
        torch = self.torch
        idx = torch.tensor(seqs, device="cuda")
        g = cfg.heads_q // cfg.heads_kv
        q = s["q"].index_select(0, idx).float()
        k = s["k"].index_select(0, idx).float()
        v = s["v"].index_select(0, idx).float()
        if fp8:
            f8 = torch.float8_e4m3fn
            k = (k * FP8_SCALE).to(f8).float() / FP8_SCALE
            v = (v * FP8_SCALE).to(f8).float() / FP8_SCALE
        if cfg.append:  # the new token at L - 1, Q and its K rotated there (bf16-rounded K)
            cos, sin = (t[cfg.context - 1] for t in self.rope_tables(cfg))
            q = self.rotate(q, cos, sin)
            k = k.clone()
            v = v.clone()
            k[:, -1:] = self.rotate(s["k_new"].index_select(0, idx).float(), cos, sin).to(
                self.tdt).float()
            v[:, -1:] = s["v_new"].index_select(0, idx).float()
        q = q.view(len(seqs), cfg.heads_kv, g, cfg.head_dim)
        k = k.transpose(1, 2)  # [n, Hkv, L, D]
        v = v.transpose(1, 2)  # [n, Hkv, L, Dv]
        p = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(cfg.head_dim), dim=-1)
        return torch.matmul(p, v).reshape(len(seqs), 1, cfg.heads_q, cfg.head_dim_v)

    # ---- contenders ------------------------------------------------------------------

    def make_call(self, impl, cfg, sets, meta):
        """A function run(i) that launches impl on input set i and returns O."""
        torch, F = self.torch, self.F
        stream = torch.cuda.current_stream()
        B, Hq, Hk, D, Dv = cfg.batch, cfg.heads_q, cfg.heads_kv, cfg.head_dim, cfg.head_dim_v
        if impl in ("flashattn", "flashattn_contig") + MLA_IMPLS[:2]:
            decode, rt = self.fa.decode, self.rt
            fcfg = self.mla_config(cfg) if cfg.v_in_k else self.cfg
            paged = impl != "flashattn_contig"
            # flashattn_mla: V as a view of the K pages (same memory and
            # strides: the library's V-in-K path); the others their own V.
            vps = [s["kp"][..., :Dv] if impl == "flashattn_mla" else s["vp"] for s in sets]
            lse = [torch.empty((B, Hq, 1), device="cuda", dtype=torch.float32) for _ in sets]
            fused = getattr(self.args, "fused", False)

            def run(i):
                s = sets[i]
                kw = {"split_counters": True} if fused else {}
                if cfg.append:
                    kw.update(k_new=s["k_new"], v_new=s["v_new"], rotary_cos=meta["cos"],
                              rotary_sin=meta["sin"])
                if paged:
                    decode(rt, fcfg, s["q"], s["kp"], vps[i], meta["seqlens"],
                           block_table=meta["table"], out=s["o"][impl], lse=lse[i], stream=stream,
                           **kw)
                else:
                    decode(rt, fcfg, s["q"], s["k"], s["v"], meta["seqlens"], out=s["o"][impl],
                           lse=lse[i], stream=stream, **kw)
                return s["o"][impl]
            return run
        if impl == "flashattn_fp8":
            if not self.fp8:
                raise RuntimeError(self.fp8_why)
            if cfg.append:
                raise RuntimeError("flashattn refuses an append into an fp8 cache (0.5)")
            if not cfg.fp8:
                raise RuntimeError("no memory for the fp8 pool beside the bf16 caches")
            decode, rt, fcfg = self.fa.decode, self.rt, self.cfg8
            lse = [torch.empty((B, Hq, 1), device="cuda", dtype=torch.float32) for _ in sets]
            ds = torch.full((1,), 1.0 / FP8_SCALE, device="cuda", dtype=torch.float32)

            def run(i):
                s = sets[i]
                decode(rt, fcfg, s["q"], s["kp8"], s["vp8"], meta["seqlens"],
                       block_table=meta["table"], out=s["o"][impl], lse=lse[i], stream=stream,
                       k_descale=ds, v_descale=ds)
                return s["o"][impl]
            return run
        if cfg.append and impl in ("sdpa", "flashinfer"):
            raise RuntimeError("no fused KV append + RoPE in this library's decode")
        if impl == "sdpa":
            g = Hq // Hk
            # GQA without expanding K/V: the g query heads of a KV head are g
            # query rows of that head (non-causal: the token sees every key).
            views = [(s["q"].view(B, Hk, g, D), s["k"].transpose(1, 2), s["v"].transpose(1, 2))
                     for s in sets]

            if cfg.v_in_k:  # --mla: the H query heads as H query rows of the one KV head
                meta["sdpa_backend"] = self.sdpa_choice(*views[0])

            def run(i):
                q, k, v = views[i]
                return F.scaled_dot_product_attention(q, k, v).view(B, 1, Hq, Dv)
            return run
        if impl == "flash_mla":
            return self.flash_mla_call(cfg, sets, meta)
        if impl == "fa2":
            if self.fa2 is None:
                raise RuntimeError("flash_attn not importable: " + self.fa2_why)
            f = self.fa2

            def run(i):
                s = sets[i]
                if cfg.append:
                    return f(s["q"], s["k"], s["v"], k=s["k_new"], v=s["v_new"],
                             rotary_cos=meta["cos"], rotary_sin=meta["sin"],
                             cache_seqlens=meta["seqlens"], rotary_interleaved=False)
                return f(s["q"], s["k"], s["v"], cache_seqlens=meta["seqlens"])
            return run
        if impl == "flashinfer":
            if self.flashinfer is None:
                raise RuntimeError("flashinfer not importable: " + self.flashinfer_why)
            w = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.fi_workspace, "NHD")
            indptr, indices, last = meta["fi_csr"]
            plan = getattr(w, "plan", None) or w.begin_forward
            try:
                plan(indptr, indices, last, Hq, Hk, D, cfg.page_size, pos_encoding_mode="NONE",
                     q_data_type=self.tdt, kv_data_type=self.tdt)
            except TypeError:  # older FlashInfer: data_type=
                plan(indptr, indices, last, Hq, Hk, D, cfg.page_size, pos_encoding_mode="NONE",
                     data_type=self.tdt)
            fwd = getattr(w, "run", None) or w.forward
            qs = [s["q"].view(B, Hq, D) for s in sets]

            def run(i):
                s = sets[i]
                return fwd(qs[i], (s["kp"], s["vp"])).view(B, 1, Hq, D)
            return run
        raise ValueError(impl)

    def mla_config(self, cfg):
        if cfg.heads_q not in self.mla_cfgs:
            self.mla_cfgs[cfg.heads_q] = self.fa.Config(
                dtype=self.dtype, head_dim=cfg.head_dim, head_dim_v=cfg.head_dim_v,
                num_heads_q=cfg.heads_q, num_heads_kv=cfg.heads_kv)
        return self.mla_cfgs[cfg.heads_q]

    def sdpa_choice(self, q, k, v):
        """The SDPA backend torch picks for these inputs (its own dispatch,
        torch._fused_sdp_choice), by name."""
        torch = self.torch
        try:
            choice = int(torch._fused_sdp_choice(q, k, v))
            try:
                from torch.nn.attention import SDPBackend
            except ImportError:  # torch < 2.3
                from torch.backends.cuda import SDPBackend
            names = {int(getattr(m, "value", m)): n for n, m in SDPBackend.__members__.items()}
            return names.get(choice, str(choice)).lower()
        except Exception as ex:
            return "unknown (%s)" % common._reason(ex, [])[:80]

    def flash_mla_call(self, cfg, sets, meta):
        """FlashMLA (deepseek-ai/FlashMLA) on the same K pages; V is K's
        first head_dim_v columns by design. get_mla_metadata as its README:
        older releases plan the tile schedule here, newer ones return an empty
        schedule filled by the first call (the checked run, before timing)."""
        if self.flash_mla is None:
            raise RuntimeError("flash_mla not importable: " + self.flash_mla_why)
        if cfg.page_size != 64:
            raise RuntimeError("FlashMLA's pages hold 64 keys, not %d" % cfg.page_size)
        fm = self.flash_mla
        sched, splits = fm.get_mla_metadata(meta["seqlens"], cfg.seqlen_q * cfg.heads_q //
                                            cfg.heads_kv, cfg.heads_kv)

        def run(i):
            s = sets[i]
            return fm.flash_mla_with_kvcache(s["q"], s["kp"], meta["table"], meta["seqlens"],
                                             cfg.head_dim_v, sched, splits, causal=True)[0]
        return run

    # ---- timing ------------------------------------------------------------------------

    def time_impl(self, run, n_sets, est_ms):
        """Warm-up, then reps runs rotated over the sets, each between CUDA
        events, queued behind a sleep kernel. Returns a Rotation."""
        torch, a = self.torch, self.args
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        nw = max(a.warmup, min(50, int(math.ceil(25.0 / max(est_ms, 1e-3)))))
        t0 = time.perf_counter()
        s.record()
        for i in range(nw):
            run(i % n_sets)
        e.record()
        host_ms = (time.perf_counter() - t0) * 1e3 / nw
        e.synchronize()
        gpu_ms = s.elapsed_time(e) / nw
        reps = common.choose_reps(gpu_ms, a.target_ms, a.min_reps, a.max_reps)
        rot = common.Rotation(n_sets)
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(reps)]
        if self.cycles_per_ms:
            torch.cuda._sleep(int(min(1000.0, reps * host_ms * 1.5 + 2.0) * self.cycles_per_ms))
        idx = []
        for es, ee in evs:
            i = rot.next()
            idx.append(i)
            es.record()
            run(i)
            ee.record()
        torch.cuda.synchronize()
        for i, (es, ee) in zip(idx, evs):
            rot.record(i, es.elapsed_time(ee))
        return rot

    def one_run_ms(self, run, i):
        torch = self.torch
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        s.record()
        run(i)
        e.record()
        e.synchronize()
        return s.elapsed_time(e)

    # ---- one grid point ----------------------------------------------------------------

    def run_config(self, cfg, n_sets, copy_bw):
        torch = self.torch
        if cfg.lens != [cfg.context] * cfg.batch:
            raise ValueError("the GPU part fills every sequence to the context length")
        mla = cfg.v_in_k
        row = (mla_config_row if mla else config_row)(cfg, n_sets)
        gen = torch.Generator(device="cuda").manual_seed(
            1000003 * cfg.batch + 1009 * cfg.context + cfg.page_size)
        _, table = plan_pages(cfg.lens, cfg.page_size, seed=cfg.batch * 31 + cfg.context)
        table_t = torch.tensor(table, dtype=torch.int32, device="cuda")
        before = [n - 1 for n in cfg.lens] if cfg.append else cfg.lens  # append: the length before
        meta = {"table": table_t,
                "seqlens": torch.tensor(before, dtype=torch.int32, device="cuda"),
                "fi_csr": tuple(torch.tensor(x, dtype=torch.int32, device="cuda")
                                for x in flashinfer_csr(table, cfg.lens, cfg.page_size))}
        if cfg.append:
            meta["cos"], meta["sin"] = self.rope_tables(cfg)
        sets = [self.make_set(cfg, gen, table_t) for _ in range(n_sets)]
        seqs = sorted({0, cfg.batch - 1})
        ref16 = self.reference(cfg, sets[0], seqs)
        ref8 = self.reference(cfg, sets[0], seqs, fp8=True) if cfg.fp8 else None
        idx = torch.tensor(seqs, device="cuda")
        errs = {}
        for impl in MLA_IMPLS if mla else IMPLS:
            ref = ref8 if impl in FP8_IMPLS else ref16
            p = impl + "_"
            try:
                with common._Warnings() as w:
                    run = self.make_call(impl, cfg, sets, meta)
                    if impl in sets[0]["o"]:  # poison: every element must be written
                        sets[0]["o"][impl].fill_(float("nan"))
                    o = run(0)
                    torch.cuda.synchronize()
            except Exception as ex:
                row[p + "status"], row[p + "note"] = "n/a", common._reason(ex, w.messages)
                continue
            finite = bool(torch.isfinite(o).all().item())
            d = o.index_select(0, idx).float() - ref
            errs[impl] = (d.abs().max().item(), (d.norm() / ref.norm()).item())
            row[p + "max_err"], row[p + "rel_err"] = errs[impl]
            if not finite:
                row[p + "note"] = "non-finite output (unwritten, or a NaN page read)"
                errs[impl] = (float("nan"), float("nan"))
            try:
                est = self.one_run_ms(run, 1 % n_sets)
                rot = self.time_impl(run, n_sets, est)
            except Exception as ex:
                row[p + "status"], row[p + "note"] = "error", common._reason(ex, [])
                continue
            sm = rot.summary()
            row[p + "status"] = "ok"
            row[p + "median_ms"], row[p + "min_ms"] = sm["median_ms"], sm["min_ms"]
            row[p + "max_ms"], row[p + "reps"] = sm["max_ms"], sm["reps"]
            if not rot.balanced():
                row[p + "note"] = (row.get(p + "note") or "") + " unbalanced rotation"
        row["tol_ok"], row["tol_note"] = judge(errs, mla)
        if mla:
            row["sdpa_backend"] = meta.get("sdpa_backend")
        del sets, ref16, ref8
        return (finish_mla_row if mla else finish_row)(row, copy_bw)


def versions(torch, mla=False):
    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for mod, key in (("flash_attn", "flash_attn"), ("flashinfer", "flashinfer")) + (
            (("flash_mla", "flash_mla"),) if mla else ()):
        try:
            m = __import__(mod)
            out[key] = getattr(m, "__version__", "?")
        except Exception as ex:
            out[key] = "not importable (%s)" % common._reason(ex, [])[:120]
    return out


def run_bench(args):
    torch = common.import_torch_gpu("bench_decode")
    fa = common.import_flashattn()
    t_start = time.time()
    bench = DecodeBench(torch, fa, args)
    smi_name, smi_driver = common.nvidia_smi()
    gpu = torch.cuda.get_device_name(0)
    info = bench.rt.info
    date = datetime.datetime.now(datetime.timezone.utc)
    meta = {"commit": common.git_commit(), "gpu": gpu, "sm": info.sm, "num_sms": info.num_sms,
            "driver": smi_driver or "cuDriverGetVersion %d (no nvidia-smi)" % info.driver_version,
            "cuda_driver_api": info.driver_version}
    mla = args.mla
    impls, finish, new_row = ((MLA_IMPLS, finish_mla_row, mla_config_row) if mla else
                              (IMPLS, finish_row, config_row))
    max_sets = MLA_MAX_SETS if mla else MAX_SETS
    meta.update(versions(torch, mla))
    meta.update({"flashattn_library": os.path.realpath(fa.library_path()),
                 "flashattn_version": fa.version(),
                 "ptx_compiler": common.ptx_compiler_meta(bench.rt),
                 "date": date.strftime("%Y-%m-%d %H:%M:%S UTC"), "min_reps": args.min_reps,
                 "python": sys.version.split()[0],
                 "timing": "CUDA events per call, median; %s while queuing" % (
                     "torch.cuda._sleep hold" if bench.cycles_per_ms else "no sleep hold")})
    copy_ms, copy_bw, copy_ok = bench.copy_bandwidth(args.copy_mib << 20)
    meta["copy_gbps"] = "%.1f" % copy_bw
    meta["copy"] = "torch copy_ of %d MiB, median %.3f ms, (read + write) / time%s" % (
        args.copy_mib, copy_ms, "" if copy_ok else " (COPY CHECK FAILED)")
    axes = [int_list(a) for a in (args.batches, args.contexts, args.page_sizes)]
    if mla:
        grid = mla_grid(axes[0], axes[1], int_list(args.mla_heads), axes[2])
    else:
        grid = decode_grid(*axes, append=args.append)
    meta["grid"] = "%sbatch %s x context %s x page size %s: %d configs" % (
        "heads %s x " % args.mla_heads if mla else "", args.batches, args.contexts,
        args.page_sizes, len(grid))
    meta["n_sets"] = "enough for %d MiB of K/V, at most %d" % (ROTATE_BYTES >> 20, max_sets)
    os.makedirs(args.out_dir, exist_ok=True)
    for cfg in grid:
        cfg.dtype = args.dtype
    meta["dtype"] = args.dtype
    meta["fused"] = "split_counters (FLASHATTN_DECODE_FUSED=%s)" % os.environ.get(
        "FLASHATTN_DECODE_FUSED", "1") if getattr(args, "fused", False) else "no"
    base = os.path.join(args.out_dir, run_base(args, date.strftime("%Y-%m-%d"), gpu))
    print("bench_decode: %s (sm_%d), torch %s, copy %.0f GB/s, %d configs -> %s.*" % (
        gpu, info.sm, torch.__version__, copy_bw, len(grid), base), flush=True)
    rows = []
    deadline = time.time() + args.time_budget
    for n, cfg in enumerate(grid):
        t0 = time.time()
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        budget = int(free * 0.9) - (256 << 20)
        cfg.fp8 = bench.fp8 and not cfg.append and not mla
        n_sets = n_sets_for(cfg.kv_bytes, cfg.set_bytes(), budget, max_sets=max_sets)
        if n_sets == 0 and cfg.fp8:  # the bf16 contenders without the fp8 pool
            cfg.fp8 = False
            n_sets = n_sets_for(cfg.kv_bytes, cfg.set_bytes(), budget, max_sets=max_sets)
        if time.time() > deadline or n_sets == 0:
            row = new_row(cfg, n_sets)
            why = "time budget" if time.time() > deadline else mem_reason(cfg, budget)
            for i in impls:
                row[i + "_status"], row[i + "_note"] = "skipped", why
            row = finish(row, copy_bw)
            print("[%2d/%d] %-20s skipped: %s" % (n + 1, len(grid), cfg.describe(), why), flush=True)
        else:
            try:
                row = bench.run_config(cfg, n_sets, copy_bw)
            except Exception as ex:  # e.g. out of memory while building the sets
                row = finish(new_row(cfg, n_sets), copy_bw)
                for i in impls:
                    row[i + "_status"], row[i + "_note"] = "error", common._reason(ex, [])
            print("[%2d/%d] %-20s %s  tol %s (%d sets, %.1fs)" % (
                n + 1, len(grid), cfg.describe(),
                "  ".join("%s %s" % (i, common._f(row.get(i + "_gbps"), "%.0f")) for i in impls),
                {True: "ok", False: "FAIL", None: "-"}[row.get("tol_ok")] +
                (" (" + row["tol_note"] + ")" if row.get("tol_note") else ""),
                n_sets, time.time() - t0), flush=True)
        rows.append(row)
    meta["wall_s"] = "%.0f" % (time.time() - t_start)
    write_csv(base + ".csv", rows, meta, MLA_FIELDS if mla else FIELDS)
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
    extra = []
    if args.tests_summary and os.path.exists(args.tests_summary):
        with open(args.tests_summary) as f:
            extra.append(("GPU tests (bench/run_gpu.sh)", f.read()))
    write_markdown(base + ".md", meta, rows, extra, mla)
    print("\n" + (mla_markdown_table if mla else markdown_table)(rows))
    print("\nwrote %s.{csv,json,md} in %.0f s" % (base, time.time() - t_start))
    return 3 if any(r.get("tol_ok") is False for r in rows) else 0


def _csv(values):
    return ",".join(map(str, values))


def int_list(text):
    """'1,8,64' -> (1, 8, 64)."""
    return tuple(int(x) for x in text.split(","))


def check_int_lists(p, a, *names):
    """p.error unless each option a.<name> is comma-separated integers >= 1."""
    for name in names:
        try:
            vals = int_list(getattr(a, name))
        except ValueError:
            p.error("--%s: comma-separated integers" % name.replace("_", "-"))
        if not vals or min(vals) < 1:
            p.error("--%s: values must be >= 1" % name.replace("_", "-"))


def print_base_name(args):
    """The base name the run with the same options writes (run_gpu.sh copies
    those files to $OUT)."""
    print(run_base(args, common.today(), common.gpu_name()))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--batches", default=None, help="default %s (--mla: %s)" % (
        _csv(BATCHES), _csv(MLA_BATCHES)))
    p.add_argument("--contexts", default=_csv(CONTEXTS))
    p.add_argument("--page-sizes", default=None, help="default %s (--mla: %s)" % (
        _csv(PAGE_SIZES), _csv(MLA_PAGE_SIZES)))
    common.add_timing_args(p, max_reps=200, target_ms=100.0, time_budget=240.0)
    p.add_argument("--copy-mib", type=int, default=2048, help="size of the copy-bandwidth test")
    p.add_argument("--quick", action="store_true", help="batch 1,64 x context 512,4096")
    p.add_argument("--tests-summary", default=None, help="text file appended to the markdown")
    p.add_argument("--print-base-name", action="store_true")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default=DTYPE,
                   help="Q/O (and the 16-bit caches') dtype; results named ...-decode-fp16")
    p.add_argument("--append", action="store_true",
                   help="the decode step with the new token's K/V appended and RoPE (see above)")
    p.add_argument("--mla", action="store_true",
                   help="DeepSeek MLA decode (576/512, one KV head, V in K; see above), results "
                        "named ...-decode-mla")
    p.add_argument("--mla-heads", default=_csv(MLA_HEADS), help="--mla: query head counts")
    p.add_argument("--fused", action="store_true",
                   help="flashattn's fa_decode with split_counters (0.8: the combine fused into "
                        "the decode kernel's last CTA of each row, one launch); with "
                        "FLASHATTN_DECODE_FUSED=0 the same calls run the two launches")
    a = p.parse_args(argv)
    if a.mla and a.append:
        p.error("--mla has no --append (V in K excludes the append)")
    if a.batches is None:
        a.batches = _csv(MLA_BATCHES if a.mla else BATCHES)
    if a.page_sizes is None:
        a.page_sizes = _csv(MLA_PAGE_SIZES if a.mla else PAGE_SIZES)
    if a.quick:
        a.batches, a.contexts = "1,64", "512,4096"
    if a.min_reps < 20:
        p.error("--min-reps must be >= 20 (the method asks for a median of at least 20 runs)")
    check_int_lists(p, a, "batches", "contexts", "page_sizes", "mla_heads")
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.print_base_name:
        print_base_name(a)
        return 0
    return run_bench(a)


if __name__ == "__main__":
    sys.exit(main())

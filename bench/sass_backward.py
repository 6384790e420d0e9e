#!/usr/bin/env python3
"""The backward kernels through ../shared/perf/sass-report's census and MODEL.

sass-report's --extra takes forward and decode kernels only (its option
parser refuses `--kind backward`), so this runs the tool's own analysis
(analyse_ours) and table rows (census_row, derived_row, model_row) with only
that parser widened to the backward kinds, in this process; the shared tool is
not modified. The kernel describes itself to the model in its `// perf:` line
(block_n: the query block each iteration streams in). Needs what sass-report
needs (python3, ptxas; NVDISASM or sass-report's private venv).

  python3 bench/sass_backward.py --flashattn build/tools/flashattn --sm 90 \\
      --extra '--kind backward --dtype bf16 --heads-q 16 --heads-kv 16 --head-dim 128'

With FLASHATTN_SM90_BACKWARD=0 in the environment, sm_90 gives the mma.sync
backward (the before of the sm_90a kernel).
"""
import argparse
import os
import shlex
import sys
import tempfile

sys.dont_write_bytecode = True
PERF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "perf")
sys.path.insert(0, os.environ.get("FA_SASS_REPORT_DIR", PERF))
import sass_report as sr  # noqa: E402

KINDS = ("forward", "decode", "backward-pre", "backward", "backward-post")


def parse_extra(text, sms):
    """sass-report's --extra, with the backward kinds."""
    p = argparse.ArgumentParser(prog="--extra", add_help=False)
    p.add_argument("--kind", default="forward", choices=KINDS)
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--head-dim", type=int, required=True)
    p.add_argument("--head-dim-v", type=int, default=0)
    p.add_argument("--heads-q", type=int, default=16)
    p.add_argument("--heads-kv", type=int, default=16)
    p.add_argument("--sm", type=int)
    p.add_argument("--causal", action="store_true")
    a, rest = p.parse_known_args(shlex.split(text))
    for sm in ([a.sm] if a.sm else sms):
        yield sr.Spec(a.kind, sm, a.head_dim, a.dtype, a.head_dim_v, a.heads_q, a.heads_kv,
                      a.causal, rest, extra=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flashattn", required=True)
    ap.add_argument("--sm", type=sr.csv_list(int, {80, 90, 100}), default=[80, 90])
    ap.add_argument("--extra", action="append", default=[], required=True)
    ap.add_argument("--param", action="append", default=[], type=sr.parse_param)
    ap.add_argument("--out", help="keep the PTX, cubins and SASS here")
    a = ap.parse_args(argv)
    sr.parse_extra = parse_extra
    o = argparse.Namespace(flashattn=os.path.abspath(a.flashattn), sm=a.sm, kernels=[],
                           extra=a.extra, param=a.param,
                           ptxas=os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"),
                                              "bin", "ptxas"))
    work = a.out or tempfile.mkdtemp(prefix="sass-backward.")
    os.makedirs(work, exist_ok=True)
    _, variants, same = sr.analyse_ours(o, work)
    for s, f, t in same:
        print("- `%s` has the same PTX as `%s`." % (s.label(t), f.label(t)))
    for r in variants:
        for w in r["s"].get("warnings", []):
            print("- WARNING %s: %s" % (r["label"], w))
    print("\n| kernel | entry | regs | spills (st/ld B) | tile | smem/CTA | main loop (header, "
          "instr, paths) |\n|---|---|---|---|---|---|---|")
    for r in variants:
        k, px, loop = r["cfg"], r["ptxas"], r["s"]["loop"]
        print("| %s | `%s` | %s | %d / %d | %dx%d | %d B | %s, %d, %d |" % (
            r["label"], r["s"]["kernel"], r["s"]["regs"], px.get("spill_st", 0),
            px.get("spill_ld", 0), k["block_m"], k["block_n"], k["smem"], loop["header"],
            loop["insns"], loop["paths"]))
    for head, row in ((sr.CENSUS_HEAD, sr.census_row), (sr.DERIVED_HEAD, sr.derived_row),
                      (sr.MODEL_HEAD, sr.model_row)):
        print("\n" + head)
        for r in variants:
            print(row(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The same forward kernels compiled two ways, timed in one process on one GPU:
cubins from the PTX compiler plugin (libflashattn_ptxc.so, in-process,
whole-program) against the driver's JIT of the same PTX
(fa_runtime_options.ptx_compiler = FA_PTX_COMPILER_OFF). Issue 25 owes that
the plugin's cubins run as fast as the driver's.

Counts first (bench/README.md): FLOP = 4 b h s^2 d, halved for causal, with
b s = 16384 and h d = 2048 as bench_sdpa.py's grid. Each configuration runs
both runtimes on the same inputs, checks their outputs are bitwise equal
(same PTX, same arithmetic), then times `--rounds` rounds of `--reps`
back-to-back launches per runtime, alternating which goes first, with CUDA
events; the figure is the median round.

    python3 bench/bench_compiler_ab.py [--head-dims 64,128] [--seqlens 1024,4096]
        [--dtype bf16] [--rounds 7] [--reps 20] [--out-dir bench/results]
"""
import argparse
import datetime
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_sdpa as common  # noqa: E402  (library lookup, nvidia-smi, git commit)


def flops(b, h, s, d, causal):
    return 4.0 * b * h * s * s * d / (2 if causal else 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--seqlens", default="1024,4096")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out-dir", default=os.path.join(common.ROOT, "bench", "results"))
    a = p.parse_args(argv)
    import torch
    fa = common.import_flashattn()
    rts = {"plugin": fa.Runtime(backend="cuda", cache="memory"),
           "driver-jit": fa.Runtime(backend="cuda", cache="memory", ptx_compiler="off")}
    modes = {k: common.ptx_compiler_meta(rt) for k, rt in rts.items()}
    if not modes["plugin"].startswith("plugin"):
        raise SystemExit("bench_compiler_ab: the plugin is not in use: %s" % modes["plugin"])
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    stream = torch.cuda.current_stream()
    _, driver = common.nvidia_smi()
    lines = ["# PTX compiler plugin cubins vs the driver's JIT: %s, %s" % (
                 torch.cuda.get_device_name(0),
                 datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")), "",
             "- commit: %s" % common.git_commit(), "- driver: %s" % driver,
             "- library: %s" % os.path.realpath(fa.library_path()),
             "- plugin runtime: %s" % modes["plugin"], "- JIT runtime: %s" % modes["driver-jit"],
             "- method: one process, the same inputs; %d rounds x %d back-to-back launches per "
             "runtime, alternating first; CUDA events; median round" % (a.rounds, a.reps), "",
             "| dtype | d | causal | seqlen | batch x heads | GFLOP | plugin TFLOP/s | JIT TFLOP/s "
             "| plugin / JIT | outputs |", "|---|---|---|---|---|---|---|---|---|---|"]
    worst = 1.0
    for d in (int(x) for x in a.head_dims.split(",")):
        for s in (int(x) for x in a.seqlens.split(",")):
            for causal in (False, True):
                b, h = max(1, 16384 // s), 2048 // d
                g = torch.Generator(device="cuda").manual_seed(d * 7 + s)
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dt, generator=g)
                           for _ in range(3))
                cfg = fa.Config(dtype=a.dtype, head_dim=d, num_heads_q=h, causal=causal)
                outs = {m: torch.full_like(q, float("nan")) for m in rts}
                for m, rt in rts.items():
                    fa.forward(rt, cfg, q, k, v, out=outs[m], stream=stream)
                torch.cuda.synchronize()
                same = torch.equal(outs["plugin"], outs["driver-jit"])
                times = {m: [] for m in rts}
                order = list(rts)
                for r in range(a.rounds):
                    for m in (order if r % 2 == 0 else order[::-1]):
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record(stream)
                        for _ in range(a.reps):
                            fa.forward(rts[m], cfg, q, k, v, out=outs[m], stream=stream)
                        e1.record(stream)
                        e1.synchronize()
                        times[m].append(e0.elapsed_time(e1) / a.reps)
                f = flops(b, h, s, d, causal)
                tf = {m: f / (statistics.median(t) * 1e-3) / 1e12 for m, t in times.items()}
                ratio = tf["plugin"] / tf["driver-jit"]
                worst = min(worst, ratio)
                row = "| %s | %d | %s | %d | %d x %d | %.1f | %.1f | %.1f | %.3f | %s |" % (
                    a.dtype, d, "yes" if causal else "no", s, b, h, f / 1e9, tf["plugin"],
                    tf["driver-jit"], ratio, "bitwise equal" if same else "DIFFER")
                print(row, flush=True)
                lines.append(row)
                del q, k, v, outs
                torch.cuda.empty_cache()
    lines += ["", "Lowest plugin / JIT ratio: %.3f" % worst]
    os.makedirs(a.out_dir, exist_ok=True)
    name = "%s-%s-ptx-compiler-ab.md" % (datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                                        common.slug(torch.cuda.get_device_name(0)))
    with open(os.path.join(a.out_dir, name), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines[:9]))
    print("wrote", os.path.join(a.out_dir, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run by test_bench_backward.py in a child process (it needs torch, which
the other bench tests must not find imported): bench_backward.py's GPU part
on the CPU, flashattn through the emulator and SDPA's math backend, tiny
shapes. Prints one JSON object: the reference gradients' largest difference
from fp64 autograd, and the rows of run_config for the real contenders
(causal and not) and for broken flashattn ones (argv[1:] names the cases,
not causal)."""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_backward as bb  # noqa: E402
import bench_sdpa as common  # noqa: E402
import torch  # noqa: E402


class CpuBench(bb.BackwardBench):
    """Host clocks in place of CUDA events, two timed runs (no figure)."""

    def __init__(self, fa, args):
        super().__init__(torch, fa, args, device="cpu")

    def sync(self):
        pass

    @staticmethod
    def host_ms(run, i):
        t = time.perf_counter()
        run(i)
        return (time.perf_counter() - t) * 1e3

    def one_run_ms(self, run, i):
        return self.host_ms(run, i)

    def time_impl(self, run, n_sets, est_ms):
        rot = common.Rotation(n_sets)
        for _ in range(2):
            i = rot.next()
            rot.record(i, self.host_ms(run, i))
        return rot


def reference_error(bench):
    """max |reference_grads - fp64 autograd through SDPA's math| over dq,
    dk, dv, causal and not."""
    worst = 0.0
    for causal in (False, True):
        c = common.BenchConfig("fp16", 8, causal, 24, 3, 5)
        g = torch.Generator().manual_seed(7 + causal)
        q, k, v, do = (torch.randn(3, 24, 5, 8, generator=g).half() for _ in range(4))
        subset = ([0, 2], [1, 3, 4])
        refs, idx = bench.reference_grads(c, q, k, v, do, subset)
        x = [t.double().requires_grad_() for t in (q, k, v)]
        o = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in x), is_causal=causal).transpose(1, 2)
        grads = torch.autograd.grad(o, x, do.double())
        for ref, want in zip(refs, grads):
            want = want.index_select(0, idx[0]).index_select(2, idx[1])
            assert ref.shape == want.shape, (ref.shape, want.shape)
            worst = max(worst, (ref.double() - want).abs().max().item())
    return worst


def broken(case, make_fa_run):
    """make_fa_run with its runs damaged as case says."""
    def make(self, c, sets, fwd, grads, deterministic):
        run = make_fa_run(self, c, sets, fwd, grads, deterministic)

        def bad(i):
            dq, dk, dv = run(i)
            if case == "scaled_dq":
                dq.mul_(1.05)
            elif case == "unwritten_dk":
                dk.fill_(float("nan"))  # as if the kernel left the poison there
            return dq, dk, dv
        return bad
    return make


def main():
    fa = common.import_flashattn()
    args = common.parse_args(["--backward", "--deterministic", "--sets", "2"])
    out = {"reference_max_diff": reference_error(CpuBench(fa, args)), "rows": {}}
    for case in ["good"] + sys.argv[1:]:
        if case != "good":
            CpuBench.make_fa_run = broken(case, bb.BackwardBench.make_fa_run)
        bench = CpuBench(fa, args)
        causals = (False, True) if case == "good" else (False,)
        out["rows"][case] = [bench.run_config(common.BenchConfig("fp16", 64, causal, 40, 2, 5),
                                              100.0) for causal in causals]
        out["nodes"] = bench.nodes
    print("CHILD " + json.dumps(out, default=str))


if __name__ == "__main__":
    main()

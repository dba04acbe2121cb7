#!/usr/bin/env python3
"""Python overhead of flashattn: the same problems through the C library (fa-bench-call, its own
process), the NumPy binding (flashattn.forward/backward) and the torch op (flash_attn_func),
interleaved in rounds so that machine-load drift hits all of them alike. Per call: the median
over the calls of a round (--stat median) or the fastest call (--stat min), then the median over
the rounds; ratios are taken within each round, then their median.

What each side times:
- C: fa_forward, and fa_forward + fa_backward, on buffers allocated once (the library's own time).
- torch fwd: flash_attn_func under torch.no_grad(); torch fwd+bwd: flash_attn_func then
  torch.autograd.grad with a contiguous dout, the op allocating out, lse, dq, dk, dv each call.
- torch kernel: the part of torch fwd+bwd spent inside the C extension (its two calls timed from
  Python), so torch fwd+bwd - torch kernel is what torch and our Python glue add.
- torch no-op: the same custom op, autograd and Python glue with the C extension's calls replaced
  by no-ops: torch's machinery plus ours, without the kernel.
- paired: the torch op and the library called through the binding with preallocated outputs (as
  the C program calls it; a few us of binding), alternated call by call in the torch process: the
  median of the per-call ratios, robust to load drift on a shared machine (the C process and the
  torch process cannot alternate that finely).
- torch bare: a custom op of the same signature, autograd and outputs whose implementation only
  allocates its outputs: torch's own share of the no-op time; no-op - bare is our Python glue.
- C fresh: the C process allocating its outputs per call (malloc/free in the timed region), as the
  torch op does; the target compares with C on reused buffers, the library's own time.
- C, torch's gomp: the C process run with torch's bundled libgomp preloaded. A torch process runs
  the library on that libgomp (same soname, loaded first), a plain C program on the system's.
Also per call: process CPU time (all threads) and minor page faults (allocation cost).

Targets (issue 14): binding overhead at batch 1, 1 head, N = 128, d = 64 within 15 us of the C
call; at N >= 1024 the torch op within 5% of the C time.

    python bench/python/overhead.py --fa-bench-call build/bench/python/fa-bench-call
"""

import argparse
import glob
import os
import resource
import statistics
import subprocess
import time
from typing import Optional, Tuple

import numpy as np
import torch

import flashattn
import flashattn._torch


class TimedKernel:
    """Stands in for flashattn._torch._native: times its forward/backward calls, or skips them
    (noop) to measure everything around the kernel."""

    def __init__(self, native):
        self.native = native
        self.noop = False
        self.seconds = 0.0

    def forward(self, *args):
        return self._call(self.native.forward, args, 2)

    def backward(self, *args):
        return self._call(self.native.backward, args, 5)

    def _call(self, fn, args, n_results):
        if self.noop:
            return (None,) * n_results
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t0

    def __getattr__(self, name):
        return getattr(self.native, name)


KERNEL = TimedKernel(flashattn._torch._native)
flashattn._torch._native = KERNEL


@torch.library.custom_op("overhead_bench::forward", mutates_args=())
def _bare_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, softmax_scale: float,
                  causal: bool, window_left: int, window_right: int, seed: int, offset: int, softcap: float,
                  bias: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor],
                  sinks: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(q.shape), torch.empty((q.shape[0], q.shape[2], q.shape[1]))


@torch.library.custom_op("overhead_bench::backward", mutates_args=())
def _bare_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty(q.shape), torch.empty(k.shape), torch.empty(v.shape), torch.empty((0,)), torch.empty((0,))


def _bare_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3], *output, *inputs[11:])
    ctx.mark_non_differentiable(output[1])


def _bare_autograd_backward(ctx, dout, _dlse):
    q, k, v = ctx.saved_tensors[:3]
    return _bare_backward(dout, q, k, v)[:3] + (None,) * 11


_bare_forward.register_autograd(_bare_autograd_backward, setup_context=_bare_setup_context)


def bare_attn(q, k, v):
    return _bare_forward(q, k, v, 0.0, q.shape[-1] ** -0.5, False, -1, -1, 0, 0, 0.0, None, None, None)[0]


def time_calls(fn, reps, stat):
    """(wall us, CPU us, kernel us, rest us, minor faults) per call: median (or min) over reps;
    rest = wall - kernel of the same call."""
    for _ in range(3):
        fn()
    wall, cpu, kernel, faults = [], [], [], []
    for _ in range(reps):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        KERNEL.seconds = 0.0
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        t1, c1 = time.perf_counter(), time.process_time()
        wall.append(t1 - t0)
        cpu.append(c1 - c0)
        kernel.append(KERNEL.seconds)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    pick = min if stat == "min" else statistics.median
    rest = [w - k for w, k in zip(wall, kernel)]
    return 1e6 * pick(wall), 1e6 * statistics.median(cpu), 1e6 * pick(kernel), 1e6 * pick(rest), statistics.mean(faults)


def time_paired(fn_a, fn_b, reps):
    """Median over reps of wall(fn_a) / wall(fn_b), the two called alternately."""
    for _ in range(2):
        fn_a()
        fn_b()
    ratios = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn_a()
        t1 = time.perf_counter()
        fn_b()
        t2 = time.perf_counter()
        ratios.append((t1 - t0) / (t2 - t1))
    return statistics.median(ratios)


def run_c(fa_bench_call, problem, reps, stat, preload=None, fresh=False):
    env = dict(os.environ)
    if preload:
        env["LD_PRELOAD"] = preload
    command = [fa_bench_call, *map(str, problem), str(reps)] + (["fresh"] if fresh else [])
    line = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    values = dict((key, float(value)) for key, value in (item.split("=") for item in line.split()))
    suffix = "_min_us" if stat == "min" else "_us"
    return {"fwd": values["fwd" + suffix], "both": values["both" + suffix], "fwd_cpu": values["fwd_cpu_us"],
            "both_cpu": values["both_cpu_us"],
            "faults": values["faults"]}


def measure(problem, reps, args, torch_gomp):
    batch, heads, seqlen, head_dim = problem
    m = {}
    c = run_c(args.fa_bench_call, problem, reps, args.stat)
    m.update(c_fwd=c["fwd"], c_both=c["both"], c_fwd_cpu=c["fwd_cpu"], c_both_cpu=c["both_cpu"], c_faults=c["faults"])
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((batch, seqlen, heads, head_dim)).astype(np.float32) for _ in range(4))
    out, lse = flashattn.forward(q, k, v)
    m["np_fwd"] = time_calls(lambda: flashattn.forward(q, k, v), reps, args.stat)[0]
    m["np_both"] = m["np_fwd"] + time_calls(lambda: flashattn.backward(q, k, v, out, dout, lse), reps, args.stat)[0]
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    tdout = torch.from_numpy(dout)

    def torch_both():
        torch.autograd.grad(flashattn.flash_attn_func(tq, tk, tv), (tq, tk, tv), tdout)

    with torch.no_grad():
        m["torch_fwd"], m["torch_fwd_cpu"] = time_calls(lambda: flashattn.flash_attn_func(tq, tk, tv), reps,
                                                       args.stat)[:2]
    (m["torch_both"], m["torch_both_cpu"], m["torch_kernel"], m["torch_rest"],
     m["torch_faults"]) = time_calls(torch_both, reps, args.stat)
    options = flashattn._options(False, None, (-1, -1), None, 0.0, 0, 0, None, (128, 128), 0.0, None, None, None)
    n_out, dq, dk, dv = map(np.empty_like, (q, q, k, v))
    n_lse = np.empty((batch, heads, seqlen), np.float32)

    def native_both():  # the C calls through the binding into preallocated outputs, as fa-bench-call makes them
        KERNEL.native.forward(q, k, v, n_out, n_lse, True, *options, 0, None)
        KERNEL.native.backward(q, k, v, n_out, dout, n_lse, dq, dk, dv, None, None, *options, 0, None)

    m["paired"] = time_paired(torch_both, native_both, max(reps, 8))
    KERNEL.noop = True
    try:
        m["torch_noop"] = time_calls(torch_both, max(reps, 50), args.stat)[0]
    finally:
        KERNEL.noop = False
    m["torch_bare"] = time_calls(lambda: torch.autograd.grad(bare_attn(tq, tk, tv), (tq, tk, tv), tdout),
                                 max(reps, 50), args.stat)[0]
    m["c_fresh_both"] = run_c(args.fa_bench_call, problem, reps, args.stat, fresh=True)["both"]
    if torch_gomp:
        m["c_gomp_both"] = run_c(args.fa_bench_call, problem, reps, args.stat, torch_gomp)["both"]
    return m


def median_of(rounds, key):
    return statistics.median(r[key] for r in rounds)


def ratio(rounds, num, den):
    return statistics.median(r[num] / r[den] for r in rounds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fa-bench-call", required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--stat", choices=["median", "min"], default="median")
    parser.add_argument("--large-only", action="store_true", help="skip N = 128")
    args = parser.parse_args()
    problems = [((1, 1, 128, 64), 400), ((1, 4, 1024, 64), 10), ((1, 4, 2048, 64), 4)]
    if args.large_only:
        problems = problems[1:]
    torch_gomp = (glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp*.so*")) or [None])[0]
    rounds = {p: [] for p, _ in problems}
    for _ in range(args.rounds):
        for problem, reps in problems:
            rounds[problem].append(measure(problem, reps, args, torch_gomp))
    print("flashattn %s, %s, torch %s (%d threads); per call: %s of the calls, median of %d interleaved rounds, us"
          % (flashattn.__version__, flashattn.backends()["cpu"].detail, torch.__version__, torch.get_num_threads(),
             args.stat, args.rounds))
    print("\n| batch, heads, N, d | C fwd | NumPy fwd | torch fwd | C fwd+bwd | NumPy fwd+bwd | torch fwd+bwd "
          "| NumPy - C (fwd) | torch / C (fwd) | torch / C (fwd+bwd) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for problem, _ in problems:
        r = rounds[problem]
        print("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %+.1f us | %.3f | %.3f |" % (
            ", ".join(map(str, problem)), median_of(r, "c_fwd"), median_of(r, "np_fwd"), median_of(r, "torch_fwd"),
            median_of(r, "c_both"), median_of(r, "np_both"), median_of(r, "torch_both"),
            statistics.median(x["np_fwd"] - x["c_fwd"] for x in r), ratio(r, "torch_fwd", "c_fwd"),
            ratio(r, "torch_both", "c_both")))
    print("\nfwd+bwd in detail: torch = kernel + the rest; no-op = the op with the C calls skipped; bare = a "
          "custom op that only allocates; CPU = process CPU time (all threads)")
    print("\n| batch, heads, N, d | torch kernel | torch - kernel | torch no-op | torch bare | C fresh / C "
          "| C, torch's gomp / C | CPU: torch / C (fwd) | CPU: torch / C (fwd+bwd) | faults/call: C, torch "
          "| torch / C, paired |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for problem, _ in problems:
        r = rounds[problem]
        gomp = "%.3f" % ratio(r, "c_gomp_both", "c_both") if "c_gomp_both" in r[0] else "n/a"
        print("| %s | %.1f | %.1f | %.1f | %.1f | %.3f | %s | %.3f | %.3f | %.0f, %.0f | %.3f |" % (
            ", ".join(map(str, problem)), median_of(r, "torch_kernel"),
            median_of(r, "torch_rest"), median_of(r, "torch_noop"),
            median_of(r, "torch_bare"), ratio(r, "c_fresh_both", "c_both"), gomp,
            ratio(r, "torch_fwd_cpu", "c_fwd_cpu"), ratio(r, "torch_both_cpu", "c_both_cpu"), median_of(r, "c_faults"),
            median_of(r, "torch_faults"), median_of(r, "paired")))


if __name__ == "__main__":
    main()

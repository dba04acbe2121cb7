#!/usr/bin/env python3
"""Python overhead of flashattn: the same problems through the C library (fa-bench-call), the
NumPy binding (flashattn.forward/backward) and the torch op (flash_attn_func), interleaved in
rounds so that machine-load drift hits all three alike. Per call, microseconds: the median of
the calls (--stat median) or the fastest call (--stat min: the overhead without scheduler noise,
which on a loaded machine adds up to a time slice when an OpenMP worker has to be woken).

Targets (issue 14): binding overhead at batch 1, 1 head, N = 128, d = 64 within 15 us of the C
call; at N >= 1024 the torch op within 5% of the C time.

    python bench/python/overhead.py --fa-bench-call build/bench/python/fa-bench-call
"""

import argparse
import statistics
import subprocess
import time

import numpy as np
import torch

import flashattn


def time_us(fn, reps, stat):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * (min(times) if stat == "min" else statistics.median(times))


def measure(problem, reps, fa_bench_call, stat):
    batch, heads, seqlen, head_dim = problem
    c_times = subprocess.run([fa_bench_call, *map(str, problem), str(reps)], check=True, capture_output=True,
                             text=True).stdout.split()
    c_fwd, c_bwd = map(float, c_times[2:] if stat == "min" else c_times[:2])
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((batch, seqlen, heads, head_dim)).astype(np.float32) for _ in range(4))
    out, lse = flashattn.forward(q, k, v)
    np_fwd = time_us(lambda: flashattn.forward(q, k, v), reps, stat)
    np_bwd = time_us(lambda: flashattn.backward(q, k, v, out, dout, lse), reps, stat)
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    tdout = torch.from_numpy(dout)
    with torch.no_grad():
        torch_fwd = time_us(lambda: flashattn.flash_attn_func(tq, tk, tv), reps, stat)
    torch_both = time_us(lambda: torch.autograd.grad(flashattn.flash_attn_func(tq, tk, tv), (tq, tk, tv), tdout),
                         reps, stat)
    return {"c_fwd": c_fwd, "c_both": c_fwd + c_bwd, "np_fwd": np_fwd, "np_both": np_fwd + np_bwd,
            "torch_fwd": torch_fwd, "torch_both": torch_both}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fa-bench-call", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stat", choices=["median", "min"], default="median")
    args = parser.parse_args()
    problems = [((1, 1, 128, 64), 400), ((1, 4, 1024, 64), 20), ((1, 4, 2048, 64), 8)]
    rounds = {p: [] for p, _ in problems}
    for _ in range(args.rounds):
        for problem, reps in problems:
            rounds[problem].append(measure(problem, reps, args.fa_bench_call, args.stat))
    print("flashattn %s, %s; per call: %s of the calls, median of %d interleaved rounds, us"
          % (flashattn.__version__, flashattn.backends()["cpu"].detail, args.stat, args.rounds))
    print("| batch, heads, N, d | C fwd | NumPy fwd | torch fwd | C fwd+bwd | NumPy fwd+bwd | torch fwd+bwd "
          "| NumPy - C (fwd) | torch / C (fwd) | torch / C (fwd+bwd) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for problem, _ in problems:
        m = {key: statistics.median(r[key] for r in rounds[problem]) for key in rounds[problem][0]}
        print("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %+.1f us | %.3f | %.3f |" % (
            ", ".join(map(str, problem)), m["c_fwd"], m["np_fwd"], m["torch_fwd"], m["c_both"], m["np_both"],
            m["torch_both"], m["np_fwd"] - m["c_fwd"], m["torch_fwd"] / m["c_fwd"], m["torch_both"] / m["c_both"]))


if __name__ == "__main__":
    main()

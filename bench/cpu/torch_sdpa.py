#!/usr/bin/env python3
"""PyTorch's CPU scaled_dot_product_attention, timed for fa-bench's optional third column.

fa-bench starts this script once (when `import torch` works) and, for each cell of its table,
writes one request line on stdin and reads one answer line:

    request:  pass n d heads causal reps min_seconds median layout
              (pass: fwd, bwd or fwd+bwd; layout: bnhd or bhnd, below)
    answer:   milliseconds, or "error <reason>"

The first line of output is "ready <torch version> <threads>" once torch has loaded. Timing
follows fa-bench: one untimed warm-up, then up to `reps` runs until `min_seconds` are spent, the
best (median = 0) or the median (median = 1) of them. fp32, batch 1, the tensors in fa-bench's
memory layout: bhnd is PyTorch's own (batch, heads, N, d), contiguous; bnhd is (batch, N, heads, d)
memory, FlashAttention's, passed as its transposed view (what a caller holding such tensors hands
to scaled_dot_product_attention). torch.set_num_threads(threads) from the command line; with `cpu`,
times are the process CPU time divided by the threads (fa-bench --clock cpu).
Usage: torch_sdpa.py THREADS [wall|cpu]
"""
import statistics
import sys
import time


def time_cell(torch, sdpa, clock, which, n, d, heads, causal, reps, min_seconds, median, layout):
    gen = torch.Generator().manual_seed(1)

    def tensor():  # (1, heads, n, d) as sdpa takes it, in the requested memory
        if layout == "bhnd":
            return torch.rand(1, heads, n, d, generator=gen) * 2 - 1
        return (torch.rand(1, n, heads, d, generator=gen) * 2 - 1).transpose(1, 2)

    make = lambda: tensor().requires_grad_(which != "fwd")
    q, k, v = make(), make(), make()
    dout = tensor()
    out = sdpa(q, k, v, is_causal=causal) if which == "bwd" else None

    def run():
        if which == "fwd":
            with torch.no_grad():
                sdpa(q, k, v, is_causal=causal)
        elif which == "bwd":
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        else:
            o = sdpa(q, k, v, is_causal=causal)
            torch.autograd.grad(o, (q, k, v), dout)

    if reps > 1:
        run()
    times, spent = [], 0.0
    while len(times) < reps and (not times or spent < min_seconds):
        t0 = clock()
        run()
        times.append(clock() - t0)
        spent += times[-1]
    return (statistics.median(times) if median else min(times)) * 1e3


def main():
    threads = int(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "cpu":
        clock = lambda: time.process_time() / threads
    else:
        clock = time.perf_counter
    try:
        import torch
        import torch.nn.functional as functional
    except Exception as error:  # any import failure means: no column
        print(f"error import torch: {error}".replace("\n", " "), flush=True)
        return
    torch.set_num_threads(threads)
    print(f"ready {torch.__version__} {torch.get_num_threads()}", flush=True)
    for line in sys.stdin:
        try:
            which, n, d, heads, causal, reps, min_seconds, median, layout = line.split()
            if layout not in ("bnhd", "bhnd"):
                raise ValueError(f"layout {layout}")
            ms = time_cell(torch, functional.scaled_dot_product_attention, clock, which, int(n), int(d), int(heads),
                           causal == "1", int(reps), float(min_seconds), median == "1", layout)
            print(f"{ms:.4f}", flush=True)
        except Exception as error:
            print(f"error {error}".replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Median over several fa-bench runs ("rounds") of the same rows, as a markdown table.

On a shared machine one run can catch a noisy minute; running the same command a few times and
taking each row's median across the runs is steadier than any single run. Usage:

    for r in 1 2 3; do fa-bench --n 2048,4096 --d 64,128 --reps 5 --stat median --csv r$r.csv; done
    bench/cpu/median_rounds.py r1.csv r2.csv r3.csv

Columns: flash and standard ms (medians), speedup = median std ms / median flash ms, the
fraction of each round's own sgemm rate (median), and causal / dense flash time at the same
(pass, N, d).
"""
import csv
import statistics
import sys


def main(paths):
    rows = {}
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                key = (r["pass"], int(r["n"]), int(r["d"]), r["mask"])
                entry = rows.setdefault(key, {"flash": [], "std": [], "peak": []})
                entry["flash"].append(float(r["flash_ms"]))
                if float(r["std_ms"]) > 0:
                    entry["std"].append(float(r["std_ms"]))
                entry["peak"].append(float(r["flash_peak_fraction"]))
    print(f"Medians over {len(paths)} runs.\n")
    print("| pass | N | d | mask | flash ms | std ms | speedup | of sgemm | causal / dense |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(rows, key=lambda k: (k[2], k[1], ["fwd", "bwd", "fwd+bwd"].index(k[0]), ["dense", "causal"].index(k[3]))):
        e = rows[key]
        flash = statistics.median(e["flash"])
        std = statistics.median(e["std"]) if e["std"] else None
        speedup = f"{std / flash:.2f}x" if std else "-"
        ratio = "-"
        dense = rows.get((key[0], key[1], key[2], "dense"))
        if key[3] == "causal" and dense:
            ratio = f"{flash / statistics.median(dense['flash']):.2f}"
        std_text = f"{std:.1f}" if std else "-"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {flash:.1f} | {std_text} | {speedup} | "
              f"{statistics.median(e['peak']):.2f} | {ratio} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: median_rounds.py run1.csv [run2.csv ...]")
    main(sys.argv[1:])

#!/usr/bin/env python3
"""Median over several fa-bench runs ("rounds") of the same rows, as a markdown table.

On a shared machine one run can catch a noisy minute; running the same command a few times and
taking each row's median across the runs is steadier than any single run. Usage:

    for r in 1 2 3; do fa-bench --n 2048,4096 --d 64,128 --reps 5 --stat median --csv r$r.csv; done
    bench/cpu/median_rounds.py r1.csv r2.csv r3.csv

Rows of different --layout runs stay apart (a layout column appears). Columns: flash and standard
ms (medians), speedup = median std ms / median flash ms, the
fraction of each round's own FMA peak (median; runs from before the probe: of their sgemm rate,
and the column says so), causal / dense flash time at the same
(pass, N, d), and where the runs have them: the type (--dtype) with its time over f32 (median of
the per-round ratios), PyTorch SDPA ms and the median of the per-round torch / flash ratios.
"""
import csv
import statistics
import sys


def load(paths):
    """Each row's values across the runs: {(pass, n, d, mask, dtype, layout): {column: [value per run]}}.
    Lists: flash, std (ms), peak (fraction of the FMA peak, or of the sgemm rate in runs from before
    the probe: of_fma says which), of_sgemm, of_l1 (of the L1-gemm rate around the row), speedup
    (std / flash), vs_f32, torch (ms), vs_torch."""
    rows = {}
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                key = (r["pass"], int(r["n"]), int(r["d"]), r["mask"], r.get("dtype", "f32"), r.get("layout") or "bnhd")
                entry = rows.setdefault(key, {"flash": [], "std": [], "peak": [], "of_sgemm": [], "of_l1": [],
                                              "speedup": [], "vs_f32": [], "torch": [], "vs_torch": []})
                entry["flash"].append(float(r["flash_ms"]))
                if float(r["std_ms"]) > 0:
                    entry["std"].append(float(r["std_ms"]))
                    entry["speedup"].append(float(r["speedup"]))
                of_sgemm = float(r.get("flash_sgemm_fraction") or r.get("flash_peak_fraction") or 0)
                fma = r.get("flash_fma_fraction")
                entry["peak"].append(float(fma) if fma else of_sgemm)
                entry["of_fma"] = bool(fma)
                entry["of_sgemm"].append(of_sgemm)
                if float(r.get("flash_l1_fraction") or 0) > 0:
                    entry["of_l1"].append(float(r["flash_l1_fraction"]))
                if float(r.get("time_vs_f32") or 0) > 0:
                    entry["vs_f32"].append(float(r["time_vs_f32"]))
                if float(r.get("torch_ms") or 0) > 0:
                    entry["torch"].append(float(r["torch_ms"]))
                    entry["vs_torch"].append(float(r["speedup_vs_torch"]))
    return rows


def main(paths):
    rows = load(paths)
    types = len({k[4] for k in rows}) > 1
    layouts = len({k[5] for k in rows}) > 1  # fa-bench --layout: runs of both kept apart
    of = "of FMA peak" if all(e.get("of_fma") for e in rows.values()) else "of sgemm"
    torch = any(e["torch"] for e in rows.values())
    print(f"Medians over {len(paths)} runs.\n")
    head = "| pass | N | d | mask |" + (" layout |" if layouts else "") + (" type | t/f32 |" if types else "") + f" flash ms | std ms | speedup | {of} | causal / dense |"
    head += " torch ms | vs torch |" if torch else ""
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    med = statistics.median
    order = lambda k: (k[2], k[1], ["fwd", "bwd", "fwd+bwd"].index(k[0]), ["dense", "causal"].index(k[3]),
                       ["f32", "f16", "bf16"].index(k[4]), k[5])
    for key in sorted(rows, key=order):
        e = rows[key]
        flash = med(e["flash"])
        std = med(e["std"]) if e["std"] else None
        speedup = f"{std / flash:.2f}x" if std else "-"
        ratio = "-"
        dense = rows.get((key[0], key[1], key[2], "dense", key[4], key[5]))
        if key[3] == "causal" and dense:
            ratio = f"{flash / med(dense['flash']):.2f}"
        std_text = f"{std:.1f}" if std else "-"
        line = f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} |"
        if layouts:
            line += f" {key[5]} |"
        if types:
            line += f" {key[4]} | " + (f"{med(e['vs_f32']):.2f}" if e["vs_f32"] and key[4] != "f32" else "-") + " |"
        line += f" {flash:.1f} | {std_text} | {speedup} | {med(e['peak']):.2f} | {ratio} |"
        if torch:
            line += f" {med(e['torch']):.1f} | {med(e['vs_torch']):.2f}x |" if e["torch"] else " - | - |"
        print(line)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: median_rounds.py run1.csv [run2.csv ...]")
    main(sys.argv[1:])

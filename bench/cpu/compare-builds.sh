#!/bin/sh
# Interleaved A/B of two builds' fa-bench on the same machine: rounds alternate A and B so that a
# changing load hits both alike; each row reports both times (the best over the rounds of each
# row's --stat value), A/B (> 1: B is faster) and each build's speedup over standard attention
# measured in the same invocation.
# Usage: bench/cpu/compare-builds.sh A/bench/fa-bench B/bench/fa-bench ROUNDS [fa-bench options]
#   e.g. bench/cpu/compare-builds.sh ../main/build/bench/fa-bench build/bench/fa-bench 3 \
#            --n 2048,4096 --d 64,128 --reps 3 --min-time 0
# (Both binaries must accept the options given; --csv is added here.)
set -eu
[ $# -ge 3 ] || { sed -n 2,9p "$0"; exit 2; }
a=$1 b=$2 rounds=$3
shift 3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
round=1
while [ "$round" -le "$rounds" ]; do
    for side in A B; do
        if [ $side = A ]; then bin=$a; else bin=$b; fi
        "$bin" "$@" --csv "$work/run.csv" >/dev/null 2>&1 || { echo "compare-builds: $bin failed"; exit 1; }
        sed 1d "$work/run.csv" | sed "s/^/$side,/" >>"$work/all.csv"
    done
    round=$((round + 1))
done
# all.csv: side,pass,n,d,heads,threads,mask,flash_ms,...,std_ms (col 12),...
awk -F, '
    { key = $2 "," $4 "," $3 "," $7; if (!(key in seen)) { seen[key] = 1; order[++count] = key }
      t = $8 + 0; s = $12 + 0
      if (!((key, $1) in best) || t < best[key, $1]) { best[key, $1] = t; std[key, $1] = s } }
    END {
      printf "%-8s %4s %6s %-6s | %10s %10s %6s | %9s %9s\n", "pass", "d", "N", "mask", "A ms", "B ms", "A/B", "std/A", "std/B"
      for (i = 1; i <= count; ++i) {
        k = order[i]; split(k, f, ",")
        ra = std[k, "A"] > 0 ? sprintf("%.2f", std[k, "A"] / best[k, "A"]) : "-"
        rb = std[k, "B"] > 0 ? sprintf("%.2f", std[k, "B"] / best[k, "B"]) : "-"
        printf "%-8s %4s %6s %-6s | %10.2f %10.2f %6.2f | %9s %9s\n", f[1], f[2], f[3], f[4], best[k, "A"], best[k, "B"],
               best[k, "A"] / best[k, "B"], ra, rb
      } }' "$work/all.csv"

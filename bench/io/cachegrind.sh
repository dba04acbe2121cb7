#!/usr/bin/env bash
# Cross-checks the IO model with a simulated cache: runs one instrumented forward (the paper's
# Algorithm 1 loop order) under valgrind's cachegrind at two SRAM sizes M, with the last-level
# cache set to the smallest power of two that holds twice the run's on-chip buffers (a hardware
# cache also holds the lines streaming through it), and prints the model's slow-memory traffic
# beside cachegrind's last-level data misses (64-byte lines = 16 floats), less those of a run with
# N = 1 (program start-up: the loader, OpenMP, OpenBLAS).
# Usage: bench/io/cachegrind.sh [BUILD_DIR] [N] [D]      (writes bench/results/io/cachegrind.txt)
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"; n="${2:-512}"; d="${3:-64}"
bench="$build/bench/io/fa-bench-io"
command -v valgrind >/dev/null || { echo "cachegrind: valgrind not found (apt-get install valgrind)"; exit 1; }
meson compile -C "$build" fa-bench-io >/dev/null
out=bench/results/io/cachegrind.txt
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# LL data read and write misses of one instrumented forward: misses LL_BYTES N D M
misses() {
  valgrind --tool=cachegrind --cache-sim=yes --D1=8192,8,64 --LL="$1",16,64 \
    --cachegrind-out-file="$tmp/cg" "$bench" sim-forward "$2" "$3" "$4" >/dev/null 2>"$tmp/log"
  sed -n 's/.*LLd misses: *[0-9,]* *( *\([0-9,]*\) rd *+ *\([0-9,]*\) wr).*/\1 \2/p' "$tmp/log" | tr -d ,
}
{
  echo "# cachegrind cross-check: N=$n d=$d, f32, one head; forward in the paper's loop order (fa_io_simulate)"
  echo "# model lines = elements / 16; cachegrind: LL data read misses (DLmr) and write misses (DLmw) minus the N = 1 run"
  printf '%-8s %-6s %-6s %-10s %-12s %-14s %-14s %-12s %-12s %-10s\n' M Br Bc LL_bytes sram_peak model_read_ln model_write_ln DLmr DLmw DLmr/model
  for m in 4096 16384; do
    line=$("$bench" sim-forward "$n" "$d" "$m")
    peak=$(sed -n 's/.*sram_peak=\([0-9]*\).*/\1/p' <<<"$line")
    reads=$(sed -n 's/.*reads=\([0-9]*\).*/\1/p' <<<"$line")
    writes=$(sed -n 's/.*writes=\([0-9]*\).*/\1/p' <<<"$line")
    br=$(sed -n 's/.*Br=\([0-9]*\).*/\1/p' <<<"$line"); bc=$(sed -n 's/.*Bc=\([0-9]*\).*/\1/p' <<<"$line")
    ll=16384; while [ "$ll" -lt $(( peak * 8 )) ]; do ll=$(( ll * 2 )); done
    set -- $(misses "$ll" "$n" "$d" "$m"); rd=$1; wr=$2
    set -- $(misses "$ll" 1 "$d" "$m"); rd=$(( rd - $1 )); wr=$(( wr - $2 ))
    printf '%-8s %-6s %-6s %-10s %-12s %-14s %-14s %-12s %-12s %-10s\n' "$m" "$br" "$bc" "$ll" "$peak" \
      $(( reads / 16 )) $(( writes / 16 )) "$rd" "$wr" "$(awk -v a="$rd" -v b=$(( reads / 16 )) 'BEGIN {printf "%.2f", a / b}')"
  done
} | tee "$out"

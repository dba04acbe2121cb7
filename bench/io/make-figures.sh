#!/usr/bin/env bash
# Regenerates the IO figures: runs fa-bench-io (CSV) and plots them with gnuplot (PNG) into
# bench/results/io/. Usage: bench/io/make-figures.sh [BUILD_DIR] [--quick]
# Without gnuplot the CSV files are still written and the script says so.
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
shift || true
out=bench/results/io
mkdir -p "$out"
meson compile -C "$build" fa-bench-io >/dev/null
"$build/bench/io/fa-bench-io" --out "$out" "$@" all
if ! command -v gnuplot >/dev/null; then
  echo "make-figures: gnuplot not found (apt-get install gnuplot-nox): CSV files written to $out, no PNG"
  exit 0
fi
gnuplot -e "dir='$out'" bench/io/figures.gp
echo "make-figures: wrote $out/*.csv and $out/*.png"

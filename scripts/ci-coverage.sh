#!/usr/bin/env bash
# CI step, right after scripts/ci-sanitize.sh: line and branch coverage of the library, with a floor
# per area. Nothing runs twice: the counters are those of the ASan+UBSan suite, which ci-sanitize.sh
# builds with gcc's --coverage in build-asan; that suite includes the replay of every fuzz target's
# committed seeds and regression inputs (suite fuzz). Added here: the replay of the targets marked
# "emu" in ci-fuzz.sh's table on the emulated CUDA plugin (seconds). gcovr then reports each area
# and the step fails when the line or branch coverage of any area is below its floor.
# Usage: scripts/ci-coverage.sh [source dir]
#   Reports in build-asan/coverage/: coverage.txt (lines per file), branches.txt (branches per file),
#   summary.json (gcovr's per-file summary), areas.txt (the table below, measured), html/index.html.
# Needs: gcov (gcc's), python3 with venv and PyPI access (gcovr 8 is installed into a venv).
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

# The floors, in percent: the lower of two full measurements (2026-11-29, the suite of
# ci-sanitize.sh; an Intel Xeon with AVX-512 and AVX512-BF16, and an AMD EPYC with AVX2 only)
# rounded down to a multiple of 5, one step lower where it sat within 1.5 points of the step (counts
# the threads raced on can come out low, so the figures move a little between runs). The CPU's
# vendor and ISA decide which kernels, cache probes and selection branches run, so src/cpu differs
# between machines. An area is every file (with counters) whose path from the source root matches
# its regex; "total" is all of src/. src/gpu is the plugins' host code (plugin entry files,
# plugin.cuh, the planners), as the emulated GPU suite compiles it into build-asan; src/gpu-kernels
# is the device code run on the emulator.
#      area              regex                                                line branch   measured: Xeon; EPYC
floors=(
  "src/common        ^src/common/                                             90 80"   # 95.2 84.1; 95.2 83.8
  "src/cpu           ^src/cpu/                                                90 80"   # 98.0 86.0; 93.5 82.6
  "src/dist          ^src/dist/                                               90 65"   # 94.4 69.7; 95.4 70.9
  "src/gpu           ^src/gpu/([^/]+|nvidia/plugin\.cu|amd/plugin\.hip)$      90 65"   # 94.6 67.0; 94.6 67.3
  "src/gpu-kernels   ^src/gpu/(kernels/.*|nvidia/.*\.cuh|amd/.*\.cuh)$        80 65"   # 86.4 68.3; 86.4 68.3
  "src/io            ^src/io/                                                 95 75"   # 99.2 80.4; 99.2 80.4
  "total             ^src/                                                    85 70"   # 91.8 77.3; 90.8 75.0
)

build=build-asan
out="$build/coverage"
if ! find "$build/src" -name '*.gcno' -print -quit 2>/dev/null | grep -q .; then
  echo "ci-coverage: no coverage data in $build (scripts/ci-sanitize.sh builds it with -Db_coverage=true)" >&2
  exit 1
fi

# gcovr from PyPI into a venv of its own (build-asan/gcovr-venv): gcovr 7 and later read a count
# that came out negative (below) as a warning on that line and keep the line; Debian's 5.2 stops
# at it, or with --gcov-ignore-parse-errors leaves out the branch (and counts the branches of
# headers compiled into several objects differently: dtype.h 58 against 124).
gcovr_venv="$build/gcovr-venv"
if [ ! -x "$gcovr_venv/bin/gcovr" ]; then
  echo "ci-coverage: installing gcovr into $gcovr_venv"
  python3 -m venv "$gcovr_venv" && "$gcovr_venv/bin/pip" install -q 'gcovr>=8,<9' ||
    { echo "ci-coverage: cannot install gcovr from PyPI" >&2; exit 1; }
fi
gcovr() { "$gcovr_venv/bin/gcovr" "$@"; }

step_start=$(date +%s)
rm -rf "$out"
mkdir -p "$out/html"

# The fuzz targets, from the table in ci-fuzz.sh: each line of targets=( ... ) is "name weight
# [emu]". The suite has already replayed every target's seeds and regressions on the CPU (suite
# fuzz: fuzz/meson.build builds fuzz/<target>.c with fuzz/replay_main.c, here with the sanitizers
# and --coverage), so those counts are in. A target whose replay did not run there (a suite run
# without it) replays here; "emu" targets also replay on build-asan's emulated CUDA plugin, so the
# GPU host code and kernels see the fuzz inputs too.
mapfile -t entries < <(sed -n '/^targets=(/,/^)/p' scripts/ci-fuzz.sh | sed -n 's/^[[:space:]]*"\([^"]*\)".*/\1/p')
[ ${#entries[@]} -gt 0 ] || { echo "ci-coverage: no targets found in scripts/ci-fuzz.sh" >&2; exit 1; }
replayed=$(python3 - "$build/meson-logs/testlog.json" <<'PY'
import json, sys
try:
    for line in open(sys.argv[1]):
        test = json.loads(line)
        if test["name"].startswith("fuzz_replay_") and test["result"] == "OK":
            print(test["name"][len("fuzz_replay_"):])
except OSError:
    pass
PY
)
# Replays one target's seeds and regressions (target, log name, environment...).
replay() {
  local target="$1" log="$2" inputs=()
  shift 2
  [ -x "$build/fuzz/${target}_replay" ] ||
    { echo "ci-coverage: $build/fuzz/${target}_replay was not built (reconfigure $build)" >&2; exit 1; }
  for dir in "fuzz/corpus/$target" "fuzz/regressions/$target"; do [ -d "$dir" ] && inputs+=("$dir"); done
  [ ${#inputs[@]} -gt 0 ] || { echo "ci-coverage: $target has no seeds"; return 0; }
  env ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 "$@" \
    "$build/fuzz/${target}_replay" "${inputs[@]}" >"$out/$log" 2>&1 ||
    { cat "$out/$log"; echo "ci-coverage: replaying the seeds of $target fails (log: $out/$log)" >&2; exit 1; }
  echo "ci-coverage: $log: $(tail -n 1 "$out/$log" | sed 's/^replay: //')"
}
for entry in "${entries[@]}"; do
  read -r target _ on_emulator <<<"$entry"
  grep -qx "${target#fuzz_}" <<<"$replayed" || replay "$target" "replay-$target.log" FA_FUZZ_BACKEND=cpu
  if [ "${on_emulator:-}" = emu ] && [ -d "$build/tests/gpu/emu/cuda" ]; then
    replay "$target" "replay-$target-emu.log" FA_FUZZ_BACKEND=cuda FLASHATTN_BACKEND= \
      FLASHATTN_PLUGIN_DIR="$PWD/$build/tests/gpu/emu/cuda" FLASHATTN_REQUIRE_GPU=1
  fi
done

# One gcov pass into gcovr's JSON; the reports are read back from it. Branches on lines without
# code (compiler-generated) and the exception edges of the C++ emulator builds are left out. The
# counters are plain increments (ci-sanitize.sh), so an arc count that gcov derives from two counts
# the OpenMP threads raced on can come out negative: gcovr counts such a line or branch as not
# taken (it ran, but its count is unknown), so the figures can only come out low, and the files
# concerned are printed. Counts gcovr finds suspiciously large (the emulator's kernel loops run
# billions of times) are kept, with a warning.
# Kernels this CPU cannot run are not measured (they are built everywhere, and checkasm runs them
# where the CPU has their ISA): the AVX-512 archive without avx512f, the vdpbf16ps file without
# avx512_bf16.
unrunnable=()
if ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  unrunnable+=(--gcov-exclude-directory '.*libfa_kernels_avx512\.a\.p')
elif ! grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null; then
  unrunnable+=(--exclude '^src/cpu/kernels/x86/avx512bf16_kernels\.c$')
fi
gcovr --root . --filter '^src/' --exclude-unreachable-branches --exclude-throw-branches -j 2 "${unrunnable[@]}" \
  --gcov-ignore-parse-errors=negative_hits.warn_once_per_file \
  --gcov-ignore-parse-errors=suspicious_hits.warn_once_per_file \
  --json "$out/coverage.json" "$build" >"$out/gcovr.log" 2>&1 ||
  { cat "$out/gcovr.log"; echo "ci-coverage: gcovr failed" >&2; exit 1; }
echo "ci-coverage: negative counts (raced) in: $(grep -o 'src/[^:]*:[0-9]*: Ignoring negative' "$out/gcovr.log" | cut -d: -f1 | sort -u | tr '\n' ' ')"
gcovr --root . --add-tracefile "$out/coverage.json" --txt "$out/coverage.txt" \
  --json-summary "$out/summary.json" --json-summary-pretty --html-details "$out/html/index.html" >/dev/null
gcovr --root . --add-tracefile "$out/coverage.json" --txt-metric branch --txt "$out/branches.txt" >/dev/null

# Each area's totals from the per-file summary, against its floors.
status=0
python3 - "$out/summary.json" "$out/areas.txt" "${floors[@]}" <<'PY' || status=$?
import json, re, sys
summary = json.load(open(sys.argv[1]))
rows, failures = [], []
for line in sys.argv[3:]:
    area, regex, line_floor, branch_floor = line.split()
    files = [f for f in summary["files"] if re.search(regex, f["filename"])]
    got = {}
    for kind in ("line", "branch"):
        covered = sum(f[kind + "_covered"] for f in files)
        total = sum(f[kind + "_total"] for f in files)
        got[kind] = (covered, total, 100.0 * covered / total if total else 0.0)
    rows.append("%-16s %5d files  lines %6d/%-6d %5.1f%% (floor %s%%)  branches %6d/%-6d %5.1f%% (floor %s%%)" % (
        area, len(files), *got["line"], line_floor, *got["branch"], branch_floor))
    for kind, floor in (("line", line_floor), ("branch", branch_floor)):
        if not files or got[kind][2] < float(floor):
            failures.append("ci-coverage: %s: %s coverage %.1f%% is below its floor of %s%%" % (area, kind, got[kind][2], floor))
report = "\n".join(rows)
open(sys.argv[2], "w").write(report + "\n")
print(report)
for failure in failures:
    print(failure, file=sys.stderr)
sys.exit(1 if failures else 0)
PY
echo "ci-coverage: done in $(( $(date +%s) - step_start )) s (reports: $out/coverage.txt, $out/branches.txt, $out/html/index.html)"
exit "$status"

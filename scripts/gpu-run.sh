#!/usr/bin/env bash
# The run on a lent GPU machine (docs/GPU.md, "A run on a lent GPU machine"), over what
# scripts/gpu-stage.sh built on the development machine (gpu-stage/: the working tree's plugin and
# test program in new/, a base commit's plugin in base/). Nothing is compiled here, except the
# Python package's extension module in full mode.
#
# Usage: scripts/gpu-run.sh quick|full
#   quick (about 4 minutes): GPU and driver facts; the static profile (bench/gpu/sass_profile.py,
#         when the tree has it); test_gpu_backends in the family under test and in the default one;
#         the repeat test (bit-identical results) without a synchronisation after each launch;
#         compute-sanitizer memcheck (quick cases) and racecheck (quick f16 table) of the family
#         under test; then, alone on the GPU, bench/gpu/sdpa_compare.py --quick (base and new
#         interleaved, 30 rounds) and Nsight Compute on one forward+backward (f16, d 128, N 4096).
#   full  (about 8 minutes): the same, plus test_gpu_backends in every family (generic, tc, fma
#         and the one under test), memcheck and racecheck of the default family, synccheck and
#         initcheck, the whole racecheck quick set, the Python suite (the package built here
#         against this machine's Python), the whole sdpa_compare grid, and ncu of the base too.
# Steps of one phase run side by side (correctness), the timing steps alone after them. Every step
# has its own time limit, clipped to its phase's end, and is recorded as PASS, FAIL, TIMEOUT or SKIP;
# the next step runs whatever happened. Exit status: the number of steps that failed or timed out.
#
# Results in $OUT (the device tool's folder; ./gpu-out elsewhere), at most 8 files:
#   summary.md   facts, the steps with their results, the timing table, ncu's key numbers
#   sdpa.md, sdpa.csv   sdpa_compare's tables and every number
#   ncu.txt      Nsight Compute's report;  sass_profile.txt  the static profile's output
#   logs.tar.gz  every step's log
# summary.md and logs.tar.gz are rewritten after every phase, so a run cut short leaves what it did.
# Environment:
#   FA_FAMILY      the kernel family under test, FLASHATTN_GPU_KERNELS's value (default tc-wide)
#   FA_STAGE_DIR   the staged folder (default gpu-stage)
#   FA_RUN_BUDGET  seconds for the whole run (default 235 quick, 470 full); phases end at fixed
#                  fractions of it
# The functions that look unused run through step (shellcheck cannot see that).
# shellcheck disable=SC2317
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
mode=${1:-}
case $mode in
  quick) budget=${FA_RUN_BUDGET:-235} ;;
  full) budget=${FA_RUN_BUDGET:-470} ;;
  *) echo "usage: $0 quick|full" >&2; exit 2 ;;
esac
family=${FA_FAMILY:-tc-wide}
stage=$root/${FA_STAGE_DIR:-gpu-stage}
new=$stage/new
base=$stage/base
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-run.XXXXXX")
logs=$work/logs
mkdir -p "$logs" "$work/status"
[ -d /usr/local/cuda/bin ] && PATH=$PATH:/usr/local/cuda/bin
export PYTHONUNBUFFERED=1
unset FLASHATTN_GPU_KERNELS FLASHATTN_GPU_SYNC FLASHATTN_BACKEND
start=$SECONDS
phase_end=$budget
failed=0

# The staged libraries first; the test program's and the core's own run paths point into the
# development machine's build folders.
new_env=(env "LD_LIBRARY_PATH=$new:$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "FLASHATTN_PLUGIN_DIR=$new"
         FLASHATTN_REQUIRE_GPU=1)
lib_env=(env "LD_LIBRARY_PATH=$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")

# step NAME SECONDS COMMAND...: runs COMMAND (a program or a function of this script) with its own
# time limit, clipped to the phase's end; output to logs/NAME.log, the result to status/NAME.
# timeout signals its whole process group, so a step's children end with it.
step() {
  local name=$1 limit=$2; shift 2
  local left=$((start + phase_end - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    printf 'SKIP\t0\t%s\tno time left in the phase\n' "$limit" > "$work/status/$name"
    return
  fi
  if declare -F "$1" >/dev/null; then # a function runs in a bash that gets the functions and settings
    set -- bash -c "$(declare -p root stage new base out work logs mode family new_env lib_env); $(declare -f)
      set -o pipefail; \"\$@\"" "$name" "$@"
  fi
  local t0=$SECONDS rc=0
  timeout -k 10 "$limit" "$@" > "$logs/$name.log" 2>&1 || rc=$?
  local result=PASS
  case $rc in
    0) ;;
    124 | 137) result=TIMEOUT ;;
    *) result="FAIL ($rc)" ;;
  esac
  printf '%s\t%d\t%d\t%s\n' "$result" "$((SECONDS - t0))" "$limit" "$(note "$logs/$name.log")" > "$work/status/$name"
}
listed() { echo "$1" >> "$work/order"; }
step_now() { listed "$1"; step "$@"; }
step_bg() { listed "$1"; step "$@" & }
step_skip() { listed "$1"; printf 'SKIP\t0\t0\t%s\n' "$2" > "$work/status/$1"; }

# The lines of a log that say how it went: counts and summaries first (cmocka, compute-sanitizer,
# pytest, sdpa_compare, ncu, facts), then what failed; else the log's last line.
note() {
  local lines
  lines=$( (grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ test|(ERROR|RACECHECK|SYNCCHECK|INITCHECK) SUMMARY|[0-9]+ (passed|failed)|^# [a-z0-9-]+: cannot run|No kernels were profiled|changed since staging|=> not found' "$1"
            grep -E '^\[  FAILED  \] [a-z]|^# (check .*FAIL|not run:|no plugin)' "$1") 2>/dev/null | sed 's/^=* *//' | head -n 4)
  [ -n "$lines" ] || lines=$(grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1)
  printf '%s' "$lines" | tr '\n|' ';/' | cut -c1-300
}

summary() {
  {
    echo "# flashattn on a lent GPU: $mode run, family under test: $family"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), $((SECONDS - start)) s of a $budget s budget"
    echo
    echo '```'
    grep -E '^(new|base|archs|staged):' "$stage/STAGE.txt" 2>/dev/null
    cat "$logs/gpu.csv" 2>/dev/null
    echo '```'
    echo
    echo "| step | result | seconds | limit | from the log |"
    echo "|---|---|---|---|---|"
    local name
    while read -r name; do
      if [ -f "$work/status/$name" ]; then
        IFS=$'\t' read -r result secs limit text < "$work/status/$name"
        echo "| $name | $result | $secs | $limit | $text |"
      else
        echo "| $name | running | | | |"
      fi
    done < "$work/order"
    if [ -s "$out/sdpa.md" ]; then
      echo
      echo "## PyTorch SDPA (flash) against the staged plugins"
      echo
      grep -E '^# (base|new|new-default):' "$logs/sdpa.log" 2>/dev/null | cut -c1-200
      echo
      cat "$out/sdpa.md"
    fi
    if [ -s "$out/ncu.txt" ]; then
      echo
      echo "## Nsight Compute (--clock-control none), f16 d 128 N 4096, one forward+backward"
      echo
      echo '```'
      grep -E '^==PROF== Running|^  [^ ].*Context [0-9]+, Stream|Duration|Registers Per Thread|Theoretical Occupancy|Achieved Occupancy|Issue Slots Busy|Executed Instructions  |Warp Cycles Per Issued|Compute \(SM\) Throughput|Memory Throughput|Dynamic Shared Memory Per Block' "$out/ncu.txt" | cut -c1-160
      echo '```'
    fi
  } > "$out/summary.md"
  tar czf "$out/logs.tar.gz" -C "$work" logs 2>/dev/null
}

facts() {
  nvidia-smi || return 1
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv | tee "$logs/gpu.csv"
  nvidia-smi -q -d CLOCK,PERFORMANCE
  nvcc --version | tail -n 2
  compute-sanitizer --version | head -n 2
  ncu --version | tail -n 1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
  uname -r; nproc; grep -m 1 'model name' /proc/cpuinfo; free -g | head -n 2
  cat "$stage/STAGE.txt"
  # What was staged came through whole, and every library the test program needs is found.
  (cd "$stage" && awk 'NF == 3 && $3 ~ /^\.\// { print $2, $3 }' STAGE.txt | while read -r sum file; do
    [ "$(sha256sum "$file" | cut -c1-16)" = "$sum" ] || { echo "changed since staging: $file"; exit 1; }
  done) || return 1
  ! "${new_env[@]}" ldd "$new/test_gpu_backends" | grep 'not found'
}

# The Python package built against this machine's Python (the tree's pyproject needs meson-python
# and a network; meson alone does), its suite run from outside the source tree on the staged plugin.
python_suite() {
  local build=$work/pybuild pkg=$work/pypkg xdist=()
  meson setup "$build" -Dbuildtype=release -Dpython=enabled -Dcuda=disabled -Dhip=disabled -Dtests=false \
    -Dbench=false -Dexamples=false -Dmpi=disabled -Dnccl=disabled && ninja -C "$build" || return 1
  mkdir -p "$pkg/flashattn"
  cp python/flashattn/*.py python/flashattn/*.pyi python/flashattn/py.typed "$pkg/flashattn/" &&
    cp "$build"/python/_native*.so "$pkg/flashattn/" && cp -L "$build/src/libflashattn.so" "$pkg/flashattn/" || return 1
  python3 -c 'import xdist' 2>/dev/null && xdist=(-n 8)
  (cd "$work" && env PYTHONPATH="$pkg" LD_LIBRARY_PATH="$pkg/flashattn:$stage/lib" FLASHATTN_PLUGIN_DIR="$new" \
    FLASHATTN_REQUIRE_TORCH=1 python3 -m pytest -p no:cacheprovider -rs -q "${xdist[@]}" "$root/python/tests")
}

# ---- facts ----------------------------------------------------------------------------------------
phase_end=$((budget * 10 / 100))
step_now facts 20 facts
# Both plugins load, and the new one knows the family (a context each; no torch, seconds).
plugin_args=(--plugin-dir "new=$new" --kernels "new=$family")
[ -d "$base" ] && plugin_args=(--plugin-dir "base=$base" --kernels base=default "${plugin_args[@]}")
step_now plugins 20 "${lib_env[@]}" python3 bench/gpu/sdpa_compare.py --self-test "${plugin_args[@]}"
summary

# ---- correctness, side by side -------------------------------------------------------------------
phase_end=$((budget * 50 / 100))
test_limit=$((phase_end - 10))
if [ -f bench/gpu/sass_profile.py ]; then
  step_bg sass_profile 90 python3 bench/gpu/sass_profile.py "$new/libflashattn-cuda.so"
else
  step_skip sass_profile "bench/gpu/sass_profile.py is not in this tree"
fi
families=("$family" default)
[ "$mode" = full ] && families=(generic tc fma "$family" default)
declare -A seen=()
for fam in "${families[@]}"; do
  [ -n "${seen[$fam]:-}" ] && continue
  seen[$fam]=1
  kernels=$fam; [ "$fam" = default ] && kernels=
  step_bg "test-$fam" "$test_limit" "${new_env[@]}" FLASHATTN_GPU_SYNC=1 "FLASHATTN_GPU_KERNELS=$kernels" "$new/test_gpu_backends" cuda
done
# Back to back, as in use: a race between launches shows as results that differ between the repeats.
step_bg "repeat-$family" 60 "${new_env[@]}" "FLASHATTN_GPU_KERNELS=$family" "$new/test_gpu_backends" cuda 'test_gpu_repeat_*'
if command -v compute-sanitizer >/dev/null; then
  sanitize() { # tool, family ("" the default), test filter ("" all)
    local kernels=$2; [ "$2" = default ] && kernels=
    "${new_env[@]}" FA_TEST_QUICK=1 "FLASHATTN_GPU_KERNELS=$kernels" \
      compute-sanitizer --tool "$1" --error-exitcode 1 "$new/test_gpu_backends" cuda ${3:+"$3"}
  }
  step_bg "memcheck-$family" "$test_limit" sanitize memcheck "$family" ""
  if [ "$mode" = quick ]; then
    step_bg "racecheck-$family" "$test_limit" sanitize racecheck "$family" test_case_table_f16
  else
    step_bg "racecheck-$family" "$test_limit" sanitize racecheck "$family" ""
    step_bg memcheck-default "$test_limit" sanitize memcheck default ""
    step_bg racecheck-default "$test_limit" sanitize racecheck default test_case_table_f16
    step_bg "synccheck-$family" "$test_limit" sanitize synccheck "$family" ""
    step_bg "initcheck-$family" "$test_limit" sanitize initcheck "$family" ""
  fi
else
  step_skip compute-sanitizer "not on PATH"
fi
[ "$mode" = full ] && step_bg python-suite "$test_limit" python_suite
wait
[ -f "$logs/sass_profile.log" ] && cp "$logs/sass_profile.log" "$out/sass_profile.txt"
summary

# ---- timing, alone on the GPU ----------------------------------------------------------------------
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv -l 1 \
  > "$logs/clocks-during-timing.csv" 2>&1 &
clock_log=$!
phase_end=$((budget * 84 / 100))
sdpa_args=()
[ -d "$base" ] && sdpa_args+=(--plugin-dir "base=$base" --kernels base=default)
[ "$mode" = full ] && sdpa_args+=(--plugin-dir "new-default=$new" --kernels new-default=default)
sdpa_args+=(--plugin-dir "new=$new" --kernels "new=$family" --iters 30 --csv "$out/sdpa.csv" --markdown "$out/sdpa.md")
[ "$mode" = quick ] && sdpa_args+=(--quick)
step_now sdpa "$budget" "${lib_env[@]}" python3 bench/gpu/sdpa_compare.py "${sdpa_args[@]}"
summary

phase_end=$((budget * 98 / 100))
ncu_run() { # plugin name, folder, family
  echo "==== $1 ($2, FLASHATTN_GPU_KERNELS=$3)"
  "${lib_env[@]}" ncu --clock-control none --profile-from-start off -c 8 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section InstructionStats \
    python3 bench/gpu/sdpa_compare.py --plugin-dir "$1=$2" --kernels "$1=$3" --profile "$1" \
    --dtypes f16 --dims 128 --seqlens 4096 --masks dense
}
ncu_all() {
  local rc=0
  ncu_run new "$new" "$family" || rc=1
  if [ "$mode" = full ] && [ -d "$base" ]; then ncu_run base "$base" default || rc=1; fi
  return "$rc"
}
if command -v ncu >/dev/null; then
  step_now ncu "$budget" ncu_all
  cp "$logs/ncu.log" "$out/ncu.txt"
else
  step_skip ncu "not on PATH"
fi
kill "$clock_log" 2>/dev/null
wait "$clock_log" 2>/dev/null

# ---- the record --------------------------------------------------------------------------------------
summary
while read -r name; do
  case $(cut -f1 "$work/status/$name") in PASS | SKIP) ;; *) failed=$((failed + 1)) ;; esac
done < "$work/order"
cat "$out/summary.md"
echo
echo "gpu-run: $mode run in $((SECONDS - start)) s, $failed step(s) failed or timed out; results in $out: $(cd "$out" && echo *)"
rm -rf "$work"
exit "$failed"

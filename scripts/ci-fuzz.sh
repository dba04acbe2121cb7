#!/usr/bin/env bash
# CI step: build the libFuzzer targets (clang, -fsanitize=fuzzer,address,undefined) against a
# coverage-instrumented, sanitized core library, replay every input that once failed a target, then
# fuzz each target from its committed seed corpus (the targets table below; fuzz/README.md says
# what each one drives). Any crash, sanitizer report, unexpected status, write on failure or
# mismatch with the oracle fails the step and leaves the reproducer in build-fuzz/crash-*; the
# step fails when any target fails.
# Usage: scripts/ci-fuzz.sh [source dir] [seconds (default 60)] [emulated seconds (default 0)]
#   Each target fuzzes until FA_FUZZ_RUNS executions (default 100000) or its share of the seconds
#   (the table's percent, plus what the runs that ended before it started left unspent), whichever
#   comes first; the shares add up to the seconds, and the
#   targets run FA_FUZZ_LANES at a time (default FA_CI_JOBS, else 2), so the step takes about
#   seconds / lanes. The emulated seconds, when not 0, are shared by the targets marked "emu": they
#   run again on the CUDA plugin built for the SIMT emulator (tests/gpu/emu) with the same
#   sanitizers and coverage feedback, so the GPU host code and kernels see fuzzed inputs
#   (FA_FUZZ_BACKEND=cuda). A closing table gives each run's executions, time and rate.
#   FA_FUZZ_EXTRA_FLAGS=... extra compiler flags for a local exploration build (e.g.
#                           -fno-sanitize=alignment to fuzz past a known, reported bug); CI sets none
# Needs: clang, libclang-rt-14-dev (libFuzzer and sanitizer runtimes), llvm (llvm-symbolizer), bash 5.1.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
seconds="${2:-60}"
emulated_seconds="${3:-0}"
build=build-fuzz
# One line per target: its share of the CPU seconds in percent (sized so that each reaches
# FA_FUZZ_RUNS executions: at 600 s the slowest needs about 200), and "emu" when it also runs on
# the emulated plugin. Target T is built from fuzz/T.c, starts from its committed seeds in
# fuzz/corpus/T and first replays the inputs that once failed it, fuzz/regressions/T (new corpus
# entries go to build-fuzz/corpus-T, not the repo). Longest first: the lanes then end together.
targets=(
  "fuzz_attention 33 emu"
  "fuzz_kvcache 24 emu"
  "fuzz_varlen 21"
  "fuzz_io 10"
  "fuzz_merge 9"
  "fuzz_dropout_mask 3"
)
sanitize="-fsanitize=address,undefined ${FA_FUZZ_EXTRA_FLAGS:-}"
# The library's feedback: edges and indirect calls, not comparisons. -fsanitize=fuzzer's comparison
# callbacks (trace-cmp) fire on every loop test of the tiles and took 40% of each execution
# (perf: fuzz_attention, fuzz_io); the decoders, built with them, write the boundary values the
# library compares against themselves.
library_coverage="-fsanitize-coverage=inline-8bit-counters,indirect-calls,pc-table"
args=(-Dbuildtype=debugoptimized -Db_lundef=false -Dcuda=disabled -Dhip=disabled -Dbench=false -Dtests=false
      -Dopenmp=disabled "-Dc_args=$sanitize $library_coverage -fno-sanitize-recover=all"
      "-Dc_link_args=$sanitize")
if [ -f "$build/build.ninja" ]; then meson configure "$build" "${args[@]}" >/dev/null
else CC=clang meson setup "$build" "${args[@]}" >/dev/null; fi
meson compile -C "$build" -j "${FA_CI_JOBS:-2}" >/dev/null

# The core archive plus any per-ISA kernel archives. The oracle and the test helpers are built
# once without the fuzzer's coverage instrumentation and without the sanitizers: they only compute
# expected results and compare (what the library reads and writes is checked in the library), and
# instrumented they took most of each execution's time (the fp64 loops).
mapfile -t archives < <(find "$build/src" -name '*.a' | sort)
mkdir -p "$build/support"
support=()
for helper in oracle test_arrays test_util; do
  clang -g -O2 -std=c11 -Iinclude -Isrc -Itests \
    -c "tests/$helper.c" -o "$build/support/$helper.o"
  support+=("$build/support/$helper.o")
done
for entry in "${targets[@]}"; do
  read -r target _ <<<"$entry"
  # The IO model is a library of its own (src/io): its two files of model and run go in with the
  # target; the helpers they share with the core come from the core archive.
  extra=()
  if [ "$target" = fuzz_io ]; then
    for source in src/io/io_model.c src/io/io_sim.c; do
      clang -g -O2 $sanitize $library_coverage -fno-sanitize-recover=all -std=c11 -Iinclude -Isrc \
        -c "$source" -o "$build/support/$(basename "$source" .c).o"
      extra+=("$build/support/$(basename "$source" .c).o")
    done
  fi
  # The C++ runtime of UBSan: the emulated plugin is C++ (its vptr checks need it).
  clang -g -O1 -fsanitize=fuzzer $sanitize -fsanitize-link-c++-runtime -fno-sanitize-recover=all -std=c11 \
    -Iinclude -Isrc -Itests "fuzz/$target.c" "${extra[@]}" "${support[@]}" \
    -Wl,--start-group "${archives[@]}" -Wl,--end-group -lcmocka -lm -ldl -lpthread -o "$build/$target"
done

# Every input that once failed runs first, as a plain regression test (target, its reproducers, log).
replay() {
  local regressions=()
  [ -d "$2" ] && mapfile -t regressions < <(find "$2" -type f | sort)
  [ ${#regressions[@]} -gt 0 ] || return 0
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/$1" "${regressions[@]}" >"$build/$3" 2>&1 ||
    { cat "$build/$3"; echo "ci-fuzz: a regression input of $1 fails"; exit 1; }
  echo "ci-fuzz: ${#regressions[@]} regression inputs of $1 pass"
}
for entry in "${targets[@]}"; do
  read -r target _ <<<"$entry"
  replay "$target" "fuzz/regressions/$target" "regressions-$target.log"
done
runs="${FA_FUZZ_RUNS:-100000}"
lanes="${FA_FUZZ_LANES:-${FA_CI_JOBS:-2}}"
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
: >"$build/runs.txt"
# One target until $runs executions or its time is up (target, seconds, corpus dir under
# build-fuzz, seed corpus, log, label for the closing table).
fuzz() {
  local status=0 start
  start=$(date +%s)
  mkdir -p "$build/$3"
  "$build/$1" -runs="$runs" -max_total_time="$2" -max_len=1024 -timeout=60 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/" "$build/$3" "$4" >"$build/$5" 2>&1 || status=$?
  # The log's summary lines: seed, start and end coverage, any report, final stats.
  grep -E "INFO: Seed|INITED|DONE|runtime error|ERROR|SUMMARY|$1:|stat::|Test unit written" "$build/$5" || true
  tail -n 1 "$build/$5" | grep -E "^#" || true
  local seconds_run=$(( $(date +%s) - start ))
  local executions
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/$5" | tail -n 1)
  echo "$6 ${executions:-0} $seconds_run $status" >>"$build/runs.txt"
  echo "ci-fuzz: $6 ran $seconds_run s, exit status $status (log: $build/$5)"
  return "$status"
}

# Jobs run $lanes at a time, each one's output in its own file, shown when it ends.
declare -A running=() # pid -> job name
declare -A failed=()  # job name -> exit status
reap() {
  local pid= job_status=0
  wait -n -p pid || job_status=$?
  cat "$build/job-${running[$pid]}.txt"
  [ "$job_status" -eq 0 ] || failed[${running[$pid]}]=$job_status
  unset "running[$pid]"
}
start_job() { # name, command...
  local name="$1"
  shift
  while [ "${#running[@]}" -ge "$lanes" ]; do reap; done
  "$@" >"$build/job-$name.txt" 2>&1 &
  running[$!]="$name"
}
finish_jobs() { while [ "${#running[@]}" -gt 0 ]; do reap; done; }

# The emulated CUDA plugin, built like the core library (sanitizers, fuzzer feedback); its device
# memory is host memory of the exact size, so ASan also sees the kernels' out-of-bounds accesses.
# One translation unit of several minutes: it compiles in one lane while the CPU targets fuzz.
emulated=()
for entry in "${targets[@]}"; do
  read -r target _ on_emulator <<<"$entry"
  if [ "${on_emulator:-}" = emu ]; then emulated+=("$target"); fi
done
plugin="$build/emu-cuda/libflashattn-cuda.so"
build_plugin() {
  if [ -f "$plugin" ] && [ -z "$(find src/gpu src/common include tests/gpu/emu -newer "$plugin" -print -quit)" ]; then return 0; fi
  mkdir -p "$build/emu-cuda"
  local start
  start=$(date +%s)
  clang++ -std=c++17 -g -O1 -fPIC -shared $sanitize -fsanitize=fuzzer-no-link -fno-sanitize-recover=all \
    -fvisibility=hidden -DFA_GPU_EMULATOR='"emu_runtime.h"' -DEMU_TARGET_CUDA -Wno-unknown-pragmas \
    -Itests/gpu/emu -Iinclude -Isrc tests/gpu/emu/emu_plugin.cpp tests/gpu/emu/emu_core.cpp -o "$plugin.tmp" \
    >"$build/emu-cuda/build.log" 2>&1 || { cat "$build/emu-cuda/build.log"; return 1; }
  mv "$plugin.tmp" "$plugin"
  echo "ci-fuzz: emulated CUDA plugin built in $(( $(date +%s) - start )) s"
}
fuzz_emulated() { FA_FUZZ_BACKEND=cuda FLASHATTN_PLUGIN_DIR="$PWD/$build/emu-cuda" fuzz "$@"; }
on_emulator=0
if [ "$emulated_seconds" -gt 0 ] && [ ${#emulated[@]} -gt 0 ]; then
  on_emulator=1
  start_job emulated-plugin build_plugin
fi

# A run that reaches its executions early leaves seconds of its share unspent: the next run to
# start gets them on top of its own share (the sum of the CPU runs' times stays within $seconds).
declare -A granted=() # CPU run -> the seconds it was given
handed=0              # unspent seconds already given to later runs
unspent_seconds() {
  local label executions seconds_run _ left=0
  while read -r label executions seconds_run _; do
    [ -n "${granted[$label]:-}" ] && left=$(( left + granted[$label] - seconds_run ))
  done <"$build/runs.txt"
  echo $(( left - handed > 0 ? left - handed : 0 ))
}
step_start=$(date +%s)
for entry in "${targets[@]}"; do
  read -r target percent _ <<<"$entry"
  share=$(( seconds * percent / 100 > 0 ? seconds * percent / 100 : 1 ))
  while [ "${#running[@]}" -ge "$lanes" ]; do reap; done # the lane first: then what the finished left is known
  extra=$(unspent_seconds)
  handed=$(( handed + extra ))
  share=$(( share + extra ))
  granted[$target]=$share
  start_job "$target" fuzz "$target" "$share" "corpus-$target" "fuzz/corpus/$target" "fuzz-$target.log" "$target"
done
finish_jobs

if [ "$on_emulator" = 1 ]; then
  [ -z "${failed[emulated-plugin]:-}" ] || { echo "ci-fuzz: the emulated CUDA plugin did not build"; exit 1; }
  share=$(( emulated_seconds / ${#emulated[@]} > 0 ? emulated_seconds / ${#emulated[@]} : 1 ))
  for target in "${emulated[@]}"; do
    start_job "emu-$target" fuzz_emulated \
      "$target" "$share" "corpus-emu-$target" "fuzz/corpus/$target" "fuzz-emu-$target.log" "$target/emulated-cuda"
  done
  finish_jobs
fi

echo "ci-fuzz: executions per run (goal on the CPU: $runs each), $(( $(date +%s) - step_start )) s on $lanes lanes"
below=0
while read -r label executions seconds_run exit_status; do
  rate=$(( seconds_run > 0 ? executions / seconds_run : executions ))
  note=
  if [ "$executions" -lt "$runs" ] && [[ "$label" != */emulated-* ]]; then note="  below the goal"; below=$(( below + 1 )); fi
  given=${granted[$label]:-}
  printf '  %-28s %9d executions %5d s %7d/s  exit %d%s%s\n' "$label" "$executions" "$seconds_run" "$rate" "$exit_status" \
    "${given:+  (given $given s)}" "$note"
done < <(sort "$build/runs.txt")
[ "$below" -eq 0 ] || echo "ci-fuzz: $below CPU run(s) stopped at their time share before $runs executions (a slower machine)"
for job in "${!failed[@]}"; do echo "ci-fuzz: $job failed (exit status ${failed[$job]})"; done
[ "${#failed[@]}" -eq 0 ]

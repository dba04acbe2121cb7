#!/usr/bin/env bash
# CI step: build the libFuzzer targets (clang, -fsanitize=fuzzer,address,undefined) against a
# coverage-instrumented, sanitized core library, replay every input that once failed a target, then
# fuzz each target for its share of a bounded time starting from its committed seed corpus (the
# targets table below; fuzz/README.md says what each one drives). Any crash, sanitizer report,
# unexpected status, write on failure or mismatch with the oracle fails the step and leaves the
# reproducer in build-fuzz/crash-*; the step fails when any target fails.
# Usage: scripts/ci-fuzz.sh [source dir] [seconds (default 60)] [emulated seconds (default 0)]
#   The seconds are the total on the CPU backend, shared by the targets' weights (each gets at
#   least 1 s). The emulated seconds, when not 0, are shared by the targets marked "emu": they run
#   again on the CUDA plugin built for the SIMT emulator (tests/gpu/emu) with the same sanitizers and
#   coverage feedback, so the GPU host code and kernels see fuzzed inputs (FA_FUZZ_BACKEND=cuda).
#   FA_FUZZ_JOBS=n          parallel fuzzing jobs (default 1)
#   FA_FUZZ_EXTRA_FLAGS=... extra compiler flags for a local exploration build (e.g.
#                           -fno-sanitize=alignment to fuzz past a known, reported bug); CI sets none
# Needs: clang, libclang-rt-14-dev (libFuzzer and sanitizer runtimes), llvm (llvm-symbolizer).
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
seconds="${2:-60}"
emulated_seconds="${3:-0}"
build=build-fuzz
# One line per target: its share of the time, and "emu" when it also runs on the emulated plugin.
# Target T is built from fuzz/T.c, starts from its committed seeds in fuzz/corpus/T and first
# replays the inputs that once failed it, fuzz/regressions/T (new corpus entries go to
# build-fuzz/corpus-T, not the repo).
targets=(
  "fuzz_attention 2 emu"
  "fuzz_kvcache 1 emu"
  "fuzz_varlen 2"
  "fuzz_merge 1"
  "fuzz_dropout_mask 1"
  "fuzz_io 1"
)
sanitize="-fsanitize=address,undefined ${FA_FUZZ_EXTRA_FLAGS:-}"
args=(-Dbuildtype=debugoptimized -Db_lundef=false -Dcuda=disabled -Dhip=disabled -Dbench=false -Dtests=false
      -Dopenmp=disabled "-Dc_args=$sanitize -fsanitize=fuzzer-no-link -fno-sanitize-recover=all"
      "-Dc_link_args=$sanitize")
if [ -f "$build/build.ninja" ]; then meson configure "$build" "${args[@]}" >/dev/null
else CC=clang meson setup "$build" "${args[@]}" >/dev/null; fi
meson compile -C "$build" -j "${FA_CI_JOBS:-2}" >/dev/null

# The core archive plus any per-ISA kernel archives. The oracle and the test helpers are built
# once without the fuzzer's coverage instrumentation: they only check results, and instrumented
# they took most of each execution's time (comparison callbacks in the fp64 loops).
mapfile -t archives < <(find "$build/src" -name '*.a' | sort)
mkdir -p "$build/support"
support=()
for helper in oracle test_arrays test_util; do
  clang -g -O2 $sanitize -fno-sanitize-recover=all -std=c11 -Iinclude -Isrc -Itests \
    -c "tests/$helper.c" -o "$build/support/$helper.o"
  support+=("$build/support/$helper.o")
done
for entry in "${targets[@]}"; do
  read -r target _ <<<"$entry"
  # The IO model is a library of its own (src/io): its two files of model and run go in with the
  # target; the helpers they share with the core come from the core archive.
  extra=()
  if [ "$target" = fuzz_io ]; then extra=(src/io/io_model.c src/io/io_sim.c); fi
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
jobs=()
[ "${FA_FUZZ_JOBS:-1}" -gt 1 ] && jobs=(-jobs="$FA_FUZZ_JOBS" -workers="$FA_FUZZ_JOBS")
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# One target for a bounded time (target, seconds, corpus dir under build-fuzz, seed corpus, log).
fuzz() {
  local status=0 start
  start=$(date +%s)
  mkdir -p "$build/$3"
  "$build/$1" -max_total_time="$2" -max_len=1024 -timeout=60 -rss_limit_mb=2048 "${jobs[@]}" \
    -print_final_stats=1 -artifact_prefix="$build/" "$build/$3" "$4" >"$build/$5" 2>&1 || status=$?
  # The log's summary lines: seed, start and end coverage, any report, final stats.
  grep -E "INFO: Seed|INITED|DONE|runtime error|ERROR|SUMMARY|$1:|stat::|Test unit written" "$build/$5" || true
  tail -n 1 "$build/$5" | grep -E "^#" || true
  echo "ci-fuzz: $1 ran $(( $(date +%s) - start )) s, exit status $status (log: $build/$5)"
  return "$status"
}
# The emulated CUDA plugin, built like the core library (sanitizers, fuzzer feedback); its device
# memory is host memory of the exact size, so ASan also sees the kernels' out-of-bounds accesses.
# One translation unit of several minutes: it compiles on the second core while the CPU targets
# fuzz on the first.
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
plugin_job=
if [ "$emulated_seconds" -gt 0 ] && [ ${#emulated[@]} -gt 0 ]; then
  build_plugin &
  plugin_job=$!
fi

total_weight=0
for entry in "${targets[@]}"; do read -r _ weight _ <<<"$entry"; total_weight=$(( total_weight + weight )); done
status=0
for entry in "${targets[@]}"; do
  read -r target weight _ <<<"$entry"
  share=$(( seconds * weight / total_weight > 0 ? seconds * weight / total_weight : 1 ))
  fuzz "$target" "$share" "corpus-$target" "fuzz/corpus/$target" "fuzz-$target.log" || { s=$?; [ "$status" -ne 0 ] || status=$s; }
done

if [ -n "$plugin_job" ]; then
  wait "$plugin_job" || { echo "ci-fuzz: the emulated CUDA plugin did not build"; exit 1; }
  for target in "${emulated[@]}"; do
    share=$(( emulated_seconds / ${#emulated[@]} > 0 ? emulated_seconds / ${#emulated[@]} : 1 ))
    FA_FUZZ_BACKEND=cuda FLASHATTN_PLUGIN_DIR="$PWD/$build/emu-cuda" \
      fuzz "$target" "$share" "corpus-emu-$target" "fuzz/corpus/$target" "fuzz-emu-$target.log" || { s=$?; [ "$status" -ne 0 ] || status=$s; }
  done
fi
exit "$status"

#!/usr/bin/env bash
# CI step: build the libFuzzer target (clang, -fsanitize=fuzzer,address,undefined) against a
# coverage-instrumented, sanitized core library, then fuzz for a bounded time starting from the
# committed seed corpus (fuzz/corpus). Any crash, sanitizer report, unexpected status or
# mismatch with the oracle fails the step and leaves the reproducer in build-fuzz/crash-*.
# Usage: scripts/ci-fuzz.sh [source dir] [seconds (default 60)]
#   FA_FUZZ_JOBS=n          parallel fuzzing jobs (default 1)
#   FA_FUZZ_EXTRA_FLAGS=... extra compiler flags for a local exploration build (e.g.
#                           -fno-sanitize=alignment to fuzz past a known, reported bug); CI sets none
# Needs: clang, libclang-rt-14-dev (libFuzzer and sanitizer runtimes), llvm (llvm-symbolizer).
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
seconds="${2:-60}"
build=build-fuzz
sanitize="-fsanitize=address,undefined ${FA_FUZZ_EXTRA_FLAGS:-}"
args=(-Dbuildtype=debugoptimized -Db_lundef=false -Dcuda=disabled -Dhip=disabled -Dbench=false -Dtests=false
      -Dopenmp=disabled "-Dc_args=$sanitize -fsanitize=fuzzer-no-link -fno-sanitize-recover=all"
      "-Dc_link_args=$sanitize")
if [ -f "$build/build.ninja" ]; then meson configure "$build" "${args[@]}" >/dev/null
else CC=clang meson setup "$build" "${args[@]}" >/dev/null; fi
meson compile -C "$build" -j "${FA_CI_JOBS:-2}" >/dev/null

# The core archive plus any per-ISA kernel archives; the oracle is compiled into the target.
mapfile -t archives < <(find "$build/src" -name '*.a' | sort)
clang -g -O1 -fsanitize=fuzzer $sanitize -fno-sanitize-recover=all -std=c11 \
  -Iinclude -Isrc -Itests fuzz/fuzz_attention.c tests/oracle.c tests/test_arrays.c tests/test_util.c \
  -Wl,--start-group "${archives[@]}" -Wl,--end-group -lcmocka -lm -ldl -lpthread -o "$build/fuzz_attention"

# Every input that once failed runs first, as a plain regression test.
mapfile -t regressions < <(find fuzz/regressions -type f | sort)
if [ ${#regressions[@]} -gt 0 ]; then
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/fuzz_attention" "${regressions[@]}" >"$build/regressions.log" 2>&1 ||
    { cat "$build/regressions.log"; echo "ci-fuzz: a regression input fails"; exit 1; }
  echo "ci-fuzz: ${#regressions[@]} regression inputs pass"
fi

mkdir -p "$build/corpus"
jobs=()
[ "${FA_FUZZ_JOBS:-1}" -gt 1 ] && jobs=(-jobs="$FA_FUZZ_JOBS" -workers="$FA_FUZZ_JOBS")
start=$(date +%s)
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
"$build/fuzz_attention" -max_total_time="$seconds" -max_len=1024 -timeout=60 -rss_limit_mb=2048 "${jobs[@]}" \
  -print_final_stats=1 -artifact_prefix="$build/" "$build/corpus" fuzz/corpus >"$build/fuzz.log" 2>&1 || status=$?
# The log's summary lines: seed, start and end coverage, any report, final stats.
grep -E "INFO: Seed|INITED|DONE|runtime error|ERROR|SUMMARY|fuzz_attention:|stat::|Test unit written" "$build/fuzz.log" || true
tail -n 1 "$build/fuzz.log" | grep -E "^#" || true
echo "ci-fuzz: ran $(( $(date +%s) - start )) s, exit status $status (log: $build/fuzz.log)"
exit "$status"

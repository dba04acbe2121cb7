#!/usr/bin/env bash
# CI step: build the libFuzzer targets (clang, -fsanitize=fuzzer,address,undefined) against a
# coverage-instrumented, sanitized core library, then fuzz each for a bounded time starting from
# its committed seed corpus: fuzz_attention (fa_forward/fa_backward, fuzz/corpus), then
# fuzz_kvcache (fa_forward_kvcache_ex, fuzz/corpus-kvcache). Any crash, sanitizer report,
# unexpected status or mismatch with the oracle fails the step and leaves the reproducer in
# build-fuzz/crash-*; the step fails when either target fails.
# Usage: scripts/ci-fuzz.sh [source dir] [seconds (default 60)]
#   The seconds are the total: two thirds for fuzz_attention, the rest for fuzz_kvcache
#   (60 -> 40 s + 20 s; each target gets at least 1 s).
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

# The core archive plus any per-ISA kernel archives; the oracle is compiled into the targets.
mapfile -t archives < <(find "$build/src" -name '*.a' | sort)
for target in fuzz_attention fuzz_kvcache; do
  clang -g -O1 -fsanitize=fuzzer $sanitize -fno-sanitize-recover=all -std=c11 \
    -Iinclude -Isrc -Itests "fuzz/$target.c" tests/oracle.c tests/test_arrays.c tests/test_util.c \
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
replay fuzz_attention fuzz/regressions regressions.log
replay fuzz_kvcache fuzz/regressions-kvcache regressions-kvcache.log

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
attention_seconds=$(( seconds * 2 / 3 > 0 ? seconds * 2 / 3 : 1 ))
kvcache_seconds=$(( seconds - attention_seconds > 0 ? seconds - attention_seconds : 1 ))
status=0
fuzz fuzz_attention "$attention_seconds" corpus fuzz/corpus fuzz.log || status=$?
fuzz fuzz_kvcache "$kvcache_seconds" corpus-kvcache fuzz/corpus-kvcache fuzz-kvcache.log || { s=$?; [ "$status" -ne 0 ] || status=$s; }
exit "$status"

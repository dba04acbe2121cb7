#!/usr/bin/env bash
# CI step: the test suite under sanitizers, on the CPU path (GPU plugins are not built: their
# device code cannot be sanitized without a device, and their host side is covered by the
# plugin-loader tests of the normal build).
#  1. ASan + UBSan (gcc, libgomp): every test, FA_TEST_QUICK=1, the emulated GPU suite included
#     (its mutation check builds unsanitized plugins of its own: not here; the runs in suite
#     emu-twin repeat what another run drives: not here either, for time). LeakSanitizer runs at exit of
#     each test, so the allocation-failure walk also proves that failures leak nothing; huge
#     requests return NULL (allocator_may_return_null) as they would from malloc. Built with the
#     benchmarks (their smoke test runs each program once, so LeakSanitizer checks them too) and
#     with gcc's --coverage: scripts/ci-coverage.sh reports and checks the line and branch coverage
#     of this one run instead of running the suite a second time.
#  2. ThreadSanitizer (clang, LLVM's libomp with the Archer tool so OpenMP regions are understood
#     by TSan): the hardening suite (threads, determinism, allocation failures).
# Usage: scripts/ci-sanitize.sh [source dir]   (build dirs build-asan and build-tsan inside it)
# Needs: gcc, clang, libclang-rt-14-dev, libomp-14-dev (libarcher), llvm (llvm-symbolizer).
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
export FA_TEST_QUICK=1
jobs="${FA_CI_JOBS:-2}"

setup() { # dir, meson args...
  local dir="$1"; shift
  if [ -f "$dir/build.ninja" ]; then meson configure "$dir" "$@" >/dev/null
  else meson setup "$dir" "$@" >/dev/null; fi
}
common=(-Dbuildtype=debugoptimized -Db_lundef=false -Dcuda=disabled -Dhip=disabled -Dtests=true)

step_start=$(date +%s)
echo "ci-sanitize: ASan + UBSan build"
# Counters of an earlier run would add up with this one's.
[ -d build-asan ] && find build-asan -name '*.gcda' -delete
# -fprofile-update=single: with -pthread (the C code) gcc makes every coverage counter an atomic
# increment, which made the kernels' tests several times slower (checkasm about 20x). Plain
# increments racing between the two OpenMP threads can only make a count come out low.
# --exclude-libs: gcc 12's libgcov exports mangle_path, which the shared libraries' export checks
# (library_exports) would rightly reject.
link_args="-fno-sanitize-recover=all -Wl,--exclude-libs,libgcov.a"
setup build-asan "${common[@]}" -Dbench=true -Db_coverage=true -Db_sanitize=address,undefined \
  "-Dc_args=-fno-sanitize-recover=all -fprofile-update=single" "-Dc_link_args=$link_args" \
  -Dcpp_args=-fno-sanitize-recover=all "-Dcpp_link_args=$link_args"
meson compile -C build-asan -j "$jobs" >/dev/null
ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  meson test -C build-asan --num-processes "$jobs" --print-errorlogs --timeout-multiplier 4 --no-suite mutation \
    --no-suite emu-twin
echo "ci-sanitize: ASan + UBSan done in $(( $(date +%s) - step_start )) s"

step_start=$(date +%s)
echo "ci-sanitize: ThreadSanitizer build (clang, libomp + archer)"
archer=$(ls /usr/lib/llvm-*/lib/libarcher.so 2>/dev/null | head -n 1 || true)
openmp=enabled
if [ -z "$archer" ]; then
  echo "ci-sanitize: libarcher.so not found; TSan build without OpenMP"
  openmp=disabled
fi
CC=clang setup build-tsan "${common[@]}" -Dbench=false -Db_sanitize=thread -Dopenmp="$openmp"
meson compile -C build-tsan -j "$jobs" >/dev/null
TSAN_OPTIONS="halt_on_error=1:allocator_may_return_null=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1" OMP_TOOL_LIBRARIES="$archer" \
  meson test -C build-tsan --suite hardening --num-processes 1 --print-errorlogs --timeout-multiplier 10
echo "ci-sanitize: ThreadSanitizer done in $(( $(date +%s) - step_start )) s"

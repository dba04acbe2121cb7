#!/usr/bin/env bash
# CI step: valgrind memcheck over the CPU test suite (FA_TEST_QUICK=1 sizes). Any memcheck error
# or definitely/indirectly lost block fails the run. OpenMP's persistent thread pool leaves
# "possibly lost" thread stacks at exit by design: those are not counted.
# Usage: scripts/ci-valgrind.sh [source dir]   (build dir build-valgrind inside it)
# Needs: valgrind.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
export FA_TEST_QUICK=1
jobs="${FA_CI_JOBS:-2}"

args=(-Dbuildtype=debugoptimized -Dcuda=disabled -Dhip=disabled -Dbench=false -Dtests=true)
if [ -f build-valgrind/build.ninja ]; then meson configure build-valgrind "${args[@]}" >/dev/null
else meson setup build-valgrind "${args[@]}" >/dev/null; fi
meson compile -C build-valgrind -j "$jobs" >/dev/null

start=$(date +%s)
wrap="valgrind --tool=memcheck --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect"
wrap+=" --show-leak-kinds=definite,indirect --track-origins=yes --quiet"
meson test -C build-valgrind --wrap="$wrap" --num-processes "$jobs" --print-errorlogs --timeout-multiplier 20 "$@"
echo "ci-valgrind: done in $(( $(date +%s) - start )) s"

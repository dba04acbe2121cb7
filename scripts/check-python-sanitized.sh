#!/usr/bin/env bash
# The Python binding under AddressSanitizer + UndefinedBehaviorSanitizer: the C extension and the
# library built with -fsanitize=address,undefined, loaded by an unsanitized interpreter through
# LD_PRELOAD, and the package's pytest suite run against it (torch.compile tests deselected:
# inductor compiles C++ under the preloaded runtime for minutes). Catches the binding's own
# memory errors: DLPack capsules used after release, tables read out of bounds, refcount slips
# that free a buffer still in use. Leak checking is off: the interpreter itself never frees
# everything at exit. Then fuzz/fuzz_dlpack.py fuzzes the DLPack import on that binding.
# Usage: scripts/check-python-sanitized.sh PYTHON [source dir]
#   PYTHON: an interpreter with numpy, pytest (and torch, for its tests) of the Python version
#   meson finds; the build goes to build-pyasan inside the source dir.
#   FA_FUZZ_DLPACK_SECONDS: how long fuzz_dlpack runs (default 60; atheris is pip-installed if missing).
set -euo pipefail
python=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # not realpath: a venv's python is a link
cd "${2:-$(dirname "$0")/..}"
root=$PWD
start=$(date +%s)
build=$root/build-pyasan
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dbuildtype=debugoptimized -Db_lundef=false -Dcuda=disabled -Dhip=disabled -Dbench=false \
    -Dtests=false -Dpython=enabled -Db_sanitize=address,undefined -Dc_args=-fno-sanitize-recover=all \
    -Dc_link_args=-fno-sanitize-recover=all >/dev/null
fi
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
ninja -C "$build" "python/_native$suffix" >/dev/null
pkg=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-pyasan.XXXXXX")
trap 'rm -rf "$pkg"' EXIT
mkdir "$pkg/flashattn"
cp "$root"/python/flashattn/*.py "$root"/python/flashattn/*.pyi "$pkg/flashattn/"
cp "$build/python/_native$suffix" "$pkg/flashattn/"
cd "$pkg"  # not the source tree: conftest refuses a package imported from there
LD_LIBRARY_PATH="$build/src" LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 PYTHONPATH="$pkg" \
  "$python" -m pytest -q -p no:cacheprovider -k "not compile" "$root/python/tests"
# fuzz/fuzz_dlpack.py (Atheris) on the same sanitized binding for FA_FUZZ_DLPACK_SECONDS (default 60).
# The preload stays gcc's libasan: the binding is built by gcc against it, and atheris's
# asan_with_fuzzer.so (clang's runtime) aborts with "incompatible ASan runtimes". libasan then also
# answers libFuzzer's coverage callbacks, so the run has no coverage feedback: the harness's custom
# mutator makes half its inputs fresh random bytes, which decode as well as any.
if "$python" -c "import atheris" 2>/dev/null || "$python" -m pip install -q atheris >/dev/null 2>&1; then
  seconds=${FA_FUZZ_DLPACK_SECONDS:-60}
  mkdir "$pkg/corpus"
  LD_LIBRARY_PATH="$build/src" LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 PYTHONPATH="$pkg" \
    "$python" "$root/fuzz/fuzz_dlpack.py" -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$root/build-pyasan/fuzz_dlpack-" "$pkg/corpus" "$root/fuzz/corpus/fuzz_dlpack" \
    "$root/fuzz/regressions/fuzz_dlpack"
else
  echo "check-python-sanitized: fuzz_dlpack skipped: atheris not installable"
fi
echo "check-python-sanitized: done in $(( $(date +%s) - start )) s"

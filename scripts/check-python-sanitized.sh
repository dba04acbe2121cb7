#!/usr/bin/env bash
# The Python binding under AddressSanitizer + UndefinedBehaviorSanitizer: the C extension and the
# library built with -fsanitize=address,undefined, loaded by an unsanitized interpreter through
# LD_PRELOAD, and the package's pytest suite run against it (torch.compile tests deselected:
# inductor compiles C++ under the preloaded runtime for minutes). Catches the binding's own
# memory errors: DLPack capsules used after release, tables read out of bounds, refcount slips
# that free a buffer still in use. Leak checking is off: the interpreter itself never frees
# everything at exit.
# Usage: scripts/check-python-sanitized.sh PYTHON [source dir]
#   PYTHON: an interpreter with numpy, pytest (and torch, for its tests) of the Python version
#   meson finds; the build goes to build-pyasan inside the source dir.
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
echo "check-python-sanitized: done in $(( $(date +%s) - start )) s"

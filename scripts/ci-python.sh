#!/usr/bin/env bash
# CI step for the Python package: `pip wheel .` (meson-python, build isolation, as a user's
# `pip install .`), then a fresh virtual environment gets the wheel plus numpy, pytest and torch
# (PyPI's torch is the CUDA build, ~5 GB installed; it runs on the CPU), and pytest runs the suite
# in python/tests against the INSTALLED package from outside the source tree, then every program in
# examples/python runs (each checks its own results).
# The wheel is built without the GPU plugins: the main build already compiles them (~8 min on the
# 2-core CI machine) and nothing here can run them. Prints the time of each phase.
# The venv is ~5.6 GB: pip runs without its cache (which would double that) and a temporary work
# folder is removed on exit, so repeated runs on one machine do not fill its disk.
#   FA_PY_CI_DIR=dir   work folder, kept (default: a new temporary folder, removed on exit)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
if [ -n "${FA_PY_CI_DIR:-}" ]; then
  work=$FA_PY_CI_DIR
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-py.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
export PIP_NO_CACHE_DIR=1
venv=$work/venv
phase_start=$(date +%s)
phase() { local now; now=$(date +%s); echo "ci-python: $1 in $((now - phase_start)) s"; phase_start=$now; }

rm -rf "$venv" "$work/wheel"
df -h "$work" | awk 'NR == 2 { print "ci-python: " $4 " free on " $6 " before the install" }'
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q numpy pytest torch
phase "installed numpy, pytest, torch"

"$venv/bin/python" -m pip wheel -q --no-deps -w "$work/wheel" \
  -Csetup-args=-Dcuda=disabled -Csetup-args=-Dhip=disabled "$root"
"$venv/bin/python" -m pip install -q "$work"/wheel/flashattn-*.whl
phase "built and installed the wheel ($(basename "$work"/wheel/flashattn-*.whl))"

cd "$work"  # not the source tree: `import flashattn` must find the installed package
status=0
FLASHATTN_REQUIRE_TORCH=1 "$venv/bin/python" -m pytest -p no:cacheprovider -rs "$root/python/tests" || status=$?
phase "pytest"
if [ "$status" -eq 5 ]; then
  echo "ci-python: pytest collected no tests"
  exit 1
fi
# Every Python example, also from outside the source tree. Each checks what it computes and exits
# non-zero when a check fails; a failing one fails this script (the other examples still run).
# The defaults are sized for CI (a few seconds each on 2 cores) unless set here.
for example in "$root"/examples/python/*.py; do
  name=$(basename "$example" .py)
  case $name in
    train_tiny_attention) args=(--steps 3) ;;
    *) args=() ;;
  esac
  "$venv/bin/python" "$example" "${args[@]}" || { echo "ci-python: example $name failed"; status=1; }
  phase "example $name"
done
"$venv/bin/python" "$root/tests/install/readme_snippets.py" --python "$root/README.md" || status=1
phase "README's python blocks"
# The binding again, built with ASan + UBSan (its own build folder, build-pyasan; ~3 min).
"$root/scripts/check-python-sanitized.sh" "$venv/bin/python" "$root" || status=1
phase "the suite on the sanitized binding"
exit "$status"

#!/usr/bin/env bash
# One command for a machine with a GPU (docs/GPU.md, "First run on hardware"): builds the plugin
# for the GPU found, runs every GPU test with FLASHATTN_REQUIRE_GPU=1 (a plugin that does not load
# fails instead of skipping) and FLASHATTN_GPU_SYNC=1 (a faulting kernel is named), runs
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over the quick case set of every
# kernel family, then the GPU benchmarks (cuBLAS standard attention and PyTorch SDPA, same run),
# and writes everything to bench/results/gpu-<gpu name>.txt. A step that fails is recorded and the
# next one still runs; the exit status is the number of failed steps.
# Usage: scripts/gpu-validate.sh [build dir (default build-gpu)]
# Needs: meson, ninja, cmocka (libcmocka-dev, or a meson wrap of it), and nvcc (NVIDIA) or hipcc
# (AMD); compute-sanitizer and a CUDA build of PyTorch for the optional steps.
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-gpu}"
failed=0
summary=()

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  vendor=cuda
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d '.')
  build_args=(-Dcuda=enabled -Dhip=disabled "-Dgpu_cuda_archs=$arch")
elif command -v rocminfo >/dev/null && rocminfo 2>/dev/null | grep -q 'gfx'; then
  vendor=hip
  arch=$(rocminfo | grep -o -m 1 'gfx[0-9a-f]*')
  gpu="AMD $arch"
  build_args=(-Dcuda=disabled -Dhip=enabled "-Dgpu_hip_archs=$arch")
else
  echo "gpu-validate: no NVIDIA (nvidia-smi) or AMD (rocminfo) GPU found" >&2
  exit 1
fi
name=$(echo "$gpu" | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9._-')
results="bench/results/gpu-$name.txt"
mkdir -p bench/results
log="$build-validate.log"
: > "$log"

record() { # title, command...: runs it, appends its output to the log, notes PASS/FAIL
  local title="$1"; shift
  local start=$SECONDS
  echo "== $title" | tee -a "$log"
  if "$@" >> "$log" 2>&1; then
    summary+=("PASS  $title ($((SECONDS - start)) s)")
  else
    summary+=("FAIL  $title ($((SECONDS - start)) s, exit $?)")
    failed=$((failed + 1))
  fi
}

{
  echo "# flashattn GPU validation: $gpu"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)   commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (modified tree)')"
  if [ "$vendor" = cuda ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv
    nvcc --version | tail -n 2
  else
    rocminfo | grep -m 3 -E 'Marketing Name|gfx'
    hipcc --version | head -n 2
  fi
} > "$results.head" 2>&1

setup_build() {
  if [ -f "$build/build.ninja" ]; then meson configure "$build" "${build_args[@]}"
  else meson setup "$build" -Dbuildtype=release -Dtests=true -Dbench=true "${build_args[@]}"; fi
  ninja -C "$build"
}
record "build ($vendor, $arch)" setup_build

# Every GPU test: host-side planning and layouts, the case table of each kernel family, plugin
# exports; the emulated suite (emu) is the CPU stand-in and not rerun here.
export FLASHATTN_REQUIRE_GPU=1 FLASHATTN_GPU_SYNC=1
record "GPU tests (meson test --suite gpu)" meson test -C "$build" --suite gpu --no-suite emu --print-errorlogs --num-processes 1

if [ "$vendor" = cuda ] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck synccheck initcheck; do
    for family in generic tc fma; do
      record "compute-sanitizer $tool, $family kernels (quick cases)" \
        env FA_TEST_QUICK=1 FLASHATTN_BACKEND= FLASHATTN_PLUGIN_DIR="$build/src" FLASHATTN_GPU_KERNELS=$family \
        compute-sanitizer --tool "$tool" --error-exitcode 1 "$build/tests/gpu/test_gpu_backends" cuda
    done
  done
elif [ "$vendor" = cuda ]; then
  summary+=("SKIP  compute-sanitizer (not on PATH)")
fi

bench_standard() {
  local exe="$build/bench/gpu/fa-bench-standard-attention"
  [ -x "$exe" ] || { echo "$exe was not built (needs cuBLAS)"; return 1; }
  for dtype in f16 bf16; do
    for d in 64 128; do
      for n in 1024 4096 16384; do
        "$exe" --dtype $dtype --d $d --n $n || return 1
        "$exe" --dtype $dtype --d $d --n $n --causal || return 1
      done
    done
  done
}
bench_sdpa() {
  for family in generic tc; do
    echo "-- FLASHATTN_GPU_KERNELS=$family"
    FLASHATTN_GPU_SYNC=0 FLASHATTN_GPU_KERNELS=$family python3 bench/gpu/sdpa_compare.py --lib "$build/src/libflashattn.so" || return 1
  done
}
if [ "$vendor" = cuda ]; then
  unset FLASHATTN_GPU_SYNC # timing without a synchronisation after every launch
  record "benchmark: cuBLAS standard attention vs flashattn" bench_standard
  if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    record "benchmark: PyTorch SDPA vs flashattn" bench_sdpa
  else
    summary+=("SKIP  PyTorch SDPA benchmark (no CUDA build of torch)")
  fi
fi

{
  cat "$results.head"
  echo
  echo "## summary"
  printf '%s\n' "${summary[@]}"
  echo
  echo "## log"
  cat "$log"
} > "$results"
rm -f "$results.head"
echo
printf '%s\n' "${summary[@]}"
echo "gpu-validate: $failed step(s) failed; results in $results"
exit "$failed"

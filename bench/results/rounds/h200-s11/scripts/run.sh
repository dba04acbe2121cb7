#!/usr/bin/env bash
# One lease call: prebuilt plugin (sm_90, built on the dev machine), correctness in parallel, then timing.
set -u
cd "$(dirname "$0")/.."
H=.h200
B=$H/bin
export LD_LIBRARY_PATH=$PWD/$H/lib:$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
L=$OUT/logs; mkdir -p $L
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,compute_cap --format=csv; nvcc --version | tail -2; python3 -c 'import torch;print(torch.__version__, torch.version.cuda)'; lscpu | grep 'Model name'; pwd; } > $L/env.txt 2>&1
cat $L/env.txt
export FLASHATTN_PLUGIN_DIR=$PWD/$B FLASHATTN_REQUIRE_GPU=1
step() { # name timeout cmd...
  local name=$1 t=$2; shift 2; local s=$SECONDS
  timeout $t "$@" > $L/$name.log 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS-s))s" >> $L/steps.txt
}
# correctness, in parallel (timings later, alone)
( step test_generic 240 env FLASHATTN_GPU_SYNC=1 $B/test_gpu_backends cuda ) &
( step test_tc 240 env FLASHATTN_GPU_SYNC=1 FLASHATTN_GPU_KERNELS=tc $B/test_gpu_backends cuda ) &
( step test_fma 240 env FLASHATTN_GPU_SYNC=1 FLASHATTN_GPU_KERNELS=fma $B/test_gpu_backends cuda ) &
( step memcheck_generic 240 env FA_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 1 $B/test_gpu_backends cuda ) &
( step memcheck_tc 240 env FA_TEST_QUICK=1 FLASHATTN_GPU_KERNELS=tc compute-sanitizer --tool memcheck --error-exitcode 1 $B/test_gpu_backends cuda ) &
( step racecheck_tc 240 env FA_TEST_QUICK=1 FLASHATTN_GPU_KERNELS=tc compute-sanitizer --tool racecheck --error-exitcode 1 $B/test_gpu_backends cuda ) &
( step racecheck_generic 240 env FA_TEST_QUICK=1 compute-sanitizer --tool racecheck --error-exitcode 1 $B/test_gpu_backends cuda ) &
wait
cat $L/steps.txt
for f in test_generic test_tc test_fma memcheck_generic memcheck_tc racecheck_tc racecheck_generic; do
  echo "== $f"; grep -E "FAILED|ERROR|error|PASSED|SKIPPED|Invalid|hazard|RACECHECK SUMMARY|ERROR SUMMARY" $L/$f.log | head -25
done
# timing, alone on the GPU
for fam in generic tc; do
  step sdpa_$fam 150 env FLASHATTN_GPU_KERNELS=$fam PYTHONUNBUFFERED=1 python3 bench/gpu/sdpa_compare.py --lib $B/libflashattn.so --quick
  echo "== sdpa $fam"; cat $L/sdpa_$fam.log | tail -20
done
cat $L/steps.txt
tar czf $OUT/logs.tgz -C $OUT logs

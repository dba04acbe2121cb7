#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/.."
R=$PWD; H=.h200; B=$H/bin
export LD_LIBRARY_PATH=$PWD/$H/lib:$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
L=$OUT/logs; mkdir -p $L
step() { local name=$1 t=$2; shift 2; local s=$SECONDS; timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $((SECONDS-s))s" >> $L/steps.txt; }
cat > /tmp/py.sh <<PY
set -e
cd $R
meson setup /tmp/bpy -Dbuildtype=release -Dpython=enabled -Dcuda=disabled -Dhip=disabled -Dtests=false -Dbench=false -Dexamples=false -Dmpi=disabled -Dnccl=disabled
ninja -C /tmp/bpy
mkdir -p /tmp/pypkg/flashattn && cp python/flashattn/*.py python/flashattn/*.pyi python/flashattn/py.typed /tmp/pypkg/flashattn/ && cp /tmp/bpy/python/_native*.so /tmp/pypkg/flashattn/
cd /tmp && PYTHONPATH=/tmp/pypkg FLASHATTN_PLUGIN_DIR=$R/$B FLASHATTN_REQUIRE_TORCH=1 python3 -m pytest -p no:cacheprovider -rs -q $R/python/tests
PY
( step python 300 bash /tmp/py.sh ) &
export FLASHATTN_PLUGIN_DIR=$PWD/$B FLASHATTN_REQUIRE_GPU=1
( step test_tc 240 env FLASHATTN_GPU_SYNC=1 $B/test_gpu_backends cuda ) &
( step test_generic 240 env FLASHATTN_GPU_SYNC=1 FLASHATTN_GPU_KERNELS=generic $B/test_gpu_backends cuda ) &
( step test_fma 240 env FLASHATTN_GPU_SYNC=1 FLASHATTN_GPU_KERNELS=fma $B/test_gpu_backends cuda ) &
( step memcheck_tc 240 env FA_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 1 $B/test_gpu_backends cuda ) &
( step racecheck_tc 240 env FA_TEST_QUICK=1 compute-sanitizer --tool racecheck --error-exitcode 1 $B/test_gpu_backends cuda ) &
( step memcheck_fma 240 env FA_TEST_QUICK=1 FLASHATTN_GPU_KERNELS=fma compute-sanitizer --tool memcheck --error-exitcode 1 $B/test_gpu_backends cuda ) &
wait
cat $L/steps.txt
for f in test_tc test_generic test_fma; do echo "== $f"; grep -E "FAILED|PASSED|ERROR" $L/$f.log | head -8; done
grep -h "SUMMARY" $L/memcheck_*.log $L/racecheck_*.log
tail -15 $L/python.log
for v in base bin bin base; do
  step sdpa_$v 120 env FLASHATTN_PLUGIN_DIR=$PWD/$H/$v PYTHONUNBUFFERED=1 python3 bench/gpu/sdpa_compare.py --lib $PWD/$H/$v/libflashattn.so --quick
  cat $L/sdpa_$v.log >> $L/sdpa_all_$v.log
done
for v in base bin; do echo "== $v"; grep -E "^(float|bfloat)" $L/sdpa_all_$v.log; done
S="--section SpeedOfLight --section Occupancy --section WarpStateStats --section InstructionStats --section LaunchStats"
step ncu_new 120 ncu --clock-control none -k regex:'forward|backward_dkdv|backward_dq' --launch-skip 3 --launch-count 3 $S python3 $H/prof.py 128 4096
grep -E "^  [a-z_:]+.*\(|Duration|Registers Per|Theoretical Occupancy|Issue Slots Busy|Executed Instructions  |Warp Cycles Per Issued" $L/ncu_new.log
cat $L/steps.txt
tar czf $OUT/logs.tgz -C $OUT logs

#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/.."
H=.h200; B=$H/bin
export LD_LIBRARY_PATH=$PWD/$H/lib:$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
L=$OUT/logs; mkdir -p $L
export FLASHATTN_PLUGIN_DIR=$PWD/$B FLASHATTN_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
step() { local name=$1 t=$2; shift 2; local s=$SECONDS; timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $((SECONDS-s))s" >> $L/steps.txt; }
( step test_generic 240 env FLASHATTN_GPU_SYNC=1 FLASHATTN_GPU_KERNELS=generic $B/test_gpu_backends cuda ) &
( step test_tc 240 env FLASHATTN_GPU_SYNC=1 FLASHATTN_GPU_KERNELS=tc $B/test_gpu_backends cuda ) &
( step test_fma 240 env FLASHATTN_GPU_SYNC=1 FLASHATTN_GPU_KERNELS=fma $B/test_gpu_backends cuda ) &
( step test_default 240 env $B/test_gpu_backends cuda ) &
for tool in synccheck initcheck; do for fam in generic tc; do
( step ${tool}_$fam 300 env FA_TEST_QUICK=1 FLASHATTN_GPU_KERNELS=$fam compute-sanitizer --tool $tool --error-exitcode 1 $B/test_gpu_backends cuda ) &
done; done
wait
cat $L/steps.txt
for f in $L/test_*.log; do echo "== $f"; grep -E "FAILED|PASSED|repeat|kernels:" $f | head -12; done
grep -h "SUMMARY" $L/synccheck_*.log $L/initcheck_*.log
# profile (alone on the GPU)
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SourceCounters --section InstructionStats"
step ncu_d128 200 env FLASHATTN_GPU_KERNELS=tc ncu --clock-control none -k regex:'forward|backward_dkdv|backward_dq' --launch-skip 3 --launch-count 3 $S python3 $H/prof.py 128 4096
step ncu_d64 120 env FLASHATTN_GPU_KERNELS=tc ncu --clock-control none -k regex:'forward' --launch-skip 2 --launch-count 1 $S python3 $H/prof.py 64 4096
grep -E "^  [a-z_:]+.*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|Executed Ipc|L1/TEX Hit|Shared Memory Configuration Size|Bank" $L/ncu_d128.log | head -120
step sdpa_tc_full 300 env FLASHATTN_GPU_KERNELS=tc PYTHONUNBUFFERED=1 python3 bench/gpu/sdpa_compare.py --lib $B/libflashattn.so
tail -45 $L/sdpa_tc_full.log
cat $L/steps.txt
tar czf $OUT/logs.tgz -C $OUT logs

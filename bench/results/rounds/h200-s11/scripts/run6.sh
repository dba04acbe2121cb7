#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/.."
H=.h200; B=$H/bin
export LD_LIBRARY_PATH=$PWD/$H/lib:$PWD/$B
L=$OUT/logs; mkdir -p $L
step() { local name=$1 t=$2; shift 2; local s=$SECONDS; timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $((SECONDS-s))s" >> $L/steps.txt; }
step test_var 120 env FLASHATTN_REQUIRE_GPU=1 FLASHATTN_GPU_SYNC=1 FLASHATTN_PLUGIN_DIR=$PWD/$H/var $B/test_gpu_backends cuda
grep -E "PASSED|FAILED" $L/test_var.log | head -5
for v in bin var bin var; do
  step sdpa_$v 120 env FLASHATTN_PLUGIN_DIR=$PWD/$H/$v PYTHONUNBUFFERED=1 python3 bench/gpu/sdpa_compare.py --lib $PWD/$H/$v/libflashattn.so --quick
  cat $L/sdpa_$v.log >> $L/sdpa_all_$v.log
done
for v in bin var; do echo "== $v"; grep -E "^(float|bfloat)" $L/sdpa_all_$v.log | tail -16; done
S="--section SpeedOfLight --section Occupancy --section InstructionStats"
for v in bin var; do
step ncu_$v 60 env FLASHATTN_PLUGIN_DIR=$PWD/$H/$v ncu --clock-control none -k regex:'forward|backward_dq' --launch-skip 2 --launch-count 2 $S python3 $H/prof.py 128 4096
echo "== ncu $v"; grep -E "^  [a-z_:]+.*\(|Duration|Registers Per|Theoretical Occupancy" $L/ncu_$v.log
done
cat $L/steps.txt
tar czf $OUT/logs.tgz -C $OUT logs

#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/.."
R=$PWD; H=.h200; B=$H/bin
export LD_LIBRARY_PATH=$PWD/$H/lib:$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
L=$OUT/logs; mkdir -p $L
step() { local name=$1 t=$2; shift 2; local s=$SECONDS; timeout $t "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $((SECONDS-s))s" >> $L/steps.txt; }
pybuild() {
  meson setup /tmp/bpy -Dbuildtype=release -Dpython=enabled -Dcuda=disabled -Dhip=disabled -Dtests=false -Dbench=false -Dexamples=false -Dmpi=disabled -Dnccl=disabled && ninja -C /tmp/bpy || return 1
  mkdir -p /tmp/pypkg/flashattn && cp python/flashattn/*.py python/flashattn/*.pyi python/flashattn/py.typed /tmp/pypkg/flashattn/ && cp /tmp/bpy/python/_native*.so /tmp/pypkg/flashattn/
}
pytests() { cd /tmp && PYTHONPATH=/tmp/pypkg FLASHATTN_PLUGIN_DIR=$R/$B FLASHATTN_REQUIRE_TORCH=1 python3 -m pytest -p no:cacheprovider -rs -q $R/python/tests; }
( step pybuild 200 pybuild && step pytest 200 pytests ) &
( step test_default 240 env FLASHATTN_REQUIRE_GPU=1 FLASHATTN_PLUGIN_DIR=$PWD/$B FLASHATTN_GPU_SYNC=1 $B/test_gpu_backends cuda ) &
step ncu_fwd 200 env FLASHATTN_PLUGIN_DIR=$PWD/$B ncu --clock-control none -k regex:'forward' --launch-skip 1 --launch-count 1 --set full --import-source yes -o $L/fwd128 python3 $H/prof.py 128 4096
ncu --import $L/fwd128.ncu-rep --print-details all --section WarpStateStats --section SchedulerStats --section Occupancy > $L/ncu_fwd_details.log 2>&1
ncu --import $L/fwd128.ncu-rep --page source --csv --print-source sass > $L/ncu_fwd_sass.csv 2>&1
grep -iE "stall|Warp Cycles|Eligible|Active Warps" $L/ncu_fwd_details.log | head -60
head -c 600 $L/ncu_fwd_sass.csv; echo; wc -l $L/ncu_fwd_sass.csv
wait
cat $L/steps.txt
grep -E "kernels:|PASSED|FAILED" $L/test_default.log | head
tail -30 $L/pybuild.log | grep -iE "error|python|found" | head; tail -25 $L/pytest.log
gzip -f $L/ncu_fwd_sass.csv; rm -f $L/fwd128.ncu-rep.gz; gzip -k $L/fwd128.ncu-rep 2>/dev/null; rm -f $L/fwd128.ncu-rep
tar czf $OUT/logs.tgz -C $OUT logs

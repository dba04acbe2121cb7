#!/bin/bash
# Does a second busy core slow the first? One-thread kernels and forwards alone, then two copies at once
# (pinned to cpu 0 and 1), then fa-bench with 2 threads; rounds interleaved.
B=/work/main/build
CA="$B/tests/checkasm/test_checkasm --function=gemm_max --isa=avx512 --bench"
FB="$B/bench/fa-bench --n 4096 --d 64,128 --mask dense --pass fwd --reps 3 --stat median --torch off --std-max-n 1"
for round in 1 2 3; do
  echo "=== round $round: checkasm gemm_max alone"
  taskset -c 0 $CA 2>&1 | grep -E 'gemm_max|peak' | head -6
  echo "=== round $round: checkasm gemm_max, two at once"
  taskset -c 1 $CA > /tmp/contend/ca1.txt 2>&1 &
  taskset -c 0 $CA 2>&1 | grep -E 'gemm_max|peak' | head -6
  wait; echo "--- the other copy:"; grep -E 'gemm_max|peak' /tmp/contend/ca1.txt | head -6
  echo "=== round $round: fa-bench 1 thread alone"
  taskset -c 0 $FB --threads 1 2>&1 | grep -E 'peak|^ *[0-9]|fwd' | head -8
  echo "=== round $round: fa-bench 1 thread, two at once"
  taskset -c 1 $FB --threads 1 > /tmp/contend/fb1.txt 2>&1 &
  taskset -c 0 $FB --threads 1 2>&1 | grep -E 'peak|^ *[0-9]|fwd' | head -8
  wait; echo "--- the other copy:"; grep -E 'peak|^ *[0-9]|fwd' /tmp/contend/fb1.txt | head -8
  echo "=== round $round: fa-bench 2 threads"
  $FB --threads 2 2>&1 | grep -E 'peak|^ *[0-9]|fwd' | head -8
done

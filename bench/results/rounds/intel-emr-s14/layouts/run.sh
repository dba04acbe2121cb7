#!/bin/sh
# two rounds, layouts alternating, same command otherwise
for r in 3 4 5 6; do
  for L in bnhd bhnd; do
    FA_BENCH_PYTHON=/tmp/torchvenv/bin/python /work/main/build/bench/fa-bench --n 1024,2048,4096 --d 64,128 --mask both --pass fwd,fwdbwd --stat median --std-max-n 0 --layout $L --csv /tmp/grid14/$L-r$r.csv > /tmp/grid14/$L-r$r.txt 2>/dev/null
  done
done

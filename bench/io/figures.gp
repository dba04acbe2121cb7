# Plots bench/results/io/*.csv (written by fa-bench-io); called by make-figures.sh with dir set.
set datafile separator ','
set datafile commentschars '#'
set key autotitle columnhead
set terminal pngcairo size 1200,400 font ',10'
set grid ytics
set style fill solid 0.6 border -1
set boxwidth 0.6
set yrange [0:*]

# Figure 2 left: standard vs flash, GPT-2 medium setting.
set output dir.'/fig2_left.png'
set multiplot layout 1,3 title 'Figure 2 left: standard vs FlashAttention, N = 1024, d = 64 (forward + backward)'
set title 'GFLOPs (model, 1024 heads)'
plot dir.'/fig2_left.csv' using 0:2:xtic(1) with boxes notitle lc rgb '#4477aa'
set title 'slow-memory traffic, GB (model, fp16, M = 100 KB)'
plot dir.'/fig2_left.csv' using 0:3:xtic(1) with boxes notitle lc rgb '#cc6677'
set title 'runtime per head, ms (this CPU)'
plot dir.'/fig2_left.csv' using 0:4:xtic(1) with boxes notitle lc rgb '#228833'
unset multiplot

set autoscale y

# Figure 2 middle: traffic and forward runtime vs block size Bc.
set output dir.'/fig2_middle.png'
set terminal pngcairo size 800,450 font ',10'
set title 'Figure 2 middle: forward, N = 1024, d = 64, vs block size Bc'
set xlabel 'block size Bc'
set logscale x 2
set ylabel 'slow-memory traffic, GB (model, 1024 heads, fp16)'
set y2label 'runtime per head, ms (paper loop order, this CPU)'
set ytics nomirror
set y2tics
set yrange [0:*]
set y2range [0:*]
plot dir.'/fig2_middle.csv' using 1:3 with linespoints lw 2 title 'HBM traffic (model)' axes x1y1, \
     '' using 1:4 with linespoints lw 2 title 'runtime (measured)' axes x1y2
unset logscale x
set autoscale y
unset y2tics
unset y2label
set ytics mirror

# Figure 2 right: block-sparse runtime vs density.
set output dir.'/fig2_right.png'
set title 'Figure 2 right: block-sparse FlashAttention, forward + backward, vs fraction of nonzero blocks'
set xlabel 'fraction of nonzero blocks s'
set ylabel 'runtime, ms (CPU backend) / traffic, MB (model)'
set logscale xy 2
set key left top
plot dir.'/fig2_right.csv' using 1:3 with linespoints lw 2 title 'runtime, ms (measured)', \
     '' using 1:($2*1000) with linespoints lw 2 title 'slow-memory traffic, MB (model)'
unset logscale xy

# Figure 3: runtime and memory vs sequence length.
set output dir.'/fig3.png'
set terminal pngcairo size 1200,450 font ',10'
set multiplot layout 1,2 title 'Figure 3: forward + backward vs sequence length, d = 64, one head'
set logscale xy 2
set xlabel 'sequence length N'
set key left top
set title 'runtime, ms (this CPU)'
set ylabel 'ms'
plot dir.'/fig3.csv' using 1:2 with linespoints lw 2 title 'standard (OpenBLAS)', \
     '' using 1:3 with linespoints lw 2 title 'FlashAttention (CPU backend)', \
     '' using 1:4 with linespoints lw 2 title 'block-sparse, s = 0.25 (CPU backend)'
set title 'slow memory incl. inputs and outputs, MB (model)'
set ylabel 'MB'
plot dir.'/fig3.csv' using 1:5 with linespoints lw 2 title 'standard', \
     '' using 1:6 with linespoints lw 2 title 'FlashAttention', \
     '' using 1:7 with linespoints lw 2 dt 2 title 'block-sparse'
unset multiplot

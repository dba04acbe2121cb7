/* The machine's FMA peak for the selected kernels: the physical limit the benchmarks (fa-bench,
 * checkasm --bench) divide by. A benchmark tool, not part of the library: built as the static
 * library fa_probe (bench/cpu/probe/meson.build) that fa-bench and test_checkasm link. It drives
 * the kernels' fma_chains hook and gemm (src/cpu/kernels/kernels.h), which stay in the library
 * because each must be compiled with its ISA's flags, as the kernels it measures are. */
#ifndef FA_CPU_FMA_PEAK_H
#define FA_CPU_FMA_PEAK_H
#include "cpu/kernels/kernels.h"

/* GFLOP/s of kern->fma_chains (register-only independent FMA chains of the ISA's vector width) on
 * `threads` threads (OpenMP; 1 without it): best of 7 bursts of about 20 ms after a warm-up
 * (thread start, clock ramp), each thread timed in its own CPU time and the threads' rates
 * summed. On an idle machine that is the wall-clock rate; on a shared one it stays the limit of
 * the cores while wall-clock timings of the kernels drop (time those in CPU time to compare). */
double fa_cpu_fma_peak(const fa_cpu_kernels *kern, int threads);

/* GFLOP/s of kern->gemm on a 48 x 32 x 64 product whose operands stay in L1 (each thread its own),
 * timed as fa_cpu_fma_peak: the most any product of the kernels can reach on these cores now. On
 * an idle core about 0.9-1.0 of the FMA peak; below that while something else uses the core's
 * loads and caches (an SMT sibling: another VM's thread on a shared host), which the register-only
 * chains do not feel. Kernel fractions under that ratio measure the machine, not the kernels. */
double fa_cpu_l1_gemm_rate(const fa_cpu_kernels *kern, int threads);
#endif

#define _POSIX_C_SOURCE 200809L /* clock_gettime, CLOCK_THREAD_CPUTIME_ID */
/* The probes' driver: the FMA peak (each ISA's fma_chains kernel) and the gemm kernel's rate in L1. */
#include "fma_peak.h"

#include <time.h>

static double seconds_of(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* What a probe runs: `iterations` rounds of its loop on this thread; returns the FLOPs done. */
typedef double (*probe_work)(const fa_cpu_kernels *kern, int64_t iterations, float *sink);

static double chains_work(const fa_cpu_kernels *kern, int64_t iterations, float *sink)
{
    return kern->fma_chains(iterations, sink);
}

/* The gemm kernel on C = A B with A (L1_M x L1_K), B (L1_K x L1_N) and C in this thread's stack
 * (26 KiB: they stay in L1 once touched), one call per iteration. */
enum { L1_M = 48, L1_K = 64, L1_N = 32 };
static double l1_gemm_work(const fa_cpu_kernels *kern, int64_t iterations, float *sink)
{
    float a[L1_M * L1_K], b[L1_K * L1_N], c[L1_M * L1_N];
    for (int64_t i = 0; i < L1_M * L1_K; ++i) a[i] = (float)(i % 7) * 0.125f; /* exact, no overflow */
    for (int64_t i = 0; i < L1_K * L1_N; ++i) b[i] = (float)(i % 5) * 0.25f;
    for (int64_t it = 0; it < iterations; ++it) kern->gemm(L1_M, L1_N, L1_K, a, L1_K, 1, b, L1_N, c, L1_N, NULL, 0);
    *sink = c[0];
    return 2.0 * L1_M * L1_N * L1_K * (double)iterations;
}

/* One burst: every thread runs the work `iterations` times and times itself in its own CPU
 * time, so that other jobs holding the cores (a shared machine) do not lower the rate; on an
 * idle machine this equals the wall-clock rate. Returns the sum of the threads' FLOP/s. */
static double burst_rate(const fa_cpu_kernels *kern, probe_work work, int threads, int64_t iterations)
{
    double rate = 0.0;
    volatile float sink = 0.0f;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : rate)
#endif
    {
        float s;
        const double t0 = seconds_of(CLOCK_THREAD_CPUTIME_ID);
        const double flops = work(kern, iterations, &s);
        const double dt = seconds_of(CLOCK_THREAD_CPUTIME_ID) - t0;
        rate += dt > 0.0 ? flops / dt : 0.0;
        sink = s;
    }
    (void)threads;
    (void)sink;
    return rate;
}

static double best_rate(const fa_cpu_kernels *kern, probe_work work, int64_t first_iterations, int threads)
{
#ifndef _OPENMP
    threads = 1;
#endif
    enum { BURSTS = 7 };
    const double burst_target = 0.02;
    burst_rate(kern, work, threads, 1); /* starts the threads */
    /* Size the bursts on this thread: grow to >= 5 ms of CPU time, then scale to about 20 ms. */
    int64_t iterations = first_iterations;
    double dt = 0.0;
    float sink;
    for (; iterations < ((int64_t)1 << 40); iterations *= 4) {
        const double t0 = seconds_of(CLOCK_THREAD_CPUTIME_ID);
        work(kern, iterations, &sink);
        if ((dt = seconds_of(CLOCK_THREAD_CPUTIME_ID) - t0) >= burst_target / 4) break;
    }
    if (dt > 0.0) iterations = (int64_t)((double)iterations * burst_target / dt) + 1;
    double best = 0.0;
    for (int i = 0; i < BURSTS; ++i) {
        const double rate = burst_rate(kern, work, threads, iterations);
        if (rate > best) best = rate;
    }
    return best * 1e-9;
}

double fa_cpu_fma_peak(const fa_cpu_kernels *kern, int threads) { return best_rate(kern, chains_work, 1 << 12, threads); }

double fa_cpu_l1_gemm_rate(const fa_cpu_kernels *kern, int threads) { return best_rate(kern, l1_gemm_work, 16, threads); }

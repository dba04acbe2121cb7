#define _POSIX_C_SOURCE 200809L /* clock_gettime, CLOCK_THREAD_CPUTIME_ID */
/* The FMA-peak probe's driver: the chains themselves are each ISA's fma_chains kernel. */
#include "fma_peak.h"

#include <time.h>

static double seconds_of(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One burst: every thread runs the chains `iterations` times and times itself in its own CPU
 * time, so that other jobs holding the cores (a shared machine) do not lower the limit; on an
 * idle machine this equals the wall-clock rate. Returns the sum of the threads' FLOP/s. */
static double burst_rate(const fa_cpu_kernels *kern, int threads, int64_t iterations)
{
    double rate = 0.0;
    volatile float sink = 0.0f;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : rate)
#endif
    {
        float s;
        const double t0 = seconds_of(CLOCK_THREAD_CPUTIME_ID);
        const double flops = kern->fma_chains(iterations, &s);
        const double dt = seconds_of(CLOCK_THREAD_CPUTIME_ID) - t0;
        rate += dt > 0.0 ? flops / dt : 0.0;
        sink = s;
    }
    (void)threads;
    (void)sink;
    return rate;
}

double fa_cpu_fma_peak(const fa_cpu_kernels *kern, int threads)
{
#ifndef _OPENMP
    threads = 1;
#endif
    enum { BURSTS = 7 };
    const double burst_target = 0.02;
    burst_rate(kern, threads, 1); /* starts the threads */
    /* Size the bursts on this thread: grow to >= 5 ms of CPU time, then scale to about 20 ms. */
    int64_t iterations = 1 << 12;
    double dt = 0.0;
    float sink;
    for (; iterations < ((int64_t)1 << 40); iterations *= 4) {
        const double t0 = seconds_of(CLOCK_THREAD_CPUTIME_ID);
        kern->fma_chains(iterations, &sink);
        if ((dt = seconds_of(CLOCK_THREAD_CPUTIME_ID) - t0) >= burst_target / 4) break;
    }
    if (dt > 0.0) iterations = (int64_t)((double)iterations * burst_target / dt) + 1;
    double best = 0.0;
    for (int i = 0; i < BURSTS; ++i) {
        const double rate = burst_rate(kern, threads, iterations);
        if (rate > best) best = rate;
    }
    return best * 1e-9;
}

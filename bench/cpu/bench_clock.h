/* Wall clock (or process CPU time) and peak resident memory of this process, for the benchmarks. */
#ifndef FA_BENCH_CLOCK_H
#define FA_BENCH_CLOCK_H
#include <stdio.h>
#include <string.h>
#include <time.h>

/* 1: bench_seconds reads the process CPU time divided by bench_cpu_threads instead of the wall
 * clock. On a loaded machine a single-threaded run then excludes the time it waits for a core. */
static int bench_use_cpu_clock, bench_cpu_threads = 1;

static inline double bench_seconds(void)
{
    struct timespec ts;
    if (bench_use_cpu_clock) {
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return ((double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec) / bench_cpu_threads;
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A line "key: value kB" of /proc/self/status in bytes, or -1 where unavailable. */
static inline long long bench_status_bytes(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    const size_t len = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, len) == 0 && line[len] == ':') {
            if (sscanf(line + len + 1, "%lld", &kb) != 1) kb = -1;
            break;
        }
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

/* Resets the peak (VmHWM) to the current resident size (Linux >= 4.0); returns that size. */
static inline long long bench_peak_reset(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
    return bench_status_bytes("VmRSS");
}

static inline long long bench_peak(void) { return bench_status_bytes("VmHWM"); }
#endif

/* The C side of bench/python/overhead.py: one fa_forward and one fa_backward call per repetition
 * on packed f32 host tensors through the shared library, as the Python package calls it. The
 * buffers are allocated and touched once, before the timed calls: the library's own time. With
 * "fresh", out and lse (forward) and dq, dk, dv (backward) are malloc'd before and freed after
 * each call inside the timed region, as the torch op allocates its outputs per call.
 * Usage: fa-bench-call batch heads seqlen head_dim reps [fresh]
 * Prints one line of name=value pairs, per call, over the reps (after 3 warm-up calls):
 *   fwd_us, both_us          median wall time of the forward, of forward + backward
 *   fwd_min_us, both_min_us  the fastest call
 *   fwd_cpu_us, both_cpu_us  median CPU time of the process (all its threads)
 *   faults                   minor page faults per forward + backward */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <flashattn.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, compare);
    return v[n / 2];
}

static double minimum(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; ++i) m = v[i] < m ? v[i] : m;
    return m;
}

static double clock_us(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

static long minor_faults(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt;
}

enum { FWD_WALL, BOTH_WALL, FWD_CPU, BOTH_CPU, N_SERIES };

int main(int argc, char **argv)
{
    const int fresh = argc == 7 && strcmp(argv[6], "fresh") == 0;
    if (argc != 6 && !fresh) {
        fprintf(stderr, "usage: %s batch heads seqlen head_dim reps [fresh]\n", argv[0]);
        return 2;
    }
    int64_t b = atoll(argv[1]), h = atoll(argv[2]), n = atoll(argv[3]), d = atoll(argv[4]);
    int reps = atoi(argv[5]);
    if (b < 1 || h < 1 || n < 1 || d < 1 || reps < 1) return 2;
    size_t elems = (size_t)(b * n * h * d);
    float *buf = malloc(8 * elems * sizeof *buf), *lse = malloc((size_t)(b * h * n) * sizeof *lse);
    double *series = malloc(N_SERIES * (size_t)reps * sizeof *series);
    if (!buf || !lse || !series) return 1;
    for (size_t i = 0; i < 8 * elems; ++i) buf[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    fa_tensor t[8];
    for (int i = 0; i < 8; ++i) t[i] = (fa_tensor){buf + i * elems, FA_DTYPE_F32, b, n, h, d, 0, 0, 0};
    fa_context *ctx;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    if (fa_context_create(FA_BACKEND_CPU, 0, &ctx) != FA_SUCCESS) {
        fprintf(stderr, "%s\n", fa_last_error());
        return 1;
    }
    long faults = 0;
    for (int r = -3; r < reps; ++r) { /* 3 warm-up calls */
        long f0 = minor_faults();
        double w0 = clock_us(CLOCK_MONOTONIC), c0 = clock_us(CLOCK_PROCESS_CPUTIME_ID);
        fa_tensor out = t[3], grads[3] = {t[5], t[6], t[7]};
        float *call_lse = lse;
        if (fresh && !(out.data = malloc(elems * sizeof(float)))) return 1;
        if (fresh && !(call_lse = malloc((size_t)(b * h * n) * sizeof *lse))) return 1;
        fa_status s1 = fa_forward(ctx, &desc, &t[0], &t[1], &t[2], &out, call_lse);
        double w1 = clock_us(CLOCK_MONOTONIC), c1 = clock_us(CLOCK_PROCESS_CPUTIME_ID);
        for (int i = 0; fresh && i < 3; ++i)
            if (!(grads[i].data = malloc(elems * sizeof(float)))) return 1;
        fa_status s2 = fa_backward(ctx, &desc, &t[0], &t[1], &t[2], &out, &t[4], call_lse, &grads[0], &grads[1],
                                   &grads[2]);
        for (int i = 0; fresh && i < 3; ++i) free(grads[i].data);
        if (fresh) {
            free(out.data);
            free(call_lse);
        }
        double w2 = clock_us(CLOCK_MONOTONIC), c2 = clock_us(CLOCK_PROCESS_CPUTIME_ID);
        if (s1 != FA_SUCCESS || s2 != FA_SUCCESS) {
            fprintf(stderr, "%s\n", fa_last_error());
            return 1;
        }
        if (r >= 0) {
            series[FWD_WALL * reps + r] = w1 - w0;
            series[BOTH_WALL * reps + r] = w2 - w0;
            series[FWD_CPU * reps + r] = c1 - c0;
            series[BOTH_CPU * reps + r] = c2 - c0;
            faults += minor_faults() - f0;
        }
    }
    double *s = series;
    printf("fwd_min_us=%.2f both_min_us=%.2f ", minimum(s + FWD_WALL * reps, reps),
           minimum(s + BOTH_WALL * reps, reps));
    printf("fwd_us=%.2f both_us=%.2f fwd_cpu_us=%.2f both_cpu_us=%.2f faults=%.1f\n", median(s + FWD_WALL * reps, reps),
           median(s + BOTH_WALL * reps, reps), median(s + FWD_CPU * reps, reps), median(s + BOTH_CPU * reps, reps),
           (double)faults / reps);
    fa_context_destroy(ctx);
    free(series);
    free(lse);
    free(buf);
    return 0;
}

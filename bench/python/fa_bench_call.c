/* The C side of bench/python/overhead.py: median wall time of one fa_forward (and fa_backward)
 * call on packed f32 host tensors through the shared library, as the Python package calls it.
 * Usage: fa-bench-call batch heads seqlen head_dim reps
 *   -> "forward_median_us backward_median_us forward_min_us backward_min_us" */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <flashattn.h>

#include <stdio.h>
#include <stdlib.h>

#include "bench_clock.h"

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double sorted_at(double *v, int n, int i)
{
    qsort(v, (size_t)n, sizeof *v, compare);
    return v[i];
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s batch heads seqlen head_dim reps\n", argv[0]);
        return 2;
    }
    int64_t b = atoll(argv[1]), h = atoll(argv[2]), n = atoll(argv[3]), d = atoll(argv[4]);
    int reps = atoi(argv[5]);
    if (b < 1 || h < 1 || n < 1 || d < 1 || reps < 1) return 2;
    size_t elems = (size_t)(b * n * h * d);
    float *buf = malloc(8 * elems * sizeof *buf), *lse = malloc((size_t)(b * h * n) * sizeof *lse);
    double *times = malloc(2 * (size_t)reps * sizeof *times);
    if (!buf || !lse || !times) return 1;
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
    for (int r = -3; r < reps; ++r) { /* 3 warm-up calls */
        double t0 = bench_seconds();
        fa_status s1 = fa_forward(ctx, &desc, &t[0], &t[1], &t[2], &t[3], lse);
        double t1 = bench_seconds();
        fa_status s2 = fa_backward(ctx, &desc, &t[0], &t[1], &t[2], &t[3], &t[4], lse, &t[5], &t[6], &t[7]);
        double t2 = bench_seconds();
        if (s1 != FA_SUCCESS || s2 != FA_SUCCESS) {
            fprintf(stderr, "%s\n", fa_last_error());
            return 1;
        }
        if (r >= 0) {
            times[r] = 1e6 * (t1 - t0);
            times[reps + r] = 1e6 * (t2 - t1);
        }
    }
    double forward_median = sorted_at(times, reps, reps / 2), backward_median = sorted_at(times + reps, reps, reps / 2);
    printf("%.2f %.2f %.2f %.2f\n", forward_median, backward_median, times[0], times[reps]);
    fa_context_destroy(ctx);
    free(times);
    free(lse);
    free(buf);
    return 0;
}

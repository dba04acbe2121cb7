/* What the ring tests share (test_ring.c over MPI, test_ring_nccl.c over the NCCL double): the
 * problem's sizes, the failure counter, the zigzag split of a global array into a rank's local
 * rows, and the error measure against the single-process run. One header of static functions:
 * each test is one translation unit. */
#ifndef FA_RING_TEST_COMMON_H
#define FA_RING_TEST_COMMON_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "flashattn.h"
#include "test_arrays.h"

enum { BATCH = 2, HQ = 4, HK = 2, D = 32, CHUNK = 16 };

static int rank, ranks, failures;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__);       \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, "\n");                                               \
            ++failures;                                                          \
        }                                                                        \
    } while (0)

static float *random_floats(uint64_t seed, size_t n)
{
    double *x = test_random_doubles(seed, n);
    float *f = malloc(n * sizeof *f);
    if (!x || !f) abort();
    for (size_t i = 0; i < n; ++i) f[i] = (float)x[i];
    free(x);
    return f;
}

/* n elements of dtype as f32 (exact). */
static float *widened(const void *a, size_t n, fa_dtype dtype)
{
    float *x = malloc(n * sizeof *x);
    if (!x) abort();
    for (size_t i = 0; i < n; ++i) {
        const uint16_t h = dtype == FA_DTYPE_F32 ? 0 : ((const uint16_t *)a)[i];
        x[i] = dtype == FA_DTYPE_F32 ? ((const float *)a)[i] : dtype == FA_DTYPE_F16 ? fa_f16_to_f32(h) : fa_bf16_to_f32(h);
    }
    return x;
}

/* The rank's zigzag rows of a [BATCH, N, heads, D] array of es-byte elements: global chunks rank
 * and 2P - 1 - rank. */
static void to_local(const void *global, int64_t heads, size_t es, void *local)
{
    const int64_t n = 2 * CHUNK * ranks, row = heads * D * (int64_t)es;
    for (int64_t b = 0; b < BATCH; ++b)
        for (int c = 0; c < 2; ++c) {
            const int64_t gc = c == 0 ? rank : 2 * ranks - 1 - rank;
            memcpy((char *)local + (b * 2 * CHUNK + c * CHUNK) * row, (const char *)global + (b * n + gc * CHUNK) * row,
                   (size_t)(CHUNK * row));
        }
}

static void lse_to_local(const float *global, float *local)
{
    const int64_t n = 2 * CHUNK * ranks;
    for (int64_t bh = 0; bh < BATCH * HQ; ++bh)
        for (int c = 0; c < 2; ++c) {
            const int64_t gc = c == 0 ? rank : 2 * ranks - 1 - rank;
            memcpy(local + bh * 2 * CHUNK + c * CHUNK, global + bh * n + gc * CHUNK, CHUNK * sizeof *local);
        }
}

/* max |a - b| / max(1, |b|) over n elements of dtype (equal infinities count as 0). */
static double max_error(const void *a, const void *b, size_t n, fa_dtype dtype)
{
    float *x = widened(a, n, dtype), *y = widened(b, n, dtype);
    double worst = 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (isinf(x[i]) && x[i] == y[i]) continue;
        const double e = fabs((double)x[i] - (double)y[i]) / fmax(1.0, fabs((double)y[i]));
        if (!(e <= worst)) worst = e;
    }
    free(x);
    free(y);
    return worst;
}

static fa_tensor tensor(void *data, fa_dtype dtype, int64_t seqlen, int64_t heads)
{
    return (fa_tensor){data, dtype, BATCH, seqlen, heads, D, 0, 0, 0};
}

#endif /* FA_RING_TEST_COMMON_H */

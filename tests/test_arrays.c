#include "test_arrays.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double *test_random_doubles(uint64_t seed, size_t n)
{
    double *x = malloc((n ? n : 1) * sizeof *x);
    if (!x) abort();
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; ++i) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        const uint64_t r = s * 0x2545F4914F6CDD1Dull;
        x[i] = (double)(int32_t)(r >> 40 & 0xFFFFFF) / (double)(1 << 23) - 1.0; /* 24 bits: exact in f32 */
    }
    return x;
}

float *test_nan_floats(size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    if (!x) abort();
    memset(x, 0xff, (n ? n : 1) * sizeof *x);
    return x;
}

double test_relative_error(const double *ref, const float *got, size_t n)
{
    double worst = 0.0, largest = 1.0;
    for (size_t i = 0; i < n; ++i) {
        if (isinf(ref[i])) {
            if ((double)got[i] != ref[i]) return INFINITY;
            continue;
        }
        if (!isfinite(got[i])) return INFINITY;
        const double e = fabs((double)got[i] - ref[i]);
        if (e > worst) worst = e;
        if (fabs(ref[i]) > largest) largest = fabs(ref[i]);
    }
    return worst / largest;
}

int32_t *test_page_table(int64_t batch, int64_t max_pages, int64_t pages)
{
    int32_t *table = malloc((size_t)(batch * max_pages) * sizeof *table);
    if (!table) return NULL;
    for (int64_t x = 0; x < max_pages; ++x)
        for (int64_t b = 0; b < batch; ++b) table[b * max_pages + x] = (int32_t)(pages - 1 - (x * batch + b));
    return table;
}

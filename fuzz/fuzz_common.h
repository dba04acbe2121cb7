/* What the libFuzzer targets share: reading the input byte by byte (a missing byte reads as 0, so
 * every input decodes to a problem), a seeded generator, the untouched-canary check, the oracle
 * tolerance of a forward result, and the CPU context. FUZZ_TARGET names the target in messages. */
#ifndef FA_FUZZ_COMMON_H
#define FA_FUZZ_COMMON_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "flashattn.h"

/* For the helpers that only compute expected results and compare: without the fuzzer's coverage
 * callbacks (they guide nothing, and in the fp64 comparison loops they cost most of the time). */
#define FUZZ_CHECKER __attribute__((no_sanitize("coverage")))

typedef struct reader {
    const uint8_t *data;
    size_t size, pos;
} reader;

/* Next byte of the input, 0 once it is exhausted: every input decodes to some problem. */
static inline uint8_t next(reader *r) { return r->pos < r->size ? r->data[r->pos++] : 0; }
static inline uint64_t next_u64(reader *r)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | next(r);
    return v;
}

static inline uint64_t splitmix(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* 1 when every byte still holds the 0xff canary. */
FUZZ_CHECKER static inline int all_ff(const void *data, size_t bytes)
{
    const uint8_t *b = data;
    for (size_t i = 0; i < bytes; ++i)
        if (b[i] != 0xff) return 0;
    return 1;
}

/* The rounding of storing a result in dtype. */
static inline double storage_error(fa_dtype dtype)
{
    return dtype == FA_DTYPE_F32 ? 0x1p-22 : dtype == FA_DTYPE_F16 ? 0x1p-10 : 0x1p-7;
}

/* Tolerance on a forward result of magnitude `magnitude` from scores up to score_max: the storage
 * rounding of the dtype plus f32 rounding of the scores, which exp() turns into a relative error of
 * about eps * |score| in the weights. */
static inline double tolerance(fa_dtype dtype, double magnitude, double score_max)
{
    return (storage_error(dtype) + 64.0 * 0x1p-24 * (1.0 + score_max)) * (1.0 + magnitude);
}

/* The CPU context every input runs on (one thread; created once). */
static inline fa_context *context(void)
{
    static fa_context *ctx;
    if (!ctx) {
        if (fa_context_create(FA_BACKEND_CPU, 0, &ctx) != FA_SUCCESS || fa_context_set_num_threads(ctx, 1) != FA_SUCCESS) {
            fprintf(stderr, "%s: no CPU context: %s\n", FUZZ_TARGET, fa_last_error());
            abort();
        }
    }
    return ctx;
}
#endif

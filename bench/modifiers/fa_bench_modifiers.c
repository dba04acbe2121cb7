/* Cost of the score modifiers on the CPU forward (and of dbias on the backward): each variant
 * against the plain forward in the same run, interleaved round by round so that the machine's
 * drift hits all of them alike; medians of the rounds. Target (issue 15): softcap, ALiBi and
 * sinks forward <= 1.10x the plain forward.
 *   fa-bench-modifiers [--n 2048] [--d 64] [--heads 8] [--rounds 5] [--threads 2] */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { PLAIN, SOFTCAP, ALIBI, SINKS, ALL3, BIAS, VARIANTS };
static const char *const names[VARIANTS] = {"plain", "softcap", "alibi", "sinks", "softcap+alibi+sinks", "bias [H,N,N] f32"};

int main(int argc, char **argv)
{
    int64_t n = 2048, d = 64, heads = 8;
    int rounds = 5, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n")) n = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--d")) d = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) heads = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    fa_context *ctx;
    if (fa_context_create(FA_BACKEND_CPU, 0, &ctx) || fa_context_set_num_threads(ctx, threads)) {
        fprintf(stderr, "%s\n", fa_last_error());
        return 1;
    }
    const size_t elems = (size_t)(n * heads * d), bias_elems = (size_t)(heads * n * n);
    float *q = malloc(elems * 4), *k = malloc(elems * 4), *v = malloc(elems * 4), *o = malloc(elems * 4);
    float *lse = malloc((size_t)(heads * n) * 4), *bias = malloc(bias_elems * 4);
    float *slopes = malloc((size_t)heads * 4), *sinks = malloc((size_t)heads * 4);
    if (!q || !k || !v || !o || !lse || !bias || !slopes || !sinks) return 1;
    for (size_t i = 0; i < elems; ++i) {
        q[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
        k[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
        v[i] = (float)((i * 29) % 89) / 44.0f - 1.0f;
    }
    for (size_t i = 0; i < bias_elems; ++i) bias[i] = (float)(i % 7) * 0.1f;
    for (int64_t h = 0; h < heads; ++h) {
        slopes[h] = 1.0f / (float)(2 << h % 8);
        sinks[h] = 0.5f;
    }
    fa_tensor tq = {q, FA_DTYPE_F32, 1, n, heads, d, 0, 0, 0}, tk = tq, tv = tq, to = tq;
    tk.data = k;
    tv.data = v;
    to.data = o;
    fa_bias fb = {bias, FA_DTYPE_F32, 0, n * n, n};
    double *times = calloc((size_t)(VARIANTS * rounds), sizeof *times);
    for (int r = 0; r < rounds + 1; ++r) /* round 0 warms up */
        for (int x = 0; x < VARIANTS; ++x) {
            fa_attention_desc desc;
            fa_attention_desc_init(&desc);
            desc.causal = 0;
            if (x == SOFTCAP || x == ALL3) desc.softcap = 30.0f;
            if (x == ALIBI || x == ALL3) desc.alibi_slopes = slopes;
            if (x == SINKS || x == ALL3) desc.sinks = sinks;
            if (x == BIAS) desc.bias = &fb;
            const double t0 = now();
            if (fa_forward(ctx, &desc, &tq, &tk, &tv, &to, lse)) {
                fprintf(stderr, "%s\n", fa_last_error());
                return 1;
            }
            if (r) times[x * rounds + r - 1] = now() - t0;
        }
    printf("# CPU forward, N = %lld, d = %lld, heads = %lld, batch 1, f32, %d threads, median of %d rounds\n",
           (long long)n, (long long)d, (long long)heads, threads, rounds);
    printf("# %s\n", fa_context_info(ctx));
    printf("%-22s %10s %10s\n", "variant", "ms", "x plain");
    double plain = 0.0;
    for (int x = 0; x < VARIANTS; ++x) {
        qsort(times + x * rounds, (size_t)rounds, sizeof *times, cmp);
        const double median = times[x * rounds + rounds / 2];
        if (x == PLAIN) plain = median;
        printf("%-22s %10.2f %10.3f\n", names[x], 1e3 * median, median / plain);
    }
    fa_context_destroy(ctx);
    return 0;
}

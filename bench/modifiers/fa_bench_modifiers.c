/* Cost of the score modifiers on the CPU forward (dbias on the backward is not timed here): each variant
 * against the plain forward in the same run, interleaved round by round so that the machine's
 * drift hits all of them alike; medians of the rounds. Target (issue 15): softcap, ALiBi and
 * sinks forward <= 1.10x the plain forward; the bias forward reads the bias at full memory speed:
 * its extra time against (bias bytes) / (the read bandwidth of a sum over the same f32 bias
 * array on the same threads, timed in the same rounds), for f32, f16 and bf16 biases.
 *   fa-bench-modifiers [--n 2048] [--d 64] [--heads 8] [--rounds 5] [--threads 2] [--clock wall|cpu]
 *                      [--only VARIANT] [--backward] [--csv FILE]
 * --clock cpu: process CPU time / threads instead of wall time (a loaded machine: use --threads 1).
 * --only runs one variant (its name as printed, e.g. softcap) and prints nothing: for counting its
 * cycles under `perf stat -e cycles:u` (two round counts' difference: that many forwards), which a
 * loaded machine disturbs less than the wall clock. --backward times each forward with the
 * backward after it (fa_backward_ex, with dbias in the bias's dtype for the bias variants): the
 * cost of the modifiers on training, fwd+bwd against plain fwd+bwd. --csv FILE also writes the
 * table as variant (quoted),n,d,heads,threads,pass,ms,x_plain,x_array_sum (the bias rows' read
 * rate over the array sum's, inf for no extra time; 0 in the other rows) for
 * bench/cpu/check_targets.py. */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cpu/bench_clock.h"
#include "common/half.h"
#include "flashattn.h"

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { PLAIN, SOFTCAP, ALIBI, SINKS, ALL3, BIAS, BIAS_F16, BIAS_BF16, ARRAY_SUM, VARIANTS };
static const char *const names[VARIANTS] = {"plain", "softcap", "alibi", "sinks", "softcap+alibi+sinks",
                                            "bias [H,N,N] f32", "bias [H,N,N] f16", "bias [H,N,N] bf16",
                                            "array sum (f32 bias)"};

/* The read bandwidth probe (as bench/decode's): a sum over x in blocks of 64 floats. */
static double array_sum(const float *x, size_t n, int threads)
{
    double total = 0.0;
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
    for (size_t block = 0; block < n / 64; ++block) {
        float acc[16] = {0};
        for (int i = 0; i < 64; i += 16)
            for (int j = 0; j < 16; ++j) acc[j] += x[block * 64 + i + j];
        float s = 0.0f;
        for (int j = 0; j < 16; ++j) s += acc[j];
        total += s;
    }
    return total;
}

int main(int argc, char **argv)
{
    int64_t n = 2048, d = 64, heads = 8;
    int rounds = 5, threads = 2, only = -1, backward = 0;
    const char *csv_path = NULL;
    for (int i = 1; i < argc; ++i)
        if (!strcmp(argv[i], "--backward")) { /* a flag: taken out of the option pairs */
            backward = 1;
            for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
            --argc;
            break;
        }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n")) n = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--d")) d = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) heads = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--csv")) csv_path = argv[i + 1];
        else if (!strcmp(argv[i], "--clock") && (!strcmp(argv[i + 1], "wall") || !strcmp(argv[i + 1], "cpu")))
            bench_use_cpu_clock = !strcmp(argv[i + 1], "cpu");
        else if (!strcmp(argv[i], "--only")) {
            for (int x = 0; x < VARIANTS; ++x)
                if (!strcmp(argv[i + 1], names[x])) only = x;
            if (only < 0) {
                fprintf(stderr, "--only: unknown variant %s\n", argv[i + 1]);
                return 1;
            }
        }
    }
    bench_cpu_threads = threads;
    /* Every exit after this point goes through `done`, which frees everything (LeakSanitizer runs
     * the benchmarks' smoke test in the sanitizer build). */
    int status = 1;
    fa_context *ctx = NULL;
    const size_t elems = (size_t)(n * heads * d), bias_elems = (size_t)(heads * n * n);
    float *q = malloc(elems * 4), *k = malloc(elems * 4), *v = malloc(elems * 4), *o = malloc(elems * 4);
    float *lse = malloc((size_t)(heads * n) * 4), *bias = malloc(bias_elems * 4);
    float *slopes = malloc((size_t)heads * 4), *sinks = malloc((size_t)heads * 4);
    uint16_t *bias_f16 = malloc(bias_elems * 2), *bias_bf16 = malloc(bias_elems * 2);
    float *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    void *dbias32 = NULL, *dbias16 = NULL;
    double *times = calloc((size_t)(VARIANTS * rounds), sizeof *times);
    if (fa_context_create(FA_BACKEND_CPU, 0, &ctx) || fa_context_set_num_threads(ctx, threads)) {
        fprintf(stderr, "%s\n", fa_last_error());
        goto done;
    }
    if (!q || !k || !v || !o || !lse || !bias || !slopes || !sinks || !bias_f16 || !bias_bf16 || !times) goto done;
    for (size_t i = 0; i < elems; ++i) {
        q[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
        k[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
        v[i] = (float)((i * 29) % 89) / 44.0f - 1.0f;
    }
    for (size_t i = 0; i < bias_elems; ++i) {
        bias[i] = (float)(i % 7) * 0.1f;
        bias_f16[i] = fa_f32_to_f16(bias[i]);
        bias_bf16[i] = fa_f32_to_bf16(bias[i]);
    }
    for (int64_t h = 0; h < heads; ++h) {
        slopes[h] = 1.0f / (float)(2 << h % 8);
        sinks[h] = 0.5f;
    }
    fa_tensor tq = {q, FA_DTYPE_F32, 1, n, heads, d, 0, 0, 0}, tk = tq, tv = tq, to = tq;
    tk.data = k;
    tv.data = v;
    to.data = o;
    fa_bias fb = {bias, FA_DTYPE_F32, 0, n * n, n}, fb16 = {bias_f16, FA_DTYPE_F16, 0, n * n, n};
    fa_bias fbf16 = {bias_bf16, FA_DTYPE_BF16, 0, n * n, n};
    if (backward) {
        dout = malloc(elems * 4), dq = malloc(elems * 4), dk = malloc(elems * 4), dv = malloc(elems * 4);
        dbias32 = malloc(bias_elems * 4), dbias16 = malloc(bias_elems * 2);
        if (!dout || !dq || !dk || !dv || !dbias32 || !dbias16) goto done;
        for (size_t i = 0; i < elems; ++i) dout[i] = (float)((i * 41) % 83) / 41.0f - 1.0f;
    }
    fa_tensor tdo = tq, tdq = tq, tdk = tq, tdv = tq;
    tdo.data = dout, tdq.data = dq, tdk.data = dk, tdv.data = dv;
    volatile double sink = 0.0;
    for (int r = 0; r < rounds + 1; ++r) /* round 0 warms up */
        for (int x = 0; x < VARIANTS; ++x) {
            if (only >= 0 && x != only) continue;
            fa_attention_desc desc;
            fa_attention_desc_init(&desc);
            desc.causal = 0;
            if (x == SOFTCAP || x == ALL3) desc.softcap = 30.0f;
            if (x == ALIBI || x == ALL3) desc.alibi_slopes = slopes;
            if (x == SINKS || x == ALL3) desc.sinks = sinks;
            if (x == BIAS) desc.bias = &fb;
            if (x == BIAS_F16) desc.bias = &fb16;
            if (x == BIAS_BF16) desc.bias = &fbf16;
            const double t0 = bench_seconds();
            if (x == ARRAY_SUM) sink += array_sum(bias, bias_elems, threads);
            else if (fa_forward(ctx, &desc, &tq, &tk, &tv, &to, lse)) {
                fprintf(stderr, "%s\n", fa_last_error());
                goto done;
            } else if (backward) {
                fa_bias db = {0};
                if (desc.bias) {
                    db = *desc.bias;
                    db.data = desc.bias->dtype == FA_DTYPE_F32 ? dbias32 : dbias16;
                }
                if (fa_backward_ex(ctx, &desc, &tq, &tk, &tv, &to, &tdo, lse, &tdq, &tdk, &tdv, NULL,
                                   desc.bias ? &db : NULL)) {
                    fprintf(stderr, "%s\n", fa_last_error());
                    goto done;
                }
            }
            if (r) times[x * rounds + r - 1] = bench_seconds() - t0;
        }
    if (only >= 0) {
        status = 0;
        goto done;
    }
    printf("# CPU %s, N = %lld, d = %lld, heads = %lld, batch 1, f32, %d threads, median of %d rounds, %s\n",
           backward ? "forward + backward (dbias for the bias)" : "forward", (long long)n, (long long)d,
           (long long)heads, threads, rounds,
           bench_use_cpu_clock ? "process CPU time / threads" : "wall clock");
    printf("# %s\n", fa_context_info(ctx));
    printf("%-22s %10s %10s\n", "variant", "ms", "x plain");
    double median[VARIANTS], x_array_sum[VARIANTS] = {0};
    for (int x = 0; x < VARIANTS; ++x) {
        qsort(times + x * rounds, (size_t)rounds, sizeof *times, cmp);
        median[x] = times[x * rounds + rounds / 2];
        printf("%-22s %10.2f %10.3f\n", names[x], 1e3 * median[x], median[x] / median[PLAIN]);
    }
    if (!backward) {
        /* The bias's extra time against reading its bytes at the array sum's rate: >= 1 is at (or,
         * overlapped with the arithmetic, beyond) full memory speed; no extra time at all (within
         * the noise) reads inf. The read rates are the forward's: the backward's table has none. */
        const double bandwidth = (double)(bias_elems * 4) / median[ARRAY_SUM];
        printf("# array sum: %.2f GB/s on %d threads (%.0f MB)\n", bandwidth / 1e9, threads,
               (double)(bias_elems * 4) / 1e6);
        printf("%-22s %10s %10s %10s %14s\n", "bias", "MB read", "extra ms", "MB/s", "x array sum");
        for (int x = BIAS; x <= BIAS_BF16; ++x) {
            const double bytes = (double)bias_elems * (x == BIAS ? 4.0 : 2.0), extra = median[x] - median[PLAIN];
            x_array_sum[x] = extra > 0 ? bytes / extra / bandwidth : INFINITY;
            printf("%-22s %10.0f %10.2f %10.0f %14.2f\n", names[x], bytes / 1e6, 1e3 * extra,
                   extra > 0 ? bytes / extra / 1e6 : INFINITY, x_array_sum[x]);
        }
    }
    if (csv_path) {
        FILE *csv = fopen(csv_path, "w");
        if (!csv) {
            fprintf(stderr, "--csv: cannot write %s\n", csv_path);
            goto done;
        }
        fprintf(csv, "variant,n,d,heads,threads,pass,ms,x_plain,x_array_sum\n");
        for (int x = 0; x < VARIANTS; ++x)
            fprintf(csv, "\"%s\",%lld,%lld,%lld,%d,%s,%.4f,%.4f,%.4f\n", names[x], (long long)n, (long long)d,
                    (long long)heads, threads, backward ? "fwd+bwd" : "fwd", 1e3 * median[x],
                    median[x] / median[PLAIN], x_array_sum[x]);
        fclose(csv);
    }
    (void)sink;
    status = 0;
done:
    free(q), free(k), free(v), free(o), free(lse), free(bias), free(slopes), free(sinks);
    free(bias_f16), free(bias_bf16), free(dout), free(dq), free(dk), free(dv), free(dbias32), free(dbias16);
    free(times);
    if (ctx) fa_context_destroy(ctx);
    return status;
}

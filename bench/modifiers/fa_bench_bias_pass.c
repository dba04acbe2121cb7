/* The bias pass alone: the selected kernels' bias_cols on the tiles the CPU forward gives it
 * (Br = 128 queries x Bc keys of a [H, N, N] bias, a key-major score tile of ld 144), one thread,
 * thread CPU time, best of the rounds. Two walks: "memory" visits every tile of the bias once in
 * the forward's order (heads, query tiles, key tiles), so the bias comes from memory as in
 * fa-bench-modifiers; "cached" applies the first tile again as often, so only the pass's own
 * work remains. Their difference is what memory adds; the forward's extra time with a bias is
 * about the "memory" time (bench/results/modifiers-cpu-2026-11-24-s9.md).
 *   fa-bench-bias-pass [--n 2048] [--heads 8] [--bc 1024] [--dtype f32|f16|bf16] [--pad 0]
 *                      [--rounds 3]
 * --pad P: the bias's row stride is N + P elements (N a power of two puts the rows of a block in
 * one L1 set: P = 16 shows what that costs). */
#define _ISOC11_SOURCE
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dtype.h"
#include "cpu/kernels/kernels.h"

enum { TILE_ROWS = 128, TILE_LD = 144 }; /* the forward's Br at d = 64 and fa_cpu_tile_ld(128) */

static double thread_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Every (head, query tile, key tile) of the bias once, or (cached) the first tile as often. */
static double walk(const fa_cpu_kernels *kern, const char *bias, fa_dtype dtype, int64_t n, int64_t heads, int64_t bc,
                   int64_t ld_bias, int cached, float *st, float *col_max)
{
    const int64_t es = (int64_t)fa_dtype_size(dtype);
    const double t0 = thread_seconds();
    for (int64_t h = 0; h < heads; ++h)
        for (int64_t i0 = 0; i0 + TILE_ROWS <= n; i0 += TILE_ROWS)
            for (int64_t j0 = 0; j0 + bc <= n; j0 += bc) {
                const char *tile = cached ? bias : bias + ((h * n + i0) * ld_bias + j0) * es;
                for (int r = 0; r < TILE_ROWS; ++r) col_max[r] = -1e30f;
                kern->bias_cols(st, TILE_LD, bc, TILE_ROWS, 0.125f, tile, dtype, ld_bias, col_max);
            }
    return thread_seconds() - t0;
}

int main(int argc, char **argv)
{
    int64_t n = 2048, heads = 8, bc = 1024, pad = 0;
    int rounds = 3;
    fa_dtype dtype = FA_DTYPE_F32;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n")) n = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) heads = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--bc")) bc = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--pad")) pad = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype"))
            dtype = !strcmp(argv[i + 1], "f16") ? FA_DTYPE_F16 : !strcmp(argv[i + 1], "bf16") ? FA_DTYPE_BF16 : FA_DTYPE_F32;
        else {
            fprintf(stderr, "unknown option %s (see the comment at the top of fa_bench_bias_pass.c)\n", argv[i]);
            return 1;
        }
    }
    if (n < TILE_ROWS || bc < 1 || bc > n || pad < 0 || rounds < 1) {
        fprintf(stderr, "need --n >= %d, 1 <= --bc <= --n, --pad >= 0, --rounds >= 1\n", TILE_ROWS);
        return 1;
    }
    const fa_cpu_kernels *kern;
    if (fa_cpu_select_kernels(&kern) != FA_SUCCESS) return 1;
    const int64_t ld_bias = n + pad, es = (int64_t)fa_dtype_size(dtype);
    const size_t bytes = (size_t)(heads * n * ld_bias * es);
    char *bias = malloc(bytes);
    /* 64-byte aligned, as the forward's scratch: a vector of S^T in one line */
    float *st = aligned_alloc(64, (size_t)(bc * TILE_LD) * sizeof(float)), col_max[TILE_ROWS];
    if (!bias || !st) return 1;
    /* small values in every dtype, different on every page (a page of zeros may be shared) */
    for (size_t i = 0; i < bytes / 2; ++i) ((uint16_t *)bias)[i] = (uint16_t)(0x3c00 + i % 61);
    for (int64_t i = 0; i < bc * TILE_LD; ++i) st[i] = (float)(i % 13) - 6.0f;
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < rounds; ++r)
        for (int cached = 0; cached < 2; ++cached) {
            const double t = walk(kern, bias, dtype, n, heads, bc, ld_bias, cached, st, col_max);
            if (t < best[cached]) best[cached] = t;
        }
    const double read = (double)(heads * (n / TILE_ROWS * TILE_ROWS) * (n / bc * bc) * es);
    printf("# bias_cols (isa %s), [%lld, %lld, %lld] %s bias, row stride %lld, tiles %d x %lld, one thread, best of %d\n",
           kern->isa, (long long)heads, (long long)n, (long long)n, dtype == FA_DTYPE_F32 ? "f32" : dtype == FA_DTYPE_F16 ? "f16" : "bf16",
           (long long)ld_bias, TILE_ROWS, (long long)bc, rounds);
    printf("memory %8.2f ms %6.1f GB/s   cached %8.2f ms\n", 1e3 * best[0], read / best[0] / 1e9, 1e3 * best[1]);
    free(bias);
    free(st);
    return 0;
}

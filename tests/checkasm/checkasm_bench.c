#define _POSIX_C_SOURCE 200809L /* clock_gettime, CLOCK_THREAD_CPUTIME_ID */
/* checkasm --bench: every kernel on the tile shapes the CPU drivers give it (the forward's
 * S^T = K Q^T, col_max, exp_cols and O = alpha O + P V; the backward's dV += P^T dO and gemm_ds;
 * the decode's
 * gemm_nt, decode_scores and decode_values; the conversions), in ns per call of this thread's CPU time (other jobs on a shared
 * machine do not count), best of 9 samples after a warm-up, against the reference kernel, and
 * for the products the fraction of the one-thread FMA peak of the same ISA (fma_peak.h). Then, per
 * head dimension, the forward's kernels per tile pair: their FLOPs (4 Br Bc d) over their summed
 * time, as a fraction of the peak, and the share of the softmax kernels (kernels only: the driver's
 * copies, masks and joins are not in it). */
#include "checkasm_bench.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_tile.h"
#include "fma_peak.h" /* bench/cpu/probe */
#include "cpu/kernels/kernels.h"

enum { BUF = 1 << 18, SAMPLES = 9 }; /* BUF: floats per buffer, >= the forward's S^T at d 64 (1024 x 144) */

typedef struct buffers { float *a, *b, *c, *d, *vec0, *vec1, *vec2; uint16_t *half; uint32_t *pairs; } buffers;

typedef struct bench_case {
    const char *kernel; /* the kernel's name, matched by --function */
    const char *what;
    int64_t br, bc, d;  /* the tile shape (the drivers' tiles on a 1 MiB L2) */
    void (*run)(const fa_cpu_kernels *k, const buffers *m, const struct bench_case *c);
    double flops;       /* per call, 0 for kernels without FMAs worth counting */
    int role;           /* its part of the forward's tile pair (the summary), or NOT_IN_PAIR */
} bench_case;
enum { NOT_IN_PAIR, PAIR_ST, PAIR_COL_MAX, PAIR_EXP, PAIR_PV, PAIR_ST_MAX, PAIR_ROLES };

/* The drivers' row stride of the key-major tiles (S^T, P, dS^T, Q^T, dO^T): Br floats, padded where
 * Br is a multiple of 128 (fa_cpu_tile_ld). With unpadded 512-byte rows, S^T at d = 128 read 0.58 of
 * the peak on an Emerald Rapids (48 KiB 12-way L1) where the forward's own layout runs ~0.95. */
static int64_t tile_ld(const bench_case *c) { return fa_cpu_tile_ld(c->br); }
static void run_st(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{ k->gemm(c->bc, c->br, c->d, m->a, c->d, 1, m->b, tile_ld(c), m->c, tile_ld(c), NULL, 0); }
static void run_st_max(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{ k->gemm_max(c->bc, c->br, c->d, m->a, c->d, 1, m->b, tile_ld(c), m->c, tile_ld(c), m->vec1); }
/* S^T = K Q^T on bf16 K rows and Q^T pairs (the reference: the portable twin). */
static void run_st_max_bf16(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{
    (k->gemm_max_bf16 ? k->gemm_max_bf16 : fa_cpu_ref_gemm_max_bf16)(c->bc, c->br, c->d, m->half, c->d, m->pairs, tile_ld(c),
                                                                        m->c, tile_ld(c), m->vec1);
}
static void run_pv(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{ k->gemm(c->br, c->d, c->bc, m->c, 1, tile_ld(c), m->a, c->d, m->d, c->d, m->vec0, 1); }
static void run_dv(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{ k->gemm(c->bc, c->d, c->br, m->c, tile_ld(c), 1, m->b, c->d, m->d, c->d, NULL, 1); }
/* The backward's dS^T = P^T o (V dO^T - D) in one product. */
static void run_dp_ds(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{ k->gemm_ds(c->bc, c->br, c->d, m->a, c->d, 1, m->b, tile_ld(c), m->d, tile_ld(c), m->c, tile_ld(c), m->vec1); }
static void run_col_max(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{ k->col_max(m->c, tile_ld(c), c->bc, c->br, m->vec1); }
static void run_exp_cols(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{ k->exp_cols(m->c, tile_ld(c), c->bc, c->br, 0.125f, m->vec0, m->vec2); }
static void run_softcap(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{ k->softcap_cols(m->c, tile_ld(c), c->bc, c->br, 0.125f, 30.0f, 0.0f, 0, NULL, m->vec1); }
/* gemm_scores: the softcap (with ALiBi) in the product's registers. */
static void run_scores_softcap(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{
    const fa_cpu_score_mods mods = {.scale = 0.125f, .cap = 30.0f};
    k->gemm_scores(c->bc, c->br, c->d, m->a, c->d, 1, m->b, tile_ld(c), m->c, tile_ld(c), &mods, m->vec1);
}
static void run_scores_alibi(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{
    const fa_cpu_score_mods mods = {.scale = 0.125f, .cap = 30.0f, .alibi = 1, .slope = 0.25f, .first = 7};
    k->gemm_scores(c->bc, c->br, c->d, m->a, c->d, 1, m->b, tile_ld(c), m->c, tile_ld(c), &mods, m->vec1);
}
static void run_gemm_nt(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{ k->gemm_nt(c->bc, c->br, c->d, m->a, c->d, m->b, c->d, m->c, c->br); }
/* The decode's tile: 32 keys of 8 kv heads (d 128) against 4 query rows each, in place. */
static void run_decode_scores(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{
    const int f16 = c->br == 16;
    k->decode_scores(32, 8, 4, 128, f16 ? (const void *)m->half : m->a, f16 ? FA_DTYPE_F16 : FA_DTYPE_F32, 8 * 128,
                     4 * 8 * 128, 128, m->b, 4 * 128, m->c, 32);
}
static void run_decode_values(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{
    const int f16 = c->br == 16;
    k->decode_values(32, 8, 4, 128, m->c, 32, f16 ? (const void *)m->half : m->a, f16 ? FA_DTYPE_F16 : FA_DTYPE_F32,
                     8 * 128, 4 * 8 * 128, 128, m->d, 4 * 128, m->vec0);
}
static void run_f16(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{ (void)c; k->f16_to_f32(m->half, m->a, 65536); }
static void run_bf16(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{ (void)c; k->bf16_to_f32(m->half, m->a, 65536); }
static void run_to_f16(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{ (void)c; k->f32_to_f16(m->b, m->half, 65536); }

#define PRODUCT(br, bc, d) (2.0 * (double)(br) * (double)(bc) * (double)(d))
/* The forward's kernels on one tile pair (roles for the summary) and the backward's products on
 * its own tiles: the forward raises Br to 128 at d = 64 (cpu_forward.c), the backward keeps the
 * paper's 64; at d = 128 both take 128 x 512, where S^T and P V stand for dP^T and dQ too. */
#define FORWARD_CASES(br, bc, d, st, pv)                                                                           \
    {"gemm", st, br, bc, d, run_st, PRODUCT(br, bc, d), PAIR_ST},                                                   \
    {"col_max", "row max of S^T (fwd, partial tiles)", br, bc, d, run_col_max, 0, PAIR_COL_MAX},                    \
    {"exp_cols", "P = exp(S - m), row sums", br, bc, d, run_exp_cols, 0, PAIR_EXP},                                 \
    {"gemm", pv, br, bc, d, run_pv, PRODUCT(br, bc, d), PAIR_PV},                                                   \
    {"gemm_max", "S^T = K Q^T and its row max (fwd, full tiles)", br, bc, d, run_st_max, PRODUCT(br, bc, d),       \
     PAIR_ST_MAX}
#define BACKWARD_DV_CASE(br, bc, d)                                                                                 \
    {"gemm", "dV += P^T dO (bwd; dK += dS^T Q)", br, bc, d, run_dv, PRODUCT(br, bc, d), NOT_IN_PAIR}
static const bench_case cases[] = {
    FORWARD_CASES(128, 1024, 64, "S^T = K Q^T (fwd)", "O = alpha O + P V (fwd)"),
    {"gemm", "dP^T = V dO^T (bwd; S^T alike)", 64, 1024, 64, run_st, PRODUCT(64, 1024, 64), NOT_IN_PAIR},
    {"gemm", "dQ += dS K (bwd)", 64, 1024, 64, run_pv, PRODUCT(64, 1024, 64), NOT_IN_PAIR},
    BACKWARD_DV_CASE(64, 1024, 64),
    FORWARD_CASES(128, 512, 128, "S^T = K Q^T (fwd; bwd dP^T = V dO^T)", "O = alpha O + P V (fwd; bwd dQ += dS K)"),
    BACKWARD_DV_CASE(128, 512, 128),
    {"gemm_ds", "dS^T = P^T o (V dO^T - D) (bwd)", 64, 1024, 64, run_dp_ds, PRODUCT(64, 1024, 64), NOT_IN_PAIR},
    {"gemm_ds", "dS^T = P^T o (V dO^T - D) (bwd)", 128, 512, 128, run_dp_ds, PRODUCT(128, 512, 128), NOT_IN_PAIR},
    /* FLOPs as the f32 product counts them, 2 m n k (a multiply and an add per k step: one
     * vdpbf16ps lane does two k steps, 4 FLOPs), so the fraction is of the f32 FMA peak and may
     * exceed 1. */
    {"gemm_max_bf16", "S^T = K Q^T, bf16 (vdpbf16ps), row max (fwd)", 128, 1024, 64, run_st_max_bf16,
     PRODUCT(128, 1024, 64), NOT_IN_PAIR},
    {"gemm_max_bf16", "S^T = K Q^T, bf16 (vdpbf16ps), row max (fwd)", 128, 512, 128, run_st_max_bf16,
     PRODUCT(128, 512, 128), NOT_IN_PAIR},
    {"softcap_cols", "S = cap tanh(scale S / cap), row max (fwd)", 128, 1024, 64, run_softcap, 0, NOT_IN_PAIR},
    {"gemm_scores", "gemm_max with the softcap in the registers (fwd, full tiles)", 128, 1024, 64, run_scores_softcap,
     PRODUCT(128, 1024, 64), NOT_IN_PAIR},
    {"gemm_scores", "gemm_max with softcap and ALiBi in the registers", 128, 1024, 64, run_scores_alibi,
     PRODUCT(128, 1024, 64), NOT_IN_PAIR},
    {"gemm_scores", "gemm_max with the softcap in the registers (fwd, full tiles)", 128, 512, 128, run_scores_softcap,
     PRODUCT(128, 512, 128), NOT_IN_PAIR},
    {"gemm_nt", "decode S^T = K q^T, 4 queries", 4, 512, 128, run_gemm_nt, PRODUCT(4, 512, 128), NOT_IN_PAIR},
    /* br: the cache's bits per element */
    {"decode_scores", "decode S^T, 32 keys x 8 heads x 4 rows, f32 cache", 32, 32, 128, run_decode_scores,
     PRODUCT(32, 32, 128), NOT_IN_PAIR},
    {"decode_scores", "decode S^T, 32 keys x 8 heads x 4 rows, f16 cache", 16, 32, 128, run_decode_scores,
     PRODUCT(32, 32, 128), NOT_IN_PAIR},
    {"decode_values", "decode O += P V, 32 keys x 8 heads x 4 rows, f32 cache", 32, 32, 128, run_decode_values,
     PRODUCT(32, 32, 128), NOT_IN_PAIR},
    {"decode_values", "decode O += P V, 32 keys x 8 heads x 4 rows, f16 cache", 16, 32, 128, run_decode_values,
     PRODUCT(32, 32, 128), NOT_IN_PAIR},
    {"f16_to_f32", "65536 values", 0, 0, 0, run_f16, 0, NOT_IN_PAIR},
    {"bf16_to_f32", "65536 values", 0, 0, 0, run_bf16, 0, NOT_IN_PAIR},
    {"f32_to_f16", "65536 values", 0, 0, 0, run_to_f16, 0, NOT_IN_PAIR},
};
enum { CASES = sizeof cases / sizeof cases[0] };

static double thread_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_value(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Seconds per call: calls batched to >= 1 ms per sample, the best sample (the FMA peak is a best
 * too: on a shared machine noise only slows). */
static double time_case(const fa_cpu_kernels *k, const buffers *m, const bench_case *c)
{
    int64_t calls = 1;
    for (;;) { /* warm-up and batch size */
        const double t0 = thread_seconds();
        for (int64_t i = 0; i < calls; ++i) c->run(k, m, c);
        if (thread_seconds() - t0 >= 1e-3) break;
        calls *= 2;
    }
    double samples[SAMPLES];
    for (int s = 0; s < SAMPLES; ++s) {
        const double t0 = thread_seconds();
        for (int64_t i = 0; i < calls; ++i) c->run(k, m, c);
        samples[s] = (thread_seconds() - t0) / (double)calls;
    }
    qsort(samples, SAMPLES, sizeof samples[0], by_value);
    return samples[0];
}

static float *filled(size_t count, float lo, float hi)
{
    float *x = malloc(count * sizeof *x);
    uint32_t state = 777u;
    for (size_t i = 0; x && i < count; ++i) {
        state = state * 1664525u + 1013904223u;
        x[i] = lo + (hi - lo) * (float)(state >> 8) * (1.0f / 16777216.0f);
    }
    return x;
}

int checkasm_bench(const char *function, const char *only_isa)
{
    buffers m = {filled(BUF, -1, 1), filled(BUF, -1, 1), filled(BUF, -1, 1), filled(BUF, -1, 1),
                 filled(BUF, 0.5f, 1), filled(BUF, 0, 0), filled(BUF, 0, 0), malloc(BUF * sizeof(uint16_t)),
                 malloc(BUF / 2 * sizeof(uint32_t))};
    int status = 0;
    if (!m.a || !m.b || !m.c || !m.d || !m.vec0 || !m.vec1 || !m.vec2 || !m.half || !m.pairs) {
        fprintf(stderr, "checkasm --bench: out of memory\n");
        status = 1;
        goto done;
    }
    for (int i = 0; i < BUF; ++i) m.half[i] = (uint16_t)(0x3c00 + (i & 0x3ff));
    for (int i = 0; i < BUF / 2; ++i) m.pairs[i] = m.half[2 * i] | (uint32_t)m.half[2 * i + 1] << 16; /* bf16 ~2^-7 */
    const fa_cpu_kernels *ref = &fa_cpu_kernels_ref;
    double ref_seconds[CASES];
    printf("\ncheckasm --bench: ns per call (this thread's CPU time, best of %d), vs ref = ref time / time;\n"
           "products: GFLOP/s and the fraction of the same ISA's one-thread FMA peak\n", SAMPLES);
    for (int ci = 0; ci < CASES; ++ci) ref_seconds[ci] = fnmatch(function, cases[ci].kernel, 0) ? 0 : time_case(ref, &m, &cases[ci]);
    for (int i = 0; i < FA_CPU_ISA_COUNT; ++i) {
        const fa_cpu_kernels *k = fa_cpu_kernels_by_name(fa_cpu_isa_name(i));
        if (!k || (only_isa && strcmp(k->isa, only_isa) && strcmp(k->isa, "ref"))) continue;
        const double peak = fa_cpu_fma_peak(k, 1);
        const double l1 = fa_cpu_l1_gemm_rate(k, 1);
        printf("\n%s: one-thread FMA peak %.1f GFLOP/s; its gemm on a product that stays in L1 %.1f (%.2f of the peak:\n"
               "  below ~0.9 on a vector ISA, something else is using this core's caches and loads now)\n",
               k->isa, peak, l1, l1 / peak);
        double seconds[CASES] = {0};
        for (int ci = 0; ci < CASES; ++ci) {
            const bench_case *c = &cases[ci];
            if (fnmatch(function, c->kernel, 0)) continue;
            if (c->run == run_st_max_bf16 && !k->gemm_max_bf16 && k != ref) continue; /* no AVX512_BF16 here */
            seconds[ci] = k == ref ? ref_seconds[ci] : time_case(k, &m, c);
            printf("  %-11s %-42s d=%-3lld Br=%-3lld Bc=%-4lld %11.0f ns %7.2fx ref", c->kernel, c->what, (long long)c->d,
                   (long long)c->br, (long long)c->bc, seconds[ci] * 1e9, ref_seconds[ci] / seconds[ci]);
            if (c->flops > 0) printf(" %7.1f GFLOP/s %5.2f of peak", c->flops / seconds[ci] * 1e-9, c->flops / seconds[ci] * 1e-9 / peak);
            printf("\n");
        }
        /* The forward's kernels per tile pair, per shape: partial tiles (S^T, col_max after the
         * mask, exp_cols, P V) and full ones (gemm_max, exp_cols, P V). */
        for (int ci = 0; ci < CASES; ++ci) {
            if (cases[ci].role != PAIR_ST) continue;
            double t[PAIR_ROLES] = {0};
            for (int cj = 0; cj < CASES; ++cj)
                if (cases[cj].role != NOT_IN_PAIR && cases[cj].br == cases[ci].br && cases[cj].bc == cases[ci].bc &&
                    cases[cj].d == cases[ci].d)
                    t[cases[cj].role] = seconds[cj];
            const double flops = 2.0 * cases[ci].flops, exp = t[PAIR_EXP], pv = t[PAIR_PV];
            const long long d = (long long)cases[ci].d, br = (long long)cases[ci].br, bc = (long long)cases[ci].bc;
            if (t[PAIR_ST] > 0 && t[PAIR_COL_MAX] > 0 && exp > 0 && pv > 0) {
                const double sum = t[PAIR_ST] + t[PAIR_COL_MAX] + exp + pv;
                printf("  forward tile pair d=%lld %lld x %lld, gemm + col_max (partial tiles): %.2f of peak; col_max + "
                       "exp_cols %.0f%% of the time\n", d, br, bc, flops / sum * 1e-9 / peak,
                       100.0 * (t[PAIR_COL_MAX] + exp) / sum);
            }
            if (t[PAIR_ST_MAX] > 0 && exp > 0 && pv > 0) {
                const double sum = t[PAIR_ST_MAX] + exp + pv;
                printf("  forward tile pair d=%lld %lld x %lld, gemm_max (full tiles): %.2f of peak; exp_cols %.0f%% of "
                       "the time\n", d, br, bc, flops / sum * 1e-9 / peak, 100.0 * exp / sum);
            }
        }
    }
done:
    free(m.a); free(m.b); free(m.c); free(m.d); free(m.vec0); free(m.vec1); free(m.vec2); free(m.half); free(m.pairs);
    return status;
}

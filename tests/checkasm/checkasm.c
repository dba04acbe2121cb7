#define _POSIX_C_SOURCE 200809L /* setenv */
/* checkasm (in the style of dav1d's): every ISA kernel built into the library and supported by
 * this CPU against the portable reference kernel, on odd shapes, strides and edge values; then
 * the whole forward and backward with the ISA forced through FLASHATTN_CPU_ISA against the same
 * problem run with FLASHATTN_CPU_ISA=ref. ISAs this CPU lacks are skipped.
 *   test_checkasm [--function=PATTERN] [--isa=NAME] [--seed=N] [--bench]
 * --function: only the kernels whose name matches the glob (gemm, gemm_nt, gemm_max, gemm_scores, gemm_max_bf16, gemm_ds,
 * decode_scores,
 * decode_values, col_max, exp_cols, softcap_cols, alibi_cols, bias_cols, transpose, f16_to_f32,
 * bf16_to_f32, f32_to_f16, fma_chains, whole_problems); --seed: the random inputs
 * (printed, default 12345); --bench: after the checks, each kernel's time per call on the
 * forward's and backward's tile shapes, against its reference twin, and for the products the
 * fraction of the one-thread FMA peak of the same ISA (checkasm_bench.c). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <fnmatch.h>

#include "checkasm_bench.h"
#include "common/dtype.h"
#include "common/half.h"
#include "cpu/kernels/exp_poly.h"
#include "fma_peak.h" /* bench/cpu/probe */
#include "cpu/kernels/kernels.h"
#include "flashattn.h"

static uint32_t rng_state = 12345u;
static float uniform(float lo, float hi)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return lo + (hi - lo) * (float)(rng_state >> 8) * (1.0f / 16777216.0f);
}

static const fa_cpu_kernels *isa_or_skip(void **state)
{
    const char *name = *state;
    const fa_cpu_kernels *k = fa_cpu_kernels_by_name(name);
    if (!k) {
        print_message("checkasm: %s not built or not supported by this CPU, skipped\n", name);
        skip();
    }
    return k;
}

/* gemm on odd sizes, both A orientations, padded leading dimensions, all epilogues; elements of
 * C outside the m x n extent must keep their sentinel. */
static void test_gemm(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    static const int64_t sizes[] = {1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 47, 64, 65};
    enum { S = sizeof sizes / sizeof sizes[0] };
    for (int trial = 0; trial < 300; ++trial) {
        const int64_t m = sizes[trial % S], n = sizes[(trial * 7 + 3) % S], k = sizes[(trial * 5 + 1) % S];
        const int transposed_a = trial & 1, accumulate = (trial >> 1) % 3; /* 0, 1, 2 = with row_scale */
        const int64_t lda = (transposed_a ? m : k) + 3, ldb = n + 5, ldc = n + 2;
        const int64_t rsa = transposed_a ? 1 : lda, csa = transposed_a ? lda : 1;
        const int64_t a_len = (transposed_a ? k : m) * lda;
        float *a = malloc((size_t)a_len * 4), *b = malloc((size_t)(k * ldb) * 4), *scale = malloc((size_t)m * 4);
        float *c_ref = malloc((size_t)(m * ldc) * 4), *c_isa = malloc((size_t)(m * ldc) * 4);
        assert_non_null(a); assert_non_null(b); assert_non_null(scale); assert_non_null(c_ref); assert_non_null(c_isa);
        for (int64_t x = 0; x < a_len; ++x) a[x] = uniform(-1, 1);
        for (int64_t x = 0; x < k * ldb; ++x) b[x] = uniform(-1, 1);
        for (int64_t x = 0; x < m; ++x) scale[x] = uniform(0, 1);
        for (int64_t x = 0; x < m * ldc; ++x) c_ref[x] = c_isa[x] = (x % ldc) < n ? uniform(-1, 1) : 1234.5f;
        const float *rs = accumulate == 2 ? scale : NULL;
        ref->gemm(m, n, k, a, rsa, csa, b, ldb, c_ref, ldc, rs, accumulate != 0);
        isa->gemm(m, n, k, a, rsa, csa, b, ldb, c_isa, ldc, rs, accumulate != 0);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
                const float want = c_ref[i * ldc + j], got = c_isa[i * ldc + j];
                if (j >= n) {
                    if (got != 1234.5f) fail_msg("gemm %s: wrote outside C at (%lld, %lld)", isa->isa, (long long)i, (long long)j);
                    continue;
                }
                /* |sum| <= k (|a|, |b| < 1): k roundings of relative 2^-24 each, plus the epilogue */
                const float tol = 4e-7f * (float)(k + 2);
                if (!(fabsf(got - want) <= tol))
                    fail_msg("gemm %s m=%lld n=%lld k=%lld transA=%d acc=%d: C(%lld,%lld) = %.9g, ref %.9g", isa->isa,
                             (long long)m, (long long)n, (long long)k, transposed_a, accumulate, (long long)i,
                             (long long)j, got, want);
            }
        free(a); free(b); free(scale); free(c_ref); free(c_isa);
    }
}

/* gemm_max on odd sizes and padded leading dimensions: C bit for bit as the same ISA's gemm (the
 * same products in the same order), the column max bit for bit as the reference col_max of that C,
 * nothing written outside C's extent or past col_max[n). */
static void test_gemm_max(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    static const int64_t sizes[] = {1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 47, 64, 65};
    enum { S = sizeof sizes / sizeof sizes[0] };
    for (int trial = 0; trial < 200; ++trial) {
        const int64_t m = sizes[trial % S], n = sizes[(trial * 7 + 3) % S], k = sizes[(trial * 5 + 1) % S];
        const int64_t lda = k + 3, ldb = n + 5, ldc = n + 2;
        float *a = malloc((size_t)(m * lda) * 4), *b = malloc((size_t)(k * ldb) * 4);
        float *c_gemm = malloc((size_t)(m * ldc) * 4), *c_max = malloc((size_t)(m * ldc) * 4);
        float *want = malloc((size_t)(n + 1) * 4), *got = malloc((size_t)(n + 1) * 4);
        assert_non_null(a); assert_non_null(b); assert_non_null(c_gemm); assert_non_null(c_max); assert_non_null(want); assert_non_null(got);
        for (int64_t x = 0; x < m * lda; ++x) a[x] = uniform(-1, 1);
        for (int64_t x = 0; x < k * ldb; ++x) b[x] = uniform(-1, 1);
        for (int64_t x = 0; x < m * ldc; ++x) c_gemm[x] = c_max[x] = 1234.5f;
        got[n] = 99.0f;
        isa->gemm(m, n, k, a, lda, 1, b, ldb, c_gemm, ldc, NULL, 0);
        isa->gemm_max(m, n, k, a, lda, 1, b, ldb, c_max, ldc, got);
        ref->col_max(c_gemm, ldc, m, n, want);
        if (memcmp(c_gemm, c_max, (size_t)(m * ldc) * 4) != 0)
            fail_msg("gemm_max %s m=%lld n=%lld k=%lld: C differs from gemm's (or was written outside)", isa->isa,
                     (long long)m, (long long)n, (long long)k);
        for (int64_t j = 0; j < n; ++j)
            if (got[j] != want[j])
                fail_msg("gemm_max %s m=%lld n=%lld k=%lld: max[%lld] = %.9g, col_max %.9g", isa->isa, (long long)m,
                         (long long)n, (long long)k, (long long)j, got[j], want[j]);
        assert_true(got[n] == 99.0f);
        free(a); free(b); free(c_gemm); free(c_max); free(want); free(got);
    }
}

/* A bf16 value for gemm_max_bf16's inputs: mostly uniform in [-1, 1], else an edge value (zeros,
 * subnormals, the smallest and largest normals, infinities, NaN), any bit pattern, or a normal of
 * small or large exponent (products that underflow near 2^-126 or overflow). */
static uint16_t bf16_input(int edges)
{
    static const uint16_t edge[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x0081, 0x7f7f, 0xff7f, 0x7f80,
                                    0xff80, 0x7fc0, 0x7f81, 0x3f80, 0xbf80, 0x0040, 0x1f80, 0x2000, 0x5f80, 0x6000,
                                    0x00ff, 0x3f81};
    rng_state = rng_state * 1664525u + 1013904223u;
    const uint32_t r = rng_state >> 8;
    if (!edges || r % 4 == 0) return fa_f32_to_bf16(uniform(-1, 1));
    if (r % 4 == 1) return edge[(r >> 4) % (sizeof edge / sizeof edge[0])];
    if (r % 4 == 2) return (uint16_t)(r >> 4);
    return (uint16_t)((r & 0x807f) | ((r >> 8) % 40 + 100) << 7); /* exponents 2^-27 .. 2^12 */
}

/* gemm_max_bf16 (vdpbf16ps) against its portable twin on odd shapes (m, n, k not multiples of
 * anything, k odd: the pad), padded leading dimensions, uniform and edge inputs: C bit for bit (NaN
 * as NaN: payloads are not specified) and col_max bit for bit (columns without NaN), nothing written outside C or past col_max[n).
 * ISAs without the kernel (no AVX512_BF16 on this CPU, or not an AVX-512 table) are skipped. */
static void test_gemm_max_bf16(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state);
    if (!isa->gemm_max_bf16) {
        print_message("checkasm: gemm_max_bf16 %s: not handed out here (it needs AVX512_BF16 whose vdpbf16ps "
                      "rounds as kernels.h says: select.c probes it), skipped\n", isa->isa);
        skip();
    }
    /* FTZ with tininess after rounding, as measured on Zen 4 (random inputs reach it rarely):
     * 2^-126 (first pair: 1 x 2^-126) minus 2^-e (second pair: -2^-100 x 2^-(e-100)) is flushed to
     * 0 for e <= 150 (it rounds, unbounded, below 2^-126) and rounds to 2^-126 for e >= 151 (the
     * midpoint at e = 151 to even); the twin and the kernel both. */
    {
        enum { COLS = 16, FIRST_E = 140 };
        const uint16_t a[4] = {0, 0x3f80, 0, 0x8d80};
        uint32_t b[2 * COLS];
        float want[COLS], c[2][COLS];
        for (int j = 0; j < COLS; ++j) {
            const int e = FIRST_E + j;
            b[j] = 0x0080u << 16;                              /* (B(0), B(1)) = (0, 2^-126) */
            b[COLS + j] = (uint32_t)((127 - (e - 100)) << 7) << 16; /* (B(2), B(3)) = (0, 2^-(e-100)) */
            want[j] = e <= 150 ? 0.0f : 0x1p-126f;
        }
        fa_cpu_ref_gemm_max_bf16(1, COLS, 4, a, 4, b, COLS, c[0], COLS, NULL);
        isa->gemm_max_bf16(1, COLS, 4, a, 4, b, COLS, c[1], COLS, NULL);
        for (int r = 0; r < 2; ++r)
            for (int j = 0; j < COLS; ++j)
                if (fa_f32_bits(c[r][j]) != fa_f32_bits(want[j]))
                    fail_msg("gemm_max_bf16 %s: 2^-126 - 2^-%d = %.9g, want %.9g (FTZ, tininess after rounding)",
                             r ? isa->isa : "twin", FIRST_E + j, c[r][j], want[j]);
    }
    static const int64_t sizes[] = {1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 47, 64, 65, 129};
    enum { S = sizeof sizes / sizeof sizes[0] };
    for (int trial = 0; trial < 400; ++trial) {
        const int edges = trial % 2, with_max = trial % 3 != 0;
        const int64_t m = sizes[trial % S], n = sizes[(trial * 7 + 3) % S], k = sizes[(trial * 5 + 1) % S];
        const int64_t lda = k + 3, ldb = n + 5, ldc = n + 2, kp = (k + 1) / 2;
        uint16_t *a = malloc((size_t)(m * lda) * 2);
        uint32_t *b = malloc((size_t)(kp * ldb) * 4);
        float *c_ref = malloc((size_t)(m * ldc) * 4), *c_isa = malloc((size_t)(m * ldc) * 4);
        float *want = malloc((size_t)(n + 1) * 4), *got = malloc((size_t)(n + 1) * 4);
        assert_non_null(a); assert_non_null(b); assert_non_null(c_ref); assert_non_null(c_isa); assert_non_null(want); assert_non_null(got);
        for (int64_t x = 0; x < m * lda; ++x) a[x] = bf16_input(edges);
        for (int64_t q = 0; q < kp; ++q)
            for (int64_t j = 0; j < ldb; ++j) {
                const uint32_t odd = 2 * q + 1 < k ? bf16_input(edges) : 0; /* the pad */
                b[q * ldb + j] = bf16_input(edges) | odd << 16;
            }
        for (int64_t x = 0; x < m * ldc; ++x) c_ref[x] = c_isa[x] = 1234.5f;
        got[n] = 99.0f;
        fa_cpu_ref_gemm_max_bf16(m, n, k, a, lda, b, ldb, c_ref, ldc, with_max ? want : NULL);
        isa->gemm_max_bf16(m, n, k, a, lda, b, ldb, c_isa, ldc, with_max ? got : NULL);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
                const float w = c_ref[i * ldc + j], g = c_isa[i * ldc + j];
                if (j >= n) {
                    if (g != 1234.5f) fail_msg("gemm_max_bf16 %s: wrote outside C at (%lld, %lld)", isa->isa, (long long)i, (long long)j);
                    continue;
                }
                if (fa_f32_bits(g) != fa_f32_bits(w) && !(isnan(g) && isnan(w)))
                    fail_msg("gemm_max_bf16 %s m=%lld n=%lld k=%lld edges=%d: C(%lld,%lld) = %.9g (0x%08x), twin %.9g (0x%08x)",
                             isa->isa, (long long)m, (long long)n, (long long)k, edges, (long long)i, (long long)j, g,
                             (unsigned)fa_f32_bits(g), w, (unsigned)fa_f32_bits(w));
            }
        for (int64_t j = 0; with_max && j < n; ++j) {
            int column_nan = 0; /* a NaN score's max is x86 max's (cpu_nan.h poisons such a row), not ref's */
            for (int64_t i = 0; i < m; ++i) column_nan |= isnan(c_ref[i * ldc + j]);
            if (!column_nan && fa_f32_bits(got[j]) != fa_f32_bits(want[j]))
                fail_msg("gemm_max_bf16 %s m=%lld n=%lld k=%lld: max[%lld] = %.9g, twin %.9g", isa->isa, (long long)m,
                         (long long)n, (long long)k, (long long)j, got[j], want[j]);
        }
        assert_true(got[n] == 99.0f);
        free(a); free(b); free(c_ref); free(c_isa); free(want); free(got);
    }
}

/* gemm_scores on odd sizes and padded leading dimensions, with the softcap (caps 30 and 0.5), with
 * and without ALiBi, and ALiBi alone: C bit for bit as the same ISA's gemm followed by softcap_cols
 * or alibi_cols (what the backward recomputes the forward's scores with), the column max bit for
 * bit as col_max of that C, nothing written outside C's extent or past col_max[n); and within the
 * softcap's tolerance of the reference (its tanh is libm's). Raw -inf scores (infinite inputs)
 * stay -inf as the passes keep them. */
static void test_gemm_scores(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    static const int64_t sizes[] = {1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 47, 64, 65};
    enum { S = sizeof sizes / sizeof sizes[0] };
    for (int trial = 0; trial < 240; ++trial) {
        const int64_t m = sizes[trial % S], n = sizes[(trial * 7 + 3) % S], k = sizes[(trial * 5 + 1) % S];
        const int64_t lda = k + 3, ldb = n + 5, ldc = n + 2;
        const int mode = trial % 3; /* 0 softcap, 1 softcap + ALiBi, 2 ALiBi */
        const fa_cpu_score_mods mods = {.scale = trial & 4 ? 0.7f : 1.0f, .cap = mode == 2 ? 0.0f : trial & 8 ? 0.5f : 30.0f,
                                        .alibi = mode != 0, .slope = 0.125f, .first = m - n / 2};
        float *a = malloc((size_t)(m * lda) * 4), *b = malloc((size_t)(k * ldb) * 4);
        float *c_pass = malloc((size_t)(m * ldc) * 4), *c_isa = malloc((size_t)(m * ldc) * 4), *c_ref = malloc((size_t)(m * ldc) * 4);
        float *want = malloc((size_t)(n + 1) * 4), *got = malloc((size_t)(n + 1) * 4), *got_ref = malloc((size_t)(n + 1) * 4);
        assert_non_null(a); assert_non_null(b); assert_non_null(c_pass); assert_non_null(c_isa); assert_non_null(c_ref);
        assert_non_null(want); assert_non_null(got); assert_non_null(got_ref);
        const float range = mods.cap > 0.0f ? 4.0f * mods.cap : 4.0f;
        for (int64_t x = 0; x < m * lda; ++x) a[x] = uniform(-1, 1) * sqrtf(range / (float)k) * 2.0f;
        for (int64_t x = 0; x < k * ldb; ++x) b[x] = uniform(-1, 1) * sqrtf(range / (float)k) * 2.0f;
        if (trial % 5 == 2) a[0] = -INFINITY, b[0] = 1.0f; /* a raw -inf in C's first row, if nothing else is infinite there */
        for (int64_t x = 0; x < m * ldc; ++x) c_pass[x] = c_isa[x] = c_ref[x] = 1234.5f;
        got[n] = 99.0f;
        isa->gemm(m, n, k, a, lda, 1, b, ldb, c_pass, ldc, NULL, 0);
        if (mods.cap > 0.0f)
            isa->softcap_cols(c_pass, ldc, m, n, mods.scale, mods.cap, mods.alibi ? mods.slope : 0.0f, mods.first, NULL, NULL);
        else
            isa->alibi_cols(c_pass, ldc, m, n, mods.scale, mods.slope, mods.first, NULL);
        isa->col_max(c_pass, ldc, m, n, want);
        isa->gemm_scores(m, n, k, a, lda, 1, b, ldb, c_isa, ldc, &mods, got);
        ref->gemm_scores(m, n, k, a, lda, 1, b, ldb, c_ref, ldc, &mods, got_ref);
        for (int64_t x = 0; x < m * ldc; ++x)
            if (memcmp(&c_isa[x], &c_pass[x], 4) != 0)
                fail_msg("gemm_scores %s mode %d m=%lld n=%lld k=%lld: C(%lld, %lld) = %.9g, the passes give %.9g", isa->isa,
                         mode, (long long)m, (long long)n, (long long)k, (long long)(x / ldc), (long long)(x % ldc), c_isa[x],
                         c_pass[x]);
        for (int64_t j = 0; j < n; ++j)
            if (memcmp(&got[j], &want[j], 4) != 0)
                fail_msg("gemm_scores %s m=%lld n=%lld k=%lld: max[%lld] = %.9g, col_max %.9g", isa->isa, (long long)m,
                         (long long)n, (long long)k, (long long)j, got[j], want[j]);
        assert_true(got[n] == 99.0f);
        for (int64_t x = 0; x < m * ldc; ++x) { /* the ISA's products and tanh against the reference's */
            const float tol = 1e-5f * (mods.cap + fabsf(c_ref[x]) + 1.0f);
            if (!isfinite(c_ref[x]) || x % ldc >= n ? memcmp(&c_isa[x], &c_ref[x], 4) != 0 : !(fabsf(c_isa[x] - c_ref[x]) <= tol))
                fail_msg("gemm_scores %s vs ref mode %d: C(%lld, %lld) = %.9g vs %.9g", isa->isa, mode,
                         (long long)(x / ldc), (long long)(x % ldc), c_isa[x], c_ref[x]);
        }
        free(a); free(b); free(c_pass); free(c_isa); free(c_ref); free(want); free(got); free(got_ref);
    }
}

/* gemm_ds (the backward's dS^T = P^T o (V dO^T - D) in one product) on odd sizes, both A
 * orientations and padded leading dimensions: C bit for bit as the same ISA's gemm followed by the
 * loop P o (C - delta) the backward runs otherwise (with dropout or a softcap), nothing written
 * outside C's extent, and within the product's error of the reference. */
static void test_gemm_ds(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    static const int64_t sizes[] = {1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 47, 64, 65};
    enum { S = sizeof sizes / sizeof sizes[0] };
    for (int trial = 0; trial < 200; ++trial) {
        const int64_t m = sizes[trial % S], n = sizes[(trial * 7 + 3) % S], k = sizes[(trial * 5 + 1) % S];
        const int transposed_a = trial & 1;
        const int64_t lda = (transposed_a ? m : k) + 3, ldb = n + 5, ldc = n + 2, ldp = n + 7;
        const int64_t rsa = transposed_a ? 1 : lda, csa = transposed_a ? lda : 1, a_len = (transposed_a ? k : m) * lda;
        float *a = malloc((size_t)a_len * 4), *b = malloc((size_t)(k * ldb) * 4), *p = malloc((size_t)(m * ldp) * 4);
        float *delta = malloc((size_t)n * 4);
        float *c_pass = malloc((size_t)(m * ldc) * 4), *c_isa = malloc((size_t)(m * ldc) * 4), *c_ref = malloc((size_t)(m * ldc) * 4);
        assert_non_null(a); assert_non_null(b); assert_non_null(p); assert_non_null(delta);
        assert_non_null(c_pass); assert_non_null(c_isa); assert_non_null(c_ref);
        for (int64_t x = 0; x < a_len; ++x) a[x] = uniform(-1, 1);
        for (int64_t x = 0; x < k * ldb; ++x) b[x] = uniform(-1, 1);
        for (int64_t x = 0; x < m * ldp; ++x) p[x] = uniform(0, 1);
        for (int64_t j = 0; j < n; ++j) delta[j] = uniform(-1, 1);
        for (int64_t x = 0; x < m * ldc; ++x) c_pass[x] = c_isa[x] = c_ref[x] = 1234.5f;
        isa->gemm(m, n, k, a, rsa, csa, b, ldb, c_pass, ldc, NULL, 0);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) c_pass[i * ldc + j] = p[i * ldp + j] * (c_pass[i * ldc + j] - delta[j]);
        isa->gemm_ds(m, n, k, a, rsa, csa, b, ldb, c_isa, ldc, p, ldp, delta);
        ref->gemm_ds(m, n, k, a, rsa, csa, b, ldb, c_ref, ldc, p, ldp, delta);
        for (int64_t x = 0; x < m * ldc; ++x) {
            if (memcmp(&c_isa[x], &c_pass[x], 4) != 0)
                fail_msg("gemm_ds %s m=%lld n=%lld k=%lld: C(%lld, %lld) = %.9g, gemm and the loop give %.9g", isa->isa,
                         (long long)m, (long long)n, (long long)k, (long long)(x / ldc), (long long)(x % ldc), c_isa[x],
                         c_pass[x]);
            /* |C| <= k, p < 1: k roundings of 2^-24 relative each, then the subtraction and product */
            if (x % ldc < n && !(fabsf(c_isa[x] - c_ref[x]) <= 4e-7f * (float)(k + 2)))
                fail_msg("gemm_ds %s vs ref m=%lld n=%lld k=%lld: C(%lld, %lld) = %.9g vs %.9g", isa->isa, (long long)m,
                         (long long)n, (long long)k, (long long)(x / ldc), (long long)(x % ldc), c_isa[x], c_ref[x]);
        }
        free(a); free(b); free(p); free(delta); free(c_pass); free(c_isa); free(c_ref);
    }
}

/* gemm_nt (C = A B^T) on odd sizes and padded leading dimensions, tails of k below and above
 * the vector width; elements of C outside the m x n extent must keep their sentinel. */
static void test_gemm_nt(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    static const int64_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 32, 33, 64, 65, 128};
    enum { S = sizeof sizes / sizeof sizes[0] };
    for (int trial = 0; trial < 300; ++trial) {
        const int64_t m = sizes[trial % S], n = sizes[(trial * 7 + 3) % S] % 20 + 1, k = sizes[(trial * 5 + 1) % S];
        const int64_t lda = k + trial % 4, ldb = k + 3, ldc = n + 2;
        float *a = malloc((size_t)(m * lda) * 4), *b = malloc((size_t)(n * ldb) * 4);
        float *c_ref = malloc((size_t)(m * ldc) * 4), *c_isa = malloc((size_t)(m * ldc) * 4);
        assert_non_null(a); assert_non_null(b); assert_non_null(c_ref); assert_non_null(c_isa);
        for (int64_t x = 0; x < m * lda; ++x) a[x] = uniform(-1, 1);
        for (int64_t x = 0; x < n * ldb; ++x) b[x] = uniform(-1, 1);
        for (int64_t x = 0; x < m * ldc; ++x) c_ref[x] = c_isa[x] = 1234.5f;
        ref->gemm_nt(m, n, k, a, lda, b, ldb, c_ref, ldc);
        isa->gemm_nt(m, n, k, a, lda, b, ldb, c_isa, ldc);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
                const float want = c_ref[i * ldc + j], got = c_isa[i * ldc + j];
                if (j >= n) {
                    if (got != 1234.5f) fail_msg("gemm_nt %s: wrote outside C at (%lld, %lld)", isa->isa, (long long)i, (long long)j);
                    continue;
                }
                const float tol = 4e-7f * (float)(k + 2); /* k roundings in either order, |sum| <= k */
                if (!(fabsf(got - want) <= tol))
                    fail_msg("gemm_nt %s m=%lld n=%lld k=%lld: C(%lld,%lld) = %.9g, ref %.9g", isa->isa, (long long)m,
                             (long long)n, (long long)k, (long long)i, (long long)j, got, want);
            }
        free(a); free(b); free(c_ref); free(c_isa);
    }
}

/* A decode cache of `count` elements of dtype (values in [-1, 1], exactly representable). */
static void *cache_fill(int64_t count, fa_dtype dtype)
{
    void *data = malloc((size_t)count * fa_dtype_size(dtype));
    assert_non_null(data);
    for (int64_t x = 0; x < count; ++x) {
        const float v = uniform(-1, 1);
        if (dtype == FA_DTYPE_F32) ((float *)data)[x] = v;
        else if (dtype == FA_DTYPE_F16) ((uint16_t *)data)[x] = fa_f32_to_f16(v);
        else ((uint16_t *)data)[x] = (uint16_t)(fa_f32_bits(v) >> 16);
    }
    return data;
}

/* The shapes of a decode kernel trial: padded key and head strides of the cache; keys as one run
 * (ld_quad = 4 ld_key) or, every other trial, as four streams (ld_key the streams' padded distance,
 * ld_quad the row stride). extent: elements of the cache the keys span. */
typedef struct decode_shape {
    int64_t n, heads, rows, d, ld_key, ld_quad, ld_head, extent;
    fa_dtype dtype;
} decode_shape;

static decode_shape decode_trial(int trial)
{
    /* an odd count of key counts, so that each is tried in both layouts; 64 (the step's tile) and
     * beyond: more than one block of decode_values' keys */
    static const int64_t keys[] = {1, 2, 3, 5, 8, 15, 16, 17, 33, 40, 64, 70, 131};
    static const int64_t heads[] = {1, 2, 3, 8};
    static const int64_t rows[] = {1, 2, 3, 4, 5, 7, 8, 16};
    static const int64_t dims[] = {1, 3, 8, 16, 17, 31, 64, 100, 128};
    decode_shape s;
    s.n = keys[trial % 13];
    s.heads = heads[(trial / 3) % 4];
    s.rows = rows[(trial * 7 + 1) % 8];
    s.d = dims[(trial * 5 + 2) % 9];
    s.dtype = (fa_dtype)(trial % 3);
    s.ld_head = s.d + (trial / 2) % 3;
    const int64_t row = s.heads * s.ld_head + trial % 5;
    s.ld_key = trial % 2 ? (s.n + 3) / 4 * row + trial % 7 : row;
    s.ld_quad = trial % 2 ? row : 4 * row;
    s.extent = 0;
    for (int64_t x = 0; x < s.n; ++x) {
        const int64_t end = fa_decode_key_offset(x, s.ld_key, s.ld_quad) + row;
        if (end > s.extent) s.extent = end;
    }
    return s;
}

/* decode_scores on odd shapes, padded strides, every cache dtype; S^T outside its extent keeps
 * its sentinel. */
static void test_decode_scores(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    for (int trial = 0; trial < 360; ++trial) {
        const decode_shape s = decode_trial(trial);
        const int64_t ldq_head = s.rows * s.d + 2, cols = s.heads * s.rows, ldst = cols + 3;
        void *k = cache_fill(s.extent, s.dtype);
        float *q = malloc((size_t)(s.heads * ldq_head) * 4), *want = malloc((size_t)(s.n * ldst) * 4);
        float *got = malloc((size_t)(s.n * ldst) * 4);
        assert_non_null(q); assert_non_null(want); assert_non_null(got);
        for (int64_t x = 0; x < s.heads * ldq_head; ++x) q[x] = uniform(-1, 1);
        for (int64_t x = 0; x < s.n * ldst; ++x) want[x] = got[x] = 1234.5f;
        ref->decode_scores(s.n, s.heads, s.rows, s.d, k, s.dtype, s.ld_key, s.ld_quad, s.ld_head, q, ldq_head, want, ldst);
        isa->decode_scores(s.n, s.heads, s.rows, s.d, k, s.dtype, s.ld_key, s.ld_quad, s.ld_head, q, ldq_head, got, ldst);
        for (int64_t x = 0; x < s.n * ldst; ++x) {
            if (x % ldst >= cols) {
                if (got[x] != 1234.5f) fail_msg("decode_scores %s: wrote outside S^T at %lld", isa->isa, (long long)x);
                continue;
            }
            const float tol = 4e-7f * (float)(s.d + 2); /* d roundings in either order, |sum| <= d */
            if (!(fabsf(got[x] - want[x]) <= tol))
                fail_msg("decode_scores %s n=%lld heads=%lld rows=%lld d=%lld dtype=%d: S^T[%lld] = %.9g, ref %.9g",
                         isa->isa, (long long)s.n, (long long)s.heads, (long long)s.rows, (long long)s.d, (int)s.dtype,
                         (long long)x, got[x], want[x]);
        }
        free(k); free(q); free(want); free(got);
    }
}

/* decode_values on the same shapes, with and without the rescale; O outside its rows keeps its
 * sentinel. */
static void test_decode_values(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    for (int trial = 0; trial < 360; ++trial) {
        const decode_shape s = decode_trial(trial);
        const int64_t cols = s.heads * s.rows, ldp = cols + 1, ldo_head = s.rows * s.d + 3;
        void *v = cache_fill(s.extent, s.dtype);
        float *pr = malloc((size_t)(s.n * ldp) * 4), *alpha = malloc((size_t)cols * 4);
        float *want = malloc((size_t)(s.heads * ldo_head) * 4), *got = malloc((size_t)(s.heads * ldo_head) * 4);
        assert_non_null(pr); assert_non_null(alpha); assert_non_null(want); assert_non_null(got);
        for (int64_t x = 0; x < s.n * ldp; ++x) pr[x] = uniform(0, 1);
        for (int64_t x = 0; x < cols; ++x) alpha[x] = uniform(0, 1);
        for (int64_t x = 0; x < s.heads * ldo_head; ++x) want[x] = got[x] = x % ldo_head < s.rows * s.d ? uniform(-1, 1) : 1234.5f;
        const float *scale = trial % 4 == 3 ? NULL : alpha;
        ref->decode_values(s.n, s.heads, s.rows, s.d, pr, ldp, v, s.dtype, s.ld_key, s.ld_quad, s.ld_head, want, ldo_head, scale);
        isa->decode_values(s.n, s.heads, s.rows, s.d, pr, ldp, v, s.dtype, s.ld_key, s.ld_quad, s.ld_head, got, ldo_head, scale);
        for (int64_t x = 0; x < s.heads * ldo_head; ++x) {
            if (x % ldo_head >= s.rows * s.d) {
                if (got[x] != 1234.5f) fail_msg("decode_values %s: wrote outside O at %lld", isa->isa, (long long)x);
                continue;
            }
            const float tol = 4e-7f * (float)(s.n + 2); /* n + 1 roundings, |O| <= n + 1 */
            if (!(fabsf(got[x] - want[x]) <= tol))
                fail_msg("decode_values %s n=%lld heads=%lld rows=%lld d=%lld dtype=%d scale=%d: O[%lld] = %.9g, ref %.9g",
                         isa->isa, (long long)s.n, (long long)s.heads, (long long)s.rows, (long long)s.d, (int)s.dtype,
                         scale != NULL, (long long)x, got[x], want[x]);
        }
        free(v); free(pr); free(alpha); free(want); free(got);
    }
}

static void test_col_max(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    for (int64_t rows = 1; rows <= 37; rows += 6)
        for (int64_t cols = 1; cols <= 70; cols += 3) {
            const int64_t ld = cols + 1;
            float x[37 * 71], want[71], got[72];
            for (int64_t e = 0; e < rows * ld; ++e) x[e] = (e % 5 == 0) ? -INFINITY : uniform(-50, 50);
            for (int64_t r = 0; r < rows; ++r) x[r * ld] = -INFINITY; /* column 0 fully masked */
            got[cols] = 99.0f;
            ref->col_max(x, ld, rows, cols, want);
            isa->col_max(x, ld, rows, cols, got);
            for (int64_t c = 0; c < cols; ++c)
                if (got[c] != want[c]) fail_msg("col_max %s rows=%lld cols=%lld: [%lld] %g vs %g", isa->isa, (long long)rows, (long long)cols, (long long)c, got[c], want[c]);
            assert_true(got[cols] == 99.0f);
        }
}

/* exp within 2 ulp of expf on [-44.4, 8], plus the effect of rounding the argument scale * x - shift
 * (fused in the ISA kernels, two roundings in the reference: (|scale x| + |shift|) 2^-23 relative),
 * exact zeros for -inf scores and +inf shifts, zeros below FA_EXP_LO (results under 2^-64; where
 * the two roundings of an argument fall on either side of it, one side may be 0). */
static void test_exp_cols(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    for (int64_t rows = 1; rows <= 41; rows += 8)
        for (int64_t cols = 1; cols <= 67; cols += 5) {
            const int64_t ld = cols + 2;
            float x_ref[41 * 69], x_isa[41 * 69], x_in[41 * 69], shift[67], sum_ref[67], sum_isa[68];
            for (int64_t c = 0; c < cols; ++c) shift[c] = c == 1 ? INFINITY : uniform(0, 8);
            for (int64_t e = 0; e < rows * ld; ++e) x_in[e] = x_ref[e] = x_isa[e] = (e % 7 == 3) ? -INFINITY : uniform(-85, 8);
            sum_isa[cols] = 99.0f;
            float sum_tol[69] = {0};
            ref->exp_cols(x_ref, ld, rows, cols, 0.9f, shift, sum_ref);
            isa->exp_cols(x_isa, ld, rows, cols, 0.9f, shift, sum_isa);
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t c = 0; c < ld; ++c) {
                    const float want = x_ref[r * ld + c], got = x_isa[r * ld + c];
                    const int exact = c >= cols || c == 1 || isinf(x_in[r * ld + c]); /* untouched, masked */
                    const float arg = fabsf(0.9f * x_in[r * ld + c]) + (c < cols ? fabsf(shift[c]) : 0.0f);
                    const int flushed = want == 0.0f || got == 0.0f; /* the other side within 2^-64 */
                    const float tol = exact ? 0.0f : flushed ? 0x1.02p-64f : want * (2.4e-7f + arg * 1.2e-7f);
                    if (c < cols) sum_tol[c] += tol + want * 1.2e-7f * (float)rows; /* element error + summation order */
                    if (!(got == want || fabsf(got - want) <= tol))
                        fail_msg("exp_cols %s (%lld, %lld): %.9g vs %.9g", isa->isa, (long long)r, (long long)c, got, want);
                }
            for (int64_t c = 0; c < cols; ++c)
                if (!(fabsf(sum_isa[c] - sum_ref[c]) <= sum_tol[c]))
                    fail_msg("exp_cols %s sum[%lld]: %.9g vs %.9g", isa->isa, (long long)c, sum_isa[c], sum_ref[c]);
            assert_true(sum_isa[cols] == 99.0f);
        }
    /* The ends of the range, exact arguments (scale 1, shift 0): 1024 consecutive floats up from
     * just below FA_EXP_LO (the flush point, -64 ln 2), 1024 down from 88 (the largest), and 2048
     * steps over [-45, -44] and [87, 88]: 0 exactly below FA_EXP_LO, within 2 ulp of expf above. */
    enum { EDGE = 4096, EDGE_COLS = 64 };
    static float edge[EDGE], edge_in[EDGE];
    float zero_shift[EDGE_COLS] = {0}, edge_sum[EDGE_COLS];
    for (int e = 0; e < 1024; ++e) {
        edge[e] = e ? nextafterf(edge[e - 1], 0.0f) : FA_EXP_LO - 1e-5f;
        edge[1024 + e] = e ? nextafterf(edge[1024 + e - 1], 0.0f) : 88.0f;
        edge[2048 + e] = -45.0f + (float)e / 1024.0f;
        edge[3072 + e] = 87.0f + (float)e / 1024.0f;
    }
    memcpy(edge_in, edge, sizeof edge);
    isa->exp_cols(edge, EDGE_COLS, EDGE / EDGE_COLS, EDGE_COLS, 1.0f, zero_shift, edge_sum);
    for (int e = 0; e < EDGE; ++e) {
        const float want = expf(edge_in[e]), got = edge[e];
        const int ok = edge_in[e] < FA_EXP_LO ? got == 0.0f : fabsf(got - want) <= want * 2.4e-7f;
        if (!ok) fail_msg("exp_cols %s: exp(%.9g) = %.9g, expf %.9g", isa->isa, edge_in[e], got, want);
    }
}

/* tanh through softcap_cols with scale = cap = 1 (x * 1 and 1 * t are exact) against tanh in
 * double, on every 199th binary32 of both signs (21M values: large |x|, tiny and subnormal x) and
 * the special values; prints the max absolute and relative errors. Bounds (the ISA kernels'
 * contract, kernels.h): relative 4e-7 for |x| >= 1e-35, absolute 1e-38 below; odd, +-0 kept, |t| <= 1
 * everywhere, +-1 within 1 ulp at and beyond |x| = 9 (here +inf, and 9 with the caps of
 * check_tanh_caps), NaN kept, and -inf left as it is (a masked score) with gradient 0. */
static void check_tanh_accuracy(const fa_cpu_kernels *k, double rel_bound)
{
    enum { CHUNK = 4099 };
    float *x = malloc(CHUNK * sizeof *x), *t = malloc(CHUNK * sizeof *t), *g = malloc(CHUNK * sizeof *g);
    assert_non_null(x); assert_non_null(t); assert_non_null(g);
    double max_abs = 0.0, max_rel = 0.0;
    float worst = 0.0f;
    int64_t filled = 0, checked = 0;
    const uint32_t last = 0x7f800000u; /* +inf */
    for (uint32_t bits = 0;; bits += 199) {
        const int done = bits >= last;
        const uint32_t b = done ? last : bits;
        x[filled++] = fa_bits_f32(b);
        x[filled++] = fa_bits_f32(b | 0x80000000u);
        if (filled + 2 <= CHUNK && !done) continue;
        memcpy(t, x, (size_t)filled * sizeof *t);
        k->softcap_cols(t, filled, 1, filled, 1.0f, 1.0f, 0.0f, 0, g, NULL);
        for (int64_t i = 0; i < filled; ++i) {
            const double want = x[i] == -INFINITY ? -INFINITY : tanh((double)x[i]);
            const double err = fabs((double)t[i] - want), rel = want != 0.0 ? err / fabs(want) : err;
            const int tiny = fabs(want) < 1e-35; /* the rational's products underflow: absolute bound */
            if (isinf(want) ? t[i] != want || !(g[i] >= 0.0f && g[i] <= 0x1p-22f) /* its P is 0 */
                            : !(tiny ? err <= 1e-38 : rel <= rel_bound) || signbit(t[i]) != signbit(x[i]))
                fail_msg("tanh %s(%a) = %a, want %a (relative error %.3g > %.3g)", k->isa, (double)x[i], (double)t[i], want, rel, rel_bound);
            if (!isinf(want) && !tiny && rel > max_rel) max_rel = rel, worst = x[i];
            if (!isinf(want) && err > max_abs) max_abs = err;
            if (!isinf(want) && (fabsf(t[i]) > 1.0f || (fabsf(x[i]) >= 9.0f && fabsf(t[i]) < 1.0f - 0x1p-24f)))
                fail_msg("tanh %s(%a) = %a, want +-1 within 1 ulp, never beyond", k->isa, (double)x[i], (double)t[i]);
        }
        checked += filled;
        filled = 0;
        if (done) break;
    }
    x[0] = NAN;
    k->softcap_cols(x, 1, 1, 1, 1.0f, 1.0f, 0.0f, 0, NULL, NULL);
    assert_true(isnan(x[0]));
    print_message("checkasm: tanh %s over %lld values: max abs error %.3g, max rel error %.3g (at x = %a)\n", k->isa,
                  (long long)checked, max_abs, max_rel, (double)worst);
    free(x); free(t); free(g);
}

/* cap * tanh(x / cap) never beyond +-cap, and +-cap within 1 ulp from |x| = 9 cap on, for caps that
 * are not powers of two (the ISA kernels fold the cap into the rational's coefficients): x from
 * 8.5 cap to 9.5 cap, both signs. */
static void check_tanh_caps(const fa_cpu_kernels *k)
{
    static const float caps[] = {0.3f, 0.7f, 1.0f, 3.0f, 30.0f, 50.0f, 1e-3f, 7e4f};
    enum { STEPS = 4001 };
    float x[2 * STEPS], t[2 * STEPS];
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; ++c) {
        const float cap = caps[c];
        for (int i = 0; i < STEPS; ++i) {
            x[2 * i] = cap * (8.5f + (float)i / (STEPS - 1));
            x[2 * i + 1] = -x[2 * i];
        }
        memcpy(t, x, sizeof t);
        k->softcap_cols(t, 2 * STEPS, 1, 2 * STEPS, 1.0f, cap, 0.0f, 0, NULL, NULL);
        for (int i = 0; i < 2 * STEPS; ++i) {
            const float bound = fabsf(x[i]) >= 9.0f * cap ? cap * (1.0f - 0x1p-24f) : 0.0f;
            if (!(fabsf(t[i]) <= cap && fabsf(t[i]) >= bound) || signbit(t[i]) != signbit(x[i]))
                fail_msg("softcap %s cap %g: x = %a gives %a, want within 1 ulp of +-cap from 9 cap on, never beyond", k->isa,
                         (double)cap, (double)x[i], (double)t[i]);
        }
    }
}

/* softcap_cols against the reference on odd shapes with padded rows (the padding keeps its
 * sentinel), caps 30 and 0.5, scales 1 and 0.7, with and without the fused ALiBi, masked (-inf)
 * scores, with and without the gradient and the column max (which must be the max of the kernel's own results, bit for bit);
 * then the tanh accuracy of the ISA and of the reference. */
static void test_softcap_cols(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    for (int64_t rows = 1; rows <= 41; rows += 8)
        for (int64_t cols = 1; cols <= 67; cols += 5) {
            const int64_t ld = cols + 2;
            const float cap = cols & 1 ? 30.0f : 0.5f, scale = rows % 3 ? 0.7f : 1.0f;
            float x_ref[41 * 69], x_isa[41 * 69], g_ref[41 * 69], g_isa[41 * 69], max_isa[68];
            for (int64_t e = 0; e < rows * ld; ++e) {
                x_ref[e] = x_isa[e] = e % 7 == 3 ? -INFINITY : uniform(-4.0f * cap, 4.0f * cap);
                g_ref[e] = g_isa[e] = 99.0f;
            }
            max_isa[cols] = 99.0f;
            const int with_grad = rows % 16 == 1, with_max = cols % 10 != 6;
            const float slope = cols % 4 == 1 ? 0.0f : cap / 64.0f; /* with and without the fused ALiBi */
            const int64_t first = rows - cols / 2;
            ref->softcap_cols(x_ref, ld, rows, cols, scale, cap, slope, first, with_grad ? g_ref : NULL, NULL);
            isa->softcap_cols(x_isa, ld, rows, cols, scale, cap, slope, first, with_grad ? g_isa : NULL,
                              with_max ? max_isa : NULL);
            for (int64_t e = 0; e < rows * ld; ++e) {
                const int inside = e % ld < cols;
                /* the tanh's error, times cap, plus the ALiBi term's rounding */
                if (!inside || x_ref[e] == -INFINITY ? x_isa[e] != x_ref[e] : !(fabsf(x_isa[e] - x_ref[e]) <= 6e-7f * (cap + fabsf(x_ref[e]))))
                    fail_msg("softcap_cols %s (%lld, %lld): %.9g vs %.9g", isa->isa, (long long)(e / ld), (long long)(e % ld), x_isa[e], x_ref[e]);
                if (!inside || !with_grad ? g_isa[e] != 99.0f : !(fabsf(g_isa[e] - g_ref[e]) <= 2e-6f))
                    fail_msg("softcap_cols %s grad (%lld, %lld): %.9g vs %.9g", isa->isa, (long long)(e / ld), (long long)(e % ld), g_isa[e], g_ref[e]);
            }
            for (int64_t c = 0; with_max && c < cols; ++c) {
                float want = -INFINITY;
                for (int64_t r = 0; r < rows; ++r) want = x_isa[r * ld + c] > want ? x_isa[r * ld + c] : want;
                if (max_isa[c] != want) fail_msg("softcap_cols %s col_max[%lld]: %.9g vs %.9g", isa->isa, (long long)c, max_isa[c], want);
            }
            assert_true(max_isa[cols] == 99.0f);
        }
    check_tanh_accuracy(isa, 4e-7);
    check_tanh_accuracy(ref, 2e-7);
    check_tanh_caps(isa);
    check_tanh_caps(ref);
}

/* alibi_cols bit for bit against the reference (kernels.h: the same bits on every ISA) on odd
 * shapes, padded rows (the padding keeps its sentinel), masked scores, distances of both signs,
 * with and without the column max. */
static void test_alibi_cols(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    for (int64_t rows = 1; rows <= 41; rows += 8)
        for (int64_t cols = 1; cols <= 67; cols += 5) {
            const int64_t ld = cols + 2, first = cols % 3 ? -(int64_t)cols / 2 : 1000003;
            const float scale = rows % 3 ? 0.7f : 1.0f, slope = 1.0f / (float)(cols + 1);
            float x_ref[41 * 69], x_isa[41 * 69], max_ref[68], max_isa[68];
            for (int64_t e = 0; e < rows * ld; ++e) x_ref[e] = x_isa[e] = e % 7 == 3 ? -INFINITY : uniform(-8, 8);
            max_isa[cols] = 99.0f;
            const int with_max = cols % 10 != 6;
            ref->alibi_cols(x_ref, ld, rows, cols, scale, slope, first, with_max ? max_ref : NULL);
            isa->alibi_cols(x_isa, ld, rows, cols, scale, slope, first, with_max ? max_isa : NULL);
            for (int64_t e = 0; e < rows * ld; ++e)
                if (fa_f32_bits(x_isa[e]) != fa_f32_bits(x_ref[e]))
                    fail_msg("alibi_cols %s (%lld, %lld): %.9g vs %.9g", isa->isa, (long long)(e / ld), (long long)(e % ld), x_isa[e], x_ref[e]);
            for (int64_t c = 0; with_max && c < cols; ++c)
                if (max_isa[c] != max_ref[c]) fail_msg("alibi_cols %s col_max[%lld]: %.9g vs %.9g", isa->isa, (long long)c, max_isa[c], max_ref[c]);
            assert_true(max_isa[cols] == 99.0f);
        }
}

/* bias_cols bit for bit against the reference for f32, f16 and bf16 biases (random 16-bit patterns:
 * subnormals, infinities and NaNs widened too) on odd shapes around the W-query and 8-key blocks,
 * padded rows and bias rows (the padding keeps its sentinel), a broadcast bias row (ld_bias 0),
 * masked scores (kept whatever the bias, +inf and NaN included), scales 1 and 0.7; the column max
 * bit for bit as the same ISA's col_max of the results, nothing written past col_max[cols); the
 * keys split over two calls (the max carried in col_max) give the same bits. */
static void test_bias_cols(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    enum { MAX_ROWS = 41, MAX_COLS = 67, LD_MAX = MAX_COLS + 2, LD_BIAS_MAX = MAX_ROWS + 3 };
    static float x_ref[MAX_ROWS * LD_MAX], x_isa[MAX_ROWS * LD_MAX], x_orig[MAX_ROWS * LD_MAX], x_split[MAX_ROWS * LD_MAX];
    static float bias32[MAX_COLS * LD_BIAS_MAX];
    static uint16_t bias16[MAX_COLS * LD_BIAS_MAX];
    float max_isa[MAX_COLS + 1], max_want[MAX_COLS], max_split[MAX_COLS];
    static const char *const dtype_names[] = {"f32", "f16", "bf16"};
    for (int dt = 0; dt < 3; ++dt) {
        const fa_dtype dtype = dt == 0 ? FA_DTYPE_F32 : dt == 1 ? FA_DTYPE_F16 : FA_DTYPE_BF16;
        for (int64_t rows = 1; rows <= MAX_ROWS; rows += rows < 17 ? 1 : 8)
            for (int64_t cols = 1; cols <= MAX_COLS; cols += 5) {
                const int64_t ld = cols + 2, ld_bias = cols % 4 == 1 ? 0 : rows + 3 * (rows % 2);
                const float scale = rows % 3 ? 0.7f : 1.0f;
                const int with_max = cols % 10 != 6;
                for (int64_t e = 0; e < rows * ld; ++e)
                    x_ref[e] = x_isa[e] = x_orig[e] = e % ld >= cols ? 1234.5f : e % 7 == 3 ? -INFINITY : uniform(-8, 8);
                for (int64_t e = 0; e < MAX_COLS * LD_BIAS_MAX; ++e) {
                    bias32[e] = e % 11 == 4 ? INFINITY : e % 13 == 2 ? NAN : uniform(-3, 3);
                    bias16[e] = (uint16_t)(uniform(0, 65536));
                }
                const void *bias = dtype == FA_DTYPE_F32 ? (const void *)bias32 : (const void *)bias16;
                for (int64_t c = 0; c < cols; ++c) max_isa[c] = -INFINITY;
                max_isa[cols] = 99.0f;
                ref->bias_cols(x_ref, ld, rows, cols, scale, bias, dtype, ld_bias, NULL);
                isa->bias_cols(x_isa, ld, rows, cols, scale, bias, dtype, ld_bias, with_max ? max_isa : NULL);
                for (int64_t e = 0; e < rows * ld; ++e)
                    if (fa_f32_bits(x_isa[e]) != fa_f32_bits(x_ref[e]) && !(isnan(x_isa[e]) && isnan(x_ref[e])))
                        fail_msg("bias_cols %s %s %lld x %lld (ld_bias %lld) (%lld, %lld): %.9g vs %.9g", isa->isa,
                                 dtype_names[dt], (long long)rows, (long long)cols, (long long)ld_bias,
                                 (long long)(e / ld), (long long)(e % ld), x_isa[e], x_ref[e]);
                if (!with_max) continue;
                isa->col_max(x_isa, ld, rows, cols, max_want);
                for (int64_t c = 0; c < cols; ++c)
                    if (fa_f32_bits(max_isa[c]) != fa_f32_bits(max_want[c]))
                        fail_msg("bias_cols %s %s %lld x %lld col_max[%lld]: %.9g vs %.9g", isa->isa, dtype_names[dt],
                                 (long long)rows, (long long)cols, (long long)c, max_isa[c], max_want[c]);
                assert_true(max_isa[cols] == 99.0f);
                /* the keys in two calls, the max carried by col_max: the same bits */
                const int64_t split = rows / 2, elem = dtype == FA_DTYPE_F32 ? 4 : 2;
                for (int64_t e = 0; e < rows * ld; ++e) x_split[e] = x_orig[e];
                for (int64_t c = 0; c < cols; ++c) max_split[c] = -INFINITY;
                isa->bias_cols(x_split, ld, split, cols, scale, bias, dtype, ld_bias, max_split);
                isa->bias_cols(x_split + split * ld, ld, rows - split, cols, scale, (const char *)bias + split * elem,
                               dtype, ld_bias, max_split);
                if (memcmp(x_split, x_isa, (size_t)(rows * ld) * sizeof(float)) != 0 ||
                    memcmp(max_split, max_isa, (size_t)cols * sizeof(float)) != 0)
                    fail_msg("bias_cols %s %s %lld x %lld: two calls (keys split at %lld) differ from one", isa->isa,
                             dtype_names[dt], (long long)rows, (long long)cols, (long long)split);
            }
    }
}

/* transpose bit for bit against the reference: shapes around the register block (7..17 rows,
 * 1..40 columns), leading dimensions with gaps, ld_src 0 (a broadcast row), NaN payloads and
 * infinities moved untouched, and nothing written outside the extents (sentinels). */
static void test_transpose(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    enum { MAX_ROWS = 17, MAX_COLS = 40, LD_DST = MAX_ROWS + 3 };
    float src[MAX_ROWS * (MAX_COLS + 5)], got[MAX_COLS * LD_DST], want[MAX_COLS * LD_DST];
    for (int64_t e = 0; e < MAX_ROWS * (MAX_COLS + 5); ++e)
        src[e] = e % 17 == 5 ? fa_bits_f32(0x7fc00000u + (uint32_t)e) : e % 19 == 3 ? -INFINITY : uniform(-9, 9);
    for (int64_t rows = 1; rows <= MAX_ROWS; ++rows)
        for (int64_t cols = 1; cols <= MAX_COLS; cols += 3)
            for (int broadcast = 0; broadcast < 2; ++broadcast) {
                const int64_t ld_src = broadcast ? 0 : cols + 5 * (rows % 2);
                for (int64_t e = 0; e < MAX_COLS * LD_DST; ++e) got[e] = want[e] = fa_bits_f32(0x7f8abcdeu);
                ref->transpose(src, ld_src, rows, cols, want, LD_DST);
                isa->transpose(src, ld_src, rows, cols, got, LD_DST);
                for (int64_t e = 0; e < MAX_COLS * LD_DST; ++e)
                    if (fa_f32_bits(got[e]) != fa_f32_bits(want[e]))
                        fail_msg("transpose %s %lld x %lld (ld_src %lld): dst[%lld] = %08x, want %08x", isa->isa,
                                 (long long)rows, (long long)cols, (long long)ld_src, (long long)e,
                                 fa_f32_bits(got[e]), fa_f32_bits(want[e]));
            }
}

/* A widening kernel on all 65536 inputs, bit for bit (NaN: any NaN). */
static void check_widening(const char *isa, const char *name, void (*widen)(const uint16_t *, float *, int64_t),
                           float (*want_of)(uint16_t))
{
    enum { ALL = 65536 };
    uint16_t *h = malloc(ALL * sizeof *h);
    float *f = malloc((ALL + 1) * sizeof *f);
    assert_non_null(h); assert_non_null(f);
    for (int x = 0; x < ALL; ++x) h[x] = (uint16_t)x;
    f[ALL - 3] = 7.0f;
    widen(h, f, ALL - 3); /* odd length: the scalar tail runs too */
    assert_true(f[ALL - 3] == 7.0f);
    for (int x = 0; x < ALL - 3; ++x) {
        const float want = want_of(h[x]);
        if (isnan(want) ? !isnan(f[x]) : fa_f32_bits(f[x]) != fa_f32_bits(want))
            fail_msg("%s %s: 0x%04x -> %g, want %g", name, isa, x, f[x], want);
    }
    free(h); free(f);
}

static void test_f16_to_f32(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state);
    check_widening(isa->isa, "f16_to_f32", isa->f16_to_f32, fa_f16_to_f32);
}

static void test_bf16_to_f32(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state);
    check_widening(isa->isa, "bf16_to_f32", isa->bf16_to_f32, fa_bf16_to_f32);
}

/* f32 -> binary16 bit for bit against fa_f32_to_f16: every sign, exponent and top 10 mantissa
 * bits (bits 13..31) with the low 13 bits that decide the rounding at their edges (exact, just
 * below / at / above a half, odd and even results) and one random pattern: 3.7M values, covering
 * overflow to inf, subnormal results, flushes to zero and NaN payloads. */
static void test_f32_to_f16(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state);
    static const uint32_t low[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0};
    enum { LOWS = sizeof low / sizeof low[0], HIGHS = 1 << 19, CHUNK = 4093 }; /* odd: scalar tails run */
    float *f = malloc(CHUNK * sizeof *f);
    uint16_t *h = malloc((CHUNK + 1) * sizeof *h);
    assert_non_null(f); assert_non_null(h);
    int64_t filled = 0;
    for (uint32_t x = 0; x < (uint32_t)HIGHS * LOWS; ++x) {
        const uint32_t pattern = x % LOWS == LOWS - 1 ? (uint32_t)(uniform(0, 1) * 8191.0f) : low[x % LOWS];
        f[filled++] = fa_bits_f32((x / LOWS) << 13 | pattern);
        if (filled < CHUNK && x + 1 < (uint32_t)HIGHS * LOWS) continue;
        h[filled] = 0x5a5a;
        isa->f32_to_f16(f, h, filled);
        assert_true(h[filled] == 0x5a5a);
        for (int64_t i = 0; i < filled; ++i)
            if (h[i] != fa_f32_to_f16(f[i]))
                fail_msg("f32_to_f16 %s: 0x%08x -> 0x%04x, want 0x%04x", isa->isa, fa_f32_bits(f[i]), h[i], fa_f32_to_f16(f[i]));
        filled = 0;
    }
    free(f); free(h);
}

/* The FMA-peak probe's chains: the FLOPs they report (2 per lane, one FMA per chain and
 * iteration: a whole number of the ISA's register tile accumulators) and a finite result that
 * depends on the work (the chains converge to 1 from their start values). */
static void test_fma_chains(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state);
    const double lanes = (double)isa->nr / 2.0, chains = 2.0 * (double)isa->mr;
    float zero_sink = -1.0f, sink = -1.0f;
    assert_true(isa->fma_chains(0, &zero_sink) == 0.0);
    const double flops = isa->fma_chains(1000, &sink);
    if (flops != 2.0 * lanes * chains * 1000.0)
        fail_msg("fma_chains %s: %g FLOPs reported for 1000 iterations, want %g", isa->isa, flops, 2.0 * lanes * chains * 1000.0);
    assert_true(isfinite(sink) && sink != zero_sink);
    /* fa-bench's second probe, the ISA's gemm on an L1-resident product: it runs and reports a rate
     * (its value is the machine's; only the benchmarks read it) */
    const double l1_rate = fa_cpu_l1_gemm_rate(isa, 1);
    if (!(isfinite(l1_rate) && l1_rate > 0.0)) fail_msg("fa_cpu_l1_gemm_rate %s: %g GFLOP/s", isa->isa, l1_rate);
}

/* ---- whole problems: forced ISA against forced ref ---------------------------------------------- */
typedef struct e2e_case {
    const char *name;
    int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
    fa_dtype dtype;
    int causal, window_left, padded, block_mask;
    float dropout_p;
    float softcap; /* 0 = off: the ISA's tanh (softcap_cols) in the forward and the backward */
} e2e_case;

static const e2e_case e2e_cases[] = {
    {"dense f32", 1, 2, 2, 37, 53, 40, FA_DTYPE_F32, 0, -1, 0, 0, 0.0f, 0.0f},
    {"causal gqa f32", 2, 4, 2, 70, 45, 64, FA_DTYPE_F32, 1, -1, 0, 0, 0.0f, 0.0f},
    {"window padding f16", 2, 2, 1, 33, 81, 24, FA_DTYPE_F16, 1, 9, 1, 0, 0.0f, 0.0f},
    {"dropout block mask bf16", 1, 3, 3, 65, 65, 72, FA_DTYPE_BF16, 0, -1, 0, 1, 0.2f, 0.0f},
    {"long causal f32", 1, 1, 1, 300, 1100, 128, FA_DTYPE_F32, 1, -1, 1, 0, 0.0f, 0.0f},
    {"softcap causal f32", 1, 2, 1, 77, 90, 64, FA_DTYPE_F32, 1, -1, 0, 0, 0.0f, 0.4f},
    /* query tiles of 128 rows at d = 32, where the forward raises Br (cpu_forward.c's forward_rows) */
    {"window f32 d32", 1, 4, 4, 260, 300, 32, FA_DTYPE_F32, 0, 50, 0, 0, 0.0f, 0.0f},
};

typedef struct e2e_outputs { float *out, *lse, *dq, *dk, *dv; } e2e_outputs;

static void *tensor_fill(int64_t count, fa_dtype dtype, float amplitude)
{
    if (dtype == FA_DTYPE_F32) {
        float *x = malloc((size_t)count * 4);
        for (int64_t i = 0; x && i < count; ++i) x[i] = uniform(-amplitude, amplitude);
        return x;
    }
    uint16_t *x = malloc((size_t)count * 2);
    for (int64_t i = 0; x && i < count; ++i) {
        const float v = uniform(-amplitude, amplitude);
        x[i] = dtype == FA_DTYPE_F16 ? fa_f32_to_f16(v) : fa_f32_to_bf16(v);
    }
    return x;
}

static float element(const void *data, fa_dtype dtype, int64_t i)
{
    if (dtype == FA_DTYPE_F32) return ((const float *)data)[i];
    const uint16_t h = ((const uint16_t *)data)[i];
    return dtype == FA_DTYPE_F16 ? fa_f16_to_f32(h) : fa_bf16_to_f32(h);
}

/* Runs forward and backward of case c with FLASHATTN_CPU_ISA=isa on the given inputs. */
static void run_case(const e2e_case *c, const char *isa, void *const inputs[4], e2e_outputs *res)
{
    setenv("FLASHATTN_CPU_ISA", isa, 1);
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    unsetenv("FLASHATTN_CPU_ISA");
    const int64_t nq = c->batch * c->seqlen_q * c->heads_q * c->head_dim, nk = c->batch * c->seqlen_k * c->heads_kv * c->head_dim;
    const size_t es = c->dtype == FA_DTYPE_F32 ? 4 : 2;
    void *out = calloc((size_t)nq, es), *dq = calloc((size_t)nq, es), *dk = calloc((size_t)nk, es), *dv = calloc((size_t)nk, es);
    res->lse = calloc((size_t)(c->batch * c->heads_q * c->seqlen_q), 4);
    int32_t seqlens[2] = {(int32_t)c->seqlen_k, (int32_t)(c->seqlen_k * 2 / 3)};
    uint8_t mask[64 * 64];
    fa_block_mask bm = {16, 16, (c->seqlen_q + 15) / 16, (c->seqlen_k + 15) / 16, mask};
    if (c->block_mask) assert_int_equal(fa_block_mask_butterfly(bm.rows, bm.cols, mask), FA_SUCCESS);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = c->causal;
    desc.softcap = c->softcap;
    desc.window_left = c->window_left;
    desc.seqlens_k = c->padded ? seqlens : NULL;
    desc.dropout_p = c->dropout_p;
    desc.dropout_seed = 42;
    desc.dropout_offset = 7;
    desc.block_mask = c->block_mask ? &bm : NULL;
    const fa_tensor tq = {inputs[0], c->dtype, c->batch, c->seqlen_q, c->heads_q, c->head_dim, 0, 0, 0};
    const fa_tensor tk = {inputs[1], c->dtype, c->batch, c->seqlen_k, c->heads_kv, c->head_dim, 0, 0, 0};
    fa_tensor tv = tk, to = tq, tdo = tq, tdq = tq, tdk = tk, tdv = tk;
    tv.data = inputs[2]; to.data = out; tdo.data = inputs[3]; tdq.data = dq; tdk.data = dk; tdv.data = dv;
    assert_int_equal(fa_forward(ctx, &desc, &tq, &tk, &tv, &to, res->lse), FA_SUCCESS);
    assert_int_equal(fa_backward(ctx, &desc, &tq, &tk, &tv, &to, &tdo, res->lse, &tdq, &tdk, &tdv), FA_SUCCESS);
    fa_context_destroy(ctx);
    void *raw[4] = {out, dq, dk, dv};
    float **dst[4] = {&res->out, &res->dq, &res->dk, &res->dv};
    for (int t = 0; t < 4; ++t) {
        const int64_t count = t >= 2 ? nk : nq;
        *dst[t] = malloc((size_t)count * 4);
        for (int64_t i = 0; i < count; ++i) (*dst[t])[i] = element(raw[t], c->dtype, i);
        free(raw[t]);
    }
}

static void compare(const char *what, const e2e_case *c, const float *got, const float *want, int64_t count, float tol)
{
    for (int64_t i = 0; i < count; ++i) {
        if (isinf(want[i]) && got[i] == want[i]) continue;
        if (!(fabsf(got[i] - want[i]) <= tol * (1.0f + fabsf(want[i]))))
            fail_msg("%s: %s[%lld] = %.9g, ref kernels %.9g", c->name, what, (long long)i, got[i], want[i]);
    }
}

static void test_whole_problems(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state);
    for (size_t ci = 0; ci < sizeof e2e_cases / sizeof e2e_cases[0]; ++ci) {
        const e2e_case *c = &e2e_cases[ci];
        const int64_t nq = c->batch * c->seqlen_q * c->heads_q * c->head_dim, nk = c->batch * c->seqlen_k * c->heads_kv * c->head_dim;
        void *inputs[4] = {tensor_fill(nq, c->dtype, 2.0f), tensor_fill(nk, c->dtype, 2.0f), tensor_fill(nk, c->dtype, 1.0f),
                           tensor_fill(nq, c->dtype, 1.0f)};
        e2e_outputs a, b;
        run_case(c, "ref", inputs, &a);
        run_case(c, isa->isa, inputs, &b);
        /* f16/bf16 outputs are rounded: a one-ulp flip of the output format is allowed */
        const float tol = c->dtype == FA_DTYPE_F32 ? 2e-5f : c->dtype == FA_DTYPE_F16 ? 2e-3f : 1.6e-2f;
        compare("out", c, b.out, a.out, nq, tol);
        compare("lse", c, b.lse, a.lse, c->batch * c->heads_q * c->seqlen_q, 2e-5f);
        compare("dq", c, b.dq, a.dq, nq, tol);
        compare("dk", c, b.dk, a.dk, nk, tol);
        compare("dv", c, b.dv, a.dv, nk, tol);
        for (int t = 0; t < 4; ++t) free(inputs[t]);
        e2e_outputs *both[2] = {&a, &b};
        for (int r = 0; r < 2; ++r) {
            free(both[r]->out); free(both[r]->lse); free(both[r]->dq); free(both[r]->dk); free(both[r]->dv);
        }
    }
}

/* The override itself: ref always works, an unknown name fails at context creation. */
static void test_override(void **state)
{
    (void)state;
    fa_context *ctx = NULL;
    setenv("FLASHATTN_CPU_ISA", "ref", 1);
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_non_null(strstr(fa_context_info(ctx), "isa ref"));
    fa_context_destroy(ctx);
    ctx = NULL;
    setenv("FLASHATTN_CPU_ISA", "sse9", 1);
    assert_int_not_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_null(ctx);
    assert_non_null(strstr(fa_last_error(), "FLASHATTN_CPU_ISA"));
    unsetenv("FLASHATTN_CPU_ISA");
}

static const struct { const char *name; CMUnitTestFunction run; } kernel_tests[] = {
    {"gemm", test_gemm},
    {"gemm_nt", test_gemm_nt},
    {"gemm_max", test_gemm_max},
    {"gemm_scores", test_gemm_scores},
    {"gemm_max_bf16", test_gemm_max_bf16},
    {"gemm_ds", test_gemm_ds},
    {"decode_scores", test_decode_scores},
    {"decode_values", test_decode_values},
    {"col_max", test_col_max},
    {"exp_cols", test_exp_cols},
    {"softcap_cols", test_softcap_cols},
    {"alibi_cols", test_alibi_cols},
    {"bias_cols", test_bias_cols},
    {"transpose", test_transpose},
    {"f16_to_f32", test_f16_to_f32},
    {"bf16_to_f32", test_bf16_to_f32},
    {"f32_to_f16", test_f32_to_f16},
    {"fma_chains", test_fma_chains},
    {"whole_problems", test_whole_problems},
};
enum { KERNEL_TESTS = sizeof kernel_tests / sizeof kernel_tests[0] };

static int usage(void)
{
    fprintf(stderr, "usage: test_checkasm [--function=PATTERN] [--isa=NAME] [--seed=N] [--bench]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *function = "*", *only_isa = NULL;
    int bench = 0;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        char *end;
        if (!strncmp(a, "--function=", 11)) function = a + 11;
        else if (!strncmp(a, "--isa=", 6)) only_isa = a + 6;
        else if (!strcmp(a, "--bench")) bench = 1;
        else if (!strncmp(a, "--seed=", 7) && (rng_state = (uint32_t)strtoul(a + 7, &end, 10), *end == 0 && end > a + 7)) continue;
        else return usage();
    }
    print_message("checkasm: seed %u (--seed=%u reproduces this run)\n", (unsigned)rng_state, (unsigned)rng_state);
    /* Each ISA but the reference (the ground truth), every kernel matching --function. */
    static struct CMUnitTest tests[FA_CPU_ISA_COUNT * KERNEL_TESTS + 1];
    static char names[FA_CPU_ISA_COUNT * KERNEL_TESTS][48];
    size_t count = 0;
    for (int i = 0; i < FA_CPU_ISA_COUNT; ++i) {
        const char *isa = fa_cpu_isa_name(i);
        if (!strcmp(isa, "ref") || (only_isa && strcmp(isa, only_isa))) continue;
        for (int t = 0; t < KERNEL_TESTS; ++t) {
            if (fnmatch(function, kernel_tests[t].name, 0) != 0) continue;
            snprintf(names[count], sizeof names[count], "%s_%s", kernel_tests[t].name, isa);
            tests[count] = (struct CMUnitTest){names[count], kernel_tests[t].run, NULL, NULL, (void *)isa};
            ++count;
        }
    }
    if (fnmatch(function, "override", 0) == 0) tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_override);
    if (count == 0) {
        fprintf(stderr, "checkasm: no test matches --function=%s%s%s\n", function, only_isa ? " --isa=" : "", only_isa ? only_isa : "");
        return 1;
    }
    const int failed = _cmocka_run_group_tests("checkasm", tests, count, NULL, NULL);
    if (failed || !bench) return failed;
    return checkasm_bench(function, only_isa);
}

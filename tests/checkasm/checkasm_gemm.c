/* checkasm: the forward's products (gemm, gemm_nt, and gemm_max, gemm_scores, gemm_max_bf16
 * with their fused epilogues) against the reference kernels. */
#include "checkasm.h"

/* gemm on odd sizes, both A orientations, padded leading dimensions, all epilogues; elements of
 * C outside the m x n extent must keep their sentinel. */
void test_gemm(void **state)
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
void test_gemm_max(void **state)
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
void test_gemm_max_bf16(void **state)
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
void test_gemm_scores(void **state)
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


/* gemm_nt (C = A B^T) on odd sizes and padded leading dimensions, tails of k below and above
 * the vector width; elements of C outside the m x n extent must keep their sentinel. */
void test_gemm_nt(void **state)
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

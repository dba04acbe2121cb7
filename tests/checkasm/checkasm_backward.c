/* checkasm: the backward's fused product (gemm_ds) against the same ISA's gemm plus the
 * backward's loop and against the reference. */
#include "checkasm.h"

/* gemm_ds (the backward's dS^T = P^T o (V dO^T - D) in one product) on odd sizes, both A
 * orientations and padded leading dimensions: C bit for bit as the same ISA's gemm followed by the
 * loop P o (C - delta) the backward runs otherwise (with dropout or a softcap), nothing written
 * outside C's extent, and within the product's error of the reference. */
void test_gemm_ds(void **state)
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

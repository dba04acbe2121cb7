/* Portable reference microkernels: plain loops, the ground truth for the ISA kernels. */
#include <math.h>

#include "../kernels.h"

static void ref_gemm_nt(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            float acc = 0.0f;
            for (int64_t p = 0; p < k; ++p) acc += a[i * lda + p] * b[j * ldb + p];
            c[i * ldc + j] = acc;
        }
}

static void ref_gemm_nn(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < k; ++p) {
            const float aip = a[i * lda + p];
            if (aip == 0.0f) continue; /* masked or dropped probabilities */
            for (int64_t j = 0; j < n; ++j) c[i * ldc + j] += aip * b[p * ldb + j];
        }
}

static void ref_gemm_tn(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float *c, int64_t ldc)
{
    for (int64_t p = 0; p < k; ++p)
        for (int64_t i = 0; i < m; ++i) {
            const float api = a[p * lda + i];
            if (api == 0.0f) continue;
            for (int64_t j = 0; j < n; ++j) c[i * ldc + j] += api * b[p * ldb + j];
        }
}

static float ref_exp_sub(float *x, int64_t n, float shift)
{
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = expf(x[i] - shift);
        sum += x[i];
    }
    return sum;
}

const fa_cpu_kernels fa_cpu_kernels_ref = {"ref", ref_gemm_nt, ref_gemm_nn, ref_gemm_tn, ref_exp_sub, 1, 1};

/* The CPU microkernel contract (BLIS style). Every ISA provides the same table; the portable
 * reference in ref/ is always built and is the ground truth the ISA kernels are checked against.
 *
 * All matrices are row-major f32 with explicit leading dimensions (in elements) and do not alias.
 * Sizes may be any positive value (no padding is assumed); kernels must not read or write outside
 * the m x n (x k) extents given.
 *   gemm_nt:   C[m x n]  = A[m x k] * B[n x k]^T       (S = Q K^T, dP = dO V^T)
 *   gemm_nn:   C[m x n] += A[m x k] * B[k x n]         (O += P V, dQ += dS K)
 *   gemm_tn:   C[m x n] += A[k x m]^T * B[k x n]       (dV += P^T dO, dK += dS^T Q)
 *   exp_sub:   x[i] = exp(x[i] - shift) for i < n, returns the sum of the results; exp(-inf) = 0.
 *              Accuracy: within 2 ulp of expf for arguments in [-104, 0].
 */
#ifndef FA_CPU_KERNELS_H
#define FA_CPU_KERNELS_H
#include <stdint.h>

typedef struct fa_cpu_kernels {
    const char *isa; /* "ref", "avx2", ... */
    void (*gemm_nt)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                    float *c, int64_t ldc);
    void (*gemm_nn)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                    float *c, int64_t ldc);
    void (*gemm_tn)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                    float *c, int64_t ldc);
    float (*exp_sub)(float *x, int64_t n, float shift);
    /* Register tile of the gemm kernels: tiles are snapped to multiples of these. */
    int64_t row_step, col_step;
} fa_cpu_kernels;

extern const fa_cpu_kernels fa_cpu_kernels_ref;

/* The kernels for this CPU: FLASHATTN_CPU_ISA (ref|avx2|avx512|neon) if set and supported,
 * otherwise the newest ISA the CPU supports. Returns NULL if the forced ISA is unknown or
 * unsupported here (reason recorded). */
const fa_cpu_kernels *fa_cpu_select_kernels(void);
#endif

/* Standard attention (the paper's Algorithm 0 forward, Algorithm 3 backward) as a careful user
 * writes it on a CPU: OpenMP over heads, single-threaded OpenBLAS sgemm per head, a vectorised
 * softmax (the library's own exponential kernel), and the N x N matrices S/P (and dP) materialised
 * per thread. f32 tensors of batch 1, heads_q == heads_kv, [N, heads, d] or [heads, N, d] (ld and
 * head_stride). Only built with OpenBLAS. */
#ifndef FA_BENCH_STD_ATTENTION_H
#define FA_BENCH_STD_ATTENTION_H
#include <stdint.h>

typedef struct std_problem {
    int64_t n, heads, d;
    int64_t ld, head_stride; /* floats between a head's rows, and between heads' first rows */
    int causal, threads;
    const float *q, *k, *v, *dout;
    float *out, *dq, *dk, *dv;
} std_problem;

/* Each returns 0, or -1 when the N x N buffers cannot be allocated. */
int std_forward(const std_problem *p);
int std_backward(const std_problem *p);          /* recomputes P from Q, K, then Algorithm 3 */
int std_forward_backward(const std_problem *p);  /* Algorithm 0 keeping P, then Algorithm 3 */
/* OpenBLAS's name for the kernels it runs ("SkylakeX", "Haswell", "Zen", "Prescott", ...). */
const char *openblas_core_name(void);
/* NULL, or the OPENBLAS_CORETYPE to run under when OpenBLAS took kernels older than AVX on a CPU
 * whose flashattn kernels are isa ("avx512": SkylakeX, "avx2": Haswell) because it does not know
 * the CPU; NULL too when OPENBLAS_CORETYPE is set already (the user's choice stands). */
const char *std_blas_core_for(const char *isa);
/* Single-threaded or threaded OpenBLAS sgemm rate (GFLOP/s) of n x n x n, best of reps. */
double std_sgemm_rate(int64_t n, int threads, int reps);
#endif

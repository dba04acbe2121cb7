/* The score modifiers of include/flashattn.h on the GPU (softcap, ALiBi, sinks, additive bias),
 * element by element, in the CPU backend's and the oracle's order: s = tau * q.k, then the
 * softcap, then ALiBi, then the bias; only visible elements get here (masked stay masked). Every
 * kernel family forms its scores through fa_score_log2, so the rule has one home. */
#ifndef FA_GPU_SCORE_MODIFIERS_CUH
#define FA_GPU_SCORE_MODIFIERS_CUH
#include <math.h>

#include "tensor_access.cuh"

#define FA_LN2 0.69314718055994530942f
#define FA_LOG2E 1.44269504088896340736f

/* Element (b, h, i, j) of a bias or dbias: the core's rule (fa_bias_offset, problem_modifiers.h). */
__device__ __forceinline__ int64_t fa_bias_index(const fa_bias &bias, int64_t b, int64_t h, int64_t i, int64_t j)
{
    return fa_bias_offset(&bias, b, h, i, j);
}

/* The base-2 logit of the visible element (b, h, i, j) of a (sequence) problem from its dot
 * product qk: (modified tau * q.k) * log2(e). *dscore (may be NULL) receives d score / d (tau q.k),
 * the softcap's 1 - tanh^2 (1 without a softcap). Without softcap, ALiBi and bias this is the
 * plain qk * tau log2(e) of the unmodified kernels, bit for bit. */
__device__ __forceinline__ float fa_score_log2_on(const fa_gpu_params &p, int64_t b, int64_t h, int64_t i, int64_t j,
                                                  int64_t diag_offset, float qk, float *dscore);

__device__ __forceinline__ float fa_score_log2(const fa_gpu_params &p, int64_t b, int64_t h, int64_t i, int64_t j,
                                               float qk, float *dscore)
{
    return fa_score_log2_on(p, b, h, i, j, p.mask.diag_offset, qk, dscore);
}

/* fa_score_log2 with the diagonal of row i given (the KV-cache path: each sequence's own,
 * cache length + new keys - seqlen_q). */
__device__ __forceinline__ float fa_score_log2_on(const fa_gpu_params &p, int64_t b, int64_t h, int64_t i, int64_t j,
                                                  int64_t diag_offset, float qk, float *dscore)
{
    if (dscore) *dscore = 1.0f;
    if (!p.modified) return qk * p.scale_log2;
    float s = qk * p.shape.scale;
    if (p.modifiers.softcap > 0.0f) {
        const float t = tanhf(s * p.inv_softcap);
        s = p.modifiers.softcap * t;
        if (dscore) *dscore = 1.0f - t * t;
    }
    if (p.modifiers.alibi_slopes)
        s -= p.modifiers.alibi_slopes[b * p.modifiers.alibi_stride_batch + h] * fabsf(static_cast<float>(fa_diagonal_key(i, diag_offset) - j));
    if (p.modifiers.bias.data) s += fa_load_elem(p.modifiers.bias.data, fa_bias_index(p.modifiers.bias, b, h, i, j), p.modifiers.bias.dtype);
    return s * FA_LOG2E;
}

/* The sink logit of query head h in base 2, -inf without sinks: each row's online softmax starts
 * from it (running max m = sink, sum l = 1), so it takes part in the max and the lse. */
__device__ __forceinline__ float fa_sink_log2(const fa_gpu_params &p, int64_t h)
{
    return p.modifiers.sinks ? p.modifiers.sinks[h] * FA_LOG2E : -INFINITY;
}
#endif

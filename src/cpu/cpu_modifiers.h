/* Score modifiers on the CPU (softcap, ALiBi, sinks, additive bias): applied to a transposed score
 * tile after the scale and the masks, read tile by tile like K and V (no N x N buffer), and the
 * gradients of the learnable ones (sinks, bias). */
#ifndef FA_CPU_MODIFIERS_H
#define FA_CPU_MODIFIERS_H
#include <math.h>
#include <stdint.h>

#include "cpu_tile.h"

/* The sink logit of query head h, -inf when there is none. */
static inline float fa_cpu_sink(const fa_problem *p, int64_t h) { return p->modifiers.sinks ? p->modifiers.sinks[h] : -INFINITY; }

/* On the tile st (key c, query r at st[c * ld + r]) of rows and keys [j0, j0 + cols) of (b, h),
 * raw q.k, masked (masked = -inf, left alone whatever the scale): the scale, softcap, then ALiBi,
 * then the bias, the scale applied by the first of them. col_max (NULL = not wanted)
 * [rows->count] receives each query's max over the keys, fused into the last modifier's pass.
 * cap_grad (NULL = not wanted; softcap only) receives d score / d (scaled q.k) = 1 - tanh^2, from
 * the kernels' softcap_cols (the same tanh as the scores). */
void fa_cpu_modify_scores(const fa_problem *p, const fa_cpu_kernels *kern, int64_t b, int64_t h,
                          const fa_cpu_rows *rows, int64_t j0, int64_t cols, float scale, float *st, int64_t ld,
                          float *cap_grad, float *col_max);

/* 1 when fa_cpu_gemm_modified can give a fully visible tile its scores: softcap and ALiBi, no
 * bias (the bias's tile is read in its own pass, add_bias: transposing it slice by slice beside
 * the product, for gemm_scores to add in the registers, made its read twice as slow). */
static inline int fa_cpu_scores_fusable(const fa_problem *p) { return !p->modifiers.bias.data; }

/* The fully visible tile of rows x keys [j0, j0 + cols) of (b, h), softcapped and/or with ALiBi:
 * st = the scores of K_j (rows of ldk) against Q^T (ldq), modified in the product's registers by
 * gemm_scores (kernels.h), exactly fa_cpu_modify_scores' bits on raw q.k, and col_max
 * [rows->count] their per-query max: one pass over S^T fewer. */
void fa_cpu_gemm_modified(const fa_problem *p, const fa_cpu_kernels *kern, int64_t b, int64_t h,
                          const fa_cpu_rows *rows, int64_t j0, int64_t cols, const float *k, int64_t ldk,
                          const float *qt, int64_t ldq, float *st, int64_t ld, float *col_max);

/* dsinks[h] = -sum over (b, i) of exp(sink_h - lse) * D_i (D = rowsum(dO o O)), summed in a fixed
 * order in double, for the whole (dense or packed) problem. */
fa_status fa_cpu_sink_gradients(const fa_problem *p);

/* Element (b, h, i, j) of a bias: its address, and stores of f32 rows into a dbias. */
static inline void *fa_cpu_bias_row(const fa_bias *bias, int64_t b, int64_t h, int64_t i)
{
    return (char *)bias->data + fa_bias_offset(bias, b, h, i, 0) * (int64_t)fa_dtype_size(bias->dtype);
}
void fa_cpu_store_bias_row(const fa_bias *bias, int64_t b, int64_t h, int64_t i, int64_t j0, const float *src,
                           int64_t n);
/* Zeros dbias over [batches, heads_q, rows, keys] (its broadcast axes count once). */
void fa_cpu_zero_bias(const fa_bias *bias, int64_t batches, int64_t heads, int64_t rows, int64_t keys);
#endif

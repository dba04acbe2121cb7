/* What every attention kernel receives: one plain struct, passed by value, built on the host from
 * a validated fa_problem. C-compatible so that the host-side plan can be tested on the CPU. */
#ifndef FA_GPU_PARAMS_H
#define FA_GPU_PARAMS_H
#include <stdint.h>

#include "flashattn.h"

/* A device tensor [batch, seqlen, heads, head_dim] with element strides (head_dim stride 1). */
typedef struct fa_gpu_tensor {
    void *data;
    int64_t stride_batch, stride_seq, stride_head;
} fa_gpu_tensor;

typedef struct fa_gpu_params {
    fa_gpu_tensor q, k, v, out, dout, dq, dk, dv;
    fa_dtype dtype;
    int chunked_loads; /* tile-MMA forward: Q, K, V rows are whole, aligned 16-byte chunks */
    int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
    float scale;      /* softmax scale tau */
    float scale_log2; /* tau * log2(e): scores go straight into exp2 */
    int causal;
    int32_t window_left, window_right;
    const int32_t *seqlens_k; /* device copy, [batch], or NULL */
    const uint8_t *block_mask; /* device copy, rows x cols, or NULL */
    int32_t mask_block_q, mask_block_k;
    int64_t mask_cols;
    float dropout_p;
    float keep_scale; /* 1 / (1 - p) */
    uint64_t dropout_seed, dropout_offset;
    float *lse;   /* [batch, heads_q, seqlen_q], natural log */
    float *delta; /* backward: rowsum(dO o O), same shape as lse (context workspace) */
} fa_gpu_params;
#endif

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

/* A failed check of what lives in device memory (varlen offsets, KV-cache lengths and pages, ALiBi
 * slopes and sinks), written by the check kernels; every kernel then writes nothing until the
 * plugin reports it at the next synchronize (which clears it). */
typedef enum fa_gpu_status_code {
    FA_GPU_STATUS_OK,
    FA_GPU_STATUS_VARLEN_FIRST,      /* cu_seqlens_*[0] != 0: value */
    FA_GPU_STATUS_VARLEN_DECREASING, /* cu_seqlens_*[sequence + 1] < cu_seqlens_*[sequence] */
    FA_GPU_STATUS_VARLEN_TOO_LONG,   /* a sequence longer than max_seqlen_*: value rows, limit */
    FA_GPU_STATUS_VARLEN_TOTAL,      /* cu_seqlens_*[batch] != the tensors' rows: value, limit */
    FA_GPU_STATUS_KV_NEGATIVE,       /* cache_seqlens[sequence] < 0: value */
    FA_GPU_STATUS_KV_CAPACITY,       /* cached + new (value) above the capacity (limit) */
    FA_GPU_STATUS_KV_PAGE,           /* block_table[sequence][index] = value outside [0, limit) */
    FA_GPU_STATUS_ALIBI_SLOPE,       /* alibi_slopes[index] not finite: value = the float's bits */
    FA_GPU_STATUS_SINK               /* sinks[index] NaN or +inf: value = the float's bits */
} fa_gpu_status_code;

typedef struct fa_gpu_status {
    int32_t code;   /* fa_gpu_status_code; the first failure is kept */
    int32_t array;  /* varlen: 0 cu_seqlens_q, 1 cu_seqlens_k */
    int64_t sequence, index, value, limit;
} fa_gpu_status;

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
    float *lse;   /* natural log; row i of (b, h) at b * lse_stride_batch + h * lse_stride_head + i */
    float *delta; /* backward: rowsum(dO o O), same layout as lse (context workspace) */
    int64_t lse_stride_batch, lse_stride_head;
    /* Dropout element of (b, h, i, j): fa_dropout_element(b, heads_q, h, dropout_rows, dropout_row0 + i,
     * dropout_cols, dropout_col0 + j) (src/common/philox.h). Dense: seqlen_q x seqlen_k from 0; a
     * block of a larger problem (desc->q_offset...): the global grid from its global row and key. */
    int64_t dropout_rows, dropout_cols;
    int64_t dropout_row0, dropout_col0;
    /* Query row i's causal/window/ALiBi diagonal is local key fa_diagonal_key(i, diag_offset)
     * (src/common/visibility.h): seqlen_k - seqlen_q, or a block's global diagonal. */
    int64_t diag_offset;
    /* The padded layout the dbias pass covers: seqlen_q x seqlen_k, max_seqlen_q x max_seqlen_k of
     * a packed batch. */
    int64_t grid_rows, grid_cols;
    /* Packed varlen batch: [varlen_batch + 1] offsets in device memory, or NULL. batch is then 1,
     * seqlen_q and seqlen_k the total rows; kernels see one sequence per blockIdx.z through
     * fa_sequence_params. */
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    int64_t varlen_batch;
    /* fa_forward_kvcache: k, v are the cache (seqlen_k its capacity per sequence), the tables
     * device memory; the key chunks' partial (O, m, l) go to `partial`. */
    fa_gpu_tensor k_new, v_new;
    int64_t seqlen_new;
    const int32_t *cache_seqlens, *block_table;
    int64_t max_pages, page_size, num_pages;
    int64_t kv_chunks;
    float *partial;
    fa_gpu_status *status; /* device; NULL for calls without device tables */
    /* Score modifiers (fa_problem's, arrays in device memory; score_modifiers.cuh applies them).
     * modified: softcap, ALiBi or a bias is on, so scores are formed explicitly (sinks alone need
     * not). Alibi slope of (b, h): alibi_slopes[b * alibi_stride_batch + h]. */
    int modified;
    float softcap, inv_softcap;
    const float *alibi_slopes;
    int64_t alibi_stride_batch;
    const float *sinks;
    fa_bias bias, dbias; /* data NULL when absent; dbias and dsinks: backward outputs */
    float *dsinks;
} fa_gpu_params;
#endif

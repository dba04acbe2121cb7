/* What every attention kernel receives: one plain struct, passed by value, built on the host from
 * a validated fa_problem. C-compatible so that the host-side plan can be tested on the CPU. */
#ifndef FA_GPU_PARAMS_H
#define FA_GPU_PARAMS_H
#include <stdint.h>

#include "flashattn.h"
#include "../../common/problem.h"
#include "../../common/table_checks.h"

/* A device tensor [batch, seqlen, heads, head_dim] with element strides (head_dim stride 1). */
typedef struct fa_gpu_tensor {
    void *data;
    int64_t stride_batch, stride_seq, stride_head;
} fa_gpu_tensor;

/* p.status: the first failed check of what lives in device memory (varlen offsets, KV-cache
 * lengths and pages, ALiBi slopes and sinks; the rule is the core's, table_checks.h), written by
 * the check kernels; every kernel then writes nothing until the plugin reports it at the next
 * synchronize (which clears it). */

/* The sections of the core's problem (src/common/problem.h) as they are, tables pointing at device
 * memory; then what only the kernels need, derived on the host once per call. */
typedef struct fa_gpu_params {
    fa_gpu_tensor q, k, v, out, dout, dq, dk, dv;
    fa_shape_section shape;
    fa_mask_section mask;        /* seqlens_k and block_mask.mask: the plugin's device copies */
    fa_dropout_section dropout;
    fa_modifier_section modifiers;
    fa_varlen varlen;            /* packed batch: one sequence per blockIdx.z (fa_sequence_params) */
    fa_output_section outputs;
    fa_cache_section cache;      /* fa_forward_kvcache: k, v are the cache */
    fa_gpu_tensor k_new, v_new;
    int chunked_loads; /* tile-MMA forward: Q, K, V rows are whole, aligned 16-byte chunks */
    float scale_log2;  /* fa_shape_scale_log2: scores go straight into exp2 */
    float keep_scale;  /* fa_dropout_keep_scale */
    int modified;      /* fa_modifiers_form_scores */
    float inv_softcap; /* fa_modifiers_inv_softcap */
    float *delta;      /* backward: rowsum(dO o O), same layout as lse (context workspace) */
    /* tc-wide backward: dq_splits f32 slices of dQ, dq_slice floats apart, rows in the lse layout
     * times the padded width (context workspace) */
    float *dq_accum;
    int64_t dq_slice;
    int dq_splits, dq_width;
    /* The padded layout the dbias pass covers: seqlen_q x seqlen_k, max_seqlen_q x max_seqlen_k of
     * a packed batch. */
    int64_t grid_rows, grid_cols;
    int64_t kv_chunks;   /* fa_forward_kvcache: the most key chunks of a sequence (the partials' layout) */
    int64_t cache_slots; /* fa_forward_kvcache: rows of a contiguous cache (cache_batch_idx's range) */
    /* fa_forward_kvcache: the element types of the cache tensors (quantised or q's) and of the new
     * tokens, and the cache tensors' positions per slot or page (the int8 scales' layout). */
    fa_dtype k_dtype, v_dtype, k_new_dtype, v_new_dtype;
    int64_t cache_positions;
    float *partial;
    fa_table_fault *status; /* device; NULL for calls without device tables */
} fa_gpu_params;
#endif

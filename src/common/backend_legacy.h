/* The problems of plugin ABIs 4 and 5, frozen: a plugin built for them reads these flat layouts.
 * The registry converts each new problem into them (fa_problem_to_v5), and reads such a plugin's
 * feature bits as its answer to supports(). Never edit these structs: they are a published ABI. */
#ifndef FA_BACKEND_LEGACY_H
#define FA_BACKEND_LEGACY_H
#include "problem.h"

typedef struct fa_problem_v5 {
    int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
    fa_dtype dtype;
    float scale;
    int causal;
    int32_t window_left, window_right;
    const int32_t *seqlens_k;
    float dropout_p;
    uint64_t dropout_seed, dropout_offset;
    const fa_block_mask *block_mask;
    fa_tensor q, k, v, out;
    fa_tensor dout, dq, dk, dv;
    float *lse;
    int64_t lse_stride_batch, lse_stride_head;
    int64_t dropout_batch0, dropout_rows, dropout_cols;
    fa_varlen varlen;
    float softcap;
    const float *alibi_slopes;
    int64_t alibi_stride_batch;
    const float *sinks;
    fa_bias bias, dbias;
    float *dsinks;
    int64_t diag_offset;
    int64_t dropout_row0, dropout_col0;
} fa_problem_v5;

typedef struct fa_kv_problem_v5 {
    fa_problem_v5 attn;
    fa_tensor k_new, v_new;
    int64_t seqlen_new;
    const int32_t *block_table;
    int64_t max_pages_per_seq, page_size, num_pages;
    const int32_t *cache_seqlens;
} fa_kv_problem_v5;

/* The feature bits of ABIs 4 and 5 (fa_backend_iface.features): FA_BACKEND_HOST_MEMORY and these,
 * whose values are the FA_NEED_* bits they grant. */
#define FA_BACKEND_V5_VARLEN FA_NEED_VARLEN
#define FA_BACKEND_V5_SCORE_MODIFIERS FA_NEED_SCORE_MODIFIERS
#define FA_BACKEND_V5_POSITION_OFFSETS FA_NEED_POSITIONS
#define FA_BACKEND_V5_KVCACHE_MODIFIERS FA_NEED_KVCACHE_MODIFIERS

/* v = p in the flat layout; p->mask.block_mask is pointed to, so v lives no longer than p. */
static inline void fa_problem_to_v5(const fa_problem *p, fa_problem_v5 *v)
{
    *v = (fa_problem_v5){0};
    v->batch = p->shape.batch;
    v->heads_q = p->shape.heads_q;
    v->heads_kv = p->shape.heads_kv;
    v->seqlen_q = p->shape.seqlen_q;
    v->seqlen_k = p->shape.seqlen_k;
    v->head_dim = p->shape.head_dim;
    v->dtype = p->shape.dtype;
    v->scale = p->shape.scale;
    v->causal = p->mask.causal;
    v->window_left = p->mask.window_left;
    v->window_right = p->mask.window_right;
    v->seqlens_k = p->mask.seqlens_k;
    v->dropout_p = p->dropout.p;
    v->dropout_seed = p->dropout.seed;
    v->dropout_offset = p->dropout.offset;
    v->block_mask = p->mask.block_mask.mask ? &p->mask.block_mask : NULL;
    v->q = p->q, v->k = p->k, v->v = p->v, v->out = p->out;
    v->dout = p->dout, v->dq = p->dq, v->dk = p->dk, v->dv = p->dv;
    v->lse = p->outputs.lse;
    v->lse_stride_batch = p->outputs.lse_stride_batch;
    v->lse_stride_head = p->outputs.lse_stride_head;
    v->dropout_batch0 = p->dropout.batch0;
    v->dropout_rows = p->dropout.rows;
    v->dropout_cols = p->dropout.cols;
    v->varlen = p->varlen;
    v->softcap = p->modifiers.softcap;
    v->alibi_slopes = p->modifiers.alibi_slopes;
    v->alibi_stride_batch = p->modifiers.alibi_stride_batch;
    v->sinks = p->modifiers.sinks;
    v->bias = p->modifiers.bias;
    v->dbias = p->outputs.dbias;
    v->dsinks = p->outputs.dsinks;
    v->diag_offset = p->mask.diag_offset;
    v->dropout_row0 = p->dropout.row0;
    v->dropout_col0 = p->dropout.col0;
}

static inline void fa_kv_problem_to_v5(const fa_kv_problem *p, fa_kv_problem_v5 *v)
{
    fa_problem_to_v5(&p->attn, &v->attn);
    v->k_new = p->k_new;
    v->v_new = p->v_new;
    v->seqlen_new = p->cache.seqlen_new;
    v->block_table = p->cache.block_table;
    v->max_pages_per_seq = p->cache.max_pages_per_seq;
    v->page_size = p->cache.page_size;
    v->num_pages = p->cache.num_pages;
    v->cache_seqlens = p->cache.cache_seqlens;
}

/* The backend table of ABIs 4 and 5: forward, backward and forward_kvcache take the flat problems;
 * ABI 4 ends before merge_partials. */
typedef struct fa_backend_iface_v5 {
    uint32_t abi_version;
    fa_backend kind;
    const char *name;
    int (*device_count)(void);
    fa_status (*open)(int device, void **state);
    void (*close)(void *state);
    fa_status (*set_num_threads)(void *state, int n);
    fa_status (*set_stream)(void *state, void *stream);
    fa_status (*synchronize)(void *state);
    fa_status (*mem_alloc)(void *state, size_t bytes, void **ptr);
    fa_status (*mem_free)(void *state, void *ptr);
    fa_status (*copy_h2d)(void *state, void *dst, const void *src, size_t bytes);
    fa_status (*copy_d2h)(void *state, void *dst, const void *src, size_t bytes);
    fa_status (*tiling)(void *state, int64_t head_dim, fa_dtype dtype, fa_tiling *tiling, int64_t *sram_elements);
    const char *(*info)(void *state);
    fa_status (*forward)(void *state, const fa_problem_v5 *p);
    fa_status (*backward)(void *state, const fa_problem_v5 *p);
    unsigned features;
    fa_status (*forward_kvcache)(void *state, const fa_kv_problem_v5 *p);
    fa_status (*merge_partials)(void *state, const fa_merge_problem *p);
} fa_backend_iface_v5;
#endif

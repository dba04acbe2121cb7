/* The one mapping from the core's validated problems (fa_problem, fa_kv_problem of
 * src/common/backend.h) to the kernels' parameters (fa_gpu_params of kernels/params.h): every
 * field the kernels read from a problem is copied here and nowhere else. What belongs to the
 * plugin's state (the workspace: delta, uploaded masks, KV-cache partials; the device status) is
 * the plugin's to fill in afterwards. Header-only C. */
#ifndef FA_GPU_PROBLEM_PARAMS_H
#define FA_GPU_PROBLEM_PARAMS_H
#include <string.h>

#include "../common/backend.h"
#include "kernels/params.h"

static inline fa_gpu_tensor fa_gpu_tensor_of(const fa_tensor *t)
{
    fa_gpu_tensor g;
    g.data = t->data;
    g.stride_batch = t->stride_batch;
    g.stride_seq = t->stride_seq;
    g.stride_head = t->stride_head;
    return g;
}

/* k = the kernel parameters of p (everything else zero). */
static inline void fa_gpu_params_of(const fa_problem *p, fa_gpu_params *k)
{
    memset(k, 0, sizeof *k);
    k->q = fa_gpu_tensor_of(&p->q);
    k->k = fa_gpu_tensor_of(&p->k);
    k->v = fa_gpu_tensor_of(&p->v);
    k->out = fa_gpu_tensor_of(&p->out);
    k->dout = fa_gpu_tensor_of(&p->dout);
    k->dq = fa_gpu_tensor_of(&p->dq);
    k->dk = fa_gpu_tensor_of(&p->dk);
    k->dv = fa_gpu_tensor_of(&p->dv);
    k->dtype = p->dtype;
    k->batch = p->batch;
    k->heads_q = p->heads_q;
    k->heads_kv = p->heads_kv;
    k->seqlen_q = p->seqlen_q;
    k->seqlen_k = p->seqlen_k;
    k->head_dim = p->head_dim;
    k->scale = p->scale;
    k->scale_log2 = p->scale * 1.44269504088896340736f;
    k->causal = p->causal;
    k->window_left = p->window_left;
    k->window_right = p->window_right;
    k->dropout_p = p->dropout_p;
    k->keep_scale = 1.0f / (1.0f - p->dropout_p);
    k->dropout_seed = p->dropout_seed;
    k->dropout_offset = p->dropout_offset;
    k->lse = p->lse;
    k->lse_stride_batch = p->lse_stride_batch;
    k->lse_stride_head = p->lse_stride_head;
    k->dropout_rows = p->dropout_rows;
    k->dropout_cols = p->dropout_cols;
    k->dropout_row0 = p->dropout_row0;
    k->dropout_col0 = p->dropout_col0;
    k->diag_offset = p->diag_offset;
    k->grid_rows = p->varlen.batch ? p->varlen.max_seqlen_q : p->seqlen_q;
    k->grid_cols = p->varlen.batch ? p->varlen.max_seqlen_k : p->seqlen_k;
    if (p->varlen.batch) {
        k->cu_seqlens_q = p->varlen.cu_seqlens_q;
        k->cu_seqlens_k = p->varlen.cu_seqlens_k;
        k->varlen_batch = p->varlen.batch;
    }
    k->modified = p->softcap > 0.0f || p->alibi_slopes || p->bias.data;
    k->softcap = p->softcap;
    k->inv_softcap = p->softcap > 0.0f ? 1.0f / p->softcap : 0.0f;
    k->alibi_slopes = p->alibi_slopes;
    k->alibi_stride_batch = p->alibi_stride_batch;
    k->sinks = p->sinks;
    k->bias = p->bias;
    k->dbias = p->dbias;
    k->dsinks = p->dsinks;
}

/* The KV-cache fields of kp over k = fa_gpu_params_of(&kp->attn). */
static inline void fa_gpu_kv_params_of(const fa_kv_problem *kp, fa_gpu_params *k)
{
    k->cache_seqlens = kp->cache_seqlens;
    k->block_table = kp->block_table;
    k->max_pages = kp->max_pages_per_seq;
    k->page_size = kp->page_size;
    k->num_pages = kp->num_pages;
    k->seqlen_new = kp->seqlen_new;
    if (kp->seqlen_new) {
        k->k_new = fa_gpu_tensor_of(&kp->k_new);
        k->v_new = fa_gpu_tensor_of(&kp->v_new);
    }
}
#endif

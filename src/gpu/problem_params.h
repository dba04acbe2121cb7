/* The one mapping from the core's validated problems (fa_problem, fa_kv_problem of
 * src/common/problem.h) to the kernels' parameters (fa_gpu_params of kernels/params.h): the
 * sections are copied whole, and what the kernels derive from them is computed here. What belongs to the
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

/* k = the kernel parameters of p: its sections as they are, the tensors, and what the kernels
 * derive from them (everything else zero). */
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
    k->shape = p->shape;
    k->mask = p->mask;
    k->dropout = p->dropout;
    k->modifiers = p->modifiers;
    k->varlen = p->varlen;
    k->outputs = p->outputs;
    k->scale_log2 = fa_shape_scale_log2(&p->shape);
    k->keep_scale = fa_dropout_keep_scale(&p->dropout);
    k->modified = fa_modifiers_form_scores(&p->modifiers);
    k->inv_softcap = fa_modifiers_inv_softcap(&p->modifiers);
    k->grid_rows = p->varlen.batch ? p->varlen.max_seqlen_q : p->shape.seqlen_q;
    k->grid_cols = p->varlen.batch ? p->varlen.max_seqlen_k : p->shape.seqlen_k;
}

/* The KV-cache fields of kp over k = fa_gpu_params_of(&kp->attn). */
static inline void fa_gpu_kv_params_of(const fa_kv_problem *kp, fa_gpu_params *k)
{
    k->cache = kp->cache;
    k->cache_slots = kp->attn.k.batch;
    k->k_dtype = kp->attn.k.dtype;
    k->v_dtype = kp->attn.v.dtype;
    k->k_new_dtype = kp->k_new.dtype;
    k->v_new_dtype = kp->v_new.dtype;
    k->cache_positions = kp->attn.k.seqlen;
    if (kp->cache.seqlen_new) {
        k->k_new = fa_gpu_tensor_of(&kp->k_new);
        k->v_new = fa_gpu_tensor_of(&kp->v_new);
    }
}
#endif

/* fa_forward_kvcache with score modifiers (softcap, ALiBi, sinks, bias) on the CPU.
 * Each sequence's keys (its cached rows through the block table, then k_new/v_new) are gathered
 * into one contiguous block and attended by the dense forward (fa_cpu_forward_dense), which already has
 * every modifier: the sequence's slopes, its bias rows (key j = cache position j) and the sinks,
 * with causal and window bottom-right on its own lengths. That is the definition the decode path
 * must match ("fa_forward on the gathered keys"), taken literally.
 * Outputs are staged and the cache is appended only once every sequence has succeeded, so a
 * failure (out of memory) writes nothing to the cache or the outputs.
 * Cost: the gather copies the keys and values once per call and the GQA group is not packed, so
 * this is slower per step than the decode path without modifiers (docs/INFERENCE.md says so). */
#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "cpu_backend.h"
#include "cpu_modifiers.h"
#include "cpu_tile.h"

/* Sequence b's keys (or values) [0, keys), heads_kv rows each, into dst ([keys, heads_kv, d]). */
static void gather_keys(const fa_kv_problem *kp, const fa_tensor *cache, const fa_tensor *fresh, int64_t b,
                        char *dst)
{
    const fa_problem *p = &kp->attn;
    const size_t row_bytes = (size_t)p->shape.head_dim * fa_dtype_size(p->shape.dtype);
    const int64_t cached = kp->cache.cache_seqlens[b];
    for (int64_t j = 0; j < cached + kp->cache.seqlen_new; ++j)
        for (int64_t h = 0; h < p->shape.heads_kv; ++h) {
            const void *src = j < cached ? fa_cpu_kvcache_row(kp, cache, b, j, h) : fa_row_ptr(fresh, b, j - cached, h);
            memcpy(dst + (size_t)(j * p->shape.heads_kv + h) * row_bytes, src, row_bytes);
        }
}

/* The dense problem of sequence b over its gathered keys, writing the staged out and lse. */
static fa_problem sequence_problem(const fa_kv_problem *kp, int64_t b, int64_t keys, void *k, void *v, void *out,
                                   float *lse)
{
    const fa_problem *p = &kp->attn;
    fa_problem s = *p;
    const int64_t d = p->shape.head_dim;
    s.shape.batch = 1;
    s.shape.seqlen_k = keys;
    s.mask.diag_offset = keys - p->shape.seqlen_q; /* bottom-right on this sequence's lengths */
    s.dropout.rows = p->shape.seqlen_q;
    s.dropout.cols = keys;
    s.q.data = fa_row_ptr(&p->q, b, 0, 0);
    s.k = (fa_tensor){k, p->shape.dtype, 1, keys, p->shape.heads_kv, d, keys * p->shape.heads_kv * d, p->shape.heads_kv * d, d};
    s.v = s.k;
    s.v.data = v;
    s.out = (fa_tensor){out, p->shape.dtype, 1, p->shape.seqlen_q, p->shape.heads_q, d, p->shape.seqlen_q * p->shape.heads_q * d, p->shape.heads_q * d, d};
    s.outputs.lse = lse;
    s.outputs.lse_stride_batch = p->shape.heads_q * p->shape.seqlen_q;
    s.outputs.lse_stride_head = p->shape.seqlen_q;
    if (p->modifiers.alibi_slopes) s.modifiers.alibi_slopes = p->modifiers.alibi_slopes + b * p->modifiers.alibi_stride_batch;
    if (p->modifiers.bias.data) s.modifiers.bias.data = fa_cpu_bias_row(&p->modifiers.bias, b, 0, 0);
    return s;
}

fa_status fa_cpu_decode_modified(void *state, const fa_kv_problem *kp)
{
    const fa_problem *p = &kp->attn;
    const size_t es = fa_dtype_size(p->shape.dtype);
    int64_t most_keys = 0;
    for (int64_t b = 0; b < p->shape.batch; ++b)
        if (kp->cache.cache_seqlens[b] + kp->cache.seqlen_new > most_keys) most_keys = kp->cache.cache_seqlens[b] + kp->cache.seqlen_new;
    const size_t kv_bytes = (size_t)(most_keys * p->shape.heads_kv * p->shape.head_dim) * es;
    const size_t out_elements = (size_t)(p->shape.seqlen_q * p->shape.heads_q * p->shape.head_dim);
    const size_t rows = (size_t)(p->shape.heads_q * p->shape.seqlen_q);
    char *k = fa_host_alloc(kv_bytes ? kv_bytes : 1), *v = fa_host_alloc(kv_bytes ? kv_bytes : 1);
    char *out = fa_host_alloc((size_t)p->shape.batch * out_elements * es);
    float *lse = fa_host_alloc((size_t)p->shape.batch * rows * sizeof(float));
    fa_status st = k && v && out && lse ? FA_SUCCESS
                                        : fa_set_error(FA_ERROR_OUT_OF_MEMORY, "fa_forward_kvcache: cannot allocate the "
                                                       "gathered keys of a sequence (%zu bytes, twice)", kv_bytes);
    for (int64_t b = 0; b < p->shape.batch && st == FA_SUCCESS; ++b) {
        const int64_t keys = kp->cache.cache_seqlens[b] + kp->cache.seqlen_new;
        char *out_b = out + (size_t)b * out_elements * es;
        float *lse_b = lse + (size_t)b * rows;
        if (keys == 0) { /* no key: zeros, lse -inf (or the sink alone) */
            memset(out_b, 0, out_elements * es);
            for (int64_t h = 0; h < p->shape.heads_q; ++h)
                for (int64_t i = 0; i < p->shape.seqlen_q; ++i) lse_b[h * p->shape.seqlen_q + i] = fa_cpu_sink(p, h);
            continue;
        }
        gather_keys(kp, &p->k, &kp->k_new, b, k);
        gather_keys(kp, &p->v, &kp->v_new, b, v);
        const fa_problem s = sequence_problem(kp, b, keys, k, v, out_b, lse_b);
        st = fa_cpu_forward_dense(state, &s);
    }
    if (st == FA_SUCCESS) { /* every sequence done: now the cache and the caller's outputs */
        fa_cpu_kvcache_append(kp);
        const size_t row_bytes = (size_t)p->shape.head_dim * es;
        for (int64_t b = 0; b < p->shape.batch; ++b)
            for (int64_t i = 0; i < p->shape.seqlen_q; ++i)
                for (int64_t h = 0; h < p->shape.heads_q; ++h)
                    memcpy(fa_row_ptr(&p->out, b, i, h),
                           out + ((size_t)((b * p->shape.seqlen_q + i) * p->shape.heads_q + h) * (size_t)p->shape.head_dim) * es, row_bytes);
        for (int64_t b = 0; p->outputs.lse && b < p->shape.batch; ++b)
            for (int64_t h = 0; h < p->shape.heads_q; ++h)
                for (int64_t i = 0; i < p->shape.seqlen_q; ++i)
                    p->outputs.lse[fa_lse_index(p, b, h, i)] = lse[(size_t)b * rows + (size_t)(h * p->shape.seqlen_q + i)];
    }
    fa_host_free(k);
    fa_host_free(v);
    fa_host_free(out);
    fa_host_free(lse);
    return st;
}

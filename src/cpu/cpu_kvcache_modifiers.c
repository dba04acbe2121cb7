/* fa_forward_kvcache with score modifiers (softcap, ALiBi, sinks, bias) on the CPU.
 * Each sequence's keys (its cached rows through the block table, then k_new/v_new) are gathered
 * into one contiguous block and attended by the dense forward (fa_cpu_forward), which already has
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
    const size_t row_bytes = (size_t)p->head_dim * fa_dtype_size(p->dtype);
    const int64_t cached = kp->cache_seqlens[b];
    for (int64_t j = 0; j < cached + kp->seqlen_new; ++j)
        for (int64_t h = 0; h < p->heads_kv; ++h) {
            const void *src = j < cached ? fa_cpu_kvcache_row(kp, cache, b, j, h) : fa_row_ptr(fresh, b, j - cached, h);
            memcpy(dst + (size_t)(j * p->heads_kv + h) * row_bytes, src, row_bytes);
        }
}

/* The dense problem of sequence b over its gathered keys, writing the staged out and lse. */
static fa_problem sequence_problem(const fa_kv_problem *kp, int64_t b, int64_t keys, void *k, void *v, void *out,
                                   float *lse)
{
    const fa_problem *p = &kp->attn;
    fa_problem s = *p;
    const int64_t d = p->head_dim;
    s.batch = 1;
    s.seqlen_k = keys;
    s.diag_offset = keys - p->seqlen_q; /* bottom-right on this sequence's lengths */
    s.dropout_rows = p->seqlen_q;
    s.dropout_cols = keys;
    s.q.data = fa_row_ptr(&p->q, b, 0, 0);
    s.k = (fa_tensor){k, p->dtype, 1, keys, p->heads_kv, d, keys * p->heads_kv * d, p->heads_kv * d, d};
    s.v = s.k;
    s.v.data = v;
    s.out = (fa_tensor){out, p->dtype, 1, p->seqlen_q, p->heads_q, d, p->seqlen_q * p->heads_q * d, p->heads_q * d, d};
    s.lse = lse;
    s.lse_stride_batch = p->heads_q * p->seqlen_q;
    s.lse_stride_head = p->seqlen_q;
    if (p->alibi_slopes) s.alibi_slopes = p->alibi_slopes + b * p->alibi_stride_batch;
    if (p->bias.data) s.bias.data = fa_cpu_bias_row(&p->bias, b, 0, 0);
    return s;
}

fa_status fa_cpu_forward_kvcache_modified(void *state, const fa_kv_problem *kp)
{
    const fa_problem *p = &kp->attn;
    const size_t es = fa_dtype_size(p->dtype);
    int64_t most_keys = 0;
    for (int64_t b = 0; b < p->batch; ++b)
        if (kp->cache_seqlens[b] + kp->seqlen_new > most_keys) most_keys = kp->cache_seqlens[b] + kp->seqlen_new;
    const size_t kv_bytes = (size_t)(most_keys * p->heads_kv * p->head_dim) * es;
    const size_t out_elements = (size_t)(p->seqlen_q * p->heads_q * p->head_dim);
    const size_t rows = (size_t)(p->heads_q * p->seqlen_q);
    char *k = fa_host_alloc(kv_bytes ? kv_bytes : 1), *v = fa_host_alloc(kv_bytes ? kv_bytes : 1);
    char *out = fa_host_alloc((size_t)p->batch * out_elements * es);
    float *lse = fa_host_alloc((size_t)p->batch * rows * sizeof(float));
    fa_status st = k && v && out && lse ? FA_SUCCESS
                                        : fa_set_error(FA_ERROR_OUT_OF_MEMORY, "fa_forward_kvcache: cannot allocate the "
                                                       "gathered keys of a sequence (%zu bytes, twice)", kv_bytes);
    for (int64_t b = 0; b < p->batch && st == FA_SUCCESS; ++b) {
        const int64_t keys = kp->cache_seqlens[b] + kp->seqlen_new;
        char *out_b = out + (size_t)b * out_elements * es;
        float *lse_b = lse + (size_t)b * rows;
        if (keys == 0) { /* no key: zeros, lse -inf (or the sink alone) */
            memset(out_b, 0, out_elements * es);
            for (int64_t h = 0; h < p->heads_q; ++h)
                for (int64_t i = 0; i < p->seqlen_q; ++i) lse_b[h * p->seqlen_q + i] = fa_cpu_sink(p, h);
            continue;
        }
        gather_keys(kp, &p->k, &kp->k_new, b, k);
        gather_keys(kp, &p->v, &kp->v_new, b, v);
        const fa_problem s = sequence_problem(kp, b, keys, k, v, out_b, lse_b);
        st = fa_cpu_forward(state, &s);
    }
    if (st == FA_SUCCESS) { /* every sequence done: now the cache and the caller's outputs */
        fa_cpu_kvcache_append(kp);
        const size_t row_bytes = (size_t)p->head_dim * es;
        for (int64_t b = 0; b < p->batch; ++b)
            for (int64_t i = 0; i < p->seqlen_q; ++i)
                for (int64_t h = 0; h < p->heads_q; ++h)
                    memcpy(fa_row_ptr(&p->out, b, i, h),
                           out + ((size_t)((b * p->seqlen_q + i) * p->heads_q + h) * (size_t)p->head_dim) * es, row_bytes);
        for (int64_t b = 0; p->lse && b < p->batch; ++b)
            for (int64_t h = 0; h < p->heads_q; ++h)
                for (int64_t i = 0; i < p->seqlen_q; ++i)
                    p->lse[fa_lse_index(p, b, h, i)] = lse[(size_t)b * rows + (size_t)(h * p->seqlen_q + i)];
    }
    fa_host_free(k);
    fa_host_free(v);
    fa_host_free(out);
    fa_host_free(lse);
    return st;
}

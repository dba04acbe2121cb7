/* fa_forward_kvcache with score modifiers (softcap, ALiBi, sinks, bias) on the CPU.
 * Each sequence's keys (its cached rows through the block table, then k_new/v_new) are gathered
 * into one contiguous block and attended by the dense forward (fa_cpu_forward_dense), which already has
 * every modifier: the sequence's slopes, its bias rows (key j = cache position j) and the sinks,
 * with causal and window bottom-right on its own lengths. That is the definition the decode path
 * must match ("fa_forward on the gathered keys"), taken literally.
 * A quantised or rotated cache is gathered as f32 values (codes dequantised; new tokens as the
 * append will store them: rotated, quantised, read back), with the queries (rotated) in f32 too, so
 * the dense forward sees exactly the values the decode path attends to.
 * Outputs are staged and the cache is appended only once every sequence has succeeded, so a
 * failure (out of memory) writes nothing to the cache or the outputs.
 * Cost: the gather copies the keys and values once per call and the GQA group is not packed, so
 * this is slower per step than the decode path without modifiers (docs/API.md, "KV-cache decode"). */
#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "cpu_backend.h"
#include "cpu_modifiers.h"
#include "cpu_tile.h"

/* Whether the gathered problem runs in f32 (a quantised or rotated cache), else in q's dtype. */
static int gathers_f32(const fa_kv_problem *kp)
{
    return fa_kv_problem_quantised(kp) || kp->cache.rotary_cos != NULL;
}

/* Sequence b's keys (or values) [0, keys), heads_kv rows each, into dst ([keys, heads_kv, d]):
 * key j is cache position leftpad + j, a cached row or a new token; copied as they are, or as f32
 * values (gathers_f32; keys: rotated; tmp: d * 4 bytes). */
static void gather_keys(const fa_kv_problem *kp, const fa_tensor *cache, const fa_tensor *fresh, int is_keys, int64_t b,
                        char *dst, void *tmp)
{
    const fa_problem *p = &kp->attn;
    const fa_cache_section *c = &kp->cache;
    const int64_t d = p->shape.head_dim;
    const int as_f32 = gathers_f32(kp);
    const size_t row_bytes = (size_t)d * (as_f32 ? sizeof(float) : fa_dtype_size(p->shape.dtype));
    const float *scales = is_keys ? c->k_scale : c->v_scale, *descales = is_keys ? c->k_descale : c->v_descale;
    const int64_t cached = c->cache_seqlens[b] - fa_cache_leftpad(c, b);
    for (int64_t j = 0; j < fa_cache_keys(c, b); ++j) {
        int64_t nb = 0, nt = 0;
        if (j >= cached) fa_cache_new_row(c, b, j - cached, &nb, &nt);
        for (int64_t h = 0; h < p->shape.heads_kv; ++h) {
            char *row = dst + (size_t)(j * p->shape.heads_kv + h) * row_bytes;
            if (!as_f32)
                memcpy(row, j < cached ? fa_cpu_kvcache_row(kp, cache, b, j, h) : fa_row_ptr(fresh, nb, nt, h), row_bytes);
            else if (j < cached)
                fa_cpu_kvcache_cached_values(kp, cache, scales, descales, b, j, h, (float *)row);
            else
                fa_cpu_kvcache_new_values(kp, cache, descales, fresh, is_keys && c->rotary_cos, b, j - cached, h,
                                          (float *)row, tmp);
        }
    }
}

/* Sequence b's queries as f32 [queries, heads_q, d], rotated when asked (gathers_f32). */
static void gather_queries(const fa_kv_problem *kp, int64_t b, float *dst)
{
    const fa_problem *p = &kp->attn;
    const int64_t d = p->shape.head_dim, queries = fa_sequence_queries(&p->varlen, p->shape.seqlen_q, b);
    for (int64_t i = 0; i < queries; ++i)
        for (int64_t h = 0; h < p->shape.heads_q; ++h) {
            int64_t qb, qi;
            fa_sequence_query_row(&p->varlen, b, i, &qb, &qi);
            float *row = dst + (i * p->shape.heads_q + h) * d;
            fa_cpu_load_rows(&p->q, qb, qi, h, 1, row, d);
            if (kp->cache.rotary_cos) fa_cpu_rotate_query(kp, b, i, row);
        }
}

/* Sequence b's queries: their count, and the first one's row in the staged outputs (the packed
 * rows of a ragged batch, else b's rows of [batch, seqlen_q]). */
static int64_t sequence_queries(const fa_problem *p, int64_t b) { return fa_sequence_queries(&p->varlen, p->shape.seqlen_q, b); }
static int64_t staged_row(const fa_problem *p, int64_t b) { return p->varlen.batch ? p->varlen.cu_seqlens_q[b] : b * p->shape.seqlen_q; }

/* The dense problem of sequence b over its gathered keys, writing the staged out and lse (q: the
 * gathered f32 queries, or NULL: q's own rows). */
static fa_problem sequence_problem(const fa_kv_problem *kp, int64_t b, int64_t keys, void *k, void *v, void *out,
                                   float *lse, float *q)
{
    const fa_problem *p = &kp->attn;
    fa_problem s = *p;
    const int64_t d = p->shape.head_dim, queries = sequence_queries(p, b);
    int64_t qb, qi;
    fa_sequence_query_row(&p->varlen, b, 0, &qb, &qi);
    s.varlen = (fa_varlen){0};
    s.shape.batch = 1;
    s.shape.seqlen_q = queries;
    s.shape.seqlen_k = keys;
    s.mask.diag_offset = keys - queries; /* bottom-right on this sequence's lengths */
    s.dropout.rows = queries;
    s.dropout.cols = keys;
    s.q.data = fa_row_ptr(&p->q, qb, qi, 0);
    s.q.seqlen = queries;
    const fa_dtype dtype = q ? FA_DTYPE_F32 : p->shape.dtype;
    if (q) {
        s.shape.dtype = FA_DTYPE_F32;
        s.q = (fa_tensor){q, FA_DTYPE_F32, 1, queries, p->shape.heads_q, d, queries * p->shape.heads_q * d, p->shape.heads_q * d, d};
    }
    s.k = (fa_tensor){k, dtype, 1, keys, p->shape.heads_kv, d, keys * p->shape.heads_kv * d, p->shape.heads_kv * d, d};
    s.v = s.k;
    s.v.data = v;
    s.out = (fa_tensor){out, dtype, 1, queries, p->shape.heads_q, d, queries * p->shape.heads_q * d, p->shape.heads_q * d, d};
    s.outputs.lse = lse;
    s.outputs.lse_stride_batch = p->shape.heads_q * queries;
    s.outputs.lse_stride_head = queries;
    if (p->modifiers.alibi_slopes) s.modifiers.alibi_slopes = p->modifiers.alibi_slopes + b * p->modifiers.alibi_stride_batch;
    if (p->modifiers.bias.data) s.modifiers.bias.data = fa_cpu_bias_row(&p->modifiers.bias, b, 0, 0);
    return s;
}

fa_status fa_cpu_decode_modified(void *state, const fa_kv_problem *kp)
{
    const fa_problem *p = &kp->attn;
    const fa_cpu_state *cpu = state;
    const int as_f32 = gathers_f32(kp);
    const size_t es = as_f32 ? sizeof(float) : fa_dtype_size(p->shape.dtype);
    const int64_t batch = fa_kv_sequences(p), heads = p->shape.heads_q, d = p->shape.head_dim;
    const int64_t total_rows = p->shape.batch * p->shape.seqlen_q; /* every query row, packed or padded */
    int64_t most_keys = 0;
    for (int64_t b = 0; b < batch; ++b)
        if (fa_cache_keys(&kp->cache, b) > most_keys) most_keys = fa_cache_keys(&kp->cache, b);
    const size_t kv_bytes = (size_t)(most_keys * p->shape.heads_kv * d) * es;
    /* Staged: out [total_rows, heads, d]; lse per sequence [heads, its queries] from heads x its first row. */
    char *k = fa_host_alloc(kv_bytes ? kv_bytes : 1), *v = fa_host_alloc(kv_bytes ? kv_bytes : 1);
    char *out = fa_host_alloc((size_t)(total_rows * heads * d) * es);
    float *lse = fa_host_alloc((size_t)(total_rows * heads) * sizeof(float));
    int64_t most_queries = 0;
    for (int64_t b = 0; b < batch; ++b)
        if (sequence_queries(p, b) > most_queries) most_queries = sequence_queries(p, b);
    float *q = as_f32 ? fa_host_alloc((size_t)(most_queries * heads * d + 1) * sizeof(float)) : NULL;
    float *tmp = as_f32 ? fa_host_alloc((size_t)d * sizeof(float)) : NULL;
    fa_status st = k && v && out && lse && (!as_f32 || (q && tmp)) ? FA_SUCCESS
                                        : fa_set_error(FA_ERROR_OUT_OF_MEMORY, "fa_forward_kvcache: cannot allocate the "
                                                       "gathered keys of a sequence (%zu bytes, twice)", kv_bytes);
    for (int64_t b = 0; b < batch && st == FA_SUCCESS; ++b) {
        const int64_t keys = fa_cache_keys(&kp->cache, b), queries = sequence_queries(p, b);
        char *out_b = out + (size_t)(staged_row(p, b) * heads * d) * es;
        float *lse_b = lse + (size_t)(staged_row(p, b) * heads);
        if (queries == 0) continue;
        if (keys == 0) { /* no key: zeros, lse -inf (or the sink alone) */
            memset(out_b, 0, (size_t)(queries * heads * d) * es);
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t i = 0; i < queries; ++i) lse_b[h * queries + i] = fa_cpu_sink(p, h);
            continue;
        }
        gather_keys(kp, &p->k, &kp->k_new, 1, b, k, tmp);
        gather_keys(kp, &p->v, &kp->v_new, 0, b, v, tmp);
        if (as_f32) gather_queries(kp, b, q);
        const fa_problem s = sequence_problem(kp, b, keys, k, v, out_b, lse_b, as_f32 ? q : NULL);
        st = fa_cpu_forward_dense(state, &s);
    }
    if (st == FA_SUCCESS) { /* every sequence done: now the cache and the caller's outputs */
        st = fa_cpu_kvcache_append(kp);
    }
    if (st == FA_SUCCESS) {
        const size_t row_bytes = (size_t)d * es;
        for (int64_t b = 0; b < batch; ++b)
            for (int64_t i = 0, queries = sequence_queries(p, b); i < queries; ++i) {
                int64_t qb, qi;
                fa_sequence_query_row(&p->varlen, b, i, &qb, &qi);
                for (int64_t h = 0; h < heads; ++h) {
                    const char *staged = out + (size_t)(((staged_row(p, b) + i) * heads + h) * d) * es;
                    if (as_f32) fa_cpu_store_rows(&p->out, cpu->kernels, qb, qi, h, 1, (const float *)staged, d);
                    else memcpy(fa_row_ptr(&p->out, qb, qi, h), staged, row_bytes);
                    if (p->outputs.lse)
                        p->outputs.lse[fa_lse_index(p, qb, h, qi)] = lse[staged_row(p, b) * heads + h * queries + i];
                }
            }
    }
    fa_host_free(k);
    fa_host_free(v);
    fa_host_free(out);
    fa_host_free(lse);
    fa_host_free(q);
    fa_host_free(tmp);
    return st;
}

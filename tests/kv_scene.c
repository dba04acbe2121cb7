#include "kv_scene.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_arrays.h"

static size_t row_elems(const kv_layout *l, int64_t heads) { return (size_t)(heads * l->head_dim); }

/* A host array of n elements of dtype: seeded values, or NaN where seed is 0. */
static void fill(void *dst, size_t at, size_t n, fa_dtype dtype, uint64_t seed)
{
    double *x = seed ? test_random_doubles(seed, n) : NULL;
    if (seed) assert_non_null(x);
    for (size_t e = 0; e < n; ++e) test_store_element(dst, at + e, dtype, seed ? x[e] : NAN);
    free(x);
}

static void *upload(fa_context *ctx, const void *host, size_t bytes)
{
    void *dev = NULL;
    assert_int_equal(fa_malloc(ctx, bytes ? bytes : 1, &dev), FA_SUCCESS);
    if (bytes) assert_int_equal(fa_memcpy_h2d(ctx, dev, host, bytes), FA_SUCCESS);
    return dev;
}

/* Element offset of cache position pos of sequence b. */
static size_t cache_at(const kv_scene *s, int b, int64_t pos)
{
    const int64_t slot = s->table ? s->table[b * s->max_pages + pos / s->slot_len] : b;
    return (size_t)((slot * s->slot_len + pos % s->slot_len) * s->layout.heads_kv * s->layout.head_dim);
}

void kv_scene_build(kv_scene *s, fa_context *ctx, const kv_layout *layout, const kv_seq *seqs, int n)
{
    memset(s, 0, sizeof *s);
    assert_true(n >= 1 && n <= KV_SCENE_MAX);
    s->ctx = ctx;
    s->layout = *layout;
    s->n = n;
    memcpy(s->seqs, seqs, (size_t)n * sizeof *seqs);
    const fa_dtype dt = layout->dtype;
    const size_t es = test_dtype_size(dt), qrow = row_elems(layout, layout->heads_q), kvrow = row_elems(layout, layout->heads_kv);
    for (int b = 0; b < n; ++b) {
        assert_true(seqs[b].cached + seqs[b].fresh <= layout->capacity);
        s->cu_q[b + 1] = s->cu_q[b] + seqs[b].queries;
        s->cu_new[b + 1] = s->cu_new[b] + seqs[b].fresh;
        s->cached[b] = seqs[b].cached;
    }
    s->total_q = s->cu_q[n];
    s->total_new = s->cu_new[n];
    if (layout->page_size) {
        s->slot_len = layout->page_size;
        s->max_pages = (layout->capacity + layout->page_size - 1) / layout->page_size;
        s->slots = n * s->max_pages + 1; /* one page nobody uses */
        s->table = test_page_table(n, s->max_pages, s->slots);
        assert_non_null(s->table);
    } else {
        s->slot_len = layout->capacity;
        s->slots = n;
    }
    s->cache_elems = (size_t)(s->slots * s->slot_len) * kvrow;
    char *q = malloc(((size_t)s->total_q * qrow + 1) * es), *kn = malloc(((size_t)s->total_new * kvrow + 1) * es);
    char *vn = malloc(((size_t)s->total_new * kvrow + 1) * es);
    char *kc = malloc(s->cache_elems * es), *vc = malloc(s->cache_elems * es);
    assert_true(q && kn && vn && kc && vc);
    fill(kc, 0, s->cache_elems, dt, 0);
    fill(vc, 0, s->cache_elems, dt, 0);
    for (int b = 0; b < n; ++b) {
        const uint64_t id = 16u * (uint64_t)seqs[b].id + 1;
        fill(q, (size_t)s->cu_q[b] * qrow, (size_t)seqs[b].queries * qrow, dt, id);
        fill(kn, (size_t)s->cu_new[b] * kvrow, (size_t)seqs[b].fresh * kvrow, dt, id + 1);
        fill(vn, (size_t)s->cu_new[b] * kvrow, (size_t)seqs[b].fresh * kvrow, dt, id + 2);
        for (int64_t pos = 0; pos < seqs[b].cached; ++pos) {
            fill(kc, cache_at(s, b, pos), kvrow, dt, id + 3 + 8 * (uint64_t)pos * KV_SCENE_MAX);
            fill(vc, cache_at(s, b, pos), kvrow, dt, id + 4 + 8 * (uint64_t)pos * KV_SCENE_MAX);
        }
    }
    s->q = upload(ctx, q, (size_t)s->total_q * qrow * es);
    s->k_new = upload(ctx, kn, (size_t)s->total_new * kvrow * es);
    s->v_new = upload(ctx, vn, (size_t)s->total_new * kvrow * es);
    s->k_cache = upload(ctx, kc, s->cache_elems * es);
    s->v_cache = upload(ctx, vc, s->cache_elems * es);
    fill(q, 0, (size_t)s->total_q * qrow, dt, 0); /* out starts as NaN: every row must be written */
    s->out = upload(ctx, q, (size_t)s->total_q * qrow * es);
    float *lse = test_nan_floats((size_t)(s->total_q * layout->heads_q) + 1);
    assert_non_null(lse);
    s->lse = upload(ctx, lse, (size_t)(s->total_q * layout->heads_q) * sizeof(float));
    s->cu_q_dev = upload(ctx, s->cu_q, (size_t)(n + 1) * sizeof(int32_t));
    s->cu_new_dev = upload(ctx, s->cu_new, (size_t)(n + 1) * sizeof(int32_t));
    s->cached_dev = upload(ctx, s->cached, (size_t)n * sizeof(int32_t));
    if (s->table) s->table_dev = upload(ctx, s->table, (size_t)(n * s->max_pages) * sizeof(int32_t));
    free(q), free(kn), free(vn), free(kc), free(vc), free(lse);
}

void kv_scene_free(kv_scene *s)
{
    void *dev[] = {s->q, s->k_new, s->v_new, s->k_cache, s->v_cache, s->out, s->lse,
                   s->cu_q_dev, s->cu_new_dev, s->cached_dev, s->table_dev};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; ++i)
        if (dev[i]) fa_free(s->ctx, dev[i]);
    free(s->table);
    free(s->seen_out), free(s->seen_k), free(s->seen_v), free(s->seen_lse);
    memset(s, 0, sizeof *s);
}

void kv_scene_forget(kv_scene *s)
{
    free(s->seen_out), free(s->seen_k), free(s->seen_v), free(s->seen_lse);
    s->seen_out = s->seen_k = s->seen_v = NULL;
    s->seen_lse = NULL;
}

fa_status kv_scene_run(kv_scene *s, const fa_attention_desc *base, int ragged, const fa_kv_slots *slots)
{
    kv_scene_forget(s);
    const kv_layout *l = &s->layout;
    const int64_t queries = ragged ? s->total_q : s->seqs[0].queries, fresh = ragged ? s->total_new : s->seqs[0].fresh;
    const int64_t batch = ragged ? 1 : s->n;
    fa_kv_cache cache;
    memset(&cache, 0, sizeof cache);
    cache.k = (fa_tensor){s->k_cache, l->dtype, s->slots, s->slot_len, l->heads_kv, l->head_dim, 0, 0, 0};
    cache.v = cache.k;
    cache.v.data = s->v_cache;
    cache.cache_seqlens = s->cached_dev;
    cache.block_table = s->table_dev;
    cache.max_pages_per_seq = s->max_pages;
    const fa_tensor q = {s->q, l->dtype, batch, queries, l->heads_q, l->head_dim, 0, 0, 0};
    fa_tensor out = q, k_new = {s->k_new, l->dtype, batch, fresh, l->heads_kv, l->head_dim, 0, 0, 0}, v_new = k_new;
    out.data = s->out;
    v_new.data = s->v_new;
    fa_attention_desc desc = *base;
    fa_varlen vl = {s->n, s->cu_q_dev, fresh ? s->cu_new_dev : NULL, 0, 0};
    for (int b = 0; b < s->n; ++b) {
        if (s->seqs[b].queries > vl.max_seqlen_q) vl.max_seqlen_q = s->seqs[b].queries;
        if (s->seqs[b].fresh > vl.max_seqlen_k) vl.max_seqlen_k = s->seqs[b].fresh;
    }
    if (ragged) desc.varlen = &vl;
    return fa_forward_kvcache_ex(s->ctx, &desc, &q, &cache, slots, fresh ? &k_new : NULL, fresh ? &v_new : NULL, &out,
                                 s->lse);
}

static void *fetch(fa_context *ctx, const void *dev, size_t bytes)
{
    void *host = malloc(bytes ? bytes : 1);
    assert_non_null(host);
    if (bytes) assert_int_equal(fa_memcpy_d2h(ctx, host, dev, bytes), FA_SUCCESS);
    return host;
}

void kv_scene_result(kv_scene *s, int b, int ragged, kv_seq_result *r)
{
    const kv_layout *l = &s->layout;
    const size_t es = test_dtype_size(l->dtype), qrow = row_elems(l, l->heads_q), kvrow = row_elems(l, l->heads_kv);
    const kv_seq *seq = &s->seqs[b];
    r->out_bytes = (size_t)seq->queries * qrow * es;
    if (!s->seen_out) { /* once per run */
        s->seen_out = fetch(s->ctx, s->out, (size_t)s->total_q * qrow * es);
        s->seen_lse = fetch(s->ctx, s->lse, (size_t)(s->total_q * l->heads_q) * sizeof(float));
        s->seen_k = fetch(s->ctx, s->k_cache, s->cache_elems * es);
        s->seen_v = fetch(s->ctx, s->v_cache, s->cache_elems * es);
    }
    const char *out = s->seen_out, *kc = s->seen_k, *vc = s->seen_v;
    const float *lse = s->seen_lse;
    r->out = malloc(r->out_bytes + 1);
    r->lse_count = (size_t)(seq->queries * l->heads_q);
    r->lse = malloc(r->lse_count * sizeof(float) + 1);
    const int64_t keys = seq->cached + seq->fresh;
    r->cache_bytes = (size_t)keys * kvrow * es;
    r->k = malloc(r->cache_bytes + 1);
    r->v = malloc(r->cache_bytes + 1);
    assert_true(r->out && r->lse && r->k && r->v);
    memcpy(r->out, out + (size_t)s->cu_q[b] * qrow * es, r->out_bytes); /* packed = padded with equal lengths */
    for (int64_t h = 0; h < l->heads_q; ++h)
        for (int64_t i = 0; i < seq->queries; ++i)
            r->lse[h * seq->queries + i] =
                ragged ? lse[h * s->total_q + s->cu_q[b] + i] : lse[(b * l->heads_q + h) * seq->queries + i];
    for (int64_t pos = 0; pos < keys; ++pos) {
        memcpy((char *)r->k + (size_t)pos * kvrow * es, kc + cache_at(s, b, pos) * es, kvrow * es);
        memcpy((char *)r->v + (size_t)pos * kvrow * es, vc + cache_at(s, b, pos) * es, kvrow * es);
    }
}

void kv_seq_result_free(kv_seq_result *r)
{
    free(r->out), free(r->lse), free(r->k), free(r->v);
    memset(r, 0, sizeof *r);
}

void kv_expect_same(const kv_seq_result *a, const kv_seq_result *b, const char *what)
{
    if (a->out_bytes != b->out_bytes || memcmp(a->out, b->out, a->out_bytes) != 0)
        fail_msg("%s: out differs bit for bit", what);
    if (a->lse_count != b->lse_count || memcmp(a->lse, b->lse, a->lse_count * sizeof(float)) != 0)
        fail_msg("%s: lse differs bit for bit", what);
    if (a->cache_bytes != b->cache_bytes || memcmp(a->k, b->k, a->cache_bytes) != 0 || memcmp(a->v, b->v, a->cache_bytes) != 0)
        fail_msg("%s: the cache after the call differs", what);
}

/* fa_forward_kvcache on the CPU: contiguous and paged caches (page sizes 1, 3, 16, 256), with and
 * without appending k_new/v_new, seqlen_q 1..16, GQA up to 8:1, causal and window, f32/f16/bf16,
 * heads inside or outside the rows. Each result
 * must equal fa_forward on the keys gathered from the expected cache, sequence by sequence,
 * within f32 (f16) tolerance, and be bit-identical across 1, 2 and 3 threads. Cache slots past
 * each sequence's keys hold NaN, so reading one shows up. The cache after the call must equal the
 * test's own append byte for byte. Bad inputs: status, message, nothing written anywhere. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flashattn.h"
#include "harness.h"
#include "test_arrays.h"

#define MAX_BATCH 4
#define QUICK_MAX_CACHE (1 << 20) /* elements: larger caches are skipped under FA_TEST_QUICK=1 (valgrind) */

typedef struct kv_case {
    const char *name;
    int64_t batch, heads_q, heads_kv, head_dim, seqlen_q, seqlen_new;
    int64_t page_size; /* 0: contiguous */
    int64_t capacity;  /* contiguous: tokens per sequence; paged: max_pages_per_seq * page_size */
    int32_t cached[MAX_BATCH];
    int causal;
    int32_t window_left, window_right;
    fa_dtype dtype;
    int heads_outer; /* bit 0 for K, bit 1 for V: layout [slots, heads_kv, slot_len, d] instead of
                        [slots, slot_len, heads_kv, d] */
    int nan_in;      /* 1: K, 2: V: key nan_key of sequence 0 (cached or new) has a NaN in head 0, column 3 */
    int32_t nan_key;
    int modifiers;   /* 1: softcap, per-sequence ALiBi slopes, sinks and a [batch, heads_q, seqlen_q,
                        capacity] bias (key j = cache position j) */
} kv_case;

static const kv_case cases[] = {
    {"contiguous_decode_gqa8", 2, 8, 1, 64, 1, 1, 0, 700, {0, 600}, 1, -1, -1, FA_DTYPE_F32, 0, 0, 0, 0},
    {"contiguous_q16_window", 3, 4, 2, 32, 16, 0, 0, 300, {1, 17, 300}, 1, 20, -1, FA_DTYPE_F32, 0, 0, 0, 0},
    {"paged_1", 2, 8, 1, 16, 4, 4, 1, 40, {5, 30}, 1, -1, -1, FA_DTYPE_F32, 0, 0, 0, 0},
    {"paged_3_noncausal", 3, 4, 4, 40, 2, 2, 3, 120, {0, 7, 100}, 0, -1, -1, FA_DTYPE_F32, 0, 0, 0, 0},
    {"paged_16_long", 2, 16, 2, 128, 1, 1, 16, 2048, {1000, 2047}, 1, -1, -1, FA_DTYPE_F32, 0, 0, 0, 0},
    {"paged_256_window", 2, 8, 1, 64, 8, 0, 256, 5120, {300, 5000}, 1, 100, 0, FA_DTYPE_F32, 0, 0, 0, 0},
    {"contiguous_f16_32_8", 1, 32, 8, 128, 1, 1, 0, 4096, {4000}, 1, -1, -1, FA_DTYPE_F16, 0, 0, 0, 0},
    {"odd_head_dim_f16", 1, 8, 2, 33, 2, 1, 0, 300, {290}, 1, -1, -1, FA_DTYPE_F16, 0, 0, 0, 0}, /* vector tails, scratch alignment */
    {"more_queries_than_keys", 2, 2, 1, 16, 16, 0, 0, 8, {3, 0}, 1, -1, -1, FA_DTYPE_F32, 0, 0, 0, 0},
    {"contiguous_bf16_heads_outer", 2, 8, 2, 64, 3, 2, 0, 600, {599 - 2, 33}, 1, -1, -1, FA_DTYPE_BF16, 3, 0, 0, 0},
    {"paged_5_f16_heads_outer", 2, 6, 3, 32, 1, 1, 5, 400, {333, 8}, 0, 50, -1, FA_DTYPE_F16, 3, 0, 0, 0},
    {"contiguous_v_heads_outer", 2, 8, 2, 32, 2, 1, 0, 300, {280, 40}, 1, -1, -1, FA_DTYPE_F32, 2, 0, 0, 0},
    {"paged_7_k_heads_outer_f16", 2, 4, 2, 32, 1, 2, 7, 350, {300, 3}, 1, -1, -1, FA_DTYPE_F16, 1, 0, 0, 0},
    {"paged_16_bf16", 3, 4, 2, 48, 2, 1, 16, 512, {100, 0, 400}, 1, -1, -1, FA_DTYPE_BF16, 0, 0, 0, 0},
    /* NaN propagation as fa_forward's (docs/ROBUSTNESS.md): only the rows that see the key. */
    {"nan_v_new_causal_edge", 1, 4, 2, 32, 6, 6, 0, 300, {250}, 1, -1, -1, FA_DTYPE_F32, 0, 2, 253, 0},
    {"nan_k_cached_window", 2, 4, 1, 32, 8, 0, 16, 320, {200, 20}, 1, 40, -1, FA_DTYPE_F32, 0, 1, 155, 0},
    {"nan_k_decode_inside_tile", 1, 8, 2, 64, 1, 1, 0, 600, {500}, 1, -1, -1, FA_DTYPE_F32, 0, 1, 240, 0},
    {"nan_v_cached_window_f16", 1, 8, 2, 64, 4, 1, 0, 300, {290}, 1, 16, -1, FA_DTYPE_F16, 0, 2, 276, 0},
    /* Score modifiers: a sequence with one key, one with none (lse = the sink), paged and not. */
    {"modifiers_paged_3_gqa", 2, 8, 2, 32, 2, 1, 3, 120, {50, 0}, 1, -1, -1, FA_DTYPE_F32, 0, 0, 0, 1},
    {"modifiers_contiguous_empty_f16", 2, 4, 1, 64, 1, 0, 0, 200, {150, 0}, 1, -1, -1, FA_DTYPE_F16, 0, 0, 0, 1},
    {"modifiers_window_bf16_outer", 2, 6, 3, 48, 3, 2, 16, 512, {300, 17}, 1, 64, -1, FA_DTYPE_BF16, 3, 0, 0, 1},
};

static void *filled(size_t n, fa_dtype t, uint64_t seed)
{
    double *x = test_random_doubles(seed, n);
    void *buf = malloc(n * test_dtype_size(t) + 1);
    assert_non_null(buf);
    for (size_t i = 0; i < n; ++i) test_store_element(buf, i, t, x[i]);
    free(x);
    return buf;
}

/* One call's buffers: the library's cache and the test's expected cache (same layout). */
typedef struct kv_run {
    int64_t slots, slot_len, max_pages; /* slots: batch (contiguous) or pages */
    int32_t cached[MAX_BATCH];
    int32_t *table;
    void *q, *k_new, *v_new, *k_cache, *v_cache, *k_expect, *v_expect, *out;
    float *lse;
    size_t q_n, new_n, cache_n;
    fa_tensor tq, tk_new, tv_new, tout;
    fa_kv_cache cache;
    fa_attention_desc desc;
    float slopes[MAX_BATCH * 16], sinks[16];
    float *bias;
    fa_bias bias_desc;
} kv_run;

/* Where key position j of sequence b lives: (slot, row). */
static void slot_of(const kv_case *c, const kv_run *r, int64_t b, int64_t j, int64_t *slot, int64_t *row)
{
    if (!c->page_size) {
        *slot = b;
        *row = j;
        return;
    }
    *slot = r->table[b * r->max_pages + j / c->page_size];
    *row = j % c->page_size;
}

/* Element x of head h at (slot, row) of the K (tensor 0) or V (tensor 1) cache. */
static size_t cache_index(const kv_case *c, const kv_run *r, int tensor, int64_t slot, int64_t row, int64_t h,
                          int64_t x)
{
    if (c->heads_outer >> tensor & 1) return (size_t)(((slot * c->heads_kv + h) * r->slot_len + row) * c->head_dim + x);
    return (size_t)(((slot * r->slot_len + row) * c->heads_kv + h) * c->head_dim + x);
}

static void run_setup(kv_run *r, const kv_case *c)
{
    memset(r, 0, sizeof *r);
    memcpy(r->cached, c->cached, sizeof r->cached);
    const int64_t d = c->head_dim;
    if (c->page_size) {
        r->slot_len = c->page_size;
        r->max_pages = c->capacity / c->page_size;
        /* Every sequence's pages, plus 3 unused ones (test_page_table scatters them). */
        r->slots = c->batch * r->max_pages + 3;
        r->table = test_page_table(c->batch, r->max_pages, r->slots);
        assert_non_null(r->table);
    } else {
        r->slot_len = c->capacity;
        r->slots = c->batch;
    }
    r->cache_n = (size_t)(r->slots * r->slot_len * c->heads_kv * d);
    r->q_n = (size_t)(c->batch * c->seqlen_q * c->heads_q * d);
    r->new_n = (size_t)(c->batch * c->seqlen_new * c->heads_kv * d);
    r->q = filled(r->q_n, c->dtype, 11);
    r->k_cache = filled(r->cache_n, c->dtype, 12);
    r->v_cache = filled(r->cache_n, c->dtype, 13);
    /* NaN in every slot no sequence has filled yet. */
    uint8_t *used = calloc((size_t)(r->slots * r->slot_len), 1);
    assert_non_null(used);
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t j = 0; j < c->cached[b]; ++j) {
            int64_t slot, row;
            slot_of(c, r, b, j, &slot, &row);
            used[slot * r->slot_len + row] = 1;
        }
    for (int64_t s = 0; s < r->slots * r->slot_len; ++s)
        for (int64_t h = 0; !used[s] && h < c->heads_kv; ++h)
            for (int64_t x = 0; x < d; ++x) {
                test_store_element(r->k_cache, cache_index(c, r, 0, s / r->slot_len, s % r->slot_len, h, x), c->dtype, NAN);
                test_store_element(r->v_cache, cache_index(c, r, 1, s / r->slot_len, s % r->slot_len, h, x), c->dtype, NAN);
            }
    free(used);
    if (c->nan_in && c->nan_key < c->cached[0]) {
        int64_t slot, row;
        slot_of(c, r, 0, c->nan_key, &slot, &row);
        test_store_element(c->nan_in == 1 ? r->k_cache : r->v_cache, cache_index(c, r, c->nan_in - 1, slot, row, 0, 3), c->dtype,
              NAN);
    }
    r->k_expect = malloc(r->cache_n * test_dtype_size(c->dtype));
    r->v_expect = malloc(r->cache_n * test_dtype_size(c->dtype));
    memcpy(r->k_expect, r->k_cache, r->cache_n * test_dtype_size(c->dtype));
    memcpy(r->v_expect, r->v_cache, r->cache_n * test_dtype_size(c->dtype));
    if (c->seqlen_new) {
        r->k_new = filled(r->new_n, c->dtype, 14);
        r->v_new = filled(r->new_n, c->dtype, 15);
        if (c->nan_in && c->nan_key >= c->cached[0])
            test_store_element(c->nan_in == 1 ? r->k_new : r->v_new, (size_t)((c->nan_key - c->cached[0]) * c->heads_kv * d + 3),
                  c->dtype, NAN);
        for (int64_t b = 0; b < c->batch; ++b)
            for (int64_t t = 0; t < c->seqlen_new; ++t) {
                int64_t slot, row;
                slot_of(c, r, b, c->cached[b] + t, &slot, &row);
                for (int64_t h = 0; h < c->heads_kv; ++h) {
                    const size_t at_k = cache_index(c, r, 0, slot, row, h, 0) * test_dtype_size(c->dtype);
                    const size_t at_v = cache_index(c, r, 1, slot, row, h, 0) * test_dtype_size(c->dtype);
                    const size_t from = (size_t)(((b * c->seqlen_new + t) * c->heads_kv + h) * d) * test_dtype_size(c->dtype);
                    memcpy((char *)r->k_expect + at_k, (char *)r->k_new + from, (size_t)d * test_dtype_size(c->dtype));
                    memcpy((char *)r->v_expect + at_v, (char *)r->v_new + from, (size_t)d * test_dtype_size(c->dtype));
                }
            }
    }
    r->out = malloc(r->q_n * test_dtype_size(c->dtype));
    memset(r->out, 0xff, r->q_n * test_dtype_size(c->dtype));
    r->lse = test_nan_floats((size_t)(c->batch * c->heads_q * c->seqlen_q));
    r->tq = (fa_tensor){r->q, c->dtype, c->batch, c->seqlen_q, c->heads_q, d, 0, 0, 0};
    r->tout = (fa_tensor){r->out, c->dtype, c->batch, c->seqlen_q, c->heads_q, d, 0, 0, 0};
    r->tk_new = (fa_tensor){r->k_new, c->dtype, c->batch, c->seqlen_new, c->heads_kv, d, 0, 0, 0};
    r->tv_new = (fa_tensor){r->v_new, c->dtype, c->batch, c->seqlen_new, c->heads_kv, d, 0, 0, 0};
    r->cache.k = (fa_tensor){r->k_cache, c->dtype, r->slots, r->slot_len, c->heads_kv, d, 0, 0, 0};
    r->cache.v = r->cache.k;
    r->cache.v.data = r->v_cache;
    fa_tensor *layouts[2] = {&r->cache.k, &r->cache.v};
    for (int t = 0; t < 2; ++t)
        if (c->heads_outer >> t & 1) {
            layouts[t]->stride_seq = d;
            layouts[t]->stride_head = r->slot_len * d;
            layouts[t]->stride_batch = c->heads_kv * r->slot_len * d;
        }
    r->cache.block_table = r->table;
    r->cache.max_pages_per_seq = r->max_pages;
    r->cache.cache_seqlens = r->cached;
    fa_attention_desc_init(&r->desc);
    r->desc.causal = c->causal;
    r->desc.window_left = c->window_left;
    r->desc.window_right = c->window_right;
    r->desc.kv_split_tokens = 200; /* several chunks per long cache: the merge runs in most cases */
    if (c->modifiers) {
        const size_t bias_n = (size_t)(c->batch * c->heads_q * c->seqlen_q * c->capacity);
        double *values = test_random_doubles(16, bias_n);
        r->bias = malloc(bias_n * sizeof(float));
        assert_non_null(r->bias);
        for (size_t x = 0; x < bias_n; ++x) r->bias[x] = (float)values[x];
        free(values);
        r->bias_desc = (fa_bias){r->bias, FA_DTYPE_F32, c->heads_q * c->seqlen_q * c->capacity,
                                 c->seqlen_q * c->capacity, c->capacity};
        for (int64_t x = 0; x < c->batch * c->heads_q; ++x) r->slopes[x] = 0.01f * (float)(1 + x % 5);
        for (int64_t h = 0; h < c->heads_q; ++h) r->sinks[h] = h % 3 ? 1.0f : -2.0f;
        r->desc.softcap = 4.0f;
        r->desc.alibi_slopes = r->slopes;
        r->desc.alibi_per_batch = 1;
        r->desc.sinks = r->sinks;
        r->desc.bias = &r->bias_desc;
    }
}

static void run_free(kv_run *r)
{
    void *all[] = {r->table, r->q, r->k_new, r->v_new, r->k_cache, r->v_cache, r->k_expect, r->v_expect, r->out,
                   r->lse, r->bias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]);
}

static fa_status run_library(fa_context *ctx, kv_run *r, const kv_case *c)
{
    return fa_forward_kvcache(ctx, &r->desc, &r->tq, &r->cache, c->seqlen_new ? &r->tk_new : NULL,
                              c->seqlen_new ? &r->tv_new : NULL, &r->tout, r->lse);
}

/* The larger error, a NaN counting as infinite (so that it is never lost by a later max). */
static double worse(double worst, double err) { return err <= worst ? worst : isnan(err) ? INFINITY : err; }

/* fa_forward of sequence b on its keys gathered from the expected cache; returns the largest
 * error of out (relative to max(1, |ref|)) and lse. */
static double compare_sequence(fa_context *ctx, const kv_case *c, const kv_run *r, int64_t b)
{
    const int64_t d = c->head_dim, keys = c->cached[b] + c->seqlen_new;
    const size_t row = (size_t)(c->heads_kv * d), qrow = (size_t)(c->seqlen_q * c->heads_q * d);
    const size_t es = test_dtype_size(c->dtype);
    const size_t q_off = (size_t)b * qrow;
    float *lse = test_nan_floats((size_t)(c->heads_q * c->seqlen_q));
    void *out = malloc(qrow * es);
    double worst = 0.0;
    if (keys == 0) { /* no key: zeros and -inf (the sink alone with sinks), nothing to call fa_forward with */
        for (size_t e = 0; e < qrow; ++e)
            if (test_load_element(r->out, q_off + e, c->dtype) != 0.0f) worst = INFINITY;
        for (int64_t e = 0; e < c->heads_q * c->seqlen_q; ++e)
            if (r->lse[b * c->heads_q * c->seqlen_q + e] != (c->modifiers ? r->sinks[e / c->seqlen_q] : -INFINITY))
                worst = INFINITY;
        free(lse);
        free(out);
        return worst;
    }
    char *k = malloc((size_t)keys * row * es), *v = malloc((size_t)keys * row * es);
    assert_true(k && v && out);
    for (int64_t j = 0; j < keys; ++j) {
        int64_t slot, srow;
        slot_of(c, r, b, j, &slot, &srow);
        for (int64_t h = 0; h < c->heads_kv; ++h) {
            const size_t to = ((size_t)j * row + (size_t)(h * d)) * es;
            memcpy(k + to, (char *)r->k_expect + cache_index(c, r, 0, slot, srow, h, 0) * es, (size_t)d * es);
            memcpy(v + to, (char *)r->v_expect + cache_index(c, r, 1, slot, srow, h, 0) * es, (size_t)d * es);
        }
    }
    const fa_tensor tq = {(char *)r->q + q_off * es, c->dtype, 1, c->seqlen_q, c->heads_q, d, 0, 0, 0};
    const fa_tensor tk = {k, c->dtype, 1, keys, c->heads_kv, d, 0, 0, 0};
    const fa_tensor tv = {v, c->dtype, 1, keys, c->heads_kv, d, 0, 0, 0};
    fa_tensor tout = {out, c->dtype, 1, c->seqlen_q, c->heads_q, d, 0, 0, 0};
    fa_attention_desc desc = r->desc;
    fa_bias bias = r->bias_desc; /* sequence b's rows of the bias and its slopes */
    if (c->modifiers) {
        bias.data = r->bias + b * r->bias_desc.stride_batch;
        bias.stride_batch = 0;
        desc.bias = &bias;
        desc.alibi_slopes = r->slopes + b * c->heads_q;
        desc.alibi_per_batch = 0;
    }
    assert_int_equal(fa_forward(ctx, &desc, &tq, &tk, &tv, &tout, lse), FA_SUCCESS);
    for (size_t e = 0; e < qrow; ++e) {
        const double want = test_load_element(out, e, c->dtype), got = test_load_element(r->out, q_off + e, c->dtype);
        const double err = isnan(want) || isnan(got) ? (isnan(want) && isnan(got) ? 0.0 : INFINITY)
                                                     : fabs(got - want) / (fabs(want) > 1.0 ? fabs(want) : 1.0);
        worst = worse(worst, err);
    }
    for (int64_t e = 0; e < c->heads_q * c->seqlen_q; ++e) {
        const double want = lse[e], got = r->lse[b * c->heads_q * c->seqlen_q + e];
        const double err = isinf(want) || isnan(want) || isnan(got)
                               ? (got == want || (isnan(got) && isnan(want)) ? 0.0 : INFINITY)
                               : fabs(got - want) / fmax(1.0, fabs(want));
        worst = worse(worst, err);
    }
    free(k);
    free(v);
    free(out);
    free(lse);
    return worst;
}

static void run_case(const kv_case *c)
{
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    kv_run runs[3];
    for (int t = 0; t < 3; ++t) {
        run_setup(&runs[t], c);
        assert_int_equal(fa_context_set_num_threads(ctx, t + 1), FA_SUCCESS);
        const fa_status st = run_library(ctx, &runs[t], c);
        if (st != FA_SUCCESS) fail_msg("%s: %s", c->name, fa_last_error());
        const size_t cache_bytes = runs[t].cache_n * test_dtype_size(c->dtype);
        assert_memory_equal(runs[t].k_cache, runs[t].k_expect, cache_bytes);
        assert_memory_equal(runs[t].v_cache, runs[t].v_expect, cache_bytes);
        assert_memory_equal(runs[t].cached, c->cached, sizeof runs[t].cached);
    }
    const kv_run *r = &runs[0];
    const double tol = c->dtype == FA_DTYPE_F32 ? 2e-5 : c->dtype == FA_DTYPE_F16 ? 2e-3 : 1e-2;
    double worst = 0.0;
    for (int64_t b = 0; b < c->batch; ++b) worst = worse(worst, compare_sequence(ctx, c, r, b));
    printf("  %-24s vs fa_forward on the gathered keys: max error %.2e (tolerance %.0e)\n", c->name, worst, tol);
    assert_true(worst <= tol);
    if (c->nan_in) { /* the NaN reached some rows of sequence 0, and not all of them */
        size_t nans = 0;
        const size_t per_sequence = (size_t)(c->seqlen_q * c->heads_q * c->head_dim);
        for (size_t e = 0; e < per_sequence; ++e) nans += isnan(test_load_element(r->out, e, c->dtype));
        printf("  %-24s NaN in %zu of %zu outputs of sequence 0\n", c->name, nans, per_sequence);
        assert_true(nans > 0 && nans < per_sequence);
    }
    for (int t = 1; t < 3; ++t) { /* bit-identical across 1, 2, 3 threads */
        assert_memory_equal(runs[t].out, r->out, r->q_n * test_dtype_size(c->dtype));
        assert_memory_equal(runs[t].lse, r->lse, (size_t)(c->batch * c->heads_q * c->seqlen_q) * sizeof(float));
    }
    for (int t = 0; t < 3; ++t) run_free(&runs[t]);
    fa_context_destroy(ctx);
}

static void test_cases(void **state)
{
    (void)state;
    const int quick = fa_test_quick();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const kv_case *c = &cases[i];
        const int64_t slots = c->page_size ? c->batch * (c->capacity / c->page_size) + 3 : c->batch;
        const int64_t slot_len = c->page_size ? c->page_size : c->capacity;
        if (quick && slots * slot_len * c->heads_kv * c->head_dim > QUICK_MAX_CACHE) {
            printf("  %-24s skipped under FA_TEST_QUICK=1 (cache above %d elements)\n", c->name, QUICK_MAX_CACHE);
            continue;
        }
        run_case(c);
    }
}

/* ---- bad inputs ----------------------------------------------------------------------------- */
typedef struct bad_kv {
    const char *name;
    int paged;
    fa_status expected;
    const char *message_prefix;
    void (*mutate)(kv_run *r);
} bad_kv;

#define MUTATION(fn, body) static void fn(kv_run *r) { body; }
MUTATION(null_cache_seqlens, r->cache.cache_seqlens = NULL)
MUTATION(negative_length, r->cached[1] = -1)
MUTATION(past_capacity, r->cached[1] = (int32_t)r->slot_len) /* + 1 new token */
MUTATION(past_pages, r->cached[1] = (int32_t)(r->max_pages * r->slot_len))
MUTATION(page_negative, r->table[1 * r->max_pages + 0] = -1)
MUTATION(page_too_large, r->table[1 * r->max_pages + 1] = (int32_t)r->slots)
MUTATION(zero_pages, r->cache.max_pages_per_seq = 0)
MUTATION(k_new_only, r->tv_new.data = NULL) /* turned into v_new = NULL by the caller */
MUTATION(k_new_heads, r->tk_new.heads = 1; r->tv_new.heads = 1)
MUTATION(cache_batch, r->cache.k.batch = 1; r->cache.v.batch = 1)
MUTATION(cache_dtype, r->cache.k.dtype = FA_DTYPE_BF16; r->cache.v.dtype = FA_DTYPE_BF16)
MUTATION(dropout, r->desc.dropout_p = 0.1f)
MUTATION(seqlens_k, r->desc.seqlens_k = r->cached)
static void block_mask(kv_run *r)
{
    static const uint8_t bits[1] = {1};
    static const fa_block_mask bm = {64, 64, 1, 1, bits};
    r->desc.block_mask = &bm;
}

static void nan_slope(kv_run *r)
{
    for (int x = 0; x < 4; ++x) r->slopes[x] = x == 2 ? NAN : 0.5f;
    r->desc.alibi_slopes = r->slopes;
}

static void inf_sink(kv_run *r)
{
    for (int h = 0; h < 4; ++h) r->sinks[h] = h == 1 ? INFINITY : 0.0f;
    r->desc.sinks = r->sinks;
}

static void negative_softcap(kv_run *r) { r->desc.softcap = -1.0f; }

static const bad_kv bad_cases[] = {
    {"cache_seqlens NULL", 0, FA_ERROR_INVALID_VALUE, "cache->cache_seqlens", null_cache_seqlens},
    {"negative length", 0, FA_ERROR_INVALID_VALUE, "cache->cache_seqlens[1]", negative_length},
    {"append past capacity", 0, FA_ERROR_INVALID_VALUE, "cache->cache_seqlens[1]: sequence 1", past_capacity},
    {"append past the pages", 1, FA_ERROR_INVALID_VALUE, "cache->cache_seqlens[1]: sequence 1", past_pages},
    {"page index -1", 1, FA_ERROR_INVALID_VALUE, "cache->block_table[1][0]", page_negative},
    {"page index = num_pages", 1, FA_ERROR_INVALID_VALUE, "cache->block_table[1][1]", page_too_large},
    {"max_pages_per_seq 0", 1, FA_ERROR_INVALID_VALUE, "cache->max_pages_per_seq", zero_pages},
    {"k_new without v_new", 0, FA_ERROR_INVALID_VALUE, "k_new, v_new", k_new_only},
    {"k_new heads differ from the cache", 0, FA_ERROR_INVALID_VALUE, "k_new", k_new_heads},
    {"contiguous cache batch differs", 0, FA_ERROR_INVALID_VALUE, "cache->k", cache_batch},
    {"cache dtype differs", 0, FA_ERROR_INVALID_VALUE, "cache->k", cache_dtype},
    {"dropout", 0, FA_ERROR_NOT_SUPPORTED, "desc->dropout_p", dropout},
    {"seqlens_k", 0, FA_ERROR_INVALID_VALUE, "desc->seqlens_k", seqlens_k},
    {"block mask", 0, FA_ERROR_NOT_SUPPORTED, "desc->block_mask", block_mask},
    {"NaN ALiBi slope", 0, FA_ERROR_INVALID_VALUE, "desc->alibi_slopes[2]", nan_slope},
    {"+inf sink", 1, FA_ERROR_INVALID_VALUE, "desc->sinks[1]", inf_sink},
    {"negative softcap", 0, FA_ERROR_INVALID_VALUE, "desc->softcap", negative_softcap},
};

static void test_bad_inputs(void **state)
{
    (void)state;
    static const kv_case contiguous = {"bad", 2, 4, 2, 16, 2, 1, 0, 20, {3, 10}, 1, -1, -1, FA_DTYPE_F32, 0, 0, 0, 0};
    static const kv_case paged = {"bad_paged", 2, 4, 2, 16, 2, 1, 4, 20, {3, 10}, 1, -1, -1, FA_DTYPE_F32, 0, 0, 0, 0};
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; ++i) {
        const kv_case *c = bad_cases[i].paged ? &paged : &contiguous;
        kv_run r;
        run_setup(&r, c);
        void *k_before = malloc(r.cache_n * 4), *v_before = malloc(r.cache_n * 4);
        memcpy(k_before, r.k_cache, r.cache_n * 4);
        memcpy(v_before, r.v_cache, r.cache_n * 4);
        bad_cases[i].mutate(&r);
        const fa_tensor *v_new = r.tv_new.data ? &r.tv_new : NULL;
        const fa_status st = fa_forward_kvcache(ctx, &r.desc, &r.tq, &r.cache, &r.tk_new, v_new, &r.tout, r.lse);
        printf("  %-34s %s\n", bad_cases[i].name, fa_last_error());
        assert_int_equal(st, bad_cases[i].expected);
        assert_memory_equal(fa_last_error(), bad_cases[i].message_prefix, strlen(bad_cases[i].message_prefix));
        assert_memory_equal(r.k_cache, k_before, r.cache_n * 4);
        assert_memory_equal(r.v_cache, v_before, r.cache_n * 4);
        for (size_t e = 0; e < r.q_n; ++e) assert_true(isnan(((float *)r.out)[e]));
        for (int64_t e = 0; e < c->batch * c->heads_q * c->seqlen_q; ++e) assert_true(isnan(r.lse[e]));
        free(k_before);
        free(v_before);
        r.tv_new.data = r.v_new;
        run_free(&r);
    }
    fa_context_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

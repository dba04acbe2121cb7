/* fa_forward_kvcache as a serving engine calls it, on the CPU:
 * - ragged queries (desc->varlen): each sequence of a mixed batch (decodes of one token, prefill
 *   chunks, sequences with no query or nothing to append) gives, bit for bit, what the same
 *   sequence gives alone in a padded call, which test_kvcache checks against fa_forward; and one
 *   ragged batch against the fp64 oracle directly;
 * - batch invariance: every sequence of a pool of mixed lengths (short, at and past the split's
 *   chunk boundaries, long) alone and inside batches of 1..64 sequences in two orders, with the
 *   default split and with desc->kv_split_tokens, on 1 and 2 threads: the same bits;
 * - cache slots and left padding (fa_kv_slots) against the same keys laid out plainly;
 * - bad tables and arguments: the status names the element, nothing is written. */
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
#include "kv_scene.h"
#include "oracle.h"
#include "test_arrays.h"

static int setup(void **state)
{
    fa_context *ctx = NULL;
    if (fa_context_create(FA_BACKEND_CPU, 0, &ctx) != FA_SUCCESS) return -1;
    *state = ctx;
    return 0;
}

static int teardown(void **state)
{
    fa_context_destroy(*state);
    return 0;
}

/* Sequence b of scene `batch` against the same sequence run alone in a padded call (the path
 * test_kvcache checks against fa_forward). A sequence without queries is run alone with one, and
 * only its cache is compared. */
static void expect_alone(fa_context *ctx, const kv_layout *l, kv_scene *batch, int b, const fa_attention_desc *desc,
                         int batch_ragged, const char *what)
{
    kv_scene alone;
    kv_seq seq = batch->seqs[b];
    const int has_queries = seq.queries > 0;
    if (!has_queries) seq.queries = 1;
    kv_scene_build(&alone, ctx, l, &seq, 1);
    if (kv_scene_run(&alone, desc, 0, NULL) != FA_SUCCESS) fail_msg("%s alone: %s", what, fa_last_error());
    kv_seq_result mine, ref;
    kv_scene_result(batch, b, batch_ragged, &mine);
    kv_scene_result(&alone, 0, 0, &ref);
    if (!has_queries) ref.out_bytes = 0, ref.lse_count = 0;
    char label[160];
    snprintf(label, sizeof label, "%s, sequence %d (%d cached, %d queries, %d new)", what, b, batch->seqs[b].cached,
             batch->seqs[b].queries, batch->seqs[b].fresh);
    kv_expect_same(&mine, &ref, label);
    kv_seq_result_free(&mine);
    kv_seq_result_free(&ref);
    kv_scene_free(&alone);
}

/* A chunked-prefill step: decodes, prefill chunks, a sequence with no query (it only appends), one
 * with nothing cached, one that appends nothing. */
static const kv_seq mixed[] = {
    {700, 1, 1, 1}, {40, 9, 9, 2}, {300, 0, 5, 3}, {0, 6, 6, 4}, {1100, 3, 0, 5}, {257, 1, 1, 6}, {33, 70, 70, 7},
};
#define MIXED_N (int)(sizeof mixed / sizeof mixed[0])

static void ragged_case(fa_context *ctx, fa_dtype dtype, int64_t page_size, int causal, int modifiers)
{
    const kv_layout l = {dtype, 8, 2, 32, 1280, page_size};
    float sinks[8];
    for (int h = 0; h < 8; ++h) sinks[h] = 0.25f * (float)h - 1.0f;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = causal;
    if (modifiers) { /* the path through the dense forward per sequence */
        desc.softcap = 5.0f;
        desc.sinks = sinks;
    }
    kv_scene s;
    kv_scene_build(&s, ctx, &l, mixed, MIXED_N);
    if (kv_scene_run(&s, &desc, 1, NULL) != FA_SUCCESS) fail_msg("ragged: %s", fa_last_error());
    char what[96];
    snprintf(what, sizeof what, "%s, %s, %s%s", fa_dtype_label(dtype), page_size ? "paged" : "contiguous",
             causal ? "causal" : "full", modifiers ? ", softcap and sinks" : "");
    for (int b = 0; b < MIXED_N; ++b) expect_alone(ctx, &l, &s, b, &desc, 1, what);
    kv_scene_free(&s);
}

static void test_ragged_equals_alone(void **state)
{
    fa_context *ctx = *state;
    ragged_case(ctx, FA_DTYPE_F32, 0, 1, 0);
    ragged_case(ctx, FA_DTYPE_F16, 16, 1, 0);
    ragged_case(ctx, FA_DTYPE_BF16, 7, 0, 0);
    ragged_case(ctx, FA_DTYPE_F32, 16, 1, 1);
    ragged_case(ctx, FA_DTYPE_F16, 0, 0, 1);
}

/* The ragged batch against the fp64 oracle: each sequence's keys are its cached rows then its new
 * ones, its queries aligned at their end (causal bottom-right); the default scale and a negative
 * one (the softmax step folds a positive scale into its exponential: a negative one must not be). */
static void ragged_oracle(fa_context *ctx, float scale)
{
    const kv_layout l = {FA_DTYPE_F32, 8, 2, 32, 1280, 16};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    desc.window_left = 500;
    desc.softmax_scale = scale;
    kv_scene s;
    kv_scene_build(&s, ctx, &l, mixed, MIXED_N);
    assert_int_equal(kv_scene_run(&s, &desc, 1, NULL), FA_SUCCESS);
    const size_t qrow = (size_t)(l.heads_q * l.head_dim), kvrow = (size_t)(l.heads_kv * l.head_dim);
    float *q = malloc((size_t)s.total_q * qrow * sizeof(float));
    assert_non_null(q);
    assert_int_equal(fa_memcpy_d2h(ctx, q, s.q, (size_t)s.total_q * qrow * sizeof(float)), FA_SUCCESS);
    for (int b = 0; b < MIXED_N; ++b) {
        const kv_seq *seq = &mixed[b];
        if (!seq->queries) continue;
        kv_seq_result r;
        kv_scene_result(&s, b, 1, &r);
        const int64_t keys = seq->cached + seq->fresh;
        const oracle_shape shape = {1, l.heads_q, l.heads_kv, seq->queries, keys, l.head_dim};
        double *dq = malloc((size_t)seq->queries * qrow * sizeof(double)), *dk = malloc((size_t)keys * kvrow * sizeof(double) + 8);
        double *dv = malloc((size_t)keys * kvrow * sizeof(double) + 8), *out = malloc((size_t)seq->queries * qrow * sizeof(double));
        double *lse = malloc((size_t)(seq->queries * l.heads_q) * sizeof(double));
        assert_true(dq && dk && dv && out && lse);
        for (size_t e = 0; e < (size_t)seq->queries * qrow; ++e) dq[e] = q[(size_t)s.cu_q[b] * qrow + e];
        for (size_t e = 0; e < (size_t)keys * kvrow; ++e) {
            dk[e] = ((const float *)r.k)[e];
            dv[e] = ((const float *)r.v)[e];
        }
        oracle_forward(&shape, &desc, dq, dk, dv, out, lse);
        const double err = test_relative_error(out, r.out, (size_t)seq->queries * qrow);
        const double lse_err = test_relative_error(lse, r.lse, (size_t)(seq->queries * l.heads_q));
        if (!(err <= fa_case_tolerance(FA_DTYPE_F32)) || !(lse_err <= fa_case_tolerance(FA_DTYPE_F32)))
            fail_msg("scale %g, sequence %d: out error %g, lse error %g against the oracle", (double)scale, b, err, lse_err);
        free(dq), free(dk), free(dv), free(out), free(lse);
        kv_seq_result_free(&r);
    }
    free(q);
    kv_scene_free(&s);
}

static void test_ragged_oracle(void **state)
{
    ragged_oracle(*state, 0.0f);
    ragged_oracle(*state, -0.3f);
}

/* A pool of decoding sequences, lengths around chunk boundaries (the default's 1024 keys, the
 * explicit 300) and past them; a few with several query rows. */
static void make_pool(kv_seq *pool, int n)
{
    static const int32_t lengths[] = {1, 200, 255, 256, 257, 511, 513, 700, 1024, 1500, 2049, 3000, 4100, 40, 90, 6000};
    for (int b = 0; b < n; ++b) {
        pool[b].cached = lengths[(b * 7) % 16] + b;
        pool[b].queries = b % 5 == 3 ? 4 : 1;
        pool[b].fresh = pool[b].queries;
        pool[b].id = 100u + (uint32_t)b;
    }
}

/* alone[x]: pool[x]'s result in a padded call of its own, computed when first asked for (on one
 * thread: the batches then run on one and on two). */
static const kv_seq_result *alone_result(fa_context *ctx, const kv_layout *l, const kv_seq *pool, kv_seq_result *alone,
                                         int x, const fa_attention_desc *desc)
{
    if (alone[x].out) return &alone[x];
    kv_scene one;
    assert_int_equal(fa_context_set_num_threads(ctx, 1), FA_SUCCESS);
    kv_scene_build(&one, ctx, l, &pool[x], 1);
    if (kv_scene_run(&one, desc, 0, NULL) != FA_SUCCESS) fail_msg("sequence %d alone: %s", x, fa_last_error());
    kv_scene_result(&one, 0, 0, &alone[x]);
    kv_scene_free(&one);
    return &alone[x];
}

/* Sequences first..first+count-1 of the pool (reversed: in the opposite order) as one batch on
 * `threads` threads, each against its result alone. */
static void invariance_run(fa_context *ctx, const kv_layout *l, const kv_seq *pool, kv_seq_result *alone, int threads,
                           int first, int count, int reversed, const fa_attention_desc *desc, const char *what)
{
    kv_seq batch[KV_SCENE_MAX];
    int from[KV_SCENE_MAX];
    for (int x = 0; x < count; ++x) {
        from[x] = reversed ? first + count - 1 - x : first + x;
        batch[x] = pool[from[x]];
    }
    for (int b = 0; b < count; ++b) (void)alone_result(ctx, l, pool, alone, from[b], desc);
    kv_scene s;
    kv_scene_build(&s, ctx, l, batch, count);
    assert_int_equal(fa_context_set_num_threads(ctx, threads), FA_SUCCESS);
    if (kv_scene_run(&s, desc, 1, NULL) != FA_SUCCESS) fail_msg("%s: %s", what, fa_last_error());
    for (int b = 0; b < count; ++b) {
        char label[160];
        snprintf(label, sizeof label, "%s, batch of %d%s, sequence %d (%d cached)", what, count,
                 reversed ? " reversed" : "", b, batch[b].cached);
        kv_seq_result mine;
        kv_scene_result(&s, b, 1, &mine);
        kv_expect_same(&mine, &alone[from[b]], label);
        kv_seq_result_free(&mine);
    }
    kv_scene_free(&s);
}

static void test_batch_invariance(void **state)
{
    fa_context *ctx = *state;
    enum { POOL = 64 };
    kv_seq pool[POOL];
    make_pool(pool, POOL);
    const kv_layout layouts[2] = {{FA_DTYPE_F16, 4, 2, 32, 6200, 0}, {FA_DTYPE_F32, 2, 1, 16, 6200, 64}};
    for (int x = 0; x < 2; ++x)
        for (int split = 0; split < 2; ++split) {
            fa_attention_desc desc;
            fa_attention_desc_init(&desc);
            desc.causal = 1;
            desc.kv_split_tokens = split ? 300 : 0;
            char what[96];
            snprintf(what, sizeof what, "%s, %s cache, %s split", fa_dtype_label(layouts[x].dtype),
                     layouts[x].page_size ? "paged" : "contiguous", split ? "300-key" : "default");
            static kv_seq_result alone[POOL];
            memset(alone, 0, sizeof alone);
            for (int threads = 1; threads <= 2; ++threads) {
                /* Batches of every size from 1 to 64 would repeat the same sequences many times over;
                 * sizes 1, 2, 3, 5, 8, 13, 21, 34, 64 cover small and full batches at every offset. */
                static const int sizes[] = {1, 2, 3, 5, 8, 13, 21, 34, 64};
                for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; ++k) {
                    const int count = sizes[k], first = (int)((k * 11) % (size_t)(POOL - count + 1));
                    if (threads == 2 && count < 34) continue; /* thread counts: the big batches */
                    if (fa_test_quick() && (k % 3 != 0 || x == 1)) continue; /* sanitizer runs: sizes 1, 5, 21 */
                    invariance_run(ctx, &layouts[x], pool, alone, threads, first, count, (int)(k & 1), &desc, what);
                }
            }
            for (int b = 0; b < POOL; ++b) kv_seq_result_free(&alone[b]);
        }
    assert_int_equal(fa_context_set_num_threads(ctx, 0), FA_SUCCESS);
}

/* Sequences reading rows 3, 0, 4 of a five-row cache, ignoring their first 2, 0, 7 positions,
 * against a three-row cache holding the same keys from position 0. */
static void test_slots_and_left_padding(void **state)
{
    fa_context *ctx = *state;
    const kv_layout l = {FA_DTYPE_F32, 4, 2, 16, 64, 0};
    const kv_seq rows[5] = {{20, 2, 2, 1}, {30, 2, 2, 2}, {40, 2, 2, 3}, {12, 2, 2, 4}, {50, 2, 2, 5}};
    static const int32_t idx[3] = {3, 0, 4}, pad[3] = {2, 0, 7};
    kv_scene wide;
    kv_scene_build(&wide, ctx, &l, rows, 5);
    /* The wide scene's queries and new tokens are those of rows 0..4; the call uses 3 sequences: q,
     * k_new, v_new of the first three (rows' data), and cache_seqlens of the slots they read. */
    int32_t cached[3];
    for (int b = 0; b < 3; ++b) cached[b] = rows[idx[b]].cached;
    int32_t *cached_dev, *idx_dev, *pad_dev;
    assert_int_equal(fa_malloc(ctx, sizeof cached, (void **)&cached_dev), FA_SUCCESS);
    assert_int_equal(fa_malloc(ctx, sizeof idx, (void **)&idx_dev), FA_SUCCESS);
    assert_int_equal(fa_malloc(ctx, sizeof pad, (void **)&pad_dev), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, cached_dev, cached, sizeof cached), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, idx_dev, idx, sizeof idx), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, pad_dev, pad, sizeof pad), FA_SUCCESS);
    fa_kv_slots slots;
    fa_kv_slots_init(&slots);
    slots.cache_batch_idx = idx_dev;
    slots.cache_leftpad = pad_dev;
    fa_kv_cache cache;
    memset(&cache, 0, sizeof cache);
    cache.k = (fa_tensor){wide.k_cache, l.dtype, 5, l.capacity, l.heads_kv, l.head_dim, 0, 0, 0};
    cache.v = cache.k;
    cache.v.data = wide.v_cache;
    cache.cache_seqlens = cached_dev;
    const fa_tensor q = {wide.q, l.dtype, 3, 2, l.heads_q, l.head_dim, 0, 0, 0};
    const fa_tensor k_new = {wide.k_new, l.dtype, 3, 2, l.heads_kv, l.head_dim, 0, 0, 0};
    fa_tensor v_new = k_new, out = q;
    v_new.data = wide.v_new;
    out.data = wide.out;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    float before_row1[64 * 2 * 16];
    memcpy(before_row1, (float *)wide.k_cache + 64 * 2 * 16, sizeof before_row1);
    if (fa_forward_kvcache_ex(ctx, &desc, &q, &cache, &slots, &k_new, &v_new, &out, wide.lse) != FA_SUCCESS)
        fail_msg("slots: %s", fa_last_error());
    assert_memory_equal(before_row1, (float *)wide.k_cache + 64 * 2 * 16, sizeof before_row1); /* row 1: nobody's */

    /* The plain layout: sequence b's cache row = slot idx[b] from position pad[b] on, its own q. */
    const size_t kvrow = (size_t)(l.heads_kv * l.head_dim), qrow = (size_t)(l.heads_q * l.head_dim);
    kv_seq plain_seqs[3];
    for (int b = 0; b < 3; ++b) plain_seqs[b] = (kv_seq){cached[b] - pad[b], 2, 2, (uint32_t)(50 + b)};
    kv_scene plain;
    kv_scene_build(&plain, ctx, &l, plain_seqs, 3);
    float *kc = malloc(wide.cache_elems * sizeof(float)), *vc = malloc(wide.cache_elems * sizeof(float));
    assert_true(kc && vc);
    assert_int_equal(fa_memcpy_d2h(ctx, kc, wide.k_cache, wide.cache_elems * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(ctx, vc, wide.v_cache, wide.cache_elems * sizeof(float)), FA_SUCCESS);
    float *pk = malloc(plain.cache_elems * sizeof(float)), *pv = malloc(plain.cache_elems * sizeof(float));
    assert_true(pk && pv);
    for (size_t e = 0; e < plain.cache_elems; ++e) pk[e] = pv[e] = NAN;
    for (int b = 0; b < 3; ++b) /* the cached keys before the append */
        for (int64_t pos = 0; pos < cached[b] - pad[b]; ++pos) {
            const size_t from = ((size_t)idx[b] * (size_t)l.capacity + (size_t)(pad[b] + pos)) * kvrow;
            const size_t to = ((size_t)b * (size_t)l.capacity + (size_t)pos) * kvrow;
            memcpy(pk + to, kc + from, kvrow * sizeof(float));
            memcpy(pv + to, vc + from, kvrow * sizeof(float));
        }
    assert_int_equal(fa_memcpy_h2d(ctx, plain.k_cache, pk, plain.cache_elems * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, plain.v_cache, pv, plain.cache_elems * sizeof(float)), FA_SUCCESS);
    float *host = malloc((size_t)(3 * 2) * qrow * sizeof(float) + (size_t)(3 * 2) * kvrow * 2 * sizeof(float));
    assert_non_null(host);
    /* Same queries and new tokens as the slotted call (the first 3 x 2 rows of the wide scene's). */
    assert_int_equal(fa_memcpy_d2h(ctx, host, wide.q, 6 * qrow * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, plain.q, host, 6 * qrow * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(ctx, host, wide.k_new, 6 * kvrow * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, plain.k_new, host, 6 * kvrow * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(ctx, host, wide.v_new, 6 * kvrow * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, plain.v_new, host, 6 * kvrow * sizeof(float)), FA_SUCCESS);
    assert_int_equal(kv_scene_run(&plain, &desc, 0, NULL), FA_SUCCESS);
    float *wout = malloc(6 * qrow * sizeof(float)), *pout = malloc(6 * qrow * sizeof(float));
    float *wlse = malloc(6 * 4 * sizeof(float)), *plse = malloc(6 * 4 * sizeof(float));
    assert_true(wout && pout && wlse && plse);
    assert_int_equal(fa_memcpy_d2h(ctx, wout, wide.out, 6 * qrow * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(ctx, pout, plain.out, 6 * qrow * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(ctx, wlse, wide.lse, 6 * 4 * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(ctx, plse, plain.lse, 6 * 4 * sizeof(float)), FA_SUCCESS);
    assert_memory_equal(wout, pout, 6 * qrow * sizeof(float));
    assert_memory_equal(wlse, plse, 6 * 4 * sizeof(float));
    /* The append landed at cache_seqlens[b] of row idx[b]: the plain cache's rows after its append. */
    assert_int_equal(fa_memcpy_d2h(ctx, kc, wide.k_cache, wide.cache_elems * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(ctx, pk, plain.k_cache, plain.cache_elems * sizeof(float)), FA_SUCCESS);
    for (int b = 0; b < 3; ++b)
        assert_memory_equal(kc + ((size_t)idx[b] * (size_t)l.capacity + (size_t)cached[b]) * kvrow,
                            pk + ((size_t)b * (size_t)l.capacity + (size_t)(cached[b] - pad[b])) * kvrow,
                            2 * kvrow * sizeof(float));
    free(kc), free(vc), free(pk), free(pv), free(host), free(wout), free(pout), free(wlse), free(plse);
    fa_free(ctx, cached_dev), fa_free(ctx, idx_dev), fa_free(ctx, pad_dev);
    kv_scene_free(&plain);
    kv_scene_free(&wide);
}

/* A failing call: status and argument named, the cache and the outputs untouched. */
static void expect_rejected(kv_scene *s, fa_status got, fa_status want, const char *name)
{
    test_expect_error(got, want, name);
    kv_seq_result r;
    for (int b = 0; b < s->n; ++b) {
        kv_scene_result(s, b, 1, &r);
        for (size_t e = 0; e < r.out_bytes / sizeof(float); ++e)
            if (!isnan(((float *)r.out)[e])) fail_msg("%s: out written by a failed call", name);
        for (size_t e = 0; e < (size_t)s->seqs[b].fresh * (size_t)(s->layout.heads_kv * s->layout.head_dim); ++e)
            if (!isnan(((float *)r.k)[(size_t)s->seqs[b].cached * (size_t)(s->layout.heads_kv * s->layout.head_dim) + e]))
                fail_msg("%s: the cache was appended to by a failed call", name);
        kv_seq_result_free(&r);
    }
}

static void test_serving_errors(void **state)
{
    fa_context *ctx = *state;
    const kv_layout l = {FA_DTYPE_F32, 4, 2, 16, 64, 0};
    const kv_seq seqs[3] = {{10, 1, 1, 1}, {5, 3, 3, 2}, {0, 2, 2, 3}};
    kv_scene s;
    kv_scene_build(&s, ctx, &l, seqs, 3);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    /* Offsets: q's last offset is not q's rows. */
    int32_t good = s.cu_q_dev[3];
    s.cu_q_dev[3] = good + 1;
    expect_rejected(&s, kv_scene_run(&s, &desc, 1, NULL), FA_ERROR_INVALID_VALUE, "cu_seqlens_q[3]");
    s.cu_q_dev[3] = good;
    /* k_new's offsets decreasing. */
    good = s.cu_new_dev[2];
    s.cu_new_dev[2] = 0;
    expect_rejected(&s, kv_scene_run(&s, &desc, 1, NULL), FA_ERROR_INVALID_VALUE, "cu_seqlens_k[2]");
    s.cu_new_dev[2] = good;
    /* Overflow: the last sequence appends past the capacity. */
    s.cached_dev[2] = 63;
    expect_rejected(&s, kv_scene_run(&s, &desc, 1, NULL), FA_ERROR_INVALID_VALUE, "cache_seqlens[2]");
    s.cached_dev[2] = 0;
    /* Slots: an index outside the cache's rows, a left padding past the cached tokens, a paged cache. */
    int32_t idx[3] = {0, 3, 1}, pad[3] = {0, 6, 0};
    fa_kv_slots slots;
    fa_kv_slots_init(&slots);
    slots.cache_batch_idx = idx;
    expect_rejected(&s, kv_scene_run(&s, &desc, 1, &slots), FA_ERROR_INVALID_VALUE, "cache_batch_idx[1]");
    idx[1] = 1;
    slots.cache_leftpad = pad;
    expect_rejected(&s, kv_scene_run(&s, &desc, 1, &slots), FA_ERROR_INVALID_VALUE, "cache_leftpad[1]");
    slots.struct_size = 4;
    expect_rejected(&s, kv_scene_run(&s, &desc, 1, &slots), FA_ERROR_INVALID_VALUE, "slots->struct_size");
    desc.kv_split_tokens = -1;
    expect_rejected(&s, kv_scene_run(&s, &desc, 1, NULL), FA_ERROR_INVALID_VALUE, "desc->kv_split_tokens");
    desc.kv_split_tokens = 0;
    kv_scene_free(&s);

    const kv_layout paged = {FA_DTYPE_F32, 4, 2, 16, 64, 16};
    kv_scene_build(&s, ctx, &paged, seqs, 3);
    fa_kv_slots_init(&slots);
    slots.cache_leftpad = pad;
    expect_rejected(&s, kv_scene_run(&s, &desc, 1, &slots), FA_ERROR_NOT_SUPPORTED, "slots");
    /* A page index out of range in a page the second sequence uses. */
    const int32_t page = s.table[1 * s.max_pages];
    s.table_dev[1 * s.max_pages] = -1;
    expect_rejected(&s, kv_scene_run(&s, &desc, 1, NULL), FA_ERROR_INVALID_VALUE, "block_table[1][0]");
    s.table_dev[1 * s.max_pages] = page;
    assert_int_equal(kv_scene_run(&s, &desc, 1, NULL), FA_SUCCESS); /* and the repaired call runs */
    kv_scene_free(&s);
}

/* Shape rules of the ragged form, checked before any table is read. */
static void test_ragged_shapes(void **state)
{
    fa_context *ctx = *state;
    const kv_layout l = {FA_DTYPE_F32, 4, 2, 16, 64, 0};
    const kv_seq seqs[2] = {{10, 1, 2, 1}, {5, 3, 1, 2}};
    kv_scene s;
    kv_scene_build(&s, ctx, &l, seqs, 2);
    fa_kv_cache cache;
    memset(&cache, 0, sizeof cache);
    cache.k = (fa_tensor){s.k_cache, l.dtype, 2, l.capacity, l.heads_kv, l.head_dim, 0, 0, 0};
    cache.v = cache.k;
    cache.v.data = s.v_cache;
    cache.cache_seqlens = s.cached_dev;
    const fa_tensor q = {s.q, l.dtype, 1, s.total_q, l.heads_q, l.head_dim, 0, 0, 0};
    fa_tensor out = q, k_new = {s.k_new, l.dtype, 1, s.total_new, l.heads_kv, l.head_dim, 0, 0, 0};
    out.data = s.out;
    fa_varlen vl = {2, s.cu_q_dev, NULL, 3, 0};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.varlen = &vl;
    /* k_new has 3 rows like q, but its own lengths (2, 1) differ from q's (1, 3): only an explicit
     * cu_seqlens_k says so; without it the rows are read as q's lengths, which is valid too. With 4
     * rows more than q and no cu_seqlens_k the shapes disagree. */
    size_t bytes = 1; /* the CPU's scratch is per call, on the host: no workspace to hand over */
    assert_int_equal(fa_workspace_size(ctx, &desc, &q, &cache, NULL, NULL, NULL, &out, s.lse, &bytes), FA_SUCCESS);
    assert_int_equal(bytes, 0);
    k_new.seqlen = s.total_q + 1;
    test_expect_error(fa_forward_kvcache(ctx, &desc, &q, &cache, &k_new, &k_new, &out, s.lse), FA_ERROR_INVALID_VALUE,
                      "k_new");
    k_new.seqlen = s.total_new;
    vl.cu_seqlens_k = s.cu_new_dev;
    test_expect_error(fa_forward_kvcache(ctx, &desc, &q, &cache, NULL, NULL, &out, s.lse), FA_ERROR_INVALID_VALUE,
                      "cu_seqlens_k");
    fa_tensor q2 = q;
    q2.batch = 2;
    q2.seqlen = 2;
    fa_tensor out2 = q2;
    out2.data = s.out;
    test_expect_error(fa_forward_kvcache(ctx, &desc, &q2, &cache, NULL, NULL, &out2, s.lse), FA_ERROR_INVALID_VALUE, "q");
    vl.batch = 3;
    test_expect_error(fa_forward_kvcache(ctx, &desc, &q, &cache, &k_new, &k_new, &out, s.lse), FA_ERROR_INVALID_VALUE,
                      "cache->k");
    kv_scene_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ragged_equals_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ragged_oracle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_invariance, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slots_and_left_padding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_serving_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ragged_shapes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

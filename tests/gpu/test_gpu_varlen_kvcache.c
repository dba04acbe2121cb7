/* Packed variable-length batches and fa_forward_kvcache on a GPU backend (a GPU or the emulated
 * suite), each against the CPU backend run on the same inputs (tests/core checks the CPU against
 * the oracle): outputs within the dtype's tolerance, the KV cache after the append identical byte
 * for byte, the GPU's results bit-identical across two runs. Tables in device memory that fail
 * their checks: the call writes nothing, and the next fa_synchronize returns
 * FA_ERROR_INVALID_VALUE naming the sequence. */
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
#include "gpu_tests.h"
#include "harness.h"
#include "test_arrays.h"

/* ---- packed variable-length batches ---------------------------------------------------------- */
typedef struct varlen_gpu_case {
    const char *name;
    int64_t batch, heads_q, heads_kv, head_dim;
    int32_t len_q[4], len_k[4];
    int causal;
    int32_t window_left;
    float dropout_p;
    int32_t block_q, block_k; /* 0: no block mask */
    int modifiers; /* 1: softcap, per-sequence ALiBi, sinks and a [batch, heads_q, max_q, max_k] bias, with
                      dsinks and dbias (fa_backward_ex); 2: the same with one [heads_q, max_q, max_k]
                      bias shared by the sequences (stride_batch 0: dbias sums them) */
} varlen_gpu_case;

static const varlen_gpu_case varlen_cases[] = {
    {"causal_gqa_empty_len1", 4, 4, 2, 32, {0, 1, 37, 70}, {5, 1, 37, 90}, 1, -1, 0.0f, 0, 0, 0},
    {"dropout_window_blocks", 3, 2, 2, 48, {7, 0, 20}, {9, 3, 33}, 0, 6, 0.2f, 16, 8, 0},
    {"modifiers_causal_gqa_dropout", 3, 4, 2, 32, {9, 0, 40}, {12, 5, 33}, 1, -1, 0.1f, 0, 0, 1},
    {"modifiers_shared_bias", 3, 2, 1, 16, {6, 0, 17}, {9, 4, 20}, 1, -1, 0.0f, 0, 0, 2},
    /* whole tiles of every kernel, each sequence starting on a tile boundary */
    {"full_tiles_gqa", 2, 2, 1, 32, {128, 256}, {128, 256}, 0, -1, 0.0f, 0, 0, 0},
};

/* The bias's batch extent: 1 when the sequences share it. */
static int64_t bias_batches(const varlen_gpu_case *c) { return c->modifiers == 2 ? 1 : c->batch; }

/* Forward and backward of case c on ctx; out, lse, dq, dk, dv fetched to the host. */
typedef struct varlen_result { void *out, *dq, *dk, *dv, *dbias; float *lse, *dsinks; } varlen_result;

static void varlen_run(fa_context *ctx, int on_device, const varlen_gpu_case *c, fa_dtype dtype, varlen_result *res)
{
    int32_t cu_q[5] = {0}, cu_k[5] = {0};
    int64_t max_q = 1, max_k = 1;
    for (int64_t b = 0; b < c->batch; ++b) {
        cu_q[b + 1] = cu_q[b] + c->len_q[b];
        cu_k[b + 1] = cu_k[b] + c->len_k[b];
        if (c->len_q[b] > max_q) max_q = c->len_q[b];
        if (c->len_k[b] > max_k) max_k = c->len_k[b];
    }
    const int64_t tq = cu_q[c->batch], tk = cu_k[c->batch], d = c->head_dim;
    const size_t nq = (size_t)(tq * c->heads_q * d), nk = (size_t)(tk * c->heads_kv * d);
    buffer q = buffer_new(ctx, nq, dtype, 1), k = buffer_new(ctx, nk, dtype, 2), v = buffer_new(ctx, nk, dtype, 3);
    buffer dout = buffer_new(ctx, nq, dtype, 4), out = buffer_new(ctx, nq, dtype, 0), dq = buffer_new(ctx, nq, dtype, 0);
    buffer dk = buffer_new(ctx, nk, dtype, 0), dv = buffer_new(ctx, nk, dtype, 0);
    buffer lse = buffer_new(ctx, (size_t)(c->heads_q * tq), FA_DTYPE_F32, 0);
    fa_varlen vl = {c->batch, cu_q, cu_k, max_q, max_k};
    if (on_device) {
        vl.cu_seqlens_q = table_upload(ctx, cu_q, (size_t)c->batch + 1);
        vl.cu_seqlens_k = table_upload(ctx, cu_k, (size_t)c->batch + 1);
    }
    uint8_t mask[64];
    fa_block_mask bm = {c->block_q, c->block_k, 0, 0, mask};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.varlen = &vl;
    desc.causal = c->causal;
    desc.window_left = c->window_left;
    desc.dropout_p = c->dropout_p;
    desc.dropout_seed = 99;
    desc.dropout_offset = 5;
    if (c->block_q) {
        bm.rows = (max_q + c->block_q - 1) / c->block_q;
        bm.cols = (max_k + c->block_k - 1) / c->block_k;
        assert_true(bm.rows * bm.cols <= (int64_t)sizeof mask);
        for (int64_t e = 0; e < bm.rows * bm.cols; ++e) mask[e] = (e * 3 + e / bm.cols) % 4 != 0;
        desc.block_mask = &bm;
    }
    const fa_tensor tq_ = {q.dev, dtype, 1, tq, c->heads_q, d, 0, 0, 0}, tk_ = {k.dev, dtype, 1, tk, c->heads_kv, d, 0, 0, 0};
    fa_tensor tv_ = tk_, to_ = tq_, tdo_ = tq_, tdq_ = tq_, tdk_ = tk_, tdv_ = tk_;
    tv_.data = v.dev;
    to_.data = out.dev;
    tdo_.data = dout.dev;
    tdq_.data = dq.dev;
    tdk_.data = dk.dev;
    tdv_.data = dv.dev;
    /* the modifiers' arrays and gradients (empty without them), in the context's memory */
    const int mods = c->modifiers;
    const size_t bias_n = mods ? (size_t)(bias_batches(c) * c->heads_q * max_q * max_k) : 0;
    buffer slopes = buffer_new(ctx, mods ? (size_t)(c->batch * c->heads_q) : 0, FA_DTYPE_F32, 5);
    buffer sinks = buffer_new(ctx, mods ? (size_t)c->heads_q : 0, FA_DTYPE_F32, 6);
    buffer dsinks = buffer_new(ctx, mods ? (size_t)c->heads_q : 0, FA_DTYPE_F32, 0);
    buffer bias = buffer_new(ctx, bias_n, dtype, 7), dbias = buffer_new(ctx, bias_n, dtype, 0);
    const fa_bias bias_desc = {bias.dev, dtype, mods == 2 ? 0 : c->heads_q * max_q * max_k, max_q * max_k, max_k};
    fa_bias dbias_desc = bias_desc;
    dbias_desc.data = dbias.dev;
    if (mods) {
        desc.softcap = 2.0f;
        desc.alibi_slopes = slopes.dev;
        desc.alibi_per_batch = 1;
        desc.sinks = sinks.dev;
        desc.bias = &bias_desc;
    }
    fa_status st = fa_forward(ctx, &desc, &tq_, &tk_, &tv_, &to_, lse.dev);
    if (st == FA_SUCCESS)
        st = fa_backward_ex(ctx, &desc, &tq_, &tk_, &tv_, &to_, &tdo_, lse.dev, &tdq_, &tdk_, &tdv_,
                            mods ? dsinks.dev : NULL, mods ? &dbias_desc : NULL);
    if (st == FA_SUCCESS) st = fa_synchronize(ctx);
    if (st != FA_SUCCESS) fail_msg("%s on %s: %s", c->name, fa_backend_name(fa_context_backend(ctx)), fa_last_error());
    res->out = buffer_fetch(ctx, &out);
    res->dq = buffer_fetch(ctx, &dq);
    res->dk = buffer_fetch(ctx, &dk);
    res->dv = buffer_fetch(ctx, &dv);
    res->lse = buffer_fetch(ctx, &lse);
    res->dsinks = buffer_fetch(ctx, &dsinks);
    res->dbias = buffer_fetch(ctx, &dbias);
    if (on_device) {
        fa_free(ctx, (void *)vl.cu_seqlens_q);
        fa_free(ctx, (void *)vl.cu_seqlens_k);
    }
    buffer *all[] = {&q, &k, &v, &dout, &out, &dq, &dk, &dv, &lse, &slopes, &sinks, &dsinks, &bias, &dbias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) buffer_free(ctx, all[i]);
}

static void varlen_result_free(varlen_result *r)
{
    free(r->out);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->lse);
    free(r->dsinks);
    free(r->dbias);
}

static void check_varlen(void **state, fa_dtype dtype)
{
    fa_context *ctx = context_or_skip(state), *cpu;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &cpu), FA_SUCCESS);
    for (size_t i = 0; i < sizeof varlen_cases / sizeof varlen_cases[0]; ++i) {
        const varlen_gpu_case *c = &varlen_cases[i];
        varlen_result gpu, again, ref;
        varlen_run(ctx, 1, c, dtype, &gpu);
        varlen_run(cpu, 0, c, dtype, &ref);
        int64_t tq = 0, tk = 0;
        for (int64_t b = 0; b < c->batch; ++b) {
            tq += c->len_q[b];
            tk += c->len_k[b];
        }
        const size_t nq = (size_t)(tq * c->heads_q * c->head_dim), nk = (size_t)(tk * c->heads_kv * c->head_dim);
        expect_close("out", c->name, gpu.out, ref.out, nq, dtype);
        expect_close("lse", c->name, gpu.lse, ref.lse, (size_t)(tq * c->heads_q), FA_DTYPE_F32);
        expect_close("dq", c->name, gpu.dq, ref.dq, nq, dtype);
        expect_close("dk", c->name, gpu.dk, ref.dk, nk, dtype);
        expect_close("dv", c->name, gpu.dv, ref.dv, nk, dtype);
        if (c->modifiers) {
            int64_t max_q = 1, max_k = 1;
            for (int64_t b = 0; b < c->batch; ++b) {
                if (c->len_q[b] > max_q) max_q = c->len_q[b];
                if (c->len_k[b] > max_k) max_k = c->len_k[b];
            }
            expect_close_as("dsinks", c->name, gpu.dsinks, ref.dsinks, (size_t)c->heads_q, FA_DTYPE_F32, dtype);
            expect_close("dbias", c->name, gpu.dbias, ref.dbias, (size_t)(bias_batches(c) * c->heads_q * max_q * max_k),
                         dtype);
        }
        varlen_run(ctx, 1, c, dtype, &again); /* a second run: the same bits */
        assert_memory_equal(again.out, gpu.out, nq * dtype_size(dtype));
        assert_memory_equal(again.dk, gpu.dk, nk * dtype_size(dtype));
        varlen_result_free(&gpu);
        varlen_result_free(&again);
        varlen_result_free(&ref);
    }
    fa_context_destroy(cpu);
}
void test_gpu_varlen_f32(void **state) { check_varlen(state, FA_DTYPE_F32); }
void test_gpu_varlen_f16(void **state) { check_varlen(state, FA_DTYPE_F16); }
void test_gpu_varlen_bf16(void **state) { check_varlen(state, FA_DTYPE_BF16); }

/* ---- KV cache ---------------------------------------------------------------------------------- */
typedef struct kv_gpu_case {
    const char *name;
    int64_t batch, heads_q, heads_kv, head_dim, seqlen_q, seqlen_new;
    int64_t page_size; /* 0: contiguous */
    int64_t capacity;  /* tokens per sequence */
    int32_t cached[3];
    int causal;
    int32_t window_left;
    int modifiers; /* 1: softcap, per-sequence ALiBi, sinks, a [batch, heads_q, seqlen_q, capacity] bias */
} kv_gpu_case;

static const kv_gpu_case kv_cases[] = {
    {"contiguous_decode_gqa8", 2, 8, 1, 64, 1, 1, 0, 300, {250, 7}, 1, -1, 0},
    {"paged16_q3_window", 3, 4, 2, 32, 3, 3, 16, 1024, {600, 0, 33}, 1, 20, 0},
    {"paged5_noncausal_q4", 2, 4, 4, 16, 4, 0, 5, 100, {37, 99}, 0, -1, 0},
    /* split keys (600 cached) and a sequence with no key (lse = the sink) */
    {"modifiers_paged16_gqa", 3, 4, 2, 32, 2, 0, 16, 1024, {600, 0, 33}, 1, -1, 1},
    {"modifiers_contiguous_window", 2, 8, 1, 64, 1, 1, 0, 300, {250, 7}, 1, 30, 1},
};

/* One call's tensors and tables; `cache_seqlens` and `table` point at host or device copies. */
typedef struct kv_run {
    buffer q, k_new, v_new, k_cache, v_cache, out, lse, slopes, sinks, bias;
    int32_t cached[3], *table, *cached_dev, *table_dev;
    int64_t slots, slot_len, max_pages;
} kv_run;

static void kv_setup(fa_context *ctx, const kv_gpu_case *c, fa_dtype dtype, kv_run *r)
{
    memset(r, 0, sizeof *r);
    memcpy(r->cached, c->cached, sizeof r->cached);
    const int64_t d = c->head_dim;
    if (c->page_size) {
        r->slot_len = c->page_size;
        r->max_pages = c->capacity / c->page_size;
        r->slots = c->batch * r->max_pages + 2; /* 2 unused pages */
        r->table = test_page_table(c->batch, r->max_pages, r->slots);
        assert_non_null(r->table);
    } else {
        r->slot_len = c->capacity;
        r->slots = c->batch;
    }
    const size_t cache_n = (size_t)(r->slots * r->slot_len * c->heads_kv * d);
    r->q = buffer_new(ctx, (size_t)(c->batch * c->seqlen_q * c->heads_q * d), dtype, 11);
    r->k_new = buffer_new(ctx, (size_t)(c->batch * c->seqlen_new * c->heads_kv * d), dtype, 12);
    r->v_new = buffer_new(ctx, (size_t)(c->batch * c->seqlen_new * c->heads_kv * d), dtype, 13);
    r->k_cache = buffer_new(ctx, cache_n, dtype, 14);
    r->v_cache = buffer_new(ctx, cache_n, dtype, 15);
    r->out = buffer_new(ctx, (size_t)(c->batch * c->seqlen_q * c->heads_q * d), dtype, 0);
    r->lse = buffer_new(ctx, (size_t)(c->batch * c->heads_q * c->seqlen_q), FA_DTYPE_F32, 0);
    const int mods = c->modifiers;
    r->slopes = buffer_new(ctx, mods ? (size_t)(c->batch * c->heads_q) : 0, FA_DTYPE_F32, 16);
    r->sinks = buffer_new(ctx, mods ? (size_t)c->heads_q : 0, FA_DTYPE_F32, 17);
    r->bias = buffer_new(ctx, mods ? (size_t)(c->batch * c->heads_q * c->seqlen_q * c->capacity) : 0, dtype, 18);
}

/* The call on ctx; tables from host memory (CPU) or uploaded (GPU). */
static fa_status kv_call(fa_context *ctx, int on_device, const kv_gpu_case *c, kv_run *r)
{
    const fa_dtype dtype = r->q.dtype;
    const int64_t d = c->head_dim;
    fa_kv_cache cache;
    memset(&cache, 0, sizeof cache);
    cache.k = (fa_tensor){r->k_cache.dev, dtype, r->slots, r->slot_len, c->heads_kv, d, 0, 0, 0};
    cache.v = cache.k;
    cache.v.data = r->v_cache.dev;
    cache.cache_seqlens = r->cached;
    cache.block_table = r->table;
    cache.max_pages_per_seq = r->max_pages;
    if (on_device) {
        if (!r->cached_dev) r->cached_dev = table_upload(ctx, r->cached, (size_t)c->batch);
        if (r->table && !r->table_dev) r->table_dev = table_upload(ctx, r->table, (size_t)(c->batch * r->max_pages));
        cache.cache_seqlens = r->cached_dev;
        cache.block_table = r->table_dev;
    }
    const fa_tensor q = {r->q.dev, dtype, c->batch, c->seqlen_q, c->heads_q, d, 0, 0, 0};
    const fa_tensor k_new = {r->k_new.dev, dtype, c->batch, c->seqlen_new, c->heads_kv, d, 0, 0, 0};
    fa_tensor v_new = k_new, out = q;
    v_new.data = r->v_new.dev;
    out.data = r->out.dev;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = c->causal;
    desc.window_left = c->window_left;
    desc.kv_split_tokens = 256; /* long caches split into several chunks, merged (the default's 1024 rarely) */
    const fa_bias bias = {r->bias.dev, dtype, c->heads_q * c->seqlen_q * c->capacity, c->seqlen_q * c->capacity,
                          c->capacity};
    if (c->modifiers) {
        desc.softcap = 3.0f;
        desc.alibi_slopes = r->slopes.dev;
        desc.alibi_per_batch = 1;
        desc.sinks = r->sinks.dev;
        desc.bias = &bias;
    }
    return fa_forward_kvcache(ctx, &desc, &q, &cache, c->seqlen_new ? &k_new : NULL, c->seqlen_new ? &v_new : NULL,
                              &out, r->lse.dev);
}

static void kv_free(fa_context *ctx, kv_run *r)
{
    buffer *all[] = {&r->q, &r->k_new, &r->v_new, &r->k_cache, &r->v_cache, &r->out, &r->lse, &r->slopes, &r->sinks,
                     &r->bias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) buffer_free(ctx, all[i]);
    if (r->cached_dev) fa_free(ctx, r->cached_dev);
    if (r->table_dev) fa_free(ctx, r->table_dev);
    free(r->table);
}

static void check_kvcache(void **state, fa_dtype dtype)
{
    fa_context *ctx = context_or_skip(state), *cpu;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &cpu), FA_SUCCESS);
    for (size_t i = 0; i < sizeof kv_cases / sizeof kv_cases[0]; ++i) {
        const kv_gpu_case *c = &kv_cases[i];
        kv_run gpu, ref;
        kv_setup(ctx, c, dtype, &gpu);
        kv_setup(cpu, c, dtype, &ref);
        if (kv_call(ctx, 1, c, &gpu) != FA_SUCCESS || fa_synchronize(ctx) != FA_SUCCESS)
            fail_msg("%s on %s: %s", c->name, fa_backend_name(fa_context_backend(ctx)), fa_last_error());
        assert_int_equal(kv_call(cpu, 0, c, &ref), FA_SUCCESS);
        void *out = buffer_fetch(ctx, &gpu.out), *lse = buffer_fetch(ctx, &gpu.lse);
        void *k_cache = buffer_fetch(ctx, &gpu.k_cache), *v_cache = buffer_fetch(ctx, &gpu.v_cache);
        void *ref_out = buffer_fetch(cpu, &ref.out), *ref_lse = buffer_fetch(cpu, &ref.lse);
        void *ref_k = buffer_fetch(cpu, &ref.k_cache), *ref_v = buffer_fetch(cpu, &ref.v_cache);
        expect_close("out", c->name, out, ref_out, gpu.out.n, dtype);
        expect_close("lse", c->name, lse, ref_lse, gpu.lse.n, FA_DTYPE_F32);
        assert_memory_equal(k_cache, ref_k, gpu.k_cache.n * dtype_size(dtype)); /* the append, byte for byte */
        assert_memory_equal(v_cache, ref_v, gpu.v_cache.n * dtype_size(dtype));
        /* Again (the append rewrites the same slots): the same bits. */
        assert_int_equal(kv_call(ctx, 1, c, &gpu), FA_SUCCESS);
        void *again = buffer_fetch(ctx, &gpu.out);
        assert_memory_equal(again, out, gpu.out.n * dtype_size(dtype));
        void *held[] = {out, lse, k_cache, v_cache, ref_out, ref_lse, ref_k, ref_v, again};
        for (size_t h = 0; h < sizeof held / sizeof held[0]; ++h) free(held[h]);
        kv_free(ctx, &gpu);
        kv_free(cpu, &ref);
    }
    fa_context_destroy(cpu);
}
void test_gpu_kvcache_f32(void **state) { check_kvcache(state, FA_DTYPE_F32); }
void test_gpu_kvcache_f16(void **state) { check_kvcache(state, FA_DTYPE_F16); }

/* A NaN key in one chunk of a split decode: the merge (merge_rule.h) poisons exactly the rows that
 * saw it, out and lse NaN, on the GPU as on the CPU; every other row stays finite and close. */
void test_gpu_kvcache_nan(void **state)
{
    fa_context *ctx = context_or_skip(state), *cpu;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &cpu), FA_SUCCESS);
    /* 900 and 700 keys: both backends cut them into 256-key chunks (kv_call's split). */
    static const kv_gpu_case c = {"nan_split", 2, 4, 2, 32, 1, 0, 0, 1024, {900, 700}, 0, -1, 0};
    kv_run gpu, ref;
    kv_setup(ctx, &c, FA_DTYPE_F32, &gpu);
    kv_setup(cpu, &c, FA_DTYPE_F32, &ref);
    const size_t at = (size_t)((0 * c.capacity + 400) * c.heads_kv + 0) * (size_t)c.head_dim; /* seq 0, key 400, kv head 0 */
    ((float *)gpu.k_cache.host)[at] = NAN;
    ((float *)ref.k_cache.host)[at] = NAN;
    const size_t bytes = gpu.k_cache.n * sizeof(float);
    assert_int_equal(fa_memcpy_h2d(ctx, gpu.k_cache.dev, gpu.k_cache.host, bytes), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(cpu, ref.k_cache.dev, ref.k_cache.host, bytes), FA_SUCCESS);
    if (kv_call(ctx, 1, &c, &gpu) != FA_SUCCESS || fa_synchronize(ctx) != FA_SUCCESS)
        fail_msg("%s: %s", c.name, fa_last_error());
    assert_int_equal(kv_call(cpu, 0, &c, &ref), FA_SUCCESS);
    const float *lse = buffer_fetch(ctx, &gpu.lse), *ref_lse = buffer_fetch(cpu, &ref.lse);
    const float *out = buffer_fetch(ctx, &gpu.out), *ref_out = buffer_fetch(cpu, &ref.out);
    for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t h = 0; h < c.heads_q; ++h) {
            const int64_t row = b * c.heads_q + h; /* lse [batch, heads_q, seqlen_q = 1] */
            const int poisoned = b == 0 && h < c.heads_q / c.heads_kv; /* the query heads of kv head 0 */
            if (poisoned != (isnan(lse[row]) != 0) || poisoned != (isnan(ref_lse[row]) != 0))
                fail_msg("lse of sequence %lld, head %lld: GPU %g, CPU %g, NaN expected: %d", (long long)b,
                         (long long)h, (double)lse[row], (double)ref_lse[row], poisoned);
            if (!poisoned) assert_true(fabsf(lse[row] - ref_lse[row]) <= 1e-4f * (1.0f + fabsf(ref_lse[row])));
            for (int64_t x = 0; x < c.head_dim; ++x) {
                const float o = out[row * c.head_dim + x], r = ref_out[row * c.head_dim + x];
                if (poisoned ? !(isnan(o) && isnan(r)) : !(fabsf(o - r) <= 1e-4f))
                    fail_msg("out of sequence %lld, head %lld, dim %lld: GPU %g, CPU %g", (long long)b, (long long)h,
                             (long long)x, (double)o, (double)r);
            }
        }
    free((void *)lse);
    free((void *)ref_lse);
    free((void *)out);
    free((void *)ref_out);
    kv_free(ctx, &gpu);
    kv_free(cpu, &ref);
    fa_context_destroy(cpu);
}

/* ---- tables in device memory that fail their checks --------------------------------------------- */

/* The call returned FA_SUCCESS (only shapes are checked on the host); the next synchronize names
 * the table; out and the cache keep every byte; the synchronize after that succeeds. */
static void expect_deferred_error(fa_context *ctx, const char *prefix, const buffer *const *kept, size_t count)
{
    const fa_status st = fa_synchronize(ctx);
    print_message("  fa_synchronize: %s: %s\n", fa_status_string(st), fa_last_error());
    assert_int_equal(st, FA_ERROR_INVALID_VALUE);
    assert_memory_equal(fa_last_error(), prefix, strlen(prefix));
    for (size_t i = 0; i < count; ++i) {
        void *now = buffer_fetch(ctx, kept[i]);
        assert_memory_equal(now, kept[i]->host, kept[i]->n * dtype_size(kept[i]->dtype));
        free(now);
    }
    assert_int_equal(fa_synchronize(ctx), FA_SUCCESS);
}

void test_gpu_bad_tables(void **state)
{
    fa_context *ctx = context_or_skip(state);
    static const kv_gpu_case contiguous = {"bad", 2, 4, 2, 16, 2, 1, 0, 20, {3, 20}, 1, -1, 0}; /* 20 + 1 > 20 */
    static const kv_gpu_case paged = {"bad_paged", 2, 4, 2, 16, 2, 1, 4, 20, {3, 10}, 1, -1, 0};
    kv_run r;
    kv_setup(ctx, &contiguous, FA_DTYPE_F32, &r);
    assert_int_equal(kv_call(ctx, 1, &contiguous, &r), FA_SUCCESS);
    const buffer *kept[] = {&r.k_cache, &r.v_cache, &r.out, &r.lse};
    /* The host validator's words (table_checks.h), then where the check ran. */
    expect_deferred_error(ctx, "cache->cache_seqlens[1]: sequence 1 needs 21 tokens (20 cached + 1 new), more than the "
                               "capacity 20 (checked on the device", kept, 4);
    kv_free(ctx, &r);

    kv_setup(ctx, &paged, FA_DTYPE_F32, &r);
    r.table[1 * r.max_pages + 0] = (int32_t)r.slots; /* one past the last page */
    assert_int_equal(kv_call(ctx, 1, &paged, &r), FA_SUCCESS);
    const buffer *kept_paged[] = {&r.k_cache, &r.v_cache, &r.out, &r.lse};
    expect_deferred_error(ctx, "cache->block_table[1][0]", kept_paged, 4);
    kv_free(ctx, &r);

    /* Packed batch with decreasing key offsets: forward and backward write nothing. */
    enum { H = 2, D = 16, TQ = 9, TK = 9 };
    static const int32_t cu_q[4] = {0, 3, 3, 9}, cu_k[4] = {0, 5, 4, 9};
    buffer q = buffer_new(ctx, TQ * H * D, FA_DTYPE_F32, 1), k = buffer_new(ctx, TK * H * D, FA_DTYPE_F32, 2);
    buffer out = buffer_new(ctx, TQ * H * D, FA_DTYPE_F32, 0), lse = buffer_new(ctx, TQ * H, FA_DTYPE_F32, 0);
    buffer dq = buffer_new(ctx, TQ * H * D, FA_DTYPE_F32, 0), dk = buffer_new(ctx, TK * H * D, FA_DTYPE_F32, 0);
    fa_varlen vl = {3, table_upload(ctx, cu_q, 4), table_upload(ctx, cu_k, 4), 6, 5};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.varlen = &vl;
    const fa_tensor tq = {q.dev, FA_DTYPE_F32, 1, TQ, H, D, 0, 0, 0}, tk = {k.dev, FA_DTYPE_F32, 1, TK, H, D, 0, 0, 0};
    fa_tensor to = tq, tdq = tq, tdk = tk;
    to.data = out.dev;
    tdq.data = dq.dev;
    tdk.data = dk.dev;
    assert_int_equal(fa_forward(ctx, &desc, &tq, &tk, &tk, &to, lse.dev), FA_SUCCESS);
    const buffer *kept_varlen[] = {&out, &lse};
    expect_deferred_error(ctx, "desc->varlen->cu_seqlens_k[2]", kept_varlen, 2);
    assert_int_equal(fa_backward(ctx, &desc, &tq, &tk, &tk, &tq, &tq, lse.dev, &tdq, &tdk, &tdk), FA_SUCCESS);
    const buffer *kept_grads[] = {&dq, &dk};
    expect_deferred_error(ctx, "desc->varlen->cu_seqlens_k[2]", kept_grads, 2);
    /* ... nor dsinks and dbias (seeded, so that any write shows). */
    buffer sinks = buffer_new(ctx, H, FA_DTYPE_F32, 3), dsinks = buffer_new(ctx, H, FA_DTYPE_F32, 4);
    buffer dbias = buffer_new(ctx, 3 * H * 6 * 5, FA_DTYPE_F32, 5), bias = buffer_new(ctx, 3 * H * 6 * 5, FA_DTYPE_F32, 6);
    const fa_bias bias_desc = {bias.dev, FA_DTYPE_F32, H * 6 * 5, 6 * 5, 5};
    fa_bias dbias_desc = bias_desc;
    dbias_desc.data = dbias.dev;
    desc.sinks = sinks.dev;
    desc.bias = &bias_desc;
    assert_int_equal(fa_backward_ex(ctx, &desc, &tq, &tk, &tk, &tq, &tq, lse.dev, &tdq, &tdk, &tdk, dsinks.dev, &dbias_desc),
                     FA_SUCCESS);
    const buffer *kept_modifier_grads[] = {&dsinks, &dbias};
    expect_deferred_error(ctx, "desc->varlen->cu_seqlens_k[2]", kept_modifier_grads, 2);
    fa_free(ctx, (void *)vl.cu_seqlens_q);
    fa_free(ctx, (void *)vl.cu_seqlens_k);
    buffer *all[] = {&q, &k, &out, &lse, &dq, &dk, &sinks, &dsinks, &dbias, &bias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) buffer_free(ctx, all[i]);
}

/* ALiBi slopes and sinks live in device memory: a NaN slope or a +inf sink is found on the device
 * (as the CPU finds it on the host), the call writes nothing (outputs seeded, so any write shows),
 * and the next synchronize names the element. Forward, backward (with dsinks and dbias) and the
 * KV cache. */
void test_gpu_bad_modifier_values(void **state)
{
    fa_context *ctx = context_or_skip(state);
    enum { B = 2, H = 2, S = 7, D = 16 };
    buffer q = buffer_new(ctx, B * S * H * D, FA_DTYPE_F32, 1), out = buffer_new(ctx, B * S * H * D, FA_DTYPE_F32, 2);
    buffer lse = buffer_new(ctx, B * H * S, FA_DTYPE_F32, 3), dq = buffer_new(ctx, B * S * H * D, FA_DTYPE_F32, 4);
    buffer dk = buffer_new(ctx, B * S * H * D, FA_DTYPE_F32, 5), dv = buffer_new(ctx, B * S * H * D, FA_DTYPE_F32, 6);
    buffer slopes = buffer_new(ctx, H, FA_DTYPE_F32, 7), sinks = buffer_new(ctx, H, FA_DTYPE_F32, 8);
    buffer dsinks = buffer_new(ctx, H, FA_DTYPE_F32, 9), dbias = buffer_new(ctx, H * S * S, FA_DTYPE_F32, 10);
    buffer bias = buffer_new(ctx, H * S * S, FA_DTYPE_F32, 11);
    const float nan_slope = NAN, inf_sink = INFINITY;
    assert_int_equal(fa_memcpy_h2d(ctx, (float *)slopes.dev + 1, &nan_slope, sizeof nan_slope), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, (float *)sinks.dev + 1, &inf_sink, sizeof inf_sink), FA_SUCCESS);
    const fa_tensor t = {q.dev, FA_DTYPE_F32, B, S, H, D, 0, 0, 0};
    fa_tensor to = t, tdq = t, tdk = t, tdv = t;
    to.data = out.dev;
    tdq.data = dq.dev;
    tdk.data = dk.dev;
    tdv.data = dv.dev;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    desc.alibi_slopes = slopes.dev;
    assert_int_equal(fa_forward(ctx, &desc, &t, &t, &t, &to, lse.dev), FA_SUCCESS);
    const buffer *kept_forward[] = {&out, &lse};
    expect_deferred_error(ctx, "desc->alibi_slopes[1]: nan is not finite", kept_forward, 2);

    const fa_bias bias_desc = {bias.dev, FA_DTYPE_F32, 0, S * S, S};
    fa_bias dbias_desc = bias_desc;
    dbias_desc.data = dbias.dev;
    desc.alibi_slopes = NULL;
    desc.sinks = sinks.dev;
    desc.bias = &bias_desc;
    assert_int_equal(fa_backward_ex(ctx, &desc, &t, &t, &t, &t, &t, lse.dev, &tdq, &tdk, &tdv, dsinks.dev, &dbias_desc),
                     FA_SUCCESS);
    const buffer *kept_backward[] = {&dq, &dk, &dv, &dsinks, &dbias};
    expect_deferred_error(ctx, "desc->sinks[1]: inf is NaN or +inf", kept_backward, 5);

    /* The KV cache: q and the (contiguous) cache of S tokens with 3 cached, one appended. */
    const int32_t cached[B] = {3, 3};
    int32_t *cached_dev = table_upload(ctx, cached, B);
    const fa_tensor one = {q.dev, FA_DTYPE_F32, B, 1, H, D, 0, 0, 0};
    fa_tensor one_out = one;
    one_out.data = out.dev;
    fa_kv_cache cache = {t, t, NULL, 0, cached_dev};
    cache.k.data = dk.dev;
    cache.v.data = dv.dev;
    desc.sinks = NULL;
    desc.bias = NULL;
    desc.alibi_slopes = slopes.dev;
    assert_int_equal(fa_forward_kvcache(ctx, &desc, &one, &cache, &one, &one, &one_out, lse.dev), FA_SUCCESS);
    const buffer *kept_kvcache[] = {&out, &lse, &dk, &dv};
    expect_deferred_error(ctx, "desc->alibi_slopes[1]", kept_kvcache, 4);

    /* Later calls run again: a valid forward writes out. */
    desc.alibi_slopes = NULL;
    assert_int_equal(fa_forward(ctx, &desc, &t, &t, &t, &to, lse.dev), FA_SUCCESS);
    assert_int_equal(fa_synchronize(ctx), FA_SUCCESS);
    void *now = buffer_fetch(ctx, &out);
    assert_true(memcmp(now, out.host, out.n * sizeof(float)) != 0);
    free(now);
    fa_free(ctx, cached_dev);
    buffer *all[] = {&q, &out, &lse, &dq, &dk, &dv, &slopes, &sinks, &dsinks, &dbias, &bias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) buffer_free(ctx, all[i]);
}

/* fa_forward_kvcache's serving forms on a GPU backend (or the emulator): a ragged step of mixed
 * query lengths over a paged and a contiguous cache against the CPU backend (close values, the
 * same cache bytes), batch invariance of the split on the device (each sequence alone and inside
 * batches, bit for bit), cache slots with left padding against the CPU, and device tables that
 * fail their checks (reported by the next fa_synchronize, nothing written). Sized for the
 * emulator: a few thousand keys in all. */
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
#include "kv_scene.h"
#include "test_util.h"

static const kv_seq mixed[] = {{600, 1, 1, 1}, {20, 5, 5, 2}, {40, 0, 3, 3}, {0, 3, 3, 4}, {300, 2, 0, 5}};
#define MIXED_N (int)(sizeof mixed / sizeof mixed[0])

/* Sequence by sequence: out and lse close to the CPU's, the cache the same bytes. */
static void expect_like_cpu(kv_scene *gpu, kv_scene *cpu, int ragged, const char *what)
{
    for (int b = 0; b < gpu->n; ++b) {
        kv_seq_result g, c;
        kv_scene_result(gpu, b, ragged, &g);
        kv_scene_result(cpu, b, ragged, &c);
        char name[96];
        snprintf(name, sizeof name, "%s, sequence %d", what, b);
        const fa_dtype dtype = gpu->layout.dtype;
        expect_close("out", name, g.out, c.out, g.out_bytes / dtype_size(dtype), dtype);
        expect_close("lse", name, g.lse, c.lse, g.lse_count, FA_DTYPE_F32);
        assert_memory_equal(g.k, c.k, g.cache_bytes);
        assert_memory_equal(g.v, c.v, g.cache_bytes);
        kv_seq_result_free(&g);
        kv_seq_result_free(&c);
    }
}

static void ragged_against_cpu(fa_context *ctx, fa_context *cpu, fa_dtype dtype, int64_t page_size, int modifiers)
{
    const kv_layout l = {dtype, 4, 2, 32, 640, page_size};
    float sinks_host[4] = {-1.0f, 0.5f, 2.0f, -3.0f};
    void *sinks_gpu;
    assert_int_equal(fa_malloc(ctx, sizeof sinks_host, &sinks_gpu), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, sinks_gpu, sinks_host, sizeof sinks_host), FA_SUCCESS);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    desc.window_left = 250;
    if (modifiers) desc.softcap = 4.0f;
    kv_scene g, c;
    kv_scene_build(&g, ctx, &l, mixed, MIXED_N);
    kv_scene_build(&c, cpu, &l, mixed, MIXED_N);
    desc.sinks = modifiers ? sinks_gpu : NULL;
    if (kv_scene_run(&g, &desc, 1, NULL) != FA_SUCCESS || fa_synchronize(ctx) != FA_SUCCESS)
        fail_msg("ragged on %s: %s", fa_backend_name(fa_context_backend(ctx)), fa_last_error());
    desc.sinks = modifiers ? sinks_host : NULL;
    assert_int_equal(kv_scene_run(&c, &desc, 1, NULL), FA_SUCCESS);
    char what[64];
    snprintf(what, sizeof what, "ragged %s %s%s", fa_dtype_label(dtype), page_size ? "paged" : "contiguous",
             modifiers ? " softcap+sinks" : "");
    expect_like_cpu(&g, &c, 1, what);
    kv_scene_free(&g);
    kv_scene_free(&c);
    fa_free(ctx, sinks_gpu);
}

void test_gpu_serving_ragged(void **state)
{
    fa_context *ctx = context_or_skip(state), *cpu;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &cpu), FA_SUCCESS);
    ragged_against_cpu(ctx, cpu, FA_DTYPE_F32, 16, 0);
    ragged_against_cpu(ctx, cpu, FA_DTYPE_F16, 0, 0);
    ragged_against_cpu(ctx, cpu, FA_DTYPE_BF16, 7, 1);
    fa_context_destroy(cpu);
}

/* Each sequence of a small pool alone (padded, batch 1) and inside ragged batches of 3 and 6 in
 * two orders, default split (two chunks past 1024 keys) and a 100-key split: the same bits. */
void test_gpu_serving_invariance(void **state)
{
    fa_context *ctx = context_or_skip(state);
    static const kv_seq pool[6] = {{1100, 1, 1, 11}, {255, 1, 1, 12}, {257, 2, 2, 13}, {30, 1, 1, 14}, {520, 1, 1, 15},
                                   {0, 1, 1, 16}};
    const kv_layout l = {FA_DTYPE_F16, 4, 2, 32, 1120, 32};
    for (int split = 0; split < 2; ++split) {
        fa_attention_desc desc;
        fa_attention_desc_init(&desc);
        desc.causal = 1;
        desc.kv_split_tokens = split ? 100 : 0;
        kv_seq_result alone[6];
        for (int b = 0; b < 6; ++b) {
            kv_scene one;
            kv_scene_build(&one, ctx, &l, &pool[b], 1);
            if (kv_scene_run(&one, &desc, 0, NULL) != FA_SUCCESS || fa_synchronize(ctx) != FA_SUCCESS)
                fail_msg("alone: %s", fa_last_error());
            kv_scene_result(&one, 0, 0, &alone[b]);
            kv_scene_free(&one);
        }
        static const int batches[3][7] = {{3, 0, 1, 2}, {6, 5, 4, 3, 2, 1, 0}, {3, 4, 2, 5}}; /* count, then members */
        for (int x = 0; x < 3; ++x) {
            const int count = batches[x][0];
            kv_seq members[6];
            for (int m = 0; m < count; ++m) members[m] = pool[batches[x][1 + m]];
            kv_scene s;
            kv_scene_build(&s, ctx, &l, members, count);
            if (kv_scene_run(&s, &desc, 1, NULL) != FA_SUCCESS || fa_synchronize(ctx) != FA_SUCCESS)
                fail_msg("batch: %s", fa_last_error());
            for (int m = 0; m < count; ++m) {
                kv_seq_result r;
                kv_scene_result(&s, m, 1, &r);
                char what[96];
                snprintf(what, sizeof what, "%s split, batch %d, sequence %d (%d cached)", split ? "100-key" : "default",
                         x, m, members[m].cached);
                kv_expect_same(&r, &alone[batches[x][1 + m]], what);
                kv_seq_result_free(&r);
            }
            kv_scene_free(&s);
        }
        for (int b = 0; b < 6; ++b) kv_seq_result_free(&alone[b]);
    }
}

/* Slots and left padding on a five-row contiguous cache, the same call on both backends. */
static fa_status slots_call(fa_context *ctx, kv_scene *s, const int32_t *idx, const int32_t *pad, const int32_t *cached)
{
    const kv_layout *l = &s->layout;
    int32_t *tables;
    assert_int_equal(fa_malloc(ctx, 9 * sizeof(int32_t), (void **)&tables), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, tables, idx, 3 * sizeof(int32_t)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, tables + 3, pad, 3 * sizeof(int32_t)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, tables + 6, cached, 3 * sizeof(int32_t)), FA_SUCCESS);
    fa_kv_slots slots;
    fa_kv_slots_init(&slots);
    slots.cache_batch_idx = tables;
    slots.cache_leftpad = tables + 3;
    fa_kv_cache cache;
    memset(&cache, 0, sizeof cache);
    cache.k = (fa_tensor){s->k_cache, l->dtype, 5, l->capacity, l->heads_kv, l->head_dim, 0, 0, 0};
    cache.v = cache.k;
    cache.v.data = s->v_cache;
    cache.cache_seqlens = tables + 6;
    const fa_tensor q = {s->q, l->dtype, 3, 2, l->heads_q, l->head_dim, 0, 0, 0};
    const fa_tensor k_new = {s->k_new, l->dtype, 3, 2, l->heads_kv, l->head_dim, 0, 0, 0};
    fa_tensor v_new = k_new, out = q;
    v_new.data = s->v_new;
    out.data = s->out;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    fa_status st = fa_forward_kvcache_ex(ctx, &desc, &q, &cache, &slots, &k_new, &v_new, &out, s->lse);
    const fa_status synced = fa_synchronize(ctx);
    if (st == FA_SUCCESS) st = synced;
    fa_free(ctx, tables);
    return st;
}

void test_gpu_serving_slots(void **state)
{
    fa_context *ctx = context_or_skip(state), *cpu;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &cpu), FA_SUCCESS);
    const kv_layout l = {FA_DTYPE_F32, 4, 2, 16, 64, 0};
    const kv_seq rows[5] = {{20, 2, 2, 1}, {30, 2, 2, 2}, {40, 2, 2, 3}, {12, 2, 2, 4}, {50, 2, 2, 5}};
    static const int32_t idx[3] = {3, 0, 4}, pad[3] = {2, 0, 7}, cached[3] = {12, 20, 50};
    kv_scene g, c;
    kv_scene_build(&g, ctx, &l, rows, 5);
    kv_scene_build(&c, cpu, &l, rows, 5);
    if (slots_call(ctx, &g, idx, pad, cached) != FA_SUCCESS) fail_msg("slots: %s", fa_last_error());
    assert_int_equal(slots_call(cpu, &c, idx, pad, cached), FA_SUCCESS);
    const size_t out_n = (size_t)(3 * 2 * l.heads_q * l.head_dim), lse_n = (size_t)(3 * 2 * l.heads_q);
    float *go = malloc(out_n * sizeof(float)), *co = malloc(out_n * sizeof(float));
    float *gl = malloc(lse_n * sizeof(float)), *cl = malloc(lse_n * sizeof(float));
    float *gk = malloc(g.cache_elems * sizeof(float)), *ck = malloc(g.cache_elems * sizeof(float));
    assert_true(go && co && gl && cl && gk && ck);
    assert_int_equal(fa_memcpy_d2h(ctx, go, g.out, out_n * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(cpu, co, c.out, out_n * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(ctx, gl, g.lse, lse_n * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(cpu, cl, c.lse, lse_n * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(ctx, gk, g.k_cache, g.cache_elems * sizeof(float)), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(cpu, ck, c.k_cache, c.cache_elems * sizeof(float)), FA_SUCCESS);
    expect_close("out", "slots", go, co, out_n, FA_DTYPE_F32);
    expect_close("lse", "slots", gl, cl, lse_n, FA_DTYPE_F32);
    assert_memory_equal(gk, ck, g.cache_elems * sizeof(float)); /* NaN bytes included: nothing else written */
    free(go), free(co), free(gl), free(cl), free(gk), free(ck);
    kv_scene_free(&g);
    kv_scene_free(&c);
    fa_context_destroy(cpu);
}

/* A device table that fails its check: the call succeeds, the next synchronize names the
 * element, out and the cache keep every byte, and the synchronize after that succeeds. */
static void expect_deferred(fa_context *ctx, kv_scene *s, fa_status st, const char *prefix)
{
    assert_int_equal(st, FA_SUCCESS);
    const fa_status synced = fa_synchronize(ctx);
    print_message("  fa_synchronize: %s: %s\n", fa_status_string(synced), fa_last_error());
    assert_int_equal(synced, FA_ERROR_INVALID_VALUE);
    if (!strstr(fa_last_error(), prefix)) fail_msg("expected %s in: %s", prefix, fa_last_error());
    for (int b = 0; b < s->n; ++b) {
        kv_seq_result r;
        kv_scene_result(s, b, 1, &r);
        const size_t row = (size_t)(s->layout.heads_kv * s->layout.head_dim);
        for (size_t e = 0; e < r.out_bytes / sizeof(float); ++e)
            if (!isnan(((float *)r.out)[e])) fail_msg("%s: out written by a failed call", prefix);
        for (size_t e = 0; e < (size_t)s->seqs[b].fresh * row; ++e)
            if (!isnan(((float *)r.k)[(size_t)s->seqs[b].cached * row + e])) fail_msg("%s: the cache was appended to", prefix);
        kv_seq_result_free(&r);
    }
    assert_int_equal(fa_synchronize(ctx), FA_SUCCESS);
}

void test_gpu_serving_bad_tables(void **state)
{
    fa_context *ctx = context_or_skip(state);
    const kv_layout l = {FA_DTYPE_F32, 4, 2, 16, 64, 0};
    const kv_seq seqs[3] = {{10, 1, 1, 1}, {5, 3, 3, 2}, {0, 2, 2, 3}};
    kv_scene s;
    kv_scene_build(&s, ctx, &l, seqs, 3);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    const int32_t bad_last = s.cu_q[3] + 1;
    assert_int_equal(fa_memcpy_h2d(ctx, s.cu_q_dev + 3, &bad_last, sizeof bad_last), FA_SUCCESS);
    expect_deferred(ctx, &s, kv_scene_run(&s, &desc, 1, NULL), "desc->varlen->cu_seqlens_q[3]");
    assert_int_equal(fa_memcpy_h2d(ctx, s.cu_q_dev + 3, &s.cu_q[3], sizeof bad_last), FA_SUCCESS);
    const int32_t decreasing = 0;
    assert_int_equal(fa_memcpy_h2d(ctx, s.cu_new_dev + 2, &decreasing, sizeof decreasing), FA_SUCCESS);
    expect_deferred(ctx, &s, kv_scene_run(&s, &desc, 1, NULL), "desc->varlen->cu_seqlens_k[2]");
    assert_int_equal(fa_memcpy_h2d(ctx, s.cu_new_dev + 2, &s.cu_new[2], sizeof decreasing), FA_SUCCESS);
    int32_t *tables;
    const int32_t host[6] = {0, 3, 1, 0, 6, 0}; /* cache_batch_idx[1] = 3 of 3 rows; cache_leftpad[1] = 6 > 5 cached */
    assert_int_equal(fa_malloc(ctx, sizeof host, (void **)&tables), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, tables, host, sizeof host), FA_SUCCESS);
    fa_kv_slots slots;
    fa_kv_slots_init(&slots);
    slots.cache_batch_idx = tables;
    expect_deferred(ctx, &s, kv_scene_run(&s, &desc, 1, &slots), "cache_batch_idx[1]");
    slots.cache_batch_idx = NULL;
    slots.cache_leftpad = tables + 3;
    expect_deferred(ctx, &s, kv_scene_run(&s, &desc, 1, &slots), "cache_leftpad[1]");
    fa_free(ctx, tables);
    assert_int_equal(kv_scene_run(&s, &desc, 1, NULL), FA_SUCCESS); /* the repaired call runs */
    assert_int_equal(fa_synchronize(ctx), FA_SUCCESS);
    kv_scene_free(&s);
}

/* ---- quantised caches and rotary embeddings against the CPU backend ---------------------------- */
enum { QB = 2, QHQ = 4, QHKV = 2, QD = 40, QCAP = 48, QPAGE = 8, QSQ = 2, QNEW = 2, QPOS = 64 };

typedef struct quant_case {
    fa_dtype k, v, q;
    int paged, rotary, interleaved;
} quant_case;

/* Host buffers of one call, the same bytes copied to each backend. */
typedef struct quant_host {
    uint8_t kc[QB * QCAP * QHKV * QD], vc[QB * QCAP * QHKV * QD];
    float k_scale[QB * QCAP * QHKV], v_scale[QB * QCAP * QHKV], k_descale[QB * QHKV], v_descale[QB * QHKV];
    float q[QB * QSQ * QHQ * QD], k_new[QB * QNEW * QHKV * QD], v_new[QB * QNEW * QHKV * QD]; /* f32, or f16 in place */
    float cos_table[QPOS * QD / 2], sin_table[QPOS * QD / 2];
    int32_t cached[QB], table[QB * (QCAP / QPAGE)];
} quant_host;

static uint32_t quant_rng = 12345u;
static float quant_uniform(void)
{
    quant_rng = quant_rng * 1664525u + 1013904223u;
    return (float)(quant_rng >> 8) * 0x1p-24f * 2.0f - 1.0f;
}

static void quant_host_fill(quant_host *h, const quant_case *c)
{
    for (size_t x = 0; x < sizeof h->kc; ++x) {
        const uint8_t byte = (uint8_t)(int)(quant_uniform() * 127.0f); /* via int: a negative float to uint8_t is undefined */
        h->kc[x] = c->k == FA_DTYPE_FP8_E4M3 && (byte & 0x7f) == 0x7f ? 0x3c : byte; /* no NaN codes */
        h->vc[x] = (uint8_t)((x * 37u + 11u) % 120u); /* E5M2 codes below 0x78: finite */
    }
    for (size_t x = 0; x < QB * QCAP * QHKV; ++x) h->k_scale[x] = 0.01f + 0.01f * fabsf(quant_uniform()), h->v_scale[x] = 0.02f;
    for (size_t x = 0; x < QB * QHKV; ++x) h->k_descale[x] = 0.05f + 0.01f * (float)x, h->v_descale[x] = 0.5f;
    for (size_t x = 0; x < sizeof h->q / 4; ++x) h->q[x] = quant_uniform();
    for (size_t x = 0; x < sizeof h->k_new / 4; ++x) h->k_new[x] = 2.0f * quant_uniform(), h->v_new[x] = quant_uniform();
    if (c->q == FA_DTYPE_F16) { /* the same values as f16, packed at the front (in order: no overlap) */
        for (size_t x = 0; x < sizeof h->q / 4; ++x) test_store_element(h->q, x, FA_DTYPE_F16, h->q[x]);
        for (size_t x = 0; x < sizeof h->k_new / 4; ++x) {
            test_store_element(h->k_new, x, FA_DTYPE_F16, h->k_new[x]);
            test_store_element(h->v_new, x, FA_DTYPE_F16, h->v_new[x]);
        }
    }
    for (int pos = 0; pos < QPOS; ++pos)
        for (int f = 0; f < QD / 2; ++f) {
            const double angle = pos * pow(10000.0, -2.0 * f / QD);
            h->cos_table[pos * QD / 2 + f] = (float)cos(angle), h->sin_table[pos * QD / 2 + f] = (float)sin(angle);
        }
    h->cached[0] = 20, h->cached[1] = 7;
    for (int x = 0; x < QB * (QCAP / QPAGE); ++x) h->table[x] = (x * 5 + 3) % (QB * (QCAP / QPAGE)); /* a permutation */
}

/* Device (or host) copies of h's arrays in ctx's memory, freed by quant_free. */
typedef struct quant_call {
    void *buf[12];
    fa_kv_cache cache;
    fa_kv_scales scales;
    fa_rotary rotary;
    fa_attention_desc desc;
    fa_tensor q, k_new, v_new, out;
    float *lse;
} quant_call;

static void *quant_upload(fa_context *ctx, quant_call *qc, int slot, const void *src, size_t bytes)
{
    assert_int_equal(fa_malloc(ctx, bytes, &qc->buf[slot]), FA_SUCCESS);
    if (src) assert_int_equal(fa_memcpy_h2d(ctx, qc->buf[slot], src, bytes), FA_SUCCESS);
    return qc->buf[slot];
}

static void quant_build(fa_context *ctx, const quant_host *h, const quant_case *c, quant_call *qc)
{
    memset(qc, 0, sizeof *qc);
    const size_t es = c->q == FA_DTYPE_F16 ? 2 : 4;
    const int64_t slots = c->paged ? QB * QCAP / QPAGE : QB, positions = c->paged ? QPAGE : QCAP;
    void *kc = quant_upload(ctx, qc, 0, h->kc, sizeof h->kc), *vc = quant_upload(ctx, qc, 1, h->vc, sizeof h->vc);
    qc->cache.k = (fa_tensor){kc, c->k, slots, positions, QHKV, QD, 0, 0, 0};
    qc->cache.v = (fa_tensor){vc, c->v, slots, positions, QHKV, QD, 0, 0, 0};
    qc->cache.cache_seqlens = quant_upload(ctx, qc, 2, h->cached, sizeof h->cached);
    if (c->paged) {
        qc->cache.block_table = quant_upload(ctx, qc, 3, h->table, sizeof h->table);
        qc->cache.max_pages_per_seq = QCAP / QPAGE;
    }
    fa_kv_scales_init(&qc->scales);
    if (c->k == FA_DTYPE_I8) qc->scales.k_scale = quant_upload(ctx, qc, 4, h->k_scale, sizeof h->k_scale);
    else qc->scales.k_descale = quant_upload(ctx, qc, 4, h->k_descale, sizeof h->k_descale);
    if (c->v == FA_DTYPE_I8) qc->scales.v_scale = quant_upload(ctx, qc, 5, h->v_scale, sizeof h->v_scale);
    else qc->scales.v_descale = quant_upload(ctx, qc, 5, h->v_descale, sizeof h->v_descale);
    fa_attention_desc_init(&qc->desc);
    qc->desc.causal = 1;
    qc->desc.kv_split_tokens = 8;
    qc->desc.kv_scales = &qc->scales;
    if (c->rotary) {
        fa_rotary_init(&qc->rotary);
        qc->rotary.cos = quant_upload(ctx, qc, 6, h->cos_table, sizeof h->cos_table);
        qc->rotary.sin = quant_upload(ctx, qc, 7, h->sin_table, sizeof h->sin_table);
        qc->rotary.max_position = QPOS;
        qc->rotary.rotary_dim = c->rotary == 2 ? QD / 2 : QD;
        qc->rotary.interleaved = c->interleaved;
        qc->desc.rotary = &qc->rotary;
    }
    qc->q = (fa_tensor){quant_upload(ctx, qc, 8, h->q, (size_t)(QB * QSQ * QHQ * QD) * es), c->q, QB, QSQ, QHQ, QD, 0, 0, 0};
    qc->k_new = (fa_tensor){quant_upload(ctx, qc, 9, h->k_new, (size_t)(QB * QNEW * QHKV * QD) * es), c->q, QB, QNEW, QHKV, QD, 0, 0, 0};
    qc->v_new = (fa_tensor){quant_upload(ctx, qc, 10, h->v_new, (size_t)(QB * QNEW * QHKV * QD) * es), c->q, QB, QNEW, QHKV, QD, 0, 0, 0};
    qc->out = qc->q;
    qc->out.data = quant_upload(ctx, qc, 11, NULL, (size_t)(QB * QSQ * QHQ * QD) * es);
}

static void quant_free(fa_context *ctx, quant_call *qc)
{
    for (int x = 0; x < 12; ++x) fa_free(ctx, qc->buf[x]);
}

/* Host copy of buffer `slot` of bytes. */
static void *quant_download(fa_context *ctx, const quant_call *qc, int slot, size_t bytes)
{
    void *host = malloc(bytes);
    assert_non_null(host);
    assert_int_equal(fa_memcpy_d2h(ctx, host, qc->buf[slot], bytes), FA_SUCCESS);
    return host;
}

/* fa_forward_kvcache (append) or fa_kvcache_append on a GPU and on the CPU with the same bytes: the
 * same cache codes and scales (rotated keys: codes within one step, since the two may round the
 * rotation's products differently), outputs within q's tolerance. */
static void quant_against_cpu(fa_context *gpu, fa_context *cpu, const quant_case *c, int append_only)
{
    static quant_host h;
    quant_host_fill(&h, c);
    quant_call g, r;
    quant_build(gpu, &h, c, &g);
    quant_build(cpu, &h, c, &r);
    fa_status sg, sr;
    if (append_only) {
        sg = fa_kvcache_append(gpu, &g.desc, &g.cache, NULL, &g.k_new, &g.v_new);
        sr = fa_kvcache_append(cpu, &r.desc, &r.cache, NULL, &r.k_new, &r.v_new);
    } else {
        sg = fa_forward_kvcache(gpu, &g.desc, &g.q, &g.cache, &g.k_new, &g.v_new, &g.out, NULL);
        sr = fa_forward_kvcache(cpu, &r.desc, &r.q, &r.cache, &r.k_new, &r.v_new, &r.out, NULL);
    }
    if (sg != FA_SUCCESS) fail_msg("gpu: %s", fa_last_error());
    if (sr != FA_SUCCESS) fail_msg("cpu: %s", fa_last_error());
    assert_int_equal(fa_synchronize(gpu), FA_SUCCESS);
    for (int t = 0; t < 2; ++t) { /* the cache tensors, then their scales */
        uint8_t *gc = quant_download(gpu, &g, t, sizeof h.kc), *rc = quant_download(cpu, &r, t, sizeof h.kc);
        for (size_t x = 0; x < sizeof h.kc; ++x) {
            const int step = abs((int)(int8_t)gc[x] - (int)(int8_t)rc[x]);
            if (gc[x] != rc[x] && !(c->rotary && t == 0 && step == 1))
                fail_msg("cache %s byte %zu: gpu 0x%02x, cpu 0x%02x", t ? "v" : "k", x, gc[x], rc[x]);
        }
        free(gc), free(rc);
        if ((t ? c->v : c->k) != FA_DTYPE_I8) continue;
        float *gs = quant_download(gpu, &g, 4 + t, sizeof h.k_scale), *rs = quant_download(cpu, &r, 4 + t, sizeof h.k_scale);
        for (size_t x = 0; x < sizeof h.k_scale / 4; ++x)
            if (!(fabsf(gs[x] - rs[x]) <= (c->rotary && !t ? 1e-6f * rs[x] : 0.0f)))
                fail_msg("%s_scale[%zu]: gpu %.9g, cpu %.9g", t ? "v" : "k", x, gs[x], rs[x]);
        free(gs), free(rs);
    }
    if (!append_only) {
        const size_t n = (size_t)(QB * QSQ * QHQ * QD), es = c->q == FA_DTYPE_F16 ? 2 : 4;
        void *go = quant_download(gpu, &g, 11, n * es), *ro = quant_download(cpu, &r, 11, n * es);
        expect_close("out", "quantised cache", go, ro, n, c->q);
        free(go), free(ro);
    }
    quant_free(gpu, &g);
    quant_free(cpu, &r);
}

/* Quantised caches (int8, FP8) and rotary embeddings on the GPU against the CPU backend: append
 * and attention, contiguous and paged, fa_kvcache_append; a bad descale is a device check. */
void test_gpu_serving_quantised(void **state)
{
    fa_context *ctx = context_or_skip(state), *cpu;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &cpu), FA_SUCCESS);
    static const quant_case cases[] = {
        {FA_DTYPE_I8, FA_DTYPE_I8, FA_DTYPE_F32, 0, 0, 0},        {FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E5M2, FA_DTYPE_F16, 1, 0, 0},
        {FA_DTYPE_I8, FA_DTYPE_FP8_E5M2, FA_DTYPE_F16, 0, 1, 0},  {FA_DTYPE_FP8_E4M3, FA_DTYPE_I8, FA_DTYPE_F32, 1, 2, 1},
    };
    for (size_t x = 0; x < sizeof cases / sizeof cases[0]; ++x) {
        quant_against_cpu(ctx, cpu, &cases[x], 0);
        quant_against_cpu(ctx, cpu, &cases[x], 1);
    }
    /* A zero descale: checked on the device, reported by the next synchronize, nothing written. */
    static quant_host h;
    const quant_case c = {FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E5M2, FA_DTYPE_F32, 0, 0, 0};
    quant_host_fill(&h, &c);
    h.k_descale[3] = 0.0f;
    quant_call g;
    quant_build(ctx, &h, &c, &g);
    assert_int_equal(fa_forward_kvcache(ctx, &g.desc, &g.q, &g.cache, &g.k_new, &g.v_new, &g.out, NULL), FA_SUCCESS);
    assert_int_equal(fa_synchronize(ctx), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "desc->kv_scales->k_descale[3]"));
    uint8_t *kc = quant_download(ctx, &g, 0, sizeof h.kc);
    assert_memory_equal(kc, h.kc, sizeof h.kc);
    free(kc);
    quant_free(ctx, &g);
    fa_context_destroy(cpu);
}

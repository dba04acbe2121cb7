/* Rotary position embeddings on the KV-cache calls (desc->rotary; flashattn.h, "rotary position
 * embeddings on append") and fa_kvcache_append, on the CPU:
 * - fa_forward_kvcache against the fp64 oracle, with the rotation computed here in double from the
 *   cos/sin tables (theta_f = 10000^(-2f / rotary_dim)): GPT-NeoX halves and GPT-J pairs,
 *   rotary_dim = d and d / 2, q in f32/f16/bf16 (the cache of q's dtype), causal, a window and
 *   neither (queries in order or all at the first new position), GQA 4:2, contiguous and paged,
 *   three sequences of different cached lengths, 1 and 3 new tokens; every appended key within one
 *   ulp of its dtype (f32: 1e-6) of the rotation (the library rotates in f32), values and dims past
 *   rotary_dim copied exactly, every other byte of the cache unchanged;
 * - the rotated queries rounded to q's dtype: a rotary step equals, bit for bit, the same step without
 *   rotary on queries rotated beforehand (by the library's own append, at the documented positions);
 * - ragged queries (desc->varlen) and left padding with slots (positions count from the padding);
 * - fa_kvcache_append: without rotary, padded and packed (cu_seqlens_k), byte for byte, then an
 *   attention over the filled cache against the oracle; with rotary into an f32 and an int8 cache:
 *   the same bytes (codes and scales) as fa_forward_kvcache's own append of the same tokens;
 * - bad rotary arguments and fa_kvcache_append arguments: status, the argument named, nothing written;
 * - bit-identical results on 1 and 2 threads.
 * Cache positions no sequence owns (and left padding) hold NaN (int8: scale NaN), so a read of one
 * shows up. */
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
#include "oracle.h"
#include "test_arrays.h"

#define HQ 4
#define HKV 2
#define MAXB 4

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static void *xdup(const void *src, size_t bytes)
{
    void *p = xmalloc(bytes);
    memcpy(p, src, bytes);
    return p;
}

/* Output tolerance against the oracle, relative to max(1, max |ref|): test_kvcache's. */
static double out_tolerance(fa_dtype t) { return t == FA_DTYPE_F32 ? 2e-5 : t == FA_DTYPE_F16 ? 2e-3 : 1e-2; }

/* One unit in the last place of x in t (f16: 11 significant bits, bf16: 8; their subnormal steps). */
static double ulp_of(double x, fa_dtype t)
{
    const int bits = t == FA_DTYPE_F16 ? 11 : t == FA_DTYPE_BF16 ? 8 : 24;
    const int min_exp = t == FA_DTYPE_F16 ? -24 : t == FA_DTYPE_BF16 ? -133 : -149;
    int e;
    frexp(fabs(x), &e);
    return ldexp(1.0, e - bits > min_exp ? e - bits : min_exp);
}

/* ---- a KV-cache step with rotary embeddings ----------------------------------------------------- */
typedef struct rot_spec {
    const char *name;
    fa_dtype dtype;       /* q, out, k_new, v_new, and the cache unless int8 */
    int int8_cache;       /* k and v FA_DTYPE_I8 with per-token scales */
    int64_t d, rdim;      /* rdim 0: no desc->rotary */
    int interleaved;
    int causal;
    int32_t window_left;  /* -1: none (with causal 0 and a window, queries are still in order) */
    int64_t page_size;    /* 0: contiguous */
    int ragged;           /* desc->varlen: packed queries and new tokens */
    int n;
    int32_t cached[MAXB], fresh[MAXB]; /* fresh: tokens appended = query rows (padded: all equal) */
    int slots;            /* fa_kv_slots: rows reversed after a spare row 0, left padding below */
    int32_t leftpad[MAXB];
    uint64_t seed;
} rot_spec;

typedef struct scene {
    rot_spec sp;
    fa_dtype cdt;                    /* the cache's dtype */
    size_t es, ces;                  /* element bytes: q/new, cache */
    int64_t rows, row_len, max_pages, total, Q, max_position;
    int32_t cu[MAXB + 1], batch_idx[MAXB], leftpad[MAXB], cached[MAXB], *table;
    size_t cache_n, scale_n, q_n, new_n, lse_n;
    void *k_cache, *v_cache, *k_orig, *v_orig, *k_img, *v_img; /* img: orig + the raw new rows */
    float *k_scale, *v_scale, *k_scale_orig, *v_scale_orig;
    double *k_want, *v_want;         /* the expected cache as values (rotated keys rounded to dtype) */
    uint8_t *k_approx, *v_approx;    /* 1: compared within the rounding of the rotation, else bytes */
    void *q, *k_new, *v_new, *out;
    float *lse, *cos, *sin;
    fa_rotary rotary;
    fa_kv_scales scales;
    fa_kv_slots kv_slots;
    fa_varlen vl;
    fa_tensor tq, tk_new, tv_new, tout;
    fa_kv_cache cache;
    fa_attention_desc desc;
} scene;

static int64_t lp_of(const scene *s, int64_t b) { return s->sp.slots ? s->leftpad[b] : 0; }

/* Element index of element 0 of kv head h at cache position pos of sequence b. */
static size_t cache_at(const scene *s, int64_t b, int64_t pos, int64_t h)
{
    int64_t slot, r;
    if (s->sp.page_size) {
        slot = s->table[b * s->max_pages + pos / s->sp.page_size];
        r = pos % s->sp.page_size;
    } else {
        slot = s->sp.slots ? s->batch_idx[b] : b;
        r = pos;
    }
    return (size_t)(((slot * s->row_len + r) * HKV + h) * s->sp.d);
}

/* Row of new token t (query row t) of sequence b in k_new (q): padded b * Q + t, packed cu[b] + t. */
static int64_t new_row(const scene *s, int64_t b, int64_t t) { return s->sp.ragged ? s->cu[b] + t : b * s->Q + t; }

/* x (d values) rotated in double to position pos, by the tables' f32 entries. */
static void rotate(const scene *s, int64_t pos, double *x)
{
    const int64_t half = s->sp.rdim / 2;
    assert_true(pos >= 0 && pos < s->max_position);
    for (int64_t f = 0; f < half; ++f) {
        const int64_t ia = s->sp.interleaved ? 2 * f : f, ib = s->sp.interleaved ? 2 * f + 1 : f + half;
        const double a = x[ia], b = x[ib], c = s->cos[pos * half + f], sn = s->sin[pos * half + f];
        x[ia] = a * c - b * sn;
        x[ib] = b * c + a * sn;
    }
}

static void *random_tensor(size_t n, fa_dtype t, uint64_t seed)
{
    double *x = test_random_doubles(seed, n);
    void *buf = xmalloc(n * test_dtype_size(t));
    for (size_t i = 0; i < n; ++i) test_store_element(buf, i, t, x[i]);
    free(x);
    return buf;
}

static double cache_value(const scene *s, const void *buf, const float *scale, size_t e)
{
    if (s->cdt == FA_DTYPE_I8) return (double)((const int8_t *)buf)[e] * (double)scale[e / (size_t)s->sp.d];
    return test_load_element(buf, e, s->cdt);
}

static void scene_build(scene *s, const rot_spec *sp)
{
    memset(s, 0, sizeof *s);
    s->sp = *sp;
    const int64_t d = sp->d, n = sp->n;
    s->cdt = sp->int8_cache ? FA_DTYPE_I8 : sp->dtype;
    s->es = test_dtype_size(sp->dtype);
    s->ces = sp->int8_cache ? 1 : s->es;
    int64_t need = 1, positions = 1;
    s->cu[0] = 0;
    for (int b = 0; b < n; ++b) {
        s->leftpad[b] = sp->slots ? sp->leftpad[b] : 0;
        s->cached[b] = sp->cached[b];
        if (!sp->ragged) assert_int_equal(sp->fresh[b], sp->fresh[0]);
        s->cu[b + 1] = s->cu[b] + sp->fresh[b];
        if (sp->cached[b] + sp->fresh[b] > need) need = sp->cached[b] + sp->fresh[b];
        if (sp->cached[b] - s->leftpad[b] + sp->fresh[b] > positions) positions = sp->cached[b] - s->leftpad[b] + sp->fresh[b];
        s->batch_idx[b] = (int32_t)(n - b); /* row 0 is nobody's */
    }
    s->Q = sp->fresh[0];
    s->total = sp->ragged ? s->cu[n] : n * s->Q;
    s->max_position = positions + 5;
    if (sp->page_size) {
        s->row_len = sp->page_size;
        s->max_pages = (need + 4) / sp->page_size + 1; /* room for 4 more tokens (test_append_plain) */
        s->rows = n * s->max_pages + 2;
        s->table = test_page_table(n, s->max_pages, s->rows);
        assert_non_null(s->table);
    } else {
        s->row_len = need + 4;
        s->rows = sp->slots ? n + 1 : n;
    }
    s->scale_n = (size_t)(s->rows * s->row_len * HKV);
    s->cache_n = s->scale_n * (size_t)d;
    /* The cache: each sequence's cached positions past its padding hold values, all else NaN. */
    double *kx = test_random_doubles(sp->seed + 1, s->cache_n), *vx = test_random_doubles(sp->seed + 2, s->cache_n);
    double *sx = test_random_doubles(sp->seed + 3, 2 * s->scale_n);
    s->k_cache = xmalloc(s->cache_n * s->ces);
    s->v_cache = xmalloc(s->cache_n * s->ces);
    if (sp->int8_cache) {
        memset(s->k_cache, 0, s->cache_n);
        memset(s->v_cache, 0, s->cache_n);
        s->k_scale = xmalloc(s->scale_n * sizeof(float));
        s->v_scale = xmalloc(s->scale_n * sizeof(float));
        for (size_t x = 0; x < s->scale_n; ++x) s->k_scale[x] = s->v_scale[x] = NAN;
    } else {
        for (size_t e = 0; e < s->cache_n; ++e) {
            test_store_element(s->k_cache, e, s->cdt, NAN);
            test_store_element(s->v_cache, e, s->cdt, NAN);
        }
    }
    for (int b = 0; b < n; ++b)
        for (int64_t pos = s->leftpad[b]; pos < sp->cached[b]; ++pos)
            for (int64_t h = 0; h < HKV; ++h) {
                const size_t at = cache_at(s, b, pos, h);
                for (int64_t x = 0; x < d; ++x) {
                    if (sp->int8_cache) {
                        ((int8_t *)s->k_cache)[at + x] = (int8_t)lrint(kx[at + x] * 127.0);
                        ((int8_t *)s->v_cache)[at + x] = (int8_t)lrint(vx[at + x] * 127.0);
                    } else {
                        test_store_element(s->k_cache, at + x, s->cdt, kx[at + x]);
                        test_store_element(s->v_cache, at + x, s->cdt, vx[at + x]);
                    }
                }
                if (sp->int8_cache) {
                    s->k_scale[at / (size_t)d] = (float)(0.01 + 0.005 * fabs(sx[at / (size_t)d]));
                    s->v_scale[at / (size_t)d] = (float)(0.01 + 0.005 * fabs(sx[s->scale_n + at / (size_t)d]));
                }
            }
    free(kx), free(vx), free(sx);
    s->k_orig = xdup(s->k_cache, s->cache_n * s->ces);
    s->v_orig = xdup(s->v_cache, s->cache_n * s->ces);
    if (sp->int8_cache) {
        s->k_scale_orig = xdup(s->k_scale, s->scale_n * sizeof(float));
        s->v_scale_orig = xdup(s->v_scale, s->scale_n * sizeof(float));
    }
    /* Queries and new tokens. */
    s->q_n = (size_t)(s->total * HQ * d);
    s->new_n = (size_t)(s->total * HKV * d);
    s->q = random_tensor(s->q_n, sp->dtype, sp->seed + 4);
    s->k_new = random_tensor(s->new_n, sp->dtype, sp->seed + 5);
    s->v_new = random_tensor(s->new_n, sp->dtype, sp->seed + 6);
    s->out = xmalloc(s->q_n * s->es);
    s->lse_n = (size_t)(s->total * HQ);
    s->lse = xmalloc(s->lse_n * sizeof(float));
    /* Tables: theta_f = 10000^(-2f / rotary_dim), angle pos * theta_f, rounded to f32. */
    if (sp->rdim) {
        const int64_t half = sp->rdim / 2;
        s->cos = xmalloc((size_t)(s->max_position * half) * sizeof(float));
        s->sin = xmalloc((size_t)(s->max_position * half) * sizeof(float));
        for (int64_t pos = 0; pos < s->max_position; ++pos)
            for (int64_t f = 0; f < half; ++f) {
                const double angle = (double)pos * pow(10000.0, -2.0 * (double)f / (double)sp->rdim);
                s->cos[pos * half + f] = (float)cos(angle);
                s->sin[pos * half + f] = (float)sin(angle);
            }
        fa_rotary_init(&s->rotary);
        s->rotary.cos = s->cos;
        s->rotary.sin = s->sin;
        s->rotary.max_position = s->max_position;
        s->rotary.rotary_dim = sp->rdim;
        s->rotary.interleaved = sp->interleaved;
    }
    /* The call's arguments. */
    const int64_t batch = sp->ragged ? 1 : n, seqlen = sp->ragged ? s->total : s->Q;
    s->tq = (fa_tensor){s->q, sp->dtype, batch, seqlen, HQ, d, 0, 0, 0};
    s->tout = (fa_tensor){s->out, sp->dtype, batch, seqlen, HQ, d, 0, 0, 0};
    s->tk_new = (fa_tensor){s->k_new, sp->dtype, batch, seqlen, HKV, d, 0, 0, 0};
    s->tv_new = (fa_tensor){s->v_new, sp->dtype, batch, seqlen, HKV, d, 0, 0, 0};
    s->cache.k = (fa_tensor){s->k_cache, s->cdt, s->rows, s->row_len, HKV, d, 0, 0, 0};
    s->cache.v = (fa_tensor){s->v_cache, s->cdt, s->rows, s->row_len, HKV, d, 0, 0, 0};
    s->cache.block_table = s->table;
    s->cache.max_pages_per_seq = s->max_pages;
    s->cache.cache_seqlens = s->cached;
    fa_kv_slots_init(&s->kv_slots);
    s->kv_slots.cache_batch_idx = s->batch_idx;
    s->kv_slots.cache_leftpad = s->leftpad;
    fa_kv_scales_init(&s->scales);
    s->scales.k_scale = s->k_scale;
    s->scales.v_scale = s->v_scale;
    int32_t max_fresh = 0;
    for (int b = 0; b < n; ++b) max_fresh = sp->fresh[b] > max_fresh ? sp->fresh[b] : max_fresh;
    s->vl = (fa_varlen){n, s->cu, NULL, max_fresh, 0};
    fa_attention_desc_init(&s->desc);
    s->desc.causal = sp->causal;
    s->desc.window_left = sp->window_left;
    s->desc.kv_split_tokens = 16; /* several chunks, each rotating its queries */
    s->desc.varlen = sp->ragged ? &s->vl : NULL;
    s->desc.rotary = sp->rdim ? &s->rotary : NULL;
    s->desc.kv_scales = sp->int8_cache ? &s->scales : NULL;

    /* The expected cache after the append: as values (rotated keys rounded to the dtype) and as
     * bytes (the raw new rows, for what is copied exactly). */
    s->k_img = xdup(s->k_orig, s->cache_n * s->ces);
    s->v_img = xdup(s->v_orig, s->cache_n * s->ces);
    s->k_want = xmalloc(s->cache_n * sizeof(double));
    s->v_want = xmalloc(s->cache_n * sizeof(double));
    s->k_approx = calloc(s->cache_n, 1);
    s->v_approx = calloc(s->cache_n, 1);
    assert_true(s->k_approx && s->v_approx);
    for (size_t e = 0; e < s->cache_n; ++e) {
        s->k_want[e] = cache_value(s, s->k_orig, s->k_scale_orig, e);
        s->v_want[e] = cache_value(s, s->v_orig, s->v_scale_orig, e);
    }
    double *row = xmalloc((size_t)d * sizeof(double));
    for (int b = 0; b < n; ++b)
        for (int64_t t = 0; t < sp->fresh[b]; ++t)
            for (int64_t h = 0; h < HKV; ++h) {
                const size_t at = cache_at(s, b, sp->cached[b] + t, h), from = (size_t)((new_row(s, b, t) * HKV + h) * d);
                if (!sp->int8_cache) {
                    memcpy((char *)s->k_img + at * s->ces, (char *)s->k_new + from * s->es, (size_t)d * s->es);
                    memcpy((char *)s->v_img + at * s->ces, (char *)s->v_new + from * s->es, (size_t)d * s->es);
                }
                for (int64_t x = 0; x < d; ++x) row[x] = test_load_element(s->k_new, from + (size_t)x, sp->dtype);
                if (sp->rdim) rotate(s, sp->cached[b] - s->leftpad[b] + t, row);
                for (int64_t x = 0; x < d; ++x) {
                    s->k_want[at + x] = sp->int8_cache ? row[x] : test_round_to_dtype(row[x], s->cdt);
                    s->k_approx[at + x] = sp->int8_cache || x < sp->rdim;
                    s->v_want[at + x] = test_load_element(s->v_new, from + (size_t)x, sp->dtype);
                    s->v_approx[at + x] = (uint8_t)sp->int8_cache;
                }
            }
    free(row);
}

static void scene_free(scene *s)
{
    void *all[] = {s->table, s->k_cache, s->v_cache, s->k_orig, s->v_orig, s->k_img, s->v_img, s->k_scale, s->v_scale,
                   s->k_scale_orig, s->v_scale_orig, s->k_want, s->v_want, s->k_approx, s->v_approx, s->q, s->k_new,
                   s->v_new, s->out, s->lse, s->cos, s->sin};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]);
}

/* The cache as it was, out all ones, lse NaN. */
static void scene_reset(scene *s)
{
    memcpy(s->k_cache, s->k_orig, s->cache_n * s->ces);
    memcpy(s->v_cache, s->v_orig, s->cache_n * s->ces);
    if (s->k_scale) {
        memcpy(s->k_scale, s->k_scale_orig, s->scale_n * sizeof(float));
        memcpy(s->v_scale, s->v_scale_orig, s->scale_n * sizeof(float));
    }
    memset(s->out, 0xff, s->q_n * s->es);
    memset(s->lse, 0xff, s->lse_n * sizeof(float));
}

static fa_status scene_forward(fa_context *ctx, scene *s)
{
    return fa_forward_kvcache_ex(ctx, &s->desc, &s->tq, &s->cache, s->sp.slots ? &s->kv_slots : NULL, &s->tk_new,
                                 &s->tv_new, &s->tout, s->lse);
}

/* fa_kvcache_append of the scene's new tokens (packed by cu_seqlens_k when ragged). */
static fa_status scene_append(fa_context *ctx, scene *s)
{
    fa_attention_desc desc = s->desc;
    fa_varlen vl = {s->sp.n, NULL, s->cu, s->vl.max_seqlen_q, 0};
    vl.max_seqlen_k = s->vl.max_seqlen_q;
    desc.varlen = s->sp.ragged ? &vl : NULL;
    return fa_kvcache_append(ctx, &desc, &s->cache, s->sp.slots ? &s->kv_slots : NULL, &s->tk_new, &s->tv_new);
}

/* The cache after an append: rotated keys within the rounding of the rotation (one ulp of the dtype,
 * f32 1e-6; int8: half a scale, the scale max|row| / 127), everything else byte for byte (values,
 * dims past rotary_dim, positions not appended, their scales). Returns the largest difference of a
 * rotated key from the double rotation as a fraction of its limit (f16/bf16: in ulps). */
static double check_cache(const scene *s, const char *what)
{
    double worst = 0.0;
    const int64_t d = s->sp.d;
    for (int tensor = 0; tensor < 2; ++tensor) {
        const void *got = tensor ? s->v_cache : s->k_cache, *img = tensor ? s->v_img : s->k_img;
        const float *scale = tensor ? s->v_scale : s->k_scale, *scale_orig = tensor ? s->v_scale_orig : s->k_scale_orig;
        const double *want = tensor ? s->v_want : s->k_want;
        const uint8_t *approx = tensor ? s->v_approx : s->k_approx;
        for (size_t e = 0; e < s->cache_n; ++e) {
            if (!approx[e]) {
                if (memcmp((const char *)got + e * s->ces, (const char *)img + e * s->ces, s->ces) != 0)
                    fail_msg("%s: cache->%c element %zu (position row %zu, column %zu) changed: %g, expected %g", what,
                             tensor ? 'v' : 'k', e, e / (size_t)d, e % (size_t)d, cache_value(s, got, scale, e),
                             cache_value(s, img, scale_orig, e));
                continue;
            }
            const double g = cache_value(s, got, scale, e);
            const double limit = s->cdt == FA_DTYPE_I8    ? 0.5 * (double)scale[e / (size_t)d] * (1.0 + 1e-5) + 1e-7
                                 : s->cdt == FA_DTYPE_F32 ? 1e-6
                                                          : fmax(ulp_of(want[e], s->cdt), ulp_of(g, s->cdt));
            if (!(fabs(g - want[e]) <= limit))
                fail_msg("%s: cache->%c element %zu (column %zu) is %.9g, expected %.9g (limit %.3g)", what,
                         tensor ? 'v' : 'k', e, e % (size_t)d, g, want[e], limit);
            worst = fmax(worst, fabs(g - want[e]) / limit);
        }
        if (s->cdt != FA_DTYPE_I8) continue;
        for (size_t x = 0; x < s->scale_n; ++x) { /* appended rows: max|row| / 127; the rest unchanged */
            if (!approx[x * (size_t)d]) {
                if (memcmp(&scale[x], &scale_orig[x], sizeof(float)) != 0)
                    fail_msg("%s: %c_scale[%zu] changed: %g, was %g", what, tensor ? 'v' : 'k', x, (double)scale[x],
                             (double)scale_orig[x]);
                continue;
            }
            double absmax = 0.0;
            for (int64_t c = 0; c < d; ++c) absmax = fmax(absmax, fabs(want[x * (size_t)d + (size_t)c]));
            if (!(fabs((double)scale[x] - absmax / 127.0) <= 1e-6 * absmax / 127.0 + 1e-9))
                fail_msg("%s: %c_scale[%zu] is %g, expected max|row| / 127 = %g", what, tensor ? 'v' : 'k', x,
                         (double)scale[x], absmax / 127.0);
        }
    }
    return worst;
}

/* out and lse of an attention over the expected cache (k_want, v_want) against the oracle: sequence
 * b has cached[b] tokens before the call and appends fresh[b]; q (padded [n, Q] or packed by cu_q)
 * rotated here in double at the documented positions and rounded to its dtype. Returns
 * max |out - ref| / max(1, max |ref|); *lse_err the same for lse. */
static double oracle_error(const scene *s, const fa_attention_desc *desc, const void *q, const void *out,
                           const float *lse, const int32_t *cu_q, int64_t Q, const int32_t *cached, const int32_t *fresh,
                           double *lse_err)
{
    const int64_t d = s->sp.d;
    const int ragged = desc->varlen != NULL;
    const int in_order = desc->causal || desc->window_left >= 0 || desc->window_right >= 0;
    const int64_t total_q = ragged ? cu_q[s->sp.n] : s->sp.n * Q;
    double worst = 0.0, largest = 1.0, worst_lse = 0.0, largest_lse = 1.0;
    fa_attention_desc plain = *desc; /* the oracle reads the masks and the scale */
    plain.varlen = NULL;
    plain.rotary = NULL;
    plain.kv_scales = NULL;
    plain.kv_split_tokens = 0;
    for (int b = 0; b < s->sp.n; ++b) {
        const int64_t queries = ragged ? cu_q[b + 1] - cu_q[b] : Q, lp = lp_of(s, b);
        const int64_t keys = cached[b] - lp + fresh[b];
        if (!queries) continue;
        const oracle_shape shape = {1, HQ, HKV, queries, keys, d};
        double *dq = xmalloc((size_t)(queries * HQ * d) * sizeof(double));
        double *dk = xmalloc((size_t)(keys * HKV * d) * sizeof(double)), *dv = xmalloc((size_t)(keys * HKV * d) * sizeof(double));
        double *ref = xmalloc((size_t)(queries * HQ * d) * sizeof(double)), *ref_lse = xmalloc((size_t)(queries * HQ) * sizeof(double));
        for (int64_t j = 0; j < keys; ++j)
            for (int64_t h = 0; h < HKV; ++h) {
                const size_t at = cache_at(s, b, lp + j, h);
                for (int64_t x = 0; x < d; ++x) {
                    dk[(j * HKV + h) * d + x] = s->k_want[at + (size_t)x];
                    dv[(j * HKV + h) * d + x] = s->v_want[at + (size_t)x];
                }
            }
        for (int64_t i = 0; i < queries; ++i) {
            const int64_t qrow = ragged ? cu_q[b] + i : b * Q + i;
            for (int64_t h = 0; h < HQ; ++h) {
                double *row = dq + (i * HQ + h) * d;
                for (int64_t x = 0; x < d; ++x) row[x] = test_load_element(q, (size_t)((qrow * HQ + h) * d + x), s->sp.dtype);
                if (!s->sp.rdim) continue;
                rotate(s, cached[b] - lp + (in_order ? i : 0), row);
                for (int64_t x = 0; x < d; ++x) row[x] = test_round_to_dtype(row[x], s->sp.dtype);
            }
        }
        oracle_forward(&shape, &plain, dq, dk, dv, ref, ref_lse);
        for (int64_t i = 0; i < queries; ++i) {
            const int64_t qrow = ragged ? cu_q[b] + i : b * Q + i;
            for (int64_t h = 0; h < HQ; ++h) {
                for (int64_t x = 0; x < d; ++x) {
                    const double want = ref[(i * HQ + h) * d + x];
                    const double got = test_load_element(out, (size_t)((qrow * HQ + h) * d + x), s->sp.dtype);
                    const double err = isfinite(got) ? fabs(got - want) : INFINITY;
                    worst = err > worst || isnan(err) ? err : worst;
                    largest = fmax(largest, fabs(want));
                }
                const double want = ref_lse[h * queries + i];
                const double got = ragged ? lse[h * total_q + qrow] : lse[(b * HQ + h) * Q + i];
                const double err = isfinite(got) ? fabs(got - want) : INFINITY;
                worst_lse = err > worst_lse || isnan(err) ? err : worst_lse;
                largest_lse = fmax(largest_lse, fabs(want));
            }
        }
        free(dq), free(dk), free(dv), free(ref), free(ref_lse);
    }
    *lse_err = worst_lse / largest_lse;
    return worst / largest;
}

static void describe(const rot_spec *sp, char *text, size_t size)
{
    snprintf(text, size, "%s [%s%s] d%lld rdim%lld %s %s%s %s%s, new %d", sp->name, fa_dtype_label(sp->dtype),
             sp->int8_cache ? " into int8" : "", (long long)sp->d, (long long)sp->rdim,
             sp->interleaved ? "gptj" : "neox", sp->causal ? "causal" : "full",
             sp->window_left >= 0 ? " window" : "", sp->page_size ? "paged" : "contiguous",
             sp->ragged ? " ragged" : "", sp->fresh[0]);
}

/* One forward step against the oracle and the cache against the rotation; returns the out error. */
static double forward_case_capped(fa_context *ctx, const rot_spec *sp, float softcap, double *key_ulps);
static double forward_case(fa_context *ctx, const rot_spec *sp, double *key_ulps)
{
    return forward_case_capped(ctx, sp, 0.0f, key_ulps);
}

/* softcap > 0: with desc->softcap (the CPU's score-modifier path). */
static double forward_case_capped(fa_context *ctx, const rot_spec *sp, float softcap, double *key_ulps)
{
    char what[200];
    describe(sp, what, sizeof what);
    scene s;
    scene_build(&s, sp);
    scene_reset(&s);
    s.desc.softcap = softcap;
    const fa_status st = scene_forward(ctx, &s);
    if (st != FA_SUCCESS) fail_msg("%s: status %d: %s", what, (int)st, fa_last_error());
    assert_memory_equal(s.cached, sp->cached, sizeof s.cached); /* cache_seqlens not modified */
    *key_ulps = check_cache(&s, what);
    double lse_err;
    const double err = oracle_error(&s, &s.desc, s.q, s.out, s.lse, s.cu, s.Q, s.cached, sp->fresh, &lse_err);
    const double tol = out_tolerance(sp->dtype);
    if (!(err <= tol) || !(lse_err <= tol))
        fail_msg("%s: against the oracle: out error %.3g, lse error %.3g (tolerance %.0e)", what, err, lse_err, tol);
    scene_free(&s);
    return err;
}

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

/* ---- 1. the oracle over layouts, rotary dims, dtypes, masks, caches, new tokens ----------------- */
static void test_rotary_oracle(void **state)
{
    fa_context *ctx = *state;
    static const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    static const struct { int causal; int32_t window_left; } masks[] = {{0, -1}, {1, -1}, {0, 6}};
    int cases = 0;
    for (int dt = 0; dt < 3; ++dt) {
        double worst = 0.0, worst_ulps = 0.0;
        for (int il = 0; il < 2; ++il)
            for (int rd = 0; rd < 2; ++rd)
                for (int m = 0; m < 3; ++m)
                    for (int paged = 0; paged < 2; ++paged)
                        for (int nw = 0; nw < 2; ++nw) {
                            if (masks[m].window_left >= 0 && (paged || rd)) continue; /* the window: a few layouts */
                            const int32_t fresh = nw ? 3 : 1;
                            const rot_spec sp = {"oracle", dtypes[dt], 0, 64, rd ? 32 : 64, il, masks[m].causal,
                                                 masks[m].window_left, paged ? 5 : 0, 0, 3, {13, 0, 41},
                                                 {fresh, fresh, fresh}, 0, {0}, (uint64_t)(100 + 10 * cases)};
                            double ulps;
                            const double err = forward_case(ctx, &sp, &ulps);
                            worst = fmax(worst, err);
                            worst_ulps = fmax(worst_ulps, ulps);
                            ++cases;
                        }
        printf("  %-5s out error %.2e (tolerance %.0e); appended keys differ from the double rotation by at most %.2f "
               "of their limit (f32 1e-6, f16/bf16 1 ulp)\n",
               fa_dtype_label(dtypes[dt]), worst, out_tolerance(dtypes[dt]), worst_ulps);
    }
    printf("  %d cases\n", cases);
}

/* Rotary with a score modifier (softcap): the CPU's per-sequence path gathers the rotated keys and
 * queries in f32; against the oracle like the decode path (an int8 cache with modifiers:
 * test_kvcache_quant). */
static void test_rotary_softcap(void **state)
{
    fa_context *ctx = *state;
    for (int c = 0; c < 4; ++c) {
        const rot_spec sp = {"softcap", c % 2 ? FA_DTYPE_F16 : FA_DTYPE_F32, 0, 64, c >= 2 ? 64 : 32, c % 2, c < 2, c < 2 ? -1 : 6, c % 2 ? 5 : 0,
                             0, 3, {13, 0, 41}, {3, 3, 3}, 0, {0}, (uint64_t)(900 + c)};
        double ulps;
        forward_case_capped(ctx, &sp, 5.0f, &ulps);
    }
}

/* ---- 2. ragged queries; 3. left padding --------------------------------------------------------- */
static void test_rotary_ragged(void **state)
{
    /* A decode, a prefill chunk, an empty cache, a sequence with no query (it appends nothing). */
    static const rot_spec specs[] = {
        {"ragged", FA_DTYPE_F32, 0, 64, 32, 1, 1, -1, 7, 1, 4, {20, 7, 0, 33}, {1, 4, 2, 0}, 0, {0}, 300},
        {"ragged", FA_DTYPE_BF16, 0, 48, 48, 0, 1, -1, 0, 1, 3, {5, 30, 12}, {3, 1, 5}, 0, {0}, 310},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; ++i) {
        double ulps;
        const double err = forward_case(*state, &specs[i], &ulps);
        printf("  %-8s %-5s out error %.2e, keys at %.2f of their limit\n", specs[i].name, fa_dtype_label(specs[i].dtype), err, ulps);
    }
}

static void test_rotary_leftpad(void **state)
{
    /* Sequence 2's padding covers all it has cached: its first new token is at position 0. */
    static const rot_spec specs[] = {
        {"leftpad", FA_DTYPE_F32, 0, 32, 32, 0, 1, -1, 0, 0, 3, {10, 4, 5}, {3, 3, 3}, 1, {3, 0, 5}, 400},
        {"leftpad", FA_DTYPE_F16, 0, 64, 16, 1, 0, -1, 0, 1, 3, {17, 9, 6}, {2, 1, 4}, 1, {7, 2, 1}, 410},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; ++i) {
        double ulps;
        const double err = forward_case(*state, &specs[i], &ulps);
        printf("  %-8s %-5s out error %.2e, keys at %.2f of their limit\n", specs[i].name, fa_dtype_label(specs[i].dtype), err, ulps);
    }
}

/* ---- 4. fa_kvcache_append ---------------------------------------------------------------------- */
/* (a) No rotary, f16: the new rows byte for byte, nothing else touched; then an attention over the
 * filled cache (no k_new, cache_seqlens advanced) against the oracle. */
static void test_append_plain(void **state)
{
    fa_context *ctx = *state;
    static const rot_spec specs[] = {
        {"append", FA_DTYPE_F16, 0, 32, 0, 0, 1, -1, 0, 0, 3, {4, 0, 9}, {2, 2, 2}, 0, {0}, 500},
        {"append", FA_DTYPE_F16, 0, 32, 0, 0, 1, -1, 4, 0, 3, {4, 0, 9}, {2, 2, 2}, 0, {0}, 510},
        {"append", FA_DTYPE_F16, 0, 32, 0, 0, 1, -1, 6, 1, 3, {4, 11, 9}, {3, 0, 1}, 0, {0}, 520},
        {"append", FA_DTYPE_F16, 0, 32, 0, 0, 1, -1, 0, 1, 3, {4, 11, 9}, {3, 0, 1}, 1, {2, 5, 0}, 530},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; ++i) {
        const rot_spec *sp = &specs[i];
        char what[200];
        describe(sp, what, sizeof what);
        scene s;
        scene_build(&s, sp);
        scene_reset(&s);
        const fa_status st = scene_append(ctx, &s);
        if (st != FA_SUCCESS) fail_msg("%s: fa_kvcache_append: %s", what, fa_last_error());
        (void)check_cache(&s, what); /* nothing approximate without rotary: every byte */
        for (size_t e = 0; e < s.q_n * s.es; ++e) assert_int_equal(((uint8_t *)s.out)[e], 0xff);
        assert_memory_equal(s.cached, sp->cached, sizeof s.cached);
        /* Attention over the filled cache: 2 padded queries per sequence, nothing appended. */
        int32_t cached2[MAXB] = {0}, none[MAXB] = {0};
        for (int b = 0; b < sp->n; ++b) cached2[b] = sp->cached[b] + sp->fresh[b];
        const size_t q2_n = (size_t)(sp->n * 2 * HQ * sp->d);
        void *q2 = random_tensor(q2_n, sp->dtype, sp->seed + 9), *out2 = xmalloc(q2_n * s.es);
        float *lse2 = test_nan_floats((size_t)(sp->n * HQ * 2));
        const fa_tensor tq2 = {q2, sp->dtype, sp->n, 2, HQ, sp->d, 0, 0, 0};
        fa_tensor tout2 = {out2, sp->dtype, sp->n, 2, HQ, sp->d, 0, 0, 0};
        fa_kv_cache cache2 = s.cache;
        cache2.cache_seqlens = cached2;
        fa_attention_desc desc2 = s.desc;
        desc2.varlen = NULL;
        void *k_after = xdup(s.k_cache, s.cache_n * s.ces), *v_after = xdup(s.v_cache, s.cache_n * s.ces);
        if (fa_forward_kvcache_ex(ctx, &desc2, &tq2, &cache2, sp->slots ? &s.kv_slots : NULL, NULL, NULL, &tout2, lse2) !=
            FA_SUCCESS)
            fail_msg("%s: attention over the appended cache: %s", what, fa_last_error());
        assert_memory_equal(s.k_cache, k_after, s.cache_n * s.ces);
        assert_memory_equal(s.v_cache, v_after, s.cache_n * s.ces);
        double lse_err;
        const double err = oracle_error(&s, &desc2, q2, out2, lse2, NULL, 2, cached2, none, &lse_err);
        printf("  %-30s bytes as given; then out error %.2e, lse %.2e\n", what, err, lse_err);
        assert_true(err <= out_tolerance(sp->dtype) && lse_err <= out_tolerance(sp->dtype));
        free(q2), free(out2), free(lse2), free(k_after), free(v_after);
        scene_free(&s);
    }
}

/* (b), (c) With rotary into an f32 and an int8 cache: checked against the rotation (and the int8
 * quantisation), and byte for byte (codes and scales) what fa_forward_kvcache appends for the same
 * tokens on a copy of the cache. */
static void test_append_rotary(void **state)
{
    fa_context *ctx = *state;
    static const rot_spec specs[] = {
        {"append rotary", FA_DTYPE_F32, 0, 64, 64, 0, 1, -1, 0, 0, 3, {8, 0, 21}, {3, 3, 3}, 1, {2, 0, 21}, 600},
        {"append rotary", FA_DTYPE_F32, 0, 64, 32, 1, 0, -1, 5, 1, 3, {8, 1, 21}, {4, 0, 2}, 0, {0}, 610},
        {"append rotary", FA_DTYPE_F32, 1, 64, 64, 1, 1, -1, 0, 0, 3, {8, 0, 21}, {2, 2, 2}, 1, {3, 0, 1}, 620},
        {"append rotary", FA_DTYPE_F16, 1, 64, 32, 0, 0, -1, 5, 1, 3, {8, 1, 21}, {1, 3, 2}, 0, {0}, 630},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; ++i) {
        const rot_spec *sp = &specs[i];
        char what[200];
        describe(sp, what, sizeof what);
        scene s;
        scene_build(&s, sp);
        scene_reset(&s);
        fa_status st = scene_append(ctx, &s);
        if (st != FA_SUCCESS) fail_msg("%s: fa_kvcache_append: %s", what, fa_last_error());
        const double units = check_cache(&s, what);
        void *k_app = xdup(s.k_cache, s.cache_n * s.ces), *v_app = xdup(s.v_cache, s.cache_n * s.ces);
        float *ks_app = s.k_scale ? xdup(s.k_scale, s.scale_n * sizeof(float)) : NULL;
        float *vs_app = s.v_scale ? xdup(s.v_scale, s.scale_n * sizeof(float)) : NULL;
        scene_reset(&s);
        st = scene_forward(ctx, &s);
        if (st != FA_SUCCESS) fail_msg("%s: fa_forward_kvcache: %s", what, fa_last_error());
        if (memcmp(k_app, s.k_cache, s.cache_n * s.ces) || memcmp(v_app, s.v_cache, s.cache_n * s.ces))
            fail_msg("%s: fa_kvcache_append's cache differs from fa_forward_kvcache's append", what);
        if (ks_app && (memcmp(ks_app, s.k_scale, s.scale_n * sizeof(float)) || memcmp(vs_app, s.v_scale, s.scale_n * sizeof(float))))
            fail_msg("%s: fa_kvcache_append's scales differ from fa_forward_kvcache's append", what);
        printf("  %-42s = fa_forward_kvcache's append; keys at %.2f of their limit (%s)\n", what, units,
               sp->int8_cache ? "half a scale" : "1e-6");
        free(k_app), free(v_app), free(ks_app), free(vs_app);
        scene_free(&s);
    }
}

/* ---- 5. bad arguments: status, the argument named, nothing written ---------------------------- */
static void expect_untouched(const scene *s, const char *what)
{
    if (memcmp(s->k_cache, s->k_orig, s->cache_n * s->ces) || memcmp(s->v_cache, s->v_orig, s->cache_n * s->ces))
        fail_msg("%s: the cache was written", what);
    for (size_t e = 0; e < s->q_n * s->es; ++e)
        if (((const uint8_t *)s->out)[e] != 0xff) fail_msg("%s: out was written", what);
    for (size_t e = 0; e < s->lse_n; ++e)
        if (!isnan(s->lse[e])) fail_msg("%s: lse was written", what);
}

typedef struct bad_rotary {
    const char *name;
    int append;          /* 1: fa_kvcache_append, else fa_forward_kvcache */
    fa_status expected;
    const char *names[2]; /* each must be in the message */
    void (*mutate)(scene *s, fa_rotary *r, fa_attention_desc *desc);
} bad_rotary;

static void odd_dim(scene *s, fa_rotary *r, fa_attention_desc *desc) { (void)s, (void)desc, r->rotary_dim = 7; }
static void zero_dim(scene *s, fa_rotary *r, fa_attention_desc *desc) { (void)s, (void)desc, r->rotary_dim = 0; }
static void wide_dim(scene *s, fa_rotary *r, fa_attention_desc *desc) { (void)desc, r->rotary_dim = s->sp.d + 2; }
static void null_cos(scene *s, fa_rotary *r, fa_attention_desc *desc) { (void)s, (void)desc, r->cos = NULL; }
static void null_sin(scene *s, fa_rotary *r, fa_attention_desc *desc) { (void)s, (void)desc, r->sin = NULL; }
/* Sequence 1 (10 cached, 2 new) reaches position 11; sequence 0 only 4. */
static void short_tables(scene *s, fa_rotary *r, fa_attention_desc *desc) { (void)s, (void)desc, r->max_position = 11; }
static void interleaved_2(scene *s, fa_rotary *r, fa_attention_desc *desc) { (void)s, (void)desc, r->interleaved = 2; }
static void no_size(scene *s, fa_rotary *r, fa_attention_desc *desc) { (void)s, (void)desc, r->struct_size = 0; }
static void null_k_new(scene *s, fa_rotary *r, fa_attention_desc *desc) { (void)r, (void)desc, s->tk_new.data = NULL; }
static void with_cu_q(scene *s, fa_rotary *r, fa_attention_desc *desc)
{
    (void)r;
    static fa_varlen vl; /* the packed new tokens of the scene, plus query offsets */
    vl = (fa_varlen){s->sp.n, s->cu, s->cu, s->Q, s->Q};
    s->tk_new.batch = s->tv_new.batch = 1;
    s->tk_new.seqlen = s->tv_new.seqlen = s->total;
    desc->varlen = &vl;
}

static const bad_rotary bad_cases[] = {
    {"rotary_dim odd", 0, FA_ERROR_INVALID_VALUE, {"desc->rotary->rotary_dim", "rotary_dim: 7 "}, odd_dim},
    {"rotary_dim 0", 0, FA_ERROR_INVALID_VALUE, {"desc->rotary->rotary_dim", "rotary_dim: 0 "}, zero_dim},
    {"rotary_dim past d", 0, FA_ERROR_INVALID_VALUE, {"desc->rotary->rotary_dim", "rotary_dim: 18 "}, wide_dim},
    {"cos NULL", 0, FA_ERROR_INVALID_VALUE, {"desc->rotary->cos", ""}, null_cos},
    {"sin NULL", 0, FA_ERROR_INVALID_VALUE, {"desc->rotary->sin", ""}, null_sin},
    {"max_position too small", 0, FA_ERROR_INVALID_VALUE, {"desc->rotary->max_position", "sequence 1"}, short_tables},
    {"interleaved 2", 0, FA_ERROR_INVALID_VALUE, {"desc->rotary->interleaved", ""}, interleaved_2},
    {"struct_size 0", 0, FA_ERROR_INVALID_VALUE, {"desc->rotary->struct_size", ""}, no_size},
    {"append: max_position too small", 1, FA_ERROR_INVALID_VALUE, {"desc->rotary->max_position", "sequence 1"}, short_tables},
    {"append: rotary_dim odd", 1, FA_ERROR_INVALID_VALUE, {"desc->rotary->rotary_dim", ""}, odd_dim},
    {"append: k_new NULL", 1, FA_ERROR_INVALID_VALUE, {"k_new", ""}, null_k_new},
    {"append: cu_seqlens_q set", 1, FA_ERROR_INVALID_VALUE, {"desc->varlen->cu_seqlens_q", ""}, with_cu_q},
};

static fa_status call_scene(fa_context *ctx, scene *s, int append, const fa_attention_desc *desc)
{
    const fa_tensor *k_new = s->tk_new.data ? &s->tk_new : NULL;
    if (append) return fa_kvcache_append(ctx, desc, &s->cache, NULL, k_new, &s->tv_new);
    return fa_forward_kvcache(ctx, desc, &s->tq, &s->cache, k_new, &s->tv_new, &s->tout, s->lse);
}

static void test_bad_arguments(void **state)
{
    fa_context *ctx = *state;
    static const rot_spec base = {"bad", FA_DTYPE_F32, 0, 16, 16, 0, 1, -1, 0, 0, 2, {3, 10}, {2, 2}, 0, {0}, 700};
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; ++i) {
        const bad_rotary *c = &bad_cases[i];
        scene s;
        scene_build(&s, &base);
        scene_reset(&s);
        fa_rotary rotary = s.rotary;
        fa_attention_desc desc = s.desc;
        desc.rotary = &rotary;
        c->mutate(&s, &rotary, &desc);
        const fa_status st = call_scene(ctx, &s, c->append, &desc);
        printf("  %-32s %s\n", c->name, fa_last_error());
        test_expect_error(st, c->expected, c->names[0]);
        if (c->names[1][0] && !strstr(fa_last_error(), c->names[1]))
            fail_msg("%s: message '%s' should name '%s'", c->name, fa_last_error(), c->names[1]);
        expect_untouched(&s, c->name);
        scene_free(&s);
    }
    /* Tables of exactly the positions used are enough (sequence 1's last is 11). */
    for (int append = 0; append < 2; ++append) {
        scene s;
        scene_build(&s, &base);
        scene_reset(&s);
        s.rotary.max_position = 12;
        const fa_status st = call_scene(ctx, &s, append, &s.desc);
        if (st != FA_SUCCESS) fail_msg("max_position 12 (%s): %s", append ? "append" : "forward", fa_last_error());
        (void)check_cache(&s, "max_position 12");
        scene_free(&s);
    }
    /* An F32 k_new into an F16 cache (fa_kvcache_append takes the cache's dtype). */
    rot_spec half = base;
    half.dtype = FA_DTYPE_F16;
    scene s;
    scene_build(&s, &half);
    scene_reset(&s);
    float *k32 = calloc(s.new_n, sizeof(float)), *v32 = calloc(s.new_n, sizeof(float));
    assert_true(k32 && v32);
    s.tk_new.data = k32, s.tk_new.dtype = FA_DTYPE_F32;
    s.tv_new.data = v32, s.tv_new.dtype = FA_DTYPE_F32;
    const fa_status st = call_scene(ctx, &s, 1, &s.desc);
    printf("  %-32s %s\n", "append: f32 k_new, f16 cache", fa_last_error());
    test_expect_error(st, FA_ERROR_INVALID_VALUE, "k_new");
    expect_untouched(&s, "append: f32 k_new into an f16 cache");
    free(k32), free(v32);
    scene_free(&s);
}

/* ---- the rotated queries are rounded to q's dtype ----------------------------------------------- */
/* A rotary step gives the same bits (out, lse) as the same step without rotary on queries rotated at
 * their documented positions and rounded to q's dtype beforehand, over the keys the first step
 * appended. The queries are rotated by the library's own append (of each query as a key, at its
 * position, into a scratch cache of q's dtype: the rotation in f32, rounded as stored), so that the
 * equality is exact whatever the f32 arithmetic's order; a query left in f32 changes lse's bits. */
static void test_query_rounding(void **state)
{
    fa_context *ctx = *state;
    static const rot_spec specs[] = {
        {"rounding", FA_DTYPE_F16, 0, 64, 32, 1, 1, -1, 5, 0, 3, {13, 0, 41}, {3, 3, 3}, 0, {0}, 900},
        {"rounding", FA_DTYPE_BF16, 0, 64, 64, 0, 0, -1, 0, 0, 3, {13, 2, 41}, {3, 3, 3}, 0, {0}, 910},
        {"rounding", FA_DTYPE_F16, 0, 32, 32, 0, 1, -1, 0, 1, 3, {10, 4, 5}, {2, 1, 4}, 1, {3, 0, 5}, 920},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; ++i) {
        const rot_spec *sp = &specs[i];
        char what[200];
        describe(sp, what, sizeof what);
        scene s;
        scene_build(&s, sp);
        scene_reset(&s);
        if (scene_forward(ctx, &s) != FA_SUCCESS) fail_msg("%s: %s", what, fa_last_error());
        void *out1 = xdup(s.out, s.q_n * s.es);
        float *lse1 = xdup(s.lse, s.lse_n * sizeof(float));
        /* Query row r (of s.total) as new token 0 of scratch row r, cached up to its position. */
        const int in_order = sp->causal || sp->window_left >= 0;
        const int64_t cap = s.max_position, d = sp->d;
        int32_t *pos = xmalloc((size_t)s.total * sizeof(int32_t));
        for (int b = 0; b < sp->n; ++b)
            for (int64_t t = 0; t < sp->fresh[b]; ++t) pos[new_row(&s, b, t)] = (int32_t)(sp->cached[b] - lp_of(&s, b) + (in_order ? t : 0));
        const size_t scratch_n = (size_t)(s.total * cap * HQ * d);
        void *kq = xmalloc(scratch_n * s.es), *vq = xmalloc(scratch_n * s.es);
        fa_kv_cache scratch = {{kq, sp->dtype, s.total, cap, HQ, d, 0, 0, 0}, {vq, sp->dtype, s.total, cap, HQ, d, 0, 0, 0},
                               NULL, 0, pos};
        const fa_tensor rows = {s.q, sp->dtype, s.total, 1, HQ, d, 0, 0, 0};
        fa_attention_desc plain;
        fa_attention_desc_init(&plain);
        plain.rotary = &s.rotary;
        if (fa_kvcache_append(ctx, &plain, &scratch, NULL, &rows, &rows) != FA_SUCCESS)
            fail_msg("%s: rotating the queries by fa_kvcache_append: %s", what, fa_last_error());
        void *q_rot = xmalloc(s.q_n * s.es);
        for (int64_t r = 0; r < s.total; ++r)
            memcpy((char *)q_rot + (size_t)(r * HQ * d) * s.es, (char *)kq + (size_t)((r * cap + pos[r]) * HQ * d) * s.es,
                   (size_t)(HQ * d) * s.es);
        /* The same step without rotary over the filled cache. */
        int32_t cached2[MAXB];
        for (int b = 0; b < sp->n; ++b) cached2[b] = sp->cached[b] + sp->fresh[b];
        fa_kv_cache cache2 = s.cache;
        cache2.cache_seqlens = cached2;
        fa_attention_desc desc2 = s.desc;
        desc2.rotary = NULL;
        fa_tensor tq2 = s.tq;
        tq2.data = q_rot;
        memset(s.out, 0xff, s.q_n * s.es); /* the cache keeps what the first step appended */
        memset(s.lse, 0xff, s.lse_n * sizeof(float));
        if (fa_forward_kvcache_ex(ctx, &desc2, &tq2, &cache2, sp->slots ? &s.kv_slots : NULL, NULL, NULL, &s.tout, s.lse) !=
            FA_SUCCESS)
            fail_msg("%s: the step on the rotated queries: %s", what, fa_last_error());
        if (memcmp(out1, s.out, s.q_n * s.es) || memcmp(lse1, s.lse, s.lse_n * sizeof(float)))
            fail_msg("%s: out or lse differ from the step on queries rotated and rounded to %s beforehand", what,
                     fa_dtype_label(sp->dtype));
        printf("  %-42s = the step on queries rotated and rounded beforehand, bit for bit\n", what);
        free(pos), free(kq), free(vq), free(q_rot), free(out1), free(lse1);
        scene_free(&s);
    }
}

/* ---- 6. 1 and 2 threads: the same bits -------------------------------------------------------- */
static void test_threads(void **state)
{
    fa_context *ctx = *state;
    static const rot_spec specs[] = {
        {"threads", FA_DTYPE_F16, 0, 64, 64, 0, 1, -1, 16, 0, 3, {300, 37, 150}, {3, 3, 3}, 0, {0}, 800},
        {"threads", FA_DTYPE_F32, 0, 64, 32, 1, 0, -1, 0, 1, 3, {200, 0, 90}, {1, 5, 2}, 1, {17, 0, 3}, 810},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; ++i) {
        char what[200];
        describe(&specs[i], what, sizeof what);
        scene s;
        scene_build(&s, &specs[i]);
        void *out1 = NULL, *k1 = NULL, *v1 = NULL;
        float *lse1 = NULL;
        for (int threads = 1; threads <= 2; ++threads) {
            assert_int_equal(fa_context_set_num_threads(ctx, threads), FA_SUCCESS);
            scene_reset(&s);
            if (scene_forward(ctx, &s) != FA_SUCCESS) fail_msg("%s, %d threads: %s", what, threads, fa_last_error());
            if (threads == 1) {
                out1 = xdup(s.out, s.q_n * s.es);
                lse1 = xdup(s.lse, s.lse_n * sizeof(float));
                k1 = xdup(s.k_cache, s.cache_n * s.ces);
                v1 = xdup(s.v_cache, s.cache_n * s.ces);
                continue;
            }
            if (memcmp(out1, s.out, s.q_n * s.es) || memcmp(lse1, s.lse, s.lse_n * sizeof(float)))
                fail_msg("%s: out or lse differ between 1 and 2 threads", what);
            if (memcmp(k1, s.k_cache, s.cache_n * s.ces) || memcmp(v1, s.v_cache, s.cache_n * s.ces))
                fail_msg("%s: the cache differs between 1 and 2 threads", what);
        }
        double lse_err;
        const double err = oracle_error(&s, &s.desc, s.q, s.out, s.lse, s.cu, s.Q, s.cached, specs[i].fresh, &lse_err);
        printf("  %-42s 1 and 2 threads bit-identical; out error %.2e\n", what, err);
        assert_true(err <= out_tolerance(specs[i].dtype) && lse_err <= out_tolerance(specs[i].dtype));
        free(out1), free(lse1), free(k1), free(v1);
        scene_free(&s);
    }
    assert_int_equal(fa_context_set_num_threads(ctx, 0), FA_SUCCESS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rotary_oracle), cmocka_unit_test(test_rotary_softcap), cmocka_unit_test(test_rotary_ragged),
        cmocka_unit_test(test_rotary_leftpad), cmocka_unit_test(test_append_plain),
        cmocka_unit_test(test_append_rotary), cmocka_unit_test(test_query_rounding),
        cmocka_unit_test(test_bad_arguments), cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

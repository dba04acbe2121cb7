/* Quantised KV caches (FA_DTYPE_I8, FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E5M2; flashattn.h, "quantised KV
 * caches") on the CPU:
 * - against the fp64 oracle on the DEQUANTISED cache (code x scale), k and v each int8 or FP8, q in
 *   f32/f16/bf16, contiguous and paged (a shuffled block table), GQA 8:2, d 64 and 80, sequences of
 *   0, 37 and 300 cached tokens, 1..3 queries and 1..3 appended tokens, several split chunks;
 * - the append: every appended code and int8 scale equals the quantisation the test computes
 *   itself (quant_codes.h's rules, and those checked against a brute-force reference written here:
 *   nearest finite code, ties to even, saturating; int8 by rintf), and every other byte of the cache
 *   and its scales is unchanged; new tokens at exact rounding midpoints;
 * - ragged queries (desc->varlen) with fa_kv_slots (rows and left padding) on an int8 cache;
 * - bit-identical results on 1 and 2 threads;
 * - NaN rules: a non-finite appended int8 row (scale NaN, codes 0), FP8 NaN on append (0x7F) and
 *   saturation (+-inf -> max finite), NaN codes in the cache: exactly the rows (for an FP8 V element:
 *   the column) that see them become NaN;
 * - bad scales and dtypes: status, the argument named, nothing written;
 * - a report of the error against the UNQUANTISED values (printed; asserted only against loose
 *   bounds).
 * Cache positions no sequence owns hold NaN (FP8 NaN codes, int8 scale NaN), so a read past a
 * sequence's keys shows up. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/quant_codes.h"
#include "flashattn.h"
#include "harness.h"
#include "oracle.h"
#include "test_arrays.h"

#define HQ 8
#define HKV 2
#define MAXB 4

/* ---- the test's own codes: an FP8 decoder from the OCP definition, brute-force encoders -------- */
static int is_fp8(fa_dtype t) { return t == FA_DTYPE_FP8_E4M3 || t == FA_DTYPE_FP8_E5M2; }
static int is_quant(fa_dtype t) { return t == FA_DTYPE_I8 || is_fp8(t); }
static size_t cache_es(fa_dtype t) { return is_quant(t) ? 1 : test_dtype_size(t); }
static uint8_t fp8_max_code(fa_dtype t) { return t == FA_DTYPE_FP8_E4M3 ? 0x7e : 0x7b; }

static const char *label(fa_dtype t)
{
    switch (t) {
    case FA_DTYPE_I8: return "i8";
    case FA_DTYPE_FP8_E4M3: return "e4m3";
    case FA_DTYPE_FP8_E5M2: return "e5m2";
    default: return fa_dtype_label(t);
    }
}

/* OCP FP8 v1.0: E4M3 bias 7, S.1111.111 NaN, no infinities; E5M2 bias 15, IEEE-like. */
static double ref_fp8_decode(uint8_t code, fa_dtype t)
{
    const double sign = code & 0x80 ? -1.0 : 1.0;
    double v;
    if (t == FA_DTYPE_FP8_E4M3) {
        const int e = (code >> 3) & 15, m = code & 7;
        if (e == 15 && m == 7) return NAN;
        v = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
    } else {
        const int e = (code >> 2) & 31, m = code & 3;
        if (e == 31) return m ? NAN : sign * INFINITY;
        v = e ? ldexp(4 + m, e - 17) : ldexp(m, -16);
    }
    return sign * v;
}

/* The nearest finite code of x's sign, ties to the even code; NaN -> 0x7F; +-inf -> +-max. */
static uint8_t ref_fp8_encode(float x, fa_dtype t)
{
    if (isnan(x)) return 0x7f;
    const uint8_t sign = signbit(x) ? 0x80 : 0x00, max = fp8_max_code(t);
    const double a = fabs((double)x);
    if (isinf(a)) return (uint8_t)(sign | max);
    uint8_t best = 0;
    double best_d = a;
    for (int m = 1; m <= max; ++m) {
        const double dist = fabs(ref_fp8_decode((uint8_t)m, t) - a);
        if (dist < best_d || (dist == best_d && !(m & 1))) best = (uint8_t)m, best_d = dist;
    }
    return (uint8_t)(sign | best);
}

/* int8 by the contract's words: scale max|x| / 127 (0 for a zero row, NaN for a non-finite one),
 * codes round(x / scale) to nearest even, in [-127, 127], 0 where the scale is 0 or NaN. */
static float ref_i8_scale(const float *x, int64_t d)
{
    float absmax = 0.0f;
    for (int64_t e = 0; e < d; ++e) {
        if (!isfinite(x[e])) return NAN;
        if (fabsf(x[e]) > absmax) absmax = fabsf(x[e]);
    }
    return absmax / 127.0f;
}

static int8_t ref_i8_code(float x, float scale)
{
    if (scale == 0.0f || isnan(scale)) return 0;
    float q = rintf(x / scale);
    if (q > 127.0f) q = 127.0f;
    if (q < -127.0f) q = -127.0f;
    return (int8_t)q;
}

/* The codes (and int8 scale) of one appended row x[d] of a cache tensor of dtype t: quant_codes.h's
 * rules, each code also checked against the reference above, so that a fault shared by the library
 * and quant_codes.h still shows up. descale: FP8's (1 without). */
static void expect_row(fa_dtype t, const float *x, int64_t d, float descale, uint8_t *codes, float *scale)
{
    if (t == FA_DTYPE_I8) {
        float absmax = 0.0f;
        for (int64_t e = 0; e < d; ++e) {
            const float a = fabsf(x[e]);
            absmax = a > absmax || a != a ? a : absmax;
        }
        const float s = fa_i8_scale(absmax), ref = ref_i8_scale(x, d);
        if (memcmp(&s, &ref, sizeof s) != 0 && !(isnan(s) && isnan(ref)))
            fail_msg("quant_codes.h: int8 scale %a, the reference %a (absmax %a)", (double)s, (double)ref, (double)absmax);
        *scale = s;
        for (int64_t e = 0; e < d; ++e) {
            const int8_t c = fa_f32_to_i8(x[e], s), rc = ref_i8_code(x[e], ref);
            if (c != rc) fail_msg("quant_codes.h: int8 code of %a / %a is %d, the reference's %d", (double)x[e], (double)s, c, rc);
            codes[e] = (uint8_t)c;
        }
        return;
    }
    for (int64_t e = 0; e < d; ++e) {
        const float y = x[e] / descale;
        const uint8_t c = t == FA_DTYPE_FP8_E4M3 ? fa_f32_to_fp8_e4m3(y) : fa_f32_to_fp8_e5m2(y);
        const uint8_t rc = ref_fp8_encode(y, t);
        if (c != rc) fail_msg("quant_codes.h: %s code of %a is 0x%02x, the reference's 0x%02x", label(t), (double)y, c, rc);
        codes[e] = c;
    }
}

/* The value of a code: int8 x its scale, FP8 x its descale (factor). */
static double dequant(fa_dtype t, uint8_t code, float factor)
{
    if (t == FA_DTYPE_I8) return (double)(int8_t)code * (double)factor;
    return ref_fp8_decode(code, t) * (double)factor;
}

/* ---- a random stream (codes, scales) ---------------------------------------------------------- */
static uint64_t rng_state;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_unit(void) { return (double)(rng_next() >> 11) * 0x1p-53; } /* [0, 1) */

/* A random finite FP8 code of magnitude at most `limit` (cached tokens: moderate values). */
static uint8_t random_fp8(fa_dtype t, double limit)
{
    for (;;) {
        const uint8_t c = (uint8_t)rng_next();
        const double v = ref_fp8_decode(c, t);
        if (isfinite(v) && fabs(v) <= limit) return c;
    }
}

/* ---- one call's buffers ----------------------------------------------------------------------- */
enum value_mode { VALUES_UNIFORM, VALUES_TIES, VALUES_NORMAL };

typedef struct qcase {
    char name[160];
    fa_dtype kdt, vdt, qdt; /* cache k, cache v (F16/F32 only in the error cases), q */
    int64_t d, page_size, capacity;
    int batch;
    int32_t cached[MAXB];
    int64_t seqlen_q, seqlen_new;
    int causal;
    int32_t window_left;
    int64_t split;   /* desc->kv_split_tokens */
    int heads_outer; /* bit 0: K, bit 1: V laid out [slots, heads_kv, slot_len, d] */
    int no_descale;  /* FP8: descales NULL (= 1) */
    int values;      /* enum value_mode of q, k_new and v_new */
} qcase;

typedef struct qrun {
    qcase c;
    int64_t slots, slot_len, max_pages;
    int32_t cached[MAXB];
    int32_t *table;
    size_t cache_n, scale_n, q_n, new_n;
    uint8_t *kc, *vc, *k_expect, *v_expect;
    float *k_scale, *v_scale, *k_scale_expect, *v_scale_expect; /* int8 tensors only */
    float *k_descale, *v_descale;                               /* FP8 tensors with descales only */
    void *q, *k_new, *v_new, *out;
    float *lse;
    fa_tensor tq, tk_new, tv_new, tout;
    fa_kv_cache cache;
    fa_kv_scales scales;
    fa_attention_desc desc;
} qrun;

static void slot_of(const qrun *r, int64_t b, int64_t j, int64_t *slot, int64_t *row)
{
    if (!r->table) {
        *slot = b;
        *row = j;
        return;
    }
    *slot = r->table[b * r->max_pages + j / r->slot_len];
    *row = j % r->slot_len;
}

/* Element x of kv head h at (slot, row) of the K (tensor 0) or V (1) cache. */
static size_t cache_index(const qrun *r, int tensor, int64_t slot, int64_t row, int64_t h, int64_t x)
{
    const int64_t d = r->c.d;
    if (r->c.heads_outer >> tensor & 1) return (size_t)(((slot * HKV + h) * r->slot_len + row) * d + x);
    return (size_t)(((slot * r->slot_len + row) * HKV + h) * d + x);
}

/* The int8 scale of (slot, row, h): packed [slots, slot_len, heads_kv] whatever the cache's strides. */
static size_t scale_index(const qrun *r, int64_t slot, int64_t row, int64_t h)
{
    return (size_t)((slot * r->slot_len + row) * HKV + h);
}

static float descale_of(const float *descale, int64_t b, int64_t h) { return descale ? descale[b * HKV + h] : 1.0f; }

/* The factor of key j of sequence b, kv head h (the cache after the call). */
static float factor_of(const qrun *r, int tensor, int64_t b, int64_t slot, int64_t row, int64_t h)
{
    const fa_dtype t = tensor ? r->c.vdt : r->c.kdt;
    if (t == FA_DTYPE_I8) return (tensor ? r->v_scale : r->k_scale)[scale_index(r, slot, row, h)];
    return descale_of(tensor ? r->v_descale : r->k_descale, b, h);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

static float *float_array(size_t n, float value)
{
    float *x = xmalloc(n * sizeof *x);
    for (size_t e = 0; e < n; ++e) x[e] = value;
    return x;
}

static double normal_from(double u1, double u2) /* u in [-1, 1): Box-Muller */
{
    const double a = (u1 + 1.0) * 0.5, b = (u2 + 1.0) * 0.5;
    return sqrt(-2.0 * log(1.0 - a)) * cos(6.283185307179586 * b);
}

/* n elements of dtype t: uniform in [-1, 1) or unit normal. */
static void *values(size_t n, fa_dtype t, uint64_t seed, int normal)
{
    double *x = test_random_doubles(seed, 2 * n);
    void *buf = xmalloc(n * test_dtype_size(t) + 1);
    for (size_t e = 0; e < n; ++e) test_store_element(buf, e, t, normal ? normal_from(x[2 * e], x[2 * e + 1]) : x[e]);
    free(x);
    return buf;
}

/* New tokens at exact rounding midpoints of the cache dtype t (row by row of d elements): FP8
 * halfway between two neighbouring codes (x descale), int8 a row of absmax 127/64 (scale 1/64
 * exactly) and the rest at n + 1/2 steps. Exact in f32, f16 and bf16. */
static void fill_ties(void *buf, size_t rows, int64_t d, fa_dtype qdt, fa_dtype t, float descale)
{
    for (size_t r = 0; r < rows; ++r)
        for (int64_t e = 0; e < d; ++e) {
            const double sign = rng_next() & 1 ? -1.0 : 1.0;
            double v;
            if (t == FA_DTYPE_I8) {
                v = e == 0 ? 127.0 / 64.0 : ((double)(rng_next() % 127) + 0.5) / 64.0;
            } else {
                uint8_t m;
                do m = (uint8_t)(rng_next() % fp8_max_code(t));
                while (ref_fp8_decode((uint8_t)(m + 1), t) > 4.0);
                v = 0.5 * (ref_fp8_decode(m, t) + ref_fp8_decode((uint8_t)(m + 1), t)) * descale;
            }
            test_store_element(buf, r * (size_t)d + (size_t)e, qdt, sign * v);
        }
}

/* The buffers of case c, before any expectation (a test may plant values in between). */
static void qrun_setup(qrun *r, const qcase *c, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    r->c = *c;
    rng_state = seed;
    const int64_t d = c->d, B = c->batch;
    memcpy(r->cached, c->cached, sizeof r->cached);
    if (c->page_size) {
        r->slot_len = c->page_size;
        r->max_pages = (c->capacity + c->page_size - 1) / c->page_size;
        r->slots = B * r->max_pages + 2; /* two pages nobody uses */
        int32_t *perm = xmalloc((size_t)r->slots * sizeof *perm);
        for (int64_t x = 0; x < r->slots; ++x) perm[x] = (int32_t)x;
        for (int64_t x = r->slots - 1; x > 0; --x) { /* Fisher-Yates */
            const int64_t y = (int64_t)(rng_next() % (uint64_t)(x + 1));
            const int32_t t = perm[x];
            perm[x] = perm[y], perm[y] = t;
        }
        r->table = xmalloc((size_t)(B * r->max_pages) * sizeof *r->table);
        memcpy(r->table, perm, (size_t)(B * r->max_pages) * sizeof *r->table);
        free(perm);
    } else {
        r->slot_len = c->capacity;
        r->slots = B;
    }
    r->cache_n = (size_t)(r->slots * r->slot_len * HKV * d);
    r->scale_n = (size_t)(r->slots * r->slot_len * HKV);
    const fa_dtype dts[2] = {c->kdt, c->vdt};
    uint8_t *caches[2];
    float *scales[2] = {NULL, NULL}, *descales[2] = {NULL, NULL};
    for (int t = 0; t < 2; ++t) {
        caches[t] = xmalloc(r->cache_n * cache_es(dts[t]));
        /* Every position nobody owns: NaN codes, int8 NaN scales (random codes), f16 NaN. */
        for (size_t e = 0; e < r->cache_n; ++e) {
            if (is_fp8(dts[t])) caches[t][e] = 0x7f;
            else if (dts[t] == FA_DTYPE_I8) caches[t][e] = (uint8_t)rng_next();
            else test_store_element(caches[t], e, dts[t], NAN);
        }
        if (dts[t] == FA_DTYPE_I8) scales[t] = float_array(r->scale_n, NAN);
        if (is_fp8(dts[t]) && !c->no_descale) {
            descales[t] = float_array((size_t)(B * HKV), 1.0f);
            for (int64_t x = 0; x < B * HKV; ++x)
                descales[t][x] = c->values == VALUES_TIES ? 0.5f
                                 : c->values == VALUES_NORMAL ? (dts[t] == FA_DTYPE_FP8_E4M3 ? 1.0f / 64 : 1.0f / 4096)
                                                              : (float)(0.01 + 0.09 * rng_unit());
            /* A small descale: appended values of sequence 2, kv head 1 saturate in E4M3. */
            if (c->values == VALUES_UNIFORM && B >= 3) descales[t][2 * HKV + 1] = 0.0015f;
        }
        for (int64_t b = 0; b < B; ++b)
            for (int64_t j = 0; j < c->cached[b]; ++j) {
                int64_t slot, row;
                slot_of(r, b, j, &slot, &row);
                for (int64_t h = 0; h < HKV; ++h) {
                    for (int64_t x = 0; x < d; ++x) {
                        const size_t at = cache_index(r, t, slot, row, h, x);
                        if (is_fp8(dts[t])) caches[t][at] = random_fp8(dts[t], 16.0);
                        else if (dts[t] == FA_DTYPE_I8) caches[t][at] = (uint8_t)(int8_t)((int)(rng_next() % 255) - 127);
                        else test_store_element(caches[t], at, dts[t], 2.0 * rng_unit() - 1.0);
                    }
                    if (scales[t]) scales[t][scale_index(r, slot, row, h)] = (float)((1.0 + rng_unit()) / 127.0);
                }
            }
    }
    r->kc = caches[0], r->vc = caches[1];
    r->k_scale = scales[0], r->v_scale = scales[1];
    r->k_descale = descales[0], r->v_descale = descales[1];
    r->q_n = (size_t)(B * c->seqlen_q * HQ * d);
    r->new_n = (size_t)(B * c->seqlen_new * HKV * d);
    const int normal = c->values == VALUES_NORMAL;
    r->q = values(r->q_n, c->qdt, seed + 1, normal);
    r->k_new = values(r->new_n, c->qdt, seed + 2, normal);
    r->v_new = values(r->new_n, c->qdt, seed + 3, normal);
    if (c->values == VALUES_TIES) {
        fill_ties(r->k_new, r->new_n / (size_t)d, d, c->qdt, c->kdt, r->k_descale ? 0.5f : 1.0f);
        fill_ties(r->v_new, r->new_n / (size_t)d, d, c->qdt, c->vdt, r->v_descale ? 0.5f : 1.0f);
    }
    const size_t qbytes = r->q_n * test_dtype_size(c->qdt);
    r->out = xmalloc(qbytes);
    memset(r->out, 0xa5, qbytes); /* a canary: rows the call must write, or must not */
    r->lse = xmalloc((size_t)(B * HQ * c->seqlen_q) * sizeof(float));
    memset(r->lse, 0xa5, (size_t)(B * HQ * c->seqlen_q) * sizeof(float));
    r->tq = (fa_tensor){r->q, c->qdt, B, c->seqlen_q, HQ, d, 0, 0, 0};
    r->tout = (fa_tensor){r->out, c->qdt, B, c->seqlen_q, HQ, d, 0, 0, 0};
    r->tk_new = (fa_tensor){r->k_new, c->qdt, B, c->seqlen_new, HKV, d, 0, 0, 0};
    r->tv_new = (fa_tensor){r->v_new, c->qdt, B, c->seqlen_new, HKV, d, 0, 0, 0};
    r->cache.k = (fa_tensor){r->kc, c->kdt, r->slots, r->slot_len, HKV, d, 0, 0, 0};
    r->cache.v = (fa_tensor){r->vc, c->vdt, r->slots, r->slot_len, HKV, d, 0, 0, 0};
    fa_tensor *layouts[2] = {&r->cache.k, &r->cache.v};
    for (int t = 0; t < 2; ++t)
        if (c->heads_outer >> t & 1) {
            layouts[t]->stride_seq = d;
            layouts[t]->stride_head = r->slot_len * d;
            layouts[t]->stride_batch = HKV * r->slot_len * d;
        }
    r->cache.block_table = r->table;
    r->cache.max_pages_per_seq = r->max_pages;
    r->cache.cache_seqlens = r->cached;
    fa_kv_scales_init(&r->scales);
    r->scales.k_scale = r->k_scale;
    r->scales.v_scale = r->v_scale;
    r->scales.k_descale = r->k_descale;
    r->scales.v_descale = r->v_descale;
    fa_attention_desc_init(&r->desc);
    r->desc.causal = c->causal;
    r->desc.window_left = c->window_left;
    r->desc.kv_split_tokens = c->split;
    r->desc.kv_scales = &r->scales;
}

/* The expected cache and scales after the append, from the buffers as they are now. */
static void qrun_expect(qrun *r)
{
    const qcase *c = &r->c;
    const int64_t d = c->d;
    r->k_expect = xmalloc(r->cache_n);
    r->v_expect = xmalloc(r->cache_n);
    memcpy(r->k_expect, r->kc, r->cache_n);
    memcpy(r->v_expect, r->vc, r->cache_n);
    if (r->k_scale) {
        r->k_scale_expect = xmalloc(r->scale_n * sizeof(float));
        memcpy(r->k_scale_expect, r->k_scale, r->scale_n * sizeof(float));
    }
    if (r->v_scale) {
        r->v_scale_expect = xmalloc(r->scale_n * sizeof(float));
        memcpy(r->v_scale_expect, r->v_scale, r->scale_n * sizeof(float));
    }
    float *x = xmalloc((size_t)d * sizeof(float));
    uint8_t *codes = xmalloc((size_t)d);
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t t = 0; t < c->seqlen_new; ++t) {
            int64_t slot, row;
            slot_of(r, b, r->cached[b] + t, &slot, &row);
            for (int64_t h = 0; h < HKV; ++h)
                for (int tensor = 0; tensor < 2; ++tensor) {
                    const fa_dtype dt = tensor ? c->vdt : c->kdt;
                    const void *src = tensor ? r->v_new : r->k_new;
                    for (int64_t e = 0; e < d; ++e)
                        x[e] = (float)test_load_element(src, (size_t)(((b * c->seqlen_new + t) * HKV + h) * d + e), c->qdt);
                    float scale = 0.0f;
                    expect_row(dt, x, d, descale_of(tensor ? r->v_descale : r->k_descale, b, h), codes, &scale);
                    for (int64_t e = 0; e < d; ++e) (tensor ? r->v_expect : r->k_expect)[cache_index(r, tensor, slot, row, h, e)] = codes[e];
                    float *se = tensor ? r->v_scale_expect : r->k_scale_expect;
                    if (se) se[scale_index(r, slot, row, h)] = scale;
                }
        }
    free(x);
    free(codes);
}

static void qrun_free(qrun *r)
{
    void *all[] = {r->table, r->kc, r->vc, r->k_expect, r->v_expect, r->k_scale, r->v_scale, r->k_scale_expect,
                   r->v_scale_expect, r->k_descale, r->v_descale, r->q, r->k_new, r->v_new, r->out, r->lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]);
    memset(r, 0, sizeof *r);
}

static fa_status qrun_call(fa_context *ctx, qrun *r)
{
    const int fresh = r->c.seqlen_new > 0;
    return fa_forward_kvcache(ctx, &r->desc, &r->tq, &r->cache, fresh ? &r->tk_new : NULL, fresh ? &r->tv_new : NULL,
                              &r->tout, r->lse);
}

/* The cache and its scales after the call equal the expectation, byte for byte. */
static void check_append(const qrun *r)
{
    for (int t = 0; t < 2; ++t) {
        const uint8_t *got = t ? r->vc : r->kc, *want = t ? r->v_expect : r->k_expect;
        for (size_t e = 0; e < r->cache_n; ++e)
            if (got[e] != want[e])
                fail_msg("%s: cache->%s element %zu is 0x%02x, expected 0x%02x (%zu elements per token and head)", r->c.name,
                         t ? "v" : "k", e, got[e], want[e], (size_t)r->c.d);
        const float *gs = t ? r->v_scale : r->k_scale, *ws = t ? r->v_scale_expect : r->k_scale_expect;
        for (size_t e = 0; gs && e < r->scale_n; ++e)
            if (memcmp(&gs[e], &ws[e], sizeof(float)) != 0)
                fail_msg("%s: %s_scale[%zu] is %a, expected %a", r->c.name, t ? "v" : "k", e, (double)gs[e], (double)ws[e]);
    }
}

/* ---- comparisons against the oracle ------------------------------------------------------------ */
typedef struct errs {
    double out, lse;
    size_t nan_out, nan_lse; /* NaN in the oracle's (and then the library's) results */
} errs;

/* max |got - ref| / max(1, max |ref|) over the finite refs; a NaN ref needs a NaN got, an infinite
 * ref the same infinity; INFINITY otherwise (a non-finite got where ref is finite). */
static double nan_aware_error(const double *ref, const double *got, size_t n, size_t *nans)
{
    double worst = 0.0, largest = 1.0;
    for (size_t e = 0; e < n; ++e) {
        if (isnan(ref[e])) {
            ++*nans;
            if (!isnan(got[e])) return INFINITY;
            continue;
        }
        if (isinf(ref[e])) {
            if (got[e] != ref[e]) return INFINITY;
            continue;
        }
        if (!isfinite(got[e])) return INFINITY;
        worst = fmax(worst, fabs(got[e] - ref[e]));
        largest = fmax(largest, fabs(ref[e]));
    }
    return worst / largest;
}

/* One sequence: the oracle on q (sq rows), k, v (keys rows, dequantised) against got out/lse. */
static void oracle_compare(const fa_attention_desc *base, int64_t d, int64_t sq, int64_t keys, const double *q, const double *k,
                           const double *v, const double *got_out, const double *got_lse, errs *e)
{
    const oracle_shape shape = {1, HQ, HKV, sq, keys, d};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = base->causal;
    desc.window_left = base->window_left;
    desc.window_right = base->window_right;
    desc.softmax_scale = base->softmax_scale;
    desc.softcap = base->softcap; /* the modifiers: per head, host arrays (test_modifiers) */
    desc.sinks = base->sinks;
    desc.alibi_slopes = base->alibi_slopes;
    const size_t on = (size_t)(sq * HQ * d), ln = (size_t)(sq * HQ);
    double *out = xmalloc(on * sizeof(double)), *lse = xmalloc(ln * sizeof(double));
    oracle_forward(&shape, &desc, q, k, v, out, lse);
    e->out = fmax(e->out, nan_aware_error(out, got_out, on, &e->nan_out));
    e->lse = fmax(e->lse, nan_aware_error(lse, got_lse, ln, &e->nan_lse));
    free(out);
    free(lse);
}

/* Every sequence of r against the oracle on its dequantised cache after the call. */
static errs check_oracle(const qrun *r)
{
    const qcase *c = &r->c;
    const int64_t d = c->d, sq = c->seqlen_q;
    errs e = {0, 0, 0, 0};
    for (int64_t b = 0; b < c->batch; ++b) {
        const int64_t keys = r->cached[b] + c->seqlen_new;
        double *q = xmalloc((size_t)(sq * HQ * d) * sizeof(double)), *out = xmalloc((size_t)(sq * HQ * d) * sizeof(double));
        double *lse = xmalloc((size_t)(sq * HQ) * sizeof(double));
        double *k = xmalloc((size_t)(keys * HKV * d) * sizeof(double)), *v = xmalloc((size_t)(keys * HKV * d) * sizeof(double));
        const size_t q0 = (size_t)(b * sq * HQ * d);
        for (size_t x = 0; x < (size_t)(sq * HQ * d); ++x) {
            q[x] = test_load_element(r->q, q0 + x, c->qdt);
            out[x] = test_load_element(r->out, q0 + x, c->qdt);
        }
        for (size_t x = 0; x < (size_t)(sq * HQ); ++x) lse[x] = r->lse[(size_t)(b * HQ * sq) + x];
        for (int64_t j = 0; j < keys; ++j) {
            int64_t slot, row;
            slot_of(r, b, j, &slot, &row);
            for (int64_t h = 0; h < HKV; ++h) {
                const float fk = factor_of(r, 0, b, slot, row, h), fv = factor_of(r, 1, b, slot, row, h);
                for (int64_t x = 0; x < d; ++x) {
                    k[(j * HKV + h) * d + x] = dequant(c->kdt, r->kc[cache_index(r, 0, slot, row, h, x)], fk);
                    v[(j * HKV + h) * d + x] = dequant(c->vdt, r->vc[cache_index(r, 1, slot, row, h, x)], fv);
                }
            }
        }
        oracle_compare(&r->desc, d, sq, keys, q, k, v, out, lse, &e);
        free(q), free(out), free(lse), free(k), free(v);
    }
    return e;
}

/* The tolerances of the other kvcache tests against the oracle: out by q's dtype (relative to
 * max(1, max |ref|)), lse (fp32 in every dtype) at the f32 bound. */
static void expect_within(const qrun *r, const errs *e)
{
    const double tol = fa_case_tolerance(r->c.qdt), lse_tol = fa_case_tolerance(FA_DTYPE_F32);
    if (!(e->out <= tol) || !(e->lse <= lse_tol))
        fail_msg("%s: against the oracle on the dequantised cache: out %.3g (limit %.1g), lse %.3g (limit %.1g)", r->c.name,
                 e->out, tol, e->lse, lse_tol);
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

/* The whole check of one case: call, append, oracle (no NaN anywhere). */
static void run_oracle_case(fa_context *ctx, const qcase *c, uint64_t seed)
{
    qrun r;
    qrun_setup(&r, c, seed);
    qrun_expect(&r);
    if (qrun_call(ctx, &r) != FA_SUCCESS) fail_msg("%s: %s", c->name, fa_last_error());
    check_append(&r);
    assert_memory_equal(r.cached, c->cached, sizeof r.cached); /* cache_seqlens is not modified */
    const errs e = check_oracle(&r);
    print_message("  %-44s out %.2e  lse %.2e\n", c->name, e.out, e.lse);
    if (e.nan_out || e.nan_lse) fail_msg("%s: the oracle gave NaN (a read of an unowned position?)", c->name);
    expect_within(&r, &e);
    qrun_free(&r);
}

/* ---- 1. the oracle on the dequantised cache ----------------------------------------------------- */
static void test_oracle_dequantised(void **state)
{
    fa_context *ctx = *state;
    static const fa_dtype combos[][2] = {{FA_DTYPE_I8, FA_DTYPE_I8},
                                         {FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E4M3},
                                         {FA_DTYPE_FP8_E5M2, FA_DTYPE_FP8_E5M2},
                                         {FA_DTYPE_I8, FA_DTYPE_FP8_E5M2},
                                         {FA_DTYPE_FP8_E4M3, FA_DTYPE_I8}};
    static const fa_dtype qdts[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    int n = 0;
    for (size_t cb = 0; cb < sizeof combos / sizeof combos[0]; ++cb)
        for (size_t qd = 0; qd < 3; ++qd)
            for (int paged = 0; paged < 2; ++paged)
                for (int dd = 0; dd < 2; ++dd, ++n) {
                    qcase c;
                    memset(&c, 0, sizeof c);
                    c.kdt = combos[cb][0], c.vdt = combos[cb][1], c.qdt = qdts[qd];
                    c.d = dd ? 80 : 64;
                    c.page_size = paged ? 16 : 0;
                    c.capacity = 310;
                    c.batch = 3;
                    c.cached[0] = 0, c.cached[1] = 37, c.cached[2] = 300;
                    c.seqlen_q = 1 + n % 3;
                    c.seqlen_new = 1 + (n / 3) % 3;
                    c.causal = 1;
                    c.window_left = n % 5 == 4 ? 40 : -1;
                    c.split = n % 2 ? 0 : 64; /* 64: the 300-key sequence in 5 chunks */
                    c.heads_outer = n % 4 == 3 ? 3 : n % 8 == 5 ? 2 : 0;
                    c.no_descale = n % 6 == 5;
                    snprintf(c.name, sizeof c.name, "k %s v %s q %s %s d%lld sq%lld new%lld%s%s%s%s", label(c.kdt),
                             label(c.vdt), label(c.qdt), paged ? "paged16" : "contig", (long long)c.d, (long long)c.seqlen_q,
                             (long long)c.seqlen_new, c.split ? " split64" : "", c.window_left >= 0 ? " win40" : "",
                             c.heads_outer ? " heads-outer" : "", c.no_descale && (is_fp8(c.kdt) || is_fp8(c.vdt)) ? " no-descale" : "");
                    run_oracle_case(ctx, &c, 1000 + (uint64_t)n * 16);
                }
}

/* Score modifiers on a quantised cache (softcap, sinks, ALiBi): the CPU's per-sequence path
 * gathers the dequantised keys (new tokens as the append stores them) in f32; against the oracle on
 * the dequantised cache, with the modifiers, like the decode path. */
static void test_modifiers(void **state)
{
    fa_context *ctx = *state;
    static const float sinks[HQ] = {0.5f, -1.0f, 0.0f, 1.0f, 0.25f, 2.0f, -0.5f, 0.75f};
    static const float slopes[HQ] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f, 0.0078125f, 0.00390625f};
    static const fa_dtype combos[][2] = {{FA_DTYPE_I8, FA_DTYPE_I8}, {FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E5M2},
                                         {FA_DTYPE_FP8_E5M2, FA_DTYPE_I8}};
    for (int n = 0; n < 6; ++n) {
        qcase c;
        memset(&c, 0, sizeof c);
        c.kdt = combos[n % 3][0], c.vdt = combos[n % 3][1], c.qdt = n < 3 ? FA_DTYPE_F32 : FA_DTYPE_F16;
        c.d = 64, c.page_size = n % 2 ? 16 : 0, c.capacity = 120, c.batch = 3;
        c.cached[0] = 0, c.cached[1] = 37, c.cached[2] = 100;
        c.seqlen_q = 2, c.seqlen_new = 2, c.causal = 1, c.window_left = -1;
        snprintf(c.name, sizeof c.name, "modifiers k %s v %s q %s %s", label(c.kdt), label(c.vdt), label(c.qdt),
                 c.page_size ? "paged16" : "contig");
        qrun r;
        qrun_setup(&r, &c, 3000 + (uint64_t)n * 16);
        qrun_expect(&r);
        r.desc.softcap = n % 2 ? 0.0f : 8.0f;
        r.desc.sinks = n % 3 == 1 ? sinks : NULL;
        r.desc.alibi_slopes = n % 3 == 2 ? slopes : NULL;
        if (qrun_call(ctx, &r) != FA_SUCCESS) fail_msg("%s: %s", c.name, fa_last_error());
        check_append(&r);
        const errs e = check_oracle(&r);
        print_message("  %-44s out %.2e  lse %.2e\n", c.name, e.out, e.lse);
        if (e.nan_out || e.nan_lse) fail_msg("%s: the oracle gave NaN", c.name);
        expect_within(&r, &e);
        qrun_free(&r);
    }
}

/* New tokens exactly halfway between two codes: rounding to nearest even, in the library's append
 * and in quant_codes.h, against the test's brute-force reference. */
static void test_append_ties(void **state)
{
    fa_context *ctx = *state;
    static const struct {
        fa_dtype k, v, q;
        int no_descale, paged;
    } ties[] = {
        {FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E5M2, FA_DTYPE_F32, 0, 0},
        {FA_DTYPE_FP8_E5M2, FA_DTYPE_FP8_E4M3, FA_DTYPE_BF16, 1, 1},
        {FA_DTYPE_I8, FA_DTYPE_I8, FA_DTYPE_F16, 0, 1},
        {FA_DTYPE_I8, FA_DTYPE_FP8_E4M3, FA_DTYPE_BF16, 0, 0},
    };
    for (size_t x = 0; x < sizeof ties / sizeof ties[0]; ++x) {
        qcase c;
        memset(&c, 0, sizeof c);
        c.kdt = ties[x].k, c.vdt = ties[x].v, c.qdt = ties[x].q;
        c.d = 64, c.page_size = ties[x].paged ? 8 : 0, c.capacity = 64, c.batch = 2;
        c.cached[0] = 20, c.cached[1] = 5;
        c.seqlen_q = 2, c.seqlen_new = 16, c.causal = 1, c.window_left = -1;
        c.no_descale = ties[x].no_descale;
        c.values = VALUES_TIES;
        snprintf(c.name, sizeof c.name, "ties: k %s v %s q %s%s", label(c.kdt), label(c.vdt), label(c.qdt),
                 c.no_descale ? " no-descale" : " descale 0.5");
        run_oracle_case(ctx, &c, 7000 + x);
    }
}

/* ---- 2. ragged queries and slots on an int8 cache ------------------------------------------------ */
/* Sequences reading rows 3, 0, 4 of a five-row int8 cache, ignoring their first 2, 0, 7 positions
 * (which hold NaN scales), with 2, 1, 3 query rows and 1, 3, 3 new tokens (cu_seqlens_k). */
static void test_ragged_slots(void **state)
{
    fa_context *ctx = *state;
    enum { ROWS = 5, CAP = 64, D = 64, NSEQ = 3 };
    static const int32_t idx[NSEQ] = {3, 0, 4}, pad[NSEQ] = {2, 0, 7}, nq[NSEQ] = {2, 1, 3}, nn[NSEQ] = {1, 3, 3};
    int32_t cached[NSEQ] = {20, 30, 50}, cu_q[NSEQ + 1] = {0}, cu_new[NSEQ + 1] = {0};
    for (int b = 0; b < NSEQ; ++b) cu_q[b + 1] = cu_q[b] + nq[b], cu_new[b + 1] = cu_new[b] + nn[b];
    const int64_t total_q = cu_q[NSEQ], total_new = cu_new[NSEQ];
    const fa_dtype qdt = FA_DTYPE_F16;
    rng_state = 4242;
    const size_t cache_n = (size_t)ROWS * CAP * HKV * D, scale_n = (size_t)ROWS * CAP * HKV;
    uint8_t *kc = xmalloc(cache_n), *vc = xmalloc(cache_n);
    float *ks = float_array(scale_n, NAN), *vs = float_array(scale_n, NAN);
    for (size_t e = 0; e < cache_n; ++e) kc[e] = (uint8_t)rng_next(), vc[e] = (uint8_t)rng_next();
    for (int b = 0; b < NSEQ; ++b)
        for (int64_t pos = pad[b]; pos < cached[b]; ++pos)
            for (int64_t h = 0; h < HKV; ++h) {
                const size_t si = (size_t)((idx[b] * CAP + pos) * HKV + h);
                ks[si] = (float)((1.0 + rng_unit()) / 127.0);
                vs[si] = (float)((1.0 + rng_unit()) / 127.0);
                for (int64_t x = 0; x < D; ++x) {
                    kc[si * D + (size_t)x] = (uint8_t)(int8_t)((int)(rng_next() % 255) - 127);
                    vc[si * D + (size_t)x] = (uint8_t)(int8_t)((int)(rng_next() % 255) - 127);
                }
            }
    void *q = values((size_t)total_q * HQ * D, qdt, 51, 0), *k_new = values((size_t)total_new * HKV * D, qdt, 52, 0);
    void *v_new = values((size_t)total_new * HKV * D, qdt, 53, 0);
    void *out = xmalloc((size_t)total_q * HQ * D * 2);
    float *lse = xmalloc((size_t)(total_q * HQ) * sizeof(float));
    memset(out, 0xa5, (size_t)total_q * HQ * D * 2);
    memset(lse, 0xa5, (size_t)(total_q * HQ) * sizeof(float));
    /* The expected cache: each sequence's new rows at cache_seqlens[b] of row idx[b]. */
    uint8_t *ke = xmalloc(cache_n), *ve = xmalloc(cache_n);
    float *kse = xmalloc(scale_n * sizeof(float)), *vse = xmalloc(scale_n * sizeof(float));
    memcpy(ke, kc, cache_n), memcpy(ve, vc, cache_n);
    memcpy(kse, ks, scale_n * sizeof(float)), memcpy(vse, vs, scale_n * sizeof(float));
    float x[D];
    for (int b = 0; b < NSEQ; ++b)
        for (int t = 0; t < nn[b]; ++t)
            for (int64_t h = 0; h < HKV; ++h) {
                const size_t si = (size_t)((idx[b] * CAP + cached[b] + t) * HKV + h);
                const size_t from = (size_t)(((cu_new[b] + t) * HKV + h) * D);
                for (int e = 0; e < D; ++e) x[e] = (float)test_load_element(k_new, from + (size_t)e, qdt);
                expect_row(FA_DTYPE_I8, x, D, 1.0f, ke + si * D, &kse[si]);
                for (int e = 0; e < D; ++e) x[e] = (float)test_load_element(v_new, from + (size_t)e, qdt);
                expect_row(FA_DTYPE_I8, x, D, 1.0f, ve + si * D, &vse[si]);
            }
    fa_kv_cache cache;
    memset(&cache, 0, sizeof cache);
    cache.k = (fa_tensor){kc, FA_DTYPE_I8, ROWS, CAP, HKV, D, 0, 0, 0};
    cache.v = (fa_tensor){vc, FA_DTYPE_I8, ROWS, CAP, HKV, D, 0, 0, 0};
    cache.cache_seqlens = cached;
    fa_kv_scales scales;
    fa_kv_scales_init(&scales);
    scales.k_scale = ks, scales.v_scale = vs;
    fa_kv_slots slots;
    fa_kv_slots_init(&slots);
    slots.cache_batch_idx = idx, slots.cache_leftpad = pad;
    fa_varlen vl = {NSEQ, cu_q, cu_new, 3, 3};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    desc.varlen = &vl;
    desc.kv_split_tokens = 16;
    desc.kv_scales = &scales;
    const fa_tensor tq = {q, qdt, 1, total_q, HQ, D, 0, 0, 0}, tk = {k_new, qdt, 1, total_new, HKV, D, 0, 0, 0};
    fa_tensor tv = tk, to = tq;
    tv.data = v_new, to.data = out;
    if (fa_forward_kvcache_ex(ctx, &desc, &tq, &cache, &slots, &tk, &tv, &to, lse) != FA_SUCCESS)
        fail_msg("ragged slots: %s", fa_last_error());
    assert_memory_equal(kc, ke, cache_n); /* the appends, and rows 1 and 2 (nobody's) untouched */
    assert_memory_equal(vc, ve, cache_n);
    assert_memory_equal(ks, kse, scale_n * sizeof(float));
    assert_memory_equal(vs, vse, scale_n * sizeof(float));
    errs err = {0, 0, 0, 0};
    for (int b = 0; b < NSEQ; ++b) {
        const int64_t keys = cached[b] - pad[b] + nn[b], sq = nq[b];
        double *dq = xmalloc((size_t)(sq * HQ * D) * sizeof(double)), *got = xmalloc((size_t)(sq * HQ * D) * sizeof(double));
        double *gl = xmalloc((size_t)(sq * HQ) * sizeof(double));
        double *dk = xmalloc((size_t)(keys * HKV * D) * sizeof(double)), *dv = xmalloc((size_t)(keys * HKV * D) * sizeof(double));
        for (size_t e = 0; e < (size_t)(sq * HQ * D); ++e) {
            dq[e] = test_load_element(q, (size_t)cu_q[b] * HQ * D + e, qdt);
            got[e] = test_load_element(out, (size_t)cu_q[b] * HQ * D + e, qdt);
        }
        for (int64_t h = 0; h < HQ; ++h)
            for (int64_t i = 0; i < sq; ++i) gl[h * sq + i] = lse[h * total_q + cu_q[b] + i];
        for (int64_t j = 0; j < keys; ++j)
            for (int64_t h = 0; h < HKV; ++h) {
                const size_t si = (size_t)((idx[b] * CAP + pad[b] + j) * HKV + h);
                for (int64_t e = 0; e < D; ++e) {
                    dk[(j * HKV + h) * D + e] = dequant(FA_DTYPE_I8, kc[si * D + (size_t)e], ks[si]);
                    dv[(j * HKV + h) * D + e] = dequant(FA_DTYPE_I8, vc[si * D + (size_t)e], vs[si]);
                }
            }
        oracle_compare(&desc, D, sq, keys, dq, dk, dv, got, gl, &err);
        free(dq), free(got), free(gl), free(dk), free(dv);
    }
    print_message("  ragged + slots, int8 cache, q f16: out %.2e  lse %.2e\n", err.out, err.lse);
    assert_int_equal(err.nan_out + err.nan_lse, 0);
    if (!(err.out <= fa_case_tolerance(qdt)) || !(err.lse <= fa_case_tolerance(FA_DTYPE_F32)))
        fail_msg("ragged slots against the oracle: out %.3g, lse %.3g", err.out, err.lse);
    free(kc), free(vc), free(ks), free(vs), free(ke), free(ve), free(kse), free(vse);
    free(q), free(k_new), free(v_new), free(out), free(lse);
}

/* ---- 3. determinism across thread counts ---------------------------------------------------------- */
static void test_threads(void **state)
{
    fa_context *ctx = *state;
    for (int x = 0; x < 2; ++x) {
        qcase c;
        memset(&c, 0, sizeof c);
        c.kdt = x ? FA_DTYPE_FP8_E5M2 : FA_DTYPE_I8;
        c.vdt = x ? FA_DTYPE_I8 : FA_DTYPE_FP8_E4M3;
        c.qdt = x ? FA_DTYPE_F32 : FA_DTYPE_BF16;
        c.d = x ? 80 : 64, c.page_size = x ? 16 : 0, c.capacity = 1504, c.batch = 3;
        c.cached[0] = 1500, c.cached[1] = 37, c.cached[2] = 700;
        c.seqlen_q = 2, c.seqlen_new = 2, c.causal = 1, c.window_left = -1;
        c.split = x ? 0 : 256;
        snprintf(c.name, sizeof c.name, "threads: k %s v %s q %s %s", label(c.kdt), label(c.vdt), label(c.qdt),
                 x ? "paged, default split" : "contiguous, split 256");
        qrun r;
        qrun_setup(&r, &c, 9000 + (uint64_t)x);
        qrun_expect(&r);
        uint8_t *kc0 = xmalloc(r.cache_n), *vc0 = xmalloc(r.cache_n);
        memcpy(kc0, r.kc, r.cache_n), memcpy(vc0, r.vc, r.cache_n);
        float *ks0 = r.k_scale ? xmalloc(r.scale_n * sizeof(float)) : NULL, *vs0 = r.v_scale ? xmalloc(r.scale_n * sizeof(float)) : NULL;
        if (ks0) memcpy(ks0, r.k_scale, r.scale_n * sizeof(float));
        if (vs0) memcpy(vs0, r.v_scale, r.scale_n * sizeof(float));
        const size_t out_bytes = r.q_n * test_dtype_size(c.qdt), lse_bytes = (size_t)(c.batch * HQ * c.seqlen_q) * sizeof(float);
        void *out1 = xmalloc(out_bytes), *lse1 = xmalloc(lse_bytes);
        for (int threads = 1; threads <= 2; ++threads) {
            memcpy(r.kc, kc0, r.cache_n), memcpy(r.vc, vc0, r.cache_n); /* the append writes the cache: restore it */
            if (ks0) memcpy(r.k_scale, ks0, r.scale_n * sizeof(float));
            if (vs0) memcpy(r.v_scale, vs0, r.scale_n * sizeof(float));
            memset(r.out, 0xa5, out_bytes);
            memset(r.lse, 0xa5, lse_bytes);
            assert_int_equal(fa_context_set_num_threads(ctx, threads), FA_SUCCESS);
            if (qrun_call(ctx, &r) != FA_SUCCESS) fail_msg("%s: %s", c.name, fa_last_error());
            check_append(&r);
            if (threads == 1) {
                const errs e = check_oracle(&r);
                print_message("  %-44s out %.2e  lse %.2e\n", c.name, e.out, e.lse);
                assert_int_equal(e.nan_out + e.nan_lse, 0);
                expect_within(&r, &e);
                memcpy(out1, r.out, out_bytes);
                memcpy(lse1, r.lse, lse_bytes);
            } else {
                if (memcmp(out1, r.out, out_bytes) != 0) fail_msg("%s: out differs between 1 and 2 threads", c.name);
                if (memcmp(lse1, r.lse, lse_bytes) != 0) fail_msg("%s: lse differs between 1 and 2 threads", c.name);
            }
        }
        assert_int_equal(fa_context_set_num_threads(ctx, 0), FA_SUCCESS);
        free(kc0), free(vc0), free(ks0), free(vs0), free(out1), free(lse1);
        qrun_free(&r);
    }
}

/* ---- 4. NaN and saturation ------------------------------------------------------------------------ */
/* out and lse of (b, i, h): NaN exactly where nan_out / nan_lse say (nan_out: -1 none, -2 the whole
 * row, c >= 0 only column c), finite everywhere else. */
typedef int (*nan_rule)(int64_t b, int64_t i, int64_t h, int lse);

static void expect_nan_pattern(const qrun *r, nan_rule rule)
{
    const qcase *c = &r->c;
    size_t nans = 0;
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t i = 0; i < c->seqlen_q; ++i)
            for (int64_t h = 0; h < HQ; ++h) {
                const int want = rule(b, i, h, 0);
                for (int64_t x = 0; x < c->d; ++x) {
                    const double o = test_load_element(r->out, (size_t)(((b * c->seqlen_q + i) * HQ + h) * c->d + x), c->qdt);
                    const int nan_wanted = want == -2 || want == x;
                    nans += isnan(o) != 0;
                    if (nan_wanted ? !isnan(o) : !isfinite(o))
                        fail_msg("%s: out (sequence %lld, row %lld, head %lld, column %lld) is %g, expected %s", c->name,
                                 (long long)b, (long long)i, (long long)h, (long long)x, o, nan_wanted ? "NaN" : "finite");
                }
                const float l = r->lse[(b * HQ + h) * c->seqlen_q + i];
                const int lse_nan = rule(b, i, h, 1);
                if (lse_nan ? !isnan(l) : !isfinite(l))
                    fail_msg("%s: lse (sequence %lld, row %lld, head %lld) is %g, expected %s", c->name, (long long)b,
                             (long long)i, (long long)h, (double)l, lse_nan ? "NaN" : "finite");
            }
    print_message("  %-44s NaN in %zu outputs, where expected\n", c->name, nans);
    assert_true(nans > 0);
}

/* int8: k_new (token 1, kv head 0) has a NaN, v_new (token 2, kv head 1) an inf; seqlen_q = new = 3,
 * causal: rows 1, 2 of heads 0..3 see the K token (out and lse NaN), row 2 of heads 4..7 the V token
 * (out NaN: the whole row, its scale is NaN; lse finite). */
static int rule_i8(int64_t b, int64_t i, int64_t h, int lse)
{
    (void)b;
    if (h < 4 && i >= 1) return lse ? 1 : -2;
    if (h >= 4 && i == 2) return lse ? 0 : -2;
    return lse ? 0 : -1;
}

/* FP8: k_new of sequence 0 (token 0, kv head 1, column 3) is NaN -> code 0x7F: every row of heads
 * 4..7 of sequence 0 sees it. v_new of sequence 1 has +inf, -inf (saturated: finite). */
static int rule_fp8_append(int64_t b, int64_t i, int64_t h, int lse)
{
    (void)i;
    if (b == 0 && h >= 4) return lse ? 1 : -2;
    return lse ? 0 : -1;
}

/* NaN codes in the cache, window 50, keys 201, query i at 198 + i seeing [148 + i, 198 + i]:
 * sequence 0: K 0x7F at key 148 (kv head 1): row 0 of heads 4..7; V E5M2 NaN at key 199 (kv head 0,
 * column 9): column 9 of rows 1, 2 of heads 0..3. Sequence 1: K 0xFF at key 160 (kv head 0): every
 * row of heads 0..3. */
static int rule_fp8_cached(int64_t b, int64_t i, int64_t h, int lse)
{
    if (b == 0 && h >= 4 && i == 0) return lse ? 1 : -2;
    if (b == 0 && h < 4 && i >= 1) return lse ? 0 : 9;
    if (b == 1 && h < 4) return lse ? 1 : -2;
    return lse ? 0 : -1;
}

static void nan_run(fa_context *ctx, qrun *r, nan_rule rule)
{
    qrun_expect(r);
    if (qrun_call(ctx, r) != FA_SUCCESS) fail_msg("%s: %s", r->c.name, fa_last_error());
    check_append(r);
    const errs e = check_oracle(r);
    if (!e.nan_out) fail_msg("%s: the oracle saw no NaN", r->c.name);
    expect_within(r, &e); /* NaN where the oracle has NaN, the rest within tolerance */
    expect_nan_pattern(r, rule);
}

static void test_nan(void **state)
{
    fa_context *ctx = *state;
    qcase c;
    qrun r;
    /* int8 append of non-finite rows. */
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "nan: int8 append NaN (k) and inf (v)");
    c.kdt = c.vdt = FA_DTYPE_I8, c.qdt = FA_DTYPE_F32, c.d = 64, c.capacity = 64, c.batch = 1, c.cached[0] = 40;
    c.seqlen_q = 3, c.seqlen_new = 3, c.causal = 1, c.window_left = -1, c.split = 16;
    qrun_setup(&r, &c, 300);
    test_store_element(r.k_new, (size_t)((1 * HKV + 0) * c.d + 5), c.qdt, NAN);
    test_store_element(r.v_new, (size_t)((2 * HKV + 1) * c.d + 7), c.qdt, INFINITY);
    nan_run(ctx, &r, rule_i8);
    const float *sk = &r.k_scale[scale_index(&r, 0, 41, 0)], *sv = &r.v_scale[scale_index(&r, 0, 42, 1)];
    assert_true(isnan(*sk) && isnan(*sv));
    assert_true(isfinite(r.k_scale[scale_index(&r, 0, 41, 1)]) && isfinite(r.v_scale[scale_index(&r, 0, 42, 0)]));
    for (int64_t x = 0; x < c.d; ++x) {
        assert_int_equal(r.kc[cache_index(&r, 0, 0, 41, 0, x)], 0);
        assert_int_equal(r.vc[cache_index(&r, 1, 0, 42, 1, x)], 0);
    }
    qrun_free(&r);

    /* FP8 append: NaN -> 0x7F, +-inf -> +-max finite. */
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "nan: fp8 append NaN (k e4m3), +-inf (v e5m2)");
    c.kdt = FA_DTYPE_FP8_E4M3, c.vdt = FA_DTYPE_FP8_E5M2, c.qdt = FA_DTYPE_F16, c.d = 64, c.page_size = 16;
    c.capacity = 64, c.batch = 2, c.cached[0] = 40, c.cached[1] = 17;
    c.seqlen_q = 2, c.seqlen_new = 2, c.causal = 1, c.window_left = -1;
    qrun_setup(&r, &c, 310);
    test_store_element(r.k_new, (size_t)((0 * HKV + 1) * c.d + 3), c.qdt, NAN);
    test_store_element(r.v_new, (size_t)(((1 * 2 + 1) * HKV + 0) * c.d + 2), c.qdt, INFINITY);
    test_store_element(r.v_new, (size_t)(((1 * 2 + 1) * HKV + 0) * c.d + 4), c.qdt, -INFINITY);
    nan_run(ctx, &r, rule_fp8_append);
    int64_t slot, row;
    slot_of(&r, 0, 40, &slot, &row);
    assert_int_equal(r.kc[cache_index(&r, 0, slot, row, 1, 3)], 0x7f);
    slot_of(&r, 1, 18, &slot, &row);
    assert_int_equal(r.vc[cache_index(&r, 1, slot, row, 0, 2)], 0x7b);
    assert_int_equal(r.vc[cache_index(&r, 1, slot, row, 0, 4)], 0xfb);
    qrun_free(&r);

    /* NaN codes already in the cache. */
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "nan: fp8 NaN codes in the cache, window 50");
    c.kdt = FA_DTYPE_FP8_E4M3, c.vdt = FA_DTYPE_FP8_E5M2, c.qdt = FA_DTYPE_F16, c.d = 64, c.page_size = 16;
    c.capacity = 208, c.batch = 2, c.cached[0] = 200, c.cached[1] = 200;
    c.seqlen_q = 3, c.seqlen_new = 1, c.causal = 1, c.window_left = 50, c.split = 64;
    qrun_setup(&r, &c, 320);
    slot_of(&r, 0, 148, &slot, &row);
    r.kc[cache_index(&r, 0, slot, row, 1, 0)] = 0x7f;
    slot_of(&r, 0, 199, &slot, &row);
    r.vc[cache_index(&r, 1, slot, row, 0, 9)] = 0x7e; /* E5M2 NaN (S.11111.10) */
    slot_of(&r, 1, 160, &slot, &row);
    r.kc[cache_index(&r, 0, slot, row, 0, 5)] = 0xff;
    nan_run(ctx, &r, rule_fp8_cached);
    qrun_free(&r);
}

/* ---- 5. bad inputs -------------------------------------------------------------------------------- */
enum base_kind { BASE_I8_E4M3, BASE_I8_I8, BASE_FP8_PAGED, BASE_F16 };

typedef struct bad_case {
    const char *what;
    enum base_kind base;
    fa_status status;
    const char *name; /* what fa_last_error() must contain */
    void (*mutate)(qrun *r);
} bad_case;

static float spare_scales[4096];
#define MUTATION(fn, body) static void fn(qrun *r) { body; }
MUTATION(no_k_scale, r->scales.k_scale = NULL)
MUTATION(no_kv_scales, r->desc.kv_scales = NULL)
MUTATION(v_scale_for_f16, r->scales.v_scale = spare_scales)
MUTATION(k_descale_for_i8, r->scales.k_descale = spare_scales)
MUTATION(v_scale_for_fp8, r->scales.v_scale = spare_scales)
MUTATION(shared_scale, r->scales.v_scale = r->scales.k_scale)
MUTATION(descale_zero, r->k_descale[3] = 0.0f)
MUTATION(descale_negative, r->v_descale[1] = -0.25f)
MUTATION(descale_nan, r->k_descale[4] = NAN)
MUTATION(descale_inf, r->v_descale[5] = INFINITY)
MUTATION(q_i8, r->tq.dtype = FA_DTYPE_I8)
MUTATION(out_e4m3, r->tout.dtype = FA_DTYPE_FP8_E4M3)
MUTATION(k_new_i8, r->tk_new.dtype = FA_DTYPE_I8)
MUTATION(v_new_e5m2, r->tv_new.dtype = FA_DTYPE_FP8_E5M2)
MUTATION(scales_size_zero, r->scales.struct_size = 0)

static const bad_case bad_cases[] = {
    {"int8 k without k_scale", BASE_I8_E4M3, FA_ERROR_INVALID_VALUE, "desc->kv_scales->k_scale", no_k_scale},
    {"int8 cache without kv_scales", BASE_I8_I8, FA_ERROR_INVALID_VALUE, "desc->kv_scales->k_scale", no_kv_scales},
    {"v_scale for an f16 cache", BASE_F16, FA_ERROR_INVALID_VALUE, "desc->kv_scales->v_scale", v_scale_for_f16},
    {"k_descale for an int8 k", BASE_I8_E4M3, FA_ERROR_INVALID_VALUE, "desc->kv_scales->k_descale", k_descale_for_i8},
    {"v_scale for an fp8 v", BASE_I8_E4M3, FA_ERROR_INVALID_VALUE, "desc->kv_scales->v_scale", v_scale_for_fp8},
    {"v_scale is k_scale", BASE_I8_I8, FA_ERROR_INVALID_VALUE, "desc->kv_scales->v_scale", shared_scale},
    {"k_descale 0", BASE_FP8_PAGED, FA_ERROR_INVALID_VALUE, "desc->kv_scales->k_descale[3]", descale_zero},
    {"v_descale negative", BASE_FP8_PAGED, FA_ERROR_INVALID_VALUE, "desc->kv_scales->v_descale[1]", descale_negative},
    {"k_descale NaN", BASE_FP8_PAGED, FA_ERROR_INVALID_VALUE, "desc->kv_scales->k_descale[4]", descale_nan},
    {"v_descale inf", BASE_FP8_PAGED, FA_ERROR_INVALID_VALUE, "desc->kv_scales->v_descale[5]", descale_inf},
    {"q int8", BASE_I8_E4M3, FA_ERROR_INVALID_VALUE, "q:", q_i8},
    {"out e4m3", BASE_I8_E4M3, FA_ERROR_INVALID_VALUE, "out:", out_e4m3},
    {"k_new int8", BASE_I8_I8, FA_ERROR_INVALID_VALUE, "k_new:", k_new_i8},
    {"v_new e5m2", BASE_FP8_PAGED, FA_ERROR_INVALID_VALUE, "v_new:", v_new_e5m2},
    {"kv_scales struct_size 0", BASE_I8_I8, FA_ERROR_INVALID_VALUE, "desc->kv_scales->struct_size", scales_size_zero},
};

static void base_case(enum base_kind kind, qcase *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "bad inputs base %d", (int)kind);
    c->kdt = kind == BASE_FP8_PAGED ? FA_DTYPE_FP8_E4M3 : kind == BASE_F16 ? FA_DTYPE_F16 : FA_DTYPE_I8;
    c->vdt = kind == BASE_I8_E4M3 ? FA_DTYPE_FP8_E4M3 : kind == BASE_I8_I8 ? FA_DTYPE_I8 : kind == BASE_F16 ? FA_DTYPE_F16
                                                                                                               : FA_DTYPE_FP8_E5M2;
    c->qdt = kind == BASE_F16 ? FA_DTYPE_F16 : FA_DTYPE_F32;
    c->d = 16, c->page_size = kind == BASE_FP8_PAGED ? 4 : 0, c->capacity = 32, c->batch = 3;
    c->cached[0] = 3, c->cached[1] = 10, c->cached[2] = 0;
    c->seqlen_q = 2, c->seqlen_new = 1, c->causal = 1, c->window_left = -1;
}

static void test_bad_inputs(void **state)
{
    fa_context *ctx = *state;
    for (size_t x = 0; x < sizeof bad_cases / sizeof bad_cases[0]; ++x) {
        const bad_case *bc = &bad_cases[x];
        qcase c;
        base_case(bc->base, &c);
        qrun r;
        qrun_setup(&r, &c, 500 + x);
        const size_t kb = r.cache_n * cache_es(c.kdt), vb = r.cache_n * cache_es(c.vdt);
        const size_t ob = r.q_n * test_dtype_size(c.qdt), lb = (size_t)(c.batch * HQ * c.seqlen_q) * sizeof(float);
        void *k0 = xmalloc(kb), *v0 = xmalloc(vb), *o0 = xmalloc(ob), *l0 = xmalloc(lb);
        memcpy(k0, r.kc, kb), memcpy(v0, r.vc, vb), memcpy(o0, r.out, ob), memcpy(l0, r.lse, lb);
        float *ks0 = r.k_scale ? xmalloc(r.scale_n * 4) : NULL, *vs0 = r.v_scale ? xmalloc(r.scale_n * 4) : NULL;
        if (ks0) memcpy(ks0, r.k_scale, r.scale_n * 4);
        if (vs0) memcpy(vs0, r.v_scale, r.scale_n * 4);
        memset(spare_scales, 0x3c, sizeof spare_scales);
        bc->mutate(&r);
        const fa_status st = qrun_call(ctx, &r);
        print_message("  %-32s %s\n", bc->what, fa_last_error());
        test_expect_error(st, bc->status, bc->name);
        if (memcmp(k0, r.kc, kb) || memcmp(v0, r.vc, vb)) fail_msg("%s: the cache was written", bc->what);
        if ((ks0 && memcmp(ks0, r.k_scale, r.scale_n * 4)) || (vs0 && memcmp(vs0, r.v_scale, r.scale_n * 4)))
            fail_msg("%s: the scales were written", bc->what);
        for (size_t e = 0; e < sizeof spare_scales / sizeof spare_scales[0]; ++e)
            if (memcmp(&spare_scales[e], "\x3c\x3c\x3c\x3c", 4) != 0) fail_msg("%s: the stray scale array was written", bc->what);
        if (memcmp(o0, r.out, ob) || memcmp(l0, r.lse, lb)) fail_msg("%s: out or lse was written", bc->what);
        free(k0), free(v0), free(o0), free(l0), free(ks0), free(vs0);
        qrun_free(&r);
    }
    /* Each base runs as it is: the failures above are the mutations'. */
    for (int kind = 0; kind <= BASE_F16; ++kind) {
        qcase c;
        base_case((enum base_kind)kind, &c);
        qrun r;
        qrun_setup(&r, &c, 600 + (uint64_t)kind);
        if (qrun_call(ctx, &r) != FA_SUCCESS) fail_msg("base %d: %s", kind, fa_last_error());
        qrun_free(&r);
    }
}

/* ---- 6. the error against the unquantised values (a report) -------------------------------------- */
/* Unit-normal q, k, v (d 128, 256 keys, 4 causal queries), the keys and values appended into an
 * empty cache (quantised by the library), against the oracle on the original floats. The bounds
 * are loose (about 3x what was measured), so that the line documents rather than pins. */
static void test_error_report(void **state)
{
    fa_context *ctx = *state;
    static const struct {
        fa_dtype t;
        double bound;
    } formats[] = {{FA_DTYPE_I8, 0.03}, {FA_DTYPE_FP8_E4M3, 0.15}, {FA_DTYPE_FP8_E5M2, 0.3}};
    for (size_t x = 0; x < 3; ++x) {
        qcase c;
        memset(&c, 0, sizeof c);
        c.kdt = c.vdt = formats[x].t, c.qdt = FA_DTYPE_F32, c.d = 128, c.capacity = 256, c.batch = 1;
        c.seqlen_q = 4, c.seqlen_new = 256, c.causal = 1, c.window_left = -1, c.values = VALUES_NORMAL;
        snprintf(c.name, sizeof c.name, "report %s", label(c.kdt));
        qrun r;
        qrun_setup(&r, &c, 800 + x);
        qrun_expect(&r);
        if (qrun_call(ctx, &r) != FA_SUCCESS) fail_msg("%s: %s", c.name, fa_last_error());
        check_append(&r);
        const errs deq = check_oracle(&r);
        expect_within(&r, &deq);
        /* The oracle on the unquantised floats. */
        const int64_t d = c.d, keys = c.seqlen_new, sq = c.seqlen_q;
        double *q = xmalloc(r.q_n * sizeof(double)), *k = xmalloc(r.new_n * sizeof(double)), *v = xmalloc(r.new_n * sizeof(double));
        double *ref = xmalloc(r.q_n * sizeof(double)), *lse = xmalloc((size_t)(HQ * sq) * sizeof(double));
        for (size_t e = 0; e < r.q_n; ++e) q[e] = ((const float *)r.q)[e];
        for (size_t e = 0; e < r.new_n; ++e) k[e] = ((const float *)r.k_new)[e], v[e] = ((const float *)r.v_new)[e];
        const oracle_shape shape = {1, HQ, HKV, sq, keys, d};
        fa_attention_desc desc;
        fa_attention_desc_init(&desc);
        desc.causal = 1;
        oracle_forward(&shape, &desc, q, k, v, ref, lse);
        double worst = 0.0, worst_lse = 0.0, largest = 0.0;
        for (size_t e = 0; e < r.q_n; ++e) {
            const double got = ((const float *)r.out)[e];
            worst = isfinite(got) ? fmax(worst, fabs(got - ref[e])) : INFINITY;
            largest = fmax(largest, fabs(ref[e]));
        }
        for (int64_t e = 0; e < HQ * sq; ++e) worst_lse = fmax(worst_lse, fabs((double)r.lse[e] - lse[e]));
        print_message("  %-5s cache vs the unquantised values (N(0,1), d 128, 256 keys): max |out err| %.4f "
                      "(max |out| %.3f), max |lse err| %.4f; bound %.2f\n",
                      label(c.kdt), worst, largest, worst_lse, formats[x].bound);
        assert_true(isfinite(worst) && worst < formats[x].bound);
        free(q), free(k), free(v), free(ref), free(lse);
        qrun_free(&r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_oracle_dequantised, setup, teardown),
        cmocka_unit_test_setup_teardown(test_append_ties, setup, teardown),
        cmocka_unit_test_setup_teardown(test_modifiers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ragged_slots, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_report, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

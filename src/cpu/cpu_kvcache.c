/* The KV cache's rows on the CPU: where a sequence's key lives (its slot, left padding and pages:
 * problem_tables.h), and the append of k_new/v_new (rotated, quantised). Shared by the decode (cpu_decode.c) and the
 * path with score modifiers (cpu_kvcache_modifiers.c). */
#include <math.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "../common/half.h"
#include "../common/quant_codes.h"
#include "../common/rotary.h"

#include "cpu_backend.h"
#include "cpu_tile.h"

void fa_cpu_kvcache_slot(const fa_kv_problem *kp, int64_t b, int64_t j, int64_t *slot_b, int64_t *slot_s)
{
    fa_cache_locate(&kp->cache, b, fa_cache_leftpad(&kp->cache, b) + j, slot_b, slot_s);
}

const void *fa_cpu_kvcache_row(const fa_kv_problem *kp, const fa_tensor *cache, int64_t b, int64_t j, int64_t h)
{
    int64_t sb, ss;
    fa_cpu_kvcache_slot(kp, b, j, &sb, &ss);
    return fa_row_ptr(cache, sb, ss, h);
}

/* A row of f32 values into a cache row of dtype: quantised by the rules of fa_kv_scales
 * (flashattn.h; the codes' rules: quant_codes.h), else rounded to the cache's dtype. scale: where
 * an int8 row's scale goes; descale: an FP8 row's (1 without descales). */
static void store_values(const float *x, int64_t d, fa_dtype dtype, void *dst, float *scale, float descale)
{
    if (dtype == FA_DTYPE_I8) {
        float absmax = 0.0f;
        for (int64_t c = 0; c < d; ++c) {
            const float a = fabsf(x[c]);
            absmax = a > absmax || a != a ? a : absmax; /* NaN stays: the row's scale becomes NaN */
        }
        *scale = fa_i8_scale(absmax);
        for (int64_t c = 0; c < d; ++c) ((int8_t *)dst)[c] = fa_f32_to_i8(x[c], *scale);
    } else if (dtype == FA_DTYPE_FP8_E4M3) {
        for (int64_t c = 0; c < d; ++c) ((uint8_t *)dst)[c] = fa_f32_to_fp8_e4m3(x[c] / descale);
    } else if (dtype == FA_DTYPE_FP8_E5M2) {
        for (int64_t c = 0; c < d; ++c) ((uint8_t *)dst)[c] = fa_f32_to_fp8_e5m2(x[c] / descale);
    } else if (dtype == FA_DTYPE_F16) {
        for (int64_t c = 0; c < d; ++c) ((uint16_t *)dst)[c] = fa_f32_to_f16(x[c]);
    } else if (dtype == FA_DTYPE_BF16) {
        for (int64_t c = 0; c < d; ++c) ((uint16_t *)dst)[c] = fa_f32_to_bf16(x[c]);
    } else {
        memcpy(dst, x, (size_t)d * sizeof(float));
    }
}

/* New token t of sequence b, kv head h of k_new or v_new (fresh) as f32, rotated when asked. */
static void new_row_values(const fa_kv_problem *kp, const fa_tensor *fresh, int rotated, int64_t b, int64_t t, int64_t h,
                           float *row)
{
    int64_t nb, nt;
    fa_cache_new_row(&kp->cache, b, t, &nb, &nt);
    fa_cpu_load_rows(fresh, nb, nt, h, 1, row, kp->attn.shape.head_dim);
    if (rotated) fa_rotary_apply(&kp->cache, fa_rotary_new_position(&kp->cache, b, t), row);
}

/* New token t of sequence b, kv head h of k_new (rotated: its keys) or v_new into the cache at (sb,
 * ss): copied as it is when it needs neither rotation nor quantisation, else through f32 (row: d
 * floats of scratch). */
static void store_row(const fa_kv_problem *kp, const fa_tensor *cache, float *scales, const float *descales,
                      const fa_tensor *fresh, int rotated, int64_t b, int64_t t, int64_t h, float *row)
{
    const fa_cache_section *c = &kp->cache;
    const int64_t d = kp->attn.shape.head_dim;
    int64_t sb, ss, nb, nt;
    fa_cache_locate(c, b, c->cache_seqlens[b] + t, &sb, &ss);
    fa_cache_new_row(c, b, t, &nb, &nt);
    void *dst = fa_row_ptr(cache, sb, ss, h);
    if (!rotated && !fa_dtype_quantised(cache->dtype)) {
        memcpy(dst, fa_row_ptr(fresh, nb, nt, h), (size_t)d * fa_dtype_size(cache->dtype));
        return;
    }
    new_row_values(kp, fresh, rotated, b, t, h, row);
    float *scale = scales ? scales + fa_cache_scale_index(sb, ss, h, cache->seqlen, cache->heads) : NULL;
    store_values(row, d, cache->dtype, dst, scale, fa_cache_descale(descales, b, cache->heads, h));
}

fa_status fa_cpu_kvcache_append(const fa_kv_problem *kp)
{
    const fa_problem *p = &kp->attn;
    const fa_cache_section *c = &kp->cache;
    float *row = fa_host_scratch_alloc((size_t)p->shape.head_dim * sizeof(float));
    if (!row) return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "k_new: cannot allocate a row of %lld floats", (long long)p->shape.head_dim);
    const int rotated = c->rotary_cos != NULL;
    for (int64_t b = 0; b < fa_kv_sequences(p); ++b)
        for (int64_t t = 0; t < fa_cache_new_tokens(c, b); ++t)
            for (int64_t h = 0; h < p->shape.heads_kv; ++h) {
                store_row(kp, &p->k, c->k_scale, c->k_descale, &kp->k_new, rotated, b, t, h, row);
                store_row(kp, &p->v, c->v_scale, c->v_descale, &kp->v_new, 0, b, t, h, row);
            }
    fa_host_scratch_free(row);
    return FA_SUCCESS;
}

/* A cache row of dtype read as f32 values: code x factor (int8 scale, FP8 descale), or widened. */
static void load_values(const void *src, int64_t d, fa_dtype dtype, float factor, float *x)
{
    for (int64_t c = 0; c < d; ++c) {
        const uint8_t code = ((const uint8_t *)src)[c];
        switch (dtype) {
        case FA_DTYPE_I8: x[c] = fa_i8_to_f32((int8_t)code, factor); break;
        case FA_DTYPE_FP8_E4M3: x[c] = fa_fp8_e4m3_to_f32(code) * factor; break;
        case FA_DTYPE_FP8_E5M2: x[c] = fa_fp8_e5m2_to_f32(code) * factor; break;
        case FA_DTYPE_F16: x[c] = fa_f16_to_f32(((const uint16_t *)src)[c]); break;
        case FA_DTYPE_BF16: x[c] = fa_bf16_to_f32(((const uint16_t *)src)[c]); break;
        default: x[c] = ((const float *)src)[c]; break;
        }
    }
}

void fa_cpu_kvcache_cached_values(const fa_kv_problem *kp, const fa_tensor *cache, const float *scales,
                                  const float *descales, int64_t b, int64_t j, int64_t h, float *row)
{
    int64_t sb, ss;
    fa_cpu_kvcache_slot(kp, b, j, &sb, &ss);
    const float factor = cache->dtype == FA_DTYPE_I8 ? scales[fa_cache_scale_index(sb, ss, h, cache->seqlen, cache->heads)]
                                                    : fa_cache_descale(descales, b, cache->heads, h);
    load_values(fa_row_ptr(cache, sb, ss, h), kp->attn.shape.head_dim, cache->dtype, factor, row);
}

void fa_cpu_kvcache_new_values(const fa_kv_problem *kp, const fa_tensor *cache, const float *descales,
                               const fa_tensor *fresh, int rotated, int64_t b, int64_t t, int64_t h, float *row,
                               void *tmp)
{
    const int64_t d = kp->attn.shape.head_dim;
    new_row_values(kp, fresh, rotated, b, t, h, row);
    float scale = 0.0f;
    const float descale = fa_cache_descale(descales, b, cache->heads, h);
    store_values(row, d, cache->dtype, tmp, &scale, descale);
    load_values(tmp, d, cache->dtype, cache->dtype == FA_DTYPE_I8 ? scale : descale, row);
}

void fa_cpu_rotate_query(const fa_kv_problem *kp, int64_t b, int64_t i, float *row)
{
    const fa_problem *p = &kp->attn;
    fa_rotary_apply(&kp->cache, fa_rotary_query_position(&kp->cache, b, i), row);
    const int64_t d = p->shape.head_dim;
    for (int64_t c = 0; c < d; ++c) /* rounded to q's dtype, as a rotated q tensor would hold it */
        row[c] = p->shape.dtype == FA_DTYPE_F16 ? fa_f16_to_f32(fa_f32_to_f16(row[c]))
                 : p->shape.dtype == FA_DTYPE_BF16 ? fa_bf16_to_f32(fa_f32_to_bf16(row[c])) : row[c];
}


/* The KV cache's rows on the CPU: where a sequence's key lives (its slot, left padding and pages:
 * problem_tables.h), and the append of k_new/v_new. Shared by the decode (cpu_decode.c) and the
 * path with score modifiers (cpu_kvcache_modifiers.c). */
#include <math.h>
#include <string.h>

#include "../common/half.h"
#include "../common/quant_codes.h"

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

/* Element c of a row of k_new/v_new (F32, F16 or BF16) as f32, exactly. */
static float new_element(const void *row, fa_dtype dtype, int64_t c)
{
    if (dtype == FA_DTYPE_F16) return fa_f16_to_f32(((const uint16_t *)row)[c]);
    if (dtype == FA_DTYPE_BF16) return fa_bf16_to_f32(((const uint16_t *)row)[c]);
    return ((const float *)row)[c];
}

/* One new row of sequence b, kv head h into the cache at (sb, ss): copied, or quantised by the
 * rules of fa_kv_scales (flashattn.h; the codes' rules: quant_codes.h). */
static void store_row(const fa_kv_problem *kp, const fa_tensor *cache, float *scales, const float *descales,
                      const fa_tensor *fresh, int64_t b, int64_t h, int64_t sb, int64_t ss, int64_t nb, int64_t nt)
{
    const int64_t d = kp->attn.shape.head_dim;
    const void *src = fa_row_ptr(fresh, nb, nt, h);
    void *dst = fa_row_ptr(cache, sb, ss, h);
    if (cache->dtype == FA_DTYPE_I8) {
        float absmax = 0.0f;
        for (int64_t c = 0; c < d; ++c) {
            const float x = fabsf(new_element(src, fresh->dtype, c));
            absmax = x > absmax || x != x ? x : absmax; /* NaN stays: the row's scale becomes NaN */
        }
        const float scale = fa_i8_scale(absmax);
        for (int64_t c = 0; c < d; ++c) ((int8_t *)dst)[c] = fa_f32_to_i8(new_element(src, fresh->dtype, c), scale);
        scales[fa_cache_scale_index(sb, ss, h, cache->seqlen, cache->heads)] = scale;
        return;
    }
    if (fa_dtype_fp8(cache->dtype)) {
        const float descale = descales ? descales[b * cache->heads + h] : 1.0f;
        for (int64_t c = 0; c < d; ++c) {
            const float x = new_element(src, fresh->dtype, c) / descale;
            ((uint8_t *)dst)[c] = cache->dtype == FA_DTYPE_FP8_E4M3 ? fa_f32_to_fp8_e4m3(x) : fa_f32_to_fp8_e5m2(x);
        }
        return;
    }
    memcpy(dst, src, (size_t)d * fa_dtype_size(cache->dtype));
}

void fa_cpu_kvcache_append(const fa_kv_problem *kp)
{
    const fa_problem *p = &kp->attn;
    const fa_cache_section *c = &kp->cache;
    for (int64_t b = 0; b < fa_kv_sequences(p); ++b)
        for (int64_t t = 0; t < fa_cache_new_tokens(c, b); ++t) {
            int64_t sb, ss, nb, nt;
            fa_cache_locate(c, b, c->cache_seqlens[b] + t, &sb, &ss);
            fa_cache_new_row(c, b, t, &nb, &nt);
            for (int64_t h = 0; h < p->shape.heads_kv; ++h) {
                store_row(kp, &p->k, c->k_scale, c->k_descale, &kp->k_new, b, h, sb, ss, nb, nt);
                store_row(kp, &p->v, c->v_scale, c->v_descale, &kp->v_new, b, h, sb, ss, nb, nt);
            }
        }
}

float fa_cpu_kvcache_scale(const fa_kv_problem *kp, const fa_tensor *cache, const float *scales,
                           const float *descales, int64_t b, int64_t j, int64_t h)
{
    if (cache->dtype == FA_DTYPE_I8) {
        int64_t sb, ss;
        fa_cpu_kvcache_slot(kp, b, j, &sb, &ss);
        return scales[fa_cache_scale_index(sb, ss, h, cache->seqlen, cache->heads)];
    }
    return descales ? descales[b * cache->heads + h] : 1.0f;
}

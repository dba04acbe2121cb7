/* The KV cache's rows on the CPU: where a sequence's key lives (its slot, left padding and pages:
 * problem_tables.h), and the append of k_new/v_new. Shared by the decode (cpu_decode.c) and the
 * path with score modifiers (cpu_kvcache_modifiers.c). */
#include <string.h>

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

void fa_cpu_kvcache_append(const fa_kv_problem *kp)
{
    const fa_problem *p = &kp->attn;
    const size_t row_bytes = (size_t)p->shape.head_dim * fa_dtype_size(p->shape.dtype);
    for (int64_t b = 0; b < fa_kv_sequences(p); ++b)
        for (int64_t t = 0; t < fa_cache_new_tokens(&kp->cache, b); ++t) {
            int64_t sb, ss, nb, nt;
            fa_cache_locate(&kp->cache, b, kp->cache.cache_seqlens[b] + t, &sb, &ss);
            fa_cache_new_row(&kp->cache, b, t, &nb, &nt);
            for (int64_t h = 0; h < p->shape.heads_kv; ++h) {
                memcpy(fa_row_ptr(&p->k, sb, ss, h), fa_row_ptr(&kp->k_new, nb, nt, h), row_bytes);
                memcpy(fa_row_ptr(&p->v, sb, ss, h), fa_row_ptr(&kp->v_new, nb, nt, h), row_bytes);
            }
        }
}

/* The KV cache's rows on the CPU: where a sequence's key position lives (contiguous or through
 * the block table), and the append of k_new/v_new. Shared by the decode (cpu_decode.c) and the
 * path with score modifiers (cpu_kvcache_modifiers.c). */
#include <string.h>

#include "cpu_backend.h"
#include "cpu_tile.h"

void fa_cpu_kvcache_slot(const fa_kv_problem *kp, int64_t b, int64_t j, int64_t *slot_b, int64_t *slot_s)
{
    if (!kp->cache.block_table) {
        *slot_b = b;
        *slot_s = j;
        return;
    }
    *slot_b = kp->cache.block_table[b * kp->cache.max_pages_per_seq + j / kp->cache.page_size];
    *slot_s = j % kp->cache.page_size;
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
    for (int64_t b = 0; b < p->shape.batch; ++b)
        for (int64_t t = 0; t < kp->cache.seqlen_new; ++t) {
            int64_t sb, ss;
            fa_cpu_kvcache_slot(kp, b, kp->cache.cache_seqlens[b] + t, &sb, &ss);
            for (int64_t h = 0; h < p->shape.heads_kv; ++h) {
                memcpy(fa_row_ptr(&p->k, sb, ss, h), fa_row_ptr(&kp->k_new, b, t, h), row_bytes);
                memcpy(fa_row_ptr(&p->v, sb, ss, h), fa_row_ptr(&kp->v_new, b, t, h), row_bytes);
            }
        }
}

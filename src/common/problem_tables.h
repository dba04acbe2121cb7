/* The table sections of a problem: a packed variable-length batch (fa_varlen, include/flashattn.h)
 * and a KV cache's lengths, pages and slots, with the rules that read them (a sequence's query
 * rows, its new tokens, its keys, where key j lives). Shared as is by the core's problems and the
 * GPU kernels' parameters; the tables live in the context's memory. */
#ifndef FA_PROBLEM_TABLES_H
#define FA_PROBLEM_TABLES_H
#include <stdint.h>

#include "flashattn.h"
#include "hostdev.h"

/* fa_forward_kvcache's cache: the cache tensors' capacity per sequence is seqlen_k (contiguous) or
 * max_pages_per_seq x page_size (paged). Sequence b attends to keys j = 0 .. fa_cache_keys(b) - 1,
 * key j at cache position fa_cache_leftpad(b) + j. */
typedef struct fa_cache_section {
    const int32_t *cache_seqlens;   /* [batch] tokens cached before this call (from position 0) */
    const int32_t *block_table;     /* [batch, max_pages_per_seq], NULL = contiguous */
    int64_t max_pages_per_seq, page_size, num_pages;
    int64_t seqlen_new;             /* padded k_new: tokens each sequence appends; packed: k_new's rows; 0 = none */
    const int32_t *cu_seqlens_new;  /* [batch + 1] packed k_new/v_new: sequence b appends rows
                                       [cu[b], cu[b + 1]); NULL = padded [batch, seqlen_new] */
    int64_t max_seqlen_new;         /* packed: the most tokens a sequence appends (a bound) */
    const int32_t *cache_batch_idx; /* [batch] contiguous cache row of sequence b; NULL = b */
    const int32_t *cache_leftpad;   /* [batch] leading positions of that row it ignores; NULL = 0 */
    int64_t split_tokens;           /* keys per split-KV chunk, 0 = the default rule (kv_split.h) */
    /* A quantised cache (the cache tensors' dtypes say which; fa_kv_scales in flashattn.h): int8
     * scales per (slot, position, kv head), FP8 descales per (sequence, kv head) or NULL = 1. */
    float *k_scale, *v_scale;
    const float *k_descale, *v_descale;
    /* Rotary embeddings of the new keys and the queries (fa_rotary; rotary.h): cos/sin NULL = none.
     * rotary_queries_in_order: query i takes position cached + i (causal or a window), else every
     * query the first new position. */
    const float *rotary_cos, *rotary_sin;
    int64_t rotary_max_position, rotary_dim;
    int32_t rotary_interleaved, rotary_queries_in_order;
} fa_cache_section;

/* Tokens sequence b appends in this call. */
FA_HD int64_t fa_cache_new_tokens(const fa_cache_section *c, int64_t b)
{
    return c->cu_seqlens_new ? (int64_t)c->cu_seqlens_new[b + 1] - c->cu_seqlens_new[b] : c->seqlen_new;
}

/* Where new token t of sequence b is in k_new/v_new: (batch, row). */
FA_HD void fa_cache_new_row(const fa_cache_section *c, int64_t b, int64_t t, int64_t *tensor_b, int64_t *row)
{
    *tensor_b = c->cu_seqlens_new ? 0 : b;
    *row = c->cu_seqlens_new ? c->cu_seqlens_new[b] + t : t;
}

FA_HD int64_t fa_cache_leftpad(const fa_cache_section *c, int64_t b) { return c->cache_leftpad ? c->cache_leftpad[b] : 0; }

/* The keys sequence b attends to: its cached and new tokens past the left padding. */
FA_HD int64_t fa_cache_keys(const fa_cache_section *c, int64_t b)
{
    return c->cache_seqlens[b] + fa_cache_new_tokens(c, b) - fa_cache_leftpad(c, b);
}

/* Where cache position pos of sequence b is stored: (batch or page, row). */
FA_HD void fa_cache_locate(const fa_cache_section *c, int64_t b, int64_t pos, int64_t *slot_b, int64_t *slot_s)
{
    if (!c->block_table) {
        *slot_b = c->cache_batch_idx ? c->cache_batch_idx[b] : b;
        *slot_s = pos;
        return;
    }
    *slot_b = c->block_table[b * c->max_pages_per_seq + pos / c->page_size];
    *slot_s = pos % c->page_size;
}

/* Index of the int8 scale of (slot_b, slot_s, kv head h) in a cache of `positions` positions per
 * slot (capacity, or page_size) and heads_kv heads. */
FA_HD int64_t fa_cache_scale_index(int64_t slot_b, int64_t slot_s, int64_t h, int64_t positions, int64_t heads_kv)
{
    return (slot_b * positions + slot_s) * heads_kv + h;
}

/* The FP8 descale of sequence b's kv head h (descales [batch, heads_kv], NULL = 1). */
FA_HD float fa_cache_descale(const float *descales, int64_t b, int64_t heads_kv, int64_t h)
{
    return descales ? descales[b * heads_kv + h] : 1.0f;
}

/* Query rows of sequence b of a problem whose queries may be packed (vl->batch > 0: rows
 * [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of batch 0) or padded ([batch, seqlen_q]). */
FA_HD int64_t fa_sequence_queries(const fa_varlen *vl, int64_t seqlen_q, int64_t b)
{
    return vl->batch ? (int64_t)vl->cu_seqlens_q[b + 1] - vl->cu_seqlens_q[b] : seqlen_q;
}
FA_HD void fa_sequence_query_row(const fa_varlen *vl, int64_t b, int64_t i, int64_t *tensor_b, int64_t *row)
{
    *tensor_b = vl->batch ? 0 : b;
    *row = vl->batch ? vl->cu_seqlens_q[b] + i : i;
}

#endif

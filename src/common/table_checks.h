/* The checks of the caller's tables whose values a backend may hold in device memory: a packed
 * batch's offsets (cu_seqlens_q/k), a KV cache's lengths and pages, the ALiBi slopes and the sinks.
 * One rule for every backend: validate.c runs it on host tables, the GPU check kernels (one thread)
 * on device tables. A check stops at the first fault and records it in an fa_table_fault, and
 * fa_table_fault_message turns the record into the one message both report (a GPU adds that the
 * check ran on the device, after the call was queued). */
#ifndef FA_TABLE_CHECKS_H
#define FA_TABLE_CHECKS_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "flashattn.h"
#include "hostdev.h"
#include "problem_modifiers.h"
#include "problem_tables.h"

typedef enum fa_table_fault_code {
    FA_TABLE_OK,
    FA_TABLE_VARLEN_FIRST,      /* cu_seqlens_*[0] = value, not 0 */
    FA_TABLE_VARLEN_DECREASING, /* cu_seqlens_*[index] = value below the previous offset (limit) */
    FA_TABLE_VARLEN_TOO_LONG,   /* the sequence has value rows, more than max_seqlen_* (limit) */
    FA_TABLE_VARLEN_TOTAL,      /* cu_seqlens_*[index] = value, not the tensors' rows (limit) */
    FA_TABLE_KV_NEGATIVE,       /* cache_seqlens[sequence] = value is negative */
    FA_TABLE_KV_CAPACITY,       /* value cached + extra new tokens exceed the capacity (limit) */
    FA_TABLE_KV_PAGES,          /* value cached + extra new tokens exceed limit pages of index tokens */
    FA_TABLE_KV_PAGE,           /* block_table[sequence][index] = value outside [0, limit) */
    FA_TABLE_KV_SLOT,           /* cache_batch_idx[sequence] = value outside [0, limit) */
    FA_TABLE_KV_LEFTPAD,        /* cache_leftpad[sequence] = value outside [0, limit = cache_seqlens] */
    FA_TABLE_ALIBI_SLOPE,       /* alibi_slopes[index] is not finite: value = the float's bits */
    FA_TABLE_SINK,              /* sinks[index] is NaN or +inf: value = the float's bits */
    FA_TABLE_ROTARY_POSITION,   /* the sequence reaches rotary position value, past max_position (limit) */
    FA_TABLE_DESCALE            /* {k,v}_descale[index] (array 0: k, 1: v) is not finite and positive: value = bits; limit: heads_kv */
} fa_table_fault_code;

/* The first fault of a check (code FA_TABLE_OK: none). Plain integers, so that a device can write
 * it and the host read it back. */
typedef struct fa_table_fault {
    int32_t code;  /* fa_table_fault_code */
    int32_t array; /* varlen: 0 cu_seqlens_q, 1 cu_seqlens_k, 2 cu_seqlens_k of a KV cache's k_new */
    int64_t sequence, index, value, limit, extra;
} fa_table_fault;

FA_HD int fa_table_fail(fa_table_fault *f, int32_t code, int32_t array, int64_t sequence, int64_t index, int64_t value,
                        int64_t limit, int64_t extra)
{
    f->code = code;
    f->array = array;
    f->sequence = sequence;
    f->index = index;
    f->value = value;
    f->limit = limit;
    f->extra = extra;
    return 0;
}

FA_HD int64_t fa_table_float_bits(float x)
{
    union { float f; int32_t i; } u;
    u.f = x;
    return u.i;
}

FA_HD float fa_table_float_of_bits(int64_t bits)
{
    union { float f; int32_t i; } u;
    u.i = (int32_t)bits;
    return u.f;
}

/* One packed array's offsets: the first 0, none decreasing, each length within max_len, the last
 * equal to the tensors' rows (total). 1 when valid. */
FA_HD int fa_check_offsets(fa_table_fault *f, int32_t array, const int32_t *cu, int64_t batch, int64_t max_len,
                           int64_t total)
{
    if (cu[0] != 0) return fa_table_fail(f, FA_TABLE_VARLEN_FIRST, array, 0, 0, cu[0], 0, 0);
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t len = (int64_t)cu[b + 1] - cu[b];
        if (len < 0) return fa_table_fail(f, FA_TABLE_VARLEN_DECREASING, array, b, b + 1, cu[b + 1], cu[b], 0);
        if (len > max_len) return fa_table_fail(f, FA_TABLE_VARLEN_TOO_LONG, array, b, b, len, max_len, 0);
    }
    if (cu[batch] != total) return fa_table_fail(f, FA_TABLE_VARLEN_TOTAL, array, batch, batch, cu[batch], total, 0);
    return 1;
}

/* A packed batch's offsets, q's then k's; rows_q, rows_k: the packed tensors' rows. */
FA_HD int fa_check_varlen_tables(fa_table_fault *f, const fa_varlen *vl, int64_t rows_q, int64_t rows_k)
{
    return fa_check_offsets(f, 0, vl->cu_seqlens_q, vl->batch, vl->max_seqlen_q, rows_q) &&
           fa_check_offsets(f, 1, vl->cu_seqlens_k, vl->batch, vl->max_seqlen_k, rows_k);
}

/* A KV cache call's tables: packed query and k_new offsets (vl->batch > 0: rows_q, rows_new the
 * packed tensors' rows), then per sequence its slot, its length (not negative, cached + new within
 * the capacity: the tensors' seqlen, or the pages of a paged cache), its left padding (within its
 * cached tokens) and every page it uses (in [0, num_pages)). slots: the contiguous cache's rows. */
FA_HD int fa_check_cache_tables(fa_table_fault *f, const fa_cache_section *c, const fa_varlen *vl, int64_t batch,
                                int64_t capacity, int64_t rows_q, int64_t rows_new, int64_t slots)
{
    if (vl->batch && !fa_check_offsets(f, 0, vl->cu_seqlens_q, batch, vl->max_seqlen_q, rows_q)) return 0;
    if (c->cu_seqlens_new && c->cu_seqlens_new != vl->cu_seqlens_q &&
        !fa_check_offsets(f, 2, c->cu_seqlens_new, batch, c->max_seqlen_new, rows_new))
        return 0;
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t cached = c->cache_seqlens[b], fresh = fa_cache_new_tokens(c, b), total = cached + fresh;
        if (c->cache_batch_idx && (c->cache_batch_idx[b] < 0 || c->cache_batch_idx[b] >= slots))
            return fa_table_fail(f, FA_TABLE_KV_SLOT, 0, b, b, c->cache_batch_idx[b], slots, 0);
        if (cached < 0) return fa_table_fail(f, FA_TABLE_KV_NEGATIVE, 0, b, b, cached, 0, 0);
        if (total > capacity) {
            if (c->block_table)
                return fa_table_fail(f, FA_TABLE_KV_PAGES, 0, b, c->page_size, cached, c->max_pages_per_seq, fresh);
            return fa_table_fail(f, FA_TABLE_KV_CAPACITY, 0, b, b, cached, capacity, fresh);
        }
        if (c->cache_leftpad && (c->cache_leftpad[b] < 0 || c->cache_leftpad[b] > cached))
            return fa_table_fail(f, FA_TABLE_KV_LEFTPAD, 0, b, b, c->cache_leftpad[b], cached, 0);
        if (!c->block_table) continue;
        const int64_t pages = (total + c->page_size - 1) / c->page_size;
        for (int64_t x = 0; x < pages; ++x) {
            const int32_t page = c->block_table[b * c->max_pages_per_seq + x];
            if (page < 0 || page >= c->num_pages) return fa_table_fail(f, FA_TABLE_KV_PAGE, 0, b, x, page, c->num_pages, 0);
        }
    }
    return 1;
}

/* Every rotary position a KV-cache call uses (rotary.h: its new tokens', its queries') below the
 * tables' max_position; seqlen_q: padded queries per sequence (0: none, an append). */
FA_HD int fa_check_rotary_positions(fa_table_fault *f, const fa_cache_section *c, const fa_varlen *vl, int64_t batch,
                                    int64_t seqlen_q)
{
    for (int64_t b = 0; c->rotary_cos && b < batch; ++b) {
        const int64_t first = c->cache_seqlens[b] - fa_cache_leftpad(c, b), fresh = fa_cache_new_tokens(c, b);
        const int64_t queries = fa_sequence_queries(vl, seqlen_q, b);
        int64_t last = fresh > 0 ? first + fresh - 1 : -1;
        if (queries > 0) {
            const int64_t query_last = first + (c->rotary_queries_in_order ? queries - 1 : 0);
            if (query_last > last) last = query_last;
        }
        if (last >= c->rotary_max_position)
            return fa_table_fail(f, FA_TABLE_ROTARY_POSITION, 0, b, b, last, c->rotary_max_position, 0);
    }
    return 1;
}

/* An FP8 cache tensor's descales (array 0: k, 1: v), [batch, heads_kv]: finite and positive. */
FA_HD int fa_check_descales(fa_table_fault *f, int32_t array, const float *descale, int64_t batch, int64_t heads_kv)
{
    for (int64_t e = 0; descale && e < batch * heads_kv; ++e)
        if (!(descale[e] > 0.0f) || !(descale[e] < INFINITY))
            return fa_table_fail(f, FA_TABLE_DESCALE, array, e / heads_kv, e, fa_table_float_bits(descale[e]), heads_kv, 0);
    return 1;
}

/* Every ALiBi slope finite (batches: the sequences, read when the slopes are per sequence), no
 * sink NaN or +inf (-inf = no sink). */
FA_HD int fa_check_modifier_values(fa_table_fault *f, const fa_modifier_section *m, int64_t batches, int64_t heads_q)
{
    const int64_t slopes = m->alibi_slopes ? (m->alibi_stride_batch ? batches : 1) * heads_q : 0;
    for (int64_t x = 0; x < slopes; ++x)
        if (!isfinite(m->alibi_slopes[x]))
            return fa_table_fail(f, FA_TABLE_ALIBI_SLOPE, 0, 0, x, fa_table_float_bits(m->alibi_slopes[x]), 0, 0);
    for (int64_t h = 0; m->sinks && h < heads_q; ++h)
        if (isnan(m->sinks[h]) || m->sinks[h] == INFINITY)
            return fa_table_fail(f, FA_TABLE_SINK, 0, 0, h, fa_table_float_bits(m->sinks[h]), 0, 0);
    return 1;
}

/* The message of a fault, the same whichever backend found it (host code only). */
static inline void fa_table_fault_message(const fa_table_fault *f, char *buf, size_t size)
{
    const char *array = f->array ? "cu_seqlens_k" : "cu_seqlens_q", *rows_of = f->array == 2 ? "k_new" : f->array ? "k" : "q";
    const long long b = (long long)f->sequence, x = (long long)f->index, value = (long long)f->value,
                    limit = (long long)f->limit, extra = (long long)f->extra;
    switch (f->code) {
    case FA_TABLE_OK: snprintf(buf, size, "no fault"); return;
    case FA_TABLE_VARLEN_FIRST:
        snprintf(buf, size, "desc->varlen->%s[0]: %lld, the first offset must be 0", array, value);
        return;
    case FA_TABLE_VARLEN_DECREASING:
        snprintf(buf, size, "desc->varlen->%s[%lld]: %lld is below the previous offset %lld (sequence %lld)", array, x,
                 value, limit, b);
        return;
    case FA_TABLE_VARLEN_TOO_LONG:
        snprintf(buf, size, "desc->varlen->%s: sequence %lld has %lld rows, more than max_seqlen_%s %lld", array, b, value,
                 rows_of, limit);
        return;
    case FA_TABLE_VARLEN_TOTAL:
        snprintf(buf, size, "desc->varlen->%s[%lld]: %lld differs from the %lld rows of %s", array, x, value, limit,
                 rows_of);
        return;
    case FA_TABLE_KV_NEGATIVE:
        snprintf(buf, size, "cache->cache_seqlens[%lld]: %lld is negative (sequence %lld)", b, value, b);
        return;
    case FA_TABLE_KV_CAPACITY:
        snprintf(buf, size, "cache->cache_seqlens[%lld]: sequence %lld needs %lld tokens (%lld cached + %lld new), more "
                 "than the capacity %lld", b, b, value + extra, value, extra, limit);
        return;
    case FA_TABLE_KV_PAGES:
        snprintf(buf, size, "cache->cache_seqlens[%lld]: sequence %lld needs %lld tokens (%lld cached + %lld new), more "
                 "than its %lld pages of %lld", b, b, value + extra, value, extra, limit, x);
        return;
    case FA_TABLE_KV_PAGE:
        snprintf(buf, size, "cache->block_table[%lld][%lld]: page %lld of sequence %lld is outside [0, %lld)", b, x, value,
                 b, limit);
        return;
    case FA_TABLE_KV_SLOT:
        snprintf(buf, size, "cache_batch_idx[%lld]: slot %lld of sequence %lld is outside the cache's [0, %lld)", b, value,
                 b, limit);
        return;
    case FA_TABLE_KV_LEFTPAD:
        snprintf(buf, size, "cache_leftpad[%lld]: %lld is outside [0, %lld], the tokens sequence %lld has cached", b,
                 value, limit, b);
        return;
    case FA_TABLE_ALIBI_SLOPE:
        snprintf(buf, size, "desc->alibi_slopes[%lld]: %g is not finite", x, (double)fa_table_float_of_bits(f->value));
        return;
    case FA_TABLE_SINK:
        snprintf(buf, size, "desc->sinks[%lld]: %g is NaN or +inf (-inf = no sink)", x,
                 (double)fa_table_float_of_bits(f->value));
        return;
    case FA_TABLE_DESCALE:
        snprintf(buf, size, "desc->kv_scales->%s_descale[%lld]: %g (sequence %lld, kv head %lld) is not finite and positive",
                 f->array ? "v" : "k", x, (double)fa_table_float_of_bits(f->value), b, limit ? x % limit : 0);
        return;
    case FA_TABLE_ROTARY_POSITION:
        snprintf(buf, size, "desc->rotary->max_position: sequence %lld reaches rotary position %lld, past the tables' "
                 "%lld positions", b, value, limit);
        return;
    }
    snprintf(buf, size, "unknown table fault %d", (int)f->code);
}
#endif

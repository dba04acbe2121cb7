/* libFuzzer target for the KV-cache entry point: decodes its input into one serving step (sequences
 * with their own cached tokens, query rows and new tokens; padded or ragged queries; a contiguous
 * cache, possibly through fa_kv_slots, or a paged one; causal, windows, score modifiers, the split-KV
 * chunk size), runs fa_forward_kvcache_ex on the CPU backend and checks
 *  - the status is FA_SUCCESS, or, for a corrupted table, FA_ERROR_INVALID_VALUE
 *    (FA_ERROR_NOT_SUPPORTED for slots on a paged cache) with a message, and then nothing written:
 *    out and lse keep their canary bytes and the cache is byte-identical to its copy;
 *  - on success the cache holds exactly the appended tokens at cache_seqlens[b] + t of each
 *    sequence's row or pages, every other position unchanged;
 *  - out and lse match the double-precision oracle (tests/oracle.h) run on each sequence alone;
 *  - the same call again (cache restored) with two threads gives the same out and lse bits.
 * Every tensor and table is allocated to its exact extent, so AddressSanitizer sees any
 * out-of-bounds access. Input layout: fuzz/README.md. Build and run: scripts/ci-fuzz.sh. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/half.h"
#include "flashattn.h"
#include "oracle.h"

#define FUZZ_TARGET "fuzz_kvcache"
#include "fuzz_common.h"

#define MAX_SEQS 6
#define MAX_HEADS_Q 9
#define EXTRA_ROWS 3

enum flags {
    F_CAUSAL = 1, F_WINDOW = 2, F_RAGGED = 4, F_CU_NEW = 8, F_PAGED = 16, F_SLOTS = 32, F_MODIFIERS = 64,
    F_CORRUPT = 128
};

/* The modifiers byte (flag 64). */
enum extras { X_SOFTCAP = 1, X_ALIBI = 2, X_ALIBI_PER_BATCH = 4, X_SINKS = 8, X_SCALE = 16 };

/* Corruptions (mode = corruption byte mod 9); one that does not apply to the decoded problem
 * becomes C_CAPACITY, which always does. */
enum corruption {
    C_CU_Q_LAST, C_CU_K_DECREASING, C_PAGE, C_CAPACITY, C_NEGATIVE, C_SLOT, C_LEFTPAD, C_SPLIT, C_SLOTS_PAGED,
    C_MODES
};
static const char *const corruption_names[C_MODES] = {
    "cu_seqlens_q last offset", "decreasing cu_seqlens_k", "page out of range", "cached + new over the capacity",
    "negative cache_seqlens", "cache_batch_idx out of range", "cache_leftpad over cached", "negative kv_split_tokens",
    "slots on a paged cache"};

typedef struct seq {
    int32_t cached, queries, fresh, leftpad; /* tokens cached, query rows, tokens appended, left padding */
    int32_t row;                             /* contiguous: the cache row (cache_batch_idx, else b) */
} seq;

typedef struct problem {
    fa_dtype dtype;
    int64_t batch, heads_q, heads_kv, d;
    int ragged, cu_new, paged, use_slots, slots_mode;
    seq seqs[MAX_SEQS];
    int64_t seqlen_q, seqlen_new;           /* padded form */
    int64_t total_q, total_new;             /* ragged form */
    int64_t capacity, rows;                 /* contiguous: tokens per row, rows of the cache */
    int64_t page_size, max_pages, num_pages;
    int32_t cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1], cache_seqlens[MAX_SEQS];
    int32_t batch_idx[MAX_SEQS], leftpad[MAX_SEQS];
    int32_t *table;                         /* [batch, max_pages] */
    fa_varlen varlen;
    fa_attention_desc desc;
    fa_kv_cache cache;
    fa_kv_slots slots;
    fa_tensor q, k_new, v_new, out;
    float *lse;
    size_t lse_count, cache_bytes, out_bytes;
    void *k_before, *v_before;              /* the cache as it was before the call */
    float slopes[MAX_SEQS * MAX_HEADS_Q], sinks[MAX_HEADS_Q];
    double amplitude, modifier_max;
    uint64_t value_seed;
} problem;

static size_t esize(const problem *p) { return fa_dtype_size(p->dtype); }
static size_t elements(const fa_tensor *t) { return (size_t)(t->batch * t->seqlen * t->heads * t->head_dim); }

/* A packed tensor, allocated to its exact extent (at least one byte so that it is never NULL). */
static void make_tensor(fa_tensor *t, fa_dtype dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t d)
{
    *t = (fa_tensor){NULL, dtype, batch, seqlen, heads, d, 0, 0, 0};
    t->data = malloc(elements(t) * fa_dtype_size(dtype));
}

static double get(fa_dtype dtype, const void *data, size_t o)
{
    switch (dtype) {
    case FA_DTYPE_F16: return fa_f16_to_f32(((const uint16_t *)data)[o]);
    case FA_DTYPE_BF16: return fa_bf16_to_f32(((const uint16_t *)data)[o]);
    default: return ((const float *)data)[o];
    }
}

static void set(fa_dtype dtype, void *data, size_t o, float x)
{
    switch (dtype) {
    case FA_DTYPE_F16: ((uint16_t *)data)[o] = fa_f32_to_f16(x); break;
    case FA_DTYPE_BF16: ((uint16_t *)data)[o] = fa_f32_to_bf16(x); break;
    default: ((float *)data)[o] = x; break;
    }
}

static float uniform(uint64_t *rng, double amplitude)
{
    return (float)(((double)(splitmix(rng) >> 11) * 0x1p-53 * 2.0 - 1.0) * amplitude);
}

static void fill(fa_tensor *t, uint64_t *rng, double amplitude)
{
    for (size_t o = 0; t->data && o < elements(t); ++o) set(t->dtype, t->data, o, uniform(rng, amplitude));
}

/* Where cache position pos of sequence b lives: the element offset of (pos, head h, channel 0). */
static size_t cache_offset(const problem *p, int64_t b, int64_t pos, int64_t h)
{
    int64_t row, s;
    if (p->paged) {
        row = p->table[b * p->max_pages + pos / p->page_size];
        s = pos % p->page_size;
    } else {
        row = p->seqs[b].row;
        s = pos;
    }
    return (size_t)(((row * p->cache.k.seqlen + s) * p->heads_kv + h) * p->d);
}

/* Element offset of new token t of sequence b, head h, in k_new/v_new. */
static size_t new_offset(const problem *p, int64_t b, int64_t t, int64_t h)
{
    const int64_t row = p->ragged ? (p->cu_new ? p->cu_k[b] : p->cu_q[b]) + t : b * p->seqlen_new + t;
    return (size_t)((row * p->heads_kv + h) * p->d);
}

/* Element offset of query row i of sequence b, head h, in q/out. */
static size_t query_offset(const problem *p, int64_t b, int64_t i, int64_t h)
{
    const int64_t row = p->ragged ? p->cu_q[b] + i : b * p->seqlen_q + i;
    return (size_t)((row * p->heads_q + h) * p->d);
}

static size_t lse_index(const problem *p, int64_t b, int64_t i, int64_t h)
{
    return p->ragged ? (size_t)(h * p->total_q + p->cu_q[b] + i) : (size_t)((b * p->heads_q + h) * p->seqlen_q + i);
}

static int32_t cached_of(uint8_t c) { return c < 192 ? c : 192 + (c - 192) * 2; } /* 0..318 */

static void shuffle(int32_t *x, int64_t n, uint64_t *rng)
{
    for (int64_t i = n - 1; i > 0; --i) {
        const int64_t j = (int64_t)(splitmix(rng) % (uint64_t)(i + 1));
        const int32_t t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}

/* A block-table entry nobody may read: negative, past the pages, or huge. */
static int32_t garbage(uint64_t *rng, int64_t num_pages)
{
    const uint64_t z = splitmix(rng);
    switch (z % 4) {
    case 0: return -1;
    case 1: return (int32_t)num_pages + (int32_t)(z >> 40 & 15);
    case 2: return INT32_MIN + (int32_t)(z >> 40 & 255);
    default: return (int32_t)(z >> 32);
    }
}

static void decode_modifiers(reader *r, problem *p)
{
    const uint8_t extras = next(r);
    fa_attention_desc *desc = &p->desc;
    if (extras & X_SCALE) desc->softmax_scale = (float)((int)next(r) - 128) / 32.0f;
    if (extras & X_SOFTCAP) desc->softcap = 0.5f + (float)(next(r) % 64) * 0.25f;
    if (extras & X_ALIBI) {
        desc->alibi_per_batch = (extras & X_ALIBI_PER_BATCH) != 0;
        const int64_t n = (desc->alibi_per_batch ? p->batch : 1) * p->heads_q;
        float max_slope = 0.0f;
        for (int64_t x = 0; x < n; ++x) {
            p->slopes[x] = (float)(next(r) % 65) / 64.0f;
            max_slope = p->slopes[x] > max_slope ? p->slopes[x] : max_slope;
        }
        desc->alibi_slopes = p->slopes;
        int64_t reach = 0; /* the largest |i + keys - queries - j| of any sequence */
        for (int64_t b = 0; b < p->batch; ++b) {
            const seq *s = &p->seqs[b];
            const int64_t keys = s->cached + s->fresh - s->leftpad, span = keys + s->queries;
            reach = span > reach ? span : reach;
        }
        p->modifier_max += (double)max_slope * (double)reach;
    }
    if (extras & X_SINKS) {
        double max_sink = 0.0;
        for (int64_t h = 0; h < p->heads_q; ++h) {
            const uint8_t b = next(r);
            p->sinks[h] = b == 255 ? -INFINITY : (float)(b % 33) - 16.0f; /* -inf: a head without a sink */
            if (b != 255 && fabs((double)p->sinks[h]) > max_sink) max_sink = fabs((double)p->sinks[h]);
        }
        desc->sinks = p->sinks;
        p->modifier_max += max_sink;
    }
}

static void decode(reader *r, problem *p, uint8_t flags)
{
    p->ragged = (flags & F_RAGGED) != 0;
    p->cu_new = p->ragged && (flags & F_CU_NEW);
    p->paged = (flags & F_PAGED) != 0;
    p->dtype = (fa_dtype)(next(r) % 3);
    p->batch = 1 + next(r) % MAX_SEQS;
    p->heads_kv = 1 + next(r) % 3;
    p->heads_q = p->heads_kv * (1 + next(r) % 3);
    p->d = 1 + next(r) % 40;
    fa_attention_desc_init(&p->desc);
    p->desc.causal = (flags & F_CAUSAL) != 0;
    const uint8_t split = next(r);
    if (split) p->desc.kv_split_tokens = 1 + (((int64_t)(split - 1) << 8 | next(r)) % 600);
    p->amplitude = 0.25 * (double)(1 + next(r) % 12);
    p->value_seed = next_u64(r);
    if (flags & F_WINDOW) {
        p->desc.window_left = (int32_t)next(r) - 1;
        p->desc.window_right = (int32_t)next(r) - 1;
    }
    if (!p->ragged) {
        p->seqlen_q = 1 + next(r) % 8;
        p->seqlen_new = next(r) % 9;
    }
    for (int64_t b = 0; b < p->batch; ++b) {
        seq *s = &p->seqs[b];
        s->cached = cached_of(next(r));
        if (p->ragged) {
            s->queries = next(r) % 9;
            s->fresh = p->cu_new ? next(r) % 9 : s->queries; /* without cu_seqlens_k: packed like q */
        } else {
            s->queries = (int32_t)p->seqlen_q;
            s->fresh = (int32_t)p->seqlen_new;
        }
        s->row = (int32_t)b;
    }
    if (p->ragged) {
        int64_t total = 0;
        for (int64_t b = 0; b < p->batch; ++b) total += p->seqs[b].queries;
        if (total == 0) { /* q has at least one row */
            p->seqs[0].queries = 1;
            if (!p->cu_new) p->seqs[0].fresh = 1;
        }
    }
    uint8_t extra_pages = 0, unused_pages = 0, slack = 0, extra_rows = 0;
    if (p->paged) {
        p->page_size = 1 + next(r) % 40;
        extra_pages = next(r) % 3;
        unused_pages = next(r) % 5;
        p->use_slots = (flags & F_SLOTS) != 0; /* both arrays NULL: valid on a paged cache */
    } else {
        slack = next(r) % 8;
        if (flags & F_SLOTS) {
            p->use_slots = 1;
            p->slots_mode = next(r) % 4; /* 0 both arrays, 1 cache_batch_idx, 2 cache_leftpad, 3 neither */
            extra_rows = next(r) % (EXTRA_ROWS + 1);
            if (p->slots_mode == 0 || p->slots_mode == 2)
                for (int64_t b = 0; b < p->batch; ++b) p->seqs[b].leftpad = next(r) % (p->seqs[b].cached + 1);
        }
    }
    if (flags & F_MODIFIERS) decode_modifiers(r, p);

    /* Tables. */
    uint64_t rng = p->value_seed;
    int64_t most = 0;
    for (int64_t b = 0; b < p->batch; ++b) {
        const seq *s = &p->seqs[b];
        p->cache_seqlens[b] = s->cached;
        p->cu_q[b + 1] = p->cu_q[b] + s->queries;
        p->cu_k[b + 1] = p->cu_k[b] + s->fresh;
        most = s->cached + s->fresh > most ? s->cached + s->fresh : most;
    }
    p->total_q = p->cu_q[p->batch];
    p->total_new = p->cu_k[p->batch];
    if (p->paged) {
        int64_t used = 0, widest = 1;
        for (int64_t b = 0; b < p->batch; ++b) {
            const int64_t pages = (p->seqs[b].cached + p->seqs[b].fresh + p->page_size - 1) / p->page_size;
            used += pages;
            widest = pages > widest ? pages : widest;
        }
        p->max_pages = widest + extra_pages;
        p->num_pages = used + unused_pages > 0 ? used + unused_pages : 1;
        int32_t *perm = malloc((size_t)p->num_pages * sizeof *perm);
        for (int64_t x = 0; x < p->num_pages; ++x) perm[x] = (int32_t)x;
        shuffle(perm, p->num_pages, &rng);
        p->table = malloc((size_t)(p->batch * p->max_pages) * sizeof *p->table);
        int64_t taken = 0;
        for (int64_t b = 0; b < p->batch; ++b) {
            const int64_t pages = (p->seqs[b].cached + p->seqs[b].fresh + p->page_size - 1) / p->page_size;
            for (int64_t x = 0; x < p->max_pages; ++x)
                p->table[b * p->max_pages + x] = x < pages ? perm[taken++] : garbage(&rng, p->num_pages);
        }
        free(perm);
        make_tensor(&p->cache.k, p->dtype, p->num_pages, p->page_size, p->heads_kv, p->d);
        make_tensor(&p->cache.v, p->dtype, p->num_pages, p->page_size, p->heads_kv, p->d);
        p->cache.block_table = p->table;
        p->cache.max_pages_per_seq = p->max_pages;
    } else {
        p->capacity = most + slack > 0 ? most + slack : 1;
        p->rows = p->batch;
        if (p->use_slots && (p->slots_mode == 0 || p->slots_mode == 1)) {
            p->rows = p->batch + extra_rows;
            int32_t perm[MAX_SEQS + EXTRA_ROWS];
            for (int64_t x = 0; x < p->rows; ++x) perm[x] = (int32_t)x;
            shuffle(perm, p->rows, &rng);
            for (int64_t b = 0; b < p->batch; ++b) p->seqs[b].row = p->batch_idx[b] = perm[b];
            p->slots.cache_batch_idx = p->batch_idx;
        }
        if (p->use_slots && (p->slots_mode == 0 || p->slots_mode == 2)) {
            for (int64_t b = 0; b < p->batch; ++b) p->leftpad[b] = p->seqs[b].leftpad;
            p->slots.cache_leftpad = p->leftpad;
        }
        make_tensor(&p->cache.k, p->dtype, p->rows, p->capacity, p->heads_kv, p->d);
        make_tensor(&p->cache.v, p->dtype, p->rows, p->capacity, p->heads_kv, p->d);
    }
    p->cache.cache_seqlens = p->cache_seqlens;
    p->slots.struct_size = sizeof p->slots;

    /* Queries, new tokens, outputs. */
    if (p->ragged) {
        int64_t max_q = 1, max_new = 0;
        for (int64_t b = 0; b < p->batch; ++b) {
            max_q = p->seqs[b].queries > max_q ? p->seqs[b].queries : max_q;
            max_new = p->seqs[b].fresh > max_new ? p->seqs[b].fresh : max_new;
        }
        p->varlen = (fa_varlen){p->batch, p->cu_q, NULL, max_q, 0};
        if (p->cu_new && p->total_new > 0) {
            p->varlen.cu_seqlens_k = p->cu_k;
            p->varlen.max_seqlen_k = max_new;
        }
        p->desc.varlen = &p->varlen;
        make_tensor(&p->q, p->dtype, 1, p->total_q, p->heads_q, p->d);
        make_tensor(&p->out, p->dtype, 1, p->total_q, p->heads_q, p->d);
        if (p->total_new > 0) {
            make_tensor(&p->k_new, p->dtype, 1, p->total_new, p->heads_kv, p->d);
            make_tensor(&p->v_new, p->dtype, 1, p->total_new, p->heads_kv, p->d);
        }
        p->lse_count = (size_t)(p->heads_q * p->total_q);
    } else {
        make_tensor(&p->q, p->dtype, p->batch, p->seqlen_q, p->heads_q, p->d);
        make_tensor(&p->out, p->dtype, p->batch, p->seqlen_q, p->heads_q, p->d);
        if (p->seqlen_new > 0) {
            make_tensor(&p->k_new, p->dtype, p->batch, p->seqlen_new, p->heads_kv, p->d);
            make_tensor(&p->v_new, p->dtype, p->batch, p->seqlen_new, p->heads_kv, p->d);
        }
        p->lse_count = (size_t)(p->batch * p->heads_q * p->seqlen_q);
    }
    p->lse = malloc(p->lse_count * sizeof *p->lse);
    p->out_bytes = elements(&p->out) * esize(p);

    /* Values: the cache holds NaN (0xff bytes) wherever no sequence has a cached key, so that a read
     * of a position outside a sequence's keys shows in its output. */
    fill(&p->q, &rng, p->amplitude);
    fill(&p->k_new, &rng, p->amplitude);
    fill(&p->v_new, &rng, p->amplitude);
    p->cache_bytes = elements(&p->cache.k) * esize(p);
    memset(p->cache.k.data, 0xff, p->cache_bytes);
    memset(p->cache.v.data, 0xff, p->cache_bytes);
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t pos = p->seqs[b].leftpad; pos < p->seqs[b].cached; ++pos)
            for (int64_t h = 0; h < p->heads_kv; ++h) {
                const size_t o = cache_offset(p, b, pos, h);
                for (int64_t c = 0; c < p->d; ++c) {
                    set(p->dtype, p->cache.k.data, o + (size_t)c, uniform(&rng, p->amplitude));
                    set(p->dtype, p->cache.v.data, o + (size_t)c, uniform(&rng, p->amplitude));
                }
            }
    p->k_before = malloc(p->cache_bytes);
    p->v_before = malloc(p->cache_bytes);
    memcpy(p->k_before, p->cache.k.data, p->cache_bytes);
    memcpy(p->v_before, p->cache.v.data, p->cache_bytes);
}

/* Breaks one table entry (or kv_split_tokens, or gives slots to a paged cache); returns the mode
 * applied and the status the call must return. */
static int corrupt(problem *p, uint8_t byte, fa_status *expected)
{
    int mode = byte % C_MODES;
    const int64_t b = (byte / C_MODES) % p->batch;
    const int variant = (byte / (C_MODES * MAX_SEQS)) & 1;
    *expected = FA_ERROR_INVALID_VALUE;
    switch (mode) {
    case C_CU_Q_LAST:
        if (!p->ragged) break;
        p->cu_q[p->batch] += variant ? -1 : 1;
        return mode;
    case C_CU_K_DECREASING:
        if (!p->varlen.cu_seqlens_k) break;
        p->cu_k[b + 1] = p->cu_k[b] - 1 - variant;
        return mode;
    case C_PAGE:
        for (int64_t x = 0; p->paged && x < p->batch; ++x) {
            const int64_t s = (b + x) % p->batch, pages = (p->seqs[s].cached + p->seqs[s].fresh + p->page_size - 1) /
                                                          p->page_size;
            if (pages == 0) continue;
            p->table[s * p->max_pages + (pages - 1) * variant] = variant ? -1 : (int32_t)p->num_pages;
            return mode;
        }
        break;
    case C_NEGATIVE: p->cache_seqlens[b] = -1 - variant * 1000; return mode;
    case C_SLOT:
        if (!p->slots.cache_batch_idx) break;
        p->batch_idx[b] = variant ? -1 : (int32_t)p->rows;
        return mode;
    case C_LEFTPAD:
        if (!p->slots.cache_leftpad) break;
        p->leftpad[b] = variant ? -1 : p->cache_seqlens[b] + 1;
        return mode;
    case C_SPLIT: p->desc.kv_split_tokens = variant ? INT64_MIN : -1 - (int64_t)b; return mode;
    case C_SLOTS_PAGED:
        if (!p->paged) break;
        for (int64_t x = 0; x < p->batch; ++x) {
            p->batch_idx[x] = (int32_t)x;
            p->leftpad[x] = 0;
        }
        if (variant) p->slots.cache_leftpad = p->leftpad;
        else p->slots.cache_batch_idx = p->batch_idx;
        p->use_slots = 1;
        *expected = FA_ERROR_NOT_SUPPORTED;
        return mode;
    default: break;
    }
    /* C_CAPACITY: one more token than the sequence's row or pages hold. */
    const int64_t capacity = p->paged ? p->max_pages * p->page_size : p->capacity;
    p->cache_seqlens[b] = (int32_t)(capacity - p->seqs[b].fresh + 1 + variant);
    return C_CAPACITY;
}

/* FUZZ_VERBOSE=1: print the decoded problem, to turn a crash input into a readable reproducer. */
static void describe(const problem *p, int corrupted)
{
    static const char *const dtypes[] = {"f32", "f16", "bf16"};
    const fa_attention_desc *desc = &p->desc;
    fprintf(stderr, "problem: %s sequences %lld heads_q %lld heads_kv %lld head_dim %lld %s", dtypes[p->dtype],
            (long long)p->batch, (long long)p->heads_q, (long long)p->heads_kv, (long long)p->d,
            p->ragged ? (p->varlen.cu_seqlens_k ? "ragged, k_new by cu_seqlens_k"
                                                : p->k_new.data ? "ragged, k_new by q's offsets" : "ragged, no k_new")
                      : "padded");
    if (p->paged)
        fprintf(stderr, "\n  paged: page_size %lld max_pages_per_seq %lld num_pages %lld%s\n", (long long)p->page_size,
                (long long)p->max_pages, (long long)p->num_pages, p->use_slots ? " (slots given)" : "");
    else
        fprintf(stderr, "\n  contiguous: %lld rows of %lld tokens, slots %s\n", (long long)p->rows, (long long)p->capacity,
                !p->use_slots ? "no" : p->slots_mode == 0 ? "idx + leftpad" : p->slots_mode == 1 ? "idx"
                                     : p->slots_mode == 2 ? "leftpad" : "both NULL");
    fprintf(stderr, "  causal %d window (%d, %d) scale %g softcap %g alibi %s%s sinks %s kv_split_tokens %lld amplitude %g\n",
            desc->causal, desc->window_left, desc->window_right, (double)desc->softmax_scale, (double)desc->softcap,
            desc->alibi_slopes ? "yes" : "no", desc->alibi_per_batch ? " (per sequence)" : "", desc->sinks ? "yes" : "no",
            (long long)desc->kv_split_tokens, p->amplitude);
    for (int64_t b = 0; b < p->batch; ++b) {
        const seq *s = &p->seqs[b];
        fprintf(stderr, "  sequence %lld: cached %d queries %d new %d leftpad %d row %d\n", (long long)b, s->cached,
                s->queries, s->fresh, s->leftpad, s->row);
    }
    if (corrupted >= 0) fprintf(stderr, "  corrupt: %s\n", corruption_names[corrupted]);
}

static void free_problem(problem *p)
{
    fa_tensor *ts[] = {&p->q, &p->k_new, &p->v_new, &p->out, &p->cache.k, &p->cache.v};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; ++i) free(ts[i]->data);
    free(p->lse);
    free(p->table);
    free(p->k_before);
    free(p->v_before);
}

static void fail(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "fuzz_kvcache: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    abort();
}

static fa_status call(fa_context *ctx, problem *p)
{
    memset(p->out.data, 0xff, p->out_bytes); /* 0xff bytes: NaN in every dtype, the canary */
    memset(p->lse, 0xff, p->lse_count * sizeof *p->lse);
    return fa_forward_kvcache_ex(ctx, &p->desc, &p->q, &p->cache, p->use_slots ? &p->slots : NULL,
                                 p->k_new.data ? &p->k_new : NULL, p->v_new.data ? &p->v_new : NULL, &p->out, p->lse);
}

/* The cache after the append: the copy from before with new token t of sequence b at position
 * cache_seqlens[b] + t of its row or pages; compared byte for byte, so that a write anywhere else
 * shows too. */
static void check_cache(const problem *p)
{
    const size_t row_bytes = (size_t)p->d * esize(p);
    uint8_t *k = malloc(p->cache_bytes), *v = malloc(p->cache_bytes);
    memcpy(k, p->k_before, p->cache_bytes);
    memcpy(v, p->v_before, p->cache_bytes);
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t t = 0; t < p->seqs[b].fresh; ++t)
            for (int64_t h = 0; h < p->heads_kv; ++h) {
                const size_t to = cache_offset(p, b, p->seqs[b].cached + t, h) * esize(p);
                const size_t from = new_offset(p, b, t, h) * esize(p);
                memcpy(k + to, (const uint8_t *)p->k_new.data + from, row_bytes);
                memcpy(v + to, (const uint8_t *)p->v_new.data + from, row_bytes);
            }
    const uint8_t *const want[2] = {k, v}, *const got[2] = {p->cache.k.data, p->cache.v.data};
    for (int x = 0; x < 2; ++x)
        if (memcmp(want[x], got[x], p->cache_bytes) != 0) {
            size_t i = 0;
            while (want[x][i] == got[x][i]) ++i;
            const size_t row = i / esize(p) / (size_t)(p->d * p->heads_kv);
            fail("%s cache differs from the expected append at cache row %zu, position %zu", x ? "v" : "k",
                 row / (size_t)p->cache.k.seqlen, row % (size_t)p->cache.k.seqlen);
        }
    free(k);
    free(v);
}

/* Each sequence alone through the oracle: its keys are cache positions leftpad .. cached - 1, then
 * its new tokens; its queries are aligned at the end of them. */
static void check_against_oracle(const problem *p)
{
    const fa_dtype dt = p->dtype;
    double qmax = 0.0, kmax = 0.0, vmax = 0.0;
    for (size_t o = 0; o < elements(&p->q); ++o) qmax = fmax(qmax, fabs(get(dt, p->q.data, o)));
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t pos = p->seqs[b].leftpad; pos < p->seqs[b].cached; ++pos)
            for (int64_t h = 0; h < p->heads_kv; ++h)
                for (int64_t c = 0; c < p->d; ++c) {
                    const size_t o = cache_offset(p, b, pos, h) + (size_t)c;
                    kmax = fmax(kmax, fabs(get(dt, p->k_before, o)));
                    vmax = fmax(vmax, fabs(get(dt, p->v_before, o)));
                }
    for (size_t o = 0; p->k_new.data && o < elements(&p->k_new); ++o) {
        kmax = fmax(kmax, fabs(get(dt, p->k_new.data, o)));
        vmax = fmax(vmax, fabs(get(dt, p->v_new.data, o)));
    }
    const double scale = p->desc.softmax_scale != 0.0f ? p->desc.softmax_scale : 1.0 / sqrt((double)p->d);
    const double score_max = fabs(scale) * qmax * kmax * (double)p->d + p->modifier_max;
    const double tol = tolerance(dt, vmax, score_max), lse_tol = 1e-5 * (1.0 + score_max);
    const int64_t hq = p->heads_q, hk = p->heads_kv, d = p->d;
    for (int64_t b = 0; b < p->batch; ++b) {
        const seq *s = &p->seqs[b];
        const int64_t nq = s->queries, keys = s->cached + s->fresh - s->leftpad;
        if (nq == 0) continue;
        double *q = malloc((size_t)(nq * hq * d) * sizeof *q), *out = malloc((size_t)(nq * hq * d) * sizeof *out);
        double *lse = malloc((size_t)(nq * hq) * sizeof *lse);
        double *k = malloc((size_t)((keys ? keys : 1) * hk * d) * sizeof *k);
        double *v = malloc((size_t)((keys ? keys : 1) * hk * d) * sizeof *v);
        for (int64_t i = 0; i < nq; ++i)
            for (int64_t h = 0; h < hq; ++h)
                for (int64_t c = 0; c < d; ++c) q[(i * hq + h) * d + c] = get(dt, p->q.data, query_offset(p, b, i, h) + (size_t)c);
        for (int64_t j = 0; j < keys; ++j)
            for (int64_t h = 0; h < hk; ++h) {
                const int64_t pos = s->leftpad + j;
                const int cached = pos < s->cached;
                const size_t o = cached ? cache_offset(p, b, pos, h) : new_offset(p, b, pos - s->cached, h);
                for (int64_t c = 0; c < d; ++c) {
                    k[(j * hk + h) * d + c] = get(dt, cached ? p->k_before : p->k_new.data, o + (size_t)c);
                    v[(j * hk + h) * d + c] = get(dt, cached ? p->v_before : p->v_new.data, o + (size_t)c);
                }
            }
        if (keys > 0) {
            const oracle_shape shape = {1, hq, hk, nq, keys, d};
            fa_attention_desc desc;
            fa_attention_desc_init(&desc);
            desc.softmax_scale = p->desc.softmax_scale;
            desc.causal = p->desc.causal;
            desc.window_left = p->desc.window_left;
            desc.window_right = p->desc.window_right;
            desc.softcap = p->desc.softcap;
            desc.sinks = p->desc.sinks;
            if (p->desc.alibi_slopes) desc.alibi_slopes = p->desc.alibi_slopes + (p->desc.alibi_per_batch ? b * hq : 0);
            oracle_forward(&shape, &desc, q, k, v, out, lse);
        } else { /* no keys: zeros, and the lse of the sink alone */
            memset(out, 0, (size_t)(nq * hq * d) * sizeof *out);
            for (int64_t h = 0; h < hq; ++h)
                for (int64_t i = 0; i < nq; ++i) lse[h * nq + i] = p->desc.sinks ? (double)p->sinks[h] : -INFINITY;
        }
        for (int64_t i = 0; i < nq; ++i)
            for (int64_t h = 0; h < hq; ++h) {
                const size_t o = query_offset(p, b, i, h);
                for (int64_t c = 0; c < d; ++c) {
                    const double err = fabs(get(dt, p->out.data, o + (size_t)c) - out[(i * hq + h) * d + c]);
                    if (!(err <= tol))
                        fail("out error %.3g exceeds tolerance %.3g (sequence %lld, query %lld, head %lld)", err, tol,
                             (long long)b, (long long)i, (long long)h);
                }
                const double want = lse[h * nq + i], got = p->lse[lse_index(p, b, i, h)];
                if (isinf(want) ? got != want : !(fabs(got - want) <= lse_tol))
                    fail("lse %.9g, expected %.9g (tolerance %.3g; sequence %lld, query %lld, head %lld)", got, want,
                         lse_tol, (long long)b, (long long)i, (long long)h);
            }
        free(q);
        free(out);
        free(lse);
        free(k);
        free(v);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    const uint8_t flags = next(&r), corruption = next(&r);
    problem p;
    memset(&p, 0, sizeof p);
    decode(&r, &p, flags);
    fa_status expected = FA_SUCCESS;
    const int corrupted = flags & F_CORRUPT ? corrupt(&p, corruption, &expected) : -1;
    if (getenv("FUZZ_VERBOSE")) describe(&p, corrupted);
    fa_context *ctx = context();

    fa_status st = call(ctx, &p);
    if (corrupted >= 0) {
        if (st != expected) {
            fprintf(stderr, "fuzz_kvcache: corrupt %s returned %d (%s), expected %d\n", corruption_names[corrupted],
                    (int)st, fa_last_error(), (int)expected);
            abort();
        }
        if (!fa_last_error()[0]) fail("corrupt %s: failed without a message", corruption_names[corrupted]);
        if (!all_ff(p.out.data, p.out_bytes) || !all_ff(p.lse, p.lse_count * sizeof *p.lse))
            fail("corrupt %s: failed validation but wrote out or lse", corruption_names[corrupted]);
        if (memcmp(p.cache.k.data, p.k_before, p.cache_bytes) || memcmp(p.cache.v.data, p.v_before, p.cache_bytes))
            fail("corrupt %s: failed validation but wrote the cache", corruption_names[corrupted]);
        free_problem(&p);
        return 0;
    }
    if (st != FA_SUCCESS) {
        fprintf(stderr, "fuzz_kvcache: fa_forward_kvcache_ex failed on a valid problem: %s\n", fa_last_error());
        abort();
    }
    check_cache(&p);
    check_against_oracle(&p);

    /* The same call again from the same cache with two threads: the same bits. */
    void *out1 = malloc(p.out_bytes), *lse1 = malloc(p.lse_count * sizeof *p.lse);
    memcpy(out1, p.out.data, p.out_bytes);
    memcpy(lse1, p.lse, p.lse_count * sizeof *p.lse);
    memcpy(p.cache.k.data, p.k_before, p.cache_bytes);
    memcpy(p.cache.v.data, p.v_before, p.cache_bytes);
    if (fa_context_set_num_threads(ctx, 2) != FA_SUCCESS) fail("fa_context_set_num_threads(2): %s", fa_last_error());
    st = call(ctx, &p);
    fa_context_set_num_threads(ctx, 1);
    if (st != FA_SUCCESS) {
        fprintf(stderr, "fuzz_kvcache: the second call (2 threads) failed: %s\n", fa_last_error());
        abort();
    }
    if (memcmp(out1, p.out.data, p.out_bytes) || memcmp(lse1, p.lse, p.lse_count * sizeof *p.lse))
        fail("out or lse differ between 1 and 2 threads");
    check_cache(&p);
    free(out1);
    free(lse1);
    free_problem(&p);
    return 0;
}

/* libFuzzer target for the KV-cache entry point: decodes its input into one serving step (sequences
 * with their own cached tokens, query rows and new tokens; padded or ragged queries; a contiguous
 * cache, possibly through fa_kv_slots, or a paged one; causal, windows, score modifiers, the split-KV
 * chunk size; since 0.6 quantised caches (int8, FP8) with their scales, rotary embeddings), runs
 * fa_forward_kvcache_ex or fa_kvcache_append on the CPU backend and checks
 *  - the status is FA_SUCCESS, or, for a corrupted table, broken scales or invalid rotary
 *    arguments, FA_ERROR_INVALID_VALUE (FA_ERROR_NOT_SUPPORTED for slots on a paged cache) with a
 *    message, and then nothing written: out and lse keep their canary bytes and the cache and its
 *    int8 scales are byte-identical to their copies;
 *  - on success the cache holds exactly the appended tokens at cache_seqlens[b] + t of each
 *    sequence's row or pages (quantised by quant_codes.h's rules; rotated keys within the rounding
 *    of the rotation), every other position unchanged;
 *  - out and lse match the double-precision oracle (tests/oracle.h) run on each sequence alone, on
 *    the dequantised cache, with the queries rotated at the header's positions;
 *  - the same call again (cache restored) with two threads gives the same out, lse and cache bits.
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
#include "common/quant_codes.h"
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

/* The extension byte (0.6: read only when the input has bytes left after the modifiers, so older
 * inputs decode as before): bits 0-1 the cache k kind, 2-3 the cache v kind (0 q's dtype, 1 int8,
 * 2 FP8 E4M3, 3 FP8 E5M2), then these. */
enum ext { E_ROTARY = 16, E_APPEND = 32, E_BAD_SCALES = 64, E_DESCALES = 128 };

/* Scale corruptions (E_BAD_SCALES, mode = byte mod 4). */
enum scale_corruption { S_MISSING, S_WRONG_DTYPE, S_DESCALE, S_SAME_ARRAY, S_MODES };
static const char *const scale_corruption_names[S_MODES] = {
    "int8 scale missing", "scale or descale for the wrong dtype", "descale not finite and positive",
    "v_scale is k_scale"};

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
    fa_dtype dtype, kdt, vdt;               /* q's dtype, the cache k and v dtypes */
    int append;                             /* fa_kvcache_append instead of fa_forward_kvcache_ex */
    int rotary, rotary_valid, scale_corrupt; /* rotary given; its arguments valid; a scale corruption (-1 none) */
    int rot_null;                           /* 1 cos NULL, 2 sin NULL */
    unsigned accept;                        /* statuses (1 << status) the call may return */
    fa_rotary rot;
    float *rot_cos, *rot_sin;
    fa_kv_scales scales;
    float *k_scale, *v_scale, *k_scale_before, *v_scale_before, *k_descale, *v_descale, *wrong;
    size_t scale_count;                     /* floats of one int8 scale array */
    uint8_t descale_exp;
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
    size_t lse_count, k_bytes, v_bytes, out_bytes;
    void *k_before, *v_before;              /* the cache as it was before the call */
    float slopes[MAX_SEQS * MAX_HEADS_Q], sinks[MAX_HEADS_Q];
    double amplitude, modifier_max;
    uint64_t value_seed;
} problem;

static size_t esize(const problem *p) { return fa_dtype_size(p->dtype); }
static int quantised(const problem *p) { return fa_dtype_quantised(p->kdt) || fa_dtype_quantised(p->vdt); }
static size_t elements(const fa_tensor *t) { return (size_t)(t->batch * t->seqlen * t->heads * t->head_dim); }

/* A packed tensor, allocated to its exact extent (at least one byte so that it is never NULL). */
static void make_tensor(fa_tensor *t, fa_dtype dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t d)
{
    *t = (fa_tensor){NULL, dtype, batch, seqlen, heads, d, 0, 0, 0};
    t->data = malloc(elements(t) * fa_dtype_size(dtype));
}

FUZZ_CHECKER static double get(fa_dtype dtype, const void *data, size_t o)
{
    switch (dtype) {
    case FA_DTYPE_F16: return fa_f16_to_f32(((const uint16_t *)data)[o]);
    case FA_DTYPE_BF16: return fa_bf16_to_f32(((const uint16_t *)data)[o]);
    default: return ((const float *)data)[o];
    }
}

FUZZ_CHECKER static void set(fa_dtype dtype, void *data, size_t o, float x)
{
    switch (dtype) {
    case FA_DTYPE_F16: ((uint16_t *)data)[o] = fa_f32_to_f16(x); break;
    case FA_DTYPE_BF16: ((uint16_t *)data)[o] = fa_f32_to_bf16(x); break;
    default: ((float *)data)[o] = x; break;
    }
}

FUZZ_CHECKER static float uniform(uint64_t *rng, double amplitude)
{
    return (float)(((double)(splitmix(rng) >> 11) * 0x1p-53 * 2.0 - 1.0) * amplitude);
}

FUZZ_CHECKER static void fill(fa_tensor *t, uint64_t *rng, double amplitude)
{
    for (size_t o = 0; t->data && o < elements(t); ++o) set(t->dtype, t->data, o, uniform(rng, amplitude));
}

/* Where cache position pos of sequence b lives: the element offset of (pos, head h, channel 0). */
FUZZ_CHECKER static size_t cache_offset(const problem *p, int64_t b, int64_t pos, int64_t h)
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
FUZZ_CHECKER static size_t new_offset(const problem *p, int64_t b, int64_t t, int64_t h)
{
    const int64_t row = p->ragged ? (p->cu_new ? p->cu_k[b] : p->cu_q[b]) + t : b * p->seqlen_new + t;
    return (size_t)((row * p->heads_kv + h) * p->d);
}

/* Element offset of query row i of sequence b, head h, in q/out. */
FUZZ_CHECKER static size_t query_offset(const problem *p, int64_t b, int64_t i, int64_t h)
{
    const int64_t row = p->ragged ? p->cu_q[b] + i : b * p->seqlen_q + i;
    return (size_t)((row * p->heads_q + h) * p->d);
}

FUZZ_CHECKER static size_t lse_index(const problem *p, int64_t b, int64_t i, int64_t h)
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
        desc->sinks = p->sinks;
        p->modifier_max += decode_sinks(r, p->heads_q, p->sinks);
    }
}

static void fill_cache(problem *p, uint64_t *rng);

static const fa_dtype kinds[4] = {FA_DTYPE_F32, FA_DTYPE_I8, FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E5M2};

/* Rotary position of query i of sequence s (the header's rule, FlashAttention-2's): the first new
 * position cached - leftpad, plus i when causal or windowed. */
static int64_t query_position(const problem *p, const seq *s, int64_t i)
{
    const fa_attention_desc *desc = &p->desc;
    const int in_order = desc->causal || desc->window_left >= 0 || desc->window_right >= 0;
    return s->cached - s->leftpad + (in_order ? i : 0);
}

/* The 0.6 choices: cache dtypes, descales, rotary, fa_kvcache_append, a scale corruption. */
static void decode_ext(reader *r, problem *p)
{
    p->kdt = p->vdt = p->dtype;
    p->scale_corrupt = -1;
    if (r->pos >= r->size) return; /* an input from before 0.6 */
    const uint8_t e = next(r);
    if (e & 3) p->kdt = kinds[e & 3];
    if (e >> 2 & 3) p->vdt = kinds[e >> 2 & 3];
    p->append = (e & E_APPEND) != 0;
    if (e & E_DESCALES) p->descale_exp = next(r);
    if (e & E_ROTARY) {
        const uint8_t dim = next(r), inter = next(r), maxpos = next(r);
        p->rotary = 1;
        fa_rotary_init(&p->rot);
        int64_t rd;
        if (dim % 8 != 7) rd = p->d >= 2 ? 2 * (1 + (dim / 8) % (p->d / 2)) : 2; /* even, in range (d >= 2) */
        else switch (dim / 8 % 4) {
            case 0: rd = 1 + 2 * (dim / 32 % 8); break; /* odd */
            case 1: rd = 0; break;
            case 2: rd = p->d + 1 + dim / 32 % 3; break;
            default: rd = -2; break;
            }
        p->rot.rotary_dim = rd;
        p->rot.interleaved = inter % 8 == 7 ? 2 : inter & 1;
        p->rot_null = inter % 16 == 14 ? 1 + (inter >> 4 & 1) : 0;
        /* The largest position the call uses, plus one. */
        int64_t need = 1;
        for (int64_t b = 0; b < p->batch; ++b) {
            const seq *s = &p->seqs[b];
            if (s->fresh > 0 && s->cached - s->leftpad + s->fresh > need) need = s->cached - s->leftpad + s->fresh;
            for (int64_t i = 0; !p->append && i < s->queries; ++i)
                if (query_position(p, s, i) + 1 > need) need = query_position(p, s, i) + 1;
        }
        p->rot.max_position = maxpos & 128 ? need - 1 - (maxpos & 3) : need + (maxpos & 7);
        p->rotary_valid = rd >= 2 && rd % 2 == 0 && rd <= p->d && p->rot.interleaved != 2 && !p->rot_null &&
                          p->rot.max_position >= need;
    }
    if (e & E_BAD_SCALES) p->scale_corrupt = next(r);
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
    decode_ext(r, p);

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
        make_tensor(&p->cache.k, p->kdt, p->num_pages, p->page_size, p->heads_kv, p->d);
        make_tensor(&p->cache.v, p->vdt, p->num_pages, p->page_size, p->heads_kv, p->d);
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
        make_tensor(&p->cache.k, p->kdt, p->rows, p->capacity, p->heads_kv, p->d);
        make_tensor(&p->cache.v, p->vdt, p->rows, p->capacity, p->heads_kv, p->d);
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
        if (p->append) /* no queries: k_new packed by cu_seqlens_k (equal to q's offsets without flag 8) */
            p->varlen = (fa_varlen){p->batch, NULL, p->cu_k, 0, max_new};
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
    fill_cache(p, &rng);
}

/* A row of d values quantised (or stored) into cache tensor t at element offset o, with its int8
 * scale at scale[o / d] or its FP8 descale. */
FUZZ_CHECKER static void store_row(const problem *p, fa_dtype dt, void *data, float *scale, float descale, size_t o, const float *x)
{
    if (dt == FA_DTYPE_I8) {
        float absmax = 0.0f;
        for (int64_t c = 0; c < p->d; ++c) absmax = fabsf(x[c]) > absmax ? fabsf(x[c]) : absmax;
        const float sc = fa_i8_scale(absmax);
        scale[o / (size_t)p->d] = sc;
        for (int64_t c = 0; c < p->d; ++c) ((int8_t *)data)[o + (size_t)c] = fa_f32_to_i8(x[c], sc);
    } else if (fa_dtype_fp8(dt)) {
        for (int64_t c = 0; c < p->d; ++c) {
            const float y = x[c] / descale;
            ((uint8_t *)data)[o + (size_t)c] = dt == FA_DTYPE_FP8_E4M3 ? fa_f32_to_fp8_e4m3(y) : fa_f32_to_fp8_e5m2(y);
        }
    } else {
        for (int64_t c = 0; c < p->d; ++c) set(dt, data, o + (size_t)c, x[c]);
    }
}

FUZZ_CHECKER static float descale_of(const float *descale, const problem *p, int64_t b, int64_t h)
{
    return descale ? descale[b * p->heads_kv + h] : 1.0f;
}

/* Value of cache element o of sequence b, head h: dequantised for a quantised cache. */
FUZZ_CHECKER static double cache_value(const problem *p, int which_v, const void *data, const float *scale, int64_t b, int64_t h,
                          size_t o)
{
    const fa_dtype dt = which_v ? p->vdt : p->kdt;
    const float *descale = which_v ? p->v_descale : p->k_descale;
    switch (dt) {
    case FA_DTYPE_I8: return (double)((const int8_t *)data)[o] * (double)scale[o / (size_t)p->d];
    case FA_DTYPE_FP8_E4M3: return (double)fa_fp8_e4m3_to_f32(((const uint8_t *)data)[o]) * descale_of(descale, p, b, h);
    case FA_DTYPE_FP8_E5M2: return (double)fa_fp8_e5m2_to_f32(((const uint8_t *)data)[o]) * descale_of(descale, p, b, h);
    default: return get(dt, data, o);
    }
}

/* Scales, descales, rotary tables (from the value seed), then the cache: 0xff bytes (NaN in every
 * dtype and FP8 format, code -1 with a NaN scale for int8) wherever no sequence has a cached key. */
FUZZ_CHECKER static void fill_cache(problem *p, uint64_t *rng)
{
    const size_t n = elements(&p->cache.k);
    p->k_bytes = n * fa_dtype_size(p->kdt);
    p->v_bytes = n * fa_dtype_size(p->vdt);
    p->scale_count = n / (size_t)p->d;
    fa_kv_scales_init(&p->scales);
    if (p->kdt == FA_DTYPE_I8) p->k_scale = malloc(p->scale_count * sizeof(float));
    if (p->vdt == FA_DTYPE_I8) p->v_scale = malloc(p->scale_count * sizeof(float));
    if (p->k_scale) memset(p->k_scale, 0xff, p->scale_count * sizeof(float));
    if (p->v_scale) memset(p->v_scale, 0xff, p->scale_count * sizeof(float));
    const int64_t nd = p->batch * p->heads_kv;
    if (p->descale_exp) { /* FP8 descales (1 + m/8) 2^e, e in -5..3 */
        float **ds[2] = {&p->k_descale, &p->v_descale};
        const fa_dtype dts[2] = {p->kdt, p->vdt};
        for (int x = 0; x < 2; ++x) {
            if (!fa_dtype_fp8(dts[x])) continue;
            *ds[x] = malloc((size_t)nd * sizeof(float));
            for (int64_t i = 0; i < nd; ++i)
                (*ds[x])[i] = ldexpf(1.0f + (float)(splitmix(rng) % 8) / 8.0f, (int)(p->descale_exp % 9) - 5);
        }
    }
    p->scales.k_scale = p->k_scale;
    p->scales.v_scale = p->v_scale;
    p->scales.k_descale = p->k_descale;
    p->scales.v_descale = p->v_descale;
    if (quantised(p)) p->desc.kv_scales = &p->scales;
    if (p->rotary) {
        const int64_t half = p->rot.rotary_dim > 0 ? p->rot.rotary_dim / 2 : 1;
        const int64_t rows = p->rot.max_position > 0 ? p->rot.max_position : 1;
        p->rot_cos = malloc((size_t)(rows * half) * sizeof(float));
        p->rot_sin = malloc((size_t)(rows * half) * sizeof(float));
        for (int64_t i = 0; i < rows * half; ++i) {
            const double angle = ((double)(splitmix(rng) >> 11) * 0x1p-53 * 2.0 - 1.0) * 3.2;
            p->rot_cos[i] = (float)cos(angle);
            p->rot_sin[i] = (float)sin(angle);
        }
        p->rot.cos = p->rot_null == 1 ? NULL : p->rot_cos;
        p->rot.sin = p->rot_null == 2 ? NULL : p->rot_sin;
        p->desc.rotary = &p->rot;
    }
    memset(p->cache.k.data, 0xff, p->k_bytes);
    memset(p->cache.v.data, 0xff, p->v_bytes);
    float xk[40], xv[40];
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t pos = p->seqs[b].leftpad; pos < p->seqs[b].cached; ++pos)
            for (int64_t h = 0; h < p->heads_kv; ++h) {
                const size_t o = cache_offset(p, b, pos, h);
                for (int64_t c = 0; c < p->d; ++c) { /* k and v interleaved, as before 0.6 */
                    xk[c] = uniform(rng, p->amplitude);
                    xv[c] = uniform(rng, p->amplitude);
                }
                store_row(p, p->kdt, p->cache.k.data, p->k_scale, descale_of(p->k_descale, p, b, h), o, xk);
                store_row(p, p->vdt, p->cache.v.data, p->v_scale, descale_of(p->v_descale, p, b, h), o, xv);
            }
    p->k_before = malloc(p->k_bytes);
    p->v_before = malloc(p->v_bytes);
    memcpy(p->k_before, p->cache.k.data, p->k_bytes);
    memcpy(p->v_before, p->cache.v.data, p->v_bytes);
    if (p->k_scale) {
        p->k_scale_before = malloc(p->scale_count * sizeof(float));
        memcpy(p->k_scale_before, p->k_scale, p->scale_count * sizeof(float));
    }
    if (p->v_scale) {
        p->v_scale_before = malloc(p->scale_count * sizeof(float));
        memcpy(p->v_scale_before, p->v_scale, p->scale_count * sizeof(float));
    }
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
        if (p->append) p->varlen.cu_seqlens_q = p->cu_q; /* an append has no queries: must be NULL */
        else p->cu_q[p->batch] += variant ? -1 : 1;
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
    case C_SPLIT:
        if (p->append) break; /* fa_kvcache_append reads no kv_split_tokens */
        p->desc.kv_split_tokens = variant ? INT64_MIN : -1 - (int64_t)b; return mode;
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

/* Breaks desc->kv_scales (E_BAD_SCALES); returns the corruption applied. */
static int corrupt_scales(problem *p, uint8_t byte)
{
    int mode = byte % S_MODES;
    const int on_v = byte >> 2 & 1, variant = byte >> 3 & 3;
    const int64_t nd = p->batch * p->heads_kv;
    const size_t wrong_count = p->scale_count > (size_t)nd ? p->scale_count : (size_t)nd;
    p->wrong = malloc(wrong_count * sizeof(float));
    for (size_t i = 0; i < wrong_count; ++i) p->wrong[i] = 1.0f;
    p->desc.kv_scales = &p->scales;
    if (mode == S_MISSING && (p->kdt == FA_DTYPE_I8 || p->vdt == FA_DTYPE_I8)) {
        if (p->kdt == FA_DTYPE_I8 && (!on_v || p->vdt != FA_DTYPE_I8)) p->scales.k_scale = NULL;
        else p->scales.v_scale = NULL;
        return mode;
    }
    if (mode == S_DESCALE && (fa_dtype_fp8(p->kdt) || fa_dtype_fp8(p->vdt))) {
        const int v = fa_dtype_fp8(p->vdt) && (on_v || !fa_dtype_fp8(p->kdt));
        float *ds = v ? p->v_descale : p->k_descale;
        if (!ds) { /* NULL = 1: give an array of ones with one bad element */
            ds = p->wrong;
            if (v) p->scales.v_descale = ds;
            else p->scales.k_descale = ds;
        }
        static const float bad[4] = {NAN, INFINITY, 0.0f, -1.0f};
        ds[(size_t)(byte >> 5) % (size_t)nd] = bad[variant];
        return mode;
    }
    if (mode == S_SAME_ARRAY && p->kdt == FA_DTYPE_I8 && p->vdt == FA_DTYPE_I8) {
        p->scales.v_scale = p->scales.k_scale;
        return mode;
    }
    /* S_WRONG_DTYPE: a scale for a tensor without int8 codes, or a descale for one without FP8 codes. */
    const fa_dtype dt = on_v ? p->vdt : p->kdt;
    if (dt == FA_DTYPE_I8 || (variant & 1 && !fa_dtype_fp8(dt))) {
        if (on_v) p->scales.v_descale = p->wrong;
        else p->scales.k_descale = p->wrong;
    } else {
        if (on_v) p->scales.v_scale = p->wrong;
        else p->scales.k_scale = p->wrong;
    }
    return S_WRONG_DTYPE;
}

/* FUZZ_VERBOSE=1: print the decoded problem, to turn a crash input into a readable reproducer. */
static void describe(const problem *p, int corrupted)
{
    static const char *const dtypes[] = {"f32", "f16", "bf16", "i8", "e4m3", "e5m2"};
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
    fprintf(stderr, "  %s; cache k %s v %s, descales %s\n", p->append ? "fa_kvcache_append" : "fa_forward_kvcache_ex",
            dtypes[p->kdt], dtypes[p->vdt], p->k_descale || p->v_descale ? "given" : "NULL");
    if (p->rotary)
        fprintf(stderr, "  rotary: dim %lld interleaved %d max_position %lld%s (%s)\n", (long long)p->rot.rotary_dim,
                p->rot.interleaved, (long long)p->rot.max_position, p->rot_null ? " NULL table" : "",
                p->rotary_valid ? "valid" : "invalid");
    if (p->scale_corrupt >= 0) fprintf(stderr, "  scales: %s\n", scale_corruption_names[p->scale_corrupt]);
}

static void free_problem(problem *p)
{
    fa_tensor *ts[] = {&p->q, &p->k_new, &p->v_new, &p->out, &p->cache.k, &p->cache.v};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; ++i) free(ts[i]->data);
    free(p->lse);
    free(p->table);
    free(p->k_before);
    free(p->v_before);
    float *fs[] = {p->k_scale, p->v_scale, p->k_scale_before, p->v_scale_before, p->k_descale, p->v_descale, p->wrong,
                   p->rot_cos, p->rot_sin};
    for (size_t i = 0; i < sizeof fs / sizeof *fs; ++i) free(fs[i]);
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
    if (p->append)
        return settled(ctx, fa_kvcache_append(ctx, &p->desc, &p->cache, p->use_slots ? &p->slots : NULL,
                                              p->k_new.data ? &p->k_new : NULL, p->v_new.data ? &p->v_new : NULL));
    return settled(ctx, fa_forward_kvcache_ex(ctx, &p->desc, &p->q, &p->cache, p->use_slots ? &p->slots : NULL,
                                              p->k_new.data ? &p->k_new : NULL, p->v_new.data ? &p->v_new : NULL,
                                              &p->out, p->lse));
}

/* x (d values) rotated in double to position pos by the tables' f32 entries (dims past rotary_dim
 * unchanged). */
FUZZ_CHECKER static void rotate(const problem *p, int64_t pos, double *x)
{
    const int64_t half = p->rot.rotary_dim / 2;
    for (int64_t f = 0; f < half; ++f) {
        const int64_t ia = p->rot.interleaved ? 2 * f : f, ib = p->rot.interleaved ? 2 * f + 1 : f + half;
        const double a = x[ia], bb = x[ib], cs = p->rot_cos[pos * half + f], sn = p->rot_sin[pos * half + f];
        x[ia] = a * cs - bb * sn;
        x[ib] = bb * cs + a * sn;
    }
}

/* One appended row (which_v: v, else k) at element offset `to` of the cache against the expected
 * contents: without rotation (and always for v) the storing or quantisation rule applied to the new
 * row exactly, bytes and int8 scale; a rotated key within the rounding of the f32 rotation and the
 * storage (or quantisation) step. want/want_scale are the expected arrays: the row is written there
 * (the library's bytes once they pass the tolerance check). */
FUZZ_CHECKER static void check_row(const problem *p, int which_v, int64_t b, int64_t t, int64_t h, uint8_t *want, float *want_scale)
{
    const fa_dtype dt = which_v ? p->vdt : p->kdt;
    const size_t es = fa_dtype_size(dt), to = cache_offset(p, b, p->seqs[b].cached + t, h);
    const size_t from = new_offset(p, b, t, h);
    const void *src = which_v ? p->v_new.data : p->k_new.data;
    const void *got = which_v ? p->cache.v.data : p->cache.k.data;
    const float *got_scale = which_v ? p->v_scale : p->k_scale;
    const float descale = descale_of(which_v ? p->v_descale : p->k_descale, p, b, h);
    float xf[40];
    double xr[40], absmax = 0.0;
    for (int64_t c = 0; c < p->d; ++c) xf[c] = (float)get(p->dtype, src, from + (size_t)c);
    if (which_v || !p->rotary) {
        store_row(p, dt, want, want_scale, descale, to, xf);
        return;
    }
    for (int64_t c = 0; c < p->d; ++c) xr[c] = xf[c];
    rotate(p, p->seqs[b].cached - p->seqs[b].leftpad + t, xr);
    for (int64_t c = 0; c < p->d; ++c) absmax = fmax(absmax, fabs(xr[c]));
    double sc = 1.0, rel = 0.0, sub = 0.0; /* the step: scale, relative half-ulp, absolute subnormal step */
    if (dt == FA_DTYPE_I8) {
        sc = got_scale[to / (size_t)p->d];
        if (!(fabs(sc - absmax / 127.0) <= 1e-5 * absmax / 127.0))
            fail("appended k row (sequence %lld, token %lld, head %lld): int8 scale %.9g, expected %.9g (rotated row)",
                 (long long)b, (long long)t, (long long)h, sc, absmax / 127.0);
    } else if (fa_dtype_fp8(dt)) {
        sc = descale;
        rel = dt == FA_DTYPE_FP8_E4M3 ? 0x1p-3 : 0x1p-2;
        sub = dt == FA_DTYPE_FP8_E4M3 ? 0x1p-9 : 0x1p-16;
    } else {
        rel = storage_error(dt);
        sub = dt == FA_DTYPE_F16 ? 0x1p-24 : 0.0;
    }
    for (int64_t c = 0; c < p->d; ++c) {
        const double value = cache_value(p, 0, got, got_scale, b, h, to + (size_t)c);
        double tol;
        if (dt == FA_DTYPE_I8) tol = 0.5 * sc + 1e-5 * absmax;
        else {
            double y = xr[c] / sc; /* saturation of FP8 */
            const double top = dt == FA_DTYPE_FP8_E4M3 ? 448.0 : dt == FA_DTYPE_FP8_E5M2 ? 57344.0 : INFINITY;
            y = y > top ? top : y < -top ? -top : y;
            if (y != xr[c] / sc && fabs(value - y * sc) <= 1e-6 * absmax) continue;
            tol = (rel * fabs(xr[c] / sc) + sub) * sc + 1e-6 * absmax;
        }
        if (!(fabs(value - xr[c]) <= tol))
            fail("appended k (sequence %lld, token %lld, head %lld, dim %lld): %.9g, rotated %.9g, tolerance %.3g",
                 (long long)b, (long long)t, (long long)h, (long long)c, value, xr[c], tol);
    }
    memcpy(want + to * es, (const uint8_t *)got + to * es, (size_t)p->d * es);
    if (dt == FA_DTYPE_I8) want_scale[to / (size_t)p->d] = got_scale[to / (size_t)p->d];
}

/* The cache after the append: the copy from before with new token t of sequence b at position
 * cache_seqlens[b] + t of its row or pages (quantised, and rotated for k, by check_row); compared
 * byte for byte, int8 scale arrays too, so that a write anywhere else shows. */
FUZZ_CHECKER static void check_cache(const problem *p)
{
    uint8_t *k = malloc(p->k_bytes), *v = malloc(p->v_bytes);
    float *ks = p->k_scale ? malloc(p->scale_count * sizeof(float)) : NULL;
    float *vs = p->v_scale ? malloc(p->scale_count * sizeof(float)) : NULL;
    memcpy(k, p->k_before, p->k_bytes);
    memcpy(v, p->v_before, p->v_bytes);
    if (ks) memcpy(ks, p->k_scale_before, p->scale_count * sizeof(float));
    if (vs) memcpy(vs, p->v_scale_before, p->scale_count * sizeof(float));
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t t = 0; t < p->seqs[b].fresh; ++t)
            for (int64_t h = 0; h < p->heads_kv; ++h) {
                check_row(p, 0, b, t, h, k, ks);
                check_row(p, 1, b, t, h, v, vs);
            }
    const uint8_t *const want[4] = {k, v, (const uint8_t *)ks, (const uint8_t *)vs};
    const uint8_t *const got[4] = {p->cache.k.data, p->cache.v.data, (const uint8_t *)p->k_scale, (const uint8_t *)p->v_scale};
    const size_t bytes[4] = {p->k_bytes, p->v_bytes, p->scale_count * sizeof(float), p->scale_count * sizeof(float)};
    const size_t es[4] = {fa_dtype_size(p->kdt), fa_dtype_size(p->vdt), sizeof(float), sizeof(float)};
    static const char *const names[4] = {"k cache", "v cache", "k_scale", "v_scale"};
    for (int x = 0; x < 4; ++x)
        if (want[x] && memcmp(want[x], got[x], bytes[x]) != 0) {
            size_t i = 0;
            while (want[x][i] == got[x][i]) ++i;
            const size_t row = i / es[x] / (size_t)((x < 2 ? p->d : 1) * p->heads_kv);
            fail("%s differs from the expected append at cache row %zu, position %zu", names[x],
                 row / (size_t)p->cache.k.seqlen, row % (size_t)p->cache.k.seqlen);
        }
    free(k);
    free(v);
    free(ks);
    free(vs);
}

/* 1 when the cache (codes and int8 scales) is byte-identical to its copy from before the call. */
FUZZ_CHECKER static int cache_untouched(const problem *p)
{
    return !memcmp(p->cache.k.data, p->k_before, p->k_bytes) && !memcmp(p->cache.v.data, p->v_before, p->v_bytes) &&
           (!p->k_scale || !memcmp(p->k_scale, p->k_scale_before, p->scale_count * sizeof(float))) &&
           (!p->v_scale || !memcmp(p->v_scale, p->v_scale_before, p->scale_count * sizeof(float)));
}

/* Restores the cache (and int8 scales) from before the call. */
FUZZ_CHECKER static void restore_cache(problem *p)
{
    memcpy(p->cache.k.data, p->k_before, p->k_bytes);
    memcpy(p->cache.v.data, p->v_before, p->v_bytes);
    if (p->k_scale) memcpy(p->k_scale, p->k_scale_before, p->scale_count * sizeof(float));
    if (p->v_scale) memcpy(p->v_scale, p->v_scale_before, p->scale_count * sizeof(float));
}

/* Each sequence alone through the oracle: its keys are cache positions leftpad .. cached - 1, then
 * its new tokens; its queries are aligned at the end of them. */
FUZZ_CHECKER static void check_against_oracle(const problem *p)
{
    const fa_dtype dt = p->dtype;
    double qmax = 0.0, kmax = 0.0, vmax = 0.0;
    for (size_t o = 0; o < elements(&p->q); ++o) qmax = fmax(qmax, fabs(get(dt, p->q.data, o)));
    if (p->rotary) qmax *= sqrt(2.0); /* a rotated pair keeps its norm */
    /* Keys and values as the cache holds them after the call (the append was checked by check_cache),
     * dequantised. */
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t pos = p->seqs[b].leftpad; pos < p->seqs[b].cached + p->seqs[b].fresh; ++pos)
            for (int64_t h = 0; h < p->heads_kv; ++h)
                for (int64_t c = 0; c < p->d; ++c) {
                    const size_t o = cache_offset(p, b, pos, h) + (size_t)c;
                    kmax = fmax(kmax, fabs(cache_value(p, 0, p->cache.k.data, p->k_scale, b, h, o)));
                    vmax = fmax(vmax, fabs(cache_value(p, 1, p->cache.v.data, p->v_scale, b, h, o)));
                }
    const double scale = p->desc.softmax_scale != 0.0f ? p->desc.softmax_scale : 1.0 / sqrt((double)p->d);
    const double score_max = fabs(scale) * qmax * kmax * (double)p->d + p->modifier_max;
    /* Rotated queries are rounded to q's dtype by the library (in double here): a relative error of
     * the storage rounding in every score. */
    const double rot_err = p->rotary ? 2.0 * storage_error(dt) * score_max : 0.0;
    const double tol = tolerance(dt, vmax, score_max) + rot_err * (1.0 + vmax), lse_tol = 1e-5 * (1.0 + score_max) + rot_err;
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
            for (int64_t h = 0; h < hq; ++h) {
                double *row = q + (i * hq + h) * d;
                for (int64_t c = 0; c < d; ++c) row[c] = get(dt, p->q.data, query_offset(p, b, i, h) + (size_t)c);
                if (!p->rotary) continue;
                const int64_t pos = query_position(p, s, i);
                if (pos < 0 || pos >= p->rot.max_position)
                    fail("rotary: query %lld of sequence %lld at position %lld outside the tables [0, %lld)",
                         (long long)i, (long long)b, (long long)pos, (long long)p->rot.max_position);
                rotate(p, pos, row);
            }
        for (int64_t j = 0; j < keys; ++j)
            for (int64_t h = 0; h < hk; ++h) {
                const size_t o = cache_offset(p, b, s->leftpad + j, h);
                for (int64_t c = 0; c < d; ++c) {
                    k[(j * hk + h) * d + c] = cache_value(p, 0, p->cache.k.data, p->k_scale, b, h, o + (size_t)c);
                    v[(j * hk + h) * d + c] = cache_value(p, 1, p->cache.v.data, p->v_scale, b, h, o + (size_t)c);
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

/* The statuses (bits 1 << status) the call may return: FA_SUCCESS for a valid step, else those of
 * every fault it has (whichever the library checks first). */
static unsigned expected_statuses(const problem *p, int corrupted, fa_status table_status)
{
    unsigned bad = 0;
    if (corrupted >= 0) bad |= 1u << table_status;
    if (p->scale_corrupt >= 0) bad |= 1u << FA_ERROR_INVALID_VALUE;
    if (p->rotary && !p->rotary_valid) bad |= 1u << FA_ERROR_INVALID_VALUE;
    if (p->append && !p->k_new.data) bad |= 1u << FA_ERROR_INVALID_VALUE; /* nothing to append: k_new NULL */
    return bad ? bad : 1u << FA_SUCCESS;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    const uint8_t flags = next(&r), corruption = next(&r);
    problem p;
    memset(&p, 0, sizeof p);
    decode(&r, &p, flags);
    fa_status table_status = FA_SUCCESS;
    const int corrupted = flags & F_CORRUPT ? corrupt(&p, corruption, &table_status) : -1;
    if (p.scale_corrupt >= 0) p.scale_corrupt = corrupt_scales(&p, (uint8_t)p.scale_corrupt);
    const unsigned accept = expected_statuses(&p, corrupted, table_status);
    if (getenv("FUZZ_VERBOSE")) {
        describe(&p, corrupted);
        fprintf(stderr, "  input: %zu bytes, %zu decoded (0 past its end)\n", r.size, r.pos);
    }
    fa_context *ctx = context();
    const char *what = p.append ? "fa_kvcache_append" : "fa_forward_kvcache_ex";

    fa_status st = call(ctx, &p);
    if (!(accept & 1u << FA_SUCCESS)) {
        if (!((unsigned)st < 32 && accept & 1u << st)) {
            fprintf(stderr, "fuzz_kvcache: %s with %s%s%s returned %d (%s), expected one of the statuses 0x%x\n", what,
                    corrupted >= 0 ? corruption_names[corrupted] : "valid tables",
                    p.scale_corrupt >= 0 ? ", bad scales: " : "",
                    p.scale_corrupt >= 0 ? scale_corruption_names[p.scale_corrupt] : "", (int)st,
                    st ? fa_last_error() : "no error", accept);
            abort();
        }
        if (!fa_last_error()[0]) fail("%s failed without a message", what);
        if (!all_ff(p.out.data, p.out_bytes) || !all_ff(p.lse, p.lse_count * sizeof *p.lse))
            fail("%s failed (%s) but wrote out or lse", what, fa_last_error());
        if (!cache_untouched(&p)) fail("%s failed (%s) but wrote the cache or its scales", what, fa_last_error());
        free_problem(&p);
        return 0;
    }
    if (refusal_allowed(st)) {
        if (!fa_last_error()[0]) fail("%s refused without a message", what);
        if (!all_ff(p.out.data, p.out_bytes) || !all_ff(p.lse, p.lse_count * sizeof *p.lse) || !cache_untouched(&p))
            fail("%s refused (%s) but wrote out, lse or the cache", what, fa_last_error());
        free_problem(&p);
        return 0;
    }
    if (st != FA_SUCCESS) {
        fprintf(stderr, "fuzz_kvcache: %s failed on a valid problem: %s\n", what, fa_last_error());
        abort();
    }
    check_cache(&p);
    if (p.append) {
        if (!all_ff(p.out.data, p.out_bytes) || !all_ff(p.lse, p.lse_count * sizeof *p.lse))
            fail("fa_kvcache_append wrote out or lse");
    } else {
        check_against_oracle(&p);
    }

    /* The same call again from the same cache (on the CPU with two threads): the same bits. */
    const int cpu = fuzz_backend() == FA_BACKEND_CPU;
    void *out1 = malloc(p.out_bytes), *lse1 = malloc(p.lse_count * sizeof *p.lse);
    void *k1 = malloc(p.k_bytes), *v1 = malloc(p.v_bytes);
    memcpy(out1, p.out.data, p.out_bytes);
    memcpy(lse1, p.lse, p.lse_count * sizeof *p.lse);
    memcpy(k1, p.cache.k.data, p.k_bytes);
    memcpy(v1, p.cache.v.data, p.v_bytes);
    restore_cache(&p);
    if (cpu && fa_context_set_num_threads(ctx, 2) != FA_SUCCESS) fail("fa_context_set_num_threads(2): %s", fa_last_error());
    st = call(ctx, &p);
    if (cpu) fa_context_set_num_threads(ctx, 1);
    if (st != FA_SUCCESS) {
        fprintf(stderr, "fuzz_kvcache: the second call failed: %s\n", fa_last_error());
        abort();
    }
    if (memcmp(out1, p.out.data, p.out_bytes) || memcmp(lse1, p.lse, p.lse_count * sizeof *p.lse))
        fail(cpu ? "out or lse differ between 1 and 2 threads" : "out or lse differ between two runs");
    if (memcmp(k1, p.cache.k.data, p.k_bytes) || memcmp(v1, p.cache.v.data, p.v_bytes))
        fail(cpu ? "the appended cache differs between 1 and 2 threads" : "the appended cache differs between two runs");
    check_cache(&p);
    free(out1);
    free(lse1);
    free(k1);
    free(v1);
    free_problem(&p);
    return 0;
}

/* libFuzzer target for packed variable-length batches (desc->varlen): decodes its input into 1..6
 * sequences with their own query and key counts (empty ones and queries without keys included),
 * packed [1, total, heads, d] by cu_seqlens_q/k, with GQA, causal, sliding windows, dropout, a block
 * mask, score modifiers and truthful, larger or smaller max_seqlen_q/k, runs fa_forward then
 * fa_backward (fa_backward_ex with dsinks and dbias when the desc has sinks or a bias) on the CPU
 * backend and checks
 *  - the status is FA_SUCCESS, or the documented error for what the input asked for
 *    (FA_ERROR_INVALID_VALUE for broken offsets, shapes or a max_seqlen below a sequence's length,
 *    FA_ERROR_NOT_SUPPORTED for block positions, FA_ERROR_OUT_OF_MEMORY for an injected allocation
 *    failure), with a message;
 *  - a call that failed validation wrote nothing (out, lse, dq, dk, dv, dsinks, dbias keep their
 *    0xff canary bytes);
 *  - on success, out, lse, dq, dk, dv, dsinks and dbias match the double-precision oracle
 *    (tests/oracle.h) run on each sequence alone (dropout at the padded layout's coordinates).
 * Every tensor and table is allocated to its exact extent, so AddressSanitizer sees any
 * out-of-bounds access. Input layout: fuzz/README.md. Build and run: scripts/ci-fuzz.sh. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "flashattn.h"
#include "oracle.h"
#include "test_util.h"

#define FUZZ_TARGET "fuzz_varlen"
#include "fuzz_common.h"

#define MAX_SEQS 6
#define MAX_HEADS_Q 9

enum flags {
    F_CAUSAL = 1, F_WINDOW = 2, F_DROPOUT = 4, F_BLOCK_MASK = 8, F_MODIFIERS = 16, F_LIE = 32, F_SCALE = 64,
    F_CORRUPT = 128
};

/* The modifiers byte (flag 16). ALiBi needs the sequence's own positions, which the oracle's
 * dropout coordinates (below) replace: with dropout it is left off. */
enum extras { X_SOFTCAP = 1, X_ALIBI = 2, X_ALIBI_PER_BATCH = 4, X_SINKS = 8, X_BIAS = 16 };

/* Corruptions (mode = byte mod C_MODES); each breaks a documented rule, so every one applies. */
enum corruption {
    C_FIRST, C_DECREASING, C_LAST, C_NEGATIVE, C_BATCH, C_MAX, C_OUT_SHAPE, C_TENSOR_BATCH, C_SEQLENS_K,
    C_NULL_OFFSETS, C_BLOCK_MASK, C_POSITIONS, C_MODES
};
static const char *const corruption_names[C_MODES] = {
    "first offset not 0", "decreasing offset", "last offset past the rows", "negative offset",
    "varlen->batch not the tables' batch", "max_seqlen not positive", "out's shape", "tensors' batch 2",
    "seqlens_k with varlen", "NULL offsets", "block mask grid", "block positions"};

typedef struct problem {
    fa_dtype dtype;
    int64_t batch, heads_q, heads_kv, d;
    int64_t len_q[MAX_SEQS], len_k[MAX_SEQS];
    int64_t total_q, total_k, true_max_q, true_max_k;
    int64_t tile_bytes; /* the CPU's tile budget, 0: the L2's */
    int32_t *cu_q, *cu_k; /* batch + 1 entries (batch + 2 for C_BATCH) */
    size_t cu_entries;
    fa_varlen varlen;
    fa_attention_desc desc;
    fa_block_mask block_mask;
    uint8_t *mask_bits;
    fa_tensor q, k, v, out, dout, dq, dk, dv;
    size_t q_bytes, k_bytes; /* of each tensor as allocated */
    float *lse;
    size_t lse_count;
    double amplitude;
    uint64_t value_seed;
    float slopes[(MAX_SEQS + 1) * MAX_HEADS_Q], sinks[MAX_HEADS_Q], dsinks[MAX_HEADS_Q];
    int32_t seqlens_k[MAX_SEQS];
    fa_bias bias, dbias;
    size_t bias_elements;
    double modifier_max; /* bound on |ALiBi| + |bias| + |sink|, for the tolerances */
    int lie;             /* 0 truthful max_seqlen, 1 larger, -1 smaller than a sequence's length */
    int corruption;      /* -1 none */
    unsigned accept;     /* statuses (1 << status) a call may return */
} problem;

/* A sequence length: 0..12 mostly (0 often enough for empty sequences), a few up to 44. */
static int64_t length(uint8_t b) { return b < 224 ? b % 13 : 13 + (b - 224); }

static void make_tensor(fa_tensor *t, fa_dtype dtype, int64_t rows, int64_t heads, int64_t d, size_t *bytes)
{
    *t = (fa_tensor){NULL, dtype, 1, rows, heads, d, 0, 0, 0};
    *bytes = (size_t)(rows * heads * d) * test_dtype_size(dtype);
    t->data = malloc(*bytes);
}

FUZZ_CHECKER static double uniform(uint64_t *rng, double amplitude)
{
    return ((double)(splitmix(rng) >> 11) * 0x1p-53 * 2.0 - 1.0) * amplitude;
}

FUZZ_CHECKER static void fill(fa_tensor *t, uint64_t *rng, double amplitude)
{
    const size_t n = (size_t)(t->seqlen * t->heads * t->head_dim);
    for (size_t x = 0; x < n; ++x) test_store_element(t->data, x, t->dtype, (float)uniform(rng, amplitude));
}

/* A bias over [batch, heads_q, max_seqlen_q, max_seqlen_k], packed, broadcast along the axes whose
 * bit is set (1 batch, 2 heads, 4 rows). */
static void make_bias(fa_bias *bias, fa_dtype dtype, const problem *p, uint8_t broadcast, size_t *count)
{
    const int64_t mq = p->varlen.max_seqlen_q, mk = p->varlen.max_seqlen_k;
    const int64_t rows = broadcast & 4 ? 1 : mq, heads = broadcast & 2 ? 1 : p->heads_q;
    const int64_t batches = broadcast & 1 ? 1 : p->batch;
    *bias = (fa_bias){NULL, dtype, broadcast & 1 ? 0 : heads * rows * mk, broadcast & 2 ? 0 : rows * mk,
                      broadcast & 4 ? 0 : mk};
    *count = (size_t)(batches * heads * rows * mk);
    bias->data = malloc((*count ? *count : 1) * test_dtype_size(dtype));
}

static void decode_modifiers(reader *r, problem *p, uint64_t *rng)
{
    const uint8_t extras = next(r);
    fa_attention_desc *desc = &p->desc;
    if (extras & X_SOFTCAP) desc->softcap = 0.5f + (float)(next(r) % 64) * 0.25f;
    if (extras & X_ALIBI && desc->dropout_p == 0.0f) {
        desc->alibi_per_batch = (extras & X_ALIBI_PER_BATCH) != 0;
        const int64_t n = (desc->alibi_per_batch ? p->batch : 1) * p->heads_q;
        float max_slope = 0.0f;
        for (int64_t x = 0; x < n; ++x) {
            p->slopes[x] = (float)(next(r) % 65) / 64.0f;
            max_slope = p->slopes[x] > max_slope ? p->slopes[x] : max_slope;
        }
        desc->alibi_slopes = p->slopes;
        p->modifier_max += (double)max_slope * (double)(p->true_max_q + p->true_max_k);
    }
    if (extras & X_SINKS) {
        desc->sinks = p->sinks;
        p->modifier_max += decode_sinks(r, p->heads_q, p->sinks);
    }
    if (extras & X_BIAS) {
        const fa_dtype dtype = (fa_dtype)(next(r) % 3);
        const uint8_t broadcast = next(r) & 7;
        const double amplitude = 0.25 * (double)(1 + next(r) % 16);
        make_bias(&p->bias, dtype, p, broadcast, &p->bias_elements);
        make_bias(&p->dbias, FA_DTYPE_F32, p, broadcast, &p->bias_elements);
        for (size_t x = 0; x < p->bias_elements; ++x)
            test_store_element(p->bias.data, x, dtype, (float)uniform(rng, amplitude));
        desc->bias = &p->bias;
        p->modifier_max += amplitude;
    }
}

/* The offsets of the lengths, batch + 1 entries plus `spare` more. */
static int32_t *offsets(const int64_t *len, int64_t batch, size_t spare)
{
    int32_t *cu = malloc((size_t)(batch + 1) * sizeof *cu + spare * sizeof *cu);
    cu[0] = 0;
    for (int64_t b = 0; b < batch; ++b) cu[b + 1] = cu[b] + (int32_t)len[b];
    return cu;
}

static void decode(reader *r, problem *p, uint8_t flags, uint8_t corruption)
{
    p->dtype = (fa_dtype)(next(r) % 3);
    p->batch = 1 + next(r) % MAX_SEQS;
    p->heads_kv = 1 + next(r) % 3;
    p->heads_q = p->heads_kv * (1 + next(r) % 3);
    const uint8_t d = next(r);
    p->d = d < 224 ? 1 + d % 40 : 33 + (d - 224) * 2; /* a few larger head dims, up to 95 */
    for (int64_t b = 0; b < p->batch; ++b) {
        p->len_q[b] = length(next(r));
        p->len_k[b] = length(next(r));
        p->total_q += p->len_q[b];
        p->total_k += p->len_k[b];
    }
    /* A tensor needs a row: an input without any gets one in its first sequence. */
    if (p->total_q == 0) p->len_q[0] = p->total_q = 1;
    if (p->total_k == 0) p->len_k[0] = p->total_k = 1;
    int64_t pairs = 0; /* query-key pairs of every sequence */
    for (int64_t b = 0; b < p->batch; ++b) {
        p->true_max_q = p->len_q[b] > p->true_max_q ? p->len_q[b] : p->true_max_q;
        p->true_max_k = p->len_k[b] > p->true_max_k ? p->len_k[b] : p->true_max_k;
        pairs += p->len_q[b] * p->len_k[b];
    }
    p->d = fuzz_capped_head_dim(p->d, pairs, p->heads_q);
    p->corruption = flags & F_CORRUPT ? corruption % C_MODES : -1;
    p->cu_entries = (size_t)p->batch + (p->corruption == C_BATCH ? 2 : 1);
    p->cu_q = offsets(p->len_q, p->batch, p->corruption == C_BATCH);
    p->cu_k = offsets(p->len_k, p->batch, p->corruption == C_BATCH);
    p->varlen = (fa_varlen){p->batch, p->cu_q, p->cu_k, p->true_max_q, p->true_max_k};
    if (flags & F_LIE) {
        const uint8_t m = next(r);
        const int64_t amount = 1 + (m >> 3) % 8;
        switch (m % 4) {
        case 0: p->varlen.max_seqlen_q += amount; break;
        case 1: p->varlen.max_seqlen_k += amount; break;
        case 2: p->varlen.max_seqlen_q += amount; p->varlen.max_seqlen_k += amount; break;
        default: { /* below the longest sequence (0 when that has one row: not positive, also invalid) */
            int64_t *max = m & 4 ? &p->varlen.max_seqlen_k : &p->varlen.max_seqlen_q;
            *max = *max - amount > 0 ? *max - amount : *max - 1;
            break;
        }
        }
        p->lie = m % 4 == 3 ? -1 : 1;
    }
    fa_attention_desc_init(&p->desc);
    p->desc.varlen = &p->varlen;
    p->desc.causal = (flags & F_CAUSAL) != 0;
    if (flags & F_WINDOW) {
        p->desc.window_left = (int32_t)(next(r) % (p->true_max_k + 2)) - 1;
        p->desc.window_right = (int32_t)(next(r) % (p->true_max_k + 2)) - 1;
    }
    if (flags & F_DROPOUT) {
        p->desc.dropout_p = (float)(next(r) % 230) / 256.0f;
        p->desc.dropout_seed = next_u64(r);
        p->desc.dropout_offset = next_u64(r);
    }
    if (flags & F_BLOCK_MASK) {
        /* The grid covers max_seqlen_q x max_seqlen_k as declared (a lie included). */
        fa_block_mask *bm = &p->block_mask;
        bm->block_q = 1 + next(r) % 16;
        bm->block_k = 1 + next(r) % 16;
        bm->rows = (p->varlen.max_seqlen_q + bm->block_q - 1) / bm->block_q;
        bm->cols = (p->varlen.max_seqlen_k + bm->block_k - 1) / bm->block_k;
        const uint8_t density = next(r);
        p->mask_bits = malloc((size_t)(bm->rows * bm->cols) + 1);
        for (int64_t x = 0; x < bm->rows * bm->cols; ++x) p->mask_bits[x] = next(r) < density;
        bm->mask = p->mask_bits;
        p->desc.block_mask = bm;
    }
    if (flags & F_SCALE) p->desc.softmax_scale = (float)((int)next(r) - 128) / 32.0f;
    p->amplitude = 0.25 * (double)(1 + next(r) % 12); /* up to 3: scores reach a few hundred */
    p->value_seed = next_u64(r);
    make_tensor(&p->q, p->dtype, p->total_q, p->heads_q, p->d, &p->q_bytes);
    make_tensor(&p->out, p->dtype, p->total_q, p->heads_q, p->d, &p->q_bytes);
    make_tensor(&p->dout, p->dtype, p->total_q, p->heads_q, p->d, &p->q_bytes);
    make_tensor(&p->dq, p->dtype, p->total_q, p->heads_q, p->d, &p->q_bytes);
    make_tensor(&p->k, p->dtype, p->total_k, p->heads_kv, p->d, &p->k_bytes);
    make_tensor(&p->v, p->dtype, p->total_k, p->heads_kv, p->d, &p->k_bytes);
    make_tensor(&p->dk, p->dtype, p->total_k, p->heads_kv, p->d, &p->k_bytes);
    make_tensor(&p->dv, p->dtype, p->total_k, p->heads_kv, p->d, &p->k_bytes);
    p->lse_count = (size_t)(p->heads_q * p->total_q); /* [heads_q, total_q] */
    p->lse = malloc(p->lse_count * sizeof *p->lse);
    uint64_t rng = p->value_seed;
    fill(&p->q, &rng, p->amplitude);
    fill(&p->k, &rng, p->amplitude);
    fill(&p->v, &rng, p->amplitude);
    fill(&p->dout, &rng, 1.0);
    if (flags & F_MODIFIERS) decode_modifiers(r, p, &rng);
    p->tile_bytes = decode_tile_bytes(r);
}

/* Breaks one argument (mode p->corruption) against the documented rules; the byte also picks the
 * array (bit 0 of byte / 12: q's or k's), a variant (bit 0 of byte / 24) and a sequence (byte / 48). */
static void corrupt(problem *p, uint8_t byte)
{
    const int which_k = (byte / 12) & 1, variant = (byte / 24) & 1;
    const int64_t s = (byte / 48) % p->batch, B = p->batch;
    int32_t *cu = which_k ? p->cu_k : p->cu_q;
    const int64_t total = which_k ? p->total_k : p->total_q;
    fa_tensor *all[8] = {&p->q, &p->k, &p->v, &p->out, &p->dout, &p->dq, &p->dk, &p->dv};
    p->accept = 1u << FA_ERROR_INVALID_VALUE;
    switch (p->corruption) {
    case C_FIRST: cu[0] = variant ? -1 : (int32_t)(1 + s); break;
    case C_DECREASING: cu[s + 1] = cu[s] - 1 - 7 * variant; break;
    case C_LAST: cu[B] = variant ? INT32_MAX : (int32_t)(total + 1); break;
    case C_NEGATIVE: cu[s + 1] = variant ? INT32_MIN : -1; break;
    case C_BATCH:
        if (variant) {
            p->varlen.batch = -s; /* 0 or negative */
        } else { /* one sequence more than the tensors hold: the other array's is empty */
            p->varlen.batch = B + 1;
            p->cu_q[B + 1] = p->cu_q[B];
            p->cu_k[B + 1] = p->cu_k[B];
            cu[B + 1] = (int32_t)(total + 1);
        }
        break;
    case C_MAX: *(which_k ? &p->varlen.max_seqlen_k : &p->varlen.max_seqlen_q) = variant ? -1 - s : 0; break;
    case C_OUT_SHAPE:
        if (!which_k) *(variant ? &p->out.heads : &p->out.seqlen) += 1;
        else *(variant ? &p->out.batch : &p->out.head_dim) += 1;
        break;
    case C_TENSOR_BATCH:
        for (int x = 0; x < 8; ++x) all[x]->batch = 2;
        break;
    case C_SEQLENS_K:
        for (int64_t b = 0; b < B; ++b) p->seqlens_k[b] = (int32_t)p->len_k[b];
        p->desc.seqlens_k = p->seqlens_k;
        break;
    case C_NULL_OFFSETS: *(which_k ? &p->varlen.cu_seqlens_k : &p->varlen.cu_seqlens_q) = NULL; break;
    case C_BLOCK_MASK: { /* one block row or column too many for the declared max_seqlen */
        fa_block_mask *bm = &p->block_mask;
        const int32_t bq = bm->block_q ? bm->block_q : (int32_t)(1 + s), bk = bm->block_k ? bm->block_k : (int32_t)(1 + s);
        *bm = (fa_block_mask){bq, bk, (p->varlen.max_seqlen_q + bq - 1) / bq, (p->varlen.max_seqlen_k + bk - 1) / bk, NULL};
        *(which_k ? &bm->cols : &bm->rows) += 1 + variant;
        free(p->mask_bits);
        p->mask_bits = malloc((size_t)(bm->rows * bm->cols));
        memset(p->mask_bits, 1, (size_t)(bm->rows * bm->cols));
        bm->mask = p->mask_bits;
        p->desc.block_mask = bm;
        break;
    }
    default: /* C_POSITIONS: dense problems only */
        if (variant) *(which_k ? &p->desc.seqlen_k_global : &p->desc.seqlen_q_global) = (which_k ? p->total_k : p->total_q) + 1 + s;
        else *(which_k ? &p->desc.k_offset : &p->desc.q_offset) = 1 + s;
        p->accept = 1u << FA_ERROR_NOT_SUPPORTED;
        break;
    }
}

/* FUZZ_VERBOSE=1: print the decoded problem, to turn a crash input into a readable reproducer. */
static void describe(const problem *p, uint8_t alloc_fault)
{
    static const char *const dtypes[] = {"f32", "f16", "bf16"};
    fprintf(stderr,
            "problem: %s sequences %lld heads_q %lld heads_kv %lld head_dim %lld total_q %lld total_k %lld\n"
            "  varlen batch %lld max_seqlen_q %lld (true %lld) max_seqlen_k %lld (true %lld) lie %d\n",
            dtypes[p->dtype], (long long)p->batch, (long long)p->heads_q, (long long)p->heads_kv, (long long)p->d,
            (long long)p->total_q, (long long)p->total_k, (long long)p->varlen.batch, (long long)p->varlen.max_seqlen_q,
            (long long)p->true_max_q, (long long)p->varlen.max_seqlen_k, (long long)p->true_max_k, p->lie);
    const int32_t *tables[2] = {p->cu_q, p->cu_k};
    for (int t = 0; t < 2; ++t) {
        fprintf(stderr, "  cu_seqlens_%c%s", t ? 'k' : 'q', (t ? p->varlen.cu_seqlens_k : p->varlen.cu_seqlens_q) ? "" : " (passed NULL)");
        for (size_t x = 0; x < p->cu_entries; ++x) fprintf(stderr, " %d", tables[t][x]);
        fputc('\n', stderr);
    }
    fprintf(stderr,
            "  causal %d window (%d, %d) dropout %g block_mask %s scale %g amplitude %g\n"
            "  softcap %g alibi %s%s sinks %s bias %s\n  corrupt %s alloc_fault %u\n",
            p->desc.causal, p->desc.window_left, p->desc.window_right, (double)p->desc.dropout_p,
            p->desc.block_mask ? "yes" : "no", (double)p->desc.softmax_scale, p->amplitude, (double)p->desc.softcap,
            p->desc.alibi_slopes ? "yes" : "no", p->desc.alibi_per_batch ? " (per sequence)" : "",
            p->desc.sinks ? "yes" : "no", p->desc.bias ? dtypes[p->bias.dtype] : "no",
            p->corruption >= 0 ? corruption_names[p->corruption] : "no", (unsigned)alloc_fault);
    fprintf(stderr, "  cpu tile budget %lld bytes%s\n", (long long)p->tile_bytes, p->tile_bytes ? "" : " (the L2's)");
}

static void free_problem(problem *p)
{
    fa_tensor *ts[] = {&p->q, &p->k, &p->v, &p->out, &p->dout, &p->dq, &p->dk, &p->dv}; /* data never corrupted */
    for (size_t i = 0; i < 8; ++i) free(ts[i]->data);
    free(p->lse);
    free(p->cu_q);
    free(p->cu_k);
    free(p->mask_bits);
    free(p->bias.data);
    free(p->dbias.data);
}

__attribute__((format(printf, 1, 2), noreturn)) static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_varlen: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

/* Packed doubles of rows [row0, row0 + rows) of a [1, total, heads, d] tensor, and their largest
 * magnitude. */
FUZZ_CHECKER static double *rows_to_doubles(const fa_tensor *t, int64_t row0, int64_t rows, double *max_abs)
{
    const size_t n = (size_t)(rows * t->heads * t->head_dim), first = (size_t)(row0 * t->heads * t->head_dim);
    double *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t e = 0; e < n; ++e) {
        x[e] = test_load_element(t->data, first + e, t->dtype);
        if (max_abs && fabs(x[e]) > *max_abs) *max_abs = fabs(x[e]);
    }
    return x;
}

FUZZ_CHECKER static double max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* Compares rows [row0, row0 + rows) of t with want (packed doubles): the first element off by more
 * than tol fails (NaN counts as an infinite error). */
FUZZ_CHECKER static void compare_rows(const char *what, const fa_tensor *t, int64_t b, int64_t row0, int64_t rows,
                                      const double *want, double tol)
{
    const int64_t per_row = t->heads * t->head_dim;
    for (int64_t e = 0; e < rows * per_row; ++e) {
        const double got = test_load_element(t->data, (size_t)(row0 * per_row + e), t->dtype);
        const double err = fabs(got - want[e]);
        if (!(err <= tol))
            fail("%s error %.3g exceeds tolerance %.3g (sequence %lld, row %lld, head %lld, column %lld: %.9g, "
                 "expected %.9g)", what, err, tol, (long long)b, (long long)(e / per_row),
                 (long long)(e % per_row / t->head_dim), (long long)(e % t->head_dim), got, want[e]);
    }
}

/* The oracle's desc for sequence b alone: its slopes and its bias block. Without dropout the
 * sequence is a dense batch-1 problem. With dropout the oracle draws element
 * ((0 * heads_q + h) * seqlen_q_global + q_offset + i) * seqlen_k_global + k_offset + j, which is the
 * packed batch's ((b * heads_q + h) * max_seqlen_q + i) * max_seqlen_k + j for q_offset = b * heads_q *
 * max_seqlen_q and the declared maxima as global lengths; those positions would move the causal
 * diagonal and the window, so the visibility the dense desc gives goes in as a 1 x 1 block mask. */
FUZZ_CHECKER static void sequence_desc(const problem *p, int64_t b, const oracle_shape *s, fa_attention_desc *desc,
                                       fa_bias *bias, fa_block_mask *visible, uint8_t **visible_bits)
{
    *desc = p->desc;
    desc->varlen = NULL;
    desc->dropout_p = 0.0f;
    if (p->desc.alibi_slopes && p->desc.alibi_per_batch) {
        desc->alibi_slopes = p->slopes + b * p->heads_q;
        desc->alibi_per_batch = 0;
    }
    if (p->desc.bias) {
        *bias = p->bias;
        bias->data = (char *)p->bias.data + (size_t)(b * p->bias.stride_batch) * test_dtype_size(p->bias.dtype);
        desc->bias = bias;
    }
    *visible_bits = NULL;
    if (p->desc.dropout_p == 0.0f) return;
    uint8_t *bits = malloc((size_t)(s->seqlen_q * s->seqlen_k));
    for (int64_t i = 0; i < s->seqlen_q; ++i)
        for (int64_t j = 0; j < s->seqlen_k; ++j) bits[i * s->seqlen_k + j] = (uint8_t)oracle_visible(s, desc, 0, i, j);
    *visible = (fa_block_mask){1, 1, s->seqlen_q, s->seqlen_k, bits};
    desc->block_mask = visible;
    desc->causal = 0;
    desc->window_left = desc->window_right = -1;
    desc->dropout_p = p->desc.dropout_p;
    desc->q_offset = b * p->heads_q * p->varlen.max_seqlen_q;
    desc->seqlen_q_global = p->varlen.max_seqlen_q;
    desc->seqlen_k_global = p->varlen.max_seqlen_k;
    *visible_bits = bits;
}

FUZZ_CHECKER static void check_against_oracle(const problem *p, int backward)
{
    const int64_t hq = p->heads_q, hk = p->heads_kv, d = p->d, group = hq / hk;
    const double scale = p->desc.softmax_scale != 0.0f ? p->desc.softmax_scale : 1.0 / sqrt((double)d);
    const double keep = p->desc.dropout_p > 0.0f ? 1.0 / (1.0 - p->desc.dropout_p) : 1.0;
    double gq = 0.0, gk = 0.0, gv = 0.0, gdout = 0.0; /* over the whole batch, for dsinks and dbias */
    double *want_dbias = p->desc.bias && backward ? calloc(p->bias_elements ? p->bias_elements : 1, sizeof(double)) : NULL;
    double want_dsinks[MAX_HEADS_Q] = {0};
    for (int64_t b = 0; b < p->batch; ++b) {
        const int64_t nq = p->len_q[b], nk = p->len_k[b], q0 = p->cu_q[b], k0 = p->cu_k[b];
        double qmax = 0.0, kmax = 0.0, vmax = 0.0, dout_max = 0.0;
        double *q = rows_to_doubles(&p->q, q0, nq, &qmax), *k = rows_to_doubles(&p->k, k0, nk, &kmax);
        double *v = rows_to_doubles(&p->v, k0, nk, &vmax), *dout = rows_to_doubles(&p->dout, q0, nq, &dout_max);
        gq = fmax(gq, qmax), gk = fmax(gk, kmax), gv = fmax(gv, vmax), gdout = fmax(gdout, dout_max);
        const size_t nqe = (size_t)(nq * hq * d), nke = (size_t)(nk * hk * d);
        const double score_max = fabs(scale) * qmax * kmax * (double)d + p->modifier_max;
        const oracle_shape s = {1, hq, hk, nq, nk, d};
        fa_attention_desc desc;
        fa_bias bias;
        fa_block_mask visible;
        uint8_t *visible_bits = NULL;
        if (nq > 0 && nk > 0) sequence_desc(p, b, &s, &desc, &bias, &visible, &visible_bits);
        if (!backward) {
            double *out = calloc(nqe ? nqe : 1, sizeof *out), *lse = malloc((size_t)((nq ? nq : 1) * hq) * sizeof *lse);
            if (nq > 0 && nk > 0) {
                oracle_forward(&s, &desc, q, k, v, out, lse);
            } else { /* no keys: zeros, and the lse of the sink alone */
                for (int64_t x = 0; x < nq * hq; ++x) lse[x] = p->desc.sinks ? (double)p->sinks[x / nq] : -INFINITY;
            }
            compare_rows("out", &p->out, b, q0, nq, out, tolerance(p->dtype, vmax * keep, score_max));
            const double lse_tol = 1e-5 * (1.0 + score_max);
            for (int64_t h = 0; h < hq; ++h)
                for (int64_t i = 0; i < nq; ++i) {
                    const double want = lse[h * nq + i], got = p->lse[h * p->total_q + q0 + i];
                    if (isinf(want) ? got != want : !(fabs(got - want) <= lse_tol))
                        fail("lse %.9g, expected %.9g (tolerance %.3g; sequence %lld, row %lld, head %lld)", got, want,
                             lse_tol, (long long)b, (long long)i, (long long)h);
                }
            free(out);
            free(lse);
        } else {
            double *dq = calloc(nqe ? nqe : 1, sizeof *dq), *dk = calloc(nke ? nke : 1, sizeof *dk);
            double *dv = calloc(nke ? nke : 1, sizeof *dv), dsinks[MAX_HEADS_Q] = {0};
            fa_bias dbias_shape = {0};
            size_t dbias_count = 0;
            double *dbias = NULL;
            if (nq > 0 && nk > 0) {
                if (p->desc.bias) {
                    oracle_dbias_shape(&s, &desc, &dbias_shape, &dbias_count);
                    dbias = malloc(dbias_count * sizeof *dbias);
                }
                oracle_backward_ex(&s, &desc, q, k, v, dout, dq, dk, dv, p->desc.sinks ? dsinks : NULL, dbias);
            }
            /* As fuzz_attention: the error of D = rowsum(dO o O) from O stored in the dtype reaches
             * dQ through the probabilities (sum <= 1) and dK through every query row of its group. */
            const double delta_err = storage_error(p->dtype) * (double)d * dout_max * vmax * keep;
            const double dq_tol = tolerance(p->dtype, max_abs(dq, nqe), score_max) + fabs(scale) * kmax * keep * delta_err;
            const double dk_tol = tolerance(p->dtype, max_abs(dk, nke), score_max) +
                                  fabs(scale) * qmax * keep * (double)(group * nq) * delta_err;
            compare_rows("dq", &p->dq, b, q0, nq, dq, dq_tol);
            compare_rows("dk", &p->dk, b, k0, nk, dk, dk_tol);
            compare_rows("dv", &p->dv, b, k0, nk, dv, tolerance(p->dtype, max_abs(dv, nke), score_max));
            for (int64_t h = 0; h < hq; ++h) want_dsinks[h] += dsinks[h];
            /* The sequence's dbias into the batch's: its rows and keys from the block's first. */
            for (int64_t hb = 0; dbias && hb < (dbias_shape.stride_head ? hq : 1); ++hb)
                for (int64_t i = 0; i < (dbias_shape.stride_q ? nq : 1); ++i)
                    for (int64_t j = 0; j < nk; ++j)
                        want_dbias[b * p->dbias.stride_batch + hb * p->dbias.stride_head + i * p->dbias.stride_q + j] +=
                            dbias[hb * dbias_shape.stride_head + i * dbias_shape.stride_q + j];
            free(dq);
            free(dk);
            free(dv);
            free(dbias);
        }
        free(visible_bits);
        free(q);
        free(k);
        free(v);
        free(dout);
    }
    if (!backward) return;
    /* dsinks and dbias sum dS-sized terms (|dS| <= P (|dP| + |D|), |dP|, |D| <= d |dO| |V| / (1 - p))
     * over rows (and the bias's broadcast axes): each term carries the error of dP and D. */
    const double score_max = fabs(scale) * gq * gk * (double)d + p->modifier_max;
    const double delta_err = storage_error(p->dtype) * (double)d * gdout * gv * keep;
    const double term_tol = tolerance(p->dtype, 2.0 * (double)d * gdout * gv * keep, score_max) + delta_err;
    if (p->desc.sinks) {
        const double sink_tol = (double)p->total_q * term_tol;
        for (int64_t h = 0; h < hq; ++h) {
            const double err = fabs((double)p->dsinks[h] - want_dsinks[h]);
            if (!(err <= sink_tol))
                fail("dsinks[%lld] %.9g, expected %.9g (tolerance %.3g)", (long long)h, (double)p->dsinks[h],
                     want_dsinks[h], sink_tol);
        }
    }
    if (want_dbias) {
        const double summed = (double)((p->bias.stride_batch ? 1 : p->batch) * (p->bias.stride_head ? 1 : hq) *
                                       (p->bias.stride_q ? 1 : p->true_max_q));
        const double bias_tol = summed * term_tol;
        for (size_t x = 0; x < p->bias_elements; ++x) {
            const double got = ((const float *)p->dbias.data)[x], err = fabs(got - want_dbias[x]);
            if (!(err <= bias_tol))
                fail("dbias[%zu] %.9g, expected %.9g (tolerance %.3g)", x, got, want_dbias[x], bias_tol);
        }
        free(want_dbias);
    }
}

static void expect_failure(const problem *p, fa_status st, unsigned accept, const char *call, int outputs_untouched)
{
    if (!((unsigned)st < 32 && accept & 1u << st))
        fail("%s with %s%s returned %d (%s), expected one of the statuses 0x%x", call,
             p->corruption >= 0 ? corruption_names[p->corruption] : "valid tables",
             p->lie < 0 ? ", max_seqlen below a length" : "", (int)st, st ? fa_last_error() : "no error", accept);
    if (!fa_last_error()[0]) fail("%s failed without a message", call);
    if (!outputs_untouched) fail("%s failed (%s) but wrote outputs", call, fa_last_error());
}

/* fa_backward, or fa_backward_ex with dsinks/dbias (poisoned first) when the desc has sinks or a bias. */
static fa_status backward(fa_context *ctx, problem *p)
{
    if (!p->desc.sinks && !p->desc.bias)
        return fa_backward(ctx, &p->desc, &p->q, &p->k, &p->v, &p->out, &p->dout, p->lse, &p->dq, &p->dk, &p->dv);
    memset(p->dsinks, 0xff, sizeof p->dsinks);
    if (p->desc.bias) memset(p->dbias.data, 0xff, p->bias_elements * sizeof(float));
    return fa_backward_ex(ctx, &p->desc, &p->q, &p->k, &p->v, &p->out, &p->dout, p->lse, &p->dq, &p->dk, &p->dv,
                          p->desc.sinks ? p->dsinks : NULL, p->desc.bias ? &p->dbias : NULL);
}

static int backward_untouched(const problem *p)
{
    return all_ff(p->dq.data, p->q_bytes) && all_ff(p->dk.data, p->k_bytes) && all_ff(p->dv.data, p->k_bytes) &&
           (!p->desc.sinks || all_ff(p->dsinks, sizeof p->dsinks)) &&
           (!p->desc.bias || all_ff(p->dbias.data, p->bias_elements * sizeof(float)));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    const uint8_t flags = next(&r), corruption = next(&r), alloc_fault = next(&r);
    problem p;
    memset(&p, 0, sizeof p);
    decode(&r, &p, flags, corruption);
    if (p.corruption >= 0) corrupt(&p, corruption);
    if (p.lie < 0) p.accept |= 1u << FA_ERROR_INVALID_VALUE;
    if (getenv("FUZZ_VERBOSE")) {
        describe(&p, alloc_fault);
        fprintf(stderr, "  input: %zu bytes, %zu decoded (0 past its end)\n", r.size, r.pos);
    }
    fa_context *ctx = context();
    fa_cpu_debug_tile_bytes(p.tile_bytes);
    memset(p.out.data, 0xff, p.q_bytes); /* 0xff bytes: a NaN in every dtype, never a result */
    memset(p.lse, 0xff, p.lse_count * sizeof *p.lse);
    /* alloc_fault 1..8: fail that allocation of the forward (and, separately, of the backward). */
    const size_t fail_at = !p.accept && alloc_fault >= 1 && alloc_fault <= 8 ? alloc_fault : 0;

    fa_debug_fail_allocation(fail_at);
    fa_status st = fa_forward(ctx, &p.desc, &p.q, &p.k, &p.v, &p.out, p.lse);
    const size_t forward_allocations = fa_debug_fail_allocation(0);
    if (p.accept) {
        expect_failure(&p, st, p.accept, "fa_forward", all_ff(p.out.data, p.q_bytes) && all_ff(p.lse, p.lse_count * sizeof *p.lse));
    } else {
        if (fail_at && fail_at <= forward_allocations) {
            expect_failure(&p, st, 1u << FA_ERROR_OUT_OF_MEMORY, "fa_forward", 1);
            st = fa_forward(ctx, &p.desc, &p.q, &p.k, &p.v, &p.out, p.lse); /* must work again */
        }
        if (st != FA_SUCCESS) fail("fa_forward failed on a valid problem: %s", fa_last_error());
        check_against_oracle(&p, 0);
    }

    memset(p.dq.data, 0xff, p.q_bytes);
    memset(p.dk.data, 0xff, p.k_bytes);
    memset(p.dv.data, 0xff, p.k_bytes);
    fa_debug_fail_allocation(fail_at);
    st = backward(ctx, &p);
    const size_t backward_allocations = fa_debug_fail_allocation(0);
    if (p.accept) {
        expect_failure(&p, st, p.accept, "fa_backward", backward_untouched(&p));
    } else {
        if (fail_at && fail_at <= backward_allocations) {
            expect_failure(&p, st, 1u << FA_ERROR_OUT_OF_MEMORY, "fa_backward", 1);
            st = backward(ctx, &p);
        }
        if (st != FA_SUCCESS) fail("fa_backward failed on a valid problem: %s", fa_last_error());
        check_against_oracle(&p, 1);
    }
    free_problem(&p);
    return 0;
}

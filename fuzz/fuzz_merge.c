/* libFuzzer target for fa_merge_partials on the CPU backend: decodes its input into n partial
 * results of the same queries (n, dtype, shape, a strided layout per part and for out, lses that mix
 * ordinary values, -inf, +inf, NaN and large magnitudes per row and part, parts that hold NaN or inf,
 * parts sharing one tensor or lse array, lse_out NULL or not), or into one corrupted argument, and
 * checks
 *  - a corrupted argument returns FA_ERROR_INVALID_VALUE with a message, an injected allocation
 *    failure FA_ERROR_OUT_OF_MEMORY with a message (and the call then works), and a failed call
 *    wrote nothing: out and lse_out keep their canary bytes;
 *  - no call writes an input (parts and lses stay byte-identical) or out's gaps;
 *  - each row against the documented merge, computed here in double: with M the largest lse,
 *    out = sum_c e^(lse_c - M) out_c / sum_c e^(lse_c - M) and lse_out = M + log of that sum, within
 *    f32 rounding and out's storage rounding; a part with lse -inf is not read (its values may be
 *    NaN); a row whose every part is -inf gives zeros and lse -inf; a row with a NaN or +inf lse gives
 *    NaN out and lse (the row rule of src/common/merge_rule.h);
 *  - the same call with 2 threads gives the same bytes.
 * Every tensor and array is allocated to its exact extent, so AddressSanitizer sees any
 * out-of-bounds access. Input layout: fuzz/README.md. Build and run: scripts/ci-fuzz.sh. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/half.h"
#include "flashattn.h"

#define FUZZ_TARGET "fuzz_merge"
#include "fuzz_common.h"

#define MAX_PARTS 8

enum flags {
    F_STRIDED = 1, F_NO_LSE_OUT = 2, F_SPECIAL_LSE = 4, F_SPECIAL_VALUES = 8, F_SHARED = 16, F_ALLOC_FAULT = 32,
    F_CORRUPT = 128
};

/* Exotic lse kinds (the kinds byte; 0 = all of them). */
enum kinds { K_NAN = 1, K_POS_INF = 2, K_HUGE = 4, K_EXP_EDGE = 8, K_FLT_MAX = 16, K_TINY = 32, K_ALL = 63 };

/* Corruptions (mode = corruption byte mod C_MODES; the variant byte, read last, picks the part,
 * variant mod n, and the details, variant / 8). */
enum corruption {
    C_N, C_OUTS_NULL, C_LSES_NULL, C_PART_NULL, C_LSE_NULL, C_PART_SHAPE, C_PART_DTYPE, C_OUT_OVER_PART,
    C_OUT_OVER_LSE, C_LSE_OUT_OVER_LSE, C_LSE_OUT_OVER_OUT, C_LSE_OUT_OVER_PART, C_STRIDES, C_OUT_DIMS,
    C_MISALIGNED, C_NULL_OTHER, C_MODES
};
static const char *const corruption_names[C_MODES] = {
    "n < 1", "outs NULL", "lses NULL", "outs[c] NULL or its data NULL", "lses[c] NULL", "outs[c] of another shape",
    "outs[c] of another dtype", "out overlaps outs[c]", "out overlaps lses[c]", "lse_out overlaps lses[c]",
    "lse_out overlaps out", "lse_out overlaps outs[c]", "bad strides (out or outs[c])", "out dims not positive or overflowing",
    "misaligned out, lses[c] or lse_out", "ctx or out NULL, out's data NULL, out dtype quantised or unknown"};

typedef struct problem {
    int n;
    fa_dtype dtype;
    int64_t batch, seqlen, heads, head_dim;
    size_t rows; /* batch * heads * seqlen: the length of every lse array */
    /* The allocated parts (part c's tensor is tensors[tensor_of[c]], its lses lse_arrays[lse_of[c]]). */
    fa_tensor tensors[MAX_PARTS];
    size_t tensor_bytes[MAX_PARTS];
    float *lse_arrays[MAX_PARTS];
    int tensor_of[MAX_PARTS], lse_of[MAX_PARTS];
    uint8_t layouts[MAX_PARTS + 1];
    fa_tensor out;
    size_t out_bytes;
    float *lse_out; /* always allocated (canary); passed only when lse_out_given */
    int lse_out_given;
    double amplitude, center, spread;
    uint8_t p_neginf, p_row_neginf, p_exotic, kinds, p_values, alloc_fault;
    uint64_t value_seed;
} problem;

/* What one call gets: the problem's arguments, possibly corrupted (copies, never the allocations). */
typedef struct call_args {
    fa_context *ctx;
    int n;
    const fa_tensor *outs_array[MAX_PARTS];
    const float *lses_array[MAX_PARTS];
    const fa_tensor *const *outs;
    const float *const *lses;
    fa_tensor part_copy, out_copy;
    fa_tensor *out;
    float *lse_out;
} call_args;

static size_t elem_size(fa_dtype dtype) { return dtype == FA_DTYPE_F32 ? 4 : 2; }

/* Explicit strides with gaps, a [batch, heads, seqlen, d] order, or packed (strides 0); exact size. */
static void make_tensor(uint8_t layout, int strided, fa_tensor *t, size_t *bytes, const problem *p)
{
    const int64_t batch = p->batch, seqlen = p->seqlen, heads = p->heads, d = p->head_dim;
    *t = (fa_tensor){NULL, p->dtype, batch, seqlen, heads, d, 0, 0, 0};
    int64_t last = batch * seqlen * heads * d;
    if (strided && !(layout & 128)) last = set_gapped_strides(t, layout);
    *bytes = (size_t)last * elem_size(p->dtype);
    t->data = malloc(*bytes);
    /* The gaps too: inputs are compared byte for byte with their copies after each call. */
    if (t->data) memset(t->data, 0xa5, *bytes);
}

FUZZ_CHECKER static double uniform(uint64_t *rng) { return (double)(splitmix(rng) >> 11) * 0x1p-53 * 2.0 - 1.0; }

/* True with probability byte / 256. */
FUZZ_CHECKER static int chance(uint64_t *rng, uint8_t byte) { return (splitmix(rng) & 255) < byte; }

/* One exotic lse of the allowed kinds. */
FUZZ_CHECKER static float exotic(uint64_t *rng, uint8_t kinds)
{
    static const float edge[] = {80.0f, -80.0f, 88.72f, -87.34f, -103.98f, 104.0f};
    static const float tiny[] = {1e-40f, -1e-40f, -0.0f, 1e-30f, -1e-30f};
    const uint64_t z = splitmix(rng);
    int kind;
    do kind = (int)(splitmix(rng) % 6);
    while (!(kinds & (1 << kind)));
    switch (1 << kind) {
    case K_NAN: return z & 1 ? NAN : -NAN;
    case K_POS_INF: return INFINITY;
    case K_HUGE: return z & 1 ? 1e30f : -1e30f;
    case K_EXP_EDGE: return edge[z % 6];
    case K_FLT_MAX: return z & 1 ? FLT_MAX : -FLT_MAX;
    default: return tiny[z % 5];
    }
}

/* The values: uniform in [-amplitude, amplitude]; with F_SPECIAL_VALUES some rows hold a NaN or an
 * infinity, and rows of a part whose lse is -inf are often all NaN (they must not be read). */
FUZZ_CHECKER static void fill(problem *p, int c, uint64_t *rng, int special)
{
    fa_tensor *t = &p->tensors[c];
    const float *lse = p->lse_arrays[c];
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t h = 0; h < p->heads; ++h)
            for (int64_t s = 0; s < p->seqlen; ++s) {
                const size_t row = (size_t)((b * p->heads + h) * p->seqlen + s);
                const int unread = special && lse[row] == -INFINITY && (splitmix(rng) & 1);
                for (int64_t x = 0; x < p->head_dim; ++x)
                    tensor_set(t, tensor_offset(t, b, s, h, x), unread ? NAN : (float)(uniform(rng) * p->amplitude));
                if (special && !unread && chance(rng, p->p_values)) {
                    static const float bad[] = {NAN, INFINITY, -INFINITY};
                    tensor_set(t, tensor_offset(t, b, s, h, (int64_t)(splitmix(rng) % (uint64_t)p->head_dim)), bad[splitmix(rng) % 3]);
                }
            }
}

static void decode(reader *r, problem *p, uint8_t flags)
{
    p->n = 1 + next(r) % MAX_PARTS;
    p->dtype = (fa_dtype)(next(r) % 3);
    p->batch = 1 + next(r) % 3;
    p->seqlen = 1 + next(r) % 40;
    p->heads = 1 + next(r) % 4;
    p->head_dim = 1 + next(r) % 70;
    p->rows = (size_t)(p->batch * p->heads * p->seqlen);
    p->amplitude = 0.25 * (double)(1 + next(r) % 16);
    p->spread = 0.5 * (double)(next(r) % 64);
    p->center = 0.5 * (double)(int8_t)next(r);
    p->value_seed = next_u64(r);
    const int strided = (flags & F_STRIDED) != 0;
    for (int c = 0; c <= p->n && strided; ++c) p->layouts[c] = next(r);
    if (flags & F_SPECIAL_LSE) {
        p->p_neginf = next(r);
        p->p_row_neginf = next(r);
        p->p_exotic = next(r);
        p->kinds = next(r) & K_ALL;
        if (!p->kinds) p->kinds = K_ALL;
    }
    if (flags & F_SPECIAL_VALUES) p->p_values = next(r);
    if (flags & F_ALLOC_FAULT) p->alloc_fault = 1 + next(r) % 3;
    p->lse_out_given = !(flags & F_NO_LSE_OUT);

    for (int c = 0; c < p->n; ++c) {
        make_tensor(p->layouts[c], strided, &p->tensors[c], &p->tensor_bytes[c], p);
        p->lse_arrays[c] = malloc(p->rows * sizeof(float));
        p->tensor_of[c] = p->lse_of[c] = c;
    }
    make_tensor(p->layouts[p->n], strided, &p->out, &p->out_bytes, p);
    p->lse_out = malloc(p->rows * sizeof(float));

    uint64_t rng = p->value_seed;
    for (size_t row = 0; row < p->rows; ++row) {
        const int row_neginf = (flags & F_SPECIAL_LSE) && chance(&rng, p->p_row_neginf);
        for (int c = 0; c < p->n; ++c) {
            float lse = (float)(p->center + p->spread * uniform(&rng));
            if (row_neginf) lse = -INFINITY;
            else if ((flags & F_SPECIAL_LSE) && chance(&rng, p->p_neginf)) lse = -INFINITY;
            else if ((flags & F_SPECIAL_LSE) && chance(&rng, p->p_exotic)) lse = exotic(&rng, p->kinds);
            p->lse_arrays[c][row] = lse;
        }
    }
    for (int c = 0; c < p->n; ++c) fill(p, c, &rng, (flags & F_SPECIAL_VALUES) != 0);
    /* Inputs may alias each other: a part may pass part 0's tensor or lse array again. */
    for (int c = 1; c < p->n && (flags & F_SHARED); ++c) {
        const uint64_t z = splitmix(&rng);
        if (z & 1) p->tensor_of[c] = 0;
        if (z & 2) p->lse_of[c] = 0;
    }
}

static void free_problem(problem *p)
{
    for (int c = 0; c < p->n; ++c) {
        free(p->tensors[c].data);
        free(p->lse_arrays[c]);
    }
    free(p->out.data);
    free(p->lse_out);
}

static const char *dtype_name(fa_dtype dtype) { return dtype == FA_DTYPE_F32 ? "f32" : dtype == FA_DTYPE_F16 ? "f16" : "bf16"; }

/* FUZZ_VERBOSE=1: the decoded problem (and its lses when there are few). */
static void describe(const problem *p, uint8_t flags, int corrupted, uint8_t variant)
{
    fprintf(stderr,
            "problem: n %d %s batch %lld seqlen %lld heads %lld head_dim %lld lse_out %s amplitude %g\n"
            "  lse center %g spread %g; -inf %u/256 per part, %u/256 per row; exotic %u/256 kinds 0x%x; "
            "non-finite values %u/256 per row%s\n"
            "  shared inputs %d alloc_fault %u corrupt %s (variant %u)\n",
            p->n, dtype_name(p->dtype), (long long)p->batch, (long long)p->seqlen, (long long)p->heads,
            (long long)p->head_dim, p->lse_out_given ? "given" : "NULL", p->amplitude, p->center, p->spread,
            (unsigned)p->p_neginf, (unsigned)p->p_row_neginf, (unsigned)p->p_exotic, (unsigned)p->kinds,
            (unsigned)p->p_values, flags & F_SPECIAL_VALUES ? " (-inf rows often all NaN)" : "",
            (flags & F_SHARED) != 0, (unsigned)p->alloc_fault, corrupted >= 0 ? corruption_names[corrupted] : "no",
            (unsigned)variant);
    for (int c = 0; c <= p->n; ++c) {
        const fa_tensor *t = c < p->n ? &p->tensors[p->tensor_of[c]] : &p->out;
        char name[24]; /* "part " and any int */
        if (c < p->n) snprintf(name, sizeof name, "part %d", c);
        else snprintf(name, sizeof name, "out");
        fprintf(stderr, "  %s: strides (%lld, %lld, %lld), %zu bytes%s", name, (long long)t->stride_batch, (long long)t->stride_seq, (long long)t->stride_head,
                c < p->n ? p->tensor_bytes[p->tensor_of[c]] : p->out_bytes,
                c < p->n && c && p->tensor_of[c] == 0 ? " (part 0's tensor)" : "");
        fprintf(stderr, "%s\n", c < p->n && c && p->lse_of[c] == 0 ? " (part 0's lses)" : "");
    }
    if (p->rows * (size_t)p->n <= 96)
        for (size_t row = 0; row < p->rows; ++row) {
            fprintf(stderr, "  row %zu lse:", row);
            for (int c = 0; c < p->n; ++c) fprintf(stderr, " %.9g", (double)p->lse_arrays[p->lse_of[c]][row]);
            fprintf(stderr, "\n");
        }
}

#define fail(...) (fprintf(stderr, FUZZ_TARGET ": " __VA_ARGS__), fprintf(stderr, "\n"), abort())

static void plain_args(problem *p, call_args *a)
{
    a->ctx = context();
    a->n = p->n;
    for (int c = 0; c < p->n; ++c) {
        a->outs_array[c] = &p->tensors[p->tensor_of[c]];
        a->lses_array[c] = p->lse_arrays[p->lse_of[c]];
    }
    a->outs = a->outs_array;
    a->lses = a->lses_array;
    a->out = &p->out;
    a->lse_out = p->lse_out_given ? p->lse_out : NULL;
}

/* Breaks one argument the header forbids; returns the mode. */
static int corrupt(problem *p, call_args *a, uint8_t byte, uint8_t variant_byte)
{
    const int mode = byte % C_MODES, c = variant_byte % p->n;
    const unsigned variant = variant_byte / 8;
    const fa_tensor *part = a->outs_array[c];
    const size_t part_bytes = p->tensor_bytes[p->tensor_of[c]];
    a->part_copy = *part;
    a->out_copy = p->out;
    switch (mode) {
    case C_N: {
        const int bad[] = {0, -1, -p->n, INT_MIN};
        a->n = bad[variant % 4];
        break;
    }
    case C_OUTS_NULL: a->outs = NULL; break;
    case C_LSES_NULL: a->lses = NULL; break;
    case C_PART_NULL:
        if (variant & 1) a->part_copy.data = NULL, a->outs_array[c] = &a->part_copy;
        else a->outs_array[c] = NULL;
        break;
    case C_LSE_NULL: a->lses_array[c] = NULL; break;
    case C_PART_SHAPE: {
        int64_t *dims[4] = {&a->part_copy.batch, &a->part_copy.seqlen, &a->part_copy.heads, &a->part_copy.head_dim};
        int64_t *dim = dims[variant % 4];
        *dim += *dim > 1 && (variant & 4) ? -1 : 1;
        a->outs_array[c] = &a->part_copy;
        break;
    }
    case C_PART_DTYPE: {
        const fa_dtype others[] = {(fa_dtype)((p->dtype + 1) % 3), (fa_dtype)((p->dtype + 2) % 3), FA_DTYPE_I8};
        a->part_copy.dtype = others[variant % 3];
        a->outs_array[c] = &a->part_copy;
        break;
    }
    case C_OUT_OVER_PART: /* out starts inside outs[c]'s span */
        a->out_copy.data = (char *)part->data + variant % (part_bytes / elem_size(p->dtype)) * elem_size(p->dtype);
        a->out = &a->out_copy;
        break;
    case C_OUT_OVER_LSE:
        a->out_copy.data = (float *)a->lses_array[c] + variant % p->rows;
        a->out = &a->out_copy;
        break;
    case C_LSE_OUT_OVER_LSE: a->lse_out = (float *)a->lses_array[c] + variant % p->rows; break;
    case C_LSE_OUT_OVER_OUT:
        a->lse_out = (float *)p->out.data + (p->out_bytes >= 4 ? variant % (p->out_bytes / 4) : 0);
        break;
    case C_LSE_OUT_OVER_PART:
        a->lse_out = (float *)part->data + (part_bytes >= 4 ? variant % (part_bytes / 4) : 0);
        break;
    case C_STRIDES: {
        fa_tensor *t = variant & 1 ? &a->out_copy : &a->part_copy;
        switch ((variant / 2) % 4) {
        case 0: t->stride_batch = 1, t->stride_seq = 0, t->stride_head = 0; break; /* partly zero */
        case 1: /* one negative stride */
            t->stride_batch = p->seqlen * p->heads * p->head_dim, t->stride_seq = p->heads * p->head_dim;
            t->stride_head = -p->head_dim;
            break;
        case 2: /* the last element's byte offset past INT64_MAX (a dimension of 1 never uses its stride) */
            t->stride_batch = p->seqlen * p->heads * p->head_dim, t->stride_seq = p->heads * p->head_dim;
            t->stride_head = p->head_dim;
            if (p->batch > 1) t->stride_batch = INT64_MAX / 2 + 1;
            else if (p->seqlen > 1) t->stride_seq = INT64_MAX / 2 + 1;
            else if (p->heads > 1) t->stride_head = INT64_MAX / 2 + 1;
            else t->stride_head = -1;
            break;
        default: t->stride_batch = INT64_MIN, t->stride_seq = 1, t->stride_head = 1; break;
        }
        if (variant & 1) a->out = &a->out_copy;
        else a->outs_array[c] = &a->part_copy;
        break;
    }
    case C_OUT_DIMS: {
        int64_t *dims[4] = {&a->out_copy.batch, &a->out_copy.seqlen, &a->out_copy.heads, &a->out_copy.head_dim};
        const int64_t bad[4] = {0, -1, INT64_MIN, INT64_MAX};
        *dims[variant % 4] = bad[(variant / 4) % 4];
        a->out = &a->out_copy;
        break;
    }
    case C_MISALIGNED:
        switch (variant % 3) {
        case 0: a->out_copy.data = (char *)p->out.data + elem_size(p->dtype) / 2, a->out = &a->out_copy; break;
        case 1: a->lses_array[c] = (const float *)((const char *)a->lses_array[c] + 1 + (variant / 3) % 3); break;
        default: a->lse_out = (float *)((char *)p->lse_out + 1 + (variant / 3) % 3); break;
        }
        break;
    default: /* C_NULL_OTHER */
        switch (variant % 5) {
        case 0: a->ctx = NULL; break;
        case 1: a->out = NULL; break;
        case 2: a->out_copy.data = NULL, a->out = &a->out_copy; break;
        case 3: a->out_copy.dtype = FA_DTYPE_FP8_E4M3, a->out = &a->out_copy; break;
        default: a->out_copy.dtype = (fa_dtype)77, a->out = &a->out_copy; break;
        }
        break;
    }
    return mode;
}

static fa_status call(const call_args *a)
{
    return fa_merge_partials(a->ctx, a->n, a->outs, a->lses, a->out, a->lse_out);
}

/* Byte copies of every input, to prove that no call writes one. */
typedef struct snapshot {
    void *tensors[MAX_PARTS];
    float *lses[MAX_PARTS];
} snapshot;

FUZZ_CHECKER static void take_snapshot(const problem *p, snapshot *s)
{
    for (int c = 0; c < p->n; ++c) {
        s->tensors[c] = malloc(p->tensor_bytes[c]);
        memcpy(s->tensors[c], p->tensors[c].data, p->tensor_bytes[c]);
        s->lses[c] = malloc(p->rows * sizeof(float));
        memcpy(s->lses[c], p->lse_arrays[c], p->rows * sizeof(float));
    }
}

FUZZ_CHECKER static void check_inputs(const problem *p, const snapshot *s, const char *when)
{
    for (int c = 0; c < p->n; ++c)
        if (memcmp(s->tensors[c], p->tensors[c].data, p->tensor_bytes[c]) ||
            memcmp(s->lses[c], p->lse_arrays[c], p->rows * sizeof(float)))
            fail("%s wrote input %d (its tensor or lses)", when, c);
}

static void free_snapshot(const problem *p, snapshot *s)
{
    for (int c = 0; c < p->n; ++c) {
        free(s->tensors[c]);
        free(s->lses[c]);
    }
}

static void expect_failure(fa_status st, fa_status expected, const char *what, const problem *p, const snapshot *s)
{
    if (st != expected)
        fail("fa_merge_partials with %s returned %d (%s), expected %d", what, (int)st, st ? fa_last_error() : "no error",
             (int)expected);
    if (!fa_last_error()[0]) fail("fa_merge_partials with %s failed without a message", what);
    if (!all_ff(p->out.data, p->out_bytes) || !all_ff(p->lse_out, p->rows * sizeof(float)))
        fail("fa_merge_partials with %s failed (%s) but wrote out or lse_out", what, fa_last_error());
    check_inputs(p, s, "a failed fa_merge_partials");
}

/* 1 where out's bytes hold an element (the rest are gaps the merge must not write). */
FUZZ_CHECKER static void check_gaps(const problem *p)
{
    const size_t es = elem_size(p->dtype);
    uint8_t *used = calloc(p->out_bytes, 1);
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t s = 0; s < p->seqlen; ++s)
            for (int64_t h = 0; h < p->heads; ++h)
                memset(used + tensor_offset(&p->out, b, s, h, 0) * es, 1, (size_t)p->head_dim * es);
    const uint8_t *bytes = p->out.data;
    for (size_t i = 0; i < p->out_bytes; ++i)
        if (!used[i] && bytes[i] != 0xff) fail("fa_merge_partials wrote out's gap byte %zu", i);
    free(used);
}

/* Below this weight a part's NaN or inf may or may not reach the f32 sum (e^(lse - M) underflows in
 * f32 somewhere under 2^-126, and a part with weight 0 is not read): such an element is not checked.
 * Above it the part is surely read. */
#define SURELY_READ 0x1p-100

/* Each row against the merge in double. */
FUZZ_CHECKER static void check_against_reference(const problem *p)
{
    const fa_tensor *out = &p->out;
    double w[MAX_PARTS];
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t h = 0; h < p->heads; ++h)
            for (int64_t s = 0; s < p->seqlen; ++s) {
                const size_t row = (size_t)((b * p->heads + h) * p->seqlen + s);
                int poisoned = 0;
                double top = -INFINITY;
                for (int c = 0; c < p->n; ++c) {
                    const double lse = p->lse_arrays[p->lse_of[c]][row];
                    if (isnan(lse) || lse == INFINITY) poisoned = 1;
                    else if (lse > top) top = lse;
                }
                const double got_lse = p->lse_out_given ? p->lse_out[row] : 0.0;
                if (poisoned || top == -INFINITY) {
                    /* A NaN or +inf lse: NaN out and lse. Every part -inf: zeros and lse -inf. */
                    for (int64_t x = 0; x < p->head_dim; ++x) {
                        const double got = tensor_get(out, tensor_offset(out, b, s, h, x));
                        if (poisoned ? !isnan(got) : got != 0.0)
                            fail("row %zu (b %lld h %lld s %lld) element %lld: %.9g, expected %s (%s)", row, (long long)b,
                                 (long long)h, (long long)s, (long long)x, got, poisoned ? "NaN" : "0",
                                 poisoned ? "a part's lse is NaN or +inf" : "every part's lse is -inf");
                    }
                    if (p->lse_out_given && (poisoned ? !isnan(got_lse) : got_lse != -INFINITY))
                        fail("row %zu: lse_out %.9g, expected %s", row, got_lse, poisoned ? "NaN" : "-inf");
                    continue;
                }
                double sum = 0.0, magnitude = 0.0;
                for (int c = 0; c < p->n; ++c) {
                    const double lse = p->lse_arrays[p->lse_of[c]][row];
                    w[c] = lse == -INFINITY ? 0.0 : exp(lse - top);
                    sum += w[c];
                }
                for (int c = 0; c < p->n; ++c) {
                    const fa_tensor *t = &p->tensors[p->tensor_of[c]];
                    for (int64_t x = 0; x < p->head_dim && w[c] > 0.0; ++x) {
                        const double v = tensor_get(t, tensor_offset(t, b, s, h, x));
                        if (isfinite(v) && fabs(v) > magnitude) magnitude = fabs(v);
                    }
                }
                /* f32 weights e^(lse - M) carry about |lse - M| eps, but weighted by e^(lse - M) <= 1/e that
                 * stays below one eps per part; with the n sums, the division and the product 64 eps covers
                 * 8 parts: fuzz_common's tolerance with no score term. */
                const double tol = tolerance(p->dtype, magnitude, 0.0);
                for (int64_t x = 0; x < p->head_dim; ++x) {
                    double acc = 0.0;
                    int unsure = 0;
                    for (int c = 0; c < p->n; ++c) {
                        if (w[c] == 0.0) continue; /* lse -inf: not read */
                        const fa_tensor *t = &p->tensors[p->tensor_of[c]];
                        const double v = tensor_get(t, tensor_offset(t, b, s, h, x));
                        if (!isfinite(v) && w[c] < SURELY_READ) unsure = 1;
                        acc += w[c] * v;
                    }
                    if (unsure) continue;
                    const double want = acc / sum, got = tensor_get(out, tensor_offset(out, b, s, h, x));
                    if (isnan(want) ? !isnan(got) : isinf(want) ? got != want : !(fabs(got - want) <= tol))
                        fail("row %zu (b %lld h %lld s %lld) element %lld: %.9g, expected %.9g (tolerance %.3g)", row,
                             (long long)b, (long long)h, (long long)s, (long long)x, got, want, tol);
                }
                if (p->lse_out_given) {
                    /* M + logf(sum) in f32: the rounding of the result and a few eps of the sum. */
                    const double want = top + log(sum), lse_tol = 0x1p-23 * fabs(want) + 64.0 * 0x1p-24;
                    if (!(fabs(got_lse - want) <= lse_tol))
                        fail("row %zu: lse_out %.9g, expected %.9g (tolerance %.3g)", row, got_lse, want, lse_tol);
                }
            }
}

/* Element bytes of out equal between two runs (gaps are not compared). */
FUZZ_CHECKER static int same_elements(const problem *p, const uint8_t *first)
{
    const size_t es = elem_size(p->dtype);
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t s = 0; s < p->seqlen; ++s)
            for (int64_t h = 0; h < p->heads; ++h) {
                const size_t o = tensor_offset(&p->out, b, s, h, 0) * es;
                if (memcmp(first + o, (const uint8_t *)p->out.data + o, (size_t)p->head_dim * es)) return 0;
            }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    const uint8_t flags = next(&r), corruption = next(&r);
    problem p;
    memset(&p, 0, sizeof p);
    decode(&r, &p, flags);
    call_args a;
    plain_args(&p, &a);
    const uint8_t variant = flags & F_CORRUPT ? next(&r) : 0;
    if (flags & F_CORRUPT) a.lse_out = p.lse_out; /* the overlap corruptions need it; NULL is valid anyway */
    const int corrupted = flags & F_CORRUPT ? corrupt(&p, &a, corruption, variant) : -1;
    if (getenv("FUZZ_VERBOSE")) {
        describe(&p, flags, corrupted, variant);
        fprintf(stderr, "  input: %zu bytes, %zu decoded (0 past its end)\n", r.size, r.pos);
    }
    memset(p.out.data, 0xff, p.out_bytes);
    memset(p.lse_out, 0xff, p.rows * sizeof(float));
    snapshot snap;
    take_snapshot(&p, &snap);

    if (corrupted >= 0) {
        expect_failure(call(&a), FA_ERROR_INVALID_VALUE, corruption_names[corrupted], &p, &snap);
        free_snapshot(&p, &snap);
        free_problem(&p);
        return 0;
    }
    if (p.alloc_fault) {
        fa_debug_fail_allocation(p.alloc_fault);
        const fa_status st = call(&a);
        const size_t allocations = fa_debug_fail_allocation(0);
        if (p.alloc_fault <= allocations) expect_failure(st, FA_ERROR_OUT_OF_MEMORY, "a failed allocation", &p, &snap);
        else if (st != FA_SUCCESS) fail("fa_merge_partials failed on a valid problem: %s", fa_last_error());
        memset(p.out.data, 0xff, p.out_bytes);
        memset(p.lse_out, 0xff, p.rows * sizeof(float));
    }
    fa_status st = call(&a);
    if (st != FA_SUCCESS) fail("fa_merge_partials failed on a valid problem: %s", fa_last_error());
    check_inputs(&p, &snap, "fa_merge_partials");
    check_gaps(&p);
    if (!p.lse_out_given && !all_ff(p.lse_out, p.rows * sizeof(float))) fail("lse_out NULL, but an lse was written");
    check_against_reference(&p);

    /* The same call with two threads, over zeroed outputs: the same bytes in every element. */
    uint8_t *out1 = malloc(p.out_bytes);
    float *lse1 = malloc(p.rows * sizeof(float));
    memcpy(out1, p.out.data, p.out_bytes);
    memcpy(lse1, p.lse_out, p.rows * sizeof(float));
    memset(p.out.data, 0, p.out_bytes);
    if (p.lse_out_given) memset(p.lse_out, 0, p.rows * sizeof(float));
    if (fa_context_set_num_threads(a.ctx, 2) != FA_SUCCESS) fail("fa_context_set_num_threads(2): %s", fa_last_error());
    st = call(&a);
    fa_context_set_num_threads(a.ctx, 1);
    if (st != FA_SUCCESS) fail("the second call (2 threads) failed: %s", fa_last_error());
    if (!same_elements(&p, out1) || memcmp(lse1, p.lse_out, p.rows * sizeof(float)))
        fail("out or lse_out differ between 1 and 2 threads");
    check_inputs(&p, &snap, "fa_merge_partials (2 threads)");
    free(out1);
    free(lse1);
    free_snapshot(&p, &snap);
    free_problem(&p);
    return 0;
}

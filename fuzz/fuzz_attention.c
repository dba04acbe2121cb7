/* libFuzzer target: decodes its input into one attention problem (shape, strides, dtype, masks,
 * dropout, scale, data), runs fa_forward and fa_backward on the CPU backend and checks
 *  - the status is FA_SUCCESS, or the documented error for what the input asked for
 *    (FA_ERROR_INVALID_VALUE for a corrupted argument, FA_ERROR_OUT_OF_MEMORY for an injected
 *    allocation failure), with a message;
 *  - a failed call wrote no output;
 *  - on success, out, lse, dq, dk and dv match the double-precision oracle (tests/oracle.h).
 * Trailing bytes (after the problem) switch on the block positions (q_offset, k_offset, global
 * lengths) and the score modifiers (softcap, ALiBi, sinks, bias); fa_backward_ex's dsinks and dbias
 * are then checked against the oracle too.
 * Buffers are allocated to their exact extent, so AddressSanitizer sees any out-of-bounds access.
 * Input layout: fuzz/README.md. Build and run: scripts/ci-fuzz.sh. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/dtype.h"
#include "common/half.h"
#include "flashattn.h"
#include "oracle.h"

#define FUZZ_TARGET "fuzz_attention"
#include "fuzz_common.h"

enum flags {
    F_CAUSAL = 1, F_WINDOW = 2, F_PADDING = 4, F_DROPOUT = 8, F_BLOCK_MASK = 16, F_STRIDED = 32, F_SCALE = 64,
    F_CORRUPT = 128
};

/* The extras byte, read after everything else so that older inputs decode as before. */
enum extras { X_POSITIONS = 1, X_SOFTCAP = 2, X_ALIBI = 4, X_ALIBI_PER_BATCH = 8, X_SINKS = 16, X_BIAS = 32 };

typedef struct problem {
    oracle_shape s;
    fa_dtype dtype;
    fa_attention_desc desc;
    int32_t seqlens[4];
    fa_block_mask block_mask;
    uint8_t mask_bits[48 * 48];
    fa_tensor q, k, v, out, dout, dq, dk, dv;
    float *lse;
    double amplitude;
    uint64_t value_seed;
    float slopes[3 * 9], sinks[9], dsinks[9];
    fa_bias bias, dbias;
    size_t bias_elements;          /* of bias and of dbias (same packed layout) */
    double modifier_max;           /* bound on |ALiBi| + |bias| + |sink|, for the tolerances */
    int64_t tile_bytes;            /* the CPU's tile budget, 0: the L2's */
} problem;

/* Explicit strides with gaps, or a [batch, heads, seqlen, head_dim] layout; exact-size buffer. */
static void make_tensor(reader *r, int strided, fa_tensor *t, fa_dtype dtype, int64_t batch, int64_t seqlen,
                        int64_t heads, int64_t d)
{
    *t = (fa_tensor){NULL, dtype, batch, seqlen, heads, d, 0, 0, 0};
    int64_t last = batch * seqlen * heads * d; /* one past the largest element offset */
    if (strided) last = set_gapped_strides(t, next(r));
    t->data = malloc((size_t)last * (dtype == FA_DTYPE_F32 ? 4 : 2));
}

static size_t elements(const fa_tensor *t) { return (size_t)(t->batch * t->seqlen * t->heads * t->head_dim); }

/* Packed double copy of a tensor (the oracle's layout), and the largest magnitude. */
FUZZ_CHECKER static double *to_doubles(const fa_tensor *t, double *max_abs)
{
    double *x = malloc(elements(t) * sizeof *x);
    size_t n = 0;
    for (int64_t b = 0; b < t->batch; ++b)
        for (int64_t i = 0; i < t->seqlen; ++i)
            for (int64_t h = 0; h < t->heads; ++h)
                for (int64_t c = 0; c < t->head_dim; ++c) {
                    x[n] = tensor_get(t, tensor_offset(t, b, i, h, c));
                    if (max_abs && fabs(x[n]) > *max_abs) *max_abs = fabs(x[n]);
                    ++n;
                }
    return x;
}

FUZZ_CHECKER static void fill(fa_tensor *t, uint64_t *rng, double amplitude)
{
    for (int64_t b = 0; b < t->batch; ++b)
        for (int64_t i = 0; i < t->seqlen; ++i)
            for (int64_t h = 0; h < t->heads; ++h)
                for (int64_t c = 0; c < t->head_dim; ++c) {
                    const double u = (double)(splitmix(rng) >> 11) * 0x1p-53 * 2.0 - 1.0;
                    tensor_set(t, tensor_offset(t, b, i, h, c), (float)(u * amplitude));
                }
}

FUZZ_CHECKER static void poison(fa_tensor *t)
{
    /* 0xff bytes: a NaN in every dtype, never produced from finite inputs. */
    const int64_t last = tensor_offset(t, t->batch - 1, t->seqlen - 1, t->heads - 1, t->head_dim);
    memset(t->data, 0xff, (size_t)last * (t->dtype == FA_DTYPE_F32 ? 4 : 2));
}

FUZZ_CHECKER static int untouched(const fa_tensor *t)
{
    const int64_t last = tensor_offset(t, t->batch - 1, t->seqlen - 1, t->heads - 1, t->head_dim);
    return all_ff(t->data, (size_t)last * (t->dtype == FA_DTYPE_F32 ? 4 : 2));
}

/* A bias over [batch, heads_q, seqlen_q, seqlen_k], packed, broadcast along the axes whose bit is
 * set in `broadcast` (1 batch, 2 heads, 4 rows): the layout oracle_dbias_shape gives its dbias. */
static void make_bias(fa_bias *bias, fa_dtype dtype, const oracle_shape *s, uint8_t broadcast, size_t *count)
{
    const int64_t rows = broadcast & 4 ? 1 : s->seqlen_q, heads = broadcast & 2 ? 1 : s->heads_q;
    const int64_t batches = broadcast & 1 ? 1 : s->batch;
    *bias = (fa_bias){NULL, dtype, broadcast & 1 ? 0 : heads * rows * s->seqlen_k,
                      broadcast & 2 ? 0 : rows * s->seqlen_k, broadcast & 4 ? 0 : s->seqlen_k};
    *count = (size_t)(batches * heads * rows * s->seqlen_k);
    bias->data = malloc(*count * fa_dtype_size(dtype));
}

static void decode_extras(reader *r, problem *p, uint64_t *rng)
{
    const uint8_t extras = next(r);
    const oracle_shape *s = &p->s;
    fa_attention_desc *desc = &p->desc;
    if (extras & X_POSITIONS) {
        /* This problem as a block of a larger one: both offsets and both global lengths vary. */
        desc->q_offset = next(r) % 9;
        desc->k_offset = next(r) % 9;
        desc->seqlen_q_global = desc->q_offset + s->seqlen_q + next(r) % 9;
        desc->seqlen_k_global = desc->k_offset + s->seqlen_k + next(r) % 9;
    }
    if (extras & X_SOFTCAP) desc->softcap = 0.5f + (float)(next(r) % 64) * 0.25f;
    if (extras & X_ALIBI) {
        desc->alibi_per_batch = (extras & X_ALIBI_PER_BATCH) != 0;
        const int64_t n = (desc->alibi_per_batch ? s->batch : 1) * s->heads_q;
        float max_slope = 0.0f;
        for (int64_t x = 0; x < n; ++x) {
            p->slopes[x] = (float)(next(r) % 65) / 64.0f;
            max_slope = p->slopes[x] > max_slope ? p->slopes[x] : max_slope;
        }
        desc->alibi_slopes = p->slopes;
        const int64_t reach = (desc->seqlen_q_global ? desc->seqlen_q_global : s->seqlen_q) +
                              (desc->seqlen_k_global ? desc->seqlen_k_global : s->seqlen_k);
        p->modifier_max += (double)max_slope * (double)reach;
    }
    if (extras & X_SINKS) {
        desc->sinks = p->sinks;
        p->modifier_max += decode_sinks(r, s->heads_q, p->sinks);
    }
    if (extras & X_BIAS) {
        const fa_dtype dtype = (fa_dtype)(next(r) % 3);
        const uint8_t broadcast = next(r) & 7;
        const double amplitude = 0.25 * (double)(1 + next(r) % 16);
        make_bias(&p->bias, dtype, s, broadcast, &p->bias_elements);
        make_bias(&p->dbias, FA_DTYPE_F32, s, broadcast, &p->bias_elements);
        for (size_t x = 0; x < p->bias_elements; ++x) {
            const double u = (double)(splitmix(rng) >> 11) * 0x1p-53 * 2.0 - 1.0;
            const float value = (float)(u * amplitude);
            if (dtype == FA_DTYPE_F32) ((float *)p->bias.data)[x] = value;
            else ((uint16_t *)p->bias.data)[x] = dtype == FA_DTYPE_F16 ? fa_f32_to_f16(value) : fa_f32_to_bf16(value);
        }
        desc->bias = &p->bias;
        p->modifier_max += amplitude;
    }
}

static void decode(reader *r, problem *p, uint8_t flags)
{
    p->dtype = (fa_dtype)(next(r) % 3);
    p->s.batch = 1 + next(r) % 3;
    p->s.heads_kv = 1 + next(r) % 3;
    p->s.heads_q = p->s.heads_kv * (1 + next(r) % 3);
    p->s.seqlen_q = 1 + next(r) % 48;
    p->s.seqlen_k = 1 + next(r) % 48;
    const uint8_t d = next(r);
    p->s.head_dim = d < 224 ? 1 + d % 40 : 33 + (d - 224) * 2; /* a few larger head dims, up to 95 */
    p->s.head_dim = fuzz_capped_head_dim(p->s.head_dim, p->s.batch * p->s.seqlen_q * p->s.seqlen_k, p->s.heads_q);
    fa_attention_desc_init(&p->desc);
    p->desc.causal = (flags & F_CAUSAL) != 0;
    if (flags & F_WINDOW) {
        p->desc.window_left = (int32_t)(next(r) % (p->s.seqlen_k + 2)) - 1;
        p->desc.window_right = (int32_t)(next(r) % (p->s.seqlen_k + 2)) - 1;
    }
    if (flags & F_PADDING) {
        for (int64_t b = 0; b < p->s.batch; ++b) p->seqlens[b] = (int32_t)(next(r) % (p->s.seqlen_k + 1));
        p->desc.seqlens_k = p->seqlens;
    }
    if (flags & F_DROPOUT) {
        p->desc.dropout_p = (float)(next(r) % 230) / 256.0f;
        p->desc.dropout_seed = next_u64(r);
        p->desc.dropout_offset = next_u64(r);
    }
    if (flags & F_BLOCK_MASK) {
        fa_block_mask *bm = &p->block_mask;
        bm->block_q = 1 + next(r) % 16;
        bm->block_k = 1 + next(r) % 16;
        bm->rows = (p->s.seqlen_q + bm->block_q - 1) / bm->block_q;
        bm->cols = (p->s.seqlen_k + bm->block_k - 1) / bm->block_k;
        const uint8_t density = next(r);
        for (int64_t x = 0; x < bm->rows * bm->cols; ++x) p->mask_bits[x] = next(r) < density;
        bm->mask = p->mask_bits;
        p->desc.block_mask = bm;
    }
    if (flags & F_SCALE) p->desc.softmax_scale = (float)((int)next(r) - 128) / 32.0f;
    p->amplitude = 0.25 * (double)(1 + next(r) % 12); /* up to 3: scores reach a few hundred */
    p->value_seed = next_u64(r);
    const int strided = (flags & F_STRIDED) != 0;
    const oracle_shape *s = &p->s;
    make_tensor(r, strided, &p->q, p->dtype, s->batch, s->seqlen_q, s->heads_q, s->head_dim);
    make_tensor(r, strided, &p->k, p->dtype, s->batch, s->seqlen_k, s->heads_kv, s->head_dim);
    make_tensor(r, strided, &p->v, p->dtype, s->batch, s->seqlen_k, s->heads_kv, s->head_dim);
    make_tensor(r, strided, &p->out, p->dtype, s->batch, s->seqlen_q, s->heads_q, s->head_dim);
    make_tensor(r, strided, &p->dout, p->dtype, s->batch, s->seqlen_q, s->heads_q, s->head_dim);
    make_tensor(r, strided, &p->dq, p->dtype, s->batch, s->seqlen_q, s->heads_q, s->head_dim);
    make_tensor(r, strided, &p->dk, p->dtype, s->batch, s->seqlen_k, s->heads_kv, s->head_dim);
    make_tensor(r, strided, &p->dv, p->dtype, s->batch, s->seqlen_k, s->heads_kv, s->head_dim);
    p->lse = malloc((size_t)(s->batch * s->heads_q * s->seqlen_q) * sizeof(float));
    uint64_t rng = p->value_seed;
    fill(&p->q, &rng, p->amplitude);
    fill(&p->k, &rng, p->amplitude);
    fill(&p->v, &rng, p->amplitude);
    fill(&p->dout, &rng, 1.0);
    decode_extras(r, p, &rng);
    p->tile_bytes = decode_tile_bytes(r);
}

/* FUZZ_VERBOSE=1: print the decoded problem, to turn a crash input into a readable reproducer. */
static void describe(const problem *p, uint8_t flags, uint8_t corruption, uint8_t alloc_fault)
{
    static const char *const dtypes[] = {"f32", "f16", "bf16"};
    const oracle_shape *s = &p->s;
    fprintf(stderr,
            "problem: %s batch %lld heads_q %lld heads_kv %lld seqlen_q %lld seqlen_k %lld head_dim %lld\n"
            "  causal %d window (%d, %d) padding %s dropout %g block_mask %s scale %g amplitude %g strided %d\n"
            "  corrupt %s (mode %u) alloc_fault %u\n"
            "  positions q %lld/%lld k %lld/%lld softcap %g alibi %s%s sinks %s bias %s\n",
            dtypes[p->dtype], (long long)s->batch, (long long)s->heads_q, (long long)s->heads_kv,
            (long long)s->seqlen_q, (long long)s->seqlen_k, (long long)s->head_dim, p->desc.causal,
            p->desc.window_left, p->desc.window_right, p->desc.seqlens_k ? "yes" : "no", (double)p->desc.dropout_p,
            p->desc.block_mask ? "yes" : "no", (double)p->desc.softmax_scale, p->amplitude, (flags & F_STRIDED) != 0,
            flags & F_CORRUPT ? "yes" : "no", (unsigned)(corruption % 10), (unsigned)alloc_fault,
            (long long)p->desc.q_offset, (long long)p->desc.seqlen_q_global, (long long)p->desc.k_offset,
            (long long)p->desc.seqlen_k_global, (double)p->desc.softcap, p->desc.alibi_slopes ? "yes" : "no",
            p->desc.alibi_per_batch ? " (per batch)" : "", p->desc.sinks ? "yes" : "no",
            p->desc.bias ? dtypes[p->bias.dtype] : "no");
    fprintf(stderr, "  cpu tile budget %lld bytes%s\n", (long long)p->tile_bytes, p->tile_bytes ? "" : " (the L2's)");
}

static void free_problem(problem *p)
{
    fa_tensor *ts[] = {&p->q, &p->k, &p->v, &p->out, &p->dout, &p->dq, &p->dk, &p->dv}; /* data never corrupted */
    for (size_t i = 0; i < 8; ++i) free(ts[i]->data);
    free(p->lse);
    free(p->bias.data);
    free(p->dbias.data);
}

/* Breaks one argument in a way the documentation says is invalid. */
static void corrupt(problem *p, uint8_t which)
{
    switch (which % 10) {
    case 0: p->q.seqlen = -(int64_t)p->q.seqlen; break;
    case 1: p->k.stride_batch = 1; p->k.stride_seq = 0; p->k.stride_head = 0; break;
    case 2: p->desc.dropout_p = 1.0f; break;
    case 3: p->seqlens[0] = (int32_t)p->s.seqlen_k + 1; p->desc.seqlens_k = p->seqlens; break;
    case 4: p->k.heads = p->v.heads = p->s.heads_q + 1; break;
    case 5: p->desc.window_right = -2; break;
    case 6: p->block_mask = (fa_block_mask){4, 4, 1000, 1, p->mask_bits}; p->desc.block_mask = &p->block_mask; break;
    case 7: p->v.dtype = (fa_dtype)((p->v.dtype + 1) % 3); break;
    case 8: p->desc.softmax_scale = NAN; break;
    default: p->out.head_dim += 1; break;
    }
}

static void report(const char *what, double err, double tol)
{
    fprintf(stderr, "fuzz_attention: %s error %.3g exceeds tolerance %.3g\n", what, err, tol);
    abort();
}

/* Max abs difference between a tensor and the oracle's packed doubles. */
FUZZ_CHECKER static double max_error(const fa_tensor *t, const double *want)
{
    double *got = to_doubles(t, NULL), err = 0.0;
    for (size_t i = 0; i < elements(t); ++i) {
        const double e = fabs(got[i] - want[i]);
        if (!(e <= err)) err = e; /* NaN counts as an infinite error */
    }
    free(got);
    return err;
}

FUZZ_CHECKER static double max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

FUZZ_CHECKER static void check_against_oracle(problem *p, int backward)
{
    const oracle_shape *s = &p->s;
    double vmax = 0.0, qmax = 0.0, kmax = 0.0;
    double *q = to_doubles(&p->q, &qmax), *k = to_doubles(&p->k, &kmax), *v = to_doubles(&p->v, &vmax);
    const size_t nq = elements(&p->q), nk = elements(&p->k), rows = (size_t)(s->batch * s->heads_q * s->seqlen_q);
    double *out = malloc(nq * sizeof *out), *lse = malloc(rows * sizeof *lse);
    oracle_forward(s, &p->desc, q, k, v, out, lse);
    const double scale = p->desc.softmax_scale != 0.0f ? p->desc.softmax_scale : 1.0 / sqrt((double)s->head_dim);
    const double score_max = fabs(scale) * qmax * kmax * (double)s->head_dim + p->modifier_max;
    const double keep = p->desc.dropout_p > 0.0f ? 1.0 / (1.0 - p->desc.dropout_p) : 1.0;
    if (!backward) {
        const double tol = tolerance(p->dtype, vmax * keep, score_max);
        const double err = max_error(&p->out, out);
        if (!(err <= tol)) report("out", err, tol);
        for (size_t i = 0; i < rows; ++i) {
            const double got = p->lse[i];
            if (isinf(lse[i]) ? got != lse[i] : !(fabs(got - lse[i]) <= 1e-5 * (1.0 + score_max)))
                report("lse", fabs(got - lse[i]), 1e-5 * (1.0 + score_max));
        }
    } else {
        double dout_max = 0.0;
        double *dout = to_doubles(&p->dout, &dout_max);
        double *dq = malloc(nq * sizeof *dq), *dk = malloc(nk * sizeof *dk), *dv = malloc(nk * sizeof *dv);
        double dsinks[9], *dbias = p->desc.bias ? malloc(p->bias_elements * sizeof *dbias) : NULL;
        oracle_backward_ex(s, &p->desc, q, k, v, dout, dq, dk, dv, p->desc.sinks ? dsinks : NULL, dbias);
        /* The backend gets O as stored in the dtype, the oracle recomputes it exactly: the error of
         * D = rowsum(dO o O) is up to d |dO| |O| u (|O| <= |V| / (1 - p)). Through dS = P o (dP - D)
         * it reaches dQ_i = tau sum_j dS_ij K_j weighted by sum_j P_ij <= 1, and dK_j, which sums
         * over every query row of its GQA group (sum_i P_ij <= group * seqlen_q). */
        const double delta_err = storage_error(p->dtype) * (double)s->head_dim * dout_max * vmax * keep;
        const double group_rows = (double)(s->heads_q / s->heads_kv) * (double)s->seqlen_q;
        const double dq_tol = tolerance(p->dtype, max_abs(dq, nq), score_max) + fabs(scale) * kmax * keep * delta_err;
        const double dk_tol =
            tolerance(p->dtype, max_abs(dk, nk), score_max) + fabs(scale) * qmax * keep * group_rows * delta_err;
        const double dv_tol = tolerance(p->dtype, max_abs(dv, nk), score_max);
        double err;
        if (!((err = max_error(&p->dq, dq)) <= dq_tol)) report("dq", err, dq_tol);
        if (!((err = max_error(&p->dk, dk)) <= dk_tol)) report("dk", err, dk_tol);
        if (!((err = max_error(&p->dv, dv)) <= dv_tol)) report("dv", err, dv_tol);
        /* dsinks and dbias sum dS-sized terms (|dS| <= P (|dP| + |D|), |dP|, |D| <= d |dO| |V| / (1 - p))
         * over the rows (and the bias's broadcast axes): each term carries the error of dP and D. */
        const double ds_max = 2.0 * (double)s->head_dim * dout_max * vmax * keep;
        const double term_tol = tolerance(p->dtype, ds_max, score_max) + delta_err;
        if (p->desc.sinks) {
            const double sink_tol = (double)(s->batch * s->seqlen_q) * term_tol;
            for (int64_t h = 0; h < s->heads_q; ++h)
                if (!((err = fabs((double)p->dsinks[h] - dsinks[h])) <= sink_tol)) report("dsinks", err, sink_tol);
        }
        if (dbias) {
            const double summed = (double)((p->bias.stride_batch ? 1 : s->batch) * (p->bias.stride_head ? 1 : s->heads_q) *
                                           (p->bias.stride_q ? 1 : s->seqlen_q));
            const double bias_tol = summed * term_tol;
            const float *got = p->dbias.data;
            for (size_t x = 0; x < p->bias_elements; ++x)
                if (!((err = fabs((double)got[x] - dbias[x])) <= bias_tol)) report("dbias", err, bias_tol);
        }
        free(dbias);
        free(dout);
        free(dq);
        free(dk);
        free(dv);
    }
    free(q);
    free(k);
    free(v);
    free(out);
    free(lse);
}

static void expect_failure(fa_status st, fa_status expected, const char *call, int outputs_untouched)
{
    if (st != expected) {
        fprintf(stderr, "fuzz_attention: %s returned %d (%s), expected %d\n", call, (int)st, fa_last_error(), (int)expected);
        abort();
    }
    if (!fa_last_error()[0]) {
        fprintf(stderr, "fuzz_attention: %s failed without a message\n", call);
        abort();
    }
    if (!outputs_untouched) {
        fprintf(stderr, "fuzz_attention: %s failed but wrote outputs\n", call);
        abort();
    }
}

static int modifier_grads_untouched(const problem *p)
{
    return (!p->desc.sinks || all_ff(p->dsinks, sizeof p->dsinks)) &&
           (!p->desc.bias || all_ff(p->dbias.data, p->bias_elements * sizeof(float)));
}

/* fa_backward, or fa_backward_ex with dsinks/dbias (poisoned first) when the desc has sinks or a bias. */
static fa_status backward(fa_context *ctx, problem *p)
{
    if (!p->desc.sinks && !p->desc.bias)
        return settled(ctx, fa_backward(ctx, &p->desc, &p->q, &p->k, &p->v, &p->out, &p->dout, p->lse, &p->dq, &p->dk, &p->dv));
    memset(p->dsinks, 0xff, sizeof p->dsinks);
    if (p->desc.bias) memset(p->dbias.data, 0xff, p->bias_elements * sizeof(float));
    return settled(ctx, fa_backward_ex(ctx, &p->desc, &p->q, &p->k, &p->v, &p->out, &p->dout, p->lse, &p->dq, &p->dk,
                                       &p->dv, p->desc.sinks ? p->dsinks : NULL, p->desc.bias ? &p->dbias : NULL));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    const uint8_t flags = next(&r), corruption = next(&r), alloc_fault = next(&r);
    problem p;
    memset(&p, 0, sizeof p);
    decode(&r, &p, flags);
    if (getenv("FUZZ_VERBOSE")) {
        describe(&p, flags, corruption, alloc_fault);
        fprintf(stderr, "  input: %zu bytes, %zu decoded (0 past its end)\n", r.size, r.pos);
    }
    fa_context *ctx = context();
    fa_cpu_debug_tile_bytes(p.tile_bytes);
    poison(&p.out);
    memset(p.lse, 0xff, (size_t)(p.s.batch * p.s.heads_q * p.s.seqlen_q) * sizeof(float));
    const fa_tensor out_as_allocated = p.out; /* corruption may change out's shape */
    if (flags & F_CORRUPT) corrupt(&p, corruption);
    /* alloc_fault 1..4: fail that allocation of the forward (and, separately, of the backward). */
    const size_t fail_at = alloc_fault >= 1 && alloc_fault <= 4 ? alloc_fault : 0;

    fa_debug_fail_allocation(fail_at);
    fa_status st = settled(ctx, fa_forward(ctx, &p.desc, &p.q, &p.k, &p.v, &p.out, p.lse));
    const size_t forward_allocations = fa_debug_fail_allocation(0);
    if (flags & F_CORRUPT) {
        expect_failure(st, FA_ERROR_INVALID_VALUE, "fa_forward", untouched(&out_as_allocated));
    } else if (fail_at && fail_at <= forward_allocations) {
        expect_failure(st, FA_ERROR_OUT_OF_MEMORY, "fa_forward", 1);
        st = settled(ctx, fa_forward(ctx, &p.desc, &p.q, &p.k, &p.v, &p.out, p.lse)); /* must work again */
    }
    if (!(flags & F_CORRUPT) && refusal_allowed(st)) {
        expect_failure(st, FA_ERROR_NOT_SUPPORTED, "fa_forward", untouched(&p.out));
        free_problem(&p);
        return 0;
    }
    if (!(flags & F_CORRUPT)) {
        if (st != FA_SUCCESS) {
            fprintf(stderr, "fuzz_attention: fa_forward failed on a valid problem: %s\n", fa_last_error());
            abort();
        }
        check_against_oracle(&p, 0);
    }

    poison(&p.dq);
    poison(&p.dk);
    poison(&p.dv);
    fa_debug_fail_allocation(fail_at);
    st = backward(ctx, &p);
    const size_t backward_allocations = fa_debug_fail_allocation(0);
    if (flags & F_CORRUPT) {
        expect_failure(st, FA_ERROR_INVALID_VALUE, "fa_backward", untouched(&p.dq) && untouched(&p.dk) && untouched(&p.dv) &&
                                                                  modifier_grads_untouched(&p));
    } else {
        if (fail_at && fail_at <= backward_allocations) {
            expect_failure(st, FA_ERROR_OUT_OF_MEMORY, "fa_backward", 1);
            st = backward(ctx, &p);
        }
        if (refusal_allowed(st)) {
            expect_failure(st, FA_ERROR_NOT_SUPPORTED, "fa_backward",
                           untouched(&p.dq) && untouched(&p.dk) && untouched(&p.dv) && modifier_grads_untouched(&p));
            free_problem(&p);
            return 0;
        }
        if (st != FA_SUCCESS) {
            fprintf(stderr, "fuzz_attention: fa_backward failed on a valid problem: %s\n", fa_last_error());
            abort();
        }
        check_against_oracle(&p, 1);
    }
    free_problem(&p);
    return 0;
}

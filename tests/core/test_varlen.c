/* Packed variable-length batches (desc->varlen) on the CPU backend, forward and backward, against
 * per-sequence oracle runs: empty sequences, length 1, lengths straddling tiles, GQA, causal and
 * window (bottom-right per sequence), block masks per sequence, strided tensors, loose
 * max_seqlen bounds. Dropout draws the padded layout's element, so those cases are checked
 * against the oracle on the padded batch and against the library's own padded run. Every case
 * is also run with 1 and 2 threads (bit-identical). Bad varlen arguments: status, message,
 * nothing written. Score modifiers on a packed batch (per-sequence slopes and bias blocks, a bias
 * shared by the sequences, sinks) against the same per-sequence oracle runs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flashattn.h"
#include "oracle.h"
#include "test_arrays.h"

#define MAX_SEQS 6
#define OUT_TOL 2e-5  /* f32 forward, relative to max(1, max |ref|) */
#define GRAD_TOL 2e-4 /* f32 backward */

typedef struct varlen_case {
    const char *name;
    int64_t batch, heads_q, heads_kv, head_dim;
    int32_t len_q[MAX_SEQS], len_k[MAX_SEQS];
    int causal;
    int32_t window_left, window_right;
    float dropout_p;
    int32_t block_q, block_k; /* 0: no block mask */
    int strided;              /* tensors with gaps between heads and rows */
    int64_t loose;            /* added to max_seqlen_q/k: bounds need not be tight */
} varlen_case;

static const varlen_case cases[] = {
    {"causal_gqa_tiles", 5, 4, 2, 32, {0, 1, 37, 130, 200}, {0, 1, 37, 130, 200}, 1, -1, -1, 0, 0, 0, 0, 0},
    {"cross_window_empty", 4, 2, 1, 64, {3, 0, 70, 17}, {10, 5, 70, 0}, 1, 8, 2, 0, 0, 0, 0, 0},
    {"block_mask_3x17", 3, 2, 2, 16, {20, 45, 1}, {33, 45, 60}, 0, -1, -1, 0, 3, 17, 0, 0},
    {"strided_loose_bounds", 3, 3, 3, 40, {65, 1, 129}, {129, 64, 2}, 0, 4, -1, 0, 0, 0, 1, 5},
    {"dropout_padded_identity", 4, 4, 2, 32, {7, 0, 50, 33}, {40, 9, 50, 1}, 0, -1, -1, 0.3f, 0, 0, 0, 0},
    {"dropout_block_strided", 3, 2, 1, 24, {19, 64, 5}, {70, 3, 33}, 0, -1, -1, 0.5f, 16, 5, 1, 2},
};

/* A packed [1, rows, heads, d] f32 tensor in host memory, packed or with gaps. */
typedef struct host_tensor {
    fa_tensor t;
    float *data;
    size_t elements;
} host_tensor;

static void tensor_make(host_tensor *ht, int64_t rows, int64_t heads, int64_t d, int strided)
{
    memset(ht, 0, sizeof *ht);
    ht->t = (fa_tensor){NULL, FA_DTYPE_F32, 1, rows, heads, d, 0, 0, 0};
    if (strided) {
        ht->t.stride_head = d + 3;
        ht->t.stride_seq = heads * ht->t.stride_head + 5;
        ht->t.stride_batch = rows * ht->t.stride_seq + 7;
        ht->elements = (size_t)ht->t.stride_batch;
    } else {
        ht->elements = (size_t)(rows * heads * d);
    }
    ht->data = test_nan_floats(ht->elements);
    ht->t.data = ht->data;
}

static size_t element_at(const fa_tensor *t, int64_t row, int64_t h, int64_t x)
{
    if (t->stride_seq == 0) return (size_t)((row * t->heads + h) * t->head_dim + x);
    return (size_t)(row * t->stride_seq + h * t->stride_head + x);
}

static void tensor_fill(host_tensor *ht, const double *values)
{
    const fa_tensor *t = &ht->t;
    for (int64_t r = 0, n = 0; r < t->seqlen; ++r)
        for (int64_t h = 0; h < t->heads; ++h)
            for (int64_t x = 0; x < t->head_dim; ++x, ++n) ht->data[element_at(t, r, h, x)] = (float)values[n];
}

static float *tensor_packed(const host_tensor *ht)
{
    const fa_tensor *t = &ht->t;
    float *out = test_nan_floats((size_t)(t->seqlen * t->heads * t->head_dim));
    for (int64_t r = 0, n = 0; r < t->seqlen; ++r)
        for (int64_t h = 0; h < t->heads; ++h)
            for (int64_t x = 0; x < t->head_dim; ++x, ++n) out[n] = ht->data[element_at(t, r, h, x)];
    return out;
}

typedef struct varlen_run {
    int64_t total_q, total_k, max_q, max_k;
    int32_t cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1];
    fa_varlen varlen;
    fa_block_mask bm;
    uint8_t *mask;
    fa_attention_desc desc;
    double *q, *k, *v, *dout;
    host_tensor tq, tk, tv, tout, tdout, tdq, tdk, tdv;
    float *lse;
} varlen_run;

static void run_setup(varlen_run *r, const varlen_case *c)
{
    memset(r, 0, sizeof *r);
    for (int64_t b = 0; b < c->batch; ++b) {
        r->cu_q[b + 1] = r->cu_q[b] + c->len_q[b];
        r->cu_k[b + 1] = r->cu_k[b] + c->len_k[b];
        if (c->len_q[b] > r->max_q) r->max_q = c->len_q[b];
        if (c->len_k[b] > r->max_k) r->max_k = c->len_k[b];
    }
    r->max_q += c->loose;
    r->max_k += c->loose;
    r->total_q = r->cu_q[c->batch];
    r->total_k = r->cu_k[c->batch];
    r->varlen = (fa_varlen){c->batch, r->cu_q, r->cu_k, r->max_q, r->max_k};
    fa_attention_desc_init(&r->desc);
    r->desc.varlen = &r->varlen;
    r->desc.causal = c->causal;
    r->desc.window_left = c->window_left;
    r->desc.window_right = c->window_right;
    r->desc.dropout_p = c->dropout_p;
    r->desc.dropout_seed = 0x1234567890ABCDEFull;
    r->desc.dropout_offset = 77;
    if (c->block_q) {
        r->bm = (fa_block_mask){c->block_q, c->block_k, (r->max_q + c->block_q - 1) / c->block_q,
                                (r->max_k + c->block_k - 1) / c->block_k, NULL};
        r->mask = malloc((size_t)(r->bm.rows * r->bm.cols));
        assert_non_null(r->mask);
        for (int64_t i = 0; i < r->bm.rows * r->bm.cols; ++i) r->mask[i] = (i * 7 + i / 3) % 5 < 3;
        r->bm.mask = r->mask;
        r->desc.block_mask = &r->bm;
    }
    const size_t nq = (size_t)(r->total_q * c->heads_q * c->head_dim);
    const size_t nk = (size_t)(r->total_k * c->heads_kv * c->head_dim);
    r->q = test_random_doubles(1, nq);
    r->k = test_random_doubles(2, nk);
    r->v = test_random_doubles(3, nk);
    r->dout = test_random_doubles(4, nq);
    host_tensor *qs[] = {&r->tq, &r->tout, &r->tdout, &r->tdq}, *ks[] = {&r->tk, &r->tv, &r->tdk, &r->tdv};
    for (int i = 0; i < 4; ++i) {
        tensor_make(qs[i], r->total_q, c->heads_q, c->head_dim, c->strided);
        tensor_make(ks[i], r->total_k, c->heads_kv, c->head_dim, c->strided);
    }
    tensor_fill(&r->tq, r->q);
    tensor_fill(&r->tk, r->k);
    tensor_fill(&r->tv, r->v);
    tensor_fill(&r->tdout, r->dout);
    r->lse = test_nan_floats((size_t)(c->heads_q * r->total_q));
}

static void run_free(varlen_run *r)
{
    host_tensor *all[] = {&r->tq, &r->tk, &r->tv, &r->tout, &r->tdout, &r->tdq, &r->tdk, &r->tdv};
    for (int i = 0; i < 8; ++i) free(all[i]->data);
    free(r->q);
    free(r->k);
    free(r->v);
    free(r->dout);
    free(r->lse);
    free(r->mask);
}

static fa_status run_library(fa_context *ctx, varlen_run *r)
{
    fa_status st = fa_forward(ctx, &r->desc, &r->tq.t, &r->tk.t, &r->tv.t, &r->tout.t, r->lse);
    if (st == FA_SUCCESS)
        st = fa_backward(ctx, &r->desc, &r->tq.t, &r->tk.t, &r->tv.t, &r->tout.t, &r->tdout.t, r->lse, &r->tdq.t,
                         &r->tdk.t, &r->tdv.t);
    return st;
}

typedef struct reference {
    double *out, *lse, *dq, *dk, *dv;
} reference;

/* One oracle run per sequence on its slice of the packed arrays (the oracle's layout is the
 * packed [1, len, heads, d] layout itself). Sequences with no query or no key keep zeros and
 * lse = -inf. */
static void reference_per_sequence(const varlen_case *c, const varlen_run *r, reference *ref)
{
    fa_attention_desc d = r->desc;
    d.varlen = NULL;
    const int64_t hq = c->heads_q, hk = c->heads_kv, dim = c->head_dim;
    for (int64_t b = 0; b < c->batch; ++b) {
        const int64_t lq = c->len_q[b], lk = c->len_k[b];
        if (lq == 0 || lk == 0) continue;
        const oracle_shape s = {1, hq, hk, lq, lk, dim};
        const size_t qo = (size_t)(r->cu_q[b] * hq * dim), ko = (size_t)(r->cu_k[b] * hk * dim);
        double *lse = malloc((size_t)(hq * lq) * sizeof *lse);
        assert_non_null(lse);
        oracle_forward(&s, &d, r->q + qo, r->k + ko, r->v + ko, ref->out + qo, lse);
        for (int64_t h = 0; h < hq; ++h)
            for (int64_t i = 0; i < lq; ++i) ref->lse[h * r->total_q + r->cu_q[b] + i] = lse[h * lq + i];
        oracle_backward(&s, &d, r->q + qo, r->k + ko, r->v + ko, r->dout + qo, ref->dq + qo, ref->dk + ko,
                        ref->dv + ko);
        free(lse);
    }
}

/* The batch padded to [batch, max_q] / [batch, max_k] with seqlens_k: what a packed batch with
 * dropout must equal. Padded query rows get dO = 0, so they add nothing to dK and dV. */
typedef struct padded {
    oracle_shape s;
    int32_t seqlens[MAX_SEQS];
    double *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
} padded;

static double *pad(const double *packed, const int32_t *cu, int64_t batch, int64_t max_len, int64_t row)
{
    double *x = calloc((size_t)(batch * max_len * row), sizeof *x);
    assert_non_null(x);
    for (int64_t b = 0; b < batch; ++b)
        memcpy(x + b * max_len * row, packed + cu[b] * row, (size_t)((cu[b + 1] - cu[b]) * row) * sizeof *x);
    return x;
}

static void unpad(const double *x, const int32_t *cu, int64_t batch, int64_t max_len, int64_t row, double *packed)
{
    for (int64_t b = 0; b < batch; ++b)
        memcpy(packed + cu[b] * row, x + b * max_len * row, (size_t)((cu[b + 1] - cu[b]) * row) * sizeof *x);
}

static void padded_make(const varlen_case *c, const varlen_run *r, padded *p)
{
    const int64_t qrow = c->heads_q * c->head_dim, krow = c->heads_kv * c->head_dim;
    p->s = (oracle_shape){c->batch, c->heads_q, c->heads_kv, r->max_q, r->max_k, c->head_dim};
    for (int64_t b = 0; b < c->batch; ++b) p->seqlens[b] = c->len_k[b];
    p->q = pad(r->q, r->cu_q, c->batch, r->max_q, qrow);
    p->dout = pad(r->dout, r->cu_q, c->batch, r->max_q, qrow);
    p->k = pad(r->k, r->cu_k, c->batch, r->max_k, krow);
    p->v = pad(r->v, r->cu_k, c->batch, r->max_k, krow);
    const size_t nq = (size_t)(c->batch * r->max_q * qrow), nk = (size_t)(c->batch * r->max_k * krow);
    p->out = calloc(nq, sizeof(double));
    p->dq = calloc(nq, sizeof(double));
    p->dk = calloc(nk, sizeof(double));
    p->dv = calloc(nk, sizeof(double));
    p->lse = calloc((size_t)(c->batch * c->heads_q * r->max_q), sizeof(double));
    assert_true(p->out && p->dq && p->dk && p->dv && p->lse);
}

static void padded_free(padded *p)
{
    double *all[] = {p->q, p->k, p->v, p->dout, p->out, p->lse, p->dq, p->dk, p->dv};
    for (int i = 0; i < 9; ++i) free(all[i]);
}

static void reference_padded(const varlen_case *c, const varlen_run *r, reference *ref, padded *p)
{
    fa_attention_desc d = r->desc;
    d.varlen = NULL;
    d.seqlens_k = p->seqlens;
    oracle_forward(&p->s, &d, p->q, p->k, p->v, p->out, p->lse);
    oracle_backward(&p->s, &d, p->q, p->k, p->v, p->dout, p->dq, p->dk, p->dv);
    const int64_t qrow = c->heads_q * c->head_dim, krow = c->heads_kv * c->head_dim;
    unpad(p->out, r->cu_q, c->batch, r->max_q, qrow, ref->out);
    unpad(p->dq, r->cu_q, c->batch, r->max_q, qrow, ref->dq);
    unpad(p->dk, r->cu_k, c->batch, r->max_k, krow, ref->dk);
    unpad(p->dv, r->cu_k, c->batch, r->max_k, krow, ref->dv);
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t h = 0; h < c->heads_q; ++h)
            for (int64_t i = 0; i < c->len_q[b]; ++i)
                ref->lse[h * r->total_q + r->cu_q[b] + i] = p->lse[(b * c->heads_q + h) * r->max_q + i];
}

/* The library's dense call on the padded batch (seqlens_k) gives the packed call's rows. */
static void check_library_padded(fa_context *ctx, const varlen_case *c, const varlen_run *r, const padded *p,
                                 const float *packed_out)
{
    const int64_t qrow = c->heads_q * c->head_dim, krow = c->heads_kv * c->head_dim;
    const size_t nq = (size_t)(c->batch * r->max_q * qrow), nk = (size_t)(c->batch * r->max_k * krow);
    float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
    float *out = test_nan_floats(nq);
    assert_true(q && k && v);
    for (size_t i = 0; i < nq; ++i) q[i] = (float)p->q[i];
    for (size_t i = 0; i < nk; ++i) {
        k[i] = (float)p->k[i];
        v[i] = (float)p->v[i];
    }
    const fa_tensor tq = {q, FA_DTYPE_F32, c->batch, r->max_q, c->heads_q, c->head_dim, 0, 0, 0};
    const fa_tensor tk = {k, FA_DTYPE_F32, c->batch, r->max_k, c->heads_kv, c->head_dim, 0, 0, 0};
    const fa_tensor tv = {v, FA_DTYPE_F32, c->batch, r->max_k, c->heads_kv, c->head_dim, 0, 0, 0};
    fa_tensor tout = {out, FA_DTYPE_F32, c->batch, r->max_q, c->heads_q, c->head_dim, 0, 0, 0};
    fa_attention_desc d = r->desc;
    d.varlen = NULL;
    d.seqlens_k = p->seqlens;
    assert_int_equal(fa_forward(ctx, &d, &tq, &tk, &tv, &tout, NULL), FA_SUCCESS);
    double worst = 0.0;
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t i = 0; i < c->len_q[b] * qrow; ++i) {
            const double e = fabs((double)out[b * r->max_q * qrow + i] - (double)packed_out[r->cu_q[b] * qrow + i]);
            if (!(e <= worst)) worst = isnan(e) ? INFINITY : e; /* a NaN stays the worst */
        }
    printf("  %-26s packed vs padded library run: max |diff| %.2e\n", c->name, worst);
    assert_true(worst <= OUT_TOL);
    free(q);
    free(k);
    free(v);
    free(out);
}

static void check_result(const char *what, const char *name, double error, double tol)
{
    printf("  %-26s %-4s error %.2e (tolerance %.0e)\n", name, what, error, tol);
    assert_true(error <= tol);
}

static void run_case(const varlen_case *c)
{
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_int_equal(fa_context_set_num_threads(ctx, 2), FA_SUCCESS);
    varlen_run r;
    run_setup(&r, c);
    const fa_status st = run_library(ctx, &r);
    if (st != FA_SUCCESS) fail_msg("%s: %s", c->name, fa_last_error());

    const size_t nq = (size_t)(r.total_q * c->heads_q * c->head_dim);
    const size_t nk = (size_t)(r.total_k * c->heads_kv * c->head_dim), nl = (size_t)(c->heads_q * r.total_q);
    reference ref = {calloc(nq, sizeof(double)), malloc(nl * sizeof(double)), calloc(nq, sizeof(double)),
                     calloc(nk, sizeof(double)), calloc(nk, sizeof(double))};
    assert_true(ref.out && ref.lse && ref.dq && ref.dk && ref.dv);
    for (size_t i = 0; i < nl; ++i) ref.lse[i] = -INFINITY;
    float *out = tensor_packed(&r.tout), *dq = tensor_packed(&r.tdq), *dk = tensor_packed(&r.tdk);
    float *dv = tensor_packed(&r.tdv);
    if (c->dropout_p > 0.0f) {
        padded p;
        padded_make(c, &r, &p);
        reference_padded(c, &r, &ref, &p);
        check_library_padded(ctx, c, &r, &p, out);
        padded_free(&p);
    } else {
        reference_per_sequence(c, &r, &ref);
    }
    check_result("out", c->name, test_relative_error(ref.out, out, nq), OUT_TOL);
    check_result("lse", c->name, test_relative_error(ref.lse, r.lse, nl), OUT_TOL);
    check_result("dq", c->name, test_relative_error(ref.dq, dq, nq), GRAD_TOL);
    check_result("dk", c->name, test_relative_error(ref.dk, dk, nk), GRAD_TOL);
    check_result("dv", c->name, test_relative_error(ref.dv, dv, nk), GRAD_TOL);

    /* One thread: the same bits (only the gaps of strided tensors are compared as well). */
    varlen_run one;
    run_setup(&one, c);
    assert_int_equal(fa_context_set_num_threads(ctx, 1), FA_SUCCESS);
    assert_int_equal(run_library(ctx, &one), FA_SUCCESS);
    assert_memory_equal(one.tout.data, r.tout.data, r.tout.elements * sizeof(float));
    assert_memory_equal(one.lse, r.lse, nl * sizeof(float));
    assert_memory_equal(one.tdq.data, r.tdq.data, r.tdq.elements * sizeof(float));
    assert_memory_equal(one.tdk.data, r.tdk.data, r.tdk.elements * sizeof(float));
    assert_memory_equal(one.tdv.data, r.tdv.data, r.tdv.elements * sizeof(float));
    run_free(&one);

    free(out);
    free(dq);
    free(dk);
    free(dv);
    free(ref.out);
    free(ref.lse);
    free(ref.dq);
    free(ref.dk);
    free(ref.dv);
    run_free(&r);
    fa_context_destroy(ctx);
}

static void test_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i]);
}

/* ---- score modifiers on a packed batch: softcap, per-sequence ALiBi slopes, sinks (dsinks summed
 * over the sequences), a bias whose block b belongs to sequence b, or one bias shared by every
 * sequence (stride_batch 0: dbias is the sum of the sequences' parts) ---- */
enum { BROADCAST_BATCH = 1, BROADCAST_HEADS = 2, BROADCAST_ROWS = 4 };

typedef struct modifier_run {
    float *slopes, sinks[8], dsinks[8], *bias, *dbias;
    fa_bias bias_desc, dbias_desc;
    int64_t nb, nh, nr; /* the bias's extent: batches, heads, rows (1 where it broadcasts) */
} modifier_run;

static void modifiers_setup(modifier_run *m, varlen_run *r, const varlen_case *c, int broadcast)
{
    memset(m, 0, sizeof *m);
    m->slopes = malloc((size_t)(c->batch * c->heads_q) * sizeof(float));
    assert_non_null(m->slopes);
    for (int64_t x = 0; x < c->batch * c->heads_q; ++x) m->slopes[x] = 0.05f * (float)(1 + x % 4);
    for (int64_t h = 0; h < c->heads_q; ++h) m->sinks[h] = h % 2 ? -1.0f : 0.5f;
    m->nb = broadcast & BROADCAST_BATCH ? 1 : c->batch;
    m->nh = broadcast & BROADCAST_HEADS ? 1 : c->heads_q;
    m->nr = broadcast & BROADCAST_ROWS ? 1 : r->max_q;
    const size_t n = (size_t)(m->nb * m->nh * m->nr * r->max_k);
    double *values = test_random_doubles(5, n);
    m->bias = malloc(n * sizeof(float));
    assert_non_null(m->bias);
    for (size_t x = 0; x < n; ++x) m->bias[x] = (float)(0.5 * values[x]);
    free(values);
    m->dbias = test_nan_floats(n);
    m->bias_desc = (fa_bias){m->bias, FA_DTYPE_F32, broadcast & BROADCAST_BATCH ? 0 : m->nh * m->nr * r->max_k,
                             broadcast & BROADCAST_HEADS ? 0 : m->nr * r->max_k, broadcast & BROADCAST_ROWS ? 0 : r->max_k};
    m->dbias_desc = m->bias_desc;
    m->dbias_desc.data = m->dbias;
    r->desc.softcap = 3.0f;
    r->desc.alibi_slopes = m->slopes;
    r->desc.alibi_per_batch = 1;
    r->desc.sinks = m->sinks;
    r->desc.bias = &m->bias_desc;
}

static fa_status modifiers_library(fa_context *ctx, varlen_run *r, modifier_run *m)
{
    fa_status st = fa_forward(ctx, &r->desc, &r->tq.t, &r->tk.t, &r->tv.t, &r->tout.t, r->lse);
    if (st == FA_SUCCESS)
        st = fa_backward_ex(ctx, &r->desc, &r->tq.t, &r->tk.t, &r->tv.t, &r->tout.t, &r->tdout.t, r->lse, &r->tdq.t,
                            &r->tdk.t, &r->tdv.t, m->dsinks, &m->dbias_desc);
    return st;
}

/* The oracle per sequence, with that sequence's slopes and bias block; dsinks and a shared dbias
 * summed over the sequences. */
static void modifiers_reference(const varlen_case *c, const varlen_run *r, const modifier_run *m, reference *ref,
                                double *dsinks, double *dbias)
{
    const int64_t hq = c->heads_q, hk = c->heads_kv, dim = c->head_dim;
    for (int64_t b = 0; b < c->batch; ++b) {
        const int64_t lq = c->len_q[b], lk = c->len_k[b];
        for (int64_t h = 0; lk == 0 && h < hq; ++h) /* no key: lse is the sink alone */
            for (int64_t i = 0; i < lq; ++i) ref->lse[h * r->total_q + r->cu_q[b] + i] = m->sinks[h];
        if (lq == 0 || lk == 0) continue;
        fa_attention_desc d = r->desc;
        d.varlen = NULL;
        d.alibi_slopes = m->slopes + b * hq;
        d.alibi_per_batch = 0;
        fa_bias block = m->bias_desc;
        block.data = m->bias + b * m->bias_desc.stride_batch;
        block.stride_batch = 0;
        d.bias = &block;
        const oracle_shape s = {1, hq, hk, lq, lk, dim};
        const size_t qo = (size_t)(r->cu_q[b] * hq * dim), ko = (size_t)(r->cu_k[b] * hk * dim);
        fa_bias packed;
        size_t count;
        oracle_dbias_shape(&s, &d, &packed, &count);
        double *lse = malloc((size_t)(hq * lq) * sizeof *lse), *ds = malloc((size_t)hq * sizeof *ds);
        double *db = malloc(count * sizeof *db);
        assert_true(lse && ds && db);
        oracle_forward(&s, &d, r->q + qo, r->k + ko, r->v + ko, ref->out + qo, lse);
        for (int64_t h = 0; h < hq; ++h)
            for (int64_t i = 0; i < lq; ++i) ref->lse[h * r->total_q + r->cu_q[b] + i] = lse[h * lq + i];
        oracle_backward_ex(&s, &d, r->q + qo, r->k + ko, r->v + ko, r->dout + qo, ref->dq + qo, ref->dk + ko,
                           ref->dv + ko, ds, db);
        for (int64_t h = 0; h < hq; ++h) dsinks[h] += ds[h];
        /* sequence b's dbias (rows lq or 1, keys lk) into its block of the [nb, nh, nr, max_k] layout */
        const int64_t rows = packed.stride_q ? lq : 1, bb = m->nb > 1 ? b : 0;
        for (int64_t h = 0; h < m->nh; ++h)
            for (int64_t i = 0; i < rows; ++i)
                for (int64_t j = 0; j < lk; ++j)
                    dbias[((bb * m->nh + h) * m->nr + i) * r->max_k + j] +=
                        db[(size_t)(h * packed.stride_head + i * packed.stride_q + j)];
        free(lse);
        free(ds);
        free(db);
    }
}

static void run_modifier_case(const varlen_case *c, int broadcast)
{
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_int_equal(fa_context_set_num_threads(ctx, 2), FA_SUCCESS);
    varlen_run r;
    modifier_run m;
    run_setup(&r, c);
    modifiers_setup(&m, &r, c, broadcast);
    if (modifiers_library(ctx, &r, &m) != FA_SUCCESS) fail_msg("%s: %s", c->name, fa_last_error());

    const size_t nq = (size_t)(r.total_q * c->heads_q * c->head_dim);
    const size_t nk = (size_t)(r.total_k * c->heads_kv * c->head_dim), nl = (size_t)(c->heads_q * r.total_q);
    const size_t nbias = (size_t)(m.nb * m.nh * m.nr * r.max_k);
    reference ref = {calloc(nq, sizeof(double)), malloc(nl * sizeof(double)), calloc(nq, sizeof(double)),
                     calloc(nk, sizeof(double)), calloc(nk, sizeof(double))};
    double *dsinks = calloc((size_t)c->heads_q, sizeof *dsinks), *dbias = calloc(nbias, sizeof *dbias);
    assert_true(ref.out && ref.lse && ref.dq && ref.dk && ref.dv && dsinks && dbias);
    for (size_t i = 0; i < nl; ++i) ref.lse[i] = -INFINITY;
    modifiers_reference(c, &r, &m, &ref, dsinks, dbias);
    float *out = tensor_packed(&r.tout), *dq = tensor_packed(&r.tdq), *dk = tensor_packed(&r.tdk);
    float *dv = tensor_packed(&r.tdv);
    printf("  modifiers, bias broadcast %d:\n", broadcast);
    check_result("out", c->name, test_relative_error(ref.out, out, nq), OUT_TOL);
    check_result("lse", c->name, test_relative_error(ref.lse, r.lse, nl), OUT_TOL);
    check_result("dq", c->name, test_relative_error(ref.dq, dq, nq), GRAD_TOL);
    check_result("dk", c->name, test_relative_error(ref.dk, dk, nk), GRAD_TOL);
    check_result("dv", c->name, test_relative_error(ref.dv, dv, nk), GRAD_TOL);
    check_result("dsinks", c->name, test_relative_error(dsinks, m.dsinks, (size_t)c->heads_q), GRAD_TOL);
    check_result("dbias", c->name, test_relative_error(dbias, m.dbias, nbias), GRAD_TOL);

    /* One thread: the same bits. */
    varlen_run one;
    modifier_run m1;
    run_setup(&one, c);
    modifiers_setup(&m1, &one, c, broadcast);
    assert_int_equal(fa_context_set_num_threads(ctx, 1), FA_SUCCESS);
    assert_int_equal(modifiers_library(ctx, &one, &m1), FA_SUCCESS);
    assert_memory_equal(m1.dsinks, m.dsinks, (size_t)c->heads_q * sizeof(float));
    assert_memory_equal(m1.dbias, m.dbias, nbias * sizeof(float));
    assert_memory_equal(one.tdk.data, r.tdk.data, r.tdk.elements * sizeof(float));

    float *all[] = {out, dq, dk, dv, m.slopes, m.bias, m.dbias, m1.slopes, m1.bias, m1.dbias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]);
    double *refs[] = {ref.out, ref.lse, ref.dq, ref.dk, ref.dv, dsinks, dbias};
    for (size_t i = 0; i < sizeof refs / sizeof refs[0]; ++i) free(refs[i]);
    run_free(&one);
    run_free(&r);
    fa_context_destroy(ctx);
}

static void test_modifiers(void **state)
{
    (void)state;
    /* empty sequences and a sequence of queries with no key (lse = the sink); loose bounds (the
     * padding of dbias's blocks must stay zero); every broadcast of the bias incl. shared ones */
    static const int broadcasts[] = {0, BROADCAST_BATCH, BROADCAST_BATCH | BROADCAST_HEADS,
                                     BROADCAST_BATCH | BROADCAST_ROWS, BROADCAST_HEADS};
    const size_t picks[] = {0, 1, 3};
    for (size_t x = 0; x < sizeof picks / sizeof picks[0]; ++x)
        for (size_t y = 0; y < sizeof broadcasts / sizeof broadcasts[0]; ++y) run_modifier_case(&cases[picks[x]], broadcasts[y]);
}

/* ---- bad inputs: each breaks one thing of a valid call; status, message, nothing written ---- */
typedef struct bad_varlen {
    const char *name;
    const char *message_prefix;
    void (*mutate)(varlen_run *r, int32_t *seqlens);
} bad_varlen;

#define MUTATION(fn, body) static void fn(varlen_run *r, int32_t *seqlens) { (void)seqlens; body; }
MUTATION(batch_zero, r->varlen.batch = 0)
MUTATION(cu_q_null, r->varlen.cu_seqlens_q = NULL)
MUTATION(cu_k_null, r->varlen.cu_seqlens_k = NULL)
MUTATION(max_zero, r->varlen.max_seqlen_k = 0)
MUTATION(first_not_zero, r->cu_q[0] = 1)
MUTATION(decreasing, r->cu_k[2] = r->cu_k[1] - 1)
MUTATION(last_short, r->cu_q[r->varlen.batch] -= 1)
MUTATION(last_long, r->cu_k[r->varlen.batch] += 1)
MUTATION(longer_than_max, r->varlen.max_seqlen_q -= 1)
MUTATION(seqlens_set, r->desc.seqlens_k = seqlens)
MUTATION(q_batch_two, r->tq.t.batch = 2; r->tq.t.seqlen /= 2; r->tout.t = r->tq.t; r->tk.t.batch = 2;
         r->tk.t.seqlen /= 2; r->tv.t = r->tk.t)
static void mask_grid(varlen_run *r, int32_t *seqlens)
{
    (void)seqlens;
    r->bm.block_q = r->bm.block_k = 4;
    r->bm.rows = (r->total_q + 3) / 4;
    r->bm.cols = (r->total_k + 3) / 4;
    r->bm.mask = r->mask;
    r->desc.block_mask = &r->bm;
}

static const bad_varlen bad_cases[] = {
    {"batch 0", "desc->varlen->batch", batch_zero},
    {"cu_seqlens_q NULL", "desc->varlen->cu_seqlens_q", cu_q_null},
    {"cu_seqlens_k NULL", "desc->varlen->cu_seqlens_k", cu_k_null},
    {"max_seqlen_k 0", "desc->varlen->max_seqlen", max_zero},
    {"first offset 1", "desc->varlen->cu_seqlens_q[0]", first_not_zero},
    {"decreasing offsets", "desc->varlen->cu_seqlens_k[2]", decreasing},
    {"last offset below total", "desc->varlen->cu_seqlens_q[4]", last_short},
    {"last offset above total", "desc->varlen->cu_seqlens_k[4]", last_long},
    {"length above max_seqlen_q", "desc->varlen->cu_seqlens_q: sequence", longer_than_max},
    {"seqlens_k with varlen", "desc->seqlens_k", seqlens_set},
    {"q batch 2", "q: batch", q_batch_two},
    {"block mask grid of the totals", "desc->block_mask", mask_grid},
};

static void test_bad_inputs(void **state)
{
    (void)state;
    static const varlen_case shape = {"bad", 4, 2, 1, 16, {3, 0, 9, 6}, {5, 2, 9, 1}, 0, -1, -1, 0, 0, 0, 0, 0};
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; ++i) {
        varlen_run r;
        run_setup(&r, &shape);
        r.mask = calloc(64, 1);
        int32_t seqlens[4] = {1, 1, 1, 1};
        bad_cases[i].mutate(&r, seqlens);
        for (int pass = 0; pass < 2; ++pass) {
            const fa_status st = pass == 0 ? fa_forward(ctx, &r.desc, &r.tq.t, &r.tk.t, &r.tv.t, &r.tout.t, r.lse)
                                           : fa_backward(ctx, &r.desc, &r.tq.t, &r.tk.t, &r.tv.t, &r.tout.t,
                                                         &r.tdout.t, r.lse, &r.tdq.t, &r.tdk.t, &r.tdv.t);
            printf("  %-30s %s: %s\n", bad_cases[i].name, pass ? "backward" : "forward", fa_last_error());
            assert_int_equal(st, FA_ERROR_INVALID_VALUE);
            assert_memory_equal(fa_last_error(), bad_cases[i].message_prefix, strlen(bad_cases[i].message_prefix));
        }
        const host_tensor *outs[] = {&r.tout, &r.tdq, &r.tdk, &r.tdv};
        for (int t = 0; t < 4; ++t)
            for (size_t e = 0; e < outs[t]->elements; ++e) assert_true(isnan(outs[t]->data[e]));
        for (int64_t e = 0; e < 2 * r.total_q; ++e) assert_true(isnan(r.lse[e]));
        run_free(&r);
    }
    fa_context_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_modifiers),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

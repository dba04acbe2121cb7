/* Packed variable-length batches on the CPU: each sequence is a dense sub-problem (batch 1) over
 * its rows of the packed tensors, run by the dense forward/backward in sequence order. The
 * sub-problem keeps the packed problem's lse layout ([heads_q, total_q]) and draws dropout at
 * the padded layout's coordinates (dropout_batch0 = b, rows x cols = max_seqlen_q x max_seqlen_k),
 * so each sequence gives exactly what a dense batch-1 call on it would, and the block mask applies
 * from the sequence's first row and key. Sequences run one after another, each with all threads:
 * no work is spent on padding, and results do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "cpu_backend.h"
#include "cpu_modifiers.h"
#include "cpu_tile.h"

/* Rows [s0, s0 + rows) of every head of a batch-1 tensor, as a tensor of their own. */
static fa_tensor rows_view(const fa_tensor *t, int64_t s0, int64_t rows)
{
    fa_tensor v = *t;
    v.data = fa_row_ptr(t, 0, s0, 0);
    v.seqlen = rows;
    return v;
}

static fa_problem sequence_problem(const fa_problem *p, int64_t b, int64_t q0, int64_t len_q, int64_t k0,
                                   int64_t len_k)
{
    fa_problem s = *p;
    s.varlen = (fa_varlen){0};
    s.shape.seqlen_q = len_q;
    s.shape.seqlen_k = len_k;
    s.mask.diag_offset = len_k - len_q; /* bottom-right within the sequence */
    s.q = rows_view(&p->q, q0, len_q);
    s.out = rows_view(&p->out, q0, len_q);
    s.k = rows_view(&p->k, k0, len_k);
    s.v = rows_view(&p->v, k0, len_k);
    if (p->dout.data) { /* backward */
        s.dout = rows_view(&p->dout, q0, len_q);
        s.dq = rows_view(&p->dq, q0, len_q);
        s.dk = rows_view(&p->dk, k0, len_k);
        s.dv = rows_view(&p->dv, k0, len_k);
    }
    if (p->outputs.lse) s.outputs.lse = p->outputs.lse + q0; /* lse_stride_head stays total_q */
    s.dropout.batch0 = b;
    /* the modifiers of sequence b: its slopes, its bias block indexed from its first row and key */
    if (p->modifiers.alibi_slopes) s.modifiers.alibi_slopes = p->modifiers.alibi_slopes + b * p->modifiers.alibi_stride_batch;
    if (p->modifiers.bias.data) s.modifiers.bias.data = fa_cpu_bias_row(&p->modifiers.bias, b, 0, 0);
    if (p->outputs.dbias.data) s.outputs.dbias.data = fa_cpu_bias_row(&p->outputs.dbias, b, 0, 0);
    s.outputs.dsinks = NULL; /* summed over the whole packed batch by the caller */
    return s;
}

/* Zeros rows [s0, s0 + rows) of every head of t (outputs no key or no query reaches). */
static fa_status zero_rows(const fa_tensor *t, const fa_cpu_kernels *kern, int64_t s0, int64_t rows)
{
    float *zeros = fa_host_calloc((size_t)t->head_dim, sizeof(float));
    if (!zeros) return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "varlen: cannot allocate a row of zeros");
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < t->heads; ++h) fa_cpu_store_rows(t, kern, 0, s0 + r, h, 1, zeros, 0);
    fa_host_free(zeros);
    return FA_SUCCESS;
}

/* A dbias shared by the sequences (stride_batch 0) is their sum: each sequence writes its part
 * into an f32 block of dbias's broadcast shape (zeroed first: its padding has no gradient), the
 * parts are added to the total in sequence order (deterministic), and the total is stored once. */
typedef struct shared_dbias {
    fa_bias part;      /* f32, packed, dbias's broadcast: what one sequence's backward writes */
    float *total;
    int64_t heads, rows, keys;
} shared_dbias;

static fa_status shared_dbias_begin(const fa_problem *p, shared_dbias *sh)
{
    sh->heads = p->outputs.dbias.stride_head ? p->shape.heads_q : 1;
    sh->rows = p->outputs.dbias.stride_q ? p->varlen.max_seqlen_q : 1;
    sh->keys = p->varlen.max_seqlen_k;
    const size_t count = (size_t)(sh->heads * sh->rows * sh->keys);
    sh->part = (fa_bias){fa_host_alloc((count ? count : 1) * sizeof(float)), FA_DTYPE_F32, 0,
                         p->outputs.dbias.stride_head ? sh->rows * sh->keys : 0, p->outputs.dbias.stride_q ? sh->keys : 0};
    sh->total = fa_host_calloc(count ? count : 1, sizeof(float));
    if (sh->part.data && sh->total) return FA_SUCCESS;
    fa_host_free(sh->part.data);
    fa_host_free(sh->total);
    return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "varlen backward: cannot allocate the sum of a dbias shared by the "
                        "sequences (%zu floats, twice)", count);
}

static void shared_dbias_add_part(shared_dbias *sh)
{
    const float *part = sh->part.data;
    for (int64_t x = 0; x < sh->heads * sh->rows * sh->keys; ++x) sh->total[x] += part[x];
}

static void shared_dbias_end(const fa_problem *p, shared_dbias *sh, fa_status st)
{
    for (int64_t h = 0; st == FA_SUCCESS && h < sh->heads; ++h)
        for (int64_t i = 0; i < sh->rows; ++i)
            fa_cpu_store_bias_row(&p->outputs.dbias, 0, h, i, 0, sh->total + (h * sh->rows + i) * sh->keys, sh->keys);
    fa_host_free(sh->part.data);
    fa_host_free(sh->total);
}

fa_status fa_cpu_varlen_run(void *state, const fa_problem *p, int backward)
{
    const fa_cpu_kernels *kern = ((const fa_cpu_state *)state)->kernels;
    const int32_t *cq = p->varlen.cu_seqlens_q, *ck = p->varlen.cu_seqlens_k;
    fa_status st = FA_SUCCESS;
    shared_dbias shared = {0};
    const int dbias_shared = p->outputs.dbias.data && !p->outputs.dbias.stride_batch;
    if (dbias_shared) {
        st = shared_dbias_begin(p, &shared);
        if (st) return st;
    } else if (p->outputs.dbias.data) {
        /* the padding of each sequence's block (rows and keys past its lengths) stays zero */
        fa_cpu_zero_bias(&p->outputs.dbias, p->varlen.batch, p->shape.heads_q, p->varlen.max_seqlen_q, p->varlen.max_seqlen_k);
    }
    for (int64_t b = 0; b < p->varlen.batch && st == FA_SUCCESS; ++b) {
        const int64_t q0 = cq[b], len_q = cq[b + 1] - cq[b], k0 = ck[b], len_k = ck[b + 1] - ck[b];
        if (len_q > 0 && len_k > 0) {
            fa_problem s = sequence_problem(p, b, q0, len_q, k0, len_k);
            if (dbias_shared) {
                s.outputs.dbias = shared.part;
                fa_cpu_zero_bias(&s.outputs.dbias, 1, p->shape.heads_q, shared.rows, shared.keys);
            }
            st = backward ? fa_cpu_backward_dense(state, &s) : fa_cpu_forward_dense(state, &s);
            if (dbias_shared && st == FA_SUCCESS) shared_dbias_add_part(&shared);
        } else if (backward) { /* no score exists: zero gradients */
            st = zero_rows(&p->dq, kern, q0, len_q);
            if (st == FA_SUCCESS) st = zero_rows(&p->dk, kern, k0, len_k);
            if (st == FA_SUCCESS) st = zero_rows(&p->dv, kern, k0, len_k);
        } else { /* rows with no visible key: zeros and lse = -inf (or the sink) */
            st = zero_rows(&p->out, kern, q0, len_q);
            for (int64_t h = 0; p->outputs.lse && h < p->shape.heads_q; ++h)
                for (int64_t i = 0; i < len_q; ++i) p->outputs.lse[fa_lse_index(p, 0, h, q0 + i)] = fa_cpu_sink(p, h); /* -inf, or the sink alone */
        }
    }
    if (dbias_shared) shared_dbias_end(p, &shared, st);
    return st;
}

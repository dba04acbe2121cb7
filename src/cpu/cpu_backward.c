/* Backward pass on the CPU: Algorithm 4 of the paper, by recomputation.
 *   D = rowsum(dO o O)                               (pre-pass, O(N) memory)
 *   per visible (query tile i, key tile j):  P = exp(tau S - lse), Z = dropout(P),
 *   dV_j += Z^T dO_i,  dP = dropout(dO_i V_j^T),  dS = P o (dP - D_i),
 *   dK_j += tau dS^T Q_i,  dQ_i += tau dS K_j.
 * Tiles are transposed (S^T, dS^T: key rows, query columns; see kernels/kernels.h), so P^T and
 * dS^T multiply dO and Q directly and dS K reads dS^T with swapped strides.
 * Race-free and deterministic, with no atomics and no reduction, in one of two ways chosen from
 * the problem's shape alone (never the thread count, so results do not depend on it):
 *   fused (enough batch x kv-head pairs): one task owns a whole (batch, kv head) and does the
 *     five tile products of Algorithm 4 per tile pair, accumulating dK_j, dV_j over its query
 *     heads and query tiles, and dQ_i of those heads over key tiles in increasing order (in
 *     place in an f32 dQ, else in a per-thread f32 buffer of group x Nq x d floats);
 *   two-pass (too few pairs to keep the threads busy, or a dQ buffer too large): pass 1 owns one
 *     key tile per task (dK, dV), pass 2 one query tile per task and recomputes S, P and dP to
 *     accumulate dQ (seven tile products per pair instead of five). */
#include <math.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "cpu_backend.h"
#include "cpu_modifiers.h"
#include "cpu_tile.h"

typedef struct backward_scratch {
    float *q, *dout, *qt, *dout_t, *k, *v, *st, *dst, *acc_a, *acc_b, *shift, *delta, *sum;
    float *cap_grad; /* d score / d (scaled q.k) of the tile under a softcap: Bc x Br */
    const float *q_rows, *dout_rows; /* Q_i, dO_i as f32 rows (in place or converted) */
    int64_t ldq, lddo;
    fa_key_range *ranges;
} backward_scratch;

static void *backward_scratch_alloc(backward_scratch *w, int64_t br, int64_t bc, int64_t d)
{
    const int64_t acc = (br > bc ? br : bc) * d;
    const int64_t floats = (4 * br * d + 2 * bc * d + 3 * bc * br + 2 * acc + 3 * br + 1) & ~(int64_t)1;
    char *base = fa_host_alloc((size_t)floats * sizeof(float) + (size_t)br * sizeof(fa_key_range));
    if (!base) return NULL;
    float *f = (float *)base;
    w->q = f; f += br * d;
    w->dout = f; f += br * d;
    w->qt = f; f += d * br;
    w->dout_t = f; f += d * br;
    w->k = f; f += bc * d;
    w->v = f; f += bc * d;
    w->st = f; f += bc * br;
    w->dst = f; f += bc * br;
    w->cap_grad = f; f += bc * br;
    w->acc_a = f; f += acc;
    w->acc_b = f; f += acc;
    w->shift = f; f += br;
    w->delta = f; f += br;
    w->sum = f;
    w->ranges = (fa_key_range *)(base + (size_t)floats * sizeof(float));
    return base;
}

/* Loads the query side of (b, h, rows): Q and dO as rows and transposed, the exponential's shift
 * (lse, or +inf for a row that sees no key so that P = 0) and D. */
static void load_query_side(const fa_problem *p, const fa_cpu_kernels *kern, const float *delta, int64_t b,
                            int64_t h, const fa_cpu_rows *rows, int64_t br, backward_scratch *w)
{
    const int64_t base = (b * p->heads_q + h) * p->seqlen_q + rows->i0, lse_base = fa_lse_index(p, b, h, rows->i0);
    w->q_rows = fa_cpu_view_rows(&p->q, kern, b, rows->i0, h, rows->count, w->q, &w->ldq);
    w->dout_rows = fa_cpu_view_rows(&p->dout, kern, b, rows->i0, h, rows->count, w->dout, &w->lddo);
    fa_cpu_load_transposed(&p->q, kern, b, rows->i0, h, rows->count, w->qt, br);
    fa_cpu_load_transposed(&p->dout, kern, b, rows->i0, h, rows->count, w->dout_t, br);
    for (int64_t r = 0; r < rows->count; ++r) {
        w->shift[r] = p->lse[lse_base + r] == -INFINITY ? INFINITY : p->lse[lse_base + r];
        w->delta[r] = delta[base + r];
    }
}

/* What tile_gradients leaves in w->dst: the gradient of the final scores (what the bias receives),
 * or of the scaled q.k (what dQ and dK need: through the softcap's derivative). */
enum ds_of { DS_OF_SCORES, DS_OF_QK };

/* For the loaded query side and the key tile K_j, V_j: w->st = dropout(P)^T (the Z of the paper,
 * what multiplied V in the forward), w->dst = dS^T. */
static void tile_gradients(const fa_problem *p, const fa_cpu_kernels *kern, int64_t br, int64_t b, int64_t h,
                           const fa_cpu_rows *rows, int64_t j0, int64_t cols, fa_tile_visibility vis, const float *k,
                           int64_t ldk, const float *v, int64_t ldv, enum ds_of of, backward_scratch *w)
{
    const int64_t d = p->head_dim, n = rows->count;
    const int modified = fa_cpu_scores_modified(p), fold = p->scale > 0.0f && !modified;
    const int chain = of == DS_OF_QK && p->softcap > 0.0f;
    kern->gemm(cols, n, d, k, ldk, 1, w->qt, br, w->st, br, NULL, 0); /* S^T = K Q^T */
    if (vis != FA_TILE_FULL || !fold) fa_cpu_scale_mask(p, rows, j0, cols, vis, fold, w->st, br);
    if (modified) fa_cpu_modify_scores(p, b, h, rows, j0, cols, w->st, br, chain ? w->cap_grad : NULL);
    kern->exp_cols(w->st, br, cols, n, fold ? p->scale : 1.0f, w->shift, w->sum);
    kern->gemm(cols, n, d, v, ldv, 1, w->dout_t, br, w->dst, br, NULL, 0); /* dP^T = V dO^T */
    /* dS = P o (dropout(dP) - D) uses P undropped; dV then needs Z = dropout(P). */
    const int dropout = p->dropout_p > 0.0f;
    if (dropout) fa_cpu_apply_dropout(p, b, h, rows, j0, cols, w->dst, br);
    for (int64_t c = 0; c < cols; ++c) {
        const float *pc = w->st + c * br;
        float *dsc = w->dst + c * br;
        for (int64_t r = 0; r < n; ++r) dsc[r] = pc[r] * (dsc[r] - w->delta[r]);
        if (chain)
            for (int64_t r = 0; r < n; ++r) dsc[r] *= w->cap_grad[c * br + r];
    }
    if (dropout) fa_cpu_apply_dropout(p, b, h, rows, j0, cols, w->st, br);
}

/* The query tile of (b) from i0 and the keys of [j0, j0 + cols) its rows can see: [*lo, *hi),
 * and how visible that span is (EMPTY when it is empty). */
static fa_tile_visibility tile_span(const fa_problem *p, int64_t b, int64_t i0, int64_t br, int64_t j0, int64_t cols,
                                    backward_scratch *w, fa_cpu_rows *rows, int64_t *lo, int64_t *hi)
{
    fa_cpu_rows_init(p, b, i0, p->seqlen_q - i0 < br ? p->seqlen_q - i0 : br, w->ranges, rows);
    *lo = rows->key_lo > j0 ? rows->key_lo : j0;
    *hi = rows->key_hi < j0 + cols ? rows->key_hi : j0 + cols;
    return *hi > *lo ? fa_cpu_tile_visibility(p, rows, *lo, *hi - *lo) : FA_TILE_EMPTY;
}

/* Where dQ_i of query head h accumulates in the fused path: the f32 dQ tensor itself, or a
 * per-thread buffer [group][Nq][d] for f16/bf16 dQ. */
typedef struct dq_target {
    float *buffer; /* NULL: accumulate in place in p->dq (f32) */
} dq_target;

static float *dq_rows(const fa_problem *p, const dq_target *t, int64_t b, int64_t h, int64_t i0, int64_t *ld)
{
    if (!t->buffer) {
        *ld = p->dq.stride_seq;
        return fa_row_ptr(&p->dq, b, i0, h);
    }
    const int64_t group = p->heads_q / p->heads_kv, slot = h % group;
    *ld = p->head_dim;
    return t->buffer + (slot * p->seqlen_q + i0) * p->head_dim;
}

/* dK_j, dV_j for one (batch, kv head, key tile); with dq, also dQ_i += dS K_j into the fused
 * path's accumulator for every query tile this key tile touches. */
static void key_tile_task(const fa_problem *p, const fa_cpu_kernels *kern, const float *delta, int64_t br,
                          int64_t bc, int64_t b, int64_t hk, int64_t j0, const dq_target *dq, backward_scratch *w)
{
    const int64_t d = p->head_dim, group = p->heads_q / p->heads_kv;
    const int64_t cols = p->seqlen_k - j0 < bc ? p->seqlen_k - j0 : bc;
    float *dk = w->acc_a, *dv = w->acc_b;
    memset(dk, 0, (size_t)(cols * d) * sizeof(float));
    memset(dv, 0, (size_t)(cols * d) * sizeof(float));
    int64_t ldk, ldv;
    const float *k = fa_cpu_view_rows(&p->k, kern, b, j0, hk, cols, w->k, &ldk);
    const float *v = fa_cpu_view_rows(&p->v, kern, b, j0, hk, cols, w->v, &ldv);
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t i0 = 0; i0 < p->seqlen_q; i0 += br) {
            fa_cpu_rows rows;
            int64_t lo, hi;
            const fa_tile_visibility vis = tile_span(p, b, i0, br, j0, cols, w, &rows, &lo, &hi);
            if (vis == FA_TILE_EMPTY) continue;
            const float *k_lo = k + (lo - j0) * ldk;
            load_query_side(p, kern, delta, b, h, &rows, br, w);
            tile_gradients(p, kern, br, b, h, &rows, lo, hi - lo, vis, k_lo, ldk, v + (lo - j0) * ldv, ldv, DS_OF_QK,
                           w);
            kern->gemm(hi - lo, d, rows.count, w->st, br, 1, w->dout_rows, w->lddo, dv + (lo - j0) * d, d, NULL,
                       1); /* dV += Z^T dO */
            kern->gemm(hi - lo, d, rows.count, w->dst, br, 1, w->q_rows, w->ldq, dk + (lo - j0) * d, d, NULL,
                       1); /* dK += dS^T Q */
            if (dq) {
                int64_t lddq;
                float *dq_i = dq_rows(p, dq, b, h, i0, &lddq);
                kern->gemm(rows.count, d, hi - lo, w->dst, 1, br, k_lo, ldk, dq_i, lddq, NULL, 1); /* dQ += dS K */
            }
        }
    }
    for (int64_t x = 0; x < cols * d; ++x) dk[x] *= p->scale;
    fa_cpu_store_rows(&p->dk, kern, b, j0, hk, cols, dk, d);
    fa_cpu_store_rows(&p->dv, kern, b, j0, hk, cols, dv, d);
}

/* Fused path: dK, dV and dQ of one (batch, kv head) and its query heads. dQ_i sums its key tiles
 * in increasing order, whatever thread runs the task. */
static void kv_head_task(const fa_problem *p, const fa_cpu_kernels *kern, const float *delta, int64_t br,
                         int64_t bc, int64_t b, int64_t hk, const dq_target *dq, backward_scratch *w)
{
    const int64_t d = p->head_dim, group = p->heads_q / p->heads_kv;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
        for (int64_t i = 0; i < p->seqlen_q; ++i) {
            int64_t ld;
            memset(dq_rows(p, dq, b, h, i, &ld), 0, (size_t)d * sizeof(float));
        }
    for (int64_t j0 = 0; j0 < p->seqlen_k; j0 += bc) key_tile_task(p, kern, delta, br, bc, b, hk, j0, dq, w);
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        int64_t ld;
        float *rows = dq_rows(p, dq, b, h, 0, &ld);
        for (int64_t i = 0; i < p->seqlen_q; ++i)
            for (int64_t c = 0; c < d; ++c) rows[i * ld + c] *= p->scale;
        if (dq->buffer) fa_cpu_store_rows(&p->dq, kern, b, 0, h, p->seqlen_q, rows, ld);
    }
}

/* Pass 2: dQ_i for one (batch, query head, query tile). */
static void query_tile_task(const fa_problem *p, const fa_cpu_kernels *kern, const float *delta, int64_t br,
                            int64_t bc, int64_t b, int64_t h, int64_t i0, backward_scratch *w)
{
    const int64_t d = p->head_dim, hk = h / (p->heads_q / p->heads_kv);
    fa_cpu_rows rows;
    fa_cpu_rows_init(p, b, i0, p->seqlen_q - i0 < br ? p->seqlen_q - i0 : br, w->ranges, &rows);
    float *dq = w->acc_a;
    memset(dq, 0, (size_t)(rows.count * d) * sizeof(float));
    if (rows.key_hi > rows.key_lo) load_query_side(p, kern, delta, b, h, &rows, br, w);
    /* Key tiles start at the first visible key and stop at the last one, so a causal or window
     * mask costs only the keys these rows can see (to within one tile's rows). */
    for (int64_t j0 = fa_cpu_first_key(p, rows.key_lo, bc); j0 < rows.key_hi; j0 += bc) {
        const int64_t cols = rows.key_hi - j0 < bc ? rows.key_hi - j0 : bc;
        const fa_tile_visibility vis = fa_cpu_tile_visibility(p, &rows, j0, cols);
        if (vis == FA_TILE_EMPTY) continue;
        int64_t ldk, ldv;
        const float *k = fa_cpu_view_rows(&p->k, kern, b, j0, hk, cols, w->k, &ldk);
        const float *v = fa_cpu_view_rows(&p->v, kern, b, j0, hk, cols, w->v, &ldv);
        tile_gradients(p, kern, br, b, h, &rows, j0, cols, vis, k, ldk, v, ldv, DS_OF_QK, w);
        kern->gemm(rows.count, d, cols, w->dst, 1, br, k, ldk, dq, d, NULL, 1); /* dQ += dS K */
    }
    for (int64_t x = 0; x < rows.count * d; ++x) dq[x] *= p->scale;
    fa_cpu_store_rows(&p->dq, kern, b, i0, h, rows.count, dq, d);
}

/* dbias pass: one task per distinct row block of dbias: (its batch, its head, its query tile),
 * with a broadcast axis folded into the task, which sums over it (batches, then heads, then query
 * tiles, then rows, in increasing order). It recomputes P and dS per tile pair (two tile
 * products) and accumulates them in an f32 tile acc, then stores every key tile, visible or not,
 * so every element of dbias's extent is written. */
static void bias_task(const fa_problem *p, const fa_cpu_kernels *kern, const float *delta, int64_t br, int64_t bc,
                      int64_t task, float *acc, backward_scratch *w)
{
    const fa_bias *db = &p->dbias;
    const int64_t q_tiles = (p->seqlen_q + br - 1) / br, group = p->heads_q / p->heads_kv;
    const int64_t task_tiles = db->stride_q ? q_tiles : 1, task_heads = db->stride_head ? p->heads_q : 1;
    const int64_t qt = task % task_tiles, oh = task / task_tiles % task_heads, ob = task / (task_tiles * task_heads);
    const int64_t b_lo = db->stride_batch ? ob : 0, b_hi = db->stride_batch ? ob + 1 : p->batch;
    const int64_t h_lo = db->stride_head ? oh : 0, h_hi = db->stride_head ? oh + 1 : p->heads_q;
    const int64_t t_lo = db->stride_q ? qt : 0, t_hi = db->stride_q ? qt + 1 : q_tiles;
    const int64_t out_rows = db->stride_q ? (p->seqlen_q - qt * br < br ? p->seqlen_q - qt * br : br) : 1;
    for (int64_t j0 = 0; j0 < p->seqlen_k; j0 += bc) {
        const int64_t cols = p->seqlen_k - j0 < bc ? p->seqlen_k - j0 : bc;
        memset(acc, 0, (size_t)(out_rows * bc) * sizeof(float));
        for (int64_t b = b_lo; b < b_hi; ++b)
            for (int64_t h = h_lo; h < h_hi; ++h)
                for (int64_t t = t_lo; t < t_hi; ++t) {
                    fa_cpu_rows rows;
                    int64_t lo, hi;
                    const fa_tile_visibility vis = tile_span(p, b, t * br, br, j0, cols, w, &rows, &lo, &hi);
                    if (vis == FA_TILE_EMPTY) continue;
                    int64_t ldk, ldv;
                    const float *k = fa_cpu_view_rows(&p->k, kern, b, lo, h / group, hi - lo, w->k, &ldk);
                    const float *v = fa_cpu_view_rows(&p->v, kern, b, lo, h / group, hi - lo, w->v, &ldv);
                    load_query_side(p, kern, delta, b, h, &rows, br, w);
                    tile_gradients(p, kern, br, b, h, &rows, lo, hi - lo, vis, k, ldk, v, ldv, DS_OF_SCORES, w);
                    for (int64_t r = 0; r < rows.count; ++r) {
                        float *out = acc + (db->stride_q ? r : 0) * bc + (lo - j0);
                        for (int64_t c = 0; c < hi - lo; ++c) out[c] += w->dst[c * br + r];
                    }
                }
        for (int64_t r = 0; r < out_rows; ++r) fa_cpu_store_bias_row(db, ob, oh, qt * br + r, j0, acc + r * bc, cols);
    }
}

/* D_x = rowsum(dO o O) of one row x = (b, h, i), accumulated in double. */
static float row_delta(const fa_problem *p, const fa_cpu_kernels *kern, int64_t x, backward_scratch *w)
{
    const int64_t i = x % p->seqlen_q, h = (x / p->seqlen_q) % p->heads_q, b = x / (p->seqlen_q * p->heads_q);
    int64_t ld;
    const float *o = fa_cpu_view_rows(&p->out, kern, b, i, h, 1, w->q, &ld);
    const float *dout = fa_cpu_view_rows(&p->dout, kern, b, i, h, 1, w->dout, &ld);
    double sum = 0.0;
    for (int64_t c = 0; c < p->head_dim; ++c) sum += (double)o[c] * (double)dout[c];
    return (float)sum;
}

/* The fused path needs enough (batch, kv head) tasks to keep a few threads busy (8 equal tasks
 * balance 2 or 4 threads exactly; with fewer, the two-pass path's finer tasks win despite its
 * two extra products) and, for an f16/bf16 dQ, a per-thread f32 buffer of bounded size. Decided
 * from the shape only, so the arithmetic never depends on the thread count. */
enum { FUSED_MIN_TASKS = 8 };
#define FUSED_MAX_DQ_BUFFER_BYTES ((int64_t)32 << 20)

static int backward_is_fused(const fa_problem *p, int64_t *dq_buffer_floats)
{
    const int64_t group = p->heads_q / p->heads_kv;
    *dq_buffer_floats = p->dq.dtype == FA_DTYPE_F32 ? 0 : group * p->seqlen_q * p->head_dim;
    return p->batch * p->heads_kv >= FUSED_MIN_TASKS &&
           *dq_buffer_floats * (int64_t)sizeof(float) <= FUSED_MAX_DQ_BUFFER_BYTES;
}

fa_status fa_cpu_backward(void *state, const fa_problem *p)
{
    if (p->dsinks) { /* over the whole problem, packed or not, before its sequences run */
        fa_status st = fa_cpu_sink_gradients(p);
        if (st) return st;
    }
    if (p->varlen.batch) return fa_cpu_varlen_run(state, p, 1);
    const fa_cpu_state *s = state;
    int64_t br, bc;
    fa_cpu_problem_tiles(s, p, &br, &bc);
    const int threads = fa_cpu_thread_count(s->num_threads);
    float *delta = fa_host_alloc((size_t)(p->batch * p->heads_q * p->seqlen_q) * sizeof(float));
    if (!delta) return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "backward: cannot allocate D (%lld floats)",
                                    (long long)(p->batch * p->heads_q * p->seqlen_q));
    const int64_t k_tiles = (p->seqlen_k + bc - 1) / bc, q_tiles = (p->seqlen_q + br - 1) / br;
    const int64_t kv_pairs = p->batch * p->heads_kv, q_pairs = p->batch * p->heads_q;
    int64_t dq_buffer_floats;
    const int fused = backward_is_fused(p, &dq_buffer_floats);
    int out_of_memory = 0;

#pragma omp parallel num_threads(threads)
    {
        backward_scratch w = {0};
        void *block = backward_scratch_alloc(&w, br, bc, p->head_dim);
        dq_target dq = {NULL};
        if (block && fused && dq_buffer_floats) {
            dq.buffer = fa_host_alloc((size_t)dq_buffer_floats * sizeof(float));
            if (!dq.buffer) {
                fa_host_free(block);
                block = NULL;
            }
        }
        if (!block) {
#pragma omp atomic write
            out_of_memory = 1;
        }
        /* The tasks read every thread's share of D: if any thread lacks its scratch, no thread
         * starts (the decision is the same in every thread, so the worksharing stays legal). */
#pragma omp barrier
        int team_ready;
#pragma omp atomic read
        team_ready = out_of_memory;
        team_ready = !team_ready;
        if (team_ready) {
#pragma omp for schedule(static)
            for (int64_t x = 0; x < p->batch * p->heads_q * p->seqlen_q; ++x) delta[x] = row_delta(p, s->kernels, x, &w);
            if (fused) {
#pragma omp for schedule(dynamic, 1)
                for (int64_t t = 0; t < kv_pairs; ++t)
                    kv_head_task(p, s->kernels, delta, br, bc, t / p->heads_kv, t % p->heads_kv, &dq, &w);
            } else {
                /* Longest tasks first under a causal mask: early key tiles, late query tiles. */
#pragma omp for schedule(dynamic, 1)
                for (int64_t t = 0; t < kv_pairs * k_tiles; ++t) {
                    const int64_t kt = t / kv_pairs, bh = t % kv_pairs;
                    key_tile_task(p, s->kernels, delta, br, bc, bh / p->heads_kv, bh % p->heads_kv, kt * bc, NULL,
                                  &w);
                }
#pragma omp for schedule(dynamic, 1)
                for (int64_t t = 0; t < q_pairs * q_tiles; ++t) {
                    const int64_t qt = q_tiles - 1 - t / q_pairs, bh = t % q_pairs;
                    query_tile_task(p, s->kernels, delta, br, bc, bh / p->heads_q, bh % p->heads_q, qt * br, &w);
                }
            }
        }
        if (team_ready && p->dbias.data) {
            const fa_bias *db = &p->dbias;
            const int64_t bias_tasks = (db->stride_batch ? p->batch : 1) * (db->stride_head ? p->heads_q : 1) *
                                       (db->stride_q ? q_tiles : 1);
            float *acc = fa_host_alloc((size_t)(br * bc) * sizeof(float));
            if (!acc) {
#pragma omp atomic write
                out_of_memory = 1;
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < bias_tasks; ++t)
                if (acc) bias_task(p, s->kernels, delta, br, bc, t, acc, &w);
            fa_host_free(acc);
        }
        fa_host_free(dq.buffer);
        fa_host_free(block);
    }
    fa_host_free(delta);
    if (out_of_memory)
        return fa_set_error(FA_ERROR_OUT_OF_MEMORY,
                            "backward: cannot allocate per-thread tiles (gradients are incomplete)");
    return FA_SUCCESS;
}

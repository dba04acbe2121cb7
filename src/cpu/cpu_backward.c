/* Backward pass on the CPU: Algorithm 4 of the paper, by recomputation.
 *   D = rowsum(dO o O)                               (pre-pass, O(N) memory)
 *   per visible (query tile i, key tile j):  P = exp(tau S - lse), Z = dropout(P),
 *   dV_j += Z^T dO_i,  dP = dropout(dO_i V_j^T),  dS = P o (dP - D_i),
 *   dK_j += tau dS^T Q_i,  dQ_i += tau dS K_j.
 * Race-free and deterministic: pass 1 owns one key tile per task (dK, dV summed over the query
 * heads of its group in a fixed order); pass 2 owns one query tile per task and recomputes the
 * tile products to accumulate dQ. Results do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "cpu_backend.h"
#include "cpu_tile.h"

typedef struct backward_scratch {
    float *q, *k, *v, *dout, *s, *dp, *acc_a, *acc_b, *lse, *delta;
    fa_key_range *ranges;
} backward_scratch;

static void *backward_scratch_alloc(backward_scratch *w, int64_t br, int64_t bc, int64_t d)
{
    const int64_t floats = br * d + 2 * bc * d + br * d + 2 * br * bc + 2 * (br > bc ? br : bc) * d + 2 * br;
    char *base = fa_host_alloc((size_t)floats * sizeof(float) + (size_t)br * sizeof(fa_key_range));
    if (!base) return NULL;
    const int64_t acc = (br > bc ? br : bc) * d;
    float *f = (float *)base;
    w->q = f; f += br * d;
    w->k = f; f += bc * d;
    w->v = f; f += bc * d;
    w->dout = f; f += br * d;
    w->s = f; f += br * bc;
    w->dp = f; f += br * bc;
    w->acc_a = f; f += acc;
    w->acc_b = f; f += acc;
    w->lse = f; f += br;
    w->delta = f; f += br;
    w->ranges = (fa_key_range *)f;
    return base;
}

/* Loads the query-side tiles of (b, h, rows): Q, dO, lse and D. */
static void load_query_side(const fa_problem *p, const float *delta, int64_t b, int64_t h, const fa_cpu_rows *rows,
                            backward_scratch *w)
{
    const int64_t d = p->head_dim, base = (b * p->heads_q + h) * p->seqlen_q + rows->i0;
    fa_cpu_load_rows(&p->q, b, rows->i0, h, rows->count, w->q, d);
    fa_cpu_load_rows(&p->dout, b, rows->i0, h, rows->count, w->dout, d);
    for (int64_t r = 0; r < rows->count; ++r) {
        w->lse[r] = p->lse[base + r];
        w->delta[r] = delta[base + r];
    }
}

/* For the loaded tiles Q_i, dO_i (rows) and K_j, V_j (cols): w->s = dropout(P) (the Z of the
 * paper, what multiplied V in the forward), w->dp = dS. */
static void tile_gradients(const fa_problem *p, const fa_cpu_kernels *kern, int64_t bc, int64_t b, int64_t h,
                           const fa_cpu_rows *rows, int64_t j0, int64_t cols, fa_tile_visibility vis,
                           backward_scratch *w)
{
    const int64_t d = p->head_dim;
    kern->gemm_nt(rows->count, cols, d, w->q, d, w->k, d, w->s, bc);
    fa_cpu_scale_mask(p, rows, j0, cols, vis, w->s, bc);
    for (int64_t r = 0; r < rows->count; ++r) {
        float *srow = w->s + r * bc;
        if (w->lse[r] == -INFINITY) memset(srow, 0, (size_t)cols * sizeof(float)); /* row sees no key */
        else kern->exp_sub(srow, cols, w->lse[r]);
    }
    kern->gemm_nt(rows->count, cols, d, w->dout, d, w->v, d, w->dp, bc);
    /* dS = P o (dropout(dP) - D) uses P undropped; dV then needs Z = dropout(P). */
    const int dropout = p->dropout_p > 0.0f;
    if (dropout) fa_cpu_apply_dropout(p, b, h, rows, j0, cols, w->dp, bc);
    for (int64_t r = 0; r < rows->count; ++r)
        for (int64_t c = 0; c < cols; ++c) w->dp[r * bc + c] = w->s[r * bc + c] * (w->dp[r * bc + c] - w->delta[r]);
    if (dropout) fa_cpu_apply_dropout(p, b, h, rows, j0, cols, w->s, bc);
}

/* Pass 1: dK_j, dV_j for one (batch, kv head, key tile). */
static void key_tile_task(const fa_problem *p, const fa_cpu_kernels *kern, const float *delta, int64_t br,
                          int64_t bc, int64_t b, int64_t hk, int64_t j0, backward_scratch *w)
{
    const int64_t d = p->head_dim, group = p->heads_q / p->heads_kv;
    const int64_t cols = p->seqlen_k - j0 < bc ? p->seqlen_k - j0 : bc;
    float *dk = w->acc_a, *dv = w->acc_b;
    memset(dk, 0, (size_t)(cols * d) * sizeof(float));
    memset(dv, 0, (size_t)(cols * d) * sizeof(float));
    fa_cpu_load_rows(&p->k, b, j0, hk, cols, w->k, d);
    fa_cpu_load_rows(&p->v, b, j0, hk, cols, w->v, d);
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t i0 = 0; i0 < p->seqlen_q; i0 += br) {
            fa_cpu_rows rows;
            fa_cpu_rows_init(p, b, i0, p->seqlen_q - i0 < br ? p->seqlen_q - i0 : br, w->ranges, &rows);
            const fa_tile_visibility vis = fa_cpu_tile_visibility(p, &rows, j0, cols);
            if (vis == FA_TILE_EMPTY) continue;
            load_query_side(p, delta, b, h, &rows, w);
            tile_gradients(p, kern, bc, b, h, &rows, j0, cols, vis, w);
            kern->gemm_tn(cols, d, rows.count, w->s, bc, w->dout, d, dv, d);
            kern->gemm_tn(cols, d, rows.count, w->dp, bc, w->q, d, dk, d);
        }
    }
    for (int64_t x = 0; x < cols * d; ++x) dk[x] *= p->scale;
    fa_cpu_store_rows(&p->dk, b, j0, hk, cols, dk, d);
    fa_cpu_store_rows(&p->dv, b, j0, hk, cols, dv, d);
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
    if (rows.key_hi > rows.key_lo) load_query_side(p, delta, b, h, &rows, w);
    for (int64_t j0 = rows.key_lo / bc * bc; j0 < rows.key_hi; j0 += bc) {
        const int64_t cols = p->seqlen_k - j0 < bc ? p->seqlen_k - j0 : bc;
        const fa_tile_visibility vis = fa_cpu_tile_visibility(p, &rows, j0, cols);
        if (vis == FA_TILE_EMPTY) continue;
        fa_cpu_load_rows(&p->k, b, j0, hk, cols, w->k, d);
        fa_cpu_load_rows(&p->v, b, j0, hk, cols, w->v, d);
        tile_gradients(p, kern, bc, b, h, &rows, j0, cols, vis, w);
        kern->gemm_nn(rows.count, d, cols, w->dp, bc, w->k, d, dq, d);
    }
    for (int64_t x = 0; x < rows.count * d; ++x) dq[x] *= p->scale;
    fa_cpu_store_rows(&p->dq, b, i0, h, rows.count, dq, d);
}

/* D_x = rowsum(dO o O) of one row x = (b, h, i), accumulated in double. */
static float row_delta(const fa_problem *p, int64_t x, backward_scratch *w)
{
    const int64_t i = x % p->seqlen_q, h = (x / p->seqlen_q) % p->heads_q, b = x / (p->seqlen_q * p->heads_q);
    fa_cpu_load_rows(&p->out, b, i, h, 1, w->q, p->head_dim);
    fa_cpu_load_rows(&p->dout, b, i, h, 1, w->dout, p->head_dim);
    double sum = 0.0;
    for (int64_t c = 0; c < p->head_dim; ++c) sum += (double)w->q[c] * (double)w->dout[c];
    return (float)sum;
}

fa_status fa_cpu_backward(void *state, const fa_problem *p)
{
    const fa_cpu_state *s = state;
    int64_t br, bc;
    fa_cpu_tiles(s, p->head_dim, &br, &bc, NULL);
    const int threads = fa_cpu_thread_count(s->num_threads);
    float *delta = fa_host_alloc((size_t)(p->batch * p->heads_q * p->seqlen_q) * sizeof(float));
    if (!delta) return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "backward: cannot allocate D (%lld floats)",
                                    (long long)(p->batch * p->heads_q * p->seqlen_q));
    const int64_t k_tiles = (p->seqlen_k + bc - 1) / bc, q_tiles = (p->seqlen_q + br - 1) / br;
    const int64_t key_tasks = p->batch * p->heads_kv * k_tiles, query_tasks = p->batch * p->heads_q * q_tiles;
    int out_of_memory = 0;

#pragma omp parallel num_threads(threads)
    {
        backward_scratch w = {0};
        void *block = backward_scratch_alloc(&w, br, bc, p->head_dim);
        if (!block) {
#pragma omp atomic write
            out_of_memory = 1;
        }
#pragma omp for schedule(static)
        for (int64_t x = 0; x < p->batch * p->heads_q * p->seqlen_q; ++x)
            if (block) delta[x] = row_delta(p, x, &w);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < key_tasks; ++t) {
            if (!block) continue;
            const int64_t bh = t / k_tiles;
            key_tile_task(p, s->kernels, delta, br, bc, bh / p->heads_kv, bh % p->heads_kv, (t % k_tiles) * bc, &w);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < query_tasks; ++t) {
            if (!block) continue;
            const int64_t bh = t / q_tiles;
            query_tile_task(p, s->kernels, delta, br, bc, bh / p->heads_q, bh % p->heads_q, (t % q_tiles) * br, &w);
        }
        fa_host_free(block);
    }
    fa_host_free(delta);
    if (out_of_memory)
        return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "backward: cannot allocate per-thread tiles (gradients are incomplete)");
    return FA_SUCCESS;
}

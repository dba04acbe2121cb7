/* Forward pass on the CPU: Algorithm 1/2 of the paper with cache-sized tiles.
 * One task per (batch, query head, query tile); each task streams the visible key/value tiles
 * through its cache, keeping the running row max m and row sum l (online softmax). The output
 * is normalised once at the end (the deferred division of FlashAttention-2, exact in arithmetic).
 * Extra memory: one set of tiles per thread, nothing of size N x N. */
#include <math.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "cpu_backend.h"
#include "cpu_tile.h"

typedef struct forward_scratch {
    float *q, *k, *v, *s, *o, *m, *l;
    fa_key_range *ranges;
} forward_scratch;

static void *forward_scratch_alloc(forward_scratch *w, int64_t br, int64_t bc, int64_t d)
{
    const int64_t floats = br * d + 2 * bc * d + br * bc + br * d + 2 * br;
    char *base = fa_host_alloc((size_t)floats * sizeof(float) + (size_t)br * sizeof(fa_key_range));
    if (!base) return NULL;
    float *f = (float *)base;
    w->q = f; f += br * d;
    w->k = f; f += bc * d;
    w->v = f; f += bc * d;
    w->s = f; f += br * bc;
    w->o = f; f += br * d;
    w->m = f; f += br;
    w->l = f; f += br;
    w->ranges = (fa_key_range *)f;
    return base;
}

static void forward_task(const fa_problem *p, const fa_cpu_kernels *kern, int64_t br, int64_t bc, int64_t b,
                         int64_t h, int64_t i0, forward_scratch *w)
{
    const int64_t d = p->head_dim, hk = h / (p->heads_q / p->heads_kv);
    const int64_t rows_n = p->seqlen_q - i0 < br ? p->seqlen_q - i0 : br;
    fa_cpu_rows rows;
    fa_cpu_rows_init(p, b, i0, rows_n, w->ranges, &rows);
    for (int64_t r = 0; r < rows_n; ++r) {
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
    }
    memset(w->o, 0, (size_t)(rows_n * d) * sizeof(float));
    if (rows.key_hi > rows.key_lo) fa_cpu_load_rows(&p->q, b, i0, h, rows_n, w->q, d);

    for (int64_t j0 = rows.key_lo / bc * bc; j0 < rows.key_hi; j0 += bc) {
        const int64_t cols = p->seqlen_k - j0 < bc ? p->seqlen_k - j0 : bc;
        const fa_tile_visibility vis = fa_cpu_tile_visibility(p, &rows, j0, cols);
        if (vis == FA_TILE_EMPTY) continue; /* never loads K_j, V_j (Algorithm 5) */
        fa_cpu_load_rows(&p->k, b, j0, hk, cols, w->k, d);
        fa_cpu_load_rows(&p->v, b, j0, hk, cols, w->v, d);
        kern->gemm_nt(rows_n, cols, d, w->q, d, w->k, d, w->s, bc);
        fa_cpu_scale_mask(p, &rows, j0, cols, vis, w->s, bc);
        for (int64_t r = 0; r < rows_n; ++r) {
            float *srow = w->s + r * bc;
            float tile_max = -INFINITY;
            for (int64_t c = 0; c < cols; ++c) tile_max = srow[c] > tile_max ? srow[c] : tile_max;
            if (tile_max == -INFINITY) { /* nothing visible in this row of the tile */
                memset(srow, 0, (size_t)cols * sizeof(float));
                continue;
            }
            const float m_new = w->m[r] > tile_max ? w->m[r] : tile_max;
            const float alpha = expf(w->m[r] - m_new); /* 0 on the first visible tile */
            const float row_sum = kern->exp_sub(srow, cols, m_new);
            w->l[r] = w->l[r] * alpha + row_sum;
            w->m[r] = m_new;
            if (alpha != 1.0f)
                for (int64_t c = 0; c < d; ++c) w->o[r * d + c] *= alpha;
        }
        if (p->dropout_p > 0.0f) fa_cpu_apply_dropout(p, b, h, &rows, j0, cols, w->s, bc);
        kern->gemm_nn(rows_n, d, cols, w->s, bc, w->v, d, w->o, d);
    }

    for (int64_t r = 0; r < rows_n; ++r) {
        const float l = w->l[r];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t c = 0; c < d; ++c) w->o[r * d + c] *= inv;
        if (p->lse) p->lse[(b * p->heads_q + h) * p->seqlen_q + i0 + r] = l > 0.0f ? w->m[r] + logf(l) : -INFINITY;
    }
    fa_cpu_store_rows(&p->out, b, i0, h, rows_n, w->o, d);
}

fa_status fa_cpu_forward(void *state, const fa_problem *p)
{
    const fa_cpu_state *s = state;
    int64_t br, bc;
    fa_cpu_tiles(s, p->head_dim, &br, &bc, NULL);
    const int64_t q_tiles = (p->seqlen_q + br - 1) / br;
    const int64_t tasks = p->batch * p->heads_q * q_tiles;
    int out_of_memory = 0;

#pragma omp parallel num_threads(fa_cpu_thread_count(s->num_threads))
    {
        forward_scratch w = {0};
        void *block = forward_scratch_alloc(&w, br, bc, p->head_dim);
        if (!block) {
#pragma omp atomic write
            out_of_memory = 1;
        }
        /* Later query tiles of a causal problem see more keys: dynamic scheduling balances that. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; ++t) {
            if (!block) continue;
            const int64_t qt = t % q_tiles, bh = t / q_tiles;
            forward_task(p, s->kernels, br, bc, bh / p->heads_q, bh % p->heads_q, qt * br, &w);
        }
        fa_host_free(block);
    }
    if (out_of_memory)
        return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "forward: cannot allocate per-thread tiles (outputs are incomplete)");
    return FA_SUCCESS;
}

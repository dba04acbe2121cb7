/* Forward pass on the CPU: Algorithm 1/2 of the paper with cache-sized tiles.
 * One task per (batch, query head, query tile); each task streams the visible key/value tiles
 * through its cache, keeping the running row max m and row sum l (online softmax). Scores are
 * held transposed (S^T[key][query], see kernels/kernels.h) so the per-query statistics are vector
 * lanes; the rescale of O by exp(m_old - m_new) is folded into the P V update, and O is
 * normalised once at the end (the deferred division of FlashAttention-2, exact in arithmetic).
 * f32 K and V are read in place; f16/bf16 tiles are widened once per tile; Q^T is packed once per
 * task and reused against every key tile. Extra memory: one set of tiles per thread. */
#include <math.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "cpu_backend.h"
#include "cpu_nan.h"
#include "cpu_tile.h"

typedef struct forward_scratch {
    float *qt, *k, *v, *st, *o, *m, *l, *tile_max, *shift, *alpha, *tile_sum, *poison;
    fa_key_range *ranges;
} forward_scratch;

static void *forward_scratch_alloc(forward_scratch *w, int64_t br, int64_t bc, int64_t d)
{
    const int64_t floats = (d * br + 2 * bc * d + bc * br + br * d + 7 * br + 1) & ~(int64_t)1; /* ranges 8-aligned */
    char *base = fa_host_alloc((size_t)floats * sizeof(float) + (size_t)br * sizeof(fa_key_range));
    if (!base) return NULL;
    float *f = (float *)base;
    w->qt = f; f += d * br;
    w->k = f; f += bc * d;
    w->v = f; f += bc * d;
    w->st = f; f += bc * br;
    w->o = f; f += br * d;
    w->m = f; f += br;
    w->l = f; f += br;
    w->tile_max = f; f += br;
    w->shift = f; f += br;
    w->alpha = f; f += br;
    w->tile_sum = f; f += br;
    w->poison = f;
    w->ranges = (fa_key_range *)(base + (size_t)floats * sizeof(float));
    return base;
}

/* Online-softmax step for one key tile whose raw scores are in w->st (cols x rows): new running
 * max, the shift for the exponential and the rescale factor of the accumulated output. */
static void softmax_step(const fa_cpu_kernels *kern, float scale_in_exp, int64_t rows, int64_t cols,
                         forward_scratch *w, int64_t ld)
{
    kern->col_max(w->st, ld, cols, rows, w->tile_max);
    for (int64_t r = 0; r < rows; ++r) {
        const float tile_max = w->tile_max[r] * scale_in_exp; /* -inf stays -inf (scale > 0) */
        const float m_new = w->m[r] > tile_max ? w->m[r] : tile_max;
        if (m_new == -INFINITY) { /* nothing visible in this row so far: P = 0, O stays 0 */
            w->shift[r] = INFINITY;
            w->alpha[r] = 1.0f;
            continue;
        }
        w->shift[r] = m_new;
        w->alpha[r] = expf(w->m[r] - m_new); /* 0 on the first visible tile */
        w->m[r] = m_new;
    }
    kern->exp_cols(w->st, ld, cols, rows, scale_in_exp, w->shift, w->tile_sum);
    for (int64_t r = 0; r < rows; ++r) w->l[r] = w->l[r] * w->alpha[r] + w->tile_sum[r];
}

static void forward_task(const fa_problem *p, const fa_cpu_kernels *kern, const fa_cpu_nan_inputs *nan, int64_t br,
                         int64_t bc, int64_t b, int64_t h, int64_t i0, forward_scratch *w)
{
    const int64_t d = p->head_dim, hk = h / (p->heads_q / p->heads_kv);
    const int64_t rows_n = p->seqlen_q - i0 < br ? p->seqlen_q - i0 : br;
    /* exp(scale * s - m) folds the scale into the exponential when it keeps the max (scale > 0). */
    const int fold = p->scale > 0.0f;
    const float scale_in_exp = fold ? p->scale : 1.0f;
    fa_cpu_rows rows;
    fa_cpu_rows_init(p, b, i0, rows_n, w->ranges, &rows);
    for (int64_t r = 0; r < rows_n; ++r) {
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
        w->poison[r] = nan->q && rows.range[r].hi > rows.range[r].lo && fa_cpu_row_has_nan(&p->q, b, i0 + r, h);
    }
    memset(w->o, 0, (size_t)(rows_n * d) * sizeof(float));
    if (rows.key_hi > rows.key_lo) fa_cpu_load_transposed(&p->q, b, i0, h, rows_n, w->qt, br);

    /* Key tiles start at the first visible key and stop at the last one, so a causal or window
     * mask costs only the keys these rows can see (to within one tile's rows). */
    for (int64_t j0 = fa_cpu_first_key(p, rows.key_lo, bc); j0 < rows.key_hi; j0 += bc) {
        const int64_t cols = rows.key_hi - j0 < bc ? rows.key_hi - j0 : bc;
        const fa_tile_visibility vis = fa_cpu_tile_visibility(p, &rows, j0, cols);
        if (vis == FA_TILE_EMPTY) continue; /* never loads K_j, V_j (Algorithm 5) */
        int64_t ldk, ldv;
        const float *k = fa_cpu_view_rows(&p->k, kern, b, j0, hk, cols, w->k, &ldk);
        const float *v = fa_cpu_view_rows(&p->v, kern, b, j0, hk, cols, w->v, &ldv);
        kern->gemm(cols, rows_n, d, k, ldk, 1, w->qt, br, w->st, br, NULL, 0); /* S^T = K Q^T */
        if (vis != FA_TILE_FULL || !fold) fa_cpu_scale_mask(p, &rows, j0, cols, vis, fold, w->st, br);
        softmax_step(kern, scale_in_exp, rows_n, cols, w, br);
        if (p->dropout_p > 0.0f) fa_cpu_apply_dropout(p, b, h, &rows, j0, cols, w->st, br);
        if (nan->k) fa_cpu_mark_nan_keys(p, b, hk, rows.range, i0, rows_n, j0, cols, w->poison);
        /* w->v may already hold this tile (widened): the NaN-free copy goes to the K buffer. */
        const int v_nan = nan->v && fa_cpu_copy_without_nan(v, ldv, cols, d, w->k);
        kern->gemm(rows_n, d, cols, w->st, 1, br, v_nan ? w->k : v, v_nan ? d : ldv, w->o, d, w->alpha,
                   1); /* O = alpha O + P V */
        if (v_nan) fa_cpu_poison_from_v(p, rows.range, i0, rows_n, j0, cols, v, ldv, w->o);
    }

    for (int64_t r = 0; r < rows_n; ++r) {
        const float l = w->l[r];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t c = 0; c < d; ++c) w->o[r * d + c] *= inv;
        float lse = l > 0.0f ? w->m[r] + logf(l) : -INFINITY;
        if (w->poison[r] != 0.0f) {
            for (int64_t c = 0; c < d; ++c) w->o[r * d + c] = NAN;
            lse = NAN;
        }
        if (p->lse) p->lse[(b * p->heads_q + h) * p->seqlen_q + i0 + r] = lse;
    }
    fa_cpu_store_rows(&p->out, b, i0, h, rows_n, w->o, d);
}

fa_status fa_cpu_forward(void *state, const fa_problem *p)
{
    const fa_cpu_state *s = state;
    int64_t br, bc;
    fa_cpu_problem_tiles(s, p, &br, &bc);
    const int64_t q_tiles = (p->seqlen_q + br - 1) / br;
    const int64_t tasks = p->batch * p->heads_q * q_tiles;
    const int threads = fa_cpu_thread_count(s->num_threads);
    int out_of_memory = 0;
    const fa_cpu_nan_inputs nan = fa_cpu_find_nan_inputs(p, threads);

#pragma omp parallel num_threads(threads)
    {
        forward_scratch w = {0};
        void *block = forward_scratch_alloc(&w, br, bc, p->head_dim);
        if (!block) {
#pragma omp atomic write
            out_of_memory = 1;
        }
        /* Under a causal mask later query tiles see more keys: hand them out first (longest task
         * first) and dynamically, so the threads finish together. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; ++t) {
            if (!block) continue;
            const int64_t qt = q_tiles - 1 - t / (p->batch * p->heads_q), bh = t % (p->batch * p->heads_q);
            forward_task(p, s->kernels, &nan, br, bc, bh / p->heads_q, bh % p->heads_q, qt * br, &w);
        }
        fa_host_free(block);
    }
    if (out_of_memory)
        return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "forward: cannot allocate per-thread tiles (outputs are incomplete)");
    return FA_SUCCESS;
}

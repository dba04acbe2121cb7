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

#ifndef FA_CPU_MAX_QUERY_GROUP
#define FA_CPU_MAX_QUERY_GROUP 8
#endif

/* What one query tile carries across the key tiles: Q_i^T (packed once), the unnormalised O_i
 * and the online-softmax statistics. */
typedef struct query_tile {
    float *qt, *o, *m, *l, *poison;
    fa_key_range *ranges;
    fa_cpu_rows rows;
} query_tile;

/* Per-thread memory: one K_j, V_j (and a NaN-free V_j) shared by the block's query tiles, one
 * score tile and its per-query vectors, and `group` query tiles. */
typedef struct forward_scratch {
    float *k, *v, *v_clean, *st, *tile_max, *shift, *alpha, *tile_sum;
    query_tile tiles[FA_CPU_MAX_QUERY_GROUP];
} forward_scratch;

static void *forward_scratch_alloc(forward_scratch *w, int64_t group, int64_t br, int64_t bc, int64_t d)
{
    const int64_t per_tile = 2 * br * d + 3 * br;
    const int64_t floats = (3 * bc * d + bc * br + 4 * br + group * per_tile + 1) & ~(int64_t)1; /* ranges 8-aligned */
    char *base = fa_host_alloc((size_t)floats * sizeof(float) + (size_t)(group * br) * sizeof(fa_key_range));
    if (!base) return NULL;
    float *f = (float *)base;
    w->k = f; f += bc * d;
    w->v = f; f += bc * d;
    w->v_clean = f; f += bc * d;
    w->st = f; f += bc * br;
    w->tile_max = f; f += br;
    w->shift = f; f += br;
    w->alpha = f; f += br;
    w->tile_sum = f; f += br;
    fa_key_range *ranges = (fa_key_range *)(base + (size_t)floats * sizeof(float));
    for (int64_t g = 0; g < group; ++g) {
        query_tile *t = &w->tiles[g];
        t->qt = f; f += d * br;
        t->o = f; f += br * d;
        t->m = f; f += br;
        t->l = f; f += br;
        t->poison = f; f += br;
        t->ranges = ranges + g * br;
    }
    return base;
}

/* Online-softmax step for one key tile whose raw scores are in w->st (cols x rows): new running
 * max, the shift for the exponential and the rescale factor of the accumulated output. */
static void softmax_step(const fa_cpu_kernels *kern, float scale_in_exp, int64_t rows, int64_t cols,
                         forward_scratch *w, query_tile *t, int64_t ld)
{
    kern->col_max(w->st, ld, cols, rows, w->tile_max);
    for (int64_t r = 0; r < rows; ++r) {
        const float tile_max = w->tile_max[r] * scale_in_exp; /* -inf stays -inf (scale > 0) */
        const float m_new = t->m[r] > tile_max ? t->m[r] : tile_max;
        if (m_new == -INFINITY) { /* nothing visible in this row so far: P = 0, O stays 0 */
            w->shift[r] = INFINITY;
            w->alpha[r] = 1.0f;
            continue;
        }
        w->shift[r] = m_new;
        w->alpha[r] = expf(t->m[r] - m_new); /* 0 on the first visible tile */
        t->m[r] = m_new;
    }
    kern->exp_cols(w->st, ld, cols, rows, scale_in_exp, w->shift, w->tile_sum);
    for (int64_t r = 0; r < rows; ++r) t->l[r] = t->l[r] * w->alpha[r] + w->tile_sum[r];
}

static void query_tile_begin(const fa_problem *p, const fa_cpu_nan_inputs *nan, int64_t br, int64_t b, int64_t h,
                             int64_t i0, query_tile *t)
{
    const int64_t rows_n = p->seqlen_q - i0 < br ? p->seqlen_q - i0 : br;
    fa_cpu_rows_init(p, b, i0, rows_n, t->ranges, &t->rows);
    for (int64_t r = 0; r < rows_n; ++r) {
        t->m[r] = -INFINITY;
        t->l[r] = 0.0f;
        t->poison[r] = nan->q && t->ranges[r].hi > t->ranges[r].lo && fa_cpu_row_has_nan(&p->q, b, i0 + r, h);
    }
    memset(t->o, 0, (size_t)(rows_n * p->head_dim) * sizeof(float));
    if (t->rows.key_hi > t->rows.key_lo) fa_cpu_load_transposed(&p->q, b, i0, h, rows_n, t->qt, br);
}

/* O_i = diag(1/l) O_i, the log-sum-exp, NaN poisoning, and the store. */
static void query_tile_end(const fa_problem *p, int64_t b, int64_t h, query_tile *t)
{
    const int64_t d = p->head_dim, i0 = t->rows.i0;
    for (int64_t r = 0; r < t->rows.count; ++r) {
        const float l = t->l[r];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t c = 0; c < d; ++c) t->o[r * d + c] *= inv;
        float lse = l > 0.0f ? t->m[r] + logf(l) : -INFINITY;
        if (t->poison[r] != 0.0f) {
            for (int64_t c = 0; c < d; ++c) t->o[r * d + c] = NAN;
            lse = NAN;
        }
        if (p->lse) p->lse[(b * p->heads_q + h) * p->seqlen_q + i0 + r] = lse;
    }
    fa_cpu_store_rows(&p->out, b, i0, h, t->rows.count, t->o, d);
}

/* One task: `group` consecutive query tiles of (b, h) from i0. Each key tile K_j, V_j is loaded
 * once for the whole group (the K/V traffic from memory drops by the group size), then every
 * query tile runs one online-softmax step on the keys of K_j it can see. Key tiles lie on a
 * grid of multiples of Bc, so how the keys of a row are split into tiles (and so the rounding)
 * does not depend on the group size. */
static void forward_task(const fa_problem *p, const fa_cpu_kernels *kern, const fa_cpu_nan_inputs *nan, int64_t br,
                         int64_t bc, int64_t group, int64_t b, int64_t h, int64_t i0, forward_scratch *w)
{
    const int64_t d = p->head_dim, hk = h / (p->heads_q / p->heads_kv);
    /* exp(scale * s - m) folds the scale into the exponential when it keeps the max (scale > 0). */
    const int fold = p->scale > 0.0f;
    const float scale_in_exp = fold ? p->scale : 1.0f;
    int64_t tiles = 0, key_lo = INT64_MAX, key_hi = 0;
    for (; tiles < group && i0 + tiles * br < p->seqlen_q; ++tiles) {
        query_tile *t = &w->tiles[tiles];
        query_tile_begin(p, nan, br, b, h, i0 + tiles * br, t);
        if (t->rows.key_hi <= t->rows.key_lo) continue;
        if (t->rows.key_lo < key_lo) key_lo = t->rows.key_lo;
        if (t->rows.key_hi > key_hi) key_hi = t->rows.key_hi;
    }

    /* Key tiles from the first key any row sees to the last, so a causal or window mask costs only
     * the keys these rows can see (to within one tile's rows). */
    for (int64_t j0 = key_lo < key_hi ? key_lo / bc * bc : key_hi; j0 < key_hi; j0 += bc) {
        const int64_t cols = key_hi - j0 < bc ? key_hi - j0 : bc;
        const float *k = NULL, *v = NULL;
        int64_t ldk = 0, ldv = 0;
        int v_nan = 0;
        for (int64_t g = 0; g < tiles; ++g) {
            query_tile *t = &w->tiles[g];
            const int64_t rows_n = t->rows.count;
            const int64_t lo = t->rows.key_lo > j0 ? t->rows.key_lo : j0;
            const int64_t hi = t->rows.key_hi < j0 + cols ? t->rows.key_hi : j0 + cols;
            if (hi <= lo) continue;
            const fa_tile_visibility vis = fa_cpu_tile_visibility(p, &t->rows, lo, hi - lo);
            if (vis == FA_TILE_EMPTY) continue; /* never loads K_j, V_j for it (Algorithm 5) */
            if (!k) {
                k = fa_cpu_view_rows(&p->k, kern, b, j0, hk, cols, w->k, &ldk);
                v = fa_cpu_view_rows(&p->v, kern, b, j0, hk, cols, w->v, &ldv);
                v_nan = nan->v && fa_cpu_copy_without_nan(v, ldv, cols, d, w->v_clean);
            }
            const float *k_lo = k + (lo - j0) * ldk, *v_lo = v + (lo - j0) * ldv;
            kern->gemm(hi - lo, rows_n, d, k_lo, ldk, 1, t->qt, br, w->st, br, NULL, 0); /* S^T = K Q^T */
            if (vis != FA_TILE_FULL || !fold) fa_cpu_scale_mask(p, &t->rows, lo, hi - lo, vis, fold, w->st, br);
            softmax_step(kern, scale_in_exp, rows_n, hi - lo, w, t, br);
            if (p->dropout_p > 0.0f) fa_cpu_apply_dropout(p, b, h, &t->rows, lo, hi - lo, w->st, br);
            if (nan->k) fa_cpu_mark_nan_keys(p, b, hk, t->ranges, t->rows.i0, rows_n, lo, hi - lo, t->poison);
            kern->gemm(rows_n, d, hi - lo, w->st, 1, br, v_nan ? w->v_clean + (lo - j0) * d : v_lo,
                       v_nan ? d : ldv, t->o, d, w->alpha, 1); /* O = alpha O + P V */
            if (v_nan) fa_cpu_poison_from_v(p, t->ranges, t->rows.i0, rows_n, lo, hi - lo, v_lo, ldv, t->o);
        }
    }
    for (int64_t g = 0; g < tiles; ++g) query_tile_end(p, b, h, &w->tiles[g]);
}

/* Query tiles per task: enough to cut the K/V traffic (each task loads every key tile once)
 * while leaving about 4 tasks per thread for the dynamic schedule to balance causal work. */
static int64_t query_group(const fa_problem *p, int64_t q_tiles, int threads)
{
    const int64_t heads = p->batch * p->heads_q;
    int64_t group = FA_CPU_MAX_QUERY_GROUP;
    while (group > 1 && heads * ((q_tiles + group - 1) / group) < 4 * (int64_t)threads) group /= 2;
    return group;
}

fa_status fa_cpu_forward(void *state, const fa_problem *p)
{
    const fa_cpu_state *s = state;
    int64_t br, bc;
    fa_cpu_problem_tiles(s, p, &br, &bc);
    const int64_t q_tiles = (p->seqlen_q + br - 1) / br;
    const int threads = fa_cpu_thread_count(s->num_threads);
    const int64_t group = query_group(p, q_tiles, threads);
    const int64_t blocks = (q_tiles + group - 1) / group, heads = p->batch * p->heads_q;
    const int64_t tasks = heads * blocks;
    int out_of_memory = 0;
    const fa_cpu_nan_inputs nan = fa_cpu_find_nan_inputs(p, threads);

#pragma omp parallel num_threads(threads)
    {
        forward_scratch w = {0};
        void *block = forward_scratch_alloc(&w, group, br, bc, p->head_dim);
        if (!block) {
#pragma omp atomic write
            out_of_memory = 1;
        }
        /* Under a causal mask later query tiles see more keys: hand them out first (longest task
         * first) and dynamically, so the threads finish together. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; ++t) {
            if (!block) continue;
            const int64_t qb = blocks - 1 - t / heads, bh = t % heads;
            forward_task(p, s->kernels, &nan, br, bc, group, bh / p->heads_q, bh % p->heads_q, qb * group * br, &w);
        }
        fa_host_free(block);
    }
    if (out_of_memory)
        return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "forward: cannot allocate per-thread tiles (outputs are incomplete)");
    return FA_SUCCESS;
}

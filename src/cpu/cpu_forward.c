/* Forward pass on the CPU: Algorithm 1/2 of the paper with cache-sized tiles.
 * One task per (batch, query head, query tile); each task streams the visible key/value tiles
 * through its cache, keeping the running row max m and row sum l (online softmax). Scores are
 * held transposed (S^T[key][query], see kernels/kernels.h) so the per-query statistics are vector
 * lanes; the rescale of O by exp(m_old - m_new) is folded into the P V update, and O is
 * normalised once at the end (the deferred division of FlashAttention-2, exact in arithmetic).
 * Contiguous f32 K and V are read in place (strided ones copied), f16/bf16 tiles widened once per
 * tile, except K under bf16 scores (read in place as bf16); Q^T is packed once per task and reused
 * against every key tile. Extra memory: one set of tiles per thread. */
#include <math.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "cpu_backend.h"
#include "cpu_modifiers.h"
#include "cpu_nan.h"
#include "cpu_scratch.h"
#include "cpu_tile.h"

#ifndef FA_CPU_MAX_QUERY_GROUP
#define FA_CPU_MAX_QUERY_GROUP 8
#endif

/* What one query tile carries across the key tiles: Q_i^T (packed once), the unnormalised O_i
 * and the online-softmax statistics. */
typedef struct query_tile {
    float *qt, *o, *m, *l, *poison;
    uint32_t *qt_pairs; /* Q_i^T for gemm_max_bf16 (bf16 scores only) */
    fa_key_range *ranges;
    fa_cpu_rows rows;
} query_tile;

/* Per-thread memory: one K_j, V_j (and a NaN-free V_j) shared by the block's query tiles, one
 * score tile and its per-query vectors, and `group` query tiles of br x d. */
typedef struct forward_scratch {
    int64_t group, br, bc, d, ld; /* ld: of Q^T and S^T (fa_cpu_tile_ld) */
    int bf16;                     /* S^T on bf16 pairs (fa_cpu_bf16_scores) */
    float *k, *v, *v_clean, *st, *tile_max, *shift, *alpha, *tile_sum;
    query_tile tiles[FA_CPU_MAX_QUERY_GROUP];
} forward_scratch;

static void forward_scratch_layout(fa_cpu_scratch *s, void *scratch)
{
    forward_scratch *w = scratch;
    const int64_t br = w->br, bc = w->bc, d = w->d, ld = w->ld;
    w->k = fa_cpu_scratch_floats(s, bc * d);
    w->v = fa_cpu_scratch_floats(s, bc * d);
    w->v_clean = fa_cpu_scratch_floats(s, bc * d);
    w->st = fa_cpu_scratch_floats(s, bc * ld);
    w->tile_max = fa_cpu_scratch_floats(s, br);
    w->shift = fa_cpu_scratch_floats(s, br);
    w->alpha = fa_cpu_scratch_floats(s, br);
    w->tile_sum = fa_cpu_scratch_floats(s, br);
    for (int64_t g = 0; g < w->group; ++g) {
        query_tile *t = &w->tiles[g];
        t->qt = fa_cpu_scratch_floats(s, d * ld);
        t->qt_pairs = w->bf16 ? (uint32_t *)fa_cpu_scratch_floats(s, fa_cpu_bf16_pairs_words(d, ld)) : NULL;
        t->o = fa_cpu_scratch_floats(s, br * d);
        t->m = fa_cpu_scratch_floats(s, br);
        t->l = fa_cpu_scratch_floats(s, br);
        t->poison = fa_cpu_scratch_floats(s, br);
    }
    for (int64_t g = 0; g < w->group; ++g) w->tiles[g].ranges = fa_cpu_scratch_ranges(s, br);
}

/* What every task of one forward call reads: the problem, the kernels and the tile sizes. */
typedef struct forward_ctx {
    const fa_problem *p;
    const fa_cpu_kernels *kern;
    int64_t br, bc, ld;
} forward_ctx;

static void query_tile_begin(const forward_ctx *f, int64_t b, int64_t h, int64_t i0, query_tile *t)
{
    const fa_problem *p = f->p;
    const int64_t br = f->br, rows_n = p->shape.seqlen_q - i0 < br ? p->shape.seqlen_q - i0 : br;
    fa_cpu_rows_init(p, b, i0, rows_n, t->ranges, &t->rows);
    /* A sink is a logit with no value: the running max and sum start from it. */
    const float sink = fa_cpu_sink(p, h);
    for (int64_t r = 0; r < rows_n; ++r) {
        t->m[r] = sink;
        t->l[r] = sink == -INFINITY ? 0.0f : 1.0f;
    }
    memset(t->o, 0, (size_t)(rows_n * p->shape.head_dim) * sizeof(float));
    for (int64_t r = 0; r < rows_n; ++r) t->poison[r] = 0.0f;
    if (t->rows.key_hi <= t->rows.key_lo) return; /* no row sees a key: Q_i is never read */
    /* bf16 scores read only the pairs (rows_step takes t->qt on the f32 paths alone): they come
     * straight from the bf16 rows, with no f32 Q^T (widening, transposing, packing and checking
     * it: 2.5% of a bf16 forward at N = 1024, d = 64; the words' transpose and check: 1.5%; perf,
     * Zen 4). */
    if (t->qt_pairs && fa_cpu_load_bf16_pairs(&p->q, f->kern, b, i0, h, rows_n, t->qt_pairs, f->ld)) {
        fa_cpu_nan_rows_begin_bf16_pairs(&t->rows, t->qt_pairs, f->ld, p->shape.head_dim, t->poison);
        return;
    }
    fa_cpu_load_transposed(&p->q, f->kern, b, i0, h, rows_n, t->qt, f->ld);
    fa_cpu_nan_rows_begin(&t->rows, t->qt, f->ld, p->shape.head_dim, t->poison);
    if (t->qt_pairs) fa_cpu_pack_bf16_pairs(t->qt, f->ld, rows_n, p->shape.head_dim, t->qt_pairs);
}

/* O_i = diag(1/l) O_i, the log-sum-exp, NaN poisoning, and the store. */
static void query_tile_end(const forward_ctx *f, int64_t b, int64_t h, query_tile *t)
{
    const fa_problem *p = f->p;
    const int64_t d = p->shape.head_dim, i0 = t->rows.i0;
    for (int64_t r = 0; r < t->rows.count; ++r) {
        const float l = t->l[r];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t c = 0; c < d; ++c) t->o[r * d + c] *= inv;
        float lse = l > 0.0f ? t->m[r] + logf(l) : -INFINITY;
        fa_cpu_nan_row_end(t->poison[r], t->o + r * d, d, &lse);
        if (p->outputs.lse) p->outputs.lse[fa_lse_index(p, b, h, i0 + r)] = lse;
    }
    fa_cpu_store_rows(&p->out, f->kern, b, i0, h, t->rows.count, t->o, d);
}

/* What a task's query tiles share: the problem and its (b, h), and the key tile K_j, V_j being
 * applied. */
typedef struct forward_task_ctx {
    const fa_problem *p;
    const fa_cpu_kernels *kern;
    int64_t ld, b, h, hk; /* ld: of Q^T and S^T */
    int fold;           /* exp(scale * s - m): the scale folded into the exponential (scale > 0) */
    int modified;       /* softcap, ALiBi or bias: explicit scores (no folding) */
    int fusable;        /* modified, and a fully visible tile takes its modifiers in the product (gemm_scores) */
    float scale_in_exp;
    int64_t j0;         /* the key tile: keys j0.. */
    const float *k;     /* K_j; V_j is in nan_tile (P multiplies V_j or its NaN-free copy) */
    int64_t ldk;
    const uint16_t *k_bf16; /* K_j's bf16 rows in place (stride ldk_bf16) when the scores are bf16, else NULL */
    int64_t ldk_bf16;
    fa_cpu_nan_tile nan_tile;
} forward_task_ctx;

/* The fewest query rows worth a gemm of their own: the kernels' register tile width (the query
 * rows are the columns of S^T = K Q^T), at least the tile step. */
static int64_t min_query_rows(const fa_cpu_kernels *kern) { return kern->nr > kern->tile_step ? kern->nr : kern->tile_step; }

/* The keys in [lo, hi) that rows [r0, r0 + count) of t can see, as a row set and a key range. */
static int64_t visible_span(const query_tile *t, int64_t r0, int64_t count, int64_t lo, int64_t hi,
                            fa_cpu_rows *rows, int64_t *span_lo)
{
    *rows = (fa_cpu_rows){t->rows.i0 + r0, count, t->ranges + r0, INT64_MAX, 0};
    for (int64_t r = 0; r < count; ++r) {
        const fa_key_range k = t->ranges[r0 + r];
        if (k.hi <= k.lo) continue;
        if (k.lo < rows->key_lo) rows->key_lo = k.lo;
        if (k.hi > rows->key_hi) rows->key_hi = k.hi;
    }
    *span_lo = rows->key_lo > lo ? rows->key_lo : lo;
    const int64_t span_hi = rows->key_hi < hi ? rows->key_hi : hi;
    return span_hi > *span_lo ? span_hi - *span_lo : 0;
}

/* S^T = K Q^T of a partial tile (causal or window diagonal, no block mask, no modifiers, the scale
 * folded into the exponential) and its per-query max in w->tile_max, as gemm + fa_cpu_scale_mask +
 * col_max would give them, but with the keys every row sees (all but a band of about `count` keys
 * at the diagonal) through gemm_max: no mask test and no col_max pass over them. Before, every
 * diagonal tile of a causal forward took the unfused path (at N = 1024, d = 64 all of them:
 * scale_mask and col_max were 4.5% of a one-thread causal forward, perf, Zen 4). The same products
 * (gemm_max's C is gemm's) and the same max: the same bits. Returns 0 (nothing done) when no key
 * is seen by every row. */
static int partial_scores(const forward_task_ctx *c, forward_scratch *w, const query_tile *t, int64_t r0, int64_t count,
                          const fa_cpu_rows *rows, int64_t key0, int64_t keys, const float *k)
{
    const fa_problem *p = c->p;
    const fa_cpu_kernels *kern = c->kern;
    const int64_t d = p->shape.head_dim, ld = c->ld;
    int64_t all_lo = key0, all_hi = key0 + keys; /* the keys every row sees */
    fa_cpu_rows_shared_keys(rows, &all_lo, &all_hi);
    if (all_hi - all_lo < kern->mr) return 0;
    const float *qt = t->qt + r0;
    kern->gemm_max(all_hi - all_lo, count, d, k + (all_lo - key0) * c->ldk, c->ldk, 1, qt, ld, w->st + (all_lo - key0) * ld,
                   ld, w->tile_max);
    const int64_t seg_lo[2] = {key0, all_hi}, seg_hi[2] = {all_lo, key0 + keys};
    for (int s = 0; s < 2; ++s) { /* the masked keys before and after */
        const int64_t n = seg_hi[s] - seg_lo[s];
        if (n <= 0) continue;
        float *st = w->st + (seg_lo[s] - key0) * ld, *seg_max = w->alpha; /* alpha: free until the softmax step */
        kern->gemm(n, count, d, k + (seg_lo[s] - key0) * c->ldk, c->ldk, 1, qt, ld, st, ld, NULL, 0);
        fa_cpu_scale_mask(p, rows, seg_lo[s], n, FA_TILE_PARTIAL, 1, st, ld);
        kern->col_max(st, ld, n, count, seg_max);
        for (int64_t r = 0; r < count; ++r)
            if (seg_max[r] > w->tile_max[r]) w->tile_max[r] = seg_max[r];
    }
    return 1;
}

/* One online-softmax step of rows [r0, r0 + count) of query tile t on the keys [lo, hi) of the
 * key tile. Where a causal or window diagonal crosses the rows, they are halved (down to the
 * kernels' register tile) so that each half multiplies only the keys it sees: the work spent
 * on masked scores halves with each split. The split depends on the shape only. */
static void rows_step(const forward_task_ctx *c, forward_scratch *w, query_tile *t, int64_t r0, int64_t count,
                      int64_t lo, int64_t hi)
{
    const fa_problem *p = c->p;
    const fa_cpu_kernels *kern = c->kern;
    const int64_t d = p->shape.head_dim, ld = c->ld;
    fa_cpu_rows rows;
    int64_t key0;
    const int64_t keys = visible_span(t, r0, count, lo, hi, &rows, &key0);
    if (keys == 0) return;
    const fa_tile_visibility vis = fa_cpu_tile_visibility(p, &rows, key0, keys);
    if (vis == FA_TILE_EMPTY) return; /* never touches K_j, V_j for these rows (Algorithm 5) */
    const int64_t min_rows = min_query_rows(kern);
    if (vis == FA_TILE_PARTIAL && count >= 2 * min_rows) {
        const int64_t half = (count / 2 + min_rows - 1) / min_rows * min_rows;
        fa_cpu_rows top, bottom;
        int64_t top_lo, bottom_lo;
        const int64_t top_keys = visible_span(t, r0, half, key0, key0 + keys, &top, &top_lo);
        const int64_t bottom_keys = visible_span(t, r0 + half, count - half, key0, key0 + keys, &bottom, &bottom_lo);
        if (top_keys + bottom_keys < 2 * keys) { /* the halves see fewer keys than the rows together */
            rows_step(c, w, t, r0, half, key0, key0 + keys);
            rows_step(c, w, t, r0 + half, count - half, key0, key0 + keys);
            return;
        }
    }
    const float *k = c->k ? c->k + (key0 - c->j0) * c->ldk : NULL; /* NULL: bf16 scores (k_bf16) */
    int64_t ldv;
    const float *v = fa_cpu_nan_values(&c->nan_tile, key0, d, &ldv);
    /* S^T = K Q^T. A fully visible tile with the scale folded into the exponential keeps its raw
     * scores, and a fully visible modified tile gets its modifiers in the product's registers:
     * either way the per-query max comes from the registers (no pass over S^T before the exponential). */
    const uint16_t *k_bf16 = c->k_bf16 ? c->k_bf16 + (key0 - c->j0) * c->ldk_bf16 : NULL;
    /* bf16 scores: modified tiles take the modifiers in their pass (gemm_scores is f32 only), and
     * partial tiles the unfused path (partial_scores is f32 only). */
    if (vis == FA_TILE_PARTIAL && !k_bf16 && c->fold && !c->modified && !fa_mask_has_block_mask(&p->mask) &&
        partial_scores(c, w, t, r0, count, &rows, key0, keys, k)) {
        fa_cpu_softmax_step_given_max(kern, c->scale_in_exp, count, keys, w->st, ld, t->m + r0, t->l + r0, w->tile_max,
                                      w->shift, w->alpha, w->tile_sum);
    } else if (vis == FA_TILE_FULL && (c->fold || (c->fusable && !k_bf16))) {
        if (k_bf16) {
            kern->gemm_max_bf16(keys, count, d, k_bf16, c->ldk_bf16, t->qt_pairs + r0, ld, w->st, ld, w->tile_max);
        } else if (c->modified) {
            fa_cpu_gemm_modified(p, kern, c->b, c->h, &rows, key0, keys, k, c->ldk, t->qt + r0, ld, w->st, ld, w->tile_max);
        } else {
            kern->gemm_max(keys, count, d, k, c->ldk, 1, t->qt + r0, ld, w->st, ld, w->tile_max);
        }
        fa_cpu_softmax_step_given_max(kern, c->scale_in_exp, count, keys, w->st, ld, t->m + r0, t->l + r0, w->tile_max,
                                      w->shift, w->alpha, w->tile_sum);
    } else {
        if (k_bf16) kern->gemm_max_bf16(keys, count, d, k_bf16, c->ldk_bf16, t->qt_pairs + r0, ld, w->st, ld, NULL);
        else kern->gemm(keys, count, d, k, c->ldk, 1, t->qt + r0, ld, w->st, ld, NULL, 0);
        /* Modified scores: the modifiers apply the scale and take the max in their own passes; a
         * partial tile is only masked before them (a full one not touched), so every score gets
         * the same operations in either tile, in the forward and in the backward. */
        if (!c->modified) fa_cpu_scale_mask(p, &rows, key0, keys, vis, c->fold, w->st, ld);
        else if (vis != FA_TILE_FULL) fa_cpu_scale_mask(p, &rows, key0, keys, vis, 1, w->st, ld);
        if (c->modified) {
            fa_cpu_modify_scores(p, kern, c->b, c->h, &rows, key0, keys, p->shape.scale, w->st, ld, NULL, w->tile_max);
            fa_cpu_softmax_step_given_max(kern, c->scale_in_exp, count, keys, w->st, ld, t->m + r0, t->l + r0,
                                          w->tile_max, w->shift, w->alpha, w->tile_sum);
        } else {
            fa_cpu_softmax_step(kern, c->scale_in_exp, count, keys, w->st, ld, t->m + r0, t->l + r0, w->tile_max,
                                w->shift, w->alpha, w->tile_sum);
        }
    }
    if (p->dropout.p > 0.0f) fa_cpu_apply_dropout(p, c->b, c->h, &rows, key0, keys, w->st, ld);
    kern->gemm(count, d, keys, w->st, 1, ld, v, ldv, t->o + r0 * d, d, w->alpha, 1); /* O = alpha O + P V */
    fa_cpu_nan_step(&c->nan_tile, p, &rows, key0, keys, t->poison + r0, t->o + r0 * d);
}

/* K_j, V_j of the task's (b, kv head) for keys [j0, j0 + cols), and their NaN check. With bf16
 * scores, S^T reads K_j's bf16 rows in place (k_bf16) and nothing reads an f32 K_j, so it is not
 * widened (that widening only fed the NaN check); the check scans the bf16 rows instead, which
 * now takes the cache misses the widening took (perf: about even at N = 1024, d = 64, only the f32
 * writes saved). c->k is then NULL: no path of rows_step reads an f32 K_j when k_bf16 is set. */
static void key_tile_load(forward_task_ctx *c, const forward_scratch *w, int64_t j0, int64_t cols)
{
    const fa_problem *p = c->p;
    if (w->bf16) {
        c->k_bf16 = fa_row_ptr(&p->k, c->b, j0, c->hk);
        c->ldk_bf16 = p->k.stride_seq;
        c->k = NULL;
        c->ldk = 0;
    } else {
        c->k = fa_cpu_view_rows(&p->k, c->kern, c->b, j0, c->hk, cols, w->k, &c->ldk);
    }
    int64_t ldv;
    const float *v = fa_cpu_view_rows(&p->v, c->kern, c->b, j0, c->hk, cols, w->v, &ldv);
    fa_cpu_nan_tile_begin(&c->nan_tile, p, c->b, c->hk, j0, cols, w->bf16 ? NULL : c->k, c->ldk, v, ldv,
                          w->v_clean);
}

/* One task: up to `count` (<= the scratch's group) consecutive query tiles of (b, h) from i0.
 * Each key tile K_j, V_j is loaded once for the whole group (the K/V traffic from memory drops
 * by the group size), then every query tile runs one online-softmax step on the keys of K_j it
 * can see. Key tiles lie on a grid of multiples of Bc, so how the keys of a row are split into
 * tiles (and so the rounding) does not depend on the group size. */
static void forward_task(const forward_ctx *f, int64_t b, int64_t h, int64_t i0, int64_t count, forward_scratch *w)
{
    const fa_problem *p = f->p;
    const fa_cpu_kernels *kern = f->kern;
    const int64_t br = f->br, bc = f->bc;
    forward_task_ctx c = {.p = p, .kern = kern, .ld = f->ld, .b = b, .h = h,
                          .hk = h / (p->shape.heads_q / p->shape.heads_kv), .modified = fa_modifiers_form_scores(&p->modifiers)};
    c.fold = p->shape.scale > 0.0f && !c.modified;
    c.fusable = c.modified && fa_cpu_scores_fusable(p);
    c.scale_in_exp = c.fold ? p->shape.scale : 1.0f;
    int64_t tiles = 0, key_lo = INT64_MAX, key_hi = 0;
    for (; tiles < count && i0 + tiles * br < p->shape.seqlen_q; ++tiles) {
        query_tile *t = &w->tiles[tiles];
        query_tile_begin(f, b, h, i0 + tiles * br, t);
        if (t->rows.key_hi <= t->rows.key_lo) continue;
        if (t->rows.key_lo < key_lo) key_lo = t->rows.key_lo;
        if (t->rows.key_hi > key_hi) key_hi = t->rows.key_hi;
    }

    /* Key tiles from the first key any row sees to the last, so a causal or window mask costs only
     * the keys these rows can see. */
    for (int64_t j0 = key_lo < key_hi ? key_lo / bc * bc : key_hi; j0 < key_hi; j0 += bc) {
        const int64_t cols = key_hi - j0 < bc ? key_hi - j0 : bc;
        c.j0 = j0;
        int loaded = 0;
        for (int64_t g = 0; g < tiles; ++g) {
            query_tile *t = &w->tiles[g];
            fa_cpu_rows rows;
            int64_t lo;
            const int64_t keys = visible_span(t, 0, t->rows.count, j0, j0 + cols, &rows, &lo);
            if (keys == 0 || fa_cpu_tile_visibility(p, &rows, lo, keys) == FA_TILE_EMPTY) continue;
            if (!loaded) { /* loaded once, for the first query tile that sees it */
                loaded = 1;
                key_tile_load(&c, w, j0, cols);
            }
            rows_step(&c, w, t, 0, t->rows.count, lo, lo + keys);
        }
    }
    for (int64_t g = 0; g < tiles; ++g) query_tile_end(f, b, h, &w->tiles[g]);
}

/* Query tiles per task: enough to cut the K/V traffic (each task loads every key tile once)
 * while leaving about 4 tasks per thread for the dynamic schedule to balance causal work. */
static int64_t query_group(const fa_problem *p, int64_t q_tiles, int threads)
{
    const int64_t heads = p->shape.batch * p->shape.heads_q;
    int64_t group = FA_CPU_MAX_QUERY_GROUP;
    while (group > 1 && heads * ((q_tiles + group - 1) / group) < 4 * (int64_t)threads) group /= 2;
    return group;
}

/* The forward's tasks for the dynamic schedule, longest first: `heads x blocks` blocks of `group`
 * query tiles, later query blocks first (under a causal mask they see more keys), of which the
 * last `split` are cut into TAIL_PARTS parts that come last, every split block's latest part
 * before any earlier part (so the last tasks are the shortest ones). The threads finish together
 * only if the last tasks are short: a thread that starts late or is slowed down (another job on
 * its core) would otherwise keep the others waiting for up to a whole block. A part loads K and V
 * again, so only the last blocks are cut (one per thread: at most `threads` extra K/V loads per
 * call). Which rows a task computes never changes their arithmetic (see forward_task), so
 * results stay bit-identical. */
enum { TAIL_PARTS = 2 };
typedef struct forward_schedule {
    int64_t heads, blocks, group, q_tiles, whole, split, tasks;
} forward_schedule;

static forward_schedule forward_schedule_make(int64_t heads, int64_t q_tiles, int64_t group, int threads)
{
    forward_schedule s = {.heads = heads, .blocks = (q_tiles + group - 1) / group, .group = group, .q_tiles = q_tiles};
    const int64_t blocks_all = heads * s.blocks;
    s.split = threads > 1 && group > 1 ? (threads < blocks_all ? threads : blocks_all) : 0;
    s.whole = blocks_all - s.split;
    s.tasks = s.whole + s.split * TAIL_PARTS;
    return s;
}

/* Task t: query tiles [*tile0, *tile0 + return value) of head bh = b * heads_q + h (*bh); the
 * count may be 0 (a part past the end of a short block). */
static int64_t forward_schedule_task(const forward_schedule *s, int64_t t, int64_t *bh, int64_t *tile0)
{
    const int64_t tail = t - s->whole, block = t < s->whole ? t : s->whole + tail % s->split;
    const int64_t qb = s->blocks - 1 - block / s->heads;
    int64_t first = qb * s->group, last = first + s->group < s->q_tiles ? first + s->group : s->q_tiles;
    if (t >= s->whole) { /* part TAIL_PARTS - 1 (the latest rows) of every split block first */
        const int64_t part = TAIL_PARTS - 1 - tail / s->split, size = (last - first + TAIL_PARTS - 1) / TAIL_PARTS;
        first += part * size;
        if (first + size < last) last = first + size;
    }
    *bh = block % s->heads;
    *tile0 = first;
    return last > first ? last - first : 0;
}

/* Small problems (few heads, short sequences): query tiles halved (down to the register tile)
 * until there are 8 of them, so that 2 or 4 threads all get work. A row's arithmetic does not
 * depend on Br (key tiles stay on the Bc grid; the rows are the independent columns of every
 * product), and the rule reads the shape only: results stay bit-identical across thread counts. */
static int64_t small_problem_rows(const fa_problem *p, const fa_cpu_kernels *kern, int64_t br)
{
    const int64_t heads = p->shape.batch * p->shape.heads_q, floor_rows = min_query_rows(kern);
    while (br / 2 >= floor_rows && heads * ((p->shape.seqlen_q + br - 1) / br) < 8)
        br = (br / 2 + kern->tile_step - 1) / kern->tile_step * kern->tile_step;
    return br;
}

/* The forward's query tile height: at least FORWARD_ROWS where the paper's Br (= d below Bc) gives
 * fewer, up to 8 d, not with a block mask (its tiles follow the mask blocks). Every group of query
 * tiles loads all of K and V once, and each register tile of O = alpha O + P V reuses a V panel
 * for its rows only, so taller tiles halve the strided K/V copies (and AVX2's V panel copies) per
 * FLOP. Measured (one thread, CPU time, Zen 4, old and new builds interleaved): AVX-512 d = 64
 * (Br 64 -> 128, Bc 1024): the K/V copy 9% -> 4% of a forward at N = 4096, forward 4% faster;
 * AVX2 d = 16 5-7%, d = 32 8-11%, d = 64 causal 3-6% faster, dense within the noise; d = 8 was
 * 2.5% slower with the floor (hence 8 d); d = 128 with 256 rows within the noise (left at 128).
 * Dense and causal rows keep their bits; under a sliding window a group of rows may start its
 * keys elsewhere in the key tile, which moves the P V product's k blocks (AVX2's GEMM_KC) and so
 * its rounding: still the same bits for every run and thread count. */
enum { FORWARD_ROWS = 128 };
static int64_t forward_rows(const fa_problem *p, int64_t br)
{
    return !fa_mask_has_block_mask(&p->mask) && br < FORWARD_ROWS && FORWARD_ROWS <= 8 * p->shape.head_dim ? FORWARD_ROWS : br;
}

fa_status fa_cpu_forward_dense(void *state, const fa_problem *p)
{
    const fa_cpu_state *s = state;
    int64_t br, bc;
    fa_cpu_problem_tiles(s, p, &br, &bc);
    br = small_problem_rows(p, s->kernels, forward_rows(p, br));
    const int64_t q_tiles = (p->shape.seqlen_q + br - 1) / br;
    const int threads = fa_cpu_thread_count(s->num_threads);
    const int64_t group = query_group(p, q_tiles, threads), heads = p->shape.batch * p->shape.heads_q;
    const forward_schedule plan = forward_schedule_make(heads, q_tiles, group, threads);
    const int64_t ld = fa_cpu_tile_ld(br);
    forward_scratch shape = {.group = group, .br = br, .bc = bc, .d = p->shape.head_dim, .ld = ld,
                             .bf16 = fa_cpu_bf16_scores(p, s->kernels)}; /* the pointers are set per thread */
    size_t share;
    void *team = fa_cpu_scratch_make_team(forward_scratch_layout, &shape, threads, &share);
    if (!team)
        return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "forward: cannot allocate per-thread tiles (outputs are not written)");
    const forward_ctx f = {.p = p, .kern = s->kernels, .br = br, .bc = bc, .ld = ld};

#pragma omp parallel num_threads(threads)
    {
        forward_scratch w = shape;
        fa_cpu_scratch_take(forward_scratch_layout, &w, team, share, fa_cpu_thread_num());
        /* nowait: a thread leaves after its last task, so the region's end is the only barrier
         * (with the loop's own barrier too, a thread that waited there and slept had to be woken
         * and rescheduled before the region could end: 7.6-8 ms medians at load 4-6, N 512-1024). */
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t t = 0; t < plan.tasks; ++t) {
            int64_t bh, tile0;
            const int64_t count = forward_schedule_task(&plan, t, &bh, &tile0);
            if (count) forward_task(&f, bh / p->shape.heads_q, bh % p->shape.heads_q, tile0 * br, count, &w);
        }
    }
    fa_host_scratch_free(team);
    return FA_SUCCESS;
}

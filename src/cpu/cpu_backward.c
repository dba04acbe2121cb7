/* Backward pass on the CPU: Algorithm 4 of the paper, by recomputation.
 *   D = rowsum(dO o O)                               (pre-pass, O(N) memory)
 *   per visible (query tile i, key tile j):  P = exp(tau S - lse), Z = dropout(P),
 *   dV_j += Z^T dO_i,  dP = dropout(dO_i V_j^T),  dS = P o (dP - D_i),
 *   dK_j += tau dS^T Q_i,  dQ_i += tau dS K_j.
 * Tiles are transposed (S^T, dS^T: key rows, query columns; see kernels/kernels.h), so P^T and
 * dS^T multiply dO and Q directly and dS K reads dS^T with swapped strides.
 * Race-free and deterministic, with no atomic additions and no reduction, in one of two ways chosen from
 * the problem's shape alone (never the thread count, so results do not depend on it):
 *   fused (enough tasks, see backward_path_for): the five tile products of Algorithm 4 per tile pair,
 *     dK_j, dV_j accumulated over the query heads and query tiles of a (batch, kv head), and dQ_i
 *     of those heads over key tiles in increasing order. Chained (f32 dQ in place, or f16/bf16
 *     dQ in one f32 buffer of the whole dQ of at most 32 MiB): one task per key tile; the tasks
 *     of one (batch, kv head) may run on different threads at once, and a task adds its share of
 *     dQ_i only after the previous key tile's task has added its own (dq_chain), so every dQ_i
 *     still takes its key tiles in increasing order. Otherwise (f16/bf16 dQ, larger): one task
 *     per (batch, kv head), dQ in a per-thread f32 buffer of group x Nq x d floats;
 *   two-pass (too few pairs to keep the threads busy, or a dQ buffer too large): pass 1 owns one
 *     key tile per task (dK, dV), pass 2 one query tile per task and recomputes S, P and dP to
 *     accumulate dQ (seven tile products per pair instead of five). */
#include <math.h>
#include <sched.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "cpu_backend.h"
#include "cpu_modifiers.h"
#include "cpu_scratch.h"
#include "cpu_tile.h"

/* What every task of one backward call reads: the problem, the kernels, D and the tile sizes. */
typedef struct backward_ctx {
    const fa_problem *p;
    const fa_cpu_kernels *kern;
    const float *delta; /* D = rowsum(dO o O), [batch, heads_q, seqlen_q] */
    int64_t br, bc, ld; /* ld: of the key-major tiles (fa_cpu_tile_ld) */
} backward_ctx;

/* Per-thread memory: the query side (Q_i, dO_i as rows and transposed), one key tile, the score
 * tiles, two accumulators and the per-query vectors; dbias_acc only when dbias is wanted. */
typedef struct backward_scratch {
    int64_t br, bc, d, ld, bias_floats;
    int bf16;          /* S^T on bf16 pairs, as the forward (fa_cpu_bf16_scores) */
    uint32_t *qt_pairs; /* Q_i^T for gemm_max_bf16 (bf16 scores only) */
    float *q, *dout, *qt, *dout_t, *k, *v, *st, *dst, *acc_a, *acc_b, *shift, *delta, *sum;
    float *cap_grad;  /* d score / d (scaled q.k) of the tile under a softcap: Bc x Br */
    float *dbias_acc; /* the dbias pass's f32 tile, or NULL */
    const float *q_rows, *dout_rows; /* Q_i, dO_i as f32 rows (in place or converted) */
    int64_t ldq, lddo;
    fa_key_range *ranges;
} backward_scratch;

static void backward_scratch_layout(fa_cpu_scratch *s, void *scratch)
{
    backward_scratch *w = scratch;
    const int64_t br = w->br, bc = w->bc, d = w->d, ld = w->ld, acc = (br > bc ? br : bc) * d;
    w->q = fa_cpu_scratch_floats(s, br * d);
    w->dout = fa_cpu_scratch_floats(s, br * d);
    w->qt = fa_cpu_scratch_floats(s, d * ld);
    w->qt_pairs = w->bf16 ? (uint32_t *)fa_cpu_scratch_floats(s, fa_cpu_bf16_pairs_words(d, ld)) : NULL;
    w->dout_t = fa_cpu_scratch_floats(s, d * ld);
    w->k = fa_cpu_scratch_floats(s, bc * d);
    w->v = fa_cpu_scratch_floats(s, bc * d);
    w->st = fa_cpu_scratch_floats(s, bc * ld);
    w->dst = fa_cpu_scratch_floats(s, bc * ld);
    w->cap_grad = fa_cpu_scratch_floats(s, bc * ld);
    w->acc_a = fa_cpu_scratch_floats(s, acc);
    w->acc_b = fa_cpu_scratch_floats(s, acc);
    w->shift = fa_cpu_scratch_floats(s, br);
    w->delta = fa_cpu_scratch_floats(s, br);
    w->sum = fa_cpu_scratch_floats(s, br);
    w->ranges = fa_cpu_scratch_ranges(s, br);
    w->dbias_acc = w->bias_floats ? fa_cpu_scratch_floats(s, w->bias_floats) : NULL;
}

/* Key tile K_j, V_j of (b, kv head hk) as f32 rows: keys [j0, j0 + cols). */
typedef struct key_tile {
    int64_t j0, cols;
    const float *k, *v;
    int64_t ldk, ldv;
    const uint16_t *k_bf16; /* K_j's bf16 rows in place when the scores are bf16, else NULL */
    int64_t ldk_bf16;
} key_tile;

static key_tile load_key_tile(const backward_ctx *c, int64_t b, int64_t hk, int64_t j0, int64_t cols,
                              backward_scratch *w)
{
    key_tile t = {.j0 = j0, .cols = cols};
    t.k = fa_cpu_view_rows(&c->p->k, c->kern, b, j0, hk, cols, w->k, &t.ldk);
    t.v = fa_cpu_view_rows(&c->p->v, c->kern, b, j0, hk, cols, w->v, &t.ldv);
    if (w->bf16) {
        t.k_bf16 = fa_row_ptr(&c->p->k, b, j0, hk);
        t.ldk_bf16 = c->p->k.stride_seq;
    }
    return t;
}

/* The keys [lo, hi) of a loaded tile. */
static key_tile key_subtile(const key_tile *t, int64_t lo, int64_t hi)
{
    return (key_tile){lo, hi - lo, t->k + (lo - t->j0) * t->ldk, t->v + (lo - t->j0) * t->ldv, t->ldk, t->ldv,
                      t->k_bf16 ? t->k_bf16 + (lo - t->j0) * t->ldk_bf16 : NULL, t->ldk_bf16};
}

/* Loads the query side of (b, h, rows): Q and dO as rows and transposed, the exponential's shift
 * (lse, or +inf for a row that sees no key so that P = 0) and D. */
static void load_query_side(const backward_ctx *c, int64_t b, int64_t h, const fa_cpu_rows *rows,
                            backward_scratch *w)
{
    const fa_problem *p = c->p;
    const int64_t base = (b * p->shape.heads_q + h) * p->shape.seqlen_q + rows->i0, lse_base = fa_lse_index(p, b, h, rows->i0);
    w->q_rows = fa_cpu_view_rows(&p->q, c->kern, b, rows->i0, h, rows->count, w->q, &w->ldq);
    w->dout_rows = fa_cpu_view_rows(&p->dout, c->kern, b, rows->i0, h, rows->count, w->dout, &w->lddo);
    /* Transposed from those f32 rows, not from the tensors: f16/bf16 rows are widened once, not
     * twice, and strided f32 rows are read from the contiguous copy just made (the same bits:
     * a transpose only moves them). */
    /* bf16 scores read only the pairs (tile_gradients): from the bf16 rows where they can */
    if (!w->qt_pairs || !fa_cpu_load_bf16_pairs(&p->q, c->kern, b, rows->i0, h, rows->count, w->qt_pairs, c->ld)) {
        c->kern->transpose(w->q_rows, w->ldq, rows->count, p->shape.head_dim, w->qt, c->ld);
        if (w->qt_pairs) fa_cpu_pack_bf16_pairs(w->qt, c->ld, rows->count, p->shape.head_dim, w->qt_pairs);
    }
    c->kern->transpose(w->dout_rows, w->lddo, rows->count, p->shape.head_dim, w->dout_t, c->ld);
    for (int64_t r = 0; r < rows->count; ++r) {
        w->shift[r] = p->outputs.lse[lse_base + r] == -INFINITY ? INFINITY : p->outputs.lse[lse_base + r];
        w->delta[r] = c->delta[base + r];
    }
}

/* What tile_gradients leaves in w->dst: the gradient of the final scores (what the bias receives),
 * or of the scaled q.k (what dQ and dK need: through the softcap's derivative). */
enum ds_of { DS_OF_SCORES, DS_OF_QK };

/* For the loaded query side of (b, h) and the key tile kt: w->st = dropout(P)^T (the Z of the
 * paper, what multiplied V in the forward), w->dst = dS^T. */
static void tile_gradients(const backward_ctx *c, int64_t b, int64_t h, const fa_cpu_rows *rows, const key_tile *kt,
                           fa_tile_visibility vis, enum ds_of of, backward_scratch *w)
{
    const fa_problem *p = c->p;
    const fa_cpu_kernels *kern = c->kern;
    const int64_t d = p->shape.head_dim, n = rows->count, ld = c->ld, j0 = kt->j0, cols = kt->cols;
    const int modified = fa_modifiers_form_scores(&p->modifiers), fold = p->shape.scale > 0.0f && !modified;
    const int chain = of == DS_OF_QK && p->modifiers.softcap > 0.0f, dropout = p->dropout.p > 0.0f;
    if (kt->k_bf16) /* S^T = K Q^T, with the forward's product */
        kern->gemm_max_bf16(cols, n, d, kt->k_bf16, kt->ldk_bf16, w->qt_pairs, ld, w->st, ld, NULL);
    else
        kern->gemm(cols, n, d, kt->k, kt->ldk, 1, w->qt, ld, w->st, ld, NULL, 0);
    /* As the forward: modified scores are masked only, the modifiers apply the scale (the same bits). */
    if (!modified && (vis != FA_TILE_FULL || !fold)) fa_cpu_scale_mask(p, rows, j0, cols, vis, fold, w->st, ld);
    if (modified && vis != FA_TILE_FULL) fa_cpu_scale_mask(p, rows, j0, cols, vis, 1, w->st, ld);
    if (modified)
        fa_cpu_modify_scores(p, kern, b, h, rows, j0, cols, p->shape.scale, w->st, ld, chain ? w->cap_grad : NULL, NULL);
    /* Its own pass, not in S^T's epilogue: in the registers of a 12 x 32 tile the exponential
     * measured 1.5% slower than gemm + exp_cols (checkasm, Zen 4) and no faster in the backward. */
    kern->exp_cols(w->st, ld, cols, n, fold ? p->shape.scale : 1.0f, w->shift, w->sum);
    if (!dropout && !chain) { /* dS^T = P^T o (V dO^T - D) in the product's registers */
        kern->gemm_ds(cols, n, d, kt->v, kt->ldv, 1, w->dout_t, ld, w->dst, ld, w->st, ld, w->delta);
        return;
    }
    kern->gemm(cols, n, d, kt->v, kt->ldv, 1, w->dout_t, ld, w->dst, ld, NULL, 0); /* dP^T = V dO^T */
    /* dS = P o (dropout(dP) - D) uses P undropped; dV then needs Z = dropout(P). */
    if (dropout) fa_cpu_apply_dropout(p, b, h, rows, j0, cols, w->dst, ld);
    for (int64_t x = 0; x < cols; ++x) { /* simple loops over the query lanes: they vectorize */
        const float *px = w->st + x * ld, *grad = w->cap_grad + x * ld;
        float *dsx = w->dst + x * ld;
        if (chain) /* through the softcap: times softcap_cols' 1 - tanh^2, in the same pass */
            for (int64_t r = 0; r < n; ++r) dsx[r] = px[r] * (dsx[r] - w->delta[r]) * grad[r];
        else
            for (int64_t r = 0; r < n; ++r) dsx[r] = px[r] * (dsx[r] - w->delta[r]);
    }
    if (dropout) fa_cpu_apply_dropout(p, b, h, rows, j0, cols, w->st, ld);
}

/* The query tile of (b) from i0 and the keys of [j0, j0 + cols) its rows can see: [*lo, *hi),
 * and how visible that span is (EMPTY when it is empty). */
static fa_tile_visibility tile_span(const backward_ctx *c, int64_t b, int64_t i0, int64_t j0, int64_t cols,
                                    backward_scratch *w, fa_cpu_rows *rows, int64_t *lo, int64_t *hi)
{
    const fa_problem *p = c->p;
    fa_cpu_rows_init(p, b, i0, p->shape.seqlen_q - i0 < c->br ? p->shape.seqlen_q - i0 : c->br, w->ranges, rows);
    *lo = rows->key_lo > j0 ? rows->key_lo : j0;
    *hi = rows->key_hi < j0 + cols ? rows->key_hi : j0 + cols;
    return *hi > *lo ? fa_cpu_tile_visibility(p, rows, *lo, *hi - *lo) : FA_TILE_EMPTY;
}

/* Where dQ_i of query head h accumulates in the fused path: the f32 dQ tensor itself, or for
 * an f16/bf16 dQ an f32 buffer: [batch][heads_q][Nq][d] for the chained tasks (whole), else a
 * per-thread [group][Nq][d] for one (batch, kv head) at a time. */
typedef struct dq_target {
    float *buffer; /* NULL: accumulate in place in p->dq (f32) */
    int whole;     /* buffer holds every (batch, query head) */
} dq_target;

static float *dq_rows(const fa_problem *p, const dq_target *t, int64_t b, int64_t h, int64_t i0, int64_t *ld)
{
    if (!t->buffer) {
        *ld = p->dq.stride_seq;
        return fa_row_ptr(&p->dq, b, i0, h);
    }
    const int64_t group = p->shape.heads_q / p->shape.heads_kv, slot = t->whole ? b * p->shape.heads_q + h : h % group;
    *ld = p->shape.head_dim;
    return t->buffer + (slot * p->shape.seqlen_q + i0) * p->shape.head_dim;
}

/* A key tile's place in the fused path's dQ accumulation: the first key tile zeroes each step's
 * (query head, query tile) dQ rows, the last scales them (and converts them into an f16/bf16 dQ
 * from the f32 buffer). When one (batch, kv head)'s key tiles are separate tasks (chained), a key
 * tile's task also counts in *done the steps whose dQ it has finished, in its loop order, and the
 * next key tile's task waits for that count before adding its own share of the same step. A task
 * waits only for tasks handed out before it (the schedule hands out every (batch, kv head)'s key
 * tiles in increasing order), which never wait for a later task: no deadlock. The waits are rare:
 * the schedule hands out the first key tile of every (batch, kv head) before any second one. One
 * task running a pair's key tiles in turn needs no counts (prev and done NULL). */
typedef struct dq_chain {
    const int64_t *prev; /* the previous key tile's count, or NULL: nothing to wait for */
    int64_t *done;       /* this key tile's count, or NULL */
    int first, last;     /* the first key tile zeroes dQ, the last scales (and stores) it */
} dq_chain;

static void dq_chain_wait(const dq_chain *chain, int64_t steps)
{
    if (chain->prev)
        while (__atomic_load_n(chain->prev, __ATOMIC_ACQUIRE) < steps) sched_yield();
}

/* dK_j, dV_j for one (batch, kv head, key tile); with dq (and its chain, the fused path), also
 * dQ_i += dS K_j into the fused path's accumulator for every query tile this key tile touches, in
 * dq_chain's order. */
static void key_tile_task(const backward_ctx *c, int64_t b, int64_t hk, int64_t j0, const dq_target *dq,
                          const dq_chain *chain, backward_scratch *w)
{
    const fa_problem *p = c->p;
    const fa_cpu_kernels *kern = c->kern;
    const int64_t d = p->shape.head_dim, group = p->shape.heads_q / p->shape.heads_kv, br = c->br, ld = c->ld;
    const int64_t cols = p->shape.seqlen_k - j0 < c->bc ? p->shape.seqlen_k - j0 : c->bc;
    float *dk = w->acc_a, *dv = w->acc_b;
    memset(dk, 0, (size_t)(cols * d) * sizeof(float));
    memset(dv, 0, (size_t)(cols * d) * sizeof(float));
    const key_tile tile = load_key_tile(c, b, hk, j0, cols, w);
    int64_t step = 0;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t i0 = 0; i0 < p->shape.seqlen_q; i0 += br, ++step) {
            fa_cpu_rows rows;
            int64_t lo, hi;
            const fa_tile_visibility vis = tile_span(c, b, i0, j0, cols, w, &rows, &lo, &hi);
            if (vis == FA_TILE_EMPTY && !dq) continue;
            const key_tile kt = vis != FA_TILE_EMPTY ? key_subtile(&tile, lo, hi) : tile;
            if (vis != FA_TILE_EMPTY) {
                load_query_side(c, b, h, &rows, w);
                tile_gradients(c, b, h, &rows, &kt, vis, DS_OF_QK, w);
                kern->gemm(kt.cols, d, rows.count, w->st, ld, 1, w->dout_rows, w->lddo, dv + (lo - j0) * d, d, NULL,
                           1); /* dV += Z^T dO */
                kern->gemm(kt.cols, d, rows.count, w->dst, ld, 1, w->q_rows, w->ldq, dk + (lo - j0) * d, d, NULL,
                           1); /* dK += dS^T Q */
            }
            if (!dq) continue;
            int64_t lddq;
            float *dq_i = dq_rows(p, dq, b, h, i0, &lddq);
            const int64_t n = p->shape.seqlen_q - i0 < br ? p->shape.seqlen_q - i0 : br;
            dq_chain_wait(chain, step + 1);
            for (int64_t r = 0; chain->first && r < n; ++r) memset(dq_i + r * lddq, 0, (size_t)d * sizeof(float));
            if (vis != FA_TILE_EMPTY) /* dQ += dS K */
                kern->gemm(rows.count, d, kt.cols, w->dst, 1, ld, kt.k, kt.ldk, dq_i, lddq, NULL, 1);
            for (int64_t r = 0; chain->last && r < n; ++r)
                for (int64_t x = 0; x < d; ++x) dq_i[r * lddq + x] *= p->shape.scale;
            if (chain->last && dq->buffer) fa_cpu_store_rows(&p->dq, kern, b, i0, h, n, dq_i, lddq);
            if (chain->done) __atomic_store_n(chain->done, step + 1, __ATOMIC_RELEASE);
        }
    }
    for (int64_t x = 0; x < cols * d; ++x) dk[x] *= p->shape.scale;
    fa_cpu_store_rows(&p->dk, kern, b, j0, hk, cols, dk, d);
    fa_cpu_store_rows(&p->dv, kern, b, j0, hk, cols, dv, d);
}

/* Fused path, per pair: dK, dV and dQ of one (batch, kv head) and its query heads, its key tiles
 * in turn (dQ_i sums them in increasing order, whatever thread runs the task). */
static void kv_head_task(const backward_ctx *c, int64_t b, int64_t hk, const dq_target *dq, backward_scratch *w)
{
    for (int64_t j0 = 0; j0 < c->p->shape.seqlen_k; j0 += c->bc) {
        const dq_chain order = {.first = j0 == 0, .last = j0 + c->bc >= c->p->shape.seqlen_k};
        key_tile_task(c, b, hk, j0, dq, &order, w);
    }
}

/* Pass 2: dQ_i for one (batch, query head, query tile). */
static void query_tile_task(const backward_ctx *c, int64_t b, int64_t h, int64_t i0, backward_scratch *w)
{
    const fa_problem *p = c->p;
    const int64_t d = p->shape.head_dim, hk = h / (p->shape.heads_q / p->shape.heads_kv), br = c->br, bc = c->bc, ld = c->ld;
    fa_cpu_rows rows;
    fa_cpu_rows_init(p, b, i0, p->shape.seqlen_q - i0 < br ? p->shape.seqlen_q - i0 : br, w->ranges, &rows);
    float *dq = w->acc_a;
    memset(dq, 0, (size_t)(rows.count * d) * sizeof(float));
    if (rows.key_hi > rows.key_lo) load_query_side(c, b, h, &rows, w);
    /* Key tiles start at the first visible key and stop at the last one, so a causal or window
     * mask costs only the keys these rows can see (to within one tile's rows). */
    for (int64_t j0 = fa_cpu_first_key(p, rows.key_lo, bc); j0 < rows.key_hi; j0 += bc) {
        const int64_t cols = rows.key_hi - j0 < bc ? rows.key_hi - j0 : bc;
        const fa_tile_visibility vis = fa_cpu_tile_visibility(p, &rows, j0, cols);
        if (vis == FA_TILE_EMPTY) continue;
        const key_tile kt = load_key_tile(c, b, hk, j0, cols, w);
        tile_gradients(c, b, h, &rows, &kt, vis, DS_OF_QK, w);
        c->kern->gemm(rows.count, d, cols, w->dst, 1, ld, kt.k, kt.ldk, dq, d, NULL, 1); /* dQ += dS K */
    }
    for (int64_t x = 0; x < rows.count * d; ++x) dq[x] *= p->shape.scale;
    fa_cpu_store_rows(&p->dq, c->kern, b, i0, h, rows.count, dq, d);
}

/* dbias pass: one task per distinct row block of dbias: (its batch, its head, its query tile),
 * with a broadcast axis folded into the task, which sums over it (batches, then heads, then query
 * tiles, then rows, in increasing order). It recomputes P and dS per tile pair (two tile
 * products) and accumulates them in the f32 tile w->dbias_acc, then stores every key tile,
 * visible or not, so every element of dbias's extent is written. */
static void bias_task(const backward_ctx *c, int64_t task, backward_scratch *w)
{
    const fa_problem *p = c->p;
    const fa_bias *db = &p->outputs.dbias;
    const int64_t br = c->br, bc = c->bc, ld = c->ld;
    float *acc = w->dbias_acc;
    const int64_t q_tiles = (p->shape.seqlen_q + br - 1) / br, group = p->shape.heads_q / p->shape.heads_kv;
    const int64_t task_tiles = db->stride_q ? q_tiles : 1, task_heads = db->stride_head ? p->shape.heads_q : 1;
    const int64_t qt = task % task_tiles, oh = task / task_tiles % task_heads, ob = task / (task_tiles * task_heads);
    const int64_t b_lo = db->stride_batch ? ob : 0, b_hi = db->stride_batch ? ob + 1 : p->shape.batch;
    const int64_t h_lo = db->stride_head ? oh : 0, h_hi = db->stride_head ? oh + 1 : p->shape.heads_q;
    const int64_t t_lo = db->stride_q ? qt : 0, t_hi = db->stride_q ? qt + 1 : q_tiles;
    const int64_t out_rows = db->stride_q ? (p->shape.seqlen_q - qt * br < br ? p->shape.seqlen_q - qt * br : br) : 1;
    for (int64_t j0 = 0; j0 < p->shape.seqlen_k; j0 += bc) {
        const int64_t cols = p->shape.seqlen_k - j0 < bc ? p->shape.seqlen_k - j0 : bc;
        memset(acc, 0, (size_t)(out_rows * bc) * sizeof(float));
        for (int64_t b = b_lo; b < b_hi; ++b)
            for (int64_t h = h_lo; h < h_hi; ++h)
                for (int64_t t = t_lo; t < t_hi; ++t) {
                    fa_cpu_rows rows;
                    int64_t lo, hi;
                    const fa_tile_visibility vis = tile_span(c, b, t * br, j0, cols, w, &rows, &lo, &hi);
                    if (vis == FA_TILE_EMPTY) continue;
                    const key_tile kt = load_key_tile(c, b, h / group, lo, hi - lo, w);
                    load_query_side(c, b, h, &rows, w);
                    tile_gradients(c, b, h, &rows, &kt, vis, DS_OF_SCORES, w);
                    for (int64_t r = 0; r < rows.count; ++r) {
                        float *out = acc + (db->stride_q ? r : 0) * bc + (lo - j0);
                        for (int64_t x = 0; x < hi - lo; ++x) out[x] += w->dst[x * ld + r];
                    }
                }
        for (int64_t r = 0; r < out_rows; ++r) fa_cpu_store_bias_row(db, ob, oh, qt * br + r, j0, acc + r * bc, cols);
    }
}

/* D_x = rowsum(dO o O) of one row x = (b, h, i), accumulated in double. */
static float row_delta(const backward_ctx *c, int64_t x, backward_scratch *w)
{
    const fa_problem *p = c->p;
    const int64_t i = x % p->shape.seqlen_q, h = (x / p->shape.seqlen_q) % p->shape.heads_q, b = x / (p->shape.seqlen_q * p->shape.heads_q);
    int64_t ld;
    const float *o = fa_cpu_view_rows(&p->out, c->kern, b, i, h, 1, w->q, &ld);
    const float *dout = fa_cpu_view_rows(&p->dout, c->kern, b, i, h, 1, w->dout, &ld);
    double sum = 0.0;
    for (int64_t col = 0; col < p->shape.head_dim; ++col) sum += (double)o[col] * (double)dout[col];
    return (float)sum;
}
/* The fused path needs enough tasks to keep a few threads busy (with fewer, the two-pass path's
 * finer tasks win despite its two extra products): chained, the key tiles of every (batch, kv
 * head) (dq_chain), with an f16/bf16 dQ accumulated in one f32 buffer of the whole dQ; per pair,
 * the (batch, kv heads) themselves, each with a per-thread f32 buffer of one pair's dQ. Buffers
 * of at most FUSED_MAX_DQ_BUFFER_BYTES. Decided from the shape (and the tiles) only, so the
 * arithmetic never depends on the thread count. */
enum { FUSED_MIN_TASKS = 8 };
#define FUSED_MAX_DQ_BUFFER_BYTES ((int64_t)32 << 20)
typedef enum backward_path { PATH_TWO_PASS, PATH_CHAINED, PATH_PAIRS } backward_path;

static backward_path backward_path_for(const fa_problem *p, int64_t k_tiles, int64_t *dq_buffer_floats)
{
    const int64_t pairs = p->shape.batch * p->shape.heads_kv, max_floats = FUSED_MAX_DQ_BUFFER_BYTES / (int64_t)sizeof(float);
    const int64_t whole = p->shape.batch * p->shape.heads_q * p->shape.seqlen_q * p->shape.head_dim;
    const int64_t pair = p->shape.heads_q / p->shape.heads_kv * p->shape.seqlen_q * p->shape.head_dim;
    const int f32 = p->dq.dtype == FA_DTYPE_F32;
    *dq_buffer_floats = 0;
    if ((f32 || whole <= max_floats) && pairs * k_tiles >= FUSED_MIN_TASKS) {
        *dq_buffer_floats = f32 ? 0 : whole;
        return PATH_CHAINED;
    }
    if (!f32 && pairs >= FUSED_MIN_TASKS && pair <= max_floats) {
        *dq_buffer_floats = pair;
        return PATH_PAIRS;
    }
    return PATH_TWO_PASS;
}

fa_status fa_cpu_backward_dense(void *state, const fa_problem *p)
{
    const fa_cpu_state *s = state;
    int64_t br, bc;
    fa_cpu_problem_tiles(s, p, &br, &bc);
    const int threads = fa_cpu_thread_count(s->num_threads);
    float *delta = fa_host_scratch_alloc((size_t)(p->shape.batch * p->shape.heads_q * p->shape.seqlen_q) * sizeof(float));
    if (!delta) return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "backward: cannot allocate D (%lld floats)",
                                    (long long)(p->shape.batch * p->shape.heads_q * p->shape.seqlen_q));
    const int64_t k_tiles = (p->shape.seqlen_k + bc - 1) / bc, q_tiles = (p->shape.seqlen_q + br - 1) / br;
    const int64_t kv_pairs = p->shape.batch * p->shape.heads_kv, q_pairs = p->shape.batch * p->shape.heads_q;
    int64_t dq_buffer_floats;
    const backward_path path = backward_path_for(p, k_tiles, &dq_buffer_floats);
    const int64_t ld = fa_cpu_tile_ld(br);
    const backward_ctx c = {.p = p, .kern = s->kernels, .delta = delta, .br = br, .bc = bc, .ld = ld};
    const fa_bias *db = &p->outputs.dbias;
    const int64_t bias_tasks = !db->data ? 0 : (db->stride_batch ? p->shape.batch : 1) * (db->stride_head ? p->shape.heads_q : 1) *
                                                   (db->stride_q ? q_tiles : 1);
    int out_of_memory = 0;
    /* Chained: one task per key tile, dQ updates in dq_chain's order, an f16/bf16 dQ in one
     * buffer of the whole dQ (k_tiles >= 1: FUSED_MIN_TASKS counts them). */
    const int chained = path == PATH_CHAINED;
    int64_t *chain_done = chained ? fa_host_calloc((size_t)(kv_pairs * k_tiles), sizeof(int64_t)) : NULL;
    float *whole_dq =
        chained && dq_buffer_floats ? fa_host_scratch_alloc((size_t)dq_buffer_floats * sizeof(float)) : NULL;
    if (chained && (!chain_done || (dq_buffer_floats && !whole_dq))) {
        fa_host_free(chain_done);
        fa_host_scratch_free(whole_dq);
        fa_host_scratch_free(delta);
        return fa_set_error(FA_ERROR_OUT_OF_MEMORY,
                            "backward: cannot allocate the dQ order (%lld counters) or the f32 dQ (%lld floats)",
                            (long long)(kv_pairs * k_tiles), (long long)dq_buffer_floats);
    }
    int64_t next_task = 0;

#pragma omp parallel num_threads(threads)
    {
        backward_scratch w = {.br = br, .bc = bc, .d = p->shape.head_dim, .ld = ld, .bias_floats = bias_tasks ? br * bc : 0,
                              .bf16 = fa_cpu_bf16_scores(p, c.kern)};
        void *block = fa_cpu_scratch_make(backward_scratch_layout, &w);
        const int needs_dq_buffer = path == PATH_PAIRS; /* per thread */
        dq_target dq = {whole_dq, whole_dq != NULL};
        if (block && needs_dq_buffer) dq.buffer = fa_host_scratch_alloc((size_t)dq_buffer_floats * sizeof(float));
        /* The tasks read every thread's share of D, and a failed call writes no gradient. */
        if (fa_cpu_team_ready(block && (dq.buffer || !needs_dq_buffer), &out_of_memory)) {
#pragma omp for schedule(static)
            for (int64_t x = 0; x < p->shape.batch * p->shape.heads_q * p->shape.seqlen_q; ++x) delta[x] = row_delta(&c, x, &w);
            /* After D, the passes write disjoint outputs (dQ, dK, dV, dbias) and read only the
             * inputs and D: no barrier between them (nowait), a thread goes on to the next pass's
             * tasks; the region's end is the one barrier left. */
            if (chained) {
                /* Tasks handed out in increasing order (one atomic counter: dq_chain relies on
                 * it), every pair's first key tile before any second one: longest first under a
                 * causal mask, and a task rarely waits for its previous key tile. */
                for (;;) {
                    const int64_t t = __atomic_fetch_add(&next_task, 1, __ATOMIC_RELAXED);
                    if (t >= kv_pairs * k_tiles) break;
                    const int64_t pair = t % kv_pairs, tile = t / kv_pairs;
                    const dq_chain chain = {.prev = tile ? chain_done + pair * k_tiles + tile - 1 : NULL,
                                            .done = chain_done + pair * k_tiles + tile,
                                            .first = tile == 0, .last = tile == k_tiles - 1};
                    key_tile_task(&c, pair / p->shape.heads_kv, pair % p->shape.heads_kv, tile * bc, &dq, &chain, &w);
                }
            } else if (path == PATH_PAIRS) {
#pragma omp for schedule(dynamic, 1) nowait
                for (int64_t t = 0; t < kv_pairs; ++t) kv_head_task(&c, t / p->shape.heads_kv, t % p->shape.heads_kv, &dq, &w);
            } else {
                /* Longest tasks first under a causal mask: early key tiles, late query tiles. */
#pragma omp for schedule(dynamic, 1) nowait
                for (int64_t t = 0; t < kv_pairs * k_tiles; ++t) {
                    const int64_t kt = t / kv_pairs, bh = t % kv_pairs;
                    key_tile_task(&c, bh / p->shape.heads_kv, bh % p->shape.heads_kv, kt * bc, NULL, NULL, &w);
                }
#pragma omp for schedule(dynamic, 1) nowait
                for (int64_t t = 0; t < q_pairs * q_tiles; ++t) {
                    const int64_t qt = q_tiles - 1 - t / q_pairs, bh = t % q_pairs;
                    query_tile_task(&c, bh / p->shape.heads_q, bh % p->shape.heads_q, qt * br, &w);
                }
            }
#pragma omp for schedule(dynamic, 1) nowait
            for (int64_t t = 0; t < bias_tasks; ++t) bias_task(&c, t, &w);
        }
        if (needs_dq_buffer) fa_host_scratch_free(dq.buffer);
        fa_host_scratch_free(block);
    }
    fa_host_scratch_free(delta);
    fa_host_free(chain_done);
    fa_host_scratch_free(whole_dq);
    if (out_of_memory)
        return fa_set_error(FA_ERROR_OUT_OF_MEMORY,
                            "backward: cannot allocate per-thread tiles (dq, dk, dv and dbias are not written)");
    return FA_SUCCESS;
}

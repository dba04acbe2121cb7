/* fa_forward_kvcache on the CPU: append k_new/v_new into the cache, then attention of a few query
 * rows against a long (possibly paged) cache.
 * - GQA packing: the query rows of one kv head's group (group heads x seqlen_q positions, up to
 *   DECODE_ROWS) form one tile, so each kv head's keys and values are read once per call, not
 *   once per query head. A task walks its keys tile by tile; S^T = K Q^T of every kv head is one
 *   decode_scores call and O = alpha O + P V one decode_values call (kernels.h), which read K and
 *   V in place from the cache (f16/bf16 widened in registers, no staging copy), a few keys of
 *   every head at a time; one online-softmax step covers the rows of all kv heads (full vectors
 *   with few rows per head).
 * - Four streams: the keys every row of a chunk sees (all of them in a decode) are read, in a
 *   contiguous cache, as four streams a quarter of the chunk apart, one key of each per register
 *   block, so that each stream runs front to back; the four neighbouring keys of one head that a
 *   block would otherwise read lie 2 KiB apart (f16, 8 heads, d 128), which the core's
 *   prefetchers follow badly: the f16 step ran 1.3-1.4x faster (bench/results/decode-cpu-streams.md).
 *   Keys some rows do not see (causal edge, window) and paged caches keep runs of keys.
 * - Split-KV: each sequence's keys are cut into chunks by the one rule of every backend
 *   (kv_split.h: from the sequence's own key count and desc->kv_split_tokens only); each
 *   (unit, chunk) task computes a partial (O, m, l) with the online softmax, and the partials are
 *   merged by their maxima in increasing chunk order. Nothing depends on the thread count or on
 *   the other sequences of the batch (a sequence's row tiles are its own too), so a sequence's
 *   result is bit-identical for any number of threads and in any batch.
 * - Ragged queries (a packed batch): each sequence has its own query rows; units cover the
 *   longest sequence's row tiles, and those past a shorter sequence's rows do nothing.
 * - Paged caches are read through the block table, a run of keys per page (one kernel call each).
 * - NaN inputs propagate as in fa_forward (docs/ROBUSTNESS.md).
 * Every buffer is allocated before the cache is written, so a failure leaves the cache intact. */
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../common/alloc.h"
#include "../common/error.h"
#include "../common/kv_split.h"
#include "../common/merge_rule.h"
#include "../common/visibility.h"
#include "cpu_backend.h"
#include "cpu_tile.h"

#define DECODE_ROWS 64        /* query rows per tile and kv head */
#define DECODE_KEYS 64        /* keys per online-softmax step (S^T of every kv head stays in L1) */
#define DECODE_STREAM_MIN 8   /* keys per stream at least: shorter spans are read as runs */

typedef struct decode_plan {
    int64_t group, rows, tile_rows, row_tiles, units; /* rows, row_tiles: the longest sequence's */
} decode_plan;

static decode_plan make_plan(const fa_problem *p)
{
    decode_plan plan;
    plan.group = p->shape.heads_q / p->shape.heads_kv;
    plan.rows = plan.group * (p->varlen.batch ? p->varlen.max_seqlen_q : p->shape.seqlen_q);
    plan.tile_rows = plan.rows < DECODE_ROWS ? plan.rows : DECODE_ROWS;
    plan.row_tiles = (plan.rows + plan.tile_rows - 1) / plan.tile_rows;
    plan.units = fa_kv_sequences(p) * plan.row_tiles;
    return plan;
}

static int64_t sequence_keys(const fa_kv_problem *kp, int64_t b) { return fa_cache_keys(&kp->cache, b); }

/* Sequence b's key chunks (kv_split.h). */
static int64_t chunk_count(const fa_kv_problem *kp, int64_t b)
{
    return fa_kv_split_chunks(kp->cache.split_tokens, sequence_keys(kp, b));
}

/* Per-thread memory: the row tile's query rows of every kv head, the scores S^T of every kv
 * head's rows, the softmax vectors, the NaN marks, the merge's row and the rows' key ranges. K and
 * V are read in place by the decode kernels (f16/bf16 widened in registers). */
typedef struct decode_scratch {
    int64_t q_unit; /* the unit whose query rows q holds (-1: none yet): a thread's chunks of one unit load them once */
    float *q, *st, *tile_max, *shift, *alpha, *tile_sum, *acc;
    unsigned char *poisoned;
    fa_key_range *ranges;
} decode_scratch;

static size_t scratch_bytes(const fa_problem *p)
{
    const int64_t d = p->shape.head_dim, cols = p->shape.heads_kv * DECODE_ROWS;
    const size_t floats = (size_t)(cols * d + DECODE_KEYS * cols + 4 * cols + d + (d & 1));
    return (floats * sizeof(float) + DECODE_ROWS * sizeof(fa_key_range) + (size_t)cols + 63) & ~(size_t)63;
}

static void scratch_carve(char *base, const fa_problem *p, decode_scratch *w)
{
    const int64_t d = p->shape.head_dim, cols = p->shape.heads_kv * DECODE_ROWS;
    float *f = (float *)base;
    w->q_unit = -1;
    w->q = f; f += cols * d;
    w->st = f; f += DECODE_KEYS * cols;
    w->tile_max = f; f += cols;
    w->shift = f; f += cols;
    w->alpha = f; f += cols;
    w->tile_sum = f; f += cols;
    w->acc = f; f += d + (d & 1);
    w->ranges = (fa_key_range *)f; /* f is 8-aligned: the float count above is even (cols is) */
    w->poisoned = (unsigned char *)(w->ranges + DECODE_ROWS);
}

/* Keys from position j of sequence b that lie in one slot (all n when contiguous, else up to the
 * end of j's page), and where the first of them is: (batch or page, row). */
static int64_t slot_run(const fa_kv_problem *kp, int64_t b, int64_t j, int64_t n, int64_t *slot_b, int64_t *slot_s)
{
    fa_cpu_kvcache_slot(kp, b, j, slot_b, slot_s);
    const int64_t room = kp->cache.block_table ? kp->cache.page_size - *slot_s : n;
    return n < room ? n : room;
}

/* Row r of kv head hk's packed tile: query position i, query head h. */
static void tile_row(const decode_plan *plan, int64_t hk, int64_t r, int64_t *i, int64_t *h)
{
    *i = r / plan->group;
    *h = hk * plan->group + r % plan->group;
}

/* Unit u = (b, row tile): its sequence and rows [r0, r0 + rows) of every kv head's tile (rows <= 0:
 * past the sequence's queries). */
static void unit_rows(const fa_problem *p, const decode_plan *plan, int64_t u, int64_t *b, int64_t *r0, int64_t *rows)
{
    *b = u / plan->row_tiles;
    *r0 = u % plan->row_tiles * plan->tile_rows;
    const int64_t seq_rows = plan->group * fa_sequence_queries(&p->varlen, p->shape.seqlen_q, *b);
    *rows = seq_rows - *r0 < plan->tile_rows ? seq_rows - *r0 : plan->tile_rows;
}

/* Whether any of the n floats is NaN (a vectorisable scan; the exact rows are found only then). */
static int any_nan(const float *x, int64_t n)
{
    int found = 0;
    for (int64_t e = 0; e < n; ++e) found |= x[e] != x[e];
    return found;
}

/* Where a (unit, chunk) partial of a unit of `rows` rows keeps its values: O rows, then m and l,
 * column c = hk * rows + r. */
typedef struct partial_view {
    float *o, *m, *l;
} partial_view;

static size_t partial_floats(const fa_problem *p, int64_t rows)
{
    return (size_t)(p->shape.heads_kv * rows * (p->shape.head_dim + 2));
}

static partial_view partial_at(const fa_problem *p, int64_t rows, float *partial)
{
    const int64_t cols = p->shape.heads_kv * rows;
    return (partial_view){partial, partial + cols * p->shape.head_dim, partial + cols * (p->shape.head_dim + 1)};
}

/* The keys of one online-softmax step: S^T row x is key j0 + fa_decode_key_offset(x, key_step,
 * quad_step). A run of keys: key_step 1, quad_step 4; four streams of a contiguous cache, each
 * read front to back (kernels.h): key_step = the streams' distance, quad_step 1. */
typedef struct key_tile {
    int64_t j0, n, key_step, quad_step;
} key_tile;

static int64_t tile_key(const key_tile *t, int64_t x) { return t->j0 + fa_decode_key_offset(x, t->key_step, t->quad_step); }

/* A quantised cache tensor's codes enter S^T (or P enters O) as they are. An int8 tensor's scales
 * (per key and kv head) then multiply the tile's columns, one multiply per score rather than d per
 * key: S^T[x][hk * rows + r] (or P) times the scale of key x and kv head hk, whose kv heads' scales
 * lie side by side. An FP8 tensor's descales (per kv head; E4M3's times 2^8, kernels.h) are folded
 * into the query rows (K) and the merged output (V) instead: nothing per tile. */
static void apply_scales(const fa_kv_problem *kp, const fa_tensor *cache, const float *scales, int64_t b,
                         const key_tile *t, int64_t rows, float *st)
{
    if (cache->dtype != FA_DTYPE_I8) return;
    const int64_t hkv = kp->attn.shape.heads_kv, cols = hkv * rows;
    for (int64_t x = 0; x < t->n; ++x) {
        int64_t sb, ss;
        fa_cpu_kvcache_slot(kp, b, tile_key(t, x), &sb, &ss);
        const float *key_scales = scales + fa_cache_scale_index(sb, ss, 0, cache->seqlen, hkv);
        float *col = st + x * cols;
        for (int64_t hk = 0; hk < hkv; ++hk) {
            const float scale = key_scales[hk];
            for (int64_t r = 0; r < rows; ++r) col[hk * rows + r] *= scale;
        }
    }
}

/* The factor of an FP8 cache tensor's kernel values for sequence b's kv head hk: its descale, and
 * for E4M3 the 2^8 the kernels leave out (kernels.h); 1 for any other tensor. */
static float fp8_factor(const fa_tensor *cache, const float *descales, int64_t b, int64_t hk)
{
    const float descale = fa_dtype_fp8(cache->dtype) ? fa_cache_descale(descales, b, cache->heads, hk) : 1.0f;
    return cache->dtype == FA_DTYPE_FP8_E4M3 ? descale * 0x1p8f : descale;
}

/* One online-softmax step of the unit's rows of every kv head on the tile's keys. The scores of
 * all kv heads form one transposed tile S^T[x][hk * rows + r], so that the softmax vectors are
 * full (a GQA group has few rows per kv head); the scale is applied inside the exponential. K and
 * V are read in place, a run of keys per page; four-stream tiles (contiguous caches only) are
 * seen by every row. */
static void tile_step(const fa_kv_problem *kp, const fa_cpu_kernels *kern, int64_t b, int64_t rows, const key_tile *t,
                      decode_scratch *w, partial_view out)
{
    const fa_problem *p = &kp->attn;
    const fa_tensor *k = &p->k, *v = &p->v;
    const int64_t d = p->shape.head_dim, hkv = p->shape.heads_kv, cols = hkv * rows, n = t->n, j0 = t->j0;
    float *st = w->st;
    if (t->key_step == 1) { /* S^T = K Q^T */
        for (int64_t x = 0, run, sb, ss; x < n; x += run) {
            run = slot_run(kp, b, j0 + x, n - x, &sb, &ss);
            kern->decode_scores(run, hkv, rows, d, fa_row_ptr(k, sb, ss, 0), k->dtype, k->stride_seq, 4 * k->stride_seq,
                                k->stride_head, w->q, rows * d, st + x * cols, cols);
        }
    } else {
        int64_t sb, ss; /* four streams: contiguous caches only */
        fa_cpu_kvcache_slot(kp, b, j0, &sb, &ss);
        kern->decode_scores(n, hkv, rows, d, fa_row_ptr(k, sb, ss, 0), k->dtype, t->key_step * k->stride_seq,
                            t->quad_step * k->stride_seq, k->stride_head, w->q, rows * d, st, cols);
    }
    apply_scales(kp, k, kp->cache.k_scale, b, t, rows, st);
    int seen_by_all = 1;
    for (int64_t r = 0; r < rows && seen_by_all; ++r) seen_by_all = w->ranges[r].lo <= j0 && w->ranges[r].hi > tile_key(t, n - 1);
    /* Masked scores become -inf. A NaN score a row sees (NaN in its query or in the key) is not left
     * to the vector exp, whose range reduction is not bound to keep a NaN on every ISA (AVX2 adds n
     * to the exponent field as an integer): the row is marked instead, and its l becomes NaN after
     * the step, which the merge turns into a NaN row and lse as fa_forward does. */
    int any_poisoned = 0;
    if (!seen_by_all || any_nan(st, n * cols)) {
        memset(w->poisoned, 0, (size_t)cols);
        for (int64_t x = 0; x < n; ++x) {
            float *col = st + x * cols;
            const int64_t j = tile_key(t, x);
            for (int64_t c = 0; c < cols; ++c) {
                const fa_key_range range = w->ranges[c % rows];
                const int seen = j >= range.lo && j < range.hi;
                if (seen && col[c] != col[c]) w->poisoned[c] = 1, any_poisoned = 1;
                if (!seen || col[c] != col[c]) col[c] = -INFINITY;
            }
        }
    }
    /* The softmax step folds the scale into its exponential, which needs scale > 0 (the max of the
     * raw scores is then the max of the scaled ones): a negative scale scales the scores first. */
    float scale_in_exp = p->shape.scale;
    if (scale_in_exp < 0.0f) {
        for (int64_t e = 0; e < n * cols; ++e)
            if (st[e] != -INFINITY) st[e] *= scale_in_exp;
        scale_in_exp = 1.0f;
    }
    fa_cpu_softmax_step(kern, scale_in_exp, cols, n, st, cols, out.m, out.l, w->tile_max, w->shift, w->alpha,
                        w->tile_sum);
    for (int64_t c = 0; any_poisoned && c < cols; ++c)
        if (w->poisoned[c]) out.l[c] = NAN;
    apply_scales(kp, v, kp->cache.v_scale, b, t, rows, st);
    if (seen_by_all && t->key_step != 1) { /* O = alpha O + P V, every kv head */
        int64_t sb, ss;
        fa_cpu_kvcache_slot(kp, b, j0, &sb, &ss);
        kern->decode_values(n, hkv, rows, d, st, cols, fa_row_ptr(v, sb, ss, 0), v->dtype, t->key_step * v->stride_seq,
                            t->quad_step * v->stride_seq, v->stride_head, out.o, rows * d, w->alpha);
        return;
    }
    if (seen_by_all) {
        for (int64_t x = 0, run, sb, ss; x < n; x += run) {
            run = slot_run(kp, b, j0 + x, n - x, &sb, &ss);
            kern->decode_values(run, hkv, rows, d, st + x * cols, cols, fa_row_ptr(v, sb, ss, 0), v->dtype,
                                v->stride_seq, 4 * v->stride_seq, v->stride_head, out.o, rows * d,
                                x == 0 ? w->alpha : NULL);
        }
        return;
    }
    /* P is 0 at the keys a row cannot see, but 0 x NaN is NaN: where rows see different parts of
     * the tile (causal edge, window; runs of keys only), each row multiplies only its own keys, so
     * a NaN in V reaches exactly the rows that see it. A row that sees none of the tile keeps O
     * (alpha 1). */
    for (int64_t hk = 0; hk < hkv; ++hk)
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t lo = w->ranges[r].lo > j0 ? w->ranges[r].lo : j0;
            const int64_t hi = w->ranges[r].hi < j0 + n ? w->ranges[r].hi : j0 + n;
            const int64_t c = hk * rows + r;
            for (int64_t j = lo, run, sb, ss; j < hi; j += run) {
                run = slot_run(kp, b, j, hi - j, &sb, &ss);
                kern->decode_values(run, 1, 1, d, st + (j - j0) * cols + c, cols, fa_row_ptr(v, sb, ss, hk), v->dtype,
                                    v->stride_seq, 4 * v->stride_seq, v->stride_head, out.o + c * d, d,
                                    j == lo ? w->alpha + c : NULL);
            }
        }
}

/* Plain tiles (runs of keys) over [lo, hi). */
static void run_tiles(const fa_kv_problem *kp, const fa_cpu_kernels *kern, int64_t b, int64_t rows, int64_t lo,
                      int64_t hi, decode_scratch *w, partial_view out)
{
    for (int64_t j0 = lo; j0 < hi; j0 += DECODE_KEYS) {
        const key_tile t = {j0, hi - j0 < DECODE_KEYS ? hi - j0 : DECODE_KEYS, 1, 4};
        tile_step(kp, kern, b, rows, &t, w, out);
    }
}

/* One (unit, chunk) task: the partial O (unnormalised), m and l of the unit's rows of every kv
 * head over the chunk's keys, into chunk c's slot of the unit's partials (from `first`, laid out
 * as merge_head reads them). */
static void chunk_task(const fa_kv_problem *kp, const fa_cpu_kernels *kern, const decode_plan *plan, int64_t u,
                       int64_t c, decode_scratch *w, float *first)
{
    const fa_problem *p = &kp->attn;
    const int64_t d = p->shape.head_dim;
    int64_t b, r0, rows;
    unit_rows(p, plan, u, &b, &r0, &rows);
    if (rows <= 0) return; /* past the sequence's queries: the merge reads nothing of it */
    const partial_view out = partial_at(p, rows, first + (size_t)c * partial_floats(p, rows));
    const int64_t cols = p->shape.heads_kv * rows;
    memset(out.o, 0, (size_t)(cols * d) * sizeof(float));
    for (int64_t x = 0; x < cols; ++x) {
        out.m[x] = -INFINITY;
        out.l[x] = 0.0f;
    }
    const int64_t keys = sequence_keys(kp, b), queries = fa_sequence_queries(&p->varlen, p->shape.seqlen_q, b);
    const fa_key_range chunk = fa_kv_split_chunk(kp->cache.split_tokens, keys, c);
    int64_t lo = chunk.lo, hi = chunk.hi;
    int64_t seen_lo = INT64_MAX, seen_hi = 0;
    for (int64_t r = 0; r < rows; ++r) { /* a row's keys depend on its query position only */
        const int64_t i = (r0 + r) / plan->group;
        w->ranges[r] = fa_visible_keys(i, queries, keys, keys, p->mask.causal, p->mask.window_left, p->mask.window_right);
        if (w->ranges[r].hi <= w->ranges[r].lo) continue;
        if (w->ranges[r].lo < seen_lo) seen_lo = w->ranges[r].lo;
        if (w->ranges[r].hi > seen_hi) seen_hi = w->ranges[r].hi;
    }
    if (seen_lo > lo) lo = seen_lo;
    if (seen_hi < hi) hi = seen_hi;
    if (hi <= lo) return;
    int64_t all_lo = lo, all_hi = hi; /* keys every row sees */
    for (int64_t r = 0; r < rows; ++r) {
        if (w->ranges[r].lo > all_lo) all_lo = w->ranges[r].lo;
        if (w->ranges[r].hi < all_hi) all_hi = w->ranges[r].hi;
    }
    for (int64_t hk = 0; w->q_unit != u && hk < p->shape.heads_kv; ++hk)
        for (int64_t r = 0; r < rows; ++r) {
            int64_t i, h, qb, qi;
            tile_row(plan, hk, r0 + r, &i, &h);
            fa_sequence_query_row(&p->varlen, b, i, &qb, &qi);
            float *row = w->q + (hk * rows + r) * d;
            fa_cpu_load_rows(&p->q, qb, qi, h, 1, row, d);
            if (kp->cache.rotary_cos) fa_cpu_rotate_query(kp, b, i, row);
            const float factor = fp8_factor(&p->k, kp->cache.k_descale, b, hk);
            if (factor != 1.0f)
                for (int64_t e = 0; e < d; ++e) row[e] *= factor;
        }
    w->q_unit = u;
    const int64_t stream = kp->cache.block_table || all_hi - all_lo < 4 * DECODE_STREAM_MIN ? 0 : (all_hi - all_lo) / 4;
    if (!stream) {
        run_tiles(kp, kern, b, rows, lo, hi, w, out);
        return;
    }
    /* The keys every row sees as four streams, a quarter of them each; the edges as runs. */
    run_tiles(kp, kern, b, rows, lo, all_lo, w, out);
    for (int64_t x = 0; x < stream; x += DECODE_KEYS / 4) {
        const int64_t per_stream = stream - x < DECODE_KEYS / 4 ? stream - x : DECODE_KEYS / 4;
        const key_tile t = {all_lo + x, 4 * per_stream, stream, 1};
        tile_step(kp, kern, b, rows, &t, w, out);
    }
    run_tiles(kp, kern, b, rows, all_lo + 4 * stream, hi, w, out);
}

/* The rows of kv head hk of unit u, each merged over the unit's chunks in increasing chunk order by
 * the one lse merge (merge_rule.h) of the chunks' partials (m, l, O; the unit's, from `first` on).
 * A task per (unit, kv head), so that a batch-1 decode's merge runs on several threads; each row's
 * arithmetic is the same whichever thread takes it. */
static void merge_head(const fa_kv_problem *kp, const fa_cpu_kernels *kern, const decode_plan *plan, int64_t u,
                       int64_t hk, float *first, float *acc)
{
    const fa_problem *p = &kp->attn;
    const int64_t d = p->shape.head_dim;
    int64_t b, r0, rows;
    unit_rows(p, plan, u, &b, &r0, &rows);
    const int64_t chunks = chunk_count(kp, b);
    const size_t stride = partial_floats(p, rows);
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t col = hk * rows + r;
        fa_merge_row row = fa_merge_row_start();
        for (int64_t c = 0; c < chunks; ++c) {
            const partial_view in = partial_at(p, rows, first + (size_t)c * stride);
            fa_merge_see_part(&row, in.m[col], in.l[col]);
        }
        float sum = 0.0f;
        memset(acc, 0, (size_t)d * sizeof(float));
        for (int64_t c = 0; c < chunks; ++c) {
            const partial_view in = partial_at(p, rows, first + (size_t)c * stride);
            const float weight = fa_merge_weight(&row, in.m[col]);
            if (weight == 0.0f) continue;
            sum = fa_merge_accumulate(sum, weight, in.l[col]);
            for (int64_t x = 0; x < d; ++x) acc[x] = fa_merge_accumulate(acc[x], weight, in.o[col * d + x]);
        }
        const float factor = fa_merge_factor(&row, sum) * fp8_factor(&p->v, kp->cache.v_descale, b, hk);
        for (int64_t x = 0; x < d; ++x) acc[x] *= factor;
        int64_t i, h, qb, qi;
        tile_row(plan, hk, r0 + r, &i, &h);
        fa_sequence_query_row(&p->varlen, b, i, &qb, &qi);
        fa_cpu_store_rows(&p->out, kern, qb, qi, h, 1, acc, d);
        if (p->outputs.lse) p->outputs.lse[fa_lse_index(p, qb, h, qi)] = fa_merge_lse(&row, sum);
    }
}

/* Every (unit, chunk) task, then every (unit, kv head) merge, on `threads` threads, each with its
 * per_thread bytes of scratch. */
static void run_tasks(const fa_kv_problem *kp, const fa_cpu_kernels *kern, const decode_plan *plan, int threads,
                      int64_t tasks, const int64_t *task_first, const int64_t *task_unit, const size_t *unit_partials,
                      float *partials, char *scratch)
{
    const fa_problem *p = &kp->attn;
    const size_t per_thread = scratch_bytes(p);
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        const int me = omp_get_thread_num();
#else
        const int me = 0;
#endif
        decode_scratch w;
        scratch_carve(scratch + (size_t)me * per_thread, p, &w);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; ++t) {
            const int64_t u = task_unit[t];
            chunk_task(kp, kern, plan, u, t - task_first[u], &w, partials + unit_partials[u]);
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < plan->units * p->shape.heads_kv; ++t)
            merge_head(kp, kern, plan, t / p->shape.heads_kv, t % p->shape.heads_kv,
                       partials + unit_partials[t / p->shape.heads_kv], w.acc);
    }
}

fa_status fa_cpu_decode(void *state, const fa_kv_problem *kp)
{
    const fa_cpu_state *s = state;
    const fa_problem *p = &kp->attn;
    const decode_plan plan = make_plan(p);
    /* The tasks: every (unit, chunk) of a unit with rows, its partial sized by its own rows and
     * chunks (a ragged step's decodes next to its prefills keep small partials). */
    int64_t *task_first = fa_host_scratch_alloc((size_t)(plan.units + 1) * sizeof(int64_t));
    size_t *unit_partials = fa_host_scratch_alloc((size_t)(plan.units + 1) * sizeof(size_t));
    if (!task_first || !unit_partials) {
        fa_host_scratch_free(task_first);
        fa_host_scratch_free(unit_partials);
        return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "fa_forward_kvcache: cannot allocate the plan of %lld units",
                            (long long)plan.units);
    }
    task_first[0] = 0;
    unit_partials[0] = 0;
    for (int64_t u = 0; u < plan.units; ++u) {
        int64_t b, r0, rows;
        unit_rows(p, &plan, u, &b, &r0, &rows);
        const int64_t chunks = rows > 0 ? chunk_count(kp, b) : 0;
        task_first[u + 1] = task_first[u] + chunks;
        unit_partials[u + 1] = unit_partials[u] + (rows > 0 ? (size_t)chunks * partial_floats(p, rows) : 0);
    }
    const int64_t tasks = task_first[plan.units];
    const int threads = fa_cpu_thread_count(s->num_threads);
    const size_t per_thread = scratch_bytes(p);
    int64_t *task_unit = fa_host_scratch_alloc((size_t)(tasks ? tasks : 1) * sizeof(int64_t));
    float *partials = fa_host_scratch_alloc((unit_partials[plan.units] ? unit_partials[plan.units] : 1) * sizeof(float));
    char *scratch = fa_host_scratch_alloc(per_thread * (size_t)threads);
    /* The append writes nothing when it fails (out of memory, before its first row). */
    const fa_status st = task_unit && partials && scratch
                             ? fa_cpu_kvcache_append(kp)
                             : fa_set_error(FA_ERROR_OUT_OF_MEMORY, "fa_forward_kvcache: cannot allocate %lld partial tiles",
                                            (long long)tasks);
    if (st == FA_SUCCESS) {
        for (int64_t u = 0; u < plan.units; ++u)
            for (int64_t t = task_first[u]; t < task_first[u + 1]; ++t) task_unit[t] = u;
        run_tasks(kp, s->kernels, &plan, threads, tasks, task_first, task_unit, unit_partials, partials, scratch);
    }
    fa_host_scratch_free(scratch);
    fa_host_scratch_free(partials);
    fa_host_scratch_free(task_unit);
    fa_host_scratch_free(unit_partials);
    fa_host_scratch_free(task_first);
    return st;
}

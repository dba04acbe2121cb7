#include "cpu_nan.h"

#include <math.h>

/* 1 when row (b, s, h) of t holds a NaN (tested on the stored bits). */
static int row_has_nan(const fa_tensor *t, int64_t b, int64_t s, int64_t h)
{
    const void *row = fa_row_ptr(t, b, s, h);
    int found = 0; /* no early exit and the dtype outside the loops: they vectorise (every call scans Q, K, V) */
    if (t->dtype == FA_DTYPE_F32) {
        const float *x = row;
        for (int64_t c = 0; c < t->head_dim; ++c) found |= x[c] != x[c];
    } else {
        const uint16_t *x = row, inf = t->dtype == FA_DTYPE_F16 ? 0x7c00u : 0x7f80u;
        for (int64_t c = 0; c < t->head_dim; ++c) found |= (uint16_t)(x[c] & 0x7fffu) > inf;
    }
    return found;
}

static fa_key_range keys_of(const fa_problem *p, int64_t b, int64_t i)
{
    const int64_t valid_k = p->seqlens_k ? p->seqlens_k[b] : p->seqlen_k;
    return fa_visible_keys_at(fa_diagonal_key(i, p->diag_offset), valid_k, p->causal, p->window_left, p->window_right);
}

/* The keys any query row of batch b sees lie in [*lo, *hi) (ranges only move right as i grows);
 * returns 0 when no row sees a key. */
static int visible_key_span(const fa_problem *p, int64_t b, int64_t *lo, int64_t *hi)
{
    *lo = INT64_MAX;
    *hi = 0;
    for (int64_t i = 0; i < p->seqlen_q; ++i) {
        const fa_key_range r = keys_of(p, b, i);
        if (r.hi <= r.lo) continue;
        if (r.lo < *lo) *lo = r.lo;
        if (r.hi > *hi) *hi = r.hi;
    }
    return *hi > *lo;
}

fa_cpu_nan_inputs fa_cpu_nan_inputs_of_head(const fa_problem *p, int64_t b, int64_t hk, int *known)
{
    int *state = known + b * p->heads_kv + hk, value;
#pragma omp atomic read
    value = *state;
    if (!value) { /* the first task to ask scans; a racing one scans too and stores the same value */
        int k = 0, v = 0;
        int64_t lo, hi;
        if (visible_key_span(p, b, &lo, &hi))
            for (int64_t x = lo; x < hi; ++x) {
                k |= row_has_nan(&p->k, b, x, hk);
                v |= row_has_nan(&p->v, b, x, hk);
            }
        value = 1 + k + 2 * v;
#pragma omp atomic write
        *state = value;
    }
    return (fa_cpu_nan_inputs){.q = 1, .k = (value - 1) & 1, .v = (value - 1) >> 1};
}

static int key_visible(const fa_problem *p, fa_key_range range, int64_t i, int64_t j)
{
    const fa_block_mask *bm = p->block_mask;
    return j >= range.lo && j < range.hi && (!bm || bm->mask[(i / bm->block_q) * bm->cols + j / bm->block_k]);
}

void fa_cpu_nan_rows_begin(const fa_cpu_nan_inputs *in, const fa_problem *p, int64_t b, int64_t h,
                           const fa_cpu_rows *rows, float *poison)
{
    for (int64_t r = 0; r < rows->count; ++r)
        poison[r] = in->q && rows->range[r].hi > rows->range[r].lo && row_has_nan(&p->q, b, rows->i0 + r, h);
}

/* dst[t * d + c] = v[t * ldv + c] with NaN replaced by 0; returns whether any NaN was replaced. */
static int copy_without_nan(const float *v, int64_t ldv, int64_t cols, int64_t d, float *dst)
{
    int found = 0;
    for (int64_t t = 0; t < cols; ++t)
        for (int64_t c = 0; c < d; ++c) {
            const float x = v[t * ldv + c];
            found |= x != x;
            dst[t * d + c] = x != x ? 0.0f : x;
        }
    return found;
}

void fa_cpu_nan_tile_begin(fa_cpu_nan_tile *t, const fa_cpu_nan_inputs *in, const fa_problem *p, int64_t b,
                           int64_t hk, int64_t j0, int64_t cols, const float *v, int64_t ldv, float *buffer)
{
    *t = (fa_cpu_nan_tile){.in = in, .b = b, .hk = hk, .j0 = j0, .v = v, .ldv = ldv};
    if (in->v && copy_without_nan(v, ldv, cols, p->head_dim, buffer)) t->v_clean = buffer;
}

/* poison[r] = 1 where row r sees a key of [j0, j0 + cols) whose k row holds a NaN. */
static void mark_nan_keys(const fa_problem *p, int64_t b, int64_t hk, const fa_cpu_rows *rows, int64_t j0,
                          int64_t cols, float *poison)
{
    for (int64_t t = 0; t < cols; ++t) {
        if (!row_has_nan(&p->k, b, j0 + t, hk)) continue;
        for (int64_t r = 0; r < rows->count; ++r)
            if (key_visible(p, rows->range[r], rows->i0 + r, j0 + t)) poison[r] = 1.0f;
    }
}

/* o[r * d + c] = NaN where row r sees key j0 + t and v[t * ldv + c] is NaN. */
static void poison_from_v(const fa_problem *p, const fa_cpu_rows *rows, int64_t j0, int64_t cols, const float *v,
                          int64_t ldv, float *o)
{
    const int64_t d = p->head_dim;
    for (int64_t t = 0; t < cols; ++t)
        for (int64_t c = 0; c < d; ++c) {
            const float x = v[t * ldv + c];
            if (x == x) continue;
            for (int64_t r = 0; r < rows->count; ++r)
                if (key_visible(p, rows->range[r], rows->i0 + r, j0 + t)) o[r * d + c] = NAN;
        }
}

void fa_cpu_nan_step(const fa_cpu_nan_tile *t, const fa_problem *p, const fa_cpu_rows *rows, int64_t key0,
                     int64_t keys, float *poison, float *o)
{
    if (t->in->k) mark_nan_keys(p, t->b, t->hk, rows, key0, keys, poison);
    if (t->v_clean) poison_from_v(p, rows, key0, keys, t->v + (key0 - t->j0) * t->ldv, t->ldv, o);
}

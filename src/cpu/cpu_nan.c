#include "cpu_nan.h"

#include <math.h>

/* 1 when row (b, s, h) of t holds a NaN (tested on the stored bits). */
static int row_has_nan(const fa_tensor *t, int64_t b, int64_t s, int64_t h)
{
    const void *row = fa_row_ptr(t, b, s, h);
    int found = 0; /* no early exit and the dtype outside the loops: they vectorise */
    if (t->dtype == FA_DTYPE_F32) {
        const float *x = row;
        for (int64_t c = 0; c < t->head_dim; ++c) found |= x[c] != x[c];
    } else {
        const uint16_t *x = row, inf = t->dtype == FA_DTYPE_F16 ? 0x7c00u : 0x7f80u;
        for (int64_t c = 0; c < t->head_dim; ++c) found |= (uint16_t)(x[c] & 0x7fffu) > inf;
    }
    return found;
}

/* 1 when any of rows x d floats at x (stride ld) is NaN. No early exit: it vectorises. */
static int tile_has_nan(const float *x, int64_t ld, int64_t rows, int64_t d)
{
    int found = 0;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < d; ++c) found |= x[r * ld + c] != x[r * ld + c];
    return found;
}

static int key_visible(const fa_problem *p, fa_key_range range, int64_t i, int64_t j)
{
    const fa_block_mask *bm = fa_mask_blocks(&p->mask);
    return j >= range.lo && j < range.hi && (!bm || bm->mask[(i / bm->block_q) * bm->cols + j / bm->block_k]);
}

/* poison[r] (a count of NaN found in row r) becomes 1 where row r holds one and sees a key, else 0. */
static void rows_poisoned(const fa_cpu_rows *rows, float *poison)
{
    for (int64_t r = 0; r < rows->count; ++r)
        poison[r] = poison[r] > 0.0f && rows->range[r].hi > rows->range[r].lo ? 1.0f : 0.0f;
}

void fa_cpu_nan_rows_begin(const fa_cpu_rows *rows, const float *qt, int64_t ld, int64_t head_dim, float *poison)
{
    for (int64_t r = 0; r < rows->count; ++r) poison[r] = 0.0f;
    for (int64_t c = 0; c < head_dim; ++c) /* rows in the inner loop: it vectorises */
        for (int64_t r = 0; r < rows->count; ++r) poison[r] += qt[c * ld + r] != qt[c * ld + r] ? 1.0f : 0.0f;
    rows_poisoned(rows, poison);
}

void fa_cpu_nan_rows_begin_bf16_pairs(const fa_cpu_rows *rows, const uint32_t *pairs, int64_t ld, int64_t head_dim,
                                      float *poison)
{
    for (int64_t r = 0; r < rows->count; ++r) poison[r] = 0.0f;
    for (int64_t c = 0; c < (head_dim + 1) / 2; ++c) /* rows in the inner loop: it vectorises */
        for (int64_t r = 0; r < rows->count; ++r) {
            const uint32_t x = pairs[c * ld + r];
            poison[r] += (x & 0x7fffu) > 0x7f80u || (x >> 16 & 0x7fffu) > 0x7f80u ? 1.0f : 0.0f;
        }
    rows_poisoned(rows, poison);
}

/* dst[t * d + c] = v[t * ldv + c] with NaN replaced by 0. */
static void copy_without_nan(const float *v, int64_t ldv, int64_t cols, int64_t d, float *dst)
{
    for (int64_t t = 0; t < cols; ++t)
        for (int64_t c = 0; c < d; ++c) {
            const float x = v[t * ldv + c];
            dst[t * d + c] = x != x ? 0.0f : x;
        }
}

void fa_cpu_nan_tile_begin(fa_cpu_nan_tile *t, const fa_problem *p, int64_t b, int64_t hk, int64_t j0, int64_t cols,
                           const float *k, int64_t ldk, const float *v, int64_t ldv, float *buffer)
{
    *t = (fa_cpu_nan_tile){.b = b, .hk = hk, .j0 = j0, .v = v, .ldv = ldv};
    if (k) {
        t->k_nan = tile_has_nan(k, ldk, cols, p->shape.head_dim);
    } else { /* K_j read in place in its own type: its stored rows, prefetched as fa_cpu_view_rows does */
        for (int64_t x = 0; x < cols; ++x) {
            fa_cpu_prefetch_ahead(&p->k, b, j0, hk, x, cols);
            t->k_nan |= row_has_nan(&p->k, b, j0 + x, hk);
        }
    }
    if (tile_has_nan(v, ldv, cols, p->shape.head_dim)) {
        copy_without_nan(v, ldv, cols, p->shape.head_dim, buffer);
        t->v_clean = buffer;
    }
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
    const int64_t d = p->shape.head_dim;
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
    if (t->k_nan) mark_nan_keys(p, t->b, t->hk, rows, key0, keys, poison);
    if (t->v_clean) poison_from_v(p, rows, key0, keys, t->v + (key0 - t->j0) * t->ldv, t->ldv, o);
}

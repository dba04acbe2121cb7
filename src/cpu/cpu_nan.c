#include "cpu_nan.h"

#include <math.h>

#include "cpu_tile.h"

int fa_cpu_row_has_nan(const fa_tensor *t, int64_t b, int64_t s, int64_t h)
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
    return fa_visible_keys_at(i + p->diag_offset, valid_k, p->causal, p->window_left, p->window_right);
}

fa_cpu_nan_inputs fa_cpu_find_nan_inputs(const fa_problem *p, int threads)
{
    int q = 0, k = 0, v = 0;
    for (int64_t b = 0; b < p->batch; ++b) {
        /* Ranges only move right as i grows: the keys any row sees lie in [lo, hi). */
        int64_t lo = INT64_MAX, hi = 0, first = -1, last = -1;
        for (int64_t i = 0; i < p->seqlen_q; ++i) {
            const fa_key_range r = keys_of(p, b, i);
            if (r.hi <= r.lo) continue;
            if (first < 0) { first = i; lo = r.lo; }
            last = i;
            if (r.hi > hi) hi = r.hi;
        }
        if (first < 0) continue;
        const int64_t q_rows = (last - first + 1) * p->heads_q, k_rows = (hi - lo) * p->heads_kv;
        /* One parallel region for Q, K and V: small problems pay for each fork and join. */
#pragma omp parallel for num_threads(threads) schedule(static) reduction(| : q, k, v)
        for (int64_t x = 0; x < q_rows + k_rows; ++x) {
            if (x < q_rows) {
                q |= fa_cpu_row_has_nan(&p->q, b, first + x / p->heads_q, x % p->heads_q);
                continue;
            }
            const int64_t y = x - q_rows;
            k |= fa_cpu_row_has_nan(&p->k, b, lo + y / p->heads_kv, y % p->heads_kv);
            v |= fa_cpu_row_has_nan(&p->v, b, lo + y / p->heads_kv, y % p->heads_kv);
        }
    }
    return (fa_cpu_nan_inputs){q, k, v};
}

static int key_visible(const fa_problem *p, fa_key_range range, int64_t i, int64_t j)
{
    const fa_block_mask *bm = p->block_mask;
    return j >= range.lo && j < range.hi && (!bm || bm->mask[(i / bm->block_q) * bm->cols + j / bm->block_k]);
}

void fa_cpu_mark_nan_keys(const fa_problem *p, int64_t b, int64_t hk, const fa_key_range *ranges, int64_t i0,
                          int64_t rows_n, int64_t j0, int64_t cols, float *poison)
{
    for (int64_t t = 0; t < cols; ++t) {
        if (!fa_cpu_row_has_nan(&p->k, b, j0 + t, hk)) continue;
        for (int64_t r = 0; r < rows_n; ++r)
            if (key_visible(p, ranges[r], i0 + r, j0 + t)) poison[r] = 1.0f;
    }
}

int fa_cpu_copy_without_nan(const float *v, int64_t ldv, int64_t cols, int64_t d, float *dst)
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

void fa_cpu_poison_from_v(const fa_problem *p, const fa_key_range *ranges, int64_t i0, int64_t rows_n, int64_t j0,
                          int64_t cols, const float *v, int64_t ldv, float *o)
{
    const int64_t d = p->head_dim;
    for (int64_t t = 0; t < cols; ++t)
        for (int64_t c = 0; c < d; ++c) {
            const float x = v[t * ldv + c];
            if (x == x) continue;
            for (int64_t r = 0; r < rows_n; ++r)
                if (key_visible(p, ranges[r], i0 + r, j0 + t)) o[r * d + c] = NAN;
        }
}

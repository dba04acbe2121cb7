#include "cpu_nan.h"

#include "../common/alloc.h"
#include "../common/error.h"
#include "cpu_tile.h"

/* NaN test on the stored bits, so f16/bf16 need no conversion. */
static int row_has_nan(const fa_tensor *t, int64_t b, int64_t s, int64_t h)
{
    const void *row = fa_row_ptr(t, b, s, h);
    for (int64_t c = 0; c < t->head_dim; ++c) {
        if (t->dtype == FA_DTYPE_F32) {
            const float x = ((const float *)row)[c];
            if (x != x) return 1;
        } else {
            const uint16_t bits = (uint16_t)(((const uint16_t *)row)[c] & 0x7fffu);
            if (bits > (t->dtype == FA_DTYPE_F16 ? 0x7c00u : 0x7f80u)) return 1;
        }
    }
    return 0;
}

/* Flags of every (b, h, s) row of t into flags (when non-NULL); returns whether any is set. */
static int scan(const fa_tensor *t, int threads, uint8_t *flags)
{
    const int64_t total = t->batch * t->heads * t->seqlen;
    int found = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(| : found)
    for (int64_t x = 0; x < total; ++x) {
        const int64_t s = x % t->seqlen, h = (x / t->seqlen) % t->heads, b = x / (t->seqlen * t->heads);
        const int nan = row_has_nan(t, b, s, h);
        if (flags) flags[x] = (uint8_t)nan;
        found |= nan;
    }
    return found;
}

static fa_status flag_rows(const fa_tensor *t, int threads, uint8_t **flags)
{
    *flags = NULL;
    if (!scan(t, threads, NULL)) return FA_SUCCESS;
    *flags = fa_host_alloc((size_t)(t->batch * t->heads * t->seqlen));
    if (!*flags) return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "forward: cannot allocate the NaN row flags");
    scan(t, threads, *flags);
    return FA_SUCCESS;
}

fa_status fa_cpu_find_nan_rows(const fa_problem *p, int threads, fa_cpu_nan_rows *rows)
{
    rows->q = rows->k = rows->v = NULL;
    fa_status st = flag_rows(&p->q, threads, &rows->q);
    if (st == FA_SUCCESS) st = flag_rows(&p->k, threads, &rows->k);
    if (st == FA_SUCCESS) st = flag_rows(&p->v, threads, &rows->v);
    if (st != FA_SUCCESS) fa_cpu_nan_rows_free(rows);
    return st;
}

void fa_cpu_nan_rows_free(fa_cpu_nan_rows *rows)
{
    fa_host_free(rows->q);
    fa_host_free(rows->k);
    fa_host_free(rows->v);
    rows->q = rows->k = rows->v = NULL;
}

int fa_cpu_row_sees_nan(const fa_problem *p, const fa_cpu_nan_rows *rows, int64_t b, int64_t h, int64_t i,
                        fa_key_range range)
{
    if (range.hi <= range.lo) return 0; /* a fully masked row reads no score */
    if (rows->q && rows->q[(b * p->heads_q + h) * p->seqlen_q + i]) return 1;
    if (!rows->k) return 0;
    const int64_t hk = h / (p->heads_q / p->heads_kv);
    const uint8_t *k = rows->k + (b * p->heads_kv + hk) * p->seqlen_k;
    const fa_block_mask *bm = p->block_mask;
    for (int64_t j = range.lo; j < range.hi; ++j)
        if (k[j] && (!bm || bm->mask[(i / bm->block_q) * bm->cols + j / bm->block_k])) return 1;
    return 0;
}

static int key_visible(const fa_problem *p, fa_key_range range, int64_t i, int64_t j)
{
    const fa_block_mask *bm = p->block_mask;
    return j >= range.lo && j < range.hi && (!bm || bm->mask[(i / bm->block_q) * bm->cols + j / bm->block_k]);
}

int fa_cpu_v_tile_has_nan(const fa_problem *p, const fa_cpu_nan_rows *rows, int64_t b, int64_t hk, int64_t j0,
                          int64_t cols)
{
    if (!rows->v) return 0;
    const uint8_t *v = rows->v + (b * p->heads_kv + hk) * p->seqlen_k + j0;
    for (int64_t t = 0; t < cols; ++t)
        if (v[t]) return 1;
    return 0;
}

void fa_cpu_copy_without_nan(const float *v, int64_t ldv, int64_t cols, int64_t d, float *dst)
{
    for (int64_t t = 0; t < cols; ++t)
        for (int64_t c = 0; c < d; ++c) {
            const float x = v[t * ldv + c];
            dst[t * d + c] = x != x ? 0.0f : x;
        }
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

#include "cpu_tile.h"

#include <string.h>

#include "../common/validate.h"
#include "kernels/exp_poly.h"

#ifdef _OPENMP
#include <omp.h>
#endif

void fa_cpu_load_rows(const fa_tensor *t, int64_t b, int64_t s0, int64_t h, int64_t rows, float *dst, int64_t ld)
{
    const int64_t d = t->head_dim;
    for (int64_t r = 0; r < rows; ++r) {
        const void *src = fa_row_ptr(t, b, s0 + r, h);
        float *out = dst + r * ld;
        switch (t->dtype) {
        case FA_DTYPE_F32:
            for (int64_t c = 0; c < d; ++c) out[c] = ((const float *)src)[c];
            break;
        case FA_DTYPE_F16:
            for (int64_t c = 0; c < d; ++c) out[c] = fa_f16_to_f32(((const uint16_t *)src)[c]);
            break;
        case FA_DTYPE_BF16:
            for (int64_t c = 0; c < d; ++c) out[c] = fa_bf16_to_f32(((const uint16_t *)src)[c]);
            break;
        }
    }
}

/* Widens n values of a 16-bit row with the ISA's kernels (exact either way). */
static void widen(const fa_cpu_kernels *kern, fa_dtype dtype, const uint16_t *src, float *dst, int64_t n)
{
    if (dtype == FA_DTYPE_F16) kern->f16_to_f32(src, dst, n);
    else kern->bf16_to_f32(src, dst, n);
}

void fa_cpu_load_transposed(const fa_tensor *t, const fa_cpu_kernels *kern, int64_t b, int64_t s0, int64_t h,
                            int64_t rows, float *dst, int64_t ld)
{
    enum { ROWS = 16, COLS = 64 }; /* a 4 KiB block of widened f16/bf16 values */
    const int64_t d = t->head_dim;
    /* f32 rows are transposed in place by the vector kernel (register blocks; the scalar loop
     * it replaces was 3% of a forward at N = 1024, d = 64: perf, Zen 4). f16/bf16 rows are
     * widened by the vector kernels into a small block first, then transposed from it (the
     * forward's Q_i^T, once per query tile; the backward transposes the rows it has widened). */
    if (t->dtype == FA_DTYPE_F32) {
        if (rows > 0) kern->transpose(fa_row_ptr(t, b, s0, h), t->stride_seq, rows, d, dst, ld);
        return;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
        const int64_t n = rows - r0 < ROWS ? rows - r0 : ROWS;
        for (int64_t c0 = 0; c0 < d; c0 += COLS) {
            const int64_t width = d - c0 < COLS ? d - c0 : COLS;
            float block[ROWS * COLS];
            for (int64_t r = 0; r < n; ++r)
                widen(kern, t->dtype, (const uint16_t *)fa_row_ptr(t, b, s0 + r0 + r, h) + c0, block + r * COLS, width);
            kern->transpose(block, COLS, n, width, dst + c0 * ld + r0, ld);
        }
    }
}

void fa_cpu_pack_bf16_pairs(const float *qt, int64_t ld, int64_t rows, int64_t head_dim, uint32_t *pairs)
{
    for (int64_t c = 0; c < head_dim; c += 2) {
        const float *even = qt + c * ld, *odd = c + 1 < head_dim ? qt + (c + 1) * ld : NULL;
        uint32_t *out = pairs + c / 2 * ld;
        for (int64_t r = 0; r < rows; ++r) /* it vectorises */
            out[r] = fa_f32_bits(even[r]) >> 16 | (odd ? fa_f32_bits(odd[r]) & 0xffff0000u : 0u);
    }
}

int fa_cpu_load_bf16_pairs(const fa_tensor *t, const fa_cpu_kernels *kern, int64_t b, int64_t s0, int64_t h,
                           int64_t rows, uint32_t *pairs, int64_t ld)
{
    const int64_t d = t->head_dim, words = d / 2;
    const uint16_t *first = fa_row_ptr(t, b, s0, h);
    if (t->dtype != FA_DTYPE_BF16 || (uintptr_t)first % sizeof(uint32_t) != 0 || (rows > 1 && t->stride_seq % 2 != 0))
        return 0;
    /* 32-bit words moved as floats: the transpose is data movement only (kernels.h), NaN patterns included */
    if (words > 0 && rows > 0) kern->transpose((const float *)(const void *)first, t->stride_seq / 2, rows, words,
                                               (float *)(void *)pairs, ld);
    if (d % 2 != 0)
        for (int64_t r = 0; r < rows; ++r) pairs[words * ld + r] = ((const uint16_t *)fa_row_ptr(t, b, s0 + r, h))[d - 1];
    return 1;
}

const float *fa_cpu_view_rows(const fa_tensor *t, const fa_cpu_kernels *kern, int64_t b, int64_t s0, int64_t h,
                              int64_t rows, float *scratch, int64_t *ld)
{
    const int64_t d = t->head_dim;
    /* Contiguous f32 rows are used in place. Strided rows (heads interleaved: a stride of
     * heads * d floats, often a power of two) are copied: a tile's rows would otherwise fall into
     * a few cache sets and evict each other from L1 and L2 (measured: half the FMA rate). */
    if (t->dtype == FA_DTYPE_F32 && (t->stride_seq == d || rows == 1)) {
        *ld = d;
        return fa_row_ptr(t, b, s0, h);
    }
    *ld = d;
    for (int64_t r = 0; r < rows; ++r) {
        fa_cpu_prefetch_ahead(t, b, s0, h, r, rows); /* strided rows: the prefetchers stop at each page */
        if (t->dtype == FA_DTYPE_F32) memcpy(scratch + r * d, fa_row_ptr(t, b, s0 + r, h), (size_t)d * sizeof(float));
        else widen(kern, t->dtype, fa_row_ptr(t, b, s0 + r, h), scratch + r * d, d);
    }
    return scratch;
}

/* dst[i] = fa_f32_to_bf16(src[i]), bit for bit, without its branch: both results are computed and
 * one is selected, so the loop vectorises (the scalar one did not). The stores stay bound by their
 * strided writes: storing out was 1.4-2.2% of a bf16 forward at N = 1024, d = 64 before and
 * 1.3-1.5% after (perf, Zen 4). */
static void narrow_bf16(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t u = fa_f32_bits(src[i]);
        const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
        const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
        dst[i] = (uint16_t)(nan ? quiet : rounded);
    }
}

void fa_cpu_store_rows(const fa_tensor *t, const fa_cpu_kernels *kern, int64_t b, int64_t s0, int64_t h,
                       int64_t rows, const float *src, int64_t ld)
{
    const int64_t d = t->head_dim;
    for (int64_t r = 0; r < rows; ++r) {
        void *dst = fa_row_ptr(t, b, s0 + r, h);
        const float *in = src + r * ld;
        switch (t->dtype) {
        case FA_DTYPE_F32:
            memcpy(dst, in, (size_t)d * sizeof(float));
            break;
        case FA_DTYPE_F16:
            kern->f32_to_f16(in, dst, d);
            break;
        case FA_DTYPE_BF16:
            narrow_bf16(in, dst, d);
            break;
        }
    }
}

void fa_cpu_rows_init(const fa_problem *p, int64_t b, int64_t i0, int64_t count, fa_key_range *storage,
                      fa_cpu_rows *rows)
{
    const int64_t valid_k = p->mask.seqlens_k ? p->mask.seqlens_k[b] : p->shape.seqlen_k;
    rows->i0 = i0;
    rows->count = count;
    rows->range = storage;
    rows->key_lo = INT64_MAX;
    rows->key_hi = 0;
    for (int64_t r = 0; r < count; ++r) {
        storage[r] = fa_visible_keys_at(fa_diagonal_key(i0 + r, p->mask.diag_offset), valid_k, p->mask.causal, p->mask.window_left,
                                        p->mask.window_right);
        if (storage[r].hi <= storage[r].lo) continue;
        if (storage[r].lo < rows->key_lo) rows->key_lo = storage[r].lo;
        if (storage[r].hi > rows->key_hi) rows->key_hi = storage[r].hi;
    }
    if (rows->key_hi <= 0) rows->key_lo = 0;
}

static int block_visible(const fa_block_mask *bm, int64_t i, int64_t j)
{
    return bm->mask[(i / bm->block_q) * bm->cols + j / bm->block_k] != 0;
}

fa_tile_visibility fa_cpu_tile_visibility(const fa_problem *p, const fa_cpu_rows *rows, int64_t j0, int64_t cols)
{
    const int64_t j1 = j0 + cols;
    if (rows->key_hi <= j0 || rows->key_lo >= j1) return FA_TILE_EMPTY;
    int full = 1;
    for (int64_t r = 0; r < rows->count && full; ++r)
        full = rows->range[r].lo <= j0 && rows->range[r].hi >= j1;
    const fa_block_mask *bm = fa_mask_blocks(&p->mask);
    if (!bm) return full ? FA_TILE_FULL : FA_TILE_PARTIAL;
    /* Scan the mask blocks covering the tile: skip it when all are zero (Algorithm 5). */
    const int64_t r0 = rows->i0 / bm->block_q, r1 = (rows->i0 + rows->count - 1) / bm->block_q;
    const int64_t c0 = j0 / bm->block_k, c1 = (j1 - 1) / bm->block_k;
    int any = 0, all = 1;
    for (int64_t br = r0; br <= r1; ++br)
        for (int64_t bc = c0; bc <= c1; ++bc) {
            const int set = bm->mask[br * bm->cols + bc] != 0;
            any |= set;
            all &= set;
        }
    if (!any) return FA_TILE_EMPTY;
    return full && all ? FA_TILE_FULL : FA_TILE_PARTIAL;
}

void fa_cpu_scale_mask(const fa_problem *p, const fa_cpu_rows *rows, int64_t j0, int64_t cols,
                       fa_tile_visibility vis, int fold_scale, float *st, int64_t ld)
{
    const float scale = fold_scale ? 1.0f : p->shape.scale;
    /* Keys in [all_lo, all_hi) are visible to every row (without a block mask): their columns
     * are only scaled. A causal or window tile has just a band of Br keys where rows differ, so
     * this keeps the element-wise test off most of a wide partial tile. */
    int64_t all_lo = 0, all_hi = 0; /* empty: every element tested (a block mask, below) */
    if (vis == FA_TILE_FULL) {
        all_lo = j0;
        all_hi = j0 + cols;
    } else if (!fa_mask_has_block_mask(&p->mask)) {
        all_lo = INT64_MIN;
        all_hi = INT64_MAX;
        fa_cpu_rows_shared_keys(rows, &all_lo, &all_hi);
    }
    if (fa_mask_has_block_mask(&p->mask) && vis != FA_TILE_FULL) { /* every element tested */
        for (int64_t c = 0; c < cols; ++c) {
            const int64_t j = j0 + c;
            float *keys = st + c * ld;
            for (int64_t r = 0; r < rows->count; ++r) {
                const int visible = j >= rows->range[r].lo && j < rows->range[r].hi &&
                                    block_visible(&p->mask.block_mask, rows->i0 + r, j);
                keys[r] = visible ? keys[r] * scale : -INFINITY;
            }
        }
        return;
    }
    /* The band's columns are only scaled; outside it, each row's keys split into a masked run, its
     * visible run and a masked run, written without a test per element (the causal diagonal
     * tiles: the test per element was 1.5-3% of a one-thread causal forward at N = 1024, d = 64). */
    const int64_t j1 = j0 + cols;
    const int64_t band_lo = all_lo < j0 ? j0 : all_lo > j1 ? j1 : all_lo;
    const int64_t band_hi = all_hi < band_lo ? band_lo : all_hi > j1 ? j1 : all_hi;
    if (!fold_scale)
        for (int64_t j = band_lo; j < band_hi; ++j)
            for (int64_t r = 0; r < rows->count; ++r) st[(j - j0) * ld + r] *= scale;
    const int64_t run_lo[2] = {j0, band_hi}, run_hi[2] = {band_lo, j1};
    for (int64_t r = 0; r < rows->count; ++r) {
        const int64_t lo = rows->range[r].lo, hi = rows->range[r].hi;
        for (int run = 0; run < 2; ++run) {
            const int64_t a = run_lo[run], b = run_hi[run];
            const int64_t v0 = lo < a ? a : lo > b ? b : lo, v1 = hi < v0 ? v0 : hi > b ? b : hi;
            for (int64_t j = a; j < v0; ++j) st[(j - j0) * ld + r] = -INFINITY;
            if (!fold_scale)
                for (int64_t j = v0; j < v1; ++j) st[(j - j0) * ld + r] *= scale;
            for (int64_t j = v1; j < b; ++j) st[(j - j0) * ld + r] = -INFINITY;
        }
    }
}

void fa_cpu_apply_dropout(const fa_problem *p, int64_t b, int64_t h, const fa_cpu_rows *rows, int64_t j0,
                          int64_t cols, float *st, int64_t ld)
{
    const float keep_scale = 1.0f / (1.0f - p->dropout.p);
    for (int64_t r = 0; r < rows->count; ++r) {
        const uint64_t row_base =
            fa_dropout_element((uint64_t)(p->dropout.batch0 + b), (uint64_t)p->shape.heads_q, (uint64_t)h,
                               (uint64_t)p->dropout.rows, (uint64_t)(p->dropout.row0 + rows->i0 + r),
                               (uint64_t)p->dropout.cols, (uint64_t)p->dropout.col0);
        int64_t c = 0;
        while (c < cols) {
            const uint64_t e = row_base + (uint64_t)(j0 + c);
            const fa_philox4x32 w = fa_dropout_words(p->dropout.seed, p->dropout.offset, e >> 2);
            for (uint64_t word = e & 3u; word < 4 && c < cols; ++word, ++c) {
                float *x = st + c * ld + r;
                *x = fa_dropout_uniform(w.v[word]) < p->dropout.p ? 0.0f : *x * keep_scale;
            }
        }
    }
}

void fa_cpu_softmax_step(const fa_cpu_kernels *kern, float scale_in_exp, int64_t rows, int64_t cols, float *st,
                         int64_t ld, float *m, float *l, float *tile_max, float *shift, float *alpha, float *tile_sum)
{
    kern->col_max(st, ld, cols, rows, tile_max);
    fa_cpu_softmax_step_given_max(kern, scale_in_exp, rows, cols, st, ld, m, l, tile_max, shift, alpha, tile_sum);
}

void fa_cpu_softmax_step_given_max(const fa_cpu_kernels *kern, float scale_in_exp, int64_t rows, int64_t cols,
                                   float *st, int64_t ld, float *m, float *l, const float *tile_max, float *shift,
                                   float *alpha, float *tile_sum)
{
    for (int64_t r = 0; r < rows; ++r) {
        const float row_max = tile_max[r] * scale_in_exp; /* -inf stays -inf (scale > 0) */
        const float m_new = m[r] > row_max ? m[r] : row_max;
        if (m_new == -INFINITY) { /* nothing visible in this row so far: P = 0, O stays 0 */
            shift[r] = INFINITY;
            alpha[r] = 1.0f;
            continue;
        }
        shift[r] = m_new;
        /* 0 on the first visible tile; flushed below 2^-64 as P is (exp_poly.h: no subnormal O) */
        const float gap = m[r] - m_new;
        alpha[r] = gap < FA_EXP_LO ? 0.0f : expf(gap);
        m[r] = m_new;
    }
    kern->exp_cols(st, ld, cols, rows, scale_in_exp, shift, tile_sum);
    for (int64_t r = 0; r < rows; ++r) l[r] = l[r] * alpha[r] + tile_sum[r];
}

int fa_cpu_thread_count(int requested)
{
#ifdef _OPENMP
    return requested > 0 ? requested : omp_get_max_threads();
#else
    (void)requested;
    return 1;
#endif
}

int fa_cpu_thread_num(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

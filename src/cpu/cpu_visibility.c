/* Which elements of a score tile are visible on the CPU: per-row key ranges (visibility.h), the
 * block mask, and the masking and scaling of a partial tile (cpu_tile.h). */
#include "cpu_tile.h"

#include <math.h>

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

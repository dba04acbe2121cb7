/* Rows between tensors and f32 tiles on the CPU: loads (plain, transposed, bf16 pairs), views and
 * stores, in any dtype (cpu_tile.h). */
#include "cpu_tile.h"

#include <string.h>

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
        default: /* quantised cache codes are read by the decode kernels with their scales */
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
        default: /* outputs are never quantised (validation) */
            break;
        }
    }
}

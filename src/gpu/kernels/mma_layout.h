/* Fragment layouts of the matrix instructions of the tile layer: which lane holds which element
 * of A (M x K), B (K x N) and C/D (M x N), item by item. Header-only C (FA_HD) so that the device
 * code loads fragments with it and tests/gpu checks it on the CPU against an emulation of each
 * instruction and a plain matrix product.
 *   AMD CDNA (wave64): v_mfma_f32_16x16x16f16 (and _16x16x16bf16_1k on gfx90a, same layout),
 *                      v_mfma_f32_32x32x8f16, v_mfma_f32_16x16x8bf16 (gfx908 bf16).
 *   NVIDIA (warp32):   mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}. */
#ifndef FA_GPU_MMA_LAYOUT_H
#define FA_GPU_MMA_LAYOUT_H
#include "../../common/hostdev.h"

typedef enum fa_mma_shape {
    FA_MFMA_16X16X16,     /* 64 lanes: A 4 items, B 4, C 4 */
    FA_MFMA_32X32X8,      /* 64 lanes: A 4, B 4, C 16 */
    FA_MFMA_16X16X8_BF16, /* 64 lanes: A 2, B 2, C 4 */
    FA_MMA_SYNC_16X8X16   /* 32 lanes: A 8, B 4, C 4 */
} fa_mma_shape;

typedef struct fa_mma_dims { int m, n, k, lanes, a_items, b_items, c_items; } fa_mma_dims;
typedef struct fa_frag_coord { int row, col; } fa_frag_coord;

FA_HD fa_mma_dims fa_mma_shape_dims(fa_mma_shape shape)
{
    fa_mma_dims d;
    switch (shape) {
    case FA_MFMA_32X32X8: d.m = 32; d.n = 32; d.k = 8; d.lanes = 64; break;
    case FA_MFMA_16X16X8_BF16: d.m = 16; d.n = 16; d.k = 8; d.lanes = 64; break;
    case FA_MMA_SYNC_16X8X16: d.m = 16; d.n = 8; d.k = 16; d.lanes = 32; break;
    default: d.m = 16; d.n = 16; d.k = 16; d.lanes = 64; break;
    }
    d.a_items = d.m * d.k / d.lanes;
    d.b_items = d.k * d.n / d.lanes;
    d.c_items = d.m * d.n / d.lanes;
    return d;
}

/* NVIDIA m16n8k16: lanes form 8 groups of 4; group g = lane / 4 owns rows g and g + 8 of A and C
 * and column g of B; thread t = lane % 4 owns k pairs 2t, 2t + 1 (and + 8). */
FA_HD fa_frag_coord fa_mma_sync_a(int lane, int item)
{
    fa_frag_coord c;
    c.row = lane / 4 + 8 * ((item / 2) % 2);
    c.col = 2 * (lane % 4) + item % 2 + 8 * (item / 4);
    return c;
}

/* Element (row, col) of A held by lane in item. */
FA_HD fa_frag_coord fa_mma_a_coord(fa_mma_shape shape, int lane, int item)
{
    if (shape == FA_MMA_SYNC_16X8X16) return fa_mma_sync_a(lane, item);
    const fa_mma_dims d = fa_mma_shape_dims(shape);
    fa_frag_coord c; /* MFMA: lane % M is the row, lane / M picks a run of a_items k values */
    c.row = lane % d.m;
    c.col = (lane / d.m) * d.a_items + item;
    return c;
}

/* Element (k, col) of B held by lane in item. */
FA_HD fa_frag_coord fa_mma_b_coord(fa_mma_shape shape, int lane, int item)
{
    fa_frag_coord c;
    if (shape == FA_MMA_SYNC_16X8X16) {
        c.row = 2 * (lane % 4) + item % 2 + 8 * (item / 2);
        c.col = lane / 4;
        return c;
    }
    const fa_mma_dims d = fa_mma_shape_dims(shape);
    c.row = (lane / d.n) * d.b_items + item;
    c.col = lane % d.n;
    return c;
}

/* Element (row, col) of C/D held by lane in item. */
FA_HD fa_frag_coord fa_mma_c_coord(fa_mma_shape shape, int lane, int item)
{
    fa_frag_coord c;
    if (shape == FA_MMA_SYNC_16X8X16) {
        c.row = lane / 4 + 8 * (item / 2);
        c.col = 2 * (lane % 4) + item % 2;
        return c;
    }
    const fa_mma_dims d = fa_mma_shape_dims(shape);
    /* MFMA: runs of 4 rows; lane / N picks the run inside a band of 4 * (64 / N) rows. */
    c.row = (item / 4) * (4 * (64 / d.n)) + (lane / d.n) * 4 + item % 4;
    c.col = lane % d.n;
    return c;
}
#endif

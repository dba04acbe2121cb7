/* Index math of the tile-MMA forward, shared by the device layers and the CPU tests
 * (tests/gpu/test_tc_layout.c emulates ldmatrix and mma.sync with it). Header-only C.
 *
 * Shared-memory tiles hold 16-bit elements, `width` (64, 128 or 256) per row, rows contiguous.
 * A row is width / 8 chunks of 16 bytes; chunk c of row r is stored at chunk c ^ (r % 8) of the
 * row. Eight consecutive rows read at the same logical chunk (one ldmatrix phase) and eight
 * consecutive chunks of a row (one cp.async phase) then touch eight distinct 16-byte bank groups.
 *
 * Fragments (NVIDIA mma.sync m16n8k16, layouts in mma_layout.h): a warp owns 16 query
 * rows. An accumulator of 16 x N holds N / 8 n-tiles of 4 floats per lane: item 4 * t + c is
 * C item c of n-tile t. The plain-FMA layer instead gives lane l row l % 16 and columns
 * l / 16 + (W / 16) * item (W = warp size, 32 or 64). */
#ifndef FA_GPU_TC_LAYOUT_H
#define FA_GPU_TC_LAYOUT_H
#include "../../common/hostdev.h"
#include "mma_layout.h"

/* Element offset of logical (row, col) in a swizzled tile of `width` columns. */
FA_HD int fa_tc_swizzle(int row, int col, int width)
{
    return row * width + (((col >> 3) ^ (row & 7)) << 3) + (col & 7);
}

/* ldmatrix.x4 gives each lane one 8-element row address: lanes 8i..8i+7 address the rows of
 * matrix i, whose row (lane % 8) lands in register i. The functions below return the logical
 * (row, col) of the 8-element row a lane addresses. */

/* A operand (16 x 16, rows row0.., cols col0..) from a row-major tile (Q): matrices
 * (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (0-7, 8-15), (8-15, 8-15) are A registers 0..3. */
FA_HD fa_frag_coord fa_tc_ldsm_a(int lane, int row0, int col0)
{
    fa_frag_coord c;
    c.row = row0 + lane % 8 + 8 * ((lane / 8) % 2);
    c.col = col0 + 8 * (lane / 16);
    return c;
}

/* B operands of two adjacent n-tiles (n0.., n0 + 8..) at k0.. from a tile stored [n][k] (K: key
 * rows, head-dim columns), no transpose: registers 0, 1 are B of n-tile n0, registers 2, 3 of
 * n-tile n0 + 8. */
FA_HD fa_frag_coord fa_tc_ldsm_b_nk(int lane, int n0, int k0)
{
    fa_frag_coord c;
    c.row = n0 + lane % 8 + 8 * (lane / 16);
    c.col = k0 + 8 * ((lane / 8) % 2);
    return c;
}

/* B operands of two adjacent n-tiles from a tile stored [k][n] (V: key rows = k, head-dim
 * columns = n), with ldmatrix .trans: registers 0, 1 for n-tile n0, 2, 3 for n0 + 8. */
FA_HD fa_frag_coord fa_tc_ldsm_b_kn_trans(int lane, int k0, int n0)
{
    fa_frag_coord c;
    c.row = k0 + lane % 8 + 8 * ((lane / 8) % 2);
    c.col = n0 + 8 * (lane / 16);
    return c;
}

/* A operand (16 x 16, rows row0.., cols col0..) from a tile stored transposed, [col][row] (dS^T:
 * key rows, query columns, read as dS for dQ = dS K), with ldmatrix .trans: the (row, col) of the
 * stored tile a lane addresses. Matrix i holds A rows 8 (i % 2).. and columns 8 (i / 2)..: the
 * stored rows col0 + 8 (i / 2).., at stored column row0 + 8 (i % 2). */
FA_HD fa_frag_coord fa_tc_ldsm_a_trans(int lane, int row0, int col0)
{
    fa_frag_coord c;
    c.row = col0 + lane % 8 + 8 * (lane / 16);
    c.col = row0 + 8 * ((lane / 8) % 2);
    return c;
}

/* The same addresses as base + immediate (the wide-tile forward): a lane of the three functions
 * above reads, at k step m (columns 16 m..), logical chunk 2 m + c of a row congruent to r mod 8
 * (c = lane / 16 for fa_tc_ldsm_a and fa_tc_ldsm_b_kn_trans, (lane / 8) % 2 for fa_tc_ldsm_b_nk;
 * r = lane % 8), whose swizzled column is 64 (m / 4) + fa_tc_ldsm_step_col(m % 4, c, r): the XOR
 * reaches only the low three chunk bits, so a lane needs four columns, not one per step. */
FA_HD int fa_tc_ldsm_step_col(int step_mod4, int chunk_parity, int row_mod8)
{
    return 8 * ((2 * step_mod4 + chunk_parity) ^ row_mod8);
}

/* mma.sync accumulator item -> (row, col) in the warp's 16 x N tile. */
FA_HD fa_frag_coord fa_tc_mma_acc_coord(int lane, int item)
{
    fa_frag_coord c = fa_mma_c_coord(FA_MMA_SYNC_16X8X16, lane, item % 4);
    c.col += 8 * (item / 4);
    return c;
}

/* A lane of the mma.sync layer holds items of two rows ("slots"): lane / 4 and lane / 4 + 8; the
 * four lanes of a quad share them. */
FA_HD int fa_tc_mma_item_slot(int item) { return (item % 4) / 2; }
FA_HD int fa_tc_mma_slot_row(int lane, int slot) { return lane / 4 + 8 * slot; }

/* P reused as the A operand of P V: A register reg (0..3), half h (0 low, 1 high) of key step
 * kstep (16 keys) is accumulator item fa_tc_p_item(kstep, reg, h) of the 16 x Bc score tile:
 * the C layout of n-tiles 2 kstep and 2 kstep + 1 is the A layout of one k16 step. */
FA_HD int fa_tc_p_item(int kstep, int reg, int half) { return 8 * kstep + 4 * (reg / 2) + 2 * (reg % 2) + half; }

/* Plain-FMA layer accumulator item -> (row, col), warp of `warp` lanes (32 or 64). */
FA_HD fa_frag_coord fa_tc_fma_acc_coord(int lane, int item, int warp)
{
    fa_frag_coord c;
    c.row = lane % 16;
    c.col = lane / 16 + (warp / 16) * item;
    return c;
}

/* Plain-FMA layer, P V: the lane and item holding P[lane % 16][c] (read with a shuffle). */
typedef struct fa_lane_item { int lane, item; } fa_lane_item;
FA_HD fa_lane_item fa_tc_fma_p_source(int lane, int c, int warp)
{
    fa_lane_item s;
    s.lane = lane % 16 + 16 * (c % (warp / 16));
    s.item = c / (warp / 16);
    return s;
}

/* AMD CDNA layer (v_mfma_f32_16x16x16f16, wave64), computed transposed: S^T = K Q^T and
 * O^T = V^T P^T, so that the C layout of S^T (keys in rows) is the B layout P^T needs. Lane l then
 * holds query row l % 16 of every accumulator; item 4 t + r is column 16 t + 4 (l / 16) + r. */
FA_HD fa_frag_coord fa_tc_mfma_acc_coord(int lane, int item)
{
    fa_frag_coord c;
    c.row = lane % 16;
    c.col = 16 * (item / 4) + 4 * (lane / 16) + item % 4;
    return c;
}

/* Q K^T step k0, key tile t: element item (0..3) of the A operand is K[key][d] and of the B
 * operand Q[query][d], at the (row, col) below of the K and Q tiles. */
FA_HD fa_frag_coord fa_tc_mfma_qk_a(int lane, int item, int t, int k0)
{
    fa_frag_coord c;
    c.row = 16 * t + lane % 16;
    c.col = k0 + 4 * (lane / 16) + item;
    return c;
}
FA_HD fa_frag_coord fa_tc_mfma_qk_b(int lane, int item, int row0, int k0)
{
    fa_frag_coord c;
    c.row = row0 + lane % 16;
    c.col = k0 + 4 * (lane / 16) + item;
    return c;
}

/* P V step kstep (16 keys), head-dim tile dt: A operand element item is V[key][d] at (row, col)
 * of the V tile; the B operand element item is accumulator item 4 kstep + item of P. */
FA_HD fa_frag_coord fa_tc_mfma_pv_a(int lane, int item, int kstep, int dt)
{
    fa_frag_coord c;
    c.row = 16 * kstep + 4 * (lane / 16) + item;
    c.col = 16 * dt + lane % 16;
    return c;
}
#endif

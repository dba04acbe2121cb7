/* The paper's tile sizes from an on-chip memory of M elements (Algorithm 1, line 1). */
#ifndef FA_TILING_H
#define FA_TILING_H
#include <stdint.h>
#include "hostdev.h"

/* Bc = ceil(M / 4d), Br = min(Bc, d); non-positive inputs give 0. */
FA_HD void fa_paper_tiles(int64_t sram_elements, int64_t head_dim, int64_t *block_rows, int64_t *block_cols)
{
    if (sram_elements <= 0 || head_dim <= 0) { *block_rows = 0; *block_cols = 0; return; }
    const int64_t bc = (sram_elements + 4 * head_dim - 1) / (4 * head_dim);
    *block_cols = bc;
    *block_rows = bc < head_dim ? bc : head_dim;
}

/* Elements one tile step keeps on chip: Q_i (Br x d), K_j and V_j (Bc x d each), S_ij (Br x Bc). */
FA_HD int64_t fa_tile_footprint(int64_t block_rows, int64_t block_cols, int64_t head_dim)
{
    return block_rows * head_dim + 2 * block_cols * head_dim + block_rows * block_cols;
}

/* The paper's tiles snapped down for a backend's kernels: Br to a multiple of row_step, Bc to a
 * multiple of col_step (each at least one step), then shrunk until the tile footprint fits in
 * sram_elements. Never grows a tile past the paper's value except up to one step when the
 * paper's value is below it. */
FA_HD void fa_fit_tiles(int64_t sram_elements, int64_t head_dim, int64_t row_step, int64_t col_step,
                        int64_t *block_rows, int64_t *block_cols)
{
    int64_t br, bc;
    fa_paper_tiles(sram_elements, head_dim, &br, &bc);
    br = br / row_step * row_step;
    bc = bc / col_step * col_step;
    if (br < row_step) br = row_step;
    if (bc < col_step) bc = col_step;
    while (fa_tile_footprint(br, bc, head_dim) > sram_elements && (bc > col_step || br > row_step)) {
        if (bc > col_step && (bc >= br || br <= row_step)) bc -= col_step;
        else br -= row_step;
    }
    *block_rows = br;
    *block_cols = bc;
}
#endif

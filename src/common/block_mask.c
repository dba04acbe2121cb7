/* Block-sparsity pattern helpers for fa_block_mask. */
#include "error.h"

static fa_status check_grid(int64_t rows, int64_t cols, const uint8_t *mask)
{
    if (!mask) return fa_set_error(FA_ERROR_INVALID_VALUE, "mask: is NULL");
    if (rows <= 0 || cols <= 0)
        return fa_set_error(FA_ERROR_INVALID_VALUE, "rows, cols: %lld x %lld must be positive", (long long)rows,
                            (long long)cols);
    return FA_SUCCESS;
}

fa_status fa_block_mask_butterfly(int64_t rows, int64_t cols, uint8_t *mask)
{
    fa_status st = check_grid(rows, cols, mask);
    if (st) return st;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
            const uint64_t x = (uint64_t)(r ^ c);
            mask[r * cols + c] = x == 0 || (x & (x - 1)) == 0;
        }
    return FA_SUCCESS;
}

fa_status fa_block_mask_local_global(int64_t rows, int64_t cols, int64_t local_blocks, int64_t global_blocks,
                                     uint8_t *mask)
{
    fa_status st = check_grid(rows, cols, mask);
    if (st) return st;
    if (local_blocks < 0 || global_blocks < 0)
        return fa_set_error(FA_ERROR_INVALID_VALUE, "local_blocks, global_blocks: must not be negative");
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
            const int64_t dist = r > c ? r - c : c - r;
            mask[r * cols + c] = dist <= local_blocks || r < global_blocks || c < global_blocks;
        }
    return FA_SUCCESS;
}

/* fa-tc-plan: the launch figures of the tile-MMA kernels that the static profile
 * (bench/gpu/sass_profile.py) cannot read from the plugin, from the header that launches them
 * (src/gpu/tc_plan.h), so that the rule has one home. One line per kernel plan and padded width:
 *   KEY W THREADS DYNAMIC_SMEM_BYTES COPIES
 * COPIES: 16-byte cp.async chunks one thread issues per iteration of the kernel's main loop (the
 * streamed tiles: K and V in the forward, Q and dO in dK/dV, K and V in dQ). A new kernel family
 * adds its lines here and one entry to sass_profile.py's KERNELS table. */
#include <stdio.h>

#include "gpu/tc_plan.h"

#define THREADS (FA_TC_WARPS * 32)

static long chunks_per_thread(long rows, int width) { return rows * (width / FA_TC_CHUNK) / THREADS; }

int main(void)
{
    static const int widths[] = {64, 128, 256};
    printf("# KEY W THREADS DYNAMIC_SMEM_BYTES COPIES\n");
    for (size_t k = 0; k < sizeof widths / sizeof widths[0]; ++k) {
        const int w = widths[k];
        printf("fa_tc.forward %d %d %lld %ld\n", w, THREADS, (long long)fa_tc_smem_bytes(w),
               chunks_per_thread(2L * fa_tc_block_cols(w), w));
        if (w <= FA_TC_WIDE_MAX_WIDTH) /* copies unrolled, no copy loop: the figure is for the record */
            printf("fa_tc_wide.forward %d %d %lld %ld\n", w, FA_TC_WIDE_WARPS * 32, (long long)fa_tc_wide_smem_bytes(w),
                   2L * FA_TC_WIDE_BLOCK_COLS(w) * (w / FA_TC_CHUNK) / (FA_TC_WIDE_WARPS * 32));
        if (w <= FA_TC_WIDE_MAX_WIDTH) /* Q and dO of a query tile per iteration */
            printf("fa_tc_wide.backward %d %d %lld %ld\n", w, FA_TC_WIDE_BWD_WARPS * 32,
                   (long long)fa_tc_wide_backward_smem_bytes(w),
                   2L * FA_TC_WIDE_BWD_QUERY_TILE * (w / FA_TC_CHUNK) / (FA_TC_WIDE_BWD_WARPS * 32));
        if (w <= FA_TC_BACKWARD_MAX_WIDTH)
            printf("fa_tc.backward %d %d %lld %ld\n", w, THREADS, (long long)fa_tc_backward_smem_bytes(w),
                   chunks_per_thread(2L * FA_TC_BACKWARD_QUERY_TILE, w));
    }
    return 0;
}

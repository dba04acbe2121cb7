/* The CUDA plugin's tc family (declared in src/gpu/kernels/tc_dispatch.cuh): the mma.sync layer
 * for f16 and bf16 on every device the plugin targets (sm_80 and newer). */
#ifndef FA_NVIDIA_TC_MATRIX_KERNELS_CUH
#define FA_NVIDIA_TC_MATRIX_KERNELS_CUH
#include "../kernels/tc_dispatch.cuh"
#include "tile_mma_sync.cuh"

static fa_tc_set fa_tc_matrix_kernels(fa_dtype dtype, int width, bool matrix_cores)
{
    (void)matrix_cores;
    return fa_tc_kernels_of_dtype<fa_tc::mma_sync_layer>(dtype, width);
}
#endif

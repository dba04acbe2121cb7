/* The HIP plugin's tc family (declared in src/gpu/kernels/tc_dispatch.cuh): the CDNA MFMA layer
 * for f16 on devices with matrix cores (gfx908, gfx90a), the plain-FMA layer for bf16 and on
 * devices without them (gfx1030). */
#ifndef FA_HIP_TC_MATRIX_KERNELS_CUH
#define FA_HIP_TC_MATRIX_KERNELS_CUH
#include "../kernels/tc_dispatch.cuh"
#include "tile_mfma.cuh"

static fa_tc_set fa_tc_matrix_kernels(fa_dtype dtype, int width, bool matrix_cores)
{
    if (matrix_cores && dtype == FA_DTYPE_F16) return fa_tc_kernels_of_width<fa_tc::mfma_layer<FA_DTYPE_F16> >(width);
    return fa_tc_kernels_of_dtype<fa_tc::fma_layer>(dtype, width);
}

/* No wide-tile forward or backward on AMD: the plugin refuses the tc-wide family at open. */
static fa_gpu_kernel fa_tc_wide_forward(fa_dtype dtype, int width)
{
    (void)dtype;
    (void)width;
    return NULL;
}

static fa_gpu_kernel fa_tc_wide_backward(fa_dtype dtype, int width)
{
    (void)dtype;
    (void)width;
    return NULL;
}
#endif

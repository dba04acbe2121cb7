/* The CUDA plugin's tc family (declared in src/gpu/kernels/tc_dispatch.cuh): the mma.sync layer
 * for f16 and bf16 on every device the plugin targets (sm_80 and newer); and the tc-wide
 * family's wide-tile forward and backward. */
#ifndef FA_NVIDIA_TC_MATRIX_KERNELS_CUH
#define FA_NVIDIA_TC_MATRIX_KERNELS_CUH
#include "../kernels/tc_dispatch.cuh"
#include "attention_tc_wide.cuh"
#include "attention_tc_wide_backward.cuh"
#include "tile_mma_sync.cuh"

static fa_tc_set fa_tc_matrix_kernels(fa_dtype dtype, int width, bool matrix_cores)
{
    (void)matrix_cores;
    return fa_tc_kernels_of_dtype<fa_tc::mma_sync_layer>(dtype, width);
}

template <fa_dtype DT>
static fa_gpu_kernel fa_tc_wide_forward_of_width(int width)
{
    if (width == 64) return fa_tc_wide::forward<DT, 64>;
    if (width == 128) return fa_tc_wide::forward<DT, 128>;
    return NULL;
}

static fa_gpu_kernel fa_tc_wide_forward(fa_dtype dtype, int width)
{
    if (dtype == FA_DTYPE_F16) return fa_tc_wide_forward_of_width<FA_DTYPE_F16>(width);
    if (dtype == FA_DTYPE_BF16) return fa_tc_wide_forward_of_width<FA_DTYPE_BF16>(width);
    return NULL;
}

template <fa_dtype DT>
static fa_gpu_kernel fa_tc_wide_backward_of_width(int width)
{
    if (width == 64) return fa_tc_wide::backward<DT, 64>;
    if (width == 128) return fa_tc_wide::backward<DT, 128>;
    return NULL;
}

static fa_gpu_kernel fa_tc_wide_backward(fa_dtype dtype, int width)
{
    if (dtype == FA_DTYPE_F16) return fa_tc_wide_backward_of_width<FA_DTYPE_F16>(width);
    if (dtype == FA_DTYPE_BF16) return fa_tc_wide_backward_of_width<FA_DTYPE_BF16>(width);
    return NULL;
}
#endif

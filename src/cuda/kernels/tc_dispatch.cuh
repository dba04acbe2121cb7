/* The instantiated tile-MMA forward kernels: per layer, f16 and bf16 at widths 64, 128, 256.
 * NVIDIA builds both layers (mma.sync and plain FMA); AMD builds the plain-FMA layer. */
#ifndef FA_GPU_TC_DISPATCH_CUH
#define FA_GPU_TC_DISPATCH_CUH
#include "../tc_plan.h"
#include "attention_tc.cuh"
#include "generic_dispatch.cuh"
#include "tile_fma.cuh"
#include "tile_mma_sync.cuh"

template <class L>
static fa_gpu_kernel fa_tc_kernel_of_width(int width)
{
    switch (width) {
    case 64: return fa_tc::forward<L, 64>;
    case 128: return fa_tc::forward<L, 128>;
    case 256: return fa_tc::forward<L, 256>;
    }
    return NULL;
}

template <template <fa_dtype> class Layer>
static fa_gpu_kernel fa_tc_kernel_of_dtype(fa_dtype dtype, int width)
{
    if (dtype == FA_DTYPE_F16) return fa_tc_kernel_of_width<Layer<FA_DTYPE_F16> >(width);
    if (dtype == FA_DTYPE_BF16) return fa_tc_kernel_of_width<Layer<FA_DTYPE_BF16> >(width);
    return NULL;
}

/* Whether this build has tile-MMA kernels of the family (tc needs a matrix-instruction layer). */
static bool fa_tc_family_built(fa_gpu_family family)
{
#if defined(__HIPCC__)
    return family == FA_GPU_FAMILY_FMA;
#else
    return family == FA_GPU_FAMILY_FMA || family == FA_GPU_FAMILY_TC;
#endif
}

/* The forward kernel of (family, dtype, padded width), or NULL: the caller then runs the generic
 * kernels (f32, head dims above 256, the generic family). */
static fa_gpu_kernel fa_tc_forward_kernel(fa_gpu_family family, fa_dtype dtype, int width)
{
    if (family == FA_GPU_FAMILY_FMA) return fa_tc_kernel_of_dtype<fa_tc::fma_layer>(dtype, width);
#if !defined(__HIPCC__)
    if (family == FA_GPU_FAMILY_TC) return fa_tc_kernel_of_dtype<fa_tc::mma_sync_layer>(dtype, width);
#endif
    return NULL;
}
#endif

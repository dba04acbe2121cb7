/* The instantiated tile-MMA kernels: per layer, f16 and bf16, the forward at widths 64, 128, 256
 * and the backward (dK/dV and dQ) at widths 64 and 128. NVIDIA builds both layers (mma.sync and
 * plain FMA); AMD builds the plain-FMA layer and the MFMA layer (f16 only). */
#ifndef FA_GPU_TC_DISPATCH_CUH
#define FA_GPU_TC_DISPATCH_CUH
#include "../tc_plan.h"
#include "attention_tc.cuh"
#include "attention_tc_backward.cuh"
#include "dq_accum.cuh"
#include "generic_dispatch.cuh"
#include "tile_fma.cuh"

/* The kernels of one (layer, width): NULL entries where not instantiated. forward_plain and
 * backward_plain: the tc-wide family's forward and backward of the problems fa_tc_wide_takes
 * (tc_plan.h), NULL in other families. */
typedef struct fa_tc_set {
    fa_gpu_kernel forward, backward_dkdv, backward_dq, forward_plain, backward_plain;
} fa_tc_set;

template <class L, int W>
static fa_tc_set fa_tc_instance(void)
{
    fa_tc_set set;
    set.forward = fa_tc::forward<L, W>;
    /* the backward is not instantiated above FA_TC_BACKWARD_MAX_WIDTH (the width argument is
     * clamped only so that the unused branch names an existing instance) */
    set.backward_dkdv = W <= FA_TC_BACKWARD_MAX_WIDTH ? fa_tc::backward_dkdv<L, (W <= FA_TC_BACKWARD_MAX_WIDTH ? W : 64)> : NULL;
    set.backward_dq = W <= FA_TC_BACKWARD_MAX_WIDTH ? fa_tc::backward_dq<L, (W <= FA_TC_BACKWARD_MAX_WIDTH ? W : 64)> : NULL;
    set.forward_plain = NULL;
    set.backward_plain = NULL;
    return set;
}

template <class L>
static fa_tc_set fa_tc_kernels_of_width(int width)
{
    switch (width) {
    case 64: return fa_tc_instance<L, 64>();
    case 128: return fa_tc_instance<L, 128>();
    case 256: return fa_tc_instance<L, 256>();
    }
    fa_tc_set none = {NULL, NULL, NULL, NULL, NULL};
    return none;
}

template <template <fa_dtype> class Layer>
static fa_tc_set fa_tc_kernels_of_dtype(fa_dtype dtype, int width)
{
    if (dtype == FA_DTYPE_F16) return fa_tc_kernels_of_width<Layer<FA_DTYPE_F16> >(width);
    if (dtype == FA_DTYPE_BF16) return fa_tc_kernels_of_width<Layer<FA_DTYPE_BF16> >(width);
    fa_tc_set none = {NULL, NULL, NULL, NULL, NULL};
    return none;
}

/* The tc family: the architecture's matrix instructions, defined by each vendor's
 * tc_matrix_kernels.cuh (src/gpu/nvidia: mma.sync; src/gpu/amd: MFMA where the device has matrix
 * cores, the plain-FMA layer otherwise). */
static fa_tc_set fa_tc_matrix_kernels(fa_dtype dtype, int width, bool matrix_cores);

/* The tc-wide family's forward_plain at (dtype, padded width), defined by each vendor's
 * tc_matrix_kernels.cuh: NVIDIA's wide-tile kernel; NULL where a vendor has none. */
static fa_gpu_kernel fa_tc_wide_forward(fa_dtype dtype, int width);

/* The tc-wide family's backward_plain (dQ into f32 slices, summed by fa_dq_accum::convert). */
static fa_gpu_kernel fa_tc_wide_backward(fa_dtype dtype, int width);

/* The kernels of (family, dtype, padded width); NULL entries make the caller run the generic
 * kernels (f32, head dims above 256, backward above width 128, the generic family). */
static fa_tc_set fa_tc_kernels(fa_gpu_family family, fa_dtype dtype, int width, bool matrix_cores)
{
    if (family == FA_GPU_FAMILY_FMA) return fa_tc_kernels_of_dtype<fa_tc::fma_layer>(dtype, width);
    if (family == FA_GPU_FAMILY_TC) return fa_tc_matrix_kernels(dtype, width, matrix_cores);
    if (family == FA_GPU_FAMILY_TC_WIDE) {
        fa_tc_set set = fa_tc_matrix_kernels(dtype, width, matrix_cores);
        set.forward_plain = fa_tc_wide_forward(dtype, width);
        set.backward_plain = fa_tc_wide_backward(dtype, width);
        return set;
    }
    fa_tc_set none = {NULL, NULL, NULL, NULL, NULL};
    return none;
}
#endif

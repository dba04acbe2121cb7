/* Every AMD builtin of the CDNA tile layer, one small function each, and the f16 type it feeds
 * them. The SIMT emulator (tests/gpu/emu) defines the guard first and provides host models of
 * the same names, so tile_mfma.cuh runs unchanged on the CPU. */
#ifndef FA_HIP_AMDGCN_CUH
#define FA_HIP_AMDGCN_CUH
#include <stdint.h>

#include "../gpu_runtime.h"

typedef _Float16 fa_amdgcn_half;
typedef _Float16 fa_amdgcn_half4 __attribute__((ext_vector_type(4)));
typedef float fa_amdgcn_float4 __attribute__((ext_vector_type(4)));

__device__ __forceinline__ fa_amdgcn_half fa_amdgcn_half_from_bits(uint16_t bits)
{
    return __builtin_bit_cast(_Float16, bits);
}

/* Round to nearest even, as v_cvt_f16_f32. */
__device__ __forceinline__ fa_amdgcn_half fa_amdgcn_half_from_float(float x) { return static_cast<_Float16>(x); }

#if defined(__gfx908__) || defined(__gfx90a__)
#  define FA_AMDGCN_HAVE_MFMA 1
/* v_mfma_f32_16x16x16f16 (one wavefront): c += A B, fragments as in kernels/mma_layout.h. */
__device__ __forceinline__ void fa_amdgcn_mfma_f32_16x16x16f16(float c[4], fa_amdgcn_half4 a, fa_amdgcn_half4 b)
{
    fa_amdgcn_float4 acc = {c[0], c[1], c[2], c[3]};
    acc = __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, acc, 0, 0, 0);
    for (int r = 0; r < 4; ++r) c[r] = acc[r];
}
#endif
#endif

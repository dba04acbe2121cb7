/* The per-architecture warp layer: the warp (wavefront) size as a compile-time constant and
 * warp-wide reductions whose shuffles always name their width. 64 lanes on CDNA (gfx908, gfx90a),
 * 32 on RDNA (gfx1030, wave32) and NVIDIA. The host pass of a HIP compile sees no target, so it
 * gets a placeholder; launches use the device's runtime warp size, never this constant. */
#ifndef FA_GPU_WARP_CUH
#define FA_GPU_WARP_CUH
#include "../gpu_runtime.h"
#if !defined(__HIPCC__)
#include "../nvidia/ptx.cuh"
#endif

#if defined(__HIPCC__)
#  if defined(__AMDGCN_WAVEFRONT_SIZE)
#    define FA_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#  else
#    define FA_WARP_SIZE 64 /* host pass only: kernel bodies are not generated here */
#  endif
#else
#  define FA_WARP_SIZE 32
#endif

__device__ __forceinline__ float fa_shfl_xor(float v, int lane_mask)
{
#if defined(__HIPCC__)
    return __shfl_xor(v, lane_mask, FA_WARP_SIZE);
#else
    return __shfl_xor_sync(0xffffffffu, v, lane_mask, FA_WARP_SIZE);
#endif
}

/* v of lane src_lane (same width as above). */
__device__ __forceinline__ float fa_shfl_idx(float v, int src_lane)
{
#if defined(__HIPCC__)
    return __shfl(v, src_lane, FA_WARP_SIZE);
#else
    return __shfl_sync(0xffffffffu, v, src_lane, FA_WARP_SIZE);
#endif
}

__device__ __forceinline__ void fa_warp_sync(void)
{
#if defined(__HIPCC__)
    fa_gpu_wave_barrier();
#else
    __syncwarp();
#endif
}

__device__ __forceinline__ float fa_warp_sum(float v)
{
    for (int offset = FA_WARP_SIZE / 2; offset > 0; offset /= 2) v += fa_shfl_xor(v, offset);
    return v;
}

__device__ __forceinline__ float fa_warp_max(float v)
{
    for (int offset = FA_WARP_SIZE / 2; offset > 0; offset /= 2) v = fmaxf(v, fa_shfl_xor(v, offset));
    return v;
}

/* 2^x with exp2(-inf) = 0; softmax runs in base 2 with a log2(e)-prescaled scale. On NVIDIA one
 * MUFU.EX2 (ptx.cuh: results below 2^-126 flush to 0). */
#if defined(__HIPCC__)
__device__ __forceinline__ float fa_exp2(float x) { return exp2f(x); }
#else
__device__ __forceinline__ float fa_exp2(float x) { return fa_ptx_ex2_approx_ftz(x); }
#endif
#endif

/* 16-byte global -> shared copies of the tile-MMA forward. NVIDIA (sm_80+): cp.async, which
 * bypasses registers and lets the next tile's load overlap the current tile's math; the group is
 * waited for before the barrier that publishes it. AMD: an ordinary 16-byte load and store (the
 * barrier publishes it). A copy with valid == false writes zeros (padding rows and columns). */
#ifndef FA_GPU_ASYNC_COPY_CUH
#define FA_GPU_ASYNC_COPY_CUH
#include <stdint.h>

#include "../gpu_runtime.h"

__device__ __forceinline__ void fa_copy16(uint16_t *smem_dst, const uint16_t *global_src, bool valid)
{
#if defined(__HIPCC__)
    uint4 value = make_uint4(0u, 0u, 0u, 0u);
    if (valid) value = *reinterpret_cast<const uint4 *>(global_src);
    *reinterpret_cast<uint4 *>(smem_dst) = value;
#else
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    const int src_bytes = valid ? 16 : 0; /* 0: nothing read, the 16 bytes are zero-filled */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global_src), "r"(src_bytes));
#endif
}

/* Closes the group of copies issued since the last commit. */
__device__ __forceinline__ void fa_copy_commit(void)
{
#if !defined(__HIPCC__)
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

/* Waits for every committed copy of this thread; a __syncthreads() must follow before other
 * threads read the data. */
__device__ __forceinline__ void fa_copy_wait_all(void)
{
#if !defined(__HIPCC__)
    asm volatile("cp.async.wait_group 0;\n" ::);
#endif
}
#endif

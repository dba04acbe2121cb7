/* 16-byte global -> shared copies of the tile-MMA forward. NVIDIA (sm_80+): cp.async, which
 * bypasses registers and lets the next tile's load overlap the current tile's math; a group is
 * waited for (fa_copy_wait_all, or fa_copy_wait_pending with newer groups left in flight) before
 * the barrier that publishes it. AMD: an ordinary 16-byte load and store (the barrier publishes
 * it). A copy with valid == false writes zeros (padding rows and columns). */
#ifndef FA_GPU_ASYNC_COPY_CUH
#define FA_GPU_ASYNC_COPY_CUH
#include <stdint.h>

#include "../gpu_runtime.h"
#if !defined(__HIPCC__)
#  include "../nvidia/ptx.cuh"
#endif

__device__ __forceinline__ void fa_copy16(uint16_t *smem_dst, const uint16_t *global_src, bool valid)
{
#if defined(__HIPCC__)
    uint4 value = make_uint4(0u, 0u, 0u, 0u);
    if (valid) value = *reinterpret_cast<const uint4 *>(global_src);
    *reinterpret_cast<uint4 *>(smem_dst) = value;
#else
    fa_ptx_cp_async16(smem_dst, global_src, valid);
#endif
}

/* Closes the group of copies issued since the last commit. */
__device__ __forceinline__ void fa_copy_commit(void)
{
#if !defined(__HIPCC__)
    fa_ptx_cp_async_commit();
#endif
}

/* Waits until at most N of this thread's committed groups are still in flight: every older group
 * has landed (copies issued since the last commit are not waited for). A __syncthreads() must
 * follow before other threads read the data. AMD: nothing to wait for, the copies are plain
 * loads and stores. */
template <int N> __device__ __forceinline__ void fa_copy_wait_pending(void)
{
#if !defined(__HIPCC__)
    fa_ptx_cp_async_wait_group<N>();
#endif
}

/* Waits for every committed copy of this thread (a __syncthreads() must follow, as above). */
__device__ __forceinline__ void fa_copy_wait_all(void) { fa_copy_wait_pending<0>(); }
#endif

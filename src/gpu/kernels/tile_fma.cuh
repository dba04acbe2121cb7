/* The plain-FMA tile layer: the same contract as the tensor-core layers (tile_layer.cuh) with f32
 * FMAs, for targets without matrix instructions (AMD RDNA gfx1030) and built for CUDA too, so that
 * this path runs on NVIDIA hardware. Lane l holds row l % 16 and columns l / 16 + G item
 * (G = W / 16 lane groups); Q and K^T are read from shared memory, P is passed between the lanes
 * of a row by shuffles. */
#ifndef FA_GPU_TILE_FMA_CUH
#define FA_GPU_TILE_FMA_CUH
#include "tc_layout.h"
#include "tile_layer.cuh"
#include "warp.cuh"

namespace fa_tc {

template <fa_dtype DT>
struct fma_layer {
    static constexpr int kWarp = FA_WARP_SIZE;
    static constexpr int kGroups = kWarp / 16;
    static constexpr int kSlots = 1;
    static constexpr __host__ __device__ int items(int n) { return n / kGroups; }
    template <int N>
    struct acc { float v[N / kGroups]; };

    __device__ static __forceinline__ int item_slot(int) { return 0; }
    __device__ static __forceinline__ int slot_row(int lane, int) { return lane % 16; }
    __device__ static __forceinline__ int item_col(int lane, int item) { return fa_tc_fma_acc_coord(lane, item, kWarp).col; }
    __device__ static __forceinline__ bool row_leader(int lane) { return lane < 16; }
    /* a row's items live in lanes r, r + 16, ... */
    __device__ static __forceinline__ float row_max(float x)
    {
        for (int offset = 16; offset < kWarp; offset *= 2) x = fmaxf(x, fa_shfl_xor(x, offset));
        return x;
    }
    __device__ static __forceinline__ float row_sum(float x)
    {
        for (int offset = 16; offset < kWarp; offset *= 2) x += fa_shfl_xor(x, offset);
        return x;
    }

    template <int W, int BC>
    __device__ static __forceinline__ void qk(acc<BC> &s, const uint16_t *sq, int row0, const uint16_t *sk)
    {
        const int lane = threadIdx.x % kWarp, row = row0 + lane % 16;
#pragma unroll
        for (int it = 0; it < items(BC); ++it) s.v[it] = 0.0f;
        for (int x = 0; x < W; ++x) {
            const float q = to_float<DT>(sq[fa_tc_swizzle(row, x, W)]);
#pragma unroll
            for (int it = 0; it < items(BC); ++it)
                s.v[it] = fmaf(q, to_float<DT>(sk[fa_tc_swizzle(item_col(lane, it), x, W)]), s.v[it]);
        }
    }

    /* P stays f32 here; rounding it to 16 bits as the tensor-core layers do is not needed. */
    template <int BC, int W>
    __device__ static __forceinline__ void pv(acc<W> &o, const acc<BC> &p, const uint16_t *sv)
    {
        const int lane = threadIdx.x % kWarp;
#pragma unroll
        for (int c = 0; c < BC; ++c) {
            const fa_lane_item src = fa_tc_fma_p_source(lane, c, kWarp); /* holds P[row][c] */
            const float pc = fa_shfl_idx(p.v[src.item], src.lane);
#pragma unroll
            for (int it = 0; it < items(W); ++it)
                o.v[it] = fmaf(pc, to_float<DT>(sv[fa_tc_swizzle(c, item_col(lane, it), W)]), o.v[it]);
        }
    }
};

} // namespace fa_tc
#endif

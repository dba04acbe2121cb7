/* The NVIDIA tile layer (sm_80+): mma.sync.m16n8k16 with f32 accumulation, operands from
 * swizzled shared memory by ldmatrix (x4, .trans for V), P converted in registers into the A
 * operand of P V. Contract in tile_layer.cuh; index math in tc_layout.h (tested on the CPU). */
#ifndef FA_GPU_TILE_MMA_SYNC_CUH
#define FA_GPU_TILE_MMA_SYNC_CUH
#if !defined(__HIPCC__)
#include "ptx.cuh"
#include "../kernels/tc_layout.h"
#include "../kernels/tile_layer.cuh"
#include "../kernels/warp.cuh"

namespace fa_tc {

/* c += A B for one 16 x 8 x 16 step. */
template <fa_dtype DT>
__device__ __forceinline__ void mma_16x8x16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    if (DT == FA_DTYPE_F16) fa_ptx_mma_m16n8k16_f16(c, a, b0, b1);
    else fa_ptx_mma_m16n8k16_bf16(c, a, b0, b1);
}

/* Two f32 rounded (to nearest even) into one register: lo in the low half. */
template <fa_dtype DT>
__device__ __forceinline__ uint32_t pack2(float lo, float hi)
{
    return DT == FA_DTYPE_F16 ? fa_ptx_cvt_rn_f16x2(hi, lo) : fa_ptx_cvt_rn_bf16x2(hi, lo);
}

template <fa_dtype DT>
struct mma_sync_layer {
    static constexpr int kWarp = 32;
    static constexpr int kSlots = 2; /* rows lane / 4 and lane / 4 + 8 */
    static constexpr __host__ __device__ int items(int n) { return n / 2; }
    template <int N>
    struct acc { float v[N / 2]; };

    __device__ static __forceinline__ int item_slot(int item) { return fa_tc_mma_item_slot(item); }
    __device__ static __forceinline__ int slot_row(int lane, int slot) { return fa_tc_mma_slot_row(lane, slot); }
    __device__ static __forceinline__ int item_col(int lane, int item) { return fa_tc_mma_acc_coord(lane, item).col; }
    __device__ static __forceinline__ bool row_leader(int lane) { return lane % 4 == 0; }
    /* a row's items live in the 4 lanes of a quad */
    __device__ static __forceinline__ float row_max(float x)
    {
        x = fmaxf(x, fa_shfl_xor(x, 1));
        return fmaxf(x, fa_shfl_xor(x, 2));
    }
    __device__ static __forceinline__ float row_sum(float x)
    {
        x += fa_shfl_xor(x, 1);
        return x + fa_shfl_xor(x, 2);
    }

    template <int W, int BC>
    __device__ static __forceinline__ void qk(acc<BC> &s, const uint16_t *sq, int row0, const uint16_t *sk)
    {
        const int lane = threadIdx.x % kWarp;
#pragma unroll
        for (int i = 0; i < BC / 2; ++i) s.v[i] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < W; k0 += 16) {
            uint32_t a[4];
            const fa_frag_coord ca = fa_tc_ldsm_a(lane, row0, k0);
            fa_ptx_ldmatrix_x4(a, sq + fa_tc_swizzle(ca.row, ca.col, W));
#pragma unroll
            for (int n0 = 0; n0 < BC; n0 += 16) {
                uint32_t b[4];
                const fa_frag_coord cb = fa_tc_ldsm_b_nk(lane, n0, k0);
                fa_ptx_ldmatrix_x4(b, sk + fa_tc_swizzle(cb.row, cb.col, W));
                mma_16x8x16<DT>(&s.v[n0 / 2], a, b[0], b[1]);     /* n-tile n0 / 8: items 4 (n0 / 8).. */
                mma_16x8x16<DT>(&s.v[n0 / 2 + 4], a, b[2], b[3]); /* n-tile n0 / 8 + 1 */
            }
        }
    }

    template <int BC, int W>
    __device__ static __forceinline__ void pv(acc<W> &o, const acc<BC> &p, const uint16_t *sv)
    {
        const int lane = threadIdx.x % kWarp;
#pragma unroll
        for (int kstep = 0; kstep < BC / 16; ++kstep) {
            uint32_t a[4];
#pragma unroll
            for (int reg = 0; reg < 4; ++reg)
                a[reg] = pack2<DT>(p.v[fa_tc_p_item(kstep, reg, 0)], p.v[fa_tc_p_item(kstep, reg, 1)]);
#pragma unroll
            for (int n0 = 0; n0 < W; n0 += 16) {
                uint32_t b[4];
                const fa_frag_coord cb = fa_tc_ldsm_b_kn_trans(lane, 16 * kstep, n0);
                fa_ptx_ldmatrix_x4_trans(b, sv + fa_tc_swizzle(cb.row, cb.col, W));
                mma_16x8x16<DT>(&o.v[n0 / 2], a, b[0], b[1]);
                mma_16x8x16<DT>(&o.v[n0 / 2 + 4], a, b[2], b[3]);
            }
        }
    }
};

} // namespace fa_tc
#endif
#endif

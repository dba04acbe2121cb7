/* The AMD CDNA tile layer (gfx908, gfx90a): v_mfma_f32_16x16x16f16 with f32 accumulation, for
 * f16 inputs, under the contract of src/gpu/kernels/tile_layer.cuh. Computed transposed
 * (S^T = K Q^T, O^T = V^T P^T; index math in tc_layout.h, emulated on the CPU by
 * tests/gpu/test_tc_layout.c) so that P stays in registers as the B operand. One query row per lane
 * (lane % 16): row reductions are shuffles by 16 and 32, as in the plain-FMA layer.
 * Compiled into every HIP code object; its kernels only run where the plugin finds a CDNA device
 * (elsewhere their bodies trap). */
#ifndef FA_HIP_TILE_MFMA_CUH
#define FA_HIP_TILE_MFMA_CUH
#if defined(__HIPCC__)
#include "../kernels/tc_layout.h"
#include "../kernels/tile_layer.cuh"
#include "../kernels/warp.cuh"
#include "amdgcn.cuh"

namespace fa_tc {

typedef fa_amdgcn_half4 mfma_half4;

template <fa_dtype DT>
struct mfma_layer {
    static_assert(DT == FA_DTYPE_F16, "the CDNA layer is written for f16 (bf16 runs on the FMA layer)");
    static constexpr int kWarp = 64;
    static constexpr int kSlots = 1;
    static constexpr __host__ __device__ int items(int n) { return n / 4; }
    template <int N>
    struct acc { float v[N / 4]; };

    __device__ static __forceinline__ int item_slot(int) { return 0; }
    __device__ static __forceinline__ int slot_row(int lane, int) { return lane % 16; }
    __device__ static __forceinline__ int item_col(int lane, int item) { return fa_tc_mfma_acc_coord(lane, item).col; }
    __device__ static __forceinline__ bool row_leader(int lane) { return lane < 16; }
    __device__ static __forceinline__ float row_max(float x)
    {
        x = fmaxf(x, fa_shfl_xor(x, 16));
        return fmaxf(x, fa_shfl_xor(x, 32));
    }
    __device__ static __forceinline__ float row_sum(float x)
    {
        x += fa_shfl_xor(x, 16);
        return x + fa_shfl_xor(x, 32);
    }

    static __device__ __forceinline__ fa_amdgcn_half element(const uint16_t *tile, fa_frag_coord c, int w)
    {
        return fa_amdgcn_half_from_bits(tile[fa_tc_swizzle(c.row, c.col, w)]);
    }

    /* c += A B on one 16 x 16 x 16 tile (4 accumulator items). */
    static __device__ __forceinline__ void mfma(float *c, mfma_half4 a, mfma_half4 b)
    {
#if defined(FA_AMDGCN_HAVE_MFMA)
        fa_amdgcn_mfma_f32_16x16x16f16(c, a, b);
#else
        (void)c; (void)a; (void)b;
        fa_gpu_trap(); /* no MFMA on this target: the plugin never selects this layer here */
#endif
    }

    template <int W, int BC>
    __device__ static __forceinline__ void qk(acc<BC> &s, const uint16_t *sq, int row0, const uint16_t *sk)
    {
        const int lane = threadIdx.x % kWarp;
#pragma unroll
        for (int i = 0; i < BC / 4; ++i) s.v[i] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < W; k0 += 16) {
            mfma_half4 b;
            for (int item = 0; item < 4; ++item) b[item] = element(sq, fa_tc_mfma_qk_b(lane, item, row0, k0), W);
#pragma unroll
            for (int t = 0; t < BC / 16; ++t) {
                mfma_half4 a;
                for (int item = 0; item < 4; ++item) a[item] = element(sk, fa_tc_mfma_qk_a(lane, item, t, k0), W);
                mfma(&s.v[4 * t], a, b);
            }
        }
    }

    template <int BC, int W>
    __device__ static __forceinline__ void pv(acc<W> &o, const acc<BC> &p, const uint16_t *sv)
    {
        const int lane = threadIdx.x % kWarp;
#pragma unroll
        for (int kstep = 0; kstep < BC / 16; ++kstep) {
            mfma_half4 b; /* P^T in registers */
            for (int item = 0; item < 4; ++item) b[item] = fa_amdgcn_half_from_float(p.v[4 * kstep + item]);
#pragma unroll
            for (int dt = 0; dt < W / 16; ++dt) {
                mfma_half4 a;
                for (int item = 0; item < 4; ++item) a[item] = element(sv, fa_tc_mfma_pv_a(lane, item, kstep, dt), W);
                mfma(&o.v[4 * dt], a, b);
            }
        }
    }
};

} // namespace fa_tc
#endif
#endif

/* The CDNA tile MMA of the per-architecture layer: fragments loaded from shared memory with the
 * layouts of mfma_layout.h and multiplied by __builtin_amdgcn_mfma_f32_16x16x16f16. Compiled for
 * gfx908 and gfx90a only; gfx1030 (RDNA2, no MFMA) and the CUDA build use the FMA kernels.
 * Status: compiled and its layout checked on the CPU (tests/gpu/test_mfma_layout.c); the attention
 * kernels do not call it yet, and it has never run on AMD hardware. */
#ifndef FA_MFMA_TILE_CUH
#define FA_MFMA_TILE_CUH
#include "../cuda/gpu_runtime.h"
#include "mfma_layout.h"

#if defined(__gfx908__) || defined(__gfx90a__)
#  define FA_HAVE_MFMA 1
typedef _Float16 fa_half4 __attribute__((ext_vector_type(4)));
typedef float fa_float4 __attribute__((ext_vector_type(4)));

/* acc += A (16x16, row-major at a, leading dim lda) * B (16x16 at b, ldb), one wavefront. */
__device__ __forceinline__ fa_float4 fa_mfma_tile_16x16x16(const _Float16 *a, int lda, const _Float16 *b, int ldb,
                                                           fa_float4 acc)
{
    const int lane = threadIdx.x % 64;
    fa_half4 fa, fb;
    for (int item = 0; item < 4; ++item) {
        const fa_frag_coord ca = fa_mma_a_coord(FA_MFMA_16X16X16, lane, item);
        const fa_frag_coord cb = fa_mma_b_coord(FA_MFMA_16X16X16, lane, item);
        fa[item] = a[ca.row * lda + ca.col];
        fb[item] = b[cb.row * ldb + cb.col];
    }
    return __builtin_amdgcn_mfma_f32_16x16x16f16(fa, fb, acc, 0, 0, 0);
}
#endif

/* Hardware check of the layer, for a session with an AMD GPU: C = A B for one 16x16x16 tile
 * (one wavefront of 64 threads); on targets without MFMA it computes the product with FMAs. */
__global__ void fa_mfma_tile_selftest(const _Float16 *a, const _Float16 *b, float *c)
{
#if defined(FA_HAVE_MFMA)
    const int lane = threadIdx.x % 64;
    fa_float4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
    acc = fa_mfma_tile_16x16x16(a, 16, b, 16, acc);
    for (int item = 0; item < 4; ++item) {
        const fa_frag_coord cc = fa_mma_c_coord(FA_MFMA_16X16X16, lane, item);
        c[cc.row * 16 + cc.col] = acc[item];
    }
#else
    for (int e = threadIdx.x; e < 256; e += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < 16; ++k) acc += (float)a[(e / 16) * 16 + k] * (float)b[k * 16 + e % 16];
        c[e] = acc;
    }
#endif
}
#endif

/* The last pass of the tc-wide backward (nvidia/attention_tc_wide_backward.cuh): dQ is the sum of
 * p.dq_splits f32 slices (p.dq_accum, p.dq_slice floats apart; row (b, h, i) of a slice at
 * fa_stat_index(p, b, h, i) p.dq_width), taken in slice order, times the softmax scale and rounded
 * to the problem's dtype: the same bits on every run. Plain CUDA/HIP, no vendor instruction. */
#ifndef FA_GPU_DQ_ACCUM_CUH
#define FA_GPU_DQ_ACCUM_CUH
#include "tensor_access.cuh"

namespace fa_dq_accum {

constexpr int kRows = 64; /* query rows per block */

/* One block per (kRows query rows, query head, sequence). */
__global__ void convert(const fa_gpu_params params)
{
    if (fa_gpu_failed(params)) return;
    const fa_gpu_params p = fa_sequence_params(params, blockIdx.z);
    const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kRows;
    const int64_t q_row0 = params.varlen.cu_seqlens_q ? params.varlen.cu_seqlens_q[b] : 0;
    if (i0 >= p.shape.seqlen_q) return;
    const int64_t rows = p.shape.seqlen_q - i0 < kRows ? p.shape.seqlen_q - i0 : kRows;
    const int w = p.dq_width, quads = w / 4;
    const int64_t d = p.shape.head_dim;
    for (int e = threadIdx.x; e < rows * quads; e += blockDim.x) {
        const int64_t i = i0 + e / quads;
        const int col = 4 * (e % quads);
        if (col >= d) continue;
        const float *src = params.dq_accum + fa_stat_index(params, b, h, q_row0 + i) * w + col;
        float4 sum = *reinterpret_cast<const float4 *>(src);
        for (int x = 1; x < p.dq_splits; ++x) {
            const float4 v = *reinterpret_cast<const float4 *>(src + x * p.dq_slice);
            sum.x += v.x;
            sum.y += v.y;
            sum.z += v.z;
            sum.w += v.w;
        }
        const int64_t base = fa_row_offset(p.dq, b, i, h) + col;
        const float f[4] = {sum.x, sum.y, sum.z, sum.w};
        for (int c = 0; c < 4 && col + c < d; ++c) fa_store_elem(p.dq.data, base + c, p.shape.dtype, f[c] * p.shape.scale);
    }
}

} // namespace fa_dq_accum
#endif

/* fa_merge_partials on the GPU: one warp per output row (grid-stride over [batch, heads, seqlen]),
 * the row rule of src/common/merge_rule.h, shared with the host merge: the parts' weights in part
 * order, each lane accumulating its elements over the parts in part order. The same arithmetic as
 * the host (fmaf, one division, expf/logf), so the emulator's results equal the host's bit for
 * bit; on a GPU only expf/logf may differ from the host's libm in the last bits. */
#ifndef FA_GPU_MERGE_CUH
#define FA_GPU_MERGE_CUH
#include "../../common/merge_rule.h"
#include "../plan.h"
#include "tensor_access.cuh"
#include "warp.cuh"

/* One part in device memory: its output (element strides) and lse [batch, heads, seqlen]. */
typedef struct fa_gpu_merge_part {
    const void *data;
    int64_t stride_batch, stride_seq, stride_head;
    const float *lse;
} fa_gpu_merge_part;

typedef struct fa_gpu_merge_params {
    const fa_gpu_merge_part *parts; /* device copy, [n] */
    int n;
    fa_dtype dtype;
    int64_t batch, heads, seqlen, head_dim;
    fa_gpu_tensor out;
    float *lse_out; /* or NULL */
} fa_gpu_merge_params;

namespace fa_merge {

constexpr int kThreads = FA_GENERIC_WARPS * FA_WARP_SIZE;

__global__ void __launch_bounds__(kThreads) merge_partials(const fa_gpu_merge_params p)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    const int W = FA_WARP_SIZE, lane = threadIdx.x % W;
    const int64_t rows = p.batch * p.heads * p.seqlen, warps = static_cast<int64_t>(gridDim.x) * FA_GENERIC_WARPS;
    for (int64_t row = blockIdx.x * FA_GENERIC_WARPS + threadIdx.x / W; row < rows; row += warps) {
        const int64_t s = row % p.seqlen, h = row / p.seqlen % p.heads, b = row / (p.seqlen * p.heads);
        fa_merge_row r = fa_merge_row_start();
        for (int c = 0; c < p.n; ++c) fa_merge_see(&r, p.parts[c].lse[row]);
        float sum = 0.0f;
        for (int c = 0; c < p.n; ++c) sum += fa_merge_weight(&r, p.parts[c].lse[row]);
        const float factor = fa_merge_factor(&r, sum);
        const int64_t out_base = fa_row_offset(p.out, b, s, h);
        for (int64_t x = lane; x < p.head_dim; x += W) {
            float acc = 0.0f;
            for (int c = 0; c < p.n; ++c) {
                const fa_gpu_merge_part part = p.parts[c];
                const float weight = fa_merge_weight(&r, part.lse[row]);
                if (weight == 0.0f) continue; /* a part with no visible key is not read */
                const int64_t at = b * part.stride_batch + s * part.stride_seq + h * part.stride_head + x;
                acc = fa_merge_accumulate(acc, weight, fa_load_elem(part.data, at, p.dtype));
            }
            fa_store_elem(p.out.data, out_base + x, p.dtype, acc * factor);
        }
        if (p.lse_out && lane == 0) p.lse_out[row] = fa_merge_lse(&r, sum);
    }
}

} // namespace fa_merge
#endif

/* The gradients of the learnable score modifiers (fa_backward_ex): dsinks and dbias, each a pass
 * of its own after the backward's delta pre-pass, each summed in a fixed order (deterministic,
 * no atomics) whatever kernel family computed dQ, dK and dV. */
#ifndef FA_GPU_MODIFIER_GRADIENTS_CUH
#define FA_GPU_MODIFIER_GRADIENTS_CUH
#include "attention_generic.cuh"

namespace fa_generic {

/* dsinks[h] = -sum over every row (b, i) of exp(sink_h - lse) * D (a sink is a logit with no
 * value, so its dP is 0): one block per query head, each thread a fixed set of rows, in double,
 * the threads' sums added in thread order. Dense or packed alike: the lse and delta layouts of the
 * whole problem. Dynamic shared memory: kThreads doubles. */
__global__ void __launch_bounds__(kThreads) sink_gradients(const fa_gpu_params p)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    FA_DYNAMIC_SMEM(double, partial);
    if (fa_gpu_failed(p)) return; /* a device-side check failed: write nothing */
    const int64_t h = blockIdx.x, rows = p.shape.batch * p.shape.seqlen_q;
    const float sink = p.modifiers.sinks[h];
    double acc = 0.0;
    for (int64_t row = threadIdx.x; sink != -INFINITY && row < rows; row += blockDim.x) {
        const int64_t at = fa_stat_index(p, row / p.shape.seqlen_q, h, row % p.shape.seqlen_q);
        const float lse = p.outputs.lse[at];
        if (lse != -INFINITY) acc -= exp(static_cast<double>(sink) - static_cast<double>(lse)) * p.delta[at];
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x != 0) return;
    double sum = 0.0;
    for (unsigned t = 0; t < blockDim.x; ++t) sum += partial[t];
    p.outputs.dsinks[h] = static_cast<float>(sum);
}

/* The dbias pass: one block per distinct row tile of dbias (its batch, head and query tile; a
 * single one along each axis dbias broadcasts), over the padded layout's rows and keys
 * (grid_rows x grid_cols: seqlen_q x seqlen_k, or max_seqlen_q x max_seqlen_k of a packed
 * batch). For each key tile it recomputes the score gradient of every (batch, head, query row)
 * that maps onto its elements, in a fixed order (batch, head, query tile, row), and writes every
 * element, zeros where nothing is visible. Each thread owns fixed elements of the tile (the
 * forward's row/lane split); a dbias that broadcasts over rows adds the warps' rows in warp order.
 * Q, dO, K and V are staged again per key tile: a pass of its own, run only for a dbias. Dynamic
 * shared memory: that of the backward (FA_GPU_PASS_BACKWARD). */
template <int TILE>
__global__ void __launch_bounds__(kThreads) backward_dbias(const fa_gpu_params params)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    constexpr int W = FA_WARP_SIZE, RPW = TILE / FA_GENERIC_WARPS, CPL = (TILE + W - 1) / W;
    FA_DYNAMIC_SMEM(float, smem);
    if (fa_gpu_failed(params)) return; /* a device-side check failed: write nothing (not even zeros) */
    const fa_bias &db = params.outputs.dbias;
    const int64_t d = params.shape.head_dim, ld = fa_gpu_smem_ld(d), group = params.shape.heads_q / params.shape.heads_kv;
    float *sq = smem, *sdo = sq + TILE * ld, *sk = sdo + TILE * ld, *sv = sk + TILE * ld;
    float *slse = sv + TILE * ld, *sdelta = slse + TILE, *srow = sdelta + TILE; /* srow: a row per warp */
    const int warp = threadIdx.x / W, lane = threadIdx.x % W;
    const bool rows_summed = db.stride_q == 0;
    const int64_t grid_rows = params.grid_rows, grid_keys = params.grid_cols;
    const int64_t i0 = rows_summed ? 0 : static_cast<int64_t>(blockIdx.x) * TILE;
    const int64_t out_rows = rows_summed ? 1 : (grid_rows - i0 < TILE ? grid_rows - i0 : TILE);
    const int64_t batches = params.varlen.batch ? params.varlen.batch : params.shape.batch;
    const int64_t b_lo = db.stride_batch ? blockIdx.z : 0, b_hi = db.stride_batch ? b_lo + 1 : batches;
    const int64_t h_lo = db.stride_head ? blockIdx.y : 0, h_hi = db.stride_head ? h_lo + 1 : params.shape.heads_q;

    for (int64_t j0 = 0; j0 < grid_keys; j0 += TILE) {
        const int64_t cols = grid_keys - j0 < TILE ? grid_keys - j0 : TILE;
        float acc[RPW][CPL];
        for (int rr = 0; rr < RPW; ++rr)
            for (int cc = 0; cc < CPL; ++cc) acc[rr][cc] = 0.0f;
        for (int64_t b = b_lo; b < b_hi; ++b) {
            const fa_gpu_params p = fa_sequence_params(params, b);
            const int64_t keys = p.shape.seqlen_k - j0 < cols ? p.shape.seqlen_k - j0 : cols;
            for (int64_t h = h_lo; h < h_hi && keys > 0; ++h) {
                for (int64_t q0 = i0; q0 < p.shape.seqlen_q && (rows_summed || q0 == i0); q0 += TILE) {
                    const int64_t rows = p.shape.seqlen_q - q0 < TILE ? p.shape.seqlen_q - q0 : TILE;
                    const fa_key_range span = fa_tile_keys(p, b, q0, rows);
                    if (span.hi <= j0 || span.lo >= j0 + keys || !fa_block_mask_any(p, q0, rows, j0, keys)) continue;
                    __syncthreads(); /* the previous tiles are no longer read */
                    const int64_t loaded = fa_loaded_keys(p, b, j0, keys);
                    fa_load_tile(p.q, p.shape.dtype, b, q0, h, rows, TILE, d, sq, ld);
                    fa_load_tile(p.dout, p.shape.dtype, b, q0, h, rows, TILE, d, sdo, ld);
                    fa_load_tile(p.k, p.shape.dtype, b, j0, h / group, loaded, TILE, d, sk, ld);
                    fa_load_tile(p.v, p.shape.dtype, b, j0, h / group, loaded, TILE, d, sv, ld);
                    stage_row_stats(p, b, h, q0, rows, TILE, slse, sdelta);
                    __syncthreads();
                    for (int rr = 0; rr < RPW; ++rr) {
                        const int r = warp * RPW + rr;
                        if (r >= rows) break;
                        const int64_t i = q0 + r;
                        if (slse[r] == -INFINITY) continue;
                        const fa_key_range range = fa_row_keys(p, b, i);
                        for (int cc = 0; cc < CPL; ++cc) {
                            const int c = lane + cc * W;
                            if (c >= keys || !fa_element_visible(p, range, i, j0 + c)) continue;
                            const bool kept = p.dropout.p > 0.0f && fa_dropout_kept(p, b, h, i, j0 + c);
                            acc[rr][cc] += recompute(p, b, h, i, j0 + c, dot_row(sq + r * ld, sk + c * ld, d),
                                                     dot_row(sdo + r * ld, sv + c * ld, d), slse[r], sdelta[r], kept)
                                               .ds_score;
                        }
                    }
                }
            }
        }
        const int64_t ob = db.stride_batch ? b_lo : 0, oh = db.stride_head ? h_lo : 0;
        if (!rows_summed) {
            for (int rr = 0; rr < RPW; ++rr) {
                const int r = warp * RPW + rr;
                if (r >= out_rows) break;
                for (int cc = 0; cc < CPL; ++cc) {
                    const int c = lane + cc * W;
                    if (c < cols) fa_store_elem(db.data, fa_bias_index(db, ob, oh, i0 + r, j0 + c), db.dtype, acc[rr][cc]);
                }
            }
            continue;
        }
        for (int cc = 0; cc < CPL; ++cc) {
            const int c = lane + cc * W;
            float sum = 0.0f;
            for (int rr = 0; rr < RPW; ++rr) sum += acc[rr][cc];
            if (c < TILE) srow[warp * TILE + c] = sum;
        }
        __syncthreads();
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            float sum = 0.0f;
            for (int w = 0; w < FA_GENERIC_WARPS; ++w) sum += srow[w * TILE + c];
            fa_store_elem(db.data, fa_bias_index(db, ob, oh, 0, j0 + c), db.dtype, sum);
        }
        __syncthreads(); /* srow is rewritten by the next key tile */
    }
}

} // namespace fa_generic
#endif

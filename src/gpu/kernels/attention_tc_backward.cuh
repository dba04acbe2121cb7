/* The tile-MMA backward, written once over a tile layer L (tile_layer.cuh), for widths up to 128:
 * two kernels after the delta pre-pass (D = rowsum(dO o O), fa_generic::row_delta), neither with
 * atomics, so the result is deterministic:
 *   backward_dkdv: one block per (64 keys, kv head, batch); each warp keeps dK and dV of its 16 keys
 *     in accumulator registers and streams the query tiles of every query head of the group in a
 *     fixed order. Transposed recompute: S^T = K Q^T and dP^T = V dO^T come out of the layer's qk
 *     with keys as rows, so P^T and dS^T are already the A operands of dV += P^T dO and
 *     dK += dS^T Q (the layer's pv, P reused in registers).
 *   backward_dq: one block per (64 queries, query head, batch), the forward's structure: S = Q K^T,
 *     dP = dO V^T, dS = P o (dP - D), dQ += dS K, dQ kept in registers.
 * Both recompute P from the forward's lse in base 2 and apply the masks and the shared Philox
 * dropout stream exactly as the forward did, with the score modifiers (fa_score_log2; dS goes
 * through the softcap's derivative; dsinks and dbias are passes of their own, modifier_gradients.cuh).
 * Keys hidden by padding are loaded as zeros. */
#ifndef FA_GPU_ATTENTION_TC_BACKWARD_CUH
#define FA_GPU_ATTENTION_TC_BACKWARD_CUH
#include "attention_tc.cuh"

namespace fa_tc {

/* The gradient terms of one element (Algorithm 4): z = dropout(P) (what multiplied V) and
 * dS = P o (dropout(dP) - D) times d score / d (tau q.k); zeros when the element is not visible. */
struct element_terms { float z, ds; };

__device__ __forceinline__ element_terms element_gradients(const fa_gpu_params &p, bool visible, float score,
                                                           float dp, float lse_log2, float delta, int64_t b,
                                                           int64_t h, int64_t i, int64_t j)
{
    element_terms t = {0.0f, 0.0f};
    if (!visible) return t;
    float dscore;
    const float prob = fa_exp2(fa_score_log2(p, b, h, i, j, score, &dscore) - lse_log2);
    t.z = prob;
    if (p.dropout.p > 0.0f) {
        const bool kept = dropout_kept(p, b, h, i, j);
        t.z = kept ? prob * p.keep_scale : 0.0f;
        dp = kept ? dp * p.keep_scale : 0.0f;
    }
    t.ds = prob * (dp - delta) * dscore;
    return t;
}

/* Whether a tile whose elements are all visible may take plain_gradients: no score modifier and
 * no dropout (their per-element work stays in element_gradients). */
__device__ __forceinline__ bool plain_terms(const fa_gpu_params &p) { return !p.modified && p.dropout.p == 0.0f; }

/* element_gradients of a visible element without modifiers or dropout (d score = 1), branch-free:
 * score becomes P (= z) and dp becomes dS, bit for bit what element_gradients gives. */
__device__ __forceinline__ void plain_gradients(const fa_gpu_params &p, float &score, float &dp, float lse_log2,
                                                float delta)
{
    const float prob = fa_exp2(score * p.scale_log2 - lse_log2);
    score = prob;
    dp = prob * (dp - delta);
}

/* Stores a warp's 16 x W accumulator (rows row0.. of tensor t, head h) times factor. */
template <class L, int W>
__device__ __forceinline__ void store_rows(const fa_gpu_params &p, const fa_gpu_tensor &t, int64_t b, int64_t h,
                                           int64_t row0, int64_t valid_rows, const typename L::template acc<W> &a,
                                           float factor)
{
    const int lane = threadIdx.x % L::kWarp;
#pragma unroll
    for (int it = 0; it < L::items(W); ++it) {
        const int r = L::slot_row(lane, L::item_slot(it)), col = L::item_col(lane, it);
        if (row0 + r < valid_rows && col < p.shape.head_dim)
            fa_store_elem(t.data, fa_row_offset(t, b, row0 + r, h) + col, p.shape.dtype, a.v[it] * factor);
    }
}

template <class L, int W>
__global__ void __launch_bounds__(FA_TC_WARPS * L::kWarp) backward_dkdv(const fa_gpu_params params)
{
    FA_GPU_REQUIRE_BLOCK(FA_TC_WARPS * L::kWarp);
    const fa_gpu_params p = fa_sequence_params(params, blockIdx.z);
    constexpr int BK = FA_TC_BLOCK_ROWS, BQ = FA_TC_BACKWARD_QUERY_TILE;
    FA_DYNAMIC_SMEM(uint16_t, fa_tc_smem);
    uint16_t *sk = fa_tc_smem, *sv = sk + BK * W, *sq = sv + BK * W, *sdo = sq + BQ * W;
    float *slse = reinterpret_cast<float *>(sdo + BQ * W), *sdelta = slse + BQ;
    const int warp = threadIdx.x / L::kWarp, lane = threadIdx.x % L::kWarp;
    const int64_t b = blockIdx.z, hk = blockIdx.y, group = p.shape.heads_q / p.shape.heads_kv;
    const int64_t j0 = static_cast<int64_t>(blockIdx.x) * BK;
    const int64_t keys = p.shape.seqlen_k - j0 < BK ? p.shape.seqlen_k - j0 : BK;
    if (keys <= 0) return; /* past its sequence (packed batch) */
    const int64_t valid_k = fa_valid_keys(p, b);

    typename L::template acc<W> dk, dv;
#pragma unroll
    for (int it = 0; it < L::items(W); ++it) dk.v[it] = dv.v[it] = 0.0f;
    load_tile<W>(p, p.k, b, j0, hk, fa_loaded_keys(p, b, j0, keys), BK, sk);
    load_tile<W>(p, p.v, b, j0, hk, fa_loaded_keys(p, b, j0, keys), BK, sv);
    fa_copy_commit();

    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t i0 = 0; i0 < p.shape.seqlen_q; i0 += BQ) {
            const int64_t rows = p.shape.seqlen_q - i0 < BQ ? p.shape.seqlen_q - i0 : BQ;
            const fa_key_range span = fa_tile_keys(p, b, i0, rows);
            if (span.hi <= j0 || span.lo >= j0 + keys || !fa_block_mask_any(p, i0, rows, j0, keys)) continue;
            __syncthreads(); /* the previous query tile is no longer read */
            load_tile<W>(p, p.q, b, i0, h, rows, BQ, sq);
            load_tile<W>(p, p.dout, b, i0, h, rows, BQ, sdo);
            fa_copy_commit();
            fa_generic::stage_row_stats(p, b, h, i0, rows, BQ, slse, sdelta);
            fa_copy_wait_all();
            __syncthreads();

            typename L::template acc<BQ> st, dpt; /* rows: this warp's 16 keys; columns: the query tile */
            L::template qk<W, BQ>(st, sk, warp * FA_TC_WARP_ROWS, sq);
            L::template qk<W, BQ>(dpt, sv, warp * FA_TC_WARP_ROWS, sdo);
            if (plain_terms(p) && rows == BQ && keys == BK &&
                fa_tile_all_visible(p, fa_tile_common_keys(p, b, i0, rows), i0, rows, j0, BK, keys)) {
#pragma unroll
                for (int it = 0; it < L::items(BQ); ++it) {
                    const int c = L::item_col(lane, it);
                    plain_gradients(p, st.v[it], dpt.v[it], slse[c], sdelta[c]);
                }
            } else {
#pragma unroll
                for (int it = 0; it < L::items(BQ); ++it) {
                    const int c = L::item_col(lane, it);
                    const int64_t i = i0 + c, j = j0 + warp * FA_TC_WARP_ROWS + L::slot_row(lane, L::item_slot(it));
                    const fa_key_range range = fa_visible_keys_at(fa_diagonal_key(i, p.mask.diag_offset), valid_k, p.mask.causal,
                                                                  p.mask.window_left, p.mask.window_right);
                    const bool visible = c < rows && slse[c] != -INFINITY && element_visible(p, range, i, j);
                    const element_terms t = element_gradients(p, visible, st.v[it], dpt.v[it], slse[c], sdelta[c], b, h, i, j);
                    st.v[it] = t.z;
                    dpt.v[it] = t.ds;
                }
            }
            L::template pv<BQ, W>(dv, st, sdo);
            L::template pv<BQ, W>(dk, dpt, sq);
        }
    }
    fa_copy_wait_all(); /* K and V copies when no query tile was visible */
    store_rows<L, W>(p, p.dk, b, hk, j0 + warp * FA_TC_WARP_ROWS, p.shape.seqlen_k, dk, p.shape.scale);
    store_rows<L, W>(p, p.dv, b, hk, j0 + warp * FA_TC_WARP_ROWS, p.shape.seqlen_k, dv, 1.0f);
}

template <class L, int W>
__global__ void __launch_bounds__(FA_TC_WARPS * L::kWarp, FA_TC_MIN_BLOCKS(3)) backward_dq(const fa_gpu_params params)
{
    FA_GPU_REQUIRE_BLOCK(FA_TC_WARPS * L::kWarp);
    const fa_gpu_params p = fa_sequence_params(params, blockIdx.z);
    constexpr int BR = FA_TC_BLOCK_ROWS, BC = FA_TC_BACKWARD_QUERY_TILE;
    FA_DYNAMIC_SMEM(uint16_t, fa_tc_smem);
    uint16_t *sq = fa_tc_smem, *sdo = sq + BR * W, *sk = sdo + BR * W, *sv = sk + BC * W;
    const int warp = threadIdx.x / L::kWarp, lane = threadIdx.x % L::kWarp;
    const fa_generic::query_block qb = fa_generic::this_query_block<BR>(p);
    if (qb.rows <= 0) return; /* past its sequence (packed batch) */

    fa_key_range range[L::kSlots];
    int64_t row_index[L::kSlots];
    float lse_log2[L::kSlots], delta[L::kSlots];
#pragma unroll
    for (int sl = 0; sl < L::kSlots; ++sl) {
        const int r = warp * FA_TC_WARP_ROWS + L::slot_row(lane, sl);
        row_index[sl] = qb.i0 + r;
        const int64_t stat = fa_stat_index(p, qb.b, qb.h, row_index[sl]);
        range[sl] = r < qb.rows ? fa_row_keys(p, qb.b, row_index[sl]) : fa_key_range{0, 0};
        lse_log2[sl] = r < qb.rows ? p.outputs.lse[stat] * FA_LOG2E : -INFINITY;
        delta[sl] = r < qb.rows ? p.delta[stat] : 0.0f;
    }
    const fa_key_range common = fa_tile_common_keys(p, qb.b, qb.i0, qb.rows);
    typename L::template acc<W> dq;
#pragma unroll
    for (int it = 0; it < L::items(W); ++it) dq.v[it] = 0.0f;
    load_tile<W>(p, p.q, qb.b, qb.i0, qb.h, qb.rows, BR, sq);
    load_tile<W>(p, p.dout, qb.b, qb.i0, qb.h, qb.rows, BR, sdo);
    fa_copy_commit();

    for (int64_t tile = qb.keys.lo / BC; tile * BC < qb.keys.hi; ++tile) {
        const int64_t j0 = tile * BC, cols = tile_cols<BC>(p, tile);
        if (!fa_block_mask_any(p, qb.i0, qb.rows, j0, cols)) continue; /* K_j, V_j never loaded */
        __syncthreads(); /* the previous key tile is no longer read */
        load_tile<W>(p, p.k, qb.b, j0, qb.hk, fa_loaded_keys(p, qb.b, j0, cols), BC, sk);
        load_tile<W>(p, p.v, qb.b, j0, qb.hk, fa_loaded_keys(p, qb.b, j0, cols), BC, sv);
        fa_copy_commit();
        fa_copy_wait_all();
        __syncthreads();

        typename L::template acc<BC> s, dp;
        L::template qk<W, BC>(s, sq, warp * FA_TC_WARP_ROWS, sk);
        L::template qk<W, BC>(dp, sdo, warp * FA_TC_WARP_ROWS, sv);
        if (plain_terms(p) && qb.rows == BR && fa_tile_all_visible(p, common, qb.i0, qb.rows, j0, BC, cols)) {
#pragma unroll
            for (int it = 0; it < L::items(BC); ++it) {
                const int sl = L::item_slot(it);
                plain_gradients(p, s.v[it], dp.v[it], lse_log2[sl], delta[sl]);
                s.v[it] = dp.v[it];
            }
        } else {
#pragma unroll
            for (int it = 0; it < L::items(BC); ++it) {
                const int sl = L::item_slot(it);
                const int64_t j = j0 + L::item_col(lane, it);
                const bool visible = lse_log2[sl] != -INFINITY && element_visible(p, range[sl], row_index[sl], j);
                s.v[it] = element_gradients(p, visible, s.v[it], dp.v[it], lse_log2[sl], delta[sl], qb.b, qb.h,
                                            row_index[sl], j).ds;
            }
        }
        L::template pv<BC, W>(dq, s, sk);
    }
    fa_copy_wait_all(); /* Q and dO copies when no key tile was visible */
    store_rows<L, W>(p, p.dq, qb.b, qb.h, qb.i0 + warp * FA_TC_WARP_ROWS, p.shape.seqlen_q, dq, p.shape.scale);
}

} // namespace fa_tc
#endif

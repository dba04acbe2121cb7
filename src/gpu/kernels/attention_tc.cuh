/* The tile-MMA forward, written once over a per-architecture tile layer L (tile_layer.cuh):
 * f16/bf16 inputs, f32 accumulation, head dims zero-padded to W (64, 128 or 256).
 *
 * A block of FA_TC_WARPS warps owns FA_TC_BLOCK_ROWS query rows (16 per warp); K and V tiles of
 * BC keys stream through swizzled shared memory. Key tiles run in reverse order (last visible
 * first) with a one-tile pipeline: V_j is copied while S = Q K_j^T is computed, K of the next
 * tile while O += P V_j is. Softmax is online and stays in the accumulator registers, in base 2
 * (scores times tau log2 e, exp2); the row sum is kept per lane and reduced once at the end.
 * Masks are evaluated element by element only on boundary tiles: a tile inside every row's
 * visible key range and fully set in the block mask skips them; tiles the block mask hides are
 * never loaded. Dropout uses the shared Philox stream; fully masked rows give zeros, lse = -inf.
 * Score modifiers through fa_score_log2 (score_modifiers.cuh), as in the generic kernels; a sink
 * starts its row's running max, and the row's leader lane's partial sum at 1. */
#ifndef FA_GPU_ATTENTION_TC_CUH
#define FA_GPU_ATTENTION_TC_CUH
#include <math.h>

#include "../tc_plan.h"
#include "async_copy.cuh"
#include "attention_generic.cuh"
#include "score_modifiers.cuh"
#include "tc_layout.h"
#include "tensor_access.cuh"

namespace fa_tc {

/* tile[rows x W] (swizzled) = t[b, s0 + r, h, 0..W) with zeros past valid_rows and past the head
 * dim; by every thread of the block. */
template <int W>
__device__ __forceinline__ void load_tile(const fa_gpu_params &p, const fa_gpu_tensor &t, int64_t b, int64_t s0, int64_t h,
                                          int64_t valid_rows, int rows, uint16_t *tile)
{
    const int64_t d = p.shape.head_dim;
    const uint16_t *base = static_cast<const uint16_t *>(t.data);
    if (p.chunked_loads) {
        /* A thread copies one chunk column x of every row_step-th row: the block's thread count (a
         * multiple of 32) is a multiple of the chunks per row (8, 16 or 32), so x stays fixed and
         * the source address steps by a constant (64-bit index math once per tile, not per chunk). */
        constexpr int kChunks = W / FA_TC_CHUNK;
        const int x = (threadIdx.x % kChunks) * FA_TC_CHUNK, row_step = blockDim.x / kChunks;
        int r = threadIdx.x / kChunks;
        const uint16_t *src = base + fa_row_offset(t, b, s0 + r, h) + x;
        const int64_t src_step = (int64_t)row_step * t.stride_seq;
        const int64_t live_rows = x < d ? valid_rows : 0;
        for (; r < rows; r += row_step, src += src_step) {
            const bool valid = r < live_rows;
            fa_copy16(tile + fa_tc_swizzle(r, x, W), valid ? src : base, valid);
        }
    } else {
        for (int e = threadIdx.x; e < rows * W; e += blockDim.x) {
            const int r = e / W, x = e % W;
            tile[fa_tc_swizzle(r, x, W)] = r < valid_rows && x < d ? base[fa_row_offset(t, b, s0 + r, h) + x] : 0;
        }
    }
}

/* Keys of key tile `tile` inside the sequence (the last tile may be partial). */
template <int BC>
__device__ __forceinline__ int64_t tile_cols(const fa_gpu_params &p, int64_t tile)
{
    return p.shape.seqlen_k - tile * BC < BC ? p.shape.seqlen_k - tile * BC : BC;
}

/* The last key tile at or before `tile` that the block mask does not hide entirely, or first - 1. */
template <int BC>
__device__ __forceinline__ int64_t previous_live_tile(const fa_gpu_params &p, const fa_generic::query_block &qb, int64_t tile,
                                                      int64_t first)
{
    while (tile >= first && !fa_block_mask_any(p, qb.i0, qb.rows, tile * BC, tile_cols<BC>(p, tile))) --tile;
    return tile;
}

/* The shared Philox stream's decision for element (b, h, i, j) (fa_dropout_kept), with the Philox
 * rounds out of line: the softmax loop is unrolled over a lane's items, and inlining ten rounds
 * into each copy multiplies the kernel's code (and build time) for a path only dropout takes. */
__device__ __noinline__ bool dropout_keep_element(uint64_t seed, uint64_t offset, uint64_t element, float p)
{
    return fa_dropout_keep(seed, offset, element, p) != 0;
}

__device__ __forceinline__ bool dropout_kept(const fa_gpu_params &p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    return dropout_keep_element(p.dropout.seed, p.dropout.offset, fa_element_of(p, b, h, i, j), p.dropout.p);
}

/* Whether the block mask lets row i see key j, out of line for the same reason (two 64-bit
 * divisions). */
__device__ __noinline__ bool block_mask_allows(const uint8_t *mask, int64_t cols, int32_t block_q, int32_t block_k,
                                               int64_t i, int64_t j)
{
    return mask[(i / block_q) * cols + j / block_k] != 0;
}

/* fa_element_visible of tensor_access.cuh with the block-mask lookup out of line. */
__device__ __forceinline__ bool element_visible(const fa_gpu_params &p, fa_key_range range, int64_t i, int64_t j)
{
    return j >= range.lo && j < range.hi &&
           (!p.mask.block_mask.mask || block_mask_allows(p.mask.block_mask.mask, p.mask.block_mask.cols, p.mask.block_mask.block_q, p.mask.block_mask.block_k, i, j));
}

/* Online softmax of one score tile in registers: scales and masks s into base-2 logits, updates
 * the running max m and per-lane partial sum l of each row slot, rescales o, and leaves in s the
 * probabilities that multiply V (dropped ones zero, kept ones scaled by 1 / (1 - p)). */
template <class L, int BC, int W>
__device__ __forceinline__ void softmax_tile(const fa_gpu_params &p, const fa_generic::query_block &qb, int64_t j0,
                                             bool interior, const fa_key_range range[L::kSlots],
                                             const int64_t row_index[L::kSlots], typename L::template acc<BC> &s,
                                             typename L::template acc<W> &o, float m[L::kSlots], float l[L::kSlots])
{
    const int lane = threadIdx.x % L::kWarp;
    float tile_max[L::kSlots], m_use[L::kSlots], alpha[L::kSlots];
#pragma unroll
    for (int sl = 0; sl < L::kSlots; ++sl) tile_max[sl] = -INFINITY;
    /* The common tile (every element visible, no modifier) takes a loop without per-element
     * branches: they cost more than the products (a branch and a convergence barrier each). */
    if (interior && !p.modified) {
#pragma unroll
        for (int it = 0; it < L::items(BC); ++it) {
            const int sl = L::item_slot(it);
            s.v[it] *= p.scale_log2;
            tile_max[sl] = fmaxf(tile_max[sl], s.v[it]);
        }
    } else {
#pragma unroll
        for (int it = 0; it < L::items(BC); ++it) {
            const int sl = L::item_slot(it);
            const int64_t j = j0 + L::item_col(lane, it);
            float x = s.v[it] * p.scale_log2;
            if (!interior && !element_visible(p, range[sl], row_index[sl], j)) x = -INFINITY;
            else if (p.modified) /* rows past the block's own (zero Q) would read a bias row that may not exist */
                x = row_index[sl] - qb.i0 < qb.rows ? fa_score_log2(p, qb.b, qb.h, row_index[sl], j, s.v[it], NULL) : -INFINITY;
            s.v[it] = x;
            tile_max[sl] = fmaxf(tile_max[sl], x);
        }
    }
#pragma unroll
    for (int sl = 0; sl < L::kSlots; ++sl) {
        const float m_new = fmaxf(m[sl], L::row_max(tile_max[sl]));
        m_use[sl] = m_new == -INFINITY ? 0.0f : m_new; /* a row with nothing visible yet stays at 0 */
        alpha[sl] = fa_exp2(m[sl] - m_use[sl]);
        m[sl] = m_new;
        l[sl] *= alpha[sl];
    }
#pragma unroll
    for (int it = 0; it < L::items(BC); ++it) {
        const int sl = L::item_slot(it);
        s.v[it] = fa_exp2(s.v[it] - m_use[sl]);
        l[sl] += s.v[it]; /* the denominator counts dropped elements too */
    }
    if (p.dropout.p > 0.0f) {
#pragma unroll
        for (int it = 0; it < L::items(BC); ++it)
            if (s.v[it] != 0.0f)
                s.v[it] = dropout_kept(p, qb.b, qb.h, row_index[L::item_slot(it)], j0 + L::item_col(lane, it))
                              ? s.v[it] * p.keep_scale
                              : 0.0f;
    }
#pragma unroll
    for (int it = 0; it < L::items(W); ++it) o.v[it] *= alpha[L::item_slot(it)];
}

/* Blocks per multiprocessor that nvcc's register allocation aims for (__launch_bounds__'s second
 * argument), measured on an H200: 3 (168 registers, a few spills) beats 2 (182) for the width-64
 * forward by 13% and for the backward's dQ kernel by 11%; at width 128 the forward's spills at
 * 168 registers cost more than the third block gains (2.77 against 2.64 ms). HIP reads that
 * argument differently (waves per execution unit) and keeps the default. */
#if defined(__HIPCC__)
#define FA_TC_MIN_BLOCKS(nvidia_blocks) 1
#else
#define FA_TC_MIN_BLOCKS(nvidia_blocks) (nvidia_blocks)
#endif

template <class L, int W>
__global__ void __launch_bounds__(FA_TC_WARPS * L::kWarp, FA_TC_MIN_BLOCKS(W <= 64 ? 3 : 1)) forward(const fa_gpu_params params)
{
    FA_GPU_REQUIRE_BLOCK(FA_TC_WARPS * L::kWarp);
    const fa_gpu_params p = fa_sequence_params(params, blockIdx.z);
    constexpr int BC = FA_TC_BLOCK_COLS(W), BR = FA_TC_BLOCK_ROWS;
    FA_DYNAMIC_SMEM(uint16_t, fa_tc_smem);
    uint16_t *sq = fa_tc_smem, *sk = sq + BR * W, *sv = sk + BC * W;
    const int warp = threadIdx.x / L::kWarp, lane = threadIdx.x % L::kWarp;
    const fa_generic::query_block qb = fa_generic::this_query_block<BR>(p);
    if (qb.rows <= 0) return; /* past its sequence (packed batch) */

    fa_key_range range[L::kSlots];
    int64_t row_index[L::kSlots];
    float m[L::kSlots], l[L::kSlots];
    const float sink = fa_sink_log2(p, qb.h);
#pragma unroll
    for (int sl = 0; sl < L::kSlots; ++sl) {
        const int r = warp * FA_TC_WARP_ROWS + L::slot_row(lane, sl);
        row_index[sl] = qb.i0 + r;
        range[sl] = r < qb.rows ? fa_row_keys(p, qb.b, row_index[sl]) : fa_key_range{0, 0};
        m[sl] = sink;
        l[sl] = sink != -INFINITY && L::row_leader(lane) ? 1.0f : 0.0f; /* row_sum adds the lanes of a row */
    }
    typename L::template acc<W> o;
#pragma unroll
    for (int it = 0; it < L::items(W); ++it) o.v[it] = 0.0f;

    const fa_key_range common = fa_tile_common_keys(p, qb.b, qb.i0, qb.rows);
    const int64_t first = qb.keys.lo / BC;
    int64_t tile = qb.keys.hi > qb.keys.lo ? previous_live_tile<BC>(p, qb, (qb.keys.hi - 1) / BC, first) : first - 1;
    if (tile >= first) {
        load_tile<W>(p, p.q, qb.b, qb.i0, qb.h, qb.rows, BR, sq);
        load_tile<W>(p, p.k, qb.b, tile * BC, qb.hk, fa_loaded_keys(p, qb.b, tile * BC, tile_cols<BC>(p, tile)), BC, sk);
        fa_copy_commit();
    }
    while (tile >= first) {
        const int64_t j0 = tile * BC;
        fa_copy_wait_all();
        __syncthreads(); /* Q and K_j visible; every warp is done with V of the previous tile */
        load_tile<W>(p, p.v, qb.b, j0, qb.hk, fa_loaded_keys(p, qb.b, j0, tile_cols<BC>(p, tile)), BC, sv);
        fa_copy_commit();

        typename L::template acc<BC> s;
        L::template qk<W, BC>(s, sq, warp * FA_TC_WARP_ROWS, sk);
        const bool interior = fa_tile_all_visible(p, common, qb.i0, qb.rows, j0, BC, tile_cols<BC>(p, tile));
        softmax_tile<L, BC, W>(p, qb, j0, interior, range, row_index, s, o, m, l);

        fa_copy_wait_all();
        __syncthreads(); /* V_j visible; every warp is done with K_j */
        const int64_t next = previous_live_tile<BC>(p, qb, tile - 1, first);
        if (next >= first) {
            load_tile<W>(p, p.k, qb.b, next * BC, qb.hk, fa_loaded_keys(p, qb.b, next * BC, tile_cols<BC>(p, next)), BC, sk);
            fa_copy_commit();
        }
        L::template pv<BC, W>(o, s, sv);
        tile = next;
    }

    float inv[L::kSlots], total[L::kSlots];
#pragma unroll
    for (int sl = 0; sl < L::kSlots; ++sl) {
        total[sl] = L::row_sum(l[sl]);
        inv[sl] = total[sl] > 0.0f ? 1.0f / total[sl] : 0.0f;
    }
    const int64_t d = p.shape.head_dim;
#pragma unroll
    for (int it = 0; it < L::items(W); ++it) {
        const int sl = L::item_slot(it), col = L::item_col(lane, it);
        if (row_index[sl] - qb.i0 < qb.rows && col < d)
            fa_store_elem(p.out.data, fa_row_offset(p.out, qb.b, row_index[sl], qb.h) + col, p.shape.dtype, o.v[it] * inv[sl]);
    }
    if (p.outputs.lse && L::row_leader(lane)) {
#pragma unroll
        for (int sl = 0; sl < L::kSlots; ++sl)
            if (row_index[sl] - qb.i0 < qb.rows)
                p.outputs.lse[fa_stat_index(p, qb.b, qb.h, row_index[sl])] =
                    total[sl] > 0.0f ? (m[sl] + log2f(total[sl])) * FA_LN2 : -INFINITY;
    }
}

} // namespace fa_tc
#endif

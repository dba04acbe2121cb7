/* The wide-tile forward (family "tc-wide", NVIDIA sm_80+, mma.sync.m16n8k16): the plain problems
 * of fa_tc_wide_takes (tc_plan.h) in FlashAttention-2's shape; everything else runs the tc forward
 * (kernels/attention_tc.cuh), whose semantics this kernel keeps.
 *
 * - A block of FA_TC_WIDE_WARPS warps owns FA_TC_WIDE_BLOCK_ROWS query rows, a warp 32 of them as
 *   two m16 row groups: every K and V fragment read from shared memory feeds two products.
 * - Key tiles run last visible first (as in the tc forward): the tiles some row of the block cannot
 *   fully see (the causal diagonal, window edges, the ragged end, key padding) are masked by range
 *   compares, branch-free; the tiles every row sees take a loop with no mask at all. The kind of a
 *   tile is known before it is reached, so each loop is compiled for its kind.
 * - Pipeline: V_j is copied while S = Q K_j^T is computed, K_{j-1} while O += P V_j is.
 * - Softmax in base 2 on unscaled scores: the running max m is a score, a probability is one FFMA
 *   and one ex2 (exp2(s tau log2 e - m tau log2 e)); the row sum stays per lane until the end.
 * - Parameters are read in place (__grid_constant__); in-block indices are 32-bit; a lane's
 *   ldmatrix addresses are a base plus immediates (fa_tc_ldsm_step_col).
 * - O is normalised, rounded to 16 bits into the Q tile's shared memory (each warp into its own
 *   rows) and written with 16-byte stores along rows. */
#ifndef FA_NVIDIA_ATTENTION_TC_WIDE_CUH
#define FA_NVIDIA_ATTENTION_TC_WIDE_CUH
#if !defined(__HIPCC__)
#include <math.h>

#include "../kernels/async_copy.cuh"
#include "../kernels/score_modifiers.cuh" /* FA_LN2 */
#include "../kernels/tc_layout.h"
#include "../kernels/tensor_access.cuh"
#include "../kernels/warp.cuh"
#include "../tc_plan.h"
#include "tile_mma_sync.cuh"

namespace fa_tc_wide {

constexpr int kThreads = FA_TC_WIDE_WARPS * 32;
constexpr int kGroups = FA_TC_WIDE_WARP_ROWS / 16; /* m16 row groups per warp */
constexpr int kRows = kGroups * 2;                 /* rows a lane holds items of: lane / 4 (+ 8) per group */

/* One (sequence, head) of the grid, resolved once: element pointers of row 0 of Q, K, V, O and
 * lse, the row strides and the lengths (a packed batch's sequence as a problem of its own). */
struct head_view {
    const uint16_t *q, *k, *v;
    uint16_t *out;
    float *lse;
    int64_t q_stride, k_stride, v_stride, out_stride;
    int64_t seqlen_q, valid_k, diag_offset;
};

__device__ __forceinline__ head_view view_of(const fa_gpu_params &p, int64_t b, int64_t h)
{
    const int64_t hk = h / (p.shape.heads_q / p.shape.heads_kv);
    int64_t q_row0 = 0, k_row0 = 0, seqlen_k = p.shape.seqlen_k;
    head_view v;
    v.seqlen_q = p.shape.seqlen_q;
    v.diag_offset = p.mask.diag_offset;
    int64_t qb = b, kb = b; /* batch index of the strides: 0 for a packed batch's rows */
    if (p.varlen.cu_seqlens_q) {
        q_row0 = p.varlen.cu_seqlens_q[b];
        k_row0 = p.varlen.cu_seqlens_k[b];
        v.seqlen_q = p.varlen.cu_seqlens_q[b + 1] - q_row0;
        seqlen_k = p.varlen.cu_seqlens_k[b + 1] - k_row0;
        v.diag_offset = seqlen_k - v.seqlen_q; /* bottom-right within the sequence */
        qb = kb = 0;
    }
    v.valid_k = p.mask.seqlens_k ? p.mask.seqlens_k[b] : seqlen_k;
    v.q = static_cast<const uint16_t *>(p.q.data) + fa_row_offset(p.q, qb, q_row0, h);
    v.k = static_cast<const uint16_t *>(p.k.data) + fa_row_offset(p.k, kb, k_row0, hk);
    v.v = static_cast<const uint16_t *>(p.v.data) + fa_row_offset(p.v, kb, k_row0, hk);
    v.out = static_cast<uint16_t *>(p.out.data) + fa_row_offset(p.out, qb, q_row0, h);
    v.lse = p.outputs.lse ? p.outputs.lse + fa_stat_index(p, b, h, q_row0) : NULL;
    v.q_stride = p.q.stride_seq;
    v.k_stride = p.k.stride_seq;
    v.v_stride = p.v.stride_seq;
    v.out_stride = p.out.stride_seq;
    return v;
}

/* tile[ROWS x W] (swizzled) = rows 0..ROWS of src (row stride `stride`), zeros past valid_rows and
 * past the head dim d, by every thread of the block in 16-byte cp.async chunks. A thread copies
 * one chunk column of every (THREADS / (W / 8))-th row: a multiple of 8 rows, so its swizzled
 * column is the same in every row it copies and each copy is base + immediate. */
template <int W, int ROWS, int THREADS = kThreads>
__device__ __forceinline__ void load_rows(uint16_t *tile, const uint16_t *src, int64_t stride, int valid_rows, int64_t d)
{
    constexpr int kChunks = W / FA_TC_CHUNK, kStep = THREADS / kChunks;
    static_assert(kStep % 8 == 0 && ROWS % kStep == 0, "rows per pass keep the swizzle column");
    const int x = (threadIdx.x % kChunks) * FA_TC_CHUNK, r0 = threadIdx.x / kChunks;
    uint16_t *dst = tile + fa_tc_swizzle(r0, x, W);
    const uint16_t *row = src + r0 * stride + x;
    const int live_rows = x < d ? valid_rows : 0;
#pragma unroll
    for (int i = 0; i < ROWS / kStep; ++i) {
        const bool valid = r0 + i * kStep < live_rows;
        fa_copy16(dst + i * kStep * W, valid ? row : src, valid);
        row += kStep * stride;
    }
}

/* The warp's scores s[g] = Q[rows of group g] K^T, W columns of Q and K, BC keys. */
template <fa_dtype DT, int W, int BC>
__device__ __forceinline__ void scores(float (&s)[kGroups][BC / 2], const uint16_t *q_lane, const uint16_t *k_lane,
                                       const int (&col_a)[4], const int (&col_b)[4])
{
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int i = 0; i < BC / 2; ++i) s[g][i] = 0.0f;
#pragma unroll
    for (int m = 0; m < W / 16; ++m) {
        uint32_t a[kGroups][4];
#pragma unroll
        for (int g = 0; g < kGroups; ++g) fa_ptx_ldmatrix_x4(a[g], q_lane + 16 * g * W + 64 * (m / 4) + col_a[m % 4]);
#pragma unroll
        for (int n0 = 0; n0 < BC; n0 += 16) {
            uint32_t b[4];
            fa_ptx_ldmatrix_x4(b, k_lane + n0 * W + 64 * (m / 4) + col_b[m % 4]);
#pragma unroll
            for (int g = 0; g < kGroups; ++g) {
                fa_tc::mma_16x8x16<DT>(&s[g][n0 / 2], a[g], b[0], b[1]);
                fa_tc::mma_16x8x16<DT>(&s[g][n0 / 2 + 4], a[g], b[2], b[3]);
            }
        }
    }
}

/* o[g] += P[g] V: P from the score registers (fa_tc_p_item), V fragments read once for both groups. */
template <fa_dtype DT, int W, int BC>
__device__ __forceinline__ void add_values(float (&o)[kGroups][W / 2], const float (&s)[kGroups][BC / 2],
                                           const uint16_t *v_lane, const int (&col_a)[4])
{
#pragma unroll
    for (int kstep = 0; kstep < BC / 16; ++kstep) {
        uint32_t a[kGroups][4];
#pragma unroll
        for (int g = 0; g < kGroups; ++g)
#pragma unroll
            for (int reg = 0; reg < 4; ++reg)
                a[g][reg] = fa_tc::pack2<DT>(s[g][fa_tc_p_item(kstep, reg, 0)], s[g][fa_tc_p_item(kstep, reg, 1)]);
#pragma unroll
        for (int n = 0; n < W / 16; ++n) {
            uint32_t b[4];
            fa_ptx_ldmatrix_x4_trans(b, v_lane + 16 * kstep * W + 64 * (n / 4) + col_a[n % 4]);
#pragma unroll
            for (int g = 0; g < kGroups; ++g) {
                fa_tc::mma_16x8x16<DT>(&o[g][8 * n], a[g], b[0], b[1]);
                fa_tc::mma_16x8x16<DT>(&o[g][8 * n + 4], a[g], b[2], b[3]);
            }
        }
    }
}

/* A lane's row r (0..kRows) of item it of group g's accumulator, and the item's column less the
 * lane's own offset 2 (lane % 4) (a compile-time constant once the loops are unrolled). */
__device__ __forceinline__ int row_of(int g, int it) { return 2 * g + fa_tc_mma_item_slot(it); }
__device__ __forceinline__ int col_less_lane(int it) { return 8 * (it / 4) + it % 2; }

/* Which bounds of the rows' visible keys cut a key tile: none (every row sees every key), the
 * upper ones (the causal diagonal, a right window, the ragged end, key padding), the lower ones (a
 * left window), or both (a block whose rows share no whole tile). One compare per bound and
 * element, so each kind is its own loop. */
enum mask_kind { kMaskNone = 0, kMaskHi = 1, kMaskLo = 2, kMaskBoth = 3 };

/* Online softmax of one score tile (base 2, unscaled max): masks keys outside [lo[r], hi[r])
 * (the bounds MASK names; columns relative to this lane's first column), updates m and the
 * per-lane sums l, rescales o, and leaves the probabilities in s. */
template <int MASK, int W, int BC>
__device__ __forceinline__ void softmax_tile(float (&s)[kGroups][BC / 2], float (&o)[kGroups][W / 2], float (&m)[kRows],
                                             float (&l)[kRows], const int (&lo)[kRows], const int (&hi)[kRows], float scale_log2)
{
    float tile_max[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) tile_max[r] = -INFINITY;
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int it = 0; it < BC / 2; ++it) {
            const int r = row_of(g, it);
            const int c = col_less_lane(it);
            if ((MASK & kMaskLo) && c < lo[r]) s[g][it] = -INFINITY;
            if ((MASK & kMaskHi) && c >= hi[r]) s[g][it] = -INFINITY;
            tile_max[r] = fmaxf(tile_max[r], s[g][it]);
        }
    float m_scaled[kRows], alpha[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        float x = fmaxf(tile_max[r], fa_shfl_xor(tile_max[r], 1));
        x = fmaxf(x, fa_shfl_xor(x, 2));
        const float m_new = fmaxf(m[r], x);
        m_scaled[r] = m_new == -INFINITY ? 0.0f : m_new * scale_log2; /* nothing visible yet: stays 0 */
        alpha[r] = fa_exp2(fmaf(m[r], scale_log2, -m_scaled[r]));
        m[r] = m_new;
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int it = 0; it < BC / 2; ++it) {
            const int r = row_of(g, it);
            s[g][it] = fa_exp2(fmaf(s[g][it], scale_log2, -m_scaled[r]));
            l[r] += s[g][it];
        }
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int it = 0; it < W / 2; ++it) o[g][it] *= alpha[row_of(g, it)];
}

/* Everything a key-tile step reads. */
template <int W>
struct block_state {
    head_view view;
    int64_t d;
    uint16_t *sq, *sk, *sv;
    const uint16_t *q_lane, *k_lane, *v_lane; /* this lane's ldmatrix rows (step 0) */
    int col_a[4], col_b[4];                   /* fa_tc_ldsm_step_col of the lane */
    int row_lo[kRows], row_hi[kRows];         /* the lane's rows' visible keys (< 2^31: fa_tc_wide_takes) */
    int lane_col;                             /* 2 (lane % 4) */
    float scale_log2;
};

/* One key tile: S = Q K^T while V is copied, softmax, then O += P V while K of tile - 1 is copied.
 * On entry K of `tile` is in flight or landed; every thread calls it (it holds barriers). */
template <fa_dtype DT, int W, int BC, int MASK>
__device__ __forceinline__ void key_tile(const block_state<W> &st, int64_t tile, int64_t first, float (&o)[kGroups][W / 2],
                                         float (&m)[kRows], float (&l)[kRows])
{
    const int64_t j0 = tile * BC;
    const int loaded = (int)(st.view.valid_k - j0 < BC ? st.view.valid_k - j0 : BC);
    fa_copy_wait_all();
    __syncthreads(); /* Q and K_j visible; every warp is done with V of the previous tile */
    load_rows<W, BC>(st.sv, st.view.v + j0 * st.view.v_stride, st.view.v_stride, loaded, st.d);
    fa_copy_commit();

    float s[kGroups][BC / 2];
    scores<DT, W, BC>(s, st.q_lane, st.k_lane, st.col_a, st.col_b);
    int lo[kRows], hi[kRows];
    if (MASK != kMaskNone) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const int a = st.row_lo[r] - (int)j0, b = st.row_hi[r] - (int)j0;
            lo[r] = (int)(a < 0 ? 0 : a > BC ? BC : a) - st.lane_col;
            hi[r] = (int)(b < 0 ? 0 : b > BC ? BC : b) - st.lane_col;
        }
    }
    softmax_tile<MASK, W, BC>(s, o, m, l, lo, hi, st.scale_log2);

    fa_copy_wait_all();
    __syncthreads(); /* V_j visible; every warp is done with K_j */
    if (tile > first) {
        const int64_t next = j0 - BC;
        load_rows<W, BC>(st.sk, st.view.k + next * st.view.k_stride, st.view.k_stride, BC, st.d);
        fa_copy_commit();
    }
    add_values<DT, W, BC>(o, s, st.v_lane, st.col_a);
}

template <fa_dtype DT, int W>
__global__ void __launch_bounds__(kThreads, 1) forward(const __grid_constant__ fa_gpu_params p)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    constexpr int BR = FA_TC_WIDE_BLOCK_ROWS, BC = FA_TC_WIDE_BLOCK_COLS(W);
    if (fa_gpu_failed(p)) return; /* a device-side check failed: write nothing */
    FA_DYNAMIC_SMEM(uint16_t, fa_tc_wide_smem);
    block_state<W> st;
    st.sq = fa_tc_wide_smem;
    st.sk = st.sq + BR * W;
    st.sv = st.sk + BC * W;
    st.view = view_of(p, blockIdx.z, blockIdx.y);
    st.d = p.shape.head_dim;
    st.scale_log2 = p.scale_log2;
    const int64_t i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * BR; /* longest rows first */
    const int rows = (int)(st.view.seqlen_q - i0 < BR ? st.view.seqlen_q - i0 : BR);
    if (rows <= 0) return; /* past its sequence (packed batch) */

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row_a = lane % 8 + 8 * ((lane / 8) % 2), row_b = lane % 8 + 8 * (lane / 16);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        st.col_a[t] = fa_tc_ldsm_step_col(t, lane / 16, lane % 8);
        st.col_b[t] = fa_tc_ldsm_step_col(t, (lane / 8) % 2, lane % 8);
    }
    st.q_lane = st.sq + (warp * FA_TC_WIDE_WARP_ROWS + row_a) * W;
    st.k_lane = st.sk + row_b * W;
    st.v_lane = st.sv + row_a * W;
    st.lane_col = 2 * (lane % 4);

    float m[kRows], l[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const int row = warp * FA_TC_WIDE_WARP_ROWS + 16 * (r / 2) + fa_tc_mma_slot_row(lane, r % 2);
        const fa_key_range keys = row < rows ? fa_visible_keys_at(fa_diagonal_key(i0 + row, st.view.diag_offset), st.view.valid_k,
                                                                  p.mask.causal, p.mask.window_left, p.mask.window_right)
                                             : fa_key_range{0, 0};
        st.row_lo[r] = (int)keys.lo;
        st.row_hi[r] = (int)keys.hi;
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    float o[kGroups][W / 2];
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int it = 0; it < W / 2; ++it) o[g][it] = 0.0f;

    /* Keys some row of the block sees (first row's lo, last row's hi) and keys every row sees
     * (last row's lo, first row's hi): lo and hi never decrease with the row. */
    const fa_key_range first_row = fa_visible_keys_at(fa_diagonal_key(i0, st.view.diag_offset), st.view.valid_k, p.mask.causal,
                                                      p.mask.window_left, p.mask.window_right);
    const fa_key_range last_row = fa_visible_keys_at(fa_diagonal_key(i0 + rows - 1, st.view.diag_offset), st.view.valid_k,
                                                     p.mask.causal, p.mask.window_left, p.mask.window_right);
    if (last_row.hi > first_row.lo) {
        const int64_t first = first_row.lo / BC, last = (last_row.hi - 1) / BC;
        /* Tiles from inner_lo up start at or past every row's lo; tiles up to inner_hi end at or
         * before every row's hi. Between the two they need no mask. */
        const int64_t inner_lo = (last_row.lo + BC - 1) / BC, inner_hi = first_row.hi / BC - 1;

        load_rows<W, BR>(st.sq, st.view.q + i0 * st.view.q_stride, st.view.q_stride, rows, st.d);
        const int64_t j_last = last * BC;
        load_rows<W, BC>(st.sk, st.view.k + j_last * st.view.k_stride, st.view.k_stride,
                         (int)(st.view.valid_k - j_last < BC ? st.view.valid_k - j_last : BC), st.d);
        fa_copy_commit();
        const int64_t upper_only = inner_lo > inner_hi + 1 ? inner_lo : inner_hi + 1;
        int64_t tile = last;
        for (; tile >= upper_only; --tile) key_tile<DT, W, BC, kMaskHi>(st, tile, first, o, m, l);
        for (; tile > inner_hi; --tile) key_tile<DT, W, BC, kMaskBoth>(st, tile, first, o, m, l);
        for (; tile >= inner_lo; --tile) key_tile<DT, W, BC, kMaskNone>(st, tile, first, o, m, l);
        for (; tile >= first; --tile) key_tile<DT, W, BC, kMaskLo>(st, tile, first, o, m, l);
    }

    /* O / l rounded into this warp's own rows of the Q tile (no other warp reads them), then
     * 16-byte row-contiguous stores; lse by one lane per row. */
    float inv[kRows], total[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        total[r] = l[r] + fa_shfl_xor(l[r], 1);
        total[r] += fa_shfl_xor(total[r], 2);
        inv[r] = total[r] > 0.0f ? 1.0f / total[r] : 0.0f;
    }
    uint16_t *so = st.sq + warp * FA_TC_WIDE_WARP_ROWS * W;
    __syncwarp();
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int it = 0; it < W / 2; it += 2) {
            const int r = row_of(g, it), row = 16 * g + fa_tc_mma_slot_row(lane, r % 2);
            const int col = col_less_lane(it) + st.lane_col;
            *reinterpret_cast<uint32_t *>(so + fa_tc_swizzle(row, col, W)) =
                fa_tc::pack2<DT>(o[g][it] * inv[r], o[g][it + 1] * inv[r]);
        }
    __syncwarp();
    constexpr int kChunks = W / FA_TC_CHUNK, kRowsPerPass = 32 / kChunks;
    const int x = (lane % kChunks) * FA_TC_CHUNK;
    if (x < st.d) {
        const int warp_row0 = warp * FA_TC_WIDE_WARP_ROWS;
        uint16_t *out = st.view.out + (i0 + warp_row0) * st.view.out_stride + x;
#pragma unroll
        for (int pass = 0; pass < FA_TC_WIDE_WARP_ROWS / kRowsPerPass; ++pass) {
            const int row = pass * kRowsPerPass + lane / kChunks;
            if (warp_row0 + row < rows)
                *reinterpret_cast<uint4 *>(out + row * st.view.out_stride) =
                    *reinterpret_cast<const uint4 *>(so + fa_tc_swizzle(row, x, W));
        }
    }
    if (st.view.lse && lane % 4 == 0) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const int row = warp * FA_TC_WIDE_WARP_ROWS + 16 * (r / 2) + fa_tc_mma_slot_row(lane, r % 2);
            if (row < rows) st.view.lse[i0 + row] = total[r] > 0.0f ? (m[r] * st.scale_log2 + log2f(total[r])) * FA_LN2 : -INFINITY;
        }
    }
}

} // namespace fa_tc_wide
#endif
#endif

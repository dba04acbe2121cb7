/* The wide-tile backward (family "tc-wide", NVIDIA sm_80+, mma.sync.m16n8k16): the plain problems
 * of fa_tc_wide_takes (tc_plan.h) in FlashAttention-2's shape, one kernel doing all five products
 * after the delta pre-pass (D = rowsum(dO o O), fa_generic::row_delta); everything else runs the tc
 * backward (kernels/attention_tc_backward.cuh), whose semantics this kernel keeps.
 *
 * - A block of FA_TC_WIDE_BWD_WARPS warps owns FA_TC_WIDE_BWD_KEYS keys of a kv head, a warp 16 of
 *   them, and keeps their dK and dV in f32 registers across every query tile of every query head
 *   of the group (the GQA sum stays in the block), then scales and writes them.
 * - Query tiles of FA_TC_WIDE_BWD_QUERY_TILE rows stream through two shared-memory buffers (Q, dO,
 *   lse log2 e and D): the next tile is copied while this one is computed.
 * - Transposed recompute: S^T = K Q^T and dP^T = V dO^T have the warp's keys as rows, so P^T and
 *   dS^T are already the A operands of dV += P^T dO and dK += dS^T Q (in registers).
 * - dS^T goes, rounded, through swizzled shared memory; dQ = dS K reads it back transposed
 *   (ldmatrix .trans, fa_tc_ldsm_a_trans), a warp owning 16 query rows and half the head dim.
 * - dQ is deterministic without atomics: the grid has `splits` blocks per (kv head, sequence);
 *   block x takes key blocks x, x + splits, ... in order and adds (plain f32 load-add-store, each
 *   element owned by one thread) into its own f32 slice x of the workspace (p.dq_accum, rows in
 *   the lse layout, width W); fa_dq_accum::convert then sums the slices in order, scales and
 *   rounds into dQ.
 * - Masks by key-minus-query ranges (causal, windows) and key padding, compiled only into the
 *   query tiles that need them: the tiles every (key, query) pair of which is visible take a loop
 *   with no mask. Query rows past the sequence read lse = +inf (P = 0) and D = 0. */
#ifndef FA_NVIDIA_ATTENTION_TC_WIDE_BACKWARD_CUH
#define FA_NVIDIA_ATTENTION_TC_WIDE_BACKWARD_CUH
#if !defined(__HIPCC__)
#include "attention_tc_wide.cuh"

namespace fa_tc_wide {

constexpr int kBwdThreads = FA_TC_WIDE_BWD_WARPS * 32;

/* One sequence of the backward grid, query side: row-0 pointers of Q, dO (head h: + h
 * stride_head), lse and D (+ fa_stat_index offsets), the lengths. */
struct bwd_view {
    const uint16_t *q, *dout;
    const float *lse, *delta;
    float *dq_accum; /* this block's slice, row 0 of (sequence, head 0) */
    int64_t q_stride, do_stride;
    int64_t q_head, do_head, stat_head; /* per query head */
    int64_t seqlen_q, seqlen_k, valid_k, diag_offset;
};

__device__ __forceinline__ bwd_view bwd_view_of(const fa_gpu_params &p, int64_t b)
{
    int64_t q_row0 = 0, k_row0 = 0;
    bwd_view v;
    v.seqlen_q = p.shape.seqlen_q;
    v.seqlen_k = p.shape.seqlen_k;
    v.diag_offset = p.mask.diag_offset;
    int64_t qb = b;
    if (p.varlen.cu_seqlens_q) {
        q_row0 = p.varlen.cu_seqlens_q[b];
        k_row0 = p.varlen.cu_seqlens_k[b];
        v.seqlen_q = p.varlen.cu_seqlens_q[b + 1] - q_row0;
        v.seqlen_k = p.varlen.cu_seqlens_k[b + 1] - k_row0;
        v.diag_offset = v.seqlen_k - v.seqlen_q;
        qb = 0;
    }
    v.valid_k = p.mask.seqlens_k ? p.mask.seqlens_k[b] : v.seqlen_k;
    v.q = static_cast<const uint16_t *>(p.q.data) + fa_row_offset(p.q, qb, q_row0, 0);
    v.dout = static_cast<const uint16_t *>(p.dout.data) + fa_row_offset(p.dout, qb, q_row0, 0);
    const int64_t stat0 = fa_stat_index(p, b, 0, q_row0);
    v.lse = p.outputs.lse + stat0;
    v.delta = p.delta + stat0;
    v.dq_accum = NULL; /* set by the kernel: its slice */
    v.q_stride = p.q.stride_seq;
    v.do_stride = p.dout.stride_seq;
    v.q_head = p.q.stride_head;
    v.do_head = p.dout.stride_head;
    v.stat_head = p.outputs.lse_stride_head;
    return v;
}

/* Row j0 of the key block in K, V, dK, dV (kv head hk of sequence b), resolved where used so that
 * the query-tile loop keeps none of it in registers. */
struct kv_rows {
    const uint16_t *k, *v;
    uint16_t *dk, *dv;
};

__device__ __forceinline__ kv_rows kv_rows_of(const fa_gpu_params &p, int64_t b, int64_t hk, int64_t j0)
{
    int64_t kb = b, k_row0 = 0;
    if (p.varlen.cu_seqlens_k) {
        k_row0 = p.varlen.cu_seqlens_k[b];
        kb = 0;
    }
    kv_rows r;
    r.k = static_cast<const uint16_t *>(p.k.data) + fa_row_offset(p.k, kb, k_row0 + j0, hk);
    r.v = static_cast<const uint16_t *>(p.v.data) + fa_row_offset(p.v, kb, k_row0 + j0, hk);
    r.dk = static_cast<uint16_t *>(p.dk.data) + fa_row_offset(p.dk, kb, k_row0 + j0, hk);
    r.dv = static_cast<uint16_t *>(p.dv.data) + fa_row_offset(p.dv, kb, k_row0 + j0, hk);
    return r;
}

/* acc[16 x N] += A B over K columns: A from this lane's ldmatrix rows a_lane (a 16-row tile of
 * width W, not transposed), B^T rows from b_lane (N rows of width W, fa_tc_ldsm_b_nk). */
template <fa_dtype DT, int W, int N>
__device__ __forceinline__ void rows_times_cols(float (&acc)[N / 2], const uint16_t *a_lane, const uint16_t *b_lane,
                                                const int (&col_a)[4], const int (&col_b)[4])
{
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int m = 0; m < W / 16; ++m) {
        uint32_t a[4];
        fa_ptx_ldmatrix_x4(a, a_lane + 64 * (m / 4) + col_a[m % 4]);
#pragma unroll
        for (int n0 = 0; n0 < N; n0 += 16) {
            uint32_t b[4];
            fa_ptx_ldmatrix_x4(b, b_lane + n0 * W + 64 * (m / 4) + col_b[m % 4]);
            fa_tc::mma_16x8x16<DT>(&acc[n0 / 2], a, b[0], b[1]);
            fa_tc::mma_16x8x16<DT>(&acc[n0 / 2 + 4], a, b[2], b[3]);
        }
    }
}

/* acc[16 x W] += X B: X (16 x K) from the registers x (the C layout of a 16 x K product, rounded
 * per k step), B (K x W) from rows b_lane of a [k][n] tile of width W (ldmatrix .trans). */
template <fa_dtype DT, int W, int K>
__device__ __forceinline__ void regs_times_rows(float (&acc)[W / 2], const float (&x)[K / 2], const uint16_t *b_lane,
                                                const int (&col_a)[4])
{
#pragma unroll
    for (int kstep = 0; kstep < K / 16; ++kstep) {
        uint32_t a[4];
#pragma unroll
        for (int reg = 0; reg < 4; ++reg)
            a[reg] = fa_tc::pack2<DT>(x[fa_tc_p_item(kstep, reg, 0)], x[fa_tc_p_item(kstep, reg, 1)]);
#pragma unroll
        for (int n = 0; n < W / 16; ++n) {
            uint32_t b[4];
            fa_ptx_ldmatrix_x4_trans(b, b_lane + 16 * kstep * W + 64 * (n / 4) + col_a[n % 4]);
            fa_tc::mma_16x8x16<DT>(&acc[8 * n], a, b[0], b[1]);
            fa_tc::mma_16x8x16<DT>(&acc[8 * n + 4], a, b[2], b[3]);
        }
    }
}

/* Everything a query-tile step reads. */
template <int W>
struct bwd_state {
    bwd_view view;
    int64_t d;
    uint16_t *sk, *sv, *sds;
    uint16_t *sq, *sdo; /* buffer 0 of Q and dO; buffer 1 follows each (BQ W elements on) */
    float *slse;        /* lse log2 e of buffers 0 and 1, then D of buffers 0 and 1 (BQ each) */
    int col_a[4], col_b[4]; /* fa_tc_ldsm_step_col of the lane */
    int dq_col[W / 32];     /* swizzled columns of the lane's dQ B reads (K, .trans), per 16 columns */
    int k_row_a, q_row_b;   /* this lane's ldmatrix row offsets (elements): K/V (A), Q/dO (B^T) */
    int t_row_a;            /* Q/dO as the B operand of dK/dV (.trans) */
    int ds_read;            /* this lane's ldmatrix .trans row of dS^T (elements, step 0) */
    int lane_col;           /* 2 (lane % 4) */
    int lane_diff;          /* key minus query index of the lane's item 0, less j0 - i0 */
    int dq_row0, dq_c0;     /* the warp's dQ rows and columns in the tile */
    float scale_log2;
    int32_t t_lo, t_hi;     /* visible key minus query range (inclusive), clamped */
};

/* Loads query tile i0 of head h into buffer `buf`: Q and dO by cp.async (committed by the caller),
 * lse log2 e and D by plain loads (published by the barrier of the next step). */
template <int W, int BQ>
__device__ __forceinline__ void load_query_tile(const bwd_state<W> &st, int buf, int64_t h, int64_t i0)
{
    const int rows = (int)(st.view.seqlen_q - i0 < BQ ? st.view.seqlen_q - i0 : BQ);
    const uint16_t *q = st.view.q + h * st.view.q_head + i0 * st.view.q_stride;
    const uint16_t *dout = st.view.dout + h * st.view.do_head + i0 * st.view.do_stride;
    load_rows<W, BQ, kBwdThreads>(st.sq + buf * BQ * W, q, st.view.q_stride, rows, st.d);
    load_rows<W, BQ, kBwdThreads>(st.sdo + buf * BQ * W, dout, st.view.do_stride, rows, st.d);
    const int t = threadIdx.x;
    if (t < BQ) {
        const int64_t stat = h * st.view.stat_head + i0 + t;
        st.slse[buf * BQ + t] = t < rows ? st.view.lse[stat] * (float)FA_LOG2E : INFINITY;
        st.slse[(2 + buf) * BQ + t] = t < rows ? st.view.delta[stat] : 0.0f;
    }
}

/* One query tile (head h, rows i0..) of the key block at j0, from buffer buf; the next tile (if
 * has_next) is copied into buf ^ 1 meanwhile. Every thread calls it (it holds barriers). */
template <fa_dtype DT, int W, bool MASKED>
__device__ __forceinline__ void query_tile(const bwd_state<W> &st, int buf, int64_t h, int64_t i0, int64_t j0,
                                           const bool (&key_ok)[2], bool has_next, int64_t next_h, int64_t next_i0,
                                           float (&dk)[W / 2], float (&dv)[W / 2])
{
    constexpr int BQ = FA_TC_WIDE_BWD_QUERY_TILE;
    fa_copy_wait_all();
    __syncthreads(); /* this tile visible; every warp is done with the other buffer and with dS^T */
    if (has_next) {
        load_query_tile<W, BQ>(st, buf ^ 1, next_h, next_i0);
        fa_copy_commit();
    }
    const uint16_t *sq = st.sq + buf * BQ * W, *sdo = st.sdo + buf * BQ * W;
    const float *slse = st.slse + buf * BQ, *sdelta = st.slse + (2 + buf) * BQ;

    /* P^T = exp2(S^T tau log2 e - lse log2 e), masked */
    float s[BQ / 2];
    rows_times_cols<DT, W, BQ>(s, st.sk + st.k_row_a, sq + st.q_row_b, st.col_a, st.col_b);
    int lim_lo = 0, lim_hi = 0;
    if (MASKED) {
        const int64_t base = (j0 - i0) + st.lane_diff;
        const int64_t lo = st.t_lo - base, hi = st.t_hi - base;
        lim_lo = (int)(lo < -1024 ? -1024 : lo > 1024 ? 1024 : lo);
        lim_hi = (int)(hi < -1024 ? -1024 : hi > 1024 ? 1024 : hi);
    }
#pragma unroll
    for (int it = 0; it < BQ / 2; it += 2) {
        const float2 l2 = *reinterpret_cast<const float2 *>(slse + col_less_lane(it) + st.lane_col);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float x = fa_exp2(fmaf(s[it + e], st.scale_log2, -(e ? l2.y : l2.x)));
            if (MASKED) {
                const int slot = fa_tc_mma_item_slot(it + e);
                const int diff = 8 * slot - (col_less_lane(it) + e); /* key - query, less the lane's */
                s[it + e] = key_ok[slot] && diff >= lim_lo && diff <= lim_hi ? x : 0.0f;
            } else {
                s[it + e] = x;
            }
        }
    }
    regs_times_rows<DT, W, BQ>(dv, s, sdo + st.t_row_a, st.col_a);

    /* dS^T = P^T o (dP^T - D) */
    float dp[BQ / 2];
    rows_times_cols<DT, W, BQ>(dp, st.sv + st.k_row_a, sdo + st.q_row_b, st.col_a, st.col_b);
#pragma unroll
    for (int it = 0; it < BQ / 2; it += 2) {
        const float2 d2 = *reinterpret_cast<const float2 *>(sdelta + col_less_lane(it) + st.lane_col);
        dp[it] = s[it] * (dp[it] - d2.x);
        dp[it + 1] = s[it + 1] * (dp[it + 1] - d2.y);
    }
    regs_times_rows<DT, W, BQ>(dk, dp, sq + st.t_row_a, st.col_a);

    /* dS^T rounded into shared memory, this warp's 16 key rows */
    const int lane = threadIdx.x % 32, key_row = 16 * (threadIdx.x / 32) + lane / 4;
#pragma unroll
    for (int it = 0; it < BQ / 2; it += 2) {
        const int row = key_row + 8 * fa_tc_mma_item_slot(it);
        *reinterpret_cast<uint32_t *>(st.sds + fa_tc_swizzle(row, col_less_lane(it) + st.lane_col, BQ)) =
            fa_tc::pack2<DT>(dp[it], dp[it + 1]);
    }
    __syncthreads(); /* dS^T visible */

    /* dQ (16 rows x W / 2 columns of this warp) = dS K, added to the block's slice */
    constexpr int kBK = FA_TC_WIDE_BWD_KEYS, kN = W / 2;
    float dq[kN / 2];
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) dq[i] = 0.0f;
    const int k_row_t = lane % 8 + 8 * ((lane / 8) % 2);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
        uint32_t a[4];
        fa_ptx_ldmatrix_x4_trans(a, st.sds + st.ds_read + 16 * ks * BQ);
#pragma unroll
        for (int n = 0; n < kN / 16; ++n) {
            uint32_t b[4];
            fa_ptx_ldmatrix_x4_trans(b, st.sk + (16 * ks + k_row_t) * W + st.dq_col[n]);
            fa_tc::mma_16x8x16<DT>(&dq[8 * n], a, b[0], b[1]);
            fa_tc::mma_16x8x16<DT>(&dq[8 * n + 4], a, b[2], b[3]);
        }
    }
#pragma unroll
    for (int slot = 0; slot < 2; ++slot) {
        const int row = st.dq_row0 + lane / 4 + 8 * slot;
        if (i0 + row < st.view.seqlen_q) {
            float *acc = st.view.dq_accum + (h * st.view.stat_head + i0 + row) * W + st.dq_c0 + st.lane_col;
#pragma unroll
            for (int t = 0; t < kN / 8; ++t) {
                float2 *cell = reinterpret_cast<float2 *>(acc + 8 * t);
                float2 v = *cell;
                v.x += dq[4 * t + 2 * slot];
                v.y += dq[4 * t + 2 * slot + 1];
                *cell = v;
            }
        }
    }
}

/* Whether every (key, query) pair of key block j0 and query tile i0 is visible. */
__device__ __forceinline__ bool tile_all_visible(const bwd_view &v, int64_t t_lo, int64_t t_hi, int64_t i0, int64_t j0, int bk,
                                                 int bq)
{
    const int64_t last = (v.seqlen_q - i0 < bq ? v.seqlen_q - i0 : bq) - 1;
    return j0 + bk <= v.valid_k && j0 + bk - 1 - i0 <= t_hi && j0 - (i0 + last) >= t_lo;
}

template <fa_dtype DT, int W>
__global__ void __launch_bounds__(kBwdThreads, 1) backward(const __grid_constant__ fa_gpu_params p)
{
    FA_GPU_REQUIRE_BLOCK(kBwdThreads);
    constexpr int BK = FA_TC_WIDE_BWD_KEYS, BQ = FA_TC_WIDE_BWD_QUERY_TILE;
    static_assert(BK == 16 * FA_TC_WIDE_BWD_WARPS, "a warp owns 16 keys");
    static_assert(BQ == 64 && FA_TC_WIDE_BWD_WARPS == 8, "dQ: 4 x 2 warps of 16 rows x W / 2 columns");
    if (fa_gpu_failed(p)) return;
    FA_DYNAMIC_SMEM(uint16_t, fa_tc_wide_smem);
    bwd_state<W> st;
    st.sk = fa_tc_wide_smem;
    st.sv = st.sk + BK * W;
    st.sq = st.sv + BK * W;
    st.sdo = st.sq + 2 * BQ * W;
    st.sds = st.sdo + 2 * BQ * W;
    st.slse = reinterpret_cast<float *>(st.sds + BK * BQ);

    const int64_t b = blockIdx.z, hk = blockIdx.y;
    st.view = bwd_view_of(p, b);
    st.view.dq_accum = p.dq_accum + static_cast<int64_t>(blockIdx.x) * p.dq_slice + (st.view.lse - p.outputs.lse) * W;
    st.d = p.shape.head_dim;
    st.scale_log2 = p.scale_log2;
    const int64_t group = p.shape.heads_q / p.shape.heads_kv, h0 = hk * group;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row_a = lane % 8 + 8 * ((lane / 8) % 2), row_b = lane % 8 + 8 * (lane / 16);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        st.col_a[t] = fa_tc_ldsm_step_col(t, lane / 16, lane % 8);
        st.col_b[t] = fa_tc_ldsm_step_col(t, (lane / 8) % 2, lane % 8);
    }
    st.k_row_a = (16 * warp + row_a) * W;
    st.q_row_b = row_b * W;
    st.t_row_a = row_a * W;
    st.lane_col = 2 * (lane % 4);
    st.lane_diff = 16 * warp + lane / 4 - 2 * (lane % 4);
    st.dq_row0 = 16 * (warp % 4);
    st.dq_c0 = (W / 2) * (warp / 4);
    {
        const fa_frag_coord c = fa_tc_ldsm_a_trans(lane, st.dq_row0, 0);
        st.ds_read = fa_tc_swizzle(c.row, c.col, BQ);
#pragma unroll
        for (int n = 0; n < W / 32; ++n) {
            const fa_frag_coord cb = fa_tc_ldsm_b_kn_trans(lane, 0, st.dq_c0 + 16 * n);
            st.dq_col[n] = fa_tc_swizzle(cb.row, cb.col, W) - cb.row * W;
        }
    }
    /* visible pairs: j < valid_k and t_lo <= j - i <= t_hi */
    const int64_t off = st.view.diag_offset, kBig = (int64_t)1 << 40;
    int64_t t_hi = kBig, t_lo = -kBig;
    if (p.mask.causal) t_hi = off;
    if (p.mask.window_right >= 0 && off + p.mask.window_right < t_hi) t_hi = off + p.mask.window_right;
    if (p.mask.window_left >= 0) t_lo = off - p.mask.window_left;
    st.t_lo = (int32_t)(t_lo < -(int64_t)INT32_MAX ? -(int64_t)INT32_MAX : t_lo > INT32_MAX ? INT32_MAX : t_lo);
    st.t_hi = (int32_t)(t_hi < -(int64_t)INT32_MAX ? -(int64_t)INT32_MAX : t_hi > INT32_MAX ? INT32_MAX : t_hi);

    const int64_t key_blocks = (st.view.seqlen_k + BK - 1) / BK;
    for (int64_t kb = blockIdx.x; kb < key_blocks; kb += gridDim.x) {
        const int64_t j0 = kb * BK;
        const int keys = (int)(st.view.seqlen_k - j0 < BK ? st.view.seqlen_k - j0 : BK);
        const int64_t loaded_k = st.view.valid_k - j0;
        /* query rows whose keys meet [j0, j0 + BK): t_lo <= j - i <= t_hi for some j of the block */
        int64_t i_first = j0 - t_hi, i_last = j0 + BK - 1 - t_lo;
        if (i_first < 0) i_first = 0;
        if (i_last > st.view.seqlen_q - 1) i_last = st.view.seqlen_q - 1;
        const bool any = loaded_k > 0 && i_first <= i_last;
        const int64_t t_first = i_first / BQ, t_last = any ? i_last / BQ : t_first - 1;

        float dk[W / 2], dv[W / 2];
#pragma unroll
        for (int i = 0; i < W / 2; ++i) dk[i] = dv[i] = 0.0f;
        bool key_ok[2];
#pragma unroll
        for (int slot = 0; slot < 2; ++slot) key_ok[slot] = j0 + 16 * warp + lane / 4 + 8 * slot < st.view.valid_k;

        if (t_last >= t_first) {
            __syncthreads(); /* the previous key block is no longer read */
            const int lk = (int)(loaded_k < keys ? loaded_k : keys);
            const kv_rows kv = kv_rows_of(p, b, hk, j0);
            load_rows<W, BK, kBwdThreads>(st.sk, kv.k, p.k.stride_seq, lk, st.d);
            load_rows<W, BK, kBwdThreads>(st.sv, kv.v, p.v.stride_seq, lk, st.d);
            load_query_tile<W, BQ>(st, 0, h0, t_first * BQ);
            fa_copy_commit();
            int buf = 0;
            for (int64_t h = h0; h < h0 + group; ++h) {
                int64_t t = t_first;
#define FA_BWD_STEP(MASKED)                                                                                     \
    do {                                                                                                        \
        const bool more = t < t_last || h + 1 < h0 + group;                                                     \
        const int64_t nh = t < t_last ? h : h + 1, ni = t < t_last ? (t + 1) * BQ : t_first * BQ;               \
        query_tile<DT, W, MASKED>(st, buf, h, t * BQ, j0, key_ok, more, nh, ni, dk, dv);                        \
        buf ^= 1;                                                                                               \
    } while (0)
                for (; t <= t_last && !tile_all_visible(st.view, t_lo, t_hi, t * BQ, j0, BK, BQ); ++t) FA_BWD_STEP(true);
                for (; t <= t_last && tile_all_visible(st.view, t_lo, t_hi, t * BQ, j0, BK, BQ); ++t) FA_BWD_STEP(false);
                for (; t <= t_last; ++t) FA_BWD_STEP(true);
#undef FA_BWD_STEP
            }
        }

        /* dK (times the softmax scale) and dV of the warp's keys, two 16-bit columns per store */
        const kv_rows kv = kv_rows_of(p, b, hk, j0);
#pragma unroll
        for (int slot = 0; slot < 2; ++slot) {
            const int row = 16 * warp + lane / 4 + 8 * slot;
            if (row < keys) {
                uint16_t *dkr = kv.dk + row * p.dk.stride_seq + st.lane_col;
                uint16_t *dvr = kv.dv + row * p.dv.stride_seq + st.lane_col;
#pragma unroll
                for (int t = 0; t < W / 8; ++t) {
                    if (8 * t + st.lane_col < st.d) {
                        *reinterpret_cast<uint32_t *>(dkr + 8 * t) =
                            fa_tc::pack2<DT>(dk[4 * t + 2 * slot] * p.shape.scale, dk[4 * t + 2 * slot + 1] * p.shape.scale);
                        *reinterpret_cast<uint32_t *>(dvr + 8 * t) = fa_tc::pack2<DT>(dv[4 * t + 2 * slot], dv[4 * t + 2 * slot + 1]);
                    }
                }
            }
        }
    }
}

} // namespace fa_tc_wide
#endif
#endif

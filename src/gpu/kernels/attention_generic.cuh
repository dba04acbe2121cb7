/* The generic FlashAttention kernels: CUDA-core (plain FMA) forward and backward for f32, f16 and
 * bf16 with f32 accumulation, written once for NVIDIA and AMD (warp size from warp.cuh). Every
 * API semantic lives here: scale, causal, window, key padding, block mask with tile skipping,
 * GQA/MQA, dropout with the shared Philox stream, lse, fully masked rows, and the score
 * modifiers (score_modifiers.cuh: softcap, ALiBi, sinks, bias, with dsinks and dbias).
 *
 * Layout: a thread block owns a square tile of TILE rows (queries in the forward and dQ kernels,
 * keys in the dK/dV kernel); each of its FA_GENERIC_WARPS warps owns TILE / warps rows and keeps
 * their accumulators in registers, lane l holding head-dim columns l, l + W, ... The other side
 * streams through f32 shared-memory tiles; for one owned row, lane l computes the scores of
 * columns l, l + W, ... of the streamed tile, the warp reduces them (max, sum), writes the
 * weights to a per-warp row in shared memory and every lane accumulates its head-dim columns.
 * Softmax runs in base 2: scores are multiplied by tau * log2(e) and exponentiated with exp2. */
#ifndef FA_GPU_ATTENTION_GENERIC_CUH
#define FA_GPU_ATTENTION_GENERIC_CUH
#include <math.h>

#include "../plan.h"
#include "score_modifiers.cuh"
#include "tensor_access.cuh"
#include "warp.cuh"

namespace fa_generic {

constexpr int kThreads = FA_GENERIC_WARPS * FA_WARP_SIZE;

/* dot(a[0..d), b[0..d)) of two f32 shared-memory rows. */
__device__ __forceinline__ float dot_row(const float *a, const float *b, int64_t d)
{
    float acc = 0.0f;
    for (int64_t x = 0; x < d; ++x) acc = fmaf(a[x], b[x], acc);
    return acc;
}

/* One owned row's O += P V over a staged key tile: each lane its head-dim columns of o, rescaled
 * by alpha, from the warp's probabilities sp[0..cols) (written by the whole warp before). */
template <int DPL>
__device__ __forceinline__ void accumulate_pv(float (&o)[DPL], float alpha, const float *sp, const float *sv,
                                              int64_t cols, int64_t d, int64_t ld, int lane)
{
    fa_warp_sync();
    for (int t = 0; t < DPL; ++t) {
        const int64_t x = lane + t * FA_WARP_SIZE;
        if (x >= d) break;
        float acc = o[t] * alpha;
        for (int64_t c = 0; c < cols; ++c) acc = fmaf(sp[c], sv[c * ld + x], acc);
        o[t] = acc;
    }
    fa_warp_sync(); /* sp is rewritten by the next row */
}

/* The query tile a forward or dQ block owns: one block per (query tile, query head, batch), tiles
 * issued last to first so the longest causal rows start early. */
struct query_block {
    int64_t b, h, hk, i0, rows;
    fa_key_range keys; /* keys any of its rows may see */
};

template <int TILE>
__device__ __forceinline__ query_block this_query_block(const fa_gpu_params &p)
{
    query_block q;
    q.b = blockIdx.z;
    q.h = blockIdx.y;
    q.hk = q.h / (p.shape.heads_q / p.shape.heads_kv);
    q.i0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * TILE;
    q.rows = p.shape.seqlen_q - q.i0 < TILE ? p.shape.seqlen_q - q.i0 : TILE;
    q.keys = fa_tile_keys(p, q.b, q.i0, q.rows);
    return q;
}

/* Stages K_j, V_j of key tile j0 for the query block in shared memory; false (nothing loaded)
 * when the block mask hides the whole tile. Called by every thread of the block. */
template <int TILE>
__device__ __forceinline__ bool stage_key_tile(const fa_gpu_params &p, const query_block &qb, int64_t j0, int64_t cols,
                                               float *sk, float *sv, int64_t ld)
{
    if (!fa_block_mask_any(p, qb.i0, qb.rows, j0, cols)) return false; /* K_j, V_j never loaded */
    __syncthreads(); /* the previous tile is no longer read */
    const int64_t loaded = fa_loaded_keys(p, qb.b, j0, cols);
    fa_load_tile(p.k, p.shape.dtype, qb.b, j0, qb.hk, loaded, TILE, p.shape.head_dim, sk, ld);
    fa_load_tile(p.v, p.shape.dtype, qb.b, j0, qb.hk, loaded, TILE, p.shape.head_dim, sv, ld);
    __syncthreads();
    return true;
}

/* The forward's shared memory (fa_gpu_generic_smem_bytes, FA_GPU_PASS_FORWARD): Q, K and V tiles
 * of TILE rows of ld floats, then one row of probabilities per warp (sp: this warp's). The
 * forward and the KV-cache attention (attention_decode.cuh) share it. */
struct forward_smem {
    int64_t ld;
    float *sq, *sk, *sv, *sp;
};

template <int TILE>
__device__ __forceinline__ forward_smem forward_layout(float *smem, int64_t head_dim, int warp)
{
    forward_smem s;
    s.ld = fa_gpu_smem_ld(head_dim);
    s.sq = smem;
    s.sk = s.sq + TILE * s.ld;
    s.sv = s.sk + TILE * s.ld;
    s.sp = s.sv + TILE * s.ld + warp * TILE;
    return s;
}

/* Forward: Algorithm 1 with online softmax. */
template <int BUCKET, int TILE>
__global__ void __launch_bounds__(kThreads) forward(const fa_gpu_params params)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    const fa_gpu_params p = fa_sequence_params(params, blockIdx.z);
    constexpr int W = FA_WARP_SIZE, RPW = TILE / FA_GENERIC_WARPS;
    constexpr int DPL = (BUCKET + W - 1) / W, CPL = (TILE + W - 1) / W;
    FA_DYNAMIC_SMEM(float, smem);
    const int warp = threadIdx.x / W, lane = threadIdx.x % W;
    const forward_smem sm = forward_layout<TILE>(smem, p.shape.head_dim, warp);
    const int64_t d = p.shape.head_dim, ld = sm.ld;
    float *const sq = sm.sq, *const sk = sm.sk, *const sv = sm.sv, *const sp = sm.sp;
    const query_block qb = this_query_block<TILE>(p);
    if (qb.rows <= 0) return; /* past its sequence (packed batch) */
    const int64_t b = qb.b, h = qb.h, i0 = qb.i0, rows = qb.rows;

    float o[RPW][DPL], m[RPW], l[RPW];
    const float sink = fa_sink_log2(p, h);
    for (int rr = 0; rr < RPW; ++rr) {
        m[rr] = sink; /* a sink is a logit with no value: the running max and sum start from it */
        l[rr] = sink == -INFINITY ? 0.0f : 1.0f;
        for (int t = 0; t < DPL; ++t) o[rr][t] = 0.0f;
    }
    fa_load_tile(p.q, p.shape.dtype, b, i0, h, rows, TILE, d, sq, ld);

    for (int64_t j0 = qb.keys.lo / TILE * TILE; j0 < qb.keys.hi; j0 += TILE) {
        const int64_t cols = p.shape.seqlen_k - j0 < TILE ? p.shape.seqlen_k - j0 : TILE;
        if (!stage_key_tile<TILE>(p, qb, j0, cols, sk, sv, ld)) continue;
        for (int rr = 0; rr < RPW; ++rr) {
            const int r = warp * RPW + rr;
            if (r >= rows) break;
            const int64_t i = i0 + r;
            const fa_key_range range = fa_row_keys(p, b, i);
            if (range.hi <= j0 || range.lo >= j0 + cols) continue;
            float s[CPL], tile_max = -INFINITY;
            for (int cc = 0; cc < CPL; ++cc) {
                const int c = lane + cc * W;
                s[cc] = -INFINITY;
                if (c < cols && fa_element_visible(p, range, i, j0 + c))
                    s[cc] = fa_score_log2(p, b, h, i, j0 + c, dot_row(sq + r * ld, sk + c * ld, d), NULL);
                tile_max = fmaxf(tile_max, s[cc]);
            }
            tile_max = fa_warp_max(tile_max);
            if (tile_max == -INFINITY) continue; /* warp-uniform: nothing visible in this row */
            const float m_new = fmaxf(m[rr], tile_max);
            const float alpha = fa_exp2(m[rr] - m_new); /* 0 on the first visible tile */
            float row_sum = 0.0f;
            for (int cc = 0; cc < CPL; ++cc) {
                const int c = lane + cc * W;
                float prob = fa_exp2(s[cc] - m_new);
                row_sum += prob;
                if (p.dropout.p > 0.0f && c < cols)
                    prob = fa_dropout_kept(p, b, h, i, j0 + c) ? prob * p.keep_scale : 0.0f;
                if (c < TILE) sp[c] = prob;
            }
            l[rr] = l[rr] * alpha + fa_warp_sum(row_sum);
            m[rr] = m_new;
            accumulate_pv<DPL>(o[rr], alpha, sp, sv, cols, d, ld, lane);
        }
    }

    for (int rr = 0; rr < RPW; ++rr) {
        const int r = warp * RPW + rr;
        if (r >= rows) break;
        const int64_t i = i0 + r;
        const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
        const int64_t base = fa_row_offset(p.out, b, i, h);
        for (int t = 0; t < DPL; ++t) {
            const int64_t x = lane + t * W;
            if (x < d) fa_store_elem(p.out.data, base + x, p.shape.dtype, o[rr][t] * inv);
        }
        if (p.outputs.lse && lane == 0)
            p.outputs.lse[fa_stat_index(p, b, h, i)] = l[rr] > 0.0f ? m[rr] * FA_LN2 + logf(l[rr]) : -INFINITY;
    }
}

/* The row statistics of query rows [i0, i0 + rows) of (b, h) in shared memory for a tile of
 * `tile` rows: slse[r] = lse in base 2 and sdelta[r] = D, -inf and 0 past `rows`. By the whole
 * block. Every backward kernel that streams query tiles stages them so. */
__device__ __forceinline__ void stage_row_stats(const fa_gpu_params &p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                                                int tile, float *slse, float *sdelta)
{
    const int64_t stat_base = fa_stat_index(p, b, h, i0);
    for (int r = threadIdx.x; r < tile; r += blockDim.x) {
        slse[r] = r < rows ? p.outputs.lse[stat_base + r] * FA_LOG2E : -INFINITY;
        sdelta[r] = r < rows ? p.delta[stat_base + r] : 0.0f;
    }
}

/* Backward pre-pass: delta = rowsum(dO o O), one warp per row, grid-stride. */
__global__ void __launch_bounds__(kThreads) row_delta(const fa_gpu_params p)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    const int W = FA_WARP_SIZE;
    const int64_t total = p.shape.batch * p.shape.heads_q * p.shape.seqlen_q;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * FA_GENERIC_WARPS;
    const int lane = threadIdx.x % W;
    for (int64_t row = blockIdx.x * FA_GENERIC_WARPS + threadIdx.x / W; row < total; row += warps) {
        const int64_t i = row % p.shape.seqlen_q, h = (row / p.shape.seqlen_q) % p.shape.heads_q, b = row / (p.shape.seqlen_q * p.shape.heads_q);
        const int64_t o_base = fa_row_offset(p.out, b, i, h), g_base = fa_row_offset(p.dout, b, i, h);
        float acc = 0.0f;
        for (int64_t x = lane; x < p.shape.head_dim; x += W)
            acc = fmaf(fa_load_elem(p.dout.data, g_base + x, p.shape.dtype), fa_load_elem(p.out.data, o_base + x, p.shape.dtype), acc);
        acc = fa_warp_sum(acc);
        if (lane == 0) p.delta[fa_stat_index(p, b, h, i)] = acc;
    }
}

/* The recomputed tile quantities of one visible element (b, h, i, j) (Algorithm 4): z =
 * dropout(P) (what multiplied V in the forward), ds_score = P o (dropout(dP) - D), the gradient
 * of the final score (what a bias receives), and ds, that of tau * q.k (through the softcap). */
struct element_grads { float z, ds, ds_score; };

__device__ __forceinline__ element_grads recompute(const fa_gpu_params &p, int64_t b, int64_t h, int64_t i, int64_t j,
                                                   float qk, float dov, float lse_log2, float delta, bool kept)
{
    float dscore;
    const float prob = fa_exp2(fa_score_log2(p, b, h, i, j, qk, &dscore) - lse_log2);
    element_grads g;
    float dp = dov;
    g.z = prob;
    if (p.dropout.p > 0.0f) {
        g.z = kept ? prob * p.keep_scale : 0.0f;
        dp = kept ? dov * p.keep_scale : 0.0f;
    }
    g.ds_score = prob * (dp - delta);
    g.ds = g.ds_score * dscore;
    return g;
}

/* dQ_i = tau * sum_j dS_ij K_j: one block per (query tile, query head, batch), the forward's
 * structure with dS as the weights. No atomics: deterministic. */
template <int BUCKET, int TILE>
__global__ void __launch_bounds__(kThreads) backward_dq(const fa_gpu_params params)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    const fa_gpu_params p = fa_sequence_params(params, blockIdx.z);
    constexpr int W = FA_WARP_SIZE, RPW = TILE / FA_GENERIC_WARPS;
    constexpr int DPL = (BUCKET + W - 1) / W, CPL = (TILE + W - 1) / W;
    FA_DYNAMIC_SMEM(float, smem);
    const int64_t d = p.shape.head_dim, ld = fa_gpu_smem_ld(d);
    float *sq = smem, *sdo = sq + TILE * ld, *sk = sdo + TILE * ld, *sv = sk + TILE * ld;
    const int warp = threadIdx.x / W, lane = threadIdx.x % W;
    float *sds = sv + TILE * ld + warp * TILE;
    const query_block qb = this_query_block<TILE>(p);
    if (qb.rows <= 0) return; /* past its sequence (packed batch) */
    const int64_t b = qb.b, h = qb.h, i0 = qb.i0, rows = qb.rows;
    const int64_t stat_base = fa_stat_index(p, b, h, i0);

    float dq[RPW][DPL];
    for (int rr = 0; rr < RPW; ++rr)
        for (int t = 0; t < DPL; ++t) dq[rr][t] = 0.0f;
    fa_load_tile(p.q, p.shape.dtype, b, i0, h, rows, TILE, d, sq, ld);
    fa_load_tile(p.dout, p.shape.dtype, b, i0, h, rows, TILE, d, sdo, ld);

    for (int64_t j0 = qb.keys.lo / TILE * TILE; j0 < qb.keys.hi; j0 += TILE) {
        const int64_t cols = p.shape.seqlen_k - j0 < TILE ? p.shape.seqlen_k - j0 : TILE;
        if (!stage_key_tile<TILE>(p, qb, j0, cols, sk, sv, ld)) continue;
        for (int rr = 0; rr < RPW; ++rr) {
            const int r = warp * RPW + rr;
            if (r >= rows) break;
            const int64_t i = i0 + r;
            const float lse = p.outputs.lse[stat_base + r];
            const fa_key_range range = fa_row_keys(p, b, i);
            if (lse == -INFINITY || range.hi <= j0 || range.lo >= j0 + cols) continue;
            const float lse_log2 = lse * FA_LOG2E, delta = p.delta[stat_base + r];
            for (int cc = 0; cc < CPL; ++cc) {
                const int c = lane + cc * W;
                float ds = 0.0f;
                if (c < cols && fa_element_visible(p, range, i, j0 + c)) {
                    const bool kept = p.dropout.p > 0.0f && fa_dropout_kept(p, b, h, i, j0 + c);
                    ds = recompute(p, b, h, i, j0 + c, dot_row(sq + r * ld, sk + c * ld, d),
                                   dot_row(sdo + r * ld, sv + c * ld, d), lse_log2, delta, kept).ds;
                }
                if (c < TILE) sds[c] = ds;
            }
            fa_warp_sync();
            for (int t = 0; t < DPL; ++t) {
                const int64_t x = lane + t * W;
                if (x >= d) break;
                float acc = dq[rr][t];
                for (int64_t c = 0; c < cols; ++c) acc = fmaf(sds[c], sk[c * ld + x], acc);
                dq[rr][t] = acc;
            }
            fa_warp_sync();
        }
    }

    for (int rr = 0; rr < RPW; ++rr) {
        const int r = warp * RPW + rr;
        if (r >= rows) break;
        const int64_t base = fa_row_offset(p.dq, b, i0 + r, h);
        for (int t = 0; t < DPL; ++t) {
            const int64_t x = lane + t * W;
            if (x < d) fa_store_elem(p.dq.data, base + x, p.shape.dtype, dq[rr][t] * p.shape.scale);
        }
    }
}

/* dK_j = tau * sum_i dS_ij Q_i and dV_j = sum_i Z_ij dO_i: one block per (key tile, kv head,
 * batch) keeps its key rows' gradients in registers and streams every query tile of every query
 * head of its group, in a fixed order (deterministic, no atomics). */
template <int BUCKET, int TILE>
__global__ void __launch_bounds__(kThreads) backward_dkdv(const fa_gpu_params params)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    const fa_gpu_params p = fa_sequence_params(params, blockIdx.z);
    constexpr int W = FA_WARP_SIZE, RPW = TILE / FA_GENERIC_WARPS;
    constexpr int DPL = (BUCKET + W - 1) / W, CPL = (TILE + W - 1) / W;
    FA_DYNAMIC_SMEM(float, smem);
    const int64_t d = p.shape.head_dim, ld = fa_gpu_smem_ld(d);
    float *sk = smem, *sv = sk + TILE * ld, *sq = sv + TILE * ld, *sdo = sq + TILE * ld;
    float *slse = sdo + TILE * ld, *sdelta = slse + TILE;
    const int warp = threadIdx.x / W, lane = threadIdx.x % W;
    float *sz = sdelta + TILE + warp * 2 * TILE, *sds = sz + TILE;
    const int64_t b = blockIdx.z, hk = blockIdx.y, group = p.shape.heads_q / p.shape.heads_kv;
    const int64_t j0 = static_cast<int64_t>(blockIdx.x) * TILE;
    const int64_t keys = p.shape.seqlen_k - j0 < TILE ? p.shape.seqlen_k - j0 : TILE;
    if (keys <= 0) return; /* past its sequence (packed batch) */

    float dk[RPW][DPL], dv[RPW][DPL];
    for (int rr = 0; rr < RPW; ++rr)
        for (int t = 0; t < DPL; ++t) dk[rr][t] = dv[rr][t] = 0.0f;
    fa_load_tile(p.k, p.shape.dtype, b, j0, hk, keys, TILE, d, sk, ld);
    fa_load_tile(p.v, p.shape.dtype, b, j0, hk, keys, TILE, d, sv, ld);

    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t i0 = 0; i0 < p.shape.seqlen_q; i0 += TILE) {
            const int64_t rows = p.shape.seqlen_q - i0 < TILE ? p.shape.seqlen_q - i0 : TILE;
            const fa_key_range span = fa_tile_keys(p, b, i0, rows);
            if (span.hi <= j0 || span.lo >= j0 + keys || !fa_block_mask_any(p, i0, rows, j0, keys)) continue;
            __syncthreads();
            fa_load_tile(p.q, p.shape.dtype, b, i0, h, rows, TILE, d, sq, ld);
            fa_load_tile(p.dout, p.shape.dtype, b, i0, h, rows, TILE, d, sdo, ld);
            stage_row_stats(p, b, h, i0, rows, TILE, slse, sdelta);
            __syncthreads();
            for (int rr = 0; rr < RPW; ++rr) {
                const int kr = warp * RPW + rr;
                if (kr >= keys) break;
                const int64_t j = j0 + kr;
                for (int cc = 0; cc < CPL; ++cc) {
                    const int c = lane + cc * W;
                    element_grads g = {0.0f, 0.0f, 0.0f};
                    if (c < rows && slse[c] != -INFINITY && fa_element_visible(p, fa_row_keys(p, b, i0 + c), i0 + c, j)) {
                        const bool kept = p.dropout.p > 0.0f && fa_dropout_kept(p, b, h, i0 + c, j);
                        g = recompute(p, b, h, i0 + c, j, dot_row(sq + c * ld, sk + kr * ld, d),
                                      dot_row(sdo + c * ld, sv + kr * ld, d), slse[c], sdelta[c], kept);
                    }
                    if (c < TILE) {
                        sz[c] = g.z;
                        sds[c] = g.ds;
                    }
                }
                fa_warp_sync();
                for (int t = 0; t < DPL; ++t) {
                    const int64_t x = lane + t * W;
                    if (x >= d) break;
                    float acc_k = dk[rr][t], acc_v = dv[rr][t];
                    for (int64_t c = 0; c < rows; ++c) {
                        acc_k = fmaf(sds[c], sq[c * ld + x], acc_k);
                        acc_v = fmaf(sz[c], sdo[c * ld + x], acc_v);
                    }
                    dk[rr][t] = acc_k;
                    dv[rr][t] = acc_v;
                }
                fa_warp_sync();
            }
        }
    }

    for (int rr = 0; rr < RPW; ++rr) {
        const int kr = warp * RPW + rr;
        if (kr >= keys) break;
        const int64_t k_base = fa_row_offset(p.dk, b, j0 + kr, hk), v_base = fa_row_offset(p.dv, b, j0 + kr, hk);
        for (int t = 0; t < DPL; ++t) {
            const int64_t x = lane + t * W;
            if (x >= p.shape.head_dim) break;
            fa_store_elem(p.dk.data, k_base + x, p.shape.dtype, dk[rr][t] * p.shape.scale);
            fa_store_elem(p.dv.data, v_base + x, p.shape.dtype, dv[rr][t]);
        }
    }
}

} // namespace fa_generic
#endif

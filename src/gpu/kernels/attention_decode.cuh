/* fa_forward_kvcache on the GPU, and the device-side checks of tables in device memory.
 *  - check_varlen / check_kvcache: one thread walks the offsets or the cache lengths and pages in
 *    sequence order (the core's rule, table_checks.h) and records the first failure in the
 *    context's status record; every later kernel of the call then writes nothing, and the plugin
 *    reports it at the next synchronize (reading the tables on the host would need a
 *    synchronisation).
 *  - append: k_new/v_new into the cache at cache_seqlens[b] + t, through the block table.
 *  - attend: the generic forward's structure (fa_generic) for a few query rows against a long
 *    cache. The query heads of a GQA group are packed into the rows of one block (row r: query
 *    position r / group, head hk * group + r % group), so each kv head's keys are read once per
 *    row tile, not once per query head; the keys of each sequence are cut into chunks by the
 *    split rule every backend shares (kv_split.h: the sequence's own length and the requested
 *    size only, so its result does not depend on the batch), one block per (row tile, chunk, kv
 *    head, sequence), each leaving its rows' partial (O, m, l) in the workspace; the grid covers
 *    the longest sequence's row tiles and kv_chunks (a bound of every sequence's chunk count), and
 *    blocks past a sequence's rows or chunks return at once. Ragged queries: each sequence's own
 *    query rows (problem_tables.h).
 *  - merge: per row, the chunks combined in increasing chunk order by the one lse merge
 *    (merge_rule.h: deterministic, one NaN rule), O and lse; the sink, when there is one, joins
 *    the max and the sum there (once per row, never per chunk).
 *  Score modifiers: every score goes through fa_score_log2_on with the sequence's own diagonal. */
#ifndef FA_GPU_ATTENTION_DECODE_CUH
#define FA_GPU_ATTENTION_DECODE_CUH
#include "attention_generic.cuh"
#include "../../common/kv_split.h"
#include "../../common/merge_rule.h"

namespace fa_decode {

using fa_generic::kThreads;

/* One thread: the packed batch's offsets (the core's rule, table_checks.h, on the device). */
__global__ void __launch_bounds__(kThreads) check_varlen(const fa_gpu_params p)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    if (threadIdx.x != 0 || fa_gpu_failed(p)) return;
    (void)fa_check_varlen_tables(p.status, &p.varlen, p.shape.seqlen_q, p.shape.seqlen_k);
}

/* The sequences of the call, and the query rows of sequence b. */
__device__ __forceinline__ int64_t sequences(const fa_gpu_params &p) { return p.varlen.batch ? p.varlen.batch : p.shape.batch; }
__device__ __forceinline__ int64_t queries_of(const fa_gpu_params &p, int64_t b)
{
    return fa_sequence_queries(&p.varlen, p.shape.seqlen_q, b);
}

/* One thread: the cache's lengths and pages (the core's rule, table_checks.h, on the device). */
__global__ void __launch_bounds__(kThreads) check_kvcache(const fa_gpu_params p)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    if (threadIdx.x != 0 || fa_gpu_failed(p)) return;
    (void)fa_check_cache_tables(p.status, &p.cache, &p.varlen, sequences(p), p.shape.seqlen_k, p.shape.seqlen_q,
                                p.cache.seqlen_new, p.cache_slots);
}

/* One thread: ALiBi slopes and sinks (the core's rule, table_checks.h, on the device: the arrays
 * are device memory). */
__global__ void __launch_bounds__(kThreads) check_modifier_values(const fa_gpu_params p)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    if (threadIdx.x != 0 || fa_gpu_failed(p)) return;
    (void)fa_check_modifier_values(p.status, &p.modifiers, p.varlen.batch ? p.varlen.batch : p.shape.batch,
                                   p.shape.heads_q);
}

/* Element offset of cache position pos of sequence b, head h, in a cache tensor: through the block
 * table when paged ([num_pages, page_size, heads, d]), else its slot of [slots, capacity, heads, d]. */
__device__ __forceinline__ int64_t position_offset(const fa_gpu_params &p, const fa_gpu_tensor &t, int64_t b, int64_t pos,
                                                   int64_t h)
{
    int64_t slot_b, slot_s;
    fa_cache_locate(&p.cache, b, pos, &slot_b, &slot_s);
    return fa_row_offset(t, slot_b, slot_s, h);
}

/* Element offset of key j of sequence b (cache position leftpad + j), head h. */
__device__ __forceinline__ int64_t key_offset(const fa_gpu_params &p, const fa_gpu_tensor &t, int64_t b, int64_t j, int64_t h)
{
    return position_offset(p, t, b, fa_cache_leftpad(&p.cache, b) + j, h);
}

/* One block per (new token, kv head, sequence): the token's K and V rows into the cache (blocks
 * past a sequence's new tokens return at once). */
__global__ void __launch_bounds__(kThreads) append(const fa_gpu_params p)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    if (fa_gpu_failed(p)) return;
    const int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    if (t >= fa_cache_new_tokens(&p.cache, b)) return;
    const int64_t pos = p.cache.cache_seqlens[b] + t;
    int64_t nb, nt;
    fa_cache_new_row(&p.cache, b, t, &nb, &nt);
    const int64_t k_dst = position_offset(p, p.k, b, pos, h), v_dst = position_offset(p, p.v, b, pos, h);
    const int64_t k_src = fa_row_offset(p.k_new, nb, nt, h), v_src = fa_row_offset(p.v_new, nb, nt, h);
    for (int64_t x = threadIdx.x; x < p.shape.head_dim; x += blockDim.x) {
        fa_store_elem(p.k.data, k_dst + x, p.shape.dtype, fa_load_elem(p.k_new.data, k_src + x, p.shape.dtype));
        fa_store_elem(p.v.data, v_dst + x, p.shape.dtype, fa_load_elem(p.v_new.data, v_src + x, p.shape.dtype));
    }
}

/* The packed rows of one kv head: group query heads x query positions, of the longest sequence
 * (the partials' layout) or of sequence b. */
__device__ __forceinline__ int64_t packed_rows(const fa_gpu_params &p)
{
    return p.shape.heads_q / p.shape.heads_kv * (p.varlen.batch ? p.varlen.max_seqlen_q : p.shape.seqlen_q);
}
__device__ __forceinline__ int64_t sequence_rows(const fa_gpu_params &p, int64_t b)
{
    return p.shape.heads_q / p.shape.heads_kv * queries_of(p, b);
}

/* Partial (O, m, l) of row r of (sequence b, kv head hk, chunk c): O rows first, then m, then l. */
__device__ __forceinline__ int64_t partial_row(const fa_gpu_params &p, int64_t b, int64_t hk, int64_t c, int64_t r)
{
    return ((b * p.shape.heads_kv + hk) * p.kv_chunks + c) * packed_rows(p) + r;
}
__device__ __forceinline__ int64_t partial_rows(const fa_gpu_params &p)
{
    return sequences(p) * p.shape.heads_kv * p.kv_chunks * packed_rows(p);
}

/* tile[x * ld + c] = cache row of key j0 + x, head h, sequence b (zero past `valid` keys). */
__device__ __forceinline__ void load_key_tile(const fa_gpu_params &p, const fa_gpu_tensor &t, int64_t b, int64_t j0,
                                              int64_t h, int64_t valid, int tile_rows, float *tile, int64_t ld)
{
    const int64_t d = p.shape.head_dim, total = static_cast<int64_t>(tile_rows) * d;
    for (int64_t e = threadIdx.x; e < total; e += blockDim.x) {
        const int64_t x = e / d, c = e - x * d;
        tile[x * ld + c] = x < valid ? fa_load_elem(t.data, key_offset(p, t, b, j0 + x, h) + c, p.shape.dtype) : 0.0f;
    }
}

template <int BUCKET, int TILE>
__global__ void __launch_bounds__(kThreads) attend(const fa_gpu_params p)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    if (fa_gpu_failed(p)) return;
    constexpr int W = FA_WARP_SIZE, RPW = TILE / FA_GENERIC_WARPS;
    constexpr int DPL = (BUCKET + W - 1) / W, CPL = (TILE + W - 1) / W;
    FA_DYNAMIC_SMEM(float, smem);
    const int warp = threadIdx.x / W, lane = threadIdx.x % W;
    const fa_generic::forward_smem sm = fa_generic::forward_layout<TILE>(smem, p.shape.head_dim, warp);
    const int64_t d = p.shape.head_dim, ld = sm.ld;
    float *const sq = sm.sq, *const sk = sm.sk, *const sv = sm.sv, *const sp = sm.sp;
    const int64_t b = blockIdx.z, hk = blockIdx.y, group = p.shape.heads_q / p.shape.heads_kv;
    const int64_t c = blockIdx.x % p.kv_chunks, r0 = blockIdx.x / p.kv_chunks * TILE;
    const int64_t rows = sequence_rows(p, b) - r0 < TILE ? sequence_rows(p, b) - r0 : TILE;
    const int64_t keys = fa_cache_keys(&p.cache, b), queries = queries_of(p, b);
    if (rows <= 0 || c >= fa_kv_split_chunks(p.cache.split_tokens, keys)) return; /* block-uniform */
    /* Keys of the chunk any row may see: ranges never shrink from one query position to the next. */
    const fa_key_range chunk = fa_kv_split_chunk(p.cache.split_tokens, keys, c);
    const fa_key_range first = fa_visible_keys(r0 / group, queries, keys, keys, p.mask.causal, p.mask.window_left, p.mask.window_right);
    const fa_key_range last =
        fa_visible_keys((r0 + rows - 1) / group, queries, keys, keys, p.mask.causal, p.mask.window_left, p.mask.window_right);
    const int64_t lo = first.lo > chunk.lo ? first.lo : chunk.lo, hi = last.hi < chunk.hi ? last.hi : chunk.hi;

    float o[RPW][DPL], m[RPW], l[RPW];
    for (int rr = 0; rr < RPW; ++rr) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
        for (int t = 0; t < DPL; ++t) o[rr][t] = 0.0f;
    }
    for (int64_t e = threadIdx.x; e < TILE * d; e += blockDim.x) {
        const int64_t r = e / d, x = e - r * d, i = (r0 + r) / group, h = hk * group + (r0 + r) % group;
        int64_t qb, qi;
        fa_sequence_query_row(&p.varlen, b, i, &qb, &qi);
        sq[r * ld + x] = r < rows ? fa_load_elem(p.q.data, fa_row_offset(p.q, qb, qi, h) + x, p.shape.dtype) : 0.0f;
    }

    for (int64_t j0 = lo; j0 < hi; j0 += TILE) {
        const int64_t cols = hi - j0 < TILE ? hi - j0 : TILE;
        __syncthreads(); /* Q visible; the previous tile is no longer read */
        load_key_tile(p, p.k, b, j0, hk, cols, TILE, sk, ld);
        load_key_tile(p, p.v, b, j0, hk, cols, TILE, sv, ld);
        __syncthreads();
        for (int rr = 0; rr < RPW; ++rr) {
            const int r = warp * RPW + rr;
            if (r >= rows) break;
            fa_key_range range =
                fa_visible_keys((r0 + r) / group, queries, keys, keys, p.mask.causal, p.mask.window_left, p.mask.window_right);
            if (range.lo < chunk.lo) range.lo = chunk.lo;
            if (range.hi > chunk.hi) range.hi = chunk.hi;
            if (range.hi <= j0 || range.lo >= j0 + cols) continue;
            float s[CPL], tile_max = -INFINITY;
            for (int cc = 0; cc < CPL; ++cc) {
                const int col = lane + cc * W;
                s[cc] = -INFINITY;
                if (col < cols && j0 + col >= range.lo && j0 + col < range.hi)
                    s[cc] = fa_score_log2_on(p, b, hk * group + (r0 + r) % group, (r0 + r) / group, j0 + col,
                                             keys - queries, fa_generic::dot_row(sq + r * ld, sk + col * ld, d), NULL);
                tile_max = fmaxf(tile_max, s[cc]);
            }
            tile_max = fa_warp_max(tile_max);
            if (tile_max == -INFINITY) continue; /* warp-uniform: nothing visible in this row */
            const float m_new = fmaxf(m[rr], tile_max);
            const float alpha = fa_exp2(m[rr] - m_new);
            float row_sum = 0.0f;
            for (int cc = 0; cc < CPL; ++cc) {
                const int col = lane + cc * W;
                const float prob = fa_exp2(s[cc] - m_new);
                row_sum += prob;
                if (col < TILE) sp[col] = prob;
            }
            l[rr] = l[rr] * alpha + fa_warp_sum(row_sum);
            m[rr] = m_new;
            fa_generic::accumulate_pv<DPL>(o[rr], alpha, sp, sv, cols, d, ld, lane);
        }
    }

    float *part_o = p.partial, *part_m = part_o + partial_rows(p) * d, *part_l = part_m + partial_rows(p);
    for (int rr = 0; rr < RPW; ++rr) {
        const int r = warp * RPW + rr;
        if (r >= rows) break;
        const int64_t row = partial_row(p, b, hk, c, r0 + r);
        for (int t = 0; t < DPL; ++t) {
            const int64_t x = lane + t * W;
            if (x < d) part_o[row * d + x] = o[rr][t];
        }
        if (lane == 0) {
            part_m[row] = m[rr];
            part_l[row] = l[rr];
        }
    }
}

/* One warp per packed row (grid-stride): the chunks' partials (m, l, O), m in base 2, merged in
 * increasing chunk order by the one lse merge (merge_rule.h); the sink, when there is one, joins
 * as a part without values, once per row (never per chunk). */
__global__ void __launch_bounds__(kThreads) merge(const fa_gpu_params p)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    if (fa_gpu_failed(p)) return;
    const int W = FA_WARP_SIZE, lane = threadIdx.x % W;
    const int64_t rows = packed_rows(p), group = p.shape.heads_q / p.shape.heads_kv, d = p.shape.head_dim;
    const int64_t total = sequences(p) * p.shape.heads_kv * rows, warps = static_cast<int64_t>(gridDim.x) * FA_GENERIC_WARPS;
    const float *part_o = p.partial, *part_m = part_o + partial_rows(p) * d, *part_l = part_m + partial_rows(p);
    for (int64_t n = blockIdx.x * FA_GENERIC_WARPS + threadIdx.x / W; n < total; n += warps) {
        const int64_t r = n % rows, hk = n / rows % p.shape.heads_kv, b = n / (rows * p.shape.heads_kv);
        if (r >= sequence_rows(p, b)) continue; /* past the sequence's queries */
        const int64_t i = r / group, h = hk * group + r % group;
        const int64_t chunks = fa_kv_split_chunks(p.cache.split_tokens, fa_cache_keys(&p.cache, b));
        int64_t qb, qi;
        fa_sequence_query_row(&p.varlen, b, i, &qb, &qi);
        const float sink = fa_sink_log2(p, h); /* -inf without */
        fa_merge_row merged = fa_merge_row_start();
        fa_merge_see(&merged, sink);
        for (int64_t c = 0; c < chunks; ++c) {
            const int64_t row = partial_row(p, b, hk, c, r);
            fa_merge_see_part(&merged, part_m[row], part_l[row]);
        }
        float sum = fa_merge_weight_base2(&merged, sink);
        for (int64_t c = 0; c < chunks; ++c) {
            const int64_t row = partial_row(p, b, hk, c, r);
            const float weight = fa_merge_weight_base2(&merged, part_m[row]);
            if (weight != 0.0f) sum = fa_merge_accumulate(sum, weight, part_l[row]);
        }
        const float factor = fa_merge_factor(&merged, sum);
        const int64_t out_base = fa_row_offset(p.out, qb, qi, h);
        for (int64_t x = lane; x < d; x += W) {
            float acc = 0.0f;
            for (int64_t c = 0; c < chunks; ++c) {
                const int64_t row = partial_row(p, b, hk, c, r);
                const float weight = fa_merge_weight_base2(&merged, part_m[row]);
                if (weight != 0.0f) acc = fa_merge_accumulate(acc, weight, part_o[row * d + x]);
            }
            fa_store_elem(p.out.data, out_base + x, p.shape.dtype, acc * factor);
        }
        if (p.outputs.lse && lane == 0) p.outputs.lse[fa_stat_index(p, qb, h, qi)] = fa_merge_lse_base2(&merged, sum);
    }
}

} // namespace fa_decode
#endif

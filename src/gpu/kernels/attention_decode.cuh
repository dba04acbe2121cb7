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
#include "../../common/quant_codes.h"
#include "../../common/rotary.h"

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
    (void)(fa_check_cache_tables(p.status, &p.cache, &p.varlen, sequences(p), p.shape.seqlen_k, p.shape.seqlen_q,
                                 p.cache.seqlen_new, p.cache_slots) &&
           fa_check_rotary_positions(p.status, &p.cache, &p.varlen, sequences(p), p.shape.seqlen_q) &&
           fa_check_descales(p.status, 0, p.cache.k_descale, sequences(p), p.shape.heads_kv) &&
           fa_check_descales(p.status, 1, p.cache.v_descale, sequences(p), p.shape.heads_kv));
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

/* Element x of a row rotated to position pos (rotary.h's pairs and angles), from the row's
 * element and its pair's, both read with load(i). */
template <typename Load>
__device__ __forceinline__ float rotated(const fa_cache_section &c, int64_t pos, int64_t x, Load load)
{
    const float own = load(x);
    if (!c.rotary_cos || x >= c.rotary_dim) return own;
    int is_first;
    const int64_t f = fa_rotary_angle_of(&c, x, &is_first), half = c.rotary_dim / 2;
    int64_t first, second;
    fa_rotary_pair(&c, f, &first, &second);
    return fa_rotary_rotate(own, load(is_first ? second : first), is_first, c.rotary_cos[pos * half + f],
                            c.rotary_sin[pos * half + f]);
}

/* Element x of new token t of sequence b, kv head h, as the cache is to hold it before
 * quantisation: k_new rotated (keys), v_new as it is. */
__device__ __forceinline__ float new_value(const fa_gpu_params &p, int keys, int64_t b, int64_t t, int64_t h, int64_t x)
{
    int64_t nb, nt;
    fa_cache_new_row(&p.cache, b, t, &nb, &nt);
    const fa_gpu_tensor &src = keys ? p.k_new : p.v_new;
    const fa_dtype dtype = keys ? p.k_new_dtype : p.v_new_dtype;
    const int64_t row = fa_row_offset(src, nb, nt, h);
    const auto load = [&](int64_t i) { return fa_load_elem(src.data, row + i, dtype); };
    return keys ? rotated(p.cache, fa_rotary_new_position(&p.cache, b, t), x, load) : load(x);
}

/* One new row into a cache tensor (the block's threads together): copied, rounded, or quantised
 * by fa_kv_scales' rules (flashattn.h; quant_codes.h), the int8 scale from the row's max |x|
 * reduced in shared memory (NaN kept). */
__device__ void store_new_row(const fa_gpu_params &p, int keys, int64_t b, int64_t t, int64_t h, float *red)
{
    const fa_gpu_tensor &dst_t = keys ? p.k : p.v;
    const fa_dtype dtype = keys ? p.k_dtype : p.v_dtype;
    const int64_t d = p.shape.head_dim;
    int64_t slot_b, slot_s;
    fa_cache_locate(&p.cache, b, p.cache.cache_seqlens[b] + t, &slot_b, &slot_s);
    const int64_t dst = fa_row_offset(dst_t, slot_b, slot_s, h);
    float scale = 0.0f;
    if (dtype == FA_DTYPE_I8) {
        float absmax = 0.0f;
        for (int64_t x = threadIdx.x; x < d; x += blockDim.x) {
            const float a = fabsf(new_value(p, keys, b, t, h, x));
            absmax = a > absmax || a != a ? a : absmax;
        }
        red[threadIdx.x] = absmax;
        __syncthreads();
        for (unsigned width = blockDim.x / 2; width > 0; width /= 2) {
            if (threadIdx.x < width) {
                const float a = red[threadIdx.x + width], m = red[threadIdx.x];
                red[threadIdx.x] = a > m || a != a ? a : m;
            }
            __syncthreads();
        }
        scale = fa_i8_scale(red[0]);
        __syncthreads(); /* red is reused by the next row */
        float *scales = keys ? p.cache.k_scale : p.cache.v_scale;
        if (threadIdx.x == 0) scales[fa_cache_scale_index(slot_b, slot_s, h, p.cache_positions, p.shape.heads_kv)] = scale;
    }
    const float descale = fa_cache_descale(keys ? p.cache.k_descale : p.cache.v_descale, b, p.shape.heads_kv, h);
    for (int64_t x = threadIdx.x; x < d; x += blockDim.x) {
        const float v = new_value(p, keys, b, t, h, x);
        if (dtype == FA_DTYPE_I8) static_cast<int8_t *>(dst_t.data)[dst + x] = fa_f32_to_i8(v, scale);
        else if (dtype == FA_DTYPE_FP8_E4M3) static_cast<uint8_t *>(dst_t.data)[dst + x] = fa_f32_to_fp8_e4m3(v / descale);
        else if (dtype == FA_DTYPE_FP8_E5M2) static_cast<uint8_t *>(dst_t.data)[dst + x] = fa_f32_to_fp8_e5m2(v / descale);
        else fa_store_elem(dst_t.data, dst + x, dtype, v);
    }
}

/* One block per (new token, kv head, sequence): the token's K and V rows into the cache (blocks
 * past a sequence's new tokens return at once), with kAppendSmem bytes of shared memory. */
constexpr size_t kAppendSmem = kThreads * sizeof(float);
__global__ void __launch_bounds__(kThreads) append(const fa_gpu_params p)
{
    FA_GPU_REQUIRE_BLOCK(kThreads);
    FA_DYNAMIC_SMEM(float, red); /* kAppendSmem: the int8 scale's reduction */
    if (fa_gpu_failed(p)) return;
    const int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    if (t >= fa_cache_new_tokens(&p.cache, b)) return;
    store_new_row(p, 1, b, t, h, red);
    store_new_row(p, 0, b, t, h, red);
}

/* Element c of key j of sequence b, kv head h, of a cache tensor as f32: widened, or its code times
 * its int8 scale or FP8 descale. */
__device__ __forceinline__ float cache_value(const fa_gpu_params &p, int keys, int64_t b, int64_t j, int64_t h, int64_t c)
{
    const fa_gpu_tensor &t = keys ? p.k : p.v;
    const fa_dtype dtype = keys ? p.k_dtype : p.v_dtype;
    int64_t slot_b, slot_s;
    fa_cache_locate(&p.cache, b, fa_cache_leftpad(&p.cache, b) + j, &slot_b, &slot_s);
    const int64_t at = fa_row_offset(t, slot_b, slot_s, h) + c;
    if (dtype == FA_DTYPE_I8) {
        const float *scales = keys ? p.cache.k_scale : p.cache.v_scale;
        return fa_i8_to_f32(static_cast<const int8_t *>(t.data)[at],
                            scales[fa_cache_scale_index(slot_b, slot_s, h, p.cache_positions, p.shape.heads_kv)]);
    }
    if (dtype == FA_DTYPE_FP8_E4M3 || dtype == FA_DTYPE_FP8_E5M2) {
        const uint8_t code = static_cast<const uint8_t *>(t.data)[at];
        const float value = dtype == FA_DTYPE_FP8_E4M3 ? fa_fp8_e4m3_to_f32(code) : fa_fp8_e5m2_to_f32(code);
        return value * fa_cache_descale(keys ? p.cache.k_descale : p.cache.v_descale, b, p.shape.heads_kv, h);
    }
    return fa_load_elem(t.data, at, dtype);
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

/* tile[x * ld + c] = cache row of key j0 + x, head h, sequence b of the K (keys) or V cache tensor
 * (zero past `valid` keys). */
__device__ __forceinline__ void load_key_tile(const fa_gpu_params &p, int keys, int64_t b, int64_t j0, int64_t h,
                                              int64_t valid, int tile_rows, float *tile, int64_t ld)
{
    const int64_t d = p.shape.head_dim, total = static_cast<int64_t>(tile_rows) * d;
    for (int64_t e = threadIdx.x; e < total; e += blockDim.x) {
        const int64_t x = e / d, c = e - x * d;
        tile[x * ld + c] = x < valid ? cache_value(p, keys, b, j0 + x, h, c) : 0.0f;
    }
}

/* Element x of query i of sequence b, head h as the attention reads it: rotated to its position
 * and rounded to q's dtype when desc->rotary is set. */
__device__ __forceinline__ float query_value(const fa_gpu_params &p, int64_t b, int64_t i, int64_t h, int64_t x)
{
    int64_t qb, qi;
    fa_sequence_query_row(&p.varlen, b, i, &qb, &qi);
    const int64_t row = fa_row_offset(p.q, qb, qi, h);
    const auto load = [&](int64_t e) { return fa_load_elem(p.q.data, row + e, p.shape.dtype); };
    if (!p.cache.rotary_cos) return load(x);
    return fa_round_to_dtype(rotated(p.cache, fa_rotary_query_position(&p.cache, b, i), x, load), p.shape.dtype);
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
        sq[r * ld + x] = r < rows ? query_value(p, b, i, h, x) : 0.0f;
    }

    for (int64_t j0 = lo; j0 < hi; j0 += TILE) {
        const int64_t cols = hi - j0 < TILE ? hi - j0 : TILE;
        __syncthreads(); /* Q visible; the previous tile is no longer read */
        load_key_tile(p, 1, b, j0, hk, cols, TILE, sk, ld);
        load_key_tile(p, 0, b, j0, hk, cols, TILE, sv, ld);
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

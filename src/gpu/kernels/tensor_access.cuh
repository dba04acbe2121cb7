/* Element and tile movement between device tensors (f32, f16 or bf16, any strides) and f32
 * shared-memory tiles, plus the per-element masks and dropout of the API's semantics. Used by
 * every kernel, on CUDA and HIP alike. */
#ifndef FA_GPU_TENSOR_ACCESS_CUH
#define FA_GPU_TENSOR_ACCESS_CUH
#include "../../common/philox.h"
#include "../../common/visibility.h"
#include "../gpu_runtime.h"
#include "params.h"

__device__ __forceinline__ int64_t fa_row_offset(const fa_gpu_tensor &t, int64_t b, int64_t s, int64_t h)
{
    return b * t.stride_batch + s * t.stride_seq + h * t.stride_head;
}

__device__ __forceinline__ float fa_load_elem(const void *base, int64_t index, fa_dtype dtype)
{
    if (dtype == FA_DTYPE_F32) return static_cast<const float *>(base)[index];
    if (dtype == FA_DTYPE_F16) return __half2float(static_cast<const __half *>(base)[index]);
    return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t *>(base)[index]) << 16);
}

/* f32 -> bf16 by round to nearest even (NaN kept quiet), the same rule as src/common/half.h. */
__device__ __forceinline__ uint16_t fa_f32_to_bf16_bits(float f)
{
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ void fa_store_elem(void *base, int64_t index, fa_dtype dtype, float value)
{
    if (dtype == FA_DTYPE_F32) static_cast<float *>(base)[index] = value;
    else if (dtype == FA_DTYPE_F16) static_cast<__half *>(base)[index] = __float2half_rn(value);
    else static_cast<uint16_t *>(base)[index] = fa_f32_to_bf16_bits(value);
}

/* value rounded to dtype (as fa_store_elem would store it), back as f32. */
__device__ __forceinline__ float fa_round_to_dtype(float value, fa_dtype dtype)
{
    if (dtype == FA_DTYPE_F16) return __half2float(__float2half_rn(value));
    if (dtype == FA_DTYPE_BF16) return __uint_as_float(static_cast<uint32_t>(fa_f32_to_bf16_bits(value)) << 16);
    return value;
}

/* tile[r * ld + c] = t[b, s0 + r, h, c] for r < tile_rows (zero past seqlen), by the whole block. */
__device__ __forceinline__ void fa_load_tile(const fa_gpu_tensor &t, fa_dtype dtype, int64_t b, int64_t s0,
                                             int64_t h, int64_t valid_rows, int tile_rows, int64_t d,
                                             float *tile, int64_t ld)
{
    const int64_t total = static_cast<int64_t>(tile_rows) * d;
    for (int64_t e = threadIdx.x; e < total; e += blockDim.x) {
        const int64_t r = e / d, c = e - r * d;
        tile[r * ld + c] = r < valid_rows ? fa_load_elem(t.data, fa_row_offset(t, b, s0 + r, h) + c, dtype) : 0.0f;
    }
}

__device__ __forceinline__ int64_t fa_valid_keys(const fa_gpu_params &p, int64_t b)
{
    return p.mask.seqlens_k ? p.mask.seqlens_k[b] : p.shape.seqlen_k;
}

/* Rows of the key tile [j0, j0 + cols) to load: keys hidden by padding (j >= seqlens_k[b]) are
 * loaded as zeros, so that whatever they hold (NaN in uninitialised padding) never reaches a
 * result through a zero weight (0 * NaN). */
__device__ __forceinline__ int64_t fa_loaded_keys(const fa_gpu_params &p, int64_t b, int64_t j0, int64_t cols)
{
    const int64_t valid = fa_valid_keys(p, b) - j0;
    return valid < cols ? (valid > 0 ? valid : 0) : cols;
}

__device__ __forceinline__ fa_key_range fa_row_keys(const fa_gpu_params &p, int64_t b, int64_t i)
{
    return fa_visible_keys_at(fa_diagonal_key(i, p.mask.diag_offset), fa_valid_keys(p, b), p.mask.causal, p.mask.window_left,
                              p.mask.window_right);
}

/* Keys [lo, hi) any row of the query tile [i0, i0 + rows) may see: lo and hi of fa_visible_keys
 * never decrease with the row, so the first and last rows bound the union. */
__device__ __forceinline__ fa_key_range fa_tile_keys(const fa_gpu_params &p, int64_t b, int64_t i0, int64_t rows)
{
    fa_key_range r;
    r.lo = fa_row_keys(p, b, i0).lo;
    r.hi = fa_row_keys(p, b, i0 + rows - 1).hi;
    return r;
}

/* Keys [lo, hi) every row of the query tile [i0, i0 + rows) sees (fa_tile_keys' intersection twin):
 * lo of the last row, hi of the first. */
__device__ __forceinline__ fa_key_range fa_tile_common_keys(const fa_gpu_params &p, int64_t b, int64_t i0, int64_t rows)
{
    fa_key_range r;
    r.lo = fa_row_keys(p, b, i0 + rows - 1).lo;
    r.hi = fa_row_keys(p, b, i0).hi;
    return r;
}

/* Whether some block-mask block covering the tile [i0, i0 + rows) x [j0, j0 + cols) is set (set
 * true) or clear (set false). Every thread computes the same answer, so it can guard a barrier. */
__device__ __forceinline__ bool fa_block_mask_has(const fa_gpu_params &p, int64_t i0, int64_t rows, int64_t j0,
                                                  int64_t cols, bool set)
{
    const int64_t r0 = i0 / p.mask.block_mask.block_q, r1 = (i0 + rows - 1) / p.mask.block_mask.block_q;
    const int64_t c0 = j0 / p.mask.block_mask.block_k, c1 = (j0 + cols - 1) / p.mask.block_mask.block_k;
    for (int64_t r = r0; r <= r1; ++r)
        for (int64_t c = c0; c <= c1; ++c)
            if ((p.mask.block_mask.mask[r * p.mask.block_mask.cols + c] != 0) == set) return true;
    return false;
}

/* Whether the block mask leaves any element of the tile (Algorithm 5 skips the tile otherwise). */
__device__ __forceinline__ bool fa_block_mask_any(const fa_gpu_params &p, int64_t i0, int64_t rows, int64_t j0,
                                                  int64_t cols)
{
    return !p.mask.block_mask.mask || fa_block_mask_has(p, i0, rows, j0, cols, true);
}

/* Whether the block mask leaves every element of the tile (no element needs the mask). */
__device__ __forceinline__ bool fa_block_mask_all(const fa_gpu_params &p, int64_t i0, int64_t rows, int64_t j0,
                                                  int64_t cols)
{
    return !p.mask.block_mask.mask || !fa_block_mask_has(p, i0, rows, j0, cols, false);
}

/* Whether every element of the tile [i0, i0 + rows) x [j0, j0 + width) is visible, so no element
 * mask is needed: the whole tile width (zero-filled keys of a partial tile must not count) lies in
 * `common` (fa_tile_common_keys of those rows) and the block mask sets its first `cols` keys. */
__device__ __forceinline__ bool fa_tile_all_visible(const fa_gpu_params &p, fa_key_range common, int64_t i0, int64_t rows,
                                                    int64_t j0, int64_t width, int64_t cols)
{
    return j0 >= common.lo && j0 + width <= common.hi && fa_block_mask_all(p, i0, rows, j0, cols);
}

__device__ __forceinline__ bool fa_element_visible(const fa_gpu_params &p, fa_key_range range, int64_t i, int64_t j)
{
    if (j < range.lo || j >= range.hi) return false;
    return !p.mask.block_mask.mask || p.mask.block_mask.mask[(i / p.mask.block_mask.block_q) * p.mask.block_mask.cols + j / p.mask.block_mask.block_k] != 0;
}

/* The shared Philox stream's element index of (b, h, i, j): the dense layout's, a block's global
 * element (block positions), or for a packed batch the padded layout's (sequence b, rows of
 * max_seqlen_q x max_seqlen_k). */
__device__ __forceinline__ uint64_t fa_element_of(const fa_gpu_params &p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    return fa_dropout_element(static_cast<uint64_t>(b), static_cast<uint64_t>(p.shape.heads_q), static_cast<uint64_t>(h),
                              static_cast<uint64_t>(p.dropout.rows), static_cast<uint64_t>(p.dropout.row0 + i),
                              static_cast<uint64_t>(p.dropout.cols), static_cast<uint64_t>(p.dropout.col0 + j));
}

/* The shared Philox dropout stream (src/common/philox.h): element (b, h, i, j). */
__device__ __forceinline__ bool fa_dropout_kept(const fa_gpu_params &p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    return fa_dropout_keep(p.dropout.seed, p.dropout.offset, fa_element_of(p, b, h, i, j), p.dropout.p) != 0;
}

/* Where row i of (b, h) sits in lse and delta. */
__device__ __forceinline__ int64_t fa_stat_index(const fa_gpu_params &p, int64_t b, int64_t h, int64_t i)
{
    return b * p.outputs.lse_stride_batch + h * p.outputs.lse_stride_head + i;
}

/* Rows s0.. of every head of t as a tensor of their own, whatever batch index is used. */
__device__ __forceinline__ fa_gpu_tensor fa_rows_from(fa_gpu_tensor t, int64_t s0, fa_dtype dtype)
{
    if (t.data) t.data = static_cast<char *>(t.data) + s0 * t.stride_seq * (dtype == FA_DTYPE_F32 ? 4 : 2);
    t.stride_batch = 0;
    return t;
}

/* 1 once a device-side check failed (until the next synchronize reports it): kernels write nothing. */
__device__ __forceinline__ bool fa_gpu_failed(const fa_gpu_params &p) { return p.status->code != FA_TABLE_OK; }

/* The problem a block works on. A packed varlen call: sequence b (blockIdx.z) as a dense problem
 * over its rows, so the kernels run unchanged with b as the batch index (tensor batch strides 0,
 * lse and delta from the sequence's first row, dropout in the padded layout). Dense calls:
 * unchanged. After a failed device-side check the problem is empty: the block writes nothing. */
__device__ __forceinline__ fa_gpu_params fa_sequence_params(const fa_gpu_params &in, int64_t b)
{
    fa_gpu_params p = in;
    if (fa_gpu_failed(in)) {
        p.shape.seqlen_q = p.shape.seqlen_k = 0;
        return p;
    }
    if (!in.varlen.cu_seqlens_q) return p;
    const int64_t q0 = in.varlen.cu_seqlens_q[b], k0 = in.varlen.cu_seqlens_k[b];
    p.shape.seqlen_q = in.varlen.cu_seqlens_q[b + 1] - q0;
    p.shape.seqlen_k = in.varlen.cu_seqlens_k[b + 1] - k0;
    p.mask.diag_offset = p.shape.seqlen_k - p.shape.seqlen_q; /* bottom-right within the sequence */
    p.q = fa_rows_from(in.q, q0, in.shape.dtype);
    p.out = fa_rows_from(in.out, q0, in.shape.dtype);
    p.dout = fa_rows_from(in.dout, q0, in.shape.dtype);
    p.dq = fa_rows_from(in.dq, q0, in.shape.dtype);
    p.k = fa_rows_from(in.k, k0, in.shape.dtype);
    p.v = fa_rows_from(in.v, k0, in.shape.dtype);
    p.dk = fa_rows_from(in.dk, k0, in.shape.dtype);
    p.dv = fa_rows_from(in.dv, k0, in.shape.dtype);
    if (p.outputs.lse) p.outputs.lse += q0;
    if (p.delta) p.delta += q0;
    return p;
}
#endif

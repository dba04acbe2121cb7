/* Host-side planning of the tile-MMA forward (kernels/attention_tc.cuh): which kernel family the
 * environment selects, the padded head dim and tile a problem runs with, its shared memory, and
 * whether tiles can be copied in 16-byte chunks. Header-only C, tested on the CPU
 * (tests/gpu/test_tc_layout.c). */
#ifndef FA_GPU_TC_PLAN_H
#define FA_GPU_TC_PLAN_H
#include <stdint.h>
#include <string.h>

#include "../common/hostdev.h"
#include "../common/problem.h"

/* Warps per block; each owns FA_TC_WARP_ROWS query rows, so a block owns FA_TC_BLOCK_ROWS. */
#define FA_TC_WARPS 4
#define FA_TC_WARP_ROWS 16
#define FA_TC_BLOCK_ROWS (FA_TC_WARPS * FA_TC_WARP_ROWS)
/* 16-bit elements per 16-byte chunk: the unit of cp.async, ldmatrix rows and the swizzle. */
#define FA_TC_CHUNK 8

/* Which kernels a context runs for f16/bf16 (environment variable FLASHATTN_GPU_KERNELS).
 * GENERIC: the CUDA-core kernels of attention_generic.cuh (f32 always runs them).
 * TC: the tile-MMA kernels on the architecture's matrix instructions (mma.sync on NVIDIA).
 * FMA: the same tile kernels on the plain-FMA tile layer (the AMD RDNA path, also built for CUDA).
 * TC_WIDE ("tc-wide", NVIDIA only): TC, except that the forward and backward of a plain problem
 * (fa_tc_wide_takes) run the wide-tile kernels of nvidia/attention_tc_wide.cuh and
 * attention_tc_wide_backward.cuh. Opt-in until a GPU run shows them faster. */
typedef enum fa_gpu_family {
    FA_GPU_FAMILY_GENERIC,
    FA_GPU_FAMILY_TC,
    FA_GPU_FAMILY_FMA,
    FA_GPU_FAMILY_TC_WIDE,
    FA_GPU_FAMILY_INVALID
} fa_gpu_family;

/* The family a vendor runs when the variable is unset: TC on NVIDIA, where the tile-MMA kernels
 * passed every GPU test, the sanitizers and the repeat test on an H200 (2026-11-24) and run 10-17x
 * the generic ones; GENERIC on AMD, where no tile layer has run on hardware. */
#define FA_GPU_DEFAULT_FAMILY_CUDA FA_GPU_FAMILY_TC
#define FA_GPU_DEFAULT_FAMILY_HIP FA_GPU_FAMILY_GENERIC

/* NULL or "" (variable unset or empty) gives `unset`, the vendor's default. */
static inline fa_gpu_family fa_gpu_parse_family(const char *value, fa_gpu_family unset)
{
    if (!value || !*value) return unset;
    if (strcmp(value, "generic") == 0) return FA_GPU_FAMILY_GENERIC;
    if (strcmp(value, "tc") == 0) return FA_GPU_FAMILY_TC;
    if (strcmp(value, "fma") == 0) return FA_GPU_FAMILY_FMA;
    if (strcmp(value, "tc-wide") == 0) return FA_GPU_FAMILY_TC_WIDE;
    return FA_GPU_FAMILY_INVALID;
}

static inline const char *fa_gpu_family_name(fa_gpu_family family)
{
    switch (family) {
    case FA_GPU_FAMILY_GENERIC: return "generic";
    case FA_GPU_FAMILY_TC: return "tc";
    case FA_GPU_FAMILY_FMA: return "fma";
    case FA_GPU_FAMILY_TC_WIDE: return "tc-wide";
    default: return "invalid";
    }
}

/* Head dims are zero-padded to the next instantiated width (a multiple of 64, so that a row has a
 * multiple of 8 chunks for the swizzle): 64, 128 or 256; 0 beyond 256 or for d <= 0. */
FA_HD int fa_tc_padded_dim(int64_t head_dim)
{
    if (head_dim <= 0) return 0;
    if (head_dim <= 64) return 64;
    if (head_dim <= 128) return 128;
    if (head_dim <= 256) return 256;
    return 0;
}

/* Keys per tile: 64, or 32 at width 256 (keeps the S and O fragments in registers). */
#define FA_TC_BLOCK_COLS(padded_dim) ((padded_dim) >= 256 ? 32 : 64)
FA_HD int fa_tc_block_cols(int padded_dim) { return FA_TC_BLOCK_COLS(padded_dim); }

/* Dynamic shared memory: Q (BLOCK_ROWS rows), K and V (block_cols rows each), 16-bit elements. */
FA_HD int64_t fa_tc_smem_bytes(int padded_dim)
{
    return 2 * (int64_t)padded_dim * (FA_TC_BLOCK_ROWS + 2 * fa_tc_block_cols(padded_dim));
}

/* The backward kernels (attention_tc_backward.cuh) run widths up to 128 (dK, dV and dQ stay in
 * registers); wider head dims use the generic backward. The dK/dV kernel owns FA_TC_BLOCK_ROWS keys
 * and streams query tiles of FA_TC_BACKWARD_QUERY_TILE rows; the dQ kernel owns FA_TC_BLOCK_ROWS
 * queries and streams key tiles of that many keys. */
#define FA_TC_BACKWARD_MAX_WIDTH 128
#define FA_TC_BACKWARD_QUERY_TILE 32

/* Dynamic shared memory of the backward kernels (the larger of the two, dK/dV): K and V (or Q
 * and dO) of FA_TC_BLOCK_ROWS rows, the streamed pair of tiles, lse and D of a query tile. */
FA_HD int64_t fa_tc_backward_smem_bytes(int padded_dim)
{
    return 2 * (int64_t)padded_dim * (2 * FA_TC_BLOCK_ROWS + 2 * FA_TC_BACKWARD_QUERY_TILE) +
           2 * (int64_t)sizeof(float) * FA_TC_BACKWARD_QUERY_TILE;
}

/* Whether every row of a 16-bit tensor starts on a 16-byte boundary and a row is whole chunks:
 * then tiles move in 16-byte chunks (cp.async on NVIDIA); otherwise element by element. */
FA_HD int fa_tc_chunk_aligned(const void *data, int64_t head_dim, int64_t stride_batch, int64_t stride_seq,
                              int64_t stride_head)
{
    return (uintptr_t)data % 16 == 0 && head_dim % FA_TC_CHUNK == 0 && stride_batch % FA_TC_CHUNK == 0 &&
           stride_seq % FA_TC_CHUNK == 0 && stride_head % FA_TC_CHUNK == 0;
}

/* The wide-tile forward (nvidia/attention_tc_wide.cuh): FA_TC_WIDE_WARPS warps of
 * FA_TC_WIDE_WARP_ROWS query rows (two m16 row groups, so that each K and V fragment read from
 * shared memory feeds two products), key tiles of FA_TC_WIDE_BLOCK_COLS(width), widths 64 and 128. */
#define FA_TC_WIDE_WARPS 4
#define FA_TC_WIDE_WARP_ROWS 32
#define FA_TC_WIDE_BLOCK_ROWS (FA_TC_WIDE_WARPS * FA_TC_WIDE_WARP_ROWS)
#define FA_TC_WIDE_MAX_WIDTH 128
/* Key and row indices inside a sequence are 32-bit (a tile past the last key included). */
#define FA_TC_WIDE_MAX_SEQLEN (INT32_MAX - 1024)
/* 128 keys at width 64, 64 at width 128: either way a warp holds 2 x 32 x 64 f32 of S and O. */
#define FA_TC_WIDE_BLOCK_COLS(padded_dim) ((padded_dim) <= 64 ? 128 : 64)

/* Dynamic shared memory: Q (FA_TC_WIDE_BLOCK_ROWS rows, reused for the output), K and V tiles. */
FA_HD int64_t fa_tc_wide_smem_bytes(int padded_dim)
{
    return 2 * (int64_t)padded_dim * (FA_TC_WIDE_BLOCK_ROWS + 2 * FA_TC_WIDE_BLOCK_COLS(padded_dim));
}

/* The wide-tile backward (nvidia/attention_tc_wide_backward.cuh): FA_TC_WIDE_BWD_WARPS warps of 16
 * keys each own a block of FA_TC_WIDE_BWD_KEYS keys and stream query tiles of
 * FA_TC_WIDE_BWD_QUERY_TILE rows (double-buffered); widths 64 and 128. */
#define FA_TC_WIDE_BWD_WARPS 8
#define FA_TC_WIDE_BWD_KEYS (16 * FA_TC_WIDE_BWD_WARPS)
#define FA_TC_WIDE_BWD_QUERY_TILE 64

/* Dynamic shared memory of the wide-tile backward: K and V of the key block, two buffers of Q and
 * dO query tiles, dS^T (keys x query tile), 16-bit; two buffers of lse and D per query row, f32. */
FA_HD int64_t fa_tc_wide_backward_smem_bytes(int padded_dim)
{
    return 2 * ((int64_t)padded_dim * (2 * FA_TC_WIDE_BWD_KEYS + 4 * FA_TC_WIDE_BWD_QUERY_TILE) +
                (int64_t)FA_TC_WIDE_BWD_KEYS * FA_TC_WIDE_BWD_QUERY_TILE) +
           4 * (int64_t)sizeof(float) * FA_TC_WIDE_BWD_QUERY_TILE;
}

/* Blocks per (kv head, sequence) of the wide-tile backward, each with its own f32 dQ slice of
 * `slice_bytes` in the workspace: enough blocks to give every multiprocessor two
 * (2 sms / (batch heads_kv), rounded up), at most one per key block, and at most as many as keep
 * the slices within 256 MiB (one slice always: the workspace is then twice an f32 dQ). */
static inline int64_t fa_tc_wide_backward_splits(int64_t sms, int64_t batch_heads_kv, int64_t key_blocks, int64_t slice_bytes)
{
    int64_t splits = batch_heads_kv > 0 ? (2 * sms + batch_heads_kv - 1) / batch_heads_kv : 1;
    if (splits > key_blocks) splits = key_blocks;
    const int64_t cap = slice_bytes > 0 ? ((int64_t)256 << 20) / slice_bytes : splits;
    if (splits > cap) splits = cap;
    return splits < 1 ? 1 : splits;
}

/* Whether the wide-tile forward computes problem p: a plain problem (no score modifier or sink, no
 * dropout, no block mask; causal, windows, key padding and packed batches are fine), a positive
 * scale (the row max is kept on unscaled scores), f16/bf16, width 64 or 128, sequences short
 * enough for 32-bit key indices, and Q, K, V and O in whole aligned 16-byte chunks
 * (`chunk_aligned`, fa_tc_chunk_aligned of each). Anything else runs the tc forward. */
static inline int fa_tc_wide_takes(const fa_problem *p, int chunk_aligned)
{
    const int width = fa_tc_padded_dim(p->shape.head_dim);
    return (p->shape.dtype == FA_DTYPE_F16 || p->shape.dtype == FA_DTYPE_BF16) && width > 0 &&
           width <= FA_TC_WIDE_MAX_WIDTH && p->shape.scale > 0.0f && !fa_modifiers_any(&p->modifiers) &&
           p->dropout.p == 0.0f && !fa_mask_has_block_mask(&p->mask) && p->shape.seqlen_q <= FA_TC_WIDE_MAX_SEQLEN &&
           p->shape.seqlen_k <= FA_TC_WIDE_MAX_SEQLEN && chunk_aligned;
}
#endif

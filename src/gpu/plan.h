/* Host-side planning of the GPU kernels: which instantiated kernel shape serves a head dim, and
 * which tile it runs, derived from the device's on-chip memory through the common tiling logic
 * (src/common/tiling.h) and snapped to the shapes the plugin instantiates. Header-only C so that
 * tests/gpu checks it on the CPU with the on-chip sizes of real GPUs. */
#ifndef FA_GPU_PLAN_H
#define FA_GPU_PLAN_H
#include <stdint.h>

#include "../common/tiling.h"

/* Warps per thread block of the generic (CUDA-core) kernels; a block owns one tile of rows and
 * each warp owns tile / FA_GENERIC_WARPS of them. */
#define FA_GENERIC_WARPS 4
/* Largest head dim served. */
#define FA_GPU_MAX_HEAD_DIM 256

typedef enum fa_gpu_pass { FA_GPU_PASS_FORWARD, FA_GPU_PASS_BACKWARD } fa_gpu_pass;

/* Register capacity (head-dim bucket) a head dim runs in: 64, 128 or 256; 0 if unsupported. */
FA_HD int fa_gpu_head_bucket(int64_t head_dim)
{
    if (head_dim <= 0) return 0;
    if (head_dim <= 64) return 64;
    if (head_dim <= 128) return 128;
    if (head_dim <= FA_GPU_MAX_HEAD_DIM) return 256;
    return 0;
}

/* The tiles instantiated per bucket, largest first (kept in step with the dispatch table in
 * generic_dispatch.cuh; the plan test checks each entry). */
FA_HD int fa_gpu_tile_options(int bucket, int options[3])
{
    if (bucket == 256) { options[0] = 32; options[1] = 16; options[2] = 8; return 3; }
    if (bucket == 64 || bucket == 128) { options[0] = 64; options[1] = 32; options[2] = 16; return 3; }
    return 0;
}

/* Row stride (floats) of a shared-memory tile: odd, so the lanes of a warp reading one column of
 * consecutive rows hit distinct banks. */
FA_HD int64_t fa_gpu_smem_ld(int64_t head_dim) { return head_dim % 2 == 0 ? head_dim + 1 : head_dim; }

/* Dynamic shared memory (bytes) of the generic kernels for a square tile of `tile` rows:
 * forward and dQ keep Q (and dO), K, V tiles plus one row of probabilities per warp;
 * dK/dV keeps K, V, Q, dO tiles, two rows per warp and lse/D of the query tile. */
FA_HD int64_t fa_gpu_generic_smem_bytes(fa_gpu_pass pass, int64_t tile, int64_t head_dim)
{
    const int64_t ld = fa_gpu_smem_ld(head_dim);
    if (pass == FA_GPU_PASS_FORWARD) return (int64_t)sizeof(float) * (3 * tile * ld + FA_GENERIC_WARPS * tile);
    return (int64_t)sizeof(float) * (4 * tile * ld + 2 * FA_GENERIC_WARPS * tile + 2 * tile);
}

/* The tile (rows = cols) of the generic kernels for this pass on a device with smem_bytes of
 * shared memory per block: the paper's Br, Bc for M = smem_bytes / 4 (f32 tiles), snapped down to
 * the largest instantiated tile not above min(Br, Bc) whose footprint fits; when every
 * instantiated tile is above the paper's value, the smallest that fits; 0 when none fits or the
 * head dim is unsupported. */
FA_HD int fa_gpu_generic_tile(fa_gpu_pass pass, int64_t smem_bytes, int64_t head_dim)
{
    const int bucket = fa_gpu_head_bucket(head_dim);
    int options[3];
    const int n = fa_gpu_tile_options(bucket, options);
    if (n == 0 || smem_bytes <= 0) return 0;
    int64_t br, bc;
    fa_fit_tiles(smem_bytes / (int64_t)sizeof(float), head_dim, 8, 8, &br, &bc);
    const int64_t paper = br < bc ? br : bc;
    int fallback = 0;
    for (int i = 0; i < n; ++i) {
        if (fa_gpu_generic_smem_bytes(pass, options[i], head_dim) > smem_bytes) continue;
        if (options[i] <= paper) return options[i];
        fallback = options[i]; /* options shrink: ends at the smallest that fits */
    }
    return fallback;
}

/* Number of tiles of `tile` rows covering n. */
FA_HD int64_t fa_gpu_tiles(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }
#endif

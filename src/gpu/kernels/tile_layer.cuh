/* The per-architecture tile layer of the tile-MMA forward (attention_tc.cuh is written once over
 * it). A layer L is a struct with:
 *   kWarp               lanes per warp it is written for
 *   acc<N>              a warp's 16 x N f32 accumulator, member float v[L::items(N)]
 *   items(N)            accumulator items per lane
 *   kSlots              rows of the 16 a lane holds items of (1 or 2)
 *   item_slot(item)     which of them item belongs to
 *   slot_row(lane, s)   the row (0..15) of slot s
 *   item_col(lane, it)  the column of item it
 *   row_max(x), row_sum(x)  reductions over the lanes that share a row
 *   row_leader(lane)    one lane per row (writes the row's lse)
 *   qk<W, BC>(s, sq, row0, sk)  s = Q[row0..row0+16) K^T: swizzled tiles of width W (tc_layout.h)
 *   pv<BC, W>(o, p, sv)         o += P V with P the 16 x BC accumulator p (probabilities)
 * Layers: mma_sync_layer (tile_mma_sync.cuh, NVIDIA tensor cores), fma_layer (tile_fma.cuh, plain
 * FMA, every target). An MFMA layer for CDNA fits the same contract (its qk may compute S^T
 * internally so that P is in the B layout of the PV product). */
#ifndef FA_GPU_TILE_LAYER_CUH
#define FA_GPU_TILE_LAYER_CUH
#include <stdint.h>

#include "../gpu_runtime.h"
#include "flashattn.h"

namespace fa_tc {

/* A 16-bit element of dtype DT (F16 or BF16) as f32. */
template <fa_dtype DT>
__device__ __forceinline__ float to_float(uint16_t bits)
{
    if (DT == FA_DTYPE_F16) return __half2float(__ushort_as_half(bits));
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

} // namespace fa_tc
#endif

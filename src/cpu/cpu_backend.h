/* State and entry points of the CPU backend. */
#ifndef FA_CPU_BACKEND_H
#define FA_CPU_BACKEND_H
#include "../common/backend.h"
#include "cpu_caches.h"
#include "kernels/kernels.h"

typedef struct fa_cpu_state {
    int num_threads; /* 0 = OpenMP default */
    const fa_cpu_kernels *kernels;
    fa_cpu_caches caches;
    char info[256];
} fa_cpu_state;

/* The on-chip memory M the tiles are cut for: a core's L2, at most this many bytes. */
#define FA_CPU_TILE_BYTES_MAX ((int64_t)1 << 20)

/* Tests and fuzzing: cut the tiles for an on-chip memory of this many bytes instead of the L2, so
 * that small problems span many tiles (0 restores the caches' size; any size gives correct
 * results, only the speed changes). Process-wide; set it while no call runs. Returns the previous
 * value. */
int64_t fa_cpu_debug_tile_bytes(int64_t bytes);

/* Br, Bc for this head_dim: the paper's formula with M = the L2 size (at most
 * FA_CPU_TILE_BYTES_MAX) in f32 elements (tiles are held in f32 whatever the input dtype),
 * snapped to the kernels' register tile. */
void fa_cpu_tiles(const fa_cpu_state *s, int64_t head_dim, int64_t *block_rows, int64_t *block_cols,
                  int64_t *sram_elements);

/* The tiles of one problem: fa_cpu_tiles, snapped to the block mask's blocks when it has one. */
void fa_cpu_problem_tiles(const fa_cpu_state *s, const fa_problem *p, int64_t *block_rows, int64_t *block_cols);

/* Where a query tile's walk over key tiles starts: its first visible key, or with a block mask
 * the start of that key's tile, so that key tiles line up with mask blocks. */
static inline int64_t fa_cpu_first_key(const fa_problem *p, int64_t key_lo, int64_t block_cols)
{
    return fa_mask_has_block_mask(&p->mask) ? key_lo / block_cols * block_cols : key_lo;
}

/* The algorithms, each for one kind of problem; the backend's entry points (cpu_backend.c) pick
 * one per call, and none calls another's entry point. */
/* Algorithms 1/2 and 4 on a dense problem (no varlen), dsinks excluded (fa_cpu_sink_gradients). */
fa_status fa_cpu_forward_dense(void *state, const fa_problem *p);
fa_status fa_cpu_backward_dense(void *state, const fa_problem *p);
/* A packed variable-length problem (p->varlen.batch > 0), one dense sequence at a time
 * (cpu_varlen.c). */
fa_status fa_cpu_varlen_run(void *state, const fa_problem *p, int backward);
/* fa_forward_kvcache without score modifiers: append, then split-KV decode (cpu_decode.c). */
fa_status fa_cpu_decode(void *state, const fa_kv_problem *p);
/* fa_forward_kvcache with score modifiers: per sequence through the dense forward on its gathered
 * keys (cpu_kvcache_modifiers.c). */
fa_status fa_cpu_decode_modified(void *state, const fa_kv_problem *kp);
/* Where key j of sequence b (cache position cache_leftpad[b] + j) lives in the cache tensors (slot
 * or page, row), row (b, key j, head h) of a cache tensor, the append of k_new/v_new at
 * cache_seqlens[b] (rotated, and quantised for an int8 or FP8 cache) (cpu_kvcache.c). */
void fa_cpu_kvcache_slot(const fa_kv_problem *kp, int64_t b, int64_t j, int64_t *slot_b, int64_t *slot_s);
const void *fa_cpu_kvcache_row(const fa_kv_problem *kp, const fa_tensor *cache, int64_t b, int64_t j, int64_t h);
fa_status fa_cpu_kvcache_append(const fa_kv_problem *kp); /* fails (out of memory) before writing anything */
/* Key j of sequence b, kv head h of a cache tensor as f32 values (its codes dequantised), and new
 * token t as the append stores it (rotated when asked, rounded or quantised) read back the same
 * way, without writing the cache (tmp: d * 4 bytes of scratch). */
void fa_cpu_kvcache_cached_values(const fa_kv_problem *kp, const fa_tensor *cache, const float *scales,
                                  const float *descales, int64_t b, int64_t j, int64_t h, float *row);
void fa_cpu_kvcache_new_values(const fa_kv_problem *kp, const fa_tensor *cache, const float *descales,
                               const fa_tensor *fresh, int rotated, int64_t b, int64_t t, int64_t h, float *row,
                               void *tmp);
/* Query i of sequence b (row: its f32 values) rotated to its position and rounded to q's dtype. */
void fa_cpu_rotate_query(const fa_kv_problem *kp, int64_t b, int64_t i, float *row);

#endif

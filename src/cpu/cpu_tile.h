/* Tile plumbing shared by the CPU algorithms, one job per file: rows between tensors (any dtype,
 * any strides) and f32 tiles (cpu_rows.c), the visibility and masks of a (query tile, key tile)
 * pair (cpu_visibility.c), dropout (cpu_dropout.c), the online-softmax step (cpu_softmax.c) and
 * thread helpers (cpu_threads.c). */
#ifndef FA_CPU_TILE_H
#define FA_CPU_TILE_H
#include <math.h>
#include <stdint.h>

#include "../common/backend.h"
#include "../common/dtype.h"
#include "../common/half.h"
#include "../common/philox.h"
#include "../common/visibility.h"
#include "kernels/kernels.h"

/* Address of row (b, s, h) of a tensor with explicit strides. */
static inline void *fa_row_ptr(const fa_tensor *t, int64_t b, int64_t s, int64_t h)
{
    const int64_t offset = b * t->stride_batch + s * t->stride_seq + h * t->stride_head;
    return (char *)t->data + offset * (int64_t)fa_dtype_size(t->dtype);
}

/* Where row i of (b, h) sits in p->lse. */
static inline int64_t fa_lse_index(const fa_problem *p, int64_t b, int64_t h, int64_t i)
{
    return b * p->outputs.lse_stride_batch + h * p->outputs.lse_stride_head + i;
}

/* dst[r * ld + c] = tensor[b, s0 + r, h, c] for r < rows, c < head_dim, converted to f32. */
void fa_cpu_load_rows(const fa_tensor *t, int64_t b, int64_t s0, int64_t h, int64_t rows, float *dst, int64_t ld);
/* dst[c * ld + r] = tensor[b, s0 + r, h, c] (the transposed tile, packed once per query tile). */
void fa_cpu_load_transposed(const fa_tensor *t, const fa_cpu_kernels *kern, int64_t b, int64_t s0, int64_t h,
                            int64_t rows, float *dst, int64_t ld);
/* Rows s0 .. s0 + rows of (b, h) as an f32 matrix: in place (no copy) for f32 tensors, else
 * converted into scratch (ld = head_dim). Returns the matrix and sets *ld. */
const float *fa_cpu_view_rows(const fa_tensor *t, const fa_cpu_kernels *kern, int64_t b, int64_t s0, int64_t h,
                              int64_t rows, float *scratch, int64_t *ld);
/* Called once per row r of a walk over rows s0 .. s0 + rows of (b, h): asks for the row
 * FA_CPU_PREFETCH_ROWS ahead to be brought into the caches (software prefetch). Rows of
 * interleaved heads lie apart, often a row or two per 4 KiB page, where the hardware prefetchers
 * stop, and a row read without it waited on memory (the strided K/V copy: 9% of a forward at
 * N = 4096, d = 64, 8 heads, perf). */
enum { FA_CPU_PREFETCH_ROWS = 16 };
static inline void fa_cpu_prefetch_ahead(const fa_tensor *t, int64_t b, int64_t s0, int64_t h, int64_t r, int64_t rows)
{
    enum { LINE = 64 };
    if (r + FA_CPU_PREFETCH_ROWS >= rows) return;
    const int64_t row_bytes = t->head_dim * (int64_t)fa_dtype_size(t->dtype);
    const char *row = fa_row_ptr(t, b, s0 + r + FA_CPU_PREFETCH_ROWS, h);
    for (int64_t off = 0; off < row_bytes; off += LINE) __builtin_prefetch(row + off);
}
/* tensor[b, s0 + r, h, c] = src[r * ld + c], converted from f32. */
void fa_cpu_store_rows(const fa_tensor *t, const fa_cpu_kernels *kern, int64_t b, int64_t s0, int64_t h,
                       int64_t rows, const float *src, int64_t ld);

/* 1 when S^T = K Q^T of this problem is taken on bf16 pairs by the kernels' gemm_max_bf16 (q and
 * k bf16, and a CPU with the kernel), in the forward and the backward alike, so that the backward
 * recomputes the forward's P; else the f32 product on widened tiles. */
static inline int fa_cpu_bf16_scores(const fa_problem *p, const fa_cpu_kernels *kern)
{
    return kern->gemm_max_bf16 && p->q.dtype == FA_DTYPE_BF16 && p->k.dtype == FA_DTYPE_BF16;
}
/* Words of gemm_max_bf16's B for a packed Q^T of head_dim rows and row stride ld. */
static inline int64_t fa_cpu_bf16_pairs_words(int64_t head_dim, int64_t ld) { return (head_dim + 1) / 2 * ld; }
/* pairs[(c / 2) * ld + r] = bf16 qt[c * ld + r] (low half) and qt[(c + 1) * ld + r] (high half, 0
 * for c + 1 = head_dim), c even, r < rows: a Q^T widened from bf16 (exact, so its top halves are
 * the input's bits) repacked for gemm_max_bf16, no rounding. */
void fa_cpu_pack_bf16_pairs(const float *qt, int64_t ld, int64_t rows, int64_t head_dim, uint32_t *pairs);
/* The same pairs straight from a bf16 tensor's rows s0 .. s0 + rows of (b, h), without the f32
 * Q^T: the word at element c (even) of a row holds elements c (low half) and c + 1 (high half),
 * so the pairs are the rows' 32-bit words transposed (one kern->transpose, which only moves bits;
 * an odd head_dim's last column is moved alone, its high half 0). Returns 0 (nothing written)
 * where the rows' words are not 4-byte aligned (an odd address or row stride): then the caller
 * packs from the widened Q^T. */
int fa_cpu_load_bf16_pairs(const fa_tensor *t, const fa_cpu_kernels *kern, int64_t b, int64_t s0, int64_t h,
                           int64_t rows, uint32_t *pairs, int64_t ld);

/* Per query row of a tile: the visible key range (causal, window, padding). */
typedef struct fa_cpu_rows {
    int64_t i0, count;         /* first query row and number of rows */
    fa_key_range *range;       /* [count] */
    int64_t key_lo, key_hi;    /* union of the ranges (empty when key_hi <= key_lo) */
} fa_cpu_rows;

void fa_cpu_rows_init(const fa_problem *p, int64_t b, int64_t i0, int64_t count, fa_key_range *storage,
                      fa_cpu_rows *rows);

/* The keys every row of `rows` sees (a block mask aside): the intersection [*lo, *hi) of their
 * ranges, within [*lo, *hi) as given (empty when *hi <= *lo). On a causal or window diagonal it
 * is all of a tile but a band of about rows->count keys. */
static inline void fa_cpu_rows_shared_keys(const fa_cpu_rows *rows, int64_t *lo, int64_t *hi)
{
    for (int64_t r = 0; r < rows->count; ++r) {
        if (rows->range[r].lo > *lo) *lo = rows->range[r].lo;
        if (rows->range[r].hi < *hi) *hi = rows->range[r].hi;
    }
}

typedef enum fa_tile_visibility { FA_TILE_EMPTY, FA_TILE_PARTIAL, FA_TILE_FULL } fa_tile_visibility;

/* Whether any (FULL: every) element of rows x keys [j0, j0 + cols) is visible, block mask included. */
fa_tile_visibility fa_cpu_tile_visibility(const fa_problem *p, const fa_cpu_rows *rows, int64_t j0, int64_t cols);

/* Score tiles are stored transposed: element (query r, key c) at st[c * ld + r]. */

/* The row stride of the key-major tiles of Br query columns (S^T, dS^T, the packed Q^T and dO^T):
 * Br floats, and one cache line more when Br is a multiple of 128. Rows of Br = 128 floats are
 * 512 bytes apart and fall into an eighth of the L1 sets, so the column panel of Q^T (or dO^T) that S^T = K Q^T reuses for
 * every register tile of keys (d x 2W floats: 8 KiB for AVX2 at d = 128) did not stay in L1 and
 * came from L2 on every tile; one line more per row spreads the rows over all the sets.
 * Measured (checkasm --bench, gemm_max at d = 128, Br 128, Bc 512, Zen 4): AVX2 0.89-0.91 ->
 * 0.98 of the peak, AVX-512 0.94 either way; whole forwards showed no change beyond the noise
 * (bench/results/cpu-tile-stride-2026-11-24.md). Shorter rows (Br = 64, d = 64) already spread
 * over enough sets and stay as they were. Layout only: the arithmetic and its bits are unchanged. */
static inline int64_t fa_cpu_tile_ld(int64_t block_rows)
{
    return block_rows % 128 == 0 ? block_rows + 16 : block_rows;
}

/* Masked elements (PARTIAL tiles) set to -inf; visible ones multiplied by the scale unless
 * fold_scale (then the exponential applies it: exp(scale * s - m) with m in scaled units, or the
 * score modifiers do, fa_cpu_modify_scores). */
void fa_cpu_scale_mask(const fa_problem *p, const fa_cpu_rows *rows, int64_t j0, int64_t cols,
                       fa_tile_visibility vis, int fold_scale, float *st, int64_t ld);

/* Dropout on a tile of probabilities of (b, h): element *= keep ? 1/(1-p) : 0. */
void fa_cpu_apply_dropout(const fa_problem *p, int64_t b, int64_t h, const fa_cpu_rows *rows, int64_t j0,
                          int64_t cols, float *st, int64_t ld);

/* Online-softmax step for one key tile whose raw scores are in st (cols x rows, transposed): new
 * running max m, the shift for the exponential (st becomes P), the rescale factor alpha of the
 * accumulated output, and the running sum l. scale_in_exp multiplies scores inside the exp. */
void fa_cpu_softmax_step(const fa_cpu_kernels *kern, float scale_in_exp, int64_t rows, int64_t cols, float *st,
                         int64_t ld, float *m, float *l, float *tile_max, float *shift, float *alpha, float *tile_sum);
/* The same step with tile_max (the raw scores' per-query max) already computed, by gemm_max. */
void fa_cpu_softmax_step_given_max(const fa_cpu_kernels *kern, float scale_in_exp, int64_t rows, int64_t cols,
                                   float *st, int64_t ld, float *m, float *l, const float *tile_max, float *shift,
                                   float *alpha, float *tile_sum);

/* OpenMP-agnostic helpers. */
int fa_cpu_thread_count(int requested);
int fa_cpu_thread_num(void); /* this thread's number in its team (0 outside a parallel region) */
#endif

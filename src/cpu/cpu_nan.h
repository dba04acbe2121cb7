/* NaN inputs on the CPU forward. The kernels' max and exponential clamp NaN away (x86 max returns
 * its second operand when one is NaN; exp clamps its argument), so a NaN score would vanish
 * silently. Each tile is checked where the forward has it in cache anyway: a query tile's rows
 * in its packed Q^T, a key tile's K_j and V_j once loaded (f16/bf16 widened: NaN stays NaN). Only
 * a tile that holds a NaN then pays for the per-row work, so NaN-free calls pay one read of
 * their tiles, inside the tasks (no pass of its own that every thread must join first).
 *
 * The forward meets the rule at four points, each one call here: a query tile starts
 * (fa_cpu_nan_rows_begin), a key tile is loaded (fa_cpu_nan_tile_begin, and fa_cpu_nan_values
 * for the V that P multiplies), a step has updated O (fa_cpu_nan_step), a row ends
 * (fa_cpu_nan_row_end). A row's poison flag is 1 when its output must be NaN. */
#ifndef FA_CPU_NAN_H
#define FA_CPU_NAN_H
#include <math.h>
#include <stdint.h>

#include "../common/backend.h"
#include "cpu_tile.h"

/* A query tile's rows from its packed Q^T (qt[c * ld + r], head_dim columns): poison[r] = 1 where
 * row r sees a key and its q row holds a NaN, else 0. */
void fa_cpu_nan_rows_begin(const fa_cpu_rows *rows, const float *qt, int64_t ld, int64_t head_dim, float *poison);
/* The same from a Q^T packed as bf16 pairs only (fa_cpu_load_bf16_pairs' layout, ceil(head_dim / 2)
 * words per row): a bf16 NaN in either half. */
void fa_cpu_nan_rows_begin_bf16_pairs(const fa_cpu_rows *rows, const uint32_t *pairs, int64_t ld, int64_t head_dim,
                                      float *poison);

/* One loaded key tile of (b, kv head hk): keys j0.., its V_j rows at v (stride ldv). */
typedef struct fa_cpu_nan_tile {
    int64_t b, hk, j0;
    int k_nan;            /* K_j holds a NaN */
    const float *v;
    int64_t ldv;
    const float *v_clean; /* V_j with NaN replaced by 0 (stride head_dim); NULL when V_j has none */
} fa_cpu_nan_tile;

/* Once per key tile of cols keys, K_j at k (stride ldk), or k NULL where K_j is not widened (the
 * bf16 scores read its bf16 rows in place): then the tensor's rows are scanned, NaN alike (a
 * widened NaN is a NaN). Masked probabilities are exactly 0, and
 * 0 * NaN would poison rows that cannot see the key: a V_j holding a NaN is copied without it
 * into buffer (cols x head_dim floats), and fa_cpu_nan_step puts the NaN back where a row sees it. */
void fa_cpu_nan_tile_begin(fa_cpu_nan_tile *t, const fa_problem *p, int64_t b, int64_t hk, int64_t j0, int64_t cols,
                           const float *k, int64_t ldk, const float *v, int64_t ldv, float *buffer);

/* The values P multiplies for keys key0..: V_j itself or its NaN-free copy; sets *ld. */
static inline const float *fa_cpu_nan_values(const fa_cpu_nan_tile *t, int64_t key0, int64_t head_dim, int64_t *ld)
{
    if (!t->v_clean) {
        *ld = t->ldv;
        return t->v + (key0 - t->j0) * t->ldv;
    }
    *ld = head_dim;
    return t->v_clean + (key0 - t->j0) * head_dim;
}

/* After O += P V of rows on keys [key0, key0 + keys): poison[r] = 1 where row r sees a key whose
 * k row holds a NaN; o[r * head_dim + c] = NaN where row r sees a key whose v[c] is NaN. */
void fa_cpu_nan_step(const fa_cpu_nan_tile *t, const fa_problem *p, const fa_cpu_rows *rows, int64_t key0,
                     int64_t keys, float *poison, float *o);

/* The end of a row: a poisoned row's output (head_dim values) and log-sum-exp become NaN. */
static inline void fa_cpu_nan_row_end(float poison, float *o_row, int64_t head_dim, float *lse)
{
    if (poison == 0.0f) return;
    for (int64_t c = 0; c < head_dim; ++c) o_row[c] = NAN;
    *lse = NAN;
}
#endif

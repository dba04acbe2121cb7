/* NaN inputs on the CPU forward. The kernels' max and exponential clamp NaN away (x86 max returns
 * its second operand when one is NaN; exp clamps its argument), so a NaN score would vanish
 * silently. Each query row is checked when its tile starts; for K and V a task first asks
 * whether its (batch, kv head) holds a NaN at all, reading only the keys inside some query's
 * visible span, once per head (the first task to ask scans, inside the parallel region: no
 * thread waits for another); only then do its key tiles check their rows, so NaN-free calls
 * pay one read of their inputs.
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

typedef struct fa_cpu_nan_inputs {
    int q, k, v; /* 1 when that tensor may hold a NaN among the rows the task reads */
} fa_cpu_nan_inputs;

/* For a task of (b, kv head hk): k and v from a scan of the head's visible keys, remembered in
 * known[b * heads_kv + hk] (batch x heads_kv ints, zero before the call; shared by the team,
 * read and written atomically); q = 1 (rows are checked one by one as their tiles start). */
fa_cpu_nan_inputs fa_cpu_nan_inputs_of_head(const fa_problem *p, int64_t b, int64_t hk, int *known);

/* Query rows of (b, h): poison[r] = 1 where row r sees a key and its q row holds a NaN, else 0. */
void fa_cpu_nan_rows_begin(const fa_cpu_nan_inputs *in, const fa_problem *p, int64_t b, int64_t h,
                           const fa_cpu_rows *rows, float *poison);

/* One loaded key tile of (b, kv head hk): keys j0.., its V_j rows at v (stride ldv). */
typedef struct fa_cpu_nan_tile {
    const fa_cpu_nan_inputs *in;
    int64_t b, hk, j0;
    const float *v;
    int64_t ldv;
    const float *v_clean; /* V_j with NaN replaced by 0 (stride head_dim); NULL when V_j has none */
} fa_cpu_nan_tile;

/* Once per key tile of cols keys. Masked probabilities are exactly 0, and 0 * NaN would poison
 * rows that cannot see the key: a V_j holding a NaN is copied without it into buffer (cols x
 * head_dim floats), and fa_cpu_nan_step puts the NaN back where a row sees it. */
void fa_cpu_nan_tile_begin(fa_cpu_nan_tile *t, const fa_cpu_nan_inputs *in, const fa_problem *p, int64_t b,
                           int64_t hk, int64_t j0, int64_t cols, const float *v, int64_t ldv, float *buffer);

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

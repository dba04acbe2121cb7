/* NaN inputs on the CPU path. The kernels' max and exponential clamp NaN away (x86 max returns
 * its second operand when one is NaN; exp clamps its argument), so a NaN score would vanish
 * silently. The forward first asks whether q, k or v hold a NaN at all, reading only the rows it
 * would read anyway (query rows that see a key, keys inside some query's visible span); only
 * then do its tiles check their rows, so NaN-free calls pay one read of their inputs. */
#ifndef FA_CPU_NAN_H
#define FA_CPU_NAN_H
#include <stdint.h>

#include "../common/backend.h"
#include "../common/visibility.h"

typedef struct fa_cpu_nan_inputs {
    int q, k, v; /* 1 when that tensor holds a NaN among the rows the forward reads */
} fa_cpu_nan_inputs;

fa_cpu_nan_inputs fa_cpu_find_nan_inputs(const fa_problem *p, int threads);

/* 1 when row (b, s, h) of t holds a NaN (tested on the stored bits). */
int fa_cpu_row_has_nan(const fa_tensor *t, int64_t b, int64_t s, int64_t h);

/* For query rows i0.. (ranges[r] their causal/window/padding keys) and the key tile
 * [j0, j0 + cols) of kv head hk: poison[r] = 1 where row r sees a key whose k row holds a NaN. */
void fa_cpu_mark_nan_keys(const fa_problem *p, int64_t b, int64_t hk, const fa_key_range *ranges, int64_t i0,
                          int64_t rows_n, int64_t j0, int64_t cols, float *poison);

/* Masked probabilities are exactly 0, and 0 * NaN would poison rows that cannot see the key:
 * dst[t * d + c] = v[t * ldv + c] with NaN replaced by 0; returns whether any NaN was replaced. */
int fa_cpu_copy_without_nan(const float *v, int64_t ldv, int64_t cols, int64_t d, float *dst);
/* o[r * d + c] = NaN where query row r sees key j0 + t and v[t * ldv + c] is NaN. */
void fa_cpu_poison_from_v(const fa_problem *p, const fa_key_range *ranges, int64_t i0, int64_t rows_n, int64_t j0,
                          int64_t cols, const float *v, int64_t ldv, float *o);
#endif

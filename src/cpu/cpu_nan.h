/* NaN inputs on the CPU path. The kernels' max and exponential clamp NaN away (x86 max returns
 * its second operand when one is NaN; exp clamps its argument), so a NaN score would vanish
 * silently. The forward therefore finds the query and key rows that hold a NaN, once per call
 * (O(N d) reads, memory only when a NaN exists), and poisons every output row that sees one. */
#ifndef FA_CPU_NAN_H
#define FA_CPU_NAN_H
#include <stdint.h>

#include "../common/backend.h"
#include "../common/visibility.h"

typedef struct fa_cpu_nan_rows {
    uint8_t *q; /* [batch][heads_q][seqlen_q], 1 = the row holds a NaN; NULL when q has none */
    uint8_t *k; /* [batch][heads_kv][seqlen_k]; NULL when k has none */
    uint8_t *v; /* [batch][heads_kv][seqlen_k]; NULL when v has none */
} fa_cpu_nan_rows;

/* FA_SUCCESS or FA_ERROR_OUT_OF_MEMORY (message recorded). */
fa_status fa_cpu_find_nan_rows(const fa_problem *p, int threads, fa_cpu_nan_rows *rows);
void fa_cpu_nan_rows_free(fa_cpu_nan_rows *rows);

/* 1 when query row i of (b, h), whose causal/window/padding keys are `range`, sees a NaN in its
 * own q row or in a visible key's k row (block mask included). */
int fa_cpu_row_sees_nan(const fa_problem *p, const fa_cpu_nan_rows *rows, int64_t b, int64_t h, int64_t i,
                        fa_key_range range);

/* V tiles with a NaN. Masked probabilities are exactly 0, and 0 * NaN would poison rows that
 * cannot see the key, so the product uses a NaN-free copy, and NaN is then written into the
 * columns of the rows that do see a NaN value. */
int fa_cpu_v_tile_has_nan(const fa_problem *p, const fa_cpu_nan_rows *rows, int64_t b, int64_t hk, int64_t j0,
                          int64_t cols);
/* dst[j * d + c] = v[j * ldv + c], NaN replaced by 0. */
void fa_cpu_copy_without_nan(const float *v, int64_t ldv, int64_t cols, int64_t d, float *dst);
/* o[r * d + c] = NaN where query row r sees key j0 + t and v[t * ldv + c] is NaN. */
void fa_cpu_poison_from_v(const fa_problem *p, const fa_key_range *ranges, int64_t i0, int64_t rows_n, int64_t j0,
                          int64_t cols, const float *v, int64_t ldv, float *o);
#endif

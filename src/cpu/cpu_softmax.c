/* The online-softmax step of a CPU tile (Algorithm 1, lines 9-11): running max, rescale, sum. */
#include "cpu_tile.h"

#include <math.h>

#include "kernels/exp_poly.h"

void fa_cpu_softmax_step(const fa_cpu_kernels *kern, float scale_in_exp, int64_t rows, int64_t cols, float *st,
                         int64_t ld, float *m, float *l, float *tile_max, float *shift, float *alpha, float *tile_sum)
{
    kern->col_max(st, ld, cols, rows, tile_max);
    fa_cpu_softmax_step_given_max(kern, scale_in_exp, rows, cols, st, ld, m, l, tile_max, shift, alpha, tile_sum);
}

void fa_cpu_softmax_step_given_max(const fa_cpu_kernels *kern, float scale_in_exp, int64_t rows, int64_t cols,
                                   float *st, int64_t ld, float *m, float *l, const float *tile_max, float *shift,
                                   float *alpha, float *tile_sum)
{
    for (int64_t r = 0; r < rows; ++r) {
        const float row_max = tile_max[r] * scale_in_exp; /* -inf stays -inf (scale > 0) */
        const float m_new = m[r] > row_max ? m[r] : row_max;
        if (m_new == -INFINITY) { /* nothing visible in this row so far: P = 0, O stays 0 */
            shift[r] = INFINITY;
            alpha[r] = 1.0f;
            continue;
        }
        shift[r] = m_new;
        /* 0 on the first visible tile; flushed below 2^-64 as P is (exp_poly.h: no subnormal O) */
        const float gap = m[r] - m_new;
        alpha[r] = gap < FA_EXP_LO ? 0.0f : expf(gap);
        m[r] = m_new;
    }
    kern->exp_cols(st, ld, cols, rows, scale_in_exp, shift, tile_sum);
    for (int64_t r = 0; r < rows; ++r) l[r] = l[r] * alpha[r] + tile_sum[r];
}

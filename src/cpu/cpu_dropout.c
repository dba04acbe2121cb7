/* Dropout on a CPU probability tile: the Philox stream (philox.h) at the element index of the
 * problem's dropout section (problem_dropout.h). */
#include "cpu_tile.h"

void fa_cpu_apply_dropout(const fa_problem *p, int64_t b, int64_t h, const fa_cpu_rows *rows, int64_t j0,
                          int64_t cols, float *st, int64_t ld)
{
    const float keep_scale = fa_dropout_keep_scale(&p->dropout);
    for (int64_t r = 0; r < rows->count; ++r) {
        const uint64_t row_base = fa_dropout_section_element(&p->dropout, p->shape.heads_q, b, h, rows->i0 + r, 0);
        int64_t c = 0;
        while (c < cols) {
            const uint64_t e = row_base + (uint64_t)(j0 + c);
            const fa_philox4x32 w = fa_dropout_words(p->dropout.seed, p->dropout.offset, e >> 2);
            for (uint64_t word = e & 3u; word < 4 && c < cols; ++word, ++c) {
                float *x = st + c * ld + r;
                *x = fa_dropout_uniform(w.v[word]) < p->dropout.p ? 0.0f : *x * keep_scale;
            }
        }
    }
}

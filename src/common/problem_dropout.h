/* The dropout section of a problem: the probability, the Philox stream (philox.h) and where this
 * problem's scores sit in the stream's grid. Shared as is by fa_problem and the GPU kernels'
 * parameters. */
#ifndef FA_PROBLEM_DROPOUT_H
#define FA_PROBLEM_DROPOUT_H
#include <stdint.h>

#include "hostdev.h"
#include "philox.h"

typedef struct fa_dropout_section {
    float p; /* 0 = off */
    uint64_t seed, offset;
    /* Element of (b, h, i, j): fa_dropout_element(batch0 + b, heads_q, h, rows, row0 + i, cols,
     * col0 + j). Dense problems: batch0 = row0 = col0 = 0, rows = seqlen_q, cols = seqlen_k; a block
     * of a larger problem (desc->q_offset...) passes the global grid. */
    int64_t batch0, rows, cols, row0, col0;
} fa_dropout_section;

/* 1 / (1 - p): the scale of kept elements. */
FA_HD float fa_dropout_keep_scale(const fa_dropout_section *d) { return 1.0f / (1.0f - d->p); }

/* The stream element of score (b, h, i, j) of a problem of heads_q query heads. */
FA_HD uint64_t fa_dropout_section_element(const fa_dropout_section *d, int64_t heads_q, int64_t b, int64_t h,
                                          int64_t i, int64_t j)
{
    return fa_dropout_element((uint64_t)(d->batch0 + b), (uint64_t)heads_q, (uint64_t)h, (uint64_t)d->rows,
                              (uint64_t)(d->row0 + i), (uint64_t)d->cols, (uint64_t)(d->col0 + j));
}

#endif

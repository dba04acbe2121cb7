/* The shape section of a problem: sizes, element type and the resolved softmax scale. Shared as is
 * by fa_problem (host) and the GPU kernels' parameters (device). */
#ifndef FA_PROBLEM_SHAPE_H
#define FA_PROBLEM_SHAPE_H
#include <stdint.h>

#include "flashattn.h"
#include "hostdev.h"

typedef struct fa_shape_section {
    int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
    fa_dtype dtype;
    float scale; /* resolved softmax scale tau, never 0 */
} fa_shape_section;

/* tau * log2(e): kernels that exponentiate with exp2 scale scores by this. */
FA_HD float fa_shape_scale_log2(const fa_shape_section *s) { return s->scale * 1.44269504088896340736f; }

#endif

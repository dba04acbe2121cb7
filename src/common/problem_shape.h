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

/* The key/value head that query head h reads (grouped-query attention: heads_q / heads_kv query
 * heads share one). */
FA_HD int64_t fa_shape_kv_head(const fa_shape_section *s, int64_t h)
{
    return h / (s->heads_q / s->heads_kv);
}

/* tau * log2(e): kernels that exponentiate with exp2 scale scores by this. */
FA_HD float fa_shape_scale_log2(const fa_shape_section *s) { return s->scale * 1.44269504088896340736f; }

/* The strides of a packed [batch, seqlen, heads, head_dim] tensor, in elements: the one rule for
 * what all-zero strides mean. */
FA_HD void fa_packed_strides(int64_t seqlen, int64_t heads, int64_t head_dim, int64_t *stride_batch,
                             int64_t *stride_seq, int64_t *stride_head)
{
    *stride_head = head_dim;
    *stride_seq = heads * head_dim;
    *stride_batch = seqlen * heads * head_dim;
}
#endif

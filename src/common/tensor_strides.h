/* What a tensor's strides mean (fa_tensor, include/flashattn.h): all three 0 = packed, row-major
 * [batch, seqlen, heads, head_dim]; otherwise as given, in elements. The one home of that rule, for
 * the core's validator and the ring of libflashattn_dist (which copies rows itself). */
#ifndef FA_TENSOR_STRIDES_H
#define FA_TENSOR_STRIDES_H
#include <stdint.h>

#include "flashattn.h"

static inline int fa_tensor_is_packed(const fa_tensor *t)
{
    return t->stride_batch == 0 && t->stride_seq == 0 && t->stride_head == 0;
}

/* *t with explicit strides in *out (positive dimensions); 0 when packed strides overflow 64 bits. */
static inline int fa_tensor_explicit_strides(const fa_tensor *t, fa_tensor *out)
{
    *out = *t;
    if (!fa_tensor_is_packed(t)) return 1;
    if (t->heads > INT64_MAX / t->head_dim) return 0;
    out->stride_head = t->head_dim;
    out->stride_seq = t->heads * t->head_dim;
    if (t->seqlen > INT64_MAX / out->stride_seq) return 0;
    out->stride_batch = t->seqlen * out->stride_seq;
    return 1;
}
#endif

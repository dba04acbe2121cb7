/* The score-modifier section of a problem: softcap, ALiBi, attention sinks and an additive bias
 * (include/flashattn.h gives their meaning). Shared as is by fa_problem and the GPU kernels'
 * parameters; arrays live in the context's memory. */
#ifndef FA_PROBLEM_MODIFIERS_H
#define FA_PROBLEM_MODIFIERS_H
#include <stdint.h>

#include "flashattn.h"
#include "hostdev.h"

typedef struct fa_modifier_section {
    float softcap;              /* 0 = off */
    const float *alibi_slopes;  /* slope of (b, h): alibi_slopes[b * alibi_stride_batch + h] */
    int64_t alibi_stride_batch;
    const float *sinks;         /* [heads_q] or NULL */
    fa_bias bias;               /* data NULL = none */
} fa_modifier_section;

/* 1 when any modifier is set. */
FA_HD int fa_modifiers_any(const fa_modifier_section *m)
{
    return m->softcap > 0.0f || m->alibi_slopes || m->sinks || m->bias.data;
}

/* 1 when scores must exist explicitly before the exponential (softcap, ALiBi or a bias): the
 * softmax scale cannot then be folded into it. Sinks alone need no explicit scores. */
FA_HD int fa_modifiers_form_scores(const fa_modifier_section *m)
{
    return m->softcap > 0.0f || m->alibi_slopes || m->bias.data;
}

/* 1 / softcap, 0 without one. */
FA_HD float fa_modifiers_inv_softcap(const fa_modifier_section *m)
{
    return m->softcap > 0.0f ? 1.0f / m->softcap : 0.0f;
}

/* The element offset of (b, h, i, j) in a bias or its gradient: the one indexing rule. */
FA_HD int64_t fa_bias_offset(const fa_bias *bias, int64_t b, int64_t h, int64_t i, int64_t j)
{
    return b * bias->stride_batch + h * bias->stride_head + i * bias->stride_q + j;
}
#endif

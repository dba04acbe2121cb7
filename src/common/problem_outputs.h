/* The outputs section of a problem beyond the attention tensors: the log-sum-exp rows and the
 * gradients of the learnable score modifiers. Shared as is by fa_problem and the GPU kernels'
 * parameters. */
#ifndef FA_PROBLEM_OUTPUTS_H
#define FA_PROBLEM_OUTPUTS_H
#include <stdint.h>

#include "flashattn.h"
#include "hostdev.h"

typedef struct fa_output_section {
    /* Forward: output or NULL; backward: input. Row i of (b, h) at
     * lse[b * lse_stride_batch + h * lse_stride_head + i]. */
    float *lse;
    int64_t lse_stride_batch, lse_stride_head;
    fa_bias dbias;  /* backward: the bias's gradient, data NULL = not wanted */
    float *dsinks;  /* backward: [heads_q] the sinks' gradient, NULL = not wanted */
} fa_output_section;

#endif

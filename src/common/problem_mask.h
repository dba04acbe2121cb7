/* The masks-and-positions section of a problem: causal and sliding-window masks, key padding, the
 * block-sparse mask, and the diagonal that block positions move. Shared as is by fa_problem (host
 * tables) and the GPU kernels' parameters (the plugin points seqlens_k and block_mask.mask at its
 * device copies). Which keys a row sees: visibility.h. */
#ifndef FA_PROBLEM_MASK_H
#define FA_PROBLEM_MASK_H
#include <stdint.h>

#include "flashattn.h"
#include "hostdev.h"

typedef struct fa_mask_section {
    int32_t causal;
    int32_t window_left, window_right; /* -1 = unbounded */
    /* Query row i's causal/window/ALiBi diagonal is local key i + diag_offset (dense: seqlen_k -
     * seqlen_q; block positions move it). */
    int64_t diag_offset;
    const int32_t *seqlens_k;  /* [batch] valid keys per sequence, or NULL = all */
    fa_block_mask block_mask;  /* block_mask.mask NULL = no block mask */
} fa_mask_section;

FA_HD int fa_mask_has_block_mask(const fa_mask_section *m) { return m->block_mask.mask != 0; }

/* The block mask, or NULL when there is none. */
FA_HD const fa_block_mask *fa_mask_blocks(const fa_mask_section *m) { return m->block_mask.mask ? &m->block_mask : 0; }

#endif

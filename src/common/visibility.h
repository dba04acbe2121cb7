/* Which keys a query row may see: the one definition every backend uses.
 * Causal, window and key padding leave a contiguous range [lo, hi) of keys; the block mask is
 * applied on top, per block. Bottom-right alignment: query i sits at key position i + (Nk - Nq).
 * Block positions (desc->q_offset, k_offset, seqlen_*_global; computed once by the core into
 * fa_problem.diag_offset): query row i of a block has its diagonal at local key i + diag_offset,
 * and ALiBi's distance is that diagonal minus the key. */
#ifndef FA_VISIBILITY_H
#define FA_VISIBILITY_H
#include <stdint.h>
#include "hostdev.h"

typedef struct fa_key_range { int64_t lo, hi; } fa_key_range; /* empty when hi <= lo */

/* The keys of a query row whose diagonal (the key at its own position) is local key diag. */
FA_HD fa_key_range fa_visible_keys_at(int64_t diag, int64_t valid_k, int causal, int32_t window_left,
                                      int32_t window_right)
{
    fa_key_range r;
    r.lo = 0;
    r.hi = valid_k;
    if (causal && diag + 1 < r.hi) r.hi = diag + 1;
    if (window_right >= 0 && diag + window_right + 1 < r.hi) r.hi = diag + window_right + 1;
    if (window_left >= 0 && diag - window_left > r.lo) r.lo = diag - window_left;
    if (r.hi < r.lo) r.hi = r.lo;
    return r;
}

/* The local key at query row i's diagonal (dense problems: diag_offset = seqlen_k - seqlen_q). */
FA_HD int64_t fa_diagonal_key(int64_t i, int64_t diag_offset) { return i + diag_offset; }

FA_HD fa_key_range fa_visible_keys(int64_t i, int64_t seqlen_q, int64_t seqlen_k, int64_t valid_k,
                                   int causal, int32_t window_left, int32_t window_right)
{
    return fa_visible_keys_at(fa_diagonal_key(i, seqlen_k - seqlen_q), valid_k, causal, window_left, window_right);
}
#endif

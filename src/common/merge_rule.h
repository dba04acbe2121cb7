/* The lse merge of one row (fa_merge_partials), the one rule of the host merge (merge.c) and the
 * GPU kernel (src/gpu/kernels/merge.cuh). With part c's normalised output O_c, lse L_c and
 * M = max_c L_c:
 *   w_c = exp(L_c - M),  O = (sum_c w_c O_c) / sum_c w_c,  L = M + log(sum_c w_c),
 * every sum in part order (deterministic), the products accumulated by fmaf so that the host and
 * a GPU compiler (which contracts a * b + c) do the same arithmetic. A NaN or +inf lse poisons the
 * row (NaN out and lse, as a NaN score makes it); a part whose lse is -inf saw no visible key: weight
 * 0, its output is not read; a row whose every part is -inf stays 0 with lse -inf. */
#ifndef FA_MERGE_RULE_H
#define FA_MERGE_RULE_H
#include <math.h>

#include "hostdev.h"

typedef struct fa_merge_row {
    float top;    /* M, the largest finite-or-(-inf) lse seen */
    int poisoned; /* a NaN or +inf lse was seen */
} fa_merge_row;

FA_HD fa_merge_row fa_merge_row_start(void)
{
    fa_merge_row r = {-INFINITY, 0};
    return r;
}

/* First pass: every part's lse, in order. */
FA_HD void fa_merge_see(fa_merge_row *r, float lse)
{
    if (lse != lse || lse == INFINITY) r->poisoned = 1;
    else if (lse > r->top) r->top = lse;
}

/* Second pass: part c's weight (0: skip the part). */
FA_HD float fa_merge_weight(const fa_merge_row *r, float lse)
{
    return r->poisoned || r->top == -INFINITY || lse == -INFINITY ? 0.0f : expf(lse - r->top);
}

/* acc += weight * value, for each element of a part with a nonzero weight, in part order. */
FA_HD float fa_merge_accumulate(float acc, float weight, float value) { return fmaf(weight, value, acc); }

/* The factor that turns an accumulated element into the merged output: out = acc * factor. */
FA_HD float fa_merge_factor(const fa_merge_row *r, float sum)
{
    return r->poisoned ? NAN : sum > 0.0f ? 1.0f / sum : 0.0f;
}

FA_HD float fa_merge_lse(const fa_merge_row *r, float sum)
{
    return r->poisoned ? NAN : r->top == -INFINITY ? -INFINITY : r->top + logf(sum);
}
#endif

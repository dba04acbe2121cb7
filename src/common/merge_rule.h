/* The lse merge of one row: the one rule of every merge of partial attention results, the host's
 * and the GPU's fa_merge_partials (merge.c, src/gpu/kernels/merge.cuh) and both backends' split-KV
 * decode (src/cpu/cpu_decode.c, src/gpu/kernels/attention_decode.cuh).
 * A part c is (m_c, l_c, O_c): the largest score m_c, the sum of exponentials l_c relative to it
 * and the output O_c scaled alike; a finished output with lse L_c is the part (L_c, 1, O_c).
 * With M = max_c m_c:
 *   w_c = exp(m_c - M),  l = sum_c w_c l_c,  O = (sum_c w_c O_c) / l,  L = M + log(l),
 * every sum in part order (deterministic), every product accumulated by fmaf so that the host and a
 * GPU compiler (which contracts a * b + c) do the same arithmetic. Scores kept in base 2 (scaled
 * by log2 e) use the _base2 twins; their lse comes out in natural-log units.
 * A NaN or +inf m_c, or a NaN l_c, poisons the row (NaN out and lse, as a NaN score makes it); a
 * part whose m_c is -inf saw no visible key: weight 0, its output is not read; a row whose every
 * part is -inf stays 0 with lse -inf. An attention sink s joins as one more part (s, 1, no values),
 * seen and summed before the others. */
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

/* First pass, for a part (m, l): a NaN l poisons the row too. */
FA_HD void fa_merge_see_part(fa_merge_row *r, float m, float l)
{
    fa_merge_see(r, m);
    if (l != l) r->poisoned = 1;
}

/* Second pass: part c's weight (0: skip the part). */
FA_HD float fa_merge_weight(const fa_merge_row *r, float lse)
{
    return r->poisoned || r->top == -INFINITY || lse == -INFINITY ? 0.0f : expf(lse - r->top);
}

FA_HD float fa_merge_weight_base2(const fa_merge_row *r, float m)
{
    return r->poisoned || r->top == -INFINITY || m == -INFINITY ? 0.0f : exp2f(m - r->top);
}

/* acc += weight * value, for each element of a part with a nonzero weight, in part order; and
 * l += weight * l_c. */
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

/* The natural-log lse of a row merged in base 2. */
FA_HD float fa_merge_lse_base2(const fa_merge_row *r, float sum)
{
    return r->poisoned ? NAN : r->top == -INFINITY ? -INFINITY : (r->top + log2f(sum)) * 0.69314718055994530942f;
}
#endif

/* fa_dropout_mask: the shared dropout stream (philox.h) written out for one (batch, head). */
#include "error.h"
#include "philox.h"
#include "validate.h"

fa_status fa_dropout_mask(uint64_t seed, uint64_t offset, float dropout_p, int64_t heads_q, int64_t seqlen_q,
                          int64_t seqlen_k, int64_t batch_index, int64_t head_index, uint8_t *keep)
{
    if (!keep) return fa_set_error(FA_ERROR_INVALID_VALUE, "keep: is NULL");
    if (!(dropout_p >= 0.0f && dropout_p < 1.0f))
        return fa_set_error(FA_ERROR_INVALID_VALUE, "dropout_p: %g is outside [0, 1)", (double)dropout_p);
    if (heads_q <= 0 || seqlen_q <= 0 || seqlen_k <= 0)
        return fa_set_error(FA_ERROR_INVALID_VALUE, "heads_q, seqlen_q, seqlen_k: must be positive");
    if (batch_index < 0) return fa_set_error(FA_ERROR_INVALID_VALUE, "batch_index: is negative");
    if (head_index < 0 || head_index >= heads_q)
        return fa_set_error(FA_ERROR_INVALID_VALUE, "head_index: %lld is outside [0, heads_q)", (long long)head_index);
    int64_t base;
    if (!(fa_checked_mul(batch_index, heads_q, &base) && fa_checked_add(base, head_index, &base) &&
          fa_checked_mul(base, seqlen_q, &base) && fa_checked_mul(base, seqlen_k, &base) &&
          fa_checked_mul(seqlen_q, seqlen_k, &(int64_t){0}) && fa_checked_add(base, seqlen_q * seqlen_k, &(int64_t){0})))
        return fa_set_error(FA_ERROR_INVALID_VALUE, "batch_index: element indices overflow 64 bits");
    const int64_t n = seqlen_q * seqlen_k;
    for (int64_t idx = 0; idx < n;) {
        const uint64_t e = (uint64_t)(base + idx);
        const fa_philox4x32 w = fa_dropout_words(seed, offset, e >> 2);
        for (uint64_t word = e & 3u; word < 4 && idx < n; ++word, ++idx)
            keep[idx] = !(fa_dropout_uniform(w.v[word]) < dropout_p);
    }
    return FA_SUCCESS;
}

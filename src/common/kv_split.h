/* The split-KV rule of fa_forward_kvcache, the one every backend follows: sequence b's keys
 * [0, keys) are cut into chunks of `size` keys, chunk c = [c * size, min((c + 1) * size, keys)),
 * and the chunks' partial results are merged in increasing c by the lse merge (merge_rule.h).
 * size is desc->kv_split_tokens when set; the default depends on the sequence's own key count
 * only: chunks of FA_KV_SPLIT_MIN_KEYS keys, grown in steps of that many keys so that no sequence
 * has more than FA_KV_SPLIT_MAX_CHUNKS. Nothing depends on the batch, the thread count or the
 * device, so a sequence's output is bit-identical whatever it is batched with. */
#ifndef FA_KV_SPLIT_H
#define FA_KV_SPLIT_H
#include <stdint.h>

#include "hostdev.h"
#include "visibility.h"

/* Shorter chunks cost more than they let threads (or GPU blocks) share: at 256 keys a batch of 64
 * decodes ran 9-21% slower on the CPU than with 0.4's batch-dependent chunks, at 1024 within the
 * noise (bench/results/serving-cpu-2026-11-29.md). A caller that wants more parallelism for a
 * small batch (a batch-1 decode on a large GPU) sets desc->kv_split_tokens. */
#define FA_KV_SPLIT_MIN_KEYS 1024
/* Enough to fill a large CPU or a GPU with one long sequence; more only adds partials to merge. */
#define FA_KV_SPLIT_MAX_CHUNKS 64

/* Keys per chunk of a sequence of `keys` keys (requested > 0: that size). */
FA_HD int64_t fa_kv_split_size(int64_t requested, int64_t keys)
{
    if (requested > 0) return requested;
    const int64_t step = FA_KV_SPLIT_MIN_KEYS, spread = (keys + FA_KV_SPLIT_MAX_CHUNKS - 1) / FA_KV_SPLIT_MAX_CHUNKS;
    const int64_t size = (spread + step - 1) / step * step;
    return size > step ? size : step;
}

/* Chunks of a sequence of `keys` keys (at least 1, for a sequence without keys too). */
FA_HD int64_t fa_kv_split_chunks(int64_t requested, int64_t keys)
{
    const int64_t size = fa_kv_split_size(requested, keys), chunks = (keys + size - 1) / size;
    return chunks > 1 ? chunks : 1;
}

/* Keys [lo, hi) of chunk c (empty past the last chunk). */
FA_HD fa_key_range fa_kv_split_chunk(int64_t requested, int64_t keys, int64_t c)
{
    const int64_t size = fa_kv_split_size(requested, keys);
    fa_key_range r;
    r.lo = c * size < keys ? c * size : keys;
    r.hi = r.lo + size < keys ? r.lo + size : keys;
    return r;
}

/* The most chunks any sequence of at most `capacity` keys has (a bound for buffers and grids). */
FA_HD int64_t fa_kv_split_max_chunks(int64_t requested, int64_t capacity)
{
    if (requested > 0) return capacity > requested ? (capacity + requested - 1) / requested : 1;
    const int64_t by_length = (capacity + FA_KV_SPLIT_MIN_KEYS - 1) / FA_KV_SPLIT_MIN_KEYS;
    return by_length < 1 ? 1 : by_length < FA_KV_SPLIT_MAX_CHUNKS ? by_length : FA_KV_SPLIT_MAX_CHUNKS;
}

#endif

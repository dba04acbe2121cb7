/* The table sections of a problem: a packed variable-length batch (fa_varlen, include/flashattn.h)
 * and a KV cache's lengths and pages. Shared as is by the core's problems and the GPU kernels'
 * parameters; the tables live in the context's memory. */
#ifndef FA_PROBLEM_TABLES_H
#define FA_PROBLEM_TABLES_H
#include <stdint.h>

#include "flashattn.h"
#include "hostdev.h"

/* fa_forward_kvcache's cache: the cache tensors' capacity per sequence is seqlen_k (contiguous) or
 * page_size (paged). */
typedef struct fa_cache_section {
    const int32_t *cache_seqlens;   /* [batch] tokens cached before this call */
    const int32_t *block_table;     /* [batch, max_pages_per_seq], NULL = contiguous */
    int64_t max_pages_per_seq, page_size, num_pages;
    int64_t seqlen_new;             /* tokens appended by this call, 0 = none */
} fa_cache_section;

/* A split-KV decode cuts a sequence's keys into chunks of at least this many keys: shorter chunks
 * cost more in merging than they share. Every backend's split obeys it. */
#define FA_CACHE_MIN_CHUNK_KEYS 256

#endif

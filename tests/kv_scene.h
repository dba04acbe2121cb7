/* A serving step for the KV-cache tests, on any backend: sequences with their own cached tokens,
 * query rows and new tokens, packed (ragged) or padded, over a contiguous or paged cache in the
 * context's memory. A sequence's values depend only on its id, never on its place in the batch,
 * so that the same sequence can be run alone and inside any batch and the results compared bit
 * for bit. Cache positions a sequence does not own hold NaN, so a read past its keys shows up. */
#ifndef FA_TEST_KV_SCENE_H
#define FA_TEST_KV_SCENE_H
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

#define KV_SCENE_MAX 64

typedef struct kv_seq {
    int32_t cached, queries, fresh; /* tokens in the cache, query rows, tokens appended */
    uint32_t id;                    /* seeds its values */
} kv_seq;

typedef struct kv_layout {
    fa_dtype dtype;
    int64_t heads_q, heads_kv, head_dim;
    int64_t capacity;  /* tokens per sequence */
    int64_t page_size; /* 0: contiguous [batch, capacity, heads_kv, d] */
} kv_layout;

typedef struct kv_scene {
    fa_context *ctx;
    kv_layout layout;
    int n;
    kv_seq seqs[KV_SCENE_MAX];
    int64_t total_q, total_new, slots, slot_len, max_pages;
    int32_t cu_q[KV_SCENE_MAX + 1], cu_new[KV_SCENE_MAX + 1], cached[KV_SCENE_MAX], *table; /* host */
    size_t cache_elems;
    void *q, *k_new, *v_new, *k_cache, *v_cache, *out;      /* the context's memory */
    float *lse;                                             /* [heads_q, total_q] or [n, heads_q, queries] */
    int32_t *cu_q_dev, *cu_new_dev, *cached_dev, *table_dev; /* the context's memory */
    char *seen_out, *seen_k, *seen_v; /* host copies of the last run's results (kv_scene_result) */
    float *seen_lse;
} kv_scene;

/* Builds the scene's arrays in ctx's memory (cmocka-fails on allocation errors). */
void kv_scene_build(kv_scene *s, fa_context *ctx, const kv_layout *layout, const kv_seq *seqs, int n);
void kv_scene_free(kv_scene *s);

/* The step: ragged (desc->varlen with the packed offsets) or padded (every sequence has the same
 * queries and fresh counts; q [n, queries, ...]); base: the desc to start from (scale, masks,
 * modifiers, kv_split_tokens); slots may be NULL. */
fa_status kv_scene_run(kv_scene *s, const fa_attention_desc *base, int ragged, const fa_kv_slots *slots);

/* Host copies after a run (malloc'd): sequence b's out rows [queries, heads_q, d] (dtype bytes),
 * its lse [heads_q, queries] and its cache rows [cached + fresh, heads_kv, d] for both K and V. */
typedef struct kv_seq_result {
    void *out, *k, *v;
    float *lse;
    size_t out_bytes, lse_count, cache_bytes;
} kv_seq_result;
void kv_scene_result(kv_scene *s, int b, int ragged, kv_seq_result *r);
/* Forgets the host copies, so that the next kv_scene_result reads the context's memory again (after
 * work the scene did not launch itself, e.g. a graph replay). */
void kv_scene_forget(kv_scene *s);
void kv_seq_result_free(kv_seq_result *r);

/* Fails the test unless a and b are equal byte for byte (what names them in the message). */
void kv_expect_same(const kv_seq_result *a, const kv_seq_result *b, const char *what);
#endif

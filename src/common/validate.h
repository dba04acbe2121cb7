/* Argument validation: turns the public call's arguments into a checked fa_problem, or returns
 * FA_ERROR_INVALID_VALUE with a message naming the argument. */
#ifndef FA_VALIDATE_H
#define FA_VALIDATE_H
#include "backend.h"

fa_status fa_validate_forward(const fa_attention_desc *desc, const fa_tensor *q, const fa_tensor *k,
                              const fa_tensor *v, const fa_tensor *out, float *lse, fa_problem *p);
fa_status fa_validate_backward(const fa_attention_desc *desc, const fa_tensor *q, const fa_tensor *k,
                               const fa_tensor *v, const fa_tensor *out, const fa_tensor *dout,
                               const float *lse, const fa_tensor *dq, const fa_tensor *dk,
                               const fa_tensor *dv, float *dsinks, const fa_bias *dbias, fa_problem *p);
/* The values of desc->varlen's offsets (host memory only): first 0, non-decreasing, lengths at
 * most max_seqlen_*, last == the tensors' total rows. */
fa_status fa_validate_varlen_offsets(const fa_problem *p);
/* The values of the ALiBi slopes (finite) and the sinks (not NaN, not +inf), host memory only. */
fa_status fa_validate_modifier_values(const fa_problem *p);

/* fa_forward_kvcache's arguments, shapes only (tables are the context's memory). */
fa_status fa_validate_kvcache(const fa_attention_desc *desc, const fa_tensor *q, const fa_kv_cache *cache,
                              const fa_kv_slots *slots,
                              const fa_tensor *k_new, const fa_tensor *v_new, const fa_tensor *out, float *lse,
                              fa_kv_problem *kp);
/* The cache's tables (host memory only): lengths not negative, cached + new within each sequence's
 * capacity or pages, every page index it uses in range. */
/* fa_kvcache_append's arguments: the cache's and the new tokens' rules of fa_validate_kvcache, into a
 * problem without queries (attn.q, attn.out data NULL, seqlen_q 0, heads_q = heads_kv). */
fa_status fa_validate_kvcache_append(const fa_attention_desc *desc, const fa_kv_cache *cache, const fa_kv_slots *slots,
                                     const fa_tensor *k_new, const fa_tensor *v_new, fa_kv_problem *kp);
fa_status fa_validate_kvcache_tables(const fa_kv_problem *kp);

/* One tensor: non-NULL, aligned, positive dimensions, offsets within 64 bits; *out gets it with
 * explicit strides. */
fa_status fa_validate_tensor(const char *name, const fa_tensor *t, fa_tensor *out);
/* t has ref's shape and dtype. */
fa_status fa_validate_same_shape(const char *name, const fa_tensor *t, const char *ref_name, const fa_tensor *ref);

/* a * b and a + b for non-negative int64, returning 0 on overflow. */
int fa_checked_mul(int64_t a, int64_t b, int64_t *result);
int fa_checked_add(int64_t a, int64_t b, int64_t *result);
#endif

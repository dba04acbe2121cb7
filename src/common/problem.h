/* The validated problems the core hands to a backend, made of sections that every backend (and the
 * GPU kernels' parameters) shares: shape (problem_shape.h), masks and positions (problem_mask.h),
 * dropout (problem_dropout.h), score modifiers (problem_modifiers.h), varlen and cache tables
 * (problem_tables.h), outputs (problem_outputs.h). A feature adds its fields to its section, its
 * need to fa_problem_needs, its checks to validate.c, and its kernels to the backends that run it. */
#ifndef FA_PROBLEM_H
#define FA_PROBLEM_H
#include "flashattn.h"
#include "dtype.h"
#include "hostdev.h"
#include "problem_dropout.h"
#include "problem_mask.h"
#include "problem_modifiers.h"
#include "problem_outputs.h"
#include "problem_shape.h"
#include "problem_tables.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A validated attention problem. Tensor strides are always explicit (never 0); the tensors of
 * backward (dout, dq, dk, dv) have data NULL in a forward. A packed variable-length batch
 * (varlen.batch > 0) has shape.batch = 1, seqlen_q/seqlen_k the total rows, lse [heads_q, total_q],
 * and the block mask's grid is that of max_seqlen_q x max_seqlen_k. */
typedef struct fa_problem {
    fa_shape_section shape;
    fa_tensor q, k, v, out;
    fa_tensor dout, dq, dk, dv;
    fa_mask_section mask;
    fa_dropout_section dropout;
    fa_modifier_section modifiers;
    fa_varlen varlen;
    fa_output_section outputs;
} fa_problem;

/* fa_forward_kvcache's problem: attn.k, attn.v are the cache tensors, attn.shape.seqlen_k their
 * capacity per sequence; the rest of attn as in fa_problem. Ragged queries: attn.varlen holds the
 * packed queries' offsets (cu_seqlens_k, max_seqlen_k: k_new's, as in the cache section). */
typedef struct fa_kv_problem {
    fa_problem attn;
    fa_tensor k_new, v_new; /* data NULL: nothing to append */
    fa_cache_section cache;
} fa_kv_problem;

/* fa_merge_partials in the backend's memory, after the core's checks: n >= 1 parts of out's shape
 * and dtype with explicit strides (parts: a host array), lses[c] (a host array of pointers into the
 * backend's memory) [batch, heads, seqlen] like lse_out (NULL: not wanted); out overlaps none of
 * them. The rule of each row: merge_rule.h. */
typedef struct fa_merge_problem {
    int n;
    const fa_tensor *parts;
    const float *const *lses;
    fa_tensor out;
    float *lse_out;
} fa_merge_problem;

/* The entry point a problem is for. For FA_OP_FORWARD_KVCACHE the fa_problem is the attn member
 * of an fa_kv_problem. */
typedef enum fa_op { FA_OP_FORWARD, FA_OP_BACKWARD, FA_OP_FORWARD_KVCACHE } fa_op;

/* What a problem needs of a backend beyond a plain dense forward or backward. The values of the
 * first four are those of the feature bits of plugin ABIs 4 and 5 (backend_legacy.h). */
#define FA_NEED_VARLEN 2u             /* a packed variable-length batch */
#define FA_NEED_SCORE_MODIFIERS 4u    /* softcap, ALiBi, sinks or a bias in forward/backward */
#define FA_NEED_POSITIONS 8u          /* block positions: a moved diagonal or dropout grid */
#define FA_NEED_KVCACHE_MODIFIERS 16u /* score modifiers on the KV-cache path */
#define FA_NEED_KVCACHE 32u           /* the KV-cache path itself */
#define FA_NEED_KVCACHE_SERVING 64u   /* KV cache: ragged queries, cache slots or left padding */
#define FA_NEED_KVCACHE_QUANT 128u    /* KV cache: int8 or FP8 k / v */
#define FA_NEED_KVCACHE_ROTARY 256u   /* KV cache: rotary embeddings on append */
#define FA_NEED_ALL 510u

/* The sequences of a problem: a packed batch's, else the tensors' batch. */
FA_HD int64_t fa_kv_sequences(const fa_problem *p) { return p->varlen.batch ? p->varlen.batch : p->shape.batch; }

/* Whether a KV-cache problem uses what plugins of ABI 6 do not know (their fa_kv_problem ends
 * before the cache section's serving fields; they read none of it). */
FA_HD int fa_kv_problem_serving(const fa_kv_problem *kp)
{
    return kp->attn.varlen.batch || kp->cache.cache_batch_idx || kp->cache.cache_leftpad;
}

/* Whether a KV-cache problem's cache holds quantised codes, or it rotates (what plugins of ABI 7
 * do not know). */
FA_HD int fa_kv_problem_quantised(const fa_kv_problem *kp)
{
    return fa_dtype_quantised(kp->attn.k.dtype) || fa_dtype_quantised(kp->attn.v.dtype);
}

/* 1 when desc's block positions (q_offset, k_offset, seqlen_*_global) differ from the defaults. */
FA_HD int fa_problem_has_positions(const fa_problem *p)
{
    const fa_dropout_section *d = &p->dropout;
    return d->row0 != 0 || d->col0 != 0 ||
           (!p->varlen.batch && (d->rows != p->shape.seqlen_q || d->cols != p->shape.seqlen_k));
}

/* The FA_NEED_* bits of p for op: the one place that maps sections to what they need. */
FA_HD unsigned fa_problem_needs(fa_op op, const fa_problem *p)
{
    const int modified = fa_modifiers_any(&p->modifiers);
    if (op == FA_OP_FORWARD_KVCACHE)
        return FA_NEED_KVCACHE | (modified ? FA_NEED_KVCACHE_MODIFIERS : 0u) |
               (fa_kv_problem_serving((const fa_kv_problem *)(const void *)p) ? FA_NEED_KVCACHE_SERVING : 0u) |
               (fa_kv_problem_quantised((const fa_kv_problem *)(const void *)p) ? FA_NEED_KVCACHE_QUANT : 0u) |
               (((const fa_kv_problem *)(const void *)p)->cache.rotary_cos ? FA_NEED_KVCACHE_ROTARY : 0u);
    return (modified ? FA_NEED_SCORE_MODIFIERS : 0u) | (fa_problem_has_positions(p) ? FA_NEED_POSITIONS : 0u) |
           (p->varlen.batch ? FA_NEED_VARLEN : 0u);
}

/* A backend's answer to "can you run p?" as far as the needs go: FA_SUCCESS when `have` covers
 * fa_problem_needs(op, p), else FA_ERROR_NOT_SUPPORTED with the message of the first missing need
 * (recorded through set_error: a plugin passes its host table's). Backends call this from their
 * supports() and add their own limits (head sizes, dtypes) after it. */
typedef fa_status (*fa_set_error_fn)(fa_status status, const char *fmt, ...);
static inline fa_status fa_require_needs(fa_set_error_fn set_error, const char *backend, unsigned have, fa_op op,
                                         const fa_problem *p)
{
    const unsigned missing = fa_problem_needs(op, p) & ~have;
    if (missing & FA_NEED_KVCACHE)
        return set_error(FA_ERROR_NOT_SUPPORTED,
                         "fa_forward_kvcache: the %s backend does not implement the KV-cache path yet", backend);
    if (missing & FA_NEED_KVCACHE_SERVING)
        return set_error(FA_ERROR_NOT_SUPPORTED,
                         "fa_forward_kvcache: the %s backend does not implement ragged queries (desc->varlen), "
                         "cache_batch_idx or cache_leftpad%s", backend,
                         have & FA_NEED_KVCACHE ? " (its plugin predates them: rebuild it)" : "");
    if (missing & FA_NEED_KVCACHE_QUANT)
        return set_error(FA_ERROR_NOT_SUPPORTED,
                         "cache->k, cache->v: the %s backend does not implement quantised caches (int8, FP8) yet",
                         backend);
    if (missing & FA_NEED_KVCACHE_ROTARY)
        return set_error(FA_ERROR_NOT_SUPPORTED, "desc->rotary: the %s backend does not implement rotary embeddings yet",
                         backend);
    if (missing & (FA_NEED_SCORE_MODIFIERS | FA_NEED_KVCACHE_MODIFIERS))
        return set_error(FA_ERROR_NOT_SUPPORTED,
                         "desc: the %s backend does not implement score modifiers (softcap, alibi_slopes, sinks, "
                         "bias)%s", backend, op == FA_OP_FORWARD_KVCACHE ? " on the KV-cache path" : " yet");
    if (missing & FA_NEED_POSITIONS)
        return set_error(FA_ERROR_NOT_SUPPORTED,
                         "desc->q_offset, k_offset, seqlen_*_global: the %s backend does not implement block "
                         "positions yet", backend);
    if (missing & FA_NEED_VARLEN)
        return set_error(FA_ERROR_NOT_SUPPORTED,
                         "desc->varlen: the %s backend does not implement packed variable-length batches yet",
                         backend);
    return FA_SUCCESS;
}

#ifdef __cplusplus
}
#endif
#endif

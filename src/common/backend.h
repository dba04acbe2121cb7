/* The backend interface: every backend (the built-in CPU one and the dlopen'd GPU plugins) is a
 * table of function pointers plus an opaque state, in the style of ggml-backend. The core
 * validates arguments once and hands each backend a normalised fa_problem; backends never see
 * packed (all-zero) strides or a zero softmax scale. */
#ifndef FA_BACKEND_H
#define FA_BACKEND_H

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever fa_problem, fa_host_api or fa_backend_iface change layout. */
#define FA_BACKEND_ABI_VERSION 5u
/* The oldest plugin ABI the registry still loads. ABI 5 only appended merge_partials to
 * fa_backend_iface (fa_problem and fa_host_api are as in 4), so a plugin of ABI 4 is offered a host
 * table that says 4 and its table is read up to forward_kvcache: it has no device merge
 * (fa_merge_partials returns FA_ERROR_NOT_SUPPORTED on its contexts). Older ones are refused. */
#define FA_BACKEND_ABI_OLDEST 4u

/* A validated attention problem. Tensor strides are always explicit (never 0). */
typedef struct fa_problem {
    int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
    fa_dtype dtype;
    float scale;                       /* resolved softmax scale */
    int causal;
    int32_t window_left, window_right; /* -1 = unbounded */
    const int32_t *seqlens_k;          /* host, [batch] or NULL */
    float dropout_p;
    uint64_t dropout_seed, dropout_offset;
    const fa_block_mask *block_mask;   /* host or NULL */
    fa_tensor q, k, v, out;
    fa_tensor dout, dq, dk, dv;        /* backward only; data NULL in forward */
    float *lse;                        /* forward: output or NULL; backward: input */
    /* Row i of (b, h) in lse: lse[b * lse_stride_batch + h * lse_stride_head + i]. */
    int64_t lse_stride_batch, lse_stride_head;
    /* Dropout element of (b, h, i, j): ((dropout_batch0 + b) * heads_q + h) * dropout_rows + i
     * + dropout_row0) * dropout_cols + j + dropout_col0; dense problems: 0, seqlen_q, seqlen_k. */
    int64_t dropout_batch0, dropout_rows, dropout_cols;
    /* Packed variable-length batch (desc->varlen), batch 0 when absent. Then batch = 1,
     * seqlen_q/seqlen_k are the total rows, lse is [heads_q, total_q] and the block mask's grid
     * is that of max_seqlen_q x max_seqlen_k. Offsets: the context's memory. */
    fa_varlen varlen;
    /* Score modifiers (ABI 3), all off (0 / NULL) unless the backend has
     * FA_BACKEND_SCORE_MODIFIERS. Alibi slope of (b, h): alibi_slopes[b * alibi_stride_batch + h].
     * bias/dbias: data NULL when absent; dbias and dsinks (backward outputs) only in backward. */
    float softcap;
    const float *alibi_slopes;
    int64_t alibi_stride_batch;
    const float *sinks;
    fa_bias bias, dbias;
    float *dsinks;
    /* Block positions (ABI 4; desc->q_offset etc.): query row i's causal/window/ALiBi diagonal is
     * local key i + diag_offset (dense: seqlen_k - seqlen_q), and the dropout element of (b, h, i,
     * j) uses row dropout_row0 + i and column dropout_col0 + j. A backend without
     * FA_BACKEND_POSITION_OFFSETS only ever sees the dense values (the core refuses the rest). */
    int64_t diag_offset;
    int64_t dropout_row0, dropout_col0;
} fa_problem;

/* 1 when any score modifier (softcap, ALiBi, sinks, bias) is set. */
static inline int fa_problem_has_modifiers(const fa_problem *p)
{
    return p->softcap > 0.0f || p->alibi_slopes || p->sinks || p->bias.data;
}

/* fa_forward_kvcache's problem: attn.q, attn.out, attn.lse and the score options as in
 * fa_problem; attn.k, attn.v are the cache tensors, attn.seqlen_k their capacity per sequence
 * (contiguous) or page_size (paged). */
typedef struct fa_kv_problem {
    fa_problem attn;
    fa_tensor k_new, v_new;            /* data NULL: nothing to append */
    int64_t seqlen_new;                /* 0 without k_new */
    const int32_t *block_table;        /* [batch, max_pages_per_seq], NULL = contiguous */
    int64_t max_pages_per_seq, page_size, num_pages;
    const int32_t *cache_seqlens;      /* [batch] */
} fa_kv_problem;

/* fa_merge_partials in the backend's memory (ABI 5), after the core's checks: n >= 1 parts of
 * out's shape and dtype with explicit strides (parts: a host array), lses[c] (a host array of
 * pointers into the backend's memory) [batch, heads, seqlen] like lse_out (NULL: not wanted); out
 * overlaps none of them. The rule of each row: merge_rule.h. */
typedef struct fa_merge_problem {
    int n;
    const fa_tensor *parts;
    const float *const *lses;
    fa_tensor out;
    float *lse_out;
} fa_merge_problem;

/* fa_backend_iface.features */
#define FA_BACKEND_HOST_MEMORY 1u      /* tensors and tables are host memory: the core reads tables */
#define FA_BACKEND_VARLEN 2u           /* forward and backward accept fa_problem.varlen */
#define FA_BACKEND_SCORE_MODIFIERS 4u  /* forward and backward apply softcap, ALiBi, sinks, bias */
#define FA_BACKEND_POSITION_OFFSETS 8u /* forward and backward honour diag_offset, dropout_row0/col0 */
#define FA_BACKEND_KVCACHE_MODIFIERS 16u /* forward_kvcache applies softcap, ALiBi, sinks, bias (a flag, not an
                                            ABI bump: a plugin built before it leaves it 0 and is refused them) */

/* Services the core library offers to plugins (plugins never link the core). */
typedef struct fa_host_api {
    uint32_t abi_version;
    /* Records the thread's detailed error message (printf-style); returns the status passed. */
    fa_status (*set_error)(fa_status status, const char *fmt, ...);
} fa_host_api;

typedef struct fa_backend_iface {
    uint32_t abi_version;
    fa_backend kind;
    const char *name;
    /* Devices usable now; 0 means absent (then the backend has recorded why via set_error). */
    int (*device_count)(void);
    fa_status (*open)(int device, void **state);
    void (*close)(void *state);
    fa_status (*set_num_threads)(void *state, int n);
    fa_status (*set_stream)(void *state, void *stream);
    fa_status (*synchronize)(void *state);
    fa_status (*mem_alloc)(void *state, size_t bytes, void **ptr);
    fa_status (*mem_free)(void *state, void *ptr);
    fa_status (*copy_h2d)(void *state, void *dst, const void *src, size_t bytes);
    fa_status (*copy_d2h)(void *state, void *dst, const void *src, size_t bytes);
    fa_status (*tiling)(void *state, int64_t head_dim, fa_dtype dtype, fa_tiling *tiling,
                        int64_t *sram_elements);
    const char *(*info)(void *state);
    fa_status (*forward)(void *state, const fa_problem *p);
    fa_status (*backward)(void *state, const fa_problem *p);
    /* Appended in ABI 2; a table that leaves them 0/NULL has none of these features. */
    unsigned features;                 /* FA_BACKEND_* */
    fa_status (*forward_kvcache)(void *state, const fa_kv_problem *p);
    /* Appended in ABI 5: fa_merge_partials for a backend whose memory is not the host's; NULL (or
     * a plugin of ABI 4) = not supported there. Host-memory backends merge in the core. */
    fa_status (*merge_partials)(void *state, const fa_merge_problem *p);
} fa_backend_iface;

/* A plugin exports one C symbol of this type, named FA_PLUGIN_ENTRY_NAME. It returns NULL when
 * host->abi_version does not match the one it was built for. */
typedef const fa_backend_iface *(*fa_plugin_entry_fn)(const fa_host_api *host);
#define FA_PLUGIN_ENTRY_NAME "fa_backend_plugin_entry"

#ifdef __cplusplus
}
#endif
#endif

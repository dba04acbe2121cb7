/*
 * flashattn: exact attention with IO-aware tiling (FlashAttention, Dao et al. 2022)
 * behind one backend-neutral C API. CPU, CUDA and HIP backends are picked at run time.
 *
 * Conventions
 *  - Every function that can fail returns an fa_status; on failure fa_last_error() holds a
 *    one-line message (thread-local) that names the offending argument.
 *  - Handles are opaque; destroy functions accept NULL.
 *  - Tensors live in the memory of the context's backend (host memory for the CPU backend,
 *    device memory for GPU backends). Mask arrays (seqlens_k, block masks) are always host memory;
 *    varlen offsets and KV-cache tables live in the context's memory.
 *  - Structs the library reads through a pointer and may grow (fa_attention_desc, fa_io_problem)
 *    start with `size_t struct_size`: set it with their init function (it writes sizeof), then
 *    change fields. The library reads only the fields that fit in struct_size and uses the
 *    defaults for the rest; see README "ABI policy".
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FA_BUILDING_LIBRARY)
#  define FA_API __attribute__((visibility("default")))
#else
#  define FA_API
#endif

#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 6
#define FA_VERSION_PATCH 0
#define FA_VERSION_NUMBER (FA_VERSION_MAJOR * 10000 + FA_VERSION_MINOR * 100 + FA_VERSION_PATCH)

/* Status codes are stable numbers: never renumbered, only appended. */
typedef enum fa_status {
    FA_SUCCESS = 0,
    FA_ERROR_INVALID_VALUE = 1,
    FA_ERROR_NOT_SUPPORTED = 2,
    FA_ERROR_OUT_OF_MEMORY = 3,
    FA_ERROR_BACKEND_UNAVAILABLE = 4,
    FA_ERROR_BACKEND_FAILURE = 5
} fa_status;

FA_API const char *fa_status_string(fa_status s); /* fixed text per code */
FA_API const char *fa_last_error(void);           /* detail of this thread's last failure, "" if none */
FA_API const char *fa_version_string(void);       /* "MAJOR.MINOR.PATCH" */
FA_API unsigned fa_version_number(void);          /* FA_VERSION_NUMBER of the loaded library */

typedef enum fa_backend { FA_BACKEND_AUTO = 0, FA_BACKEND_CPU = 1, FA_BACKEND_CUDA = 2, FA_BACKEND_HIP = 3 } fa_backend;
/* The last three (added in 0.6) are element types of a quantised KV cache's k and v only (see
 * "Quantised KV caches" below); every other tensor is F32, F16 or BF16. */
typedef enum fa_dtype {
    FA_DTYPE_F32 = 0,
    FA_DTYPE_F16 = 1,
    FA_DTYPE_BF16 = 2,
    FA_DTYPE_I8 = 3,       /* int8 codes with an f32 scale per (token, kv head) */
    FA_DTYPE_FP8_E4M3 = 4, /* OCP FP8 E4M3 ("fn": no infinities) with an f32 descale per (sequence, kv head) */
    FA_DTYPE_FP8_E5M2 = 5  /* OCP FP8 E5M2 with an f32 descale per (sequence, kv head) */
} fa_dtype;

FA_API const char *fa_backend_name(fa_backend backend); /* "auto", "cpu", "cuda", "hip" or "unknown" */

/* ---- contexts ------------------------------------------------------------------------------ */
typedef struct fa_context fa_context;

/* AUTO picks CUDA, then HIP, then CPU; the environment variable FLASHATTN_BACKEND=cpu|cuda|hip
 * overrides AUTO. An explicit backend is never overridden. */
FA_API fa_status fa_context_create(fa_backend backend, int device, fa_context **ctx);
FA_API void fa_context_destroy(fa_context *ctx);
FA_API fa_backend fa_context_backend(const fa_context *ctx); /* FA_BACKEND_AUTO for NULL */
/* 1 when the backend is built, its runtime loads and it sees at least one device. */
FA_API int fa_backend_available(fa_backend backend);
FA_API fa_status fa_context_set_num_threads(fa_context *ctx, int n); /* CPU; 0 = OpenMP default */
FA_API fa_status fa_context_set_stream(fa_context *ctx, void *stream); /* GPU backends; NULL = default */
/* Waits for the context's queued work. GPU backends: also reports (and clears) a failed device-side
 * check of a varlen or KV-cache call's tables, as FA_ERROR_INVALID_VALUE. */
FA_API fa_status fa_synchronize(fa_context *ctx);

/* Memory of the context's backend: host memory on CPU, device memory on GPUs. */
FA_API fa_status fa_malloc(fa_context *ctx, size_t bytes, void **ptr);
FA_API fa_status fa_free(fa_context *ctx, void *ptr); /* NULL ptr is a no-op */
FA_API fa_status fa_memcpy_h2d(fa_context *ctx, void *dst, const void *src, size_t bytes);
FA_API fa_status fa_memcpy_d2h(fa_context *ctx, void *dst, const void *src, size_t bytes);

/* ---- tensors and problem description ------------------------------------------------------ */
typedef struct fa_tensor {
    void *data;
    fa_dtype dtype;
    int64_t batch, seqlen, heads, head_dim;
    /* In elements. All three 0 = packed [batch, seqlen, heads, head_dim]; otherwise all positive.
     * The head_dim stride is always 1. */
    int64_t stride_batch, stride_seq, stride_head;
} fa_tensor;

typedef struct fa_block_mask {
    int32_t block_q, block_k; /* tokens per mask block: any positive sizes */
    int64_t rows, cols;       /* ceil(seqlen_q/block_q), ceil(seqlen_k/block_k) */
    const uint8_t *mask;      /* host memory, row-major rows x cols; nonzero = attend */
} fa_block_mask;

/* Packed batch: q, out (and dq, dout) have batch = 1 and seqlen = total query tokens; k, v (and
 * dk, dv) batch = 1 and seqlen = total key tokens. Sequence b owns rows
 * [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q and [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k/v.
 * The offset arrays live in the context's memory (device memory on GPU backends: no host sync). */
typedef struct fa_varlen {
    int64_t batch;
    const int32_t *cu_seqlens_q, *cu_seqlens_k; /* [batch + 1], non-decreasing, first 0 */
    int64_t max_seqlen_q, max_seqlen_k;         /* upper bounds of the per-sequence lengths */
} fa_varlen;

/* An additive score bias [batch, heads_q, seqlen_q, seqlen_k] (varlen: [batch, heads_q,
 * max_seqlen_q, max_seqlen_k], indexed from each sequence's first row and key): element (b, h, i,
 * j) at data[b * stride_batch + h * stride_head + i * stride_q + j], in the context's memory.
 * Strides are in elements and >= 0; 0 broadcasts along that axis; the key stride is 1. */
typedef struct fa_bias {
    void *data;
    fa_dtype dtype;
    int64_t stride_batch, stride_head, stride_q;
} fa_bias;

typedef struct fa_attention_desc {
    size_t struct_size;                /* sizeof(fa_attention_desc), set by fa_attention_desc_init */
    float softmax_scale;               /* tau; 0 means 1/sqrt(head_dim) */
    int causal;                        /* bottom-right aligned when seqlen_q != seqlen_k */
    int32_t window_left, window_right; /* sliding window, -1 = unbounded */
    const int32_t *seqlens_k;          /* [batch] valid keys per sequence, host memory; NULL = all */
    float dropout_p;                   /* in [0, 1) */
    uint64_t dropout_seed, dropout_offset;
    const fa_block_mask *block_mask;   /* NULL = dense; with varlen: per sequence, see below */
    /* Added in 0.2 (the fields above are the smallest struct_size accepted). */
    const fa_varlen *varlen;           /* NULL = the usual [batch, seqlen, ...] layout */
    /* Added in 0.3: score modifiers, applied in this order to s = tau * q.k (see README "Score
     * modifiers"); all default off. Masked scores stay masked. */
    float softcap;                     /* > 0: s = softcap * tanh(s / softcap); 0 = off */
    const float *alibi_slopes;         /* [heads_q] or [batch, heads_q] (alibi_per_batch = 1), fp32,
                                          context's memory: s -= slope * |i + seqlen_k - seqlen_q - j| */
    int alibi_per_batch;               /* 0 or 1 */
    const float *sinks;                /* [heads_q] fp32 logits, context's memory: each row's softmax
                                          denominator gains exp(sink_h) (in its max and its lse) */
    const fa_bias *bias;               /* additive bias, last; NULL = none */
    /* Added in 0.4: this call is one block of a larger problem (context parallelism, ring
     * attention). q holds global query rows [q_offset, q_offset + seqlen_q) and k/v global keys
     * [k_offset, k_offset + seqlen_k) of a problem with seqlen_q_global queries and seqlen_k_global
     * keys (0 = this call's seqlen_q / seqlen_k). Causal, window and ALiBi use global positions
     * (query i at key position q_offset + i + seqlen_k_global - seqlen_q_global), and dropout draws
     * the global element ((b * heads_q + h) * seqlen_q_global + q_offset + i) * seqlen_k_global +
     * k_offset + j, so a split run equals the slices of the unsplit one (merge key blocks with
     * fa_merge_partials). seqlens_k, block_mask and bias stay local to this block's keys/rows.
     * fa_forward and fa_backward only (varlen and the KV cache: FA_ERROR_NOT_SUPPORTED); every
     * backend (CPU, CUDA, HIP); a backend without it returns FA_ERROR_NOT_SUPPORTED. */
    int64_t q_offset, k_offset;
    int64_t seqlen_q_global, seqlen_k_global;
    /* Added in 0.5: fa_forward_kvcache's split-KV chunk size in keys (0 = the library's rule). Each
     * sequence's keys are cut into chunks [c * size, (c + 1) * size) whose partial results are
     * merged in increasing c, on every backend alike; the default size depends on the sequence's own
     * key count only (1024 keys, grown in steps of 1024 so that no sequence has more than 64 chunks;
     * a smaller size gives a small batch more parallelism, e.g. on a large GPU).
     * Either way a sequence's output does not depend on what else is in the batch. */
    int64_t kv_split_tokens;
    /* Added in 0.6: the scales of a quantised KV cache (fa_kv_scales below), and rotary position
     * embeddings applied by the KV-cache calls (fa_rotary below); NULL = none. */
    const struct fa_kv_scales *kv_scales;
    const struct fa_rotary *rotary;
} fa_attention_desc;

/* struct_size = sizeof, scale 0, no masks, windows -1, no dropout, no varlen, no modifiers. */
FA_API void fa_attention_desc_init(fa_attention_desc *desc);

/* O = softmax(tau * Q K^T, masked) V per (batch, query head); lse [batch, heads_q, seqlen_q] fp32,
 * natural log, in the tensors' memory space, may be NULL. Rows with no visible key give zeros
 * and lse = -INFINITY (with desc->sinks: lse = sink_h). k and v may have fewer heads than q (GQA/MQA). */
FA_API fa_status fa_forward(fa_context *ctx, const fa_attention_desc *desc,
                            const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                            fa_tensor *out, float *lse);

/* out = merge of n partial results of the same queries over disjoint key sets, by lse, in the
 * order given (deterministic); lse_out may alias nothing. Rows whose every part is -inf stay zero.
 * outs[x]: n tensors of out's shape and dtype, in the context's memory; lses[x] and lse_out:
 * [batch, heads, seqlen] fp32 (fa_forward's layout), lse_out may be NULL. A part with lse -inf
 * contributes nothing; each row is summed over the parts in the order 0..n-1 in f32, so the
 * result does not depend on thread counts. out and lse_out must not overlap any input (nor each
 * other). n >= 1. Any backend: the CPU merges on the host, the GPU plugins on the device (the same
 * arithmetic; a plugin of an older ABI returns FA_ERROR_NOT_SUPPORTED). */
FA_API fa_status fa_merge_partials(fa_context *ctx, int n, const fa_tensor *const *outs,
                                   const float *const *lses, fa_tensor *out, float *lse_out);

/* Varlen (desc->varlen != NULL): lse is [heads_q, total_q] (FlashAttention-2's layout). Causal
 * and window align bottom-right within each sequence (j <= i + len_k(b) - len_q(b));
 * desc->seqlens_k must be NULL; a block mask has ceil(max_seqlen_q / block_q) x
 * ceil(max_seqlen_k / block_k) blocks and applies to each sequence from its first row and key.
 * Sequences of length 0 are allowed. Dropout draws the element of the padded layout,
 * e = ((b * heads_q + h) * max_seqlen_q + i) * max_seqlen_k + j, so a packed batch and the same
 * batch padded to [batch, max_seqlen_q] / [batch, max_seqlen_k] with seqlens_k give the same
 * results. Every backend. On GPU backends the offsets are device memory and are checked on the
 * device (no host synchronisation): wrong offsets make the call write nothing, and the next
 * fa_synchronize returns FA_ERROR_INVALID_VALUE naming them. */

/* Gradients by recomputation (Algorithm 4). lse must be the one fa_forward returned for the same
 * inputs and desc (same dropout seed and offset). dk/dv sum over the query heads of a group. */
FA_API fa_status fa_backward(fa_context *ctx, const fa_attention_desc *desc,
                             const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                             const fa_tensor *out, const fa_tensor *dout, const float *lse,
                             fa_tensor *dq, fa_tensor *dk, fa_tensor *dv);

/* fa_backward plus the gradients of the learnable score modifiers (fa_backward is this call with
 * both NULL). dsinks: [heads_q] fp32 in the context's memory, needs desc->sinks; it sums over
 * batches and rows. dbias: needs desc->bias, has its broadcast (the same strides zero; the others
 * may differ but must not make two elements share memory), any dtype; a broadcast axis is summed
 * in a fixed order (deterministic). Every element of dbias's extent is written. */
FA_API fa_status fa_backward_ex(fa_context *ctx, const fa_attention_desc *desc, const fa_tensor *q,
                                const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                                const fa_tensor *dout, const float *lse, fa_tensor *dq, fa_tensor *dk,
                                fa_tensor *dv, float *dsinks, const fa_bias *dbias);

/* ---- KV-cache decode -------------------------------------------------------------------------- */
typedef struct fa_kv_cache {
    fa_tensor k, v;               /* contiguous: [batch, capacity, heads_kv, d];
                                     paged: [num_pages, page_size, heads_kv, d] (batch = num_pages,
                                     seqlen = page_size), any page_size >= 1 */
    const int32_t *block_table;   /* paged: [batch, max_pages_per_seq] page indices; NULL = contiguous */
    int64_t max_pages_per_seq;
    const int32_t *cache_seqlens; /* [batch] tokens already in the cache */
} fa_kv_cache;                    /* block_table and cache_seqlens: context's memory */

/* q [batch, seqlen_q, heads_q, d]. If k_new/v_new ([batch, seqlen_new, heads_kv, d]) are given they
 * are first written into the cache at positions cache_seqlens[b] .. + seqlen_new - 1 (through the
 * block table when paged); then q attends to the first cache_seqlens[b] + seqlen_new keys of
 * sequence b, with the desc's scale, causal (bottom-right), window and score modifiers (key j = cache
 * position j: a bias is [batch, heads_q, seqlen_q, capacity], ALiBi uses each sequence's length).
 * cache_seqlens is not modified. Forward only; dropout_p > 0 -> FA_ERROR_NOT_SUPPORTED.
 * lse: [batch, heads_q, seqlen_q] or NULL. desc->seqlens_k must be NULL (the lengths come from
 * cache_seqlens); desc->varlen packs ragged queries (below); a block mask or block positions are
 * FA_ERROR_NOT_SUPPORTED. Every tensor has q's dtype (a quantised cache's k and v: below). A length or page check that fails returns
 * FA_ERROR_INVALID_VALUE naming the sequence, with nothing written to the cache or the outputs.
 * Results are bit-identical across runs and thread counts, and a sequence's result does not depend
 * on the other sequences of the batch: long caches are split into key chunks by the rule of
 * desc->kv_split_tokens, merged by lse in a fixed order. Every backend. On GPU backends block_table and cache_seqlens are device
 * memory, checked on the device: a failed length or page check makes the call write nothing (not
 * to the cache either), the call itself returns FA_SUCCESS, and the next fa_synchronize returns
 * FA_ERROR_INVALID_VALUE naming the sequence. */
FA_API fa_status fa_forward_kvcache(fa_context *ctx, const fa_attention_desc *desc, const fa_tensor *q,
                                    const fa_kv_cache *cache, const fa_tensor *k_new, const fa_tensor *v_new,
                                    fa_tensor *out, float *lse);

/* Ragged queries (desc->varlen != NULL, added in 0.5): a serving step where every sequence has its
 * own query length (0 allowed), e.g. chunked prefills mixed with one-token decodes. varlen->batch
 * sequences; q and out are packed [1, total_q, heads_q, d], sequence b's queries rows
 * [cu_seqlens_q[b], cu_seqlens_q[b + 1]) (max_seqlen_q bounds their lengths); lse [heads_q, total_q].
 * k_new/v_new, when given, are packed [1, total_new, heads_kv, d] by cu_seqlens_k (max_seqlen_k its
 * bound), or by cu_seqlens_q when cu_seqlens_k is NULL (then total_new = total_q); without k_new,
 * cu_seqlens_k must be NULL. Sequence b appends its new tokens at cache_seqlens[b] and its queries
 * are aligned at the end of its keys (causal bottom-right, windows, ALiBi on its own lengths); a
 * bias is [batch, heads_q, max_seqlen_q, capacity]. cache_seqlens and block_table have varlen->batch
 * rows, as has a contiguous cache. The offsets are in the context's memory and checked like the
 * lengths (on GPU backends on the device, reported by the next fa_synchronize). */

/* Where each sequence's contiguous cache row is (added in 0.5; fa_kv_slots_init). Both arrays
 * [batch] int32 in the context's memory, NULL = the default. Sequence b reads and appends row
 * cache_batch_idx[b] of the cache tensors (default b; the cache may have any number of rows;
 * sequences that append must use distinct rows), and ignores that row's first cache_leftpad[b]
 * positions (default 0; at most cache_seqlens[b]): its keys are positions cache_leftpad[b] ..
 * cache_seqlens[b] + new - 1, key j at position cache_leftpad[b] + j (causal alignment, ALiBi, and
 * a bias's key index count from there). Contiguous caches only (paged: FA_ERROR_NOT_SUPPORTED). */
typedef struct fa_kv_slots {
    size_t struct_size; /* sizeof(fa_kv_slots), set by fa_kv_slots_init */
    const int32_t *cache_batch_idx;
    const int32_t *cache_leftpad;
} fa_kv_slots;
FA_API void fa_kv_slots_init(fa_kv_slots *slots);

/* ---- capturable calls (CUDA graphs, HIP graphs), added in 0.5 ------------------------------------ */
/* The workspace bytes fa_forward_kvcache_ex needs for these arguments (the same ones the call will
 * get; shapes only, no table is read): 0 on backends whose memory is the host's. */
FA_API fa_status fa_workspace_size(fa_context *ctx, const fa_attention_desc *desc, const fa_tensor *q,
                                   const fa_kv_cache *cache, const fa_kv_slots *slots, const fa_tensor *k_new,
                                   const fa_tensor *v_new, const fa_tensor *out, const float *lse, size_t *bytes);
/* Hands the context the caller's workspace: `bytes` of the context's memory, used by every later
 * call instead of the backend's own (which is freed); the caller keeps it alive until the context
 * is destroyed or another workspace is set (ptr NULL: the backend's own again). A call that needs
 * more than it holds returns FA_ERROR_INVALID_VALUE naming the bytes needed, writing nothing.
 * With it, and block_table, cache_seqlens and the packed offsets in device memory, a
 * fa_forward_kvcache(_ex) call only enqueues kernels on the context's stream: no allocation, no
 * host<->device copy, no synchronisation, so it can be captured into a CUDA or HIP graph and
 * replayed (the tables are read when the graph runs). Backends whose memory is the host's need none
 * and accept the call (nothing to capture there); a plugin built before 0.5 returns
 * FA_ERROR_NOT_SUPPORTED. */
FA_API fa_status fa_context_set_workspace(fa_context *ctx, void *workspace, size_t bytes);

/* ---- quantised KV caches (added in 0.6) --------------------------------------------------------- */
/* The cache's k and v (fa_kv_cache) may hold codes of FA_DTYPE_I8, FA_DTYPE_FP8_E4M3 or
 * FA_DTYPE_FP8_E5M2, each its own (k int8 and v fp8 is allowed); q, out, k_new and v_new stay
 * F32/F16/BF16. New tokens are quantised as they are appended; attention reads the codes, turns
 * them into f32 in registers and accumulates in f32, so the result is the attention over the
 * dequantised cache (value = code x scale) to the usual f32 accuracy. The scales come through
 * desc->kv_scales, in the context's memory:
 *  - FA_DTYPE_I8: k_scale / v_scale, one f32 per cached (token, kv head), laid out like the cache
 *    tensor without its last dimension and packed: element (x, s, h) of a cache [X, S, heads_kv, d]
 *    (contiguous: rows x capacity; paged: pages x page_size, so the block table indexes both) is
 *    scale[(x * S + s) * heads_kv + h]. An appended token's scale is max|element| / 127 (0 for a
 *    zero row) and its codes round(element / scale) to nearest even, in [-127, 127]; a row with a
 *    NaN or infinite element gets scale NaN and codes 0 (attention to it gives NaN, as an unquantised
 *    cache's NaN does). The scales are written with the codes.
 *  - FP8: k_descale / v_descale, [batch, heads_kv] f32 per sequence and kv head, finite and positive
 *    (FlashAttention-3's), NULL = 1. The value is fp8(code) x descale; an appended element x is
 *    stored as the OCP conversion of the f32 x / descale: round to nearest even, saturating (beyond
 *    the largest finite, and infinities, become the largest finite of that sign: 448 for E4M3,
 *    57344 for E5M2), NaN becomes 0x7F. Codes decode exactly as OCP defines them (NaN codes give NaN,
 *    E5M2's 0x7C/0xFC infinities).
 * A missing scale, a non-finite or non-positive descale, or scales given for an unquantised cache
 * are FA_ERROR_INVALID_VALUE naming them, with nothing written (on GPU backends the descales are
 * checked on the device, reported by the next fa_synchronize). Every backend, on every path of the
 * KV-cache calls (split, paged, ragged queries, slots, rotary, score modifiers); a plugin built
 * before 0.6 returns FA_ERROR_NOT_SUPPORTED. */
typedef struct fa_kv_scales {
    size_t struct_size;                 /* sizeof(fa_kv_scales), set by fa_kv_scales_init */
    float *k_scale, *v_scale;           /* FA_DTYPE_I8 k / v: per (token, kv head); else NULL */
    const float *k_descale, *v_descale; /* FP8 k / v: [batch, heads_kv]; NULL = 1; else NULL */
} fa_kv_scales;
FA_API void fa_kv_scales_init(fa_kv_scales *scales);

/* ---- rotary position embeddings on append (added in 0.6) ------------------------------------------ */
/* With desc->rotary, fa_forward_kvcache(_ex) and fa_kvcache_append rotate the new keys before they
 * are stored (and quantised), and fa_forward_kvcache(_ex) rotates the queries, as FlashAttention-2's
 * flash_attn_with_kvcache does (rotary_cos, rotary_sin, rotary_interleaved). A token's position is
 * its key index in its sequence (cache position minus cache_leftpad): new token t of sequence b is
 * at cache_seqlens[b] - leftpad + t; query i at cache_seqlens[b] - leftpad + i when desc->causal or
 * a window is set (the new tokens' positions, when queries and new tokens are the same tokens),
 * else every query at cache_seqlens[b] - leftpad (FlashAttention-2's rule). Queries are rotated
 * with or without k_new (FlashAttention-2 rotates them only with new tokens: leave desc->rotary
 * NULL for a call whose queries are not the new tokens).
 * Dims d < rotary_dim are rotated in pairs with angle index f < rotary_dim / 2:
 *  - interleaved = 0 (GPT-NeoX, halves): (x[f], x[f + rotary_dim / 2]);
 *  - interleaved = 1 (GPT-J): (x[2f], x[2f + 1]);
 * each pair (a, b) becomes (a cos - b sin, b cos + a sin) with cos = cos[pos * ldc + f] and
 * sin = sin[pos * ldc + f], ldc = rotary_dim / 2, computed in f32 and rounded to the tensor's dtype
 * (the query's; the cache's, or quantised for a quantised cache). Dims past rotary_dim are unchanged.
 * The tables are f32 [max_position, rotary_dim / 2] in the context's memory. A position at or past
 * max_position is FA_ERROR_INVALID_VALUE naming the sequence, with nothing written (checked like the
 * cache lengths: on GPU backends by the next fa_synchronize). Every backend, every path of the
 * KV-cache calls; a plugin built before 0.6 returns FA_ERROR_NOT_SUPPORTED. */
typedef struct fa_rotary {
    size_t struct_size;     /* sizeof(fa_rotary), set by fa_rotary_init */
    const float *cos, *sin; /* [max_position, rotary_dim / 2] f32 */
    int64_t max_position;   /* rows of cos and sin */
    int64_t rotary_dim;     /* even, 2 <= rotary_dim <= head_dim */
    int interleaved;        /* 0: GPT-NeoX halves; 1: GPT-J pairs */
} fa_rotary;
FA_API void fa_rotary_init(fa_rotary *rotary);

/* Writes k_new/v_new into the cache at cache_seqlens[b] .. + new - 1 (through the block table when
 * paged; cache rows and left padding of slots), rotating the keys with desc->rotary and quantising
 * for a quantised cache (desc->kv_scales), exactly as fa_forward_kvcache(_ex) appends, without
 * attention: for prefill-written caches. k_new/v_new are [batch, seqlen_new, heads_kv, d] of F32,
 * F16 or BF16 (the cache's dtype when it is not quantised); with desc->varlen they are packed
 * [1, total_new, ...] by desc->varlen->cu_seqlens_k (varlen->batch sequences; cu_seqlens_q must be
 * NULL: there are no queries). Only desc->varlen, kv_scales and rotary are read. cache_seqlens is
 * not modified; checks as fa_forward_kvcache's (nothing written on failure). */
FA_API fa_status fa_kvcache_append(fa_context *ctx, const fa_attention_desc *desc, const fa_kv_cache *cache,
                                   const fa_kv_slots *slots, const fa_tensor *k_new, const fa_tensor *v_new);

/* fa_forward_kvcache with the cache rows of slots (NULL: fa_forward_kvcache). */
FA_API fa_status fa_forward_kvcache_ex(fa_context *ctx, const fa_attention_desc *desc, const fa_tensor *q,
                                       const fa_kv_cache *cache, const fa_kv_slots *slots, const fa_tensor *k_new,
                                       const fa_tensor *v_new, fa_tensor *out, float *lse);

/* ---- tiling ---------------------------------------------------------------------------------- */
typedef struct fa_tiling { int64_t block_rows, block_cols; } fa_tiling; /* Br, Bc */
/* The paper's Bc = ceil(M/4d), Br = min(ceil(M/4d), d) for an on-chip memory of M elements.
 * Returns {0, 0} for non-positive arguments. */
FA_API fa_tiling fa_tiling_for(int64_t sram_elements, int64_t head_dim);
/* The tile sizes the context's backend derives for head_dim and dtype (the paper's rule, snapped to
 * its kernels) and the on-chip memory (in elements) it derived them from. A pass may run other
 * query-tile heights from them (the CPU forward's: docs/CPU.md, "Tiles" and "Drivers"). */
FA_API fa_status fa_context_tiling(fa_context *ctx, int64_t head_dim, fa_dtype dtype,
                                   fa_tiling *tiling, int64_t *sram_elements);
/* One line describing the backend: device, ISA or architecture, memory sizes. */
FA_API const char *fa_context_info(fa_context *ctx);

/* ---- dropout ---------------------------------------------------------------------------------- */
/* Writes the keep mask (1 = kept, 0 = dropped) of the dropout stream for one (batch, query head)
 * pair into keep[seqlen_q * seqlen_k] (host memory, row-major). The stream is the same on every
 * backend; see README "Dropout stream". */
FA_API fa_status fa_dropout_mask(uint64_t seed, uint64_t offset, float dropout_p,
                                 int64_t heads_q, int64_t seqlen_q, int64_t seqlen_k,
                                 int64_t batch_index, int64_t head_index, uint8_t *keep);

/* ---- block-sparse mask helpers ------------------------------------------------------------- */
/* Fill mask[rows * cols] (host memory). Butterfly: block (r, c) is set when r == c or r XOR c is a
 * power of two (the pattern of the paper's block-sparse experiments), computed on the square
 * max(rows, cols) grid. Local + global: block (r, c) is set when |r - c| <= local_blocks, or
 * r < global_blocks, or c < global_blocks. */
FA_API fa_status fa_block_mask_butterfly(int64_t rows, int64_t cols, uint8_t *mask);
FA_API fa_status fa_block_mask_local_global(int64_t rows, int64_t cols, int64_t local_blocks,
                                            int64_t global_blocks, uint8_t *mask);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_H */

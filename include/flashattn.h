/*
 * flashattn: exact attention with IO-aware tiling (FlashAttention, Dao et al. 2022)
 * behind one backend-neutral C API. CPU, CUDA and HIP backends are picked at run time.
 *
 * Conventions
 *  - Every function that can fail returns an fa_status; on failure fa_last_error() holds a
 *    one-line message (thread-local) that names the offending argument.
 *  - Handles are opaque; destroy functions accept NULL.
 *  - Tensors live in the memory of the context's backend (host memory for the CPU backend,
 *    device memory for GPU backends). Mask arrays (seqlens_k, block masks) are always host memory.
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
#define FA_VERSION_MINOR 1
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
typedef enum fa_dtype { FA_DTYPE_F32 = 0, FA_DTYPE_F16 = 1, FA_DTYPE_BF16 = 2 } fa_dtype;

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

typedef struct fa_attention_desc {
    float softmax_scale;               /* tau; 0 means 1/sqrt(head_dim) */
    int causal;                        /* bottom-right aligned when seqlen_q != seqlen_k */
    int32_t window_left, window_right; /* sliding window, -1 = unbounded */
    const int32_t *seqlens_k;          /* [batch] valid keys per sequence, host memory; NULL = all */
    float dropout_p;                   /* in [0, 1) */
    uint64_t dropout_seed, dropout_offset;
    const fa_block_mask *block_mask;   /* NULL = dense */
} fa_attention_desc;

FA_API void fa_attention_desc_init(fa_attention_desc *desc); /* scale 0, no masks, windows -1, no dropout */

/* O = softmax(tau * Q K^T, masked) V per (batch, query head); lse [batch, heads_q, seqlen_q] fp32,
 * natural log, in the tensors' memory space, may be NULL. Rows with no visible key give zeros
 * and lse = -INFINITY. k and v may have fewer heads than q (GQA/MQA). */
FA_API fa_status fa_forward(fa_context *ctx, const fa_attention_desc *desc,
                            const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                            fa_tensor *out, float *lse);

/* Gradients by recomputation (Algorithm 4). lse must be the one fa_forward returned for the same
 * inputs and desc (same dropout seed and offset). dk/dv sum over the query heads of a group. */
FA_API fa_status fa_backward(fa_context *ctx, const fa_attention_desc *desc,
                             const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                             const fa_tensor *out, const fa_tensor *dout, const float *lse,
                             fa_tensor *dq, fa_tensor *dk, fa_tensor *dv);

/* ---- tiling ---------------------------------------------------------------------------------- */
typedef struct fa_tiling { int64_t block_rows, block_cols; } fa_tiling; /* Br, Bc */
/* The paper's Bc = ceil(M/4d), Br = min(ceil(M/4d), d) for an on-chip memory of M elements.
 * Returns {0, 0} for non-positive arguments. */
FA_API fa_tiling fa_tiling_for(int64_t sram_elements, int64_t head_dim);
/* The tile sizes the context's backend uses for head_dim and dtype, after snapping to its kernels,
 * and the on-chip memory (in elements) it derived them from. */
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

/* What the libFuzzer targets share: reading the input byte by byte (a missing byte reads as 0, so
 * every input decodes to a problem), a seeded generator, the untouched-canary check, the oracle
 * tolerance of a forward result, and the CPU context. FUZZ_TARGET names the target in messages. */
#ifndef FA_FUZZ_COMMON_H
#define FA_FUZZ_COMMON_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "cpu/cpu_backend.h"
#include "flashattn.h"

/* Bound on a problem's query-key pairs * heads_q * head_dim (what the oracle and the instrumented
 * library cost): every execution stays short, and large head dims stay reachable with short
 * sequences. */
#define FUZZ_WORK_CAP 65536

/* head_dim lowered (to 1 at least) so that pairs * heads_q * head_dim stays within FUZZ_WORK_CAP;
 * pairs: batch * seqlen_q * seqlen_k, or a packed batch's sum over sequences. */
static inline int64_t fuzz_capped_head_dim(int64_t head_dim, int64_t pairs, int64_t heads_q)
{
    const int64_t cap = FUZZ_WORK_CAP / ((pairs > 0 ? pairs : 1) * heads_q);
    return head_dim > cap ? (cap > 1 ? cap : 1) : head_dim;
}

/* For the helpers that only compute expected results and compare: without the fuzzer's coverage
 * callbacks (they guide nothing, and in the fp64 comparison loops they cost most of the time). */
#if defined(__clang__)
#  define FUZZ_CHECKER __attribute__((no_sanitize("coverage")))
#else
/* gcc has no such attribute (it would warn); its builds (fuzz/replay_main.c) have no fuzzer callbacks. */
#  define FUZZ_CHECKER
#endif

typedef struct reader {
    const uint8_t *data;
    size_t size, pos;
} reader;

/* Next byte of the input, 0 once it is exhausted: every input decodes to some problem. pos counts
 * the bytes decoded, those read past the end included. */
static inline uint8_t next(reader *r)
{
    const size_t at = r->pos++;
    return at < r->size ? r->data[at] : 0;
}
static inline uint64_t next_u64(reader *r)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | next(r);
    return v;
}

static inline uint64_t splitmix(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Strides with gaps of 0..3 elements after each dimension (layout bits 0-1 head, 2-3 row, 4-5
 * batch), in [batch, seqlen, heads, d] order or, with bit 6, [batch, heads, seqlen, d]; returns one
 * past t's largest element offset (t's sizes set). */
static inline int64_t set_gapped_strides(fa_tensor *t, uint8_t layout)
{
    const int64_t gap_head = layout & 3, gap_row = (layout >> 2) & 3, gap_batch = (layout >> 4) & 3;
    if (layout & 64) { /* [batch, heads, seqlen, d] */
        t->stride_seq = t->head_dim + gap_row;
        t->stride_head = t->seqlen * t->stride_seq + gap_head;
        t->stride_batch = t->heads * t->stride_head + gap_batch;
    } else {
        t->stride_head = t->head_dim + gap_head;
        t->stride_seq = t->heads * t->stride_head + gap_row;
        t->stride_batch = t->seqlen * t->stride_seq + gap_batch;
    }
    return (t->batch - 1) * t->stride_batch + (t->seqlen - 1) * t->stride_seq + (t->heads - 1) * t->stride_head +
           t->head_dim;
}

/* One sink per head from the input (byte 255: -inf, a head without a sink; else -16..16); returns
 * the largest finite |sink|. */
static inline double decode_sinks(reader *r, int64_t heads, float *sinks)
{
    double max_sink = 0.0;
    for (int64_t h = 0; h < heads; ++h) {
        const uint8_t b = next(r);
        sinks[h] = b == 255 ? -INFINITY : (float)(b % 33) - 16.0f;
        if (b != 255 && fabs((double)sinks[h]) > max_sink) max_sink = fabs((double)sinks[h]);
    }
    return max_sink;
}

/* The CPU backend's tile budget from one byte (fa_cpu_debug_tile_bytes): 0, or a missing byte,
 * keeps the tiles cut for the L2; b > 0 gives 256 b bytes, key tiles of 16 up to ~1000 columns,
 * so that the fuzzer's short sequences cross key and query tile boundaries (the online softmax's
 * rescaling, the backward's chained dQ) as long ones do. */
static inline int64_t decode_tile_bytes(reader *r) { return (int64_t)next(r) * 256; }

/* Element offset of (b, i, h, c) in t: its strides, or the packed [batch, seqlen, heads, head_dim]
 * layout when they are 0. */
FUZZ_CHECKER static inline size_t tensor_offset(const fa_tensor *t, int64_t b, int64_t i, int64_t h, int64_t c)
{
    const int64_t packed = t->stride_batch == 0;
    const int64_t sb = packed ? t->seqlen * t->heads * t->head_dim : t->stride_batch;
    const int64_t ss = packed ? t->heads * t->head_dim : t->stride_seq;
    const int64_t sh = packed ? t->head_dim : t->stride_head;
    return (size_t)(b * sb + i * ss + h * sh + c);
}

/* Element o of an f32, f16 or bf16 tensor, and its store with the dtype's rounding. */
FUZZ_CHECKER static inline double tensor_get(const fa_tensor *t, size_t o)
{
    switch (t->dtype) {
    case FA_DTYPE_F16: return fa_f16_to_f32(((const uint16_t *)t->data)[o]);
    case FA_DTYPE_BF16: return fa_bf16_to_f32(((const uint16_t *)t->data)[o]);
    default: return ((const float *)t->data)[o];
    }
}

FUZZ_CHECKER static inline void tensor_set(fa_tensor *t, size_t o, float x)
{
    switch (t->dtype) {
    case FA_DTYPE_F16: ((uint16_t *)t->data)[o] = fa_f32_to_f16(x); break;
    case FA_DTYPE_BF16: ((uint16_t *)t->data)[o] = fa_f32_to_bf16(x); break;
    default: ((float *)t->data)[o] = x; break;
    }
}

/* 1 when every byte still holds the 0xff canary. */
FUZZ_CHECKER static inline int all_ff(const void *data, size_t bytes)
{
    const uint8_t *b = data;
    for (size_t i = 0; i < bytes; ++i)
        if (b[i] != 0xff) return 0;
    return 1;
}

/* The rounding of storing a result in dtype. */
static inline double storage_error(fa_dtype dtype)
{
    return dtype == FA_DTYPE_F32 ? 0x1p-22 : dtype == FA_DTYPE_F16 ? 0x1p-10 : 0x1p-7;
}

/* Tolerance on a forward result of magnitude `magnitude` from scores up to score_max: the storage
 * rounding of the dtype plus f32 rounding of the scores, which exp() turns into a relative error of
 * about eps * |score| in the weights. */
static inline double tolerance(fa_dtype dtype, double magnitude, double score_max)
{
    return (storage_error(dtype) + 64.0 * 0x1p-24 * (1.0 + score_max)) * (1.0 + magnitude);
}

/* The backend every input runs on: the CPU, or with FA_FUZZ_BACKEND=cuda|hip a GPU plugin (in CI the
 * emulated one, through FLASHATTN_PLUGIN_DIR: its host code and kernels then see fuzzed inputs). */
static inline fa_backend fuzz_backend(void)
{
    const char *name = getenv("FA_FUZZ_BACKEND");
    if (!name || !name[0] || !strcmp(name, "cpu")) return FA_BACKEND_CPU;
    if (!strcmp(name, "cuda")) return FA_BACKEND_CUDA;
    if (!strcmp(name, "hip")) return FA_BACKEND_HIP;
    fprintf(stderr, "%s: FA_FUZZ_BACKEND=%s: expected cpu, cuda or hip\n", FUZZ_TARGET, name);
    abort();
}

/* A GPU plugin may refuse a valid problem it has no kernel for (FA_ERROR_NOT_SUPPORTED, with a
 * message, nothing written); the CPU backend must run every valid problem. */
static inline int refusal_allowed(fa_status st) { return st == FA_ERROR_NOT_SUPPORTED && fuzz_backend() != FA_BACKEND_CPU; }

/* The call's status, or on a GPU that of the device-side checks it queued (the tables, slopes and
 * sinks live in device memory: a failed check there makes the call write nothing and the next
 * fa_synchronize return FA_ERROR_INVALID_VALUE). */
static inline fa_status settled(fa_context *ctx, fa_status st) { return st == FA_SUCCESS ? fa_synchronize(ctx) : st; }

/* The context every input runs on (one thread on the CPU; created once). Device memory of the
 * emulated plugins is host memory, so the targets' host buffers serve as device buffers there; on a
 * real GPU these targets would need device copies (not supported: run them emulated). */
static inline fa_context *context(void)
{
    static fa_context *ctx;
    if (!ctx) {
        const fa_backend backend = fuzz_backend();
        if (fa_context_create(backend, 0, &ctx) != FA_SUCCESS ||
            (backend == FA_BACKEND_CPU && fa_context_set_num_threads(ctx, 1) != FA_SUCCESS)) {
            fprintf(stderr, "%s: no %s context: %s\n", FUZZ_TARGET, fa_backend_name(backend), fa_last_error());
            abort();
        }
    }
    return ctx;
}
#endif

/* The case table and the runner: inputs from a fixed seed, rounded to the tested dtype, run
 * through the public API on any backend, compared with the double-precision oracle run on the
 * same rounded inputs (so only the backend's own error is measured). */
#include "harness.h"
#include "test_arrays.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the case table ---------------------------------------------------------------------------
 * Sequence lengths are deliberately not multiples of any tile (1, 7, 33, 129, 1000 ...), except in
 * the full_* cases, whose lengths are whole tiles of every kernel (64 or 128 query rows, 32, 64 or
 * 128 keys), so that a path taken only for full tiles is tested too; block-mask block sizes
 * (3, 17, 64) are unrelated to kernel tiles. Shapes: {batch, heads_q, heads_kv,
 * seqlen_q, seqlen_k, head_dim}. Fields after the shape: scale, causal, window_left, window_right,
 * key_padding, dropout_p, seed, offset, block mask, block_q, block_k, layout. */
#define NO_WINDOW -1, -1
#define NO_DROPOUT 0.0f, 0, 0
#define NO_BLOCKS BLOCK_MASK_NONE, 0, 0
#define SEED_HI 0x1234567890ABCDEFull   /* seed above 2^32 */
#define OFFSET_HI 0x0000000500000007ull /* offset above 2^32 */

const fa_test_case fa_test_cases[] = {
    /* sizes and head dims */
    {"single_token_d16", {1, 1, 1, 1, 1, 16}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"seq7_d40", {2, 2, 2, 7, 7, 40}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"seq129_d72", {1, 2, 2, 129, 129, 72}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"seq65x97_d80", {1, 1, 1, 65, 97, 80}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"seq100_d96_gqa", {1, 2, 1, 100, 100, 96}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"seq50x70_d160", {1, 1, 1, 50, 70, 160}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"seq129_d256", {1, 1, 1, 129, 129, 256}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"seq1000_d16_causal", {1, 1, 1, 1000, 1000, 16}, 0, 1, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"decode_1x1000_d128", {2, 2, 2, 1, 1000, 128}, 0, 1, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"seq1000x7_d32", {1, 1, 1, 1000, 7, 32}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"seq1000_d64_gqa_dropout_causal", {1, 4, 2, 1000, 1000, 64}, 0, 1, NO_WINDOW, 0, 0.1f, SEED_HI, OFFSET_HI, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"seq1000_d128_window_pad", {2, 2, 2, 1000, 1000, 128}, 0, 0, 100, 50, 1, NO_DROPOUT, NO_BLOCKS, LAYOUT_BHSD, 0},
    {"seq1_d256", {1, 2, 2, 1, 1, 256}, 0, 1, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    /* whole tiles only (full_128x128_d32 is small enough for FA_TEST_QUICK=1) */
    {"full_128x128_d32", {1, 1, 1, 128, 128, 32}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"full_256x256_d128", {1, 1, 1, 256, 256, 128}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"full_causal_128x256_d64", {1, 2, 2, 128, 256, 64}, 0, 1, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"full_gqa_4_2_256_d128", {1, 4, 2, 256, 256, 128}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    /* layouts */
    {"bhsd_d128", {2, 4, 4, 33, 45, 128}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_BHSD, 0},
    {"bhsd_gqa_causal_d64", {2, 4, 2, 40, 29, 64}, 0, 1, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_BHSD, 0},
    {"padded_d48", {2, 3, 3, 21, 34, 48}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PADDED, 0},
    /* seqlen_q != seqlen_k, both ways, with causal (bottom-right; the first rows of the longer
     * query side see no key at all) */
    {"causal_q_longer_d64", {2, 2, 2, 129, 33, 64}, 0, 1, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"causal_k_longer_d64", {1, 2, 2, 33, 129, 64}, 0, 1, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"causal_seq129_d32", {1, 3, 3, 129, 129, 32}, 0, 1, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    /* GQA and MQA */
    {"gqa_8_2_d32", {2, 8, 2, 64, 64, 32}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"mqa_8_1_d64", {1, 8, 1, 50, 77, 64}, 0, 1, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    /* sliding windows */
    {"window_left_d32", {1, 2, 2, 200, 200, 32}, 0, 0, 16, -1, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"window_right_d32", {1, 2, 2, 150, 170, 32}, 0, 0, -1, 8, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"window_both_d48", {1, 2, 2, 150, 130, 48}, 0, 0, 20, 5, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"window_zero_causal_d16", {1, 1, 1, 37, 37, 16}, 0, 1, 0, 0, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    /* key padding: one sequence of length zero gives fully masked rows */
    {"key_padding_d64", {4, 2, 2, 37, 61, 64}, 0, 0, NO_WINDOW, 1, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"key_padding_causal_gqa", {3, 4, 2, 61, 45, 32}, 0, 1, NO_WINDOW, 1, NO_DROPOUT, NO_BLOCKS, LAYOUT_BHSD, 0},
    /* block masks, block sizes not dividing the sequence lengths */
    {"block_random_3x17", {1, 2, 2, 129, 129, 64}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, BLOCK_MASK_RANDOM, 3, 17, LAYOUT_PACKED, 0},
    {"block_butterfly_17x3", {1, 2, 2, 100, 90, 32}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, BLOCK_MASK_BUTTERFLY, 17, 3, LAYOUT_PACKED, 0},
    {"block_local_global_64", {1, 1, 1, 300, 300, 32}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, BLOCK_MASK_LOCAL_GLOBAL, 64, 64, LAYOUT_PACKED, 0},
    {"block_random_causal_pad", {3, 2, 1, 70, 80, 40}, 0, 1, NO_WINDOW, 1, NO_DROPOUT, BLOCK_MASK_RANDOM, 17, 64, LAYOUT_PACKED, 0},
    /* dropout */
    {"dropout_0.1_d64", {2, 2, 2, 65, 65, 64}, 0, 0, NO_WINDOW, 0, 0.1f, 42, 0, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"dropout_0.5_hi_seed_offset", {2, 2, 2, 47, 53, 32}, 0, 0, NO_WINDOW, 0, 0.5f, SEED_HI, OFFSET_HI, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"dropout_0.5_causal_pad", {3, 2, 2, 45, 61, 40}, 0, 1, NO_WINDOW, 1, 0.5f, 7, OFFSET_HI, NO_BLOCKS, LAYOUT_BHSD, 0},
    {"dropout_0.1_window_gqa", {1, 4, 2, 90, 70, 32}, 0, 0, 10, 3, 0, 0.1f, SEED_HI, 12345, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"dropout_0.5_butterfly", {1, 2, 2, 64, 64, 16}, 0, 0, NO_WINDOW, 0, 0.5f, 3, 0, BLOCK_MASK_BUTTERFLY, 3, 17, LAYOUT_PACKED, 0},
    {"dropout_0.1_local_global_mqa", {1, 4, 1, 80, 100, 48}, 0, 1, NO_WINDOW, 0, 0.1f, SEED_HI, OFFSET_HI, BLOCK_MASK_LOCAL_GLOBAL, 17, 3, LAYOUT_PACKED, 0},
    {"dropout_0.5_random_blocks", {2, 2, 2, 33, 33, 24}, 0, 0, NO_WINDOW, 1, 0.5f, SEED_HI, 1, BLOCK_MASK_RANDOM, 3, 3, LAYOUT_PACKED, 0},
    /* custom softmax scale */
    {"scale_0.3_d64", {1, 2, 2, 50, 50, 64}, 0.3f, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"scale_neg_0.5_causal", {1, 2, 2, 40, 40, 16}, -0.5f, 1, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    /* fully masked rows from every source at once: causal with more queries than keys, a
     * zero-length sequence, a window that misses rows */
    {"fully_masked_rows", {3, 2, 2, 40, 10, 32}, 0, 1, 2, -1, 1, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, 0},
    {"fully_masked_dropout", {3, 2, 2, 20, 9, 32}, 0, 1, NO_WINDOW, 1, 0.5f, 99, 5, BLOCK_MASK_RANDOM, 3, 2, LAYOUT_PACKED, 0},
    /* score modifiers, alone and combined with every mask, dropout, GQA and layouts; batch x
     * heads_kv >= 8 takes the fused backward, fewer the two-pass one */
    {"softcap_d64", {2, 2, 2, 65, 65, 64}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, MOD_SOFTCAP},
    {"alibi_causal_d32", {2, 4, 4, 70, 90, 32}, 0, 1, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, MOD_ALIBI},
    {"alibi_per_batch_gqa_pad", {3, 4, 2, 50, 60, 32}, 0, 0, NO_WINDOW, 1, NO_DROPOUT, NO_BLOCKS, LAYOUT_BHSD, MOD_ALIBI_PER_BATCH},
    {"sinks_d64", {2, 2, 2, 65, 65, 64}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, MOD_SINKS},
    {"sinks_fully_masked_rows", {3, 2, 2, 40, 10, 32}, 0, 1, 2, -1, 1, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, MOD_SINKS},
    {"bias_full_bhsd", {2, 2, 1, 45, 61, 32}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_BHSD, MOD_BIAS},
    {"bias_broadcast_window", {2, 2, 2, 60, 70, 48}, 0, 0, 10, 5, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED, MOD_BIAS_BROADCAST},
    {"mods_all_dropout_causal_pad", {3, 4, 2, 61, 45, 32}, 0, 1, NO_WINDOW, 1, 0.1f, SEED_HI, OFFSET_HI, NO_BLOCKS, LAYOUT_PADDED,
     MOD_SOFTCAP | MOD_ALIBI_PER_BATCH | MOD_SINKS | MOD_BIAS},
    {"mods_blocks_broadcast", {1, 2, 2, 100, 90, 32}, 0, 0, NO_WINDOW, 0, NO_DROPOUT, BLOCK_MASK_RANDOM, 17, 3, LAYOUT_PACKED,
     MOD_SOFTCAP | MOD_ALIBI | MOD_SINKS | MOD_BIAS_BROADCAST},
    {"mods_fused_backward_scale", {2, 8, 4, 100, 120, 32}, 0.3f, 1, NO_WINDOW, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED,
     MOD_SOFTCAP | MOD_ALIBI | MOD_SINKS | MOD_BIAS},
    {"mods_seq300_tiles_d64", {1, 2, 1, 300, 300, 64}, 0, 1, 200, -1, 0, NO_DROPOUT, NO_BLOCKS, LAYOUT_PACKED,
     MOD_SOFTCAP | MOD_ALIBI | MOD_SINKS | MOD_BIAS_BROADCAST},
};
const size_t fa_test_case_count = sizeof fa_test_cases / sizeof fa_test_cases[0];

/* Cases above this many multiply-adds per pass (batch * heads_q * seqlen_q * seqlen_k * head_dim)
 * are skipped under FA_TEST_QUICK=1. */
#define QUICK_MAX_WORK 1000000.0

/* 1 if `name` is one of the comma-separated names in `list`. */
static int name_listed(const char *list, const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        p += len + (end != NULL);
    }
    return 0;
}

int fa_test_quick(void)
{
    const char *quick = getenv("FA_TEST_QUICK");
    return quick && strcmp(quick, "1") == 0;
}

int fa_case_selected(const fa_test_case *c)
{
    const char *only = getenv("FA_TEST_CASES");
    if (only && *only && !name_listed(only, c->name)) return 0;
    if (!fa_test_quick()) return 1;
    const oracle_shape *s = &c->shape;
    const double work = (double)s->batch * s->heads_q * s->seqlen_q * s->seqlen_k * s->head_dim;
    return work <= QUICK_MAX_WORK;
}

const char *fa_case_filter_unknown(void)
{
    static char unknown[128];
    const char *only = getenv("FA_TEST_CASES");
    if (!only) return NULL;
    for (const char *p = only; *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        int known = 0;
        for (size_t i = 0; i < fa_test_case_count && !known; ++i)
            known = strlen(fa_test_cases[i].name) == len && strncmp(fa_test_cases[i].name, p, len) == 0;
        if (!known) {
            snprintf(unknown, sizeof unknown, "%.*s", (int)(len < 100 ? len : 100), p);
            return unknown;
        }
        p += len + (end != NULL);
    }
    return NULL;
}

/* ---- tolerances ------------------------------------------------------------------------------
 * f32: 1e-4 absolute on outputs, lse and gradients (the foundation issue's bound); the backend
 * accumulates in f32, whose rounding (2^-24 relative) over sums of ~1000 terms stays far below.
 *
 * f16 and bf16: the oracle sees the same rounded inputs, so the error is the backend's own: its
 * f32 arithmetic (negligible), plus the rounding of the result to the dtype, plus, for GPU
 * kernels that round P to the dtype before P V (as FlashAttention does), a relative error of one
 * unit roundoff u on each term of a convex combination of values of magnitude up to ~4.5 (the
 * largest of a few thousand unit normals). Allowed error = tol * max(1, max |reference|):
 *  - f16 (u = 2^-11 = 4.9e-4): result rounding <= u * |x|, P rounding <= u * 4.5 * scale, so
 *    ~5.5u * scale = 2.7e-3 * scale; tol = 4e-3 (1.5x margin).
 *  - bf16 (u = 2^-8 = 3.9e-3): the same budget 5.5u = 2.1e-2; tol = 3e-2.
 * Gradients are sums of such products over a row or column; their scale term already grows with
 * their magnitude. lse is fp32 whatever the dtype and depends only on the scores, which are sums
 * of exact products of the rounded inputs accumulated in f32: it keeps the f32 bound (1e-4). */
double fa_case_tolerance(fa_dtype dtype)
{
    switch (dtype) {
    case FA_DTYPE_F32: return 1e-4;
    case FA_DTYPE_F16: return 4e-3;
    case FA_DTYPE_BF16: return 3e-2;
    default: break; /* quantised caches: tests/core/test_kvcache_quant.c */
    }
    return 0.0;
}

const char *fa_dtype_label(fa_dtype dtype)
{
    switch (dtype) {
    case FA_DTYPE_F32: return "f32";
    case FA_DTYPE_F16: return "f16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_I8: return "i8";
    case FA_DTYPE_FP8_E4M3: return "e4m3";
    case FA_DTYPE_FP8_E5M2: return "e5m2";
    }
    return "unknown";
}

int fa_case_passes(const fa_case_errors *e, fa_dtype dtype, int backward, char *why, size_t why_size)
{
    const struct { const char *name; double error, scale; } q[7] = {
        {"out", e->out, e->out_scale}, {"lse", e->lse, e->lse_scale}, {"dq", e->dq, e->dq_scale},
        {"dk", e->dk, e->dk_scale},    {"dv", e->dv, e->dv_scale},    {"dsinks", e->dsinks, e->dsinks_scale},
        {"dbias", e->dbias, e->dbias_scale},
    };
    const int count = backward ? 7 : 2;
    const double tol = fa_case_tolerance(dtype);
    int ok = 1;
    size_t used = 0;
    if (why && why_size) why[0] = '\0';
    for (int i = 0; i < count; ++i) {
        const int fp32_result = dtype == FA_DTYPE_F32 || i == 1; /* i == 1: lse */
        const double allowed = fp32_result ? fa_case_tolerance(FA_DTYPE_F32) : tol * q[i].scale;
        const int within = q[i].error <= allowed; /* false for NaN */
        ok &= within;
        if (why && used < why_size)
            used += (size_t)snprintf(why + used, why_size - used, "%s%s %.3g (limit %.3g)%s", i ? ", " : "",
                                     q[i].name, q[i].error, allowed, within ? "" : " FAIL");
    }
    return ok;
}

void fa_case_describe(const fa_test_case *c, fa_dtype dtype, char *text, size_t size)
{
    static const char *const mask_names[] = {"", "random", "butterfly", "local_global"};
    static const char *const layout_names[] = {"", " layout=bhsd", " layout=padded"};
    const oracle_shape *s = &c->shape;
    char blocks[64] = "";
    if (c->block_mask != BLOCK_MASK_NONE)
        snprintf(blocks, sizeof blocks, " blocks=%s(%dx%d)", mask_names[c->block_mask], c->block_q, c->block_k);
    snprintf(text, size,
             "%s [%s] b%lld hq%lld hkv%lld sq%lld sk%lld d%lld scale=%g%s wl=%d wr=%d%s p=%g seed=%llu "
             "offset=%llu%s%s modifiers=0x%x",
             c->name, fa_dtype_label(dtype), (long long)s->batch, (long long)s->heads_q, (long long)s->heads_kv,
             (long long)s->seqlen_q, (long long)s->seqlen_k, (long long)s->head_dim, (double)c->softmax_scale,
             c->causal ? " causal" : "", c->window_left, c->window_right, c->key_padding ? " key_padding" : "",
             (double)c->dropout_p, (unsigned long long)c->dropout_seed, (unsigned long long)c->dropout_offset,
             blocks, layout_names[c->layout], c->modifiers);
}

/* ---- inputs ------------------------------------------------------------------------------------ */
/* splitmix64: a small generator of our own, so inputs never depend on the C library. */
static uint64_t next_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double next_uniform(uint64_t *state) { return ((double)(next_u64(state) >> 11) + 0.5) * 0x1p-53; }

static double next_normal(uint64_t *state) /* Box-Muller */
{
    const double u1 = next_uniform(state), u2 = next_uniform(state);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static uint64_t name_seed(const char *name)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *name; ++name) h = (h ^ (unsigned char)*name) * 1099511628211ull;
    return h;
}

/* ---- tensors ----------------------------------------------------------------------------------- */
/* A tensor's host image in the case's layout, and its copy in the context's memory. */
typedef struct case_tensor {
    fa_tensor t;     /* data points to the context's memory */
    void *host;      /* staging buffer, elements of dtype */
    size_t elements; /* of the whole buffer, gaps included */
} case_tensor;

enum tensor_side { QUERY_SIDE, KEY_SIDE }; /* q, out, dout, dq | k, v, dk, dv */

static void tensor_shape(case_tensor *ct, const fa_test_case *c, fa_dtype dtype, enum tensor_side side)
{
    const case_layout layout = c->layout;
    const int64_t batch = c->shape.batch, head_dim = c->shape.head_dim;
    const int64_t seqlen = side == KEY_SIDE ? c->shape.seqlen_k : c->shape.seqlen_q;
    const int64_t heads = side == KEY_SIDE ? c->shape.heads_kv : c->shape.heads_q;
    memset(ct, 0, sizeof *ct);
    fa_tensor *t = &ct->t;
    t->dtype = dtype;
    t->batch = batch;
    t->seqlen = seqlen;
    t->heads = heads;
    t->head_dim = head_dim;
    switch (layout) {
    case LAYOUT_PACKED: /* strides stay 0 */
        ct->elements = (size_t)(batch * seqlen * heads * head_dim);
        return;
    case LAYOUT_BHSD:
        t->stride_seq = head_dim;
        t->stride_head = seqlen * head_dim;
        t->stride_batch = heads * seqlen * head_dim;
        break;
    case LAYOUT_PADDED:
        t->stride_head = head_dim + 3;
        t->stride_seq = heads * t->stride_head + 5;
        t->stride_batch = seqlen * t->stride_seq + 7;
        break;
    }
    ct->elements = (size_t)(batch * t->stride_batch);
}

static size_t element_index(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t x)
{
    if (t->stride_batch == 0) return (size_t)(((b * t->seqlen + s) * t->heads + h) * t->head_dim + x);
    return (size_t)(b * t->stride_batch + s * t->stride_seq + h * t->stride_head + x);
}

/* Packed double array <-> tensor host image. */
static void pack_tensor(case_tensor *ct, const double *values)
{
    const fa_tensor *t = &ct->t;
    for (int64_t b = 0, n = 0; b < t->batch; ++b)
        for (int64_t s = 0; s < t->seqlen; ++s)
            for (int64_t h = 0; h < t->heads; ++h)
                for (int64_t x = 0; x < t->head_dim; ++x, ++n)
                    test_store_element(ct->host, element_index(t, b, s, h, x), t->dtype, values[n]);
}

static void unpack_tensor(const case_tensor *ct, double *values)
{
    const fa_tensor *t = &ct->t;
    for (int64_t b = 0, n = 0; b < t->batch; ++b)
        for (int64_t s = 0; s < t->seqlen; ++s)
            for (int64_t h = 0; h < t->heads; ++h)
                for (int64_t x = 0; x < t->head_dim; ++x, ++n)
                    values[n] = test_load_element(ct->host, element_index(t, b, s, h, x), t->dtype);
}

/* Allocates the host image and the context copy. Inputs get values (NULL: outputs, which are
 * filled with NaN so that an element the backend never writes shows up as an error). */
static fa_status tensor_upload(fa_context *ctx, case_tensor *ct, const double *values)
{
    const size_t bytes = ct->elements * test_dtype_size(ct->t.dtype);
    ct->host = malloc(bytes);
    if (!ct->host) return FA_ERROR_OUT_OF_MEMORY;
    memset(ct->host, 0xff, bytes); /* all-ones: NaN in every dtype, also in the gaps */
    if (values) pack_tensor(ct, values);
    fa_status st = fa_malloc(ctx, bytes, &ct->t.data);
    if (st == FA_SUCCESS) st = fa_memcpy_h2d(ctx, ct->t.data, ct->host, bytes);
    return st;
}

static fa_status tensor_download(fa_context *ctx, case_tensor *ct, double *values)
{
    fa_status st = fa_memcpy_d2h(ctx, ct->host, ct->t.data, ct->elements * test_dtype_size(ct->t.dtype));
    if (st == FA_SUCCESS) unpack_tensor(ct, values);
    return st;
}

/* INFINITY when the backend wrote into the gaps between rows of a padded output (they were
 * uploaded as all-ones bytes), 0 otherwise. Call after tensor_download. */
static double gap_error(const case_tensor *ct)
{
    const fa_tensor *t = &ct->t;
    const size_t count = (size_t)(t->batch * t->seqlen * t->heads * t->head_dim);
    if (ct->elements == count) return 0.0; /* no gaps */
    const size_t esize = test_dtype_size(t->dtype);
    uint8_t *is_element = calloc(ct->elements, 1);
    if (!is_element) return INFINITY;
    for (int64_t b = 0; b < t->batch; ++b)
        for (int64_t s = 0; s < t->seqlen; ++s)
            for (int64_t h = 0; h < t->heads; ++h)
                for (int64_t x = 0; x < t->head_dim; ++x) is_element[element_index(t, b, s, h, x)] = 1;
    const uint8_t *bytes = ct->host;
    double error = 0.0;
    for (size_t i = 0; i < ct->elements && error == 0.0; ++i)
        for (size_t k = 0; !is_element[i] && k < esize; ++k)
            if (bytes[i * esize + k] != 0xff) error = INFINITY;
    free(is_element);
    return error;
}

static void tensor_release(fa_context *ctx, case_tensor *ct)
{
    if (ct->t.data) fa_free(ctx, ct->t.data);
    free(ct->host);
    ct->t.data = NULL;
    ct->host = NULL;
}

/* ---- comparison -------------------------------------------------------------------------------- */
/* Max abs error; a non-finite result where the reference is finite (or a mismatched infinity)
 * counts as INFINITY. Also returns max(1, max |reference|). */
static double max_error(const double *ref, const double *got, size_t n, double *scale)
{
    double worst = 0.0, largest = 1.0;
    for (size_t i = 0; i < n; ++i) {
        double e;
        if (isinf(ref[i])) e = got[i] == ref[i] ? 0.0 : INFINITY;
        else {
            e = fabs(got[i] - ref[i]);
            if (!(e <= DBL_MAX)) e = INFINITY;
            if (fabs(ref[i]) > largest) largest = fabs(ref[i]);
        }
        if (e > worst) worst = e;
    }
    *scale = largest;
    return worst;
}

/* ---- the runner -------------------------------------------------------------------------------- */
typedef struct case_buffers {
    double *q, *k, *v, *dout, *out_ref, *lse_ref, *dq_ref, *dk_ref, *dv_ref, *got;
    int32_t *seqlens;
    uint8_t *mask;
    case_tensor tq, tk, tv, tout, tdout, tdq, tdk, tdv;
    float *lse_dev, *lse_host;
    /* score modifiers: host arrays the oracle reads, their copies in the context's memory */
    float *slopes, *sinks, *dsinks_host;
    void *bias_host, *dbias_host;
    double *dsinks_ref, *dbias_ref;
    void *slopes_dev, *sinks_dev, *bias_dev, *dsinks_dev, *dbias_dev;
    size_t bias_elements;
} case_buffers;

static void release_buffers(fa_context *ctx, case_buffers *m)
{
    double *doubles[] = {m->q, m->k, m->v, m->dout, m->out_ref, m->lse_ref, m->dq_ref, m->dk_ref, m->dv_ref, m->got};
    for (size_t i = 0; i < sizeof doubles / sizeof doubles[0]; ++i) free(doubles[i]);
    free(m->seqlens);
    free(m->mask);
    case_tensor *tensors[] = {&m->tq, &m->tk, &m->tv, &m->tout, &m->tdout, &m->tdq, &m->tdk, &m->tdv};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i) tensor_release(ctx, tensors[i]);
    if (m->lse_dev) fa_free(ctx, m->lse_dev);
    free(m->lse_host);
    void *host[] = {m->slopes, m->sinks, m->dsinks_host, m->bias_host, m->dbias_host, m->dsinks_ref, m->dbias_ref};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; ++i) free(host[i]);
    void *dev[] = {m->slopes_dev, m->sinks_dev, m->bias_dev, m->dsinks_dev, m->dbias_dev};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; ++i)
        if (dev[i]) fa_free(ctx, dev[i]);
}

static double *random_values(uint64_t *rng, size_t n, fa_dtype dtype)
{
    double *values = malloc(n * sizeof *values);
    if (values)
        for (size_t i = 0; i < n; ++i) values[i] = test_round_to_dtype(next_normal(rng), dtype);
    return values;
}

/* Batch b keeps all keys when even, about half when odd; the last batch (if batch > 1) none. */
static int32_t padded_length(const fa_test_case *c, int64_t b)
{
    const oracle_shape *s = &c->shape;
    if (s->batch > 1 && b == s->batch - 1) return 0;
    return (int32_t)(b % 2 ? s->seqlen_k / 2 + 1 : s->seqlen_k);
}

static fa_status build_block_mask(const fa_test_case *c, uint64_t *rng, uint8_t **mask, fa_block_mask *bm)
{
    bm->block_q = c->block_q;
    bm->block_k = c->block_k;
    bm->rows = (c->shape.seqlen_q + c->block_q - 1) / c->block_q;
    bm->cols = (c->shape.seqlen_k + c->block_k - 1) / c->block_k;
    *mask = malloc((size_t)(bm->rows * bm->cols));
    if (!*mask) return FA_ERROR_OUT_OF_MEMORY;
    bm->mask = *mask;
    switch (c->block_mask) {
    case BLOCK_MASK_RANDOM:
        for (int64_t i = 0; i < bm->rows * bm->cols; ++i) (*mask)[i] = next_uniform(rng) < 0.6;
        return FA_SUCCESS;
    case BLOCK_MASK_BUTTERFLY: return fa_block_mask_butterfly(bm->rows, bm->cols, *mask);
    case BLOCK_MASK_LOCAL_GLOBAL: return fa_block_mask_local_global(bm->rows, bm->cols, 1, 1, *mask);
    case BLOCK_MASK_NONE: break;
    }
    return FA_ERROR_INVALID_VALUE;
}

/* A host array's copy in the context's memory. */
static fa_status upload(fa_context *ctx, const void *host, size_t bytes, void **dev)
{
    fa_status st = fa_malloc(ctx, bytes, dev);
    return st == FA_SUCCESS ? fa_memcpy_h2d(ctx, *dev, host, bytes) : st;
}

/* The case's score modifiers: host arrays for the oracle (desc_host), device copies for the run
 * (desc). The full bias pads its rows (stride_q = seqlen_k + 3) to test the stride. */
static fa_status build_modifiers(fa_context *ctx, const fa_test_case *c, fa_dtype dtype, uint64_t *rng,
                                 case_buffers *m, fa_attention_desc *desc_host, fa_attention_desc *desc,
                                 fa_bias *bias_host, fa_bias *bias_dev)
{
    const oracle_shape *s = &c->shape;
    fa_status st = FA_SUCCESS;
    if (c->modifiers & MOD_SOFTCAP) desc_host->softcap = desc->softcap = 2.0f;
    if (c->modifiers & (MOD_ALIBI | MOD_ALIBI_PER_BATCH)) {
        const int per_batch = (c->modifiers & MOD_ALIBI_PER_BATCH) != 0;
        const int64_t n = (per_batch ? s->batch : 1) * s->heads_q;
        if (!(m->slopes = malloc((size_t)n * sizeof(float)))) return FA_ERROR_OUT_OF_MEMORY;
        for (int64_t x = 0; x < n; ++x) /* 2^(-8 (h + 1) / heads), times (b + 1) per batch */
            m->slopes[x] = ldexpf(1.0f, -8 * (int)(x % s->heads_q + 1) / (int)s->heads_q) * (float)(x / s->heads_q + 1);
        if ((st = upload(ctx, m->slopes, (size_t)n * sizeof(float), &m->slopes_dev))) return st;
        desc_host->alibi_slopes = m->slopes;
        desc->alibi_slopes = m->slopes_dev;
        desc_host->alibi_per_batch = desc->alibi_per_batch = per_batch;
    }
    if (c->modifiers & MOD_SINKS) {
        if (!(m->sinks = malloc((size_t)s->heads_q * sizeof(float)))) return FA_ERROR_OUT_OF_MEMORY;
        for (int64_t h = 0; h < s->heads_q; ++h) m->sinks[h] = (float)test_round_to_dtype(next_normal(rng), FA_DTYPE_BF16);
        if ((st = upload(ctx, m->sinks, (size_t)s->heads_q * sizeof(float), &m->sinks_dev))) return st;
        desc_host->sinks = m->sinks;
        desc->sinks = m->sinks_dev;
    }
    if (c->modifiers & (MOD_BIAS | MOD_BIAS_BROADCAST)) {
        const int full = (c->modifiers & MOD_BIAS) != 0;
        const int64_t ld = full ? s->seqlen_k + 3 : s->seqlen_k;
        *bias_host = (fa_bias){NULL, dtype, full ? s->heads_q * s->seqlen_q * ld : 0, (full ? s->seqlen_q : 1) * ld,
                               full ? ld : 0};
        const int64_t batches = full ? s->batch : 1, rows = full ? s->seqlen_q : 1;
        m->bias_elements = (size_t)(batches * s->heads_q * rows * ld);
        const size_t bytes = m->bias_elements * test_dtype_size(dtype);
        if (!(m->bias_host = malloc(bytes)) || !(m->dbias_host = malloc(bytes))) return FA_ERROR_OUT_OF_MEMORY;
        for (size_t x = 0; x < m->bias_elements; ++x)
            test_store_element(m->bias_host, x, dtype, test_round_to_dtype(next_normal(rng), dtype));
        if ((st = upload(ctx, m->bias_host, bytes, &m->bias_dev))) return st;
        bias_host->data = m->bias_host;
        *bias_dev = *bias_host;
        bias_dev->data = m->bias_dev;
        desc_host->bias = bias_host;
        desc->bias = bias_dev;
    }
    return st;
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        if ((st = (expr)) != FA_SUCCESS) goto done;                                                \
    } while (0)
#define TRY_ALLOC(ptr)                                                                             \
    do {                                                                                           \
        if (!(ptr)) {                                                                              \
            st = FA_ERROR_OUT_OF_MEMORY;                                                           \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

fa_status fa_run_case(fa_context *ctx, const fa_test_case *c, fa_dtype dtype, int backward, fa_case_errors *errors)
{
    const oracle_shape *s = &c->shape;
    const size_t q_count = (size_t)(s->batch * s->seqlen_q * s->heads_q * s->head_dim);
    const size_t kv_count = (size_t)(s->batch * s->seqlen_k * s->heads_kv * s->head_dim);
    const size_t lse_count = (size_t)(s->batch * s->heads_q * s->seqlen_q);
    uint64_t rng = name_seed(c->name);
    case_buffers m;
    memset(&m, 0, sizeof m);
    memset(errors, 0, sizeof *errors);
    fa_status st = FA_SUCCESS;

    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.softmax_scale = c->softmax_scale;
    desc.causal = c->causal;
    desc.window_left = c->window_left;
    desc.window_right = c->window_right;
    desc.dropout_p = c->dropout_p;
    desc.dropout_seed = c->dropout_seed;
    desc.dropout_offset = c->dropout_offset;
    if (c->key_padding) {
        TRY_ALLOC(m.seqlens = malloc((size_t)s->batch * sizeof *m.seqlens));
        for (int64_t b = 0; b < s->batch; ++b) m.seqlens[b] = padded_length(c, b);
        desc.seqlens_k = m.seqlens;
    }
    fa_block_mask bm;
    if (c->block_mask != BLOCK_MASK_NONE) {
        TRY(build_block_mask(c, &rng, &m.mask, &bm));
        desc.block_mask = &bm;
    }

    /* The oracle reads the modifiers' arrays on the host; the backend gets their copies. */
    fa_attention_desc desc_host = desc;
    fa_bias bias_host, bias_dev;
    TRY(build_modifiers(ctx, c, dtype, &rng, &m, &desc_host, &desc, &bias_host, &bias_dev));

    TRY_ALLOC(m.q = random_values(&rng, q_count, dtype));
    TRY_ALLOC(m.k = random_values(&rng, kv_count, dtype));
    TRY_ALLOC(m.v = random_values(&rng, kv_count, dtype));
    TRY_ALLOC(m.out_ref = malloc(q_count * sizeof(double)));
    TRY_ALLOC(m.lse_ref = malloc(lse_count * sizeof(double)));
    TRY_ALLOC(m.got = malloc((q_count > kv_count ? q_count : kv_count) * sizeof(double)));
    TRY_ALLOC(m.lse_host = malloc(lse_count * sizeof(float)));

    tensor_shape(&m.tq, c, dtype, QUERY_SIDE);
    tensor_shape(&m.tk, c, dtype, KEY_SIDE);
    tensor_shape(&m.tv, c, dtype, KEY_SIDE);
    tensor_shape(&m.tout, c, dtype, QUERY_SIDE);
    TRY(tensor_upload(ctx, &m.tq, m.q));
    TRY(tensor_upload(ctx, &m.tk, m.k));
    TRY(tensor_upload(ctx, &m.tv, m.v));
    TRY(tensor_upload(ctx, &m.tout, NULL));
    TRY(fa_malloc(ctx, lse_count * sizeof(float), (void **)&m.lse_dev));
    memset(m.lse_host, 0xff, lse_count * sizeof(float));
    TRY(fa_memcpy_h2d(ctx, m.lse_dev, m.lse_host, lse_count * sizeof(float)));

    TRY(fa_forward(ctx, &desc, &m.tq.t, &m.tk.t, &m.tv.t, &m.tout.t, m.lse_dev));
    TRY(fa_synchronize(ctx));
    oracle_forward(s, &desc_host, m.q, m.k, m.v, m.out_ref, m.lse_ref);
    TRY(tensor_download(ctx, &m.tout, m.got));
    errors->out = fmax(max_error(m.out_ref, m.got, q_count, &errors->out_scale), gap_error(&m.tout));
    TRY(fa_memcpy_d2h(ctx, m.lse_host, m.lse_dev, lse_count * sizeof(float)));
    for (size_t i = 0; i < lse_count; ++i) m.got[i] = m.lse_host[i];
    errors->lse = max_error(m.lse_ref, m.got, lse_count, &errors->lse_scale);
    if (!backward) goto done;

    TRY_ALLOC(m.dout = random_values(&rng, q_count, dtype));
    TRY_ALLOC(m.dq_ref = malloc(q_count * sizeof(double)));
    TRY_ALLOC(m.dk_ref = malloc(kv_count * sizeof(double)));
    TRY_ALLOC(m.dv_ref = malloc(kv_count * sizeof(double)));
    tensor_shape(&m.tdout, c, dtype, QUERY_SIDE);
    tensor_shape(&m.tdq, c, dtype, QUERY_SIDE);
    tensor_shape(&m.tdk, c, dtype, KEY_SIDE);
    tensor_shape(&m.tdv, c, dtype, KEY_SIDE);
    TRY(tensor_upload(ctx, &m.tdout, m.dout));
    TRY(tensor_upload(ctx, &m.tdq, NULL));
    TRY(tensor_upload(ctx, &m.tdk, NULL));
    TRY(tensor_upload(ctx, &m.tdv, NULL));
    /* dbias in the bias's layout, filled with all-ones bytes so an element never written shows */
    fa_bias dbias_dev;
    size_t dbias_count = 0;
    const size_t bias_bytes = m.bias_elements * test_dtype_size(dtype);
    if (m.bias_dev) {
        memset(m.dbias_host, 0xff, bias_bytes);
        TRY(upload(ctx, m.dbias_host, bias_bytes, &m.dbias_dev));
        dbias_dev = bias_dev;
        dbias_dev.data = m.dbias_dev;
        fa_bias packed;
        oracle_dbias_shape(s, &desc_host, &packed, &dbias_count);
        TRY_ALLOC(m.dbias_ref = malloc(dbias_count * sizeof(double)));
    }
    if (m.sinks) {
        TRY_ALLOC(m.dsinks_ref = malloc((size_t)s->heads_q * sizeof(double)));
        TRY_ALLOC(m.dsinks_host = malloc((size_t)s->heads_q * sizeof(float)));
        TRY(fa_malloc(ctx, (size_t)s->heads_q * sizeof(float), &m.dsinks_dev));
    }
    TRY(fa_backward_ex(ctx, &desc, &m.tq.t, &m.tk.t, &m.tv.t, &m.tout.t, &m.tdout.t, m.lse_dev, &m.tdq.t, &m.tdk.t,
                       &m.tdv.t, m.dsinks_dev, m.dbias_dev ? &dbias_dev : NULL));
    TRY(fa_synchronize(ctx));
    oracle_backward_ex(s, &desc_host, m.q, m.k, m.v, m.dout, m.dq_ref, m.dk_ref, m.dv_ref, m.dsinks_ref, m.dbias_ref);
    if (m.dsinks_dev) {
        TRY(fa_memcpy_d2h(ctx, m.dsinks_host, m.dsinks_dev, (size_t)s->heads_q * sizeof(float)));
        for (int64_t h = 0; h < s->heads_q; ++h) m.got[h] = m.dsinks_host[h];
        errors->dsinks = max_error(m.dsinks_ref, m.got, (size_t)s->heads_q, &errors->dsinks_scale);
    }
    if (m.dbias_dev) { /* the packed oracle result against the strided one (rows padded by 3) */
        TRY(fa_memcpy_d2h(ctx, m.dbias_host, m.dbias_dev, bias_bytes));
        const int64_t rows = bias_host.stride_q ? s->seqlen_q : 1, heads = s->heads_q;
        const int64_t batches = bias_host.stride_batch ? s->batch : 1;
        double *got = malloc(dbias_count * sizeof(double));
        TRY_ALLOC(got);
        for (int64_t b = 0, n = 0; b < batches; ++b)
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t i = 0; i < rows; ++i)
                    for (int64_t j = 0; j < s->seqlen_k; ++j, ++n)
                        got[n] = test_load_element(m.dbias_host, (size_t)(b * bias_host.stride_batch +
                                                   h * bias_host.stride_head + i * bias_host.stride_q + j), dtype);
        errors->dbias = max_error(m.dbias_ref, got, dbias_count, &errors->dbias_scale);
        free(got);
    }
    TRY(tensor_download(ctx, &m.tdq, m.got));
    errors->dq = fmax(max_error(m.dq_ref, m.got, q_count, &errors->dq_scale), gap_error(&m.tdq));
    TRY(tensor_download(ctx, &m.tdk, m.got));
    errors->dk = fmax(max_error(m.dk_ref, m.got, kv_count, &errors->dk_scale), gap_error(&m.tdk));
    TRY(tensor_download(ctx, &m.tdv, m.got));
    errors->dv = fmax(max_error(m.dv_ref, m.got, kv_count, &errors->dv_scale), gap_error(&m.tdv));

done:
    release_buffers(ctx, &m);
    return st;
}

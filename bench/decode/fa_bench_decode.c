/* fa-bench-decode: the KV-cache decode path and packed variable-length batches on the CPU, with
 * their yardsticks measured in the same run:
 *  - decode (fa_forward_kvcache, batch 1, heads_q 32, heads_kv 8, d 128, f32/f16/bf16 cache, one token appended per
 *    step): bytes of K and V read per step / step time, as a fraction of the read bandwidth of a
 *    large-array sum on the same threads, and tokens/s of one attention layer (and of 32 layers,
 *    the attention part of a llama.cpp-style tokens/s figure);
 *  - a varlen training step (forward + backward) on a packed batch of lengths drawn from 64..2048,
 *    against the per-sequence dense runs one after another and against the padded batch;
 *  - a serving step (f16, heads 32/8, d 128): 8 sequences decoding one token over 4k..32k cached
 *    tokens and 2 prefill chunks of 512 tokens on 4k contexts in one ragged call, against the two
 *    padded calls it replaces (the decodes, the prefills), and the decodes' read bandwidth;
 *  - the batch-invariant split against the batch-dependent split of 0.4 (chunks from batch x row
 *    tiles: 128 tasks) on the same decode shapes, batch 1..64: what invariance costs;
 *  - quantised caches (--only quant; not in the default run): the same decode (q f16, 4k/16k/32k
 *    keys) over an f16 cache and over int8 (per-token scales), FP8 E4M3 and FP8 E5M2 caches
 *    (per-sequence descales), all in one interleaved run with the array sum: step time, time
 *    against the f16 cache, bytes read per step (K+V codes + int8 scales) and their rate as a
 *    fraction of the array sum's; and the f16 cache with rotary embeddings (GPT-NeoX, rotary_dim 128)
 *    on the appended key and the query: what the fused rotation adds to a step.
 * Each comparison runs its variants in interleaved rounds and keeps each one's best round (the
 * median of its calls in that round), so that drift and other load on the machine hit all of them
 * alike; only the ratios mean much.
 * Usage: fa-bench-decode [--quick] [--threads 2] [--min-time 0.5] [--rounds 5]
 *                        [--only decode|varlen|serving|split|quant] [--keys N]
 *                        [--clock wall|cpu] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_clock.h"
#include "common/kv_split.h"
#include "flashattn.h"

static double now(void) { return bench_seconds(); }

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        fa_status st_ = (expr);                                                                    \
        if (st_ != FA_SUCCESS) {                                                                   \
            fprintf(stderr, "%s: %s: %s\n", #expr, fa_status_string(st_), fa_last_error());        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* count elements of dtype (f32, f16 or bf16), normal values of magnitude 2^-5..1 (f16: sign, exponent 10..14,
 * random mantissa; f32 the same values, bf16 their top halves): no subnormal, whose conversion or arithmetic
 * can be slow, and nothing outside the range real activations have. */
static void *alloc_values(size_t count, fa_dtype dtype)
{
    const size_t es = dtype == FA_DTYPE_F32 ? 4 : 2;
    unsigned char *p = malloc(count * es);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", count * es);
        exit(1);
    }
    uint64_t s = 0x9E3779B97F4A7C15ull ^ count;
    for (size_t i = 0; i < count; ++i) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        const uint16_t h = (uint16_t)((s >> 63) << 15 | (10 + (s >> 40) % 5) << 10 | (s & 0x3ff));
        if (dtype != FA_DTYPE_F16) {
            const float f = (float)ldexp((double)(1024 + (h & 0x3ff)), (int)((h >> 10) & 31) - 25) * ((h >> 15) ? -1 : 1);
            uint32_t bits;
            memcpy(&bits, &f, 4);
            const uint16_t top = (uint16_t)(bits >> 16);
            if (dtype == FA_DTYPE_F32) memcpy(p + i * 4, &f, 4);
            else memcpy(p + i * 2, &top, 2);
        } else {
            memcpy(p + i * 2, &h, 2);
        }
    }
    return p;
}

/* Median seconds of calls of fn, repeated for at least min_time (at least 3 times). */
typedef void (*bench_fn)(void *arg);
static double time_median(bench_fn fn, void *arg, double min_time)
{
    double t[64];
    int n = 0;
    fn(arg); /* warm-up */
    const double start = now();
    while (n < 64 && (n < 3 || now() - start < min_time)) {
        const double t0 = now();
        fn(arg);
        t[n++] = now() - t0;
    }
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && t[j] < t[j - 1]; --j) {
            const double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[n / 2];
}

/* The best median of each variant over interleaved rounds, each round min_time / rounds long. */
static void time_rounds(int rounds, int count, const bench_fn *fns, void *const *args, double min_time, double *best)
{
    for (int v = 0; v < count; ++v) best[v] = INFINITY;
    for (int r = 0; r < rounds; ++r)
        for (int v = 0; v < count; ++v) {
            const double t = time_median(fns[v], args[v], min_time / rounds / count);
            if (t < best[v]) best[v] = t;
        }
}

/* ---- read bandwidth --------------------------------------------------------------------------- */
typedef struct sum_arg { const float *x; size_t n; int threads; double result; } sum_arg;

static void array_sum(void *arg)
{
    sum_arg *a = arg;
    double total = 0.0;
#pragma omp parallel for num_threads(a->threads) reduction(+ : total) schedule(static)
    for (size_t block = 0; block < a->n / 64; ++block) {
        float acc[16] = {0};
        const float *x = a->x + block * 64;
        for (int i = 0; i < 64; i += 16)
            for (int j = 0; j < 16; ++j) acc[j] += x[i + j];
        float s = 0.0f;
        for (int j = 0; j < 16; ++j) s += acc[j];
        total += s;
    }
    a->result = total;
}

/* ---- decode ----------------------------------------------------------------------------------- */
typedef struct decode_arg {
    fa_context *ctx;
    fa_attention_desc desc;
    fa_tensor q, k_new, v_new, out;
    fa_kv_cache cache;
    float *lse;
} decode_arg;

static void decode_step(void *arg)
{
    decode_arg *a = arg;
    CHECK(fa_forward_kvcache(a->ctx, &a->desc, &a->q, &a->cache, &a->k_new, &a->v_new, &a->out, a->lse));
}

static void bench_decode(fa_context *ctx, fa_dtype dtype, int64_t keys, sum_arg *sum, int rounds, double min_time)
{
    const int64_t hq = 32, hk = 8, d = 128;
    const size_t es = dtype == FA_DTYPE_F32 ? 4 : 2;
    const size_t cache_bytes = (size_t)(keys * hk * d) * es;
    static int32_t cached[1];
    cached[0] = (int32_t)(keys - 1); /* + the appended token = keys */
    decode_arg a;
    memset(&a, 0, sizeof a);
    a.ctx = ctx;
    fa_attention_desc_init(&a.desc);
    a.desc.causal = 1;
    void *kc = alloc_values(cache_bytes / es, dtype), *vc = alloc_values(cache_bytes / es, dtype);
    void *q = alloc_values((size_t)(hq * d), dtype), *out = alloc_values((size_t)(hq * d), dtype);
    void *kn = alloc_values((size_t)(hk * d), dtype), *vn = alloc_values((size_t)(hk * d), dtype);
    a.lse = malloc((size_t)hq * sizeof(float));
    a.q = (fa_tensor){q, dtype, 1, 1, hq, d, 0, 0, 0};
    a.out = (fa_tensor){out, dtype, 1, 1, hq, d, 0, 0, 0};
    a.k_new = (fa_tensor){kn, dtype, 1, 1, hk, d, 0, 0, 0};
    a.v_new = (fa_tensor){vn, dtype, 1, 1, hk, d, 0, 0, 0};
    a.cache.k = (fa_tensor){kc, dtype, 1, keys, hk, d, 0, 0, 0};
    a.cache.v = (fa_tensor){vc, dtype, 1, keys, hk, d, 0, 0, 0};
    a.cache.cache_seqlens = cached;
    const bench_fn fns[2] = {array_sum, decode_step};
    void *args[2] = {sum, &a};
    double best[2];
    time_rounds(rounds, 2, fns, args, 2.0 * min_time, best);
    const double t = best[1], bandwidth = (double)(sum->n * sizeof(float)) / best[0] / 1e9;
    const double rate = 2.0 * (double)cache_bytes / t / 1e9;
    printf("decode  %-4s cache %6lld  %8.3f ms  K+V %7.1f MB  %6.2f GB/s  array sum %6.2f GB/s  ratio %.2f  "
           "%7.0f tokens/s per layer (%6.1f for 32 layers)\n",
           dtype == FA_DTYPE_F32 ? "f32" : dtype == FA_DTYPE_F16 ? "f16" : "bf16", (long long)keys, t * 1e3, 2.0 * (double)cache_bytes / 1e6, rate,
           bandwidth, rate / bandwidth, 1.0 / t, 1.0 / t / 32.0);
    free(kc);
    free(vc);
    free(q);
    free(out);
    free(kn);
    free(vn);
    free(a.lse);
}

/* ---- quantised caches --------------------------------------------------------------------------- */
/* count valid codes of a quantised cache dtype: int8 uniform in [-127, 127]; FP8 of magnitude 2^-3..2^3
 * (E4M3 exponent field 4..10, E5M2 12..18, random sign and mantissa): no NaN, infinity or subnormal. */
static void *alloc_codes(size_t count, fa_dtype dtype)
{
    uint8_t *p = malloc(count);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", count);
        exit(1);
    }
    uint64_t s = 0xD1B54A32D192ED03ull ^ count ^ (uint64_t)dtype;
    for (size_t i = 0; i < count; ++i) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        const unsigned sign = (unsigned)(s >> 63) << 7;
        if (dtype == FA_DTYPE_I8) {
            const int8_t c = (int8_t)((int)((s >> 32) % 255u) - 127);
            memcpy(p + i, &c, 1);
        } else if (dtype == FA_DTYPE_FP8_E4M3) {
            p[i] = (uint8_t)(sign | (4 + (s >> 40) % 7) << 3 | (s & 7));
        } else {
            p[i] = (uint8_t)(sign | (12 + (s >> 40) % 7) << 2 | (s & 3));
        }
    }
    return p;
}

static const char *cache_dtype_name(fa_dtype dtype)
{
    switch (dtype) {
    case FA_DTYPE_F32: return "f32";
    case FA_DTYPE_F16: return "f16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_I8: return "int8";
    case FA_DTYPE_FP8_E4M3: return "e4m3";
    case FA_DTYPE_FP8_E5M2: return "e5m2";
    }
    return "?";
}

/* The decode step of bench_decode (q, out, k_new, v_new f16) over an f16 cache and int8, E4M3 and
 * E5M2 caches of the same shape, timed in one interleaved run with the array sum. int8 scales are
 * ~1/127 per (token, kv head) (values up to ~1); FP8 descales 1/16 per kv head. */
static void bench_quant(fa_context *ctx, int64_t keys, sum_arg *sum, int rounds, double min_time)
{
    enum { VARIANTS = 5 }; /* the last: the f16 cache with rotary embeddings on the appended key and the query */
    static const fa_dtype dtypes[VARIANTS] = {FA_DTYPE_F16, FA_DTYPE_I8, FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E5M2, FA_DTYPE_F16};
    const int64_t hq = 32, hk = 8, d = 128;
    const size_t elements = (size_t)(keys * hk * d), rows = (size_t)(keys * hk);
    static int32_t cached[1];
    cached[0] = (int32_t)(keys - 1); /* + the appended token = keys */
    void *q = alloc_values((size_t)(hq * d), FA_DTYPE_F16), *kn = alloc_values((size_t)(hk * d), FA_DTYPE_F16);
    void *vn = alloc_values((size_t)(hk * d), FA_DTYPE_F16);
    float *k_scale = malloc(rows * sizeof(float)), *v_scale = malloc(rows * sizeof(float));
    float descale[8];
    if (!k_scale || !v_scale) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t r = 0; r < rows; ++r) {
        k_scale[r] = (0.5f + 0.5f * (float)(r % 97) / 96.0f) / 127.0f;
        v_scale[r] = (0.5f + 0.5f * (float)((r * 31) % 89) / 88.0f) / 127.0f;
    }
    for (int h = 0; h < 8; ++h) descale[h] = 1.0f / 16.0f;
    float *cos_table = malloc((size_t)(keys * d / 2) * sizeof(float)), *sin_table = malloc((size_t)(keys * d / 2) * sizeof(float));
    if (!cos_table || !sin_table) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int64_t pos = 0; pos < keys; ++pos)
        for (int64_t f = 0; f < d / 2; ++f) {
            const double angle = (double)pos * pow(10000.0, -2.0 * (double)f / (double)d);
            cos_table[pos * d / 2 + f] = (float)cos(angle);
            sin_table[pos * d / 2 + f] = (float)sin(angle);
        }
    fa_rotary rotary;
    fa_rotary_init(&rotary);
    rotary.cos = cos_table;
    rotary.sin = sin_table;
    rotary.max_position = keys;
    rotary.rotary_dim = d;
    fa_kv_scales scales[VARIANTS];
    decode_arg a[VARIANTS];
    void *kc[VARIANTS], *vc[VARIANTS];
    double bytes[VARIANTS];
    for (int x = 0; x < VARIANTS; ++x) {
        const fa_dtype dt = dtypes[x];
        memset(&a[x], 0, sizeof a[x]);
        a[x].ctx = ctx;
        fa_attention_desc_init(&a[x].desc);
        a[x].desc.causal = 1;
        if (x == VARIANTS - 1) a[x].desc.rotary = &rotary;
        fa_kv_scales_init(&scales[x]);
        if (dt == FA_DTYPE_F16) {
            kc[x] = alloc_values(elements, dt);
            vc[x] = alloc_values(elements, dt);
            bytes[x] = 2.0 * (double)elements * 2.0;
        } else {
            kc[x] = alloc_codes(elements, dt);
            vc[x] = alloc_codes(elements, dt);
            bytes[x] = 2.0 * (double)elements;
            if (dt == FA_DTYPE_I8) {
                scales[x].k_scale = k_scale;
                scales[x].v_scale = v_scale;
                bytes[x] += 2.0 * (double)rows * sizeof(float);
            } else {
                scales[x].k_descale = descale;
                scales[x].v_descale = descale;
            }
            a[x].desc.kv_scales = &scales[x];
        }
        a[x].lse = malloc((size_t)hq * sizeof(float));
        a[x].q = (fa_tensor){q, FA_DTYPE_F16, 1, 1, hq, d, 0, 0, 0};
        a[x].out = (fa_tensor){alloc_values((size_t)(hq * d), FA_DTYPE_F16), FA_DTYPE_F16, 1, 1, hq, d, 0, 0, 0};
        a[x].k_new = (fa_tensor){kn, FA_DTYPE_F16, 1, 1, hk, d, 0, 0, 0};
        a[x].v_new = (fa_tensor){vn, FA_DTYPE_F16, 1, 1, hk, d, 0, 0, 0};
        a[x].cache.k = (fa_tensor){kc[x], dt, 1, keys, hk, d, 0, 0, 0};
        a[x].cache.v = (fa_tensor){vc[x], dt, 1, keys, hk, d, 0, 0, 0};
        a[x].cache.cache_seqlens = cached;
    }
    const bench_fn fns[VARIANTS + 1] = {array_sum, decode_step, decode_step, decode_step, decode_step, decode_step};
    void *args[VARIANTS + 1] = {sum, &a[0], &a[1], &a[2], &a[3], &a[4]};
    double best[VARIANTS + 1];
    time_rounds(rounds, VARIANTS + 1, fns, args, (VARIANTS + 1) * min_time, best);
    const double bandwidth = (double)(sum->n * sizeof(float)) / best[0] / 1e9;
    printf("quant   cache %6lld keys, q f16, heads 32/8, d 128: array sum %.2f GB/s\n", (long long)keys, bandwidth);
    for (int x = 0; x < VARIANTS; ++x) {
        const double t = best[x + 1], rate = bytes[x] / t / 1e9;
        printf("        %-10s  %8.3f ms  vs f16 %5.3f  read %7.2f MB/step  %6.2f GB/s  of array sum %.2f\n",
               x == VARIANTS - 1 ? "f16+rotary" : cache_dtype_name(dtypes[x]), t * 1e3, t / best[1], bytes[x] / 1e6, rate,
               rate / bandwidth);
    }
    for (int x = 0; x < VARIANTS; ++x) {
        free(kc[x]);
        free(vc[x]);
        free(a[x].out.data);
        free(a[x].lse);
    }
    free(q);
    free(kn);
    free(vn);
    free(k_scale);
    free(v_scale);
    free(cos_table);
    free(sin_table);
}

/* ---- serving step ------------------------------------------------------------------------------- */
typedef struct kv_call {
    fa_context *ctx;
    fa_attention_desc desc;
    fa_varlen ragged;
    fa_tensor q, k_new, v_new, out;
    fa_kv_cache cache;
    float *lse;
} kv_call;

static void kv_call_run(void *arg)
{
    kv_call *a = arg;
    CHECK(fa_forward_kvcache(a->ctx, &a->desc, &a->q, &a->cache, &a->k_new, &a->v_new, &a->out, a->lse));
}

/* The two padded calls a ragged step replaces, one after the other. */
typedef struct replaced_calls { kv_call *decode, *prefill; } replaced_calls;
static void replaced_run(void *arg)
{
    replaced_calls *a = arg;
    kv_call_run(a->decode);
    kv_call_run(a->prefill);
}

/* A call over rows [row0, row0 + batch) of the step's buffers: a contiguous cache of `capacity`
 * tokens per row, q/out/k_new/v_new [batch, rows, heads, d] from packed row row0 * rows. */
static kv_call step_call(fa_context *ctx, void *const *buf, fa_dtype dtype, int64_t capacity, int32_t *cached,
                         int64_t row0, int64_t batch, int64_t rows, float *lse)
{
    const int64_t hq = 32, hk = 8, d = 128, es = dtype == FA_DTYPE_F32 ? 4 : 2;
    kv_call c;
    memset(&c, 0, sizeof c);
    c.ctx = ctx;
    fa_attention_desc_init(&c.desc);
    c.desc.causal = 1;
    char *const *b = (char *const *)buf;
    c.cache.k = (fa_tensor){b[0] + row0 * capacity * hk * d * es, dtype, batch, capacity, hk, d, 0, 0, 0};
    c.cache.v = (fa_tensor){b[1] + row0 * capacity * hk * d * es, dtype, batch, capacity, hk, d, 0, 0, 0};
    c.cache.cache_seqlens = cached + row0;
    c.q = (fa_tensor){b[2] + row0 * rows * hq * d * es, dtype, batch, rows, hq, d, 0, 0, 0};
    c.out = (fa_tensor){b[3] + row0 * rows * hq * d * es, dtype, batch, rows, hq, d, 0, 0, 0};
    c.k_new = (fa_tensor){b[4] + row0 * rows * hk * d * es, dtype, batch, rows, hk, d, 0, 0, 0};
    c.v_new = (fa_tensor){b[5] + row0 * rows * hk * d * es, dtype, batch, rows, hk, d, 0, 0, 0};
    c.lse = lse;
    return c;
}

static void bench_serving(fa_context *ctx, int quick, sum_arg *sum, int rounds, double min_time)
{
    enum { DECODES = 8, PREFILLS = 2, CHUNK = 512, SEQS = DECODES + PREFILLS };
    const fa_dtype dtype = FA_DTYPE_F16;
    const int64_t hq = 32, hk = 8, d = 128, top = quick ? 8192 : 32768, capacity = top + 1;
    int32_t cached[SEQS], cu[SEQS + 1] = {0};
    int64_t decode_keys = 0;
    for (int b = 0; b < SEQS; ++b) {
        cached[b] = b < DECODES ? (int32_t)(top / DECODES * (b + 1) - 1) : 4096 - CHUNK;
        cu[b + 1] = cu[b] + (b < DECODES ? 1 : CHUNK);
        if (b < DECODES) decode_keys += cached[b] + 1;
    }
    const int64_t total = cu[SEQS];
    void *buf[6];
    buf[0] = alloc_values((size_t)(SEQS * capacity * hk * d), dtype);
    buf[1] = alloc_values((size_t)(SEQS * capacity * hk * d), dtype);
    buf[2] = alloc_values((size_t)(total * hq * d), dtype);
    buf[3] = alloc_values((size_t)(total * hq * d), dtype);
    buf[4] = alloc_values((size_t)(total * hk * d), dtype);
    buf[5] = alloc_values((size_t)(total * hk * d), dtype);
    float *lse = malloc((size_t)(total * hq) * sizeof(float));
    kv_call ragged = step_call(ctx, buf, dtype, capacity, cached, 0, SEQS, total, lse);
    ragged.q.batch = ragged.out.batch = ragged.k_new.batch = ragged.v_new.batch = 1; /* packed [1, total] */
    ragged.ragged = (fa_varlen){SEQS, cu, NULL, CHUNK, 0};
    ragged.desc.varlen = &ragged.ragged;
    kv_call decode = step_call(ctx, buf, dtype, capacity, cached, 0, DECODES, 1, lse);
    kv_call prefill = step_call(ctx, buf, dtype, capacity, cached, 0, PREFILLS, CHUNK, lse);
    /* The prefill rows start after the decodes' 8 packed rows and 8 cache rows. */
    const int64_t es = 2;
    prefill.cache.k.data = (char *)buf[0] + DECODES * capacity * hk * d * es;
    prefill.cache.v.data = (char *)buf[1] + DECODES * capacity * hk * d * es;
    prefill.cache.cache_seqlens = cached + DECODES;
    prefill.q.data = (char *)buf[2] + DECODES * hq * d * es;
    prefill.out.data = (char *)buf[3] + DECODES * hq * d * es;
    prefill.k_new.data = (char *)buf[4] + DECODES * hk * d * es;
    prefill.v_new.data = (char *)buf[5] + DECODES * hk * d * es;
    replaced_calls both = {&decode, &prefill};
    const bench_fn fns[4] = {kv_call_run, replaced_run, kv_call_run, array_sum};
    void *args[4] = {&ragged, &both, &decode, sum};
    double best[4];
    time_rounds(rounds, 4, fns, args, 4.0 * min_time, best);
    const double bytes = 2.0 * (double)(decode_keys * hk * d * es), bandwidth = (double)(sum->n * sizeof(float)) / best[3];
    printf("serving f16, heads 32/8, d 128: %d decodes (%lld..%lld cached) + %d prefill chunks of %d (4096 keys):\n"
           "        one ragged call %.2f ms, the two padded calls it replaces %.2f ms (ragged / replaced %.3f);\n"
           "        the decodes alone %.2f ms: K+V %.1f MB at %.2f GB/s, array sum %.2f GB/s, ratio %.2f\n",
           DECODES, (long long)(top / DECODES), (long long)top, PREFILLS, CHUNK, best[0] * 1e3, best[1] * 1e3,
           best[0] / best[1], best[2] * 1e3, bytes / 1e6, bytes / best[2] / 1e9, bandwidth / 1e9,
           bytes / best[2] / bandwidth);
    for (int i = 0; i < 6; ++i) free(buf[i]);
    free(lse);
}

/* ---- the cost of batch invariance ------------------------------------------------------------------ */
/* 0.4's chunk size for a decode of `batch` sequences of `keys` keys (heads 32/8: one row tile of 4
 * rows per sequence): 128 tasks over batch units, chunks of at least 256 keys. */
static int64_t batch_dependent_split(int64_t batch, int64_t keys)
{
    const int64_t splits = batch >= 128 ? 1 : (128 + batch - 1) / batch;
    int64_t chunks = (keys + 255) / 256;
    if (chunks > splits) chunks = splits;
    return (keys + chunks - 1) / chunks;
}

static void bench_split(fa_context *ctx, int quick, int rounds, double min_time)
{
    static const int64_t shapes[][2] = {{1, 16384}, {4, 16384}, {16, 4096}, {64, 4096}, {1, 4096}};
    const fa_dtype dtype = FA_DTYPE_F16;
    const int64_t hq = 32, hk = 8, d = 128;
    for (size_t x = 0; x < (quick ? 2u : sizeof shapes / sizeof shapes[0]); ++x) {
        const int64_t batch = shapes[x][0], keys = shapes[x][1];
        int32_t *cached = malloc((size_t)batch * sizeof(int32_t));
        for (int64_t b = 0; b < batch; ++b) cached[b] = (int32_t)(keys - 1);
        void *buf[6];
        buf[0] = alloc_values((size_t)(batch * keys * hk * d), dtype);
        buf[1] = alloc_values((size_t)(batch * keys * hk * d), dtype);
        buf[2] = alloc_values((size_t)(batch * hq * d), dtype);
        buf[3] = alloc_values((size_t)(batch * hq * d), dtype);
        buf[4] = alloc_values((size_t)(batch * hk * d), dtype);
        buf[5] = alloc_values((size_t)(batch * hk * d), dtype);
        float *lse = malloc((size_t)(batch * hq) * sizeof(float));
        kv_call invariant = step_call(ctx, buf, dtype, keys, cached, 0, batch, 1, lse), dependent = invariant;
        dependent.desc.kv_split_tokens = batch_dependent_split(batch, keys); /* the same chunks as 0.4 */
        const bench_fn fns[2] = {kv_call_run, kv_call_run};
        void *args[2] = {&invariant, &dependent};
        double best[2];
        time_rounds(rounds, 2, fns, args, 2.0 * min_time, best);
        printf("split   f16 batch %3lld x %5lld keys: invariant (chunks of %lld) %8.3f ms, batch-dependent (chunks of "
               "%lld) %8.3f ms, invariant / dependent %.3f\n",
               (long long)batch, (long long)keys, (long long)fa_kv_split_size(0, keys), best[0] * 1e3,
               (long long)dependent.desc.kv_split_tokens, best[1] * 1e3, best[0] / best[1]);
        for (int i = 0; i < 6; ++i) free(buf[i]);
        free(lse);
        free(cached);
    }
}

/* ---- varlen training step --------------------------------------------------------------------- */
typedef struct train_arg {
    fa_context *ctx;
    fa_attention_desc desc;
    fa_tensor q, k, v, out, dout, dq, dk, dv;
    float *lse;
} train_arg;

static void train_step(void *arg)
{
    train_arg *a = arg;
    CHECK(fa_forward(a->ctx, &a->desc, &a->q, &a->k, &a->v, &a->out, a->lse));
    CHECK(fa_backward(a->ctx, &a->desc, &a->q, &a->k, &a->v, &a->out, &a->dout, a->lse, &a->dq, &a->dk, &a->dv));
}

/* One training step's tensors of batch x rows, over buffers big enough for the packed total. */
static void train_tensors(train_arg *a, float *const *buf, int64_t batch, int64_t rows, int64_t heads, int64_t d)
{
    fa_tensor *t[8] = {&a->q, &a->k, &a->v, &a->out, &a->dout, &a->dq, &a->dk, &a->dv};
    for (int i = 0; i < 8; ++i) *t[i] = (fa_tensor){buf[i], FA_DTYPE_F32, batch, rows, heads, d, 0, 0, 0};
}

/* The dense runs of each sequence on its own, one after another: what packing must not exceed. */
typedef struct per_sequence_arg {
    train_arg step;
    float *const *buf;
    const int32_t *lens;
    int sequences;
    int64_t heads, d;
} per_sequence_arg;

static void per_sequence_steps(void *arg)
{
    per_sequence_arg *a = arg;
    for (int b = 0; b < a->sequences; ++b) {
        train_tensors(&a->step, a->buf, 1, a->lens[b], a->heads, a->d);
        train_step(&a->step);
    }
}

static void bench_varlen(fa_context *ctx, int sequences, int rounds, double min_time)
{
    const int64_t heads = 8, d = 64;
    int32_t cu[17] = {0}, lens[16];
    int64_t max_len = 0;
    uint64_t s = 12345;
    for (int b = 0; b < sequences; ++b) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        lens[b] = 64 + (int32_t)((s >> 33) % (2048 - 64 + 1));
        cu[b + 1] = cu[b] + lens[b];
        if (lens[b] > max_len) max_len = lens[b];
    }
    const int64_t total = cu[sequences], padded_rows = sequences * max_len;
    float *buf[8];
    for (int i = 0; i < 8; ++i) buf[i] = alloc_values((size_t)(padded_rows * heads * d), FA_DTYPE_F32);
    float *lse = malloc((size_t)(padded_rows * heads) * sizeof(float));
    train_arg packed, padded;
    memset(&packed, 0, sizeof packed);
    packed.ctx = ctx;
    packed.lse = lse;
    fa_attention_desc_init(&packed.desc);
    packed.desc.causal = 1;
    padded = packed;
    per_sequence_arg each = {packed, buf, lens, sequences, heads, d};

    const fa_varlen varlen = {sequences, cu, cu, max_len, max_len};
    packed.desc.varlen = &varlen;
    train_tensors(&packed, buf, 1, total, heads, d);
    padded.desc.seqlens_k = lens; /* every padded query row computed, keys past each length masked */
    train_tensors(&padded, buf, sequences, max_len, heads, d);

    const bench_fn fns[3] = {train_step, per_sequence_steps, train_step};
    void *args[3] = {&packed, &each, &padded};
    double best[3];
    time_rounds(rounds, 3, fns, args, 3.0 * min_time, best);
    printf("varlen  %d sequences (64..2048, total %lld, max %lld), heads %lld, d %lld, causal, fwd+bwd:\n"
           "        packed %.1f ms, per-sequence runs %.1f ms (packed / per-sequence %.3f), padded batch %.1f ms "
           "(packed / padded %.3f)\n",
           sequences, (long long)total, (long long)max_len, (long long)heads, (long long)d, best[0] * 1e3,
           best[1] * 1e3, best[0] / best[1], best[2] * 1e3, best[0] / best[2]);
    for (int i = 0; i < 8; ++i) free(buf[i]);
    free(lse);
}

int main(int argc, char **argv)
{
    int threads = 2, quick = 0, decode = 1, varlen = 1, serving = 1, split = 1, quant = 0, rounds = 5;
    int64_t quant_keys = 0; /* --keys: one cache length for --only quant instead of 4k/16k/32k */
    double min_time = 0.5;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-time") && i + 1 < argc) min_time = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--keys") && i + 1 < argc) quant_keys = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--clock") && i + 1 < argc) bench_use_cpu_clock = !strcmp(argv[++i], "cpu");
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            ++i;
            decode = !strcmp(argv[i], "decode");
            varlen = !strcmp(argv[i], "varlen");
            serving = !strcmp(argv[i], "serving");
            split = !strcmp(argv[i], "split");
            quant = !strcmp(argv[i], "quant");
        }
        else {
            puts("usage: fa-bench-decode [--quick] [--threads 2] [--min-time 0.5] [--rounds 5]\n"
                 "                       [--only decode|varlen|serving|split|quant]  (quant: int8/FP8 caches\n"
                 "                       against f16; only with --only)  [--keys N]  (quant: one cache length)\n"
                 "                       [--clock wall|cpu]  (cpu: process CPU time / threads, for a loaded machine)\n"
                 "  --min-time: seconds per variant of each comparison, spread over the rounds");
            return strcmp(argv[i], "--help") ? 1 : 0;
        }
    }
    /* Checked before the context exists: nothing to free on this exit. */
    if (rounds < 1 || min_time <= 0.0) {
        fprintf(stderr, "--rounds and --min-time must be positive\n");
        return 1;
    }
    fa_context *ctx;
    CHECK(fa_context_create(FA_BACKEND_CPU, 0, &ctx));
    CHECK(fa_context_set_num_threads(ctx, threads));
    bench_cpu_threads = threads;
    printf("%s\n", fa_context_info(ctx));

    /* 128 MiB (512 MiB without --quick) of floats: far beyond the last-level cache */
    sum_arg sum = {NULL, (size_t)1 << (quick ? 25 : 27), threads, 0.0};
    float *x = decode || serving || quant ? alloc_values(sum.n, FA_DTYPE_F32) : NULL;
    sum.x = x;
    if (decode) {
        static const int64_t cache_lengths[] = {4096, 16384, 32768};
        static const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
        for (int dt = 0; dt < 3; ++dt)
            for (int i = 0; i < (quick ? 1 : 3); ++i)
                bench_decode(ctx, dtypes[dt], cache_lengths[i], &sum, rounds, min_time);
    }
    if (varlen) bench_varlen(ctx, quick ? 3 : 8, rounds, min_time);
    if (serving) bench_serving(ctx, quick, &sum, rounds, min_time);
    if (split) bench_split(ctx, quick, rounds, min_time);
    if (quant) {
        static const int64_t cache_lengths[] = {4096, 16384, 32768};
        if (quant_keys > 0) bench_quant(ctx, quant_keys, &sum, rounds, min_time);
        else
            for (int i = 0; i < (quick ? 1 : 3); ++i) bench_quant(ctx, cache_lengths[i], &sum, rounds, min_time);
    }
    free(x);
    fa_context_destroy(ctx);
    return 0;
}

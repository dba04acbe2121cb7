/* checkasm: the decode kernels (decode_scores, decode_values) that read a KV cache in place. */
#include "checkasm.h"

/* The largest magnitude of cache_fill's values of dtype: the kernels' rounding grows with it. */
static float cache_bound(fa_dtype dtype) { return dtype == FA_DTYPE_I8 ? 127.0f : fa_dtype_fp8(dtype) ? 16.0f : 1.0f; }

/* An FP8 code of dtype whose value is finite with magnitude below 16, any such code alike (every
 * exponent, subnormals and zeros of both signs included). */
static uint8_t fp8_code(fa_dtype dtype)
{
    for (;;) {
        const uint8_t c = (uint8_t)(uniform(0, 256));
        const float v = dtype == FA_DTYPE_FP8_E4M3 ? fa_fp8_e4m3_to_f32(c) : fa_fp8_e5m2_to_f32(c);
        if (fabsf(v) < 16.0f) return c; /* false for NaN and inf */
    }
}

/* A decode cache of `count` elements of dtype: values in [-1, 1], exactly representable; int8
 * codes in [-127, 127]; FP8 codes of fp8_code. */
static void *cache_fill(int64_t count, fa_dtype dtype)
{
    void *data = malloc((size_t)count * fa_dtype_size(dtype));
    assert_non_null(data);
    for (int64_t x = 0; x < count; ++x) {
        const float v = uniform(-1, 1);
        if (dtype == FA_DTYPE_F32) ((float *)data)[x] = v;
        else if (dtype == FA_DTYPE_F16) ((uint16_t *)data)[x] = fa_f32_to_f16(v);
        else if (dtype == FA_DTYPE_I8) ((int8_t *)data)[x] = (int8_t)lrintf(127.0f * v);
        else if (fa_dtype_fp8(dtype)) ((uint8_t *)data)[x] = fp8_code(dtype);
        else ((uint16_t *)data)[x] = (uint16_t)(fa_f32_bits(v) >> 16);
    }
    return data;
}

/* The shapes of a decode kernel trial: padded key and head strides of the cache; keys as one run
 * (ld_quad = 4 ld_key) or, every other trial, as four streams (ld_key the streams' padded distance,
 * ld_quad the row stride). extent: elements of the cache the keys span. */
typedef struct decode_shape {
    int64_t n, heads, rows, d, ld_key, ld_quad, ld_head, extent;
    fa_dtype dtype;
} decode_shape;

static decode_shape decode_trial(int trial)
{
    /* an odd count of key counts, so that each is tried in both layouts; 64 (the step's tile) and
     * beyond: more than one block of decode_values' keys */
    static const int64_t keys[] = {1, 2, 3, 5, 8, 15, 16, 17, 33, 40, 64, 70, 131};
    static const int64_t heads[] = {1, 2, 3, 8};
    static const int64_t rows[] = {1, 2, 3, 4, 5, 7, 8, 16};
    static const int64_t dims[] = {1, 3, 8, 16, 17, 31, 64, 100, 128};
    decode_shape s;
    s.n = keys[trial % 13];
    s.heads = heads[(trial / 3) % 4];
    s.rows = rows[(trial * 7 + 1) % 8];
    s.d = dims[(trial * 5 + 2) % 9];
    s.dtype = (fa_dtype)(trial % 6); /* every cache dtype, the quantised ones included */
    s.ld_head = s.d + (trial / 2) % 3;
    const int64_t row = s.heads * s.ld_head + trial % 5;
    s.ld_key = trial % 2 ? (s.n + 3) / 4 * row + trial % 7 : row;
    s.ld_quad = trial % 2 ? row : 4 * row;
    s.extent = 0;
    for (int64_t x = 0; x < s.n; ++x) {
        const int64_t end = fa_decode_key_offset(x, s.ld_key, s.ld_quad) + row;
        if (end > s.extent) s.extent = end;
    }
    return s;
}

/* decode_scores on odd shapes, padded strides, every cache dtype; S^T outside its extent keeps
 * its sentinel. */
void test_decode_scores(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    for (int trial = 0; trial < 360; ++trial) {
        const decode_shape s = decode_trial(trial);
        const int64_t ldq_head = s.rows * s.d + 2, cols = s.heads * s.rows, ldst = cols + 3;
        void *k = cache_fill(s.extent, s.dtype);
        float *q = malloc((size_t)(s.heads * ldq_head) * 4), *want = malloc((size_t)(s.n * ldst) * 4);
        float *got = malloc((size_t)(s.n * ldst) * 4);
        assert_non_null(q); assert_non_null(want); assert_non_null(got);
        for (int64_t x = 0; x < s.heads * ldq_head; ++x) q[x] = uniform(-1, 1);
        for (int64_t x = 0; x < s.n * ldst; ++x) want[x] = got[x] = 1234.5f;
        ref->decode_scores(s.n, s.heads, s.rows, s.d, k, s.dtype, s.ld_key, s.ld_quad, s.ld_head, q, ldq_head, want, ldst);
        isa->decode_scores(s.n, s.heads, s.rows, s.d, k, s.dtype, s.ld_key, s.ld_quad, s.ld_head, q, ldq_head, got, ldst);
        for (int64_t x = 0; x < s.n * ldst; ++x) {
            if (x % ldst >= cols) {
                if (got[x] != 1234.5f) fail_msg("decode_scores %s: wrote outside S^T at %lld", isa->isa, (long long)x);
                continue;
            }
            const float tol = 4e-7f * (float)(s.d + 2) * cache_bound(s.dtype); /* d roundings in either order, |sum| <= d * bound */
            if (!(fabsf(got[x] - want[x]) <= tol))
                fail_msg("decode_scores %s n=%lld heads=%lld rows=%lld d=%lld dtype=%d: S^T[%lld] = %.9g, ref %.9g",
                         isa->isa, (long long)s.n, (long long)s.heads, (long long)s.rows, (long long)s.d, (int)s.dtype,
                         (long long)x, got[x], want[x]);
        }
        free(k); free(q); free(want); free(got);
    }
}

/* decode_values on the same shapes, with and without the rescale; O outside its rows keeps its
 * sentinel. */
void test_decode_values(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    for (int trial = 0; trial < 360; ++trial) {
        const decode_shape s = decode_trial(trial);
        const int64_t cols = s.heads * s.rows, ldp = cols + 1, ldo_head = s.rows * s.d + 3;
        void *v = cache_fill(s.extent, s.dtype);
        float *pr = malloc((size_t)(s.n * ldp) * 4), *alpha = malloc((size_t)cols * 4);
        float *want = malloc((size_t)(s.heads * ldo_head) * 4), *got = malloc((size_t)(s.heads * ldo_head) * 4);
        assert_non_null(pr); assert_non_null(alpha); assert_non_null(want); assert_non_null(got);
        for (int64_t x = 0; x < s.n * ldp; ++x) pr[x] = uniform(0, 1);
        for (int64_t x = 0; x < cols; ++x) alpha[x] = uniform(0, 1);
        for (int64_t x = 0; x < s.heads * ldo_head; ++x) want[x] = got[x] = x % ldo_head < s.rows * s.d ? uniform(-1, 1) : 1234.5f;
        const float *scale = trial % 4 == 3 ? NULL : alpha;
        ref->decode_values(s.n, s.heads, s.rows, s.d, pr, ldp, v, s.dtype, s.ld_key, s.ld_quad, s.ld_head, want, ldo_head, scale);
        isa->decode_values(s.n, s.heads, s.rows, s.d, pr, ldp, v, s.dtype, s.ld_key, s.ld_quad, s.ld_head, got, ldo_head, scale);
        for (int64_t x = 0; x < s.heads * ldo_head; ++x) {
            if (x % ldo_head >= s.rows * s.d) {
                if (got[x] != 1234.5f) fail_msg("decode_values %s: wrote outside O at %lld", isa->isa, (long long)x);
                continue;
            }
            const float tol = 4e-7f * (float)(s.n + 2) * cache_bound(s.dtype); /* n + 1 roundings, |O| <= (n + 1) * bound */
            if (!(fabsf(got[x] - want[x]) <= tol))
                fail_msg("decode_values %s n=%lld heads=%lld rows=%lld d=%lld dtype=%d scale=%d: O[%lld] = %.9g, ref %.9g",
                         isa->isa, (long long)s.n, (long long)s.heads, (long long)s.rows, (long long)s.d, (int)s.dtype,
                         scale != NULL, (long long)x, got[x], want[x]);
        }
        free(v); free(pr); free(alpha); free(want); free(got);
    }
}

/* Every code of each quantised cache dtype through decode_values with one key, P = 1 and O = 0:
 * O is then the ISA's decoded row, which must be the exact value of each code (quant_codes.h; an
 * E4M3 code's / 2^8, kernels.h),
 * NaN for NaN codes and the infinities of E5M2 included. Rows of 256 codes sit at every offset of
 * a vector (a code's lane and its neighbours differ per offset). */
void test_decode_codes(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state);
    static const fa_dtype dtypes[] = {FA_DTYPE_I8, FA_DTYPE_FP8_E4M3, FA_DTYPE_FP8_E5M2};
    uint8_t row[256 + 16];
    float o[256], one = 1.0f;
    for (int t = 0; t < 3; ++t)
        for (int offset = 0; offset < 16; ++offset) {
            for (int c = 0; c < 256; ++c) row[offset + c] = (uint8_t)(c + 7 * offset);
            memset(o, 0, sizeof o);
            isa->decode_values(1, 1, 1, 256, &one, 1, row + offset, dtypes[t], 256, 1024, 256, o, 256, NULL);
            for (int c = 0; c < 256; ++c) {
                const uint8_t code = row[offset + c];
                const float want = dtypes[t] == FA_DTYPE_I8 ? (float)(int8_t)code
                                   : dtypes[t] == FA_DTYPE_FP8_E4M3 ? fa_fp8_e4m3_to_f32(code) * 0x1p-8f /* kernels.h */
                                                                     : fa_fp8_e5m2_to_f32(code);
                const int same = want != want ? o[c] != o[c] : o[c] == want; /* O starts at +0: a -0 code gives +0 */
                if (!same)
                    fail_msg("decode_values %s dtype=%d: code 0x%02x at element %d decodes to %.9g, not %.9g", isa->isa,
                             (int)dtypes[t], code, c, o[c], want);
            }
        }
}

/* Portable reference microkernels: plain loops, the ground truth for the ISA kernels. */
#include <float.h>
#include <math.h>

#include "../../../common/dtype.h"
#include "../../../common/half.h"
#include "../../../common/quant_codes.h"
#include "../kernels.h"
#include "../exp_poly.h"

static void ref_gemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
                     int64_t ldb, float *c, int64_t ldc, const float *row_scale, int accumulate)
{
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            float acc = 0.0f;
            for (int64_t p = 0; p < k; ++p) acc += a[i * rsa + p * csa] * b[p * ldb + j];
            float *cij = c + i * ldc + j;
            if (!accumulate) *cij = acc;
            else *cij = (row_scale ? row_scale[i] * *cij : *cij) + acc;
        }
}

static void ref_col_max(const float *x, int64_t ld, int64_t rows, int64_t cols, float *out)
{
    for (int64_t j = 0; j < cols; ++j) out[j] = -INFINITY;
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) out[j] = x[i * ld + j] > out[j] ? x[i * ld + j] : out[j];
}

static void ref_exp_cols(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, const float *shift,
                         float *sum)
{
    for (int64_t j = 0; j < cols; ++j) sum[j] = 0.0f;
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
            float *e = x + i * ld + j;
            const float arg = scale * *e - shift[j];
            *e = arg < FA_EXP_LO ? 0.0f : expf(arg); /* the vector kernels' flush (exp_poly.h) */
            sum[j] += *e;
        }
}

/* The ground truth: libm's tanhf (slow, about 20 ns a call; the ISA kernels are not). */
static void ref_softcap_cols(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, float cap, float slope,
                             int64_t first, float *grad, float *col_max)
{
    const float factor = scale / cap;
    for (int64_t i = 0; i < rows; ++i) {
        const float offset = (float)(first - i);
        for (int64_t j = 0; j < cols; ++j) {
            float *s = x + i * ld + j;
            const float t = tanhf(*s * factor), capped = cap * t, alibi = -slope * fabsf(offset + (float)j);
            if (grad) grad[i * ld + j] = 1.0f - t * t;
            if (*s != -INFINITY) *s = capped + alibi; /* masked stays masked */
        }
    }
    if (col_max) ref_col_max(x, ld, rows, cols, col_max);
}

static void ref_alibi_cols(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, float slope, int64_t first,
                           float *col_max)
{
    for (int64_t i = 0; i < rows; ++i) {
        const float offset = (float)(first - i);
        for (int64_t j = 0; j < cols; ++j) {
            const float scaled = x[i * ld + j] * scale, distance = fabsf(offset + (float)j);
            if (x[i * ld + j] != -INFINITY) x[i * ld + j] = scaled - slope * distance; /* masked stays masked */
        }
    }
    if (col_max) ref_col_max(x, ld, rows, cols, col_max);
}

static void ref_bias_cols(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, const void *bias,
                          fa_dtype dtype, int64_t ld_bias, float *col_max)
{
    for (int64_t j = 0; j < cols; ++j) {
        const void *row = (const char *)bias + j * ld_bias * (int64_t)fa_dtype_size(dtype);
        for (int64_t i = 0; i < rows; ++i) {
            const float add = dtype == FA_DTYPE_F16    ? fa_f16_to_f32(((const uint16_t *)row)[i])
                              : dtype == FA_DTYPE_BF16 ? fa_bf16_to_f32(((const uint16_t *)row)[i])
                                                       : ((const float *)row)[i];
            float *s = x + i * ld + j;
            if (*s != -INFINITY) *s = *s * scale + add; /* masked stays masked */
        }
    }
    for (int64_t i = 0; col_max && i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) col_max[j] = x[i * ld + j] > col_max[j] ? x[i * ld + j] : col_max[j];
}

static void ref_transpose(const float *src, int64_t ld_src, int64_t rows, int64_t cols, float *dst, int64_t ld_dst)
{
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
}

static void ref_f16_to_f32(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; ++i) dst[i] = fa_f16_to_f32(src[i]);
}

static void ref_bf16_to_f32(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; ++i) dst[i] = fa_bf16_to_f32(src[i]);
}

static void ref_f32_to_f16(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; ++i) dst[i] = fa_f32_to_f16(src[i]);
}

static void ref_gemm_nt(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                        float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            float acc = 0.0f;
            for (int64_t p = 0; p < k; ++p) acc += a[i * lda + p] * b[j * ldb + p];
            c[i * ldc + j] = acc;
        }
}

static void ref_gemm_max(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
                         int64_t ldb, float *c, int64_t ldc, float *col_max)
{
    ref_gemm(m, n, k, a, rsa, csa, b, ldb, c, ldc, NULL, 0);
    ref_col_max(c, ldc, m, n, col_max);
}

/* The pass itself after the product (the vector kernels fuse it into gemm's registers). */
static void ref_gemm_scores(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
                            int64_t ldb, float *c, int64_t ldc, const fa_cpu_score_mods *mods, float *col_max)
{
    ref_gemm(m, n, k, a, rsa, csa, b, ldb, c, ldc, NULL, 0);
    if (mods->cap > 0.0f)
        ref_softcap_cols(c, ldc, m, n, mods->scale, mods->cap, mods->alibi ? mods->slope : 0.0f, mods->first, NULL, NULL);
    else if (mods->alibi)
        ref_alibi_cols(c, ldc, m, n, mods->scale, mods->slope, mods->first, NULL);
    ref_col_max(c, ldc, m, n, col_max);
}

/* The pass itself after the product (the vector kernels run it in gemm's registers). */
static void ref_gemm_ds(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
                        int64_t ldb, float *c, int64_t ldc, const float *p, int64_t ldp, const float *delta)
{
    ref_gemm(m, n, k, a, rsa, csa, b, ldb, c, ldc, NULL, 0);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = p[i * ldp + j] * (c[i * ldc + j] - delta[j]);
}

/* vdpbf16ps' inputs: a subnormal reads as a signed zero (DAZ). */
static float bf16_dot_daz(float x) { return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; }

/* One step of vdpbf16ps: fma(x, y, acc) rounded to nearest even, then FTZ with tininess after
 * rounding: a result that rounds (unbounded exponent, 24 bits) below 2^-126 becomes a signed
 * zero. fmaf's result rounds with subnormals, so a result of exactly +-2^-126 is tested again
 * on the exact sum: tiny when |x y + acc| < 2^-126 - 2^-151 (the midpoint under 2^-126 rounds up,
 * to even). There x y + acc is near 2^-126, so |acc| and |x y| are below 2^-100 (larger ones
 * cannot cancel to it) and acc - t is exact in double, as x y is; the double sum keeps the sign. */
static float bf16_dot_fma(float x, float y, float acc)
{
    const float r = fmaf(x, y, acc);
    if (fabsf(r) < FLT_MIN) return copysignf(0.0f, r);
    if (fabsf(r) == FLT_MIN) {
        const double sign = r < 0.0f ? -1.0 : 1.0, t = 0x1p-126 - 0x1p-151;
        if ((double)x * (double)y * sign + ((double)acc * sign - t) < 0.0) return copysignf(0.0f, r);
    }
    return r;
}

/* kernels.h's gemm_max_bf16, one scalar vdpbf16ps step per pair (the hardware agrees bit for bit:
 * tests/checkasm). */
void fa_cpu_ref_gemm_max_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda, const uint32_t *b,
                              int64_t ldb, float *c, int64_t ldc, float *col_max)
{
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            float acc = 0.0f;
            for (int64_t p = 0; p < k; p += 2) {
                const uint32_t pair = b[p / 2 * ldb + j];
                const float odd_a = p + 1 < k ? fa_bf16_to_f32(a[i * lda + p + 1]) : 0.0f;
                const float odd_b = fa_bf16_to_f32((uint16_t)(pair >> 16));
                acc = bf16_dot_fma(bf16_dot_daz(odd_a), bf16_dot_daz(odd_b), bf16_dot_daz(acc));
                acc = bf16_dot_fma(bf16_dot_daz(fa_bf16_to_f32(a[i * lda + p])),
                                   bf16_dot_daz(fa_bf16_to_f32((uint16_t)(pair & 0xffffu))), acc);
            }
            c[i * ldc + j] = acc;
        }
    if (col_max) ref_col_max(c, ldc, m, n, col_max);
}

/* The FMA-peak probe for the reference kernels: 16 scalar chains of multiply-add in plain C, as
 * the compiler builds the reference gemm (baseline ISA: it may vectorise them, as it may the gemm). */
static double ref_fma_chains(int64_t iterations, float *sink)
{
    enum { CHAINS = 16 };
    float acc[CHAINS];
#pragma GCC unroll 16
    for (int c = 0; c < CHAINS; ++c) acc[c] = (float)c;
    for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16 /* unrolled, the chains live in registers */
        for (int c = 0; c < CHAINS; ++c) acc[c] = acc[c] * 0.999999f + 1e-6f;
    }
    float total = 0.0f;
    for (int c = 0; c < CHAINS; ++c) total += acc[c];
    *sink = total;
    return 2.0 * CHAINS * (double)iterations;
}

/* Element e of a cache row of the given dtype, as f32 (exact; quantised codes without their scale,
 * E4M3 codes' values / 2^8 as kernels.h states). */
static float ref_cache_element(const void *row, int64_t e, fa_dtype dtype)
{
    if (dtype == FA_DTYPE_F16) return fa_f16_to_f32(((const uint16_t *)row)[e]);
    if (dtype == FA_DTYPE_BF16) return fa_bf16_to_f32(((const uint16_t *)row)[e]);
    if (dtype == FA_DTYPE_I8) return (float)((const int8_t *)row)[e];
    if (dtype == FA_DTYPE_FP8_E4M3) return fa_fp8_e4m3_to_f32(((const uint8_t *)row)[e]) * 0x1p-8f; /* kernels.h */
    if (dtype == FA_DTYPE_FP8_E5M2) return fa_fp8_e5m2_to_f32(((const uint8_t *)row)[e]);
    return ((const float *)row)[e];
}

static void ref_decode_scores(int64_t n, int64_t heads, int64_t rows, int64_t d, const void *k, fa_dtype dtype,
                              int64_t ld_key, int64_t ld_quad, int64_t ld_head, const float *q, int64_t ldq_head,
                              float *st, int64_t ldst)
{
    const size_t es = fa_dtype_size(dtype);
    for (int64_t x = 0; x < n; ++x)
        for (int64_t h = 0; h < heads; ++h) {
            const void *key = (const char *)k + (size_t)(fa_decode_key_offset(x, ld_key, ld_quad) + h * ld_head) * es;
            for (int64_t r = 0; r < rows; ++r) {
                const float *qr = q + h * ldq_head + r * d;
                float acc = 0.0f;
                for (int64_t p = 0; p < d; ++p) acc += qr[p] * ref_cache_element(key, p, dtype);
                st[x * ldst + h * rows + r] = acc;
            }
        }
}

static void ref_decode_values(int64_t n, int64_t heads, int64_t rows, int64_t d, const float *p, int64_t ldp,
                              const void *v, fa_dtype dtype, int64_t ld_key, int64_t ld_quad, int64_t ld_head,
                              float *o, int64_t ldo_head, const float *alpha)
{
    const size_t es = fa_dtype_size(dtype);
    for (int64_t h = 0; h < heads; ++h)
        for (int64_t r = 0; r < rows; ++r) {
            float *orow = o + h * ldo_head + r * d;
            const float scale = alpha ? alpha[h * rows + r] : 1.0f;
            for (int64_t c = 0; c < d; ++c) {
                float acc = orow[c] * scale;
                for (int64_t x = 0; x < n; ++x)
                    acc += p[x * ldp + h * rows + r] *
                           ref_cache_element((const char *)v + (size_t)(fa_decode_key_offset(x, ld_key, ld_quad) + h * ld_head) * es,
                                             c, dtype);
                orow[c] = acc;
            }
        }
}

const fa_cpu_kernels fa_cpu_kernels_ref = {
    .isa = "ref",
    .gemm = ref_gemm,
    .col_max = ref_col_max,
    .exp_cols = ref_exp_cols,
    .softcap_cols = ref_softcap_cols,
    .alibi_cols = ref_alibi_cols,
    .bias_cols = ref_bias_cols,
    .transpose = ref_transpose,
    .f16_to_f32 = ref_f16_to_f32,
    .bf16_to_f32 = ref_bf16_to_f32,
    .f32_to_f16 = ref_f32_to_f16,
    .gemm_nt = ref_gemm_nt,
    .gemm_max = ref_gemm_max,
    .gemm_scores = ref_gemm_scores,
    .gemm_ds = ref_gemm_ds,
    .fma_chains = ref_fma_chains,
    .decode_scores = ref_decode_scores,
    .decode_values = ref_decode_values,
    .mr = 1, .nr = 1, .tile_step = 16,
};

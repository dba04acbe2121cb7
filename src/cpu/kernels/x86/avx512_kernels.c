/* AVX-512F microkernels: 16 lanes, a 12 x 32 register tile (24 of the 32 zmm registers
 * accumulate). Built with -mavx512f; selected only when cpuid reports AVX-512F. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "../kernels.h"

#define VEC __m512
#define W 16
#define MR 12
#define KNAME(x) avx512_##x
#define MASK_T __mmask16
#define VMASK(n) ((__mmask16)((1u << (n)) - 1u))
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VMLOAD(p, m) _mm512_maskz_loadu_ps(m, p)
#define VMSTORE(p, m, v) _mm512_mask_storeu_ps(p, m, v)
#define VSET1(x) _mm512_set1_ps(x)
#define VZERO() _mm512_setzero_ps()
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VDIV(a, b) _mm512_div_ps(a, b)
/* float and/or need AVX-512DQ: the integer forms (AVX-512F) on the same bits */
#define VABS(x) _mm512_castsi512_ps(_mm512_and_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)))
#define VCOPYSIGN(m, s)                                                                                       \
    _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(m), _mm512_castps_si512(s),            \
                                                  _mm512_set1_epi32(0x7fffffff), 0xe4)) /* c ? m : s, bitwise */
#define VSELECT_GE(a, b, y, n) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_GE_OQ), n, y)
#define VSELECT_EQ(a, b, y, n) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ), n, y)
/* a where a == b, else x + y: VSELECT_EQ(a, b, a, VADD(x, y)) in one masked addition */
#define VADD_UNLESS_EQ(a, b, x, y) _mm512_mask_add_ps(a, _mm512_cmp_ps_mask(a, b, _CMP_NEQ_UQ), x, y)
#define VMAX_UNLESS_EQ(a, b, x, y) _mm512_mask_max_ps(a, _mm512_cmp_ps_mask(a, b, _CMP_NEQ_UQ), x, y)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VMIN(a, b) _mm512_min_ps(a, b)
#define VFNMA(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define VROUND(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VSCALE2(y, n) _mm512_scalef_ps(y, n)
/* The exponential in fewer operations (exp_cols was 7% of a forward at d = 64): scalef takes any
 * n (IEEE under- and overflow), so x needs no clamp: results below FA_EXP_LO, -inf's NaN (from
 * -inf - -inf in the reduction) included, are zeroed by a mask from one compare, as AVX2 and NEON
 * zero them (exp_poly.h says why below 2^-64: not the subnormals scalef would round to, which
 * cost an ALiBi forward 4.7x on an Emerald Rapids). The compare is not-less-than,
 * unordered: NaN keeps its lane, NaN stays NaN. n = round(x log2 e) from one FMA with
 * 1.5 * 2^23 (as AVX2's), not a multiply and a roundscale: n differs only where x log2 e rounds
 * to a half-integer, within the same accuracy. */
#define VEXP_RANGE(x, lo) ((void)(lo), (x))
#define VZERO_BELOW(y, x, lo) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), y)
#define VEXP_T(x) _mm512_fmadd_ps(x, _mm512_set1_ps(FA_EXP_LOG2E), _mm512_set1_ps(FA_EXP_ROUNDER))
#define VEXP_N(t) _mm512_sub_ps(t, _mm512_set1_ps(FA_EXP_ROUNDER))
#define VEXP_SCALE2(y, t) _mm512_scalef_ps(y, VEXP_N(t))
#define VLOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VSTORE_F16(p, v) _mm256_storeu_si256((__m256i *)(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT))
#define VLOAD_BF16(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
/* Quantised cache codes (vector_kernels.h, cache_load): 16 bytes widened with AVX2's integer ops. */
#define VLOAD_BYTES_U16(p) _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p)))
#define VLOAD_I8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define VLOAD_E5M2(p) _mm512_cvtph_ps(_mm256_slli_epi16(VLOAD_BYTES_U16(p), 8))
#define VLOAD_E4M3_OVER_256(p) _mm512_cvtph_ps(avx_e4m3_as_f16(VLOAD_BYTES_U16(p)))
#define VHSUM(v) _mm512_reduce_add_ps(v)
#define NT_NR 4
#define VSUM_TRANSPOSED(acc) avx512_transpose_sum(acc)
#define PV_CB 4 /* 16 accumulators, 4 V vectors and a broadcast: 21 of the 32 zmm registers */

/* Lane 4 * (i % 4) + i / 4 = the sum of the lanes of a[i]: halves, then quarters, pairs and lanes
 * of two vectors at a time folded together (30 shuffles and 15 adds for 16 sums, against 16 x 8
 * operations for one horizontal sum each). */
static inline __m512 avx512_transpose_sum(const __m512 *a)
{
    __m512 t[8], u[4], v[2];
    for (int i = 0; i < 8; ++i)
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xee));
    for (int i = 0; i < 4; ++i)
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xdd));
    for (int i = 0; i < 2; ++i)
        v[i] = _mm512_add_ps(_mm512_unpacklo_ps(u[2 * i], u[2 * i + 1]), _mm512_unpackhi_ps(u[2 * i], u[2 * i + 1]));
    const __m512d v0 = _mm512_castps_pd(v[0]), v1 = _mm512_castps_pd(v[1]);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(v0, v1)), _mm512_castpd_ps(_mm512_unpackhi_pd(v0, v1)));
}

#include "avx_transpose.h"

/* E4M3 codes (one per 16-bit lane) as binary16 bits of value / 2^8: the code in the high byte,
 * shifted right by one arithmetically, puts the sign at bit 15 (and a copy at 14, cleared) and the
 * exponent and mantissa at binary16's; a NaN code's lane becomes all ones, a binary16 NaN. */
static inline __m256i avx_e4m3_as_f16(__m256i u)
{
    const __m256i bits = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(u, 8), 1), _mm256_set1_epi16((short)0xbfff));
    const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(u, _mm256_set1_epi16(0x7f)), _mm256_set1_epi16(0x7f));
    return _mm256_or_si256(bits, nan);
}
/* 8 keys of 16 rows of 16-bit values, rows l and l + 8 side by side in the two 128-bit lanes of a
 * ymm register: an 8 x 8 transpose of 16-bit elements in each lane (unpacks of 16, 32, 64 bits),
 * then each key's 16 values widened at once (half the shuffles of widening first). */
static inline __attribute__((always_inline)) void avx512_load_transposed16(const void *const *row, int64_t i, const int dt,
                                                                           __m512 *t)
{
    __m256i v[8], a[8], b[8];
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l)
        v[l] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)row[l] + i))),
                                       _mm_loadu_si128((const __m128i *)((const uint16_t *)row[l + 8] + i)), 1);
    for (int l = 0; l < 8; l += 2) { /* rows l, l+1 interleaved: keys 0-3 | 4-7 */
        a[l] = _mm256_unpacklo_epi16(v[l], v[l + 1]);
        a[l + 1] = _mm256_unpackhi_epi16(v[l], v[l + 1]);
    }
    for (int l = 0; l < 8; l += 4) { /* rows l..l+3: keys (0, 1), (2, 3), (4, 5), (6, 7) */
        b[l] = _mm256_unpacklo_epi32(a[l], a[l + 2]);
        b[l + 1] = _mm256_unpackhi_epi32(a[l], a[l + 2]);
        b[l + 2] = _mm256_unpacklo_epi32(a[l + 1], a[l + 3]);
        b[l + 3] = _mm256_unpackhi_epi32(a[l + 1], a[l + 3]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) { /* key 2c and 2c + 1: rows 0-3 from b[c], 4-7 from b[c + 4] */
        const __m256i even = _mm256_unpacklo_epi64(b[c], b[c + 4]), odd = _mm256_unpackhi_epi64(b[c], b[c + 4]);
        if (dt == FA_DTYPE_F16) {
            t[2 * c] = _mm512_cvtph_ps(even);
            t[2 * c + 1] = _mm512_cvtph_ps(odd);
        } else {
            t[2 * c] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(even), 16));
            t[2 * c + 1] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(odd), 16));
        }
    }
}

/* 8 keys of 16 bias rows. f32: rows l and l + 8 side by side in one zmm (l < 8), the 8 x 8
 * transposition's in-lane steps on both halves at once, its 128-bit lane step as one two-source
 * permute per key: 32 zmm operations, no spill (two 8 x 8 ymm transpositions joined by inserts
 * spilled: 10.9 ms of a 13.7 ms bias pass was this, not memory; bench/results). f16/bf16
 * transposed before they are widened. */
static inline __attribute__((always_inline)) void avx512_load_transposed(const void *const *row, int64_t i, const int dt,
                                                                         __m512 *t)
{
    if (dt != FA_DTYPE_F32) {
        avx512_load_transposed16(row, i, dt, t);
        return;
    }
    __m512 z[8], u[8], s[8];
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
        const __m256 lo = _mm256_loadu_ps((const float *)row[l] + i), hi = _mm256_loadu_ps((const float *)row[l + 8] + i);
        z[l] = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
    }
    for (int l = 0; l < 8; l += 2) {
        u[l] = _mm512_unpacklo_ps(z[l], z[l + 1]);
        u[l + 1] = _mm512_unpackhi_ps(z[l], z[l + 1]);
    }
    for (int l = 0; l < 8; l += 4) {
        s[l] = _mm512_shuffle_ps(u[l], u[l + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[l + 1] = _mm512_shuffle_ps(u[l], u[l + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[l + 2] = _mm512_shuffle_ps(u[l + 1], u[l + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[l + 3] = _mm512_shuffle_ps(u[l + 1], u[l + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    /* key c: lanes 0-3 of s[c] and s[c + 4] (rows 0-7), then lanes 8-11 of each (rows 8-15); key
     * c + 4 the lanes 4 higher */
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(4));
    for (int c = 0; c < 4; ++c) {
        t[c] = _mm512_permutex2var_ps(s[c], first, s[c + 4]);
        t[c + 4] = _mm512_permutex2var_ps(s[c], second, s[c + 4]);
    }
}
#define VLOAD_TRANSPOSED(row, i, dt, t) avx512_load_transposed(row, i, dt, t)
#include "../vector_kernels.h"

const fa_cpu_kernels fa_cpu_kernels_avx512 = FA_VECTOR_KERNEL_TABLE("avx512");
#ifdef FA_AVX512BF16
/* The same kernels and gemm_max_bf16 (avx512bf16_kernels.c): select.c hands this table out only
 * on a CPU with AVX512_BF16. */
const fa_cpu_kernels fa_cpu_kernels_avx512_bf16 = {FA_VECTOR_KERNEL_FIELDS("avx512"),
                                                   .gemm_max_bf16 = fa_avx512bf16_gemm_max_bf16};
#endif

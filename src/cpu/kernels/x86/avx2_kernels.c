/* AVX2 + FMA (+ F16C) microkernels: 8 lanes, a 6 x 16 register tile (12 of the 16 ymm registers
 * accumulate). Built with -mavx2 -mfma -mf16c; selected only when cpuid reports all three. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "../kernels.h"

#define VEC __m256
#define W 8
#define MR 6
#define KNAME(x) avx2_##x
#define MASK_T __m256i
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VMLOAD(p, m) _mm256_maskload_ps(p, m)
#define VMSTORE(p, m, v) _mm256_maskstore_ps(p, m, v)
#define VSET1(x) _mm256_set1_ps(x)
#define VZERO() _mm256_setzero_ps()
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VDIV(a, b) _mm256_div_ps(a, b)
#define VABS(x) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x)
#define VCOPYSIGN(m, s) _mm256_or_ps(VABS(m), _mm256_and_ps(_mm256_set1_ps(-0.0f), s))
#define VSELECT_GE(a, b, y, n) _mm256_blendv_ps(n, y, _mm256_cmp_ps(a, b, _CMP_GE_OQ))
#define VSELECT_EQ(a, b, y, n) _mm256_blendv_ps(n, y, _mm256_cmp_ps(a, b, _CMP_EQ_OQ))
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VMIN(a, b) _mm256_min_ps(a, b)
#define VFNMA(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define VROUND(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* y * 2^n for integral n in [-126, 127]: n + 127 in the exponent field */
#define VSCALE2(y, n) \
    _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)))
/* exp (vector_kernels.h), with fewer operations and a shorter chain than the defaults (checkasm
 * --bench exp_cols, 64K scores: 24.9 -> 21 us): n = round(x log2 e) by one FMA with
 * FA_EXP_ROUNDER, whose sum keeps n in its low mantissa bits (not VROUND and a conversion), 2^n
 * applied by adding n << 23 to y's exponent field (an integer add, not a multiply: the same bits
 * while the result is normal). It is: x <= FA_EXP_HI gives n <= 127 and y < 2; x >= FA_EXP_LO
 * (-64 ln 2) gives n >= -64. Below FA_EXP_LO whatever comes out (-inf
 * included) is replaced by VZERO_BELOW's 0, so x needs no lower clamp; NaN (hi first in min,
 * which returns its second operand on NaN) comes out as NaN. */
#define VEXP_RANGE(x, lo) _mm256_min_ps(_mm256_set1_ps(FA_EXP_HI), x)
#define VEXP_T(x) _mm256_fmadd_ps(x, _mm256_set1_ps(FA_EXP_LOG2E), _mm256_set1_ps(FA_EXP_ROUNDER))
#define VEXP_N(t) _mm256_sub_ps(t, _mm256_set1_ps(FA_EXP_ROUNDER))
#define VEXP_SCALE2(y, t) \
    _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), _mm256_slli_epi32(_mm256_castps_si256(t), 23)))
#define VEXP_ESTRIN 1
#define VZERO_BELOW(y, x, lo) _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y)
#define VLOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VSTORE_F16(p, v) _mm_storeu_si128((__m128i *)(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT))
/* Quantised cache codes (vector_kernels.h, cache_load): 8 bytes. */
#define VLOAD_BYTES_U16(p) _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(p)))
#define VLOAD_I8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define VLOAD_E5M2(p) _mm256_cvtph_ps(_mm_slli_epi16(VLOAD_BYTES_U16(p), 8))
#define VLOAD_E4M3_OVER_256(p) _mm256_cvtph_ps(avx2_e4m3_as_f16(VLOAD_BYTES_U16(p)))
#define VLOAD_BF16(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define VHSUM(v) avx2_hsum(v)
#define NT_NR 2 /* 8 accumulators, 2 + 1 operands: 11 of the 16 ymm registers */
#define VSUM_TRANSPOSED(acc) avx2_transpose_sum(acc)
#define PV_CB 2 /* 8 accumulators, 2 V vectors and a broadcast: 11 of the 16 ymm registers */

/* Lane 4 * (i % 2) + i / 2 = the sum of the lanes of a[i]: halves, pairs and lanes of two vectors
 * at a time folded together. */
static inline __m256 avx2_transpose_sum(const __m256 *a)
{
    __m256 t[4], v[2];
    for (int i = 0; i < 4; ++i)
        t[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31));
    for (int i = 0; i < 2; ++i)
        v[i] = _mm256_add_ps(_mm256_unpacklo_ps(t[2 * i], t[2 * i + 1]), _mm256_unpackhi_ps(t[2 * i], t[2 * i + 1]));
    const __m256d v0 = _mm256_castps_pd(v[0]), v1 = _mm256_castps_pd(v[1]);
    return _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(v0, v1)), _mm256_castpd_ps(_mm256_unpackhi_pd(v0, v1)));
}
/* The 6-row tile reuses each B line only 6 times: with k = Bc = 512-1024, O = alpha O + P V
 * streamed its B panel (up to 64 KiB) and S^T from L2 and ran at 0.74-0.81 of the peak; blocks of
 * 256 keep the B panel in L1: 0.81-0.85 (checkasm --bench, 3 interleaved rounds, load 13). */
#define GEMM_KC 256
#define GEMM_PACK_KMAX 256
/* O = alpha O + P V with m = Br = 128 = 21 x 6 + 2: the 2-row tile ran its 4 accumulators at half
 * the FMA rate (2 of 128 rows, ~1.5% of the product); two 4-row tiles instead. And O's rows, which
 * the forward last touched 7 query tiles ago (L3), are prefetched when a tile starts: P V with
 * O cold 163 -> 159 us, with everything hot unchanged (128 x 512, d = 128, best of 60). */
#define GEMM_TAIL_4X4 1
#define GEMM_PREFETCH_C 1

static inline float avx2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static const int32_t avx2_mask_table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
#define VMASK(n) _mm256_loadu_si256((const __m256i *)(avx2_mask_table + 8 - (n)))

#include "avx_transpose.h"
#define VLOAD_TRANSPOSED(row, i, dt, t) fa_avx_load_transposed8(row, i, dt, t)
/* E4M3 codes (one per 16-bit lane) as binary16 bits of value / 2^8 (avx512_kernels.c says how). */
static inline __m128i avx2_e4m3_as_f16(__m128i u)
{
    const __m128i bits = _mm_and_si128(_mm_srai_epi16(_mm_slli_epi16(u, 8), 1), _mm_set1_epi16((short)0xbfff));
    const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(u, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7f));
    return _mm_or_si128(bits, nan);
}

#include "../vector_kernels.h"

const fa_cpu_kernels fa_cpu_kernels_avx2 = FA_VECTOR_KERNEL_TABLE("avx2");

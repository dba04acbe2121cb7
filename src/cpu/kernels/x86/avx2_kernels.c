/* AVX2 + FMA (+ F16C) microkernels: 8 lanes, a 6 x 16 register tile (12 of the 16 ymm registers
 * accumulate). Built with -mavx2 -mfma -mf16c; selected only when cpuid reports all three. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "../kernels.h"
#include "exp_poly.h"

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
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VEXP(x) avx2_exp(x)
#define VLOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))

static const int32_t avx2_mask_table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
#define VMASK(n) _mm256_loadu_si256((const __m256i *)(avx2_mask_table + 8 - (n)))

static inline __m256 avx2_exp(__m256 x)
{
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(FA_EXP_LO), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(FA_EXP_LO)), _mm256_set1_ps(FA_EXP_HI));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(FA_EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(FA_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(FA_EXP_LN2_LO), r);
    __m256 poly = _mm256_set1_ps(FA_EXP_P0);
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(FA_EXP_P1));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(FA_EXP_P2));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(FA_EXP_P3));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(FA_EXP_P4));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(FA_EXP_P5));
    const __m256 y = _mm256_fmadd_ps(poly, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
}

#include "vector_kernels.h"

const fa_cpu_kernels fa_cpu_kernels_avx2 = {"avx2", avx2_gemm, avx2_col_max, avx2_exp_cols, avx2_f16_to_f32,
                                            MR, 2 * W, 16};

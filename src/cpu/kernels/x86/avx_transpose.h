/* An 8 x 8 f32 block transposed in ymm registers (unpack, shuffle, 128-bit permute): the
 * transpose kernel's block for the AVX2 and the AVX-512 builds (on CPUs that split 512-bit
 * operations, as Zen 4 does, the 256-bit form is as fast and simpler), and the AVX2 bias_cols'
 * block of 8 keys of 8 bias rows, widened on the way in (the AVX-512 one transposes 16 rows in zmm
 * registers: avx512_kernels.c). Pure data movement. */
#ifndef FA_AVX_TRANSPOSE_H
#define FA_AVX_TRANSPOSE_H
#include <immintrin.h>
#include <stdint.h>

#include "../../common/dtype.h"

#define FA_TRANSPOSE_BLOCK 8
/* r[i] = row i in, column i out. */
static inline __attribute__((always_inline)) void fa_avx_transpose8_regs(__m256 *r)
{
    __m256 t[8], s[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* r_i0 r_{i+1}0 r_i1 r_{i+1}1 | columns 4, 5 */
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* columns 2, 3 | 6, 7 */
    }
    for (int i = 0; i < 8; i += 4) { /* rows i..i+3 of columns (0|4), (1|5), (2|6), (3|7) */
        s[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; ++c) {
        r[c] = _mm256_permute2f128_ps(s[c], s[c + 4], 0x20);
        r[c + 4] = _mm256_permute2f128_ps(s[c], s[c + 4], 0x31);
    }
}

static inline void fa_avx_transpose8(const float *src, int64_t ld_src, float *dst, int64_t ld_dst)
{
    __m256 r[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld_src);
    fa_avx_transpose8_regs(r);
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(dst + c * ld_dst, r[c]);
}
#define VTRANSPOSE_BLOCK(src, ld_src, dst, ld_dst) fa_avx_transpose8(src, ld_src, dst, ld_dst)

/* Elements i..i+7 of a row of dtype dt (a compile-time constant), widened exactly. */
static inline __attribute__((always_inline)) __m256 fa_avx_load8(const void *row, int64_t i, const int dt)
{
    if (dt == FA_DTYPE_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    if (dt == FA_DTYPE_BF16)
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i))), 16));
    return _mm256_loadu_ps((const float *)row + i);
}

/* t[c] (c < 8) = element i + c of rows row[0..8), widened: 8 keys of 8 bias rows, key-major. */
static inline __attribute__((always_inline)) void fa_avx_load_transposed8(const void *const *row, int64_t i, const int dt,
                                                                          __m256 *t)
{
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) t[l] = fa_avx_load8(row[l], i, dt);
    fa_avx_transpose8_regs(t);
}
#endif

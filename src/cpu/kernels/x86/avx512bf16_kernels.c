/* AVX-512-BF16 microkernel: gemm_max_bf16 (kernels.h) with vdpbf16ps, one instruction doing two
 * k steps of 16 lanes. Built into the AVX-512 library (same flags) with the BF16 extension named
 * per function (target attribute), so nothing else in the library can use it; select.c hands out
 * the table holding it only when cpuid reports AVX512_BF16. Register tile: 12 rows x 32 columns,
 * 24 of the 32 zmm registers accumulate, as the f32 gemm's. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../kernels.h"

#ifdef FA_AVX512BF16
#define BF16_TARGET __attribute__((target("avx512f,avx512bf16")))
#define BF16_INLINE static inline __attribute__((always_inline)) BF16_TARGET
enum { BF_W = 16, BF_MR = 12 };

/* A(i, p) and A(i, p + 1) as one 32-bit pair (p even, p + 1 < k). */
static inline uint32_t a_pair(const uint16_t *row, int64_t p)
{
    uint32_t w;
    memcpy(&w, row + p, sizeof w);
    return w;
}

BF16_INLINE __m512 dot_pairs(__m512 acc, uint32_t a, __m512i b)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)a), (__m512bh)b);
}

/* One register tile: C[mr x 2W] = A[mr x k] B[k x 2W]; masked: columns limited by m0, m1. */
BF16_INLINE void bf16_tile(int64_t k, const uint16_t *a, int64_t lda, const uint32_t *b, int64_t ldb, float *c,
                           int64_t ldc, const int mr, const int masked, __mmask16 m0, __mmask16 m1, float *col_max)
{
    __m512 acc0[BF_MR], acc1[BF_MR];
    for (int r = 0; r < mr; ++r) {
        acc0[r] = _mm512_setzero_ps();
        acc1[r] = _mm512_setzero_ps();
    }
    const int64_t pairs = k / 2;
    const uint32_t *bp = b;
    for (int64_t q = 0; q < pairs; ++q, bp += ldb) {
        const __m512i b0 = masked ? _mm512_maskz_loadu_epi32(m0, bp) : _mm512_loadu_si512(bp);
        const __m512i b1 = masked ? _mm512_maskz_loadu_epi32(m1, bp + BF_W) : _mm512_loadu_si512(bp + BF_W);
        for (int r = 0; r < mr; ++r) {
            const uint32_t av = a_pair(a + r * lda, 2 * q);
            acc0[r] = dot_pairs(acc0[r], av, b0);
            acc1[r] = dot_pairs(acc1[r], av, b1);
        }
    }
    if (k & 1) { /* the last A element alone (never read past the row), B's pad is 0 */
        const __m512i b0 = masked ? _mm512_maskz_loadu_epi32(m0, bp) : _mm512_loadu_si512(bp);
        const __m512i b1 = masked ? _mm512_maskz_loadu_epi32(m1, bp + BF_W) : _mm512_loadu_si512(bp + BF_W);
        for (int r = 0; r < mr; ++r) {
            const uint32_t av = a[r * lda + k - 1];
            acc0[r] = dot_pairs(acc0[r], av, b0);
            acc1[r] = dot_pairs(acc1[r], av, b1);
        }
    }
    if (col_max) {
        __m512 max0 = masked ? _mm512_maskz_loadu_ps(m0, col_max) : _mm512_loadu_ps(col_max);
        __m512 max1 = masked ? _mm512_maskz_loadu_ps(m1, col_max + BF_W) : _mm512_loadu_ps(col_max + BF_W);
        for (int r = 0; r < mr; ++r) { /* the f32 gemm_max's order: max(running, score) */
            max0 = _mm512_max_ps(max0, acc0[r]);
            max1 = _mm512_max_ps(max1, acc1[r]);
        }
        if (masked) {
            _mm512_mask_storeu_ps(col_max, m0, max0);
            _mm512_mask_storeu_ps(col_max + BF_W, m1, max1);
        } else {
            _mm512_storeu_ps(col_max, max0);
            _mm512_storeu_ps(col_max + BF_W, max1);
        }
    }
    for (int r = 0; r < mr; ++r) {
        float *cr = c + r * ldc;
        if (masked) {
            _mm512_mask_storeu_ps(cr, m0, acc0[r]);
            _mm512_mask_storeu_ps(cr + BF_W, m1, acc1[r]);
        } else {
            _mm512_storeu_ps(cr, acc0[r]);
            _mm512_storeu_ps(cr + BF_W, acc1[r]);
        }
    }
}

/* A column panel of 2W (or fewer, masked) columns over all m rows: full tiles, then 8, 4, 2, 1. */
BF16_INLINE void bf16_panel(int64_t m, int64_t k, const uint16_t *a, int64_t lda, const uint32_t *b, int64_t ldb,
                            float *c, int64_t ldc, const int masked, __mmask16 m0, __mmask16 m1, float *col_max)
{
    int64_t i = 0;
#define FA_BF16_TILE_AT(rows) bf16_tile(k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, rows, masked, m0, m1, col_max)
    for (; i + BF_MR <= m; i += BF_MR) FA_BF16_TILE_AT(BF_MR);
    if (i + 8 <= m) { FA_BF16_TILE_AT(8); i += 8; }
    if (i + 4 <= m) { FA_BF16_TILE_AT(4); i += 4; }
    if (i + 2 <= m) { FA_BF16_TILE_AT(2); i += 2; }
    if (i < m) FA_BF16_TILE_AT(1);
#undef FA_BF16_TILE_AT
}

BF16_TARGET void fa_avx512bf16_gemm_max_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                                             const uint32_t *b, int64_t ldb, float *c, int64_t ldc, float *col_max)
{
    if (col_max)
        for (int64_t j = 0; j < n; ++j) col_max[j] = -INFINITY;
    int64_t j = 0;
    for (; j + 2 * BF_W <= n; j += 2 * BF_W)
        bf16_panel(m, k, a, lda, b + j, ldb, c + j, ldc, 0, 0xffff, 0xffff, col_max ? col_max + j : NULL);
    if (j < n) {
        const int64_t left = n - j;
        const __mmask16 m0 = (__mmask16)((1u << (left < BF_W ? left : BF_W)) - 1u);
        const __mmask16 m1 = (__mmask16)((1u << (left > BF_W ? left - BF_W : 0)) - 1u);
        bf16_panel(m, k, a, lda, b + j, ldb, c + j, ldc, 1, m0, m1, col_max ? col_max + j : NULL);
    }
}
#endif

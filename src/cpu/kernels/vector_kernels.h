/* The vector microkernels, written once over a small set of vector macros and instantiated per
 * ISA (x86/avx2_kernels.c, x86/avx512_kernels.c, arm/neon_kernels.c). The including file defines:
 *   VEC, W (lanes), MR (register rows), KNAME(x) (name prefix), MASK_T, VMASK(n) (first n lanes),
 *   VLOAD, VSTORE, VMLOAD(p, m) (masked-off lanes read as 0, never touched), VMSTORE(p, m, v),
 *   VSET1, VZERO, VFMA(a, b, c) = a*b + c, VFNMA(a, b, c) = c - a*b, VADD, VMUL, VDIV, VMAX, VMIN,
 *   VABS(x), VCOPYSIGN(m, s) (|m| with the sign of s), VSELECT_GE(a, b, y, n) = a >= b ? y : n and
 *   VSELECT_EQ(a, b, y, n) = a == b ? y : n (ordered: false for NaN), optionally VRECIP(x) (1 / x),
 *   VROUND (to nearest integer), VSCALE2(y, n) = y * 2^n, VZERO_BELOW(y, x, lo) = x < lo ? 0 : y,
 *   optionally VEXP_RANGE(x, lo) (the exponential's argument clamp, see KNAME(exp)) and GEMM_KC
 *   (k blocking of gemm, see KNAME(gemm_any)),
 *   VLOAD_F16(p) (W binary16 values widened), VLOAD_BF16(p) (W bfloat16 values widened),
 *   VSTORE_F16(p, v) (W values rounded to binary16, to nearest even, and stored),
 *   VHSUM(v) (the sum of the lanes, in a fixed order), NT_NR (columns of a gemm_nt block:
 *   4 x NT_NR accumulators), optionally VTRANSPOSE_BLOCK(src, ld_src, dst, ld_dst) (a square
 *   block of FA_TRANSPOSE_BLOCK x FA_TRANSPOSE_BLOCK transposed in registers).
 * The register tile is MR x 2W: 2*MR accumulators, two B vectors and one broadcast of A. */
#ifndef FA_VECTOR_KERNELS_H
#define FA_VECTOR_KERNELS_H
#include "../../common/half.h"
#include "exp_poly.h"
#include "tanh_poly.h"
#endif

#define FA_INLINE static inline __attribute__((always_inline))

/* One register tile: C[mr x 2W] (+)= A[mr x k] B[k x 2W]; masked: B and C columns limited by m0, m1. */
FA_INLINE void KNAME(tile)(int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b, int64_t ldb,
                           float *c, int64_t ldc, const float *row_scale, int accumulate, const int mr,
                           const int masked, MASK_T m0, MASK_T m1, float *col_max)
{
    VEC acc0[MR], acc1[MR];
    for (int r = 0; r < mr; ++r) {
        acc0[r] = VZERO();
        acc1[r] = VZERO();
    }
    const float *ap = a;
    const float *bp = b;
    for (int64_t p = 0; p < k; ++p) {
        const VEC b0 = masked ? VMLOAD(bp, m0) : VLOAD(bp);
        const VEC b1 = masked ? VMLOAD(bp + W, m1) : VLOAD(bp + W);
        for (int r = 0; r < mr; ++r) {
            const VEC av = VSET1(ap[r * rsa]);
            acc0[r] = VFMA(av, b0, acc0[r]);
            acc1[r] = VFMA(av, b1, acc1[r]);
        }
        ap += csa;
        bp += ldb;
    }
    if (col_max) { /* gemm_max: the tile's column max merged into col_max[0, 2W) */
        VEC max0 = masked ? VMLOAD(col_max, m0) : VLOAD(col_max), max1 = masked ? VMLOAD(col_max + W, m1) : VLOAD(col_max + W);
        for (int r = 0; r < mr; ++r) {
            max0 = VMAX(max0, acc0[r]);
            max1 = VMAX(max1, acc1[r]);
        }
        if (masked) {
            VMSTORE(col_max, m0, max0);
            VMSTORE(col_max + W, m1, max1);
        } else {
            VSTORE(col_max, max0);
            VSTORE(col_max + W, max1);
        }
    }
    for (int r = 0; r < mr; ++r) {
        float *cr = c + r * ldc;
        if (accumulate) {
            const VEC s = VSET1(row_scale ? row_scale[r] : 1.0f);
            acc0[r] = VFMA(masked ? VMLOAD(cr, m0) : VLOAD(cr), s, acc0[r]);
            acc1[r] = VFMA(masked ? VMLOAD(cr + W, m1) : VLOAD(cr + W), s, acc1[r]);
        }
        if (masked) {
            VMSTORE(cr, m0, acc0[r]);
            VMSTORE(cr + W, m1, acc1[r]);
        } else {
            VSTORE(cr, acc0[r]);
            VSTORE(cr + W, acc1[r]);
        }
    }
}

/* A column panel of 2W (or fewer, masked) columns over all m rows: full MR tiles, then the
 * leftover rows in tiles of 8, 4, 2, 1. */
FA_INLINE void KNAME(panel)(int64_t m, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
                            int64_t ldb, float *c, int64_t ldc, const float *row_scale, int accumulate,
                            const int masked, MASK_T m0, MASK_T m1, float *col_max)
{
    int64_t i = 0;
#define FA_TILE_AT(rows)                                                                                        \
    KNAME(tile)(k, a + i * rsa, rsa, csa, b, ldb, c + i * ldc, ldc, row_scale ? row_scale + i : NULL, accumulate, \
                rows, masked, m0, m1, col_max)
    for (; i + MR <= m; i += MR) FA_TILE_AT(MR);
#if MR > 8
    if (i + 8 <= m) { FA_TILE_AT(8); i += 8; }
#endif
    if (i + 4 <= m) { FA_TILE_AT(4); i += 4; }
    if (i + 2 <= m) { FA_TILE_AT(2); i += 2; }
    if (i < m) FA_TILE_AT(1);
#undef FA_TILE_AT
}

#ifndef GEMM_KC
#define GEMM_KC 0 /* no k blocking: one pass over k (see gemm_any) */
#endif

/* Column panels outermost: the k x 2W panel of B stays in L1 while A streams past it. col_max:
 * NULL, or gemm_max's output (each tile merges its maximum). */
FA_INLINE void KNAME(panels)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa,
                             const float *b, int64_t ldb, float *c, int64_t ldc, const float *row_scale,
                             int accumulate, float *col_max)
{
    int64_t j = 0;
    for (; j + 2 * W <= n; j += 2 * W)
        KNAME(panel)(m, k, a, rsa, csa, b + j, ldb, c + j, ldc, row_scale, accumulate, 0, VMASK(W), VMASK(W),
                     col_max ? col_max + j : NULL);
    if (j < n) {
        const int64_t left = n - j;
        KNAME(panel)(m, k, a, rsa, csa, b + j, ldb, c + j, ldc, row_scale, accumulate, 1,
                     VMASK(left < W ? left : W), VMASK(left > W ? left - W : 0), col_max ? col_max + j : NULL);
    }
}

FA_INLINE void KNAME(gemm_any)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa,
                               const float *b, int64_t ldb, float *c, int64_t ldc, const float *row_scale,
                               int accumulate, float *col_max)
{
    if (col_max)
        for (int64_t j = 0; j < n; ++j) col_max[j] = -INFINITY;
#if GEMM_KC > 0
    /* Long k (P V and dS K, k = Bc): blocks of GEMM_KC, so that each block's B panel is reused
     * from L1 by every row tile; C takes the blocks' sums in turn (p still in increasing order,
     * the blocking depends on k only). */
    if (k > GEMM_KC && !col_max) {
        for (int64_t p0 = 0; p0 < k; p0 += GEMM_KC)
            KNAME(panels)(m, n, k - p0 < GEMM_KC ? k - p0 : GEMM_KC, a + p0 * csa, rsa, csa, b + p0 * ldb, ldb, c, ldc,
                          p0 ? NULL : row_scale, p0 ? 1 : accumulate, NULL);
        return;
    }
#endif
    KNAME(panels)(m, n, k, a, rsa, csa, b, ldb, c, ldc, row_scale, accumulate, col_max);
}

static void KNAME(gemm)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
                        int64_t ldb, float *c, int64_t ldc, const float *row_scale, int accumulate)
{
    KNAME(gemm_any)(m, n, k, a, rsa, csa, b, ldb, c, ldc, row_scale, accumulate, NULL);
}

static void KNAME(gemm_max)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa,
                            const float *b, int64_t ldb, float *c, int64_t ldc, float *col_max)
{
    KNAME(gemm_any)(m, n, k, a, rsa, csa, b, ldb, c, ldc, NULL, 0, col_max);
}

/* One block of C = A B^T: C[mi x nj], each element's products in the lanes of its own vector
 * (the tail of p read as zeros), reduced once at the end by VHSUM. */
FA_INLINE void KNAME(nt_block)(int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                               int64_t ldc, const int mi, const int nj)
{
    VEC acc[4][NT_NR];
    for (int i = 0; i < mi; ++i)
        for (int j = 0; j < nj; ++j) acc[i][j] = VZERO();
    int64_t p = 0;
    for (; p + W <= k; p += W) {
        VEC bv[NT_NR];
        for (int j = 0; j < nj; ++j) bv[j] = VLOAD(b + j * ldb + p);
        for (int i = 0; i < mi; ++i) {
            const VEC av = VLOAD(a + i * lda + p);
            for (int j = 0; j < nj; ++j) acc[i][j] = VFMA(av, bv[j], acc[i][j]);
        }
    }
    if (p < k) {
        const MASK_T tail = VMASK(k - p);
        VEC bv[NT_NR];
        for (int j = 0; j < nj; ++j) bv[j] = VMLOAD(b + j * ldb + p, tail);
        for (int i = 0; i < mi; ++i) {
            const VEC av = VMLOAD(a + i * lda + p, tail);
            for (int j = 0; j < nj; ++j) acc[i][j] = VFMA(av, bv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < mi; ++i)
        for (int j = 0; j < nj; ++j) c[i * ldc + j] = VHSUM(acc[i][j]);
}

/* Blocks of 4 x NT_NR, then single rows and columns (all block shapes are compile-time constants). */
static void KNAME(gemm_nt)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                           float *c, int64_t ldc)
{
    int64_t i = 0;
#define FA_NT_AT(mi, nj) KNAME(nt_block)(k, a + i * lda, lda, b + j * ldb, ldb, c + i * ldc + j, ldc, mi, nj)
    for (; i + 4 <= m; i += 4) {
        int64_t j = 0;
        for (; j + NT_NR <= n; j += NT_NR) FA_NT_AT(4, NT_NR);
        for (; j < n; ++j) FA_NT_AT(4, 1);
    }
    for (; i < m; ++i) {
        int64_t j = 0;
        for (; j + NT_NR <= n; j += NT_NR) FA_NT_AT(1, NT_NR);
        for (; j < n; ++j) FA_NT_AT(1, 1);
    }
#undef FA_NT_AT
}

static void KNAME(col_max)(const float *x, int64_t ld, int64_t rows, int64_t cols, float *out)
{
    for (int64_t j = 0; j < cols; j += W) {
        const int64_t left = cols - j;
        const MASK_T m = VMASK(left < W ? left : W);
        VEC best = VSET1(-INFINITY);
        for (int64_t i = 0; i < rows; ++i) best = VMAX(best, VMLOAD(x + i * ld + j, m));
        VMSTORE(out + j, m, best);
    }
}

/* exp(x) = 2^n e^r, see exp_poly.h. VEXP_RANGE clamps x to [FA_EXP_LO, FA_EXP_HI] where VSCALE2
 * needs n in [-126, 127]; an ISA whose VSCALE2 takes any n defines it as x (two operations of
 * about eighteen saved); x below FA_EXP_LO (-inf included) gives 0 either way. */
#ifndef VEXP_RANGE
#define VEXP_RANGE(x, lo) VMIN(VMAX(x, lo), VSET1(FA_EXP_HI))
#endif
FA_INLINE VEC KNAME(exp)(VEC x)
{
    const VEC lo = VSET1(FA_EXP_LO);
    const VEC xc = VEXP_RANGE(x, lo);
    const VEC n = VROUND(VMUL(xc, VSET1(FA_EXP_LOG2E)));
    const VEC r = VFNMA(n, VSET1(FA_EXP_LN2_LO), VFNMA(n, VSET1(FA_EXP_LN2_HI), xc));
    VEC poly = VSET1(FA_EXP_P0);
    poly = VFMA(poly, r, VSET1(FA_EXP_P1));
    poly = VFMA(poly, r, VSET1(FA_EXP_P2));
    poly = VFMA(poly, r, VSET1(FA_EXP_P3));
    poly = VFMA(poly, r, VSET1(FA_EXP_P4));
    poly = VFMA(poly, r, VSET1(FA_EXP_P5));
    const VEC y = VFMA(poly, VMUL(r, r), VADD(r, VSET1(1.0f)));
    return VZERO_BELOW(VSCALE2(y, n), x, lo);
}
#define VEXP(x) KNAME(exp)(x)

static void KNAME(exp_cols)(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, const float *shift,
                            float *sum)
{
    const VEC vscale = VSET1(scale);
    int64_t j = 0;
    /* Two column vectors per sweep: independent exponentials keep both FMA pipes busy. */
    for (; j + 2 * W <= cols; j += 2 * W) {
        const VEC nshift0 = VMUL(VLOAD(shift + j), VSET1(-1.0f)), nshift1 = VMUL(VLOAD(shift + j + W), VSET1(-1.0f));
        VEC s0 = VZERO(), s1 = VZERO();
        for (int64_t i = 0; i < rows; ++i) {
            float *row = x + i * ld + j;
            const VEC e0 = VEXP(VFMA(VLOAD(row), vscale, nshift0));
            const VEC e1 = VEXP(VFMA(VLOAD(row + W), vscale, nshift1));
            VSTORE(row, e0);
            VSTORE(row + W, e1);
            s0 = VADD(s0, e0);
            s1 = VADD(s1, e1);
        }
        VSTORE(sum + j, s0);
        VSTORE(sum + j + W, s1);
    }
    for (; j < cols; j += W) {
        const int64_t left = cols - j;
        const MASK_T m = VMASK(left < W ? left : W);
        const VEC nshift = VMUL(VMLOAD(shift + j, m), VSET1(-1.0f));
        VEC s = VZERO();
        for (int64_t i = 0; i < rows; ++i) {
            float *row = x + i * ld + j;
            const VEC e = VEXP(VFMA(VMLOAD(row, m), vscale, nshift));
            VMSTORE(row, m, e);
            s = VADD(s, e);
        }
        VMSTORE(sum + j, m, s);
    }
}

/* 1 / x: an ISA whose reciprocal estimate is specified bit for bit (AVX-512's rcp14) may define
 * it as the estimate refined by Newton's step (a division costs about 10 times more). */
#ifndef VRECIP
#define VRECIP(x) VDIV(VSET1(1.0f), x)
#endif

/* tanh, see tanh_poly.h: the odd rational p(x) / q(x) on x clamped to +-FA_TANH_ONE, where it is
 * 1. The clamp's constant is min's and max's first operand: x86 returns the second when either
 * is NaN, so a NaN x comes out as it went in. */
FA_INLINE VEC KNAME(tanh)(VEC x)
{
    const VEC xc = VMAX(VSET1(-FA_TANH_ONE), VMIN(VSET1(FA_TANH_ONE), x)), z = VMUL(xc, xc);
    VEC p = VSET1(FA_TANH_A13);
    p = VFMA(p, z, VSET1(FA_TANH_A11));
    p = VFMA(p, z, VSET1(FA_TANH_A9));
    p = VFMA(p, z, VSET1(FA_TANH_A7));
    p = VFMA(p, z, VSET1(FA_TANH_A5));
    p = VFMA(p, z, VSET1(FA_TANH_A3));
    p = VFMA(p, z, VSET1(FA_TANH_A1));
    VEC q = VSET1(FA_TANH_B6);
    q = VFMA(q, z, VSET1(FA_TANH_B4));
    q = VFMA(q, z, VSET1(FA_TANH_B2));
    q = VFMA(q, z, VSET1(FA_TANH_B0));
    return VMUL(VMUL(xc, p), VRECIP(q));
}

FA_INLINE void KNAME(softcap_vec)(float *x, float *grad, float *col_max, const int masked, MASK_T m, VEC factor,
                                  VEC cap, VEC minus_slope, VEC offset)
{
    const VEC s = masked ? VMLOAD(x, m) : VLOAD(x);
    const VEC t = KNAME(tanh)(VMUL(s, factor));
    /* ALiBi (slope 0: + -0, exact) after the cap, as alibi_cols with scale 1 would add it */
    const VEC capped = VADD(VMUL(cap, t), VMUL(minus_slope, VABS(offset)));
    const VEC y = VSELECT_EQ(s, VSET1(-INFINITY), s, capped); /* masked stays masked */
    if (masked) VMSTORE(x, m, y);
    else VSTORE(x, y);
    if (col_max) {
        const VEC best = VMAX(masked ? VMLOAD(col_max, m) : VLOAD(col_max), y);
        if (masked) VMSTORE(col_max, m, best);
        else VSTORE(col_max, best);
    }
    if (!grad) return;
    const VEC g = VFNMA(t, t, VSET1(1.0f));
    if (masked) VMSTORE(grad, m, g);
    else VSTORE(grad, g);
}

static void KNAME(softcap_cols)(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, float cap, float slope,
                                int64_t first, float *grad, float *col_max)
{
    static const float lane_index[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const VEC factor = VSET1(scale / cap), vcap = VSET1(cap), minus_slope = VSET1(-slope), lanes = VLOAD(lane_index);
    for (int64_t j = 0; col_max && j < cols; ++j) col_max[j] = -INFINITY;
    for (int64_t i = 0; i < rows; ++i) {
        float *row = x + i * ld, *grow = grad ? grad + i * ld : NULL;
        const float offset = (float)(first - i);
        for (int64_t j = 0; j < cols; j += W) {
            const int masked = cols - j < W;
            const VEC distance = VADD(VSET1(offset), VADD(lanes, VSET1((float)j)));
            KNAME(softcap_vec)(row + j, grow ? grow + j : NULL, col_max ? col_max + j : NULL, masked,
                               VMASK(masked ? cols - j : W), factor, vcap, minus_slope, distance);
        }
    }
}

/* ALiBi: x = x * scale - slope * |(first - i) + j|, the distance's two terms exact integers in
 * float (|.| < 2^24) so every ISA and the reference give the same bits; -inf (masked) is kept
 * whatever the sign of the scale. */
static void KNAME(alibi_cols)(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, float slope, int64_t first,
                              float *col_max)
{
    static const float lane_index[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const VEC vscale = VSET1(scale), minus_slope = VSET1(-slope), lanes = VLOAD(lane_index);
    for (int64_t j = 0; col_max && j < cols; ++j) col_max[j] = -INFINITY;
    for (int64_t i = 0; i < rows; ++i) {
        float *row = x + i * ld;
        const float offset = (float)(first - i);
        for (int64_t j = 0; j < cols; j += W) {
            const int masked = cols - j < W;
            const MASK_T m = VMASK(masked ? cols - j : W);
            const VEC dist = VABS(VADD(VSET1(offset), VADD(lanes, VSET1((float)j))));
            const VEC x0 = masked ? VMLOAD(row + j, m) : VLOAD(row + j);
            const VEC s = VSELECT_EQ(x0, VSET1(-INFINITY), x0, VADD(VMUL(x0, vscale), VMUL(minus_slope, dist)));
            if (masked) VMSTORE(row + j, m, s);
            else VSTORE(row + j, s);
            if (!col_max) continue;
            const VEC best = VMAX(masked ? VMLOAD(col_max + j, m) : VLOAD(col_max + j), s);
            if (masked) VMSTORE(col_max + j, m, best);
            else VSTORE(col_max + j, best);
        }
    }
}

/* x = x * scale + add (two roundings, the reference's bits), -inf left as it is. */
static void KNAME(add_cols)(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, const float *add,
                            int64_t ld_add)
{
    const VEC vscale = VSET1(scale), minus_inf = VSET1(-INFINITY);
    for (int64_t i = 0; i < rows; ++i) {
        float *row = x + i * ld;
        const float *arow = add + i * ld_add;
        for (int64_t j = 0; j < cols; j += W) {
            const int masked = cols - j < W;
            const MASK_T m = VMASK(masked ? cols - j : W);
            const VEC s = masked ? VMLOAD(row + j, m) : VLOAD(row + j);
            const VEC a = masked ? VMLOAD(arow + j, m) : VLOAD(arow + j);
            const VEC y = VSELECT_EQ(s, minus_inf, s, VADD(VMUL(s, vscale), a)); /* masked stays masked */
            if (masked) VMSTORE(row + j, m, y);
            else VSTORE(row + j, y);
        }
    }
}

/* dst[c * ld_dst + r] = src[r * ld_src + c]: in register blocks where the ISA has them
 * (VTRANSPOSE_BLOCK, FA_TRANSPOSE_BLOCK square), element by element at the edges. */
static void KNAME(transpose)(const float *src, int64_t ld_src, int64_t rows, int64_t cols, float *dst, int64_t ld_dst)
{
    int64_t r0 = 0;
#ifdef VTRANSPOSE_BLOCK
    enum { TB = FA_TRANSPOSE_BLOCK };
    for (; r0 + TB <= rows; r0 += TB) {
        int64_t c0 = 0;
        for (; c0 + TB <= cols; c0 += TB) VTRANSPOSE_BLOCK(src + r0 * ld_src + c0, ld_src, dst + c0 * ld_dst + r0, ld_dst);
        for (; c0 < cols; ++c0)
            for (int64_t r = r0; r < r0 + TB; ++r) dst[c0 * ld_dst + r] = src[r * ld_src + c0];
    }
#endif
    for (; r0 < rows; ++r0)
        for (int64_t c = 0; c < cols; ++c) dst[c * ld_dst + r0] = src[r0 * ld_src + c];
}

static void KNAME(f16_to_f32)(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + W <= n; i += W) VSTORE(dst + i, VLOAD_F16(src + i));
    for (; i < n; ++i) dst[i] = fa_f16_to_f32(src[i]);
}

static void KNAME(bf16_to_f32)(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + W <= n; i += W) VSTORE(dst + i, VLOAD_BF16(src + i));
    for (; i < n; ++i) dst[i] = fa_bf16_to_f32(src[i]);
}

static void KNAME(f32_to_f16)(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + W <= n; i += W) VSTORE_F16(dst + i, VLOAD(src + i));
    for (; i < n; ++i) dst[i] = fa_f32_to_f16(src[i]);
}

/* The FMA-peak probe (fma_peak.h): 2*MR register-only chains, as many as the gemm tile's
 * accumulators. acc = acc * m + a converges to a / (1 - m) = 1: no overflow, no subnormals. */
static double KNAME(fma_chains)(int64_t iterations, float *sink)
{
    VEC acc[2 * MR];
#pragma GCC unroll 64
    for (int c = 0; c < 2 * MR; ++c) acc[c] = VSET1((float)c);
    const VEC m = VSET1(0.999999f), a = VSET1(1e-6f);
    for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 64 /* unrolled, the chains live in registers */
        for (int c = 0; c < 2 * MR; ++c) acc[c] = VFMA(acc[c], m, a);
    }
    VEC total = acc[0];
#pragma GCC unroll 64
    for (int c = 1; c < 2 * MR; ++c) total = VADD(total, acc[c]);
    *sink = VHSUM(total);
    return 2.0 * W * 2 * MR * (double)iterations;
}

/* The ISA's table (kernels.h), named by the including file: one list of kernels for every ISA. */
#define FA_VECTOR_KERNEL_TABLE(name)                                                                      \
    {                                                                                                     \
        .isa = name, .gemm = KNAME(gemm), .col_max = KNAME(col_max), .exp_cols = KNAME(exp_cols), .softcap_cols = KNAME(softcap_cols), .alibi_cols = KNAME(alibi_cols), .add_cols = KNAME(add_cols), .transpose = KNAME(transpose),          \
        .f16_to_f32 = KNAME(f16_to_f32), .bf16_to_f32 = KNAME(bf16_to_f32), .f32_to_f16 = KNAME(f32_to_f16), \
        .gemm_nt = KNAME(gemm_nt), .gemm_max = KNAME(gemm_max), .fma_chains = KNAME(fma_chains), .mr = MR, .nr = 2 * W, .tile_step = 16,                                \
    }

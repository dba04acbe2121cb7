/* The vector microkernels, written once over a small set of vector macros and instantiated per
 * ISA (x86/avx2_kernels.c, x86/avx512_kernels.c, arm/neon_kernels.c). The including file defines:
 *   VEC, W (lanes), MR (register rows), KNAME(x) (name prefix), MASK_T, VMASK(n) (first n lanes),
 *   VLOAD, VSTORE, VMLOAD(p, m) (masked-off lanes read as 0, never touched), VMSTORE(p, m, v),
 *   VSET1, VZERO, VFMA(a, b, c) = a*b + c, VFNMA(a, b, c) = c - a*b, VADD, VSUB, VMUL, VDIV, VMAX, VMIN,
 *   VABS(x), VCOPYSIGN(m, s) (|m| with the sign of s), VSELECT_GE(a, b, y, n) = a >= b ? y : n and
 *   VSELECT_EQ(a, b, y, n) = a == b ? y : n (ordered: false for NaN),
 *   VROUND (to nearest integer), VSCALE2(y, n) = y * 2^n, VZERO_BELOW(y, x, lo) = x < lo ? 0 : y,
 *   optionally VEXP_RANGE(x, lo) (the exponential's argument clamp), VEXP_T, VEXP_N and VEXP_SCALE2
 *   (its n = round(x log2 e) and 2^n) and VEXP_ESTRIN (its polynomial's form), see KNAME(exp),
 *   GEMM_KC (k blocking of gemm, see KNAME(gemm_any)) and GEMM_PACK_KMAX (B panels copied, see
 *   KNAME(panels)), optionally GEMM_PREFETCH_C (1: an accumulating tile prefetches its C rows when it
 *   starts) and GEMM_TAIL_4X4 (1: m = MR q + 2 ends with two 4-row tiles, see KNAME(panel)),
 *   VLOAD_F16(p) (W binary16 values widened), VLOAD_BF16(p) (W bfloat16 values widened),
 *   VSTORE_F16(p, v) (W values rounded to binary16, to nearest even, and stored),
 *   VHSUM(v) (the sum of the lanes, in a fixed order), NT_NR (columns of a gemm_nt block:
 *   4 x NT_NR accumulators), VSUM_TRANSPOSED(acc) (W vectors reduced at once: lane
 *   4 * (i % (W/4)) + i / (W/4) of the result is the sum of the lanes of acc[i], by a fixed
 *   transpose-and-add tree), PV_CB (vectors of columns of a decode_values block: 4 x PV_CB
 *   accumulators), optionally VTRANSPOSE_BLOCK(src, ld_src, dst, ld_dst) (a square block of
 *   FA_TRANSPOSE_BLOCK x FA_TRANSPOSE_BLOCK transposed in registers), optionally
 *   VLOAD_TRANSPOSED(row, i, dt, t) (t[c] for c < BIAS_KEYS = lane l: element i + c of row[l],
 *   l < W, of dtype dt widened; bias_cols' block, transposed in registers).
 * The register tile is MR x 2W: 2*MR accumulators, two B vectors and one broadcast of A. */
#ifndef FA_VECTOR_KERNELS_H
#define FA_VECTOR_KERNELS_H
#include <float.h>

#include "../../common/dtype.h"
#include "../../common/half.h"
#include "../../common/quant_codes.h"
#include "exp_poly.h"
#include "tanh_poly.h"
#endif

#define FA_INLINE static inline __attribute__((always_inline))

/* a where a == b, else x + y or max(x, y); AVX-512 has each in one masked instruction */
#ifndef VADD_UNLESS_EQ
#define VADD_UNLESS_EQ(a, b, x, y) VSELECT_EQ(a, b, a, VADD(x, y))
#endif
#ifndef VMAX_UNLESS_EQ
#define VMAX_UNLESS_EQ(a, b, x, y) VSELECT_EQ(a, b, a, VMAX(x, y))
#endif

/* cap * tanh(x), see tanh_poly.h: x p(z) / q(z), z = min(x^2, FA_TANH_Z_MAX), as one quotient
 * num / den: den = q / cap, the cap folded into q's coefficients once per call
 * (KNAME(tanh_den_for)), so a capped score costs no multiplication beyond tanh's own; one
 * division, not a reciprocal and its Newton step (on Zen 4 the divider works beside the FMA
 * pipes, which the products keep busy). The clamp of z is min's first operand: x86 returns the
 * second when either is NaN, so a NaN x comes out as it went in; an infinite x gives z at the
 * clamp and an infinite num. KNAME(capped_score) clamps the quotient to [-cap, cap]. */
typedef struct KNAME(tanh_den) {
    float q0, q1, q2, q3, q4, cap;
} KNAME(tanh_den);
FA_INLINE KNAME(tanh_den) KNAME(tanh_den_for)(float cap)
{
    return (KNAME(tanh_den)){FA_TANH_Q0 / cap, FA_TANH_Q1 / cap, FA_TANH_Q2 / cap, FA_TANH_Q3 / cap, FA_TANH_Q4 / cap, cap};
}
FA_INLINE void KNAME(capped_tanh)(VEC x, const KNAME(tanh_den) *b, VEC *num, VEC *den)
{
    const VEC z = VMIN(VSET1(FA_TANH_Z_MAX), VMUL(x, x));
    VEC p = VADD(z, VSET1(FA_TANH_P3)); /* p is monic: its first step is an add, off the FMA pipes */
    p = VFMA(p, z, VSET1(FA_TANH_P2));
    p = VFMA(p, z, VSET1(FA_TANH_P1));
    p = VFMA(p, z, VSET1(FA_TANH_P0));
    VEC q = VFMA(VSET1(b->q4), z, VSET1(b->q3));
    q = VFMA(q, z, VSET1(b->q2));
    q = VFMA(q, z, VSET1(b->q1));
    *den = VFMA(q, z, VSET1(b->q0));
    *num = VMUL(x, p);
}
/* num / den clamped to [-cap, cap] (the cap first: NaN passes, as in capped_tanh), or -inf where
 * the raw score s is -inf (masked stays masked: the lower clamp skips those lanes, on AVX-512 in
 * one masked max, elsewhere a select after the max; a compare, not three operations after the
 * clamp on pipes that the products share on Intel). Past the clamp of z, |num / den| grows beyond
 * cap: the result is then exactly +-cap. */
FA_INLINE VEC KNAME(capped_score)(VEC s, VEC num, VEC den, const KNAME(tanh_den) *b)
{
    return VMIN(VSET1(b->cap), VMAX_UNLESS_EQ(s, VSET1(-INFINITY), VSET1(-b->cap), VDIV(num, den)));
}

static const float KNAME(lane_index)[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* The key-to-query distance (first - i) + j of the W columns from j, an exact integer in float. */
FA_INLINE VEC KNAME(distance)(int64_t first, int64_t i, int64_t j)
{
    return VADD(VSET1((float)(first - i)), VADD(VLOAD(KNAME(lane_index)), VSET1((float)j)));
}

/* The score modifiers of one vector of raw scores, each the one home of its bits: softcap_cols,
 * alibi_cols and gemm_scores' register epilogue all call them. -inf (masked) stays. capped: cap *
 * tanh of the raw score, -inf where it was -inf (KNAME(capped_score)). */
FA_INLINE VEC KNAME(softcap_value)(VEC capped, VEC minus_slope, VEC distance)
{
    /* ALiBi after the cap, as alibi_cols with scale 1 would add it (softcap_cols with slope 0
     * adds -0: exact, so the epilogue without ALiBi leaves it out for the same bits); -inf + a
     * finite term stays -inf */
    return VADD(capped, VMUL(minus_slope, VABS(distance)));
}
FA_INLINE VEC KNAME(alibi_value)(VEC s, VEC scale, VEC minus_slope, VEC distance)
{
    return VSELECT_EQ(s, VSET1(-INFINITY), s, VADD(VMUL(s, scale), VMUL(minus_slope, VABS(distance))));
}

/* gemm_scores' modifiers with what they need computed once per call (not once per register tile):
 * scale / cap and q / cap. A copy the stores to C cannot alias: its fields stay where they are. */
typedef struct KNAME(scores) {
    fa_cpu_score_mods m;
    float factor;
    KNAME(tanh_den) den;
    /* gemm_ds: the backward's dS = P o (C - delta) (p, ldp, delta) instead of the modifiers. */
    enum { KNAME(epilogue_mods), KNAME(epilogue_ds) } epilogue;
    const float *p, *delta;
    int64_t ldp;
} KNAME(scores);

/* gemm_scores' epilogue: the modifiers of mods on the raw scores of a register tile (rows i0 + r,
 * columns j0 and j0 + W; masked, m0, m1 as the tile's), or gemm_ds' dS. The modes are tested once per tile, not per vector, and the two column
 * vectors of a row go through each step together (two independent chains for the pipes). */
FA_INLINE void KNAME(modify_tile)(VEC *acc0, VEC *acc1, const int mr, const KNAME(scores) *mods, int64_t i0,
                                  int64_t j0, const int masked, MASK_T m0, MASK_T m1)
{
    const VEC minus_slope = VSET1(-mods->m.slope);
    if (mods->epilogue == KNAME(epilogue_ds)) { /* P o (dP - D), as the backward's loop computed it */
        const VEC delta0 = masked ? VMLOAD(mods->delta + j0, m0) : VLOAD(mods->delta + j0);
        const VEC delta1 = masked ? VMLOAD(mods->delta + j0 + W, m1) : VLOAD(mods->delta + j0 + W);
        for (int r = 0; r < mr; ++r) {
            const float *pr = mods->p + (i0 + r) * mods->ldp + j0;
            acc0[r] = VMUL(masked ? VMLOAD(pr, m0) : VLOAD(pr), VSUB(acc0[r], delta0));
            acc1[r] = VMUL(masked ? VMLOAD(pr + W, m1) : VLOAD(pr + W), VSUB(acc1[r], delta1));
        }
    } else if (mods->m.cap > 0.0f) {
        const VEC factor = VSET1(mods->factor);
        for (int r = 0; r < mr; ++r) {
            VEC num0, den0, num1, den1;
            KNAME(capped_tanh)(VMUL(acc0[r], factor), &mods->den, &num0, &den0);
            KNAME(capped_tanh)(VMUL(acc1[r], factor), &mods->den, &num1, &den1);
            const VEC y0 = KNAME(capped_score)(acc0[r], num0, den0, &mods->den);
            const VEC y1 = KNAME(capped_score)(acc1[r], num1, den1, &mods->den);
            if (mods->m.alibi) {
                acc0[r] = KNAME(softcap_value)(y0, minus_slope, KNAME(distance)(mods->m.first, i0 + r, j0));
                acc1[r] = KNAME(softcap_value)(y1, minus_slope, KNAME(distance)(mods->m.first, i0 + r, j0 + W));
            } else {
                acc0[r] = y0;
                acc1[r] = y1;
            }
        }
    } else if (mods->m.alibi) {
        const VEC scale = VSET1(mods->m.scale);
        for (int r = 0; r < mr; ++r) {
            acc0[r] = KNAME(alibi_value)(acc0[r], scale, minus_slope, KNAME(distance)(mods->m.first, i0 + r, j0));
            acc1[r] = KNAME(alibi_value)(acc1[r], scale, minus_slope, KNAME(distance)(mods->m.first, i0 + r, j0 + W));
        }
    }
}

#ifndef GEMM_KC
#define GEMM_KC 0 /* no k blocking: one pass over k (see gemm_any) */
#endif

#ifndef GEMM_PACK_KMAX
#define GEMM_PACK_KMAX 0 /* no packing of B panels (see panels) */
#endif
#if GEMM_PACK_KMAX > 0 /* tile's and panel's pack argument, only where panels are copied */
#define FA_PACK_PARAM , float *pack
#define FA_PACK_ARG(x) , x
#else
#define FA_PACK_PARAM
#define FA_PACK_ARG(x)
#endif

/* One register tile: C[mr x 2W] (+)= A[mr x k] B[k x 2W]; masked: B and C columns limited by m0, m1.
 * mods (gemm_scores; NULL = none): the tile is rows i0.., columns j0.. of C. pack (NULL = none, never
 * with masked): each line of B as loaded is also stored to pack[p * 2W, (p + 1) * 2W), the panel
 * copy of KNAME(panels) made by the panel's first tile. */
FA_INLINE void KNAME(tile)(int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b, int64_t ldb,
                           float *c, int64_t ldc, const float *row_scale, int accumulate, const int mr,
                           const int masked, MASK_T m0, MASK_T m1, float *col_max, const KNAME(scores) *mods,
                           int64_t i0, int64_t j0 FA_PACK_PARAM)
{
    VEC acc0[MR], acc1[MR];
    for (int r = 0; r < mr; ++r) {
        acc0[r] = VZERO();
        acc1[r] = VZERO();
    }
#if GEMM_PREFETCH_C
    if (accumulate && !masked) /* C's rows (all 2W columns exist), read after the k loop, into L1 meanwhile */
        for (int r = 0; r < mr; ++r) {
            __builtin_prefetch(c + r * ldc, 1, 3);
            __builtin_prefetch(c + r * ldc + 2 * W - 1, 1, 3);
        }
#endif
    const float *ap = a;
    const float *bp = b;
    for (int64_t p = 0; p < k; ++p) {
        const VEC b0 = masked ? VMLOAD(bp, m0) : VLOAD(bp);
        const VEC b1 = masked ? VMLOAD(bp + W, m1) : VLOAD(bp + W);
#if GEMM_PACK_KMAX > 0
        if (pack) {
            VSTORE(pack + p * 2 * W, b0);
            VSTORE(pack + p * 2 * W + W, b1);
        }
#endif
        for (int r = 0; r < mr; ++r) {
            const VEC av = VSET1(ap[r * rsa]);
            acc0[r] = VFMA(av, b0, acc0[r]);
            acc1[r] = VFMA(av, b1, acc1[r]);
        }
        ap += csa;
        bp += ldb;
    }
    if (mods) KNAME(modify_tile)(acc0, acc1, mr, mods, i0, j0, masked, m0, m1); /* gemm_scores, gemm_ds */
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
                            const int masked, MASK_T m0, MASK_T m1, float *col_max, const KNAME(scores) *mods,
                            int64_t j0 FA_PACK_PARAM)
{
    int64_t i = 0;
#define FA_TILE_AT(rows)                                                                                        \
    KNAME(tile)(k, a + i * rsa, rsa, csa, b, ldb, c + i * ldc, ldc, row_scale ? row_scale + i : NULL, accumulate, \
                rows, masked, m0, m1, col_max, mods, i, j0 FA_PACK_ARG(NULL))
#if GEMM_PACK_KMAX > 0
    if (pack) { /* the first tile copies B to pack as it reads it; the others read the copy */
        KNAME(tile)(k, a, rsa, csa, b, ldb, c, ldc, row_scale, accumulate, MR, masked, m0, m1, col_max, mods, 0, j0 FA_PACK_ARG(pack));
        i = MR;
        b = pack;
        ldb = 2 * W;
    }
#endif
#if GEMM_TAIL_4X4
    /* m = MR q + 2: two tiles of 4 rows instead of a last full tile and one of 2 (its 4 accumulators
     * leave the FMA pipes half idle), the same products: the same bits. */
    const int64_t full_end = m % MR == 2 && m >= MR + 2 ? m - (MR + 2) : m;
    for (; i + MR <= full_end; i += MR) FA_TILE_AT(MR);
    while (i + 4 <= m) { FA_TILE_AT(4); i += 4; }
#else
    for (; i + MR <= m; i += MR) FA_TILE_AT(MR);
#if MR > 8
    if (i + 8 <= m) { FA_TILE_AT(8); i += 8; }
#endif
    if (i + 4 <= m) { FA_TILE_AT(4); i += 4; }
#endif
    if (i + 2 <= m) { FA_TILE_AT(2); i += 2; }
    if (i < m) FA_TILE_AT(1);
#undef FA_TILE_AT
}

/* Column panels outermost: the k x 2W panel of B stays in L1 while A streams past it. col_max:
 * NULL, or gemm_max's output (each tile merges its maximum). With GEMM_PACK_KMAX, a full panel of
 * k <= GEMM_PACK_KMAX rows is first copied to contiguous memory when B's rows are further apart:
 * ldb = 128 floats puts every panel row in the same 8 of L1's 64 sets (8 ways: 64 lines, 4 KiB),
 * so a 128-row panel (8 KiB) did not stay in L1. The panel's first row tile makes the copy as it
 * reads B (not a pass of its own before it: the loads from L2 then overlap that tile's FMAs).
 * Same products in the same order: same bits. */
FA_INLINE void KNAME(panels)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa,
                             const float *b, int64_t ldb, float *c, int64_t ldc, const float *row_scale,
                             int accumulate, float *col_max, const KNAME(scores) *mods)
{
    int64_t j = 0;
#if GEMM_PACK_KMAX > 0
    float packed[GEMM_PACK_KMAX * 2 * W] __attribute__((aligned(64)));
    const int pack = k <= GEMM_PACK_KMAX && ldb > 2 * W && m >= 4 * MR;
#endif
    for (; j + 2 * W <= n; j += 2 * W)
        KNAME(panel)(m, k, a, rsa, csa, b + j, ldb, c + j, ldc, row_scale, accumulate, 0, VMASK(W), VMASK(W),
                     col_max ? col_max + j : NULL, mods, j FA_PACK_ARG(pack ? packed : NULL));
    if (j < n) {
        const int64_t left = n - j;
        KNAME(panel)(m, k, a, rsa, csa, b + j, ldb, c + j, ldc, row_scale, accumulate, 1,
                     VMASK(left < W ? left : W), VMASK(left > W ? left - W : 0), col_max ? col_max + j : NULL,
                     mods, j FA_PACK_ARG(NULL));
    }
}

FA_INLINE void KNAME(gemm_any)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa,
                               const float *b, int64_t ldb, float *c, int64_t ldc, const float *row_scale,
                               int accumulate, float *col_max, const KNAME(scores) *mods)
{
    if (col_max)
        for (int64_t j = 0; j < n; ++j) col_max[j] = -INFINITY;
#if GEMM_KC > 0
    /* Long k (P V and dS K, k = Bc): blocks of GEMM_KC, so that each block's B panel is reused
     * from L1 by every row tile; C takes the blocks' sums in turn (p still in increasing order,
     * the blocking depends on k only). */
    if (k > GEMM_KC && !col_max && !mods) {
        for (int64_t p0 = 0; p0 < k; p0 += GEMM_KC)
            KNAME(panels)(m, n, k - p0 < GEMM_KC ? k - p0 : GEMM_KC, a + p0 * csa, rsa, csa, b + p0 * ldb, ldb, c, ldc,
                          p0 ? NULL : row_scale, p0 ? 1 : accumulate, NULL, NULL);
        return;
    }
#endif
    KNAME(panels)(m, n, k, a, rsa, csa, b, ldb, c, ldc, row_scale, accumulate, col_max, mods);
}

static void KNAME(gemm)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
                        int64_t ldb, float *c, int64_t ldc, const float *row_scale, int accumulate)
{
    KNAME(gemm_any)(m, n, k, a, rsa, csa, b, ldb, c, ldc, row_scale, accumulate, NULL, NULL);
}

static void KNAME(gemm_max)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa,
                            const float *b, int64_t ldb, float *c, int64_t ldc, float *col_max)
{
    KNAME(gemm_any)(m, n, k, a, rsa, csa, b, ldb, c, ldc, NULL, 0, col_max, NULL);
}

static void KNAME(gemm_scores)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa,
                               const float *b, int64_t ldb, float *c, int64_t ldc, const fa_cpu_score_mods *mods,
                               float *col_max)
{
    const KNAME(scores) local = {.m = *mods, .factor = mods->cap > 0.0f ? mods->scale / mods->cap : 0.0f,
                                 .den = KNAME(tanh_den_for)(mods->cap > 0.0f ? mods->cap : 1.0f)};
    KNAME(gemm_any)(m, n, k, a, rsa, csa, b, ldb, c, ldc, NULL, 0, col_max, &local);
}

/* The backward's dP^T product with the pass dS = P o (dP - D) in its epilogue (kernels.h): the same
 * bits as gemm followed by that loop. */
static void KNAME(gemm_ds)(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b,
                           int64_t ldb, float *c, int64_t ldc, const float *p, int64_t ldp, const float *delta)
{
    const KNAME(scores) local = {.epilogue = KNAME(epilogue_ds), .p = p, .ldp = ldp, .delta = delta};
    KNAME(gemm_any)(m, n, k, a, rsa, csa, b, ldb, c, ldc, NULL, 0, NULL, &local);
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
 * about eighteen saved); x below FA_EXP_LO (-inf included) gives 0 either way. VEXP_T(x) is
 * n = round(x log2 e) in whatever form VEXP_SCALE2(y, t) takes, VEXP_N(t) n as a float (by
 * default VROUND and VSCALE2). VEXP_ESTRIN (default 0: Horner's rule) evaluates the polynomial in
 * Estrin's form: as many operations, a dependency chain two FMA latencies shorter. */
#ifndef VEXP_RANGE
#define VEXP_RANGE(x, lo) VMIN(VMAX(x, lo), VSET1(FA_EXP_HI))
#endif
#ifndef VEXP_T
#define VEXP_T(x) VROUND(VMUL(x, VSET1(FA_EXP_LOG2E)))
#define VEXP_N(t) (t)
#define VEXP_SCALE2(y, t) VSCALE2(y, t)
#endif
#ifndef VEXP_ESTRIN
#define VEXP_ESTRIN 0
#endif
FA_INLINE VEC KNAME(exp)(VEC x)
{
    const VEC lo = VSET1(FA_EXP_LO);
    const VEC xc = VEXP_RANGE(x, lo);
    const VEC t = VEXP_T(xc), n = VEXP_N(t);
    const VEC r = VFNMA(n, VSET1(FA_EXP_LN2_LO), VFNMA(n, VSET1(FA_EXP_LN2_HI), xc));
    const VEC r2 = VMUL(r, r);
#if VEXP_ESTRIN
    const VEC p01 = VFMA(VSET1(FA_EXP_P0), r, VSET1(FA_EXP_P1)), p23 = VFMA(VSET1(FA_EXP_P2), r, VSET1(FA_EXP_P3)),
              p45 = VFMA(VSET1(FA_EXP_P4), r, VSET1(FA_EXP_P5));
    const VEC poly = VFMA(VFMA(p01, r2, p23), r2, p45);
#else
    VEC poly = VSET1(FA_EXP_P0);
    poly = VFMA(poly, r, VSET1(FA_EXP_P1));
    poly = VFMA(poly, r, VSET1(FA_EXP_P2));
    poly = VFMA(poly, r, VSET1(FA_EXP_P3));
    poly = VFMA(poly, r, VSET1(FA_EXP_P4));
    poly = VFMA(poly, r, VSET1(FA_EXP_P5));
#endif
    const VEC y = VFMA(poly, r2, VADD(r, VSET1(1.0f)));
    return VZERO_BELOW(VEXP_SCALE2(y, t), x, lo);
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

FA_INLINE void KNAME(softcap_vec)(float *x, float *grad, float *col_max, const int masked, MASK_T m, VEC factor,
                                  const KNAME(tanh_den) *b, VEC inv_cap, VEC minus_slope, VEC distance)
{
    const VEC s = masked ? VMLOAD(x, m) : VLOAD(x);
    VEC num, den;
    KNAME(capped_tanh)(VMUL(s, factor), b, &num, &den);
    const VEC capped = KNAME(capped_score)(s, num, den, b);
    const VEC y = KNAME(softcap_value)(capped, minus_slope, distance);
    if (masked) VMSTORE(x, m, y);
    else VSTORE(x, y);
    if (col_max) {
        const VEC best = VMAX(masked ? VMLOAD(col_max, m) : VLOAD(col_max), y);
        if (masked) VMSTORE(col_max, m, best);
        else VSTORE(col_max, best);
    }
    if (!grad) return;
    /* tanh, for the chain rule only (scores never use it); a masked lane's is -1 (its P is 0,
     * and 0 times a finite factor stays 0) */
    const VEC t = VMUL(VSELECT_EQ(s, VSET1(-INFINITY), VSET1(-b->cap), capped), inv_cap);
    const VEC g = VFNMA(t, t, VSET1(1.0f));
    if (masked) VMSTORE(grad, m, g);
    else VSTORE(grad, g);
}

static void KNAME(softcap_cols)(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, float cap, float slope,
                                int64_t first, float *grad, float *col_max)
{
    const VEC factor = VSET1(scale / cap), inv_cap = VSET1(1.0f / cap), minus_slope = VSET1(-slope);
    const KNAME(tanh_den) b = KNAME(tanh_den_for)(cap);
    for (int64_t j = 0; col_max && j < cols; ++j) col_max[j] = -INFINITY;
    for (int64_t i = 0; i < rows; ++i) {
        float *row = x + i * ld, *grow = grad ? grad + i * ld : NULL;
        for (int64_t j = 0; j < cols; j += W) {
            const int masked = cols - j < W;
            KNAME(softcap_vec)(row + j, grow ? grow + j : NULL, col_max ? col_max + j : NULL, masked,
                               VMASK(masked ? cols - j : W), factor, &b, inv_cap, minus_slope, KNAME(distance)(first, i, j));
        }
    }
}

/* ALiBi: x = x * scale - slope * |(first - i) + j|, the distance's two terms exact integers in
 * float (|.| < 2^24) so every ISA and the reference give the same bits; -inf (masked) is kept
 * whatever the sign of the scale. */
static void KNAME(alibi_cols)(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, float slope, int64_t first,
                              float *col_max)
{
    const VEC vscale = VSET1(scale), minus_slope = VSET1(-slope);
    for (int64_t j = 0; col_max && j < cols; ++j) col_max[j] = -INFINITY;
    for (int64_t i = 0; i < rows; ++i) {
        float *row = x + i * ld;
        for (int64_t j = 0; j < cols; j += W) {
            const int masked = cols - j < W;
            const MASK_T m = VMASK(masked ? cols - j : W);
            const VEC x0 = masked ? VMLOAD(row + j, m) : VLOAD(row + j);
            const VEC s = KNAME(alibi_value)(x0, vscale, minus_slope, KNAME(distance)(first, i, j));
            if (masked) VMSTORE(row + j, m, s);
            else VSTORE(row + j, s);
            if (!col_max) continue;
            const VEC best = VMAX(masked ? VMLOAD(col_max + j, m) : VLOAD(col_max + j), s);
            if (masked) VMSTORE(col_max + j, m, best);
            else VSTORE(col_max + j, best);
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

/* ---- decode: S^T = K Q^T and O = alpha O + P V straight from the cache (kernels.h) ---- */

/* W elements of a cache row from element p, widened in registers; dt is a compile-time constant.
 * Quantised codes become their values as kernels.h states (quant_codes.h), without their scales:
 * int8 as integers; FP8 through binary16, whose conversion every ISA here has: an E5M2 code is the
 * top byte of the binary16 of its value, and an E4M3 code's sign, exponent and mantissa bits moved
 * to binary16's give value / 2^8 (subnormals included: binary16's subnormals are E4M3's, scaled),
 * with its NaN codes (S.1111.111) set to a binary16 NaN by an integer compare (VLOAD_E4M3_OVER_256
 * of each ISA); the caller folds the 2^8 into its factors. */
FA_INLINE VEC KNAME(cache_load)(const void *row, int64_t p, const int dt)
{
    if (dt == FA_DTYPE_F16) return VLOAD_F16((const uint16_t *)row + p);
    if (dt == FA_DTYPE_BF16) return VLOAD_BF16((const uint16_t *)row + p);
    if (dt == FA_DTYPE_I8) return VLOAD_I8((const int8_t *)row + p);
    if (dt == FA_DTYPE_FP8_E5M2) return VLOAD_E5M2((const uint8_t *)row + p);
    if (dt == FA_DTYPE_FP8_E4M3) return VLOAD_E4M3_OVER_256((const uint8_t *)row + p);
    return VLOAD((const float *)row + p);
}

FA_INLINE float KNAME(cache_element)(const void *row, int64_t p, const int dt)
{
    if (dt == FA_DTYPE_F16) return fa_f16_to_f32(((const uint16_t *)row)[p]);
    if (dt == FA_DTYPE_BF16) return fa_bf16_to_f32(((const uint16_t *)row)[p]);
    if (dt == FA_DTYPE_I8) return (float)((const int8_t *)row)[p];
    if (dt == FA_DTYPE_FP8_E5M2) return fa_fp8_e5m2_to_f32(((const uint8_t *)row)[p]);
    if (dt == FA_DTYPE_FP8_E4M3) return fa_fp8_e4m3_to_f32(((const uint8_t *)row)[p]) * 0x1p-8f;
    return ((const float *)row)[p];
}

FA_INLINE const void *KNAME(cache_row)(const void *base, int64_t offset, const int dt)
{
    return (const char *)base + offset * (int64_t)fa_dtype_size((fa_dtype)dt);
}

/* Every cache dtype's instance of a decode kernel body: FA_CACHE_DTYPES(OF) expands OF(dt) once per
 * dtype, dt a constant in each. */
#define FA_CACHE_DTYPES(OF, dtype)                                                              \
    do {                                                                                         \
        if (dtype == FA_DTYPE_F16) OF(FA_DTYPE_F16);                                             \
        else if (dtype == FA_DTYPE_BF16) OF(FA_DTYPE_BF16);                                      \
        else if (dtype == FA_DTYPE_I8) OF(FA_DTYPE_I8);                                          \
        else if (dtype == FA_DTYPE_FP8_E4M3) OF(FA_DTYPE_FP8_E4M3);                              \
        else if (dtype == FA_DTYPE_FP8_E5M2) OF(FA_DTYPE_FP8_E5M2);                              \
        else OF(FA_DTYPE_F32);                                                                   \
    } while (0)

/* ---- bias_cols: a row-major bias added to a key-major score tile (kernels.h) ---- */

enum { BIAS_KEYS = 8 }; /* keys per block of bias_cols */

/* t[c] (c < BIAS_KEYS) = lane l: element i + c of row[l], widened. */
FA_INLINE void KNAME(bias_keys)(const void *const *row, int64_t i, const int dt, VEC *t)
{
#ifdef VLOAD_TRANSPOSED
    VLOAD_TRANSPOSED(row, i, dt, t);
#else
    float lanes[BIAS_KEYS][W];
    for (int c = 0; c < BIAS_KEYS; ++c)
        for (int l = 0; l < W; ++l) lanes[c][l] = KNAME(cache_element)(row[l], i + c, dt);
    for (int c = 0; c < BIAS_KEYS; ++c) t[c] = VLOAD(lanes[c]);
#endif
}

/* Lane l: element i of row[l], widened (the keys past the last full block). */
FA_INLINE VEC KNAME(bias_key)(const void *const *row, int64_t i, const int dt)
{
    float lanes[W];
    for (int l = 0; l < W; ++l) lanes[l] = KNAME(cache_element)(row[l], i, dt);
    return VLOAD(lanes);
}

/* One key's scores x (W queries, masked: fewer) plus its bias t; the running max. */
FA_INLINE void KNAME(bias_add)(float *x, const int masked, MASK_T m, VEC scale, VEC t, VEC *best)
{
    const VEC s = masked ? VMLOAD(x, m) : VLOAD(x);
    const VEC y = VADD_UNLESS_EQ(s, VSET1(-INFINITY), VMUL(s, scale), t); /* masked stays masked */
    if (masked) VMSTORE(x, m, y);
    else VSTORE(x, y);
    *best = VMAX(*best, y);
}

/* W (masked: fewer) query columns of x over all its rows (keys), blocks of BIAS_KEYS keys read
 * from the W bias rows side by side and transposed in registers; the column max continued from
 * col_max as col_max takes it (keys in increasing order). */
FA_INLINE void KNAME(bias_columns)(float *x, int64_t ld, int64_t rows, const int masked, MASK_T m, VEC scale,
                                   const void *const *row, const int dt, float *col_max)
{
    VEC best = !col_max ? VZERO() : masked ? VMLOAD(col_max, m) : VLOAD(col_max);
    int64_t i0 = 0;
    for (; i0 + BIAS_KEYS <= rows; i0 += BIAS_KEYS) {
        VEC t[BIAS_KEYS];
        KNAME(bias_keys)(row, i0, dt, t);
#pragma GCC unroll 8
        for (int c = 0; c < BIAS_KEYS; ++c) KNAME(bias_add)(x + (i0 + c) * ld, masked, m, scale, t[c], &best);
    }
    for (; i0 < rows; ++i0) KNAME(bias_add)(x + i0 * ld, masked, m, scale, KNAME(bias_key)(row, i0, dt), &best);
    if (col_max && masked) VMSTORE(col_max, m, best);
    else if (col_max) VSTORE(col_max, best);
}

static void KNAME(bias_cols)(float *x, int64_t ld, int64_t rows, int64_t cols, float scale, const void *bias,
                             fa_dtype dtype, int64_t ld_bias, float *col_max)
{
    const int64_t elem = dtype == FA_DTYPE_F32 ? 4 : 2;
    for (int64_t j = 0; j < cols; j += W) {
        const int64_t lanes = cols - j < W ? cols - j : W;
        const void *row[W]; /* lanes past the last column repeat its first row: read, never stored */
        for (int64_t l = 0; l < W; ++l) row[l] = (const char *)bias + (j + (l < lanes ? l : 0)) * ld_bias * elem;
        float *cm = col_max ? col_max + j : NULL;
#define FA_BIAS_COLUMNS(dt, masked) KNAME(bias_columns)(x + j, ld, rows, masked, VMASK(lanes), VSET1(scale), row, dt, cm)
#define FA_BIAS_COLUMNS_OF(dt)                     \
    do {                                           \
        if (lanes < W) FA_BIAS_COLUMNS(dt, 1);     \
        else FA_BIAS_COLUMNS(dt, 0);               \
    } while (0)
        if (dtype == FA_DTYPE_F16) FA_BIAS_COLUMNS_OF(FA_DTYPE_F16);
        else if (dtype == FA_DTYPE_BF16) FA_BIAS_COLUMNS_OF(FA_DTYPE_BF16);
        else FA_BIAS_COLUMNS_OF(FA_DTYPE_F32);
#undef FA_BIAS_COLUMNS_OF
#undef FA_BIAS_COLUMNS
    }
}

#ifndef DECODE_PREFETCH_BYTES
#define DECODE_PREFETCH_BYTES 65536 /* how far ahead of their reads decode_scores and decode_values prefetch */
#endif
#ifndef DECODE_PREFETCH_LOCALITY
#define DECODE_PREFETCH_LOCALITY 2 /* into L2 (prefetcht1): 64 KiB ahead would evict L1 */
#endif
#ifndef DECODE_PREFETCH_ROW_BYTES
#define DECODE_PREFETCH_ROW_BYTES 512 /* rows this long or longer are left to the hardware prefetchers */
#endif

/* Keys that span DECODE_PREFETCH_BYTES of every head's rows (at least one), or 0 for no software
 * prefetch. Measured on Zen 4 (one thread, 32768 keys x 8 heads, d 128, interleaved variants on a
 * loaded machine), keys read as one run: for f16 rows (256 bytes) no prefetch 35.6 ms, 16 KiB
 * ahead into L1 30.5 ms, 64 KiB ahead into L2 25.3-26.3 ms; for f32 rows (512 bytes, runs the
 * hardware prefetchers follow) every software prefetch was slower (29.2 ms without, 30.0-33.2 ms
 * with). Four streams (ld_quad != 4 ld_key) are left to the hardware prefetchers, which follow
 * them (bench/results/decode-cpu.md); the prefetches only took miss buffers from them. */
FA_INLINE int64_t KNAME(prefetch_keys_ahead)(int64_t heads, int64_t d, int64_t ld_key, int64_t ld_quad, const int dt)
{
    const int64_t row = d * (int64_t)fa_dtype_size((fa_dtype)dt), bytes = heads * row;
    if (DECODE_PREFETCH_BYTES == 0 || row >= DECODE_PREFETCH_ROW_BYTES || ld_quad != 4 * ld_key) return 0;
    return bytes >= DECODE_PREFETCH_BYTES ? 1 : DECODE_PREFETCH_BYTES / bytes;
}

/* Prefetches every head's row of keys [x, x + count): the kernels read each head's rows in short
 * runs, which the hardware prefetchers follow badly. Past the call's keys it touches the next
 * keys of the cache, which the next call reads (or nothing useful, harmlessly: prefetches never
 * fault, and the address is computed as an integer, never dereferenced). */
FA_INLINE void KNAME(prefetch_keys)(const void *base, int64_t x, int64_t count, int64_t heads, int64_t d,
                                    int64_t ld_key, int64_t ld_quad, int64_t ld_head, const int dt)
{
    const int64_t es = (int64_t)fa_dtype_size((fa_dtype)dt);
    for (int64_t key = x; key < x + count; ++key)
        for (int64_t h = 0; h < heads; ++h) {
            const int64_t offset = fa_decode_key_offset(key, ld_key, ld_quad) + h * ld_head;
            const uintptr_t row = (uintptr_t)base + (uintptr_t)(offset * es);
            for (int64_t byte = 0; byte < d * es; byte += 64) __builtin_prefetch((const void *)(row + (uintptr_t)byte), 0, DECODE_PREFETCH_LOCALITY);
        }
}

/* rb query rows x nk <= W/rb keys (from key x0) of one head: W accumulators (acc[r * W/rb + x]),
 * one per dot product, reduced together by VSUM_TRANSPOSED; the tail of d (past the last full
 * vector) is added after it, in increasing p. Missing keys repeat key x0 and are not stored. */
FA_INLINE void KNAME(score_block)(int64_t nk, int64_t d, const void *k, int64_t x0, int64_t ld_key, int64_t ld_quad,
                                  const int dt, const float *q, float *st, int64_t ldst, const int rb)
{
    const int nkb = W / rb;
    const void *key[W];
    for (int x = 0; x < nkb; ++x) key[x] = KNAME(cache_row)(k, fa_decode_key_offset(x0 + (x < nk ? x : 0), ld_key, ld_quad), dt);
    VEC acc[W];
    for (int i = 0; i < W; ++i) acc[i] = VZERO();
    int64_t p = 0;
    for (; p + W <= d; p += W) {
        VEC kv[W];
        for (int x = 0; x < nkb; ++x) kv[x] = KNAME(cache_load)(key[x], p, dt);
        for (int r = 0; r < rb; ++r) {
            const VEC qv = VLOAD(q + r * d + p);
            for (int x = 0; x < nkb; ++x) acc[r * nkb + x] = VFMA(qv, kv[x], acc[r * nkb + x]);
        }
    }
    float sums[W];
    VSTORE(sums, VSUM_TRANSPOSED(acc));
    if (rb == 4 && p == d) { /* lanes 4x .. 4x + 3: key x's four rows, side by side as in S^T */
        for (int x = 0; x < nk; ++x) memcpy(st + x * ldst, sums + 4 * x, 4 * sizeof(float));
        return;
    }
    for (int r = 0; r < rb; ++r)
        for (int x = 0; x < nk; ++x) {
            const int i = r * nkb + x;
            float s = sums[4 * (i % (W / 4)) + i / (W / 4)], tail = 0.0f;
            for (int64_t t = p; t < d; ++t) tail += q[r * d + t] * KNAME(cache_element)(key[x], t, dt);
            st[x * ldst + r] = p < d ? s + tail : s;
        }
}

/* Keys in blocks of W/4 outermost, every head inside (a window moving front to back through the
 * cache), each head's rows in blocks of 4; the rows left over (2, 1) then take blocks of W/2, W
 * keys. */
FA_INLINE void KNAME(scores_of)(int64_t n, int64_t heads, int64_t rows, int64_t d, const void *k, const int dt,
                                int64_t ld_key, int64_t ld_quad, int64_t ld_head, const float *q, int64_t ldq_head,
                                float *st, int64_t ldst)
{
    const int64_t full = rows / 4 * 4, ahead = KNAME(prefetch_keys_ahead)(heads, d, ld_key, ld_quad, dt);
    for (int64_t x0 = 0; x0 < n; x0 += W) {
        const int64_t keys = n - x0 < W ? n - x0 : W;
#define FA_SCORES_AT(rb, x, nk)                                                                                 \
    KNAME(score_block)(nk, d, KNAME(cache_row)(k, h * ld_head, dt), x0 + (x), ld_key, ld_quad, dt,             \
                       q + h * ldq_head + r * d, st + (x0 + (x)) * ldst + h * rows + r, ldst, rb)
        for (int64_t x = 0; full && x < keys; x += W / 4) {
            if (ahead) KNAME(prefetch_keys)(k, x0 + x + ahead, W / 4, heads, d, ld_key, ld_quad, ld_head, dt);
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t r = 0; r < full; r += 4) FA_SCORES_AT(4, x, keys - x < W / 4 ? keys - x : W / 4);
        }
        for (int64_t h = 0; full < rows && h < heads; ++h) {
            int64_t r = full;
            if (r + 2 <= rows) {
                for (int64_t x = 0; x < keys; x += W / 2) FA_SCORES_AT(2, x, keys - x < W / 2 ? keys - x : W / 2);
                r += 2;
            }
            if (r < rows) FA_SCORES_AT(1, 0, keys);
        }
#undef FA_SCORES_AT
    }
}

static void KNAME(decode_scores)(int64_t n, int64_t heads, int64_t rows, int64_t d, const void *k, fa_dtype dtype,
                                 int64_t ld_key, int64_t ld_quad, int64_t ld_head, const float *q, int64_t ldq_head,
                                 float *st, int64_t ldst)
{
#define FA_SCORES_OF(dt) KNAME(scores_of)(n, heads, rows, d, k, dt, ld_key, ld_quad, ld_head, q, ldq_head, st, ldst)
    FA_CACHE_DTYPES(FA_SCORES_OF, dtype);
#undef FA_SCORES_OF
}

/* rb rows x cb vectors of columns of one head's O over nk keys: O scaled by alpha (first key
 * block only, scale != NULL), then one FMA per key in increasing order; each V vector is loaded
 * (and widened) once for all rb rows. */
FA_INLINE void KNAME(value_block)(int64_t nk, int64_t d, const float *p, int64_t ldp, const void *v, int64_t x0,
                                  int64_t ld_key, int64_t ld_quad, const int dt, float *o, const float *scale, const int rb,
                                  const int cb)
{
    VEC acc[4][PV_CB];
    for (int r = 0; r < rb; ++r)
        for (int c = 0; c < cb; ++c) {
            acc[r][c] = VLOAD(o + r * d + c * W);
            if (scale) acc[r][c] = VMUL(acc[r][c], VSET1(scale[r]));
        }
    for (int64_t x = 0; x < nk; ++x) {
        const void *vx = KNAME(cache_row)(v, fa_decode_key_offset(x0 + x, ld_key, ld_quad), dt);
        VEC vv[PV_CB];
        for (int c = 0; c < cb; ++c) vv[c] = KNAME(cache_load)(vx, c * W, dt);
        for (int r = 0; r < rb; ++r) {
            const VEC pr = VSET1(p[x * ldp + r]);
            for (int c = 0; c < cb; ++c) acc[r][c] = VFMA(pr, vv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < rb; ++r)
        for (int c = 0; c < cb; ++c) VSTORE(o + r * d + c * W, acc[r][c]);
}

/* The columns past the last full vector, one element at a time in the same order. */
static void KNAME(value_tail)(int64_t nk, int64_t d, int64_t c0, const float *p, int64_t ldp, const void *v, int64_t x0,
                              int64_t ld_key, int64_t ld_quad, fa_dtype dtype, float *o, int64_t rows, const float *scale)
{
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = c0; c < d; ++c) {
            float acc = o[r * d + c];
            if (scale) acc *= scale[r];
            for (int64_t x = 0; x < nk; ++x)
                acc = fmaf(p[x * ldp + r],
                           KNAME(cache_element)(KNAME(cache_row)(v, fa_decode_key_offset(x0 + x, ld_key, ld_quad), dtype), c, dtype),
                           acc);
            o[r * d + c] = acc;
        }
}

#ifndef DECODE_VALUE_KEYS
#define DECODE_VALUE_KEYS 4 /* keys per block of decode_values: one quad (one key of each stream) */
#endif

/* Key blocks outermost (read front to back, as decode_scores), then heads, rows in blocks of
 * 4, 2, 1 and columns in blocks of PV_CB vectors, single vectors and scalars. */
FA_INLINE void KNAME(values_of)(int64_t n, int64_t heads, int64_t rows, int64_t d, const float *p, int64_t ldp,
                                const void *v, const int dt, int64_t ld_key, int64_t ld_quad, int64_t ld_head, float *o,
                                int64_t ldo_head, const float *alpha)
{
    const int64_t ahead = KNAME(prefetch_keys_ahead)(heads, d, ld_key, ld_quad, dt);
    for (int64_t x0 = 0; x0 < n; x0 += DECODE_VALUE_KEYS) {
        const int64_t keys = n - x0 < DECODE_VALUE_KEYS ? n - x0 : DECODE_VALUE_KEYS;
        const float *px = p + x0 * ldp;
        if (ahead) KNAME(prefetch_keys)(v, x0 + ahead, DECODE_VALUE_KEYS, heads, d, ld_key, ld_quad, ld_head, dt);
        for (int64_t h = 0; h < heads; ++h) {
            const void *vh = KNAME(cache_row)(v, h * ld_head, dt);
            float *oh = o + h * ldo_head;
            const float *scale = x0 == 0 && alpha ? alpha + h * rows : NULL;
            int64_t r = 0;
#define FA_VALUES_AT(rb)                                                                                           \
    do {                                                                                                           \
        const float *sr = scale ? scale + r : NULL;                                                                \
        int64_t c = 0;                                                                                             \
        for (; c + PV_CB * W <= d; c += PV_CB * W)                                                                 \
            KNAME(value_block)(keys, d, px + h * rows + r, ldp, KNAME(cache_row)(vh, c, dt), x0, ld_key, ld_quad, dt, \
                               oh + r * d + c, sr, rb, PV_CB);                                                     \
        for (; c + W <= d; c += W)                                                                                 \
            KNAME(value_block)(keys, d, px + h * rows + r, ldp, KNAME(cache_row)(vh, c, dt), x0, ld_key, ld_quad, dt, \
                               oh + r * d + c, sr, rb, 1);                                                         \
        if (c < d) KNAME(value_tail)(keys, d, c, px + h * rows + r, ldp, vh, x0, ld_key, ld_quad, dt, oh + r * d, rb, sr); \
    } while (0)
            for (; r + 4 <= rows; r += 4) FA_VALUES_AT(4);
            if (r + 2 <= rows) { FA_VALUES_AT(2); r += 2; }
            if (r < rows) FA_VALUES_AT(1);
#undef FA_VALUES_AT
        }
    }
}

static void KNAME(decode_values)(int64_t n, int64_t heads, int64_t rows, int64_t d, const float *p, int64_t ldp,
                                 const void *v, fa_dtype dtype, int64_t ld_key, int64_t ld_quad, int64_t ld_head, float *o,
                                 int64_t ldo_head, const float *alpha)
{
#define FA_VALUES_OF(dt) KNAME(values_of)(n, heads, rows, d, p, ldp, v, dt, ld_key, ld_quad, ld_head, o, ldo_head, alpha)
    FA_CACHE_DTYPES(FA_VALUES_OF, dtype);
#undef FA_VALUES_OF
}

/* The FMA-peak probe (bench/cpu/probe/fma_peak.h): 2*MR register-only chains, as many as the gemm tile's
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
#define FA_VECTOR_KERNEL_TABLE(name) {FA_VECTOR_KERNEL_FIELDS(name)}
/* The table's fields, for a table that adds kernels of an ISA extension (avx512_kernels.c). */
#define FA_VECTOR_KERNEL_FIELDS(name)                                                                     \
        .isa = name, .gemm = KNAME(gemm), .col_max = KNAME(col_max), .exp_cols = KNAME(exp_cols), .softcap_cols = KNAME(softcap_cols), .alibi_cols = KNAME(alibi_cols), .bias_cols = KNAME(bias_cols), .transpose = KNAME(transpose),          \
        .f16_to_f32 = KNAME(f16_to_f32), .bf16_to_f32 = KNAME(bf16_to_f32), .f32_to_f16 = KNAME(f32_to_f16), \
        .gemm_nt = KNAME(gemm_nt), .gemm_max = KNAME(gemm_max), .gemm_scores = KNAME(gemm_scores), .gemm_ds = KNAME(gemm_ds), .fma_chains = KNAME(fma_chains), \
        .decode_scores = KNAME(decode_scores), .decode_values = KNAME(decode_values), .mr = MR, .nr = 2 * W, .tile_step = 16

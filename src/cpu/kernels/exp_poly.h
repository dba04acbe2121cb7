/* exp(x) = 2^n * e^r with n = round(x / ln 2), r = x - n ln 2 (ln 2 split in two for an exact
 * reduction), e^r by a degree-6 polynomial on [-ln2/2, ln2/2] (Cephes expf coefficients): within
 * 1 ulp of expf on [-44.4, 88]. Below -44.4 (results under 2^-64) every CPU kernel returns 0: such
 * a P element cannot change an f32 row sum of at least 1 (its largest element is e^0), and its
 * products with V are at most 2^-64 of the largest |V|; kept, they were subnormals and products
 * that underflow, each a microcode assist on Intel's cores (an ALiBi forward ran 4.7x slower on
 * an Emerald Rapids, 1.5x with only the results under FLT_MIN flushed). Shared by the vector
 * kernels of every ISA; the reference kernel flushes at the same point. */
#ifndef FA_EXP_POLY_H
#define FA_EXP_POLY_H
#define FA_EXP_LO (-44.3614196f) /* -64 ln 2: below, the result (under 2^-64) is 0 */
#define FA_EXP_HI 88.0f        /* keeps 2^n finite */
#define FA_EXP_ROUNDER 12582912.0f /* 1.5 * 2^23: x + it, rounded, holds round(x) (|x| < 2^22) in its low mantissa bits */
#define FA_EXP_LOG2E 1.44269504088896341f
#define FA_EXP_LN2_HI 0.693359375f
#define FA_EXP_LN2_LO (-2.12194440e-4f)
#define FA_EXP_P0 1.9875691500e-4f
#define FA_EXP_P1 1.3981999507e-3f
#define FA_EXP_P2 8.3334519073e-3f
#define FA_EXP_P3 4.1665795894e-2f
#define FA_EXP_P4 1.6666665459e-1f
#define FA_EXP_P5 5.0000001201e-1f
#endif

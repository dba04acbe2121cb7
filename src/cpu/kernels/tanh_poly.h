/* tanh(x) for the vector kernels (Cephes tanhf): below |x| = FA_TANH_SMALL an odd polynomial
 * x + x^3 P(x^2), which keeps the relative accuracy down to tiny x (no cancellation); above it
 * sign(x) (1 - 2 / (exp(2|x|) + 1)) with the kernels' exponential (exp_poly.h), |x| clamped to
 * FA_TANH_ONE where tanh(x) rounds to 1 in binary32 (1 - tanh(9.1) = 2.5e-8 < 2^-25). */
#ifndef FA_TANH_POLY_H
#define FA_TANH_POLY_H
#define FA_TANH_SMALL 0.625f
#define FA_TANH_ONE 9.1f
#define FA_TANH_P0 (-5.70498872745e-3f)
#define FA_TANH_P1 2.06390887954e-2f
#define FA_TANH_P2 (-5.37397155531e-2f)
#define FA_TANH_P3 1.33314422036e-1f
#define FA_TANH_P4 (-3.33332819422e-1f)
#endif

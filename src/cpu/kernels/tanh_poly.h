/* tanh(x) for the vector kernels: x p(z) / q(z), z = min(x^2, FA_TANH_Z_MAX), p monic of degree 4
 * and q of degree 4 in z (degree 9 over 8 in x): the relative minimax fit on [0, 8.875] of
 * scripts/fit-tanh.py (Lawson's iteration in double) with p(0) = q(0) (the same float: tanh(x) / x
 * -> 1 exactly), coefficients rounded to float. Per vector of scores (vector_kernels.h, the cap
 * folded into q): x = s scale / cap, z = x x, p's first step an add, 3 + 4 FMAs, x p, one
 * division: 10 operations on the FMA pipes and the division (Eigen's degree 13 over 6 it replaces:
 * 13, and a compare for the masked scores), then the quotient clamped to [-cap, cap] by min and
 * max. Past 8.875, z stays at its clamp and x p / q grows linearly: from just above 8.875 the
 * clamp gives exactly +-cap (1 - tanh(8.875) is 0.65 ulp; tanh rounds to 1 from 9.01), so +-1 is
 * never exceeded whatever the cap; +-inf gives +-1, NaN stays NaN. Accuracy in float as the
 * kernels evaluate it, checked on every binary32 in [1e-35, 9] with cap 1: relative error <=
 * 3.14e-7 (5.3 ulp, near 1, where about ten roundings of the same size add up; <= 3.4 ulp below
 * |x| = 2), within 4e-43 absolute below 1e-35 (Eigen's: 3.25e-7, 5.5 ulp, and 1 + 2^-23 at x =
 * 8.13). */
#ifndef FA_TANH_POLY_H
#define FA_TANH_POLY_H
#define FA_TANH_Z_MAX 78.765625f /* 8.875^2 */
#define FA_TANH_P0 73293744.0f
#define FA_TANH_P1 9815524.0f
#define FA_TANH_P2 257157.719f
#define FA_TANH_P3 1526.0127f
#define FA_TANH_Q0 73293744.0f
#define FA_TANH_Q1 34246764.0f
#define FA_TANH_Q2 1900260.0f
#define FA_TANH_Q3 24236.6562f
#define FA_TANH_Q4 57.8701019f
#endif

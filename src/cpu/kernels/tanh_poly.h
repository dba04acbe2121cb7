/* tanh(x) for the vector kernels: x p(z) / q(z), z = min(x^2, FA_TANH_Z_MAX), p monic of degree 4
 * and q of degree 4 in z (degree 9 over 8 in x): a relative minimax fit on [0, 8.875] with
 * p(0) = q(0) (the same float, so tanh(x) -> x exactly in the limit), coefficients rounded to
 * float. Per vector: two multiplications (z, x p), p's first step an add, 3 + 4 FMAs, one
 * division, then the result clamped to [-1, 1] (vector_kernels.h: the cap folded into q, the
 * clamp to [-cap, cap]). Past 8.875 z stays at its clamp and x p / q grows linearly, so from
 * |x| >= 8.98 the clamp gives exactly +-1 (tanh rounds to 1 from 9.01, 1 - tanh(8.875) is
 * 0.6 ulp): +-1 never exceeded, whatever the cap; +-inf gives +-1, NaN stays NaN.
 * Accuracy in float as the kernels evaluate it (every binary32 in [1e-35, 9], cap 1): relative
 * error <= 3.14e-7 (5.3 ulp near 1, where about ten roundings add up; <= 3.4 ulp below |x| = 2);
 * below |x| = 1e-35 within 4e-43 absolute. */
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

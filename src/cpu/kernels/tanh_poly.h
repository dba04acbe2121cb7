/* tanh(x) for the vector kernels: the odd rational minimax approximation p(x) / q(x) of Eigen's
 * ptanh_float (degree 13 over degree 6): one division and 11 FMAs (the vector kernels fold a
 * softcap's cap into q's coefficients, vector_kernels.h), about half the work of an
 * exponential-based form. x is clamped to +-FA_TANH_ONE, where p / q is 1 to within 1 ulp
 * (tanh rounds to 1 in binary32 beyond 9.01). Below |x| = 2.4e-36 the product x p underflows: the result keeps the
 * sign and is within 1e-38 of x. */
#ifndef FA_TANH_POLY_H
#define FA_TANH_POLY_H
#define FA_TANH_ONE 9.0f
#define FA_TANH_A1 4.89352455891786e-03f
#define FA_TANH_A3 6.37261928875436e-04f
#define FA_TANH_A5 1.48572235717979e-05f
#define FA_TANH_A7 5.12229709037114e-08f
#define FA_TANH_A9 (-8.60467152213735e-11f)
#define FA_TANH_A11 2.00018790482477e-13f
#define FA_TANH_A13 (-2.76076847742355e-16f)
#define FA_TANH_B0 4.89352518554385e-03f
#define FA_TANH_B2 2.26843463243900e-03f
#define FA_TANH_B4 1.18534705686654e-04f
#define FA_TANH_B6 1.19825839466702e-06f
#endif

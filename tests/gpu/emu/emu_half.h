/* 16-bit float conversions of the SIMT emulator's instruction models (cvt.rn, mma.sync and MFMA
 * operands, __half). Written by arithmetic on doubles (ilogb, ldexp, nearbyint), independently of
 * the bit manipulations of src/common/half.h, so that a rounding bug in one is caught by the
 * other rather than shared by the kernels and their check. Round to nearest, ties to even. */
#ifndef FA_EMU_HALF_H
#define FA_EMU_HALF_H
#include <cmath>
#include <cstdint>

namespace emu {

/* x rounded to `bits` significant bits, with `min_exp` the exponent of the smallest normal
 * (below it the quantum stays fixed: subnormals). Exact in double for every finite float. */
inline double round_to_significance(double x, int bits, int min_exp)
{
    if (x == 0.0 || !std::isfinite(x)) return x;
    int e = std::ilogb(x);
    if (e < min_exp) e = min_exp;
    const double quantum = std::ldexp(1.0, e - (bits - 1));
    return std::nearbyint(x / quantum) * quantum; /* default rounding mode: ties to even */
}

/* IEEE binary16: 11 significant bits, exponents -14..15, largest finite 65504. */
inline uint16_t f16_bits_from_float(float f)
{
    const double x = f;
    if (std::isnan(x)) return 0x7e00;
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double r = std::fabs(round_to_significance(x, 11, -14));
    if (r > 65504.0) return sign | 0x7c00; /* rounds past the largest finite: infinity */
    if (r < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(r / std::ldexp(1.0, -24));
    const int e = std::ilogb(r);
    const int mantissa = static_cast<int>(r / std::ldexp(1.0, e - 10)) - 1024;
    return sign | static_cast<uint16_t>((e + 15) << 10 | mantissa);
}

inline float float_from_f16_bits(uint16_t h)
{
    const int exponent = h >> 10 & 0x1f, mantissa = h & 0x3ff;
    const double sign = h & 0x8000 ? -1.0 : 1.0;
    if (exponent == 0x1f) return static_cast<float>(mantissa ? std::copysign(NAN, sign) : sign * INFINITY);
    if (exponent == 0) return static_cast<float>(sign * std::ldexp(mantissa, -24));
    return static_cast<float>(sign * std::ldexp(1024 + mantissa, exponent - 25));
}

/* bfloat16: 8 significant bits, the exponent range of float (smallest normal 2^-126). */
inline uint16_t bf16_bits_from_float(float f)
{
    const double x = f;
    if (std::isnan(x)) return 0x7fc0;
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double r = std::fabs(round_to_significance(x, 8, -126));
    const double largest = std::ldexp(255.0, 127 - 7); /* 1.1111111b x 2^127 */
    if (r > largest) return sign | 0x7f80;
    if (r < std::ldexp(1.0, -126)) return sign | static_cast<uint16_t>(r / std::ldexp(1.0, -133));
    const int e = std::ilogb(r);
    const int mantissa = static_cast<int>(r / std::ldexp(1.0, e - 7)) - 128;
    return sign | static_cast<uint16_t>((e + 127) << 7 | mantissa);
}

inline float float_from_bf16_bits(uint16_t h)
{
    const int exponent = h >> 7 & 0xff, mantissa = h & 0x7f;
    const double sign = h & 0x8000 ? -1.0 : 1.0;
    if (exponent == 0xff) return static_cast<float>(mantissa ? std::copysign(NAN, sign) : sign * INFINITY);
    if (exponent == 0) return static_cast<float>(sign * std::ldexp(mantissa, -133));
    return static_cast<float>(sign * std::ldexp(128 + mantissa, exponent - 134));
}

} // namespace emu
#endif

/* 16-bit float conversions of the SIMT emulator's instruction models (cvt.rn, mma.sync and MFMA
 * operands, __half). Written by arithmetic on doubles (ilogb, ldexp, nearbyint), independently of
 * the bit manipulations of src/common/half.h, so that a rounding bug in one is caught by the
 * other rather than shared by the kernels and their check. Round to nearest, ties to even. */
#ifndef FA_EMU_HALF_H
#define FA_EMU_HALF_H
#include <cmath>
#include <cstdint>

namespace emu {

/* A binary floating-point format of 16 bits: 1 sign, `exponent_bits`, `mantissa_bits` stored
 * (one more significant bit is implicit), IEEE-style subnormals, infinities and NaNs. */
struct format16 {
    int exponent_bits, mantissa_bits;
    int bias() const { return (1 << (exponent_bits - 1)) - 1; }
    int min_exponent() const { return 1 - bias(); } /* of the smallest normal */
    int max_exponent() const { return bias(); }
    uint16_t infinity() const { return static_cast<uint16_t>(((1 << exponent_bits) - 1) << mantissa_bits); }
    uint16_t quiet_nan() const { return static_cast<uint16_t>(infinity() | 1 << (mantissa_bits - 1)); }
};
constexpr format16 kF16 = {5, 10};  /* IEEE binary16: largest finite 65504 */
constexpr format16 kBF16 = {8, 7};  /* bfloat16: the exponent range of float */

/* x rounded to the format's precision (below the smallest normal the quantum stays fixed:
 * subnormals). Exact in double for every finite float. */
inline double round_to_format(double x, format16 fmt)
{
    if (x == 0.0 || !std::isfinite(x)) return x;
    int e = std::ilogb(x);
    if (e < fmt.min_exponent()) e = fmt.min_exponent();
    const double quantum = std::ldexp(1.0, e - fmt.mantissa_bits);
    return std::nearbyint(x / quantum) * quantum; /* default rounding mode: ties to even */
}

inline uint16_t bits_from_float(float f, format16 fmt)
{
    const double x = f;
    if (std::isnan(x)) return fmt.quiet_nan();
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double r = std::fabs(round_to_format(x, fmt));
    const int m = fmt.mantissa_bits;
    const double largest = std::ldexp(2.0 - std::ldexp(1.0, -m), fmt.max_exponent());
    if (r > largest) return sign | fmt.infinity(); /* rounds past the largest finite: infinity */
    const double smallest_normal = std::ldexp(1.0, fmt.min_exponent());
    if (r < smallest_normal) return sign | static_cast<uint16_t>(r / std::ldexp(1.0, fmt.min_exponent() - m));
    const int e = std::ilogb(r);
    const int mantissa = static_cast<int>(r / std::ldexp(1.0, e - m)) - (1 << m);
    return sign | static_cast<uint16_t>((e + fmt.bias()) << m | mantissa);
}

inline float float_from_bits(uint16_t h, format16 fmt)
{
    const int m = fmt.mantissa_bits;
    const int exponent = h >> m & ((1 << fmt.exponent_bits) - 1), mantissa = h & ((1 << m) - 1);
    const double sign = h & 0x8000 ? -1.0 : 1.0;
    if (exponent == (1 << fmt.exponent_bits) - 1) return static_cast<float>(mantissa ? std::copysign(NAN, sign) : sign * INFINITY);
    if (exponent == 0) return static_cast<float>(sign * std::ldexp(mantissa, fmt.min_exponent() - m));
    return static_cast<float>(sign * std::ldexp((1 << m) + mantissa, exponent - fmt.bias() - m));
}

inline uint16_t f16_bits_from_float(float f) { return bits_from_float(f, kF16); }
inline float float_from_f16_bits(uint16_t h) { return float_from_bits(h, kF16); }
inline uint16_t bf16_bits_from_float(float f) { return bits_from_float(f, kBF16); }
inline float float_from_bf16_bits(uint16_t h) { return float_from_bits(h, kBF16); }

} // namespace emu
#endif

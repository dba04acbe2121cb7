/* The scalar codes of a quantised KV cache: OCP FP8 (E4M3, E5M2) and int8 with a per-(token, head)
 * scale. Host C, C++, CUDA and HIP share these rules, so every side stores and reads the same codes.
 *
 * FP8 formats (OCP 8-bit floating point, v1.0):
 *   E4M3 ("fn"): bias 7, no infinities, NaN only S.1111.111 (0x7F, 0xFF), max finite 448 (0x7E),
 *                subnormals m * 2^-9.
 *   E5M2:        bias 15, IEEE-like (the top byte of a binary16): 0x7C/0xFC = +-inf,
 *                S.11111.{01,10,11} NaN, max finite 57344 (0x7B), subnormals m * 2^-16.
 * Decoding is exact (every code is an f32 value).
 * Encoding (f32 -> fp8):
 *   - round to nearest, ties to even on the fp8 mantissa, correctly rounded from the exact f32 value,
 *     also into and within the subnormal range and to zero;
 *   - the sign of zero is kept (-0.0f -> 0x80);
 *   - saturating: a finite value whose rounded magnitude exceeds the max finite, and +-inf, become
 *     +-max finite (0x7E/0xFE for E4M3, 0x7B/0xFB for E5M2): a KV cache has no use for inf, and
 *     an outlier clipped to the max does less harm than one that poisons the whole softmax;
 *   - NaN -> 0x7F in both formats (the sign of NaN is not kept).
 *
 * int8: scale = absmax / 127 per (token, head); code = x / scale rounded to nearest even, clamped to
 * [-127, 127] (-128 is never produced, so the codes are symmetric); value = code * scale.
 *
 * Integer arithmetic on the f32 bits does the rounding, so the results do not depend on the
 * rounding mode, excess precision or flush-to-zero; no libm call is needed. */
#ifndef FA_QUANT_CODES_H
#define FA_QUANT_CODES_H
#include <stdint.h>
#include <string.h>

#include "hostdev.h"

/* memcpy is defined behaviour in C and C++ alike, and CUDA/HIP device code has it. */
FA_HD uint32_t fa_qc_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

FA_HD float fa_qc_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A normal fp8 value as f32: exponent field e (1 .. 2^E - 2), mantissa m of man_bits bits. */
FA_HD float fa_qc_normal(uint32_t sign, uint32_t e, uint32_t m, uint32_t bias, uint32_t man_bits)
{
    return fa_qc_float(sign | ((e + 127u - bias) << 23) | (m << (23u - man_bits)));
}

FA_HD float fa_fp8_e4m3_to_f32(uint8_t code)
{
    const uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    const uint32_t e = (code >> 3) & 0xfu;
    const uint32_t m = code & 0x7u;
    if ((code & 0x7fu) == 0x7fu) return fa_qc_float(0x7fc00000u);
    if (e != 0) return fa_qc_normal(sign, e, m, 7u, 3u);
    /* zero or subnormal: m * 2^-9 is exact in f32 */
    const float mag = (float)m * (1.0f / 512.0f);
    return sign ? -mag : mag;
}

FA_HD float fa_fp8_e5m2_to_f32(uint8_t code)
{
    const uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    const uint32_t e = (code >> 2) & 0x1fu;
    const uint32_t m = code & 0x3u;
    if (e == 0x1fu) return m ? fa_qc_float(0x7fc00000u) : fa_qc_float(sign | 0x7f800000u);
    if (e != 0) return fa_qc_normal(sign, e, m, 15u, 2u);
    /* zero or subnormal: m * 2^-16 is exact in f32 */
    const float mag = (float)m * (1.0f / 65536.0f);
    return sign ? -mag : mag;
}

/* f32 -> fp8 with man_bits mantissa bits and the given bias; max_code is the largest finite
 * magnitude code. The rules are at the top of this file. */
FA_HD uint8_t fa_qc_f32_to_fp8(float x, uint32_t man_bits, uint32_t bias, uint32_t max_code)
{
    const uint32_t u = fa_qc_bits(x);
    const uint32_t sign = (u >> 24) & 0x80u;
    const uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return 0x7fu;
    const uint32_t drop = 23u - man_bits; /* f32 mantissa bits below the fp8 mantissa */
    const uint32_t exp = abs >> 23;
    uint32_t mag;
    if (exp >= 128u - bias) {
        /* normal in fp8 (or above its range): round the f32 bits at the fp8 mantissa's last bit;
         * a carry into the exponent is the correct next code. inf lands above max_code. */
        const uint32_t rounded = abs + ((1u << (drop - 1u)) - 1u) + ((abs >> drop) & 1u);
        mag = (rounded >> drop) - ((127u - bias) << man_bits);
        if (mag > max_code) mag = max_code;
    } else {
        /* subnormal or zero in fp8: the value is sig * 2^(exp - 150) and the fp8 unit is
         * 2^(1 - bias - man_bits), so the code is sig >> shift rounded to nearest even. A shift
         * past 24 leaves less than half a unit (sig < 2^24); f32 subnormals and zero go there too.
         * Rounding up from the largest subnormal gives the smallest normal code, as it should. */
        const uint32_t shift = 151u - bias - man_bits - exp;
        if (shift > 24u) {
            mag = 0;
        } else {
            const uint32_t sig = (abs & 0x7fffffu) | 0x800000u;
            const uint32_t half = 1u << (shift - 1u);
            const uint32_t rem = sig & ((1u << shift) - 1u);
            mag = sig >> shift;
            if (rem > half || (rem == half && (mag & 1u))) mag++;
        }
    }
    return (uint8_t)(sign | mag);
}

FA_HD uint8_t fa_f32_to_fp8_e4m3(float x) { return fa_qc_f32_to_fp8(x, 3u, 7u, 0x7eu); }

FA_HD uint8_t fa_f32_to_fp8_e5m2(float x) { return fa_qc_f32_to_fp8(x, 2u, 15u, 0x7bu); }

/* 1 when x is neither inf nor NaN. */
FA_HD int fa_qc_finite(float x) { return (fa_qc_bits(x) & 0x7f800000u) != 0x7f800000u; }

/* The int8 scale of one (token, head): absmax / 127, 0 when absmax is 0. NaN when absmax is inf or
 * NaN: that token's codes are then all 0 and its scale NaN, so attention to it gives NaN as an
 * unquantised cache would, instead of a finite value that hides the bad input. */
FA_HD float fa_i8_scale(float absmax)
{
    if (!fa_qc_finite(absmax)) return fa_qc_float(0x7fc00000u);
    if (absmax == 0.0f) return 0.0f;
    return absmax / 127.0f;
}

/* x / scale rounded to nearest even and clamped to [-127, 127]; 0 when scale is 0 or not finite
 * (and when x is NaN). The quotient is clamped first, so the integer conversion is always in
 * range; its fraction a - n is exact in f32, so the tie test is exact. */
FA_HD int8_t fa_f32_to_i8(float x, float scale)
{
    if (scale == 0.0f || !fa_qc_finite(scale)) return 0;
    const float q = x / scale;
    if (q != q) return 0;
    float a = q < 0.0f ? -q : q;
    if (a > 127.0f) a = 127.0f;
    int n = (int)a;
    const float frac = a - (float)n;
    if (frac > 0.5f || (frac == 0.5f && (n & 1))) n++;
    return (int8_t)(q < 0.0f ? -n : n);
}

FA_HD float fa_i8_to_f32(int8_t code, float scale) { return (float)code * scale; }
#endif

/* IEEE binary16 and bfloat16 conversions for host code (round to nearest even; NaN preserved). */
#ifndef FA_HALF_H
#define FA_HALF_H
#include <stdint.h>
#include <string.h>

static inline uint32_t fa_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float fa_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float fa_bf16_to_f32(uint16_t h) { return fa_bits_f32((uint32_t)h << 16); }

static inline uint16_t fa_f32_to_bf16(float f)
{
    const uint32_t u = fa_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float fa_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return fa_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return fa_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24 is exact in float */
    const float mag = (float)man * (1.0f / 16777216.0f);
    return sign ? -mag : mag;
}

static inline uint16_t fa_f32_to_f16(float f)
{
    const uint32_t u = fa_f32_bits(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (abs < 0x38800000u) {                                      /* result subnormal or zero */
        /* scale so that the f16 subnormal unit 2^-24 becomes 1, then round to nearest even */
        const float scaled = fa_bits_f32(abs) * 16777216.0f;
        uint32_t m = (uint32_t)scaled;
        const float rem = scaled - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
        return (uint16_t)(sign | m);
    }
    const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return (uint16_t)(sign | ((rounded - 0x38000000u) >> 13));
}
#endif

#include "test_util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

size_t test_dtype_size(fa_dtype dtype) { return dtype == FA_DTYPE_F32 ? 4 : 2; }

/* ---- dtype conversion, written here independently of src/common/half.h --------------------- */
/* Rounds x to nearest-even with `bits` significant bits and smallest subnormal 2^min_exp. */
static double round_to_bits(double x, int bits, int min_exp)
{
    if (x == 0.0 || !isfinite(x)) return x;
    int e;
    frexp(x, &e);
    int ulp_exp = e - bits;
    if (ulp_exp < min_exp) ulp_exp = min_exp;
    return ldexp(nearbyint(ldexp(x, -ulp_exp)), ulp_exp);
}

double test_round_to_dtype(double x, fa_dtype dtype)
{
    switch (dtype) {
    case FA_DTYPE_F32: return (double)(float)x;
    case FA_DTYPE_F16: return round_to_bits(x, 11, -24);
    case FA_DTYPE_BF16: return round_to_bits(x, 8, -133);
    default: break; /* quantised types: their own rules (quant_codes.h) */
    }
    return x;
}

void test_store_element(void *buf, size_t index, fa_dtype dtype, double x)
{
    if (dtype == FA_DTYPE_F32) {
        ((float *)buf)[index] = (float)x;
        return;
    }
    const double r = test_round_to_dtype(x, dtype);
    uint16_t bits;
    if (dtype == FA_DTYPE_BF16) {
        const float f = (float)r; /* exact: r has 8 significant bits and a float's exponent range */
        uint32_t u;
        memcpy(&u, &f, 4);
        bits = (uint16_t)(u >> 16);
        if (isnan(f)) bits |= 0x40u; /* a quiet NaN that keeps its top bits */
    } else {
        const uint16_t sign = signbit(r) ? 0x8000u : 0u;
        const double a = fabs(r);
        int e;
        const double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
        if (isnan(r)) bits = (uint16_t)(sign | 0x7e00u);
        else if (a > 65504.0) bits = (uint16_t)(sign | 0x7c00u); /* infinity, or beyond the largest f16 */
        else if (a == 0.0) bits = sign;
        else if (e - 1 >= -14) bits = (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((m * 2.0 - 1.0) * 1024.0));
        else bits = (uint16_t)(sign | (uint16_t)ldexp(a, 24)); /* subnormal */
    }
    ((uint16_t *)buf)[index] = bits;
}

double test_load_element(const void *buf, size_t index, fa_dtype dtype)
{
    if (dtype == FA_DTYPE_F32) return ((const float *)buf)[index];
    const uint16_t bits = ((const uint16_t *)buf)[index];
    if (dtype == FA_DTYPE_BF16) {
        const uint32_t u = (uint32_t)bits << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    const double sign = bits & 0x8000u ? -1.0 : 1.0;
    const int exp = (bits >> 10) & 0x1f;
    const int man = bits & 0x3ff;
    if (exp == 0x1f) return man ? NAN : sign * INFINITY;
    if (exp == 0) return sign * ldexp(man, -24);
    return sign * ldexp(1024 + man, exp - 25);
}

/* ---- errors -------------------------------------------------------------------------------- */
void test_expect_error(fa_status got, fa_status want, const char *name)
{
    const char *msg = fa_last_error();
    if (got != want) fail_msg("status %d (%s), expected %d for '%s'", (int)got, msg, (int)want, name);
    if (!strstr(msg, name) || strchr(msg, '\n')) fail_msg("message '%s' should name '%s'", msg, name);
}

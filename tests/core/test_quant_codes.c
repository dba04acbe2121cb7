/* src/common/quant_codes.h: the FP8 (E4M3, E5M2) decoders against a reference built from the
 * fields in double, the encoders on every code, every midpoint and its neighbours, the special
 * values and a random sweep against a brute-force nearest-code search; the int8 scale and codes. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/quant_codes.h"

typedef struct {
    const char *name;
    int exp_bits, man_bits, bias;
    int has_inf;       /* E5M2: S.11111.00 is inf; E4M3 has none */
    uint8_t max_code;  /* largest finite magnitude code */
    double max_finite;
    float (*decode)(uint8_t);
    uint8_t (*encode)(float);
} format;

static const format e4m3 = {"e4m3", 4, 3, 7, 0, 0x7e, 448.0, fa_fp8_e4m3_to_f32, fa_f32_to_fp8_e4m3};
static const format e5m2 = {"e5m2", 5, 2, 15, 1, 0x7b, 57344.0, fa_fp8_e5m2_to_f32, fa_f32_to_fp8_e5m2};

/* The value of a code from its fields, in double: NaN and inf per the OCP rules. */
static double ref_decode(const format *f, unsigned code)
{
    const int sign = (code >> 7) & 1;
    const int e = (int)(code >> f->man_bits) & ((1 << f->exp_bits) - 1);
    const int m = (int)code & ((1 << f->man_bits) - 1);
    const int e_max = (1 << f->exp_bits) - 1;
    double v;
    if (f->has_inf && e == e_max) v = m == 0 ? INFINITY : NAN;
    else if (!f->has_inf && e == e_max && m == (1 << f->man_bits) - 1) v = NAN;
    else if (e == 0) v = ldexp((double)m, 1 - f->bias - f->man_bits);
    else v = ldexp((double)((1 << f->man_bits) + m), e - f->bias - f->man_bits);
    return sign ? -v : v;
}

static int is_finite_code(const format *f, unsigned code) { return isfinite(ref_decode(f, code)); }

/* The nearest finite code to x (saturating: |x| beyond the max is the max), ties to the even code;
 * a linear search over all positive finite codes. NaN -> 0x7F. */
static uint8_t ref_encode(const format *f, float x)
{
    if (isnan(x)) return 0x7f;
    const unsigned sign = signbit(x) ? 0x80u : 0u;
    double a = fabs((double)x);
    if (a > f->max_finite) a = f->max_finite;
    unsigned best = 0;
    double best_d = INFINITY;
    for (unsigned c = 0; c <= f->max_code; ++c) {
        const double d = fabs(ref_decode(f, c) - a);
        if (d < best_d || (d == best_d && (c & 1u) == 0)) {
            best = c;
            best_d = d;
        }
    }
    return (uint8_t)(sign | best);
}

static void check_decode_all(const format *f)
{
    int nan_codes = 0, inf_codes = 0;
    for (unsigned c = 0; c < 256; ++c) {
        const double want = ref_decode(f, c);
        const float got = f->decode((uint8_t)c);
        if (isnan(want)) {
            nan_codes++;
            if (!isnan(got)) fail_msg("%s decode 0x%02x: got %a, want NaN", f->name, c, (double)got);
            continue;
        }
        if (isinf(want)) inf_codes++;
        if ((double)got != want || !signbit(got) != !signbit(want))
            fail_msg("%s decode 0x%02x: got %a, want %a", f->name, c, (double)got, want);
    }
    /* the reference itself: E4M3 has 2 NaN codes and no inf; E5M2 6 NaN codes and 2 inf */
    assert_int_equal(nan_codes, f->has_inf ? 6 : 2);
    assert_int_equal(inf_codes, f->has_inf ? 2 : 0);
    assert_true(ref_decode(f, f->max_code) == f->max_finite);
}

static void test_decode_e4m3(void **state)
{
    (void)state;
    check_decode_all(&e4m3);
    assert_true(fa_fp8_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(fa_fp8_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_true(isnan(fa_fp8_e4m3_to_f32(0x7f)) && isnan(fa_fp8_e4m3_to_f32(0xff)));
}

static void test_decode_e5m2(void **state)
{
    (void)state;
    check_decode_all(&e5m2);
    assert_true(fa_fp8_e5m2_to_f32(0x7b) == 57344.0f);
    assert_true(fa_fp8_e5m2_to_f32(0x01) == 0x1p-16f);
    assert_true(fa_fp8_e5m2_to_f32(0x7c) == INFINITY && fa_fp8_e5m2_to_f32(0xfc) == -INFINITY);
}

static void check_encode(const format *f, float x, uint8_t want)
{
    const uint8_t got = f->encode(x);
    if (got != want) fail_msg("%s encode %a: got 0x%02x, want 0x%02x", f->name, (double)x, got, want);
}

/* Every finite code round-trips (the sign of zero too). */
static void check_roundtrip(const format *f)
{
    int n = 0;
    for (unsigned c = 0; c < 256; ++c) {
        if (!is_finite_code(f, c)) continue;
        check_encode(f, f->decode((uint8_t)c), (uint8_t)c);
        n++;
    }
    assert_int_equal(n, f->has_inf ? 248 : 254);
}

/* Between adjacent positive finite codes a < b: the midpoint goes to the even one, its f32
 * neighbours to the nearer one; the same negated. */
static void check_midpoints(const format *f)
{
    for (unsigned a = 0; a < f->max_code; ++a) {
        const unsigned b = a + 1;
        const double mid = (ref_decode(f, a) + ref_decode(f, b)) / 2;
        const float midf = (float)mid;
        assert_true((double)midf == mid); /* exact in f32: the fp8 grid has far fewer bits */
        const uint8_t even = (uint8_t)((a & 1u) ? b : a);
        check_encode(f, midf, even);
        check_encode(f, -midf, (uint8_t)(0x80u | even));
        check_encode(f, nextafterf(midf, INFINITY), (uint8_t)b);
        check_encode(f, nextafterf(midf, 0.0f), (uint8_t)a);
        check_encode(f, -nextafterf(midf, INFINITY), (uint8_t)(0x80u | b));
        check_encode(f, -nextafterf(midf, 0.0f), (uint8_t)(0x80u | a));
    }
}

static void check_specials(const format *f)
{
    const uint8_t max = f->max_code, nmax = (uint8_t)(0x80u | f->max_code);
    const float maxf = (float)f->max_finite;
    check_encode(f, maxf, max);
    check_encode(f, -maxf, nmax);
    check_encode(f, nextafterf(maxf, INFINITY), max);
    check_encode(f, -nextafterf(maxf, INFINITY), nmax);
    /* half an ulp above the max (the tie with the next, non-finite, code) and just past it */
    const double half_ulp = ldexp(1.0, (int)floor(log2(f->max_finite)) - f->man_bits - 1);
    const float tie = (float)(f->max_finite + half_ulp);
    check_encode(f, tie, max);
    check_encode(f, nextafterf(tie, INFINITY), max);
    check_encode(f, -nextafterf(tie, INFINITY), nmax);
    check_encode(f, 2.0f * maxf, max);
    check_encode(f, 1e30f, max);
    check_encode(f, -1e30f, nmax);
    check_encode(f, 3.4028235e38f, max);
    check_encode(f, -3.4028235e38f, nmax);
    check_encode(f, INFINITY, max);
    check_encode(f, -INFINITY, nmax);
    check_encode(f, NAN, 0x7f);
    check_encode(f, -NAN, 0x7f);
    check_encode(f, fa_qc_float(0x7f800001u), 0x7f); /* signalling-NaN payload */
    check_encode(f, fa_qc_float(0xffffffffu), 0x7f);
    /* zeros and the bottom of the subnormal range */
    check_encode(f, 0.0f, 0x00);
    check_encode(f, -0.0f, 0x80);
    const float sub = (float)ldexp(1.0, 1 - f->bias - f->man_bits); /* smallest subnormal */
    const float half_sub = sub / 2;
    check_encode(f, half_sub, 0x00); /* tie between 0 and 0x01: to even */
    check_encode(f, -half_sub, 0x80);
    check_encode(f, nextafterf(half_sub, INFINITY), 0x01);
    check_encode(f, -nextafterf(half_sub, INFINITY), 0x81);
    check_encode(f, nextafterf(half_sub, 0.0f), 0x00);
    check_encode(f, -nextafterf(half_sub, 0.0f), 0x80);
    check_encode(f, half_sub / 4, 0x00);
    check_encode(f, -half_sub / 4, 0x80);
    check_encode(f, 1e-30f, 0x00);
    check_encode(f, -1e-30f, 0x80);
    check_encode(f, 0x1p-149f, 0x00); /* f32 subnormals */
    check_encode(f, -0x1p-149f, 0x80);
    check_encode(f, 0x1p-127f, 0x00);
    check_encode(f, 1.5f * sub, 0x02); /* tie between 0x01 and 0x02 */
}

static void test_encode_e4m3(void **state)
{
    (void)state;
    check_roundtrip(&e4m3);
    check_midpoints(&e4m3);
    check_specials(&e4m3);
    check_encode(&e4m3, 464.0f, 0x7e);
    check_encode(&e4m3, 465.0f, 0x7e);
    check_encode(&e4m3, 1.0f, 0x38);
    check_encode(&e4m3, 0x1p-6f, 0x08);                     /* smallest normal */
    check_encode(&e4m3, nextafterf(0x1p-6f, 0.0f), 0x08);   /* rounds up out of the subnormals */
}

static void test_encode_e5m2(void **state)
{
    (void)state;
    check_roundtrip(&e5m2);
    check_midpoints(&e5m2);
    check_specials(&e5m2);
    check_encode(&e5m2, 61440.0f, 0x7b);
    check_encode(&e5m2, 65504.0f, 0x7b); /* binary16's max: still the E5M2 max */
    check_encode(&e5m2, 1.0f, 0x3c);
    check_encode(&e5m2, 0x1p-14f, 0x04);
    check_encode(&e5m2, nextafterf(0x1p-14f, 0.0f), 0x04);
}

static uint64_t xorshift64(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* 2^20 floats: half with random sign, exponent (2^-40 .. 2^20) and mantissa; half a random code's
 * value moved by up to 4 f32 ulps (to land on and around midpoints and the grid), against the
 * brute-force reference. */
static void check_sweep(const format *f)
{
    uint64_t s = 0x9e3779b97f4a7c15ull;
    long long n = 0;
    for (int i = 0; i < (1 << 20); ++i) {
        const uint64_t r = xorshift64(&s);
        float x;
        if (i & 1) {
            const uint32_t exp = 87u + (uint32_t)((r >> 23) % 61u); /* 2^-40 .. 2^20 */
            x = fa_qc_float((uint32_t)((r >> 40) & 0x80000000u) | (exp << 23) | (uint32_t)(r & 0x7fffffu));
        } else {
            const unsigned code = (unsigned)(r & 0xffu);
            if (!is_finite_code(f, code)) continue;
            x = (float)ref_decode(f, code);
            /* the midpoint with the next code up, or the code itself, then a few ulps either way */
            if (((r >> 8) & 1) && (code & 0x7fu) < f->max_code)
                x = (float)((ref_decode(f, code & 0x7fu) + ref_decode(f, (code & 0x7fu) + 1)) / 2);
            if (code & 0x80u) x = -fabsf(x);
            const int steps = (int)((r >> 9) % 9u) - 4;
            for (int k = 0; k < steps; ++k) x = nextafterf(x, INFINITY);
            for (int k = 0; k > steps; --k) x = nextafterf(x, -INFINITY);
        }
        const uint8_t want = ref_encode(f, x);
        const uint8_t got = f->encode(x);
        if (got != want) fail_msg("%s sweep %a: got 0x%02x, want 0x%02x", f->name, (double)x, got, want);
        n++;
    }
    assert_true(n > 900000);
}

static void test_sweep_e4m3(void **state)
{
    (void)state;
    check_sweep(&e4m3);
}

static void test_sweep_e5m2(void **state)
{
    (void)state;
    check_sweep(&e5m2);
}

static void test_i8_scale(void **state)
{
    (void)state;
    assert_true(fa_i8_scale(0.0f) == 0.0f);
    assert_true(fa_i8_scale(-0.0f) == 0.0f);
    assert_true(fa_i8_scale(127.0f) == 1.0f);
    assert_true(fa_i8_scale(1.0f) == 1.0f / 127.0f);
    assert_true(fa_i8_scale(254.0f) == 2.0f);
    assert_true(fa_i8_scale(3.4028235e38f) == 3.4028235e38f / 127.0f);
    assert_true(isnan(fa_i8_scale(INFINITY)));
    assert_true(isnan(fa_i8_scale(-INFINITY)));
    assert_true(isnan(fa_i8_scale(NAN)));
    /* a token with a non-finite element: NaN scale, all codes 0 */
    const float scale = fa_i8_scale(INFINITY);
    assert_int_equal(fa_f32_to_i8(1.0f, scale), 0);
    assert_int_equal(fa_f32_to_i8(INFINITY, scale), 0);
    assert_true(isnan(fa_i8_to_f32(0, scale)));
}

static void check_i8(float x, float scale, int want)
{
    const int got = fa_f32_to_i8(x, scale);
    if (got != want) fail_msg("i8 %a / %a: got %d, want %d", (double)x, (double)scale, got, want);
}

static void test_i8_codes(void **state)
{
    (void)state;
    /* ties to even */
    check_i8(2.5f, 1.0f, 2);
    check_i8(3.5f, 1.0f, 4);
    check_i8(-2.5f, 1.0f, -2);
    check_i8(-3.5f, 1.0f, -4);
    check_i8(0.5f, 1.0f, 0);
    check_i8(-0.5f, 1.0f, 0);
    check_i8(1.5f, 1.0f, 2);
    check_i8(126.5f, 1.0f, 126);
    check_i8(-126.5f, 1.0f, -126);
    check_i8(1.25f, 0.5f, 2);
    check_i8(1.75f, 0.5f, 4);
    check_i8(nextafterf(2.5f, INFINITY), 1.0f, 3);
    check_i8(nextafterf(3.5f, 0.0f), 1.0f, 3);
    check_i8(2.4f, 1.0f, 2);
    check_i8(-2.6f, 1.0f, -3);
    /* clamping: nothing beyond +-127, -128 never */
    check_i8(127.0f, 1.0f, 127);
    check_i8(127.4f, 1.0f, 127);
    check_i8(127.5f, 1.0f, 127);
    check_i8(128.0f, 1.0f, 127);
    check_i8(-127.5f, 1.0f, -127);
    check_i8(-128.0f, 1.0f, -127);
    check_i8(-1000.0f, 1.0f, -127);
    check_i8(1e30f, 1e-30f, 127);
    check_i8(-1e30f, 1e-30f, -127);
    check_i8(INFINITY, 1.0f, 127);
    check_i8(-INFINITY, 1.0f, -127);
    check_i8(NAN, 1.0f, 0);
    /* scale 0 or not finite */
    check_i8(5.0f, 0.0f, 0);
    check_i8(5.0f, -0.0f, 0);
    check_i8(5.0f, INFINITY, 0);
    check_i8(5.0f, NAN, 0);
    /* the absmax element maps to +-127 and back to itself within half a step */
    const float absmax = 3.7f, scale = fa_i8_scale(absmax);
    check_i8(absmax, scale, 127);
    check_i8(-absmax, scale, -127);
    assert_true(fabsf(fa_i8_to_f32(127, scale) - absmax) <= scale / 2);
    /* every code decodes to code * scale and encodes back to itself */
    for (int c = -127; c <= 127; ++c) {
        const float v = fa_i8_to_f32((int8_t)c, scale);
        assert_true(v == (float)c * scale);
        check_i8(v, scale, c);
    }
    assert_true(fa_i8_to_f32(-127, 0.5f) == -63.5f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_e4m3), cmocka_unit_test(test_decode_e5m2),
        cmocka_unit_test(test_encode_e4m3), cmocka_unit_test(test_encode_e5m2),
        cmocka_unit_test(test_sweep_e4m3),  cmocka_unit_test(test_sweep_e5m2),
        cmocka_unit_test(test_i8_scale),    cmocka_unit_test(test_i8_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* checkasm: the layout and conversion kernels (transpose, f16_to_f32, bf16_to_f32, f32_to_f16). */
#include "checkasm.h"

/* transpose bit for bit against the reference: shapes around the register block (7..17 rows,
 * 1..40 columns), leading dimensions with gaps, ld_src 0 (a broadcast row), NaN payloads and
 * infinities moved untouched, and nothing written outside the extents (sentinels). */
void test_transpose(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    enum { MAX_ROWS = 17, MAX_COLS = 40, LD_DST = MAX_ROWS + 3 };
    float src[MAX_ROWS * (MAX_COLS + 5)], got[MAX_COLS * LD_DST], want[MAX_COLS * LD_DST];
    for (int64_t e = 0; e < MAX_ROWS * (MAX_COLS + 5); ++e)
        src[e] = e % 17 == 5 ? fa_bits_f32(0x7fc00000u + (uint32_t)e) : e % 19 == 3 ? -INFINITY : uniform(-9, 9);
    for (int64_t rows = 1; rows <= MAX_ROWS; ++rows)
        for (int64_t cols = 1; cols <= MAX_COLS; cols += 3)
            for (int broadcast = 0; broadcast < 2; ++broadcast) {
                const int64_t ld_src = broadcast ? 0 : cols + 5 * (rows % 2);
                for (int64_t e = 0; e < MAX_COLS * LD_DST; ++e) got[e] = want[e] = fa_bits_f32(0x7f8abcdeu);
                ref->transpose(src, ld_src, rows, cols, want, LD_DST);
                isa->transpose(src, ld_src, rows, cols, got, LD_DST);
                for (int64_t e = 0; e < MAX_COLS * LD_DST; ++e)
                    if (fa_f32_bits(got[e]) != fa_f32_bits(want[e]))
                        fail_msg("transpose %s %lld x %lld (ld_src %lld): dst[%lld] = %08x, want %08x", isa->isa,
                                 (long long)rows, (long long)cols, (long long)ld_src, (long long)e,
                                 fa_f32_bits(got[e]), fa_f32_bits(want[e]));
            }
}

/* A widening kernel on all 65536 inputs, bit for bit (NaN: any NaN). */
static void check_widening(const char *isa, const char *name, void (*widen)(const uint16_t *, float *, int64_t),
                           float (*want_of)(uint16_t))
{
    enum { ALL = 65536 };
    uint16_t *h = malloc(ALL * sizeof *h);
    float *f = malloc((ALL + 1) * sizeof *f);
    assert_non_null(h); assert_non_null(f);
    for (int x = 0; x < ALL; ++x) h[x] = (uint16_t)x;
    f[ALL - 3] = 7.0f;
    widen(h, f, ALL - 3); /* odd length: the scalar tail runs too */
    assert_true(f[ALL - 3] == 7.0f);
    for (int x = 0; x < ALL - 3; ++x) {
        const float want = want_of(h[x]);
        if (isnan(want) ? !isnan(f[x]) : fa_f32_bits(f[x]) != fa_f32_bits(want))
            fail_msg("%s %s: 0x%04x -> %g, want %g", name, isa, x, f[x], want);
    }
    free(h); free(f);
}

void test_f16_to_f32(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state);
    check_widening(isa->isa, "f16_to_f32", isa->f16_to_f32, fa_f16_to_f32);
}

void test_bf16_to_f32(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state);
    check_widening(isa->isa, "bf16_to_f32", isa->bf16_to_f32, fa_bf16_to_f32);
}

/* f32 -> binary16 bit for bit against fa_f32_to_f16: every sign, exponent and top 10 mantissa
 * bits (bits 13..31) with the low 13 bits that decide the rounding at their edges (exact, just
 * below / at / above a half, odd and even results) and one random pattern: 3.7M values, covering
 * overflow to inf, subnormal results, flushes to zero and NaN payloads. */
void test_f32_to_f16(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state);
    static const uint32_t low[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0};
    enum { LOWS = sizeof low / sizeof low[0], HIGHS = 1 << 19, CHUNK = 4093 }; /* odd: scalar tails run */
    float *f = malloc(CHUNK * sizeof *f);
    uint16_t *h = malloc((CHUNK + 1) * sizeof *h);
    assert_non_null(f); assert_non_null(h);
    int64_t filled = 0;
    for (uint32_t x = 0; x < (uint32_t)HIGHS * LOWS; ++x) {
        const uint32_t pattern = x % LOWS == LOWS - 1 ? (uint32_t)(uniform(0, 1) * 8191.0f) : low[x % LOWS];
        f[filled++] = fa_bits_f32((x / LOWS) << 13 | pattern);
        if (filled < CHUNK && x + 1 < (uint32_t)HIGHS * LOWS) continue;
        h[filled] = 0x5a5a;
        isa->f32_to_f16(f, h, filled);
        assert_true(h[filled] == 0x5a5a);
        for (int64_t i = 0; i < filled; ++i)
            if (h[i] != fa_f32_to_f16(f[i]))
                fail_msg("f32_to_f16 %s: 0x%08x -> 0x%04x, want 0x%04x", isa->isa, fa_f32_bits(f[i]), h[i], fa_f32_to_f16(f[i]));
        filled = 0;
    }
    free(f); free(h);
}

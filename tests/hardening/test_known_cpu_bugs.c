/* Documented behaviour the CPU backend does not meet yet (reported to the CPU kernels' owner).
 * Each test asserts the documented semantics and is registered in meson.build with
 * should_fail: true, one test per bug, so that a fix shows up as an unexpected pass and the
 * test moves to the regular suite. Run one by name: test_known_cpu_bugs <name>. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "fixture.h"

/* NaN propagation (docs/ROBUSTNESS.md): a NaN in q row i makes out row i and lse i NaN; a NaN in
 * k row j makes every row that sees key j NaN; a NaN in v[j][c] makes column c of those rows NaN.
 * Rows that cannot see the poisoned key stay bit-identical to a clean run. In each input type:
 * f16/bf16 tiles are checked on their own loads (bf16 scores scan the bf16 rows of q and k). */
static void nan_propagation_of(fa_dtype dtype)
{
    const oracle_shape shape = {1, 1, 1, 12, 12, 4};
    fixture clean, f;
    assert_true(fixture_init(&clean, &shape, dtype, 16));
    clean.desc.causal = 1; /* query i sees keys 0..i */
    assert_int_equal(fixture_forward(fixture_ctx, &clean), FA_SUCCESS);
    for (int which = 0; which < 3; ++which) {
        assert_true(fixture_init(&f, &shape, dtype, 16));
        f.desc.causal = 1;
        const int64_t row = 5;
        if (which == 0) fixture_set(&f.q, row * 4 + 1, NAN);
        if (which == 1) fixture_set(&f.k, row * 4 + 1, NAN);
        if (which == 2) fixture_set(&f.v, row * 4 + 1, NAN);
        assert_int_equal(fixture_forward(fixture_ctx, &f), FA_SUCCESS);
        for (int64_t i = 0; i < 12; ++i) {
            const int affected = which == 0 ? i == row : i >= row;
            for (int64_t c = 0; c < 4; ++c) {
                const float got = fixture_get(&f.out, (size_t)(i * 4 + c));
                if (affected && (which != 2 || c == 1)) assert_true(isnan(got));
                else assert_true(got == fixture_get(&clean.out, (size_t)(i * 4 + c)));
            }
            if (affected && which != 2) assert_true(isnan(f.lse[i]));
            else assert_true(f.lse[i] == clean.lse[i]);
        }
        fixture_free(&f);
    }
    fixture_free(&clean);
}

static void nan_propagation(void **state)
{
    (void)state;
    nan_propagation_of(FA_DTYPE_F32);
    nan_propagation_of(FA_DTYPE_F16);
    nan_propagation_of(FA_DTYPE_BF16);
}

/* Keys hidden by padding (j >= seqlens_k[b]) take no part in the result, whatever they hold:
 * NaN there (uninitialised padding) must leave out, lse and every gradient finite, and the
 * padded keys' dk, dv zero. */
static void nan_in_padded_keys(void **state)
{
    (void)state;
    const oracle_shape shape = {1, 1, 1, 4, 8, 4};
    fixture f;
    assert_true(fixture_init(&f, &shape, FA_DTYPE_F32, 1));
    int32_t seqlens[1] = {5};
    f.desc.seqlens_k = seqlens;
    for (size_t x = 5 * 4; x < 8 * 4; ++x) {
        fixture_set(&f.k, x, NAN);
        fixture_set(&f.v, x, NAN);
    }
    assert_int_equal(fixture_forward(fixture_ctx, &f), FA_SUCCESS);
    assert_int_equal(fixture_backward(fixture_ctx, &f), FA_SUCCESS);
    for (size_t x = 0; x < 16; ++x) {
        assert_true(isfinite(fixture_get(&f.out, x)));
        assert_true(isfinite(fixture_get(&f.dq, x)));
    }
    for (size_t x = 0; x < 32; ++x) {
        const float want_zero = x >= 5 * 4;
        assert_true(want_zero ? fixture_get(&f.dk, x) == 0.0f : isfinite(fixture_get(&f.dk, x)));
        assert_true(want_zero ? fixture_get(&f.dv, x) == 0.0f : isfinite(fixture_get(&f.dv, x)));
    }
    fixture_free(&f);
}

/* bf16 values of 1e38 (below FLT_MAX, the bf16 maximum 3.39e38) over 8 keys: the output is a
 * convex combination, at most 1e38, but an un-normalised f32 accumulator reaches 8e38 = inf. */
static void bf16_sum_over_keys_overflows(void **state)
{
    (void)state;
    const oracle_shape shape = {1, 1, 1, 1, 8, 2};
    fixture f;
    assert_true(fixture_init(&f, &shape, FA_DTYPE_BF16, 2));
    for (size_t x = 0; x < 16; ++x) fixture_set(&f.v, x, 1e38f);
    assert_int_equal(fixture_forward(fixture_ctx, &f), FA_SUCCESS);
    assert_true(isfinite(fixture_get(&f.out, 0)));
    assert_true(fabs(fixture_get(&f.out, 0) - fixture_get(&f.v, 0)) <= 0x1p-7 * fixture_get(&f.v, 0));
    fixture_free(&f);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nan_propagation),
        cmocka_unit_test(nan_in_padded_keys),
        cmocka_unit_test(bf16_sum_over_keys_overflows),
    };
    return cmocka_run_group_tests(tests, fixture_context_setup, fixture_context_teardown);
}

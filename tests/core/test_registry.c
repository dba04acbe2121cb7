/* Backend selection: AUTO, the FLASHATTN_BACKEND override, explicit backends. Assertions that a
 * GPU backend is unavailable are skipped where that backend IS available. */
#define _POSIX_C_SOURCE 200112L /* setenv, unsetenv */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "flashattn.h"

static int clear_env(void **state)
{
    (void)state;
    return unsetenv("FLASHATTN_BACKEND");
}

static fa_backend auto_expectation(void)
{
    return fa_backend_available(FA_BACKEND_CUDA) ? FA_BACKEND_CUDA
         : fa_backend_available(FA_BACKEND_HIP)  ? FA_BACKEND_HIP
                                                 : FA_BACKEND_CPU;
}

static void expect_auto_gives(fa_backend expected)
{
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_AUTO, 0, &ctx), FA_SUCCESS);
    assert_non_null(ctx);
    assert_int_equal(fa_context_backend(ctx), expected);
    fa_context_destroy(ctx);
}

static void test_cpu_always_available(void **state)
{
    (void)state;
    assert_int_equal(fa_backend_available(FA_BACKEND_CPU), 1);
    assert_int_equal(fa_backend_available(FA_BACKEND_AUTO), 1);
    assert_int_equal(fa_backend_available((fa_backend)9), 0);
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_int_equal(fa_context_backend(ctx), FA_BACKEND_CPU);
    assert_true(strlen(fa_context_info(ctx)) > 0);
    fa_context_destroy(ctx);
}

static void test_auto_without_override(void **state)
{
    (void)state;
    const fa_backend expected = auto_expectation();
    print_message("AUTO resolves to %s here\n", fa_backend_name(expected));
    expect_auto_gives(expected);
    assert_int_equal(setenv("FLASHATTN_BACKEND", "", 1), 0); /* empty = unset */
    expect_auto_gives(expected);
    assert_int_equal(setenv("FLASHATTN_BACKEND", "auto", 1), 0);
    expect_auto_gives(expected);
}

static void test_override_cpu(void **state)
{
    (void)state;
    assert_int_equal(setenv("FLASHATTN_BACKEND", "cpu", 1), 0);
    expect_auto_gives(FA_BACKEND_CPU);
}

static void expect_override_unavailable(fa_backend gpu, const char *env_value)
{
    if (fa_backend_available(gpu)) {
        assert_int_equal(setenv("FLASHATTN_BACKEND", env_value, 1), 0);
        expect_auto_gives(gpu);
        skip(); /* the backend exists here: its "unavailable" path cannot be observed */
    }
    assert_int_equal(setenv("FLASHATTN_BACKEND", env_value, 1), 0);
    fa_context *ctx = (fa_context *)&ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_AUTO, 0, &ctx), FA_ERROR_BACKEND_UNAVAILABLE);
    assert_null(ctx);
    const char *msg = fa_last_error();
    print_message("FLASHATTN_BACKEND=%s: %s\n", env_value, msg);
    if (!strstr(msg, fa_backend_name(gpu))) fail_msg("message '%s' does not name the %s backend", msg, env_value);
}

static void test_override_cuda_unavailable(void **state)
{
    (void)state;
    expect_override_unavailable(FA_BACKEND_CUDA, "cuda");
}

static void test_override_hip_unavailable(void **state)
{
    (void)state;
    expect_override_unavailable(FA_BACKEND_HIP, "hip");
}

static void test_override_invalid(void **state)
{
    (void)state;
    const char *bad[] = {"tpu", "cpu,cuda", " cpu"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        assert_int_equal(setenv("FLASHATTN_BACKEND", bad[i], 1), 0);
        fa_context *ctx = (fa_context *)&ctx;
        assert_int_equal(fa_context_create(FA_BACKEND_AUTO, 0, &ctx), FA_ERROR_INVALID_VALUE);
        assert_null(ctx);
        assert_non_null(strstr(fa_last_error(), "FLASHATTN_BACKEND"));
    }
}

static void test_explicit_backend_ignores_override(void **state)
{
    (void)state;
    assert_int_equal(setenv("FLASHATTN_BACKEND", "tpu", 1), 0);
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_int_equal(fa_context_backend(ctx), FA_BACKEND_CPU);
    fa_context_destroy(ctx);
}

static void expect_explicit_unavailable(fa_backend gpu)
{
    if (fa_backend_available(gpu)) skip();
    fa_context *ctx = (fa_context *)&ctx;
    assert_int_equal(fa_context_create(gpu, 0, &ctx), FA_ERROR_BACKEND_UNAVAILABLE);
    assert_null(ctx);
    const char *msg = fa_last_error();
    if (!strstr(msg, fa_backend_name(gpu))) fail_msg("message '%s' does not name the backend", msg);
}

static void test_explicit_cuda_unavailable(void **state)
{
    (void)state;
    expect_explicit_unavailable(FA_BACKEND_CUDA);
}

static void test_explicit_hip_unavailable(void **state)
{
    (void)state;
    expect_explicit_unavailable(FA_BACKEND_HIP);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cpu_always_available, clear_env, clear_env),
        cmocka_unit_test_setup_teardown(test_auto_without_override, clear_env, clear_env),
        cmocka_unit_test_setup_teardown(test_override_cpu, clear_env, clear_env),
        cmocka_unit_test_setup_teardown(test_override_cuda_unavailable, clear_env, clear_env),
        cmocka_unit_test_setup_teardown(test_override_hip_unavailable, clear_env, clear_env),
        cmocka_unit_test_setup_teardown(test_override_invalid, clear_env, clear_env),
        cmocka_unit_test_setup_teardown(test_explicit_backend_ignores_override, clear_env, clear_env),
        cmocka_unit_test_setup_teardown(test_explicit_cuda_unavailable, clear_env, clear_env),
        cmocka_unit_test_setup_teardown(test_explicit_hip_unavailable, clear_env, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

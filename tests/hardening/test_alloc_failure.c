/* Allocation failures: the library's allocator hook fails the k-th host allocation, and k walks
 * over every allocation that context creation, fa_malloc, fa_forward and fa_backward make.
 * Each failing call must return FA_ERROR_OUT_OF_MEMORY with a message, leak nothing (checked by
 * LeakSanitizer in the sanitizer build and by valgrind), write none of its outputs (the CPU
 * passes' out-of-memory protocol, src/cpu/cpu_scratch.h), and leave the library usable: the next
 * call without injection gives bit-identical results to an undisturbed run. A call never
 * reports success with incomplete outputs. White-box: links the core archive for the hook. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "fixture.h"

typedef fa_status (*attention_call)(fa_context *ctx, fixture *f);

/* Runs call with the k-th allocation failing; returns the status. */
static fa_status with_failure(size_t k, attention_call call, fa_context *ctx, fixture *f)
{
    fa_debug_fail_allocation(k);
    const fa_status st = call(ctx, f);
    fa_debug_fail_allocation(0);
    return st;
}

/* Number of host allocations call makes (it must succeed). */
static size_t count_allocations(attention_call call, fa_context *ctx, fixture *f)
{
    fa_debug_fail_allocation(0);
    assert_int_equal(call(ctx, f), FA_SUCCESS);
    return fa_debug_fail_allocation(0);
}

static void assert_out_of_memory(fa_status st, size_t k)
{
    if (st != FA_ERROR_OUT_OF_MEMORY) fail_msg("allocation %zu failed but the call returned %d", k, (int)st);
    assert_true(strlen(fa_last_error()) > 0);
}

/* Walks k over every allocation of fa_forward (and fa_backward when backward) at thread count threads. */
static void walk_attention(int threads, int backward)
{
    const oracle_shape shape = {2, 4, 2, 37, 45, 24};
    fixture got, want;
    assert_true(fixture_init(&got, &shape, FA_DTYPE_F32, 7));
    assert_true(fixture_init(&want, &shape, FA_DTYPE_F32, 7));
    got.desc.causal = want.desc.causal = 1;
    got.desc.dropout_p = want.desc.dropout_p = 0.25f;
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_int_equal(fa_context_set_num_threads(ctx, threads), FA_SUCCESS);

    assert_int_equal(fixture_forward(ctx, &want), FA_SUCCESS);
    if (backward) assert_int_equal(fixture_backward(ctx, &want), FA_SUCCESS);
    attention_call call = fixture_forward;
    if (backward) {
        assert_int_equal(fixture_forward(ctx, &got), FA_SUCCESS);
        call = fixture_backward;
    }
    const size_t n = count_allocations(call, ctx, &got);
    assert_true(n >= 1);
    print_message("threads %d, %s: %zu allocations\n", threads, backward ? "backward" : "forward", n);

    for (size_t k = 1; k <= n + 1; ++k) {
        if (backward) fixture_poison_gradients(&got);
        else fixture_poison_forward(&got);
        const fa_status st = with_failure(k, call, ctx, &got);
        if (k <= n) {
            assert_out_of_memory(st, k);
            if (!(backward ? fixture_gradients_untouched(&got) : fixture_forward_untouched(&got)))
                fail_msg("allocation %zu failed but the call wrote some of its outputs", k);
            /* The library still works after the failure. */
            assert_int_equal(call(ctx, &got), FA_SUCCESS);
        } else {
            assert_int_equal(st, FA_SUCCESS); /* the walk covered every allocation */
        }
        assert_true(backward ? fixture_gradients_identical(&got, &want) : fixture_forward_identical(&got, &want));
    }
    fa_context_destroy(ctx);
    fixture_free(&got);
    fixture_free(&want);
}

static void forward_one_thread(void **state) { (void)state; walk_attention(1, 0); }
static void forward_three_threads(void **state) { (void)state; walk_attention(3, 0); }
static void backward_one_thread(void **state) { (void)state; walk_attention(1, 1); }
static void backward_three_threads(void **state) { (void)state; walk_attention(3, 1); }

static void context_create(void **state)
{
    (void)state;
    fa_context *ctx = NULL;
    fa_debug_fail_allocation(0);
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    const size_t n = fa_debug_fail_allocation(0);
    fa_context_destroy(ctx);
    assert_true(n >= 1);
    for (size_t k = 1; k <= n; ++k) {
        fa_debug_fail_allocation(k);
        ctx = (fa_context *)&ctx; /* must be reset to NULL on failure */
        const fa_status st = fa_context_create(FA_BACKEND_CPU, 0, &ctx);
        fa_debug_fail_allocation(0);
        assert_out_of_memory(st, k);
        assert_null(ctx);
    }
}

static void backend_malloc(void **state)
{
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    void *p = &p;
    fa_debug_fail_allocation(1);
    assert_out_of_memory(fa_malloc(ctx, 1024, &p), 1);
    fa_debug_fail_allocation(0);
    assert_null(p);
    /* Sizes no allocator can give: OUT_OF_MEMORY, never a wrapped-around small block. */
    const size_t huge[] = {SIZE_MAX, SIZE_MAX - 62, SIZE_MAX / 2 + 1};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; ++i) {
        p = &p;
        assert_out_of_memory(fa_malloc(ctx, huge[i], &p), 0);
        assert_null(p);
    }
    assert_int_equal(fa_malloc(ctx, 1024, &p), FA_SUCCESS);
    assert_non_null(p);
    assert_int_equal(fa_free(ctx, p), FA_SUCCESS);
    fa_context_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(context_create),
        cmocka_unit_test(backend_malloc),
        cmocka_unit_test(forward_one_thread),
        cmocka_unit_test(forward_three_threads),
        cmocka_unit_test(backward_one_thread),
        cmocka_unit_test(backward_three_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

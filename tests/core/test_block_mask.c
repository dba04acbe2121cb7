/* Block-sparse mask helpers against independent definitions, their argument errors, and block
 * masks whose block sizes do not divide the sequence lengths (including an all-zero mask). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "harness.h"
#include "test_util.h"

static int bit_count(uint64_t x)
{
    int n = 0;
    for (; x; x >>= 1) n += (int)(x & 1u);
    return n;
}

static void test_butterfly(void **state)
{
    (void)state;
    const int64_t shapes[][2] = {{1, 1}, {1, 9}, {8, 8}, {13, 5}, {5, 13}, {64, 64}, {100, 37}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
        const int64_t rows = shapes[s][0], cols = shapes[s][1];
        uint8_t *mask = malloc((size_t)(rows * cols));
        assert_non_null(mask);
        assert_int_equal(fa_block_mask_butterfly(rows, cols, mask), FA_SUCCESS);
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
                /* r == c, or r and c differ in exactly one bit */
                const int expected = bit_count((uint64_t)(r ^ c)) <= 1;
                if ((mask[r * cols + c] != 0) != expected)
                    fail_msg("butterfly %lldx%lld: block (%lld, %lld) is %d", (long long)rows, (long long)cols,
                             (long long)r, (long long)c, mask[r * cols + c]);
            }
        free(mask);
    }
}

static void test_local_global(void **state)
{
    (void)state;
    const int64_t params[][4] = {{1, 1, 0, 0}, {7, 7, 1, 1}, {10, 4, 2, 0}, {4, 10, 0, 2}, {33, 33, 3, 2}, {5, 5, 9, 9}};
    for (size_t s = 0; s < sizeof params / sizeof params[0]; ++s) {
        const int64_t rows = params[s][0], cols = params[s][1], local = params[s][2], global = params[s][3];
        uint8_t *mask = malloc((size_t)(rows * cols));
        uint8_t *expected = calloc((size_t)(rows * cols), 1);
        assert_non_null(mask);
        assert_non_null(expected);
        assert_int_equal(fa_block_mask_local_global(rows, cols, local, global, mask), FA_SUCCESS);
        /* built by painting: a band, then global rows, then global columns */
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = r - local; c <= r + local; ++c)
                if (c >= 0 && c < cols) expected[r * cols + c] = 1;
        for (int64_t r = 0; r < global && r < rows; ++r) memset(expected + r * cols, 1, (size_t)cols);
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < global && c < cols; ++c) expected[r * cols + c] = 1;
        for (int64_t i = 0; i < rows * cols; ++i)
            if ((mask[i] != 0) != expected[i])
                fail_msg("local_global %lldx%lld local %lld global %lld: block %lld", (long long)rows,
                         (long long)cols, (long long)local, (long long)global, (long long)i);
        free(mask);
        free(expected);
    }
}

static void expect_error(fa_status st, const char *name, const uint8_t *canary_area)
{
    test_expect_error(st, FA_ERROR_INVALID_VALUE, name);
    if (canary_area)
        for (int i = 0; i < 4; ++i) assert_int_equal(canary_area[i], 0xA5);
}

static void test_argument_errors(void **state)
{
    (void)state;
    uint8_t mask[4];
    memset(mask, 0xA5, sizeof mask);
    expect_error(fa_block_mask_butterfly(2, 2, NULL), "mask", NULL);
    expect_error(fa_block_mask_butterfly(0, 2, mask), "rows", mask);
    expect_error(fa_block_mask_butterfly(2, -1, mask), "cols", mask);
    expect_error(fa_block_mask_local_global(2, 2, 1, 1, NULL), "mask", NULL);
    expect_error(fa_block_mask_local_global(-2, 2, 1, 1, mask), "rows", mask);
    expect_error(fa_block_mask_local_global(2, 0, 1, 1, mask), "cols", mask);
    expect_error(fa_block_mask_local_global(2, 2, -1, 1, mask), "local_blocks", mask);
    expect_error(fa_block_mask_local_global(2, 2, 1, -1, mask), "global_blocks", mask);
}

/* Block sizes 5 x 7 on 23 x 31 tokens: the last block row and column are partial. */
static void test_non_dividing_blocks_match_oracle(void **state)
{
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    const case_block_mask kinds[] = {BLOCK_MASK_RANDOM, BLOCK_MASK_BUTTERFLY, BLOCK_MASK_LOCAL_GLOBAL};
    for (size_t i = 0; i < 3; ++i) {
        const fa_test_case c = {"partial_blocks", {2, 2, 1, 23, 31, 24}, 0, 0, -1, -1, 0, 0.0f, 0, 0,
                                kinds[i], 5, 7, LAYOUT_PACKED, 0};
        fa_case_errors errors;
        char why[256];
        assert_int_equal(fa_run_case(ctx, &c, FA_DTYPE_F32, 1, &errors), FA_SUCCESS);
        if (!fa_case_passes(&errors, FA_DTYPE_F32, 1, why, sizeof why)) fail_msg("mask kind %d: %s", (int)kinds[i], why);
    }
    fa_context_destroy(ctx);
}

/* Every block zero: every row is fully masked. Zeros out, lse -inf, zero gradients, no NaN. */
static void test_all_zero_mask(void **state)
{
    (void)state;
    enum { B = 1, H = 2, NQ = 11, NK = 13, D = 8 };
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    static float q[B * NQ * H * D], k[B * NK * H * D], v[B * NK * H * D], out[B * NQ * H * D], dout[B * NQ * H * D];
    static float dq[B * NQ * H * D], dk[B * NK * H * D], dv[B * NK * H * D], lse[B * H * NQ];
    for (size_t i = 0; i < sizeof q / sizeof q[0]; ++i) q[i] = dout[i] = (float)i / 100.0f, out[i] = NAN;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; ++i) k[i] = v[i] = 1.0f - (float)i / 50.0f, dk[i] = dv[i] = NAN;
    uint8_t zeros[3 * 2] = {0};
    const fa_block_mask bm = {4, 9, 3, 2, zeros};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.block_mask = &bm;
    const fa_tensor tq = {q, FA_DTYPE_F32, B, NQ, H, D, 0, 0, 0}, tk = {k, FA_DTYPE_F32, B, NK, H, D, 0, 0, 0};
    const fa_tensor tv = {v, FA_DTYPE_F32, B, NK, H, D, 0, 0, 0}, tdout = {dout, FA_DTYPE_F32, B, NQ, H, D, 0, 0, 0};
    fa_tensor tout = {out, FA_DTYPE_F32, B, NQ, H, D, 0, 0, 0}, tdq = {dq, FA_DTYPE_F32, B, NQ, H, D, 0, 0, 0};
    fa_tensor tdk = {dk, FA_DTYPE_F32, B, NK, H, D, 0, 0, 0}, tdv = {dv, FA_DTYPE_F32, B, NK, H, D, 0, 0, 0};
    assert_int_equal(fa_forward(ctx, &desc, &tq, &tk, &tv, &tout, lse), FA_SUCCESS);
    for (size_t i = 0; i < sizeof out / sizeof out[0]; ++i) assert_true(out[i] == 0.0f);
    for (size_t i = 0; i < sizeof lse / sizeof lse[0]; ++i) assert_true(isinf(lse[i]) && lse[i] < 0);
    for (size_t i = 0; i < sizeof dq / sizeof dq[0]; ++i) dq[i] = NAN;
    assert_int_equal(fa_backward(ctx, &desc, &tq, &tk, &tv, &tout, &tdout, lse, &tdq, &tdk, &tdv), FA_SUCCESS);
    for (size_t i = 0; i < sizeof dq / sizeof dq[0]; ++i) assert_true(dq[i] == 0.0f);
    for (size_t i = 0; i < sizeof dk / sizeof dk[0]; ++i) assert_true(dk[i] == 0.0f && dv[i] == 0.0f);
    fa_context_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_butterfly),
        cmocka_unit_test(test_local_global),
        cmocka_unit_test(test_argument_errors),
        cmocka_unit_test(test_non_dividing_blocks_match_oracle),
        cmocka_unit_test(test_all_zero_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* fa_tiling_for is the paper's Bc = ceil(M / 4d), Br = min(Bc, d); the CPU backend's tiles fit
 * in the on-chip memory it reports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "flashattn.h"

/* Ceiling division written as the smallest c with c * 4d >= M, found by bisection: a different
 * route to the same number than the library's (M + 4d - 1) / 4d. */
static int64_t smallest_cover(int64_t m, int64_t d)
{
    int64_t lo = 0, hi = m; /* hi * 4d >= m always holds for d >= 1 */
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (mid * 4 * d >= m) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

static void test_paper_formula_grid(void **state)
{
    (void)state;
    const int64_t sram[] = {1, 3, 4, 63, 64, 65, 1000, 4096, 12288, 16384, 24576, 49152, 65536, 100000, 262144, 1 << 22};
    for (size_t i = 0; i < sizeof sram / sizeof sram[0]; ++i)
        for (int64_t d = 1; d <= 512; d += (d < 32 ? 1 : 7)) {
            const fa_tiling t = fa_tiling_for(sram[i], d);
            const int64_t bc = smallest_cover(sram[i], d);
            const int64_t br = bc < d ? bc : d;
            if (t.block_cols != bc || t.block_rows != br)
                fail_msg("M %lld d %lld: got Br %lld Bc %lld, expected Br %lld Bc %lld", (long long)sram[i],
                         (long long)d, (long long)t.block_rows, (long long)t.block_cols, (long long)br,
                         (long long)bc);
        }
    /* a worked example: M = 100 KiB of fp32 (25600 elements), d = 64 -> Bc = 100, Br = 64 */
    const fa_tiling t = fa_tiling_for(25600, 64);
    assert_int_equal(t.block_cols, 100);
    assert_int_equal(t.block_rows, 64);
}

static void test_non_positive_arguments(void **state)
{
    (void)state;
    const int64_t bad[] = {0, -1, INT64_MIN};
    for (size_t i = 0; i < 3; ++i) {
        fa_tiling t = fa_tiling_for(bad[i], 64);
        assert_int_equal(t.block_rows, 0);
        assert_int_equal(t.block_cols, 0);
        t = fa_tiling_for(65536, bad[i]);
        assert_int_equal(t.block_rows, 0);
        assert_int_equal(t.block_cols, 0);
    }
}

static void test_cpu_tiles_fit(void **state)
{
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (size_t k = 0; k < 3; ++k)
        for (int64_t d = 1; d <= 512; ++d) {
            fa_tiling t = {0, 0};
            int64_t m = -1;
            assert_int_equal(fa_context_tiling(ctx, d, dtypes[k], &t, &m), FA_SUCCESS);
            const int64_t footprint = t.block_rows * d + 2 * t.block_cols * d + t.block_rows * t.block_cols;
            /* M is the L2 of a core, capped at 1 MiB (docs/CPU.md, Tiles) */
            if (t.block_rows < 1 || t.block_cols < 1 || m <= 0 || footprint > m || m * 4 > (1 << 20))
                fail_msg("d %lld dtype %d: Br %lld Bc %lld footprint %lld, on-chip memory %lld (%s)", (long long)d,
                         (int)dtypes[k], (long long)t.block_rows, (long long)t.block_cols, (long long)footprint,
                         (long long)m, fa_context_info(ctx));
            /* the sram output is optional */
            fa_tiling again;
            assert_int_equal(fa_context_tiling(ctx, d, dtypes[k], &again, NULL), FA_SUCCESS);
            assert_int_equal(again.block_rows, t.block_rows);
            assert_int_equal(again.block_cols, t.block_cols);
        }
    print_message("%s\n", fa_context_info(ctx));
    fa_context_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paper_formula_grid),
        cmocka_unit_test(test_non_positive_arguments),
        cmocka_unit_test(test_cpu_tiles_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

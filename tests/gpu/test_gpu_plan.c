/* Host-side planning of the GPU plugins (src/gpu/plan.h) on the CPU, with the shared-memory
 * sizes of the GPUs the plugins target: the tile comes from the common tiling logic, is one the
 * plugin instantiates, fits the device, and is the largest such tile not above the paper's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "gpu/plan.h"

typedef struct device_smem { const char *name; int64_t bytes; } device_smem;

/* Opt-in shared memory per block (CUDA) or LDS per block (HIP). */
static const device_smem devices[] = {
    {"A100 (sm_80)", 166912}, {"H100 (sm_90)", 232448}, {"RTX 30xx (sm_86)", 101376},
    {"MI200/MI100/RX 6000 (64 KiB LDS)", 65536},      {"48 KiB default", 49152},
};

static int is_option(int bucket, int tile)
{
    int options[3];
    const int n = fa_gpu_tile_options(bucket, options);
    for (int i = 0; i < n; ++i)
        if (options[i] == tile) return 1;
    return 0;
}

static void test_head_buckets(void **state)
{
    (void)state;
    assert_int_equal(fa_gpu_head_bucket(0), 0);
    assert_int_equal(fa_gpu_head_bucket(1), 64);
    assert_int_equal(fa_gpu_head_bucket(64), 64);
    assert_int_equal(fa_gpu_head_bucket(65), 128);
    assert_int_equal(fa_gpu_head_bucket(128), 128);
    assert_int_equal(fa_gpu_head_bucket(200), 256);
    assert_int_equal(fa_gpu_head_bucket(256), 256);
    assert_int_equal(fa_gpu_head_bucket(257), 0);
}

static void test_smem_row_stride_is_odd(void **state)
{
    (void)state;
    for (int64_t d = 1; d <= FA_GPU_MAX_HEAD_DIM; ++d) {
        const int64_t ld = fa_gpu_smem_ld(d);
        assert_true(ld % 2 == 1);
        assert_true(ld >= d && ld <= d + 1);
    }
}

/* Every head dim on every device and pass: a valid, fitting, maximal tile. */
static void test_tiles_fit_and_are_maximal(void **state)
{
    (void)state;
    static const fa_gpu_pass passes[] = {FA_GPU_PASS_FORWARD, FA_GPU_PASS_BACKWARD};
    for (size_t dev = 0; dev < sizeof devices / sizeof devices[0]; ++dev) {
        const int64_t smem = devices[dev].bytes;
        for (int pi = 0; pi < 2; ++pi) {
            for (int64_t d = 1; d <= FA_GPU_MAX_HEAD_DIM; ++d) {
                const int tile = fa_gpu_generic_tile(passes[pi], smem, d);
                const int bucket = fa_gpu_head_bucket(d);
                if (tile == 0) {
                    /* refused only when even the smallest instantiated tile does not fit */
                    int options[3];
                    const int n = fa_gpu_tile_options(bucket, options);
                    assert_true(fa_gpu_generic_smem_bytes(passes[pi], options[n - 1], d) > smem);
                    continue;
                }
                assert_true(is_option(bucket, tile));
                assert_true(fa_gpu_generic_smem_bytes(passes[pi], tile, d) <= smem);
                int64_t br, bc;
                fa_fit_tiles(smem / 4, d, 8, 8, &br, &bc);
                const int64_t paper = br < bc ? br : bc;
                int options[3];
                const int n = fa_gpu_tile_options(bucket, options);
                for (int i = 0; i < n; ++i) {
                    if (options[i] <= tile) continue;
                    /* a larger instantiated tile is above the paper's value or does not fit */
                    assert_true(options[i] > paper || fa_gpu_generic_smem_bytes(passes[pi], options[i], d) > smem);
                }
                if (tile > paper) /* only when nothing at or below the paper's value exists */
                    for (int i = 0; i < n; ++i) assert_true(options[i] > paper || options[i] > tile);
            }
        }
    }
}

/* The planned shapes of the targeted GPUs, for the record (and so a change in the tiling logic
 * is seen): d = 64, 128, 256 all run on each of them. */
static void test_target_gpus_serve_all_head_dims(void **state)
{
    (void)state;
    for (size_t dev = 0; dev < 4; ++dev) {
        for (int64_t d = 8; d <= FA_GPU_MAX_HEAD_DIM; d += 8) {
            assert_true(fa_gpu_generic_tile(FA_GPU_PASS_FORWARD, devices[dev].bytes, d) > 0);
            assert_true(fa_gpu_generic_tile(FA_GPU_PASS_BACKWARD, devices[dev].bytes, d) > 0);
        }
    }
    /* 64 KiB of LDS holds the d = 256 backward only at the smallest tile */
    assert_int_equal(fa_gpu_generic_tile(FA_GPU_PASS_BACKWARD, 65536, 256), 8);
}

static void test_rejects_unsupported(void **state)
{
    (void)state;
    assert_int_equal(fa_gpu_generic_tile(FA_GPU_PASS_FORWARD, 166912, 257), 0);
    assert_int_equal(fa_gpu_generic_tile(FA_GPU_PASS_FORWARD, 166912, 0), 0);
    assert_int_equal(fa_gpu_generic_tile(FA_GPU_PASS_FORWARD, 0, 64), 0);
    assert_int_equal(fa_gpu_generic_tile(FA_GPU_PASS_BACKWARD, 1024, 256), 0); /* nothing fits */
    assert_int_equal(fa_gpu_tiles(0, 16), 0);
    assert_int_equal(fa_gpu_tiles(17, 16), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head_buckets),
        cmocka_unit_test(test_smem_row_stride_is_odd),
        cmocka_unit_test(test_tiles_fit_and_are_maximal),
        cmocka_unit_test(test_target_gpus_serve_all_head_dims),
        cmocka_unit_test(test_rejects_unsupported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

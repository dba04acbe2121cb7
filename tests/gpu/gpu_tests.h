/* What the GPU backend tests share (test_gpu_backends.c): the fixture's context or a visible
 * skip, host <-> dtype conversions, and the packed-batch and KV-cache tests
 * (test_gpu_varlen_kvcache.c), which compare each GPU run with the CPU backend on the same inputs. */
#ifndef FA_GPU_TESTS_H
#define FA_GPU_TESTS_H
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

/* The fixture's context; skip() (or fail under FLASHATTN_REQUIRE_GPU=1) without a device. */
fa_context *context_or_skip(void **state);
size_t dtype_size(fa_dtype dtype);
/* n floats as a new host array of dtype (round to nearest even). */
void *to_dtype(const float *x, size_t n, fa_dtype dtype);
float from_dtype(const void *x, size_t i, fa_dtype dtype);

/* n values of dtype on the host (seeded, or NaN for seed 0) and their device copy. */
typedef struct buffer {
    void *host, *dev;
    size_t n;
    fa_dtype dtype;
} buffer;
buffer buffer_new(fa_context *ctx, size_t n, fa_dtype dtype, uint64_t seed);
void *buffer_fetch(fa_context *ctx, const buffer *b); /* the device copy, as a new host array */
void buffer_free(fa_context *ctx, buffer *b);
int32_t *table_upload(fa_context *ctx, const int32_t *t, size_t n);
/* max |got - want| / max(1, max |want|) over n values of dtype (equal non-finite values agree). */
double relative_error(const void *got, const void *want, size_t n, fa_dtype dtype);
/* Fails unless got is within the harness tolerance of `computed` of want (arrays of `stored`). */
void expect_close_as(const char *what, const char *name, const void *got, const void *want, size_t n,
                     fa_dtype stored, fa_dtype computed);
void expect_close(const char *what, const char *name, const void *got, const void *want, size_t n, fa_dtype dtype);

void test_gpu_bad_modifier_values(void **state);
void test_gpu_varlen_f32(void **state);
void test_gpu_varlen_f16(void **state);
void test_gpu_varlen_bf16(void **state);
void test_gpu_kvcache_f32(void **state);
void test_gpu_kvcache_f16(void **state);
void test_gpu_kvcache_nan(void **state);
void test_gpu_bad_tables(void **state);

/* The KV cache's serving forms: ragged queries, batch invariance, slots (test_gpu_serving.c). */
void test_gpu_serving_ragged(void **state);
void test_gpu_serving_invariance(void **state);
void test_gpu_serving_slots(void **state);
void test_gpu_serving_bad_tables(void **state);
void test_gpu_serving_quantised(void **state);
#define GPU_SERVING_TESTS(setup, teardown)                                                        \
    cmocka_unit_test_setup_teardown(test_gpu_serving_ragged, setup, teardown),                   \
    cmocka_unit_test_setup_teardown(test_gpu_serving_invariance, setup, teardown),               \
    cmocka_unit_test_setup_teardown(test_gpu_serving_slots, setup, teardown),                    \
    cmocka_unit_test_setup_teardown(test_gpu_serving_bad_tables, setup, teardown),                \
    cmocka_unit_test_setup_teardown(test_gpu_serving_quantised, setup, teardown)

/* Block positions (test_gpu_positions.c). */
void test_gpu_positions_f32(void **state);
void test_gpu_positions_f16(void **state);
void test_gpu_positions_bf16(void **state);
#define GPU_POSITIONS_TESTS(setup, teardown)                                                      \
    cmocka_unit_test_setup_teardown(test_gpu_positions_f32, setup, teardown),                    \
    cmocka_unit_test_setup_teardown(test_gpu_positions_f16, setup, teardown),                    \
    cmocka_unit_test_setup_teardown(test_gpu_positions_bf16, setup, teardown)

/* The same calls twice, bit-identical (test_gpu_repeat.c). */
void test_gpu_repeat_f32(void **state);
void test_gpu_repeat_f16(void **state);
void test_gpu_repeat_bf16(void **state);
#define GPU_REPEAT_TESTS(setup, teardown)                                                         \
    cmocka_unit_test_setup_teardown(test_gpu_repeat_f32, setup, teardown),                       \
    cmocka_unit_test_setup_teardown(test_gpu_repeat_f16, setup, teardown),                       \
    cmocka_unit_test_setup_teardown(test_gpu_repeat_bf16, setup, teardown)

/* fa_merge_partials on device memory (test_gpu_merge.c). */
void test_gpu_merge_f32(void **state);
void test_gpu_merge_f16(void **state);
void test_gpu_merge_bf16(void **state);
#define GPU_MERGE_TESTS(setup, teardown)                                                          \
    cmocka_unit_test_setup_teardown(test_gpu_merge_f32, setup, teardown),                        \
    cmocka_unit_test_setup_teardown(test_gpu_merge_f16, setup, teardown),                        \
    cmocka_unit_test_setup_teardown(test_gpu_merge_bf16, setup, teardown)

#define GPU_VARLEN_KVCACHE_TESTS(setup, teardown)                                                 \
    cmocka_unit_test_setup_teardown(test_gpu_varlen_f32, setup, teardown),                       \
    cmocka_unit_test_setup_teardown(test_gpu_varlen_f16, setup, teardown),                       \
    cmocka_unit_test_setup_teardown(test_gpu_varlen_bf16, setup, teardown),                      \
    cmocka_unit_test_setup_teardown(test_gpu_kvcache_f32, setup, teardown),                      \
    cmocka_unit_test_setup_teardown(test_gpu_kvcache_f16, setup, teardown),                      \
    cmocka_unit_test_setup_teardown(test_gpu_kvcache_nan, setup, teardown),                      \
    cmocka_unit_test_setup_teardown(test_gpu_bad_tables, setup, teardown),                       \
    cmocka_unit_test_setup_teardown(test_gpu_bad_modifier_values, setup, teardown)
#endif

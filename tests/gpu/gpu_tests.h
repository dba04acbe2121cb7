/* What the GPU backend tests share (test_gpu_backends.c): the fixture's context or a visible
 * skip, host <-> dtype conversions, and the packed-batch and KV-cache tests
 * (test_gpu_varlen_kvcache.c), which compare each GPU run with the CPU backend on the same inputs. */
#ifndef FA_GPU_TESTS_H
#define FA_GPU_TESTS_H
#include <stddef.h>

#include "flashattn.h"

/* The fixture's context; skip() (or fail under FLASHATTN_REQUIRE_GPU=1) without a device. */
fa_context *context_or_skip(void **state);
size_t dtype_size(fa_dtype dtype);
/* n floats as a new host array of dtype (round to nearest even). */
void *to_dtype(const float *x, size_t n, fa_dtype dtype);
float from_dtype(const void *x, size_t i, fa_dtype dtype);

void test_gpu_varlen_f32(void **state);
void test_gpu_varlen_f16(void **state);
void test_gpu_varlen_bf16(void **state);
void test_gpu_kvcache_f32(void **state);
void test_gpu_kvcache_f16(void **state);
void test_gpu_bad_tables(void **state);

#define GPU_VARLEN_KVCACHE_TESTS(setup, teardown)                                                 \
    cmocka_unit_test_setup_teardown(test_gpu_varlen_f32, setup, teardown),                       \
    cmocka_unit_test_setup_teardown(test_gpu_varlen_f16, setup, teardown),                       \
    cmocka_unit_test_setup_teardown(test_gpu_varlen_bf16, setup, teardown),                      \
    cmocka_unit_test_setup_teardown(test_gpu_kvcache_f32, setup, teardown),                      \
    cmocka_unit_test_setup_teardown(test_gpu_kvcache_f16, setup, teardown),                      \
    cmocka_unit_test_setup_teardown(test_gpu_bad_tables, setup, teardown)
#endif

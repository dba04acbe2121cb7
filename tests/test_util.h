/* The tests' shared helpers for dtypes and errors: element sizes, rounding to and encoding in
 * f16/bf16, and the check that a call failed with a status and a message naming the argument.
 * The f16/bf16 conversions here are the tests' own, written independently of the library's
 * (src/common/half.h) on purpose: a test that converted with the library's code could not see a
 * bug in it. Linked into every test through test_support (tests/meson.build). */
#ifndef FA_TEST_UTIL_H
#define FA_TEST_UTIL_H
#include <stddef.h>

#include "flashattn.h"

/* Bytes of one element: 4 for f32, 2 for f16 and bf16. */
size_t test_dtype_size(fa_dtype dtype);

/* x rounded to the nearest value of dtype, ties to even (subnormals kept; an f16 beyond its range
 * rounds to infinity only when stored, below). NaN and infinities are returned unchanged. */
double test_round_to_dtype(double x, fa_dtype dtype);

/* Element index of buf in dtype: stored from x, rounded to nearest even (NaN stays a NaN, f16
 * overflow becomes infinity) / loaded exactly. */
void test_store_element(void *buf, size_t index, fa_dtype dtype, double x);
double test_load_element(const void *buf, size_t index, fa_dtype dtype);

/* cmocka check: got must be want, and fa_last_error() one line that contains name (the argument
 * the failing call must name); otherwise the test fails with the message it got. */
void test_expect_error(fa_status got, fa_status want, const char *name);
#endif

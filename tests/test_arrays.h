/* Small host-array helpers for tests that build their own tensors (varlen, KV cache): seeded
 * values, f32 views of packed double arrays, and error measures against an oracle. The dtype
 * helpers (element sizes, f16/bf16 conversion) and the error check are test_util.h's. */
#ifndef FA_TEST_ARRAYS_H
#define FA_TEST_ARRAYS_H
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"
#include "test_util.h" /* test_store_element, test_load_element, sizes, errors */

/* n values of a fixed pseudo-random sequence (seed), uniform in [-1, 1), exact in f32. */
double *test_random_doubles(uint64_t seed, size_t n);
/* n f32 elements filled with a NaN pattern (so a row the library never writes shows up). */
float *test_nan_floats(size_t n);
/* max |got - ref| / max(1, max |ref|), INFINITY for a non-finite got where ref is finite or a
 * mismatched infinity. */
double test_relative_error(const double *ref, const float *got, size_t n);
/* A paged KV cache's block table [batch, max_pages] over `pages` pages (pages >= batch * max_pages):
 * handed out back to front and interleaved across sequences (page x of sequence b is
 * pages - 1 - (x * batch + b)), so no sequence's pages are contiguous or in order. malloc'd, NULL
 * when out of memory. */
int32_t *test_page_table(int64_t batch, int64_t max_pages, int64_t pages);
#endif

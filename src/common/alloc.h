/* Every host allocation of the library goes through here, so tests can inject failures. */
#ifndef FA_ALLOC_H
#define FA_ALLOC_H
#include <stddef.h>

void *fa_host_alloc(size_t bytes);          /* 64-byte aligned; NULL on failure or injected failure */
void *fa_host_calloc(size_t count, size_t size);
void fa_host_free(void *ptr);

/* Test hook (not in the public header): fail the k-th allocation from now (1-based), 0 = never.
 * Returns the number of allocations made since the last call. */
size_t fa_debug_fail_allocation(size_t k);
#endif

/* Every host allocation of the library goes through here, so tests can inject failures. */
#ifndef FA_ALLOC_H
#define FA_ALLOC_H
#include <stddef.h>

void *fa_host_alloc(size_t bytes);          /* 64-byte aligned; NULL on failure or injected failure */
void *fa_host_calloc(size_t count, size_t size);
void fa_host_free(void *ptr);

/* Per-call scratch (the CPU passes' tiles), 64-byte aligned: freed blocks are parked for the next
 * call instead of going back to the C library. glibc placed each forward's 3 MiB block at a new
 * address of its heap, so every call faulted its pages in again: 680 page faults per thread and
 * call, 5% of a 20 ms forward on an Emerald Rapids VM. A parked block of at least `bytes` is
 * handed out again; at most 8 blocks and 64 MiB wait between calls. Counts as one allocation for
 * the failure hook, parked or not. Free with fa_host_scratch_free (NULL is a no-op), never
 * fa_host_free. */
void *fa_host_scratch_alloc(size_t bytes);
void fa_host_scratch_free(void *ptr);
/* Every parked block back to the C library (fa-bench, before measuring a call's peak memory). */
void fa_host_scratch_release(void);
/* 1 when freed scratch is parked (0 under ASan, which should see each call's blocks). */
int fa_host_scratch_parking(void);

/* Test hook (not in the public header): fail the k-th allocation from now (1-based), 0 = never.
 * Returns the number of allocations made since the last call. */
size_t fa_debug_fail_allocation(size_t k);
#endif

#include "alloc.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

static atomic_size_t alloc_count;
static atomic_size_t fail_at; /* 0 = never */

void *fa_host_alloc(size_t bytes)
{
    const size_t n = atomic_fetch_add(&alloc_count, 1) + 1;
    const size_t k = atomic_load(&fail_at);
    if (k != 0 && n == k) return NULL;
    if (bytes > PTRDIFF_MAX) return NULL; /* no object can be this large; spare the allocator the request */
    if (bytes == 0) bytes = 1;
    const size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes) return NULL;
    return aligned_alloc(64, rounded);
}

void *fa_host_calloc(size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size) return NULL;
    void *p = fa_host_alloc(count * size);
    if (p) memset(p, 0, count * size);
    return p;
}

void fa_host_free(void *ptr) { free(ptr); }

size_t fa_debug_fail_allocation(size_t k)
{
    const size_t made = atomic_exchange(&alloc_count, 0);
    atomic_store(&fail_at, k);
    return made;
}

#include "alloc.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

static atomic_size_t alloc_count;
static atomic_size_t fail_at; /* 0 = never */

/* 1 when this allocation is the one the test hook fails (every allocation counts once). */
static int injected_failure(void)
{
    const size_t n = atomic_fetch_add(&alloc_count, 1) + 1;
    const size_t k = atomic_load(&fail_at);
    return k != 0 && n == k;
}

/* bytes rounded up to 64 (at least 64), or 0 when no object can be this large. */
static size_t rounded_size(size_t bytes)
{
    if (bytes > PTRDIFF_MAX - 64) return 0; /* spare the allocator the request */
    return bytes == 0 ? 64 : (bytes + 63) & ~(size_t)63;
}

void *fa_host_alloc(size_t bytes)
{
    if (injected_failure()) return NULL;
    const size_t rounded = rounded_size(bytes);
    return rounded ? aligned_alloc(64, rounded) : NULL;
}

/* Parking would hide from the memory checkers what they check per call: ASan keeps each block
 * (its use after free, its leaks), memcheck sees a handed-out block as uninitialised again. */
#if defined(__SANITIZE_ADDRESS__)
#define SCRATCH_PARKING 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SCRATCH_PARKING 0
#endif
#endif
#ifndef SCRATCH_PARKING
#define SCRATCH_PARKING 1
#endif
#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#endif
#endif
#ifndef VALGRIND_MAKE_MEM_UNDEFINED
#define VALGRIND_MAKE_MEM_UNDEFINED(addr, len) ((void)(addr), (void)(len))
#endif

/* Scratch blocks: a parked block starts with a 64-byte header holding its usable size; the caller
 * gets the bytes after it. At most SCRATCH_SLOTS blocks and SCRATCH_PARKED_MAX bytes wait between
 * calls (a forward's team block, a backward's per-thread blocks, a decode's two). */
enum { SCRATCH_SLOTS = 8, SCRATCH_HEADER = 64 };
#define SCRATCH_PARKED_MAX ((size_t)64 << 20)
static _Atomic(size_t *) scratch_slots[SCRATCH_SLOTS];
static atomic_size_t scratch_parked_bytes;

void *fa_host_scratch_alloc(size_t bytes)
{
    if (injected_failure()) return NULL;
    const size_t rounded = rounded_size(bytes);
    if (!rounded) return NULL;
    for (int i = 0; i < SCRATCH_SLOTS; ++i) {
        size_t *block = atomic_exchange(&scratch_slots[i], NULL);
        if (!block) continue;
        if (*block >= rounded) {
            atomic_fetch_sub(&scratch_parked_bytes, *block);
            VALGRIND_MAKE_MEM_UNDEFINED((char *)block + SCRATCH_HEADER, *block);
            return (char *)block + SCRATCH_HEADER;
        }
        size_t *empty = NULL; /* too small: back to its slot, or freed if another block took it */
        if (!atomic_compare_exchange_strong(&scratch_slots[i], &empty, block)) {
            atomic_fetch_sub(&scratch_parked_bytes, *block);
            free(block);
        }
    }
    size_t *block = aligned_alloc(64, SCRATCH_HEADER + rounded);
    if (!block) return NULL;
    *block = rounded;
    return (char *)block + SCRATCH_HEADER;
}

void fa_host_scratch_free(void *ptr)
{
    if (!ptr) return;
    size_t *block = (size_t *)((char *)ptr - SCRATCH_HEADER);
    if (SCRATCH_PARKING && atomic_fetch_add(&scratch_parked_bytes, *block) + *block <= SCRATCH_PARKED_MAX)
        for (int i = 0; i < SCRATCH_SLOTS; ++i) {
            size_t *empty = NULL;
            if (atomic_compare_exchange_strong(&scratch_slots[i], &empty, block)) return;
        }
    if (SCRATCH_PARKING) atomic_fetch_sub(&scratch_parked_bytes, *block);
    free(block);
}

int fa_host_scratch_parking(void) { return SCRATCH_PARKING; }

void fa_host_scratch_release(void)
{
    for (int i = 0; i < SCRATCH_SLOTS; ++i) {
        size_t *block = atomic_exchange(&scratch_slots[i], NULL);
        if (!block) continue;
        atomic_fetch_sub(&scratch_parked_bytes, *block);
        free(block);
    }
}

/* Parked blocks go back to the C library when the library is unloaded or the process exits
 * (valgrind then sees nothing left; under ASan nothing is parked). */
__attribute__((destructor)) static void release_parked_scratch(void) { fa_host_scratch_release(); }

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

/* Per-thread memory of the CPU forward and backward, and what a pass does when it cannot have it.
 *
 * Scratch: one allocation per thread, carved into f32 tiles and key-range arrays by a layout
 * function that runs twice: first on a measuring scratch (no base) that only sums the sizes,
 * then on the allocated block. The layout is written once, so sizes and carve-up cannot drift.
 *
 * Out of memory: a call that returns FA_ERROR_OUT_OF_MEMORY has written nothing to its outputs.
 * Two ways to keep that rule. The forward allocates every thread's scratch in one block before
 * its parallel region (fa_cpu_scratch_make_team; thread t carves share t with
 * fa_cpu_scratch_take), so a thread starts its tasks without waiting for the others: on a busy
 * machine a thread that wakes late would otherwise hold up the whole team at a barrier
 * (measured: 7-11 ms of a 100 ms forward at load 6 on 2 cores). The backward, which needs a
 * barrier anyway (its tasks read every thread's share of D), lets each thread allocate what it
 * needs, then fa_cpu_team_ready waits for the whole team; if any thread failed, no thread starts
 * a task. */
#ifndef FA_CPU_SCRATCH_H
#define FA_CPU_SCRATCH_H
#include <stddef.h>
#include <stdint.h>

#include "../common/alloc.h"
#include "../common/visibility.h"

typedef struct fa_cpu_scratch {
    char *base;  /* NULL while measuring */
    size_t used; /* bytes carved so far */
} fa_cpu_scratch;

static inline void *fa_cpu_scratch_carve(fa_cpu_scratch *s, size_t bytes, size_t align)
{
    s->used = (s->used + align - 1) / align * align;
    void *at = s->base ? s->base + s->used : NULL;
    s->used += bytes;
    return at;
}

static inline float *fa_cpu_scratch_floats(fa_cpu_scratch *s, int64_t count)
{
    return fa_cpu_scratch_carve(s, (size_t)count * sizeof(float), sizeof(float));
}

static inline fa_key_range *fa_cpu_scratch_ranges(fa_cpu_scratch *s, int64_t count)
{
    return fa_cpu_scratch_carve(s, (size_t)count * sizeof(fa_key_range), _Alignof(fa_key_range));
}

/* Runs layout(s, scratch) to measure, allocates, runs it again to carve. Returns the block (to
 * fa_host_scratch_free) or NULL when the allocation fails. */
static inline void *fa_cpu_scratch_make(void (*layout)(fa_cpu_scratch *s, void *scratch), void *scratch)
{
    fa_cpu_scratch s = {NULL, 0};
    layout(&s, scratch);
    s.base = fa_host_scratch_alloc(s.used);
    if (!s.base) return NULL;
    s.used = 0;
    layout(&s, scratch);
    return s.base;
}

/* The scratch of `threads` threads in one allocation (made outside the parallel region): the
 * layout measured once, each share rounded up to 64 bytes. Returns the block (to fa_host_scratch_free)
 * and sets *share, or NULL when the allocation fails or its size overflows. */
static inline void *fa_cpu_scratch_make_team(void (*layout)(fa_cpu_scratch *s, void *scratch), void *scratch,
                                             int threads, size_t *share)
{
    fa_cpu_scratch s = {NULL, 0};
    layout(&s, scratch);
    *share = (s.used + 63) / 64 * 64;
    if (threads <= 0 || *share > (size_t)-1 / (size_t)threads) return NULL;
    return fa_host_scratch_alloc(*share * (size_t)threads);
}

/* Thread t's share of a team block: runs layout(s, scratch) on it. */
static inline void fa_cpu_scratch_take(void (*layout)(fa_cpu_scratch *s, void *scratch), void *scratch, void *team,
                                       size_t share, int t)
{
    fa_cpu_scratch s = {(char *)team + share * (size_t)t, 0};
    layout(&s, scratch);
}

/* Called by every thread of a parallel region once it has allocated (allocated: 1 when all its
 * memory is there): records a failure in *failed, waits for the team, and returns 1 when every
 * thread has its memory. The answer is the same in every thread, so the worksharing loops that
 * follow stay legal. */
static inline int fa_cpu_team_ready(int allocated, int *failed)
{
    if (!allocated) {
#pragma omp atomic write
        *failed = 1;
    }
#pragma omp barrier
    int any_failed;
#pragma omp atomic read
    any_failed = *failed;
    return !any_failed;
}
#endif

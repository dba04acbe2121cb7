/* State and entry points of the CPU backend. */
#ifndef FA_CPU_BACKEND_H
#define FA_CPU_BACKEND_H
#include "../common/backend.h"
#include "cpu_caches.h"
#include "kernels/kernels.h"

typedef struct fa_cpu_state {
    int num_threads; /* 0 = OpenMP default */
    const fa_cpu_kernels *kernels;
    fa_cpu_caches caches;
    char info[256];
} fa_cpu_state;

/* Br, Bc for this head_dim: the paper's formula with M = the L2 size in f32 elements (tiles are
 * held in f32 whatever the input dtype), snapped to the kernels' register tile. */
void fa_cpu_tiles(const fa_cpu_state *s, int64_t head_dim, int64_t *block_rows, int64_t *block_cols,
                  int64_t *sram_elements);

fa_status fa_cpu_forward(void *state, const fa_problem *p);
fa_status fa_cpu_backward(void *state, const fa_problem *p);
#endif

/* The CPU backend's interface table: host memory, OpenMP threads, cache-sized tiles. */
#include "cpu_backend.h"

#include <stdio.h>
#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "../common/registry.h"
#include "../common/tiling.h"
#include "cpu_modifiers.h"
#include "cpu_tile.h"

static int cpu_device_count(void) { return 1; }

static fa_status cpu_open(int device, void **state)
{
    (void)device;
    const fa_cpu_kernels *kernels = NULL;
    const fa_status selected = fa_cpu_select_kernels(&kernels);
    if (selected != FA_SUCCESS) return selected; /* reason recorded by the selector */
    fa_cpu_state *s = fa_host_calloc(1, sizeof *s);
    if (!s) return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "ctx: cannot allocate the CPU backend state");
    s->kernels = kernels;
    s->caches = fa_cpu_detect_caches();
    *state = s;
    return FA_SUCCESS;
}

static void cpu_close(void *state) { fa_host_free(state); }

static fa_status cpu_set_num_threads(void *state, int n)
{
    ((fa_cpu_state *)state)->num_threads = n;
    return FA_SUCCESS;
}

static fa_status cpu_set_stream(void *state, void *stream)
{
    (void)state;
    if (stream) return fa_set_error(FA_ERROR_NOT_SUPPORTED, "stream: the CPU backend has no streams (pass NULL)");
    return FA_SUCCESS;
}

static fa_status cpu_synchronize(void *state)
{
    (void)state; /* CPU calls complete before they return */
    return FA_SUCCESS;
}

static fa_status cpu_mem_alloc(void *state, size_t bytes, void **ptr)
{
    (void)state;
    *ptr = fa_host_alloc(bytes);
    if (!*ptr) return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "bytes: cannot allocate %zu bytes", bytes);
    return FA_SUCCESS;
}

static fa_status cpu_mem_free(void *state, void *ptr)
{
    (void)state;
    fa_host_free(ptr);
    return FA_SUCCESS;
}

static fa_status cpu_copy(void *state, void *dst, const void *src, size_t bytes)
{
    (void)state;
    memmove(dst, src, bytes);
    return FA_SUCCESS;
}

static int64_t debug_tile_bytes; /* 0: the caches decide */

int64_t fa_cpu_debug_tile_bytes(int64_t bytes)
{
    const int64_t previous = debug_tile_bytes;
    debug_tile_bytes = bytes > 0 ? bytes : 0;
    return previous;
}

void fa_cpu_tiles(const fa_cpu_state *s, int64_t head_dim, int64_t *block_rows, int64_t *block_cols,
                  int64_t *sram_elements)
{
    /* M = the L2 a core has, up to 1 MiB: measured best at 1 MiB on a Zen 4 (L2 1 MiB; half of it
     * was slower) and on an Emerald Rapids (L2 2 MiB: its whole L2 was 2-10% slower than half of
     * it, forward and backward, d = 64 and 128; the backward's tiles then outgrew the L2). */
    const int64_t budget = debug_tile_bytes                                ? debug_tile_bytes
                           : s->caches.l2_bytes < FA_CPU_TILE_BYTES_MAX ? s->caches.l2_bytes
                                                                        : FA_CPU_TILE_BYTES_MAX;
    const int64_t m = budget / (int64_t)sizeof(float);
    fa_fit_tiles(m, head_dim, s->kernels->tile_step, s->kernels->tile_step, block_rows, block_cols);
    if (sram_elements) *sram_elements = m;
}

void fa_cpu_problem_tiles(const fa_cpu_state *s, const fa_problem *p, int64_t *block_rows, int64_t *block_cols)
{
    fa_cpu_tiles(s, p->shape.head_dim, block_rows, block_cols, NULL);
    const int64_t step = s->kernels->tile_step;
    /* A key tile need not be wider than all the keys (rounded up to the kernels' step): short
     * sequences then allocate and clear a small score tile rather than one cut for the L2. One
     * tile covered every key before and does after, so results do not change. */
    const int64_t keys = (p->shape.seqlen_k + step - 1) / step * step;
    if (*block_cols > keys) *block_cols = keys;
    /* Block-sparse: tiles of exactly one mask block (when the mask's blocks are a multiple of the
     * kernels' step), so a zero block is a skipped tile (Algorithm 5), not a masked part of a
     * wider tile; key tiles then start on mask-block boundaries (fa_cpu_first_key). */
    const fa_block_mask *bm = fa_mask_blocks(&p->mask);
    if (!bm) return;
    if (bm->block_q < *block_rows && bm->block_q % step == 0) *block_rows = bm->block_q;
    if (bm->block_k < *block_cols && bm->block_k % step == 0) *block_cols = bm->block_k;
}

static fa_status cpu_tiling(void *state, int64_t head_dim, fa_dtype dtype, fa_tiling *tiling, int64_t *sram)
{
    (void)dtype; /* tiles are f32 whatever the input dtype */
    fa_cpu_tiles(state, head_dim, &tiling->block_rows, &tiling->block_cols, sram);
    return FA_SUCCESS;
}

static const char *cpu_info(void *state)
{
    fa_cpu_state *s = state;
    const fa_cpu_kernels *all = fa_cpu_kernels_by_name(s->kernels->isa); /* with every kernel the CPU can run */
    snprintf(s->info, sizeof s->info, "cpu: isa %s%s, %d thread(s), L1d %lld KiB, L2 %lld KiB%s", s->kernels->isa,
             s->kernels->gemm_max_bf16 ? ", bf16 scores by vdpbf16ps"
             : all && all->gemm_max_bf16 ? ", bf16 scores on widened f32 tiles (not vdpbf16ps: see FLASHATTN_CPU_BF16_DOT)"
                                         : "",
             fa_cpu_thread_count(s->num_threads), (long long)(s->caches.l1d_bytes / 1024),
             (long long)(s->caches.l2_bytes / 1024), s->caches.detected ? "" : " (cache sizes not detected, defaults)");
    return s->info;
}

/* The entry points: each picks its algorithm once. */
static fa_status cpu_forward(void *state, const fa_problem *p)
{
    return p->varlen.batch ? fa_cpu_varlen_run(state, p, 0) : fa_cpu_forward_dense(state, p);
}

static fa_status cpu_backward(void *state, const fa_problem *p)
{
    if (p->outputs.dsinks) { /* over the whole problem, packed or not, before its sequences run */
        fa_status st = fa_cpu_sink_gradients(p);
        if (st) return st;
    }
    return p->varlen.batch ? fa_cpu_varlen_run(state, p, 1) : fa_cpu_backward_dense(state, p);
}

static fa_status cpu_kvcache_append(void *state, const fa_kv_problem *kp)
{
    (void)state;
    return fa_cpu_kvcache_append(kp);
}

static fa_status cpu_forward_kvcache(void *state, const fa_kv_problem *kp)
{
    return fa_modifiers_any(&kp->attn.modifiers) ? fa_cpu_decode_modified(state, kp) : fa_cpu_decode(state, kp);
}

/* The CPU backend runs every problem the core validates. */
static fa_status cpu_supports(void *state, fa_op op, const fa_problem *p)
{
    (void)state;
    return fa_require_needs(fa_set_error, "cpu", FA_NEED_ALL, op, p);
}

static const fa_backend_iface cpu_iface = {
    .abi_version = FA_BACKEND_ABI_VERSION,
    .kind = FA_BACKEND_CPU,
    .name = "cpu",
    .device_count = cpu_device_count,
    .open = cpu_open,
    .close = cpu_close,
    .set_num_threads = cpu_set_num_threads,
    .set_stream = cpu_set_stream,
    .synchronize = cpu_synchronize,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .tiling = cpu_tiling,
    .info = cpu_info,
    .forward = cpu_forward,
    .backward = cpu_backward,
    .features = FA_BACKEND_HOST_MEMORY,
    .forward_kvcache = cpu_forward_kvcache,
    .kvcache_append = cpu_kvcache_append,
    .supports = cpu_supports,
};

const fa_backend_iface *fa_cpu_backend_iface(void) { return &cpu_iface; }

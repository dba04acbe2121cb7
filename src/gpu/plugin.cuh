/* The GPU backend plugin (libflashattn-cuda.so, and libflashattn-hip.so from the same source):
 * the fa_backend_iface of src/common/backend.h over the CUDA or HIP runtime (gpu_runtime.h).
 * One translation unit on purpose: one compiler invocation per plugin keeps the build short and
 * its dependency file simple. Errors go through the host's set_error; the core is never linked. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The runtime first: the shared host/device headers (hostdev.h) need its __host__ __device__. */
#include "gpu_runtime.h"
#include "../common/backend.h"
#include "kernels/generic_dispatch.cuh"
#include "kernels/merge.cuh"
#include "kernels/tc_dispatch.cuh"
#include "plan.h"
#include "problem_params.h"
#include "tc_plan.h"

#if defined(__HIPCC__)
#  define FA_PLUGIN_KIND FA_BACKEND_HIP
#else
#  define FA_PLUGIN_KIND FA_BACKEND_CUDA
#endif

static const fa_host_api *g_host;

#define FA_MAX_DEVICES 64

/* Runtime ordinals of the devices this build's code objects can run on. */
static int g_devices[FA_MAX_DEVICES];

typedef struct fa_gpu_state {
    int ordinal; /* runtime device ordinal */
    fa_gpu_stream stream;
    fa_gpu_props props;
    int64_t smem_bytes; /* shared memory per block the kernels may use (opt-in maximum) */
    fa_gpu_family family; /* kernels for f16/bf16, from FLASHATTN_GPU_KERNELS at open */
    bool matrix_cores;    /* HIP: the device has MFMA (gfx908, gfx90a) */
    bool sync_launches;   /* FLASHATTN_GPU_SYNC=1: wait after every launch, name the kernel that failed */
    char info[512];
    /* Workspace reused across calls (grows only): delta of the backward, the KV cache's partials,
     * and device copies of the host-side masks (seqlens_k, block mask). Stream-ordered: set_stream
     * drains it first. The caller's (fa_context_set_workspace) never grows: a call that needs more
     * fails, so that a call of a captured graph never allocates or synchronises. */
    void *workspace;
    size_t workspace_bytes;
    bool caller_workspace;
    /* Device record of a failed check of device-memory tables (varlen offsets, KV-cache lengths
     * and pages), reported and cleared by the next synchronize. */
    fa_table_fault *status;
} fa_gpu_state;

#define FA_ERR(status, ...) g_host->set_error((status), __VA_ARGS__)

static fa_status runtime_failure(fa_gpu_error e, const char *what)
{
    return FA_ERR(e == FA_GPU(ErrorMemoryAllocation) ? FA_ERROR_OUT_OF_MEMORY : FA_ERROR_BACKEND_FAILURE,
                  "%s: %s failed: %s (%s)", FA_GPU_VENDOR, what, fa_gpu_get_error_name(e), fa_gpu_get_error_string(e));
}

#define FA_TRY(call, what)                                                                   \
    do {                                                                                     \
        const fa_gpu_error fa_try_e = (call);                                               \
        if (fa_try_e != fa_gpu_success) return runtime_failure(fa_try_e, what);            \
    } while (0)

/* Whether this plugin carries code for the device. CUDA: SASS for sm_80 and sm_90 plus PTX,
 * which covers compute capability 8.0 and newer. HIP: exactly the gfx targets it was built for. */
static int device_supported(const fa_gpu_props *props, char *why, size_t why_size)
{
#if defined(__HIPCC__)
    static const char *const targets[] = {FA_HIP_TARGETS};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; ++i) {
        const size_t n = strlen(targets[i]);
        if (strncmp(props->gcnArchName, targets[i], n) == 0 && (props->gcnArchName[n] == '\0' || props->gcnArchName[n] == ':'))
            return 1;
    }
    snprintf(why, why_size, "%s (%s) is not one of the targets this plugin was built for", props->name, props->gcnArchName);
    return 0;
#else
    if (props->major >= 8) return 1;
    snprintf(why, why_size, "%s has compute capability %d.%d; this plugin needs 8.0 or newer", props->name,
             props->major, props->minor);
    return 0;
#endif
}

static int gpu_device_count(void)
{
    int count = 0;
    const fa_gpu_error e = fa_gpu_get_device_count(&count);
    if (e != fa_gpu_success) {
#if defined(__HIPCC__)
        FA_ERR(FA_ERROR_BACKEND_UNAVAILABLE, "no usable AMD GPU: hipGetDeviceCount returned %s (%s); the HIP backend needs the amdgpu kernel driver (/dev/kfd) and a gfx908, gfx90a or gfx1030 GPU",
               fa_gpu_get_error_name(e), fa_gpu_get_error_string(e));
#else
        FA_ERR(FA_ERROR_BACKEND_UNAVAILABLE, "no usable NVIDIA GPU: cudaGetDeviceCount returned %s (%s); the CUDA backend needs the NVIDIA driver (libcuda.so.1) and a GPU of compute capability 8.0 or newer",
               fa_gpu_get_error_name(e), fa_gpu_get_error_string(e));
#endif
        return 0;
    }
    int usable = 0;
    char why[256] = "";
    for (int i = 0; i < count && usable < FA_MAX_DEVICES; ++i) {
        fa_gpu_props props;
        if (fa_gpu_get_device_properties(&props, i) != fa_gpu_success) continue;
        if (device_supported(&props, why, sizeof why)) g_devices[usable++] = i;
    }
    if (usable == 0) {
        if (count == 0) FA_ERR(FA_ERROR_BACKEND_UNAVAILABLE, "the %s runtime reports no device", FA_GPU_VENDOR);
        else FA_ERR(FA_ERROR_BACKEND_UNAVAILABLE, "%d device(s) found, none usable: %s", count, why);
    }
    return usable;
}

/* The tile layer the context's family runs, for the info string. */
static const char *tc_layer_name(const fa_gpu_state *s)
{
    if (s->family == FA_GPU_FAMILY_FMA) return "plain-FMA tile layer";
#if defined(__HIPCC__)
    return s->matrix_cores ? "MFMA for f16, plain-FMA tile layer for bf16, never run on AMD hardware"
                           : "plain-FMA tile layer: no MFMA on this GPU; never run on AMD hardware";
#else
    return "mma.sync";
#endif
}

static fa_status gpu_open(int device, void **state)
{
    if (device < 0 || device >= FA_MAX_DEVICES) return FA_ERR(FA_ERROR_INVALID_VALUE, "device: %d out of range", device);
    fa_gpu_state *s = (fa_gpu_state *)calloc(1, sizeof *s);
    if (!s) return FA_ERR(FA_ERROR_OUT_OF_MEMORY, "ctx: cannot allocate the %s backend state", FA_GPU_VENDOR);
    s->ordinal = g_devices[device];
    const char *requested = getenv("FLASHATTN_GPU_KERNELS");
#if defined(__HIPCC__)
    s->family = fa_gpu_parse_family(requested, FA_GPU_DEFAULT_FAMILY_HIP);
#else
    s->family = fa_gpu_parse_family(requested, FA_GPU_DEFAULT_FAMILY_CUDA);
#endif
    const int forced = requested && *requested;
    const char *sync = getenv("FLASHATTN_GPU_SYNC");
    s->sync_launches = sync && strcmp(sync, "1") == 0;
    if (s->family == FA_GPU_FAMILY_INVALID) {
        free(s);
        return FA_ERR(FA_ERROR_INVALID_VALUE, "FLASHATTN_GPU_KERNELS: \"%s\" is not one of generic, tc, fma, tc-wide", requested);
    }
#if defined(__HIPCC__)
    if (s->family == FA_GPU_FAMILY_TC_WIDE) {
        free(s);
        return FA_ERR(FA_ERROR_NOT_SUPPORTED, "FLASHATTN_GPU_KERNELS: \"tc-wide\" runs NVIDIA's mma.sync only; the hip backend offers generic, tc, fma");
    }
#endif
    fa_gpu_error e = fa_gpu_set_device(s->ordinal);
    if (e == fa_gpu_success) e = fa_gpu_get_device_properties(&s->props, s->ordinal);
    int smem = 0;
    if (e == fa_gpu_success) e = fa_gpu_device_get_attribute(&smem, FA_GPU_ATTR_SMEM_OPTIN, s->ordinal);
    if (e == fa_gpu_success) e = fa_gpu_malloc((void **)&s->status, sizeof *s->status);
    if (e == fa_gpu_success) e = fa_gpu_memset_async(s->status, 0, sizeof *s->status, s->stream);
    if (e == fa_gpu_success) e = fa_gpu_stream_synchronize(s->stream);
    if (e != fa_gpu_success) {
        if (s->status) (void)fa_gpu_free(s->status);
        free(s);
        return runtime_failure(e, "device query");
    }
    s->smem_bytes = smem;
#if defined(__HIPCC__)
    s->matrix_cores = strncmp(s->props.gcnArchName, "gfx908", 6) == 0 || strncmp(s->props.gcnArchName, "gfx90a", 6) == 0;
#endif
    char kernels[240];
    char chosen[64];
    snprintf(chosen, sizeof chosen, forced ? "FLASHATTN_GPU_KERNELS=%s" : "%s", fa_gpu_family_name(s->family));
    if (s->family == FA_GPU_FAMILY_GENERIC) snprintf(kernels, sizeof kernels, "%s", chosen);
    else if (s->family == FA_GPU_FAMILY_TC_WIDE)
        snprintf(kernels, sizeof kernels,
                 "%s for f16/bf16: wide-tile forward and backward d <= %d of plain problems (%s), tc otherwise, generic beyond",
                 chosen, FA_TC_WIDE_MAX_WIDTH, tc_layer_name(s));
    else snprintf(kernels, sizeof kernels, "%s for f16/bf16, forward d <= 256, backward d <= 128 (%s), generic otherwise",
                  chosen, tc_layer_name(s));
    int driver = 0, runtime = 0;
    (void)fa_gpu_driver_get_version(&driver); /* left 0 when unknown */
    (void)fa_gpu_runtime_get_version(&runtime);
#if defined(__HIPCC__)
    snprintf(s->info, sizeof s->info,
             "hip: %s (%s), %d CUs, wavefront %d, %.1f GiB, LDS %lld KiB/block, HIP runtime %d, driver %d, kernels: %s",
             s->props.name, s->props.gcnArchName, s->props.multiProcessorCount, s->props.warpSize,
             (double)s->props.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), (long long)(s->smem_bytes / 1024), runtime, driver, kernels);
#else
    snprintf(s->info, sizeof s->info,
             "cuda: %s (sm_%d%d), %d SMs, %.1f GiB, shared memory %lld KiB/block (opt-in), CUDA runtime %d.%d, driver %d.%d, kernels: %s",
             s->props.name, s->props.major, s->props.minor, s->props.multiProcessorCount,
             (double)s->props.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), (long long)(s->smem_bytes / 1024),
             runtime / 1000, runtime % 1000 / 10, driver / 1000, driver % 1000 / 10, kernels);
#endif
    *state = s;
    return FA_SUCCESS;
}

static void gpu_close(void *state)
{
    fa_gpu_state *s = (fa_gpu_state *)state;
    if (!s) return;
    /* Teardown cannot report failures; a failed step leaves nothing more to undo. */
    (void)fa_gpu_set_device(s->ordinal);
    (void)fa_gpu_stream_synchronize(s->stream);
    if (s->workspace && !s->caller_workspace) (void)fa_gpu_free(s->workspace);
    (void)fa_gpu_free(s->status);
    free(s);
}

static fa_status gpu_set_num_threads(void *state, int n)
{
    (void)state;
    (void)n; /* the GPU backends size their launches from the problem; nothing to set */
    return FA_SUCCESS;
}

/* The caller's workspace replaces the plugin's (freed once the stream is done with it). */
static fa_status gpu_set_workspace(void *state, void *ptr, size_t bytes)
{
    fa_gpu_state *s = (fa_gpu_state *)state;
    FA_TRY(fa_gpu_set_device(s->ordinal), "set device");
    FA_TRY(fa_gpu_stream_synchronize(s->stream), "synchronize before changing the workspace");
    if (s->workspace && !s->caller_workspace) (void)fa_gpu_free(s->workspace);
    s->workspace = ptr;
    s->workspace_bytes = ptr ? bytes : 0;
    s->caller_workspace = ptr != NULL;
    return FA_SUCCESS;
}

static fa_status gpu_set_stream(void *state, void *stream)
{
    fa_gpu_state *s = (fa_gpu_state *)state;
    FA_TRY(fa_gpu_set_device(s->ordinal), "set device");
    /* Work queued on the old stream may still read the workspace the next call rewrites. */
    FA_TRY(fa_gpu_stream_synchronize(s->stream), "synchronize the previous stream");
    s->stream = (fa_gpu_stream)stream;
    return FA_SUCCESS;
}

/* The message of a failed device-side check: the core's words (table_checks.h), and where it ran. */
static fa_status status_error(const fa_table_fault *fault)
{
    char message[256];
    fa_table_fault_message(fault, message, sizeof message);
    return FA_ERR(FA_ERROR_INVALID_VALUE, "%s (checked on the device: that call wrote nothing)", message);
}

static fa_status gpu_synchronize(void *state)
{
    fa_gpu_state *s = (fa_gpu_state *)state;
    FA_TRY(fa_gpu_set_device(s->ordinal), "set device");
    FA_TRY(fa_gpu_stream_synchronize(s->stream), "stream synchronize");
    fa_table_fault st;
    FA_TRY(fa_gpu_memcpy_async(&st, s->status, sizeof st, fa_gpu_memcpy_d2h, s->stream), "read the device status");
    FA_TRY(fa_gpu_stream_synchronize(s->stream), "read the device status");
    if (st.code == FA_TABLE_OK) return FA_SUCCESS;
    FA_TRY(fa_gpu_memset_async(s->status, 0, sizeof st, s->stream), "clear the device status");
    FA_TRY(fa_gpu_stream_synchronize(s->stream), "clear the device status");
    return status_error(&st);
}

static fa_status gpu_mem_alloc(void *state, size_t bytes, void **ptr)
{
    fa_gpu_state *s = (fa_gpu_state *)state;
    FA_TRY(fa_gpu_set_device(s->ordinal), "set device");
    const fa_gpu_error e = fa_gpu_malloc(ptr, bytes);
    if (e != fa_gpu_success) {
        (void)fa_gpu_get_last_error(); /* clear the (non-sticky) error state */
        *ptr = NULL;
        return FA_ERR(FA_ERROR_OUT_OF_MEMORY, "bytes: cannot allocate %zu bytes of device memory: %s", bytes,
                      fa_gpu_get_error_string(e));
    }
    return FA_SUCCESS;
}

static fa_status gpu_mem_free(void *state, void *ptr)
{
    fa_gpu_state *s = (fa_gpu_state *)state;
    FA_TRY(fa_gpu_set_device(s->ordinal), "set device");
    FA_TRY(fa_gpu_free(ptr), "free");
    return FA_SUCCESS;
}

/* Copies are ordered on the context's stream and complete before returning (the caller may reuse
 * or read its host buffer at once). */
static fa_status gpu_copy(fa_gpu_state *s, void *dst, const void *src, size_t bytes, FA_GPU(MemcpyKind) kind)
{
    FA_TRY(fa_gpu_set_device(s->ordinal), "set device");
    FA_TRY(fa_gpu_memcpy_async(dst, src, bytes, kind, s->stream), "memcpy");
    FA_TRY(fa_gpu_stream_synchronize(s->stream), "memcpy synchronize");
    return FA_SUCCESS;
}

static fa_status gpu_copy_h2d(void *state, void *dst, const void *src, size_t bytes)
{
    return gpu_copy((fa_gpu_state *)state, dst, src, bytes, fa_gpu_memcpy_h2d);
}

static fa_status gpu_copy_d2h(void *state, void *dst, const void *src, size_t bytes)
{
    return gpu_copy((fa_gpu_state *)state, dst, src, bytes, fa_gpu_memcpy_d2h);
}

/* The tile-MMA kernels a problem of (dtype, head_dim) runs on this context (NULL entries: the
 * generic kernels); *width receives the padded head dim. */
static fa_tc_set tc_kernels(const fa_gpu_state *s, fa_dtype dtype, int64_t head_dim, int *width)
{
    fa_tc_set none = {NULL, NULL, NULL, NULL, NULL};
    *width = fa_tc_padded_dim(head_dim);
    if (s->family == FA_GPU_FAMILY_GENERIC || *width == 0) return none;
    fa_tc_set set = fa_tc_kernels(s->family, dtype, *width, s->matrix_cores);
    if (fa_tc_smem_bytes(*width) > s->smem_bytes) set.forward = NULL;
    if (!set.backward_dq || fa_tc_backward_smem_bytes(*width) > s->smem_bytes) set.backward_dkdv = set.backward_dq = NULL;
    if (!set.forward_plain || fa_tc_wide_smem_bytes(*width) > s->smem_bytes) set.forward_plain = NULL;
    if (!set.backward_plain || fa_tc_wide_backward_smem_bytes(*width) > s->smem_bytes) set.backward_plain = NULL;
    return set;
}

static fa_status gpu_tiling(void *state, int64_t head_dim, fa_dtype dtype, fa_tiling *tiling, int64_t *sram)
{
    const fa_gpu_state *s = (const fa_gpu_state *)state;
    int width;
    if (tc_kernels(s, dtype, head_dim, &width).forward) {
        tiling->block_rows = FA_TC_BLOCK_ROWS;
        tiling->block_cols = fa_tc_block_cols(width);
        *sram = s->smem_bytes / (int64_t)sizeof(float);
        return FA_SUCCESS;
    }
    const int tile = fa_gpu_generic_tile(FA_GPU_PASS_FORWARD, s->smem_bytes, head_dim);
    if (tile == 0)
        return FA_ERR(FA_ERROR_NOT_SUPPORTED, "head_dim: %lld is not supported by the %s backend (1..%d)",
                      (long long)head_dim, FA_GPU_VENDOR, FA_GPU_MAX_HEAD_DIM);
    tiling->block_rows = tile;
    tiling->block_cols = tile;
    *sram = s->smem_bytes / (int64_t)sizeof(float);
    return FA_SUCCESS;
}

static const char *gpu_info(void *state) { return ((const fa_gpu_state *)state)->info; }

static size_t align_up(size_t n) { return (n + 255) & ~(size_t)255; }

/* Makes the workspace at least `bytes` large. */
static fa_status workspace_reserve(fa_gpu_state *s, size_t bytes)
{
    if (bytes <= s->workspace_bytes) return FA_SUCCESS;
    if (s->caller_workspace)
        return FA_ERR(FA_ERROR_INVALID_VALUE, "workspace: this call needs %zu bytes, the context's workspace "
                      "(fa_context_set_workspace) has %zu", bytes, s->workspace_bytes);
    FA_TRY(fa_gpu_stream_synchronize(s->stream), "synchronize before growing the workspace");
    if (s->workspace) (void)fa_gpu_free(s->workspace);
    s->workspace = NULL;
    s->workspace_bytes = 0;
    const fa_gpu_error e = fa_gpu_malloc(&s->workspace, bytes);
    if (e != fa_gpu_success) {
        (void)fa_gpu_get_last_error();
        s->workspace = NULL;
        return FA_ERR(FA_ERROR_OUT_OF_MEMORY, "workspace: cannot allocate %zu bytes of device memory", bytes);
    }
    s->workspace_bytes = bytes;
    return FA_SUCCESS;
}

/* Kernel parameters for p, with the host-side masks uploaded into the workspace (after `reserved`
 * bytes the caller keeps for itself). */
static fa_status build_params(fa_gpu_state *s, const fa_problem *p, size_t reserved, fa_gpu_params *k)
{
    fa_gpu_params_of(p, k);
    k->status = s->status;

    const size_t seqlens_bytes = p->mask.seqlens_k ? align_up((size_t)p->shape.batch * sizeof(int32_t)) : 0;
    const fa_block_mask *bm = fa_mask_blocks(&p->mask);
    const size_t mask_bytes = bm ? align_up((size_t)(bm->rows * bm->cols)) : 0;
    fa_status st = workspace_reserve(s, align_up(reserved) + seqlens_bytes + mask_bytes + 256);
    if (st != FA_SUCCESS) return st;
    char *cursor = (char *)s->workspace + align_up(reserved);
    if (p->mask.seqlens_k) {
        FA_TRY(fa_gpu_memcpy_async(cursor, p->mask.seqlens_k, (size_t)p->shape.batch * sizeof(int32_t), fa_gpu_memcpy_h2d, s->stream),
               "upload seqlens_k");
        k->mask.seqlens_k = (const int32_t *)cursor;
        cursor += seqlens_bytes;
    }
    if (bm) {
        FA_TRY(fa_gpu_memcpy_async(cursor, bm->mask, (size_t)(bm->rows * bm->cols), fa_gpu_memcpy_h2d, s->stream),
               "upload block mask");
        k->mask.block_mask.mask = (const uint8_t *)cursor;
        k->mask.block_mask.block_q = bm->block_q;
        k->mask.block_mask.block_k = bm->block_k;
        k->mask.block_mask.cols = bm->cols;
    }
    return FA_SUCCESS;
}

/* Launches kernel on the context's stream: `warps` warps per block, `smem` bytes of dynamic
 * shared memory. With FLASHATTN_GPU_SYNC=1 it waits for the kernel, so that a fault is reported
 * by the launch that caused it (`what` names the kernel) rather than by a later call. */
template <class Params>
static fa_status launch_warps(fa_gpu_state *s, void (*kernel)(Params), dim3 grid, int warps, size_t smem,
                              const Params *k, const char *what)
{
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) return FA_SUCCESS;
    if (smem > 48 * 1024)
        FA_TRY(fa_gpu_func_set_attribute((const void *)kernel, FA_GPU_FUNC_ATTR_MAX_DYNAMIC_SMEM, (int)smem),
               "raise the shared-memory limit");
    const dim3 block((unsigned)(warps * s->props.warpSize));
    FA_TRY(fa_gpu_launch(kernel, grid, block, smem, s->stream, *k), what);
    if (s->sync_launches) {
        const fa_gpu_error e = fa_gpu_stream_synchronize(s->stream);
        if (e != fa_gpu_success)
            return FA_ERR(FA_ERROR_BACKEND_FAILURE, "%s: %s faulted (grid %u x %u x %u, %u threads, %zu bytes of shared memory): %s (%s)",
                          FA_GPU_VENDOR, what, grid.x, grid.y, grid.z, block.x, smem, fa_gpu_get_error_name(e),
                          fa_gpu_get_error_string(e));
    }
    return FA_SUCCESS;
}

/* A launch of the generic kernels. */
static fa_status launch(fa_gpu_state *s, fa_gpu_kernel kernel, dim3 grid, size_t smem, const fa_gpu_params *k,
                        const char *what)
{
    return launch_warps(s, kernel, grid, FA_GENERIC_WARPS, smem, k, what);
}

/* The tile and kernels of a pass, or NOT_SUPPORTED. */
static fa_status pick_kernels(const fa_gpu_state *s, fa_gpu_pass pass, int64_t head_dim, int *tile,
                              fa_generic_set *set)
{
    *tile = fa_gpu_generic_tile(pass, s->smem_bytes, head_dim);
    *set = fa_generic_kernels(fa_gpu_head_bucket(head_dim), *tile);
    if (!set->forward)
        return FA_ERR(FA_ERROR_NOT_SUPPORTED, "head_dim: %lld does not fit the %lld bytes of shared memory of this device",
                      (long long)head_dim, (long long)s->smem_bytes);
    return FA_SUCCESS;
}

static int tensor_chunk_aligned(const fa_tensor *t)
{
    return fa_tc_chunk_aligned(t->data, t->head_dim, t->stride_batch, t->stride_seq, t->stride_head);
}

/* Whether the tile kernels may copy Q, K, V (and dO in the backward) in 16-byte chunks. */
static int problem_chunk_aligned(const fa_problem *p, int backward)
{
    return tensor_chunk_aligned(&p->q) && tensor_chunk_aligned(&p->k) && tensor_chunk_aligned(&p->v) &&
           (!backward || tensor_chunk_aligned(&p->dout));
}

/* Rows the query and key grids cover, and their z extent: a packed batch runs one z slice per
 * sequence over the longest one's tiles (blocks past a shorter sequence return at once). */
static int64_t query_rows(const fa_problem *p) { return p->varlen.batch ? p->varlen.max_seqlen_q : p->shape.seqlen_q; }
static int64_t key_rows(const fa_problem *p) { return p->varlen.batch ? p->varlen.max_seqlen_k : p->shape.seqlen_k; }
static unsigned grid_batch(const fa_problem *p) { return (unsigned)(p->varlen.batch ? p->varlen.batch : p->shape.batch); }

/* What lives in device memory (a packed batch's offsets, ALiBi slopes, sinks) is checked on the
 * device before the kernels, which then write nothing if it is wrong (the next synchronize says
 * why): the core's host-side rules without a host synchronisation. */
static fa_status device_checks(fa_gpu_state *s, const fa_problem *p, const fa_gpu_params *k)
{
    fa_status st = FA_SUCCESS;
    if (p->varlen.batch) st = launch(s, fa_decode::check_varlen, dim3(1), 0, k, "varlen offsets check launch");
    if (st == FA_SUCCESS && (p->modifiers.alibi_slopes || p->modifiers.sinks))
        st = launch(s, fa_decode::check_modifier_values, dim3(1), 0, k, "ALiBi slopes and sinks check launch");
    return st;
}

/* The tile-MMA forward of p (the caller checked that the context has the kernel). */
static fa_status tc_forward(fa_gpu_state *s, const fa_problem *p, fa_gpu_kernel kernel, int width)
{
    fa_gpu_params k;
    fa_status st = build_params(s, p, 0, &k);
    if (st == FA_SUCCESS) st = device_checks(s, p, &k);
    if (st != FA_SUCCESS) return st;
    k.chunked_loads = problem_chunk_aligned(p, 0);
    const dim3 grid((unsigned)fa_gpu_tiles(query_rows(p), FA_TC_BLOCK_ROWS), (unsigned)p->shape.heads_q, grid_batch(p));
    return launch_warps(s, kernel, grid, FA_TC_WARPS, (size_t)fa_tc_smem_bytes(width), &k, "tile-MMA forward launch");
}

/* The wide-tile forward of a problem fa_tc_wide_takes (the caller checked). */
static fa_status tc_wide_forward(fa_gpu_state *s, const fa_problem *p, fa_gpu_kernel kernel, int width)
{
    fa_gpu_params k;
    fa_status st = build_params(s, p, 0, &k);
    if (st == FA_SUCCESS) st = device_checks(s, p, &k);
    if (st != FA_SUCCESS) return st;
    k.chunked_loads = 1;
    const dim3 grid((unsigned)fa_gpu_tiles(query_rows(p), FA_TC_WIDE_BLOCK_ROWS), (unsigned)p->shape.heads_q, grid_batch(p));
    return launch_warps(s, kernel, grid, FA_TC_WIDE_WARPS, (size_t)fa_tc_wide_smem_bytes(width), &k, "wide-tile forward launch");
}

/* Every feature; head_dim up to FA_GPU_MAX_HEAD_DIM, and batch and heads that fit a grid row. */
static fa_status gpu_supports(void *state, fa_op op, const fa_problem *p)
{
    (void)state;
    if (p->shape.head_dim > FA_GPU_MAX_HEAD_DIM)
        return FA_ERR(FA_ERROR_NOT_SUPPORTED, "head_dim: %lld exceeds the %s backend's maximum %d",
                      (long long)p->shape.head_dim, FA_GPU_VENDOR, FA_GPU_MAX_HEAD_DIM);
    if (p->shape.heads_q > 65535 || p->shape.heads_kv > 65535 || p->shape.batch > 65535 || p->varlen.batch > 65535)
        return FA_ERR(FA_ERROR_NOT_SUPPORTED, "batch/heads: the %s backend launches one grid row per head and batch (at most 65535 each)",
                      FA_GPU_VENDOR);
    return fa_require_needs(g_host->set_error, FA_GPU_VENDOR, FA_NEED_ALL, op, p);
}

static fa_status gpu_forward(void *state, const fa_problem *p)
{
    fa_gpu_state *s = (fa_gpu_state *)state;
    FA_TRY(fa_gpu_set_device(s->ordinal), "set device");
    int width;
    const fa_tc_set tc = tc_kernels(s, p->shape.dtype, p->shape.head_dim, &width);
    if (tc.forward_plain && fa_tc_wide_takes(p, problem_chunk_aligned(p, 0) && tensor_chunk_aligned(&p->out)))
        return tc_wide_forward(s, p, tc.forward_plain, width);
    if (tc.forward) return tc_forward(s, p, tc.forward, width);
    int tile;
    fa_generic_set set;
    fa_status st = pick_kernels(s, FA_GPU_PASS_FORWARD, p->shape.head_dim, &tile, &set);
    fa_gpu_params k;
    if (st == FA_SUCCESS) st = build_params(s, p, 0, &k);
    if (st == FA_SUCCESS) st = device_checks(s, p, &k);
    if (st != FA_SUCCESS) return st;
    const dim3 grid((unsigned)fa_gpu_tiles(query_rows(p), tile), (unsigned)p->shape.heads_q, grid_batch(p));
    return launch(s, set.forward, grid, (size_t)fa_gpu_generic_smem_bytes(FA_GPU_PASS_FORWARD, tile, p->shape.head_dim), &k,
                  "forward launch");
}

/* dsinks and dbias (fa_backward_ex): passes of their own after the delta pre-pass, the same
 * whichever kernel family computed dQ, dK and dV. */
static fa_status modifier_gradients(fa_gpu_state *s, const fa_problem *p, const fa_gpu_params *k)
{
    fa_status st = FA_SUCCESS;
    if (p->outputs.dsinks)
        st = launch(s, fa_generic::sink_gradients, dim3((unsigned)p->shape.heads_q),
                    (size_t)FA_GENERIC_WARPS * (size_t)s->props.warpSize * sizeof(double), k, "dsinks launch");
    if (st != FA_SUCCESS || !p->outputs.dbias.data) return st;
    int tile;
    fa_generic_set set;
    st = pick_kernels(s, FA_GPU_PASS_BACKWARD, p->shape.head_dim, &tile, &set);
    if (st != FA_SUCCESS) return st;
    /* one block per distinct row tile of dbias: a single one along each axis it broadcasts */
    const fa_bias *db = &p->outputs.dbias;
    const dim3 grid((unsigned)(db->stride_q ? fa_gpu_tiles(k->grid_rows, tile) : 1),
                    (unsigned)(db->stride_head ? p->shape.heads_q : 1), db->stride_batch ? grid_batch(p) : 1u);
    return launch(s, set.backward_dbias, grid, (size_t)fa_gpu_generic_smem_bytes(FA_GPU_PASS_BACKWARD, tile, p->shape.head_dim),
                  k, "dbias launch");
}

static fa_status gpu_backward(void *state, const fa_problem *p)
{
    fa_gpu_state *s = (fa_gpu_state *)state;
    FA_TRY(fa_gpu_set_device(s->ordinal), "set device");
    int width, tile = 0;
    const fa_tc_set tc = tc_kernels(s, p->shape.dtype, p->shape.head_dim, &width);
    fa_generic_set set;
    fa_status st = FA_SUCCESS;
    if (!tc.backward_dq) st = pick_kernels(s, FA_GPU_PASS_BACKWARD, p->shape.head_dim, &tile, &set);
    const size_t delta_bytes = (size_t)(p->shape.batch * p->shape.heads_q * p->shape.seqlen_q) * sizeof(float);
    /* The wide-tile backward: dQ in f32 slices after delta (fa_tc_wide_backward_splits bounds them). */
    const bool wide = tc.backward_plain && fa_tc_wide_takes(p, problem_chunk_aligned(p, 1) && tensor_chunk_aligned(&p->out) &&
                                                                tensor_chunk_aligned(&p->dq) && tensor_chunk_aligned(&p->dk) &&
                                                                tensor_chunk_aligned(&p->dv));
    const int64_t slice_floats = (int64_t)(delta_bytes / sizeof(float)) * width;
    const int64_t splits =
        wide ? fa_tc_wide_backward_splits(s->props.multiProcessorCount, (int64_t)grid_batch(p) * p->shape.heads_kv,
                                          fa_gpu_tiles(key_rows(p), FA_TC_WIDE_BWD_KEYS), slice_floats * (int64_t)sizeof(float))
             : 0;
    const size_t accum_bytes = (size_t)(splits * slice_floats) * sizeof(float);
    fa_gpu_params k;
    if (st == FA_SUCCESS) st = build_params(s, p, align_up(delta_bytes) + accum_bytes, &k);
    if (st == FA_SUCCESS) st = device_checks(s, p, &k);
    if (st != FA_SUCCESS) return st;
    k.delta = (float *)s->workspace;
    k.chunked_loads = problem_chunk_aligned(p, 1);
    if (wide) {
        k.dq_accum = (float *)((char *)s->workspace + align_up(delta_bytes));
        k.dq_slice = slice_floats;
        k.dq_splits = (int)splits;
        k.dq_width = width;
        FA_TRY(fa_gpu_memset_async(k.dq_accum, 0, accum_bytes, s->stream), "clear the dQ slices");
    }
    const int64_t rows = p->shape.batch * p->shape.heads_q * p->shape.seqlen_q;
    const int64_t row_blocks = fa_gpu_tiles(rows, FA_GENERIC_WARPS);
    st = launch(s, fa_generic::row_delta, dim3((unsigned)(row_blocks < 65535 ? row_blocks : 65535)), 0, &k,
                "backward pre-pass launch");
    if (st != FA_SUCCESS) return st;
    if (wide) {
        st = launch_warps(s, tc.backward_plain, dim3((unsigned)splits, (unsigned)p->shape.heads_kv, grid_batch(p)),
                          FA_TC_WIDE_BWD_WARPS, (size_t)fa_tc_wide_backward_smem_bytes(width), &k, "wide-tile backward launch");
        if (st == FA_SUCCESS)
            st = launch(s, fa_dq_accum::convert,
                        dim3((unsigned)fa_gpu_tiles(query_rows(p), fa_dq_accum::kRows), (unsigned)p->shape.heads_q, grid_batch(p)),
                        0, &k, "wide-tile backward dQ sum launch");
        if (st == FA_SUCCESS) st = modifier_gradients(s, p, &k);
        return st;
    }
    const dim3 key_grid((unsigned)fa_gpu_tiles(key_rows(p), tc.backward_dq ? FA_TC_BLOCK_ROWS : tile), (unsigned)p->shape.heads_kv,
                        grid_batch(p));
    const dim3 query_grid((unsigned)fa_gpu_tiles(query_rows(p), tc.backward_dq ? FA_TC_BLOCK_ROWS : tile),
                          (unsigned)p->shape.heads_q, grid_batch(p));
    if (tc.backward_dq) {
        const size_t smem = (size_t)fa_tc_backward_smem_bytes(width);
        st = launch_warps(s, tc.backward_dkdv, key_grid, FA_TC_WARPS, smem, &k, "tile-MMA backward dK/dV launch");
        if (st == FA_SUCCESS)
            st = launch_warps(s, tc.backward_dq, query_grid, FA_TC_WARPS, smem, &k, "tile-MMA backward dQ launch");
    } else {
        const size_t smem = (size_t)fa_gpu_generic_smem_bytes(FA_GPU_PASS_BACKWARD, tile, p->shape.head_dim);
        st = launch(s, set.backward_dkdv, key_grid, smem, &k, "backward dK/dV launch");
        if (st == FA_SUCCESS) st = launch(s, set.backward_dq, query_grid, smem, &k, "backward dQ launch");
    }
    if (st == FA_SUCCESS) st = modifier_gradients(s, p, &k);
    return st;
}

/* How fa_forward_kvcache runs kp: the kernels and their row tile, the grid (the longest sequence's
 * row tiles x the most chunks any sequence of at most the capacity's keys has: the split rule,
 * kv_split.h; the lengths are device memory), and the workspace the partials need. */
typedef struct kvcache_plan {
    int tile;
    fa_generic_set set;
    int64_t sequences, most_new, rows, row_tiles, chunks;
    size_t partial_bytes, workspace_bytes;
} kvcache_plan;

static fa_status plan_kvcache(const fa_gpu_state *s, const fa_kv_problem *kp, kvcache_plan *plan)
{
    const fa_problem *p = &kp->attn;
    fa_status st = pick_kernels(s, FA_GPU_PASS_FORWARD, p->shape.head_dim, &plan->tile, &plan->set);
    if (st != FA_SUCCESS) return st;
    plan->sequences = fa_kv_sequences(p);
    plan->most_new = kp->cache.cu_seqlens_new ? kp->cache.max_seqlen_new : kp->cache.seqlen_new;
    plan->rows = p->shape.heads_q / p->shape.heads_kv * (p->varlen.batch ? p->varlen.max_seqlen_q : p->shape.seqlen_q);
    plan->row_tiles = fa_gpu_tiles(plan->rows, plan->tile);
    plan->chunks = fa_kv_split_max_chunks(kp->cache.split_tokens, p->shape.seqlen_k);
    if (plan->row_tiles * plan->chunks > 2147483647 || plan->most_new > 2147483647 || plan->sequences > 65535)
        return FA_ERR(FA_ERROR_NOT_SUPPORTED, "q: %lld query rows per kv head in %lld chunks of keys, %lld sequences, "
                      "exceed the %s backend's grid", (long long)plan->rows, (long long)plan->chunks,
                      (long long)plan->sequences, FA_GPU_VENDOR);
    plan->partial_bytes = (size_t)(plan->sequences * p->shape.heads_kv * plan->chunks * plan->rows) *
                          (size_t)(p->shape.head_dim + 2) * sizeof(float);
    plan->workspace_bytes = align_up(plan->partial_bytes) + 256; /* build_params: no host masks on this path */
    return FA_SUCCESS;
}

static fa_status gpu_kvcache_workspace(void *state, const fa_kv_problem *kp, size_t *bytes)
{
    kvcache_plan plan;
    const fa_status st = plan_kvcache((const fa_gpu_state *)state, kp, &plan);
    *bytes = st == FA_SUCCESS ? plan.workspace_bytes : 0;
    return st;
}

/* Capturable: with a workspace large enough (the caller's, or one grown by an earlier call) and
 * the tables in device memory, it only launches kernels: no allocation, copy or synchronisation. */
static fa_status gpu_forward_kvcache(void *state, const fa_kv_problem *kp)
{
    fa_gpu_state *s = (fa_gpu_state *)state;
    const fa_problem *p = &kp->attn;
    FA_TRY(fa_gpu_set_device(s->ordinal), "set device");
    kvcache_plan plan;
    fa_status st = plan_kvcache(s, kp, &plan);
    if (st != FA_SUCCESS) return st;
    fa_gpu_params k;
    st = build_params(s, p, plan.partial_bytes, &k);
    if (st != FA_SUCCESS) return st;
    fa_gpu_kv_params_of(kp, &k);
    k.partial = (float *)s->workspace;
    k.kv_chunks = plan.chunks;
    /* The cache's tables (packed offsets included), then the modifiers' values. */
    st = launch(s, fa_decode::check_kvcache, dim3(1), 0, &k, "KV-cache table check launch");
    if (st == FA_SUCCESS && (p->modifiers.alibi_slopes || p->modifiers.sinks))
        st = launch(s, fa_decode::check_modifier_values, dim3(1), 0, &k, "ALiBi slopes and sinks check launch");
    if (st == FA_SUCCESS && plan.most_new)
        st = launch(s, fa_decode::append, dim3((unsigned)plan.most_new, (unsigned)p->shape.heads_kv, (unsigned)plan.sequences),
                    fa_decode::kAppendSmem, &k, "KV-cache append launch");
    if (st == FA_SUCCESS)
        st = launch(s, plan.set.decode, dim3((unsigned)(plan.row_tiles * plan.chunks), (unsigned)p->shape.heads_kv,
                                             (unsigned)plan.sequences),
                    (size_t)fa_gpu_generic_smem_bytes(FA_GPU_PASS_FORWARD, plan.tile, p->shape.head_dim), &k,
                    "KV-cache attention launch");
    const int64_t merge_blocks = fa_gpu_tiles(plan.sequences * p->shape.heads_kv * plan.rows, FA_GENERIC_WARPS);
    if (st == FA_SUCCESS)
        st = launch(s, fa_decode::merge, dim3((unsigned)(merge_blocks < 65535 ? merge_blocks : 65535)), 0, &k,
                    "KV-cache merge launch");
    return st;
}

/* fa_kvcache_append: the table checks, then the append kernel of fa_forward_kvcache (capturable:
 * no workspace, allocation or copy). */
static fa_status gpu_kvcache_append(void *state, const fa_kv_problem *kp)
{
    fa_gpu_state *s = (fa_gpu_state *)state;
    const fa_problem *p = &kp->attn;
    FA_TRY(fa_gpu_set_device(s->ordinal), "set device");
    fa_gpu_params k;
    fa_status st = build_params(s, p, 0, &k);
    if (st != FA_SUCCESS) return st;
    fa_gpu_kv_params_of(kp, &k);
    const int64_t sequences = fa_kv_sequences(p), most_new = kp->cache.cu_seqlens_new ? kp->cache.max_seqlen_new : kp->cache.seqlen_new;
    if (most_new > 2147483647 || sequences > 65535)
        return FA_ERR(FA_ERROR_NOT_SUPPORTED, "k_new: %lld tokens per sequence, %lld sequences, exceed the %s backend's grid",
                      (long long)most_new, (long long)sequences, FA_GPU_VENDOR);
    st = launch(s, fa_decode::check_kvcache, dim3(1), 0, &k, "KV-cache table check launch");
    if (st == FA_SUCCESS && most_new)
        st = launch(s, fa_decode::append, dim3((unsigned)most_new, (unsigned)p->shape.heads_kv, (unsigned)sequences),
                    fa_decode::kAppendSmem, &k, "KV-cache append launch");
    return st;
}

/* fa_merge_partials on device memory (the core has checked the arguments): the parts' pointers and
 * strides uploaded into the workspace, then one warp per output row. */
static fa_status gpu_merge_partials(void *state, const fa_merge_problem *mp)
{
    fa_gpu_state *s = (fa_gpu_state *)state;
    FA_TRY(fa_gpu_set_device(s->ordinal), "set device");
    const size_t bytes = (size_t)mp->n * sizeof(fa_gpu_merge_part);
    fa_gpu_merge_part *parts = (fa_gpu_merge_part *)malloc(bytes);
    if (!parts) return FA_ERR(FA_ERROR_OUT_OF_MEMORY, "fa_merge_partials: %d parts of host scratch", mp->n);
    for (int c = 0; c < mp->n; ++c) {
        const fa_tensor &t = mp->parts[c];
        parts[c] = {t.data, t.stride_batch, t.stride_seq, t.stride_head, mp->lses[c]};
    }
    fa_status st = workspace_reserve(s, bytes);
    /* From pageable memory the copy has read `parts` when it returns (stream-ordered after any
     * kernel still using the workspace). */
    const fa_gpu_error e =
        st == FA_SUCCESS ? fa_gpu_memcpy_async(s->workspace, parts, bytes, fa_gpu_memcpy_h2d, s->stream) : fa_gpu_success;
    free(parts);
    if (st != FA_SUCCESS) return st;
    if (e != fa_gpu_success) return runtime_failure(e, "upload the merge's parts");
    fa_gpu_merge_params k = {};
    k.parts = (const fa_gpu_merge_part *)s->workspace;
    k.n = mp->n;
    k.dtype = mp->out.dtype;
    k.batch = mp->out.batch;
    k.heads = mp->out.heads;
    k.seqlen = mp->out.seqlen;
    k.head_dim = mp->out.head_dim;
    k.out = fa_gpu_tensor_of(&mp->out);
    k.lse_out = mp->lse_out;
    const int64_t blocks = fa_gpu_tiles(k.batch * k.heads * k.seqlen, FA_GENERIC_WARPS);
    return launch_warps(s, fa_merge::merge_partials, dim3((unsigned)(blocks < 65535 ? blocks : 65535)), FA_GENERIC_WARPS,
                        0, &k, "merge launch");
}

/* The table by member name (C++17 has no designated initialisers): a reordered or appended
 * member of fa_backend_iface cannot shift the others. */
static fa_backend_iface plugin_iface()
{
    fa_backend_iface t = {};
    t.abi_version = FA_BACKEND_ABI_VERSION;
    t.kind = FA_PLUGIN_KIND;
    t.name = FA_GPU_VENDOR;
    t.device_count = gpu_device_count;
    t.open = gpu_open;
    t.close = gpu_close;
    t.set_num_threads = gpu_set_num_threads;
    t.set_stream = gpu_set_stream;
    t.synchronize = gpu_synchronize;
    t.mem_alloc = gpu_mem_alloc;
    t.mem_free = gpu_mem_free;
    t.copy_h2d = gpu_copy_h2d;
    t.copy_d2h = gpu_copy_d2h;
    t.tiling = gpu_tiling;
    t.info = gpu_info;
    t.forward = gpu_forward;
    t.backward = gpu_backward;
    /* tensors and tables are device memory: their checks run on the device */
    t.features = 0;
    t.forward_kvcache = gpu_forward_kvcache;
    t.set_workspace = gpu_set_workspace;
    t.kvcache_workspace = gpu_kvcache_workspace;
    t.kvcache_append = gpu_kvcache_append;
    t.merge_partials = gpu_merge_partials;
    t.supports = gpu_supports;
    return t;
}


extern "C" __attribute__((visibility("default"))) const fa_backend_iface *fa_backend_plugin_entry(const fa_host_api *host)
{
    if (!host || host->abi_version != FA_BACKEND_ABI_VERSION || !host->set_error) return NULL;
    g_host = host;
    static const fa_backend_iface iface = plugin_iface();
    return &iface;
}

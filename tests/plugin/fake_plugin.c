/* A stand-in GPU plugin for machines with no GPU. The registry knows plugins by file name only, so
 * it is built as libflashattn-cuda.so in folders of its own (tests/plugin/meson.build) and copied
 * under that name by the install tests; it is never installed. FA_FAKE_PLUGIN_MODE, read by the
 * entry point, picks what it does, one loader branch each (tests/plugin/test_plugin_loader.c):
 *   (unset)     accepts the host, claims the CUDA slot, reports no devices with a message naming
 *               the file it was loaded from (the install tests check which copy was found)
 *   abi_older   returns a table of plugin ABI version FA_BACKEND_ABI_OLDEST - 1 (too old to load)
 *   abi_newer   returns a table of plugin ABI version FA_BACKEND_ABI_VERSION + 1
 *   abi_previous  a working plugin built for ABI FA_BACKEND_ABI_OLDEST: refuses newer host tables,
 *               reads the flat problem of that ABI (the registry converts each one), and its
 *               table's members appended since then must never be called
 *   refuse      returns NULL, as a plugin built for another host ABI does
 *   wrong_kind  returns a table that claims the HIP backend
 *   no_supports the working table of the current ABI without its supports() member
 *   working     one device with host memory; forward and backward fail on each context's first
 *               call (FA_ERROR_BACKEND_FAILURE through the host's set_error) and afterwards write
 *               out = q, lse[i] = i, dq = dout, dk = k, dv = v
 * Built with -DFAKE_PLUGIN_NO_ENTRY, it exports its entry point under another name. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/backend.h"
#include "common/backend_legacy.h"

static const fa_host_api *host;

/* The file this module was loaded from. */
static const char *own_path(void)
{
    Dl_info self;
    return dladdr((void *)&own_path, &self) && self.dli_fname ? self.dli_fname : "(unknown path)";
}

/* ---- no devices ---------------------------------------------------------------------------- */
static const char *unknown_mode; /* an FA_FAKE_PLUGIN_MODE this file does not know, or NULL */

static int no_devices(void)
{
    if (unknown_mode)
        host->set_error(FA_ERROR_BACKEND_UNAVAILABLE, "fake test plugin at %s: unknown FA_FAKE_PLUGIN_MODE '%s'",
                        own_path(), unknown_mode);
    else
        host->set_error(FA_ERROR_BACKEND_UNAVAILABLE, "fake test plugin at %s, no devices", own_path());
    return 0;
}

/* The registry calls nothing else on a backend with no devices, or on a table it rejects. */
static const fa_backend_iface no_devices_iface = {
    .abi_version = FA_BACKEND_ABI_VERSION,
    .kind = FA_BACKEND_CUDA,
    .name = "fake",
    .device_count = no_devices,
};

/* ---- working: one device in host memory ---------------------------------------------------- */
typedef struct fake_state {
    unsigned forward_calls, backward_calls;
    char info[512];
} fake_state;

static int one_device(void) { return 1; }

static fa_status fake_open(int device, void **state)
{
    *state = calloc(1, sizeof(fake_state));
    return *state ? FA_SUCCESS : host->set_error(FA_ERROR_OUT_OF_MEMORY, "fake test plugin: cannot allocate its state");
}

static void fake_close(void *state) { free(state); }
static fa_status fake_accept_int(void *state, int n) { return FA_SUCCESS; }
static fa_status fake_accept_stream(void *state, void *stream) { return FA_SUCCESS; }
static fa_status fake_synchronize(void *state) { return FA_SUCCESS; }

static fa_status fake_mem_alloc(void *state, size_t bytes, void **ptr)
{
    *ptr = malloc(bytes);
    return *ptr ? FA_SUCCESS : host->set_error(FA_ERROR_OUT_OF_MEMORY, "fake test plugin: cannot allocate %zu bytes", bytes);
}

static fa_status fake_mem_free(void *state, void *ptr)
{
    free(ptr);
    return FA_SUCCESS;
}

static fa_status fake_copy(void *state, void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return FA_SUCCESS;
}

static fa_status fake_tiling(void *state, int64_t head_dim, fa_dtype dtype, fa_tiling *tiling, int64_t *sram)
{
    *tiling = (fa_tiling){16, 16};
    *sram = 4 * 16 * head_dim;
    return FA_SUCCESS;
}

static const char *fake_info(void *state)
{
    fake_state *s = state;
    snprintf(s->info, sizeof s->info, "fake test plugin at %s, working mode", own_path());
    return s->info;
}

/* dst = src element by element; the core has checked that both have the same shape and dtype. */
static void copy_tensor(const fa_tensor *dst, const fa_tensor *src)
{
    const size_t size = src->dtype == FA_DTYPE_F32 ? 4 : 2;
    for (int64_t b = 0; b < src->batch; ++b)
        for (int64_t s = 0; s < src->seqlen; ++s)
            for (int64_t h = 0; h < src->heads; ++h)
                memcpy((char *)dst->data + (size_t)(b * dst->stride_batch + s * dst->stride_seq + h * dst->stride_head) * size,
                       (const char *)src->data + (size_t)(b * src->stride_batch + s * src->stride_seq + h * src->stride_head) * size,
                       (size_t)src->head_dim * size);
}

/* forward: out = q, lse[i] = i (rows of them), failing on the context's first call. */
static fa_status fake_forward_of(fake_state *s, const fa_tensor *out, const fa_tensor *q, float *lse, int64_t rows)
{
    if (s->forward_calls++ == 0)
        return host->set_error(FA_ERROR_BACKEND_FAILURE, "fake test plugin: forward fails on its first call (by design)");
    copy_tensor(out, q);
    if (lse)
        for (int64_t i = 0; i < rows; ++i) lse[i] = (float)i;
    return FA_SUCCESS;
}

/* backward: dq = dout, dk = k, dv = v, failing on the context's first call. */
static fa_status fake_backward_of(fake_state *s, const fa_tensor *dq, const fa_tensor *dout, const fa_tensor *dk,
                                  const fa_tensor *k, const fa_tensor *dv, const fa_tensor *v)
{
    if (s->backward_calls++ == 0)
        return host->set_error(FA_ERROR_BACKEND_FAILURE, "fake test plugin: backward fails on its first call (by design)");
    copy_tensor(dq, dout);
    copy_tensor(dk, k);
    copy_tensor(dv, v);
    return FA_SUCCESS;
}

static fa_status fake_forward(void *state, const fa_problem *p)
{
    return fake_forward_of(state, &p->out, &p->q, p->outputs.lse, p->shape.batch * p->shape.heads_q * p->shape.seqlen_q);
}

static fa_status fake_backward(void *state, const fa_problem *p)
{
    return fake_backward_of(state, &p->dq, &p->dout, &p->dk, &p->k, &p->dv, &p->v);
}

/* No feature beyond plain dense attention. */
static fa_status fake_supports(void *state, fa_op op, const fa_problem *p)
{
    (void)state;
    return fa_require_needs(host->set_error, "fake", 0u, op, p);
}

/* The same, as a plugin of ABI 4 reads its flat problem (backend_legacy.h): the registry converts. */
static fa_status fake_forward_v5(void *state, const fa_problem_v5 *p)
{
    return fake_forward_of(state, &p->out, &p->q, p->lse, p->batch * p->heads_q * p->seqlen_q);
}

static fa_status fake_backward_v5(void *state, const fa_problem_v5 *p)
{
    return fake_backward_of(state, &p->dq, &p->dout, &p->dk, &p->k, &p->dv, &p->v);
}

/* Stands in for memory past the end of an older plugin's table: the registry must not read it. */
static fa_status not_in_an_older_table(void *state, const fa_merge_problem *p)
{
    fprintf(stderr, "fake test plugin: the registry called a member an ABI %u table does not have\n", FA_BACKEND_ABI_OLDEST);
    abort();
}

/* Stands in for kvcache_append, past the end of an ABI 7 table. */
static fa_status not_in_an_abi7_table(void *state, const fa_kv_problem *p)
{
    (void)state;
    (void)p;
    fprintf(stderr, "fake test plugin: the registry called a member an ABI 7 table does not have\n");
    abort();
}

static const fa_backend_iface working_iface = {
    .abi_version = FA_BACKEND_ABI_VERSION,
    .kind = FA_BACKEND_CUDA,
    .name = "fake",
    .device_count = one_device,
    .open = fake_open,
    .close = fake_close,
    .set_num_threads = fake_accept_int,
    .set_stream = fake_accept_stream,
    .synchronize = fake_synchronize,
    .mem_alloc = fake_mem_alloc,
    .mem_free = fake_mem_free,
    .copy_h2d = fake_copy,
    .copy_d2h = fake_copy,
    .tiling = fake_tiling,
    .info = fake_info,
    .forward = fake_forward,
    .backward = fake_backward,
    .supports = fake_supports,
};

/* working_iface as a plugin of ABI FA_BACKEND_ABI_OLDEST builds it: no feature bits, no
 * forward_kvcache; its merge_partials member lies past the end of such a table. */
static const fa_backend_iface_v5 previous_iface = {
    .abi_version = FA_BACKEND_ABI_OLDEST,
    .kind = FA_BACKEND_CUDA,
    .name = "fake",
    .device_count = one_device,
    .open = fake_open,
    .close = fake_close,
    .set_num_threads = fake_accept_int,
    .set_stream = fake_accept_stream,
    .synchronize = fake_synchronize,
    .mem_alloc = fake_mem_alloc,
    .mem_free = fake_mem_free,
    .copy_h2d = fake_copy,
    .copy_d2h = fake_copy,
    .tiling = fake_tiling,
    .info = fake_info,
    .forward = fake_forward_v5,
    .backward = fake_backward_v5,
    .merge_partials = not_in_an_older_table,
};

/* ---- entry point ----------------------------------------------------------------------------- */
static fa_backend_iface returned; /* the table handed to the host, patched per mode */

#ifdef FAKE_PLUGIN_NO_ENTRY
#define FAKE_ENTRY fa_backend_plugin_entry_under_another_name
#else
#define FAKE_ENTRY fa_backend_plugin_entry
#endif

__attribute__((visibility("default"))) const fa_backend_iface *FAKE_ENTRY(const fa_host_api *h)
{
    const char *mode = getenv("FA_FAKE_PLUGIN_MODE");
    if (!mode) mode = "";
    const int previous = strcmp(mode, "abi_previous") == 0, abi7 = strcmp(mode, "abi_7") == 0;
    const unsigned built_for = previous ? FA_BACKEND_ABI_OLDEST : abi7 ? 7u : FA_BACKEND_ABI_VERSION;
    if (!h || h->abi_version != built_for || !h->set_error) return NULL;
    host = h;
    if (previous) return (const fa_backend_iface *)(const void *)&previous_iface;
    if (abi7) { /* today's table as ABI 7 built it: the registry must not read kvcache_append */
        returned = working_iface;
        returned.abi_version = 7u;
        returned.kvcache_append = not_in_an_abi7_table;
        return &returned;
    }
    const int no_supports = strcmp(mode, "no_supports") == 0;
    returned = strcmp(mode, "working") == 0 || no_supports ? working_iface : no_devices_iface;
    if (strcmp(mode, "refuse") == 0) return NULL;
    if (strcmp(mode, "abi_older") == 0) returned.abi_version = FA_BACKEND_ABI_OLDEST - 1;
    else if (strcmp(mode, "abi_newer") == 0) returned.abi_version = FA_BACKEND_ABI_VERSION + 1;
    else if (strcmp(mode, "wrong_kind") == 0) returned.kind = FA_BACKEND_HIP;
    else if (no_supports) returned.supports = NULL;
    else if (mode[0] && strcmp(mode, "working") != 0 && !no_supports) unknown_mode = mode;
    return &returned;
}

/* The backend interface: every backend (the built-in CPU one and the dlopen'd GPU plugins) is a
 * table of function pointers plus an opaque state, in the style of ggml-backend. The core
 * validates arguments once, asks the backend whether it supports the normalised problem
 * (problem.h), and hands it over; backends never see packed (all-zero) strides or a zero softmax
 * scale. */
#ifndef FA_BACKEND_H
#define FA_BACKEND_H

#include "flashattn.h"
#include "problem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever fa_problem (problem.h and its sections), fa_host_api or fa_backend_iface change
 * layout. */
#define FA_BACKEND_ABI_VERSION 8u
/* The oldest plugin ABI the registry still loads. Plugins of ABIs 4 and 5 read the flat problem of
 * backend_legacy.h: the registry converts each problem for them and answers supports() from their
 * feature bits (registry.c). ABI 4 has no merge_partials either. ABIs 6 and 7 differ from 8 where
 * fa_kv_problem grew at its end (the cache section's quantisation scales and rotary tables; before
 * 7 its serving fields and split size: the registry refuses those problems for them) and in the
 * table's last member (7; 6: its last three), absent. Older ones are refused. */
#define FA_BACKEND_ABI_OLDEST 4u

/* fa_backend_iface.features */
#define FA_BACKEND_HOST_MEMORY 1u /* tensors and tables are host memory: the core reads tables */

/* Services the core library offers to plugins (plugins never link the core). */
typedef struct fa_host_api {
    uint32_t abi_version;
    /* Records the thread's detailed error message (printf-style); returns the status passed. */
    fa_status (*set_error)(fa_status status, const char *fmt, ...);
} fa_host_api;

typedef struct fa_backend_iface {
    uint32_t abi_version;
    fa_backend kind;
    const char *name;
    /* Devices usable now; 0 means absent (then the backend has recorded why via set_error). */
    int (*device_count)(void);
    fa_status (*open)(int device, void **state);
    void (*close)(void *state);
    fa_status (*set_num_threads)(void *state, int n);
    fa_status (*set_stream)(void *state, void *stream);
    fa_status (*synchronize)(void *state);
    fa_status (*mem_alloc)(void *state, size_t bytes, void **ptr);
    fa_status (*mem_free)(void *state, void *ptr);
    fa_status (*copy_h2d)(void *state, void *dst, const void *src, size_t bytes);
    fa_status (*copy_d2h)(void *state, void *dst, const void *src, size_t bytes);
    fa_status (*tiling)(void *state, int64_t head_dim, fa_dtype dtype, fa_tiling *tiling,
                        int64_t *sram_elements);
    const char *(*info)(void *state);
    fa_status (*forward)(void *state, const fa_problem *p);
    fa_status (*backward)(void *state, const fa_problem *p);
    unsigned features;                 /* FA_BACKEND_HOST_MEMORY or 0 */
    fa_status (*forward_kvcache)(void *state, const fa_kv_problem *p);
    /* fa_merge_partials for a backend whose memory is not the host's; NULL = not supported there.
     * Host-memory backends merge in the core. */
    fa_status (*merge_partials)(void *state, const fa_merge_problem *p);
    /* ABI 6: whether the backend runs p with op (ggml's supports_op): FA_SUCCESS, or
     * FA_ERROR_NOT_SUPPORTED with a one-line message recorded through set_error. Asked before every
     * call; the core checks nothing about features itself. Never NULL. */
    fa_status (*supports)(void *state, fa_op op, const fa_problem *p);
    /* ABI 7: the caller's workspace (fa_context_set_workspace; ptr NULL: the backend's own again),
     * and the bytes forward_kvcache needs for p (fa_workspace_size). Both NULL for backends without
     * a device workspace (host memory). */
    fa_status (*set_workspace)(void *state, void *ptr, size_t bytes);
    fa_status (*kvcache_workspace)(void *state, const fa_kv_problem *p, size_t *bytes);
    /* ABI 8: fa_kvcache_append, the append of forward_kvcache without attention (p's attn.q and
     * attn.out have data NULL, seqlen_q 0); NULL = not supported there. */
    fa_status (*kvcache_append)(void *state, const fa_kv_problem *p);
} fa_backend_iface;

/* A plugin exports one C symbol of this type, named FA_PLUGIN_ENTRY_NAME. It returns NULL when
 * host->abi_version does not match the one it was built for. */
typedef const fa_backend_iface *(*fa_plugin_entry_fn)(const fa_host_api *host);
#define FA_PLUGIN_ENTRY_NAME "fa_backend_plugin_entry"

#ifdef __cplusplus
}
#endif
#endif

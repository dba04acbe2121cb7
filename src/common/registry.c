#define _GNU_SOURCE /* dladdr */
#include "registry.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend_legacy.h"
#include "error.h"

#ifndef FA_PLUGIN_INSTALL_DIR
#define FA_PLUGIN_INSTALL_DIR ""
#endif

typedef struct plugin_slot {
    fa_backend kind;
    const char *file;              /* shared module name */
    pthread_once_t once;
    void (*load_once)(void);       /* loads this slot: pthread_once passes no argument */
    const fa_backend_iface *iface; /* NULL when unavailable */
    /* A plugin of ABI 4 or 5: its own table, and the table the core calls, whose problem-taking
     * members are the slot's adapters (legacy_*) and whose missing members are NULL. */
    const fa_backend_iface_v5 *legacy;
    fa_backend_iface upgraded;
    fa_status (*legacy_forward)(void *state, const fa_problem *p);
    fa_status (*legacy_backward)(void *state, const fa_problem *p);
    fa_status (*legacy_forward_kvcache)(void *state, const fa_kv_problem *p);
    fa_status (*legacy_supports)(void *state, fa_op op, const fa_problem *p);
    const fa_backend_iface *older; /* a plugin of ABI 6 or 7: its own table (upgraded: with older_supports) */
    fa_status (*older_supports)(void *state, fa_op op, const fa_problem *p);
    char reason[512];              /* as long as fa_last_error() can hold (error.c) */
} plugin_slot;

static void load_plugin(plugin_slot *slot);

/* ---- plugins of ABIs 4 and 5 --------------------------------------------------------------------
 * Their entry points read the flat problems of backend_legacy.h: each call's problem is converted,
 * and supports() is answered from their feature bits. */
static fa_status legacy_forward(const plugin_slot *slot, void *state, const fa_problem *p)
{
    fa_problem_v5 v;
    fa_problem_to_v5(p, &v);
    return slot->legacy->forward(state, &v);
}

static fa_status legacy_backward(const plugin_slot *slot, void *state, const fa_problem *p)
{
    fa_problem_v5 v;
    fa_problem_to_v5(p, &v);
    return slot->legacy->backward(state, &v);
}

static fa_status legacy_forward_kvcache(const plugin_slot *slot, void *state, const fa_kv_problem *p)
{
    fa_kv_problem_v5 v;
    fa_kv_problem_to_v5(p, &v);
    return slot->legacy->forward_kvcache(state, &v);
}

/* What a plugin of an older ABI cannot be asked: before ABI 7 the KV cache's serving forms and an
 * explicit split size (its problems end before those fields, or lack them), before ABI 8 quantised
 * caches and rotary embeddings. */
static fa_status refuse_newer_kvcache(const char *name, uint32_t abi, unsigned have, fa_op op, const fa_problem *p)
{
    if (op != FA_OP_FORWARD_KVCACHE) return FA_SUCCESS;
    const fa_kv_problem *kp = (const fa_kv_problem *)(const void *)p;
    if (fa_kv_problem_quantised(kp))
        return fa_set_error(FA_ERROR_NOT_SUPPORTED, "cache->k, cache->v: the %s plugin predates quantised caches "
                                                    "(rebuild it)", name);
    if (kp->cache.rotary_cos)
        return fa_set_error(FA_ERROR_NOT_SUPPORTED, "desc->rotary: the %s plugin predates rotary embeddings (rebuild it)",
                            name);
    if (abi >= 7u) return FA_SUCCESS;
    if (fa_kv_problem_serving(kp)) return fa_require_needs(fa_set_error, name, have & ~FA_NEED_KVCACHE_SERVING, op, p);
    if (kp->cache.split_tokens)
        return fa_set_error(FA_ERROR_NOT_SUPPORTED, "desc->kv_split_tokens: the %s plugin predates it (rebuild it)", name);
    return FA_SUCCESS;
}

/* A plugin of ABI 6 or 7 has today's table up to supports() (7: up to kvcache_workspace) and reads today's
 * problems, whose KV-cache problem only grew at its end: it runs what it knew, and the rest is
 * refused here, never run with a meaning it does not have. */
static fa_status older_supports(const plugin_slot *slot, void *state, fa_op op, const fa_problem *p)
{
    const fa_status st = refuse_newer_kvcache(slot->older->name, slot->older->abi_version, FA_NEED_ALL, op, p);
    return st == FA_SUCCESS ? slot->older->supports(state, op, p) : st;
}

static fa_status legacy_supports(const plugin_slot *slot, void *state, fa_op op, const fa_problem *p)
{
    (void)state;
    const unsigned have = (slot->legacy->features & ~FA_BACKEND_HOST_MEMORY) |
                          (slot->legacy->forward_kvcache ? FA_NEED_KVCACHE : 0u);
    const fa_status st = refuse_newer_kvcache(slot->legacy->name, slot->legacy->abi_version, have, op, p);
    return st == FA_SUCCESS ? fa_require_needs(fa_set_error, slot->legacy->name, have, op, p) : st;
}

/* A slot, the once-function that loads it and its adapters, defined together (C has no closures:
 * each slot's adapters are functions of their own). */
#define PLUGIN_SLOT(name, backend_kind, file_name)                                                 \
    static void name##_load(void);                                                                \
    static plugin_slot name;                                                                      \
    static fa_status name##_forward(void *state, const fa_problem *p) { return legacy_forward(&name, state, p); } \
    static fa_status name##_backward(void *state, const fa_problem *p) { return legacy_backward(&name, state, p); } \
    static fa_status name##_forward_kvcache(void *state, const fa_kv_problem *p)                 \
    {                                                                                             \
        return legacy_forward_kvcache(&name, state, p);                                           \
    }                                                                                             \
    static fa_status name##_supports(void *state, fa_op op, const fa_problem *p)                  \
    {                                                                                             \
        return legacy_supports(&name, state, op, p);                                              \
    }                                                                                             \
    static fa_status name##_older_supports(void *state, fa_op op, const fa_problem *p)            \
    {                                                                                             \
        return older_supports(&name, state, op, p);                                               \
    }                                                                                             \
    static plugin_slot name = {.kind = backend_kind,                                              \
                               .file = file_name,                                                 \
                               .once = PTHREAD_ONCE_INIT,                                         \
                               .load_once = name##_load,                                          \
                               .legacy_forward = name##_forward,                                  \
                               .legacy_backward = name##_backward,                                \
                               .legacy_forward_kvcache = name##_forward_kvcache,                  \
                               .legacy_supports = name##_supports,                                \
                               .older_supports = name##_older_supports};                          \
    static void name##_load(void) { load_plugin(&name); }

PLUGIN_SLOT(cuda_slot, FA_BACKEND_CUDA, "libflashattn-cuda.so")
PLUGIN_SLOT(hip_slot, FA_BACKEND_HIP, "libflashattn-hip.so")

/* Every backend, the one list: its public name, and its plugin slot (NULL: built in, or "auto").
 * AUTO picks the first plugin of this list that is available, else the CPU. */
typedef struct backend_entry {
    fa_backend kind;
    const char *name;
    plugin_slot *slot;
} backend_entry;

static const backend_entry backends[] = {
    {FA_BACKEND_AUTO, "auto", NULL},
    {FA_BACKEND_CPU, "cpu", NULL},
    {FA_BACKEND_CUDA, "cuda", &cuda_slot},
    {FA_BACKEND_HIP, "hip", &hip_slot},
};
enum { BACKEND_COUNT = sizeof backends / sizeof backends[0] };

/* The entry of kind, or NULL for a value that is no backend. */
static const backend_entry *entry_of(fa_backend kind)
{
    for (size_t i = 0; i < BACKEND_COUNT; ++i)
        if (backends[i].kind == kind) return &backends[i];
    return NULL;
}

/* The host tables offered to a plugin, newest first: FA_BACKEND_ABI_VERSION down to
 * FA_BACKEND_ABI_OLDEST (fa_host_api has the same layout in all of them). */
static const fa_host_api host_apis[] = {
    {.abi_version = FA_BACKEND_ABI_VERSION, .set_error = fa_set_error},
    {.abi_version = 7u, .set_error = fa_set_error},
    {.abi_version = 6u, .set_error = fa_set_error},
    {.abi_version = 5u, .set_error = fa_set_error},
    {.abi_version = 4u, .set_error = fa_set_error},
};
_Static_assert(sizeof host_apis / sizeof host_apis[0] == FA_BACKEND_ABI_VERSION - FA_BACKEND_ABI_OLDEST + 1,
               "one host table per plugin ABI the registry loads");

/* The table the core calls for a plugin of ABI 4 or 5 (legacy): the members the two layouts
 * share, the slot's adapters for those that take problems, merge_partials from ABI 5 on. */
static const fa_backend_iface *upgrade(plugin_slot *slot, const fa_backend_iface_v5 *legacy)
{
    fa_backend_iface *t = &slot->upgraded;
    *t = (fa_backend_iface){0};
    t->abi_version = legacy->abi_version;
    t->kind = legacy->kind;
    t->name = legacy->name;
    t->device_count = legacy->device_count;
    t->open = legacy->open;
    t->close = legacy->close;
    t->set_num_threads = legacy->set_num_threads;
    t->set_stream = legacy->set_stream;
    t->synchronize = legacy->synchronize;
    t->mem_alloc = legacy->mem_alloc;
    t->mem_free = legacy->mem_free;
    t->copy_h2d = legacy->copy_h2d;
    t->copy_d2h = legacy->copy_d2h;
    t->tiling = legacy->tiling;
    t->info = legacy->info;
    t->features = legacy->features & FA_BACKEND_HOST_MEMORY;
    t->forward = slot->legacy_forward;
    t->backward = slot->legacy_backward;
    t->forward_kvcache = legacy->forward_kvcache ? slot->legacy_forward_kvcache : NULL;
    t->merge_partials = legacy->abi_version >= 5u ? legacy->merge_partials : NULL;
    t->supports = slot->legacy_supports;
    slot->legacy = legacy;
    return t;
}

static plugin_slot *slot_for(fa_backend kind)
{
    const backend_entry *e = entry_of(kind);
    return e ? e->slot : NULL;
}

/* Directory holding this library, so a build tree and an install tree both find their plugins. */
static void library_dir(char *dir, size_t size)
{
    Dl_info info;
    dir[0] = '\0';
    if (dladdr((void *)&fa_registry_get, &info) && info.dli_fname) {
        snprintf(dir, size, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else dir[0] = '\0';
    }
}

/* Records why the slot's backend is unavailable: "<backend> backend unavailable: <why>". */
static void set_reason(plugin_slot *slot, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_reason(plugin_slot *slot, const char *fmt, ...)
{
    const int prefix = snprintf(slot->reason, sizeof slot->reason, "%s backend unavailable: ",
                                fa_backend_name(slot->kind));
    va_list args;
    va_start(args, fmt);
    vsnprintf(slot->reason + prefix, sizeof slot->reason - (size_t)prefix, fmt, args);
    va_end(args);
}

/* Opens the slot's module from the first search folder that has it; path gets the file opened. */
static void *open_plugin(plugin_slot *slot, char *path, size_t path_size)
{
    char libdir[512];
    library_dir(libdir, sizeof libdir);
    const char *env_dir = getenv("FLASHATTN_PLUGIN_DIR");
    const char *dirs[4][2] = {
        {env_dir ? env_dir : "", ""},
        {libdir, ""},
        {libdir, "/flashattn"},
        {FA_PLUGIN_INSTALL_DIR, ""},
    };
    char tried[256] = "";
    for (size_t i = 0; i < 4; ++i) {
        if (!dirs[i][0][0]) continue;
        snprintf(path, path_size, "%s%s/%s", dirs[i][0], dirs[i][1], slot->file);
        void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (handle) return handle;
        /* A module that exists but fails to load (missing runtime) is worth reporting as is. */
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            set_reason(slot, "%s", dlerror()); /* "<path>: <why>" */
            return NULL;
        }
        size_t used = strlen(tried);
        snprintf(tried + used, sizeof tried - used, "%s%s%s", used ? ", " : "", dirs[i][0], dirs[i][1]);
    }
    set_reason(slot, "plugin %s not found (searched %s)", slot->file, tried[0] ? tried : "nothing");
    return NULL;
}

/* The plugin's table if it speaks this library's ABI for the slot's backend; else NULL and the
 * slot's reason names the file and what is wrong with it. */
static const fa_backend_iface *plugin_table(plugin_slot *slot, void *handle, const char *path)
{
    fa_plugin_entry_fn entry = (fa_plugin_entry_fn)(uintptr_t)dlsym(handle, FA_PLUGIN_ENTRY_NAME);
    if (!entry) {
        set_reason(slot, "%s does not export %s", path, FA_PLUGIN_ENTRY_NAME);
        return NULL;
    }
    /* A plugin returns NULL for a host ABI it was not built for: the newest first, then older ones. */
    const fa_backend_iface *iface = NULL;
    for (size_t v = 0; !iface && v < sizeof host_apis / sizeof host_apis[0]; ++v) iface = entry(&host_apis[v]);
    if (!iface) {
        set_reason(slot, "%s refused plugin ABI versions %u to %u (%s returned NULL); rebuild the plugin", path,
                   FA_BACKEND_ABI_VERSION, FA_BACKEND_ABI_OLDEST, FA_PLUGIN_ENTRY_NAME);
        return NULL;
    }
    /* abi_version is the table's first member in every version; nothing else is read before it is known. */
    if (iface->abi_version < FA_BACKEND_ABI_OLDEST || iface->abi_version > FA_BACKEND_ABI_VERSION) {
        if (iface->abi_version < FA_BACKEND_ABI_OLDEST)
            set_reason(slot, "%s has plugin ABI version %u, older than the oldest this library loads (%u); rebuild the plugin",
                       path, iface->abi_version, FA_BACKEND_ABI_OLDEST);
        else
            set_reason(slot, "%s has plugin ABI version %u, newer than this library's %u; rebuild the plugin", path,
                       iface->abi_version, FA_BACKEND_ABI_VERSION);
        return NULL;
    }
    if (iface->kind != slot->kind) {
        set_reason(slot, "%s is a %s plugin (backend kind %d), not a %s one", path, fa_backend_name(iface->kind),
                   (int)iface->kind, fa_backend_name(slot->kind));
        return NULL;
    }
    return iface;
}

static void load_plugin(plugin_slot *slot)
{
    char path[1024];
    void *handle = open_plugin(slot, path, sizeof path);
    if (!handle) return;
    const fa_backend_iface *iface = plugin_table(slot, handle, path);
    if (!iface) {
        dlclose(handle);
        return;
    }
    if (iface->abi_version == 6u || iface->abi_version == 7u) { /* today's table; supports() answers for what it predates */
        slot->older = iface;
        slot->upgraded = (fa_backend_iface){0};
        /* ABI 6's table ends before set_workspace, ABI 7's before kvcache_append */
        memcpy(&slot->upgraded, iface,
               iface->abi_version == 6u ? offsetof(fa_backend_iface, set_workspace) : offsetof(fa_backend_iface, kvcache_append));
        slot->upgraded.supports = iface->supports ? slot->older_supports : NULL;
        iface = &slot->upgraded;
    } else if (iface->abi_version < FA_BACKEND_ABI_VERSION) { /* only its own members are read */
        iface = upgrade(slot, (const fa_backend_iface_v5 *)(const void *)iface);
    }
    fa_clear_error();
    if (iface->device_count() <= 0) {
        const char *why = fa_last_error();
        set_reason(slot, "%s", why[0] ? why : "no device found");
        /* Keep the module loaded: unloading GPU runtimes is unsafe and the probe is cached. */
        return;
    }
    if (!iface->supports) { /* the core asks it before every call */
        set_reason(slot, "%s has plugin ABI version %u but no supports()", path, iface->abi_version);
        return;
    }
    slot->iface = iface;
}

const fa_backend_iface *fa_registry_get(fa_backend kind)
{
    if (kind == FA_BACKEND_CPU) return fa_cpu_backend_iface();
    plugin_slot *slot = slot_for(kind);
    if (!slot) {
        fa_set_error(FA_ERROR_INVALID_VALUE, "backend: unknown backend %d", (int)kind);
        return NULL;
    }
    pthread_once(&slot->once, slot->load_once);
    if (!slot->iface) fa_set_error(FA_ERROR_BACKEND_UNAVAILABLE, "%s", slot->reason);
    return slot->iface;
}

fa_status fa_registry_resolve(fa_backend requested, fa_backend *resolved)
{
    if (requested != FA_BACKEND_AUTO) {
        if (!entry_of(requested))
            return fa_set_error(FA_ERROR_INVALID_VALUE, "backend: unknown backend %d", (int)requested);
        *resolved = requested;
        return FA_SUCCESS;
    }
    const char *env = getenv("FLASHATTN_BACKEND");
    if (env && env[0] && strcasecmp(env, "auto") != 0) { /* "auto" behaves as unset */
        char names[64] = "";
        for (size_t i = 0; i < BACKEND_COUNT; ++i) {
            if (strcasecmp(env, backends[i].name) == 0) {
                *resolved = backends[i].kind;
                return FA_SUCCESS;
            }
            size_t used = strlen(names);
            snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", backends[i].name);
        }
        return fa_set_error(FA_ERROR_INVALID_VALUE, "FLASHATTN_BACKEND: '%s' is not one of %s", env, names);
    }
    *resolved = FA_BACKEND_CPU;
    for (size_t i = 0; i < BACKEND_COUNT; ++i)
        if (backends[i].slot && fa_registry_get(backends[i].kind)) {
            *resolved = backends[i].kind;
            break;
        }
    fa_clear_error();
    return FA_SUCCESS;
}

const char *fa_backend_name(fa_backend backend)
{
    const backend_entry *e = entry_of(backend);
    return e ? e->name : "unknown";
}

int fa_backend_available(fa_backend backend)
{
    if (backend == FA_BACKEND_AUTO) return 1; /* the CPU backend is always there */
    const int available = fa_registry_get(backend) != NULL;
    return available;
}

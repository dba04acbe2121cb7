#define _GNU_SOURCE /* dladdr */
#include "registry.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"

#ifndef FA_PLUGIN_INSTALL_DIR
#define FA_PLUGIN_INSTALL_DIR ""
#endif

typedef struct plugin_slot {
    fa_backend kind;
    const char *file;            /* shared module name */
    pthread_once_t once;
    const fa_backend_iface *iface; /* NULL when unavailable */
    char reason[384];
} plugin_slot;

static plugin_slot plugins[] = {
    {FA_BACKEND_CUDA, "libflashattn-cuda.so", PTHREAD_ONCE_INIT, NULL, ""},
    {FA_BACKEND_HIP, "libflashattn-hip.so", PTHREAD_ONCE_INIT, NULL, ""},
};

static const fa_host_api host_api = {FA_BACKEND_ABI_VERSION, fa_set_error};

static plugin_slot *slot_for(fa_backend kind)
{
    for (size_t i = 0; i < sizeof plugins / sizeof plugins[0]; ++i)
        if (plugins[i].kind == kind) return &plugins[i];
    return NULL;
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

static void *open_plugin(plugin_slot *slot)
{
    char libdir[512], path[1024];
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
        snprintf(path, sizeof path, "%s%s/%s", dirs[i][0], dirs[i][1], slot->file);
        void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (handle) return handle;
        /* A module that exists but fails to load (missing runtime) is worth reporting as is. */
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            snprintf(slot->reason, sizeof slot->reason, "%s backend unavailable: %s", fa_backend_name(slot->kind), dlerror());
            return NULL;
        }
        size_t used = strlen(tried);
        snprintf(tried + used, sizeof tried - used, "%s%s%s", used ? ", " : "", dirs[i][0], dirs[i][1]);
    }
    snprintf(slot->reason, sizeof slot->reason, "%s backend unavailable: plugin %s not found (searched %s)",
             fa_backend_name(slot->kind), slot->file, tried[0] ? tried : "nothing");
    return NULL;
}

static void load_plugin(plugin_slot *slot)
{
    void *handle = open_plugin(slot);
    if (!handle) return;
    fa_plugin_entry_fn entry = (fa_plugin_entry_fn)(uintptr_t)dlsym(handle, FA_PLUGIN_ENTRY_NAME);
    const fa_backend_iface *iface = entry ? entry(&host_api) : NULL;
    if (!iface || iface->abi_version != FA_BACKEND_ABI_VERSION || iface->kind != slot->kind) {
        snprintf(slot->reason, sizeof slot->reason,
                 "%s backend unavailable: %s has no matching entry point (ABI version %u expected)",
                 fa_backend_name(slot->kind), slot->file, FA_BACKEND_ABI_VERSION);
        dlclose(handle);
        return;
    }
    fa_clear_error();
    if (iface->device_count() <= 0) {
        const char *why = fa_last_error();
        snprintf(slot->reason, sizeof slot->reason, "%s backend unavailable: %s",
                 fa_backend_name(slot->kind), why[0] ? why : "no device found");
        /* Keep the module loaded: unloading GPU runtimes is unsafe and the probe is cached. */
        return;
    }
    slot->iface = iface;
}

/* pthread_once takes no argument, so each slot gets a trampoline. */
static void load_cuda(void) { load_plugin(&plugins[0]); }
static void load_hip(void) { load_plugin(&plugins[1]); }

const fa_backend_iface *fa_registry_get(fa_backend kind)
{
    if (kind == FA_BACKEND_CPU) return fa_cpu_backend_iface();
    plugin_slot *slot = slot_for(kind);
    if (!slot) {
        fa_set_error(FA_ERROR_INVALID_VALUE, "backend: unknown backend %d", (int)kind);
        return NULL;
    }
    pthread_once(&slot->once, kind == FA_BACKEND_CUDA ? load_cuda : load_hip);
    if (!slot->iface) fa_set_error(FA_ERROR_BACKEND_UNAVAILABLE, "%s", slot->reason);
    return slot->iface;
}

fa_status fa_registry_resolve(fa_backend requested, fa_backend *resolved)
{
    if (requested != FA_BACKEND_AUTO) {
        if (requested != FA_BACKEND_CPU && requested != FA_BACKEND_CUDA && requested != FA_BACKEND_HIP)
            return fa_set_error(FA_ERROR_INVALID_VALUE, "backend: unknown backend %d", (int)requested);
        *resolved = requested;
        return FA_SUCCESS;
    }
    const char *env = getenv("FLASHATTN_BACKEND");
    if (env && env[0]) {
        static const fa_backend named[] = {FA_BACKEND_AUTO, FA_BACKEND_CPU, FA_BACKEND_CUDA, FA_BACKEND_HIP};
        for (size_t i = 0; i < sizeof named / sizeof named[0]; ++i) {
            if (strcasecmp(env, fa_backend_name(named[i])) == 0) {
                if (named[i] != FA_BACKEND_AUTO) {
                    *resolved = named[i];
                    return FA_SUCCESS;
                }
                env = NULL; /* "auto" behaves as unset */
                break;
            }
        }
        if (env)
            return fa_set_error(FA_ERROR_INVALID_VALUE,
                                "FLASHATTN_BACKEND: '%s' is not one of auto, cpu, cuda, hip", env);
    }
    *resolved = fa_registry_get(FA_BACKEND_CUDA) ? FA_BACKEND_CUDA
              : fa_registry_get(FA_BACKEND_HIP)  ? FA_BACKEND_HIP
                                                 : FA_BACKEND_CPU;
    fa_clear_error();
    return FA_SUCCESS;
}

const char *fa_backend_name(fa_backend backend)
{
    switch (backend) {
    case FA_BACKEND_AUTO: return "auto";
    case FA_BACKEND_CPU: return "cpu";
    case FA_BACKEND_CUDA: return "cuda";
    case FA_BACKEND_HIP: return "hip";
    }
    return "unknown";
}

int fa_backend_available(fa_backend backend)
{
    if (backend == FA_BACKEND_AUTO) return 1; /* the CPU backend is always there */
    const int available = fa_registry_get(backend) != NULL;
    return available;
}

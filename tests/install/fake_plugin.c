/* A stand-in GPU plugin for the install tests, on machines with no GPU: it exports the real entry
 * point, accepts the host's ABI version, claims the CUDA slot and reports no devices, with a
 * message naming the file it was loaded from. So a client that prints why "cuda" is unavailable
 * shows which copy the registry found (install tree, moved tree, FLASHATTN_PLUGIN_DIR), and AUTO
 * still falls back to the CPU. The registry knows plugins by file name only, so the tests copy
 * this module under the CUDA plugin's name (libflashattn-cuda.so) into their temporary trees;
 * it is never installed. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>

#include "common/backend.h"

static const fa_host_api *host;

static int fake_device_count(void)
{
    Dl_info self;
    const int found = dladdr((void *)&fake_device_count, &self) && self.dli_fname;
    host->set_error(FA_ERROR_BACKEND_UNAVAILABLE, "fake test plugin at %s, no devices",
                    found ? self.dli_fname : "(unknown path)");
    return 0;
}

/* The registry calls nothing else on a backend with no devices. */
static const fa_backend_iface fake_iface = {
    .abi_version = FA_BACKEND_ABI_VERSION,
    .kind = FA_BACKEND_CUDA,
    .name = "fake",
    .device_count = fake_device_count,
};

__attribute__((visibility("default"))) const fa_backend_iface *fa_backend_plugin_entry(const fa_host_api *h)
{
    if (!h || h->abi_version != FA_BACKEND_ABI_VERSION) return NULL;
    host = h;
    return &fake_iface;
}

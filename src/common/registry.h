/* The backend registry: the CPU backend is built in; GPU backends are plugins loaded on first use. */
#ifndef FA_REGISTRY_H
#define FA_REGISTRY_H
#include "backend.h"

/* The backend's interface if it is built, loads and sees a device; otherwise NULL with the reason
 * recorded as the thread's error (FA_ERROR_BACKEND_UNAVAILABLE). */
const fa_backend_iface *fa_registry_get(fa_backend kind);
/* Resolves AUTO (CUDA, HIP, CPU; FLASHATTN_BACKEND overrides). Unknown env values are an error. */
fa_status fa_registry_resolve(fa_backend requested, fa_backend *resolved);

/* Provided by src/cpu. */
const fa_backend_iface *fa_cpu_backend_iface(void);
#endif

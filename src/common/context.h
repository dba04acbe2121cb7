/* What the rest of the core may see of a context (its struct stays private to context.c). */
#ifndef FA_CONTEXT_H
#define FA_CONTEXT_H
#include "backend.h"

/* The context's backend interface and state; FA_ERROR_INVALID_VALUE ("ctx: is NULL") for NULL. */
fa_status fa_context_backend_state(fa_context *ctx, const fa_backend_iface **iface, void **state);
#endif

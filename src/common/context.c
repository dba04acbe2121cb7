/* Contexts: a backend interface plus that backend's state. Every call checks its handle and
 * forwards to the backend; argument validation of attention calls lives in validate.c. */
#include "context.h"

#include <stdlib.h>

#include "alloc.h"
#include "dtype.h"
#include "error.h"
#include "registry.h"

struct fa_context {
    const fa_backend_iface *iface;
    void *state;
    fa_backend kind;
    int device;
};

#define CHECK_CTX(ctx)                                                                     \
    do {                                                                                   \
        if (!(ctx)) return fa_set_error(FA_ERROR_INVALID_VALUE, "ctx: is NULL");           \
    } while (0)

fa_status fa_context_create(fa_backend backend, int device, fa_context **ctx)
{
    if (!ctx) return fa_set_error(FA_ERROR_INVALID_VALUE, "ctx: output pointer is NULL");
    *ctx = NULL;
    if (device < 0) return fa_set_error(FA_ERROR_INVALID_VALUE, "device: %d is negative", device);
    fa_backend kind;
    fa_status st = fa_registry_resolve(backend, &kind);
    if (st != FA_SUCCESS) return st;
    const fa_backend_iface *iface = fa_registry_get(kind);
    if (!iface) return FA_ERROR_BACKEND_UNAVAILABLE; /* reason already recorded */
    const int devices = iface->device_count();
    if (device >= devices)
        return fa_set_error(FA_ERROR_INVALID_VALUE, "device: %d out of range, the %s backend has %d device(s)",
                            device, iface->name, devices);
    fa_context *c = fa_host_calloc(1, sizeof *c);
    if (!c) return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "ctx: cannot allocate the context");
    c->iface = iface;
    c->kind = kind;
    c->device = device;
    st = iface->open(device, &c->state);
    if (st != FA_SUCCESS) {
        fa_host_free(c);
        return st;
    }
    *ctx = c;
    return FA_SUCCESS;
}

void fa_context_destroy(fa_context *ctx)
{
    if (!ctx) return;
    ctx->iface->close(ctx->state);
    fa_host_free(ctx);
}

fa_backend fa_context_backend(const fa_context *ctx) { return ctx ? ctx->kind : FA_BACKEND_AUTO; }

fa_status fa_context_set_num_threads(fa_context *ctx, int n)
{
    CHECK_CTX(ctx);
    if (n < 0) return fa_set_error(FA_ERROR_INVALID_VALUE, "n: thread count %d is negative", n);
    return ctx->iface->set_num_threads(ctx->state, n);
}

fa_status fa_context_set_stream(fa_context *ctx, void *stream)
{
    CHECK_CTX(ctx);
    return ctx->iface->set_stream(ctx->state, stream);
}

fa_status fa_synchronize(fa_context *ctx)
{
    CHECK_CTX(ctx);
    return ctx->iface->synchronize(ctx->state);
}

fa_status fa_malloc(fa_context *ctx, size_t bytes, void **ptr)
{
    CHECK_CTX(ctx);
    if (!ptr) return fa_set_error(FA_ERROR_INVALID_VALUE, "ptr: output pointer is NULL");
    *ptr = NULL;
    if (bytes == 0) return fa_set_error(FA_ERROR_INVALID_VALUE, "bytes: is 0");
    return ctx->iface->mem_alloc(ctx->state, bytes, ptr);
}

fa_status fa_free(fa_context *ctx, void *ptr)
{
    CHECK_CTX(ctx);
    if (!ptr) return FA_SUCCESS;
    return ctx->iface->mem_free(ctx->state, ptr);
}

static fa_status check_copy(const void *dst, const void *src)
{
    if (!dst) return fa_set_error(FA_ERROR_INVALID_VALUE, "dst: is NULL");
    if (!src) return fa_set_error(FA_ERROR_INVALID_VALUE, "src: is NULL");
    return FA_SUCCESS;
}

fa_status fa_memcpy_h2d(fa_context *ctx, void *dst, const void *src, size_t bytes)
{
    CHECK_CTX(ctx);
    if (bytes == 0) return FA_SUCCESS;
    fa_status st = check_copy(dst, src);
    return st != FA_SUCCESS ? st : ctx->iface->copy_h2d(ctx->state, dst, src, bytes);
}

fa_status fa_memcpy_d2h(fa_context *ctx, void *dst, const void *src, size_t bytes)
{
    CHECK_CTX(ctx);
    if (bytes == 0) return FA_SUCCESS;
    fa_status st = check_copy(dst, src);
    return st != FA_SUCCESS ? st : ctx->iface->copy_d2h(ctx->state, dst, src, bytes);
}

fa_status fa_context_tiling(fa_context *ctx, int64_t head_dim, fa_dtype dtype, fa_tiling *tiling,
                            int64_t *sram_elements)
{
    CHECK_CTX(ctx);
    if (!tiling) return fa_set_error(FA_ERROR_INVALID_VALUE, "tiling: is NULL");
    if (head_dim <= 0) return fa_set_error(FA_ERROR_INVALID_VALUE, "head_dim: %lld is not positive", (long long)head_dim);
    if (!fa_dtype_known(dtype))
        return fa_set_error(FA_ERROR_INVALID_VALUE, "dtype: unknown dtype %d", (int)dtype);
    int64_t sram = 0;
    fa_status st = ctx->iface->tiling(ctx->state, head_dim, dtype, tiling, &sram);
    if (st == FA_SUCCESS && sram_elements) *sram_elements = sram;
    return st;
}

const char *fa_context_info(fa_context *ctx)
{
    if (!ctx) {
        fa_set_error(FA_ERROR_INVALID_VALUE, "ctx: is NULL");
        return "";
    }
    return ctx->iface->info(ctx->state);
}

fa_status fa_context_backend_state(fa_context *ctx, const fa_backend_iface **iface, void **state)
{
    CHECK_CTX(ctx);
    *iface = ctx->iface;
    *state = ctx->state;
    return FA_SUCCESS;
}

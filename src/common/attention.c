/* The attention entry points: validate once, then hand the problem to the context's backend. */
#include <math.h>
#include <stddef.h>

#include "context.h"
#include "error.h"
#include "sized_struct.h"
#include "tiling.h"
#include "validate.h"

void fa_attention_desc_init(fa_attention_desc *desc)
{
    if (!desc) return;
    *desc = (fa_attention_desc){0};
    desc->struct_size = sizeof *desc;
    desc->window_left = -1;
    desc->window_right = -1;
}

/* The caller's desc, read once into a complete copy (fields past its struct_size take their
 * defaults); validation and backends only ever see this copy. The smallest accepted layout is the
 * one that ended at block_mask (0.2 before varlen). */
static fa_status read_desc(const fa_attention_desc *desc, fa_attention_desc *full)
{
    fa_attention_desc_init(full);
    return fa_sized_struct_read("desc", desc, offsetof(fa_attention_desc, varlen), sizeof *full, full);
}

/* The values a validated problem's tables hold, where the core can read them (host memory);
 * in device memory they are the backend's to check, without a host sync. */
static fa_status check_host_tables(const fa_backend_iface *iface, fa_op op, const fa_problem *p)
{
    if (!(iface->features & FA_BACKEND_HOST_MEMORY)) return FA_SUCCESS;
    fa_status st = fa_modifiers_any(&p->modifiers) ? fa_validate_modifier_values(p) : FA_SUCCESS;
    if (op == FA_OP_FORWARD_KVCACHE) /* its packed offsets are the cache's tables */
        return st == FA_SUCCESS ? fa_validate_kvcache_tables((const fa_kv_problem *)(const void *)p) : st;
    if (st == FA_SUCCESS && p->varlen.batch) st = fa_validate_varlen_offsets(p);
    return st;
}

/* The backend's answer to "can you run p?", then the host tables' values. */
static fa_status check_supported(const fa_backend_iface *iface, void *state, fa_op op, const fa_problem *p)
{
    fa_status st = iface->supports(state, op, p);
    return st == FA_SUCCESS ? check_host_tables(iface, op, p) : st;
}

/* One attention call on its way to the backend: the context's interface and state, and the
 * caller's desc read once. Every entry point starts with call_begin. */
typedef struct attention_call {
    const fa_backend_iface *iface;
    void *state;
    fa_attention_desc desc;
} attention_call;

static fa_status call_begin(fa_context *ctx, const fa_attention_desc *desc, attention_call *call)
{
    fa_status st = fa_context_backend_state(ctx, &call->iface, &call->state);
    return st == FA_SUCCESS ? read_desc(desc, &call->desc) : st;
}

/* The validated problem of a forward or backward (validated: the validation's status) handed to
 * run, one of the backend's entry points, once the backend says it supports it. */
static fa_status call_run(const attention_call *call, fa_status validated, fa_op op, const fa_problem *p,
                          fa_status (*run)(void *state, const fa_problem *p))
{
    fa_status st = validated == FA_SUCCESS ? check_supported(call->iface, call->state, op, p) : validated;
    return st == FA_SUCCESS ? run(call->state, p) : st;
}

fa_status fa_forward(fa_context *ctx, const fa_attention_desc *desc, const fa_tensor *q, const fa_tensor *k,
                     const fa_tensor *v, fa_tensor *out, float *lse)
{
    attention_call call;
    fa_problem p;
    fa_status st = call_begin(ctx, desc, &call);
    if (st != FA_SUCCESS) return st;
    st = fa_validate_forward(&call.desc, q, k, v, out, lse, &p);
    return call_run(&call, st, FA_OP_FORWARD, &p, call.iface->forward);
}

fa_status fa_backward(fa_context *ctx, const fa_attention_desc *desc, const fa_tensor *q, const fa_tensor *k,
                      const fa_tensor *v, const fa_tensor *out, const fa_tensor *dout, const float *lse,
                      fa_tensor *dq, fa_tensor *dk, fa_tensor *dv)
{
    return fa_backward_ex(ctx, desc, q, k, v, out, dout, lse, dq, dk, dv, NULL, NULL);
}

fa_status fa_backward_ex(fa_context *ctx, const fa_attention_desc *desc, const fa_tensor *q, const fa_tensor *k,
                         const fa_tensor *v, const fa_tensor *out, const fa_tensor *dout, const float *lse,
                         fa_tensor *dq, fa_tensor *dk, fa_tensor *dv, float *dsinks, const fa_bias *dbias)
{
    attention_call call;
    fa_problem p;
    fa_status st = call_begin(ctx, desc, &call);
    if (st != FA_SUCCESS) return st;
    st = fa_validate_backward(&call.desc, q, k, v, out, dout, lse, dq, dk, dv, dsinks, dbias, &p);
    return call_run(&call, st, FA_OP_BACKWARD, &p, call.iface->backward);
}

void fa_kv_slots_init(fa_kv_slots *slots)
{
    if (!slots) return;
    *slots = (fa_kv_slots){0};
    slots->struct_size = sizeof *slots;
}

void fa_kv_scales_init(fa_kv_scales *scales)
{
    if (!scales) return;
    *scales = (fa_kv_scales){0};
    scales->struct_size = sizeof *scales;
}

void fa_rotary_init(fa_rotary *rotary)
{
    if (!rotary) return;
    *rotary = (fa_rotary){0};
    rotary->struct_size = sizeof *rotary;
}

fa_status fa_kvcache_append(fa_context *ctx, const fa_attention_desc *desc, const fa_kv_cache *cache,
                            const fa_kv_slots *slots, const fa_tensor *k_new, const fa_tensor *v_new)
{
    attention_call call;
    fa_kv_problem p;
    fa_status st = call_begin(ctx, desc, &call);
    if (st == FA_SUCCESS) st = fa_validate_kvcache_append(&call.desc, cache, slots, k_new, v_new, &p);
    if (st == FA_SUCCESS) st = check_supported(call.iface, call.state, FA_OP_FORWARD_KVCACHE, &p.attn);
    if (st == FA_SUCCESS && !call.iface->kvcache_append)
        st = fa_set_error(FA_ERROR_NOT_SUPPORTED, "fa_kvcache_append: the %s backend does not implement it yet%s",
                          call.iface->name, call.iface->abi_version < 8u ? " (its plugin predates it: rebuild it)" : "");
    return st == FA_SUCCESS ? call.iface->kvcache_append(call.state, &p) : st;
}

fa_status fa_forward_kvcache(fa_context *ctx, const fa_attention_desc *desc, const fa_tensor *q,
                             const fa_kv_cache *cache, const fa_tensor *k_new, const fa_tensor *v_new, fa_tensor *out,
                             float *lse)
{
    return fa_forward_kvcache_ex(ctx, desc, q, cache, NULL, k_new, v_new, out, lse);
}

fa_status fa_forward_kvcache_ex(fa_context *ctx, const fa_attention_desc *desc, const fa_tensor *q,
                                const fa_kv_cache *cache, const fa_kv_slots *slots, const fa_tensor *k_new,
                                const fa_tensor *v_new, fa_tensor *out, float *lse)
{
    attention_call call;
    fa_kv_problem p;
    fa_status st = call_begin(ctx, desc, &call);
    if (st == FA_SUCCESS) st = fa_validate_kvcache(&call.desc, q, cache, slots, k_new, v_new, out, lse, &p);
    if (st == FA_SUCCESS) st = check_supported(call.iface, call.state, FA_OP_FORWARD_KVCACHE, &p.attn);
    return st == FA_SUCCESS ? call.iface->forward_kvcache(call.state, &p) : st;
}

fa_status fa_workspace_size(fa_context *ctx, const fa_attention_desc *desc, const fa_tensor *q,
                            const fa_kv_cache *cache, const fa_kv_slots *slots, const fa_tensor *k_new,
                            const fa_tensor *v_new, const fa_tensor *out, const float *lse, size_t *bytes)
{
    if (!bytes) return fa_set_error(FA_ERROR_INVALID_VALUE, "bytes: is NULL");
    *bytes = 0;
    attention_call call;
    fa_kv_problem p;
    fa_status st = call_begin(ctx, desc, &call);
    if (st == FA_SUCCESS) st = fa_validate_kvcache(&call.desc, q, cache, slots, k_new, v_new, out, (float *)lse, &p);
    if (st == FA_SUCCESS) st = call.iface->supports(call.state, FA_OP_FORWARD_KVCACHE, &p.attn);
    if (st != FA_SUCCESS || !call.iface->kvcache_workspace) return st;
    return call.iface->kvcache_workspace(call.state, &p, bytes);
}

fa_status fa_context_set_workspace(fa_context *ctx, void *workspace, size_t bytes)
{
    const fa_backend_iface *iface;
    void *state;
    fa_status st = fa_context_backend_state(ctx, &iface, &state);
    if (st != FA_SUCCESS) return st;
    if (workspace && bytes == 0) return fa_set_error(FA_ERROR_INVALID_VALUE, "bytes: is 0 for a non-NULL workspace");
    if (!iface->set_workspace) {
        if (iface->features & FA_BACKEND_HOST_MEMORY) return FA_SUCCESS; /* per-call host scratch: nothing to hand over */
        return fa_set_error(FA_ERROR_NOT_SUPPORTED, "ctx: the %s plugin predates caller workspaces (rebuild it)",
                            iface->name);
    }
    return iface->set_workspace(state, workspace, bytes);
}

fa_tiling fa_tiling_for(int64_t sram_elements, int64_t head_dim)
{
    fa_tiling t;
    fa_paper_tiles(sram_elements, head_dim, &t.block_rows, &t.block_cols);
    return t;
}

#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)
const char *fa_version_string(void)
{
    return FA_STR(FA_VERSION_MAJOR) "." FA_STR(FA_VERSION_MINOR) "." FA_STR(FA_VERSION_PATCH);
}
unsigned fa_version_number(void) { return FA_VERSION_NUMBER; }

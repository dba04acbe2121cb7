/* fa_merge_partials: attention over a key set split into disjoint parts, recombined by the parts'
 * log-sum-exp (the row rule: merge_rule.h). The arguments are checked here for every backend;
 * host-memory backends merge here, device-memory ones in their merge_partials (plugin ABI 5). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "backend.h"
#include "dtype.h"
#include "error.h"
#include "half.h"
#include "merge_rule.h"
#include "validate.h"

#define INVALID(...) fa_set_error(FA_ERROR_INVALID_VALUE, __VA_ARGS__)

fa_status fa_context_backend_state(fa_context *ctx, const fa_backend_iface **iface, void **state);

/* The bytes [lo, hi) an array occupies. */
typedef struct byte_span { uintptr_t lo, hi; } byte_span;

static byte_span tensor_span(const fa_tensor *t) /* t has explicit strides */
{
    const int64_t last = (t->batch - 1) * t->stride_batch + (t->seqlen - 1) * t->stride_seq +
                         (t->heads - 1) * t->stride_head + t->head_dim;
    const uintptr_t lo = (uintptr_t)t->data;
    return (byte_span){lo, lo + (uintptr_t)last * fa_dtype_size(t->dtype)};
}

static int overlap(byte_span a, byte_span b) { return a.lo < b.hi && b.lo < a.hi; }

static float load(const fa_tensor *t, const void *row, int64_t x)
{
    switch (t->dtype) {
    case FA_DTYPE_F16: return fa_f16_to_f32(((const uint16_t *)row)[x]);
    case FA_DTYPE_BF16: return fa_bf16_to_f32(((const uint16_t *)row)[x]);
    default: return ((const float *)row)[x];
    }
}

static void store(const fa_tensor *t, void *row, int64_t x, float value)
{
    switch (t->dtype) {
    case FA_DTYPE_F16: ((uint16_t *)row)[x] = fa_f32_to_f16(value); break;
    case FA_DTYPE_BF16: ((uint16_t *)row)[x] = fa_f32_to_bf16(value); break;
    default: ((float *)row)[x] = value;
    }
}

static const void *row_at(const fa_tensor *t, int64_t b, int64_t s, int64_t h)
{
    return (const char *)t->data +
           (b * t->stride_batch + s * t->stride_seq + h * t->stride_head) * (int64_t)fa_dtype_size(t->dtype);
}

/* Every argument checked; parts[] gets the inputs with explicit strides. */
static fa_status check_merge(int n, const fa_tensor *const *outs, const float *const *lses, const fa_tensor *out,
                             const float *lse_out, fa_tensor *target, fa_tensor *parts)
{
    if (n < 1) return INVALID("n: %d parts, at least 1 needed", n);
    if (!outs) return INVALID("outs: is NULL");
    if (!lses) return INVALID("lses: is NULL");
    /* outs[0] before out: a binding that allocates out copies outs[0]'s shape, and the fault is outs[0]'s. */
    fa_status st = fa_validate_tensor("outs[0]", outs[0], &parts[0]);
    if (st || (st = fa_validate_tensor("out", out, target))) return st;
    int64_t rows;
    if (!fa_checked_mul(out->batch, out->heads, &rows) || !fa_checked_mul(rows, out->seqlen, &rows) ||
        !fa_checked_mul(rows, (int64_t)sizeof(float), &(int64_t){0}))
        return INVALID("out: its lse has more than 2^63 bytes");
    const uintptr_t lse_bytes = (uintptr_t)rows * sizeof(float);
    const byte_span out_span = tensor_span(target);
    const byte_span lse_out_span = {(uintptr_t)lse_out, (uintptr_t)lse_out + (lse_out ? lse_bytes : 0)};
    if ((uintptr_t)lse_out % sizeof(float) != 0) return INVALID("lse_out: is not aligned to 4-byte floats");
    if (overlap(out_span, lse_out_span)) return INVALID("lse_out: overlaps out");
    char name[32];
    for (int c = 0; c < n; ++c) {
        snprintf(name, sizeof name, "outs[%d]", c);
        if ((st = fa_validate_tensor(name, outs[c], &parts[c])) ||
            (st = fa_validate_same_shape(name, outs[c], "out", out)))
            return st;
        if (!lses[c]) return INVALID("lses[%d]: is NULL", c);
        if ((uintptr_t)lses[c] % sizeof(float) != 0) return INVALID("lses[%d]: is not aligned to 4-byte floats", c);
        const byte_span part_span = tensor_span(&parts[c]);
        const byte_span lse_span = {(uintptr_t)lses[c], (uintptr_t)lses[c] + lse_bytes};
        if (overlap(out_span, part_span)) return INVALID("out: overlaps outs[%d] (the merge writes a new array)", c);
        if (overlap(out_span, lse_span)) return INVALID("out: overlaps lses[%d]", c);
        if (lse_out && overlap(lse_out_span, lse_span)) return INVALID("lse_out: overlaps lses[%d]", c);
        if (lse_out && overlap(lse_out_span, part_span)) return INVALID("lse_out: overlaps outs[%d]", c);
    }
    return FA_SUCCESS;
}

/* The host merge of checked arguments: one row at a time, by merge_rule.h. */
static fa_status merge_on_host(int n, const fa_tensor *parts, const float *const *lses, const fa_tensor *target,
                               float *lse_out)
{
    float *weights = fa_host_alloc((size_t)n * sizeof *weights);
    float *acc = fa_host_alloc((size_t)target->head_dim * sizeof *acc);
    if (!weights || !acc) {
        fa_host_free(weights);
        fa_host_free(acc);
        return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "fa_merge_partials: %d parts of scratch", n);
    }
    for (int64_t b = 0; b < target->batch; ++b)
        for (int64_t h = 0; h < target->heads; ++h)
            for (int64_t s = 0; s < target->seqlen; ++s) {
                const int64_t row = (b * target->heads + h) * target->seqlen + s, d = target->head_dim;
                fa_merge_row r = fa_merge_row_start();
                for (int c = 0; c < n; ++c) fa_merge_see(&r, lses[c][row]);
                float sum = 0.0f;
                for (int c = 0; c < n; ++c) {
                    weights[c] = fa_merge_weight(&r, lses[c][row]);
                    sum += weights[c];
                }
                memset(acc, 0, (size_t)d * sizeof *acc);
                for (int c = 0; c < n; ++c) {
                    if (weights[c] == 0.0f) continue;
                    const void *in = row_at(&parts[c], b, s, h);
                    for (int64_t x = 0; x < d; ++x) acc[x] = fa_merge_accumulate(acc[x], weights[c], load(&parts[c], in, x));
                }
                const float factor = fa_merge_factor(&r, sum);
                void *dst = (void *)row_at(target, b, s, h);
                for (int64_t x = 0; x < d; ++x) store(target, dst, x, acc[x] * factor);
                if (lse_out) lse_out[row] = fa_merge_lse(&r, sum);
            }
    fa_host_free(weights);
    fa_host_free(acc);
    return FA_SUCCESS;
}

fa_status fa_merge_partials(fa_context *ctx, int n, const fa_tensor *const *outs, const float *const *lses,
                            fa_tensor *out, float *lse_out)
{
    const fa_backend_iface *iface;
    void *state;
    fa_status st = fa_context_backend_state(ctx, &iface, &state);
    if (st) return st;
    const int on_host = (iface->features & FA_BACKEND_HOST_MEMORY) != 0;
    if (!on_host && !iface->merge_partials)
        return fa_set_error(FA_ERROR_NOT_SUPPORTED, "fa_merge_partials: the %s backend's tensors are device memory and "
                            "it has no device merge (a plugin older than ABI 5, or one without it); merge on the host",
                            iface->name);
    fa_tensor target;
    fa_tensor *parts = n >= 1 ? fa_host_alloc((size_t)n * sizeof *parts) : NULL;
    if (n >= 1 && !parts) return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "fa_merge_partials: %d parts of scratch", n);
    st = check_merge(n, outs, lses, out, lse_out, &target, parts);
    if (!st && on_host) st = merge_on_host(n, parts, lses, &target, lse_out);
    if (!st && !on_host) {
        const fa_merge_problem p = {n, parts, lses, target, lse_out};
        st = iface->merge_partials(state, &p);
    }
    fa_host_free(parts);
    return st;
}

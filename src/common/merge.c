/* fa_merge_partials: attention over a key set split into disjoint parts, recombined by the parts'
 * log-sum-exp. With part c's normalised output O_c and lse L_c, and M = max_c L_c:
 *   w_c = exp(L_c - M),  O = sum_c w_c O_c / sum_c w_c,  L = M + log(sum_c w_c),
 * summed in the order the parts are given, so the result is deterministic. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "backend.h"
#include "dtype.h"
#include "error.h"
#include "half.h"
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
    fa_status st = fa_validate_tensor("out", out, target);
    if (st) return st;
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

fa_status fa_merge_partials(fa_context *ctx, int n, const fa_tensor *const *outs, const float *const *lses,
                            fa_tensor *out, float *lse_out)
{
    const fa_backend_iface *iface;
    void *state;
    fa_status st = fa_context_backend_state(ctx, &iface, &state);
    if (st) return st;
    if (!(iface->features & FA_BACKEND_HOST_MEMORY))
        return fa_set_error(FA_ERROR_NOT_SUPPORTED, "fa_merge_partials: the %s backend's tensors are device memory; "
                            "only host-memory backends (cpu) merge yet", iface->name);
    fa_tensor target;
    fa_tensor *parts = n >= 1 ? fa_host_alloc((size_t)n * sizeof *parts) : NULL;
    float *weights = n >= 1 ? fa_host_alloc((size_t)n * sizeof *weights) : NULL;
    float *acc = out && out->head_dim > 0 ? fa_host_alloc((size_t)out->head_dim * sizeof *acc) : NULL;
    if (n >= 1 && (!parts || !weights || (out && out->head_dim > 0 && !acc)))
        st = fa_set_error(FA_ERROR_OUT_OF_MEMORY, "fa_merge_partials: %d parts of scratch", n);
    if (!st) st = check_merge(n, outs, lses, out, lse_out, &target, parts);
    for (int64_t b = 0; !st && b < target.batch; ++b)
        for (int64_t h = 0; h < target.heads; ++h)
            for (int64_t s = 0; s < target.seqlen; ++s) {
                const int64_t row = (b * target.heads + h) * target.seqlen + s, d = target.head_dim;
                float top = -INFINITY, sum = 0.0f;
                int poisoned = 0; /* a NaN (or +inf) lse: the row is NaN, as a NaN score makes it */
                for (int c = 0; c < n; ++c) {
                    const float l = lses[c][row];
                    if (isnan(l) || l == INFINITY) poisoned = 1;
                    else if (l > top) top = l;
                }
                for (int c = 0; c < n; ++c) {
                    const float l = lses[c][row];
                    weights[c] = poisoned || top == -INFINITY || l == -INFINITY ? 0.0f : expf(l - top);
                    sum += weights[c];
                }
                memset(acc, 0, (size_t)d * sizeof *acc);
                for (int c = 0; c < n && sum > 0.0f; ++c) {
                    if (weights[c] == 0.0f) continue; /* a part with no visible key holds zeros */
                    const void *in = row_at(&parts[c], b, s, h);
                    for (int64_t x = 0; x < d; ++x) acc[x] += weights[c] * load(&parts[c], in, x);
                }
                const float inv = poisoned ? NAN : sum > 0.0f ? 1.0f / sum : 0.0f;
                void *dst = (void *)row_at(&target, b, s, h);
                for (int64_t x = 0; x < d; ++x) store(&target, dst, x, poisoned ? NAN : acc[x] * inv);
                if (lse_out) lse_out[row] = poisoned ? NAN : top == -INFINITY ? -INFINITY : top + logf(sum);
            }
    fa_host_free(parts);
    fa_host_free(weights);
    fa_host_free(acc);
    return st;
}

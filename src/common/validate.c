#include "validate.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"
#include "error.h"
#include "sized_struct.h"
#include "table_checks.h"
#include "tensor_strides.h"

#define INVALID(...) fa_set_error(FA_ERROR_INVALID_VALUE, __VA_ARGS__)

int fa_checked_mul(int64_t a, int64_t b, int64_t *result)
{
    if (a < 0 || b < 0) return 0;
    if (a != 0 && b > INT64_MAX / a) return 0;
    *result = a * b;
    return 1;
}

int fa_checked_add(int64_t a, int64_t b, int64_t *result)
{
    if (a < 0 || b < 0 || a > INT64_MAX - b) return 0;
    *result = a + b;
    return 1;
}

/* Checks one tensor (of a known dtype, or also a quantised one) and returns it with explicit strides. */
static fa_status check_tensor(const char *name, const fa_tensor *t, int quantised_ok, fa_tensor *out)
{
    if (!t) return INVALID("%s: is NULL", name);
    if (!t->data) return INVALID("%s: data is NULL", name);
    if (fa_dtype_quantised(t->dtype) && !quantised_ok)
        return INVALID("%s: dtype %d is a KV cache's quantised type (only cache->k and cache->v may hold it)", name,
                       (int)t->dtype);
    if (!fa_dtype_known(t->dtype) && !fa_dtype_quantised(t->dtype)) return INVALID("%s: unknown dtype %d", name, (int)t->dtype);
    /* Element access through a misaligned pointer is undefined behaviour (and faults on GPUs). */
    if ((uintptr_t)t->data % fa_dtype_size(t->dtype) != 0)
        return INVALID("%s: data is not aligned to its %zu-byte elements", name, fa_dtype_size(t->dtype));
    const int64_t dims[4] = {t->batch, t->seqlen, t->heads, t->head_dim};
    static const char *const dim_names[4] = {"batch", "seqlen", "heads", "head_dim"};
    for (int i = 0; i < 4; ++i)
        if (dims[i] <= 0) return INVALID("%s: %s %lld is not positive", name, dim_names[i], (long long)dims[i]);
    if (!fa_tensor_explicit_strides(t, out)) return INVALID("%s: element count overflows 64 bits", name);
    if (!fa_tensor_is_packed(t) && (t->stride_batch <= 0 || t->stride_seq <= 0 || t->stride_head <= 0)) {
        return INVALID("%s: strides (%lld, %lld, %lld) must be all 0 (packed) or all positive", name,
                       (long long)t->stride_batch, (long long)t->stride_seq, (long long)t->stride_head);
    }
    /* The largest element offset, and its byte offset, must fit: no index arithmetic overflows. */
    int64_t count, last = t->head_dim - 1, term, bytes;
    const int64_t extents[3][2] = {{t->batch - 1, out->stride_batch}, {t->seqlen - 1, out->stride_seq},
                                   {t->heads - 1, out->stride_head}};
    int ok = fa_checked_mul(t->batch, t->seqlen, &count) && fa_checked_mul(count, t->heads, &count) &&
             fa_checked_mul(count, t->head_dim, &count);
    for (int i = 0; ok && i < 3; ++i)
        ok = fa_checked_mul(extents[i][0], extents[i][1], &term) && fa_checked_add(last, term, &last);
    ok = ok && fa_checked_add(last, 1, &last) && fa_checked_mul(last, (int64_t)fa_dtype_size(t->dtype), &bytes);
    if (!ok) return INVALID("%s: element count overflows 64 bits", name);
    return FA_SUCCESS;
}

fa_status fa_validate_tensor(const char *name, const fa_tensor *t, fa_tensor *out) { return check_tensor(name, t, 0, out); }

/* The four sizes of t equal ref's (dtypes may differ: a quantised cache's k and v, their new tokens). */
static fa_status check_same_sizes(const char *name, const fa_tensor *t, const char *ref_name, const fa_tensor *ref)
{
    if (t->batch != ref->batch || t->seqlen != ref->seqlen || t->heads != ref->heads || t->head_dim != ref->head_dim)
        return INVALID("%s: shape [%lld, %lld, %lld, %lld] differs from %s [%lld, %lld, %lld, %lld]", name,
                       (long long)t->batch, (long long)t->seqlen, (long long)t->heads, (long long)t->head_dim,
                       ref_name, (long long)ref->batch, (long long)ref->seqlen, (long long)ref->heads,
                       (long long)ref->head_dim);
    return FA_SUCCESS;
}

fa_status fa_validate_same_shape(const char *name, const fa_tensor *t, const char *ref_name, const fa_tensor *ref)
{
    const fa_status st = check_same_sizes(name, t, ref_name, ref);
    if (st != FA_SUCCESS) return st;
    if (t->dtype != ref->dtype) return INVALID("%s: dtype differs from %s", name, ref_name);
    return FA_SUCCESS;
}

/* The packed layout's shape rules (the offsets' values are checked by fa_validate_varlen_offsets,
 * where the backend's memory is host memory). */
static fa_status check_varlen(const fa_attention_desc *desc, fa_problem *p)
{
    const fa_varlen *vl = desc->varlen;
    if (vl->batch <= 0) return INVALID("desc->varlen->batch: %lld is not positive", (long long)vl->batch);
    if (!vl->cu_seqlens_q) return INVALID("desc->varlen->cu_seqlens_q: is NULL");
    if (!vl->cu_seqlens_k) return INVALID("desc->varlen->cu_seqlens_k: is NULL");
    if (vl->max_seqlen_q <= 0 || vl->max_seqlen_k <= 0)
        return INVALID("desc->varlen->max_seqlen_q, max_seqlen_k: %lld, %lld must be positive",
                       (long long)vl->max_seqlen_q, (long long)vl->max_seqlen_k);
    if (p->shape.batch != 1)
        return INVALID("q: batch %lld must be 1 with desc->varlen (sequences are packed along seqlen)",
                       (long long)p->shape.batch);
    if (desc->seqlens_k) return INVALID("desc->seqlens_k: must be NULL with desc->varlen (use cu_seqlens_k)");
    p->varlen = *vl;
    p->outputs.lse_stride_batch = 0;
    p->outputs.lse_stride_head = p->shape.seqlen_q; /* [heads_q, total_q] */
    p->dropout.rows = vl->max_seqlen_q;
    p->dropout.cols = vl->max_seqlen_k;
    return FA_SUCCESS;
}

/* A table fault as the caller's error (table_checks.h holds the rule and the words). */
static fa_status table_fault_error(const fa_table_fault *f)
{
    char message[256];
    fa_table_fault_message(f, message, sizeof message);
    return INVALID("%s", message);
}

fa_status fa_validate_varlen_offsets(const fa_problem *p)
{
    fa_table_fault f;
    return fa_check_varlen_tables(&f, &p->varlen, p->shape.seqlen_q, p->shape.seqlen_k) ? FA_SUCCESS : table_fault_error(&f);
}

/* A bias over extent {batch, heads, rows, keys}; key stride 1. */
static fa_status check_bias(const char *name, const fa_bias *bias, const int64_t extent[4], fa_bias *out)
{
    if (!bias->data) return INVALID("%s->data: is NULL", name);
    if (!fa_dtype_known(bias->dtype)) return INVALID("%s->dtype: unknown dtype %d", name, (int)bias->dtype);
    if ((uintptr_t)bias->data % fa_dtype_size(bias->dtype) != 0)
        return INVALID("%s->data: is not aligned to its %zu-byte elements", name, fa_dtype_size(bias->dtype));
    const int64_t strides[3] = {bias->stride_batch, bias->stride_head, bias->stride_q};
    static const char *const stride_names[3] = {"stride_batch", "stride_head", "stride_q"};
    int64_t last = extent[3] - 1, term, bytes;
    for (int i = 0; i < 3; ++i) {
        if (strides[i] < 0)
            return INVALID("%s->%s: %lld is negative (0 broadcasts)", name, stride_names[i], (long long)strides[i]);
        if (!fa_checked_mul(extent[i] - 1, strides[i], &term) || !fa_checked_add(last, term, &last))
            return INVALID("%s->%s: element offsets overflow 64 bits", name, stride_names[i]);
    }
    if (!fa_checked_add(last, 1, &last) || !fa_checked_mul(last, (int64_t)fa_dtype_size(bias->dtype), &bytes))
        return INVALID("%s: element offsets overflow 64 bits", name);
    *out = *bias;
    return FA_SUCCESS;
}

/* dbias is written: it has the bias's broadcast axes, and no two of its elements share memory
 * (its axes, sorted by stride, each step over the whole extent of the smaller ones). */
static fa_status check_dbias(const fa_bias *dbias, const fa_bias *bias, const int64_t extent[4], fa_bias *out)
{
    fa_status st = check_bias("dbias", dbias, extent, out);
    if (st) return st;
    const int64_t strides[3] = {dbias->stride_batch, dbias->stride_head, dbias->stride_q};
    const int64_t bias_strides[3] = {bias->stride_batch, bias->stride_head, bias->stride_q};
    static const char *const stride_names[3] = {"stride_batch", "stride_head", "stride_q"};
    int order[3], axes = 0;
    for (int i = 0; i < 3; ++i) {
        if ((strides[i] == 0) != (bias_strides[i] == 0))
            return INVALID("dbias->%s: %lld where desc->bias->%s is %lld (dbias broadcasts where the bias does)",
                           stride_names[i], (long long)strides[i], stride_names[i], (long long)bias_strides[i]);
        if (strides[i] != 0 && extent[i] > 1) order[axes++] = i;
    }
    for (int a = 1; a < axes; ++a) /* insertion sort by stride */
        for (int x = a; x > 0 && strides[order[x]] < strides[order[x - 1]]; --x) {
            const int t = order[x];
            order[x] = order[x - 1];
            order[x - 1] = t;
        }
    int64_t span = extent[3]; /* elements covered by the axes so far */
    for (int a = 0; a < axes; ++a) {
        const int i = order[a];
        if (strides[i] < span)
            return INVALID("dbias->%s: %lld makes elements overlap (needs at least %lld)", stride_names[i],
                           (long long)strides[i], (long long)span);
        span = (extent[i] - 1) * strides[i] + span; /* no overflow: check_bias bounded the offsets */
    }
    return FA_SUCCESS;
}

/* Softcap, ALiBi, sinks and bias: their shapes and scalars (values in the context's memory are
 * read by fa_validate_modifier_values, where that is host memory). bias_extent: {batch, heads_q,
 * rows, keys} of the bias grid. */
static fa_status check_modifiers(const fa_attention_desc *desc, fa_problem *p, const int64_t bias_extent[4])
{
    if (!(desc->softcap >= 0.0f) || isinf(desc->softcap))
        return INVALID("desc->softcap: %g must be finite and >= 0 (0 = off)", (double)desc->softcap);
    if (desc->alibi_per_batch != 0 && desc->alibi_per_batch != 1)
        return INVALID("desc->alibi_per_batch: %d is not 0 or 1", desc->alibi_per_batch);
    if (desc->alibi_per_batch && !desc->alibi_slopes)
        return INVALID("desc->alibi_per_batch: is 1 but desc->alibi_slopes is NULL");
    if ((uintptr_t)desc->alibi_slopes % sizeof(float) != 0)
        return INVALID("desc->alibi_slopes: is not aligned to 4-byte floats");
    if ((uintptr_t)desc->sinks % sizeof(float) != 0) return INVALID("desc->sinks: is not aligned to 4-byte floats");
    if (desc->bias) {
        fa_status st = check_bias("desc->bias", desc->bias, bias_extent, &p->modifiers.bias);
        if (st) return st;
    }
    p->modifiers.softcap = desc->softcap;
    p->modifiers.alibi_slopes = desc->alibi_slopes;
    p->modifiers.alibi_stride_batch = desc->alibi_per_batch ? p->shape.heads_q : 0;
    p->modifiers.sinks = desc->sinks;
    return FA_SUCCESS;
}

fa_status fa_validate_modifier_values(const fa_problem *p)
{
    fa_table_fault f;
    const int64_t batches = p->varlen.batch ? p->varlen.batch : p->shape.batch;
    return fa_check_modifier_values(&f, &p->modifiers, batches, p->shape.heads_q) ? FA_SUCCESS : table_fault_error(&f);
}

/* desc->q_offset, k_offset, seqlen_q_global, seqlen_k_global: this call as a block of a larger
 * dense problem. Sets the problem's diagonal and dropout coordinates, and *grid_q, *grid_k to the
 * global lengths (the dropout index's extent). */
static fa_status check_positions(const fa_attention_desc *desc, fa_problem *p, int64_t *grid_q, int64_t *grid_k)
{
    const int64_t offsets[2] = {desc->q_offset, desc->k_offset};
    const int64_t globals[2] = {desc->seqlen_q_global, desc->seqlen_k_global};
    const int64_t locals[2] = {p->shape.seqlen_q, p->shape.seqlen_k};
    static const char *const offset_names[2] = {"q_offset", "k_offset"};
    static const char *const global_names[2] = {"seqlen_q_global", "seqlen_k_global"};
    static const char *const local_names[2] = {"q's seqlen", "k's seqlen"};
    int64_t resolved[2];
    if (desc->q_offset == 0 && desc->k_offset == 0 && desc->seqlen_q_global == 0 && desc->seqlen_k_global == 0)
        return FA_SUCCESS;
    if (desc->varlen)
        return fa_set_error(FA_ERROR_NOT_SUPPORTED, "desc->q_offset, k_offset, seqlen_*_global: not supported with "
                                                    "desc->varlen (dense problems only)");
    for (int x = 0; x < 2; ++x) {
        if (offsets[x] < 0) return INVALID("desc->%s: %lld is negative", offset_names[x], (long long)offsets[x]);
        if (globals[x] < 0) return INVALID("desc->%s: %lld is negative (0 = %s)", global_names[x],
                                           (long long)globals[x], local_names[x]);
        resolved[x] = globals[x] ? globals[x] : locals[x];
        if (offsets[x] > resolved[x] || locals[x] > resolved[x] - offsets[x])
            return INVALID("desc->%s: %lld + %s %lld exceeds desc->%s %lld (0 = %s)", offset_names[x],
                           (long long)offsets[x], local_names[x], (long long)locals[x], global_names[x],
                           (long long)resolved[x], local_names[x]);
    }
    /* Grouped so that nothing overflows: the first term is in [-global q, 0], the second in [0, global k]. */
    p->mask.diag_offset = (desc->q_offset - resolved[0]) + (resolved[1] - desc->k_offset);
    p->dropout.row0 = desc->q_offset;
    p->dropout.col0 = desc->k_offset;
    p->dropout.rows = *grid_q = resolved[0];
    p->dropout.cols = *grid_k = resolved[1];
    return FA_SUCCESS;
}

static fa_status check_desc(const fa_attention_desc *desc, fa_problem *p)
{
    if (!desc) return INVALID("desc: is NULL");
    if (!isfinite(desc->softmax_scale)) return INVALID("desc->softmax_scale: is not finite");
    if (desc->window_left < -1) return INVALID("desc->window_left: %d is below -1", desc->window_left);
    if (desc->window_right < -1) return INVALID("desc->window_right: %d is below -1", desc->window_right);
    if (!(desc->dropout_p >= 0.0f && desc->dropout_p < 1.0f))
        return INVALID("desc->dropout_p: %g is outside [0, 1)", (double)desc->dropout_p);
    if (desc->seqlens_k) {
        for (int64_t b = 0; b < p->shape.batch; ++b)
            if (desc->seqlens_k[b] < 0 || desc->seqlens_k[b] > p->shape.seqlen_k)
                return INVALID("desc->seqlens_k[%lld]: %d is outside [0, %lld]", (long long)b, desc->seqlens_k[b],
                               (long long)p->shape.seqlen_k);
    }
    /* The extents the block mask's grid and the dropout index cover: the padded layout's. */
    int64_t grid_batch = p->shape.batch, grid_q = p->shape.seqlen_q, grid_k = p->shape.seqlen_k;
    if (desc->varlen) {
        fa_status st = check_varlen(desc, p);
        if (st) return st;
        grid_batch = p->varlen.batch;
        grid_q = p->varlen.max_seqlen_q;
        grid_k = p->varlen.max_seqlen_k;
    }
    const fa_block_mask *bm = desc->block_mask;
    if (bm) {
        if (!bm->mask) return INVALID("desc->block_mask->mask: is NULL");
        if (bm->block_q <= 0 || bm->block_k <= 0)
            return INVALID("desc->block_mask: block sizes %d x %d must be positive", bm->block_q, bm->block_k);
        const int64_t rows = (grid_q + bm->block_q - 1) / bm->block_q;
        const int64_t cols = (grid_k + bm->block_k - 1) / bm->block_k;
        if (bm->rows != rows || bm->cols != cols)
            return INVALID("desc->block_mask: %lld x %lld blocks, expected %lld x %lld for seqlens %lld, %lld",
                           (long long)bm->rows, (long long)bm->cols, (long long)rows, (long long)cols,
                           (long long)grid_q, (long long)grid_k);
    }
    fa_status st = check_positions(desc, p, &grid_q, &grid_k);
    if (st) return st;
    int64_t elements;
    if (desc->dropout_p > 0.0f &&
        !(fa_checked_mul(grid_batch, p->shape.heads_q, &elements) && fa_checked_mul(elements, grid_q, &elements) &&
          fa_checked_mul(elements, grid_k, &elements)))
        return INVALID("desc->dropout_p: the attention matrix has more than 2^63 elements to index");
    const int64_t bias_extent[4] = {grid_batch, p->shape.heads_q, p->varlen.batch ? grid_q : p->shape.seqlen_q,
                                    p->varlen.batch ? grid_k : p->shape.seqlen_k};
    st = check_modifiers(desc, p, bias_extent);
    if (st) return st;
    p->shape.scale = desc->softmax_scale != 0.0f ? desc->softmax_scale : 1.0f / sqrtf((float)p->shape.head_dim);
    p->mask.causal = desc->causal != 0;
    p->mask.window_left = desc->window_left;
    p->mask.window_right = desc->window_right;
    p->mask.seqlens_k = desc->seqlens_k;
    p->dropout.p = desc->dropout_p;
    p->dropout.seed = desc->dropout_seed;
    p->dropout.offset = desc->dropout_offset;
    if (bm) p->mask.block_mask = *bm;
    return FA_SUCCESS;
}

/* The problem's sizes from q and the keys, with the dense lse and dropout layouts (check_varlen
 * replaces them for packed batches). */
static void set_sizes(fa_problem *p, const fa_tensor *q, int64_t heads_kv, int64_t seqlen_k, float *lse)
{
    p->shape.batch = q->batch;
    p->shape.heads_q = q->heads;
    p->shape.heads_kv = heads_kv;
    p->shape.seqlen_q = q->seqlen;
    p->shape.seqlen_k = seqlen_k;
    p->shape.head_dim = q->head_dim;
    p->shape.dtype = q->dtype;
    p->outputs.lse = lse;
    p->outputs.lse_stride_head = p->shape.seqlen_q;
    p->outputs.lse_stride_batch = p->shape.heads_q * p->shape.seqlen_q;
    p->dropout.rows = p->shape.seqlen_q;
    p->dropout.cols = p->shape.seqlen_k;
    p->mask.diag_offset = p->shape.seqlen_k - p->shape.seqlen_q;
}

fa_status fa_validate_forward(const fa_attention_desc *desc, const fa_tensor *q, const fa_tensor *k,
                              const fa_tensor *v, const fa_tensor *out, float *lse, fa_problem *p)
{
    memset(p, 0, sizeof *p);
    fa_status st;
    if ((st = fa_validate_tensor("q", q, &p->q)) || (st = fa_validate_tensor("k", k, &p->k)) ||
        (st = fa_validate_tensor("v", v, &p->v)) || (st = fa_validate_tensor("out", out, &p->out)))
        return st;
    if (k->batch != q->batch) return INVALID("k: batch %lld differs from q's %lld", (long long)k->batch, (long long)q->batch);
    if (k->head_dim != q->head_dim)
        return INVALID("k: head_dim %lld differs from q's %lld", (long long)k->head_dim, (long long)q->head_dim);
    if (k->dtype != q->dtype) return INVALID("k: dtype differs from q");
    if ((st = fa_validate_same_shape("v", v, "k", k)) || (st = fa_validate_same_shape("out", out, "q", q))) return st;
    if (q->heads % k->heads != 0)
        return INVALID("k: heads %lld does not divide q's heads %lld", (long long)k->heads, (long long)q->heads);
    set_sizes(p, q, k->heads, k->seqlen, lse);
    return check_desc(desc, p);
}

fa_status fa_validate_backward(const fa_attention_desc *desc, const fa_tensor *q, const fa_tensor *k,
                               const fa_tensor *v, const fa_tensor *out, const fa_tensor *dout,
                               const float *lse, const fa_tensor *dq, const fa_tensor *dk,
                               const fa_tensor *dv, float *dsinks, const fa_bias *dbias, fa_problem *p)
{
    fa_status st = fa_validate_forward(desc, q, k, v, out, NULL, p);
    if (st) return st;
    if (!lse) return INVALID("lse: is NULL (backward needs the forward's lse)");
    if ((st = fa_validate_tensor("dout", dout, &p->dout)) || (st = fa_validate_tensor("dq", dq, &p->dq)) ||
        (st = fa_validate_tensor("dk", dk, &p->dk)) || (st = fa_validate_tensor("dv", dv, &p->dv)))
        return st;
    if ((st = fa_validate_same_shape("dout", dout, "q", q)) || (st = fa_validate_same_shape("dq", dq, "q", q)) ||
        (st = fa_validate_same_shape("dk", dk, "k", k)) || (st = fa_validate_same_shape("dv", dv, "v", v)))
        return st;
    if (dsinks && !p->modifiers.sinks) return INVALID("dsinks: given but desc->sinks is NULL (no sinks to differentiate)");
    if ((uintptr_t)dsinks % sizeof(float) != 0) return INVALID("dsinks: is not aligned to 4-byte floats");
    if (dbias) {
        if (!p->modifiers.bias.data) return INVALID("dbias: given but desc->bias is NULL (no bias to differentiate)");
        const int64_t extent[4] = {p->varlen.batch ? p->varlen.batch : p->shape.batch, p->shape.heads_q,
                                   p->varlen.batch ? p->varlen.max_seqlen_q : p->shape.seqlen_q,
                                   p->varlen.batch ? p->varlen.max_seqlen_k : p->shape.seqlen_k};
        if ((st = check_dbias(dbias, &p->modifiers.bias, extent, &p->outputs.dbias))) return st;
    }
    p->outputs.dsinks = dsinks;
    p->outputs.lse = (float *)lse;
    return FA_SUCCESS;
}

/* Ragged queries on the KV-cache path (desc->varlen): the packed query rules of check_varlen, with
 * k_new/v_new packed by cu_seqlens_k (or q's offsets). *grid is what check_desc sees: the queries'
 * grid over the cache's capacity (a bias is [batch, heads_q, max_seqlen_q, capacity]). */
static fa_status check_ragged_cache(const fa_varlen *vl, const fa_tensor *q, const fa_tensor *k_new, int64_t capacity,
                                    fa_kv_problem *kp, fa_varlen *grid)
{
    if (!vl->cu_seqlens_q) return INVALID("desc->varlen->cu_seqlens_q: is NULL");
    if (!k_new && vl->cu_seqlens_k)
        return INVALID("desc->varlen->cu_seqlens_k: packs k_new, but k_new is NULL (leave it NULL)");
    if (k_new) {
        if (k_new->batch != 1)
            return INVALID("k_new: batch %lld must be 1 with desc->varlen (new tokens are packed along seqlen)",
                           (long long)k_new->batch);
        if (!vl->cu_seqlens_k && k_new->seqlen != q->seqlen)
            return INVALID("k_new: %lld rows differ from q's %lld, and desc->varlen->cu_seqlens_k is NULL (k_new "
                           "packed like q)", (long long)k_new->seqlen, (long long)q->seqlen);
        if (vl->cu_seqlens_k && vl->max_seqlen_k < 0)
            return INVALID("desc->varlen->max_seqlen_k: %lld is negative", (long long)vl->max_seqlen_k);
        kp->cache.cu_seqlens_new = vl->cu_seqlens_k ? vl->cu_seqlens_k : vl->cu_seqlens_q;
        kp->cache.max_seqlen_new = vl->cu_seqlens_k ? vl->max_seqlen_k : vl->max_seqlen_q;
    }
    *grid = *vl;
    grid->cu_seqlens_k = vl->cu_seqlens_q; /* check_varlen's rules for the keys do not apply */
    grid->max_seqlen_k = capacity;
    return FA_SUCCESS;
}

/* The scales one quantised cache tensor needs (which: "k" or "v"): int8 a scale array, FP8 an
 * optional descale, an unquantised one neither. */
static fa_status check_tensor_scales(const char *which, fa_dtype dtype, const float *scale, const float *descale)
{
    if (dtype == FA_DTYPE_I8 && !scale)
        return INVALID("desc->kv_scales->%s_scale: is NULL, but cache->%s holds int8 codes (one f32 scale per token "
                       "and kv head)", which, which);
    if (dtype != FA_DTYPE_I8 && scale)
        return INVALID("desc->kv_scales->%s_scale: is given, but cache->%s does not hold int8 codes", which, which);
    if (!fa_dtype_fp8(dtype) && descale)
        return INVALID("desc->kv_scales->%s_descale: is given, but cache->%s does not hold FP8 codes", which, which);
    if ((uintptr_t)scale % sizeof(float) != 0)
        return INVALID("desc->kv_scales->%s_scale: is not aligned to 4-byte floats", which);
    if ((uintptr_t)descale % sizeof(float) != 0)
        return INVALID("desc->kv_scales->%s_descale: is not aligned to 4-byte floats", which);
    return FA_SUCCESS;
}

/* desc->kv_scales against the cache tensors' dtypes; the descales' values are table checks. */
static fa_status check_kv_scales(const fa_kv_scales *scales, const fa_kv_cache *cache, fa_kv_problem *kp)
{
    fa_kv_scales full;
    fa_kv_scales_init(&full);
    if (scales) {
        fa_status st = fa_sized_struct_read("desc->kv_scales", scales, sizeof full, sizeof full, &full);
        if (st) return st;
    }
    fa_status st = check_tensor_scales("k", cache->k.dtype, full.k_scale, full.k_descale);
    if (st == FA_SUCCESS) st = check_tensor_scales("v", cache->v.dtype, full.v_scale, full.v_descale);
    if (st != FA_SUCCESS) return st;
    if (full.k_scale && full.k_scale == full.v_scale)
        return INVALID("desc->kv_scales->v_scale: is k_scale (each needs its own array)");
    kp->cache.k_scale = full.k_scale;
    kp->cache.v_scale = full.v_scale;
    kp->cache.k_descale = full.k_descale;
    kp->cache.v_descale = full.v_descale;
    return FA_SUCCESS;
}

/* fa_kv_slots: contiguous caches only; the arrays' values are table checks (table_checks.h). */
static fa_status check_slots(const fa_kv_slots *slots, const fa_kv_cache *cache, fa_kv_problem *kp)
{
    if (!slots) return FA_SUCCESS;
    fa_kv_slots full;
    fa_kv_slots_init(&full);
    fa_status st = fa_sized_struct_read("slots", slots, sizeof full, sizeof full, &full);
    if (st) return st;
    if ((full.cache_batch_idx || full.cache_leftpad) && cache->block_table)
        return fa_set_error(FA_ERROR_NOT_SUPPORTED, "slots: cache_batch_idx and cache_leftpad apply to contiguous "
                                                    "caches only (cache->block_table is set)");
    kp->cache.cache_batch_idx = full.cache_batch_idx;
    kp->cache.cache_leftpad = full.cache_leftpad;
    return FA_SUCCESS;
}

/* desc->rotary: its shape rules (the positions are table checks). */
static fa_status check_rotary(const fa_rotary *rotary, int64_t head_dim, fa_kv_problem *kp)
{
    if (!rotary) return FA_SUCCESS;
    fa_rotary full;
    fa_rotary_init(&full);
    fa_status st = fa_sized_struct_read("desc->rotary", rotary, sizeof full, sizeof full, &full);
    if (st) return st;
    if (!full.cos || !full.sin) return INVALID("desc->rotary->%s: is NULL", full.cos ? "sin" : "cos");
    if ((uintptr_t)full.cos % sizeof(float) != 0 || (uintptr_t)full.sin % sizeof(float) != 0)
        return INVALID("desc->rotary->%s: is not aligned to 4-byte floats",
                       (uintptr_t)full.cos % sizeof(float) ? "cos" : "sin");
    if (full.rotary_dim < 2 || full.rotary_dim % 2 || full.rotary_dim > head_dim)
        return INVALID("desc->rotary->rotary_dim: %lld must be even and in [2, head_dim %lld]",
                       (long long)full.rotary_dim, (long long)head_dim);
    int64_t entries;
    if (full.max_position <= 0 || !fa_checked_mul(full.max_position, full.rotary_dim, &entries) || entries > INT64_MAX / 8)
        return INVALID("desc->rotary->max_position: %lld must be positive (and the tables' size fit 64 bits)",
                       (long long)full.max_position);
    if (full.interleaved != 0 && full.interleaved != 1)
        return INVALID("desc->rotary->interleaved: %d must be 0 (GPT-NeoX) or 1 (GPT-J)", full.interleaved);
    kp->cache.rotary_cos = full.cos;
    kp->cache.rotary_sin = full.sin;
    kp->cache.rotary_max_position = full.max_position;
    kp->cache.rotary_dim = full.rotary_dim;
    kp->cache.rotary_interleaved = full.interleaved;
    return FA_SUCCESS;
}

/* The cache of a KV-cache call with `batch` sequences: its tensors (quantised or of `dtype`),
 * scales, slots and pages; sets the cache section and p's heads_kv, head_dim, seqlen_k (capacity). */
static fa_status check_cache(const fa_attention_desc *desc, const fa_kv_cache *cache, const fa_kv_slots *slots,
                             int64_t batch, fa_dtype dtype, fa_kv_problem *kp)
{
    fa_problem *p = &kp->attn;
    fa_status st;
    if (!cache) return INVALID("cache: is NULL");
    if ((st = check_tensor("cache->k", &cache->k, 1, &p->k)) || (st = check_tensor("cache->v", &cache->v, 1, &p->v)))
        return st;
    if ((st = check_same_sizes("cache->v", &cache->v, "cache->k", &cache->k))) return st;
    if (cache->k.dtype != dtype && !fa_dtype_quantised(cache->k.dtype))
        return INVALID("cache->k: dtype differs from q (and is not a quantised type)");
    if (cache->v.dtype != dtype && !fa_dtype_quantised(cache->v.dtype))
        return INVALID("cache->v: dtype differs from q (and is not a quantised type)");
    if ((st = check_kv_scales(desc->kv_scales, cache, kp))) return st;
    if (!cache->cache_seqlens) return INVALID("cache->cache_seqlens: is NULL");
    if ((st = check_slots(slots, cache, kp))) return st;
    if (cache->block_table) {
        if (cache->max_pages_per_seq <= 0)
            return INVALID("cache->max_pages_per_seq: %lld is not positive", (long long)cache->max_pages_per_seq);
        int64_t capacity, entries;
        if (!fa_checked_mul(cache->max_pages_per_seq, cache->k.seqlen, &capacity) ||
            !fa_checked_mul(cache->max_pages_per_seq, batch, &entries) || capacity > INT32_MAX)
            return INVALID("cache->max_pages_per_seq: %lld pages of %lld tokens exceed 2^31 tokens per sequence",
                           (long long)cache->max_pages_per_seq, (long long)cache->k.seqlen);
        kp->cache.page_size = cache->k.seqlen;
        kp->cache.num_pages = cache->k.batch;
        kp->cache.max_pages_per_seq = cache->max_pages_per_seq;
        kp->cache.block_table = cache->block_table;
        p->shape.seqlen_k = capacity;
    } else {
        if (!kp->cache.cache_batch_idx && cache->k.batch != batch)
            return INVALID("cache->k: batch %lld differs from the %lld sequences (contiguous cache without "
                           "cache_batch_idx)", (long long)cache->k.batch, (long long)batch);
        p->shape.seqlen_k = cache->k.seqlen;
    }
    kp->cache.cache_seqlens = cache->cache_seqlens;
    p->shape.heads_kv = cache->k.heads;
    return check_rotary(desc->rotary, cache->k.head_dim, kp);
}

/* k_new and v_new (both or neither): [batch, seqlen_new, heads_kv, head_dim] of `dtype` (dtype_of:
 * the tensor it comes from, NULL: the cache tensor), or of F32/F16/BF16 when the cache tensor they
 * go to is quantised. */
static fa_status check_new_tokens(const fa_tensor *k_new, const fa_tensor *v_new, int64_t batch, const fa_kv_cache *cache,
                                  fa_dtype dtype, const char *dtype_of, fa_kv_problem *kp)
{
    fa_status st;
    if ((k_new == NULL) != (v_new == NULL)) return INVALID("k_new, v_new: give both or neither");
    if (!k_new) return FA_SUCCESS;
    if ((st = fa_validate_tensor("k_new", k_new, &kp->k_new)) || (st = fa_validate_tensor("v_new", v_new, &kp->v_new)))
        return st;
    if ((st = check_same_sizes("v_new", v_new, "k_new", k_new))) return st;
    if (k_new->batch != batch || k_new->heads != cache->k.heads || k_new->head_dim != cache->k.head_dim)
        return INVALID("k_new: shape [%lld, %lld, %lld, %lld] must be [batch %lld, seqlen_new, heads_kv %lld, %lld]",
                       (long long)k_new->batch, (long long)k_new->seqlen, (long long)k_new->heads,
                       (long long)k_new->head_dim, (long long)batch, (long long)cache->k.heads,
                       (long long)cache->k.head_dim);
    if (k_new->dtype != dtype && !fa_dtype_quantised(cache->k.dtype))
        return INVALID("k_new: dtype differs from %s", dtype_of ? dtype_of : "cache->k");
    if (v_new->dtype != dtype && !fa_dtype_quantised(cache->v.dtype))
        return INVALID("v_new: dtype differs from %s", dtype_of ? dtype_of : "cache->v");
    kp->cache.seqlen_new = k_new->seqlen;
    return FA_SUCCESS;
}

fa_status fa_validate_kvcache(const fa_attention_desc *desc, const fa_tensor *q, const fa_kv_cache *cache,
                              const fa_kv_slots *slots, const fa_tensor *k_new, const fa_tensor *v_new,
                              const fa_tensor *out, float *lse, fa_kv_problem *kp)
{
    memset(kp, 0, sizeof *kp);
    fa_problem *p = &kp->attn;
    fa_status st;
    if ((st = fa_validate_tensor("q", q, &p->q)) || (st = fa_validate_tensor("out", out, &p->out)) ||
        (st = fa_validate_same_shape("out", out, "q", q)))
        return st;
    /* Sequences: varlen->batch of packed queries, else q's batch. */
    const int64_t batch = desc->varlen ? desc->varlen->batch : q->batch;
    if (desc->varlen && desc->varlen->batch <= 0)
        return INVALID("desc->varlen->batch: %lld is not positive", (long long)desc->varlen->batch);
    if ((st = check_cache(desc, cache, slots, batch, q->dtype, kp))) return st;
    if (cache->k.head_dim != q->head_dim)
        return INVALID("cache->k: head_dim %lld differs from q's %lld", (long long)cache->k.head_dim,
                       (long long)q->head_dim);
    if (q->heads % cache->k.heads != 0)
        return INVALID("cache->k: heads %lld does not divide q's heads %lld", (long long)cache->k.heads,
                       (long long)q->heads);
    if ((st = check_new_tokens(k_new, v_new, q->batch, cache, q->dtype, "q", kp))) return st;
    if (desc->seqlens_k) return INVALID("desc->seqlens_k: must be NULL for the KV cache (use cache->cache_seqlens)");
    if (desc->q_offset || desc->k_offset || desc->seqlen_q_global || desc->seqlen_k_global)
        return fa_set_error(FA_ERROR_NOT_SUPPORTED, "desc->q_offset, k_offset, seqlen_*_global: the KV-cache path "
                                                    "has no block positions (leave them 0)");
    if (desc->block_mask)
        return fa_set_error(FA_ERROR_NOT_SUPPORTED, "desc->block_mask: the KV-cache path has no block masks");
    if (desc->dropout_p != 0.0f)
        return fa_set_error(FA_ERROR_NOT_SUPPORTED, "desc->dropout_p: the KV-cache path is forward-only inference, "
                                                    "without dropout");
    if (desc->kv_split_tokens < 0)
        return INVALID("desc->kv_split_tokens: %lld is negative (0 = the library's split)", (long long)desc->kv_split_tokens);
    set_sizes(p, q, cache->k.heads, p->shape.seqlen_k, lse);
    kp->cache.split_tokens = desc->kv_split_tokens;
    kp->cache.rotary_queries_in_order = desc->causal || desc->window_left >= 0 || desc->window_right >= 0;
    if (!desc->varlen) return check_desc(desc, p);
    fa_attention_desc ragged = *desc;
    fa_varlen grid;
    if ((st = check_ragged_cache(desc->varlen, q, k_new, p->shape.seqlen_k, kp, &grid))) return st;
    ragged.varlen = &grid;
    if ((st = check_desc(&ragged, p))) return st;
    p->varlen.cu_seqlens_k = kp->cache.cu_seqlens_new; /* the keys are the cache's: only k_new is packed */
    p->varlen.max_seqlen_k = kp->cache.max_seqlen_new;
    return FA_SUCCESS;
}

fa_status fa_validate_kvcache_append(const fa_attention_desc *desc, const fa_kv_cache *cache, const fa_kv_slots *slots,
                                     const fa_tensor *k_new, const fa_tensor *v_new, fa_kv_problem *kp)
{
    memset(kp, 0, sizeof *kp);
    fa_problem *p = &kp->attn;
    fa_status st;
    if (!k_new || !v_new) return INVALID("%s: is NULL (the tokens to append)", k_new ? "v_new" : "k_new");
    const fa_varlen *vl = desc->varlen;
    if (vl) {
        if (vl->batch <= 0) return INVALID("desc->varlen->batch: %lld is not positive", (long long)vl->batch);
        if (vl->cu_seqlens_q)
            return INVALID("desc->varlen->cu_seqlens_q: must be NULL for fa_kvcache_append (no queries; "
                           "cu_seqlens_k packs k_new)");
        if (!vl->cu_seqlens_k) return INVALID("desc->varlen->cu_seqlens_k: is NULL (it packs k_new)");
        if (vl->max_seqlen_k < 0) return INVALID("desc->varlen->max_seqlen_k: %lld is negative", (long long)vl->max_seqlen_k);
        if (k_new->batch != 1)
            return INVALID("k_new: batch %lld must be 1 with desc->varlen (new tokens are packed along seqlen)",
                           (long long)k_new->batch);
    }
    const int64_t batch = vl ? vl->batch : k_new->batch;
    /* The dtype of an unquantised cache tensor, which its new tokens must have (else any). */
    fa_dtype dtype = k_new->dtype;
    if (cache && !fa_dtype_quantised(cache->k.dtype)) dtype = cache->k.dtype;
    else if (cache && !fa_dtype_quantised(cache->v.dtype)) dtype = cache->v.dtype;
    if ((st = check_cache(desc, cache, slots, batch, dtype, kp))) return st;
    if ((st = check_new_tokens(k_new, v_new, vl ? 1 : batch, cache, dtype, NULL, kp))) return st;
    p->shape.batch = batch;
    p->shape.heads_q = cache->k.heads;
    p->shape.head_dim = cache->k.head_dim;
    p->shape.dtype = k_new->dtype;
    p->shape.scale = 1.0f;
    if (vl) {
        kp->cache.cu_seqlens_new = vl->cu_seqlens_k;
        kp->cache.max_seqlen_new = vl->max_seqlen_k;
    }
    return FA_SUCCESS;
}

fa_status fa_validate_kvcache_tables(const fa_kv_problem *kp)
{
    fa_table_fault f;
    const fa_problem *p = &kp->attn;
    if (!fa_check_cache_tables(&f, &kp->cache, &p->varlen, fa_kv_sequences(p), p->shape.seqlen_k, p->shape.seqlen_q,
                               kp->cache.seqlen_new, p->k.batch))
        return table_fault_error(&f);
    if (!fa_check_rotary_positions(&f, &kp->cache, &p->varlen, fa_kv_sequences(p), p->shape.seqlen_q))
        return table_fault_error(&f);
    if (!fa_check_descales(&f, 0, kp->cache.k_descale, fa_kv_sequences(p), p->shape.heads_kv) ||
        !fa_check_descales(&f, 1, kp->cache.v_descale, fa_kv_sequences(p), p->shape.heads_kv))
        return table_fault_error(&f);
    return FA_SUCCESS;
}

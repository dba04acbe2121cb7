/* Ring attention, the algorithm (flashattn_dist.h, flashattn_dist_nccl.h): the zigzag layout,
 * the K/V ring with the next block's exchange posted before the current block's compute, partial
 * outputs merged by lse in ring order, and the dK/dV accumulators that travel with K/V in the
 * backward. Every rank agrees on the status before and after the ring, so no rank is left waiting
 * for a failed one. Messages and memory go through a transport (transport.h: MPI or NCCL).
 *
 * f16/bf16: K and V travel in the input dtype (half the bytes); every block is computed in f32 on
 * the widened values (exact), so the partial outputs, their merges, dq's sum and the dK/dV
 * accumulators stay f32 and only the final out, dq, dk, dv are rounded to the input dtype, once.
 * The CPU backend widens f16/bf16 tiles to f32 itself, so this is the arithmetic of one call. */
#include "transport.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../common/dtype.h"
#include "../common/error.h"
#include "../common/tensor_strides.h"

typedef struct ring {
    const fa_ring_transport *t;
    int rank, size;
    int64_t batch, chunk, hq, hk, d; /* chunk: C tokens; local rows 2C */
    fa_dtype dtype;              /* of every tensor; K/V travel in it */
    fa_attention_desc desc;      /* the caller's, complete */
    int32_t *valid_k;            /* [batch] valid keys of the current block (host memory), or NULL */
} ring;

fa_tensor fa_ring_strided(const fa_tensor *t)
{
    fa_tensor s;
    (void)fa_tensor_explicit_strides(t, &s); /* check_tensor refused tensors whose strides overflow */
    return s;
}

void *fa_ring_element(const fa_tensor *t, int64_t b, int64_t s, int64_t h)
{
    return (char *)t->data + (b * t->stride_batch + s * t->stride_seq + h * t->stride_head) *
                                 (int64_t)fa_dtype_size(t->dtype);
}

/* Local rows [c * C, (c + 1) * C) of a strided tensor. */
static fa_tensor chunk_view(const fa_tensor *t, int64_t c, int64_t chunk)
{
    fa_tensor v = *t;
    v.data = (char *)t->data + c * chunk * t->stride_seq * (int64_t)fa_dtype_size(t->dtype);
    v.seqlen = chunk;
    return v;
}

/* A packed [batch, rows, heads, d] buffer as a tensor. */
static fa_tensor packed_as(void *data, fa_dtype dtype, int64_t batch, int64_t rows, int64_t heads, int64_t d)
{
    return (fa_tensor){data, dtype, batch, rows, heads, d, rows * heads * d, heads * d, d};
}

static fa_tensor packed(float *data, int64_t batch, int64_t rows, int64_t heads, int64_t d)
{
    return packed_as(data, FA_DTYPE_F32, batch, rows, heads, d);
}

/* Global chunk held at local chunk c (0 or 1) of rank r: zigzag. */
static int64_t global_chunk(const ring *g, int r, int c) { return c == 0 ? r : 2 * (int64_t)g->size - 1 - r; }

static fa_status check_tensor(const char *name, const fa_tensor *t)
{
    if (!t) return fa_private_set_error(FA_ERROR_INVALID_VALUE, "%s: is NULL", name);
    if (!t->data) return fa_private_set_error(FA_ERROR_INVALID_VALUE, "%s: data is NULL", name);
    if (!fa_dtype_known(t->dtype)) return fa_private_set_error(FA_ERROR_INVALID_VALUE, "%s: unknown dtype %d", name, (int)t->dtype);
    if ((uintptr_t)t->data % fa_dtype_size(t->dtype) != 0)
        return fa_private_set_error(FA_ERROR_INVALID_VALUE, "%s: data is not aligned to its %zu-byte elements", name,
                            fa_dtype_size(t->dtype));
    if (t->batch <= 0 || t->seqlen <= 0 || t->heads <= 0 || t->head_dim <= 0)
        return fa_private_set_error(FA_ERROR_INVALID_VALUE, "%s: dimensions must be positive", name);
    /* The ring copies rows in and out itself: the strides must be sane and every offset must fit. */
    if (!fa_tensor_is_packed(t) && (t->stride_batch <= 0 || t->stride_seq <= 0 || t->stride_head <= 0))
        return fa_private_set_error(FA_ERROR_INVALID_VALUE, "%s: strides must be all 0 (packed) or all positive", name);
    int64_t last = t->head_dim, term;
    fa_tensor e;
    int overflow = !fa_tensor_explicit_strides(t, &e);
    if (!overflow) {
        const int64_t extent[3][2] = {{t->batch - 1, e.stride_batch}, {t->seqlen - 1, e.stride_seq},
                                      {t->heads - 1, e.stride_head}};
        for (int x = 0; x < 3; ++x)
            overflow |= __builtin_mul_overflow(extent[x][0], extent[x][1], &term) |
                        __builtin_add_overflow(last, term, &last);
    }
    if (overflow || last > INT64_MAX / 4)
        return fa_private_set_error(FA_ERROR_INVALID_VALUE, "%s: element offsets overflow 64 bits", name);
    return FA_SUCCESS;
}

static fa_status check_like(const char *name, const fa_tensor *t, const char *ref_name, const fa_tensor *ref)
{
    fa_status st = check_tensor(name, t);
    if (st) return st;
    if (t->dtype != ref->dtype) return fa_private_set_error(FA_ERROR_INVALID_VALUE, "%s: dtype differs from %s", name, ref_name);
    if (t->batch != ref->batch || t->seqlen != ref->seqlen || t->heads != ref->heads || t->head_dim != ref->head_dim)
        return fa_private_set_error(FA_ERROR_INVALID_VALUE, "%s: shape differs from %s", name, ref_name);
    return FA_SUCCESS;
}

/* This rank's arguments, before any communication. */
static fa_status check_local(fa_context *ctx, const fa_attention_desc *desc, const fa_tensor *q, const fa_tensor *k,
                             const fa_tensor *v, const fa_tensor *out, ring *g)
{
    const fa_ring_transport *t = g->t;
    if (t->pending) return t->pending;
    if (fa_context_backend(ctx) != t->backend)
        return fa_private_set_error(ctx ? FA_ERROR_NOT_SUPPORTED : FA_ERROR_INVALID_VALUE,
                            "ctx: ring attention over %s needs a %s context (it exchanges that backend's memory)",
                            t->name, fa_backend_name(t->backend));
    if (!desc) return fa_private_set_error(FA_ERROR_INVALID_VALUE, "desc: is NULL");
    if (desc->struct_size < offsetof(fa_attention_desc, varlen) || desc->struct_size > sizeof g->desc)
        return fa_private_set_error(FA_ERROR_INVALID_VALUE, "desc->struct_size: %zu is not a known layout (use "
                            "fa_attention_desc_init)", desc->struct_size);
    fa_attention_desc_init(&g->desc);
    memcpy(&g->desc, desc, desc->struct_size);
    g->desc.struct_size = sizeof g->desc;
    const fa_attention_desc *dd = &g->desc;
    if (dd->q_offset || dd->k_offset || dd->seqlen_q_global || dd->seqlen_k_global)
        return fa_private_set_error(FA_ERROR_INVALID_VALUE, "desc->q_offset, k_offset, seqlen_*_global: must be 0 (the ring "
                            "sets each block's positions)");
    if (dd->varlen) return fa_private_set_error(FA_ERROR_NOT_SUPPORTED, "desc->varlen: ring attention takes dense batches");
    if (dd->block_mask || dd->bias || dd->sinks)
        return fa_private_set_error(FA_ERROR_NOT_SUPPORTED, "desc: block_mask, bias and sinks are not supported by ring "
                            "attention (their arrays are not split along the ring)");
    fa_status st;
    if ((st = check_tensor("q", q)) || (st = check_tensor("k", k)) || (st = check_like("v", v, "k", k)) ||
        (st = check_like("out", out, "q", q)))
        return st;
    if (k->dtype != q->dtype) return fa_private_set_error(FA_ERROR_INVALID_VALUE, "k: dtype differs from q");
    if (q->dtype != FA_DTYPE_F32 && !t->narrow_dtypes)
        return fa_private_set_error(FA_ERROR_NOT_SUPPORTED, "q: ring attention over %s takes f32 tensors (f16/bf16 "
                            "are not built for it yet)", t->name);
    if (q->seqlen % 2)
        return fa_private_set_error(FA_ERROR_INVALID_VALUE, "q: seqlen %" PRId64 " is odd (the zigzag layout holds two "
                            "chunks of equal length per rank)", q->seqlen);
    if (k->seqlen != q->seqlen || k->batch != q->batch || k->head_dim != q->head_dim || q->heads % k->heads)
        return fa_private_set_error(FA_ERROR_INVALID_VALUE, "k: shape must be [q's batch, q's seqlen, a divisor of q's heads, "
                            "q's head_dim] (self-attention)");
    g->batch = q->batch;
    g->chunk = q->seqlen / 2;
    g->hq = q->heads;
    g->hk = k->heads;
    g->d = q->head_dim;
    g->dtype = q->dtype;
    const int64_t total = 2 * g->chunk * g->size;
    for (int64_t b = 0; dd->seqlens_k && b < g->batch; ++b)
        if (dd->seqlens_k[b] < 0 || dd->seqlens_k[b] > total)
            return fa_private_set_error(FA_ERROR_INVALID_VALUE, "desc->seqlens_k[%" PRId64 "]: %d is outside [0, %" PRId64
                                "] (the whole sequence)", b, dd->seqlens_k[b], total);
    /* One message holds a block's K and V: its count must fit an int (checked factor by factor,
     * so the product itself cannot overflow; q's sizes are those of the caller's own array). */
    const int64_t factors[4] = {g->batch, 2 * g->chunk, g->hk, g->d};
    int64_t count = 2;
    for (int x = 0; x < 4; ++x) {
        if (factors[x] > 0x7fffffff / count)
            return fa_private_set_error(FA_ERROR_NOT_SUPPORTED, "k: a block of K and V exceeds 2^31 elements (one message)");
        count *= factors[x];
    }
    g->valid_k = dd->seqlens_k ? malloc((size_t)g->batch * sizeof *g->valid_k) : NULL;
    if (dd->seqlens_k && !g->valid_k) return fa_private_set_error(FA_ERROR_OUT_OF_MEMORY, "desc->seqlens_k: scratch");
    return FA_SUCCESS;
}

/* The ranks agree: every rank learns the worst status (and which rank had it) and whether the
 * shapes and desc match. Returns the status this rank must return. */
static fa_status agree(ring *g, fa_status st, const int64_t *sig, int count)
{
    enum { MAX_SIG = 24 };
    int64_t red[1 + 2 * MAX_SIG];
    red[0] = st ? -(((int64_t)st << 32) | (int64_t)g->rank) : 0; /* MIN of -code = MAX of code */
    for (int x = 0; x < count; ++x) {
        red[1 + x] = sig[x];
        red[1 + count + x] = -sig[x];
    }
    const fa_status comm = g->t->agree_min(g->t->self, red, 1 + 2 * count);
    if (comm) return comm;
    if (st) return st; /* this rank's own message stands */
    if (red[0]) {
        const int64_t code = -red[0];
        return fa_private_set_error((fa_status)(code >> 32), "rank %d of the ring failed (%s): see its fa_last_error()",
                            (int)(code & 0xffffffff), fa_status_string((fa_status)(code >> 32)));
    }
    for (int x = 0; x < count; ++x)
        if (red[1 + x] != -red[1 + count + x])
            return fa_private_set_error(FA_ERROR_INVALID_VALUE, "comm: the ranks disagree on the tensors' shapes or the desc "
                                "(field %d of the signature)", x);
    return FA_SUCCESS;
}

/* What every rank must share: shapes and the desc's scalars. */
static int signature(const ring *g, int64_t *sig)
{
    const fa_attention_desc *dd = &g->desc;
    uint32_t bits[3];
    memcpy(&bits[0], &dd->softmax_scale, 4);
    memcpy(&bits[1], &dd->dropout_p, 4);
    memcpy(&bits[2], &dd->softcap, 4);
    const int64_t values[] = {g->batch, g->chunk, g->hq, g->hk, g->d, g->dtype, dd->causal, dd->window_left, dd->window_right,
                              bits[0], bits[1], bits[2], (uint32_t)dd->dropout_seed, (uint32_t)(dd->dropout_seed >> 32),
                              (uint32_t)dd->dropout_offset, (uint32_t)(dd->dropout_offset >> 32),
                              dd->seqlens_k != NULL, dd->alibi_slopes != NULL, dd->alibi_per_batch};
    const int count = (int)(sizeof values / sizeof *values);
    memcpy(sig, values, sizeof values);
    return count;
}

/* The desc of the block (local query chunk qc of this rank, key chunk kc of rank src). Returns 0
 * when the block is empty under the causal mask (every key after every query). */
static int block_desc(ring *g, int src, int qc, int kc, fa_attention_desc *desc)
{
    const int64_t q0 = global_chunk(g, g->rank, qc) * g->chunk, k0 = global_chunk(g, src, kc) * g->chunk;
    if (g->desc.causal && k0 > q0 + g->chunk - 1) return 0;
    *desc = g->desc;
    desc->q_offset = q0;
    desc->k_offset = k0;
    desc->seqlen_q_global = desc->seqlen_k_global = 2 * g->chunk * g->size;
    if (g->desc.seqlens_k) { /* the global valid-key count, clipped to this block */
        for (int64_t b = 0; b < g->batch; ++b) {
            const int64_t valid = g->desc.seqlens_k[b] - k0;
            g->valid_k[b] = (int32_t)(valid < 0 ? 0 : valid > g->chunk ? g->chunk : valid);
        }
        desc->seqlens_k = g->valid_k;
    }
    return 1;
}

/* Scratch of the context's memory: allocates *p unless an earlier allocation failed (ok). */
static int grab(const ring *g, void *p, size_t bytes, int ok)
{
    void **slot = (void **)p;
    return ok && g->t->alloc(g->t->self, bytes, slot) == FA_SUCCESS;
}

/* An f32 view of t: t itself when it is f32, else its rows widened into *copy (packed; data NULL
 * when out of memory). The ring computes every block on f32 views. */
static fa_tensor f32_view(const ring *g, const fa_tensor *t, float **copy)
{
    if (t->dtype == FA_DTYPE_F32) return *t;
    if (!grab(g, copy, (size_t)(t->batch * t->seqlen * t->heads * t->head_dim) * sizeof(float), 1) ||
        g->t->pack(g->t->self, t, *copy, FA_DTYPE_F32) != FA_SUCCESS)
        return packed(NULL, t->batch, t->seqlen, t->heads, t->head_dim);
    return packed(*copy, t->batch, t->seqlen, t->heads, t->head_dim);
}

static void finish(ring *g) { free(g->valid_k); }

/* Elements of a K/V block (K [batch, 2C, hk, d], then V). */
static int64_t kv_elements(const ring *g) { return g->batch * 2 * g->chunk * g->hk * g->d * 2; }

/* Posts the next step's K/V exchange: send cur to the right, receive next from the left. */
static fa_status post_kv_exchange(const ring *g, void *next, const void *cur)
{
    return g->t->post(g->t->self, FA_RING_KV, cur, next, kv_elements(g), (int)fa_dtype_size(g->dtype));
}

/* The received K/V block as f32: itself, or widened into wide (f16/bf16; NULL on failure). Reading
 * a buffer that is being sent is allowed (MPI 3; NCCL reads it on its stream). */
static float *kv_f32(const ring *g, void *kv, float *wide)
{
    if (g->dtype == FA_DTYPE_F32) return kv;
    const fa_tensor flat = packed_as(kv, g->dtype, 1, 1, 1, kv_elements(g));
    return g->t->pack(g->t->self, &flat, wide, FA_DTYPE_F32) == FA_SUCCESS ? wide : NULL;
}

/* K and V of key chunk kc of a packed f32 K/V block. */
static void kv_chunk(const ring *g, float *kv, int kc, fa_tensor *k, fa_tensor *v)
{
    const fa_tensor whole_k = packed(kv, g->batch, 2 * g->chunk, g->hk, g->d);
    const fa_tensor whole_v = packed(kv + g->batch * 2 * g->chunk * g->hk * g->d, g->batch, 2 * g->chunk, g->hk, g->d);
    *k = chunk_view(&whole_k, kc, g->chunk);
    *v = chunk_view(&whole_v, kc, g->chunk);
}

/* Packs this rank's K then V into a ring buffer of the input dtype. */
static fa_status pack_kv(const ring *g, const fa_tensor *k, const fa_tensor *v, void *kv)
{
    const fa_tensor sk = fa_ring_strided(k), sv = fa_ring_strided(v);
    const size_t half = (size_t)kv_elements(g) / 2 * fa_dtype_size(g->dtype);
    fa_status st = g->t->pack(g->t->self, &sk, kv, g->dtype);
    return st ? st : g->t->pack(g->t->self, &sv, (char *)kv + half, g->dtype);
}

/* Forward scratch: the K/V ring buffers and, per local query chunk, the merged result so far,
 * the block's partial and the merge target. */
typedef struct forward_buffers {
    void *kv[2];  /* in the input dtype */
    float *kv_wide; /* the current block widened to f32 (f16/bf16 only) */
    float *out[2][3], *lse[2][3]; /* [qc][acc, part, tmp] */
} forward_buffers;

static fa_status ring_forward_steps(ring *g, fa_context *ctx, const fa_tensor *q, forward_buffers *w, int *have)
{
    fa_status st = FA_SUCCESS, comm;
    for (int s = 0; s < g->size; ++s) {
        const int cur = s & 1, src = (g->rank - s + g->size) % g->size;
        /* The next block's exchange first, so that it overlaps this block's compute. */
        if (s + 1 < g->size && (comm = post_kv_exchange(g, w->kv[1 - cur], w->kv[cur])) != FA_SUCCESS) return comm;
        float *kv = st ? NULL : kv_f32(g, w->kv[cur], w->kv_wide);
        if (!st && !kv) st = fa_private_set_error(FA_ERROR_BACKEND_FAILURE, "fa_ring_forward: widening a K/V block");
        for (int qc = 0; qc < 2 && !st; ++qc) {
            const fa_tensor bq = chunk_view(q, qc, g->chunk);
            for (int kc = 0; kc < 2 && !st; ++kc) {
                fa_attention_desc desc;
                if (!block_desc(g, src, qc, kc, &desc)) continue;
                fa_tensor bk, bv;
                kv_chunk(g, kv, kc, &bk, &bv);
                fa_tensor part = packed(w->out[qc][1], g->batch, g->chunk, g->hq, g->d);
                st = fa_forward(ctx, &desc, &bq, &bk, &bv, &part, w->lse[qc][1]);
                if (st) break;
                float *t;
                if (!have[qc]) { /* the first partial is the merge so far */
                    t = w->out[qc][0], w->out[qc][0] = w->out[qc][1], w->out[qc][1] = t;
                    t = w->lse[qc][0], w->lse[qc][0] = w->lse[qc][1], w->lse[qc][1] = t;
                    have[qc] = 1;
                    continue;
                }
                const fa_tensor acc = packed(w->out[qc][0], g->batch, g->chunk, g->hq, g->d);
                fa_tensor merged = packed(w->out[qc][2], g->batch, g->chunk, g->hq, g->d);
                const fa_tensor *outs[2] = {&acc, &part};
                const float *lses[2] = {w->lse[qc][0], w->lse[qc][1]};
                st = fa_merge_partials(ctx, 2, outs, lses, &merged, w->lse[qc][2]);
                t = w->out[qc][0], w->out[qc][0] = w->out[qc][2], w->out[qc][2] = t;
                t = w->lse[qc][0], w->lse[qc][0] = w->lse[qc][2], w->lse[qc][2] = t;
            }
        }
        /* A failed block still takes part in the exchange: the other ranks are waiting on it. */
        if (s + 1 < g->size && (comm = g->t->wait(g->t->self, FA_RING_KV)) != FA_SUCCESS) return comm;
    }
    return st;
}

static void start(const fa_ring_transport *t, ring *g)
{
    memset(g, 0, sizeof *g);
    g->t = t;
    g->rank = t->rank;
    g->size = t->size;
}

fa_status fa_ring_run_forward(const fa_ring_transport *t, fa_context *ctx, const fa_attention_desc *desc,
                              const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, fa_tensor *out, float *lse)
{
    ring g;
    start(t, &g);
    fa_status st = check_local(ctx, desc, q, k, v, out, &g);
    int64_t sig[24];
    const int count = signature(&g, sig);
    st = agree(&g, st, sig, count);
    forward_buffers w = {0};
    int have[2] = {0, 0};
    float *q_wide = NULL;
    if (!st) {
        const size_t kv_bytes = (size_t)kv_elements(&g) * fa_dtype_size(g.dtype);
        const size_t o_floats = (size_t)(g.batch * g.chunk * g.hq * g.d), l_floats = (size_t)(g.batch * g.hq * g.chunk);
        int ok = grab(&g, &w.kv[0], kv_bytes, 1);
        ok = grab(&g, &w.kv[1], kv_bytes, ok);
        if (g.dtype != FA_DTYPE_F32) ok = grab(&g, &w.kv_wide, (size_t)kv_elements(&g) * sizeof(float), ok);
        for (int qc = 0; qc < 2; ++qc)
            for (int x = 0; x < 3; ++x) {
                ok = grab(&g, &w.out[qc][x], o_floats * sizeof(float), ok);
                ok = grab(&g, &w.lse[qc][x], l_floats * sizeof(float), ok);
            }
        const fa_tensor sq = fa_ring_strided(q);
        const fa_tensor wq = ok ? f32_view(&g, &sq, &q_wide) : sq;
        ok = ok && wq.data;
        if (!ok) st = fa_private_set_error(FA_ERROR_OUT_OF_MEMORY, "fa_ring_forward: ring buffers");
        if (!st) st = pack_kv(&g, k, v, w.kv[0]);
        /* Every rank enters the ring only when every rank could allocate. */
        st = agree(&g, st, sig, count);
        if (!st) st = agree(&g, ring_forward_steps(&g, ctx, &wq, &w, have), sig, count);
    }
    if (!st) { /* every rank succeeded: now, and only now, the outputs */
        const fa_tensor so = fa_ring_strided(out);
        const size_t c_bytes = (size_t)g.chunk * sizeof *lse;
        for (int qc = 0; qc < 2 && !st; ++qc) {
            st = t->unpack(t->self, w.out[qc][0], qc, g.chunk, &so);
            if (!st && lse)
                st = t->copy_rows(t->self, lse + qc * g.chunk, 2 * c_bytes, w.lse[qc][0], c_bytes, c_bytes,
                                  (size_t)(g.batch * g.hq));
        }
    }
    t->release(t->self, w.kv[0]);
    t->release(t->self, w.kv[1]);
    t->release(t->self, w.kv_wide);
    t->release(t->self, q_wide);
    for (int qc = 0; qc < 2; ++qc)
        for (int x = 0; x < 3; ++x) {
            t->release(t->self, w.out[qc][x]);
            t->release(t->self, w.lse[qc][x]);
        }
    finish(&g);
    return st;
}

/* Backward scratch: the K/V ring buffers, this step's dK/dV contribution (packed like a K/V
 * block), the accumulator received and the one being sent, one block's gradients, the local dq
 * sums and the lse of each local query chunk. */
typedef struct backward_buffers {
    void *kv[2];    /* in the input dtype */
    float *kv_wide; /* the current block widened to f32 (f16/bf16 only) */
    float *contrib, *dkv_in, *dkv_out;   /* f32, whatever the input dtype */
    float *dq_part, *dk_part, *dv_part, *dq[2], *lse[2];
} backward_buffers;

/* This block's gradients added to the sums, in fixed orders: dq over the ring's steps, the
 * contribution over query chunks (key chunk kc of the K/V block layout). */
static fa_status add_block_gradients(const ring *g, backward_buffers *w, int qc, int kc)
{
    const fa_ring_transport *t = g->t;
    const int64_t k_floats = g->batch * 2 * g->chunk * g->hk * g->d, q_floats = g->batch * g->chunk * g->hq * g->d;
    const int64_t chunk_k = g->chunk * g->hk * g->d, row_k = 2 * chunk_k; /* floats per batch of a block */
    float *dk_sum = w->contrib + kc * chunk_k, *dv_sum = w->contrib + k_floats + kc * chunk_k;
    fa_status st = t->add_rows(t->self, w->dq[qc], 0, w->dq[qc], 0, w->dq_part, 0, q_floats, 1);
    if (!st) st = t->add_rows(t->self, dk_sum, row_k, dk_sum, row_k, w->dk_part, chunk_k, chunk_k, g->batch);
    if (!st) st = t->add_rows(t->self, dv_sum, row_k, dv_sum, row_k, w->dv_part, chunk_k, chunk_k, g->batch);
    return st;
}

static fa_status ring_backward_steps(ring *g, fa_context *ctx, const fa_tensor *q, const fa_tensor *out,
                                     const fa_tensor *dout, backward_buffers *w)
{
    const fa_ring_transport *t = g->t;
    const int64_t kv_count = kv_elements(g);
    const size_t kv_floats_bytes = (size_t)kv_count * sizeof(float);
    fa_status st = FA_SUCCESS, comm;
    for (int s = 0; s < g->size; ++s) {
        const int cur = s & 1, src = (g->rank - s + g->size) % g->size;
        /* The next K/V block first, so that it overlaps this block's compute. */
        if (s + 1 < g->size && (comm = post_kv_exchange(g, w->kv[1 - cur], w->kv[cur])) != FA_SUCCESS) return comm;
        fa_status local = t->zero(t->self, w->contrib, kv_floats_bytes);
        if (!st) st = local;
        float *kv = st ? NULL : kv_f32(g, w->kv[cur], w->kv_wide);
        if (!st && !kv) st = fa_private_set_error(FA_ERROR_BACKEND_FAILURE, "fa_ring_backward: widening a K/V block");
        for (int qc = 0; qc < 2 && !st; ++qc) {
            const fa_tensor bq = chunk_view(q, qc, g->chunk), bo = chunk_view(out, qc, g->chunk);
            const fa_tensor bdo = chunk_view(dout, qc, g->chunk);
            for (int kc = 0; kc < 2 && !st; ++kc) {
                fa_attention_desc desc;
                if (!block_desc(g, src, qc, kc, &desc)) continue;
                fa_tensor bk, bv;
                kv_chunk(g, kv, kc, &bk, &bv);
                fa_tensor dq = packed(w->dq_part, g->batch, g->chunk, g->hq, g->d);
                fa_tensor dk = packed(w->dk_part, g->batch, g->chunk, g->hk, g->d);
                fa_tensor dv = packed(w->dv_part, g->batch, g->chunk, g->hk, g->d);
                st = fa_backward(ctx, &desc, &bq, &bk, &bv, &bo, &bdo, w->lse[qc], &dq, &dk, &dv);
                if (!st) st = add_block_gradients(g, w, qc, kc);
            }
        }
        /* The block's accumulator: what the ranks before added, then this rank's contribution
         * (a failed rank sends whatever it has: the final agreement discards the result). */
        if (s == 0) {
            local = t->copy_rows(t->self, w->dkv_out, kv_floats_bytes, w->contrib, kv_floats_bytes, kv_floats_bytes, 1);
        } else {
            if ((comm = t->wait(t->self, FA_RING_DKV)) != FA_SUCCESS) return comm;
            local = t->add_rows(t->self, w->dkv_out, 0, w->dkv_in, 0, w->contrib, 0, kv_count, 1);
        }
        if (!st) st = local;
        /* To the next rank; after the last step that is the block's owner. */
        if ((comm = t->post(t->self, FA_RING_DKV, w->dkv_out, w->dkv_in, kv_count, 4)) != FA_SUCCESS) return comm;
        if (s + 1 < g->size && (comm = t->wait(t->self, FA_RING_KV)) != FA_SUCCESS) return comm;
    }
    comm = t->wait(t->self, FA_RING_DKV); /* this rank's own dK/dV, complete */
    return comm ? comm : st;
}

fa_status fa_ring_run_backward(const fa_ring_transport *t, fa_context *ctx, const fa_attention_desc *desc,
                               const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                               const fa_tensor *dout, const float *lse, fa_tensor *dq, fa_tensor *dk, fa_tensor *dv)
{
    ring g;
    start(t, &g);
    fa_status st = check_local(ctx, desc, q, k, v, out, &g);
    if (!st && !lse) st = fa_private_set_error(FA_ERROR_INVALID_VALUE, "lse: is NULL (backward needs the forward's lse)");
    if (!st && (st = check_like("dout", dout, "q", q)) == FA_SUCCESS && (st = check_like("dq", dq, "q", q)) == FA_SUCCESS &&
        (st = check_like("dk", dk, "k", k)) == FA_SUCCESS)
        st = check_like("dv", dv, "v", v);
    int64_t sig[24];
    const int count = signature(&g, sig);
    st = agree(&g, st, sig, count);
    backward_buffers w = {0};
    float *wide[3] = {NULL, NULL, NULL}; /* q, out, dout widened (f16/bf16) */
    if (!st) {
        const size_t kv_floats = (size_t)kv_elements(&g), kv_bytes = kv_floats * fa_dtype_size(g.dtype);
        const size_t q_floats = (size_t)(g.batch * g.chunk * g.hq * g.d), k_floats = (size_t)(g.batch * g.chunk * g.hk * g.d);
        const size_t l_floats = (size_t)(g.batch * g.hq * g.chunk);
        float **kv_sized[] = {&w.contrib, &w.dkv_in, &w.dkv_out};
        int ok = grab(&g, &w.kv[0], kv_bytes, 1);
        ok = grab(&g, &w.kv[1], kv_bytes, ok);
        if (g.dtype != FA_DTYPE_F32) ok = grab(&g, &w.kv_wide, kv_floats * sizeof(float), ok);
        for (size_t x = 0; x < sizeof kv_sized / sizeof *kv_sized; ++x) ok = grab(&g, kv_sized[x], kv_floats * sizeof(float), ok);
        ok = grab(&g, &w.dq_part, q_floats * sizeof(float), ok);
        ok = grab(&g, &w.dk_part, k_floats * sizeof(float), ok);
        ok = grab(&g, &w.dv_part, k_floats * sizeof(float), ok);
        for (int qc = 0; qc < 2; ++qc) {
            ok = grab(&g, &w.dq[qc], q_floats * sizeof(float), ok) && t->zero(t->self, w.dq[qc], q_floats * sizeof(float)) == FA_SUCCESS;
            ok = grab(&g, &w.lse[qc], l_floats * sizeof(float), ok);
        }
        const fa_tensor sq = fa_ring_strided(q), so = fa_ring_strided(out), sdo = fa_ring_strided(dout);
        fa_tensor wq = sq, wo = so, wdo = sdo;
        if (ok) {
            wq = f32_view(&g, &sq, &wide[0]);
            wo = f32_view(&g, &so, &wide[1]);
            wdo = f32_view(&g, &sdo, &wide[2]);
        }
        ok = ok && wq.data && wo.data && wdo.data;
        if (!ok) st = fa_private_set_error(FA_ERROR_OUT_OF_MEMORY, "fa_ring_backward: ring buffers");
        if (!st) st = pack_kv(&g, k, v, w.kv[0]);
        const size_t c_bytes = (size_t)g.chunk * sizeof(float);
        for (int qc = 0; qc < 2 && !st; ++qc) /* each chunk's lse rows, contiguous as fa_backward reads them */
            st = t->copy_rows(t->self, w.lse[qc], c_bytes, lse + qc * g.chunk, 2 * c_bytes, c_bytes, (size_t)(g.batch * g.hq));
        st = agree(&g, st, sig, count);
        if (!st) st = agree(&g, ring_backward_steps(&g, ctx, &wq, &wo, &wdo, &w), sig, count);
    }
    if (!st) { /* every rank succeeded: the outputs, rounded to their dtype here and only here */
        const fa_tensor sdq = fa_ring_strided(dq), sdk = fa_ring_strided(dk), sdv = fa_ring_strided(dv);
        for (int qc = 0; qc < 2 && !st; ++qc) st = t->unpack(t->self, w.dq[qc], qc, g.chunk, &sdq);
        if (!st) st = t->unpack(t->self, w.dkv_in, 0, 2 * g.chunk, &sdk); /* this rank's dK then dV, complete */
        if (!st) st = t->unpack(t->self, w.dkv_in + kv_elements(&g) / 2, 0, 2 * g.chunk, &sdv);
    }
    void *owned[] = {w.kv[0], w.kv[1], w.kv_wide, w.contrib, w.dkv_in, w.dkv_out, w.dq_part,
                     w.dk_part, w.dv_part, w.dq[0], w.dq[1], w.lse[0], w.lse[1], wide[0], wide[1], wide[2]};
    for (size_t x = 0; x < sizeof owned / sizeof *owned; ++x) t->release(t->self, owned[x]);
    finish(&g);
    return st;
}

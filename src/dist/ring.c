/* Ring attention over MPI (flashattn_dist.h): the zigzag layout, the K/V ring with the next
 * block's exchange posted before the current block's compute, partial outputs merged by lse in
 * ring order, and the dK/dV accumulators that travel with K/V in the backward. Every rank agrees
 * on the status before and after the ring, so no rank is left waiting for a failed one.
 *
 * f16/bf16: K and V travel in the input dtype (half the bytes); every block is computed in f32 on
 * the widened values (exact), so the partial outputs, their merges, dq's sum and the dK/dV
 * accumulators stay f32 and only the final out, dq, dk, dv are rounded to the input dtype, once.
 * The CPU backend widens f16/bf16 tiles to f32 itself, so this is the arithmetic of one call. */
#include "flashattn_dist.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../common/dtype.h"
#include "../common/error.h"
#include "../common/half.h"

enum { TAG_KV = 0x6661, TAG_DKV = 0x6662 };

typedef struct ring {
    MPI_Comm comm;               /* duplicate of the caller's, MPI_ERRORS_RETURN */
    int rank, size;
    int64_t batch, chunk, hq, hk, d; /* chunk: C tokens; local rows 2C */
    fa_dtype dtype;              /* of every tensor; K/V travel in it */
    MPI_Datatype mpi_dtype;      /* MPI_FLOAT, or MPI_UINT16_T for f16/bf16 (sent as bits) */
    fa_attention_desc desc;      /* the caller's, complete */
    int32_t *valid_k;            /* [batch] valid keys of the current block, or NULL */
} ring;

/* Tensors with explicit strides (the caller's may be packed). */
static fa_tensor strided(const fa_tensor *t)
{
    fa_tensor s = *t;
    if (!s.stride_batch && !s.stride_seq && !s.stride_head) {
        s.stride_head = s.head_dim;
        s.stride_seq = s.heads * s.head_dim;
        s.stride_batch = s.seqlen * s.stride_seq;
    }
    return s;
}

/* Local rows [c * C, (c + 1) * C) of a strided tensor. */
static fa_tensor chunk_view(const fa_tensor *t, int64_t c, int64_t chunk)
{
    fa_tensor v = *t;
    v.data = (char *)t->data + c * chunk * t->stride_seq * (int64_t)fa_dtype_size(t->dtype);
    v.seqlen = chunk;
    return v;
}

/* A packed f32 [batch, rows, heads, d] buffer as a tensor. */
static fa_tensor packed(float *data, int64_t batch, int64_t rows, int64_t heads, int64_t d)
{
    return (fa_tensor){data, FA_DTYPE_F32, batch, rows, heads, d, rows * heads * d, heads * d, d};
}

/* Global chunk held at local chunk c (0 or 1) of rank r: zigzag. */
static int64_t global_chunk(const ring *g, int r, int c) { return c == 0 ? r : 2 * (int64_t)g->size - 1 - r; }

static fa_status mpi_failed(int code, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, text, &len);
    return fa_private_set_error(FA_ERROR_BACKEND_FAILURE, "%s: MPI error: %s", what, text);
}

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
    const int packed_layout = !t->stride_batch && !t->stride_seq && !t->stride_head;
    if (!packed_layout && (t->stride_batch <= 0 || t->stride_seq <= 0 || t->stride_head <= 0))
        return fa_private_set_error(FA_ERROR_INVALID_VALUE, "%s: strides must be all 0 (packed) or all positive", name);
    int64_t last = t->head_dim, term;
    int overflow = packed_layout && (__builtin_mul_overflow(t->heads, t->head_dim, &term) ||
                                     __builtin_mul_overflow(t->seqlen, term, &term) ||
                                     __builtin_mul_overflow(t->batch, term, &term));
    if (!overflow) { /* the packed strides are computable now */
        const fa_tensor e = strided(t);
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
    if (fa_context_backend(ctx) != FA_BACKEND_CPU)
        return fa_private_set_error(ctx ? FA_ERROR_NOT_SUPPORTED : FA_ERROR_INVALID_VALUE,
                            "ctx: ring attention needs a CPU context (the MPI path exchanges host memory)");
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
    g->mpi_dtype = q->dtype == FA_DTYPE_F32 ? MPI_FLOAT : MPI_UINT16_T;
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
            return fa_private_set_error(FA_ERROR_NOT_SUPPORTED, "k: a block of K and V exceeds 2^31 elements (one MPI message)");
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
    int64_t in[1 + 2 * MAX_SIG], red[1 + 2 * MAX_SIG];
    in[0] = st ? -(((int64_t)st << 32) | (int64_t)g->rank) : 0; /* MIN of -code = MAX of code */
    for (int x = 0; x < count; ++x) {
        in[1 + x] = sig[x];
        in[1 + count + x] = -sig[x];
    }
    const int rc = MPI_Allreduce(in, red, 1 + 2 * count, MPI_INT64_T, MPI_MIN, g->comm);
    if (rc != MPI_SUCCESS) return mpi_failed(rc, "MPI_Allreduce (status agreement)");
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

/* n elements from one dtype to another: a copy, or f16/bf16 widened to f32 (exact), or f32
 * rounded to f16/bf16 (the ring's only rounding, of its final outputs). */
static void convert(fa_dtype from, const void *src, fa_dtype to, void *dst, int64_t n)
{
    const uint16_t *h = src;
    const float *f = src;
    float *wide = dst;
    uint16_t *narrow = dst;
    if (from == to) memcpy(dst, src, (size_t)n * fa_dtype_size(to));
    else if (from == FA_DTYPE_F16) for (int64_t x = 0; x < n; ++x) wide[x] = fa_f16_to_f32(h[x]);
    else if (from == FA_DTYPE_BF16) for (int64_t x = 0; x < n; ++x) wide[x] = fa_bf16_to_f32(h[x]);
    else if (to == FA_DTYPE_F16) for (int64_t x = 0; x < n; ++x) narrow[x] = fa_f32_to_f16(f[x]);
    else for (int64_t x = 0; x < n; ++x) narrow[x] = fa_f32_to_bf16(f[x]);
}

static void *element(const fa_tensor *t, int64_t b, int64_t s, int64_t h)
{
    return (char *)t->data + (b * t->stride_batch + s * t->stride_seq + h * t->stride_head) *
                                 (int64_t)fa_dtype_size(t->dtype);
}

/* dst (packed [batch, rows, heads, d] of dtype to) = t's rows. */
static void pack_rows(const fa_tensor *t, void *dst, fa_dtype to)
{
    const int64_t row = t->head_dim * (int64_t)fa_dtype_size(to);
    for (int64_t b = 0; b < t->batch; ++b)
        for (int64_t s = 0; s < t->seqlen; ++s)
            for (int64_t h = 0; h < t->heads; ++h)
                convert(t->dtype, element(t, b, s, h), to,
                        (char *)dst + ((b * t->seqlen + s) * t->heads + h) * row, t->head_dim);
}

/* t's rows [c * C, (c + 1) * C) = src (packed f32 [batch, C, heads, d]), in t's dtype. */
static void unpack_chunk(const float *src, int64_t c, int64_t chunk, const fa_tensor *t)
{
    for (int64_t b = 0; b < t->batch; ++b)
        for (int64_t s = 0; s < chunk; ++s)
            for (int64_t h = 0; h < t->heads; ++h)
                convert(FA_DTYPE_F32, src + ((b * chunk + s) * t->heads + h) * t->head_dim, t->dtype,
                        element(t, b, c * chunk + s, h), t->head_dim);
}

/* An f32 view of t: t itself when it is f32, else its rows widened into *copy (packed; NULL when
 * out of memory). The ring computes every block on f32 views. */
static fa_tensor f32_view(const fa_tensor *t, float **copy)
{
    if (t->dtype == FA_DTYPE_F32) return *t;
    *copy = malloc((size_t)(t->batch * t->seqlen * t->heads * t->head_dim) * sizeof(float));
    if (*copy) pack_rows(t, *copy, FA_DTYPE_F32);
    return packed(*copy, t->batch, t->seqlen, t->heads, t->head_dim);
}

static int open_ring(MPI_Comm comm, ring *g)
{
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) return fa_private_set_error(FA_ERROR_INVALID_VALUE, "comm: MPI is not initialised (call MPI_Init)");
    if (comm == MPI_COMM_NULL) return fa_private_set_error(FA_ERROR_INVALID_VALUE, "comm: is MPI_COMM_NULL");
    memset(g, 0, sizeof *g);
    int rc = MPI_Comm_dup(comm, &g->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(g->comm, &g->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(g->comm, &g->size);
    return rc == MPI_SUCCESS ? FA_SUCCESS : mpi_failed(rc, "comm");
}

static void close_ring(ring *g)
{
    free(g->valid_k);
    if (g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
}

/* Elements of a K/V block (K [batch, 2C, hk, d], then V). */
static int64_t kv_elements(const ring *g) { return g->batch * 2 * g->chunk * g->hk * g->d * 2; }

/* Posts the next step's K/V exchange: receive into next from the left, send cur to the right. */
static int post_kv_exchange(const ring *g, void *next, void *cur, MPI_Request req[2])
{
    const int left = (g->rank + g->size - 1) % g->size, right = (g->rank + 1) % g->size;
    const int count = (int)kv_elements(g);
    int rc = MPI_Irecv(next, count, g->mpi_dtype, left, TAG_KV, g->comm, &req[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Isend(cur, count, g->mpi_dtype, right, TAG_KV, g->comm, &req[1]);
    return rc;
}

/* The received K/V block as f32: itself, or widened into wide (f16/bf16). Reading a buffer that
 * is being sent is allowed (MPI 3). */
static float *kv_f32(const ring *g, void *kv, float *wide)
{
    if (g->dtype == FA_DTYPE_F32) return kv;
    convert(g->dtype, kv, FA_DTYPE_F32, wide, kv_elements(g));
    return wide;
}

/* K and V of key chunk kc of a packed f32 K/V block. */
static void kv_chunk(const ring *g, float *kv, int kc, fa_tensor *k, fa_tensor *v)
{
    const fa_tensor whole_k = packed(kv, g->batch, 2 * g->chunk, g->hk, g->d);
    const fa_tensor whole_v = packed(kv + g->batch * 2 * g->chunk * g->hk * g->d, g->batch, 2 * g->chunk, g->hk, g->d);
    *k = chunk_view(&whole_k, kc, g->chunk);
    *v = chunk_view(&whole_v, kc, g->chunk);
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
    fa_status st = FA_SUCCESS;
    for (int s = 0; s < g->size; ++s) {
        const int cur = s & 1, src = (g->rank - s + g->size) % g->size;
        MPI_Request req[2];
        int rc = MPI_SUCCESS;
        /* The next block's exchange first, so that it overlaps this block's compute. */
        if (s + 1 < g->size && (rc = post_kv_exchange(g, w->kv[1 - cur], w->kv[cur], req)) != MPI_SUCCESS)
            return mpi_failed(rc, "MPI_Isend/Irecv (K/V ring)");
        float *kv = kv_f32(g, w->kv[cur], w->kv_wide);
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
        if (s + 1 < g->size && (rc = MPI_Waitall(2, req, MPI_STATUSES_IGNORE)) != MPI_SUCCESS)
            return mpi_failed(rc, "MPI_Waitall (K/V ring)");
    }
    return st;
}

fa_status fa_ring_forward(fa_context *ctx, MPI_Comm comm, const fa_attention_desc *desc, const fa_tensor *q,
                          const fa_tensor *k, const fa_tensor *v, fa_tensor *out, float *lse)
{
    ring g;
    fa_status st = open_ring(comm, &g);
    if (st) return st;
    st = check_local(ctx, desc, q, k, v, out, &g);
    int64_t sig[24];
    const int count = signature(&g, sig);
    st = agree(&g, st, sig, count);
    forward_buffers w = {0};
    int have[2] = {0, 0};
    float *q_wide = NULL;
    fa_tensor so;
    if (!st) {
        const size_t kv_bytes = (size_t)kv_elements(&g) * fa_dtype_size(g.dtype);
        const size_t o_floats = (size_t)(g.batch * g.chunk * g.hq * g.d), l_floats = (size_t)(g.batch * g.hq * g.chunk);
        int ok = (w.kv[0] = malloc(kv_bytes)) && (w.kv[1] = malloc(kv_bytes));
        if (g.dtype != FA_DTYPE_F32) ok = (w.kv_wide = malloc((size_t)kv_elements(&g) * sizeof(float))) && ok;
        for (int qc = 0; qc < 2; ++qc)
            for (int x = 0; x < 3; ++x)
                ok = (w.out[qc][x] = malloc(o_floats * sizeof(float))) && (w.lse[qc][x] = malloc(l_floats * sizeof(float))) &&
                     ok;
        const fa_tensor sq = strided(q);
        const fa_tensor wq = f32_view(&sq, &q_wide);
        ok = ok && wq.data;
        if (!ok) st = fa_private_set_error(FA_ERROR_OUT_OF_MEMORY, "fa_ring_forward: ring buffers");
        so = strided(out);
        if (!st) {
            const fa_tensor sk = strided(k), sv = strided(v);
            pack_rows(&sk, w.kv[0], g.dtype);
            pack_rows(&sv, (char *)w.kv[0] + kv_bytes / 2, g.dtype);
        }
        /* Every rank enters the ring only when every rank could allocate. */
        st = agree(&g, st, sig, count);
        if (!st) st = agree(&g, ring_forward_steps(&g, ctx, &wq, &w, have), sig, count);
    }
    if (!st) { /* every rank succeeded: now, and only now, the outputs */
        for (int qc = 0; qc < 2; ++qc) {
            unpack_chunk(w.out[qc][0], qc, g.chunk, &so);
            for (int64_t bh = 0; lse && bh < g.batch * g.hq; ++bh)
                memcpy(lse + bh * 2 * g.chunk + qc * g.chunk, w.lse[qc][0] + bh * g.chunk, (size_t)g.chunk * sizeof *lse);
        }
    }
    free(w.kv[0]);
    free(w.kv[1]);
    free(w.kv_wide);
    free(q_wide);
    for (int qc = 0; qc < 2; ++qc)
        for (int x = 0; x < 3; ++x) {
            free(w.out[qc][x]);
            free(w.lse[qc][x]);
        }
    close_ring(&g);
    return st;
}

/* Backward scratch: the K/V ring buffers, this step's dK/dV contribution (packed like a K/V
 * block), the accumulators in flight (received; two being sent), one block's gradients, the local
 * dq sums and the lse of each local query chunk. */
typedef struct backward_buffers {
    void *kv[2];    /* in the input dtype */
    float *kv_wide; /* the current block widened to f32 (f16/bf16 only) */
    float *contrib, *dkv_in, *dkv_out[2];   /* f32, whatever the input dtype */
    float *dq_part, *dk_part, *dv_part, *dq[2], *lse[2];
} backward_buffers;

static fa_status ring_backward_steps(ring *g, fa_context *ctx, const fa_tensor *q, const fa_tensor *out,
                                     const fa_tensor *dout, backward_buffers *w)
{
    const int left = (g->rank + g->size - 1) % g->size, right = (g->rank + 1) % g->size;
    const int64_t k_floats = g->batch * 2 * g->chunk * g->hk * g->d, q_floats = g->batch * g->chunk * g->hq * g->d;
    const int kv_count = (int)(2 * k_floats);
    const int64_t chunk_k = g->chunk * g->hk * g->d, row_k = 2 * chunk_k; /* floats per batch of a block */
    MPI_Request dkv_recv = MPI_REQUEST_NULL, dkv_send[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    fa_status st = FA_SUCCESS;
    int rc = MPI_SUCCESS;
    for (int s = 0; s < g->size && rc == MPI_SUCCESS; ++s) {
        const int cur = s & 1, src = (g->rank - s + g->size) % g->size;
        MPI_Request req[2];
        /* The next K/V block first, so that it overlaps this block's compute. */
        if (s + 1 < g->size && (rc = post_kv_exchange(g, w->kv[1 - cur], w->kv[cur], req)) != MPI_SUCCESS) break;
        memset(w->contrib, 0, (size_t)kv_count * sizeof *w->contrib);
        float *kv = kv_f32(g, w->kv[cur], w->kv_wide);
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
                if (st) break;
                /* Fixed orders: dq over the ring's steps, the contribution over query chunks. */
                for (int64_t x = 0; x < q_floats; ++x) w->dq[qc][x] += w->dq_part[x];
                for (int64_t b = 0; b < g->batch; ++b)
                    for (int64_t x = 0; x < chunk_k; ++x) {
                        w->contrib[b * row_k + kc * chunk_k + x] += w->dk_part[b * chunk_k + x];
                        w->contrib[k_floats + b * row_k + kc * chunk_k + x] += w->dv_part[b * chunk_k + x];
                    }
            }
        }
        /* The block's accumulator: what the ranks before added, then this rank's contribution. */
        float *acc = w->dkv_out[cur];
        if (dkv_send[cur] != MPI_REQUEST_NULL && (rc = MPI_Wait(&dkv_send[cur], MPI_STATUS_IGNORE)) != MPI_SUCCESS) break;
        if (s == 0) {
            memcpy(acc, w->contrib, (size_t)kv_count * sizeof *acc);
        } else {
            if ((rc = MPI_Wait(&dkv_recv, MPI_STATUS_IGNORE)) != MPI_SUCCESS) break;
            for (int x = 0; x < kv_count; ++x) acc[x] = w->dkv_in[x] + w->contrib[x];
        }
        /* To the next rank; after the last step that is the block's owner. */
        rc = MPI_Isend(acc, kv_count, MPI_FLOAT, right, TAG_DKV, g->comm, &dkv_send[cur]);
        if (rc == MPI_SUCCESS) rc = MPI_Irecv(w->dkv_in, kv_count, MPI_FLOAT, left, TAG_DKV, g->comm, &dkv_recv);
        if (rc == MPI_SUCCESS && s + 1 < g->size) rc = MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
    }
    if (rc == MPI_SUCCESS) rc = MPI_Wait(&dkv_recv, MPI_STATUS_IGNORE); /* this rank's own dK/dV, complete */
    if (rc == MPI_SUCCESS) rc = MPI_Waitall(2, dkv_send, MPI_STATUSES_IGNORE);
    return rc != MPI_SUCCESS ? mpi_failed(rc, "MPI (dK/dV ring)") : st;
}

fa_status fa_ring_backward(fa_context *ctx, MPI_Comm comm, const fa_attention_desc *desc, const fa_tensor *q,
                           const fa_tensor *k, const fa_tensor *v, const fa_tensor *out, const fa_tensor *dout,
                           const float *lse, fa_tensor *dq, fa_tensor *dk, fa_tensor *dv)
{
    ring g;
    fa_status st = open_ring(comm, &g);
    if (st) return st;
    st = check_local(ctx, desc, q, k, v, out, &g);
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
        float **kv_sized[] = {&w.contrib, &w.dkv_in, &w.dkv_out[0], &w.dkv_out[1]};
        int ok = (w.kv[0] = malloc(kv_bytes)) && (w.kv[1] = malloc(kv_bytes));
        if (g.dtype != FA_DTYPE_F32) ok = (w.kv_wide = malloc(kv_floats * sizeof(float))) && ok;
        for (size_t x = 0; x < sizeof kv_sized / sizeof *kv_sized; ++x)
            ok = (*kv_sized[x] = malloc(kv_floats * sizeof(float))) && ok;
        ok = (w.dq_part = malloc(q_floats * sizeof(float))) && ok;
        ok = (w.dk_part = malloc(k_floats * sizeof(float))) && ok;
        ok = (w.dv_part = malloc(k_floats * sizeof(float))) && ok;
        for (int qc = 0; qc < 2; ++qc) {
            ok = (w.dq[qc] = calloc(q_floats, sizeof(float))) && ok;
            ok = (w.lse[qc] = malloc(l_floats * sizeof(float))) && ok;
        }
        const fa_tensor sq = strided(q), so = strided(out), sdo = strided(dout);
        const fa_tensor wq = f32_view(&sq, &wide[0]), wo = f32_view(&so, &wide[1]), wdo = f32_view(&sdo, &wide[2]);
        ok = ok && wq.data && wo.data && wdo.data;
        if (!ok) st = fa_private_set_error(FA_ERROR_OUT_OF_MEMORY, "fa_ring_backward: ring buffers");
        if (!st) {
            const fa_tensor sk = strided(k), sv = strided(v);
            pack_rows(&sk, w.kv[0], g.dtype);
            pack_rows(&sv, (char *)w.kv[0] + kv_bytes / 2, g.dtype);
            for (int qc = 0; qc < 2; ++qc) /* each chunk's lse rows, contiguous as fa_backward reads them */
                for (int64_t bh = 0; bh < g.batch * g.hq; ++bh)
                    memcpy(w.lse[qc] + bh * g.chunk, lse + bh * 2 * g.chunk + qc * g.chunk, (size_t)g.chunk * sizeof(float));
        }
        st = agree(&g, st, sig, count);
        if (!st) st = agree(&g, ring_backward_steps(&g, ctx, &wq, &wo, &wdo, &w), sig, count);
    }
    if (!st) { /* every rank succeeded: the outputs, rounded to their dtype here and only here */
        const fa_tensor sdq = strided(dq), sdk = strided(dk), sdv = strided(dv);
        for (int qc = 0; qc < 2; ++qc) unpack_chunk(w.dq[qc], qc, g.chunk, &sdq);
        unpack_chunk(w.dkv_in, 0, 2 * g.chunk, &sdk); /* this rank's dK then dV, complete */
        unpack_chunk(w.dkv_in + kv_elements(&g) / 2, 0, 2 * g.chunk, &sdv);
    }
    void *owned[] = {w.kv[0], w.kv[1], w.kv_wide, w.contrib, w.dkv_in, w.dkv_out[0], w.dkv_out[1], w.dq_part,
                     w.dk_part, w.dv_part, w.dq[0], w.dq[1], w.lse[0], w.lse[1], wide[0], wide[1], wide[2]};
    for (size_t x = 0; x < sizeof owned / sizeof *owned; ++x) free(owned[x]);
    close_ring(&g);
    return st;
}

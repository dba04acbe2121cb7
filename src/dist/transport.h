/* The ring's transports: ring.c holds the algorithm (zigzag chunks, block descs, merge order, the
 * dK/dV accumulators, the agreements before and after) and reaches the other ranks and the
 * context's memory only through this table. ring_mpi.c (host memory, MPI) and ring_nccl.cu
 * (device memory, NCCL) each fill one and call fa_ring_run_forward / fa_ring_run_backward. */
#ifndef FA_DIST_TRANSPORT_H
#define FA_DIST_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The exchanges that can be in flight at once, one each: the K/V ring and the dK/dV ring. */
enum { FA_RING_KV = 0, FA_RING_DKV = 1, FA_RING_CHANNELS = 2 };

typedef struct fa_ring_transport {
    const char *name;      /* "MPI", "NCCL": in messages */
    fa_backend backend;    /* the only context backend it serves (its memory is what it exchanges) */
    int narrow_dtypes;     /* 1 when f16/bf16 tensors are supported (widened on the way) */
    int rank, size;
    void *self;            /* the transport's own state, first argument of every operation */
    /* A failure of this rank found while opening the transport (its message recorded), which the
     * ring reports at its first agreement, so that the other ranks return too. */
    fa_status pending;

    /* Sends count elements of elem_bytes (4: f32, 2: f16/bf16 bits) from send to the right
     * neighbour and receives as many from the left into recv, on a channel with nothing in
     * flight. wait(channel) completes that exchange: afterwards recv may be read and send
     * written by the work that follows. */
    fa_status (*post)(void *self, int channel, const void *send, void *recv, int64_t count, int elem_bytes);
    fa_status (*wait)(void *self, int channel);
    /* values[0..count) (host memory) = their minimum over the ranks, on every rank. */
    fa_status (*agree_min)(void *self, int64_t *values, int count);

    /* The context's memory. Operations are ordered with the context's own work (fa_forward...). */
    fa_status (*alloc)(void *self, size_t bytes, void **ptr);
    void (*release)(void *self, void *ptr); /* NULL is a no-op */
    fa_status (*zero)(void *self, void *dst, size_t bytes);
    /* rows rows of width bytes: dst + r * dst_pitch = src + r * src_pitch (no overlap). */
    fa_status (*copy_rows)(void *self, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                           size_t rows);
    /* dst[r * dst_pitch + x] = a[r * a_pitch + x] + b[r * b_pitch + x], x < n, r < rows, f32, in that
     * order of operands (dst may be a). */
    fa_status (*add_rows)(void *self, float *dst, int64_t dst_pitch, const float *a, int64_t a_pitch, const float *b,
                          int64_t b_pitch, int64_t n, int64_t rows);
    /* dst (packed [batch, seqlen, heads, head_dim] of dtype to) = t's elements (explicit strides). */
    fa_status (*pack)(void *self, const fa_tensor *t, void *dst, fa_dtype to);
    /* t's rows [c * chunk, (c + 1) * chunk) = src (packed f32 [batch, chunk, heads, head_dim]),
     * rounded to t's dtype (explicit strides). */
    fa_status (*unpack)(void *self, const float *src, int64_t c, int64_t chunk, const fa_tensor *t);
} fa_ring_transport;

/* The algorithm (ring.c), with the public functions' contract (include/flashattn_dist.h) on the
 * transport's ranks. */
fa_status fa_ring_run_forward(const fa_ring_transport *t, fa_context *ctx, const fa_attention_desc *desc,
                              const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, fa_tensor *out, float *lse);
fa_status fa_ring_run_backward(const fa_ring_transport *t, fa_context *ctx, const fa_attention_desc *desc,
                               const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                               const fa_tensor *dout, const float *lse, fa_tensor *dq, fa_tensor *dk, fa_tensor *dv);

/* Host helpers shared by the transports: the tensor t with explicit strides (packed when it has
 * none), and the address of its element (b, s, h, 0). */
fa_tensor fa_ring_strided(const fa_tensor *t);
void *fa_ring_element(const fa_tensor *t, int64_t b, int64_t s, int64_t h);

#ifdef __cplusplus
}
#endif
#endif /* FA_DIST_TRANSPORT_H */

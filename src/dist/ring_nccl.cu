/* Ring attention over NCCL (flashattn_dist_nccl.h): the NCCL transport of ring.c, on the device
 * memory of a CUDA context. The compute (the public API's calls, the copies and the accumulator
 * add below) runs on the caller's stream; the exchanges run on a stream of their own, each
 * posted after an event of the compute stream (a buffer is never overwritten while the compute
 * still reads it) and waited for by the compute stream through an event of the exchange (the host
 * does not block). The host blocks only for the two status agreements and the end of the call,
 * each a poll against a deadline (FLASHATTN_RING_TIMEOUT_S) with ncclCommGetAsyncError; on an
 * NCCL error or the deadline it aborts the communicator.
 *
 * Written with the vendor names of src/gpu/gpu_runtime.h, so that it compiles with nvcc against
 * the real NCCL and, as host C++, against the SIMT emulator's runtime and the NCCL double of
 * tests/dist (fake_nccl.c), where it runs. */
#include "gpu/gpu_runtime.h"

#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn_dist_nccl.h"
extern "C" {
#include "common/error.h"
}
#include "dist/transport.h"

namespace {

/* dst[r * dst_pitch + x] = a[r * a_pitch + x] + b[r * b_pitch + x]: elementwise, so no order to fix. */
struct add_rows_params {
    float *dst;
    const float *a, *b;
    int64_t dst_pitch, a_pitch, b_pitch, n, rows;
};

__global__ void __launch_bounds__(256) add_rows_kernel(add_rows_params p)
{
    for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y)
        for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < p.n; x += (int64_t)gridDim.x * blockDim.x)
            p.dst[r * p.dst_pitch + x] = p.a[r * p.a_pitch + x] + p.b[r * p.b_pitch + x];
}

struct nccl_transport {
    fa_context *ctx;
    ncclComm_t comm;
    int left, right, aborted, drained;
    fa_gpu_stream compute, exchange;
    fa_gpu_event compute_ready, exchanged[FA_RING_CHANNELS], done;
    int64_t *agree_device, *agree_host; /* the agreement's values: device, pinned host */
    double timeout_s;
};

enum { MAX_AGREE = 64 };

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

fa_status gpu_failed(fa_gpu_error e, const char *what)
{
    return fa_private_set_error(FA_ERROR_BACKEND_FAILURE, "%s: %s", what, fa_gpu_get_error_string(e));
}

fa_status nccl_failed(ncclResult_t r, const char *what)
{
    return fa_private_set_error(FA_ERROR_BACKEND_FAILURE, "%s: NCCL error: %s", what, ncclGetErrorString(r));
}

/* Aborts the communicator (once): what is left of the exchanges is abandoned on every rank that
 * still waits, which then times out or sees the error itself. */
void abort_comm(nccl_transport *n)
{
    if (!n->aborted) ncclCommAbort(n->comm);
    n->aborted = 1;
}

/* Blocks until the compute stream's work so far is complete, or the deadline passes, or NCCL
 * reports an error (also one reported as the work completes); the latter two abort the
 * communicator. */
fa_status drain(nccl_transport *n, const char *what)
{
    fa_gpu_error e = fa_gpu_event_record(n->done, n->compute);
    if (e != fa_gpu_success) return gpu_failed(e, what);
    const double deadline = now_s() + n->timeout_s;
    for (;;) {
        e = fa_gpu_event_query(n->done);
        if (e != fa_gpu_success && e != fa_gpu_error_not_ready) return gpu_failed(e, what);
        ncclResult_t async = ncclSuccess;
        if (!n->aborted && ncclCommGetAsyncError(n->comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
            abort_comm(n);
            return nccl_failed(async, what);
        }
        if (e == fa_gpu_success) return FA_SUCCESS;
        if (now_s() > deadline) {
            abort_comm(n);
            return fa_private_set_error(FA_ERROR_BACKEND_FAILURE, "%s: no progress within %g s (FLASHATTN_RING_TIMEOUT_S); "
                                        "the NCCL communicator was aborted", what, n->timeout_s);
        }
        struct timespec pause = {0, 100000};
        nanosleep(&pause, NULL);
    }
}

/* ---- messages ---- */
fa_status post(void *self, int channel, const void *send, void *recv, int64_t count, int elem_bytes)
{
    nccl_transport *n = static_cast<nccl_transport *>(self);
    if (n->aborted) return fa_private_set_error(FA_ERROR_BACKEND_FAILURE, "NCCL ring: the communicator was aborted");
    const char *what = channel == FA_RING_KV ? "NCCL send/recv (K/V ring)" : "NCCL send/recv (dK/dV ring)";
    /* After the compute enqueued so far: it may still read send's buffer or recv's old contents. */
    fa_gpu_error e = fa_gpu_event_record(n->compute_ready, n->compute);
    if (e == fa_gpu_success) e = fa_gpu_stream_wait_event(n->exchange, n->compute_ready, 0);
    if (e != fa_gpu_success) return gpu_failed(e, what);
    const ncclDataType_t type = elem_bytes == 4 ? ncclFloat32 : ncclFloat16; /* 2 bytes travel as bits */
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess) r = ncclSend(send, (size_t)count, type, n->right, n->comm, (cudaStream_t)n->exchange);
    if (r == ncclSuccess) r = ncclRecv(recv, (size_t)count, type, n->left, n->comm, (cudaStream_t)n->exchange);
    const ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess) r = end;
    if (r != ncclSuccess && r != ncclInProgress) {
        abort_comm(n);
        return nccl_failed(r, what);
    }
    e = fa_gpu_event_record(n->exchanged[channel], n->exchange);
    return e == fa_gpu_success ? FA_SUCCESS : gpu_failed(e, what);
}

fa_status wait(void *self, int channel)
{
    nccl_transport *n = static_cast<nccl_transport *>(self);
    const fa_gpu_error e = fa_gpu_stream_wait_event(n->compute, n->exchanged[channel], 0);
    return e == fa_gpu_success ? FA_SUCCESS : gpu_failed(e, "NCCL ring: ordering the compute after an exchange");
}

fa_status agree_min(void *self, int64_t *values, int count)
{
    nccl_transport *n = static_cast<nccl_transport *>(self);
    const char *what = "ncclAllReduce (status agreement)";
    if (n->aborted) return fa_private_set_error(FA_ERROR_BACKEND_FAILURE, "NCCL ring: the communicator was aborted");
    if (count > MAX_AGREE) return fa_private_set_error(FA_ERROR_BACKEND_FAILURE, "%s: %d values exceed the buffer", what, count);
    const size_t bytes = (size_t)count * sizeof *values;
    memcpy(n->agree_host, values, bytes);
    fa_gpu_error e = fa_gpu_memcpy_async(n->agree_device, n->agree_host, bytes, fa_gpu_memcpy_h2d, n->compute);
    if (e != fa_gpu_success) return gpu_failed(e, what);
    const ncclResult_t r = ncclAllReduce(n->agree_device, n->agree_device, (size_t)count, ncclInt64, ncclMin, n->comm,
                                         (cudaStream_t)n->compute);
    if (r != ncclSuccess && r != ncclInProgress) {
        abort_comm(n);
        return nccl_failed(r, what);
    }
    e = fa_gpu_memcpy_async(n->agree_host, n->agree_device, bytes, fa_gpu_memcpy_d2h, n->compute);
    if (e != fa_gpu_success) return gpu_failed(e, what);
    const fa_status st = drain(n, what);
    if (st) return st;
    memcpy(values, n->agree_host, bytes);
    return FA_SUCCESS;
}

/* ---- the context's device memory, on the compute stream ---- */
fa_status alloc(void *self, size_t bytes, void **ptr)
{
    return fa_malloc(static_cast<nccl_transport *>(self)->ctx, bytes ? bytes : 1, ptr);
}

void release(void *self, void *ptr)
{
    nccl_transport *n = static_cast<nccl_transport *>(self);
    if (!ptr) return;
    if (!n->drained && !n->aborted) { /* the first release waits (bounded) for the work that may still use the buffers */
        n->drained = 1;
        drain(n, "NCCL ring: the end of the call");
    }
    fa_free(n->ctx, ptr);
}

fa_status zero(void *self, void *dst, size_t bytes)
{
    nccl_transport *n = static_cast<nccl_transport *>(self);
    const fa_gpu_error e = fa_gpu_memset_async(dst, 0, bytes, n->compute);
    return e == fa_gpu_success ? FA_SUCCESS : gpu_failed(e, "NCCL ring: memset");
}

fa_status copy_rows(void *self, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width, size_t rows)
{
    nccl_transport *n = static_cast<nccl_transport *>(self);
    const fa_gpu_error e = fa_gpu_memcpy_2d_async(dst, dst_pitch, src, src_pitch, width, rows, fa_gpu_memcpy_d2d, n->compute);
    return e == fa_gpu_success ? FA_SUCCESS : gpu_failed(e, "NCCL ring: device copy");
}

fa_status add_rows(void *self, float *dst, int64_t dst_pitch, const float *a, int64_t a_pitch, const float *b,
                   int64_t b_pitch, int64_t count, int64_t rows)
{
    nccl_transport *n = static_cast<nccl_transport *>(self);
    const add_rows_params p = {dst, a, b, dst_pitch, a_pitch, b_pitch, count, rows};
    const int64_t blocks = (count + 255) / 256;
    const dim3 grid((unsigned)(blocks < 1024 ? blocks : 1024), (unsigned)(rows < 65535 ? rows : 65535));
    const fa_gpu_error e = fa_gpu_launch(add_rows_kernel, grid, dim3(256), 0, n->compute, p);
    return e == fa_gpu_success ? FA_SUCCESS : gpu_failed(e, "NCCL ring: accumulator add kernel");
}

/* Rows of a strided f32 tensor to or from a packed buffer: one 2D copy per batch entry when the
 * heads of a row are contiguous, else one per (batch, head). */
fa_status move_rows(nccl_transport *n, const fa_tensor *t, int64_t row0, int64_t rows, float *packed, int to_packed)
{
    const size_t es = sizeof(float), packed_pitch = (size_t)(t->heads * t->head_dim) * es;
    const int whole_rows = t->stride_head == t->head_dim;
    for (int64_t b = 0; b < t->batch; ++b)
        for (int64_t h = 0; h < (whole_rows ? 1 : t->heads); ++h) {
            char *strided = (char *)fa_ring_element(t, b, row0, h);
            char *dense = (char *)(packed + (b * rows * t->heads + h) * t->head_dim);
            const size_t width = (size_t)((whole_rows ? t->heads : 1) * t->head_dim) * es, pitch = (size_t)t->stride_seq * es;
            const fa_status st = to_packed ? copy_rows(n, dense, packed_pitch, strided, pitch, width, (size_t)rows)
                                           : copy_rows(n, strided, pitch, dense, packed_pitch, width, (size_t)rows);
            if (st) return st;
        }
    return FA_SUCCESS;
}

fa_status pack(void *self, const fa_tensor *t, void *dst, fa_dtype to)
{
    if (t->dtype != FA_DTYPE_F32 || to != FA_DTYPE_F32) /* check_local refuses f16/bf16 first */
        return fa_private_set_error(FA_ERROR_NOT_SUPPORTED, "NCCL ring: f16/bf16 are not built");
    return move_rows(static_cast<nccl_transport *>(self), t, 0, t->seqlen, static_cast<float *>(dst), 1);
}

fa_status unpack(void *self, const float *src, int64_t c, int64_t chunk, const fa_tensor *t)
{
    if (t->dtype != FA_DTYPE_F32) return fa_private_set_error(FA_ERROR_NOT_SUPPORTED, "NCCL ring: f16/bf16 are not built");
    return move_rows(static_cast<nccl_transport *>(self), t, c * chunk, chunk, const_cast<float *>(src), 0);
}

double timeout_from_environment(void)
{
    const char *text = getenv("FLASHATTN_RING_TIMEOUT_S");
    char *end = NULL;
    const double s = text ? strtod(text, &end) : 0.0;
    return text && end != text && s > 0.0 ? s : 300.0;
}

/* The transport of one call; on failure, what was created is destroyed by close_transport. */
fa_status open_transport(fa_context *ctx, ncclComm_t comm, void *stream, nccl_transport *n, fa_ring_transport *t)
{
    memset(n, 0, sizeof *n);
    n->ctx = ctx;
    n->comm = comm;
    n->compute = (fa_gpu_stream)stream;
    n->timeout_s = timeout_from_environment();
    n->drained = 1; /* nothing to wait for until the first exchange or compute */
    *t = fa_ring_transport{};
    t->name = "NCCL";
    t->backend = FA_BACKEND_CUDA;
    t->self = n;
    t->post = post;
    t->wait = wait;
    t->agree_min = agree_min;
    t->alloc = alloc;
    t->release = release;
    t->zero = zero;
    t->copy_rows = copy_rows;
    t->add_rows = add_rows;
    t->pack = pack;
    t->unpack = unpack;
    if (!comm) return fa_private_set_error(FA_ERROR_INVALID_VALUE, "comm: is NULL");
    ncclResult_t r = ncclCommUserRank(comm, &t->rank);
    if (r == ncclSuccess) r = ncclCommCount(comm, &t->size);
    if (r != ncclSuccess) return nccl_failed(r, "comm");
    n->left = (t->rank + t->size - 1) % t->size;
    n->right = (t->rank + 1) % t->size;
    fa_gpu_error e = fa_gpu_stream_create_with_flags(&n->exchange, fa_gpu_stream_non_blocking);
    if (e == fa_gpu_success) e = fa_gpu_event_create_with_flags(&n->compute_ready, fa_gpu_event_disable_timing);
    for (int c = 0; c < FA_RING_CHANNELS && e == fa_gpu_success; ++c)
        e = fa_gpu_event_create_with_flags(&n->exchanged[c], fa_gpu_event_disable_timing);
    if (e == fa_gpu_success) e = fa_gpu_event_create_with_flags(&n->done, fa_gpu_event_disable_timing);
    if (e == fa_gpu_success) e = fa_gpu_malloc_host((void **)&n->agree_host, MAX_AGREE * sizeof(int64_t));
    if (e == fa_gpu_success) e = fa_gpu_malloc((void **)&n->agree_device, MAX_AGREE * sizeof(int64_t));
    /* Without these the ranks cannot even agree: this rank returns, the others time out. */
    if (e != fa_gpu_success) return gpu_failed(e, "NCCL ring: streams, events and the agreement's buffers");
    n->drained = 0;
    /* The context's failures are agreed on (ring.c reports t->pending at the first agreement). */
    if (fa_context_backend(ctx) == FA_BACKEND_CUDA) t->pending = fa_context_set_stream(ctx, stream);
    return FA_SUCCESS;
}

void close_transport(nccl_transport *n)
{
    /* After an abort the call's message stands (and cudaFree waits for the device anyway). */
    if (!n->drained && !n->aborted && n->compute_ready) drain(n, "NCCL ring: the end of the call");
    if (n->agree_device) fa_gpu_free(n->agree_device);
    if (n->agree_host) fa_gpu_free_host(n->agree_host);
    if (n->done) fa_gpu_event_destroy(n->done);
    for (int c = 0; c < FA_RING_CHANNELS; ++c)
        if (n->exchanged[c]) fa_gpu_event_destroy(n->exchanged[c]);
    if (n->compute_ready) fa_gpu_event_destroy(n->compute_ready);
    if (n->exchange) fa_gpu_stream_destroy(n->exchange);
}

}  // namespace

extern "C" fa_status fa_ring_forward_nccl(fa_context *ctx, ncclComm_t comm, void *stream, const fa_attention_desc *desc,
                                          const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, fa_tensor *out,
                                          float *lse)
{
    nccl_transport n;
    fa_ring_transport t;
    fa_status st = open_transport(ctx, comm, stream, &n, &t);
    if (!st) st = fa_ring_run_forward(&t, ctx, desc, q, k, v, out, lse);
    close_transport(&n);
    return st;
}

extern "C" fa_status fa_ring_backward_nccl(fa_context *ctx, ncclComm_t comm, void *stream, const fa_attention_desc *desc,
                                           const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                                           const fa_tensor *out, const fa_tensor *dout, const float *lse, fa_tensor *dq,
                                           fa_tensor *dk, fa_tensor *dv)
{
    nccl_transport n;
    fa_ring_transport t;
    fa_status st = open_transport(ctx, comm, stream, &n, &t);
    if (!st) st = fa_ring_run_backward(&t, ctx, desc, q, k, v, out, dout, lse, dq, dk, dv);
    close_transport(&n);
    return st;
}

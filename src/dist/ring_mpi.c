/* Ring attention over MPI (flashattn_dist.h): the MPI transport of ring.c. Host memory of a CPU
 * context; messages on a duplicate of the caller's communicator with MPI_ERRORS_RETURN, each
 * channel with its own tag; copies, sums and dtype conversions are host loops. */
#include "flashattn_dist.h"

#include <stdlib.h>
#include <string.h>

#include "../common/dtype.h"
#include "../common/error.h"
#include "../common/half.h"
#include "transport.h"

enum { TAG_KV = 0x6661, TAG_DKV = 0x6662 };

typedef struct mpi_transport {
    MPI_Comm comm;                              /* duplicate of the caller's, MPI_ERRORS_RETURN */
    int left, right;                            /* neighbours in the ring */
    MPI_Request req[FA_RING_CHANNELS][2];       /* [channel][recv, send] */
} mpi_transport;

static const char *const channel_name[FA_RING_CHANNELS] = {"K/V ring", "dK/dV ring"};

static fa_status mpi_failed(int code, const char *what, const char *where)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, text, &len);
    return fa_private_set_error(FA_ERROR_BACKEND_FAILURE, "%s (%s): MPI error: %s", what, where, text);
}

static fa_status mpi_post(void *self, int channel, const void *send, void *recv, int64_t count, int elem_bytes)
{
    mpi_transport *m = self;
    const int tag = channel == FA_RING_KV ? TAG_KV : TAG_DKV;
    const MPI_Datatype type = elem_bytes == 4 ? MPI_FLOAT : MPI_UINT16_T; /* f16/bf16 travel as bits */
    int rc = MPI_Irecv(recv, (int)count, type, m->left, tag, m->comm, &m->req[channel][0]);
    if (rc == MPI_SUCCESS) rc = MPI_Isend(send, (int)count, type, m->right, tag, m->comm, &m->req[channel][1]);
    return rc == MPI_SUCCESS ? FA_SUCCESS : mpi_failed(rc, "MPI_Isend/Irecv", channel_name[channel]);
}

static fa_status mpi_wait(void *self, int channel)
{
    mpi_transport *m = self;
    const int rc = MPI_Waitall(2, m->req[channel], MPI_STATUSES_IGNORE);
    return rc == MPI_SUCCESS ? FA_SUCCESS : mpi_failed(rc, "MPI_Waitall", channel_name[channel]);
}

static fa_status mpi_agree_min(void *self, int64_t *values, int count)
{
    mpi_transport *m = self;
    const int rc = MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_INT64_T, MPI_MIN, m->comm);
    return rc == MPI_SUCCESS ? FA_SUCCESS : mpi_failed(rc, "MPI_Allreduce", "status agreement");
}

static fa_status host_alloc(void *self, size_t bytes, void **ptr)
{
    (void)self;
    *ptr = malloc(bytes ? bytes : 1);
    return *ptr ? FA_SUCCESS : FA_ERROR_OUT_OF_MEMORY; /* the ring names what it was allocating */
}

static void host_release(void *self, void *ptr)
{
    (void)self;
    free(ptr);
}

static fa_status host_zero(void *self, void *dst, size_t bytes)
{
    (void)self;
    memset(dst, 0, bytes);
    return FA_SUCCESS;
}

static fa_status host_copy_rows(void *self, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                                size_t rows)
{
    (void)self;
    for (size_t r = 0; r < rows; ++r) memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, width);
    return FA_SUCCESS;
}

static fa_status host_add_rows(void *self, float *dst, int64_t dst_pitch, const float *a, int64_t a_pitch, const float *b,
                               int64_t b_pitch, int64_t n, int64_t rows)
{
    (void)self;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t x = 0; x < n; ++x) dst[r * dst_pitch + x] = a[r * a_pitch + x] + b[r * b_pitch + x];
    return FA_SUCCESS;
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

static fa_status host_pack(void *self, const fa_tensor *t, void *dst, fa_dtype to)
{
    (void)self;
    const int64_t row = t->head_dim * (int64_t)fa_dtype_size(to);
    for (int64_t b = 0; b < t->batch; ++b)
        for (int64_t s = 0; s < t->seqlen; ++s)
            for (int64_t h = 0; h < t->heads; ++h)
                convert(t->dtype, fa_ring_element(t, b, s, h), to,
                        (char *)dst + ((b * t->seqlen + s) * t->heads + h) * row, t->head_dim);
    return FA_SUCCESS;
}

static fa_status host_unpack(void *self, const float *src, int64_t c, int64_t chunk, const fa_tensor *t)
{
    (void)self;
    for (int64_t b = 0; b < t->batch; ++b)
        for (int64_t s = 0; s < chunk; ++s)
            for (int64_t h = 0; h < t->heads; ++h)
                convert(FA_DTYPE_F32, src + ((b * chunk + s) * t->heads + h) * t->head_dim, t->dtype,
                        fa_ring_element(t, b, c * chunk + s, h), t->head_dim);
    return FA_SUCCESS;
}

static fa_status open_transport(MPI_Comm comm, mpi_transport *m, fa_ring_transport *t)
{
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) return fa_private_set_error(FA_ERROR_INVALID_VALUE, "comm: MPI is not initialised (call MPI_Init)");
    if (comm == MPI_COMM_NULL) return fa_private_set_error(FA_ERROR_INVALID_VALUE, "comm: is MPI_COMM_NULL");
    m->comm = MPI_COMM_NULL;
    for (int c = 0; c < FA_RING_CHANNELS; ++c) m->req[c][0] = m->req[c][1] = MPI_REQUEST_NULL;
    *t = (fa_ring_transport){.name = "MPI", .backend = FA_BACKEND_CPU, .narrow_dtypes = 1, .self = m,
                             .post = mpi_post, .wait = mpi_wait, .agree_min = mpi_agree_min,
                             .alloc = host_alloc, .release = host_release, .zero = host_zero,
                             .copy_rows = host_copy_rows, .add_rows = host_add_rows, .pack = host_pack,
                             .unpack = host_unpack};
    int rc = MPI_Comm_dup(comm, &m->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(m->comm, &t->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(m->comm, &t->size);
    if (rc == MPI_SUCCESS) {
        m->left = (t->rank + t->size - 1) % t->size;
        m->right = (t->rank + 1) % t->size;
        return FA_SUCCESS;
    }
    if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    return mpi_failed(rc, "comm", "MPI_Comm_dup");
}

fa_status fa_ring_forward(fa_context *ctx, MPI_Comm comm, const fa_attention_desc *desc, const fa_tensor *q,
                          const fa_tensor *k, const fa_tensor *v, fa_tensor *out, float *lse)
{
    mpi_transport m;
    fa_ring_transport t;
    fa_status st = open_transport(comm, &m, &t);
    if (st) return st;
    st = fa_ring_run_forward(&t, ctx, desc, q, k, v, out, lse);
    MPI_Comm_free(&m.comm);
    return st;
}

fa_status fa_ring_backward(fa_context *ctx, MPI_Comm comm, const fa_attention_desc *desc, const fa_tensor *q,
                           const fa_tensor *k, const fa_tensor *v, const fa_tensor *out, const fa_tensor *dout,
                           const float *lse, fa_tensor *dq, fa_tensor *dk, fa_tensor *dv)
{
    mpi_transport m;
    fa_ring_transport t;
    fa_status st = open_transport(comm, &m, &t);
    if (st) return st;
    st = fa_ring_run_backward(&t, ctx, desc, q, k, v, out, dout, lse, dq, dk, dv);
    MPI_Comm_free(&m.comm);
    return st;
}

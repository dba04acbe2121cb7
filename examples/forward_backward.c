/* forward_backward: one attention forward and backward step on the backend AUTO picks (CUDA, then
 * HIP, then the CPU; FLASHATTN_BACKEND=cpu|cuda|hip overrides), with the error handling a real
 * caller needs. It checks one output row against softmax(Q K^T / sqrt(d)) V computed directly,
 * one dQ entry against a finite difference of the forward, and shows the message a bad argument
 * gets. Exits 0 when every check holds.
 *   cc forward_backward.c $(pkg-config --cflags --libs flashattn) -lm      (example.h beside it) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <flashattn.h>

#include "example.h"

enum { BATCH = 2, SEQ = 64, HEADS = 4, DIM = 32 };
#define COUNT ((size_t)BATCH * SEQ * HEADS * DIM)
#define LSE_COUNT ((size_t)BATCH * HEADS * SEQ)

/* Packed [batch, seqlen, heads, head_dim] layout. */
static size_t at(int b, int i, int h, int c) { return (((size_t)b * SEQ + i) * HEADS + h) * DIM + c; }

/* softmax(tau q_i K^T) V for one row, in double. */
static void reference_row(const float *q, const float *k, const float *v, int b, int i, int h, double *o)
{
    double s[SEQ], max = -INFINITY, sum = 0.0;
    for (int j = 0; j < SEQ; ++j) {
        s[j] = 0.0;
        for (int c = 0; c < DIM; ++c) s[j] += (double)q[at(b, i, h, c)] * k[at(b, j, h, c)];
        s[j] /= sqrt((double)DIM);
        if (s[j] > max) max = s[j];
    }
    for (int j = 0; j < SEQ; ++j) sum += s[j] = exp(s[j] - max);
    for (int c = 0; c < DIM; ++c) {
        o[c] = 0.0;
        for (int j = 0; j < SEQ; ++j) o[c] += s[j] / sum * v[at(b, j, h, c)];
    }
}

int main(void)
{
    enum { Q, K, V, OUT, DOUT, DQ, DK, DV, LSE, NBUF };
    float *host[NBUF] = {0};
    void *dev[NBUF] = {0};
    fa_context *ctx = NULL;
    int ok = 0;

    TRY(fa_context_create(FA_BACKEND_AUTO, 0, &ctx));
    printf("backend %s: %s\n", fa_backend_name(fa_context_backend(ctx)), fa_context_info(ctx));

    unsigned seed = 1;
    for (int n = 0; n < NBUF; ++n) {
        const size_t count = n == LSE ? LSE_COUNT : COUNT;
        host[n] = calloc(count, sizeof(float));
        if (!host[n]) {
            fprintf(stderr, "forward_backward: out of host memory\n");
            goto done;
        }
        if (n == Q || n == K || n == V || n == DOUT)
            for (size_t e = 0; e < count; ++e) host[n][e] = uniform(&seed);
        TRY(fa_malloc(ctx, count * sizeof(float), &dev[n])); /* the backend's memory */
        TRY(fa_memcpy_h2d(ctx, dev[n], host[n], count * sizeof(float)));
    }
    fa_tensor t[DV + 1];
    for (int n = Q; n <= DV; ++n)
        t[n] = (fa_tensor){.data = dev[n], .dtype = FA_DTYPE_F32, .batch = BATCH, .seqlen = SEQ, .heads = HEADS,
                           .head_dim = DIM}; /* strides 0: packed */

    fa_attention_desc desc;
    fa_attention_desc_init(&desc); /* scale 1/sqrt(d), no masks, no dropout */
    float *lse = dev[LSE];
    TRY(fa_forward(ctx, &desc, &t[Q], &t[K], &t[V], &t[OUT], lse));
    TRY(fa_backward(ctx, &desc, &t[Q], &t[K], &t[V], &t[OUT], &t[DOUT], lse, &t[DQ], &t[DK], &t[DV]));
    TRY(fa_synchronize(ctx));
    TRY(fa_memcpy_d2h(ctx, host[OUT], dev[OUT], COUNT * sizeof(float)));
    TRY(fa_memcpy_d2h(ctx, host[DQ], dev[DQ], COUNT * sizeof(float)));

    /* 1. One output row against the formula. */
    const int b = 1, i = 5, h = 2;
    double want[DIM], worst = 0.0;
    reference_row(host[Q], host[K], host[V], b, i, h, want);
    for (int c = 0; c < DIM; ++c) worst = fmax(worst, fabs(host[OUT][at(b, i, h, c)] - want[c]));
    printf("forward: output row (batch %d, query %d, head %d) vs direct softmax(QK^T/sqrt(d))V: max |diff| %.2e\n",
           b, i, h, worst);
    if (worst > 1e-5) goto done;

    /* 2. dQ is the gradient of L = sum(out * dout): compare one entry with a central difference.
     * Only that query's output row depends on it. */
    const int c0 = 3;
    const float step = 1e-2f, q0 = host[Q][at(b, i, h, c0)];
    double loss[2];
    for (int side = 0; side < 2; ++side) {
        host[Q][at(b, i, h, c0)] = q0 + (side ? -step : step);
        TRY(fa_memcpy_h2d(ctx, dev[Q], host[Q], COUNT * sizeof(float)));
        TRY(fa_forward(ctx, &desc, &t[Q], &t[K], &t[V], &t[OUT], NULL));
        TRY(fa_memcpy_d2h(ctx, host[OUT], dev[OUT], COUNT * sizeof(float)));
        loss[side] = 0.0;
        for (int c = 0; c < DIM; ++c) loss[side] += (double)host[OUT][at(b, i, h, c)] * host[DOUT][at(b, i, h, c)];
    }
    const double fd = (loss[0] - loss[1]) / (2.0 * step), dq = host[DQ][at(b, i, h, c0)];
    printf("backward: dQ[%d,%d,%d,%d] = %.6f, finite difference of the forward %.6f\n", b, i, h, c0, dq, fd);
    if (fabs(fd - dq) > 1e-3 * (1.0 + fabs(dq))) goto done;

    /* 3. A bad argument is refused with a status and a message naming it; nothing is written. */
    fa_tensor wrong = t[OUT];
    wrong.head_dim = DIM / 2;
    fa_status st = fa_forward(ctx, &desc, &t[Q], &t[K], &t[V], &wrong, NULL);
    printf("bad argument: %s: %s\n", fa_status_string(st), fa_last_error());
    if (st != FA_ERROR_INVALID_VALUE) goto done;
    ok = 1;

done:
    for (int n = 0; n < NBUF; ++n) {
        if (dev[n]) fa_free(ctx, dev[n]);
        free(host[n]);
    }
    fa_context_destroy(ctx);
    printf("forward_backward: %s\n", ok ? "all checks passed" : "FAILED");
    return ok ? 0 : 1;
}

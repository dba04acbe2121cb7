/* A client of the public API only (flashattn.h, flashattn_io.h and libc): it prints the backends available (or why
 * not), the library picks its backend (AUTO, FLASHATTN_BACKEND unset), and a forward plus backward
 * are checked against closed forms. Also built by tests/install/consume.sh against the installed
 * package three ways, so it uses no test framework: it exits 0 on success and 1 with a message on
 * failure.
 *
 * With q = 0 every visible key gets the same probability 1/N, so (non-causal, no dropout):
 *   O_i = mean_j V_j,  lse_i = log N,  dV_j = (1/N) sum_i dO_i,  dK = 0,
 *   dQ_i = (tau / N) sum_j (dO_i . (V_j - mean V)) K_j. */
#define _POSIX_C_SOURCE 200112L /* unsetenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "flashattn_io.h"

enum { SEQ_Q = 5, SEQ_K = 7, DIM = 16 };
#define N_Q (SEQ_Q * DIM)
#define N_K (SEQ_K * DIM)

static int failures;

static void check(int ok, const char *what, double got, double want)
{
    if (!ok) {
        fprintf(stderr, "test_client: %s: got %.9g, expected %.9g\n", what, got, want);
        ++failures;
    }
}

#define CALL(expr)                                                                                 \
    do {                                                                                           \
        fa_status st_ = (expr);                                                                    \
        if (st_ != FA_SUCCESS) {                                                                   \
            fprintf(stderr, "test_client: %s: %s: %s\n", #expr, fa_status_string(st_), fa_last_error()); \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(void)
{
    unsetenv("FLASHATTN_BACKEND");
    if (fa_version_number() != FA_VERSION_NUMBER) {
        fprintf(stderr, "test_client: library %s does not match header %d\n", fa_version_string(), FA_VERSION_NUMBER);
        return 1;
    }
    static float q[N_Q], k[N_K], v[N_K], out[N_Q], dout[N_Q], dq[N_Q], dk[N_K], dv[N_K], lse[SEQ_Q];
    for (int i = 0; i < N_K; ++i) {
        k[i] = (float)sin(0.37 * i);
        v[i] = (float)cos(0.11 * i * i);
    }
    for (int i = 0; i < N_Q; ++i) dout[i] = (float)sin(1.3 * i + 0.5);

    printf("flashattn %s\n", fa_version_string());
    const fa_backend backends[] = {FA_BACKEND_CPU, FA_BACKEND_CUDA, FA_BACKEND_HIP};
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; ++i) {
        const int available = fa_backend_available(backends[i]);
        printf("%s: %s\n", fa_backend_name(backends[i]), available ? "available" : fa_last_error());
    }

    fa_context *ctx;
    CALL(fa_context_create(FA_BACKEND_AUTO, 0, &ctx));
    printf("backend %s: %s\n", fa_backend_name(fa_context_backend(ctx)), fa_context_info(ctx));
    float *host[9] = {q, k, v, out, dout, dq, dk, dv, lse};
    const size_t count[9] = {N_Q, N_K, N_K, N_Q, N_Q, N_Q, N_K, N_K, SEQ_Q};
    void *dev[9];
    for (int i = 0; i < 9; ++i) {
        CALL(fa_malloc(ctx, count[i] * sizeof(float), &dev[i]));
        CALL(fa_memcpy_h2d(ctx, dev[i], host[i], count[i] * sizeof(float)));
    }
    fa_tensor t[8];
    for (int i = 0; i < 8; ++i) {
        const int64_t seqlen = count[i] == N_Q ? SEQ_Q : SEQ_K;
        t[i] = (fa_tensor){dev[i], FA_DTYPE_F32, 1, seqlen, 1, DIM, 0, 0, 0};
    }
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    CALL(fa_forward(ctx, &desc, &t[0], &t[1], &t[2], &t[3], dev[8]));
    CALL(fa_backward(ctx, &desc, &t[0], &t[1], &t[2], &t[3], &t[4], dev[8], &t[5], &t[6], &t[7]));
    CALL(fa_synchronize(ctx));
    const int outputs[] = {3, 5, 6, 7, 8};
    for (size_t n = 0; n < sizeof outputs / sizeof outputs[0]; ++n) {
        const int i = outputs[n];
        CALL(fa_memcpy_d2h(ctx, host[i], dev[i], count[i] * sizeof(float)));
    }

    const double tau = 1.0 / sqrt((double)DIM), tol = 1e-5;
    double mean_v[DIM] = {0}, sum_dout[DIM] = {0};
    for (int j = 0; j < SEQ_K; ++j)
        for (int c = 0; c < DIM; ++c) mean_v[c] += v[j * DIM + c] / (double)SEQ_K;
    for (int i = 0; i < SEQ_Q; ++i)
        for (int c = 0; c < DIM; ++c) sum_dout[c] += dout[i * DIM + c];
    for (int i = 0; i < SEQ_Q; ++i) {
        check(fabs(lse[i] - log((double)SEQ_K)) <= tol, "lse", lse[i], log((double)SEQ_K));
        for (int c = 0; c < DIM; ++c) check(fabs(out[i * DIM + c] - mean_v[c]) <= tol, "out", out[i * DIM + c], mean_v[c]);
        double dq_want[DIM] = {0};
        for (int j = 0; j < SEQ_K; ++j) {
            double dot = 0.0;
            for (int c = 0; c < DIM; ++c) dot += dout[i * DIM + c] * (v[j * DIM + c] - mean_v[c]);
            for (int c = 0; c < DIM; ++c) dq_want[c] += tau / SEQ_K * dot * k[j * DIM + c];
        }
        for (int c = 0; c < DIM; ++c) check(fabs(dq[i * DIM + c] - dq_want[c]) <= tol, "dq", dq[i * DIM + c], dq_want[c]);
    }
    for (int j = 0; j < SEQ_K; ++j)
        for (int c = 0; c < DIM; ++c) {
            check(fabs(dk[j * DIM + c]) <= tol, "dk", dk[j * DIM + c], 0.0);
            check(fabs(dv[j * DIM + c] - sum_dout[c] / SEQ_K) <= tol, "dv", dv[j * DIM + c], sum_dout[c] / SEQ_K);
        }
    for (int i = 0; i < 9; ++i) CALL(fa_free(ctx, dev[i]));
    fa_context_destroy(ctx);

    /* The IO model's header is installed too; its default tiles are the paper's (fa_tiling_for). */
    fa_io_problem io;
    fa_io_problem_init(&io);
    io.seqlen_q = SEQ_Q;
    io.seqlen_k = SEQ_K;
    io.head_dim = DIM;
    io.sram_elements = 4096;
    fa_io_counts counts;
    CALL(fa_io_estimate(&io, FA_IO_FORWARD, &counts));
    const fa_tiling paper = fa_tiling_for(io.sram_elements, DIM);
    check(counts.block_rows == paper.block_rows, "IO model block_rows", (double)counts.block_rows,
          (double)paper.block_rows);
    check(counts.block_cols == paper.block_cols, "IO model block_cols", (double)counts.block_cols,
          (double)paper.block_cols);
    if (failures) return 1;
    printf("test_client: forward and backward match the closed forms\n");
    return 0;
}

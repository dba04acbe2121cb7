/* Ring attention over MPI (run under mpirun -np P): every rank builds the same global problem,
 * runs fa_forward / fa_backward on the whole sequence as the reference, and checks that
 * fa_ring_forward / fa_ring_backward on its zigzag rows equal the reference's rows (f32
 * tolerance) and are bit-identical across repeated calls; then that a bad argument on one rank,
 * or ranks that disagree, make every rank return an error (no hang) and write no output. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn_dist.h"
#include "test_arrays.h"

enum { BATCH = 2, HQ = 4, HK = 2, D = 32, CHUNK = 16 };

static int rank, ranks, failures;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__);       \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, "\n");                                               \
            ++failures;                                                          \
        }                                                                        \
    } while (0)

static float *random_floats(uint64_t seed, size_t n)
{
    double *x = test_random_doubles(seed, n);
    float *f = malloc(n * sizeof *f);
    if (!x || !f) abort();
    for (size_t i = 0; i < n; ++i) f[i] = (float)x[i];
    free(x);
    return f;
}

/* The rank's zigzag rows of a [BATCH, N, heads, D] array: global chunks rank and 2P - 1 - rank. */
static void to_local(const float *global, int64_t heads, float *local)
{
    const int64_t n = 2 * CHUNK * ranks, row = heads * D;
    for (int64_t b = 0; b < BATCH; ++b)
        for (int c = 0; c < 2; ++c) {
            const int64_t gc = c == 0 ? rank : 2 * ranks - 1 - rank;
            memcpy(local + (b * 2 * CHUNK + c * CHUNK) * row, global + (b * n + gc * CHUNK) * row,
                   (size_t)(CHUNK * row) * sizeof *local);
        }
}

static void lse_to_local(const float *global, float *local)
{
    const int64_t n = 2 * CHUNK * ranks;
    for (int64_t bh = 0; bh < BATCH * HQ; ++bh)
        for (int c = 0; c < 2; ++c) {
            const int64_t gc = c == 0 ? rank : 2 * ranks - 1 - rank;
            memcpy(local + bh * 2 * CHUNK + c * CHUNK, global + bh * n + gc * CHUNK, CHUNK * sizeof *local);
        }
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (isinf(a[i]) && a[i] == b[i]) continue;
        const double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

static fa_tensor tensor(float *data, int64_t seqlen, int64_t heads)
{
    return (fa_tensor){data, FA_DTYPE_F32, BATCH, seqlen, heads, D, 0, 0, 0};
}

static void run_case(fa_context *ctx, const char *name, const fa_attention_desc *desc)
{
    const int64_t n = 2 * CHUNK * ranks, l = 2 * CHUNK;
    const size_t gq = (size_t)(BATCH * n * HQ * D), gk = (size_t)(BATCH * n * HK * D);
    const size_t lq = (size_t)(BATCH * l * HQ * D), lk = (size_t)(BATCH * l * HK * D);
    float *q = random_floats(1, gq), *k = random_floats(2, gk), *v = random_floats(3, gk), *dout = random_floats(4, gq);
    float *out = malloc(gq * 4), *lse = malloc((size_t)(BATCH * HQ * n) * 4), *dq = malloc(gq * 4), *dk = malloc(gk * 4),
          *dv = malloc(gk * 4);
    fa_tensor tq = tensor(q, n, HQ), tk = tensor(k, n, HK), tv = tensor(v, n, HK), to = tensor(out, n, HQ);
    fa_tensor tdo = tensor(dout, n, HQ), tdq = tensor(dq, n, HQ), tdk = tensor(dk, n, HK), tdv = tensor(dv, n, HK);
    CHECK(fa_forward(ctx, desc, &tq, &tk, &tv, &to, lse) == FA_SUCCESS, "%s: reference forward: %s", name, fa_last_error());
    CHECK(fa_backward(ctx, desc, &tq, &tk, &tv, &to, &tdo, lse, &tdq, &tdk, &tdv) == FA_SUCCESS,
          "%s: reference backward: %s", name, fa_last_error());

    float *x_q = malloc(lq * 4), *x_k = malloc(lk * 4), *x_v = malloc(lk * 4), *x_do = malloc(lq * 4);
    float *ref_o = malloc(lq * 4), *ref_l = malloc((size_t)(BATCH * HQ * l) * 4), *ref_dq = malloc(lq * 4),
          *ref_dk = malloc(lk * 4), *ref_dv = malloc(lk * 4);
    to_local(q, HQ, x_q);
    to_local(k, HK, x_k);
    to_local(v, HK, x_v);
    to_local(dout, HQ, x_do);
    to_local(out, HQ, ref_o);
    lse_to_local(lse, ref_l);
    to_local(dq, HQ, ref_dq);
    to_local(dk, HK, ref_dk);
    to_local(dv, HK, ref_dv);

    float *o[2], *ls[2], *gdq[2], *gdk[2], *gdv[2];
    for (int run = 0; run < 2; ++run) {
        o[run] = malloc(lq * 4);
        ls[run] = malloc((size_t)(BATCH * HQ * l) * 4);
        gdq[run] = malloc(lq * 4);
        gdk[run] = malloc(lk * 4);
        gdv[run] = malloc(lk * 4);
        fa_tensor rq = tensor(x_q, l, HQ), rk = tensor(x_k, l, HK), rv = tensor(x_v, l, HK), ro = tensor(o[run], l, HQ);
        fa_tensor rdo = tensor(x_do, l, HQ), rdq = tensor(gdq[run], l, HQ), rdk = tensor(gdk[run], l, HK),
                  rdv = tensor(gdv[run], l, HK);
        fa_status st = fa_ring_forward(ctx, MPI_COMM_WORLD, desc, &rq, &rk, &rv, &ro, ls[run]);
        CHECK(st == FA_SUCCESS, "%s: fa_ring_forward: %s", name, fa_last_error());
        st = fa_ring_backward(ctx, MPI_COMM_WORLD, desc, &rq, &rk, &rv, &ro, &rdo, ls[run], &rdq, &rdk, &rdv);
        CHECK(st == FA_SUCCESS, "%s: fa_ring_backward: %s", name, fa_last_error());
    }
    const double e_o = max_diff(o[0], ref_o, lq), e_l = max_diff(ls[0], ref_l, (size_t)(BATCH * HQ * l));
    const double e_dq = max_diff(gdq[0], ref_dq, lq), e_dk = max_diff(gdk[0], ref_dk, lk),
                 e_dv = max_diff(gdv[0], ref_dv, lk);
    CHECK(e_o < 1e-5 && e_l < 1e-5, "%s: forward off the single-process run: out %.2e lse %.2e", name, e_o, e_l);
    CHECK(e_dq < 5e-5 && e_dk < 5e-5 && e_dv < 5e-5, "%s: backward off the single-process run: dq %.2e dk %.2e dv %.2e",
          name, e_dq, e_dk, e_dv);
    CHECK(!memcmp(o[0], o[1], lq * 4) && !memcmp(ls[0], ls[1], (size_t)(BATCH * HQ * l) * 4),
          "%s: forward not bit-identical across runs", name);
    CHECK(!memcmp(gdq[0], gdq[1], lq * 4) && !memcmp(gdk[0], gdk[1], lk * 4) && !memcmp(gdv[0], gdv[1], lk * 4),
          "%s: backward not bit-identical across runs", name);
    double worst[5] = {e_o, e_l, e_dq, e_dk, e_dv}, all[5];
    MPI_Reduce(worst, all, 5, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("P=%d %-32s max |ring - single| out %.1e lse %.1e dq %.1e dk %.1e dv %.1e; repeat: bit-identical\n",
               ranks, name, all[0], all[1], all[2], all[3], all[4]);
    float *owned[] = {q, k, v, dout, out, lse, dq, dk, dv, x_q, x_k, x_v, x_do, ref_o, ref_l, ref_dq, ref_dk, ref_dv,
                      o[0], o[1], ls[0], ls[1], gdq[0], gdq[1], gdk[0], gdk[1], gdv[0], gdv[1]};
    for (size_t x = 0; x < sizeof owned / sizeof *owned; ++x) free(owned[x]);
}

/* A bad argument on one rank, or ranks that disagree: every rank returns an error and writes no
 * output; then a good call still works (nothing left in flight). */
static void run_failures(fa_context *ctx)
{
    const int64_t l = 2 * CHUNK;
    const size_t lq = (size_t)(BATCH * l * HQ * D), lk = (size_t)(BATCH * l * HK * D);
    float *q = random_floats(5, lq), *k = random_floats(6, lk), *v = random_floats(7, lk), *o = malloc(lq * 4);
    float *lse = malloc((size_t)(BATCH * HQ * l) * 4), *dq = malloc(lq * 4), *dk = malloc(lk * 4), *dv = malloc(lk * 4);
    fa_tensor tq = tensor(q, l, HQ), tk = tensor(k, l, HK), tv = tensor(v, l, HK), to = tensor(o, l, HQ);
    fa_tensor tdq = tensor(dq, l, HQ), tdk = tensor(dk, l, HK), tdv = tensor(dv, l, HK);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;

    memset(o, 0x5a, lq * 4);
    fa_tensor bad = to;
    if (rank == ranks - 1) bad.data = NULL; /* only the last rank's out is bad */
    fa_status st = fa_ring_forward(ctx, MPI_COMM_WORLD, &desc, &tq, &tk, &tv, &bad, lse);
    CHECK(st == FA_ERROR_INVALID_VALUE, "bad out on rank %d: status %d", ranks - 1, (int)st);
    if (rank == ranks - 1) CHECK(strstr(fa_last_error(), "out: data is NULL") != NULL, "message: %s", fa_last_error());
    else CHECK(strstr(fa_last_error(), "rank") != NULL, "message does not name the rank: %s", fa_last_error());
    for (size_t x = 0; x < lq; ++x)
        if (((unsigned char *)o)[x] != 0x5a) {
            CHECK(0, "out written after a failed call");
            break;
        }

    fa_attention_desc other = desc;
    if (rank == 0) other.causal = 0; /* ranks disagree on the desc */
    st = fa_ring_forward(ctx, MPI_COMM_WORLD, &other, &tq, &tk, &tv, &to, lse);
    CHECK(st == FA_ERROR_INVALID_VALUE && strstr(fa_last_error(), "disagree"), "disagreeing desc: %d %s", (int)st,
          fa_last_error());

    /* A failure inside the ring (rank 0's first block call refuses a NaN ALiBi slope, after the
     * ranks agreed on the arguments): the others finish the exchange and every rank errs. */
    float slopes[HQ] = {0.5f, 0.25f, 0.125f, 0.0625f};
    if (rank == 0) slopes[2] = NAN;
    fa_attention_desc with_slopes = desc;
    with_slopes.alibi_slopes = slopes;
    memset(o, 0x5a, lq * 4);
    st = fa_ring_forward(ctx, MPI_COMM_WORLD, &with_slopes, &tq, &tk, &tv, &to, lse);
    CHECK(st == FA_ERROR_INVALID_VALUE, "NaN slope on rank 0: status %d", (int)st);
    if (rank == 0) CHECK(strstr(fa_last_error(), "alibi_slopes[2]") != NULL, "message: %s", fa_last_error());
    else CHECK(strstr(fa_last_error(), "rank 0") != NULL, "message does not name rank 0: %s", fa_last_error());
    for (size_t x = 0; x < lq; ++x)
        if (((unsigned char *)o)[x] != 0x5a) {
            CHECK(0, "out written after a failure inside the ring");
            break;
        }
    st = fa_ring_backward(ctx, MPI_COMM_WORLD, &with_slopes, &tq, &tk, &tv, &to, &tq, lse, &tdq, &tdk, &tdv);
    CHECK(st == FA_ERROR_INVALID_VALUE, "NaN slope on rank 0, backward: status %d", (int)st);

    st = fa_ring_forward(ctx, MPI_COMM_WORLD, &desc, &tq, &tk, &tv, &to, lse);
    CHECK(st == FA_SUCCESS, "good call after failures: %s", fa_last_error());
    fa_tensor bad_dk = tdk;
    if (rank == 0) bad_dk.heads = HK + 1;
    st = fa_ring_backward(ctx, MPI_COMM_WORLD, &desc, &tq, &tk, &tv, &to, &tq, lse, &tdq, &bad_dk, &tdv);
    CHECK(st == FA_ERROR_INVALID_VALUE, "bad dk on rank 0: status %d", (int)st);
    st = fa_ring_backward(ctx, MPI_COMM_WORLD, &desc, &tq, &tk, &tv, &to, &tq, lse, &tdq, &tdk, &tdv);
    CHECK(st == FA_SUCCESS, "good backward after a failure: %s", fa_last_error());
    if (rank == 0)
        printf("P=%d failures: a bad argument on one rank, disagreeing ranks, a failure inside the ring -> every "
               "rank errs\n", ranks);
    float *owned[] = {q, k, v, o, lse, dq, dk, dv};
    for (size_t x = 0; x < sizeof owned / sizeof *owned; ++x) free(owned[x]);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    fa_context *ctx;
    if (fa_context_create(FA_BACKEND_CPU, 0, &ctx) != FA_SUCCESS) {
        fprintf(stderr, "rank %d: %s\n", rank, fa_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fa_context_set_num_threads(ctx, 1); /* P processes share the machine's cores */

    const int32_t seqlens_k[BATCH] = {2 * CHUNK * ranks - 11, 2 * CHUNK * ranks}; /* sequence 0 padded */
    static float slopes[HQ] = {0.5f, 0.25f, 0.125f, 0.0625f};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    run_case(ctx, "causal GQA", &desc);
    desc.dropout_p = 0.2f;
    desc.dropout_seed = 42;
    desc.dropout_offset = 3;
    run_case(ctx, "causal GQA dropout", &desc);
    desc.seqlens_k = seqlens_k;
    run_case(ctx, "causal GQA dropout padding", &desc);
    fa_attention_desc_init(&desc);
    desc.window_left = 19;
    desc.window_right = 5;
    desc.alibi_slopes = slopes;
    desc.softcap = 20.0f;
    run_case(ctx, "window ALiBi softcap", &desc);
    run_failures(ctx);

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%s: %d failed checks over %d ranks\n", total ? "FAIL" : "PASS", total, ranks);
    fa_context_destroy(ctx);
    MPI_Finalize();
    return total ? 1 : 0;
}

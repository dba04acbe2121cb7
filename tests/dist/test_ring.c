/* Ring attention over MPI (run under mpirun -np P): every rank builds the same global problem,
 * runs fa_forward / fa_backward on the whole sequence as the reference, and checks that
 * fa_ring_forward / fa_ring_backward on its zigzag rows equal the reference's rows (the dtype's
 * tolerance) and are bit-identical across repeated calls, in f32, f16 and bf16 (and that f16/bf16
 * round only their final outputs: equal to the f32 ring's on the widened values, rounded); then that a bad argument on one rank,
 * or ranks that disagree, make every rank return an error (no hang) and write no output. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "flashattn_dist.h"
#include "ring_test_common.h"
#include "test_util.h"


static const char *dtype_name(fa_dtype dtype)
{
    return dtype == FA_DTYPE_F32 ? "f32" : dtype == FA_DTYPE_F16 ? "f16" : "bf16";
}

/* n f32 values rounded to dtype (round to nearest even), stored in dtype. */
static void *narrowed(const float *x, size_t n, fa_dtype dtype)
{
    void *a = malloc(n * test_dtype_size(dtype));
    if (!a) abort();
    for (size_t i = 0; i < n; ++i) {
        if (dtype == FA_DTYPE_F32) ((float *)a)[i] = x[i];
        else ((uint16_t *)a)[i] = dtype == FA_DTYPE_F16 ? fa_f32_to_f16(x[i]) : fa_f32_to_bf16(x[i]);
    }
    return a;
}

static void *random_array(uint64_t seed, size_t n, fa_dtype dtype)
{
    float *x = random_floats(seed, n);
    void *a = narrowed(x, n, dtype);
    free(x);
    return a;
}

/* One ring run (forward then backward from its own out and lse) on local arrays of dtype. */
typedef struct ring_result { void *o, *dq, *dk, *dv; float *lse; } ring_result;

static ring_result run_ring(fa_context *ctx, const char *name, const fa_attention_desc *desc, fa_dtype dtype,
                            const void *q, const void *k, const void *v, const void *dout)
{
    const int64_t l = 2 * CHUNK;
    const size_t lq = (size_t)(BATCH * l * HQ * D), lk = (size_t)(BATCH * l * HK * D), es = test_dtype_size(dtype);
    ring_result r = {malloc(lq * es), malloc(lq * es), malloc(lk * es), malloc(lk * es),
                     malloc((size_t)(BATCH * HQ * l) * sizeof(float))};
    if (!r.o || !r.dq || !r.dk || !r.dv || !r.lse) abort();
    fa_tensor rq = tensor((void *)q, dtype, l, HQ), rk = tensor((void *)k, dtype, l, HK), rv = tensor((void *)v, dtype, l, HK);
    fa_tensor ro = tensor(r.o, dtype, l, HQ), rdo = tensor((void *)dout, dtype, l, HQ);
    fa_tensor rdq = tensor(r.dq, dtype, l, HQ), rdk = tensor(r.dk, dtype, l, HK), rdv = tensor(r.dv, dtype, l, HK);
    fa_status st = fa_ring_forward(ctx, MPI_COMM_WORLD, desc, &rq, &rk, &rv, &ro, r.lse);
    CHECK(st == FA_SUCCESS, "%s %s: fa_ring_forward: %s", name, dtype_name(dtype), fa_last_error());
    st = fa_ring_backward(ctx, MPI_COMM_WORLD, desc, &rq, &rk, &rv, &ro, &rdo, r.lse, &rdq, &rdk, &rdv);
    CHECK(st == FA_SUCCESS, "%s %s: fa_ring_backward: %s", name, dtype_name(dtype), fa_last_error());
    return r;
}

static void free_result(ring_result *r)
{
    free(r->o);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->lse);
}

/* f16/bf16: the ring must round only its final outputs. Its results must equal, bit for bit, the
 * f32 ring's on the same values widened (forward: q, k, v; backward: also out and dout from
 * the f16/bf16 run) rounded to the dtype once; a partial output or accumulator rounded between
 * ring steps would show here. */
static void check_rounded_once(fa_context *ctx, const char *name, const fa_attention_desc *desc, fa_dtype dtype,
                               const void *q, const void *k, const void *v, const void *dout, const ring_result *got)
{
    const int64_t l = 2 * CHUNK;
    const size_t lq = (size_t)(BATCH * l * HQ * D), lk = (size_t)(BATCH * l * HK * D), ll = (size_t)(BATCH * HQ * l);
    float *wq = widened(q, lq, dtype), *wk = widened(k, lk, dtype), *wv = widened(v, lk, dtype);
    float *wo = widened(got->o, lq, dtype), *wdo = widened(dout, lq, dtype);
    float *o = malloc(lq * 4), *lse = malloc(ll * 4), *dq = malloc(lq * 4), *dk = malloc(lk * 4), *dv = malloc(lk * 4);
    fa_tensor tq = tensor(wq, FA_DTYPE_F32, l, HQ), tk = tensor(wk, FA_DTYPE_F32, l, HK), tv = tensor(wv, FA_DTYPE_F32, l, HK);
    fa_tensor to = tensor(o, FA_DTYPE_F32, l, HQ), two = tensor(wo, FA_DTYPE_F32, l, HQ), tdo = tensor(wdo, FA_DTYPE_F32, l, HQ);
    fa_tensor tdq = tensor(dq, FA_DTYPE_F32, l, HQ), tdk = tensor(dk, FA_DTYPE_F32, l, HK), tdv = tensor(dv, FA_DTYPE_F32, l, HK);
    CHECK(fa_ring_forward(ctx, MPI_COMM_WORLD, desc, &tq, &tk, &tv, &to, lse) == FA_SUCCESS, "%s: f32 ring: %s", name,
          fa_last_error());
    CHECK(fa_ring_backward(ctx, MPI_COMM_WORLD, desc, &tq, &tk, &tv, &two, &tdo, got->lse, &tdq, &tdk, &tdv) == FA_SUCCESS,
          "%s: f32 ring backward: %s", name, fa_last_error());
    void *ro = narrowed(o, lq, dtype), *rdq = narrowed(dq, lq, dtype), *rdk = narrowed(dk, lk, dtype),
         *rdv = narrowed(dv, lk, dtype);
    const size_t es = test_dtype_size(dtype);
    CHECK(!memcmp(ro, got->o, lq * es) && !memcmp(lse, got->lse, ll * 4),
          "%s %s: forward is not the f32 ring's rounded once", name, dtype_name(dtype));
    CHECK(!memcmp(rdq, got->dq, lq * es) && !memcmp(rdk, got->dk, lk * es) && !memcmp(rdv, got->dv, lk * es),
          "%s %s: backward is not the f32 ring's rounded once", name, dtype_name(dtype));
    void *owned[] = {wq, wk, wv, wo, wdo, o, lse, dq, dk, dv, ro, rdq, rdk, rdv};
    for (size_t x = 0; x < sizeof owned / sizeof *owned; ++x) free(owned[x]);
}

/* Tolerances against the single-process run (max |ring - single| / max(1, |single|)): f32
 * rounding of another summation order, plus for f16/bf16 one unit in the last place of the final
 * rounding (both runs round f32 values that differ by f32 rounding) and its effect through the
 * backward's out. */
static double tolerance(fa_dtype dtype, int gradient)
{
    if (dtype == FA_DTYPE_F16) return gradient ? 4e-3 : 1.5e-3;
    if (dtype == FA_DTYPE_BF16) return gradient ? 3e-2 : 1.2e-2;
    return gradient ? 5e-5 : 1e-5;
}

static void run_case(fa_context *ctx, const char *name, const fa_attention_desc *desc, fa_dtype dtype)
{
    const int64_t n = 2 * CHUNK * ranks, l = 2 * CHUNK;
    const size_t gq = (size_t)(BATCH * n * HQ * D), gk = (size_t)(BATCH * n * HK * D), es = test_dtype_size(dtype);
    const size_t lq = (size_t)(BATCH * l * HQ * D), lk = (size_t)(BATCH * l * HK * D), ll = (size_t)(BATCH * HQ * l);
    void *q = random_array(1, gq, dtype), *k = random_array(2, gk, dtype), *v = random_array(3, gk, dtype),
         *dout = random_array(4, gq, dtype);
    void *out = malloc(gq * es), *dq = malloc(gq * es), *dk = malloc(gk * es), *dv = malloc(gk * es);
    float *lse = malloc((size_t)(BATCH * HQ * n) * 4);
    fa_tensor tq = tensor(q, dtype, n, HQ), tk = tensor(k, dtype, n, HK), tv = tensor(v, dtype, n, HK),
              to = tensor(out, dtype, n, HQ);
    fa_tensor tdo = tensor(dout, dtype, n, HQ), tdq = tensor(dq, dtype, n, HQ), tdk = tensor(dk, dtype, n, HK),
              tdv = tensor(dv, dtype, n, HK);
    CHECK(fa_forward(ctx, desc, &tq, &tk, &tv, &to, lse) == FA_SUCCESS, "%s: reference forward: %s", name, fa_last_error());
    CHECK(fa_backward(ctx, desc, &tq, &tk, &tv, &to, &tdo, lse, &tdq, &tdk, &tdv) == FA_SUCCESS,
          "%s: reference backward: %s", name, fa_last_error());

    void *x_q = malloc(lq * es), *x_k = malloc(lk * es), *x_v = malloc(lk * es), *x_do = malloc(lq * es);
    void *ref_o = malloc(lq * es), *ref_dq = malloc(lq * es), *ref_dk = malloc(lk * es), *ref_dv = malloc(lk * es);
    float *ref_l = malloc(ll * 4);
    to_local(q, HQ, es, x_q);
    to_local(k, HK, es, x_k);
    to_local(v, HK, es, x_v);
    to_local(dout, HQ, es, x_do);
    to_local(out, HQ, es, ref_o);
    lse_to_local(lse, ref_l);
    to_local(dq, HQ, es, ref_dq);
    to_local(dk, HK, es, ref_dk);
    to_local(dv, HK, es, ref_dv);

    ring_result r[2];
    for (int run = 0; run < 2; ++run) r[run] = run_ring(ctx, name, desc, dtype, x_q, x_k, x_v, x_do);
    const double e_o = max_error(r[0].o, ref_o, lq, dtype), e_l = max_error(r[0].lse, ref_l, ll, FA_DTYPE_F32);
    const double e_dq = max_error(r[0].dq, ref_dq, lq, dtype), e_dk = max_error(r[0].dk, ref_dk, lk, dtype),
                 e_dv = max_error(r[0].dv, ref_dv, lk, dtype);
    const double t_o = tolerance(dtype, 0), t_g = tolerance(dtype, 1), t_l = tolerance(FA_DTYPE_F32, 0);
    CHECK(e_o < t_o && e_l < t_l, "%s %s: forward off the single-process run: out %.2e lse %.2e", name,
          dtype_name(dtype), e_o, e_l);
    CHECK(e_dq < t_g && e_dk < t_g && e_dv < t_g, "%s %s: backward off the single-process run: dq %.2e dk %.2e dv %.2e",
          name, dtype_name(dtype), e_dq, e_dk, e_dv);
    CHECK(!memcmp(r[0].o, r[1].o, lq * es) && !memcmp(r[0].lse, r[1].lse, ll * 4),
          "%s %s: forward not bit-identical across runs", name, dtype_name(dtype));
    CHECK(!memcmp(r[0].dq, r[1].dq, lq * es) && !memcmp(r[0].dk, r[1].dk, lk * es) && !memcmp(r[0].dv, r[1].dv, lk * es),
          "%s %s: backward not bit-identical across runs", name, dtype_name(dtype));
    if (dtype != FA_DTYPE_F32) check_rounded_once(ctx, name, desc, dtype, x_q, x_k, x_v, x_do, &r[0]);
    double worst[5] = {e_o, e_l, e_dq, e_dk, e_dv}, all[5];
    MPI_Reduce(worst, all, 5, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("P=%d %-4s %-28s max |ring - single| / max(1, |single|): out %.1e lse %.1e dq %.1e dk %.1e dv %.1e; "
               "repeat: bit-identical%s\n", ranks, dtype_name(dtype), name, all[0], all[1], all[2], all[3], all[4],
               dtype == FA_DTYPE_F32 ? "" : "; compared with the f32 ring rounded once");
    void *owned[] = {q, k, v, dout, out, lse, dq, dk, dv, x_q, x_k, x_v, x_do, ref_o, ref_l, ref_dq, ref_dk, ref_dv};
    for (size_t x = 0; x < sizeof owned / sizeof *owned; ++x) free(owned[x]);
    free_result(&r[0]);
    free_result(&r[1]);
}

/* A bad argument on one rank, or ranks that disagree: every rank returns an error and writes no
 * output; then a good call still works (nothing left in flight). */
static void run_failures(fa_context *ctx)
{
    const int64_t l = 2 * CHUNK;
    const size_t lq = (size_t)(BATCH * l * HQ * D), lk = (size_t)(BATCH * l * HK * D);
    float *q = random_floats(5, lq), *k = random_floats(6, lk), *v = random_floats(7, lk), *o = malloc(lq * 4);
    float *lse = malloc((size_t)(BATCH * HQ * l) * 4), *dq = malloc(lq * 4), *dk = malloc(lk * 4), *dv = malloc(lk * 4);
    fa_tensor tq = tensor(q, FA_DTYPE_F32, l, HQ), tk = tensor(k, FA_DTYPE_F32, l, HK), tv = tensor(v, FA_DTYPE_F32, l, HK),
              to = tensor(o, FA_DTYPE_F32, l, HQ);
    fa_tensor tdq = tensor(dq, FA_DTYPE_F32, l, HQ), tdk = tensor(dk, FA_DTYPE_F32, l, HK),
              tdv = tensor(dv, FA_DTYPE_F32, l, HK);
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

    /* Each of the ring's own tensor and desc checks, on the last rank only: every rank errs, the
     * bad rank names the field, and no rank writes out. */
    static const struct { const char *what, *message; } faults[] = {
        {"unknown dtype", "unknown dtype"}, {"misaligned data", "not aligned"},
        {"zero heads", "dimensions must be positive"}, {"mixed strides", "strides must be all 0"},
        {"unknown desc->struct_size", "desc->struct_size"},
    };
    for (size_t f = 0; f < sizeof faults / sizeof *faults; ++f) {
        fa_tensor q_fault = tq;
        fa_attention_desc desc_fault = desc;
        if (rank == ranks - 1) {
            if (f == 0) q_fault.dtype = (fa_dtype)77;
            if (f == 1) q_fault.data = (char *)q + 2;
            if (f == 2) q_fault.heads = 0;
            if (f == 3) q_fault.stride_seq = HQ * D, q_fault.stride_batch = 0, q_fault.stride_head = D;
            if (f == 4) desc_fault.struct_size = 3;
        }
        memset(o, 0x5a, lq * 4);
        st = fa_ring_forward(ctx, MPI_COMM_WORLD, &desc_fault, &q_fault, &tk, &tv, &to, lse);
        CHECK(st == FA_ERROR_INVALID_VALUE, "%s on rank %d: status %d", faults[f].what, ranks - 1, (int)st);
        if (rank == ranks - 1)
            CHECK(strstr(fa_last_error(), faults[f].message) != NULL, "%s: message %s", faults[f].what, fa_last_error());
        for (size_t x = 0; x < lq; ++x)
            if (((unsigned char *)o)[x] != 0x5a) {
                CHECK(0, "out written after %s", faults[f].what);
                break;
            }
    }

    fa_attention_desc other = desc;
    if (rank == 0) other.causal = 0; /* ranks disagree on the desc */
    st = fa_ring_forward(ctx, MPI_COMM_WORLD, &other, &tq, &tk, &tv, &to, lse);
    CHECK(st == FA_ERROR_INVALID_VALUE && strstr(fa_last_error(), "disagree"), "disagreeing desc: %d %s", (int)st,
          fa_last_error());

    /* A dtype mismatch on one rank; then ranks that all pass consistent tensors but of another
     * dtype than the others (rank 0 in f16: its buffers hold at least as many bytes). */
    fa_tensor k16 = tk;
    if (rank == 0) k16.dtype = FA_DTYPE_F16;
    st = fa_ring_forward(ctx, MPI_COMM_WORLD, &desc, &tq, &k16, &tv, &to, lse);
    CHECK(st == FA_ERROR_INVALID_VALUE, "k's dtype differs from q's on rank 0: status %d", (int)st);
    if (rank == 0) CHECK(strstr(fa_last_error(), "dtype differs") != NULL, "message: %s", fa_last_error());
    fa_tensor h[4] = {tq, tk, tv, to};
    for (int x = 0; x < 4 && rank == 0; ++x) h[x].dtype = FA_DTYPE_F16;
    st = fa_ring_forward(ctx, MPI_COMM_WORLD, &desc, &h[0], &h[1], &h[2], &h[3], lse);
    CHECK(st == FA_ERROR_INVALID_VALUE && strstr(fa_last_error(), "disagree"), "ranks disagree on the dtype: %d %s",
          (int)st, fa_last_error());

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
    run_case(ctx, "causal GQA", &desc, FA_DTYPE_F32);
    desc.dropout_p = 0.2f;
    desc.dropout_seed = 42;
    desc.dropout_offset = 3;
    run_case(ctx, "causal GQA dropout", &desc, FA_DTYPE_F32);
    desc.seqlens_k = seqlens_k;
    for (fa_dtype dtype = FA_DTYPE_F32; dtype <= FA_DTYPE_BF16; ++dtype)
        run_case(ctx, "causal GQA dropout padding", &desc, dtype);
    fa_attention_desc_init(&desc);
    desc.window_left = 19;
    desc.window_right = 5;
    desc.alibi_slopes = slopes;
    desc.softcap = 20.0f;
    for (fa_dtype dtype = FA_DTYPE_F32; dtype <= FA_DTYPE_BF16; ++dtype)
        run_case(ctx, "window ALiBi softcap", &desc, dtype);
    run_failures(ctx);

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%s: %d failed checks over %d ranks\n", total ? "FAIL" : "PASS", total, ranks);
    fa_context_destroy(ctx);
    MPI_Finalize();
    return total ? 1 : 0;
}

/* Ring attention over NCCL (flashattn_dist_nccl.h), run under mpirun -np P on the test double:
 * src/dist/ring_nccl.cu built for the SIMT emulator's CUDA runtime against an NCCL over MPI
 * (fake_nccl.c), the block computes on the emulated CUDA plugin (FLASHATTN_PLUGIN_DIR). Every rank
 * builds the same global problem, runs fa_forward / fa_backward on the whole sequence on the CPU
 * backend as the reference, and checks that fa_ring_forward_nccl / fa_ring_backward_nccl on its
 * zigzag rows (device memory) equal the reference's rows within f32 rounding, are bit-identical
 * across repeated calls, and use the exchanges the design says; then that a bad argument on one
 * rank makes every rank return an error and write no output, and that the waits are bounded (GPU
 * work that never completes, an NCCL error: abort and FA_ERROR_BACKEND_FAILURE). f32 only (the NCCL ring refuses
 * f16/bf16). What this cannot show: docs/DISTRIBUTED.md, "A test double: NCCL over MPI". */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <mpi.h>

#include "flashattn_dist_nccl.h"
#include "ring_test_common.h"

static fa_context *gpu;
/* FA_TEST_QUICK=1 (sanitizer runs, where the emulated kernels are ~20x slower): P = 2 runs one
 * case once (no repeat to compare) and the failures, P > 2 only the failures. */
static int quick;

static void *to_device(const void *host, size_t bytes)
{
    void *d = NULL;
    if (fa_malloc(gpu, bytes, &d) != FA_SUCCESS || fa_memcpy_h2d(gpu, d, host, bytes) != FA_SUCCESS) {
        fprintf(stderr, "rank %d: device copy: %s\n", rank, fa_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return d;
}

static float *from_device(const void *device, size_t floats)
{
    float *h = malloc(floats * sizeof *h);
    if (!h || fa_memcpy_d2h(gpu, h, device, floats * sizeof *h) != FA_SUCCESS) abort();
    return h;
}

typedef struct ring_result { float *o, *lse, *dq, *dk, *dv; } ring_result;

/* One ring run on the device (forward, then backward from its own out and lse); host copies back. */
static ring_result run_ring(ncclComm_t comm, const char *name, const fa_attention_desc *desc, const float *q,
                            const float *k, const float *v, const float *dout)
{
    const int64_t l = 2 * CHUNK;
    const size_t lq = (size_t)(BATCH * l * HQ * D), lk = (size_t)(BATCH * l * HK * D), ll = (size_t)(BATCH * HQ * l);
    void *dq_in = to_device(q, lq * 4), *dk_in = to_device(k, lk * 4), *dv_in = to_device(v, lk * 4);
    void *ddo = to_device(dout, lq * 4), *o = to_device(q, lq * 4), *lse = to_device(q, ll * 4);
    void *gq = to_device(q, lq * 4), *gk = to_device(k, lk * 4), *gv = to_device(v, lk * 4);
    fa_tensor rq = tensor(dq_in, FA_DTYPE_F32, l, HQ), rk = tensor(dk_in, FA_DTYPE_F32, l, HK),
              rv = tensor(dv_in, FA_DTYPE_F32, l, HK);
    fa_tensor ro = tensor(o, FA_DTYPE_F32, l, HQ), rdo = tensor(ddo, FA_DTYPE_F32, l, HQ);
    fa_tensor rdq = tensor(gq, FA_DTYPE_F32, l, HQ), rdk = tensor(gk, FA_DTYPE_F32, l, HK), rdv = tensor(gv, FA_DTYPE_F32, l, HK);
    const fake_nccl_counts before = fake_nccl_counts_now();
    fa_status st = fa_ring_forward_nccl(gpu, comm, NULL, desc, &rq, &rk, &rv, &ro, lse);
    CHECK(st == FA_SUCCESS, "%s: fa_ring_forward_nccl: %s", name, fa_last_error());
    const fake_nccl_counts middle = fake_nccl_counts_now();
    st = fa_ring_backward_nccl(gpu, comm, NULL, desc, &rq, &rk, &rv, &ro, &rdo, lse, &rdq, &rdk, &rdv);
    CHECK(st == FA_SUCCESS, "%s: fa_ring_backward_nccl: %s", name, fa_last_error());
    const fake_nccl_counts after = fake_nccl_counts_now();
    /* The design's traffic: P - 1 K/V exchanges forward, plus P dK/dV exchanges backward, each one
     * group of a send and a receive; three agreements (arguments, buffers, result) per call. */
    CHECK(middle.sends - before.sends == ranks - 1 && middle.recvs - before.recvs == ranks - 1 &&
              middle.groups - before.groups == ranks - 1 && middle.allreduces - before.allreduces == 3,
          "%s: forward exchanges: %ld sends %ld recvs %ld groups %ld allreduces", name, middle.sends - before.sends,
          middle.recvs - before.recvs, middle.groups - before.groups, middle.allreduces - before.allreduces);
    CHECK(after.sends - middle.sends == 2 * ranks - 1 && after.groups - middle.groups == 2 * ranks - 1 &&
              after.allreduces - middle.allreduces == 3,
          "%s: backward exchanges: %ld sends %ld groups %ld allreduces", name, after.sends - middle.sends,
          after.groups - middle.groups, after.allreduces - middle.allreduces);
    ring_result r = {from_device(o, lq), from_device(lse, ll), from_device(gq, lq), from_device(gk, lk), from_device(gv, lk)};
    void *owned[] = {dq_in, dk_in, dv_in, ddo, o, lse, gq, gk, gv};
    for (size_t x = 0; x < sizeof owned / sizeof *owned; ++x) fa_free(gpu, owned[x]);
    return r;
}

static void free_result(ring_result *r)
{
    float *owned[] = {r->o, r->lse, r->dq, r->dk, r->dv};
    for (size_t x = 0; x < sizeof owned / sizeof *owned; ++x) free(owned[x]);
}

/* host_desc: the reference's (host arrays); device_desc: the ring's (alibi_slopes on the device). */
static void run_case(fa_context *cpu, ncclComm_t comm, const char *name, const fa_attention_desc *host_desc,
                     const fa_attention_desc *device_desc)
{
    const int64_t n = 2 * CHUNK * ranks, l = 2 * CHUNK;
    const size_t gq = (size_t)(BATCH * n * HQ * D), gk = (size_t)(BATCH * n * HK * D);
    const size_t lq = (size_t)(BATCH * l * HQ * D), lk = (size_t)(BATCH * l * HK * D), ll = (size_t)(BATCH * HQ * l);
    float *q = random_floats(1, gq), *k = random_floats(2, gk), *v = random_floats(3, gk), *dout = random_floats(4, gq);
    float *out = malloc(gq * 4), *dq = malloc(gq * 4), *dk = malloc(gk * 4), *dv = malloc(gk * 4);
    float *lse = malloc((size_t)(BATCH * HQ * n) * 4);
    fa_tensor tq = tensor(q, FA_DTYPE_F32, n, HQ), tk = tensor(k, FA_DTYPE_F32, n, HK), tv = tensor(v, FA_DTYPE_F32, n, HK),
              to = tensor(out, FA_DTYPE_F32, n, HQ);
    fa_tensor tdo = tensor(dout, FA_DTYPE_F32, n, HQ), tdq = tensor(dq, FA_DTYPE_F32, n, HQ),
              tdk = tensor(dk, FA_DTYPE_F32, n, HK), tdv = tensor(dv, FA_DTYPE_F32, n, HK);
    CHECK(fa_forward(cpu, host_desc, &tq, &tk, &tv, &to, lse) == FA_SUCCESS, "%s: reference forward: %s", name,
          fa_last_error());
    CHECK(fa_backward(cpu, host_desc, &tq, &tk, &tv, &to, &tdo, lse, &tdq, &tdk, &tdv) == FA_SUCCESS,
          "%s: reference backward: %s", name, fa_last_error());
    float *x_q = malloc(lq * 4), *x_k = malloc(lk * 4), *x_v = malloc(lk * 4), *x_do = malloc(lq * 4);
    float *ref_o = malloc(lq * 4), *ref_dq = malloc(lq * 4), *ref_dk = malloc(lk * 4), *ref_dv = malloc(lk * 4);
    float *ref_l = malloc(ll * 4);
    to_local(q, HQ, 4, x_q);
    to_local(k, HK, 4, x_k);
    to_local(v, HK, 4, x_v);
    to_local(dout, HQ, 4, x_do);
    to_local(out, HQ, 4, ref_o);
    lse_to_local(lse, ref_l);
    to_local(dq, HQ, 4, ref_dq);
    to_local(dk, HK, 4, ref_dk);
    to_local(dv, HK, 4, ref_dv);

    ring_result r[2];
    const int runs = quick ? 1 : 2;
    for (int run = 0; run < runs; ++run) r[run] = run_ring(comm, name, device_desc, x_q, x_k, x_v, x_do);
    if (quick) r[1] = r[0];
    const double e[5] = {max_error(r[0].o, ref_o, lq, FA_DTYPE_F32), max_error(r[0].lse, ref_l, ll, FA_DTYPE_F32),
                         max_error(r[0].dq, ref_dq, lq, FA_DTYPE_F32), max_error(r[0].dk, ref_dk, lk, FA_DTYPE_F32),
                         max_error(r[0].dv, ref_dv, lk, FA_DTYPE_F32)};
    /* f32 rounding of another summation order (and the GPU kernels' own order), as test_ring.c. */
    CHECK(e[0] < 1e-5 && e[1] < 1e-5, "%s: forward off the single-process run: out %.2e lse %.2e", name, e[0], e[1]);
    CHECK(e[2] < 5e-5 && e[3] < 5e-5 && e[4] < 5e-5, "%s: backward off the single-process run: dq %.2e dk %.2e dv %.2e",
          name, e[2], e[3], e[4]);
    CHECK(!memcmp(r[0].o, r[1].o, lq * 4) && !memcmp(r[0].lse, r[1].lse, ll * 4), "%s: forward not bit-identical across runs",
          name);
    CHECK(!memcmp(r[0].dq, r[1].dq, lq * 4) && !memcmp(r[0].dk, r[1].dk, lk * 4) && !memcmp(r[0].dv, r[1].dv, lk * 4),
          "%s: backward not bit-identical across runs", name);
    double all[5];
    MPI_Reduce(e, all, 5, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("P=%d NCCL double, emulated CUDA: %-26s max |ring - single CPU| / max(1, |single|): out %.1e lse %.1e "
               "dq %.1e dk %.1e dv %.1e; repeat: %s\n", ranks, name, all[0], all[1], all[2], all[3], all[4],
               quick ? "not run (FA_TEST_QUICK)" : "bit-identical");
    void *owned[] = {q, k, v, dout, out, lse, dq, dk, dv, x_q, x_k, x_v, x_do, ref_o, ref_l, ref_dq, ref_dk, ref_dv};
    for (size_t x = 0; x < sizeof owned / sizeof *owned; ++x) free(owned[x]);
    free_result(&r[0]);
    if (!quick) free_result(&r[1]);
}

/* out (device) still holds the 0x5a bytes it was filled with. */
static int untouched(const void *device_out, size_t bytes)
{
    unsigned char *h = malloc(bytes);
    if (!h || fa_memcpy_d2h(gpu, h, device_out, bytes) != FA_SUCCESS) abort();
    size_t x = 0;
    while (x < bytes && h[x] == 0x5a) ++x;
    free(h);
    return x == bytes;
}

/* A bad argument on one rank, a wrong context on one rank, f16 on every rank: every rank returns
 * an error and writes no output; then a good call still works (nothing left in flight). */
static void run_failures(fa_context *cpu, ncclComm_t comm)
{
    const int64_t l = 2 * CHUNK;
    const size_t lq = (size_t)(BATCH * l * HQ * D), lk = (size_t)(BATCH * l * HK * D), ll = (size_t)(BATCH * HQ * l);
    float *hq = random_floats(5, lq), *hk = random_floats(6, lk), *hv = random_floats(7, lk);
    unsigned char *fill = malloc(lq * 4);
    if (!fill) abort();
    memset(fill, 0x5a, lq * 4);
    void *q = to_device(hq, lq * 4), *k = to_device(hk, lk * 4), *v = to_device(hv, lk * 4), *o = to_device(fill, lq * 4);
    void *lse = to_device(fill, ll * 4);
    fa_tensor tq = tensor(q, FA_DTYPE_F32, l, HQ), tk = tensor(k, FA_DTYPE_F32, l, HK), tv = tensor(v, FA_DTYPE_F32, l, HK),
              to = tensor(o, FA_DTYPE_F32, l, HQ);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;

    fa_tensor bad = to;
    if (rank == ranks - 1) bad.data = NULL; /* only the last rank's out is bad */
    fa_status st = fa_ring_forward_nccl(gpu, comm, NULL, &desc, &tq, &tk, &tv, &bad, lse);
    CHECK(st == FA_ERROR_INVALID_VALUE, "bad out on rank %d: status %d", ranks - 1, (int)st);
    if (rank == ranks - 1) CHECK(strstr(fa_last_error(), "out: data is NULL") != NULL, "message: %s", fa_last_error());
    else CHECK(strstr(fa_last_error(), "rank") != NULL, "message does not name the rank: %s", fa_last_error());
    CHECK(untouched(o, lq * 4), "out written after a failed call");

    st = fa_ring_forward_nccl(rank == 0 ? cpu : gpu, comm, NULL, &desc, &tq, &tk, &tv, &to, lse);
    CHECK(st != FA_SUCCESS, "a CPU context on rank 0: status %d", (int)st);
    if (rank == 0) CHECK(strstr(fa_last_error(), "needs a cuda context") != NULL, "message: %s", fa_last_error());
    CHECK(untouched(o, lq * 4), "out written after a failed call (CPU context on rank 0)");

    fa_tensor h[4] = {tq, tk, tv, to};
    for (int x = 0; x < 4; ++x) h[x].dtype = FA_DTYPE_F16;
    st = fa_ring_forward_nccl(gpu, comm, NULL, &desc, &h[0], &h[1], &h[2], &h[3], lse);
    CHECK(st == FA_ERROR_NOT_SUPPORTED && strstr(fa_last_error(), "f32"), "f16 on the NCCL ring: %d %s", (int)st,
          fa_last_error());

    st = fa_ring_backward_nccl(gpu, comm, NULL, &desc, &tq, &tk, &tv, &to, &tq, rank == 0 ? NULL : lse, &tq, &tk, &tv);
    CHECK(st == FA_ERROR_INVALID_VALUE, "lse NULL on rank 0, backward: status %d", (int)st);

    st = fa_ring_forward_nccl(gpu, comm, NULL, &desc, &tq, &tk, &tv, &to, lse);
    CHECK(st == FA_SUCCESS && !untouched(o, lq * 4), "good call after failures: %s", fa_last_error());
    if (rank == 0)
        printf("P=%d NCCL double failures: a bad argument on one rank, a CPU context on one rank, f16 -> every rank "
               "errs, nothing written\n", ranks);
    void *owned[] = {q, k, v, o, lse};
    for (size_t x = 0; x < sizeof owned / sizeof *owned; ++x) fa_free(gpu, owned[x]);
    free(hq);
    free(hk);
    free(hv);
    free(fill);
}

static ncclComm_t new_comm(void)
{
    ncclUniqueId id;
    if (rank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, ranks, id, rank) != ncclSuccess) MPI_Abort(MPI_COMM_WORLD, 1);
    return comm;
}

/* The bounded waits: (1) every rank's GPU work never completes (the emulator's events stay
 * pending): every rank gives up after FLASHATTN_RING_TIMEOUT_S, aborts its communicator and
 * returns FA_ERROR_BACKEND_FAILURE; (2) NCCL reports an error on rank 0 at a call's last
 * agreement: rank 0 aborts and returns FA_ERROR_BACKEND_FAILURE. Each abort frees the
 * communicator: *comm is a new one afterwards. */
static void run_bounded_waits(ncclComm_t *comm)
{
    const int64_t l = 2 * CHUNK;
    const size_t lq = (size_t)(BATCH * l * HQ * D), lk = (size_t)(BATCH * l * HK * D), ll = (size_t)(BATCH * HQ * l);
    float *hq = random_floats(8, lq), *hk = random_floats(9, lk);
    void *q = to_device(hq, lq * 4), *k = to_device(hk, lk * 4), *o = to_device(hq, lq * 4), *lse = to_device(hq, ll * 4);
    fa_tensor tq = tensor(q, FA_DTYPE_F32, l, HQ), tk = tensor(k, FA_DTYPE_F32, l, HK), to = tensor(o, FA_DTYPE_F32, l, HQ);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;

    long aborts = fake_nccl_counts_now().aborts;
    setenv("FLASHATTN_RING_TIMEOUT_S", "0.2", 1);
    setenv("FLASHATTN_EMU_EVENTS_PENDING", "1", 1);
    fa_status st = fa_ring_forward_nccl(gpu, *comm, NULL, &desc, &tq, &tk, &tk, &to, lse);
    unsetenv("FLASHATTN_EMU_EVENTS_PENDING");
    unsetenv("FLASHATTN_RING_TIMEOUT_S");
    CHECK(st == FA_ERROR_BACKEND_FAILURE && strstr(fa_last_error(), "no progress within 0.2 s"),
          "GPU work that never completes: status %d, %s", (int)st, fa_last_error());
    CHECK(fake_nccl_counts_now().aborts == aborts + 1, "GPU work that never completes: the comm was not aborted");
    *comm = new_comm();

    aborts = fake_nccl_counts_now().aborts;
    if (rank == 0) fake_nccl_fail_after(*comm, 3); /* the call's third agreement: after the ring */
    st = fa_ring_forward_nccl(gpu, *comm, NULL, &desc, &tq, &tk, &tk, &to, lse);
    if (rank == 0) {
        CHECK(st == FA_ERROR_BACKEND_FAILURE && strstr(fa_last_error(), "NCCL error: remote process exited"),
              "NCCL async error on rank 0: status %d, %s", (int)st, fa_last_error());
        CHECK(fake_nccl_counts_now().aborts == aborts + 1, "NCCL async error: rank 0 did not abort its comm");
    } else {
        CHECK(st == FA_SUCCESS, "rank %d after rank 0's NCCL error at the last agreement: %s", rank, fa_last_error());
        ncclCommDestroy(*comm);
    }
    *comm = new_comm();
    if (rank == 0)
        printf("P=%d NCCL double bounded waits: GPU work that never completes -> every rank times out and aborts; "
               "an NCCL async error -> that rank aborts\n", ranks);
    void *owned[] = {q, k, o, lse};
    for (size_t x = 0; x < sizeof owned / sizeof *owned; ++x) fa_free(gpu, owned[x]);
    free(hq);
    free(hk);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    quick = getenv("FA_TEST_QUICK") && !strcmp(getenv("FA_TEST_QUICK"), "1");
    fa_context *cpu;
    if (fa_context_create(FA_BACKEND_CPU, 0, &cpu) != FA_SUCCESS || fa_context_create(FA_BACKEND_CUDA, 0, &gpu) != FA_SUCCESS) {
        fprintf(stderr, "rank %d: %s (FLASHATTN_PLUGIN_DIR must name the emulated CUDA plugin)\n", rank, fa_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fa_context_set_num_threads(cpu, 1); /* P processes share the machine's cores */
    if (rank == 0) printf("block calls on: %s\n", fa_context_info(gpu));
    ncclComm_t comm = new_comm();

    const int32_t seqlens_k[BATCH] = {2 * CHUNK * ranks - 11, 2 * CHUNK * ranks}; /* sequence 0 padded */
    static const float slopes[HQ] = {0.5f, 0.25f, 0.125f, 0.0625f};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    if (!quick) run_case(cpu, comm, "causal GQA", &desc, &desc);
    desc.dropout_p = 0.2f;
    desc.dropout_seed = 42;
    desc.dropout_offset = 3;
    desc.seqlens_k = seqlens_k;
    if (!quick || ranks == 2) run_case(cpu, comm, "causal GQA dropout padding", &desc, &desc);
    fa_attention_desc_init(&desc);
    desc.window_left = 19;
    desc.window_right = 5;
    desc.softcap = 20.0f;
    desc.alibi_slopes = slopes;
    fa_attention_desc on_device = desc;
    on_device.alibi_slopes = to_device(slopes, sizeof slopes);
    if (!quick) run_case(cpu, comm, "window ALiBi softcap", &desc, &on_device);
    fa_free(gpu, (void *)on_device.alibi_slopes);
    run_failures(cpu, comm);
    run_bounded_waits(&comm);

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%s: %d failed checks over %d ranks\n", total ? "FAIL" : "PASS", total, ranks);
    ncclCommDestroy(comm);
    fa_context_destroy(gpu);
    fa_context_destroy(cpu);
    MPI_Finalize();
    return total ? 1 : 0;
}

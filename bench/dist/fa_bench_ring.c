/* fa-bench-ring (run under mpirun -np P): ring attention on P processes of T threads each against
 * one process of P x T threads on the same causal problem (the target: P = 2 x 1 thread
 * within 1.15x of 1 x 2 threads at N = 16384). Both variants run in interleaved rounds; each keeps
 * its best round, so drift and other load on the machine hit both alike. During the single-process
 * variant the other ranks sleep (polling a receive every millisecond), leaving their cores free.
 * Usage: mpirun --bind-to none -np 2 fa-bench-ring [--n 16384] [--heads 2] [--dim 64] [--threads 1]
 *                                                 [--rounds 3] [--forward-only]
 * --bind-to none: Open MPI binds each rank to one core by default, which leaves the single-process
 * variant P x T threads on one core (it then reads about P times slower); rank 0 checks its CPU
 * affinity and says so loudly. */
#define _GNU_SOURCE /* sched_getaffinity */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn_dist.h"

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        fa_status st_ = (expr);                                                                    \
        if (st_ != FA_SUCCESS) {                                                                   \
            fprintf(stderr, "%s: %s: %s\n", #expr, fa_status_string(st_), fa_last_error());        \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *values(size_t n, unsigned seed)
{
    float *x = malloc(n * sizeof *x);
    if (!x) MPI_Abort(MPI_COMM_WORLD, 1);
    uint64_t s = 0x9E3779B97F4A7C15ull ^ seed;
    for (size_t i = 0; i < n; ++i) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = (float)((double)(s >> 40) / (double)(1u << 24) - 0.5);
    }
    return x;
}

/* Rank 0 signals the end of its single-process run; the others wait without spinning a core. */
static void idle_until_released(int rank)
{
    int token = 0;
    if (rank == 0) return;
    MPI_Request r;
    MPI_Irecv(&token, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, &r);
    for (int done = 0; !done;) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (!done) nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
}

static void release_others(int rank, int ranks)
{
    if (rank != 0) return;
    int token = 1;
    for (int r = 1; r < ranks; ++r) MPI_Send(&token, 1, MPI_INT, r, 7, MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    int64_t n = 16384, heads = 2, d = 64;
    int threads = 1, rounds = 3, backward = 1;
    for (int a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--n") && a + 1 < argc) n = atoll(argv[++a]);
        else if (!strcmp(argv[a], "--heads") && a + 1 < argc) heads = atoll(argv[++a]);
        else if (!strcmp(argv[a], "--dim") && a + 1 < argc) d = atoll(argv[++a]);
        else if (!strcmp(argv[a], "--threads") && a + 1 < argc) threads = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--rounds") && a + 1 < argc) rounds = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--forward-only")) backward = 0;
        else {
            if (rank == 0) fprintf(stderr, "usage: see the comment at the top of fa_bench_ring.c\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (n % (2 * ranks)) {
        if (rank == 0) fprintf(stderr, "--n %lld must be a multiple of 2P = %d\n", (long long)n, 2 * ranks);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int pinned = 0; /* rank 0 may run on fewer CPUs than the single-process variant's threads */
#ifdef __linux__
    cpu_set_t allowed;
    if (rank == 0 && sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) < threads * ranks) {
        pinned = 1;
        fprintf(stderr,
                "fa-bench-ring: WARNING: rank 0 may run on %d CPU(s) but the single-process variant uses %d threads "
                "(mpirun binds each rank to a core by default): its time and the ratio are not comparable; "
                "run mpirun --bind-to none\n",
                CPU_COUNT(&allowed), threads * ranks);
    }
#endif
    const int64_t l = n / ranks; /* local rows: two chunks of n / 2P */
    fa_context *ring_ctx, *single_ctx;
    CHECK(fa_context_create(FA_BACKEND_CPU, 0, &ring_ctx));
    CHECK(fa_context_set_num_threads(ring_ctx, threads));
    CHECK(fa_context_create(FA_BACKEND_CPU, 0, &single_ctx));
    CHECK(fa_context_set_num_threads(single_ctx, threads * ranks));
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;

    const size_t local = (size_t)(l * heads * d), whole = (size_t)(n * heads * d);
    float *q = values(local, 1 + rank), *k = values(local, 11 + rank), *v = values(local, 21 + rank),
          *dout = values(local, 31 + rank), *out = values(local, 41), *dq = values(local, 0), *dk = values(local, 0),
          *dv = values(local, 0), *lse = values((size_t)(heads * l), 0);
    fa_tensor tq = {q, FA_DTYPE_F32, 1, l, heads, d, 0, 0, 0}, tk = tq, tv = tq, to = tq, tdo = tq, tdq = tq, tdk = tq,
              tdv = tq;
    tk.data = k, tv.data = v, to.data = out, tdo.data = dout, tdq.data = dq, tdk.data = dk, tdv.data = dv;
    float *gq = NULL, *gk = NULL, *gv = NULL, *gdo = NULL, *go = NULL, *gdq = NULL, *gdk = NULL, *gdv = NULL, *glse = NULL;
    if (rank == 0) {
        gq = values(whole, 51), gk = values(whole, 52), gv = values(whole, 53), gdo = values(whole, 54);
        go = values(whole, 0), gdq = values(whole, 0), gdk = values(whole, 0), gdv = values(whole, 0);
        glse = values((size_t)(heads * n), 0);
    }
    double best_ring = 1e30, best_single = 1e30;
    for (int round = 0; round < rounds; ++round) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        CHECK(fa_ring_forward(ring_ctx, MPI_COMM_WORLD, &desc, &tq, &tk, &tv, &to, lse));
        if (backward) CHECK(fa_ring_backward(ring_ctx, MPI_COMM_WORLD, &desc, &tq, &tk, &tv, &to, &tdo, lse, &tdq, &tdk, &tdv));
        double t = now() - t0, slowest;
        MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (slowest < best_ring) best_ring = slowest;

        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) {
            fa_tensor sq = {gq, FA_DTYPE_F32, 1, n, heads, d, 0, 0, 0}, sk = sq, sv = sq, so = sq, sdo = sq, sdq = sq,
                      sdk = sq, sdv = sq;
            sk.data = gk, sv.data = gv, so.data = go, sdo.data = gdo, sdq.data = gdq, sdk.data = gdk, sdv.data = gdv;
            t0 = now();
            CHECK(fa_forward(single_ctx, &desc, &sq, &sk, &sv, &so, glse));
            if (backward) CHECK(fa_backward(single_ctx, &desc, &sq, &sk, &sv, &so, &sdo, glse, &sdq, &sdk, &sdv));
            t = now() - t0;
            if (t < best_single) best_single = t;
        }
        release_others(rank, ranks);
        idle_until_released(rank);
    }
    if (rank == 0) {
        printf("causal %s, N %lld, heads %lld, d %lld, f32, best of %d interleaved rounds\n",
               backward ? "forward+backward" : "forward", (long long)n, (long long)heads, (long long)d, rounds);
        printf("  ring    P=%d x %d thread(s): %8.3f s\n", ranks, threads, best_ring);
        printf("  single  1 x %d threads:     %8.3f s\n", ranks * threads, best_single);
        printf("  ratio ring / single: %.3f (target <= 1.15 at P=2, N=16384)%s\n", best_ring / best_single,
               pinned ? "  NOT COMPARABLE: rank 0 was bound to fewer CPUs than threads (mpirun --bind-to none)" : "");
    }
    float *owned[] = {q, k, v, dout, out, dq, dk, dv, lse, gq, gk, gv, gdo, go, gdq, gdk, gdv, glse};
    for (size_t x = 0; x < sizeof owned / sizeof *owned; ++x) free(owned[x]);
    fa_context_destroy(ring_ctx);
    fa_context_destroy(single_ctx);
    MPI_Finalize();
    return 0;
}

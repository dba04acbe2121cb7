/* Ring attention over MPI: a causal self-attention of N tokens sharded over the ranks in the
 * zigzag layout, forward and backward, with the output gathered on rank 0 and checked against
 * one fa_forward over the whole sequence. Run: mpirun -np 2 ./ring_attention
 * Build: cc ring_attention.c $(pkg-config --cflags --libs flashattn_dist) -lm */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flashattn_dist.h>

enum { HEADS = 4, DIM = 32, CHUNK = 64 }; /* each rank: 2 chunks of 64 tokens */

#define TRY(call)                                                                             \
    do {                                                                                      \
        if ((call) != FA_SUCCESS) {                                                           \
            fprintf(stderr, "rank %d: %s: %s\n", rank, #call, fa_last_error());               \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                     \
        }                                                                                     \
    } while (0)

/* The same pseudo-random sequence on every rank: element x of a [N, HEADS, DIM] array. */
static float value(int which, size_t x) { return (float)sin(0.37 * (double)x + 1.3 * which) * 0.5f; }

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    const int64_t n = 2 * CHUNK * ranks, local = 2 * CHUNK, row = HEADS * DIM;
    fa_context *ctx;
    TRY(fa_context_create(FA_BACKEND_CPU, 0, &ctx));

    /* Zigzag: this rank holds global chunks `rank` and `2P - 1 - rank`, in that order. */
    const int64_t chunks[2] = {rank, 2 * ranks - 1 - rank};
    float *qkv[3], *out = malloc(sizeof(float) * local * row), *lse = malloc(sizeof(float) * HEADS * local);
    for (int w = 0; w < 3; ++w) {
        qkv[w] = malloc(sizeof(float) * local * row);
        for (int c = 0; c < 2; ++c)
            for (int64_t x = 0; x < CHUNK * row; ++x) qkv[w][c * CHUNK * row + x] = value(w, chunks[c] * CHUNK * row + x);
    }
    fa_tensor q = {qkv[0], FA_DTYPE_F32, 1, local, HEADS, DIM, 0, 0, 0}, k = q, v = q, o = q;
    k.data = qkv[1], v.data = qkv[2], o.data = out;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    TRY(fa_ring_forward(ctx, MPI_COMM_WORLD, &desc, &q, &k, &v, &o, lse));

    /* Backward with dO = O (any upstream gradient would do): dq, dk, dv of the local rows. */
    float *grads[3];
    for (int w = 0; w < 3; ++w) grads[w] = malloc(sizeof(float) * local * row);
    fa_tensor dq = q, dk = q, dv = q;
    dq.data = grads[0], dk.data = grads[1], dv.data = grads[2];
    TRY(fa_ring_backward(ctx, MPI_COMM_WORLD, &desc, &q, &k, &v, &o, &o, lse, &dq, &dk, &dv));

    /* Gather every rank's output on rank 0 and compare with the single-process run. */
    float *gathered = rank == 0 ? malloc(sizeof(float) * n * row) : NULL;
    MPI_Gather(out, (int)(local * row), MPI_FLOAT, gathered, (int)(local * row), MPI_FLOAT, 0, MPI_COMM_WORLD);
    int failed = 0;
    if (rank == 0) {
        float *all[3], *ref = malloc(sizeof(float) * n * row);
        for (int w = 0; w < 3; ++w) {
            all[w] = malloc(sizeof(float) * n * row);
            for (int64_t x = 0; x < n * row; ++x) all[w][x] = value(w, (size_t)x);
        }
        fa_tensor fq = {all[0], FA_DTYPE_F32, 1, n, HEADS, DIM, 0, 0, 0}, fk = fq, fv = fq, fo = fq;
        fk.data = all[1], fv.data = all[2], fo.data = ref;
        TRY(fa_forward(ctx, &desc, &fq, &fk, &fv, &fo, NULL));
        double worst = 0.0;
        for (int r = 0; r < ranks; ++r)
            for (int c = 0; c < 2; ++c) {
                const int64_t chunk = c == 0 ? r : 2 * ranks - 1 - r;
                const float *got = gathered + (r * local + c * CHUNK) * row, *want = ref + chunk * CHUNK * row;
                for (int64_t x = 0; x < CHUNK * row; ++x) worst = fmax(worst, fabs((double)got[x] - want[x]));
            }
        printf("ring attention on %d ranks, N = %lld: max |ring - single process| = %.2e\n", ranks, (long long)n, worst);
        failed = !(worst < 1e-5);
        for (int w = 0; w < 3; ++w) free(all[w]);
        free(ref);
    }
    MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
    for (int w = 0; w < 3; ++w) {
        free(qkv[w]);
        free(grads[w]);
    }
    free(out);
    free(lse);
    free(gathered);
    fa_context_destroy(ctx);
    MPI_Finalize();
    return failed;
}

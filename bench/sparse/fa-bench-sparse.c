/* Block-sparse FlashAttention on a backend (Algorithm 5): runtime against mask density.
 * Runs the forward (and forward+backward) at one N with dense attention and with random block
 * masks of decreasing density, and prints each time as a fraction of the dense time; the
 * dropout/sparsity issue's target is forward <= 0.35x dense at density 0.25, N = 4096.
 * Uses the public API only. */
#define _POSIX_C_SOURCE 200809L
#include <flashattn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct options {
    int64_t n, d, heads, block;
    int threads, reps, backward;
    const char *csv;
} options;

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1p-53;
}

/* Random mask with exactly round(density * rows * cols) nonzero blocks, the diagonal first so no
 * query row is left without a key (every row then has the same amount of work on average). */
static double fill_mask(uint8_t *mask, int64_t rows, int64_t cols, double density)
{
    const int64_t total = rows * cols, want = (int64_t)llround(density * (double)total);
    memset(mask, 0, (size_t)total);
    int64_t set = 0;
    for (int64_t r = 0; r < rows && set < want; ++r, ++set) mask[r * cols + r % cols] = 1;
    while (set < want) {
        const int64_t x = (int64_t)(uniform() * (double)total);
        if (!mask[x]) { mask[x] = 1; ++set; }
    }
    return (double)set / (double)total;
}

static int check(fa_status st, const char *what)
{
    if (st == FA_SUCCESS) return 0;
    fprintf(stderr, "fa-bench-sparse: %s: %s: %s\n", what, fa_status_string(st), fa_last_error());
    return 1;
}

/* Median of reps timings of one configuration. */
static double time_config(fa_context *ctx, const fa_attention_desc *desc, fa_tensor *t, float *lse, int backward,
                          int reps, int *failed)
{
    double times[64];
    for (int r = 0; r < reps; ++r) {
        const double start = now_seconds();
        *failed |= check(fa_forward(ctx, desc, &t[0], &t[1], &t[2], &t[3], lse), "fa_forward");
        if (backward)
            *failed |= check(fa_backward(ctx, desc, &t[0], &t[1], &t[2], &t[3], &t[4], lse, &t[5], &t[6], &t[7]),
                             "fa_backward");
        times[r] = now_seconds() - start;
    }
    for (int i = 1; i < reps; ++i) /* insertion sort: reps is small */
        for (int j = i; j > 0 && times[j] < times[j - 1]; --j) {
            const double x = times[j]; times[j] = times[j - 1]; times[j - 1] = x;
        }
    return times[reps / 2];
}

static void usage(void)
{
    fprintf(stderr, "usage: fa-bench-sparse [--n 4096] [--d 64] [--heads 8] [--block 128] [--threads 2] [--reps 3]\n"
                    "                       [--backward] [--csv FILE]\n");
}

int main(int argc, char **argv)
{
    options o = {4096, 64, 8, 128, 2, 3, 0, NULL};
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--backward")) { o.backward = 1; continue; }
        if (!v) { usage(); return 2; }
        if (!strcmp(a, "--n")) o.n = atoll(v);
        else if (!strcmp(a, "--d")) o.d = atoll(v);
        else if (!strcmp(a, "--heads")) o.heads = atoll(v);
        else if (!strcmp(a, "--block")) o.block = atoll(v);
        else if (!strcmp(a, "--threads")) o.threads = atoi(v);
        else if (!strcmp(a, "--reps")) o.reps = atoi(v);
        else if (!strcmp(a, "--csv")) o.csv = v;
        else { usage(); return 2; }
        ++i;
    }
    if (o.n <= 0 || o.d <= 0 || o.heads <= 0 || o.block <= 0 || o.reps <= 0 || o.reps > 64 || o.threads < 0) {
        usage();
        return 2;
    }
    fa_context *ctx;
    if (check(fa_context_create(FA_BACKEND_AUTO, 0, &ctx), "fa_context_create")) return 1;
    if (check(fa_context_set_num_threads(ctx, o.threads), "threads")) return 1;
    printf("%s\n", fa_context_info(ctx));
    printf("N = %lld, d = %lld, heads = %lld, mask block %lld x %lld, %s, median of %d\n", (long long)o.n,
           (long long)o.d, (long long)o.heads, (long long)o.block, (long long)o.block,
           o.backward ? "forward+backward" : "forward", o.reps);

    /* Host buffers, copied to the backend's memory (a no-op copy on the CPU). */
    const size_t count = (size_t)(o.n * o.heads * o.d), bytes = count * sizeof(float);
    fa_tensor t[8];
    void *device[8];
    float *host = malloc(bytes), *lse = NULL;
    if (!host) return 1;
    for (size_t x = 0; x < count; ++x) host[x] = (float)(uniform() * 2.0 - 1.0);
    for (int i = 0; i < 8; ++i) {
        if (check(fa_malloc(ctx, bytes, &device[i]), "fa_malloc") ||
            check(fa_memcpy_h2d(ctx, device[i], host, bytes), "fa_memcpy_h2d"))
            return 1;
        t[i] = (fa_tensor){device[i], FA_DTYPE_F32, 1, o.n, o.heads, o.d, 0, 0, 0};
    }
    if (check(fa_malloc(ctx, (size_t)(o.heads * o.n) * sizeof(float), (void **)&lse), "fa_malloc")) return 1;

    const int64_t rows = (o.n + o.block - 1) / o.block;
    uint8_t *mask = malloc((size_t)(rows * rows));
    fa_block_mask bm = {(int32_t)o.block, (int32_t)o.block, rows, rows, mask};
    FILE *csv = o.csv ? fopen(o.csv, "w") : NULL;
    if (o.csv && !csv) { perror(o.csv); return 1; }
    if (csv) fprintf(csv, "n,d,heads,block,pass,density,ms,fraction_of_dense\n");

    static const double densities[] = {1.0, 1.0, 0.5, 0.25, 0.125, 0.0625};
    double dense_ms = 0.0;
    int failed = 0;
    printf("%-10s %9s %10s %12s\n", "mask", "density", "ms", "x dense");
    for (size_t k = 0; k < sizeof densities / sizeof densities[0]; ++k) {
        fa_attention_desc desc;
        fa_attention_desc_init(&desc);
        double density = 1.0;
        const char *label = "dense";
        if (k > 0) { /* k == 1: an all-ones mask, the cost of consulting the mask */
            density = fill_mask(mask, rows, rows, densities[k]);
            desc.block_mask = &bm;
            label = "block";
        }
        fprintf(stderr, "\r%s density %.4f ...", label, density);
        const double ms = 1e3 * time_config(ctx, &desc, t, lse, o.backward, o.reps, &failed);
        if (k == 0) dense_ms = ms;
        fprintf(stderr, "\r%40s\r", "");
        printf("%-10s %9.4f %10.2f %12.3f\n", label, density, ms, ms / dense_ms);
        if (csv)
            fprintf(csv, "%lld,%lld,%lld,%lld,%s,%.6f,%.3f,%.4f\n", (long long)o.n, (long long)o.d, (long long)o.heads,
                    (long long)o.block, o.backward ? "fwdbwd" : "fwd", k ? density : 1.0, ms, ms / dense_ms);
    }
    if (csv) fclose(csv);
    for (int i = 0; i < 8; ++i) fa_free(ctx, device[i]);
    fa_free(ctx, lse);
    free(mask);
    free(host);
    fa_context_destroy(ctx);
    return failed;
}

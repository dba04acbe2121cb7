/* fa-bench-io: the paper's Figure 2 (left, middle, right) and Figure 3 as CSV files, from the IO
 * model (fa_io_estimate) and runtimes measured on this machine's CPU:
 *   flash / block-sparse: fa_forward + fa_backward on the CPU backend (public API);
 *   standard:             Algorithm 0 / 3 with OpenBLAS products and S, P, dP, dS in memory;
 *   Figure 2 middle:      a forward in the paper's loop order (K/V tiles outer, O_i, l_i, m_i
 *                         read and written per tile) with OpenBLAS tile products, per Bc.
 * Usage: fa-bench-io [--out DIR] [--quick] [all|fig2-left|fig2-middle|fig2-right|fig3]
 *        fa-bench-io sim-forward N D M   (one instrumented forward, for bench/io/cachegrind.sh) */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashattn_io.h"

#define CHECK(call)                                                                                               \
    do {                                                                                                          \
        fa_status st_ = (call);                                                                                   \
        if (st_ != FA_SUCCESS) {                                                                                  \
            fprintf(stderr, "fa-bench-io: %s failed: %s (%s)\n", #call, fa_status_string(st_), fa_last_error());    \
            exit(1);                                                                                              \
        }                                                                                                         \
    } while (0)

static int reps = 3;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static float *random_floats(int64_t n, uint32_t seed)
{
    float *a = malloc((size_t)n * sizeof(float));
    if (!a) {
        fprintf(stderr, "fa-bench-io: out of memory\n");
        exit(1);
    }
    for (int64_t x = 0; x < n; ++x) {
        seed = seed * 1664525u + 1013904223u;
        a[x] = (float)(seed >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
    return a;
}

static fa_io_counts estimate(fa_io_algorithm alg, int64_t n, int64_t d, int64_t heads, int64_t sram, int64_t bytes,
                             double density, fa_io_pass pass)
{
    fa_io_problem p;
    fa_io_problem_init(&p);
    p.algorithm = alg;
    p.seqlen_q = p.seqlen_k = n;
    p.head_dim = d;
    p.batch_heads = heads;
    p.sram_elements = sram;
    p.element_bytes = bytes;
    p.block_density = density;
    fa_io_counts c;
    CHECK(fa_io_estimate(&p, pass, &c));
    return c;
}

/* ---- standard attention (Algorithms 0 and 3), one head, N x N matrices in memory ------------ */
typedef struct standard_buffers { float *s, *p, *dp; } standard_buffers;

static void standard_head(int64_t n, int64_t d, const float *q, const float *k, const float *v, const float *dout,
                          float *o, float *dq, float *dk, float *dv, standard_buffers *b)
{
    const float tau = 1.0f / sqrtf((float)d);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, tau, q, d, k, d, 0.0f, b->s, n); /* S */
    for (int64_t i = 0; i < n; ++i) { /* P = softmax(S) */
        const float *s = b->s + i * n;
        float *p = b->p + i * n, mx = -INFINITY, sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
        for (int64_t j = 0; j < n; ++j) sum += p[j] = expf(s[j] - mx);
        for (int64_t j = 0; j < n; ++j) p[j] /= sum;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, 1.0f, b->p, n, v, d, 0.0f, o, d); /* O */
    if (!dout) return;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, n, 1.0f, b->p, n, dout, d, 0.0f, dv, d); /* dV */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, 1.0f, dout, d, v, d, 0.0f, b->dp, n);  /* dP */
    for (int64_t i = 0; i < n; ++i) { /* dS = P o (dP - rowsum(P o dP)), into S's memory */
        const float *p = b->p + i * n, *dp = b->dp + i * n;
        float *ds = b->s + i * n, dot = 0.0f;
        for (int64_t j = 0; j < n; ++j) dot += p[j] * dp[j];
        for (int64_t j = 0; j < n; ++j) ds[j] = p[j] * (dp[j] - dot);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, tau, b->s, n, k, d, 0.0f, dq, d); /* dQ */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, n, tau, b->s, n, q, d, 0.0f, dk, d);   /* dK */
}

/* Best of reps, in ms, of forward (+ backward when backward) over heads independent heads. */
static double time_standard(int64_t n, int64_t d, int64_t heads, int backward)
{
    const int64_t nd = heads * n * d;
    float *q = random_floats(nd, 1), *k = random_floats(nd, 2), *v = random_floats(nd, 3), *dout = random_floats(nd, 4);
    float *o = random_floats(nd, 5), *dq = random_floats(nd, 6), *dk = random_floats(nd, 7), *dv = random_floats(nd, 8);
    standard_buffers b = {random_floats(n * n, 9), random_floats(n * n, 10), random_floats(n * n, 11)};
    double best = INFINITY;
    for (int r = 0; r < reps; ++r) {
        const double t0 = now_ms();
        for (int64_t h = 0; h < heads; ++h) {
            const int64_t off = h * n * d;
            standard_head(n, d, q + off, k + off, v + off, backward ? dout + off : NULL, o + off, dq + off, dk + off,
                          dv + off, &b);
        }
        const double t = now_ms() - t0;
        best = t < best ? t : best;
    }
    free(b.dp); free(b.p); free(b.s);
    free(dv); free(dk); free(dq); free(o); free(dout); free(v); free(k); free(q);
    return best;
}

/* ---- flash and block-sparse through the public API -------------------------------------------- */
static fa_tensor tensor(float *data, int64_t heads, int64_t n, int64_t d)
{
    fa_tensor t = {data, FA_DTYPE_F32, heads, n, 1, d, 0, 0, 0};
    return t;
}

/* Exactly round(density * rows * cols) blocks set, the diagonal first (no row left empty). */
static void random_mask(int64_t rows, int64_t cols, double density, uint8_t *m)
{
    const int64_t total = rows * cols, want = (int64_t)llround(density * (double)total);
    memset(m, 0, (size_t)total);
    int64_t set = 0;
    for (int64_t r = 0; r < rows && r < cols && set < want; ++r, ++set) m[r * cols + r] = 1;
    uint32_t seed = 12345;
    while (set < want) {
        seed = seed * 1664525u + 1013904223u;
        const int64_t x = (int64_t)((seed >> 4) % (uint32_t)total);
        if (!m[x]) {
            m[x] = 1;
            ++set;
        }
    }
}

static double time_flash(fa_context *ctx, int64_t n, int64_t d, int64_t heads, const fa_block_mask *mask, int backward)
{
    const int64_t nd = heads * n * d;
    float *q = random_floats(nd, 1), *k = random_floats(nd, 2), *v = random_floats(nd, 3), *dout = random_floats(nd, 4);
    float *o = random_floats(nd, 5), *dq = random_floats(nd, 6), *dk = random_floats(nd, 7), *dv = random_floats(nd, 8);
    float *lse = random_floats(heads * n, 9);
    fa_tensor tq = tensor(q, heads, n, d), tk = tensor(k, heads, n, d), tv = tensor(v, heads, n, d);
    fa_tensor to = tensor(o, heads, n, d), tdo = tensor(dout, heads, n, d), tdq = tensor(dq, heads, n, d);
    fa_tensor tdk = tensor(dk, heads, n, d), tdv = tensor(dv, heads, n, d);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.block_mask = mask;
    double best = INFINITY;
    for (int r = 0; r < reps; ++r) {
        const double t0 = now_ms();
        CHECK(fa_forward(ctx, &desc, &tq, &tk, &tv, &to, lse));
        if (backward) CHECK(fa_backward(ctx, &desc, &tq, &tk, &tv, &to, &tdo, lse, &tdq, &tdk, &tdv));
        const double t = now_ms() - t0;
        best = t < best ? t : best;
    }
    free(lse); free(dv); free(dk); free(dq); free(o); free(dout); free(v); free(k); free(q);
    return best;
}

/* ---- the paper's forward loop order with OpenBLAS tile products (Figure 2 middle) ------------ */
static double time_paper_order_forward(int64_t n, int64_t d, int64_t heads, int64_t br, int64_t bc)
{
    const int64_t nd = heads * n * d;
    float *q = random_floats(nd, 1), *k = random_floats(nd, 2), *v = random_floats(nd, 3), *o = random_floats(nd, 4);
    float *l = random_floats(heads * n, 5), *m = random_floats(heads * n, 6);
    float *s = random_floats(br * bc, 7), *pv = random_floats(br * d, 8);
    float *mt = random_floats(br, 9), *lt = random_floats(br, 10); /* rowmax, rowsum of the tile */
    const float tau = 1.0f / sqrtf((float)d);
    double best = INFINITY;
    for (int r = 0; r < reps; ++r) {
        const double t0 = now_ms();
        for (int64_t h = 0; h < heads; ++h) {
            float *oh = o + h * n * d, *lh = l + h * n, *mh = m + h * n;
            const float *qh = q + h * n * d, *kh = k + h * n * d, *vh = v + h * n * d;
            memset(oh, 0, (size_t)(n * d) * sizeof(float));
            for (int64_t x = 0; x < n; ++x) {
                lh[x] = 0.0f;
                mh[x] = -INFINITY;
            }
            for (int64_t j0 = 0; j0 < n; j0 += bc) {
                const int64_t cols = n - j0 < bc ? n - j0 : bc;
                for (int64_t i0 = 0; i0 < n; i0 += br) {
                    const int64_t rows = n - i0 < br ? n - i0 : br;
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, d, tau, qh + i0 * d, d,
                                kh + j0 * d, d, 0.0f, s, cols);
                    for (int64_t x = 0; x < rows; ++x) {
                        float *row = s + x * cols;
                        mt[x] = -INFINITY;
                        lt[x] = 0.0f;
                        for (int64_t c = 0; c < cols; ++c) mt[x] = row[c] > mt[x] ? row[c] : mt[x];
                        for (int64_t c = 0; c < cols; ++c) lt[x] += row[c] = expf(row[c] - mt[x]);
                    }
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, cols, 1.0f, s, cols, vh + j0 * d, d,
                                0.0f, pv, d);
                    for (int64_t x = 0; x < rows; ++x) { /* O_i, l_i, m_i read and written back */
                        const int64_t row = i0 + x;
                        const float mn = mh[row] > mt[x] ? mh[row] : mt[x];
                        const float a = lh[row] * expf(mh[row] - mn), b = expf(mt[x] - mn), ln = a + b * lt[x];
                        for (int64_t c = 0; c < d; ++c) oh[row * d + c] = (a * oh[row * d + c] + b * pv[x * d + c]) / ln;
                        lh[row] = ln;
                        mh[row] = mn;
                    }
                }
            }
        }
        const double t = now_ms() - t0;
        best = t < best ? t : best;
    }
    free(lt); free(mt); free(pv); free(s); free(m); free(l); free(o); free(v); free(k); free(q);
    return best;
}

/* ---- figures ------------------------------------------------------------------------------------ */
static FILE *open_csv(const char *dir, const char *name, fa_context *ctx)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "fa-bench-io: cannot write %s\n", path);
        exit(1);
    }
    fprintf(f, "# %s; runtimes best of %d; machine: %s\n", name, reps, fa_context_info(ctx));
    fprintf(stderr, "fa-bench-io: writing %s\n", path);
    return f;
}

/* The paper's setting: GPT-2 medium, N = 1024, d = 64, 16 heads x batch 64, fp16, M = 100 KB. */
enum { PAPER_N = 1024, PAPER_D = 64, PAPER_HEADS = 1024, PAPER_SRAM = 100 * 1024 / 2 };

static void fig2_left(const char *dir, fa_context *ctx, int64_t heads)
{
    FILE *f = open_csv(dir, "fig2_left.csv", ctx);
    fprintf(f, "# model: N=%d d=%d batch_heads=%d fp16 M=%d elements (forward + backward); runtime: %lld heads on "
               "this CPU, f32, per head\n",
            PAPER_N, PAPER_D, PAPER_HEADS, PAPER_SRAM, (long long)heads);
    fprintf(f, "algorithm,gflops,hbm_gb,runtime_ms_per_head\n");
    const fa_io_algorithm algs[2] = {FA_IO_STANDARD, FA_IO_FLASH};
    for (int a = 0; a < 2; ++a) {
        const fa_io_counts fw = estimate(algs[a], PAPER_N, PAPER_D, PAPER_HEADS, PAPER_SRAM, 2, 1.0, FA_IO_FORWARD);
        const fa_io_counts bw = estimate(algs[a], PAPER_N, PAPER_D, PAPER_HEADS, PAPER_SRAM, 2, 1.0, FA_IO_BACKWARD);
        const double ms = a == 0 ? time_standard(PAPER_N, PAPER_D, heads, 1)
                                 : time_flash(ctx, PAPER_N, PAPER_D, heads, NULL, 1);
        fprintf(f, "%s,%.1f,%.2f,%.3f\n", a == 0 ? "standard" : "flash", (double)(fw.flops + bw.flops) * 1e-9,
                (double)(fw.bytes + bw.bytes) * 1e-9, ms / (double)heads);
    }
    fclose(f);
}

static void fig2_middle(const char *dir, fa_context *ctx, int64_t heads)
{
    FILE *f = open_csv(dir, "fig2_middle.csv", ctx);
    fprintf(f, "# model: forward, N=%d d=%d batch_heads=%d fp16, M = 4 d Bc (Br = min(Bc, d)); runtime: paper loop "
               "order, %lld heads, f32, per head\n",
            PAPER_N, PAPER_D, PAPER_HEADS, (long long)heads);
    fprintf(f, "block_cols,block_rows,hbm_gb,runtime_ms_per_head\n");
    static const int64_t bcs[] = {16, 32, 64, 128, 256, 512};
    for (size_t x = 0; x < sizeof bcs / sizeof bcs[0]; ++x) {
        const int64_t sram = 4 * PAPER_D * bcs[x];
        const fa_io_counts c = estimate(FA_IO_FLASH, PAPER_N, PAPER_D, PAPER_HEADS, sram, 2, 1.0, FA_IO_FORWARD);
        const double ms = time_paper_order_forward(PAPER_N, PAPER_D, heads, c.block_rows, c.block_cols);
        fprintf(f, "%lld,%lld,%.3f,%.3f\n", (long long)c.block_cols, (long long)c.block_rows, (double)c.bytes * 1e-9,
                ms / (double)heads);
    }
    fclose(f);
}

/* A mask over the CPU backend's own tiles, so that a zero block is a skipped tile. */
static fa_block_mask tile_mask(fa_context *ctx, int64_t n, int64_t d, double density, uint8_t **storage)
{
    fa_tiling t;
    int64_t sram;
    CHECK(fa_context_tiling(ctx, d, FA_DTYPE_F32, &t, &sram));
    fa_block_mask bm = {(int32_t)t.block_rows, (int32_t)t.block_cols, (n + t.block_rows - 1) / t.block_rows,
                        (n + t.block_cols - 1) / t.block_cols, NULL};
    *storage = malloc((size_t)(bm.rows * bm.cols));
    if (!*storage) exit(1);
    random_mask(bm.rows, bm.cols, density, *storage);
    bm.mask = *storage;
    return bm;
}

static void fig2_right(const char *dir, fa_context *ctx, int64_t n, int64_t heads)
{
    FILE *f = open_csv(dir, "fig2_right.csv", ctx);
    fprintf(f, "# N=%lld d=%d, forward + backward; model: fp16, M=%d, batch_heads=%lld; runtime: CPU backend, mask "
               "on its tiles, f32\n",
            (long long)n, PAPER_D, PAPER_SRAM, (long long)heads);
    fprintf(f, "density,hbm_gb,runtime_ms\n");
    static const double densities[] = {1.0, 0.5, 0.25, 0.125, 0.0625};
    for (size_t x = 0; x < sizeof densities / sizeof densities[0]; ++x) {
        uint8_t *storage;
        const fa_block_mask bm = tile_mask(ctx, n, PAPER_D, densities[x], &storage);
        const fa_io_counts fw = estimate(FA_IO_BLOCK_SPARSE, n, PAPER_D, heads, PAPER_SRAM, 2, densities[x], FA_IO_FORWARD);
        const fa_io_counts bw = estimate(FA_IO_BLOCK_SPARSE, n, PAPER_D, heads, PAPER_SRAM, 2, densities[x], FA_IO_BACKWARD);
        const double ms = time_flash(ctx, n, PAPER_D, heads, &bm, 1);
        fprintf(f, "%g,%.4f,%.3f\n", densities[x], (double)(fw.bytes + bw.bytes) * 1e-9, ms);
        free(storage);
    }
    fclose(f);
}

/* Slow memory of forward + backward: Q, K, V, O, dO, dQ, dK, dV plus the most the passes hold. */
static double footprint_mb(fa_io_algorithm alg, int64_t n, double density)
{
    const fa_io_counts fw = estimate(alg, n, PAPER_D, 1, PAPER_SRAM, 4, density, FA_IO_FORWARD);
    const fa_io_counts bw = estimate(alg, n, PAPER_D, 1, PAPER_SRAM, 4, density, FA_IO_BACKWARD);
    const int64_t extra = fw.hbm_extra > bw.hbm_extra ? fw.hbm_extra : bw.hbm_extra;
    return (double)(8 * n * PAPER_D + extra) * 4.0 / 1e6;
}

static void fig3(const char *dir, fa_context *ctx, int64_t max_n)
{
    FILE *f = open_csv(dir, "fig3.csv", ctx);
    fprintf(f, "# forward + backward, d=%d, one head, f32; block-sparse: random mask of density 0.25 on the "
               "CPU tiles; memory: model, slow memory incl. inputs/outputs\n",
            PAPER_D);
    fprintf(f, "seqlen,standard_ms,flash_ms,block_sparse_ms,standard_mb,flash_mb,block_sparse_mb\n");
    for (int64_t n = 128; n <= max_n; n *= 2) {
        uint8_t *storage;
        const fa_block_mask bm = tile_mask(ctx, n, PAPER_D, 0.25, &storage);
        const double std_ms = time_standard(n, PAPER_D, 1, 1);
        const double flash_ms = time_flash(ctx, n, PAPER_D, 1, NULL, 1);
        const double sparse_ms = time_flash(ctx, n, PAPER_D, 1, &bm, 1);
        fprintf(f, "%lld,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", (long long)n, std_ms, flash_ms, sparse_ms,
                footprint_mb(FA_IO_STANDARD, n, 1.0), footprint_mb(FA_IO_FLASH, n, 1.0),
                footprint_mb(FA_IO_BLOCK_SPARSE, n, 0.25));
        free(storage);
    }
    fclose(f);
}

/* One instrumented forward, its counts on stdout: the workload bench/io/cachegrind.sh measures. */
static int sim_forward(int64_t n, int64_t d, int64_t sram)
{
    fa_io_problem p;
    fa_io_problem_init(&p);
    p.seqlen_q = p.seqlen_k = n;
    p.head_dim = d;
    p.sram_elements = sram;
    float *q = random_floats(n * d, 1), *k = random_floats(n * d, 2), *v = random_floats(n * d, 3);
    float *o = random_floats(n * d, 4);
    fa_io_counts c;
    CHECK(fa_io_simulate(&p, q, k, v, o, NULL, &c, NULL, NULL, NULL, NULL, NULL));
    printf("N=%lld d=%lld M=%lld Br=%lld Bc=%lld sram_peak=%lld reads=%lld writes=%lld (elements of 4 bytes)\n",
           (long long)n, (long long)d, (long long)sram, (long long)c.block_rows, (long long)c.block_cols,
           (long long)c.sram_peak, (long long)c.total_reads, (long long)c.total_writes);
    free(o); free(v); free(k); free(q);
    return 0;
}

int main(int argc, char **argv)
{
    const char *dir = ".", *what = "all";
    int quick = 0;
    for (int a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--out") && a + 1 < argc) dir = argv[++a];
        else if (!strcmp(argv[a], "--quick")) quick = 1;
        else if (!strcmp(argv[a], "sim-forward") && a + 3 < argc)
            return sim_forward(atoll(argv[a + 1]), atoll(argv[a + 2]), atoll(argv[a + 3]));
        else if (argv[a][0] != '-') what = argv[a];
        else {
            fprintf(stderr, "usage: fa-bench-io [--out DIR] [--quick] [all|fig2-left|fig2-middle|fig2-right|fig3]\n"
                            "       fa-bench-io sim-forward N D M\n");
            return 2;
        }
    }
    if (quick) reps = 1;
    fa_context *ctx;
    CHECK(fa_context_create(FA_BACKEND_CPU, 0, &ctx));
    const int all = !strcmp(what, "all");
    int done = 0;
    if (all || !strcmp(what, "fig2-left")) fig2_left(dir, ctx, quick ? 1 : 4), done = 1;
    if (all || !strcmp(what, "fig2-middle")) fig2_middle(dir, ctx, quick ? 1 : 4), done = 1;
    if (all || !strcmp(what, "fig2-right")) fig2_right(dir, ctx, quick ? 1024 : 4096, 1), done = 1;
    if (all || !strcmp(what, "fig3")) fig3(dir, ctx, quick ? 1024 : 4096), done = 1;
    fa_context_destroy(ctx);
    if (!done) {
        fprintf(stderr, "fa-bench-io: unknown figure '%s'\n", what);
        return 2;
    }
    return 0;
}

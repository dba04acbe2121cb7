#include "std_attention.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_clock.h"
#include "cpu/kernels/kernels.h"

enum { LANES = 16 }; /* a row of N is viewed as N/16 x 16 for the column kernels */

static const fa_cpu_kernels *kernels(void)
{
    static const fa_cpu_kernels *k;
    if (!k && fa_cpu_select_kernels(&k) != 0) k = &fa_cpu_kernels_ref;
    return k;
}

/* Row softmax numerator in place: p = exp(s - max); returns the row sum. Masked entries = -inf. */
static float softmax_row(float *s, int64_t n)
{
    const fa_cpu_kernels *kern = kernels();
    float part[LANES], shift[LANES];
    const int64_t body = n / LANES * LANES;
    float mx = -INFINITY;
    if (body) {
        kern->col_max(s, LANES, body / LANES, LANES, part);
        for (int i = 0; i < LANES; ++i) mx = part[i] > mx ? part[i] : mx;
    }
    for (int64_t j = body; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
    float sum = 0.0f;
    for (int i = 0; i < LANES; ++i) shift[i] = mx;
    if (body) {
        kern->exp_cols(s, LANES, body / LANES, LANES, 1.0f, shift, part);
        for (int i = 0; i < LANES; ++i) sum += part[i];
    }
    for (int64_t j = body; j < n; ++j) sum += s[j] = expf(s[j] - mx);
    return sum;
}

/* S = scale Q_h K_h^T (causal: -inf above the diagonal), P = softmax rows (unnormalised), the
 * row sums in l. */
static void scores(const std_problem *p, int64_t h, float *s, float *l)
{
    const int64_t n = p->n, d = p->d, ld = p->ld;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)n, (int)d, 1.0f / sqrtf((float)d),
                p->q + h * p->head_stride, (int)ld, p->k + h * p->head_stride, (int)ld, 0.0f, s, (int)n);
    for (int64_t i = 0; i < n; ++i) {
        float *row = s + i * n;
        if (p->causal)
            for (int64_t j = i + 1; j < n; ++j) row[j] = -INFINITY;
        l[i] = softmax_row(row, n);
    }
}

static void normalise_rows(float *x, int64_t rows, int64_t cols, int64_t ld, const float *l)
{
    for (int64_t i = 0; i < rows; ++i) {
        const float inv = 1.0f / l[i];
        for (int64_t j = 0; j < cols; ++j) x[i * ld + j] *= inv;
    }
}

/* Algorithm 3 for head h given the normalised P: dV, dP, dS, dQ, dK. */
static void backward_head(const std_problem *p, int64_t h, const float *pm, float *dpm)
{
    const int n = (int)p->n, d = (int)p->d, ld = (int)p->ld;
    const float scale = 1.0f / sqrtf((float)d);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, n, 1.0f, pm, n, p->dout + h * p->head_stride, ld, 0.0f,
                p->dv + h * p->head_stride, ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, 1.0f, p->dout + h * p->head_stride, ld,
                p->v + h * p->head_stride, ld, 0.0f, dpm, n);
    for (int64_t i = 0; i < n; ++i) {
        const float *pr = pm + i * n;
        float *dr = dpm + i * n;
        float dot = 0.0f; /* D_i = rowsum(P o dP) */
        for (int64_t j = 0; j < n; ++j) dot += pr[j] * dr[j];
        for (int64_t j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - dot);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, scale, dpm, n, p->k + h * p->head_stride, ld, 0.0f,
                p->dq + h * p->head_stride, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, n, scale, dpm, n, p->q + h * p->head_stride, ld, 0.0f,
                p->dk + h * p->head_stride, ld);
}

/* Runs body(head) over the heads with `buffers` N x N matrices per thread. */
static int for_each_head(const std_problem *p, int buffers, int mode)
{
    const size_t nn = (size_t)(p->n * p->n);
    int failed = 0;
    openblas_set_num_threads(1);
#pragma omp parallel num_threads(p->threads)
    {
        float *s = malloc(nn * sizeof(float) * (size_t)buffers + (size_t)p->n * sizeof(float));
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t h = 0; h < p->heads; ++h) {
            if (!s) continue;
            float *l = s + nn * (size_t)buffers;
            const int64_t n = p->n, d = p->d, ld = p->ld;
            scores(p, h, s, l);
            if (mode == 0) { /* forward: O = P V, then divide the rows by l */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)d, (int)n, 1.0f, s, (int)n,
                            p->v + h * p->head_stride, (int)ld, 0.0f, p->out + h * p->head_stride, (int)ld);
                normalise_rows(p->out + h * p->head_stride, n, d, ld, l);
                continue;
            }
            normalise_rows(s, n, n, n, l); /* P itself is needed by the backward */
            if (mode == 2)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)d, (int)n, 1.0f, s, (int)n,
                            p->v + h * p->head_stride, (int)ld, 0.0f, p->out + h * p->head_stride, (int)ld);
            backward_head(p, h, s, s + nn);
        }
        free(s);
    }
    return failed ? -1 : 0;
}

int std_forward(const std_problem *p) { return for_each_head(p, 1, 0); }
int std_backward(const std_problem *p) { return for_each_head(p, 2, 1); }
int std_forward_backward(const std_problem *p) { return for_each_head(p, 2, 2); }

const char *openblas_core_name(void)
{
    const char *core = openblas_get_corename();
    return core ? core : "unknown";
}

const char *std_blas_core_for(const char *isa)
{
    /* Cores before AVX: what OpenBLAS's dynamic dispatch falls back to on a CPU it does not know
     * (Debian's 0.3.21 on an Emerald Rapids: "Prescott", SSE3 kernels at 0.18 of the FMA peak). */
    static const char *const old_cores[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom"};
    const char *core = openblas_core_name();
    if (!isa || getenv("OPENBLAS_CORETYPE")) return NULL;
    const char *want = strcmp(isa, "avx512") == 0 ? "SkylakeX" : strcmp(isa, "avx2") == 0 ? "Haswell" : NULL;
    for (size_t i = 0; want && i < sizeof old_cores / sizeof old_cores[0]; ++i)
        if (strcmp(core, old_cores[i]) == 0) return want;
    return NULL;
}

double std_sgemm_rate(int64_t n, int threads, int reps)
{
    float *a = malloc((size_t)(3 * n * n) * sizeof(float));
    if (!a) return 0.0;
    for (int64_t i = 0; i < 3 * n * n; ++i) a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    openblas_set_num_threads(threads);
    double best = 1e30;
    for (int r = -1; r < reps; ++r) { /* r = -1: warm-up (thread start, first touch), not timed */
        const double t0 = bench_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, a, (int)n, a + n * n,
                    (int)n, 0.0f, a + 2 * n * n, (int)n);
        const double t = bench_seconds() - t0;
        if (r >= 0) best = t < best ? t : best;
    }
    free(a);
    openblas_set_num_threads(1);
    return 2.0 * (double)n * (double)n * (double)n / best * 1e-9;
}

/* libFuzzer target for the IO model (include/flashattn_io.h): decodes its input into one
 * fa_io_problem (algorithm, sizes, on-chip memory M, explicit or derived tiles, block mask or
 * density, dropout, scale, an f32 bias with broadcast strides), then
 *  - fa_io_estimate must succeed exactly when fa_io_simulate does (density without a mask aside:
 *    the model's expectation has no run), and a failure must name its argument and write nothing:
 *    counts and outputs keep their canary bytes;
 *  - on success the instrumented run's counts equal the model's field by field (the model is exact,
 *    docs/IO.md), forward and backward;
 *  - out, lse, dq, dk, dv match the double-precision oracle (tests/oracle.h).
 * Every array is allocated to its exact extent, so AddressSanitizer sees any out-of-bounds access.
 * Input layout: fuzz/README.md. Build and run: scripts/ci-fuzz.sh. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "flashattn_io.h"
#include "oracle.h"

#define FUZZ_TARGET "fuzz_io"
#include "fuzz_common.h"

enum flags { F_TILES = 1, F_MASK = 2, F_DENSITY = 4, F_DROPOUT = 8, F_BIAS = 16, F_SCALE = 32, F_CORRUPT = 64 };

/* Corruptions (byte mod C_MODES), each an invalid argument the model and the run must both refuse. */
enum corruption { C_SEQLEN, C_HEAD_DIM, C_SRAM, C_TILES, C_DENSITY, C_DROPOUT, C_ALGORITHM, C_BIAS_STRIDE, C_MODES };
static const char *const corruption_names[C_MODES] = {
    "seqlen_q 0", "head_dim -1", "sram_elements 0", "block_rows without block_cols",
    "block_density 1.5", "dropout_p 1", "algorithm 9", "bias stride_batch 1",
};

typedef struct problem {
    fa_io_problem io;
    fa_block_mask mask;
    uint8_t mask_bits[40 * 40]; /* block sizes down to 1 over up to 40 x 40 tokens */
    fa_bias bias;
    float *q, *k, *v, *dout, *bias_data;
    size_t bias_elements;
    int corrupt;
} problem;

FUZZ_CHECKER static float *random_floats(int64_t n, uint64_t *rng, double amplitude)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    if (!x) abort();
    for (int64_t i = 0; i < n; ++i)
        x[i] = (float)(amplitude * ((double)(splitmix(rng) >> 11) * 0x1p-53 * 2.0 - 1.0));
    return x;
}

static void decode(reader *r, problem *p, uint8_t flags)
{
    fa_io_problem_init(&p->io);
    p->io.algorithm = (fa_io_algorithm)(next(r) % 4);
    p->io.batch_heads = 1 + next(r) % 3;
    p->io.seqlen_q = 1 + next(r) % 40;
    p->io.seqlen_k = 1 + next(r) % 40;
    p->io.head_dim = 1 + next(r) % 24;
    /* M from one row's worth up to room for everything: 4d (the paper's Bc = ceil(M/4d) >= 1). */
    p->io.sram_elements = 4 * p->io.head_dim * (1 + next(r) % 32) + next(r) % 16;
    if (flags & F_TILES) {
        p->io.block_rows = 1 + next(r) % 12;
        p->io.block_cols = 1 + next(r) % 12;
    }
    const int sparse = p->io.algorithm == FA_IO_BLOCK_SPARSE || p->io.algorithm == FA_IO_FLASH_QUERY_OUTER;
    if (sparse && flags & F_MASK) {
        p->mask.block_q = 1 + next(r) % 16;
        p->mask.block_k = 1 + next(r) % 16;
        p->mask.rows = (p->io.seqlen_q + p->mask.block_q - 1) / p->mask.block_q;
        p->mask.cols = (p->io.seqlen_k + p->mask.block_k - 1) / p->mask.block_k;
        const uint8_t density = next(r);
        uint64_t bits = next_u64(r);
        for (int64_t x = 0; x < p->mask.rows * p->mask.cols; ++x)
            p->mask_bits[x] = (uint8_t)(splitmix(&bits) % 256 < density);
        p->mask.mask = p->mask_bits;
        p->io.block_mask = &p->mask;
    } else if (sparse && flags & F_DENSITY) {
        p->io.block_density = (1 + next(r) % 16) / 16.0; /* (0, 1]: the model alone, no run below 1 */
    }
    if (flags & F_DROPOUT && p->io.algorithm != FA_IO_STANDARD) { /* Algorithm 0 has no dropout step */
        p->io.dropout_p = (float)(next(r) % 10) / 10.0f;
        p->io.dropout_seed = next_u64(r);
        p->io.dropout_offset = next(r);
    }
    if (flags & F_SCALE) p->io.softmax_scale = (float)((next(r) % 64 + 1) / 32.0);
    const double amplitude = 0.25 + next(r) % 12 * 0.25;
    uint64_t rng = next_u64(r);
    const int64_t h = p->io.batch_heads, nq = p->io.seqlen_q, nk = p->io.seqlen_k, d = p->io.head_dim;
    p->q = random_floats(h * nq * d, &rng, amplitude);
    p->k = random_floats(h * nk * d, &rng, amplitude);
    p->v = random_floats(h * nk * d, &rng, 1.0);
    p->dout = random_floats(h * nq * d, &rng, 1.0);
    if (flags & F_BIAS) {
        /* Broadcast over pairs and/or query rows (stride 0), else packed [pairs, nq, nk]. */
        const uint8_t broadcast = next(r);
        const int64_t stride_q = broadcast & 1 ? 0 : nk, stride_head = broadcast & 2 ? 0 : (stride_q ? nq : 1) * nk;
        p->bias_elements = (size_t)((stride_head ? h : 1) * (stride_q ? nq : 1) * nk);
        p->bias_data = random_floats((int64_t)p->bias_elements, &rng, 2.0);
        p->bias = (fa_bias){p->bias_data, FA_DTYPE_F32, 0, stride_head, stride_q};
        p->io.bias = &p->bias;
    }
    p->corrupt = flags & F_CORRUPT ? next(r) % C_MODES : -1;
    switch (p->corrupt) {
    case C_SEQLEN: p->io.seqlen_q = 0; break;
    case C_HEAD_DIM: p->io.head_dim = -1; break;
    case C_SRAM: p->io.sram_elements = 0; break;
    case C_TILES: p->io.block_rows = 4; p->io.block_cols = 0; break;
    case C_DENSITY: p->io.block_density = 1.5; break;
    case C_DROPOUT: p->io.dropout_p = 1.0f; break;
    case C_ALGORITHM: p->io.algorithm = (fa_io_algorithm)9; break;
    case C_BIAS_STRIDE:
        if (!p->io.bias) {
            p->corrupt = C_SEQLEN;
            p->io.seqlen_q = 0;
        } else {
            p->bias.stride_batch = 1;
        }
        break;
    default: break;
    }
}

FUZZ_CHECKER static double max_error(const float *got, const double *want, int64_t n)
{
    double e = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double diff = fabs((double)got[i] - want[i]);
        if (!(diff <= e)) e = diff; /* NaN propagates */
    }
    return e;
}

FUZZ_CHECKER static double max_abs(const double *x, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; ++i) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

FUZZ_CHECKER static double *to_doubles(const float *x, int64_t n)
{
    double *y = malloc((size_t)(n > 0 ? n : 1) * sizeof *y);
    if (!y) abort();
    for (int64_t i = 0; i < n; ++i) y[i] = x[i];
    return y;
}

FUZZ_CHECKER static void check_counts(const fa_io_counts *model, const fa_io_counts *run, const char *pass)
{
    const int64_t *a = (const int64_t *)model, *b = (const int64_t *)run;
    /* Every field is an int64_t after struct_size-free layout: compare them all, name the first. */
    static const char *const names[] = {"reads", "writes"};
    for (int o = 0; o < FA_IO_OPERAND_COUNT; ++o)
        for (int w = 0; w < 2; ++w) {
            const int64_t x = w ? model->writes[o] : model->reads[o], y = w ? run->writes[o] : run->reads[o];
            if (x != y) {
                fprintf(stderr, "fuzz_io: %s %s of %s: model %lld, run %lld\n", pass, names[w], fa_io_operand_name(o),
                        (long long)x, (long long)y);
                abort();
            }
        }
    const size_t n = sizeof *model / sizeof(int64_t);
    for (size_t i = 2 * FA_IO_OPERAND_COUNT; i < n; ++i)
        if (a[i] != b[i]) {
            fprintf(stderr, "fuzz_io: %s counts differ in field %zu of fa_io_counts: model %lld, run %lld\n", pass, i,
                    (long long)a[i], (long long)b[i]);
            abort();
        }
}

FUZZ_CHECKER static void check_outputs(const problem *p, const float *out, const float *lse, const float *dq,
                                       const float *dk, const float *dv, int backward, int stats)
{
    const int64_t h = p->io.batch_heads, nq = p->io.seqlen_q, nk = p->io.seqlen_k, d = p->io.head_dim;
    /* The pairs are the oracle's batch entries, one head each. */
    oracle_shape shape = {h, 1, 1, nq, nk, d};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.softmax_scale = p->io.softmax_scale;
    desc.dropout_p = p->io.dropout_p;
    desc.dropout_seed = p->io.dropout_seed;
    desc.dropout_offset = p->io.dropout_offset;
    desc.block_mask = p->io.block_mask;
    fa_bias bias = {0};
    if (p->io.bias) {
        bias = *p->io.bias;
        bias.stride_batch = p->io.bias->stride_head;
        bias.stride_head = 0;
        desc.bias = &bias;
    }
    double *qd = to_doubles(p->q, h * nq * d), *kd = to_doubles(p->k, h * nk * d), *vd = to_doubles(p->v, h * nk * d);
    double *dod = to_doubles(p->dout, h * nq * d);
    double *ref = malloc((size_t)(h * nq * d) * sizeof *ref), *ref_lse = malloc((size_t)(h * nq) * sizeof *ref_lse);
    double *rq = malloc((size_t)(h * nq * d) * sizeof *rq), *rk = malloc((size_t)(h * nk * d) * sizeof *rk);
    double *rv = malloc((size_t)(h * nk * d) * sizeof *rv);
    if (!ref || !ref_lse || !rq || !rk || !rv) abort();
    oracle_forward(&shape, &desc, qd, kd, vd, ref, ref_lse);
    /* f32 sums over up to 40 keys of |scores| up to ~9 * 24 * scale: the tolerance of fuzz_common.h. */
    double score_max = 0.0;
    for (int64_t i = 0; i < h * nq * d; ++i) score_max = fabs(qd[i]) > score_max ? fabs(qd[i]) : score_max;
    double k_max = 0.0;
    for (int64_t i = 0; i < h * nk * d; ++i) k_max = fabs(kd[i]) > k_max ? fabs(kd[i]) : k_max;
    const double scale = p->io.softmax_scale > 0 ? p->io.softmax_scale : 1.0 / sqrt((double)d);
    score_max = score_max * k_max * (double)d * scale + (p->io.bias ? 2.0 : 0.0);
    const double keep = p->io.dropout_p > 0 ? 1.0 / (1.0 - p->io.dropout_p) : 1.0;
    const double tol_out = tolerance(FA_DTYPE_F32, keep * max_abs(ref, h * nq * d), score_max);
    double e = max_error(out, ref, h * nq * d);
    if (!(e <= tol_out)) {
        fprintf(stderr, "fuzz_io: out differs from the oracle by %g (tolerance %g)\n", e, tol_out);
        abort();
    }
    if (stats) {
        /* Rows with nothing visible have lse -inf in both. */
        for (int64_t i = 0; i < h * nq; ++i) {
            const double want = ref_lse[i], got = lse[i];
            if (isinf(want) ? got != want : !(fabs(got - want) <= tolerance(FA_DTYPE_F32, fabs(want), score_max))) {
                fprintf(stderr, "fuzz_io: lse[%lld] is %g, the oracle's %g\n", (long long)i, got, want);
                abort();
            }
        }
    }
    if (backward) {
        oracle_backward(&shape, &desc, qd, kd, vd, dod, rq, rk, rv);
        const struct { const char *name; const float *got; const double *want; int64_t n; } grads[3] = {
            {"dq", dq, rq, h * nq * d}, {"dk", dk, rk, h * nk * d}, {"dv", dv, rv, h * nk * d}};
        for (int g = 0; g < 3; ++g) {
            /* Gradients sum up to 40 products per element: the forward's bound times the length. */
            const double tol = tolerance(FA_DTYPE_F32, keep * max_abs(grads[g].want, grads[g].n), score_max) *
                               (double)(nq > nk ? nq : nk) * (1.0 + k_max + score_max);
            e = max_error(grads[g].got, grads[g].want, grads[g].n);
            if (!(e <= tol)) {
                fprintf(stderr, "fuzz_io: %s differs from the oracle by %g (tolerance %g)\n", grads[g].name, e, tol);
                abort();
            }
        }
    }
    free(rv); free(rk); free(rq); free(ref_lse); free(ref);
    free(dod); free(vd); free(kd); free(qd);
}

static float *canary_floats(int64_t n)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    if (!x) abort();
    memset(x, 0xff, (size_t)(n > 0 ? n : 1) * sizeof *x);
    return x;
}

static void describe(const problem *p)
{
    static const char *const algorithms[] = {"standard", "flash", "block-sparse", "flash-query-outer"};
    fprintf(stderr, "fuzz_io: %s, pairs %lld, seqlen %lld x %lld, d %lld, M %lld, tiles %lld x %lld, mask %s, density %g, "
                    "dropout %g, scale %g, bias %s, corruption %s\n",
            (unsigned)p->io.algorithm < 4 ? algorithms[p->io.algorithm] : "?", (long long)p->io.batch_heads,
            (long long)p->io.seqlen_q, (long long)p->io.seqlen_k, (long long)p->io.head_dim,
            (long long)p->io.sram_elements, (long long)p->io.block_rows, (long long)p->io.block_cols,
            p->io.block_mask ? "yes" : "no", p->io.block_density, p->io.dropout_p, p->io.softmax_scale,
            p->io.bias ? (p->bias.stride_head ? (p->bias.stride_q ? "full" : "per pair") : (p->bias.stride_q ? "per row" : "one row"))
                       : "no",
            p->corrupt >= 0 ? corruption_names[p->corrupt] : "none");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    const uint8_t flags = next(&r);
    problem p;
    memset(&p, 0, sizeof p);
    decode(&r, &p, flags);
    if (getenv("FUZZ_VERBOSE")) describe(&p);
    const int valid_sizes = p.io.seqlen_q > 0 && p.io.head_dim > 0;
    const int64_t h = p.io.batch_heads, nq = valid_sizes ? p.io.seqlen_q : 1, nk = p.io.seqlen_k,
                  d = valid_sizes ? p.io.head_dim : 1;
    const int backward = p.io.algorithm != FA_IO_FLASH_QUERY_OUTER, stats = p.io.algorithm != FA_IO_STANDARD;
    float *out = canary_floats(h * nq * d), *lse = canary_floats(h * nq), *dq = canary_floats(h * nq * d);
    float *dk = canary_floats(h * nk * d), *dv = canary_floats(h * nk * d);
    fa_io_counts model_f, model_b, run_f, run_b;
    memset(&model_f, 0xff, sizeof model_f);
    memset(&model_b, 0xff, sizeof model_b);
    memset(&run_f, 0xff, sizeof run_f);
    memset(&run_b, 0xff, sizeof run_b);

    const fa_status est_f = fa_io_estimate(&p.io, FA_IO_FORWARD, &model_f);
    const fa_status est_b = backward ? fa_io_estimate(&p.io, FA_IO_BACKWARD, &model_b) : FA_SUCCESS;
    const int expectation_only = p.io.block_density > 0 && p.io.block_density < 1 && !p.io.block_mask;
    const fa_status run = expectation_only ? FA_SUCCESS
                                           : fa_io_simulate(&p.io, p.q, p.k, p.v, out, stats ? lse : NULL, &run_f,
                                                            backward ? p.dout : NULL, dq, dk, dv, &run_b);
    if (p.corrupt >= 0) {
        const fa_status got[3] = {est_f, est_b, run};
        static const char *const calls[3] = {"fa_io_estimate (forward)", "fa_io_estimate (backward)", "fa_io_simulate"};
        for (int c = 0; c < 3; ++c) {
            if (c == 1 && !backward) continue;
            if (c == 2 && expectation_only) continue;
            if (got[c] != FA_ERROR_INVALID_VALUE) {
                fprintf(stderr, "fuzz_io: %s with %s returned %d (%s), expected FA_ERROR_INVALID_VALUE\n", calls[c],
                        corruption_names[p.corrupt], (int)got[c], fa_last_error());
                abort();
            }
        }
        if (!fa_last_error()[0]) {
            fprintf(stderr, "fuzz_io: %s refused without a message\n", corruption_names[p.corrupt]);
            abort();
        }
        if (!all_ff(&model_f, sizeof model_f) || !all_ff(&model_b, sizeof model_b) || !all_ff(&run_f, sizeof run_f) ||
            !all_ff(&run_b, sizeof run_b) || !all_ff(out, (size_t)(h * nq * d) * sizeof *out) ||
            !all_ff(lse, (size_t)(h * nq) * sizeof *lse) || !all_ff(dq, (size_t)(h * nq * d) * sizeof *dq) ||
            !all_ff(dk, (size_t)(h * nk * d) * sizeof *dk) || !all_ff(dv, (size_t)(h * nk * d) * sizeof *dv)) {
            fprintf(stderr, "fuzz_io: %s was refused but counts or outputs were written\n", corruption_names[p.corrupt]);
            abort();
        }
    } else {
        if (est_f != FA_SUCCESS || est_b != FA_SUCCESS || run != FA_SUCCESS) {
            fprintf(stderr, "fuzz_io: a valid problem failed (estimate %d/%d, simulate %d): %s\n", (int)est_f, (int)est_b,
                    (int)run, fa_last_error());
            abort();
        }
        if (!expectation_only) {
            check_counts(&model_f, &run_f, "forward");
            if (backward) check_counts(&model_b, &run_b, "backward");
            check_outputs(&p, out, lse, dq, dk, dv, backward, stats);
        }
    }
    free(out); free(lse); free(dq); free(dk); free(dv);
    free(p.q); free(p.k); free(p.v); free(p.dout); free(p.bias_data);
    return 0;
}

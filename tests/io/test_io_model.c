/* The IO model (fa_io_estimate) against the instrumented run (fa_io_simulate): equal counts on a
 * grid of (N, d, M, mask or density, dropout); the instrumented run's outputs against the oracle;
 * the scaling the paper's Theorem 2 and Proposition 4 state; argument errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flashattn_io.h"
#include "oracle.h"

/* Uniform in [-1, 1) from a fixed-seed LCG: reproducible inputs. */
static float next_uniform(uint32_t *state)
{
    *state = *state * 1664525u + 1013904223u;
    return (float)(*state >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

static float *random_array(int64_t n, uint32_t *state)
{
    float *a = malloc((size_t)n * sizeof(float));
    assert_non_null(a);
    for (int64_t x = 0; x < n; ++x) a[x] = next_uniform(state);
    return a;
}

static double *to_double(const float *a, int64_t n)
{
    double *b = malloc((size_t)n * sizeof(double));
    assert_non_null(b);
    for (int64_t x = 0; x < n; ++x) b[x] = a[x];
    return b;
}

static double max_abs_diff(const float *a, const double *b, int64_t n)
{
    double e = 0.0;
    for (int64_t x = 0; x < n; ++x) {
        if (isinf(b[x]) && isinf(a[x]) && (b[x] < 0) == (a[x] < 0)) continue; /* -inf lse of unseen rows */
        const double diff = fabs((double)a[x] - b[x]);
        e = diff > e || isnan(diff) ? diff : e;
    }
    return e;
}

static void assert_counts_equal(const fa_io_counts *model, const fa_io_counts *run, const char *what)
{
    for (int x = 0; x < FA_IO_OPERAND_COUNT; ++x) {
        if (model->reads[x] != run->reads[x] || model->writes[x] != run->writes[x])
            fail_msg("%s: %s reads %lld (model) vs %lld (run), writes %lld vs %lld", what,
                     fa_io_operand_name((fa_io_operand)x), (long long)model->reads[x], (long long)run->reads[x],
                     (long long)model->writes[x], (long long)run->writes[x]);
    }
    assert_int_equal(model->total_reads, run->total_reads);
    assert_int_equal(model->total_writes, run->total_writes);
    assert_int_equal(model->bytes, run->bytes);
    assert_int_equal(model->flops, run->flops);
    assert_int_equal(model->sram_peak, run->sram_peak);
    assert_int_equal(model->hbm_extra, run->hbm_extra);
    assert_int_equal(model->block_rows, run->block_rows);
    assert_int_equal(model->block_cols, run->block_cols);
    assert_int_equal(model->tiles_visited, run->tiles_visited);
    assert_int_equal(model->bias_reads, run->bias_reads);
}

/* A square problem: seqlen_q = seqlen_k = n, defaults otherwise (fa_io_problem_init). */
static fa_io_problem square_problem(fa_io_algorithm algorithm, int64_t n, int64_t d, int64_t sram)
{
    fa_io_problem p;
    fa_io_problem_init(&p);
    p.algorithm = algorithm;
    p.seqlen_q = p.seqlen_k = n;
    p.head_dim = d;
    p.sram_elements = sram;
    return p;
}

typedef enum grid_mask { MASK_NONE, MASK_RANDOM, MASK_BUTTERFLY, MASK_LOCAL_GLOBAL } grid_mask;

/* A mask over blocks of block_q x block_k tokens (deliberately not the algorithm's tile sizes). */
static uint8_t *make_mask(grid_mask kind, int64_t nq, int64_t nk, int32_t block_q, int32_t block_k, uint32_t seed,
                          fa_block_mask *bm)
{
    bm->block_q = block_q;
    bm->block_k = block_k;
    bm->rows = (nq + block_q - 1) / block_q;
    bm->cols = (nk + block_k - 1) / block_k;
    uint8_t *m = malloc((size_t)(bm->rows * bm->cols));
    assert_non_null(m);
    if (kind == MASK_RANDOM)
        for (int64_t x = 0; x < bm->rows * bm->cols; ++x) m[x] = next_uniform(&seed) < -0.3f;
    else if (kind == MASK_BUTTERFLY)
        assert_int_equal(fa_block_mask_butterfly(bm->rows, bm->cols, m), FA_SUCCESS);
    else
        assert_int_equal(fa_block_mask_local_global(bm->rows, bm->cols, 1, 1, m), FA_SUCCESS);
    bm->mask = m;
    return m;
}

/* Runs one problem through the model and the instrumented run, checks counts and outputs. */
static void check_problem(const fa_io_problem *p, const char *what)
{
    const int64_t h = p->batch_heads, nq = p->seqlen_q, nk = p->seqlen_k, d = p->head_dim;
    const int backward = p->algorithm != FA_IO_FLASH_QUERY_OUTER, stats = p->algorithm != FA_IO_STANDARD;
    uint32_t seed = (uint32_t)(nq * 131 + nk * 17 + d * 7 + p->sram_elements);
    float *q = random_array(h * nq * d, &seed), *k = random_array(h * nk * d, &seed);
    float *v = random_array(h * nk * d, &seed), *dout = random_array(h * nq * d, &seed);
    float *out = calloc((size_t)(h * nq * d), sizeof(float)), *lse = calloc((size_t)(h * nq), sizeof(float));
    float *dq = calloc((size_t)(h * nq * d), sizeof(float)), *dk = calloc((size_t)(h * nk * d), sizeof(float));
    float *dv = calloc((size_t)(h * nk * d), sizeof(float));
    assert_true(out && lse && dq && dk && dv);

    fa_io_counts model_f, model_b, run_f, run_b;
    assert_int_equal(fa_io_estimate(p, FA_IO_FORWARD, &model_f), FA_SUCCESS);
    if (backward) assert_int_equal(fa_io_estimate(p, FA_IO_BACKWARD, &model_b), FA_SUCCESS);
    const fa_status st = fa_io_simulate(p, q, k, v, out, stats ? lse : NULL, &run_f, backward ? dout : NULL, dq, dk,
                                        dv, &run_b);
    if (st != FA_SUCCESS) fail_msg("%s: simulate: %s", what, fa_last_error());
    assert_counts_equal(&model_f, &run_f, what);
    if (backward) assert_counts_equal(&model_b, &run_b, what);

    /* The outputs against the oracle (double precision, no shared code). */
    oracle_shape shape = {h, 1, 1, nq, nk, d};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.softmax_scale = p->softmax_scale;
    desc.dropout_p = p->dropout_p;
    desc.dropout_seed = p->dropout_seed;
    desc.dropout_offset = p->dropout_offset;
    desc.block_mask = p->block_mask;
    /* The IO problem's pairs are the oracle's batch entries (one head each). */
    fa_bias oracle_bias = {0};
    if (p->bias) {
        oracle_bias = *p->bias;
        oracle_bias.stride_batch = p->bias->stride_head;
        oracle_bias.stride_head = 0;
        desc.bias = &oracle_bias;
    }
    double *qd = to_double(q, h * nq * d), *kd = to_double(k, h * nk * d), *vd = to_double(v, h * nk * d);
    double *dod = to_double(dout, h * nq * d);
    double *ref_out = malloc((size_t)(h * nq * d) * sizeof(double)), *ref_lse = malloc((size_t)(h * nq) * sizeof(double));
    double *ref_dq = malloc((size_t)(h * nq * d) * sizeof(double)), *ref_dk = malloc((size_t)(h * nk * d) * sizeof(double));
    double *ref_dv = malloc((size_t)(h * nk * d) * sizeof(double));
    assert_true(ref_out && ref_lse && ref_dq && ref_dk && ref_dv);
    oracle_forward(&shape, &desc, qd, kd, vd, ref_out, ref_lse);
    const double tol = 1e-4;
    double e = max_abs_diff(out, ref_out, h * nq * d);
    if (!(e <= tol)) fail_msg("%s: out differs from the oracle by %g", what, e);
    if (stats && !((e = max_abs_diff(lse, ref_lse, h * nq)) <= tol))
        fail_msg("%s: lse differs from the oracle by %g", what, e);
    if (backward) {
        oracle_backward(&shape, &desc, qd, kd, vd, dod, ref_dq, ref_dk, ref_dv);
        const double eq = max_abs_diff(dq, ref_dq, h * nq * d), ek = max_abs_diff(dk, ref_dk, h * nk * d),
                     ev = max_abs_diff(dv, ref_dv, h * nk * d);
        if (!(eq <= tol && ek <= tol && ev <= tol))
            fail_msg("%s: gradients differ from the oracle by dq %g dk %g dv %g", what, eq, ek, ev);
    }
    free(ref_dv); free(ref_dk); free(ref_dq); free(ref_lse); free(ref_out);
    free(dod); free(vd); free(kd); free(qd);
    free(dv); free(dk); free(dq); free(lse); free(out); free(dout); free(v); free(k); free(q);
}

static void test_model_equals_run_on_grid(void **state)
{
    (void)state;
    static const int64_t lengths[][2] = {{1, 1}, {17, 17}, {64, 64}, {100, 37}, {37, 100}};
    static const int64_t dims[] = {8, 32};
    static const int64_t srams[] = {16, 100, 512, 4096}; /* Bc from 1 to 128 */
    static const fa_io_algorithm algorithms[] = {FA_IO_STANDARD, FA_IO_FLASH, FA_IO_BLOCK_SPARSE,
                                                 FA_IO_FLASH_QUERY_OUTER};
    int checked = 0;
    for (size_t a = 0; a < 4; ++a)
        for (size_t n = 0; n < sizeof lengths / sizeof lengths[0]; ++n)
            for (size_t di = 0; di < 2; ++di)
                for (size_t mi = 0; mi < 4; ++mi)
                    for (int dropout = 0; dropout < 2; ++dropout)
                        for (int mask = MASK_NONE; mask <= MASK_LOCAL_GLOBAL; ++mask) {
                            const fa_io_algorithm alg = algorithms[a];
                            if (alg == FA_IO_STANDARD && (dropout || mask != MASK_NONE)) continue;
                            if (alg == FA_IO_FLASH && mask != MASK_NONE) continue;
                            fa_io_problem p;
                            fa_io_problem_init(&p);
                            p.algorithm = alg;
                            p.seqlen_q = lengths[n][0];
                            p.seqlen_k = lengths[n][1];
                            p.head_dim = dims[di];
                            p.sram_elements = srams[mi];
                            p.batch_heads = 2;
                            p.element_bytes = 2;
                            if (dropout) {
                                p.dropout_p = 0.25f;
                                p.dropout_seed = 1234;
                                p.dropout_offset = 5;
                            }
                            fa_block_mask bm;
                            uint8_t *storage = NULL;
                            if (mask != MASK_NONE) {
                                storage = make_mask((grid_mask)mask, p.seqlen_q, p.seqlen_k, 5, 7,
                                                    (uint32_t)(n * 4 + mi), &bm);
                                p.block_mask = &bm;
                            }
                            char what[160];
                            snprintf(what, sizeof what, "algorithm %d N %lld x %lld d %lld M %lld dropout %d mask %d",
                                     (int)alg, (long long)p.seqlen_q, (long long)p.seqlen_k, (long long)p.head_dim,
                                     (long long)p.sram_elements, dropout, mask);
                            check_problem(&p, what);
                            free(storage);
                            ++checked;
                        }
    assert_true(checked > 200);
}

/* Explicit tiles (Figure 2 middle varies Bc) and a mask whose blocks are the tiles. */
static void test_model_equals_run_explicit_tiles(void **state)
{
    (void)state;
    static const int64_t tiles[][2] = {{1, 1}, {3, 50}, {16, 64}, {64, 16}, {200, 200}};
    for (size_t t = 0; t < sizeof tiles / sizeof tiles[0]; ++t)
        for (int alg = FA_IO_FLASH; alg <= FA_IO_FLASH_QUERY_OUTER; ++alg) {
            fa_io_problem p;
            fa_io_problem_init(&p);
            p.algorithm = (fa_io_algorithm)alg;
            p.seqlen_q = 96;
            p.seqlen_k = 80;
            p.head_dim = 16;
            p.sram_elements = 1;
            p.block_rows = tiles[t][0];
            p.block_cols = tiles[t][1];
            fa_block_mask bm;
            uint8_t *storage = NULL;
            if (alg != FA_IO_FLASH) {
                storage = make_mask(MASK_RANDOM, p.seqlen_q, p.seqlen_k, (int32_t)p.block_rows, (int32_t)p.block_cols,
                                    (uint32_t)t, &bm);
                p.block_mask = &bm;
            }
            char what[96];
            snprintf(what, sizeof what, "algorithm %d tiles %lld x %lld", alg, (long long)p.block_rows,
                     (long long)p.block_cols);
            check_problem(&p, what);
            free(storage);
        }
}

/* With tiles dividing N, a density s = set / (Tr Tc) gives the same counts as any mask with that
 * many tiles set. */
static void test_density_equals_mask(void **state)
{
    (void)state;
    fa_io_problem p = square_problem(FA_IO_BLOCK_SPARSE, 256, 16, 1024); /* Bc = Br = 16: 16 x 16 tiles */
    p.batch_heads = 3;
    fa_block_mask bm;
    uint8_t *m = make_mask(MASK_RANDOM, 256, 256, 16, 16, 99, &bm);
    int64_t set = 0;
    for (int64_t x = 0; x < bm.rows * bm.cols; ++x) set += m[x] != 0;
    assert_true(set > 0 && set < bm.rows * bm.cols);
    for (int pass = FA_IO_FORWARD; pass <= FA_IO_BACKWARD; ++pass) {
        fa_io_counts with_mask, with_density;
        p.block_mask = &bm;
        p.block_density = 1.0;
        assert_int_equal(fa_io_estimate(&p, (fa_io_pass)pass, &with_mask), FA_SUCCESS);
        p.block_mask = NULL;
        p.block_density = (double)set / (double)(bm.rows * bm.cols);
        assert_int_equal(fa_io_estimate(&p, (fa_io_pass)pass, &with_density), FA_SUCCESS);
        assert_counts_equal(&with_mask, &with_density, "density vs mask");
    }
    free(m);
}

static int64_t total(const fa_io_problem *p, fa_io_pass pass)
{
    fa_io_counts c;
    assert_int_equal(fa_io_estimate(p, pass, &c), FA_SUCCESS);
    return c.total_reads + c.total_writes;
}

/* Theorem 2 / Theorem 5: flash accesses are Theta(N^2 d^2 / M), standard Theta(N d + N^2). */
static void test_theorem2_scaling(void **state)
{
    (void)state;
    fa_io_problem p = square_problem(FA_IO_FLASH, 4096, 64, 16384);
    for (int pass = FA_IO_FORWARD; pass <= FA_IO_BACKWARD; ++pass) {
        /* Doubling M (Bc 64 -> 128) halves the dominant term: the total drops by almost 2x. */
        p.sram_elements = 16384;
        const double small = (double)total(&p, (fa_io_pass)pass);
        p.sram_elements = 32768;
        const double large = (double)total(&p, (fa_io_pass)pass);
        assert_true(small / large > 1.9 && small / large < 2.0);
    }
    /* The constant in Theta(N^2 d^2 / M) stays in a narrow band over N, d and M with d^2 < M, once
     * the N^2 d^2 / M term dominates the Theta(N d) one (M <= N d / 8, at least 32 K/V tiles). */
    static const int64_t ns[] = {1024, 4096, 16384}, ds[] = {64, 128}, ms[] = {16384, 65536, 131072};
    for (size_t a = 0; a < 3; ++a)
        for (size_t b = 0; b < 2; ++b)
            for (size_t c = 0; c < 3; ++c) {
                const int64_t n = ns[a], d = ds[b], m = ms[c];
                if (8 * m > n * d || m <= d * d) continue;
                p.algorithm = FA_IO_FLASH;
                p.seqlen_q = p.seqlen_k = n;
                p.head_dim = d;
                p.sram_elements = m;
                const double bound = (double)n * n * d * d / (double)m;
                const double fwd = (double)total(&p, FA_IO_FORWARD) / bound;
                const double bwd = (double)total(&p, FA_IO_BACKWARD) / bound;
                if (!(fwd > 11.0 && fwd < 14.0 && bwd > 18.0 && bwd < 23.0))
                    fail_msg("N %lld d %lld M %lld: flash / (N^2 d^2 / M) = %g forward, %g backward", (long long)n,
                             (long long)d, (long long)m, fwd, bwd);
                p.algorithm = FA_IO_STANDARD;
                const double linear = (double)n * d + (double)n * n;
                const double sf = (double)total(&p, FA_IO_FORWARD) / linear;
                const double sb = (double)total(&p, FA_IO_BACKWARD) / linear;
                if (!(sf >= 3.0 && sf <= 4.0 && sb >= 7.0 && sb <= 8.0))
                    fail_msg("N %lld d %lld: standard / (N d + N^2) = %g forward, %g backward", (long long)n,
                             (long long)d, sf, sb);
            }
}

/* The paper's setting (N = 1024, d = 64, M = 100 KB of fp16): flash needs several times fewer
 * accesses than standard attention, within the "up to 9x" of Figure 2 left (40.3 GB vs 4.4 GB). */
static void test_flash_vs_standard_paper_setting(void **state)
{
    (void)state;
    fa_io_problem p = square_problem(FA_IO_FLASH, 1024, 64, 100 * 1024 / 2);
    p.element_bytes = 2;
    const double flash = (double)(total(&p, FA_IO_FORWARD) + total(&p, FA_IO_BACKWARD));
    p.algorithm = FA_IO_STANDARD;
    const double standard = (double)(total(&p, FA_IO_FORWARD) + total(&p, FA_IO_BACKWARD));
    const double ratio = standard / flash;
    if (!(ratio > 2.0 && ratio <= 40.3 / 4.4)) fail_msg("standard / flash = %g", ratio);
}

/* Proposition 4: block-sparse accesses are Theta(N d + N^2 d^2 s / M): the dominant term scales by s. */
static void test_proposition4_scaling(void **state)
{
    (void)state;
    fa_io_problem p = square_problem(FA_IO_BLOCK_SPARSE, 8192, 64, 32768);
    for (int pass = FA_IO_FORWARD; pass <= FA_IO_BACKWARD; ++pass) {
        p.block_density = 1.0;
        const double dense = (double)total(&p, (fa_io_pass)pass);
        static const double densities[] = {0.5, 0.25, 0.125};
        for (size_t x = 0; x < 3; ++x) {
            p.block_density = densities[x];
            const double ratio = (double)total(&p, (fa_io_pass)pass) / dense;
            if (!(ratio >= densities[x] && ratio < densities[x] + 0.05))
                fail_msg("pass %d density %g: traffic ratio %g", pass, densities[x], ratio);
            const double bound = 8192.0 * 64 + 8192.0 * 8192 * 64 * 64 * densities[x] / 32768;
            const double constant = (double)total(&p, (fa_io_pass)pass) / bound;
            assert_true(constant > 1.0 && constant < 24.0);
        }
    }
}

/* Every argument error names the argument. */
static void expect_invalid(const fa_io_problem *p, fa_io_pass pass, const char *argument)
{
    fa_io_counts c;
    assert_int_equal(fa_io_estimate(p, pass, &c), FA_ERROR_INVALID_VALUE);
    if (!strstr(fa_last_error(), argument)) fail_msg("error \"%s\" does not name %s", fa_last_error(), argument);
}

static void test_estimate_argument_errors(void **state)
{
    (void)state;
    const fa_io_problem base = square_problem(FA_IO_FLASH, 64, 16, 1024);
    fa_io_problem p;
    fa_io_counts c;
    assert_int_equal(fa_io_estimate(&base, FA_IO_FORWARD, &c), FA_SUCCESS);
    expect_invalid(NULL, FA_IO_FORWARD, "problem");
    assert_int_equal(fa_io_estimate(&base, FA_IO_FORWARD, NULL), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "counts"));
    expect_invalid(&base, (fa_io_pass)7, "pass");
#define WITH(field, value, name)                                                                                  \
    do {                                                                                                          \
        p = base;                                                                                                 \
        p.field = value;                                                                                          \
        expect_invalid(&p, FA_IO_FORWARD, name);                                                                  \
    } while (0)
    WITH(algorithm, (fa_io_algorithm)9, "algorithm");
    WITH(seqlen_q, 0, "seqlen_q");
    WITH(seqlen_k, -3, "seqlen_k");
    WITH(head_dim, 0, "head_dim");
    WITH(batch_heads, 0, "batch_heads");
    WITH(sram_elements, 0, "sram_elements");
    WITH(element_bytes, 0, "element_bytes");
    WITH(block_rows, 16, "block_rows");
    WITH(block_cols, -1, "block_cols");
    WITH(block_density, 0.0, "block_density");
    WITH(block_density, 1.5, "block_density");
    WITH(block_density, NAN, "block_density");
    WITH(dropout_p, 1.0f, "dropout_p");
    WITH(softmax_scale, -1.0f, "softmax_scale");
    p = base; /* N^2 d overflows 64 bits */
    p.seqlen_q = p.seqlen_k = INT64_C(1) << 40;
    expect_invalid(&p, FA_IO_FORWARD, "overflow");
    p = base; /* a density with a dense algorithm */
    p.block_density = 0.5;
    expect_invalid(&p, FA_IO_FORWARD, "block_density");
    p = base;
    p.algorithm = FA_IO_STANDARD;
    p.dropout_p = 0.1f;
    expect_invalid(&p, FA_IO_FORWARD, "dropout_p");
    p = base;
    p.algorithm = FA_IO_FLASH_QUERY_OUTER;
    expect_invalid(&p, FA_IO_BACKWARD, "pass");
    /* Masks: NULL array, bad block sizes, wrong grid, on a dense algorithm. */
    uint8_t bits[16] = {1};
    fa_block_mask bm = {16, 16, 4, 4, bits};
    p = base;
    p.algorithm = FA_IO_BLOCK_SPARSE;
    p.block_mask = &bm;
    assert_int_equal(fa_io_estimate(&p, FA_IO_FORWARD, &c), FA_SUCCESS);
    bm.rows = 3;
    expect_invalid(&p, FA_IO_FORWARD, "block_mask");
    bm.rows = 4;
    bm.block_q = 0;
    expect_invalid(&p, FA_IO_FORWARD, "block_mask");
    bm.block_q = 16;
    bm.mask = NULL;
    expect_invalid(&p, FA_IO_FORWARD, "block_mask");
    bm.mask = bits;
    p.algorithm = FA_IO_FLASH;
    expect_invalid(&p, FA_IO_FORWARD, "block_mask");
#undef WITH
}

static void test_simulate_argument_errors(void **state)
{
    (void)state;
    fa_io_problem p = square_problem(FA_IO_FLASH, 8, 4, 64);
    float a[32] = {0}, b[32] = {0}, o[32], lse[8], g1[32], g2[32], g3[32];
    fa_io_counts fc, bc;
    assert_int_equal(fa_io_simulate(&p, a, a, a, o, lse, &fc, b, g1, g2, g3, &bc), FA_SUCCESS);
    assert_int_equal(fa_io_simulate(&p, NULL, a, a, o, lse, &fc, NULL, NULL, NULL, NULL, NULL), FA_ERROR_INVALID_VALUE);
    assert_int_equal(strncmp(fa_last_error(), "q:", 2), 0);
    assert_int_equal(fa_io_simulate(&p, a, a, a, NULL, lse, &fc, NULL, NULL, NULL, NULL, NULL), FA_ERROR_INVALID_VALUE);
    assert_int_equal(strncmp(fa_last_error(), "out:", 4), 0);
    assert_int_equal(fa_io_simulate(&p, a, a, a, o, lse, NULL, NULL, NULL, NULL, NULL, NULL), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "forward_counts"));
    assert_int_equal(fa_io_simulate(&p, a, a, a, o, lse, &fc, b, g1, NULL, g3, &bc), FA_ERROR_INVALID_VALUE);
    assert_int_equal(strncmp(fa_last_error(), "dk:", 3), 0);
    assert_int_equal(fa_io_simulate(&p, a, a, a, o, lse, &fc, b, g1, g2, g3, NULL), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "backward_counts"));
    p.algorithm = FA_IO_STANDARD;
    assert_int_equal(fa_io_simulate(&p, a, a, a, o, lse, &fc, NULL, NULL, NULL, NULL, NULL), FA_ERROR_INVALID_VALUE);
    assert_int_equal(strncmp(fa_last_error(), "lse:", 4), 0);
    p.algorithm = FA_IO_BLOCK_SPARSE;
    p.block_density = 0.5;
    assert_int_equal(fa_io_simulate(&p, a, a, a, o, lse, &fc, NULL, NULL, NULL, NULL, NULL), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "block_mask"));
    p.block_density = 1.0;
    p.seqlen_q = p.seqlen_k = INT64_C(1) << 40; /* rejected before anything is allocated */
    assert_int_equal(fa_io_simulate(&p, a, a, a, o, lse, &fc, NULL, NULL, NULL, NULL, NULL), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "overflow"));
    p.seqlen_q = p.seqlen_k = 8;
    p.algorithm = FA_IO_FLASH_QUERY_OUTER;
    assert_int_equal(fa_io_simulate(&p, a, a, a, o, lse, &fc, b, g1, g2, g3, &bc), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "pass"));
}

/* The bias (issue 15): read once per computed tile like K and V. Hand counts for the dense flash
 * and standard algorithms, the model against the instrumented run (counts, on-chip peak, outputs
 * against the oracle with the bias) for every algorithm, broadcast over the pairs or not, and the
 * bytes at the bias's own element size; a caller built before the bias (a smaller struct_size)
 * gets its counts without bias_reads written. */
static void test_bias_reads(void **state)
{
    (void)state;
    enum { H = 2, NQ = 70, NK = 90, D = 16 };
    uint32_t seed = 99;
    float *data = random_array(H * NQ * NK, &seed);
    for (int broadcast = 0; broadcast <= 1; ++broadcast)
        for (int alg = FA_IO_STANDARD; alg <= FA_IO_FLASH_QUERY_OUTER; ++alg) {
            fa_io_problem p;
            fa_io_problem_init(&p);
            p.algorithm = (fa_io_algorithm)alg;
            p.seqlen_q = NQ;
            p.seqlen_k = NK;
            p.head_dim = D;
            p.batch_heads = H;
            p.sram_elements = 1;
            p.block_rows = 16;
            p.block_cols = 32;
            fa_bias bias = {data, FA_DTYPE_F32, 0, broadcast ? 0 : NQ * NK, NK};
            p.bias = &bias;
            fa_block_mask bm;
            uint8_t *storage = NULL;
            if (alg == FA_IO_BLOCK_SPARSE || alg == FA_IO_FLASH_QUERY_OUTER) {
                storage = make_mask(MASK_BUTTERFLY, NQ, NK, 16, 32, 5, &bm);
                p.block_mask = &bm;
            }
            char what[64];
            snprintf(what, sizeof what, "bias, algorithm %d, broadcast %d", alg, broadcast);
            check_problem(&p, what);
            fa_io_counts f, b;
            assert_int_equal(fa_io_estimate(&p, FA_IO_FORWARD, &f), FA_SUCCESS);
            if (alg == FA_IO_FLASH || alg == FA_IO_STANDARD) { /* by hand: every score's bias once per pass */
                assert_int_equal(f.bias_reads, H * NQ * NK);
                assert_int_equal(fa_io_estimate(&p, FA_IO_BACKWARD, &b), FA_SUCCESS);
                assert_int_equal(b.bias_reads, alg == FA_IO_FLASH ? H * NQ * NK : 0); /* standard: P is kept */
            }
            /* f16: half the bias bytes, nothing else changes */
            bias.dtype = FA_DTYPE_F16;
            fa_io_counts f16;
            assert_int_equal(fa_io_estimate(&p, FA_IO_FORWARD, &f16), FA_SUCCESS);
            assert_int_equal(f16.total_reads, f.total_reads);
            assert_int_equal(f.bytes - f16.bytes, 2 * f.bias_reads);
            /* without the bias: the same counts less the bias reads */
            p.bias = NULL;
            fa_io_counts none;
            assert_int_equal(fa_io_estimate(&p, FA_IO_FORWARD, &none), FA_SUCCESS);
            assert_int_equal(none.bias_reads, 0);
            assert_int_equal(f.total_reads - none.total_reads, f.bias_reads);
            assert_int_equal(f.bytes - none.bytes, 4 * f.bias_reads);
            free(storage);
        }
    /* An older caller: its struct ends before bias, its counts before bias_reads. */
    fa_io_problem old = square_problem(FA_IO_FLASH, 64, 16, 4096);
    old.struct_size = offsetof(fa_io_problem, bias);
    fa_io_counts c;
    memset(&c, 0x5a, sizeof c);
    assert_int_equal(fa_io_estimate(&old, FA_IO_FORWARD, &c), FA_SUCCESS);
    int64_t sentinel;
    memset(&sentinel, 0x5a, sizeof sentinel);
    assert_true(c.bias_reads == sentinel);
    assert_true(c.total_reads > 0);
    /* Bad bias arguments. */
    fa_io_problem bad = square_problem(FA_IO_FLASH, 64, 16, 4096);
    fa_bias wrong = {data, FA_DTYPE_F32, 5, 0, 64};
    bad.bias = &wrong;
    expect_invalid(&bad, FA_IO_FORWARD, "stride_batch");
    wrong.stride_batch = 0;
    wrong.dtype = FA_DTYPE_BF16;
    fa_io_counts fc, bc;
    float *x = calloc(64 * 16, sizeof(float));
    assert_non_null(x);
    assert_int_equal(fa_io_simulate(&bad, x, x, x, x, NULL, &fc, NULL, NULL, NULL, NULL, &bc), FA_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(fa_last_error(), "bias"));
    free(x);
    free(data);
}

static void test_operand_names(void **state)
{
    (void)state;
    assert_string_equal(fa_io_operand_name(FA_IO_Q), "Q");
    assert_string_equal(fa_io_operand_name(FA_IO_DO), "dO");
    assert_string_equal(fa_io_operand_name(FA_IO_RNG), "rng");
    assert_string_equal(fa_io_operand_name(FA_IO_OPERAND_COUNT), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_equals_run_on_grid),
        cmocka_unit_test(test_model_equals_run_explicit_tiles),
        cmocka_unit_test(test_density_equals_mask),
        cmocka_unit_test(test_theorem2_scaling),
        cmocka_unit_test(test_flash_vs_standard_paper_setting),
        cmocka_unit_test(test_proposition4_scaling),
        cmocka_unit_test(test_estimate_argument_errors),
        cmocka_unit_test(test_simulate_argument_errors),
        cmocka_unit_test(test_bias_reads),
        cmocka_unit_test(test_operand_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

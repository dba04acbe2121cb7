/* Numerical extremes on the CPU backend, against the double-precision oracle where mathematics
 * gives a number: scores up to 1e4 in magnitude, f16 and bf16 values near their range limits,
 * NaN and Inf inputs (the propagation documented in docs/ROBUSTNESS.md), rows with no visible
 * key, seqlen 1 and head_dim 1, and offsets / dropout element indices beyond 32 bits. */
#define _DEFAULT_SOURCE /* MAP_NORESERVE */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "fixture.h"

static double *doubles(const fa_tensor *t)
{
    const size_t n = fixture_elements(t);
    double *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; ++i) x[i] = fixture_get(t, i);
    return x;
}

/* Max |got - want| over a tensor, relative to max(1, max |want|); NaN gives INFINITY. */
static double relative_error(const fa_tensor *got, const double *want)
{
    double err = 0.0, scale = 1.0;
    for (size_t i = 0; i < fixture_elements(got); ++i) scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    for (size_t i = 0; i < fixture_elements(got); ++i) {
        const double e = fabs(fixture_get(got, i) - want[i]);
        if (!(e <= err)) err = isnan(e) ? INFINITY : e;
    }
    return err / scale;
}

/* Runs forward and backward of f and checks every output against the oracle: outputs within
 * out_tol, gradients within grad_tol (relative to their largest magnitude), lse to 1e-6 relative. */
static void check_with_oracle(fixture *f, double out_tol, double grad_tol)
{
    const oracle_shape *s = &f->shape;
    assert_int_equal(fixture_forward(fixture_ctx, f), FA_SUCCESS);
    assert_int_equal(fixture_backward(fixture_ctx, f), FA_SUCCESS);
    double *q = doubles(&f->q), *k = doubles(&f->k), *v = doubles(&f->v), *dout = doubles(&f->dout);
    const size_t nq = fixture_elements(&f->q), nk = fixture_elements(&f->k);
    const size_t rows = (size_t)(s->batch * s->heads_q * s->seqlen_q);
    double *out = malloc(nq * sizeof *out), *lse = malloc(rows * sizeof *lse);
    double *dq = malloc(nq * sizeof *dq), *dk = malloc(nk * sizeof *dk), *dv = malloc(nk * sizeof *dv);
    oracle_forward(s, &f->desc, q, k, v, out, lse);
    oracle_backward(s, &f->desc, q, k, v, dout, dq, dk, dv);
    const double out_err = relative_error(&f->out, out);
    if (!(out_err <= out_tol)) fail_msg("out: relative error %g > %g", out_err, out_tol);
    for (size_t i = 0; i < rows; ++i) {
        if (isinf(lse[i])) assert_true(f->lse[i] == (float)lse[i]);
        else if (!(fabs(f->lse[i] - lse[i]) <= 1e-6 * fmax(1.0, fabs(lse[i]))))
            fail_msg("lse[%zu]: %g, oracle %g", i, (double)f->lse[i], lse[i]);
    }
    const double errs[3] = {relative_error(&f->dq, dq), relative_error(&f->dk, dk), relative_error(&f->dv, dv)};
    for (int g = 0; g < 3; ++g)
        if (!(errs[g] <= grad_tol)) fail_msg("%s: relative error %g > %g", g == 0 ? "dq" : g == 1 ? "dk" : "dv", errs[g], grad_tol);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
}

/* Scores up to 1e4: softmax is nearly one-hot; the f32 score rounding (2^-24 * 1e4 ~ 6e-4)
 * becomes the relative error of the weights, so the tolerance is 4 * 2^-24 * max|score|. */
static void large_scores(void **state)
{
    (void)state;
    const oracle_shape shape = {1, 2, 1, 24, 40, 8};
    fixture f;
    assert_true(fixture_init(&f, &shape, FA_DTYPE_F32, 11));
    double max_score = 0.0;
    for (int64_t i = 0; i < 24 * 2; ++i)
        for (int64_t j = 0; j < 40; ++j) {
            double dot = 0.0;
            for (int c = 0; c < 8; ++c) dot += fixture_get(&f.q, (size_t)(i * 8 + c)) * fixture_get(&f.k, (size_t)(j * 8 + c));
            max_score = fmax(max_score, fabs(dot));
        }
    f.desc.softmax_scale = (float)(1e4 / max_score); /* the largest score is exactly about 1e4 */
    const double tol = 4.0 * 0x1p-24 * 1e4;
    check_with_oracle(&f, tol, 8.0 * tol);
    f.desc.causal = 1;
    check_with_oracle(&f, tol, 8.0 * tol);
    fixture_free(&f);
}

/* f16 values near 65504 in v (out stays in range) and q, k whose products exceed f16's range:
 * products and sums happen in f32. Tolerance: f16 output rounding (2^-11) plus f32 effects. */
static void f16_near_range_limit(void **state)
{
    (void)state;
    const oracle_shape shape = {1, 2, 2, 16, 16, 16};
    fixture f;
    assert_true(fixture_init(&f, &shape, FA_DTYPE_F16, 12));
    for (size_t i = 0; i < fixture_elements(&f.v); ++i) fixture_set(&f.v, i, 65504.0f * fixture_get(&f.v, i));
    for (size_t i = 0; i < fixture_elements(&f.q); ++i) fixture_set(&f.q, i, 300.0f * fixture_get(&f.q, i));
    f.desc.softmax_scale = 1.0f / 90000.0f; /* q.k up to 16 * 300^2 = 1.4e6 (f16 max 65504) */
    check_with_oracle(&f, 0x1p-10, 0x1p-7);
    fixture_free(&f);
}

/* bf16 near its top (values 2^120): the f32 accumulators stay finite as long as the sum of |v|
 * over the visible keys stays below FLT_MAX (documented limit). */
static void bf16_near_range_limit(void **state)
{
    (void)state;
    const oracle_shape shape = {1, 1, 1, 8, 64, 8};
    fixture f;
    assert_true(fixture_init(&f, &shape, FA_DTYPE_BF16, 13));
    for (size_t i = 0; i < fixture_elements(&f.v); ++i) fixture_set(&f.v, i, 0x1p120f * fixture_get(&f.v, i));
    check_with_oracle(&f, 0x1p-7, 0x1p-6);
    /* The smallest normal values: gradients stay finite and accurate. */
    for (size_t i = 0; i < fixture_elements(&f.v); ++i) fixture_set(&f.v, i, 0x1p-120f * fixture_get(&f.v, i) * 0x1p-120f);
    check_with_oracle(&f, 0x1p-7, 0x1p-6);
    fixture_free(&f);
}

/* Rows with no visible key: zeros, lse = -inf, zero gradients, never NaN. */
static void all_masked_rows(void **state)
{
    (void)state;
    const oracle_shape shape = {2, 2, 1, 20, 6, 16};
    fixture f;
    assert_true(fixture_init(&f, &shape, FA_DTYPE_F32, 14));
    int32_t seqlens[2] = {0, 4}; /* batch 0 has no key at all */
    f.desc.seqlens_k = seqlens;
    f.desc.causal = 1; /* bottom-right: query i sees keys <= i - 14, so rows 0..13 see none */
    check_with_oracle(&f, 1e-5, 1e-4);
    for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 20; ++i) {
            assert_true(f.lse[(0 * 2 + h) * 20 + i] == -INFINITY); /* batch 0: every row */
            if (i < 14) assert_true(f.lse[(1 * 2 + h) * 20 + i] == -INFINITY);
            else assert_true(isfinite(f.lse[(1 * 2 + h) * 20 + i]));
        }
    for (size_t i = 0; i < fixture_elements(&f.out) / 2; ++i) { /* batch 0 */
        assert_true(fixture_get(&f.out, i) == 0.0f);
        assert_true(fixture_get(&f.dq, i) == 0.0f);
    }
    for (size_t i = 0; i < fixture_elements(&f.dk) / 2; ++i) {
        assert_true(fixture_get(&f.dk, i) == 0.0f);
        assert_true(fixture_get(&f.dv, i) == 0.0f);
    }
    fixture_free(&f);
}

static void tiny_shapes(void **state)
{
    (void)state;
    const oracle_shape shapes[] = {{1, 1, 1, 1, 1, 1}, {3, 2, 1, 1, 5, 1}, {1, 1, 1, 9, 1, 4}, {2, 3, 3, 1, 1, 2}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
        for (int causal = 0; causal < 2; ++causal) {
            fixture f;
            assert_true(fixture_init(&f, &shapes[i], FA_DTYPE_F32, 15 + i));
            f.desc.causal = causal;
            check_with_oracle(&f, 1e-6, 1e-5);
            fixture_free(&f);
        }
    }
}

/* +Inf in q row i: the row's scores are +-Inf, softmax has no defined value there; the
 * documented contract is that the row's lse is not finite and every other row is unaffected. */
static void inf_input(void **state)
{
    (void)state;
    const oracle_shape shape = {1, 1, 1, 6, 6, 4};
    fixture f, clean;
    assert_true(fixture_init(&f, &shape, FA_DTYPE_F32, 17));
    assert_true(fixture_init(&clean, &shape, FA_DTYPE_F32, 17));
    fixture_set(&f.q, 2 * 4, INFINITY);
    assert_int_equal(fixture_forward(fixture_ctx, &f), FA_SUCCESS);
    assert_int_equal(fixture_forward(fixture_ctx, &clean), FA_SUCCESS);
    for (int64_t i = 0; i < 6; ++i) {
        if (i == 2) {
            assert_false(isfinite(f.lse[i]));
            continue;
        }
        assert_true(f.lse[i] == clean.lse[i]);
        assert_memory_equal((float *)f.out.data + i * 4, (float *)clean.out.data + i * 4, 4 * sizeof(float));
    }
    fixture_free(&f);
    fixture_free(&clean);
}

/* Element offsets beyond 2^32: batch 1 of q, k, v, out starts 2^32 + 64 f16 elements (8 GiB)
 * after batch 0, in a sparse mapping. Results must equal those of the same data packed. */
static void offsets_beyond_32_bits(void **state)
{
    (void)state;
    const int64_t d = 8, n = 16, stride_batch = ((int64_t)1 << 32) + 64;
    const size_t bytes = (size_t)(stride_batch + n * d) * 2;
    void *maps[4];
    for (int t = 0; t < 4; ++t) {
        maps[t] = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (maps[t] == MAP_FAILED) {
            for (int u = 0; u < t; ++u) munmap(maps[u], bytes);
            skip(); /* no 8 GiB of address space here (e.g. under valgrind) */
        }
    }
    const oracle_shape shape = {2, 1, 1, n, n, d};
    fixture packed;
    assert_true(fixture_init(&packed, &shape, FA_DTYPE_F16, 18));
    fa_tensor *packed_t[4] = {&packed.q, &packed.k, &packed.v, &packed.out};
    fa_tensor strided[4];
    for (int t = 0; t < 4; ++t) {
        strided[t] = *packed_t[t];
        strided[t].data = maps[t];
        strided[t].stride_batch = stride_batch, strided[t].stride_seq = d, strided[t].stride_head = d;
        for (int64_t b = 0; b < 2; ++b)
            memcpy((uint16_t *)maps[t] + b * stride_batch, (uint16_t *)packed_t[t]->data + b * n * d, (size_t)(n * d) * 2);
    }
    assert_int_equal(fixture_forward(fixture_ctx, &packed), FA_SUCCESS);
    float lse[2 * 16];
    assert_int_equal(fa_forward(fixture_ctx, &packed.desc, &strided[0], &strided[1], &strided[2], &strided[3], lse), FA_SUCCESS);
    for (int64_t b = 0; b < 2; ++b)
        assert_memory_equal((uint16_t *)maps[3] + b * stride_batch, (uint16_t *)packed.out.data + b * n * d, (size_t)(n * d) * 2);
    assert_memory_equal(lse, packed.lse, sizeof lse);
    for (int t = 0; t < 4; ++t) munmap(maps[t], bytes);
    fixture_free(&packed);
}

/* Dropout element indices beyond 2^32: 3 queries over 2^31 + 5 keys (k and v in sparse
 * mappings), each query seeing one key (window 0, 0; bottom-right: query i sees key
 * i + seqlen_k - 3), so element (i, j) has index i * seqlen_k + j > 2^32 for i >= 1 and only
 * one key tile per row is ever loaded. out[i] = v[j] / (1 - p) when kept, 0 when dropped; the
 * keep decision comes from the oracle's independent Philox. */
static void dropout_index_beyond_32_bits(void **state)
{
    (void)state;
    const int64_t nq = 3, nk = ((int64_t)1 << 31) + 5;
    const size_t bytes = (size_t)nk * sizeof(float);
    float *kv[2];
    for (int t = 0; t < 2; ++t) {
        kv[t] = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (kv[t] == MAP_FAILED) {
            if (t) munmap(kv[0], bytes);
            skip(); /* no 8 GiB of address space here (e.g. under valgrind) */
        }
    }
    float q[3] = {0.5f, -1.0f, 2.0f}, out[3], lse[3];
    for (int64_t j = nk - 8; j < nk; ++j) kv[0][j] = 0.25f, kv[1][j] = (float)(1 + (j & 7));
    const fa_tensor tq = {q, FA_DTYPE_F32, 1, nq, 1, 1, 0, 0, 0}, tk = {kv[0], FA_DTYPE_F32, 1, nk, 1, 1, 0, 0, 0};
    const fa_tensor tv = {kv[1], FA_DTYPE_F32, 1, nk, 1, 1, 0, 0, 0};
    fa_tensor to = {out, FA_DTYPE_F32, 1, nq, 1, 1, 0, 0, 0};
    const oracle_shape shape = {1, 1, 1, nq, nk, 1};
    int kept = 0;
    for (uint64_t seed = 1; seed <= 8; ++seed) {
        fa_attention_desc desc;
        fa_attention_desc_init(&desc);
        desc.window_left = desc.window_right = 0;
        desc.dropout_p = 0.5f;
        desc.dropout_seed = seed * 0x9e3779b97f4a7c15ull;
        assert_int_equal(fa_forward(fixture_ctx, &desc, &tq, &tk, &tv, &to, lse), FA_SUCCESS);
        for (int64_t i = 0; i < nq; ++i) {
            const int64_t j = i + nk - nq;
            const int keep = oracle_dropout_keep(&shape, &desc, 0, 0, i, j);
            const float want = keep ? kv[1][j] * 2.0f : 0.0f;
            if (out[i] != want) fail_msg("seed %d row %lld: %g, expected %g", (int)seed, (long long)i, (double)out[i], (double)want);
            kept += keep;
        }
    }
    assert_true(kept > 0 && kept < 24); /* both outcomes occurred: the check above could fail */
    munmap(kv[0], bytes);
    munmap(kv[1], bytes);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* run one test by name */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(large_scores),
        cmocka_unit_test(f16_near_range_limit),
        cmocka_unit_test(bf16_near_range_limit),
        cmocka_unit_test(all_masked_rows),
        cmocka_unit_test(tiny_shapes),
        cmocka_unit_test(inf_input),
        cmocka_unit_test(offsets_beyond_32_bits),
        cmocka_unit_test(dropout_index_beyond_32_bits),
    };
    return cmocka_run_group_tests(tests, fixture_context_setup, fixture_context_teardown);
}

/* Determinism on the CPU backend: fa_forward and fa_backward give bit-identical out, lse, dq,
 * dk and dv on repeated runs and at every thread count (docs/ROBUSTNESS.md states the
 * guarantee). Each case is run at 1 thread first; every other run must match it exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

typedef struct determinism_case {
    const char *name;
    oracle_shape shape;
    fa_dtype dtype;
    int causal, padding;
    int32_t window_left, window_right;
    float dropout_p;
    int slow; /* skipped in quick runs (sanitizers, valgrind): the normal run covers it */
} determinism_case;

static const determinism_case cases[] = {
    {"dense f32", {2, 3, 3, 131, 97, 32}, FA_DTYPE_F32, 0, 0, -1, -1, 0.0f, 0},
    {"causal gqa dropout f32", {2, 6, 2, 150, 150, 40}, FA_DTYPE_F32, 1, 0, -1, -1, 0.3f, 0},
    {"padding window bf16", {3, 4, 1, 90, 170, 16}, FA_DTYPE_BF16, 0, 1, 20, 5, 0.0f, 0},
    {"causal seqlen_q > seqlen_k f16", {1, 4, 4, 200, 60, 64}, FA_DTYPE_F16, 1, 0, -1, -1, 0.1f, 0},
    {"head_dim 1", {2, 2, 1, 77, 77, 1}, FA_DTYPE_F32, 0, 0, -1, -1, 0.0f, 0},
    /* Enough query tiles that the forward groups a different number of them per task at 1, 2
     * and 3+ threads, and a window wide enough that a group's keys span two key tiles (the
     * grouping follows the thread count, the arithmetic must not). */
    {"query grouping causal window f32", {1, 1, 1, 1536, 1536, 64}, FA_DTYPE_F32, 1, 0, 900, -1, 0.0f, 1},
};

static int quick(void) { return getenv("FA_TEST_QUICK") && getenv("FA_TEST_QUICK")[0] == '1'; }

static void init_case(const determinism_case *c, fixture *f, int32_t *seqlens)
{
    assert_true(fixture_init(f, &c->shape, c->dtype, 42));
    f->desc.causal = c->causal;
    f->desc.window_left = c->window_left;
    f->desc.window_right = c->window_right;
    f->desc.dropout_p = c->dropout_p;
    f->desc.dropout_seed = 1234;
    f->desc.dropout_offset = 99;
    if (c->padding) {
        for (int64_t b = 0; b < c->shape.batch; ++b) seqlens[b] = (int32_t)(c->shape.seqlen_k * (b + 1) / (c->shape.batch + 1));
        f->desc.seqlens_k = seqlens;
    }
}

static void check_case(const determinism_case *c)
{
    if (c->slow && quick()) skip();
    static const int thread_counts[] = {1, 2, 3, 4, 7, 16};
    const size_t counts = quick() ? 3 : sizeof thread_counts / sizeof thread_counts[0];
    int32_t seqlens_want[8], seqlens_got[8];
    fixture want, got;
    init_case(c, &want, seqlens_want);
    init_case(c, &got, seqlens_got);
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_int_equal(fa_context_set_num_threads(ctx, 1), FA_SUCCESS);
    assert_int_equal(fixture_forward(ctx, &want), FA_SUCCESS);
    assert_int_equal(fixture_backward(ctx, &want), FA_SUCCESS);
    for (size_t t = 0; t < counts; ++t) {
        for (int repeat = 0; repeat < 2; ++repeat) {
            fixture_poison_forward(&got);
            fixture_poison_gradients(&got);
            assert_int_equal(fa_context_set_num_threads(ctx, thread_counts[t]), FA_SUCCESS);
            assert_int_equal(fixture_forward(ctx, &got), FA_SUCCESS);
            assert_int_equal(fixture_backward(ctx, &got), FA_SUCCESS);
            if (!fixture_forward_identical(&got, &want))
                fail_msg("%s: forward at %d threads differs from 1 thread", c->name, thread_counts[t]);
            if (!fixture_gradients_identical(&got, &want))
                fail_msg("%s: backward at %d threads differs from 1 thread", c->name, thread_counts[t]);
        }
    }
    fa_context_destroy(ctx);
    fixture_free(&want);
    fixture_free(&got);
}

static void run_case(void **state) { check_case(*state); }

/* The forward's small-problem rule picks the query tile height from the shape (fewer heads:
 * shorter tiles, so that every thread gets one), which must not change any row's result: batch
 * 0 of an 8-batch problem (tall tiles) holds the same data as a 1-batch problem (short tiles),
 * and its out and lse must be bit-identical, dense and causal with a window. */
static void test_small_problem_rows(void **state)
{
    (void)state;
    const oracle_shape one = {1, 1, 1, 200, 200, 64}, eight = {8, 1, 1, 200, 200, 64};
    for (int causal = 0; causal < 2; ++causal) {
        fixture a, b;
        assert_true(fixture_init(&a, &one, FA_DTYPE_F32, 7));
        assert_true(fixture_init(&b, &eight, FA_DTYPE_F32, 8));
        memcpy(b.q.data, a.q.data, fixture_q_bytes(&a)); /* batch 0 is the first block (packed) */
        memcpy(b.k.data, a.k.data, fixture_k_bytes(&a));
        memcpy(b.v.data, a.v.data, fixture_k_bytes(&a));
        a.desc.causal = b.desc.causal = causal;
        a.desc.window_left = b.desc.window_left = causal ? 50 : -1;
        fa_context *ctx;
        assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
        assert_int_equal(fa_context_set_num_threads(ctx, 2), FA_SUCCESS);
        assert_int_equal(fixture_forward(ctx, &a), FA_SUCCESS);
        assert_int_equal(fixture_forward(ctx, &b), FA_SUCCESS);
        if (memcmp(a.out.data, b.out.data, fixture_q_bytes(&a)) || memcmp(a.lse, b.lse, fixture_lse_bytes(&a)))
            fail_msg("small-problem rows (%s): batch 0 of 8 differs from the same problem alone", causal ? "causal" : "dense");
        fa_context_destroy(ctx);
        fixture_free(&a);
        fixture_free(&b);
    }
}

/* Every score modifier with its gradients: dsinks sums over batches and rows, the [heads_q,
 * seqlen_q, seqlen_k] dbias over batches (causal, GQA, dropout, two-pass backward). */
static void test_score_modifiers(void **state)
{
    (void)state;
    enum { B = 3, HQ = 4, SQ = 150, SK = 170, BIAS = HQ * SQ * SK };
    const oracle_shape shape = {B, HQ, 2, SQ, SK, 32};
    static float bias[BIAS], dbias_want[BIAS], dbias_got[BIAS];
    float sinks[HQ], slopes[HQ], dsinks_want[HQ], dsinks_got[HQ];
    for (int x = 0; x < BIAS; ++x) bias[x] = (float)((x * 37) % 101) / 50.0f - 1.0f;
    for (int h = 0; h < HQ; ++h) {
        sinks[h] = 0.25f * (float)h - 0.5f;
        slopes[h] = 1.0f / (float)(4 << h);
    }
    fixture want, got;
    assert_true(fixture_init(&want, &shape, FA_DTYPE_BF16, 7));
    assert_true(fixture_init(&got, &shape, FA_DTYPE_BF16, 7));
    fa_bias b = {bias, FA_DTYPE_F32, 0, SQ * SK, SK}, db_want = b, db_got = b;
    db_want.data = dbias_want;
    db_got.data = dbias_got;
    fixture *runs[2] = {&want, &got};
    for (int r = 0; r < 2; ++r) {
        runs[r]->desc.causal = 1;
        runs[r]->desc.dropout_p = 0.2f;
        runs[r]->desc.softcap = 3.0f;
        runs[r]->desc.alibi_slopes = slopes;
        runs[r]->desc.sinks = sinks;
        runs[r]->desc.bias = &b;
    }
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    static const int thread_counts[] = {1, 2, 3, 7};
    for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; ++t) {
        fixture *f = t ? &got : &want;
        assert_int_equal(fa_context_set_num_threads(ctx, thread_counts[t]), FA_SUCCESS);
        fixture_poison_forward(f);
        fixture_poison_gradients(f);
        assert_int_equal(fixture_forward(ctx, f), FA_SUCCESS);
        assert_int_equal(fa_backward_ex(ctx, &f->desc, &f->q, &f->k, &f->v, &f->out, &f->dout, f->lse, &f->dq,
                                        &f->dk, &f->dv, t ? dsinks_got : dsinks_want, t ? &db_got : &db_want),
                         FA_SUCCESS);
        if (!t) continue;
        if (!fixture_forward_identical(&got, &want) || !fixture_gradients_identical(&got, &want) ||
            memcmp(dsinks_got, dsinks_want, sizeof dsinks_got) || memcmp(dbias_got, dbias_want, sizeof dbias_got))
            fail_msg("score modifiers: a result at %d threads differs from 1 thread", thread_counts[t]);
    }
    fa_context_destroy(ctx);
    fixture_free(&want);
    fixture_free(&got);
}

int main(void)
{
    struct CMUnitTest tests[sizeof cases / sizeof cases[0] + 2];
    size_t count = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        tests[count++] = (struct CMUnitTest){cases[i].name, run_case, NULL, NULL, (void *)&cases[i]};
    tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_small_problem_rows);
    tests[count++] = (struct CMUnitTest){"score modifiers", test_score_modifiers, NULL, NULL, NULL};
    return _cmocka_run_group_tests("determinism", tests, count, NULL, NULL);
}

/* The CPU backward's strategies (src/cpu/cpu_backward.c, backward_path_for): chained when
 * batch x heads_kv x key tiles >= 8 (one task per key tile, dQ updates chained in key order; an
 * f32 dQ in place, an f16/bf16 dQ in one f32 buffer of the whole dQ of at most 32 MiB), else per
 * pair for an f16/bf16 dQ whose whole f32 copy would be larger (batch x heads_kv >= 8: one task
 * per (batch, kv head), dQ in a per-thread f32 buffer), else two-pass. The shared case table
 * mostly has fewer pairs, so here: fused-shape cases against the oracle in every dtype, results
 * bit-identical for 1, 2 and 3 threads on every path, chained key tiles (8 pairs, and one pair
 * whose key tiles run as a pipeline; empty steps under a causal mask) for 1, 2, 3 and 8 threads
 * in f32 and bf16, the per-pair path (a dQ of 8.4M elements), and out-of-memory on every
 * allocation of the fused path reported as FA_ERROR_OUT_OF_MEMORY. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "../../src/common/alloc.h"
#include "../../src/common/half.h"
#include "harness.h"
#include "test_util.h"

/* Fields: name, {batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim}, scale, causal,
 * window_left, window_right, key_padding, dropout_p, seed, offset, block mask, block_q, block_k,
 * layout. All but the last have batch x heads_kv >= 8 (fused). */
static const fa_test_case cases[] = {
    {"fused_gqa_causal_dropout", {2, 8, 4, 70, 70, 64}, 0, 1, -1, -1, 0, 0.1f, 7, 3, BLOCK_MASK_NONE, 0, 0, LAYOUT_PACKED, 0},
    {"fused_window_pad_blocks", {4, 2, 2, 45, 61, 32}, 0, 0, 12, 4, 1, 0.0f, 0, 0, BLOCK_MASK_RANDOM, 3, 17, LAYOUT_BHSD, 0},
    {"fused_mqa_padded_layout", {8, 3, 1, 33, 50, 48}, 0.3f, 1, -1, -1, 0, 0.0f, 0, 0, BLOCK_MASK_NONE, 0, 0, LAYOUT_PADDED, 0},
    {"two_pass_gqa", {1, 4, 2, 90, 77, 40}, 0, 1, -1, -1, 0, 0.2f, 5, 1, BLOCK_MASK_NONE, 0, 0, LAYOUT_PACKED, 0},
};
enum { case_count = sizeof cases / sizeof cases[0] };

/* Forward and backward of c in dtype against the fp64 oracle. */
static void check_oracle(fa_context *ctx, const fa_test_case *c, fa_dtype dtype)
{
    char what[512], why[512];
    fa_case_describe(c, dtype, what, sizeof what);
    fa_case_errors errors;
    const fa_status st = fa_run_case(ctx, c, dtype, 1, &errors);
    if (st != FA_SUCCESS) fail_msg("%s: %s: %s", what, fa_status_string(st), fa_last_error());
    const int ok = fa_case_passes(&errors, dtype, 1, why, sizeof why);
    print_message("%s\n    %s\n", what, why);
    if (!ok) fail_msg("%s: error above tolerance: %s", what, why);
}

static void test_against_oracle(void **state)
{
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    static const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; ++i) check_oracle(ctx, *state, dtypes[i]);
    fa_context_destroy(ctx);
}

/* Packed tensors of one case in one dtype, inputs from a fixed seed. */
typedef struct problem {
    const fa_test_case *c;
    fa_dtype dtype;
    size_t q_bytes, kv_bytes, lse_bytes;
    void *q, *k, *v, *dout, *out, *dq, *dk, *dv;
    float *lse;
} problem;

static void *random_tensor(size_t count, fa_dtype dtype, uint32_t seed)
{
    const size_t es = test_dtype_size(dtype);
    unsigned char *x = malloc(count * es);
    assert_non_null(x);
    for (size_t i = 0; i < count; ++i) {
        seed = seed * 1664525u + 1013904223u;
        const float v = (float)(seed >> 8) * (2.0f / 16777216.0f) - 1.0f;
        if (dtype == FA_DTYPE_F32) {
            memcpy(x + 4 * i, &v, 4);
        } else {
            const uint16_t h = dtype == FA_DTYPE_F16 ? fa_f32_to_f16(v) : fa_f32_to_bf16(v);
            memcpy(x + 2 * i, &h, 2);
        }
    }
    return x;
}

static void problem_init(problem *pr, const fa_test_case *c, fa_dtype dtype)
{
    const oracle_shape *s = &c->shape;
    const size_t es = test_dtype_size(dtype);
    const size_t nq = (size_t)(s->batch * s->seqlen_q * s->heads_q * s->head_dim);
    const size_t nk = (size_t)(s->batch * s->seqlen_k * s->heads_kv * s->head_dim);
    pr->c = c;
    pr->dtype = dtype;
    pr->q_bytes = nq * es;
    pr->kv_bytes = nk * es;
    pr->lse_bytes = (size_t)(s->batch * s->heads_q * s->seqlen_q) * sizeof(float);
    pr->q = random_tensor(nq, dtype, 1);
    pr->k = random_tensor(nk, dtype, 2);
    pr->v = random_tensor(nk, dtype, 3);
    pr->dout = random_tensor(nq, dtype, 4);
    pr->out = calloc(nq, es);
    pr->dq = calloc(nq, es);
    pr->dk = calloc(nk, es);
    pr->dv = calloc(nk, es);
    pr->lse = calloc(pr->lse_bytes, 1);
    assert_true(pr->out && pr->dq && pr->dk && pr->dv && pr->lse);
}

static void problem_free(problem *pr)
{
    void *all[] = {pr->q, pr->k, pr->v, pr->dout, pr->out, pr->dq, pr->dk, pr->dv, pr->lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]);
}

/* Forward then backward with the case's masks (no block mask or padding needed here). */
static fa_status problem_run(problem *pr, fa_context *ctx)
{
    const oracle_shape *s = &pr->c->shape;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.softmax_scale = pr->c->softmax_scale;
    desc.causal = pr->c->causal;
    desc.window_left = pr->c->window_left;
    desc.window_right = pr->c->window_right;
    desc.dropout_p = pr->c->dropout_p;
    desc.dropout_seed = pr->c->dropout_seed;
    desc.dropout_offset = pr->c->dropout_offset;
    const fa_tensor tq = {pr->q, pr->dtype, s->batch, s->seqlen_q, s->heads_q, s->head_dim, 0, 0, 0};
    const fa_tensor tk = {pr->k, pr->dtype, s->batch, s->seqlen_k, s->heads_kv, s->head_dim, 0, 0, 0};
    fa_tensor tv = tk, to = tq, tdo = tq, tdq = tq, tdk = tk, tdv = tk;
    tv.data = pr->v; to.data = pr->out; tdo.data = pr->dout; tdq.data = pr->dq; tdk.data = pr->dk; tdv.data = pr->dv;
    const fa_status st = fa_forward(ctx, &desc, &tq, &tk, &tv, &to, pr->lse);
    if (st != FA_SUCCESS) return st;
    return fa_backward(ctx, &desc, &tq, &tk, &tv, &to, &tdo, pr->lse, &tdq, &tdk, &tdv);
}

/* Outputs of c in each dtype with each thread count of `threads` against one thread's, bit for bit. */
static void check_thread_counts(const fa_test_case *c, const fa_dtype *dtypes, size_t dtype_count, const int *threads_list,
                                size_t threads_count)
{
    for (size_t di = 0; di < dtype_count; ++di) {
        problem one, many;
        problem_init(&one, c, dtypes[di]);
        fa_context *ctx = NULL;
        assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
        assert_int_equal(fa_context_set_num_threads(ctx, 1), FA_SUCCESS);
        assert_int_equal(problem_run(&one, ctx), FA_SUCCESS);
        for (size_t ti = 0; ti < threads_count; ++ti) {
            const int threads = threads_list[ti];
            problem_init(&many, c, dtypes[di]);
            assert_int_equal(fa_context_set_num_threads(ctx, threads), FA_SUCCESS);
            assert_int_equal(problem_run(&many, ctx), FA_SUCCESS);
            const struct { const char *name; const void *a, *b; size_t bytes; } outputs[] = {
                {"out", one.out, many.out, one.q_bytes}, {"lse", one.lse, many.lse, one.lse_bytes},
                {"dq", one.dq, many.dq, one.q_bytes},    {"dk", one.dk, many.dk, one.kv_bytes},
                {"dv", one.dv, many.dv, one.kv_bytes},
            };
            for (size_t o = 0; o < sizeof outputs / sizeof outputs[0]; ++o)
                if (memcmp(outputs[o].a, outputs[o].b, outputs[o].bytes) != 0)
                    fail_msg("%s [%s]: %s differs between 1 and %d threads", c->name, fa_dtype_label(dtypes[di]),
                             outputs[o].name, threads);
            problem_free(&many);
        }
        fa_context_destroy(ctx);
        problem_free(&one);
    }
}

static void test_thread_counts_identical(void **state)
{
    static const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_BF16};
    static const int threads[] = {2, 3};
    check_thread_counts(*state, dtypes, 2, threads, 2);
}

/* Several key tiles per (batch, kv head) with an f32 dQ: one task per key tile, each adding to
 * dQ after the previous key tile's task (dq_chain). Causal with seqlen_q < seqlen_k, so the first
 * query tile sees no key of the last key tile (a step the chain passes on without a product).
 * Eight pairs (8 threads on a smaller machine make tasks of one pair wait for each other), and
 * one pair (GQA, two query heads) whose key tiles can only run as a pipeline, every task waiting
 * for the one before it at each step. */
static const fa_test_case chained_cases[] = {
    {"fused_chained_key_tiles", {1, 8, 8, 300, 1100, 128}, 0, 1, -1, -1, 0, 0.0f, 0, 0, BLOCK_MASK_NONE, 0, 0, LAYOUT_PACKED, 0},
    {"fused_chained_one_pair", {1, 2, 1, 260, 4200, 128}, 0.1f, 1, -1, -1, 0, 0.0f, 0, 0, BLOCK_MASK_NONE, 0, 0, LAYOUT_PACKED, 0},
};

static void test_chained_key_tiles(void **state)
{
    const fa_test_case *c = *state;
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    fa_tiling tiling;
    assert_int_equal(fa_context_tiling(ctx, c->shape.head_dim, FA_DTYPE_F32, &tiling, NULL), FA_SUCCESS);
    /* void with fewer than 3 key tiles, or fewer than 8 tasks (then the two-pass path runs) */
    const int64_t key_tiles = (c->shape.seqlen_k + tiling.block_cols - 1) / tiling.block_cols;
    if (key_tiles < 3 || c->shape.batch * c->shape.heads_kv * key_tiles < 8)
        fail_msg("%lld key tiles of %lld keys: not a chained case", (long long)key_tiles, (long long)tiling.block_cols);
    static const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_BF16}; /* dQ in place; in the whole f32 buffer */
    fa_test_case run = *c;
    if (fa_test_quick()) { /* valgrind: no fp64 oracle, 16 query rows (the key tiles, which chain, stay) */
        print_message("oracle skipped and seqlen_q 16 under FA_TEST_QUICK=1 (thread counts still compared)\n");
        run.shape.seqlen_q = 16;
    } else {
        for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; ++i) check_oracle(ctx, c, dtypes[i]);
    }
    fa_context_destroy(ctx);
    static const int threads[] = {2, 3, 8};
    check_thread_counts(&run, dtypes, 2, threads, 3);
}

/* The per-pair path: an f16/bf16 dQ whose f32 copy (8 x 8200 x 128 floats) exceeds the chained
 * path's 32 MiB, 8 (batch, kv head) pairs; two keys keep the products small. Not under
 * FA_TEST_QUICK=1 (its tensors are 34 MB each in f32). */
static const fa_test_case pairs_case = {"fused_pairs_large_dq", {1, 8, 8, 8200, 2, 128}, 0, 0, -1, -1, 0, 0.0f, 0, 0,
                                        BLOCK_MASK_NONE, 0, 0, LAYOUT_PACKED, 0};

static void test_pairs_path(void **state)
{
    (void)state;
    if (fa_test_quick()) {
        print_message("not run under FA_TEST_QUICK=1 (tensors of 34 MB)\n");
        return;
    }
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    check_oracle(ctx, &pairs_case, FA_DTYPE_BF16);
    fa_context_destroy(ctx);
    static const fa_dtype dtypes[] = {FA_DTYPE_BF16};
    static const int threads[] = {2, 3};
    check_thread_counts(&pairs_case, dtypes, 1, threads, 2);
}

/* Every allocation of a bf16 fused backward (scratch, D, the dQ buffer) failing in turn gives
 * FA_ERROR_OUT_OF_MEMORY and a message, never a crash; then the call succeeds. */
static void test_out_of_memory(void **state)
{
    (void)state;
    problem pr;
    problem_init(&pr, &cases[0], FA_DTYPE_BF16);
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_int_equal(fa_context_set_num_threads(ctx, 2), FA_SUCCESS);
    assert_int_equal(problem_run(&pr, ctx), FA_SUCCESS);
    fa_debug_fail_allocation(0);
    assert_int_equal(problem_run(&pr, ctx), FA_SUCCESS);
    const size_t allocations = fa_debug_fail_allocation(0);
    assert_true(allocations >= 4); /* forward tiles, D, backward tiles, dQ buffer */
    for (size_t k = 1; k <= allocations; ++k) {
        fa_debug_fail_allocation(k);
        const fa_status st = problem_run(&pr, ctx);
        fa_debug_fail_allocation(0);
        if (st != FA_ERROR_OUT_OF_MEMORY)
            fail_msg("allocation %zu of %zu failing: status %s, want out of memory", k, allocations,
                     fa_status_string(st));
        assert_non_null(strstr(fa_last_error(), "allocate"));
    }
    fa_context_destroy(ctx);
    problem_free(&pr);
}

int main(void)
{
    struct CMUnitTest tests[2 * case_count + 4];
    size_t n = 0;
    for (size_t i = 0; i < case_count; ++i)
        tests[n++] = (struct CMUnitTest){cases[i].name, test_against_oracle, NULL, NULL, (void *)&cases[i]};
    for (size_t i = 0; i < case_count; ++i)
        tests[n++] = (struct CMUnitTest){"threads 1/2/3 bit-identical", test_thread_counts_identical, NULL, NULL,
                                         (void *)&cases[i]};
    for (size_t i = 0; i < sizeof chained_cases / sizeof chained_cases[0]; ++i)
        tests[n++] = (struct CMUnitTest){chained_cases[i].name, test_chained_key_tiles, NULL, NULL,
                                         (void *)&chained_cases[i]};
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_pairs_path);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_out_of_memory);
    return _cmocka_run_group_tests("cpu_backward_paths", tests, n, NULL, NULL);
}

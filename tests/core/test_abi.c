/* The ABI policy (README "ABI policy"): a client built against an older header passes a smaller
 * desc (struct_size = its sizeof) and still runs, with the newer fields at their defaults; the
 * library never reads past struct_size. The older layout is a copy of fa_attention_desc as it
 * was before `varlen` was added, held in a heap block of exactly its size, so an over-read is an
 * ASan error. Larger structs (a newer client) pass when the unknown tail is zero. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flashattn.h"
#include "flashattn_io.h"

/* fa_attention_desc of the first sized layout (0.2 without varlen), copied field for field. */
typedef struct old_attention_desc {
    size_t struct_size;
    float softmax_scale;
    int causal;
    int32_t window_left, window_right;
    const int32_t *seqlens_k;
    float dropout_p;
    uint64_t dropout_seed, dropout_offset;
    const fa_block_mask *block_mask;
} old_attention_desc;

_Static_assert(sizeof(old_attention_desc) == offsetof(fa_attention_desc, varlen),
               "the old layout is the prefix of the new one");

enum { SEQ = 9, HEADS = 2, DIM = 8, N = SEQ * HEADS * DIM };

typedef struct problem {
    fa_context *ctx;
    float q[N], k[N], v[N], out[N], lse[HEADS * SEQ];
    fa_tensor tq, tk, tv, tout;
} problem;

static void problem_init(problem *p)
{
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &p->ctx), FA_SUCCESS);
    for (int i = 0; i < N; ++i) {
        p->q[i] = (float)((i * 37 % 17) - 8) / 8.0f;
        p->k[i] = (float)((i * 11 % 13) - 6) / 6.0f;
        p->v[i] = (float)((i * 7 % 19) - 9) / 9.0f;
    }
    p->tq = (fa_tensor){p->q, FA_DTYPE_F32, 1, SEQ, HEADS, DIM, 0, 0, 0};
    p->tk = (fa_tensor){p->k, FA_DTYPE_F32, 1, SEQ, HEADS, DIM, 0, 0, 0};
    p->tv = (fa_tensor){p->v, FA_DTYPE_F32, 1, SEQ, HEADS, DIM, 0, 0, 0};
    p->tout = (fa_tensor){p->out, FA_DTYPE_F32, 1, SEQ, HEADS, DIM, 0, 0, 0};
}

/* The current layout's run of a causal, window_left 3 desc: *now and its output. */
static void reference_run(problem *p, fa_attention_desc *now, float expected[N])
{
    problem_init(p);
    fa_attention_desc_init(now);
    now->causal = 1;
    now->window_left = 3;
    assert_int_equal(fa_forward(p->ctx, now, &p->tq, &p->tk, &p->tv, &p->tout, p->lse), FA_SUCCESS);
    memcpy(expected, p->out, N * sizeof *expected);
}

static void test_old_layout_runs_with_defaults(void **state)
{
    (void)state;
    static problem p;
    fa_attention_desc now;
    float expected[N];
    reference_run(&p, &now, expected);

    old_attention_desc *old = malloc(sizeof *old); /* exactly the old size: ASan sees any over-read */
    assert_non_null(old);
    *old = (old_attention_desc){sizeof *old, 0.0f, 1, 3, -1, NULL, 0.0f, 0, 0, NULL};
    memset(p.out, 0, sizeof p.out);
    assert_int_equal(fa_forward(p.ctx, (const fa_attention_desc *)old, &p.tq, &p.tk, &p.tv, &p.tout, p.lse),
                     FA_SUCCESS);
    assert_memory_equal(p.out, expected, sizeof expected);
    /* The old client's causal flag was read: a non-causal run differs. */
    old->causal = 0;
    assert_int_equal(fa_forward(p.ctx, (const fa_attention_desc *)old, &p.tq, &p.tk, &p.tv, &p.tout, p.lse),
                     FA_SUCCESS);
    assert_memory_not_equal(p.out, expected, sizeof expected);
    free(old);
    fa_context_destroy(p.ctx);
}

/* A newer client's struct: the library's fields plus a tail it does not know. */
typedef struct newer_desc {
    fa_attention_desc known;
    uint64_t future_field;
} newer_desc;

/* A 0.3 client (desc ending at bias) in a block of exactly that size: the 0.4 block positions
 * are never read and take their defaults (the run equals the current layout's). */
static void test_layout_0_3_runs_without_positions(void **state)
{
    (void)state;
    static problem p;
    fa_attention_desc now;
    float expected[N];
    reference_run(&p, &now, expected);
    const size_t size_0_3 = offsetof(fa_attention_desc, q_offset);
    unsigned char *old = malloc(size_0_3); /* ASan sees any read of the 0.4 fields */
    assert_non_null(old);
    memcpy(old, &now, size_0_3);
    memcpy(old, &size_0_3, sizeof size_0_3); /* struct_size comes first */
    memset(p.out, 0, sizeof p.out);
    assert_int_equal(fa_forward(p.ctx, (const fa_attention_desc *)old, &p.tq, &p.tk, &p.tv, &p.tout, p.lse),
                     FA_SUCCESS);
    assert_memory_equal(p.out, expected, sizeof expected);
    free(old);
    fa_context_destroy(p.ctx);
}

/* A 0.5 client (desc ending at kv_split_tokens) in a block of exactly that size on the KV-cache
 * path, which reads the 0.6 fields (kv_scales, rotary) of a current desc: never read from it, they
 * take their defaults (the run equals the current layout's). */
static void test_layout_0_5_runs_kvcache_without_new_fields(void **state)
{
    (void)state;
    static problem p;
    fa_attention_desc now;
    float expected[N];
    reference_run(&p, &now, expected);
    int32_t cached[1] = {SEQ};
    const fa_kv_cache cache = {p.tk, p.tv, NULL, 0, cached};
    assert_int_equal(fa_forward_kvcache(p.ctx, &now, &p.tq, &cache, NULL, NULL, &p.tout, p.lse), FA_SUCCESS);
    memcpy(expected, p.out, sizeof expected);
    const size_t size_0_5 = offsetof(fa_attention_desc, kv_scales);
    unsigned char *old = malloc(size_0_5); /* ASan sees any read of the 0.6 fields */
    assert_non_null(old);
    memcpy(old, &now, size_0_5);
    memcpy(old, &size_0_5, sizeof size_0_5);
    memset(p.out, 0, sizeof p.out);
    assert_int_equal(fa_forward_kvcache(p.ctx, (const fa_attention_desc *)old, &p.tq, &cache, NULL, NULL, &p.tout, p.lse),
                     FA_SUCCESS);
    assert_memory_equal(p.out, expected, sizeof expected);
    free(old);
    fa_context_destroy(p.ctx);
}

static void test_newer_layout(void **state)
{
    (void)state;
    static problem p;
    problem_init(&p);
    newer_desc d;
    memset(&d, 0, sizeof d);
    fa_attention_desc_init(&d.known);
    d.known.struct_size = sizeof d;
    assert_int_equal(fa_forward(p.ctx, &d.known, &p.tq, &p.tk, &p.tv, &p.tout, p.lse), FA_SUCCESS);
    d.future_field = 1; /* a feature this library cannot honour: refused, not ignored */
    memset(p.out, 0x7f, sizeof p.out);
    const unsigned char before = ((unsigned char *)p.out)[0];
    assert_int_equal(fa_forward(p.ctx, &d.known, &p.tq, &p.tk, &p.tv, &p.tout, p.lse), FA_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(fa_last_error(), "desc->struct_size"));
    assert_int_equal(((unsigned char *)p.out)[0], before);
    fa_context_destroy(p.ctx);
}

static void test_too_small(void **state)
{
    (void)state;
    static problem p;
    problem_init(&p);
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    assert_int_equal(d.struct_size, sizeof d);
    d.struct_size = 0;
    assert_int_equal(fa_forward(p.ctx, &d, &p.tq, &p.tk, &p.tv, &p.tout, p.lse), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "desc->struct_size"));
    d.struct_size = offsetof(fa_attention_desc, varlen) - 1;
    assert_int_equal(fa_forward(p.ctx, &d, &p.tq, &p.tk, &p.tv, &p.tout, p.lse), FA_ERROR_INVALID_VALUE);

    fa_io_problem io;
    fa_io_problem_init(&io);
    assert_int_equal(io.struct_size, sizeof io);
    io.seqlen_q = io.seqlen_k = 64;
    io.head_dim = 16;
    io.sram_elements = 4096;
    fa_io_counts counts;
    assert_int_equal(fa_io_estimate(&io, FA_IO_FORWARD, &counts), FA_SUCCESS);
    io.struct_size = 0;
    assert_int_equal(fa_io_estimate(&io, FA_IO_FORWARD, &counts), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "problem->struct_size"));
    fa_context_destroy(p.ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_old_layout_runs_with_defaults),
        cmocka_unit_test(test_layout_0_3_runs_without_positions),
        cmocka_unit_test(test_layout_0_5_runs_kvcache_without_new_fields),
        cmocka_unit_test(test_newer_layout),
        cmocka_unit_test(test_too_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

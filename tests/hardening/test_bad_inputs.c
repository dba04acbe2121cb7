/* Bad inputs: each case breaks one argument of an otherwise valid fa_forward / fa_backward call
 * and checks the documented status, a message naming the argument, and that no output was
 * written. Run with FA_BAD_INPUT_TABLE=1 to print the markdown table of docs/ROBUSTNESS.md
 * (case, status, message) from what the library actually returns. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

/* The arguments of one call; the mutation edits them before the call. */
typedef struct bad_call {
    fixture *f;
    fa_context *ctx;
    const fa_attention_desc *desc;
    fa_attention_desc desc_copy;
    fa_tensor q, k, v, out, dout, dq, dk, dv;
    const fa_tensor *pq, *pk, *pv, *pdout;
    fa_tensor *pout, *pdq, *pdk, *pdv;
    float *lse;
    int32_t seqlens[4];
    uint8_t block_bits[64];
    fa_block_mask block_mask;
} bad_call;

typedef struct bad_case {
    const char *name;
    int backward;
    fa_status expected;
    const char *message_prefix; /* the argument the message must name first */
    void (*mutate)(bad_call *c);
} bad_case;

#define MUTATION(fn, body) static void fn(bad_call *c) { body; }
MUTATION(null_ctx, c->ctx = NULL)
MUTATION(null_desc, c->desc = NULL)
MUTATION(struct_size_zero, c->desc_copy.struct_size = 0)
MUTATION(struct_size_small, c->desc_copy.struct_size = offsetof(fa_attention_desc, block_mask))
MUTATION(null_q, c->pq = NULL)
MUTATION(null_out, c->pout = NULL)
MUTATION(null_data, c->k.data = NULL)
MUTATION(misaligned_data, c->q.data = (char *)c->q.data + 1)
MUTATION(unknown_dtype, c->q.dtype = (fa_dtype)7)
MUTATION(zero_batch, c->q.batch = 0)
MUTATION(negative_seqlen, c->k.seqlen = -3)
MUTATION(zero_heads, c->v.heads = 0)
MUTATION(zero_head_dim, c->q.head_dim = 0)
MUTATION(mixed_strides, c->q.stride_batch = 64)
MUTATION(negative_stride, c->q.stride_batch = 64; c->q.stride_seq = -8; c->q.stride_head = 8)
MUTATION(batch_mismatch, c->k.batch = 3; c->v.batch = 3)
MUTATION(head_dim_mismatch, c->k.head_dim = 4; c->v.head_dim = 4)
MUTATION(v_shape_mismatch, c->v.seqlen = 5)
MUTATION(out_shape_mismatch, c->out.seqlen = 5)
MUTATION(dtype_mismatch, c->k.dtype = FA_DTYPE_F16)
MUTATION(heads_not_divisible, c->k.heads = 3; c->v.heads = 3)
MUTATION(scale_nan, c->desc_copy.softmax_scale = NAN)
MUTATION(scale_inf, c->desc_copy.softmax_scale = INFINITY)
MUTATION(window_below, c->desc_copy.window_left = -2)
MUTATION(window_right_below, c->desc_copy.window_right = -5)
MUTATION(dropout_one, c->desc_copy.dropout_p = 1.0f)
MUTATION(dropout_negative, c->desc_copy.dropout_p = -0.1f)
MUTATION(dropout_nan, c->desc_copy.dropout_p = NAN)
MUTATION(seqlens_too_long, c->seqlens[1] = (int32_t)c->k.seqlen + 1; c->desc_copy.seqlens_k = c->seqlens)
MUTATION(seqlens_negative, c->seqlens[0] = -1; c->desc_copy.seqlens_k = c->seqlens)
MUTATION(block_mask_null, c->block_mask.mask = NULL; c->desc_copy.block_mask = &c->block_mask)
MUTATION(block_mask_zero_block, c->block_mask.block_q = 0; c->desc_copy.block_mask = &c->block_mask)
MUTATION(block_mask_wrong_rows, c->block_mask.rows += 1; c->desc_copy.block_mask = &c->block_mask)
/* Sizes whose element count overflows 64 bits: rejected before any memory is touched. */
MUTATION(count_overflow, c->q.batch = (int64_t)1 << 40; c->q.seqlen = (int64_t)1 << 40)
MUTATION(stride_overflow, c->k.stride_batch = INT64_MAX / 2; c->k.stride_seq = 16; c->k.stride_head = 8)
MUTATION(byte_overflow, c->q.batch = 1; c->q.seqlen = (int64_t)1 << 61; c->q.heads = 1; c->q.head_dim = 2)
/* 2^32 x 2^32 keys with dropout: the 64-bit dropout element index would wrap. */
MUTATION(dropout_index_overflow, c->q.seqlen = c->out.seqlen = (int64_t)1 << 32; c->k.seqlen = c->v.seqlen = (int64_t)1 << 32;
         c->q.batch = c->k.batch = c->v.batch = c->out.batch = 2; c->desc_copy.dropout_p = 0.5f)
MUTATION(null_lse, c->lse = NULL)
MUTATION(null_dout, c->pdout = NULL)
MUTATION(dq_shape_mismatch, c->dq.seqlen = 5)
MUTATION(dk_shape_mismatch, c->dk.heads = 1)
MUTATION(dv_dtype_mismatch, c->dv.dtype = FA_DTYPE_BF16)
MUTATION(dout_dtype_mismatch, c->dout.dtype = FA_DTYPE_F16)

static const bad_case cases[] = {
    {"ctx NULL", 0, FA_ERROR_INVALID_VALUE, "ctx", null_ctx},
    {"desc NULL", 0, FA_ERROR_INVALID_VALUE, "desc", null_desc},
    {"desc->struct_size 0 (desc not initialised)", 0, FA_ERROR_INVALID_VALUE, "desc->struct_size", struct_size_zero},
    {"desc->struct_size below the smallest layout", 0, FA_ERROR_INVALID_VALUE, "desc->struct_size", struct_size_small},
    {"q NULL", 0, FA_ERROR_INVALID_VALUE, "q", null_q},
    {"out NULL", 0, FA_ERROR_INVALID_VALUE, "out", null_out},
    {"k->data NULL", 0, FA_ERROR_INVALID_VALUE, "k", null_data},
    {"q->data not aligned to its element size", 0, FA_ERROR_INVALID_VALUE, "q", misaligned_data},
    {"unknown dtype", 0, FA_ERROR_INVALID_VALUE, "q", unknown_dtype},
    {"batch 0", 0, FA_ERROR_INVALID_VALUE, "q", zero_batch},
    {"seqlen negative", 0, FA_ERROR_INVALID_VALUE, "k", negative_seqlen},
    {"heads 0", 0, FA_ERROR_INVALID_VALUE, "v", zero_heads},
    {"head_dim 0", 0, FA_ERROR_INVALID_VALUE, "q", zero_head_dim},
    {"strides partly 0", 0, FA_ERROR_INVALID_VALUE, "q", mixed_strides},
    {"stride negative", 0, FA_ERROR_INVALID_VALUE, "q", negative_stride},
    {"k batch differs from q", 0, FA_ERROR_INVALID_VALUE, "k", batch_mismatch},
    {"k head_dim differs from q", 0, FA_ERROR_INVALID_VALUE, "k", head_dim_mismatch},
    {"v shape differs from k", 0, FA_ERROR_INVALID_VALUE, "v", v_shape_mismatch},
    {"out shape differs from q", 0, FA_ERROR_INVALID_VALUE, "out", out_shape_mismatch},
    {"k dtype differs from q", 0, FA_ERROR_INVALID_VALUE, "k", dtype_mismatch},
    {"heads_kv does not divide heads_q", 0, FA_ERROR_INVALID_VALUE, "k", heads_not_divisible},
    {"softmax_scale NaN", 0, FA_ERROR_INVALID_VALUE, "desc->softmax_scale", scale_nan},
    {"softmax_scale Inf", 0, FA_ERROR_INVALID_VALUE, "desc->softmax_scale", scale_inf},
    {"window_left -2", 0, FA_ERROR_INVALID_VALUE, "desc->window_left", window_below},
    {"window_right -5", 0, FA_ERROR_INVALID_VALUE, "desc->window_right", window_right_below},
    {"dropout_p 1", 0, FA_ERROR_INVALID_VALUE, "desc->dropout_p", dropout_one},
    {"dropout_p negative", 0, FA_ERROR_INVALID_VALUE, "desc->dropout_p", dropout_negative},
    {"dropout_p NaN", 0, FA_ERROR_INVALID_VALUE, "desc->dropout_p", dropout_nan},
    {"seqlens_k[b] > seqlen_k", 0, FA_ERROR_INVALID_VALUE, "desc->seqlens_k", seqlens_too_long},
    {"seqlens_k[b] negative", 0, FA_ERROR_INVALID_VALUE, "desc->seqlens_k", seqlens_negative},
    {"block_mask->mask NULL", 0, FA_ERROR_INVALID_VALUE, "desc->block_mask", block_mask_null},
    {"block_mask block_q 0", 0, FA_ERROR_INVALID_VALUE, "desc->block_mask", block_mask_zero_block},
    {"block_mask rows wrong", 0, FA_ERROR_INVALID_VALUE, "desc->block_mask", block_mask_wrong_rows},
    {"element count > 2^63 (batch, seqlen 2^40)", 0, FA_ERROR_INVALID_VALUE, "q", count_overflow},
    {"largest offset > 2^63 (stride_batch 2^62)", 0, FA_ERROR_INVALID_VALUE, "k", stride_overflow},
    {"byte offset > 2^63 (2^62 f32 elements)", 0, FA_ERROR_INVALID_VALUE, "q", byte_overflow},
    {"dropout on > 2^63 attention elements", 0, FA_ERROR_INVALID_VALUE, "desc->dropout_p", dropout_index_overflow},
    {"backward: lse NULL", 1, FA_ERROR_INVALID_VALUE, "lse", null_lse},
    {"backward: dout NULL", 1, FA_ERROR_INVALID_VALUE, "dout", null_dout},
    {"backward: dq shape differs from q", 1, FA_ERROR_INVALID_VALUE, "dq", dq_shape_mismatch},
    {"backward: dk shape differs from k", 1, FA_ERROR_INVALID_VALUE, "dk", dk_shape_mismatch},
    {"backward: dv dtype differs", 1, FA_ERROR_INVALID_VALUE, "dv", dv_dtype_mismatch},
    {"backward: dout dtype differs", 1, FA_ERROR_INVALID_VALUE, "dout", dout_dtype_mismatch},
};

/* The other entry points: each call returns its status directly. */
typedef struct api_case {
    const char *name;
    fa_status expected;
    const char *message_prefix;
    fa_status (*call)(fa_context *ctx);
} api_case;

#define API_CALL(fn, body) static fa_status fn(fa_context *ctx) { (void)ctx; body; }
API_CALL(create_null_out, return fa_context_create(FA_BACKEND_CPU, 0, NULL))
API_CALL(create_unknown_backend, fa_context *c; return fa_context_create((fa_backend)9, 0, &c))
API_CALL(create_negative_device, fa_context *c; return fa_context_create(FA_BACKEND_CPU, -1, &c))
API_CALL(create_device_out_of_range, fa_context *c; return fa_context_create(FA_BACKEND_CPU, 1, &c))
API_CALL(threads_negative, return fa_context_set_num_threads(ctx, -1))
API_CALL(threads_null_ctx, return fa_context_set_num_threads(NULL, 1))
API_CALL(stream_on_cpu, return fa_context_set_stream(ctx, (void *)ctx))
API_CALL(malloc_zero, void *p; return fa_malloc(ctx, 0, &p))
API_CALL(malloc_null_out, return fa_malloc(ctx, 16, NULL))
API_CALL(copy_null_dst, char buf[4] = {0}; return fa_memcpy_h2d(ctx, NULL, buf, 4))
API_CALL(copy_null_src, char buf[4]; return fa_memcpy_d2h(ctx, buf, NULL, 4))
API_CALL(tiling_zero_head_dim, fa_tiling t; return fa_context_tiling(ctx, 0, FA_DTYPE_F32, &t, NULL))
API_CALL(tiling_bad_dtype, fa_tiling t; return fa_context_tiling(ctx, 64, (fa_dtype)5, &t, NULL))
API_CALL(dropout_mask_null, return fa_dropout_mask(1, 0, 0.5f, 1, 4, 4, 0, 0, NULL))
API_CALL(dropout_mask_head_out_of_range, uint8_t keep[16]; return fa_dropout_mask(1, 0, 0.5f, 2, 4, 4, 0, 2, keep))
API_CALL(dropout_mask_overflow, uint8_t keep[16]; return fa_dropout_mask(1, 0, 0.5f, 2, 4, 4, INT64_MAX / 4, 0, keep))
API_CALL(butterfly_null, return fa_block_mask_butterfly(4, 4, NULL))

static const api_case api_cases[] = {
    {"fa_context_create: ctx NULL", FA_ERROR_INVALID_VALUE, "ctx", create_null_out},
    {"fa_context_create: unknown backend 9", FA_ERROR_INVALID_VALUE, "backend", create_unknown_backend},
    {"fa_context_create: device -1", FA_ERROR_INVALID_VALUE, "device", create_negative_device},
    {"fa_context_create: CPU device 1", FA_ERROR_INVALID_VALUE, "device", create_device_out_of_range},
    {"fa_context_set_num_threads: -1", FA_ERROR_INVALID_VALUE, "n", threads_negative},
    {"fa_context_set_num_threads: ctx NULL", FA_ERROR_INVALID_VALUE, "ctx", threads_null_ctx},
    {"fa_context_set_stream: non-NULL stream on CPU", FA_ERROR_NOT_SUPPORTED, "stream", stream_on_cpu},
    {"fa_malloc: 0 bytes", FA_ERROR_INVALID_VALUE, "bytes", malloc_zero},
    {"fa_malloc: ptr NULL", FA_ERROR_INVALID_VALUE, "ptr", malloc_null_out},
    {"fa_memcpy_h2d: dst NULL", FA_ERROR_INVALID_VALUE, "dst", copy_null_dst},
    {"fa_memcpy_d2h: src NULL", FA_ERROR_INVALID_VALUE, "src", copy_null_src},
    {"fa_context_tiling: head_dim 0", FA_ERROR_INVALID_VALUE, "head_dim", tiling_zero_head_dim},
    {"fa_context_tiling: dtype 5", FA_ERROR_INVALID_VALUE, "dtype", tiling_bad_dtype},
    {"fa_dropout_mask: keep NULL", FA_ERROR_INVALID_VALUE, "keep", dropout_mask_null},
    {"fa_dropout_mask: head_index = heads_q", FA_ERROR_INVALID_VALUE, "head_index", dropout_mask_head_out_of_range},
    {"fa_dropout_mask: element index > 2^63", FA_ERROR_INVALID_VALUE, "batch_index", dropout_mask_overflow},
    {"fa_block_mask_butterfly: mask NULL", FA_ERROR_INVALID_VALUE, "mask", butterfly_null},
};

static fixture shared_fixture;
static fa_context *shared_ctx;

static int setup(void **state)
{
    (void)state;
    const oracle_shape shape = {2, 4, 2, 9, 11, 8};
    if (!fixture_init(&shared_fixture, &shape, FA_DTYPE_F32, 3)) return -1;
    return fa_context_create(FA_BACKEND_CPU, 0, &shared_ctx) == FA_SUCCESS ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    fa_context_destroy(shared_ctx);
    fixture_free(&shared_fixture);
    return 0;
}

static void init_call(bad_call *c, fixture *f)
{
    memset(c, 0, sizeof *c);
    c->f = f;
    c->ctx = shared_ctx;
    c->desc_copy = f->desc;
    c->desc = &c->desc_copy;
    c->q = f->q, c->k = f->k, c->v = f->v, c->out = f->out;
    c->dout = f->dout, c->dq = f->dq, c->dk = f->dk, c->dv = f->dv;
    c->pq = &c->q, c->pk = &c->k, c->pv = &c->v, c->pout = &c->out;
    c->pdout = &c->dout, c->pdq = &c->dq, c->pdk = &c->dk, c->pdv = &c->dv;
    c->lse = f->lse;
    for (int b = 0; b < 4; ++b) c->seqlens[b] = (int32_t)f->k.seqlen;
    c->block_mask = (fa_block_mask){4, 4, (f->q.seqlen + 3) / 4, (f->k.seqlen + 3) / 4, c->block_bits};
    memset(c->block_bits, 1, sizeof c->block_bits);
}

static fa_status call(bad_call *c, int backward)
{
    if (!backward) return fa_forward(c->ctx, c->desc, c->pq, c->pk, c->pv, c->pout, c->lse);
    return fa_backward(c->ctx, c->desc, c->pq, c->pk, c->pv, c->pout, c->pdout, c->lse, c->pdq, c->pdk, c->pdv);
}

static void run_case(void **state)
{
    const bad_case *bc = *state;
    fixture *f = &shared_fixture;
    bad_call c;
    if (bc->backward) { /* a valid forward first: backward's lse and out */
        init_call(&c, f);
        assert_int_equal(call(&c, 0), FA_SUCCESS);
    } else {
        fixture_poison_forward(f);
    }
    fixture_poison_gradients(f);
    init_call(&c, f);
    bc->mutate(&c);
    const fa_status st = call(&c, bc->backward);
    const char *message = fa_last_error();
    if (getenv("FA_BAD_INPUT_TABLE"))
        printf("| %s | %s | `%s` |\n", bc->name, fa_status_string(st), message);
    if (st != bc->expected) fail_msg("%s: status %d, expected %d (%s)", bc->name, (int)st, (int)bc->expected, message);
    if (strncmp(message, bc->message_prefix, strlen(bc->message_prefix)) != 0)
        fail_msg("%s: message '%s' does not start with '%s'", bc->name, message, bc->message_prefix);
    /* Nothing was written: every output word still holds the sentinel. */
    const fa_tensor *outputs[] = {&f->out, &f->dq, &f->dk, &f->dv};
    for (size_t t = bc->backward ? 1 : 0; t < 4; ++t) {
        const uint32_t *words = outputs[t]->data;
        for (size_t i = 0; i < fixture_elements(outputs[t]); ++i)
            if (words[i] != FIXTURE_SENTINEL) fail_msg("%s: output written despite the error", bc->name);
    }
    if (!bc->backward)
        for (size_t i = 0; i < fixture_lse_bytes(f) / 4; ++i)
            if (((const uint32_t *)f->lse)[i] != FIXTURE_SENTINEL) fail_msg("%s: lse written despite the error", bc->name);
}

static void run_api_case(void **state)
{
    const api_case *ac = *state;
    const fa_status st = ac->call(shared_ctx);
    const char *message = fa_last_error();
    if (getenv("FA_BAD_INPUT_TABLE")) printf("| %s | %s | `%s` |\n", ac->name, fa_status_string(st), message);
    if (st != ac->expected) fail_msg("%s: status %d, expected %d (%s)", ac->name, (int)st, (int)ac->expected, message);
    if (strncmp(message, ac->message_prefix, strlen(ac->message_prefix)) != 0)
        fail_msg("%s: message '%s' does not start with '%s'", ac->name, message, ac->message_prefix);
}

int main(void)
{
    enum { N = sizeof cases / sizeof cases[0], M = sizeof api_cases / sizeof api_cases[0] };
    struct CMUnitTest tests[N + M];
    for (size_t i = 0; i < N; ++i) tests[i] = (struct CMUnitTest){cases[i].name, run_case, NULL, NULL, (void *)&cases[i]};
    for (size_t i = 0; i < M; ++i)
        tests[N + i] = (struct CMUnitTest){api_cases[i].name, run_api_case, NULL, NULL, (void *)&api_cases[i]};
    return _cmocka_run_group_tests("bad inputs", tests, N + M, setup, teardown);
}

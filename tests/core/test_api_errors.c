/* Every bad argument of the public API returns its status with a one-line fa_last_error() that
 * names the argument, and leaves the outputs untouched (they hold a canary that must survive). */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "flashattn.h"

enum { BATCH = 2, HEADS_Q = 4, HEADS_KV = 2, SEQ_Q = 5, SEQ_K = 6, DIM = 8 };
#define CANARY 0xA5

/* Which tensor arguments are passed as NULL pointers. */
enum { NULL_Q = 1, NULL_K = 2, NULL_V = 4, NULL_OUT = 8, NULL_DOUT = 16, NULL_DQ = 32, NULL_DK = 64, NULL_DV = 128 };

typedef struct call {
    fa_context *ctx;
    fa_attention_desc desc;
    int null_desc; /* pass desc as NULL */
    fa_block_mask block_mask;
    int32_t seqlens[BATCH];
    fa_tensor q, k, v, out, dout, dq, dk, dv;
    float *lse;
    unsigned null_args;
    float *dsinks;        /* fa_backward_ex's extra outputs, NULL by default */
    const fa_bias *dbias;
} call;

typedef struct fixture {
    fa_context *ctx;
    void *inputs[4];  /* q, k, v, dout: zeros */
    void *outputs[4]; /* out, dq, dk, dv: canary */
    size_t output_bytes[4];
    float *lse;       /* forward output; backward input (canary in both: backward must not write it) */
    uint8_t mask[2 * 1];
    /* score modifiers: a full bias (zeros), its gradient (canary), sinks, slopes [BATCH, HEADS_Q] */
    float bias[BATCH * HEADS_Q * SEQ_Q * SEQ_K], dbias[BATCH * HEADS_Q * SEQ_Q * SEQ_K];
    float sinks[HEADS_Q], dsinks[HEADS_Q], slopes[BATCH * HEADS_Q];
    fa_bias bias_desc, dbias_desc;
    call base;
} fixture;

static fa_tensor tensor(void *data, int64_t seqlen, int64_t heads)
{
    fa_tensor t = {0};
    t.data = data;
    t.dtype = FA_DTYPE_F32;
    t.batch = BATCH;
    t.seqlen = seqlen;
    t.heads = heads;
    t.head_dim = DIM;
    return t;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (!f || fa_context_create(FA_BACKEND_CPU, 0, &f->ctx) != FA_SUCCESS) return -1;
    const size_t q_bytes = (size_t)BATCH * SEQ_Q * HEADS_Q * DIM * sizeof(float);
    const size_t kv_bytes = (size_t)BATCH * SEQ_K * HEADS_KV * DIM * sizeof(float);
    const size_t in_bytes[4] = {q_bytes, kv_bytes, kv_bytes, q_bytes};
    const size_t out_bytes[4] = {q_bytes, q_bytes, kv_bytes, kv_bytes};
    for (int i = 0; i < 4; ++i) {
        if (fa_malloc(f->ctx, in_bytes[i], &f->inputs[i]) || fa_malloc(f->ctx, out_bytes[i], &f->outputs[i]))
            return -1;
        memset(f->inputs[i], 0, in_bytes[i]); /* the CPU backend's memory is host memory */
        f->output_bytes[i] = out_bytes[i];
    }
    if (fa_malloc(f->ctx, (size_t)BATCH * HEADS_Q * SEQ_Q * sizeof(float), (void **)&f->lse)) return -1;
    call *c = &f->base;
    c->ctx = f->ctx;
    fa_attention_desc_init(&c->desc);
    c->q = tensor(f->inputs[0], SEQ_Q, HEADS_Q);
    c->k = tensor(f->inputs[1], SEQ_K, HEADS_KV);
    c->v = tensor(f->inputs[2], SEQ_K, HEADS_KV);
    c->dout = tensor(f->inputs[3], SEQ_Q, HEADS_Q);
    c->out = tensor(f->outputs[0], SEQ_Q, HEADS_Q);
    c->dq = tensor(f->outputs[1], SEQ_Q, HEADS_Q);
    c->dk = tensor(f->outputs[2], SEQ_K, HEADS_KV);
    c->dv = tensor(f->outputs[3], SEQ_K, HEADS_KV);
    c->lse = f->lse;
    /* a valid 2 x 1 block mask for block sizes 3 x 8 */
    f->mask[0] = f->mask[1] = 1;
    c->block_mask = (fa_block_mask){3, 8, 2, 1, f->mask};
    c->seqlens[0] = SEQ_K;
    c->seqlens[1] = 1;
    f->bias_desc = (fa_bias){f->bias, FA_DTYPE_F32, HEADS_Q * SEQ_Q * SEQ_K, SEQ_Q * SEQ_K, SEQ_K};
    f->dbias_desc = f->bias_desc;
    f->dbias_desc.data = f->dbias;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    for (int i = 0; i < 4; ++i) {
        fa_free(f->ctx, f->inputs[i]);
        fa_free(f->ctx, f->outputs[i]);
    }
    fa_free(f->ctx, f->lse);
    fa_context_destroy(f->ctx);
    free(f);
    return 0;
}

/* A copy of the valid call (dense, no padding: tests that need the block mask or seqlens point
 * desc at the copy's own), with the outputs reset to the canary. */
static call fresh(fixture *f)
{
    for (int i = 0; i < 4; ++i) memset(f->outputs[i], CANARY, f->output_bytes[i]);
    memset(f->lse, CANARY, (size_t)BATCH * HEADS_Q * SEQ_Q * sizeof(float));
    memset(f->dbias, CANARY, sizeof f->dbias);
    memset(f->dsinks, CANARY, sizeof f->dsinks);
    return f->base;
}

static int canary_intact(const void *p, size_t bytes)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < bytes; ++i)
        if (b[i] != CANARY) return 0;
    return 1;
}

/* Leaves a known, different message behind so that a stale message cannot pass the checks. */
static void prime_last_error(void)
{
    fa_context *unused;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, -7, &unused), FA_ERROR_INVALID_VALUE);
}

static void check_message(const char *expected)
{
    const char *msg = fa_last_error();
    assert_non_null(msg);
    if (!strstr(msg, expected) || strchr(msg, '\n') || strstr(msg, "device: -7"))
        fail_msg("fa_last_error() '%s' should be one line naming '%s'", msg, expected);
}

static fa_status run_forward(call *c)
{
    const fa_attention_desc *desc = c->null_desc ? NULL : &c->desc;
    return fa_forward(c->ctx, desc, c->null_args & NULL_Q ? NULL : &c->q, c->null_args & NULL_K ? NULL : &c->k,
                      c->null_args & NULL_V ? NULL : &c->v, c->null_args & NULL_OUT ? NULL : &c->out, c->lse);
}

static fa_status run_backward(call *c)
{
    const fa_attention_desc *desc = c->null_desc ? NULL : &c->desc;
    return fa_backward_ex(c->ctx, desc, c->null_args & NULL_Q ? NULL : &c->q, c->null_args & NULL_K ? NULL : &c->k,
                          c->null_args & NULL_V ? NULL : &c->v, c->null_args & NULL_OUT ? NULL : &c->out,
                          c->null_args & NULL_DOUT ? NULL : &c->dout, c->lse, c->null_args & NULL_DQ ? NULL : &c->dq,
                          c->null_args & NULL_DK ? NULL : &c->dk, c->null_args & NULL_DV ? NULL : &c->dv, c->dsinks,
                          c->dbias);
}

static void expect_forward_error(fixture *f, call *c, fa_status expected, const char *name)
{
    prime_last_error();
    const fa_status st = run_forward(c);
    if (st != expected) fail_msg("forward: status %d (%s), expected %d for '%s'", st, fa_last_error(), expected, name);
    check_message(name);
    assert_true(canary_intact(f->outputs[0], f->output_bytes[0]));
    assert_true(canary_intact(f->lse, (size_t)BATCH * HEADS_Q * SEQ_Q * sizeof(float)));
}

static void expect_backward_error(fixture *f, call *c, fa_status expected, const char *name)
{
    prime_last_error();
    const fa_status st = run_backward(c);
    if (st != expected) fail_msg("backward: status %d (%s), expected %d for '%s'", st, fa_last_error(), expected, name);
    check_message(name);
    for (int i = 1; i < 4; ++i) assert_true(canary_intact(f->outputs[i], f->output_bytes[i]));
    assert_true(canary_intact(f->dbias, sizeof f->dbias));
    assert_true(canary_intact(f->dsinks, sizeof f->dsinks));
}

/* Both passes reject the same problem-level argument. */
static void expect_both(fixture *f, call *c, const char *name)
{
    expect_forward_error(f, c, FA_ERROR_INVALID_VALUE, name);
    if (c->lse == f->lse) expect_backward_error(f, c, FA_ERROR_INVALID_VALUE, name);
}

static void test_valid_call_succeeds(void **state)
{
    fixture *f = *state;
    call c = fresh(f);
    assert_int_equal(run_forward(&c), FA_SUCCESS);
    assert_false(canary_intact(f->outputs[0], f->output_bytes[0]));
    assert_int_equal(run_backward(&c), FA_SUCCESS);
    /* with a block mask and padding too, so that the error tests below start from a valid one */
    c.desc.block_mask = &c.block_mask;
    c.desc.seqlens_k = c.seqlens;
    assert_int_equal(run_forward(&c), FA_SUCCESS);
}

static void test_null_arguments(void **state)
{
    fixture *f = *state;
    call c = fresh(f);
    c.ctx = NULL;
    expect_both(f, &c, "ctx");
    c = fresh(f);
    c.null_desc = 1;
    expect_both(f, &c, "desc");
    static const struct { unsigned flag; const char *name; } tensors[] = {
        {NULL_Q, "q:"}, {NULL_K, "k:"}, {NULL_V, "v:"}, {NULL_OUT, "out:"},
    };
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i) {
        c = fresh(f);
        c.null_args = tensors[i].flag;
        expect_both(f, &c, tensors[i].name);
    }
    static const struct { unsigned flag; const char *name; } grads[] = {
        {NULL_DOUT, "dout:"}, {NULL_DQ, "dq:"}, {NULL_DK, "dk:"}, {NULL_DV, "dv:"},
    };
    for (size_t i = 0; i < sizeof grads / sizeof grads[0]; ++i) {
        c = fresh(f);
        c.null_args = grads[i].flag;
        expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, grads[i].name);
    }
    c = fresh(f);
    c.lse = NULL;
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "lse");
}

static void test_null_data(void **state)
{
    fixture *f = *state;
    call c = fresh(f);
    fa_tensor *forward_tensors[] = {&c.q, &c.k, &c.v, &c.out};
    const char *names[] = {"q:", "k:", "v:", "out:"};
    for (int i = 0; i < 4; ++i) {
        c = fresh(f);
        forward_tensors[i]->data = NULL;
        expect_both(f, &c, names[i]);
    }
    fa_tensor *grads[] = {&c.dout, &c.dq, &c.dk, &c.dv};
    const char *grad_names[] = {"dout:", "dq:", "dk:", "dv:"};
    for (int i = 0; i < 4; ++i) {
        c = fresh(f);
        grads[i]->data = NULL;
        expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, grad_names[i]);
    }
}

static void test_non_positive_sizes(void **state)
{
    fixture *f = *state;
    const int64_t bad[] = {0, -1, INT64_MIN};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; ++b)
        for (int dim = 0; dim < 4; ++dim) {
            call c = fresh(f);
            fa_tensor *targets[] = {&c.q, &c.k, &c.v, &c.out, &c.dout, &c.dq, &c.dk, &c.dv};
            const char *names[] = {"q:", "k:", "v:", "out:", "dout:", "dq:", "dk:", "dv:"};
            for (int t = 0; t < 8; ++t) {
                c = fresh(f);
                int64_t *fields[] = {&targets[t]->batch, &targets[t]->seqlen, &targets[t]->heads, &targets[t]->head_dim};
                *fields[dim] = bad[b];
                if (t < 4) expect_both(f, &c, names[t]);
                else expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, names[t]);
            }
        }
}

static void test_head_grouping(void **state)
{
    fixture *f = *state;
    call c = fresh(f);
    c.k.heads = c.v.heads = c.dk.heads = c.dv.heads = 3; /* 4 % 3 != 0 */
    expect_both(f, &c, "heads");
}

static void test_mismatched_shapes(void **state)
{
    fixture *f = *state;
    call c = fresh(f);
    c.k.batch = 1;
    expect_both(f, &c, "k:");
    c = fresh(f);
    c.k.head_dim = DIM / 2;
    expect_both(f, &c, "k:");
    c = fresh(f);
    c.v.seqlen = SEQ_K - 1;
    expect_both(f, &c, "v:");
    c = fresh(f);
    c.v.heads = 1;
    expect_both(f, &c, "v:");
    c = fresh(f);
    c.out.seqlen = SEQ_Q + 1;
    expect_both(f, &c, "out:");
    c = fresh(f);
    c.out.head_dim = DIM / 2;
    expect_both(f, &c, "out:");
    /* backward's extra tensors */
    c = fresh(f);
    c.dout.seqlen = SEQ_Q - 1;
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dout:");
    c = fresh(f);
    c.dq.heads = HEADS_KV;
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dq:");
    c = fresh(f);
    c.dk.batch = 1;
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dk:");
    c = fresh(f);
    c.dv.seqlen = SEQ_K + 2;
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dv:");
}

static void test_seqlens_out_of_range(void **state)
{
    fixture *f = *state;
    const int32_t bad[] = {-1, SEQ_K + 1, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        call c = fresh(f);
        c.seqlens[1] = bad[i];
        c.desc.seqlens_k = c.seqlens;
        expect_both(f, &c, "seqlens_k");
    }
}

static void test_bad_block_mask(void **state)
{
    fixture *f = *state;
    call c = fresh(f);
    c.block_mask.rows = 1; /* 5 queries in blocks of 3 need 2 rows */
    c.desc.block_mask = &c.block_mask;
    expect_both(f, &c, "block_mask");
    c = fresh(f);
    c.block_mask.cols = 2;
    c.desc.block_mask = &c.block_mask;
    expect_both(f, &c, "block_mask");
    c = fresh(f);
    c.block_mask.mask = NULL;
    c.desc.block_mask = &c.block_mask;
    expect_both(f, &c, "block_mask");
    const int32_t bad_sizes[] = {0, -3};
    for (size_t i = 0; i < 2; ++i) {
        c = fresh(f);
        c.block_mask.block_q = bad_sizes[i];
        c.desc.block_mask = &c.block_mask;
        expect_both(f, &c, "block_mask");
        c = fresh(f);
        c.block_mask.block_k = bad_sizes[i];
        c.desc.block_mask = &c.block_mask;
        expect_both(f, &c, "block_mask");
    }
}

static void test_bad_scalars(void **state)
{
    fixture *f = *state;
    const float bad_p[] = {-0.1f, 1.0f, 1.5f, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad_p / sizeof bad_p[0]; ++i) {
        call c = fresh(f);
        c.desc.dropout_p = bad_p[i];
        expect_both(f, &c, "dropout_p");
    }
    const float bad_scale[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad_scale / sizeof bad_scale[0]; ++i) {
        call c = fresh(f);
        c.desc.softmax_scale = bad_scale[i];
        expect_both(f, &c, "softmax_scale");
    }
    const int32_t bad_window[] = {-2, INT32_MIN};
    for (size_t i = 0; i < 2; ++i) {
        call c = fresh(f);
        c.desc.window_left = bad_window[i];
        expect_both(f, &c, "window_left");
        c = fresh(f);
        c.desc.window_right = bad_window[i];
        expect_both(f, &c, "window_right");
    }
}

/* A valid call with every score modifier set (ALiBi per batch), and fa_backward_ex's outputs. */
static call with_modifiers(fixture *f)
{
    call c = fresh(f);
    c.desc.softcap = 30.0f;
    c.desc.alibi_slopes = f->slopes;
    c.desc.alibi_per_batch = 1;
    c.desc.sinks = f->sinks;
    c.desc.bias = &f->bias_desc;
    c.dsinks = f->dsinks;
    c.dbias = &f->dbias_desc;
    return c;
}

static void test_score_modifiers(void **state)
{
    fixture *f = *state;
    for (int h = 0; h < HEADS_Q; ++h) f->sinks[h] = 0.5f;
    for (int x = 0; x < BATCH * HEADS_Q; ++x) f->slopes[x] = 0.25f;
    memset(f->bias, 0, sizeof f->bias);
    call c = with_modifiers(f);
    /* the valid call: computed by the CPU backend, which writes both extra gradients */
    assert_int_equal(run_forward(&c), FA_SUCCESS);
    assert_int_equal(run_backward(&c), FA_SUCCESS);
    assert_false(canary_intact(f->dsinks, sizeof f->dsinks));
    assert_false(canary_intact(f->dbias, sizeof f->dbias));

    const float bad_cap[] = {-1.0f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_cap / sizeof bad_cap[0]; ++i) {
        c = with_modifiers(f);
        c.desc.softcap = bad_cap[i];
        expect_both(f, &c, "desc->softcap");
    }
    c = with_modifiers(f);
    c.desc.alibi_per_batch = 2;
    expect_both(f, &c, "desc->alibi_per_batch");
    c = with_modifiers(f);
    c.desc.alibi_slopes = NULL;
    expect_both(f, &c, "desc->alibi_per_batch");
    c = with_modifiers(f);
    c.desc.alibi_slopes = (const float *)((const char *)f->slopes + 1);
    expect_both(f, &c, "desc->alibi_slopes");
    c = with_modifiers(f);
    c.desc.sinks = (const float *)((const char *)f->sinks + 2);
    expect_both(f, &c, "desc->sinks");

    /* values in host memory, read by the CPU backend's core: the last slope, then a sink */
    f->slopes[BATCH * HEADS_Q - 1] = NAN;
    c = with_modifiers(f);
    expect_both(f, &c, "desc->alibi_slopes[7]");
    f->slopes[BATCH * HEADS_Q - 1] = 0.25f;
    const float bad_sink[] = {NAN, INFINITY};
    for (size_t i = 0; i < 2; ++i) {
        f->sinks[2] = bad_sink[i];
        c = with_modifiers(f);
        expect_both(f, &c, "desc->sinks[2]");
    }
    f->sinks[2] = -INFINITY; /* no sink: valid */
    c = with_modifiers(f);
    assert_int_equal(run_forward(&c), FA_SUCCESS);
    f->sinks[2] = 0.5f;

    /* the bias */
    fa_bias bias = f->bias_desc;
    c = with_modifiers(f);
    c.desc.bias = &bias;
    bias.data = NULL;
    expect_both(f, &c, "desc->bias->data");
    bias = f->bias_desc;
    bias.dtype = (fa_dtype)9;
    expect_both(f, &c, "desc->bias->dtype");
    bias = f->bias_desc;
    bias.stride_head = -1;
    expect_both(f, &c, "desc->bias->stride_head");
    bias = f->bias_desc;
    bias.stride_q = INT64_MAX / 2;
    expect_both(f, &c, "desc->bias->stride_q");
    bias = f->bias_desc;
    bias.dtype = FA_DTYPE_F16;
    bias.data = (char *)f->bias + 1;
    expect_both(f, &c, "desc->bias->data");

    /* the gradients: need their modifier, the bias's broadcast, no overlapping elements */
    c = with_modifiers(f);
    c.desc.sinks = NULL;
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dsinks");
    c = with_modifiers(f);
    c.desc.bias = NULL;
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dbias");
    fa_bias dbias = f->dbias_desc;
    c = with_modifiers(f);
    c.dbias = &dbias;
    dbias.stride_head = 0;
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dbias->stride_head");
    dbias = f->dbias_desc;
    dbias.stride_q = SEQ_K - 1;
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dbias->stride_q");
    dbias = f->dbias_desc;
    dbias.stride_batch = 2 * SEQ_Q * SEQ_K; /* batch 1 lands on batch 0's third head */
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dbias->stride_batch");
    dbias = f->dbias_desc;
    dbias.stride_head = -3;
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dbias->stride_head");
    /* a [BATCH, SEQ_Q, HEADS_Q, SEQ_K] dbias (heads inside rows) does not overlap: valid */
    dbias = f->dbias_desc;
    dbias.stride_q = HEADS_Q * SEQ_K;
    dbias.stride_head = SEQ_K;
    assert_int_equal(run_backward(&c), FA_SUCCESS);
}

static void test_bad_strides(void **state)
{
    fixture *f = *state;
    const int64_t mixed[][3] = {{0, DIM, 0}, {HEADS_Q * DIM * SEQ_Q, 0, DIM}, {-1, HEADS_Q * DIM, DIM},
                                {SEQ_Q * HEADS_Q * DIM, HEADS_Q * DIM, -DIM}};
    for (size_t i = 0; i < sizeof mixed / sizeof mixed[0]; ++i) {
        call c = fresh(f);
        c.q.stride_batch = mixed[i][0];
        c.q.stride_seq = mixed[i][1];
        c.q.stride_head = mixed[i][2];
        expect_both(f, &c, "q:");
        c = fresh(f);
        c.dq.stride_batch = mixed[i][0];
        c.dq.stride_seq = mixed[i][1];
        c.dq.stride_head = mixed[i][2];
        expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dq:");
    }
}

static void test_mixed_dtypes(void **state)
{
    fixture *f = *state;
    call c = fresh(f);
    c.k.dtype = FA_DTYPE_F16;
    expect_both(f, &c, "k:");
    c = fresh(f);
    c.v.dtype = FA_DTYPE_BF16;
    expect_both(f, &c, "v:");
    c = fresh(f);
    c.out.dtype = FA_DTYPE_F16;
    expect_both(f, &c, "out:");
    c = fresh(f);
    c.dk.dtype = FA_DTYPE_BF16;
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dk:");
    c = fresh(f);
    c.q.dtype = (fa_dtype)7;
    expect_both(f, &c, "dtype");
    c = fresh(f);
    c.dv.dtype = (fa_dtype)-1;
    expect_backward_error(f, &c, FA_ERROR_INVALID_VALUE, "dtype");
}

static void test_size_overflow(void **state)
{
    fixture *f = *state;
    call c = fresh(f);
    c.q.seqlen = c.out.seqlen = INT64_MAX / 4; /* batch * seqlen * heads * head_dim overflows */
    expect_both(f, &c, "q:");
    c = fresh(f);
    c.k.heads = c.v.heads = (int64_t)1 << 40; /* kv heads overflow (and would not divide q's) */
    c.k.seqlen = c.v.seqlen = (int64_t)1 << 30;
    expect_both(f, &c, "k:");
    c = fresh(f); /* explicit strides whose largest offset overflows */
    c.v.stride_batch = INT64_MAX / 2;
    c.v.stride_seq = HEADS_KV * DIM;
    c.v.stride_head = DIM;
    expect_both(f, &c, "v:");
}

static void test_context_errors(void **state)
{
    (void)state;
    prime_last_error();
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, NULL), FA_ERROR_INVALID_VALUE);
    check_message("ctx");
    fa_context *ctx = (fa_context *)&ctx; /* must be reset to NULL on failure */
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, -1, &ctx), FA_ERROR_INVALID_VALUE);
    assert_null(ctx);
    assert_non_null(strstr(fa_last_error(), "device"));
    prime_last_error();
    assert_int_equal(fa_context_create((fa_backend)42, 0, &ctx), FA_ERROR_INVALID_VALUE);
    check_message("backend");
    assert_null(ctx);
    prime_last_error();
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 1, &ctx), FA_ERROR_INVALID_VALUE);
    check_message("device");
    /* the CPU's environment switches: a bad value is an error, not a silent default */
    setenv("FLASHATTN_CPU_BF16_DOT", "yes", 1);
    prime_last_error();
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_ERROR_INVALID_VALUE);
    check_message("FLASHATTN_CPU_BF16_DOT");
    assert_null(ctx);
    setenv("FLASHATTN_CPU_BF16_DOT", "0", 1);
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    fa_context_destroy(ctx);
    unsetenv("FLASHATTN_CPU_BF16_DOT");
    fa_context_destroy(NULL); /* fine */
    assert_int_equal(fa_context_backend(NULL), FA_BACKEND_AUTO);
    prime_last_error();
    assert_int_equal(fa_context_set_num_threads(NULL, 1), FA_ERROR_INVALID_VALUE);
    check_message("ctx");
    prime_last_error();
    assert_int_equal(fa_synchronize(NULL), FA_ERROR_INVALID_VALUE);
    check_message("ctx");
}

static void test_memory_errors(void **state)
{
    fixture *f = *state;
    void *p = (void *)&p;
    prime_last_error();
    assert_int_equal(fa_malloc(f->ctx, 0, &p), FA_ERROR_INVALID_VALUE);
    check_message("bytes");
    assert_null(p);
    prime_last_error();
    assert_int_equal(fa_malloc(f->ctx, 16, NULL), FA_ERROR_INVALID_VALUE);
    check_message("ptr");
    prime_last_error();
    assert_int_equal(fa_malloc(NULL, 16, &p), FA_ERROR_INVALID_VALUE);
    check_message("ctx");
    assert_int_equal(fa_free(f->ctx, NULL), FA_SUCCESS);
    char host[16] = {0};
    prime_last_error();
    assert_int_equal(fa_memcpy_h2d(f->ctx, NULL, host, sizeof host), FA_ERROR_INVALID_VALUE);
    check_message("dst");
    prime_last_error();
    assert_int_equal(fa_memcpy_h2d(f->ctx, f->outputs[0], NULL, sizeof host), FA_ERROR_INVALID_VALUE);
    check_message("src");
    prime_last_error();
    assert_int_equal(fa_memcpy_d2h(f->ctx, NULL, f->inputs[0], sizeof host), FA_ERROR_INVALID_VALUE);
    check_message("dst");
    prime_last_error();
    assert_int_equal(fa_memcpy_d2h(f->ctx, host, NULL, sizeof host), FA_ERROR_INVALID_VALUE);
    check_message("src");
    prime_last_error();
    assert_int_equal(fa_memcpy_d2h(NULL, host, f->inputs[0], sizeof host), FA_ERROR_INVALID_VALUE);
    check_message("ctx");
}

static void test_other_entry_points(void **state)
{
    fixture *f = *state;
    fa_tiling t;
    prime_last_error();
    assert_int_equal(fa_context_tiling(f->ctx, 0, FA_DTYPE_F32, &t, NULL), FA_ERROR_INVALID_VALUE);
    check_message("head_dim");
    prime_last_error();
    assert_int_equal(fa_context_tiling(f->ctx, 64, (fa_dtype)9, &t, NULL), FA_ERROR_INVALID_VALUE);
    check_message("dtype");
    prime_last_error();
    assert_int_equal(fa_context_tiling(f->ctx, 64, FA_DTYPE_F32, NULL, NULL), FA_ERROR_INVALID_VALUE);
    check_message("tiling");
    prime_last_error();
    assert_int_equal(fa_context_set_num_threads(f->ctx, -1), FA_ERROR_INVALID_VALUE);
    check_message("n");
    prime_last_error();
    assert_int_equal(fa_context_set_stream(f->ctx, (void *)f), FA_ERROR_NOT_SUPPORTED);
    check_message("stream");
    assert_int_equal(fa_context_set_stream(f->ctx, NULL), FA_SUCCESS);
    fa_attention_desc_init(NULL); /* accepted, does nothing */
    fa_kv_slots_init(NULL);       /* the same */
    /* Workspaces: the CPU's memory is the host's, so a caller's workspace is accepted and unused;
     * the size query needs somewhere to write and validates the call's arguments. */
    prime_last_error();
    assert_int_equal(fa_context_set_workspace(NULL, NULL, 0), FA_ERROR_INVALID_VALUE);
    check_message("ctx");
    prime_last_error();
    assert_int_equal(fa_context_set_workspace(f->ctx, (void *)f, 0), FA_ERROR_INVALID_VALUE);
    check_message("bytes");
    assert_int_equal(fa_context_set_workspace(f->ctx, f->outputs[0], 64), FA_SUCCESS);
    assert_int_equal(fa_context_set_workspace(f->ctx, NULL, 0), FA_SUCCESS);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    prime_last_error();
    assert_int_equal(fa_workspace_size(f->ctx, &desc, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
                     FA_ERROR_INVALID_VALUE);
    check_message("bytes");
    size_t bytes = 7;
    prime_last_error();
    assert_int_equal(fa_workspace_size(f->ctx, &desc, NULL, NULL, NULL, NULL, NULL, NULL, NULL, &bytes),
                     FA_ERROR_INVALID_VALUE);
    check_message("q");
    assert_int_equal(bytes, 0);
    prime_last_error();
    assert_int_equal(fa_forward_kvcache_ex(NULL, &desc, NULL, NULL, NULL, NULL, NULL, NULL, NULL), FA_ERROR_INVALID_VALUE);
    check_message("ctx");
}

static void test_status_strings(void **state)
{
    (void)state;
    const fa_status codes[] = {FA_SUCCESS, FA_ERROR_INVALID_VALUE, FA_ERROR_NOT_SUPPORTED, FA_ERROR_OUT_OF_MEMORY,
                               FA_ERROR_BACKEND_UNAVAILABLE, FA_ERROR_BACKEND_FAILURE};
    const size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; ++i) {
        const char *s = fa_status_string(codes[i]);
        assert_non_null(s);
        assert_true(s[0] != '\0');
        for (size_t j = 0; j < i; ++j) assert_string_not_equal(s, fa_status_string(codes[j]));
    }
    const char *unknown = fa_status_string((fa_status)1000);
    assert_non_null(unknown);
    assert_true(unknown[0] != '\0');
}

static void test_version(void **state)
{
    (void)state;
    char expected[32];
    snprintf(expected, sizeof expected, "%d.%d.%d", FA_VERSION_MAJOR, FA_VERSION_MINOR, FA_VERSION_PATCH);
    assert_string_equal(fa_version_string(), expected);
    assert_int_equal(fa_version_number(), FA_VERSION_NUMBER);
    assert_string_equal(fa_backend_name(FA_BACKEND_CPU), "cpu");
    assert_string_equal(fa_backend_name((fa_backend)77), "unknown");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_call_succeeds), cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_null_data),           cmocka_unit_test(test_non_positive_sizes),
        cmocka_unit_test(test_head_grouping),       cmocka_unit_test(test_mismatched_shapes),
        cmocka_unit_test(test_seqlens_out_of_range), cmocka_unit_test(test_bad_block_mask),
        cmocka_unit_test(test_bad_scalars),         cmocka_unit_test(test_bad_strides),
        cmocka_unit_test(test_score_modifiers),
        cmocka_unit_test(test_mixed_dtypes),        cmocka_unit_test(test_size_overflow),
        cmocka_unit_test(test_context_errors),      cmocka_unit_test(test_memory_errors),
        cmocka_unit_test(test_other_entry_points),  cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_version),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* The oracle's own gradients of the score modifiers against finite differences of its forward:
 * L = sum(dO o O); dL/dsink, dL/dbias (broadcast axes summed: perturbing one stored element moves
 * every score it broadcasts to) and dL/dq, dL/dk through the softcap, with ALiBi, causal masking,
 * GQA and dropout on. The other tests trust oracle_backward_ex, so this is what makes it a reference. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "oracle.h"
#include "test_arrays.h"

enum { B = 2, HQ = 4, HKV = 2, SQ = 5, SK = 7, D = 4 };
enum { NQ = B * SQ * HQ * D, NK = B * SK * HKV * D };

typedef struct problem {
    oracle_shape s;
    fa_attention_desc desc;
    fa_bias bias;
    float bias_data[B * HQ * SQ * SK], sinks[HQ], slopes[B * HQ];
    double *q, *k, *v, *dout;
} problem;

static void problem_init(problem *p, int64_t stride_batch, int64_t stride_head, int64_t stride_q)
{
    memset(p, 0, sizeof *p);
    p->s = (oracle_shape){B, HQ, HKV, SQ, SK, D};
    p->q = test_random_doubles(1, NQ);
    p->k = test_random_doubles(2, NK);
    p->v = test_random_doubles(3, NK);
    p->dout = test_random_doubles(4, NQ);
    double *r = test_random_doubles(5, B * HQ * SQ * SK + HQ + B * HQ);
    for (int x = 0; x < B * HQ * SQ * SK; ++x) p->bias_data[x] = (float)r[x];
    for (int h = 0; h < HQ; ++h) p->sinks[h] = (float)r[B * HQ * SQ * SK + h];
    for (int x = 0; x < B * HQ; ++x) p->slopes[x] = 0.25f + 0.25f * (float)fabs(r[B * HQ * SQ * SK + HQ + x]);
    free(r);
    p->bias = (fa_bias){p->bias_data, FA_DTYPE_F32, stride_batch, stride_head, stride_q};
    fa_attention_desc_init(&p->desc);
    p->desc.softmax_scale = 2.0f; /* large scores, so the softcap bends them */
    p->desc.softcap = 1.5f;
    p->desc.causal = 1;
    p->desc.dropout_p = 0.25f;
    p->desc.dropout_seed = 77;
    p->desc.alibi_slopes = p->slopes;
    p->desc.alibi_per_batch = 1;
    p->desc.sinks = p->sinks;
    p->desc.bias = &p->bias;
}

static void problem_free(problem *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->dout);
}

static double loss(const problem *p)
{
    double out[NQ], l = 0.0;
    oracle_forward(&p->s, &p->desc, p->q, p->k, p->v, out, NULL);
    for (int x = 0; x < NQ; ++x) l += p->dout[x] * out[x];
    return l;
}

/* Central difference of the loss in *x (a float parameter): uses the representable steps. */
static double fd_float(problem *p, float *x)
{
    const float saved = *x, up = saved + 1e-3f, down = saved - 1e-3f;
    *x = up;
    const double l_up = loss(p);
    *x = down;
    const double l_down = loss(p);
    *x = saved;
    return (l_up - l_down) / ((double)up - (double)down);
}

static double fd_double(problem *p, double *x)
{
    const double saved = *x;
    *x = saved + 1e-5;
    const double l_up = loss(p);
    *x = saved - 1e-5;
    const double l_down = loss(p);
    *x = saved;
    return (l_up - l_down) / 2e-5;
}

static void expect_close(double analytic, double numeric, const char *what, int index)
{
    if (!(fabs(analytic - numeric) <= 1e-5 * fmax(1.0, fabs(numeric))))
        fail_msg("%s[%d]: oracle gradient %.9g, finite difference %.9g", what, index, analytic, numeric);
}

static void check_gradients(int64_t stride_batch, int64_t stride_head, int64_t stride_q)
{
    static problem p;
    problem_init(&p, stride_batch, stride_head, stride_q);
    static double dq[NQ], dk[NK], dv[NK], dbias[B * HQ * SQ * SK];
    double dsinks[HQ];
    oracle_backward_ex(&p.s, &p.desc, p.q, p.k, p.v, p.dout, dq, dk, dv, dsinks, dbias);
    fa_bias packed;
    size_t count;
    oracle_dbias_shape(&p.s, &p.desc, &packed, &count);
    double nonzero = 0.0;
    for (int h = 0; h < HQ; ++h) {
        expect_close(dsinks[h], fd_float(&p, &p.sinks[h]), "dsinks", h);
        nonzero += fabs(dsinks[h]);
    }
    /* every element of the packed dbias is the gradient of the stored element it maps to */
    for (int64_t b = 0; b < (stride_batch ? B : 1); ++b)
        for (int64_t h = 0; h < (stride_head ? HQ : 1); ++h)
            for (int64_t i = 0; i < (stride_q ? SQ : 1); ++i)
                for (int64_t j = 0; j < SK; ++j) {
                    const size_t at = (size_t)(b * packed.stride_batch + h * packed.stride_head + i * packed.stride_q + j);
                    float *stored = &p.bias_data[b * stride_batch + h * stride_head + i * stride_q + j];
                    expect_close(dbias[at], fd_float(&p, stored), "dbias", (int)at);
                    nonzero += fabs(dbias[at]);
                }
    for (int x = 0; x < NQ; x += 3) expect_close(dq[x], fd_double(&p, &p.q[x]), "dq", x);
    for (int x = 0; x < NK; x += 3) expect_close(dk[x], fd_double(&p, &p.k[x]), "dk", x);
    assert_true(nonzero > 1e-3); /* the checks compared something */
    problem_free(&p);
}

static void test_full_bias(void **state)
{
    (void)state;
    check_gradients(HQ * SQ * SK, SQ * SK, SK);
}

static void test_broadcast_bias(void **state)
{
    (void)state;
    check_gradients(0, SQ * SK, SK); /* shared by the batches */
    check_gradients(HQ * SK, SK, 0); /* one row per (batch, head), shared by the queries */
    check_gradients(0, 0, SK);       /* [seqlen_q, seqlen_k], shared by batches and heads */
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_full_bias), cmocka_unit_test(test_broadcast_bias)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

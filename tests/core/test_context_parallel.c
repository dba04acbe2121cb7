/* Context parallelism on one process: a problem split into query and key blocks run with
 * desc->q_offset / k_offset / seqlen_*_global, whose partial results are recombined by
 * fa_merge_partials (forward) or summed (backward), equals the unsplit run; each block equals the
 * fp64 oracle on the block; and fa_merge_partials' rules and argument checks. */
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
#include "oracle.h"
#include "test_arrays.h"

enum { BATCH = 2, HQ = 4, HK = 2, D = 16, N = 45 };
#define ROW (HQ * D)   /* floats per sequence position of q, out */
#define KROW (HK * D)  /* floats per sequence position of k, v */

/* Query blocks and key blocks of uneven sizes (the ring's chunks need not be equal). */
static const int64_t q_cuts[] = {0, 13, 30, N};
static const int64_t k_cuts[] = {0, 7, 22, 31, N};
#define Q_BLOCKS 3
#define K_BLOCKS 4

typedef struct full_problem {
    float q[BATCH * N * ROW], k[BATCH * N * KROW], v[BATCH * N * KROW], dout[BATCH * N * ROW];
    float out[BATCH * N * ROW], lse[BATCH * HQ * N];
    float dq[BATCH * N * ROW], dk[BATCH * N * KROW], dv[BATCH * N * KROW];
} full_problem;

static fa_context *ctx;
static float alibi[HQ] = {0.5f, 0.25f, 0.125f, 0.0625f};

static int setup(void **state)
{
    (void)state;
    return fa_context_create(FA_BACKEND_CPU, 0, &ctx) == FA_SUCCESS ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    fa_context_destroy(ctx);
    return 0;
}

static void fill(float *dst, size_t n, uint64_t seed)
{
    double *x = test_random_doubles(seed, n);
    assert_non_null(x);
    for (size_t i = 0; i < n; ++i) dst[i] = (float)x[i];
    free(x);
}

/* Rows [s0, s0 + len) of a packed [BATCH, N, heads, D] array, as a strided view. */
static fa_tensor rows_view(float *base, int64_t heads, int64_t s0, int64_t len)
{
    return (fa_tensor){base + s0 * heads * D, FA_DTYPE_F32, BATCH, len, heads, D, N * heads * D, heads * D, D};
}

static fa_tensor packed(float *data, int64_t len, int64_t heads)
{
    return (fa_tensor){data, FA_DTYPE_F32, BATCH, len, heads, D, 0, 0, 0};
}

/* lse rows [s0, s0 + len) of [BATCH, HQ, N] <-> a packed [BATCH, HQ, len] block. */
static void lse_gather(const float *full, int64_t s0, int64_t len, float *block)
{
    for (int64_t bh = 0; bh < BATCH * HQ; ++bh) memcpy(block + bh * len, full + bh * N + s0, (size_t)len * sizeof *block);
}

static void lse_scatter(const float *block, int64_t s0, int64_t len, float *full)
{
    for (int64_t bh = 0; bh < BATCH * HQ; ++bh) memcpy(full + bh * N + s0, block + bh * len, (size_t)len * sizeof *block);
}

static void block_desc(const fa_attention_desc *base, int64_t q0, int64_t k0, fa_attention_desc *desc)
{
    *desc = *base;
    desc->q_offset = q0;
    desc->k_offset = k0;
    desc->seqlen_q_global = N;
    desc->seqlen_k_global = N;
}

static void full_init(full_problem *f)
{
    fill(f->q, sizeof f->q / sizeof *f->q, 11);
    fill(f->k, sizeof f->k / sizeof *f->k, 12);
    fill(f->v, sizeof f->v / sizeof *f->v, 13);
    fill(f->dout, sizeof f->dout / sizeof *f->dout, 14);
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (isinf(a[i]) && a[i] == b[i]) continue;
        const double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= worst)) worst = e; /* NaN sticks */
    }
    return worst;
}

/* The split forward (merged over key blocks) and backward (summed over blocks, dq over key blocks
 * in order, dk/dv over query blocks in order) against the unsplit run of the same desc. */
static void check_split_equals_unsplit(const fa_attention_desc *base)
{
    static full_problem f;
    full_init(&f);
    fa_tensor tq = packed(f.q, N, HQ), tk = packed(f.k, N, HK), tv = packed(f.v, N, HK), to = packed(f.out, N, HQ);
    fa_tensor tdo = packed(f.dout, N, HQ), tdq = packed(f.dq, N, HQ), tdk = packed(f.dk, N, HK),
              tdv = packed(f.dv, N, HK);
    assert_int_equal(fa_forward(ctx, base, &tq, &tk, &tv, &to, f.lse), FA_SUCCESS);
    assert_int_equal(fa_backward(ctx, base, &tq, &tk, &tv, &to, &tdo, f.lse, &tdq, &tdk, &tdv), FA_SUCCESS);

    static float out[BATCH * N * ROW], lse[BATCH * HQ * N], dq[BATCH * N * ROW], dk[BATCH * N * KROW],
        dv[BATCH * N * KROW];
    static float part_out[K_BLOCKS][BATCH * N * ROW], part_lse[K_BLOCKS][BATCH * HQ * N], block_lse[BATCH * HQ * N];
    static float g_dq[BATCH * N * ROW], g_dk[BATCH * N * KROW], g_dv[BATCH * N * KROW];
    memset(dq, 0, sizeof dq);
    memset(dk, 0, sizeof dk);
    memset(dv, 0, sizeof dv);
    for (int qb = 0; qb < Q_BLOCKS; ++qb) {
        const int64_t q0 = q_cuts[qb], lq = q_cuts[qb + 1] - q0;
        fa_tensor bq = rows_view(f.q, HQ, q0, lq);
        const fa_tensor *outs[K_BLOCKS];
        const float *lses[K_BLOCKS];
        fa_tensor parts[K_BLOCKS];
        for (int kb = 0; kb < K_BLOCKS; ++kb) {
            const int64_t k0 = k_cuts[kb], lk = k_cuts[kb + 1] - k0;
            fa_tensor bk = rows_view(f.k, HK, k0, lk), bv = rows_view(f.v, HK, k0, lk);
            fa_attention_desc desc;
            block_desc(base, q0, k0, &desc);
            parts[kb] = packed(part_out[kb], lq, HQ);
            assert_int_equal(fa_forward(ctx, &desc, &bq, &bk, &bv, &parts[kb], part_lse[kb]), FA_SUCCESS);
            outs[kb] = &parts[kb];
            lses[kb] = part_lse[kb];
        }
        static float merged[BATCH * N * ROW], merged_lse[BATCH * HQ * N];
        fa_tensor m = packed(merged, lq, HQ);
        assert_int_equal(fa_merge_partials(ctx, K_BLOCKS, outs, lses, &m, merged_lse), FA_SUCCESS);
        for (int64_t b = 0; b < BATCH; ++b)
            memcpy(out + (b * N + q0) * ROW, merged + b * lq * ROW, (size_t)(lq * ROW) * sizeof *out);
        lse_scatter(merged_lse, q0, lq, lse);
    }
    const double out_err = max_abs_diff(out, f.out, sizeof out / sizeof *out);
    const double lse_err = max_abs_diff(lse, f.lse, sizeof lse / sizeof *lse);
    print_message("split forward: max |out - unsplit| %.2e, |lse - unsplit| %.2e\n", out_err, lse_err);
    assert_true(out_err < 2e-6);
    assert_true(lse_err < 2e-6);

    /* Backward of each block with the unsplit out and lse (what a ring has after its forward). */
    for (int qb = 0; qb < Q_BLOCKS; ++qb)
        for (int kb = 0; kb < K_BLOCKS; ++kb) {
            const int64_t q0 = q_cuts[qb], lq = q_cuts[qb + 1] - q0, k0 = k_cuts[kb], lk = k_cuts[kb + 1] - k0;
            fa_tensor bq = rows_view(f.q, HQ, q0, lq), bk = rows_view(f.k, HK, k0, lk), bv = rows_view(f.v, HK, k0, lk);
            fa_tensor bo = rows_view(f.out, HQ, q0, lq), bdo = rows_view(f.dout, HQ, q0, lq);
            fa_tensor bdq = packed(g_dq, lq, HQ), bdk = packed(g_dk, lk, HK), bdv = packed(g_dv, lk, HK);
            fa_attention_desc desc;
            block_desc(base, q0, k0, &desc);
            lse_gather(f.lse, q0, lq, block_lse);
            assert_int_equal(fa_backward(ctx, &desc, &bq, &bk, &bv, &bo, &bdo, block_lse, &bdq, &bdk, &bdv),
                             FA_SUCCESS);
            for (int64_t b = 0; b < BATCH; ++b) {
                for (int64_t x = 0; x < lq * ROW; ++x) dq[(b * N + q0) * ROW + x] += g_dq[b * lq * ROW + x];
                for (int64_t x = 0; x < lk * KROW; ++x) {
                    dk[(b * N + k0) * KROW + x] += g_dk[b * lk * KROW + x];
                    dv[(b * N + k0) * KROW + x] += g_dv[b * lk * KROW + x];
                }
            }
        }
    const double dq_err = max_abs_diff(dq, f.dq, sizeof dq / sizeof *dq);
    const double dk_err = max_abs_diff(dk, f.dk, sizeof dk / sizeof *dk);
    const double dv_err = max_abs_diff(dv, f.dv, sizeof dv / sizeof *dv);
    print_message("split backward: max |dq| %.2e |dk| %.2e |dv| %.2e off the unsplit run\n", dq_err, dk_err, dv_err);
    assert_true(dq_err < 2e-5 && dk_err < 2e-5 && dv_err < 2e-5);
}

static void test_split_causal_gqa(void **state)
{
    (void)state;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    check_split_equals_unsplit(&desc);
}

static void test_split_window_alibi(void **state)
{
    (void)state;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.window_left = 9;
    desc.window_right = 4;
    desc.alibi_slopes = alibi;
    check_split_equals_unsplit(&desc);
}

static void test_split_causal_dropout(void **state)
{
    (void)state;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    desc.dropout_p = 0.25f;
    desc.dropout_seed = 0x1234567890abcdefull;
    desc.dropout_offset = 7;
    check_split_equals_unsplit(&desc);
}

/* Each block on its own against the oracle on the same block desc (forward and backward with
 * the block's own lse): the masks and the dropout stream at global positions, element by element. */
static void test_blocks_match_oracle(void **state)
{
    (void)state;
    static full_problem f;
    full_init(&f);
    fa_attention_desc base;
    fa_attention_desc_init(&base);
    base.causal = 1;
    base.window_left = 20;
    base.dropout_p = 0.3f;
    base.dropout_seed = 99;
    base.alibi_slopes = alibi;
    static double dq_[BATCH * N * ROW], qd[BATCH * N * ROW], kd[BATCH * N * KROW], vd[BATCH * N * KROW],
        dod[BATCH * N * ROW], od[BATCH * N * ROW], lsed[BATCH * HQ * N], dkd[BATCH * N * KROW], dvd[BATCH * N * KROW];
    static float out[BATCH * N * ROW], lse[BATCH * HQ * N], dq[BATCH * N * ROW], dk[BATCH * N * KROW],
        dv[BATCH * N * KROW];
    double worst = 0.0;
    for (int qb = 0; qb < Q_BLOCKS; ++qb)
        for (int kb = 0; kb < K_BLOCKS; ++kb) {
            const int64_t q0 = q_cuts[qb], lq = q_cuts[qb + 1] - q0, k0 = k_cuts[kb], lk = k_cuts[kb + 1] - k0;
            /* packed double copies of the block for the oracle */
            for (int64_t b = 0; b < BATCH; ++b) {
                for (int64_t x = 0; x < lq * ROW; ++x) {
                    qd[b * lq * ROW + x] = f.q[(b * N + q0) * ROW + x];
                    dod[b * lq * ROW + x] = f.dout[(b * N + q0) * ROW + x];
                }
                for (int64_t x = 0; x < lk * KROW; ++x) {
                    kd[b * lk * KROW + x] = f.k[(b * N + k0) * KROW + x];
                    vd[b * lk * KROW + x] = f.v[(b * N + k0) * KROW + x];
                }
            }
            fa_attention_desc desc;
            block_desc(&base, q0, k0, &desc);
            const oracle_shape shape = {BATCH, HQ, HK, lq, lk, D};
            oracle_forward(&shape, &desc, qd, kd, vd, od, lsed);
            oracle_backward(&shape, &desc, qd, kd, vd, dod, dq_, dkd, dvd);
            fa_tensor bq = rows_view(f.q, HQ, q0, lq), bk = rows_view(f.k, HK, k0, lk), bv = rows_view(f.v, HK, k0, lk);
            fa_tensor bdo = rows_view(f.dout, HQ, q0, lq), bo = packed(out, lq, HQ);
            fa_tensor bdq = packed(dq, lq, HQ), bdk = packed(dk, lk, HK), bdv = packed(dv, lk, HK);
            assert_int_equal(fa_forward(ctx, &desc, &bq, &bk, &bv, &bo, lse), FA_SUCCESS);
            assert_int_equal(fa_backward(ctx, &desc, &bq, &bk, &bv, &bo, &bdo, lse, &bdq, &bdk, &bdv), FA_SUCCESS);
            const double errs[] = {test_relative_error(od, out, (size_t)(BATCH * lq * ROW)),
                                   test_relative_error(lsed, lse, (size_t)(BATCH * HQ * lq)),
                                   test_relative_error(dq_, dq, (size_t)(BATCH * lq * ROW)),
                                   test_relative_error(dkd, dk, (size_t)(BATCH * lk * KROW)),
                                   test_relative_error(dvd, dv, (size_t)(BATCH * lk * KROW))};
            for (int e = 0; e < 5; ++e) {
                if (!(errs[e] < 1e-4)) print_message("block q%d k%d: quantity %d error %.3e\n", qb, kb, e, errs[e]);
                assert_true(errs[e] < 1e-4);
                if (errs[e] > worst) worst = errs[e];
            }
        }
    print_message("blocks vs oracle (causal, window, dropout, alibi, GQA): worst relative error %.2e\n", worst);
}

static void test_position_arguments(void **state)
{
    (void)state;
    static full_problem f;
    fa_tensor tq = rows_view(f.q, HQ, 0, 10), tk = rows_view(f.k, HK, 0, 10), tv = rows_view(f.v, HK, 0, 10);
    fa_tensor to = packed(f.out, 10, HQ);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.q_offset = -1;
    desc.seqlen_q_global = 20;
    assert_int_equal(fa_forward(ctx, &desc, &tq, &tk, &tv, &to, NULL), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "desc->q_offset"));
    desc.q_offset = 11; /* 11 + 10 > 20 */
    assert_int_equal(fa_forward(ctx, &desc, &tq, &tk, &tv, &to, NULL), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "desc->q_offset"));
    desc.q_offset = 10;
    assert_int_equal(fa_forward(ctx, &desc, &tq, &tk, &tv, &to, NULL), FA_SUCCESS);
    desc.k_offset = 1; /* k_global defaults to k's 10 rows */
    assert_int_equal(fa_forward(ctx, &desc, &tq, &tk, &tv, &to, NULL), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "desc->k_offset"));
    desc.k_offset = 0;
    desc.seqlen_k_global = -3;
    assert_int_equal(fa_forward(ctx, &desc, &tq, &tk, &tv, &to, NULL), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "desc->seqlen_k_global"));

    /* Varlen and the KV cache refuse block positions. */
    int32_t cu[] = {0, 10};
    fa_varlen vl = {1, cu, cu, 10, 10};
    fa_tensor pq = {f.q, FA_DTYPE_F32, 1, 10, HQ, D, 0, 0, 0}, pk = {f.k, FA_DTYPE_F32, 1, 10, HK, D, 0, 0, 0};
    fa_tensor pv = {f.v, FA_DTYPE_F32, 1, 10, HK, D, 0, 0, 0}, po = {f.out, FA_DTYPE_F32, 1, 10, HQ, D, 0, 0, 0};
    fa_attention_desc_init(&desc);
    desc.varlen = &vl;
    desc.seqlen_k_global = 12;
    assert_int_equal(fa_forward(ctx, &desc, &pq, &pk, &pv, &po, NULL), FA_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(fa_last_error(), "varlen"));
    int32_t cached[1] = {4};
    fa_kv_cache cache = {pk, pv, NULL, 0, cached};
    fa_tensor q1 = {f.q, FA_DTYPE_F32, 1, 1, HQ, D, 0, 0, 0}, o1 = {f.out, FA_DTYPE_F32, 1, 1, HQ, D, 0, 0, 0};
    fa_attention_desc_init(&desc);
    desc.k_offset = 2;
    assert_int_equal(fa_forward_kvcache(ctx, &desc, &q1, &cache, NULL, NULL, &o1, NULL), FA_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(fa_last_error(), "KV-cache"));
}

/* Rows with every part at -inf stay zero with lse -inf; one part is copied; order is fixed. */
static void test_merge_rules(void **state)
{
    (void)state;
    enum { L = 3, E = BATCH * L * ROW, R = BATCH * HQ * L };
    static float a[E], b[E], c[E], out[E], out2[E], la[R], lb[R], lc[R], lse[R], lse2[R];
    fill(a, E, 1);
    fill(b, E, 2);
    fill(c, E, 3);
    for (int r = 0; r < R; ++r) {
        la[r] = (float)(r % 5) - 2.0f;
        lb[r] = r % 3 == 0 ? -INFINITY : (float)(r % 7) * 0.5f;
        lc[r] = r % 4 == 0 ? -INFINITY : 1.5f - (float)(r % 3);
    }
    la[1] = lb[1] = lc[1] = -INFINITY; /* row 1 (b 0, h 0, s 1) sees no key in any part */
    fa_tensor ta = packed(a, L, HQ), tb = packed(b, L, HQ), tc = packed(c, L, HQ), to = packed(out, L, HQ);
    fa_tensor to2 = packed(out2, L, HQ);
    const fa_tensor *outs[3] = {&ta, &tb, &tc};
    const float *lses[3] = {la, lb, lc};
    memset(out, 0x7f, sizeof out);
    assert_int_equal(fa_merge_partials(ctx, 3, outs, lses, &to, lse), FA_SUCCESS);
    for (int x = 0; x < D; ++x) assert_true(out[1 * ROW + x] == 0.0f); /* (b 0, s 1, h 0) */
    assert_true(lse[1] == -INFINITY);
    /* An element against the formula in double. */
    for (int r = 0; r < R; ++r) {
        const int64_t bb = r / (HQ * L), h = (r / L) % HQ, s = r % L;
        const double ls[3] = {la[r], lb[r], lc[r]};
        double top = -INFINITY, sum = 0.0, acc = 0.0;
        for (int p = 0; p < 3; ++p) top = ls[p] > top ? ls[p] : top;
        if (top == -INFINITY) continue;
        const size_t at = (size_t)((bb * L + s) * ROW + h * D + 5);
        const float *parts[3] = {a, b, c};
        for (int p = 0; p < 3; ++p) {
            const double w = ls[p] == -INFINITY ? 0.0 : exp(ls[p] - top);
            sum += w;
            acc += w * parts[p][at];
        }
        assert_float_equal(out[at], acc / sum, 1e-6);
        assert_float_equal(lse[r], top + log(sum), 1e-6);
    }
    /* Deterministic: the same call again gives the same bits. */
    assert_int_equal(fa_merge_partials(ctx, 3, outs, lses, &to2, lse2), FA_SUCCESS);
    assert_memory_equal(out, out2, sizeof out);
    assert_memory_equal(lse, lse2, sizeof lse);
    /* One part: its output where its lse is finite, zeros and -inf where it is -inf. */
    assert_int_equal(fa_merge_partials(ctx, 1, &outs[1], &lses[1], &to2, NULL), FA_SUCCESS);
    for (int r = 0; r < R; ++r) {
        const int64_t bb = r / (HQ * L), h = (r / L) % HQ, s = r % L;
        const size_t at = (size_t)((bb * L + s) * ROW + h * D);
        for (int x = 0; x < D; ++x) assert_float_equal(out2[at + x], lb[r] == -INFINITY ? 0.0f : b[at + x], 1e-6);
    }
}

/* f16 and bf16 parts: merged in f32, rounded once into out (against the formula in double). */
static void test_merge_half_dtypes(void **state)
{
    (void)state;
    enum { L = 3, E = BATCH * L * ROW, R = BATCH * HQ * L };
    static uint16_t a[E], b[E], out[E];
    static float la[R], lb[R], lse[R];
    const fa_dtype dtypes[2] = {FA_DTYPE_F16, FA_DTYPE_BF16};
    const double tolerance[2] = {1.0 / 2048, 1.0 / 256}; /* one ulp below 1: the final rounding plus f32 sums */
    for (int t = 0; t < 2; ++t) {
        for (int x = 0; x < E; ++x) { /* multiples of 1/64 in [-1, 1): exact in both dtypes */
            test_store_element(a, (size_t)x, dtypes[t], (double)((x * 37) % 128 - 64) / 64.0);
            test_store_element(b, (size_t)x, dtypes[t], (double)((x * 11) % 128 - 64) / 64.0);
        }
        for (int r = 0; r < R; ++r) {
            la[r] = (float)(r % 5) * 0.75f - 1.0f;
            lb[r] = r % 4 == 0 ? -INFINITY : (float)(r % 3) - 0.5f;
        }
        fa_tensor ta = {a, dtypes[t], BATCH, L, HQ, D, 0, 0, 0}, tb = ta, to = ta;
        tb.data = b;
        to.data = out;
        const fa_tensor *outs[2] = {&ta, &tb};
        const float *lses[2] = {la, lb};
        assert_int_equal(fa_merge_partials(ctx, 2, outs, lses, &to, lse), FA_SUCCESS);
        double worst = 0.0;
        for (int r = 0; r < R; ++r) {
            const int64_t bb = r / (HQ * L), h = (r / L) % HQ, sq = r % L;
            const double top = la[r] > lb[r] ? la[r] : lb[r];
            const double wa = exp(la[r] - top), wb = lb[r] == -INFINITY ? 0.0 : exp(lb[r] - top);
            for (int64_t c = 0; c < D; ++c) {
                const size_t at = (size_t)((bb * L + sq) * ROW + h * D + c);
                const double want = (wa * test_load_element(a, at, dtypes[t]) + wb * test_load_element(b, at, dtypes[t])) /
                                    (wa + wb);
                const double e = fabs(test_load_element(out, at, dtypes[t]) - want);
                if (e > worst) worst = e;
            }
            assert_float_equal(lse[r], top + log(wa + wb), 1e-6);
        }
        print_message("%s merge: max |out - formula| %.2e\n", t ? "bf16" : "f16", worst);
        assert_true(worst <= tolerance[t]);
    }
}

static void test_merge_arguments(void **state)
{
    (void)state;
    enum { L = 3, E = BATCH * L * ROW, R = BATCH * HQ * L };
    static float a[E], b[E], out[E], la[R], lb[R], lse[R];
    static uint16_t half[E];
    fa_tensor ta = packed(a, L, HQ), tb = packed(b, L, HQ), to = packed(out, L, HQ);
    const fa_tensor *outs[2] = {&ta, &tb};
    const float *lses[2] = {la, lb};
#define EXPECT(call, status, text)                                 \
    do {                                                           \
        assert_int_equal((call), (status));                        \
        if (!strstr(fa_last_error(), (text))) print_message("%s\n", fa_last_error()); \
        assert_non_null(strstr(fa_last_error(), (text)));          \
    } while (0)
    EXPECT(fa_merge_partials(NULL, 2, outs, lses, &to, lse), FA_ERROR_INVALID_VALUE, "ctx");
    EXPECT(fa_merge_partials(ctx, 0, outs, lses, &to, lse), FA_ERROR_INVALID_VALUE, "n:");
    EXPECT(fa_merge_partials(ctx, 2, NULL, lses, &to, lse), FA_ERROR_INVALID_VALUE, "outs");
    EXPECT(fa_merge_partials(ctx, 2, outs, NULL, &to, lse), FA_ERROR_INVALID_VALUE, "lses");
    EXPECT(fa_merge_partials(ctx, 2, outs, lses, NULL, lse), FA_ERROR_INVALID_VALUE, "out");
    const float *no_lse[2] = {la, NULL};
    EXPECT(fa_merge_partials(ctx, 2, outs, no_lse, &to, lse), FA_ERROR_INVALID_VALUE, "lses[1]");
    fa_tensor shorter = packed(b, L - 1, HQ);
    const fa_tensor *bad_shape[2] = {&ta, &shorter};
    EXPECT(fa_merge_partials(ctx, 2, bad_shape, lses, &to, lse), FA_ERROR_INVALID_VALUE, "outs[1]");
    fa_tensor f16 = {half, FA_DTYPE_F16, BATCH, L, HQ, D, 0, 0, 0};
    const fa_tensor *bad_dtype[2] = {&ta, &f16};
    EXPECT(fa_merge_partials(ctx, 2, bad_dtype, lses, &to, lse), FA_ERROR_INVALID_VALUE, "outs[1]: dtype");
    /* A caller that sizes out from outs[0] (the Python binding does) copies its bad shape: the
     * message names the input, the cause. An out of its own bad shape is named as out. */
    fa_tensor empty = packed(a, L, HQ), empty_out = packed(out, L, HQ);
    empty.head_dim = empty_out.head_dim = 0;
    const fa_tensor *bad_first[2] = {&empty, &tb};
    EXPECT(fa_merge_partials(ctx, 2, bad_first, lses, &empty_out, lse), FA_ERROR_INVALID_VALUE, "outs[0]: head_dim 0");
    EXPECT(fa_merge_partials(ctx, 2, outs, lses, &empty_out, lse), FA_ERROR_INVALID_VALUE, "out: head_dim 0");
    const fa_tensor *aliased[2] = {&ta, &to};
    EXPECT(fa_merge_partials(ctx, 2, aliased, lses, &to, lse), FA_ERROR_INVALID_VALUE, "out: overlaps outs[1]");
    EXPECT(fa_merge_partials(ctx, 2, outs, lses, &to, lb), FA_ERROR_INVALID_VALUE, "lse_out: overlaps lses[1]");
    EXPECT(fa_merge_partials(ctx, 2, outs, lses, &to, out + 4), FA_ERROR_INVALID_VALUE, "lse_out: overlaps out");
    memset(out, 0x5a, sizeof out);
    const uint8_t untouched = 0x5a;
    EXPECT(fa_merge_partials(ctx, 2, bad_shape, lses, &to, lse), FA_ERROR_INVALID_VALUE, "outs[1]");
    for (size_t x = 0; x < sizeof out; ++x) assert_int_equal(((uint8_t *)out)[x], untouched); /* nothing written */
#undef EXPECT
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_causal_gqa),
        cmocka_unit_test(test_split_window_alibi),
        cmocka_unit_test(test_split_causal_dropout),
        cmocka_unit_test(test_blocks_match_oracle),
        cmocka_unit_test(test_position_arguments),
        cmocka_unit_test(test_merge_rules),
        cmocka_unit_test(test_merge_half_dtypes),
        cmocka_unit_test(test_merge_arguments),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

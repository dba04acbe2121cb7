/* Block positions (desc->q_offset, k_offset, seqlen_*_global) on a GPU backend (a GPU or the
 * emulated suite), with whatever kernel family FLASHATTN_GPU_KERNELS forces: a problem split into
 * query and key blocks of uneven sizes (a key block of 70 spans two tile-MMA tiles) equals the
 * unsplit GPU run (forward merged by fa_merge_partials over the key blocks, backward summed over
 * the blocks), and every block equals the CPU backend's run of the same block (tests/core checks
 * the CPU's blocks against the oracle). GQA in every case; causal, window + ALiBi, and causal +
 * window + ALiBi + dropout. The dropout mask of a block, bit for bit, is in test_gpu_backends.c.
 * fa_merge_partials on device memory: test_gpu_merge.c. */
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
#include "gpu_tests.h"
#include "harness.h"

enum { B = 2, HQ = 4, HK = 2, D = 32, N = 90, QB = 3, KB = 3 };
static const int64_t q_cuts[QB + 1] = {0, 29, 41, N};
static const int64_t k_cuts[KB + 1] = {0, 7, 77, N};

/* Rows [s0, s0 + len) of a [B, N, heads, D] array at base (host or device) as a strided view. */
static fa_tensor rows_view(void *base, fa_dtype dtype, int64_t heads, int64_t s0, int64_t len)
{
    const fa_tensor t = {(char *)base + (size_t)(s0 * heads * D) * dtype_size(dtype), dtype, B, len, heads, D,
                         N * heads * D, heads * D, D};
    return t;
}

static fa_tensor packed(void *data, fa_dtype dtype, int64_t len, int64_t heads)
{
    const fa_tensor t = {data, dtype, B, len, heads, D, 0, 0, 0};
    return t;
}

/* The block desc of base at query row q0 and key k0 of the N x N problem. */
static fa_attention_desc block_desc(const fa_attention_desc *base, int64_t q0, int64_t k0)
{
    fa_attention_desc desc = *base;
    desc.q_offset = q0;
    desc.k_offset = k0;
    desc.seqlen_q_global = N;
    desc.seqlen_k_global = N;
    return desc;
}

/* Values of dtype: rows [s0, s0 + len) of a [B, N, heads, D] array <-> a packed [B, len, heads, D]. */
static void rows_add(const void *block, fa_dtype dtype, int64_t heads, int64_t s0, int64_t len, float *full)
{
    for (int64_t b = 0; b < B; ++b)
        for (int64_t x = 0; x < len * heads * D; ++x)
            full[(b * N + s0) * heads * D + x] += from_dtype(block, (size_t)(b * len * heads * D + x), dtype);
}

static void rows_copy(const void *block, fa_dtype dtype, int64_t heads, int64_t s0, int64_t len, void *full)
{
    const size_t es = dtype_size(dtype), n = (size_t)(len * heads * D) * es;
    for (int64_t b = 0; b < B; ++b)
        memcpy((char *)full + (size_t)((b * N + s0) * heads * D) * es, (const char *)block + (size_t)b * n, n);
}

/* lse rows [s0, s0 + len) of [B, HQ, N] <-> a packed [B, HQ, len] block. */
static void lse_rows(const float *full, int64_t s0, int64_t len, float *block, int to_full)
{
    for (int64_t bh = 0; bh < B * HQ; ++bh) {
        if (to_full) memcpy((float *)full + bh * N + s0, block + bh * len, (size_t)len * sizeof *block);
        else memcpy(block + bh * len, full + bh * N + s0, (size_t)len * sizeof *block);
    }
}

static void block_name(char *name, size_t size, const char *what, int qb, int kb)
{
    snprintf(name, size, "%s q%d k%d", what, qb, kb);
}

/* base: the desc in the GPU context's memory; host_alibi: its slopes on the host, for the CPU. */
static void check_split(void **state, const char *label, const fa_attention_desc *base, const float *host_alibi,
                        fa_dtype dtype)
{
    fa_context *gpu = context_or_skip(state), *cpu = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &cpu), FA_SUCCESS);
    const size_t nq = (size_t)B * N * HQ * D, nk = (size_t)B * N * HK * D, nl = (size_t)B * HQ * N;
    const size_t es = dtype_size(dtype);
    buffer q = buffer_new(gpu, nq, dtype, 21), k = buffer_new(gpu, nk, dtype, 22), v = buffer_new(gpu, nk, dtype, 23);
    buffer dout = buffer_new(gpu, nq, dtype, 24), out = buffer_new(gpu, nq, dtype, 0), dq = buffer_new(gpu, nq, dtype, 0);
    buffer dk = buffer_new(gpu, nk, dtype, 0), dv = buffer_new(gpu, nk, dtype, 0);
    buffer lse = buffer_new(gpu, nl, FA_DTYPE_F32, 0);
    print_message("%s [%s]\n", label, fa_dtype_label(dtype));

    /* the unsplit run on the GPU */
    fa_tensor tq = packed(q.dev, dtype, N, HQ), tk = packed(k.dev, dtype, N, HK), tv = packed(v.dev, dtype, N, HK);
    fa_tensor to = packed(out.dev, dtype, N, HQ), tdo = packed(dout.dev, dtype, N, HQ);
    fa_tensor tdq = packed(dq.dev, dtype, N, HQ), tdk = packed(dk.dev, dtype, N, HK), tdv = packed(dv.dev, dtype, N, HK);
    assert_int_equal(fa_forward(gpu, base, &tq, &tk, &tv, &to, lse.dev), FA_SUCCESS);
    assert_int_equal(fa_backward(gpu, base, &tq, &tk, &tv, &to, &tdo, lse.dev, &tdq, &tdk, &tdv), FA_SUCCESS);
    void *u_out = buffer_fetch(gpu, &out), *u_dq = buffer_fetch(gpu, &dq), *u_dk = buffer_fetch(gpu, &dk),
         *u_dv = buffer_fetch(gpu, &dv);
    float *u_lse = buffer_fetch(gpu, &lse);

    /* per block: device outputs (packed) and the CPU's run of the same block on the host copies */
    buffer p_out[KB], p_lse[KB];
    void *h_out[KB];
    float *h_lse[KB];
    buffer b_lse = buffer_new(gpu, nl, FA_DTYPE_F32, 0), b_dq = buffer_new(gpu, nq, dtype, 0);
    buffer b_dk = buffer_new(gpu, nk, dtype, 0), b_dv = buffer_new(gpu, nk, dtype, 0);
    void *c_out = malloc(nq * es), *c_dq = malloc(nq * es), *c_dk = malloc(nk * es), *c_dv = malloc(nk * es);
    void *merged = malloc(nq * es), *s_out = malloc(nq * es);
    float *c_lse = malloc(nl * sizeof *c_lse), *merged_lse = malloc(nl * sizeof *merged_lse);
    float *s_lse = malloc(nl * sizeof *s_lse), *block_lse = malloc(nl * sizeof *block_lse);
    float *s_dq = calloc(nq, sizeof *s_dq), *s_dk = calloc(nk, sizeof *s_dk), *s_dv = calloc(nk, sizeof *s_dv);
    assert_true(c_out && c_dq && c_dk && c_dv && merged && s_out && c_lse && merged_lse && s_lse && block_lse && s_dq &&
                s_dk && s_dv);
    for (int kb = 0; kb < KB; ++kb) {
        p_out[kb] = buffer_new(gpu, nq, dtype, 0);
        p_lse[kb] = buffer_new(gpu, nl, FA_DTYPE_F32, 0);
    }
    char name[64];
    for (int qb = 0; qb < QB; ++qb) {
        const int64_t q0 = q_cuts[qb], lq = q_cuts[qb + 1] - q0;
        const size_t bq_n = (size_t)(B * lq * HQ * D), bl_n = (size_t)(B * HQ * lq);
        const fa_tensor *outs[KB];
        const float *lses[KB];
        fa_tensor parts[KB];
        for (int kb = 0; kb < KB; ++kb) {
            const int64_t k0 = k_cuts[kb], lk = k_cuts[kb + 1] - k0;
            const size_t bk_n = (size_t)(B * lk * HK * D);
            const fa_attention_desc desc = block_desc(base, q0, k0);
            fa_attention_desc cpu_desc = desc;
            if (desc.alibi_slopes) cpu_desc.alibi_slopes = host_alibi;
            /* forward of the block on the GPU and on the CPU */
            fa_tensor gq = rows_view(q.dev, dtype, HQ, q0, lq), gk = rows_view(k.dev, dtype, HK, k0, lk),
                      gv = rows_view(v.dev, dtype, HK, k0, lk), go = packed(p_out[kb].dev, dtype, lq, HQ);
            assert_int_equal(fa_forward(gpu, &desc, &gq, &gk, &gv, &go, p_lse[kb].dev), FA_SUCCESS);
            h_out[kb] = buffer_fetch(gpu, &p_out[kb]);
            h_lse[kb] = buffer_fetch(gpu, &p_lse[kb]);
            fa_tensor cq = rows_view(q.host, dtype, HQ, q0, lq), ck = rows_view(k.host, dtype, HK, k0, lk),
                      cv = rows_view(v.host, dtype, HK, k0, lk), co = packed(c_out, dtype, lq, HQ);
            assert_int_equal(fa_forward(cpu, &cpu_desc, &cq, &ck, &cv, &co, c_lse), FA_SUCCESS);
            block_name(name, sizeof name, "block", qb, kb);
            expect_close("out", name, h_out[kb], c_out, bq_n, dtype);
            expect_close_as("lse", name, h_lse[kb], c_lse, bl_n, FA_DTYPE_F32, FA_DTYPE_F32);
            parts[kb] = packed(h_out[kb], dtype, lq, HQ);
            outs[kb] = &parts[kb];
            lses[kb] = h_lse[kb];

            /* backward of the block with the unsplit out and lse (what a ring has after its forward) */
            lse_rows(u_lse, q0, lq, block_lse, 0);
            assert_int_equal(fa_memcpy_h2d(gpu, b_lse.dev, block_lse, bl_n * sizeof(float)), FA_SUCCESS);
            fa_tensor gO = rows_view(out.dev, dtype, HQ, q0, lq), gdo = rows_view(dout.dev, dtype, HQ, q0, lq);
            fa_tensor gdq = packed(b_dq.dev, dtype, lq, HQ), gdk = packed(b_dk.dev, dtype, lk, HK),
                      gdv = packed(b_dv.dev, dtype, lk, HK);
            assert_int_equal(fa_backward(gpu, &desc, &gq, &gk, &gv, &gO, &gdo, b_lse.dev, &gdq, &gdk, &gdv), FA_SUCCESS);
            void *g_dq = buffer_fetch(gpu, &b_dq), *g_dk = buffer_fetch(gpu, &b_dk), *g_dv = buffer_fetch(gpu, &b_dv);
            fa_tensor cO = rows_view(u_out, dtype, HQ, q0, lq), cdo = rows_view(dout.host, dtype, HQ, q0, lq);
            fa_tensor cdq = packed(c_dq, dtype, lq, HQ), cdk = packed(c_dk, dtype, lk, HK), cdv = packed(c_dv, dtype, lk, HK);
            assert_int_equal(fa_backward(cpu, &cpu_desc, &cq, &ck, &cv, &cO, &cdo, block_lse, &cdq, &cdk, &cdv), FA_SUCCESS);
            expect_close("dq", name, g_dq, c_dq, bq_n, dtype);
            expect_close("dk", name, g_dk, c_dk, bk_n, dtype);
            expect_close("dv", name, g_dv, c_dv, bk_n, dtype);
            rows_add(g_dq, dtype, HQ, q0, lq, s_dq);
            rows_add(g_dk, dtype, HK, k0, lk, s_dk);
            rows_add(g_dv, dtype, HK, k0, lk, s_dv);
            free(g_dq);
            free(g_dk);
            free(g_dv);
        }
        fa_tensor m = packed(merged, dtype, lq, HQ);
        assert_int_equal(fa_merge_partials(cpu, KB, outs, lses, &m, merged_lse), FA_SUCCESS);
        rows_copy(merged, dtype, HQ, q0, lq, s_out);
        lse_rows(s_lse, q0, lq, merged_lse, 1);
        for (int kb = 0; kb < KB; ++kb) {
            free(h_out[kb]);
            free(h_lse[kb]);
        }
    }
    /* the split run against the unsplit one */
    expect_close("out", "split vs unsplit", s_out, u_out, nq, dtype);
    expect_close_as("lse", "split vs unsplit", s_lse, u_lse, nl, FA_DTYPE_F32, FA_DTYPE_F32);
    float *uf = malloc((nq > nk ? nq : nk) * sizeof *uf);
    assert_non_null(uf);
    const void *unsplit_grads[3] = {u_dq, u_dk, u_dv};
    const float *split_grads[3] = {s_dq, s_dk, s_dv};
    const size_t counts[3] = {nq, nk, nk};
    static const char *const grad_names[3] = {"dq", "dk", "dv"};
    for (int g = 0; g < 3; ++g) { /* the sums are f32; the tolerance is that of dtype */
        for (size_t i = 0; i < counts[g]; ++i) uf[i] = from_dtype(unsplit_grads[g], i, dtype);
        expect_close_as(grad_names[g], "split vs unsplit", split_grads[g], uf, counts[g], FA_DTYPE_F32, dtype);
    }
    free(uf);
    for (int kb = 0; kb < KB; ++kb) {
        buffer_free(gpu, &p_out[kb]);
        buffer_free(gpu, &p_lse[kb]);
    }
    buffer *bufs[] = {&q, &k, &v, &dout, &out, &dq, &dk, &dv, &lse, &b_lse, &b_dq, &b_dk, &b_dv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) buffer_free(gpu, bufs[i]);
    free(u_out); free(u_dq); free(u_dk); free(u_dv); free(u_lse);
    free(c_out); free(c_dq); free(c_dk); free(c_dv); free(c_lse);
    free(merged); free(merged_lse); free(s_out); free(s_lse); free(block_lse);
    free(s_dq); free(s_dk); free(s_dv);
    fa_context_destroy(cpu);
}

static void check_positions(void **state, fa_dtype dtype)
{
    fa_context *gpu = context_or_skip(state);
    buffer slopes = buffer_new(gpu, HQ, FA_DTYPE_F32, 0);
    static const float alibi[HQ] = {0.5f, 0.25f, 0.125f, 0.0625f};
    assert_int_equal(fa_memcpy_h2d(gpu, slopes.dev, alibi, sizeof alibi), FA_SUCCESS);
    /* FA_TEST_QUICK=1 (sanitizer runs: 75 s a run under ASan for all three): the last desc only */
    fa_attention_desc desc;
    if (!fa_test_quick()) {
        fa_attention_desc_init(&desc);
        desc.causal = 1;
        check_split(state, "causal, GQA", &desc, alibi, dtype);

        fa_attention_desc_init(&desc);
        desc.window_left = 9;
        desc.window_right = 4;
        desc.alibi_slopes = slopes.dev;
        check_split(state, "window 9/4, ALiBi, GQA", &desc, alibi, dtype);
    }

    fa_attention_desc_init(&desc);
    desc.causal = 1;
    desc.window_left = 30;
    desc.alibi_slopes = slopes.dev;
    desc.dropout_p = 0.25f;
    desc.dropout_seed = 0x1234567890abcdefull;
    desc.dropout_offset = 7;
    check_split(state, "causal, window 30, ALiBi, dropout, GQA", &desc, alibi, dtype);
    buffer_free(gpu, &slopes);
}

void test_gpu_positions_f32(void **state) { check_positions(state, FA_DTYPE_F32); }
void test_gpu_positions_f16(void **state) { check_positions(state, FA_DTYPE_F16); }
void test_gpu_positions_bf16(void **state) { check_positions(state, FA_DTYPE_BF16); }

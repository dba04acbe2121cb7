#define _POSIX_C_SOURCE 200809L /* setenv */
/* checkasm: whole forward and backward problems with the ISA forced (FLASHATTN_CPU_ISA) against
 * the same problems on the reference, and the override itself. */
#include "checkasm.h"

/* ---- whole problems: forced ISA against forced ref ---------------------------------------------- */
typedef struct e2e_case {
    const char *name;
    int64_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
    fa_dtype dtype;
    int causal, window_left, padded, block_mask;
    float dropout_p;
    float softcap; /* 0 = off: the ISA's tanh (softcap_cols) in the forward and the backward */
} e2e_case;

static const e2e_case e2e_cases[] = {
    {"dense f32", 1, 2, 2, 37, 53, 40, FA_DTYPE_F32, 0, -1, 0, 0, 0.0f, 0.0f},
    {"causal gqa f32", 2, 4, 2, 70, 45, 64, FA_DTYPE_F32, 1, -1, 0, 0, 0.0f, 0.0f},
    {"window padding f16", 2, 2, 1, 33, 81, 24, FA_DTYPE_F16, 1, 9, 1, 0, 0.0f, 0.0f},
    {"dropout block mask bf16", 1, 3, 3, 65, 65, 72, FA_DTYPE_BF16, 0, -1, 0, 1, 0.2f, 0.0f},
    {"long causal f32", 1, 1, 1, 300, 1100, 128, FA_DTYPE_F32, 1, -1, 1, 0, 0.0f, 0.0f},
    {"softcap causal f32", 1, 2, 1, 77, 90, 64, FA_DTYPE_F32, 1, -1, 0, 0, 0.0f, 0.4f},
    /* query tiles of 128 rows at d = 32, where the forward raises Br (cpu_forward.c's forward_rows) */
    {"window f32 d32", 1, 4, 4, 260, 300, 32, FA_DTYPE_F32, 0, 50, 0, 0, 0.0f, 0.0f},
};

typedef struct e2e_outputs { float *out, *lse, *dq, *dk, *dv; } e2e_outputs;

static void *tensor_fill(int64_t count, fa_dtype dtype, float amplitude)
{
    if (dtype == FA_DTYPE_F32) {
        float *x = malloc((size_t)count * 4);
        for (int64_t i = 0; x && i < count; ++i) x[i] = uniform(-amplitude, amplitude);
        return x;
    }
    uint16_t *x = malloc((size_t)count * 2);
    for (int64_t i = 0; x && i < count; ++i) {
        const float v = uniform(-amplitude, amplitude);
        x[i] = dtype == FA_DTYPE_F16 ? fa_f32_to_f16(v) : fa_f32_to_bf16(v);
    }
    return x;
}

static float element(const void *data, fa_dtype dtype, int64_t i)
{
    if (dtype == FA_DTYPE_F32) return ((const float *)data)[i];
    const uint16_t h = ((const uint16_t *)data)[i];
    return dtype == FA_DTYPE_F16 ? fa_f16_to_f32(h) : fa_bf16_to_f32(h);
}

/* Runs forward and backward of case c with FLASHATTN_CPU_ISA=isa on the given inputs. */
static void run_case(const e2e_case *c, const char *isa, void *const inputs[4], e2e_outputs *res)
{
    setenv("FLASHATTN_CPU_ISA", isa, 1);
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    unsetenv("FLASHATTN_CPU_ISA");
    const int64_t nq = c->batch * c->seqlen_q * c->heads_q * c->head_dim, nk = c->batch * c->seqlen_k * c->heads_kv * c->head_dim;
    const size_t es = test_dtype_size(c->dtype);
    void *out = calloc((size_t)nq, es), *dq = calloc((size_t)nq, es), *dk = calloc((size_t)nk, es), *dv = calloc((size_t)nk, es);
    res->lse = calloc((size_t)(c->batch * c->heads_q * c->seqlen_q), 4);
    int32_t seqlens[2] = {(int32_t)c->seqlen_k, (int32_t)(c->seqlen_k * 2 / 3)};
    uint8_t mask[64 * 64];
    fa_block_mask bm = {16, 16, (c->seqlen_q + 15) / 16, (c->seqlen_k + 15) / 16, mask};
    if (c->block_mask) assert_int_equal(fa_block_mask_butterfly(bm.rows, bm.cols, mask), FA_SUCCESS);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = c->causal;
    desc.softcap = c->softcap;
    desc.window_left = c->window_left;
    desc.seqlens_k = c->padded ? seqlens : NULL;
    desc.dropout_p = c->dropout_p;
    desc.dropout_seed = 42;
    desc.dropout_offset = 7;
    desc.block_mask = c->block_mask ? &bm : NULL;
    const fa_tensor tq = {inputs[0], c->dtype, c->batch, c->seqlen_q, c->heads_q, c->head_dim, 0, 0, 0};
    const fa_tensor tk = {inputs[1], c->dtype, c->batch, c->seqlen_k, c->heads_kv, c->head_dim, 0, 0, 0};
    fa_tensor tv = tk, to = tq, tdo = tq, tdq = tq, tdk = tk, tdv = tk;
    tv.data = inputs[2]; to.data = out; tdo.data = inputs[3]; tdq.data = dq; tdk.data = dk; tdv.data = dv;
    assert_int_equal(fa_forward(ctx, &desc, &tq, &tk, &tv, &to, res->lse), FA_SUCCESS);
    assert_int_equal(fa_backward(ctx, &desc, &tq, &tk, &tv, &to, &tdo, res->lse, &tdq, &tdk, &tdv), FA_SUCCESS);
    fa_context_destroy(ctx);
    void *raw[4] = {out, dq, dk, dv};
    float **dst[4] = {&res->out, &res->dq, &res->dk, &res->dv};
    for (int t = 0; t < 4; ++t) {
        const int64_t count = t >= 2 ? nk : nq;
        *dst[t] = malloc((size_t)count * 4);
        for (int64_t i = 0; i < count; ++i) (*dst[t])[i] = element(raw[t], c->dtype, i);
        free(raw[t]);
    }
}

static void compare(const char *what, const e2e_case *c, const float *got, const float *want, int64_t count, float tol)
{
    for (int64_t i = 0; i < count; ++i) {
        if (isinf(want[i]) && got[i] == want[i]) continue;
        if (!(fabsf(got[i] - want[i]) <= tol * (1.0f + fabsf(want[i]))))
            fail_msg("%s: %s[%lld] = %.9g, ref kernels %.9g", c->name, what, (long long)i, got[i], want[i]);
    }
}

void test_whole_problems(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state);
    for (size_t ci = 0; ci < sizeof e2e_cases / sizeof e2e_cases[0]; ++ci) {
        const e2e_case *c = &e2e_cases[ci];
        const int64_t nq = c->batch * c->seqlen_q * c->heads_q * c->head_dim, nk = c->batch * c->seqlen_k * c->heads_kv * c->head_dim;
        void *inputs[4] = {tensor_fill(nq, c->dtype, 2.0f), tensor_fill(nk, c->dtype, 2.0f), tensor_fill(nk, c->dtype, 1.0f),
                           tensor_fill(nq, c->dtype, 1.0f)};
        e2e_outputs a, b;
        run_case(c, "ref", inputs, &a);
        run_case(c, isa->isa, inputs, &b);
        /* f16/bf16 outputs are rounded: a one-ulp flip of the output format is allowed */
        const float tol = c->dtype == FA_DTYPE_F32 ? 2e-5f : c->dtype == FA_DTYPE_F16 ? 2e-3f : 1.6e-2f;
        compare("out", c, b.out, a.out, nq, tol);
        compare("lse", c, b.lse, a.lse, c->batch * c->heads_q * c->seqlen_q, 2e-5f);
        compare("dq", c, b.dq, a.dq, nq, tol);
        compare("dk", c, b.dk, a.dk, nk, tol);
        compare("dv", c, b.dv, a.dv, nk, tol);
        for (int t = 0; t < 4; ++t) free(inputs[t]);
        e2e_outputs *both[2] = {&a, &b};
        for (int r = 0; r < 2; ++r) {
            free(both[r]->out); free(both[r]->lse); free(both[r]->dq); free(both[r]->dk); free(both[r]->dv);
        }
    }
}

/* The override itself: ref always works, an unknown name fails at context creation. */
void test_override(void **state)
{
    (void)state;
    fa_context *ctx = NULL;
    setenv("FLASHATTN_CPU_ISA", "ref", 1);
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_non_null(strstr(fa_context_info(ctx), "isa ref"));
    fa_context_destroy(ctx);
    ctx = NULL;
    setenv("FLASHATTN_CPU_ISA", "sse9", 1);
    assert_int_not_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_null(ctx);
    assert_non_null(strstr(fa_last_error(), "FLASHATTN_CPU_ISA"));
    unsetenv("FLASHATTN_CPU_ISA");
}

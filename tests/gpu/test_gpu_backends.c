/* The GPU backends through the public API. With a GPU: the shared oracle case table on CUDA and
 * HIP in f32, f16 and bf16 (tolerances from the harness), the dropout mask identical to the CPU
 * backend's, streams, tiling and info. FLASHATTN_GPU_KERNELS (set by the gpu_*_tc and gpu_*_fma
 * tests) forces the forward kernel family of f16/bf16; the info string must confirm it. Without one: those tests skip() visibly, and what runs is
 * the unavailable path: a clear FA_ERROR_BACKEND_UNAVAILABLE naming what is missing. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/half.h"
#include "flashattn.h"
#include "gpu_tests.h"
#include "harness.h"
#include "test_arrays.h"

typedef struct gpu_fixture { fa_backend backend; fa_context *ctx; } gpu_fixture;

static int setup_backend(void **state, fa_backend backend)
{
    static gpu_fixture fixtures[4];
    gpu_fixture *f = &fixtures[backend];
    f->backend = backend;
    f->ctx = NULL;
    if (fa_backend_available(backend) && fa_context_create(backend, 0, &f->ctx) != FA_SUCCESS) {
        fprintf(stderr, "%s: available but fa_context_create failed: %s\n", fa_backend_name(backend), fa_last_error());
        return -1;
    }
    *state = f;
    return 0;
}
static int setup_cuda(void **state) { return setup_backend(state, FA_BACKEND_CUDA); }
static int setup_hip(void **state) { return setup_backend(state, FA_BACKEND_HIP); }
static int teardown(void **state)
{
    gpu_fixture *f = *state;
    fa_context_destroy(f->ctx);
    f->ctx = NULL;
    return 0;
}

/* FLASHATTN_REQUIRE_GPU=1 (scripts/gpu-validate.sh, the emulated suite): no device is a failure. */
static int gpu_required(void)
{
    const char *require = getenv("FLASHATTN_REQUIRE_GPU");
    return require && strcmp(require, "1") == 0;
}

fa_context *context_or_skip(void **state)
{
    gpu_fixture *f = *state;
    if (!f->ctx) {
        (void)fa_backend_available(f->backend); /* records the reason */
        fa_context *probe = NULL;
        fa_context_create(f->backend, 0, &probe);
        if (gpu_required()) fail_msg("FLASHATTN_REQUIRE_GPU=1 but %s", fa_last_error());
        print_message("SKIP: %s\n", fa_last_error());
        skip();
    }
    return f->ctx;
}

/* The harness's verdict (fa_case_passes): f16/bf16 errors are scaled by each quantity's magnitude.
 * Score modifier cases (dsinks and dbias included) run on every kernel family. */
static void run_table(void **state, fa_dtype dtype)
{
    fa_context *ctx = context_or_skip(state);
    const char *unknown = fa_case_filter_unknown();
    if (unknown) fail_msg("FA_TEST_CASES names \"%s\", which is not in the case table", unknown);
    for (size_t i = 0; i < fa_test_case_count; ++i) {
        const fa_test_case *c = &fa_test_cases[i];
        if (!fa_case_selected(c)) continue;
        fa_case_errors e;
        const fa_status st = fa_run_case(ctx, c, dtype, 1, &e);
        if (st != FA_SUCCESS) fail_msg("case %s: %s (%s)", c->name, fa_status_string(st), fa_last_error());
        char why[512];
        if (!fa_case_passes(&e, dtype, 1, why, sizeof why)) fail_msg("case %s [%s]: %s", c->name, fa_dtype_label(dtype), why);
    }
}
static void test_case_table_f32(void **state) { run_table(state, FA_DTYPE_F32); }
static void test_case_table_f16(void **state) { run_table(state, FA_DTYPE_F16); }
static void test_case_table_bf16(void **state) { run_table(state, FA_DTYPE_BF16); }

/* Host values to and from a device tensor of dtype (f32, f16 or bf16). */
size_t dtype_size(fa_dtype dtype) { return dtype == FA_DTYPE_F32 ? 4 : 2; }
void *to_dtype(const float *x, size_t n, fa_dtype dtype)
{
    void *out = malloc(n * dtype_size(dtype));
    assert_non_null(out);
    for (size_t i = 0; i < n; ++i) {
        if (dtype == FA_DTYPE_F32) ((float *)out)[i] = x[i];
        else if (dtype == FA_DTYPE_F16) ((uint16_t *)out)[i] = fa_f32_to_f16(x[i]);
        else ((uint16_t *)out)[i] = fa_f32_to_bf16(x[i]);
    }
    return out;
}
float from_dtype(const void *x, size_t i, fa_dtype dtype)
{
    if (dtype == FA_DTYPE_F32) return ((const float *)x)[i];
    if (dtype == FA_DTYPE_F16) return fa_f16_to_f32(((const uint16_t *)x)[i]);
    return fa_bf16_to_f32(((const uint16_t *)x)[i]);
}

/* n values of dtype on the host and their device copy. */
buffer buffer_new(fa_context *ctx, size_t n, fa_dtype dtype, uint64_t seed)
{
    float *f = malloc((n ? n : 1) * sizeof *f);
    assert_non_null(f);
    if (seed) {
        double *x = test_random_doubles(seed, n);
        for (size_t i = 0; i < n; ++i) f[i] = (float)x[i];
        free(x);
    } else {
        for (size_t i = 0; i < n; ++i) f[i] = NAN; /* outputs: a value never written shows up */
    }
    buffer b = {to_dtype(f, n, dtype), NULL, n, dtype};
    free(f);
    assert_int_equal(fa_malloc(ctx, (n ? n : 1) * dtype_size(dtype), &b.dev), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, b.dev, b.host, n * dtype_size(dtype)), FA_SUCCESS);
    return b;
}

/* The device copy's current contents, as a new host array. */
void *buffer_fetch(fa_context *ctx, const buffer *b)
{
    void *x = malloc((b->n ? b->n : 1) * dtype_size(b->dtype));
    assert_non_null(x);
    assert_int_equal(fa_memcpy_d2h(ctx, x, b->dev, b->n * dtype_size(b->dtype)), FA_SUCCESS);
    return x;
}

void buffer_free(fa_context *ctx, buffer *b)
{
    fa_free(ctx, b->dev);
    free(b->host);
}

int32_t *table_upload(fa_context *ctx, const int32_t *t, size_t n)
{
    void *dev;
    assert_int_equal(fa_malloc(ctx, n * sizeof *t, &dev), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, dev, t, n * sizeof *t), FA_SUCCESS);
    return dev;
}

/* max |got - want| / max(1, max |want|); equal infinities and NaN against NaN count as equal, any
 * other non-finite value as INFINITY. */
double relative_error(const void *got, const void *want, size_t n, fa_dtype dtype)
{
    double worst = 0.0, scale = 1.0;
    for (size_t i = 0; i < n; ++i) {
        const double g = from_dtype(got, i, dtype), w = from_dtype(want, i, dtype);
        if (isnan(w) || isnan(g) || isinf(w) || isinf(g)) {
            if (!(g == w || (isnan(g) && isnan(w)))) return INFINITY;
            continue;
        }
        if (fabs(g - w) > worst) worst = fabs(g - w);
        if (fabs(w) > scale) scale = fabs(w);
    }
    return worst / scale;
}

/* stored: the arrays' dtype; computed: the dtype whose tolerance applies. */
void expect_close_as(const char *what, const char *name, const void *got, const void *want, size_t n,
                            fa_dtype stored, fa_dtype computed)
{
    const fa_dtype dtype = computed;
    const double error = relative_error(got, want, n, stored), tol = fa_case_tolerance(dtype);
    print_message("  %-24s [%s] %-4s error %.2e (tolerance %.0e)\n", name, fa_dtype_label(dtype), what, error, tol);
    if (!(error <= tol)) fail_msg("%s [%s]: %s differs from the reference by %g", name, fa_dtype_label(dtype), what, error);
}

void expect_close(const char *what, const char *name, const void *got, const void *want, size_t n,
                         fa_dtype dtype)
{
    expect_close_as(what, name, got, want, n, dtype, dtype);
}

/* Q = K = 0 makes P uniform (1/Nk) and V = identity puts element (i, j) of dropout(P) into
 * O[i][j]: O[i][j] = keep(i, j) / ((1 - p) Nk). The recovered mask must equal the shared
 * stream's (fa_dropout_mask) and the CPU backend's output, for two heads of a batch of two.
 * In f16/bf16 the forward may run the tile-MMA kernels (FLASHATTN_GPU_KERNELS), in f32 the
 * generic ones; the value of a kept element is then held to the 16-bit rounding. blocked: the
 * call is the block at query row Q0, key K0 of a larger problem (desc->q_offset...), so its mask
 * must be that block of the global problem's mask. */
static void check_dropout_mask(void **state, fa_dtype dtype, int blocked)
{
    fa_context *ctx = context_or_skip(state);
    enum { B = 2, H = 2, NQ = 37, NK = 48, D = 48, Q0 = 70, K0 = 29, GQ = Q0 + NQ + 5, GK = K0 + NK + 3 };
    const float p = 0.3f;
    const int64_t q0 = blocked ? Q0 : 0, k0 = blocked ? K0 : 0, gq = blocked ? GQ : NQ, gk = blocked ? GK : NK;
    const size_t qn = (size_t)B * NQ * H * D, kn = (size_t)B * NK * H * D, es = dtype_size(dtype);
    float *q = calloc(qn, sizeof *q), *k = calloc(kn, sizeof *k), *v = calloc(kn, sizeof *v);
    float *cpu_out = calloc(qn, sizeof *cpu_out);
    uint8_t *keep = malloc((size_t)gq * (size_t)gk);
    assert_non_null(q); assert_non_null(k); assert_non_null(v); assert_non_null(cpu_out);
    assert_non_null(keep);
    for (int b = 0; b < B; ++b)
        for (int j = 0; j < NK; ++j)
            for (int h = 0; h < H; ++h) v[(((size_t)b * NK + j) * H + h) * D + j] = 1.0f;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.dropout_p = p;
    desc.dropout_seed = 0x1234abcd5678ULL;
    desc.dropout_offset = 77;
    desc.q_offset = q0;
    desc.k_offset = k0;
    desc.seqlen_q_global = blocked ? GQ : 0;
    desc.seqlen_k_global = blocked ? GK : 0;

    fa_context *cpu = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &cpu), FA_SUCCESS);
    fa_tensor tq = {q, FA_DTYPE_F32, B, NQ, H, D, 0, 0, 0}, tk = {k, FA_DTYPE_F32, B, NK, H, D, 0, 0, 0};
    fa_tensor tv = {v, FA_DTYPE_F32, B, NK, H, D, 0, 0, 0}, to = {cpu_out, FA_DTYPE_F32, B, NQ, H, D, 0, 0, 0};
    assert_int_equal(fa_forward(cpu, &desc, &tq, &tk, &tv, &to, NULL), FA_SUCCESS);
    fa_context_destroy(cpu);

    void *hq = to_dtype(q, qn, dtype), *hk = to_dtype(k, kn, dtype), *hv = to_dtype(v, kn, dtype);
    void *out = malloc(qn * es);
    assert_non_null(out);
    void *dq, *dk, *dv, *dout;
    assert_int_equal(fa_malloc(ctx, qn * es, &dq), FA_SUCCESS);
    assert_int_equal(fa_malloc(ctx, kn * es, &dk), FA_SUCCESS);
    assert_int_equal(fa_malloc(ctx, kn * es, &dv), FA_SUCCESS);
    assert_int_equal(fa_malloc(ctx, qn * es, &dout), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, dq, hq, qn * es), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, dk, hk, kn * es), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, dv, hv, kn * es), FA_SUCCESS);
    tq.data = dq; tk.data = dk; tv.data = dv; to.data = dout;
    tq.dtype = tk.dtype = tv.dtype = to.dtype = dtype;
    assert_int_equal(fa_forward(ctx, &desc, &tq, &tk, &tv, &to, NULL), FA_SUCCESS);
    assert_int_equal(fa_memcpy_d2h(ctx, out, dout, qn * es), FA_SUCCESS);

    const float kept_value = 1.0f / ((1.0f - p) * NK);
    const float tolerance = dtype == FA_DTYPE_F32 ? 1e-6f : 1e-2f * kept_value;
    size_t dropped = 0;
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h) {
            assert_int_equal(fa_dropout_mask(desc.dropout_seed, desc.dropout_offset, p, H, gq, gk, b, h, keep), FA_SUCCESS);
            for (int i = 0; i < NQ; ++i)
                for (int j = 0; j < NK; ++j) {
                    const size_t at = (((size_t)b * NQ + i) * H + h) * D + j;
                    const float got = from_dtype(out, at, dtype);
                    const int gpu_keep = got > 0.5f * kept_value;
                    const int cpu_keep = cpu_out[at] > 0.5f * kept_value;
                    if (gpu_keep != keep[(size_t)(q0 + i) * (size_t)gk + (size_t)(k0 + j)] || gpu_keep != cpu_keep)
                        fail_msg("dropout mask differs at b=%d h=%d i=%d j=%d", b, h, i, j);
                    if (gpu_keep) assert_true(fabsf(got - kept_value) <= tolerance);
                    dropped += !gpu_keep;
                }
        }
    assert_true(dropped > 0 && dropped < (size_t)B * H * NQ * NK); /* the mask is not trivial */
    fa_free(ctx, dq); fa_free(ctx, dk); fa_free(ctx, dv); fa_free(ctx, dout);
    free(q); free(k); free(v); free(out); free(cpu_out); free(keep); free(hq); free(hk); free(hv);
}
static void test_dropout_mask_matches_cpu(void **state) { check_dropout_mask(state, FA_DTYPE_F32, 0); }
static void test_dropout_mask_matches_cpu_f16(void **state) { check_dropout_mask(state, FA_DTYPE_F16, 0); }
static void test_dropout_mask_matches_cpu_bf16(void **state) { check_dropout_mask(state, FA_DTYPE_BF16, 0); }
static void test_block_dropout_mask_matches_cpu(void **state) { check_dropout_mask(state, FA_DTYPE_F32, 1); }
static void test_block_dropout_mask_matches_cpu_f16(void **state) { check_dropout_mask(state, FA_DTYPE_F16, 1); }
static void test_block_dropout_mask_matches_cpu_bf16(void **state) { check_dropout_mask(state, FA_DTYPE_BF16, 1); }

/* Keys hidden by padding take no part in the result whatever they hold: NaN in K and V past
 * seqlens_k must leave out, lse and the gradients finite, and dk, dv of the padded keys zero
 * (the semantics tests/hardening checks on the CPU), in f32 and in f16/bf16 (the tile-MMA kernels
 * when forced). Two sequences, one short, head dim 64. */
static void check_nan_in_padded_keys(void **state, fa_dtype dtype)
{
    fa_context *ctx = context_or_skip(state);
    enum { B = 2, H = 1, NQ = 20, NK = 70, D = 64 };
    static const int32_t seqlens[B] = {5, 70};
    const size_t qn = (size_t)B * NQ * H * D, kn = (size_t)B * NK * H * D, es = dtype_size(dtype);
    float *host[8];
    const size_t counts[8] = {qn, kn, kn, qn, qn, qn, kn, kn}; /* q k v out dout dq dk dv */
    for (int t = 0; t < 8; ++t) {
        host[t] = calloc(counts[t], sizeof(float));
        assert_non_null(host[t]);
    }
    for (size_t e = 0; e < qn; ++e) host[0][e] = (float)((e * 7) % 11) / 11.0f - 0.5f;
    for (size_t e = 0; e < qn; ++e) host[4][e] = (float)((e * 5) % 13) / 13.0f - 0.5f;
    for (int b = 0; b < B; ++b)
        for (int j = 0; j < NK; ++j)
            for (int x = 0; x < D; ++x) {
                const size_t at = ((size_t)b * NK + j) * D + x;
                host[1][at] = j >= seqlens[b] ? NAN : (float)((at * 3) % 17) / 17.0f - 0.5f;
                host[2][at] = j >= seqlens[b] ? NAN : (float)((at * 11) % 19) / 19.0f - 0.5f;
            }
    void *dev[8];
    fa_tensor t[8];
    const int64_t seqlen[8] = {NQ, NK, NK, NQ, NQ, NQ, NK, NK};
    for (int i = 0; i < 8; ++i) {
        assert_int_equal(fa_malloc(ctx, counts[i] * es, &dev[i]), FA_SUCCESS);
        void *staged = to_dtype(host[i], counts[i], dtype);
        assert_int_equal(fa_memcpy_h2d(ctx, dev[i], staged, counts[i] * es), FA_SUCCESS);
        free(staged);
        const fa_tensor ti = {dev[i], dtype, B, seqlen[i], H, D, 0, 0, 0};
        t[i] = ti;
    }
    float *lse_dev;
    assert_int_equal(fa_malloc(ctx, (size_t)B * H * NQ * sizeof(float), (void **)&lse_dev), FA_SUCCESS);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.seqlens_k = seqlens;
    assert_int_equal(fa_forward(ctx, &desc, &t[0], &t[1], &t[2], &t[3], lse_dev), FA_SUCCESS);
    assert_int_equal(fa_backward(ctx, &desc, &t[0], &t[1], &t[2], &t[3], &t[4], lse_dev, &t[5], &t[6], &t[7]),
                     FA_SUCCESS);
    float lse[B * H * NQ];
    assert_int_equal(fa_memcpy_d2h(ctx, lse, lse_dev, sizeof lse), FA_SUCCESS);
    for (size_t i = 0; i < sizeof lse / sizeof lse[0]; ++i) assert_true(isfinite(lse[i]));
    static const char *const names[8] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
    for (int i = 3; i < 8; ++i) {
        if (i == 4) continue;
        void *back = malloc(counts[i] * es);
        assert_non_null(back);
        assert_int_equal(fa_memcpy_d2h(ctx, back, dev[i], counts[i] * es), FA_SUCCESS);
        for (size_t e = 0; e < counts[i]; ++e) {
            const float x = from_dtype(back, e, dtype);
            if (!isfinite(x)) fail_msg("%s[%zu] = %g: a padded key's NaN leaked", names[i], e, (double)x);
            const int padded_key = i >= 6 && (int)((e / D) % NK) >= seqlens[e / ((size_t)NK * D)];
            if (padded_key && x != 0.0f) fail_msg("%s[%zu] = %g of a padded key is not zero", names[i], e, (double)x);
        }
        free(back);
    }
    for (int i = 0; i < 8; ++i) {
        fa_free(ctx, dev[i]);
        free(host[i]);
    }
    fa_free(ctx, lse_dev);
}
static void test_nan_in_padded_keys_f32(void **state) { check_nan_in_padded_keys(state, FA_DTYPE_F32); }
static void test_nan_in_padded_keys_f16(void **state) { check_nan_in_padded_keys(state, FA_DTYPE_F16); }
static void test_nan_in_padded_keys_bf16(void **state) { check_nan_in_padded_keys(state, FA_DTYPE_BF16); }

/* Tiling comes from the device's shared memory; info names the device; NULL stream accepted. */
static void test_context_services(void **state)
{
    fa_context *ctx = context_or_skip(state);
    fa_tiling t;
    int64_t sram = 0;
    static const int64_t dims[] = {32, 64, 128, 256};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; ++i) {
        assert_int_equal(fa_context_tiling(ctx, dims[i], FA_DTYPE_F16, &t, &sram), FA_SUCCESS);
        assert_true(t.block_rows >= 8 && t.block_cols >= 8 && sram >= 16384);
        print_message("%s d=%lld: Br=%lld Bc=%lld from M=%lld elements\n", fa_backend_name(fa_context_backend(ctx)),
                      (long long)dims[i], (long long)t.block_rows, (long long)t.block_cols, (long long)sram);
    }
    assert_int_equal(fa_context_tiling(ctx, 512, FA_DTYPE_F16, &t, &sram), FA_ERROR_NOT_SUPPORTED);
    const char *info = fa_context_info(ctx);
    assert_non_null(info);
    assert_true(strstr(info, fa_backend_name(fa_context_backend(ctx))) == info);
    print_message("%s\n", info);
    /* A forced kernel family (tests gpu_*_generic, gpu_*_tc, gpu_*_fma) must be the one the
     * context runs; unforced, the vendor's default: tc on CUDA, generic on HIP. */
    const char *family = getenv("FLASHATTN_GPU_KERNELS");
    char expect[64];
    if (family && *family) snprintf(expect, sizeof expect, "kernels: FLASHATTN_GPU_KERNELS=%s", family);
    else snprintf(expect, sizeof expect, "kernels: %s", fa_context_backend(ctx) == FA_BACKEND_CUDA ? "tc for" : "generic");
    if (!strstr(info, expect)) fail_msg("info does not name the kernels \"%s\": %s", expect, info);
    assert_int_equal(fa_context_set_stream(ctx, NULL), FA_SUCCESS);
    assert_int_equal(fa_synchronize(ctx), FA_SUCCESS);
}

/* Runs everywhere: an unavailable GPU backend refuses with BACKEND_UNAVAILABLE and a message
 * that names the backend and what is missing; an available one creates a context. */
static void test_unavailable_is_explained(void **state)
{
    gpu_fixture *f = *state;
    fa_context *ctx = NULL;
    const fa_status st = fa_context_create(f->backend, 0, &ctx);
    if (fa_backend_available(f->backend)) {
        assert_int_equal(st, FA_SUCCESS);
        fa_context_destroy(ctx);
        return;
    }
    assert_int_equal(st, FA_ERROR_BACKEND_UNAVAILABLE);
    assert_null(ctx);
    const char *why = fa_last_error();
    print_message("%s unavailable: %s\n", fa_backend_name(f->backend), why);
    assert_non_null(strstr(why, fa_backend_name(f->backend)));
    assert_true(strlen(why) > strlen(fa_backend_name(f->backend)) + 20);
}

#define GPU_KERNEL_TESTS(setup)                                                                   \
    cmocka_unit_test_setup_teardown(test_context_services, setup, teardown),                     \
    cmocka_unit_test_setup_teardown(test_case_table_f32, setup, teardown),                       \
    cmocka_unit_test_setup_teardown(test_case_table_f16, setup, teardown),                       \
    cmocka_unit_test_setup_teardown(test_case_table_bf16, setup, teardown),                      \
    cmocka_unit_test_setup_teardown(test_dropout_mask_matches_cpu, setup, teardown),                \
    cmocka_unit_test_setup_teardown(test_dropout_mask_matches_cpu_f16, setup, teardown),            \
    cmocka_unit_test_setup_teardown(test_dropout_mask_matches_cpu_bf16, setup, teardown),           \
    cmocka_unit_test_setup_teardown(test_block_dropout_mask_matches_cpu, setup, teardown),          \
    cmocka_unit_test_setup_teardown(test_block_dropout_mask_matches_cpu_f16, setup, teardown),      \
    cmocka_unit_test_setup_teardown(test_block_dropout_mask_matches_cpu_bf16, setup, teardown),     \
    cmocka_unit_test_setup_teardown(test_nan_in_padded_keys_f32, setup, teardown),                  \
    cmocka_unit_test_setup_teardown(test_nan_in_padded_keys_f16, setup, teardown),                  \
    cmocka_unit_test_setup_teardown(test_nan_in_padded_keys_bf16, setup, teardown),                 \
    GPU_VARLEN_KVCACHE_TESTS(setup, teardown),                                                   \
    GPU_POSITIONS_TESTS(setup, teardown),                                                        \
    GPU_MERGE_TESTS(setup, teardown),                                                            \
    GPU_SERVING_TESTS(setup, teardown),                                                          \
    GPU_REPEAT_TESTS(setup, teardown)

/* Exit status 77 tells meson the test was skipped. */
enum { EXIT_SKIPPED = 77 };

/* usage: test_gpu_backends unavailable | cuda | hip [test-name pattern]
 *   unavailable  the availability checks of both backends (they pass with or without a GPU)
 *   cuda, hip    that backend's kernels; every test skip()s without a device, and the program
 *                then exits 77 so meson reports SKIP rather than OK (with FLASHATTN_REQUIRE_GPU=1
 *                they fail instead)
 * A pattern (cmocka's, e.g. "test_case_table_f16") runs only the tests it matches. */
int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (argc > 2) cmocka_set_test_filter(argv[2]);
    if (strcmp(mode, "unavailable") == 0) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test_setup_teardown(test_unavailable_is_explained, setup_cuda, teardown),
            cmocka_unit_test_setup_teardown(test_unavailable_is_explained, setup_hip, teardown),
        };
        return cmocka_run_group_tests_name("availability", tests, NULL, NULL);
    }
    fa_backend backend;
    int failed;
    if (strcmp(mode, "cuda") == 0) {
        const struct CMUnitTest tests[] = {GPU_KERNEL_TESTS(setup_cuda)};
        backend = FA_BACKEND_CUDA;
        failed = cmocka_run_group_tests_name("cuda", tests, NULL, NULL);
    } else if (strcmp(mode, "hip") == 0) {
        const struct CMUnitTest tests[] = {GPU_KERNEL_TESTS(setup_hip)};
        backend = FA_BACKEND_HIP;
        failed = cmocka_run_group_tests_name("hip", tests, NULL, NULL);
    } else {
        fprintf(stderr, "usage: %s unavailable|cuda|hip\n", argv[0]);
        return 2;
    }
    if (failed) return failed;
    if (!fa_backend_available(backend)) return gpu_required() ? 1 : EXIT_SKIPPED;
    return 0;
}

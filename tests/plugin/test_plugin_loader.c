/* Every return path of the plugin loader (src/common/registry.c), seen through the public API with
 * the fake plugin (fake_plugin.c) standing in for the CUDA one. The registry probes a plugin once
 * per process, so each branch is its own run: argv[1] names it, tests/plugin/meson.build sets
 * FLASHATTN_PLUGIN_DIR and FA_FAKE_PLUGIN_MODE. not_found and dlopen_fails make their own plugin
 * folder (empty, or holding a garbage libflashattn-cuda.so). */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/backend.h" /* FA_BACKEND_ABI_VERSION, FA_BACKEND_ABI_OLDEST, FA_PLUGIN_ENTRY_NAME */

static const char *branch;
static char plugin_path[1024]; /* FLASHATTN_PLUGIN_DIR/libflashattn-cuda.so */
static char temp_dir[512];     /* made by this run, removed at exit; "" if none */

/* ---- load failures: CUDA unavailable with one reason, AUTO falls back --------------------------- */

/* The exact one-line reason the registry gives for this run's branch; NULL where only its start
 * is fixed (prefix is set). */
static const char *expected_reason(char *buf, size_t size, char *prefix, size_t prefix_size)
{
    const unsigned abi = FA_BACKEND_ABI_VERSION, oldest = FA_BACKEND_ABI_OLDEST;
    prefix[0] = '\0';
    if (strcmp(branch, "not_found") == 0) {
        snprintf(prefix, prefix_size, "cuda backend unavailable: plugin libflashattn-cuda.so not found (searched %s, ",
                 temp_dir);
        return NULL;
    }
    if (strcmp(branch, "dlopen_fails") == 0) { /* then dlerror(), which starts with the path */
        snprintf(prefix, prefix_size, "cuda backend unavailable: %s: ", plugin_path);
        return NULL;
    }
    if (strcmp(branch, "no_entry") == 0)
        snprintf(buf, size, "cuda backend unavailable: %s does not export %s", plugin_path, FA_PLUGIN_ENTRY_NAME);
    else if (strcmp(branch, "refuse") == 0)
        snprintf(buf, size, "cuda backend unavailable: %s refused plugin ABI versions %u to %u (%s returned NULL); rebuild the plugin",
                 plugin_path, abi, oldest, FA_PLUGIN_ENTRY_NAME);
    else if (strcmp(branch, "abi_older") == 0)
        snprintf(buf, size, "cuda backend unavailable: %s has plugin ABI version %u, older than the oldest this library loads (%u); rebuild the plugin",
                 plugin_path, oldest - 1, oldest);
    else if (strcmp(branch, "abi_newer") == 0)
        snprintf(buf, size, "cuda backend unavailable: %s has plugin ABI version %u, newer than this library's %u; rebuild the plugin",
                 plugin_path, abi + 1, abi);
    else if (strcmp(branch, "wrong_kind") == 0)
        snprintf(buf, size, "cuda backend unavailable: %s is a hip plugin (backend kind %d), not a cuda one", plugin_path,
                 (int)FA_BACKEND_HIP);
    else if (strcmp(branch, "no_supports") == 0)
        snprintf(buf, size, "cuda backend unavailable: %s has plugin ABI version %u but no supports()", plugin_path, abi);
    else if (strcmp(branch, "no_devices") == 0)
        snprintf(buf, size, "cuda backend unavailable: fake test plugin at %s, no devices", plugin_path);
    else
        fail_msg("unknown branch '%s'", branch);
    return buf;
}

static void assert_reason(const char *what)
{
    char buf[2048], prefix[2048];
    const char *msg = fa_last_error();
    print_message("%s: %s\n", what, msg);
    const char *expected = expected_reason(buf, sizeof buf, prefix, sizeof prefix);
    if (expected && strcmp(msg, expected) != 0) fail_msg("%s: expected '%s'", what, expected);
    if (!expected && strncmp(msg, prefix, strlen(prefix)) != 0) fail_msg("%s: expected it to start with '%s'", what, prefix);
    if (strchr(msg, '\n')) fail_msg("%s: the reason is not one line", what);
}

static void test_cuda_unavailable(void **state)
{
    (void)state;
    assert_int_equal(fa_backend_available(FA_BACKEND_CUDA), 0);
    assert_reason("fa_backend_available(cuda)");
    fa_context *ctx = (fa_context *)&ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CUDA, 0, &ctx), FA_ERROR_BACKEND_UNAVAILABLE);
    assert_null(ctx);
    assert_reason("fa_context_create(cuda)"); /* the cached probe gives the same reason again */
    assert_int_equal(setenv("FLASHATTN_BACKEND", "cuda", 1), 0);
    ctx = (fa_context *)&ctx;
    const fa_status st = fa_context_create(FA_BACKEND_AUTO, 0, &ctx);
    assert_int_equal(unsetenv("FLASHATTN_BACKEND"), 0);
    assert_int_equal(st, FA_ERROR_BACKEND_UNAVAILABLE);
    assert_null(ctx);
    assert_reason("FLASHATTN_BACKEND=cuda");
}

static void test_auto_falls_back(void **state)
{
    (void)state;
    const fa_backend expected = fa_backend_available(FA_BACKEND_HIP) ? FA_BACKEND_HIP : FA_BACKEND_CPU;
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_AUTO, 0, &ctx), FA_SUCCESS);
    assert_int_equal(fa_context_backend(ctx), expected);
    fa_context_destroy(ctx);
}

/* ---- working mode: a plugin failure reaches the caller, the context stays usable -------------- */

enum { BATCH = 2, SEQ_Q = 3, SEQ_K = 5, HEADS_Q = 2, HEADS_KV = 1, DIM = 4 };

typedef struct device_tensor {
    fa_tensor t;
    float host[BATCH * SEQ_K * HEADS_Q * DIM]; /* the largest tensor here */
    size_t count;
} device_tensor;

/* count floats in the context's memory, filled with base + their index. */
static void fill_device(fa_context *ctx, device_tensor *d, size_t count, float base)
{
    d->count = count;
    for (size_t i = 0; i < count; ++i) d->host[i] = base + (float)i;
    assert_int_equal(fa_malloc(ctx, count * sizeof(float), &d->t.data), FA_SUCCESS);
    assert_int_equal(fa_memcpy_h2d(ctx, d->t.data, d->host, count * sizeof(float)), FA_SUCCESS);
}

/* A packed f32 tensor in the context's memory, filled with base + its element index. */
static void make_tensor(fa_context *ctx, device_tensor *d, int64_t seqlen, int64_t heads, float base)
{
    d->t = (fa_tensor){.dtype = FA_DTYPE_F32, .batch = BATCH, .seqlen = seqlen, .heads = heads, .head_dim = DIM};
    fill_device(ctx, d, (size_t)(BATCH * seqlen * heads * DIM), base);
}

/* The tensor's contents equal src's host copy. */
static void assert_same(fa_context *ctx, const device_tensor *d, const device_tensor *src, const char *name)
{
    float got[sizeof d->host / sizeof d->host[0]];
    assert_int_equal(fa_memcpy_d2h(ctx, got, d->t.data, d->count * sizeof(float)), FA_SUCCESS);
    assert_int_equal(d->count, src->count);
    if (memcmp(got, src->host, d->count * sizeof(float)) != 0) fail_msg("%s: not what the fake plugin writes", name);
}

static void expect_failure_then_success(fa_status first, fa_status second, const char *call)
{
    char expected[128];
    snprintf(expected, sizeof expected, "fake test plugin: %s fails on its first call (by design)", call);
    assert_int_equal(first, FA_ERROR_BACKEND_FAILURE);
    print_message("first %s: %s\n", call, fa_last_error());
    assert_string_equal(fa_last_error(), expected);
    assert_int_equal(second, FA_SUCCESS);
}

static void test_failing_calls_leave_context_usable(void **state)
{
    (void)state;
    assert_int_equal(fa_backend_available(FA_BACKEND_CUDA), 1);
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_AUTO, 0, &ctx), FA_SUCCESS); /* AUTO prefers CUDA */
    assert_int_equal(fa_context_backend(ctx), FA_BACKEND_CUDA);
    char info[1100];
    snprintf(info, sizeof info, "fake test plugin at %s, working mode", plugin_path);
    assert_string_equal(fa_context_info(ctx), info);

    device_tensor q, k, v, out, dout, dq, dk, dv, lse;
    make_tensor(ctx, &q, SEQ_Q, HEADS_Q, 1000);
    make_tensor(ctx, &k, SEQ_K, HEADS_KV, 2000);
    make_tensor(ctx, &v, SEQ_K, HEADS_KV, 3000);
    make_tensor(ctx, &out, SEQ_Q, HEADS_Q, -1);
    make_tensor(ctx, &dout, SEQ_Q, HEADS_Q, 4000);
    make_tensor(ctx, &dq, SEQ_Q, HEADS_Q, -1);
    make_tensor(ctx, &dk, SEQ_K, HEADS_KV, -1);
    make_tensor(ctx, &dv, SEQ_K, HEADS_KV, -1);
    fill_device(ctx, &lse, BATCH * HEADS_Q * SEQ_Q, -1);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);

    /* The core refuses what the plugin does not declare, before calling it (its call count stays 0). */
    fa_attention_desc block = desc;
    block.k_offset = 1;
    block.seqlen_k_global = SEQ_K + 1;
    assert_int_equal(fa_forward(ctx, &block, &q.t, &k.t, &v.t, &out.t, lse.t.data), FA_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(fa_last_error(), "the fake backend does not implement block positions"));
    const fa_tensor *parts[1] = {&q.t};
    const float *part_lse[1] = {lse.t.data};
    /* No device merge: this plugin has none (merge_partials NULL), or, as abi_previous, is of an
     * ABI that predates it (the registry must not read that member: the fake aborts if called). */
    assert_int_equal(fa_merge_partials(ctx, 1, parts, part_lse, &out.t, NULL), FA_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(fa_last_error(), "fa_merge_partials: the fake backend's tensors are device memory and it has no device merge"));

    /* No caller workspace: the plugin has no set_workspace (or, as abi_previous, predates it). */
    assert_int_equal(fa_context_set_workspace(ctx, q.t.data, 64), FA_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(fa_last_error(), "predates caller workspaces"));

    const fa_status forward1 = fa_forward(ctx, &desc, &q.t, &k.t, &v.t, &out.t, lse.t.data);
    const fa_status forward2 = fa_forward(ctx, &desc, &q.t, &k.t, &v.t, &out.t, lse.t.data);
    expect_failure_then_success(forward1, forward2, "forward");
    assert_int_equal(fa_synchronize(ctx), FA_SUCCESS);
    assert_same(ctx, &out, &q, "out");
    device_tensor row_index;
    row_index.count = lse.count;
    for (size_t i = 0; i < lse.count; ++i) row_index.host[i] = (float)i;
    assert_same(ctx, &lse, &row_index, "lse");

    const fa_status backward1 = fa_backward(ctx, &desc, &q.t, &k.t, &v.t, &out.t, &dout.t, lse.t.data, &dq.t, &dk.t, &dv.t);
    const fa_status backward2 = fa_backward(ctx, &desc, &q.t, &k.t, &v.t, &out.t, &dout.t, lse.t.data, &dq.t, &dk.t, &dv.t);
    expect_failure_then_success(backward1, backward2, "backward");
    assert_int_equal(fa_synchronize(ctx), FA_SUCCESS);
    assert_same(ctx, &dq, &dout, "dq");
    assert_same(ctx, &dk, &k, "dk");
    assert_same(ctx, &dv, &v, "dv");

    device_tensor *all[] = {&q, &k, &v, &out, &dout, &dq, &dk, &dv, &lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) assert_int_equal(fa_free(ctx, all[i]->t.data), FA_SUCCESS);
    fa_context_destroy(ctx);
}

/* A plugin of ABI 7 loads and runs what it knew, but the core refuses it what ABI 8 added to the
 * KV-cache problem (quantised caches, rotary embeddings) and never reads its missing
 * kvcache_append (the fake aborts if it is called). */
static void test_abi7_plugin_refuses_newer_kvcache(void **state)
{
    (void)state;
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CUDA, 0, &ctx), FA_SUCCESS);
    device_tensor q, k, v, out;
    make_tensor(ctx, &q, SEQ_Q, HEADS_Q, 1000);
    make_tensor(ctx, &k, SEQ_K, HEADS_KV, 2000);
    make_tensor(ctx, &v, SEQ_K, HEADS_KV, 3000);
    make_tensor(ctx, &out, SEQ_Q, HEADS_Q, -1);
    int32_t *lens = NULL;
    assert_int_equal(fa_malloc(ctx, BATCH * sizeof(int32_t), (void **)&lens), FA_SUCCESS);
    fa_kv_cache cache = {k.t, v.t, NULL, 0, lens};
    cache.k.dtype = FA_DTYPE_FP8_E4M3; /* a quantised cache: any bytes will do, nothing runs */
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    assert_int_equal(fa_forward_kvcache(ctx, &desc, &q.t, &cache, NULL, NULL, &out.t, NULL), FA_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(fa_last_error(), "the fake plugin predates quantised caches (rebuild it)"));

    cache.k.dtype = k.t.dtype;
    fa_rotary rotary;
    fa_rotary_init(&rotary);
    rotary.cos = rotary.sin = (const float *)(const void *)out.t.data; /* any device floats: never read */
    rotary.max_position = 4;
    rotary.rotary_dim = 2;
    desc.rotary = &rotary;
    assert_int_equal(fa_forward_kvcache(ctx, &desc, &q.t, &cache, NULL, NULL, &out.t, NULL), FA_ERROR_NOT_SUPPORTED);
    assert_non_null(strstr(fa_last_error(), "the fake plugin predates rotary embeddings (rebuild it)"));

    desc.rotary = NULL; /* the append itself: refused by its supports() (no KV-cache path), never called */
    assert_int_equal(fa_kvcache_append(ctx, &desc, &cache, NULL, &k.t, &v.t), FA_ERROR_NOT_SUPPORTED);
    device_tensor *all[] = {&q, &k, &v, &out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) assert_int_equal(fa_free(ctx, all[i]->t.data), FA_SUCCESS);
    assert_int_equal(fa_free(ctx, lens), FA_SUCCESS);
    fa_context_destroy(ctx);
}

/* ---- plugin folders made by the test ---------------------------------------------------------- */

static void remove_temp_dir(void)
{
    if (!temp_dir[0]) return;
    char file[1100];
    snprintf(file, sizeof file, "%s/libflashattn-cuda.so", temp_dir);
    unlink(file);
    rmdir(temp_dir);
}

/* FLASHATTN_PLUGIN_DIR = a new empty folder, with a garbage libflashattn-cuda.so when asked. */
static int make_plugin_dir(int with_garbage)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(temp_dir, sizeof temp_dir, "%s/flashattn-plugin-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(temp_dir)) {
        temp_dir[0] = '\0';
        return perror("mkdtemp"), -1;
    }
    atexit(remove_temp_dir);
    if (with_garbage) {
        char file[1100];
        snprintf(file, sizeof file, "%s/libflashattn-cuda.so", temp_dir);
        FILE *f = fopen(file, "wb");
        if (!f) return perror(file), -1;
        for (int i = 0; i < 256; ++i) fputs("not a shared object ", f);
        if (fclose(f) != 0) return perror(file), -1;
    }
    return setenv("FLASHATTN_PLUGIN_DIR", temp_dir, 1);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s not_found|dlopen_fails|no_entry|refuse|abi_older|abi_newer|abi_previous|abi_7|wrong_kind|no_supports|no_devices|working\n",
                argv[0]);
        return 2;
    }
    branch = argv[1];
    if (unsetenv("FLASHATTN_BACKEND") != 0) return 2;
    if ((strcmp(branch, "not_found") == 0 || strcmp(branch, "dlopen_fails") == 0) &&
        make_plugin_dir(strcmp(branch, "dlopen_fails") == 0) != 0)
        return 2;
    const char *dir = getenv("FLASHATTN_PLUGIN_DIR");
    if (!dir || !dir[0]) {
        fprintf(stderr, "FLASHATTN_PLUGIN_DIR must name the fake plugin's folder\n");
        return 2;
    }
    snprintf(plugin_path, sizeof plugin_path, "%s/libflashattn-cuda.so", dir);

    if (strcmp(branch, "abi_7") == 0) {
        const struct CMUnitTest tests[] = {cmocka_unit_test(test_abi7_plugin_refuses_newer_kvcache)};
        return cmocka_run_group_tests_name("abi_7", tests, NULL, NULL);
    }
    if (strcmp(branch, "working") == 0 || strcmp(branch, "abi_previous") == 0) {
        const struct CMUnitTest tests[] = {cmocka_unit_test(test_failing_calls_leave_context_usable)};
        return cmocka_run_group_tests_name("working", tests, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_unavailable),
        cmocka_unit_test(test_auto_falls_back),
    };
    return cmocka_run_group_tests_name(branch, tests, NULL, NULL);
}

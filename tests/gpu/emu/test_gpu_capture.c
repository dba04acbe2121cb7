/* fa_forward_kvcache captured into a graph, on an emulated plugin (emu_runtime.h, "stream
 * capture"): with the caller's workspace (fa_workspace_size, fa_context_set_workspace) and the
 * tables in device memory, a ragged serving step and a padded decode step enqueue only kernel
 * launches while the stream is capturing (an allocation, copy, memset or synchronisation would be
 * refused and named); nothing runs until the graph is replayed, and each replay gives the bits of
 * the uncaptured call. A context left with the plugin's own (empty) workspace cannot be captured:
 * the emulator names what the call tried. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
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
#include "kv_scene.h"

typedef int (*begin_fn)(void *stream);
typedef int (*end_fn)(char *why, size_t size);
typedef int (*replay_fn)(void);

static fa_backend backend_under_test(void)
{
    const char *name = getenv("FA_CAPTURE_BACKEND");
    return name && !strcmp(name, "hip") ? FA_BACKEND_HIP : FA_BACKEND_CUDA;
}

/* The emulator's capture entry points, from the plugin the registry loaded. */
typedef struct capture_api {
    begin_fn begin;
    end_fn end;
    replay_fn replay;
} capture_api;

static capture_api capture_api_of(void)
{
    const char *dir = getenv("FLASHATTN_PLUGIN_DIR");
    assert_non_null(dir);
    char path[1024];
    snprintf(path, sizeof path, "%s/libflashattn-%s.so", dir, backend_under_test() == FA_BACKEND_HIP ? "hip" : "cuda");
    void *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!handle) fail_msg("%s is not loaded: %s", path, dlerror());
    capture_api api;
    *(void **)&api.begin = dlsym(handle, "fa_emu_begin_capture");
    *(void **)&api.end = dlsym(handle, "fa_emu_end_capture");
    *(void **)&api.replay = dlsym(handle, "fa_emu_replay");
    assert_true(api.begin && api.end && api.replay);
    dlclose(handle); /* the registry keeps it loaded */
    return api;
}

static const kv_seq step[] = {{300, 1, 1, 1}, {20, 6, 6, 2}, {0, 2, 2, 3}, {120, 0, 4, 4}};
#define STEP_N (int)(sizeof step / sizeof step[0])
static const kv_layout layout = {FA_DTYPE_F16, 4, 2, 32, 320, 16};
static char stream_token; /* the emulator's streams are opaque non-NULL handles */

static void expect_untouched(kv_scene *s)
{
    for (int b = 0; b < s->n; ++b) {
        kv_seq_result r;
        kv_scene_result(s, b, 1, &r);
        const uint16_t *out = r.out;
        for (size_t e = 0; e < r.out_bytes / 2; ++e)
            if ((out[e] & 0x7c00) != 0x7c00 || !(out[e] & 0x03ff)) fail_msg("out written before the graph ran");
        kv_seq_result_free(&r);
    }
}

static void capture_case(int ragged)
{
    fa_context *plain, *ctx;
    assert_int_equal(fa_context_create(backend_under_test(), 0, &plain), FA_SUCCESS);
    assert_int_equal(fa_context_create(backend_under_test(), 0, &ctx), FA_SUCCESS);
    const capture_api api = capture_api_of();
    kv_seq seqs[STEP_N];
    memcpy(seqs, step, sizeof seqs);
    if (!ragged)
        for (int b = 0; b < STEP_N; ++b) seqs[b].queries = seqs[b].fresh = 1; /* a padded decode step */
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;

    kv_scene want, got;
    kv_scene_build(&want, plain, &layout, seqs, STEP_N);
    kv_scene_build(&got, ctx, &layout, seqs, STEP_N);
    if (kv_scene_run(&want, &desc, ragged, NULL) != FA_SUCCESS || fa_synchronize(plain) != FA_SUCCESS)
        fail_msg("uncaptured: %s", fa_last_error());

    /* The caller's workspace, sized by the query with the call's own arguments. */
    fa_kv_cache cache;
    memset(&cache, 0, sizeof cache);
    cache.k = (fa_tensor){got.k_cache, layout.dtype, got.slots, got.slot_len, layout.heads_kv, layout.head_dim, 0, 0, 0};
    cache.v = cache.k;
    cache.v.data = got.v_cache;
    cache.cache_seqlens = got.cached_dev;
    cache.block_table = got.table_dev;
    cache.max_pages_per_seq = got.max_pages;
    const int64_t batch = ragged ? 1 : STEP_N, queries = ragged ? got.total_q : 1, fresh = ragged ? got.total_new : 1;
    const fa_tensor q = {got.q, layout.dtype, batch, queries, layout.heads_q, layout.head_dim, 0, 0, 0};
    const fa_tensor k_new = {got.k_new, layout.dtype, batch, fresh, layout.heads_kv, layout.head_dim, 0, 0, 0};
    fa_tensor out = q;
    out.data = got.out;
    fa_varlen vl = {STEP_N, got.cu_q_dev, got.cu_new_dev, 6, 6};
    fa_attention_desc sized = desc;
    if (ragged) sized.varlen = &vl;
    size_t bytes = 0;
    assert_int_equal(fa_workspace_size(ctx, &sized, &q, &cache, NULL, &k_new, &k_new, &out, got.lse, &bytes), FA_SUCCESS);
    assert_true(bytes > 0);
    void *small = NULL, *workspace = NULL;
    assert_int_equal(fa_malloc(ctx, bytes - 256, &small), FA_SUCCESS);
    assert_int_equal(fa_malloc(ctx, bytes, &workspace), FA_SUCCESS);
    /* One that is too small: refused by name, nothing written. */
    assert_int_equal(fa_context_set_workspace(ctx, small, bytes - 256), FA_SUCCESS);
    assert_int_equal(kv_scene_run(&got, &desc, ragged, NULL), FA_ERROR_INVALID_VALUE);
    if (!strstr(fa_last_error(), "workspace")) fail_msg("unexpected message: %s", fa_last_error());
    expect_untouched(&got);
    assert_int_equal(fa_context_set_workspace(ctx, workspace, bytes), FA_SUCCESS);
    assert_int_equal(fa_context_set_stream(ctx, &stream_token), FA_SUCCESS);

    assert_int_equal(api.begin(&stream_token), 0);
    const fa_status st = kv_scene_run(&got, &desc, ragged, NULL);
    char why[256];
    const int launches = api.end(why, sizeof why);
    if (st != FA_SUCCESS || launches < 0)
        fail_msg("captured call: %s; the emulator: %s", fa_status_string(st), launches < 0 ? why : "no refusal");
    assert_true(launches >= 3); /* table check, append, attention, merge */
    expect_untouched(&got);
    for (int replay = 0; replay < 2; ++replay) { /* a graph replays: the append rewrites the same slots */
        assert_int_equal(api.replay(), launches);
        assert_int_equal(fa_synchronize(ctx), FA_SUCCESS);
        kv_scene_forget(&got);
        for (int b = 0; b < STEP_N; ++b) {
            kv_seq_result a, w;
            kv_scene_result(&got, b, ragged, &a);
            kv_scene_result(&want, b, ragged, &w);
            char what[64];
            snprintf(what, sizeof what, "%s replay %d, sequence %d", ragged ? "ragged" : "decode", replay, b);
            kv_expect_same(&a, &w, what);
            kv_seq_result_free(&a);
            kv_seq_result_free(&w);
        }
    }
    assert_int_equal(fa_context_set_stream(ctx, NULL), FA_SUCCESS);
    assert_int_equal(fa_context_set_workspace(ctx, NULL, 0), FA_SUCCESS);
    kv_scene_free(&got);
    kv_scene_free(&want);
    fa_free(ctx, small);
    fa_free(ctx, workspace);
    fa_context_destroy(ctx);
    fa_context_destroy(plain);
}

static void test_capture_ragged(void **state)
{
    (void)state;
    capture_case(1);
}

static void test_capture_decode(void **state)
{
    (void)state;
    capture_case(0);
}

/* The plugin's own workspace starts empty: the first call grows it (a synchronisation and an
 * allocation), which a capture refuses; the emulator names it and the call fails. */
static void test_capture_refuses_growth(void **state)
{
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(backend_under_test(), 0, &ctx), FA_SUCCESS);
    const capture_api api = capture_api_of();
    kv_scene s;
    kv_scene_build(&s, ctx, &layout, step, STEP_N);
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    assert_int_equal(fa_context_set_stream(ctx, &stream_token), FA_SUCCESS);
    assert_int_equal(api.begin(&stream_token), 0);
    const fa_status st = kv_scene_run(&s, &desc, 1, NULL);
    char why[256];
    const int launches = api.end(why, sizeof why);
    print_message("  refused: %s (the call: %s)\n", why, fa_last_error());
    assert_int_not_equal(st, FA_SUCCESS);
    assert_int_equal(launches, -1);
    assert_non_null(strstr(why, "during stream capture"));
    assert_int_equal(fa_context_set_stream(ctx, NULL), FA_SUCCESS);
    kv_scene_free(&s);
    fa_context_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture_ragged),
        cmocka_unit_test(test_capture_decode),
        cmocka_unit_test(test_capture_refuses_growth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

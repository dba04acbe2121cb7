/* Allocation failures: the library's allocator hook fails the k-th host allocation, and k walks
 * over every allocation that context creation, fa_malloc, fa_forward, fa_backward and
 * fa_forward_kvcache (decode path, and the per-sequence path of score modifiers) make.
 * Each failing call must return FA_ERROR_OUT_OF_MEMORY with a message, leak nothing (checked by
 * LeakSanitizer in the sanitizer build and by valgrind), write none of its outputs (the CPU
 * passes' out-of-memory protocol, src/cpu/cpu_scratch.h), and leave the library usable: the next
 * call without injection gives bit-identical results to an undisturbed run. A call never
 * reports success with incomplete outputs. White-box: links the core archive for the hook. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "fixture.h"

typedef fa_status (*attention_call)(fa_context *ctx, fixture *f);

/* Runs call with the k-th allocation failing; returns the status. */
static fa_status with_failure(size_t k, attention_call call, fa_context *ctx, fixture *f)
{
    fa_debug_fail_allocation(k);
    const fa_status st = call(ctx, f);
    fa_debug_fail_allocation(0);
    return st;
}

/* Number of host allocations call makes (it must succeed). */
static size_t count_allocations(attention_call call, fa_context *ctx, fixture *f)
{
    fa_debug_fail_allocation(0);
    assert_int_equal(call(ctx, f), FA_SUCCESS);
    return fa_debug_fail_allocation(0);
}

static void assert_out_of_memory(fa_status st, size_t k)
{
    if (st != FA_ERROR_OUT_OF_MEMORY) fail_msg("allocation %zu failed but the call returned %d", k, (int)st);
    assert_true(strlen(fa_last_error()) > 0);
}

/* Walks k over every allocation of fa_forward (and fa_backward when backward) at thread count threads. */
static void walk_attention(int threads, int backward)
{
    const oracle_shape shape = {2, 4, 2, 37, 45, 24};
    fixture got, want;
    assert_true(fixture_init(&got, &shape, FA_DTYPE_F32, 7));
    assert_true(fixture_init(&want, &shape, FA_DTYPE_F32, 7));
    got.desc.causal = want.desc.causal = 1;
    got.desc.dropout_p = want.desc.dropout_p = 0.25f;
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_int_equal(fa_context_set_num_threads(ctx, threads), FA_SUCCESS);

    assert_int_equal(fixture_forward(ctx, &want), FA_SUCCESS);
    if (backward) assert_int_equal(fixture_backward(ctx, &want), FA_SUCCESS);
    attention_call call = fixture_forward;
    if (backward) {
        assert_int_equal(fixture_forward(ctx, &got), FA_SUCCESS);
        call = fixture_backward;
    }
    const size_t n = count_allocations(call, ctx, &got);
    assert_true(n >= 1);
    print_message("threads %d, %s: %zu allocations\n", threads, backward ? "backward" : "forward", n);

    for (size_t k = 1; k <= n + 1; ++k) {
        if (backward) fixture_poison_gradients(&got);
        else fixture_poison_forward(&got);
        const fa_status st = with_failure(k, call, ctx, &got);
        if (k <= n) {
            assert_out_of_memory(st, k);
            if (!(backward ? fixture_gradients_untouched(&got) : fixture_forward_untouched(&got)))
                fail_msg("allocation %zu failed but the call wrote some of its outputs", k);
            /* The library still works after the failure. */
            assert_int_equal(call(ctx, &got), FA_SUCCESS);
        } else {
            assert_int_equal(st, FA_SUCCESS); /* the walk covered every allocation */
        }
        assert_true(backward ? fixture_gradients_identical(&got, &want) : fixture_forward_identical(&got, &want));
    }
    fa_context_destroy(ctx);
    fixture_free(&got);
    fixture_free(&want);
}

static void forward_one_thread(void **state) { (void)state; walk_attention(1, 0); }
static void forward_three_threads(void **state) { (void)state; walk_attention(3, 0); }
static void backward_one_thread(void **state) { (void)state; walk_attention(1, 1); }
static void backward_three_threads(void **state) { (void)state; walk_attention(3, 1); }

static void context_create(void **state)
{
    (void)state;
    fa_context *ctx = NULL;
    fa_debug_fail_allocation(0);
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    const size_t n = fa_debug_fail_allocation(0);
    fa_context_destroy(ctx);
    assert_true(n >= 1);
    for (size_t k = 1; k <= n; ++k) {
        fa_debug_fail_allocation(k);
        ctx = (fa_context *)&ctx; /* must be reset to NULL on failure */
        const fa_status st = fa_context_create(FA_BACKEND_CPU, 0, &ctx);
        fa_debug_fail_allocation(0);
        assert_out_of_memory(st, k);
        assert_null(ctx);
    }
}

static void backend_malloc(void **state)
{
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    void *p = &p;
    fa_debug_fail_allocation(1);
    assert_out_of_memory(fa_malloc(ctx, 1024, &p), 1);
    fa_debug_fail_allocation(0);
    assert_null(p);
    /* Sizes no allocator can give: OUT_OF_MEMORY, never a wrapped-around small block. */
    const size_t huge[] = {SIZE_MAX, SIZE_MAX - 62, SIZE_MAX / 2 + 1};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; ++i) {
        p = &p;
        assert_out_of_memory(fa_malloc(ctx, huge[i], &p), 0);
        assert_null(p);
    }
    assert_int_equal(fa_malloc(ctx, 1024, &p), FA_SUCCESS);
    assert_non_null(p);
    assert_int_equal(fa_free(ctx, p), FA_SUCCESS);
    fa_context_destroy(ctx);
}

/* A KV-cache call (contiguous cache of 64, 40 and 0 tokens cached, 2 new ones, GQA 4:2): the
 * cache must keep every byte and out/lse stay untouched when an allocation fails. */
typedef struct kv_problem {
    float q[2 * 2 * 4 * 16], k_new[2 * 2 * 2 * 16], v_new[2 * 2 * 2 * 16], out[2 * 2 * 4 * 16], lse[2 * 4 * 2];
    float *k_cache, *v_cache;
    int32_t cached[2];
    float sinks[4];
    fa_attention_desc desc;
    fa_tensor tq, tk_new, tv_new, tout;
    fa_kv_cache cache;
} kv_problem;

enum { KV_CACHE_FLOATS = 2 * 64 * 2 * 16 };

static void kv_init(kv_problem *p, int modifiers)
{
    memset(p, 0, sizeof *p);
    p->k_cache = malloc(KV_CACHE_FLOATS * sizeof(float));
    p->v_cache = malloc(KV_CACHE_FLOATS * sizeof(float));
    assert_true(p->k_cache && p->v_cache);
    float *arrays[] = {p->q, p->k_new, p->v_new, p->k_cache, p->v_cache};
    const size_t sizes[] = {sizeof p->q / 4, sizeof p->k_new / 4, sizeof p->v_new / 4, KV_CACHE_FLOATS, KV_CACHE_FLOATS};
    for (size_t a = 0; a < 5; ++a)
        for (size_t i = 0; i < sizes[a]; ++i) arrays[a][i] = (float)((i * 37 + a * 11) % 19) / 19.0f - 0.5f;
    p->cached[0] = 40;
    p->cached[1] = 0;
    fa_attention_desc_init(&p->desc);
    p->desc.causal = 1;
    if (modifiers) {
        for (int h = 0; h < 4; ++h) p->sinks[h] = 0.25f * (float)h;
        p->desc.sinks = p->sinks;
        p->desc.softcap = 5.0f;
    }
    p->tq = (fa_tensor){p->q, FA_DTYPE_F32, 2, 2, 4, 16, 0, 0, 0};
    p->tout = p->tq;
    p->tout.data = p->out;
    p->tk_new = (fa_tensor){p->k_new, FA_DTYPE_F32, 2, 2, 2, 16, 0, 0, 0};
    p->tv_new = p->tk_new;
    p->tv_new.data = p->v_new;
    p->cache.k = (fa_tensor){p->k_cache, FA_DTYPE_F32, 2, 64, 2, 16, 0, 0, 0};
    p->cache.v = p->cache.k;
    p->cache.v.data = p->v_cache;
    p->cache.cache_seqlens = p->cached;
}

static fa_status kv_call(fa_context *ctx, kv_problem *p)
{
    return fa_forward_kvcache(ctx, &p->desc, &p->tq, &p->cache, &p->tk_new, &p->tv_new, &p->tout, p->lse);
}

static void walk_kvcache(int modifiers)
{
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_int_equal(fa_context_set_num_threads(ctx, 2), FA_SUCCESS);
    kv_problem want, got;
    kv_init(&want, modifiers);
    fa_debug_fail_allocation(0);
    assert_int_equal(kv_call(ctx, &want), FA_SUCCESS);
    const size_t n = fa_debug_fail_allocation(0);
    assert_true(n >= 1);
    print_message("fa_forward_kvcache%s: %zu allocations\n", modifiers ? " with modifiers" : "", n);
    for (size_t k = 1; k <= n; ++k) {
        kv_init(&got, modifiers);
        float *k_before = malloc(KV_CACHE_FLOATS * sizeof(float));
        assert_non_null(k_before);
        memcpy(k_before, got.k_cache, KV_CACHE_FLOATS * sizeof(float));
        memset(got.out, 0xa5, sizeof got.out);
        memset(got.lse, 0xa5, sizeof got.lse);
        fa_debug_fail_allocation(k);
        const fa_status st = kv_call(ctx, &got);
        fa_debug_fail_allocation(0);
        assert_out_of_memory(st, k);
        assert_memory_equal(got.k_cache, k_before, KV_CACHE_FLOATS * sizeof(float)); /* nothing appended */
        for (size_t i = 0; i < sizeof got.out; ++i) assert_int_equal(((unsigned char *)got.out)[i], 0xa5);
        for (size_t i = 0; i < sizeof got.lse; ++i) assert_int_equal(((unsigned char *)got.lse)[i], 0xa5);
        assert_int_equal(kv_call(ctx, &got), FA_SUCCESS); /* usable again, and the same bits */
        assert_memory_equal(got.out, want.out, sizeof got.out);
        assert_memory_equal(got.lse, want.lse, sizeof got.lse);
        assert_memory_equal(got.k_cache, want.k_cache, KV_CACHE_FLOATS * sizeof(float));
        free(k_before);
        free(got.k_cache);
        free(got.v_cache);
    }
    free(want.k_cache);
    free(want.v_cache);
    fa_context_destroy(ctx);
}

static void kvcache_decode(void **state) { (void)state; walk_kvcache(0); }
static void kvcache_modifiers(void **state) { (void)state; walk_kvcache(1); }

/* Scratch parked between calls (fa_host_scratch_alloc): a freed block serves the next request it
 * is large enough for, whole and 64-byte aligned; a larger request gets a new block; an injected
 * failure still fails a request a parked block could serve, and counts once. */
static void scratch_parking(void **state)
{
    (void)state;
    enum { MIB = 1 << 20 };
    fa_host_scratch_release();
    fa_debug_fail_allocation(0);
    char *a = fa_host_scratch_alloc(MIB);
    assert_non_null(a);
    assert_int_equal((uintptr_t)a % 64, 0);
    memset(a, 1, MIB);
    fa_host_scratch_free(a);
    char *b = fa_host_scratch_alloc(1000);
    assert_non_null(b);
    if (fa_host_scratch_parking()) {
        assert_ptr_equal(b, a);
        memset(b, 2, MIB); /* the parked block is whole, not only the 1000 bytes asked for */
    } else {
        memset(b, 2, 1000);
    }
    fa_host_scratch_free(b);
    char *c = fa_host_scratch_alloc(2 * MIB); /* b is parked but too small */
    assert_non_null(c);
    assert_ptr_not_equal(c, b);
    assert_int_equal((uintptr_t)c % 64, 0);
    memset(c, 3, 2 * MIB);
    fa_host_scratch_free(c);
    fa_host_scratch_free(NULL);
    assert_int_equal(fa_debug_fail_allocation(1), 3);
    assert_null(fa_host_scratch_alloc(1000)); /* two blocks are parked, and still it fails */
    assert_int_equal(fa_debug_fail_allocation(0), 1);
    char *d = fa_host_scratch_alloc(1000);
    assert_non_null(d);
    if (fa_host_scratch_parking()) assert_true(d == b || d == c);
    fa_host_scratch_free(d);
    fa_host_scratch_release();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scratch_parking),
        cmocka_unit_test(context_create),
        cmocka_unit_test(backend_malloc),
        cmocka_unit_test(forward_one_thread),
        cmocka_unit_test(forward_three_threads),
        cmocka_unit_test(backward_one_thread),
        cmocka_unit_test(backward_three_threads),
        cmocka_unit_test(kvcache_decode),
        cmocka_unit_test(kvcache_modifiers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

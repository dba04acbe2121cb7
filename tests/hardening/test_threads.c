/* The thread-safety contract (docs/ROBUSTNESS.md): a context may be used by several threads at
 * once for fa_forward and fa_backward; contexts may be created and destroyed concurrently;
 * fa_last_error is per thread. Configuration calls (fa_context_set_num_threads/_set_stream)
 * and fa_context_info must not race with other use of the same context.
 * Each scenario runs many threads and compares every result bit for bit with a serial run.
 * CI runs this test under ThreadSanitizer (scripts/ci-sanitize.sh). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

enum { THREADS = 8 };

static int quick(void) { return getenv("FA_TEST_QUICK") && getenv("FA_TEST_QUICK")[0] == '1'; }
static int iterations(void) { return quick() ? 2 : 4; }

typedef struct worker {
    pthread_t thread;
    int index;
    fa_context *shared_ctx; /* NULL: the worker creates its own context */
    fixture mine, want;     /* mine is computed concurrently, want serially beforehand */
    int failures;           /* cmocka asserts are not thread-safe: workers only count */
    char first_failure[160];
} worker;

static void record(worker *w, const char *what)
{
    if (w->failures++ == 0) snprintf(w->first_failure, sizeof w->first_failure, "thread %d: %s", w->index, what);
}

static void setup_case(fixture *f, int index)
{
    const oracle_shape shape = {2, 4, 2, 48 + 8 * index, 64, 16 + 8 * (index % 3)};
    assert_true(fixture_init(f, &shape, index % 3 == 2 ? FA_DTYPE_BF16 : FA_DTYPE_F32, 100 + (uint64_t)index));
    f->desc.causal = index % 2;
    f->desc.dropout_p = index % 4 == 1 ? 0.2f : 0.0f;
    f->desc.dropout_seed = (uint64_t)index;
}

static void *run_worker(void *arg)
{
    worker *w = arg;
    fa_context *ctx = w->shared_ctx;
    if (!ctx) {
        if (fa_context_create(FA_BACKEND_CPU, 0, &ctx) != FA_SUCCESS) {
            record(w, "fa_context_create failed");
            return NULL;
        }
        fa_context_set_num_threads(ctx, 1 + w->index % 2);
    }
    for (int it = 0; it < iterations(); ++it) {
        fixture_poison_forward(&w->mine);
        fixture_poison_gradients(&w->mine);
        if (fixture_forward(ctx, &w->mine) != FA_SUCCESS) record(w, fa_last_error());
        if (fixture_backward(ctx, &w->mine) != FA_SUCCESS) record(w, fa_last_error());
        if (!fixture_forward_identical(&w->mine, &w->want)) record(w, "forward differs from the serial run");
        if (!fixture_gradients_identical(&w->mine, &w->want)) record(w, "backward differs from the serial run");
    }
    if (!w->shared_ctx) fa_context_destroy(ctx);
    return NULL;
}

static void run_workers(fa_context *shared_ctx)
{
    worker *workers = calloc(THREADS, sizeof *workers);
    assert_non_null(workers);
    fa_context *serial;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &serial), FA_SUCCESS);
    for (int i = 0; i < THREADS; ++i) {
        workers[i].index = i;
        workers[i].shared_ctx = shared_ctx;
        setup_case(&workers[i].mine, i);
        setup_case(&workers[i].want, i);
        assert_int_equal(fixture_forward(serial, &workers[i].want), FA_SUCCESS);
        assert_int_equal(fixture_backward(serial, &workers[i].want), FA_SUCCESS);
    }
    fa_context_destroy(serial);
    for (int i = 0; i < THREADS; ++i)
        assert_int_equal(pthread_create(&workers[i].thread, NULL, run_worker, &workers[i]), 0);
    int failures = 0;
    for (int i = 0; i < THREADS; ++i) {
        pthread_join(workers[i].thread, NULL);
        if (workers[i].failures) print_error("%s\n", workers[i].first_failure);
        failures += workers[i].failures;
        fixture_free(&workers[i].mine);
        fixture_free(&workers[i].want);
    }
    free(workers);
    assert_int_equal(failures, 0);
}

/* One context, used by every thread at once; its own OpenMP team of 2 per call. */
static void shared_context(void **state)
{
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_int_equal(fa_context_set_num_threads(ctx, 2), FA_SUCCESS);
    run_workers(ctx);
    fa_context_destroy(ctx);
}

/* Every thread creates, uses and destroys its own context, concurrently. */
static void context_per_thread(void **state)
{
    (void)state;
    run_workers(NULL);
}

/* AUTO resolution probes the GPU plugins once (pthread_once) while threads race to create. */
static void *create_auto(void *arg)
{
    fa_context *ctx = NULL;
    *(fa_status *)arg = fa_context_create(FA_BACKEND_AUTO, 0, &ctx);
    fa_context_destroy(ctx);
    return NULL;
}

static void concurrent_auto_create(void **state)
{
    (void)state;
    pthread_t threads[THREADS];
    fa_status status[THREADS];
    for (int i = 0; i < THREADS; ++i) assert_int_equal(pthread_create(&threads[i], NULL, create_auto, &status[i]), 0);
    for (int i = 0; i < THREADS; ++i) {
        pthread_join(threads[i], NULL);
        assert_int_equal(status[i], FA_SUCCESS);
    }
}

/* fa_last_error is per thread: each thread makes a different argument invalid and must read
 * back its own message, however the other threads interleave. */
typedef struct error_worker {
    pthread_t thread;
    fa_context *ctx;
    int index, mismatches;
} error_worker;

static void *provoke_errors(void *arg)
{
    error_worker *w = arg;
    const oracle_shape shape = {1, 1, 1, 4, 4, 4};
    fixture f;
    if (!fixture_init(&f, &shape, FA_DTYPE_F32, 1)) {
        w->mismatches = 1;
        return NULL;
    }
    char expected[64];
    snprintf(expected, sizeof expected, "desc->window_left: %d is below -1", -2 - w->index);
    for (int it = 0; it < 200; ++it) {
        f.desc.window_left = -2 - w->index;
        const fa_status st = fixture_forward(w->ctx, &f);
        if (st != FA_ERROR_INVALID_VALUE || strcmp(fa_last_error(), expected) != 0) w->mismatches++;
        f.desc.window_left = -1;
        if (fixture_forward(w->ctx, &f) != FA_SUCCESS) w->mismatches++;
    }
    fixture_free(&f);
    return NULL;
}

static void error_message_per_thread(void **state)
{
    (void)state;
    fa_context *ctx;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &ctx), FA_SUCCESS);
    assert_int_equal(fa_context_set_num_threads(ctx, 1), FA_SUCCESS);
    error_worker w[THREADS];
    for (int i = 0; i < THREADS; ++i) {
        w[i] = (error_worker){.ctx = ctx, .index = i};
        assert_int_equal(pthread_create(&w[i].thread, NULL, provoke_errors, &w[i]), 0);
    }
    int mismatches = 0;
    for (int i = 0; i < THREADS; ++i) {
        pthread_join(w[i].thread, NULL);
        mismatches += w[i].mismatches;
    }
    fa_context_destroy(ctx);
    assert_int_equal(mismatches, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shared_context),
        cmocka_unit_test(context_per_thread),
        cmocka_unit_test(concurrent_auto_create),
        cmocka_unit_test(error_message_per_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#define _POSIX_C_SOURCE 200809L /* setenv */
/* FLASHATTN_GPU_SYNC=1 on the emulated CUDA plugin: a kernel fault is reported by the launch that
 * caused it, naming the kernel, its grid and block (the emulator marks the N-th launch as faulted:
 * FLASHATTN_EMU_FAULT_AT_LAUNCH, see emu_runtime.h). Without the variable
 * the same fault surfaces only at the next synchronisation, with no kernel named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flashattn.h"

enum { SEQ = 40, HEADS = 2, DIM = 32, ELEMS = SEQ * HEADS * DIM };

/* Forward on a fresh context; returns its status, the error text in `why`, and the status of the
 * fa_synchronize that follows. */
static fa_status forward(char *why, size_t size, fa_status *sync_status)
{
    fa_context *ctx = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CUDA, 0, &ctx), FA_SUCCESS);
    void *buffers[4];
    for (int i = 0; i < 4; ++i) {
        assert_int_equal(fa_malloc(ctx, ELEMS * sizeof(float), &buffers[i]), FA_SUCCESS);
        float host[ELEMS];
        for (int e = 0; e < ELEMS; ++e) host[e] = (float)((e * 7 + i) % 13) / 13.0f;
        assert_int_equal(fa_memcpy_h2d(ctx, buffers[i], host, sizeof host), FA_SUCCESS);
    }
    fa_tensor t[4];
    for (int i = 0; i < 4; ++i) t[i] = (fa_tensor){buffers[i], FA_DTYPE_F32, 1, SEQ, HEADS, DIM, 0, 0, 0};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    const fa_status st = fa_forward(ctx, &desc, &t[0], &t[1], &t[2], &t[3], NULL);
    strncpy(why, fa_last_error(), size - 1);
    why[size - 1] = '\0';
    *sync_status = fa_synchronize(ctx);
    for (int i = 0; i < 4; ++i) fa_free(ctx, buffers[i]);
    fa_context_destroy(ctx);
    return st;
}

static void test_sync_names_the_faulting_kernel(void **state)
{
    (void)state;
    char why[512];
    fa_status sync_status;
    setenv("FLASHATTN_GPU_SYNC", "1", 1);
    setenv("FLASHATTN_EMU_FAULT_AT_LAUNCH", "2", 1); /* a forward is one launch: the second forward's */
    assert_int_equal(forward(why, sizeof why, &sync_status), FA_SUCCESS);
    assert_int_equal(sync_status, FA_SUCCESS);

    assert_int_equal(forward(why, sizeof why, &sync_status), FA_ERROR_BACKEND_FAILURE);
    if (!strstr(why, "forward launch faulted") || !strstr(why, "threads") || !strstr(why, "LaunchFailure"))
        fail_msg("the error does not name the kernel and the fault: %s", why);
}

static void test_without_sync_the_fault_surfaces_later(void **state)
{
    (void)state;
    char why[512];
    fa_status sync_status;
    unsetenv("FLASHATTN_GPU_SYNC");
    setenv("FLASHATTN_EMU_FAULT_AT_LAUNCH", "3", 1); /* the count goes on from the previous test */
    assert_int_equal(forward(why, sizeof why, &sync_status), FA_SUCCESS);
    assert_int_equal(sync_status, FA_ERROR_BACKEND_FAILURE);
    assert_null(strstr(fa_last_error(), "forward launch"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_names_the_faulting_kernel),
        cmocka_unit_test(test_without_sync_the_fault_surfaces_later),
    };
    return cmocka_run_group_tests_name("gpu_sync", tests, NULL, NULL);
}

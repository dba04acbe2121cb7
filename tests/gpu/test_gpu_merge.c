/* fa_merge_partials on a GPU context (plugin ABI 5: the device merge of src/gpu/kernels/merge.cuh)
 * against the host merge (src/common/merge.c) on the same values: 4 parts, one with strides, into
 * a strided out, with rows whose every part is -inf (zeros, lse -inf), a part of -inf lse whose
 * output is NaN (never read), a NaN and a +inf lse (NaN rows). Both merges follow one row rule
 * (src/common/merge_rule.h) with the same arithmetic, so under the emulator (host libm) the results
 * must be bit-identical; on a GPU, whose expf/logf may differ from glibc's in the last bits, within
 * 2^-20 relative (f32) or one unit of the dtype's last place. Without lse_out, out is the same. Bad
 * inputs are refused by the core before the device is touched, writing nothing. */
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
#include "test_arrays.h"

enum { B = 2, H = 3, S = 37, D = 40, PARTS = 4, WIDE_H = H + 2 };
enum { ROWS = B * H * S, PACKED = B * S * H * D, WIDE = B * S * WIDE_H * D };

/* out-shaped views: packed, or the first H heads of a [B, S, WIDE_H, D] array. */
static fa_tensor view(void *data, fa_dtype dtype, int wide)
{
    const fa_tensor t = {data, dtype, B, S, H, D, wide ? S * WIDE_H * D : 0, wide ? WIDE_H * D : 0, wide ? D : 0};
    return t;
}

static size_t element(int64_t b, int64_t s, int64_t h, int64_t x, int wide)
{
    const int64_t heads = wide ? WIDE_H : H;
    return (size_t)(((b * S + s) * heads + h) * D + x);
}

/* Row r = (b * H + h) * S + s of the lse layout. */
static void set_row(void *data, fa_dtype dtype, int64_t r, int wide, float value)
{
    const int64_t s = r % S, h = r / S % H, b = r / (S * H);
    float *f = malloc(D * sizeof *f);
    assert_non_null(f);
    for (int x = 0; x < D; ++x) f[x] = value;
    void *row = to_dtype(f, D, dtype);
    memcpy((char *)data + element(b, s, h, 0, wide) * dtype_size(dtype), row, D * dtype_size(dtype));
    free(row);
    free(f);
}

static int emulated(fa_context *gpu) { return strstr(fa_context_info(gpu), "SIMT emulator") != NULL; }

/* got == want bit for bit (emulated), or within the tolerance stated above. */
static void expect_merge_equal(fa_context *gpu, const char *what, const void *got, const void *want, size_t n,
                               fa_dtype dtype)
{
    if (emulated(gpu)) {
        if (memcmp(got, want, n * dtype_size(dtype)) != 0) {
            for (size_t i = 0; i < n; ++i)
                if (memcmp((const char *)got + i * dtype_size(dtype), (const char *)want + i * dtype_size(dtype),
                           dtype_size(dtype)) != 0)
                    fail_msg("%s: element %zu: device %.9g, host %.9g (not bit-identical)", what, i,
                             from_dtype(got, i, dtype), from_dtype(want, i, dtype));
        }
        return;
    }
    const double tol = dtype == FA_DTYPE_F32 ? 0x1p-20 : dtype == FA_DTYPE_F16 ? 0x1p-10 : 0x1p-7;
    for (size_t i = 0; i < n; ++i) {
        const float g = from_dtype(got, i, dtype), w = from_dtype(want, i, dtype);
        if ((isnan(g) && isnan(w)) || g == w) continue;
        if (!(fabs((double)g - w) <= tol * fmax(1.0, fabs((double)w))))
            fail_msg("%s: element %zu: device %.9g, host %.9g", what, i, g, w);
    }
}

static void check_merge(void **state, fa_dtype dtype)
{
    fa_context *gpu = context_or_skip(state), *cpu = NULL;
    assert_int_equal(fa_context_create(FA_BACKEND_CPU, 0, &cpu), FA_SUCCESS);
    const size_t es = dtype_size(dtype);
    /* Parts: part 1 strided (wide), the others packed; out strided. */
    buffer part[PARTS], lse[PARTS];
    for (int c = 0; c < PARTS; ++c) {
        part[c] = buffer_new(gpu, c == 1 ? WIDE : PACKED, dtype, 10 + (uint64_t)c);
        float *l = malloc(ROWS * sizeof *l);
        double *x = test_random_doubles(20 + (uint64_t)c, ROWS);
        assert_non_null(l);
        for (int r = 0; r < ROWS; ++r) l[r] = (float)(4.0 * x[r]);
        free(x);
        l[5] = -INFINITY;                 /* row 5: every part -inf */
        if (c == 2) l[6] = -INFINITY;     /* row 6: part 2 saw no key; its output (NaN) is not read */
        if (c == 0) l[7] = NAN;           /* row 7: a NaN lse poisons the row */
        if (c == 3) l[8] = INFINITY;      /* row 8: so does +inf */
        if (c != 1) l[9] = -INFINITY;     /* row 9: one part only */
        lse[c] = buffer_new(gpu, ROWS, FA_DTYPE_F32, 0);
        memcpy(lse[c].host, l, ROWS * sizeof *l);
        assert_int_equal(fa_memcpy_h2d(gpu, lse[c].dev, l, ROWS * sizeof *l), FA_SUCCESS);
        free(l);
    }
    set_row(part[2].host, dtype, 6, 0, NAN);
    assert_int_equal(fa_memcpy_h2d(gpu, part[2].dev, part[2].host, PACKED * es), FA_SUCCESS);

    /* The host merge on the host copies. */
    fa_tensor host_parts[PARTS], dev_parts[PARTS];
    const fa_tensor *host_outs[PARTS], *dev_outs[PARTS];
    const float *host_lses[PARTS], *dev_lses[PARTS];
    for (int c = 0; c < PARTS; ++c) {
        host_parts[c] = view(part[c].host, dtype, c == 1);
        dev_parts[c] = view(part[c].dev, dtype, c == 1);
        host_outs[c] = &host_parts[c];
        dev_outs[c] = &dev_parts[c];
        host_lses[c] = lse[c].host;
        dev_lses[c] = lse[c].dev;
    }
    void *want = calloc(WIDE, es);
    float *want_lse = malloc(ROWS * sizeof *want_lse);
    assert_true(want && want_lse);
    fa_tensor host_out = view(want, dtype, 1);

    buffer out = buffer_new(gpu, WIDE, dtype, 0), out_lse = buffer_new(gpu, ROWS, FA_DTYPE_F32, 0);
    /* Both outs start as zeros: the heads the view skips must stay so on both. */
    assert_int_equal(fa_memcpy_h2d(gpu, out.dev, want, WIDE * es), FA_SUCCESS);
    assert_int_equal(fa_merge_partials(cpu, PARTS, host_outs, host_lses, &host_out, want_lse), FA_SUCCESS);
    fa_tensor dev_out = view(out.dev, dtype, 1);
    assert_int_equal(fa_merge_partials(gpu, PARTS, dev_outs, dev_lses, &dev_out, out_lse.dev), FA_SUCCESS);
    assert_int_equal(fa_synchronize(gpu), FA_SUCCESS);
    void *got = buffer_fetch(gpu, &out);
    float *got_lse = buffer_fetch(gpu, &out_lse);
    expect_merge_equal(gpu, "out", got, want, WIDE, dtype);
    expect_merge_equal(gpu, "lse_out", got_lse, want_lse, ROWS, FA_DTYPE_F32);
    /* The special rows, as the rule says (the host merge is the reference only if it is right). */
    assert_true(got_lse[5] == -INFINITY && from_dtype(got, element(0, 5, 0, 0, 1), dtype) == 0.0f);
    assert_true(isfinite(got_lse[6]) && isfinite(from_dtype(got, element(0, 6, 0, 0, 1), dtype)));
    assert_true(isnan(got_lse[7]) && isnan(from_dtype(got, element(0, 7, 0, D - 1, 1), dtype)));
    assert_true(isnan(got_lse[8]));
    assert_true(got_lse[9] == ((const float *)lse[1].host)[9]); /* one part: its lse, exactly */

    /* Without lse_out: the same out. */
    void *zeros = calloc(WIDE, es);
    assert_non_null(zeros);
    assert_int_equal(fa_memcpy_h2d(gpu, out.dev, zeros, WIDE * es), FA_SUCCESS);
    free(zeros);
    assert_int_equal(fa_merge_partials(gpu, PARTS, dev_outs, dev_lses, &dev_out, NULL), FA_SUCCESS);
    void *again = buffer_fetch(gpu, &out);
    assert_memory_equal(again, got, WIDE * es);

    /* Bad inputs: refused by the core, nothing written (out keeps its contents). */
    assert_int_equal(fa_merge_partials(gpu, 0, dev_outs, dev_lses, &dev_out, NULL), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "n: 0 parts"));
    fa_tensor overlapping = dev_parts[0];
    overlapping.data = out.dev;
    const fa_tensor *with_overlap[PARTS] = {&overlapping, dev_outs[1], dev_outs[2], dev_outs[3]};
    assert_int_equal(fa_merge_partials(gpu, PARTS, with_overlap, dev_lses, &dev_out, NULL), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "out: overlaps outs[0]"));
    fa_tensor other_shape = dev_parts[3];
    other_shape.seqlen = S - 1;
    const fa_tensor *with_other_shape[PARTS] = {dev_outs[0], dev_outs[1], dev_outs[2], &other_shape};
    assert_int_equal(fa_merge_partials(gpu, PARTS, with_other_shape, dev_lses, &dev_out, out_lse.dev), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "outs[3]"));
    const float *null_lse[PARTS] = {dev_lses[0], NULL, dev_lses[2], dev_lses[3]};
    assert_int_equal(fa_merge_partials(gpu, PARTS, dev_outs, null_lse, &dev_out, NULL), FA_ERROR_INVALID_VALUE);
    assert_non_null(strstr(fa_last_error(), "lses[1]: is NULL"));
    void *after = buffer_fetch(gpu, &out);
    assert_memory_equal(after, got, WIDE * es);

    for (int c = 0; c < PARTS; ++c) {
        buffer_free(gpu, &part[c]);
        buffer_free(gpu, &lse[c]);
    }
    buffer_free(gpu, &out);
    buffer_free(gpu, &out_lse);
    free(want); free(want_lse); free(got); free(got_lse); free(again); free(after);
    fa_context_destroy(cpu);
}

void test_gpu_merge_f32(void **state) { check_merge(state, FA_DTYPE_F32); }
void test_gpu_merge_f16(void **state) { check_merge(state, FA_DTYPE_F16); }
void test_gpu_merge_bf16(void **state) { check_merge(state, FA_DTYPE_BF16); }

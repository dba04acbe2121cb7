#include "cpu_modifiers.h"

#include <string.h>

#include "../common/alloc.h"
#include "../common/error.h"
#include "../common/visibility.h"

/* The bias of rows x keys [j0, j0 + cols) added to the transposed tile st (after the scale), and
 * col_max (NULL = not wanted) its per-query max (bias_cols: one pass, the bias read as
 * it lies, W rows side by side along the keys, blocks of 8 keys widened and transposed in
 * registers). */
static void add_bias(const fa_problem *p, const fa_cpu_kernels *kern, int64_t b, int64_t h, const fa_cpu_rows *rows,
                     int64_t j0, int64_t cols, float scale, float *st, int64_t ld, float *col_max)
{
    const fa_bias *bias = &p->modifiers.bias;
    const char *first = (const char *)fa_cpu_bias_row(bias, b, h, rows->i0) + (size_t)j0 * fa_dtype_size(bias->dtype);
    for (int64_t r = 0; col_max && r < rows->count; ++r) col_max[r] = -INFINITY;
    kern->bias_cols(st, ld, cols, rows->count, scale, first, bias->dtype, bias->stride_q, col_max);
}

/* The slope of (b, h) and the ALiBi distance's origin of the tile (rows, keys from j0). */
static float alibi_slope(const fa_problem *p, int64_t b, int64_t h)
{
    return p->modifiers.alibi_slopes ? p->modifiers.alibi_slopes[b * p->modifiers.alibi_stride_batch + h] : 0.0f;
}
static int64_t alibi_first(const fa_problem *p, const fa_cpu_rows *rows, int64_t j0)
{
    return fa_diagonal_key(rows->i0, p->mask.diag_offset) - j0;
}

void fa_cpu_modify_scores(const fa_problem *p, const fa_cpu_kernels *kern, int64_t b, int64_t h,
                          const fa_cpu_rows *rows, int64_t j0, int64_t cols, float scale, float *st, int64_t ld,
                          float *cap_grad, float *col_max)
{
    const int64_t n = rows->count, first = alibi_first(p, rows, j0);
    const float slope = alibi_slope(p, b, h);
    const int has_bias = p->modifiers.bias.data != NULL, alibi = p->modifiers.alibi_slopes != NULL;
    /* The first modifier multiplies by the scale, the last takes the max. The one tanh of the
     * forward and the backward (kernels.h): the ISA's, chosen by the CPU only. */
    if (p->modifiers.softcap > 0.0f) /* with ALiBi fused */
        kern->softcap_cols(st, ld, cols, n, scale, p->modifiers.softcap, slope, first, cap_grad, has_bias ? NULL : col_max);
    else if (alibi)
        kern->alibi_cols(st, ld, cols, n, scale, slope, first, has_bias ? NULL : col_max);
    if (p->modifiers.softcap > 0.0f || alibi) scale = 1.0f;
    if (has_bias) add_bias(p, kern, b, h, rows, j0, cols, scale, st, ld, col_max);
}

void fa_cpu_gemm_modified(const fa_problem *p, const fa_cpu_kernels *kern, int64_t b, int64_t h,
                          const fa_cpu_rows *rows, int64_t j0, int64_t cols, const float *k, int64_t ldk,
                          const float *qt, int64_t ldq, float *st, int64_t ld, float *col_max)
{
    const fa_cpu_score_mods mods = {.scale = p->shape.scale, .cap = p->modifiers.softcap, .alibi = p->modifiers.alibi_slopes != NULL,
                                    .slope = alibi_slope(p, b, h), .first = alibi_first(p, rows, j0)};
    kern->gemm_scores(cols, rows->count, p->shape.head_dim, k, ldk, 1, qt, ldq, st, ld, &mods, col_max);
}

fa_status fa_cpu_sink_gradients(const fa_problem *p)
{
    const int64_t d = p->shape.head_dim;
    float *rows = fa_host_alloc((size_t)(2 * d) * sizeof(float));
    if (!rows) return fa_set_error(FA_ERROR_OUT_OF_MEMORY, "backward: cannot allocate two rows for dsinks");
    for (int64_t h = 0; h < p->shape.heads_q; ++h) {
        const float sink = fa_cpu_sink(p, h);
        double sum = 0.0;
        for (int64_t b = 0; b < p->shape.batch && sink != -INFINITY; ++b)
            for (int64_t i = 0; i < p->shape.seqlen_q; ++i) {
                const float lse = p->outputs.lse[fa_lse_index(p, b, h, i)];
                if (lse == -INFINITY) continue;
                fa_cpu_load_rows(&p->out, b, i, h, 1, rows, d);
                fa_cpu_load_rows(&p->dout, b, i, h, 1, rows + d, d);
                double delta = 0.0;
                for (int64_t c = 0; c < d; ++c) delta += (double)rows[c] * (double)rows[d + c];
                sum -= exp((double)sink - (double)lse) * delta;
            }
        p->outputs.dsinks[h] = (float)sum;
    }
    fa_host_free(rows);
    return FA_SUCCESS;
}

void fa_cpu_store_bias_row(const fa_bias *bias, int64_t b, int64_t h, int64_t i, int64_t j0, const float *src,
                           int64_t n)
{
    void *row = fa_cpu_bias_row(bias, b, h, i);
    switch (bias->dtype) {
    case FA_DTYPE_F32:
        memcpy((float *)row + j0, src, (size_t)n * sizeof(float));
        break;
    case FA_DTYPE_F16:
        for (int64_t c = 0; c < n; ++c) ((uint16_t *)row)[j0 + c] = fa_f32_to_f16(src[c]);
        break;
    case FA_DTYPE_BF16:
        for (int64_t c = 0; c < n; ++c) ((uint16_t *)row)[j0 + c] = fa_f32_to_bf16(src[c]);
        break;
    default: /* a bias is never quantised (validation) */
        break;
    }
}

void fa_cpu_zero_bias(const fa_bias *bias, int64_t batches, int64_t heads, int64_t rows, int64_t keys)
{
    const int64_t nb = bias->stride_batch ? batches : 1, nh = bias->stride_head ? heads : 1;
    const int64_t nr = bias->stride_q ? rows : 1;
    for (int64_t b = 0; b < nb; ++b)
        for (int64_t h = 0; h < nh; ++h)
            for (int64_t i = 0; i < nr; ++i)
                memset(fa_cpu_bias_row(bias, b, h, i), 0, (size_t)keys * fa_dtype_size(bias->dtype));
}

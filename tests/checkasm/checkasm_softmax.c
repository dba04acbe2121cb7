/* checkasm: the softmax and score-modifier kernels (col_max, exp_cols, softcap_cols with the tanh
 * contract, alibi_cols, bias_cols) against the reference kernels. */
#include "checkasm.h"
#include "cpu/kernels/exp_poly.h"

void test_col_max(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    for (int64_t rows = 1; rows <= 37; rows += 6)
        for (int64_t cols = 1; cols <= 70; cols += 3) {
            const int64_t ld = cols + 1;
            float x[37 * 71], want[71], got[72];
            for (int64_t e = 0; e < rows * ld; ++e) x[e] = (e % 5 == 0) ? -INFINITY : uniform(-50, 50);
            for (int64_t r = 0; r < rows; ++r) x[r * ld] = -INFINITY; /* column 0 fully masked */
            got[cols] = 99.0f;
            ref->col_max(x, ld, rows, cols, want);
            isa->col_max(x, ld, rows, cols, got);
            for (int64_t c = 0; c < cols; ++c)
                if (got[c] != want[c]) fail_msg("col_max %s rows=%lld cols=%lld: [%lld] %g vs %g", isa->isa, (long long)rows, (long long)cols, (long long)c, got[c], want[c]);
            assert_true(got[cols] == 99.0f);
        }
}

/* exp within 2 ulp of expf on [-44.4, 8], plus the effect of rounding the argument scale * x - shift
 * (fused in the ISA kernels, two roundings in the reference: (|scale x| + |shift|) 2^-23 relative),
 * exact zeros for -inf scores and +inf shifts, zeros below FA_EXP_LO (results under 2^-64; where
 * the two roundings of an argument fall on either side of it, one side may be 0). */
void test_exp_cols(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    for (int64_t rows = 1; rows <= 41; rows += 8)
        for (int64_t cols = 1; cols <= 67; cols += 5) {
            const int64_t ld = cols + 2;
            float x_ref[41 * 69], x_isa[41 * 69], x_in[41 * 69], shift[67], sum_ref[67], sum_isa[68];
            for (int64_t c = 0; c < cols; ++c) shift[c] = c == 1 ? INFINITY : uniform(0, 8);
            for (int64_t e = 0; e < rows * ld; ++e) x_in[e] = x_ref[e] = x_isa[e] = (e % 7 == 3) ? -INFINITY : uniform(-85, 8);
            sum_isa[cols] = 99.0f;
            float sum_tol[69] = {0};
            ref->exp_cols(x_ref, ld, rows, cols, 0.9f, shift, sum_ref);
            isa->exp_cols(x_isa, ld, rows, cols, 0.9f, shift, sum_isa);
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t c = 0; c < ld; ++c) {
                    const float want = x_ref[r * ld + c], got = x_isa[r * ld + c];
                    const int exact = c >= cols || c == 1 || isinf(x_in[r * ld + c]); /* untouched, masked */
                    const float arg = fabsf(0.9f * x_in[r * ld + c]) + (c < cols ? fabsf(shift[c]) : 0.0f);
                    const int flushed = want == 0.0f || got == 0.0f; /* the other side within 2^-64 */
                    const float tol = exact ? 0.0f : flushed ? 0x1.02p-64f : want * (2.4e-7f + arg * 1.2e-7f);
                    if (c < cols) sum_tol[c] += tol + want * 1.2e-7f * (float)rows; /* element error + summation order */
                    if (!(got == want || fabsf(got - want) <= tol))
                        fail_msg("exp_cols %s (%lld, %lld): %.9g vs %.9g", isa->isa, (long long)r, (long long)c, got, want);
                }
            for (int64_t c = 0; c < cols; ++c)
                if (!(fabsf(sum_isa[c] - sum_ref[c]) <= sum_tol[c]))
                    fail_msg("exp_cols %s sum[%lld]: %.9g vs %.9g", isa->isa, (long long)c, sum_isa[c], sum_ref[c]);
            assert_true(sum_isa[cols] == 99.0f);
        }
    /* The ends of the range, exact arguments (scale 1, shift 0): 1024 consecutive floats up from
     * just below FA_EXP_LO (the flush point, -64 ln 2), 1024 down from 88 (the largest), and 2048
     * steps over [-45, -44] and [87, 88]: 0 exactly below FA_EXP_LO, within 2 ulp of expf above. */
    enum { EDGE = 4096, EDGE_COLS = 64 };
    static float edge[EDGE], edge_in[EDGE];
    float zero_shift[EDGE_COLS] = {0}, edge_sum[EDGE_COLS];
    for (int e = 0; e < 1024; ++e) {
        edge[e] = e ? nextafterf(edge[e - 1], 0.0f) : FA_EXP_LO - 1e-5f;
        edge[1024 + e] = e ? nextafterf(edge[1024 + e - 1], 0.0f) : 88.0f;
        edge[2048 + e] = -45.0f + (float)e / 1024.0f;
        edge[3072 + e] = 87.0f + (float)e / 1024.0f;
    }
    memcpy(edge_in, edge, sizeof edge);
    isa->exp_cols(edge, EDGE_COLS, EDGE / EDGE_COLS, EDGE_COLS, 1.0f, zero_shift, edge_sum);
    for (int e = 0; e < EDGE; ++e) {
        const float want = expf(edge_in[e]), got = edge[e];
        const int ok = edge_in[e] < FA_EXP_LO ? got == 0.0f : fabsf(got - want) <= want * 2.4e-7f;
        if (!ok) fail_msg("exp_cols %s: exp(%.9g) = %.9g, expf %.9g", isa->isa, edge_in[e], got, want);
    }
}

/* tanh through softcap_cols with scale = cap = 1 (x * 1 and 1 * t are exact) against tanh in
 * double, on every 199th binary32 of both signs (21M values: large |x|, tiny and subnormal x) and
 * the special values; prints the max absolute and relative errors. Bounds (the ISA kernels'
 * contract, kernels.h): relative 4e-7 for |x| >= 1e-35, absolute 1e-38 below; odd, +-0 kept, |t| <= 1
 * everywhere, +-1 within 1 ulp at and beyond |x| = 9 (here +inf, and 9 with the caps of
 * check_tanh_caps), NaN kept, and -inf left as it is (a masked score) with gradient 0. */
static void check_tanh_accuracy(const fa_cpu_kernels *k, double rel_bound)
{
    enum { CHUNK = 4099 };
    float *x = malloc(CHUNK * sizeof *x), *t = malloc(CHUNK * sizeof *t), *g = malloc(CHUNK * sizeof *g);
    assert_non_null(x); assert_non_null(t); assert_non_null(g);
    double max_abs = 0.0, max_rel = 0.0;
    float worst = 0.0f;
    int64_t filled = 0, checked = 0;
    const uint32_t last = 0x7f800000u; /* +inf */
    for (uint32_t bits = 0;; bits += 199) {
        const int done = bits >= last;
        const uint32_t b = done ? last : bits;
        x[filled++] = fa_bits_f32(b);
        x[filled++] = fa_bits_f32(b | 0x80000000u);
        if (filled + 2 <= CHUNK && !done) continue;
        memcpy(t, x, (size_t)filled * sizeof *t);
        k->softcap_cols(t, filled, 1, filled, 1.0f, 1.0f, 0.0f, 0, g, NULL);
        for (int64_t i = 0; i < filled; ++i) {
            const double want = x[i] == -INFINITY ? -INFINITY : tanh((double)x[i]);
            const double err = fabs((double)t[i] - want), rel = want != 0.0 ? err / fabs(want) : err;
            const int tiny = fabs(want) < 1e-35; /* the rational's products underflow: absolute bound */
            if (isinf(want) ? t[i] != want || !(g[i] >= 0.0f && g[i] <= 0x1p-22f) /* its P is 0 */
                            : !(tiny ? err <= 1e-38 : rel <= rel_bound) || signbit(t[i]) != signbit(x[i]))
                fail_msg("tanh %s(%a) = %a, want %a (relative error %.3g > %.3g)", k->isa, (double)x[i], (double)t[i], want, rel, rel_bound);
            if (!isinf(want) && !tiny && rel > max_rel) max_rel = rel, worst = x[i];
            if (!isinf(want) && err > max_abs) max_abs = err;
            if (!isinf(want) && (fabsf(t[i]) > 1.0f || (fabsf(x[i]) >= 9.0f && fabsf(t[i]) < 1.0f - 0x1p-24f)))
                fail_msg("tanh %s(%a) = %a, want +-1 within 1 ulp, never beyond", k->isa, (double)x[i], (double)t[i]);
        }
        checked += filled;
        filled = 0;
        if (done) break;
    }
    x[0] = NAN;
    k->softcap_cols(x, 1, 1, 1, 1.0f, 1.0f, 0.0f, 0, NULL, NULL);
    assert_true(isnan(x[0]));
    print_message("checkasm: tanh %s over %lld values: max abs error %.3g, max rel error %.3g (at x = %a)\n", k->isa,
                  (long long)checked, max_abs, max_rel, (double)worst);
    free(x); free(t); free(g);
}

/* cap * tanh(x / cap) never beyond +-cap, and +-cap within 1 ulp from |x| = 9 cap on, for caps that
 * are not powers of two (the ISA kernels fold the cap into the rational's coefficients): x from
 * 8.5 cap to 9.5 cap, both signs. */
static void check_tanh_caps(const fa_cpu_kernels *k)
{
    static const float caps[] = {0.3f, 0.7f, 1.0f, 3.0f, 30.0f, 50.0f, 1e-3f, 7e4f};
    enum { STEPS = 4001 };
    float x[2 * STEPS], t[2 * STEPS];
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; ++c) {
        const float cap = caps[c];
        for (int i = 0; i < STEPS; ++i) {
            x[2 * i] = cap * (8.5f + (float)i / (STEPS - 1));
            x[2 * i + 1] = -x[2 * i];
        }
        memcpy(t, x, sizeof t);
        k->softcap_cols(t, 2 * STEPS, 1, 2 * STEPS, 1.0f, cap, 0.0f, 0, NULL, NULL);
        for (int i = 0; i < 2 * STEPS; ++i) {
            const float bound = fabsf(x[i]) >= 9.0f * cap ? cap * (1.0f - 0x1p-24f) : 0.0f;
            if (!(fabsf(t[i]) <= cap && fabsf(t[i]) >= bound) || signbit(t[i]) != signbit(x[i]))
                fail_msg("softcap %s cap %g: x = %a gives %a, want within 1 ulp of +-cap from 9 cap on, never beyond", k->isa,
                         (double)cap, (double)x[i], (double)t[i]);
        }
    }
}

/* softcap_cols against the reference on odd shapes with padded rows (the padding keeps its
 * sentinel), caps 30 and 0.5, scales 1 and 0.7, with and without the fused ALiBi, masked (-inf)
 * scores, with and without the gradient and the column max (which must be the max of the kernel's own results, bit for bit);
 * then the tanh accuracy of the ISA and of the reference. */
void test_softcap_cols(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    for (int64_t rows = 1; rows <= 41; rows += 8)
        for (int64_t cols = 1; cols <= 67; cols += 5) {
            const int64_t ld = cols + 2;
            const float cap = cols & 1 ? 30.0f : 0.5f, scale = rows % 3 ? 0.7f : 1.0f;
            float x_ref[41 * 69], x_isa[41 * 69], g_ref[41 * 69], g_isa[41 * 69], max_isa[68];
            for (int64_t e = 0; e < rows * ld; ++e) {
                x_ref[e] = x_isa[e] = e % 7 == 3 ? -INFINITY : uniform(-4.0f * cap, 4.0f * cap);
                g_ref[e] = g_isa[e] = 99.0f;
            }
            max_isa[cols] = 99.0f;
            const int with_grad = rows % 16 == 1, with_max = cols % 10 != 6;
            const float slope = cols % 4 == 1 ? 0.0f : cap / 64.0f; /* with and without the fused ALiBi */
            const int64_t first = rows - cols / 2;
            ref->softcap_cols(x_ref, ld, rows, cols, scale, cap, slope, first, with_grad ? g_ref : NULL, NULL);
            isa->softcap_cols(x_isa, ld, rows, cols, scale, cap, slope, first, with_grad ? g_isa : NULL,
                              with_max ? max_isa : NULL);
            for (int64_t e = 0; e < rows * ld; ++e) {
                const int inside = e % ld < cols;
                /* the tanh's error, times cap, plus the ALiBi term's rounding */
                if (!inside || x_ref[e] == -INFINITY ? x_isa[e] != x_ref[e] : !(fabsf(x_isa[e] - x_ref[e]) <= 6e-7f * (cap + fabsf(x_ref[e]))))
                    fail_msg("softcap_cols %s (%lld, %lld): %.9g vs %.9g", isa->isa, (long long)(e / ld), (long long)(e % ld), x_isa[e], x_ref[e]);
                if (!inside || !with_grad ? g_isa[e] != 99.0f : !(fabsf(g_isa[e] - g_ref[e]) <= 2e-6f))
                    fail_msg("softcap_cols %s grad (%lld, %lld): %.9g vs %.9g", isa->isa, (long long)(e / ld), (long long)(e % ld), g_isa[e], g_ref[e]);
            }
            for (int64_t c = 0; with_max && c < cols; ++c) {
                float want = -INFINITY;
                for (int64_t r = 0; r < rows; ++r) want = x_isa[r * ld + c] > want ? x_isa[r * ld + c] : want;
                if (max_isa[c] != want) fail_msg("softcap_cols %s col_max[%lld]: %.9g vs %.9g", isa->isa, (long long)c, max_isa[c], want);
            }
            assert_true(max_isa[cols] == 99.0f);
        }
    check_tanh_accuracy(isa, 4e-7);
    check_tanh_accuracy(ref, 2e-7);
    check_tanh_caps(isa);
    check_tanh_caps(ref);
}

/* alibi_cols bit for bit against the reference (kernels.h: the same bits on every ISA) on odd
 * shapes, padded rows (the padding keeps its sentinel), masked scores, distances of both signs,
 * with and without the column max. */
void test_alibi_cols(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    for (int64_t rows = 1; rows <= 41; rows += 8)
        for (int64_t cols = 1; cols <= 67; cols += 5) {
            const int64_t ld = cols + 2, first = cols % 3 ? -(int64_t)cols / 2 : 1000003;
            const float scale = rows % 3 ? 0.7f : 1.0f, slope = 1.0f / (float)(cols + 1);
            float x_ref[41 * 69], x_isa[41 * 69], max_ref[68], max_isa[68];
            for (int64_t e = 0; e < rows * ld; ++e) x_ref[e] = x_isa[e] = e % 7 == 3 ? -INFINITY : uniform(-8, 8);
            max_isa[cols] = 99.0f;
            const int with_max = cols % 10 != 6;
            ref->alibi_cols(x_ref, ld, rows, cols, scale, slope, first, with_max ? max_ref : NULL);
            isa->alibi_cols(x_isa, ld, rows, cols, scale, slope, first, with_max ? max_isa : NULL);
            for (int64_t e = 0; e < rows * ld; ++e)
                if (fa_f32_bits(x_isa[e]) != fa_f32_bits(x_ref[e]))
                    fail_msg("alibi_cols %s (%lld, %lld): %.9g vs %.9g", isa->isa, (long long)(e / ld), (long long)(e % ld), x_isa[e], x_ref[e]);
            for (int64_t c = 0; with_max && c < cols; ++c)
                if (max_isa[c] != max_ref[c]) fail_msg("alibi_cols %s col_max[%lld]: %.9g vs %.9g", isa->isa, (long long)c, max_isa[c], max_ref[c]);
            assert_true(max_isa[cols] == 99.0f);
        }
}

/* bias_cols bit for bit against the reference for f32, f16 and bf16 biases (random 16-bit patterns:
 * subnormals, infinities and NaNs widened too) on odd shapes around the W-query and 8-key blocks,
 * padded rows and bias rows (the padding keeps its sentinel), a broadcast bias row (ld_bias 0),
 * masked scores (kept whatever the bias, +inf and NaN included), scales 1 and 0.7; the column max
 * bit for bit as the same ISA's col_max of the results, nothing written past col_max[cols); the
 * keys split over two calls (the max carried in col_max) give the same bits. */
void test_bias_cols(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state), *ref = &fa_cpu_kernels_ref;
    enum { MAX_ROWS = 41, MAX_COLS = 67, LD_MAX = MAX_COLS + 2, LD_BIAS_MAX = MAX_ROWS + 3 };
    static float x_ref[MAX_ROWS * LD_MAX], x_isa[MAX_ROWS * LD_MAX], x_orig[MAX_ROWS * LD_MAX], x_split[MAX_ROWS * LD_MAX];
    static float bias32[MAX_COLS * LD_BIAS_MAX];
    static uint16_t bias16[MAX_COLS * LD_BIAS_MAX];
    float max_isa[MAX_COLS + 1], max_want[MAX_COLS], max_split[MAX_COLS];
    static const char *const dtype_names[] = {"f32", "f16", "bf16"};
    for (int dt = 0; dt < 3; ++dt) {
        const fa_dtype dtype = dt == 0 ? FA_DTYPE_F32 : dt == 1 ? FA_DTYPE_F16 : FA_DTYPE_BF16;
        for (int64_t rows = 1; rows <= MAX_ROWS; rows += rows < 17 ? 1 : 8)
            for (int64_t cols = 1; cols <= MAX_COLS; cols += 5) {
                const int64_t ld = cols + 2, ld_bias = cols % 4 == 1 ? 0 : rows + 3 * (rows % 2);
                const float scale = rows % 3 ? 0.7f : 1.0f;
                const int with_max = cols % 10 != 6;
                for (int64_t e = 0; e < rows * ld; ++e)
                    x_ref[e] = x_isa[e] = x_orig[e] = e % ld >= cols ? 1234.5f : e % 7 == 3 ? -INFINITY : uniform(-8, 8);
                for (int64_t e = 0; e < MAX_COLS * LD_BIAS_MAX; ++e) {
                    bias32[e] = e % 11 == 4 ? INFINITY : e % 13 == 2 ? NAN : uniform(-3, 3);
                    bias16[e] = (uint16_t)(uniform(0, 65536));
                }
                const void *bias = dtype == FA_DTYPE_F32 ? (const void *)bias32 : (const void *)bias16;
                for (int64_t c = 0; c < cols; ++c) max_isa[c] = -INFINITY;
                max_isa[cols] = 99.0f;
                ref->bias_cols(x_ref, ld, rows, cols, scale, bias, dtype, ld_bias, NULL);
                isa->bias_cols(x_isa, ld, rows, cols, scale, bias, dtype, ld_bias, with_max ? max_isa : NULL);
                for (int64_t e = 0; e < rows * ld; ++e)
                    if (fa_f32_bits(x_isa[e]) != fa_f32_bits(x_ref[e]) && !(isnan(x_isa[e]) && isnan(x_ref[e])))
                        fail_msg("bias_cols %s %s %lld x %lld (ld_bias %lld) (%lld, %lld): %.9g vs %.9g", isa->isa,
                                 dtype_names[dt], (long long)rows, (long long)cols, (long long)ld_bias,
                                 (long long)(e / ld), (long long)(e % ld), x_isa[e], x_ref[e]);
                if (!with_max) continue;
                isa->col_max(x_isa, ld, rows, cols, max_want);
                for (int64_t c = 0; c < cols; ++c)
                    if (fa_f32_bits(max_isa[c]) != fa_f32_bits(max_want[c]))
                        fail_msg("bias_cols %s %s %lld x %lld col_max[%lld]: %.9g vs %.9g", isa->isa, dtype_names[dt],
                                 (long long)rows, (long long)cols, (long long)c, max_isa[c], max_want[c]);
                assert_true(max_isa[cols] == 99.0f);
                /* the keys in two calls, the max carried by col_max: the same bits */
                const int64_t split = rows / 2, elem = (int64_t)test_dtype_size(dtype);
                for (int64_t e = 0; e < rows * ld; ++e) x_split[e] = x_orig[e];
                for (int64_t c = 0; c < cols; ++c) max_split[c] = -INFINITY;
                isa->bias_cols(x_split, ld, split, cols, scale, bias, dtype, ld_bias, max_split);
                isa->bias_cols(x_split + split * ld, ld, rows - split, cols, scale, (const char *)bias + split * elem,
                               dtype, ld_bias, max_split);
                if (memcmp(x_split, x_isa, (size_t)(rows * ld) * sizeof(float)) != 0 ||
                    memcmp(max_split, max_isa, (size_t)cols * sizeof(float)) != 0)
                    fail_msg("bias_cols %s %s %lld x %lld: two calls (keys split at %lld) differ from one", isa->isa,
                             dtype_names[dt], (long long)rows, (long long)cols, (long long)split);
            }
    }
}

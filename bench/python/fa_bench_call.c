/* The C side of bench/python/overhead.py and overhead_serving.py: the library's calls on f32 host
 * tensors through the shared library, as the Python package makes them. The buffers are
 * allocated and touched once, before the timed calls: the library's own time. With "fresh", the
 * outputs (out and lse; dq, dk, dv) are malloc'd before and freed after each call inside the
 * timed region, as the torch ops allocate theirs per call.
 *
 * Usage:
 *   fa-bench-call batch heads seqlen head_dim reps [fresh]
 *       fa_forward, then fa_backward, on [batch, seqlen, heads, head_dim] q, k, v (not causal).
 *   fa-bench-call kvcache batch heads_q heads_kv head_dim capacity cache_len page_size seqlen_q
 *                 seqlen_new reps [fresh]
 *       fa_forward_kvcache, causal: q [batch, seqlen_q, heads_q, head_dim] attends to a cache of
 *       `capacity` tokens per sequence holding cache_len, after appending seqlen_new tokens
 *       (0: k_new = v_new = NULL). cache_seqlens stays cache_len, so every repetition writes the
 *       same slots and solves the same problem. page_size 0: a contiguous cache [batch, capacity,
 *       heads_kv, head_dim]; else paged, batch * capacity / page_size pages of page_size tokens,
 *       block_table[b][i] = the pages in reverse order (not the identity).
 *   fa-bench-call varlen heads head_dim causal len0,len1,... reps [fresh]
 *       fa_forward, then fa_backward, on a packed batch (desc->varlen): sequences of the given
 *       lengths (q and k alike), q, k, v [total, heads, head_dim]; lse [heads, total].
 *
 * Prints one line of name=value pairs, per call, over the reps (after 3 warm-up calls):
 *   fwd_us, both_us          median wall time of the forward, of forward + backward
 *   fwd_min_us, both_min_us  the fastest call
 *   fwd_cpu_us, both_cpu_us  median CPU time of the process (all its threads)
 *   faults                   minor page faults per repetition
 * (kvcache: forward only, both_* are the forward's.) */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <flashattn.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, compare);
    return v[n / 2];
}

static double minimum(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; ++i) m = v[i] < m ? v[i] : m;
    return m;
}

static double clock_us(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

static long minor_faults(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt;
}

static float *filled(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; p && i < n; ++i) p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return p;
}

enum { FWD_WALL, BOTH_WALL, FWD_CPU, BOTH_CPU, N_SERIES };

/* The timed repetitions: series[s * reps + r]. */
typedef struct {
    int reps;
    double *series;
    long faults;
    double w0, c0, w1, c1; /* the current repetition's start and the end of its forward */
    long f0;
} timer;

static int timer_init(timer *t, int reps)
{
    memset(t, 0, sizeof *t);
    t->reps = reps;
    t->series = malloc(N_SERIES * (size_t)reps * sizeof *t->series);
    return t->series ? 0 : -1;
}

static void timer_start(timer *t)
{
    t->f0 = minor_faults();
    t->w0 = clock_us(CLOCK_MONOTONIC);
    t->c0 = clock_us(CLOCK_PROCESS_CPUTIME_ID);
}

static void timer_forward_done(timer *t)
{
    t->w1 = clock_us(CLOCK_MONOTONIC);
    t->c1 = clock_us(CLOCK_PROCESS_CPUTIME_ID);
}

/* End of repetition r (< 0: a warm-up call, not recorded). */
static void timer_stop(timer *t, int r)
{
    double w2 = clock_us(CLOCK_MONOTONIC), c2 = clock_us(CLOCK_PROCESS_CPUTIME_ID);
    if (r < 0) return;
    t->series[FWD_WALL * t->reps + r] = t->w1 - t->w0;
    t->series[BOTH_WALL * t->reps + r] = w2 - t->w0;
    t->series[FWD_CPU * t->reps + r] = t->c1 - t->c0;
    t->series[BOTH_CPU * t->reps + r] = c2 - t->c0;
    t->faults += minor_faults() - t->f0;
}

static void timer_print(timer *t)
{
    double *s = t->series;
    int reps = t->reps;
    printf("fwd_min_us=%.2f both_min_us=%.2f ", minimum(s + FWD_WALL * reps, reps),
           minimum(s + BOTH_WALL * reps, reps));
    printf("fwd_us=%.2f both_us=%.2f fwd_cpu_us=%.2f both_cpu_us=%.2f faults=%.1f\n", median(s + FWD_WALL * reps, reps),
           median(s + BOTH_WALL * reps, reps), median(s + FWD_CPU * reps, reps), median(s + BOTH_CPU * reps, reps),
           (double)t->faults / reps);
    free(t->series);
}

static int failed(fa_status s)
{
    if (s == FA_SUCCESS) return 0;
    fprintf(stderr, "%s\n", fa_last_error());
    return 1;
}

/* fa_forward + fa_backward on n packed tensors of `elems` each; desc says dense or varlen. */
static int run_forward_backward(fa_context *ctx, const fa_attention_desc *desc, fa_tensor shape, size_t elems,
                                size_t lse_elems, int reps, int fresh)
{
    float *buf = filled(8 * elems), *lse = malloc(lse_elems * sizeof *lse);
    timer tm;
    if (!buf || !lse || timer_init(&tm, reps) < 0) return 1;
    fa_tensor t[8];
    for (int i = 0; i < 8; ++i) {
        t[i] = shape;
        t[i].data = buf + (size_t)i * elems;
    }
    for (int r = -3; r < reps; ++r) { /* 3 warm-up calls */
        timer_start(&tm);
        fa_tensor out = t[3], grads[3] = {t[5], t[6], t[7]};
        float *call_lse = lse;
        if (fresh && !(out.data = malloc(elems * sizeof(float)))) return 1;
        if (fresh && !(call_lse = malloc(lse_elems * sizeof *lse))) return 1;
        fa_status s1 = fa_forward(ctx, desc, &t[0], &t[1], &t[2], &out, call_lse);
        timer_forward_done(&tm);
        for (int i = 0; fresh && i < 3; ++i)
            if (!(grads[i].data = malloc(elems * sizeof(float)))) return 1;
        fa_status s2 = fa_backward(ctx, desc, &t[0], &t[1], &t[2], &out, &t[4], call_lse, &grads[0], &grads[1],
                                   &grads[2]);
        for (int i = 0; fresh && i < 3; ++i) free(grads[i].data);
        if (fresh) {
            free(out.data);
            free(call_lse);
        }
        timer_stop(&tm, r);
        if (failed(s1) || failed(s2)) return 1;
    }
    timer_print(&tm);
    free(lse);
    free(buf);
    return 0;
}

static int dense(fa_context *ctx, char **argv, int reps, int fresh)
{
    int64_t b = atoll(argv[0]), h = atoll(argv[1]), n = atoll(argv[2]), d = atoll(argv[3]);
    if (b < 1 || h < 1 || n < 1 || d < 1) return 2;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    fa_tensor shape = {NULL, FA_DTYPE_F32, b, n, h, d, 0, 0, 0};
    return run_forward_backward(ctx, &desc, shape, (size_t)(b * n * h * d), (size_t)(b * h * n), reps, fresh);
}

static int varlen(fa_context *ctx, char **argv, int reps, int fresh)
{
    int64_t h = atoll(argv[0]), d = atoll(argv[1]);
    int causal = atoi(argv[2]);
    int32_t cu[257] = {0};
    int64_t batch = 0, max_len = 0;
    for (char *p = argv[3]; *p; ++batch) {
        char *end;
        long len = strtol(p, &end, 10);
        if (end == p || len < 0 || batch == 256 || (*end && *end != ',')) return 2;
        cu[batch + 1] = cu[batch] + (int32_t)len;
        max_len = len > max_len ? len : max_len;
        p = *end ? end + 1 : end;
    }
    if (h < 1 || d < 1 || batch < 1) return 2;
    int64_t total = cu[batch];
    fa_varlen vl = {batch, cu, cu, max_len, max_len};
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = causal;
    desc.varlen = &vl;
    fa_tensor shape = {NULL, FA_DTYPE_F32, 1, total, h, d, 0, 0, 0};
    return run_forward_backward(ctx, &desc, shape, (size_t)(total * h * d), (size_t)(h * total), reps, fresh);
}

static int kvcache(fa_context *ctx, char **argv, int reps, int fresh)
{
    int64_t b = atoll(argv[0]), hq = atoll(argv[1]), hkv = atoll(argv[2]), d = atoll(argv[3]);
    int64_t capacity = atoll(argv[4]), cache_len = atoll(argv[5]), page = atoll(argv[6]);
    int64_t sq = atoll(argv[7]), snew = atoll(argv[8]);
    if (b < 1 || hq < 1 || hkv < 1 || d < 1 || capacity < 1 || cache_len < 0 || page < 0 || sq < 1 || snew < 0 ||
        (page && capacity % page) || b * hq * sq > 0x7fffffff)
        return 2;
    const int64_t pages_per_seq = page ? capacity / page : 0, n_pages = b * pages_per_seq;
    const size_t q_elems = (size_t)(b * sq * hq * d), new_elems = (size_t)(b * snew * hkv * d);
    const size_t cache_elems = (size_t)(b * capacity * hkv * d), lse_elems = (size_t)(b * hq * sq);
    float *q = filled(q_elems), *out = filled(q_elems), *lse = malloc(lse_elems * sizeof *lse);
    float *kc = filled(cache_elems), *vc = filled(cache_elems), *kn = filled(new_elems), *vn = filled(new_elems);
    int32_t *seqlens = malloc((size_t)b * sizeof *seqlens);
    int32_t *table = malloc((size_t)(n_pages ? n_pages : 1) * sizeof *table);
    timer tm;
    if (!q || !out || !lse || !kc || !vc || !kn || !vn || !seqlens || !table || timer_init(&tm, reps) < 0) return 1;
    for (int64_t i = 0; i < b; ++i) seqlens[i] = (int32_t)cache_len;
    for (int64_t i = 0; i < n_pages; ++i) table[i] = (int32_t)(n_pages - 1 - i);
    fa_kv_cache cache = {
        .k = {kc, FA_DTYPE_F32, page ? n_pages : b, page ? page : capacity, hkv, d, 0, 0, 0},
        .v = {vc, FA_DTYPE_F32, page ? n_pages : b, page ? page : capacity, hkv, d, 0, 0, 0},
        .block_table = page ? table : NULL,
        .max_pages_per_seq = pages_per_seq,
        .cache_seqlens = seqlens,
    };
    fa_tensor tq = {q, FA_DTYPE_F32, b, sq, hq, d, 0, 0, 0};
    fa_tensor tk = {kn, FA_DTYPE_F32, b, snew, hkv, d, 0, 0, 0}, tv = tk;
    tv.data = vn;
    fa_attention_desc desc;
    fa_attention_desc_init(&desc);
    desc.causal = 1;
    for (int r = -3; r < reps; ++r) {
        timer_start(&tm);
        fa_tensor o = {out, FA_DTYPE_F32, b, sq, hq, d, 0, 0, 0};
        float *call_lse = lse;
        if (fresh && !(o.data = malloc(q_elems * sizeof(float)))) return 1;
        if (fresh && !(call_lse = malloc(lse_elems * sizeof *lse))) return 1;
        fa_status s = fa_forward_kvcache(ctx, &desc, &tq, &cache, snew ? &tk : NULL, snew ? &tv : NULL, &o, call_lse);
        if (fresh) {
            free(o.data);
            free(call_lse);
        }
        timer_forward_done(&tm);
        timer_stop(&tm, r);
        if (failed(s)) return 1;
    }
    timer_print(&tm);
    float *buffers[] = {q, out, lse, kc, vc, kn, vn};
    for (size_t i = 0; i < sizeof buffers / sizeof *buffers; ++i) free(buffers[i]);
    free(seqlens);
    free(table);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name; /* NULL: the dense mode, no mode word */
        int n_args;       /* before reps */
        int (*run)(fa_context *, char **, int, int);
        const char *usage;
    } modes[] = {
        {NULL, 4, dense, "batch heads seqlen head_dim reps [fresh]"},
        {"kvcache", 9, kvcache,
         "kvcache batch heads_q heads_kv head_dim capacity cache_len page_size seqlen_q seqlen_new reps [fresh]"},
        {"varlen", 4, varlen, "varlen heads head_dim causal len0,len1,... reps [fresh]"},
    };
    int m = 0;
    for (int i = 1; i < 3; ++i)
        if (argc > 1 && strcmp(argv[1], modes[i].name) == 0) m = i;
    char **args = argv + 1 + (m != 0);
    int n_left = argc - 1 - (m != 0) - modes[m].n_args; /* reps [fresh] */
    const int fresh = n_left == 2 && strcmp(args[modes[m].n_args + 1], "fresh") == 0;
    int reps = n_left >= 1 ? atoi(args[modes[m].n_args]) : 0;
    if ((n_left != 1 && !fresh) || reps < 1) {
        for (int i = 0; i < 3; ++i) fprintf(stderr, "%s %s %s\n", i ? "      " : "usage:", argv[0], modes[i].usage);
        return 2;
    }
    fa_context *ctx;
    if (failed(fa_context_create(FA_BACKEND_CPU, 0, &ctx))) return 1;
    int rc = modes[m].run(ctx, args, reps, fresh);
    if (rc == 2) fprintf(stderr, "%s: bad %s arguments\n", argv[0], m ? modes[m].name : "dense");
    fa_context_destroy(ctx);
    return rc;
}

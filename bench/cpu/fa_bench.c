/* fa-bench: the CPU backend against standard attention, forward, backward and both, in one run.
 * Prints a table (ms, GFLOP/s; fractions of the machine's FMA peak for the selected kernels, of
 * those kernels' gemm on an L1-resident product and of the BLAS sgemm rate, all measured in the
 * same run; speedup over standard attention; peak extra memory) with a progress line on stderr,
 * and optionally CSV.
 * Run `fa-bench --help` for the options. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_clock.h"
#include "common/alloc.h"
#include "common/half.h"
#include "fma_peak.h" /* bench/cpu/probe */
#include "flashattn.h"
#include "flops.h" /* bench/flops.h */
#include "torch_column.h"
#ifdef FA_BENCH_HAVE_OPENBLAS
#include "std_attention.h"
#endif

enum { MAX_LIST = 16, MAX_REPS = 64 };
typedef fa_bench_pass pass; /* bench/flops.h: the passes the FLOP convention counts */
#define PASS_FWD FA_BENCH_FWD
#define PASS_BWD FA_BENCH_BWD
#define PASS_FWDBWD FA_BENCH_FWDBWD
static const char *pass_names[] = {"fwd", "bwd", "fwd+bwd"};
static const char *dtype_names[] = {"f32", "f16", "bf16"}; /* indexed by fa_dtype */

typedef struct options {
    int64_t n[MAX_LIST], d[MAX_LIST];
    int n_count, d_count, heads, threads, max_reps, std_max_n, info, masks; /* masks: bit 0 dense, bit 1 causal */
    int passes;                                                           /* bit per pass */
    int median;                                                           /* 1: median of the reps, 0: best */
    int dtypes;                                                           /* bit per fa_dtype */
    int torch;                                                            /* 1: PyTorch column if torch loads */
    const char *layout;                                                   /* --layout: "bnhd" or "bhnd" */
    double min_seconds;
    const char *csv;
} options;

typedef struct tensors {
    float *q, *k, *v, *out, *dout, *dq, *dk, *dv, *lse;
    uint16_t *half[8]; /* q, k, v, out, dout, dq, dk, dv in f16 or bf16 (--dtype) */
} tensors;

/* "f32,f16,bf16" -> a bit per fa_dtype, 0 on an unknown name. */
static int parse_dtypes(const char *s)
{
    int bits = 0;
    while (*s) {
        const size_t len = strcspn(s, ",");
        int found = 0;
        for (int t = 0; t < 3; ++t)
            if (strlen(dtype_names[t]) == len && !strncmp(s, dtype_names[t], len)) bits |= 1 << t, found = 1;
        if (!found) return 0;
        s += len + (s[len] == ',');
    }
    return bits;
}

/* "fwd,fwdbwd" -> a bit per pass (all = every pass), 0 on an unknown name. */
static int parse_passes(const char *s)
{
    static const char *const names[] = {"fwd", "bwd", "fwdbwd", "all"};
    int bits = 0;
    while (*s) {
        const size_t len = strcspn(s, ",");
        int found = 0;
        for (int t = 0; t < 4; ++t)
            if (strlen(names[t]) == len && !strncmp(s, names[t], len)) bits |= t == 3 ? 7 : 1 << t, found = 1;
        if (!found) return 0;
        s += len + (s[len] == ',');
    }
    return bits;
}

static int parse_list(const char *s, int64_t *out)
{
    int count = 0;
    while (*s && count < MAX_LIST) {
        char *end;
        out[count++] = strtoll(s, &end, 10);
        if (end == s || out[count - 1] <= 0) return -1;
        s = *end == ',' ? end + 1 : end;
    }
    return count;
}

static void usage(void)
{
    puts("usage: fa-bench [--info] [--quick] [--n 512,1024,...] [--d 64,128] [--heads 8] [--threads 2]\n"
         "                [--mask dense|causal|both] [--pass fwd,bwd,fwdbwd|all] [--reps 3] [--min-time 1.0]\n"
         "                [--std-max-n 8192] [--stat best|median] [--clock wall|cpu] [--dtype f32,f16,bf16] [--torch auto|off]\n"
         "                [--layout bnhd|bhnd]\n"
         "                [--csv FILE]\n"
         "  Default: N = 512..16384, d = 64 and 128, dense and causal, all passes, 8 heads, 2 threads.\n"
         "  --quick: N = 512, 1024, 2048, d = 64, median of 3 timed repetitions after a warm-up run.\n"
         "  Standard attention runs up to --std-max-n (it needs 2 N x N floats per thread).\n"
         "  --stat: report the best (default) or the median of the timed repetitions.\n"
         "  --clock cpu: process CPU time / threads instead of wall time (a loaded machine, --threads 1).\n"
         "  --dtype: input/output types to time (default f32); with several, 't/f32' is each row's time over\n"
         "           the f32 time of the same cell (standard attention is f32 only).\n"
         "  --torch auto (default): a PyTorch scaled_dot_product_attention column, timed in the same run by\n"
         "           bench/cpu/torch_sdpa.py when `$FA_BENCH_PYTHON -c 'import torch'` works (default python3).\n"
         "  --layout: the tensors' memory for every column: bnhd (default) [B, N, H, d], heads interleaved\n"
         "           (FlashAttention's layout; PyTorch gets it as a transposed view), or bhnd [B, H, N, d],\n"
         "           each head's rows contiguous (PyTorch's own layout).\n"
         "  FLASHATTN_CPU_ISA=ref|avx2|avx512|neon forces the kernels.");
}

static int parse_options(int argc, char **argv, options *o)
{
    *o = (options){.n = {512, 1024, 2048, 4096, 8192, 16384}, .d = {64, 128}, .n_count = 6, .d_count = 2,
                   .heads = 8, .threads = 2, .max_reps = 3, .std_max_n = 8192, .masks = 3, .passes = 7, .dtypes = 1, .torch = 1,
                   .min_seconds = 1.0, .layout = "bnhd"};
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--info")) o->info = 1;
        else if (!strcmp(a, "--quick")) {
            o->n_count = parse_list("512,1024,2048", o->n);
            o->d_count = parse_list("64", o->d);
            o->max_reps = 3;
            o->median = 1;
            o->min_seconds = 0.0;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); exit(0); }
        else if (!val) { fprintf(stderr, "fa-bench: %s needs a value or is unknown (see --help)\n", a); return -1; }
        else {
            ++i;
            if (!strcmp(a, "--n")) o->n_count = parse_list(val, o->n);
            else if (!strcmp(a, "--d")) o->d_count = parse_list(val, o->d);
            else if (!strcmp(a, "--heads")) o->heads = atoi(val);
            else if (!strcmp(a, "--threads")) o->threads = atoi(val);
            else if (!strcmp(a, "--reps")) o->max_reps = atoi(val);
            else if (!strcmp(a, "--min-time")) o->min_seconds = atof(val);
            else if (!strcmp(a, "--std-max-n")) o->std_max_n = atoi(val);
            else if (!strcmp(a, "--csv")) o->csv = val;
            else if (!strcmp(a, "--dtype")) o->dtypes = parse_dtypes(val);
            else if (!strcmp(a, "--torch") && (!strcmp(val, "auto") || !strcmp(val, "off"))) o->torch = !strcmp(val, "auto");
            else if (!strcmp(a, "--layout") && (!strcmp(val, "bnhd") || !strcmp(val, "bhnd"))) o->layout = val;
            else if (!strcmp(a, "--stat") && (!strcmp(val, "best") || !strcmp(val, "median"))) o->median = !strcmp(val, "median");
            else if (!strcmp(a, "--clock") && (!strcmp(val, "wall") || !strcmp(val, "cpu"))) bench_use_cpu_clock = !strcmp(val, "cpu");
            else if (!strcmp(a, "--mask")) o->masks = !strcmp(val, "dense") ? 1 : !strcmp(val, "causal") ? 2 : !strcmp(val, "both") ? 3 : 0;
            else if (!strcmp(a, "--pass")) o->passes = parse_passes(val);
            else { fprintf(stderr, "fa-bench: unknown option %s (see --help)\n", a); return -1; }
        }
    }
    if (o->n_count <= 0 || o->d_count <= 0 || o->heads <= 0 || o->threads <= 0 || o->max_reps <= 0 || o->max_reps > MAX_REPS || !o->masks || !o->dtypes ||
        !o->passes) {
        fprintf(stderr, "fa-bench: invalid option value (see --help)\n");
        return -1;
    }
    return 0;
}

static float *alloc_filled(size_t count, unsigned seed)
{
    float *x = malloc(count * sizeof(float));
    if (!x) return NULL;
    for (size_t i = 0; i < count; ++i) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    }
    return x;
}

static void tensors_free(tensors *t)
{
    float **all[] = {&t->q, &t->k, &t->v, &t->out, &t->dout, &t->dq, &t->dk, &t->dv, &t->lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) { free(*all[i]); *all[i] = NULL; }
    for (int i = 0; i < 8; ++i) { free(t->half[i]); t->half[i] = NULL; }
}

/* The f16 or bf16 copies of the eight tensors (inputs rounded from the f32 ones). */
static int tensors_to_half(tensors *t, size_t count, fa_dtype dtype)
{
    const float *src[8] = {t->q, t->k, t->v, t->out, t->dout, t->dq, t->dk, t->dv};
    for (int i = 0; i < 8; ++i) {
        if (!t->half[i] && !(t->half[i] = malloc(count * sizeof(uint16_t)))) return -1;
        for (size_t e = 0; e < count; ++e)
            t->half[i][e] = dtype == FA_DTYPE_F16 ? fa_f32_to_f16(src[i][e]) : fa_f32_to_bf16(src[i][e]);
    }
    return 0;
}

static int tensors_alloc(tensors *t, int64_t n, int64_t heads, int64_t d)
{
    const size_t count = (size_t)(n * heads * d);
    t->q = alloc_filled(count, 1);
    t->k = alloc_filled(count, 2);
    t->v = alloc_filled(count, 3);
    t->dout = alloc_filled(count, 4);
    t->out = alloc_filled(count, 5); /* filled: the pages are resident before the peak is reset */
    t->dq = alloc_filled(count, 6);
    t->dk = alloc_filled(count, 7);
    t->dv = alloc_filled(count, 8);
    t->lse = alloc_filled((size_t)(n * heads), 9);
    if (t->q && t->k && t->v && t->dout && t->out && t->dq && t->dk && t->dv && t->lse) return 0;
    tensors_free(t);
    return -1;
}

typedef struct run_ctx {
    fa_context *ctx;
    fa_attention_desc desc;
    fa_tensor q, k, v, out, dout, dq, dk, dv;
    float *lse;
} run_ctx;

static int run_flash(run_ctx *r, pass which)
{
    if (which != PASS_BWD && fa_forward(r->ctx, &r->desc, &r->q, &r->k, &r->v, &r->out, r->lse) != FA_SUCCESS)
        return -1;
    if (which != PASS_FWD &&
        fa_backward(r->ctx, &r->desc, &r->q, &r->k, &r->v, &r->out, &r->dout, r->lse, &r->dq, &r->dk, &r->dv) !=
            FA_SUCCESS)
        return -1;
    return 0;
}

#ifdef FA_BENCH_HAVE_OPENBLAS
static int run_std(const std_problem *p, pass which)
{
    return which == PASS_FWD ? std_forward(p) : which == PASS_BWD ? std_backward(p) : std_forward_backward(p);
}
#endif

typedef struct measurement { double seconds; long long peak_bytes; int ok; } measurement;

/* Median of count times (sorts them). */
static double median_of(double *t, int count)
{
    for (int i = 1; i < count; ++i)
        for (int j = i; j > 0 && t[j] < t[j - 1]; --j) {
            const double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return count % 2 ? t[count / 2] : 0.5 * (t[count / 2 - 1] + t[count / 2]);
}

/* Best (or median) time of up to max_reps runs (stopping once min_seconds have been spent), after
 * one untimed warm-up run when more than one repetition is asked for (thread start, first touch of
 * the scratch memory, caches); peak memory above the resident size before the first run, with the
 * library's parked scratch (fa_host_scratch_alloc) given back first so that it counts. */
#define MEASURE(result, opts, call)                                                                             \
    do {                                                                                                        \
        fa_host_scratch_release(); /* scratch parked by earlier calls counts as this call's memory */           \
        const long long base_ = bench_peak_reset();                                                             \
        (result).ok = (opts)->max_reps > 1 ? (call) == 0 : 1;                                                   \
        double times_[MAX_REPS], spent_ = 0.0;                                                                  \
        int reps_ = 0;                                                                                          \
        for (; (result).ok && reps_ < (opts)->max_reps && (reps_ == 0 || spent_ < (opts)->min_seconds); ++reps_) { \
            const double t0_ = bench_seconds();                                                                 \
            (result).ok = (call) == 0;                                                                          \
            times_[reps_] = bench_seconds() - t0_;                                                              \
            spent_ += times_[reps_];                                                                            \
        }                                                                                                       \
        (result).seconds = reps_ ? median_of(times_, reps_) : 1e30;                                             \
        if (!(opts)->median && reps_) (result).seconds = times_[0]; /* sorted: the best */                     \
        const long long peak_ = bench_peak();                                                                   \
        (result).peak_bytes = base_ >= 0 && peak_ >= 0 ? peak_ - base_ : -1;                                    \
    } while (0)

/* Each engine starts on idle cores: OpenBLAS's threads (the sgemm rate, standard attention) spin
 * for about 2^28 cycles after a call (its THREAD_TIMEOUT), and OpenMP's for a while after a
 * parallel region; on a 2-core machine a flash run started inside that window ran 2-4x slow
 * (N = 512: 3.6 ms or 7.5-16 ms, run to run, with nothing else on the machine). */
static void let_engines_idle(void)
{
    const struct timespec pause = {0, 150 * 1000 * 1000};
    nanosleep(&pause, NULL);
}

static void print_info(fa_context *ctx, const options *o)
{
    printf("%s\n", fa_context_info(ctx));
    for (int i = 0; i < o->d_count; ++i) {
        fa_tiling t;
        int64_t sram = 0;
        if (fa_context_tiling(ctx, o->d[i], FA_DTYPE_F32, &t, &sram) == FA_SUCCESS)
            printf("tiles for d = %lld: Br = %lld, Bc = %lld (M = %lld f32 elements; the forward may take other "
                   "query-tile heights, see docs/CPU.md)\n", (long long)o->d[i],
                   (long long)t.block_rows, (long long)t.block_cols, (long long)sram);
    }
#ifdef FA_BENCH_HAVE_OPENBLAS
    const char *was = getenv("FA_BENCH_BLAS_CORE_WAS");
    printf("standard attention: OpenBLAS sgemm (%s kernels) + vectorised softmax\n", openblas_core_name());
    if (was)
        printf("  OpenBLAS took %s kernels on this CPU, which it does not know; fa-bench ran itself again with "
               "OPENBLAS_CORETYPE=%s (set OPENBLAS_CORETYPE to choose)\n", was, getenv("OPENBLAS_CORETYPE"));
#else
    printf("standard attention: not built (OpenBLAS not found at configure time)\n");
#endif
}

int main(int argc, char **argv)
{
    options o;
    if (parse_options(argc, argv, &o)) return 2;
    bench_cpu_threads = o.threads;
    /* The kernels the context will select (FLASHATTN_CPU_ISA included): their ISA picks OpenBLAS's
     * core below and their FMA chains measure the peak. */
    const fa_cpu_kernels *kernels = NULL;
    if (fa_cpu_select_kernels(&kernels) != FA_SUCCESS) { fprintf(stderr, "fa-bench: %s\n", fa_last_error()); return 1; }
#if defined(FA_BENCH_HAVE_OPENBLAS) && defined(__linux__)
    /* OpenBLAS reads OPENBLAS_CORETYPE when it is loaded, before main: a baseline on SSE3 kernels
     * (a CPU newer than the OpenBLAS) would flatter every speedup, so run again under the core
     * the CPU can run, and say so. */
    const char *blas_core = std_blas_core_for(kernels->isa);
    if (blas_core && !getenv("FA_BENCH_BLAS_CORE_WAS")) {
        setenv("FA_BENCH_BLAS_CORE_WAS", openblas_core_name(), 1);
        setenv("OPENBLAS_CORETYPE", blas_core, 1);
        execv("/proc/self/exe", argv);
        fprintf(stderr, "fa-bench: could not run again with OPENBLAS_CORETYPE=%s; standard attention keeps %s kernels\n",
                blas_core, openblas_core_name());
    }
#endif
    fa_context *ctx = NULL;
    if (fa_context_create(FA_BACKEND_CPU, 0, &ctx) != FA_SUCCESS ||
        fa_context_set_num_threads(ctx, o.threads) != FA_SUCCESS) {
        fprintf(stderr, "fa-bench: %s\n", fa_last_error());
        return 1;
    }
    print_info(ctx, &o);
    torch_column torch = {0};
    if (o.torch) {
        fprintf(stderr, "starting PyTorch for its column...\n");
        torch_column_start(&torch, o.threads, bench_use_cpu_clock);
        printf("%s\n", torch.about);
    }
    if (o.info) { torch_column_stop(&torch); fa_context_destroy(ctx); return 0; }

    /* The physical limit: register-only FMA chains of the kernels the context selected, on the
     * benchmark's threads, in this run. */
    fprintf(stderr, "measuring the FMA peak (%s, %d threads)...\n", kernels->isa, o.threads);
    double fma_peak = fa_cpu_fma_peak(kernels, o.threads);
    printf("FMA peak, %s kernels, %d threads: %.1f GFLOP/s (register-only FMA chains, probed again before each row; "
           "the 'of peak' column divides by the highest probe so far)\n", kernels->isa, o.threads, fma_peak);
    const double fma_peak_start = fma_peak;
    /* What the cores deliver now to the product kernel with every operand in L1: a neighbour on the
     * core (an SMT sibling) slows it while the register-only chains run at full rate. */
    const double l1_start = fa_cpu_l1_gemm_rate(kernels, o.threads);
    printf("gemm kernel in L1, %d threads: %.1f GFLOP/s = %.2f of the FMA peak (48 x 32 x 64 products that stay in L1, "
           "probed before and after each row; the 'of L1' column divides by their mean. The vector kernels reach 0.9-1.0 "
           "of the peak here on an idle core, less while something else uses its caches and loads, as an SMT sibling "
           "does: the register-only chains do not feel that)\n", o.threads, l1_start, l1_start / fma_peak);
    /* The probe times each thread in its own CPU time; wall-clock rows fall with the load. */
    double load = -1.0;
    FILE *loadavg = fopen("/proc/loadavg", "r");
    if (loadavg) {
        if (fscanf(loadavg, "%lf", &load) != 1) load = -1.0;
        fclose(loadavg);
    }
    if (load >= 0.0)
        printf("load average %.2f on %ld cores%s\n", load, sysconf(_SC_NPROCESSORS_ONLN),
               load > 0.5 * (double)sysconf(_SC_NPROCESSORS_ONLN) && !bench_use_cpu_clock
                   ? ": other jobs share the cores, wall-clock fractions of the peak will be low (try --clock cpu)"
                   : "");
    double sgemm_rate = 0.0;
#ifdef FA_BENCH_HAVE_OPENBLAS
    fprintf(stderr, "measuring the OpenBLAS sgemm rate (2048^3, %d threads)...\n", o.threads);
    sgemm_rate = std_sgemm_rate(2048, o.threads, 10); /* best of 10: a shared machine's noise only slows */
    printf("sgemm 2048^3, %d threads: %.1f GFLOP/s = %.2f of the FMA peak (what the BLAS reaches; the 'of BLAS' "
           "column divides by this)\n", o.threads, sgemm_rate, sgemm_rate / fma_peak);
#endif
    printf("times: %s of up to %d repetitions%s, %s; FLOPs (bench/flops.h): 4 N^2 d per head forward, 2.5x that backward, "
           "causal counts the N(N+1)/2 visible scores\n",
           o.median ? "median" : "best", o.max_reps, o.max_reps > 1 ? " after a warm-up run" : " (no warm-up)",
           bench_use_cpu_clock ? "process CPU time / threads" : "wall clock");
    /* --layout bhnd: [B, H, N, d], each head's rows contiguous; else [B, N, H, d] */
    const int heads_outer = !strcmp(o.layout, "bhnd");
    printf("tensors: %s, batch 1, %d heads, the same memory for every column\n",
           heads_outer ? "[B, H, N, d] (--layout bhnd: each head's rows contiguous)"
                         : "[B, N, H, d] (heads interleaved, FlashAttention's layout; PyTorch takes it as a transposed view)",
           o.heads);
    FILE *csv = o.csv ? fopen(o.csv, "w") : NULL;
    if (o.csv && !csv) { fprintf(stderr, "fa-bench: cannot write %s\n", o.csv); return 1; }
    if (csv)
        fprintf(csv, "pass,n,d,heads,threads,mask,flash_ms,flash_gflops,flash_sgemm_fraction,flash_extra_mib,"
                     "std_ms,std_gflops,std_extra_mib,speedup,sgemm_gflops,isa,dtype,time_vs_f32,torch_ms,speedup_vs_torch,"
                     "fma_peak_gflops,flash_fma_fraction,l1_gemm_gflops,flash_l1_fraction,layout\n");
    const char *isa = strstr(fa_context_info(ctx), "isa ");
    char isa_name[16] = "?";
    if (isa) sscanf(isa + 4, "%15[^,]", isa_name);
    printf("\n%-8s %6s %4s %-6s %-4s | %10s %8s %7s %6s %7s %9s | %10s %8s %9s | %7s%s%s\n", "pass", "N", "d", "mask", "type",
           "flash ms", "GFLOP/s", "of peak", "of L1", "of BLAS", "extra MiB", "std ms", "GFLOP/s", "extra MiB", "speedup",
           __builtin_popcount((unsigned)o.dtypes) > 1 ? " | t/f32" : "", torch.to ? " |   torch ms vs torch" : "");

    const int total = o.n_count * o.d_count * __builtin_popcount((unsigned)o.masks) *
                      __builtin_popcount((unsigned)o.passes) * __builtin_popcount((unsigned)o.dtypes);
    const int several_dtypes = __builtin_popcount((unsigned)o.dtypes) > 1;
    int done = 0, failures = 0, over_peak = 0;
    for (int di = 0; di < o.d_count; ++di)
        for (int ni = 0; ni < o.n_count; ++ni) {
            const int64_t n = o.n[ni], d = o.d[di];
            tensors t = {0};
            if (tensors_alloc(&t, n, o.heads, d)) { fprintf(stderr, "fa-bench: out of memory at N = %lld\n", (long long)n); return 1; }
            for (int causal = 0; causal < 2; ++causal) {
                if (!(o.masks & (1 << causal))) continue;
                for (int ps = 0; ps < 3; ++ps) {
                    if (!(o.passes & (1 << ps))) continue;
                    double f32_seconds = 0.0; /* this cell's f32 time, for t/f32 */
                    for (int dt = 0; dt < 3; ++dt) {
                        if (!(o.dtypes & (1 << dt))) continue;
                        const fa_dtype dtype = (fa_dtype)dt;
                        if (dtype != FA_DTYPE_F32 && tensors_to_half(&t, (size_t)(n * o.heads * d), dtype)) {
                            fprintf(stderr, "fa-bench: out of memory at N = %lld\n", (long long)n);
                            return 1;
                        }
                        run_ctx r = {.ctx = ctx, .lse = t.lse};
                        fa_attention_desc_init(&r.desc);
                        r.desc.causal = causal;
                        /* the layout's strides (floats), for the library's tensors and standard attention
                         * alike: the same buffers either way */
                        const int64_t row_stride = heads_outer ? d : o.heads * d, head_stride = heads_outer ? n * d : d;
                        const fa_tensor shape = {NULL, dtype, 1, n, o.heads, d, o.heads * n * d, row_stride, head_stride};
                        fa_tensor *views[8] = {&r.q, &r.k, &r.v, &r.out, &r.dout, &r.dq, &r.dk, &r.dv};
                        float *f32_data[8] = {t.q, t.k, t.v, t.out, t.dout, t.dq, t.dk, t.dv};
                        for (int i = 0; i < 8; ++i) {
                            *views[i] = shape;
                            views[i]->data = dtype == FA_DTYPE_F32 ? (void *)f32_data[i] : (void *)t.half[i];
                        }
                        if (run_flash(&r, PASS_FWD)) { fprintf(stderr, "fa-bench: %s\n", fa_last_error()); return 1; } /* lse for bwd */
                        fprintf(stderr, "\r[%d/%d] %s N=%lld d=%lld %s %s ...            ", ++done, total, pass_names[ps],
                                (long long)n, (long long)d, causal ? "causal" : "dense", dtype_names[dt]);
                        measurement flash, std = {0, -1, 0};
                        /* A neighbour holding the cores during the first probe (a VM's stolen time counts
                         * as the probe's own CPU time) read half the peak and marked every row above it;
                         * the physical limit is the highest rate the chains ever reach. */
                        const double probe = fa_cpu_fma_peak(kernels, o.threads);
                        if (probe > fma_peak) fma_peak = probe;
                        const double l1_before = fa_cpu_l1_gemm_rate(kernels, o.threads);
                        let_engines_idle();
                        MEASURE(flash, &o, run_flash(&r, (pass)ps));
                        /* a failed row costs nothing more: no baseline, no PyTorch, no second probe */
                        if (!flash.ok) { ++failures; fprintf(stderr, "\nfa-bench: %s\n", fa_last_error()); continue; }
#ifdef FA_BENCH_HAVE_OPENBLAS
                        const std_problem sp = {n, o.heads, d, row_stride, head_stride, causal, o.threads,
                                                t.q, t.k, t.v, t.dout, t.out, t.dq, t.dk, t.dv};
                        if (dtype == FA_DTYPE_F32 && n <= o.std_max_n) {
                            let_engines_idle();
                            MEASURE(std, &o, run_std(&sp, (pass)ps));
                        }
#endif
                        const int with_torch = torch.to != NULL;
                        if (with_torch && dtype == FA_DTYPE_F32) let_engines_idle();
                        const double torch_ms = with_torch && dtype == FA_DTYPE_F32
                                                    ? torch_column_time(&torch, pass_names[ps], n, d, o.heads, o.layout, causal,
                                                                        o.max_reps, o.min_seconds, o.median)
                                                    : -1.0;
                        const double vs_torch = torch_ms > 0 ? torch_ms / (flash.seconds * 1e3) : 0.0;
                        /* the cores' state changes over seconds: the mean of the probes around the row */
                        const double l1_rate = 0.5 * (l1_before + fa_cpu_l1_gemm_rate(kernels, o.threads));
                        if (dtype == FA_DTYPE_F32) f32_seconds = flash.seconds;
                        const double vs_f32 = f32_seconds > 0 ? flash.seconds / f32_seconds : 0.0;
                        const double flops = fa_bench_attention_flops(o.heads, n, n, d, causal, (pass)ps);
                        const double fg = flops / flash.seconds * 1e-9, sg = std.ok ? flops / std.seconds * 1e-9 : 0.0;
                        const double fmib = flash.peak_bytes / 1048576.0, smib = std.peak_bytes / 1048576.0;
                        fprintf(stderr, "\r%70s\r", "");
                        const double of_peak = fg / fma_peak;
                        /* Above the physical limit: the FLOP count or the timer is wrong. bf16 rows may
                         * reach 2 (vdpbf16ps, AVX-512-BF16: two products per lane and instruction
                         * against the f32 FMA's one; gemm_max_bf16 in docs/CPU.md). */
                        const double limit = dtype == FA_DTYPE_BF16 ? 2.0 : 1.0;
                        if (of_peak > limit) ++over_peak;
                        printf("%-8s %6lld %4lld %-6s %-4s | %10.2f %8.1f %6.2f%s %6.2f %7.2f %9.1f | ", pass_names[ps],
                               (long long)n, (long long)d, causal ? "causal" : "dense", dtype_names[dt], flash.seconds * 1e3,
                               fg, of_peak, of_peak > limit ? "!" : " ", fg / l1_rate,
                               sgemm_rate > 0 ? fg / sgemm_rate : NAN, fmib);
                        if (std.ok) printf("%10.2f %8.1f %9.1f | %6.2fx", std.seconds * 1e3, sg, smib, std.seconds / flash.seconds);
                        else printf("%10s %8s %9s | %7s", "-", "-", "-", "-");
                        if (several_dtypes) {
                            if (vs_f32 > 0) printf(" | %5.2f", vs_f32);
                            else printf(" | %5s", "-");
                        }
                        if (with_torch) {
                            if (torch_ms > 0) printf(" | %10.2f %7.2fx", torch_ms, vs_torch);
                            else printf(" | %10s %8s", "-", "-");
                        }
                        printf("\n");
                        fflush(stdout);
                        if (csv)
                            fprintf(csv, "%s,%lld,%lld,%d,%d,%s,%.4f,%.2f,%.4f,%.1f,%.4f,%.2f,%.1f,%.3f,%.2f,%s,%s,%.4f,%.4f,%.3f,%.2f,%.4f,%.2f,%.4f,%s\n",
                                    pass_names[ps], (long long)n, (long long)d, o.heads, o.threads,
                                    causal ? "causal" : "dense", flash.seconds * 1e3, fg,
                                    sgemm_rate > 0 ? fg / sgemm_rate : 0.0, fmib, std.ok ? std.seconds * 1e3 : 0.0, sg,
                                    std.ok ? smib : 0.0, std.ok ? std.seconds / flash.seconds : 0.0, sgemm_rate, isa_name,
                                    dtype_names[dt], vs_f32, torch_ms > 0 ? torch_ms : 0.0, vs_torch, fma_peak, of_peak,
                                    l1_rate, fg / l1_rate, o.layout);
                    }
                }
            }
            tensors_free(&t);
        }
    fprintf(stderr, "\n");
    /* The machine may have been busier when the peak was taken: say so rather than trust it. */
    const double fma_peak_end = fa_cpu_fma_peak(kernels, o.threads);
    printf("\nFMA peak again at the end: %.1f GFLOP/s (start %.1f, highest %.1f)", fma_peak_end, fma_peak_start,
           fma_peak > fma_peak_end ? fma_peak : fma_peak_end);
    if (fma_peak_end > 1.1 * fma_peak)
        printf(" (more than 10%% above every earlier probe: the 'of peak' column is unreliable)");
    printf("\n");
    if (over_peak)
        printf("\n!!! WARNING: %d row(s) marked '!' run above the FMA peak (of peak > 1.0; bf16 > 2.0). That is impossible: the FLOP\n"
               "!!! count or the timer is wrong, or the peak was measured while other jobs held the cores.\n",
               over_peak);
#ifdef FA_BENCH_HAVE_OPENBLAS
    /* The machine may have been busier when the rate was taken: say so rather than trust it. */
    const double sgemm_end = std_sgemm_rate(2048, o.threads, 10);
    printf("sgemm 2048^3 again at the end: %.1f GFLOP/s", sgemm_end);
    if (sgemm_end > 1.1 * sgemm_rate || sgemm_end < 0.9 * sgemm_rate)
        printf(" (differs by more than 10%% from the start: the 'of BLAS' column is unreliable)");
    printf("\n");
#endif
    if (csv) fclose(csv);
    torch_column_stop(&torch);
    fa_context_destroy(ctx);
    return failures ? 1 : 0;
}

#define _POSIX_C_SOURCE 200809L /* setenv */
/* checkasm (in the style of dav1d's): every ISA kernel built into the library and supported by
 * this CPU against the portable reference kernel, on odd shapes, strides and edge values; then
 * the whole forward and backward with the ISA forced through FLASHATTN_CPU_ISA against the same
 * problem run with FLASHATTN_CPU_ISA=ref. ISAs this CPU lacks are skipped.
 *   test_checkasm [--function=PATTERN] [--isa=NAME] [--seed=N] [--bench]
 * --function: only the kernels whose name matches the glob (gemm, gemm_nt, gemm_max, gemm_scores,
 * gemm_max_bf16, gemm_ds, decode_scores, decode_values (and every quantised cache code), col_max, exp_cols, softcap_cols,
 * alibi_cols, bias_cols, transpose, f16_to_f32, bf16_to_f32, f32_to_f16, fma_chains,
 * whole_problems, override); --seed: the random inputs
 * (printed, default 12345); --bench: after the checks, each kernel's time per call on the
 * forward's and backward's tile shapes, against its reference twin, and for the products the
 * fraction of the one-thread FMA peak of the same ISA (checkasm_bench.c).
 * This file is the driver: the random sequence, the table of checks and main. The checks live in
 * one file per kernel family (checkasm.h lists them), as in dav1d's tests/checkasm. */
#include <fnmatch.h>

#include "checkasm.h"
#include "checkasm_bench.h"

uint32_t rng_state = 12345u;
float uniform(float lo, float hi)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return lo + (hi - lo) * (float)(rng_state >> 8) * (1.0f / 16777216.0f);
}

const fa_cpu_kernels *isa_or_skip(void **state)
{
    const char *name = *state;
    const fa_cpu_kernels *k = fa_cpu_kernels_by_name(name);
    if (!k) {
        print_message("checkasm: %s not built or not supported by this CPU, skipped\n", name);
        skip();
    }
    return k;
}

static const struct { const char *name; CMUnitTestFunction run; } kernel_tests[] = {
    {"gemm", test_gemm},
    {"gemm_nt", test_gemm_nt},
    {"gemm_max", test_gemm_max},
    {"gemm_scores", test_gemm_scores},
    {"gemm_max_bf16", test_gemm_max_bf16},
    {"gemm_ds", test_gemm_ds},
    {"decode_scores", test_decode_scores},
    {"decode_values", test_decode_values},
    {"decode_codes", test_decode_codes},
    {"col_max", test_col_max},
    {"exp_cols", test_exp_cols},
    {"softcap_cols", test_softcap_cols},
    {"alibi_cols", test_alibi_cols},
    {"bias_cols", test_bias_cols},
    {"transpose", test_transpose},
    {"f16_to_f32", test_f16_to_f32},
    {"bf16_to_f32", test_bf16_to_f32},
    {"f32_to_f16", test_f32_to_f16},
    {"fma_chains", test_fma_chains},
    {"whole_problems", test_whole_problems},
};
enum { KERNEL_TESTS = sizeof kernel_tests / sizeof kernel_tests[0] };

static int usage(void)
{
    fprintf(stderr, "usage: test_checkasm [--function=PATTERN] [--isa=NAME] [--seed=N] [--bench]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *function = "*", *only_isa = NULL;
    int bench = 0;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        char *end;
        if (!strncmp(a, "--function=", 11)) function = a + 11;
        else if (!strncmp(a, "--isa=", 6)) only_isa = a + 6;
        else if (!strcmp(a, "--bench")) bench = 1;
        else if (!strncmp(a, "--seed=", 7) && (rng_state = (uint32_t)strtoul(a + 7, &end, 10), *end == 0 && end > a + 7)) continue;
        else return usage();
    }
    print_message("checkasm: seed %u (--seed=%u reproduces this run)\n", (unsigned)rng_state, (unsigned)rng_state);
    /* Each ISA but the reference (the ground truth), every kernel matching --function. */
    static struct CMUnitTest tests[FA_CPU_ISA_COUNT * KERNEL_TESTS + 1];
    static char names[FA_CPU_ISA_COUNT * KERNEL_TESTS][48];
    size_t count = 0;
    for (int i = 0; i < FA_CPU_ISA_COUNT; ++i) {
        const char *isa = fa_cpu_isa_name(i);
        if (!strcmp(isa, "ref") || (only_isa && strcmp(isa, only_isa))) continue;
        for (int t = 0; t < KERNEL_TESTS; ++t) {
            if (fnmatch(function, kernel_tests[t].name, 0) != 0) continue;
            snprintf(names[count], sizeof names[count], "%s_%s", kernel_tests[t].name, isa);
            tests[count] = (struct CMUnitTest){names[count], kernel_tests[t].run, NULL, NULL, (void *)isa};
            ++count;
        }
    }
    if (fnmatch(function, "override", 0) == 0) tests[count++] = (struct CMUnitTest)cmocka_unit_test(test_override);
    if (count == 0) {
        fprintf(stderr, "checkasm: no test matches --function=%s%s%s\n", function, only_isa ? " --isa=" : "", only_isa ? only_isa : "");
        return 1;
    }
    const int failed = _cmocka_run_group_tests("checkasm", tests, count, NULL, NULL);
    if (failed || !bench) return failed;
    return checkasm_bench(function, only_isa);
}

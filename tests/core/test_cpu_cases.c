/* Every case of the shared table, in f32, f16 and bf16, forward and backward, on the CPU backend,
 * against the double-precision oracle. One cmocka test per (case, dtype); each prints its errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "harness.h"

typedef struct case_run {
    const fa_test_case *c;
    fa_dtype dtype;
} case_run;

static fa_context *cpu_ctx;

static int open_cpu(void **state)
{
    (void)state;
    return fa_context_create(FA_BACKEND_CPU, 0, &cpu_ctx) == FA_SUCCESS ? 0 : -1;
}

static int close_cpu(void **state)
{
    (void)state;
    fa_context_destroy(cpu_ctx);
    return 0;
}

static void run_one(void **state)
{
    const case_run *run = *state;
    char what[512], why[512];
    fa_case_describe(run->c, run->dtype, what, sizeof what);
    if (!fa_case_selected(run->c)) {
        print_message("not selected (FA_TEST_QUICK=1 or FA_TEST_CASES): %s\n", what);
        skip();
    }
    fa_case_errors errors;
    const fa_status st = fa_run_case(cpu_ctx, run->c, run->dtype, 1, &errors);
    if (st != FA_SUCCESS) fail_msg("%s: %s: %s", what, fa_status_string(st), fa_last_error());
    const int ok = fa_case_passes(&errors, run->dtype, 1, why, sizeof why);
    print_message("%s\n    %s\n", what, why);
    if (!ok) fail_msg("%s: error above tolerance: %s", what, why);
}

int main(void)
{
    static const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    const size_t ndtypes = sizeof dtypes / sizeof dtypes[0];
    const size_t count = fa_test_case_count * ndtypes;
    struct CMUnitTest *tests = calloc(count, sizeof *tests);
    case_run *runs = calloc(count, sizeof *runs);
    char (*names)[96] = calloc(count, sizeof *names);
    if (!tests || !runs || !names) return 1;
    for (size_t i = 0; i < fa_test_case_count; ++i)
        for (size_t d = 0; d < ndtypes; ++d) {
            const size_t n = i * ndtypes + d;
            runs[n].c = &fa_test_cases[i];
            runs[n].dtype = dtypes[d];
            snprintf(names[n], sizeof names[n], "%s/%s", fa_test_cases[i].name, fa_dtype_label(dtypes[d]));
            tests[n].name = names[n];
            tests[n].test_func = run_one;
            tests[n].initial_state = &runs[n];
        }
    const int failures = _cmocka_run_group_tests("cpu_cases", tests, count, open_cpu, close_cpu);
    free(tests);
    free(runs);
    free(names);
    return failures;
}

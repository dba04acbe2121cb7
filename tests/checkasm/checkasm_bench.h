/* checkasm --bench: each kernel's time per call against its reference twin (checkasm_bench.c). */
#ifndef FA_CHECKASM_BENCH_H
#define FA_CHECKASM_BENCH_H
/* Times the kernels matching the glob `function` (all ISAs this CPU runs, or only `only_isa`);
 * prints the table to stdout; returns 0, or 1 when out of memory. */
int checkasm_bench(const char *function, const char *only_isa);
#endif

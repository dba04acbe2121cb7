/* checkasm: the FMA-peak probe's per-ISA loop (fma_chains) and its driver (bench/cpu/probe). */
#include "checkasm.h"
#include "fma_peak.h" /* bench/cpu/probe */

/* The FMA-peak probe's chains: the FLOPs they report (2 per lane, one FMA per chain and
 * iteration: a whole number of the ISA's register tile accumulators) and a finite result that
 * depends on the work (the chains converge to 1 from their start values). */
void test_fma_chains(void **state)
{
    const fa_cpu_kernels *isa = isa_or_skip(state);
    const double lanes = (double)isa->nr / 2.0, chains = 2.0 * (double)isa->mr;
    float zero_sink = -1.0f, sink = -1.0f;
    assert_true(isa->fma_chains(0, &zero_sink) == 0.0);
    const double flops = isa->fma_chains(1000, &sink);
    if (flops != 2.0 * lanes * chains * 1000.0)
        fail_msg("fma_chains %s: %g FLOPs reported for 1000 iterations, want %g", isa->isa, flops, 2.0 * lanes * chains * 1000.0);
    assert_true(isfinite(sink) && sink != zero_sink);
    /* fa-bench's second probe, the ISA's gemm on an L1-resident product: it runs and reports a rate
     * (its value is the machine's; only the benchmarks read it) */
    const double l1_rate = fa_cpu_l1_gemm_rate(isa, 1);
    if (!(isfinite(l1_rate) && l1_rate > 0.0)) fail_msg("fa_cpu_l1_gemm_rate %s: %g GFLOP/s", isa->isa, l1_rate);
}

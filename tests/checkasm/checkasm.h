/* checkasm's shared parts (the driver is checkasm.c; one file per kernel family holds the checks:
 * checkasm_gemm.c, checkasm_backward.c, checkasm_decode.c, checkasm_softmax.c, checkasm_convert.c,
 * checkasm_probe.c, checkasm_whole.c). Every check draws its inputs from one sequence, seeded by
 * --seed, in the order of the driver's table, so a run is reproduced by its seed. */
#ifndef FA_CHECKASM_H
#define FA_CHECKASM_H
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "common/half.h"
#include "common/quant_codes.h"
#include "cpu/kernels/kernels.h"
#include "flashattn.h"
#include "test_util.h" /* test_dtype_size */

/* The random sequence: its state (set by --seed) and a uniform value in [lo, hi) from it. */
extern uint32_t rng_state;
float uniform(float lo, float hi);
/* The kernels of the ISA named by the test's state, or a skip when this CPU lacks it. */
const fa_cpu_kernels *isa_or_skip(void **state);

/* The checks, one per kernel (the driver's table runs each on every ISA but ref). */
void test_gemm(void **state);             /* checkasm_gemm.c */
void test_gemm_nt(void **state);
void test_gemm_max(void **state);
void test_gemm_scores(void **state);
void test_gemm_max_bf16(void **state);
void test_gemm_ds(void **state);          /* checkasm_backward.c */
void test_decode_scores(void **state);    /* checkasm_decode.c */
void test_decode_values(void **state);
void test_decode_codes(void **state);
void test_col_max(void **state);          /* checkasm_softmax.c */
void test_exp_cols(void **state);
void test_softcap_cols(void **state);
void test_alibi_cols(void **state);
void test_bias_cols(void **state);
void test_transpose(void **state);        /* checkasm_convert.c */
void test_f16_to_f32(void **state);
void test_bf16_to_f32(void **state);
void test_f32_to_f16(void **state);
void test_fma_chains(void **state);       /* checkasm_probe.c */
void test_whole_problems(void **state);   /* checkasm_whole.c */
void test_override(void **state);
#endif

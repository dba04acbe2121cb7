/* The shared case table and the runner every backend's tests use: a case is generated
 * (unit-normal inputs from a fixed seed), run through the public API on a context of any backend
 * (tensors copied with fa_malloc / fa_memcpy_*), and compared with the oracle. */
#ifndef FA_TEST_HARNESS_H
#define FA_TEST_HARNESS_H
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"
#include "oracle.h"

typedef enum case_layout {
    LAYOUT_PACKED,
    LAYOUT_BHSD,  /* [batch, heads, seqlen, head_dim] via strides */
    LAYOUT_PADDED /* packed order with gaps: stride_seq and stride_head larger than packed */
} case_layout;
typedef enum case_block_mask { BLOCK_MASK_NONE, BLOCK_MASK_RANDOM, BLOCK_MASK_BUTTERFLY, BLOCK_MASK_LOCAL_GLOBAL } case_block_mask;

/* Score modifiers of a case (bits). ALiBi slopes are the usual geometric ones (per batch: scaled
 * by batch); sinks and bias values are seeded normals, the bias in the case's dtype. */
enum case_modifier {
    MOD_SOFTCAP = 1,          /* softcap 2: unit-normal scores reach the tanh's bend */
    MOD_ALIBI = 2,            /* [heads_q] slopes */
    MOD_ALIBI_PER_BATCH = 4,  /* [batch, heads_q] slopes */
    MOD_SINKS = 8,            /* and dsinks in the backward */
    MOD_BIAS = 16,            /* full [batch, heads_q, seqlen_q, seqlen_k] bias, padded rows; and dbias */
    MOD_BIAS_BROADCAST = 32   /* [1, heads_q, 1, seqlen_k] bias: dbias sums batches and rows */
};

typedef struct fa_test_case {
    const char *name;
    oracle_shape shape;
    float softmax_scale; /* 0 = default */
    int causal;
    int32_t window_left, window_right;
    int key_padding;     /* 1: seqlens_k set, with some batches short and one zero-length */
    float dropout_p;
    uint64_t dropout_seed, dropout_offset;
    case_block_mask block_mask;
    int32_t block_q, block_k;
    case_layout layout;
    unsigned modifiers;  /* enum case_modifier bits */
} fa_test_case;

extern const fa_test_case fa_test_cases[];
extern const size_t fa_test_case_count;

typedef struct fa_case_errors {
    /* max abs error against the oracle; INFINITY for NaN, a missed -inf, or a write into the gaps
     * of a LAYOUT_PADDED output */
    double out, lse, dq, dk, dv, dsinks, dbias; /* dsinks, dbias: 0 when the case has none */
    /* max(1, max |oracle value|) of each quantity: f16/bf16 tolerances scale with it */
    double out_scale, lse_scale, dq_scale, dk_scale, dv_scale, dsinks_scale, dbias_scale;
} fa_case_errors;

/* Tolerance on max abs error for unit-normal inputs: f32 1e-4 (the foundation issue's bound);
 * f16 and bf16 are stated next to their definition in harness.c. For f16/bf16 the allowed error
 * of out, dq, dk, dv is this tolerance times the quantity's scale (above); f32 results and lse
 * (fp32 in every dtype) are held to the absolute f32 bound. */
double fa_case_tolerance(fa_dtype dtype);

/* 1 when every error the run produced (outputs and lse; gradients too if backward) is within
 * tolerance. why (may be NULL) receives a one-line account of every quantity and its limit. */
int fa_case_passes(const fa_case_errors *errors, fa_dtype dtype, int backward, char *why, size_t why_size);

/* "name [f16] b2 hq4 hkv2 sq129 sk129 d64 causal ..." : for failure messages. */
void fa_case_describe(const fa_test_case *c, fa_dtype dtype, char *text, size_t size);
const char *fa_dtype_label(fa_dtype dtype);

/* FA_TEST_QUICK=1 in the environment (for sanitizer and valgrind runs) skips the larger cases
 * (and tests/core/test_memory, whose size is the point of it); FA_TEST_CASES=name,name,... runs
 * only the cases named. This returns 0 for the cases skipped, 1 otherwise. */
int fa_case_selected(const fa_test_case *c);
/* 1 when FA_TEST_QUICK=1 is set: the one reading of that rule for tests that shrink or skip
 * their own large work. */
int fa_test_quick(void);
/* The first name in FA_TEST_CASES that is not in the table, or NULL (a typo must not silently
 * select nothing). */
const char *fa_case_filter_unknown(void);

/* Runs forward and (if backward) backward of c on ctx in dtype; fills errors.
 * Returns FA_SUCCESS or the status the library returned. */
fa_status fa_run_case(fa_context *ctx, const fa_test_case *c, fa_dtype dtype, int backward, fa_case_errors *errors);
#endif

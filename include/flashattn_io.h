/* flashattn IO model: exact counts of the memory traffic of the paper's attention algorithms.
 *
 * A companion of flashattn.h in a library of its own, libflashattn_io (pkg-config flashattn_io,
 * CMake find_package(flashattn COMPONENTS io) and flashattn::flashattn_io, Meson
 * dependency('flashattn_io')), which links libflashattn: the attention runtime (contexts, forward,
 * backward) does not use the model, and programs that only run attention need neither link nor
 * see it. Include this header for fa_io_*; it includes flashattn.h itself. Errors are reported
 * as libflashattn's are: fa_status, and fa_last_error() names the argument. */
#ifndef FLASHATTN_IO_H
#define FLASHATTN_IO_H

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exact counts of the elements an attention pass moves between slow memory (HBM; on a CPU, main
 * memory) and an on-chip memory (SRAM) of M elements, for the paper's algorithms, plus an
 * instrumented run of the same loops on real data whose counts equal the model's. Counts are in
 * elements of each array (Q, K, V, O, dO, dQ, dK, dV: rows x head_dim; l, m: one per query row;
 * S, P, dP, dS: seqlen_q x seqlen_k; the block mask: one per tile test; the RNG state: seed and
 * offset, 2). Every initialisation the algorithm writes to slow memory counts as a write.
 * docs/IO.md lists the count of every line of every algorithm. */
typedef enum fa_io_algorithm {
    FA_IO_STANDARD = 0,          /* Algorithm 0 forward, Algorithm 3 backward; dense only */
    FA_IO_FLASH = 1,             /* Algorithm 1/2 forward (K/V tiles outer), Algorithm 4 backward; dense */
    FA_IO_BLOCK_SPARSE = 2,      /* Algorithm 5 forward; backward: Algorithm 4 skipping zero tiles */
    FA_IO_FLASH_QUERY_OUTER = 3  /* the CPU backend's forward order: Q tiles outer, O written once */
} fa_io_algorithm;

typedef enum fa_io_pass { FA_IO_FORWARD = 0, FA_IO_BACKWARD = 1 } fa_io_pass;

typedef enum fa_io_operand {
    FA_IO_Q, FA_IO_K, FA_IO_V, FA_IO_O, FA_IO_DO, FA_IO_DQ, FA_IO_DK, FA_IO_DV,
    FA_IO_L, FA_IO_M,            /* softmax statistics l and m (QUERY_OUTER: lse, under L) */
    FA_IO_S, FA_IO_P, FA_IO_DP, FA_IO_DS, /* N x N intermediates of standard attention */
    FA_IO_MASK, FA_IO_RNG,
    FA_IO_OPERAND_COUNT
} fa_io_operand;

typedef struct fa_io_problem {
    size_t struct_size;       /* sizeof(fa_io_problem), set by fa_io_problem_init */
    fa_io_algorithm algorithm;
    int64_t seqlen_q, seqlen_k, head_dim;
    int64_t batch_heads;      /* independent (batch, head) pairs; the RNG state is shared by all */
    int64_t sram_elements;    /* M */
    int64_t element_bytes;    /* bytes per element, for fa_io_counts.bytes */
    int64_t block_rows, block_cols; /* Br, Bc; both 0 = fa_tiling_for(sram_elements, head_dim) */
    /* BLOCK_SPARSE and FLASH_QUERY_OUTER only. A tile (i, j) is visited when any mask block it
     * overlaps is set (the mask's blocks may have any size). Without a mask, block_density s in
     * (0, 1] scales the per-tile traffic: the expected count over masks with a fraction s of
     * tiles set, exact for any such mask when the tiles divide the sequence lengths. */
    const fa_block_mask *block_mask;
    double block_density;
    /* Used by the instrumented run; dropout_p > 0 also makes both models count the RNG state. */
    float softmax_scale;      /* 0 = 1/sqrt(head_dim) */
    float dropout_p;
    uint64_t dropout_seed, dropout_offset;
    /* Appended for score modifiers (issue 15; older callers' struct_size ends before it: no bias).
     * An additive bias on the scores, read from slow memory for every computed tile like K and V
     * (docs/IO.md): NULL = none. dtype sets the bytes of an element read; stride_head steps one of
     * the batch_heads pairs, stride_q a query row (elements, 0 = broadcast: broadcast or not, each
     * pair's tile pass reads its tile); stride_batch must be 0, the key stride is 1. The model reads
     * only dtype; the instrumented run adds data (f32 only) to the scores. */
    const fa_bias *bias;
} fa_io_problem;

typedef struct fa_io_counts {
    int64_t reads[FA_IO_OPERAND_COUNT], writes[FA_IO_OPERAND_COUNT]; /* elements */
    int64_t total_reads, total_writes;
    int64_t bytes;            /* (total_reads + total_writes) * element_bytes */
    int64_t flops;            /* matrix-product flops, 2 per multiply-add (exp, max, sums excluded) */
    int64_t sram_peak;        /* most elements on chip at once (tiles, statistics, rows) */
    int64_t hbm_extra;        /* slow memory held besides Q, K, V, O, dO, dQ, dK, dV, in elements */
    int64_t block_rows, block_cols; /* the tiles used (0 for STANDARD) */
    int64_t tiles_visited;    /* inner-loop iterations that did work, summed over batch_heads */
    /* Appended with fa_io_problem.bias, and written only for callers whose problem->struct_size
     * covers that field (built with this header; an older caller's fa_io_counts ends here).
     * Elements of the bias read; included in total_reads, and bytes counts them at the bias's
     * element size: bytes = (total_reads - bias_reads + total_writes) * element_bytes
     * + bias_reads * size of bias->dtype. */
    int64_t bias_reads;
} fa_io_counts;

/* struct_size = sizeof, FA_IO_FLASH, batch_heads 1, element_bytes 4, tiles 0 (paper's), density 1,
 * no mask, no dropout, no bias. */
FA_API void fa_io_problem_init(fa_io_problem *problem);
/* The model: counts for one pass, from closed forms over the loop structure. */
FA_API fa_status fa_io_estimate(const fa_io_problem *problem, fa_io_pass pass, fa_io_counts *counts);
/* The instrumented run: executes the algorithm on host f32 arrays [batch_heads, seqlen, head_dim],
 * copying every tile between the arrays and an explicit on-chip buffer and counting each copy.
 * Computes out (and lse [batch_heads, seqlen_q], natural log, if not NULL); when dout is not NULL,
 * also the backward (dq, dk, dv) and its counts. BLOCK_SPARSE with block_density < 1 needs a mask;
 * FLASH_QUERY_OUTER has no backward. */
FA_API fa_status fa_io_simulate(const fa_io_problem *problem, const float *q, const float *k, const float *v,
                                float *out, float *lse, fa_io_counts *forward_counts, const float *dout,
                                float *dq, float *dk, float *dv, fa_io_counts *backward_counts);
FA_API const char *fa_io_operand_name(fa_io_operand operand); /* "Q", "dO", "l", ...; "?" if unknown */

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_IO_H */

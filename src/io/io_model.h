/* The IO model's validated view of a problem, shared by the closed-form model (io_model.c) and
 * the instrumented run (io_sim.c): resolved tile sizes and the definition of a visited tile.
 * What is counted, line by line, is in docs/IO.md. */
#ifndef FA_IO_MODEL_H
#define FA_IO_MODEL_H
#include "flashattn_io.h"

typedef struct fa_io_plan {
    fa_io_algorithm algorithm;
    fa_io_pass pass;
    int64_t nq, nk, d, heads; /* seqlen_q, seqlen_k, head_dim, batch_heads */
    int64_t br, bc, tr, tc;   /* tiles (0 for STANDARD) and their counts ceil(nq/br), ceil(nk/bc) */
    int64_t element_bytes;
    float scale;
    const fa_block_mask *mask;
    double density;
    int tests_mask;           /* the algorithm reads M_ij once per (i, j): Algorithm 5, masked QUERY_OUTER */
    int dropout;              /* dropout_p > 0: the RNG state is saved (forward) and read (backward) */
    const fa_bias *bias;      /* NULL = none; its tile is read per computed (i, j) */
    int64_t bias_bytes;       /* bytes per bias element (0 without one) */
} fa_io_plan;

/* Validates problem and pass; on failure records a message naming the argument. */
/* The caller's problem read once into a complete copy (README "ABI policy"). */
fa_status fa_io_problem_read(const fa_io_problem *problem, fa_io_problem *full);
fa_status fa_io_plan_make(const fa_io_problem *problem, fa_io_pass pass, fa_io_plan *plan);

/* 1 when tile (i, j) is computed: no mask, or any mask block it overlaps is set. */
int fa_io_tile_set(const fa_io_plan *plan, int64_t i, int64_t j);
/* 1 when element (row, col) of the attention matrix is visible under the mask (1 without one). */
int fa_io_element_set(const fa_io_plan *plan, int64_t row, int64_t col);

/* Rows of query tile i and columns of key tile j (the last tiles may be short). */
int64_t fa_io_tile_rows(const fa_io_plan *plan, int64_t i);
int64_t fa_io_tile_cols(const fa_io_plan *plan, int64_t j);

/* Fills total_reads (bias_reads included), total_writes and bytes from the per-operand counts;
 * 0 on overflow. */
int fa_io_counts_total(fa_io_counts *counts, int64_t element_bytes, int64_t bias_bytes);
/* Writes src to the caller's dst: bias_reads only when the caller's problem knows the bias
 * (struct_size covers it), since an older caller's fa_io_counts ends before that field. */
void fa_io_counts_store(const fa_io_problem *caller_problem, fa_io_counts *dst, const fa_io_counts *src);
#endif

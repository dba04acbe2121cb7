/*
 * flashattn_dist: context-parallel (ring) attention over MPI, on top of flashattn.h.
 * Library libflashattn_dist (built when MPI is found: meson -Dmpi=auto), CPU backend.
 *
 * A self-attention problem of N tokens per sequence is sharded along the sequence over the P
 * ranks of comm in the zigzag layout: the sequence is cut into 2P chunks of C = N / (2P) tokens
 * and rank r holds chunks r and 2P - 1 - r, in that order, as its local rows [0, C) and [C, 2C)
 * of q, k, v, out, dout, dq, dk, dv (every tensor has seqlen 2C on every rank): global chunk c
 * lives on rank c < P ? c : 2P - 1 - c, at local rows c < P ? 0 : C. Under a causal
 * mask every rank then does the same work. K and V travel around the ring (rank r sends to r + 1);
 * each rank posts the next block's exchange before computing on the current one. Partial outputs
 * are merged by lse (fa_merge_partials) in ring order, so results are bit-identical across runs
 * and, within f32 rounding (then the dtype's final rounding), equal to fa_forward / fa_backward on
 * the gathered sequence.
 *
 * desc: as for fa_forward, with desc->q_offset, k_offset, seqlen_*_global left 0 (the ring sets
 * them), no varlen, no block mask, no bias; desc->seqlens_k, if set, counts the valid keys of the
 * whole sequence (global positions), as in the unsplit call. lse: [batch, heads_q, 2C], as fa_forward's.
 * Tensors: one dtype for all (f32, f16 or bf16), host memory of a CPU context. With f16/bf16, K and
 * V travel in that dtype, but every block is computed in f32 and the partial outputs, their merges,
 * dq's sum and the dK/dV accumulators (which travel the ring) stay f32: out, dq, dk, dv are rounded
 * to the dtype once, at the end. lse is f32 always.
 *
 * Collective: every rank of comm calls with tensors of the same shapes and the same desc. Every
 * rank returns the same status: the ranks agree on it (MPI_Allreduce) before and after the ring,
 * so a bad argument or a failure on one rank makes every rank return an error instead of hanging;
 * the others' fa_last_error() names the rank that failed. Outputs are written only on success.
 * MPI errors return (the calls use a duplicate of comm with MPI_ERRORS_RETURN) as
 * FA_ERROR_BACKEND_FAILURE. MPI must be initialised.
 */
#ifndef FLASHATTN_DIST_H
#define FLASHATTN_DIST_H

#include <mpi.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (and lse if not NULL) of the local query rows over the keys of every rank. */
FA_API fa_status fa_ring_forward(fa_context *ctx, MPI_Comm comm, const fa_attention_desc *desc,
                                 const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                                 fa_tensor *out, float *lse);

/* Gradients of the local rows: dq of the local queries over every rank's keys, dk and dv of the
 * local keys over every rank's queries (dK/dV accumulators travel the ring with K and V and
 * come home after P steps). out and lse are fa_ring_forward's. */
FA_API fa_status fa_ring_backward(fa_context *ctx, MPI_Comm comm, const fa_attention_desc *desc,
                                  const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                                  const fa_tensor *out, const fa_tensor *dout, const float *lse,
                                  fa_tensor *dq, fa_tensor *dk, fa_tensor *dv);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_DIST_H */

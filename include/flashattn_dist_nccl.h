/*
 * flashattn_dist_nccl: context-parallel (ring) attention over NCCL, on top of flashattn.h.
 * Library libflashattn_dist_nccl (built when nvcc and nccl.h are found: meson -Dnccl=auto),
 * CUDA backend. Compiled against the real NCCL and run only against a test double of it
 * (docs/DISTRIBUTED.md, "What has run where"): it has never run on a GPU.
 *
 * Same contract as fa_ring_forward / fa_ring_backward (flashattn_dist.h: the zigzag layout, desc,
 * lse, collective calls, every rank returns the same status, outputs written only on success),
 * with these differences:
 * - ctx is a CUDA context; q, k, v, out, dout, dq, dk, dv and lse are device memory (alibi_slopes
 *   too, as for fa_forward; desc->seqlens_k stays host memory). Tensors are f32 (f16/bf16 return
 *   FA_ERROR_NOT_SUPPORTED on every rank).
 * - comm: an NCCL communicator whose ranks are the ring (rank r sends to r + 1). Each rank's
 *   device is the context's.
 * - stream: the CUDA stream (cudaStream_t, NULL = the default stream) for the compute; the call
 *   sets it on ctx (fa_context_set_stream) and leaves it set. The exchanges run on a stream of
 *   the call's own, ordered with the compute by events. The call returns after its work is
 *   complete (it waits twice, for the agreements on the status, and once at the end).
 * - Bounded waits: every host wait polls the GPU and ncclCommGetAsyncError against a deadline of
 *   FLASHATTN_RING_TIMEOUT_S seconds (environment; default 300). On an NCCL error or the deadline
 *   the call aborts comm (ncclCommAbort: comm is freed and must not be used or destroyed
 *   afterwards) and returns FA_ERROR_BACKEND_FAILURE.
 */
#ifndef FLASHATTN_DIST_NCCL_H
#define FLASHATTN_DIST_NCCL_H

#include <nccl.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

FA_API fa_status fa_ring_forward_nccl(fa_context *ctx, ncclComm_t comm, void *stream, const fa_attention_desc *desc,
                                      const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, fa_tensor *out,
                                      float *lse);

FA_API fa_status fa_ring_backward_nccl(fa_context *ctx, ncclComm_t comm, void *stream, const fa_attention_desc *desc,
                                       const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                                       const fa_tensor *out, const fa_tensor *dout, const float *lse, fa_tensor *dq,
                                       fa_tensor *dk, fa_tensor *dv);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_DIST_NCCL_H */

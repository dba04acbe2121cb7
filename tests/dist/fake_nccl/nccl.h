/* A test double of NCCL's nccl.h: the names and values of the subset that src/dist/ring_nccl.cu
 * calls (NCCL 2.x), implemented over MPI by ../fake_nccl.c. With the SIMT emulator's
 * synchronous streams, an operation completes when it is called (ncclGroupEnd completes the
 * group's sends and receives), so the stream arguments are ignored. */
#ifndef FA_FAKE_NCCL_H
#define FA_FAKE_NCCL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void *cudaStream_t; /* the emulator's streams are opaque pointers */
typedef struct ncclComm *ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef enum {
    ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
    ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9,
} ncclDataType_t;

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
/* The double's communicator is a duplicate of MPI_COMM_WORLD (nranks and rank must be its size
 * and rank); MPI must be initialised. */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
const char *ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);

/* The double's own counters, for tests: calls in this process so far. */
typedef struct fake_nccl_counts { long sends, recvs, groups, allreduces, aborts; } fake_nccl_counts;
fake_nccl_counts fake_nccl_counts_now(void);
/* Fault injection: the allreduce-th ncclAllReduce on comm from now (1 = the next) completes, then
 * comm reports ncclRemoteError through ncclCommGetAsyncError, as after a peer's failure. */
void fake_nccl_fail_after(ncclComm_t comm, long allreduce);

#ifdef __cplusplus
}
#endif
#endif /* FA_FAKE_NCCL_H */

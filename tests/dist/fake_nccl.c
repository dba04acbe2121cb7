/* The NCCL double (fake_nccl/nccl.h) over MPI: docs/DISTRIBUTED.md, "A test double: NCCL over
 * MPI". A communicator is a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN; a group collects
 * MPI_Isend/MPI_Irecv and ncclGroupEnd waits for them (what a synchronous stream would see);
 * ncclAllReduce is MPI_Allreduce; an MPI error is recorded as the communicator's async error. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

struct ncclComm {
    MPI_Comm comm;
    ncclResult_t async_error;
    long fail_at_allreduce; /* fake_nccl_fail_after: allreduces left before the error; 0 = never */
};

enum { FAKE_TAG = 0x6663, MAX_GROUP = 64 };

static struct {
    int depth, count;
    MPI_Request req[MAX_GROUP];
    ncclComm_t comm; /* of the group's operations */
} group;
static fake_nccl_counts counts;

fake_nccl_counts fake_nccl_counts_now(void) { return counts; }

void fake_nccl_fail_after(ncclComm_t comm, long allreduce) { comm->fail_at_allreduce = allreduce; }

static ncclResult_t failed(ncclComm_t comm, int rc)
{
    if (rc == MPI_SUCCESS) return ncclSuccess;
    if (comm) comm->async_error = ncclSystemError;
    return ncclSystemError;
}

static MPI_Datatype mpi_type(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat16: case ncclBfloat16: return MPI_UINT16_T; /* moved as bits; no reductions on them here */
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    }
    return MPI_DATATYPE_NULL;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId) return ncclInvalidArgument;
    memset(uniqueId, 0, sizeof *uniqueId);
    strcpy(uniqueId->internal, "flashattn fake NCCL over MPI_COMM_WORLD");
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    int initialised = 0, size = 0, me = -1;
    MPI_Initialized(&initialised);
    if (!comm || !initialised || strcmp(commId.internal, "flashattn fake NCCL over MPI_COMM_WORLD")) return ncclInvalidArgument;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (nranks != size || rank != me) return ncclInvalidUsage;
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &c->comm) != MPI_SUCCESS) {
        free(c);
        return ncclSystemError;
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm) return ncclInvalidArgument;
    MPI_Comm_free(&comm->comm);
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    ++counts.aborts;
    return ncclCommDestroy(comm);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    return comm && count && MPI_Comm_size(comm->comm, count) == MPI_SUCCESS ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    return comm && rank && MPI_Comm_rank(comm->comm, rank) == MPI_SUCCESS ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!comm || !asyncError) return ncclInvalidArgument;
    *asyncError = comm->async_error;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (fake NCCL: an MPI call failed)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

ncclResult_t ncclGroupStart(void)
{
    ++group.depth;
    return ncclSuccess;
}

/* A point-to-point operation: into the open group, or complete now. */
static ncclResult_t point_to_point(int send, void *buffer, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm)
{
    const MPI_Datatype type = mpi_type(datatype);
    if (!comm || type == MPI_DATATYPE_NULL || count > 0x7fffffff) return ncclInvalidArgument;
    if (group.depth && group.count && group.comm != comm) return ncclInvalidUsage;
    if (group.count == MAX_GROUP) return ncclInvalidUsage;
    MPI_Request req;
    const int rc = send ? MPI_Isend(buffer, (int)count, type, peer, FAKE_TAG, comm->comm, &req)
                        : MPI_Irecv(buffer, (int)count, type, peer, FAKE_TAG, comm->comm, &req);
    if (rc != MPI_SUCCESS) return failed(comm, rc);
    if (!group.depth) return failed(comm, MPI_Wait(&req, MPI_STATUS_IGNORE));
    group.comm = comm;
    group.req[group.count++] = req;
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    (void)stream;
    ++counts.sends;
    return point_to_point(1, (void *)sendbuff, count, datatype, peer, comm);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    (void)stream;
    ++counts.recvs;
    return point_to_point(0, recvbuff, count, datatype, peer, comm);
}

ncclResult_t ncclGroupEnd(void)
{
    if (!group.depth) return ncclInvalidUsage;
    if (--group.depth) return ncclSuccess;
    ++counts.groups;
    const int n = group.count;
    group.count = 0;
    return n ? failed(group.comm, MPI_Waitall(n, group.req, MPI_STATUSES_IGNORE)) : ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    ++counts.allreduces;
    const MPI_Datatype type = mpi_type(datatype);
    const MPI_Op mpi_op = op == ncclSum ? MPI_SUM : op == ncclProd ? MPI_PROD : op == ncclMax ? MPI_MAX
                        : op == ncclMin ? MPI_MIN : MPI_OP_NULL;
    if (!comm || type == MPI_DATATYPE_NULL || mpi_op == MPI_OP_NULL || count > 0x7fffffff) return ncclInvalidArgument;
    const void *in = sendbuff == recvbuff ? MPI_IN_PLACE : sendbuff;
    const ncclResult_t r = failed(comm, MPI_Allreduce(in, recvbuff, (int)count, type, mpi_op, comm->comm));
    if (comm->fail_at_allreduce && --comm->fail_at_allreduce == 0) comm->async_error = ncclRemoteError;
    return r;
}

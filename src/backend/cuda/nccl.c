/*
 * nccl.c — the CUDA communicator of a tensor-parallel group (src/model/tp.h).
 *
 * One NCCL communicator per rank, made at once for all ranks' devices with ncclCommInitAll
 * (one process, one host thread per rank afterwards). An all-reduce is enqueued on the rank
 * backend's own stream, so it orders with that rank's ops like any other op; each rank's
 * thread calls it for its own communicator (no ncclGroupStart needed). NVLink SHARP
 * (multicast, "NVLS") is kept off: NCCL_NVLS_ENABLE=0 is set before init unless the user set it.
 * Errors are logged and made sticky on the backend (the next sync/download reports them) —
 * the op contract has no status for collectives.
 */
#include "backend/cuda/cuda_internal.h"
#include "model/tp.h"

#include <nccl.h>
#include <stdlib.h>

struct tern__nccl {
    int n;
    ncclComm_t comm[TERN_TP_MAX];
};

tern_status tern__nccl_open(tern__nccl **out, tern_backend *const *bes, int n, tern_error *err) {
    *out = NULL;
    if (n < 1 || n > TERN_TP_MAX) return tern_err(err, TERN_EINVAL, "nccl: %d ranks", n);
    if (!getenv("NCCL_NVLS_ENABLE")) setenv("NCCL_NVLS_ENABLE", "0", 1);
    tern__nccl *c = calloc(1, sizeof *c);
    if (!c) return tern_err(err, TERN_ENOMEM, "out of memory");
    c->n = n;
    int devs[TERN_TP_MAX];
    for (int r = 0; r < n; r++) devs[r] = bes[r]->device;
    ncclResult_t rc = ncclCommInitAll(c->comm, n, devs);
    if (rc != ncclSuccess) {
        free(c);
        return tern_err(err, TERN_EUNSUPPORTED, "nccl: ncclCommInitAll over %d GPUs failed: %s", n, ncclGetErrorString(rc));
    }
    *out = c;
    return TERN_OK;
}

void tern__nccl_close(tern__nccl *c) {
    if (!c) return;
    for (int r = 0; r < c->n; r++)
        if (c->comm[r]) ncclCommDestroy(c->comm[r]);
    free(c);
}

void tern__cuda_bind(tern_backend *be) {
    if (be && be->device >= 0) cudaSetDevice(be->device);
}

void tern__nccl_allreduce(tern__nccl *c, int rank, tern_backend *be, float *y, size_t count) {
    tern__cuda *cu = (tern__cuda *)be->impl;
    if (!c || rank < 0 || rank >= c->n || !count) return;
    cudaSetDevice(cu->device);
    ncclResult_t rc = ncclAllReduce(y, y, count, ncclFloat32, ncclSum, c->comm[rank], cu->stream);
    if (rc != ncclSuccess) {
        tern_log(TERN_LOG_ERROR, "nccl: all-reduce of %zu floats on rank %d failed: %s", count, rank,
                 ncclGetErrorString(rc));
        if (cu->sticky == cudaSuccess) cu->sticky = cudaErrorUnknown;
    }
}

/*
 * nccl.c — the CUDA communicator of a tensor-parallel group (src/model/tp.h).
 *
 * One NCCL communicator per rank, made at once for all ranks' devices with ncclCommInitAll
 * (one process, one host thread per rank afterwards). An all-reduce is enqueued on the rank
 * backend's own stream, so it orders with that rank's ops like any other op (and is recorded
 * into the rank's step graph like any other op; NCCL collectives are capturable); each rank's
 * thread calls it for its own communicator (no ncclGroupStart needed). NVLink SHARP
 * (multicast, "NVLS") is kept off: NCCL_NVLS_ENABLE=0 is set before init unless the user set it.
 *
 * Small vectors (decode steps: up to P2P_CAP floats) skip NCCL: a one-shot kernel
 * (tp_remap.cu) reads the peers' copies straight through NVLink (peer access enabled between
 * every pair at open) and sums them in rank order. Measured on 2×H200 (bench/NOTES.md): NCCL's
 * all-reduce of one decode row costs ~25-30 µs inside a step graph, the launch of the one-shot
 * kernel a few µs; 64-120 of them per token decide the multi-GPU speed-up at batch 1.
 * TERN_TP_P2P=0 (or GPUs without peer access) keeps NCCL for every size.
 *
 * Wire format: f32 (exact: the same sum as one device up to order). TERN_TP_ALLREDUCE=bf16 sends
 * bf16 through NCCL in the bf16 compute mode (y rounded to bf16 into a per-rank staging buffer of
 * AR_STAGE elements, summed in bf16, widened back): half the bytes, but off by default — it
 * rounds every row-parallel output, measured 6.6e-3 (llama3) to 0.18 (gemma4_dense, whose
 * random norms amplify it) rel L2 of the logits against one GPU in the parity fixtures, past the
 * bf16 mode's 2e-2 bound, and at decode sizes the wire is latency-bound anyway.
 * Errors are logged and made sticky on the backend (the next sync/download reports them) —
 * the op contract has no status for collectives.
 */
#include "backend/cuda/cuda_internal.h"
#include "model/tp.h"

#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#define AR_STAGE ((size_t)4 << 20) /* bf16 elements of staging per rank (8 MiB) */
#define P2P_CAP ((size_t)1 << 20)   /* floats per parity of the one-shot staging (2 x 4 MiB per rank) */

struct tern__nccl {
    int n;
    ncclComm_t comm[TERN_TP_MAX];
    void *stage[TERN_TP_MAX];      /* bf16 staging on rank r's device (NULL: f32 on the wire) */
    int p2p;                       /* the one-shot kernel for count <= P2P_CAP */
    float *pbuf[TERN_TP_P2P_MAXR]; /* rank r's [2][P2P_CAP] staging, then its flags and epochs */
    unsigned *pflag[TERN_TP_P2P_MAXR], *pcnt[TERN_TP_P2P_MAXR];
};

/* the bf16 wire: ranks computing in bf16 and TERN_TP_ALLREDUCE=bf16 */
static int want_bf16(const tern_backend *be) {
    const char *e = getenv("TERN_TP_ALLREDUCE");
    return be->compute == TERN_COMPUTE_BF16 && e && !strcmp(e, "bf16");
}

/* Peer access between every pair and the one-shot staging on every rank; 0 when not possible. */
static int p2p_open(tern__nccl *c, const int *devs) {
    const char *e = getenv("TERN_TP_P2P");
    if ((e && e[0] == '0') || c->n < 2 || c->n > TERN_TP_P2P_MAXR) return 0;
    for (int r = 0; r < c->n; r++)
        for (int q = 0; q < c->n; q++) {
            int ok = 0;
            if (q != r && (cudaDeviceCanAccessPeer(&ok, devs[r], devs[q]) != cudaSuccess || !ok)) return 0;
        }
    size_t fbytes = sizeof(unsigned) * TERN_TP_P2P_BLOCKS * (TERN_TP_P2P_MAXR + 1);
    for (int r = 0; r < c->n; r++) {
        cudaSetDevice(devs[r]);
        for (int q = 0; q < c->n; q++) {
            if (q == r) continue;
            cudaError_t pe = cudaDeviceEnablePeerAccess(devs[q], 0);
            if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled) { cudaGetLastError(); return 0; }
            cudaGetLastError();
        }
        void *p = NULL;
        if (cudaMalloc(&p, sizeof(float) * 2 * P2P_CAP + fbytes) != cudaSuccess) { cudaGetLastError(); return 0; }
        c->pbuf[r] = p;
        c->pflag[r] = (unsigned *)((uint8_t *)p + sizeof(float) * 2 * P2P_CAP);
        c->pcnt[r] = c->pflag[r] + TERN_TP_P2P_BLOCKS * TERN_TP_P2P_MAXR;
        if (cudaMemset(p, 0, sizeof(float) * 2 * P2P_CAP + fbytes) != cudaSuccess) { cudaGetLastError(); return 0; }
    }
    for (int r = 0; r < c->n; r++) { cudaSetDevice(devs[r]); cudaDeviceSynchronize(); }
    return 1;
}

static void p2p_free(tern__nccl *c, const int *devs) {
    for (int r = 0; r < c->n && r < TERN_TP_P2P_MAXR; r++)
        if (c->pbuf[r]) { cudaSetDevice(devs[r]); cudaFree(c->pbuf[r]); c->pbuf[r] = NULL; }
    c->p2p = 0;
}

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
    for (int r = 0; r < n; r++) {
        if (!want_bf16(bes[r])) continue;
        cudaSetDevice(devs[r]);
        if (cudaMalloc(&c->stage[r], AR_STAGE * 2) != cudaSuccess) {
            cudaGetLastError();
            tern__nccl_close(c);
            return tern_err(err, TERN_ENOMEM, "nccl: cannot allocate %zu MiB of all-reduce staging on GPU %d",
                            AR_STAGE * 2 >> 20, devs[r]);
        }
    }
    c->p2p = p2p_open(c, devs);
    if (!c->p2p) p2p_free(c, devs);
    tern_log(TERN_LOG_INFO, "nccl: %d ranks, small all-reduces %s", n, c->p2p ? "one-shot over peer memory" : "through NCCL");
    /* every rank on one wire format (a group of mixed compute modes sums in f32) */
    int all = 1;
    for (int r = 0; r < n; r++) all &= c->stage[r] != NULL;
    for (int r = 0; r < n && !all; r++)
        if (c->stage[r]) { cudaSetDevice(devs[r]); cudaFree(c->stage[r]); c->stage[r] = NULL; }
    *out = c;
    return TERN_OK;
}

void tern__nccl_close(tern__nccl *c) {
    if (!c) return;
    for (int r = 0; r < c->n && r < TERN_TP_P2P_MAXR; r++) {
        if (!c->pbuf[r]) continue;
        int dev = 0;
        if (c->comm[r]) ncclCommCuDevice(c->comm[r], &dev);
        cudaSetDevice(dev);
        cudaFree(c->pbuf[r]);
    }
    for (int r = 0; r < c->n; r++) {
        if (c->comm[r]) {
            int dev = 0;
            ncclCommCuDevice(c->comm[r], &dev);
            cudaSetDevice(dev);
            if (c->stage[r]) cudaFree(c->stage[r]);
            ncclCommDestroy(c->comm[r]);
        }
    }
    free(c);
}

void tern__cuda_bind(tern_backend *be) {
    if (be && be->device >= 0) cudaSetDevice(be->device);
}

static void fail(tern__cuda *cu, int rank, size_t count, ncclResult_t rc) {
    tern_log(TERN_LOG_ERROR, "nccl: all-reduce of %zu values on rank %d failed: %s", count, rank, ncclGetErrorString(rc));
    if (cu->sticky == cudaSuccess) cu->sticky = cudaErrorUnknown;
}

void tern__nccl_allreduce(tern__nccl *c, int rank, tern_backend *be, float *y, size_t count) {
    tern__cuda *cu = (tern__cuda *)be->impl;
    if (!c || rank < 0 || rank >= c->n || !count) return;
    cudaSetDevice(cu->device);
    void *st = c->stage[rank];
    if (!st && c->p2p && count <= P2P_CAP) {
        tern__cuda_tp_p2p_allreduce(be, y, count, c->pbuf, c->pflag, c->pcnt[rank], P2P_CAP, c->n, rank);
        return;
    }
    if (!st || ((uintptr_t)y & 7)) {
        ncclResult_t rc = ncclAllReduce(y, y, count, ncclFloat32, ncclSum, c->comm[rank], cu->stream);
        if (rc != ncclSuccess) fail(cu, rank, count, rc);
        return;
    }
    for (size_t off = 0; off < count; off += AR_STAGE) {
        size_t m = count - off < AR_STAGE ? count - off : AR_STAGE;
        tern__cuda_tp_convert(be, st, y + off, m, 1);
        ncclResult_t rc = ncclAllReduce(st, st, m, ncclBfloat16, ncclSum, c->comm[rank], cu->stream);
        if (rc != ncclSuccess) { fail(cu, rank, count, rc); return; }
        tern__cuda_tp_convert(be, y + off, st, m, 0);
    }
}

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
 * Fused residual add (tern__nccl_allreduce_add): on the one-shot path the kernel writes
 * x + sum instead of sum (one launch less per row-parallel matmul; the bits of allreduce + add).
 * Vocabulary-parallel head (tern__nccl_gather_cols): rank 0 collects every rank's logits slice
 * into its rows — through the one-shot kernel's staging and barrier (rows chunked to fit it),
 * or without peer access through ncclSend / ncclRecv into a staging buffer on rank 0 and 2-D
 * copies into place.
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
#define GATHER_STAGE ((size_t)4 << 20) /* floats of rank 0's NCCL gather staging (16 MiB; no peer access) */

struct tern__nccl {
    int n;
    ncclComm_t comm[TERN_TP_MAX];
    void *stage[TERN_TP_MAX];      /* bf16 staging on rank r's device (NULL: f32 on the wire) */
    int p2p;                       /* the one-shot kernel for count <= P2P_CAP */
    float *pbuf[TERN_TP_P2P_MAXR]; /* rank r's [2][P2P_CAP] staging, then its flags and epochs */
    unsigned *pflag[TERN_TP_P2P_MAXR], *pcnt[TERN_TP_P2P_MAXR];
    float *gstage;                 /* rank 0's gather staging (NCCL path only) */
};

/* the bf16 wire: ranks computing in bf16 and TERN_TP_ALLREDUCE=bf16 */
static int want_bf16(const tern_backend *be) {
    const char *e = getenv("TERN_TP_ALLREDUCE");
    return be->compute == TERN_COMPUTE_BF16 && e && !strcmp(e, "bf16");
}

/* Peer access between every pair and the one-shot staging on every rank; 0 when not possible. */
static int p2p_open(tern__nccl *c, const int *devs) {
    if (tern__cuda_env_int("TERN_TP_P2P", 1) == 0 || c->n < 2 || c->n > TERN_TP_P2P_MAXR) return 0;
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
    if (!c->p2p && n > 1) {
        cudaSetDevice(devs[0]);
        if (cudaMalloc((void **)&c->gstage, GATHER_STAGE * sizeof(float)) != cudaSuccess) {
            cudaGetLastError();
            tern__nccl_close(c);
            return tern_err(err, TERN_ENOMEM, "nccl: cannot allocate %zu MiB of gather staging on GPU %d",
                            GATHER_STAGE * sizeof(float) >> 20, devs[0]);
        }
    }
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
            if (r == 0 && c->gstage) cudaFree(c->gstage);
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

int tern__nccl_allreduce_add(tern__nccl *c, int rank, tern_backend *be, float *x, float *y, size_t count) {
    if (!c || rank < 0 || rank >= c->n) return 0;
    if (!count) return 1;
    if (c->stage[rank] || !c->p2p || count > P2P_CAP) return 0;
    cudaSetDevice(((tern__cuda *)be->impl)->device);
    tern__cuda_tp_p2p_allreduce_add(be, x, y, count, c->pbuf, c->pflag, c->pcnt[rank], P2P_CAP, c->n, rank);
    return 1;
}

void tern__nccl_gather_cols(tern__nccl *c, int rank, tern_backend *be, float *dst, const float *src, int rows,
                            int ld, const int *c0, const int *w) {
    tern__cuda *cu = (tern__cuda *)be->impl;
    if (!c || rank < 0 || rank >= c->n || rows <= 0) return;
    int n = c->n, wmax = 0;
    for (int q = 0; q < n; q++) wmax = w[q] > wmax ? w[q] : wmax;
    if (wmax <= 0) return;
    cudaSetDevice(cu->device);
    if (c->p2p && (size_t)wmax <= P2P_CAP) { /* rows in chunks that fit the one-shot staging */
        int step = (int)(P2P_CAP / (size_t)wmax < (size_t)rows ? P2P_CAP / (size_t)wmax : (size_t)rows);
        for (int r0 = 0; r0 < rows; r0 += step) {
            int m = rows - r0 < step ? rows - r0 : step;
            tern__cuda_tp_p2p_gather(be, dst ? dst + (size_t)r0 * ld : NULL, src + (size_t)r0 * w[rank], m, ld, c0, w,
                                     c->pbuf, c->pflag, c->pcnt[rank], P2P_CAP, n, rank);
        }
        return;
    }
    size_t per = GATHER_STAGE / ((size_t)wmax * (size_t)(n - 1));
    int step = per < (size_t)rows ? (int)per : rows;
    if (step < 1 || !c->gstage) {
        tern_log(TERN_LOG_ERROR, "nccl: gather of %d columns per rank does not fit the staging", wmax);
        if (cu->sticky == cudaSuccess) cu->sticky = cudaErrorUnknown;
        return;
    }
    for (int r0 = 0; r0 < rows; r0 += step) {
        int m = rows - r0 < step ? rows - r0 : step;
        ncclResult_t rc = ncclGroupStart();
        for (int q = 1; q < n && rc == ncclSuccess; q++) {
            if (rank == 0)
                rc = ncclRecv(c->gstage + (size_t)(q - 1) * step * wmax, (size_t)m * w[q], ncclFloat32, q, c->comm[0],
                              cu->stream);
            else if (q == rank)
                rc = ncclSend(src + (size_t)r0 * w[rank], (size_t)m * w[rank], ncclFloat32, 0, c->comm[rank], cu->stream);
        }
        ncclResult_t re = ncclGroupEnd();
        if (rc == ncclSuccess) rc = re;
        if (rc != ncclSuccess) { fail(cu, rank, (size_t)m * wmax, rc); return; }
        if (rank != 0 || !dst) continue;
        for (int q = 0; q < n; q++) {
            const float *from = q == 0 ? src + (size_t)r0 * w[0] : c->gstage + (size_t)(q - 1) * step * wmax;
            cudaError_t e = cudaMemcpy2DAsync(dst + (size_t)r0 * ld + c0[q], sizeof(float) * (size_t)ld, from,
                                              sizeof(float) * (size_t)w[q], sizeof(float) * (size_t)w[q], (size_t)m,
                                              cudaMemcpyDeviceToDevice, cu->stream);
            if (e != cudaSuccess && cu->sticky == cudaSuccess) cu->sticky = e;
        }
    }
}

/*
 * lt_sweep.c — every algorithm cuBLASLt's heuristic offers for one GEMM, timed (bench_cuda --ltsweep).
 *
 * gemm.c takes the heuristic's first answer per shape. For the skinny GEMMs of batch decode (a few dozen rows
 * against a whole weight matrix) that answer streams the weights at 2.3-3.3 TB/s on the H200 (NOTES (aa)), so
 * this asks for up to 16 answers and times each on the same operands: the weight rotates over `copies` copies
 * (the L2 stays cold, as in a decode step), launches are timed in a row between two events. One line per answer:
 * its rank, µs, GB/s of the caller's byte count, and the configuration that names it (algorithm id, tile, stages,
 * split-K and its reduction, swizzle, custom option, cluster shape) — what a per-shape rule in gemm.c would pin.
 * Diagnostic only: no engine path calls it.
 */
#include "backend/cuda/gemm.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SWEEP_MAX 16

/* one configuration attribute (32 bits wide, the cluster shape 16: the call wants the exact size) */
static unsigned cfg_u(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at) {
    size_t got = 0;
    if (at == CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID) {
        uint16_t v = 0;
        return cublasLtMatmulAlgoConfigGetAttribute(a, at, &v, sizeof v, &got) == CUBLAS_STATUS_SUCCESS ? v : 9999u;
    }
    uint32_t v = 0;
    return cublasLtMatmulAlgoConfigGetAttribute(a, at, &v, sizeof v, &got) == CUBLAS_STATUS_SUCCESS ? v : 9999u;
}

/* launches r0..r1-1 of algorithm al, launch r on copy r % copies of A; 0 at the first that fails */
static int sweep_run(tern__cuda *c, const tern__cuda_lt_desc *d, const cublasLtMatmulAlgo_t *al, void *y, const void *a,
                     size_t a_step, int copies, const void *bm, float beta, int r0, int r1) {
    const float alpha = 1.0f;
    for (int r = r0; r < r1; r++)
        if (cublasLtMatmul(c->lt, d->op, &alpha, (const char *)a + (size_t)(r % copies) * a_step, d->la, bm, d->lb, &beta,
                           y, d->lc, y, d->lc, al, c->lt_ws, TERN_CUDA_LT_WS_BYTES, c->stream) != CUBLAS_STATUS_SUCCESS)
            return 0;
    return 1;
}

void tern__cuda_lt_sweep(tern__cuda *c, const char *name, void *y, int c_bf16, int ldc, long long sc,
                         const void *a, size_t a_step, int copies, long long sa, const void *bm, int m, int n, int k,
                         int nb, float beta, double bytes) {
    if (!c || copies < 1) return;
    tern__cuda_lt_desc d;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t hs[SWEEP_MAX];
    cudaEvent_t e0 = NULL, e1 = NULL;
    size_t ws = TERN_CUDA_LT_WS_BYTES;
    int got = 0;
    const cudaDataType_t cty = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cudaSetDevice(c->device);
    if (tern__cuda_lt_desc_make(&d, cty, ldc, sc, 0, sa, k, 0, m, n, k, nb, CUDA_R_16BF, CUBLAS_COMPUTE_32F) != TERN_OK) {
        printf("ltsweep %s: no descriptors\n", name);
        return;
    }
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) goto done;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (cublasLtMatmulAlgoGetHeuristic(c->lt, d.op, d.la, d.lb, d.lc, d.lc, pref, SWEEP_MAX, hs, &got) !=
        CUBLAS_STATUS_SUCCESS)
        got = 0;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) goto done;
    const int reps = copies * 4 < 40 ? 40 : copies * 4;
    for (int i = 0; i < got; i++) {
        const cublasLtMatmulAlgo_t *al = &hs[i].algo;
        int ok = sweep_run(c, &d, al, y, a, a_step, copies, bm, beta, 0, copies); /* warm-up: one pass over the copies */
        cudaEventRecord(e0, c->stream);
        ok = ok && sweep_run(c, &d, al, y, a, a_step, copies, bm, beta, 0, reps);
        cudaEventRecord(e1, c->stream);
        float ms = 0;
        if (!ok || cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
            printf("ltsweep %-28s n=%-4d #%-2d failed\n", name, n, i);
            cudaGetLastError();
            continue;
        }
        const double us = 1e3 * ms / reps;
        printf("ltsweep %-28s n=%-4d #%-2d %8.1f us %7.1f GB/s  algo %u tile %u stages %u splitk %u red %u swz %u "
               "custom %u cluster %u waves %.2f\n",
               name, n, i, us, bytes / us * 1e-3, cfg_u(al, CUBLASLT_ALGO_CONFIG_ID),
               cfg_u(al, CUBLASLT_ALGO_CONFIG_TILE_ID), cfg_u(al, CUBLASLT_ALGO_CONFIG_STAGES_ID),
               cfg_u(al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), cfg_u(al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
               cfg_u(al, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING), cfg_u(al, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
               cfg_u(al, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), hs[i].wavesCount);
        fflush(stdout);
    }
done:
    if (!got) printf("ltsweep %s n=%d: the heuristic gave no answer\n", name, n);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    tern__cuda_lt_desc_free(&d);
}

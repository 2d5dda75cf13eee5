/*
 * gemm.c — prefill matmul (many rows) through cuBLASLt.
 *
 * y[n, out] = x[n, in] · W[out, in]ᵀ. In cuBLASLt's column-major terms this is
 * Y(out × n, ld out) = Wᵀ · X with A = W stored (in × out, ld in) transposed and
 * B = X stored (in × n, ld in): no copies of x or y are needed.
 *
 * Paths:
 *   - F32 weights: f32 GEMM, compute CUBLAS_COMPUTE_32F_PEDANTIC (exact f32, never TF32).
 *   - BF16 weights in bf16 mode: x rounded to bf16 in scratch, bf16 × bf16 GEMM with f32
 *     accumulation (tensor cores). Bound: each product sees two bf16 roundings (rel 2^-8 each),
 *     so |y - y_exact| <= ~2^-8 · Σ|w||x| (observed rel L2 ~ 2e-3 on random data).
 *   - otherwise (F16/Q weights, or bf16 weights in f32 mode): the weight is expanded in row
 *     chunks into scratch (f32 in f32 mode: exact; bf16 in bf16 mode) and multiplied chunk by
 *     chunk into the matching columns of y.
 * Returns an error (and the caller falls back to the GEMV kernels) when cuBLASLt finds no
 * algorithm or the scratch is too small for even one chunk.
 */
#include "backend/cuda/cuda_internal.h"

static tern_status lt_gemm(tern__cuda *c, float *y, int ldy, const void *w, const void *x, int m, int n, int k,
                           cudaDataType_t ab, cublasComputeType_t ct) {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    tern_status st = TERN_EDEVICE;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    size_t ws = TERN_CUDA_LT_WS_BYTES;
    float alpha = 1.0f, beta = 0.0f;
    if (cublasLtMatmulDescCreate(&op, ct, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) goto done;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (cublasLtMatrixLayoutCreate(&la, ab, (uint64_t)k, (uint64_t)m, k) != CUBLAS_STATUS_SUCCESS) goto done;
    if (cublasLtMatrixLayoutCreate(&lb, ab, (uint64_t)k, (uint64_t)n, k) != CUBLAS_STATUS_SUCCESS) goto done;
    if (cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, (uint64_t)m, (uint64_t)n, ldy) != CUBLAS_STATUS_SUCCESS) goto done;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) goto done;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t h;
    int got = 0;
    if (cublasLtMatmulAlgoGetHeuristic(c->lt, op, la, lb, lc, lc, pref, 1, &h, &got) != CUBLAS_STATUS_SUCCESS ||
        got < 1)
        goto done;
    if (cublasLtMatmul(c->lt, op, &alpha, w, la, x, lb, &beta, y, lc, y, lc, &h.algo, c->lt_ws, ws, c->stream) ==
        CUBLAS_STATUS_SUCCESS)
        st = TERN_OK;
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return st;
}

tern_status tern__cuda_gemm(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int e) {
    const int in = w->in, out = w->out;
    const uint8_t *mat = (const uint8_t *)w->data + (size_t)e * w->mat_bytes;
    if (w->dtype == TERN_DT_F32)
        return lt_gemm(c, y, out, mat, x, out, n, in, CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC);
    const int bf = c->compute == TERN_COMPUTE_BF16;
    const size_t esz = bf ? 2 : 4;
    uint8_t *scr = (uint8_t *)c->gemm_scratch;
    size_t avail = TERN_CUDA_GEMM_SCRATCH_BYTES;
    const void *xb = x;
    if (bf) { /* activations to bf16 first */
        size_t xbytes = ((size_t)n * in * 2 + 255) & ~(size_t)255;
        if (xbytes >= avail / 2) return TERN_ENOMEM;
        tern__cuda_f32_to_bf16(c, scr, x, (size_t)n * in);
        xb = scr;
        scr += xbytes;
        avail -= xbytes;
        if (w->dtype == TERN_DT_BF16)
            return lt_gemm(c, y, out, mat, xb, out, n, in, CUDA_R_16BF, CUBLAS_COMPUTE_32F);
    }
    size_t rows = avail / ((size_t)in * esz);
    if (rows < 64) return TERN_ENOMEM;
    if (rows > (size_t)out) rows = (size_t)out;
    rows &= ~(size_t)15; /* keep chunks multiples of 16 rows for aligned column offsets */
    if (rows == 0) rows = (size_t)out;
    for (int r0 = 0; r0 < out; r0 += (int)rows) {
        const int m = out - r0 < (int)rows ? out - r0 : (int)rows;
        tern__cuda_dequant(c, scr, bf, w, e, r0, m);
        tern_status st = bf ? lt_gemm(c, y + r0, out, scr, xb, m, n, in, CUDA_R_16BF, CUBLAS_COMPUTE_32F)
                            : lt_gemm(c, y + r0, out, scr, xb, m, n, in, CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC);
        if (st != TERN_OK) return st; /* fallback redoes every column: harmless */
    }
    return TERN_OK;
}

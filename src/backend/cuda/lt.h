/*
 * lt.h — cuBLASLt descriptors shared by gemm.c (the GEMMs) and lt_sweep.c (bench_cuda --ltsweep); kept out of
 * cuda_internal.h so that the .cu files do not rebuild for them.
 */
#ifndef TERN_CUDA_LT_H
#define TERN_CUDA_LT_H

#include "backend/cuda/cuda_internal.h"

/* the descriptors of one cuBLASLt GEMM of lt_gemm_x's form (C of type cty, A of type ab, compute ct); free accepts a
 * zeroed one */
typedef struct tern__cuda_lt_desc { cublasLtMatmulDesc_t op; cublasLtMatrixLayout_t la, lb, lc; } tern__cuda_lt_desc;
tern_status tern__cuda_lt_desc_make(tern__cuda_lt_desc *d, cudaDataType_t cty, int ldc, long long sc, int an,
                                    long long sa, int ldb, long long sb, int m, int n, int k, int nb, cudaDataType_t ab,
                                    cublasComputeType_t ct);
void tern__cuda_lt_desc_free(tern__cuda_lt_desc *d);

/* lt_sweep.c (bench_cuda --ltsweep): every answer of cuBLASLt's heuristic (up to 16) for the bf16 GEMM C (m x n, f32,
 * or bf16 when c_bf16, ld ldc) = A_bᵀ·B (A in `copies` copies a_step bytes apart: the L2 stays cold), a strided batch
 * of nb (0: one GEMM) with strides sa / sc, beta 0 or 1, timed over repeated launches; one line each: µs, GB/s of
 * `bytes`, the algorithm's configuration */
void tern__cuda_lt_sweep(tern__cuda *c, const char *name, void *y, int c_bf16, int ldc, long long sc, const void *a,
                         size_t a_step, int copies, long long sa, const void *bm, int m, int n, int k, int nb,
                         float beta, double bytes);

#endif

/*
 * gemm.h — what gemm.c and lt_gemm.c share with the backend's other C files only (cuda_backend.c, lt_sweep.c): the cuBLASLt
 * descriptors, the one-GEMM q|k|v path, and fused.cu's launcher that path calls. Kept out of cuda_internal.h so
 * that the .cu files do not rebuild for them.
 */
#ifndef TERN_CUDA_GEMM_H
#define TERN_CUDA_GEMM_H

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

/* One cuBLASLt algorithm by its configuration: {algorithm id, tile id, stages id, split-K, reduction scheme, CTA
 * swizzle, custom option, cluster shape id} for the GEMM of descriptors d (bf16 A / B, f32 compute, C and D of type
 * cty). 1 when cublasLtMatmulAlgoCheck accepts it and its workspace fits, 0 otherwise. TERN_LT_PIN="m,n,k,algo,tile,
 * stages,splitk,red;..." makes gemm.c's GEMMs of exactly those m, n, k (bf16 A) take that configuration instead of the
 * heuristic's first answer (bench_cuda --ltsearch prints the entries) */
#define TERN_CUDA_LT_CFG 8
/* lt_gemm.c: one configuration attribute of an algorithm (the cluster shape read at its 16 bits), 9999 when the call
 * fails (lt_sweep.c prints it; lt_gemm.c's preferences match on it) */
unsigned tern__cuda_lt_cfg(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at);
int tern__cuda_lt_algo_make(tern__cuda *c, const tern__cuda_lt_desc *d, cudaDataType_t cty,
                            const unsigned cfg[TERN_CUDA_LT_CFG], cublasLtMatmulAlgo_t *al);
/* lt_sweep.c (bench_cuda --ltsearch): every configuration cuBLASLt accepts for the plain GEMM C (m x n, ld ldc) =
 * Aᵀ·B + beta·C, timed as the sweep times them; the fastest with their TERN_LT_PIN entries */
void tern__cuda_lt_search(tern__cuda *c, const char *name, void *y, int c_bf16, int ldc, const void *a, size_t a_step,
                          int copies, const void *bm, int m, int n, int k, float beta, double bytes);

/* wgemm.cu: y [n][ldy] (+ y when add) = X [n][k] · W [m][k]ᵀ, bf16 X and W, f32 y, for 17..128 rows on TMA + wgmma
 * (TERN_CUDA_WGEMM, TERN_CUDA_WGEMM_MIN). 1 when launched, 0 when not served (nothing written: cuBLASLt runs it) */
int tern__cuda_wgemm(tern__cuda *c, float *y, int ldy, const void *w, const void *x, int m, int n, int k, int add);
/* at open: the instances' shared-memory limits and the tensor-map encoder (no API calls of that kind while a graph
 * is captured) */
void tern__cuda_wgemm_init(tern__cuda *c);

/* TERN_CUDA_QKV_ONE (default 1 since session 27): q|k|v joined at load (vt join_weights) and, from TERN_CUDA_QKV_ONE_MIN
 * rows (9) in the plain bf16 mode, ops.h norm_qkv_rope_kv as one GEMM over the three (tern__cuda_gemm_qkv_rope) */
int tern__cuda_qkv_one(void);
/* norm_qkv_rope_kv for n > 1 rows: xn = rmsnorm(x)·nw and its bf16 copy (one kernel), C [n][Σ out] = one cuBLASLt GEMM
 * over the joined q|k|v, then fused.cu's rope_kv_rows: q and k roped from C's rows into y[0], y[1] (k and v also into
 * the cache), v copied into y[2]. 1 when done, 0 when not served (nothing written) */
int tern__cuda_gemm_qkv_rope(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, float *const *y,
                             const tern__cuda_w *const *w, const tern_kv_layer *kv, const tern_rows *rows, int nh,
                             const float *inv_freq, float mscale);
/* norm_qkv_rope_kv for 2..128 rows of Q4 (TERN_CUDA_Q4_QKV, opt-in): the pre-norm writing the batch Q4 GEMM's staged x,
 * the q|k|v GEMM leaving its K slices, fused.cu's rope_kv_parts summing them into the rope and cache stores; bitwise
 * rmsnorm + matmul_n + rope_kv_write. 1 when done, 0 when not served (nothing written) */
int tern__cuda_q4_qkv_rope(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, float *const *y,
                           const tern__cuda_w *const *w, const tern_kv_layer *kv, const tern_rows *rows, int nh,
                           const float *inv_freq, float mscale);
/* its first half: xn and the GEMM; returns C (rows of w[0..2]'s Σ out floats, in gemm_scratch after the staged x, whose
 * bytes go to *xbytes when not NULL) or NULL when not served (nothing written) */
const float *tern__cuda_qkv_one_gemm(tern__cuda *c, float *xn, const float *x, const float *nw, float eps,
                                     const tern__cuda_w *const *w, const tern_kv_layer *kv, const tern_rows *rows,
                                     int nh, size_t *xbytes);
/* fused.cu: rope_kv_write reading q|k|v from rows of C (ld floats each: q heads, k heads, v heads) and writing q, k, v
 * [n][heads·d] beside the cache; the arithmetic of rope_kv_write. 1 when done, 0 for page kinds it does not serve */
int tern__cuda_rope_kv_rows(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const float *src, int ld,
                            float *q, float *k, float *v, int nh, const float *inv_freq, float mscale);

#endif

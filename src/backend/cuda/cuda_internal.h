/*
 * cuda_internal.h — what the CUDA backend's files share (never included outside
 * src/backend/cuda/). cuda_backend.c owns the state and the vtable; each .cu file holds one op
 * family and exports plain C launchers named tern__cuda_<op>, all enqueued on the backend's
 * single stream (ops are asynchronous; download() synchronizes).
 *
 * Memory plan: everything the decode path needs is allocated at open —
 *   - `part`: split-K attention partials (PART_FLOATS floats),
 *   - `lt_ws`: cuBLASLt workspace.
 * The prefill GEMM path (n > TERN_CUDA_GEMV_MAX_N rows) uses `gemm_scratch` for dequantized
 * weight chunks and bf16 activations; it is sized at open too (gemm_scratch_bytes: TERN_CUDA_SCRATCH_MB,
 * default TERN_CUDA_GEMM_SCRATCH_MB) and the GEMM works through the weight in row chunks that fit.
 *
 * Weights after upload_weight: one device allocation per tensor holding the packed data, then
 * scales, then biases (256-byte aligned), all tightly packed (mat_stride = 0): 3-D stacks that
 * were strided views are repacked on upload.
 */
#ifndef TERN_CUDA_INTERNAL_H
#define TERN_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <cublasLt.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "ops/ops.h"

#define TERN_CUDA_GEMV_MAX_N 16             /* rows per GEMV launch (x staged in shared memory) */
#define TERN_CUDA_PART_FLOATS (8u << 20)    /* split-K partials: 32 MiB */
#define TERN_CUDA_MM_CNT 65536              /* mm_cnt's counters */
#define TERN_CUDA_LT_WS_BYTES (32u << 20)   /* cuBLASLt workspace */
#define TERN_CUDA_GEMM_SCRATCH_MB 256   /* gemm_scratch's size unless TERN_CUDA_SCRATCH_MB says otherwise */

typedef struct tern__cuda {
    int device;
    tern_compute compute;
    int bf16_x2;                 /* opened with TERN_COMPUTE_BF16X2 (compute is then BF16): GEMM x as a bf16 pair */
    int i8;                      /* opened with TERN_COMPUTE_INT8 (compute is then BF16): Q4 one-row GEMVs take int8 x */
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws;
    float *part;                 /* split-K partials */
    void *gemm_scratch;          /* dequantized weight chunks + bf16 activations */
    size_t gemm_scratch_bytes;   /* its size */
    const float *att_f32;        /* set by gemm.c's attention_o for one attention call: the batch decode attention
                                  * of exactly the att_n rows at att_f32 may write its output as bf16 at the start
                                  * of gemm_scratch (the o GEMM's staged input) instead of f32 there */
    int att_n, att_bf16_done;    /* ... and whether it did */
    int att_q4s;                 /* ... in the batch Q4 GEMM's staged order (q4s_pos; a Q4 o projection) */
    int n_sm;
    double mem_peak;             /* the device memory's peak rate, bytes/s (clock x bus width; 0 unknown): the Q4
                                  * walk's L2 prefetch default (gemv_mma.cu) differs between H100 (3.35 TB/s) and
                                  * H200 (4.8 TB/s) parts */
    size_t smem_optin;           /* max dynamic shared memory per block */
    cudaError_t sticky;          /* first asynchronous error seen (reported by sync/download) */
    /* small uploads go through a pinned ring and return at once (graph.c) */
    uint8_t *up_ring;
    size_t up_off;
    /* step graphs (graph.c): while `capturing`, ops are recorded, not run */
    int capturing, capture_bad;
    uint64_t cap_key;
    uint8_t *cap_out;            /* caller's host output range of the step being recorded */
    size_t cap_out_bytes;
    struct tern__cuda_graph *graphs; /* [TERN_CUDA_MAX_GRAPHS] */
    struct tern__cuda_graph *cap;    /* entry being recorded */
    uint64_t use_clock;
    /* replays (graph.c): the host's time from one replay's return to the next launch's return, gaps under 0.5 ms
     * (decode; a prefill in between is longer), and the cudaGraphLaunch calls' share — logged at close */
    double gr_last, gr_gap, gr_launch;
    long gr_n;
    /* moe_mlp over expert slot views (tensor.h mat_map): the ids remapped to slots (moe.cu) */
    int32_t *moe_idx;
    size_t moe_idx_cap;
    int *mm_cnt;                 /* gemv_mma.cu: split-K counters per row block (zero between launches) */
    int *ad_cnt;                 /* attn_decode.cu: split counters per (row, kv head) (zero between launches) */
    /* upload_side (cuda_backend.c): another thread's copies, on their own stream through two pinned
     * staging buffers; created by that thread on first use */
    cudaStream_t side_stream;
    void *side_pin[2];
    cudaEvent_t side_ev[2];
    int side_state;              /* 0 not opened, 1 open, -1 could not be opened (synchronous copies) */
    struct tern__cuda_lt_cache *lt_cache; /* gemm.c: cuBLASLt algorithm per GEMM shape (made on first use) */
    cudaStream_t tune_stream;    /* lt_gemm.c lt_tune: timing runs while `stream` is being recorded (made on first use) */
    void *blas;                  /* moe_blas.cu: a cuBLAS handle on `stream` (made on first use) */
} tern__cuda;

#define TERN_CUDA_MAX_GRAPHS 16
#define TERN_CUDA_UP_RING (1u << 20)   /* pinned upload ring bytes; uploads up to 1/16 of it are async */

/* graph.c: graph hooks of the vtable, the async upload path and their setup / teardown */
tern_status tern__cuda_graph_open(tern__cuda *c, tern_error *err);
void tern__cuda_graph_close(tern__cuda *c);
void tern__cuda_graph_report(const tern__cuda *c); /* graph.c: the host time between replays (TERN_LOG=info) */
int tern__cuda_graph_replay(tern__cuda *c, uint64_t key, void *out, size_t out_bytes);
int tern__cuda_graph_begin(tern__cuda *c, uint64_t key, void *out, size_t out_bytes);
int tern__cuda_graph_end(tern__cuda *c, int ok);
void tern__cuda_graph_reset(tern__cuda *c);
/* upload: async through the ring when small (returns 1), else 0 (caller copies synchronously);
 * download while recording: records a copy into the graph's staging (returns 1), else 0 */
int tern__cuda_upload_async(tern__cuda *c, void *dst, const void *src, size_t bytes);
int tern__cuda_download_recorded(tern__cuda *c, void *dst, const void *src, size_t bytes);

/* Modes of the fused matmuls (gemv1.cu, gemv_mma.cu, sgemm.cu, gemm.c): y = W·x per matrix; y = act(gate·x)·(up·x)
 * with SiLU / GELU-tanh; y += W·x */
enum { G1_PLAIN = 0, G1_SILU = 1, G1_GELU = 2, G1_RES = 3 };

/* Weight view the kernels take: element dtype, quant params, pointers of matrix e. */
typedef struct tern__cuda_w {
    tern_dtype dtype, sdtype;
    int bits, group_size;
    int out, in;                 /* logical rows / inputs of one matrix */
    int nmat;                    /* matrices in the stack (1 for 2-D) */
    const void *data, *scales, *biases; /* matrix 0 */
    size_t mat_bytes, mat_bytes_s;      /* bytes between matrices (tight) */
    int precise;                 /* tern_tensor.precise */
    int blk_rows;                /* block-scaled FP8 (dtype F8_E4M3, scales != NULL): rows per scale
                                    block; group_size = columns per block; F32 scales
                                    [ceil(out/blk_rows), ceil(in/group_size)] per matrix */
} tern__cuda_w;

void tern__cuda_wview(const tern_tensor *t, tern__cuda_w *w);
void tern__cuda_check(tern__cuda *c, const char *what); /* record launch errors */
/* an integer environment switch: `dflt` when unset or empty (callers keep the value in a static) */
int tern__cuda_env_int(const char *name, int dflt);

/* gemv.cu / gemm.c */
void tern__cuda_matmul(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int e);
void tern__cuda_gemv_init(tern__cuda *c); /* at open: shared-memory limits of the big instances */
void tern__cuda_gemv(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int e);
/* gemv_mma.cu: one activation row times Q4/Q8 weights on tensor cores; k <= 3 matrices sharing
 * `in` and the format; mode 0 plain, 1/2 act(gate)*up (SiLU/GELU-tanh, k = 2), 3 y += W x.
 * Returns 0 when the format or shape is not served (then use gemv.cu's kernels). */
int tern__cuda_gemv_mma(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e, int k,
                        const float *x, int mode);
void tern__cuda_gemv_mma_init(tern__cuda *c);
int tern__cuda_gemv_mma_serves(const tern__cuda *c, const tern__cuda_w *const *w, int k, const float *x, int mode);
/* rope_kv_write folded into a one-row q|k|v GEMV's epilogue (ops.h norm_qkv_rope_kv; gemv1.cu, gemv_mma.cu):
 * rope_pair at pos[0] then · mscale for the pairs (i, i + d/2) of the q and k heads, and k, v rows stored into
 * the page of (slot[0], pos[0]) as fused.cu's kv_put rounds them */
typedef struct tern__cuda_rope_kv {
    const float *inv_freq;
    const int32_t *pos, *slot, *bt;
    void *kpool, *vpool;
    float mscale;
    int nh, nkv, d, max_blocks, bs, pkind; /* pkind: 0 F32, 1 BF16, 2 F16 pages */
} tern__cuda_rope_kv;
int tern__cuda_gemv_mma_norm(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e, int k,
                             const float *x, int mode, const float *nw, float *xn, float eps,
                             const tern_norm_res *res); /* x staged as rmsnorm(x)·nw (res: of the residual add) */
/* the same for q|k|v (k = 3, plain mode) with rope_kv_write in the epilogue: 0 = not served (the XP1 walk with BF16
 * scales and split K only; heads of d <= 128 dividing the 128-row blocks) */
int tern__cuda_gemv_mma_rope(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const float *x,
                             const float *nw, float *xn, float eps, const tern__cuda_rope_kv *rope);
/* Expert GEMV over np output rows p (y row p at y + p*ystride); term j < ksum of row p is
 * pair q = p*ksum + j, using matrix idx[q] (skipped unless 0 <= idx[q] < nmat), activation row
 * x + (q / xdiv) * xstride and coefficient wts[q] (1 when wts is NULL):
 *   gate/up: ksum 1, xdiv k (pair -> token);  down: ksum k, xdiv 1, wts = router weights. */
void tern__cuda_gemv_expert(tern__cuda *c, float *y, int ystride, const float *x, int xdiv, int np,
                            const int32_t *idx, const float *wts, int ksum, const tern__cuda_w *w, int nmat,
                            int xstride);
/* gemv_xr.cu: n = 2..8 rows of x times Q4 (and Q2 / Q3 / Q5 / Q6 / Q8) matrices w[0..k) in the plain bf16 mode (default;
 * TERN_CUDA_GEMV_XR=0 off); mode G1_PLAIN / G1_RES / a pair mode. 1 when it ran, 0 when not served */
int tern__cuda_gemv_xr_run(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, int k, const float *x, int n,
                           int mode);
void tern__cuda_gemv_xr_init(tern__cuda *c);
/* Dequantize rows [r0, r0+m) of matrix e to f32 (bf16 = 0), bf16 (bf16 = 1) or a bf16 pair
 * (bf16 = 2: hi at dst, lo = bf16(v - hi) after it, at m*in*2 bytes rounded up to 256). */
void tern__cuda_dequant(tern__cuda *c, void *dst, int bf16, const tern__cuda_w *w, int e, int r0, int m);
/* hi = bf16(x), and lo = bf16(x - hi) when lo != NULL */
void tern__cuda_f32_to_bf16(tern__cuda *c, void *hi, void *lo, const float *x, size_t n);
void tern__cuda_round_bf16(tern__cuda *c, float *y, const float *x, size_t n); /* y = bf16(x) as f32; y may be x */
/* 1 when n rows times w multiply bf16-rounded x (--compute bf16, n >= 2, w not precise): gemv.cu */
int tern__cuda_plain_rows(const tern__cuda *c, const tern__cuda_w *w, int n);
/* x itself, or x [n][cols] rounded to bf16 in gemm_scratch when tern__cuda_plain_rows holds (and the
 * copy fits): the input of a GEMV path that must match the GEMMs' rounding (gemv.cu) */
const float *tern__cuda_plain_x(tern__cuda *c, const tern__cuda_w *w, int n, const float *x, int cols);
tern_status tern__cuda_gemm(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int e);
int tern__cuda_gemm_merge_max(void); /* gemm.c: rows up to which BF16 weights take one [xh | xl] GEMM */
int tern__cuda_bf16_split_all(const tern__cuda *c); /* gemm.c: 1 bf16x2 (every GEMM splits x), 0 bf16 (precise weights only) */
/* lt_gemm.c: cuBLASLt C_b (m x n, ld ldc, f32) = A_bᵀ·B_b with A_b (k x m, ld k), B_b (k x n, ld ldb) of
 * type ab; nb = 0 one GEMM (strides unused), nb >= 1 a strided batch (A_b at a + b·sa, B_b at
 * bm + b·sb, C_b at y + b·sc, element offsets); beta 0 or 1; TERN_EDEVICE when no algorithm */
tern_status tern__cuda_lt_gemm(tern__cuda *c, float *y, int ldc, long long sc, const void *a, long long sa,
                               const void *bm, int ldb, long long sb, int m, int n, int k, int nb, cudaDataType_t ab,
                               cublasComputeType_t ct, float beta);
void tern__cuda_lt_cache_free(tern__cuda *c); /* lt_gemm.c: at close (accepts none made) */
/* lt_gemm.c: the same for bf16 A and B with C of type cty; an = 1: C_b = A_b·B_b with A_b (m x k, ld m) */
tern_status tern__cuda_lt_gemm_x(tern__cuda *c, void *y, cudaDataType_t cty, int ldc, long long sc, const void *a, int an,
                                 long long sa, const void *bm, int ldb, long long sb, int m, int n, int k, int nb,
                                 float beta);
/* attn_mat.cu: a prefill run (one slot) at head dim 512 with the scores materialized (cuBLASLt); 1 when done */
int tern__cuda_attn_mat_run(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                            const tern_kv_layer *kv, float scale, float softcap);
/* sgemm.cu (modes G1_*): y = W·x for 1..64 rows of bf16 x (xb [n][in], staged by the caller) over BF16 weights, plain bf16
 * mode; mode 0: k <= 3 matrices, y[i] = W_i·x; 1 / 2: k = 2 (gate, up), y[0] = act(gate·x)·(up·x) (SiLU /
 * GELU-tanh); 3: k = 1, y[0] += W·x. Returns 1 when it ran, 0 when the shape is not served. */
int tern__cuda_sgemm(tern__cuda *c, int k, float *const *y, const void *xb, int n, const tern__cuda_w *const *w, int mode);
void tern__cuda_sgemm_init(tern__cuda *c); /* at open: shared-memory limits */
int tern__cuda_sgemm_level(void); /* TERN_CUDA_SGEMM: 0 off, 1 q|k|v (multi-matrix) only, 2 every op */
/* gemm.c: the fused decode ops for n > 1 rows in the plain bf16 mode (BF16 weights, cuBLASLt; x rounded
 * once per group, same-shape matrices as one batched GEMM, y += W·x as beta = 1). 1 when done, 0 when
 * not served (the caller runs the separate ops). Within the bf16 bound of the separate ops, not bitwise. */
int tern__cuda_gemm_n(tern__cuda *c, int k, float *const *y, const float *x, int n, const tern__cuda_w *const *w);
int tern__cuda_gemm_glu(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *gate,
                        const tern__cuda_w *up, int act);
int tern__cuda_gemm_add(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w);
/* ops.h attention_o around the backend's attention: _begin (1 when the projection will run as gemm_add's GEMM, or for
 * Q4 as the batch Q4 GEMM on the staged x (TERN_CUDA_Q4_ATT_O); it sets c->att_f32 / att_n to the attention's output),
 * the attention, then _end (the staging when the attention wrote f32, y += w·att, or y = w·att when !add: gemm_rows's
 * plain GEMM; 1 when done). TERN_CUDA_ATT_O=0: never */
int tern__cuda_attn_o_begin(tern__cuda *c, float *y, const float *att, int n, int in_att, const tern__cuda_w *w);
int tern__cuda_attn_o_end(tern__cuda *c, float *y, const float *att, int n, const tern__cuda_w *w, int add);
void tern__cuda_attn_o_cancel(tern__cuda *c); /* the handoff dropped without an attention (attn_o_end does it too) */
/* gemm.c: ops.h norm_mlp (w = gate, up, down) for many rows in the plain bf16 mode; 1 when done, 0 when not served */
int tern__cuda_gemm_mlp(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, int n, float *y, int add,
                        const tern__cuda_w *const *w, int act, const tern_norm_res *res);
/* moe_blas.cu: h[r][0, I) = bf16(act(g)·u) for rows r < rows of gu [rows][2I] (bf16; I % 8 == 0), the gate at
 * column gofs of a row (0 or I), up in the other half */
void tern__cuda_glu_bf16(tern__cuda *c, void *h, const void *gu, size_t rows, int I, int act, int gofs);
/* qgemm.cu: tensor-core matmul for n >= 2 rows in the bf16 mode reading each weight once;
 * returns 1 when it handled the call, 0 when the caller must take another path */
int tern__cuda_qgemm(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int e);
void tern__cuda_qgemm_init(tern__cuda *c); /* at open (from tern__cuda_gemv_init): the 64-row tiles' shared memory */
void tern__cuda_moe_gemm_init(tern__cuda *c); /* the same for moe_gemm.cu's 64-row tiles */
/* qgemm_q4.cu: Q4 (BF16 scales) times 2..128 rows in the plain bf16 mode through a cp.async ring
 * (TERN_CUDA_QG4=0 off): k <= 3 matrices (matrix e of each stack) in mode G1_PLAIN / G1_RES / a pair mode;
 * 1 when it ran, 0 when not served. tern__cuda_q4_rows: gemv_xr.cu first for the rows it takes, then this */
int tern__cuda_qg4_run(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, int k, const float *x, int n,
                       int mode, int e);
int tern__cuda_q4_rows(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, int k, const float *x, int n,
                       int mode, int e);
/* tern__cuda_qg4_run's form for x staged already in gemm_scratch in the wgmma kernel's order (norm.cu
 * tern__cuda_rmsnorm_q4s): run 0 — 1 when it would run (nothing launched), run 1 — the GEMMs; parts != NULL (run 1):
 * no reduce — *parts K slices of the partials left in c->part for the caller (tern__cuda_rope_kv_parts), 0 when y
 * was written directly */
int tern__cuda_qg4_staged(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, int k, int n, int mode, int run,
                          int *parts);
/* fused.cu: rope_kv_write over q|k|v summed from S slices of the batch Q4 GEMM's partials (slice floats each: the q,
 * k, v blocks [n][out] back to back), q / k / v written: bitwise qg4_reduce + rope_kv_write; 0 when not served */
int tern__cuda_rope_kv_parts(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const float *part,
                             size_t slice, int S, float *q, float *k, float *v, int nh, const float *inv_freq,
                             float mscale);
void tern__cuda_qg4_init(tern__cuda *c);
/* qmma.cu: MLX Q bits 4/8 for n = 1..64 on tensor cores with the codes fed unconverted (bf16 mode with
 * TERN_CUDA_QMMA=1, also the f32 mode with =2); returns 1 when it handled the call, else 0 */
int tern__cuda_qmma(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int e);
void tern__cuda_qmma_init(tern__cuda *c); /* at open (from tern__cuda_gemv_init): shared-memory limits */

/* norm.cu (norm, rope, elementwise, embed) */
void tern__cuda_embed(tern__cuda *c, float *y, const int32_t *ids, int n, const tern__cuda_w *w, float scale);
/* norm.cu: read `bytes` from p through L2 on stream s, keeping nothing (lt_gemm.c lt_tune: each timed run from HBM) */
void tern__cuda_l2_evict(tern__cuda *c, cudaStream_t s, const void *p, size_t bytes);
void tern__cuda_rmsnorm(tern__cuda *c, float *y, const float *x, int rows, int d, const float *w, float eps);
void tern__cuda_rmsnorm_bf16(tern__cuda *c, float *y, void *yb, void *yl, const float *x, int rows, int d, const float *w,
                             float eps); /* y = rmsnorm(x)·w, yb = bf16(y), and (yl != NULL) yl = bf16(y - yb) */
/* xo = (x + rmsnorm(h)·hw)·(s ? s[0] : 1), then y = rmsnorm(xo)·nw, yb = bf16(y), yl (!= NULL) the pair's low half:
 * one launch, bitwise rmsnorm_add (out of place) + rmsnorm_bf16 */
void tern__cuda_rmsnorm_res_bf16(tern__cuda *c, float *xo, const float *x, const float *h, const float *hw,
                                 const float *s, float *y, void *yb, void *yl, int rows, int d, const float *nw,
                                 float eps);
/* rmsnorm_bf16 (res NULL) or rmsnorm_res_bf16 (x' to res->x_out) with yb in the batch Q4 GEMM's staged order
 * (qgemm_q4_wg.cu q4w_stage_x's bytes of y; d a multiple of 128), no pair */
void tern__cuda_rmsnorm_q4s(tern__cuda *c, float *y, void *yb, const float *x, int rows, int d, const float *w,
                            float eps, const tern_norm_res *res);
/* xo = (x + rmsnorm(h)·hw)·(s ? s[0] : 1) and yb = bf16(xo): rmsnorm_add's bits, out of place, with the staged x of the
 * GEMM that reads xo (ops.h ple_block) */
void tern__cuda_rmsnorm_add_bf16(tern__cuda *c, float *xo, const float *x, const float *h, const float *hw,
                                 const float *s, void *yb, int rows, int d, float eps);
void tern__cuda_rmsnorm_n(tern__cuda *c, int k, float *const *y, const float *const *x, const int *rows, int d,
                          const float *const *w, float eps); /* k <= 3 tensors, one launch */
void tern__cuda_rmsnorm_add(tern__cuda *c, float *y, const float *x, int rows, int d, const float *w, float eps,
                            const float *s);
/* norm.cu: ops.h rmsnorm_add2 (h += rmsnorm(h2)·w2, then x = (x + rmsnorm(h)·w)·s, one launch; bitwise the two) */
void tern__cuda_rmsnorm_add2(tern__cuda *c, float *x, float *h, const float *h2, int rows, int d, const float *w,
                             const float *w2, float eps, const float *s);
void tern__cuda_rope(tern__cuda *c, float *x, int n, int nh, int d, const int32_t *pos, const float *inv_freq,
                     float mscale);
enum { TERN__EW_ADD, TERN__EW_MUL, TERN__EW_SCALE, TERN__EW_SCALE_DEV, TERN__EW_GELU, TERN__EW_SILU,
       TERN__EW_SOFTCAP };
void tern__cuda_ew(tern__cuda *c, int op, float *y, const float *a, const float *b, float s, size_t n);
/* y[r][j] = act(a[r][j])·v[r·ldv + j] (op TERN__EW_GELU / _SILU: gelu_tanh_mul's / silu_mul's element) and yb = bf16(y)
 * ([n][w]; ops.h ple_block) */
void tern__cuda_act_mul_bf16(tern__cuda *c, int op, float *y, const float *a, const float *v, long ldv, void *yb, int n,
                             int w);
void tern__cuda_add_bias(tern__cuda *c, float *y, const float *bias, int n, int d);
void tern__cuda_copy_cols(tern__cuda *c, float *dst, const float *src, int n, int w, int ss, int off);

/* attention.cu */
void tern__cuda_kv_write(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const float *k,
                         const float *v);
void tern__cuda_attn_init(tern__cuda *c); /* at open: shared-memory limit */
/* split-K planning and merge shared by the attention kernels (attention.cu) */
void tern__cuda_attn_plan(tern__cuda *c, const tern_rows *rows, const tern_kv_layer *kv, int n, int nh, int d, int T,
                          int qvmax, int HB, int hsplit, int span, int *R_out, int *splits_out);
#define TERN_CUDA_MERGE_MAX 128 /* splits tern__cuda_attn_merge takes: every caller caps its split count at or below it */
void tern__cuda_attn_merge(tern__cuda *c, float *out, int nrow, int d, int splits, const char *what);
int tern__cuda_split_count(const tern__cuda *c, long blocks, int full, int want, long keys, long min_keys, int cap,
                           int n, int nh, int d);
int tern__cuda_attn_splits(const tern__cuda *c, long blocks, long keys, int T, int n, int nh, int d);
long tern__cuda_attn_max_keys(const tern__cuda *c, const tern_rows *rows, const tern_kv_layer *kv);
void tern__cuda_attention(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                          const tern_kv_layer *kv, float scale, float softcap);
/* the prefill run split: runs of one slot to attn_prefill.cu's flash kernel, the other rows to `rest` */
typedef void (*tern__cuda_attn_fn)(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                                   const tern_kv_layer *kv, float scale, float softcap);
void tern__cuda_attn_runs(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                          const tern_kv_layer *kv, float scale, float softcap, tern__cuda_attn_fn rest);
/* attn_decode.cu: decode rows without spans over f32 pages, or (_q) BF16/F16 pages; 0 when the
 * shape is not served there. tern__cuda_attn_is_decode: the rows of this call are decode rows (a
 * recorded step, or at most two rows per sequence) */
int tern__cuda_attn_decode(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                           const tern_kv_layer *kv, float scale, float softcap);
int tern__cuda_attn_decode_q(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                             const tern_kv_layer *kv, float scale, float softcap);
void tern__cuda_attn_decode_init(tern__cuda *c);
int tern__cuda_attn_is_decode(const tern__cuda *c, const tern_rows *rows);
/* the batch decode attention with rope_kv_rows folded in (attn_decode_tc.cu's ROPE instances): q|k|v unroped in the
 * rows of src (ld floats each), the cache written for the rows' positions as rope_kv_rows writes it, then the
 * attention into out (bf16 into gemm_scratch under attention_o). Served where the plain launch would take the unsplit
 * tensor-core kernel and the rows are distinct sequences: 1 when it ran, 0 when not (nothing launched) */
extern int tern__cuda_qkv_att; /* cuda_backend.c: TERN_CUDA_QKV_ATT, the op norm_qkv_attention_o (-1 until read) */
int tern__cuda_attn_decode_rope(tern__cuda *c, float *out, const tern_rows *rows, int nh, const tern_kv_layer *kv,
                                float scale, float softcap, const float *src, int ld, const float *inv_freq, float mscale);

/* fused decode ops (gemv.cu, fused.cu): return 1 when done, 0 when the caller must run the
 * separate ops (ops.h: matmul_n, matmul_glu, matmul_add, rope_kv_write) */
int tern__cuda_matmul_n(tern__cuda *c, int k, float *const *y, const float *x, int n, const tern__cuda_w *const *w);
int tern__cuda_matmul_glu(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *gate,
                          const tern__cuda_w *up, int act);
int tern__cuda_matmul_add(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w);
/* ops.h norm_matmul: xn = rmsnorm(x)·nw, then matmul_n (mode G1_PLAIN; k = 1: the plain matmul) or
 * matmul_glu (G1_SILU / G1_GELU, k = 2) on xn, in one gemv1 launch (gemv1.cu) */
int tern__cuda_gemm_norm(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, int n, int k,
                         float *const *y, const tern__cuda_w *const *w, int mode,
                         const tern_norm_res *res); /* gemm.c: the same for n > 1 (res: TERN_CUDA_NORM_RES_N=1 only) */
int tern__cuda_norm_matmul(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, int n, int k,
                           float *const *y, const tern__cuda_w *const *w, int mode, const tern_norm_res *res);
int tern__cuda_matmul_act_mul(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int act,
                              const float *v, const tern_norm_res *res, float eps); /* gemv1.cu: ops.h matmul_act_mul */
int tern__cuda_norm_rope_kv_write(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, float *q,
                                  float *k, float *v, int nh, const float *inv_freq, float mscale, const float *qw,
                                  const float *kw, float eps); /* fused.cu: head norms + rope_kv_write */
/* fused.cu: the same over q|k|v read from one GEMM's rows (ld a row; + the element lo on for the kinds in lo_mask:
 * 1 q, 2 k, 4 v; v_from_k: rows of q|k, v = the raw k), written to q, k, v; 0 = not served, nothing written */
int tern__cuda_nrk_rows(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const float *src, long ld,
                        long lo, int lo_mask, int v_from_k, float *q, float *k, float *v, int nh, const float *inv_freq,
                        float mscale, const float *qw, const float *kw, float eps);
/* gemm.c: ops.h ple_block for 9..128 rows in the plain bf16 mode (TERN_CUDA_PLE_N); 0 = not served */
int tern__cuda_ple_block(tern__cuda *c, float *y, float *pg, const float *x, int n, const tern__cuda_w *wg,
                         const tern__cuda_w *wp, int act, const float *v, long ldv, const tern_norm_res *res, float eps);
/* gemm.c: ops.h norm_qkv_norm_rope_kv for many rows (joined q|k|v or q|k with w[2] NULL, one GEMM, nrk_rows); 0 = not
 * served */
int tern__cuda_gemm_qkv_nrk(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, float *const *y,
                            const tern__cuda_w *const *w, const tern_kv_layer *kv, const tern_rows *rows, int nh,
                            const float *inv_freq, float mscale, const float *qw, const float *kw,
                            const tern_norm_res *res);
/* gemv1.cu: ops.h norm_qkv_rope_kv for one row (BF16 / F16 weights on gemv1, Q4 on gemv_mma; TERN_CUDA_QKV_ROPE); 0 = not served */
int tern__cuda_norm_qkv_rope_kv(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, float *const *y,
                                const tern__cuda_w *const *w, const tern_kv_layer *kv, const tern_rows *rows, int nh,
                                const float *inv_freq, float mscale);
int tern__cuda_rope_kv_write(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, float *q, float *k,
                             const float *v, int nh, const int32_t *pos, const float *inv_freq, float mscale);
/* 1 when [p, p + bytes) meets gemm_scratch (p NULL: 0) — a kernel that writes the scratch must not read such rows */
static inline int tern__cuda_in_scratch(const tern__cuda *c, const void *p, size_t bytes) {
    const uint8_t *s = (const uint8_t *)c->gemm_scratch, *q = (const uint8_t *)p;
    return q && q < s + c->gemm_scratch_bytes && q + bytes > s;
}
/* the KV pages the rope + cache-store kernels serve (rope_kv_write and the launches that fold it in): F32 / BF16 / F16,
 * K and V of one kind, not latent, an even head dim */
static inline int tern__cuda_rope_pages(const tern_kv_layer *kv) {
    const int kind = kv->kf.kind;
    return (kind == TERN_KV_F32 || kind == TERN_KV_BF16 || kind == TERN_KV_F16) && kv->vf.kind == kind && !kv->latent &&
           kv->head_dim % 2 == 0;
}

/* k / d = (umulhi(k, mul) + k) >> shift for every 0 <= k < 2^31 (mul = 1 for powers of two; checked against the
 * division for d 1..5000): the KV block size as a multiply and a shift, so that kernels divide by no runtime value */
static inline void tern__cuda_divisor(int d, unsigned *mul, int *shift) {
    int l = 0;
    if (d < 1) d = 1;
    while ((1 << l) < d) l++;
    *shift = l;
    *mul = (unsigned)(((1ull << 32) * ((1ull << l) - (unsigned long long)d)) / (unsigned long long)d + 1);
}

/* The K split of a split-K grid by waves: `base` tiles, `nk` K steps, `slots` blocks resident at once (occupancy ×
 * SMs); among 1..smax slices (each walking ceil(nk / S) steps, S itself rounded to what those steps give) the one
 * with the fewest waves × (steps a block + c0), c0 a block's fixed cost in steps (prologue, epilogue); ties to fewer
 * slices (fewer partials). The fill rules before it (split until the grid covers the slots once or twice) leave a
 * second, nearly empty wave where the slices overshoot: gemma4-e4b's down projection at 64 rows took 280 blocks for
 * 264 slots, its precise q / k (qgemm.cu, one block an SM) 160 for 132 (ncu, NOTES (cj)) */
static inline int tern__cuda_split_waves(long base, long slots, int nk, int smax, int c0) {
    int best = 1;
    long best_cost = -1;
    if (base < 1) base = 1;
    if (slots < 1) slots = 1;
    for (int s = 1; s <= smax && s <= nk; s++) {
        const int per = (nk + s - 1) / s, S = (nk + per - 1) / per;
        if (S != s) continue; /* the same steps a block as a smaller s: counted there */
        const long waves = (base * S + slots - 1) / slots, cost = waves * (per + c0);
        if (best_cost < 0 || cost < best_cost) best = S, best_cost = cost;
    }
    return best;
}

/* qgemm_q4.cu's K split of a batch Q4 launch (host planning, unit-tested without a GPU): `base` row × column tiles,
 * `nt` fragments a column tile (2: 5..16 rows on the mma.sync kernel, 3 blocks an SM; 4 / 8: the wgmma tiles, 2 an
 * SM), `nb` column tiles, `nkt` K tiles, `wgp` the direct gate|up pair (one block a 64-row tile, the whole K when that
 * fills the SMs), `slice` partial floats a slice, `nsm` SMs; the switches: `mul` blocks an SM aimed at (0: the
 * occupancy), `wave` (TERN_CUDA_QG4_WAVE: 0 ceiling, 1 rounded down to one wave, 2 that at 17..32 rows, 3 by waves
 * (tern__cuda_split_waves) every launch, 4 that from 17 rows), `st` the ring's stages, `mint` the fewest K tiles a block
 * walks (0: 2 at one wgmma column tile, else `st`). Returns the slices before the per-block rounding (the caller's
 * kt_per = ceil(nkt / S)); one where the partials would not fit `part` floats and fewer slices do not either */
static inline int tern__cuda_qg4_split(long base, int nt, int nb, int nkt, size_t slice, int wgp, int nsm, int mul,
                                       int wave, int st, int mint, size_t part) {
    const int minb = nt == 2 ? 3 : 2; /* blocks an SM */
    const long target = (long)(wgp ? 1 : mul > 0 ? mul : minb) * nsm;
    const int down = wave == 1 || (wave == 2 && nt == 4);
    if (base < 1) base = 1;
    int S = base < target ? (int)(down ? target / base : (target + base - 1) / base) : 1;
    const int mset = mint > 0 ? mint : nb == 1 && nt >= 4 ? 2 : st;
    const int mn = mset < st ? mset : st;
    if (S > nkt / mn) S = nkt / mn;
    if (S < 1) S = 1;
    while (S > 1 && (size_t)S * slice > part) S--;
    if ((wave == 3 || (wave == 4 && nt >= 4)) && !wgp) S = tern__cuda_split_waves(base, (long)minb * nsm, nkt, S, 1);
    return S;
}

/* prof.c: the vtable a backend gets at open — `base` itself, or (TERN_CUDA_FUSED=0) a copy
 * without the fused ops, or (TERN_CUDA_PROFILE=1) a copy whose ops time themselves with
 * events in eager mode (no graphs); the per-op table is printed by tern__cuda_prof_report at
 * close. */
const tern_backend_vt *tern__cuda_vt_select(const tern_backend_vt *base);
void tern__cuda_prof_report(void);

/* moe.cu: ids of routed pairs sent through an expert slot map (tensor.h mat_map): returns a device
 * array [np] of map[idx[p]] (c->moe_idx, grown on demand), or NULL when it cannot allocate. */
const int32_t *tern__cuda_moe_remap(tern__cuda *c, const int32_t *idx, const int32_t *map, int np);
/* moe.cu */
void tern__cuda_route_topk(tern__cuda *c, int32_t *idx, float *wts, const float *logits, int n, int E, int k,
                           int mode, const float *per_expert_scale);
/* moe.cu: ops.h norm_route_topk for one row in one launch (BF16 / F32 / Q4 / Q8 routers, E <= 256); 0 = declined */
int tern__cuda_norm_route_topk(tern__cuda *c, int n, int d, float *const *y, const float *const *x,
                               const float *const *w, float eps, const tern__cuda_w *r, float *logits, int32_t *idx,
                               float *wts, int E, int k, int mode, const float *pes);
void tern__cuda_moe_mlp(tern__cuda *c, float *y, const float *x, int n, int H, const int32_t *idx,
                        const float *wts, int k, const tern__cuda_w *gate, const tern__cuda_w *up,
                        const tern__cuda_w *down, int act, float *scratch);
/* gemv.cu: the gate/up/act step of moe_mlp in one launch: h[p][0:I] (row p at h + p*hstride) =
 * act(gate_e · x_t) * (up_e · x_t) for the pairs p = t*k + j, e = idx[p], t < n (e out of range:
 * act(0)*0); bitwise what gemv_expert (gate, up) + moe_act give. Returns 1 when it ran, 0 when the
 * format or shape is not served (gate/up formats differ, rows not chunk-aligned, in > 16384). */
int tern__cuda_moe_gateup(tern__cuda *c, float *h, int hstride, const float *x, int n, const int32_t *idx, int k,
                          const tern__cuda_w *gate, const tern__cuda_w *up, int act);
/* moe.cu: calls of moe_mlp that took tern__cuda_moe_gateup (TERN_CUDA_MOE_FUSED=0: never) */
extern unsigned long long tern__cuda_moe_fused_calls;
extern int tern__cuda_moe_fused_on, tern__cuda_moe_rt; /* moe.cu / gemv1.cu switches, -1 = from the environment */
/* moe_mma.cu: moe_mlp's pair path for MLX Q4 experts (groups 32/64/128, BF16/F16 scales) on tensor
 * cores: gate/up/act into scratch ([n·k][2I], h in the first I of each pair's row), then down and the
 * router-weighted sum into y, expert ids read on the device; round_h: h rounded to bf16 before down
 * (the plain bf16 mode). Returns 1 when it ran, 0 when not served (format, shape, capacity) or
 * TERN_CUDA_MOE_MMA=0 (tern__cuda_moe_mma_on: -1 = from the environment; tests set it) */
int tern__cuda_moe_mma(tern__cuda *c, float *y, const float *x, int n, const int32_t *idx, const float *wts, int k,
                       const tern__cuda_w *gate, const tern__cuda_w *up, const tern__cuda_w *down, int act,
                       float *scratch, int round_h);
extern unsigned long long tern__cuda_moe_mma_calls;
extern int tern__cuda_moe_mma_on;
/* moe.cu: h[p][0:I] = act(h[p][0:I]) * h[p][I:2I] for rows p < np of a [np][2I] scratch */
void tern__cuda_moe_act(tern__cuda *c, float *h, int np, int I, int act);
/* moe_gemm.cu: moe_mlp through the sorted, grouped expert GEMM (bf16 mode, many pairs; uses
 * gemm_scratch); returns 1 when it handled the call, 0 when the caller must take the pair path */
int tern__cuda_moe_grouped(tern__cuda *c, float *y, const float *x, int n, int H, const int32_t *idx,
                           const float *wts, int k, const tern__cuda_w *gate, const tern__cuda_w *up,
                           const tern__cuda_w *down, int act, float *scratch);
/* moe_blas.cu: a prefill chunk's expert MLPs as cuBLAS grouped GEMMs after moe_gemm.cu's sort (plain bf16 mode,
 * BF16 experts, large chunks; TERN_MOE_BLAS); _ok says whether it takes np pairs, _close frees its handle */
int tern__cuda_moe_blas_ok(const tern__cuda *c, const tern__cuda_w *gate, const tern__cuda_w *up,
                           const tern__cuda_w *down, int np);
int tern__cuda_moe_blas(tern__cuda *c, float *y, const float *x, int m, int k, int H, const int *off,
                        const int32_t *perm, const int32_t *ipos, const float *wts, const tern__cuda_w *gate,
                        const tern__cuda_w *up, const tern__cuda_w *down, int act, uint8_t *work, size_t work_bytes,
                        float *scratch);
void tern__cuda_moe_blas_close(tern__cuda *c);
/* moe_gemm.cu: y[r] = Σ_j wts[r·k + j] · o[ipos[r·k + j]] (routed pairs, j in order) for m tokens; o [m·k][H] f32, or
 * bf16 when o_bf16 */
void tern__cuda_moe_combine(tern__cuda *c, float *y, const void *o, int o_bf16, const int32_t *ipos, const float *wts,
                            int m, int k, int H);

/* sample.cu: ops.h vt->sample (one block per row; no scratch) */
void tern__cuda_sample(tern__cuda *c, int32_t *ids, float *logits, int n, int V, const tern_sample_row *rows,
                       const tern_sample_pair *pairs);

#ifdef __cplusplus
}
#endif
#endif

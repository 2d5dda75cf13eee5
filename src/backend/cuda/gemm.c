/*
 * gemm.c — prefill matmul (many rows) through cuBLASLt.
 *
 * y[n, out] = x[n, in] · W[out, in]ᵀ. In cuBLASLt's column-major terms this is
 * Y(out × n, ld out) = Wᵀ · X with A = W stored (in × out, ld in) transposed and
 * B = X stored (in × n, ld in): no copies of x or y are needed.
 *
 * Paths:
 *   - F32 weights: f32 GEMM, compute CUBLAS_COMPUTE_32F_PEDANTIC (exact f32, never TF32).
 *   - f32 mode, other weights: the weight is expanded to f32 in row chunks in scratch and each
 *     chunk multiplied (pedantic f32) into the matching columns of y — exact f32 products.
 *   - bf16 mode: split-bf16 on tensor cores with f32 accumulation. x = xh + xl (xh = bf16(x),
 *     xl = bf16(x - xh)), so x is carried to 2^-16 relative instead of 2^-8:
 *       BF16 weights (exact in bf16):  y = W·xh + W·xl                      (2 GEMMs)
 *       F16/Q weights, expanded in chunks to W = Wh + Wl the same way:
 *                                      y = Wh·xh + Wh·xl + Wl·xh            (3 GEMMs)
 *     (BF16 weights at n <= 256: one GEMM over the 2n columns [xh | xl], halves summed after)
 *     Bound: |y - y_exact| <= ~(2^-15 + in·2^-24)·Σ|w||x| per output, i.e. f32-like (observed
 *     rel L2 ~1e-6 on random data) at 1/2..1/3 of the plain bf16 GEMM's rate.
 *     Why not plain bf16 (x rounded to 2^-8, as this path did before): Gemma 4's attention runs
 *     at scale 1 on RMS-normalised q and k, so attention logits reach tens; a 2^-8 relative
 *     error there moves softmax weights by several percent, and the fixtures drifted by
 *     0.03-0.3 rel L2 (and rows > 8, which took this path, disagreed with rows <= 8 taking the
 *     exact GEMV). The split keeps tensor-core speed and brings both effects down to f32 noise.
 * Long bf16-mode prefills run in row chunks whose bf16 activation pair fits the scratch (below).
 * Returns an error (and the caller falls back to the GEMV kernels) when cuBLASLt finds no
 * algorithm or the scratch is too small for even one chunk.
 * The fused decode ops for many rows (ops.h matmul_n / matmul_glu / matmul_add, n > 8, plain bf16
 * mode, BF16 weights) are served here too (the end of the file). Every cuBLASLt call goes through
 * lt_gemm.c (descriptors, the algorithm a shape runs, its cache).
 * In the bf16 mode most batched calls never get here: qgemm.cu (tried first by the dispatcher
 * in gemv.cu) multiplies BF16/F16/Q weights in their stored format on tensor cores with the same
 * split-bf16 contract, up to the row counts where this path's cuBLASLt GEMMs win (its header).
 */
#include "backend/cuda/gemm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One GEMM: y (m x n, ld ldy) = Wᵀ·X with W (k x m, ld k) and X (k x n, ld k). */
static tern_status lt_gemm(tern__cuda *c, float *y, int ldy, const void *w, const void *x, int m, int n, int k,
                           cudaDataType_t ab, cublasComputeType_t ct, float beta) {
    return tern__cuda_lt_gemm(c, y, ldy, 0, w, 0, x, k, 0, m, n, k, 0, ab, ct, beta);
}

/* the merged split GEMM (BF16 weights, bf16 mode) up to this many rows; TERN_GEMM_MERGE=N, 0 off */
int tern__cuda_gemm_merge_max(void) {
    static int v = -1;
    if (v < 0) v = tern__cuda_env_int("TERN_GEMM_MERGE", 256);
    return v;
}

/* Which bf16-mode GEMMs split x: every one under `--compute bf16x2` (c->bf16_x2: f32-accurate); under
 * `--compute bf16` only the weights flagged precise (tern_tensor.precise: Gemma 4 / GLM q/k, MLA,
 * routers), the rest run as plain bf16 GEMMs, x rounded to 2^-8 like every other engine's bf16
 * mode (half the MMA work for BF16 weights, a third for dequantized ones). The GEMVs (few rows) keep
 * f32 x in both modes. */
int tern__cuda_bf16_split = -1; /* -1: the backend's mode; 1 all, 0 precise only (tests set it) */
int tern__cuda_bf16_split_all(const tern__cuda *c) {
    return tern__cuda_bf16_split >= 0 ? tern__cuda_bf16_split : c->bf16_x2;
}

static tern_status gemm_rows(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int e) {
    const int in = w->in, out = w->out;
    const uint8_t *mat = (const uint8_t *)w->data + (size_t)e * w->mat_bytes;
    const cublasComputeType_t exact = CUBLAS_COMPUTE_32F_PEDANTIC, tc = CUBLAS_COMPUTE_32F;
    if (w->dtype == TERN_DT_F32) return lt_gemm(c, y, out, mat, x, out, n, in, CUDA_R_32F, exact, 0.0f);
    const int bf = c->compute == TERN_COMPUTE_BF16;
    uint8_t *scr = (uint8_t *)c->gemm_scratch;
    size_t avail = c->gemm_scratch_bytes;
    const void *xh = x, *xl = NULL;
    const int plain = bf && !w->precise && !tern__cuda_bf16_split_all(c);
    if (plain) { /* --compute bf16: x rounded to bf16 once, W in bf16, one GEMM (f32 accumulation) */
        const size_t xbytes = ((size_t)n * in * 2 + 255) & ~(size_t)255;
        if (xbytes >= avail / 2) return TERN_ENOMEM;
        tern__cuda_f32_to_bf16(c, scr, NULL, x, (size_t)n * in);
        if (w->dtype == TERN_DT_BF16) return lt_gemm(c, y, out, mat, scr, out, n, in, CUDA_R_16BF, tc, 0.0f);
        xh = scr;
        scr += xbytes;
        avail -= xbytes;
    } else if (bf) { /* activations to a bf16 pair first */
        /* BF16 weights, few rows: xl right behind xh, so [xh | xl] is one B of 2n columns and the
         * weight is read once (the two-GEMM form reads it twice: at n = 64 the GEMMs are bound by
         * the weight bytes); C = [W·xh | W·xl] goes to scratch and y = the sum of its halves */
        const size_t cbytes = (size_t)2 * n * out * sizeof(float);
        const int merge = w->dtype == TERN_DT_BF16 && n <= tern__cuda_gemm_merge_max() && ((size_t)n * in) % 8 == 0 &&
                          2 * ((size_t)n * in * 2) + cbytes + 512 <= avail;
        size_t xbytes = merge ? (size_t)n * in * 2 : ((size_t)n * in * 2 + 255) & ~(size_t)255;
        if (2 * xbytes >= avail / 2) return TERN_ENOMEM;
        tern__cuda_f32_to_bf16(c, scr, scr + xbytes, x, (size_t)n * in);
        xh = scr;
        xl = scr + xbytes;
        scr += (2 * xbytes + 255) & ~(size_t)255;
        avail -= (2 * xbytes + 255) & ~(size_t)255;
        if (merge) {
            float *cs = (float *)scr;
            tern_status st = lt_gemm(c, cs, out, mat, xh, out, 2 * n, in, CUDA_R_16BF, tc, 0.0f);
            if (!st) tern__cuda_ew(c, TERN__EW_ADD, y, cs, cs + (size_t)n * out, 0, (size_t)n * out);
            return st;
        }
        if (w->dtype == TERN_DT_BF16) {
            tern_status st = lt_gemm(c, y, out, mat, xh, out, n, in, CUDA_R_16BF, tc, 0.0f);
            return st ? st : lt_gemm(c, y, out, mat, xl, out, n, in, CUDA_R_16BF, tc, 1.0f);
        }
    }
    /* expanded weight rows: f32 (4 bytes per element), a bf16 pair (2 + 2) or plain bf16 (2) */
    size_t rows = (avail - 512) / ((size_t)in * (plain ? 2 : 4));
    if (rows < 64) return TERN_ENOMEM;
    if (rows > (size_t)out) rows = (size_t)out;
    rows &= ~(size_t)15; /* keep chunks multiples of 16 rows for aligned column offsets */
    if (rows == 0) rows = (size_t)out;
    for (int r0 = 0; r0 < out; r0 += (int)rows) {
        const int m = out - r0 < (int)rows ? out - r0 : (int)rows;
        tern__cuda_dequant(c, scr, plain ? 1 : bf ? 2 : 0, w, e, r0, m);
        tern_status st;
        if (plain) {
            st = lt_gemm(c, y + r0, out, scr, xh, m, n, in, CUDA_R_16BF, tc, 0.0f);
        } else if (bf) {
            const uint8_t *wh = scr, *wl = scr + (((size_t)m * in * 2 + 255) & ~(size_t)255);
            st = lt_gemm(c, y + r0, out, wh, xh, m, n, in, CUDA_R_16BF, tc, 0.0f);
            if (!st) st = lt_gemm(c, y + r0, out, wh, xl, m, n, in, CUDA_R_16BF, tc, 1.0f);
            if (!st) st = lt_gemm(c, y + r0, out, wl, xh, m, n, in, CUDA_R_16BF, tc, 1.0f);
        } else {
            st = lt_gemm(c, y + r0, out, scr, x, m, n, in, CUDA_R_32F, exact, 0.0f);
        }
        if (st != TERN_OK) return st; /* fallback redoes every column: harmless */
    }
    return TERN_OK;
}

/* The bf16 mode stages the activations as a bf16 pair (n·in·4 bytes) in less than half of the
 * scratch: long prefills (GLM-5's o_proj from 2048 rows, in-6144 projections from 5462) run in row
 * chunks that fit, each a complete GEMM over the weight (re-expanded per chunk; >= 2000 rows each
 * for in <= 16384). Before, they fell back to the 16-row GEMV. */
extern int tern__cuda_qgemm_max_n_bf16; /* qgemm.cu */

/* 1 when n rows times w are the plain bf16 mode's business past qgemm.cu (BF16 weight not flagged
 * precise, more rows than qgemm takes): cuBLASLt, or sgemm.cu up to its row limit */
static int plain_rows(const tern__cuda *c, const tern__cuda_w *w, int n) {
    return c->compute == TERN_COMPUTE_BF16 && !tern__cuda_bf16_split_all(c) && w->dtype == TERN_DT_BF16 &&
           !w->precise && n > 8 && n > tern__cuda_qgemm_max_n_bf16 && w->in > 0 && w->in % 8 == 0 &&
           w->out % 8 == 0 && ((uintptr_t)w->data & 255) == 0;
}

static size_t stage_x(tern__cuda *c, const float *x, int n, int in, size_t extra);

/* 1 when tern__cuda_gemm hands n rows times w to sgemm.cu (TERN_CUDA_SGEMM=2: one matrix up to 64 rows) */
static int gemm_skinny(const tern__cuda *c, const tern__cuda_w *w, int n) {
    return w->nmat <= 1 && tern__cuda_sgemm_level() >= 2 && plain_rows(c, w, n) && n <= 64;
}
/* rows of one tern__cuda_gemm chunk (one gemm_rows call) for `in` inputs; 0: not even one */
static size_t gemm_chunk_rows(const tern__cuda *c, int in) {
    size_t rows = (c->gemm_scratch_bytes / 2 - 1024) / ((size_t)in * 4);
    if (rows > 16) rows &= ~(size_t)15;
    return rows;
}

tern_status tern__cuda_gemm(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int e) {
    if (c->compute != TERN_COMPUTE_BF16 || w->dtype == TERN_DT_F32 || n <= 0 || w->in <= 0)
        return gemm_rows(c, y, x, n, w, e);
    if (e == 0 && gemm_skinny(c, w, n) && stage_x(c, x, n, w->in, 0) &&
        tern__cuda_sgemm(c, 1, &y, c->gemm_scratch, n, &w, G1_PLAIN))
        return TERN_OK; /* skinny: sgemm.cu (TERN_CUDA_SGEMM=2, up to 64 rows) */
    const size_t rows = gemm_chunk_rows(c, w->in);
    if (rows < 1) return TERN_ENOMEM;
    for (int r0 = 0; r0 < n; r0 += (int)rows) {
        const int m = n - r0 < (int)rows ? n - r0 : (int)rows;
        tern_status st = gemm_rows(c, y + (size_t)r0 * w->out, x + (size_t)r0 * w->in, m, w, e);
        if (st != TERN_OK) return st;
    }
    return TERN_OK;
}

/* ---- the fused decode ops for n > 1 rows (ops.h matmul_n / matmul_glu / matmul_add) ----
 * Served in the plain bf16 mode for BF16 weights not flagged precise, above the row counts where
 * the separate matmuls also take cuBLASLt (qgemm.cu / the GEMV below them; refused there, so the
 * model runs the separate ops): x is rounded to bf16 once for the whole group, matrices of one shape
 * run as one strided-batched GEMM (gate|up, k|v: the batch stride is the distance between the two
 * weight allocations, and for k|v between the two outputs), SiLU/GELU·up is the elementwise kernel
 * of silu_mul / gelu_tanh_mul over the two halves, and y += W·x is the GEMM's own beta = 1.
 * Results: the same products with f32 accumulation as the separate GEMMs; bitwise equal only when
 * cuBLASLt runs the same algorithm (a batched or beta = 1 GEMM may pick another tile or K split),
 * so the contract for n > 1 here is the bf16 mode's bound (tests/gpu/cuda_ops_tests_batch.h prints
 * the difference: bitwise at its small shapes on the H200; at llama3-8b's shapes the batch-64 ids
 * digest changed, so there the algorithms differ). TERN_GEMM_FUSE=0 refuses every n > 1 call (the
 * separate ops run). */
static int fuse_on(void) {
    static int v = -1;
    if (v < 0) v = tern__cuda_env_int("TERN_GEMM_FUSE", 1) != 0;
    return v;
}

/* 1 when n rows times w take the plain bf16 cuBLASLt GEMM here */
static int plain_gemm_ok(const tern__cuda *c, const tern__cuda_w *w, int n) {
    return fuse_on() && plain_rows(c, w, n);
}

/* bytes (256-aligned) of x [n, in] in bf16 at the start of gemm_scratch when they fit with `extra`
 * bytes after them, else 0 */
static size_t staged_bytes(const tern__cuda *c, int n, int in, size_t extra) {
    const size_t xb = ((size_t)n * in * 2 + 255) & ~(size_t)255;
    return xb + extra > c->gemm_scratch_bytes ? 0 : xb;
}

/* x [n, in] rounded to bf16 at the start of gemm_scratch when it fits with `extra` bytes after it;
 * returns the bytes used (256-aligned) or 0 */
static size_t stage_x(tern__cuda *c, const float *x, int n, int in, size_t extra) {
    const size_t xb = staged_bytes(c, n, in, extra);
    if (xb) tern__cuda_f32_to_bf16(c, c->gemm_scratch, NULL, x, (size_t)n * in);
    return xb;
}

/* element distance q - p (in units of `es` bytes) when positive and a multiple of 16 elements, else 0 */
static long long gap_of(const void *p, const void *q, size_t es) {
    const long long d = (long long)((const char *)q - (const char *)p);
    return d > 0 && d % (long long)(16 * es) == 0 ? d / (long long)es : 0;
}

/* matrices w[0..k) for n rows take gemm_n_run here */
static int gemm_n_ok(const tern__cuda *c, int k, float *const *y, int n, const tern__cuda_w *const *w) {
    if (k < 1 || k > 3 || n <= 0) return 0;
    for (int i = 0; i < k; i++)
        if (!plain_gemm_ok(c, w[i], n) || w[i]->in != w[0]->in || ((uintptr_t)y[i] & 15)) return 0;
    return 1;
}

/* gate/up for n rows take gemm_glu_run here */
static int gemm_glu_ok(const tern__cuda *c, int n, const tern__cuda_w *gate, const tern__cuda_w *up, int act) {
    return n > 0 && plain_gemm_ok(c, gate, n) && plain_gemm_ok(c, up, n) && gate->out == up->out &&
           gate->in == up->in && (act == TERN_ACT_SILU || act == TERN_ACT_GELU_TANH);
}

/* bytes of gemm_scratch a glu call uses after the staged x */
static size_t glu_cbytes(int n, const tern__cuda_w *gate) { return (size_t)2 * n * gate->out * sizeof(float); }

static int gemm_n_run(tern__cuda *c, int k, float *const *y, int n, const tern__cuda_w *const *w);
static int gemm_glu_run(tern__cuda *c, float *y, int n, size_t xb, const tern__cuda_w *gate, const tern__cuda_w *up,
                        int act);

int tern__cuda_gemm_n(tern__cuda *c, int k, float *const *y, const float *x, int n, const tern__cuda_w *const *w) {
    if (!gemm_n_ok(c, k, y, n, w)) return 0;
    cudaSetDevice(c->device);
    if (!stage_x(c, x, n, w[0]->in, 0)) return 0;
    return gemm_n_run(c, k, y, n, w);
}

/* rows up to which q|k|v (2-3 matrices) try sgemm.cu before cuBLASLt: TERN_CUDA_SGEMM_ROWS (default 64, sgemm.cu's
 * own limit; written in session 26 for gpu_ab.sh section 39, where cuBLASLt's q GEMM + k|v batch timed 12.5 + 10.1 µs
 * at 64 rows against sgemm.cu's 24.3 of session 18) */
static int sgemm_rows(void) {
    static int v = -1;
    if (v < 0) v = tern__cuda_env_int("TERN_CUDA_SGEMM_ROWS", 64);
    return v;
}

/* the ops on x staged in bf16 at the start of gemm_scratch (stage_x, or the pre-norm's kernel) */
static int gemm_n_run(tern__cuda *c, int k, float *const *y, int n, const tern__cuda_w *const *w) {
    const int in = w[0]->in;
    const void *xb = c->gemm_scratch;
    if (n <= sgemm_rows() && tern__cuda_sgemm(c, k, y, xb, n, w, G1_PLAIN)) return 1; /* q|k|v in one launch */
    const cublasComputeType_t tc = CUBLAS_COMPUTE_32F;
    int done[3] = {0, 0, 0};
    for (int i = 0; i < k; i++) /* pairs of one shape with both distances positive: one batched GEMM */
        for (int j = i + 1; j < k && !done[i]; j++) {
            if (done[j] || w[j]->out != w[i]->out) continue;
            const long long sa = gap_of(w[i]->data, w[j]->data, 2), sc = gap_of(y[i], y[j], 4);
            if (!sa || !sc) continue;
            if (tern__cuda_lt_gemm(c, y[i], w[i]->out, sc, w[i]->data, sa, xb, in, 0, w[i]->out, n, in, 2,
                                   CUDA_R_16BF, tc, 0.0f) == TERN_OK)
                done[i] = done[j] = 1;
        }
    for (int i = 0; i < k; i++)
        if (!done[i] &&
            lt_gemm(c, y[i], w[i]->out, w[i]->data, xb, w[i]->out, n, in, CUDA_R_16BF, tc, 0.0f) != TERN_OK)
            return 0; /* the caller redoes every output with the separate ops */
    return 1;
}

int tern__cuda_gemm_glu(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *gate,
                        const tern__cuda_w *up, int act) {
    if (!gemm_glu_ok(c, n, gate, up, act)) return 0;
    cudaSetDevice(c->device);
    const size_t xb = stage_x(c, x, n, gate->in, glu_cbytes(n, gate));
    if (!xb) return 0;
    return gemm_glu_run(c, y, n, xb, gate, up, act);
}

/* gate and up on x staged in bf16 at the start of gemm_scratch: the lower-addressed weight's outputs at cs, the
 * other's `second` elements on (C of type cty, ld ldc) — one strided batch when the weights' distance allows it,
 * else two GEMMs. Returns -1 when a GEMM failed, else whether the gate is the lower one (its outputs at cs). */
static int gate_up_gemm(tern__cuda *c, void *cs, cudaDataType_t cty, int ldc, long long second, int n,
                        const tern__cuda_w *gate, const tern__cuda_w *up) {
    const int I = gate->out, in = gate->in, es = cty == CUDA_R_32F ? 4 : 2;
    const int gate_first = (const char *)gate->data < (const char *)up->data;
    const tern__cuda_w *w0 = gate_first ? gate : up, *w1 = gate_first ? up : gate;
    const long long sa = gap_of(w0->data, w1->data, 2);
    const void *xb = c->gemm_scratch;
    tern_status st;
    if (sa) {
        st = tern__cuda_lt_gemm_x(c, cs, cty, ldc, second, w0->data, 0, sa, xb, in, 0, I, n, in, 2, 0.0f);
    } else {
        st = tern__cuda_lt_gemm_x(c, cs, cty, ldc, 0, w0->data, 0, 0, xb, in, 0, I, n, in, 0, 0.0f);
        if (!st)
            st = tern__cuda_lt_gemm_x(c, (uint8_t *)cs + (size_t)second * es, cty, ldc, 0, w1->data, 0, 0, xb, in, 0,
                                      I, n, in, 0, 0.0f);
    }
    return st ? -1 : gate_first;
}

static int gemm_glu_run(tern__cuda *c, float *y, int n, size_t xb, const tern__cuda_w *gate, const tern__cuda_w *up,
                        int act) {
    const int I = gate->out;
    const tern__cuda_w *gu[2] = {gate, up};
    float *ys[2] = {y, y};
    if (tern__cuda_sgemm(c, 2, ys, c->gemm_scratch, n, gu, act == TERN_ACT_SILU ? G1_SILU : G1_GELU)) return 1;
    float *cs = (float *)((uint8_t *)c->gemm_scratch + xb); /* [2][n][I]: the lower-addressed weight first */
    const int gate_first = gate_up_gemm(c, cs, CUDA_R_32F, I, (long long)n * I, n, gate, up);
    if (gate_first < 0) return 0;
    const float *g = gate_first ? cs : cs + (size_t)n * I, *u = gate_first ? cs + (size_t)n * I : cs;
    tern__cuda_ew(c, act == TERN_ACT_SILU ? TERN__EW_SILU : TERN__EW_GELU, y, g, u, 0.0f, (size_t)n * I);
    return 1;
}

/* ---- the pre-norm of the many-row fused ops, with norm_matmul's residual prologue (res) ----
 * res != NULL: x' = (x + rmsnorm(h)·w)·s to res->x_out and the pre-norm of x' in one launch (norm.cu
 * rmsnorm_res_bf16: bitwise rmsnorm_add + rmsnorm_bf16), instead of the model's rmsnorm_add in place and then the
 * pre-norm: one launch and one read of the rows fewer, twice a Gemma 4 layer. Op test cuda_norm_gemm_res passes
 * (H200, session 24); gemma4-26b-a4b prefill moved by no more than noise (bench/NOTES.md (ak)), but batch decode
 * runs the two launches per layer beside each GEMM (ncu of gemma4-12b at 64 sequences, NOTES (cb)); since session 68
 * gemma4.c keeps the second residual buffer for batch steps (256 rows) too, so the adds fold in batch decode as well.
 * Default since session 69 (H100, gpu_ab.sh section 120, NOTES (cc): with SPLIT_MERGED, gemma4-12b bf16 at 64
 * sequences 4741 / 4731 → 4830 / 4763 dec tok/s, the same ids); TERN_CUDA_NORM_RES_N=0 off. */
int tern__cuda_norm_res_n = -1; /* -1 unread (TERN_CUDA_NORM_RES_N, default 1); tests set it */
static int res_n_on(void) {
    if (tern__cuda_norm_res_n < 0) tern__cuda_norm_res_n = tern__cuda_env_int("TERN_CUDA_NORM_RES_N", 1) != 0;
    return tern__cuda_norm_res_n;
}
static void norm_stage(tern__cuda *c, float *xn, void *xh, void *xl, const float *x, int n, int in, const float *nw,
                       float eps, const tern_norm_res *res) {
    if (res) tern__cuda_rmsnorm_res_bf16(c, res->x_out, x, res->h, res->w, res->s, xn, xh, xl, n, in, nw, eps);
    else tern__cuda_rmsnorm_bf16(c, xn, xh, xl, x, n, in, nw, eps);
}

/* ---- ops.h norm_mlp for many rows in the plain bf16 mode (BF16 gate / up / down not flagged precise) ----
 * The pre-norm writes xn and its bf16 copy, gate and up run as one strided batch (the two weights' distance;
 * else two GEMMs) whose outputs land in bf16 as rows [gate I | up I] (ldc 2I), moe_blas.cu's act kernel writes
 * h = bf16(act(g)·u), and down reads h as its B (beta 1 for add). The separate ops wrote the products [2][n][I]
 * and h in f32 and converted h again for down: gemma4-12b's 2048-row chunk moved ~0.63 GB a layer for that, here
 * ~0.25. Numerics: transformers' bf16 MLP (the projections' outputs rounded to bf16 before the activation; the
 * separate ops keep them in f32): within the bf16 mode's bound, not bitwise. Taken from 32 rows (TERN_CUDA_MLP_MIN=N:
 * from N; fewer rows run gate|up in f32 + the act kernel + down's f32 → bf16 staging, or sgemm.cu) when the staged x,
 * the products and h fit gemm_scratch; TERN_CUDA_MLP_BF16=0 never. H200, session 26 (bench/NOTES.md (am)), llama3-8b
 * bf16 batch decode 128 + 128, from 65 → 9 rows: 64 sequences 10799 / 10808 → 11000 / 10826 dec tok/s, 32: 5787 /
 * 5773 → 5861 / 5821, 16: 3088 / 3103 → 3072 / 3096 (a tie; hence 32). */
int tern__cuda_gemm_mlp(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, int n, float *y, int add,
                        const tern__cuda_w *const *w, int act, const tern_norm_res *res) {
    static int on = -1, from = -1;
    if (on < 0) on = tern__cuda_env_int("TERN_CUDA_MLP_BF16", 1) != 0;
    if (from < 0) from = tern__cuda_env_int("TERN_CUDA_MLP_MIN", 32);
    const tern__cuda_w *gate = w[0], *up = w[1], *down = w[2];
    if (!on || n < from || xn == x || (res && (!res_n_on() || add || res->h2)) || !gemm_glu_ok(c, n, gate, up, act) || !plain_gemm_ok(c, down, n) ||
        down->in != gate->out || ((uintptr_t)y & 15))
        return 0;
    const int I = gate->out, in = gate->in, out = down->out;
    const size_t gub = ((size_t)n * 2 * I * 2 + 255) & ~(size_t)255, hbytes = (size_t)n * I * 2;
    const size_t xb = staged_bytes(c, n, in, gub + hbytes);
    if (!xb) return 0;
    cudaSetDevice(c->device);
    uint8_t *scr = (uint8_t *)c->gemm_scratch, *gu = scr + xb, *h = gu + gub;
    norm_stage(c, xn, scr, NULL, x, n, in, nw, eps, res);
    /* rows [lower weight's I | the other's I] */
    const int gate_first = gate_up_gemm(c, gu, CUDA_R_16BF, 2 * I, I, n, gate, up);
    if (gate_first < 0) return 0; /* the caller redoes it with the separate ops (xn is rmsnorm's already) */
    tern__cuda_glu_bf16(c, h, gu, n, I, act, gate_first ? 0 : I);
    return tern__cuda_lt_gemm_x(c, y, CUDA_R_32F, out, 0, down->data, 0, 0, h, I, 0, out, n, I, 0, add ? 1.0f : 0.0f) ==
           TERN_OK;
}

/* ops.h norm_matmul for n > 1 rows on this path (q|k|v: mode G1_PLAIN, k = 3 or 2; gate|up: G1_SILU /
 * G1_GELU): one kernel writes xn = rmsnorm(x)·nw and the bf16 copy stage_x would make of it, then the
 * same GEMMs — bitwise rmsnorm + the fused op. From NORM_GEMM_ROWS rows on: H200, session 11, llama3-8b
 * batch decode (build/concurrency, 128+128): 64 sequences 8743 / 8529 → 8895 / 8843 tok/s, but 16
 * sequences 2784 / 2780 → 2757 / 2746, so fewer rows keep the two launches. TERN_CUDA_NORM_GEMM=0 never,
 * =1 from 2 rows (tests set tern__cuda_norm_gemm_on = 1). */
#define NORM_GEMM_ROWS 32
int tern__cuda_norm_gemm_on = -1; /* -1 unread, 0 never, 1 from 2 rows, 2 from NORM_GEMM_ROWS */

/* ops.h norm_matmul (q|k|v, or q alone) for many rows when a weight is flagged precise (Gemma 4's q and k)
 * or every GEMM splits x (bf16x2): rmsnorm, then each matmul staging x again (a bf16 pair for the split
 * ones, bf16 for the plain ones) cost three conversion passes over the same rows. Here one kernel writes
 * xn and the pair [xh | xl] as gemm_rows stages it (xh = bf16(xn) is also the plain stage), then each
 * weight's GEMMs as gemm_rows runs them: bitwise rmsnorm + the separate matmuls (the same GEMMs on the same
 * bytes at the same scratch offsets). Two forms, as gemm_rows picks: up to tern__cuda_gemm_merge_max() rows
 * the merged one ([xh | xl] unpadded, one GEMM of 2n columns into the scratch after the pair, y = the sum of
 * its halves; batch decode: gemma4-12b's sliding q|k|v at 64 sequences ran rmsnorm + three conversions, ncu
 * NOTES (cb); TERN_CUDA_SPLIT_MERGED, default 1 since session 69 with NORM_RES_N, NOTES (cc); 0 off),
 * above it the two-GEMM one (W·xh, then += W·xl). The plain ones W·xh. Taken only where every one of those
 * matmuls reaches that form in one chunk (BF16 weights, more rows than the GEMVs and qgemm.cu take, and for plain
 * weights not sgemm.cu's range); 0 otherwise. */
int tern__cuda_split_merged = -1; /* TERN_CUDA_SPLIT_MERGED (default 1); tests set it */
static int gemm_norm_split(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, int n, int k,
                           float *const *y, const tern__cuda_w *const *w, const tern_norm_res *res) {
    if (tern__cuda_split_merged < 0) tern__cuda_split_merged = tern__cuda_env_int("TERN_CUDA_SPLIT_MERGED", 1) != 0;
    if (c->compute != TERN_COMPUTE_BF16 || k < 1 || k > 3 || n <= 8 || n <= tern__cuda_qgemm_max_n_bf16) return 0;
    const int in = w[0]->in, all = tern__cuda_bf16_split_all(c), merged = n <= tern__cuda_gemm_merge_max();
    if (merged && !tern__cuda_split_merged) return 0;
    const size_t avail = c->gemm_scratch_bytes, xraw = (size_t)n * in * 2;
    const size_t xbytes = merged ? xraw : (xraw + 255) & ~(size_t)255;
    int any = 0;
    for (int i = 0; i < k; i++) {
        if (w[i]->dtype != TERN_DT_BF16 || w[i]->nmat > 1 || w[i]->in != in || w[i]->out < 1) return 0;
        const int split = all || w[i]->precise;
        any |= split;
        if (merged && split && 2 * xraw + (size_t)2 * n * w[i]->out * sizeof(float) + 512 > avail) return 0;
        if (merged && !split && n <= 64 && tern__cuda_sgemm_level() >= 2) return 0; /* tern__cuda_gemm's sgemm.cu */
    }
    if (!any || in <= 0 || (merged && xraw % 16)) return 0;
    const size_t chunk = (avail / 2 - 1024) / ((size_t)in * 4); /* tern__cuda_gemm's rows a chunk */
    if ((size_t)n > chunk || 2 * xbytes >= avail / 2) return 0;
    cudaSetDevice(c->device);
    uint8_t *xh = (uint8_t *)c->gemm_scratch, *xl = xh + xbytes;
    float *cs = (float *)(xh + ((2 * xbytes + 255) & ~(size_t)255)); /* the merged GEMM's [W·xh | W·xl] */
    norm_stage(c, xn, xh, xl, x, n, in, nw, eps, res);
    const cublasComputeType_t tc = CUBLAS_COMPUTE_32F;
    for (int i = 0; i < k; i++) {
        const int out = w[i]->out, split = all || w[i]->precise;
        tern_status st;
        if (merged && split) {
            st = lt_gemm(c, cs, out, w[i]->data, xh, out, 2 * n, in, CUDA_R_16BF, tc, 0.0f);
            if (!st) tern__cuda_ew(c, TERN__EW_ADD, y[i], cs, cs + (size_t)n * out, 0, (size_t)n * out);
        } else {
            st = lt_gemm(c, y[i], out, w[i]->data, xh, out, n, in, CUDA_R_16BF, tc, 0.0f);
            if (!st && split) st = lt_gemm(c, y[i], out, w[i]->data, xl, out, n, in, CUDA_R_16BF, tc, 1.0f);
        }
        if (st != TERN_OK) return 0; /* the caller redoes every output with the separate ops (xn is rmsnorm's already) */
    }
    return 1;
}
/* ---- ops.h norm_matmul for many rows of Q4 (the batch Q4 GEMM on wgmma, qgemm_q4_wg.cu; TERN_CUDA_Q4_NORM) ----
 * The pre-norm writes xn and, instead of leaving q4w_stage_x to convert xn again before each GEMM, the bf16 bytes
 * that kernel would write (norm.cu rmsnorm_q4s: the same values, rounding and order), so q|k|v and gate|up lose a
 * launch and a read of the rows each; with res, norm_matmul's residual prologue in the same launch as the other
 * many-row paths (rmsnorm_res_bf16's). Bitwise the separate ops. Taken only where tern__cuda_qg4_staged says the
 * wgmma kernel takes every matrix (17..128 rows, BF16 scales, K a multiple of 128), so nothing declines after the
 * norm ran. ncu of llama3-8b q4 at 64 sequences (session 71, NOTES (ce)): q4w_stage_x 2.6 µs a launch, four a layer.
 * Default since session 73 (H100, with TERN_CUDA_Q4_ATT_O; NOTES (cg)): llama3-8b q4 at 32 / 64 / 128 sequences
 * +0.7 / +2.2 / +1.0 %, gemma4-12b q4 +0.2 / +0.8 / +0.7 %, ids digests equal; `TERN_CUDA_Q4_NORM=0` off. */
int tern__cuda_q4_norm = -1; /* -1 unread (TERN_CUDA_Q4_NORM, default 1); tests set it */
/* the pre-norm may write the staged x: xn aligned, and no row it reads or writes in gemm_scratch */
static int q4_norm_fits(const tern__cuda *c, const float *xn, const float *x, int n, int in, const tern_norm_res *res) {
    const size_t rb = (size_t)n * in * sizeof(float);
    return !((uintptr_t)xn & 15) && !tern__cuda_in_scratch(c, x, rb) && !tern__cuda_in_scratch(c, xn, rb) &&
           !(res && (tern__cuda_in_scratch(c, res->h, rb) || tern__cuda_in_scratch(c, res->x_out, rb)));
}
static int q4_norm_gemm(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, int n, int k,
                        float *const *y, const tern__cuda_w *const *w, int mode, const tern_norm_res *res) {
    if (tern__cuda_q4_norm < 0) tern__cuda_q4_norm = tern__cuda_env_int("TERN_CUDA_Q4_NORM", 1) != 0;
    const int pair = mode == G1_SILU || mode == G1_GELU;
    if (!tern__cuda_q4_norm || w[0]->dtype != TERN_DT_Q || (pair ? k != 2 : mode != G1_PLAIN) ||
        !q4_norm_fits(c, xn, x, n, w[0]->in, res))
        return 0;
    float *ys[3] = {y[0], pair ? y[0] : k > 1 ? y[1] : NULL, k > 2 ? y[2] : NULL}; /* a pair writes y[0] */
    if (!tern__cuda_qg4_staged(c, ys, w, k, n, mode, 0, NULL)) return 0;
    cudaSetDevice(c->device);
    tern__cuda_rmsnorm_q4s(c, xn, c->gemm_scratch, x, n, w[0]->in, nw, eps, res);
    return tern__cuda_qg4_staged(c, ys, w, k, n, mode, 1, NULL);
}

/* ---- ops.h norm_qkv_rope_kv for many rows of Q4 (TERN_CUDA_Q4_QKV; gemm.h) ----
 * q4_norm_gemm's pre-norm and q|k|v GEMM, with the GEMM's split-K sum folded into the rope: the K slices stay in
 * c->part and fused.cu's rope_kv_parts sums them in qg4_reduce's order before roping and storing — one launch and a
 * write and read of q|k|v fewer than qg4_reduce + rope_kv_write, whose bits it keeps (a launch that needed no split
 * wrote y: rope_kv_write then). ncu of llama3-8b q4 at 64 sequences (NOTES (ce)): that reduce 5.46 µs a layer, the
 * two stagings before q|k|v 2.6. Written in session 71 after the device budget ran out: opt-in until timed. */
int tern__cuda_q4_qkv = -1; /* -1 unread (TERN_CUDA_Q4_QKV, default 0); tests set it */
int tern__cuda_q4_qkv_rope(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, float *const *y,
                           const tern__cuda_w *const *w, const tern_kv_layer *kv, const tern_rows *rows, int nh,
                           const float *inv_freq, float mscale) {
    if (tern__cuda_q4_qkv < 0) tern__cuda_q4_qkv = tern__cuda_env_int("TERN_CUDA_Q4_QKV", 0) != 0;
    const int n = rows->n, d = kv->head_dim, nkv = kv->n_head_kv;
    if (!tern__cuda_q4_qkv || n < 2 || xn == x || w[0]->dtype != TERN_DT_Q || !tern__cuda_rope_pages(kv) ||
        w[0]->out != nh * d || w[1]->out != nkv * d || w[2]->out != nkv * d || !q4_norm_fits(c, xn, x, n, w[0]->in, NULL) ||
        !tern__cuda_qg4_staged(c, y, w, 3, n, G1_PLAIN, 0, NULL))
        return 0;
    cudaSetDevice(c->device);
    tern__cuda_rmsnorm_q4s(c, xn, c->gemm_scratch, x, n, w[0]->in, nw, eps, NULL);
    int S = 0;
    if (!tern__cuda_qg4_staged(c, y, w, 3, n, G1_PLAIN, 1, &S)) return 0; /* not reached: checked above */
    if (!S) return tern__cuda_rope_kv_write(c, kv, rows, y[0], y[1], y[2], nh, rows->pos, inv_freq, mscale);
    const size_t slice = (size_t)n * (w[0]->out + w[1]->out + w[2]->out);
    return tern__cuda_rope_kv_parts(c, kv, rows, c->part, slice, S, y[0], y[1], y[2], nh, inv_freq, mscale);
}

int tern__cuda_gemm_norm(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, int n, int k,
                         float *const *y, const tern__cuda_w *const *w, int mode, const tern_norm_res *res) {
    if (tern__cuda_norm_gemm_on < 0) tern__cuda_norm_gemm_on = tern__cuda_env_int("TERN_CUDA_NORM_GEMM", 2);
    if (!tern__cuda_norm_gemm_on || n < (tern__cuda_norm_gemm_on == 1 ? 2 : NORM_GEMM_ROWS) || xn == x) return 0;
    if (res && (!res_n_on() || res->h2)) return 0; /* h2: its inner add as rmsnorm_add launches (the model's) */
    if (q4_norm_gemm(c, xn, x, nw, eps, n, k, y, w, mode, res)) return 1;
    if (mode == G1_PLAIN && gemm_norm_split(c, xn, x, nw, eps, n, k, y, w, res)) return 1;
    const int pair = mode == G1_SILU || mode == G1_GELU, in = w[0]->in;
    const int act = mode == G1_SILU ? TERN_ACT_SILU : TERN_ACT_GELU_TANH;
    if (pair ? k != 2 || !gemm_glu_ok(c, n, w[0], w[1], act) : mode != G1_PLAIN || k < 2 || !gemm_n_ok(c, k, y, n, w))
        return 0;
    const size_t xb = staged_bytes(c, n, in, pair ? glu_cbytes(n, w[0]) : 0);
    if (!xb) return 0;
    cudaSetDevice(c->device);
    norm_stage(c, xn, c->gemm_scratch, NULL, x, n, in, nw, eps, res);
    return pair ? gemm_glu_run(c, y[0], n, xb, w[0], w[1], act) : gemm_n_run(c, k, y, n, w);
}

/* 1 when the k BF16 matrices' rows are back to back in one allocation (join_weights), w[0] first: one [Σ out, in]
 * matrix for a single GEMM */
static int joined_rows(const tern__cuda_w *const *w, int k) {
    for (int i = 1; i < k; i++)
        if ((const uint8_t *)w[i]->data != (const uint8_t *)w[i - 1]->data + (size_t)w[i - 1]->out * w[i - 1]->in * 2)
            return 0;
    return 1;
}

/* ---- q|k|v as one matrix for many rows (TERN_CUDA_QKV_ONE, default on since session 27: +2.5 % / +4.6 % at 64 / 128 sequences) --
 * bench_cuda --ltsweep (NOTES (am)) timed llama3-8b's q|k|v as one 6144x4096 cuBLASLt GEMM at 17.7 µs for 64 rows,
 * against 24.3 on sgemm.cu (the default) and 22.6 as the q GEMM + the k|v strided batch. The weights are joined at
 * load (vt join_weights: adjacent rows), so the three are one [Σ out, in] matrix; its outputs land in gemm_scratch as
 * rows [q | k | v] and rope_kv_rows (fused.cu) ropes q and k from there, stores k and v in the cache and writes
 * q, k, v where the separate ops would. Numerics: the plain bf16 mode's GEMM (another summation order than
 * sgemm.cu's: the bf16 bound, not bitwise); xn and its bf16 copy are the pre-norm kernel's, as before. */
int tern__cuda_qkv_one_on = -1; /* -1 until read (tests set 1) */
int tern__cuda_qkv_one(void) {
    if (tern__cuda_qkv_one_on < 0) tern__cuda_qkv_one_on = tern__cuda_env_int("TERN_CUDA_QKV_ONE", 1) != 0;
    return tern__cuda_qkv_one_on;
}
/* rows from which the joined GEMM serves (TERN_CUDA_QKV_ONE_MIN, 9: every many-row call; below, sgemm.cu) */
int tern__cuda_qkv_one_min = -1; /* -1 until read (tests set 2) */
static int qkv_one_min(void) {
    if (tern__cuda_qkv_one_min < 0) tern__cuda_qkv_one_min = tern__cuda_env_int("TERN_CUDA_QKV_ONE_MIN", 9);
    return tern__cuda_qkv_one_min;
}

const float *tern__cuda_qkv_one_gemm(tern__cuda *c, float *xn, const float *x, const float *nw, float eps,
                                     const tern__cuda_w *const *w, const tern_kv_layer *kv, const tern_rows *rows,
                                     int nh, size_t *xbytes) {
    const int n = rows->n, in = w[0]->in, d = kv->head_dim, nkv = kv->n_head_kv;
    if (!tern__cuda_qkv_one() || n < 2 || n < qkv_one_min() || xn == x || ((uintptr_t)xn & 15)) return NULL;
    if (!tern__cuda_rope_pages(kv) || w[0]->out != nh * d || w[1]->out != nkv * d || w[2]->out != nkv * d) return NULL;
    for (int i = 0; i < 3; i++) /* plain bf16 GEMMs over BF16 weights */
        if (!plain_gemm_ok(c, w[i], n) || w[i]->nmat > 1 || w[i]->in != in) return NULL;
    if (!joined_rows(w, 3)) return NULL;
    const int M = w[0]->out + w[1]->out + w[2]->out;
    const size_t cb = (size_t)n * M * sizeof(float), xb = staged_bytes(c, n, in, cb);
    if (!xb) return NULL;
    cudaSetDevice(c->device);
    float *cs = (float *)((uint8_t *)c->gemm_scratch + xb);
    norm_stage(c, xn, c->gemm_scratch, NULL, x, n, in, nw, eps, NULL);
    if (lt_gemm(c, cs, M, w[0]->data, c->gemm_scratch, M, n, in, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 0.0f) != TERN_OK)
        return NULL; /* the caller runs norm_matmul + rope_kv_write (xn is rmsnorm's already) */
    if (xbytes) *xbytes = xb;
    return cs;
}

int tern__cuda_gemm_qkv_rope(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, float *const *y,
                             const tern__cuda_w *const *w, const tern_kv_layer *kv, const tern_rows *rows, int nh,
                             const float *inv_freq, float mscale) {
    const float *cs = tern__cuda_qkv_one_gemm(c, xn, x, nw, eps, w, kv, rows, nh, NULL);
    const int M = w[0]->out + w[1]->out + w[2]->out;
    return cs && tern__cuda_rope_kv_rows(c, kv, rows, cs, M, y[0], y[1], y[2], nh, inv_freq, mscale);
}

/* ---- Gemma 4's attention input for many rows (ops.h norm_qkv_norm_rope_kv; TERN_CUDA_G4_QKV) ----
 * The separate ops ran q, k and v as three GEMMs of 64-128 columns over 2048-4096 rows each — cuBLASLt's grids
 * for those fill the SMs once and stream the weight at ~1.6 TB/s (ncu of gemma4-12b bf16 at 64 sequences, NOTES
 * (cb): 16.5 + 12.0 + 11.4 µs a sliding layer for 63 MB) — plus an elementwise sum for each precise one. Here
 * the pre-norm kernel writes xn and the bf16 pair (with the pending post-norm add folded in, as norm_matmul's
 * res), one GEMM runs over the joined [q | k | v] (join_weights) on [xh | xl] (2n columns) when any weight is
 * precise, else on xh, and nrk_rows norms, ropes and stores from its rows, adding the W·xl half for the precise
 * ones (bf16x2: all). Full layers (attention_k_eq_v: w[2] NULL) the same over joined q|k, v read from k's columns.
 * Numerics: the separate ops' products and sums, in another GEMM's summation order (the bf16 mode's bound, not
 * bitwise). Decode steps (9..128 rows), head dims 256 / 512. TERN_CUDA_G4_QKV: bit 0 q|k|v, bit 1 q|k (default 3,
 * both; 0 off). H100, session 69 (gpu_ab.sh sections 120 / 121, NOTES (cc)), on top of NORM_RES_N + SPLIT_MERGED, dec
 * tok/s at 64 sequences: gemma4-12b bf16 4830 / 4763 → 5010 / 5011 (0.735), gemma4-e4b 9175 → 9655–9734 (all three
 * against none), gemma4-26b-a4b 2917–2933 → 2986; b1 unchanged by the joined weights (107.0 / 107.1 tok/s). */
int tern__cuda_g4_qkv = -1; /* -1 until read: bit 0 q|k|v, bit 1 q|k with V = K (tests set it) */
unsigned long long tern__cuda_qkv_nrk_calls; /* calls served (tests check that the path ran) */
int tern__cuda_gemm_qkv_nrk(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, float *const *y,
                            const tern__cuda_w *const *w, const tern_kv_layer *kv, const tern_rows *rows, int nh,
                            const float *inv_freq, float mscale, const float *qw, const float *kw,
                            const tern_norm_res *res) {
    if (tern__cuda_g4_qkv < 0) tern__cuda_g4_qkv = tern__cuda_env_int("TERN_CUDA_G4_QKV", 3) & 3;
    const int n = rows->n, in = w[0]->in, d = kv->head_dim, nkv = kv->n_head_kv, k = w[2] ? 3 : 2;
    if (!(tern__cuda_g4_qkv & (k == 3 ? 1 : 2)) || c->compute != TERN_COMPUTE_BF16 || n <= 8 ||
        n <= tern__cuda_qgemm_max_n_bf16 || n > 128 || xn == x || ((uintptr_t)xn & 15) || (res && (!res_n_on() || res->h2)))
        return 0;
    if (w[0]->out != nh * d || w[1]->out != nkv * d || (k == 3 && w[2]->out != nkv * d) || (d != 256 && d != 512) ||
        !tern__cuda_rope_pages(kv))
        return 0;
    const int all = tern__cuda_bf16_split_all(c);
    int mask = 0, M = 0;
    if (!joined_rows(w, k)) return 0;
    for (int i = 0; i < k; i++) { /* BF16 */
        if (w[i]->dtype != TERN_DT_BF16 || w[i]->nmat > 1 || w[i]->in != in || in % 8) return 0;
        if (all || w[i]->precise) mask |= 1 << i;
        M += w[i]->out;
    }
    if (k == 2 && (mask & 2)) mask |= 4; /* v = the raw k: its sum as k's */
    const int cols = mask ? 2 * n : n;
    const size_t xraw = (size_t)n * in * 2, xb = ((mask ? 2 * xraw : xraw) + 255) & ~(size_t)255;
    if (xb + (size_t)cols * M * sizeof(float) > c->gemm_scratch_bytes) return 0;
    cudaSetDevice(c->device);
    uint8_t *xh = (uint8_t *)c->gemm_scratch;
    float *cs = (float *)(xh + xb);
    norm_stage(c, xn, xh, mask ? xh + xraw : NULL, x, n, in, nw, eps, res);
    if (lt_gemm(c, cs, M, w[0]->data, xh, M, cols, in, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 0.0f) != TERN_OK) return 0;
    const int ok = tern__cuda_nrk_rows(c, kv, rows, cs, M, (long)n * M, mask, k == 2, y[0], y[1], y[2], nh, inv_freq,
                                       mscale, qw, kw, eps);
    tern__cuda_qkv_nrk_calls += ok != 0;
    return ok;
}

/* ---- Gemma 4's per-layer input block for many rows (ops.h ple_block; TERN_CUDA_PLE_N, default on) ----
 * The separate ops (src/model/internal.h tern__pending_ple) run seven launches a layer at a batch step: copy_cols of
 * the layer's slice of the per-layer inputs, rmsnorm_add (the post-FFN norm's add), the gate GEMM's x staging and the
 * GEMM, gelu·slice, the projection's staging and its GEMM. Here four: rmsnorm_add_bf16 (x' out of place and staged
 * in bf16: x' = x staged alone without res), the same cuBLASLt GEMM gemm_rows' plain form runs, act_mul_bf16 (the
 * product reading the slice in place, staged for the projection) and the projection's GEMM. Each step computes the
 * separate op's values (rms_row, f32_to_bf16's rounding, ew_one, lt_gemm with the same shape and so the same cached
 * algorithm), so the same bits where the separate matmuls would take gemm_rows: BF16 weights not precise, more rows
 * than qgemm.cu takes, x fits gemm_rows' scratch in one chunk, not sgemm.cu (its level 2 takes one matrix up to 64
 * rows). Written in session 69 (op test cuda_ple_block, gpu_ab.sh section 125): e4b's batch steps ran ~15 launches a
 * layer. H100, session 70 (NOTES (cd)): e4b bf16 at 32 / 64 sequences 5233 / 9979 -> 5356 / 10185 dec tok/s, the ids
 * digests equal; default since. TERN_CUDA_PLE_N=0: the separate ops. Session 71 (NOTES (ce)): the gate as a split-K
 * tensor-core kernel of our own and the projection as a second (=2) lost 9 % at 64 sequences and was removed. */
int tern__cuda_ple_n = -1; /* -1 unread (TERN_CUDA_PLE_N, default 1); tests set it */
unsigned long long tern__cuda_ple_calls; /* calls served (tests) */
static int ple_fits(const tern__cuda *c, const tern__cuda_w *w, int n) { /* tern__cuda_gemm's one-chunk gemm_rows */
    const size_t xbytes = ((size_t)n * w->in * 2 + 255) & ~(size_t)255; /* gemm_rows' plain staging */
    return plain_rows(c, w, n) && w->nmat <= 1 && (size_t)n <= gemm_chunk_rows(c, w->in) &&
           xbytes < c->gemm_scratch_bytes / 2 && !gemm_skinny(c, w, n);
}
int tern__cuda_ple_block(tern__cuda *c, float *y, float *pg, const float *x, int n, const tern__cuda_w *wg,
                         const tern__cuda_w *wp, int act, const float *v, long ldv, const tern_norm_res *res, float eps) {
    if (tern__cuda_ple_n < 0) tern__cuda_ple_n = tern__cuda_env_int("TERN_CUDA_PLE_N", 1);
    if (!tern__cuda_ple_n || n > 128 || (act != TERN_ACT_SILU && act != TERN_ACT_GELU_TANH) || !y || !pg || !v)
        return 0;
    if ((res && (res->h2 || !res->x_out || !res->h)) || wp->in != wg->out || ldv < wg->out)
        return 0; /* the MoE layers' inner add (h2): not served */
    if (!ple_fits(c, wg, n) || !ple_fits(c, wp, n)) return 0;
    const int in = wg->in, P = wg->out, H = wp->out;
    const cublasComputeType_t tc = CUBLAS_COMPUTE_32F;
    void *xs = c->gemm_scratch;
    cudaSetDevice(c->device);
    if (res) tern__cuda_rmsnorm_add_bf16(c, res->x_out, x, res->h, res->w, res->s, xs, n, in, eps);
    else tern__cuda_f32_to_bf16(c, xs, NULL, x, (size_t)n * in);
    const int op = act == TERN_ACT_SILU ? TERN__EW_SILU : TERN__EW_GELU;
    if (lt_gemm(c, pg, P, wg->data, xs, P, n, in, CUDA_R_16BF, tc, 0.0f) != TERN_OK) return 0;
    tern__cuda_act_mul_bf16(c, op, pg, pg, v, ldv, xs, n, P);
    if (lt_gemm(c, y, H, wp->data, xs, H, n, P, CUDA_R_16BF, tc, 0.0f) != TERN_OK) return 0;
    tern__cuda_ple_calls++;
    return 1;
}

/* y += w·x for x staged in bf16 at the start of gemm_scratch (gemm_add, attention_o) */
static int add_staged(tern__cuda *c, float *y, int n, const tern__cuda_w *w) {
    if (tern__cuda_sgemm(c, 1, &y, c->gemm_scratch, n, &w, G1_RES)) return 1;
    return lt_gemm(c, y, w->out, w->data, c->gemm_scratch, w->out, n, w->in, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 1.0f) ==
           TERN_OK;
}

/* attention_o: the batch decode attention (attn_decode_tc.cu, unsplit) writes the o GEMM's bf16 input at the start
 * of gemm_scratch — where stage_x would put it — instead of f32 rows that stage_x then converts: the same bf16
 * values (round to nearest of the same f32), one launch and one f32 write + read of [n, nh·D] fewer. Other attention
 * kernels write f32 as before and the staging runs. */
static int att_o_on(void) {
    static int v = -1;
    if (v < 0) v = tern__cuda_env_int("TERN_CUDA_ATT_O", 1) != 0;
    return v;
}

/* TERN_CUDA_Q4_ATT_O (session 72; default since session 73, `=0` off): the same handoff for a Q4 o projection that
 * the batch Q4 GEMM on wgmma takes (17..128 rows): the attention writes its bf16 output in that kernel's staged order
 * (attn_decode.cuh ad_warp_merge, AdArgs.outq), so no q4w_stage_x runs before o (ncu of llama3-8b q4 at 64
 * sequences, NOTES (ce): 2.6-3.4 µs a staging); where the attention wrote f32, the usual Q4 route stages it. Bitwise
 * either way. H100 (NOTES (cg)): llama3-8b q4 at 32 / 64 sequences +0.3 / +0.7 % alone, more with TERN_CUDA_Q4_NORM. */
int tern__cuda_q4_att_o = -1; /* -1 unread (TERN_CUDA_Q4_ATT_O, default 1); tests set it */
static int q4_att_o(tern__cuda *c, float *y, const float *att, int n, const tern__cuda_w *w) {
    if (tern__cuda_q4_att_o < 0) tern__cuda_q4_att_o = tern__cuda_env_int("TERN_CUDA_Q4_ATT_O", 1) != 0;
    float *ys[1] = {y};
    return tern__cuda_q4_att_o && w->dtype == TERN_DT_Q && !tern__cuda_in_scratch(c, y, (size_t)n * w->out * 4) &&
           !tern__cuda_in_scratch(c, att, (size_t)n * w->in * 4) &&
           tern__cuda_qg4_staged(c, ys, &w, 1, n, G1_RES, 0, NULL);
}

int tern__cuda_attn_o_begin(tern__cuda *c, float *y, const float *att, int n, int in_att, const tern__cuda_w *w) {
    if (!att_o_on() || n <= 0 || in_att != w->in || ((uintptr_t)y & 15)) return 0;
    const int q4 = q4_att_o(c, y, att, n, w);
    if (!q4 && (!plain_gemm_ok(c, w, n) || !staged_bytes(c, n, w->in, 0))) return 0;
    c->att_f32 = att;
    c->att_n = n;
    c->att_bf16_done = 0;
    c->att_q4s = q4;
    return 1;
}

void tern__cuda_attn_o_cancel(tern__cuda *c) {
    c->att_f32 = NULL;
    c->att_bf16_done = 0;
    c->att_q4s = 0;
}

int tern__cuda_attn_o_end(tern__cuda *c, float *y, const float *att, int n, const tern__cuda_w *w, int add) {
    const int staged = c->att_bf16_done, q4 = c->att_q4s;
    tern__cuda_attn_o_cancel(c);
    cudaSetDevice(c->device);
    if (q4) {
        float *ys[1] = {y};
        const int mode = add ? G1_RES : G1_PLAIN;
        return staged ? tern__cuda_qg4_staged(c, ys, &w, 1, n, mode, 1, NULL)
                      : tern__cuda_q4_rows(c, ys, &w, 1, att, n, mode, 0);
    }
    if (!staged && !stage_x(c, att, n, w->in, 0)) return 0;
    if (add) return add_staged(c, y, n, w);
    return lt_gemm(c, y, w->out, w->data, c->gemm_scratch, w->out, n, w->in, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 0.0f) ==
           TERN_OK; /* gemm_rows's plain GEMM on the same staged x */
}

int tern__cuda_gemm_add(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w) {
    if (n <= 0 || !plain_gemm_ok(c, w, n) || ((uintptr_t)y & 15)) return 0;
    cudaSetDevice(c->device);
    return stage_x(c, x, n, w->in, 0) && add_staged(c, y, n, w);
}

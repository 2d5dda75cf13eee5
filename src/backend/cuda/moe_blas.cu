/*
 * moe_blas.cu — moe_mlp for large prefill chunks in the plain bf16 mode with BF16 experts: the routed pairs
 * sorted by expert (moe_gemm.cu's plan + scatter), then cuBLAS grouped GEMMs (cublasGemmGroupedBatchedEx, one
 * problem per expert that got rows) instead of moe_gemm.cu's mma.sync kernel, which reached ~117 TFLOP/s on the
 * gemma4-26b-a4b geometry at 2048-token chunks (H200, session 21: 56 % of a bf16 8k prefill).
 *   1. gather: xs[s] = bf16(x[perm[s] / k]) — the sorted rows, [mp][H];
 *   2. the per-expert row offsets come to the host (one sync per chunk; so never while a graph is recorded);
 *   3. gate and up: for each expert e with rows, gu[rows][0, I) = xs·Gate_eᵀ and gu[rows][I, 2I) = xs·Up_eᵀ
 *      (bf16 out, f32 accumulation), 2·(experts with rows) problems in one call;
 *   4. h = act(gate)·up, rounded to bf16, [mp][I];
 *   5. down: o[rows] = h·Down_eᵀ (bf16, [mp][H], in xs's place);
 *   6. combine: y[r] = Σ_j wts[r·k + j] · o[ipos[r·k + j]], j in order, f32 (moe_gemm.cu's mg_combine).
 * Numerics are transformers' bf16 expert MLP (x, the projections' outputs and h rounded to bf16; the mma path
 * keeps the projections' outputs in f32): the plain mode's bound (1e-2 vs cpu-ref). Deterministic for a given
 * chunk, but cuBLAS may pick other kernels for other row counts, so not batch-invariant (the mma path is, for a
 * fixed tile height). TERN_MOE_BLAS=0 turns it off; taken from TERN_MOE_BLAS_MIN routed pairs (default 32·E).
 *
 * The padded form (steps 1, 3-5 in another layout; TERN_MOE_PAD=0 keeps the grouped calls): expert e's rows at
 * e·P, P the most rows any expert got rounded up to a step of a ladder (mb_padded), so every expert is one problem of the same shape and
 * each projection is one strided-batched GEMM (cuBLAS picks its Hopper kernels for those; for grouped problems
 * an older tile kernel). Pad rows hold whatever the buffer held; their results are never read (a row's GEMM
 * outputs depend on that row only). The combine reads o through the pairs' padded rows. H200, session 22, at
 * the gemma4-26b-a4b geometry and a 2048-token chunk (uniform routing, 93..178 rows an expert, P = 192):
 * gate|up 312 us vs 553 grouped (416 vs 235 TFLOP/s of useful work), down 172 vs 297. Taken while E·P <= 2·mp
 * (padding at most doubles the work: skewed routing takes the grouped calls).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"

#include <cublas_v2.h>
#include <stdlib.h>

/* eight f32 at src (16-byte aligned) rounded to bf16, as one 16-byte store */
__device__ __forceinline__ uint4 bf16x8(const float4 *src) {
    const float4 a = src[0], b = src[1];
    __nv_bfloat162 v[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                           __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
    return *(const uint4 *)v;
}

__global__ void mb_gather(__nv_bfloat16 *xs, const float *x, const int32_t *perm, int mp, int k, int H) {
    pdl_start();
    const int H8 = H >> 3;
    const size_t total = (size_t)mp * H8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int s = (int)(i / H8), c = (int)(i % H8);
        ((uint4 *)(xs + (size_t)s * H))[c] = bf16x8((const float4 *)(x + (size_t)(perm[s] / k) * H) + 2 * c);
    }
}

/* the padded gather: sorted slot s < ns (= off[E], the pairs with a local expert) of expert e (off[e] <= s <
 * off[e + 1]) to row e·P + s - off[e] of xs, and ipad[perm[s]] = that row (the combine's index); a warp per slot */
__global__ void mb_gather_pad(__nv_bfloat16 *xs, int32_t *ipad, const float *x, const int32_t *perm, const int *off, int E,
                              int P, int ns, int k, int H) {
    pdl_start();
    const int lane = threadIdx.x & 31, H8 = H >> 3;
    for (long s = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; s < ns; s += ((long)gridDim.x * blockDim.x) >> 5) {
        int lo = 0, hi = E - 1; /* the last e with off[e] <= s (empty experts share their offset with the next) */
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (off[mid] <= s) lo = mid;
            else hi = mid - 1;
        }
        const int p = perm[s];
        const size_t row = (size_t)lo * P + (s - off[lo]);
        if (lane == 0) ipad[p] = (int32_t)row;
        const float4 *src = (const float4 *)(x + (size_t)(p / k) * H);
        uint4 *dst = (uint4 *)(xs + row * H);
        for (int c = lane; c < H8; c += 32) dst[c] = bf16x8(src + 2 * c);
    }
}

/* h[s] = bf16(act(g)·u) over rows s of gu [mp][2I], the gate at column gofs of a row (0 or I), up at I - gofs; 8
 * elements a thread (I % 8 == 0: 16-byte loads and stores) */
__global__ void mb_act(__nv_bfloat16 *h, const __nv_bfloat16 *gu, int mp, int I, int act, int gofs) {
    pdl_start();
    const int I8 = I >> 3;
    const size_t total = (size_t)mp * I8;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const size_t s = t / I8;
        const int c = (int)(t % I8);
        const uint4 gv = ((const uint4 *)(gu + s * 2 * I + gofs))[c], uv = ((const uint4 *)(gu + s * 2 * I + I - gofs))[c];
        const __nv_bfloat16 *g8 = (const __nv_bfloat16 *)&gv, *u8 = (const __nv_bfloat16 *)&uv;
        __nv_bfloat16 o[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float g = __bfloat162float(g8[j]), u = __bfloat162float(u8[j]);
            o[j] = __float2bfloat16_rn((act == TERN_ACT_SILU ? silu(g) : gelu_tanh(g)) * u);
        }
        ((uint4 *)(h + s * I))[c] = *(const uint4 *)o;
    }
}

extern "C" unsigned long long tern__cuda_moe_blas_calls; /* chunks run here (tests check the path ran) */
unsigned long long tern__cuda_moe_blas_calls = 0;
extern "C" unsigned long long tern__cuda_moe_pad_calls; /* of those, in the padded form */
unsigned long long tern__cuda_moe_pad_calls = 0;
/* the padded form: -1 unread (TERN_MOE_PAD, default 1), 0 never, 1 while E·P <= 2·mp, 2 whenever it fits (tests) */
extern "C" int tern__cuda_moe_pad;
int tern__cuda_moe_pad = -1;

static unsigned mb_grid(size_t total) { return tern_grid256(total, 8192); }

/* mb_act for a caller's rows (gemm.c's bf16 MLP) */
extern "C" void tern__cuda_glu_bf16(tern__cuda *c, void *h, const void *gu, size_t rows, int I, int act, int gofs) {
    if (!rows || I <= 0) return;
    cudaSetDevice(c->device);
    tern_launch(c->stream, mb_act, mb_grid(rows * I / 8), 256, 0, (__nv_bfloat16 *)h, (const __nv_bfloat16 *)gu,
                (int)rows, I, act, gofs);
    tern__cuda_check(c, "glu_bf16");
}

/* Does moe_blas take np routed pairs of these experts? (the caller has checked shapes and the plain mode) */
extern "C" int tern__cuda_moe_blas_ok(const tern__cuda *c, const tern__cuda_w *gate, const tern__cuda_w *up,
                                      const tern__cuda_w *down, int np) {
    static int on = -1, min = -1;
    if (on < 0) on = tern__cuda_env_int("TERN_MOE_BLAS", 1) != 0;
    if (min < 0) min = tern__cuda_env_int("TERN_MOE_BLAS_MIN", 0);
    const int E = gate->nmat;
    if (!on || c->capturing || np < (min > 0 ? min : 32 * E)) return 0;
    return gate->dtype == TERN_DT_BF16 && up->dtype == TERN_DT_BF16 && down->dtype == TERN_DT_BF16 && gate->in % 8 == 0 &&
           down->in % 8 == 0;
}

/* one grouped call: problem i = (A[i] [m x kk]ᵀ-stored, B[i], C[i]) with n[i] columns; A, B, C are uploaded to dev */
static int mb_grouped(tern__cuda *c, int G, int m, const int *n, int kk, int lda, int ldb, int ldc, const void **hp,
                      void **dev) {
    cublasOperation_t *ta = (cublasOperation_t *)malloc(sizeof *ta * G * 2);
    int *iv = (int *)malloc(sizeof(int) * G * 6);
    float *ab = (float *)malloc(sizeof(float) * G * 2);
    if (!ta || !iv || !ab) {
        free(ta); free(iv); free(ab);
        return 0;
    }
    int *mv = iv, *kv = iv + G, *la = iv + 2 * G, *lb = iv + 3 * G, *lc = iv + 4 * G, *gs = iv + 5 * G;
    for (int i = 0; i < G; i++) {
        ta[i] = CUBLAS_OP_T;
        ta[G + i] = CUBLAS_OP_N;
        mv[i] = m; kv[i] = kk; la[i] = lda; lb[i] = ldb; lc[i] = ldc; gs[i] = 1;
        ab[i] = 1.0f;
        ab[G + i] = 0.0f;
    }
    int ok = cudaMemcpyAsync(dev, hp, sizeof(void *) * 3 * G, cudaMemcpyHostToDevice, c->stream) == cudaSuccess;
    cublasStatus_t st = CUBLAS_STATUS_NOT_INITIALIZED;
    if (ok) /* dev: A[0..G), B[G..2G), C[2G..3G) */
        st = cublasGemmGroupedBatchedEx((cublasHandle_t)c->blas, ta, ta + G, mv, n, kv, ab, (const void *const *)dev,
                                        CUDA_R_16BF, la, (const void *const *)(dev + G), CUDA_R_16BF, lb, ab + G,
                                        dev + 2 * G, CUDA_R_16BF, lc, G, gs, CUBLAS_COMPUTE_32F);
    if (st != CUBLAS_STATUS_SUCCESS) {
        static int said;
        if (!said++) tern_log(TERN_LOG_WARN, "cuda moe: cublasGemmGroupedBatchedEx failed (%d); the mma path runs", (int)st);
        ok = 0;
    }
    /* cuBLAS reads the host arrays during the call: they may go now */
    free(ta); free(iv); free(ab);
    return ok;
}

/* The padded form (the file's header) for one chunk once the offsets ho are on the host; 0 when not taken
 * (nothing it may have launched is read: the caller's path rewrites xs and the outputs). work: the padded bf16 rows [E·P][H] (then the down outputs in their place), h [E·P][I]
 * and the pairs' padded rows; scratch: gate | up [E·P][2I] in bf16. */
static int mb_padded(tern__cuda *c, float *y, const float *x, int m, int k, int H, const int *ho, const int *off,
                     const int32_t *perm, const int32_t *ipos, const float *wts, const tern__cuda_w *gate,
                     const tern__cuda_w *up, const tern__cuda_w *down, int act, uint8_t *work, size_t work_bytes,
                     float *scratch) {
    if (tern__cuda_moe_pad < 0) tern__cuda_moe_pad = tern__cuda_env_int("TERN_MOE_PAD", 1);
    const int E = gate->nmat, I = gate->out, mp = m * k;
    int mx = 0;
    for (int e = 0; e < E; e++) mx = ho[e + 1] - ho[e] > mx ? ho[e + 1] - ho[e] : mx;
    int P = 16; /* the ladder 16, 24, 32, 48, 64, 96, 128 (x1.5, x1.33), then 2^j·{1, 1.25, 1.5}: 160, 192, 256, 320,
                 * 384, 512, ...: few distinct shapes, so few cuBLAS kernels to load on first use (rounding to 16 gave
                 * each layer its own: call 3 lost 23 % of a first 2048-token prefill to that). The finer steps from
                 * 128 on are for chunks of 4096+ tokens, where the batches turn compute-bound (~256 rows an expert;
                 * at ~128 they are bound by reading the weights: P 128 ran only 10 % faster than 192, NOTES (ak)) */
    while (P < mx) {
        int b = P;
        while (b & (b - 1)) b &= b - 1; /* the power of two at or below P */
        P = P < 128 ? (P % 3 == 0 ? P / 3 * 4 : P / 2 * 3) : P == b ? b + b / 4 : P == b + b / 4 ? b + b / 2 : 2 * b;
    }
    const size_t rows = (size_t)E * P;
    if (!tern__cuda_moe_pad || !mx || (tern__cuda_moe_pad == 1 && rows > 2 * (size_t)mp)) return 0;
    const size_t xs_bytes = (rows * H * 2 + 255) & ~(size_t)255, h_bytes = (rows * I * 2 + 255) & ~(size_t)255;
    if (xs_bytes + h_bytes + (size_t)mp * 4 > work_bytes || rows * 2 * I * 2 > (size_t)mp * 2 * I * 4) return 0;
    __nv_bfloat16 *xs = (__nv_bfloat16 *)work, *o = xs, *hb = (__nv_bfloat16 *)(work + xs_bytes);
    __nv_bfloat16 *gu = (__nv_bfloat16 *)scratch;
    int32_t *ipad = (int32_t *)(work + xs_bytes + h_bytes);
    /* pairs without a local expert (idx outside [0, E): expert parallelism) keep ipos's -1 for the combine; the
     * gather walks the ho[E] sorted slots that hold pairs */
    if (cudaMemcpyAsync(ipad, ipos, (size_t)mp * 4, cudaMemcpyDeviceToDevice, c->stream) != cudaSuccess) return 0;
    const long wb = ((long)ho[E] + 7) / 8;
    if (wb > 0)
        tern_launch(c->stream, mb_gather_pad, (unsigned)(wb < 65535 ? wb : 65535), 256, 0, xs, ipad, x, perm, off, E, P,
                    ho[E], k, H);
    cublasHandle_t bl = (cublasHandle_t)c->blas;
    const float one = 1.0f, zero = 0.0f;
    const long long sx = (long long)P * H, sgu = (long long)P * 2 * I, sh = (long long)P * I;
    cublasStatus_t st = cublasGemmStridedBatchedEx(bl, CUBLAS_OP_T, CUBLAS_OP_N, I, P, H, &one, gate->data, CUDA_R_16BF, H,
                                                   (long long)(gate->mat_bytes / 2), xs, CUDA_R_16BF, H, sx, &zero, gu,
                                                   CUDA_R_16BF, 2 * I, sgu, E, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasGemmStridedBatchedEx(bl, CUBLAS_OP_T, CUBLAS_OP_N, I, P, H, &one, up->data, CUDA_R_16BF, H,
                                        (long long)(up->mat_bytes / 2), xs, CUDA_R_16BF, H, sx, &zero, gu + I, CUDA_R_16BF,
                                        2 * I, sgu, E, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st == CUBLAS_STATUS_SUCCESS) {
        tern_launch(c->stream, mb_act, mb_grid(rows * I / 8), 256, 0, hb, gu, (int)rows, I, act, 0);
        st = cublasGemmStridedBatchedEx(bl, CUBLAS_OP_T, CUBLAS_OP_N, H, P, I, &one, down->data, CUDA_R_16BF, I,
                                        (long long)(down->mat_bytes / 2), hb, CUDA_R_16BF, I, sh, &zero, o, CUDA_R_16BF, H,
                                        sx, E, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    if (st != CUBLAS_STATUS_SUCCESS) { /* the gather may have run: harmless, the caller redoes the chunk */
        static int said;
        if (!said++) tern_log(TERN_LOG_WARN, "cuda moe: cublasGemmStridedBatchedEx failed (%d); the grouped path runs", (int)st);
        return 0;
    }
    tern__cuda_moe_combine(c, y, o, 1, ipad, wts, m, k, H);
    tern__cuda_moe_pad_calls++;
    return 1;
}

/* One chunk of m tokens (mp = m·k pairs) after the sort: off (device, E + 1), perm, ipos as moe_gemm.cu leaves
 * them. work: work_bytes of gemm_scratch past the sort tables (the sorted bf16 rows, 2·mp·H bytes, then the
 * calls' device pointer arrays, 9·E pointers); scratch: the caller's f32 [mp][2I]. Returns 0 when it did not run
 * (the caller takes the mma path with the same sort). */
extern "C" int tern__cuda_moe_blas(tern__cuda *c, float *y, const float *x, int m, int k, int H, const int *off,
                                   const int32_t *perm, const int32_t *ipos, const float *wts, const tern__cuda_w *gate,
                                   const tern__cuda_w *up, const tern__cuda_w *down, int act, uint8_t *work,
                                   size_t work_bytes, float *scratch) {
    const int E = gate->nmat, I = gate->out, mp = m * k;
    const size_t xs_bytes = ((size_t)2 * mp * H + 255) & ~(size_t)255;
    if (xs_bytes + sizeof(void *) * 9 * (size_t)E > work_bytes) return 0;
    if (!c->blas) {
        cublasHandle_t h;
        if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 0;
        cublasSetStream(h, c->stream);
        c->blas = h;
    }
    int *ho = (int *)malloc(sizeof(int) * (E + 1) * 3);
    const void **hp = (const void **)malloc(sizeof(void *) * 9 * (size_t)E);
    if (!ho || !hp) {
        free(ho); free(hp);
        return 0;
    }
    int *cnt = ho + E + 1, *ex = ho + 2 * (E + 1);
    __nv_bfloat16 *xs = (__nv_bfloat16 *)work, *o = xs; /* o replaces xs after gate / up */
    void **dev = (void **)(work + xs_bytes);
    __nv_bfloat16 *gu = (__nv_bfloat16 *)scratch, *hb = gu + (size_t)mp * 2 * I;
    int ok = cudaMemcpyAsync(ho, off, sizeof(int) * (E + 1), cudaMemcpyDeviceToHost, c->stream) == cudaSuccess &&
             cudaStreamSynchronize(c->stream) == cudaSuccess;
    if (ok && mb_padded(c, y, x, m, k, H, ho, off, perm, ipos, wts, gate, up, down, act, work, work_bytes, scratch)) {
        tern__cuda_moe_blas_calls++;
        tern__cuda_check(c, "moe blas");
        free(ho); free(hp);
        return 1;
    }
    if (ok && ho[E] > 0) /* the sorted slots that hold pairs (ho[E] <= mp: pairs without a local expert have none) */
        tern_launch(c->stream, mb_gather, mb_grid((size_t)ho[E] * H / 8), 256, 0, xs, x, perm, ho[E], k, H);
    int ne = 0;
    for (int e = 0; ok && e < E; e++)
        if (ho[e + 1] > ho[e]) {
            ex[ne] = e;
            cnt[ne++] = ho[e + 1] - ho[e];
        }
    if (ok && ne) { /* gate | up: problems [0, ne) gate, [ne, 2ne) up */
        const int G = 2 * ne;
        int *n2 = (int *)malloc(sizeof(int) * G);
        ok = n2 != NULL;
        for (int i = 0; ok && i < ne; i++) {
            const int e = ex[i], o0 = ho[e];
            n2[i] = n2[ne + i] = cnt[i];
            hp[i] = (const uint8_t *)gate->data + (size_t)e * gate->mat_bytes;
            hp[ne + i] = (const uint8_t *)up->data + (size_t)e * up->mat_bytes;
            hp[G + i] = hp[G + ne + i] = xs + (size_t)o0 * H;
            hp[2 * G + i] = gu + (size_t)o0 * 2 * I;
            hp[2 * G + ne + i] = gu + (size_t)o0 * 2 * I + I;
        }
        ok = ok && mb_grouped(c, G, I, n2, H, H, H, 2 * I, hp, dev);
        free(n2);
    }
    if (ok && ne) {
        tern_launch(c->stream, mb_act, mb_grid((size_t)mp * I / 8), 256, 0, hb, gu, mp, I, act, 0);
        void **dev2 = dev + 6 * (size_t)E; /* the gate | up call's arrays may still be read: a separate range */
        for (int i = 0; i < ne; i++) {
            const int o0 = ho[ex[i]];
            hp[i] = (const uint8_t *)down->data + (size_t)ex[i] * down->mat_bytes;
            hp[ne + i] = hb + (size_t)o0 * I;
            hp[2 * ne + i] = o + (size_t)o0 * H;
        }
        ok = mb_grouped(c, ne, H, cnt, I, I, I, H, hp, dev2);
    }
    if (ok) tern__cuda_moe_blas_calls++;
    if (ok) tern__cuda_moe_combine(c, y, o, 1, ipos, wts, m, k, H);
    tern__cuda_check(c, "moe blas");
    /* the uploads above read hp / ho asynchronously from pageable memory: cudaMemcpyAsync has staged them before
     * returning, so they may go */
    free(ho); free(hp);
    return ok;
}

extern "C" void tern__cuda_moe_blas_close(tern__cuda *c) {
    if (c && c->blas) cublasDestroy((cublasHandle_t)c->blas);
    if (c) c->blas = NULL;
}

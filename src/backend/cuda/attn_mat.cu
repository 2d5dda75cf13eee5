/*
 * attn_mat.cu — prefill attention for long causal runs at head dim 512 (Gemma 4's global layers) in the bf16
 * mode over BF16 pages, with the scores materialized: S = Q·Kᵀ and O = P·V as cuBLASLt strided batches and a
 * row softmax between them.
 *
 * Why: attn_prefill.cu's fa_kernel runs d 512 in two passes over V's columns (1.5x the MMAs) at ~83 TFLOP/s of
 * useful work (H200, session 23: 414 us a pass at a 2048-row chunk), and its cost grows with the keys: at an 8k
 * prompt the 5 global layers of gemma4-26b-a4b were ~a quarter of the prefill. cuBLAS runs the two products at
 * several times that rate; the price is the scores' bytes (f32 S, then bf16 P over them), bounded by taking
 * the run's rows in sub-chunks that fit gemm_scratch.
 *
 * A run (one slot; attention.cu's runs) of n rows at positions pos[0..n):
 *   1. K and V of keys [0, L) (L = the last row's position + 1) from the pages to kh, vh [nkv][L][D] bf16; a key
 *      whose page is not resident is masked (valid[b] = 0) — never read;
 *   2. per sub-chunk of R rows: qh [nh][R][D] = bf16(q) head-major (so the G heads of a KV head are G·R rows);
 *      S_j [G·R][Lc] = qh_j · K_jᵀ for each KV head j (one strided batch; Lc = the sub-chunk's last position + 1);
 *      the softmax per row (scale, softcap, key b visible iff b <= pos and valid) leaves P in bf16 at the start of
 *      the row's own S bytes (ld 2·Lc); T_j [G·Rc][D] = P_j · V_j (one strided batch of nkv), then out rows at
 *      heads h (ld nh·D) = T[h][r] (mat_out).
 * Numerics: the bf16 kernel's (bf16 Q, K, P, V, f32 accumulation) with an exact f32 softmax over the whole row
 * (no online rescaling): within the bf16 mode's attention bound, not bitwise fa_kernel. Taken for runs of at
 * least MAT_MIN_ROWS rows with no window and no spans, up to MAT_MAX_KEYS keys; TERN_CUDA_ATTN_MAT=0 keeps
 * fa_kernel. H200, session 24 (bench/NOTES.md (ak)), prefill tok/s fa_kernel -> this: gemma4-12b 8k 17.5k -> 19.6k,
 * 16k 14.8k -> 17.1k; gemma4-26b-a4b 16k 25.0k -> 29.2k, warm 2k +3 %. Session 23's form lost ~8 % at 8k: exact key
 * counts gave every chunk new GEMM shapes (now padded to MAT_KQ), and P·V ran as G batches of nkv products of a
 * sub-chunk's rows — 16 tiles a call at an 8k prompt's 256-row sub-chunks — where one batch of nkv products of
 * G·Rc rows now fills the GPU.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"

#include <cuda_bf16.h>
#include <math.h>

#define MAT_MAX_KEYS 16384 /* mat_softmax: 256 threads x 64 scores */
#define MAT_MIN_ROWS 128
#define MAT_KQ 1024 /* key counts rounded up to this */

extern "C" {
int tern__cuda_attn_mat = -1; /* -1 unread (TERN_CUDA_ATTN_MAT, default 1), 0 never, 1 on */
unsigned long long tern__cuda_attn_mat_calls = 0; /* runs served here (tests check the path ran) */
int tern__cuda_attn_mat_rmax = 0; /* > 0: at most this many rows a sub-chunk (tests: several sub-chunks) */
}

/* the layout kernels' grid-stride walk over [A][B][C] vectors (C per row of D elements): f(a, b, c, a·B + b) */
template <class F> __device__ __forceinline__ void mat_walk(int A, int B, int C, F f) {
    const size_t total = (size_t)A * B * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C);
        const size_t ab = i / C;
        f((int)(ab / B), (int)(ab % B), c, ab);
    }
}

/* kh, vh [nkv][Lp][D] from the pages [blocks][bs][nkv][D] for keys b < L (Lp >= L: zeros past L, so the padding
 * columns multiply as zeros); valid[b] = 0 where key b's page is not resident, or b >= L */
__global__ void mat_gather(__nv_bfloat16 *kh, __nv_bfloat16 *vh, int *valid, const __nv_bfloat16 *kp,
                           const __nv_bfloat16 *vp, const int32_t *btrow, int max_blocks, int bs, int nkv, int D, int L,
                           int Lp) {
    pdl_start();
    mat_walk(nkv, Lp, D >> 3, [&](int j, int b, int c, size_t jb) {
        const int bi = b / bs, blk = b < L && bi < max_blocks ? btrow[bi] : -1;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
        if (blk >= 0) {
            const size_t off = (((size_t)blk * bs + b % bs) * nkv + j) * D;
            kv = ((const uint4 *)(kp + off))[c];
            vv = ((const uint4 *)(vp + off))[c];
        }
        ((uint4 *)(kh + jb * D))[c] = kv;
        ((uint4 *)(vh + jb * D))[c] = vv;
        if (j == 0 && c == 0) valid[b] = blk >= 0;
    });
}

/* qh[h][r][d] = bf16(q[r0 + r][h][d]) for r < R */
__global__ void mat_q(__nv_bfloat16 *qh, const float *q, int R, int nh, int D) {
    pdl_start();
    mat_walk(nh, R, D >> 3, [&](int h, int r, int c, size_t hr) {
        const float4 *src = (const float4 *)(q + ((size_t)r * nh + h) * D) + 2 * c;
        const float4 a = src[0], b = src[1];
        __nv_bfloat162 v[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                               __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
        ((uint4 *)(qh + hr * D))[c] = *(const uint4 *)v;
    });
}

/* out[r][h][d] (ld nh·D) = T[h][r][d] for r < R: the heads' products back in the rows' layout, 4 floats a thread */
__global__ void mat_out(float *out, const float *T, int R, int nh, int D) {
    pdl_start();
    mat_walk(nh, R, D >> 2, [&](int h, int r, int c, size_t hr) {
        ((float4 *)(out + ((size_t)r * nh + h) * D))[c] = ((const float4 *)(T + hr * D))[c];
    });
}

__device__ __forceinline__ float mat_block_reduce(float v, bool is_max, float *red) {
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    __syncthreads(); /* red is reused: every reader of the previous round is done */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) v = is_max ? fmaxf(v, red[w]) : v + red[w];
    return v;
}

/* One S row per block: row i of the sub-chunk's [nh·R] rows (head h = i / R, row r = i % R, the G heads of KV
 * head j being rows [j·G·R, (j+1)·G·R) — qh's order). P = softmax(scale·S (softcapped)) over the visible keys,
 * 0 elsewhere, in bf16 over the row's first 2·Lc bytes: every thread has read its scores before any is written.
 * PER scores a thread (blockDim.x·PER >= Lc; mat_softmax_go sizes the block to the row: a 512-thread block for a
 * 2048-key row ran ~0.6 TB/s, H200 session 23) */
template <int PER>
__global__ void __launch_bounds__(256) mat_softmax(float *S, const int32_t *pos, const int *valid, int R, int Lc,
                                                  float scale, float softcap) {
    pdl_start();
    __shared__ float red[8];
    const int i = blockIdx.x, r = i % R, T = blockDim.x;
    float *row = S + (size_t)i * Lc;
    const int p = pos[r];
    float v[PER];
    float m = -INFINITY;
#pragma unroll
    for (int e = 0; e < PER; e++) {
        const int b = threadIdx.x + e * T;
        float s = -INFINITY;
        if (b < Lc && b <= p && valid[b]) {
            s = row[b] * scale;
            if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
        }
        v[e] = s;
        m = fmaxf(m, s);
    }
    m = mat_block_reduce(m, true, red);
    float l = 0.0f;
#pragma unroll
    for (int e = 0; e < PER; e++) {
        v[e] = v[e] == -INFINITY ? 0.0f : __expf(v[e] - m);
        l += v[e];
    }
    l = mat_block_reduce(l, false, red); /* its barriers also order every read of row above before the writes */
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    __nv_bfloat16 *pr = (__nv_bfloat16 *)row;
#pragma unroll
    for (int e = 0; e < PER; e++) {
        const int b = threadIdx.x + e * T;
        if (b < Lc) pr[b] = __float2bfloat16_rn(v[e] * inv);
    }
}

/* the softmax of rows rows of Lc (<= MAT_MAX_KEYS) scores: 128 threads a row holding 4..64 each, 256 x 64 past 8192 */
static void mat_softmax_go(tern__cuda *c, float *S, const int32_t *pos, const int *valid, int rows, int R, int Lc,
                           float scale, float softcap) {
#define MAT_SM(PER, T) tern_launch(c->stream, mat_softmax<PER>, (unsigned)rows, T, 0, S, pos, valid, R, Lc, scale, softcap)
    if (Lc <= 512) MAT_SM(4, 128);
    else if (Lc <= 1024) MAT_SM(8, 128);
    else if (Lc <= 2048) MAT_SM(16, 128);
    else if (Lc <= 4096) MAT_SM(32, 128);
    else if (Lc <= 8192) MAT_SM(64, 128);
    else MAT_SM(64, 256);
#undef MAT_SM
}

/* the last of n positions + 1 (host copies) */
static long pos_end(const int32_t *pos, int n) {
    long e = 0;
    for (int r = 0; r < n; r++) e = pos[r] + 1 > e ? pos[r] + 1 : e;
    return e;
}

/* 1 when this run took the materialized path (out written), 0 when the caller must take another */
extern "C" int tern__cuda_attn_mat_run(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                                       const tern_kv_layer *kv, float scale, float softcap) {
    if (tern__cuda_attn_mat < 0) tern__cuda_attn_mat = tern__cuda_env_int("TERN_CUDA_ATTN_MAT", 1) != 0;
    const int D = kv->head_dim, n = rows->n, nkv = kv->n_head_kv;
    if (!tern__cuda_attn_mat || c->compute != TERN_COMPUTE_BF16 || D != 512 || n < MAT_MIN_ROWS || kv->window > 0 ||
        kv->latent || kv->kf.kind != TERN_KV_BF16 || kv->vf.kind != TERN_KV_BF16 || nkv <= 0 || nh % nkv ||
        rows->vis_lo_host || rows->vis_lo || !rows->pos_host)
        return 0;
    const int G = nh / nkv;
    const long L = pos_end(rows->pos_host, n);
    /* key counts padded to MAT_KQ and sub-chunks of a power of two rows: few distinct GEMM shapes, so cuBLASLt's
     * heuristic and its kernels' first-use loading are paid once per shape, not per chunk (H200, session 23: with
     * the exact key count every chunk of an 8k prompt ran new shapes and the 8k prefill lost ~8 %); the padding
     * keys are zeros and masked */
    const long Lp = (L + MAT_KQ - 1) / MAT_KQ * MAT_KQ;
    if (L < 1 || Lp > MAT_MAX_KEYS) return 0;
    /* gemm_scratch: kh | vh | valid | qh | S | T (all 256-byte aligned) */
    const size_t kvb = ((size_t)nkv * Lp * D * 2 + 255) & ~(size_t)255, vb = ((size_t)Lp * 4 + 255) & ~(size_t)255;
    const size_t fixed = 2 * kvb + vb, avail = c->gemm_scratch_bytes;
    const size_t per_row = (size_t)nh * D * 2 + (size_t)nh * Lp * 4 + (size_t)nh * D * 4; /* qh + S at the longest Lc + T */
    if (fixed + 512 * 2 >= avail) return 0;
    long R = (long)((avail - fixed - 512) / per_row);
    if (R < 64) return 0;
    long p2 = 64;
    while (p2 * 2 <= R) p2 *= 2;
    R = p2;
    if (R > n) R = n;
    if (tern__cuda_attn_mat_rmax > 0 && R > tern__cuda_attn_mat_rmax) R = tern__cuda_attn_mat_rmax;
    cudaSetDevice(c->device);
    uint8_t *base = (uint8_t *)c->gemm_scratch;
    __nv_bfloat16 *kh = (__nv_bfloat16 *)base, *vh = (__nv_bfloat16 *)(base + kvb);
    int *valid = (int *)(base + 2 * kvb);
    __nv_bfloat16 *qh = (__nv_bfloat16 *)(base + fixed);
    const int slot = rows->slot_host[0];
    const int32_t *btrow = kv->block_table + (size_t)slot * kv->max_blocks;
    tern_launch(c->stream, mat_gather, tern_grid256((size_t)nkv * Lp * (D / 8), 65535), 256, 0, kh, vh, valid,
                (const __nv_bfloat16 *)kv->k, (const __nv_bfloat16 *)kv->v, btrow, kv->max_blocks, kv->block_size, nkv,
                D, (int)L, (int)Lp);
    for (long r0 = 0; r0 < n; r0 += R) {
        const int Rc = (int)(n - r0 < R ? n - r0 : R);
        /* <= Lp; the columns past the last position are masked */
        const long Lc = (pos_end(rows->pos_host + r0, Rc) + MAT_KQ - 1) / MAT_KQ * MAT_KQ;
        const size_t qb = ((size_t)nh * Rc * D * 2 + 255) & ~(size_t)255;
        float *S = (float *)((uint8_t *)qh + qb);
        tern_launch(c->stream, mat_q, tern_grid256((size_t)nh * Rc * (D / 8), 65535), 256, 0, qh,
                    q + (size_t)r0 * nh * D, Rc, nh, D);
        /* S_j [G·Rc][Lc] = qh_j · K_jᵀ: C = Aᵀ·B with A = K_j (D x Lc, ld D), B = qh_j (D x G·Rc) */
        if (tern__cuda_lt_gemm_x(c, S, CUDA_R_32F, (int)Lc, (long long)G * Rc * Lc, kh, 0, (long long)Lp * D, qh, D,
                                 (long long)G * Rc * D, (int)Lc, G * Rc, D, nkv, 0.0f) != TERN_OK)
            return 0; /* earlier sub-chunks may have written out: the caller redoes the whole run */
        mat_softmax_go(c, S, rows->pos + r0, valid, nh * Rc, Rc, (int)Lc, scale, softcap);
        /* T_j [G·Rc][D] = P_j · V_j for each KV head j (one strided batch: the G heads of a KV head are one product
         * of G·Rc rows): C = A·B with A = V_j (D x Lc, ld D, not transposed), B = P_j (Lc x G·Rc, ld 2·Lc); then
         * out rows r0.. at head h (ld nh·D) = T[h][r]. As G batches of nkv products of Rc rows writing out's
         * columns in place, an 8k prompt's sub-chunks of 256 rows gave each call 16 tiles of 128 x 128 for the
         * whole GPU (132 SMs) */
        float *T = S + (size_t)nh * Rc * Lc;
        if (tern__cuda_lt_gemm_x(c, T, CUDA_R_32F, D, (long long)G * Rc * D, vh, 1, (long long)Lp * D,
                                 (const __nv_bfloat16 *)S, (int)(2 * Lc), (long long)2 * G * Rc * Lc, D, G * Rc, (int)Lc,
                                 nkv, 0.0f) != TERN_OK)
            return 0;
        tern_launch(c->stream, mat_out, tern_grid256((size_t)nh * Rc * (D / 4), 65535), 256, 0,
                    out + (size_t)r0 * nh * D, (const float *)T, Rc, nh, D);
    }
    tern__cuda_attn_mat_calls++;
    tern__cuda_check(c, "attention (materialized)");
    return 1;
}

/*
 * gemv.cu — matrix-vector products for decode (n <= 16 rows) over every stored weight format:
 * F32, F16, BF16, MLX affine Q (bits 2,3,4,5,6,8; groups 32/64/128; scales F32/F16/BF16) and
 * block-scaled FP8 (e4m3 bytes, one F32 scale per block of rows x columns; per chunk of 32
 * codes acc += s·Σ e4m3·x, exact e4m3 decode by a bit move and one multiply by 2^120).
 * Also the dequantizer the prefill GEMM uses, and the matmul dispatcher (GEMV vs GEMM).
 *
 * Memory-bound design: a warp owns R weight rows; lane l walks "chunks" l, l+32, ... of the
 * row (a chunk is 16-32 bytes: 32 codes of a Q row = `bits` 32-bit words, 16 bf16/f16, 8 f32),
 * loads them with the widest aligned vector loads (all R rows before any math), decodes in
 * registers and multiplies with NX activation rows. One activation row (NX = 1) is read through
 * L1 by every warp; with NX > 1 the block stages a tile of x (32 chunks x NX rows) in shared
 * memory, laid out [row][float4 of the chunk][lane] so that every lane's 128-bit read is
 * conflict-free, and each weight element is decoded once for all NX rows.
 *
 * Arithmetic is f32 (no half/bf16 math). Q rows use the group factorisation: per chunk (32
 * codes, inside one group) acc += s·Σ q·x + b·Σ x, so a code costs 2 instructions to decode
 * plus one FMA per activation row. Decoding 4- and 8-bit codes: a code at bit 4p (8p) of a
 * word is and-ed out in place and or-ed with the exponent 150 - 4p (150 - 8p); that float is
 * exactly 2^(23-4p) + q, so one subtraction gives q exactly (LOP3 + FADD, no shift); the upper
 * half-word is shifted down once. Other widths shift codes across word boundaries.
 *
 * One activation row of Q weights takes gemv_q1_kernel instead: x staged per block in shared
 * memory with a swizzle (the L1 path above reads 128 contiguous bytes per lane, 32 cache lines
 * per warp instruction), 2 chunks of 2 rows in flight per lane. Measured on the H200 it is
 * still far from the bandwidth floor (q4 8192x8192: 31 us vs ~8 us of bytes): see bench/NOTES.md.
 *
 * The same kernel serves MoE experts (`idx` != NULL, NX = 1): blockIdx.y is a (row, expert)
 * pair or a row whose k expert terms are summed with router weights (down projection), so no
 * atomics and the result does not depend on the batch. Shapes whose rows are not chunk-aligned
 * take a simple warp-per-row kernel with the generic element decoder (the spec's rule).
 * The one-row GEMV (gemv1_kernel) and the fused MoE gate/up/act (moe_gateup_kernel) live in
 * gemv1.cu; the chunk decoding all of them share is gemv_chunk.cuh.
 */
#include "backend/cuda/gemv_chunk.cuh"

#include <stdlib.h>

struct GemvArgs {
    const uint8_t *data, *scales, *biases;
    size_t mat_bytes, mat_bytes_s;
    int out, in, gs, gs_shift, sdtype, nmat;
    int e;                 /* dense: matrix index */
    const int32_t *idx;    /* expert mode when non-NULL */
    const float *wts;
    int ksum;              /* terms summed per output row (expert down: k; else 1) */
    const float *x;
    int xstride, xdiv;
    float *y;
    int ystride;
    int n;                 /* dense: activation rows (<= NX) */
    int br, ncs;           /* block FP8: rows per scale block, scale columns per matrix row block */
};

template <int KIND, int NX> __global__ void __launch_bounds__(128) gemv_kernel(GemvArgs a) {
    pdl_start();
    using K = Kind<KIND>;
    constexpr int R = Rows<KIND, NX>::R, CH = K::CH, C4 = CH / 4;
    constexpr bool STAGE = NX > 1;
    extern __shared__ float4 xs4[]; /* STAGE: [NX][C4][32] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int o0 = (blockIdx.x * 4 + warp) * R;
    const bool active = o0 < a.out;
    if (!STAGE && !active) return;
    const int p = blockIdx.y, nch = a.in / CH;
    const size_t rb = (size_t)a.in * (K::Q ? KIND : K::EB) / (K::Q ? 8 : 1);
    const int ng = K::Q ? a.in >> a.gs_shift : 0;
    float acc[R][NX], eacc[R]; /* eacc: expert mode (NX == 1) sums coef * term over the k terms */
#pragma unroll
    for (int r = 0; r < R; r++) eacc[r] = 0.0f;
    int orow[R];
#pragma unroll
    for (int r = 0; r < R; r++) orow[r] = o0 + r < a.out ? o0 + r : (active ? o0 : 0); /* clamp: recompute */

    const int terms = a.idx ? a.ksum : 1;
    for (int j = 0; j < terms; j++) {
        int e = a.e;
        float coef = 1.0f;
        const float *xb = a.x;
        if (a.idx) {
            const int pair = p * a.ksum + j;
            e = a.idx[pair];
            if (e < 0 || e >= a.nmat) continue;
            if (a.wts) coef = a.wts[pair];
            xb = a.x + (size_t)(pair / a.xdiv) * a.xstride;
        }
        const uint8_t *mat = a.data + (size_t)e * a.mat_bytes;
        const uint8_t *smat = a.scales + (size_t)e * a.mat_bytes_s, *bmat = a.biases + (size_t)e * a.mat_bytes_s;
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NX; t++) acc[r][t] = 0.0f;
        for (int c0 = 0; c0 < nch; c0 += 32) {
            const int c = c0 + lane;
            const bool ok = active && c < nch;
            uint32_t wd[R][K::WORDS];
            float s[R], b[R];
            if (ok) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    load_chunk<KIND>(mat + (size_t)orow[r] * rb, c, wd[r]);
                    if constexpr (K::Q) {
                        const int gi = orow[r] * ng + ((c * 32) >> a.gs_shift);
                        s[r] = load_s(smat, a.sdtype, (size_t)gi);
                        b[r] = load_s(bmat, a.sdtype, (size_t)gi);
                    } else if constexpr (K::F8) {
                        s[r] = ((const float *)smat)[(size_t)(orow[r] / a.br) * a.ncs + (size_t)(c * 32 / a.gs)];
                    }
                }
            }
            if constexpr (STAGE) { /* x tile: chunks c0 .. c0+31 of every activation row */
                __syncthreads();
                const int nf = (nch - c0 < 32 ? nch - c0 : 32) * C4;
                for (int i = threadIdx.x; i < NX * 32 * C4; i += blockDim.x) {
                    const int t = i / (32 * C4), f = i % (32 * C4);
                    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
                    if (t < a.n && f < nf) v = __ldg((const float4 *)(xb + (size_t)t * a.xstride + (size_t)c0 * CH) + f);
                    xs4[(t * C4 + f % C4) * 32 + f / C4] = v;
                }
                __syncthreads();
            }
            if (!ok) continue;
            float qa[R][NX], xsum[NX];
#pragma unroll
            for (int t = 0; t < NX; t++) {
                xsum[t] = 0.0f;
#pragma unroll
                for (int r = 0; r < R; r++) qa[r][t] = 0.0f;
            }
#pragma unroll
            for (int k4 = 0; k4 < C4; k4++) {
                float xv[NX][4];
#pragma unroll
                for (int t = 0; t < NX; t++) {
                    float4 u;
                    if constexpr (STAGE) u = xs4[(t * C4 + k4) * 32 + lane];
                    else u = __ldg((const float4 *)(xb + (size_t)c * CH) + k4);
                    xv[t][0] = u.x; xv[t][1] = u.y; xv[t][2] = u.z; xv[t][3] = u.w;
                    if constexpr (K::Q) xsum[t] += (u.x + u.y) + (u.z + u.w);
                }
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float w = elem<KIND>(wd[r], 4 * k4 + i);
#pragma unroll
                        for (int t = 0; t < NX; t++) qa[r][t] = fmaf(w, xv[t][i], qa[r][t]);
                    }
            }
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < NX; t++) {
                    if constexpr (K::Q) acc[r][t] += fmaf(s[r], qa[r][t], b[r] * xsum[t]);
                    else if constexpr (K::F8) acc[r][t] = fmaf(s[r], qa[r][t], acc[r][t]);
                    else acc[r][t] += qa[r][t];
                }
        }
        if constexpr (NX == 1) {
#pragma unroll
            for (int r = 0; r < R; r++) eacc[r] = fmaf(coef, acc[r][0], eacc[r]); /* dense: 1*acc + 0, exact */
        }
    }
    if (!active) return;
    if constexpr (NX == 1) {
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][0] = eacc[r];
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NX; t++) acc[r][t] = warp_sum(acc[r][t]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (o0 + r >= a.out) break;
#pragma unroll
            for (int t = 0; t < NX; t++)
                if (t < a.n || (a.idx && t == 0)) a.y[(size_t)(p + t) * a.ystride + o0 + r] = acc[r][t];
        }
    }
}

/* Single activation row, Q weights: the block stages x for U*32 chunks at a time in shared
 * memory (coalesced 128-bit loads; float4 f of a 32-chunk tile is stored at f with its low 3
 * bits xor-ed by bits 3..5, so that both the stores and each lane's reads of its own chunk are
 * conflict-free), and every lane keeps U chunks of each of its R rows in flight. */
__device__ __forceinline__ int swz(int f) { return (f & ~7) | ((f & 7) ^ ((f >> 3) & 7)); }

template <int KIND, int U, int R> __global__ void __launch_bounds__(128) gemv_q1_kernel(GemvArgs a) {
    pdl_start();
    constexpr int W = KIND, C4 = 8;
    __shared__ float4 xs[U][32 * C4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int o0 = (blockIdx.x * 4 + warp) * R;
    const bool active = o0 < a.out;
    const int nch = a.in / 32, ng = a.in >> a.gs_shift;
    const size_t rb = (size_t)a.in * KIND / 8;
    const uint8_t *mat = a.data + (size_t)a.e * a.mat_bytes;
    const uint8_t *smat = a.scales + (size_t)a.e * a.mat_bytes_s, *bmat = a.biases + (size_t)a.e * a.mat_bytes_s;
    int orow[R];
    const uint8_t *rowp[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        orow[r] = o0 + r < a.out ? o0 + r : (active ? o0 : 0);
        rowp[r] = mat + (size_t)orow[r] * rb;
    }
    auto sp = [&](int) { return smat; };
    auto bp = [&](int) { return bmat; };
    const RoundScales rq = {ng, a.gs_shift, a.sdtype, 0, 0, a.gs};
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int c0 = 0; c0 < nch; c0 += 32 * U) {
        uint32_t wd[U][R][W];
        float s[U][R], b[U][R];
        load_round<KIND, R, U>(rowp, sp, bp, orow, c0, lane, nch, active, rq, wd, s, b);
        __syncthreads();
        for (int i = threadIdx.x; i < U * 32 * C4; i += blockDim.x) {
            const int u = i / (32 * C4), f = i % (32 * C4);
            const size_t el = (size_t)(c0 + u * 32) * 32 + (size_t)f * 4;
            xs[u][swz(f)] = el < (size_t)a.in ? __ldg((const float4 *)(a.x + el)) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * 32 + lane;
            if (!active || c >= nch) continue;
            float qa[R], xsum = 0.0f;
            chunk_dot<KIND, R, C4, true>(wd[u], [&](int k4) { return xs[u][swz(lane * C4 + k4)]; }, qa, xsum);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] += fmaf(s[u][r], qa[r], b[u][r] * xsum);
        }
    }
    if (!active) return;
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; r++)
            if (o0 + r < a.out) a.y[o0 + r] = acc[r];
}

/* Fallback for rows that are not chunk-aligned: warp per output row, generic decoder. */
__global__ void gemv_generic_kernel(GemvArgs a, WDesc wdsc) {
    pdl_start();
    const int lane = threadIdx.x & 31;
    const int o = blockIdx.x * 4 + (threadIdx.x >> 5), p = blockIdx.y;
    if (o >= a.out) return;
    const int terms = a.idx ? a.ksum : 1, nx = a.idx ? 1 : a.n;
    for (int t = 0; t < nx; t++) {
        float acc = 0.0f;
        for (int j = 0; j < terms; j++) {
            int e = a.e;
            float coef = 1.0f;
            const float *xb = a.x + (size_t)t * a.xstride;
            if (a.idx) {
                const int pair = p * a.ksum + j;
                e = a.idx[pair];
                if (e < 0 || e >= a.nmat) continue;
                if (a.wts) coef = a.wts[pair];
                xb = a.x + (size_t)(pair / a.xdiv) * a.xstride;
            }
            float part = 0.0f;
            for (int i = lane; i < a.in; i += 32) part = fmaf(welem(wdsc, e, o, i), xb[i], part);
            acc = fmaf(coef, part, acc);
        }
        acc = warp_sum(acc);
        if (lane == 0) a.y[(size_t)(p + t) * a.ystride + o] = acc;
    }
}

/* rows per block and shared bytes of gemv_kernel<KIND, NX> (host mirror of Rows/Kind) */
static int rows_of(int kind, int nx) { return (kind <= 8 && nx <= 4) ? 4 : 2; }
static size_t smem_of(int kind, int nx) { return nx > 1 ? (size_t)nx * 32 * chunk_of(kind) * sizeof(float) : 0; }

template <int KIND, int NX> static void go(cudaStream_t st, dim3 grid, const GemvArgs &a) {
    tern_launch(st, gemv_kernel<KIND, NX>, grid, 128, smem_of(KIND, NX), a);
}

template <int KIND> static void launch_kind(cudaStream_t st, dim3 grid, const GemvArgs &a, int nx) {
    switch (nx) {
    case 1: go<KIND, 1>(st, grid, a); break;
    case 2: go<KIND, 2>(st, grid, a); break;
    case 4: go<KIND, 4>(st, grid, a); break;
    case 8: go<KIND, 8>(st, grid, a); break;
    default: go<KIND, 16>(st, grid, a); break;
    }
}

/* Raise the dynamic shared-memory limit of the instances that stage more than 48 KB (done
 * once at backend open, never inside a graph capture). */
template <int KIND> static void allow_smem() {
    cudaFuncSetAttribute(gemv_kernel<KIND, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_of(KIND, 16));
}
extern "C" void tern__cuda_gemv_init(tern__cuda *c) {
    (void)c;
    allow_smem<2>(); allow_smem<3>(); allow_smem<4>(); allow_smem<5>(); allow_smem<6>(); allow_smem<8>();
    allow_smem<9>(); allow_smem<16>(); allow_smem<17>(); allow_smem<32>();
    tern__cuda_gemv1_init();
    tern__cuda_qmma_init(c);
    tern__cuda_gemv_mma_init(c);
    tern__cuda_gemv_xr_init(c);
    tern__cuda_qg4_init(c);
    tern__cuda_qgemm_init(c);
    tern__cuda_moe_gemm_init(c);
    tern__cuda_sgemm_init(c);
    cudaGetLastError();
}

/* Kernel choice for one dense activation row of Q weights (bench_cuda sets it to compare):
 * 0 = gemv_kernel, 1..4 = gemv_q1_kernel with (U, R) = (1,4), (2,4), (4,4), (2,2).
 * H200, 8192x8192 q4: 41.1 / 39.8 / 41.0 / 68.7 / 31.4 us; 4 is best on every shape measured
 * (more warps beat more rows or chunks per warp). 5 = gemv1_kernel (x staged once per block,
 * 4 chunks of 2 rows in flight per lane), the default for every format. */
extern "C" int tern__cuda_gemv_q1_variant;
int tern__cuda_gemv_q1_variant = 5;

template <int KIND> static void launch_q1(cudaStream_t st, const GemvArgs &a, int v) {
    const int R = v >= 4 ? 2 : 4;
    const dim3 grid((unsigned)((a.out + 4 * R - 1) / (4 * R)));
    switch (v) {
    case 1: tern_launch(st, gemv_q1_kernel<KIND, 1, 4>, grid, 128, 0, a); break;
    case 3: tern_launch(st, gemv_q1_kernel<KIND, 4, 4>, grid, 128, 0, a); break;
    case 4: case 5: tern_launch(st, gemv_q1_kernel<KIND, 2, 2>, grid, 128, 0, a); break;
    default: tern_launch(st, gemv_q1_kernel<KIND, 2, 4>, grid, 128, 0, a); break;
    }
}

static void launch(tern__cuda *c, GemvArgs &a, const tern__cuda_w *w, int gy, int nx) {
    const int kind = kind_of(w), ch = chunk_of(kind);
    const bool aligned = a.in % ch == 0 && ((uintptr_t)a.x & 15) == 0 && a.xstride % 4 == 0 &&
                         (kind != 9 || a.gs % 32 == 0); /* FP8: a chunk must sit in one scale block */
    const int v = tern__cuda_gemv_q1_variant;
    if (aligned && nx == 1 && !a.idx && kind <= 8 && v > 0) { /* 5 here: gemv1 did not fit */
        switch (kind) {
        case 2: launch_q1<2>(c->stream, a, v); break;
        case 3: launch_q1<3>(c->stream, a, v); break;
        case 4: launch_q1<4>(c->stream, a, v); break;
        case 5: launch_q1<5>(c->stream, a, v); break;
        case 6: launch_q1<6>(c->stream, a, v); break;
        default: launch_q1<8>(c->stream, a, v); break;
        }
        tern__cuda_check(c, "gemv_q1");
        return;
    }
    if (!aligned) {
        dim3 grid((unsigned)((a.out + 3) / 4), (unsigned)gy);
        tern_launch(c->stream, gemv_generic_kernel, grid, 128, 0, a, make_wdesc(w));
        tern__cuda_check(c, "gemv_generic");
        return;
    }
    const int rpb = 4 * rows_of(kind, nx);
    dim3 grid((unsigned)((a.out + rpb - 1) / rpb), (unsigned)gy);
    by_kind(kind, [&](auto K) { launch_kind<K.value>(c->stream, grid, a, nx); });
    tern__cuda_check(c, "gemv");
}

static GemvArgs base_args(const tern__cuda_w *w) {
    GemvArgs a = {};
    a.data = (const uint8_t *)w->data;
    a.scales = (const uint8_t *)w->scales;
    a.biases = (const uint8_t *)w->biases;
    a.mat_bytes = w->mat_bytes;
    a.mat_bytes_s = w->mat_bytes_s;
    a.out = w->out;
    a.in = w->in;
    a.gs = w->group_size;
    a.gs_shift = w->group_size == 32 ? 5 : w->group_size == 64 ? 6 : 7;
    a.br = w->dtype == TERN_DT_F8_E4M3 ? w->blk_rows : 0;
    a.ncs = a.br ? (w->in + w->group_size - 1) / w->group_size : 0;
    a.sdtype = w->sdtype;
    a.nmat = 0x7fffffff;
    a.ksum = 1;
    a.xdiv = 1;
    return a;
}

/* Does one row of w (past gemv_mma) go through gemv1 in tern__cuda_gemv? Q rows much longer than
 * wide (out >= 3 in: 14336x4096, the lm head) measured faster on the older gemv_q1 (q4 27.7 vs 34.2
 * us, q8 31.3 vs 42.6 us on the H200; same bits either way), and TERN_CUDA_GEMV_Q1 variants other
 * than 5 keep the older kernels. The fused pre-norm (gemv1.cu) asks the same for its k = 1 form. */
bool tern__cuda_gemv_row_g1(const tern__cuda_w *w, const float *x) {
    const bool tall_q = w->dtype == TERN_DT_Q && w->out >= 3 * w->in;
    return tern__cuda_gemv_q1_variant == 5 && !tall_q && tern__cuda_g1_fits(&w, 1, x);
}

extern "C" void tern__cuda_gemv(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int e) {
    if (n == 1 && tern__cuda_gemv_mma(c, &y, &w, &e, 1, x, G1_PLAIN)) return;
    if (n == 1 && tern__cuda_gemv_row_g1(w, x)) {
        tern__cuda_g1_launch(c, &y, &w, &e, 1, x, G1_PLAIN);
        return;
    }
    for (int r0 = 0; r0 < n; r0 += TERN_CUDA_GEMV_MAX_N) {
        const int m = n - r0 < TERN_CUDA_GEMV_MAX_N ? n - r0 : TERN_CUDA_GEMV_MAX_N;
        GemvArgs a = base_args(w);
        a.e = e;
        a.x = x + (size_t)r0 * w->in;
        a.xstride = w->in;
        a.y = y + (size_t)r0 * w->out;
        a.ystride = w->out;
        a.n = m;
        launch(c, a, w, 1, m == 1 ? 1 : m == 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : 16);
    }
}

extern "C" void tern__cuda_gemv_expert(tern__cuda *c, float *y, int ystride, const float *x, int xdiv, int np,
                                       const int32_t *idx, const float *wts, int ksum, const tern__cuda_w *w,
                                       int nmat, int xstride) {
    if (np <= 0) return;
    if (ksum < 1) ksum = 1;
    if (xdiv < 1) xdiv = 1;
    const int step = 65535 / xdiv * xdiv; /* grid.y limit; chunks start on a token boundary */
    for (int p0 = 0; p0 < np; p0 += step) {
        GemvArgs a = base_args(w);
        a.idx = idx + (size_t)p0 * ksum;
        a.wts = wts ? wts + (size_t)p0 * ksum : NULL;
        a.ksum = ksum;
        a.nmat = nmat;
        a.x = x + (size_t)p0 * ksum / xdiv * xstride;
        a.xstride = xstride;
        a.xdiv = xdiv;
        a.y = y + (size_t)p0 * ystride;
        a.ystride = ystride;
        a.n = 1;
        launch(c, a, w, np - p0 < step ? np - p0 : step, 1);
    }
}

/* ---- dequantize rows for the GEMM path ---- */

/* blocks of 256 threads for a grid-stride walk over n items (1 .. 65536) */
static unsigned grid256(size_t n) { return tern_grid256(n, 65536); }

/* bf16 == 0: f32; 1: bf16; 2: bf16 pair hi = bf16(v), lo = bf16(v - hi) at dst and at dst plus
 * m*in elements rounded up to 256 bytes */
__global__ void dequant_kernel(void *dst, int bf16, WDesc w, int e, int r0, int m) {
    pdl_start();
    const size_t total = (size_t)m * w.in;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(i / w.in), j = (int)(i % w.in);
        const float v = welem(w, e, r0 + r, j);
        if (bf16) {
            const __nv_bfloat16 hi = __float2bfloat16_rn(v);
            ((__nv_bfloat16 *)dst)[i] = hi;
            if (bf16 == 2)
                ((__nv_bfloat16 *)dst)[((total * 2 + 255) & ~(size_t)255) / 2 + i] =
                    __float2bfloat16_rn(v - __bfloat162float(hi));
        } else {
            ((float *)dst)[i] = v;
        }
    }
}

/* The same values for Q4/Q8 (in and group size multiples of 8), 8 codes per thread: one 4- or
 * 8-byte load, one scale/bias pair, 16/32-byte stores, no per-element index math. The generic
 * kernel above spent ~340 us on a 14336x4096 q4 matrix (its per-element 64-bit divisions and
 * gathers), 8x the bytes' time. Values: fmaf(s, q, b), as welem. */
template <int BITS> __global__ void dequant_q_kernel(void *dst, int bf16, WDesc w, int e, int r0, int m) {
    pdl_start();
    const int in8 = w.in >> 3, ng = w.in / w.gs;
    const unsigned total = (unsigned)m * (unsigned)in8;
    const size_t half = (((size_t)m * w.in * 2 + 255) & ~(size_t)255) / 2; /* lo plane offset (elements) */
    const uint8_t *sc = w.scales + (size_t)e * w.mat_bytes_s, *bi = w.biases + (size_t)e * w.mat_bytes_s;
    for (unsigned t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
        const int r = (int)(t / (unsigned)in8), j0 = (int)(t % (unsigned)in8) * 8;
        const uint8_t *row = w.data + (size_t)e * w.mat_bytes + (size_t)(r0 + r) * w.row_bytes;
        const size_t gi = (size_t)(r0 + r) * ng + (size_t)(j0 / w.gs);
        const float s = load_s(sc, w.sdtype, gi), b = load_s(bi, w.sdtype, gi);
        float v[8];
        if constexpr (BITS == 4) {
            const uint32_t q = *(const uint32_t *)(row + j0 / 2);
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = fmaf(s, (float)((q >> (4 * i)) & 15u), b);
        } else {
            const uint2 q = *(const uint2 *)(row + j0);
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = fmaf(s, (float)(((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 255u), b);
        }
        const size_t o = (size_t)r * w.in + j0;
        if (!bf16) {
            float4 *d = (float4 *)((float *)dst + o);
            d[0] = make_float4(v[0], v[1], v[2], v[3]);
            d[1] = make_float4(v[4], v[5], v[6], v[7]);
            continue;
        }
        uint32_t hw[4], lw[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
            const float2 hf = __bfloat1622float2(h);
            const __nv_bfloat162 l = __floats2bfloat162_rn(v[2 * i] - hf.x, v[2 * i + 1] - hf.y);
            hw[i] = *(const uint32_t *)&h;
            lw[i] = *(const uint32_t *)&l;
        }
        __nv_bfloat16 *d = (__nv_bfloat16 *)dst;
        *(uint4 *)(d + o) = make_uint4(hw[0], hw[1], hw[2], hw[3]);
        if (bf16 == 2) *(uint4 *)(d + half + o) = make_uint4(lw[0], lw[1], lw[2], lw[3]);
    }
}

/* hi = bf16(x); lo (when non-NULL) = bf16(x - hi): x = hi + lo within 2^-16 |x| */
__global__ void f32_to_bf16_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *x, size_t n) {
    pdl_start();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
        hi[i] = h;
        if (lo) lo[i] = __float2bfloat16_rn(x[i] - __bfloat162float(h));
    }
}

/* the same for n % 8 == 0 and 16-byte aligned arrays: 8 elements a thread (two float4 loads, one 16-byte
 * store a half), bitwise the kernel above. H200, session 22: the scalar form moved ~1.6 TB/s on a
 * 2048 x 2816 chunk (29 us, 4 calls a gemma4-26b-a4b layer) */
__global__ void f32_to_bf16_v8_kernel(uint4 *hi, uint4 *lo, const float4 *x, size_t n8) {
    pdl_start();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
        const float4 a = x[2 * i], b = x[2 * i + 1];
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        __nv_bfloat16 h[8], l[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            h[j] = __float2bfloat16_rn(v[j]);
            l[j] = __float2bfloat16_rn(v[j] - __bfloat162float(h[j]));
        }
        hi[i] = *(const uint4 *)h;
        if (lo) lo[i] = *(const uint4 *)l;
    }
}

/* y = x rounded to bf16 (kept as f32; y may be x) */
__global__ void round_bf16_kernel(float *y, const float *x, size_t n) {
    pdl_start();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
}

extern "C" void tern__cuda_round_bf16(tern__cuda *c, float *y, const float *x, size_t n) {
    tern_launch(c->stream, round_bf16_kernel, grid256(n), 256, 0, y, x, n);
    tern__cuda_check(c, "round_bf16");
}

extern "C" void tern__cuda_dequant(tern__cuda *c, void *dst, int bf16, const tern__cuda_w *w, int e, int r0, int m) {
    if (w->dtype == TERN_DT_Q && (w->bits == 4 || w->bits == 8) && w->in % 8 == 0 && w->group_size % 8 == 0 &&
        (size_t)m * (w->in / 8) < (1u << 31) && m > 0) {
        const unsigned blocks = grid256((size_t)m * (w->in / 8));
        if (w->bits == 4) tern_launch(c->stream, dequant_q_kernel<4>, blocks, 256, 0, dst, bf16, make_wdesc(w), e, r0, m);
        else tern_launch(c->stream, dequant_q_kernel<8>, blocks, 256, 0, dst, bf16, make_wdesc(w), e, r0, m);
        tern__cuda_check(c, "dequant");
        return;
    }
    tern_launch(c->stream, dequant_kernel, grid256((size_t)m * w->in), 256, 0, dst, bf16, make_wdesc(w), e, r0, m);
    tern__cuda_check(c, "dequant");
}

extern "C" void tern__cuda_f32_to_bf16(tern__cuda *c, void *hi, void *lo, const float *x, size_t n) {
    if (n % 8 == 0 && (((uintptr_t)hi | (uintptr_t)lo | (uintptr_t)x) & 15) == 0)
        tern_launch(c->stream, f32_to_bf16_v8_kernel, grid256(n / 8), 256, 0, (uint4 *)hi, (uint4 *)lo,
                    (const float4 *)x, n / 8);
    else
        tern_launch(c->stream, f32_to_bf16_kernel, grid256(n), 256, 0, (__nv_bfloat16 *)hi, (__nv_bfloat16 *)lo, x, n);
    tern__cuda_check(c, "f32_to_bf16");
}

/* GEMV (weights read once per 8 rows) vs GEMM (cuBLASLt; non-native weights are dequantized
 * first, which costs a write + read of the expanded matrix): the GEMV wins below the row count
 * where re-reading the packed weight every 8 rows costs more than one expansion. */
static int gemv_limit(const tern__cuda *c, const tern__cuda_w *w) {
    const bool f32 = c->compute == TERN_COMPUTE_F32;
    switch (w->dtype) {
    case TERN_DT_F32: return 8;
    case TERN_DT_BF16: return f32 ? 16 : 8;
    case TERN_DT_F16: return 16;
    default: return f32 ? 64 : 32;
    }
}

/* --compute bf16: every path for n >= 2 rows multiplies bf16-rounded x (the GEMMs round it), so a
 * row's result does not depend on which path its batch size picked; the GEMV fallback (shapes the
 * tensor-core kernels refuse) gets x rounded first. n = 1 keeps f32 x (the decode GEMVs). */
extern "C" int tern__cuda_plain_rows(const tern__cuda *c, const tern__cuda_w *w, int n) {
    return n >= 2 && c->compute == TERN_COMPUTE_BF16 && !w->precise && !tern__cuda_bf16_split_all(c);
}

extern "C" const float *tern__cuda_plain_x(tern__cuda *c, const tern__cuda_w *w, int n, const float *x, int cols) {
    if (!tern__cuda_plain_rows(c, w, n) || (size_t)n * cols * sizeof(float) > c->gemm_scratch_bytes) return x;
    float *xr = (float *)c->gemm_scratch;
    tern__cuda_round_bf16(c, xr, x, (size_t)n * cols);
    return xr;
}

extern "C" void tern__cuda_matmul(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int e) {
    if (n <= 0) return;
    cudaSetDevice(c->device);
    if (n > 1 && tern__cuda_q4_rows(c, &y, &w, 1, x, n, G1_PLAIN, e)) return;
    if (tern__cuda_qmma(c, y, x, n, w, e)) return;
    if (tern__cuda_qgemm(c, y, x, n, w, e)) return;
    if (n > gemv_limit(c, w) && tern__cuda_gemm(c, y, x, n, w, e) == TERN_OK) return;
    tern__cuda_gemv(c, y, tern__cuda_plain_x(c, w, n, x, w->in), n, w, e);
}

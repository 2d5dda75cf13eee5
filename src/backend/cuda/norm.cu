/*
 * norm.cu — the small memory-bound ops: embedding lookup (any weight format), RMSNorm, rotary
 * embedding (NeoX half-split), the elementwise family (add, mul, scale, gelu_tanh·up, silu·up,
 * softcap), bias add and strided column copy.
 *
 * All f32 with the accurate libm-style device functions (sqrtf, tanhf, expf, sincosf: no
 * --use_fast_math, no rsqrtf/__expf), so results match the scalar reference to a few ulp.
 * RMSNorm: one block per row, sum of squares reduced in f32 through shared memory; rmsnorm_add is
 * the same kernel adding the normalised row into the residual (and scaling it by a device scalar);
 * rmsnorm_n runs the rows of up to three tensors (Gemma 4's q, k, v head norms) in one launch.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"

static unsigned nblocks(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

__global__ void embed_kernel(float *y, const int32_t *ids, WDesc w, float scale) {
    pdl_start();
    const int r = blockIdx.x, id = ids[r];
    const bool ok = id >= 0 && id < w.out;
    for (int j = threadIdx.x; j < w.in; j += blockDim.x)
        y[(size_t)r * w.in + j] = ok ? welem(w, 0, id, j) * scale : 0.0f;
}

extern "C" void tern__cuda_embed(tern__cuda *c, float *y, const int32_t *ids, int n, const tern__cuda_w *w,
                                 float scale) {
    if (n <= 0) return;
    cudaSetDevice(c->device);
    tern_launch(c->stream, embed_kernel, n, 256, 0, y, ids, make_wdesc(w), scale);
    tern__cuda_check(c, "embed");
}

/* Register path: every element of a thread is loaded (x, w, and y for ADD) before the sum, so a row costs one
 * memory latency instead of a strided walk and a second read pass. The sum is block_rms_inv's for any block size:
 * vt = tern_rms_threads(d) virtual threads (virtual thread v: fmaf over elements v, v + vt, ... in order, warp
 * sums, the warp partials summed by one warp) with VPT of them per real thread (thread t stands in for t, t + T,
 * ..., T = blockDim.x = vt / VPT), so the bits are the same at any VPT. EV: elements a virtual thread holds (rows
 * of d <= EV·vt; wider rows take block_rms_inv and a strided walk). VPT = 1 (T = vt): the shortest row latency;
 * rmsnorm_add over many rows runs T = 128 or 256 threads a row (rms_launch<true>): a 512-thread block of ~64
 * registers a thread let two rows per SM run at once (H200: 2048 x 2816 in 35.7 us, 1.9 TB/s). */
#define RMS_V 16
/* ADD: y = (y + x·inv·w) · (s ? s[0] : 1) (rmsnorm_add), with explicit rounding so that no FMA
 * contraction makes it differ from rmsnorm + add + scale_dev */
template <bool ADD, int VPT = 1, int EV = RMS_V, bool PERM = false>
__device__ __forceinline__ void rms_row(float *yr, const float *xr, int d, const float *w, float eps, const float *s,
                                        __nv_bfloat16 *yb = nullptr, __nv_bfloat16 *yl = nullptr,
                                        const float *y0 = nullptr) {
    /* yb: also bf16(y) (ADD too); yl: also bf16(y - bf16(y)), the pair's low half (f32_to_bf16_kernel's; not ADD); y0 (ADD):
     * the residual's old values come from y0 instead of yr (out of place); PERM (not ADD): yb in q4s_pos order */
    const float *yo = y0 ? y0 : yr;
    __shared__ float red[32];
    const int T = blockDim.x, vt = T * VPT; /* vt = tern_rms_threads(d): the launcher's */
    /* element j's result from x_j, w_j and (ADD) the old y_j */
    auto put = [&](int j, float xj, float wj, float yj, float inv) {
        const float v = rms_scale(xj, inv, w != nullptr, wj);
        if constexpr (ADD) {
            const float r = res_add(yj, v, s != nullptr, s ? s[0] : 1.0f);
            yr[j] = r;
            if (yb) yb[j] = __float2bfloat16_rn(r); /* rmsnorm_add_bf16: the staged x of the GEMM that reads it */
        } else {
            yr[j] = v;
            if (yb) {
                const __nv_bfloat16 h = __float2bfloat16_rn(v); /* = f32_to_bf16_kernel's rounding */
                yb[PERM ? q4s_pos(j) : j] = h;
                if (yl) yl[j] = __float2bfloat16_rn(__fsub_rn(v, __bfloat162float(h))); /* no FMA with v's product */
            }
        }
    };
    if (d > EV * vt || vt != tern_rms_threads(d)) { /* wider rows (or another block size): the strided walk */
        const float inv = block_rms_inv([&](int j) { return xr[j]; }, d, eps, red);
        for (int j = threadIdx.x; j < d; j += T) put(j, xr[j], w ? w[j] : 0.0f, ADD ? yo[j] : 0.0f, inv);
        return;
    }
    float xv[VPT][EV], wv[VPT][EV], yv[VPT][EV];
#pragma unroll
    for (int k = 0; k < VPT; k++)
#pragma unroll
        for (int i = 0; i < EV; i++) {
            const int j = threadIdx.x + k * T + i * vt;
            const bool in = j < d;
            xv[k][i] = in ? xr[j] : 0.0f;
            wv[k][i] = VPT == 1 && in && w ? w[j] : 0.0f; /* VPT > 1: w (one row for all, cached) is read in put */
            yv[k][i] = ADD && in ? yo[j] : 0.0f;
        }
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < EV; i++)
            if (threadIdx.x + k * T + i * vt < d) ss = fmaf(xv[k][i], xv[k][i], ss);
        ss = warp_sum(ss);
        if ((threadIdx.x & 31) == 0) red[(threadIdx.x + k * T) >> 5] = ss;
    }
    const float inv = rms_inv_finish(vt, d, eps, red);
#pragma unroll
    for (int k = 0; k < VPT; k++)
#pragma unroll
        for (int i = 0; i < EV; i++) {
            const int j = threadIdx.x + k * T + i * vt;
            if (j < d) put(j, xv[k][i], VPT == 1 || !w ? wv[k][i] : w[j], yv[k][i], inv);
        }
}

/* The row kernels at a block size: VPT virtual threads a real one (rms_row); rms_launch picks it. The many-row
 * forms are bounded to the registers of several blocks a SM (without, ptxas gave the 128-thread rmsnorm_add ~180) */
#define RMS_BOUNDS(VPT, EV) __launch_bounds__((VPT) == 1 ? 512 : (EV) == 16 ? 256 : 128, (VPT) == 1 ? 1 : (EV) == 16 ? 2 : 5)
template <bool ADD, int VPT, int EV>
__global__ void RMS_BOUNDS(VPT, EV) rmsnorm_kernel(float *y, const float *x, int d, const float *w, float eps, const float *s) {
    pdl_start();
    rms_row<ADD, VPT, EV>(y + (size_t)blockIdx.x * d, x + (size_t)blockIdx.x * d, d, w, eps, s);
}

/* rmsnorm + the bf16 copy the plain-mode GEMMs stage (gemm.c), or the split GEMMs' bf16 pair (yl != NULL):
 * all from one value per element */
template <int VPT, int EV, bool PERM = false>
__global__ void RMS_BOUNDS(VPT, EV) rmsnorm_bf16_kernel(float *y, __nv_bfloat16 *yb, __nv_bfloat16 *yl, const float *x, int d, const float *w,
                                    float eps) {
    pdl_start();
    const size_t o = (size_t)blockIdx.x * d;
    rms_row<false, VPT, EV, PERM>(y + o, x + o, d, w, eps, NULL, yb + o, yl ? yl + o : nullptr);
}

/* norm_matmul's residual prologue for many rows (gemm.c, TERN_CUDA_NORM_RES_N): xo = (x + rmsnorm(h)·hw)·s as
 * rmsnorm_add, then y = rmsnorm(xo)·nw with its bf16 copy (and pair) as rmsnorm_bf16 — one launch, bitwise the two.
 * The second row pass reads back what this block wrote (every element by the thread that wrote it) */
template <int VPT, int EV, bool PERM = false>
__global__ void RMS_BOUNDS(VPT, EV) rmsnorm_res_bf16_kernel(float *xo, const float *x, const float *h, const float *hw,
                                                            const float *s, float *y, __nv_bfloat16 *yb,
                                                            __nv_bfloat16 *yl, int d, const float *nw, float eps) {
    pdl_start();
    const size_t o = (size_t)blockIdx.x * d;
    rms_row<true, VPT, EV>(xo + o, h + o, d, hw, eps, s, nullptr, nullptr, x + o);
    __syncthreads();
    rms_row<false, VPT, EV, PERM>(y + o, xo + o, d, nw, eps, NULL, yb + o, yl ? yl + o : nullptr);
}

/* ops.h rmsnorm_add2: h = h + rmsnorm(h2)·w2, then x = (x + rmsnorm(h)·w)·s — the two rmsnorm_add launches' rms_row in
 * one (the second pass reads back what this block wrote, every element by the thread that wrote it, as above): bitwise */
template <int VPT, int EV>
__global__ void RMS_BOUNDS(VPT, EV) rmsnorm_add2_kernel(float *x, float *h, const float *h2, int d, const float *w,
                                                        const float *w2, float eps, const float *s) {
    pdl_start();
    const size_t o = (size_t)blockIdx.x * d;
    rms_row<true, VPT, EV>(h + o, h2 + o, d, w2, eps, NULL);
    __syncthreads();
    rms_row<true, VPT, EV>(x + o, h + o, d, w, eps, s);
}

/* rmsnorm_n: up to three tensors of rows of one width in one launch, a block per row as rmsnorm_kernel
 * (the same rms_row: bitwise the separate launches) */
struct RmsN {
    float *y[3];
    const float *x[3], *w[3];
    int r0[4]; /* row prefix: tensor i holds blocks r0[i] .. r0[i+1]-1 */
    int d;
    float eps;
};
template <int VPT, int EV> __global__ void RMS_BOUNDS(VPT, EV) rmsnorm_n_kernel(RmsN a) {
    pdl_start();
    const int b = blockIdx.x, t2 = b >= a.r0[2], t1 = b >= a.r0[1]; /* selects, not an indexed (local) copy */
    const size_t off = (size_t)(b - (t2 ? a.r0[2] : t1 ? a.r0[1] : 0)) * a.d;
    float *y = t2 ? a.y[2] : t1 ? a.y[1] : a.y[0];
    const float *x = t2 ? a.x[2] : t1 ? a.x[1] : a.x[0], *w = t2 ? a.w[2] : t1 ? a.w[1] : a.w[0];
    rms_row<false, VPT, EV>(y + off, x + off, a.d, w, a.eps, NULL);
}

/* Launch a row kernel K<VPT, EV> (rms_launch's callers pass a small functor) over `rows` rows of d: one
 * 512/256/128-thread block a row (VPT 1), or — MANY, and at least two rows a SM — 128 threads a row standing
 * in for 4 (d >= 1024) or 2 (d >= 256) virtual ones (d <= 4096: 8 elements a virtual thread; wider rows of d <=
 * 8192 run 256 threads, VPT 2, 16 elements). H200, session 23 (ncu, gemma4-26b-a4b, 2048 x 2816): rmsnorm_add
 * 35.3 -> 28.6 us, but rmsnorm 19.7 -> 21.5 and rmsnorm_bf16 23.7 -> 28.5, so only rmsnorm_add takes it.
 * TERN_CUDA_RMS_VPT=0 keeps VPT 1 for every launch (A/B). */
static int rms_vpt_on(void) {
    static int v = -1;
    if (v < 0) v = tern__cuda_env_int("TERN_CUDA_RMS_VPT", 1) != 0;
    return v;
}
template <bool MANY, class L> static void rms_launch(tern__cuda *c, int rows, int d, L go) {
    const int vt = tern_rms_threads(d);
    if constexpr (MANY) { /* only the launches that take it instantiate the many-row forms */
        if (rms_vpt_on() && rows >= 2 * c->n_sm && vt >= 256 && d <= 8192) {
            if (vt == 256) go.template run<2, 4>(128);
            else if (d <= 4096) go.template run<4, 8>(128);
            else go.template run<2, 16>(256);
            return;
        }
    }
    go.template run<1, RMS_V>(vt);
}

template <bool ADD> struct RmsGo {
    tern__cuda *c; int rows, d; float *y; const float *x, *w; float eps; const float *s;
    template <int VPT, int EV> void run(int threads) const {
        tern_launch(c->stream, rmsnorm_kernel<ADD, VPT, EV>, rows, threads, 0, y, x, d, w, eps, s);
    }
};
template <bool PERM = false> struct RmsBf16Go {
    tern__cuda *c; int rows, d; float *y; __nv_bfloat16 *yb, *yl; const float *x, *w; float eps;
    template <int VPT, int EV> void run(int threads) const {
        tern_launch(c->stream, rmsnorm_bf16_kernel<VPT, EV, PERM>, rows, threads, 0, y, yb, yl, x, d, w, eps);
    }
};
struct RmsNGo {
    tern__cuda *c; const RmsN *a;
    template <int VPT, int EV> void run(int threads) const {
        tern_launch(c->stream, rmsnorm_n_kernel<VPT, EV>, a->r0[3], threads, 0, *a);
    }
};

extern "C" void tern__cuda_rmsnorm_bf16(tern__cuda *c, float *y, void *yb, void *yl, const float *x, int rows, int d,
                                        const float *w, float eps) {
    if (rows <= 0 || d <= 0) return;
    cudaSetDevice(c->device);
    rms_launch<false>(c, rows, d, RmsBf16Go<>{c, rows, d, y, (__nv_bfloat16 *)yb, (__nv_bfloat16 *)yl, x, w, eps});
    tern__cuda_check(c, "rmsnorm_bf16");
}

template <bool PERM = false> struct RmsResGo {
    tern__cuda *c; int rows, d; float *xo; const float *x, *h, *hw, *s; float *y; __nv_bfloat16 *yb, *yl;
    const float *nw; float eps;
    template <int VPT, int EV> void run(int threads) const {
        tern_launch(c->stream, rmsnorm_res_bf16_kernel<VPT, EV, PERM>, rows, threads, 0, xo, x, h, hw, s, y, yb, yl, d, nw,
                    eps);
    }
};
extern "C" void tern__cuda_rmsnorm_res_bf16(tern__cuda *c, float *xo, const float *x, const float *h, const float *hw,
                                            const float *s, float *y, void *yb, void *yl, int rows, int d,
                                            const float *nw, float eps) {
    if (rows <= 0 || d <= 0) return;
    cudaSetDevice(c->device);
    rms_launch<false>(c, rows, d,
                      RmsResGo<>{c, rows, d, xo, x, h, hw, s, y, (__nv_bfloat16 *)yb, (__nv_bfloat16 *)yl, nw, eps});
    tern__cuda_check(c, "rmsnorm_res_bf16");
}

/* cuda_internal.h: rmsnorm_bf16 (or, with res, rmsnorm_res_bf16) with the bf16 copy in the batch Q4 GEMM's staged
 * order (q4s_pos; d a multiple of 128): gemm.c's norm_matmul for Q4 rows (TERN_CUDA_Q4_NORM) — y and the bytes
 * q4w_stage_x would make of it, from the same f32 values with the same rounding */
extern "C" void tern__cuda_rmsnorm_q4s(tern__cuda *c, float *y, void *yb, const float *x, int rows, int d,
                                       const float *w, float eps, const tern_norm_res *res) {
    if (rows <= 0 || d <= 0) return;
    cudaSetDevice(c->device);
    if (res)
        rms_launch<false>(c, rows, d, RmsResGo<true>{c, rows, d, res->x_out, x, res->h, res->w, res->s, y,
                                                      (__nv_bfloat16 *)yb, nullptr, w, eps});
    else rms_launch<false>(c, rows, d, RmsBf16Go<true>{c, rows, d, y, (__nv_bfloat16 *)yb, nullptr, x, w, eps});
    tern__cuda_check(c, "rmsnorm_q4s");
}

/* ops.h ple_block's residual prologue (gemm.c tern__cuda_ple_block): xo = (x + rmsnorm(h)·hw)·s as rmsnorm_add (the same
 * rms_row, out of place), and bf16(xo) — f32_to_bf16's rounding — as the GEMM's staged x: one launch for rmsnorm_add
 * in place + the matmul's staging */
template <int VPT, int EV>
__global__ void RMS_BOUNDS(VPT, EV) rmsnorm_add_bf16_kernel(float *xo, const float *x, const float *h, const float *hw,
                                                            const float *s, __nv_bfloat16 *yb, int d, float eps) {
    pdl_start();
    const size_t o = (size_t)blockIdx.x * d;
    rms_row<true, VPT, EV>(xo + o, h + o, d, hw, eps, s, yb + o, nullptr, x + o);
}
struct RmsAddBfGo {
    tern__cuda *c; int rows, d; float *xo; const float *x, *h, *hw, *s; __nv_bfloat16 *yb; float eps;
    template <int VPT, int EV> void run(int threads) const {
        tern_launch(c->stream, rmsnorm_add_bf16_kernel<VPT, EV>, rows, threads, 0, xo, x, h, hw, s, yb, d, eps);
    }
};
extern "C" void tern__cuda_rmsnorm_add_bf16(tern__cuda *c, float *xo, const float *x, const float *h, const float *hw,
                                            const float *s, void *yb, int rows, int d, float eps) {
    if (rows <= 0 || d <= 0) return;
    cudaSetDevice(c->device);
    rms_launch<false>(c, rows, d, RmsAddBfGo{c, rows, d, xo, x, h, hw, s, (__nv_bfloat16 *)yb, eps});
    tern__cuda_check(c, "rmsnorm_add_bf16");
}

struct RmsAdd2Go {
    tern__cuda *c; int rows, d; float *x, *h; const float *h2, *w, *w2; float eps; const float *s;
    template <int VPT, int EV> void run(int threads) const {
        tern_launch(c->stream, rmsnorm_add2_kernel<VPT, EV>, rows, threads, 0, x, h, h2, d, w, w2, eps, s);
    }
};
extern "C" void tern__cuda_rmsnorm_add2(tern__cuda *c, float *x, float *h, const float *h2, int rows, int d,
                                        const float *w, const float *w2, float eps, const float *s) {
    if (rows <= 0 || d <= 0) return;
    cudaSetDevice(c->device);
    rms_launch<true>(c, rows, d, RmsAdd2Go{c, rows, d, x, h, h2, w, w2, eps, s}); /* rmsnorm_add's block sizes */
    tern__cuda_check(c, "rmsnorm_add2");
}

extern "C" void tern__cuda_rmsnorm_n(tern__cuda *c, int k, float *const *y, const float *const *x, const int *rows,
                                     int d, const float *const *w, float eps) {
    RmsN a = {};
    a.d = d;
    a.eps = eps;
    for (int i = 0; i < 3; i++) {
        const int r = i < k ? rows[i] : 0;
        if (i < k) { a.y[i] = y[i]; a.x[i] = x[i]; a.w[i] = w[i]; }
        a.r0[i + 1] = a.r0[i] + r;
    }
    if (a.r0[3] <= 0 || d <= 0) return;
    cudaSetDevice(c->device);
    rms_launch<false>(c, a.r0[3], d, RmsNGo{c, &a});
    tern__cuda_check(c, "rmsnorm_n");
}

extern "C" void tern__cuda_rmsnorm(tern__cuda *c, float *y, const float *x, int rows, int d, const float *w,
                                   float eps) {
    if (rows <= 0 || d <= 0) return;
    cudaSetDevice(c->device);
    rms_launch<false>(c, rows, d, RmsGo<false>{c, rows, d, y, x, w, eps, (const float *)NULL});
    tern__cuda_check(c, "rmsnorm");
}

extern "C" void tern__cuda_rmsnorm_add(tern__cuda *c, float *y, const float *x, int rows, int d, const float *w,
                                       float eps, const float *s) {
    if (rows <= 0 || d <= 0) return;
    cudaSetDevice(c->device);
    rms_launch<true>(c, rows, d, RmsGo<true>{c, rows, d, y, x, w, eps, s}); /* rmsnorm's reduction order */
    tern__cuda_check(c, "rmsnorm_add");
}

__global__ void rope_kernel(float *x, int n, int nh, int d, const int32_t *pos, const float *inv_freq,
                            float mscale) {
    pdl_start();
    const int half = d / 2;
    const size_t total = (size_t)n * nh * half;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(t % half);
        const size_t rh = t / half;
        const int r = (int)(rh / nh);
        float *v = x + rh * d;
        const float f = inv_freq[i];
        float x0 = v[i], x1 = v[i + half];
        rope_pair(x0, x1, pos[r], f);
        v[i] = x0 * mscale;
        v[i + half] = x1 * mscale;
    }
}

extern "C" void tern__cuda_rope(tern__cuda *c, float *x, int n, int nh, int d, const int32_t *pos,
                                const float *inv_freq, float mscale) {
    const size_t total = (size_t)n * nh * (d / 2);
    if (!total) return;
    cudaSetDevice(c->device);
    tern_launch(c->stream, rope_kernel, nblocks(total, 256), 256, 0, x, n, nh, d, pos, inv_freq, mscale);
    tern__cuda_check(c, "rope");
}

/* one element of the elementwise family: a = x[i], b = the second operand's element (bi) or b[0] (b0) */
__device__ __forceinline__ float ew_one(int op, float x, bool has_b, float bi, float b0, float s) {
    switch (op) {
    case TERN__EW_ADD: return x + bi;
    case TERN__EW_MUL: return x * bi;
    case TERN__EW_SCALE: return x * s;
    case TERN__EW_SCALE_DEV: return x * b0;
    case TERN__EW_GELU: return has_b ? gelu_tanh(x) * bi : gelu_tanh(x);
    case TERN__EW_SILU: return has_b ? silu(x) * bi : silu(x);
    default: return s * tanhf(x / s); /* softcap */
    }
}

__global__ void ew_kernel(int op, float *y, const float *a, const float *b, float s, size_t n) {
    pdl_start();
    const bool elem_b = b && op != TERN__EW_SCALE_DEV;
    const float b0 = op == TERN__EW_SCALE_DEV ? b[0] : 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = ew_one(op, a[i], b != nullptr, elem_b ? b[i] : 0.0f, b0, s);
}

/* the same four elements a thread (n % 4 == 0, 16-byte aligned y, a and an elementwise b): the same
 * ew_one, so the same bits. H200, session 22: the scalar form moved ~2.4 TB/s (gemma4-12b's gelu·up over
 * a 2048 x 15360 chunk: 158 us) */
__global__ void ew4_kernel(int op, float4 *y, const float4 *a, const float *b, float s, size_t n4) {
    pdl_start();
    const bool elem_b = b && op != TERN__EW_SCALE_DEV;
    const float b0 = op == TERN__EW_SCALE_DEV ? b[0] : 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 x = a[i], v = elem_b ? ((const float4 *)b)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const bool hb = b != nullptr;
        y[i] = make_float4(ew_one(op, x.x, hb, v.x, b0, s), ew_one(op, x.y, hb, v.y, b0, s), ew_one(op, x.z, hb, v.z, b0, s),
                           ew_one(op, x.w, hb, v.w, b0, s));
    }
}

extern "C" void tern__cuda_ew(tern__cuda *c, int op, float *y, const float *a, const float *b, float s, size_t n) {
    if (!n) return;
    cudaSetDevice(c->device);
    const float *be = op == TERN__EW_SCALE_DEV ? NULL : b; /* SCALE_DEV: b is a device scalar, not an array */
    if (n % 4 == 0 && (((uintptr_t)y | (uintptr_t)a | (uintptr_t)be) & 15) == 0)
        tern_launch(c->stream, ew4_kernel, nblocks(n / 4, 256), 256, 0, op, (float4 *)y, (const float4 *)a, b, s, n / 4);
    else
        tern_launch(c->stream, ew_kernel, nblocks(n, 256), 256, 0, op, y, a, b, s, n);
    tern__cuda_check(c, "elementwise");
}

/* ops.h ple_block's gate product (gemm.c tern__cuda_ple_block): y[r][j] = act(a[r][j]) · v[r·ldv + j] by ew_one — the
 * element gelu_tanh_mul / silu_mul computes — also written as bf16 (f32_to_bf16's rounding) for the next GEMM: the
 * copy_cols of v, the elementwise launch and that GEMM's staging in one launch */
__global__ void act_mul_bf16_kernel(int op, float *y, const float *a, const float *v, long ldv, __nv_bfloat16 *yb, int n,
                                    int w) {
    pdl_start();
    const size_t total = (size_t)n * w;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / w, j = i % w;
        const float val = ew_one(op, a[i], true, v[r * ldv + j], 0.0f, 0.0f);
        y[i] = val;
        yb[i] = __float2bfloat16_rn(val);
    }
}

extern "C" void tern__cuda_act_mul_bf16(tern__cuda *c, int op, float *y, const float *a, const float *v, long ldv,
                                        void *yb, int n, int w) {
    const size_t total = (size_t)n * w;
    if (!total) return;
    cudaSetDevice(c->device);
    tern_launch(c->stream, act_mul_bf16_kernel, nblocks(total, 256), 256, 0, op, y, a, v, ldv, (__nv_bfloat16 *)yb, n, w);
    tern__cuda_check(c, "act_mul_bf16");
}

__global__ void add_bias_kernel(float *y, const float *bias, int n, int d) {
    pdl_start();
    const size_t total = (size_t)n * d;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % d];
}

extern "C" void tern__cuda_add_bias(tern__cuda *c, float *y, const float *bias, int n, int d) {
    const size_t total = (size_t)n * d;
    if (!total) return;
    cudaSetDevice(c->device);
    tern_launch(c->stream, add_bias_kernel, nblocks(total, 256), 256, 0, y, bias, n, d);
    tern__cuda_check(c, "add_bias");
}

__global__ void copy_cols_kernel(float *dst, const float *src, int n, int w, int ss, int off) {
    pdl_start();
    const size_t total = (size_t)n * w;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[(i / w) * ss + off + i % w];
}

extern "C" void tern__cuda_copy_cols(tern__cuda *c, float *dst, const float *src, int n, int w, int ss, int off) {
    const size_t total = (size_t)n * w;
    if (!total) return;
    cudaSetDevice(c->device);
    tern_launch(c->stream, copy_cols_kernel, nblocks(total, 256), 256, 0, dst, src, n, w, ss, off);
    tern__cuda_check(c, "copy_cols");
}

/* Reads `bytes` (a multiple of 16) from p through L2 without keeping the values (volatile loads; nothing is written):
 * evicts what a GEMM timed by lt_gemm.c lt_tune left in L2, so each timed run streams its weights from HBM as in the
 * model, where the layers between two calls of one shape evict them. On `s` (lt_tune's stream). */
__global__ void l2_evict_kernel(const uint4 *p, size_t n) {
    pdl_start();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        asm volatile("{ .reg .b32 r<4>; ld.global.cg.v4.u32 {r0, r1, r2, r3}, [%0]; }" ::"l"(p + i));
    }
}

extern "C" void tern__cuda_l2_evict(tern__cuda *c, cudaStream_t s, const void *p, size_t bytes) {
    if (!p || bytes < 16) return;
    cudaSetDevice(c->device);
    tern_launch(s, l2_evict_kernel, tern_grid256(bytes / 16, 8 * c->n_sm), 256, 0, (const uint4 *)p, bytes / 16);
}

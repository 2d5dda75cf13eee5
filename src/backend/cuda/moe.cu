/*
 * moe.cu — mixture-of-experts: router top-k and the gated expert MLP.
 *
 * route_topk: one warp per token. Softmax over E in f32 (max-subtracted, expf), then k rounds
 * of a warp arg-max over the not-yet-chosen experts with the contract's tie rule (higher
 * probability first, then lower expert index), renormalised over the k chosen, then multiplied
 * by per_expert_scale. E <= 2048 (each lane tracks its chosen experts in a 64-bit mask).
 *
 * moe_mlp: grouped by (token, expert) pair through the expert GEMV of gemv.cu, so each pair
 * reads its expert's rows straight from the packed stack (any dtype, Q included):
 *   1. h_gate[p] = gate_{e_p} · x_{p/k},  h_up[p] = up_{e_p} · x_{p/k}     (p < n·k pairs)
 *   2. h[p] = act(h_gate[p]) * h_up[p]                        (in scratch, [n·k][2I])
 *   3. y[r] = Σ_j wts[r][j] · down_{e_rj} · h[r·k + j]        (summed in-kernel: no atomics)
 * Steps 1-2 are one launch (gemv.cu's moe_gateup_kernel: x of a token staged once per block,
 * a warp computes row o of gate and up together) with the same bits; TERN_CUDA_MOE_FUSED=0, or
 * a format it does not serve, runs them as three launches (tern__cuda_moe_fused_calls counts).
 * Deterministic and batch-invariant. In the bf16 mode, from TERN_MOE_GROUPED_MIN routed pairs on,
 * moe_gemm.cu takes the call instead: pairs sorted by expert and one grouped tensor-core GEMM per
 * projection, reading each expert once per tile of pairs (prefill, batched decode). Q4 experts on
 * the pair path take moe_mma.cu (tensor cores, expert ids read on the device) unless
 * TERN_CUDA_MOE_MMA=0.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/split_k.cuh"

#include <math.h>
#include <stdlib.h>

/* One warp per row: softmax over the E router logits, then k rounds of a warp argmax (ties to the lower
 * expert), the chosen weights renormalised and scaled per expert. PR > 0: the probabilities computed once
 * into PR registers per lane (E <= 32·PR), so a round is a register scan and five shuffle pairs; PR = 0
 * recomputes them per round (any E). Same values either way: p = expf(l - m) / sum.
 * lanes (TERN_CUDA_ROUTE_LANES, default since session 32; k <= 32): lane j keeps round j's pick in registers and
 * the k lanes renormalise, scale and store at once — the same expressions, so the same bits — instead of lane 0
 * storing each pick and then reading them back one by one (~3 dependent L2 round trips a pick: gemma4-26b-a4b's
 * route_kernel takes 6.3-7.5 us for one row, NOTES (ar)). H200, session 32, gemma4-26b-a4b bf16 b1 at 512 tok/s:
 * 249.0 / 247.5 → 251.9 / 253.4 (+1.7 %); with gemv1's L1-prefetching prologue on too (since removed, CUDA.md) 239.6 /
 * 239.9 → 243.8 / 242.3. */
template <int PR>
__device__ __forceinline__ void route_row(int32_t *idx, float *wts, const float *logits, int r, int E, int k,
                                          const float *pes, int lanes) {
    const int lane = threadIdx.x & 31;
    const float *l = logits + (size_t)r * E;
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) sum += expf(l[e] - m);
    sum = warp_sum(sum);
    float pr[PR > 0 ? PR : 1];
#pragma unroll
    for (int b = 0; b < PR; b++) pr[b] = lane + 32 * b < E ? expf(l[lane + 32 * b] - m) / sum : -1.0f;
    unsigned long long chosen = 0;
    float tot = 0.0f, mp = 0.0f; /* lanes: this lane's pick (round j = lane) */
    int me = 0;
    const bool inreg = lanes && k <= 32;
    for (int j = 0; j < k; j++) {
        float bp = -1.0f;
        int be = 0x7fffffff;
        if constexpr (PR > 0) {
#pragma unroll
            for (int b = 0; b < PR; b++)
                if (!(chosen >> b & 1ull) && pr[b] > bp) { bp = pr[b]; be = lane + 32 * b; }
        } else {
            for (int e = lane, b = 0; e < E; e += 32, b++) {
                if (chosen >> b & 1ull) continue;
                const float p = expf(l[e] - m) / sum;
                if (p > bp || (p == bp && e < be)) { bp = p; be = e; }
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float op = __shfl_xor_sync(0xffffffffu, bp, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (op > bp || (op == bp && oe < be)) { bp = op; be = oe; }
        }
        if (be < E && (be & 31) == lane) chosen |= 1ull << (be >> 5);
        if (inreg) {
            if (lane == j) {
                me = be < E ? be : 0;
                mp = bp > 0.0f ? bp : 0.0f;
            }
        } else if (lane == 0) {
            idx[(size_t)r * k + j] = be < E ? be : 0;
            wts[(size_t)r * k + j] = bp > 0.0f ? bp : 0.0f;
        }
        tot += bp > 0.0f ? bp : 0.0f;
    }
    if (inreg) {
        if (lane < k) {
            float w = tot > 0.0f ? mp / tot : 0.0f;
            if (pes) w *= pes[me];
            idx[(size_t)r * k + lane] = me;
            wts[(size_t)r * k + lane] = w;
        }
        return;
    }
    __syncwarp();
    if (lane == 0)
        for (int j = 0; j < k; j++) {
            float w = tot > 0.0f ? wts[(size_t)r * k + j] / tot : 0.0f;
            if (pes) w *= pes[idx[(size_t)r * k + j]];
            wts[(size_t)r * k + j] = w;
        }
}
template <int PR>
__global__ void route_kernel(int32_t *idx, float *wts, const float *logits, int n, int E, int k, const float *pes,
                             int lanes) {
    pdl_start();
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r < n) route_row<PR>(idx, wts, logits, r, E, k, pes, lanes);
}

/* TERN_CUDA_ROUTE_LANES (read once; default 1 since session 32, gemma4-26b-a4b b1 +1.7 %; 0: lane 0 stores the picks
 * one by one, the old form; tests set it): route_kernel's picks kept in registers (see there) */
extern "C" int tern__cuda_route_lanes;
int tern__cuda_route_lanes = -1;
static int route_lanes(void) {
    if (tern__cuda_route_lanes < 0) tern__cuda_route_lanes = tern__cuda_env_int("TERN_CUDA_ROUTE_LANES", 1) != 0;
    return tern__cuda_route_lanes;
}

extern "C" void tern__cuda_route_topk(tern__cuda *c, int32_t *idx, float *wts, const float *logits, int n, int E,
                                      int k, int mode, const float *per_expert_scale) {
    if (n <= 0 || k <= 0) return;
    if (E <= 0 || E > 2048 || k > E || mode != TERN_ROUTE_SOFTMAX_TOPK) {
        tern_log(TERN_LOG_ERROR, "cuda route_topk: unsupported E %d k %d mode %d", E, k, mode);
        return;
    }
    cudaSetDevice(c->device);
    const int ln = route_lanes();
    const unsigned g = (unsigned)((n + 3) / 4);
    if (E <= 128) tern_launch(c->stream, route_kernel<4>, g, 128, 0, idx, wts, logits, n, E, k, per_expert_scale, ln);
    else if (E <= 256) tern_launch(c->stream, route_kernel<8>, g, 128, 0, idx, wts, logits, n, E, k, per_expert_scale, ln);
    else tern_launch(c->stream, route_kernel<0>, g, 128, 0, idx, wts, logits, n, E, k, per_expert_scale, ln);
    tern__cuda_check(c, "route_topk");
}

/* norm_route_topk (ops.h) for one row: Gemma 4's MoE block head — three RMSNorms (the dense branch's post-norm, the
 * router's input, the experts' pre-norm), the router's logits and the top-k — in one launch instead of three
 * (rmsnorm_n, the router GEMV, route_kernel: ~14 us of a gemma4-26b-a4b bf16 layer serialized, NOTES (bq) 8).
 * Blocks 0 .. G-1 (G = ceil(E / 8)) each stage the router's input x[1] in shared memory and normalise it (bitwise
 * rmsnorm: block_rms_inv's sum, rms_scale's element), then each warp computes one expert's logit over f32 x (the
 * router is flagged precise: W's element as welem forms it, fmaf(s, q, b) for MLX-affine rows, times x by fmaf in
 * element order, the lanes summed by warp_sum: the router GEMV's value to within f32 rounding); the last of them to
 * arrive (split_k.cuh) runs route_row over the E logits. Blocks G .. G+2 run the three norms meanwhile (each staged,
 * then block_rms_inv + rms_scale: bitwise rmsnorm_n). KIND: 0 BF16, 1 F32, 4 / 8 MLX-affine Q4 / Q8 rows, 16-byte
 * chunks (8 / 4 / 32 / 16 elements). y[i] never aliases x[1] (the launcher checks). Every global load a thread needs
 * is issued together into registers, and the weights' ones (the router row's first round, the norm weights) before
 * pdl_wait: the first form, staging through strided loops whose loads the compiler kept behind the stores, took
 * 14.9 us (ncu, H100) against 13.7 for the three launches it replaced (NOTES (br)). */
struct NormRouteArgs {
    float *y[3];
    const float *x[3], *w[3];
    int d, E, k, lanes;
    float eps;
    WDesc r;
    float *logits;
    int32_t *idx;
    float *wts;
    const float *pes;
    int *cnt;
};
/* 8 BF16 (F16) weights of a 16-byte chunk times x0, x1 in element order, fmaf into acc */
template <int F16> __device__ __forceinline__ float dot8(uint4 v, float4 x0, float4 x1, float acc) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float lo, hi;
        if constexpr (F16) {
            const float2 f = __half22float2(*(const __half2 *)&w[q]);
            lo = f.x; hi = f.y;
        } else {
            lo = __uint_as_float(w[q] << 16); hi = __uint_as_float(w[q] & 0xffff0000u);
        }
        acc = fmaf(lo, xv[2 * q], acc);
        acc = fmaf(hi, xv[2 * q + 1], acc);
    }
    return acc;
}
/* A lane's router chunks c = c0 + 32u (u < U): loads (issued together) and their sum into acc */
template <int KIND> struct NrK {
    static constexpr int EPC = KIND == 0 ? 8 : KIND == 1 ? 4 : KIND == 4 ? 32 : 16; /* elements a 16-byte chunk */
    static constexpr int U = KIND == 0 ? 12 : KIND == 1 ? 12 : KIND == 4 ? 4 : 8;  /* d <= 32·U·EPC in one round */
};
template <int KIND, int U>
__device__ __forceinline__ void nr_load(const WDesc &w, int e, int c0, int nch, uint4 *v, float *s, float *b) {
    constexpr int EPC = NrK<KIND>::EPC;
    const uint4 *row = (const uint4 *)(w.data + (size_t)e * w.row_bytes);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = c0 + 32 * u;
        v[u] = c < nch ? __ldg(row + c) : make_uint4(0, 0, 0, 0);
        if constexpr (KIND >= 4) {
            const size_t gi = (size_t)e * (nch * EPC / w.gs) + (size_t)(c * EPC) / w.gs;
            s[u] = c < nch ? load_s(w.scales, w.sdtype, gi) : 0.0f;
            b[u] = c < nch ? load_s(w.biases, w.sdtype, gi) : 0.0f;
        }
    }
}
template <int KIND, int U>
__device__ __forceinline__ float nr_acc(const uint4 *v, const float *s, const float *b, int c0, int nch,
                                        const float *xs, float acc) {
    constexpr int EPC = NrK<KIND>::EPC;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = c0 + 32 * u;
        if (c >= nch) break;
        const float *xc = xs + (size_t)c * EPC;
        if constexpr (KIND == 0) {
            acc = dot8<0>(v[u], ((const float4 *)xc)[0], ((const float4 *)xc)[1], acc);
        } else {
            const uint32_t wd[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                if constexpr (KIND == 1) {
                    acc = fmaf(__uint_as_float(wd[q]), xc[q], acc);
                } else {
                    constexpr int B = KIND, PW = 32 / B; /* codes a word */
#pragma unroll
                    for (int t = 0; t < PW; t++) {
                        const float wq = fmaf(s[u], (float)((wd[q] >> (B * t)) & ((1u << B) - 1u)), b[u]);
                        acc = fmaf(wq, xc[q * PW + t], acc);
                    }
                }
            }
        }
    }
    return acc;
}
/* y = rmsnorm(x)·w of one row of d <= 8192 (a block of 256 threads: <= 8 float4 a thread), bitwise rmsnorm: the
 * weight's float4s wv were loaded before pdl_wait, the row's are loaded together into registers, staged in st (for
 * block_rms_inv's order) and scaled from registers; ys: the output (global or shared memory) */
__device__ __forceinline__ void nr_norm_row(float *ys, const float *x, const float4 *wv, bool has_w, int d, float eps,
                                            float *st, float *red) {
    const int nf = d / 4;
    float4 xv[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int j = threadIdx.x + 256 * i;
        if (j < nf) xv[i] = ((const float4 *)x)[j];
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int j = threadIdx.x + 256 * i;
        if (j < nf) ((float4 *)st)[j] = xv[i];
    }
    __syncthreads();
    const float inv = block_rms_inv([&](int j) { return st[j]; }, d, eps, red);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int j = threadIdx.x + 256 * i;
        if (j < nf) {
            const float4 w = wv[i];
            ((float4 *)ys)[j] = make_float4(rms_scale(xv[i].x, inv, has_w, w.x), rms_scale(xv[i].y, inv, has_w, w.y),
                                            rms_scale(xv[i].z, inv, has_w, w.z), rms_scale(xv[i].w, inv, has_w, w.w));
        }
    }
}
__device__ __forceinline__ void nr_load_w(float4 *wv, const float *w, int d) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int j = threadIdx.x + 256 * i;
        wv[i] = w && j < d / 4 ? __ldg((const float4 *)w + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}
template <int PR, int KIND> __global__ void __launch_bounds__(256, 1) norm_route_kernel(NormRouteArgs a) {
    extern __shared__ float xs[]; /* d floats */
    __shared__ float red[32];
    constexpr int U = NrK<KIND>::U;
    pdl_trigger();
    const int G = (a.E + 7) / 8, nb = (int)blockIdx.x - G;
    float4 wv[8]; /* this block's norm weight, before the wait (weights are not written by the kernels before) */
    if (nb >= 0) { /* a norm block */
        nr_load_w(wv, a.w[nb], a.d);
        pdl_wait();
        nr_norm_row(a.y[nb], a.x[nb], wv, a.w[nb] != nullptr, a.d, a.eps, xs, red);
        return;
    }
    const int e = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31, nch = a.d / NrK<KIND>::EPC;
    uint4 v[U];
    float s[KIND >= 4 ? U : 1], b[KIND >= 4 ? U : 1];
    if (e < a.E) nr_load<KIND, U>(a.r, e, lane, nch, v, s, b); /* the router row's first round, before the wait */
    nr_load_w(wv, a.w[1], a.d);
    pdl_wait();
    nr_norm_row(xs, a.x[1], wv, a.w[1] != nullptr, a.d, a.eps, xs, red); /* the router's input, in place */
    __syncthreads();
    if (e < a.E) {
        float acc = nr_acc<KIND, U>(v, s, b, lane, nch, xs, 0.0f);
        for (int c0 = lane + 32 * U; c0 < nch; c0 += 32 * U) { /* rows wider than one round */
            nr_load<KIND, U>(a.r, e, c0, nch, v, s, b);
            acc = nr_acc<KIND, U>(v, s, b, c0, nch, xs, acc);
        }
        acc = warp_sum(acc);
        if (lane == 0) a.logits[e] = acc;
    }
    if (tern_block_last(a.cnt, G)) {
        if (threadIdx.x == 0) *a.cnt = 0; /* zero between launches (graph replays) */
        if (threadIdx.x < 32) route_row<PR>(a.idx, a.wts, a.logits, 0, a.E, a.k, a.pes, a.lanes);
    }
}

/* TERN_CUDA_NORM_ROUTE (read once; tests set it): 1 (the default since session 58, NOTES (br)) serves
 * norm_route_topk; 0 leaves it to the three ops */
extern "C" int tern__cuda_norm_route;
int tern__cuda_norm_route = -1;
extern "C" unsigned long long tern__cuda_norm_route_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_norm_route_calls = 0;

extern "C" int tern__cuda_norm_route_topk(tern__cuda *c, int n, int d, float *const *y, const float *const *x,
                                          const float *const *w, float eps, const tern__cuda_w *r, float *logits,
                                          int32_t *idx, float *wts, int E, int k, int mode, const float *pes) {
    if (tern__cuda_norm_route < 0) tern__cuda_norm_route = tern__cuda_env_int("TERN_CUDA_NORM_ROUTE", 1) != 0;
    if (!tern__cuda_norm_route || !c->mm_cnt || n != 1 || mode != TERN_ROUTE_SOFTMAX_TOPK || E < 1 || E > 256 ||
        k < 1 || k > E || d < 256 || d % 32 || d > 8192 || r->out != E || r->in != d || r->nmat != 1)
        return 0;
    int kind;
    if (r->dtype == TERN_DT_BF16) kind = 0;
    else if (r->dtype == TERN_DT_F32) kind = 1;
    else if (r->dtype == TERN_DT_Q && (r->bits == 4 || r->bits == 8) && r->group_size > 0 &&
             r->group_size % (128 / r->bits) == 0 && d % r->group_size == 0 &&
             (r->sdtype == TERN_DT_BF16 || r->sdtype == TERN_DT_F16 || r->sdtype == TERN_DT_F32))
        kind = r->bits;
    else return 0;
    if ((uintptr_t)r->data & 15) return 0;
    for (int i = 0; i < 3; i++) /* float4 loads and stores */
        if (!y[i] || !x[i] || y[i] == x[1] || (((uintptr_t)x[i] | (uintptr_t)y[i] | (uintptr_t)w[i]) & 15)) return 0;
    cudaSetDevice(c->device);
    NormRouteArgs a = {};
    for (int i = 0; i < 3; i++) { a.y[i] = y[i]; a.x[i] = x[i]; a.w[i] = w[i]; }
    a.d = d; a.E = E; a.k = k; a.eps = eps;
    a.lanes = route_lanes();
    a.r = make_wdesc(r);
    a.logits = logits; a.idx = idx; a.wts = wts; a.pes = pes;
    a.cnt = c->mm_cnt + TERN_CUDA_MM_CNT - 1; /* the pool's last: every user leaves its counters at zero, and none runs
                                                 * its split-K tail before the kernel ahead of it has finished */
    const unsigned grid = (unsigned)((E + 7) / 8 + 3);
    const size_t smem = (size_t)d * sizeof(float);
#define NR_GO(PR, K) tern_launch(c->stream, norm_route_kernel<PR, K>, grid, 256, smem, a)
#define NR_KIND(PR) \
    (kind == 0 ? NR_GO(PR, 0) : kind == 1 ? NR_GO(PR, 1) : kind == 4 ? NR_GO(PR, 4) : NR_GO(PR, 8))
    if (E <= 128) NR_KIND(4);
    else NR_KIND(8);
#undef NR_KIND
#undef NR_GO
    tern__cuda_norm_route_calls++;
    tern__cuda_check(c, "norm_route_topk");
    return 1;
}

__global__ void act_mul_kernel(float *h, size_t np, int I, int act) {
    pdl_start();
    const size_t total = np * I;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        float *row = h + (t / I) * 2 * I;
        const int i = (int)(t % I);
        const float g = row[i];
        row[i] = (act == TERN_ACT_SILU ? silu(g) : gelu_tanh(g)) * row[I + i];
    }
}

__global__ void remap_kernel(int32_t *out, const int32_t *idx, const int32_t *map, int np) {
    pdl_start();
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < np) out[p] = idx[p] >= 0 ? map[idx[p]] : idx[p];
}

extern "C" const int32_t *tern__cuda_moe_remap(tern__cuda *c, const int32_t *idx, const int32_t *map, int np) {
    cudaSetDevice(c->device);
    if ((size_t)np > c->moe_idx_cap) { /* grows to the largest step once (not while recording a graph) */
        if (c->capturing) return NULL;
        cudaStreamSynchronize(c->stream);
        cudaFree(c->moe_idx);
        c->moe_idx = NULL;
        c->moe_idx_cap = 0;
        if (cudaMalloc(&c->moe_idx, sizeof(int32_t) * (size_t)np) != cudaSuccess) { cudaGetLastError(); return NULL; }
        c->moe_idx_cap = (size_t)np;
    }
    tern_launch(c->stream, remap_kernel, (np + 255) / 256, 256, 0, c->moe_idx, idx, map, np);
    tern__cuda_check(c, "moe remap");
    return c->moe_idx;
}

extern "C" void tern__cuda_moe_act(tern__cuda *c, float *h, int np, int I, int act) {
    const size_t total = (size_t)np * I;
    size_t b = (total + 255) / 256;
    tern_launch(c->stream, act_mul_kernel, (unsigned)(b > 65535 * 4 ? 65535 * 4 : b), 256, 0, h, (size_t)np, I, act);
    tern__cuda_check(c, "moe act");
}

/* The experts' down projection of the pair path, y[t] = Σ_j wts[t·k + j] · down_{e_j} · h[t·k + j], for BF16 / F16
 * experts (TERN_CUDA_MOE_DOWN1): a block of 8 warps owns R (2; 4 or 8 by TERN_CUDA_MOE_DOWN1_R) output rows of one
 * token; warp w takes terms w, w + 8,
 * ... and issues every chunk load of its R rows for up to 3 rounds of 32 chunks (I <= 768 in one go) before any math,
 * the term's partial sums meet in shared memory and R threads add them in term order with the router weights. Why:
 * gemv_kernel's expert mode walks a warp's k terms one after another, each a dependent id load and two rounds of
 * loads (gemma4-26b-a4b bf16: 17.9 us for 32 MB, ~0.59 of the copy rate, NOTES (bq) 8); here a term is one round
 * trip and the k terms run in parallel warps. Another summation order than gemv_kernel (op test cuda_moe_down1).
 * H100 (NOTES (br)): the down kernel 18.8 -> 16.0 us (ncu, R 4), gemma4-26b-a4b bf16 b1 234.2 -> 244.5 tok/s (R 4),
 * 247.1 (R 2). */
struct MoeDown1Args {
    const uint8_t *data;
    size_t mat_bytes, row_bytes;
    int nmat, out, in, k, xstride, ystride;
    const int32_t *idx;
    const float *wts, *x;
    float *y;
};
template <int F16, int R> __global__ void __launch_bounds__(256, R == 2 ? 4 : R == 4 ? 2 : 1) moe_down1_kernel(MoeDown1Args a) {
    constexpr int MR = 3;
    __shared__ float part[32][R];
    __shared__ int live[32];
    pdl_start();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tok = blockIdx.y, r0 = blockIdx.x * R;
    const int nch = a.in / 8;
    int rows[R];
#pragma unroll
    for (int r = 0; r < R; r++) rows[r] = r0 + r < a.out ? r0 + r : r0; /* clamp: computed, not stored */
    for (int j = warp; j < a.k; j += 8) {
        const int p = tok * a.k + j, e = a.idx[p];
        const bool ok = e >= 0 && e < a.nmat;
        float acc[R] = {};
        if (ok) {
            const uint8_t *mat = a.data + (size_t)e * a.mat_bytes;
            const float4 *xb = (const float4 *)(a.x + (size_t)p * a.xstride);
            for (int c0 = lane; c0 < nch; c0 += 32 * MR) {
                uint4 v[R][MR];
#pragma unroll
                for (int u = 0; u < MR; u++)
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const int c = c0 + 32 * u;
                        v[r][u] = c < nch ? __ldg((const uint4 *)(mat + (size_t)rows[r] * a.row_bytes) + c)
                                          : make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                for (int u = 0; u < MR; u++) {
                    const int c = c0 + 32 * u;
                    if (c >= nch) break;
                    const float4 x0 = __ldg(xb + 2 * c), x1 = __ldg(xb + 2 * c + 1);
#pragma unroll
                    for (int r = 0; r < R; r++) acc[r] = dot8<F16>(v[r][u], x0, x1, acc[r]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
        if (lane == 0) {
            live[j] = ok;
#pragma unroll
            for (int r = 0; r < R; r++) part[j][r] = acc[r];
        }
    }
    __syncthreads();
    if (threadIdx.x < R && r0 + (int)threadIdx.x < a.out) {
        float y = 0.0f;
        for (int j = 0; j < a.k; j++)
            if (live[j]) y = fmaf(a.wts ? a.wts[tok * a.k + j] : 1.0f, part[j][threadIdx.x], y);
        a.y[(size_t)tok * a.ystride + r0 + threadIdx.x] = y;
    }
}

/* TERN_CUDA_MOE_DOWN1 (read once; tests set it): 1 (the default since session 58: gemma4-26b-a4b bf16 b1 +4.4 % on an
 * H100, NOTES (br)) runs the pair path's BF16 / F16 down projection on moe_down1_kernel; 0 on gemv_kernel's expert
 * mode. TERN_CUDA_MOE_DOWN1_R (read once; tests set it): output rows a block, 2 (default since session 58: 62 registers,
 * 4 blocks an SM; b1 +0.7 % over 4, 8 −1.1 %) / 4 / 8 */
extern "C" int tern__cuda_moe_down1;
int tern__cuda_moe_down1 = -1;
extern "C" unsigned long long tern__cuda_moe_down1_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_moe_down1_calls = 0;
extern "C" int tern__cuda_moe_down1_r;
int tern__cuda_moe_down1_r = 0;
static int moe_down1(tern__cuda *c, float *y, int ystride, const float *x, int xstride, int n, const int32_t *idx,
                     const float *wts, int k, const tern__cuda_w *w) {
    if (tern__cuda_moe_down1 < 0) tern__cuda_moe_down1 = tern__cuda_env_int("TERN_CUDA_MOE_DOWN1", 1) != 0;
    /* up to 8 tokens: gemma4-26b-a4b bf16 batch decode (H100, NOTES (br) 8) at 8 sequences +1.1 %, at 16 −1.0 % */
    if (!tern__cuda_moe_down1 || (w->dtype != TERN_DT_BF16 && w->dtype != TERN_DT_F16) || k < 1 || k > 32 ||
        w->in % 8 || n < 1 || n > 8 || ((uintptr_t)w->data & 15) || ((uintptr_t)x & 15) || xstride % 4 ||
        (w->mat_bytes & 15))
        return 0;
    MoeDown1Args a = {};
    a.data = (const uint8_t *)w->data;
    a.mat_bytes = w->mat_bytes;
    a.row_bytes = (size_t)w->in * 2;
    a.nmat = w->nmat; a.out = w->out; a.in = w->in; a.k = k;
    a.xstride = xstride; a.ystride = ystride;
    a.idx = idx; a.wts = wts; a.x = x; a.y = y;
    if (!tern__cuda_moe_down1_r) tern__cuda_moe_down1_r = tern__cuda_env_int("TERN_CUDA_MOE_DOWN1_R", 2);
    const int rr = tern__cuda_moe_down1_r, R = rr == 4 || rr == 8 ? rr : 2;
    const dim3 grid((unsigned)((w->out + R - 1) / R), (unsigned)n);
#define D1_GO(F, RR) tern_launch(c->stream, moe_down1_kernel<F, RR>, grid, 256, 0, a)
    const int f16 = w->dtype == TERN_DT_F16;
    if (R == 4) f16 ? D1_GO(1, 4) : D1_GO(0, 4);
    else if (R == 8) f16 ? D1_GO(1, 8) : D1_GO(0, 8);
    else f16 ? D1_GO(1, 2) : D1_GO(0, 2);
#undef D1_GO
    tern__cuda_moe_down1_calls++;
    tern__cuda_check(c, "moe_down1");
    return 1;
}

unsigned long long tern__cuda_moe_fused_calls = 0;
int tern__cuda_moe_fused_on = -1; /* TERN_CUDA_MOE_FUSED=0: off; read once (-1); tests set it */

extern "C" void tern__cuda_moe_mlp(tern__cuda *c, float *y, const float *x, int n, int H, const int32_t *idx,
                                   const float *wts, int k, const tern__cuda_w *gate, const tern__cuda_w *up,
                                   const tern__cuda_w *down, int act, float *scratch) {
    if (n <= 0 || k <= 0) return;
    const int I = gate->out, E = gate->nmat, np = n * k;
    if (gate->in != H || up->in != H || up->out != I || down->out != H || down->in != I) {
        tern_log(TERN_LOG_ERROR, "cuda moe_mlp: shape mismatch H %d gate [%d,%d] up [%d,%d] down [%d,%d]", H,
                 gate->out, gate->in, up->out, up->in, down->out, down->in);
        return;
    }
    cudaSetDevice(c->device);
    if (tern__cuda_moe_grouped(c, y, x, n, H, idx, wts, k, gate, up, down, act, scratch)) return;
    /* --compute bf16, several tokens: the grouped GEMMs above multiply bf16-rounded x and h; so does
     * this pair path then (the choice between them depends on the batch size) */
    const float *xr = tern__cuda_plain_x(c, gate, n, x, H);
    const int plain = xr != x;
    x = xr;
    /* Q4 experts: the pairs on tensor cores (moe_mma.cu); TERN_CUDA_MOE_MMA=0 keeps the path below */
    if (tern__cuda_moe_mma(c, y, x, n, idx, wts, k, gate, up, down, act, scratch, plain)) return;
    if (tern__cuda_moe_fused_on < 0) tern__cuda_moe_fused_on = tern__cuda_env_int("TERN_CUDA_MOE_FUSED", 1) != 0;
    if (tern__cuda_moe_fused_on && tern__cuda_moe_gateup(c, scratch, 2 * I, x, n, idx, k, gate, up, act)) {
        tern__cuda_moe_fused_calls++;
    } else {
        tern__cuda_gemv_expert(c, scratch, 2 * I, x, k, np, idx, NULL, 1, gate, E, H);
        tern__cuda_gemv_expert(c, scratch + I, 2 * I, x, k, np, idx, NULL, 1, up, up->nmat, H);
        tern__cuda_moe_act(c, scratch, np, I, act);
    }
    if (plain) tern__cuda_round_bf16(c, scratch, scratch, (size_t)np * 2 * I);
    if (!moe_down1(c, y, H, scratch, 2 * I, n, idx, wts, k, down))
        tern__cuda_gemv_expert(c, y, H, scratch, 1, n, idx, wts, k, down, down->nmat, 2 * I);
}

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
__global__ void route_kernel(int32_t *idx, float *wts, const float *logits, int n, int E, int k, const float *pes,
                             int lanes) {
    pdl_start();
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= n) return;
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

/* TERN_CUDA_ROUTE_LANES (read once; default 1 since session 32, gemma4-26b-a4b b1 +1.7 %; 0: lane 0 stores the picks
 * one by one, the old form; tests set it): route_kernel's picks kept in registers (see there) */
extern "C" int tern__cuda_route_lanes;
int tern__cuda_route_lanes = -1;

extern "C" void tern__cuda_route_topk(tern__cuda *c, int32_t *idx, float *wts, const float *logits, int n, int E,
                                      int k, int mode, const float *per_expert_scale) {
    if (n <= 0 || k <= 0) return;
    if (E <= 0 || E > 2048 || k > E || mode != TERN_ROUTE_SOFTMAX_TOPK) {
        tern_log(TERN_LOG_ERROR, "cuda route_topk: unsupported E %d k %d mode %d", E, k, mode);
        return;
    }
    cudaSetDevice(c->device);
    if (tern__cuda_route_lanes < 0) tern__cuda_route_lanes = tern__cuda_env_int("TERN_CUDA_ROUTE_LANES", 1) != 0;
    const int ln = tern__cuda_route_lanes;
    const unsigned g = (unsigned)((n + 3) / 4);
    if (E <= 128) tern_launch(c->stream, route_kernel<4>, g, 128, 0, idx, wts, logits, n, E, k, per_expert_scale, ln);
    else if (E <= 256) tern_launch(c->stream, route_kernel<8>, g, 128, 0, idx, wts, logits, n, E, k, per_expert_scale, ln);
    else tern_launch(c->stream, route_kernel<0>, g, 128, 0, idx, wts, logits, n, E, k, per_expert_scale, ln);
    tern__cuda_check(c, "route_topk");
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
    tern__cuda_gemv_expert(c, y, H, scratch, 1, n, idx, wts, k, down, down->nmat, 2 * I);
}

/*
 * gemv1.cu — one activation row through every chunked weight format (gemv1_kernel: x staged once per
 * block, q|k|v, act(gate)·up and residual modes; the fused decode ops of ops.h; gemv1_cpa_kernel: the same body
 * whose prologue brings every vector it reads into shared memory by cp.async in one round trip), and the fused MoE
 * gate/up/act of routed pairs (moe_gateup_kernel). Both run gemv.cu's per-chunk f32 operations
 * (gemv_chunk.cuh) in the same order, so their rows are bitwise those of the multi-row and expert
 * kernels. Split out of gemv.cu; the design notes of each kernel sit above it.
 */
#include "backend/cuda/gemv_chunk.cuh"
#include "backend/cuda/rope_kv.cuh"
#include "backend/cuda/mma.cuh"

#include <stdlib.h>
/* ---- one activation row, every chunked format: gemv1_kernel ----
 * The block (8 warps) stages the whole activation row in shared memory once (float4 F of x at
 * F ^ ((F >> 3) & (C4 - 1)): a warp reading float4 k4 of 32 consecutive chunks hits every bank
 * pair once per 8 lanes, for 8-, 4- and 2-float4 chunks alike), then each warp streams R rows
 * with U chunks per lane in flight (a 4096-wide q4 row is one round of loads). Lane l handles
 * chunks l, l+32, ... in order with the same f32 operations as gemv_kernel<KIND, 1>, so the
 * result is bitwise that of the multi-row kernels (batch invariance holds). Rows come from up
 * to three matrices sharing `in` and the format (q|k|v in one launch); pair modes give a warp
 * row o of matrix 0 and of matrix 1 and write act(g)·u (gate/up); RES adds the old y[o]. */
#define G1_MAX_IN 16384 /* floats of x staged (64 KB of shared memory) */
#define G1_CPA_SMEM (96 * 1024) /* bytes of shared memory the cpa prologue's regions may take (its launch attribute; under the 99 KB a block of sm_86 / sm_120 parts allows) */

struct Gemv1Args {
    const uint8_t *data[3], *scales[3], *biases[3];
    float *y[3];
    int out[3], nm, rows; /* rows: plain/RES = out[0]+out[1]+out[2], pair = out[0] */
    int in, gs, gs_shift, sdtype, br, ncs, mode;
    const float *x;
    /* pre-norm (ops.h norm_matmul): when nrm, the staged row is rmsnorm(x)·nw (nw may be NULL), and
     * block 0 also writes it to xn */
    const float *nw;
    float *xn;
    float eps;
    int nrm;
    int xb; /* the prologue's global passes load 4 float4s a thread at once (TERN_CUDA_G1_XB) */
    /* residual prologue (norm_matmul's res, with nrm): x' = (x + rmsnorm(rh)·rw)·(rs ? rs[0] : 1) is
     * staged instead of x and written to rxo by block 0; the pre-norm is then taken of x' */
    const float *rh, *rw, *rs;
    float *rxo;
    /* ROPE instances (ops.h norm_qkv_rope_kv): rope_kv_write in the epilogue (appended: the other
     * instances never read it) */
    tern__cuda_rope_kv rope;
    /* MV instances (ops.h matmul_act_mul, plain mode): y[o] = act(acc)·mv[o], act mact (appended) */
    const float *mv;
    int mact;
    /* the residual prologue's inner add (tern_norm_res h2): rh' = rh + rmsnorm(rh2)·rw2 first (appended; cpa only) */
    const float *rh2, *rw2;
    /* cpa (TERN_CUDA_G1_CPA): the prologue's vectors come into shared memory by cp.async, all in flight at once (the
     * weights' before pdl_wait), each in a region of its own (g1_regions), and its norms run there */
    int cpa;
    /* TERN_CUDA_G1_EPF (appended): the epilogue's operand — RES's old y[o], MV's mv[o] — loaded by lane 0 when its task
     * starts instead of after the task's sums (one dependent L2 round trip off every task's tail) */
    int epf;
};

/* The cpa prologue's shared-memory regions, in units of `in` floats: 0 the row being formed (h2, h or x, then h', x',
 * xn in place), then h and w2 (inner add), x and the post-norm weight (res), the pre-norm weight (nrm); a missing
 * vector takes no region (its index stays 0). Returns the count. */
struct G1Regions { int h, w2, x, rw, nw; };
__host__ __device__ __forceinline__ int g1_regions(const Gemv1Args &a, G1Regions &r) {
    int n = 1;
    r.h = a.rh2 ? n++ : 0;
    r.w2 = a.rh2 && a.rw2 ? n++ : 0;
    r.x = a.rh ? n++ : 0;
    r.rw = a.rh && a.rw ? n++ : 0;
    r.nw = a.nrm && a.nw ? n++ : 0;
    return n;
}

__device__ __forceinline__ int g1swz(int f, int c4) { return f ^ ((f >> 3) & (c4 - 1)); }

/* n4 float4s of src into dst (gemv1's swizzled layout) by cp.async, the block's threads in turn; not waited for */
__device__ __forceinline__ void g1_copy(float4 *dst, const float *src, int n4, int c4) {
#pragma unroll 1
    for (int f = threadIdx.x; f < n4; f += 256) mma_cp16_ord(dst + g1swz(f, c4), (const float4 *)src + f);
}

/* f = threadIdx.x, + 256, ... < n in rounds of U a thread: the round's loads ld(f) are issued together, then
 * st(f, value) for each (U = 1: one dependent L2 round trip per element, the prologue loops as they were) */
template <int U, class L, class S> __device__ __forceinline__ void g1_rounds(int n, L ld, S st) {
    for (int f0 = threadIdx.x; f0 < n; f0 += U * 256) {
        decltype(ld(0)) v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (f0 + u * 256 < n) v[u] = ld(f0 + u * 256);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (f0 + u * 256 < n) st(f0 + u * 256, v[u]);
    }
}

/* A warp task is R rows (pair modes: row o of gate and of up). The launch is persistent (default;
 * TERN_CUDA_G1_GRID=0: one block per 8 tasks): about two resident blocks per SM, each staging (and normalising) the row
 * once and its warps taking tasks blockIdx.x·8 + warp + i·gridDim.x·8 — per block the prologue is
 * paid once instead of once per 8 tasks (llama3-8b gate|up: 1792 blocks of 8 tasks each, ~7 waves).
 * Which warp runs a task never changes its operations: the same bits either way. */
/* q|k|v with rope_kv_write in the epilogue (ROPE instances, one row; rope_kv.cuh): a warp task of the q and k
 * matrices is the rope pair (i, i + d/2) of one head, so lane 0 holds both rows; a v task is two consecutive rows
 * as in the plain mode. Row g (of the concatenated q, k, v) of task t, r < R = 2: */
__device__ __forceinline__ int g1_rope_row(const tern__cuda_rope_kv &p, int t, int r) {
    const int half = p.d >> 1, qk = (p.nh + p.nkv) * half;
    return t < qk ? (t / half) * p.d + t % half + r * half : (p.nh + p.nkv) * p.d + 2 * (t - qk) + r;
}

template <int KIND, int R, int U, bool EARLY, bool ROPE, bool MV, bool CPA>
__device__ __forceinline__ void gemv1_body(const Gemv1Args &a) {
    static_assert(!ROPE || R == 2, "a rope task is one pair of rows");
    static_assert(!(ROPE && MV), "one epilogue");
    if constexpr (EARLY) pdl_trigger(); /* the wait follows the first task's first round of weight loads */
    else pdl_start();
    using K = Kind<KIND>;
    constexpr int CH = K::CH, C4 = CH / 4, W = K::WORDS;
    extern __shared__ float4 xs1[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    const int nch = a.in / CH, ng = K::Q ? a.in >> a.gs_shift : 0;
    const int ntask = pair ? a.rows : (a.rows + R - 1) / R;
    const RoundScales rq = {ng, a.gs_shift, a.sdtype, a.br, a.ncs, a.gs};
    const size_t rb = (size_t)a.in * (K::Q ? KIND : K::EB) / (K::Q ? 8 : 1);
    __shared__ float red[32];
    const float *xf = (const float *)xs1;
    /* the prologue's global passes (TERN_CUDA_G1_XB): BF16 / F16 weights only (the Q instances hold more registers
     * across them: Q8's early instance 128 → 174, one block an SM) */
    auto rounds = [&](auto ld, auto st) {
        if constexpr (KIND == 16 || KIND == 17)
            if (a.xb) {
                g1_rounds<4>(nch * C4, ld, st);
                return;
            }
        g1_rounds<1>(nch * C4, ld, st);
    };
    auto xat = [&](int j) { return xf[g1swz(j >> 2, C4) * 4 + (j & 3)]; }; /* element j of the staged row */
    auto ld4 = [&](const float *p, int f) { return p ? __ldg((const float4 *)p + f) : make_float4(0.f, 0.f, 0.f, 0.f); };
    /* EARLY: the first task's first round (weights and scales only) is loaded before pdl_wait, while
     * the previous kernel drains; the task loop then starts with those registers */
    uint32_t wd[U][R][W]; /* one round's words and scales (the task loop's) */
    float s[U][R], b[U][R];
    RopePage pg{};
    if constexpr (ROPE) pg = rope_page(a.rope); /* the host's step data: EARLY, before pdl_wait */
    G1Regions cr{};
    if constexpr (CPA) { /* the weights' regions (model constants): their copies fly before pdl_wait */
        g1_regions(a, cr);
        const int n4 = nch * C4;
        if (cr.w2) g1_copy(xs1 + cr.w2 * n4, a.rw2, n4, C4);
        if (cr.rw) g1_copy(xs1 + cr.rw * n4, a.rw, n4, C4);
        if (cr.nw) g1_copy(xs1 + cr.nw * n4, a.nw, n4, C4);
    }
    if constexpr (EARLY) {
        const int task = blockIdx.x * 8 + warp;
        if (task < ntask) {
            const int g0 = task * (pair ? 1 : R);
            int mrow[R], orow[R];
            const uint8_t *rowp[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                int g = pair ? g0 : ROPE ? g1_rope_row(a.rope, task, r) : g0 + r, m = pair ? r : 0;
                if (g >= a.rows) g = 0;
                if (!pair)
                    while (m < a.nm - 1 && g >= a.out[m]) g -= a.out[m++];
                mrow[r] = m;
                orow[r] = g;
                rowp[r] = a.data[m] + (size_t)g * rb;
            }
            load_round<KIND, R, U>(rowp, [&](int r) { return a.scales[mrow[r]]; },
                                   [&](int r) { return a.biases[mrow[r]]; }, orow, 0, lane, nch, true, rq, wd, s, b);
        }
        pdl_wait();
    }
    if constexpr (CPA) { /* the activations' copies (the weights' went before pdl_wait), then every region lands */
        const int n4 = nch * C4;
        g1_copy(xs1, a.rh2 ? a.rh2 : a.rh ? a.rh : a.x, n4, C4);
        if (a.rh2) g1_copy(xs1 + cr.h * n4, a.rh, n4, C4);
        if (a.rh) g1_copy(xs1 + cr.x * n4, a.x, n4, C4);
        mma_cp_commit_ord();
        mma_cp_wait_ord<0>();
    } else {
        const float4 *x4 = (const float4 *)(a.rh ? a.rh : a.x);
        auto ld = [&](int f) { return __ldg(x4 + f); };
        auto st = [&](int f, const float4 &v) { xs1[g1swz(f, C4)] = v; };
        if constexpr (KIND == 16 || KIND == 17) {
            if (a.xb) g1_rounds<8>(nch * C4, ld, st); /* K 14336: two round trips instead of five */
            else g1_rounds<1>(nch * C4, ld, st);
        } else {
            g1_rounds<1>(nch * C4, ld, st);
        }
    }
    __syncthreads();
    /* cpa: region r's float4 f (swizzled as the row) */
    auto reg4 = [&](int r, int f) { return xs1[r * nch * C4 + g1swz(f, C4)]; };
    if (CPA && a.rh2) { /* h' = h + rmsnorm(h2)·w2 in place of h2, bitwise rmsnorm_add's without a scalar */
        const float inv = block_rms_inv(xat, a.in, a.eps, red);
        const bool hw = a.rw2 != nullptr;
        for (int f = threadIdx.x; f < nch * C4; f += 256) {
            const float4 g = xs1[g1swz(f, C4)], h = reg4(cr.h, f), w = hw ? reg4(cr.w2, f) : make_float4(0.f, 0.f, 0.f, 0.f);
            xs1[g1swz(f, C4)] = make_float4(res_add(h.x, rms_scale(g.x, inv, hw, w.x), false, 1.0f),
                                            res_add(h.y, rms_scale(g.y, inv, hw, w.y), false, 1.0f),
                                            res_add(h.z, rms_scale(g.z, inv, hw, w.z), false, 1.0f),
                                            res_add(h.w, rms_scale(g.w, inv, hw, w.w), false, 1.0f));
        }
        __syncthreads();
    }
    if (a.rh) { /* x' = (x + rmsnorm(h)·w)·s in place of h, bitwise rmsnorm_add's (norm.cu rms_row) */
        const float inv = block_rms_inv(xat, a.in, a.eps, red), sc = a.rs ? a.rs[0] : 1.0f;
        const bool hw = a.rw != nullptr, hs = a.rs != nullptr;
        struct XW { float4 x, w; };
        auto ld = [&](int f) { return XW{__ldg((const float4 *)a.x + f), ld4(a.rw, f)}; };
        auto st = [&](int f, const XW &p) {
            const float4 h = xs1[g1swz(f, C4)], x = p.x, w = p.w;
            const float4 v = make_float4(res_add(x.x, rms_scale(h.x, inv, hw, w.x), hs, sc),
                                         res_add(x.y, rms_scale(h.y, inv, hw, w.y), hs, sc),
                                         res_add(x.z, rms_scale(h.z, inv, hw, w.z), hs, sc),
                                         res_add(x.w, rms_scale(h.w, inv, hw, w.w), hs, sc));
            xs1[g1swz(f, C4)] = v;
            if (blockIdx.x == 0) ((float4 *)a.rxo)[f] = v;
        };
        if constexpr (CPA)
            for (int f = threadIdx.x; f < nch * C4; f += 256)
                st(f, XW{reg4(cr.x, f), a.rw ? reg4(cr.rw, f) : make_float4(0.f, 0.f, 0.f, 0.f)});
        else
            rounds(ld, st);
        __syncthreads();
    }
    if (a.nrm) { /* rmsnorm in place, bitwise norm.cu's: (x·inv)·w per element */
        const float inv = block_rms_inv(xat, a.in, a.eps, red);
        const bool hw = a.nw != nullptr;
        auto ld = [&](int f) { return ld4(a.nw, f); };
        auto st = [&](int f, const float4 &w) {
            const float4 x = xs1[g1swz(f, C4)];
            const float4 v = make_float4(rms_scale(x.x, inv, hw, w.x), rms_scale(x.y, inv, hw, w.y),
                                         rms_scale(x.z, inv, hw, w.z), rms_scale(x.w, inv, hw, w.w));
            xs1[g1swz(f, C4)] = v;
            if (blockIdx.x == 0) ((float4 *)a.xn)[f] = v;
        };
        if constexpr (CPA)
            for (int f = threadIdx.x; f < nch * C4; f += 256) st(f, hw ? reg4(cr.nw, f) : make_float4(0.f, 0.f, 0.f, 0.f));
        else
            rounds(ld, st);
        __syncthreads();
    }
    bool pre = EARLY; /* wd / s / b hold this warp's first round */
    for (int task = blockIdx.x * 8 + warp; task < ntask; task += gridDim.x * 8) {
        const int g0 = task * (pair ? 1 : R);
        int mrow[R], orow[R];
        bool live[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int g, m = pair ? r : 0;
            if constexpr (ROPE) g = g1_rope_row(a.rope, task, r);
            else g = pair ? g0 : g0 + r;
            live[r] = g < a.rows;
            if (!live[r]) g = 0; /* clamp: recompute row 0, never written */
            if (!pair)
                while (m < a.nm - 1 && g >= a.out[m]) g -= a.out[m++];
            mrow[r] = m;
            orow[r] = g;
        }
        const uint8_t *rowp[R];
#pragma unroll
        for (int r = 0; r < R; r++) rowp[r] = a.data[mrow[r]] + (size_t)orow[r] * rb;
        float rf = 0.0f; /* ROPE: the q / k pair's inv_freq, loaded while the task's weights arrive */
        if constexpr (ROPE)
            if (mrow[0] < 2) rf = a.rope.inv_freq[orow[0] % a.rope.d];
        float ev[R]; /* EPF: the epilogue's operand of each row, loaded now (the same value it would read at the end) */
        if constexpr (!ROPE)
            if (a.epf && lane == 0 && !pair)
#pragma unroll
                for (int r = 0; r < R; r++)
                    ev[r] = !live[r] ? 0.0f : MV ? a.mv[orow[r]] : a.mode == G1_RES ? a.y[mrow[r]][orow[r]] : 0.0f;
        auto sp = [&](int r) { return a.scales[mrow[r]]; };
        auto bp = [&](int r) { return a.biases[mrow[r]]; };
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = 0.0f;
        for (int c0 = 0; c0 < nch; c0 += 32 * U) {
            /* one round: U chunks per lane of each of the R rows (and their scales) in flight */
            if (!EARLY || !pre) load_round<KIND, R, U>(rowp, sp, bp, orow, c0, lane, nch, true, rq, wd, s, b);
            pre = false;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u * 32 + lane;
                if (c >= nch) continue;
                float qa[R], xsum = 0.0f;
                chunk_dot<KIND, R, C4, K::Q>(wd[u], [&](int k4) { return xs1[g1swz(c * C4 + k4, C4)]; }, qa, xsum);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if constexpr (K::Q) acc[r] += fmaf(s[u][r], qa[r], b[u][r] * xsum);
                    else if constexpr (K::F8) acc[r] = fmaf(s[u][r], qa[r], acc[r]);
                    else acc[r] += qa[r];
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
        if (lane) continue;
        if constexpr (ROPE) {
            rope_kv_put(a.rope, a.y, pg, mrow[0] < 2 ? rope_rot_at(pg.pos, rf) : RopeRot{}, mrow[0], orow[0], orow[1], acc[0],
                        acc[1]);
            continue;
        }
        if (pair) {
            const float gv = acc[0];
            a.y[0][orow[0]] = (a.mode == G1_SILU ? silu(gv) : gelu_tanh(gv)) * acc[1]; /* as ew_kernel */
            continue;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (!live[r]) break;
            float *yp = a.y[mrow[r]] + orow[r];
            if constexpr (MV) /* as ew_kernel's gelu / silu with b: act(x)·b */
                *yp = (a.mact == TERN_ACT_SILU ? silu(acc[r]) : gelu_tanh(acc[r])) * (a.epf ? ev[r] : a.mv[orow[r]]);
            else
                *yp = a.mode == G1_RES ? (a.epf ? ev[r] : *yp) + acc[r] : acc[r]; /* as ew_kernel's add: y + o */
        }
    }
}

/* The kernels: gemv1_kernel (its instances compiled as before the cpa prologue: the same registers; a (256, 1) bound
 * alone moved its early ones from 128 to 168) and gemv1_cpa_kernel, the early instances (plain / residual / pair, rope,
 * act·mul) with the cpa prologue (116-124 registers; bounded to two blocks an SM, as gemv1_kernel's early instances
 * run). One body. */
template <int KIND, int R, int U, bool EARLY = false, bool ROPE = false, bool MV = false>
__global__ void __launch_bounds__(256) gemv1_kernel(Gemv1Args a) {
    gemv1_body<KIND, R, U, EARLY, ROPE, MV, false>(a);
}
template <int KIND, int R, int U, bool ROPE, bool MV>
__global__ void __launch_bounds__(256, 2) gemv1_cpa_kernel(Gemv1Args a) {
    gemv1_body<KIND, R, U, true, ROPE, MV, true>(a);
}

/* TERN_CUDA_G1_GRID (read once; tests set it): 1 persistent grid (default), 0 one block per 8 warp
 * tasks. H200, llama3-8b bf16 batch-1 decode (NOTES (s)): with the fused pre-norm 205 -> 215 tok/s;
 * either alone +0.5 % / -0.5 % (the norm in every one of 1792 blocks' prologue cost what it saved) */
extern "C" int tern__cuda_g1_grid;
int tern__cuda_g1_grid = -1;

/* Rows per warp and chunks in flight per lane: pair modes need R = 2; U = 4 keeps a whole
 * 4096-wide q4 row (128 chunks) in flight in one round. Session 31 (NOTES (ar)): BF16 at U 5 where a row's chunks
 * then fill fewer rounds (K 2560 one instead of two, K 10240 / 14336 / 15360 fewer) tied on gemma4-e4b /
 * 26b-a4b b1 and lost 0.7-1 % on llama3-8b / gemma4-12b (128 registers, the same occupancy); removed. Session 32
 * (NOTES (as)), BF16 plain / residual / act·mul launches at other R (the same registers and bits): R 1 U 8 (twice the
 * tasks, x read once a row) lost 1.5-6 %, R 4 U 2 (half the tasks) lost 6.5-12 %; spreading launches with fewer tasks
 * than warps over the whole grid in contiguous ranges tied. Removed. */
#define G1_R 2
#define G1_U 4
template <int KIND, int U, bool EARLY, bool ROPE, bool MV, bool CPA> void (*g1_kernel())(Gemv1Args) { /* the kernel of an instance */
    if constexpr (CPA) return gemv1_cpa_kernel<KIND, G1_R, U, ROPE, MV>;
    else return gemv1_kernel<KIND, G1_R, U, EARLY, ROPE, MV>;
}

/* resident blocks per SM of gemv1_kernel<KIND, G1_R, U, EARLY, ROPE, MV> with `smem` bytes (occupancy query, cached per
 * size) */
template <int KIND, int U, bool EARLY, bool ROPE, bool MV, bool CPA = false> static int g1_blocks_per_sm(size_t smem) {
    static int nb;
    static size_t nb_smem = (size_t)-1;
    if (nb_smem != smem) {
        int v = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, g1_kernel<KIND, U, EARLY, ROPE, MV, CPA>(), 256, smem) != cudaSuccess ||
            v < 1) {
            cudaGetLastError();
            v = 1;
        }
        nb = v;
        nb_smem = smem;
    }
    return nb;
}

/* TERN_CUDA_G1_EARLY=mask (read once; default 7): the BF16 / F16 / Q8 instances load their first round of
 * weights before pdl_wait (as gemv_mma.cu does) in launches of mode 1 plain (q|k|v, heads), 2 residual (o, down),
 * 4 pair (gate|up); 7 all, 0 none. The same operations, so the same bits. H200, session 20 (NOTES (ad)), b1 at 512
 * tok/s, 0 → 7: llama3-8b bf16 224.8 / 224.4 → 221.8 / 222.6 (second call 219.3 / 217.4 → 217.2 / 216.8), q8
 * 188.9 / 189.3 → 206.7 / 207.6 (190.4 → 209.2), gemma4-12b bf16 133.2 / 133.3 → 135.3 / 135.8, gemma4-e4b bf16
 * 226.5 / 225.8 → 238.0 / 237.0. One mode alone gained less than all three (q8: 1 / 2 / 4 → 195.1 / 193.7 / 189.3). */
extern "C" int tern__cuda_g1_early;
int tern__cuda_g1_early = -1;
/* TERN_CUDA_G1_XB (read once; default 1 on, 0 off): the pre-norm prologue's two global passes (x and the post-norm
 * weight with res, the norm weight) issue 4 float4 loads a thread together instead of one dependent round trip each
 * (4 trips a pass at K 4096), and (session 41) the staging of x itself 8 at a time (K 14336: two trips where the
 * compiler's 4-way unrolled loop with its remainder took five); BF16 / F16 instances only (the Q8 ones would hold 174
 * registers). The same operations, so the same bits. H200, session 35 (NOTES (au)), b1 bf16 tok/s 0 / 1: gemma4-e4b 235.0 / 235.6 → 236.9 / 239.1,
 * gemma4-26b-a4b 255.4 / 256.5 → 259.5 / 259.7, llama3-8b 222.3 / 222.8 → 222.3 / 222.2 */
extern "C" int tern__cuda_g1_xb;
int tern__cuda_g1_xb = -1;
/* TERN_CUDA_G1_EPF (session 76, opt-in until timed; tests set it): the residual's old y[o] (o, down, the PLE projection)
 * and act·mul's mv[o] (the PLE gate) loaded by lane 0 as its task starts, not after the task's sums — the same values
 * and operations, so the same bits. Why: ncu of a gemma4-e4b b1 bf16 step (H100, NOTES (cj) 8) puts ~35 µs a layer of
 * fixed cost in six small launches; each task of these ends in one more dependent L2 round trip (session 41's rope
 * step data read early moved llama3-8b bf16 b1 0.838 → 0.847) */
extern "C" int tern__cuda_g1_epf;
int tern__cuda_g1_epf = -1;
/* TERN_CUDA_G1_CPA (read once; tests set it): the cpa prologue (gemv1_cpa_kernel: the early instances of BF16 / F16
 * weights, every mode and epilogue): the prologue's vectors (the row, and by mode the residual's h and x, the post-norm
 * and pre-norm weights, the inner add's h2 and w2) come into shared memory by cp.async, all in flight together (the
 * weights' before pdl_wait), and the norms run there — one round trip where the register staging takes one a vector
 * (x; then x and the post-norm weight; then the pre-norm weight). 2 (default since session 59): every launch it can take
 * (its regions within G1_CPA_SMEM), 1: only the launches with the inner add (tern_norm_res h2, which only this prologue
 * serves), 0: none (h2 declined). The same operations on the same values, so the same bits (op tests cuda_norm_matmul,
 * _res, cuda_matmul_act_mul, cuda_norm_qkv_rope_kv). H100, session 59 (NOTES (bs)), b1 bf16 at 512 against the tree
 * before, plain / residual / pair instances only: gemma4-26b-a4b 245.2 -> 253.3 tok/s (0.637 -> 0.659; with =1, the
 * h2 fold alone, 248.2), gemma4-e4b +2.0 %, gemma4-12b +1.2 %, llama3-8b +0.2 % (its q|k|v is the rope instance). */
extern "C" int tern__cuda_g1_cpa;
int tern__cuda_g1_cpa = -1;
static int g1_cpa_mode() {
    if (tern__cuda_g1_cpa < 0) tern__cuda_g1_cpa = tern__cuda_env_int("TERN_CUDA_G1_CPA", 2);
    return tern__cuda_g1_cpa;
}
constexpr bool g1_cpa_kind(int kind) { return kind == 16 || kind == 17; } /* BF16 / F16 weights */
/* Does a launch with these arguments (a.in, the norm and residual fields set) run the cpa prologue? kind: kind_of the
 * weights */
static bool g1_cpa_pick(const Gemv1Args &a, int kind) {
    const int mode = g1_cpa_mode();
    G1Regions cr;
    if (!mode || !g1_cpa_kind(kind) || (mode == 1 && !a.rh2)) return false;
    return (size_t)g1_regions(a, cr) * (size_t)a.in * sizeof(float) <= G1_CPA_SMEM;
}
template <int KIND> constexpr bool g1_has_cpa() { return g1_cpa_kind(KIND); }
template <int KIND> constexpr bool g1_has_early() { return KIND == 8 || KIND == 16 || KIND == 17; }
template <int KIND> constexpr bool g1_has_rope() { return KIND == 16 || KIND == 17; } /* BF16 / F16 weights */
/* the kinds with an MV instance (matmul_act_mul): BF16 / F16, and Q4 where the tensor-core GEMV declines it */
constexpr bool g1_mv_kind(int kind) { return kind == 16 || kind == 17 || kind == 4; }
template <int KIND> constexpr bool g1_has_mv() { return g1_mv_kind(KIND); }

/* the launch at U chunks a lane a round (grid: persistent, capped at the resident blocks of that instance) */
template <int KIND, int U, bool EARLY, bool ROPE, bool MV = false, bool CPA = false>
static void g1_run(const tern__cuda *c, const Gemv1Args &a, long ntask, size_t smem) {
    long blocks = (ntask + 7) / 8;
    if (tern__cuda_g1_grid) {
        const long slots = (long)g1_blocks_per_sm<KIND, U, EARLY, ROPE, MV, CPA>(smem) * (c->n_sm > 0 ? c->n_sm : 132);
        if (blocks > slots) blocks = slots;
    }
    tern_launch(c->stream, g1_kernel<KIND, U, EARLY, ROPE, MV, CPA>(), (unsigned)blocks, 256, smem, a);
}

template <int KIND> static void g1_go(const tern__cuda *c, const Gemv1Args &a, bool rope = false) {
    if (tern__cuda_g1_grid < 0) tern__cuda_g1_grid = tern__cuda_env_int("TERN_CUDA_G1_GRID", 1) != 0;
    if (tern__cuda_g1_early < 0) tern__cuda_g1_early = tern__cuda_env_int("TERN_CUDA_G1_EARLY", 7) & 7;
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    const bool early = tern__cuda_g1_early & (a.mode == G1_RES ? 2 : pair ? 4 : 1);
    const long ntask = pair ? a.rows : (a.rows + G1_R - 1) / G1_R;
    G1Regions cr;
    const size_t smem = (size_t)a.in * sizeof(float) * (a.cpa ? g1_regions(a, cr) : 1); /* cpa: a region a vector */
    if constexpr (g1_has_cpa<KIND>())
        if (a.cpa) { /* g1_cpa_pick: the early instances of every mode and epilogue */
            if (a.mv) g1_run<KIND, G1_U, true, false, true, true>(c, a, ntask, smem);
            else if (rope) g1_run<KIND, G1_U, true, true, false, true>(c, a, ntask, smem);
            else g1_run<KIND, G1_U, true, false, false, true>(c, a, ntask, smem);
            return;
        }
    if constexpr (g1_has_mv<KIND>())
        if (a.mv) { /* matmul_act_mul: BF16 / F16 / Q4, the early instance only (the same bits) */
            g1_run<KIND, G1_U, true, false, true>(c, a, ntask, smem);
            return;
        }
    if constexpr (g1_has_rope<KIND>())
        if (rope) {
            if (early) g1_run<KIND, G1_U, true, true>(c, a, ntask, smem);
            else g1_run<KIND, G1_U, false, true>(c, a, ntask, smem);
            return;
        }
    if constexpr (g1_has_early<KIND>())
        if (early) {
            g1_run<KIND, G1_U, true, false>(c, a, ntask, smem);
            return;
        }
    g1_run<KIND, G1_U, false, false>(c, a, ntask, smem);
}

template <int KIND, int U, bool EARLY, bool ROPE, bool MV = false, bool CPA = false> static void g1_allow1() {
    cudaFuncSetAttribute(g1_kernel<KIND, U, EARLY, ROPE, MV, CPA>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                         CPA ? G1_CPA_SMEM : (int)(G1_MAX_IN * sizeof(float)));
}
template <int KIND> static void g1_allow() {
    g1_allow1<KIND, G1_U, false, false>();
    if constexpr (g1_has_early<KIND>()) g1_allow1<KIND, G1_U, true, false>();
    if constexpr (g1_has_rope<KIND>()) {
        g1_allow1<KIND, G1_U, false, true>();
        g1_allow1<KIND, G1_U, true, true>();
    }
    if constexpr (g1_has_mv<KIND>()) g1_allow1<KIND, G1_U, true, false, true>();
    if constexpr (g1_has_cpa<KIND>()) {
        g1_allow1<KIND, G1_U, true, false, false, true>();
        g1_allow1<KIND, G1_U, true, true, false, true>();
        g1_allow1<KIND, G1_U, true, false, true, true>();
    }
}

/* The prologue's fields of a launch over weights like w0 (pre-norm nw / xn, residual res with its inner add) and
 * whether it takes the cpa prologue */
static void g1_prologue_args(Gemv1Args &a, const tern__cuda_w *w0, const float *nw, float *xn, float eps,
                             const tern_norm_res *res) {
    set_norm_args(a, nw, xn, eps, res);
    if (res) {
        a.rh2 = res->h2;
        a.rw2 = res->w2;
    }
    a.nrm = xn != NULL;
    a.in = w0->in;
    a.cpa = g1_cpa_pick(a, kind_of(w0));
}

/* TERN_CUDA_GEMV1=0 in the environment keeps the older n = 1 kernels (for comparisons). */
extern "C" int tern__cuda_gemv1_on;
int tern__cuda_gemv1_on = -1;
static bool g1_enabled() {
    if (tern__cuda_gemv1_on < 0) tern__cuda_gemv1_on = tern__cuda_env_int("TERN_CUDA_GEMV1", 1) != 0;
    return tern__cuda_gemv1_on != 0;
}

/* Can matrices w[0..k) (2-D views, matrix index e) run through gemv1 for one row x? */
bool tern__cuda_g1_fits(const tern__cuda_w *const *w, int k, const float *x) {
    if (!g1_enabled() || k < 1 || k > 3 || ((uintptr_t)x & 15)) return false;
    const tern__cuda_w *w0 = w[0];
    const int kind = kind_of(w0), ch = chunk_of(kind);
    if (w0->in % ch || w0->in > G1_MAX_IN || w0->in <= 0) return false;
    if (kind == 9 && (!w0->blk_rows || w0->group_size % 32)) return false;
    for (int i = 1; i < k; i++)
        if (w[i]->dtype != w0->dtype || w[i]->in != w0->in || w[i]->bits != w0->bits ||
            w[i]->group_size != w0->group_size || w[i]->sdtype != w0->sdtype || w[i]->blk_rows != w0->blk_rows)
            return false;
    return true;
}

static void g1_launch_norm(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e, int k,
                           const float *x, int mode, const float *nw, float *xn, float eps, const tern_norm_res *res,
                           const tern__cuda_rope_kv *rope = nullptr, const float *mv = nullptr, int mact = 0);
void tern__cuda_g1_launch(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e, int k,
                          const float *x, int mode) {
    g1_launch_norm(c, y, w, e, k, x, mode, NULL, NULL, 0.0f, NULL);
}

/* as tern__cuda_g1_launch; xn != NULL: the staged row is rmsnorm(x)·nw, also written to xn (res: of
 * x' = the residual add, written to res->x_out); mv != NULL (plain mode, one matrix): y = act(acc)·mv */
static void g1_launch_norm(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e,
                                      int k, const float *x, int mode, const float *nw, float *xn, float eps,
                                      const tern_norm_res *res, const tern__cuda_rope_kv *rope, const float *mv,
                                      int mact) {
    Gemv1Args a = {};
    if (rope) a.rope = *rope;
    a.mv = mv;
    a.mact = mact;
    g1_prologue_args(a, w[0], nw, xn, eps, res);
    if (tern__cuda_g1_xb < 0) tern__cuda_g1_xb = tern__cuda_env_int("TERN_CUDA_G1_XB", 1) != 0;
    a.xb = tern__cuda_g1_xb;
    if (tern__cuda_g1_epf < 0) tern__cuda_g1_epf = tern__cuda_env_int("TERN_CUDA_G1_EPF", 0) != 0;
    a.epf = tern__cuda_g1_epf;
    const tern__cuda_w *w0 = w[0];
    a.rows = mat_ptrs(a.data, a.scales, a.biases, a.y, a.out, y, w, e, k);
    a.nm = k;
    if (mode == G1_SILU || mode == G1_GELU) a.rows = w0->out;
    a.gs = w0->group_size; /* a.in: g1_prologue_args */
    a.gs_shift = w0->group_size == 32 ? 5 : w0->group_size == 64 ? 6 : 7;
    a.sdtype = w0->sdtype;
    a.br = w0->dtype == TERN_DT_F8_E4M3 ? w0->blk_rows : 0;
    a.ncs = a.br ? (w0->in + w0->group_size - 1) / w0->group_size : 0;
    a.mode = mode;
    a.x = x;
    if (a.rows <= 0) return;
    by_kind(kind_of(w0), [&](auto K) { g1_go<K.value>(c, a, rope != nullptr); });
    tern__cuda_check(c, "gemv1");
}

/* Fused entry points (cuda_internal.h). Each returns 1 when it ran the op, 0 when the shapes
 * or formats do not fit (the caller then runs the separate ops). */
extern "C" int tern__cuda_matmul_n(tern__cuda *c, int k, float *const *y, const float *x, int n,
                                   const tern__cuda_w *const *w) {
    const int e[3] = {0, 0, 0};
    if (n == 1 && tern__cuda_gemv_mma(c, y, w, e, k, x, G1_PLAIN)) return 1;
    if (n > 1 && tern__cuda_q4_rows(c, y, w, k, x, n, G1_PLAIN, 0)) return 1;
    if (n != 1 || !tern__cuda_g1_fits(w, k, x)) return 0;
    cudaSetDevice(c->device);
    tern__cuda_g1_launch(c, y, w, e, k, x, G1_PLAIN);
    return 1;
}

extern "C" int tern__cuda_matmul_glu(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *gate,
                                     const tern__cuda_w *up, int act) {
    const tern__cuda_w *w[2] = {gate, up};
    const int e[2] = {0, 0};
    float *ys[2] = {y, y};
    const int mode = act == TERN_ACT_SILU ? G1_SILU : G1_GELU;
    if (n == 1 && gate->out == up->out && tern__cuda_gemv_mma(c, ys, w, e, 2, x, mode)) return 1;
    if (n > 1 && gate->out == up->out && tern__cuda_q4_rows(c, ys, w, 2, x, n, mode, 0)) return 1;
    if (n != 1 || gate->out != up->out || !tern__cuda_g1_fits(w, 2, x)) return 0;
    cudaSetDevice(c->device);
    tern__cuda_g1_launch(c, ys, w, e, 2, x, act == TERN_ACT_SILU ? G1_SILU : G1_GELU);
    return 1;
}

extern "C" int tern__cuda_matmul_add(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w) {
    const int e[1] = {0};
    if (n == 1 && tern__cuda_gemv_mma(c, &y, &w, e, 1, x, G1_RES)) return 1;
    if (n > 1 && tern__cuda_q4_rows(c, &y, &w, 1, x, n, G1_RES, 0)) return 1;
    if (n != 1 || !tern__cuda_g1_fits(&w, 1, x)) return 0;
    cudaSetDevice(c->device);
    tern__cuda_g1_launch(c, &y, &w, e, 1, x, G1_RES);
    return 1;
}

/* norm_matmul folds a post-norm residual add in front (res; Gemma 4's post-norms). H200, session 11,
 * batch-1 decode at 512, with NORM_ROPE: bf16 (gemv1) e4b 210.2 → 215.0 tok/s, gemma4-12b 128.3 → 128.1
 * (even); q4 (gemv_mma, where every K-slice block forms the whole x') gemma4-12b 158.5 → 144.1, so the
 * default folds it into gemv1 only. TERN_CUDA_NORM_RES=0: never (rmsnorm_add as its own launch), =1:
 * gemv_mma too. Op test cuda_norm_matmul_res (both kernels), parity 18/18. H100, session 56 (NOTES (bp)), after RMSU
 * and the fence-free split-K hand-off, 2 → 1 still lost: b1 q4 gemma4-e4b 280.6 → 275.9, gemma4-12b 190.5 → 182.6. */
int tern__cuda_norm_res = -1; /* -1 unread, 0 off, 1 both kernels, 2 gemv1 only; tests set it */
static int tern__cuda_norm_res_on(void) {
    if (tern__cuda_norm_res < 0) {
        tern__cuda_norm_res = tern__cuda_env_int("TERN_CUDA_NORM_RES", 2);
        if (tern__cuda_norm_res < 0 || tern__cuda_norm_res > 2) tern__cuda_norm_res = 2;
    }
    return tern__cuda_norm_res;
}

/* gemv1's residual prologue can take res for the row x: the fold is on, x' goes to a buffer of its own (neither x nor
 * h), and x', h and w are 16-byte aligned */
static bool g1_res_ok(const tern_norm_res *res, const float *x, const tern__cuda_w *w, const float *nw, float *xn) {
    if (res->h2) { /* the inner add: the cpa prologue only (the launch's own choice) */
        Gemv1Args a = {};
        g1_prologue_args(a, w, nw, xn, 0.0f, res);
        if (!a.cpa) return false;
    }
    return tern__cuda_norm_res_on() && res->x_out && res->x_out != x && (const float *)res->x_out != res->h &&
           (const float *)res->x_out != res->h2 && res->h2 != res->h &&
           !(((uintptr_t)res->x_out | (uintptr_t)res->h | (uintptr_t)res->w | (uintptr_t)res->h2 | (uintptr_t)res->w2) & 15);
}

/* TERN_CUDA_MM_NORM=0: formats of gemv_mma.cu (Q4) run rmsnorm as its own launch (A/B) */
static int tern__cuda_mm_norm_on(void) {
    static int v = -1;
    if (v < 0) v = tern__cuda_env_int("TERN_CUDA_MM_NORM", 1) != 0;
    return v;
}

/* xn = rmsnorm(x)·nw for one row, then the fused op on xn (mode G1_PLAIN over k matrices, k = 1 being
 * the plain matmul; G1_SILU / G1_GELU over gate, up) in one gemv1 launch: bitwise rmsnorm + the op
 * (block_rms_inv is rmsnorm's reduction); formats gemv_mma.cu serves (Q4) go there, its x staging
 * normalising the same way. Declines (0) what neither would run for the separate op: several rows,
 * in-place norms (block 0 writes xn while the others read x), misaligned rows, and for k = 1 the
 * rows tern__cuda_gemv sends to other kernels (tall Q matrices, TERN_CUDA_GEMV_Q1 variants). */
extern "C" int tern__cuda_norm_matmul(tern__cuda *c, float *xn, const float *x, const float *nw, float eps, int n,
                                      int k, float *const *y, const tern__cuda_w *const *w, int mode,
                                      const tern_norm_res *res) {
    const bool pair = mode == G1_SILU || mode == G1_GELU;
    if (n != 1 || xn == x || ((uintptr_t)xn & 15) || ((uintptr_t)nw & 15) || (pair && (k != 2 || w[0]->out != w[1]->out)))
        return 0;
    if (res && !g1_res_ok(res, x, w[0], nw, xn)) return 0;
    if (mode != G1_PLAIN && !pair) return 0;
    const int e[3] = {0, 0, 0};
    float *ys[3] = {y[0], pair ? y[0] : k > 1 ? y[1] : NULL, k > 2 ? y[2] : NULL};
    if (tern__cuda_gemv_mma_serves(c, w, k, x, mode)) { /* Q4: its tensor-core GEMV stages the norm */
        if (!tern__cuda_mm_norm_on() || (res && (tern__cuda_norm_res_on() != 1 || res->h2))) return 0;
        return tern__cuda_gemv_mma_norm(c, ys, w, e, k, x, mode, nw, xn, eps, res);
    }
    if ((k == 1 && !pair) ? !tern__cuda_gemv_row_g1(w[0], x) : !tern__cuda_g1_fits(w, k, x)) return 0;
    cudaSetDevice(c->device);
    g1_launch_norm(c, ys, w, e, k, x, mode, nw, xn, eps, res);
    return 1;
}

/* ops.h matmul_act_mul for one row (Gemma 4's per-layer input gate): y = act(x'·wᵀ)·v, x' = x or, with res,
 * norm_matmul's residual prologue (x' written to res->x_out; its rmsnorm at eps) without a pre-norm, in one gemv1
 * launch (the MV epilogue) — BF16 / F16 weights, and Q4 where the tensor-core GEMV does not take the matrix (it has no
 * such epilogue; TERN_CUDA_GEMV_MMA_MIN sends small ones here: gemma4-e4b's 0.37 MB gate, which otherwise costs
 * rmsnorm_add + the walk + an elementwise launch); bitwise rmsnorm_add + the matmul + the elementwise act·v. Else 0
 * (the caller runs the separate ops). */
extern "C" int tern__cuda_matmul_act_mul(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int act,
                                         const float *v, const tern_norm_res *res, float eps) {
    const int kind = kind_of(w);
    if (n != 1 || !g1_mv_kind(kind) || !tern__cuda_g1_fits(&w, 1, x) || y == x || (const float *)y == v) return 0;
    if (kind == 4 && tern__cuda_gemv_mma_serves(c, &w, 1, x, G1_PLAIN)) return 0;
    if (res && !g1_res_ok(res, x, w, NULL, NULL)) return 0;
    const int e[1] = {0};
    cudaSetDevice(c->device);
    g1_launch_norm(c, &y, &w, e, 1, x, G1_PLAIN, NULL, NULL, eps, res, nullptr, v, act);
    return 1;
}

/* ops.h norm_qkv_rope_kv for one row: q|k|v from the pre-normed row with rope_kv_write in the epilogue
 * (rope_kv.cuh) — BF16 / F16 weights on gemv1, Q4 on the tensor-core GEMV (gemv_mma.cu, where it serves: the XP1
 * walk, heads of d <= 128 inside its 128-row blocks, split K) — over F32 / BF16 / F16 pages; else 0 (the caller
 * runs norm_matmul, then rope_kv_write). TERN_CUDA_QKV_ROPE (a mask, read once): 1 gemv1 (default), 2 gemv_mma,
 * 3 both, 0 off. H200, session 20 (NOTES (ad)), llama3-8b b1 tok/s: bf16 at 512 off → 1: 219.3 / 217.4 → 219.8 /
 * 219.8, at 8k 194.5 → 195.7; q4 (bit 2) at 512 a tie (333.5 / 334.7 with, 332.9 / 333.8 without), at 8k 285.0 /
 * 287.2 → 280.8 / 282.8: the Q4 epilogue (two barriers in the last slice block) loses there, so it is opt-in. */
extern "C" int tern__cuda_qkv_rope;
int tern__cuda_qkv_rope = -1;
extern "C" int tern__cuda_norm_qkv_rope_kv(tern__cuda *c, float *xn, const float *x, const float *nw, float eps,
                                           float *const *y, const tern__cuda_w *const *w, const tern_kv_layer *kv,
                                           const tern_rows *rows, int nh, const float *inv_freq, float mscale) {
    if (tern__cuda_qkv_rope < 0) tern__cuda_qkv_rope = tern__cuda_env_int("TERN_CUDA_QKV_ROPE", 1) & 3;
    const int kind = kv->kf.kind, d = kv->head_dim, nkv = kv->n_head_kv, wk = kind_of(w[0]);
    if (!tern__cuda_qkv_rope || rows->n != 1 || xn == x || ((uintptr_t)xn & 15) || ((uintptr_t)nw & 15))
        return 0;
    if (!tern__cuda_rope_pages(kv) || w[0]->out != nh * d || w[1]->out != nkv * d || w[2]->out != nkv * d) return 0;
    const tern__cuda_rope_kv r = {inv_freq, rows->pos, rows->slot, kv->block_table, kv->k, kv->v, mscale, nh, nkv, d,
                                  kv->max_blocks, kv->block_size, kind == TERN_KV_F32 ? 0 : kind == TERN_KV_BF16 ? 1 : 2};
    if (tern__cuda_gemv_mma_serves(c, w, 3, x, G1_PLAIN))
        return (tern__cuda_qkv_rope & 2) && tern__cuda_mm_norm_on() && tern__cuda_gemv_mma_rope(c, y, w, x, nw, xn, eps, &r);
    if (!(tern__cuda_qkv_rope & 1) || (wk != 16 && wk != 17) || !tern__cuda_g1_fits(w, 3, x)) return 0;
    const int e[3] = {0, 0, 0};
    cudaSetDevice(c->device);
    g1_launch_norm(c, y, w, e, 3, x, G1_PLAIN, nw, xn, eps, NULL, &r);
    return 1;
}

/* ---- MoE gate/up/act of routed pairs in one launch: moe_gateup_kernel ----
 * A block (8 warps) owns one token t and a tile of rt rows: it stages x_t in shared memory once
 * (gemv1's swizzled layout), so the k pairs of the token and the rt rows all share one read of
 * x. The k·rt items (pair j, row o) go to the warps round-robin; a warp computes row o of
 * gate_e and of up_e (e = idx[t·k + j]) with U chunks of both rows in flight per lane, and
 * lane 0 writes act(g)·u to h[t·k + j][o]. A warp's first loads are issued before x is
 * staged. Per row the f32 operations are those of gemv_kernel<KIND, 1> in expert mode (lane l:
 * chunks l, l+32, ... in order, per chunk s·Σq·x + b·Σx; its term sum fmaf(1, acc, 0); the same
 * warp_sum), and act(g)·u is moe_act's expression, so h is bitwise the 3-kernel path's. */
struct MoeGuArgs {
    const uint8_t *data[2], *scales[2], *biases[2]; /* gate, up: matrix 0 of each stack */
    size_t mat_bytes[2], mat_bytes_s[2];
    int I, in, gs, gs_shift, sdtype, br, ncs, nmat, k, rt, act, hstride;
    int cpa; /* x_t staged by cp.async (TERN_CUDA_MOE_GU_CPA) */
    const int32_t *idx; /* [n][k] expert ids */
    const float *x;     /* [n][in] */
    float *h;           /* pair p's row at h + p * hstride */
};

template <int KIND, int U> __global__ void __launch_bounds__(256) moe_gateup_kernel(MoeGuArgs a) {
    pdl_start();
    using K = Kind<KIND>;
    constexpr int CH = K::CH, C4 = CH / 4, W = K::WORDS;
    extern __shared__ float4 xs1[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = blockIdx.y;
    const int nch = a.in / CH, ng = K::Q ? a.in >> a.gs_shift : 0, items = a.k * a.rt;
    const size_t rb = (size_t)a.in * (K::Q ? KIND : K::EB) / (K::Q ? 8 : 1);
    uint32_t wd[U][2][W];
    float s[U][2], b[U][2];
    const uint8_t *rowp[2], *sp[2], *bp[2];
    int o = 0, p = 0, st = 0; /* st: 0 no row, 1 expert id out of range (h = act(0)·0), 2 compute */
    auto setup = [&](int it) {
        o = blockIdx.x * a.rt + it % a.rt;
        p = t * a.k + it / a.rt;
        st = 0;
        if (o >= a.I) return;
        const int e = a.idx[p];
        st = e >= 0 && e < a.nmat ? 2 : 1;
        if (st == 1) return;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            rowp[r] = a.data[r] + (size_t)e * a.mat_bytes[r] + (size_t)o * rb;
            sp[r] = a.scales[r] + (size_t)e * a.mat_bytes_s[r];
            bp[r] = a.biases[r] + (size_t)e * a.mat_bytes_s[r];
        }
    };
    auto load = [&](int c0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * 32 + lane;
            if (c < nch) {
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    load_chunk<KIND>(rowp[r], c, wd[u][r]);
                    if constexpr (K::Q) {
                        const size_t gi = (size_t)o * ng + ((c * 32) >> a.gs_shift);
                        s[u][r] = load_s(sp[r], a.sdtype, gi);
                        b[u][r] = load_s(bp[r], a.sdtype, gi);
                    } else if constexpr (K::F8) {
                        s[u][r] = ((const float *)sp[r])[(size_t)(o / a.br) * a.ncs + (size_t)(c * 32 / a.gs)];
                    }
                }
            }
        }
    };
    if (warp < items) {
        setup(warp);
        if (st == 2) load(0);
    }
    const float4 *xt = (const float4 *)(a.x + (size_t)t * a.in);
    if (a.cpa) { /* all of x_t in flight at once (cp.async), one round trip */
        g1_copy(xs1, (const float *)xt, nch * C4, C4);
        mma_cp_commit_ord();
        mma_cp_wait_ord<0>();
    } else {
        for (int f = threadIdx.x; f < nch * C4; f += 256) xs1[g1swz(f, C4)] = __ldg(xt + f);
    }
    __syncthreads();
    for (int it = warp; it < items; it += 8) {
        if (it != warp) {
            setup(it);
            if (st == 2) load(0);
        }
        if (st == 0) continue;
        float acc[2] = {0.0f, 0.0f};
        for (int c0 = 0; st == 2 && c0 < nch; c0 += 32 * U) {
            if (c0) load(c0);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u * 32 + lane;
                if (c >= nch) continue;
                float qa[2], xsum = 0.0f;
                chunk_dot<KIND, 2, C4, K::Q>(wd[u], [&](int k4) { return xs1[g1swz(c * C4 + k4, C4)]; }, qa, xsum);
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    if constexpr (K::Q) acc[r] += fmaf(s[u][r], qa[r], b[u][r] * xsum);
                    else if constexpr (K::F8) acc[r] = fmaf(s[u][r], qa[r], acc[r]);
                    else acc[r] += qa[r];
                }
            }
        }
        const float g = warp_sum(fmaf(1.0f, acc[0], 0.0f)), v = warp_sum(fmaf(1.0f, acc[1], 0.0f));
        if (lane == 0) a.h[(size_t)p * a.hstride + o] = (a.act == TERN_ACT_SILU ? silu(g) : gelu_tanh(g)) * v;
    }
}

template <int KIND> static void gu_go(cudaStream_t st, dim3 grid, const MoeGuArgs &a) {
    tern_launch(st, moe_gateup_kernel<KIND, G1_U>, grid, 256, (size_t)a.in * sizeof(float), a);
}

template <int KIND> static void gu_allow() {
    cudaFuncSetAttribute(moe_gateup_kernel<KIND, G1_U>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)(G1_MAX_IN * sizeof(float)));
}

/* Resident blocks per SM of moe_gateup_kernel<KIND> (occupancy query, cached per kind and width) */
template <int KIND> static int gu_blocks_per_sm(int in) {
    static int nb, nb_in = -1;
    if (nb_in != in) {
        int v = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, moe_gateup_kernel<KIND, G1_U>, 256,
                                                          (size_t)in * sizeof(float)) != cudaSuccess || v < 1) {
            cudaGetLastError();
            v = 1;
        }
        nb = v;
        nb_in = in;
    }
    return nb;
}

static int gu_occupancy(int kind, int in) {
    return by_kind(kind, [&](auto K) { return gu_blocks_per_sm<K.value>(in); });
}

/* Rows per block tile: at least one item per warp (k·rt >= 8), and enough that the grid fits in
 * one wave of resident blocks (fewer x stagings per weight byte, no tail wave), at most 16;
 * TERN_CUDA_MOE_RT=N forces N (1..64). n = 1, gemma4-26b-a4b (I 704, k 8), 2 blocks/SM on 132
 * SMs: rt 3, 235 blocks of 24 items. */
int tern__cuda_moe_rt = -1; /* TERN_CUDA_MOE_RT, read once (-1); 0: the rule below; tests set it */
static int gu_rows(const tern__cuda *c, int kind, int n, int I, int in, int k) {
    if (tern__cuda_moe_rt < 0) {
        tern__cuda_moe_rt = tern__cuda_env_int("TERN_CUDA_MOE_RT", 0);
        if (tern__cuda_moe_rt < 0) tern__cuda_moe_rt = 0;
    }
    const int force = tern__cuda_moe_rt;
    if (force >= 1) return force < 64 ? force : 64;
    const long slots = (long)gu_occupancy(kind, in) * (c->n_sm > 0 ? c->n_sm : 1);
    long rt = ((long)n * I + slots - 1) / slots;
    if (rt * k < 8) rt = (8 + k - 1) / k;
    return rt < 16 ? (int)rt : 16;
}

/* A stack the chunked expert kernels serve: every chunked format, rows a whole number of chunks */
static bool moe_fmt_ok(const tern__cuda_w *g) {
    const tern_dtype dt = g->dtype;
    if (dt != TERN_DT_Q && dt != TERN_DT_F8_E4M3 && dt != TERN_DT_F16 && dt != TERN_DT_BF16 && dt != TERN_DT_F32)
        return false;
    if (dt == TERN_DT_Q && (g->bits < 2 || g->bits > 8 || g->bits == 7 ||
                            (g->group_size != 32 && g->group_size != 64 && g->group_size != 128)))
        return false;
    if (dt == TERN_DT_F8_E4M3 && (!g->scales || !g->blk_rows || g->group_size % 32)) return false;
    return g->in > 0 && g->in % chunk_of(kind_of(g)) == 0 && g->out > 0;
}

/* TERN_CUDA_MOE_GU_CPA (read once; default 1; tests set it): moe_gateup_kernel stages x_t by cp.async, every float4
 * in flight at once, instead of a load-then-store loop (3 dependent L2 round trips a block at in 2816); the same values,
 * so the same bits (op test cuda_moe_mlp runs both). H100, session 59 (NOTES (bs)), gemma4-26b-a4b bf16 b1 0 / 1:
 * 254.9 / 255.7 → 256.0 / 256.8 tok/s (+0.4 %). */
extern "C" int tern__cuda_moe_gu_cpa;
int tern__cuda_moe_gu_cpa = -1;
extern "C" int tern__cuda_moe_gateup(tern__cuda *c, float *h, int hstride, const float *x, int n,
                                     const int32_t *idx, int k, const tern__cuda_w *gate, const tern__cuda_w *up,
                                     int act) {
    const tern__cuda_w *g = gate, *u = up;
    if (n <= 0 || k <= 0) return 1;
    if (g->dtype != u->dtype || g->bits != u->bits || g->group_size != u->group_size || g->sdtype != u->sdtype ||
        g->blk_rows != u->blk_rows || g->in != u->in || g->out != u->out || g->nmat != u->nmat)
        return 0;
    if (!moe_fmt_ok(g) || g->in > G1_MAX_IN || ((uintptr_t)x & 15)) return 0;
    const tern_dtype dt = g->dtype;
    const int kind = kind_of(g);
    MoeGuArgs a = {};
    const tern__cuda_w *w[2] = {g, u};
    for (int r = 0; r < 2; r++) {
        a.data[r] = (const uint8_t *)w[r]->data;
        a.scales[r] = (const uint8_t *)w[r]->scales;
        a.biases[r] = (const uint8_t *)w[r]->biases;
        a.mat_bytes[r] = w[r]->mat_bytes;
        a.mat_bytes_s[r] = w[r]->mat_bytes_s;
    }
    a.I = g->out;
    a.in = g->in;
    a.gs = g->group_size;
    a.gs_shift = g->group_size == 32 ? 5 : g->group_size == 64 ? 6 : 7;
    a.sdtype = g->sdtype;
    a.br = dt == TERN_DT_F8_E4M3 ? g->blk_rows : 0;
    a.ncs = a.br ? (g->in + g->group_size - 1) / g->group_size : 0;
    a.nmat = g->nmat;
    a.k = k;
    cudaSetDevice(c->device);
    a.rt = gu_rows(c, kind, n, a.I, a.in, k);
    a.act = act;
    a.hstride = hstride;
    if (tern__cuda_moe_gu_cpa < 0) tern__cuda_moe_gu_cpa = tern__cuda_env_int("TERN_CUDA_MOE_GU_CPA", 1) != 0;
    a.cpa = tern__cuda_moe_gu_cpa;
    const dim3 blk0((unsigned)((a.I + a.rt - 1) / a.rt));
    for (int t0 = 0; t0 < n; t0 += 65535) { /* grid.y limit */
        const int m = n - t0 < 65535 ? n - t0 : 65535;
        MoeGuArgs b = a;
        b.idx = idx + (size_t)t0 * k;
        b.x = x + (size_t)t0 * g->in;
        b.h = h + (size_t)t0 * k * hstride;
        const dim3 grid(blk0.x, (unsigned)m);
        by_kind(kind, [&](auto K) { gu_go<K.value>(c->stream, grid, b); });
    }
    tern__cuda_check(c, "moe gate/up");
    return 1;
}

void tern__cuda_gemv1_init(void) { /* shared-memory limits of the big instances, at backend open */
    g1_allow<2>(); g1_allow<3>(); g1_allow<4>(); g1_allow<5>(); g1_allow<6>(); g1_allow<8>();
    g1_allow<9>(); g1_allow<16>(); g1_allow<17>(); g1_allow<32>();
    gu_allow<2>(); gu_allow<3>(); gu_allow<4>(); gu_allow<5>(); gu_allow<6>(); gu_allow<8>();
    gu_allow<9>(); gu_allow<16>(); gu_allow<17>(); gu_allow<32>();
}

/*
 * moe_gemm.cu — moe_mlp for many routed pairs (bf16 compute mode): sort the pairs by expert,
 * then one grouped tensor-core GEMM per projection that reads each expert's weights once per
 * tile of up to BN pairs, instead of once per pair (the pair path of moe.cu).
 *
 *   1. plan (one block): per-expert counts, offsets off[E+1] and the work table tiles[] =
 *      (expert, first sorted row, rows <= BN) with its length ntiles — all on the GPU, so the
 *      step needs no host round-trip and records into a CUDA graph; grids are sized by the
 *      host's upper bound np/BN + min(E, np) + 1 and blocks past ntiles return at once.
 *   2. scatter (one block per expert): a stable compaction, so within an expert the pairs keep
 *      their order (token, then slot j): perm[sorted row] = pair, ipos[pair] = sorted row.
 *   3. gate and up in one launch (grid.z): block (column tile of 128 weight rows, tile, z)
 *      multiplies rows x[perm[s] / k] of its tile with its expert's matrix; the mma.sync
 *      scheme, K blocks and split-bf16 accuracy of qgemm.cu (helpers in qgemm_frag.cuh), plus
 *      a K tail (inputs a multiple of 32, not 128: gemma4's I = 704). h = act(gate)·up in place.
 *   4. down the same way over the sorted h rows into o[sorted row][H] (gemm_scratch).
 *   5. combine: y[r] = Σ_j wts[r][j] · o[ipos[r·k + j]], j = 0..k-1 in order (no atomics).
 * Deterministic, and batch-invariant for a fixed tile height (a row's bits do not depend on its
 * tile position). Not bitwise the pair path (MMA vs GEMV summation); bound = the bf16x2 mode's
 * split-bf16 contract (rel L2 <= 1e-4 vs cpu-ref, observed <= 8e-6); under `--compute bf16` the
 * products are Wh·xh only (plain, like qgemm.cu: ~2e-3 on random data). The f32 mode never comes here
 * (exact f32 stays on the pair path). Formats: MLX Q bits 4/8 (groups 32/64/128), BF16, F16;
 * others take the pair path. H200: gemma4-26b-a4b q4 bf16 pp512 1455 -> 3578 tok/s.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/qgemm_frag.cuh"

#include <stdlib.h>

#define MG_EMAX 2048 /* experts the plan kernel keeps in shared memory */

struct MgW {
    const uint8_t *w, *s, *b; /* matrix 0 */
    size_t mat_bytes, mat_bytes_s, rb;
    int out, gs_shift, sdtype, ycol;
};

struct MgArgs {
    MgW w[2];                /* gate, up (grid.z = 2) or down (grid.z = 1) */
    int in, nkb;
    const float *x;
    int xstride, xdiv;
    const int32_t *perm;     /* sorted row -> pair (x row = pair / xdiv); NULL: x row = sorted row */
    const int4 *tiles;       /* (expert, first sorted row, rows) */
    const int *ntiles;
    float *y;                /* y[sorted row * ystride + ycol + weight row] */
    int ystride;
    int plain;               /* --compute bf16 (not bf16x2): Wh·xh only, as qgemm.cu's plain GEMMs */
};

/* ---- sorting ---- */

__global__ void mg_plan(const int32_t *idx, int np, int E, int BN, int *off, int4 *tiles, int *ntiles,
                        int32_t *ipos) {
    pdl_start();
    __shared__ int cnt[MG_EMAX], so[MG_EMAX], ts[MG_EMAX];
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < np; p += blockDim.x) {
        const int e = idx[p];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
        else ipos[p] = -1; /* skipped, as in the pair path */
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* warp 0: exclusive scans of rows and tiles over the experts */
        const int lane = threadIdx.x, per = (E + 31) / 32, e0 = min(E, lane * per), e1 = min(E, e0 + per);
        int lc = 0, lt = 0;
        for (int e = e0; e < e1; e++) { lc += cnt[e]; lt += (cnt[e] + BN - 1) / BN; }
        int sc = lc, st = lt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int vc = __shfl_up_sync(0xffffffffu, sc, o), vt = __shfl_up_sync(0xffffffffu, st, o);
            if (lane >= o) { sc += vc; st += vt; }
        }
        int oc = sc - lc, ot = st - lt;
        for (int e = e0; e < e1; e++) {
            so[e] = oc; ts[e] = ot; off[e] = oc;
            oc += cnt[e]; ot += (cnt[e] + BN - 1) / BN;
        }
        if (lane == 31) { off[E] = sc; *ntiles = st; }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int s = 0; s < cnt[e]; s += BN) tiles[ts[e] + s / BN] = make_int4(e, so[e] + s, min(BN, cnt[e] - s), 0);
}

__global__ void mg_scatter(const int32_t *idx, int np, const int *off, int32_t *perm, int32_t *ipos) {
    pdl_start();
    __shared__ int wsum[32];
    const int e = blockIdx.x, end = off[e + 1], warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nw = blockDim.x >> 5;
    int base = off[e];
    for (int c0 = 0; c0 < np && base < end; c0 += blockDim.x) { /* base is uniform: barriers too */
        const int p = c0 + threadIdx.x;
        const bool m = p < np && idx[p] == e;
        const unsigned b = __ballot_sync(0xffffffffu, m);
        if (lane == 0) wsum[warp] = __popc(b);
        __syncthreads();
        int pre = 0, tot = 0;
        for (int w = 0; w < nw; w++) {
            const int v = wsum[w];
            pre += w < warp ? v : 0;
            tot += v;
        }
        if (m) {
            const int q = base + pre + __popc(b & ((1u << lane) - 1u));
            perm[q] = p;
            ipos[p] = q;
        }
        base += tot;
        __syncthreads();
    }
}

/* ---- the grouped GEMM (the K loop of qgemm_kernel, per work item) ---- */

/* PL: the plain mode compiled in for Q experts (no Wl half at all; qgemm.cu's PL) */
template <int KIND, int NT, bool PL = false>
__global__ void __launch_bounds__(256, NT <= 2 ? 2 : 1) mg_kernel(MgArgs a) {
    pdl_start();
    constexpr int W = QgKind<KIND>::W, BN = NT * 8, XT = BN * 16 / 256;
    constexpr bool Q = QgKind<KIND>::Q, LO = KIND != 17 && !PL;
    extern __shared__ uint4 xs[]; /* [2 buffers][hi, lo][BN rows][16 chunks] */
    if ((int)blockIdx.y >= *a.ntiles) return;
    const MgW mw = blockIdx.z ? a.w[1] : a.w[0];
    if ((int)blockIdx.x * QG_BM >= mw.out) return;
    const int4 tile = a.tiles[blockIdx.y]; /* x = expert, y = first sorted row, z = rows */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * QG_BM + warp * 16;
    const int r0 = min(row0 + g, mw.out - 1), r1 = min(row0 + g + 8, mw.out - 1);
    const size_t kstep = (size_t)W * 16;
    const uint8_t *wm = mw.w + (size_t)tile.x * mw.mat_bytes;
    const uint8_t *p0 = wm + (size_t)r0 * mw.rb + (size_t)t * W * 4, *p1 = wm + (size_t)r1 * mw.rb + (size_t)t * W * 4;
    const uint8_t *sm = Q ? mw.s + (size_t)tile.x * mw.mat_bytes_s : NULL;
    const uint8_t *bm = Q ? mw.b + (size_t)tile.x * mw.mat_bytes_s : NULL;
    const int ng = Q ? a.in >> mw.gs_shift : 0;

    constexpr int NC = NT <= 2 ? NT : 1;
    float acc[NT][4], cor[NC][4];
#pragma unroll
    for (int i = 0; i < NT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
#pragma unroll
    for (int i = 0; i < NC; i++) cor[i][0] = cor[i][1] = cor[i][2] = cor[i][3] = 0.0f;

    /* x staging: task i -> tile row i/16, chunk i%16; the row's source is fixed per task */
    const float *xrow[XT];
#pragma unroll
    for (int j = 0; j < XT; j++) {
        const int r = (threadIdx.x + j * 256) >> 4;
        xrow[j] = NULL;
        if (r < tile.z) {
            const int s = tile.y + r, src = a.perm ? a.perm[s] / a.xdiv : s;
            xrow[j] = a.x + (size_t)src * a.xstride;
        }
    }
    float4 xr[XT][2];
    auto load_x = [&](int kb) {
#pragma unroll
        for (int j = 0; j < XT; j++) {
            const int c = (threadIdx.x + j * 256) & 15, col = kb * QG_KB + c * 8;
            if (xrow[j] && col < a.in) {
                const float4 *src = (const float4 *)(xrow[j] + col);
                xr[j][0] = __ldg(src);
                xr[j][1] = __ldg(src + 1);
            } else {
                xr[j][0] = xr[j][1] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
    };
    auto store_x = [&](int buf) {
#pragma unroll
        for (int j = 0; j < XT; j++) {
            const int i = threadIdx.x + j * 256, r = i >> 4, c = i & 15;
            uint4 h, l;
            split2(xr[j][0].x, xr[j][0].y, h.x, l.x);
            split2(xr[j][0].z, xr[j][0].w, h.y, l.y);
            split2(xr[j][1].x, xr[j][1].y, h.z, l.z);
            split2(xr[j][1].z, xr[j][1].w, h.w, l.w);
            xs[((buf * 2 + 0) * BN + r) * 16 + swz(c, r)] = h;
            xs[((buf * 2 + 1) * BN + r) * 16 + swz(c, r)] = l;
        }
    };
    constexpr int D = NT <= 2 && W <= 6 ? 3 : 2;
    uint32_t w0[D][W], w1[D][W];
    float s0[D], b0[D], s1[D], b1[D];
    auto load_w = [&](int kb, int u) {
        const int k0 = kb * QG_KB + 32 * t;
        if (k0 < a.in) {
            ld_words<W>(p0 + (size_t)kb * kstep, w0[u]);
            ld_words<W>(p1 + (size_t)kb * kstep, w1[u]);
        } else { /* K tail: zero codes with zero scale and bias decode to 0 */
#pragma unroll
            for (int i = 0; i < W; i++) w0[u][i] = w1[u][i] = 0u;
        }
        s0[u] = b0[u] = s1[u] = b1[u] = 0.0f;
        if constexpr (Q) {
            if (k0 < a.in) {
                const int gc = k0 >> mw.gs_shift;
                s0[u] = load_s(sm, mw.sdtype, (size_t)r0 * ng + gc);
                b0[u] = load_s(bm, mw.sdtype, (size_t)r0 * ng + gc);
                s1[u] = load_s(sm, mw.sdtype, (size_t)r1 * ng + gc);
                b1[u] = load_s(bm, mw.sdtype, (size_t)r1 * ng + gc);
            }
        }
    };

    const int kb1 = a.nkb;
    load_x(0);
    store_x(0);
#pragma unroll
    for (int u = 0; u < D - 1; u++)
        if (u < kb1) load_w(u, u);
    __syncthreads();
    for (int base = 0; base < kb1; base += D) {
#pragma unroll
        for (int u = 0; u < D; u++) {
            const int kb = base + u;
            if (kb >= kb1) break;
            const int buf = kb & 1;
            const bool more = kb + 1 < kb1;
            if (kb + D - 1 < kb1) load_w(kb + D - 1, (u + D - 1) % D);
            if (more) load_x(kb + 1);
            const uint4 *xh = xs + (size_t)(buf * 2) * BN * 16, *xl = xh + BN * 16;
#pragma unroll
            for (int sp = 0; sp < 4; sp++) {
                uint32_t ah[2][4], al[2][4];
                frag_a<KIND>(w0[u], w1[u], s0[u], b0[u], s1[u], b1[u], 2 * sp, ah[0], al[0]);
                frag_a<KIND>(w0[u], w1[u], s0[u], b0[u], s1[u], b1[u], 2 * sp + 1, ah[1], al[1]);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    /* 16-row tiles: skip the empty 8-row half (block-uniform). Not for 64-row tiles:
                     * the early exit cost NT = 8 10-35 % on the H200 (register scheduling) */
                    if constexpr (NT <= 2)
                        if (nt * 8 >= tile.z) break;
                    const int r = nt * 8 + g, ph = swz(4 * t + sp, r);
                    const uint4 h = xh[r * 16 + ph], l = xl[r * 16 + ph];
                    float *cc = NT <= 2 ? cor[nt % NC] : acc[nt];
                    if (PL || a.plain) { /* uniform branch: Wh·xh only */
                        mma16816(acc[nt], ah[0], h.x, h.y);
                        mma16816(acc[nt], ah[1], h.z, h.w);
                        continue;
                    }
                    mma16816(acc[nt], ah[0], h.x, h.y);
                    mma16816(cc, ah[0], l.x, l.y);
                    mma16816(acc[nt], ah[1], h.z, h.w);
                    mma16816(cc, ah[1], l.z, l.w);
                    if constexpr (LO) {
                        mma16816(cc, al[0], h.x, h.y);
                        mma16816(cc, al[1], h.z, h.w);
                    }
                }
            }
            if (more) store_x(buf ^ 1);
            __syncthreads();
        }
    }
    if constexpr (NT <= 2) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[nt][i] += cor[nt][i];
    }
    float *dst = a.y + mw.ycol;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = row0 + g + (i >> 1) * 8, col = nt * 8 + 2 * t + (i & 1);
            if (row < mw.out && col < tile.z) dst[(size_t)(tile.y + col) * a.ystride + row] = acc[nt][i];
        }
}

/* y[r] = Σ_j wts[r·k + j] · o[ipos[r·k + j]] over the pairs that were routed, j in order (o f32, or bf16 from
 * moe_blas.cu) */
__device__ __forceinline__ float4 mg_ld4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float4 mg_ld4(const __nv_bfloat16 *p) {
    const uint2 raw = *(const uint2 *)p;
    const float2 lo = __bfloat1622float2(*(const __nv_bfloat162 *)&raw.x);
    const float2 hi = __bfloat1622float2(*(const __nv_bfloat162 *)&raw.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
template <typename T>
__global__ void mg_combine(float *y, const T *o, const int32_t *ipos, const float *wts, int n, int k, int H) {
    pdl_start();
    const int H4 = H >> 2;
    const size_t total = (size_t)n * H4;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(i / H4), c = (int)(i % H4);
        float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int j = 0; j < k; j++) {
            const int q = ipos[(size_t)r * k + j];
            if (q < 0) continue;
            const float w = wts[(size_t)r * k + j];
            const float4 v = mg_ld4(o + (size_t)q * H + 4 * c);
            s.x = fmaf(w, v.x, s.x); s.y = fmaf(w, v.y, s.y); s.z = fmaf(w, v.z, s.z); s.w = fmaf(w, v.w, s.w);
        }
        ((float4 *)(y + (size_t)r * H))[c] = s;
    }
}

/* mg_combine over m tokens: o is [m·k][H] f32, or bf16 when o_bf16 (cuda_internal.h) */
extern "C" void tern__cuda_moe_combine(tern__cuda *c, float *y, const void *o, int o_bf16, const int32_t *ipos,
                                       const float *wts, int m, int k, int H) {
    const unsigned grid = tern_grid256((size_t)m * (H / 4), 8192);
    if (o_bf16)
        tern_launch(c->stream, mg_combine<__nv_bfloat16>, grid, 256, 0, y, (const __nv_bfloat16 *)o, ipos, wts, m, k, H);
    else tern_launch(c->stream, mg_combine<float>, grid, 256, 0, y, (const float *)o, ipos, wts, m, k, H);
    tern__cuda_check(c, "moe combine");
}

/* ---- host side ---- */

static size_t mg_smem(int nt) { return (size_t)2 * 2 * nt * 8 * 16 * 16; }

template <int KIND, bool PL = false> static void mg_launch(cudaStream_t st, dim3 grid, int nt, const MgArgs &a) {
    if constexpr (KIND <= 8 && !PL)
        if (a.plain) return mg_launch<KIND, true>(st, grid, nt, a);
    if (nt == 2) tern_launch(st, mg_kernel<KIND, 2, PL>, grid, 256, mg_smem(2), a);
    else tern_launch(st, mg_kernel<KIND, 8, PL>, grid, 256, mg_smem(8), a);
}

static unsigned g_mg_smem; /* bit d: the NT = 8 instances may use > 48 KB on device d */

static int mg_ensure_smem(tern__cuda *c) {
    return tern__cuda_attr_once(&g_mg_smem, c->device, c->capturing, [] {
        const int b = (int)mg_smem(8);
        cudaFuncSetAttribute(mg_kernel<4, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(mg_kernel<8, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(mg_kernel<4, 8, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(mg_kernel<8, 8, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(mg_kernel<16, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
        cudaFuncSetAttribute(mg_kernel<17, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
    });
}

/* at open (from tern__cuda_gemv_init), as qgemm.cu's: a MoE step graph recorded before any eager grouped call (a
 * first step of decode rows only) would otherwise keep the per-pair fallback */
extern "C" void tern__cuda_moe_gemm_init(tern__cuda *c) { mg_ensure_smem(c); }

/* kernel kind of a weight (Q bits 4/8, F16 = 16, BF16 = 17), or 0 when the grouped GEMM does not take it */
static int mg_kind(const tern__cuda_w *w) {
    if (w->in % 32 != 0 || w->out < 1) return 0;
    if (w->dtype == TERN_DT_BF16) return 17;
    if (w->dtype == TERN_DT_F16) return 16;
    if (w->dtype != TERN_DT_Q || (w->bits != 4 && w->bits != 8) || !w->scales || !w->biases) return 0;
    if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128) return 0;
    return w->bits;
}

static MgW mg_w(const tern__cuda_w *w, int ycol) {
    MgW m;
    m.w = (const uint8_t *)w->data;
    m.s = (const uint8_t *)w->scales;
    m.b = (const uint8_t *)w->biases;
    m.mat_bytes = w->mat_bytes;
    m.mat_bytes_s = w->mat_bytes_s;
    m.rb = w->dtype == TERN_DT_Q ? (size_t)w->in * w->bits / 8 : (size_t)w->in * 2;
    m.out = w->out;
    m.gs_shift = w->group_size == 32 ? 5 : w->group_size == 64 ? 6 : 7;
    m.sdtype = w->sdtype;
    m.ycol = ycol;
    return m;
}

static void mg_gemm(tern__cuda *c, int kind, int nt, int ntile_max, int nz, const MgArgs &a, int out) {
    const dim3 grid((unsigned)((out + QG_BM - 1) / QG_BM), (unsigned)ntile_max, (unsigned)nz);
    switch (kind) {
    case 4: mg_launch<4>(c->stream, grid, nt, a); break;
    case 8: mg_launch<8>(c->stream, grid, nt, a); break;
    case 16: mg_launch<16>(c->stream, grid, nt, a); break;
    default: mg_launch<17>(c->stream, grid, nt, a); break;
    }
    tern__cuda_check(c, "moe grouped gemm");
}

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

/* gemm_scratch bytes for nc tokens: off, ntiles, tiles, perm, ipos, o */
static size_t mg_bytes(int nc, int k, int E, int H, int BN, int *tmax) {
    const size_t np = (size_t)nc * k;
    const size_t t = np / BN + (np < (size_t)E ? np : (size_t)E) + 1;
    *tmax = t > 65535 ? 65535 : (int)t;
    if (t > 65535) return (size_t)-1;
    return al256(4 * (size_t)(E + 1)) + 256 + al256(16 * t) + 2 * al256(4 * np) + al256(4 * np * (size_t)H);
}

/* The grouped path is taken from 2·E routed pairs on (TERN_MOE_GROUPED_MIN=N overrides;
 * TERN_MOE_GROUPED=0 never, =1 always when the formats allow). H200, gemma4-26b-a4b geometry (E 128,
 * k 8, q4), µs per layer pair path / grouped: n=16 317 / 436, n=32 573 / 552, n=64 1096 / 646,
 * n=512 8447 / 1455: the crossover sits near 2 pairs per expert. */


extern "C" int tern__cuda_moe_grouped(tern__cuda *c, float *y, const float *x, int n, int H, const int32_t *idx,
                                      const float *wts, int k, const tern__cuda_w *gate, const tern__cuda_w *up,
                                      const tern__cuda_w *down, int act, float *scratch) {
    const int I = gate->out, E = gate->nmat, np = n * k;
    const int force = tern__cuda_env_int("TERN_MOE_GROUPED", -1);
    if (force == 0 || c->compute != TERN_COMPUTE_BF16 || !wts) return 0;
    const int big_ok = mg_ensure_smem(c); /* set at open (tern__cuda_moe_gemm_init) */
    if (force != 1 && np < tern__cuda_env_int("TERN_MOE_GROUPED_MIN", 2 * E)) return 0;
    const int kg = mg_kind(gate), kd = mg_kind(down);
    if (!kg || !kd || mg_kind(up) != kg || up->bits != gate->bits || up->group_size != gate->group_size ||
        up->sdtype != gate->sdtype || E < 1 || E > MG_EMAX || up->nmat != E || down->nmat != E || H % 32 != 0 ||
        ((uintptr_t)x & 15) || ((uintptr_t)scratch & 15) || ((uintptr_t)y & 15))
        return 0;
    /* tile rows: 64 when experts average >= 32 pairs, else 16 (TERN_MOE_NT=2/8 forces) */
    int nt = tern__cuda_env_int("TERN_MOE_NT", np >= 32 * E ? 8 : 2);
    if (nt != 2) nt = 8;
    if (nt == 8 && !big_ok) nt = 2;
    const int BN = nt * 8;
    /* tokens per pass: the sort tables and the down outputs live in gemm_scratch */
    int nc = n, tmax = 0;
    while (nc > 1 && mg_bytes(nc, k, E, H, BN, &tmax) > c->gemm_scratch_bytes) nc = (nc + 1) / 2;
    if (mg_bytes(nc, k, E, H, BN, &tmax) > c->gemm_scratch_bytes) return 0;

    uint8_t *sp = (uint8_t *)c->gemm_scratch;
    int *off = (int *)sp;
    sp += al256(4 * (size_t)(E + 1));
    int *ntiles = (int *)sp;
    sp += 256;
    int4 *tiles = (int4 *)sp;
    sp += al256(16 * (size_t)tmax);
    int32_t *perm = (int32_t *)sp;
    sp += al256(4 * (size_t)nc * k);
    int32_t *ipos = (int32_t *)sp;
    sp += al256(4 * (size_t)nc * k);
    float *o = (float *)sp;
    const size_t o_room = c->gemm_scratch_bytes - (size_t)(sp - (uint8_t *)c->gemm_scratch); /* to its end */

    cudaSetDevice(c->device);
    const int blas = !tern__cuda_bf16_split_all(c) && tern__cuda_moe_blas_ok(c, gate, up, down, np);
    for (int t0 = 0; t0 < n; t0 += nc) {
        const int m = n - t0 < nc ? n - t0 : nc, mp = m * k;
        const int32_t *id = idx + (size_t)t0 * k;
        mg_bytes(m, k, E, H, BN, &tmax);
        tern_launch(c->stream, mg_plan, 1, 1024, 0, id, mp, E, BN, off, tiles, ntiles, ipos);
        tern_launch(c->stream, mg_scatter, E, 1024, 0, id, mp, off, perm, ipos);
        tern__cuda_check(c, "moe sort");
        if (blas && tern__cuda_moe_blas(c, y + (size_t)t0 * H, x + (size_t)t0 * H, m, k, H, off, perm, ipos,
                                        wts + (size_t)t0 * k, gate, up, down, act, (uint8_t *)o, o_room, scratch))
            continue; /* moe_blas.cu ran this chunk's experts (cuBLAS grouped GEMMs) */
        MgArgs a;
        a.plain = !tern__cuda_bf16_split_all(c); /* expert weights are never precise */
        a.w[0] = mg_w(gate, 0);
        a.w[1] = mg_w(up, I);
        a.in = H;
        a.nkb = (H + QG_KB - 1) / QG_KB;
        a.x = x + (size_t)t0 * H;
        a.xstride = H;
        a.xdiv = k;
        a.perm = perm;
        a.tiles = tiles;
        a.ntiles = ntiles;
        a.y = scratch; /* h[sorted row][2I] */
        a.ystride = 2 * I;
        mg_gemm(c, kg, nt, tmax, 2, a, I);
        tern__cuda_moe_act(c, scratch, mp, I, act);
        a.w[0] = a.w[1] = mg_w(down, 0);
        a.in = I;
        a.nkb = (I + QG_KB - 1) / QG_KB;
        a.x = scratch;
        a.xstride = 2 * I;
        a.xdiv = 1;
        a.perm = NULL;
        a.y = o;
        a.ystride = H;
        mg_gemm(c, kd, nt, tmax, 1, a, H);
        tern__cuda_moe_combine(c, y + (size_t)t0 * H, o, 0, ipos, wts + (size_t)t0 * k, m, k, H);
    }
    return 1;
}

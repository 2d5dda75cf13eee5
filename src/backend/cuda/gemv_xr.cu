/*
 * gemv_xr.cu — 2..8 activation rows times MLX affine Q4 weights in the plain bf16 mode, on tensor
 * cores, reading every weight byte once (default; TERN_CUDA_GEMV_XR=0 turns it off). For batch decode
 * at 2..8 rows and speculative verification. H200, 14336x4096 (NOTES (x)): 18.8 / 20.8 / 29.9 µs at
 * n = 2 / 4 / 8 against qgemm.cu's 41.6 / 42.3 / 42.6 (one row: 15.9); llama3-8b q4 batch 2 decode 2.0×.
 *
 * gemv_mma.cu's XP1 walk spends the MMA's 8 columns on the 8 scale groups of a chunk (one x row), so
 * rows are not free there. Here the columns are (x row, group) pairs instead: with GPS groups per
 * 64-byte step (q4 g32 / g64 / g128: 4 / 2 / 1), NT tiles of 8 columns hold 8·NT / GPS x rows, column
 * c = xr·GPS + γ. A lane's k-slots belong to one group of the step (gt = t·16 / GB), so B entries of
 * columns whose γ differs are zero — every column is one (row, group)'s Σ (128 + q)·x, folded with that
 * group's scale after each step: acc += s·D + (b − 128·s)·Σx (FOLD, as XP1 in this mode). Same decode,
 * MMAs per step (8·NT) and register words as the one-row kernels (gemv_mma.cuh), x rounded to bf16
 * (the mode's x; Σx of the rounded values), f32 sums.
 *
 * Grid: (row block of 8 warps × 16 rows, K slice of J chunks of S steps, as gemv_mma.cu plans them); a
 * warp holds two steps' words and scales in two register sets, each reloaded two steps ahead, so two
 * steps are in flight while one is multiplied. Modes as gemv_mma: up to
 * three matrices sharing `in` (q|k|v), act(gate)·up (pair: gate rows g, up rows g + 8 of 8 outputs),
 * y += W·x; no pre-norm (the caller declines). Split K: each block leaves [slice][x row][unit]
 * partials, the last block of a row block (counter, reset by it) sums them in slice order. A row's
 * arithmetic does not depend on the other rows or on n (batch invariant for n = 2..8); it differs from
 * the one-row kernel's (group folds per step, not per chunk).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/gemv_mma_args.cuh"

#define XR_MAXN 8

struct XrArgs {
    MmArgs m; /* matrices, modes, slices, partials, counters (gemv_mma_args.cuh) */
    int n;    /* x rows (2..8); x row r at m.x + r·m.in, y row r at y[mat] + r·out[mat] (pair: + r·rows) */
};

/* stage the slice's steps st0 .. st0 + ns - 1: the B table [step][8 MMAs][NT][lane] (entry of column
 * c = xr·GPS + γ: x row xr's bf16 pair at the lane's k-slots when γ is the lane's group, else 0) and
 * Σx [xr][step][GPS] of the bf16-rounded x */
template <int GB, int NT>
__device__ __forceinline__ void xr_stage(const XrArgs &A, uint2 *tbl, float *xs, int st0, int ns, int nss) {
    constexpr int GPS = GB >= 64 ? 1 : 64 / GB, CPS = 128, CPW = 8;
    const MmArgs &a = A.m;
    for (int it = threadIdx.x; it < ns * 32; it += blockDim.x) {
        const int sl = it >> 5, m = (it >> 2) & 7, tt = it & 3, i = m >> 1, j = 2 * (m & 1);
        const int gt = GPS == 1 ? 0 : tt * 16 / GB, sm = sl * 8 + m;
        const size_t k = (size_t)(st0 + sl) * CPS + (tt * 4 + i) * CPW;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int gg = 0; gg < 8; gg++) {
                const int c = nt * 8 + gg, xr = c / GPS;
                uint2 e = make_uint2(0u, 0u);
                if (c % GPS == gt && xr < A.n) {
                    const float *xw = a.x + (size_t)xr * a.in + k;
                    const __nv_bfloat162 ha = __floats2bfloat162_rn(xw[j], xw[j + 4]);
                    const __nv_bfloat162 hb = __floats2bfloat162_rn(xw[j + 1], xw[j + 5]);
                    e = make_uint2(*(const uint32_t *)&ha, *(const uint32_t *)&hb);
                }
                tbl[(sm * NT + nt) * 32 + gg * 4 + tt] = e;
            }
    }
    /* Σx per (row, step, group): CG = 128 / GPS inputs, one float4 per thread and round, then a fixed
     * xor tree over the CG / 4 lanes of a group (whole warps take part in every round) */
    constexpr int L = CPS / GPS / 4;
    const int nf = ns * CPS / 4, nfw = (nf + 31) & ~31;
    for (int xr = 0; xr < A.n; xr++)
        for (int f = threadIdx.x; f < nfw; f += blockDim.x) {
            float e = 0.0f;
            if (f < nf) {
                const float4 v = __ldg((const float4 *)(a.x + (size_t)xr * a.in + (size_t)st0 * CPS) + f);
                const float2 p = __bfloat1622float2(__floats2bfloat162_rn(v.x, v.y));
                const float2 q = __bfloat1622float2(__floats2bfloat162_rn(v.z, v.w));
                e = (p.x + p.y) + (q.x + q.y);
            }
#pragma unroll
            for (int o = 1; o < L; o <<= 1) e += __shfl_xor_sync(0xffffffffu, e, o);
            if ((f & (L - 1)) == 0 && f < nf) xs[xr * nss * GPS + f / L] = e;
        }
}

template <int GB, bool F16S, int NT> __global__ void __launch_bounds__(256, 2) gemv_xr_kernel(XrArgs A) {
    constexpr int S = GB == 16 ? 2 : 4, GPS = GB >= 64 ? 1 : 64 / GB;
    static_assert(NT * 8 >= GPS && NT <= GPS, "columns: up to 8 rows of GPS groups");
    using SV = typename SVec<GPS>::T;
    const MmArgs &a = A.m;
    pdl_trigger();
    extern __shared__ uint2 xr_sm[];
    const int nss = a.J * S;              /* steps of a full slice */
    uint2 *tbl = xr_sm;                   /* [nss][8 MMAs][NT][32 lanes] */
    float *xs = (float *)(xr_sm + nss * 8 * NT * 32); /* [XR_MAXN][nss][GPS] */
    __shared__ int last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    const int nst = a.in / 128, st0 = blockIdx.y * nss, ns = min(nss, nst - st0);
    const size_t rb = (size_t)a.in / 2;
    MmRows r;
    mm_rows(a, blockIdx.x * MM_WARPS + warp, g, t, rb, pair, r);
    struct XrSet { /* one step's words of rows g, g + 8 and their groups' scales and biases */
        uint4 w0, w1;
        SV s0, b0, s1, b1;
    };
    auto load = [&](XrSet &o, int st) {
        const int G = GB > 64 ? st * 64 / GB : st * GPS;
        o.w0 = mm_ld4(r.w0 + (size_t)st * 64);
        o.w1 = mm_ld4(r.w1 + (size_t)st * 64);
        o.s0 = mm_lds<GPS>(r.s0 + G); o.b0 = mm_lds<GPS>(r.b0 + G);
        o.s1 = mm_lds<GPS>(r.s1 + G); o.b1 = mm_lds<GPS>(r.b1 + G);
    };
    XrSet P, Q; /* steps sl (P) and sl + 1 (Q) in flight: two register sets, each reloaded two steps ahead */
    load(P, st0);
    if (ns > 1) load(Q, st0 + 1);
    pdl_wait(); /* weights above; x, y, partials and counters below */
    xr_stage<GB, NT>(A, tbl, xs, st0, ns, nss);
    __syncthreads();

    const uint2 *tl = tbl + lane;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    /* step sl from the set o: its MMAs into D[(row, group) columns], each column folded with its group */
    auto run = [&](const XrSet &o, int sl) {
        const uint32_t wa[4] = {o.w0.x, o.w0.y, o.w0.z, o.w0.w}, wc[4] = {o.w1.x, o.w1.y, o.w1.z, o.w1.w};
        float d[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) d[nt][0] = d[nt][1] = d[nt][2] = d[nt][3] = 0.0f;
        mm_mmas<true, NT>(&d[0][0], wa, wc, tl, sl, a.magic);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int c = nt * 8 + 2 * t + q, xr = c / GPS, ga = c % GPS;
                if (xr >= A.n) continue;
                const float xg = xs[(xr * nss + sl) * GPS + ga];
                const float sa = mm_sget<GPS, F16S>(o.s0, ga), sb = mm_sget<GPS, F16S>(o.s1, ga);
                const float ba = fmaf(-128.0f, sa, mm_sget<GPS, F16S>(o.b0, ga));
                const float bb = fmaf(-128.0f, sb, mm_sget<GPS, F16S>(o.b1, ga));
                acc[nt][q] = fmaf(ba, xg, fmaf(sa, d[nt][q], acc[nt][q]));
                acc[nt][2 + q] = fmaf(bb, xg, fmaf(sb, d[nt][2 + q], acc[nt][2 + q]));
            }
    };
    for (int sl = 0; sl < ns; sl += 2) {
        {
            const XrSet cur = P;
            if (sl + 2 < ns) load(P, st0 + sl + 2);
            run(cur, sl);
        }
        if (sl + 1 < ns) {
            const XrSet cur = Q;
            if (sl + 3 < ns) load(Q, st0 + sl + 3);
            run(cur, sl + 1);
        }
    }
    /* a row's columns: GPS = 2 both of a lane's, GPS = 4 also lane t ^ 1's (fixed order) */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int h = 0; h < 4; h += 2) {
            if constexpr (GPS >= 2) {
                acc[nt][h] += acc[nt][h + 1];
                acc[nt][h + 1] = acc[nt][h];
            }
            if constexpr (GPS == 4) {
                acc[nt][h] += __shfl_xor_sync(0xffffffffu, acc[nt][h], 1);
                acc[nt][h + 1] = acc[nt][h];
            }
        }
    const int units = pair ? 2 * a.rows : a.rows;
    /* the x rows this lane owns: column c = nt·8 + 2t + q with c % GPS == 0 (and, GPS = 4, t even) */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int c = nt * 8 + 2 * t + q, xr = c / GPS;
            if (c % GPS || xr >= A.n) continue;
            const float v0 = acc[nt][q], v1 = acc[nt][2 + q];
            if (a.ks == 1) {
                if (pair) {
                    if (r.live0) mm_store(a, r.unit0, v0, v1, xr);
                } else {
                    if (r.live0) mm_store(a, r.unit0, v0, 0.0f, xr);
                    if (r.live1) mm_store(a, r.unit1, v1, 0.0f, xr);
                }
                continue;
            }
            float *pp = a.part + ((size_t)blockIdx.y * A.n + xr) * units;
            if (pair) {
                if (r.live0) { pp[2 * r.unit0] = v0; pp[2 * r.unit0 + 1] = v1; }
            } else {
                if (r.live0) pp[r.unit0] = v0;
                if (r.live1) pp[r.unit1] = v1;
            }
        }
    if (a.ks == 1) return;

    /* split K: the last slice block of this row block sums the slices in order */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(a.cnt + blockIdx.x, 1) == a.ks - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int per = pair ? 64 : 128, u0 = blockIdx.x * per;
    for (int i = threadIdx.x; i < per * A.n; i += blockDim.x) {
        const int xr = i / per, u = u0 + i % per;
        if (u < a.rows) mm_sum_slices(a, u, pair, units, xr, A.n);
    }
    if (threadIdx.x == 0) a.cnt[blockIdx.x] = 0;
}

/* on unless TERN_CUDA_GEMV_XR=0; -1 until read (tests set it). Rows served: up to xr_max_n
 * (TERN_CUDA_GEMV_XR_MAX; qgemm_q4.cu is faster at 8 rows on the H200: q4 g64 14336x4096 24.7 vs 29.8 µs;
 * XR at 4 rows 20.8) */
extern "C" int tern__cuda_gemv_xr, tern__cuda_gemv_xr_max_n;
int tern__cuda_gemv_xr = -1;
int tern__cuda_gemv_xr_max_n = 4;
extern "C" unsigned long long tern__cuda_gemv_xr_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_gemv_xr_calls = 0;

template <int GB, bool F16S, int NT> static void xr_go(tern__cuda *c, dim3 grid, size_t smem, const XrArgs &A) {
    tern_launch(c->stream, gemv_xr_kernel<GB, F16S, NT>, grid, 256, smem, A);
}

/* at open (gemv.cu's init, the device current): the shared-memory limit of every instance (up to 65 KB) */
template <bool F16S> static void xr_attr() {
#define XR_A(GB, NT) cudaFuncSetAttribute(gemv_xr_kernel<GB, F16S, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 << 10)
    XR_A(64, 1); XR_A(32, 1); XR_A(32, 2); XR_A(16, 1); XR_A(16, 2); XR_A(16, 4);
#undef XR_A
}
extern "C" void tern__cuda_gemv_xr_init(tern__cuda *c) {
    (void)c;
    xr_attr<false>();
    xr_attr<true>();
    cudaGetLastError();
}

/* nt: column tiles, 1, 2 or 4 (<= GPS: 8 rows fill GPS tiles) */
template <int GB, bool F16S> static void xr_nt(tern__cuda *c, dim3 grid, size_t smem, const XrArgs &A, int nt) {
    constexpr int GPS = GB >= 64 ? 1 : 64 / GB;
    if (nt == 1) xr_go<GB, F16S, 1>(c, grid, smem, A);
    else if (nt == 2) xr_go<GB, F16S, (GPS >= 2 ? 2 : 1)>(c, grid, smem, A); /* GPS 1 never has 2 */
    else xr_go<GB, F16S, GPS>(c, grid, smem, A);
}

/* y[i] (op) W_i·x for n = 2..8 rows of x (row stride in), matrices w[0..k) sharing `in` and the
 * format (mode: G1_PLAIN / G1_RES / a pair mode). 1 when it ran, 0 when not served (off, not Q4 in the
 * plain bf16 mode, a shape gemv_mma.cu declines, too many partials): the caller runs its other paths. */
extern "C" int tern__cuda_gemv_xr_run(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, int k,
                                      const float *x, int n, int mode) {
    if (tern__cuda_gemv_xr < 0) {
        tern__cuda_gemv_xr = tern__cuda_env_int("TERN_CUDA_GEMV_XR", 1) != 0;
        tern__cuda_gemv_xr_max_n = tern__cuda_env_int("TERN_CUDA_GEMV_XR_MAX", tern__cuda_gemv_xr_max_n);
    }
    if (!tern__cuda_gemv_xr || n < 2 || n > XR_MAXN || n > tern__cuda_gemv_xr_max_n || k < 1 || k > 3) return 0;
    if (c->compute != TERN_COMPUTE_BF16 || tern__cuda_bf16_split_all(c) || c->i8) return 0; /* the plain bf16 mode */
    const tern__cuda_w *w0 = w[0];
    if (w0->bits != 4 || w0->precise || (w0->in * sizeof(float)) % 16) return 0;
    XrArgs A = {};
    MmArgs &a = A.m;
    const int e[3] = {0, 0, 0};
    if (!tern__cuda_mm_args(c, y, w, e, k, x, mode, 0, &a)) return 0;
    if (a.rows <= 0) return 1;
    const bool pair = mode == G1_SILU || mode == G1_GELU;
    const size_t units = pair ? 2 * (size_t)a.rows : (size_t)a.rows;
    if (a.ks > 1 && ((size_t)a.ks * units * n > TERN_CUDA_PART_FLOATS || a.rblocks > MM_CNT)) return 0;
    const int gb = w0->group_size / 2, gps = gb >= 64 ? 1 : 64 / gb, S = gb == 16 ? 2 : 4;
    A.n = n;
    const int nt = (n * gps + 7) / 8 <= 1 ? 1 : (n * gps + 7) / 8 <= 2 ? 2 : 4; /* column tiles (templates 1, 2, 4) */
    const size_t smem = (size_t)a.J * S * 8 * nt * 32 * sizeof(uint2) + (size_t)XR_MAXN * a.J * S * gps * sizeof(float);
    const bool f16 = w0->sdtype == TERN_DT_F16;
    const dim3 grid((unsigned)a.rblocks, (unsigned)a.ks);
    cudaSetDevice(c->device);
    if (gb == 16) f16 ? xr_nt<16, true>(c, grid, smem, A, nt) : xr_nt<16, false>(c, grid, smem, A, nt);
    else if (gb == 32) f16 ? xr_nt<32, true>(c, grid, smem, A, nt) : xr_nt<32, false>(c, grid, smem, A, nt);
    else f16 ? xr_nt<64, true>(c, grid, smem, A, nt) : xr_nt<64, false>(c, grid, smem, A, nt);
    tern__cuda_check(c, "gemv_xr");
    tern__cuda_gemv_xr_calls++;
    return 1;
}

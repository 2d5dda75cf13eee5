/*
 * gemv_xr.cu — 2..8 activation rows times MLX affine Q4 weights in the plain bf16 mode, on tensor
 * cores, reading every weight byte once (default; TERN_CUDA_GEMV_XR=0 turns it off). For batch decode
 * at 2..8 rows and speculative verification. The other widths (Q2 / Q3 / Q5 / Q6, Q8) run gemv_xrw_kernel
 * below on the one-row walks' decode (TERN_CUDA_GEMV_XRW; its own comment). H200, 14336x4096 (NOTES (x)): 18.8 / 20.8 / 29.9 µs at
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
    /* Σx per (row, step, group) of the rounded x (gemv_mma.cuh's loop) */
    for (int xr = 0; xr < A.n; xr++)
        mm_group_sums<CPS, GPS, false, true>(xs + xr * nss * GPS, a.x + (size_t)xr * a.in, st0, ns, 0, MmAsIs{});
}

/* the kernels' end: a row's GPC columns of each tile summed (GPC = 2 both of a lane's, GPC = 4 also lane t ^ 1's;
 * fixed order), then stored (one K slice) or left as partials [slice][x row][unit], whose last slice block of
 * the row block sums them in slice order */
template <int GPC, int NT>
__device__ __forceinline__ void xr_epilogue(const XrArgs &A, const MmRows &r, float (*acc)[4], bool pair) {
    const MmArgs &a = A.m;
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int h = 0; h < 4; h += 2) {
            if constexpr (GPC >= 2) {
                acc[nt][h] += acc[nt][h + 1];
                acc[nt][h + 1] = acc[nt][h];
            }
            if constexpr (GPC == 4) {
                acc[nt][h] += __shfl_xor_sync(0xffffffffu, acc[nt][h], 1);
                acc[nt][h + 1] = acc[nt][h];
            }
        }
    const int units = pair ? 2 * a.rows : a.rows;
    /* the x rows this lane owns: column c = nt·8 + 2t + q with c % GPC == 0 (and, GPC = 4, t even) */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int c = nt * 8 + 2 * t + q, xr = c / GPC;
            if (c % GPC || xr >= A.n) continue;
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
    if (!tern_block_last(a.cnt + blockIdx.x, a.ks)) return;
    const int per = pair ? 64 : 128, u0 = blockIdx.x * per;
    for (int i = threadIdx.x; i < per * A.n; i += blockDim.x) {
        const int xr = i / per, u = u0 + i % per;
        if (u < a.rows) mm_sum_slices(a, u, pair, units, xr, A.n);
    }
    if (threadIdx.x == 0) a.cnt[blockIdx.x] = 0;
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
    xr_epilogue<GPS, NT>(A, r, acc, pair);
}

/* ---- the other MLX widths: Q2 / Q3 / Q5 / Q6, and Q8 on f16 MMAs (TERN_CUDA_GEMV_XRW) ----
 * The words and decode of gemv_mma.cu's one-row walks for these widths (gemv_mma.cuh mm_decode_w, mm_ldw2): a step
 * is 128 codes of a row; Q2 / Q3 / Q5 / Q6 load a double step (256 codes, lane t's 8·BITS bytes = codes 64t..64t+63,
 * the first 32 its part of the even step; loaded here a step at a time, xr_ldw: half the registers of a double
 * step, which spilled at Q5 / Q6 from two column tiles) and Q8 a step (lane t: codes 16t.. and 64 + 16t.., 16 each).
 * Columns are (x row, place) pairs folded per step, GPF places a row:
 *   Q2..Q6: GPF = 4, place = the lane t holding the codes (a run of 32 contiguous inputs, inside one group);
 *   Q8:     GPF = 128 / gs, place = the step's group (Q4's rule).
 * So a column is one (row, run or group)'s Σ (OFF + q)·x, folded with its group's scale after each step:
 * acc += s·D·dsc + (b − OFF·s)·Σx (OFF = 128; Q8: 1024, and D is of x·2^-e with dsc = 2^e per x row, e set by the
 * row's max |x| over the slice as mm_stage_q8x does for one row). Σx per run of R inputs (32; Q8: the group) of the
 * bf16-rounded x. Scales: Q8 the step's GPF groups (one vector), Q2..Q6 the groups of the lane's half of a double
 * step that its two columns (places 2(t&1), 2(t&1)+1) use: 128 / gs of them, consecutive. F16 scales are a launch
 * argument here (one instance for both kinds). K slices of at most 8 steps (the B table's shared memory at 4 column
 * tiles), the same for every n: a row's bits do not depend on n. */
template <int BITS, int GS> struct XrW {
    static constexpr bool Q8 = BITS == 8;
    static constexpr int GPF = Q8 ? 128 / GS : 4; /* columns per x row and step */
    static constexpr int R = Q8 ? GS : 32;        /* inputs per Σx run */
    static constexpr int NV = 128 / GS;           /* scales per loaded vector */
    static constexpr int S = mm_steps(BITS, GS, true);
};

/* mm_sget with the scale type a launch argument */
template <int NV> __device__ __forceinline__ float xr_sget(typename SVec<NV>::T v, int i, bool f16) {
    return f16 ? mm_sget<NV, true>(v, i) : mm_sget<NV, false>(v, i);
}

/* Q2 / Q3 / Q5 / Q6: the lane's BITS words of one step, the even (odd = 0) or odd half of its 8·BITS bytes of a double
 * step at p (8-byte aligned; the odd half of Q3 / Q5 4-byte aligned: a 4-byte load first) */
template <int BITS> __device__ __forceinline__ void xr_ldw(const uint8_t *p, int odd, MmWn<BITS> &w) {
    const uint8_t *h = p + odd * 4 * BITS;
    if constexpr (BITS == 2 || BITS == 6) {
#pragma unroll
        for (int i = 0; i < BITS / 2; i++) {
            const uint2 u = __ldg((const uint2 *)h + i);
            w.v[2 * i] = u.x; w.v[2 * i + 1] = u.y;
        }
    } else if (!odd) { /* Q3 / Q5: 8-byte loads, then the last word */
#pragma unroll
        for (int i = 0; i < BITS / 2; i++) {
            const uint2 u = __ldg((const uint2 *)h + i);
            w.v[2 * i] = u.x; w.v[2 * i + 1] = u.y;
        }
        w.v[BITS - 1] = __ldg((const uint32_t *)h + BITS - 1);
    } else { /* the first word, then 8-byte loads from an 8-byte boundary */
        w.v[0] = __ldg((const uint32_t *)h);
#pragma unroll
        for (int i = 0; i < BITS / 2; i++) {
            const uint2 u = __ldg((const uint2 *)(h + 4) + i);
            w.v[1 + 2 * i] = u.x; w.v[2 + 2 * i] = u.y;
        }
    }
}

/* stage the slice's steps st0 .. st0 + ns - 1 of the n rows: Σx per run ([x row][nss·128 / R]) and, for Q8, each
 * row's scale into f16 (sc = 2^-e, dsc = 2^e); then the B table [step][8 MMAs][NT][lane] */
template <int BITS, int GS, int NT>
__device__ __forceinline__ void xrw_stage(const XrArgs &A, uint2 *tbl, float *xs, float *sc, float *dsc, int st0, int ns,
                                          int nss) {
    using P = XrW<BITS, GS>;
    constexpr int GPF = P::GPF;
    const MmArgs &a = A.m;
    auto rnd = [](float v) { return __bfloat162float(__float2bfloat16_rn(v)); };
    __shared__ float mx[XR_MAXN][8];
    const int nrun = nss * 128 / P::R;
    for (int xr = 0; xr < A.n; xr++) { /* runs of R inputs: 128 / R "groups" a step in gemv_mma.cuh's loop */
        float am = mm_group_sums<128, 128 / P::R, false, true>(xs + xr * nrun, a.x + (size_t)xr * a.in, st0, ns, 0,
                                                                MmAsIs{});
        if constexpr (P::Q8) {
#pragma unroll
            for (int o = 16; o; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
            if ((threadIdx.x & 31) == 0) mx[xr][threadIdx.x >> 5] = am;
        }
    }
    if constexpr (P::Q8) {
        __syncthreads();
        if (threadIdx.x < A.n) {
            const float *m = mx[threadIdx.x];
            const float am = fmaxf(fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3])), fmaxf(fmaxf(m[4], m[5]), fmaxf(m[6], m[7])));
            const int ex = mm_q8x_exp(am);
            sc[threadIdx.x] = ldexpf(1.0f, -ex);
            dsc[threadIdx.x] = ldexpf(1.0f, ex);
        }
        __syncthreads();
    }
    for (int it = threadIdx.x; it < ns * 32; it += blockDim.x) {
        const int sl = it >> 5, m = (it >> 2) & 7, tt = it & 3, sm = sl * 8 + m;
        size_t o[4]; /* inputs of the pair registers 2m (o0, o1) and 2m + 1 (o2, o3) of lane tt */
        int pl;      /* the lane's place */
        if constexpr (P::Q8) {
            const int pos = m < 4 ? 16 * tt + 4 * m : 64 + 16 * tt + 4 * (m - 4);
            const size_t k = (size_t)(st0 + sl) * 128 + pos;
            o[0] = k; o[1] = k + 2; o[2] = k + 1; o[3] = k + 3;
            pl = ((m < 4 ? 0 : 64) + 16 * tt) / GS;
        } else {
            const size_t k = (size_t)(st0 + (sl & ~1)) * 128 + tt * 64 + (sl & 1) * 32; /* st0 is even */
            constexpr int dp = mm_pdp<BITS>();
            const int l0 = mm_plo<BITS>(2 * m), l1 = mm_plo<BITS>(2 * m + 1);
            o[0] = k + l0; o[1] = k + l0 + dp; o[2] = k + l1; o[3] = k + l1 + dp;
            pl = tt;
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int gg = 0; gg < 8; gg++) {
                const int c = nt * 8 + gg, xr = c / GPF;
                uint2 e = make_uint2(0u, 0u);
                if (c % GPF == pl && xr < A.n) {
                    const float *xw = a.x + (size_t)xr * a.in;
                    if constexpr (P::Q8) {
                        const float f = sc[xr];
                        const __half2 ha = __floats2half2_rn(rnd(xw[o[0]]) * f, rnd(xw[o[1]]) * f);
                        const __half2 hb = __floats2half2_rn(rnd(xw[o[2]]) * f, rnd(xw[o[3]]) * f);
                        e = make_uint2(*(const uint32_t *)&ha, *(const uint32_t *)&hb);
                    } else {
                        const __nv_bfloat162 ha = __floats2bfloat162_rn(xw[o[0]], xw[o[1]]);
                        const __nv_bfloat162 hb = __floats2bfloat162_rn(xw[o[2]], xw[o[3]]);
                        e = make_uint2(*(const uint32_t *)&ha, *(const uint32_t *)&hb);
                    }
                }
                tbl[(sm * NT + nt) * 32 + gg * 4 + tt] = e;
            }
    }
}

template <int BITS, int GS, int NT> __global__ void __launch_bounds__(256, 2) gemv_xrw_kernel(XrArgs A, int f16) {
    using P = XrW<BITS, GS>;
    constexpr int GPF = P::GPF, NV = P::NV;
    constexpr float OFF = P::Q8 ? 1024.0f : 128.0f;
    static_assert(NT * 8 >= GPF && NT <= GPF, "columns: up to 8 rows of GPF places");
    using SV = typename SVec<NV>::T;
    using WT = MmWn<P::Q8 ? 8 : BITS>;
    const MmArgs &a = A.m;
    pdl_trigger();
    extern __shared__ uint2 xr_sm[];
    const int nss = a.J * P::S, nrun = nss * 128 / P::R; /* steps of a full slice, Σx runs of a row */
    uint2 *tbl = xr_sm;                                   /* [nss][8 MMAs][NT][32 lanes] */
    float *xs = (float *)(xr_sm + nss * 8 * NT * 32);     /* [XR_MAXN][nrun] */
    __shared__ float sc[XR_MAXN], dsc[XR_MAXN];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    const int nst = a.in / 128, st0 = blockIdx.y * nss, ns = min(nss, nst - st0);
    const size_t rb = (size_t)a.in * BITS / 8;
    MmRows r;
    mm_rows(a, blockIdx.x * MM_WARPS + warp, g, t, rb, pair, r, P::Q8 ? 16 : mm_lb<BITS>());
    struct XrSet { /* one step's words of rows g, g + 8 and their scales and biases */
        WT w0, w1;
        SV s0, b0, s1, b1;
    };
    auto load = [&](XrSet &o, int sl) {
        const int st = st0 + sl;
        int G;
        if constexpr (P::Q8) { /* 16 bytes at 16t and at 64 + 16t */
            const uint4 u0 = mm_ld4(r.w0 + (size_t)st * 128), u1 = mm_ld4(r.w0 + (size_t)st * 128 + 64);
            const uint4 u2 = mm_ld4(r.w1 + (size_t)st * 128), u3 = mm_ld4(r.w1 + (size_t)st * 128 + 64);
            o.w0 = MmWn<8>{{u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w}};
            o.w1 = MmWn<8>{{u2.x, u2.y, u2.z, u2.w, u3.x, u3.y, u3.z, u3.w}};
            G = st * NV;
        } else {
            xr_ldw<BITS>(r.w0 + (size_t)(st & ~1) * 16 * BITS, st & 1, o.w0);
            xr_ldw<BITS>(r.w1 + (size_t)(st & ~1) * 16 * BITS, st & 1, o.w1);
            G = (st & ~1) * NV + (t & 1) * NV; /* the double step's 2·NV groups, this lane's half */
        }
        o.s0 = mm_lds<NV>(r.s0 + G); o.b0 = mm_lds<NV>(r.b0 + G);
        o.s1 = mm_lds<NV>(r.s1 + G); o.b1 = mm_lds<NV>(r.b1 + G);
    };
    XrSet Pa, Qa; /* steps sl (Pa) and sl + 1 (Qa) in flight: two register sets, each reloaded two steps ahead */
    load(Pa, 0);
    if (ns > 1) load(Qa, 1);
    pdl_wait(); /* weights above; x, y, partials and counters below */
    xrw_stage<BITS, GS, NT>(A, tbl, xs, sc, dsc, st0, ns, nss);
    __syncthreads();

    const uint2 *tl = tbl + lane;
    const uint32_t magic = P::Q8 ? a.magic + 0x21002100u : a.magic; /* Q8: the f16 pair (1024, 1024) */
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    auto run = [&](const XrSet &o, int sl) {
        float d[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) d[nt][0] = d[nt][1] = d[nt][2] = d[nt][3] = 0.0f;
        mm_mmas_w<BITS, NT>(&d[0][0], o.w0.v, o.w1.v, tl, sl, magic);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int c = nt * 8 + 2 * t + q, xr = c / GPF, pg = c % GPF;
                if (xr >= A.n) continue;
                const int run = P::Q8 ? sl * GPF + pg : (sl & ~1) * 4 + 2 * pg + (sl & 1);
                const int vi = P::Q8 ? pg : (64 * (pg & 1) + 32 * (sl & 1)) / GS;
                const float xg = xs[xr * nrun + run], ds = P::Q8 ? dsc[xr] : 1.0f;
                const float sa = xr_sget<NV>(o.s0, vi, f16), sb = xr_sget<NV>(o.s1, vi, f16);
                const float ba = fmaf(-OFF, sa, xr_sget<NV>(o.b0, vi, f16));
                const float bb = fmaf(-OFF, sb, xr_sget<NV>(o.b1, vi, f16));
                acc[nt][q] = fmaf(ba, xg, fmaf(P::Q8 ? sa * ds : sa, d[nt][q], acc[nt][q]));
                acc[nt][2 + q] = fmaf(bb, xg, fmaf(P::Q8 ? sb * ds : sb, d[nt][2 + q], acc[nt][2 + q]));
            }
    };
    for (int sl = 0; sl < ns; sl += 2) {
        {
            const XrSet cur = Pa;
            if (sl + 2 < ns) load(Pa, sl + 2);
            run(cur, sl);
        }
        if (sl + 1 < ns) {
            const XrSet cur = Qa;
            if (sl + 3 < ns) load(Qa, sl + 3);
            run(cur, sl + 1);
        }
    }
    xr_epilogue<GPF, NT>(A, r, acc, pair);
}

/* on unless TERN_CUDA_GEMV_XR=0; -1 until read (tests set it). Rows served: up to xr_max_n
 * (TERN_CUDA_GEMV_XR_MAX; qgemm_q4.cu is faster at 8 rows on the H200: q4 g64 14336x4096 24.7 vs 29.8 µs;
 * XR at 4 rows 20.8) */
extern "C" int tern__cuda_gemv_xr, tern__cuda_gemv_xr_max_n;
int tern__cuda_gemv_xr = -1;
int tern__cuda_gemv_xr_max_n = 4;
extern "C" unsigned long long tern__cuda_gemv_xr_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_gemv_xr_calls = 0;

/* TERN_CUDA_GEMV_XRW (default 1; 0 off; -1 until read, tests set it): the other MLX widths (Q2 / Q3 / Q5 / Q6, and
 * Q8 where gemv_mma.cu's Q8X serves one row) take gemv_xrw_kernel for 2 .. xrw_max_n rows (TERN_CUDA_GEMV_XRW_MAX)
 * instead of qgemm.cu; matrices of fewer than 2^25 codes (all of a fused call's rows) only up to xrw_small_n rows.
 * H200 (bench/NOTES.md (ay)), µs qgemm → xr, g64: 14336x4096 n = 2 / 4 / 8 q2 50.1 / 50.5 / 50.1 → 20.3 / 27.4 / 42.9,
 * q6 56.8 / 57.2 / 58.1 → 26.8 / 35.3 / 51.5, q8 43.0 / 43.9 / 44.9 → 26.1 / 29.5 / 40.2; 4096x4096 q8 at 2 / 6 / 8
 * 14.8 / 15.2 / 15.3 → 10.8 / 16.0 / 18.2 (hence the small-matrix bound) */
extern "C" int tern__cuda_gemv_xrw, tern__cuda_gemv_xrw_max_n, tern__cuda_gemv_xrw_small_n;
int tern__cuda_gemv_xrw = -1;
int tern__cuda_gemv_xrw_max_n = 8;
int tern__cuda_gemv_xrw_small_n = 5;
static bool xrw_on(void) {
    if (tern__cuda_gemv_xrw < 0) {
        tern__cuda_gemv_xrw = tern__cuda_env_int("TERN_CUDA_GEMV_XRW", 1) != 0;
        tern__cuda_gemv_xrw_max_n = tern__cuda_env_int("TERN_CUDA_GEMV_XRW_MAX", tern__cuda_gemv_xrw_max_n);
    }
    return tern__cuda_gemv_xrw;
}

template <int GB, bool F16S, int NT> static void xr_go(tern__cuda *c, dim3 grid, size_t smem, const XrArgs &A) {
    tern_launch(c->stream, gemv_xr_kernel<GB, F16S, NT>, grid, 256, smem, A);
}

/* at open (gemv.cu's init, the device current): the shared-memory limit of every instance (up to 65 KB) */
template <bool F16S> static void xr_attr() {
#define XR_A(GB, NT) cudaFuncSetAttribute(gemv_xr_kernel<GB, F16S, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 << 10)
    XR_A(64, 1); XR_A(32, 1); XR_A(32, 2); XR_A(16, 1); XR_A(16, 2); XR_A(16, 4);
#undef XR_A
}
/* the other widths' instances: attr sets every instance's shared-memory limit (at open), else the one of (bits, gs,
 * nt) runs */
template <int BITS, int GS, int NT>
static void xrw_one(bool attr, tern__cuda *c, dim3 grid, size_t smem, const XrArgs &A, int f16) {
    if (attr) cudaFuncSetAttribute(gemv_xrw_kernel<BITS, GS, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 << 10);
    else tern_launch(c->stream, gemv_xrw_kernel<BITS, GS, NT>, grid, 256, smem, A, f16);
}
template <int BITS, int GS>
static void xrw_nt(bool attr, tern__cuda *c, dim3 grid, size_t smem, const XrArgs &A, int f16, int nt) {
    constexpr int GPF = XrW<BITS, GS>::GPF; /* nt <= GPF: 8 rows fill GPF tiles (Q8 g32: 4 rows at most, tern__cuda_gemv_xr_run) */
    if (attr || nt == 1) xrw_one<BITS, GS, 1>(attr, c, grid, smem, A, f16);
    if constexpr (GPF >= 2)
        if (attr || nt == 2) xrw_one<BITS, GS, 2>(attr, c, grid, smem, A, f16);
    if constexpr (GPF >= 4 && !(BITS == 8 && GS == 32)) /* Q8 g32 spilled at four tiles */
        if (attr || nt == 4) xrw_one<BITS, GS, 4>(attr, c, grid, smem, A, f16);
}
template <int BITS>
static void xrw_gs(bool attr, tern__cuda *c, dim3 grid, size_t smem, const XrArgs &A, int f16, int gs, int nt) {
    if (attr || gs == 32) xrw_nt<BITS, 32>(attr, c, grid, smem, A, f16, nt);
    if (attr || gs == 64) xrw_nt<BITS, 64>(attr, c, grid, smem, A, f16, nt);
    if (attr || gs == 128) xrw_nt<BITS, 128>(attr, c, grid, smem, A, f16, nt);
}
static void xrw_go(bool attr, tern__cuda *c, dim3 grid, size_t smem, const XrArgs &A, int f16, int bits, int gs, int nt) {
    if (attr || bits == 2) xrw_gs<2>(attr, c, grid, smem, A, f16, gs, nt);
    if (attr || bits == 3) xrw_gs<3>(attr, c, grid, smem, A, f16, gs, nt);
    if (attr || bits == 5) xrw_gs<5>(attr, c, grid, smem, A, f16, gs, nt);
    if (attr || bits == 6) xrw_gs<6>(attr, c, grid, smem, A, f16, gs, nt);
    if (attr || bits == 8) xrw_gs<8>(attr, c, grid, smem, A, f16, gs, nt);
}

extern "C" void tern__cuda_gemv_xr_init(tern__cuda *c) {
    (void)c;
    xr_attr<false>();
    xr_attr<true>();
    xrw_go(true, nullptr, dim3(), 0, XrArgs{}, 0, 0, 0, 0);
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
    if (!tern__cuda_gemv_xr || n < 2 || n > XR_MAXN || k < 1 || k > 3) return 0;
    if (c->compute != TERN_COMPUTE_BF16 || tern__cuda_bf16_split_all(c) || c->i8) return 0; /* the plain bf16 mode */
    const tern__cuda_w *w0 = w[0];
    const int bits = w0->bits;
    if (w0->dtype != TERN_DT_Q || w0->precise || (w0->in * sizeof(float)) % 16) return 0;
    if (bits == 4 ? n > tern__cuda_gemv_xr_max_n
                  : !xrw_on() || n > tern__cuda_gemv_xrw_max_n || w0->in % (bits == 8 ? 128 : 256))
        return 0;
    XrArgs A = {};
    MmArgs &a = A.m;
    const int e[3] = {0, 0, 0};
    if (!tern__cuda_mm_args(c, y, w, e, k, x, mode, 0, &a)) return 0; /* also: the width's one-row walk is on */
    if (a.rows <= 0) return 1;
    const bool pair = mode == G1_SILU || mode == G1_GELU;
    const size_t units = pair ? 2 * (size_t)a.rows : (size_t)a.rows;
    A.n = n;
    if (bits != 4) { /* slices of at most 8 steps, whatever n (a row's bits stay n's own) */
        if (n > tern__cuda_gemv_xrw_small_n && (double)units * w0->in < 33554432.0) return 0;
        const int S = mm_steps(bits, w0->group_size, true), gpf = bits == 8 ? 128 / w0->group_size : 4;
        if (a.J * S > 8) a.J = 8 / S;
        a.ks = (w0->in / 128 + a.J * S - 1) / (a.J * S);
        if (a.ks > 65535 || (a.ks > 1 && ((size_t)a.ks * units * n > TERN_CUDA_PART_FLOATS || a.rblocks > MM_CNT))) return 0;
        const int nt = (n * gpf + 7) / 8 <= 1 ? 1 : (n * gpf + 7) / 8 <= 2 ? 2 : 4;
        if (nt == 4 && bits == 8 && w0->group_size == 32) return 0; /* not built (xrw_nt): qgemm.cu takes it */
        const int nss = a.J * S, runs = nss * 128 / (bits == 8 ? w0->group_size : 32);
        const size_t smem = (size_t)nss * 8 * nt * 32 * sizeof(uint2) + (size_t)XR_MAXN * runs * sizeof(float);
        cudaSetDevice(c->device);
        xrw_go(false, c, dim3((unsigned)a.rblocks, (unsigned)a.ks), smem, A, w0->sdtype == TERN_DT_F16, bits,
               w0->group_size, nt);
        tern__cuda_check(c, "gemv_xr");
        tern__cuda_gemv_xr_calls++;
        return 1;
    }
    if (a.ks > 1 && ((size_t)a.ks * units * n > TERN_CUDA_PART_FLOATS || a.rblocks > MM_CNT)) return 0;
    const int gb = w0->group_size / 2, gps = gb >= 64 ? 1 : 64 / gb, S = gb == 16 ? 2 : 4;
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

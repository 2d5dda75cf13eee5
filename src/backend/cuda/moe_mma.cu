/*
 * moe_mma.cu — moe_mlp's routed (token, expert) pairs for MLX Q4 experts (groups 32/64/128, BF16/F16
 * scales) on tensor cores, with gemv_mma.cu's exact scheme (device pieces in gemv_mma.cuh): the codes
 * enter mma.sync as exact bf16 integers, x is split exactly into hi + mid + lo (three MMA columns per
 * scale group), each group's Σ q·x_part is folded with its scale after and b·Σx added, all in f32.
 * Two launches per call (pairs p < n·k, e_p = idx[p] read ON THE DEVICE, token p / k):
 *
 *   gate/up  h[p][o] = act(gate_e[o]·x_t)·(up_e[o]·x_t)   h row p at scratch + p·2I, its first I floats
 *                                                          (the layout of the old path's down input)
 *   down     y[t][o] = Σ_{j<k} wts[t·k+j]·(down_e[o]·h[t·k+j])   j in order, f32 fma
 *
 * Grid = (row block, K slice, pair): a warp holds 16 weight rows (gate/up: gate rows and up rows of 8
 * outputs, as gemv_mma's pair mode; down: 16 rows), a block 8 warps x one K slice of S steps (64 bytes
 * of each row per step); blockIdx.z is the pair, so the block stages its token's x (or its pair's h)
 * once. A graph replay reads the new routes. Rows whose bytes end inside a step (down at I = 704:
 * 352 bytes, 5.5 steps) take the TAIL staging: words, x, Σx and scales past the row are zeros.
 *
 * Determinism: every block writes its slice's partial sums to c->part; the last block to arrive at a
 * counter (gate/up: one per (pair, row block), ks arrivals; down: one per (token, row block), k·ks
 * arrivals; c->mm_cnt, shared with gemv_mma, zero between launches) sums the slices in slice order and
 * the pairs in j order and resets the counter: no float atomics, the bits depend only on the inputs and
 * the shape. With programmatic launch the down kernel reads idx and loads its expert's rows while
 * gate/up still runs (gate/up lets it start only after gate/up's own inputs are complete), and waits
 * before it touches h. Ids outside [0, nmat) give h = 0 and no down term (as gemv_expert). --compute bf16 with
 * n >= 2 rounds x (the caller) and h (here, at its store) to bf16, as the other pair paths do.
 * TERN_CUDA_MOE_MMA=0 turns it off; tern__cuda_moe_mma_calls counts the calls it served.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/split_k.cuh"

#include <stdlib.h>

#define MO_BUF 8   /* partials loaded at once by a reducing thread */
#define MO_KMAX 64 /* experts per token served (down's weights staged in shared memory) */

struct MoeMmArgs {
    const uint8_t *data[2], *scales[2], *biases[2]; /* row sets 0/1: gate/up, or down twice */
    size_t mat_bytes, mat_bytes_s;                   /* per expert (the same for both sets) */
    const int32_t *idx;
    const float *wts;
    const float *x;  /* pair p's input row: x + (p / xdiv)·xstride */
    int xstride, xdiv;
    float *y;        /* gate/up: h row p at y + p·ystride; down: row t at y + t·ystride */
    int ystride;
    int out, in, ng, nmat, k, ks, nst, rblocks;
    int pair, act, tail, rnd; /* rnd: h rounded to bf16 at its store */
    int early;                /* down: idx and weights read before the wait (see the kernel) */
    float *part;
    int *cnt;
    uint32_t magic; /* 0x43004300, see mm_decode */
};

/* the GPS packed scales of step groups G.. of one row; tail: groups from ng on read as 0 (scalar
 * loads: rows of ng groups are then not aligned for the packed load) */
template <int GPS>
__device__ __forceinline__ typename SVec<GPS>::T mo_lds(const uint16_t *p, int G, int ng, int tail) {
    if (!tail) return mm_lds<GPS>(p + G);
    uint32_t u[GPS];
#pragma unroll
    for (int q = 0; q < GPS; q++) u[q] = G + q < ng ? (uint32_t)__ldg(p + G + q) : 0u;
    if constexpr (GPS == 4) return make_uint2(u[0] | u[1] << 16, u[2] | u[3] << 16);
    else if constexpr (GPS == 2) return u[0] | u[1] << 16;
    else return u[0];
}

__device__ __forceinline__ float mo_h(const MoeMmArgs &a, float g, float u) {
    const float h = (a.act == TERN_ACT_SILU ? silu(g) : gelu_tanh(g)) * u;
    return a.rnd ? __bfloat162float(__float2bfloat16_rn(h)) : h;
}

template <int GB, bool F16S> __global__ void __launch_bounds__(256, 3) moe_mma_kernel(MoeMmArgs a) {
    constexpr int S = GB == 16 ? 2 : 4, GPS = GB >= 64 ? 1 : 64 / GB, NT = (3 * GPS + 7) / 8;
    using SV = typename SVec<GPS>::T;
    extern __shared__ uint2 mo_sm[];
    uint2 *tbl = mo_sm;                             /* [S][8 MMAs][NT][32 lanes] B fragments */
    float *xs = (float *)(mo_sm + S * 8 * NT * 32); /* [S][GPS] Σx */
    /* programmatic dependent launch (cuda_common.cuh): gate/up waits for its inputs (idx, x) BEFORE it
     * lets the down kernel start, so down's blocks may read idx (complete by then: the grid that wrote
     * it has finished, read from L2) and issue their weight loads before they wait for h */
    const bool early = a.early && !a.pair;
    if (!early) pdl_wait();
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int p = blockIdx.z, sb = blockIdx.y, st0 = sb * S, ns = min(S, a.nst - st0);
    const int e0 = __ldcg(a.idx + p);
    const bool ok = e0 >= 0 && e0 < a.nmat;
    const size_t e = ok ? (size_t)e0 : 0; /* a dead pair reads expert 0 and stores 0 */
    const size_t rb = (size_t)a.in / 2;   /* q4 row bytes */

    /* the lane's rows: gate/up output u (gate row u in set 0, up row u in set 1), or down rows u, u+8 */
    const int u0 = a.pair ? (blockIdx.x * 8 + warp) * 8 + g : (blockIdx.x * 8 + warp) * 16 + g;
    const int u1 = a.pair ? u0 : u0 + 8;
    const bool live0 = u0 < a.out, live1 = u1 < a.out;
    const size_t r0 = live0 ? u0 : 0, r1 = live1 ? u1 : 0; /* clamp: computed, never stored */
    const uint8_t *w0 = a.data[0] + e * a.mat_bytes + r0 * rb + t * 16;
    const uint8_t *w1 = a.data[1] + e * a.mat_bytes + r1 * rb + t * 16;
    const uint16_t *s0 = (const uint16_t *)(a.scales[0] + e * a.mat_bytes_s) + r0 * a.ng;
    const uint16_t *b0 = (const uint16_t *)(a.biases[0] + e * a.mat_bytes_s) + r0 * a.ng;
    const uint16_t *s1 = (const uint16_t *)(a.scales[1] + e * a.mat_bytes_s) + r1 * a.ng;
    const uint16_t *b1 = (const uint16_t *)(a.biases[1] + e * a.mat_bytes_s) + r1 * a.ng;

    /* the slice's words and scales, all in flight before x is staged */
    uint4 wv0[S], wv1[S];
    SV cs0[S], cb0[S], cs1[S], cb1[S];
#pragma unroll
    for (int i = 0; i < S; i++) {
        if (i >= ns) break;
        const int st = st0 + i, G = st * GPS;
        const bool in_row = !a.tail || (size_t)st * 64 + t * 16 < rb;
        wv0[i] = in_row ? mm_ld4(w0 + (size_t)st * 64) : make_uint4(0u, 0u, 0u, 0u);
        wv1[i] = in_row ? mm_ld4(w1 + (size_t)st * 64) : make_uint4(0u, 0u, 0u, 0u);
        cs0[i] = mo_lds<GPS>(s0, G, a.ng, a.tail); cb0[i] = mo_lds<GPS>(b0, G, a.ng, a.tail);
        cs1[i] = mo_lds<GPS>(s1, G, a.ng, a.tail); cb1[i] = mo_lds<GPS>(b1, G, a.ng, a.tail);
    }
    if (early) pdl_wait(); /* h and the partials are the gate/up kernel's */
    mm_stage<4, GB, S, true>(tbl, xs, a.x + (size_t)(p / a.xdiv) * a.xstride, st0, ns, a.in);
    __syncthreads();

    const uint2 *tl = tbl + lane;
    float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
    for (int sl = 0; sl < S; sl++) {
        if (sl >= ns) break;
        const uint32_t wa[4] = {wv0[sl].x, wv0[sl].y, wv0[sl].z, wv0[sl].w};
        const uint32_t wc[4] = {wv1[sl].x, wv1[sl].y, wv1[sl].z, wv1[sl].w};
        mm_step<GPS, F16S, false>(acc0, acc1, wa, wc, cs0[sl], cb0[sl], cs1[sl], cb1[sl], tl, xs, sl, a.magic, t);
    }
    mm_row_sums(acc0, acc1);

    const int units = a.pair ? 2 * a.out : a.out; /* partial floats per (pair, slice) */
    float *pp = a.part + ((size_t)p * a.ks + sb) * units;
    if (t == 0) {
        if (a.pair) {
            if (live0 && a.ks == 1) a.y[(size_t)p * a.ystride + u0] = ok ? mo_h(a, acc0, acc1) : 0.0f;
            else if (live0) { pp[2 * u0] = acc0; pp[2 * u0 + 1] = acc1; }
        } else {
            if (live0) pp[u0] = acc0;
            if (live1) pp[u1] = acc1;
        }
    }
    if (a.pair && a.ks == 1) return;

    /* the last block of the counter's group sums the partials in fixed order */
    const int grp = a.pair ? p : p / a.k, need = a.pair ? a.ks : a.ks * a.k;
    int *cnt = a.cnt + (size_t)grp * a.rblocks + blockIdx.x;
    if (!tern_block_last(cnt, need)) return;
    /* the partials of one output sit `units` floats apart (slice s, or pair j and slice s: f = j·ks + s);
     * MO_BUF of them are loaded before any is added (one L2 round trip per MO_BUF, not per term), the
     * sum keeps the f order. Down: the pairs' weights (0 / skip for dead ids) staged once per block */
    const int per = a.pair ? 64 : 128, u = blockIdx.x * per + threadIdx.x;
    const bool mine = threadIdx.x < per && u < a.out;
    if (a.pair) {
        const float2 *q = (const float2 *)(a.part + (size_t)p * a.ks * units) + u;
        float v = 0.0f, up = 0.0f;
        for (int f0 = 0; mine && f0 < a.ks; f0 += MO_BUF) {
            float2 b[MO_BUF];
#pragma unroll
            for (int i = 0; i < MO_BUF; i++)
                b[i] = f0 + i < a.ks ? __ldcg(q + (size_t)(f0 + i) * a.out) : make_float2(0.0f, 0.0f);
#pragma unroll
            for (int i = 0; i < MO_BUF; i++) {
                if (f0 + i >= a.ks) break;
                v += b[i].x;
                up += b[i].y;
            }
        }
        if (mine) a.y[(size_t)p * a.ystride + u] = ok ? mo_h(a, v, up) : 0.0f;
    } else {
        __shared__ float cw[MO_KMAX];
        __shared__ int cv[MO_KMAX];
        if (threadIdx.x < a.k) {
            const int q = grp * a.k + threadIdx.x, eq = __ldcg(a.idx + q);
            cv[threadIdx.x] = eq >= 0 && eq < a.nmat; /* dead pairs: no term, as gemv_expert */
            cw[threadIdx.x] = a.wts ? __ldcg(a.wts + q) : 1.0f;
        }
        __syncthreads();
        const int nf = a.k * a.ks;
        const float *q = a.part + (size_t)grp * nf * units + u;
        float v = 0.0f, d = 0.0f;
        for (int f0 = 0; mine && f0 < nf; f0 += MO_BUF) {
            float b[MO_BUF];
#pragma unroll
            for (int i = 0; i < MO_BUF; i++) b[i] = f0 + i < nf ? __ldcg(q + (size_t)(f0 + i) * units) : 0.0f;
#pragma unroll
            for (int i = 0; i < MO_BUF; i++) {
                const int f = f0 + i, j = f / a.ks, s = f - j * a.ks;
                if (f >= nf) break;
                d = s == 0 ? b[i] : d + b[i];
                if (s == a.ks - 1 && cv[j]) v = fmaf(cw[j], d, v);
            }
        }
        if (mine) a.y[(size_t)grp * a.ystride + u] = v;
    }
    if (threadIdx.x == 0) *cnt = 0;
}

extern "C" int tern__cuda_moe_mma_on, tern__cuda_moe_mma_early;
int tern__cuda_moe_mma_on = -1;
int tern__cuda_moe_mma_early = 1; /* 0: down reads idx and weights after its wait too (bench_cuda --moe) */
unsigned long long tern__cuda_moe_mma_calls = 0;

/* Q4, BF16/F16 scales, groups 32/64/128, 16-byte rows and aligned stacks */
static int served(const tern__cuda_w *w) {
    const int gs = w->group_size;
    return w->dtype == TERN_DT_Q && w->bits == 4 && (w->sdtype == TERN_DT_BF16 || w->sdtype == TERN_DT_F16) &&
           (gs == 32 || gs == 64 || gs == 128) && w->in > 0 && w->in % gs == 0 && w->out > 0 && w->nmat > 0 &&
           !((uintptr_t)w->data & 15) && !((uintptr_t)w->scales & 7) && !((uintptr_t)w->biases & 7) &&
           w->mat_bytes % 16 == 0;
}

/* the launch geometry of one projection (pair: gate/up, 2 partials per output); returns how many tokens
 * of k pairs one launch may take (partials and counters of c->part / c->mm_cnt; the two launches use
 * them in turn), 0 when not even one fits */
static int plan(tern__cuda *c, MoeMmArgs *a, const tern__cuda_w *w, int pair, int k) {
    a->pair = pair;
    a->out = w->out;
    a->in = w->in;
    a->ng = w->in / w->group_size;
    a->nmat = w->nmat;
    a->mat_bytes = w->mat_bytes;
    a->mat_bytes_s = w->mat_bytes_s;
    const size_t rb = (size_t)w->in / 2;
    const int S = w->group_size == 32 ? 2 : 4; /* = the kernel's S */
    a->nst = (int)((rb + 63) / 64);
    a->ks = (a->nst + S - 1) / S;
    a->tail = rb % 64 != 0;
    a->rblocks = (w->out + (pair ? 63 : 127)) / (pair ? 64 : 128);
    a->part = c->part;
    a->cnt = c->mm_cnt;
    a->magic = 0x43004300u;
    a->k = k;
    if (a->ks > 65535) return 0;
    size_t nt = 65535 / (size_t)k; /* pairs on blockIdx.z */
    if (!pair || a->ks > 1) {      /* gate/up in one slice stores h directly */
        const size_t units = pair ? 2 * (size_t)w->out : (size_t)w->out;
        const size_t pt = TERN_CUDA_PART_FLOATS / ((size_t)k * a->ks * units); /* partials */
        const size_t ct = MM_CNT / ((size_t)(pair ? k : 1) * a->rblocks);        /* counters */
        nt = pt < nt ? pt : nt;
        nt = ct < nt ? ct : nt;
    }
    return (int)nt;
}

static void launch(tern__cuda *c, const MoeMmArgs &a, const tern__cuda_w *w, int np) {
    const dim3 grid((unsigned)a.rblocks, (unsigned)a.ks, (unsigned)np);
    const size_t smem = 4 * 8 * 32 * sizeof(uint2) + 4 * 4 * sizeof(float); /* B table (S·NT <= 4) + Σx */
    const bool f16 = w->sdtype == TERN_DT_F16;
    if (w->group_size == 32) {
        if (f16) tern_launch(c->stream, moe_mma_kernel<16, true>, grid, 256, smem, a);
        else tern_launch(c->stream, moe_mma_kernel<16, false>, grid, 256, smem, a);
    } else if (w->group_size == 64) {
        if (f16) tern_launch(c->stream, moe_mma_kernel<32, true>, grid, 256, smem, a);
        else tern_launch(c->stream, moe_mma_kernel<32, false>, grid, 256, smem, a);
    } else {
        if (f16) tern_launch(c->stream, moe_mma_kernel<64, true>, grid, 256, smem, a);
        else tern_launch(c->stream, moe_mma_kernel<64, false>, grid, 256, smem, a);
    }
}

extern "C" int tern__cuda_moe_mma(tern__cuda *c, float *y, const float *x, int n, const int32_t *idx,
                                  const float *wts, int k, const tern__cuda_w *gate, const tern__cuda_w *up,
                                  const tern__cuda_w *down, int act, float *scratch, int round_h) {
    if (tern__cuda_moe_mma_on < 0) tern__cuda_moe_mma_on = tern__cuda_env_int("TERN_CUDA_MOE_MMA", 1) != 0;
    if (!tern__cuda_moe_mma_on || !c->mm_cnt || n <= 0 || k <= 0 || !served(gate) || !served(up) || !served(down))
        return 0;
    if (up->group_size != gate->group_size || up->sdtype != gate->sdtype || up->out != gate->out ||
        up->in != gate->in || up->nmat != gate->nmat || up->mat_bytes != gate->mat_bytes ||
        up->mat_bytes_s != gate->mat_bytes_s || down->in != gate->out || down->out != gate->in)
        return 0;
    if (((uintptr_t)x & 15) || ((uintptr_t)scratch & 15) || k > MO_KMAX) return 0;
    const int I = gate->out, H = gate->in;
    MoeMmArgs g = {}, d = {};
    const int tg = plan(c, &g, gate, 1, k), td = plan(c, &d, down, 0, k);
    const int nc = tg < td ? tg : td; /* tokens per launch pair */
    if (nc < 1) return 0;
    g.data[0] = (const uint8_t *)gate->data; g.scales[0] = (const uint8_t *)gate->scales;
    g.biases[0] = (const uint8_t *)gate->biases;
    g.data[1] = (const uint8_t *)up->data; g.scales[1] = (const uint8_t *)up->scales;
    g.biases[1] = (const uint8_t *)up->biases;
    g.xstride = H; g.xdiv = k;
    g.ystride = 2 * I;
    g.act = act;
    g.rnd = round_h;
    d.data[0] = d.data[1] = (const uint8_t *)down->data;
    d.scales[0] = d.scales[1] = (const uint8_t *)down->scales;
    d.biases[0] = d.biases[1] = (const uint8_t *)down->biases;
    d.xstride = 2 * I; d.xdiv = 1;
    d.ystride = H;
    d.early = tern__cuda_moe_mma_early;
    cudaSetDevice(c->device);
    for (int t0 = 0; t0 < n; t0 += nc) { /* tokens t0 .. t0+m-1: pairs t0·k .. (t0+m)·k-1 */
        const int m = n - t0 < nc ? n - t0 : nc, np = m * k;
        const size_t p0 = (size_t)t0 * k;
        g.idx = d.idx = idx + p0;
        d.wts = wts ? wts + p0 : NULL;
        g.x = x + (size_t)t0 * H;
        g.y = scratch + p0 * 2 * I;
        d.x = g.y;
        d.y = y + (size_t)t0 * H;
        launch(c, g, gate, np);
        tern__cuda_check(c, "moe_mma gate/up");
        launch(c, d, down, np);
        tern__cuda_check(c, "moe_mma down");
    }
    tern__cuda_moe_mma_calls++;
    return 1;
}

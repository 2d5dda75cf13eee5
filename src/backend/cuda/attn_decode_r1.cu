/*
 * attn_decode_r1.cu — decode attention for one row (or a few) at short and middle contexts: tensor cores fed from
 * registers, no shared-memory staging of keys, one block barrier and one cluster merge. TERN_CUDA_AD_R1.
 *
 * Why: a batch-1 llama3-8b step spends ~14 µs a layer in attn_decode.cu's split kernel at 512 keys (ncu, H200,
 * bench/NOTES.md (aa)) for 2 MB of K/V (~0.5 µs at the copy rate): it is instruction-latency bound — ~2200
 * instructions a warp at ~11 cycles apart, 60 % of them the CUDA-core dot products (a key's 128 products summed
 * over 16 lanes with shuffles, per head), behind a record table in shared memory and four block barriers. The
 * tensor-core kernels (attn_decode_tc.cu) stage K/V through 100+ KB cp.async rings, whose shared-memory carveout
 * cost the batch-1 graph its launch overlap (NOTES (aa)). Here a warp scores 16 keys × 8 heads in 2·D/16 mmas and
 * sums p·v in D/8 more, each lane loading its own pieces of K and V straight into fragment registers.
 *
 * Fragments (mma.cuh; lane = 4g + t). The dot product q·k sums over the head dimensions in any order, so the
 * k-step slots are mapped to dimensions where a lane's loads are contiguous: lane (g, t) holds dimensions
 * [t·D/4, (t+1)·D/4) of one key, k-step kk taking dimensions t·D/4 + 4kk + {0, 1} (slots 2t, 2t+1) and + {2, 3}
 * (slots 2t+8, 2t+9). Scores: A = q (row h < 8: hi(q_h), row 8 + h: lo(q_h) = round(q_h − hi), heads h >= G zero:
 * attn_decode_tc.cu's split, near-f32 sums), B = K^T with key n = g of an 8-key n-tile; a 16-key chunk is two
 * n-tiles, and the C fragments give lane (g, t) head g's scores of keys 2t, 2t+1, 8+2t, 9+2t (hi in c0/c1, lo
 * in c2/c3) — the A fragment of P for P·V (hi(p) rows g, lo(p) rows g + 8). P·V: B = V with key slots
 * 2t, 2t+1 / 2t+8, 2t+9 (the lane's own four keys, so the lane also knows which scores to mask) and output column
 * g of n-tile n mapped to dimension g·D/8 + n: lane (g, t) loads D/8 contiguous elements of each of its 4 V rows and
 * packs a B register from two rows with one byte permute. Its outputs are head g's dimensions (2t + b)·D/8 + n.
 *
 * Work: grid (kv head, S, row) with the S blocks of a (row, kv head) one thread-block cluster; the row's keys
 * lo..pos in 16-key chunks dealt to the S·W warps round robin (chunk c to warp c mod S·W), online softmax per
 * warp over its chunks (the next chunk's K loads while P·V runs, its V after). Then the block's W warps merge in
 * shared memory (one barrier), and each block writes 1/S of the outputs from the S blocks' merged sums read
 * through distributed shared memory (ad_split_weights' arithmetic; a fixed order: the same bits every run).
 * Keys past the row, or in blocks not resident (block table < 0), are zero rows (nothing loaded) scored −inf.
 * EARLY (one row over BF16 pages, TERN_CUDA_AD_EARLY): the first chunk's records and K/V loads go out before
 * pdl_wait; after it, q loads and the rows of key pos (written by the kernel before) load again. Every K/V load
 * is .cg (L2): nothing a block reads twice.
 * D 256 / 512 (Gemma 4's sliding / global layers): a chunk is walked by a group of DS = D/128 warps, each over its
 * part of the dimensions (the fragments above at D 128), the parts' partial scores exchanged per chunk through
 * shared memory and a named barrier and summed in part order by every warp of the group; p·v by each warp over its
 * part. D 512 takes 8 warps a block (TERN_CUDA_AD_R1_512=0: back to the split kernel).
 * Served: BF16 / F16 pages, D 64 / 128 / 256 / 512, G = nh / nkv <= 8, any window, softcap; others return 0 (the
 * caller's kernels run). S <= 16 (a non-portable cluster size, allowed at open; TERN_CUDA_AD_R1_SMAX), W = 4 or 8
 * warps (TERN_CUDA_AD_R1_W). H200 (bench/NOTES.md (az)): b1 llama3-8b bf16 222.9 -> 230.7, q4 353 -> 369 tok/s.
 * TR (TERN_CUDA_AD_R1_TR, default 1, G <= 4; session 61, measured in session 62, bench/NOTES.md (bv)): the products
 * transposed, so that hi and lo of up to 4 heads fill the 8 columns instead of 16 rows of which G·2 carry heads. Scores
 * S^T = K·Q^T: A = the same K loads (rows keys g, g + 8; the k-slots on the same dimensions as above), B = Q^T (column g
 * = hi (g even) or lo (g odd) of head g >> 1); lane (g, t) gets head t's scores of keys g, g + 8 as c0 + c1, c2 + c3;
 * the chunk's maximum over the lanes of one t. (P·V)^T = V^T·P^T: A = the same V loads paired by one byte permute
 * (rows: dimensions g·D/8 + mt and + D/16 + mt of m-tile mt), B = P^T gathered by 4 shuffles (key k of head h sits in
 * lane 4·(k mod 8) + h). Per 16 keys at D 128: 16 mmas instead of 32, 32 accumulators instead of 64. The fragment
 * mapping is checked by a lane-level emulation against a reference softmax (scripts/r1t_emulate.py, exact to 1e-15).
 * H100: the kernel alone 32 / 8 x 128 at 512 keys 9.17 -> 7.86 us, 16 / 8 x 256 at 1024 10.88 -> 10.56; b1 llama3-8b q4
 * +1.2 %, bf16 +0.8 %, gemma4-e4b +0.9 %, 26b-a4b at 8k +0.3 %, 12b at 8k -0.2 % (TERN_CUDA_AD_R1_TR=0: the first form).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/attn_decode.cuh"

#include <cooperative_groups.h>
#include <math.h>

namespace cg = cooperative_groups;

#define R1_SMAX 16 /* blocks (a cluster) per (row, kv head) */

extern "C" unsigned long long tern__cuda_attn_decode_r1_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_attn_decode_r1_calls = 0;

/* A chunk's NV scores a lane: with DS > 1 the group's DS parts of each dot product through shared memory xp (xs[par]:
 * one named barrier a group and chunk; buffers by parity, so a warp cannot overwrite what another has yet to read),
 * summed in part order in every warp of the group (the same scores in all); then scaled, softcapped, and -inf where
 * ok[v] is false */
template <int DS, int NV, int XN>
__device__ __forceinline__ void r1_scores(float *s, float (*xp)[32][XN], int warp, int lane, int pw, float scale, float cap,
                                          const bool *ok) {
    if constexpr (DS > 1) {
#pragma unroll
        for (int v = 0; v < NV; v++) xp[warp][lane][v] = s[v];
        asm volatile("bar.sync %0, %1;" ::"r"(1 + pw), "r"(32 * DS) : "memory");
#pragma unroll
        for (int v = 0; v < NV; v++) {
            float x = xp[pw * DS][lane][v];
#pragma unroll
            for (int h = 1; h < DS; h++) x += xp[pw * DS + h][lane][v];
            s[v] = x;
        }
    }
#pragma unroll
    for (int v = 0; v < NV; v++) {
        float x = s[v] * scale;
        if (cap > 0.0f) x = cap * tanhf(x / cap);
        s[v] = ok[v] ? x : -INFINITY;
    }
}

template <typename T, int D, int W, bool EARLY, bool TR>
__global__ void __launch_bounds__(32 * W) attn_dec_r1_kernel(AdArgs a) {
    constexpr int DS = D > 128 ? D / 128 : 1, DH = D / DS, WP = W / DS; /* D 256 / 512: 2 / 4 warps a chunk */
    constexpr int NK = DH / 16, NT = DH / 8; /* k-steps of Q·K^T, n-tiles of P·V */
    constexpr int NM = DH / 16;              /* TR: m-tiles of (P·V)^T */
    constexpr int DL = DH / 4, KW = DH / 8;  /* a lane's K elements of a key, as 32-bit words */
    constexpr int DV = DH / 8, VW = DH / 16; /* a lane's V elements of a key, as words */
    static_assert(DS <= 4 && W % DS == 0, "warp groups");
    __shared__ float red[WP][8][D];          /* the warps' Σ p·v, then (slot 0) the block's merged sums */
    __shared__ float wml[WP][8][2], bml[8][2];
    /* DS > 1: the parts' partial scores, by chunk parity */
    __shared__ float xs[DS > 1 ? 2 : 1][DS > 1 ? W : 1][32][TR ? 2 : 4];
    pdl_trigger();
    if (!EARLY) pdl_wait();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int pw = warp / DS, hf = warp % DS; /* the warp's group (its chunks) and part of the dimensions */
    const int kvh = blockIdx.x, z = blockIdx.y, S = gridDim.y, r = blockIdx.z, G = a.G;
    const size_t head0 = (size_t)kvh * G;
    const int pos = a.pos[r];
    const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
    const int len = pos >= 0 ? pos - lo + 1 : 0, nch = (len + 15) >> 4, step = S * WP;
    const int32_t *btrow = ad_btrow(a, r);
    /* a key's rows: the lane's piece of token 0 + rec · the pool's bytes a token, one IMAD.WIDE.U32 (rec >= 0 where
     * loaded); a signed 64-bit product took a sign extension and three multiplies a record */
    const uint32_t rowb = (uint32_t)((size_t)a.nkv * D * sizeof(T));
    const char *kb = (const char *)((const T *)a.kp + (size_t)kvh * D + hf * DH + t * DL);
    const char *vb = (const char *)((const T *)a.vp + (size_t)kvh * D + hf * DH + g * DV);
    uint32_t kw[2][KW], vw[4][VW];
    int krec[2], vrec[4];
    /* chunk cc's keys: K rows 16cc + 8j + g (j = n-tile), V rows 16cc + 8(v >> 1) + 2t + (v & 1) */
    auto rec_of = [&](int i) { return i < len ? ad_rec(a, btrow, lo + i) : -1; };
    auto get_k = [&](int j) {
#pragma unroll
        for (int i = 0; i < KW / 4; i++) {
            const uint4 x = krec[j] >= 0 ? __ldcg((const uint4 *)(kb + (size_t)(uint32_t)krec[j] * rowb) + i) : make_uint4(0, 0, 0, 0);
            kw[j][4 * i] = x.x; kw[j][4 * i + 1] = x.y; kw[j][4 * i + 2] = x.z; kw[j][4 * i + 3] = x.w;
        }
    };
    auto get_v = [&](int v) {
#pragma unroll
        for (int i = 0; i < VW / 4; i++) {
            const uint4 x = vrec[v] >= 0 ? __ldcg((const uint4 *)(vb + (size_t)(uint32_t)vrec[v] * rowb) + i) : make_uint4(0, 0, 0, 0);
            vw[v][4 * i] = x.x; vw[v][4 * i + 1] = x.y; vw[v][4 * i + 2] = x.z; vw[v][4 * i + 3] = x.w;
        }
    };
    /* AHEAD (a.ahead): the next chunk's records (a block-table load each, 16-key blocks) are looked up one chunk early,
     * so that its K / V loads go out without that round trip in front of them */
    const bool ahead = a.ahead != 0;
    int nkrec[2], nvrec[4];
    auto look_ahead = [&](int cc) {
#pragma unroll
        for (int j = 0; j < 2; j++) nkrec[j] = rec_of(16 * cc + 8 * j + g);
#pragma unroll
        for (int v = 0; v < 4; v++) nvrec[v] = rec_of(16 * cc + 8 * (v >> 1) + 2 * t + (v & 1));
    };
    auto load_k = [&](int cc, bool nx) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            krec[j] = nx ? nkrec[j] : rec_of(16 * cc + 8 * j + g);
            get_k(j);
        }
    };
    auto load_v = [&](int cc, bool nx) {
#pragma unroll
        for (int v = 0; v < 4; v++) {
            vrec[v] = nx ? nvrec[v] : rec_of(16 * cc + 8 * (v >> 1) + 2 * t + (v & 1));
            get_v(v);
        }
    };
    int c = z * WP + pw; /* this warp's first chunk */
    if (c < nch) {
        load_k(c, false);
        load_v(c, false);
        if (ahead) look_ahead(c + step);
    }
    if constexpr (EARLY) {
        /* pos, the block table and the keys before pos were written before this step; key pos (and q) by the
         * kernel this one waits for: its rows again, through L2 */
        pdl_wait();
        if (c < nch) {
            const int ip = len - 1;
#pragma unroll
            for (int j = 0; j < 2; j++)
                if (16 * c + 8 * j + g == ip) get_k(j);
#pragma unroll
            for (int v = 0; v < 4; v++)
                if (16 * c + 8 * (v >> 1) + 2 * t + (v & 1) == ip) get_v(v);
        }
    }
    /* q of head g (rows g: hi, g + 8: lo), the lane's dimensions t·DL + 4kk .. +3 per k-step. TR: the B fragment of
     * Q^T instead, column g = hi (g even) or lo (g odd) of head g >> 1, the same dimensions per k-slot */
    uint32_t qf[TR ? 1 : NK][4], qb[TR ? NK : 1][2];
    if constexpr (TR) {
        const int hq = g >> 1;
        const float4 *qp = (const float4 *)(a.q + ((size_t)r * a.nh + head0 + hq) * D + hf * DH + t * DL);
#pragma unroll
        for (int kk = 0; kk < NK; kk++) {
            const float4 x = hq < G ? __ldcg(qp + kk) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            uint32_t h0, l0, h1, l1;
            tc_split<T>(x.x, x.y, h0, l0);
            tc_split<T>(x.z, x.w, h1, l1);
            qb[kk][0] = g & 1 ? l0 : h0;
            qb[kk][1] = g & 1 ? l1 : h1;
        }
    } else {
        const float4 *qp = (const float4 *)(a.q + ((size_t)r * a.nh + head0 + g) * D + hf * DH + t * DL);
#pragma unroll
        for (int kk = 0; kk < NK; kk++) {
            const float4 x = g < G ? __ldcg(qp + kk) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            tc_split<T>(x.x, x.y, qf[kk][0], qf[kk][1]);
            tc_split<T>(x.z, x.w, qf[kk][2], qf[kk][3]);
        }
    }
    constexpr int NO = TR ? NM : NT;
    float o[NO][4], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int n = 0; n < NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const float scale = a.scale, cap = a.softcap;
    int par = 0; /* DS > 1: the chunk's parity (xs buffer) */
    while (c < nch) {
        const int cn = c + step; /* this warp's next chunk */
        if constexpr (TR) {
            /* S^T = K·Q^T: rows keys g, g + 8 (the K rows already loaded), columns hi / lo of heads 0..3; lane (g, t)
             * gets head t's partial scores of keys g and g + 8 as c0 + c1, c2 + c3 */
            float sc[4];
#pragma unroll
            for (int kk = 0; kk < NK; kk++) {
                const uint32_t ka[4] = {kw[0][2 * kk], kw[1][2 * kk], kw[0][2 * kk + 1], kw[1][2 * kk + 1]};
                if (kk == 0) TcH<T>::mma_z(sc, ka, qb[0][0], qb[0][1]);
                else TcH<T>::mma(sc, ka, qb[kk][0], qb[kk][1]);
            }
            const bool ok[2] = {krec[0] >= 0, krec[1] >= 0}; /* this chunk's keys g, g + 8 */
            if (cn < nch) load_k(cn, ahead);
            float s[2] = {sc[0] + sc[1], sc[2] + sc[3]};
            r1_scores<DS, 2>(s, xs[par], warp, lane, pw, scale, cap, ok);
            float cm = fmaxf(s[0], s[1]); /* head t's maximum over the chunk: lanes of the same t */
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 4));
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 8));
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 16));
            const float mn = fmaxf(m, cm), al = m == -INFINITY ? 0.0f : expf(m - mn);
            float p[2];
#pragma unroll
            for (int v = 0; v < 2; v++) p[v] = s[v] == -INFINITY ? 0.0f : expf(s[v] - mn);
            l = l * al + (p[0] + p[1]);
            m = mn;
            /* P^T as the B fragment: column g = hi / lo of head g >> 1, k-slots 2t, 2t + 1, 2t + 8, 2t + 9 = keys
             * (the V rows v = 0..3), from the lanes holding them (key k of head h: lane 4·(k mod 8) + h, p[k >= 8]) */
            const int src = 8 * t + (g >> 1);
            const float u0 = __shfl_sync(0xffffffffu, p[0], src), u1 = __shfl_sync(0xffffffffu, p[0], src + 4);
            const float u2 = __shfl_sync(0xffffffffu, p[1], src), u3 = __shfl_sync(0xffffffffu, p[1], src + 4);
            uint32_t h0, l0, h1, l1;
            tc_split<T>(u0, u1, h0, l0);
            tc_split<T>(u2, u3, h1, l1);
            const uint32_t b0 = g & 1 ? l0 : h0, b1 = g & 1 ? l1 : h1;
            /* (P·V)^T += V^T·P^T: m-tile mt's rows are dimensions g·DV + mt and g·DV + NM + mt of the lane's V
             * loads */
#pragma unroll
            for (int mt = 0; mt < NM; mt++) {
                const unsigned sel = mt & 1 ? 0x7632u : 0x5410u;
                const int e0 = mt >> 1, e1 = (NM + mt) >> 1;
                const uint32_t va[4] = {__byte_perm(vw[0][e0], vw[1][e0], sel), __byte_perm(vw[0][e1], vw[1][e1], sel),
                                        __byte_perm(vw[2][e0], vw[3][e0], sel), __byte_perm(vw[2][e1], vw[3][e1], sel)};
                o[mt][0] *= al; o[mt][1] *= al; o[mt][2] *= al; o[mt][3] *= al;
                TcH<T>::mma(o[mt], va, b0, b1);
            }
        } else {
            float sc[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                TcH<T>::mma_z(sc[j], qf[0], kw[j][0], kw[j][1]);
#pragma unroll
                for (int kk = 1; kk < NK; kk++) TcH<T>::mma(sc[j], qf[kk], kw[j][2 * kk], kw[j][2 * kk + 1]);
            }
            if (cn < nch) load_k(cn, ahead); /* the next chunk's K, in flight during the softmax and P·V */
            float s[4];               /* keys 2t, 2t+1, 8+2t, 9+2t of head g: V rows v = 0..3 */
#pragma unroll
            for (int v = 0; v < 4; v++) s[v] = sc[v >> 1][v & 1] + sc[v >> 1][2 + (v & 1)];
            const bool ok[4] = {vrec[0] >= 0, vrec[1] >= 0, vrec[2] >= 0, vrec[3] >= 0};
            r1_scores<DS, 4>(s, xs[par], warp, lane, pw, scale, cap, ok);
            float cm = fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3]));
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 2));
            const float mn = fmaxf(m, cm), al = m == -INFINITY ? 0.0f : expf(m - mn);
            float p[4];
#pragma unroll
            for (int v = 0; v < 4; v++) p[v] = s[v] == -INFINITY ? 0.0f : expf(s[v] - mn);
            l = l * al + ((p[0] + p[1]) + (p[2] + p[3]));
            m = mn;
            uint32_t pa[4];
            tc_split<T>(p[0], p[1], pa[0], pa[1]);
            tc_split<T>(p[2], p[3], pa[2], pa[3]);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const unsigned sel = n & 1 ? 0x7632u : 0x5410u;
                o[n][0] *= al; o[n][1] *= al; o[n][2] *= al; o[n][3] *= al;
                TcH<T>::mma(o[n], pa, __byte_perm(vw[0][n >> 1], vw[1][n >> 1], sel),
                            __byte_perm(vw[2][n >> 1], vw[3][n >> 1], sel));
            }
        }
        if (cn < nch) { /* its V after P·V (the registers were in use) */
            load_v(cn, ahead);
            if (ahead) look_ahead(cn + step);
        }
        if (DS > 1) par ^= 1;
        c = cn;
    }
    if constexpr (TR) {
        /* head t: its keys' l over the lanes of the same t; outputs c0 + c1 (dimension g·DV + mt), c2 + c3 (+ NM) */
        l += __shfl_xor_sync(0xffffffffu, l, 4);
        l += __shfl_xor_sync(0xffffffffu, l, 8);
        l += __shfl_xor_sync(0xffffffffu, l, 16);
        if (t < G) {
#pragma unroll
            for (int mt = 0; mt < NM; mt++) {
                red[pw][t][hf * DH + g * DV + mt] = o[mt][0] + o[mt][1];
                red[pw][t][hf * DH + g * DV + NM + mt] = o[mt][2] + o[mt][3];
            }
            if (g == 0 && hf == 0) {
                wml[pw][t][0] = m;
                wml[pw][t][1] = l;
            }
        }
    } else {
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (g < G) {
#pragma unroll
            for (int n = 0; n < NT; n++) {
                red[pw][g][hf * DH + 2 * t * DV + n] = o[n][0] + o[n][2];
                red[pw][g][hf * DH + (2 * t + 1) * DV + n] = o[n][1] + o[n][3];
            }
            if (t == 0 && hf == 0) {
                wml[pw][g][0] = m;
                wml[pw][g][1] = l;
            }
        }
    }
    __syncthreads();
    /* the block's warps merged (warp order), in place into warp 0's slots; one block: the outputs */
    for (int idx = threadIdx.x; idx < G * D; idx += 32 * W) {
        const int h = idx / D, i = idx % D;
        float v = 0.0f;
        const float L = ad_split_weights([&](int w) { return make_float2(wml[w][h][0], wml[w][h][1]); },
                                         [&](int w, float cw) { v += red[w][h][i] * cw; }, WP);
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < WP; w++) M = fmaxf(M, wml[w][h][0]);
        if (S == 1) {
            a.out[((size_t)r * a.nh + head0 + h) * D + i] = L > 0.0f ? v / L : 0.0f;
        } else {
            red[0][h][i] = v;
            if (i == 0) {
                bml[h][0] = M;
                bml[h][1] = L;
            }
        }
    }
    if (S == 1) return;
    /* the cluster's blocks: block z writes its share of the G·D outputs from every block's merged sums */
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    const int tot = G * D, per = (tot + S - 1) / S, i0 = z * per, i1 = min(tot, i0 + per);
    for (int idx = i0 + (int)threadIdx.x; idx < i1; idx += 32 * W) {
        const int h = idx / D, i = idx % D;
        /* every block's (M, L) and sum first, all remote loads in flight at once; then ad_split_weights' arithmetic
         * (the maximum, then the weights and both sums in block order) over the S blocks */
        float2 mz[R1_SMAX];
        float pz[R1_SMAX];
#pragma unroll
        for (int zz = 0; zz < R1_SMAX; zz++)
            if (zz < S) {
                const float *b = cl.map_shared_rank(&bml[0][0], zz);
                mz[zz] = make_float2(b[2 * h], b[2 * h + 1]);
                pz[zz] = cl.map_shared_rank(&red[0][0][0], zz)[h * D + i];
            }
        float M = -INFINITY, L = 0.0f, v = 0.0f;
#pragma unroll
        for (int zz = 0; zz < R1_SMAX; zz++)
            if (zz < S) M = fmaxf(M, mz[zz].x);
#pragma unroll
        for (int zz = 0; zz < R1_SMAX; zz++)
            if (zz < S) {
                const float cz = M == -INFINITY || mz[zz].x == -INFINITY ? 0.0f : expf(mz[zz].x - M);
                v += pz[zz] * cz;
                L += mz[zz].y * cz;
            }
        a.out[((size_t)r * a.nh + head0 + h) * D + i] = L > 0.0f ? v / L : 0.0f;
    }
    cl.sync(); /* the other blocks' reads of this block's shared memory are done */
}

/* TERN_CUDA_AD_R1_W: warps a block (4 or 8, default 4); TERN_CUDA_AD_R1_SMAX: blocks a (row, kv head) at most
 * (1..16, default 16). -1 until read (tests set them) */
extern "C" int tern__cuda_ad_r1_w, tern__cuda_ad_r1_smax, tern__cuda_ad_r1_ahead, tern__cuda_ad_r1_tr;
int tern__cuda_ad_r1_w = -1, tern__cuda_ad_r1_smax = -1, tern__cuda_ad_r1_ahead = -1, tern__cuda_ad_r1_tr = -1;
static int r1_env(void) { /* reads the settings once (TERN_CUDA_AD_R1_AHEAD=0: records as each chunk's loads go out;
                           * TERN_CUDA_AD_R1_TR=0: the first form for G <= 4 too); returns W */
    if (tern__cuda_ad_r1_ahead < 0) tern__cuda_ad_r1_ahead = tern__cuda_env_int("TERN_CUDA_AD_R1_AHEAD", 1) != 0;
    if (tern__cuda_ad_r1_tr < 0) tern__cuda_ad_r1_tr = tern__cuda_env_int("TERN_CUDA_AD_R1_TR", 1) != 0;
    if (tern__cuda_ad_r1_w < 0) tern__cuda_ad_r1_w = tern__cuda_env_int("TERN_CUDA_AD_R1_W", 4) == 8 ? 8 : 4;
    if (tern__cuda_ad_r1_smax < 0) {
        const int v = tern__cuda_env_int("TERN_CUDA_AD_R1_SMAX", R1_SMAX);
        tern__cuda_ad_r1_smax = v < 1 ? 1 : v > R1_SMAX ? R1_SMAX : v;
    }
    return tern__cuda_ad_r1_w;
}

template <typename T, bool E, bool TR> static void r1_attr(void) {
#define R1_A(D, W)                                                                                                     \
    cudaFuncSetAttribute(attn_dec_r1_kernel<T, D, W, E, TR>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)
    R1_A(64, 4); R1_A(64, 8); R1_A(128, 4); R1_A(128, 8); R1_A(256, 4); R1_A(256, 8); R1_A(512, 8);
#undef R1_A
}

/* attn_decode.cuh: at open (tern__cuda_attn_decode_init) */
void tern__cuda_attn_decode_r1_init(tern__cuda *c) {
    (void)c;
    r1_attr<__nv_bfloat16, false, false>();
    r1_attr<__nv_bfloat16, true, false>();
    r1_attr<__half, false, false>();
    r1_attr<__nv_bfloat16, false, true>();
    r1_attr<__nv_bfloat16, true, true>();
    r1_attr<__half, false, true>();
    cudaGetLastError();
}

template <typename T, bool E, bool TR> static void (*r1_pick_of(int D, int W))(AdArgs) {
    if (D == 64) return W == 8 ? attn_dec_r1_kernel<T, 64, 8, E, TR> : attn_dec_r1_kernel<T, 64, 4, E, TR>;
    if (D == 128) return W == 8 ? attn_dec_r1_kernel<T, 128, 8, E, TR> : attn_dec_r1_kernel<T, 128, 4, E, TR>;
    if (D == 256) return W == 8 ? attn_dec_r1_kernel<T, 256, 8, E, TR> : attn_dec_r1_kernel<T, 256, 4, E, TR>;
    return attn_dec_r1_kernel<T, 512, 8, E, TR>;
}
template <typename T, bool E> static void (*r1_pick(int D, int W, bool tr))(AdArgs) {
    return tr ? r1_pick_of<T, E, true>(D, W) : r1_pick_of<T, E, false>(D, W);
}

/* attn_decode.cuh */
int tern__cuda_attn_decode_r1(tern__cuda *c, const AdArgs &a, int kind, long keys, bool early) {
    if ((a.D != 64 && a.D != 128 && a.D != 256 && a.D != 512) || a.G > 8 || a.hs != 1 ||
        (kind != TERN_KV_BF16 && kind != TERN_KV_F16) || ((uintptr_t)a.q & 15) || a.n <= 0)
        return 0;
    const int w = r1_env(), W = a.D == 512 ? 8 : w; /* D 512: two groups of 4 warps */
    AdArgs b = a;
    b.ahead = tern__cuda_ad_r1_ahead;
    const long chunks = (keys + 15) / 16, wp = a.D > 128 ? W / (a.D / 128) : W; /* chunk walkers a block */
    long S = (chunks + wp - 1) / wp;
    S = S < 1 ? 1 : S > tern__cuda_ad_r1_smax ? tern__cuda_ad_r1_smax : S;
    using B16 = __nv_bfloat16;
    const bool tr = tern__cuda_ad_r1_tr && a.G <= 4;
    void (*k)(AdArgs) = r1_pick<__half, false>(a.D, W, tr); /* F16 pages: not EARLY */
    if (kind == TERN_KV_BF16) k = early ? r1_pick<B16, true>(a.D, W, tr) : r1_pick<B16, false>(a.D, W, tr);
    cudaSetDevice(c->device);
    const dim3 grid((unsigned)a.nkv, (unsigned)S, (unsigned)a.n);
    if (tern_launch_cluster(c->stream, k, grid, dim3(32 * W), 0, S > 1 ? (int)S : 0, b) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    tern__cuda_check(c, "attention decode r1");
    tern__cuda_attn_decode_r1_calls++;
    return 1;
}

/*
 * attn_decode1p.cu — decode attention in one pass per warp, for launches whose (row, kv head) pairs
 * already fill the GPU (batch decode: attn_decode.cu's plan runs them unsplit). TERN_CUDA_AD_1P=1,
 * opt-in: written in session 15 after its last device call, not yet timed.
 *
 * Why: at 64 sequences × ~200 keys, attn_decode.cu's block per (row, kv head) runs three phases behind
 * barriers — scores over K, softmax, P·V over V — each a few dependent rounds of loads, so a layer's
 * attention took 60 µs for ~50 MB of BF16 pages (~13 µs at the copy rate; NOTES (x)). Here each of the
 * block's 8 warps walks its own keys once, K and V rows of a chunk loaded together and the next chunk's
 * loaded while this one is used, with an online softmax per warp: for a chunk of U·KPW keys (a key
 * group of LPK = D/8 lanes holds one row, 8 elements per lane) the scores of the G heads are reduced
 * over the group's lanes, the chunk maximum over the warp, the running sums rescaled once per chunk and
 * p·V accumulated. Warps take chunks round-robin (chunk c of the row to warp c % 8). At the end the 8
 * warps' (M, L, Σ p·v) merge in shared memory in warp order: out = Σ_w e^{M_w − M}·acc_w / Σ_w
 * e^{M_w − M}·L_w. A row's arithmetic does not depend on other rows (batch invariant); it differs from
 * attn_decode.cu's order (f32 math, within the parity bound).
 *
 * A row's keys go in tiles of A1_KEYS: the tile's block-table records to shared memory once, then its
 * chunks. Served: f32 / BF16 / F16 pages, D 32..256, G <= 4 heads per KV head, any length, sliding
 * windows, softcap, blocks not resident (block table < 0). Other shapes return 0.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/attn_decode.cuh"

#define A1_WARPS 8
#define A1_KEYS 1024 /* block-table records staged per tile of keys */
#define A1_DMAX 256

extern "C" unsigned long long tern__cuda_attn_decode_1p_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_attn_decode_1p_calls = 0;

/* GM: heads per block compiled (>= G); U: key groups per warp and chunk */
template <typename T, int GM>
__global__ void __launch_bounds__(32 * A1_WARPS, 2) attn_dec1p_kernel(AdArgs a) {
    constexpr int EPL = 8, U = sizeof(T) == 2 && GM <= 2 ? 2 : 1; /* registers: GM = 4 spilled with U = 2 */
    __shared__ int recs[A1_KEYS];
    __shared__ float red[A1_WARPS][GM][A1_DMAX];
    __shared__ float wm[A1_WARPS][GM], wl[A1_WARPS][GM], cw[A1_WARPS][GM], sl[GM];
    pdl_start();
    const int D = a.D, LPK = D / EPL, KPW = 32 / LPK, CK = KPW * U; /* keys per warp and chunk */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kg = lane / LPK, li = lane % LPK;
    const int g = blockIdx.x, r = blockIdx.y, G = a.G;
    const size_t head0 = (size_t)g * G;
    const int pos = a.pos[r];
    const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
    const int nk = pos >= 0 ? pos - lo + 1 : 0;
    float q[GM][EPL];
#pragma unroll
    for (int h = 0; h < GM; h++) {
        if (h < G) {
            const float *qp = a.q + ((size_t)r * a.nh + head0 + h) * D + li * EPL;
            const float4 v0 = __ldg((const float4 *)qp), v1 = __ldg((const float4 *)qp + 1);
            q[h][0] = v0.x; q[h][1] = v0.y; q[h][2] = v0.z; q[h][3] = v0.w;
            q[h][4] = v1.x; q[h][5] = v1.y; q[h][6] = v1.z; q[h][7] = v1.w;
        } else {
#pragma unroll
            for (int e = 0; e < EPL; e++) q[h][e] = 0.0f;
        }
    }

    const unsigned kvs = (unsigned)(a.nkv * D); /* elements a token (mul_wide: rec >= 0 where loaded) */
    const T *kp = (const T *)a.kp + (size_t)g * D + li * EPL, *vp = (const T *)a.vp + (size_t)g * D + li * EPL;
    AdRow<T, EPL> kc[U], vc[U], kn[U], vn[U];
    int rc[U], rn[U];
    int tn = 0; /* keys in the current tile of the block table */
    /* chunk c of the tile: keys [c·CK, c·CK + CK); this lane's U keys c·CK + u·KPW + kg */
    auto load = [&](int c, AdRow<T, EPL> *kd, AdRow<T, EPL> *vd, int *rd) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = c * CK + u * KPW + kg;
            rd[u] = i < tn ? recs[i] : -1;
            if (rd[u] >= 0) {
                ad_load<T, EPL>(kd[u], kp + mul_wide(rd[u], kvs));
                ad_load<T, EPL>(vd[u], vp + mul_wide(rd[u], kvs));
            }
        }
    };
    float m[GM], l[GM], acc[GM][EPL];
#pragma unroll
    for (int h = 0; h < GM; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[h][e] = 0.0f;
    }
    const int32_t *btrow = ad_btrow(a, r);
    for (int t0 = 0; t0 < nk; t0 += A1_KEYS) { /* tiles of A1_KEYS keys: their records, then their chunks */
    tn = min(A1_KEYS, nk - t0);
    __syncthreads(); /* the previous tile's records are no longer read */
    ad_records(recs, a, btrow, lo + t0, tn);
    __syncthreads();
    const int nch = (tn + CK - 1) / CK;
    int c = warp;
    if (c < nch) load(c, kc, vc, rc);
    for (; c < nch; c += A1_WARPS) { /* warp-uniform bounds (shuffles) */
        if (c + A1_WARPS < nch) load(c + A1_WARPS, kn, vn, rn);
        float s[U][GM];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int h = 0; h < GM; h++) {
                float d = 0.0f;
                if (rc[u] >= 0)
#pragma unroll
                    for (int e = 0; e < EPL; e++) d = fmaf(q[h][e], ad_get<T, EPL>(kc[u], e), d);
                for (int o = LPK >> 1; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                float v = d * a.scale;
                if (a.softcap > 0.0f) v = a.softcap * tanhf(v / a.softcap);
                s[u][h] = rc[u] >= 0 ? v : -INFINITY;
            }
#pragma unroll
        for (int h = 0; h < GM; h++) {
            float cm = s[0][h];
#pragma unroll
            for (int u = 1; u < U; u++) cm = fmaxf(cm, s[u][h]);
            for (int o = LPK; o < 32; o <<= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
            const float mn = fmaxf(m[h], cm);
            if (mn == -INFINITY) continue; /* nothing visible yet: sums stay 0 */
            const float f = m[h] == -INFINITY ? 0.0f : expf(m[h] - mn);
            m[h] = mn;
            l[h] *= f;
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[h][e] *= f;
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (rc[u] < 0) continue;
                const float p = expf(s[u][h] - mn);
                l[h] += p;
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[h][e] = fmaf(p, ad_get<T, EPL>(vc[u], e), acc[h][e]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            rc[u] = rn[u];
            kc[u] = kn[u];
            vc[u] = vn[u];
        }
    }
    }
    /* the warp's key groups share m: sum their l and acc (lanes of one group hold the same l) */
    for (int o = LPK; o < 32; o <<= 1)
#pragma unroll
        for (int h = 0; h < GM; h++) {
            l[h] += __shfl_xor_sync(0xffffffffu, l[h], o);
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], o);
        }
    if (kg == 0)
#pragma unroll
        for (int h = 0; h < GM; h++) {
#pragma unroll
            for (int e = 0; e < EPL; e++) red[warp][h][li * EPL + e] = acc[h][e];
            if (li == 0) { wm[warp][h] = m[h]; wl[warp][h] = l[h]; }
        }
    __syncthreads();
    ad_warp_merge<A1_WARPS, GM>(a, r, head0, D, wm, wl, cw, sl, [&](int w, int h, int i) { return red[w][h][i]; });
}

template <typename T> static void a1_go(tern__cuda *c, dim3 grid, int gm, const AdArgs &a) {
    if (gm == 1) tern_launch(c->stream, attn_dec1p_kernel<T, 1>, grid, 32 * A1_WARPS, 0, a);
    else if (gm == 2) tern_launch(c->stream, attn_dec1p_kernel<T, 2>, grid, 32 * A1_WARPS, 0, a);
    else tern_launch(c->stream, attn_dec1p_kernel<T, 4>, grid, 32 * A1_WARPS, 0, a);
}

/* attn_decode.cuh */
int tern__cuda_attn_decode_1p(tern__cuda *c, const AdArgs &a, int kind) {
    if (a.n <= 0 || a.n > 65535 || a.nkv <= 0 || a.nh % a.nkv || ((uintptr_t)a.q & 15)) return 0;
    if (a.G > 4 || (a.D != 32 && a.D != 64 && a.D != 128 && a.D != 256)) return 0;
    cudaSetDevice(c->device);
    const dim3 grid((unsigned)a.nkv, (unsigned)a.n);
    const int gm = a.G <= 1 ? 1 : a.G <= 2 ? 2 : 4;
    if (kind == TERN_KV_BF16) a1_go<__nv_bfloat16>(c, grid, gm, a);
    else if (kind == TERN_KV_F16) a1_go<__half>(c, grid, gm, a);
    else a1_go<float>(c, grid, gm, a);
    tern__cuda_check(c, "attention decode (one pass)");
    tern__cuda_attn_decode_1p_calls++;
    return 1;
}

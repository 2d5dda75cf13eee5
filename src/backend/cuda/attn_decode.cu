/*
 * attn_decode.cu — attention for decode rows over the f32 paged KV cache (split-K, flash-decoding).
 *
 * attention.cu's kernel serves any rows: key tiles staged in shared memory behind four barriers,
 * one global-load latency per tile, a thread per (query, key) running a d-long dot product. For a
 * decode step (one row per sequence) that costs ~30 µs per layer at a 192-key context (ncu/profile,
 * bench/NOTES.md (m)). Here a block of 4 warps owns (kv head g, key split z, row r); warp w walks the
 * split's keys w, w+4, ...; a lane holds E = d/32 consecutive elements of q for each of the group's
 * G query heads, of the K and V rows and of the G accumulators, so K and V rows are read once,
 * coalesced, straight into registers (U keys per iteration, loads first). Scores are full warp sums
 * (every lane gets the total), the online softmax keeps (m, l) per head in registers, and the four
 * warps' states are merged in shared memory at the end. Output: acc/l (one split) or the unnormalised
 * partials and (M, L) in the layout tern__cuda_attn_merge reads.
 *
 * Visibility: keys lo..pos of the row (lo = pos - window + 1 for sliding layers), skipping
 * block-table entries < 0 — attention.cu's rule without spans (span steps stay there). f32 math with
 * expf/tanhf; the summation order differs from attention.cu (within the f32 parity bound).
 * Taken for every decode call it can serve; TERN_CUDA_ATTN_DEC=0 turns it off; TERN_CUDA_AD_OCC sets
 * the split rule's target blocks per SM (default 4; 8..32 measured slower).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"

#include <math.h>
#include <stdlib.h>

struct AdArgs {
    float *out, *part;
    const float *q, *kp, *vp;
    const int32_t *pos, *slot, *bt;
    int n, nh, nkv, G, max_blocks, bs, window, splits;
    float scale, softcap;
};

template <int E> __device__ __forceinline__ void ad_load(float *dst, const float *src) {
    if constexpr (E == 2) {
        const float2 v = __ldg((const float2 *)src);
        dst[0] = v.x; dst[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < E / 4; i++) {
            const float4 v = __ldg((const float4 *)src + i);
            dst[4 * i] = v.x; dst[4 * i + 1] = v.y; dst[4 * i + 2] = v.z; dst[4 * i + 3] = v.w;
        }
    }
}

/* E elements per lane (d = 32·E), up to GM query heads per KV head, U keys per iteration */
template <int E, int GM> __global__ void __launch_bounds__(128) attn_dec_kernel(AdArgs a) {
    pdl_start();
    constexpr int D = 32 * E, UE = GM * E <= 16 ? 16 : 8, U = UE / E < 1 ? 1 : UE / E; /* U·E floats of K and of V per lane, twice */
    __shared__ float sml[4][GM][2];
    extern __shared__ float sacc[]; /* [4 warps][GM][D] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = blockIdx.x, z = blockIdx.y, r = blockIdx.z, G = a.G;
    const int pos = a.pos[r], slot = a.slot[r];
    int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0, hi = pos;
    if (a.splits > 1) {
        const int chunk = (hi - lo + a.splits) / a.splits; /* ceil(len / splits), len = hi - lo + 1 */
        lo += z * chunk;
        hi = min(hi, lo + chunk - 1);
    }
    float q[GM][E], acc[GM][E], m[GM], l[GM];
#pragma unroll
    for (int h = 0; h < GM; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) acc[h][e] = 0.0f;
        if (h < G) ad_load<E>(q[h], a.q + ((size_t)r * a.nh + (size_t)g * G + h) * D + lane * E);
        else
#pragma unroll
            for (int e = 0; e < E; e++) q[h][e] = 0.0f;
    }
    const int32_t *btrow = a.bt + (size_t)slot * a.max_blocks;
    const size_t kvstride = (size_t)a.nkv * D;
    /* software pipeline: the next U keys' rows are loaded while these U are scored */
    float kr[U][E], vr[U][E], kn[U][E], vn[U][E];
    bool ok[U], okn[U];
    auto load = [&](int k0, float (*kd)[E], float (*vd)[E], bool *okd) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + u;
            const int blk = pos >= 0 && k <= hi && k / a.bs < a.max_blocks ? btrow[k / a.bs] : -1;
            okd[u] = blk >= 0;
            if (okd[u]) {
                const size_t off = ((size_t)blk * a.bs + k % a.bs) * kvstride + (size_t)g * D + lane * E;
                ad_load<E>(kd[u], a.kp + off);
                ad_load<E>(vd[u], a.vp + off);
            }
        }
    };
    int k0 = lo + warp * U;
    load(k0, kr, vr, ok);
    for (; pos >= 0 && k0 <= hi; k0 += 4 * U) {
        load(k0 + 4 * U, kn, vn, okn);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (!ok[u]) continue;
#pragma unroll
            for (int h = 0; h < GM; h++) {
                if (h >= G) break;
                float s = 0.0f;
#pragma unroll
                for (int e = 0; e < E; e++) s = fmaf(q[h][e], kr[u][e], s);
                s = warp_sum(s) * a.scale;
                if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
                if (s > m[h]) { /* new running max: rescale what is accumulated */
                    const float c = m[h] == -INFINITY ? 0.0f : expf(m[h] - s);
                    l[h] *= c;
#pragma unroll
                    for (int e = 0; e < E; e++) acc[h][e] *= c;
                    m[h] = s;
                }
                const float p = expf(s - m[h]);
                l[h] += p;
#pragma unroll
                for (int e = 0; e < E; e++) acc[h][e] = fmaf(p, vr[u][e], acc[h][e]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            ok[u] = okn[u];
#pragma unroll
            for (int e = 0; e < E; e++) kr[u][e] = kn[u][e], vr[u][e] = vn[u][e];
        }
    }
    /* merge the four warps: (M, L) per head, acc rescaled by e^{m_w - M} */
#pragma unroll
    for (int h = 0; h < GM; h++) {
        if (h >= G) break;
        if (lane == 0) { sml[warp][h][0] = m[h]; sml[warp][h][1] = l[h]; }
#pragma unroll
        for (int e = 0; e < E; e++) sacc[((size_t)warp * GM + h) * D + lane * E + e] = acc[h][e];
    }
    __syncthreads();
    const size_t nrow = (size_t)a.n * a.nh;
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int h = idx / D, i = idx % D;
        float M = -INFINITY;
        for (int w = 0; w < 4; w++) M = fmaxf(M, sml[w][h][0]);
        float L = 0.0f, v = 0.0f;
        if (M != -INFINITY)
            for (int w = 0; w < 4; w++) {
                const float mw = sml[w][h][0];
                if (mw == -INFINITY) continue;
                const float c = expf(mw - M);
                L += sml[w][h][1] * c;
                v += sacc[((size_t)w * GM + h) * D + i] * c;
            }
        const size_t rh = (size_t)r * a.nh + (size_t)g * G + h;
        if (a.splits == 1) {
            a.out[rh * D + i] = L > 0.0f ? v / L : 0.0f;
        } else {
            a.part[(size_t)z * nrow * D + rh * D + i] = v;
            if (i == 0) {
                float *ml = a.part + (size_t)a.splits * nrow * D + ((size_t)z * nrow + rh) * 2;
                ml[0] = M;
                ml[1] = L;
            }
        }
    }
}

template <int E, int GM> static void ad_go(tern__cuda *c, dim3 grid, const AdArgs &a) {
    /* the four warps' accumulators: GM·E <= 32 floats per lane, so at most 16 KB */
    tern_launch(c->stream, attn_dec_kernel<E, GM>, grid, 128, (size_t)4 * GM * 32 * E * sizeof(float), a);
}

static int ad_on = -1;
extern "C" unsigned long long tern__cuda_attn_decode_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_attn_decode_calls = 0;

/* Decode attention for rows without spans over f32 pages: 1 when it ran, 0 when the shape is not
 * served here (d not 64/128/256/512, more query heads per KV head than the lane registers hold). */
extern "C" int tern__cuda_attn_decode(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                                      const tern_kv_layer *kv, float scale, float softcap) {
    if (ad_on < 0) {
        const char *v = getenv("TERN_CUDA_ATTN_DEC");
        ad_on = v && v[0] ? atoi(v) : 1;
    }
    const int n = rows->n, d = kv->head_dim, nkv = kv->n_head_kv;
    if (!ad_on || n <= 0 || (rows->vis_lo && rows->vis_hi) || nkv <= 0 || nh % nkv) return 0;
    const int G = nh / nkv, E = d / 32;
    if (d % 32 || (E != 2 && E != 4 && E != 8 && E != 16) || G > 32 / E) return 0;
    AdArgs a = {};
    a.out = out;
    a.part = c->part;
    a.q = q;
    a.kp = (const float *)kv->k;
    a.vp = (const float *)kv->v;
    a.pos = rows->pos;
    a.slot = rows->slot;
    a.bt = kv->block_table;
    a.n = n;
    a.nh = nh;
    a.nkv = nkv;
    a.G = G;
    a.max_blocks = kv->max_blocks;
    a.bs = kv->block_size;
    a.window = kv->window;
    a.scale = scale;
    a.softcap = softcap;
    /* splits: from the longest key range of the call (the whole context while a graph is recorded;
     * splits past a row's keys exit at once) */
    long keys = tern__cuda_attn_max_keys(c, rows, kv);
    if (kv->window > 0 && keys > kv->window) keys = kv->window;
    /* H200 (bench/NOTES.md (m), (n)): batches of >= 8 rows at any context (x64: 1.10-1.14x attention.cu),
     * short contexts (1.4x), and since the parallel split merge one row over 8k keys too (d 128 57 vs
     * 60 us, d 256 58 vs 101 us) */
    static int occ = -1; /* TERN_CUDA_AD_OCC: target blocks per SM (default 4), for split sweeps */
    if (occ < 0) {
        const char *v = getenv("TERN_CUDA_AD_OCC");
        occ = v && atoi(v) > 0 ? atoi(v) : 4;
    }
    /* about four resident blocks per SM (each warp walks its keys with U rows in flight and one
     * more group prefetched: more blocks, not longer walks, hide the latency), >= 32 keys per split,
     * at most 128 */
    a.splits = tern__cuda_split_count(c, (long)n * nkv, occ, occ, keys, 32, 128, n, nh, d);
    cudaSetDevice(c->device);
    const dim3 grid((unsigned)nkv, (unsigned)a.splits, (unsigned)n);
    /* GM = G rounded up to a power of two: the lane arrays hold what the group needs */
    const int GM = G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : G <= 8 ? 8 : 16;
    switch (E * 100 + GM) {
    case 201: ad_go<2, 1>(c, grid, a); break;
    case 202: ad_go<2, 2>(c, grid, a); break;
    case 204: ad_go<2, 4>(c, grid, a); break;
    case 208: ad_go<2, 8>(c, grid, a); break;
    case 216: ad_go<2, 16>(c, grid, a); break;
    case 401: ad_go<4, 1>(c, grid, a); break;
    case 402: ad_go<4, 2>(c, grid, a); break;
    case 404: ad_go<4, 4>(c, grid, a); break;
    case 408: ad_go<4, 8>(c, grid, a); break;
    case 801: ad_go<8, 1>(c, grid, a); break;
    case 802: ad_go<8, 2>(c, grid, a); break;
    case 804: ad_go<8, 4>(c, grid, a); break;
    case 1601: ad_go<16, 1>(c, grid, a); break;
    default: ad_go<16, 2>(c, grid, a); break;
    }
    tern__cuda_check(c, "attention decode");
    tern__cuda_attn_decode_calls++;
    if (a.splits > 1) tern__cuda_attn_merge(c, out, n * nh, d, a.splits, "attention decode merge");
    return 1;
}

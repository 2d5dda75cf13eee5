/*
 * attn_tile.cuh — what the two exact paged-attention kernels share: attention.cu's attn_kernel (f32 pages) and
 * kvq_attn.cu's kvq_attn_kernel (compressed pages). Both give a block R rows of one KV slot times HB query heads
 * (QV = R·HB query vectors), walk the visible keys in tiles of T positions with an online softmax in exact f32 and,
 * split over the keys (decode), write partials that attention.cu's merge sums. Only the tile's load differs (f32
 * float4 copies against a decode of each record) and kvq's query / output rotation (TurboQuant).
 *
 * The pieces, in the order a kernel calls them: at_rows (each query vector's position, window start and span),
 * at_range (the block's key range, its split's piece of it), at_tile (scores, softmax step, P·V of one loaded
 * tile; its softmax step at_softmax, which glm_attn.cu shares too), at_store (outputs or split partials). Args is
 * either kernel's argument struct (the fields named here
 * are common to both). Every function is forceinline: the kernels' code is what it was before they moved here.
 */
#ifndef TERN_CUDA_ATTN_TILE_CUH
#define TERN_CUDA_ATTN_TILE_CUH

#include "backend/cuda/cuda_common.cuh"

#include <math.h>

/* the per-query-vector state in shared memory: M, L, AL (running max, sum, this tile's rescale) QV floats each
 * from m; position (-1: no query), window start and span [vlo, vhi] QV ints each from p */
struct AtQ {
    float *m;
    int *p, QV;
    __device__ __forceinline__ float *M() const { return m; }
    __device__ __forceinline__ float *L() const { return m + QV; }
    __device__ __forceinline__ float *AL() const { return m + 2 * QV; }
    __device__ __forceinline__ int *qpos() const { return p; }
    __device__ __forceinline__ int *qlo() const { return p + QV; }
    __device__ __forceinline__ int *qvlo() const { return p + 2 * QV; }
    __device__ __forceinline__ int *qvhi() const { return p + 3 * QV; }
};

/* each query vector's position, window start and bidirectional span; M = -inf, L = 0 */
template <class Args>
__device__ __forceinline__ void at_rows(const Args &a, const AtQ &q, int QV, int row0, int h0, int tid, int nt) {
    for (int qv = tid; qv < QV; qv += nt) {
        const int ri = qv / a.HB, hi = qv % a.HB, r = row0 + ri;
        const bool ok = r < a.n && h0 + hi < a.G;
        const int p = ok ? a.pos[r] : -1;
        q.qpos()[qv] = p;
        q.qlo()[qv] = a.window > 0 ? max(0, p - a.window + 1) : 0;
        q.qvlo()[qv] = ok && a.vlo ? max(0, a.vlo[r]) : 0;
        q.qvhi()[qv] = ok && a.vlo ? a.vhi[r] : -1;
        q.M()[qv] = -INFINITY;
        q.L()[qv] = 0.0f;
    }
}

/* thread 0: the keys any query of the block sees, cut to split blockIdx.z's piece (whole tiles); after a barrier */
template <class Args>
__device__ __forceinline__ void at_range(const Args &a, const AtQ &q, int QV, int T, int *range) {
    int lo = 0x7fffffff, hi = -1;
    for (int qv = 0; qv < QV; qv++)
        if (q.qpos()[qv] >= 0) {
            lo = min(lo, q.qlo()[qv]);
            hi = max(hi, q.qpos()[qv]);
            if (q.qvlo()[qv] <= q.qvhi()[qv]) {
                lo = min(lo, q.qvlo()[qv]);
                hi = max(hi, q.qvhi()[qv]);
            }
        }
    if (hi >= 0 && a.splits > 1) {
        const int len = hi - lo + 1;
        int chunk = (len + a.splits - 1) / a.splits;
        chunk = (chunk + T - 1) / T * T;
        const int s0 = lo + blockIdx.z * chunk;
        lo = s0;
        hi = min(hi, s0 + chunk - 1);
    }
    range[0] = lo;
    range[1] = hi;
}

/* the online softmax step of one tile for QV query vectors (a warp each): S [QV][T] scores -> probabilities
 * e^{s - M'}, M' = max(M, the tile's), AL = e^{M - M'}, L = L·AL + Σ (also glm_attn.cu's latent kernel) */
__device__ __forceinline__ void at_softmax(float *S, float *M, float *L, float *AL, int QV, int T, int tid, int nt) {
    for (int qv = tid >> 5; qv < QV; qv += nt >> 5) {
        const int lane = tid & 31;
        float m = -INFINITY;
        for (int t = lane; t < T; t += 32) m = fmaxf(m, S[qv * T + t]);
        m = warp_max(m);
        const float mold = M[qv], mnew = fmaxf(mold, m);
        float sum = 0.0f;
        for (int t = lane; t < T; t += 32) {
            const float s = S[qv * T + t];
            const float pr = s == -INFINITY ? 0.0f : expf(s - mnew);
            S[qv * T + t] = pr;
            sum += pr;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            const float al = mnew == -INFINITY ? 1.0f : expf(mold - mnew);
            AL[qv] = al;
            L[qv] = L[qv] * al + sum;
            M[qv] = mnew;
        }
    }
}

/* one loaded tile (keys kb .. kb + T - 1, K rows dk + 1 floats apart, V rows dv): scores (scaled, softcapped,
 * -inf where not visible), the online softmax step, acc = acc·AL + P·V. Starts and ends at a barrier */
template <class Args>
__device__ __forceinline__ void at_tile(const Args &a, const AtQ &q, int QV, int T, int dk, int dv, int kb, int hi,
                                        const int32_t *btrow, const float *qs, const float *Ks, const float *Vs,
                                        float *S, float *acc, int tid, int nt) {
    for (int idx = tid; idx < QV * T; idx += nt) {
        const int qv = idx / T, t = idx % T, kpos = kb + t, p = q.qpos()[qv];
        bool vis = p >= 0 && kpos <= hi && kpos / a.bs < a.max_blocks &&
                   ((kpos <= p && kpos >= q.qlo()[qv]) || (kpos >= q.qvlo()[qv] && kpos <= q.qvhi()[qv]));
        float s = -INFINITY;
        if (vis && btrow[kpos / a.bs] >= 0) {
            const float *qr = qs + qv * dk, *kr = Ks + t * (dk + 1);
            float dot = 0.0f;
            for (int i = 0; i < dk; i++) dot = fmaf(qr[i], kr[i], dot);
            s = dot * a.scale;
            if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
        }
        S[idx] = s;
    }
    __syncthreads();
    at_softmax(S, q.M(), q.L(), q.AL(), QV, T, tid, nt);
    __syncthreads();
    for (int idx = tid; idx < QV * dv; idx += nt) {
        const int qv = idx / dv, i = idx % dv;
        const float *pr = S + qv * T;
        float v = acc[idx] * q.AL()[qv];
        for (int t = 0; t < T; t++) v = fmaf(pr[t], Vs[t * dv + i], v);
        acc[idx] = v;
    }
}

/* output i of query vector qv (val: its accumulator, finished by the caller): val / L when the block holds every key,
 * else this split's partial and (i = 0) its (M, L) after the [splits][n][nh][d] partials */
template <class Args>
__device__ __forceinline__ void at_store(const Args &a, const AtQ &q, int qv, int i, int r, int head, float val) {
    const int d = a.d;
    const size_t o = ((size_t)r * a.nh + head) * d + i;
    if (a.splits == 1) {
        a.out[o] = q.L()[qv] > 0.0f ? val / q.L()[qv] : 0.0f;
    } else {
        const size_t nrow = (size_t)a.n * a.nh;
        a.part[(size_t)blockIdx.z * nrow * d + o] = val;
        if (i == 0) {
            float *ml = a.part + (size_t)a.splits * nrow * d + ((size_t)blockIdx.z * nrow + (size_t)r * a.nh + head) * 2;
            ml[0] = q.M()[qv];
            ml[1] = q.L()[qv];
        }
    }
}

#endif

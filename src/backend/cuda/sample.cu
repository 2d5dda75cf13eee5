/*
 * sample.cu — on-device sampling (ops.h vt->sample): one block per row, the chain of
 * src/sample/sample_ref.h reproduced token for token, so only one int32 per row goes back.
 *
 * Exactness: the arithmetic is sample_math.h's (no libm, no fused multiply-add, integer
 * weights), so every value that decides the token is bitwise the CPU's; the parallel parts
 * are order-free: integer sums, argmax/argmin with an explicit (logit desc, id asc) order.
 *
 * Per row: bias (one thread, list order, as the CPU), penalties (distinct ids, one thread
 * each), then one pass for max / argmax / NaN / +inf / finite count (greedy stops here).
 * top-k and top-p cut the order O at one (logit, id) position; that position is found by a
 * 4-pass radix select on an order-preserving 32-bit key of the logit (8-bit digits, counts
 * for top-k, temperature-1 weights for top-p), then the rank among the tied logits is
 * resolved in id order by a block-wide scan. The draw is a block sum of the survivors'
 * weights, then the id holding `target`: each thread sums a contiguous range of ids, one
 * block-wide exclusive scan of those sums, and the thread whose range holds it walks that range.
 * No scratch memory: every pass rereads the row (L2-resident for decode batches), the strided
 * passes with 8 float4 loads in flight per thread (row_each: one load at a time made a greedy
 * 128k-vocabulary row 105 us).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "sample/sample_math.h"

#define ST 512                   /* threads per row */
#define SNW (ST / 32)
#define NONE 0x7fffffff
typedef unsigned long long u64;

struct Cut {                     /* survivors: !on, or (l, id) no later than (cl, cid) in O */
    int on;
    float cl;
    int cid;
};
__device__ __forceinline__ bool in_cut(const Cut &c, float l, int id) {
    return !c.on || l > c.cl || (l == c.cl && id <= c.cid);
}

/* order-preserving key of a finite float (-0 counts as +0, as the float compare does) */
__device__ __forceinline__ uint32_t okey(float l) {
    uint32_t b = __float_as_uint(l == 0.0f ? 0.0f : l);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float unkey(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
__device__ __forceinline__ bool finite_l(float l) { return !isnan(l) && l != INFINITY && l != -INFINITY; }

/* f(i, l) for the ids this thread owns in the strided walk (i = threadIdx.x + j·ST, j = 0, 1, ..; in
 * increasing i) with SU float4 loads in flight per thread: one row is 0.5 MB for a 128k vocabulary,
 * and a walk with one dependent load at a time ran 105 us on one SM (session 10). Every lane calls f
 * the same number of times (warp_hist_add needs whole warps): positions past V come as (V, -inf),
 * which every pass skips. The scalar walk serves rows that are not 16-byte aligned. */
#define SU 8
template <class F> __device__ __forceinline__ void row_each(const float *L, int V, F f) {
    int tail = 0;
    if (((uintptr_t)L & 15) == 0) {
        const float4 *L4 = (const float4 *)L;
        const int V4 = V >> 2;
        for (int b = 0; b < V4; b += ST * SU) {
            float4 v[SU];
#pragma unroll
            for (int u = 0; u < SU; u++) {
                const int j = b + u * ST + (int)threadIdx.x;
                v[u] = j < V4 ? L4[j] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
            }
#pragma unroll
            for (int u = 0; u < SU; u++) {
                const int j = b + u * ST + (int)threadIdx.x, i = j < V4 ? 4 * j : V;
                f(i, v[u].x); f(i < V ? i + 1 : V, v[u].y); f(i < V ? i + 2 : V, v[u].z); f(i < V ? i + 3 : V, v[u].w);
            }
        }
        tail = V4 << 2;
    }
    for (int b = tail; b < V; b += ST) {
        const int i = b + (int)threadIdx.x;
        f(i < V ? i : V, i < V ? L[i] : -INFINITY);
    }
}

struct Smem {
    u64 hw[256];                 /* radix histogram: counts or weights */
    u64 ws[SNW];                 /* per-warp partials */
    float bv[SNW];
    int bi[SNW], ni[SNW], ii[SNW], nf[SNW];
    uint32_t prefix;
    u64 need;
    int found;
};

__device__ u64 block_sum(u64 v, Smem &s) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) s.ws[w] = v;
    __syncthreads();
    u64 t = 0;
    for (int i = 0; i < SNW; i++) t += s.ws[i];
    __syncthreads();
    return t;
}

/* exclusive prefix sum of v over the block in thread order; *total = the block's sum */
__device__ u64 block_excl_scan(u64 v, Smem &s, u64 *total) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    u64 x = v;
    for (int o = 1; o < 32; o <<= 1) {
        u64 t = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += t;
    }
    if (lane == 31) s.ws[w] = x;
    __syncthreads();
    u64 before = 0, tot = 0;
    for (int i = 0; i < SNW; i++) {
        if (i < w) before += s.ws[i];
        tot += s.ws[i];
    }
    __syncthreads();
    *total = tot;
    return before + x - v;
}

/* hist[d] += w for every lane with d >= 0, one shared atomic per distinct digit of the warp
 * (logits of a row share their top key bits: plain atomics would serialize on one address).
 * Every lane of the warp must call it. */
__device__ void warp_hist_add(u64 *hist, int d, u64 w) {
    const int lane = threadIdx.x & 31;
    unsigned todo = __ballot_sync(0xffffffffu, d >= 0);
    while (todo) {
        const int src = __ffs(todo) - 1;
        const int dd = __shfl_sync(0xffffffffu, d, src);
        const unsigned grp = __ballot_sync(0xffffffffu, d == dd);
        u64 v = d == dd ? w : 0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == src) atomicAdd(&hist[dd], v);
        todo &= ~grp;
    }
}

/* Radix select over the row's finite logits l with in_cut(prev, l, id) (and, for weights,
 * x1 >= XMIN). by_w = 0: the key of the need-th largest element (counts); returns the rank
 * left among the ties at that key in *rest. by_w = 1: the key where the running sum of
 * temperature-1 weights first reaches need; *rest = the weight strictly above that key. */
__device__ uint32_t radix_select(const float *L, int V, float mx, const Cut &prev, int by_w, u64 need, u64 *rest,
                                 Smem &s) {
    uint32_t prefix = 0, pmask = 0;
    u64 above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = threadIdx.x; d < 256; d += ST) s.hw[d] = 0;
        __syncthreads();
        row_each(L, V, [&](int i, float l) { /* uniform trip count: whole warps in warp_hist_add */
            int d = -1;
            u64 w = 0;
            if (finite_l(l) && in_cut(prev, l, i)) {
                const uint32_t k = okey(l);
                if ((k & pmask) == prefix) {
                    w = by_w ? tern_sample_weight(tern_sample_x(l, mx)) : 1;
                    d = w ? (int)((k >> shift) & 255u) : -1;
                }
            }
            warp_hist_add(s.hw, d, w);
        });
        __syncthreads();
        if (threadIdx.x == 0) {
            int pick = 0;
            for (int d = 255; d >= 0; d--) {
                if (by_w ? above + s.hw[d] >= need : s.hw[d] >= need) { pick = d; break; }
                if (by_w) above += s.hw[d];
                else need -= s.hw[d];
            }
            s.prefix = prefix | ((uint32_t)pick << shift);
            s.need = by_w ? above : need;
        }
        __syncthreads();
        prefix = s.prefix;
        if (by_w) above = s.need;
        else need = s.need;
        pmask |= 255u << shift;
        __syncthreads();
    }
    *rest = by_w ? above : need;
    return prefix;
}

/* The first id i (in id order) where the running sum of w(i, l) passes target: Σ_{j<i} w <= target <
 * Σ_{j<=i} w, with w(i, l) > 0; -1 if none. Thread t owns the ids [t·C, (t+1)·C) (C = ceil(V / ST)):
 * its sum, one block-wide exclusive scan in thread (= id) order, then the one thread whose range
 * holds target walks it. Integer weights: order-free sums, the id the tile-by-tile scan found. */
template <class W> __device__ int scan_find(const float *L, int V, u64 target, W w, Smem &s) {
    const int C = (V + ST - 1) / ST, lo = min(V, (int)threadIdx.x * C), hi = min(V, lo + C);
    u64 mine = 0;
#pragma unroll 8
    for (int i = lo; i < hi; i++) mine += w(i, L[i]);
    u64 tot;
    const u64 before = block_excl_scan(mine, s, &tot);
    if (threadIdx.x == 0) s.found = -1;
    __syncthreads();
    if (mine && before <= target && target < before + mine) {
        u64 c = before;
        for (int i = lo; i < hi; i++) {
            const u64 wi = w(i, L[i]);
            if (wi && target < c + wi) { s.found = i; break; }
            c += wi;
        }
    }
    __syncthreads();
    const int f = s.found;
    __syncthreads();
    return f;
}

/* id of the m-th (1-based) element in id order with l == key and in_cut(prev); -1 if none */
__device__ int nth_tied(const float *L, int V, float key, const Cut &prev, u64 m, Smem &s) {
    if (m == 0) return -1;
    return scan_find(L, V, m - 1, [&](int i, float l) -> u64 { return l == key && in_cut(prev, l, i) ? 1 : 0; }, s);
}

__global__ void __launch_bounds__(ST) sample_kernel(int32_t *ids, float *logits, int V, const tern_sample_row *rows,
                                                    const tern_sample_pair *pairs) {
    pdl_start();
    __shared__ Smem s;
    const tern_sample_row p = rows[blockIdx.x];
    if (p.mode != TERN_SAMPLE_DRAW) return;
    float *L = logits + (size_t)blockIdx.x * V;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;

    /* 1-2. bias in list order, then penalties over the distinct history ids */
    if (threadIdx.x == 0)
        for (int i = 0; i < p.n_bias; i++) {
            const tern_sample_pair e = pairs[p.bias_off + i];
            if (e.id >= 0 && e.id < V) L[e.id] = __fadd_rn(L[e.id], e.v);
        }
    __syncthreads();
    for (int i = threadIdx.x; i < p.n_hist; i += ST) {
        const tern_sample_pair e = pairs[p.hist_off + i];
        if (e.id >= 0 && e.id < V) L[e.id] = tern_sample_penalize(L[e.id], p.rep, p.presence, p.frequency, e.v);
    }
    __syncthreads();

    /* max / argmax (lowest id on ties), first NaN, first +inf, finite count */
    float bv = -INFINITY;
    int bi = NONE, ni = NONE, ii = NONE, nf = 0;
    row_each(L, V, [&](int i, float l) { /* increasing i per thread: the first of equal logits stays */
        if (isnan(l)) { if (ni == NONE) ni = i; }
        else if (l == INFINITY) { if (ii == NONE) ii = i; }
        else if (l != -INFINITY) {
            nf++;
            if (bi == NONE || l > bv) { bv = l; bi = i; }
        }
    });
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (tern_sample_before(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        ni = min(ni, __shfl_xor_sync(0xffffffffu, ni, o));
        ii = min(ii, __shfl_xor_sync(0xffffffffu, ii, o));
        nf += __shfl_xor_sync(0xffffffffu, nf, o);
    }
    if (lane == 0) { s.bv[w] = bv; s.bi[w] = bi; s.ni[w] = ni; s.ii[w] = ii; s.nf[w] = nf; }
    __syncthreads();
    bv = s.bv[0]; bi = s.bi[0]; ni = s.ni[0]; ii = s.ii[0]; nf = s.nf[0];
    for (int k = 1; k < SNW; k++) {
        if (tern_sample_before(s.bv[k], s.bi[k], bv, bi)) { bv = s.bv[k]; bi = s.bi[k]; }
        ni = min(ni, s.ni[k]);
        ii = min(ii, s.ii[k]);
        nf += s.nf[k];
    }
    __syncthreads();
    if (ni != NONE || ii != NONE) {
        if (threadIdx.x == 0) ids[blockIdx.x] = ni < ii ? TERN_SAMPLE_ERR_NAN : TERN_SAMPLE_ERR_INF;
        return;
    }
    if (nf == 0) {
        if (threadIdx.x == 0) ids[blockIdx.x] = TERN_SAMPLE_ERR_MASKED;
        return;
    }
    if (p.temperature == 0.0f) {
        if (threadIdx.x == 0) ids[blockIdx.x] = bi;
        return;
    }
    const float mx = bv;

    /* top-k: the k-th element of O */
    Cut cut = {0, 0.0f, 0};
    if (p.top_k > 0 && p.top_k < nf) {
        u64 rank;
        const float key = unkey(radix_select(L, V, mx, cut, 0, (u64)p.top_k, &rank, s));
        const int id = nth_tied(L, V, key, cut, rank, s);
        cut.on = 1; cut.cl = key; cut.cid = id;
    }
    /* top-p: the shortest prefix of O whose temperature-1 weight reaches thr */
    if (p.top_p < 1.0f) {
        u64 t1 = 0;
        row_each(L, V, [&](int i, float l) {
            if (finite_l(l) && in_cut(cut, l, i)) t1 += tern_sample_weight(tern_sample_x(l, mx));
        });
        const u64 thr = tern_sample_top_p_thr(p.top_p, block_sum(t1, s));
        Cut c2 = {1, mx, bi};   /* thr == 0: the first element of O */
        if (thr > 0) {
            u64 above;
            const float key = unkey(radix_select(L, V, mx, cut, 1, thr, &above, s));
            const u64 wc = tern_sample_weight(tern_sample_x(key, mx));
            const u64 m = wc ? (thr - above + wc - 1) / wc : 1;
            c2.cl = key;
            c2.cid = nth_tied(L, V, key, cut, m, s);
        }
        cut = c2;
    }
    /* draw: survivors (cut, min-p) in id order, integer inverse CDF */
    const float lmin = __fadd_rn(mx, p.min_p_log);
    auto wdraw = [&](int i, float l) -> u64 {
        return finite_l(l) && in_cut(cut, l, i) && l >= lmin ? tern_sample_weight(__dmul_rn(tern_sample_x(l, mx), p.inv_t))
                                                             : 0;
    };
    u64 tw = 0;
    row_each(L, V, [&](int i, float l) { tw += wdraw(i, l); });
    const u64 total = block_sum(tw, s);
    const u64 target = tern_sample_target(tern_sample_u53(p.seed, p.step), total);
    const int found = scan_find(L, V, target, wdraw, s);
    if (threadIdx.x == 0) ids[blockIdx.x] = found >= 0 ? found : bi; /* bi: unreachable fallback, as the CPU's */
}

extern "C" void tern__cuda_sample(tern__cuda *c, int32_t *ids, float *logits, int n, int V,
                                  const tern_sample_row *rows, const tern_sample_pair *pairs) {
    if (n <= 0 || V <= 0) return;
    cudaSetDevice(c->device);
    tern_launch(c->stream, sample_kernel, n, ST, 0, ids, logits, V, rows, pairs);
    tern__cuda_check(c, "sample");
}

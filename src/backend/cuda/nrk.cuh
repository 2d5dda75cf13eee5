/*
 * nrk.cuh — Gemma 4's head norms + rope + cache stores for one (row, head) (ops.h norm_rope_kv_write): the arguments,
 * the head's place in q / k and the pages, one rope pair, and the whole head by one warp (nrk_warp_head), for
 * fused.cu's launch (a block or a warp per head). Kept apart so another kernel can run the same warp work in its
 * epilogue (session 65's q|k|v GEMV epilogue did, and lost 6-7 %: NOTES (bz)). Include after cuda_internal.h,
 * cuda_common.cuh and kvq_common.cuh.
 */
#ifndef TERN_NRK_CUH
#define TERN_NRK_CUH

/* Gemma 4's head norms + rope + cache stores: blocks [n][nh + nkv]; q head blocks norm + rope q, kv head
 * blocks norm + rope k, norm v, and store both. Shared: d floats. */
struct NrkArgs {
    float *q, *k, *v;
    const float *qw, *kw, *inv_freq;
    const int32_t *pos, *slot, *bt;
    int n, nh, nkv, d, max_blocks, bs;
    float eps, mscale;
};

/* the arguments of norm_rope_kv_write's launch: k NULL means q heads only */
static inline NrkArgs nrk_args(const tern_kv_layer *kv, const tern_rows *rows, float *q, float *k, float *v, int nh,
                               const float *inv_freq, float mscale, const float *qw, const float *kw, float eps) {
    NrkArgs a = {};
    a.q = q; a.k = k; a.v = v; a.qw = qw; a.kw = kw; a.inv_freq = inv_freq;
    a.pos = rows->pos; a.slot = rows->slot; a.bt = kv->block_table;
    a.n = rows->n; a.nh = nh; a.nkv = k ? kv->n_head_kv : 0; a.d = kv->head_dim;
    a.max_blocks = kv->max_blocks; a.bs = kv->block_size;
    a.eps = eps; a.mscale = mscale;
    return a;
}

/* row r, head h (q heads first, then kv heads) of width d: its row in q or k, its norm weight, its position,
 * and (kv heads whose block is resident) where its page entries start */
struct NrkHead {
    float *x;
    const float *w;
    int p;
    bool isk, store;
    size_t dst;
};
__device__ __forceinline__ NrkHead nrk_head(const NrkArgs &a, int r, int h, int d) {
    NrkHead o;
    o.isk = h >= a.nh;
    o.x = o.isk ? a.k + ((size_t)r * a.nkv + (h - a.nh)) * d : a.q + ((size_t)r * a.nh + h) * d;
    o.w = o.isk ? a.kw : a.qw;
    o.p = a.pos[r];
    o.dst = 0;
    o.store = false;
    if (o.isk && o.p >= 0 && o.p / a.bs < a.max_blocks) {
        const int blk = a.bt[(size_t)a.slot[r] * a.max_blocks + o.p / a.bs];
        o.store = blk >= 0;
        o.dst = ((size_t)blk * a.bs + o.p % a.bs) * a.nkv * d + (size_t)(h - a.nh) * d;
    }
    return o;
}

/* the normed pair (i, i + half) at frequency f = inv_freq[i]: rope_kv_kernel's arithmetic, stored to the row and (k
 * heads) the page by kput(element, value) */
template <class KP>
__device__ __forceinline__ void nrk_pair(const NrkArgs &a, const NrkHead &hd, KP kput, int i, int half, float x0, float x1,
                                         float f) {
    rope_pair(x0, x1, hd.p, f);
    x0 *= a.mscale;
    x1 *= a.mscale;
    hd.x[i] = x0;
    hd.x[i + half] = x1;
    if (hd.store) {
        kput(hd.dst + i, x0);
        kput(hd.dst + i + half, x1);
    }
}

/* One warp per (row, head), for head dims 256 and 512 (NS = d / 32 slots a lane): the block form (fused.cu
 * norm_rope_kv_kernel) spends a block, three barriers and a shared-memory round trip on 1-2 KB (H200, session 22,
 * gemma4-26b-a4b 2048-row prefill chunk: 165 us a sliding layer, ~0.6 TB/s). Lane l holds the elements
 * j = 32s + l, so a rope pair (i, i + d/2) sits in one lane (slots s and s + NS/2), and the sum of squares
 * replays block_rms_inv's order: virtual thread v = 32w + l of tern_rms_threads(d) sums its elements
 * v, v + vt, ... (slots w, w + vt/32, ...) by fmaf, each virtual warp's partial is a warp_sum (the xor
 * butterfly leaves lane 0's bits in every lane), and the vt/32 partials go through one more warp_sum with
 * lane t holding partial t, as rms_inv_finish does. Bitwise the block form. */
template <int NS> __device__ __forceinline__ float warp_rms_inv(const float (&x)[NS], int d, float eps) {
    constexpr int VW = (NS * 32 >= 1024 ? 512 : NS * 32 >= 256 ? 256 : 128) / 32; /* tern_rms_threads(d) / 32 */
    const int lane = threadIdx.x & 31;
    float part = 0.0f;
#pragma unroll
    for (int w = 0; w < VW; w++) {
        float ss = 0.0f;
#pragma unroll
        for (int s = w; s < NS; s += VW) ss = fmaf(x[s], x[s], ss);
        ss = warp_sum(ss);
        if (lane == w) part = ss;
    }
    part = warp_sum(part);
    return 1.0f / sqrtf(part / (float)d + eps);
}

/* Head h of row r by the calling warp (d = 32·NS): q / k = rope(rmsnorm(x)·w)·mscale in place (k also to its page),
 * and for a kv head v = rmsnorm(v) in place and to its page. ld(p): how the head's q / k / v elements are read (a plain
 * load, or one past L1 where other blocks of the same launch wrote them); kput / vput(element, value): the page
 * stores. HOIST (TERN_CUDA_NRK_HOIST): every load of the head (norm weight, rope frequencies, v) issued with x, before
 * the sum of squares. */
template <int NS, bool HOIST, class LD, class KP, class VP>
__device__ __forceinline__ void nrk_warp_head(const NrkArgs &a, int r, int h, LD ld, KP kput, VP vput) {
    constexpr int d = NS * 32, half = d / 2, HS = NS / 2;
    const int lane = threadIdx.x & 31;
    const NrkHead hd = nrk_head(a, r, h, d);
    const float *w = hd.w;
    auto vrow = [&]() { return a.v + ((size_t)r * a.nkv + (h - a.nh)) * d; };
    float xv[NS], wv[NS], fv[HS], vv[NS];
#pragma unroll
    for (int s = 0; s < NS; s++) xv[s] = ld(hd.x + 32 * s + lane);
    if constexpr (HOIST) { /* every load of the head issued now, before any store (TERN_CUDA_NRK_HOIST) */
#pragma unroll
        for (int s = 0; s < NS; s++) wv[s] = w ? w[32 * s + lane] : 0.0f;
#pragma unroll
        for (int s = 0; s < HS; s++) fv[s] = a.inv_freq[32 * s + lane];
        if (hd.isk)
#pragma unroll
            for (int s = 0; s < NS; s++) vv[s] = ld(vrow() + 32 * s + lane);
    }
    float inv = warp_rms_inv<NS>(xv, d, a.eps);
#pragma unroll
    for (int s = 0; s < NS; s++) xv[s] = rms_scale(xv[s], inv, w != nullptr, HOIST ? wv[s] : w ? w[32 * s + lane] : 0.0f);
#pragma unroll
    for (int s = 0; s < HS; s++)
        nrk_pair(a, hd, kput, 32 * s + lane, half, xv[s], xv[s + HS], HOIST ? fv[s] : a.inv_freq[32 * s + lane]);
    if (!hd.isk) return;
    float *vr = vrow();
    if constexpr (!HOIST)
#pragma unroll
        for (int s = 0; s < NS; s++) vv[s] = ld(vr + 32 * s + lane);
    inv = warp_rms_inv<NS>(vv, d, a.eps);
#pragma unroll
    for (int s = 0; s < NS; s++) {
        const float v = rms_scale(vv[s], inv, false, 0.0f);
        vr[32 * s + lane] = v;
        if (hd.store) vput(hd.dst + 32 * s + lane, v);
    }
}

#endif

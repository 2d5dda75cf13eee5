/*
 * fused.cu — decode-step fusions that cut kernel launches (ops.h: rope_kv_write).
 *
 * rope_kv_write = rope(q) + rope(k) + kv_write(k, v) in one launch: one thread per rotated
 * pair (i, i + d/2) of every q head and k head of every row; k threads also store the roped
 * pair and the matching v pair into the paged cache: F32 pages (plain copies), or BF16 / F16 pages
 * (kvq_common.cuh's roundings, those of kvq_write.cu). The arithmetic is rope_kernel's (sincosf,
 * x0·co − x1·s, then · mscale), so results are bitwise those of the three separate ops. Other
 * compressed kinds and latent pages return 0 (the caller runs the separate ops).
 *
 * norm_rope_kv_write (Gemma 4) = the per-head rmsnorms of q (weight), k (weight) and v (none) first:
 * a block per (row, q head) or (row, kv head), the head staged in shared memory, block_rms_inv (the
 * reduction of norm.cu's rmsnorm over d), then the same rope pairs and cache stores; v is normalised
 * in place as rmsnorm would leave it. Bitwise rmsnorm ×3 + rope_kv_write. Head dims 256 and 512 take a
 * warp per (row, head) instead (norm_rope_kv_warp, the same bits).
 *
 * The GEMV fusions (q|k|v in one launch, gate/up with the activation product in the epilogue,
 * residual add in the epilogue) live beside their kernel in gemv.cu.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kvq_common.cuh"

/* f(T{}) for the page element type of an F32 / BF16 / F16 kind (one dispatch for both launchers) */
template <class F> static void by_page_kind(int kind, F &&f) {
    if (kind == TERN_KV_F32) f(float{});
    else if (kind == TERN_KV_BF16) f(__nv_bfloat16{});
    else f(__half{});
}

/* SRC 0: q and k roped in place, v read from v (rope_kv_write). SRC 1: q|k|v read from the rows of one GEMM's
 * output (src [n][ld]: nh q heads, nkv k heads, nkv v heads of d; gemm.c tern__cuda_gemm_qkv_rope). SRC 2: q, k, v
 * summed from the S K-slices of the batch Q4 GEMM's partials (src: slices of ld floats, each the q [n][nh·d], k and v
 * [n][nkv·d] blocks back to back) in qgemm_q4.cu qg4_reduce's order (gemm.c tern__cuda_q4_qkv_rope). SRC 1 and 2 write
 * roped q and k to q and k and v to vout; all store k and v into the cache with the same arithmetic */
template <typename T, int SRC>
__global__ void rope_kv_kernel(float *q, float *k, const float *v, int n, int nh, int nkv, int d,
                               const int32_t *pos, const int32_t *slot, const float *inv_freq, float mscale,
                               T *kpool, T *vpool, const int32_t *bt, int max_blocks, int bs, const float *src, long ld,
                               float *vout, int S) {
    pdl_start();
    const int half = d / 2, nt = nh + nkv;
    const size_t total = (size_t)n * nt * half;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(t % half);
        const size_t rh = t / half;
        const int r = (int)(rh / nt), h = (int)(rh % nt);
        const bool isk = h >= nh;
        float *o = isk ? k + ((size_t)r * nkv + (h - nh)) * d : q + ((size_t)r * nh + h) * d;
        const float f = inv_freq[i];
        float x0, x1;
        if constexpr (SRC == 2) {
            const size_t e = isk ? (size_t)n * nh * d + ((size_t)r * nkv + (h - nh)) * d : ((size_t)r * nh + h) * d;
            x0 = part_sum<true>(src + e + i, ld, S);
            x1 = part_sum<true>(src + e + i + half, ld, S);
        } else {
            const float *x = SRC ? src + (size_t)r * ld + (size_t)h * d : o; /* q heads then k heads: head h at h·d */
            x0 = x[i], x1 = x[i + half];
        }
        rope_pair(x0, x1, pos[r], f);
        x0 *= mscale;
        x1 *= mscale;
        o[i] = x0;
        o[i + half] = x1;
        if (!isk) continue;
        const size_t within = (size_t)(h - nh) * d;
        float v0, v1;
        if constexpr (SRC == 2) {
            const size_t e = (size_t)n * (nh + nkv) * d + (size_t)r * nkv * d + within;
            v0 = part_sum<true>(src + e + i, ld, S);
            v1 = part_sum<true>(src + e + i + half, ld, S);
        } else {
            const float *vr = SRC ? src + (size_t)r * ld + (size_t)(nh + nkv) * d + within : v + (size_t)r * nkv * d + within;
            v0 = vr[i], v1 = vr[i + half];
        }
        if constexpr (SRC != 0) {
            vout[(size_t)r * nkv * d + within + i] = v0;
            vout[(size_t)r * nkv * d + within + i + half] = v1;
        }
        const int p = pos[r], sl = slot[r];
        if (p < 0 || p / bs >= max_blocks) continue;
        const int blk = bt[(size_t)sl * max_blocks + p / bs];
        if (blk < 0) continue;
        const size_t dst = ((size_t)blk * bs + p % bs) * nkv * d + within;
        kv_put(kpool + dst + i, x0);
        kv_put(kpool + dst + i + half, x1);
        kv_put(vpool + dst + i, v0);
        kv_put(vpool + dst + i + half, v1);
    }
}

/* TERN_CUDA_ROPE_HOIST (session 36: a k thread's v, slot and block-table loads issued before its q / k stores, two
 * dependent trips instead of three) tied on llama3-8b q4 b1 (353.4 vs 354.4 tok/s, four interleaved reps; NOTES (av))
 * and was removed */
/* one rope_kv_kernel launch (a thread per rotated pair, 256 a block): in place (src NULL: q, k roped in place, v read),
 * from the rows of src (S 0: ld floats each) or from the sum of S slices of ld floats at src (q, k, v written). 0 when
 * the pages are a kind it does not serve */
static int rope_launch(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const int32_t *pos, float *q,
                       float *k, float *v, const float *src, long ld, int nh, const float *inv_freq, float mscale,
                       int S = 0) {
    const int kind = kv->kf.kind, n = rows->n, d = kv->head_dim, nkv = kv->n_head_kv;
    if (!tern__cuda_rope_pages(kv)) return 0;
    const size_t total = (size_t)n * (nh + nkv) * (d / 2);
    if (!total) return 1;
    cudaSetDevice(c->device);
    const size_t b = (total + 255) / 256;
    const unsigned grid = (unsigned)(b > 65535 * 8 ? 65535 * 8 : b);
    by_page_kind(kind, [&](auto tag) {
        using T = decltype(tag);
        if (src && S)
            tern_launch(c->stream, rope_kv_kernel<T, 2>, grid, 256, 0, q, k, (const float *)nullptr, n, nh, nkv, d, pos,
                        rows->slot, inv_freq, mscale, (T *)kv->k, (T *)kv->v, kv->block_table, kv->max_blocks,
                        kv->block_size, src, ld, v, S);
        else if (src)
            tern_launch(c->stream, rope_kv_kernel<T, 1>, grid, 256, 0, q, k, (const float *)nullptr, n, nh, nkv, d, pos,
                        rows->slot, inv_freq, mscale, (T *)kv->k, (T *)kv->v, kv->block_table, kv->max_blocks,
                        kv->block_size, src, ld, v, 0);
        else
            tern_launch(c->stream, rope_kv_kernel<T, 0>, grid, 256, 0, q, k, (const float *)v, n, nh, nkv, d, pos,
                        rows->slot, inv_freq, mscale, (T *)kv->k, (T *)kv->v, kv->block_table, kv->max_blocks,
                        kv->block_size, (const float *)nullptr, 0L, (float *)nullptr, 0);
    });
    tern__cuda_check(c, src ? (S ? "rope_kv_parts" : "rope_kv_rows") : "rope_kv_write");
    return 1;
}

extern "C" int tern__cuda_rope_kv_write(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, float *q,
                                        float *k, const float *v, int nh, const int32_t *pos, const float *inv_freq,
                                        float mscale) {
    return rope_launch(c, kv, rows, pos, q, k, (float *)v, NULL, 0, nh, inv_freq, mscale); /* v is only read here */
}

/* rope_kv_write over q|k|v read from the rows of one GEMM's output (gemm.c tern__cuda_gemm_qkv_rope) */
extern "C" int tern__cuda_rope_kv_rows(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const float *src,
                                       int ld, float *q, float *k, float *v, int nh, const float *inv_freq, float mscale) {
    return rope_launch(c, kv, rows, rows->pos, q, k, v, src, ld, nh, inv_freq, mscale);
}

/* rope_kv_write over q|k|v summed from the S K-slices (slice floats each) of the batch Q4 GEMM's partials at part
 * (gemm.c tern__cuda_q4_qkv_rope; qg4_reduce's sums, then rope_kv_write's arithmetic: bitwise the two) */
extern "C" int tern__cuda_rope_kv_parts(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const float *part,
                                        size_t slice, int S, float *q, float *k, float *v, int nh, const float *inv_freq,
                                        float mscale) {
    return S >= 1 && rope_launch(c, kv, rows, rows->pos, q, k, v, part, (long)slice, nh, inv_freq, mscale, S);
}

/* Gemma 4's head norms + rope + cache stores: blocks [n][nh + nkv]; q head blocks norm + rope q, kv head
 * blocks norm + rope k, norm v, and store both. Shared: d floats. */
struct NrkArgs {
    float *q, *k, *v;
    const float *qw, *kw, *inv_freq;
    const int32_t *pos, *slot, *bt;
    int n, nh, nkv, d, max_blocks, bs;
    float eps, mscale;
    /* the warp form's SRC instances: q|k|v read from the rows of one GEMM's output (ld floats a row; a head's
     * elements at src + r·ld + its column) plus, for the kinds whose bit in lo_mask is set (1 q, 2 k, 4 v), the
     * element lo floats on (the split GEMM's W·xl half); q, k, v above are then only written */
    const float *src;
    long ld, lo;
    int lo_mask;
    int v_from_k; /* SRC: V is the raw K projection (Gemma 4's attention_k_eq_v): v heads read k's columns */
};

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
 * heads) the page */
template <typename T>
__device__ __forceinline__ void nrk_pair(const NrkArgs &a, const NrkHead &hd, T *kpool, int i, int half, float x0, float x1,
                                         float f) {
    rope_pair(x0, x1, hd.p, f);
    x0 *= a.mscale;
    x1 *= a.mscale;
    hd.x[i] = x0;
    hd.x[i + half] = x1;
    if (hd.store) {
        kv_put(kpool + hd.dst + i, x0);
        kv_put(kpool + hd.dst + i + half, x1);
    }
}

template <typename T> __global__ void norm_rope_kv_kernel(NrkArgs a, T *kpool, T *vpool) {
    pdl_start();
    extern __shared__ float xs[];
    __shared__ float red[32];
    const int nt = a.nh + a.nkv, r = blockIdx.x / nt, h = blockIdx.x % nt, half = a.d / 2, d = a.d;
    const NrkHead hd = nrk_head(a, r, h, d);
    /* the head's rmsnorm (in place, as norm.cu: (x·inv)·w) */
    auto norm = [&](float *row, const float *wr) {
        for (int j = threadIdx.x; j < d; j += blockDim.x) xs[j] = row[j];
        __syncthreads();
        const float inv = block_rms_inv([&](int j) { return xs[j]; }, d, a.eps, red);
        for (int j = threadIdx.x; j < d; j += blockDim.x) xs[j] = rms_scale(xs[j], inv, wr != nullptr, wr ? wr[j] : 0.0f);
        __syncthreads();
    };
    norm(hd.x, hd.w);
    for (int i = threadIdx.x; i < half; i += blockDim.x) nrk_pair(a, hd, kpool, i, half, xs[i], xs[i + half], a.inv_freq[i]);
    if (!hd.isk) return;
    __syncthreads(); /* xs is reused for v */
    float *vr = a.v + ((size_t)r * a.nkv + (h - a.nh)) * d;
    norm(vr, NULL);
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        vr[j] = xs[j];
        if (hd.store) kv_put(vpool + hd.dst + j, xs[j]);
    }
}

/* The same op with one warp per (row, head), for head dims 256 and 512 (NS = d / 32 slots a lane): the block
 * form above spends a block, three barriers and a shared-memory round trip on 1-2 KB (H200, session 22,
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

/* element j of head column col (q heads from 0, k heads from nh·d, v heads from (nh + nkv)·d) of row r in the SRC
 * form: the GEMM's element, plus its lo half where the kind's bit is set (one f32 add: the bits gemm.c's
 * elementwise sum of the two halves writes) */
__device__ __forceinline__ float nrk_src(const NrkArgs &a, int r, long col, int bit, int j) {
    const float *p = a.src + (size_t)r * a.ld + col + j;
    return (a.lo_mask & bit) ? p[0] + p[a.lo] : p[0];
}

template <typename T, int NS, bool HOIST, bool SRC = false> __global__ void norm_rope_kv_warp(NrkArgs a, T *kpool, T *vpool) {
    pdl_start();
    constexpr int d = NS * 32, half = d / 2, HS = NS / 2;
    const int lane = threadIdx.x & 31, nt = a.nh + a.nkv;
    const long task = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (task >= (long)a.n * nt) return;
    const int r = (int)(task / nt), h = (int)(task % nt);
    const NrkHead hd = nrk_head(a, r, h, d);
    const float *w = hd.w;
    auto vrow = [&]() { return a.v + ((size_t)r * a.nkv + (h - a.nh)) * d; };
    const long vcol = (long)(a.v_from_k ? h : a.nh + a.nkv + (h - a.nh)) * d; /* SRC: a kv head's v column */
    auto vload = [&](int j) { return SRC ? nrk_src(a, r, vcol, 4, j) : vrow()[j]; };
    float xv[NS], wv[NS], fv[HS], vv[NS];
#pragma unroll
    for (int s = 0; s < NS; s++) xv[s] = SRC ? nrk_src(a, r, (long)h * d, hd.isk ? 2 : 1, 32 * s + lane) : hd.x[32 * s + lane];
    if constexpr (HOIST) { /* every load of the head issued now, before any store (TERN_CUDA_NRK_HOIST) */
#pragma unroll
        for (int s = 0; s < NS; s++) wv[s] = w ? w[32 * s + lane] : 0.0f;
#pragma unroll
        for (int s = 0; s < HS; s++) fv[s] = a.inv_freq[32 * s + lane];
        if (hd.isk)
#pragma unroll
            for (int s = 0; s < NS; s++) vv[s] = vload(32 * s + lane);
    }
    float inv = warp_rms_inv<NS>(xv, d, a.eps);
#pragma unroll
    for (int s = 0; s < NS; s++) xv[s] = rms_scale(xv[s], inv, w != nullptr, HOIST ? wv[s] : w ? w[32 * s + lane] : 0.0f);
#pragma unroll
    for (int s = 0; s < HS; s++)
        nrk_pair(a, hd, kpool, 32 * s + lane, half, xv[s], xv[s + HS], HOIST ? fv[s] : a.inv_freq[32 * s + lane]);
    if (!hd.isk) return;
    float *vr = vrow();
    if constexpr (!HOIST)
#pragma unroll
        for (int s = 0; s < NS; s++) vv[s] = vload(32 * s + lane);
    inv = warp_rms_inv<NS>(vv, d, a.eps);
#pragma unroll
    for (int s = 0; s < NS; s++) {
        const float v = rms_scale(vv[s], inv, false, 0.0f);
        vr[32 * s + lane] = v;
        if (hd.store) kv_put(vpool + hd.dst + 32 * s + lane, v);
    }
}

/* TERN_CUDA_NRK_WARP=0: the block form for every head dim (A/B) */
int tern__cuda_nrk_warp = -1;
/* TERN_CUDA_NRK_HOIST (default 1; 0 off): the warp form loads the head's norm weight, rope frequencies and (kv
 * heads) v together with x, before the sum of squares, instead of after it and after the q / k stores: the frequency
 * loads could not move above the previous pair's stores (both float pointers), so a head of 256 waited on 4 dependent
 * L2 round trips for them (512: 8), then one for v. The same arithmetic, so the same bits (op test cuda_norm_rope_kv
 * runs both ways). Rows <= 128 only (decode). H200, session 36 (NOTES (av)), b1 bf16 off / on: gemma4-e4b 239.1 / 236.3 →
 * 242.3 / 242.2, gemma4-26b-a4b 259.5 / 259.5 → 261.7 / 260.8, gemma4-12b 136.0 / 136.1 → 137.7 / 137.5; e4b q4 268.2 /
 * 268.0 → 271.1 / 272.0 */
extern "C" int tern__cuda_nrk_hoist;
int tern__cuda_nrk_hoist = -1;

static NrkArgs nrk_args(const tern_kv_layer *kv, const tern_rows *rows, float *q, float *k, float *v, int nh,
                        const float *inv_freq, float mscale, const float *qw, const float *kw, float eps) {
    NrkArgs a = {};
    a.q = q; a.k = k; a.v = v; a.qw = qw; a.kw = kw; a.inv_freq = inv_freq;
    a.pos = rows->pos; a.slot = rows->slot; a.bt = kv->block_table;
    a.n = rows->n; a.nh = nh; a.nkv = k ? kv->n_head_kv : 0; a.d = kv->head_dim; /* k NULL: q heads only */
    a.max_blocks = kv->max_blocks; a.bs = kv->block_size;
    a.eps = eps; a.mscale = mscale;
    return a;
}

extern "C" int tern__cuda_norm_rope_kv_write(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, float *q,
                                             float *k, float *v, int nh, const float *inv_freq, float mscale,
                                             const float *qw, const float *kw, float eps) {
    const int kind = kv->kf.kind;
    if ((k && !tern__cuda_rope_pages(kv)) || kv->head_dim > 4096 || (!k && v)) return 0;
    const NrkArgs a = nrk_args(kv, rows, q, k, v, nh, inv_freq, mscale, qw, kw, eps);
    const long blocks = (long)a.n * (nh + a.nkv);
    if (blocks <= 0) return 1;
    cudaSetDevice(c->device);
    if (tern__cuda_nrk_warp < 0) tern__cuda_nrk_warp = tern__cuda_env_int("TERN_CUDA_NRK_WARP", 1) != 0;
    if (tern__cuda_nrk_hoist < 0) tern__cuda_nrk_hoist = tern__cuda_env_int("TERN_CUDA_NRK_HOIST", 1) != 0;
    /* decode steps only: the hoisting instances hold 48 / 80 registers (d 256 / 512; 38 / 48 without), which would cut
     * a prefill chunk's occupancy */
    const bool hoist = tern__cuda_nrk_hoist && a.n <= 128;
    const size_t smem = (size_t)a.d * sizeof(float);
    const unsigned wgrid = (unsigned)((blocks + 7) / 8); /* 8 warps a block */
    const bool warp = tern__cuda_nrk_warp && (a.d == 256 || a.d == 512);
    by_page_kind(k ? kind : TERN_KV_F32, [&](auto tag) { /* q only: no page is touched */
        using T = decltype(tag);
        if (warp) {
            void (*kern)(NrkArgs, T *, T *) = a.d == 256 ? (hoist ? norm_rope_kv_warp<T, 8, true> : norm_rope_kv_warp<T, 8, false>)
                                                         : (hoist ? norm_rope_kv_warp<T, 16, true> : norm_rope_kv_warp<T, 16, false>);
            tern_launch(c->stream, kern, wgrid, 256, 0, a, (T *)kv->k, (T *)kv->v);
        } else {
            tern_launch(c->stream, norm_rope_kv_kernel<T>, (unsigned)blocks, 256, smem, a, (T *)kv->k, (T *)kv->v);
        }
    });
    tern__cuda_check(c, "norm_rope_kv_write");
    return 1;
}

/* norm_rope_kv_write over q|k|v read from the rows of one GEMM's output (gemm.c tern__cuda_gemm_qkv_nrk): row r's
 * q|k|v at src + r·ld, plus the element lo floats on for the kinds in lo_mask (1 q, 2 k, 4 v: the split GEMM's
 * W·xl half); v_from_k: the rows hold q|k only and v is the raw k (set bit 4 with bit 2 then); q, k and v written as
 * the in-place op writes them. The warp form with its hoisted loads (head dims
 * 256 / 512, decode rows <= 128) over pages norm_rope_kv_write serves with k; else 0, nothing written. */
extern "C" int tern__cuda_nrk_rows(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const float *src,
                                   long ld, long lo, int lo_mask, int v_from_k, float *q, float *k, float *v, int nh,
                                   const float *inv_freq, float mscale, const float *qw, const float *kw, float eps) {
    const int d = kv->head_dim;
    if (!q || !k || !v || !tern__cuda_rope_pages(kv) || (d != 256 && d != 512) || rows->n > 128 || rows->n < 1)
        return 0;
    NrkArgs a = nrk_args(kv, rows, q, k, v, nh, inv_freq, mscale, qw, kw, eps);
    a.src = src;
    a.ld = ld;
    a.lo = lo;
    a.lo_mask = lo_mask;
    a.v_from_k = v_from_k;
    const unsigned wgrid = (unsigned)(((long)a.n * (nh + a.nkv) + 7) / 8);
    cudaSetDevice(c->device);
    by_page_kind(kv->kf.kind, [&](auto tag) {
        using T = decltype(tag);
        void (*kern)(NrkArgs, T *, T *) = d == 256 ? norm_rope_kv_warp<T, 8, true, true> : norm_rope_kv_warp<T, 16, true, true>;
        tern_launch(c->stream, kern, wgrid, 256, 0, a, (T *)kv->k, (T *)kv->v);
    });
    tern__cuda_check(c, "nrk_rows");
    return 1;
}

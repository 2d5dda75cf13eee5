/*
 * attn_decode.cuh — what the decode-attention kernels share (attn_decode.cu's split kernel, attn_decode1p.cu's
 * one-pass kernel, which reads the launch fields up to the softcap and ignores the split plan): the launch
 * arguments, the K/V row registers and their loads, the block-table record fill, the merge weights over
 * splits (or warps) and the one-pass kernels' warp-order merge, and the one-pass and tensor-core launchers attn_decode.cu dispatches to (attn_decode_tc.cu reads the same
 * launch fields as the one-pass kernel).
 */
#ifndef TERN_CUDA_ATTN_DECODE_CUH
#define TERN_CUDA_ATTN_DECODE_CUH

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/split_k.cuh"

#include <math.h>
#include <type_traits>

#define AD_CNT 65536 /* (row, kv head) counters (c->ad_cnt; zero between launches) */

struct AdArgs {
    float *out, *part;
    __nv_bfloat16 *outb; /* non-null: ad_warp_merge writes the output here in bf16 instead of out (attention_o) */
    int outq;            /* outb's rows in the batch Q4 GEMM's staged order (q4s_pos: a Q4 o projection) */
    const float *q;
    const void *kp, *vp;
    const int32_t *pos, *slot, *bt;
    int *cnt;
    int n, nh, nkv, G, D, max_blocks, bs, window, splits, chmax, chmin;
    int hs, GB; /* blocks per kv head (a group larger than the kernel's GM split in hs), heads per block */
    int region; /* floats before the record table in shared memory */
    int vpre;   /* V rows of a one-round warp load with its K rows (TERN_CUDA_AD_VPRE=0: after the scores) */
    int cl;     /* > 1: the splits (gridDim.y = cl) are one thread-block cluster, merged in shared memory */
    int ahead;  /* attn_decode_r1.cu: the next chunk's records looked up a chunk early (TERN_CUDA_AD_R1_AHEAD) */
    unsigned bmul; /* k / bs = (umulhi(k, bmul) + k) >> bshift (tern__cuda_divisor; ad_args_fill) */
    int bshift;
    float scale, softcap;
    /* attn_decode_tc.cu's ROPE instances (tern__cuda_attn_decode_rope): q, k, v unroped in the rows of one GEMM's
     * output (rsrc [n][rld]: nh q heads, nkv k heads, nkv v heads), roped with rinv / rmscale in the kernel */
    const float *rsrc, *rinv;
    int rld;
    float rmscale;
};

/* EPL consecutive elements of a K or V row, kept as loaded (32-bit words: EPL of f32, EPL / 2 of
 * BF16/F16 pairs) so that 16-bit pages hold twice the keys in the same registers; ad_get converts */
template <typename T, int EPL> struct AdRow {
    static constexpr int W = sizeof(T) == 4 ? EPL : EPL / 2;
    uint32_t w[W];
};
/* CG: through L2 only (data another kernel wrote while this one ran: AD_EARLY's row of key pos) */
template <typename T, int EPL, bool CG = false> __device__ __forceinline__ void ad_load(AdRow<T, EPL> &d, const T *src) {
#pragma unroll
    for (int i = 0; i < AdRow<T, EPL>::W / 4; i++) {
        const uint4 v = CG ? __ldcg((const uint4 *)src + i) : __ldg((const uint4 *)src + i);
        d.w[4 * i] = v.x; d.w[4 * i + 1] = v.y; d.w[4 * i + 2] = v.z; d.w[4 * i + 3] = v.w;
    }
}
template <typename T, int EPL> __device__ __forceinline__ void ad_zero(AdRow<T, EPL> &d) {
#pragma unroll
    for (int i = 0; i < AdRow<T, EPL>::W; i++) d.w[i] = 0u;
}
template <typename T, int EPL> __device__ __forceinline__ float ad_get(const AdRow<T, EPL> &d, int e) {
    if constexpr (sizeof(T) == 4) return __uint_as_float(d.w[e]);
    else if constexpr (std::is_same<T, __half>::value) {
        const float2 f = __half22float2(*(const __half2 *)&d.w[e >> 1]);
        return e & 1 ? f.y : f.x;
    } else {
        return e & 1 ? __uint_as_float(d.w[e >> 1] & 0xffff0000u) : __uint_as_float(d.w[e >> 1] << 16);
    }
}

/* A head's merge weights over nz splits in split order: M = max_z M_z, c_z = e^{M_z - M} (0 where either
 * is -inf) handed to put(z, c_z), and the return L = Σ_z L_z·c_z; ml(z) gives (M_z, L_z) and is read before
 * put(z, ·), so put may overwrite M_z in place. Both merges below use it: the same bits. */
template <class ML, class PUT> __device__ __forceinline__ float ad_split_weights(ML ml, PUT put, int nz) {
    float M = -INFINITY, L = 0.0f;
    for (int zz = 0; zz < nz; zz++) M = fmaxf(M, ml(zz).x);
    for (int zz = 0; zz < nz; zz++) {
        const float2 v = ml(zz);
        const float c = M == -INFINITY || v.x == -INFINITY ? 0.0f : expf(v.x - M);
        put(zz, c);
        L += v.y * c;
    }
    return L;
}

/* The end of a split block of pair (row r, kv head group at head0) once its partials are written (every thread
 * calls it): the last of the pair's nact splits to arrive (counter *cnt, reset by that block) merges the splits'
 * partials — tern__cuda_attn_merge's layout: [z][row·nh + head][D] sums over a.part (nrow = a.n·a.nh), then the
 * (M, L) pairs from mlo = a.splits·nrow·D — in split order into a.out: out = Σ_z part_z·c_z / Σ_z L_z·c_z
 * (ad_split_weights). ms: nact·GM·2 floats of shared memory the block no longer needs; sml [GM][2]. */
template <int GM>
__device__ __forceinline__ void ad_last_merge(const AdArgs &a, int *cnt, int r, size_t head0, int G, int D, int nact,
                                              size_t nrow, size_t mlo, float *ms, float (*sml)[2]) {
    if (!tern_block_last(cnt, nact)) return;
    for (int idx = threadIdx.x; idx < nact * G; idx += blockDim.x) {
        const int zz = idx / G, h = idx % G;
        const size_t o = mlo + ((size_t)zz * nrow + (size_t)r * a.nh + head0 + h) * 2;
        ms[(zz * GM + h) * 2] = __ldcg(a.part + o);
        ms[(zz * GM + h) * 2 + 1] = __ldcg(a.part + o + 1);
    }
    __syncthreads();
    if (threadIdx.x < G) { /* per head: each split's weight (in place of M_z) and L (split order) */
        const int h = threadIdx.x;
        sml[h][1] = ad_split_weights([&](int zz) { return make_float2(ms[(zz * GM + h) * 2], ms[(zz * GM + h) * 2 + 1]); },
                                     [&](int zz, float c) { ms[(zz * GM + h) * 2] = c; }, nact);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int h = idx / D, i = idx % D;
        const size_t rh = (size_t)r * a.nh + head0 + h;
        float v = 0.0f;
#pragma unroll 16
        for (int zz = 0; zz < nact; zz++) v += __ldcg(a.part + ((size_t)zz * nrow + rh) * D + i) * ms[(zz * GM + h) * 2];
        const float L = sml[h][1];
        a.out[rh * D + i] = L > 0.0f ? v / L : 0.0f;
    }
    if (threadIdx.x == 0) *cnt = 0;
}

/* a row's block table (row r of the launch) */
__device__ __forceinline__ const int32_t *ad_btrow(const AdArgs &a, int r) { return a.bt + (size_t)a.slot[r] * a.max_blocks; }
/* key k's record (token slot in the pool) from the row's block table btrow, -1 where its block is not resident */
__device__ __forceinline__ int ad_rec(const AdArgs &a, const int32_t *btrow, int k) {
    const int bi = (int)((__umulhi((unsigned)k, a.bmul) + (unsigned)k) >> a.bshift); /* k / bs (k >= 0) */
    const int blk = bi < a.max_blocks ? __ldg(btrow + bi) : -1;
    return blk < 0 ? -1 : blk * a.bs + (k - bi * a.bs);
}
/* recs[i] = ad_rec of key k0 + i, i < nk (threads of the block in turn) */
__device__ __forceinline__ void ad_records(int *recs, const AdArgs &a, const int32_t *btrow, int k0, int nk) {
    for (int i = threadIdx.x; i < nk; i += blockDim.x) recs[i] = ad_rec(a, btrow, k0 + i);
}

/* The end of the one-pass kernels (attn_decode1p.cu, attn_decode_tc.cu): the block's NW warps' (M_w, L_w, Σ p·v)
 * of the G heads from head0 (D elements each) merged in warp order into row r's outputs, out = Σ_w c_w·acc_w / Σ_w c_w·L_w
 * (ad_split_weights). wm / wl / cw are [NW][HS] in shared memory (cw: the weights, written here), sl [HS];
 * red(w, h, i) reads warp w's Σ p·v of head h, element i. The caller's barrier made wm, wl and red visible.
 * dw > 0: the block holds only output elements d0 .. d0 + dw - 1 of each head (red's i counts from d0). */
template <int NW, int HS, class RED>
__device__ __forceinline__ void ad_warp_merge(const AdArgs &a, int r, size_t head0, int D, float (*wm)[HS],
                                              float (*wl)[HS], float (*cw)[HS], float *sl, RED red, int dw = 0,
                                              int d0 = 0) {
    const int G = a.G;
    if (threadIdx.x < G) { /* per head: the warps' weights e^{M_w - M} and L, in warp order */
        const int h = threadIdx.x;
        sl[h] = ad_split_weights([&](int w) { return make_float2(wm[w][h], wl[w][h]); },
                                 [&](int w, float c) { cw[w][h] = c; }, NW);
    }
    __syncthreads();
    const int DW = dw > 0 ? dw : D;
    for (int idx = threadIdx.x; idx < G * DW; idx += blockDim.x) {
        const int h = idx / DW, i = idx % DW;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) v += red(w, h, i) * cw[w][h];
        const size_t at = ((size_t)r * a.nh + head0 + h) * D + d0 + i;
        const float o = sl[h] > 0.0f ? v / sl[h] : 0.0f;
        if (a.outb)
            a.outb[a.outq ? (size_t)r * a.nh * D + q4s_pos((int)((head0 + h) * D + d0 + i)) : at] = __float2bfloat16(o);
        else a.out[at] = o;
    }
}

/* The tensor-core kernels' page types (attn_decode_tc.cu, attn_decode_r1.cu): a pair of floats packed as the type's
 * halves and back, and the m16n8k16 mma over that type */
template <typename T> struct TcH;
template <> struct TcH<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float x, float y) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
        return *(const uint32_t *)&h;
    }
    static __device__ __forceinline__ float2 unpack(uint32_t u) {
        return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
    }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) { mma_bf16(c, a, b0, b1); }
    static __device__ __forceinline__ void mma_z(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) { mma_bf16_z(c, a, b0, b1); }
};
template <> struct TcH<__half> {
    static __device__ __forceinline__ uint32_t pack(float x, float y) {
        const __half2 h = __floats2half2_rn(x, y);
        return *(const uint32_t *)&h;
    }
    static __device__ __forceinline__ float2 unpack(uint32_t u) { return __half22float2(*(const __half2 *)&u); }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) { mma_f16(c, a, b0, b1); }
    static __device__ __forceinline__ void mma_z(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) { mma_f16_z(c, a, b0, b1); }
};

/* (x, y) as a pair of halves hi and the pair of what is left, lo = round((x, y) − hi) */
template <typename T> __device__ __forceinline__ void tc_split(float x, float y, uint32_t &hi, uint32_t &lo) {
    hi = TcH<T>::pack(x, y);
    const float2 h = TcH<T>::unpack(hi);
    lo = TcH<T>::pack(x - h.x, y - h.y);
}

/* attn_decode1p.cu: a's rows over pages of `kind` (TERN_KV_F32 / BF16 / F16), a block per (row, kv head),
 * one pass per warp (TERN_CUDA_AD_1P, opt-in): 1 when it ran, 0 when the shape is not served */
int tern__cuda_attn_decode_1p(tern__cuda *c, const AdArgs &a, int kind);

/* attn_decode_tc.cu: the same launches on tensor cores (TERN_CUDA_AD_TC, default on, tried before 1P): BF16 /
 * F16 pages, D 64 / 128 / 256 and (unsplit) 512, G <= 8; 1 when it ran, 0 when not served. split: a.splits (>= 2) blocks per
 * (row, kv head), each over its share of the keys (at least a.chmin), merged by the last (TERN_CUDA_AD_TCS;
 * partials in a.part, counters in a.cnt; early: one row over BF16 pages issues its first copies before pdl_wait,
 * TERN_CUDA_AD_TCS_EARLY). _init: at open, the kernels' shared-memory attributes
 * (tern__cuda_attn_decode_init) */
int tern__cuda_attn_decode_tc(tern__cuda *c, const AdArgs &a, int kind, bool split = false, bool early = false);
/* the same unsplit launch with rope_kv_rows folded in (a.rsrc set): every block ropes and stores its kv head's key and
 * value of its row first, then ropes its q heads as it loads them. Rows of distinct sequences only (a block reads only
 * its own row's keys); BF16 / F16 pages, D 64 / 128; 1 when it ran, 0 when not served (nothing launched) */
int tern__cuda_attn_decode_tc_rope(tern__cuda *c, const AdArgs &a, int kind);
void tern__cuda_attn_decode_tc_init(tern__cuda *c);
/* attn_decode_r1.cu: one row or a few (TERN_CUDA_AD_R1) on register-fed tensor cores, S <= 16 blocks per (row, kv
 * head) in one cluster, planned for `keys`; BF16 / F16 pages, D 64 / 128 / 256 / 512, G <= 8; early: one row over BF16 pages
 * issues its first loads before pdl_wait. 1 when it ran, 0 when not served (nothing launched). _init: at open */
int tern__cuda_attn_decode_r1(tern__cuda *c, const AdArgs &a, int kind, long keys, bool early);
void tern__cuda_attn_decode_r1_init(tern__cuda *c);

#endif

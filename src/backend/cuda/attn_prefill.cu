/*
 * attn_prefill.cu — flash attention for prefill on tensor cores (ops.h: attention; F32 or BF16 pages).
 *
 * tern__cuda_attn_runs (attention.cu) hands us runs of >= 32 (TERN_CUDA_FA_MIN) consecutive rows of
 * one KV slot, over F32 pages (attention.cu) or BF16 pages (kvq_attn.cu). A
 * block owns BM = 16·NW query vectors (R rows × HB heads of one KV-head group, so GQA heads
 * share every staged K/V tile); warp w owns vectors 16w..16w+15. Per key tile of BN keys:
 * K and V are read from the paged f32 pool and converted to bf16 while staging in shared
 * memory (BF16 pages: copied as they are with cp.async into one of two buffers, the next tile's
 * copy in flight while this one is multiplied), S = Q·Kᵀ (mma.sync m16n8k16, f32 accumulators, fragments via ldmatrix) stays in
 * registers, the online softmax (running max m and sum l per vector) runs in f32, P is packed
 * to bf16 as the A operand of P·V into the O accumulators (registers). Warps with no visible
 * key in a tile skip it; tiles fully visible to a warp skip the per-element mask. Mask per
 * (query pos p, key b): lo <= b <= p (lo = p-W+1 with a window) or vlo <= b <= vhi (span),
 * exactly as tern_key_range_of; keys whose block-table entry is < 0 are never read.
 * The per-tile work other than the MMAs is kept small (the kernel was bound by instruction issue):
 * BF16 pages: each thread copies fixed 16-byte chunks (chunk tid % (D/8) of rows tid / (D/8) + k·rows
 * per pass), its shared-memory targets fixed, a block-table entry per chunk looked up before the
 * barrier (no division: a multiply-shift by the block size), one barrier per tile (wait, barrier, then
 * the next copy into the buffer every warp has left); visibility and fullness per warp from bounds
 * reduced once before the loop (spans: per vector); softcap and mask as whole-tile branches; the
 * bf16 mode keeps the row max in the log2 domain (scale·log2 e folded into one FMA, ex2.approx;
 * split-K partials get m·ln 2); O is rescaled only when some row max of the warp moved; the first
 * k-step of S starts from zero accumulators.
 * Precision: compute mode bf16 uses plain bf16 Q, K, P, V (op tests: rel L2 <= 2.9e-3). SPLIT
 * writes every operand as hi + lo bf16 and sums hi·hi + hi·lo + lo·hi (three MMAs): ~16
 * significant bits per product (op tests 5.4e-6, model parity worst row 1.7e-5), but not exact
 * f32 (DESIGN §5) and not batch-invariant to 1e-5 (8.6e-5 when a run is cut differently), so the
 * f32 mode stays on attention.cu unless TERN_CUDA_FA=2 (about 10x faster, 52 TFLOP/s at 8k).
 * Split-K over keys (partials into c->part, merged by tern__cuda_attn_merge) when the blocks
 * cannot fill the GPU. Head dims 64 / 128 / 256, and 512 in two passes over the V columns (S
 * computed twice: 1.5x the MMAs; bf16 mode; 13 TFLOP/s at 8k vs 3.2 on CUDA cores, TERN_CUDA_FA512=0
 * turns it off); anything else stays on the caller's kernel.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma.cuh"

#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>

extern "C" {
int tern__cuda_fa_on = 1;  /* 0: every call stays on attention.cu (TERN_CUDA_FA=0) */
int tern__cuda_fa_f32 = 0; /* 1: the f32 compute mode uses the split kernel too (TERN_CUDA_FA=2) */
int tern__cuda_fa_cfg = 0; /* tile shape of the bf16 kernel: 0 the default, 1..3 alternatives (bench_cuda) */
int tern__cuda_fa512 = 1;  /* d 512 in two passes (TERN_CUDA_FA512=0: CUDA cores; H200 gemma4-12b pp8192 1.70x) */
unsigned long long tern__cuda_fa512_calls = 0;
unsigned long long tern__cuda_fa_bf16_calls = 0; /* launches over BF16 pages (tests check the path ran) */
}

struct FaArgs {
    float *out;
    const float *q;
    const int32_t *pos, *vlo, *vhi; /* this run's rows; vlo/vhi NULL without spans */
    int n, nh, nkv, G, HB, R, hsplit;
    const float *kp, *vp;
    const int32_t *btrow; /* block-table row of the run's slot */
    int max_blocks, bs, window;
    unsigned bmul; /* kpos / bs = (umulhi(kpos, bmul) + kpos) >> bshift (tern__cuda_divisor) */
    int bshift;
    float scale, softcap;
    int splits;
    float *part;
    int voff; /* first V / output column of this pass (head dims above 256 run in passes of DV) */
};

/* 2^x (one MUFU op; -inf -> 0) */
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float x, float y) { /* x -> low half (lower column) */
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *(uint32_t *)&h;
}

/* hi = bf16(x), lo = bf16(x - hi), for the two halves of a pair */
__device__ __forceinline__ void split_bf16(float x, float y, uint32_t &hi, uint32_t &lo) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    hi = *(uint32_t *)&h;
    lo = pack_bf16(x - __low2float(h), y - __high2float(h));
}

/* 4 floats -> 4 bf16 at dst (8 bytes), and their residuals at dst_lo when SPLIT */
template <bool SPLIT>
__device__ __forceinline__ void store4(__nv_bfloat16 *dst, __nv_bfloat16 *dst_lo, float4 v) {
    uint32_t h0, h1, l0, l1;
    if (SPLIT) {
        split_bf16(v.x, v.y, h0, l0);
        split_bf16(v.z, v.w, h1, l1);
        *(uint2 *)dst_lo = make_uint2(l0, l1);
    } else {
        h0 = pack_bf16(v.x, v.y);
        h1 = pack_bf16(v.z, v.w);
    }
    *(uint2 *)dst = make_uint2(h0, h1);
}

/* D: the head dim (Q·Kᵀ); DV: the V / output columns of one pass (D, or 256 when D = 512: the O
 * accumulators of 512 columns would not fit the registers, so S is computed once per pass) */
/* BFP: the pages are BF16 (--kv-quant bf16, the GPU default of the bf16 mode): K/V tiles are copied
 * as they are with cp.async into two buffers, the next tile's copy in flight while this one is
 * multiplied (NB below is then the buffer count, not hi/lo; BFP implies !SPLIT) */
template <int D, int DV, int BN, int NW, bool SPLIT, int MINB, bool BFP>
__global__ void __launch_bounds__(NW * 32, MINB) fa_kernel(FaArgs a) {
    pdl_start();
    static_assert(!(BFP && SPLIT), "bf16 pages run the plain bf16 kernel");
    constexpr int BM = 16 * NW, LD = D + 8, LDV = DV + 8, NT = 32 * NW, D4 = D / 4, DV4 = DV / 4, NJ = BN / 8,
                  ND = DV / 8;
    constexpr int NB = SPLIT || BFP ? 2 : 1, NQ = SPLIT ? 2 : 1;
    /* BFP: thread tid copies the 16-byte chunk i8 = tid % D8 of the rows t0 + RPP·c (t0 = tid / D8,
     * c < CH) of every tile: consecutive threads on consecutive 16 bytes of one row */
    constexpr int D8 = D / 8, DV8 = DV / 8, RPP = NT / D8, CH = BN / RPP > 0 ? BN / RPP : 1;
    static_assert(!BFP || (NT % D8 == 0 && BN % RPP == 0), "BF16 pages: a tile is whole passes of the threads");
    /* the bf16 mode keeps S, m in the log2 domain (p = 2^(s·scale·log2 e - m)); SPLIT stays natural (expf) */
    constexpr float L2E = SPLIT ? 1.0f : 1.4426950408889634f;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)fa_smem;           /* [NQ][BM][LD] */
    __nv_bfloat16 *Ks = Qs + NQ * BM * LD;                     /* [NB][BN][LD] (hi, lo or buffer 0, 1) */
    __nv_bfloat16 *Vs = Ks + NB * BN * LD;                     /* [NB][BN][LDV] */
    int *kval = (int *)(Vs + NB * BN * LDV);                   /* [NB][BN] key readable */
    __shared__ int range[2];
    __shared__ int4 qb[BM]; /* per vector: position, window start, span lo, span hi (the mask) */
    __shared__ int4 wb[NW]; /* per warp: the bounds wlo, whi, flo, fhi below */

    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int row0 = (gridDim.x - 1 - blockIdx.x) * a.R; /* last rows (most keys) first: a shorter tail */
    const int g = blockIdx.y / a.hsplit, h0 = (blockIdx.y % a.hsplit) * a.HB;

    /* Q tile: vector m -> row row0 + m / HB, head g·G + h0 + m % HB */
    for (int idx = tid; idx < BM * D4; idx += NT) {
        const int m = idx / D4, i4 = idx % D4, ri = m / a.HB, hi = m % a.HB, r = row0 + ri;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (ri < a.R && r < a.n && h0 + hi < a.G)
            x = __ldg((const float4 *)(a.q + ((size_t)r * a.nh + g * a.G + h0 + hi) * D) + i4);
        store4<SPLIT>(Qs + m * LD + 4 * i4, Qs + BM * LD + m * LD + 4 * i4, x);
    }
    /* this thread's two vectors: rows gq and gq + 8 of the warp's 16 */
    int qp[2], qlo[2], qvl[2], qvh[2];
    for (int k = 0; k < 2; k++) {
        const int m = 16 * w + gq + 8 * k, ri = m / a.HB, hi = m % a.HB, r = row0 + ri;
        const bool ok = ri < a.R && r < a.n && h0 + hi < a.G;
        qp[k] = ok ? a.pos[r] : -1;
        qlo[k] = ok ? (a.window > 0 ? max(0, qp[k] - a.window + 1) : 0) : 1;
        qvl[k] = ok && a.vlo ? max(0, a.vlo[r]) : 1;
        qvh[k] = ok && a.vlo ? a.vhi[r] : 0;
        if (tq == 0) qb[m] = make_int4(qp[k], qlo[k], qvl[k], qvh[k]);
    }
    if (tid == 0) {
        range[0] = 0x7fffffff;
        range[1] = -1;
    }
    __syncthreads();
    for (int k = 0; k < 2; k++) {
        if (qp[k] < 0) continue;
        int f = qlo[k], l = qp[k];
        if (qvl[k] <= qvh[k]) {
            f = min(f, qvl[k]);
            l = max(l, qvh[k]);
        }
        atomicMin(&range[0], f);
        atomicMax(&range[1], l);
    }
    __syncthreads();
    int lo = range[0], hi = range[1];
    if (hi >= 0 && a.splits > 1) {
        int chunk = (hi - lo + 1 + a.splits - 1) / a.splits;
        chunk = (chunk + BN - 1) / BN * BN;
        lo += blockIdx.z * chunk;
        hi = min(hi, lo + chunk - 1);
    }
    /* without spans, the warp's keys: any of [wlo, whi] may be visible (hull of its vectors' ranges);
     * a tile is fully visible to every vector iff it lies in [flo, fhi] (an empty vector: fhi = -1) */
    {
        const int wlo = __reduce_min_sync(0xffffffffu, min(qp[0] >= 0 ? qlo[0] : 0x7fffffff, qp[1] >= 0 ? qlo[1] : 0x7fffffff));
        const int whi = __reduce_max_sync(0xffffffffu, max(qp[0], qp[1]));
        const int flo = __reduce_max_sync(0xffffffffu, max(qlo[0], qlo[1]));
        const int fhi = __reduce_min_sync(0xffffffffu, min(qp[0], qp[1]));
        if (lane == 0) wb[w] = make_int4(wlo, whi, flo, fhi); /* read after the loop's first barrier */
    }

    float o[ND][4], s[NJ][4], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < ND; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    const int kvstride = a.nkv * D;

    /* F32 pages: element offset of key kpos's record of this group in the pool, or -1: past hi, past
     * the block table, or its block not resident (never read) */
    auto key_off = [&](int kpos) -> long long {
        const int blk = kpos <= hi && kpos / a.bs < a.max_blocks ? a.btrow[kpos / a.bs] : -1;
        return blk < 0 ? -1 : ((long long)blk * a.bs + kpos % a.bs) * kvstride + (long long)g * D;
    };
    /* BFP: ent[c] = the block-table entry of this thread's row c of the tile at kb (-1: not readable),
     * looked up before the barrier that precedes its copy */
    const int i8 = tid % D8, t0 = tid / D8, col = g * D + 8 * i8;
    auto blk_of = [&](int kpos) { return (int)((__umulhi((unsigned)kpos, a.bmul) + (unsigned)kpos) >> a.bshift); };
    int ent[CH];
    auto lookup = [&](int kb) {
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const int kpos = kb + t0 + RPP * c, bi = blk_of(kpos);
            ent[c] = kpos <= hi && bi < a.max_blocks ? a.btrow[bi] : -1;
        }
    };
    /* BFP: copy the tile at kb into buffer bb (zeros for keys not readable); 1 if every key of this
     * thread's rows is readable */
    auto issue = [&](int kb, int bb) -> int {
        int all = 1;
#pragma unroll
        for (int c = 0; c < CH; c++) {
            const int kpos = kb + t0 + RPP * c, blk = ent[c];
            const bool ok = blk >= 0;
            const unsigned rec = ok ? blk * a.bs + kpos - blk_of(kpos) * a.bs : 0; /* record in the pool */
            const size_t off = mul_wide(rec, (unsigned)kvstride) + col;
            mma_cp16(mma_smem_u32(Ks + (bb * BN + t0 + RPP * c) * LD + 8 * i8), (const __nv_bfloat16 *)a.kp + off, ok);
            if (i8 < DV8)
                mma_cp16(mma_smem_u32(Vs + (bb * BN + t0 + RPP * c) * LDV + 8 * i8), (const __nv_bfloat16 *)a.vp + off + a.voff, ok);
            if (i8 == 0) kval[bb * BN + t0 + RPP * c] = ok;
            all &= ok;
        }
        mma_cp_commit();
        return all;
    };
    const int ntile = hi >= lo ? (hi - lo) / BN + 1 : 0;
    int oknext = 1; /* BFP: every key of the tile in flight readable (this thread's rows) */
    if (BFP && ntile > 0) {
        lookup(lo);
        oknext = issue(lo, 0);
    }
    /* fragment addresses (ldmatrix): Q rows of this warp, K / V rows of buffer 0 */
    const uint32_t qa = mma_smem_u32(Qs + (16 * w + (lane & 15)) * LD + (lane >> 4) * 8);
    const uint32_t ka0 = mma_smem_u32(Ks + ((lane >> 4) * 8 + (lane & 7)) * LD + ((lane >> 3) & 1) * 8);
    const uint32_t va0 = mma_smem_u32(Vs + (((lane >> 3) & 1) * 8 + (lane & 7)) * LDV + (lane >> 4) * 8);
    /* s -> the exponent's domain: scale·log2 e (natural for SPLIT), folded into the exp's FMA; with a
     * softcap (or a scale that is not positive: the row max of raw s must be the max of scaled s) the
     * tile is scaled in place first and only log2 e remains */
    const bool pre = a.softcap > 0.0f || !(a.scale > 0.0f);
    const float sc = (pre ? 1.0f : a.scale) * L2E;
    for (int it = 0; it < ntile; it++) {
        const int kb = lo + it * BN, bb = BFP ? it & 1 : 0;
        int allv = 1;
        if (BFP) {
            /* the next tile's block-table entries in flight across the barrier; this tile landed (own
             * copies), then one barrier: everyone's copies visible and every warp done with the previous
             * tile, whose buffer takes the next copy */
            if (it + 1 < ntile) lookup(kb + BN);
            mma_cp_wait<0>();
            allv = __syncthreads_and(oknext);
            if (it + 1 < ntile) oknext = issue(kb + BN, bb ^ 1);
        } else {
            __syncthreads(); /* every warp is done with the previous tile */
            for (int idx = tid; idx < BN * D4; idx += NT) {
                const int t = idx / D4, i4 = idx % D4;
                float4 kv4 = make_float4(0.f, 0.f, 0.f, 0.f), vv4 = kv4;
                const long long ko = key_off(kb + t);
                const bool ok = ko >= 0;
                if (ok) {
                    const size_t off = (size_t)ko;
                    kv4 = __ldg((const float4 *)(a.kp + off) + i4);
                    if (i4 < DV4) vv4 = __ldg((const float4 *)(a.vp + off + a.voff) + i4);
                }
                store4<SPLIT>(Ks + t * LD + 4 * i4, Ks + BN * LD + t * LD + 4 * i4, kv4);
                if (i4 < DV4) store4<SPLIT>(Vs + t * LDV + 4 * i4, Vs + BN * LDV + t * LDV + 4 * i4, vv4);
                if (i4 == 0) kval[t] = ok;
                allv &= ok;
            }
            allv = __syncthreads_and(allv);
        }
        const int *kv_ok = kval + bb * BN;

        /* which of this warp's vectors see keys of [kb, kb+BN) at all, and fully (warp-uniform) */
        const int ke = kb + BN - 1;
        bool any, full;
        if (!a.vlo) {
            const int4 b = wb[w]; /* x: wlo, y: whi, z: flo, w: fhi */
            any = kb <= b.y && ke >= b.x;
            full = allv && kb >= b.z && ke <= b.w;
        } else {
            any = false;
            full = true;
            for (int k = 0; k < 2; k++) {
                const int4 q = qb[16 * w + gq + 8 * k]; /* x: p, y: window start, z, w: span */
                const bool c1 = q.x >= 0 && kb <= q.x && ke >= q.y;
                const bool c2 = q.z <= q.w && kb <= q.w && ke >= q.z;
                any |= c1 || c2;
                full &= (q.y <= kb && ke <= q.x) || (q.z <= kb && ke <= q.w);
            }
            any = __any_sync(0xffffffffu, any);
            full = __all_sync(0xffffffffu, full) && allv;
        }
        if (!any) continue;

        /* S = Q·Kᵀ */
        const uint32_t ka = ka0 + bb * (BN * LD * 2), va = va0 + bb * (BN * LDV * 2);
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
            uint32_t af[4], al[4];
            mma_ldsm_x4(af, qa + kc * 32);
            if (SPLIT) mma_ldsm_x4(al, qa + (BM * LD + kc * 16) * 2);
#pragma unroll
            for (int j = 0; j < NJ; j += 2) {
                uint32_t b[4];
                mma_ldsm_x4(b, ka + (j * 8 * LD + kc * 16) * 2);
                if (kc == 0) {
                    mma_bf16_z(s[j], af, b[0], b[1]);
                    mma_bf16_z(s[j + 1], af, b[2], b[3]);
                } else {
                    mma_bf16(s[j], af, b[0], b[1]);
                    mma_bf16(s[j + 1], af, b[2], b[3]);
                }
                if (SPLIT) {
                    uint32_t bl[4];
                    mma_ldsm_x4(bl, ka + ((BN + j * 8) * LD + kc * 16) * 2);
                    mma_bf16(s[j], af, bl[0], bl[1]);
                    mma_bf16(s[j + 1], af, bl[2], bl[3]);
                    mma_bf16(s[j], al, b[0], b[1]);
                    mma_bf16(s[j + 1], al, b[2], b[3]);
                }
            }
        }
        /* softcap and mask (whole-tile branches), then the online softmax per vector (4 lanes of a
         * quad share a row): the row max of the raw s, p = exp(s·sc - m) as one FMA and one exp */
        if (a.softcap > 0.0f) {
            const float capin = a.scale / a.softcap;
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[j][e] = a.softcap * tanhf(s[j][e] * capin);
        } else if (pre) {
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[j][e] *= a.scale;
        }
        if (!full) {
            const int4 q[2] = {qb[16 * w + gq], qb[16 * w + gq + 8]};
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int k = e >> 1, kpos = kb + 8 * j + 2 * tq + (e & 1);
                    const bool vis = (kv_ok[kpos - kb] != 0) & (((kpos >= q[k].y) & (kpos <= q[k].x)) |
                                                                ((kpos >= q[k].z) & (kpos <= q[k].w)));
                    if (!vis) s[j][e] = -INFINITY;
                }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
        }
        float al2[2], mu[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
            mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
            const float mn = fmaxf(mrow[k], mx[k] * sc);
            al2[k] = mn == mrow[k] ? 1.0f : SPLIT ? expf(mrow[k] - mn) : ex2(mrow[k] - mn); /* -inf -> 0 */
            mrow[k] = mn;
            mu[k] = mn == -INFINITY ? 0.0f : mn; /* no visible key yet: every p is exp(-inf) = 0 */
            lrow[k] *= al2[k];
        }
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int k = e >> 1;
                const float x = fmaf(s[j][e], sc, -mu[k]);
                const float p = SPLIT ? expf(x) : ex2(x);
                s[j][e] = p;
                lrow[k] += p;
            }
        if (__any_sync(0xffffffffu, al2[0] != 1.0f || al2[1] != 1.0f)) { /* a row max of the warp moved */
#pragma unroll
            for (int j = 0; j < ND; j++) {
                o[j][0] *= al2[0];
                o[j][1] *= al2[0];
                o[j][2] *= al2[1];
                o[j][3] *= al2[1];
            }
        }
        /* O += P·V: the S accumulators of key tiles 2kk, 2kk+1 are the A fragment of keys 16kk.. */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t pf[4], pl[4];
            if (SPLIT) {
                split_bf16(s[2 * kk][0], s[2 * kk][1], pf[0], pl[0]);
                split_bf16(s[2 * kk][2], s[2 * kk][3], pf[1], pl[1]);
                split_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1], pf[2], pl[2]);
                split_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3], pf[3], pl[3]);
            } else {
                pf[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
                pf[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
                pf[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pf[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            }
#pragma unroll
            for (int n = 0; n < ND; n += 2) {
                uint32_t b[4];
                mma_ldsm_x4_t(b, va + (kk * 16 * LDV + n * 8) * 2);
                mma_bf16(o[n], pf, b[0], b[1]);
                mma_bf16(o[n + 1], pf, b[2], b[3]);
                if (SPLIT) {
                    uint32_t bl[4];
                    mma_ldsm_x4_t(bl, va + ((BN + kk * 16) * LDV + n * 8) * 2);
                    mma_bf16(o[n], pf, bl[0], bl[1]);
                    mma_bf16(o[n + 1], pf, bl[2], bl[3]);
                    mma_bf16(o[n], pl, b[0], b[1]);
                    mma_bf16(o[n + 1], pl, b[2], b[3]);
                }
            }
        }
    }
    if (BFP) mma_cp_wait<0>(); /* nothing left in flight at exit (none is: the last tile issued none) */

    /* epilogue: finish the row sums over the quad, write O / l (or the split-K partials, m natural) */
#pragma unroll
    for (int k = 0; k < 2; k++) {
        lrow[k] += __shfl_xor_sync(0xffffffffu, lrow[k], 1);
        lrow[k] += __shfl_xor_sync(0xffffffffu, lrow[k], 2);
    }
    const size_t nrow = (size_t)a.n * a.nh;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int m = 16 * w + gq + 8 * k, ri = m / a.HB, hi2 = m % a.HB, r = row0 + ri;
        if (ri >= a.R || r >= a.n || h0 + hi2 >= a.G) continue;
        const size_t rh = (size_t)r * a.nh + g * a.G + h0 + hi2;
        if (a.splits == 1) {
            const float inv = lrow[k] > 0.0f ? 1.0f / lrow[k] : 0.0f;
            float *dst = a.out + rh * D + a.voff + 2 * tq;
#pragma unroll
            for (int j = 0; j < ND; j++)
                *(float2 *)(dst + 8 * j) = make_float2(o[j][2 * k] * inv, o[j][2 * k + 1] * inv);
        } else {
            float *dst = a.part + ((size_t)blockIdx.z * nrow + rh) * D + a.voff + 2 * tq;
#pragma unroll
            for (int j = 0; j < ND; j++) *(float2 *)(dst + 8 * j) = make_float2(o[j][2 * k], o[j][2 * k + 1]);
            if (tq == 0) {
                float *ml = a.part + (size_t)a.splits * nrow * D + ((size_t)blockIdx.z * nrow + rh) * 2;
                ml[0] = SPLIT ? mrow[k] : mrow[k] * 0.6931471805599453f;
                ml[1] = lrow[k];
            }
        }
    }
}

template <int D, int DV, int BN, int NW, bool SPLIT, bool BFP>
static size_t fa_smem_bytes() {
    const size_t q = (size_t)16 * NW * (D + 8), kv = (size_t)BN * (D + 8) + (size_t)BN * (DV + 8);
    return sizeof(__nv_bfloat16) * ((SPLIT ? 2 : 1) * q + (SPLIT || BFP ? 2 : 1) * kv) + sizeof(int) * (BFP ? 2 : 1) * BN;
}

template <int D, int DV, int BN, int NW, bool SPLIT, int MINB, bool BFP>
static void fa_init_one(tern__cuda *c) {
    cudaFuncSetAttribute(fa_kernel<D, DV, BN, NW, SPLIT, MINB, BFP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)fa_smem_bytes<D, DV, BN, NW, SPLIT, BFP>());
}

/* Launch one run with the tile shape of D; returns 0 when it cannot (shared memory). */
template <int D, int DV, int BN, int NW, bool SPLIT, int MINB, bool BFP>
static int fa_launch(tern__cuda *c, FaArgs a, long keylen) {
    const size_t smem = fa_smem_bytes<D, DV, BN, NW, SPLIT, BFP>();
    if (smem + 1024 > c->smem_optin) return 0;
    const int BM = 16 * NW;
    a.HB = a.G < BM ? a.G : BM;
    a.hsplit = (a.G + a.HB - 1) / a.HB;
    a.R = BM / a.HB;
    const int tiles = (a.n + a.R - 1) / a.R;
    const long blocks = (long)tiles * a.nkv * a.hsplit;
    a.splits = 1;
    if (blocks < c->n_sm) { /* split the keys so that the blocks fill the GPU (merged after) */
        long s = (2L * c->n_sm + blocks - 1) / blocks, byk = (keylen + 2L * BN - 1) / (2L * BN);
        if (s > byk) s = byk;
        if (s > 64) s = 64;
        while (s > 1 && (size_t)s * a.n * a.nh * (D + 2) > TERN_CUDA_PART_FLOATS) s /= 2;
        a.splits = s < 1 ? 1 : (int)s;
    }
    a.part = c->part;
    dim3 grid((unsigned)tiles, (unsigned)(a.nkv * a.hsplit), (unsigned)a.splits);
    for (a.voff = 0; a.voff < D; a.voff += DV) { /* passes over the V columns (one unless D > 256) */
        tern_launch(c->stream, fa_kernel<D, DV, BN, NW, SPLIT, MINB, BFP>, grid, NW * 32, smem, a);
        tern__cuda_check(c, "attention (flash prefill)");
    }
    if (D > DV) tern__cuda_fa512_calls++;
    if (BFP) tern__cuda_fa_bf16_calls++;
    if (a.splits > 1) tern__cuda_attn_merge(c, a.out, a.n * a.nh, D, a.splits, "attention (flash prefill) merge");
    return 1;
}

/* The tile shapes: <D, DV, BN, NW, SPLIT, min blocks per SM, BFP>. Row 0 of each head dim and page
 * kind is the default; rows 1..3 are alternatives for bench_cuda (tern__cuda_fa_cfg). d 512 (Gemma 4's
 * global layers): two passes of 256 V columns, bf16 mode only (split operands would need 233 KB).
 * BFP rows (BF16 pages) hold two K/V buffers; row 0 = the fastest at 8k on the H200 (NOTES (q)). d 256 row 2
 * (4 warps x 2 blocks) times faster alone (239 vs 223 TFLOP/s at 8k) but gemma4-12b's prefill did not
 * gain with it as row 0 (pp2048 17.2k vs 17.6k, one rep each; NOTES (r)): row 0 stays. */
#define FA_SHAPES(X)                                                                                              \
    X(64, 0, 64, 64, 64, 8, false, 2, false) X(64, 1, 64, 64, 64, 4, false, 3, false)                            \
    X(64, 2, 64, 64, 32, 8, false, 2, false) X(64, 3, 64, 64, 64, 8, false, 1, false)                            \
    X(128, 0, 128, 128, 32, 8, false, 2, false) X(128, 1, 128, 128, 64, 8, false, 2, false)                      \
    X(128, 2, 128, 128, 64, 4, false, 3, false) X(128, 3, 128, 128, 64, 8, false, 1, false)                      \
    X(256, 0, 256, 256, 32, 8, false, 1, false) X(256, 1, 256, 256, 64, 4, false, 1, false)                      \
    X(256, 2, 256, 256, 32, 4, false, 1, false) X(256, 3, 256, 256, 16, 4, false, 2, false)                      \
    X(512, 0, 512, 256, 32, 4, false, 1, false)                                                                  \
    X(64, 4, 64, 64, 64, 8, true, 1, false) X(128, 4, 128, 128, 64, 8, true, 1, false)                           \
    X(256, 4, 256, 256, 32, 4, true, 1, false)                                                                   \
    X(64, 0, 64, 64, 64, 8, false, 2, true) X(64, 1, 64, 64, 64, 4, false, 2, true)                              \
    X(64, 2, 64, 64, 32, 4, false, 4, true) X(64, 3, 64, 64, 128, 8, false, 1, true)                             \
    X(128, 0, 128, 128, 32, 8, false, 2, true) X(128, 1, 128, 128, 64, 4, false, 2, true)                        \
    X(128, 2, 128, 128, 64, 8, false, 2, true) X(128, 3, 128, 128, 32, 4, false, 3, true)                        \
    X(256, 0, 256, 256, 32, 8, false, 1, true) X(256, 1, 256, 256, 64, 4, false, 1, true)                        \
    X(256, 2, 256, 256, 32, 4, false, 2, true) X(256, 3, 256, 256, 16, 4, false, 2, true)                        \
    X(512, 0, 512, 256, 32, 4, false, 1, true)

extern "C" void tern__cuda_attn_prefill_init(tern__cuda *c) {
    const int fa = tern__cuda_env_int("TERN_CUDA_FA", 1);
    if (fa == 0) tern__cuda_fa_on = 0;
    if (fa == 2) tern__cuda_fa_f32 = 1;
    if (tern__cuda_env_int("TERN_CUDA_FA512", 1) == 0) tern__cuda_fa512 = 0;
#define FA_INIT(dd, v, D, DV, BN, NW, SP, MB, BF) fa_init_one<D, DV, BN, NW, SP, MB, BF>(c);
    FA_SHAPES(FA_INIT)
#undef FA_INIT
    cudaGetLastError();
}

/* rows: consecutive rows of one slot with host copies (attention.cu checks); 1 = done */
extern "C" int tern__cuda_attn_prefill(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                                       const tern_kv_layer *kv, float scale, float softcap) {
    if (kv->head_dim == 512 && tern__cuda_attn_mat_run(c, out, q, rows, nh, kv, scale, softcap)) return 1;
    const int d = kv->head_dim, n = rows->n, split = c->compute != TERN_COMPUTE_BF16;
    const bool bfp = kv->kf.kind == TERN_KV_BF16 && kv->vf.kind == TERN_KV_BF16; /* else F32 pages */
    if (!tern__cuda_fa_on || (split && !tern__cuda_fa_f32) || (d != 64 && d != 128 && d != 256 && d != 512) ||
        (d == 512 && (split || !tern__cuda_fa512)) || kv->latent || (bfp && split) ||
        (!bfp && (kv->kf.kind != TERN_KV_F32 || kv->vf.kind != TERN_KV_F32)) || kv->block_size < 1 ||
        kv->block_size > (1 << 24))
        return 0;
    const int slot = rows->slot_host[0];
    long first = 0x7fffffff, last = -1; /* the run's key range, for the split-K plan */
    for (int r = 0; r < n; r++) {
        long p = rows->pos_host[r], l = kv->window > 0 ? p - kv->window + 1 : 0;
        if (l < 0) l = 0;
        if (rows->vis_lo_host && rows->vis_hi_host && rows->vis_lo_host[r] <= rows->vis_hi_host[r]) {
            l = rows->vis_lo_host[r] < l ? (rows->vis_lo_host[r] < 0 ? 0 : rows->vis_lo_host[r]) : l;
            p = rows->vis_hi_host[r] > p ? rows->vis_hi_host[r] : p;
        }
        first = l < first ? l : first;
        last = p > last ? p : last;
    }
    FaArgs a = {};
    a.out = out;
    a.q = q;
    a.pos = rows->pos;
    a.vlo = rows->vis_lo && rows->vis_hi ? rows->vis_lo : NULL;
    a.vhi = a.vlo ? rows->vis_hi : NULL;
    a.n = n;
    a.nh = nh;
    a.nkv = kv->n_head_kv;
    a.G = nh / kv->n_head_kv;
    a.kp = (const float *)kv->k;
    a.vp = (const float *)kv->v;
    a.btrow = kv->block_table + (size_t)slot * kv->max_blocks;
    a.max_blocks = kv->max_blocks;
    a.bs = kv->block_size;
    tern__cuda_divisor(a.bs, &a.bmul, &a.bshift);
    a.window = kv->window;
    a.scale = scale;
    a.softcap = softcap;
    const long keylen = last >= first ? last - first + 1 : 1;
    const int v = split ? 4 : tern__cuda_fa_cfg >= 0 && tern__cuda_fa_cfg < 4 ? tern__cuda_fa_cfg : 0;
#define FA_GO(dd, vv, D, DV, BN, NW, SP, MB, BF) \
    if (d == dd && v == vv && BF == bfp) return fa_launch<D, DV, BN, NW, SP, MB, BF>(c, a, keylen);
    FA_SHAPES(FA_GO)
#undef FA_GO
    return 0;
}

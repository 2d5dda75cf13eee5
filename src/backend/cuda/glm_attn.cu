/*
 * glm_attn.cu — GLM-5's MLA latent cache on the GPU (ops.h tern_glm_ops): the latent record
 * write, the absorbed attention over paged latent blocks and the DSA indexer top-k.
 *
 * attention_latent: every head attends the same per-token record K_b (head_dim floats,
 * [latent | roped key]); values are its first dv floats. A block owns one row, HB heads and one
 * split of the row's key list (0..pos, or sel[r][0..k_sel) with -1 / out-of-range / evicted
 * entries skipped); tiles of T records are staged in shared memory and serve all HB heads;
 * online softmax in exact f32 (expf), accumulators in shared memory. Split-K for decode: the
 * key list is cut into `splits` pieces; partials (acc, M, L) go to c->part and are merged.
 * Aligned shapes (GLM-5's) take a register-tiled variant of the same kernel (see below).
 *
 * dsa_topk: (1) a score kernel, one block per (row, tile of 32 keys): I[b] = Σ_j w_j ·
 * relu(scale·q_j·kI_b) summed in exactly the CPU's order (one sequential f32 dot per (key,
 * head), __fmul_rn/__fadd_rn, heads in order), so scores are bit-identical to the CPU's; each
 * is stored as an order-preserving u32 (NaN -> 1, below every number; evicted key -> 0).
 * (2) a select kernel, one block per row: radix select (4 passes of 8 bits) finds the k-th
 * largest key T and how many keys equal to T to take; one ascending scan with a block prefix
 * sum then writes keys > T and the first `need` keys == T in position order — i.e. ties go to
 * the lower position and the output is sorted ascending, exactly the CPU's selection.
 * Scores live in c->part (rows in pieces when they do not fit).
 *
 * Step graphs: grids depend on shapes and on the context capacity (max_blocks·block_size)
 * while recording; positions are read on the device and blocks past a row's keys exit. One
 * host-side branch cannot be seen by the kernels: the model attends densely (sel == NULL)
 * while every row has pos+1 <= index_topk. A step recorded that way would be wrong once a row
 * passes index_topk, so attention_latent with sel == NULL, k_sel > 0 and a capacity above
 * k_sel marks the recording bad (graph_end drops it; the step runs eagerly).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/attn_tile.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* record index of (slot, b), or -1 when not resident */
__device__ __forceinline__ long long lat_rec(const int32_t *bt, int max_blocks, int bs, int slot, int b) {
    if (slot < 0 || b < 0 || b / bs >= max_blocks) return -1;
    const int blk = bt[(size_t)slot * max_blocks + b / bs];
    return blk < 0 ? -1 : (long long)blk * bs + b % bs;
}

/* element j of a latent pool's f32 (bf = 0) or bf16 (bf = 1) records, as f32 (bf16: exact) */
__device__ __forceinline__ float lat_ld(const void *p, size_t j, int bf) {
    return bf ? __uint_as_float((uint32_t)__ldg((const unsigned short *)p + j) << 16) : __ldg((const float *)p + j);
}

/* ---- latent cache write ---- */

__global__ void kv_write_latent_kernel(void *kp, void *vp, const int32_t *bt, int max_blocks, int bs, int D, int Dv,
                                       const int32_t *pos, const int32_t *slot, int n, const float *k, const float *v,
                                       int bf) {
    pdl_start();
    const int W = D + Dv;
    const size_t total = (size_t)n * W;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const size_t r = t / W;
        const int j = (int)(t % W);
        const long long i = lat_rec(bt, max_blocks, bs, slot[r], pos[r]);
        if (i < 0) continue;
        void *pool = j < D ? kp : vp;
        const size_t e = j < D ? (size_t)i * D + j : (size_t)i * Dv + (j - D);
        const float x = j < D ? k[r * D + j] : v[r * Dv + (j - D)];
        if (bf) ((__nv_bfloat16 *)pool)[e] = __float2bfloat16_rn(x); /* = tern_f32_to_bf16 (NaN aside) */
        else ((float *)pool)[e] = x;
    }
}

extern "C" void tern__cuda_kv_write_latent(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows,
                                           const float *k, const float *v) {
    const int n = rows->n, D = kv->head_dim, Dv = (kv->v_dim > 0 && v && kv->v) ? kv->v_dim : 0;
    if (n <= 0 || D <= 0) return;
    cudaSetDevice(c->device);
    const size_t total = (size_t)n * (D + Dv);
    size_t b = (total + 255) / 256;
    tern_launch(c->stream, kv_write_latent_kernel, (unsigned)(b > 65535 * 4 ? 65535 * 4 : b), 256, 0, 
        kv->k, kv->v, kv->block_table, kv->max_blocks, kv->block_size, D, Dv, rows->pos, rows->slot,
        n, k, v, kv->dtype == TERN_DT_BF16);
    tern__cuda_check(c, "glm kv_write_latent");
}

/* ---- absorbed attention over the latent cache ---- */

struct LatArgs {
    float *out;
    const float *q;
    const void *kp; /* records of f32, or bf16 when bf */
    int bf;
    const int32_t *pos, *slot, *bt, *sel;
    int n, nh, D, dv, max_blocks, bs, k_sel;
    float scale;
    int HB, T, splits;
    float *part; /* [splits][n][nh][dv] accumulators, then [splits][n][nh][2] (M, L) */
};

/* Keys [lo, hi) of this block's split (blockIdx.z of a.splits, T-aligned chunks) of len keys. */
__device__ __forceinline__ void lat_split(const LatArgs &a, int T, int len, int *lo, int *hi) {
    *lo = 0;
    *hi = len;
    if (a.splits > 1) {
        int chunk = (len + a.splits - 1) / a.splits;
        chunk = (chunk + T - 1) / T * T;
        *lo = min(len, (int)blockIdx.z * chunk);
        *hi = min(len, *lo + chunk);
    }
}

/* Cache record of key cc of the row at position p (through the DSA selection selr when set);
 * -1 past hi, for a negative / future selection or an unmapped block. */
__device__ __forceinline__ long long lat_key(const LatArgs &a, const int32_t *selr, int cc, int hi, int p, int slot) {
    long long rec = -1;
    if (cc < hi) {
        const int b = selr ? selr[cc] : cc;
        if (b >= 0 && b <= p) rec = lat_rec(a.bt, a.max_blocks, a.bs, slot, b);
    }
    return rec;
}

static size_t lat_smem(int HB, int T, int D, int dv) {
    return sizeof(long long) * (size_t)T +
           sizeof(float) * ((size_t)HB * D + (size_t)T * (D + 1) + (size_t)HB * dv + (size_t)HB * T + 3 * (size_t)HB);
}

__global__ void __launch_bounds__(256) latent_attn_kernel(LatArgs a) {
    pdl_start();
    extern __shared__ long long lsm[];
    const int HB = a.HB, T = a.T, D = a.D, dv = a.dv, tid = threadIdx.x, nt = blockDim.x;
    long long *kr = lsm;
    float *qs = (float *)(kr + T), *Ks = qs + HB * D, *acc = Ks + T * (D + 1), *S = acc + HB * dv;
    float *M = S + HB * T, *L = M + HB, *AL = L + HB;
    const int r = blockIdx.x, h0 = blockIdx.y * HB, nhb = min(HB, a.nh - h0);
    const int p = a.pos[r], slot = a.slot[r];
    const int len = p < 0 ? 0 : a.sel ? a.k_sel : p + 1;
    int lo, hi; /* this block's part [lo, hi) of the key list */
    lat_split(a, T, len, &lo, &hi);
    for (int h = tid; h < HB; h += nt) {
        M[h] = -INFINITY;
        L[h] = 0.0f;
    }
    for (int i = tid; i < HB * D; i += nt) {
        const int h = i / D;
        qs[i] = h < nhb ? a.q[((size_t)r * a.nh + h0 + h) * D + i % D] : 0.0f;
    }
    for (int i = tid; i < HB * dv; i += nt) acc[i] = 0.0f;
    const int32_t *selr = a.sel ? a.sel + (size_t)r * a.k_sel : NULL;

    for (int c0 = lo; c0 < hi; c0 += T) {
        __syncthreads(); /* the previous tile is done with kr / Ks / S */
        for (int t = tid; t < T; t += nt) kr[t] = lat_key(a, selr, c0 + t, hi, p, slot);
        __syncthreads();
        for (int i = tid; i < T * D; i += nt) {
            const int t = i / D, j = i % D;
            Ks[t * (D + 1) + j] = kr[t] >= 0 ? lat_ld(a.kp, (size_t)kr[t] * D + j, a.bf) : 0.0f;
        }
        __syncthreads();
        for (int i = tid; i < HB * T; i += nt) {
            const int h = i / T, t = i % T;
            float s = -INFINITY;
            if (h < nhb && kr[t] >= 0) {
                const float *qv = qs + h * D, *kv = Ks + t * (D + 1);
                float dot = 0.0f;
                for (int j = 0; j < D; j++) dot = fmaf(qv[j], kv[j], dot);
                s = dot * a.scale;
            }
            S[i] = s;
        }
        __syncthreads();
        at_softmax(S, M, L, AL, HB, T, tid, nt);
        __syncthreads();
        for (int i = tid; i < HB * dv; i += nt) {
            const int h = i / dv, j = i % dv;
            const float *pr = S + h * T;
            float v = acc[i] * AL[h];
            for (int t = 0; t < T; t++) v = fmaf(pr[t], Ks[t * (D + 1) + j], v);
            acc[i] = v;
        }
    }
    __syncthreads();
    const size_t nrow = (size_t)a.n * a.nh;
    for (int i = tid; i < nhb * dv; i += nt) {
        const int h = i / dv, j = i % dv;
        const size_t rh = (size_t)r * a.nh + h0 + h;
        if (a.splits == 1) {
            a.out[rh * dv + j] = L[h] > 0.0f ? acc[i] / L[h] : 0.0f;
        } else {
            a.part[((size_t)blockIdx.z * nrow + rh) * dv + j] = acc[i];
            if (j == 0) {
                float *ml = a.part + (size_t)a.splits * nrow * dv + ((size_t)blockIdx.z * nrow + rh) * 2;
                ml[0] = M[h];
                ml[1] = L[h];
            }
        }
    }
}

/* Register-tiled variant (D % 4 == 0, dv % 4 == 0, dv <= 512; GLM-5's 576 / 512): 16 heads x 16
 * keys per tile, records padded to D + 4 floats so 128-bit shared loads are conflict-free.
 * Scores: one (head, key) per thread, float4 loads, 4 partial sums (fixed order). P·V: a thread
 * owns 4 consecutive value columns of 8 heads in registers (32 accumulators), so per key it
 * reads one float4 of V and two of P (stored [key][head]) for 32 FMAs; the reference kernel
 * above reads 2 shared floats per FMA. Same split-K partials and merge. */
#define LRT_HB 16
#define LRT_T 16

static size_t lat_rt_smem(int D) {
    const size_t ld = (size_t)D + 4;
    return sizeof(long long) * LRT_T + sizeof(float) * (LRT_HB * ld + LRT_T * ld + LRT_T * LRT_HB + 3 * LRT_HB);
}

__global__ void __launch_bounds__(256, 2) latent_attn_rt_kernel(LatArgs a) {
    pdl_start();
    extern __shared__ long long rsm[];
    const int D = a.D, dv = a.dv, ld = D + 4, D4 = D / 4, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    long long *kr = rsm;
    float *qs = (float *)(kr + LRT_T), *Ks = qs + LRT_HB * ld, *P = Ks + LRT_T * ld;
    float *M = P + LRT_T * LRT_HB, *L = M + LRT_HB, *AL = L + LRT_HB;
    const int r = blockIdx.x, h0 = blockIdx.y * LRT_HB, nhb = min(LRT_HB, a.nh - h0);
    const int p = a.pos[r], slot = a.slot[r];
    const int len = p < 0 ? 0 : a.sel ? a.k_sel : p + 1;
    int lo, hi;
    lat_split(a, LRT_T, len, &lo, &hi);
    if (tid < LRT_HB) {
        M[tid] = -INFINITY;
        L[tid] = 0.0f;
    }
    for (int i = tid; i < LRT_HB * D; i += blockDim.x) {
        const int h = i / D, c = i % D;
        qs[h * ld + c] = h < nhb ? a.q[((size_t)r * a.nh + h0 + h) * D + c] : 0.0f;
    }
    const int ng = dv / 4, cg = tid % ng, hg = tid / ng; /* P·V ownership: columns 4cg.., heads 8hg.. */
    const bool pv = hg < LRT_HB / 8;
    float acc[8][4];
#pragma unroll
    for (int hh = 0; hh < 8; hh++) acc[hh][0] = acc[hh][1] = acc[hh][2] = acc[hh][3] = 0.0f;
    const int32_t *selr = a.sel ? a.sel + (size_t)r * a.k_sel : NULL;

    for (int c0 = lo; c0 < hi; c0 += LRT_T) {
        __syncthreads(); /* the previous tile is done with kr / Ks / P */
        if (tid < LRT_T) kr[tid] = lat_key(a, selr, c0 + tid, hi, p, slot);
        __syncthreads();
        for (int i = tid; i < LRT_T * D4; i += blockDim.x) {
            const int t = i / D4, c = i % D4;
            float4 v = make_float4(0, 0, 0, 0);
            if (kr[t] >= 0 && !a.bf) {
                v = __ldg((const float4 *)((const float *)a.kp + (size_t)kr[t] * D) + c);
            } else if (kr[t] >= 0) { /* four bf16 (8 bytes: D % 4 == 0) */
                const uint2 u = __ldg((const uint2 *)((const unsigned short *)a.kp + (size_t)kr[t] * D) + c);
                v = make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                                __uint_as_float(u.y & 0xffff0000u));
            }
            *(float4 *)(Ks + t * ld + 4 * c) = v;
        }
        __syncthreads();
        { /* scores: thread -> (head tid / T, key tid % T) */
            const int h = tid / LRT_T, t = tid % LRT_T;
            float sc = -INFINITY;
            if (h < nhb && kr[t] >= 0) {
                const float4 *qv = (const float4 *)(qs + h * ld), *kv = (const float4 *)(Ks + t * ld);
                float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
                for (int c = 0; c < D4; c++) {
                    const float4 x = qv[c], y = kv[c];
                    d0 = fmaf(x.x, y.x, d0);
                    d1 = fmaf(x.y, y.y, d1);
                    d2 = fmaf(x.z, y.z, d2);
                    d3 = fmaf(x.w, y.w, d3);
                }
                sc = ((d0 + d1) + (d2 + d3)) * a.scale;
            }
            P[t * LRT_HB + h] = sc;
        }
        __syncthreads();
        for (int h = warp; h < LRT_HB; h += blockDim.x >> 5) { /* online softmax, a warp per head */
            const float sv = lane < LRT_T ? P[lane * LRT_HB + h] : -INFINITY;
            const float mold = M[h], mnew = fmaxf(mold, warp_max(sv));
            const float pr = sv == -INFINITY ? 0.0f : expf(sv - mnew);
            if (lane < LRT_T) P[lane * LRT_HB + h] = pr;
            const float sum = warp_sum(pr);
            if (lane == 0) {
                const float al = mnew == -INFINITY ? 1.0f : expf(mold - mnew);
                AL[h] = al;
                L[h] = L[h] * al + sum;
                M[h] = mnew;
            }
        }
        __syncthreads();
        if (pv) {
#pragma unroll
            for (int hh = 0; hh < 8; hh++) {
                const float al = AL[8 * hg + hh];
                acc[hh][0] *= al; acc[hh][1] *= al; acc[hh][2] *= al; acc[hh][3] *= al;
            }
#pragma unroll 4
            for (int t = 0; t < LRT_T; t++) {
                const float4 v = *(const float4 *)(Ks + t * ld + 4 * cg);
                const float4 pa = *(const float4 *)(P + t * LRT_HB + 8 * hg), pb = *(const float4 *)(P + t * LRT_HB + 8 * hg + 4);
                const float pp[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
                for (int hh = 0; hh < 8; hh++) {
                    acc[hh][0] = fmaf(pp[hh], v.x, acc[hh][0]);
                    acc[hh][1] = fmaf(pp[hh], v.y, acc[hh][1]);
                    acc[hh][2] = fmaf(pp[hh], v.z, acc[hh][2]);
                    acc[hh][3] = fmaf(pp[hh], v.w, acc[hh][3]);
                }
            }
        }
    }
    __syncthreads();
    if (!pv) return;
    const size_t nrow = (size_t)a.n * a.nh;
#pragma unroll
    for (int hh = 0; hh < 8; hh++) {
        const int h = 8 * hg + hh;
        if (h >= nhb) continue;
        const size_t rh = (size_t)r * a.nh + h0 + h;
        if (a.splits == 1) {
            const float l = L[h];
            float4 o = l > 0.0f ? make_float4(acc[hh][0] / l, acc[hh][1] / l, acc[hh][2] / l, acc[hh][3] / l)
                                : make_float4(0, 0, 0, 0);
            float *op = a.out + rh * dv + 4 * cg;
            op[0] = o.x; op[1] = o.y; op[2] = o.z; op[3] = o.w;
        } else {
            float *pp = a.part + ((size_t)blockIdx.z * nrow + rh) * dv + 4 * cg;
            pp[0] = acc[hh][0]; pp[1] = acc[hh][1]; pp[2] = acc[hh][2]; pp[3] = acc[hh][3];
            if (cg == 0) {
                float *ml = a.part + (size_t)a.splits * nrow * dv + ((size_t)blockIdx.z * nrow + rh) * 2;
                ml[0] = M[h];
                ml[1] = L[h];
            }
        }
    }
}

extern "C" void tern__cuda_attention_latent(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                                            const tern_kv_layer *kv, int dv, float scale, const int32_t *sel,
                                            int k_sel) {
    const int n = rows->n, D = kv->head_dim;
    if (n <= 0 || nh <= 0) return;
    const long cap = (long)kv->max_blocks * kv->block_size;
    if (c->capturing && !sel && k_sel > 0 && cap > k_sel) c->capture_bad = 1; /* dense only below index_topk */
    if (D <= 0 || dv <= 0 || dv > D || (sel && k_sel <= 0)) {
        tern_log(TERN_LOG_ERROR, "cuda attention_latent: unsupported head_dim %d dv %d k_sel %d", D, dv, k_sel);
        return;
    }
    /* the register-tiled kernel for aligned shapes (TERN_GLM_ATTN=ref keeps the reference one) */
    static int ref_only = -1;
    if (ref_only < 0) {
        const char *e = getenv("TERN_GLM_ATTN");
        ref_only = e && !strcmp(e, "ref");
    }
    const int rt = !ref_only && D % 4 == 0 && dv % 4 == 0 && dv <= 512 && ((uintptr_t)kv->k & 15) == 0 &&
                   lat_rt_smem(D) + 1024 <= c->smem_optin;
    int HB = rt ? LRT_HB : nh < 16 ? nh : 16, T = rt ? LRT_T : D <= 256 ? 32 : 16;
    while (!rt && lat_smem(HB, T, D, dv) + 1024 > c->smem_optin && (HB > 1 || T > 4)) {
        if (HB > 1) HB /= 2;
        else T /= 2;
    }
    const size_t smem = rt ? lat_rt_smem(D) : lat_smem(HB, T, D, dv);
    if (smem + 1024 > c->smem_optin) {
        tern_log(TERN_LOG_ERROR, "cuda attention_latent: %zu bytes of shared memory needed (head_dim %d)", smem, D);
        return;
    }
    cudaSetDevice(c->device);
    LatArgs a = {};
    a.out = out;
    a.q = q;
    a.kp = kv->k;
    a.bf = kv->dtype == TERN_DT_BF16;
    a.pos = rows->pos;
    a.slot = rows->slot;
    a.bt = kv->block_table;
    a.sel = sel;
    a.n = n;
    a.nh = nh;
    a.D = D;
    a.dv = dv;
    a.max_blocks = kv->max_blocks;
    a.bs = kv->block_size;
    a.k_sel = k_sel;
    a.scale = scale;
    a.HB = HB;
    a.T = T;
    a.part = c->part;
    const int hsplit = (nh + HB - 1) / HB;
    const long blocks = (long)n * hsplit, keys = sel ? k_sel : tern__cuda_attn_max_keys(c, rows, kv);
    a.splits = tern__cuda_attn_splits(c, blocks, keys, T, n, nh, dv);
    dim3 grid((unsigned)n, (unsigned)hsplit, (unsigned)a.splits);
    if (rt) tern_launch(c->stream, latent_attn_rt_kernel, grid, 256, smem, a);
    else tern_launch(c->stream, latent_attn_kernel, grid, 256, smem, a);
    tern__cuda_check(c, "glm attention_latent");
    if (a.splits > 1) {
        tern__cuda_attn_merge(c, out, n * nh, dv, a.splits, "glm attention_latent merge");
    }
}

/* ---- DSA indexer: scores ---- */

#define DSA_TK 32     /* keys per score block */
#define DSA_SEL_NT 512

/* order-preserving map of a score to u32: NaN -> 1 (lowest), -0 == +0 */
__device__ __forceinline__ uint32_t ord_of(float s) {
    if (isnan(s)) return 1u;
    uint32_t u = __float_as_uint(s);
    if ((u & 0x7fffffffu) == 0u) u = 0u; /* -0 ranks as +0 */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float score_of(uint32_t o) {
    if (o <= 1u) return __int_as_float(0x7fc00000);
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

static size_t dsa_smem(int nh, int Dv) {
    return sizeof(long long) * DSA_TK +
           sizeof(float) * ((size_t)nh * (Dv + 1) + (size_t)DSA_TK * (Dv + 1) + (size_t)DSA_TK * nh + nh);
}

__global__ void __launch_bounds__(256) dsa_score_kernel(uint32_t *ord, size_t ld, int lenmax, const float *q,
                                                        const float *w, const int32_t *pos, const int32_t *slot,
                                                        int r0, int nh, int Dv, const void *vp, int bf,
                                                        const int32_t *bt, int max_blocks, int bs, float scale, int k) {
    pdl_start();
    extern __shared__ long long dsm[];
    const int lr = blockIdx.y, r = r0 + lr, t0 = blockIdx.x * DSA_TK, tid = threadIdx.x, nt = blockDim.x;
    const int a = pos[r], s = slot[r];
    if (a + 1 <= k || t0 > a) return; /* dense row, or past the row's keys */
    long long *kr = dsm;
    float *qs = (float *)(kr + DSA_TK), *ks = qs + nh * (Dv + 1), *dots = ks + DSA_TK * (Dv + 1), *ws = dots + DSA_TK * nh;
    const float *qr = q + (size_t)r * nh * Dv;
    for (int i = tid; i < nh * Dv; i += nt) qs[(i / Dv) * (Dv + 1) + i % Dv] = qr[i];
    for (int j = tid; j < nh; j += nt) ws[j] = w[(size_t)r * nh + j];
    for (int t = tid; t < DSA_TK; t += nt) {
        const int b = t0 + t;
        kr[t] = b <= a && b < lenmax ? lat_rec(bt, max_blocks, bs, s, b) : -1;
    }
    __syncthreads();
    for (int i = tid; i < DSA_TK * Dv; i += nt) {
        const int t = i / Dv, c = i % Dv;
        ks[t * (Dv + 1) + c] = kr[t] >= 0 ? lat_ld(vp, (size_t)kr[t] * Dv + c, bf) : 0.0f;
    }
    __syncthreads();
    for (int i = tid; i < DSA_TK * nh; i += nt) {
        const int t = i / nh, j = i % nh;
        const float *qj = qs + j * (Dv + 1), *kb = ks + t * (Dv + 1);
        float dot = 0.0f;
        for (int c = 0; c < Dv; c++) dot = __fadd_rn(dot, __fmul_rn(qj[c], kb[c]));
        dots[i] = __fmul_rn(dot, scale);
    }
    __syncthreads();
    for (int t = tid; t < DSA_TK; t += nt) {
        const int b = t0 + t;
        if (b > a || b >= lenmax) continue;
        uint32_t o = 0u;
        if (kr[t] >= 0) {
            float score = 0.0f;
            for (int j = 0; j < nh; j++) {
                const float d = dots[t * nh + j];
                if (d > 0.0f) score = __fadd_rn(score, __fmul_rn(ws[j], d));
            }
            o = ord_of(score);
        }
        ord[(size_t)lr * ld + b] = o;
    }
}

/* ---- DSA indexer: selection ---- */

/* exclusive block prefix sum of v (block total in *total); sh: 33 words */
__device__ unsigned block_excl_scan(unsigned v, unsigned *sh, unsigned *total) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) sh[wid] = x;
    __syncthreads();
    if (wid == 0) {
        unsigned s = lane < nw ? sh[lane] : 0u;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        sh[lane] = s;
    }
    __syncthreads();
    *total = sh[nw - 1];
    return (wid ? sh[wid - 1] : 0u) + x - v;
}

__global__ void __launch_bounds__(DSA_SEL_NT) dsa_select_kernel(int32_t *sel, const uint32_t *ord, size_t ld,
                                                                int lenmax, const int32_t *pos, int r0, int k,
                                                                int have_v, float *gap) {
    pdl_start();
    __shared__ unsigned hist[256], sh[33], cnt, pfx, rem, best;
    const int lr = blockIdx.x, r = r0 + lr, tid = threadIdx.x, nt = blockDim.x;
    const int a = pos[r];
    int32_t *out = sel + (size_t)r * k;
    if (gap && tid == 0) gap[2 * (size_t)r] = 0.0f;
    if (a + 1 <= k || !have_v) { /* dense row: every position; no indexer keys: nothing */
        for (int i = tid; i < k; i += nt) out[i] = a + 1 <= k && i <= a ? i : -1;
        return;
    }
    const uint32_t *o = ord + (size_t)lr * ld;
    const int len = min(a + 1, lenmax);
    if (tid == 0) { cnt = 0; best = 0; }
    __syncthreads();
    unsigned mine = 0;
    for (int b = tid; b < len; b += nt) mine += o[b] != 0u;
    atomicAdd(&cnt, mine);
    __syncthreads();
    const unsigned nvalid = cnt;
    uint32_t T = 1u;
    unsigned need = (unsigned)k;
    if (nvalid > (unsigned)k) { /* radix select of the k-th largest key */
        uint32_t prefix = 0u, mask = 0u;
        unsigned left = (unsigned)k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int i = tid; i < 256; i += nt) hist[i] = 0u;
            __syncthreads();
            for (int b = tid; b < len; b += nt) {
                const uint32_t v = o[b];
                if (v && (v & mask) == prefix) atomicAdd(&hist[(v >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (tid == 0) {
                unsigned cum = 0;
                int d = 255;
                for (; d > 0; d--) {
                    if (cum + hist[d] >= left) break;
                    cum += hist[d];
                }
                pfx = prefix | ((uint32_t)d << shift);
                rem = left - cum;
            }
            __syncthreads();
            prefix = pfx;
            left = rem;
            mask |= 255u << shift;
        }
        T = prefix;
        need = left; /* keys equal to T to take, lowest positions first */
    }
    unsigned run_sel = 0, run_eq = 0;
    uint32_t best_un = 0;
    for (int base = 0; base < len; base += nt) {
        const int b = base + tid;
        const uint32_t v = b < len ? o[b] : 0u;
        const unsigned gt = v > T, eq = v != 0u && v == T;
        unsigned tot;
        const unsigned ex = block_excl_scan(gt | (eq << 16), sh, &tot);
        const unsigned gt_ex = ex & 0xffffu, eq_ex = ex >> 16, room = need > run_eq ? need - run_eq : 0u;
        const bool take = gt || (eq && eq_ex < room);
        if (take) out[run_sel + gt_ex + min(eq_ex, room)] = b;
        else if (v > best_un) best_un = v;
        run_sel += (tot & 0xffffu) + min(tot >> 16, room);
        run_eq += tot >> 16;
    }
    for (int i = (int)run_sel + tid; i < k; i += nt) out[i] = -1;
    if (gap) {
        atomicMax(&best, best_un);
        __syncthreads();
        if (tid == 0 && nvalid > (unsigned)k) {
            gap[2 * (size_t)r] = 1.0f;
            gap[2 * (size_t)r + 1] = score_of(T) - score_of(best);
        }
    }
}

extern "C" void tern__cuda_dsa_topk(tern__cuda *c, int32_t *sel, const float *q, const float *w, const tern_rows *rows,
                                    int nh, const tern_kv_layer *kv, float scale, int k, float *min_gap) {
    const int n = rows->n, Dv = kv->v_dim;
    if (n <= 0 || k <= 0) return;
    const int have_v = kv->v && Dv > 0 && nh > 0;
    const long lenmax = tern__cuda_attn_max_keys(c, rows, kv);
    const size_t ld = ((size_t)lenmax + 3) & ~(size_t)3;
    size_t piece = ld ? TERN_CUDA_PART_FLOATS / ld : 0;
    if (piece > 65535) piece = 65535;
    const size_t smem = have_v ? dsa_smem(nh, Dv) : 0;
    if (piece < 1 || smem + 1024 > c->smem_optin) {
        tern_log(TERN_LOG_ERROR, "cuda dsa_topk: unsupported context %ld / %d heads x %d", lenmax, nh, Dv);
        return;
    }
    cudaSetDevice(c->device);
    float *gap = NULL;
    if (min_gap) {
        if (c->capturing) c->capture_bad = 1; /* the diagnostic needs a download */
        else if (cudaMalloc((void **)&gap, sizeof(float) * 2 * (size_t)n) != cudaSuccess) {
            cudaGetLastError();
            gap = NULL;
        }
    }
    uint32_t *ord = (uint32_t *)c->part;
    for (int r0 = 0; r0 < n; r0 += (int)piece) {
        const int np = n - r0 < (int)piece ? n - r0 : (int)piece;
        if (have_v) {
            dim3 grid((unsigned)((lenmax + DSA_TK - 1) / DSA_TK), (unsigned)np);
            tern_launch(c->stream, dsa_score_kernel, grid, 256, smem, ord, ld, (int)lenmax, q, w, rows->pos, rows->slot, r0, nh,
                                                             Dv, (const void *)kv->v, kv->dtype == TERN_DT_BF16, kv->block_table,
                                                             kv->max_blocks, kv->block_size, scale, k);
            tern__cuda_check(c, "glm dsa scores");
        }
        tern_launch(c->stream, dsa_select_kernel, (unsigned)np, DSA_SEL_NT, 0, sel, ord, ld, (int)lenmax, rows->pos, r0, k,
                                                                      have_v, gap);
        tern__cuda_check(c, "glm dsa select");
    }
    if (gap) {
        float *h = (float *)malloc(sizeof(float) * 2 * (size_t)n);
        if (h && cudaMemcpyAsync(h, gap, sizeof(float) * 2 * (size_t)n, cudaMemcpyDeviceToHost, c->stream) ==
                     cudaSuccess &&
            cudaStreamSynchronize(c->stream) == cudaSuccess)
            for (int r = 0; r < n; r++) /* the CPU's fold, in row order */
                if (h[2 * r] != 0.0f && (isnan(*min_gap) || h[2 * r + 1] < *min_gap)) *min_gap = h[2 * r + 1];
        free(h);
        cudaFree(gap);
    }
}

/* The kernels' dynamic shared-memory limits are raised once, at backend open (never while a
 * graph is being recorded). */
extern "C" void tern__cuda_glm_attn_init(tern__cuda *c) {
    cudaFuncSetAttribute(latent_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(c->smem_optin - 1024));
    cudaFuncSetAttribute(latent_attn_rt_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(c->smem_optin - 1024));
    cudaFuncSetAttribute(dsa_score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(c->smem_optin - 1024));
    cudaGetLastError();
}

/*
 * tp_remap.cu — the small kernels of tensor / expert parallelism (src/model/tp.h):
 *   - expert remap: after routing, map the chosen global expert ids to this rank's local
 *     expert stack: id - e0 for e0 <= id < e1, else -1 (moe_mlp skips ids outside its stack);
 *     n·k int32 entries, one thread each;
 *   - bf16 all-reduce staging (nccl.c, bf16 compute mode): f32 -> bf16 (round to nearest even)
 *     before ncclAllReduce in bf16, and bf16 -> f32 back into the caller's buffer after it;
 *   - the one-shot all-reduce over peer memory (below) that nccl.c uses for small vectors, also
 *     with the residual add fused (x += sum: the add kernel after it is gone, same bits);
 *   - the gather of the vocabulary-parallel head over the same staging and barrier (rank 0
 *     copies each rank's logits slice into its columns of the rows).
 * All on the backend's stream (capturable into a step graph).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"

#include <cuda_bf16.h>
#include <string.h>

extern "C" {
#include "model/tp.h"
}

__global__ void expert_remap_kernel(int32_t *idx, int n, int e0, int e1) {
    pdl_start();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int e = idx[i];
    idx[i] = e >= e0 && e < e1 ? e - e0 : -1;
}

extern "C" void tern__cuda_expert_remap(tern_backend *be, int32_t *idx, int n, int e0, int e1) {
    tern__cuda *c = (tern__cuda *)be->impl;
    if (n <= 0) return;
    cudaSetDevice(c->device);
    tern_launch(c->stream, expert_remap_kernel, (n + 255) / 256, 256, 0, idx, n, e0, e1);
    tern__cuda_check(c, "expert_remap");
}

/* two elements per thread (n even in practice; the odd tail is handled) */
__global__ void pack_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n) {
    pdl_start();
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    if (i + 1 < n) {
        const float2 v = *(const float2 *)(src + i);
        *(__nv_bfloat162 *)(dst + i) = __floats2bfloat162_rn(v.x, v.y);
    } else if (i < n) {
        dst[i] = __float2bfloat16_rn(src[i]);
    }
}

__global__ void unpack_bf16_kernel(float *dst, const __nv_bfloat16 *src, size_t n) {
    pdl_start();
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    if (i + 1 < n) {
        const float2 v = __bfloat1622float2(*(const __nv_bfloat162 *)(src + i));
        *(float2 *)(dst + i) = v;
    } else if (i < n) {
        dst[i] = __bfloat162float(src[i]);
    }
}

/* dst (bf16) = src (f32) when to_bf16, else dst (f32) = src (bf16); n elements, src and dst
 * 8-byte aligned (device allocations and offsets of even element counts). */
extern "C" void tern__cuda_tp_convert(tern_backend *be, void *dst, const void *src, size_t n, int to_bf16) {
    tern__cuda *c = (tern__cuda *)be->impl;
    if (!n) return;
    const size_t threads = (n + 1) / 2;
    const unsigned blocks = (unsigned)((threads + 255) / 256);
    if (to_bf16) tern_launch(c->stream, pack_bf16_kernel, blocks, 256, 0, (__nv_bfloat16 *)dst, (const float *)src, n);
    else tern_launch(c->stream, unpack_bf16_kernel, blocks, 256, 0, (float *)dst, (const __nv_bfloat16 *)src, n);
    tern__cuda_check(c, "tp_convert");
}

/* ---- one-shot all-reduce over peer memory (nccl.c: small vectors, N <= TERN_TP_P2P_MAXR) ----
 * Every rank runs the same kernel with the same fixed grid (TERN_TP_P2P_BLOCKS blocks): block b
 * copies its slice of y into this rank's staging buffer (parity = epoch & 1), tells every peer
 * "epoch reached for block b" by a store into the peer's flag array, waits until every peer's
 * flag for block b has reached the epoch, then sums its slice over the ranks' buffers in rank
 * order (read through NVLink) into y — the same bits on every rank. The epoch lives in device
 * memory (one counter per block, advanced by that block at its end), so a captured graph replays
 * correctly. Two parities: a peer can only write a parity again after passing the barrier of the
 * call in between, which needs this rank's signal, given after this rank's reads (stream order).
 * A barrier that never completes (a peer that died) gives up after ~20 s, leaving y unreduced,
 * instead of hanging the process. */
struct tp_sync {
    float *buf[TERN_TP_P2P_MAXR];        /* rank q's staging: [2][cap] floats */
    unsigned *flag[TERN_TP_P2P_MAXR];    /* rank q's flags: [blocks][MAXR] */
    unsigned *cnt;                       /* this rank's epochs: [blocks] */
    size_t cap;
    int nr, rank;
};

struct tp_ar_args {
    float *y;
    float *res;                          /* NULL: y = sum; else res += sum (y untouched) */
    size_t n;
    tp_sync s;
};

/* Block b of every rank: publish this block's staging (fence), tell every peer that epoch ep
 * reached block b, wait for every peer's word for block b. */
__device__ __forceinline__ void sync_peers(const tp_sync &s, int b, unsigned ep) {
    const int t = threadIdx.x;
    __threadfence_system();
    __syncthreads();
    if (t < s.nr && t != s.rank) {
        volatile unsigned *f = s.flag[t] + (size_t)b * TERN_TP_P2P_MAXR + s.rank;
        *f = ep;
    }
    if (t < s.nr && t != s.rank) {
        volatile unsigned *f = s.flag[s.rank] + (size_t)b * TERN_TP_P2P_MAXR + t;
        const long long t0 = clock64();
        while (*f < ep)
            if (clock64() - t0 > 40000000000LL) break; /* ~20 s: a peer is gone */
    }
    __syncthreads();
    __threadfence_system();
}

__global__ void __launch_bounds__(512) tp_ar_kernel(tp_ar_args a) {
    pdl_start();
    const int b = blockIdx.x, t = threadIdx.x;
    const unsigned ep = a.s.cnt[b] + 1;
    const size_t off = (ep & 1) ? a.s.cap : 0;
    /* slices of whole float4s, block b: [lo, hi) */
    const size_t n4 = (a.n + 3) / 4, per = (n4 + gridDim.x - 1) / gridDim.x;
    const size_t lo = b * per * 4, hi = min(a.n, (b + 1) * per * 4);
    float *mine = a.s.buf[a.s.rank] + off;
    float *out = a.res ? a.res : a.y;
    const bool vec = ((a.n & 3) == 0) && (((uintptr_t)a.y & 15) == 0) && (((uintptr_t)out & 15) == 0);
    if (vec) {
        for (size_t i = lo + (size_t)t * 4; i < hi; i += (size_t)blockDim.x * 4)
            *(float4 *)(mine + i) = *(const float4 *)(a.y + i);
    } else {
        for (size_t i = lo + t; i < hi; i += blockDim.x) mine[i] = a.y[i];
    }
    sync_peers(a.s, b, ep);
    /* the sum in rank order; fused add: out = res + sum, one rounding as the separate add op */
    if (vec) {
        for (size_t i = lo + (size_t)t * 4; i < hi; i += (size_t)blockDim.x * 4) {
            float4 s = __ldcg((const float4 *)(a.s.buf[0] + off + i));
            for (int q = 1; q < a.s.nr; q++) {
                const float4 v = __ldcg((const float4 *)(a.s.buf[q] + off + i));
                s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
            }
            if (a.res) {
                const float4 r = *(const float4 *)(out + i);
                s.x = __fadd_rn(r.x, s.x); s.y = __fadd_rn(r.y, s.y); s.z = __fadd_rn(r.z, s.z); s.w = __fadd_rn(r.w, s.w);
            }
            *(float4 *)(out + i) = s;
        }
    } else {
        for (size_t i = lo + t; i < hi; i += blockDim.x) {
            float s = __ldcg(a.s.buf[0] + off + i);
            for (int q = 1; q < a.s.nr; q++) s += __ldcg(a.s.buf[q] + off + i);
            out[i] = a.res ? __fadd_rn(out[i], s) : s;
        }
    }
    if (t == 0) a.s.cnt[b] = ep;
}

/* Gather (vocabulary-parallel head): ranks > 0 stage block b's part of src [rows, w[rank]],
 * all ranks meet at block b's barrier, rank 0 copies every rank's part of block b into its
 * columns of dst (its own straight from src). The staging parity rule is the all-reduce's. */
struct tp_ga_args {
    float *dst;
    const float *src;
    int rows, ld;
    int c0[TERN_TP_P2P_MAXR], w[TERN_TP_P2P_MAXR];
    tp_sync s;
};

__global__ void __launch_bounds__(512) tp_ga_kernel(tp_ga_args a) {
    pdl_start();
    const int b = blockIdx.x, t = threadIdx.x;
    const unsigned ep = a.s.cnt[b] + 1;
    const size_t off = (ep & 1) ? a.s.cap : 0;
    if (a.s.rank != 0) {
        const size_t n = (size_t)a.rows * a.w[a.s.rank], per = (n + gridDim.x - 1) / gridDim.x;
        const size_t lo = b * per, hi = min(n, lo + per);
        float *mine = a.s.buf[a.s.rank] + off;
        for (size_t i = lo + t; i < hi; i += blockDim.x) mine[i] = a.src[i];
    }
    sync_peers(a.s, b, ep);
    if (a.s.rank == 0)
        for (int q = 0; q < a.s.nr; q++) {
            const int w = a.w[q];
            const size_t n = (size_t)a.rows * w, per = (n + gridDim.x - 1) / gridDim.x;
            const size_t lo = b * per, hi = min(n, lo + per);
            const float *from = q == 0 ? a.src : a.s.buf[q] + off;
            for (size_t i = lo + t; i < hi; i += blockDim.x) {
                const size_t r = i / (size_t)w, j = i - r * (size_t)w;
                a.dst[r * (size_t)a.ld + (size_t)a.c0[q] + j] = q == 0 ? from[i] : __ldcg(from + i);
            }
        }
    if (t == 0) a.s.cnt[b] = ep;
}

static void fill_sync(tp_sync *s, float *const *bufs, unsigned *const *flags, unsigned *cnt, size_t cap, int nr,
                      int rank) {
    memset(s, 0, sizeof *s);
    for (int q = 0; q < nr; q++) { s->buf[q] = bufs[q]; s->flag[q] = flags[q]; }
    s->cnt = cnt;
    s->cap = cap;
    s->nr = nr;
    s->rank = rank;
}

/* y = the rank-order sum of every rank's y (res == NULL), or res += that sum */
static void p2p_launch(tern_backend *be, float *res, float *y, size_t n, float *const *bufs, unsigned *const *flags,
                       unsigned *cnt, size_t cap, int nr, int rank) {
    tern__cuda *c = (tern__cuda *)be->impl;
    if (!n || nr < 2 || nr > TERN_TP_P2P_MAXR || n > cap) return;
    tp_ar_args a;
    memset(&a, 0, sizeof a);
    a.y = y;
    a.res = res;
    a.n = n;
    fill_sync(&a.s, bufs, flags, cnt, cap, nr, rank);
    tern_launch(c->stream, tp_ar_kernel, TERN_TP_P2P_BLOCKS, 512, 0, a);
    tern__cuda_check(c, res ? "tp_p2p_allreduce_add" : "tp_p2p_allreduce");
}

extern "C" void tern__cuda_tp_p2p_allreduce(tern_backend *be, float *y, size_t n, float *const *bufs,
                                            unsigned *const *flags, unsigned *cnt, size_t cap, int nr, int rank) {
    p2p_launch(be, NULL, y, n, bufs, flags, cnt, cap, nr, rank);
}

extern "C" void tern__cuda_tp_p2p_allreduce_add(tern_backend *be, float *x, float *y, size_t n, float *const *bufs,
                                                unsigned *const *flags, unsigned *cnt, size_t cap, int nr, int rank) {
    p2p_launch(be, x, y, n, bufs, flags, cnt, cap, nr, rank);
}

extern "C" void tern__cuda_tp_p2p_gather(tern_backend *be, float *dst, const float *src, int rows, int ld,
                                         const int *c0, const int *w, float *const *bufs, unsigned *const *flags,
                                         unsigned *cnt, size_t cap, int nr, int rank) {
    tern__cuda *c = (tern__cuda *)be->impl;
    if (rows <= 0 || nr < 2 || nr > TERN_TP_P2P_MAXR) return;
    tp_ga_args a;
    memset(&a, 0, sizeof a);
    a.dst = dst;
    a.src = src;
    a.rows = rows;
    a.ld = ld;
    for (int q = 0; q < nr; q++) {
        if ((size_t)rows * (size_t)w[q] > cap) return; /* the caller chunks the rows */
        a.c0[q] = c0[q];
        a.w[q] = w[q];
    }
    fill_sync(&a.s, bufs, flags, cnt, cap, nr, rank);
    tern_launch(c->stream, tp_ga_kernel, TERN_TP_P2P_BLOCKS, 512, 0, a);
    tern__cuda_check(c, "tp_p2p_gather");
}

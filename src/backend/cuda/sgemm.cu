/*
 * sgemm.cu — "skinny" GEMM: y = W·x for a few activation rows (9..64: batch decode, speculative
 * verification, short prompts) over BF16 weights in the plain bf16 mode, streaming every weight
 * byte once at close to the memory bandwidth, with the fused decode ops' epilogues in the same
 * launch: q|k|v (up to three matrices), act(gate)·up (SiLU / GELU-tanh) and y += W·x.
 *
 * Why: at 64 rows cuBLASLt ran llama3-8b's layer far below bandwidth (H200, eager profile, µs per call:
 * q|k|v 56.5 for 50 MB, o 22.5 for 34 MB, gate|up 80.9 for 235 MB, down 58.0 for 117 MB — the beta = 1
 * GEMMs and the small shapes the worst; NOTES (r)): too few tiles for 132 SMs, no K split, and a
 * separate elementwise kernel after gate|up.
 *
 * Tiling: a block of NW = 4 warps owns a tile of BM = 32·NW weight rows (8 warps × 256 rows, half the
 * x re-reads, measured slower at every op and row count: session 10) — of one matrix, or BM/2 gate rows + the
 * same BM/2 up rows in the GLU mode — and all NP = 8·NT activation rows (zero-padded), over a range
 * of K. K advances in steps of 64: the weight tile [BM][64] and the x tile [NP][64] (bf16, staged
 * by the caller: gemm.c's stage_x) go to shared memory through cp.async in a ring of SG_ST stages
 * (16-byte chunks xor-swizzled by row so ldmatrix is conflict-free); warp w multiplies weight rows
 * 32w..32w+31 by every x row (mma.sync m16n8k16, f32 accumulators, 2·NT fragments of 4).
 * The first weight stages are requested before pdl_wait (they do not depend on the previous kernel).
 * K split: when the tiles cannot fill the GPU (q, o, down at 64 rows: 32-48 tiles) the K range is
 * cut into S <= 8 parts (grid.y), and the S blocks of a tile are one thread-block cluster (sm_90):
 * each leaves its f32 tile in its shared memory, and after a cluster barrier every block sums its
 * share of the outputs over the S tiles in split order through distributed shared memory
 * (deterministic; no global partials, no counters). Without a split the block's own tile feeds
 * the epilogue, which writes y row by row (coalesced along the weight rows).
 * Numerics: bf16 x (rounded once by the caller) times BF16 W with f32 accumulation — the plain bf16
 * mode's contract (gemm.c), like the cuBLASLt GEMMs it replaces; the order of the sums differs, so
 * the bits differ from those (op tests: cuda_sgemm — both block shapes, forced splits, every epilogue —
 * and cuda_batch_fused at the bf16 bound).
 * Outcome (NOTES (r)): it beats cuBLASLt only for q|k|v (one launch for three matrices), so that is the
 * default (TERN_CUDA_SGEMM=1; =2 every op, =0 off: cuBLASLt); bench_cuda --sgemm compares.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma.cuh"

#include <cooperative_groups.h>
#include <stdlib.h>

namespace cg = cooperative_groups;

#define SG_BK 64    /* K per stage: 128 bytes per row = 8 chunks of 16 */
#define SG_ST 4     /* stages in the ring */
#define SG_SMAX 8   /* K parts: the blocks of one cluster (the portable cluster size) */

extern "C" {
int tern__cuda_sgemm_on = -1;  /* -1 until read from TERN_CUDA_SGEMM: 0 off, 1 q|k|v only (default), 2 every op */
int tern__cuda_sgemm_split = 0; /* 0: the rule below; S > 0: that many K parts (bench sweeps) */
}

struct SgArgs {
    const __nv_bfloat16 *w[3];
    float *y[3];
    int out[3], tiles[3], nm;
    const __nv_bfloat16 *x; /* [n][in] */
    int n, in, nk, mode, S;
};


template <int NP, int NW> constexpr int sg_smem() { return SG_ST * (32 * NW + NP) * SG_BK * 2; }

/* byte offset of 16-byte chunk ch of row r in a [rows][64] bf16 stage */
__device__ __forceinline__ uint32_t sg_off(int r, int ch) { return (uint32_t)(r * 128 + ((ch ^ (r & 7)) << 4)); }

/* NW warps: a tile of BM = 32·NW weight rows (4: 128 rows, 2 blocks per SM at 64 x rows; 8: 256 rows,
 * half the x re-reads per weight byte, 1 block per SM) */
template <int NT, int NW> __global__ void __launch_bounds__(NW * 32) sg_kernel(SgArgs a) {
    pdl_trigger();
    constexpr int SG_BM = 32 * NW, NTH = NW * 32, RS = NTH / 8; /* rows per pass of the chunk loads */
    constexpr int NP = NT * 8, WB = SG_BM * SG_BK * 2, STB = WB + NP * SG_BK * 2, XPT = (NP + RS - 1) / RS;
    constexpr int CL = SG_BM + 4; /* f32 row stride of the epilogue tile [NP][CL] */
    extern __shared__ __align__(128) unsigned char sg_smem_buf[];
    const uint32_t sbase = mma_smem_u32(sg_smem_buf);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int tile = blockIdx.x, split = blockIdx.y;
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    int m = 0, t = tile;
    if (!pair)
        while (m < a.nm - 1 && t >= a.tiles[m]) t -= a.tiles[m++];
    const int r0 = t * (pair ? SG_BM / 2 : SG_BM), out = a.out[m];
    const int kt0 = (int)((long)split * a.nk / a.S), kt1 = (int)((long)(split + 1) * a.nk / a.S);

    /* this thread's chunks: weight rows (tid >> 3) + RS·i (8 of them), chunk tid & 7; x rows likewise */
    const int ch = tid & 7, rb = tid >> 3;
    const __nv_bfloat16 *wrow[8];
    unsigned wok = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int r = rb + RS * i;
        int src = m, o = r0 + r;
        if (pair) { src = r >= SG_BM / 2; o = r0 + (r & (SG_BM / 2 - 1)); }
        const bool ok = o < out;
        wrow[i] = a.w[src] + (size_t)(ok ? o : 0) * a.in + ch * 8;
        wok |= (unsigned)ok << i;
    }
    auto load_w = [&](int kt, int st) {
        const uint32_t d = sbase + st * STB;
#pragma unroll
        for (int i = 0; i < 8; i++) mma_cp16(d + sg_off(rb + RS * i, ch), wrow[i] + (size_t)kt * SG_BK, (wok >> i) & 1);
    };
    auto load_x = [&](int kt, int st) {
        const uint32_t d = sbase + st * STB + WB;
#pragma unroll
        for (int i = 0; i < XPT; i++) {
            const int r = rb + RS * i;
            if (NP % RS && r >= NP) break; /* 8 warps, 16 x rows: half the threads */
            const bool ok = r < a.n;
            mma_cp16(d + sg_off(r, ch), a.x + (size_t)(ok ? r : 0) * a.in + (size_t)kt * SG_BK + ch * 8, ok);
        }
    };

    /* prologue: weights of the first stages before the previous kernel is waited for */
#pragma unroll
    for (int s = 0; s < SG_ST - 1; s++)
        if (kt0 + s < kt1) load_w(kt0 + s, s);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < SG_ST - 1; s++) {
        if (kt0 + s < kt1) load_x(kt0 + s, s);
        mma_cp_commit(); /* group s = its x (and, for s = 0, every weight stage above) */
    }

    float acc[2][NT][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

    for (int kt = kt0; kt < kt1; kt++) {
        const int st = (kt - kt0) % SG_ST;
        mma_cp_wait<SG_ST - 2>();
        __syncthreads(); /* stage st landed for every thread; stage (st - 1) is free */
        const int nx = kt + SG_ST - 1;
        if (nx < kt1) {
            load_w(nx, (nx - kt0) % SG_ST);
            load_x(nx, (nx - kt0) % SG_ST);
        }
        mma_cp_commit();
        const uint32_t ws = sbase + st * STB, xs = ws + WB;
#pragma unroll
        for (int ks = 0; ks < SG_BK / 16; ks++) {
            uint32_t af[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
                mma_ldsm_x4(af[mi], ws + sg_off(32 * warp + 16 * mi + (lane & 15), 2 * ks + (lane >> 4)));
#pragma unroll
            for (int nb = 0; nb < NT / 2; nb++) {
                uint32_t bf[4];
                mma_ldsm_x4(bf, xs + sg_off(16 * nb + (lane & 7) + ((lane >> 4) << 3), 2 * ks + ((lane >> 3) & 1)));
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    mma_bf16(acc[mi][2 * nb], af[mi], bf[0], bf[1]);
                    mma_bf16(acc[mi][2 * nb + 1], af[mi], bf[2], bf[3]);
                }
            }
        }
    }
    mma_cp_wait<0>();
    __syncthreads(); /* the ring is free: the f32 tile [NP][CL] goes where it was */

    float *cs = (float *)sg_smem_buf;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int r = 32 * warp + 16 * mi + gq, j = 8 * nt + 2 * tq;
            cs[j * CL + r] = acc[mi][nt][0];
            cs[(j + 1) * CL + r] = acc[mi][nt][1];
            cs[j * CL + r + 8] = acc[mi][nt][2];
            cs[(j + 1) * CL + r + 8] = acc[mi][nt][3];
        }
    __syncthreads();

    /* the tile's values: this block's own (no split), or the S blocks' of the cluster summed in split
     * order through distributed shared memory (every block sums its share of the outputs) */
    int i0 = 0, i1 = a.n * (pair ? SG_BM / 2 : SG_BM);
    const float *rp[8];
    cg::cluster_group cl = cg::this_cluster();
    if (a.S > 1) {
        cl.sync(); /* every block's tile is in its shared memory */
        for (int s = 0; s < 8; s++) rp[s] = cl.map_shared_rank(cs, s < a.S ? s : 0);
        const int rank = (int)cl.block_rank(), per = (i1 + a.S - 1) / a.S;
        i0 = rank * per;
        i1 = i1 < i0 + per ? i1 : i0 + per;
    }
    auto val = [&](int e) {
        if (a.S == 1) return cs[e];
        float v = 0.f;
#pragma unroll
        for (int s = 0; s < 8; s++)
            if (s < a.S) v += rp[s][e];
        return v;
    };
    if (pair) {
        float *y = a.y[0];
        for (int i = i0 + tid; i < i1; i += NTH) {
            const int j = i / (SG_BM / 2), r = i % (SG_BM / 2), o = r0 + r;
            if (o >= out) continue;
            const float gv = val(j * CL + r), uv = val(j * CL + r + SG_BM / 2);
            y[(size_t)j * out + o] = (a.mode == G1_SILU ? silu(gv) : gelu_tanh(gv)) * uv;
        }
    } else {
        float *y = a.y[m];
        for (int i = i0 + tid; i < i1; i += NTH) {
            const int j = i / SG_BM, r = i % SG_BM, o = r0 + r;
            if (o >= out) continue;
            const float v = val(j * CL + r);
            if (a.mode == G1_RES) y[(size_t)j * out + o] += v;
            else y[(size_t)j * out + o] = v;
        }
    }
    if (a.S > 1) cl.sync(); /* the others' shared memory stays until every read of it is done */
}

extern "C" int tern__cuda_sgemm_level(void) {
    if (tern__cuda_sgemm_on < 0) tern__cuda_sgemm_on = tern__cuda_env_int("TERN_CUDA_SGEMM", 1);
    return tern__cuda_sgemm_on;
}

/* launch one instance (NT x-row fragments, NW warps) over T tiles x S parts, the S parts of a tile
 * one cluster (also when S = 1) */
template <int NT, int NW> static cudaError_t sg_launch(cudaStream_t st, int T, int S, const SgArgs &a) {
    return tern_launch_cluster(st, sg_kernel<NT, NW>, dim3(T, S), dim3(NW * 32), sg_smem<NT * 8, NW>(), S, a);
}

template <int NT, int NW> static void sg_allow() {
    cudaFuncSetAttribute(sg_kernel<NT, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize, sg_smem<NT * 8, NW>());
}

extern "C" void tern__cuda_sgemm_init(tern__cuda *c) {
    (void)c;
    sg_allow<2, 4>(); sg_allow<4, 4>(); sg_allow<8, 4>();
    cudaGetLastError();
}

extern "C" int tern__cuda_sgemm(tern__cuda *c, int k, float *const *y, const void *xb, int n,
                                const tern__cuda_w *const *w, int mode) {
    /* H200, llama3-8b shapes (bench_cuda --sgemm, NOTES (r)): q|k|v in one launch beats cuBLASLt at every
     * row count (n = 16: 19.5 vs 34.4 us; 64: 24.3 vs 32.7), the single-matrix ops lose from 32 rows on
     * (gate|up 76 vs 72, down 72 vs 44, o 31 vs 15 us at 64) and tie below: level 1 takes q|k|v only */
    if (tern__cuda_sgemm_level() < (k >= 2 && mode == G1_PLAIN ? 1 : 2)) return 0;
    if (n < 1 || n > 64 || k < 1 || k > 3) return 0;
    const bool pair = mode == G1_SILU || mode == G1_GELU;
    if ((pair && k != 2) || (mode == G1_RES && k != 1) || ((uintptr_t)xb & 15)) return 0;
    const int in = w[0]->in;
    if (in <= 0 || in % SG_BK) return 0;
    SgArgs a = {};
    constexpr int NW = 4, SG_BM = 32 * NW;
    int T = 0;
    for (int i = 0; i < k; i++) {
        if (w[i]->dtype != TERN_DT_BF16 || w[i]->in != in || w[i]->out <= 0 || ((uintptr_t)w[i]->data & 15)) return 0;
        a.w[i] = (const __nv_bfloat16 *)w[i]->data;
        a.y[i] = y[i];
        a.out[i] = w[i]->out;
        a.tiles[i] = (w[i]->out + SG_BM - 1) / SG_BM;
        T += a.tiles[i];
    }
    if (pair) {
        if (w[1]->out != w[0]->out) return 0;
        a.tiles[0] = T = (w[0]->out + SG_BM / 2 - 1) / (SG_BM / 2);
    }
    const int NT = n <= 16 ? 2 : n <= 32 ? 4 : 8;
    a.nk = in / SG_BK;
    /* K split: about two blocks per SM when the tiles alone cannot fill the GPU, >= 8 K steps each */
    const int slots = 2 * c->n_sm; /* resident blocks the GPU holds at 64 x rows */
    int S = tern__cuda_sgemm_split > 0 ? tern__cuda_sgemm_split : (slots + T / 2) / T;
    if (S > (NT == 8 ? 4 : SG_SMAX)) S = NT == 8 ? 4 : SG_SMAX; /* 64 rows: 4 parts beat 6 (24.3 vs 33.6 us, q|k|v) */
    if (S > a.nk / 8) S = a.nk / 8;
    if (S < 1) S = 1;
    a.nm = k; /* pair mode: k = 2 (gate, up) */
    a.x = (const __nv_bfloat16 *)xb;
    a.n = n;
    a.in = in;
    a.mode = mode;
    a.S = S;
    cudaSetDevice(c->device);
    const cudaStream_t st = c->stream;
    const cudaError_t e = NT == 2 ? sg_launch<2, NW>(st, T, S, a) : NT == 4 ? sg_launch<4, NW>(st, T, S, a)
                                  : sg_launch<8, NW>(st, T, S, a);
    if (e != cudaSuccess) { /* e.g. no room for a cluster: the caller takes cuBLASLt */
        cudaGetLastError();
        return 0;
    }
    tern__cuda_check(c, "sgemm");
    return 1;
}

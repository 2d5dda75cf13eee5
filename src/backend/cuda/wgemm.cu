/*
 * wgemm.cu — the plain bf16 GEMM of a decode batch, y [n][m] (+)= X [n][k] · W [m][k]ᵀ for 17..128 rows, on the
 * Tensor Memory Accelerator and Hopper's warpgroup MMA (sm_90a only: built for that target alone; elsewhere, or
 * with TERN_CUDA_WGEMM=0, cuBLASLt runs it). lt_gemm.c's lt_gemm_t hands it every f32-output, one-matrix GEMM of
 * BF16 weights it can take. Opt-in: on the H200 it is correct but slower than cuBLASLt at every shape (session 28,
 * bench/NOTES.md (ao): at 64 rows down 44.7 vs 35.7 µs, o 20.4 vs 11.2, head 325 vs 278), and probes put the loss in
 * the weights' TMA stream itself (no X copies, no MMAs: down still 39.8 µs) — the next step is a weight layout read by
 * one 1-D bulk copy a stage.
 *
 * Why: at 64 rows cuBLASLt ran llama3-8b's down projection (4096x14336, += y) at 3.1 TB/s, o (4096x4096) at 2.7
 * and q|k|v (6144x4096) at 2.8, against 3.85 for gate|up (bench/NOTES.md (am), (an)); none of the 1717
 * configurations it accepts did better. These GEMMs have few output tiles (32 of 128 features for down and o),
 * so the weights stream only when K is split over many blocks, and the split must be summed cheaply.
 *
 * Shape: the weights are the MMA's A (two warpgroups × two m64: 256 output features a block), the batch rows its B
 * (N = 32 / 64 / 128 rows a tile) — swap-AB, so a 40-row batch wastes nothing on the weight side, and each X tile
 * read serves 256 features (X is re-read once per feature tile: at 128-feature tiles it cost as many bytes as the
 * weights at 128 rows, and the first version lost everywhere). A block owns 256 features × one K range: K is cut
 * into S = 1..8 parts (grid.y), picked so the blocks fill the SMs (one block an SM, ~180-200 KB of shared memory)
 * with the fewest K tiles a block. One producer thread (warp 8) streams (W tile 256 x 64, X tile NB x 64) pairs
 * into a ring of ST stages by TMA (cp.async.bulk.tensor, 128-byte swizzle: exactly the K-major tiles qw_desc
 * describes), each stage's arrival counted by an mbarrier; the weight copies of the first ST stages go out before
 * pdl_wait (they depend on nothing the previous kernel writes). Each consumer warpgroup waits for a stage, issues 8
 * wgmma m64nNBk16 with both operands from shared memory, waits for them and frees the stage (one arrival a warp).
 * Afterwards the accumulators go to shared memory as [row][feature]; the S blocks of a tile are one thread-block
 * cluster and every block sums its share of the rows over the S tiles through distributed shared memory in split
 * order (deterministic), adds y when asked and writes float4 rows. Out-of-range rows / features / inputs read as
 * zeros (TMA fills them) and are not written.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/wgmma.cuh"
#include "backend/cuda/tma.cuh"

#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>

namespace cg = cooperative_groups;

extern "C" int tern__cuda_wgemm_on, tern__cuda_wgemm_min;
int tern__cuda_wgemm_on = -1;  /* -1 unread (TERN_CUDA_WGEMM); tests set it */
int tern__cuda_wgemm_min = -1; /* -1 unread (TERN_CUDA_WGEMM_MIN, 17 rows); tests set it */
extern "C" unsigned long long tern__cuda_wgemm_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_wgemm_calls = 0;

#define WG_MAXN 128 /* rows a launch serves (one tile) */
#define WG_THREADS 288
#define WG_FM 256 /* features a block: two warpgroups × two m64 */
#define WG_PLD (WG_FM + 4) /* floats a row of the [row][feature] tile: 8·(lane & 3) + lane / 4 spreads a store over the banks */

/* the kernel's flags: WG_ROT (TERN_CUDA_WGEMM_ROT, default on) the blocks start their K walks at different tiles
 * (H200: a tie); WG_WDYN (set by the launcher when W lies in gemm_scratch) W is the previous kernel's output, so no
 * copy goes out before pdl_wait; probes for bench_cuda --wgemm, all giving wrong results: WG_NOX
 * (TERN_CUDA_WGEMM_NOX=1) no X copies, WG_NOMMA (_NOMMA=1) the stages consumed without their MMAs, WG_BULK (_BULK=1)
 * each stage's weights as one contiguous 1-D bulk copy of the block's own run of the matrix (the layout a repack at
 * upload would give) */
enum { WG_ROT = 1, WG_NOX = 2, WG_NOMMA = 4, WG_BULK = 8, WG_WDYN = 16 };

template <int NB> struct WgGeo {
    static constexpr int WB = WG_FM * 128;           /* W tile: 256 features x 64 inputs, bf16 (one TMA box) */
    static constexpr int XB = NB * 128;              /* X tile: NB rows x 64 inputs */
    static constexpr int STG = WB + XB;
    static constexpr int ST = NB == 128 ? 4 : 5;     /* 180-192 KB of ring: one block an SM */
    static constexpr int RING = ST * STG;
    static constexpr size_t SMEM = (size_t)RING + 16 * ST + 1024; /* + barriers + alignment */
    static_assert(NB * WG_PLD * 4 <= RING, "the [row][feature] tile reuses the ring");
};

template <int NB>
__global__ void __launch_bounds__(WG_THREADS, 1)
    wg_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, float *y, int ldy,
              int m, int n, int nkt, int add, int flags, const uint8_t *wraw) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using G = WgGeo<NB>;
    extern __shared__ uint8_t wg_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)wg_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t s0 = mma_smem_u32(sm), full = s0 + G::RING, empty = full + 8 * G::ST;
    const int tid = threadIdx.x, S = (int)gridDim.y, ks = (int)blockIdx.y;
    const int f0 = (int)blockIdx.x * WG_FM, r0 = (int)blockIdx.z * NB;
    const int kt0 = (int)((long long)nkt * ks / S), cnt = (int)((long long)nkt * (ks + 1) / S) - kt0;
    if (tid == 256) {
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tw) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tx) : "memory");
        for (int i = 0; i < G::ST; i++) {
            mb_init(full + 8 * i, 1);
            mb_init(empty + 8 * i, 8); /* one arrival per consumer warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    pdl_trigger();
    float acc[2][NB / 2];
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < NB / 2; i++) acc[h][i] = 0.0f;
    if (tid == 256) { /* the producer */
        /* WG_ROT: all the blocks reading the same X tile at once might queue on the few L2 slices that hold it */
        const int pre = cnt < G::ST ? cnt : G::ST,
                  r = (flags & WG_ROT) && cnt > 0 ? (int)((blockIdx.x * 5u) % (unsigned)cnt) : 0;
        const bool nox = flags & WG_NOX;
        if (flags & WG_WDYN) pdl_wait(); /* gemm.c's dequantized rows in scratch */
        const unsigned sb = nox ? G::WB : G::STG;
        auto kin = [&](int i) { return (kt0 + (i + r) % cnt) * 64; }; /* tile i's first input */
        auto wload = [&](uint32_t dst, int i, uint32_t bar) {
            if (flags & WG_BULK) {
                const size_t blk = (size_t)blockIdx.x * gridDim.y + blockIdx.y, off = (blk * (size_t)nkt / gridDim.y + i) *
                                                                                        (size_t)G::WB;
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                             "l"(wraw + off), "r"((unsigned)G::WB), "r"(bar)
                             : "memory");
            } else {
                tma_2d(dst, &tw, kin(i), f0, bar);
            }
        };
        for (int i = 0; i < pre; i++) {
            mb_expect(full + 8 * i, sb);
            wload(s0 + i * G::STG, i, full + 8 * i);
        }
        pdl_wait(); /* X is the previous kernel's output */
        for (int i = 0; i < pre && !nox; i++) tma_2d(s0 + i * G::STG + G::WB, &tx, kin(i), r0, full + 8 * i);
        for (int i = pre; i < cnt; i++) {
            const int s = i % G::ST;
            mb_wait(empty + 8 * s, ((i / G::ST) - 1) & 1);
            mb_expect(full + 8 * s, sb);
            wload(s0 + s * G::STG, i, full + 8 * s);
            if (!nox) tma_2d(s0 + s * G::STG + G::WB, &tx, kin(i), r0, full + 8 * s);
        }
    } else {
        pdl_wait(); /* y is read below */
        if (tid < 256) { /* the consumers: warpgroup g takes features 128g..128g+127 of the block's 256 */
            const uint32_t ga = (uint32_t)(tid >> 7) * 16384;
            for (int i = 0; i < cnt; i++) {
                const int s = i % G::ST;
                mb_wait(full + 8 * s, (i / G::ST) & 1);
                const uint32_t wa = s0 + s * G::STG + ga, xa = s0 + s * G::STG + G::WB;
                if (flags & WG_NOMMA) { /* the stream alone */
                    __syncwarp();
                    if ((tid & 31) == 0) mb_arrive(empty + 8 * s);
                    continue;
                }
                qw_fence();
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const uint64_t db = qw_desc(xa + 32 * j);
                    qw_mma_ss<NB / 8>(acc[0], qw_desc(wa + 32 * j), db);
                    qw_mma_ss<NB / 8>(acc[1], qw_desc(wa + 8192 + 32 * j), db);
                }
                qw_commit();
                qw_wait();
                __syncwarp();
                if ((tid & 31) == 0) mb_arrive(empty + 8 * s);
            }
        }
    }
    __syncthreads(); /* every stage consumed: the ring becomes the [row][feature] tile */
    float *P = (float *)sm;
    if (tid < 256) {
        const int l = tid & 31, fr = (tid >> 7) * 128 + 16 * ((tid >> 5) & 3) + (l >> 2);
#pragma unroll
        for (int hm = 0; hm < 2; hm++)
#pragma unroll
            for (int j = 0; j < NB / 8; j++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int c = 0; c < 2; c++)
                        P[(8 * j + 2 * (l & 3) + c) * WG_PLD + fr + 64 * hm + 8 * h] = acc[hm][4 * j + 2 * h + c];
    }
    cg::cluster_group cl = cg::this_cluster();
    const float *rp[8];
    int rank = 0;
    if (S > 1) {
        cl.sync(); /* every block's tile is in its shared memory */
        rank = (int)cl.block_rank();
#pragma unroll
        for (int s = 0; s < 8; s++) rp[s] = cl.map_shared_rank(P, s < S ? s : 0);
    } else {
        __syncthreads();
#pragma unroll
        for (int s = 0; s < 8; s++) rp[s] = P;
    }
    const int per = (NB + S - 1) / S, rb = rank * per, re = rb + per < NB ? rb + per : NB;
    for (int e = rb * (WG_FM / 4) + tid; e < re * (WG_FM / 4); e += WG_THREADS) {
        const int rr = e / (WG_FM / 4), f = 4 * (e % (WG_FM / 4)), row = r0 + rr, col = f0 + f;
        if (row >= n || col >= m) continue;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int s = 0; s < 8; s++)
            if (s < S) {
                const float4 p = *(const float4 *)(rp[s] + rr * WG_PLD + f);
                v.x += p.x;
                v.y += p.y;
                v.z += p.z;
                v.w += p.w;
            }
        float4 *yp = (float4 *)(y + (size_t)row * ldy + col);
        if (add) {
            const float4 o = *yp;
            v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
        }
        *yp = v;
    }
    if (S > 1) cl.sync(); /* no block leaves while another reads its tile */
#else
    (void)tw; (void)tx; (void)y; (void)ldy; (void)m; (void)n; (void)nkt; (void)add; (void)flags; (void)wraw;
    __trap(); /* not reached: the launcher runs this only where the sm_90a image loaded */
#endif
}

/* cuTensorMapEncodeTiled through the runtime (no link against the driver library) */
static PFN_cuTensorMapEncodeTiled_v12000 wg_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    static int tried = 0;
    if (!tried) {
        tried = 1;
        cudaDriverEntryPointQueryResult q;
        void *p = NULL;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
        cudaGetLastError();
    }
    return fn;
}

/* tma.cuh */
bool tern__cuda_tmap_ok(void) { return wg_encoder() != NULL; }

/* tma.cuh */
bool tern__cuda_tmap_2d(CUtensorMap *t, const void *base, CUtensorMapDataType dt, uint64_t d0, uint64_t rows,
                        uint64_t stride, uint32_t b0, uint32_t b1, CUtensorMapSwizzle sw, int l2) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = wg_encoder();
    if (!enc) return false;
    const cuuint64_t dim[2] = {(cuuint64_t)d0, (cuuint64_t)rows}, st[1] = {(cuuint64_t)stride};
    const cuuint32_t box[2] = {b0, b1}, es[2] = {1, 1};
    static const CUtensorMapL2promotion P[4] = {CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
                                                CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B};
    return enc(t, dt, 2, (void *)base, dim, st, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw, P[l2 & 3],
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* rows x k bf16, row stride k: boxes of 64 inputs x box_rows rows, 128-byte swizzle, zeros outside */
static bool wg_map(CUtensorMap *t, const void *base, int k, int rows, int box_rows) {
    static int l2p = -1; /* TERN_CUDA_WGEMM_L2P: 0 none, 1 64 B, 2 128 B, 3 256 B (default) */
    if (l2p < 0) l2p = tern__cuda_env_int("TERN_CUDA_WGEMM_L2P", 3) & 3;
    return tern__cuda_tmap_2d(t, base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (uint64_t)k, (uint64_t)rows, (uint64_t)k * 2,
                              64, (uint32_t)box_rows, CU_TENSOR_MAP_SWIZZLE_128B, l2p);
}

/* per device: 1 the instances' shared-memory limits are set (the sm_90a image loaded), -1 they failed */
static signed char wg_ready[64];
static bool wg_init(int dev) {
    if (dev < 0 || dev >= 64) return false;
    if (!wg_ready[dev]) {
        const cudaFuncAttribute at = cudaFuncAttributeMaxDynamicSharedMemorySize;
        const bool ok = cudaFuncSetAttribute(wg_kernel<32>, at, (int)WgGeo<32>::SMEM) == cudaSuccess &&
                        cudaFuncSetAttribute(wg_kernel<64>, at, (int)WgGeo<64>::SMEM) == cudaSuccess &&
                        cudaFuncSetAttribute(wg_kernel<128>, at, (int)WgGeo<128>::SMEM) == cudaSuccess;
        cudaGetLastError();
        wg_ready[dev] = ok ? 1 : -1;
    }
    return wg_ready[dev] > 0;
}

static void wg_env(void) {
    if (tern__cuda_wgemm_on < 0) tern__cuda_wgemm_on = tern__cuda_env_int("TERN_CUDA_WGEMM", 0) != 0;
    if (tern__cuda_wgemm_min < 0) tern__cuda_wgemm_min = tern__cuda_env_int("TERN_CUDA_WGEMM_MIN", 17);
}

/* gemm.h; when switched on later (tests), the first call does this (outside a capture there) */
extern "C" void tern__cuda_wgemm_init(tern__cuda *c) {
    wg_env();
    if (tern__cuda_wgemm_on && wg_encoder()) wg_init(c->device);
}

/* K parts (1..8, TERN_CUDA_WGEMM_S forces one): the fewest K tiles a block over the waves the blocks take (one block
 * an SM); ties to fewer parts */
static int wg_split(int tiles, int nkt, int sms) {
    static int force = -1;
    if (force < 0) force = tern__cuda_env_int("TERN_CUDA_WGEMM_S", 0);
    if (force >= 1 && force <= 8) return force;
    const long long slots = sms > 0 ? sms : 132;
    int best = 1;
    long long best_cost = -1;
    for (int s = 1; s <= 8; s++) {
        const long long waves = ((long long)tiles * s + slots - 1) / slots, cost = waves * ((nkt + s - 1) / s);
        if (best_cost < 0 || cost < best_cost) best_cost = cost, best = s;
    }
    return best;
}

/* the flags the switches set (WG_ROT, the probes) */
static int wg_flags(void) {
    static int v = -1;
    if (v < 0)
        v = (tern__cuda_env_int("TERN_CUDA_WGEMM_ROT", 1) ? WG_ROT : 0) | (tern__cuda_env_int("TERN_CUDA_WGEMM_NOX", 0) ? WG_NOX : 0) |
            (tern__cuda_env_int("TERN_CUDA_WGEMM_NOMMA", 0) ? WG_NOMMA : 0) | (tern__cuda_env_int("TERN_CUDA_WGEMM_BULK", 0) ? WG_BULK : 0);
    return v;
}

/* gemm.c: y [n][ldy] (+ y when add) = X [n][k] · W [m][k]ᵀ, bf16 X and W, f32 y. 1 when launched, 0 when not
 * served (nothing written) */
extern "C" int tern__cuda_wgemm(tern__cuda *c, float *y, int ldy, const void *w, const void *x, int m, int n, int k,
                                int add) {
    wg_env();
    if (!tern__cuda_wgemm_on || n < tern__cuda_wgemm_min || n < 1 || n > WG_MAXN || m < 4 || m % 4 || k < 8 ||
        k % 8 || ldy < m || ldy % 4 || ((uintptr_t)y | (uintptr_t)w | (uintptr_t)x) & 15)
        return 0;
    if (!wg_init(c->device)) return 0;
    const int nb = n <= 32 ? 32 : n <= 64 ? 64 : 128, tiles = (m + WG_FM - 1) / WG_FM, nkt = (k + 63) / 64;
    CUtensorMap tw, tx;
    if (!wg_map(&tw, w, k, m, WG_FM) || !wg_map(&tx, x, k, n, nb)) return 0;
    const int S = wg_split(tiles, nkt, c->n_sm);
    /* the first weight copies go out before pdl_wait only for stored weights: gemm.c's quantized / FP8 path hands over
     * rows its dequantize kernel has just written into gemm_scratch (session 28: copied early, they were read before
     * being written — batched parity rows of gemma4_dense_q4g64 / gemma4_moe_mixed / glm5_dsa_fp8 wrong) */
    const uint8_t *ws = (const uint8_t *)c->gemm_scratch;
    const int flags = wg_flags() | ((const uint8_t *)w >= ws && (const uint8_t *)w < ws + c->gemm_scratch_bytes ? WG_WDYN : 0);
    void (*kern)(CUtensorMap, CUtensorMap, float *, int, int, int, int, int, int, const uint8_t *) =
        nb == 32 ? wg_kernel<32> : nb == 64 ? wg_kernel<64> : wg_kernel<128>;
    const size_t smem = nb == 32 ? WgGeo<32>::SMEM : nb == 64 ? WgGeo<64>::SMEM : WgGeo<128>::SMEM;
    const cudaError_t e = tern_launch_cluster(c->stream, kern, dim3((unsigned)tiles, (unsigned)S, 1), dim3(WG_THREADS),
                                              smem, S > 1 ? S : 0, tw, tx, y, ldy, m, n, nkt, add, flags,
                                              (const uint8_t *)w);
    if (e != cudaSuccess) { /* e.g. no room for a cluster: the caller takes cuBLASLt */
        cudaGetLastError();
        return 0;
    }
    tern__cuda_wgemm_calls++;
    return 1;
}

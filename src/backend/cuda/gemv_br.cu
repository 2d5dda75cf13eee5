/*
 * gemv_br.cu — gemv_mma.cu's XP1 walk (Q4, groups of 64, BF16 scales, the plain bf16 mode's one-row GEMV) with
 * its weights fed through a per-warp ring of bulk copies in shared memory instead of registers (TERN_CUDA_GEMV_BR,
 * opt-in, session 67: written without a GPU, not yet timed).
 *
 * Why: the walk is bound by its load skeleton, not its math (bench/NOTES.md (u): the skeleton alone runs 13.1 of
 * the walk's 16.8 µs on 14336x4096; the int8 walk halves the math at the same speed; a walk fed from L2 runs ~2×
 * faster, (bw)). Its next chunk lands in a second register set (PP), so a warp has at most one chunk (16 rows ×
 * 256 bytes) in flight, issued step by step during the current chunk's math; 16 warps an SM. The removed
 * gemv_ring.cu held more in flight through per-lane cp.async, but with one block of 8 warps an SM it was bound by
 * issue latency (7.3 cycles between a warp's instructions). Here:
 *   - a block is W walkers of 8 warps (v = warp / 8) sharing the slice's staged x table — W = 2 (BR=1): 16 warps,
 *     one block an SM; W = 1 (BR=2): 8 warps, two blocks an SM as the walk; walker v walks the row blocks
 *     blockIdx.x + (Wk + v)·gridDim.x, so the block as a whole walks the row blocks mm_reduce_slices expects of it
 *     (blockIdx.x + k·gridDim.x);
 *   - a warp's chunk (16 rows × 256 bytes of codes, their 8 scales and 8 biases a row) is one warp instruction of
 *     bulk copies (cp.async.bulk, counted on the slot's mbarrier): lanes 0..15 copy row lane's codes (odd rows
 *     rotated by 64 bytes, so the 8 lanes of a quarter warp read disjoint banks), lanes 16..31 its scales and biases;
 *   - two slots a warp: a chunk's words go to registers (8 shared loads a lane), then the chunk two ahead is
 *     copied into the freed slot, then the math — so two chunks are in flight during a chunk's math, no registers
 *     held for them, and the first two go out before pdl_wait (weights only).
 * The math is the walk's (mm_mmas1, mm_fold1, mm_finish, mm_reduce_slices over the same J and K slices): the same
 * bits as gemv_mma.cu's XP1 walk (op test cuda_gemv_br_bits).
 * Served: XP1 + FOLD walks of BF16-scaled Q4 g64 at two blocks an SM with the PP walk on, every mode but the rope
 * epilogue, K a multiple of 512 (whole chunks), groups a row a multiple of 8 (16-byte aligned scale runs), 16-byte
 * aligned matrices; the rest stays on the walk.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/gemv_mma_args.cuh"
#include "backend/cuda/mma.cuh"

#define BR_S 4                           /* steps (64 bytes of a row) a chunk: the walk's S at q4 g64 */
#define BR_CODES (16 * 64 * BR_S)        /* a chunk's codes: 16 rows × 256 bytes */
#define BR_SLOT (BR_CODES + 2 * 16 * 16) /* + 16 rows × 8 scales, then 8 biases (BF16) */

extern "C" unsigned long long tern__cuda_gemv_br_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_gemv_br_calls = 0;

/* W walkers of 8 warps a block (W = 2: one block of 16 warps an SM; W = 1: two blocks of 8, each its own table) */
template <int W>
__global__ void __launch_bounds__(W * 256, 2 / W) gemv_br_kernel(MmArgs a) {
    constexpr int S = BR_S, GPS = 2, GB = 32, NW = 8 * W;
    pdl_trigger();
    extern __shared__ __align__(16) uint8_t br_sm[];
    __shared__ __align__(8) uint64_t bars[NW][2];
    __shared__ int mine[MM_MINE], nmine;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int v = warp >> 3, wv = warp & 7;
    uint8_t *ring = br_sm + (size_t)warp * 2 * BR_SLOT;
    uint2 *tbl = (uint2 *)(br_sm + (size_t)NW * 2 * BR_SLOT); /* [J·S][8 MMAs][32 lanes] */
    float *xs = (float *)(tbl + a.J * S * 8 * 32);                  /* [J·S][GPS] Σx */
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    const int st0 = blockIdx.y * S * a.J, nch = min(S * a.J, a.in / 128 - st0) / S; /* whole chunks (launch) */
    const size_t rb = (size_t)a.in / 2;
    const uint32_t bar0 = mma_smem_u32(&bars[warp][0]), ring0 = mma_smem_u32(ring);
    auto rblock = [&](int n) { return (int)blockIdx.x + (W * (n / nch) + v) * (int)gridDim.x; }; /* unit n's */
    if (lane == 0) {
        mb_init(bar0, 1);
        mb_init(bar0 + 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncwarp();
    /* unit n (row block rblock(n), chunk n % nch) into slot n & 1 */
    auto issue = [&](int n) {
        const int q = rblock(n);
        if (q >= a.rblocks) return;
        const int slot = n & 1, r = lane & 15, st = st0 + (n % nch) * S;
        const uint32_t bar = bar0 + 8 * slot, dst = ring0 + slot * BR_SLOT;
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* this slot's reads before the copies' writes */
        if (lane == 0) mb_expect(bar, BR_SLOT);
        __syncwarp();
        MmRows p;
        mm_rows(a, q * MM_WARPS + wv, r & 7, 0, rb, pair, p); /* row r: w0 of r < 8, w1 (g + 8 / the up row) else */
        if (lane < 16) {
            const uint8_t *src = (r < 8 ? p.w0 : p.w1) + (size_t)st * 64;
            const uint32_t d = dst + r * 256;
            if (r & 1) {
                mb_bulk(d + 64, src, 192, bar);
                mb_bulk(d, src + 192, 64, bar);
            } else {
                mb_bulk(d, src, 256, bar);
            }
        } else {
            const int G = st * GPS;
            mb_bulk(dst + BR_CODES + r * 16, (r < 8 ? p.s0 : p.s1) + G, 16, bar);
            mb_bulk(dst + BR_CODES + 256 + r * 16, (r < 8 ? p.b0 : p.b1) + G, 16, bar);
        }
    };
    issue(0);
    issue(1);
    pdl_wait(); /* x, y, the partials and the counters after the previous kernel */
    mm_stage_x<4, GB, S, 1>(a, tbl, xs, st0, nch * S);
    __syncthreads();

    const uint2 *tl = tbl + lane;
    const int units = pair ? 2 * a.rows : a.rows, rot = (g & 1) * 64;
    float *pp = a.part + (size_t)blockIdx.y * units;
    float acc0 = 0.0f, acc1 = 0.0f;
    for (int n = 0;; n++) {
        const int q = rblock(n), ch = n % nch, slot = n & 1;
        if (q >= a.rblocks) break;
        mb_wait(bar0 + 8 * slot, (n >> 1) & 1);
        const uint8_t *sp = ring + slot * BR_SLOT;
        uint32_t wa[S][4], wc[S][4];
#pragma unroll
        for (int sl = 0; sl < S; sl++) {
            const int o = (64 * sl + 16 * t + rot) & 255;
            const uint4 u0 = *(const uint4 *)(sp + g * 256 + o), u1 = *(const uint4 *)(sp + (g + 8) * 256 + o);
            wa[sl][0] = u0.x; wa[sl][1] = u0.y; wa[sl][2] = u0.z; wa[sl][3] = u0.w;
            wc[sl][0] = u1.x; wc[sl][1] = u1.y; wc[sl][2] = u1.z; wc[sl][3] = u1.w;
        }
        /* lane (g, t): groups 2t, 2t + 1 of the chunk (mm_pair_scales' pairs) of rows g and g + 8 */
        const uint32_t q0 = *(const uint32_t *)(sp + BR_CODES + g * 16 + 4 * t),
                       q1 = *(const uint32_t *)(sp + BR_CODES + 256 + g * 16 + 4 * t),
                       q2 = *(const uint32_t *)(sp + BR_CODES + (g + 8) * 16 + 4 * t),
                       q3 = *(const uint32_t *)(sp + BR_CODES + 256 + (g + 8) * 16 + 4 * t);
        __syncwarp();
        issue(n + 2);
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int sl = 0; sl < S; sl++) mm_mmas1<true>(d, wa[sl], wc[sl], tl, ch * S + sl, a.magic);
        mm_fold1<GPS, S, false, true>(acc0, acc1, d, q0, q1, q2, q3, xs, ch * S, S, t);
        if (ch == nch - 1) {
            MmRows r;
            mm_rows(a, q * MM_WARPS + wv, g, t, rb, pair, r);
            mm_finish(a, acc0, acc1, r.unit0, r.unit1, r.live0, r.live1, pair, t, pp);
            acc0 = acc1 = 0.0f;
        }
    }
    if (a.ks == 1) return;
    mm_reduce_slices(a, pair, units, mine, &nmine);
}

/* TERN_CUDA_GEMV_BR (default 0; read once; tests set it): 1 blocks of two walkers (16 warps, one an SM), 2 blocks of
 * one walker (8 warps, two an SM, each staging its own x table) */
extern "C" int tern__cuda_gemv_br;
int tern__cuda_gemv_br = -1;

/* Launch the ring walk for the plan in a (gemv_mma.cu's mm_launch: its arguments and the walk's grid.x for two
 * blocks of 8 warps an SM); 0 when switched off or not served (the caller runs the walk) */
int tern__cuda_gemv_br_launch(tern__cuda *c, const MmArgs &a, int walk_gx) {
    if (tern__cuda_gemv_br < 0) tern__cuda_gemv_br = tern__cuda_env_int("TERN_CUDA_GEMV_BR", 0);
    const int wk = tern__cuda_gemv_br == 1 ? 2 : tern__cuda_gemv_br == 2 ? 1 : 0; /* walkers a block */
    if (!wk || a.in % 512 || a.ng % 8) return 0;
    for (int i = 0; i < a.nm; i++)
        if (((uintptr_t)a.data[i] | (uintptr_t)a.scales[i] | (uintptr_t)a.biases[i]) & 15) return 0;
    int gx = (walk_gx + wk - 1) / wk;
    if ((a.rblocks + gx - 1) / gx > MM_MINE) gx = (a.rblocks + MM_MINE - 1) / MM_MINE;
    const size_t smem = (size_t)wk * 8 * 2 * BR_SLOT + (size_t)a.J * BR_S * (8 * 32 * sizeof(uint2) + 2 * sizeof(float));
    static size_t attr[3];
    void (*k)(MmArgs) = wk == 2 ? gemv_br_kernel<2> : gemv_br_kernel<1>;
    if (smem > attr[wk]) {
        if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        attr[wk] = smem;
    }
    tern_launch(c->stream, k, dim3((unsigned)gx, (unsigned)a.ks), wk * 256, smem, a);
    tern__cuda_check(c, "gemv_br");
    tern__cuda_gemv_br_calls++;
    return 1;
}

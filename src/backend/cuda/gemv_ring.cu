/*
 * gemv_ring.cu — the Q4 one-row GEMV of the plain bf16 mode with its weight stream in shared memory.
 *
 * Same arithmetic as gemv_mma.cu's XP1 kernel (x as one bf16 MMA column per group, a chunk's groups in
 * one tile folded once, FOLD's bias; gemv_mma.cuh mm_mmas1 / mm_fold1) and the same launch layout (warp
 * = 16 rows, block = 8 warps = a 128-row block, K slices of J chunks on blockIdx.y, row blocks walked
 * blockIdx.x, +gridDim.x, ..., split-K partials summed by the last slice block), so for the same plan
 * it gives the same bits. What differs is where the bytes wait: ncu of the register walk (NOTES (u))
 * showed 56 % of its cycles stalled on global loads with 16 warps per SM and one chunk in flight per
 * warp. Here every lane copies its own 16-byte pieces (rows g and g+8, S steps) and its four scale /
 * bias pairs of a chunk into a private slot of a ring of RG_R chunks (cp.async), so RG_R - 1 chunks
 * per warp are in flight while one is multiplied, without holding them in registers. A lane reads
 * only what it copied itself: cp.async.wait_group is the only synchronisation in the walk.
 *
 * Shared memory per block: ring words [warp][slot][2·S][lane] uint4 (S = 4: 16 KB per warp and 4
 * slots), scales [warp][slot][4][lane] u32, then the staged B table and Σx of gemv_mma.cuh mm_stage.
 * One block per SM (~180 KB at J = 4). Needs an even number of groups per row (4-byte scale pairs).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/gemv_mma_args.cuh"
#include "backend/cuda/mma.cuh"


template <int GB, bool F16S, int RG_R> __global__ void __launch_bounds__(256, 1) gemv_ring_kernel(MmArgs a) {
    pdl_trigger();
    constexpr int S = GB == 16 ? 2 : 4; /* steps per chunk, as gemv_mma_kernel's */
    constexpr int GPS = 64 / GB;        /* groups per step (Q4: GB <= 64 bytes per group) */
    constexpr int CPS = 128;            /* inputs per step */
    extern __shared__ uint4 rg_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint4 *ringw = rg_sm + (size_t)warp * RG_R * 2 * S * 32 + lane; /* this lane's word slots */
    uint32_t *rings = (uint32_t *)(rg_sm + MM_WARPS * RG_R * 2 * S * 32) + (size_t)warp * RG_R * 4 * 32 + lane;
    uint2 *tbl = (uint2 *)((uint32_t *)(rg_sm + MM_WARPS * RG_R * 2 * S * 32) + MM_WARPS * RG_R * 4 * 32);
    float *xs = (float *)(tbl + a.J * S * 8 * 32); /* [J·S][GPS] Σx per group and step */
    __shared__ int mine[MM_MINE], nmine;
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    const int nst = a.in / CPS, st0 = blockIdx.y * S * a.J, ns = min(S * a.J, nst - st0), nch = (ns + S - 1) / S;
    const size_t rb = (size_t)a.in / 2;
    /* the warp's items: chunk n % nch of its (n / nch)-th row block */
    const int nrb = (a.rblocks - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x, nitems = nrb * nch;

    auto issue = [&](int n) { /* item n's words and scale pairs into slot n % RG_R; one group per call */
        if (n < nitems) {
            const int rbk = blockIdx.x + (n / nch) * gridDim.x, ch = n % nch, slot = n % RG_R;
            const int nsc = min(S, ns - ch * S);
            MmRows r;
            mm_rows(a, rbk * MM_WARPS + warp, g, t, rb, pair, r);
            uint4 *w = ringw + slot * 2 * S * 32;
#pragma unroll
            for (int sl = 0; sl < S; sl++)
                if (sl < nsc) {
                    const size_t st = (size_t)(st0 + ch * S + sl) * 64;
                    mma_cp16_ord(w + (2 * sl) * 32, r.w0 + st);
                    mma_cp16_ord(w + (2 * sl + 1) * 32, r.w1 + st);
                }
            /* groups G + 2t, G + 2t + 1 (as gemv_mma_kernel's XP1 load; columns past the row are not
             * folded, so any pair inside the row serves) */
            const int G = (st0 + ch * S) * GPS, G0 = min(G + min(2 * t, S * GPS - 2), a.ng - 2);
            uint32_t *q = rings + slot * 4 * 32;
            mma_cp4_ord(q, r.s0 + G0);
            mma_cp4_ord(q + 32, r.b0 + G0);
            mma_cp4_ord(q + 64, r.s1 + G0);
            mma_cp4_ord(q + 96, r.b1 + G0);
        }
        mma_cp_commit_ord();
    };
#pragma unroll
    for (int i = 0; i < RG_R - 1; i++) issue(i); /* weights only: before the previous kernel's end */
    pdl_wait();
    mm_stage_x<4, GB, S, 1>(a, tbl, xs, st0, ns);
    __syncthreads();

    const uint2 *tl = tbl + lane;
    const int units = pair ? 2 * a.rows : a.rows;
    float *pp = a.part + (size_t)blockIdx.y * units;
    float acc0 = 0.0f, acc1 = 0.0f;
    for (int n = 0; n < nitems; n++) {
        issue(n + RG_R - 1);
        mma_cp_wait_ord<RG_R - 1>(); /* item n's group is complete */
        const int ch = n % nch, slot = n % RG_R, nsc = min(S, ns - ch * S);
        const uint4 *w = ringw + slot * 2 * S * 32;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int sl = 0; sl < S; sl++) {
            if (sl >= nsc) continue;
            const uint4 A = w[(2 * sl) * 32], C = w[(2 * sl + 1) * 32];
            const uint32_t wa[4] = {A.x, A.y, A.z, A.w}, wc[4] = {C.x, C.y, C.z, C.w};
            mm_mmas1<true>(d, wa, wc, tl, ch * S + sl, a.magic);
        }
        const uint32_t *q = rings + slot * 4 * 32;
        mm_fold1<GPS, S, F16S, true>(acc0, acc1, d, q[0], q[32], q[64], q[96], xs, ch * S, nsc, t);
        if (ch == nch - 1) {
            MmRows r;
            mm_rows(a, (blockIdx.x + (n / nch) * gridDim.x) * MM_WARPS + warp, g, t, rb, pair, r);
            mm_finish(a, acc0, acc1, r.unit0, r.unit1, r.live0, r.live1, pair, t, pp);
            acc0 = acc1 = 0.0f;
        }
    }
    if (a.ks == 1) return;
    mm_reduce_slices(a, pair, units, mine, &nmine);
}

/* shared memory of the ring kernel for J chunks per slice and RG_R slots */
static size_t rg_smem(int gb, int J, int RG_R) {
    const int S = gb == 16 ? 2 : 4;
    return (size_t)MM_WARPS * RG_R * (2 * S * 32 * 16 + 4 * 32 * 4) + (size_t)J * (S * 8 * 32 * 8 + 8 * 4 * 4);
}

/* TERN_CUDA_GEMV_RING: 0 (default) never, 1 every XP1 launch it can take, 2 matrices of at least 2^25
 * codes. Measured slower than the register walk (H200, session 12, NOTES (u), µs register walk / ring
 * R = 3 / 4 / 5: 14336x4096 16.8 / 19.6 / 19.7 / 20.4, 4096x14336 18.1 / 22.2 / 22.2 / 22.7, lm head
 * 125.3 / 128.9 / 132.8 / 135.1; llama3-8b q4 b1 316 tok/s vs 283 (=2) and 258 (=1)): the depth of
 * the ring changes nothing, so bytes in flight are not what limits the Q4 GEMV. Kept opt-in, with its
 * bitwise test, for the profile that says what does. Returns false when it declines. */
extern "C" int tern__cuda_gemv_ring;
int tern__cuda_gemv_ring = -1;
bool tern__cuda_gemv_ring_go(const tern__cuda *c, const MmArgs &a, int gb, bool f16) {
    if (tern__cuda_gemv_ring < 0) {
        tern__cuda_gemv_ring = tern__cuda_env_int("TERN_CUDA_GEMV_RING", 0);
        if (tern__cuda_gemv_ring < 0 || tern__cuda_gemv_ring > 2) tern__cuda_gemv_ring = 0;
    }
    if (!tern__cuda_gemv_ring || (a.ng & 1) || a.ng < 2) return false;
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    if (tern__cuda_gemv_ring == 2 && (double)a.rows * (pair ? 2 : 1) * a.in < 33554432.0) return false;
    static int R = -1; /* TERN_CUDA_GEMV_RING_R: slots per warp, 3..5 (5 only with bf16 scales) */
    if (R < 0) {
        R = tern__cuda_env_int("TERN_CUDA_GEMV_RING_R", 4);
        if (R < 3 || R > 5) R = 4;
    }
    const int r = f16 ? 4 : R;
    const size_t smem = rg_smem(gb, a.J, r);
    if (smem + 1024 > c->smem_optin) return false; /* the opt-in limit counts the static arrays too */
    const int nsm = c->n_sm > 0 ? c->n_sm : 132;
    int gx = (nsm + a.ks - 1) / a.ks; /* one block per SM in all */
    if (gx > a.rblocks) gx = a.rblocks;
    if (gx < (a.rblocks + MM_MINE - 1) / MM_MINE) gx = (a.rblocks + MM_MINE - 1) / MM_MINE;
    MmArgs b = a;
    const dim3 grid((unsigned)gx, (unsigned)a.ks);
#define RG_LAUNCH(GB_, F_, R_)                                                                                       \
    do {                                                                                                             \
        static bool attr = false;                                                                                    \
        if (!attr) {                                                                                                 \
            cudaFuncSetAttribute(gemv_ring_kernel<GB_, F_, R_>, cudaFuncAttributeMaxDynamicSharedMemorySize,         \
                                 (int)(c->smem_optin - 1024));                                                       \
            attr = true;                                                                                             \
        }                                                                                                            \
        tern_launch(c->stream, gemv_ring_kernel<GB_, F_, R_>, grid, 256, smem, b);                                   \
    } while (0)
#define RG_GB(GB_)                                                                                                   \
    do {                                                                                                             \
        if (f16) RG_LAUNCH(GB_, true, 4);                                                                            \
        else if (r == 3) RG_LAUNCH(GB_, false, 3);                                                                   \
        else if (r == 5) RG_LAUNCH(GB_, false, 5);                                                                   \
        else RG_LAUNCH(GB_, false, 4);                                                                               \
    } while (0)
    if (gb == 16) RG_GB(16);
    else if (gb == 32) RG_GB(32);
    else RG_GB(64);
#undef RG_GB
#undef RG_LAUNCH
    return true;
}

/*
 * qgemm_q4.cuh — what qgemm_q4.cu's mma.sync kernel and qgemm_q4_wg.cu's wgmma kernel share: the launch
 * arguments (up to three matrices sharing x, the split-K partials), the two-codes-at-a-time decode of MLX Q4
 * words into bf16 pairs (exact: see qgemm_q4.cu's top comment), the scale loads and the cp.async ring's
 * walk. Both kernels' cubins are byte-identical to the ones timed before these moved (session 16).
 */
#ifndef TERN_CUDA_QGEMM_Q4_CUH
#define TERN_CUDA_QGEMM_Q4_CUH

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/qgemm_frag.cuh"

struct Q4Mat {
    const uint8_t *w;           /* packed codes, rb bytes per row */
    const uint16_t *s, *b;      /* bf16 scales, biases [out][ng] */
    float *y;                   /* [n][out] */
    size_t poff;                /* its [n][out] block in a slice of partials */
    int out, mb0;               /* rows; its first row block in grid.x */
};
struct Q4Args {
    Q4Mat m[3];                 /* k matrices sharing in (q|k|v; gate, up) */
    const uint4 *x;             /* bf16 x [n][in] in the decode's pair order (q4_stage_x) */
    float *part;                /* partials [S][slice] unless direct */
    size_t rb, slice;
    int k, mode, direct, in, n, ng, gs_shift, kt_per, nkt;
    uint32_t magic;             /* 0x43004300, see q4_deq */
};

/* codes i and i+4 of word w as bf16 s·q + b (sb2: (s, s), bb2: (b, b)). The and-or is one LOP3 only with its
 * second constant in a register: magic (0x43004300, the bf16 pair (128, 128)) comes from the kernel arguments so
 * the compiler cannot fold it back into an immediate (gemv_mma.cuh's mm_decode; two immediates are two LOP3s, one
 * more instruction in every pair's chain: ncu of qg4w, session 71) */
__device__ __forceinline__ uint32_t q4_deq(uint32_t w, int i, __nv_bfloat162 sb2, __nv_bfloat162 bb2, uint32_t magic) {
    uint32_t p;
    asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(p) : "r"(w >> (4 * i)), "r"(magic)); /* (a & b) | c */
    const __nv_bfloat162 q = __hsub2(*(__nv_bfloat162 *)&p, *(const __nv_bfloat162 *)&magic);
    const __nv_bfloat162 v = __hfma2(q, sb2, bb2);
    return bf2_bits(v);
}

/* (s, s) and (b, b) from a lane's packed (s | b << 16) */
__device__ __forceinline__ __nv_bfloat162 q4_dup(uint32_t v, bool hi) {
    const uint32_t r = __byte_perm(v, 0, hi ? 0x3232 : 0x1010);
    return *(const __nv_bfloat162 *)&r;
}

/* a lane's scales and biases of K tile kt (absolute) for its rows ra and rb: (s | b << 16) each */
__device__ __forceinline__ void q4_sb(uint32_t *d, const Q4Args &a, const uint16_t *Sc, const uint16_t *Bi, int ra,
                                      int rb, int kt, int t) {
    const int gc = (kt * QG_KB + 32 * t) >> a.gs_shift;
    const size_t ia = (size_t)ra * a.ng + gc, ib = (size_t)rb * a.ng + gc;
    d[0] = (uint32_t)__ldg(Sc + ia) | (uint32_t)__ldg(Bi + ia) << 16;
    d[1] = (uint32_t)__ldg(Sc + ib) | (uint32_t)__ldg(Bi + ib) << 16;
}

/* The ring both kernels walk over a block's nkt tiles in ST stages: the weights and scales of the first ST - 1
 * tiles requested before pdl_wait (they do not depend on the previous kernel), then their x; per tile: wait for
 * its copies (PROXY: fence.proxy.async, for wgmma's reads of cp.async data), barrier (tile kt landed for all,
 * every warp is done with tile kt - 1), refill tile kt - 1's slot with tile kt + ST - 1, tile(u) on slot u.
 * LAG 2 (qgemm_q4_wg.cu's ASY: a tile's wgmmas still read its x while the next tile runs): ST - 2 tiles ahead, the
 * slot of tile kt - 2 refilled with tile kt + ST - 2 */
template <int ST, bool PROXY, int LAG = 1, class LW, class LX, class LS, class TILE>
__device__ __forceinline__ void q4_ring(int nkt, LW load_w, LX load_x, LS load_sb, TILE tile) {
    constexpr int D = ST - LAG; /* tiles in flight ahead of the current one */
    pdl_trigger();
#pragma unroll
    for (int u = 0; u < D; u++)
        if (u < nkt) { load_w(u, u); load_sb(u, u); }
    pdl_wait(); /* x is the previous kernel's (the staging kernel) */
#pragma unroll
    for (int u = 0; u < D; u++) {
        if (u < nkt) load_x(u, u);
        mma_cp_commit();
    }
    for (int base = 0; base < nkt; base += ST) {
#pragma unroll
        for (int u = 0; u < ST; u++) {
            const int kt = base + u; /* uniform over the block */
            if (kt >= nkt) break;
            mma_cp_wait<D - 1>();
            if constexpr (PROXY) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads();
            const int un = (u + D) % ST;
            if (kt + D < nkt) {
                load_w(kt + D, un);
                load_x(kt + D, un);
                load_sb(kt + D, un);
            }
            mma_cp_commit();
            tile(u);
        }
    }
    mma_cp_wait<0>(); /* no copy outlives the block (the trailing groups are empty) */
}

/* The end of a block of 8 warps (qgemm_q4.cu, qgemm_q4_wg.cu; warp w's accumulators = mma.sync's C of rows
 * wr + g (+ 8) over NT 8-column tiles from column n0). PAIR with the whole K (direct): the up warps (4..7) hand
 * their accumulators to the gate warps through shared memory (sm: the drained ring) and y = act(gate)·up; else
 * y (+= for G1_RES) when direct, or this K slice's partials. acc is __restrict__: without it the stores through
 * generic pointers could alias it, and calling this moved qgemm_q4_wg.cu's registers everywhere (session 16);
 * with it the callers' instruction counts and registers stay and only 9–33 words after their main loops
 * differ from the inline copies they had (session 17). PAIR needs sm (the mma.sync kernel passes none) */
template <int NT, bool PAIR>
__device__ __forceinline__ void qw_store(const Q4Args &a, const float *__restrict__ acc, uint8_t *sm, int mi, int out, int rowb,
                                         int wr, int n0, int warp, int g, int t) {
    constexpr int BN = NT * 8;
    if constexpr (PAIR) {
        if (a.direct) {
            float *const ups = (float *)sm; /* [64 rows][BN + 1] */
            __syncthreads(); /* every warp is done with the ring */
            if (warp >= 4)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        ups[((warp & 3) * 16 + g + (i >> 1) * 8) * (BN + 1) + nt * 8 + 2 * t + (i & 1)] = acc[nt * 4 + i];
            __syncthreads();
            if (warp < 4)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int rl = warp * 16 + g + (i >> 1) * 8, row = rowb + rl, col = n0 + nt * 8 + 2 * t + (i & 1);
                        const float v = acc[nt * 4 + i], u = ups[rl * (BN + 1) + nt * 8 + 2 * t + (i & 1)];
                        if (row < out && col < a.n)
                            a.m[0].y[(size_t)col * out + row] = (a.mode == G1_SILU ? silu(v) : gelu_tanh(v)) * u;
                    }
            return;
        }
    }
    float *const dst = a.direct ? a.m[mi].y : a.part + (size_t)blockIdx.y * a.slice + a.m[mi].poff;
    const bool add = a.direct && a.mode == G1_RES;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = wr + g + (i >> 1) * 8, col = n0 + nt * 8 + 2 * t + (i & 1);
            if (row < out && col < a.n) {
                float *p = dst + (size_t)col * out + row;
                *p = add ? *p + acc[nt * 4 + i] : acc[nt * 4 + i];
            }
        }
}

/* qgemm_q4_wg.cu (sm_90a): the wgmma kernel for 64-row column tiles (nt 8) or 32 (nt 4), x staged in its
 * own order (x NULL: staged already, in gemm_scratch); 1 when launched, 0 when not available (no sm_90a image for
 * this GPU, TERN_CUDA_QG4_WG=0); pair: the plan of tern__cuda_qg4w_pair (grid.x over 64-row blocks of gate and up
 * together) */
int tern__cuda_qg4w_launch(tern__cuda *c, const Q4Args &a, dim3 grid, int nt, const float *x, size_t xbytes,
                           bool pair);
/* the pair form (gate and up rows in one block, act(gate)·up in its epilogue) will run: TERN_CUDA_QG4_WG and
 * TERN_CUDA_QG4_WGPAIR on, the image loaded (the caller served only K in multiples of 128) */
bool tern__cuda_qg4w_pair(void);
/* the wgmma kernel will run (TERN_CUDA_QG4_WG on, the image loaded) */
bool tern__cuda_qg4w_on(void);
void tern__cuda_qg4w_init(void);

#endif

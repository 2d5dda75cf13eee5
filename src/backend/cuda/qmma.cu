/*
 * qmma.cu — MLX affine Q matmul (bits 4 and 8; groups 32/64/128; F32/F16/BF16 scales) for
 * n = 1..64 activation rows on tensor cores, with the integer codes fed to the MMA unconverted:
 *     y[c, r] = Σ_g s[r,g]·(Σ_{k∈g} q[r,k]·x[c,k]) + b[r,g]·Σ_{k∈g} x[c,k]
 * Codes 0..255 are exact in bf16, so a code needs no f32 decode, no FMA with s, b, no hi/lo split:
 *   4-bit: ((w >> 4i) & 0x000F000F) | 0x43004300 is the bf16 pair (128 + q_i, 128 + q_{i+4}); one
 *          exact bf16x2 subtraction of 128 leaves (q_i, q_{i+4}). (LOP3 + shift + HSUB2 per 2 codes)
 *   8-bit: byte_perm(w, 0x4B000000) = f32 2^23 + q, minus 2^23, two of them packed by one cvt.
 * x is split into bf16 parts while the block stages it in shared memory: x = xh + xl (bf16x2 mode,
 * 2 MMAs per step: |x - xh - xl| <= 2^-16 |x|), x = xh + xm + xl exactly (3 MMAs: the f32-mode
 * option, products exact, f32 accumulation), or xh alone (the plain bf16 mode at n >= 2: 1 MMA). Σ_{k∈g} x is summed in f32 from the exact x during the
 * staging (8 values per thread, then a fixed xor-butterfly), so it is the same for every block.
 *
 * Tiling: block = 8 warps, 128 weight rows (warp: 16 rows = the MMA's M); all n <= 64 activation
 * rows are the N columns (NT tiles of 8); K advances in tiles of 128 inputs, each made of four
 * 32-input "super-chunks". In a super-chunk lane (g, t) owns inputs 8t..8t+7 of rows g and g+8 (one
 * 32-bit word of q4 / one 64-bit word of q8 per row); MMA step h (0, 1) puts inputs 8t+2h+{0,4}
 * in k-slots 2t,2t+1 and 8t+2h+{1,5} in slots 2t+8,2t+9, so a step (16 inputs) never leaves its
 * 32-input run, hence never leaves a scale group: every group accumulates into its own fragment
 * and is folded in as acc += s·acc_g + b·Σx_g. The staged x uses the same permutation (one 16-byte
 * shared read per column and super-chunk gives the B fragments of both steps). Weight words sit
 * in a register ring of D tiles (D-1 in flight); x, Σx, s and b of the next tile are loaded while
 * the current one is multiplied. Small grids split K over blockIdx.y into `part` (fixed-order
 * reduction); the split count never depends on n, and a column's arithmetic does not depend on
 * the other columns, so a row's result is the same bits for every n (batch invariant).
 *
 * Dispatch: TERN_CUDA_QMMA=1 (bf16 mode) / =2 (also the f32 mode, 3-part x) / 0 (off); QMMA_DEFAULT below
 * is the value without the variable; launches of one row or of more than TERN_CUDA_QMMA_N rows (default: Q4 32, Q8 8)
 * decline (one row: gemv_mma.cu's walk; tests set tern__cuda_qmma_minn = 1).
 * Other formats and shapes return 0 (the older kernels). In the matmul chain Q4 meets it only where
 * tern__cuda_q4_rows declined (precise matrices: Gemma 4's q / k projections, the router); Q8 always.
 * H200, session 49 (NOTES (bi)), batch decode 128 + 128, dec tok/s off -> on: gemma4-12b q4 at 2 / 8 / 16 / 32 / 64
 * sequences +6.3 / +6.0 / +3.4 / +6.7 / -3.3 %, gemma4-e4b q4 +4 / +3.5 / +2.7 / +5 % (2..32), llama3-8b q4 a tie (its
 * matrices all take q4_rows), llama3-8b q8 at 2 / 8 / 16 / 32 0 / +18 / -7 / -5 %: hence the row limits per width.
 * The limits as committed, off -> default on an H100 in one call: gemma4-12b q4 at 32 +6.8 %, llama3-8b q8 at 8 +16 %.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"

#include <stdlib.h>

#define QMMA_DEFAULT 1 /* 1 = bf16 mode, 2 = both modes */
#define QMMA_N4 32     /* rows at most without TERN_CUDA_QMMA_N: Q4 (at 64 qgemm wins) */
#define QMMA_N8 8      /* Q8 (at 16 and 32 the older kernels win) */
#define QM_KT 128      /* inputs per K tile */
#define QM_WARPS 8
#define QM_BM (QM_WARPS * 16)
#define QM_MAXN 64

extern "C" int tern__cuda_qmma_mode;             /* -1: read TERN_CUDA_QMMA on first use */
int tern__cuda_qmma_mode = -1;
extern "C" int tern__cuda_qmma_maxn;             /* -1: read TERN_CUDA_QMMA_N on first use; 0: per width */
int tern__cuda_qmma_maxn = -1;
extern "C" int tern__cuda_qmma_minn;             /* fewest rows it takes */
int tern__cuda_qmma_minn = 2;
extern "C" unsigned long long tern__cuda_qmma_calls; /* launches so far (tests check the path ran) */
unsigned long long tern__cuda_qmma_calls = 0;

struct QmArgs {
    const uint8_t *w, *s, *b; /* matrix e */
    size_t rb;                /* bytes per weight row */
    int out, in, gs, sdtype;
    const float *x;
    int n;
    float *y;                 /* y, or partials [S][n][out] */
    int kt_per, nkt;
};

__device__ __forceinline__ void qm_mma(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t qm_bits(__nv_bfloat162 h) { return *(uint32_t *)&h; }

/* the 8 codes of a lane's run as 4 bf16 pairs r[i] = (q_i, q_{i+4}) (low half first) */
template <int BITS> __device__ __forceinline__ void qm_decode(const uint32_t *wd, uint32_t *r) {
    if constexpr (BITS == 4) {
        const uint32_t v = wd[0];
        const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.0f, 128.0f);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t p = ((v >> (4 * i)) & 0x000F000Fu) | 0x43004300u; /* bf16 128 + q, exact */
            __nv_bfloat162 h = *(__nv_bfloat162 *)&p;
            r[i] = qm_bits(__hsub2(h, k128)); /* exact: the difference is an integer < 16 */
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float f0 = __uint_as_float(__byte_perm(wd[0], 0x4B000000u, 0x7440u + i)) - 8388608.0f;
            const float f1 = __uint_as_float(__byte_perm(wd[1], 0x4B000000u, 0x7440u + i)) - 8388608.0f;
            r[i] = qm_bits(__floats2bfloat162_rn(f0, f1)); /* integers < 256: exact */
        }
    }
}

/* (v0, v1) -> NP bf16 pairs whose sum is the pair (NP = 3: exactly; NP = 1: x rounded, the plain
 * bf16 mode) */
template <int NP> __device__ __forceinline__ void qm_split(float v0, float v1, uint32_t *o) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
    o[0] = qm_bits(h);
    if constexpr (NP == 1) return;
    const float2 hf = __bfloat1622float2(h);
    const float r0 = v0 - hf.x, r1 = v1 - hf.y; /* exact */
    const __nv_bfloat162 m = __floats2bfloat162_rn(r0, r1);
    o[1] = qm_bits(m);
    if constexpr (NP == 3) {
        const float2 mf = __bfloat1622float2(m);
        o[2] = qm_bits(__floats2bfloat162_rn(r0 - mf.x, r1 - mf.y)); /* <= 8 significant bits left */
    }
}

/* physical 16-byte chunk of logical chunk c (0..15) in x column `col` (conflict-free reads) */
__device__ __forceinline__ int qm_swz(int c, int col) { return c ^ ((col & 1) << 2); }

template <int BITS, int NT, int NP> struct QmCfg {
    static constexpr int BN = NT * 8;
    static constexpr int WW = BITS == 4 ? 1 : 2;         /* words per lane, row and super-chunk */
    static constexpr int WT = 4 * WW;                    /* ... per K tile */
    /* register ring slots (tiles): with NT <= 2 two blocks (16 warps) fit an SM at <= 128 registers;
     * D - 1 tiles in flight = 48 KB (q4) / 64 KB (q8) of weights per SM */
    static constexpr int D = NT <= 2 ? (BITS == 4 ? 4 : 3) : 2;
    static constexpr int XT = (BN * 16 + 255) / 256;     /* x chunks of 8 per thread and tile */
    static constexpr size_t XS = (size_t)2 * NP * BN * 16 * 16; /* x: [2][NP][BN][16] uint4 */
    static constexpr size_t SX = (size_t)2 * BN * 4 * 4;        /* Σx: [2][BN][4] floats */
    static constexpr size_t SB = (size_t)2 * 2 * QM_BM * 4 * 4; /* s, b: [2][2][BM][4] floats */
    static constexpr size_t SMEM = XS + SX + SB;
};

template <int BITS, int NT, int NP> __global__ void __launch_bounds__(256, NT <= 2 ? 2 : 1) qmma_kernel(QmArgs a) {
    pdl_start();
    using C = QmCfg<BITS, NT, NP>;
    constexpr int BN = C::BN, WW = C::WW, WT = C::WT, D = C::D, XT = C::XT;
    extern __shared__ uint4 qm_sm[];
    uint4 *xs = qm_sm;
    float *sx = (float *)((uint8_t *)qm_sm + C::XS);
    float *ssb = (float *)((uint8_t *)qm_sm + C::XS + C::SX);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int blk0 = blockIdx.x * QM_BM, row0 = blk0 + warp * 16;
    const int kt0 = blockIdx.y * a.kt_per, kt1 = min(kt0 + a.kt_per, a.nkt);
    const int r0 = min(row0 + g, a.out - 1), r1 = min(row0 + g + 8, a.out - 1);
    constexpr int TB = QM_KT * BITS / 8; /* bytes per row and tile */
    const uint8_t *p0 = a.w + (size_t)r0 * a.rb + t * WW * 4, *p1 = a.w + (size_t)r1 * a.rb + t * WW * 4;
    const int ng = a.in / a.gs, gpt = QM_KT / a.gs; /* groups per row, per tile */
    const int cpg = a.gs / 8;                       /* 8-input chunks per group */

    float acc[NT][4], accg[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = accg[i][j] = 0.0f;

    /* ---- staging of x, Σx, s, b for one tile: load to registers, store after the MMAs ---- */
    float4 xr[XT][2];
    float sbr[2][2];
    auto load_x = [&](int kt) {
#pragma unroll
        for (int j = 0; j < XT; j++) {
            const int i = threadIdx.x + j * 256, col = i >> 4, c = i & 15;
            if (i < BN * 16 && col < a.n) {
                const float4 *src = (const float4 *)(a.x + (size_t)col * a.in + (size_t)kt * QM_KT + c * 8);
                xr[j][0] = __ldg(src);
                xr[j][1] = __ldg(src + 1);
            } else {
                xr[j][0] = xr[j][1] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
#pragma unroll
        for (int m = 0; m < 2; m++) { /* tasks (row, group slot) = i >> 2, i & 3 */
            const int i = threadIdx.x + m * 256, gi = i & 3, row = min(blk0 + (i >> 2), a.out - 1);
            sbr[m][0] = sbr[m][1] = 0.0f;
            if (gi < gpt) {
                const size_t k = (size_t)row * ng + (size_t)kt * gpt + gi;
                sbr[m][0] = load_s(a.s, a.sdtype, k);
                sbr[m][1] = load_s(a.b, a.sdtype, k);
            }
        }
    };
    auto store_x = [&](int buf) {
#pragma unroll
        for (int j = 0; j < XT; j++) {
            const int i = threadIdx.x + j * 256, col = i >> 4, c = i & 15;
            if (i < BN * 16) { /* whole warps: the shuffles below stay uniform */
                const float4 u = xr[j][0], v = xr[j][1];
                uint32_t q[4][NP];
                qm_split<NP>(u.x, v.x, q[0]);
                qm_split<NP>(u.y, v.y, q[1]);
                qm_split<NP>(u.z, v.z, q[2]);
                qm_split<NP>(u.w, v.w, q[3]);
#pragma unroll
                for (int p = 0; p < NP; p++)
                    xs[((buf * NP + p) * BN + col) * 16 + qm_swz(c, col)] = make_uint4(q[0][p], q[1][p], q[2][p], q[3][p]);
                float s = ((u.x + u.y) + (u.z + u.w)) + ((v.x + v.y) + (v.z + v.w));
                for (int o = 1; o < cpg; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                if ((c & (cpg - 1)) == 0) sx[(buf * BN + col) * 4 + c / cpg] = s;
            }
        }
#pragma unroll
        for (int m = 0; m < 2; m++) {
            const int i = threadIdx.x + m * 256;
            ssb[((buf * 2 + 0) * QM_BM) * 4 + i] = sbr[m][0];
            ssb[((buf * 2 + 1) * QM_BM) * 4 + i] = sbr[m][1];
        }
    };

    /* ---- weight ring ---- */
    uint32_t w0[D][WT], w1[D][WT];
    auto load_w = [&](int kt, int u) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const size_t off = (size_t)kt * TB + (size_t)j * (WW * 16);
            if constexpr (WW == 1) {
                w0[u][j] = __ldg((const uint32_t *)(p0 + off));
                w1[u][j] = __ldg((const uint32_t *)(p1 + off));
            } else {
                const uint2 v0 = __ldg((const uint2 *)(p0 + off)), v1 = __ldg((const uint2 *)(p1 + off));
                w0[u][2 * j] = v0.x; w0[u][2 * j + 1] = v0.y;
                w1[u][2 * j] = v1.x; w1[u][2 * j + 1] = v1.y;
            }
        }
    };

    auto compute = [&](int u, int buf) {
        const uint4 *xb = xs + (size_t)buf * NP * BN * 16;
        const float *sxb = sx + buf * BN * 4, *sb = ssb + buf * 2 * QM_BM * 4;
        const int lr0 = warp * 16 + g, lr1 = lr0 + 8; /* rows inside the block */
#pragma unroll
        for (int j = 0; j < 4; j++) { /* super-chunk: inputs 32j .. 32j+31 of the tile */
            uint32_t ra[4], rb[4];
            qm_decode<BITS>(&w0[u][j * WW], ra);
            qm_decode<BITS>(&w1[u][j * WW], rb);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int col = nt * 8 + g;
                uint4 xv[NP];
#pragma unroll
                for (int p = 0; p < NP; p++) xv[p] = xb[(p * BN + col) * 16 + qm_swz(4 * j + t, col)];
#pragma unroll
                for (int p = 0; p < NP; p++) qm_mma(accg[nt], ra[0], rb[0], ra[1], rb[1], xv[p].x, xv[p].y);
#pragma unroll
                for (int p = 0; p < NP; p++) qm_mma(accg[nt], ra[2], rb[2], ra[3], rb[3], xv[p].z, xv[p].w);
            }
            if (((j + 1) * 32) % a.gs == 0) { /* end of a scale group: fold it in */
                const int gi = j * 32 / a.gs;
                const float s0 = sb[lr0 * 4 + gi], b0 = sb[QM_BM * 4 + lr0 * 4 + gi];
                const float s1 = sb[lr1 * 4 + gi], b1 = sb[QM_BM * 4 + lr1 * 4 + gi];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const float x0 = sxb[(nt * 8 + 2 * t) * 4 + gi], x1 = sxb[(nt * 8 + 2 * t + 1) * 4 + gi];
                    acc[nt][0] = fmaf(s0, accg[nt][0], fmaf(b0, x0, acc[nt][0]));
                    acc[nt][1] = fmaf(s0, accg[nt][1], fmaf(b0, x1, acc[nt][1]));
                    acc[nt][2] = fmaf(s1, accg[nt][2], fmaf(b1, x0, acc[nt][2]));
                    acc[nt][3] = fmaf(s1, accg[nt][3], fmaf(b1, x1, acc[nt][3]));
                    accg[nt][0] = accg[nt][1] = accg[nt][2] = accg[nt][3] = 0.0f;
                }
            }
        }
    };

    if (kt0 < kt1) {
        load_x(kt0);
        store_x(0);
    }
#pragma unroll
    for (int u = 0; u < D - 1; u++)
        if (kt0 + u < kt1) load_w(kt0 + u, u);
    __syncthreads();
    for (int base = kt0; base < kt1; base += D) {
#pragma unroll
        for (int u = 0; u < D; u++) {
            const int kt = base + u; /* uniform over the block: barriers stay uniform */
            if (kt >= kt1) break;
            const int buf = (kt - kt0) & 1;
            const bool more = kt + 1 < kt1;
            if (kt + D - 1 < kt1) load_w(kt + D - 1, (u + D - 1) % D);
            if (more) load_x(kt + 1);
            compute(u, buf);
            if (more) store_x(buf ^ 1);
            __syncthreads();
        }
    }

    float *dst = a.y + (size_t)blockIdx.y * a.n * a.out; /* blockIdx.y = 0 when not split */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = row0 + g + (i >> 1) * 8, col = nt * 8 + 2 * t + (i & 1);
            if (row < a.out && col < a.n) dst[(size_t)col * a.out + row] = acc[nt][i];
        }
}

__global__ void qmma_reduce(float *y, const float *part, size_t m, int S) {
    pdl_start();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m; i += (size_t)gridDim.x * blockDim.x) {
        float s = part[i];
        for (int k = 1; k < S; k++) s += part[(size_t)k * m + i];
        y[i] = s;
    }
}

template <int BITS, int NT, int NP> static void qm_go(cudaStream_t st, dim3 grid, const QmArgs &a) {
    tern_launch(st, qmma_kernel<BITS, NT, NP>, grid, 256, QmCfg<BITS, NT, NP>::SMEM, a);
}

template <int BITS, int NP> static void qm_launch(cudaStream_t st, dim3 grid, int nt, const QmArgs &a) {
    switch (nt) {
    case 1: qm_go<BITS, 1, NP>(st, grid, a); break;
    case 2: qm_go<BITS, 2, NP>(st, grid, a); break;
    case 4: qm_go<BITS, 4, NP>(st, grid, a); break;
    default: qm_go<BITS, 8, NP>(st, grid, a); break;
    }
}

template <int BITS, int NT, int NP> static void qm_allow1() {
    cudaFuncSetAttribute(qmma_kernel<BITS, NT, NP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)QmCfg<BITS, NT, NP>::SMEM);
}
template <int BITS, int NP> static void qm_allow() {
    qm_allow1<BITS, 1, NP>(); qm_allow1<BITS, 2, NP>(); qm_allow1<BITS, 4, NP>(); qm_allow1<BITS, 8, NP>();
}

static unsigned qm_smem_ready; /* bit d: the big instances may use > 48 KB on device d */

static int qm_ensure_smem(tern__cuda *c) {
    return tern__cuda_attr_once(&qm_smem_ready, c->device, c->capturing, [] {
        qm_allow<4, 1>(); qm_allow<4, 2>(); qm_allow<4, 3>(); qm_allow<8, 1>(); qm_allow<8, 2>(); qm_allow<8, 3>();
    });
}

extern "C" void tern__cuda_qmma_init(tern__cuda *c) {
    qm_ensure_smem(c);
    cudaGetLastError();
}

/* whether the settings (TERN_CUDA_QMMA, TERN_CUDA_QMMA_N, read on first use) take n rows of a `bits` matrix in this
 * compute mode */
static bool qm_takes(bool f32, int n, int bits) {
    if (tern__cuda_qmma_mode < 0) tern__cuda_qmma_mode = tern__cuda_env_int("TERN_CUDA_QMMA", QMMA_DEFAULT);
    if (tern__cuda_qmma_maxn < 0) tern__cuda_qmma_maxn = tern__cuda_env_int("TERN_CUDA_QMMA_N", 0);
    const int mode = tern__cuda_qmma_mode, maxn = tern__cuda_qmma_maxn > 0 ? tern__cuda_qmma_maxn : bits == 8 ? QMMA_N8 : QMMA_N4;
    return mode > 0 && (!f32 || mode >= 2) && n >= TERN_MAX(1, tern__cuda_qmma_minn) && n <= TERN_MIN(QM_MAXN, maxn);
}

extern "C" int tern__cuda_qmma(tern__cuda *c, float *y, const float *x, int n, const tern__cuda_w *w, int e) {
    const bool f32 = c->compute == TERN_COMPUTE_F32;
    if (!qm_takes(f32, n, w->bits)) return 0;
    if (w->dtype != TERN_DT_Q || (w->bits != 4 && w->bits != 8) || !w->scales || !w->biases) return 0;
    if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128) return 0;
    if (w->in % QM_KT != 0 || w->in <= 0 || w->out < 1 || ((uintptr_t)x & 15)) return 0;
    if (!qm_ensure_smem(c)) return 0;
    /* x parts: f32 mode 3 (exact), bf16x2 (and n = 1 in bf16) 2, the plain bf16 mode 1 (x rounded;
     * the codes, scales and Σx stay exact) */
    const int nt = n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8, np = f32 ? 3 : tern__cuda_plain_rows(c, w, n) ? 1 : 2;
    QmArgs a;
    a.w = (const uint8_t *)w->data + (size_t)e * w->mat_bytes;
    a.s = (const uint8_t *)w->scales + (size_t)e * w->mat_bytes_s;
    a.b = (const uint8_t *)w->biases + (size_t)e * w->mat_bytes_s;
    a.rb = (size_t)w->in * w->bits / 8;
    a.out = w->out;
    a.in = w->in;
    a.gs = w->group_size;
    a.sdtype = w->sdtype;
    a.x = x;
    a.n = n;
    a.nkt = w->in / QM_KT;
    /* split K until the grid covers the GPU about twice; never a function of n (batch
     * invariance), so partials are sized for the largest n */
    const int mb = (w->out + QM_BM - 1) / QM_BM;
    const long target = 2L * (c->n_sm > 0 ? c->n_sm : 132);
    int S = mb < target ? (int)((target + mb - 1) / mb) : 1;
    if (S > a.nkt / 2) S = a.nkt / 2;
    while (S > 1 && (size_t)S * QM_MAXN * w->out > TERN_CUDA_PART_FLOATS) S--;
    if (S < 1) S = 1;
    a.kt_per = (a.nkt + S - 1) / S;
    S = (a.nkt + a.kt_per - 1) / a.kt_per;
    a.y = S > 1 ? c->part : y;
    const dim3 grid((unsigned)mb, (unsigned)S);
    if (w->bits == 4) {
        if (np == 1) qm_launch<4, 1>(c->stream, grid, nt, a);
        else if (np == 2) qm_launch<4, 2>(c->stream, grid, nt, a);
        else qm_launch<4, 3>(c->stream, grid, nt, a);
    } else {
        if (np == 1) qm_launch<8, 1>(c->stream, grid, nt, a);
        else if (np == 2) qm_launch<8, 2>(c->stream, grid, nt, a);
        else qm_launch<8, 3>(c->stream, grid, nt, a);
    }
    tern__cuda_check(c, "qmma");
    if (S > 1) {
        const size_t m = (size_t)n * w->out, blocks = (m + 255) / 256;
        tern_launch(c->stream, qmma_reduce, (unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, y, c->part, m, S);
        tern__cuda_check(c, "qmma_reduce");
    }
    tern__cuda_qmma_calls++;
    return 1;
}

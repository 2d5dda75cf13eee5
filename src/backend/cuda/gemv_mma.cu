/*
 * gemv_mma.cu — one activation row (decode, n = 1) times MLX affine Q weights (bits 4 and 8; groups
 * 32/64/128; BF16/F16 scales) on tensor cores, exact in f32 terms, with the integer codes fed to
 * mma.sync unconverted. The CUDA-core GEMVs of gemv.cu spend 6.5-8 instructions per code (ncu:
 * issue- and latency-bound). This one's SASS (ncu source counters, 14336x4096, bench/NOTES.md (m)) ran
 * 1072 instructions per row block and warp, 4.2 per code: the decode's and-or took two LOP3s (now
 * one: 4 LOP3 + 3 SHF + 4 HADD2 per 8 codes) and ~200 register moves copy the next row block's words
 * into the current ones (TERN_CUDA_GEMV_PP=1 walks with two register sets instead; opt-in, it
 * spills at 128 registers). In the bf16 compute mode FOLD skips the subtraction (see mm_decode, mm_go).
 *
 *   y[r] = Σ_G s[r,G]·(Σ_{k∈G} q[r,k]·x[k]) + b[r,G]·Σ_{k∈G} x[k]
 *
 * Codes: a 32-bit word holds 8 nibbles; ((w >> 4j) & 0x000F000F) | 0x43004300 is the bf16 pair
 * (128 + nibble j, 128 + nibble j+4) and one exact bf16x2 subtraction leaves the nibbles. A q4 code
 * is one nibble; a q8 code is two (low, high): its x sits in two k-slots, the high one times 16.
 * x is split exactly into three bf16 parts x = hi + mid + lo (8 significant bits each) that become
 * MMA columns (B operand, n = 8), so products code·part are exact and accumulate in f32.
 *
 * Layout: warp = 16 weight rows (the MMA's M); lane (g, t) owns rows g and g+8 and reads 16 bytes
 * of each per 64-byte "step" (one 128-bit load per row). A step holds GPS = 64/GB scale groups (GB
 * bytes per group; 128-byte q8 groups span two steps); group γ uses columns 3γ..3γ+2 and only the
 * k-slots of the lanes holding its bytes, so each column is one group's Σ q·x_part, folded with that
 * group's scale: acc += s·D + b·Σx. The k-slot order of a lane's codes is a fixed permutation; the
 * block stages x in it as a table of B fragments with zeros in the columns a lane does not feed
 * (one unconditional 8-byte shared load per lane and MMA), and Σx per group and step.
 * Block = 8 warps x a K slice of J chunks of S = 4 steps (q4 g32: 2; J = 1..4, mm_chunks) that walks
 * row blocks of 128 rows (pair mode: 64 outputs, gate rows g and up rows g+8 in one warp) blockIdx.x,
 * +gridDim.x, ...: x is staged once for the slice, a row block's chunks run in order into the same
 * sums, and the next chunk's (or row block's) loads are issued as soon as a step's words are in registers.
 * Slices (blockIdx.y, a function of `in` only, so fused and separate calls give the same bits) are
 * summed by the last slice block of a row block in fixed order (counter per row block, reset by that
 * block; one fence per block): deterministic and graph-capturable. Modes as gemv.cu's gemv1: up to three matrices sharing `in` (q|k|v),
 * act(gate)·up, y += W·x. A probe kernel at the end times the load pattern alone (bench_cuda).
 * The device pieces (decode, split, staging, one step) are in gemv_mma.cuh, shared with moe_mma.cu.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_mma.cuh"

#include <stdlib.h>

#define MM_WARPS 8
#define MM_MINE 64   /* row blocks one block may walk (split K: it may have to reduce each) */
#define MM_JMAX 4    /* chunks of S steps per K slice */

struct MmArgs {
    const uint8_t *data[3], *scales[3], *biases[3];
    float *y[3];
    int out[3], nm, rows; /* rows: plain/RES = out[0]+out[1]+out[2]; pair = out[0] (outputs) */
    int in, ng, mode, ks;     /* ng groups per row, ks K slices (blockIdx.y) of J·S steps */
    int J;                    /* chunks of S steps per K slice (1..MM_JMAX; mm_chunks) */
    int rblocks;              /* row blocks (128 rows; pair: 64 outputs); gridDim.x <= rblocks walk them */
    const float *x;
    const float *nw; /* pre-norm (ops.h norm_matmul, xn != NULL): x staged as rmsnorm(x)·nw; the */
    float *xn;       /* blocks of blockIdx.x 0 write their slice of it to xn */
    float eps;
    const float *rh, *rw, *rs; /* with xn, norm_matmul's res: the pre-norm is of x' = (x + rmsnorm(rh)·rw)·rs, */
    float *rxo;                /* whose slices blocks of blockIdx.x 0 write to rxo */
    float *part; /* [ks][units] partials (pair: 2 per output) */
    int *cnt;
    uint32_t magic; /* 0x43004300: the bf16 pair (128, 128), see mm_decode */
};

/* the final value of one output unit (row of the concatenated matrices, or a pair output) */
__device__ __forceinline__ void mm_store(const MmArgs &a, int unit, float v, float up) {
    if (a.mode == G1_SILU || a.mode == G1_GELU) {
        a.y[0][unit] = (a.mode == G1_SILU ? silu(v) : gelu_tanh(v)) * up; /* as gemv1 */
        return;
    }
    int m = 0;
    while (m < a.nm - 1 && unit >= a.out[m]) unit -= a.out[m++];
    float *yp = a.y[m] + unit;
    *yp = a.mode == G1_RES ? *yp + v : v;
}

/* a lane's two rows of warp tile `tile`: units (row of the concatenated matrices, or pair output),
 * liveness, and the addresses of its bytes, scales and biases */
struct MmRows {
    const uint8_t *w0, *w1;
    const uint16_t *s0, *b0, *s1, *b1;
    int unit0, unit1;
    bool live0, live1;
};

__device__ __forceinline__ void mm_rows(const MmArgs &a, int tile, int g, int t, size_t rb, bool pair, MmRows &r) {
    int unit[2], mat[2], lrow[2];
    bool live[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int u = pair ? tile * 8 + g : tile * 16 + g + 8 * h, m = pair ? h : 0;
        live[h] = u < a.rows;
        unit[h] = u;
        if (!live[h]) u = 0, m = 0; /* clamp: recompute a valid row, never written */
        if (!pair)
            while (m < a.nm - 1 && u >= a.out[m]) u -= a.out[m++];
        mat[h] = m;
        lrow[h] = u;
    }
    r.w0 = a.data[mat[0]] + (size_t)lrow[0] * rb + t * 16;
    r.w1 = a.data[mat[1]] + (size_t)lrow[1] * rb + t * 16;
    r.s0 = (const uint16_t *)a.scales[mat[0]] + (size_t)lrow[0] * a.ng;
    r.b0 = (const uint16_t *)a.biases[mat[0]] + (size_t)lrow[0] * a.ng;
    r.s1 = (const uint16_t *)a.scales[mat[1]] + (size_t)lrow[1] * a.ng;
    r.b1 = (const uint16_t *)a.biases[mat[1]] + (size_t)lrow[1] * a.ng;
    r.unit0 = unit[0]; r.unit1 = unit[1];
    r.live0 = live[0]; r.live1 = live[1];
}

/* split K: the block's partials are out (one fence); the last slice block of a row block sums its
 * slices in order */
__device__ __forceinline__ void mm_reduce_slices(const MmArgs &a, bool pair, int units, int *mine, int *nmine) {
    __threadfence();
    if (threadIdx.x == 0) *nmine = 0;
    __syncthreads();
    for (int q = blockIdx.x + threadIdx.x * gridDim.x; q < a.rblocks; q += blockDim.x * gridDim.x)
        if (atomicAdd(a.cnt + q, 1) == a.ks - 1) mine[atomicAdd(nmine, 1)] = q;
    __syncthreads();
    __threadfence();
    const int per = pair ? 64 : 128;
    for (int k = 0; k < *nmine; k++) {
        const int q = mine[k], u0 = q * per;
        for (int i = threadIdx.x; i < per; i += blockDim.x) {
            const int u = u0 + i;
            if (u >= a.rows) break;
            float v = 0.f, up = 0.f;
            /* L2 loads (other blocks' partials), several in flight: a volatile load per slice waited
             * ~L2 latency each (28 slices at in = 14336); the sum keeps the slice order */
#pragma unroll 4
            for (int s = 0; s < a.ks; s++) {
                const float *qq = a.part + (size_t)s * units;
                if (pair) { v += __ldcg(qq + 2 * u); up += __ldcg(qq + 2 * u + 1); }
                else v += __ldcg(qq + u);
            }
            mm_store(a, u, v, up);
        }
        if (threadIdx.x == 0) a.cnt[q] = 0;
    }
}

/* Step = 64 bytes of each of the warp's 16 rows (lane t: bytes 16t..16t+15, one 128-bit load per
 * row); a K slice = S steps. A step holds GPS scale groups (GB bytes each; GB = 128: a group spans two
 * steps); group γ of the step uses MMA columns 3γ..3γ+2 (its three x parts) and only the k-slots of
 * the lanes t that hold its bytes, so every column is one group's Σ q·x_part, folded with that
 * group's scale. A block stages x for its slice once and then walks row blocks blockIdx.x,
 * + gridDim.x, ...: the loads of the next row block are issued as soon as a step's words and scales
 * are in registers, so every warp keeps a row block's bytes in flight while it multiplies. */
template <int BITS, int GB, bool F16S, bool PP, bool FOLD>
__global__ void __launch_bounds__(256, 2) gemv_mma_kernel(MmArgs a) {
    pdl_trigger();
    constexpr int S = GB == 16 ? 2 : 4; /* steps per K slice (q4 g32: two MMA tiles, fewer registers) */
    constexpr int GPS = GB >= 64 ? 1 : 64 / GB;   /* groups per step */
    constexpr int NCOL = 3 * GPS, NT = (NCOL + 7) / 8;
    constexpr int CPS = 512 / BITS;               /* inputs per step */
    using SV = typename SVec<GPS>::T;
    extern __shared__ uint2 mm_sm[];
    uint2 *tbl = mm_sm;                           /* [J·S][8 MMAs][NT][32 lanes] B fragments */
    float *xs = (float *)(mm_sm + a.J * S * 8 * NT * 32); /* [J·S][GPS] Σx per group and step */
    __shared__ int mine[MM_MINE], nmine;          /* row blocks this block reduces (split K) */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    /* this block's K slice: steps st0 .. st0 + ns - 1 in nch chunks of S (the last may be shorter) */
    const int nst = a.in / CPS, st0 = blockIdx.y * S * a.J, ns = min(S * a.J, nst - st0), nch = (ns + S - 1) / S;
    const size_t rb = (size_t)a.in * BITS / 8;

    /* a row block's words and scales in registers; PP: two sets, the next row block loads into the
     * other one (no copies), else one set whose step is copied out before it is reloaded */
    struct MmSet {
        uint4 w0[S], w1[S];
        SV s0[S], b0[S], s1[S], b1[S];
    };
    MmSet A, B;
    MmRows r{}; /* value-initialised: the lambdas below capture it before the first row block sets it */
    auto load_step = [&](MmSet &o, int j, int i) { /* step i of chunk j into slot i */
        const int st = st0 + j * S + i, G = GB > 64 ? st * 64 / GB : st * GPS;
        o.w0[i] = mm_ld4(r.w0 + (size_t)st * 64);
        o.w1[i] = mm_ld4(r.w1 + (size_t)st * 64);
        o.s0[i] = mm_lds<GPS>(r.s0 + G); o.b0[i] = mm_lds<GPS>(r.b0 + G);
        o.s1[i] = mm_lds<GPS>(r.s1 + G); o.b1[i] = mm_lds<GPS>(r.b1 + G);
    };
    int rbk = blockIdx.x;
    mm_rows(a, rbk * MM_WARPS + warp, g, t, rb, pair, r);
#pragma unroll
    for (int i = 0; i < S; i++)
        if (i < ns) load_step(A, 0, i);
    /* programmatic dependent launch (TERN_CUDA_PDL=1, cuda_common.cuh): everything above reads only
     * weights; x, y, the partials and the counters are touched after the previous kernel has
     * finished and flushed */
    pdl_wait();

    /* stage x (gemv_mma.cuh), or its rmsnorm (every block sums the whole row: bitwise norm.cu's), or
     * first the residual add x' = (x + rmsnorm(h)·w)·s (norm_matmul's res: rmsnorm_add's expression) */
    if (a.xn) {
        __shared__ float red[32];
        const float ih = a.rh ? block_rms_inv([&](int j) { return a.rh[j]; }, a.in, a.eps, red) : 0.0f;
        const float sc = a.rs ? a.rs[0] : 1.0f;
        auto xp = [&](float xv, size_t k) { /* x'[k] from x[k] (x itself without res) */
            if (!a.rh) return xv;
            return res_add(xv, rms_scale(a.rh[k], ih, a.rw != nullptr, a.rw ? a.rw[k] : 0.0f), a.rs != nullptr, sc);
        };
        const float inv = block_rms_inv([&](int j) { return xp(a.x[j], (size_t)j); }, a.in, a.eps, red);
        auto nx = [&](float xv, size_t k) { return rms_scale(xp(xv, k), inv, a.nw != nullptr, a.nw ? a.nw[k] : 0.0f); };
        mm_stage<BITS, GB, S>(tbl, xs, a.x, st0, ns, a.in, nx);
        if (blockIdx.x == 0)
            for (int k = st0 * CPS + threadIdx.x; k < min(a.in, (st0 + ns) * CPS); k += blockDim.x) {
                a.xn[k] = nx(a.x[k], (size_t)k);
                if (a.rh) a.rxo[k] = xp(a.x[k], (size_t)k);
            }
    } else {
        mm_stage<BITS, GB, S>(tbl, xs, a.x, st0, ns, a.in);
    }
    __syncthreads();

    const uint2 *tl = tbl + lane;
    const int units = pair ? 2 * a.rows : a.rows;
    float *pp = a.part + (size_t)blockIdx.y * units;
    /* one chunk of a row block from `cur` while the next unit's steps load into `nxt` (the next chunk
     * of this row block, or the first chunk of the next row block); false after the last. The sums
     * run on over a row block's chunks, in step order, and are stored after its last chunk */
    int ch = 0;
    float acc0 = 0.0f, acc1 = 0.0f;
    auto block = [&](MmSet &cur, MmSet &nxt) -> bool {
        const int unit0 = r.unit0, unit1 = r.unit1;
        const bool live0 = r.live0, live1 = r.live1;
        const bool last = ch + 1 == nch;
        const int nrbk = last ? rbk + gridDim.x : rbk, nch_ = last ? 0 : ch + 1;
        const int nsc = min(S, ns - ch * S), nsn = min(S, ns - nch_ * S); /* steps of this and the next chunk */
        const bool more = nrbk < a.rblocks;
        if (more && last) mm_rows(a, nrbk * MM_WARPS + warp, g, t, rb, pair, r);
#pragma unroll
        for (int sl = 0; sl < S; sl++) {
            if (sl >= nsc) {
                if (more && sl < nsn) load_step(nxt, nch_, sl); /* the next chunk is longer: the first of a row block */
                continue;
            }
            const uint32_t wa[4] = {cur.w0[sl].x, cur.w0[sl].y, cur.w0[sl].z, cur.w0[sl].w};
            const uint32_t wc[4] = {cur.w1[sl].x, cur.w1[sl].y, cur.w1[sl].z, cur.w1[sl].w};
            const SV cs0 = cur.s0[sl], cb0 = cur.b0[sl], cs1 = cur.s1[sl], cb1 = cur.b1[sl];
            if (more && sl < nsn) load_step(nxt, nch_, sl); /* the next unit's step, while this one is multiplied */
            mm_step<GPS, F16S, FOLD>(acc0, acc1, wa, wc, cs0, cb0, cs1, cb1, tl, xs, ch * S + sl, a.magic, t);
        }
        ch = nch_;
        rbk = nrbk;
        if (!last) return more;
        acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
        acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
        acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
        acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
        if (t == 0) {
            if (a.ks == 1) {
                if (pair) {
                    if (live0) mm_store(a, unit0, acc0, acc1);
                } else {
                    if (live0) mm_store(a, unit0, acc0, 0.f);
                    if (live1) mm_store(a, unit1, acc1, 0.f);
                }
            } else if (pair) {
                if (live0) { pp[2 * unit0] = acc0; pp[2 * unit0 + 1] = acc1; }
            } else {
                if (live0) pp[unit0] = acc0;
                if (live1) pp[unit1] = acc1;
            }
        }
        acc0 = acc1 = 0.0f;
        return more;
    };
    if constexpr (PP) {
        while (block(A, B) && block(B, A)) {}
    } else {
        while (block(A, A)) {}
    }
    if (a.ks == 1) return;

    mm_reduce_slices(a, pair, units, mine, &nmine);
}

/* TERN_CUDA_GEMV_PP=1: the two-register-set walk for Q4 (same bits; H200: 25.0 vs 24.5 us on
 * 14336x4096, it spills). FOLD (Q4): the 128 folded into the bias — not the same bits; op test
 * cuda_gemv_mma_fold: rel <= 2.1e-6 against cpu-ref (the default kernel 2.0e-6). Default in the bf16
 * compute mode (H200, session 11, llama3-8b q4 b1 294.3 / 293.7 → 300.5 / 299.1 tok/s; parity bf16 18/18
 * with it), not in f32 / bf16x2 (kept f32-exact there). TERN_CUDA_GEMV_FOLD=0 never, =1 in every mode.
 * Launch bounds for 3 blocks per SM (80 registers, spills) lost: 203 vs 294 tok/s. NOTES (n), (t). */
extern "C" int tern__cuda_gemv_mma_pp, tern__cuda_gemv_mma_fold;
int tern__cuda_gemv_mma_pp = -1, tern__cuda_gemv_mma_fold = -1; /* fold: -1 unread, 0, 1, 2 bf16 mode */

template <int BITS, int GB>
static void mm_go(const tern__cuda *c, dim3 grid, size_t smem, const MmArgs &a, bool f16) {
    cudaStream_t st = c->stream;
    if (tern__cuda_gemv_mma_pp < 0) tern__cuda_gemv_mma_pp = tern__cuda_env_int("TERN_CUDA_GEMV_PP", 0) == 1;
    if (tern__cuda_gemv_mma_fold < 0) {
        tern__cuda_gemv_mma_fold = tern__cuda_env_int("TERN_CUDA_GEMV_FOLD", 2);
        if (tern__cuda_gemv_mma_fold < 0 || tern__cuda_gemv_mma_fold > 2) tern__cuda_gemv_mma_fold = 2;
    }
    const bool fold = tern__cuda_gemv_mma_fold == 1 || (tern__cuda_gemv_mma_fold == 2 && c->compute == TERN_COMPUTE_BF16 &&
                                                        !tern__cuda_bf16_split_all(c)); /* the plain bf16 mode */
    if constexpr (BITS == 4) {
        if (fold) {
            if (f16) tern_launch(st, gemv_mma_kernel<BITS, GB, true, false, true>, grid, 256, smem, a);
            else tern_launch(st, gemv_mma_kernel<BITS, GB, false, false, true>, grid, 256, smem, a);
            return;
        }
        if (tern__cuda_gemv_mma_pp > 0) {
            if (f16) tern_launch(st, gemv_mma_kernel<BITS, GB, true, true, false>, grid, 256, smem, a);
            else tern_launch(st, gemv_mma_kernel<BITS, GB, false, true, false>, grid, 256, smem, a);
            return;
        }
    }
    if (f16) tern_launch(st, gemv_mma_kernel<BITS, GB, true, false, false>, grid, 256, smem, a);
    else tern_launch(st, gemv_mma_kernel<BITS, GB, false, false, false>, grid, 256, smem, a);
}

/* TERN_CUDA_GEMV_MMA: 1 (default) Q4 only, 2 Q4 and Q8, 0 gemv.cu's kernels for both. Q8 stays on
 * gemv1 by default: measured slower here (14336x4096 q8 g64: 43.9 vs 31.3 us; a q8 code takes two
 * k-slots, so twice the MMAs and B loads per byte) — bench/NOTES.md (i). */
extern "C" int tern__cuda_gemv_mma_on;
int tern__cuda_gemv_mma_on = -1;
extern "C" unsigned long long tern__cuda_gemv_mma_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_gemv_mma_calls = 0;

extern "C" void tern__cuda_gemv_mma_init(tern__cuda *c) {
    if (!c->mm_cnt && cudaMalloc((void **)&c->mm_cnt, MM_CNT * sizeof(int)) == cudaSuccess)
        cudaMemsetAsync(c->mm_cnt, 0, MM_CNT * sizeof(int), c->stream); /* ordered before our kernels */
    cudaGetLastError();
}

/* Chunks per K slice (TERN_MM_J=1..4 fixes it; read once, tests may set it). A slice of S steps is one
 * load of a warp's registers, so with one chunk a block staged x for a single short walk of each of
 * its row blocks (14336x4096: 28 slices, 896 blocks in 3.4 waves, ncu 22 % occupancy). Longer slices
 * amortise that, but leave fewer warps (row tiles x slices) for small matrices: J = 4 drops while those
 * would fall under 12 per SM. H200 (NOTES (t)), µs J = 1 / 2 / 4: 4096x4096 8.5 / 10.8 / 17.0, 14336x4096 21.2 / 19.0 / 18.9, 4096x14336 26.2 / 22.8 / 19.8, 128256x4096 155.9 /
 * 132.7 / 128.8. A row's bits depend on its slices, so on J: separate and fused ops of one `in` agree
 * bitwise while both keep the same J (small ones: J = 1), and tensor-parallel halves may not. */
extern "C" int tern__cuda_mm_j;
int tern__cuda_mm_j = -1;
static int mm_chunks(const tern__cuda *c, int ks1, int tiles) {
    if (tern__cuda_mm_j < 0) tern__cuda_mm_j = tern__cuda_env_int("TERN_MM_J", 0);
    if (tern__cuda_mm_j > 0) return tern__cuda_mm_j < MM_JMAX ? tern__cuda_mm_j : MM_JMAX;
    int j = ks1 < MM_JMAX ? ks1 : MM_JMAX;
    const long want = 12L * (c->n_sm > 0 ? c->n_sm : 132);
    while (j > 1 && (long)tiles * ((ks1 + j - 1) / j) < want) j--;
    return j < 1 ? 1 : j;
}

/* The launch geometry of matrices w[0..k) for x in this mode: output units' rows (pair: outputs), row
 * blocks, K slices and their chunks (J·S steps; mm_chunks: a function of `in`, the format and, for
 * small matrices, the row count — see there for what stays bitwise). Returns 0 for every case this
 * kernel declines. */
static int mm_plan(const tern__cuda *c, const tern__cuda_w *const *w, int k, const float *x, int mode, int *rows_out,
                   int *rblocks_out, int *ks_out, int *j_out) {
    if (tern__cuda_gemv_mma_on < 0) tern__cuda_gemv_mma_on = tern__cuda_env_int("TERN_CUDA_GEMV_MMA", 1);
    if (!tern__cuda_gemv_mma_on || !c->mm_cnt || k < 1 || k > 3 || ((uintptr_t)x & 15)) return 0;
    const tern__cuda_w *w0 = w[0];
    if (w0->dtype != TERN_DT_Q || (w0->bits != 4 && (w0->bits != 8 || tern__cuda_gemv_mma_on < 2))) return 0;
    if (w0->sdtype != TERN_DT_BF16 && w0->sdtype != TERN_DT_F16) return 0;
    const int gs = w0->group_size;
    if ((gs != 32 && gs != 64 && gs != 128) || w0->in <= 0 || w0->in % gs) return 0;
    int rows = w0->out;
    for (int i = 1; i < k; i++) {
        if (w[i]->dtype != w0->dtype || w[i]->in != w0->in || w[i]->bits != w0->bits ||
            w[i]->group_size != gs || w[i]->sdtype != w0->sdtype)
            return 0;
        rows += w[i]->out;
    }
    const bool pair = mode == G1_SILU || mode == G1_GELU;
    if (pair && (k != 2 || w[1]->out != w0->out)) return 0;
    if (pair) rows = w0->out; /* gate = matrix 0, up = matrix 1 */
    *rows_out = rows;
    *rblocks_out = *ks_out = 0;
    if (rows <= 0) return 1;
    const int cps = 512 / w0->bits; /* inputs per 64-byte step */
    if (w0->in % cps) return 0;
    const int rblocks = (rows + (pair ? 63 : 127)) / (pair ? 64 : 128);
    const int steps = gs * w0->bits / 8 == 16 ? 2 : 4; /* = the kernel's S */
    const int nst = w0->in / cps, J = mm_chunks(c, (nst + steps - 1) / steps, pair ? (rows + 7) / 8 : (rows + 15) / 16);
    const int ks = (nst + J * steps - 1) / (J * steps);
    const size_t units = pair ? 2 * (size_t)rows : (size_t)rows;
    if (ks > 65535 || (ks > 1 && ((size_t)ks * units > TERN_CUDA_PART_FLOATS || rblocks > MM_CNT))) return 0;
    *rblocks_out = rblocks;
    *ks_out = ks;
    *j_out = J;
    return 1;
}

/* Does tern__cuda_gemv_mma serve matrices w[0..k) for x in this mode? (Without a launch: the fused
 * pre-norm op (gemv1.cu) decides where a row goes before it stages anything.) */
extern "C" int tern__cuda_gemv_mma_serves(const tern__cuda *c, const tern__cuda_w *const *w, int k, const float *x,
                                          int mode) {
    int rows, rblocks, ks, J;
    return mm_plan(c, w, k, x, mode, &rows, &rblocks, &ks, &J);
}

/* y[i] (op) W_i·x for matrices w[0..k) sharing `in` and the format (mode: G1_*). Returns 1 when it
 * ran, 0 when the format or shape is not served here (the caller runs gemv.cu's kernels). */
extern "C" int tern__cuda_gemv_mma(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e, int k,
                                   const float *x, int mode) {
    return tern__cuda_gemv_mma_norm(c, y, w, e, k, x, mode, NULL, NULL, 0.0f, NULL);
}

/* as tern__cuda_gemv_mma; xn != NULL: x staged as rmsnorm(x)·nw (written to xn as well); res: of x' (the
 * residual add, written to res->x_out) */
extern "C" int tern__cuda_gemv_mma_norm(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e,
                                        int k, const float *x, int mode, const float *nw, float *xn, float eps,
                                        const tern_norm_res *res) {
    int rows, rblocks, ks, J;
    if (!mm_plan(c, w, k, x, mode, &rows, &rblocks, &ks, &J)) return 0;
    if (rows <= 0) return 1;
    const tern__cuda_w *w0 = w[0];
    const int gs = w0->group_size;
    MmArgs a = {};
    mat_ptrs(a.data, a.scales, a.biases, a.y, a.out, y, w, e, k);
    for (int i = k; i < 3; i++) { a.data[i] = a.data[0]; a.scales[i] = a.scales[0]; a.biases[i] = a.biases[0]; }
    a.rows = rows; /* mm_plan's: Σ out, or the outputs of a gate/up pair */
    a.nm = k;
    a.in = w0->in;
    a.ng = w0->in / gs;
    a.mode = mode;
    a.x = x;
    set_norm_args(a, nw, xn, eps, res);
    a.part = c->part;
    a.cnt = c->mm_cnt;
    a.magic = 0x43004300u;
    a.ks = ks;
    a.J = J;
    const int gb = gs * w0->bits / 8;
    const size_t smem = (size_t)J * (4 * 8 * 32 * sizeof(uint2) + 4 * 4 * sizeof(float)); /* B table (S·NT <= 4) + Σx, per chunk */
    /* persistent over row blocks: about two resident blocks per SM in all (TERN_MM_GRID=0: one block
     * per row block); which block walks a row block never changes its bits */
    static int grid_mode = -1;
    if (grid_mode < 0) grid_mode = tern__cuda_env_int("TERN_MM_GRID", 1);
    int gx = rblocks;
    /* with many slices the walk's serial tail reductions cost more (4096x14336 q4: 38.5 us walking
     * vs 30.8 not; 14336x4096 26.6 vs 30.2; lm head 167.5 vs 219.2) */
    if (grid_mode > 0 && a.ks <= 8) {
        const int want = (grid_mode * 2 * (c->n_sm > 0 ? c->n_sm : 132) + a.ks - 1) / a.ks;
        gx = want < rblocks ? want : rblocks;
        const int lo = (rblocks + MM_MINE - 1) / MM_MINE;
        if (gx < lo) gx = lo;
    }
    if (a.ks > 1 && (rblocks + gx - 1) / gx > MM_MINE) gx = (rblocks + MM_MINE - 1) / MM_MINE;
    a.rblocks = rblocks;
    const dim3 grid((unsigned)gx, (unsigned)a.ks);
    cudaSetDevice(c->device);
    const bool f16 = w0->sdtype == TERN_DT_F16;
    if (w0->bits == 4) {
        if (gb == 16) mm_go<4, 16>(c, grid, smem, a, f16);
        else if (gb == 32) mm_go<4, 32>(c, grid, smem, a, f16);
        else mm_go<4, 64>(c, grid, smem, a, f16);
    } else {
        if (gb == 32) mm_go<8, 32>(c, grid, smem, a, f16);
        else if (gb == 64) mm_go<8, 64>(c, grid, smem, a, f16);
        else mm_go<8, 128>(c, grid, smem, a, f16);
    }
    tern__cuda_check(c, "gemv_mma");
    tern__cuda_gemv_mma_calls++;
    return 1;
}

/* ---- bench probe (bench_cuda --pattern): the load pattern alone, to separate memory from math ----
 * mode 0: this kernel's pattern (warp = 16 rows, lane (g, t) 16 bytes at 64·step + 16·t of rows g and
 * g+8, blocks of 8 warps x 4 steps, K slices on blockIdx.y); 1: the same, one warp walks all steps of
 * its rows (no K slices); 2: warp = 2 rows read 512 contiguous bytes per instruction (gemv1's
 * pattern); 3: the matrix as one flat stream. Each lane XORs what it read; one word per warp out. */
__global__ void mm_probe_kernel(const uint8_t *w, int rows, int rb, int mode, uint32_t *sink) {
    pdl_start();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t acc = 0;
    if (mode <= 1) {
        const int r0 = min((blockIdx.x * 8 + warp) * 16 + g, rows - 1), r1 = min(r0 + 8, rows - 1);
        const int nst = rb / 64, s0 = mode == 0 ? blockIdx.y * 4 : 0, s1 = mode == 0 ? min(s0 + 4, nst) : nst;
        for (int s = s0; s < s1; s++) {
            const uint4 a = __ldg((const uint4 *)(w + (size_t)r0 * rb + s * 64 + t * 16));
            const uint4 b = __ldg((const uint4 *)(w + (size_t)r1 * rb + s * 64 + t * 16));
            acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
        }
    } else if (mode == 2) {
        const int r0 = (blockIdx.x * 8 + warp) * 2;
        for (int r = r0; r < min(r0 + 2, rows); r++)
            for (int o = lane * 16; o < rb; o += 512) {
                const uint4 a = __ldg((const uint4 *)(w + (size_t)r * rb + o));
                acc ^= a.x ^ a.y ^ a.z ^ a.w;
            }
    } else {
        const size_t n = (size_t)rows * rb / 16;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
            const uint4 a = __ldg((const uint4 *)w + i);
            acc ^= a.x ^ a.y ^ a.z ^ a.w;
        }
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if (lane == 0) sink[(blockIdx.y * gridDim.x + blockIdx.x) * 8 + warp] = acc;
}

extern "C" void tern__cuda_mm_probe(tern__cuda *c, const void *w, int rows, int rb, int mode, void *sink) {
    dim3 grid;
    if (mode == 0) grid = dim3((unsigned)((rows + 127) / 128), (unsigned)((rb / 64 + 3) / 4));
    else if (mode == 1) grid = dim3((unsigned)((rows + 127) / 128));
    else if (mode == 2) grid = dim3((unsigned)((rows + 15) / 16));
    else grid = dim3((unsigned)(c->n_sm * 8));
    tern_launch(c->stream, mm_probe_kernel, grid, 256, 0, (const uint8_t *)w, rows, rb, mode, (uint32_t *)sink);
    tern__cuda_check(c, "mm_probe");
}

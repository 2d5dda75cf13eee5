/*
 * ple_mma.cu — Gemma 4's per-layer input block at batch steps (ops.h ple_block, gemm.c tern__cuda_ple_block with
 * TERN_CUDA_PLE_N=2, opt-in) on two small tensor-core kernels of our own instead of two cuBLASLt GEMMs and the
 * activation launch between them.
 *
 * Why: the block's matrices are tiny (gemma4-e4b: the gate 256 x 2560 and the projection 2560 x 256, 1.3 MB each),
 * and at 64 rows cuBLASLt runs the gate on 32 CTAs at 7.4 µs whatever answer it is asked for (0.18 TB/s; every
 * heuristic answer 6.4-6.5 µs, bench_cuda --ltsweep BENCH_LT_SET=e4b) and the projection at ~7 µs, with act_mul_bf16
 * (3.1 µs) between: ~17.6 µs of a ~164 µs layer (H100 ncu, session 70, NOTES (cd)).
 *
 * ple_gate_kernel: a block of 4 warps owns BM = 32 gate rows and a range of K (the K split S puts ~one block on every
 * SM: e4b's 8 row tiles x 16 ranges of 160 inputs); its weight tile (loaded before pdl_wait: weights) and the staged x
 * rows of that range (bf16, zero-padded to 64 rows) land in shared memory by cp.async, warp w multiplies x rows
 * 16w..16w+15 of its column tile by the 32 rows (mma.sync m16n8k16, f32) and stores its f32 partial to c->part. The
 * last block of a row tile (split_k.cuh's hand-off; the counter reset for the next launch) sums the S partials in
 * range order — deterministic — and writes act(g)·v (gelu_tanh_mul's / silu_mul's element) rounded to bf16: the
 * projection's input. ple_proj_kernel: a block owns 16 projection rows and the whole K (the gate's width, ≤ 256);
 * warp w multiplies x rows 16w..16w+15 of its column tile and writes y (f32) from its fragments.
 * Numerics: the plain bf16 mode's (bf16 x and weights, f32 sums), in another order than cuBLASLt's, so not the bits of
 * TERN_CUDA_PLE_N=1 (op test cuda_ple_mma: within the bf16 bound of the separate ops). 1..128 rows (64-row column
 * tiles over grid.z, each with its own partials and counters), BF16 weights, the gate's width a multiple of 16 up to
 * 256, inputs a multiple of 16; anything else declines (the caller's GEMMs run).
 * Written in session 70 after the device budget ran out: unrun.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/split_k.cuh"

#define PM_NP 64      /* x rows a block holds (zero-padded); grid.z: 64-row column tiles, up to PM_NCT */
#define PM_NCT 2
#define PM_BM 32      /* gate rows a block */
#define PM_PM 16      /* projection rows a block */
#define PM_KS 192     /* inputs a gate block holds at most */
#define PM_PMAX 256   /* the gate's width (the projection's K) at most */
#define PM_LDG (PM_KS + 8)   /* row strides in bf16 elements: 25 / 33 chunks of 16 bytes, odd, so the 8 rows an */
#define PM_LDP (PM_PMAX + 8) /* ldmatrix reads fall in 8 different bank groups */

extern "C" unsigned long long tern__cuda_ple_mma_calls;
unsigned long long tern__cuda_ple_mma_calls = 0;

struct PleArgs {
    const __nv_bfloat16 *wg, *wp, *x; /* x: [n][in] staged bf16 */
    __nv_bfloat16 *pb;               /* [n][P]: act(gate)·v in bf16, the projection's input */
    float *y, *part;                 /* y [n][H] */
    const float *v;                  /* row r of the slice at v + r·ldv */
    long ldv;
    int *cnt;
    int n, in, P, H, S, units, op;   /* units: K in steps of 16 */
    int tiles;                       /* gate row tiles (grid.x of the gate kernel) */
};

/* acc[mi][nt] += A (rows 16mi.. of the tile at a, ld lda) · B (x rows xr0..xr0+15 at b, ld ldb) over one k16 step ks */
__device__ __forceinline__ void pm_step(float (*acc)[2][4], int nm, uint32_t a, int lda, uint32_t b, int ldb, int ks,
                                        int lane) {
    uint32_t bf[4];
    mma_ldsm_x4(bf, b + (uint32_t)((((lane & 7) + ((lane >> 4) << 3)) * ldb + ks * 16 + ((lane >> 3) & 1) * 8) * 2));
#pragma unroll 2
    for (int mi = 0; mi < nm; mi++) {
        uint32_t af[4];
        mma_ldsm_x4(af, a + (uint32_t)(((16 * mi + (lane & 15)) * lda + ks * 16 + (lane >> 4) * 8) * 2));
        mma_bf16(acc[mi][0], af, bf[0], bf[1]);
        mma_bf16(acc[mi][1], af, bf[2], bf[3]);
    }
}

/* rows x cpr 16-byte chunks into shared [rows][lds]: row r from src + (r0 + r)·ldg, rows from `valid` on zero-filled
 * (nothing read) */
__device__ __forceinline__ void pm_load(__nv_bfloat16 *dst, int lds, const __nv_bfloat16 *src, size_t ldg, int r0,
                                        int valid, int rows, int cpr) {
    for (int i = threadIdx.x; i < rows * cpr; i += blockDim.x) {
        const int r = i / cpr, ch = i % cpr;
        const bool ok = r < valid;
        mma_cp16(mma_smem_u32(dst + r * lds + ch * 8), src + (size_t)(r0 + (ok ? r : 0)) * ldg + ch * 8, ok);
    }
}

__global__ void __launch_bounds__(128) ple_gate_kernel(PleArgs a) {
    __shared__ __align__(16) __nv_bfloat16 sw[PM_BM * PM_LDG], sx[PM_NP * PM_LDG];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int tile = blockIdx.x, s = blockIdx.y, r0 = tile * PM_BM, j0 = blockIdx.z * PM_NP;
    const int nr = min(PM_NP, a.n - j0); /* x rows of this column tile */
    const int u0 = (int)((long)s * a.units / a.S), u1 = (int)((long)(s + 1) * a.units / a.S);
    const int k0 = u0 * 16, cpr = (u1 - u0) * 2; /* 16-byte chunks a row */
    pdl_trigger();
    pm_load(sw, PM_LDG, a.wg + k0, a.in, r0, a.P - r0, PM_BM, cpr); /* weights: not the previous kernel's */
    pdl_wait();
    pm_load(sx, PM_LDG, a.x + k0, a.in, j0, nr, PM_NP, cpr);
    mma_cp_commit();
    mma_cp_wait<0>();
    __syncthreads();
    float acc[2][2][4] = {};
    const uint32_t wa = mma_smem_u32(sw), xa = mma_smem_u32(sx + 16 * warp * PM_LDG);
    for (int ks = 0; ks < u1 - u0; ks++) pm_step(acc, 2, wa, PM_LDG, xa, PM_LDG, ks, lane);
    /* fragment (mi, nt): c0 gate row 16mi + gq, x row 16w + 8nt + 2tq; c1 the next x row; c2 / c3 gate row + 8 */
    float *pp = a.part + ((size_t)s * PM_NCT * PM_NP + j0) * a.P; /* [S][PM_NCT·64 rows][P] */
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int o = r0 + 16 * mi + gq + (e >> 1) * 8, j = 16 * warp + 8 * nt + 2 * tq + (e & 1);
                if (o < a.P && j < nr) pp[(size_t)j * a.P + o] = acc[mi][nt][e];
            }
    int *const cnt = a.cnt + blockIdx.z * a.tiles + tile;
    if (!tern_block_last(cnt, a.S)) return;
    for (int i = tid; i < nr * PM_BM; i += 128) {
        const int j = j0 + i / PM_BM, o = r0 + i % PM_BM;
        if (o >= a.P) continue;
        float g = 0.0f;
        for (int t = 0; t < a.S; t++) g += __ldcg(a.part + ((size_t)t * PM_NCT * PM_NP + j) * a.P + o);
        const float vv = a.v[(size_t)j * a.ldv + o];
        a.pb[(size_t)j * a.P + o] = __float2bfloat16_rn(a.op == TERN__EW_SILU ? silu(g) * vv : gelu_tanh(g) * vv);
    }
    if (tid == 0) *cnt = 0; /* zero for the next launch (split_k.cuh's pool contract) */
}

__global__ void __launch_bounds__(128) ple_proj_kernel(PleArgs a) {
    __shared__ __align__(16) __nv_bfloat16 sw[PM_PM * PM_LDP], sx[PM_NP * PM_LDP];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int r0 = blockIdx.x * PM_PM, cpr = a.P / 8, j0 = blockIdx.y * PM_NP, nr = min(PM_NP, a.n - j0);
    pdl_trigger();
    pm_load(sw, PM_LDP, a.wp, a.P, r0, a.H - r0, PM_PM, cpr);
    pdl_wait();
    pm_load(sx, PM_LDP, a.pb, a.P, j0, nr, PM_NP, cpr);
    mma_cp_commit();
    mma_cp_wait<0>();
    __syncthreads();
    float acc[1][2][4] = {};
    const uint32_t wa = mma_smem_u32(sw), xa = mma_smem_u32(sx + 16 * warp * PM_LDP);
    for (int ks = 0; ks < a.P / 16; ks++) pm_step(acc, 1, wa, PM_LDP, xa, PM_LDP, ks, lane);
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int o = r0 + gq + (e >> 1) * 8, j = 16 * warp + 8 * nt + 2 * tq + (e & 1);
            if (o < a.H && j < nr) a.y[(size_t)(j0 + j) * a.H + o] = acc[0][nt][e];
        }
}

/* gemm.c: y [n][H] = (act(xb·wgᵀ) ⊙ v)·wpᵀ with xb the staged bf16 x [n][in] (16-byte aligned), pb scratch for n·P
 * bf16; 1 when launched, 0 when not served (nothing written) */
extern "C" int tern__cuda_ple_mma(tern__cuda *c, float *y, const void *xb, void *pb, int n, const tern__cuda_w *wg,
                                  const tern__cuda_w *wp, int op, const float *v, long ldv) {
    const int in = wg->in, P = wg->out, H = wp->out;
    if (n < 1 || n > PM_NP * PM_NCT || !c->mm_cnt || wg->dtype != TERN_DT_BF16 || wp->dtype != TERN_DT_BF16 ||
        wg->nmat > 1 || wp->nmat > 1 || in % 16 || P % 16 || P > PM_PMAX || wp->in != P || H < 1 ||
        ((uintptr_t)xb & 15) || ((uintptr_t)pb & 15) || ((uintptr_t)wg->data & 15) || ((uintptr_t)wp->data & 15))
        return 0;
    const int tiles = (P + PM_BM - 1) / PM_BM, units = in / 16, nct = (n + PM_NP - 1) / PM_NP;
    int S = (c->n_sm + tiles * nct - 1) / (tiles * nct); /* about one block an SM */
    const int smin = (units * 16 + PM_KS - 1) / PM_KS;
    if (S < smin) S = smin;
    if (S > units) S = units;
    if (S > 64 || (size_t)S * PM_NCT * PM_NP * P > TERN_CUDA_PART_FLOATS || tiles * PM_NCT > TERN_CUDA_MM_CNT - 1)
        return 0;
    PleArgs a = {(const __nv_bfloat16 *)wg->data, (const __nv_bfloat16 *)wp->data, (const __nv_bfloat16 *)xb,
                 (__nv_bfloat16 *)pb, y, c->part, v, ldv, c->mm_cnt, n, in, P, H, S, units, op, tiles};
    cudaSetDevice(c->device);
    tern_launch(c->stream, ple_gate_kernel, dim3((unsigned)tiles, (unsigned)S, (unsigned)nct), 128, 0, a);
    tern_launch(c->stream, ple_proj_kernel, dim3((unsigned)((H + PM_PM - 1) / PM_PM), (unsigned)nct), 128, 0, a);
    tern__cuda_check(c, "ple_mma");
    tern__cuda_ple_mma_calls++;
    return 1;
}

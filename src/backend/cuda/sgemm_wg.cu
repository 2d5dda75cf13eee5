/*
 * sgemm_wg.cu — BF16 weights times 17..128 activation rows (batch decode, speculative verification) on Hopper's
 * warpgroup MMA with A and B both from shared memory: sm_90a only (built for that target alone, like
 * qgemm_q4_wg.cu). TERN_CUDA_SGW=1 turns it on (opt-in: written after session 17's last device call, untimed);
 * sgemm.cu's tern__cuda_sgemm hands it every form it takes (plain, q|k|v in one grid, y += W·x, act(gate)·up).
 *
 * Why: at 64 rows the bf16 mode's GEMMs stream below the copy rate — cuBLASLt 3.2–3.8 TB/s (gate|up 61.5 µs,
 * down 36.4 + a 4.2 µs split-K reduce, o 14.0) and sgemm.cu's q|k|v 24.4 µs for 50 MB (2.07 TB/s) per llama3-8b
 * layer (session 16's ncu, NOTES (y)). This is qgemm_q4_wg.cu without the decode: the weight tile itself is
 * wgmma's A operand, copied by cp.async straight into the layout the tensor cores read.
 *
 * Block: 8 warps = 2 warpgroups × 64 weight rows (BM = 128; the pair form: 64 gate rows, then the same 64 up
 * rows) and BN = 8·NT x rows (32 or 64; more rows: grid.z), over K in tiles of 64 inputs through a 4-stage
 * cp.async ring (qgemm_q4.cuh's q4_ring: the first weight tiles before pdl_wait, fence.proxy.async before the
 * barrier because wgmma reads through the async proxy). A stage is W [128 rows][128 bytes] then x [BN rows][128
 * bytes], both K-major with the 128-byte swizzle (row r at 128·r, its 16-byte chunk c at chunk c ^ (r & 7): 8-row
 * groups 1024 bytes apart, bases 1024-aligned), so a k-step of 16 inputs is a 32-byte column: warpgroup w issues
 * 4 wgmma m64nNk16 per tile with A at W + 8192·w + 32·j and B at x + 32·j, commits, waits. 24 KB a stage at
 * NT = 8: two blocks per SM. x is the caller's staged bf16 [n][in] (gemm.c's stage_x) in natural order.
 * Split K over blockIdx.y into partials summed by qgemm_q4.cu's qg4_reduce (tern__cuda_qg4_reduce_run) (the same Q4Args: w holds the BF16
 * rows, rb = 2·in bytes); the accumulator is mma.sync's C per 8 columns, so the epilogue is qgemm_q4_wg.cu's.
 * Numerics: bf16 W times bf16 x with f32 accumulation — the plain bf16 mode's contract, as sgemm.cu and
 * cuBLASLt (the order of the sums differs from theirs). Op test cuda_sgemm_wg.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/qgemm_frag.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/qgemm_q4.cuh"
#include "backend/cuda/wgmma.cuh"

#define SW_ST 4   /* ring stages */
#define SW_BK 64  /* inputs per tile: one 128-byte swizzled row */
#define SW_WB 16384 /* W bytes a stage: 128 rows × 128 */

extern "C" int tern__cuda_sgw, tern__cuda_sgw_ok, tern__cuda_sgw_split;
int tern__cuda_sgw = -1;      /* -1 unread (TERN_CUDA_SGW, default 0); tests set it */
int tern__cuda_sgw_ok = 0;    /* the sm_90a image loaded on the device opened (set at init) */
int tern__cuda_sgw_split = 0; /* 0: the plan below; S > 0: that many K parts (tests) */
extern "C" unsigned long long tern__cuda_sgw_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_sgw_calls = 0;

template <int NT> struct SwGeo {
    static constexpr int BN = NT * 8, XB = BN * 128, STG = SW_WB + XB; /* multiples of 1024 */
};

template <int NT, bool PAIR>
__global__ void __launch_bounds__(256, 2) sgw_kernel(Q4Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Geo = SwGeo<NT>;
    constexpr int BN = Geo::BN, STG = Geo::STG, XJ = (BN * 8 + 255) / 256;
    extern __shared__ __align__(16) uint8_t sw_raw[];
    const uint32_t raw = mma_smem_u32(sw_raw), pad = (1024u - (raw & 1023u)) & 1023u;
    uint8_t *const sm = sw_raw + pad; /* 1024-aligned: the swizzle repeats from the stage bases */
    const uint32_t smb = raw + pad;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wg = warp >> 2;
    const int mi = PAIR ? wg
                 : a.k > 2 && (int)blockIdx.x >= a.m[2].mb0 ? 2 : a.k > 1 && (int)blockIdx.x >= a.m[1].mb0 ? 1 : 0;
    const int out = a.m[mi].out;
    const int rowb = PAIR ? (int)blockIdx.x * 64 : ((int)blockIdx.x - a.m[mi].mb0) * QG_BM, n0 = blockIdx.z * BN;
    const int wr = rowb + (PAIR ? warp & 3 : warp) * 16; /* this warp's first row in its matrix */
    const int kt0 = blockIdx.y * a.kt_per, nkt = min(a.kt_per, a.nkt - kt0);

    /* copies from addresses formed once: W chunk j of a thread (c = tid + 256j: row c / 8, chunk c % 8) from
     * wp[j] + 128·kt; x chunk j (row c / 8 of the BN) from xp[j] + 128·kt; destinations swizzled */
    const uint8_t *wp[4], *xp[XJ];
    uint32_t wok = 0, xok = 0, wd[4], xd[XJ];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int c = threadIdx.x + 256 * j, r = c >> 3, ch = c & 7;
        const int m = PAIR ? r >> 6 : mi, row = PAIR ? rowb + (r & 63) : rowb + r, o = a.m[m].out;
        wp[j] = a.m[m].w + (size_t)min(row, o - 1) * a.rb + (size_t)kt0 * (SW_BK * 2) + ch * 16;
        wok |= (uint32_t)(row < o) << j;
        wd[j] = (uint32_t)(r * 128 + ((ch ^ (r & 7)) << 4));
    }
#pragma unroll
    for (int j = 0; j < XJ; j++) {
        const int c = threadIdx.x + 256 * j, r = c >> 3, ch = c & 7;
        xp[j] = (const uint8_t *)a.x + ((size_t)min(n0 + r, a.n - 1) * a.in + (size_t)kt0 * SW_BK) * 2 + ch * 16;
        xok |= (uint32_t)(n0 + r < a.n && c < BN * 8) << j;
        xd[j] = (uint32_t)(SW_WB + r * 128 + ((ch ^ (r & 7)) << 4));
    }
    auto load_w = [&](int kt, int u) {
#pragma unroll
        for (int j = 0; j < 4; j++) mma_cp16(smb + u * STG + wd[j], wp[j] + (size_t)kt * (SW_BK * 2), wok >> j & 1);
    };
    auto load_x = [&](int kt, int u) {
#pragma unroll
        for (int j = 0; j < XJ; j++)
            if (BN * 8 % 256 == 0 || threadIdx.x + 256 * j < BN * 8)
                mma_cp16(smb + u * STG + xd[j], xp[j] + (size_t)kt * (SW_BK * 2), xok >> j & 1);
    };
    auto no_sb = [](int, int) {};

    float acc[NT * 4];
#pragma unroll
    for (int i = 0; i < NT * 4; i++) acc[i] = 0.0f;

    q4_ring<SW_ST, true>(nkt, load_w, load_x, no_sb, [&](int u) {
        const uint32_t st = smb + u * STG;
        qw_fence();
#pragma unroll
        for (int j = 0; j < SW_BK / 16; j++)
            qw_mma_ss<NT>(acc, qw_desc(st + wg * 8192 + 32 * j), qw_desc(st + SW_WB + 32 * j));
        qw_commit();
        qw_wait(); /* before the next tile's barrier: its refill overwrites this slot */
    });

    qw_store<NT, PAIR>(a, acc, sm, mi, out, rowb, wr, n0, warp, g, t);
#else
    (void)a;
    __trap(); /* not reached: the launcher runs this only where the sm_90a image loaded */
#endif
}

template <int NT> static size_t sw_smem() { return (size_t)SW_ST * SwGeo<NT>::STG + 1024; }

/* cuda_internal.h: at open (sgemm.cu's init) the instances' shared-memory limits; their success says the
 * sm_90a image is there for this GPU */
extern "C" void tern__cuda_sgw_init(void) {
    const cudaFuncAttribute at = cudaFuncAttributeMaxDynamicSharedMemorySize;
    tern__cuda_sgw_ok = cudaFuncSetAttribute(sgw_kernel<8, false>, at, (int)sw_smem<8>()) == cudaSuccess &&
                        cudaFuncSetAttribute(sgw_kernel<4, false>, at, (int)sw_smem<4>()) == cudaSuccess &&
                        cudaFuncSetAttribute(sgw_kernel<8, true>, at, (int)sw_smem<8>()) == cudaSuccess &&
                        cudaFuncSetAttribute(sgw_kernel<4, true>, at, (int)sw_smem<4>()) == cudaSuccess;
    cudaGetLastError();
}

static bool sgw_on(void) {
    if (tern__cuda_sgw < 0) tern__cuda_sgw = tern__cuda_env_int("TERN_CUDA_SGW", 0) != 0;
    return tern__cuda_sgw && tern__cuda_sgw_ok;
}

/* cuda_internal.h */
extern "C" int tern__cuda_sgw_wants(int n) { return sgw_on() && n >= 17 && n <= 128; }

/* cuda_internal.h: y[i] (op) W_i·x for n rows of bf16 x staged at xb ([n][in]) and BF16 matrices w[0..k)
 * sharing in; 1 when it ran, 0 when not taken (off, no sm_90a image, a shape or form it does not serve) */
extern "C" int tern__cuda_sgw_run(tern__cuda *c, int k, float *const *y, const void *xb, int n,
                                  const tern__cuda_w *const *w, int mode) {
    if (!tern__cuda_sgw_wants(n) || k < 1 || k > 3 || ((uintptr_t)xb & 15)) return 0;
    const bool pair = mode == G1_SILU || mode == G1_GELU;
    if ((pair && (k != 2 || w[1]->out != w[0]->out)) || (mode == G1_RES && k != 1)) return 0;
    const int in = w[0]->in;
    if (in <= 0 || in % SW_BK) return 0;
    for (int i = 0; i < k; i++)
        if (w[i]->dtype != TERN_DT_BF16 || w[i]->in != in || w[i]->out <= 0 || ((uintptr_t)w[i]->data & 15)) return 0;
    Q4Args a = {};
    size_t rows;
    int mb = q4_mats(a, y, w, k, n, 0, &rows);
    if (pair) mb = (w[0]->out + 63) / 64; /* a block per 64 gate rows and the same 64 up rows */
    const int nt = n <= 32 ? 4 : 8, nb = (n + nt * 8 - 1) / (nt * 8);
    a.x = (const uint4 *)xb;
    a.part = c->part;
    a.rb = (size_t)in * 2;
    a.slice = (size_t)n * rows;
    a.k = k;
    a.mode = mode;
    a.in = in;
    a.n = n;
    a.nkt = in / SW_BK;
    /* split K until the grid fills two blocks per SM, at least 2·ST tiles a part */
    const long base = (long)mb * nb, target = 2L * (c->n_sm > 0 ? c->n_sm : 132);
    int S = tern__cuda_sgw_split > 0 ? tern__cuda_sgw_split : base < target ? (int)((target + base - 1) / base) : 1;
    if (S > a.nkt / (2 * SW_ST)) S = a.nkt / (2 * SW_ST);
    if (tern__cuda_sgw_split > 0 && S < tern__cuda_sgw_split && tern__cuda_sgw_split <= a.nkt) S = tern__cuda_sgw_split;
    if (S < 1) S = 1;
    while (S > 1 && (size_t)S * a.slice > TERN_CUDA_PART_FLOATS) S--;
    a.kt_per = (a.nkt + S - 1) / S;
    S = (a.nkt + a.kt_per - 1) / a.kt_per;
    a.direct = S == 1;
    cudaSetDevice(c->device);
    const dim3 grid((unsigned)mb, (unsigned)S, (unsigned)nb);
    if (pair && nt == 8) tern_launch(c->stream, sgw_kernel<8, true>, grid, 256, sw_smem<8>(), a);
    else if (pair) tern_launch(c->stream, sgw_kernel<4, true>, grid, 256, sw_smem<4>(), a);
    else if (nt == 8) tern_launch(c->stream, sgw_kernel<8, false>, grid, 256, sw_smem<8>(), a);
    else tern_launch(c->stream, sgw_kernel<4, false>, grid, 256, sw_smem<4>(), a);
    tern__cuda_check(c, "sgemm_wg");
    if (!a.direct) tern__cuda_qg4_reduce_run(c, a, S, "sgemm_wg reduce");
    tern__cuda_sgw_calls++;
    return 1;
}

/*
 * qgemm_q4_ws.cu — Q4 (BF16 scales) times 33..128 rows (64-row column tiles) on wgmma with the weights' decode
 * in a producer warpgroup: warp-specialized, sm_90a only (built for that target alone, like qgemm_q4_wg.cu).
 * TERN_CUDA_QG4_WS=1 turns it on (opt-in: written after session 16's last device call, untimed).
 *
 * Why: qgemm_q4_wg.cu's 8 warps each decode their rows into register A fragments, issue a tile's 8 wgmmas
 * and wait for them before the next tile, so decode and MMA alternate (ncu at 64 rows: issue slots 36–39 %
 * busy, ~14 warps per SM; 14336x4096 takes 38.5 µs where the tensor-core rate alone is ~16). Here one
 * warpgroup (the producer) streams raw codes through a cp.async ring, decodes a whole 128 × 128 tile into
 * bf16 in shared memory (wgmma's K-major layout with the 128-byte swizzle) and stages x beside it, while two
 * consumer warpgroups (64 weight rows each) only issue wgmma with A and B both from shared memory. Three
 * decoded stages let the producer run ahead; named barriers hand stages over: FULL(s) (producer arrives,
 * consumers wait) and EMPTY(s) (consumers arrive, producer waits), 384 threads each.
 *
 * K order: the decode gives codes i and i+4 of a word as one bf16 pair, so a row's 8 inputs of word j are
 * stored as the pairs (0,4) (1,5) (2,6) (3,7) — the order qgemm_q4.cu's q4_stage_x gives x, which this kernel
 * reads (B's k-slots then name the same inputs as A's). Producer thread p decodes row p of the tile (16 words
 * = 64 bytes from the raw ring, whose 16-byte pieces are swizzled by (row >> 1) & 3 so a quarter-warp's reads
 * hit distinct banks) with the row's group scales loaded a tile ahead; x of the next tile waits in its
 * registers (8 × 16 bytes) until the stage is free. One block per SM (177 KB of shared memory, 384 threads);
 * split K and qg4_reduce as qgemm_q4.cu; the pair form (gate rows in consumer 0, up rows in consumer 1,
 * act(gate)·up through shared memory) as qgemm_q4_wg.cu's.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/qgemm_frag.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/qgemm_q4.cuh"
#include "backend/cuda/wgmma.cuh"

#define QS_AS 3 /* decoded stages: A (128 rows × 128 inputs, 32 KB) + x (64 rows × 128 inputs, 16 KB) */
#define QS_RS 4 /* raw code stages (128 rows × 64 bytes) */
#define QS_A 32768
#define QS_AH 16384 /* one K half of A: 128 rows × 128 bytes */
#define QS_XH 8192  /* one K half of x: 64 rows × 128 bytes */
#define QS_STG (QS_A + 2 * QS_XH)
#define QS_RAW 8192
#define QS_SMEM ((size_t)QS_AS * QS_STG + (size_t)QS_RS * QS_RAW + 1024)
/* named barriers (0 is __syncthreads'): FULL(s), EMPTY(s), the producers', the consumers' */
#define QS_FULL(s) (1 + (s))
#define QS_EMPTY(s) (1 + QS_AS + (s))
#define QS_PB (1 + 2 * QS_AS)
#define QS_CB (2 + 2 * QS_AS)

extern "C" int tern__cuda_qg4_ws, tern__cuda_qg4s_ok;
int tern__cuda_qg4_ws = -1; /* -1 unread (TERN_CUDA_QG4_WS, default 0); tests set it */
int tern__cuda_qg4s_ok = 0; /* the sm_90a image loaded (set at init) */
extern "C" unsigned long long tern__cuda_qg4s_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_qg4s_calls = 0;

__device__ __forceinline__ void qs_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void qs_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

template <bool PAIR>
__global__ void __launch_bounds__(384, 1) qg4s_kernel(Q4Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) uint8_t qs_raw[];
    const uint32_t base = mma_smem_u32(qs_raw), pad = (1024u - (base & 1023u)) & 1023u;
    uint8_t *const sm = qs_raw + pad; /* 1024-aligned: the swizzle repeats from the stage bases */
    const uint32_t smu = base + pad, rawu = smu + QS_AS * QS_STG;
    const int wg = threadIdx.x >> 7;
    const int mi = PAIR ? 0 : a.k > 2 && (int)blockIdx.x >= a.m[2].mb0 ? 2 : a.k > 1 && (int)blockIdx.x >= a.m[1].mb0 ? 1 : 0;
    const int rowb = PAIR ? (int)blockIdx.x * 64 : ((int)blockIdx.x - a.m[mi].mb0) * QG_BM, n0 = blockIdx.z * 64;
    const int kt0 = blockIdx.y * a.kt_per, nkt = min(a.kt_per, a.nkt - kt0);

    if (wg == 0) { /* ---- producer: raw codes, scales and x in; decoded stages out ---- */
        const int p = threadIdx.x;
        const int pm = PAIR ? p >> 6 : mi, prow = PAIR ? rowb + (p & 63) : rowb + p;
        const int pout = a.m[pm].out, rowc = min(prow, pout - 1);
        const uint16_t *const Sp = a.m[pm].s, *const Bp = a.m[pm].b;
        const int ngt = QG_KB >> a.gs_shift; /* groups per tile: 4, 2, 1 */
        auto raw_load = [&](int t) {         /* tile t into raw slot t % RS: 512 pieces, 4 a thread */
            const uint32_t dst = rawu + (uint32_t)(t % QS_RS) * QS_RAW;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = p + 128 * j, r = c >> 2, q = c & 3;
                const int rm = PAIR ? r >> 6 : mi, row = PAIR ? rowb + (r & 63) : rowb + r, out = a.m[rm].out;
                const uint8_t *src = a.m[rm].w + (size_t)min(row, out - 1) * a.rb + (size_t)(kt0 + t) * (QG_KB / 2) + q * 16;
                mma_cp16(dst + (uint32_t)(r * 64 + ((q ^ ((r >> 1) & 3)) << 4)), src, row < out);
            }
        };
        auto scales = [&](int t, uint32_t *sb) { /* row p's (s | b << 16) of tile t's groups */
            const size_t g0 = (size_t)rowc * a.ng + (((kt0 + t) * QG_KB) >> a.gs_shift);
#pragma unroll
            for (int i = 0; i < 4; i++)
                sb[i] = i < ngt ? (uint32_t)__ldg(Sp + g0 + i) | (uint32_t)__ldg(Bp + g0 + i) << 16 : 0u;
        };
        auto x_load = [&](int t, uint4 *xr) { /* tile t of x (staged bf16, 64 rows × 16 pieces): 8 a thread */
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int c = p + 128 * j, r = c >> 4, ch = c & 15;
                xr[j] = n0 + r < a.n ? __ldcg(a.x + ((size_t)(n0 + r) * a.in + (size_t)(kt0 + t) * QG_KB) / 8 + ch)
                                     : make_uint4(0u, 0u, 0u, 0u);
            }
        };
        pdl_trigger();
#pragma unroll
        for (int t = 0; t < QS_RS - 1; t++) {
            if (t < nkt) raw_load(t);
            mma_cp_commit();
        }
        uint32_t sbn[4], sbc[4];
        scales(0, sbn);
        pdl_wait(); /* x is the previous kernel's (q4_stage_x) */
        uint4 xr[8];
        x_load(0, xr);
        for (int kt = 0; kt < nkt; kt++) {
            const int s = kt % QS_AS;
            mma_cp_wait<QS_RS - 2>();
            qs_sync(QS_PB, 128); /* raw tile kt landed for all producers; all are done with slot (kt - 1) % RS */
            if (kt + QS_RS - 1 < nkt) raw_load(kt + QS_RS - 1);
            mma_cp_commit();
#pragma unroll
            for (int i = 0; i < 4; i++) sbc[i] = sbn[i];
            if (kt + 1 < nkt) scales(kt + 1, sbn);
            if (kt >= QS_AS) qs_sync(QS_EMPTY(s), 384); /* the consumers are done with tile kt - AS */
            uint8_t *const st = sm + s * QS_STG;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int c = p + 128 * j, r = c >> 4, ch = c & 15;
                *(uint4 *)(st + QS_A + (ch >> 3) * QS_XH + (r >> 3) * 1024 + (r & 7) * 128 + (((ch & 7) ^ (r & 7)) << 4)) = xr[j];
            }
            if (kt + 1 < nkt) x_load(kt + 1, xr);
            const uint8_t *const rw = sm + QS_AS * QS_STG + (kt % QS_RS) * QS_RAW + p * 64;
            uint8_t *const arow = st + (p >> 3) * 1024 + (p & 7) * 128;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const uint4 v = *(const uint4 *)(rw + ((q ^ ((p >> 1) & 3)) << 4));
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = 4 * q + e, gi = (8 * j) >> a.gs_shift; /* word j: inputs 8j..8j+7 of the tile */
                    const uint32_t w = e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
                    const uint32_t sv = gi == 0 ? sbc[0] : gi == 1 ? sbc[1] : gi == 2 ? sbc[2] : sbc[3];
                    const __nv_bfloat162 s2 = q4_dup(sv, false), b2 = q4_dup(sv, true);
                    uint4 o;
                    o.x = q4_deq(w, 0, s2, b2);
                    o.y = q4_deq(w, 1, s2, b2);
                    o.z = q4_deq(w, 2, s2, b2);
                    o.w = q4_deq(w, 3, s2, b2);
                    *(uint4 *)(arow + (j >> 3) * QS_AH + (((j & 7) ^ (p & 7)) << 4)) = o;
                }
            }
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* generic writes -> wgmma's reads */
            qs_arrive(QS_FULL(s), 384);
        }
        mma_cp_wait<0>();
        return;
    }

    /* ---- consumers: warpgroup c = wg - 1 owns A rows 64c..64c+63 ---- */
    const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    pdl_trigger();
    pdl_wait(); /* y (y += W·x) is the previous kernels' */
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; i++) acc[i] = 0.0f;
    for (int kt = 0; kt < nkt; kt++) {
        const int s = kt % QS_AS;
        qs_sync(QS_FULL(s), 384);
        const uint32_t as = smu + s * QS_STG + cw * 8192, xs = smu + s * QS_STG + QS_A;
        qw_fence();
#pragma unroll
        for (int j = 0; j < 8; j++)
            qw_mma_ss<8>(acc, qw_desc(as + (j >> 2) * QS_AH + (j & 3) * 32), qw_desc(xs + (j >> 2) * QS_XH + (j & 3) * 32));
        qw_commit();
        qw_wait();
        if (kt + QS_AS < nkt) qs_arrive(QS_EMPTY(s), 384); /* the producer waits for it only then */
    }

    const int m = PAIR ? cw : mi, out = a.m[m].out, wr = PAIR ? rowb + warp * 16 : rowb + cw * 64 + warp * 16;
    if constexpr (PAIR) {
        if (a.direct) { /* up's accumulators through shared memory to the gate warpgroup: y = act(gate)·up */
            float *const ups = (float *)sm; /* [64 rows][65] */
            qs_sync(QS_CB, 256); /* both consumers' wgmmas are done (the producer finished every stage before) */
            if (cw == 1)
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) ups[(warp * 16 + g + (i >> 1) * 8) * 65 + nt * 8 + 2 * t + (i & 1)] = acc[nt * 4 + i];
            qs_sync(QS_CB, 256);
            if (cw == 0)
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int rl = warp * 16 + g + (i >> 1) * 8, row = rowb + rl, col = n0 + nt * 8 + 2 * t + (i & 1);
                        const float v = acc[nt * 4 + i], u = ups[rl * 65 + nt * 8 + 2 * t + (i & 1)];
                        if (row < out && col < a.n)
                            a.m[0].y[(size_t)col * out + row] = (a.mode == G1_SILU ? silu(v) : gelu_tanh(v)) * u;
                    }
            return;
        }
    }
    float *const dst = a.direct ? a.m[m].y : a.part + (size_t)blockIdx.y * a.slice + a.m[m].poff;
    const bool add = a.direct && a.mode == G1_RES;
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = wr + g + (i >> 1) * 8, col = n0 + nt * 8 + 2 * t + (i & 1);
            if (row < out && col < a.n) {
                float *p = dst + (size_t)col * out + row;
                *p = add ? *p + acc[nt * 4 + i] : acc[nt * 4 + i];
            }
        }
#else
    (void)a;
    __trap(); /* not reached: the launcher runs this only where the sm_90a image loaded */
#endif
}

/* qgemm_q4.cuh: at open, the shared-memory limits; their success says the image loads on this GPU */
void tern__cuda_qg4s_init(void) {
    const cudaFuncAttribute at = cudaFuncAttributeMaxDynamicSharedMemorySize;
    tern__cuda_qg4s_ok = cudaFuncSetAttribute(qg4s_kernel<false>, at, (int)QS_SMEM) == cudaSuccess &&
                         cudaFuncSetAttribute(qg4s_kernel<true>, at, (int)QS_SMEM) == cudaSuccess;
    cudaGetLastError();
}

/* qgemm_q4.cuh */
bool tern__cuda_qg4s_on(const tern__cuda *c) {
    if (tern__cuda_qg4_ws < 0) tern__cuda_qg4_ws = tern__cuda_env_int("TERN_CUDA_QG4_WS", 0) != 0;
    return tern__cuda_qg4_ws && tern__cuda_qg4s_ok && c->smem_optin >= QS_SMEM;
}

/* qgemm_q4.cuh: x already staged by q4_stage_x (pair order) in gemm_scratch */
void tern__cuda_qg4s_launch(tern__cuda *c, const Q4Args &a, dim3 grid, bool pair) {
    if (pair) tern_launch(c->stream, qg4s_kernel<true>, grid, 384, QS_SMEM, a);
    else tern_launch(c->stream, qg4s_kernel<false>, grid, 384, QS_SMEM, a);
    tern__cuda_qg4s_calls++;
}

/*
 * qgemm_q4_wg.cu — qgemm_q4.cu's Q4 (BF16 scales) times 32- or 64-row column tiles, with the products on
 * Hopper's warpgroup MMA (wgmma, sm_90a only: this file is built for sm_90a alone and the launcher reports
 * "not available" elsewhere). Default on (TERN_CUDA_QG4_WG=0: qgemm_q4.cu's kernel). H200, session 16
 * (bench/NOTES.md (y)): 14336x4096 at 64 / 128 rows 45.2 / 80.7 → 38.5 / 66.6 µs; llama3-8b q4 decode at 32 / 64 /
 * 128 sequences 6053 / 8691 / 9166 → 6252 / 9836 / 10763 tok/s, with the pair form 10010 / 10845 at 64 / 128.
 *
 * Why: at 64 rows qgemm_q4.cu's kernel runs 45 µs on 14336x4096 (0.29 of its floor; ncu: issue 35 % busy,
 * 8.9 cycles per issued instruction, L1/TEX 68 %). Per 128-input tile each of its warps reads the whole x tile
 * (64 rows × 256 bytes) from shared memory as mma.sync B fragments, 16 KB a warp, 128 KB a block, against
 * 24 KB of tile data, and issues 64 mma.sync. Here the two warpgroups of a block issue 8 wgmma m64n64k16
 * each per tile, and the tensor cores read x from shared memory themselves (no fragment loads by the warps).
 *
 * Same block shape, ring and decode as qgemm_q4.cu: 8 warps × 16 weight rows (BM = 128), 4 cp.async stages
 * of (x tile, W tile), the first W tiles requested before pdl_wait, split K over blockIdx.y into partials
 * summed by qg4_reduce (the copies here from addresses formed once per block: see the kernel). A (the weights) comes from registers: wgmma's A fragment of a warp's 16 rows is
 * mma.m16n8k16's, so the decode of qgemm_q4.cu gives it unchanged — word sp of a lane's 32 codes yields
 * k-steps j = 2sp (codes i, i+4 for i = 0, 1) and 2sp + 1 (i = 2, 3); k-slot 2t + e of step j is input
 * 32t + 8sp + 2h + 4e and slot 8 + 2t + e is that + 1 (h = j & 1). B (x) is read by the tensor cores, so the
 * staged x must hold step j's 16 inputs at positions 16j..16j+15 of the tile in that slot order: q4w_stage_x
 * writes it so (qgemm_q4.cu's q4_stage_x keeps its own pair order). In shared memory x is K-major with the
 * 128-byte swizzle: each half of the tile's 128 inputs is [BN rows][128 bytes], 8-row groups 1024 bytes
 * apart, the 16-byte chunk c of row r at chunk c ^ (r & 7); step j's descriptor starts at half j / 4 plus
 * 32·(j % 4) bytes. The accumulator of m64nNk16 is mma.sync's C per 8-column tile, so the epilogue is
 * qgemm_q4.cu's.
 *
 * Order per tile: wait for the tile's copies, fence.proxy.async (cp.async writes are generic-proxy, wgmma
 * reads through the async proxy), barrier, refill the slot of the previous tile (its wgmmas were waited
 * for), decode the 8 A fragments, wgmma.fence, 8 wgmmas, commit, wait.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/qgemm_frag.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/qgemm_q4.cuh"
#include "backend/cuda/wgmma.cuh"
#include "backend/cuda/tma.cuh"

#include <string.h>

#define QW_ST 4

extern "C" int tern__cuda_qg4_wg, tern__cuda_qg4_wgpair, tern__cuda_qg4w_ok;
int tern__cuda_qg4_wg = -1;     /* -1 unread (TERN_CUDA_QG4_WG, default 1); tests set it */
int tern__cuda_qg4_wgpair = -1; /* -1 unread (TERN_CUDA_QG4_WGPAIR, default 1); tests set it */
int tern__cuda_qg4w_ok = 0; /* the sm_90a image loaded on the device opened (set at init) */
extern "C" int tern__cuda_qg4w_probe;
extern "C" int tern__cuda_qg4w_asy;
int tern__cuda_qg4w_asy = -1; /* -1 unread (TERN_CUDA_QG4_ASY, default 1: the 32-column tiles); tests set it */
int tern__cuda_qg4w_probe = -1; /* -1 unread (TERN_CUDA_QG4_PROBE, default 0: off); see qg4w_kernel's PROBE */
extern "C" unsigned long long tern__cuda_qg4w_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_qg4w_calls = 0;

/* x [n][in] f32 -> bf16, every 128 inputs in the k-step order above: output chunk c (8 positions) of a tile
 * is step j = c / 2, slots 8·(c & 1)..+7, i.e. inputs base + {0, 4, 32, 36, 64, 68, 96, 100} with base =
 * 8sp + 2h + (c & 1) */
__global__ void q4w_stage_x(uint4 *xb, const float *x, size_t chunks) {
    pdl_start();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < chunks; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i & 15), j = c >> 1;
        const float *p = x + (i >> 4) * 128 + 8 * (j >> 1) + 2 * (j & 1) + (c & 1);
        uint4 o;
        o.x = bf2_bits(__floats2bfloat162_rn(p[0], p[4]));
        o.y = bf2_bits(__floats2bfloat162_rn(p[32], p[36]));
        o.z = bf2_bits(__floats2bfloat162_rn(p[64], p[68]));
        o.w = bf2_bits(__floats2bfloat162_rn(p[96], p[100]));
        xb[i] = o;
    }
}

/* stage bytes: x (two K halves of BN rows × 128 bytes) then W (128 rows × 64 bytes); a multiple of 1024 */
template <int NT> struct QwGeo {
    static constexpr int BN = NT * 8, XH = BN * 128, WB = QG_BM * 64, STG = 2 * XH + WB;
};

/* PAIR (act(gate)·up, TERN_CUDA_QG4_WGPAIR): warpgroup 0 takes 64 gate rows and warpgroup 1 the same 64 up
 * rows, so a block with the whole K (direct) finishes y = act(gate)·up itself through shared memory */
/* PROBE (TERN_CUDA_QG4_PROBE, timing only: the outputs are wrong; the plain 64-column instance alone): 1 leaves the
 * decode out (the A fragments are the raw words xor'd with the scales, so their loads stay), 2 the wgmmas (the
 * fragments xor'd into the accumulators), 3 both — what a tile's chain costs without each part */
/* ASY (TERN_CUDA_QG4_ASY, default on; the 32-column instances only): a tile in two halves of 4 k-steps, each half's
 * fragments in their own registers (afA, afB: the 32 of the plain form), and a half's wgmmas left in flight while the
 * warp decodes the next half — the wait before decoding into a set is for the group that last read it (wait_group
 * 1), so the tensor cores work across the tile's barrier; the ring refills the slot of tile kt - 2 (its x is read
 * until tile kt starts), two tiles ahead. The same k-steps into the same accumulators: the same sums. H200, session
 * 75 (NOTES (ci)): kernels alone at n = 32 4096x4096 / 14336x4096 / 4096x14336 11.8 / 26.6 / 23.5 → 11.3 / 25.7 /
 * 22.6 µs, llama3-8b q4 at 32 sequences 7940 / 7958 → 8087 / 8109 dec tok/s, gemma4-12b 3595 / 3586 → 3611 / 3609;
 * the 64-column form lost (14336x4096 at n = 64 36.4 → 44.1 µs, llama3-8b at 64 / 128 sequences −8.5 / −7 %) and
 * is not built */
/* Removed after their timings (H100, session 76, NOTES (cj)): OCC 3 (TERN_CUDA_QG4_OCC=3: three blocks an SM, a
 * 3-stage ring, 80 registers; llama3-8b q4 at 32 / 64 / 128 sequences −10 / −15 / −10 %) and WG 4
 * (TERN_CUDA_QG4_WG4=1: the 64-column tiles in blocks of four warpgroups sharing each x tile, half the x bytes a
 * weight; −10 / −3 % at 64 / 128) — the x copies are not what bounds the kernel, and fewer, wider blocks an SM leave
 * fewer independent tile chains */
/* A lane's scale and bias rows ra, rb (qgemm_q4.cuh q4_sb's loads with the row pointers formed once per block, not
 * per tile) and their (s | b << 16) of K tile kt (absolute) */
struct QwSb {
    const uint16_t *sa, *ba, *sb, *bb;
};
__device__ __forceinline__ QwSb qw_sb(const Q4Args &a, const uint16_t *Sc, const uint16_t *Bi, int ra, int rb) {
    return QwSb{Sc + (size_t)ra * a.ng, Bi + (size_t)ra * a.ng, Sc + (size_t)rb * a.ng, Bi + (size_t)rb * a.ng};
}
__device__ __forceinline__ void qw_sb_load(uint32_t *d, const QwSb &r, const Q4Args &a, int kt, int t) {
    const int gc = (kt * QG_KB + 32 * t) >> a.gs_shift;
    d[0] = (uint32_t)__ldg(r.sa + gc) | (uint32_t)__ldg(r.ba + gc) << 16;
    d[1] = (uint32_t)__ldg(r.sb + gc) | (uint32_t)__ldg(r.bb + gc) << 16;
}
/* a lane's two rows' scales and biases of a tile as bf16 pairs (s, s), (b, b), and the decode's magic */
struct QwDeq {
    __nv_bfloat162 sa, ba, sb, bb;
    uint32_t magic;
};
__device__ __forceinline__ QwDeq qw_deq_of(const uint32_t *sb, uint32_t magic) {
    return QwDeq{q4_dup(sb[0], false), q4_dup(sb[0], true), q4_dup(sb[1], false), q4_dup(sb[1], true), magic};
}
/* k-steps 2·(word) + h, h = 0, 1, into f[h] from a word of each of the lane's two rows */
__device__ __forceinline__ void qw_deq2(uint32_t (*f)[4], uint32_t w0, uint32_t w1, const QwDeq &d) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        f[h][0] = q4_deq(w0, 2 * h, d.sa, d.ba, d.magic);
        f[h][1] = q4_deq(w1, 2 * h, d.sb, d.bb, d.magic);
        f[h][2] = q4_deq(w0, 2 * h + 1, d.sa, d.ba, d.magic);
        f[h][3] = q4_deq(w1, 2 * h + 1, d.sb, d.bb, d.magic);
    }
}
/* ASY's half tile (k-steps 4hf..4hf + 3 from the lane's words ha, hb of its two rows; xh: x's K half hf): wait for the
 * group that last read the fragment set af (every group but the newest), decode into it, 4 wgmmas, one commit group */
template <int NT>
__device__ __forceinline__ void qw_half(float *acc, uint32_t (&af)[4][4], uint2 ha, uint2 hb, const QwDeq &dq,
                                        uint32_t xh) {
    qw_wait1();
#pragma unroll
    for (int i = 0; i < 16; i++) qw_keep(af[i >> 2][i & 3]);
    qw_deq2(af, ha.x, hb.x, dq);
    qw_deq2(af + 2, ha.y, hb.y, dq);
    qw_fence();
#pragma unroll
    for (int j = 0; j < 4; j++) qw_mma<NT>(acc, af[j], qw_desc(xh + j * 32));
    qw_commit();
}
/* ASY's whole tile of a stage at st (x's two K halves, then W): its two half tiles on the fragment sets afA, afB */
template <int NT>
__device__ __forceinline__ void qw_tile_asy(float *acc, uint32_t (&afA)[4][4], uint32_t (&afB)[4][4], const uint8_t *st,
                                            const uint32_t *sb, int warp, int g, int t, uint32_t magic) {
    constexpr int XH = QwGeo<NT>::XH;
    const uint2 *w2 = (const uint2 *)(st + 2 * XH);
    const uint32_t xs = mma_smem_u32(st);
    const QwDeq dq = qw_deq_of(sb, magic);
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
        qw_half<NT>(acc, hf ? afB : afA, w2[((warp * 16 + g) * 4 + t) * 2 + hf], w2[((warp * 16 + g + 8) * 4 + t) * 2 + hf],
                    dq, xs + hf * XH);
}
/* the walk's end: ASY's last groups waited for (the accumulators kept in place up to here), then qw_store */
template <int NT, bool PAIR, bool ASY>
__device__ __forceinline__ void qw_finish(const Q4Args &a, float *acc, uint8_t *sm, int mi, int out, int rowb, int wr,
                                          int n0, int warp, int g, int t) {
    if constexpr (ASY) {
        qw_wait();
#pragma unroll
        for (int i = 0; i < NT * 4; i++) qw_keep(acc[i]);
    }
    qw_store<NT, PAIR>(a, acc, sm, mi, out, rowb, wr, n0, warp, g, t);
}
/* One K tile of a stage at st (x: two K halves of XH bytes, then W: 128 rows × 64 bytes) into acc: the warp's 8 A
 * fragments decoded from its rows 16·warp + g (+ 8), 8 wgmmas on one commit group, waited for (the stage may be
 * refilled after this returns). sb: the lane's (s | b << 16) of its two rows for this tile */
template <int NT>
__device__ __forceinline__ void qw_tile(float *acc, const uint8_t *st, const uint32_t *sb, int warp, int g,
                                        uint32_t magic) {
    constexpr int XH = QwGeo<NT>::XH;
    const int t = threadIdx.x & 3;
    const uint4 *ws = (const uint4 *)(st + 2 * XH);
    const QwDeq dq = qw_deq_of(sb, magic);
    const uint4 wa = ws[(warp * 16 + g) * 4 + t], wb = ws[(warp * 16 + g + 8) * 4 + t];
    uint32_t af[8][4];
    qw_deq2(af + 0, wa.x, wb.x, dq);
    qw_deq2(af + 2, wa.y, wb.y, dq);
    qw_deq2(af + 4, wa.z, wb.z, dq);
    qw_deq2(af + 6, wa.w, wb.w, dq);
    const uint32_t xs = mma_smem_u32(st);
    qw_fence(); /* one commit group per tile: two (the second half's decode overlapping the first half's
                 * wgmmas) lost on the H200, llama3-8b q4 at 64 / 128 sequences 9971 / 10881 → 9895 / 10778 */
#pragma unroll
    for (int j = 0; j < 8; j++) qw_mma<NT>(acc, af[j], qw_desc(xs + (j >> 2) * XH + (j & 3) * 32));
    qw_commit();
    qw_wait(); /* before the next tile's barrier: its refill overwrites this slot */
}

template <int NT, bool PAIR = false, int PROBE = 0, bool ASY = false>
__global__ void __launch_bounds__(256, 2) qg4w_kernel(Q4Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Geo = QwGeo<NT>;
    constexpr int ST = QW_ST;
    constexpr int BN = Geo::BN, XH = Geo::XH, STG = Geo::STG, XCH = BN * 16;
    extern __shared__ __align__(16) uint8_t qw_raw[];
    const uint32_t raw = mma_smem_u32(qw_raw), pad = (1024u - (raw & 1023u)) & 1023u;
    uint8_t *const sm = qw_raw + pad; /* 1024-aligned: the swizzle repeats from the stage bases */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int mi = PAIR ? warp >> 2
                 : a.k > 2 && (int)blockIdx.x >= a.m[2].mb0 ? 2 : a.k > 1 && (int)blockIdx.x >= a.m[1].mb0 ? 1 : 0;
    const uint8_t *const W = a.m[mi].w;
    const uint16_t *const Sc = a.m[mi].s, *const Bi = a.m[mi].b;
    const int out = a.m[mi].out;
    /* wr: this warp's first row in its matrix */
    const int rowb = PAIR ? (int)blockIdx.x * 64 : ((int)blockIdx.x - a.m[mi].mb0) * QG_BM, n0 = blockIdx.z * BN;
    const int wr = rowb + (PAIR ? warp & 3 : warp) * 16;
    const int kt0 = blockIdx.y * a.kt_per, nkt = min(a.kt_per, a.nkt - kt0);
    const int ra = min(wr + g, out - 1), rbw = min(wr + g + 8, out - 1);

    uint32_t sbr[ST][2];
    /* The ring's copies from addresses formed once per block, advanced per tile: W chunk j of a thread (c = tid +
     * 256j: row c / 4, 16-byte column c % 4) from wp[j] + 64·kt to its slot's 2·XH + 16c; x chunk j (row r = tid / 16
     * + 16j, 16-byte column ch = tid % 16) from xb + xo[j] + 16·kt to its slot's xd + 2048j (K-major, 128-byte
     * swizzle: chunk ch & 7 of row r at (ch & 7) ^ (r & 7), K half ch / 8); the scales at column group ((kt0 +
     * kt)·128 + 32t) >> gs_shift of rows ra and rbw. H200, session 17 (NOTES (z)): the per-tile form recomputed
     * each copy's clamped 64-bit address (~135 of ~340 instructions a warp issued per tile); llama3-8b q4 decode
     * at 64 / 128 sequences 11273 / 12126 → 11575 / 12325 tok/s */
    constexpr int XJ = (XCH + 255) / 256;
    const uint8_t *wp[2];
    uint32_t wok = 0, xok = 0, xo[XJ];
    const uint4 *xb = a.x + (size_t)kt0 * (QG_KB / 8) + (threadIdx.x & 15);
    const uint32_t smb = mma_smem_u32(sm), wd = smb + 2 * XH + threadIdx.x * 16;
    uint32_t xd;
    const QwSb sr = qw_sb(a, Sc, Bi, ra, rbw);
    {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int c = threadIdx.x + j * 256, r = c >> 2, row = PAIR ? rowb + (r & 63) : rowb + r;
            const uint8_t *Wr = PAIR ? a.m[r >> 6].w : W;
            wp[j] = Wr + (size_t)min(row, out - 1) * a.rb + (size_t)kt0 * (QG_KB / 2) + (c & 3) * 16;
            wok |= (uint32_t)(row < out) << j;
        }
        const int r0 = threadIdx.x >> 4, ch = threadIdx.x & 15, cc = ch & 7;
#pragma unroll
        for (int j = 0; j < XJ; j++) {
            const int r = r0 + 16 * j;
            xo[j] = (uint32_t)min(n0 + r, a.n - 1) * (uint32_t)(a.in / 8);
            xok |= (uint32_t)(n0 + r < a.n && (XCH % 256 == 0 || threadIdx.x + j * 256 < XCH)) << j;
        }
        xd = smb + (ch >> 3) * XH + (r0 >> 3) * 1024 + (r0 & 7) * 128 + ((cc ^ (r0 & 7)) << 4);
    }
    auto load_w = [&](int kt, int u) {
#pragma unroll
        for (int j = 0; j < 2; j++) mma_cp16(wd + u * STG + j * 4096, wp[j] + (size_t)kt * (QG_KB / 2), wok >> j & 1);
    };
    auto load_x = [&](int kt, int u) {
#pragma unroll
        for (int j = 0; j < XJ; j++)
            if (XCH % 256 == 0 || threadIdx.x + j * 256 < XCH)
                mma_cp16(xd + u * STG + j * 2048, xb + xo[j] + (size_t)kt * (QG_KB / 8), xok >> j & 1);
    };
    auto load_sb = [&](int kt, int u) { qw_sb_load(sbr[u], sr, a, kt0 + kt, t); };

    float acc[NT * 4];
#pragma unroll
    for (int i = 0; i < NT * 4; i++) acc[i] = 0.0f;
    uint32_t afA[4][4] = {}, afB[4][4] = {}; /* ASY's two half-tile fragment sets */

    auto tile = [&](int u) {
        const uint8_t *st = sm + u * STG;
        const uint4 *ws = (const uint4 *)(st + 2 * XH);
        if constexpr (!ASY && PROBE == 0) { /* the plain tile: qw_tile */
            qw_tile<NT>(acc, st, sbr[u], warp, g, a.magic);
            return;
        }
        if constexpr (ASY) { /* k-steps 4hf..4hf + 3 (words 2hf, 2hf + 1), then their 4 wgmmas */
            qw_tile_asy<NT>(acc, afA, afB, st, sbr[u], warp, g, t, a.magic);
            return;
        }
        const QwDeq dq = qw_deq_of(sbr[u], a.magic);
        auto deq2 = [&](uint32_t(*f)[4], uint32_t w0, uint32_t w1) { qw_deq2(f, w0, w1, dq); };
        const uint4 wa = ws[(warp * 16 + g) * 4 + t], wb = ws[(warp * 16 + g + 8) * 4 + t];
        uint32_t af[8][4];
        auto decode = [&](int sp) { /* k-steps 2sp, 2sp + 1 from word sp of the lane's two rows */
            const uint32_t w0 = sp == 0 ? wa.x : sp == 1 ? wa.y : sp == 2 ? wa.z : wa.w;
            const uint32_t w1 = sp == 0 ? wb.x : sp == 1 ? wb.y : sp == 2 ? wb.z : wb.w;
            if constexpr (PROBE & 1) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    af[2 * sp + h][0] = w0 ^ sbr[u][h];
                    af[2 * sp + h][1] = w1 ^ sbr[u][h];
                    af[2 * sp + h][2] = w0 ^ sbr[u][1 - h];
                    af[2 * sp + h][3] = w1 ^ sbr[u][1 - h];
                }
            } else {
                deq2(af + 2 * sp, w0, w1);
            }
        };
#pragma unroll
        for (int sp = 0; sp < 4; sp++) decode(sp);
        if constexpr (PROBE & 2) {
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j % (NT * 4)] += __uint_as_float((af[j][0] ^ af[j][1] ^ af[j][2] ^ af[j][3]) & 0x3fffffffu);
            return;
        }
        const uint32_t xs = mma_smem_u32(st); /* PROBE 1: the raw words as A */
        qw_fence();
#pragma unroll
        for (int j = 0; j < 8; j++) qw_mma<NT>(acc, af[j], qw_desc(xs + (j >> 2) * XH + (j & 3) * 32));
        qw_commit();
        qw_wait();
    };
    /* Decoding tile k + 1 into a second A buffer while tile k's wgmmas run (TERN_CUDA_QG4_PIPE, one block an SM,
     * 6 stages) won on big shapes alone (14336x4096 at 64 rows 42.2 → 39.0 µs) but lost in every model, also where
     * taken only for launches that fill the SMs unsplit: removed in session 73 (NOTES (ce), (cg)) */
    q4_ring<ST, true, ASY ? 2 : 1>(nkt, load_w, load_x, load_sb, tile);
    qw_finish<NT, PAIR, ASY>(a, acc, sm, mi, out, rowb, wr, n0, warp, g, t);
#else
    (void)a;
    __trap(); /* not reached: the launcher runs this only where the sm_90a image loaded */
#endif
}

/* ---- TMA (TERN_CUDA_QG4_TMA; session 77, the default from K 3072): the same tiles with no block barrier in the walk ----
 * Why: at 64 rows qg4w's copies and barriers alone take ~65 % of it (section 141's probe, NOTES (ci)); fewer x bytes
 * (WG 4) and more blocks (OCC 3) both lost (NOTES (cj)): what bounds it is each block's serial tile chain — every
 * tile waits for its cp.async group, meets the whole block at a barrier, then every thread forms and issues the next
 * copies. Here the stage's copies are two Tensor Memory Accelerator boxes of x (the two K halves, BN rows × 128 bytes
 * with the 128-byte swizzle: exactly the layout the other loader writes, so the wgmma descriptors are qg4w's) and two
 * of W (64 rows × 64 bytes each: rows 0..63 and 64..127 of the block, or the gate and up rows of the pair form),
 * counted on the stage's full barrier; each warp waits on that barrier alone, runs qg4w's tile (qw_tile: the same
 * decode, the same 8 wgmmas, so the same sums in the same order: bitwise qg4w), and frees the stage with one arrival
 * on its empty barrier. Thread 0 refills: after its own tile kt it waits for tile kt - 1's stage to be freed by all 8
 * warps and sends tile kt - 1 + ST into it (ST - 1 tiles in flight ahead, as qg4w's ring; a warp may run up to ST - 1
 * tiles ahead of the slowest). The weights' boxes of the first ST tiles go out before pdl_wait, x's after; the
 * scales are each lane's loads, ST tiles ahead (a register ring, as qg4w's). Rows past out / n read as zeros (TMA
 * fills them) and are not stored. Same grid, split, partials and epilogue as qg4w. */
struct Q4Maps {
    CUtensorMap w[3], x; /* W of each matrix (uint8 rows of rb bytes, 64 x 64 boxes), x (bf16 [n][in], 64 x BN boxes) */
};
/* WG 4 (TERN_CUDA_QG4_TMA=3, plain launches): one block an SM of four consumer warpgroups over 256 weight rows sharing
 * each x tile (half the x bytes a weight; the launcher re-plans the row blocks), a deeper ring (6 stages at 64 columns,
 * 8 at 32), every warpgroup still waiting on the stages alone — session 76's WG 4 lost with the block barrier a tile */
template <int NT, int WG> struct QtGeo {
    static constexpr int BN = NT * 8, XH = BN * 128, BM = 64 * WG, WB = BM * 64, STG = 2 * XH + WB;
    static constexpr int ST = WG == 2 ? QW_ST : NT == 8 ? 6 : 8;
    static constexpr size_t SMEM = (size_t)ST * STG + 16 * ST + 1024;
};
template <int NT, bool PAIR = false, bool ASY = false, int WG = 2>
__global__ void __launch_bounds__(128 * WG, WG == 2 ? 2 : 1) qg4t_kernel(const __grid_constant__ Q4Maps tm, Q4Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Geo = QtGeo<NT, WG>;
    static_assert(WG == 2 || (!PAIR && !ASY), "four warpgroups: the plain form only");
    constexpr int ST = Geo::ST, BN = Geo::BN, XH = Geo::XH, STG = Geo::STG, BM = Geo::BM, NW = 4 * WG;
    extern __shared__ __align__(16) uint8_t qw_raw[];
    const uint32_t raw = mma_smem_u32(qw_raw), pad = (1024u - (raw & 1023u)) & 1023u;
    uint8_t *const sm = qw_raw + pad; /* 1024-aligned: the swizzle repeats from the stage bases */
    const uint32_t smb = raw + pad, full = smb + ST * STG, empty = full + 8 * ST;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int mi = PAIR ? warp >> 2
                 : a.k > 2 && (int)blockIdx.x >= a.m[2].mb0 ? 2 : a.k > 1 && (int)blockIdx.x >= a.m[1].mb0 ? 1 : 0;
    const uint16_t *const Sc = a.m[mi].s, *const Bi = a.m[mi].b;
    const int out = a.m[mi].out;
    const int rowb = PAIR ? (int)blockIdx.x * 64 : ((int)blockIdx.x - a.m[mi].mb0) * BM, n0 = blockIdx.z * BN;
    const int wr = rowb + (PAIR ? warp & 3 : warp) * 16;
    const int kt0 = blockIdx.y * a.kt_per, nkt = min(a.kt_per, a.nkt - kt0);
    const int ra = min(wr + g, out - 1), rbw = min(wr + g + 8, out - 1);
    /* the W boxes: block rows 64i..64i + 63 (plain: matrix mi's rows rowb + 64i..; pair: gate's and up's rows rowb..) */
    const int m0 = PAIR ? 0 : mi;
    const CUtensorMap *const wm0 = &tm.w[m0], *const wm1 = &tm.w[PAIR ? 1 : m0];
    const bool prod = threadIdx.x == 0;
    if (prod) {
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)wm0) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)wm1) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&tm.x) : "memory");
#pragma unroll
        for (int i = 0; i < ST; i++) {
            mb_init(full + 8 * i, 1);
            mb_init(empty + 8 * i, NW); /* one arrival a warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    pdl_trigger();
    auto issue_w = [&](int kt, int u) { /* the stage's bytes announced here, W's boxes sent */
        const uint32_t bar = full + 8 * u, d = smb + u * STG + 2 * XH;
        const int c0 = (kt0 + kt) * (QG_KB / 2);
        mb_expect(bar, STG);
        if constexpr (PAIR) {
            tma_2d(d, wm0, c0, rowb, bar);
            tma_2d(d + 4096, wm1, c0, rowb, bar);
        } else {
#pragma unroll
            for (int i = 0; i < WG; i++) tma_2d(d + 4096 * i, wm0, c0, rowb + 64 * i, bar);
        }
    };
    auto issue_x = [&](int kt, int u) {
        const uint32_t bar = full + 8 * u, d = smb + u * STG;
        const int c0 = (kt0 + kt) * QG_KB;
        tma_2d(d, &tm.x, c0, n0, bar);
        tma_2d(d + XH, &tm.x, c0 + 64, n0, bar);
    };
    const QwSb sr = qw_sb(a, Sc, Bi, ra, rbw);
    uint32_t sbr[ST][2];
    auto load_sb = [&](int kt, int u) { qw_sb_load(sbr[u], sr, a, kt0 + kt, t); };
    const int pre = nkt < ST ? nkt : ST;
#pragma unroll
    for (int u = 0; u < ST; u++)
        if (u < pre) load_sb(u, u);
    if (prod)
        for (int u = 0; u < pre; u++) issue_w(u, u); /* the weights depend on no kernel before */
    pdl_wait();                                      /* x is the previous kernel's (the staging kernel) */
    if (prod)
        for (int u = 0; u < pre; u++) issue_x(u, u);

    float acc[NT * 4];
#pragma unroll
    for (int i = 0; i < NT * 4; i++) acc[i] = 0.0f;
    uint32_t afA[4][4] = {}, afB[4][4] = {}; /* ASY's two half-tile fragment sets */
    constexpr int LAG = ASY ? 2 : 1;         /* thread 0 refills the stage of tile kt - LAG after its tile kt */
    for (int base = 0; base < nkt; base += ST) {
#pragma unroll
        for (int u = 0; u < ST; u++) {
            const int kt = base + u; /* uniform over the block */
            if (kt >= nkt) break;
            mb_wait(full + 8 * u, (unsigned)(kt / ST) & 1u);
            __syncwarp(); /* converged for the wgmmas' .aligned forms */
            if constexpr (ASY) { /* qg4w's ASY halves: tile kt - 1's stage freed once its second half is waited for */
                qw_tile_asy<NT>(acc, afA, afB, sm + u * STG, sbr[u], warp, g, t, a.magic);
                if (kt >= 1) { /* the second half's wait: tile kt - 1's groups are done */
                    __syncwarp();
                    if (lane == 0) mb_arrive(empty + 8 * ((u + ST - 1) % ST));
                }
            } else {
                qw_tile<NT>(acc, sm + u * STG, sbr[u], warp, g, a.magic);
                __syncwarp();
                if (lane == 0) mb_arrive(empty + 8 * u); /* this warp is done with the stage (its wgmmas waited for) */
            }
            if (kt + ST < nkt) load_sb(kt + ST, u);
            const int kn = kt - LAG + ST; /* into the stage of tile kt - LAG */
            if (prod && kt >= LAG && kn < nkt) {
                const int up = (u + ST - LAG) % ST;
                mb_wait(empty + 8 * up, (unsigned)((kt - LAG) / ST) & 1u);
                issue_w(kn, up);
                issue_x(kn, up);
            }
            __syncwarp(); /* warp 0 together again after thread 0's refill */
        }
    }
    qw_finish<NT, PAIR, ASY>(a, acc, sm, mi, out, rowb, wr, n0, warp, g, t);
#else
    (void)tm;
    (void)a;
    __trap(); /* not reached: the launcher runs this only where the sm_90a image loaded */
#endif
}
template <int NT> static size_t qt_smem() { return QtGeo<NT, 2>::SMEM; }

template <int NT> static size_t qw_smem() { return (size_t)QW_ST * QwGeo<NT>::STG + 1024; }

/* the three instances (64-column plain / pair, 32-column plain: the pair form is planned at 64-column tiles only,
 * qgemm_q4.cu's wgp) with or without the 32-column one's ASY: their shared-memory limits set (true when all three
 * were granted), and the launch of the one that serves nt / pair */
template <bool ASY> static bool qw_attr(cudaFuncAttribute at) {
    return cudaFuncSetAttribute(qg4w_kernel<8, false>, at, (int)qw_smem<8>()) == cudaSuccess &&
           cudaFuncSetAttribute(qg4w_kernel<4, false, 0, ASY>, at, (int)qw_smem<4>()) == cudaSuccess &&
           cudaFuncSetAttribute(qg4w_kernel<8, true>, at, (int)qw_smem<8>()) == cudaSuccess;
}
template <bool ASY> static void qw_go(cudaStream_t s, const Q4Args &a, dim3 grid, int nt, bool pair) {
    if (pair) tern_launch(s, qg4w_kernel<8, true>, grid, 256, qw_smem<8>(), a);
    else if (nt == 8) tern_launch(s, qg4w_kernel<8, false>, grid, 256, qw_smem<8>(), a);
    else tern_launch(s, qg4w_kernel<4, false, 0, ASY>, grid, 256, qw_smem<4>(), a);
}

static bool qw_on(void) {
    if (tern__cuda_qg4_wg < 0) tern__cuda_qg4_wg = tern__cuda_env_int("TERN_CUDA_QG4_WG", 1) != 0;
    return tern__cuda_qg4_wg && tern__cuda_qg4w_ok;
}

/* qgemm_q4.cuh */
bool tern__cuda_qg4w_on(void) { return qw_on(); }

/* qgemm_q4.cuh */
bool tern__cuda_qg4w_pair(void) {
    if (tern__cuda_qg4_wgpair < 0) tern__cuda_qg4_wgpair = tern__cuda_env_int("TERN_CUDA_QG4_WGPAIR", 1) != 0;
    return qw_on() && tern__cuda_qg4_wgpair;
}

/* TERN_CUDA_QG4_TMA (read once; tests set it): 4 (the default since session 77) = 1 for launches of K >= QT_MIN_IN
 * inputs, 0 below; 1 the launches qg4w serves run qg4t_kernel instead (where its instances opened and the maps
 * encode); 2 the same with ASY's half tiles for the plain launches (a half's wgmmas in flight while
 * the warp decodes the next; a stage freed one tile later, so thread 0 refills the stage of tile kt - 2); 3 four
 * warpgroups a block over 256 rows sharing each x tile, one block an SM, a 6- / 8-stage ring (plain launches; the pair
 * form as 1); 0 qg4w. TERN_CUDA_QG4_TMA_MIN=K: the default's K floor (below); TERN_CUDA_QG4_TMA_L2: the W maps' L2 promotion (0 none, 1 64 B, 2
 * 128 B, 3 256 B; default 3) */
extern "C" int tern__cuda_qg4_tma;
int tern__cuda_qg4_tma = -1;
/* The default's K floor. H100, session 77 (bench/NOTES.md (ck)), qg4w → TMA 1 at 32 / 64 / 128 sequences, dec tok/s:
 * llama3-8b q4 (K 4096 / 14336) 7653 / 12105 / 12179 → 8083 / 12754 / 12962 (+5.6 / +5.4 / +6.4 %), gemma4-12b q4
 * (K 3840 / 15360) 3435 / 5535 / 5737 → 3547 / 5647 / 5700 (+3.3 / +2.0 / −0.6 %), gemma4-26b-a4b q4 (K 2816) a tie,
 * gemma4-e4b q4 (K 2560; its q|k|v at 64 rows split to two tiles a block) 5890 / 9711 / 11896 → 5684 / 9702 / 11647 (−3.5 /
 * −0.1 / −2.1 %): the short walks keep qg4w (e4b's down, K 10240, and the o of K >= 4096 in e4b's global layers and 26b-a4b take TMA
 * under this rule: not measured alone). The rule itself, session 78 (NOTES (cl)), 0 → default: llama3-8b +5.2 / +4.4 / +6.1 %,
 * 12b +2.2 / +1.8 / −1.2 %, e4b −0.6 / −0.1 / −1.2 % (one rep; TERN_CUDA_QG4_TMA_MIN=11000 keeps e4b's down on qg4w for
 * an A/B, gpu_ab.sh section 153) */
#define QT_MIN_IN 3072
static int qt_min_in = -1; /* TERN_CUDA_QG4_TMA_MIN (read once) */
extern "C" unsigned long long tern__cuda_qg4t_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_qg4t_calls = 0;
extern "C" int tern__cuda_qg4t_ok;
int tern__cuda_qg4t_ok = 0; /* qg4t's instances opened and the encoder is there (set at init) */

/* the maps of a's matrices and of the staged x (c->gemm_scratch, bf16 [n][in]) for column tiles of 8·nt rows */
static bool qt_maps(Q4Maps &m, const Q4Args &a, const void *xs, int nt) {
    static int l2 = -1;
    if (l2 < 0) l2 = tern__cuda_env_int("TERN_CUDA_QG4_TMA_L2", 3) & 3;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < a.k; i++)
        if (!tern__cuda_tmap_2d(&m.w[i], a.m[i].w, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.rb, (uint64_t)a.m[i].out, a.rb, 64,
                                64, CU_TENSOR_MAP_SWIZZLE_NONE, l2))
            return false;
    return tern__cuda_tmap_2d(&m.x, xs, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (uint64_t)a.in, (uint64_t)a.n,
                              (uint64_t)a.in * 2, 64, (uint32_t)(nt * 8), CU_TENSOR_MAP_SWIZZLE_128B, 3);
}

/* the TMA form of the launch qw_go would make; false (nothing launched) where it cannot run */
static bool qt_go(cudaStream_t s, const Q4Args &a, const void *xs, dim3 grid, int nt, bool pair) {
    if (tern__cuda_qg4_tma < 0) tern__cuda_qg4_tma = tern__cuda_env_int("TERN_CUDA_QG4_TMA", 4);
    if (qt_min_in < 0) {
        qt_min_in = tern__cuda_env_int("TERN_CUDA_QG4_TMA_MIN", QT_MIN_IN);
        if (qt_min_in < 0) qt_min_in = 0;
    }
    const int mode = tern__cuda_qg4_tma == 4 ? (a.in >= qt_min_in ? 1 : 0) : tern__cuda_qg4_tma;
    if (mode < 1 || mode > 3 || !tern__cuda_qg4t_ok || (a.rb & 15) || ((uintptr_t)xs & 15)) return false;
    for (int i = 0; i < a.k; i++)
        if ((uintptr_t)a.m[i].w & 15) return false;
    Q4Maps m;
    if (!qt_maps(m, a, xs, nt)) return false;
    const bool asy = mode == 2;
    if (mode == 3 && !pair) { /* four warpgroups: 256-row blocks, one an SM (the same K split) */
        Q4Args b = a;
        int mb = 0;
        for (int i = 0; i < a.k; i++) {
            b.m[i].mb0 = mb;
            mb += (a.m[i].out + 255) / 256;
        }
        const dim3 g4((unsigned)mb, grid.y, grid.z);
        if (nt == 8) tern_launch(s, qg4t_kernel<8, false, false, 4>, g4, 512, QtGeo<8, 4>::SMEM, m, b);
        else tern_launch(s, qg4t_kernel<4, false, false, 4>, g4, 512, QtGeo<4, 4>::SMEM, m, b);
        tern__cuda_qg4t_calls++;
        return true;
    }
    if (pair) tern_launch(s, qg4t_kernel<8, true>, grid, 256, qt_smem<8>(), m, a);
    else if (nt == 8 && asy) tern_launch(s, qg4t_kernel<8, false, true>, grid, 256, qt_smem<8>(), m, a);
    else if (nt == 8) tern_launch(s, qg4t_kernel<8, false>, grid, 256, qt_smem<8>(), m, a);
    else if (asy) tern_launch(s, qg4t_kernel<4, false, true>, grid, 256, qt_smem<4>(), m, a);
    else tern_launch(s, qg4t_kernel<4, false>, grid, 256, qt_smem<4>(), m, a);
    tern__cuda_qg4t_calls++;
    return true;
}

/* qgemm_q4.cuh: at open (qgemm_q4.cu's init): the instances' shared-memory limits; their success says the
 * sm_90a image is there for this GPU */
void tern__cuda_qg4w_init(void) {
    const cudaFuncAttribute at = cudaFuncAttributeMaxDynamicSharedMemorySize;
    tern__cuda_qg4t_ok = tern__cuda_tmap_ok() && cudaFuncSetAttribute(qg4t_kernel<8, false>, at, (int)qt_smem<8>()) == cudaSuccess &&
            cudaFuncSetAttribute(qg4t_kernel<8, true>, at, (int)qt_smem<8>()) == cudaSuccess &&
            cudaFuncSetAttribute(qg4t_kernel<4, false>, at, (int)qt_smem<4>()) == cudaSuccess &&
            cudaFuncSetAttribute(qg4t_kernel<8, false, true>, at, (int)qt_smem<8>()) == cudaSuccess &&
            cudaFuncSetAttribute(qg4t_kernel<4, false, true>, at, (int)qt_smem<4>()) == cudaSuccess &&
            cudaFuncSetAttribute(qg4t_kernel<8, false, false, 4>, at, (int)QtGeo<8, 4>::SMEM) == cudaSuccess &&
            cudaFuncSetAttribute(qg4t_kernel<4, false, false, 4>, at, (int)QtGeo<4, 4>::SMEM) == cudaSuccess;
    tern__cuda_qg4w_ok = qw_attr<true>(at);
    qw_attr<false>(at); /* the 32-column instance without ASY (TERN_CUDA_QG4_ASY=0) */
    cudaFuncSetAttribute(qg4w_kernel<8, false, 1>, at, (int)qw_smem<8>());
    cudaFuncSetAttribute(qg4w_kernel<8, false, 2>, at, (int)qw_smem<8>());
    cudaFuncSetAttribute(qg4w_kernel<8, false, 3>, at, (int)qw_smem<8>());
    cudaGetLastError();
}

/* qgemm_q4.cuh */
int tern__cuda_qg4w_launch(tern__cuda *c, const Q4Args &a, dim3 grid, int nt, const float *x, size_t xbytes,
                           bool pair) {
    if (!qw_on() || (nt != 4 && nt != 8) || (pair && nt != 8)) return 0;
    const size_t chunks = xbytes / 16, blocks = (chunks + 255) / 256;
    if (x) /* else norm.cu's rmsnorm_q4s wrote these bytes */
        tern_launch(c->stream, q4w_stage_x, (unsigned)(blocks < 2048 ? blocks : 2048), 256, 0, (uint4 *)c->gemm_scratch,
                    x, chunks);
    if (tern__cuda_qg4w_probe < 0) tern__cuda_qg4w_probe = tern__cuda_env_int("TERN_CUDA_QG4_PROBE", 0) & 3;
    if (tern__cuda_qg4w_asy < 0) tern__cuda_qg4w_asy = tern__cuda_env_int("TERN_CUDA_QG4_ASY", 1) != 0;
    const int pr = !pair && nt == 8 ? tern__cuda_qg4w_probe : 0;
    if (pr == 1) tern_launch(c->stream, qg4w_kernel<8, false, 1>, grid, 256, qw_smem<8>(), a);
    else if (pr == 2) tern_launch(c->stream, qg4w_kernel<8, false, 2>, grid, 256, qw_smem<8>(), a);
    else if (pr == 3) tern_launch(c->stream, qg4w_kernel<8, false, 3>, grid, 256, qw_smem<8>(), a);
    else if (qt_go(c->stream, a, c->gemm_scratch, grid, nt, pair)) { /* TERN_CUDA_QG4_TMA */
    } else if (tern__cuda_qg4w_asy > 0) qw_go<true>(c->stream, a, grid, nt, pair);
    else qw_go<false>(c->stream, a, grid, nt, pair);
    tern__cuda_qg4w_calls++;
    return 1;
}

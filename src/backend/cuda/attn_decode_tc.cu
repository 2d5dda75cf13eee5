/*
 * attn_decode_tc.cu — decode attention for batch decode on tensor cores: a block per (kv head g, row r),
 * one pass, K/V chunks through per-warp cp.async rings, Q·K^T and P·V as mma.sync m16n8k16.
 * TERN_CUDA_AD_TC (default on since session 16; tried before TERN_CUDA_AD_1P). Written without a GPU, correct
 * on its first H200 run (op test ≤ 2.9e-6); 41.8 → 22.0 µs a layer at 64 llama3-8b sequences (ncu), decode at
 * 64 sequences q4 10026 → 11256, bf16 8678 → 9807 tok/s (bench/NOTES.md (y)).
 *
 * Why: on an H200 (ncu, llama3-8b: 32 q heads, 8 kv heads, D 128, BF16 pages, 64 rows of ~170 keys)
 * attn_decode.cu and attn_decode1p.cu both take 41–44 µs a layer for ~39 MB of K/V (0.9 TB/s; the copy
 * rate, ~4 TB/s, would be ~11 µs): both are instruction-latency bound, every key a dot product on CUDA
 * cores summed over 16 lanes with shuffles. Here the arithmetic is a few mmas per 16 keys and the loads
 * are 16-byte cp.async with S stages of every warp in flight (D 128: 4 warps × 3 stages of 8.5 KB, two
 * blocks per SM: up to ~136 KB of K/V requested per SM while the current chunks are used;
 * launches of more pairs than that holds in one wave take blocks of 2 warps with 2 stages (TERN_CUDA_AD_TC_ST below)).
 *
 * Layout (mma.cuh's fragments; lane = 4·gq + tq). M = 16 rows: row h < 8 holds hi(q_h), row 8 + h holds
 * lo(q_h) = round(q_h − hi(q_h)) (the half type of the pages; heads h >= G zero), so ONE mma gives both
 * halves and a lane's C fragment holds head gq's hi part in c0/c1 and its lo part in c2/c3: the score of
 * key 2tq (+1) of an 8-key n-tile is c0 + c2 (c1 + c3), near-f32 (products exact, f32 sums) with no
 * doubled mmas and no shuffles. K rows [key][d] are the "col" B operand (ldmatrix over the tile); a
 * chunk is 16 keys = two n-tiles, so the lane's 4 scores (keys 2tq, 2tq+1, 8+2tq, 9+2tq of head gq) are
 * exactly what the A fragment of the 16×16 P tile needs: a0 = hi(p) keys 2tq..+1, a1 = lo(p) (row
 * gq + 8), a2/a3 the same for keys 8+2tq..; V [key][d] gives B by ldmatrix .trans. O is D/8 n-tiles of C
 * fragments: head gq's output at d = 8n + 2tq (+1) is c0 + c2 (c1 + c3). Online softmax per warp: a
 * head's chunk maximum over its 4 lanes (xor 1, 2), the lane's partial sum l and the O fragments
 * rescaled when the chunk's maximum passes the reference by more than TC_TAU (lazy: session 64, +0.2 % b1 at 8k,
 * +1.4 % gemma4-12b at 64 sequences), l summed over the 4 lanes at the end. D 256 keeps Q's fragments in shared memory
 * (registers: O alone is 128), D 64/128 in registers.
 *
 * Walk: keys in tiles of TC_KEYS (records staged in shared memory, as attn_decode1p.cu); chunk c of a
 * tile belongs to warp c % W, which keeps S chunks in its own ring (warp-level sync only). Keys past
 * the tile, past the row, or of blocks not resident (block table < 0) are zero-filled rows (cp.async
 * with no source bytes) scored −inf. At the end the W warps' (M, L, O) merge in shared memory in warp
 * order (ad_split_weights), as attn_decode1p.cu. A row's arithmetic does not depend on the other rows.
 * Served: BF16 / F16 pages, D 64 / 128 / 256, G <= 8, any length, windows, softcap; others return 0.
 * D 512 (Gemma 4's global layers): O's 64 n-tiles would take 256 registers, so two blocks share a (kv
 * head, row), each scoring every key over all 512 dimensions and summing p·v over its half of them (TcShape::DS; the
 * V tiles hold that half only; 4 warps × 2 stages of 25 KB, one block an SM). K is read twice (the second mostly
 * from L2); before, these layers took attn_decode.cu's CUDA-core kernel at every batch size. Groups of 16 or more
 * heads (gemma4-12b's 16 per global kv head) run as a.hs groups of 8, each its own pair of blocks. Split over the keys
 * (one row or a few in a long step, TERN_CUDA_AD_TCS512, session 60): each half writes its outputs as partials (and
 * half 0 the (M, L) pairs; an empty split M = -inf), and tern__cuda_attn_merge, launched right after, merges them over
 * many blocks — a last-split merge of ~33 splits × 8 heads × 256 outputs in one block would take longer than the walk.
 *
 * Split over the keys (SPLIT: a third grid dimension, TERN_CUDA_AD_TCS; the default for one row or a few in
 * long-context steps since session 19): each block walks a share of the row's keys and the last split merges the
 * partials (ad_last_merge). EARLY (one row over BF16 pages): the first tile's records and copies go out before
 * pdl_wait, as attn_decode.cu's AD_EARLY. H200 (bench/NOTES.md (ab)): llama3-8b b1 q4 at 8k 269 → 288–291 tok/s.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/attn_decode.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/kvq_common.cuh"

#define TC_CK 16     /* keys per chunk (one k-step of P·V) */
#define TC_KEYS 1024 /* block-table records staged per tile of keys */
#define TC_TAU 8.0f  /* the online softmax's lazy rescale: how far a chunk's max may pass the reference (nats) */

extern "C" unsigned long long tern__cuda_attn_decode_tc_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_attn_decode_tc_calls = 0;

/* the ring stages per warp built by default: D 64 4, D 128 3 (TERN_CUDA_AD_TC_ST=2: 2), D 256 2 */
constexpr int tc_stages(int D) { return D == 64 ? 4 : D == 128 ? 3 : 2; }

/* W warps, S ring stages per warp; rows padded by 8 elements (ldmatrix without bank conflicts); the
 * dynamic shared memory: the rings (reused by the merge), Q's fragments (D 256), the records; B: blocks
 * per SM that fit the H200's 228 KB (1 KB reserved per block, ~0.5 KB static) */
template <int D, int S_, int W_ = 0> struct TcShape {
    static constexpr int W = W_ ? W_ : D == 256 ? 3 : 4, S = S_;
    static constexpr bool QS = D > 128;
    static constexpr int DS = D > 256 ? 2 : 1, DV = D / DS; /* D 512: a block per half of the output dimensions */
    static constexpr int RS = D + 8, TILE = TC_CK * RS;     /* a K tile: elements */
    static constexpr int RSV = DV + 8, TILEV = TC_CK * RSV; /* a V tile (DV of the D columns) */
    static constexpr int STAGE = TILE + TILEV;              /* a ring stage: K then V */
    static constexpr int RD = DV + 4;                       /* the merge's row stride (floats) */
    static constexpr size_t RING = (size_t)W * S * STAGE * 2, QB = QS ? 16 * RS * 2 : 0;
    static constexpr size_t SMEM = RING + QB + TC_KEYS * 4;
    static constexpr int B = (int)((228u << 10) / (SMEM + 1536)) < 1 ? 1 : (int)((228u << 10) / (SMEM + 1536));
    static_assert((size_t)W * 8 * RD * 4 <= RING, "merge region");
    static_assert(S >= 2, "ring");
};

/* q of G <= 8 heads (D > 128) as rows hi 0..7 / lo 8..15 of shared memory (row stride D + 8), by the block's NTH
 * threads: every thread's loads go out before the first split (a loop of one load, split and store per pass kept a
 * dependent L2 round trip a pass: 16 passes at D 512; TCS512's one row at 8192 keys 22.0 → 21.3 µs, NOTES (bx)) */
template <typename T, int D, int NTH>
__device__ __forceinline__ void tc_stage_q(const float *qrow, int G, uint32_t *qw) {
    constexpr int RS = D + 8, N = 8 * (D / 2), IT = (N + NTH - 1) / NTH;
    float2 x[IT];
#pragma unroll
    for (int k = 0; k < IT; k++) {
        const int i = (int)threadIdx.x + k * NTH, h = i / (D / 2), e = i % (D / 2) * 2;
        x[k] = i < N && h < G ? __ldg((const float2 *)(qrow + (size_t)h * D + e)) : make_float2(0.0f, 0.0f);
    }
#pragma unroll
    for (int k = 0; k < IT; k++) {
        const int i = (int)threadIdx.x + k * NTH, h = i / (D / 2), e = i % (D / 2) * 2;
        if (N % NTH != 0 && i >= N) break;
        uint32_t hi, lw;
        tc_split<T>(x[k].x, x[k].y, hi, lw);
        qw[(h * RS + e) / 2] = hi;
        qw[((8 + h) * RS + e) / 2] = lw;
    }
}

/* q of the block's G heads as the A fragments of the k-steps (D <= 128: registers qf) or as rows hi 0..7 / lo 8..15
 * in shared memory after the rings (D 256 / 512, read by ldmatrix) — for the EARLY instances, after their pdl_wait. The
 * other instances keep the register form's lines inline in the kernel: called from there (as a function or a lambda)
 * ptxas reorders their prologue (34–1479 of 1536–2976 instructions differ by cubin compare), and the one-pass form is
 * the timed batch-decode default (docs/STATUS.md lesson 15); the shared-memory form is tc_stage_q for every instance
 * since session 64 (timed with it) */
template <typename T, int D, int S_>
__device__ __forceinline__ void tc_load_q(const float *qrow, int G, int gq, int tq, uint32_t (*qf)[4], unsigned char *smem) {
    using SH = TcShape<D, S_>;
    constexpr int NK = D / 16;
    if constexpr (!SH::QS) {
#pragma unroll
        for (int kk = 0; kk < NK; kk++) {
            float2 x0 = make_float2(0.0f, 0.0f), x1 = x0;
            if (gq < G) {
                x0 = __ldg((const float2 *)(qrow + (size_t)gq * D + kk * 16 + 2 * tq));
                x1 = __ldg((const float2 *)(qrow + (size_t)gq * D + kk * 16 + 8 + 2 * tq));
            }
            tc_split<T>(x0.x, x0.y, qf[kk][0], qf[kk][1]);
            tc_split<T>(x1.x, x1.y, qf[kk][2], qf[kk][3]);
        }
    } else {
        tc_stage_q<T, D, 32 * SH::W>(qrow, G, (uint32_t *)(smem + SH::RING));
    }
}

/* the warp's own ring: copies, commit and wait ordered against its shared-memory reads ("memory") */
__device__ __forceinline__ void tc_cp16(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}

/* SPLIT (one row or a few: TERN_CUDA_AD_TCS): block (g, r, z) walks split z of the row's keys, chunk = max(a.chmin,
 * ceil(keys / gridDim.z)) rounded up to TC_CK keys (splits past the row's keys exit at once), writes its (M, L, Σ p·v)
 * as partials and the last split of (r, g) merges them (ad_last_merge); a row with one live split writes out directly */
/* rope_pair (cuda_common.cuh) with its cos / sin from the table: its rotation, rope_rot, where f != 0 */
__device__ __forceinline__ void tc_rot(float &x0, float &x1, float co, float s, float f) {
    if (f != 0.0f) rope_rot(x0, x1, co, s);
}

/* ROPE (tern__cuda_attn_decode_tc_rope; unsplit, D <= 128): rope_kv_rows folded in. q, k, v come unroped in the rows of
 * one GEMM's output (a.rsrc); before its walk the block ropes its kv head's key of position pos and stores it and the
 * value into the pages (fused.cu's arithmetic: rope_pair, then · mscale, then the page rounding), and ropes its q heads
 * as it loads them — a lane's A fragments hold elements e and e + D/2 of a head (k-steps kk and kk + NK/2), so the
 * pairs rotate in registers; the row's cos / sin are computed once a block into shared memory. The same bits as rope_kv_rows + the plain instance. A block reads only its own row's
 * keys, so the rows must be of distinct sequences (the caller checks). */
template <typename T, int D, int S_, bool SPLIT, bool EARLY = false, int W_ = 0, bool ROPE = false>
__global__ void __launch_bounds__(32 * TcShape<D, S_, W_>::W, TcShape<D, S_, W_>::B) attn_dec_tc_kernel(AdArgs a) {
    using SH = TcShape<D, S_, W_>;
    constexpr int W = SH::W, S = SH::S, RS = SH::RS, TILE = SH::TILE, RD = SH::RD, DS = SH::DS, DV = SH::DV;
    constexpr int RSV = SH::RSV, STAGE = SH::STAGE;
    constexpr int NK = D / 16, NT = DV / 8;                /* k-steps of Q·K^T, n-tiles of O */
    static_assert(DS == 1 || !ROPE, "D 512: no rope instance");
    constexpr int CPR = D / 8, KPI = CPR <= 32 ? 32 / CPR : 1, NI = TC_CK / KPI; /* a copy round: KPI rows of CPR 16-byte pieces */
    extern __shared__ __align__(16) unsigned char tc_smem[];
    int *recs = (int *)(tc_smem + SH::RING + SH::QB);
    __shared__ float wm[W][8], wl[W][8], cw[W][8], sl[8];
    pdl_trigger();
    if (!EARLY) pdl_wait(); /* EARLY: after the first tile's records and copies (below) */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
    /* DS 2 (D 512): blocks 2gb and 2gb + 1 score every key over all D and each sums p·v over its half (dh) of the
     * output dimensions: O's fragments stay at D 256's 128 registers; K is read by both. A kv head's group larger than
     * 8 heads is a.hs groups of G = 8 (gb = g·hs + the group) */
    const int gb = DS > 1 ? (int)blockIdx.x / DS : (int)blockIdx.x, g = DS > 1 ? gb / a.hs : gb,
              dh = DS > 1 ? (int)blockIdx.x % DS : 0, r = blockIdx.y, G = a.G;
    const size_t head0 = (size_t)gb * G;
    const int pos = a.pos[r];
    const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
    const int nk = pos >= 0 ? pos - lo + 1 : 0;
    int s0 = 0, s1 = nk, nact = 1; /* this block's keys [s0, s1) of the row's nk */
    if constexpr (SPLIT) {
        int chunk = max(a.chmin, (nk + (int)gridDim.z - 1) / (int)gridDim.z);
        chunk = (chunk + TC_CK - 1) / TC_CK * TC_CK;
        nact = nk > 0 ? (nk + chunk - 1) / chunk : 1;
        if ((int)blockIdx.z >= nact) {
            if constexpr (DS > 1) { /* tern__cuda_attn_merge reads every split's (M, L): an empty split's M is -inf */
                if (EARLY) pdl_wait(); /* c->part may still be read by the kernel before */
                if (dh == 0 && (int)threadIdx.x < G) {
                    const size_t nrow = (size_t)a.n * a.nh, rh = (size_t)r * a.nh + head0 + threadIdx.x;
                    a.part[(size_t)a.splits * nrow * D + ((size_t)blockIdx.z * nrow + rh) * 2] = -INFINITY;
                    a.part[(size_t)a.splits * nrow * D + ((size_t)blockIdx.z * nrow + rh) * 2 + 1] = 0.0f;
                }
            }
            return;
        }
        s0 = (int)blockIdx.z * chunk;
        s1 = min(nk, s0 + chunk);
    }
    const float *qrow = ROPE ? a.rsrc + (size_t)r * a.rld + head0 * D : a.q + ((size_t)r * a.nh + head0) * D;
    static_assert(!ROPE || (!SPLIT && !EARLY && D <= 128), "ROPE: the unsplit instances with q in registers");
    /* Q: registers (D <= 128: qf[kk] is the A fragment of k-step kk) or rows hi 0..7 / lo 8..15 in
     * shared memory (D 256), read by ldmatrix after the first tile's barrier */
    uint32_t qf[SH::QS ? 1 : NK][4];
    const uint32_t qs = mma_smem_u32(tc_smem + SH::RING);
    if constexpr (ROPE) {
        /* q's loads first; then the row's rotation once a block — (cos, sin) of pos·f for each pair index in shared
         * memory, rope_pair's sincosf — this block's kv head (key pos roped and stored with its value), and q's pairs:
         * element e of the first half at (kk, slot), its partner e + D/2 at (kk + NK/2, slot) */
        constexpr int H2 = D / 2;
        __shared__ float rc[H2], rsn[H2], rf[H2];
        float2 x0[NK], x1[NK];
#pragma unroll
        for (int kk = 0; kk < NK; kk++) {
            x0[kk] = x1[kk] = make_float2(0.0f, 0.0f);
            if (gq < G) {
                x0[kk] = __ldg((const float2 *)(qrow + (size_t)gq * D + kk * 16 + 2 * tq));
                x1[kk] = __ldg((const float2 *)(qrow + (size_t)gq * D + kk * 16 + 8 + 2 * tq));
            }
        }
        for (int i = threadIdx.x; i < H2; i += blockDim.x) {
            const float f = a.rinv[i];
            float sn = 0.0f, co = 1.0f;
            if (f != 0.0f) sincosf((float)pos * f, &sn, &co);
            rc[i] = co;
            rsn[i] = sn;
            rf[i] = f;
        }
        __syncthreads();
        const float *kr = a.rsrc + (size_t)r * a.rld + (size_t)(a.nh + g) * D, *vr = kr + (size_t)a.nkv * D;
        const int bi = pos >= 0 ? pos / a.bs : a.max_blocks;
        const int blk = bi < a.max_blocks ? ad_btrow(a, r)[bi] : -1;
        if (blk >= 0) {
            const size_t dst = ((size_t)blk * a.bs + pos % a.bs) * a.nkv * D + (size_t)g * D;
            T *kd = (T *)a.kp + dst, *vd = (T *)a.vp + dst;
            for (int i = threadIdx.x; i < H2; i += blockDim.x) {
                float k0 = kr[i], k1 = kr[i + H2];
                tc_rot(k0, k1, rc[i], rsn[i], rf[i]);
                kv_put(kd + i, __fmul_rn(k0, a.rmscale));
                kv_put(kd + i + H2, __fmul_rn(k1, a.rmscale));
                kv_put(vd + i, vr[i]);
                kv_put(vd + i + H2, vr[i + H2]);
            }
        }
#pragma unroll
        for (int kk = 0; kk < NK / 2; kk++) {
            const int e = kk * 16 + 2 * tq;
            tc_rot(x0[kk].x, x0[kk + NK / 2].x, rc[e], rsn[e], rf[e]);
            tc_rot(x0[kk].y, x0[kk + NK / 2].y, rc[e + 1], rsn[e + 1], rf[e + 1]);
            tc_rot(x1[kk].x, x1[kk + NK / 2].x, rc[e + 8], rsn[e + 8], rf[e + 8]);
            tc_rot(x1[kk].y, x1[kk + NK / 2].y, rc[e + 9], rsn[e + 9], rf[e + 9]);
        }
        /* q · mscale rounded first, as rope_kv_rows stores it: a plain product here could be contracted into tc_split's
         * x − hi (an FMA) and change lo's bits */
#pragma unroll
        for (int kk = 0; kk < NK; kk++) {
            tc_split<T>(__fmul_rn(x0[kk].x, a.rmscale), __fmul_rn(x0[kk].y, a.rmscale), qf[kk][0], qf[kk][1]);
            tc_split<T>(__fmul_rn(x1[kk].x, a.rmscale), __fmul_rn(x1[kk].y, a.rmscale), qf[kk][2], qf[kk][3]);
        }
    } else if constexpr (!EARLY) {
        if constexpr (!SH::QS) {
#pragma unroll
            for (int kk = 0; kk < NK; kk++) {
                float2 x0 = make_float2(0.0f, 0.0f), x1 = x0;
                if (gq < G) {
                    x0 = __ldg((const float2 *)(qrow + (size_t)gq * D + kk * 16 + 2 * tq));
                    x1 = __ldg((const float2 *)(qrow + (size_t)gq * D + kk * 16 + 8 + 2 * tq));
                }
                tc_split<T>(x0.x, x0.y, qf[kk][0], qf[kk][1]);
                tc_split<T>(x1.x, x1.y, qf[kk][2], qf[kk][3]);
            }
        } else {
            tc_stage_q<T, D, 32 * W>(qrow, G, (uint32_t *)(tc_smem + SH::RING));
        }
    }

    float o[NT][4], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const size_t kvs = (size_t)a.nkv * D;
    const T *kb = (const T *)a.kp + (size_t)g * D, *vb = (const T *)a.vp + (size_t)g * D;
    const uint32_t ring = mma_smem_u32(tc_smem) + (uint32_t)(warp * S * STAGE * 2);
    const int ck = lane / CPR, cc = lane % CPR; /* this lane's row of a copy round and its 16-byte piece */
    /* the copies' sources: the lane's piece of token 0, plus one IMAD.WIDE.U32 a key (rec · the pool's bytes a token;
     * a key not resident copies no bytes from token 0's address). The 64-bit offset arithmetic with its clamps per
     * copy took ~36 instructions a key at D 512 — more than the chunk's mmas (ncu, NOTES (bx)) */
    const uint32_t rowb = (uint32_t)(kvs * sizeof(T));
    const char *kl = (const char *)kb + (DS == 1 ? cc : lane) * 16;
    const char *vl = (const char *)vb + (DS == 1 ? cc : lane) * 16 + (DS > 1 ? dh * DV * sizeof(T) : 0);
    /* ldmatrix row addresses (bytes within a tile): K (B, plain): matrices (keys 0-7 | 8-15) × (d 0-7 |
     * 8-15) in the order b0, b1 of n-tile 0, b0, b1 of n-tile 1; V (B, .trans): (keys 0-7 | 8-15) × d 0-7,
     * then × d 8-15: b0, b1 of d-tile 2np, then of 2np + 1; Q (A): rows 0-15 at k 0, then at k 8 */
    const uint32_t ka = (uint32_t)((((lane >> 4) << 3) + (lane & 7)) * RS + ((lane >> 3) & 1) * 8) * 2;
    const uint32_t va = (uint32_t)(((((lane >> 3) & 1) << 3) + (lane & 7)) * RSV + (lane >> 4) * 8) * 2;
    const uint32_t qa = (uint32_t)((lane & 15) * RS + (lane >> 4) * 8) * 2;
    const float scale = a.scale, cap = a.softcap;
    const int32_t *btrow = ad_btrow(a, r);
    for (int t0 = s0; t0 < s1; t0 += TC_KEYS) {
        const int tn = min(TC_KEYS, s1 - t0);
        __syncthreads(); /* the previous tile's records are no longer read */
        ad_records(recs, a, btrow, lo + t0, tn);
        __syncthreads();
        const int nch = (tn + TC_CK - 1) / TC_CK;
        const int nj = warp < nch ? (nch - warp + W - 1) / W : 0; /* this warp's chunks warp, warp + W, ... */
        /* the warp's j-th chunk into stage j % S (one commit group per j, empty past nj) */
        auto issue = [&](int j) {
            if (j < nj) {
                const int c0 = (warp + j * W) * TC_CK;
                const uint32_t st = ring + (uint32_t)(j % S * STAGE * 2);
                if constexpr (DS == 1) {
#pragma unroll
                    for (int i = 0; i < NI; i++) {
                        const int key = i * KPI + ck, idx = c0 + key;
                        const int rec = idx < tn ? recs[idx] : -1;
                        const size_t o = (size_t)(uint32_t)max(rec, 0) * rowb;
                        const uint32_t d = st + (uint32_t)((key * RS + cc * 8) * 2);
                        tc_cp16(d, kl + o, rec >= 0);
                        tc_cp16(d + TILE * 2, vl + o, rec >= 0);
                    }
                } else { /* a key's K row is CPR / 32 pieces a lane, its V half one */
                    static_assert(CPR % 32 == 0 && DV / 8 == 32, "D 512: 64 K pieces and 32 V pieces a key");
#pragma unroll
                    for (int key = 0; key < TC_CK; key++) {
                        const int idx = c0 + key, rec = idx < tn ? recs[idx] : -1;
                        const size_t o = (size_t)(uint32_t)max(rec, 0) * rowb;
#pragma unroll
                        for (int p = 0; p < CPR / 32; p++)
                            tc_cp16(st + (uint32_t)((key * RS + p * 256 + lane * 8) * 2), kl + o + p * 256 * (int)sizeof(T), rec >= 0);
                        tc_cp16(st + (uint32_t)((TILE + key * RSV + lane * 8) * 2), vl + o, rec >= 0);
                    }
                }
            }
            mma_cp_commit_ord();
        };
        int jp = 0; /* EARLY, first tile: the warp's chunks before the one holding key pos, issued before the wait */
        if (EARLY && t0 == s0) {
            /* One row (SPLIT, BF16 pages, TERN_CUDA_AD_TCS_EARLY): pos, the block table and the pages of the keys
             * before pos were written before this step, so their records and copies go out while the previous
             * kernel (the one that writes q and key pos) may still run; the chunk holding key pos and q wait
             * for it (the copies are cp.async.cg: through L2) */
            const int cpos = (nk - 1 - t0) / TC_CK;
            while (jp < S - 1 && warp + jp * W != cpos) issue(jp++);
            pdl_wait();
            tc_load_q<T, D, S>(qrow, G, gq, tq, qf, tc_smem);
            if constexpr (SH::QS) __syncthreads(); /* q's rows in shared memory, before the first ldmatrix */
        }
        for (int j = jp; j < S - 1; j++) issue(j);
        for (int j = 0; j < nj; j++) { /* warp-uniform bounds (mma, shuffles) */
            issue(j + S - 1);
            mma_cp_wait_ord<S - 1>(); /* this lane's copies of chunk j have landed */
            __syncwarp();             /* ... and every lane's */
            const uint32_t sk = ring + (uint32_t)(j % S * STAGE * 2), sv = sk + TILE * 2;
            /* S = Q·K^T: two 8-key n-tiles, even and odd k-steps in separate accumulators */
            float sc[2][2][4];
#pragma unroll
            for (int kk = 0; kk < NK; kk++) {
                uint32_t b[4], qt[4];
                mma_ldsm_x4(b, sk + ka + kk * 32);
                const uint32_t *af = qt;
                if constexpr (SH::QS) mma_ldsm_x4(qt, qs + qa + kk * 32);
                else af = qf[kk];
                if (kk < 2) {
                    TcH<T>::mma_z(sc[kk & 1][0], af, b[0], b[1]);
                    TcH<T>::mma_z(sc[kk & 1][1], af, b[2], b[3]);
                } else {
                    TcH<T>::mma(sc[kk & 1][0], af, b[0], b[1]);
                    TcH<T>::mma(sc[kk & 1][1], af, b[2], b[3]);
                }
            }
            /* head gq's scores of keys 8·(e >> 1) + 2tq + (e & 1): hi (c0, c1) + lo (c2, c3) */
            float s[4], p[4];
            const int cbase = (warp + j * W) * TC_CK;
            float cm = -INFINITY;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int nt = e >> 1, ci = e & 1, idx = cbase + nt * 8 + 2 * tq + ci;
                const float hi = sc[0][nt][ci] + sc[1][nt][ci], lw = sc[0][nt][2 + ci] + sc[1][nt][2 + ci];
                float v = (hi + lw) * scale;
                if (cap > 0.0f) v = cap * tanhf(v / cap);
                s[e] = idx < tn && recs[idx] >= 0 ? v : -INFINITY;
                cm = fmaxf(cm, s[e]);
            }
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
            cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 2));
            /* the reference max moves only when the chunk's passes it by more than TC_TAU (p <= e^TC_TAU), so past
             * the first chunks the whole warp skips O's rescale (D / 8 · 4 multiplies a lane) */
            const float mn = cm > m + TC_TAU ? cm : m;
            const float f = m == -INFINITY ? 0.0f : expf(m - mn); /* m = -inf: nothing visible yet, all 0 */
            m = mn;
            float ps = 0.0f;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[e] = s[e] == -INFINITY ? 0.0f : expf(s[e] - mn);
                ps += p[e];
            }
            l = l * f + ps;
            uint32_t pa[4]; /* the A fragment of P: hi keys 2tq.., lo (row gq + 8), hi keys 8 + 2tq.., lo */
            tc_split<T>(p[0], p[1], pa[0], pa[1]);
            tc_split<T>(p[2], p[3], pa[2], pa[3]);
            if (__any_sync(0xffffffffu, f != 1.0f)) {
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    o[n][0] *= f; o[n][1] *= f; o[n][2] *= f; o[n][3] *= f;
                }
            }
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b[4];
                mma_ldsm_x4_t(b, sv + va + np * 32);
                TcH<T>::mma(o[2 * np], pa, b[0], b[1]);
                TcH<T>::mma(o[2 * np + 1], pa, b[2], b[3]);
            }
            __syncwarp(); /* every lane's reads of stage j % S are done before issue(j + S) refills it */
        }
    }
    if (EARLY && s0 >= s1) pdl_wait(); /* no keys (pos < 0): nothing was issued, but the writes below wait */
    /* the head's sum over its 4 lanes; then the warps' (M, L, O) merge in warp order */
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    __syncthreads(); /* every warp is done with its ring: it becomes the merge region [W][8][RD] */
    float *red = (float *)tc_smem;
    if (gq < G) {
        float *rp = red + (warp * 8 + gq) * RD + 2 * tq;
#pragma unroll
        for (int n = 0; n < NT; n++) *(float2 *)(rp + n * 8) = make_float2(o[n][0] + o[n][2], o[n][1] + o[n][3]);
        if (tq == 0) { wm[warp][gq] = m; wl[warp][gq] = l; }
    }
    __syncthreads();
    if constexpr (SPLIT) {
        if (nact > 1 || DS > 1) { /* the block's warps merged in warp order relative to its own M, into the partials */
            __shared__ float sm2[8][2];
            const size_t nrow = (size_t)a.n * a.nh, mlo = (size_t)a.splits * nrow * D, z = blockIdx.z;
            if (threadIdx.x < G) {
                const int h = threadIdx.x;
                float M = -INFINITY;
#pragma unroll
                for (int w = 0; w < W; w++) M = fmaxf(M, wm[w][h]);
                sm2[h][0] = M;
                sm2[h][1] = ad_split_weights([&](int w) { return make_float2(wm[w][h], wl[w][h]); },
                                             [&](int w, float c) { cw[w][h] = c; }, W);
            }
            __syncthreads();
            for (int idx = threadIdx.x; idx < G * DV; idx += blockDim.x) { /* D 512: this block's half of the outputs */
                const int h = idx / DV, i = idx % DV;
                float v = 0.0f;
#pragma unroll
                for (int w = 0; w < W; w++) v += red[(w * 8 + h) * RD + i] * cw[w][h];
                const size_t rh = (size_t)r * a.nh + head0 + h;
                a.part[(z * nrow + rh) * D + dh * DV + i] = v;
                if (i == 0 && dh == 0) {
                    a.part[mlo + (z * nrow + rh) * 2] = sm2[h][0];
                    a.part[mlo + (z * nrow + rh) * 2 + 1] = sm2[h][1];
                }
            }
            /* D 512: tern__cuda_attn_merge, launched after, merges the splits over many blocks (one block's merge of
             * 33 splits × 8 heads × 256 outputs would take longer than the walk) */
            if constexpr (DS == 1) ad_last_merge<8>(a, a.cnt + (size_t)r * gridDim.x + g, r, head0, G, D, nact, nrow, mlo, red, sm2);
            return;
        }
    }
    ad_warp_merge<W, 8>(a, r, head0, D, wm, wl, cw, sl, [&](int w, int h, int i) { return red[(w * 8 + h) * RD + i]; }, DV,
                        dh * DV);
}

template <typename T, int D, int S, bool SPLIT = false, bool EARLY = false, int W = 0, bool ROPE = false>
static void tc_attr(void) {
    cudaFuncSetAttribute(attn_dec_tc_kernel<T, D, S, SPLIT, EARLY, W, ROPE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)TcShape<D, S, W>::SMEM);
    cudaFuncSetAttribute(attn_dec_tc_kernel<T, D, S, SPLIT, EARLY, W, ROPE>, cudaFuncAttributePreferredSharedMemoryCarveout,
                         (int)cudaSharedmemCarveoutMaxShared);
}

/* The block shape at D 128 (TERN_CUDA_AD_TC_ST): 0 (default, session 26) auto — launches of more (row, kv head) pairs
 * than the built-in shape holds in one wave (2 blocks per SM) take blocks of 2 warps with 2 ring stages (5 blocks per
 * SM: 64 rows × 8 kv heads = 512 blocks in one wave of 660 instead of two of 264, each warp walking twice the chunks),
 * the others the built-in 4 warps × 3 stages; 1 always the built-in shape; 2: 4 warps × 2 stages (3 blocks per SM);
 * 3: 2 warps × 3 stages (4 blocks per SM); 4: 2 warps × 2 stages always. H200, session 26 (bench/NOTES.md (am)),
 * llama3-8b bf16 decode, dec tok/s built-in → 2 × 2: 64 sequences 10791 → 11000, 10478 → 10839, 10476 → 10619; 32
 * sequences (256 pairs, one wave either way) 5700 → 5557; 128 17124 → 17082. -1 until read (tests set it) */
extern "C" int tern__cuda_ad_tc_st;
int tern__cuda_ad_tc_st = -1;
static int tc_st(void) {
    if (tern__cuda_ad_tc_st < 0) tern__cuda_ad_tc_st = tern__cuda_env_int("TERN_CUDA_AD_TC_ST", 0);
    return tern__cuda_ad_tc_st;
}

/* attn_decode.cuh: at open (tern__cuda_attn_decode_init), the instances' shared-memory attributes */
void tern__cuda_attn_decode_tc_init(tern__cuda *c) {
    (void)c;
    tc_attr<__nv_bfloat16, 64, tc_stages(64)>(); tc_attr<__nv_bfloat16, 128, tc_stages(128)>();
    tc_attr<__nv_bfloat16, 128, 2>(); tc_attr<__nv_bfloat16, 256, tc_stages(256)>();
    tc_attr<__nv_bfloat16, 128, 3, false, false, 2>(); tc_attr<__nv_bfloat16, 128, 2, false, false, 2>();
    tc_attr<__half, 128, 3, false, false, 2>(); tc_attr<__half, 128, 2, false, false, 2>();
    tc_attr<__half, 64, tc_stages(64)>(); tc_attr<__half, 128, tc_stages(128)>();
    tc_attr<__half, 128, 2>(); tc_attr<__half, 256, tc_stages(256)>();
    tc_attr<__nv_bfloat16, 64, tc_stages(64), true>(); tc_attr<__nv_bfloat16, 128, tc_stages(128), true>();
    tc_attr<__nv_bfloat16, 256, tc_stages(256), true>(); tc_attr<__half, 64, tc_stages(64), true>();
    tc_attr<__half, 128, tc_stages(128), true>(); tc_attr<__half, 256, tc_stages(256), true>();
    tc_attr<__nv_bfloat16, 64, tc_stages(64), true, true>(); tc_attr<__nv_bfloat16, 128, tc_stages(128), true, true>();
    tc_attr<__nv_bfloat16, 256, tc_stages(256), true, true>();
    tc_attr<__nv_bfloat16, 64, tc_stages(64), false, false, 0, true>(); tc_attr<__half, 64, tc_stages(64), false, false, 0, true>();
    tc_attr<__nv_bfloat16, 128, tc_stages(128), false, false, 0, true>(); tc_attr<__half, 128, tc_stages(128), false, false, 0, true>();
    tc_attr<__nv_bfloat16, 128, 2, false, false, 2, true>(); tc_attr<__half, 128, 2, false, false, 2, true>();
    tc_attr<__nv_bfloat16, 512, tc_stages(512)>(); tc_attr<__half, 512, tc_stages(512)>();
    tc_attr<__nv_bfloat16, 512, tc_stages(512), true>(); tc_attr<__half, 512, tc_stages(512), true>();
    tc_attr<__nv_bfloat16, 512, tc_stages(512), true, true>();
    cudaGetLastError();
}

template <typename T, int D, int S, bool SPLIT = false, bool EARLY = false, int W = 0, bool ROPE = false>
static void tc_launch(tern__cuda *c, dim3 grid, const AdArgs &a) {
    tern_launch(c->stream, attn_dec_tc_kernel<T, D, S, SPLIT, EARLY, W, ROPE>, grid, 32 * TcShape<D, S, W>::W,
                TcShape<D, S, W>::SMEM, a);
}
/* the split instances, EARLY ones over BF16 pages only */
template <typename T, int D> static void tc_split_go(tern__cuda *c, dim3 grid, bool early, const AdArgs &a) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        if (early) {
            tc_launch<T, D, tc_stages(D), true, true>(c, grid, a);
            return;
        }
    }
    tc_launch<T, D, tc_stages(D), true>(c, grid, a);
}
template <typename T> static void tc_go(tern__cuda *c, dim3 grid, int st, bool early, const AdArgs &a) {
    if (grid.z > 1) { /* splits (the default stages) */
        if (a.D == 64) tc_split_go<T, 64>(c, grid, early, a);
        else if (a.D == 128) tc_split_go<T, 128>(c, grid, early, a);
        else if (a.D == 512) tc_split_go<T, 512>(c, grid, early, a);
        else tc_split_go<T, 256>(c, grid, early, a);
    } else if (a.D == 64) tc_launch<T, 64, tc_stages(64)>(c, grid, a);
    else if (a.D == 128 && st == 2) tc_launch<T, 128, 2>(c, grid, a);
    else if (a.D == 128 && st == 3) tc_launch<T, 128, 3, false, false, 2>(c, grid, a);
    else if (a.D == 128 && st == 4) tc_launch<T, 128, 2, false, false, 2>(c, grid, a);
    else if (a.D == 128) tc_launch<T, 128, tc_stages(128)>(c, grid, a);
    else if (a.D == 512) tc_launch<T, 512, tc_stages(512)>(c, grid, a);
    else tc_launch<T, 256, tc_stages(256)>(c, grid, a);
}

/* the block shape at D 128 (tc_st(), 0 = auto) for a launch of a.n rows */
static int tc_shape(const tern__cuda *c, const AdArgs &a, bool split) {
    const int st = split ? 1 : tc_st();
    if (st) return st;
    return a.D == 128 && (long)a.n * a.nkv > (long)TcShape<128, tc_stages(128)>::B * c->n_sm ? 4 : 1;
}

/* what every launch here needs: 16-bit pages, a grid of at most 65535 rows, whole groups of at most 8 heads, q (or the
 * rows it is read from) 16-byte aligned */
static bool tc_served(const AdArgs &a, int kind, const float *q) {
    return (kind == TERN_KV_BF16 || kind == TERN_KV_F16) && a.n > 0 && a.n <= 65535 && a.nkv > 0 && !(a.nh % a.nkv) &&
           !((uintptr_t)q & 15) && a.G >= 1 && a.G <= 8;
}

/* attn_decode.cuh */
int tern__cuda_attn_decode_tc_rope(tern__cuda *c, const AdArgs &a, int kind) {
    if (!tc_served(a, kind, a.rsrc) || !a.rsrc || !a.rinv || a.rld % 4 || (a.D != 64 && a.D != 128)) return 0;
    const int st = tc_shape(c, a, false);
    if (a.D == 128 && st != 1 && st != 4) return 0;
    cudaSetDevice(c->device);
    const dim3 grid((unsigned)a.nkv, (unsigned)a.n, 1u);
    auto go = [&](auto tag) {
        using T = decltype(tag);
        if (a.D == 64) tc_launch<T, 64, tc_stages(64), false, false, 0, true>(c, grid, a);
        else if (st == 4) tc_launch<T, 128, 2, false, false, 2, true>(c, grid, a);
        else tc_launch<T, 128, tc_stages(128), false, false, 0, true>(c, grid, a);
    };
    if (kind == TERN_KV_BF16) go(__nv_bfloat16{});
    else go(__half{});
    tern__cuda_check(c, "attention decode (tensor cores, rope folded in)");
    tern__cuda_attn_decode_tc_calls++;
    return 1;
}

int tern__cuda_attn_decode_tc(tern__cuda *c, const AdArgs &a, int kind, bool split, bool early) {
    if (!tc_served(a, kind, a.q) || (a.D != 64 && a.D != 128 && a.D != 256 && a.D != 512)) return 0;
    const int st = tc_shape(c, a, split);
    const size_t smem = a.D == 64    ? TcShape<64, tc_stages(64)>::SMEM
                        : a.D == 512 ? TcShape<512, tc_stages(512)>::SMEM
                        : a.D == 128 ? (st == 2   ? TcShape<128, 2>::SMEM
                                        : st == 3 ? TcShape<128, 3, 2>::SMEM
                                        : st == 4 ? TcShape<128, 2, 2>::SMEM
                                                  : TcShape<128, tc_stages(128)>::SMEM)
                                     : TcShape<256, tc_stages(256)>::SMEM;
    if (smem > c->smem_optin) return 0;
    cudaSetDevice(c->device);
    if (split && (a.splits < 2 || a.splits > 65535 || a.chmin < 1 || (long)a.n * a.nkv > (1L << 16))) return 0;
    if (split && a.D == 512 && a.splits > TERN_CUDA_MERGE_MAX) return 0; /* merged by tern__cuda_attn_merge */
    if (a.D != 512 && a.hs != 1) return 0;
    const dim3 grid((unsigned)(a.nkv * (a.D == 512 ? TcShape<512, tc_stages(512)>::DS * a.hs : 1)), (unsigned)a.n,
                    split ? (unsigned)a.splits : 1u);
    if (kind == TERN_KV_BF16) tc_go<__nv_bfloat16>(c, grid, st, split && early && a.n == 1, a);
    else tc_go<__half>(c, grid, st, false, a);
    tern__cuda_check(c, "attention decode (tensor cores)");
    if (split && a.D == 512) tern__cuda_attn_merge(c, a.out, a.n * a.nh, 512, a.splits, "attention decode (tensor cores) merge");
    tern__cuda_attn_decode_tc_calls++;
    return 1;
}

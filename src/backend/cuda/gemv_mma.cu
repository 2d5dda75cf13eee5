/*
 * gemv_mma.cu — one activation row (decode, n = 1) times MLX affine Q weights (bits 4 and 8; groups
 * 32/64/128; BF16/F16 scales) on tensor cores, exact in f32 terms, with the integer codes fed to
 * mma.sync unconverted. The CUDA-core GEMVs of gemv.cu spend 6.5-8 instructions per code (ncu:
 * issue- and latency-bound). This one's SASS (ncu source counters, 14336x4096, bench/NOTES.md (m)) ran
 * 1072 instructions per row block and warp, 4.2 per code: the decode's and-or took two LOP3s (now
 * one: 4 LOP3 + 3 SHF + 4 HADD2 per 8 codes) and ~200 register moves copy the next row block's words
 * into the current ones (TERN_CUDA_GEMV_PP walks with two register sets instead: default for the
 * XP1 / XI8 walks, which fit; the exact kernel spills at 128 registers). In the bf16 compute mode FOLD skips the subtraction (see mm_decode, mm_go).
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
 * block; acq_rel counts, split_k.cuh): deterministic and graph-capturable. Modes as gemv.cu's gemv1: up to three matrices sharing `in` (q|k|v),
 * act(gate)·up, y += W·x. A probe kernel at the end times the load pattern alone (bench_cuda).
 * Per compute mode (Q4): f32 / bf16x2 the exact split above; plain bf16 XP1 (x rounded to bf16, one MMA
 * column per group, a chunk's 4 steps in one tile folded once, FOLD's bias, two register sets: PP);
 * int8 (--compute int8) XI8 (XP1's walk with x quantized per group, u8·s8 MMAs, the CPU int8 bound).
 * The device pieces (decode, split, staging, one step) are in gemv_mma.cuh, shared with moe_mma.cu;
 * what the dense walks share (arguments, rows, staging with the pre-norm, split-K) in gemv_mma_args.cuh;
 * Tried and removed (docs/CUDA.md): gemv_ring.cu (XP1's walk through a cp.async ring in shared memory) and
 * gemv_flat.cu (one chunk per warp, no table, no walk): both slower on the H200.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/gemv_mma_args.cuh"
#include "backend/cuda/mma.cuh"

#include <stdlib.h>
#include <type_traits>

/* Step = 64 bytes of each of the warp's 16 rows (lane t: bytes 16t..16t+15, one 128-bit load per
 * row); a K slice = S steps. A step holds GPS scale groups (GB bytes each; GB = 128: a group spans two
 * steps); group γ of the step uses MMA columns 3γ..3γ+2 (its three x parts) and only the k-slots of
 * the lanes t that hold its bytes, so every column is one group's Σ q·x_part, folded with that
 * group's scale. A block stages x for its slice once and then walks row blocks blockIdx.x,
 * + gridDim.x, ...: the loads of the next row block are issued as soon as a step's words and scales
 * are in registers, so every warp keeps a row block's bytes in flight while it multiplies. */
template <int BITS, int GB, bool F16S, bool PP, bool FOLD, bool XP1 = false, bool XI8 = false, int MINB = 2,
          bool ROPE = false>
__global__ void __launch_bounds__(256, MINB) gemv_mma_kernel(MmArgs a) {
    static_assert(!XI8 || XP1, "the int8 walk is XP1's with another MMA and fold");
    constexpr bool WIDE = BITS != 4 && BITS != 8; /* Q2 / Q3 / Q5 / Q6: XP1's walk, GB as Q4's (gs / 2) */
    constexpr bool Q8X = BITS == 8 && XP1;        /* Q8 on XP1's walk (f16 MMAs, mm_stage_q8x), GB as Q4's */
    constexpr bool NEWW = WIDE || Q8X;            /* walks on mm_decode_w / mm_mmas_w */
    static_assert(!NEWW || (XP1 && FOLD && !XI8 && !ROPE), "the other widths: the XP1 walk with FOLD");
    pdl_trigger();
    constexpr int S = mm_steps(BITS, BITS == 8 && !XP1 ? GB : 2 * GB, XP1); /* steps per chunk (GB: Q8's or Q4's bytes a group) */
    constexpr int GPS = GB >= 64 ? 1 : 64 / GB;   /* groups per step */
    constexpr int NCOL = 3 * GPS, NT = (NCOL + 7) / 8;
    constexpr int CPS = mm_cps<BITS, XP1>();      /* inputs per step */
    constexpr int LB = mm_lb<BITS>(), SB = mm_sb<BITS, XP1>(); /* a lane's bytes of a row per load, a row's per step */
    using WT = typename std::conditional<Q8X, MmWn<8>, typename MmWord<BITS>::T>::type;
    using SV = typename SVec<GPS>::T;
    extern __shared__ uint2 mm_sm[];
    uint2 *tbl = mm_sm;                           /* [J·S][8 MMAs][NT][32 lanes] B fragments */
    /* [J·S][GPS] Σx per group and step (XI8: B tables of 4 MMAs per step, then d, e, 1/d: mm_stage_i8) */
    float *xs = (float *)(mm_sm + a.J * S * (XI8 ? 4 : 8 * NT) * 32);
    __shared__ int mine[MM_MINE], nmine;          /* row blocks this block reduces (split K) */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    /* this block's K slice: steps st0 .. st0 + ns - 1 in nch chunks of S (the last may be shorter) */
    const int nst = a.in / CPS, st0 = blockIdx.y * S * a.J, ns = min(S * a.J, nst - st0), nch = (ns + S - 1) / S;
    const size_t rb = (size_t)a.in * BITS / 8;

    /* a row block's words and scales in registers; PP: two sets, the next row block loads into the
     * other one (no copies), else one set whose step is copied out before it is reloaded */
    struct MmSet {
        WT w0[S], w1[S];
        SV s0[S], b0[S], s1[S], b1[S];
        uint32_t q[4]; /* XP1: the scales and biases of the lane's two chunk groups, rows g and g+8 */
    };
    MmSet A, B;
    MmRows r{}; /* value-initialised: the lambdas below capture it before the first row block sets it */
    auto load_step = [&](MmSet &o, int j, int i) { /* step i of chunk j into slot i */
        const int st = st0 + j * S + i, G = GB > 64 ? st * 64 / GB : st * GPS;
        if constexpr (Q8X) { /* 16 bytes at 16t and at 64 + 16t */
            const uint4 u0 = mm_ld4(r.w0 + (size_t)st * SB), u1 = mm_ld4(r.w0 + (size_t)st * SB + 64);
            const uint4 u2 = mm_ld4(r.w1 + (size_t)st * SB), u3 = mm_ld4(r.w1 + (size_t)st * SB + 64);
            o.w0[i] = MmWn<8>{{u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w}};
            o.w1[i] = MmWn<8>{{u2.x, u2.y, u2.z, u2.w, u3.x, u3.y, u3.z, u3.w}};
        } else if constexpr (WIDE) { /* at the odd step, the double step of it and the one before (both slots used) */
            if (i & 1) {
                mm_ldw2<BITS>(r.w0 + (size_t)(st - 1) * SB, o.w0[i - 1], o.w0[i]);
                mm_ldw2<BITS>(r.w1 + (size_t)(st - 1) * SB, o.w1[i - 1], o.w1[i]);
            }
        } else {
            o.w0[i] = mm_ld4(r.w0 + (size_t)st * SB);
            o.w1[i] = mm_ld4(r.w1 + (size_t)st * SB);
        }
        if constexpr (XP1) {
            if (i == 0) mm_pair_scales(r, G, t, S * GPS, a.ng, o.q); /* once per chunk */
        } else {
            o.s0[i] = mm_lds<GPS>(r.s0 + G); o.b0[i] = mm_lds<GPS>(r.b0 + G);
            o.s1[i] = mm_lds<GPS>(r.s1 + G); o.b1[i] = mm_lds<GPS>(r.b1 + G);
        }
    };
    int rbk = blockIdx.x;
    mm_rows(a, rbk * MM_WARPS + warp, g, t, rb, pair, r, LB);
#pragma unroll
    for (int i = 0; i < S; i++)
        if (i < ns) load_step(A, 0, i);
    /* TERN_CUDA_GEMV_L2PF: item n of the walk (chunk n % nch of row block blockIdx.x + (n / nch)·gridDim.x)
     * into L2, one 128-byte line per lane (16 rows x 256 bytes per warp) */
    const int nitems = (a.rblocks - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x * nch;
    auto l2_item = [&](int n) {
        const int half = lane >> 4;
        if (n >= nitems || half * 128 >= S * SB) return; /* S·SB <= 128: one 128-byte line per row and chunk */
        MmRows p;
        mm_rows(a, (blockIdx.x + (n / nch) * gridDim.x) * MM_WARPS + warp, lane & 7, 0, rb, pair, p);
        const uint8_t *q = ((lane >> 3) & 1 ? p.w1 : p.w0) + (size_t)(st0 + (n % nch) * S) * SB + half * 128;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(q));
    };
    for (int n = 1; n <= a.l2pf; n++) l2_item(n); /* while the previous kernel drains */
    RopePage pg{};
    if constexpr (ROPE) pg = rope_page(a.rope); /* the host's step data: before pdl_wait */
    /* programmatic dependent launch (TERN_CUDA_PDL=1, cuda_common.cuh): everything above reads only
     * weights; x, y, the partials and the counters are touched after the previous kernel has
     * finished and flushed */
    pdl_wait();

    const float dsc = mm_stage_x<BITS, GB, S, XI8 ? 8 : XP1 ? 1 : 3>(a, tbl, xs, st0, ns); /* Q8X: D's scale */
    const uint32_t magic = Q8X ? a.magic + 0x21002100u : a.magic; /* Q8X: the f16 pair (1024, 1024) */
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
        if (more && last) mm_rows(a, nrbk * MM_WARPS + warp, g, t, rb, pair, r, LB);
        if constexpr (XP1) { /* one tile for the chunk, folded once */
            const uint32_t q0 = cur.q[0], q1 = cur.q[1], q2 = cur.q[2], q3 = cur.q[3];
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            int di[4] = {0, 0, 0, 0};
#pragma unroll
            for (int sl = 0; sl < S; sl++) {
                if (sl >= nsc) {
                    if (more && sl < nsn) load_step(nxt, nch_, sl);
                    continue;
                }
                if constexpr (NEWW) {
                    const WT wa = cur.w0[sl], wc = cur.w1[sl];
                    if (more && sl < nsn) load_step(nxt, nch_, sl);
                    mm_mmas_w<BITS>(d, wa.v, wc.v, tl, ch * S + sl, magic);
                    continue;
                } else {
                const uint32_t wa[4] = {cur.w0[sl].x, cur.w0[sl].y, cur.w0[sl].z, cur.w0[sl].w};
                const uint32_t wc[4] = {cur.w1[sl].x, cur.w1[sl].y, cur.w1[sl].z, cur.w1[sl].w};
                if (more && sl < nsn) load_step(nxt, nch_, sl);
                if constexpr (XI8) mm_mmas_i8(di, wa, wc, tl, ch * S + sl);
                else mm_mmas1<FOLD>(d, wa, wc, tl, ch * S + sl, a.magic);
                }
            }
            if constexpr (XI8) {
                const int ng = mm_slice_groups<S, GB>(a);
                mm_fold_i8<GPS, S, F16S>(acc0, acc1, di, q0, q1, q2, q3, xs, xs + ng, xs + 2 * ng, ch * S, nsc, t);
            } else {
                mm_fold1<GPS, S, F16S, FOLD, Q8X ? 1024 : 128, Q8X>(acc0, acc1, d, q0, q1, q2, q3, xs, ch * S, nsc, t, dsc);
            }
        } else {
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
        }
        ch = nch_;
        rbk = nrbk;
        if (!last) return more;
        mm_finish(a, acc0, acc1, unit0, unit1, live0, live1, pair, t, pp);
        acc0 = acc1 = 0.0f;
        return more;
    };
    if constexpr (PP) {
        while (block(A, B) && block(B, A)) {}
    } else {
        while (block(A, A)) {}
    }
    if (a.ks == 1) return;

    if constexpr (ROPE) mm_reduce_rope(a, pg, units, mine, &nmine); /* q|k|v: the launch guarantees split K */
    else mm_reduce_slices(a, pair, units, mine, &nmine);
}

/* TERN_CUDA_GEMV_PP: the two-register-set walk for Q4 (same bits): 2 (default) XP1 / XI8 only (H200,
 * session 12: llama3-8b q4 b1 307.4 / 309.3 → 314.5 / 315.7 tok/s), 1 also the exact kernel (25.0 vs
 * 24.5 us on 14336x4096: it spills there), 0 never.
 * FOLD (Q4): the 128 folded into the bias — not the same bits; op test cuda_gemv_mma_fold: rel <= 2.1e-6 against cpu-ref (the default kernel 2.0e-6). Default in the bf16
 * compute mode (H200, session 11, llama3-8b q4 b1 294.3 / 293.7 → 300.5 / 299.1 tok/s; parity bf16 18/18
 * with it), not in f32 / bf16x2 (kept f32-exact there). TERN_CUDA_GEMV_FOLD=0 never, =1 in every mode.
 * Launch bounds for 3 blocks per SM (80 registers, spills) lost: 203 vs 294 tok/s. NOTES (n), (t). */
/* XP1 (Q4, TERN_CUDA_GEMV_XP1: 0 never, 1 every mode, 2 the plain bf16 mode = default): x rounded to
 * bf16 as one MMA column per group (the mode's x, as its GEMMs take it), a chunk's 4 steps in one tile
 * folded once (mm_fold1), FOLD's bias; fewer scale loads, folds and B columns per code than the exact
 * three-part split. Op test cuda_gemv_mma_xp1 against cpu-ref with bf16-exact x. H200, session 12
 * (NOTES (u)), µs exact+FOLD → XP1 → XP1+PP: 14336x4096 19.0 → 17.3 → 16.7, 4096x14336 19.8 → 18.5 →
 * 18.0, lm head 129.1 → 124.5 → 121.2; llama3-8b q4 b1 300.8 → 308 → 315 tok/s, gemma4-12b 184.1 →
 * 190.0 → 193.3. */
extern "C" int tern__cuda_gemv_mma_pp, tern__cuda_gemv_mma_fold, tern__cuda_gemv_mma_xp1;
int tern__cuda_gemv_mma_pp = -1, tern__cuda_gemv_mma_fold = -1; /* fold: -1 unread, 0, 1, 2 bf16 mode */
int tern__cuda_gemv_mma_xp1 = -1;

static bool mm_xp1(const tern__cuda *c) { /* Q4 takes the XP1 kernels in this mode */
    if (tern__cuda_gemv_mma_xp1 < 0) {
        tern__cuda_gemv_mma_xp1 = tern__cuda_env_int("TERN_CUDA_GEMV_XP1", 2);
        if (tern__cuda_gemv_mma_xp1 < 0 || tern__cuda_gemv_mma_xp1 > 2) tern__cuda_gemv_mma_xp1 = 2;
    }
    return tern__cuda_gemv_mma_xp1 == 1 ||
           (tern__cuda_gemv_mma_xp1 == 2 && c->compute == TERN_COMPUTE_BF16 && !tern__cuda_bf16_split_all(c));
}

/* TERN_CUDA_GEMV_I8 (default 1; 0: the int8 mode runs XP1's bf16 walk): Q4 one-row GEMVs of a backend
 * opened with --compute int8 quantize x per group to int8 (mm_stage_i8; the CPU int8 kernels' rule and
 * bound). Op test cuda_gemv_mma_i8. H200, session 12: 3 instead of 7 decode instructions per word and
 * half the MMAs, yet the same speed as XP1 (llama3-8b q4 b1 316.7 / 317.3 vs 318.2 / 315.4 tok/s): the
 * walk's load skeleton alone (no decode, MMA, scales or staging) runs 13.1 µs of XP1's 16.8 on
 * 14336x4096 (NOTES (u)), so the math is not what limits it. */
extern "C" int tern__cuda_gemv_i8;
int tern__cuda_gemv_i8 = -1;
static bool mm_i8(const tern__cuda *c) {
    if (tern__cuda_gemv_i8 < 0) tern__cuda_gemv_i8 = tern__cuda_env_int("TERN_CUDA_GEMV_I8", 1) != 0;
    return c->i8 && tern__cuda_gemv_i8;
}

/* TERN_CUDA_GEMV_WIDE (default 1; 0 off, read once): the one-row GEMVs of MLX Q2 / Q3 / Q5 / Q6 weights take XP1's
 * tensor-core walk (gemv_mma.cuh mm_decode_w) where XP1 serves Q4 (the plain bf16 mode), instead of gemv1's CUDA-core
 * decode (3–12 instructions a byte against ~1 for bf16: each of those widths decoded slower than bf16, NOTES (aw)).
 * Op test cuda_gemv_mma_wide against cpu-ref with bf16-exact x. */
extern "C" int tern__cuda_gemv_wide;
int tern__cuda_gemv_wide = -1;
static bool mm_wide(const tern__cuda *c, int bits) {
    if (bits != 2 && bits != 3 && bits != 5 && bits != 6) return false;
    if (tern__cuda_gemv_wide < 0) tern__cuda_gemv_wide = tern__cuda_env_int("TERN_CUDA_GEMV_WIDE", 1) != 0;
    return tern__cuda_gemv_wide && mm_xp1(c);
}

/* TERN_CUDA_GEMV_Q8X (default 1; 0 off, read once): Q8 one-row GEMVs on XP1's walk where XP1 serves Q4 (the plain bf16
 * mode): codes as exact f16 integers (1024 + byte, one LOP3 a pair), x scaled into f16's range per K slice
 * (mm_stage_q8x), f16 MMAs with f32 sums: one k-slot a byte where the exact Q8 kernel took two (two nibbles) and lost
 * to gemv1. Op test cuda_gemv_mma_wide (q8 rows). */
extern "C" int tern__cuda_gemv_q8x;
int tern__cuda_gemv_q8x = -1;
static bool mm_q8x(const tern__cuda *c, int bits) {
    if (bits != 8) return false;
    if (tern__cuda_gemv_q8x < 0) tern__cuda_gemv_q8x = tern__cuda_env_int("TERN_CUDA_GEMV_Q8X", 1) != 0;
    return tern__cuda_gemv_q8x && mm_xp1(c);
}

/* Blocks per SM the XP1 walk is built and gridded for (TERN_CUDA_GEMV_OCC: 2 always, 3 always, 0 =
 * default: 3 for matrices of at least 2^28 codes — the lm heads — else 2). Three (24 warps, 80
 * registers) takes the one-register-set walk: the PP walk spills there. Same bits either way (which
 * block walks a row block, and how it holds its words, change no sum). H200, session 13 (NOTES (v)),
 * µs 2 / 3: 128256x4096 124.2 / 109.8, but 14336x4096 17.1 / 21.2, 4096x14336 18.4 / 21.4 (llama3-8b
 * q4 b1 313 vs 301 tok/s with 3 everywhere). Three also for one-chunk slices whose blocks fill more
 * than two per SM but fit three (q|k|v: 48 row blocks x 8 slices, 1.45 waves at two) was mixed:
 * llama3-8b 315.3 / 316.5 → 311.5 / 309.3, gemma4-12b 192.3 / 194.0 → 195.3 / 195.2. With RMSU (session 35,
 * NOTES (au)) the heads at two instead of three were mixed: llama3-8b and gemma4-12b +0.3–0.8 %, gemma4-e4b and
 * gemma4-26b-a4b −0.4–1.0 %. */
static int mm_occ_of(int rows, int in, bool pair) {
    static int occ = -1;
    if (occ < 0) {
        occ = tern__cuda_env_int("TERN_CUDA_GEMV_OCC", 0);
        if (occ != 2 && occ != 3) occ = 0;
    }
    if (occ) return occ;
    return (double)rows * (pair ? 2 : 1) * in >= 268435456.0 ? 3 : 2;
}

/* occ: mm_walk_occ's blocks per SM, as the grid was sized for */
static void mm_env(void) { /* TERN_CUDA_GEMV_PP / _FOLD, read once */
    if (tern__cuda_gemv_mma_pp < 0) { /* 0 never, 1 every Q4 kernel, 2 (default) XP1 only (the others spill) */
        tern__cuda_gemv_mma_pp = tern__cuda_env_int("TERN_CUDA_GEMV_PP", 2);
        if (tern__cuda_gemv_mma_pp < 0 || tern__cuda_gemv_mma_pp > 2) tern__cuda_gemv_mma_pp = 2;
    }
    if (tern__cuda_gemv_mma_fold < 0) {
        tern__cuda_gemv_mma_fold = tern__cuda_env_int("TERN_CUDA_GEMV_FOLD", 2);
        if (tern__cuda_gemv_mma_fold < 0 || tern__cuda_gemv_mma_fold > 2) tern__cuda_gemv_mma_fold = 2;
    }
}

typedef void (*MmKernel)(MmArgs);

/* the walk's instance for this format, compute mode and occupancy (nullptr: none) */
template <int BITS, int GB>
static MmKernel mm_pick(const tern__cuda *c, bool f16, int occ) {
    mm_env();
    const bool plain = c->compute == TERN_COMPUTE_BF16 && !tern__cuda_bf16_split_all(c); /* the plain bf16 mode */
    const bool fold = tern__cuda_gemv_mma_fold == 1 || (tern__cuda_gemv_mma_fold == 2 && plain);
    const bool xp1 = mm_xp1(c);
    if constexpr (BITS == 8) {
        if (mm_q8x(c, 8)) { /* Q8X: XP1 + FOLD, GB as Q4's (this GB is Q8's bytes a group) */
            if (f16) return gemv_mma_kernel<8, GB / 2, true, false, true, true>;
            else return gemv_mma_kernel<8, GB / 2, false, true, true, true>;
        }
    }
    if constexpr (BITS != 4 && BITS != 8) { /* Q2 / Q3 / Q5 / Q6: XP1 + FOLD only (mm_plan), PP with BF16 scales */
        if (f16) return gemv_mma_kernel<BITS, GB, true, false, true, true>;
        else return gemv_mma_kernel<BITS, GB, false, true, true, true>;
    }
    if constexpr (BITS == 4) {
        if (mm_i8(c)) { /* the int8 mode (--compute int8): XP1's walk with int8 x and u8·s8 MMAs */
            if (f16) return gemv_mma_kernel<BITS, GB, true, false, true, true, true>;
            else return gemv_mma_kernel<BITS, GB, false, true, true, true, true>;
        }
        if (occ == 3) return gemv_mma_kernel<BITS, GB, false, false, true, true, false, 3>; /* 24 warps an SM, one register set (XP1, BF16 scales) */
        if (xp1) {
            if (f16) return gemv_mma_kernel<BITS, GB, true, false, true, true>;
            else if (tern__cuda_gemv_mma_pp > 0) return gemv_mma_kernel<BITS, GB, false, true, true, true>;
            else return gemv_mma_kernel<BITS, GB, false, false, true, true>;
        }
        if (fold) {
            if (f16) return gemv_mma_kernel<BITS, GB, true, false, true>;
            else return gemv_mma_kernel<BITS, GB, false, false, true>;
        }
        if (tern__cuda_gemv_mma_pp == 1) {
            if (f16) return gemv_mma_kernel<BITS, GB, true, true, false>;
            else return gemv_mma_kernel<BITS, GB, false, true, false>;
        }
    }
    if constexpr (BITS == 4 || BITS == 8) {
        if (f16) return gemv_mma_kernel<BITS, GB, true, false, false>;
        else return gemv_mma_kernel<BITS, GB, false, false, false>;
    }
    return nullptr;
}

template <int BITS, int GB>
static void mm_go(const tern__cuda *c, dim3 grid, size_t smem, const MmArgs &a, bool f16, int occ) {
    if (MmKernel k = mm_pick<BITS, GB>(c, f16, occ)) tern_launch(c->stream, k, grid, 256, smem, a);
}

/* TERN_CUDA_GEMV_MMA: 1 (default) Q4 only, 2 Q4 and Q8, 0 gemv.cu's kernels for both. Q8 stays on
 * gemv1 by default: measured slower here (14336x4096 q8 g64: 43.9 vs 31.3 us; a q8 code takes two
 * k-slots, so twice the MMAs and B loads per byte) — bench/NOTES.md (i). */
extern "C" int tern__cuda_gemv_mma_on;
int tern__cuda_gemv_mma_on = -1;
/* TERN_CUDA_GEMV_MMA_MIN (small calls on gemv1's CUDA-core decode instead of the walk) lost at 512 KB and 8 MB and
 * was removed: H100, b1 q4 tok/s gemma4-e4b 265.8 → 262.6 / 251.3, gemma4-12b 176.2 → 166.5 (NOTES (bo)) */
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
 * 132.7 / 128.8. Then, where that plan's blocks (row blocks x slices) fill more than 1.25 waves of two
 * per SM and a longer slice fits them in one (of at least a block per SM), the shortest such J: llama3-8b's q|k|v (48 row blocks x 8
 * slices = 1.45 waves; ncu 24.3 µs against o's 12.6 for 2/3 of the bytes) takes J = 2 (H200, session
 * 13, NOTES (v): b1 q4 316.7 / 314.8 → 320.2 / 320.0 tok/s). Among the presets it also moves
 * gemma4-e2b's gate|up (J 2 → 3), gemma4-26b-a4b's q|k|v and global o (1 → 2): not yet measured. A
 * plain threshold of 11 warps instead moved gemma4-12b's q|k|v from one wave at J = 2 to J = 3 and
 * lost (194.9 / 194.2 → 187.9 / 188.6).
 * A row's bits depend on its slices, so on J: separate and fused ops of one `in` agree bitwise while
 * both keep the same J (small ones: J = 1), and tensor-parallel halves may not. */
extern "C" int tern__cuda_mm_j;
int tern__cuda_mm_j = -1;
static int mm_onewave = -1; /* TERN_MM_ONEWAVE=0: without the one-wave step (A/B of it) */
static int mm_chunks(const tern__cuda *c, int ks1, int tiles) {
    if (tern__cuda_mm_j < 0) tern__cuda_mm_j = tern__cuda_env_int("TERN_MM_J", 0);
    if (mm_onewave < 0) mm_onewave = tern__cuda_env_int("TERN_MM_ONEWAVE", 1);
    if (tern__cuda_mm_j > 0) return tern__cuda_mm_j < MM_JMAX ? tern__cuda_mm_j : MM_JMAX;
    const long nsm = c->n_sm > 0 ? c->n_sm : 132, jmax = ks1 < MM_JMAX ? ks1 : MM_JMAX;
    int j = (int)jmax;
    while (j > 1 && (long)tiles * ((ks1 + j - 1) / j) < 12 * nsm) j--;
    if (j < 1) j = 1;
    const long rbl = (tiles + MM_WARPS - 1) / MM_WARPS; /* row blocks: 8 tiles (pair: 8 rows of outputs) each */
    if (mm_onewave && 4 * rbl * ((ks1 + j - 1) / j) > 10 * nsm) /* more than 1.25 waves */
        for (int j2 = j + 1; j2 <= jmax; j2++) {
            const long b = rbl * ((ks1 + j2 - 1) / j2);
            if (b <= 2 * nsm) return b >= nsm ? j2 : j; /* one wave, and still a block per SM */
        }
    return j;
}

/* The walk's grid.x: persistent over row blocks, about occ resident blocks per SM in all (TERN_MM_GRID=0:
 * one block per row block); which block walks a row block never changes its bits. With many slices the
 * walk's serial tail reductions cost more (4096x14336 q4: 38.5 us walking vs 30.8 not; 14336x4096 26.6
 * vs 30.2; lm head 167.5 vs 219.2), so from 9 slices a block per row block. */
static int mm_grid_x(const tern__cuda *c, int rblocks, int ks, int occ) {
    static int grid_mode = -1;
    if (grid_mode < 0) grid_mode = tern__cuda_env_int("TERN_MM_GRID", 1);
    int gx = rblocks;
    if (grid_mode > 0 && ks <= 8) {
        const int want = (grid_mode * occ * (c->n_sm > 0 ? c->n_sm : 132) + ks - 1) / ks;
        gx = want < rblocks ? want : rblocks;
        const int lo = (rblocks + MM_MINE - 1) / MM_MINE;
        if (gx < lo) gx = lo;
    }
    if (ks > 1 && (rblocks + gx - 1) / gx > MM_MINE) gx = (rblocks + MM_MINE - 1) / MM_MINE;
    return gx;
}

/* blocks per SM of the walk over w0 (rows: Σ out, or a pair's outputs): mm_occ_of's where the XP1 walk with
 * BF16 scales serves, else 2 */
static int mm_walk_occ(const tern__cuda *c, const tern__cuda_w *w0, int rows, int mode) {
    const bool xp1w = w0->bits == 4 && mm_xp1(c) && !mm_i8(c) && w0->sdtype != TERN_DT_F16;
    return xp1w ? mm_occ_of(rows, w0->in, mode == G1_SILU || mode == G1_GELU) : 2;
}

/* TERN_MM_BAL (default 1; 0 off): mm_chunks' J unless another J shortens the walk's longest block by a
 * quarter or more. A block walks ceil(rblocks / grid.x) row blocks of J chunks each, so when the grid
 * cannot cover the row blocks in one round the longest block may do 2-3x the average: gemma4-e4b's q4
 * gate|up (160 row blocks, 5 chunks: J 4 = slices of 4 + 1 chunks over 132 blocks, two rounds of 4) and
 * the 262144x2560 head. Estimated length of the longest block, in chunks: J x max(rounds, waves of the
 * grid). Among the presets it moves gemma4-e4b's gate|up 4 -> 2 and head 4 -> 1, gemma4-26b-a4b's head
 * 4 -> 2 and gemma4-31b's q|k|v 4 -> 3; llama3-8b and gemma4-12b keep theirs. The bits follow J (see
 * mm_chunks). */
static int mm_balance(const tern__cuda *c, int J, int ks1, int rblocks, int occ, size_t units) {
    static int on = -1;
    if (on < 0) on = tern__cuda_env_int("TERN_MM_BAL", 1) != 0;
    if (!on || tern__cuda_mm_j > 0) return J;
    const long slots = (long)occ * (c->n_sm > 0 ? c->n_sm : 132);
    auto len = [&](int j) {
        const int ks = (ks1 + j - 1) / j, gx = mm_grid_x(c, rblocks, ks, occ);
        const long rounds = (rblocks + gx - 1) / gx, waves = ((long)gx * ks + slots - 1) / slots;
        return (rounds > waves ? rounds : waves) * j;
    };
    const long cur = len(J);
    int best = J;
    long bl = cur;
    for (int j = (ks1 < MM_JMAX ? ks1 : MM_JMAX); j >= 1; j--) {
        const int ks = (ks1 + j - 1) / j;
        if (ks > 1 && (size_t)ks * units > TERN_CUDA_PART_FLOATS) continue;
        const long l = len(j);
        if (l < bl) { bl = l; best = j; }
    }
    return 4 * bl <= 3 * cur ? best : J;
}

/* The launch geometry of matrices w[0..k) for x in this mode: output units' rows (pair: outputs), row
 * blocks, K slices and their chunks (J·S steps; mm_chunks: a function of `in`, the format and, for
 * small matrices, the row count — see there for what stays bitwise). walk: as tern__cuda_mm_args'. Returns 0 for
 * every case this kernel declines. */
static int mm_plan(const tern__cuda *c, const tern__cuda_w *const *w, int k, const float *x, int mode, int walk,
                   int *rows_out, int *rblocks_out, int *ks_out, int *j_out) {
    if (tern__cuda_gemv_mma_on < 0) tern__cuda_gemv_mma_on = tern__cuda_env_int("TERN_CUDA_GEMV_MMA", 1);
    if (!tern__cuda_gemv_mma_on || !c->mm_cnt || k < 1 || k > 3 || ((uintptr_t)x & 15)) return 0;
    const tern__cuda_w *w0 = w[0];
    if (w0->dtype != TERN_DT_Q) return 0;
    const bool wide = mm_wide(c, w0->bits); /* Q2 / Q3 / Q5 / Q6 on XP1's walk */
    const bool q8x = mm_q8x(c, w0->bits);   /* Q8 on XP1's walk */
    if (w0->bits != 4 && !wide && !q8x && (w0->bits != 8 || tern__cuda_gemv_mma_on < 2)) return 0;
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
    *rblocks_out = *ks_out = *j_out = 0;
    if (rows <= 0) return 1;
    const int cps = mm_cps(w0->bits, q8x); /* inputs per step */
    if (w0->in % cps) return 0;
    if (wide) { /* double steps of 256 codes, 16-byte aligned rows */
        if (w0->in % 256) return 0;
        for (int i = 0; i < k; i++)
            if ((uintptr_t)w[i]->data & 15) return 0;
    }
    const int rblocks = (rows + (pair ? 63 : 127)) / (pair ? 64 : 128);
    const int steps = mm_steps(w0->bits, gs, q8x); /* = the kernel's S */
    const size_t units = pair ? 2 * (size_t)rows : (size_t)rows;
    const int nst = w0->in / cps, ks1 = (nst + steps - 1) / steps;
    int J = mm_chunks(c, ks1, pair ? (rows + 7) / 8 : (rows + 15) / 16);
    if (walk) J = mm_balance(c, J, ks1, rblocks, mm_walk_occ(c, w0, rows, mode), units);
    const int ks = (nst + J * steps - 1) / (J * steps);
    if (ks > 65535 || (ks > 1 && ((size_t)ks * units > TERN_CUDA_PART_FLOATS || rblocks > MM_CNT))) return 0;
    *rblocks_out = rblocks;
    *ks_out = ks;
    *j_out = J;
    return 1;
}

/* mm_plan, then the launch arguments both walks share (gemv_xr.cu's several rows too): matrices, outputs,
 * rows, slices, row blocks, partials, counters; no pre-norm, no L2 prefetch. 0: not served */
int tern__cuda_mm_args(const tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e, int k,
                       const float *x, int mode, int walk, MmArgs *a) {
    int rows, rblocks, ks, J;
    if (!mm_plan(c, w, k, x, mode, walk, &rows, &rblocks, &ks, &J)) return 0;
    const tern__cuda_w *w0 = w[0];
    *a = MmArgs{};
    mat_ptrs(a->data, a->scales, a->biases, a->y, a->out, y, w, e, k);
    for (int i = k; i < 3; i++) { a->data[i] = a->data[0]; a->scales[i] = a->scales[0]; a->biases[i] = a->biases[0]; }
    a->rows = rows; /* mm_plan's: Σ out, or the outputs of a gate/up pair */
    a->nm = k;
    a->in = w0->in;
    a->ng = w0->in / w0->group_size;
    a->mode = mode;
    a->x = x;
    a->part = c->part;
    a->cnt = c->mm_cnt;
    a->magic = 0x43004300u;
    a->ks = ks;
    a->J = J;
    a->rblocks = rblocks;
    return 1;
}

/* Does tern__cuda_gemv_mma serve matrices w[0..k) for x in this mode? (Without a launch: the fused
 * pre-norm op (gemv1.cu) decides where a row goes before it stages anything.) */
extern "C" int tern__cuda_gemv_mma_serves(const tern__cuda *c, const tern__cuda_w *const *w, int k, const float *x,
                                          int mode) {
    int rows, rblocks, ks, J;
    return mm_plan(c, w, k, x, mode, 1, &rows, &rblocks, &ks, &J);
}

/* y[i] (op) W_i·x for matrices w[0..k) sharing `in` and the format (mode: G1_*). Returns 1 when it
 * ran, 0 when the format or shape is not served here (the caller runs gemv.cu's kernels). */
extern "C" int tern__cuda_gemv_mma(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e, int k,
                                   const float *x, int mode) {
    return tern__cuda_gemv_mma_norm(c, y, w, e, k, x, mode, NULL, NULL, 0.0f, NULL);
}

/* as tern__cuda_gemv_mma; xn != NULL: x staged as rmsnorm(x)·nw (written to xn as well); res: of x' (the
 * residual add, written to res->x_out) */
static int mm_launch(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e, int k, const float *x,
                     int mode, const float *nw, float *xn, float eps, const tern_norm_res *res, const tern__cuda_rope_kv *rope);
extern "C" int tern__cuda_gemv_mma_norm(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e,
                                        int k, const float *x, int mode, const float *nw, float *xn, float eps,
                                        const tern_norm_res *res) {
    return mm_launch(c, y, w, e, k, x, mode, nw, xn, eps, res, NULL);
}

/* q|k|v with rope_kv_write in the split-K epilogue (mm_reduce_rope): only the XP1 walk with BF16 scales and two
 * blocks per SM (the plain bf16 mode's Q4 kernel) and a plan with split K; heads of d | 128 whose q and k rows
 * fill whole row blocks */
extern "C" int tern__cuda_gemv_mma_rope(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const float *x,
                                        const float *nw, float *xn, float eps, const tern__cuda_rope_kv *rope) {
    const int d = rope->d;
    if (!xn || d > 128 || 128 % d || (rope->nh * d) % 128 || (rope->nkv * d) % 128) return 0;
    const int e[3] = {0, 0, 0};
    return mm_launch(c, y, w, e, 3, x, G1_PLAIN, nw, xn, eps, NULL, rope);
}

extern "C" int tern__cuda_mm_rot; /* TERN_CUDA_MM_ROT, read once (tests set it): see mm_launch */
int tern__cuda_mm_rot = -1;
extern "C" int tern__cuda_gemv_rmsu; /* TERN_CUDA_GEMV_RMSU, read once (tests set it): see mm_launch */
int tern__cuda_gemv_rmsu = -1;

static int mm_launch(tern__cuda *c, float *const *y, const tern__cuda_w *const *w, const int *e, int k, const float *x,
                     int mode, const float *nw, float *xn, float eps, const tern_norm_res *res, const tern__cuda_rope_kv *rope) {
    MmArgs a;
    if (!tern__cuda_mm_args(c, y, w, e, k, x, mode, 1, &a)) return 0;
    if (a.rows <= 0) return 1;
    const tern__cuda_w *w0 = w[0];
    const int gs = w0->group_size, rblocks = a.rblocks, J = a.J;
    set_norm_args(a, nw, xn, eps, res);
    /* TERN_CUDA_GEMV_L2PF=N (default 3): before its pdl_wait, every warp prefetches into L2 the next N
     * items (row block, chunk) of its walk beyond the one its registers load, so a launch that starts
     * while the previous kernel drains (programmatic dependent launch) has its whole first row block
     * on the way, not one chunk per warp. H200, session 13 (NOTES (v)), µs 0 / 3: 14336x4096 17.1 /
     * 16.1, 4096x14336 18.4 / 17.3, lm head 124.2 / 122.9; b1 q4 tok/s llama3-8b 311.8 / 313.5 / 313.3 /
     * 312.4 → 316.1 / 315.4 / 313.8 / 313.9, gemma4-12b 191.5 / 190.9 / 191.4 / 191.4 → 194.2 / 194.1 /
     * 194.0 / 192.5 (8 and 16 lose on the head). The default is 0 where the memory's peak rate is under 4 TB/s (an
     * H100: session 63, NOTES (bw), b1 q4 3 / 0, two reps: llama3-8b 346.4 / 347.0 → 353.7 / 354.2, gemma4-12b 197.9 /
     * 197.7 → 202.5 / 202.8, gemma4-e4b 286.9 / 286.8 → 285.6 / 285.4, 26b-a4b 307.2 → 307.8; session 52's chain
     * −1.5 %), 3 above (the H200 figures above) */
    static int l2pf = -1;
    if (l2pf < 0) {
        const int dflt = c->mem_peak > 0 && c->mem_peak < 4e12 ? 0 : 3;
        l2pf = tern__cuda_env_int("TERN_CUDA_GEMV_L2PF", dflt);
        if (l2pf < 0 || l2pf > 64) l2pf = dflt;
    }
    a.l2pf = l2pf;
    /* TERN_CUDA_GEMV_RMSU (default 1 on, 0 off): the pre-norm's sum of squares (block_rms_inv over x in global
     * memory) issues the loads of a thread's two virtual threads together, 8 each, instead of one dependent L2
     * round trip each (16 serial trips at K 4096: ~16 % of a llama3-8b Q4 gate|up launch's warp samples, ncu,
     * NOTES (at)); the same bits. H200, session 35 (NOTES (au)), b1 q4 tok/s off / on: llama3-8b 338.7 / 339.4 →
     * 354.7 / 352.8, gemma4-12b 199.2 / 200.4 → 206.2 / 206.4 */
    if (tern__cuda_gemv_rmsu < 0) tern__cuda_gemv_rmsu = tern__cuda_env_int("TERN_CUDA_GEMV_RMSU", 1) != 0;
    a.rmsu = tern__cuda_gemv_rmsu ? 8 : 1;
    /* TERN_CUDA_MM_ROT (default 1; 0 off): the staged table's stores in mm_stage's rotated order (bank conflicts: ncu
     * put 71 % of a gemma4-e4b gate|up launch's shared-store wavefronts in them, NOTES (bo)); the same table, so the
     * same bits. H100, session 56 (NOTES (bp)), b1 q4 tok/s off / on: gemma4-e4b 267.2 / 268.4 → 270.8 / 271.5,
     * gemma4-12b 182.4 / 182.5 → 184.5 / 184.2 */
    if (tern__cuda_mm_rot < 0) tern__cuda_mm_rot = tern__cuda_env_int("TERN_CUDA_MM_ROT", 1) != 0;
    a.rot = tern__cuda_mm_rot;
    /* TERN_CUDA_GEMV_XSM (session 35: the slice's normalised x formed once into shared memory, the B table, Σx and
     * block 0's writes reading it there instead of reloading x from global memory) lost and was removed: b1 q4
     * llama3-8b 351.3 / 352.3 → 333.5 / 334.6, gemma4-12b 204.7 / 206.2 → 196.9 / 197.2 (NOTES (au)) */
    /* A rolling variant (each warp prefetching the item D ahead of the one it starts, through its whole
     * walk) lost and was removed (session 13, NOTES (v)): the head 124.2 → 115.6 µs at D = 1, but b1
     * llama3-8b q4 313.8 → 303.8 with L2PF = 3 (D = 2, 4 lose too) */
    /* XP1's scale pairs as one 32-bit load (TERN_CUDA_GEMV_SC32, session 13) lost and were removed
     * (session 14, NOTES (w)): 4096x4096 6.8 → 7.3 µs, llama3-8b q4 b1 302 → 298 tok/s */
    const int gb = gs * w0->bits / 8;
    const size_t smem = (size_t)J * (4 * 8 * 32 * sizeof(uint2) + 4 * 4 * sizeof(float)); /* B table (S·NT <= 4) + Σx, per chunk */
    const bool f16 = w0->sdtype == TERN_DT_F16;
    const int occ = mm_walk_occ(c, w0, a.rows, a.mode); /* blocks per SM: the grid and mm_go's launch bounds */
    const dim3 grid((unsigned)mm_grid_x(c, rblocks, a.ks, occ), (unsigned)a.ks);
    if (rope) { /* mm_go's XP1 + PP instance with the rope epilogue, or not served */
        mm_env();
        if (w0->bits != 4 || f16 || occ != 2 || a.ks < 2 || !mm_xp1(c) || mm_i8(c) || tern__cuda_gemv_mma_pp == 0) return 0;
        a.rope = *rope;
        cudaSetDevice(c->device);
        if (gb == 16) tern_launch(c->stream, gemv_mma_kernel<4, 16, false, true, true, true, false, 2, true>, grid, 256, smem, a);
        else if (gb == 32) tern_launch(c->stream, gemv_mma_kernel<4, 32, false, true, true, true, false, 2, true>, grid, 256, smem, a);
        else tern_launch(c->stream, gemv_mma_kernel<4, 64, false, true, true, true, false, 2, true>, grid, 256, smem, a);
        tern__cuda_check(c, "gemv_mma rope");
        tern__cuda_gemv_mma_calls++;
        return 1;
    }
    cudaSetDevice(c->device);
    if (w0->bits != 4 && w0->bits != 8) { /* the kernels' GB: Q4's bytes per group, gs / 2 */
        const int g4 = gs / 2;
#define MM_WIDE(B)                                                                                                     \
    (g4 == 16 ? mm_go<B, 16>(c, grid, smem, a, f16, occ) : g4 == 32 ? mm_go<B, 32>(c, grid, smem, a, f16, occ)        \
              : mm_go<B, 64>(c, grid, smem, a, f16, occ))
        switch (w0->bits) {
        case 2: MM_WIDE(2); break;
        case 3: MM_WIDE(3); break;
        case 5: MM_WIDE(5); break;
        default: MM_WIDE(6); break;
        }
#undef MM_WIDE
    } else if (w0->bits == 4) {
        if (gb == 16) mm_go<4, 16>(c, grid, smem, a, f16, occ);
        else if (gb == 32) mm_go<4, 32>(c, grid, smem, a, f16, occ);
        else mm_go<4, 64>(c, grid, smem, a, f16, occ);
    } else {
        if (gb == 32) mm_go<8, 32>(c, grid, smem, a, f16, occ);
        else if (gb == 64) mm_go<8, 64>(c, grid, smem, a, f16, occ);
        else mm_go<8, 128>(c, grid, smem, a, f16, occ);
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

/* modes 4, 5: warp = 16 rows walking all steps in chunks of 4 (256 bytes per row) through a ring of 4
 * chunks in shared memory (cp.async; 8 warps, 128 KB per block), the chunk XOR-read from the ring:
 * 4 = each lane copies its own pieces (the removed gemv_ring.cu's copies: 8 rows x 64 B per instruction), 5 = a
 * copy instruction reads 512 contiguous bytes (2 rows x 256 B) and the warp syncs before reading.
 * Mode 6: the flat stream with four independent 16-byte loads in flight per thread. */
__global__ void __launch_bounds__(256, 1) mm_probe_ring_kernel(const uint8_t *w, int rows, int rb, int mode,
                                                               uint32_t *sink) {
    pdl_start();
    extern __shared__ uint4 pr_sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t acc = 0;
    if (mode == 6) {
        const size_t n = (size_t)rows * rb / 16, st = (size_t)gridDim.x * blockDim.x;
        size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
        const uint4 *p = (const uint4 *)w;
        for (; i + 3 * st < n; i += 4 * st) {
            const uint4 a = mm_ld4((const uint8_t *)(p + i)), b = mm_ld4((const uint8_t *)(p + i + st));
            const uint4 c = mm_ld4((const uint8_t *)(p + i + 2 * st)), d = mm_ld4((const uint8_t *)(p + i + 3 * st));
            acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
        }
        for (; i < n; i += st) {
            const uint4 a = mm_ld4((const uint8_t *)(p + i));
            acc ^= a.x ^ a.y ^ a.z ^ a.w;
        }
    } else {
        constexpr int R = 4;
        uint4 *ring = pr_sm + (size_t)warp * R * 256; /* [slot][256 pieces of 16 B] */
        const int r0 = (blockIdx.x * 8 + warp) * 16, nch = rb / 256;
        auto issue = [&](int n) {
            if (n < nch) {
                uint4 *sl = ring + (n % R) * 256;
                if (mode == 4) {
                    const int ra = min(r0 + g, rows - 1), rc = min(r0 + g + 8, rows - 1);
#pragma unroll
                    for (int s4 = 0; s4 < 4; s4++) {
                        const size_t o = (size_t)n * 256 + s4 * 64 + t * 16;
                        mma_cp16_ord(sl + (2 * s4) * 32 + lane, w + (size_t)ra * rb + o);
                        mma_cp16_ord(sl + (2 * s4 + 1) * 32 + lane, w + (size_t)rc * rb + o);
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const int r = min(r0 + 2 * j + (lane >> 4), rows - 1);
                        mma_cp16_ord(sl + j * 32 + lane, w + (size_t)r * rb + (size_t)n * 256 + (lane & 15) * 16);
                    }
                }
            }
            mma_cp_commit_ord();
        };
#pragma unroll
        for (int i = 0; i < R - 1; i++) issue(i);
        for (int n = 0; n < nch; n++) {
            issue(n + R - 1);
            mma_cp_wait_ord<R - 1>();
            if (mode == 5) __syncwarp();
            const uint4 *sl = ring + (n % R) * 256;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint4 a = sl[j * 32 + lane];
                acc ^= a.x ^ a.y ^ a.z ^ a.w;
            }
            if (mode == 5) __syncwarp(); /* the slot is refilled by other lanes next */
        }
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if (lane == 0) sink[blockIdx.x * 8 + warp] = acc;
}

extern "C" void tern__cuda_mm_probe(tern__cuda *c, const void *w, int rows, int rb, int mode, void *sink) {
    if (mode >= 4) {
        const size_t smem = mode == 6 ? 0 : (size_t)8 * 4 * 256 * 16;
        static bool attr = false;
        if (!attr) {
            cudaFuncSetAttribute(mm_probe_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(8 * 4 * 256 * 16));
            attr = true;
        }
        const dim3 grid(mode == 6 ? (unsigned)(c->n_sm * 4) : (unsigned)((rows + 127) / 128));
        tern_launch(c->stream, mm_probe_ring_kernel, grid, 256, smem, (const uint8_t *)w, rows, rb, mode, (uint32_t *)sink);
        tern__cuda_check(c, "mm_probe");
        return;
    }
    dim3 grid;
    if (mode == 0) grid = dim3((unsigned)((rows + 127) / 128), (unsigned)((rb / 64 + 3) / 4));
    else if (mode == 1) grid = dim3((unsigned)((rows + 127) / 128));
    else if (mode == 2) grid = dim3((unsigned)((rows + 15) / 16));
    else grid = dim3((unsigned)(c->n_sm * 8));
    tern_launch(c->stream, mm_probe_kernel, grid, 256, 0, (const uint8_t *)w, rows, rb, mode, (uint32_t *)sink);
    tern__cuda_check(c, "mm_probe");
}

/*
 * attn_decode.cu — attention for decode rows over the paged KV cache (f32 pages, and the BF16/F16
 * kinds of kvq.h): split-K flash-decoding in two passes over a split held in shared memory.
 *
 * attention.cu's kernel serves any rows (key tiles behind four barriers, a thread per (query, key));
 * a one-pass warp walk (session 4) scored one key at a time per warp — a 5-level shuffle sum and the
 * online-softmax update on one dependent chain per head — and ran 16 us for one row over 192 keys,
 * 57 us (1.2 TB/s) over 8k. Here a block of 8 warps owns (kv head g, split z, row r); a split holds
 * at most `chmax` keys (<= 1024), so its scores fit in shared memory and the softmax needs no
 * running rescale:
 *   0. the split's block-table lookups, once, into shared memory (record index per key, -1 when the
 *      block is not resident);
 *   1. scores: a key group of LPK = D/EPL lanes holds one K row (EPL elements per lane: 8, or 16 at
 *      D 512), so a warp scores 32/LPK keys at once and U of those groups per iteration, the next U
 *      loading meanwhile: U·G independent dot products, each summed over its LPK lanes with log2(LPK)
 *      shuffles; s[h][k] (scale, softcap; -inf for a key not resident) to shared memory;
 *   2. per head (a warp each): M = max s, p = e^{s - M} in place, L = Σ p;
 *   3. P·V: the same key walk over V rows (the first group loaded during the softmax), acc[h][e] +=
 *      p[h][k]·v[e]; the key groups of a warp are summed with shuffles, the 8 warps in shared memory
 *      in warp order.
 * One split: out = acc / L. Several: (acc, M, L) go to the partials in the layout of
 * tern__cuda_attn_merge, and the last block of (row, kv head) to arrive (a counter per pair in
 * c->ad_cnt, reset by that block) merges the splits in split order: one launch, deterministic.
 * A split's size adapts to the row: chunk = max(chmin, ceil(len / splits)) keys, so a graph planned
 * for the whole table runs ceil(len / chunk) live splits at a short context (the others exit at once).
 * TERN_CUDA_AD_CLUSTER=N (default 16 since session 12; 0 off): up to N splits of a (row, kv head)
 * form one thread-block cluster and merge through distributed shared memory (ad_cluster_merge: the
 * same arithmetic and order as the last-block merge, so the same bits; blocks past the live splits
 * stay and contribute nothing).
 *
 * Visibility: keys lo..pos of the row (lo = pos - window + 1 for sliding layers), skipping
 * block-table entries < 0 — attention.cu's rule without spans (span steps stay there). f32 math with
 * expf/tanhf; the summation order differs from attention.cu (within the f32 parity bound).
 * Shapes: D in {32, 64, 128, 256, 512}, G = nh/nkv <= 8 (<= 4 at D 512); larger groups go to the tile
 * kernels, or (TERN_CUDA_AD_HSPLIT=1, opt-in until an H200 run times it) run here in hs blocks per KV
 * head of at most 8 (4) heads each, every block reading the group's K/V rows. TERN_CUDA_ATTN_DEC=0 turns it off. H200 (bench/NOTES.md (p)): llama3-8b q4 decode 258.5 ->
 * 270.0 tok/s at 128 keys and 194.2 -> 220.3 at 8k against the walk; one row over 8k keys 37.8 us,
 * 64 rows 1602 us (walk 2466).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/attn_decode.cuh"

#include <cooperative_groups.h>
#include <math.h>
#include <stdlib.h>
#include <type_traits>

namespace cg = cooperative_groups;

#define AD_CLMAX 16 /* splits per cluster (above 8: the non-portable size, allowed at open) */
#define AD_CLROWS 4 /* clusters for launches of at most this many rows (H200, session 12: llama3-8b bf16
                     * 8 sequences 1150.0 → 1141.0 dec tok/s with clusters, 64: 8908 → 8904) */

/* TERN_CUDA_AD_CLUSTER=N (2..16, default 16; 0 off): a row's splits as one cluster of at most N blocks
 * merged in shared memory (ad_cluster_merge); -1 until read (tests set it). H200, session 12, 512 keys
 * (bench/NOTES.md (u)): one row 14.2 / 14.3 µs (off) → 12.6 / 12.8 (8), 13.0 / 13.1 (16); llama3-8b b1
 * bf16 213.1 / 214.1 → 215.8 / 216.5 tok/s (16; 8: 213.3 / 213.9), q4 306.1 / 305.7 → 312.1 / 310.8 */
extern "C" int tern__cuda_ad_cluster;
int tern__cuda_ad_cluster = -1;
extern "C" unsigned long long tern__cuda_attn_decode_cluster_calls; /* cluster launches (tests) */
unsigned long long tern__cuda_attn_decode_cluster_calls = 0;
static int ad_cluster(void) {
    if (tern__cuda_ad_cluster < 0) tern__cuda_ad_cluster = tern__cuda_env_int("TERN_CUDA_AD_CLUSTER", 16);
    return tern__cuda_ad_cluster < 2 ? 0 : tern__cuda_ad_cluster > AD_CLMAX ? AD_CLMAX : tern__cuda_ad_cluster;
}

/* *v once: the integer environment setting `name` (default dflt) clamped to [lo, hi]; a value >= 0 already there (a test
 * set it) stays */
static int ad_env(int *v, const char *name, int dflt, int lo, int hi) {
    if (*v < 0) {
        const int x = tern__cuda_env_int(name, dflt);
        *v = x < lo ? lo : x > hi ? hi : x;
    }
    return *v;
}

/* TERN_CUDA_ATTN_DEC: 0 off, else on; -1 until read (tests set it) */
extern "C" int tern__cuda_ad_mode;
int tern__cuda_ad_mode = -1;
extern "C" unsigned long long tern__cuda_attn_decode_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_attn_decode_calls = 0;

/* Groups above 8 heads (4 at d 512) run in several blocks per KV head (default; TERN_CUDA_AD_HSPLIT=0:
 * those go to the tile kernels). H200, d 512 G = 16 at 8k, BF16 pages: 270 -> 70 us for one row,
 * 5479 -> 1016 us for 32; gemma4-12b decode at 4k 100.2 -> 113.3 tok/s (NOTES (r)). */
extern "C" int tern__cuda_ad_hsplit; /* -1 until read (tests set it) */
int tern__cuda_ad_hsplit = -1;
static int ad_hsplit(void) {
    if (tern__cuda_ad_hsplit < 0) tern__cuda_ad_hsplit = tern__cuda_env_int("TERN_CUDA_AD_HSPLIT", 1) != 0;
    return tern__cuda_ad_hsplit;
}

/* TERN_CUDA_AD_EARLY (default 1 since session 14; 0 off; BF16 pages): a launch of one row issues its block
 * table lookups and its first K/V loads before pdl_wait, so they overlap the tail of the previous kernels
 * (the q|k|v GEMV, rope_kv_write); after the wait it loads q and reloads the row of key pos, the only key
 * written in this step (one row: no other row of the sequence writes a key this step; pos and the block
 * table are host uploads, stream-ordered before the step). The same bits. H200 (NOTES (w)): llama3-8b b1
 * q4 322 -> 328, bf16 218 -> 221, gemma4-12b q4 196 -> 201 tok/s. -1 until read (tests set it). */
extern "C" int tern__cuda_ad_early;
int tern__cuda_ad_early = -1;
static int ad_early(void) {
    if (tern__cuda_ad_early < 0) tern__cuda_ad_early = tern__cuda_env_int("TERN_CUDA_AD_EARLY", 1) != 0;
    return tern__cuda_ad_early;
}

/* TERN_CUDA_AD_WANT=N (1..16, default 2): blocks of 8 warps per SM the split plan aims at; launches with
 * at least max(2, N) blocks per SM of (row, kv head) pairs run unsplit. Host-side only (written in session 15
 * for an A/B: at 64 rows one block per pair does a ~200-key latency chain, 2 blocks per SM at 116 registers;
 * 4 would split each pair in two, merged by the last block) */
static int ad_want(void) {
    static int v = -1;
    return ad_env(&v, "TERN_CUDA_AD_WANT", 2, 1, 16);
}

/* TERN_CUDA_AD_1P=1 (opt-in, session 15, untimed): launches whose (row, kv head) pairs fill two blocks per SM
 * (batch decode; with a graph's whole-table key bound the split plan would still split them) run
 * attn_decode1p.cu's one-pass kernel, a block per pair; 2 (tests) any launch. -1 until read */
extern "C" int tern__cuda_ad_1p;
int tern__cuda_ad_1p = -1;
static int ad_1p(void) {
    if (tern__cuda_ad_1p < 0) tern__cuda_ad_1p = tern__cuda_env_int("TERN_CUDA_AD_1P", 0);
    return tern__cuda_ad_1p;
}

/* TERN_CUDA_AD_TC (default 1 since session 16; 0 off): the same launches as AD_1P (tried first: (row, kv head)
 * pairs filling two blocks per SM) on attn_decode_tc.cu's tensor-core kernel (BF16 / F16 pages, D 64 / 128 /
 * 256); 2 (tests) any launch. H200 (NOTES (y)): 41.8 → 22.0 µs a layer at 64 llama3-8b sequences; decode at 64
 * q4 10026 → 11256, bf16 8678 → 9807 tok/s. -1 until read */
extern "C" int tern__cuda_ad_tc;
int tern__cuda_ad_tc = -1;
static int ad_tc(void) {
    if (tern__cuda_ad_tc < 0) tern__cuda_ad_tc = tern__cuda_env_int("TERN_CUDA_AD_TC", 1);
    return tern__cuda_ad_tc;
}
/* Fewer pairs than 2 × SMs (batch decode of 8..32 llama3-8b sequences) take AD_TC as well from
 * TERN_CUDA_AD_TC_MIN (pairs, default 64) when the keys the plan sees (a graph's: the whole block table) are
 * at most TERN_CUDA_AD_TC_KEYS (default 16384): a block per pair walks all of its row's keys, which the split
 * kernel spreads over the SMs — measured to win up to 8k keys, longer tables keep the split kernel until
 * measured. H200, session 17 (NOTES (z)), llama3-8b, tok/s at 8 / 16 / 32 sequences, 2 × SMs → 64 pairs:
 * 128 + 128 q4 2079 / 3869 / 6195 → 2339 / 4248 / 6780, bf16 1144 / 2772 / 4975 → 1212 / 3094 / 5666;
 * 2048 + 64 q4 at 8 / 16: 1254 / 1851 → 1394 / 2368; session 18 (NOTES (aa)), 8192 + 64 q4 at 8 / 16: 652 / 736
 * (bound 4096) → 681 / 867 (16384). TERN_CUDA_AD_TC_MIN=0: from 2 × SMs only */
/* two blocks per SM: the (row, kv head) pairs that fill the GPU for the one-pass kernels */
static long ad_two_per_sm(const tern__cuda *c) { return 2L * (c->n_sm > 0 ? c->n_sm : 132); }

static bool ad_tc_takes(const tern__cuda *c, long pairs, long keys) {
    static int vmin = -1, vkeys = -1;
    if (vmin < 0) {
        vmin = tern__cuda_env_int("TERN_CUDA_AD_TC_MIN", 64);
        vkeys = tern__cuda_env_int("TERN_CUDA_AD_TC_KEYS", 16384);
    }
    if (pairs >= ad_two_per_sm(c)) return true;
    return vmin > 0 && pairs >= vmin && keys <= vkeys;
}

/* TERN_CUDA_AD_TCS (1 default since session 19; 0 off; 2 any launch, tests): one-row and few-row launches AD_TC does
 * not take, in a long-context step (ops.h tern_rows_long: >= TERN_LONG_KEYS keys, default 4096) and on a layer that
 * sees that many keys (no shorter window), run the tensor-core kernel split over the keys (attn_decode_tc.cu, split):
 * about 2 × SMs blocks, each over at least TERN_CUDA_AD_TCS_CH keys (default 64: one 16-key chunk per warp), merged by
 * the last. The split kernel here is instruction-latency bound (ncu, H200, llama3-8b b1, BF16 pages: 14.3 µs a
 * layer at 512 keys, ~33 at 8k = 0.5 TB/s). H200 (NOTES (aa), (ab)): faster alone (512 / 8192 keys 19.2 / 45.9 →
 * 17.7 / 26.3 µs, locked clocks) and in the b1 graph at 8k (q4 269 → 291 tok/s with its early copies,
 * TERN_CUDA_AD_TCS_EARLY), but at 512 keys it loses PDL's overlap between kernels (llama3-8b bf16 221 → 202,
 * gemma4-e4b q4 279 → 242; not the GEMVs' L2 prefetch: the same with TERN_CUDA_GEMV_L2PF=0) — hence the class. The
 * crossover (q4 / bf16, split kernel → TCS): 1k 320 / 214 → 314 / 207, 2k 315 / 208 → 305 / 203, 4k 296 / 202 →
 * 302 / 201 tok/s. -1 until read (tests set both) */
extern "C" int tern__cuda_ad_tcs, tern__cuda_ad_tcs_ch;
int tern__cuda_ad_tcs = -1, tern__cuda_ad_tcs_ch = -1;
static int ad_tcs(void) {
    if (tern__cuda_ad_tcs < 0) tern__cuda_ad_tcs = tern__cuda_env_int("TERN_CUDA_AD_TCS", 1);
    return tern__cuda_ad_tcs;
}
static int ad_tcs_ch(void) { return ad_env(&tern__cuda_ad_tcs_ch, "TERN_CUDA_AD_TCS_CH", 64, 16, 4096); }

/* TERN_CUDA_AD_TCS512 (session 60; default 1; 0 off; 2 any launch of at most TCS512_ROWS rows, tests and A/Bs): Gemma 4's
 * global layers (D 512) in a long-context step (ad_long) on the tensor-core kernel split over the keys — two blocks per
 * (row, group of at most 8 heads), one a half of the outputs, as the unsplit D 512 form, times ~one block an SM's worth
 * of splits, merged by tern__cuda_attn_merge over many blocks. Before, every kernel these layers could take ran one row
 * over 8192 keys of 2 kv heads (33.5 MB) in ~70 µs on an H100 (0.48 TB/s; bench/NOTES.md (bt)): the split kernel and
 * r1 hold too little in flight per block for so few (kv head, split) pairs, and a last-block merge of that many
 * partials is itself ~20 µs. -1 until read (tests set it) */
extern "C" int tern__cuda_ad_tcs512;
int tern__cuda_ad_tcs512 = -1;
static int ad_tcs512(void) {
    if (tern__cuda_ad_tcs512 < 0) tern__cuda_ad_tcs512 = tern__cuda_env_int("TERN_CUDA_AD_TCS512", 1);
    return tern__cuda_ad_tcs512;
}
/* TERN_CUDA_AD_TCS512_ROWS (1..64, default 8; session 61): launches of at most that many rows take TCS512 (above, a
 * batch at 8k runs the split kernel at D 512 until its pairs reach AD_TC_MIN). H100, 8 sequences of gemma4-26b-a4b bf16
 * at 8192 (bench/NOTES.md (bu)): 4 (AD_CLROWS, before) 482.5 → 16 529.2 tok/s; 4 → 8 at 8 sequences (NOTES (bv)):
 * gemma4-e4b 791 → 865, 12b 429 → 494. Its splits fill one wave of one block an SM: two waves (twice the splits over
 * half the keys each) lost, b1 26b-a4b at 8k 238.8 → 233.6. -1 until read */
static int ad_tcs512_rows(void) {
    static int v = -1;
    return ad_env(&v, "TERN_CUDA_AD_TCS512_ROWS", 8, 1, 64);
}
extern "C" unsigned long long tern__cuda_attn_decode_tcs512_calls; /* launches (tests check the path ran) */
unsigned long long tern__cuda_attn_decode_tcs512_calls = 0;

/* TERN_CUDA_AD_TCS_EARLY (default 1; 0 off; session 19): TCS's one-row launches over BF16 pages issue the first
 * tile's records and copies before pdl_wait, as AD_EARLY does here (attn_decode_tc.cu). -1 until read (tests set it) */
extern "C" int tern__cuda_ad_tcs_early;
int tern__cuda_ad_tcs_early = -1;
static int ad_tcs_early(void) {
    if (tern__cuda_ad_tcs_early < 0) tern__cuda_ad_tcs_early = tern__cuda_env_int("TERN_CUDA_AD_TCS_EARLY", 1) != 0;
    return tern__cuda_ad_tcs_early;
}

/* TERN_CUDA_AD_LEAN (default 1 since session 19; 0 off): one-row launches with EARLY take attn_dec_kernel's LEAN
 * instances (see the kernel). H200 (NOTES (ab)): one row at 32 / 512 / 2048 / 8192 keys 11.5 / 19.5 / 24.4 / 45.6
 * -> 9.9 / 16.9 / 24.6 / 46.9 µs (ncu); b1 llama3-8b bf16 220.6 / 221.7 -> 223.6 / 223.6, q4 331.2 / 326.9 ->
 * 337.3 / 334.6, gemma4-e4b q4 275.4 / 276.6 -> 280.3 / 278.4 tok/s. -1 until read (tests set it) */
extern "C" int tern__cuda_ad_lean;
int tern__cuda_ad_lean = -1;
static int ad_lean(void) {
    if (tern__cuda_ad_lean < 0) tern__cuda_ad_lean = tern__cuda_env_int("TERN_CUDA_AD_LEAN", 1) != 0;
    return tern__cuda_ad_lean;
}

/* TERN_CUDA_AD_R1 (session 40; default 1; 0 off; 2 any launch, tests): launches of at most AD_CLROWS rows over BF16 /
 * F16 pages, D 64 / 128 / 256 (and 512, TERN_CUDA_AD_R1_512), G <= 8, that neither the long-context class nor AD_TC
 * takes, on attn_decode_r1.cu's
 * register-fed tensor-core kernel. H200 (bench/NOTES.md (az)), b1 at 512 keys: llama3-8b bf16 222.9 -> 230.7, q4 353
 * -> 369 tok/s; at 2048 keys 209 -> 214, 332 -> 338. -1 until read (tests set it) */
extern "C" int tern__cuda_ad_r1;
int tern__cuda_ad_r1 = -1;
static int ad_r1(void) {
    if (tern__cuda_ad_r1 < 0) tern__cuda_ad_r1 = tern__cuda_env_int("TERN_CUDA_AD_R1", 1);
    return tern__cuda_ad_r1;
}

/* TERN_CUDA_AD_R1_512 (session 40; default 1; 0 off): D 512 (Gemma 4's global layers) on attn_decode_r1.cu as well,
 * groups of 4 warps a chunk. H200 (NOTES (az)), b1 off -> on, three reps: gemma4-e4b q4 283.4 / 282.1 / 283.0 -> 286.5 /
 * 285.6 / 286.9, gemma4-26b-a4b q4 297.5 / 300.4 / 298.5 -> 300.8 / 298.6 / 301.2. -1 until read (tests set it) */
extern "C" int tern__cuda_ad_r1_512;
int tern__cuda_ad_r1_512 = -1;
static int ad_r1_512(void) {
    if (tern__cuda_ad_r1_512 < 0) tern__cuda_ad_r1_512 = tern__cuda_env_int("TERN_CUDA_AD_R1_512", 1);
    return tern__cuda_ad_r1_512;
}

static int ad_mode(void) {
    if (tern__cuda_ad_mode < 0) tern__cuda_ad_mode = tern__cuda_env_int("TERN_CUDA_ATTN_DEC", 1);
    return tern__cuda_ad_mode;
}

#define AD_WARPS 8
/* shortest split (keys): TERN_CUDA_AD_CHMIN=N (16..1024) for A/Bs, read once; tests may set it */
extern "C" int tern__cuda_ad_chmin;
int tern__cuda_ad_chmin = -1;
static int ad_chmin(void) { return ad_env(&tern__cuda_ad_chmin, "TERN_CUDA_AD_CHMIN", 32, 16, 1024); }


/* The merge of a cluster's splits (a.cl blocks along y, rank = split z), the same arithmetic in the same
 * order as the last-block merge through global partials below, so the same bits: each block first sums
 * its warps' P·V into red[h·D + i] (in place: only the thread of output (h, i) touches that slot), its
 * (M, L) per head are in sml; after a cluster barrier every block computes the heads' weights
 * e^{M_z - M} from all blocks' (M, L) in split order and writes its share of the outputs, Σ_z part·w / L,
 * reading the other blocks' sums in their shared memory; a second barrier keeps that memory alive until
 * every block has read it. No partials, fence or counter: one memory round trip less per split. */
template <int GM, bool LEAN = false>
__device__ __forceinline__ void ad_cluster_merge(const AdArgs &a, float *red, float (*sml)[2], int r, size_t head0,
                                                 int G, int D) {
    __shared__ float cw[AD_CLMAX][GM], cL[GM];
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int h = idx / D, i = idx % D;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < AD_WARPS; w++) v += red[((size_t)w * GM + h) * D + i];
        red[(size_t)h * D + i] = v;
    }
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    const int CS = a.cl, rank = (int)cl.block_rank();
    if constexpr (LEAN) { /* the ranks' (M, L) staged here, one remote load per thread, then the same arithmetic */
        __shared__ float2 cml[AD_CLMAX][GM];
        for (int idx = threadIdx.x; idx < CS * G; idx += blockDim.x) {
            const int zz = idx / G, h = idx % G;
            const float *o = cl.map_shared_rank(&sml[0][0], zz);
            cml[zz][h] = make_float2(o[2 * h], o[2 * h + 1]);
        }
        __syncthreads();
        if (threadIdx.x < G) {
            const int h = threadIdx.x;
            cL[h] = ad_split_weights([&](int zz) { return cml[zz][h]; }, [&](int zz, float c) { cw[zz][h] = c; }, CS);
        }
    } else if (threadIdx.x < G) { /* per head: each split's weight and L (split order) */
        const int h = threadIdx.x;
        cL[h] = ad_split_weights(
            [&](int zz) {
                const float *o = cl.map_shared_rank(&sml[0][0], zz);
                return make_float2(o[2 * h], o[2 * h + 1]);
            },
            [&](int zz, float c) { cw[zz][h] = c; }, CS);
    }
    __syncthreads();
    const int tot = G * D, per = (tot + CS - 1) / CS, i0 = rank * per, i1 = min(tot, i0 + per);
    for (int idx = i0 + threadIdx.x; idx < i1; idx += blockDim.x) {
        const int h = idx / D, i = idx % D;
        float v = 0.0f;
#pragma unroll 16
        for (int zz = 0; zz < CS; zz++) v += cl.map_shared_rank(red, zz)[(size_t)h * D + i] * cw[zz][h];
        const float L = cL[h];
        a.out[((size_t)r * a.nh + head0 + h) * D + i] = L > 0.0f ? v / L : 0.0f;
    }
    cl.sync();
}

/* EARLY (one row over BF16 pages, TERN_CUDA_AD_EARLY): the first keys' K/V load before pdl_wait, the row
 * of key pos again after it. A template argument, not a flag: one-row branches in the kernel moved its
 * registers and cost llama3-8b q4 b1 320 -> 300 tok/s (H200, session 14, NOTES (w)) */
/* LEAN (one row over BF16 pages with EARLY, TERN_CUDA_AD_LEAN, session 18, untimed): key groups past the split
 * skipped warp-uniformly in both walks (a 32-key split fills 2 of a warp's U = 4 groups; their zero rows were
 * scored and summed), and the cluster merge stages the ranks' (M, L) before the per-head weights (one dependent
 * DSMEM load after another was ~18 % of the stall samples at 512 keys, NOTES (aa)). The same arithmetic, so the
 * same bits */
template <typename T, int EPL, int GM, bool EARLY, bool LEAN = false>
__global__ void __launch_bounds__(32 * AD_WARPS, 2) attn_dec_kernel(AdArgs a) {
    pdl_trigger();
    if (!EARLY) pdl_wait(); /* EARLY: see below, after the first loads */
    /* key groups per warp and iteration (as many more in flight): 16-bit rows take half the registers */
    constexpr int U = sizeof(T) == 2 ? (EPL == 16 ? 1 : GM * EPL >= 64 ? 2 : 4) : (EPL == 16 || GM * EPL >= 64 ? 1 : 2);
    extern __shared__ float smd[];           /* [region][chmax ints]: region = scores [GM][chmax], then
                                                [8 warps][GM][D], then the merge's (M, L) */
    __shared__ float sml[GM][2];
    const int D = a.D, LPK = D / EPL, KPW = 32 / LPK, KPB = AD_WARPS * KPW, STEP = KPB * U;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kg = lane / LPK, li = lane % LPK;
    const int g = blockIdx.x / a.hs, hb0 = (blockIdx.x % a.hs) * a.GB, z = blockIdx.y, r = blockIdx.z;
    const int G = min(a.GB, a.G - hb0);          /* this block's heads: head0 .. head0 + G - 1 */
    const size_t head0 = (size_t)g * a.G + hb0;
    const int pos = a.pos[r];
    const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
    const int len = pos >= 0 ? pos - lo + 1 : 0;
    const int chunk = max(a.chmin, (len + a.splits - 1) / a.splits);
    const int nact = len > 0 ? (len + chunk - 1) / chunk : 1;
    const bool live = z < nact;
    if (!live && a.cl <= 1) return;
    /* a cluster's blocks past the live splits stay for the merge: no keys, (M, L) = (-inf, 0), sums 0 */
    const int k0 = live ? lo + z * chunk : lo + len, k1 = live ? min(lo + len, k0 + chunk) : k0, nk = k1 - k0;
    const unsigned kvs = (unsigned)(a.nkv * D); /* elements a token (mul_wide: rec >= 0 where loaded) */
    const T *kp = (const T *)a.kp + (size_t)g * D + li * EPL, *vp = (const T *)a.vp + (size_t)g * D + li * EPL;
    float *s = smd;
    int *recs = (int *)(smd + a.region); /* record (token slot in the pool) of each key, -1 if not resident */
    ad_records(recs, a, ad_btrow(a, r), k0, nk);
    float q[GM][EPL];
    auto load_q = [&]() {
#pragma unroll
        for (int h = 0; h < GM; h++) {
            if (h < G) {
                const float *qp = a.q + ((size_t)r * a.nh + head0 + h) * D + li * EPL;
#pragma unroll
                for (int e = 0; e < EPL; e += 4) {
                    const float4 v = __ldg((const float4 *)(qp + e));
                    q[h][e] = v.x; q[h][e + 1] = v.y; q[h][e + 2] = v.z; q[h][e + 3] = v.w;
                }
            } else {
#pragma unroll
                for (int e = 0; e < EPL; e++) q[h][e] = 0.0f;
            }
        }
    };
    if (!EARLY) load_q();
    __syncthreads();
    /* U key groups' rows from `src` (K or V) into d, record -1 (not resident or past the split) zeroed */
    auto load = [&](const T *src, int base, AdRow<T, EPL> *d, int *rc) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = base + u * KPB + kg - k0;
            rc[u] = i < nk ? recs[i] : -1;
            if (rc[u] >= 0) ad_load<T, EPL>(d[u], src + mul_wide(rc[u], kvs));
            else ad_zero<T, EPL>(d[u]);
        }
    };
    const int b0 = k0 + warp * KPW; /* this warp's first key group; warp-uniform bounds (shuffles) */

    /* 1. scores, the next U key groups loading while these are scored. When the warp's keys fit one
     * round (short splits: every split at a short context) there is no next round, so its V rows load
     * now into the next-round registers, which the loop's end moves into kr: one memory latency less */
    AdRow<T, EPL> kr[U], kn[U];
    int rr[U], rn[U];
    const bool one = a.vpre && b0 + STEP >= k1; /* warp-uniform */
    if (b0 < k1) load(kp, b0, kr, rr);
    if (one && b0 < k1) load(vp, b0, kn, rn);
    if (EARLY) {
        /* One row (AD_EARLY): pos, the block table and the pages of keys before pos were written before
         * this step (uploads, earlier graph launches), so those loads were issued above while the
         * previous kernel (the one that writes key pos and q) may still run; now wait for it, then take
         * q and the row of key pos again, through L2 (the stale copy may sit in this SM's L1) */
        pdl_wait();
        load_q();
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (b0 + u * KPB + kg != pos || b0 >= k1) continue;
            if (rr[u] >= 0) ad_load<T, EPL, true>(kr[u], kp + mul_wide(rr[u], kvs));
            if (one && rn[u] >= 0) ad_load<T, EPL, true>(kn[u], vp + mul_wide(rn[u], kvs));
        }
    }
    for (int base = b0; base < k1; base += STEP) {
        if (base + STEP < k1) load(kp, base + STEP, kn, rn);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (LEAN && base + u * KPB >= k1) break; /* warp-uniform: no key of this group is in the split */
            const int k = base + u * KPB + kg;
#pragma unroll
            for (int h = 0; h < GM; h++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < EPL; e++) d = fmaf(q[h][e], ad_get<T, EPL>(kr[u], e), d);
                for (int o = LPK >> 1; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                if (li == 0 && h < G && k < k1) {
                    float v = d * a.scale;
                    if (a.softcap > 0.0f) v = a.softcap * tanhf(v / a.softcap);
                    s[h * a.chmax + (k - k0)] = rr[u] >= 0 ? v : -INFINITY;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            rr[u] = rn[u];
            kr[u] = kn[u];
        }
    }
    /* the first V rows load during the softmax (one round: already in kr) */
    if (!one && b0 < k1) load(vp, b0, kr, rr);
    __syncthreads();

    /* 2. softmax of each head (a warp per head; G <= 8) */
    if (warp < G) { /* each head's softmax over its scores, by one warp */
        float *sh = s + warp * a.chmax;
        float m = -INFINITY;
        for (int i = lane; i < nk; i += 32) m = fmaxf(m, sh[i]);
        m = warp_max(m);
        float l = 0.0f;
        for (int i = lane; i < nk; i += 32) {
            const float p = m == -INFINITY ? 0.0f : expf(sh[i] - m);
            sh[i] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) { sml[warp][0] = m; sml[warp][1] = l; }
    }
    __syncthreads();

    /* 3. P·V (same walk over V rows; kr/rr hold the first group) */
    float acc[GM][EPL];
#pragma unroll
    for (int h = 0; h < GM; h++)
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[h][e] = 0.0f;
    for (int base = b0; base < k1; base += STEP) {
        if (base + STEP < k1) load(vp, base + STEP, kn, rn);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (LEAN && base + u * KPB >= k1) break; /* warp-uniform, as in the scores */
            if (rr[u] < 0) continue; /* not resident or past the split: p = 0 */
            const int k = base + u * KPB + kg;
#pragma unroll
            for (int h = 0; h < GM; h++) {
                if (h >= G) break;
                const float p = s[h * a.chmax + (k - k0)];
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[h][e] = fmaf(p, ad_get<T, EPL>(kr[u], e), acc[h][e]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            rr[u] = rn[u];
            kr[u] = kn[u];
        }
    }
    for (int o = LPK; o < 32; o <<= 1)
#pragma unroll
        for (int h = 0; h < GM; h++)
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], o);
    __syncthreads(); /* the scores are dead: the region takes the warps' sums */
    float *red = smd;
    if (kg == 0)
#pragma unroll
        for (int h = 0; h < GM; h++) {
            if (h >= G) break;
#pragma unroll
            for (int e = 0; e < EPL; e++) red[((size_t)warp * GM + h) * D + li * EPL + e] = acc[h][e];
        }
    __syncthreads();
    if (a.cl > 1) { /* the cluster's splits merge through distributed shared memory */
        ad_cluster_merge<GM, LEAN>(a, red, sml, r, head0, G, D);
        return;
    }
    const size_t nrow = (size_t)a.n * a.nh, mlo = (size_t)a.splits * nrow * D;
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int h = idx / D, i = idx % D;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < AD_WARPS; w++) v += red[((size_t)w * GM + h) * D + i];
        const size_t rh = (size_t)r * a.nh + head0 + h;
        if (nact == 1) {
            a.out[rh * D + i] = sml[h][1] > 0.0f ? v / sml[h][1] : 0.0f;
        } else {
            a.part[((size_t)z * nrow + rh) * D + i] = v;
            if (i == 0) {
                a.part[mlo + ((size_t)z * nrow + rh) * 2] = sml[h][0];
                a.part[mlo + ((size_t)z * nrow + rh) * 2 + 1] = sml[h][1];
            }
        }
    }
    if (nact == 1) return;
    /* the last split block of (r, g) merges, in split order (the scores region is free again) */
    ad_last_merge<GM>(a, a.cnt + (size_t)r * gridDim.x + blockIdx.x, r, head0, G, D, nact, nrow, mlo, smd, sml);
}

#define AD_SMEM_MAX (160 << 10)
#define AD_CHCAP 1024 /* longest split (shared memory: more blocks per SM) */

/* dynamic shared memory a launch may ask for (the attribute set at open) */
static size_t ad_smem_lim(const tern__cuda *c) {
    return c->smem_optin - 1024 < AD_SMEM_MAX ? c->smem_optin - 1024 : AD_SMEM_MAX;
}

/* EARLY is built for BF16 pages only (the bf16 compute path's kind; f32 pages are the parity path): seven
 * (EPL, GM) shapes × three page kinds, and seven EARLY ones */
template <typename T, bool M, bool L = false> static void ad_attr(int smem) {
#define AD_A(E, G)                                                                                           \
    cudaFuncSetAttribute(attn_dec_kernel<T, E, G, M, L>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); \
    cudaFuncSetAttribute(attn_dec_kernel<T, E, G, M, L>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)
    AD_A(8, 1); AD_A(8, 2); AD_A(8, 4); AD_A(8, 8); AD_A(16, 1); AD_A(16, 2); AD_A(16, 4);
#undef AD_A
}

/* at open (attention.cu's init): the counters and the shared-memory limits */
extern "C" void tern__cuda_attn_decode_init(tern__cuda *c) {
    if (!c->ad_cnt && cudaMalloc((void **)&c->ad_cnt, AD_CNT * sizeof(int)) == cudaSuccess)
        cudaMemsetAsync(c->ad_cnt, 0, AD_CNT * sizeof(int), c->stream);
    const int lim = (int)ad_smem_lim(c);
    ad_attr<float, false>(lim);
    ad_attr<__nv_bfloat16, false>(lim);
    ad_attr<__half, false>(lim);
    ad_attr<__nv_bfloat16, true>(lim);
    ad_attr<__nv_bfloat16, true, true>(lim);
    cudaGetLastError();
    tern__cuda_attn_decode_tc_init(c);
    tern__cuda_attn_decode_r1_init(c);
}

/* a.cl > 1: as a cluster of the a.cl splits; when that launch is refused (no room for the cluster), the
 * same splits merged through global partials instead (the same bits) */
template <typename T, bool M, bool L = false> static void ad_go(tern__cuda *c, dim3 grid, size_t smem, int E, int GM, AdArgs a) {
    void (*k)(AdArgs) = nullptr;
#define AD_K(EE, GG) if (E == EE && GM == GG) k = attn_dec_kernel<T, EE, GG, M, L>
    AD_K(8, 1); AD_K(8, 2); AD_K(8, 4); AD_K(8, 8); AD_K(16, 1); AD_K(16, 2); AD_K(16, 4);
#undef AD_K
    if (a.cl > 1) {
        if (tern_launch_cluster(c->stream, k, grid, dim3(32 * AD_WARPS), smem, a.cl, a) == cudaSuccess) {
            tern__cuda_attn_decode_cluster_calls++;
            return;
        }
        cudaGetLastError();
        a.cl = 0;
    }
    tern_launch(c->stream, k, grid, 32 * AD_WARPS, smem, a);
}

/* the launch fields every decode kernel reads, from the op's arguments (G = nh / nkv, one block a kv head: hs 1, GB G;
 * the plan's fields are the caller's) */
static void ad_args_fill(AdArgs *a, tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                         const tern_kv_layer *kv, float scale, float softcap) {
    a->out = out;
    a->part = c->part;
    a->q = q;
    a->kp = kv->k;
    a->vp = kv->v;
    a->pos = rows->pos;
    a->slot = rows->slot;
    a->bt = kv->block_table;
    a->cnt = c->ad_cnt;
    a->n = rows->n;
    a->nh = nh;
    a->nkv = kv->n_head_kv;
    a->G = nh / kv->n_head_kv;
    a->hs = 1;
    a->GB = a->G;
    a->D = kv->head_dim;
    a->max_blocks = kv->max_blocks;
    a->bs = kv->block_size;
    tern__cuda_divisor(a->bs, &a->bmul, &a->bshift);
    a->window = kv->window;
    a->scale = scale;
    a->softcap = softcap;
}

/* a long-context step (ops.h tern_rows_long) on a layer that sees that many keys: the split tensor-core kernel's class */
static bool ad_long(const tern_rows *rows, const tern_kv_layer *kv) {
    return ad_tcs() == 1 && tern_rows_long(rows->pos_host, rows->n) && (kv->window <= 0 || kv->window >= tern_long_keys());
}

/* the unsplit tensor-core launch of t: every output goes through ad_warp_merge, so it goes out in bf16 (the o GEMM's
 * staged input) when out is the attention output attention_o announced; 1 when it ran */
static int ad_tc_unsplit(tern__cuda *c, AdArgs t, float *out, int kind) {
    t.outb = out == c->att_f32 && t.n == c->att_n ? (__nv_bfloat16 *)c->gemm_scratch : NULL;
    t.outq = c->att_q4s;
    if (!tern__cuda_attn_decode_tc(c, t, kind)) return 0;
    c->att_bf16_done = t.outb != NULL;
    tern__cuda_attn_decode_calls++;
    return 1;
}

/* over f32 (kind TERN_KV_F32) or BF16/F16 pages (K and V of that one kind): 1 when it ran */
static int attn_decode_run(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                        const tern_kv_layer *kv, float scale, float softcap, int kind) {
    const int n = rows->n, d = kv->head_dim, nkv = kv->n_head_kv;
    if (!c->ad_cnt || n <= 0 || (rows->vis_lo && rows->vis_hi) || nkv <= 0 || nh % nkv) return 0;
    const int G = nh / nkv, E = d == 512 ? 16 : 8, gmax = d == 512 ? 4 : 8; /* GM * E <= 64: registers */
    long keys = tern__cuda_attn_max_keys(c, rows, kv);
    if (kv->window > 0 && keys > kv->window) keys = kv->window;
    static int tc512 = -1; /* TERN_CUDA_AD_TC512=0: these layers back on the kernels below */
    if (tc512 < 0) tc512 = tern__cuda_env_int("TERN_CUDA_AD_TC512", 1) != 0;
    if (d == 512 && (G <= 8 || (G % 8 == 0 && G <= 32)) && kind != TERN_KV_F32 && ad_tc() && tc512) {
        /* batch decode over Gemma 4's global layers: the tensor-core kernel, two blocks per (row, group of at most 8
         * heads of a kv head), where that launch fills the GPU as the unsplit D <= 256 one must (ad_tc_takes); one row
         * or a few stay below */
        const int hsg = G > 8 ? G / 8 : 1;
        if (ad_tc_takes(c, 2L * n * nkv * hsg, keys) || ad_tc() == 2) {
            AdArgs t = {};
            ad_args_fill(&t, c, out, q, rows, nh, kv, scale, softcap);
            t.hs = hsg;
            t.G = t.GB = G / hsg;
            if (ad_tc_unsplit(c, t, out, kind)) return 1;
        }
    }
    const bool early = n == 1 && kind == TERN_KV_BF16 && ad_early();
    if (d == 512 && (G <= 8 || (G % 8 == 0 && G <= 32)) && kind != TERN_KV_F32 && n <= ad_tcs512_rows() && ad_tcs512() &&
        (ad_tcs512() == 2 || ad_long(rows, kv))) {
        /* a few rows over Gemma 4's global layers, split over the keys (TERN_CUDA_AD_TCS512): the walk's blocks (two a
         * group of at most 8 heads) times splits of >= tcs_ch keys fill about one block an SM */
        const int hsg = G > 8 ? G / 8 : 1;
        const long per = 2L * n * nkv * hsg, ch = ad_tcs_ch();
        long sp = (keys + ch - 1) / ch, cap = (c->n_sm > 0 ? c->n_sm : 132) / per;
        if (sp > cap) sp = cap;
        if (sp > TERN_CUDA_MERGE_MAX) sp = TERN_CUDA_MERGE_MAX;
        if (sp >= 2 && (size_t)sp * n * nh * (d + 2) <= TERN_CUDA_PART_FLOATS) {
            AdArgs t = {};
            ad_args_fill(&t, c, out, q, rows, nh, kv, scale, softcap);
            t.hs = hsg;
            t.G = t.GB = G / hsg;
            t.splits = (int)sp;
            t.chmin = (int)ch;
            if (tern__cuda_attn_decode_tc(c, t, kind, true, early && ad_tcs_early())) {
                tern__cuda_attn_decode_tcs512_calls++;
                tern__cuda_attn_decode_calls++;
                return 1;
            }
        }
    }
    if (ad_r1() && kind != TERN_KV_F32 && (d == 64 || d == 128 || d == 256 || (d == 512 && ad_r1_512())) && G <= 8 &&
        (ad_r1() == 2 || (ad_tc() < 2 && ad_tcs() < 2 && ad_1p() < 2 && n <= AD_CLROWS &&
                          !ad_long(rows, kv) && !ad_tc_takes(c, (long)n * nkv, keys)))) {
        AdArgs a = {};
        ad_args_fill(&a, c, out, q, rows, nh, kv, scale, softcap);
        if (tern__cuda_attn_decode_r1(c, a, kind, keys, early)) {
            tern__cuda_attn_decode_calls++;
            return 1;
        }
    }
    /* a larger group (Gemma 4's global layers: 8 or 16 heads per KV head at d 512) in hs blocks of at
     * most gmax heads each, every block reading the group's K/V (TERN_CUDA_AD_HSPLIT=0: off) */
    const int hs = G <= gmax ? 1 : ad_hsplit() ? (G + gmax - 1) / gmax : 0;
    if (!hs || (long)n * nkv * hs > AD_CNT) return 0;
    const int GB = (G + hs - 1) / hs, GM = GB <= 1 ? 1 : GB <= 2 ? 2 : GB <= 4 ? 4 : 8;
    if ((d != 32 && d != 64 && d != 128 && d != 256 && d != 512) || GM * E > 64 || ((uintptr_t)q & 15)) return 0;
    AdArgs a = {};
    /* about two blocks per SM (8 warps each), >= chmin keys per split, at most 128 splits, and
     * enough splits that a split's scores fit */
    const int chmin = ad_chmin();
    const int want = ad_want();
    int splits = tern__cuda_split_count(c, (long)n * nkv * hs, want > 2 ? want : 2, want, keys, chmin, 128, n, nh, d);
    const long need = (keys + AD_CHCAP - 1) / AD_CHCAP;
    if (splits < need) splits = (int)need;
    /* TERN_CUDA_AD_CLUSTER=N (2..16): up to 2N planned splits run as at most N, one cluster */
    const int clmax = ad_cluster();
    int cl = 0;
    if (clmax > 1 && n <= AD_CLROWS && splits > 1 && splits <= 2 * clmax && (keys + clmax - 1) / clmax <= AD_CHCAP) {
        if (splits > clmax) splits = clmax;
        cl = splits;
    }
    if (splits > 128 || (splits > 1 && (size_t)splits * n * nh * (d + 2) > TERN_CUDA_PART_FLOATS)) return 0;
    const long ch = (keys + splits - 1) / splits;
    a.chmax = (int)(ch > chmin ? ch : chmin);
    a.chmin = chmin;
    static int vpre = -1;
    if (vpre < 0) vpre = tern__cuda_env_int("TERN_CUDA_AD_VPRE", 1) != 0;
    a.vpre = vpre;
    a.cl = cl;
    size_t region = (size_t)GM * a.chmax;
    if (region < (size_t)AD_WARPS * GM * d) region = (size_t)AD_WARPS * GM * d;
    if (region < (size_t)2 * 128 * GM) region = (size_t)2 * 128 * GM;
    a.region = (int)region;
    const size_t smem = (region + a.chmax) * sizeof(float);
    if (smem > ad_smem_lim(c)) return 0;
    ad_args_fill(&a, c, out, q, rows, nh, kv, scale, softcap);
    a.hs = hs;
    a.GB = GB;
    a.splits = splits;
    /* batch decode whose pairs fill the GPU (2: any launch, tests): the one-pass kernels, tensor cores first */
    const long pairs = (long)n * nkv;
    const bool lng = ad_long(rows, kv);
    if (hs == 1 && d != 512 && (ad_tcs() == 2 || (lng && !ad_tc_takes(c, pairs, keys)))) {
        /* split over the keys: ~2 blocks per SM, each over >= tcs_ch keys, at most 128 splits (D 512: TCS512 above, whose
         * blocks are two a pair and one an SM) */
        const long ch = ad_tcs_ch(), cap = ad_two_per_sm(c) / pairs;
        long sp = (keys + ch - 1) / ch;
        if (sp > cap) sp = cap;
        if (sp > 128) sp = 128;
        AdArgs b = a;
        b.splits = (int)sp;
        b.chmin = (int)ch;
        if (sp >= 2 && (size_t)sp * n * nh * (d + 2) <= TERN_CUDA_PART_FLOATS &&
            tern__cuda_attn_decode_tc(c, b, kind, true, early && ad_tcs_early())) {
            tern__cuda_attn_decode_calls++;
            return 1;
        }
    }
    if (hs == 1 && ad_tc() && (ad_tc_takes(c, pairs, keys) || ad_tc() == 2) && ad_tc_unsplit(c, a, out, kind)) return 1;
    if (hs == 1 && ad_1p() && (pairs >= 2L * c->n_sm || ad_1p() == 2) && tern__cuda_attn_decode_1p(c, a, kind)) {
        tern__cuda_attn_decode_calls++;
        return 1;
    }
    cudaSetDevice(c->device);
    const dim3 grid((unsigned)(nkv * hs), (unsigned)splits, (unsigned)n);
    if (early && ad_lean()) ad_go<__nv_bfloat16, true, true>(c, grid, smem, E, GM, a);
    else if (early) ad_go<__nv_bfloat16, true>(c, grid, smem, E, GM, a);
    else if (kind == TERN_KV_BF16) ad_go<__nv_bfloat16, false>(c, grid, smem, E, GM, a);
    else if (kind == TERN_KV_F16) ad_go<__half, false>(c, grid, smem, E, GM, a);
    else ad_go<float, false>(c, grid, smem, E, GM, a);
    tern__cuda_check(c, "attention decode");
    tern__cuda_attn_decode_calls++;
    return 1;
}

/* cuda_internal.h. The same choice as attn_decode_run's (the unsplit tensor-core kernel: AD_TC takes the pairs and the
 * long-context split does not), and the fields that kernel reads, filled as there */
extern "C" unsigned long long tern__cuda_attn_decode_rope_calls; /* launches with the rope folded in (tests) */
unsigned long long tern__cuda_attn_decode_rope_calls = 0;
extern "C" int tern__cuda_attn_decode_rope(tern__cuda *c, float *out, const tern_rows *rows, int nh,
                                           const tern_kv_layer *kv, float scale, float softcap, const float *src, int ld,
                                           const float *inv_freq, float mscale) {
    const int kind = kv->kf.kind, n = rows->n, nkv = kv->n_head_kv;
    if (!ad_mode() || !ad_tc() || ad_tcs() == 2 || kind != kv->vf.kind || (kind != TERN_KV_BF16 && kind != TERN_KV_F16))
        return 0;
    if (n <= 0 || (rows->vis_lo && rows->vis_hi) || nkv <= 0 || nh % nkv || nh / nkv > 8 || !rows->slot_host ||
        !tern__cuda_attn_is_decode(c, rows) || tern_slot_seqs(rows->slot_host, n) != n)
        return 0;
    long keys = tern__cuda_attn_max_keys(c, rows, kv);
    if (kv->window > 0 && keys > kv->window) keys = kv->window;
    const bool takes = ad_tc_takes(c, (long)n * nkv, keys);
    if ((ad_long(rows, kv) && !takes) || !(takes || ad_tc() == 2)) return 0;
    AdArgs a = {};
    ad_args_fill(&a, c, out, NULL, rows, nh, kv, scale, softcap);
    a.outb = out == c->att_f32 && n == c->att_n ? (__nv_bfloat16 *)c->gemm_scratch : NULL;
    a.outq = c->att_q4s;
    a.rsrc = src;
    a.rld = ld;
    a.rinv = inv_freq;
    a.rmscale = mscale;
    if (!tern__cuda_attn_decode_tc_rope(c, a, kind)) return 0;
    c->att_bf16_done = a.outb != NULL;
    tern__cuda_attn_decode_calls++;
    tern__cuda_attn_decode_rope_calls++;
    return 1;
}

/* BF16 / F16 pages (K and V of one kind), decode rows: 1 when it ran */
extern "C" int tern__cuda_attn_decode_q(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                                        const tern_kv_layer *kv, float scale, float softcap) {
    const int kind = kv->kf.kind;
    if (!ad_mode() || kind != kv->vf.kind || (kind != TERN_KV_BF16 && kind != TERN_KV_F16)) return 0;
    return attn_decode_run(c, out, q, rows, nh, kv, scale, softcap, kind);
}

/* rope_kv_write folded into the one-row kernel (TERN_CUDA_AD_ROPE, ops.h rope_kv_attention, session 13:
 * every block roped its q heads in registers, the split holding pos roped k and stored key pos's rows) lost
 * and was removed (H200, session 14, NOTES (w)): llama3-8b b1 q4 322 -> 296, bf16 218 -> 203 tok/s */

/* f32 pages, decode rows without spans: 1 when it ran, 0 when the shape is not served here */
extern "C" int tern__cuda_attn_decode(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                                      const tern_kv_layer *kv, float scale, float softcap) {
    return ad_mode() && attn_decode_run(c, out, q, rows, nh, kv, scale, softcap, TERN_KV_F32);
}

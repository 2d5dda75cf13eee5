/*
 * attn_decode_px.cu — one decode row over BF16 pages as one thread-block cluster per KV head that exchanges
 * probabilities instead of outputs (TERN_CUDA_AD_PX).
 *
 * Why: the split kernel (attn_decode.cu) spends a one-row launch on fixed costs, not bytes — 16 splits of 8 warps,
 * each over ~32 keys at 512, then a merge of the splits' D-wide outputs through distributed shared memory behind
 * three cluster barriers (ncu, H200, gemma4-e4b b1, D 256: 20 µs at base clocks for 1 MB of K/V; a third of the
 * warp samples in the merge and its barriers, NOTES (as)). Here the S blocks of a KV head's cluster split the work
 * twice:
 *   1. scores by keys: block b scores its ch = ceil(len / S) keys for the group's G heads (the split kernel's key
 *      groups: LPK lanes a K row, EPL elements a lane, U groups a round), then per head its own softmax pieces
 *      p = e^{s - m_b}, l_b = Σ p, in its shared memory;
 *   2. one cluster barrier; every block reads all blocks' (m_b, l_b), forms M = max m_b, c_b = e^{m_b - M},
 *      L = Σ l_b·c_b (ad_split_weights: split order), and copies the probabilities p·c_b of a chunk of up to KC
 *      keys from the cluster into its own shared memory;
 *   3. P·V by dimensions: block b owns Ds = D / S dimensions of every head of the group and sums p·v over all the
 *      row's keys for them — thread (dp, ks) a pair of dimensions and every KS-th key, V read as 32-bit pairs
 *      (8 or 16 threads read one key's 32 or 64 contiguous bytes), then shuffles over the key slices of a warp and
 *      the 8 warps in shared memory in warp order; out = Σ / L. No output merge: each output has one owner.
 * The pre-wait part (griddepcontrol) issues the block-table lookups, the first round of K rows and the first VR V
 * pairs of every thread — none of them written by the kernel before (the key of position pos is; it is loaded
 * again through L2 after the wait, as attn_decode.cu's EARLY does). A block's shared memory lives until the
 * cluster's last block has copied from it (arrive after the copies, wait before the exit).
 * Shapes: D 64 / 128 / 256 (S = D / 16: 4, 8, 16 blocks) and 512 (S 16, Ds 32); G <= 8 (<= 4 at D 512); keys of
 * the launch's bound <= TERN_CUDA_AD_PX_KEYS (default 4096: a short-class step's rows, ops.h tern_rows_long).
 * TERN_CUDA_AD_PX_S=8 caps a cluster at 8 blocks (32 dimensions a block at D 128 / 256). f32 math with expf /
 * tanhf; the sums run in another order than the split kernel's (other bits, op test cuda_attention_decode_px within
 * 1e-5 of the CPU). Opt-in: the first form (one block an SM, 130-174 registers) lost 8-17 % of b1 on the H200
 * (NOTES (as)); this one runs two blocks an SM, untimed.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/attn_decode.cuh"

#include <cooperative_groups.h>
#include <math.h>

namespace cg = cooperative_groups;

#define PX_WARPS 8
#define PX_VR 8   /* V pairs a thread loads before the wait (and per batch after it) */
#define PX_KC 1024 /* keys whose probabilities a block holds at once (the P·V chunk) */
#define PX_SMAX 16 /* blocks per cluster (16: the non-portable size, allowed at init) */

/* TERN_CUDA_AD_PX_S (read once; 4..16, default 16): the most blocks a cluster; below D / 16 a block takes 32
 * dimensions (D / 32 blocks). -1 until read (tests set it) */
extern "C" int tern__cuda_ad_px_s;
int tern__cuda_ad_px_s = -1;
extern "C" unsigned long long tern__cuda_attn_decode_px_calls; /* launches (tests) */
unsigned long long tern__cuda_attn_decode_px_calls = 0;

__device__ __forceinline__ void px_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void px_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

/* Shared memory (dynamic, floats): pl [GM][chs] this block's probabilities, pc [GM][KC'] the chunk's scaled ones
 * (KC' = min(KC, chs·S)), red [8][GM][Ds] the warps' sums. NDP = Ds / 2 dimension pairs a block. */
template <int EPL, int GM, int NDP>
__global__ void __launch_bounds__(32 * PX_WARPS, 2) attn_dec_px_kernel(AdArgs a) {
    pdl_trigger();
    using T = __nv_bfloat16;
    constexpr int PX_U = EPL == 16 ? 2 : 4; /* key groups a warp loads per round of the scores (registers: 2 at D 512) */
    constexpr int KS = 32 * PX_WARPS / NDP, DS = 2 * NDP; /* key slices; dimensions a block */
    extern __shared__ float pxs[];
    __shared__ float sml[GM][2];             /* this block's (m_b, l_b) per head (read by the cluster) */
    __shared__ float cw[PX_SMAX][GM], sL[GM]; /* the blocks' weights c_b and L per head */
    cg::cluster_group cl = cg::this_cluster();
    const int S = (int)cl.num_blocks(), b = (int)cl.block_rank();
    const int D = a.D, G = a.G, LPK = D / EPL, KPW = 32 / LPK, KPB = PX_WARPS * KPW;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kg = lane / LPK, li = lane % LPK;
    const int g = blockIdx.x;
    const size_t head0 = (size_t)g * G, kvs = (size_t)a.nkv * D;
    const int chs = a.chmax, kcap = a.chmin; /* pl's keys a head, pc's keys a head */
    float *pl = pxs, *pc = pxs + GM * chs, *red = pc + GM * kcap;
    const int pos = a.pos[0];
    const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
    const int len = pos >= 0 ? pos - lo + 1 : 0;
    const int ch = len > 0 ? (len + S - 1) / S : 0;
    if (ch > a.chmax) { /* the row is longer than the launch's bound (never planned so): NaN out, no barrier */
        for (int idx = threadIdx.x; idx < G * DS; idx += blockDim.x)
            a.out[(head0 + idx / DS) * D + b * DS + idx % DS] = __int_as_float(0x7fc00000);
        return;
    }
    const int k0 = lo + b * ch, k1 = min(lo + len, k0 + ch); /* this block's keys (none when k0 >= k1) */
    const int32_t *btrow = ad_btrow(a, 0);
    const T *kp = (const T *)a.kp + (size_t)g * D + li * EPL;
    /* V: thread (dp, ks) reads dimensions b·Ds + 2·dp, + 1 of keys lo + ks, lo + ks + KS, ... */
    const int dp = threadIdx.x % NDP, ks = threadIdx.x / NDP;
    const uint32_t *vpp = (const uint32_t *)((const T *)a.vp + (size_t)g * D + b * DS + 2 * dp);
    const size_t vs = kvs / 2; /* 32-bit words a pool record */

    /* before the wait: the first round of K rows, the first VR V pairs */
    AdRow<T, EPL> kr[PX_U];
    int rk[PX_U];
    const int b0 = k0 + warp * KPW + kg;
#pragma unroll
    for (int u = 0; u < PX_U; u++) {
        const int k = b0 + u * KPB;
        rk[u] = k < k1 ? ad_rec(a, btrow, k) : -1;
        if (rk[u] >= 0) ad_load<T, EPL>(kr[u], kp + (size_t)rk[u] * kvs);
        else ad_zero<T, EPL>(kr[u]);
    }
    uint32_t vr[PX_VR];
    int rv[PX_VR];
#pragma unroll
    for (int m = 0; m < PX_VR; m++) {
        const int i = ks + m * KS; /* key lo + i */
        rv[m] = i < len ? ad_rec(a, btrow, lo + i) : -1;
        vr[m] = rv[m] >= 0 ? __ldg(vpp + (size_t)rv[m] * vs) : 0u;
    }
    pdl_wait();
    /* key pos was written by the previous kernel: its rows again, through L2 */
#pragma unroll
    for (int u = 0; u < PX_U; u++)
        if (b0 + u * KPB == pos && rk[u] >= 0) ad_load<T, EPL, true>(kr[u], kp + (size_t)rk[u] * kvs);
#pragma unroll
    for (int m = 0; m < PX_VR; m++)
        if (lo + ks + m * KS == pos && rv[m] >= 0) vr[m] = __ldcg(vpp + (size_t)rv[m] * vs);
    float q[GM][EPL];
#pragma unroll
    for (int h = 0; h < GM; h++) {
        const float *qp = a.q + (head0 + h) * D + li * EPL;
#pragma unroll
        for (int e = 0; e < EPL; e += 4) {
            const float4 v = h < G ? __ldg((const float4 *)(qp + e)) : make_float4(0.f, 0.f, 0.f, 0.f);
            q[h][e] = v.x; q[h][e + 1] = v.y; q[h][e + 2] = v.z; q[h][e + 3] = v.w;
        }
    }

    /* 1. this block's scores into pl, a round of U key groups at a time (later rounds load after the wait) */
    for (int base = b0;; base += PX_U * KPB) {
#pragma unroll
        for (int u = 0; u < PX_U; u++) {
            const int k = base + u * KPB;
            if (k - kg >= k1) break; /* warp-uniform: no key of this group is in the block */
#pragma unroll
            for (int h = 0; h < GM; h++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < EPL; e++) d = fmaf(q[h][e], ad_get<T, EPL>(kr[u], e), d);
                for (int o = LPK >> 1; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                if (li == 0 && h < G && k < k1) {
                    float v = d * a.scale;
                    if (a.softcap > 0.0f) v = a.softcap * tanhf(v / a.softcap);
                    pl[h * chs + (k - k0)] = rk[u] >= 0 ? v : -INFINITY;
                }
            }
        }
        const int nb = base + PX_U * KPB;
        if (nb - kg >= k1) break;
#pragma unroll
        for (int u = 0; u < PX_U; u++) { /* the next round (long rows): after the wait, through L2 */
            const int k = nb + u * KPB;
            rk[u] = k < k1 ? ad_rec(a, btrow, k) : -1;
            if (rk[u] >= 0) ad_load<T, EPL, true>(kr[u], kp + (size_t)rk[u] * kvs);
            else ad_zero<T, EPL>(kr[u]);
        }
    }
    __syncthreads();
    /* per head (a warp each): m_b, p = e^{s - m_b} in place, l_b */
    const int nk = max(0, k1 - k0);
    if (warp < G) ad_warp_softmax(pl + warp * chs, nk, lane, sml[warp]);
    cl.sync(); /* every block's pl and sml are written */

    /* 2. the blocks' weights per head, in block (split) order */
    if (threadIdx.x < G) {
        const int h = threadIdx.x;
        sL[h] = ad_split_weights(
            [&](int z) {
                const float *o = cl.map_shared_rank(&sml[0][0], z);
                return make_float2(o[2 * h], o[2 * h + 1]);
            },
            [&](int z, float c) { cw[z][h] = c; }, S);
    }
    __syncthreads();

    /* 3. P·V over chunks of up to kcap keys */
    float acc[GM][2];
#pragma unroll
    for (int h = 0; h < GM; h++) acc[h][0] = acc[h][1] = 0.0f;
    for (int c0 = 0; c0 < len; c0 += kcap) {
        const int kc = min(kcap, len - c0);
        if (c0) __syncthreads(); /* the previous chunk's reads of pc are done */
        for (int idx = threadIdx.x; idx < G * kc; idx += blockDim.x) {
            const int h = idx / kc, i = c0 + idx % kc, z = i / ch;
            pc[h * kcap + (i - c0)] = cl.map_shared_rank(pl, z)[h * chs + (i - z * ch)] * cw[z][h];
        }
        if (c0 + kc >= len) px_arrive(); /* the last copies out of the cluster's memory are done */
        __syncthreads();
        /* batches of VR keys a thread (kcap is a multiple of VR·KS keys or the whole bound, so a batch never
         * straddles two chunks); the first batch's pairs were loaded before the wait */
        for (int m0 = c0 / KS; m0 * KS < c0 + kc; m0 += PX_VR) {
            if (m0) {
#pragma unroll
                for (int m = 0; m < PX_VR; m++) {
                    const int i = ks + (m0 + m) * KS;
                    rv[m] = i < len ? ad_rec(a, btrow, lo + i) : -1;
                    vr[m] = rv[m] >= 0 ? __ldcg(vpp + (size_t)rv[m] * vs) : 0u;
                }
            }
#pragma unroll
            for (int m = 0; m < PX_VR; m++) {
                const int i = ks + (m0 + m) * KS;
                if (i >= c0 + kc || rv[m] < 0) continue; /* past the chunk, or not resident (p = 0) */
                const float v0 = __uint_as_float(vr[m] << 16), v1 = __uint_as_float(vr[m] & 0xffff0000u);
#pragma unroll
                for (int h = 0; h < GM; h++) {
                    if (h >= G) break;
                    const float p = pc[h * kcap + (i - c0)];
                    acc[h][0] = fmaf(p, v0, acc[h][0]);
                    acc[h][1] = fmaf(p, v1, acc[h][1]);
                }
            }
        }
    }
    if (len <= 0) px_arrive();
    /* the key slices of a warp (lanes dp + NDP·j), then the 8 warps in warp order */
    for (int o = NDP; o < 32; o <<= 1)
#pragma unroll
        for (int h = 0; h < GM; h++) {
            acc[h][0] += __shfl_xor_sync(0xffffffffu, acc[h][0], o);
            acc[h][1] += __shfl_xor_sync(0xffffffffu, acc[h][1], o);
        }
    if (lane < NDP)
#pragma unroll
        for (int h = 0; h < GM; h++) {
            red[(warp * GM + h) * DS + 2 * dp] = acc[h][0];
            red[(warp * GM + h) * DS + 2 * dp + 1] = acc[h][1];
        }
    __syncthreads();
    if (threadIdx.x < G * DS) {
        const int h = threadIdx.x / DS, i = threadIdx.x % DS;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < PX_WARPS; w++) v += red[(w * GM + h) * DS + i];
        const float L = sL[h];
        a.out[(head0 + h) * D + b * DS + i] = L > 0.0f ? v / L : 0.0f;
    }
    px_wait(); /* no block leaves while another may still copy from its memory */
}

template <int EPL, int GM, int NDP> static void px_attr(int smem) {
    cudaFuncSetAttribute(attn_dec_px_kernel<EPL, GM, NDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaFuncSetAttribute(attn_dec_px_kernel<EPL, GM, NDP>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}

/* at open (attn_decode.cu's init): the shared-memory and cluster-size attributes */
void tern__cuda_attn_decode_px_init(tern__cuda *c) {
    const int lim = (int)(c->smem_optin > 1024 ? c->smem_optin - 1024 : c->smem_optin);
    px_attr<8, 1, 8>(lim); px_attr<8, 2, 8>(lim); px_attr<8, 4, 8>(lim); px_attr<8, 8, 8>(lim);
    px_attr<8, 1, 16>(lim); px_attr<8, 2, 16>(lim); px_attr<8, 4, 16>(lim); px_attr<8, 8, 16>(lim);
    px_attr<16, 1, 16>(lim); px_attr<16, 2, 16>(lim); px_attr<16, 4, 16>(lim);
    cudaGetLastError();
}

/* TERN_CUDA_AD_PX_KEYS (read once): the longest key bound a launch may plan for */
static long px_keys_max(void) {
    static long v = -1;
    if (v < 0) {
        const long e = tern__cuda_env_int("TERN_CUDA_AD_PX_KEYS", 4096);
        v = e < 16 ? 16 : e > 65536 ? 65536 : e;
    }
    return v;
}

/* attn_decode.cuh. One row (a.n == 1) over BF16 pages, a.G heads a KV head (no head split), keys <= `keys` at any
 * replay: 1 when it ran, 0 when the shape is not served or the cluster could not be launched (nothing ran) */
int tern__cuda_attn_decode_px(tern__cuda *c, const AdArgs &a0, long keys) {
    const int D = a0.D, G = a0.G;
    if (a0.n != 1 || a0.hs != 1 || G < 1 || G > 8 || (D == 512 && G > 4) || keys < 1 || keys > px_keys_max()) return 0;
    if (D != 64 && D != 128 && D != 256 && D != 512) return 0;
    /* S blocks a cluster: Ds = D / S dimensions a block, 16 (32 at D 512, or where TERN_CUDA_AD_PX_S caps S) */
    if (tern__cuda_ad_px_s < 0) {
        const int v = tern__cuda_env_int("TERN_CUDA_AD_PX_S", PX_SMAX);
        tern__cuda_ad_px_s = v < 4 ? 4 : v > PX_SMAX ? PX_SMAX : v;
    }
    int S = D == 512 ? 16 : D / 16;
    if (S > tern__cuda_ad_px_s) S = D / 32;
    const int E = D == 512 ? 16 : 8, GM = G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : 8, NDP = D / S / 2;
    AdArgs a = a0;
    a.chmax = (int)((keys + S - 1) / S);                 /* pl's keys a head */
    a.chmin = (int)(keys < PX_KC ? keys : PX_KC);        /* pc's keys a head */
    const size_t smem = ((size_t)GM * a.chmax + (size_t)GM * a.chmin + (size_t)PX_WARPS * GM * 2 * NDP) * sizeof(float);
    if (smem + 1024 > c->smem_optin) return 0;
    void (*k)(AdArgs) = nullptr;
#define PX_K(EE, GG, NN) if (E == EE && GM == GG && NDP == NN) k = attn_dec_px_kernel<EE, GG, NN>
    PX_K(8, 1, 8); PX_K(8, 2, 8); PX_K(8, 4, 8); PX_K(8, 8, 8); PX_K(8, 1, 16); PX_K(8, 2, 16); PX_K(8, 4, 16);
    PX_K(8, 8, 16); PX_K(16, 1, 16); PX_K(16, 2, 16); PX_K(16, 4, 16);
#undef PX_K
    if (!k) return 0;
    cudaSetDevice(c->device);
    if (tern_launch_cluster(c->stream, k, dim3((unsigned)a.nkv, (unsigned)S), dim3(32 * PX_WARPS), smem, S, a) !=
        cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    tern__cuda_attn_decode_px_calls++;
    return 1;
}

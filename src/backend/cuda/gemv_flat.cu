/*
 * gemv_flat.cu — the Q4 one-row GEMV of the plain bf16 mode without a staged x table and without a
 * walk (opt-in, TERN_CUDA_GEMV_FLAT; written in session 12 without a GPU).
 *
 * Why (bench/NOTES.md (u)): gemv_mma.cu's walk streams at 2.3–2.5 TB/s even with its math knocked
 * out; its x table (a prologue and a barrier per block) is why a block walks many row blocks with 128
 * registers and 16 warps per SM, while session 3's probe of the same load pattern with few registers
 * and many warps reached 2.8–3.8 TB/s. Here a warp is one 16-row tile × one chunk of S steps (a K
 * slice), blocks of 4 warps are independent (no shared memory, no barrier) and the B fragments come
 * from x itself: a lane feeds one column of the chunk's tile (XP1's layout: column = step·GPS +
 * group), so it builds the 16 bf16 pairs of its one step from its 32 inputs (8 float4 loads, L1/L2
 * hits) and gives zeros for the other steps. Σx per column is summed in mm_stage's tree order and
 * moved to the lanes that fold it with a shuffle. Partials per chunk go to c->part; the last warp of
 * a row tile (a counter per tile) sums them in slice order. With TERN_MM_J=1 this is the same
 * arithmetic in the same order as the XP1 walk, so the same bits (op test cuda_gemv_flat).
 * Serves plain, q|k|v, act(gate)·up and y += W·x; not the pre-norm (norm_matmul's xn: every warp would
 * need the row's norm), which stays on the walk.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/gemv_mma_args.cuh"

#define FL_WARPS 4

template <int GB, bool F16S> __global__ void __launch_bounds__(128, 6) gemv_flat_kernel(MmArgs a) {
    pdl_trigger();
    constexpr int S = GB == 16 ? 2 : 4; /* steps per chunk, as gemv_mma_kernel's */
    constexpr int GPS = 64 / GB;        /* groups per step */
    constexpr int NC = S * GPS;         /* live columns of the chunk's tile (8, or 4 at g128) */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    const int tiles = pair ? (a.rows + 7) / 8 : (a.rows + 15) / 16, tile = blockIdx.x * FL_WARPS + warp;
    if (tile >= tiles) return; /* whole warps only: no barrier below */
    const int nst = a.in / 128, ch = blockIdx.y, st0 = ch * S, nsc = min(S, nst - st0);
    const size_t rb = (size_t)a.in / 2;

    MmRows r;
    mm_rows(a, tile, g, t, rb, pair, r);
    uint4 w0[S], w1[S];
#pragma unroll
    for (int sl = 0; sl < S; sl++)
        if (sl < nsc) {
            w0[sl] = mm_ld4(r.w0 + (size_t)(st0 + sl) * 64);
            w1[sl] = mm_ld4(r.w1 + (size_t)(st0 + sl) * 64);
        }
    uint32_t q[4];
    mm_pair_scales(r, st0 * GPS, t, NC, a.ng, q);
    pdl_wait(); /* x, y, the partials and the counters: after the previous kernel */

    /* this lane's column of the tile is g; it belongs to step sg of the chunk when the lane's bytes
     * (t) hold that step's group g % GPS (GPS = 1: every t) */
    const int sg = g / GPS, gt = GPS == 1 ? 0 : t * 16 / GB;
    const bool feeds = g < NC && (GPS == 1 || g % GPS == gt) && sg < nsc;
    uint32_t bb[8][2];
    float e = 0.0f; /* Σx of this lane's 32 inputs in mm_stage's order (float4 sums, then a pair tree) */
    {
        float4 v[8];
        const float *xp = a.x + (size_t)(st0 + (feeds ? sg : 0)) * 128 + t * 32;
#pragma unroll
        for (int f = 0; f < 8; f++) v[f] = feeds ? __ldg((const float4 *)xp + f) : make_float4(0.f, 0.f, 0.f, 0.f);
        float s4[8];
#pragma unroll
        for (int f = 0; f < 8; f++) s4[f] = (v[f].x + v[f].y) + (v[f].z + v[f].w);
        e = ((s4[0] + s4[1]) + (s4[2] + s4[3])) + ((s4[4] + s4[5]) + (s4[6] + s4[7]));
        const float *xv = (const float *)v;
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) { /* word i's nibble pairs (2h, 2h+4) and (2h+1, 2h+5), as mm_stage */
                const float *xw = xv + i * 8 + 2 * h;
                const __nv_bfloat162 ha = __floats2bfloat162_rn(xw[0], xw[4]), hb = __floats2bfloat162_rn(xw[1], xw[5]);
                bb[2 * i + h][0] = *(const uint32_t *)&ha;
                bb[2 * i + h][1] = *(const uint32_t *)&hb;
            }
    }
    /* a group of 64 inputs (g64) spans lanes t, t^1; of 128 (g128) all four: finish the tree */
    if constexpr (GPS <= 2) e += __shfl_xor_sync(0xffffffffu, e, 1);
    if constexpr (GPS == 1) e += __shfl_xor_sync(0xffffffffu, e, 2);

    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int sl = 0; sl < S; sl++) {
        if (sl >= nsc) continue;
        const uint32_t wa[4] = {w0[sl].x, w0[sl].y, w0[sl].z, w0[sl].w}, wc[4] = {w1[sl].x, w1[sl].y, w1[sl].z, w1[sl].w};
        const bool on = feeds && sg == sl;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t ra[4], rc[4];
            mm_decode<true>(wa[i], a.magic, ra);
            mm_decode<true>(wc[i], a.magic, rc);
#pragma unroll
            for (int h = 0; h < 2; h++)
                mm_mma(d, ra[2 * h], rc[2 * h], ra[2 * h + 1], rc[2 * h + 1], on ? bb[2 * i + h][0] : 0u,
                       on ? bb[2 * i + h][1] : 0u);
        }
    }
    /* Σx of columns 2t, 2t+1: from a lane feeding each (g' = column, t' the group's first lane) */
    float xs2[2];
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int c = min(2 * t + q, NC - 1);
        const int src = c * 4 + (GPS == 1 ? 0 : (c % GPS) * (4 / GPS));
        xs2[q] = __shfl_sync(0xffffffffu, e, src);
    }
    float acc0 = 0.0f, acc1 = 0.0f;
    mm_fold1x<GPS, S, F16S, true>(acc0, acc1, d, q[0], q[1], q[2], q[3], xs2[0], xs2[1], nsc, t);

    const int units = pair ? 2 * a.rows : a.rows;
    float *pp = a.part + (size_t)ch * units;
    mm_finish(a, acc0, acc1, r.unit0, r.unit1, r.live0, r.live1, pair, t, pp);
    if (a.ks == 1) return;
    /* the last warp of this tile to arrive sums its slices in order */
    __threadfence();
    __syncwarp(); /* every lane's partials are out before lane 0 counts the warp */
    int last = 0;
    if (lane == 0) last = atomicAdd(a.cnt + tile, 1) == a.ks - 1;
    last = __shfl_sync(0xffffffffu, last, 0);
    if (!last) return;
    __threadfence();
    const int per = pair ? 8 : 16, u = tile * per + (lane & 15);
    if (lane < per && u < a.rows) mm_sum_slices(a, u, pair, units);
    if (lane == 0) a.cnt[tile] = 0;
}

/* TERN_CUDA_GEMV_FLAT: 0 (default) never, 1 every XP1 launch it can take (no pre-norm). Returns false
 * when it declines (the caller runs the walk). Its K slices are single chunks: a.ks / a.J are set here. */
extern "C" int tern__cuda_gemv_flat;
int tern__cuda_gemv_flat = -1;
bool tern__cuda_gemv_flat_go(const tern__cuda *c, const MmArgs &a, int gb, bool f16) {
    if (tern__cuda_gemv_flat < 0) tern__cuda_gemv_flat = tern__cuda_env_int("TERN_CUDA_GEMV_FLAT", 0) == 1;
    if (!tern__cuda_gemv_flat || a.xn) return false;
    const bool pair = a.mode == G1_SILU || a.mode == G1_GELU;
    const int S = gb == 16 ? 2 : 4, nst = a.in / 128, ks = (nst + S - 1) / S;
    const long tiles = pair ? (a.rows + 7) / 8 : (a.rows + 15) / 16, units = pair ? 2L * a.rows : a.rows;
    if (ks > 65535 || (ks > 1 && ((size_t)ks * units > TERN_CUDA_PART_FLOATS || tiles > MM_CNT))) return false;
    MmArgs b = a;
    b.ks = ks;
    b.J = 1;
    const dim3 grid((unsigned)((tiles + FL_WARPS - 1) / FL_WARPS), (unsigned)ks);
    if (gb == 16) { if (f16) tern_launch(c->stream, gemv_flat_kernel<16, true>, grid, 32 * FL_WARPS, 0, b);
                    else tern_launch(c->stream, gemv_flat_kernel<16, false>, grid, 32 * FL_WARPS, 0, b); }
    else if (gb == 32) { if (f16) tern_launch(c->stream, gemv_flat_kernel<32, true>, grid, 32 * FL_WARPS, 0, b);
                         else tern_launch(c->stream, gemv_flat_kernel<32, false>, grid, 32 * FL_WARPS, 0, b); }
    else { if (f16) tern_launch(c->stream, gemv_flat_kernel<64, true>, grid, 32 * FL_WARPS, 0, b);
           else tern_launch(c->stream, gemv_flat_kernel<64, false>, grid, 32 * FL_WARPS, 0, b); }
    return true;
}

/*
 * rope_kv.cuh — rope_kv_write as the epilogue of a one-row q|k|v GEMV (ops.h norm_qkv_rope_kv; gemv1.cu for
 * BF16 / F16 weights, gemv_mma.cu for Q4). A caller holds the final f32 values of two rows of one matrix:
 * the rope pair (i, i + d/2) of a q or k head, or two v rows. rope_kv_put applies fused.cu rope_kv_kernel's
 * arithmetic (rope_pair at pos, then · mscale; q and k only), stores both rows, and k and v rows also into the
 * page of (slot, pos) with kv_put's rounding — so the fused op is bitwise the two separate launches.
 * Include after cuda_internal.h and cuda_common.cuh.
 */
#ifndef TERN_ROPE_KV_CUH
#define TERN_ROPE_KV_CUH

#include "backend/cuda/kvq_common.cuh"

__device__ __forceinline__ void rope_page_put(void *pool, size_t i, float x, int kind) { /* fused.cu kv_put */
    if (kind == 0) ((float *)pool)[i] = x;
    else ((uint16_t *)pool)[i] = (uint16_t)(kind == 1 ? kvq_f32_to_bf16(x) : kvq_f32_to_f16(x));
}

/* The parts that do not depend on the GEMV's sums, so a kernel can have them before its dot products end (session 41):
 * the step's page target (pos, slot and the block table are the host's, written before the step began — safe to read
 * before pdl_wait) and, per q / k rope pair, rope_pair's cos / sin at pos. rope_kv_put then applies rope_pair's
 * rotation, · mscale, stores both rows and the page values: the same operations as rope_pair + kv_put. */
struct RopePage {
    int pos;
    long long base; /* element index of (slot, pos)'s row in the pools; < 0: nothing stored there */
};
__device__ __forceinline__ RopePage rope_page(const tern__cuda_rope_kv &p) {
    RopePage r{p.pos[0], -1};
    const int ps = r.pos;
    if (ps >= 0 && ps / p.bs < p.max_blocks) {
        const int blk = p.bt[(size_t)p.slot[0] * p.max_blocks + ps / p.bs];
        if (blk >= 0) r.base = ((long long)blk * p.bs + ps % p.bs) * p.nkv * p.d;
    }
    return r;
}
struct RopeRot {
    float co, s;
    bool rot; /* rope_pair's f != 0 */
};
/* rope_pair's angle pos·f and its sincosf (f: inv_freq of head dimension i < d/2) */
__device__ __forceinline__ RopeRot rope_rot_at(int pos, float f) {
    RopeRot r{1.0f, 0.0f, false};
    if (f != 0.0f) {
        const float th = (float)pos * f;
        sincosf(th, &r.s, &r.co);
        r.rot = true;
    }
    return r;
}
/* m: 0 q, 1 k (rows r0 and r1 = r0 + d/2 of a head, r0 % d < d/2; rr: rope_rot_at of inv_freq[r0 % d]), 2 v (any two rows, rr
 * unused); y: the three outputs */
__device__ __forceinline__ void rope_kv_put(const tern__cuda_rope_kv &p, float *const *y, const RopePage &pg,
                                            const RopeRot &rr, int m, int r0, int r1, float x0, float x1) {
    if (m < 2) {
        if (rr.rot) rope_rot(x0, x1, rr.co, rr.s);
        x0 *= p.mscale;
        x1 *= p.mscale;
    }
    y[m][r0] = x0;
    y[m][r1] = x1;
    if (m == 0 || pg.base < 0) return;
    void *pool = m == 1 ? p.kpool : p.vpool;
    rope_page_put(pool, (size_t)pg.base + r0, x0, p.pkind);
    rope_page_put(pool, (size_t)pg.base + r1, x1, p.pkind);
}

#endif

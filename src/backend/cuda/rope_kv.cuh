/*
 * rope_kv.cuh — rope_kv_write as the epilogue of a one-row q|k|v GEMV (ops.h norm_qkv_rope_kv; gemv1.cu for
 * BF16 / F16 weights, gemv_mma.cu for Q4). A caller holds the final f32 values of two rows of one matrix:
 * the rope pair (i, i + d/2) of a q or k head, or two v rows. rope_kv_store applies fused.cu rope_kv_kernel's
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

/* m: 0 q, 1 k (rows r0 and r1 = r0 + d/2 of a head, r0 % d < d/2), 2 v (any two rows); y: the three outputs */
__device__ __forceinline__ void rope_kv_store(const tern__cuda_rope_kv &p, float *const *y, int m, int r0, int r1, float x0,
                                              float x1) {
    if (m < 2) {
        rope_pair(x0, x1, p.pos[0], p.inv_freq[r0 % p.d]);
        x0 *= p.mscale;
        x1 *= p.mscale;
    }
    y[m][r0] = x0;
    y[m][r1] = x1;
    const int ps = p.pos[0];
    if (m == 0 || ps < 0 || ps / p.bs >= p.max_blocks) return;
    const int blk = p.bt[(size_t)p.slot[0] * p.max_blocks + ps / p.bs];
    if (blk < 0) return;
    const size_t base = ((size_t)blk * p.bs + ps % p.bs) * p.nkv * p.d;
    void *pool = m == 1 ? p.kpool : p.vpool;
    rope_page_put(pool, base + r0, x0, p.pkind);
    rope_page_put(pool, base + r1, x1, p.pkind);
}

#endif

/*
 * kvq_common.cuh — device helpers of the compressed KV page kernels (kvq_write.cu,
 * kvq_attn.cu): the record layout of ops/kvq.h seen from the GPU.
 *
 * Conversions mirror src/ops/tensor.c bit for bit (f32 -> f16 with the same overflow,
 * subnormal and NaN rules; f32 -> bf16 round-to-nearest-even with the same NaN quieting), so
 * the GPU encoder writes the CPU encoder's bytes. Every arithmetic step that feeds a stored
 * byte uses an explicit _rn intrinsic: nvcc contracts a*b+c into an FMA by default, which the
 * C reference (ISO C11, contraction off) never does.
 *
 * Records are byte streams whose size need not be a multiple of 4 (e.g. turbo3 at D = 8 is 7
 * bytes), so multi-byte reads go through ld_u32/ld_u16, which take the aligned load when the
 * address allows it and assemble bytes otherwise (little-endian, like the host).
 */
#ifndef TERN_KVQ_COMMON_CUH
#define TERN_KVQ_COMMON_CUH

#include <stdint.h>

__device__ __forceinline__ float kvq_f16_to_f32(uint32_t h) {
    const uint32_t sign = (h >> 15) << 31, e = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (e == 0) {
        const float f = (float)man * 5.9604644775390625e-8f; /* exact: man * 2^-24 */
        return sign ? -f : f;
    }
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    return __uint_as_float(sign | ((e + 112) << 23) | (man << 13));
}

__device__ __forceinline__ uint32_t kvq_f32_to_f16(float f) {
    const uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u;
    if (a < 0x38800000u) return sign | (uint32_t)rintf(__fmul_rn(fabsf(f), 16777216.0f));
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return sign | ((r - 0x38000000u) >> 13);
}

__device__ __forceinline__ uint32_t kvq_f32_to_bf16(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
    return ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) & 0xffffu;
}

/* one page element: F32 as is, BF16 / F16 rounded as kv_write_q rounds them (fused.cu, attn_decode_tc.cu) */
template <typename T> __device__ __forceinline__ void kv_put(T *p, float x);
template <> __device__ __forceinline__ void kv_put<float>(float *p, float x) { *p = x; }
template <> __device__ __forceinline__ void kv_put<__nv_bfloat16>(__nv_bfloat16 *p, float x) {
    *(uint16_t *)p = (uint16_t)kvq_f32_to_bf16(x);
}
template <> __device__ __forceinline__ void kv_put<__half>(__half *p, float x) { *(uint16_t *)p = (uint16_t)kvq_f32_to_f16(x); }

__device__ __forceinline__ uint32_t ld_u32(const uint8_t *p) {
    if (!((uintptr_t)p & 3)) return *(const uint32_t *)p;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

__device__ __forceinline__ uint32_t ld_u16(const uint8_t *p) {
    if (!((uintptr_t)p & 1)) return *(const uint16_t *)p;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

/* The Lloyd–Max tables of ops/kvq.c (bits 2..4), by bits: offset (1 << b) - 4 into k_kvq_cb. */
static __constant__ float k_kvq_cb[28] = {
    -1.5104176f, -0.4527800f, 0.4527800f, 1.5104176f,
    -2.1519457f, -1.3439093f, -0.7560053f, -0.2450942f, 0.2450942f, 0.7560053f, 1.3439093f, 2.1519457f,
    -2.7325896f, -2.0690172f, -1.6180464f, -1.2562312f, -0.9423405f, -0.6567591f, -0.3880483f, -0.1283950f,
    0.1283950f, 0.3880483f, 0.6567591f, 0.9423405f, 1.2562312f, 1.6180464f, 2.0690172f, 2.7325896f,
};

/* In-place unnormalised Walsh–Hadamard transform of `rows` vectors of length P (power of two)
 * held in shared memory at x + r*stride, by the whole block. The butterflies of each stage are
 * the reference's (a+b, a-b over pairs h apart), so results are bitwise tern_kvq_fwht's. */
__device__ __forceinline__ void kvq_fwht_block(float *x, int rows, int stride, int P) {
    const int half = P / 2;
    for (int h = 1; h < P; h *= 2) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < rows * half; idx += blockDim.x) {
            const int r = idx / half, t = idx % half, i = (t / h) * 2 * h + t % h;
            float *y = x + (size_t)r * stride;
            const float a = y[i], b = y[i + h];
            y[i] = __fadd_rn(a, b);
            y[i + h] = __fsub_rn(a, b);
        }
    }
    __syncthreads();
}

#endif

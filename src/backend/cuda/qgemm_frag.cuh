/*
 * qgemm_frag.cuh — the tensor-core fragment helpers shared by qgemm.cu (batched matmul) and
 * moe_gemm.cu (grouped expert GEMM): K-block geometry, the vector loads of a lane's 32 codes or
 * halves, the exact code -> float decode, the (hi, lo) bf16 split, mma.sync m16n8k16 and the A
 * fragments of the k-slot permutation described at the top of qgemm.cu, plus the x-tile
 * swizzle. Both kernels stage x the same way, so the helpers are one copy.
 */
#ifndef TERN_CUDA_QGEMM_FRAG_CUH
#define TERN_CUDA_QGEMM_FRAG_CUH

#include "backend/cuda/cuda_common.cuh"

#define QG_KB 128   /* inputs per K block */
#define QG_WARPS 8
#define QG_BM (QG_WARPS * 16)

/* 32-bit words one lane loads per weight row and K block: 32 codes of KIND bits, or 32 halves */
template <int KIND> struct QgKind {
    static constexpr bool Q = KIND <= 8;
    static constexpr int W = Q ? KIND : 16;
};

template <int W> __device__ __forceinline__ void ld_words(const uint8_t *p, uint32_t *wd) {
    if constexpr (W % 4 == 0) {
#pragma unroll
        for (int i = 0; i < W / 4; i++) {
            const uint4 v = __ldg((const uint4 *)p + i);
            wd[4 * i] = v.x; wd[4 * i + 1] = v.y; wd[4 * i + 2] = v.z; wd[4 * i + 3] = v.w;
        }
    } else if constexpr (W % 2 == 0) {
#pragma unroll
        for (int i = 0; i < W / 2; i++) {
            const uint2 v = __ldg((const uint2 *)p + i);
            wd[2 * i] = v.x; wd[2 * i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < W; i++) wd[i] = __ldg((const uint32_t *)p + i);
    }
}

/* code j (0..31) of a 32-code run as an exact float */
template <int B> __device__ __forceinline__ float qcode(const uint32_t *wd, int j) {
    constexpr uint32_t mask = (1u << B) - 1u;
    const int bit = j * B, word = bit >> 5, sh = bit & 31;
    uint32_t v = wd[word] >> sh;
    if (sh + B > 32) v |= wd[word + 1] << (32 - sh);
    return __uint_as_float(0x4B000000u | (v & mask)) - 8388608.0f; /* (2^23 + q) - 2^23 */
}

__device__ __forceinline__ uint32_t bf2_bits(__nv_bfloat162 h) { return *(uint32_t *)&h; }

/* (v0, v1) -> hi = bf16 pair, lo = bf16 pair of the remainders (low half = v0) */
__device__ __forceinline__ void split2(float v0, float v1, uint32_t &hi, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
    const float2 hf = __bfloat1622float2(h);
    hi = bf2_bits(h);
    lo = bf2_bits(__floats2bfloat162_rn(v0 - hf.x, v1 - hf.y));
}

__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* physical 16-byte chunk of logical chunk c (0..15) in x tile row r: see the header */
__device__ __forceinline__ int swz(int c, int r) { return c ^ (((c >> 3) & 1) << 1) ^ (r & 1); }

/* A fragments (hi, lo) of step s from the words of rows g (w0) and g+8 (w1) */
template <int KIND>
__device__ __forceinline__ void frag_a(const uint32_t *w0, const uint32_t *w1, float s0, float b0, float s1, float b1,
                                       int s, uint32_t *ah, uint32_t *al) {
    if constexpr (KIND == 17) { /* BF16: the stored words are the fragment */
        ah[0] = w0[2 * s]; ah[2] = w0[2 * s + 1];
        ah[1] = w1[2 * s]; ah[3] = w1[2 * s + 1];
    } else if constexpr (KIND == 16) { /* F16: hi + lo is exact (11 -> 8 + 3 mantissa bits) */
        const float2 p0 = __half22float2(*(const __half2 *)&w0[2 * s]), p1 = __half22float2(*(const __half2 *)&w0[2 * s + 1]);
        const float2 q0 = __half22float2(*(const __half2 *)&w1[2 * s]), q1 = __half22float2(*(const __half2 *)&w1[2 * s + 1]);
        split2(p0.x, p0.y, ah[0], al[0]); split2(p1.x, p1.y, ah[2], al[2]);
        split2(q0.x, q0.y, ah[1], al[1]); split2(q1.x, q1.y, ah[3], al[3]);
    } else {
        float v[4], u[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[i] = fmaf(s0, qcode<KIND>(w0, 4 * s + i), b0);
            u[i] = fmaf(s1, qcode<KIND>(w1, 4 * s + i), b1);
        }
        split2(v[0], v[1], ah[0], al[0]); split2(v[2], v[3], ah[2], al[2]);
        split2(u[0], u[1], ah[1], al[1]); split2(u[2], u[3], ah[3], al[3]);
    }
}

#endif

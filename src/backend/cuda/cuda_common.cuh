/*
 * cuda_common.cuh — device helpers shared by the .cu files: warp reductions, scale loads of
 * any float dtype, and the generic (slow, obviously-correct) element decoder that mirrors the
 * reference tern_tensor_row_f32 bit for bit. Fast kernels decode in their own unrolled way.
 */
#ifndef TERN_CUDA_COMMON_CUH
#define TERN_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* element i of a float-like array of dtype dt (F32/F16/BF16) */
__device__ __forceinline__ float load_s(const uint8_t *p, int dt, size_t i) {
    if (dt == TERN_DT_BF16) return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
    if (dt == TERN_DT_F16) return __half2float(__ushort_as_half(((const uint16_t *)p)[i]));
    return ((const float *)p)[i];
}

__device__ __forceinline__ float gelu_tanh(float x) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k0 * (x + k1 * x * x * x)));
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

struct WDesc {
    const uint8_t *data, *scales, *biases;
    size_t mat_bytes, mat_bytes_s, row_bytes;
    int in, out, bits, gs, dtype, sdtype;
};

static inline WDesc make_wdesc(const tern__cuda_w *w) {
    WDesc d;
    d.data = (const uint8_t *)w->data;
    d.scales = (const uint8_t *)w->scales;
    d.biases = (const uint8_t *)w->biases;
    d.mat_bytes = w->mat_bytes;
    d.mat_bytes_s = w->mat_bytes_s;
    d.in = w->in;
    d.out = w->out;
    d.bits = w->bits;
    d.gs = w->group_size;
    d.dtype = w->dtype;
    d.sdtype = w->sdtype;
    d.row_bytes = w->dtype == TERN_DT_Q ? (size_t)w->in * w->bits / 8
                                        : (size_t)w->in * (w->dtype == TERN_DT_F32 ? 4 : 2);
    return d;
}

/* W[e][r][j] as f32 */
__device__ __forceinline__ float welem(const WDesc &w, int e, int r, int j) {
    const uint8_t *row = w.data + (size_t)e * w.mat_bytes + (size_t)r * w.row_bytes;
    if (w.dtype != TERN_DT_Q) {
        if (w.dtype == TERN_DT_F32 || w.dtype == TERN_DT_F16 || w.dtype == TERN_DT_BF16) return load_s(row, w.dtype, j);
        return 0.0f;
    }
    const size_t bit = (size_t)j * w.bits, byte = bit >> 3;
    const unsigned sh = (unsigned)(bit & 7);
    uint32_t v = row[byte];
    if (sh + (unsigned)w.bits > 8) v |= (uint32_t)row[byte + 1] << 8;
    const uint32_t q = (v >> sh) & ((1u << w.bits) - 1u);
    const size_t gi = (size_t)r * (w.in / w.gs) + (size_t)(j / w.gs);
    const float s = load_s(w.scales + (size_t)e * w.mat_bytes_s, w.sdtype, gi);
    const float b = load_s(w.biases + (size_t)e * w.mat_bytes_s, w.sdtype, gi);
    return fmaf(s, (float)q, b);
}

#endif

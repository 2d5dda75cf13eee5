/*
 * fused.cu — decode-step fusions that cut kernel launches (ops.h: rope_kv_write).
 *
 * rope_kv_write = rope(q) + rope(k) + kv_write(k, v) in one launch: one thread per rotated
 * pair (i, i + d/2) of every q head and k head of every row; k threads also store the roped
 * pair and the matching v pair into the paged cache: F32 pages (plain copies), or BF16 / F16 pages
 * (kvq_common.cuh's roundings, those of kvq_write.cu). The arithmetic is rope_kernel's (sincosf,
 * x0·co − x1·s, then · mscale), so results are bitwise those of the three separate ops. Other
 * compressed kinds and latent pages return 0 (the caller runs the separate ops).
 *
 * The GEMV fusions (q|k|v in one launch, gate/up with the activation product in the epilogue,
 * residual add in the epilogue) live beside their kernel in gemv.cu.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kvq_common.cuh"

/* one cache element: F32 as is, BF16 / F16 rounded as kv_write_q rounds them */
template <typename T> __device__ __forceinline__ void kv_put(T *p, float x);
template <> __device__ __forceinline__ void kv_put<float>(float *p, float x) { *p = x; }
template <> __device__ __forceinline__ void kv_put<__nv_bfloat16>(__nv_bfloat16 *p, float x) {
    *(uint16_t *)p = (uint16_t)kvq_f32_to_bf16(x);
}
template <> __device__ __forceinline__ void kv_put<__half>(__half *p, float x) { *(uint16_t *)p = (uint16_t)kvq_f32_to_f16(x); }

template <typename T>
__global__ void rope_kv_kernel(float *q, float *k, const float *v, int n, int nh, int nkv, int d,
                               const int32_t *pos, const int32_t *slot, const float *inv_freq, float mscale,
                               T *kpool, T *vpool, const int32_t *bt, int max_blocks, int bs) {
    pdl_start();
    const int half = d / 2, nt = nh + nkv;
    const size_t total = (size_t)n * nt * half;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(t % half);
        const size_t rh = t / half;
        const int r = (int)(rh / nt), h = (int)(rh % nt);
        const bool isk = h >= nh;
        float *x = isk ? k + ((size_t)r * nkv + (h - nh)) * d : q + ((size_t)r * nh + h) * d;
        const float f = inv_freq[i];
        float x0 = x[i], x1 = x[i + half];
        rope_pair(x0, x1, pos[r], f);
        x0 *= mscale;
        x1 *= mscale;
        x[i] = x0;
        x[i + half] = x1;
        if (!isk) continue;
        const int p = pos[r], sl = slot[r];
        if (p < 0 || p / bs >= max_blocks) continue;
        const int blk = bt[(size_t)sl * max_blocks + p / bs];
        if (blk < 0) continue;
        const size_t within = (size_t)(h - nh) * d, dst = ((size_t)blk * bs + p % bs) * nkv * d + within;
        const float *vr = v + (size_t)r * nkv * d + within;
        kv_put(kpool + dst + i, x0);
        kv_put(kpool + dst + i + half, x1);
        kv_put(vpool + dst + i, vr[i]);
        kv_put(vpool + dst + i + half, vr[i + half]);
    }
}

extern "C" int tern__cuda_rope_kv_write(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, float *q,
                                        float *k, const float *v, int nh, const int32_t *pos, const float *inv_freq,
                                        float mscale) {
    const int kind = kv->kf.kind;
    if ((kind != TERN_KV_F32 && kind != TERN_KV_BF16 && kind != TERN_KV_F16) || kv->vf.kind != kind || kv->latent ||
        kv->head_dim % 2)
        return 0;
    const int n = rows->n, d = kv->head_dim, nkv = kv->n_head_kv;
    const size_t total = (size_t)n * (nh + nkv) * (d / 2);
    if (!total) return 1;
    cudaSetDevice(c->device);
    size_t b = (total + 255) / 256;
    const unsigned grid = (unsigned)(b > 65535 * 8 ? 65535 * 8 : b);
#define ROPE_KV(T)                                                                                                 \
    tern_launch(c->stream, rope_kv_kernel<T>, grid, 256, 0, q, k, v, n, nh, nkv, d, pos, rows->slot, inv_freq, mscale, \
                (T *)kv->k, (T *)kv->v, kv->block_table, kv->max_blocks, kv->block_size)
    if (kind == TERN_KV_F32) ROPE_KV(float);
    else if (kind == TERN_KV_BF16) ROPE_KV(__nv_bfloat16);
    else ROPE_KV(__half);
#undef ROPE_KV
    tern__cuda_check(c, "rope_kv_write");
    return 1;
}

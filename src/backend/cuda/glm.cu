/*
 * glm.cu — the CUDA backend's GLM-5 op table (ops.h tern_glm_ops) and its small ops:
 * copy_2d, LayerNorm with bias, interleaved RoPE on a head slice and the grouped sigmoid
 * router. The latent cache write, the absorbed MLA attention and the DSA indexer top-k are in
 * glm_attn.cu. src/backend/cpu/cpu_glm.c is the spec; these kernels repeat its arithmetic
 * step by step so that results are (nearly always) bit-identical, not just close:
 *   - every f32 product/sum the CPU rounds separately is written with __fmul_rn/__fadd_rn
 *     (never contracted into an FMA); LayerNorm's mean/variance are f64 as on the CPU;
 *   - RoPE angles are f32 (pos·inv_freq), cos/sin in f64 rounded to f32, as the CPU;
 *   - the router's sigmoid uses exp in f64 rounded to f32 (what glibc's expf returns), so
 *     equal logits give equal scores and the tie rules decide: groups by score (sum of the
 *     group's top-2 biased scores, ties to the lower group), experts by biased score (ties to
 *     the lower expert). NaN scores rank below every number (the CPU's linear scan differs
 *     only when NaNs are present).
 * Every kernel reads positions from device memory and sizes its grid from shapes only, so
 * all of them can be recorded into step graphs (graph.c).
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"

#include <math.h>

extern "C" {
/* glm_attn.cu */
void tern__cuda_glm_attn_init(tern__cuda *c);
void tern__cuda_kv_write_latent(tern__cuda *c, const tern_kv_layer *kv, const tern_rows *rows, const float *k,
                                const float *v);
void tern__cuda_dsa_topk(tern__cuda *c, int32_t *sel, const float *q, const float *w, const tern_rows *rows, int nh,
                         const tern_kv_layer *kv, float scale, int k, float *min_gap);
void tern__cuda_attention_latent(tern__cuda *c, float *out, const float *q, const tern_rows *rows, int nh,
                                 const tern_kv_layer *kv, int dv, float scale, const int32_t *sel, int k_sel);
}

static tern__cuda *C(tern_backend *be) { return (tern__cuda *)be->impl; }

static unsigned grid_for(size_t total, unsigned bs) {
    size_t b = (total + bs - 1) / bs;
    return (unsigned)(b > 65535u * 4 ? 65535u * 4 : b);
}

/* ---- copy_2d ---- */

__global__ void copy2d_kernel(float *dst, int ldd, const float *src, int lds, int n, int w) {
    const size_t total = (size_t)n * w;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const size_t r = t / w, j = t % w;
        dst[r * ldd + j] = src[r * lds + j];
    }
}

static void op_copy_2d(tern_backend *be, float *dst, int ldd, const float *src, int lds, int n, int w) {
    tern__cuda *c = C(be);
    if (n <= 0 || w <= 0) return;
    cudaSetDevice(c->device);
    copy2d_kernel<<<grid_for((size_t)n * w, 256), 256, 0, c->stream>>>(dst, ldd, src, lds, n, w);
    tern__cuda_check(c, "glm copy_2d");
}

/* ---- layernorm (f64 statistics, as the CPU) ---- */

__device__ double block_sum_d(double v, double *sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* sh may still be read from the previous call */
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        v = lane < nw ? sh[lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

__global__ void __launch_bounds__(256) layernorm_kernel(float *y, const float *x, int d, const float *w,
                                                        const float *b, float eps) {
    __shared__ double sh[33];
    const float *xr = x + (size_t)blockIdx.x * d;
    float *yr = y + (size_t)blockIdx.x * d;
    double s = 0.0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) s += xr[j];
    const double mu = block_sum_d(s, sh) / d;
    double v = 0.0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const double t = (double)xr[j] - mu;
        v += t * t;
    }
    const double var = block_sum_d(v, sh);
    const float inv = (float)(1.0 / sqrt(var / d + (double)eps));
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float o = __fmul_rn((float)((double)xr[j] - mu), inv);
        o = __fmul_rn(o, w ? w[j] : 1.0f);
        yr[j] = __fadd_rn(o, b ? b[j] : 0.0f);
    }
}

static void op_layernorm(tern_backend *be, float *y, const float *x, int rows, int d, const float *w, const float *b,
                         float eps) {
    tern__cuda *c = C(be);
    if (rows <= 0 || d <= 0) return;
    cudaSetDevice(c->device);
    layernorm_kernel<<<(unsigned)rows, d < 256 ? 64 : 256, 0, c->stream>>>(y, x, d, w, b, eps);
    tern__cuda_check(c, "glm layernorm");
}

/* ---- interleaved RoPE on a head slice ---- */

__global__ void rope_il_kernel(float *x, int n, int nh, int hs, int off, int half, const int32_t *pos,
                               const float *inv, float mscale) {
    const size_t total = (size_t)n * nh * half;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(t % half);
        const size_t rh = t / half, r = rh / nh;
        float *v = x + rh * hs + off;
        const float th = __fmul_rn((float)pos[r], inv[i]);
        double sd, cd;
        sincos((double)th, &sd, &cd);
        const float cs = (float)cd, sn = (float)sd, a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = __fmul_rn(__fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn)), mscale);
        v[2 * i + 1] = __fmul_rn(__fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn)), mscale);
    }
}

static void op_rope_interleaved(tern_backend *be, float *x, int n, int nh, int hs, int off, int d, const int32_t *pos,
                                const float *inv_freq, float mscale) {
    tern__cuda *c = C(be);
    if (n <= 0 || nh <= 0 || d < 2) return;
    cudaSetDevice(c->device);
    const size_t total = (size_t)n * nh * (d / 2);
    rope_il_kernel<<<grid_for(total, 256), 256, 0, c->stream>>>(x, n, nh, hs, off, d / 2, pos, inv_freq, mscale);
    tern__cuda_check(c, "glm rope_interleaved");
}

/* ---- grouped sigmoid router: one warp per row ---- */

/* a ranks above b: higher score, or equal and lower index; NaN lowest; index < 0 = none */
__device__ __forceinline__ bool ranks_above(float va, int ia, float vb, int ib) {
    if (ia < 0) return false;
    if (ib < 0) return true;
    if (isnan(va)) return isnan(vb) && ia < ib;
    if (isnan(vb)) return true;
    return va > vb || (va == vb && ia < ib);
}

__global__ void __launch_bounds__(32) route_group_kernel(int32_t *idx, float *wts, const float *logits, int E, int k,
                                                         int G, int Gk, int norm, float scaling, const float *bias) {
    extern __shared__ float rsm[];
    float *sg = rsm, *ch = sg + E, *gs = ch + E;
    unsigned char *keep = (unsigned char *)(gs + G), *gk = keep + E;
    const int lane = threadIdx.x, r = blockIdx.x, per = E / G;
    const float *z = logits + (size_t)r * E;
    int32_t *ir = idx + (size_t)r * k;
    float *wr = wts + (size_t)r * k;
    for (int e = lane; e < E; e += 32) {
        const float ex = (float)exp(-(double)z[e]);
        const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, ex));
        sg[e] = s;
        ch[e] = __fadd_rn(s, bias ? bias[e] : 0.0f);
    }
    __syncwarp();
    if (G > 1) {
        for (int g = lane; g < G; g += 32) { /* top-2 of the group, in the CPU's order */
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                const float v = ch[e];
                if (v > m1) { m2 = m1; m1 = v; }
                else if (v > m2) m2 = v;
            }
            gs[g] = __fadd_rn(m1, m2);
            gk[g] = 0;
        }
        __syncwarp();
        if (lane == 0)
            for (int t = 0; t < Gk; t++) {
                int bg = -1;
                float bs = 0.0f;
                for (int g = 0; g < G; g++) {
                    if (gk[g]) continue;
                    if (bg < 0 || gs[g] > bs) { bg = g; bs = gs[g]; }
                }
                if (bg < 0) break;
                gk[bg] = 1;
            }
        __syncwarp();
    }
    for (int e = lane; e < E; e += 32) keep[e] = G > 1 ? (e / per < G ? gk[e / per] : 0) : 1;
    __syncwarp();
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = 0.0f;
        int bi = -1;
        for (int e = lane; e < E; e += 32)
            if (keep[e] && ranks_above(ch[e], e, bv, bi)) { bv = ch[e]; bi = e; }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ranks_above(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) {
            if (bi < 0) {
                ir[j] = 0;
                wr[j] = 0.0f;
            } else {
                keep[bi] = 0;
                ir[j] = bi;
                wr[j] = sg[bi];
                sum = __fadd_rn(sum, sg[bi]);
            }
        }
        __syncwarp();
    }
    if (lane == 0)
        for (int j = 0; j < k; j++) {
            float v = wr[j];
            if (norm) v = __fdiv_rn(v, __fadd_rn(sum, 1e-20f));
            wr[j] = __fmul_rn(v, scaling);
        }
}

static void op_route_group(tern_backend *be, int32_t *idx, float *wts, const float *logits, int n, int E, int k,
                           const tern_route_group *p) {
    tern__cuda *c = C(be);
    if (n <= 0 || k <= 0) return;
    const int G = p->n_group > 0 ? p->n_group : 1, Gk = p->topk_group > 0 ? p->topk_group : G;
    if (E <= 0 || E > 8192 || G > E) {
        tern_log(TERN_LOG_ERROR, "cuda route_group: unsupported E %d n_group %d", E, G);
        return;
    }
    cudaSetDevice(c->device);
    const size_t smem = sizeof(float) * (2 * (size_t)E + G) + (size_t)E + G;
    route_group_kernel<<<(unsigned)n, 32, smem, c->stream>>>(idx, wts, logits, E, k, G, Gk, p->norm, p->scaling, p->bias);
    tern__cuda_check(c, "glm route_group");
}

/* ---- forwards to glm_attn.cu ---- */

static void op_kv_write_latent(tern_backend *be, const tern_kv_layer *kv, const tern_rows *rows, const float *k,
                               const float *v) {
    tern__cuda_kv_write_latent(C(be), kv, rows, k, v);
}
static void op_dsa_topk(tern_backend *be, int32_t *sel, const float *q, const float *w, const tern_rows *rows, int nh,
                        const tern_kv_layer *kv, float scale, int k, float *min_gap) {
    tern__cuda_dsa_topk(C(be), sel, q, w, rows, nh, kv, scale, k, min_gap);
}
static void op_attention_latent(tern_backend *be, float *out, const float *q, const tern_rows *rows, int nh,
                                const tern_kv_layer *kv, int dv, float scale, const int32_t *sel, int k_sel) {
    tern__cuda_attention_latent(C(be), out, q, rows, nh, kv, dv, scale, sel, k_sel);
}

/* positional: copy_2d, layernorm, rope_interleaved, kv_write_latent, dsa_topk, attention_latent, route_group */
extern "C" const tern_glm_ops tern__cuda_glm_ops = {
    op_copy_2d, op_layernorm, op_rope_interleaved, op_kv_write_latent, op_dsa_topk, op_attention_latent,
    op_route_group,
};

/* at backend open: shared-memory limits of the attention / indexer kernels */
extern "C" void tern__cuda_glm_init(tern__cuda *c) { tern__cuda_glm_attn_init(c); }

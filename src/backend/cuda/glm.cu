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
    pdl_start();
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
    tern_launch(c->stream, copy2d_kernel, grid_for((size_t)n * w, 256), 256, 0, dst, ldd, src, lds, n, w);
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
    pdl_start();
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
    tern_launch(c->stream, layernorm_kernel, (unsigned)rows, d < 256 ? 64 : 256, 0, y, x, d, w, b, eps);
    tern__cuda_check(c, "glm layernorm");
}

/* ---- interleaved RoPE on a head slice ---- */

__global__ void rope_il_kernel(float *x, int n, int nh, int hs, int off, int half, const int32_t *pos,
                               const float *inv, float mscale) {
    pdl_start();
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
    tern_launch(c->stream, rope_il_kernel, grid_for(total, 256), 256, 0, x, n, nh, hs, off, d / 2, pos, inv_freq, mscale);
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
    pdl_start();
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
    tern_launch(c->stream, route_group_kernel, (unsigned)n, 32, smem, idx, wts, logits, E, k, G, Gk, p->norm, p->scaling, p->bias);
    tern__cuda_check(c, "glm route_group");
}

/* ---- matmul_heads: one matmul per head of a stack W [nh, out, in], one launch ----
 * Decode (n <= 16 rows; packed Q / FP8 stacks: <= 32 in bf16 mode, 64 in f32): heads_gemv_kernel, grid (out tiles, heads); the head's x rows (<= 8
 * per launch) are staged in shared memory; a warp owns 2 output rows and its lanes walk the
 * row in chunks of 8 elements (one 16-byte load of bf16/f16, 2 of f32, one 4-byte word of 4-bit
 * codes, 8 bytes of 8-bit codes); other formats / unaligned rows decode element by element
 * (welem). f32 math, products summed per lane then across the warp.
 * Prefill: the stack (dequantized into gemm_scratch unless F32 / BF16-in-bf16-mode) times the
 * strided rows of x as ONE cuBLASLt strided-batched GEMM per term (batch = heads): exact f32
 * (pedantic) in the f32 mode; split-bf16 on tensor cores in the bf16 mode (as gemm.c). */

enum { HK_GEN = 0, HK_BF16 = 1, HK_F16 = 2, HK_F32 = 3, HK_Q4 = 4, HK_Q8 = 5 };
#define HG_ROWS 8 /* output rows per block: 4 warps x 2 */
#define HG_NX 8   /* activation rows per launch */

struct HeadsArgs {
    float *y;
    const float *x;
    int ldy, hy, ldx, hx, n, out, in;
};

template <int KIND> __device__ __forceinline__ void heads_chunk(const WDesc &w, int h, int o, int c, float *v) {
    const uint8_t *row = w.data + (size_t)h * w.mat_bytes + (size_t)o * w.row_bytes;
    if constexpr (KIND == HK_BF16 || KIND == HK_F16) {
        const uint4 u = __ldg((const uint4 *)row + c);
        const uint32_t wd[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (KIND == HK_BF16) {
                v[2 * i] = __uint_as_float(wd[i] << 16);
                v[2 * i + 1] = __uint_as_float(wd[i] & 0xffff0000u);
            } else {
                v[2 * i] = __half2float(__ushort_as_half((unsigned short)(wd[i] & 0xffffu)));
                v[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(wd[i] >> 16)));
            }
        }
    } else if constexpr (KIND == HK_F32) {
        const float4 a = __ldg((const float4 *)row + 2 * c), b = __ldg((const float4 *)row + 2 * c + 1);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else { /* Q4 / Q8: 8 codes inside one group (group sizes are multiples of 8) */
        const size_t gi = (size_t)o * (w.in / w.gs) + (size_t)(8 * c / w.gs);
        const float s = load_s(w.scales + (size_t)h * w.mat_bytes_s, w.sdtype, gi);
        const float b = load_s(w.biases + (size_t)h * w.mat_bytes_s, w.sdtype, gi);
        if constexpr (KIND == HK_Q4) {
            const uint32_t q = __ldg((const uint32_t *)row + c);
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = fmaf(s, (float)((q >> (4 * i)) & 15u), b);
        } else {
            const uint2 q = __ldg((const uint2 *)row + c);
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = fmaf(s, (float)(((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 255u), b);
        }
    }
}

template <int KIND, int NX> __global__ void __launch_bounds__(128) heads_gemv_kernel(HeadsArgs a, WDesc w) {
    pdl_start();
    extern __shared__ float hxs[]; /* [NX][in] */
    const int h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, in = a.in;
    for (int i = tid; i < NX * in; i += blockDim.x) {
        const int r = i / in;
        hxs[i] = r < a.n ? a.x[(size_t)r * a.ldx + (size_t)h * a.hx + i % in] : 0.0f;
    }
    __syncthreads();
    const int o0 = blockIdx.x * HG_ROWS + warp * 2;
    float acc[2][NX];
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
        for (int r = 0; r < NX; r++) acc[k][r] = 0.0f;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int o = o0 + k;
        if (o >= a.out) break;
        if constexpr (KIND == HK_GEN) {
            for (int j = lane; j < in; j += 32) {
                const float v = welem(w, h, o, j);
#pragma unroll
                for (int r = 0; r < NX; r++) acc[k][r] = fmaf(v, hxs[r * in + j], acc[k][r]);
            }
        } else {
            for (int c = lane; c < in / 8; c += 32) {
                float v[8];
                heads_chunk<KIND>(w, h, o, c, v);
#pragma unroll
                for (int r = 0; r < NX; r++) {
                    const float4 x0 = *(const float4 *)(hxs + r * in + 8 * c), x1 = *(const float4 *)(hxs + r * in + 8 * c + 4);
                    float s = acc[k][r];
                    s = fmaf(v[0], x0.x, s); s = fmaf(v[1], x0.y, s); s = fmaf(v[2], x0.z, s); s = fmaf(v[3], x0.w, s);
                    s = fmaf(v[4], x1.x, s); s = fmaf(v[5], x1.y, s); s = fmaf(v[6], x1.z, s); s = fmaf(v[7], x1.w, s);
                    acc[k][r] = s;
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
        for (int r = 0; r < NX; r++) {
            const float s = warp_sum(acc[k][r]);
            if (lane == 0 && o0 + k < a.out && r < a.n) a.y[(size_t)r * a.ldy + (size_t)h * a.hy + o0 + k] = s;
        }
}

static int heads_kind(const tern__cuda_w *w) {
    if (w->in % 8) return HK_GEN;
    switch (w->dtype) {
    case TERN_DT_BF16: return HK_BF16;
    case TERN_DT_F16: return HK_F16;
    case TERN_DT_F32: return HK_F32;
    case TERN_DT_Q: return w->group_size % 8 ? HK_GEN : w->bits == 4 ? HK_Q4 : w->bits == 8 ? HK_Q8 : HK_GEN;
    default: return HK_GEN;
    }
}

template <int NX> static void heads_launch(tern__cuda *c, int kind, dim3 grid, size_t smem, const HeadsArgs &a,
                                           const WDesc &w) {
    switch (kind) {
    case HK_BF16: tern_launch(c->stream, heads_gemv_kernel<HK_BF16, NX>, grid, 128, smem, a, w); break;
    case HK_F16: tern_launch(c->stream, heads_gemv_kernel<HK_F16, NX>, grid, 128, smem, a, w); break;
    case HK_F32: tern_launch(c->stream, heads_gemv_kernel<HK_F32, NX>, grid, 128, smem, a, w); break;
    case HK_Q4: tern_launch(c->stream, heads_gemv_kernel<HK_Q4, NX>, grid, 128, smem, a, w); break;
    case HK_Q8: tern_launch(c->stream, heads_gemv_kernel<HK_Q8, NX>, grid, 128, smem, a, w); break;
    default: tern_launch(c->stream, heads_gemv_kernel<HK_GEN, NX>, grid, 128, smem, a, w); break;
    }
}

static void heads_gemv(tern__cuda *c, float *y, int ldy, int hy, const float *x, int ldx, int hx, int n, int nh,
                       const tern__cuda_w *w) {
    const WDesc wd = make_wdesc(w);
    int kind = heads_kind(w);
    /* vector loads: every row start aligned to the chunk's load width (in % 8 == 0 already) */
    const size_t algn = kind == HK_Q4 ? 4 : kind == HK_Q8 ? 8 : 16;
    if (kind != HK_GEN && (((uintptr_t)w->data % algn) || w->mat_bytes % algn)) kind = HK_GEN;
    int per = (48 << 10) / (int)(sizeof(float) * (size_t)(w->in > 0 ? w->in : 1)); /* x rows that fit in 48 KiB */
    per = per >= HG_NX ? HG_NX : per >= 4 ? 4 : per >= 2 ? 2 : per;
    if (per < 1) {
        tern_log(TERN_LOG_ERROR, "cuda matmul_heads: in %d too wide", w->in);
        return;
    }
    for (int r0 = 0; r0 < n; r0 += per) {
        const int m = n - r0 < per ? n - r0 : per, nx = m == 1 ? 1 : m == 2 ? 2 : m <= 4 ? 4 : 8;
        const size_t smem = sizeof(float) * (size_t)nx * w->in;
        HeadsArgs a = {y + (size_t)r0 * ldy, x + (size_t)r0 * ldx, ldy, hy, ldx, hx, m, w->out, w->in};
        dim3 grid((unsigned)((w->out + HG_ROWS - 1) / HG_ROWS), (unsigned)nh);
        switch (nx) {
        case 1: heads_launch<1>(c, kind, grid, smem, a, wd); break;
        case 2: heads_launch<2>(c, kind, grid, smem, a, wd); break;
        case 4: heads_launch<4>(c, kind, grid, smem, a, wd); break;
        default: heads_launch<8>(c, kind, grid, smem, a, wd); break;
        }
        tern__cuda_check(c, "glm matmul_heads gemv");
    }
}

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

static tern_status heads_gemm(tern__cuda *c, float *y, int ldy, int hy, const float *x, int ldx, int hx, int n, int nh,
                              const tern__cuda_w *w) {
    const int out = w->out, in = w->in, bf = c->compute == TERN_COMPUTE_BF16;
    const cublasComputeType_t exact = CUBLAS_COMPUTE_32F_PEDANTIC, tc = CUBLAS_COMPUTE_32F;
    const long long mat = (long long)out * in;
    if (w->dtype == TERN_DT_F32 && !bf)
        return tern__cuda_lt_gemm(c, y, ldy, hy, w->data, mat, x, ldx, hx, out, n, in, nh, CUDA_R_32F, exact, 0.0f);
    uint8_t *scr = (uint8_t *)c->gemm_scratch;
    size_t avail = c->gemm_scratch_bytes;
    /* the stack, expanded: f32 per head, or a bf16 pair per head (hi, then lo at al256(mat*2)) */
    const int native = bf && w->dtype == TERN_DT_BF16;
    const size_t hb = bf ? 2 * al256((size_t)mat * 2) : (size_t)mat * 4, wbytes = native ? 0 : hb * nh;
    if (wbytes + 4096 > avail) return TERN_ENOMEM;
    for (int h = 0; !native && h < nh; h++) tern__cuda_dequant(c, scr + h * hb, bf ? 2 : 0, w, h, 0, out);
    if (!bf) return tern__cuda_lt_gemm(c, y, ldy, hy, scr, mat, x, ldx, hx, out, n, in, nh, CUDA_R_32F, exact, 0.0f);
    const uint8_t *wh = native ? (const uint8_t *)w->data : scr, *wl = wh + al256((size_t)mat * 2);
    const long long sa = native ? mat : (long long)(hb / 2);
    scr += al256(wbytes);
    avail -= al256(wbytes);
    /* activations to a bf16 pair, in row chunks that fit */
    const size_t span_row = (size_t)ldx * 2;
    int rows = (int)((avail / 2 - 512) / span_row);
    if (rows < 1) return TERN_ENOMEM;
    for (int r0 = 0; r0 < n; r0 += rows) {
        const int m = n - r0 < rows ? n - r0 : rows;
        const size_t span = (size_t)(m - 1) * ldx + (size_t)(nh - 1) * hx + in, xb = al256(span * 2);
        if (2 * xb > avail) return TERN_ENOMEM; /* heads wider than the row stride: GEMV instead */
        uint8_t *xh = scr, *xl = scr + xb;
        tern__cuda_f32_to_bf16(c, xh, xl, x + (size_t)r0 * ldx, span);
        float *yr = y + (size_t)r0 * ldy;
        tern_status st = tern__cuda_lt_gemm(c, yr, ldy, hy, wh, sa, xh, ldx, hx, out, m, in, nh, CUDA_R_16BF, tc, 0.0f);
        if (!st) st = tern__cuda_lt_gemm(c, yr, ldy, hy, wh, sa, xl, ldx, hx, out, m, in, nh, CUDA_R_16BF, tc, 1.0f);
        if (!st && !native)
            st = tern__cuda_lt_gemm(c, yr, ldy, hy, wl, sa, xh, ldx, hx, out, m, in, nh, CUDA_R_16BF, tc, 1.0f);
        if (st) return st;
    }
    return TERN_OK;
}

static void op_matmul_heads(tern_backend *be, float *y, int ldy, int hy, const float *x, int ldx, int hx, int n, int nh,
                            const tern_tensor *t) {
    tern__cuda *c = C(be);
    if (n <= 0 || nh <= 0) return;
    tern__cuda_w w;
    tern__cuda_wview(t, &w);
    if (nh > w.nmat || nh > 65535) {
        tern_log(TERN_LOG_ERROR, "cuda matmul_heads: %d heads, stack of %d", nh, w.nmat);
        return;
    }
    cudaSetDevice(c->device);
    /* GEMM from this many rows: packed (Q / FP8) stacks are expanded first, so they stay on the GEMV
     * longer (gemv.cu's matmul uses the same limits) */
    const int packed = w.dtype == TERN_DT_Q || w.dtype == TERN_DT_F8_E4M3;
    const int limit = packed ? (c->compute == TERN_COMPUTE_F32 ? 64 : 32) : TERN_CUDA_GEMV_MAX_N;
    if (n > limit && heads_gemm(c, y, ldy, hy, x, ldx, hx, n, nh, &w) == TERN_OK) return;
    heads_gemv(c, y, ldy, hy, x, ldx, hx, n, nh, &w);
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

/* positional: copy_2d, layernorm, rope_interleaved, kv_write_latent, dsa_topk, attention_latent, route_group,
 * matmul_heads */
extern "C" const tern_glm_ops tern__cuda_glm_ops = {
    op_copy_2d, op_layernorm, op_rope_interleaved, op_kv_write_latent, op_dsa_topk, op_attention_latent,
    op_route_group, op_matmul_heads,
};

/* at backend open: shared-memory limits of the attention / indexer kernels */
extern "C" void tern__cuda_glm_init(tern__cuda *c) { tern__cuda_glm_attn_init(c); }

/*
 * cuda_common.cuh — device helpers shared by the .cu files: warp reductions, scale loads of
 * any float dtype, and the generic (slow, obviously-correct) element decoder that mirrors the
 * reference tern_tensor_row_f32 bit for bit. Fast kernels decode in their own unrolled way.
 */
#ifndef TERN_CUDA_COMMON_CUH
#define TERN_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <utility>

/* Programmatic dependent launch (default; TERN_CUDA_PDL=0 off; cuda_backend.c reads it once). Every kernel
 * starts with pdl_start(): it lets the next kernel in the stream be launched now (its blocks then
 * wait in their own pdl_wait, taking only free SM slots) and waits until the previous kernel has
 * finished and its writes are visible. Both are no-ops for a kernel launched the ordinary way, so
 * with TERN_CUDA_PDL=0 nothing changes. A kernel may do input-independent work (gemv_mma.cu: its
 * first weight loads) between pdl_trigger() and pdl_wait(). */
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_start() {
    pdl_trigger();
    pdl_wait();
}

extern "C" int tern__cuda_pdl(void); /* 1 unless TERN_CUDA_PDL=0 */

/* set() raises some kernels' shared-memory limits once per device (bit `device` of *ready), never while a step graph
 * is recorded (capturing: setting attributes then is not allowed, and a launch that declines inside a recording stays
 * declined in that graph): 1 when they are raised. Called at backend open, and before the launches that need them. */
template <class F> static inline int tern__cuda_attr_once(unsigned *ready, int device, int capturing, F set) {
    const unsigned bit = device >= 0 && device < 32 ? 1u << device : 0;
    if (!bit) return 0;
    if (*ready & bit) return 1;
    if (capturing) return 0;
    set();
    if (cudaGetLastError() != cudaSuccess) return 0;
    *ready |= bit;
    return 1;
}
extern "C" void tern__cuda_carve_apply(const void *k); /* TERN_CUDA_CARVE (cuda_backend.c) */

/* k<<<grid, block, smem, st>>>(args...), launched as a programmatic dependent of the stream's
 * previous kernel unless TERN_CUDA_PDL=0 (captured into graphs as programmatic edges); cluster_y > 0:
 * thread-block clusters of (1, cluster_y, 1) blocks (sm_90). Returns the launch's error (cudaSuccess for
 * a plain <<<>>> launch, whose errors the stream reports later). */
template <typename... K, typename... A>
static inline cudaError_t tern_launch_cluster(cudaStream_t st, void (*k)(K...), dim3 grid, dim3 block, size_t smem,
                                              int cluster_y, A &&...args) {
    cudaLaunchAttribute at[2];
    unsigned na = 0;
    tern__cuda_carve_apply((const void *)k);
    if (tern__cuda_pdl()) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_y > 0) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = 1;
        at[na].val.clusterDim.y = (unsigned)cluster_y;
        at[na++].val.clusterDim.z = 1;
    }
    if (!na) {
        k<<<grid, block, smem, st>>>(std::forward<A>(args)...);
        return cudaSuccess;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = na;
    return cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
}

template <typename... K, typename... A>
static inline void tern_launch(cudaStream_t st, void (*k)(K...), dim3 grid, dim3 block, size_t smem, A &&...args) {
    tern_launch_cluster(st, k, grid, block, smem, 0, std::forward<A>(args)...);
}

/* blocks of 256 threads for a grid-stride walk over n items: 1 .. cap */
static inline unsigned tern_grid256(size_t n, unsigned cap) {
    const size_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

/* a * b as one 32 x 32 -> 64-bit multiply (a paged cache's record times its elements a token: both fit 32 bits, and
 * a signed 64-bit product costs a sign extension and three multiplies) */
__device__ __forceinline__ unsigned long long mul_wide(unsigned a, unsigned b) {
    unsigned long long r;
    asm("mul.wide.u32 %0, %1, %2;\n" : "=l"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* RMSNorm's threads per row (norm.cu launches one block of this many per row) */
__host__ __device__ __forceinline__ int tern_rms_threads(int d) { return d >= 1024 ? 512 : d >= 256 ? 256 : 128; }

/* 1 / sqrt(mean(x[0, d)^2) + eps) of one row, bitwise norm.cu's rmsnorm for any block size: the sum
 * runs as tern_rms_threads(d) threads would (thread v: elements v, v + vt, ... by fmaf; warp sums; the
 * warp partials summed by one warp), each thread of this block standing in for one or more of them
 * in turn. x(j) returns element j (global or shared memory); red: 32 floats of shared memory. Every
 * thread of the block must call it; all get the value. */
/* the end of block_rms_inv: red[0 .. vt/32) hold the warp partials; every thread gets 1/sqrt(...) */
__device__ __forceinline__ float rms_inv_finish(int vt, int d, float eps, float *red) {
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < (vt >> 5) ? red[threadIdx.x] : 0.0f;
        t = warp_sum(t);
        if (threadIdx.x == 0) red[0] = t;
    }
    __syncthreads();
    const float inv = 1.0f / sqrtf(red[0] / (float)d + eps);
    __syncthreads(); /* red may be reused */
    return inv;
}

/* U > 1: a thread issues the loads of two of its virtual threads, U each, before their fmafs (each virtual thread's
 * sum in the same order, so the same bits). For x(j) reading global memory (gemv_mma_args.cuh mm_stage_x): the
 * one-at-a-time loop there was a chain of dependent L2 round trips, 16 a block at d 4096 (256 threads standing in for
 * 512), ~16 % of a Q4 gate|up launch's warp samples under ncu (NOTES (at)); this takes one. Callers reading shared
 * memory keep U = 1 (their timed code as it was). */
template <int U = 1, class X> __device__ __forceinline__ float block_rms_inv(X x, int d, float eps, float *red) {
    const int vt = tern_rms_threads(d), lane = threadIdx.x & 31;
    if constexpr (U == 1) {
        for (int v0 = 0; v0 < vt; v0 += blockDim.x) {
            const int v = v0 + threadIdx.x;
            float ss = 0.0f;
            if (v < vt)
                for (int j = v; j < d; j += vt) ss = fmaf(x(j), x(j), ss);
            ss = warp_sum(ss);
            if (lane == 0 && v < vt) red[v >> 5] = ss;
        }
    } else {
        for (int v0 = 0; v0 < vt; v0 += 2 * blockDim.x) {
            const int va = v0 + threadIdx.x, vb = va + blockDim.x;
            float sa = 0.0f, sb = 0.0f;
            for (int j0 = 0; j0 < d; j0 += U * vt) {
                float ea[U], eb[U];
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int ja = va + j0 + u * vt, jb = vb + j0 + u * vt;
                    ea[u] = va < vt && ja < d ? x(ja) : 0.0f;
                    eb[u] = vb < vt && jb < d ? x(jb) : 0.0f;
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (va < vt && va + j0 + u * vt < d) sa = fmaf(ea[u], ea[u], sa);
                    if (vb < vt && vb + j0 + u * vt < d) sb = fmaf(eb[u], eb[u], sb);
                }
            }
            sa = warp_sum(sa);
            sb = warp_sum(sb);
            if (lane == 0 && va < vt) red[va >> 5] = sa;
            if (lane == 0 && vb < vt) red[vb >> 5] = sb;
        }
    }
    return rms_inv_finish(vt, d, eps, red);
}

/* rmsnorm's element (norm.cu): (x·inv)·w, or x·inv without a weight. Every kernel that stages a
 * normalised row (gemv1, gemv_mma, fused.cu) forms it here, so its values are rmsnorm's bits. */
__device__ __forceinline__ float rms_scale(float x, float inv, bool has_w, float w) { return has_w ? x * inv * w : x * inv; }
/* rmsnorm_add's element: y + v, then · s when has_s, rounded step by step (no FMA contraction), as
 * add + scale_dev would */
__device__ __forceinline__ float res_add(float y, float v, bool has_s, float s) {
    const float t = __fadd_rn(y, v);
    return has_s ? __fmul_rn(t, s) : t;
}

/* The staged-norm fields of a GEMV's arguments (gemv1's Gemv1Args, gemv_mma's MmArgs: the same names):
 * xn != NULL stages rmsnorm(x)·nw and writes it to xn; res (norm_matmul's residual prologue) stages
 * x' = (x + rmsnorm(h)·w)·s first and writes it to res->x_out (gemv_mma reads it only with xn) */
template <class A> static inline void set_norm_args(A &a, const float *nw, float *xn, float eps, const tern_norm_res *res) {
    a.nw = nw;
    a.xn = xn;
    a.eps = eps;
    if (res) {
        a.rh = res->h;
        a.rw = res->w;
        a.rs = res->s;
        a.rxo = res->x_out;
    }
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

/* RoPE's rotation of the pair (x0, x1) by an angle given as its cos and sin (attn_decode_tc.cu's ROPE instances
 * take them from a table). Every product and sum rounded on its own (the scalar reference's order): with plain
 * operators ptxas contracts a product into an FMA, and which one it picks differs per call site, so rope_kv_rows
 * and the ROPE instances gave k and q 1 ulp apart (session 29: the model's greedy digests differed) */
__device__ __forceinline__ void rope_rot(float &x0, float &x1, float co, float s) {
    const float a = __fsub_rn(__fmul_rn(x0, co), __fmul_rn(x1, s)), b = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, co));
    x0 = a;
    x1 = b;
}

/* RoPE: rotates the pair (x0, x1) by pos·f (sincosf; f = 0 leaves it as is). The caller applies
 * mscale after. Shared by rope_kernel (norm.cu) and the fused rope + KV write (fused.cu). */
__device__ __forceinline__ void rope_pair(float &x0, float &x1, int pos, float f) {
    if (f != 0.0f) {
        const float th = (float)pos * f;
        float s, co;
        sincosf(th, &s, &co);
        rope_rot(x0, x1, co, s);
    }
}

struct WDesc {
    const uint8_t *data, *scales, *biases;
    size_t mat_bytes, mat_bytes_s, row_bytes;
    int in, out, bits, gs, dtype, sdtype;
    int br, ncs;        /* block FP8: rows per scale block, scale columns (0 otherwise) */
};

/* e4m3 byte -> f32, exact: the magnitude bits moved to f32 bits 20..26 are value * 2^-120 for
 * normals and subnormals alike; 0x7f / 0xff are NaN as in the reference decoder. */
__device__ __forceinline__ float f8e4m3(uint32_t v) {
    const uint32_t mag = v & 0x7fu;
    const float f = __uint_as_float((mag << 20) | ((v & 0x80u) << 24)) * 0x1p120f;
    return mag == 0x7fu ? __int_as_float(0x7fc00000) : f;
}

/* The n = 1 GEMVs' launches over up to three matrices (q|k|v, gate/up): matrix e[i] of w[i] for
 * i < k into the argument arrays; returns the rows of all k (gemv.cu's gemv1, gemv_mma.cu) */
static inline int mat_ptrs(const uint8_t **data, const uint8_t **scales, const uint8_t **biases, float **ys,
                           int *out, float *const *y, const tern__cuda_w *const *w, const int *e, int k) {
    int rows = 0;
    for (int i = 0; i < k; i++) {
        data[i] = (const uint8_t *)w[i]->data + (size_t)e[i] * w[i]->mat_bytes;
        scales[i] = (const uint8_t *)w[i]->scales + (size_t)e[i] * w[i]->mat_bytes_s;
        biases[i] = (const uint8_t *)w[i]->biases + (size_t)e[i] * w[i]->mat_bytes_s;
        ys[i] = y[i];
        out[i] = w[i]->out;
        rows += w[i]->out;
    }
    return rows;
}

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
                  : w->dtype == TERN_DT_F8_E4M3 ? (size_t)w->in
                                        : (size_t)w->in * (w->dtype == TERN_DT_F32 ? 4 : 2);
    d.br = w->dtype == TERN_DT_F8_E4M3 && w->scales ? w->blk_rows : 0;
    d.ncs = d.br ? (w->in + w->group_size - 1) / w->group_size : 0;
    return d;
}

/* W[e][r][j] as f32 */
__device__ __forceinline__ float welem(const WDesc &w, int e, int r, int j) {
    const uint8_t *row = w.data + (size_t)e * w.mat_bytes + (size_t)r * w.row_bytes;
    if (w.dtype == TERN_DT_F8_E4M3) { /* e4m3 times its block's f32 scale: one rounding, as the reference */
        const float v = f8e4m3(row[j]);
        if (!w.br) return v;
        const float *sc = (const float *)(w.scales + (size_t)e * w.mat_bytes_s);
        return v * sc[(size_t)(r / w.br) * w.ncs + (size_t)(j / w.gs)];
    }
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

/* element j of a row (a multiple of 128 wide) in the batch Q4 GEMM's staged order (qgemm_q4_wg.cu q4w_stage_x: 16-byte
 * chunk c of a 128-input tile holds inputs 8·(c >> 2) + (c & 3) + {0, 4, 32, 36, 64, 68, 96, 100}); norm.cu's
 * rmsnorm_q4s and the batch decode attention for a Q4 o projection (attn_decode.cuh AdArgs.outq) write there */
__device__ __forceinline__ int q4s_pos(int j) {
    return (j & ~127) | ((j >> 3) & 3) << 5 | (j & 3) << 3 | ((j >> 5) & 3) << 1 | ((j >> 2) & 1);
}

/* Σ_k p[k·slice] over k < S, from 0 in slice order: a split-K sum (qgemm_q4.cu qg4_reduce, fused.cu rope_kv_parts).
 * BATCH (rope_kv_parts): the loads of up to 8 slices issued before their adds — the plain loop's compiled form waits
 * one L2 round trip a slice (S = 5-9 at 64 rows, NOTES (ce)); the same adds in the same order. In qg4_reduce
 * (session 72's TERN_CUDA_QG4_RED) it lost on the H100: -2.5 / -0.6 % at 32 / 64 sequences of llama3-8b q4 (NOTES (cg)) */
template <bool BATCH = false> __device__ __forceinline__ float part_sum(const float *p, size_t slice, int S) {
    float v = 0.0f;
    int k = 0;
    if constexpr (BATCH) {
        float t[8];
        for (; k < S; k += 8) {
#pragma unroll
            for (int j = 0; j < 8; j++) t[j] = k + j < S ? p[(size_t)(k + j) * slice] : 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (k + j < S) v += t[j]; /* skipped, not + 0.0f: a -0.0 sum keeps its sign */
        }
    } else {
        for (; k < S; k++) v += p[(size_t)k * slice];
    }
    return v;
}

#endif

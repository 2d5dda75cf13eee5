/*
 * persist_probe.cu — a bench probe (bench_cuda --persist): what it costs to run a chain of dependent one-row GEMVs as
 * one kernel launch each (the step graph's way, with programmatic dependent launch) against one persistent kernel
 * that walks the whole chain with a grid-wide barrier between the GEMVs.
 *
 * Why: a batch-1 decode step is ~5 dependent one-row GEMVs a layer, and what holds it below the bandwidth floor is
 * a fixed cost of ~4-8 µs a launch (ramp, tail, the PDL hand-off; bench/NOTES.md (ba)), not the GEMVs' steady
 * streaming. A persistent "layer kernel" would replace each hand-off by a barrier. Before building one, this
 * measures the gap on the simplest case: the same BF16 GEMV code (pp_gemv: two rows a warp task, eight 16-byte
 * loads of each row in flight a lane, x staged in shared memory) launched per op under PDL, or looped inside one
 * kernel of two resident blocks an SM. Optionally each op's first weight lines are prefetched into L2 before the
 * wait (the launch's pdl_wait, or the barrier) — what gemv1's early loads do in the production kernels.
 * bench_cuda runs the production matmul chain beside it on the same weights, and per shape chains of the production
 * BF16 and Q4 GEMVs (a fixed cost a launch and a streaming rate, fitted). Not used by the engine.
 *
 * Measured (H100, session 52, bench/NOTES.md (bl)): the persistent kernel ran the chain in the same time as its
 * per-op launches (44.0 vs 43.8 µs an op; the L2 prefetch of first lines lost either way), and the production gemv1
 * chain ran at 95.8 % of the stream-add rate: for GEMV chains a grid barrier costs what a PDL hand-off costs, so a
 * "layer kernel" could only win by overlapping the latency-bound ops (attention) with weight streams.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"

struct PpOp {
    const uint4 *w; /* [out, in] BF16, rows of in / 8 uint4 */
    const float *x; /* in */
    float *y;       /* out */
    int out, in;
};

__device__ __forceinline__ float pp_dot8(uint4 u, float4 a, float4 b, float s) {
    s = fmaf(__uint_as_float(u.x << 16), a.x, s);
    s = fmaf(__uint_as_float(u.x & 0xffff0000u), a.y, s);
    s = fmaf(__uint_as_float(u.y << 16), a.z, s);
    s = fmaf(__uint_as_float(u.y & 0xffff0000u), a.w, s);
    s = fmaf(__uint_as_float(u.z << 16), b.x, s);
    s = fmaf(__uint_as_float(u.z & 0xffff0000u), b.y, s);
    s = fmaf(__uint_as_float(u.w << 16), b.z, s);
    return fmaf(__uint_as_float(u.w & 0xffff0000u), b.w, s);
}

/* y = W·x over the grid: warp task t = rows 2t, 2t + 1; lane l takes 16-byte pieces l, l + 32, ... of both rows,
 * U of each in flight */
template <int U> __device__ __forceinline__ void pp_gemv(const PpOp &op, float *xs) {
    for (int i = threadIdx.x; i < op.in; i += blockDim.x) xs[i] = __ldcg(op.x + i);
    __syncthreads();
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    const int nw = gridDim.x * wpb, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nc = op.in / 8;
    for (int t = gw; 2 * t < op.out; t += nw) {
        const uint4 *r0 = op.w + (size_t)(2 * t) * nc, *r1 = r0 + nc;
        float a0 = 0.0f, a1 = 0.0f;
        for (int c0 = lane; c0 < nc; c0 += 32 * U) {
            uint4 u0[U], u1[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + 32 * u;
                u0[u] = c < nc ? __ldg(r0 + c) : make_uint4(0, 0, 0, 0);
                u1[u] = c < nc ? __ldg(r1 + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + 32 * u;
                if (c >= nc) break;
                const float4 *xp = (const float4 *)(xs + 8 * c);
                const float4 xa = xp[0], xb = xp[1];
                a0 = pp_dot8(u0[u], xa, xb, a0);
                a1 = pp_dot8(u1[u], xa, xb, a1);
            }
        }
        a0 = warp_sum(a0);
        a1 = warp_sum(a1);
        if (lane == 0) {
            op.y[2 * t] = a0;
            op.y[2 * t + 1] = a1;
        }
    }
}

/* the lines this warp's first task of op will load first, into L2 (two rows, 4 KB of each) */
__device__ __forceinline__ void pp_prefetch(const PpOp &op) {
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5, gw = blockIdx.x * wpb + (threadIdx.x >> 5);
    const int nc = op.in / 8;
    if (2 * gw >= op.out) return;
    const uint8_t *r0 = (const uint8_t *)(op.w + (size_t)(2 * gw) * nc), *r1 = r0 + (size_t)nc * 16;
    const size_t off = (size_t)lane * 128;
    if (off < (size_t)nc * 16) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(r0 + off));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(r1 + off));
    }
}

template <int EARLY> __global__ void __launch_bounds__(256, 2) pp_op_kernel(PpOp op) {
    extern __shared__ float pp_xs[];
    pdl_trigger();
    if (EARLY) pp_prefetch(op);
    pdl_wait();
    pp_gemv<8>(op, pp_xs);
}

/* every op of the chain; between two ops every block arrives at *bar (zeroed before the launch) and waits until
 * all gridDim.x blocks of this op have: the writes of op i are visible to op i + 1's staging (fence, then the
 * acquire load) */
template <int EARLY> __global__ void __launch_bounds__(256, 2) pp_persist_kernel(const PpOp *ops, int nops, unsigned *bar) {
    extern __shared__ float pp_xs[];
    pdl_start();
    for (int i = 0; i < nops; i++) {
        const PpOp op = ops[i];
        pp_gemv<8>(op, pp_xs);
        if (EARLY && i + 1 < nops) pp_prefetch(ops[i + 1]);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(bar, 1u);
            const unsigned target = (unsigned)(i + 1) * gridDim.x;
            unsigned v, spins = 0;
            do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
            while (v < target && ++spins < (1u << 26)); /* a grid that is not all resident: give up, do not hang */
        }
        __syncthreads();
    }
}

/* The chain w[i] (BF16 [out[i], in[i]], device), x[i] -> y[i], n ops, on the backend's stream: mode 0 a launch per
 * op, 1 the same with the first lines prefetched before pdl_wait, 2 one persistent launch, 3 persistent with the next
 * op's first lines prefetched before each barrier; mode -1 (outside any capture, before 2 and 3) copies the ops'
 * descriptors into scratch (device memory of >= n * 32 + 64 bytes; the barrier follows them). Returns 0, or -1 when
 * the grid cannot be resident (persistent modes) or a launch fails. */
extern "C" int tern__cuda_persist_probe(tern__cuda *c, const void *const *w, const float *const *x, float *const *y,
                                        const int *out, const int *in, int n, int mode, void *scratch) {
    static int sms = 0, ready = 0;
    int maxin = 0;
    for (int i = 0; i < n; i++) maxin = in[i] > maxin ? in[i] : maxin;
    const size_t smem = (size_t)maxin * sizeof(float);
    cudaSetDevice(c->device);
    if (!ready) {
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c->device);
        cudaFuncSetAttribute(pp_op_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10);
        cudaFuncSetAttribute(pp_op_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10);
        cudaFuncSetAttribute(pp_persist_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10);
        cudaFuncSetAttribute(pp_persist_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10);
        cudaGetLastError();
        ready = 1;
    }
    if (smem > (100u << 10) || n < 1) return -1;
    const dim3 grid((unsigned)(2 * sms)), block(256);
    if (mode == 0 || mode == 1) {
        for (int i = 0; i < n; i++) {
            const PpOp op = {(const uint4 *)w[i], x[i], y[i], out[i], in[i]};
            if (mode) tern_launch(c->stream, pp_op_kernel<1>, grid, block, smem, op);
            else tern_launch(c->stream, pp_op_kernel<0>, grid, block, smem, op);
        }
        return cudaGetLastError() == cudaSuccess ? 0 : -1;
    }
    int per = 0; /* blocks of the persistent kernel resident per SM */
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, mode == 3 ? pp_persist_kernel<1> : pp_persist_kernel<0>, 256,
                                                      smem) != cudaSuccess || per < 2)
        return -1;
    PpOp *ops = (PpOp *)scratch;
    unsigned *bar = (unsigned *)((uint8_t *)scratch + (size_t)n * sizeof(PpOp));
    if (mode < 0) {
        static PpOp host[256];
        if (n > 256) return -1;
        for (int i = 0; i < n; i++) host[i] = PpOp{(const uint4 *)w[i], x[i], y[i], out[i], in[i]};
        return cudaMemcpy(ops, host, (size_t)n * sizeof(PpOp), cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
    }
    cudaMemsetAsync(bar, 0, sizeof(unsigned), c->stream); /* every replay of a captured graph */
    if (mode == 3) tern_launch(c->stream, pp_persist_kernel<1>, grid, block, smem, (const PpOp *)ops, n, bar);
    else tern_launch(c->stream, pp_persist_kernel<0>, grid, block, smem, (const PpOp *)ops, n, bar);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

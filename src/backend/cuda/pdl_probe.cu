/*
 * pdl_probe.cu — a bench probe (bench_cuda --pdl-smem): what a kernel's shared-memory configuration costs the
 * programmatic-dependent-launch overlap between the kernels around it.
 *
 * Why: attn_decode_tc.cu split over the keys (TERN_CUDA_AD_TCS) was faster than attn_decode.cu alone and the
 * same in a step timed kernel by kernel, yet it lost 8 % of a batch-1 decode step under graphs with PDL (H200,
 * session 18, NOTES (aa): llama3-8b bf16 218 → 200 tok/s; with TERN_CUDA_PDL=0 only 214 → 211). Its blocks ask
 * for the 228 KB configuration (108 KB each, cudaSharedmemCarveoutMaxShared), the one-row GEMVs run in 100 KB.
 * This times GEMV, K, GEMV, K, ... captured into one graph, K an almost empty kernel (pdl_start, one store)
 * taking `smem` bytes of dynamic shared memory with or without that carveout preference, against the GEMVs
 * alone: if K's configuration is what breaks the overlap, the 108 KB / MaxShared row stands out.
 */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_common.cuh"

/* the probe: waits for the previous kernel as every step kernel does, touches its shared memory, one store;
 * instance 1 carries the MaxShared carveout hint (an attribute of the function, hence two instances) */
template <int MAXSHARED> __global__ void pdl_probe_kernel(int *sink) {
    extern __shared__ int pp_smem[];
    pdl_start();
    pp_smem[threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    if (threadIdx.x == 0 && blockIdx.x == 0) sink[0] = pp_smem[blockDim.x - 1];
}

/* one launch of the probe on the backend's stream: `blocks` blocks of 128 threads, `smem` bytes (>= 512) of
 * dynamic shared memory; carve 1: the kernel carries cudaSharedmemCarveoutMaxShared (as attn_decode_tc.cu's) */
extern "C" void tern__cuda_pdl_probe(tern__cuda *c, int blocks, int smem, int carve, int *sink) {
    static int done = 0;
    if (!done) {
        cudaFuncSetAttribute(pdl_probe_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10);
        cudaFuncSetAttribute(pdl_probe_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10);
        cudaFuncSetAttribute(pdl_probe_kernel<1>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             (int)cudaSharedmemCarveoutMaxShared);
        cudaGetLastError();
        done = 1;
    }
    cudaSetDevice(c->device);
    if (smem < 512) smem = 512;
    tern_launch(c->stream, carve ? pdl_probe_kernel<1> : pdl_probe_kernel<0>, dim3((unsigned)blocks), dim3(128),
                (size_t)smem, sink);
}

/* phase 0: begin capturing the backend's stream; phase 1: end it, replay the graph `reps` times and return the
 * µs per replay (-1 on any failure) */
extern "C" double tern__cuda_probe_graph(tern__cuda *c, int phase, int reps) {
    static cudaGraph_t graph = NULL;
    if (phase == 0) {
        cudaStreamSynchronize(c->stream);
        return cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed) == cudaSuccess ? 0.0 : -1.0;
    }
    cudaGraphExec_t exec = NULL;
    double us = -1.0;
    if (cudaStreamEndCapture(c->stream, &graph) == cudaSuccess && graph &&
        cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        for (int i = 0; i < 3; i++) cudaGraphLaunch(exec, c->stream); /* warm */
        cudaEventRecord(e0, c->stream);
        for (int i = 0; i < reps; i++) cudaGraphLaunch(exec, c->stream);
        cudaEventRecord(e1, c->stream);
        float ms = 0.0f;
        if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess)
            us = 1000.0 * ms / (reps > 0 ? reps : 1);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    graph = NULL;
    cudaGetLastError();
    return us;
}

/*
 * tp_remap.cu — expert parallelism (src/model/tp.h): after routing, map the chosen global
 * expert ids to this rank's local expert stack: id - e0 for e0 <= id < e1, else -1 (moe_mlp
 * skips ids outside its stack). n·k int32 entries, one thread each, on the backend's stream.
 */
#include "backend/cuda/cuda_internal.h"

__global__ void expert_remap_kernel(int32_t *idx, int n, int e0, int e1) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int e = idx[i];
    idx[i] = e >= e0 && e < e1 ? e - e0 : -1;
}

extern "C" void tern__cuda_expert_remap(tern_backend *be, int32_t *idx, int n, int e0, int e1) {
    tern__cuda *c = (tern__cuda *)be->impl;
    if (n <= 0) return;
    cudaSetDevice(c->device);
    expert_remap_kernel<<<(n + 255) / 256, 256, 0, c->stream>>>(idx, n, e0, e1);
    tern__cuda_check(c, "expert_remap");
}

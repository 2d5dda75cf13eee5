/*
 * split_k.cuh — the hand-off of a split-K reduction: the last block to finish a group sums the other blocks' partials
 * (gemv_mma / gemv_xr's K slices, moe_mma's groups, attn_decode's splits). Include after cuda_common.cuh.
 */
#ifndef TERN_SPLIT_K_CUH
#define TERN_SPLIT_K_CUH

/* tern_arrive: one arrival at a counter as an acq_rel RMW at gpu scope; returns the count before it. Call it after a
 * block barrier that follows the block's partial stores, and read the partials after a block barrier that follows the
 * last arrival: under the PTX
 * memory model the barrier orders every thread's stores before the arriving thread's release (cumulative), and the
 * last arrival's acquire, then the barrier, orders the block's loads after every other block's stores — no fences.
 * Sequentially consistent fences in every thread around a plain atomicAdd (the form before) held ~9 % of a gemma4-e4b
 * Q4 gate|up launch's warp samples; H100, session 56 (NOTES (bp)), b1 q4 tok/s: gemma4-e4b 268.8 → 275.7, gemma4-12b
 * 182.8 → 186.0, llama3-8b 322.6 → 330.2. tern_block_last: every thread of the block calls it once its stores are
 * done; true in all of them in the last of `need` blocks to arrive at *cnt. */
__device__ __forceinline__ int tern_arrive(int *cnt) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(cnt) : "memory");
    return old;
}
__device__ __forceinline__ bool tern_block_last(int *cnt, int need) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) last = tern_arrive(cnt) == need - 1;
    __syncthreads();
    return last != 0;
}

#endif

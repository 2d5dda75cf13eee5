/*
 * wgmma.cuh — Hopper warpgroup MMA (sm_90a only: include it from files built for that target alone) as the Q4
 * kernels use it: shared-memory matrix descriptors for K-major tiles with the 128-byte swizzle, fence / commit /
 * wait, and m64nNk16 bf16 -> f32 with A from registers (qgemm_q4_wg.cu).
 *
 * Layouts (PTX ISA, "asynchronous warpgroup level matrix"): A's register fragment of a warp's 16 rows is
 * mma.m16n8k16's; the f32 accumulator of m64nNk16 is mma.m16n8k16's C per 8-column tile (d[4j..4j+3] = tile j).
 * A K-major tile with the 128-byte swizzle: rows of 128 bytes (64 bf16 of K), 8-row groups 1024 bytes apart
 * (the stride offset), the 16-byte chunk c of row r stored at chunk c ^ (r & 7), bases 1024-aligned; a k-step
 * of 16 is a 32-byte column of it (start address + 32·step).
 */
#ifndef TERN_CUDA_WGMMA_CUH
#define TERN_CUDA_WGMMA_CUH

#include <stdint.h>

/* K-major, 128-byte swizzle, 8-row groups 1024 bytes apart (the leading offset is unused: 1) */
__device__ __forceinline__ uint64_t qw_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

__device__ __forceinline__ void qw_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void qw_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void qw_wait() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

/* d[4·N/8] += A (64x16 bf16 from registers, a warp's 16 rows) · B (16xN from shared memory, descriptor) */
template <int NT> __device__ __forceinline__ void qw_mma(float *d, const uint32_t *a, uint64_t desc);
template <> __device__ __forceinline__ void qw_mma<8>(float *d, const uint32_t *a, uint64_t desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
template <> __device__ __forceinline__ void qw_mma<4>(float *d, const uint32_t *a, uint64_t desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

#endif

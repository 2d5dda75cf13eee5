/*
 * mma.cuh — the sm_80+ tensor-core building blocks the tiled kernels share: shared-memory
 * addresses, ldmatrix (plain and transposed), 16-byte cp.async with zero fill, its group
 * commit/wait (and "memory"-ordered variants for lane-private rings), and mma.sync m16n8k16 bf16 -> f32
 * (accumulating, or from zero; the same over f16). Users: sgemm.cu, attn_prefill.cu, attn_decode_tc.cu;
 * the ordered copies gemv_mma.cu's load probes. (qgemm_frag.cuh keeps its own non-volatile mma16816:
 * qgemm/moe_gemm were timed so.)
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 .bf16): lane = 4·g + t. A (16x16, row): a0 = (row g,
 * k 2t..2t+1), a1 = (row g+8, same k), a2 = (row g, k 2t+8..), a3 = (row g+8, k 2t+8..) — what
 * ldsm_x4 returns when lanes 0-15 address rows 0-15 at k 0 and lanes 16-31 the same rows at k 8.
 * B (16x8, col): b0 = (k 2t..2t+1, col g), b1 = (k 2t+8.., col g) — ldsm_x4 over a [col][k]
 * (k-contiguous) tile gives the B fragments of two 8-column tiles. C: c0, c1 = (row g, cols 2t,
 * 2t+1), c2, c3 = (row g+8, same cols).
 */
#ifndef TERN_CUDA_MMA_CUH
#define TERN_CUDA_MMA_CUH

#include <stdint.h>

__device__ __forceinline__ uint32_t mma_smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mma_ldsm_x4(uint32_t *r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void mma_ldsm_x4_t(uint32_t *r, uint32_t addr) { /* transposed 8x8 tiles */
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

/* 16 bytes global -> shared, asynchronously; ok = false fills the 16 bytes with zeros (nothing read) */
__device__ __forceinline__ void mma_cp16(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void mma_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void mma_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* Lane-private rings (gemv_mma.cu's load probes: a lane, or a warp after __syncwarp,
 * reads what it copied without a block barrier): the same copies, commit and wait with "memory"
 * clobbers, so the compiler keeps a slot's shared-memory reads after the wait and before the next copy
 * into it. 4-byte copies go through L1 (.ca: the only kind for fewer than 16 bytes). */
__device__ __forceinline__ void mma_cp16_ord(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(mma_smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void mma_cp4_ord(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(mma_smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void mma_cp_commit_ord() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void mma_cp_wait_ord() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* mma_TY: c[4] += a (16x16 TY, row) · b (16x8 TY, col), f32 accumulators; mma_TY_z: d = a · b (from zero).
 * TY = bf16, or f16 (F16 KV pages: attn_decode_tc.cu) */
#define TERN_MMA_16816(TY)                                                                                          \
    __device__ __forceinline__ void mma_##TY(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {              \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." #TY "." #TY ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "   \
                     "{%8,%9}, {%0,%1,%2,%3};\n"                                                                   \
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                              \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                             \
    }                                                                                                               \
    __device__ __forceinline__ void mma_##TY##_z(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {          \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." #TY "." #TY ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "   \
                     "{%8,%9}, {%10,%10,%10,%10};\n"                                                               \
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                              \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));                   \
    }
TERN_MMA_16816(bf16)
TERN_MMA_16816(f16)
#undef TERN_MMA_16816

#endif

/*
 * tma.cuh — the Tensor Memory Accelerator and shared-memory barriers as the warp-specialized kernels use them (sm_90a
 * files only: wgemm.cu, qgemm_q4_wg.cu): mbarrier init / arrive / expect-tx / wait by phase parity, a 2-D tiled copy
 * (cp.async.bulk.tensor) counted on a barrier, and the host's tensor-map encoder (cuTensorMapEncodeTiled reached
 * through the runtime's driver entry point, so nothing links against the driver library; defined in wgemm.cu).
 *
 * A stage's barrier completes a phase when its one expected arrival (mb_expect, which also adds the bytes to wait
 * for) has come and every byte its copies announced has landed; a consumer waits for the phase by its parity
 * (use k of a ring slot: parity k & 1). Copies that fall outside the tensor fill zeros and still count their bytes.
 */
#ifndef TERN_CUDA_TMA_CUH
#define TERN_CUDA_TMA_CUH

#include <cuda.h>
#include <stdint.h>

__device__ __forceinline__ void mb_init(uint32_t a, unsigned cnt) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(cnt) : "memory");
}
__device__ __forceinline__ void mb_expect(uint32_t a, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(a), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mb_arrive(uint32_t a) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mb_wait(uint32_t a, unsigned parity) {
    uint32_t ok;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!ok);
}
/* box (c0, c1) of map m (c0 the inner coordinate, in elements) into shared memory at dst, counted on barrier bar */
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap *m, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(dst),
                 "l"((uint64_t)m), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* t = a 2-D tiled map of rows × d0 elements of type dt, rows `stride` bytes apart, boxes of b0 × b1, swizzle sw,
 * zeros outside, L2 promotion l2 (0 none, 1 64 B, 2 128 B, 3 256 B). false when the encoder is missing or refuses */
bool tern__cuda_tmap_2d(CUtensorMap *t, const void *base, CUtensorMapDataType dt, uint64_t d0, uint64_t rows,
                        uint64_t stride, uint32_t b0, uint32_t b1, CUtensorMapSwizzle sw, int l2);
/* the encoder is there (the driver has cuTensorMapEncodeTiled) */
bool tern__cuda_tmap_ok(void);

#endif

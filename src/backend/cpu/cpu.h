/*
 * cpu.h — the CPU backends' extra entry points (the generic ones are in ops/ops.h).
 *
 * Two backends live in src/backend/cpu:
 *   - "cpu-ref" (ref.c): the scalar reference of every op in tern_backend_vt — plain loops,
 *     single-threaded, the spec that every SIMD and CUDA kernel is tested against.
 *   - "cpu" (cpu_backend.c): the fast one — SIMD kernels chosen once at startup from cpuid
 *     (AVX-512 > AVX2+FMA+F16C > portable C), work split over one persistent thread pool.
 * Both take host pointers for "device" memory; upload_weight is zero-copy (a check only).
 *
 * Environment: TERN_CPU_ISA=avx512|avx2|scalar caps the kernel level (tests use it to
 * exercise every path on one machine).
 */
#ifndef TERN_BACKEND_CPU_H
#define TERN_BACKEND_CPU_H

#include "ops/ops.h"

/* The scalar reference backend (opts may be NULL; n_threads is ignored: it is serial). */
tern_status tern_backend_cpu_ref_open(tern_backend **out, const tern_backend_opts *opts, tern_error *err);

/* Name of the kernel level the fast CPU backend uses on this machine/environment:
 * "avx512", "avx2" or "scalar". */
const char *tern_cpu_isa_name(void);

/* Read bandwidth (GB/s, 1e9 bytes/s) of streaming memory with all cores (one pool of
 * tern_cpu_count() threads; best of 3 passes) over max(bytes, tern_membw_default_bytes())
 * bytes, so the buffer never fits in the last-level cache. 0 on allocation failure. */
double tern_cpu_membw_probe(size_t bytes);
size_t tern_membw_default_bytes(void); /* 2 x L3 (sysconf), clamped to [64 MiB, 2 GiB] */

/* The same probe as an object, for benchmarks that interleave probe and kernel passes:
 * open allocates and faults in the buffer once; each run is one timed pass (GB/s). */
typedef struct tern_membw tern_membw;
tern_membw *tern_membw_open(size_t bytes);   /* NULL on allocation failure */
double tern_membw_run(tern_membw *b);
size_t tern_membw_bytes(const tern_membw *b);
void tern_membw_close(tern_membw *b);        /* accepts NULL */

/* The int8 mode: Q8/Q4 matmuls with x quantized per weight group to int8 — the batch-1 GEMV
 * and the prefill GEMM (n > 8) on AVX-512 VNNI; elsewhere the exact kernels run. On at open
 * with opts->compute == TERN_COMPUTE_INT8 (`--compute int8`) or TERN_CPU_INT8=1; this call
 * switches it later. Not exact: error bound in gemv_avx512.c / gemm_i8_avx512.c. No-op on
 * other backends. TERN_CPU_GEMV=0 at open turns the fused batch-1 kernels off (benchmarks);
 * TERN_CPU_GEMM_I8=0 keeps the int8 mode's n > 1 matmuls on the exact f32 GEMM (before/after). */
void tern_backend_cpu_set_int8(tern_backend *be, int on);

/* The bf16 mode (opts->compute == TERN_COMPUTE_BF16 at open) switched later, for tests: BF16 weights not marked
 * precise take x rounded to bf16 in every matmul (the fused GEMV's vdpbf16ps kind for 1-16 rows, the bf16 GEMM above).
 * On only where the CPU has AVX512-BF16; no-op on other backends. */
void tern_backend_cpu_set_bf16(tern_backend *be, int on);

/* Check that a weight's dtype/quantization is one the CPU kernels handle (used by
 * upload_weight of both CPU backends; message names the tensor). */
tern_status tern_cpu_check_weight(const tern_tensor *t, tern_error *err);

#endif

#!/usr/bin/env bash
# tests/cli/parity_bf16_cpu.sh — the CPU's bf16 compute mode against transformers: with AVX512-BF16 its prefill
# GEMM rounds x to bf16 for BF16 weights (gemm_avx512.c, vdpbf16ps), so every fixture is held to the bf16 bound of
# test_parity (max(2e-2, 2 x transformers' own bf16 error); DSA fixtures: the rows before index_topk), as the CUDA
# bf16 mode is on the H200. Without AVX512-BF16 the mode runs the f32 GEMM and passes trivially.
cd "$(dirname "$0")/../.."
t=build/tests/test_parity
if [ ! -x "$t" ]; then echo "SKIP: parity_bf16_cpu (no $t)"; exit 0; fi
TERN_TEST_COMPUTE=bf16 "$t" 2>&1 | sed -e 's/^PASS: parity_/PASS: bf16_cpu_parity_/' \
    -e 's/^FAIL: parity_/FAIL: bf16_cpu_parity_/' -e 's/^SKIP: parity_/SKIP: bf16_cpu_parity_/'
exit "${PIPESTATUS[0]}"

#!/usr/bin/env bash
# tests/cli/parity_norm_res.sh — the model side of the post-norm residual fold on the CPU: gemma4.c keeps
# the residual stream in a local pointer and swaps it with a second buffer whenever the backend folds
# a pending rmsnorm_add into the next pre-norm matmul (ops.h norm_matmul's res; the CUDA backend does it
# with TERN_CUDA_NORM_RES=1). The CPU backend's test hook TERN_CPU_NORM_RES=1 serves that op by
# composition (q|k|v and one-matrix forms), so the Gemma 4 parity fixtures run through the swap here;
# every case must pass as it does without the hook (decode steps and two-row batches fold).
cd "$(dirname "$0")/../.."
t=build/tests/test_parity
if [ ! -x "$t" ]; then echo "SKIP: parity_norm_res (no $t)"; exit 0; fi
TERN_CPU_NORM_RES=1 TERN_TEST_CASES=gemma4 "$t" 2>&1 | sed -e 's/^PASS: parity_/PASS: norm_res_parity_/' \
    -e 's/^FAIL: parity_/FAIL: norm_res_parity_/' -e 's/^SKIP: parity_/SKIP: norm_res_parity_/'
exit "${PIPESTATUS[0]}"

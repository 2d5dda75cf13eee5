/*
 * test_cuda_ops.c — the CUDA backend's op tests for the GPU machine (built by `make gpu-test`
 * as build/test_cuda_ops; scripts/gpu_check.sh runs it). Every op against the scalar
 * reference backend; prints PASS/FAIL/SKIP lines like every other test binary, plus
 * "  err ..." lines with the measured error per format for the report.
 */
#include "gpu/cuda_ops_tests.h"
#include "gpu/cuda_ops_tests_moe.h"

int main(void) {
    char why[TERN_ERROR_MSG_MAX + 32];
    if (!cuda_ops_open(why, sizeof why)) {
        printf("SKIP: cuda: no GPU (%s)\n", why);
        cuda_ops_close();
        return 0;
    }
    int rc = cuda_ops_run_all();
    cuda_moe_tests();
    rc |= test_done();
    cuda_ops_close();
    return rc;
}

/*
 * test_cuda_skip.c — the CUDA op tests inside the normal suite. Without a GPU (or without a
 * CUDA build) it prints one visible "SKIP: cuda: no GPU (...)" line and passes; with a GPU it
 * runs the same op-by-op comparisons against cpu-ref as tests/gpu/test_cuda_ops.c.
 */
#include "gpu/cuda_ops_tests.h"

int main(void) {
    char why[TERN_ERROR_MSG_MAX + 32];
    if (!cuda_ops_open(why, sizeof why)) {
        printf("SKIP: cuda: no GPU (%s)\n", why);
        cuda_ops_close();
        return 0;
    }
    int rc = cuda_ops_run_all();
    cuda_ops_close();
    return rc;
}

/*
 * test_cuda_skip.c — the CUDA op tests inside the normal suite. Without a GPU (or without a
 * CUDA build) it prints one visible "SKIP: cuda: no GPU (...)" line and passes; with a GPU it
 * runs the same op-by-op comparisons against cpu-ref as tests/gpu/test_cuda_ops.c. Built without
 * nvcc (TERN_CUDA=0) the op tests are not compiled at all: they name the CUDA backend's switches.
 */
#include <stdio.h>

#if TERN_HAVE_CUDA
#include "gpu/cuda_ops_tests.h"
#endif

int main(void) {
#if TERN_HAVE_CUDA
    char why[TERN_ERROR_MSG_MAX + 32];
    if (!cuda_ops_open(why, sizeof why)) {
        printf("SKIP: cuda: no GPU (%s)\n", why);
        cuda_ops_close();
        return 0;
    }
    int rc = cuda_ops_run_all();
    cuda_ops_close();
    return rc;
#else
    printf("SKIP: cuda: no GPU (built without CUDA: nvcc was not found)\n");
    return 0;
#endif
}

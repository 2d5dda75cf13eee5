/*
 * backend.c — backend-independent glue: close, and the CUDA constructor stub used when
 * tern is built without CUDA (the real one lives in src/backend/cuda/).
 */
#include "ops/ops.h"

void tern_backend_close(tern_backend *be) {
    if (be && be->vt && be->vt->close) be->vt->close(be);
}

#ifndef TERN_HAVE_CUDA
tern_status tern_backend_cuda_open(tern_backend **out, const tern_backend_opts *opts, tern_error *err) {
    (void)opts;
    if (out) *out = NULL;
    return tern_err(err, TERN_EUNSUPPORTED, "this tern was built without CUDA (nvcc not found at build time)");
}
size_t tern_backend_cuda_fixed_bytes(int rows) { (void)rows; return 0; }
size_t tern_backend_cuda_context_bytes(void) { return 0; }
size_t tern_backend_cuda_device_bytes(int device) { (void)device; return 0; }
#endif

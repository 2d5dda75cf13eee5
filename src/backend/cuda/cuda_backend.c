/*
 * cuda_backend.c — the CUDA backend's C side (vtable, memory, streams). Placeholder until
 * the kernels land: reports that the backend is not available.
 */
#include "ops/ops.h"

tern_status tern_backend_cuda_open(tern_backend **out, const tern_backend_opts *opts, tern_error *err) {
    (void)opts;
    if (out) *out = NULL;
    return tern_err(err, TERN_EUNSUPPORTED, "CUDA backend not implemented yet");
}

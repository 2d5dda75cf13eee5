/*
 * st_write.h — write a .safetensors file (header JSON padded to 8 bytes, then the data in
 * order). Used by the embedded demo model, random-weight benchmarks and tests.
 */
#ifndef TERN_ST_WRITE_H
#define TERN_ST_WRITE_H

#include "base/base.h"
#include "ops/tensor.h"

typedef struct tern_st_wentry {
    const char *name;
    tern_dtype dtype;        /* stored dtype (not TERN_DT_Q: write U32 + scales/biases entries) */
    int ndim;
    int64_t shape[TERN_MAX_DIMS];
    const void *data;        /* nbytes = prod(shape) * dtype size */
} tern_st_wentry;

/* Write atomically (PATH.tmp then rename). */
tern_status tern_st_write(const char *path, const tern_st_wentry *e, int n, tern_error *err);

#endif

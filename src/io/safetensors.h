/*
 * safetensors.h — read-only, mmap'd access to .safetensors files, single or sharded.
 *
 * Format: u64 little-endian header length N, N bytes of JSON header
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data
 * (offsets relative to the end of the header). Every tensor is validated when the file is
 * opened: dtype known, shape*size == end-begin, offsets inside the file and not overlapping.
 * Data is used in place (zero-copy); offsets need not be aligned (mlx writes unaligned ones),
 * consumers must use memcpy-safe / unaligned loads or ask tern_st_aligned_copy.
 * --no-mmap (tern_st_open_opts with no_mmap): after validation the tensor bytes of each file
 * are read (pread, large chunks) into one anonymous 2 MB-aligned buffer per file advised with
 * tern_advise_huge, and every entry's `data` points there; tensors a keep_mapped rule names
 * (offloaded routed experts) stay in the file mapping. Validation and errors are identical.
 */
#ifndef TERN_SAFETENSORS_H
#define TERN_SAFETENSORS_H

#include "base/base.h"
#include "ops/tensor.h"

typedef struct tern_st_entry {
    char *name;
    tern_dtype dtype;
    int ndim;
    int64_t shape[TERN_MAX_DIMS];
    const void *data;     /* inside the mapping */
    size_t nbytes;
    int file;             /* index into the set's files */
} tern_st_entry;

typedef struct tern_st_set tern_st_set;

/* Open DIR/model.safetensors.index.json (sharded) or every DIR/\*.safetensors, or a single
 * file path. Validates everything up front. */
tern_status tern_st_open(tern_st_set **out, const char *path, tern_error *err);
void tern_st_close(tern_st_set *s);

/* Open options (appended). Zeroed = tern_st_open (everything stays in the file mapping). */
typedef struct tern_st_opts {
    int no_mmap;  /* 1: read tensor bytes into anonymous memory (2 MB pages) instead of the mapping */
    /* with no_mmap: tensors for which keep_mapped(stored name, ctx) returns 1 stay in the file
     * mapping (expert offload reads experts from the file). NULL: copy every tensor. */
    int (*keep_mapped)(const char *name, void *ctx);
    void *ctx;
} tern_st_opts;
tern_status tern_st_open_opts(tern_st_set **out, const char *path, const tern_st_opts *opts, tern_error *err);
/* keep_mapped rule for expert offload: routed expert tensors in every stored form
 * ("*.experts.*" — not shared_experts —, "*.switch_mlp.*", "*.switch_glu.*"). ctx unused. */
int tern_st_is_routed_expert(const char *name, void *ctx);
/* Bytes read into anonymous memory (0 in mmap mode). */
size_t tern_st_copied_bytes(const tern_st_set *s);

int tern_st_count(const tern_st_set *s);
const tern_st_entry *tern_st_at(const tern_st_set *s, int i);
const tern_st_entry *tern_st_find(const tern_st_set *s, const char *name); /* NULL if absent */
const char *tern_st_file_name(const tern_st_set *s, int file);
int tern_st_file_count(const tern_st_set *s);
/* String value of key in a file's "__metadata__" (first file that has it); NULL if absent. */
const char *tern_st_metadata(const tern_st_set *s, const char *key);

/* Internal (tests, fuzzing): validate one safetensors image held in memory (not copied;
 * buf must outlive the set). `name` is used in messages. */
tern_status tern__st_parse_buffer(tern_st_set **out, const void *buf, size_t len, const char *name,
                                  tern_error *err);
/* Largest header accepted (bytes); larger ones are reported as absurd. */
#define TERN_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

#endif

/*
 * file.h — whole-file reads, read-only memory maps and path helpers.
 *
 * tern_file_read loads a (small) text file such as config.json into a NUL-terminated heap
 * buffer, refusing files larger than `max` bytes so a wrong path can't eat memory.
 * tern_map maps a file read-only (PROT_READ, MAP_PRIVATE); an empty file maps to a NULL
 * pointer with size 0. Both report errors as "PATH: what went wrong (strerror)".
 * tern_path_join writes "dir/name" into a caller buffer and fails if it does not fit.
 */
#ifndef TERN_FILE_H
#define TERN_FILE_H

#include "base/base.h"

/* Read all of `path` into a malloc'd buffer (NUL-terminated; *len excludes the NUL).
 * Files over `max` bytes are refused with TERN_EFORMAT. Caller frees with free(). */
tern_status tern_file_read(const char *path, size_t max, char **out, size_t *len, tern_error *err);

typedef struct tern_map {
    const void *data; /* NULL when size == 0 */
    size_t size;
} tern_map;

tern_status tern_map_open(tern_map *m, const char *path, tern_error *err);
void tern_map_close(tern_map *m); /* accepts NULL and a zeroed map */

/* 1 if path exists and is a regular file / a directory. */
int tern_is_file(const char *path);
int tern_is_dir(const char *path);

/* "dir/name" into buf[n]; TERN_EINVAL if it does not fit. */
tern_status tern_path_join(char *buf, size_t n, const char *dir, const char *name, tern_error *err);

/* Last path component (pointer into path). */
const char *tern_path_base(const char *path);

#endif

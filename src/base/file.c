/*
 * file.c — whole-file reads and read-only mmaps (see file.h).
 *
 * Everything returns a tern_status with the path and errno text in the message; nothing
 * here aborts. Maps are MAP_PRIVATE + PROT_READ so a stray write faults instead of
 * changing the model file on disk.
 */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

tern_status tern_file_read(const char *path, size_t max, char **out, size_t *len, tern_error *err) {
    *out = NULL;
    if (len) *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tern_err(err, errno == ENOENT ? TERN_ENOTFOUND : TERN_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tern_err(err, TERN_EIO, "%s: not a regular file", path);
    }
    if ((unsigned long long)st.st_size > (unsigned long long)max) {
        close(fd);
        return tern_err(err, TERN_EFORMAT, "%s: file is %lld bytes, more than the %zu allowed", path,
                        (long long)st.st_size, max);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return tern_err(err, TERN_ENOMEM, "%s: cannot allocate %zu bytes", path, n + 1);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
        free(buf);
        return tern_err(err, TERN_EIO, "%s: short read (%zu of %zu bytes)", path, got, n);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return TERN_OK;
}

tern_status tern_map_open(tern_map *m, const char *path, tern_error *err) {
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tern_err(err, errno == ENOENT ? TERN_ENOTFOUND : TERN_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tern_err(err, TERN_EIO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return TERN_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return tern_err(err, TERN_EIO, "%s: mmap failed: %s", path, strerror(e));
    m->data = p;
    m->size = (size_t)st.st_size;
    return TERN_OK;
}

void tern_map_close(tern_map *m) {
    if (!m || !m->data) return;
    munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

int tern_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int tern_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

tern_status tern_path_join(char *buf, size_t n, const char *dir, const char *name, tern_error *err) {
    size_t dl = strlen(dir);
    int slash = dl > 0 && dir[dl - 1] != '/';
    int w = snprintf(buf, n, "%s%s%s", dir, slash ? "/" : "", name);
    if (w < 0 || (size_t)w >= n) return tern_err(err, TERN_EINVAL, "path too long: %s/%s", dir, name);
    return TERN_OK;
}

const char *tern_path_base(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

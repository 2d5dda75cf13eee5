/*
 * io_util.h — helpers for the io tests: a mkdtemp scratch dir, a tiny safetensors writer
 * (name, dtype, shape, bytes → a valid file with consecutive offsets) and a raw writer for
 * deliberately broken headers. Header-only; included by tests/unit/test_io_*.c.
 */
#ifndef TERN_IO_UTIL_H
#define TERN_IO_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct st_t {
    const char *name, *dtype;
    int ndim;
    int64_t shape[4];
    const void *data; /* nbytes bytes; NULL = zeros */
    size_t nbytes;
} st_t;

static char io_dir_[256];

static inline const char *io_tmpdir(void) {
    if (!io_dir_[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(io_dir_, sizeof io_dir_, "%s/tern_io_XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(io_dir_)) { perror("mkdtemp"); exit(1); }
    }
    return io_dir_;
}

static inline void io_cleanup(void) {
    char cmd[300];
    if (!io_dir_[0]) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", io_dir_);
    if (system(cmd)) {}
}

/* path of name inside the scratch dir (static rotating buffers) */
static inline const char *io_path(const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ & 7];
    snprintf(p, 512, "%s/%s", io_tmpdir(), name);
    return p;
}

static inline void io_mkdir(const char *name) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", io_path(name));
    if (system(cmd)) {}
}

static inline void io_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    if (n && fwrite(data, 1, n, f) != n) { perror(path); exit(1); }
    fclose(f);
}

static inline void io_write_text(const char *path, const char *s) { io_write_file(path, s, strlen(s)); }

/* Raw file: u64 len | header | data. hlen_override != 0 writes that length instead. */
static inline void io_write_raw(const char *path, const char *header, const void *data, size_t dn, uint64_t hlen_override) {
    size_t hn = strlen(header);
    uint64_t hl = hlen_override ? hlen_override : hn;
    unsigned char *buf = malloc(8 + hn + dn + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hl >> (8 * i));
    memcpy(buf + 8, header, hn);
    if (dn) {
        if (data) memcpy(buf + 8 + hn, data, dn);
        else memset(buf + 8 + hn, 0, dn);
    }
    io_write_file(path, buf, 8 + hn + dn);
    free(buf);
}

/* Valid file from a list of tensors, offsets consecutive in list order (so unaligned
 * offsets arise naturally when a tensor's size is not a multiple of 4). */
static inline void io_write_st(const char *path, const st_t *t, int n, const char *metadata_json) {
    size_t cap = 4096 + (size_t)n * 256, hn = 0, total = 0;
    char *h = malloc(cap);
    hn += (size_t)snprintf(h + hn, cap - hn, "{");
    if (metadata_json) hn += (size_t)snprintf(h + hn, cap - hn, "\"__metadata__\":%s%s", metadata_json, n ? "," : "");
    for (int i = 0; i < n; i++) {
        hn += (size_t)snprintf(h + hn, cap - hn, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t[i].name,
                               t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++) hn += (size_t)snprintf(h + hn, cap - hn, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        hn += (size_t)snprintf(h + hn, cap - hn, "],\"data_offsets\":[%zu,%zu]}", total, total + t[i].nbytes);
        total += t[i].nbytes;
    }
    hn += (size_t)snprintf(h + hn, cap - hn, "}");
    unsigned char *data = calloc(1, total + 1);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (t[i].data) memcpy(data + off, t[i].data, t[i].nbytes);
        off += t[i].nbytes;
    }
    io_write_raw(path, h, data, total, 0);
    free(h);
    free(data);
}

#endif

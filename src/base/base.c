/*
 * base.c — error formatting, logging, clock, aligned allocation.
 */
#define _POSIX_C_SOURCE 200809L
#include "base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdint.h>
#include <sys/mman.h>

const char *tern_status_str(tern_status s) {
    switch (s) {
    case TERN_OK: return "ok";
    case TERN_EINVAL: return "invalid argument";
    case TERN_EIO: return "i/o error";
    case TERN_EFORMAT: return "malformed input";
    case TERN_EUNSUPPORTED: return "unsupported";
    case TERN_ENOMEM: return "out of memory";
    case TERN_EDEVICE: return "device error";
    case TERN_ECANCELLED: return "cancelled";
    case TERN_ENOTFOUND: return "not found";
    case TERN_EINTERNAL: return "internal error";
    }
    return "unknown error";
}

int tern_status_exit_code(tern_status s) {
    switch (s) {
    case TERN_OK: return 0;
    case TERN_EINVAL: case TERN_EIO: case TERN_EFORMAT: case TERN_EUNSUPPORTED: case TERN_ENOTFOUND:
        return 2;
    default: return 1;
    }
}

tern_status tern_err(tern_error *err, tern_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

tern_status tern_err_wrap(tern_error *err, tern_status code, const char *fmt, ...) {
    if (err) {
        char prefix[TERN_ERROR_MSG_MAX], old[TERN_ERROR_MSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        memcpy(old, err->msg, sizeof old);
        old[sizeof old - 1] = 0;
        err->code = code;
        snprintf(err->msg, sizeof err->msg, "%.200s: %.300s", prefix, old);
    }
    return code;
}

static int g_level = -1;

void tern_log_set_level(tern_log_level lvl) { g_level = (int)lvl; }

static int log_level(void) {
    if (g_level < 0) {
        const char *e = getenv("TERN_LOG");
        g_level = TERN_LOG_WARN;
        if (e) {
            if (!strcmp(e, "error")) g_level = TERN_LOG_ERROR;
            else if (!strcmp(e, "info")) g_level = TERN_LOG_INFO;
            else if (!strcmp(e, "debug")) g_level = TERN_LOG_DEBUG;
        }
    }
    return g_level;
}

void tern_log(tern_log_level lvl, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    if ((int)lvl > log_level()) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tern: %s: ", names[lvl]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

double tern_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void *tern_aalloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes) return NULL;
    if (posix_memalign(&p, 64, rounded) != 0) return NULL;
    return p;
}

void tern_afree(void *p) { free(p); }

void tern_advise_huge(void *p, size_t bytes) {
    const char *e = getenv("TERN_THP");
    if (!p || bytes < (2u << 20) || (e && !strcmp(e, "0"))) return;
    uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, z = ((uintptr_t)p + bytes) & ~(uintptr_t)4095;
    if (z > a) (void)madvise((void *)a, z - a, MADV_HUGEPAGE); /* advice only: failure is harmless */
}

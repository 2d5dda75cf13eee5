/*
 * base.h — small shared helpers every layer may use: error reporting, logging,
 * checked allocation and sizes. Nothing here knows about models or devices.
 *
 * Error pattern:
 *     if (bad) return tern_err(err, TERN_EFORMAT, "%s: tensor '%s' has %d dims", path, name, nd);
 * tern_err fills *err (when non-NULL) and returns the code, so a failure is one line.
 */
#ifndef TERN_BASE_H
#define TERN_BASE_H

#include "tern.h"
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define TERN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TERN_PRINTF(a, b)
#endif

/* Fill *err (if non-NULL) with code and a formatted message; return code. */
tern_status tern_err(tern_error *err, tern_status code, const char *fmt, ...) TERN_PRINTF(3, 4);
/* Prefix an existing error message: "ctx: old message" (keeps the code). */
tern_status tern_err_wrap(tern_error *err, tern_status code, const char *fmt, ...) TERN_PRINTF(3, 4);

/* Logging to stderr. Level from env TERN_LOG (error|warn|info|debug), default warn. */
typedef enum { TERN_LOG_ERROR, TERN_LOG_WARN, TERN_LOG_INFO, TERN_LOG_DEBUG } tern_log_level;
void tern_log(tern_log_level lvl, const char *fmt, ...) TERN_PRINTF(2, 3);
void tern_log_set_level(tern_log_level lvl);

/* Overflow-checked size arithmetic: return false on overflow. */
static inline bool tern_mul_ok(size_t a, size_t b, size_t *out) {
    if (a && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}
static inline bool tern_add_ok(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return false;
    *out = a + b;
    return true;
}

/* Monotonic clock in seconds. */
double tern_time_s(void);

/* Aligned allocation (64-byte) for SIMD buffers; free with tern_afree. NULL on failure. */
void *tern_aalloc(size_t bytes);
/* Advise 2 MB pages (MADV_HUGEPAGE) for a buffer of >= 2 MB before its first write; TERN_THP=0
 * turns it off. Page-table walks on 4 KB pages halve streaming bandwidth on some VMs. */
void tern_advise_huge(void *p, size_t bytes);
void tern_afree(void *p);

#define TERN_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TERN_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TERN_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif

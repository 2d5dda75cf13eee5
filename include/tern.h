/*
 * tern.h — the public C API of tern, an LLM inference engine.
 *
 * Conventions (the whole library follows them):
 *   - Every fallible function returns tern_status: TERN_OK (0) or a negative code.
 *   - Functions that can fail also take an optional `tern_error *err`; when non-NULL
 *     it receives a one-line human message naming the file, field or parameter at fault.
 *   - Objects come in pairs `tern_x_open/_close` or `_init/_free`; every close/free accepts NULL.
 *   - Input can never abort the process: bad files, configs, requests are errors, not crashes.
 *
 * This header grows with the engine (engine/request/sampling API); see docs/ARCHITECTURE.md.
 */
#ifndef TERN_H
#define TERN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tern_status {
    TERN_OK = 0,
    TERN_EINVAL = -1,      /* bad argument / bad request parameter */
    TERN_EIO = -2,         /* file could not be opened / read / mapped */
    TERN_EFORMAT = -3,     /* file content malformed (safetensors, json, config) */
    TERN_EUNSUPPORTED = -4,/* valid but not supported (architecture, dtype, quant bits) */
    TERN_ENOMEM = -5,      /* allocation failed or memory budget exceeded */
    TERN_EDEVICE = -6,     /* accelerator error */
    TERN_ECANCELLED = -7,  /* request cancelled */
    TERN_ENOTFOUND = -8,   /* named thing (tensor, file, model) absent */
    TERN_EINTERNAL = -9    /* bug: an invariant failed */
} tern_status;

#define TERN_ERROR_MSG_MAX 512

typedef struct tern_error {
    tern_status code;
    char msg[TERN_ERROR_MSG_MAX];
} tern_error;

/* Short stable name of a status ("ok", "invalid argument", ...). */
const char *tern_status_str(tern_status s);

/* Process exit code for a status per the CLI contract: 0 ok, 2 bad input, 1 otherwise. */
int tern_status_exit_code(tern_status s);

#ifdef __cplusplus
}
#endif
#endif

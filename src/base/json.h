/*
 * json.h — cJSON parsing and typed field getters that produce precise messages.
 *
 * Every getter takes `where`, the text that names the object the field lives in, e.g.
 * "config.json: text_config." — so a failure reads
 *     config.json: text_config.num_hidden_layers: expected a positive integer, got -3
 * Missing keys and JSON null both mean "absent": the getter stores the default, except
 * when the default is TERN_JSON_REQUIRED, which makes absence an error. Wrong types and
 * out-of-range values are TERN_EFORMAT. Nothing here allocates except tern_json_parse.
 */
#ifndef TERN_JSON_H
#define TERN_JSON_H

#include "base/base.h"

#include <cjson/cJSON.h>

#define TERN_JSON_REQUIRED INT64_MIN

/* Parse len bytes (need not be NUL-terminated). On failure the message names `name` and
 * the byte offset/line of the error. Free the result with cJSON_Delete. */
tern_status tern_json_parse(const char *buf, size_t len, const char *name, cJSON **out, tern_error *err);

/* Short human description of a value for messages: -3, "abc", null, true, an object ... */
const char *tern_json_describe(const cJSON *v, char *buf, size_t n);

/* Item by key, treating JSON null as absent (returns NULL). */
const cJSON *tern_json_item(const cJSON *obj, const char *key);

/* Integer in [lo, hi]; absent -> def (or an error if def == TERN_JSON_REQUIRED). */
tern_status tern_json_int(const cJSON *obj, const char *key, const char *where, int64_t lo, int64_t hi,
                          int64_t def, int64_t *out, tern_error *err);
/* Same for an int destination (lo/hi must fit an int). */
tern_status tern_json_int32(const cJSON *obj, const char *key, const char *where, int lo, int hi, int64_t def,
                            int *out, tern_error *err);
/* Number in [lo, hi] (finite); absent -> def; `required` makes absence an error. */
tern_status tern_json_num(const cJSON *obj, const char *key, const char *where, double lo, double hi, double def,
                          int required, double *out, tern_error *err);
/* Boolean; absent -> def. */
tern_status tern_json_bool(const cJSON *obj, const char *key, const char *where, int def, int *out, tern_error *err);
/* String copied into buf[n] (too long = error); absent -> def (NULL def + absent = error). */
tern_status tern_json_str(const cJSON *obj, const char *key, const char *where, const char *def, char *buf, size_t n,
                          tern_error *err);

/* Convert a single value (not a field) to an integer in [lo, hi]; `what` names it. */
tern_status tern_json_value_int(const cJSON *v, const char *what, int64_t lo, int64_t hi, int64_t *out,
                                tern_error *err);

#endif

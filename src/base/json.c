/*
 * json.c — cJSON wrapper: parse with a located error message, typed getters (json.h).
 *
 * Integers are accepted only when the JSON number is finite and integral (1e3 is fine,
 * 2.5 is not); values beyond 2^53 cannot be represented exactly by cJSON's double and are
 * caught by the caller's range. Messages follow "WHEREkey: expected ..., got VALUE".
 */
#include "base/json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

tern_status tern_json_parse(const char *buf, size_t len, const char *name, cJSON **out, tern_error *err) {
    const char *end = NULL;
    *out = NULL;
    if (!buf || len == 0) return tern_err(err, TERN_EFORMAT, "%s: not valid JSON (empty)", name);
    cJSON *j = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!j) {
        size_t off = (end && end >= buf && end <= buf + len) ? (size_t)(end - buf) : 0;
        size_t line = 1;
        for (size_t i = 0; i < off; i++) line += buf[i] == '\n';
        char near[24];
        size_t k = 0;
        for (size_t i = off; i < len && k < 20; i++) {
            unsigned char c = (unsigned char)buf[i];
            near[k++] = (c >= 32 && c < 127) ? (char)c : '?';
        }
        near[k] = 0;
        return tern_err(err, TERN_EFORMAT, "%s: not valid JSON: error at byte %zu (line %zu) near '%s'", name, off,
                        line, near);
    }
    *out = j;
    return TERN_OK;
}

const char *tern_json_describe(const cJSON *v, char *buf, size_t n) {
    if (!v) snprintf(buf, n, "nothing");
    else if (cJSON_IsNull(v)) snprintf(buf, n, "null");
    else if (cJSON_IsTrue(v)) snprintf(buf, n, "true");
    else if (cJSON_IsFalse(v)) snprintf(buf, n, "false");
    else if (cJSON_IsNumber(v)) snprintf(buf, n, "%.17g", v->valuedouble);
    else if (cJSON_IsString(v)) {
        const char *s = v->valuestring ? v->valuestring : "";
        size_t l = strlen(s);
        if (l > 40) snprintf(buf, n, "\"%.40s...\"", s);
        else snprintf(buf, n, "\"%s\"", s);
    } else if (cJSON_IsArray(v)) snprintf(buf, n, "an array");
    else if (cJSON_IsObject(v)) snprintf(buf, n, "an object");
    else snprintf(buf, n, "an invalid value");
    return buf;
}

const cJSON *tern_json_item(const cJSON *obj, const char *key) {
    if (!cJSON_IsObject(obj)) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static void range_text(char *buf, size_t n, int64_t lo, int64_t hi) {
    if (lo == 1) snprintf(buf, n, "a positive integer no larger than %lld", (long long)hi);
    else if (lo == 0) snprintf(buf, n, "a non-negative integer no larger than %lld", (long long)hi);
    else snprintf(buf, n, "an integer in [%lld, %lld]", (long long)lo, (long long)hi);
}

tern_status tern_json_value_int(const cJSON *v, const char *what, int64_t lo, int64_t hi, int64_t *out,
                                tern_error *err) {
    char want[96], got[64];
    range_text(want, sizeof want, lo, hi);
    if (lo == 1 && cJSON_IsNumber(v) && v->valuedouble < 1) snprintf(want, sizeof want, "a positive integer");
    if (lo == 0 && cJSON_IsNumber(v) && v->valuedouble < 0) snprintf(want, sizeof want, "a non-negative integer");
    if (!cJSON_IsNumber(v)) goto bad;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < (double)lo || d > (double)hi) goto bad;
    *out = (int64_t)d;
    return TERN_OK;
bad:
    return tern_err(err, TERN_EFORMAT, "%s: expected %s, got %s", what, want, tern_json_describe(v, got, sizeof got));
}

tern_status tern_json_int(const cJSON *obj, const char *key, const char *where, int64_t lo, int64_t hi,
                          int64_t def, int64_t *out, tern_error *err) {
    const cJSON *v = tern_json_item(obj, key);
    if (!v) {
        if (def == TERN_JSON_REQUIRED) return tern_err(err, TERN_EFORMAT, "%s%s: required field is missing", where, key);
        *out = def;
        return TERN_OK;
    }
    char what[256];
    snprintf(what, sizeof what, "%s%s", where, key);
    return tern_json_value_int(v, what, lo, hi, out, err);
}

tern_status tern_json_int32(const cJSON *obj, const char *key, const char *where, int lo, int hi, int64_t def,
                            int *out, tern_error *err) {
    int64_t v = 0;
    tern_status s = tern_json_int(obj, key, where, lo, hi, def, &v, err);
    if (s == TERN_OK) *out = (int)v;
    return s;
}

tern_status tern_json_num(const cJSON *obj, const char *key, const char *where, double lo, double hi, double def,
                          int required, double *out, tern_error *err) {
    const cJSON *v = tern_json_item(obj, key);
    char got[64];
    if (!v) {
        if (required) return tern_err(err, TERN_EFORMAT, "%s%s: required field is missing", where, key);
        *out = def;
        return TERN_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return tern_err(err, TERN_EFORMAT, "%s%s: expected a number in [%g, %g], got %s", where, key, lo, hi,
                        tern_json_describe(v, got, sizeof got));
    *out = v->valuedouble;
    return TERN_OK;
}

tern_status tern_json_bool(const cJSON *obj, const char *key, const char *where, int def, int *out, tern_error *err) {
    const cJSON *v = tern_json_item(obj, key);
    char got[64];
    if (!v) {
        *out = def;
        return TERN_OK;
    }
    if (!cJSON_IsBool(v))
        return tern_err(err, TERN_EFORMAT, "%s%s: expected true or false, got %s", where, key,
                        tern_json_describe(v, got, sizeof got));
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return TERN_OK;
}

tern_status tern_json_str(const cJSON *obj, const char *key, const char *where, const char *def, char *buf, size_t n,
                          tern_error *err) {
    const cJSON *v = tern_json_item(obj, key);
    char got[64];
    if (!v) {
        if (!def) return tern_err(err, TERN_EFORMAT, "%s%s: required field is missing", where, key);
        snprintf(buf, n, "%s", def);
        return TERN_OK;
    }
    if (!cJSON_IsString(v) || !v->valuestring)
        return tern_err(err, TERN_EFORMAT, "%s%s: expected a string, got %s", where, key,
                        tern_json_describe(v, got, sizeof got));
    if (strlen(v->valuestring) >= n)
        return tern_err(err, TERN_EFORMAT, "%s%s: string too long (%zu bytes, at most %zu)", where, key,
                        strlen(v->valuestring), n - 1);
    memcpy(buf, v->valuestring, strlen(v->valuestring) + 1);
    return TERN_OK;
}

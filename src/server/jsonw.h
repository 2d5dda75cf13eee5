/*
 * jsonw.h — a small streaming JSON writer for the server's responses.
 *
 * Why our own writer (cJSON is used for parsing only): responses are built field by field
 * in a fixed order (clients and tests compare shapes), strings must always come out as
 * valid JSON even when a token piece holds invalid UTF-8, and floats (logprobs) should be
 * formatted like Python's repr — the shortest text that reads back to the same double —
 * so numbers match what Python servers print. NaN and infinities become null.
 *
 *   tern_jw w; tern_jw_init(&w);
 *   tern_jw_obj(&w); tern_jw_kstr(&w, "id", "x"); tern_jw_kint(&w, "n", 3); tern_jw_end(&w);
 *   size_t n; char *s = tern_jw_take(&w, &n);   // malloc'd, NUL-terminated; or NULL on OOM
 *
 * Commas are inserted automatically. Allocation failure is sticky (w.oom) and makes
 * tern_jw_take return NULL; nothing aborts.
 */
#ifndef TERN_SERVER_JSONW_H
#define TERN_SERVER_JSONW_H

#include <stddef.h>
#include <stdint.h>

#define TERN_JW_MAX_DEPTH 64

typedef struct tern_jw {
    char *buf;
    size_t len, cap;
    int oom;
    int depth;
    unsigned char need_comma[TERN_JW_MAX_DEPTH];
    char closer[TERN_JW_MAX_DEPTH];
    int after_key;
} tern_jw;

void tern_jw_init(tern_jw *w);
void tern_jw_free(tern_jw *w);
void tern_jw_reset(tern_jw *w);                 /* keep the buffer, drop the content */
char *tern_jw_take(tern_jw *w, size_t *len);    /* hand over the text (malloc'd); w is reset */

void tern_jw_obj(tern_jw *w);                   /* { */
void tern_jw_arr(tern_jw *w);                   /* [ */
void tern_jw_end(tern_jw *w);                   /* } or ] — whichever is open */
void tern_jw_key(tern_jw *w, const char *key);
void tern_jw_str(tern_jw *w, const char *s);    /* NULL writes null */
void tern_jw_strn(tern_jw *w, const char *s, size_t n);
void tern_jw_int(tern_jw *w, long long v);
void tern_jw_double(tern_jw *w, double v);
void tern_jw_bool(tern_jw *w, int v);
void tern_jw_null(tern_jw *w);
void tern_jw_raw(tern_jw *w, const char *json, size_t n);  /* an already-serialized value */
/* Plain bytes outside the JSON grammar (SSE framing "data: ", "\n\n"). */
void tern_jw_text(tern_jw *w, const char *s, size_t n);

/* key + value shorthands */
void tern_jw_kstr(tern_jw *w, const char *k, const char *s);
void tern_jw_kstrn(tern_jw *w, const char *k, const char *s, size_t n);
void tern_jw_kint(tern_jw *w, const char *k, long long v);
void tern_jw_kdouble(tern_jw *w, const char *k, double v);
void tern_jw_kbool(tern_jw *w, const char *k, int v);
void tern_jw_knull(tern_jw *w, const char *k);

/* Python-repr formatting of a double into buf (>= 32 bytes): "0.1", "100.0", "1e-05",
 * "1.5e+16", "-0.0"; "null" for NaN/inf. Returns the length. */
int tern_jw_fmt_double(double v, char *buf, size_t n);

/* Length of the longest prefix of s[0..n) that does not end inside a UTF-8 sequence
 * (what can be emitted now without splitting a character). */
size_t tern_utf8_complete_prefix(const char *s, size_t n);

#endif

/*
 * jsonw.c — the JSON writer of jsonw.h.
 *
 * Strings: bytes are copied through when they form valid UTF-8; each maximal invalid
 * subsequence becomes U+FFFD (as decoders do), control characters are escaped (\n, \t,
 * \u00XX), '"' and '\\' are escaped; everything else stays raw UTF-8 (as OpenAI sends).
 * Doubles: the shortest %.*e precision that round-trips through strtod, then laid out the
 * way Python's float repr does (fixed notation when -4 <= exponent < 16, else d.ddde+XX).
 */
#include "server/jsonw.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tern_jw_init(tern_jw *w) { memset(w, 0, sizeof *w); }

void tern_jw_free(tern_jw *w) {
    if (!w) return;
    free(w->buf);
    memset(w, 0, sizeof *w);
}

void tern_jw_reset(tern_jw *w) {
    w->len = 0;
    w->oom = 0;
    w->depth = 0;
    w->after_key = 0;
    w->need_comma[0] = 0;
    if (w->buf) w->buf[0] = 0;
}

static int reserve(tern_jw *w, size_t extra) {
    if (w->oom) return 0;
    if (w->len + extra + 1 <= w->cap) return 1;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + extra + 1) {
        if (cap > ((size_t)1 << 40)) { w->oom = 1; return 0; }
        cap *= 2;
    }
    char *b = realloc(w->buf, cap);
    if (!b) { w->oom = 1; return 0; }
    w->buf = b;
    w->cap = cap;
    return 1;
}

static void put(tern_jw *w, const char *s, size_t n) {
    if (!reserve(w, n)) return;
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = 0;
}

static void putc1(tern_jw *w, char c) { put(w, &c, 1); }

char *tern_jw_take(tern_jw *w, size_t *len) {
    if (w->oom || !reserve(w, 0)) { tern_jw_free(w); if (len) *len = 0; return NULL; }
    char *s = w->buf;
    if (len) *len = w->len;
    memset(w, 0, sizeof *w);
    return s;
}

/* Comma before a value in an array / before a key in an object. */
static void before_value(tern_jw *w) {
    if (w->after_key) { w->after_key = 0; return; }
    if (w->depth > 0) {
        if (w->need_comma[w->depth]) putc1(w, ',');
        w->need_comma[w->depth] = 1;
    }
}

static void open_(tern_jw *w, char c) {
    before_value(w);
    putc1(w, c);
    if (w->depth + 1 >= TERN_JW_MAX_DEPTH) { w->oom = 1; return; }
    w->depth++;
    w->need_comma[w->depth] = 0;
    w->closer[w->depth] = c == '{' ? '}' : ']';
}

void tern_jw_obj(tern_jw *w) { open_(w, '{'); }
void tern_jw_arr(tern_jw *w) { open_(w, '['); }

void tern_jw_end(tern_jw *w) {
    if (w->depth <= 0) return;
    putc1(w, w->closer[w->depth]);
    w->depth--;
}

static size_t utf8_seq(const unsigned char *s, size_t n) {
    /* length of the valid UTF-8 sequence at s, 0 if invalid/incomplete */
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (n < len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return len;
}

size_t tern_utf8_complete_prefix(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    /* look back at most 3 bytes for a lead byte whose sequence is cut by the end */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = s[n - back];
        if ((c & 0xC0) == 0x80) continue;            /* continuation: keep looking */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

static void write_str(tern_jw *w, const char *str, size_t n) {
    if (!reserve(w, n + 2)) return;
    putc1(w, '"');
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0, run = 0;                           /* run: bytes copied verbatim pending */
    while (i < n) {
        unsigned char c = s[i];
        const char *esc = NULL;
        char tmp[8];
        size_t adv = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", c); esc = tmp; }
        else if (c >= 0x80) {
            adv = utf8_seq(s + i, n - i);
            if (!adv) { esc = "\xEF\xBF\xBD"; adv = 1;
                /* skip the rest of a truncated-but-plausible sequence as one unit */
                while (i + adv < n && (s[i + adv] & 0xC0) == 0x80 && adv < 4 && c >= 0xC2) adv++;
            }
        }
        if (esc) {
            put(w, (const char *)s + i - run, run);
            run = 0;
            put(w, esc, strlen(esc));
            i += adv;
        } else {
            run += adv;
            i += adv;
        }
    }
    put(w, (const char *)s + n - run, run);
    putc1(w, '"');
}

void tern_jw_strn(tern_jw *w, const char *s, size_t n) {
    before_value(w);
    write_str(w, s ? s : "", s ? n : 0);
}

void tern_jw_str(tern_jw *w, const char *s) {
    if (!s) { tern_jw_null(w); return; }
    tern_jw_strn(w, s, strlen(s));
}

void tern_jw_key(tern_jw *w, const char *key) {
    w->after_key = 0;
    before_value(w);
    write_str(w, key, strlen(key));
    putc1(w, ':');
    w->after_key = 1;
}

void tern_jw_int(tern_jw *w, long long v) {
    char b[32];
    int n = snprintf(b, sizeof b, "%lld", v);
    before_value(w);
    put(w, b, (size_t)n);
}

int tern_jw_fmt_double(double v, char *buf, size_t n) {
    if (!isfinite(v)) return snprintf(buf, n, "null");
    if (v == 0) return snprintf(buf, n, signbit(v) ? "-0.0" : "0.0");
    char e[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    /* e = [-]d[.ddd]e[+-]XX -> sign, digits, exponent */
    const char *q = e;
    int neg = 0;
    if (*q == '-') { neg = 1; q++; }
    char dig[24];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') dig[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    char out[64];
    int k = 0;
    if (neg) out[k++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[k++] = '0'; out[k++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[k++] = '0';
            for (int i = 0; i < nd; i++) out[k++] = dig[i];
        } else {
            for (int i = 0; i <= exp; i++) out[k++] = i < nd ? dig[i] : '0';
            out[k++] = '.';
            if (nd > exp + 1) for (int i = exp + 1; i < nd; i++) out[k++] = dig[i];
            else out[k++] = '0';
        }
        out[k] = 0;
    } else {
        out[k++] = dig[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = dig[i];
        }
        k += snprintf(out + k, sizeof out - (size_t)k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    return snprintf(buf, n, "%s", out);
}

void tern_jw_double(tern_jw *w, double v) {
    char b[64];
    int n = tern_jw_fmt_double(v, b, sizeof b);
    before_value(w);
    put(w, b, (size_t)n);
}

void tern_jw_bool(tern_jw *w, int v) {
    before_value(w);
    put(w, v ? "true" : "false", v ? 4 : 5);
}

void tern_jw_null(tern_jw *w) {
    before_value(w);
    put(w, "null", 4);
}

void tern_jw_raw(tern_jw *w, const char *json, size_t n) {
    before_value(w);
    put(w, json, n);
}

void tern_jw_text(tern_jw *w, const char *s, size_t n) { put(w, s, n); }

void tern_jw_kstr(tern_jw *w, const char *k, const char *s) { tern_jw_key(w, k); tern_jw_str(w, s); }
void tern_jw_kstrn(tern_jw *w, const char *k, const char *s, size_t n) { tern_jw_key(w, k); tern_jw_strn(w, s, n); }
void tern_jw_kint(tern_jw *w, const char *k, long long v) { tern_jw_key(w, k); tern_jw_int(w, v); }
void tern_jw_kdouble(tern_jw *w, const char *k, double v) { tern_jw_key(w, k); tern_jw_double(w, v); }
void tern_jw_kbool(tern_jw *w, const char *k, int v) { tern_jw_key(w, k); tern_jw_bool(w, v); }
void tern_jw_knull(tern_jw *w, const char *k) { tern_jw_key(w, k); tern_jw_null(w); }

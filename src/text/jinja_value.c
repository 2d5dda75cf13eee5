/*
 * jinja_value.c — the value model of the Jinja interpreter: arena, strings, lists, ordered
 * dicts, truthiness / equality / ordering as in Python, conversion from cJSON, and the two
 * printers that must match Python byte for byte:
 *   - str()/repr(): True/False/None, ints, floats in shortest round-trip form (1.0, 1e+16,
 *     1e-05), lists/dicts as [1, 'a'] / {'k': None} (strings quoted the way repr does);
 *   - json.dumps: separators (", ", ": ") or custom, indent, sort_keys, ensure_ascii; floats as
 *     repr, NaN/Infinity; escapes \" \\ \n \r \t \b \f and \u00XX for other controls.
 */
#include "text/jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- arena ---------------- */

void *jj_alloc(jj_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (a->head && a->head->cap - a->head->used >= n) {
        void *p = (char *)(a->head + 1) + a->head->used;
        a->head->used += n;
        memset(p, 0, n); /* callers rely on zeroed memory */
        return p;
    }
    size_t cap = n > 65536 ? n : 65536;
    if (a->head && a->head->cap * 2 > cap && a->head->cap < (16u << 20)) cap = a->head->cap * 2;
    if (a->total + cap > a->cap)
        jj_fail(a->jb, a->err, TERN_ENOMEM, "template: memory limit of %zu bytes exceeded", a->cap);
    jj_chunk *c = malloc(sizeof(jj_chunk) + cap);
    if (!c) jj_fail(a->jb, a->err, TERN_ENOMEM, "template: out of memory");
    c->cap = cap;
    c->used = n;
    c->next = a->head;
    a->head = c;
    a->total += cap;
    memset(c + 1, 0, n);
    return c + 1;
}

void jj_arena_free(jj_arena *a) {
    if (!a) return;
    for (jj_chunk *c = a->head, *nx; c; c = nx) {
        nx = c->next;
        free(c);
    }
    a->head = NULL;
    a->total = 0;
}

char *jj_strndup(jj_arena *a, const char *s, size_t n) {
    char *p = jj_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void jj_fail(jmp_buf *jb, tern_error *err, tern_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    longjmp(*jb, code ? (int)-code : 1);
}

/* ---------------- constructors ---------------- */

jv jv_str_copy(jj_arena *a, const char *p, size_t n) { return jv_strn(jj_strndup(a, p, n), n); }
jv jv_cstr(const char *s) { return jv_strn(s, strlen(s)); }

jv jv_new_list(jj_arena *a) {
    jv v = {JV_LIST, {0}};
    v.u.l = jj_alloc(a, sizeof(jlist));
    return v;
}
jv jv_new_dict(jj_arena *a) {
    jv v = {JV_DICT, {0}};
    v.u.d = jj_alloc(a, sizeof(jdict));
    return v;
}

void jv_list_push(jj_arena *a, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        jv *nv = jj_alloc(a, nc * sizeof(jv));
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
}

static long dict_find(const jdict *d, jv k) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], k)) return (long)i;
    return -1;
}

void jv_dict_set(jj_arena *a, jdict *d, jv k, jv v) {
    long i = dict_find(d, k);
    if (i >= 0) { d->v[i] = v; return; }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        jv *nk = jj_alloc(a, nc * sizeof(jv)), *nv = jj_alloc(a, nc * sizeof(jv));
        if (d->n) { memcpy(nk, d->k, d->n * sizeof(jv)); memcpy(nv, d->v, d->n * sizeof(jv)); }
        d->k = nk; d->v = nv; d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

jv jv_dict_get(const jdict *d, jv k, bool *found) {
    long i = dict_find(d, k);
    if (found) *found = i >= 0;
    return i >= 0 ? d->v[i] : jv_undef();
}
jv jv_dict_gets(const jdict *d, const char *key) { return jv_dict_get(d, jv_cstr(key), NULL); }

/* ---------------- semantics ---------------- */

bool jv_truthy(jv v) {
    switch (v.t) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->ns || v.u.d->n != 0;
    default: return true;
    }
}

bool jv_is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
double jv_num(jv v) { return v.t == JV_INT ? (double)v.u.i : v.t == JV_FLOAT ? v.u.f : v.t == JV_BOOL ? v.u.b : 0; }

bool jv_equal(jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return (a.t == JV_INT ? a.u.i : a.u.b) == (b.t == JV_INT ? b.u.i : b.u.b);
        return jv_num(a) == jv_num(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_LIST:
        if (a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal(a.u.l->v[i], b.u.l->v[i])) return false;
        return true;
    case JV_DICT:
        if (a.u.d == b.u.d) return true;
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            bool f;
            jv o = jv_dict_get(b.u.d, a.u.d->k[i], &f);
            if (!f || !jv_equal(a.u.d->v[i], o)) return false;
        }
        return true;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

const char *jv_type_name(jv v) {
    static const char *names[] = {"undefined", "none", "bool", "int", "float", "str", "list", "dict", "macro",
                                  "method", "function", "loop"};
    if (v.t == JV_LIST && v.u.l->tuple) return "tuple";
    if (v.t == JV_DICT && v.u.d->ns) return "namespace";
    return names[v.t];
}

int jv_cmp(jrender *r, jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t == JV_INT && b.t == JV_INT) return (a.u.i > b.u.i) - (a.u.i < b.u.i);
        double x = jv_num(a), y = jv_num(b);
        return (x > y) - (x < y);
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = TERN_MIN(a.u.s.n, b.u.s.n);
        int c = memcmp(a.u.s.p, b.u.s.p, n);
        if (c) return c < 0 ? -1 : 1;
        return (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    if (a.t == JV_LIST && b.t == JV_LIST) {
        size_t n = TERN_MIN(a.u.l->n, b.u.l->n);
        for (size_t i = 0; i < n; i++) {
            int c = jv_cmp(r, a.u.l->v[i], b.u.l->v[i]);
            if (c) return c;
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    jr_fail(r, TERN_EINVAL, "%s:%d: cannot compare %s with %s", r->tname, r->line, jv_type_name(a),
            jv_type_name(b));
}

jv jv_from_cjson(jj_arena *a, const cJSON *j) {
    if (!j || cJSON_IsNull(j)) return jv_none();
    if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (isfinite(d) && d == floor(d) && fabs(d) < 9007199254740992.0 && !(d == 0 && signbit(d))) return jv_int((int64_t)d);
        return jv_float(d);
    }
    if (cJSON_IsString(j)) return jv_str_copy(a, j->valuestring, strlen(j->valuestring));
    if (cJSON_IsArray(j)) {
        jv l = jv_new_list(a);
        for (const cJSON *c = j->child; c; c = c->next) jv_list_push(a, l.u.l, jv_from_cjson(a, c));
        return l;
    }
    if (cJSON_IsObject(j)) {
        jv d = jv_new_dict(a);
        for (const cJSON *c = j->child; c; c = c->next)
            jv_dict_set(a, d.u.d, jv_str_copy(a, c->string ? c->string : "", c->string ? strlen(c->string) : 0),
                        jv_from_cjson(a, c));
        return d;
    }
    return jv_none();
}

/* ---------------- UTF-8 ---------------- */

size_t jj_utf8_len(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80) c++;
    return c;
}

size_t jj_utf8_offset(const char *p, size_t n, int64_t cp) {
    if (cp <= 0) return 0;
    int64_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80) {
            if (c == cp) return i;
            c++;
        }
    return n;
}

/* ---------------- printing ---------------- */

void jb_put(jrender *r, jbuf *b, const char *s, size_t n) {
    if (!n) return;
    if (b->max && b->n + n > b->max) /* on every write: capacity grows past the limit (fuzzed: 1.4 MB under 1 MB) */
        jr_fail(r, TERN_EINVAL, "%s: output exceeds the limit of %zu bytes", r->tname, b->max);
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *np;
        if (b->ar) { /* scratch: the arena (jj_alloc fails through its jmp_buf) */
            np = jj_alloc(b->ar, nc);
            if (b->n) memcpy(np, b->p, b->n);
        } else {
            np = realloc(b->p, nc);
            if (!np) jr_fail(r, TERN_ENOMEM, "%s: out of memory", r->tname);
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void jb_puts(jrender *r, jbuf *b, const char *s) { jb_put(r, b, s, strlen(s)); }

/* Python repr(float): shortest digits that round-trip; fixed for 1e-4 <= |x| < 1e16. */
void jv_write_float(jbuf *b, double f, jrender *r) {
    char buf[64];
    if (isnan(f)) { jb_puts(r, b, "nan"); return; }
    if (isinf(f)) { jb_puts(r, b, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { jb_puts(r, b, signbit(f) ? "-0.0" : "0.0"); return; }
    char e[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    char digits[32];
    int nd = 0, neg = e[0] == '-';
    const char *q = e + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char *o = buf;
    if (neg) *o++ = '-';
    if (exp < -4 || exp >= 16) {
        *o++ = digits[0];
        if (nd > 1) { *o++ = '.'; memcpy(o, digits + 1, nd - 1); o += nd - 1; }
        o += sprintf(o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        *o++ = '0'; *o++ = '.';
        for (int i = 0; i < -exp - 1; i++) *o++ = '0';
        memcpy(o, digits, nd); o += nd;
    } else {
        for (int i = 0; i <= exp; i++) *o++ = i < nd ? digits[i] : '0';
        *o++ = '.';
        if (nd > exp + 1) { memcpy(o, digits + exp + 1, nd - exp - 1); o += nd - exp - 1; }
        else *o++ = '0';
    }
    *o = 0;
    jb_puts(r, b, buf);
}

static void write_repr_str(jrender *r, jbuf *b, const char *p, size_t n) {
    bool sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char qc = sq && !dq ? '"' : '\'';
    jb_put(r, b, &qc, 1);
    size_t st = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        const char *esc = NULL;
        char tmp[8];
        if (c == '\\') esc = "\\\\";
        else if (c == (unsigned char)qc) esc = qc == '\'' ? "\\'" : "\\\"";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20 || c == 0x7f) { snprintf(tmp, sizeof tmp, "\\x%02x", c); esc = tmp; }
        if (esc) {
            jb_put(r, b, p + st, i - st);
            jb_puts(r, b, esc);
            st = i + 1;
        }
    }
    jb_put(r, b, p + st, n - st);
    jb_put(r, b, &qc, 1);
}

static void write_int(jrender *r, jbuf *b, int64_t i) {
    char t[32];
    jb_put(r, b, t, (size_t)snprintf(t, sizeof t, "%lld", (long long)i));
}

void jv_write_repr(jrender *r, jbuf *b, jv v) {
    if (v.t == JV_STR) write_repr_str(r, b, v.u.s.p, v.u.s.n);
    else jv_write_str(r, b, v);
}

void jv_write_str(jrender *r, jbuf *b, jv v) {
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jb_puts(r, b, "None"); return;
    case JV_BOOL: jb_puts(r, b, v.u.b ? "True" : "False"); return;
    case JV_INT: write_int(r, b, v.u.i); return;
    case JV_FLOAT: jv_write_float(b, v.u.f, r); return;
    case JV_STR: jb_put(r, b, v.u.s.p, v.u.s.n); return;
    case JV_LIST: {
        bool tup = v.u.l->tuple;
        jb_puts(r, b, tup ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jb_puts(r, b, ", ");
            jv_write_repr(r, b, v.u.l->v[i]);
        }
        jb_puts(r, b, tup ? (v.u.l->n == 1 ? ",)" : ")") : "]");
        return;
    }
    case JV_DICT:
        if (v.u.d->ns) { jb_puts(r, b, "<Namespace>"); return; }
        jb_puts(r, b, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) jb_puts(r, b, ", ");
            jv_write_repr(r, b, v.u.d->k[i]);
            jb_puts(r, b, ": ");
            jv_write_repr(r, b, v.u.d->v[i]);
        }
        jb_puts(r, b, "}");
        return;
    case JV_MACRO: jb_puts(r, b, "<macro>"); return;
    default: jb_puts(r, b, "<function>"); return;
    }
}

jv jv_to_str(jrender *r, jv v) {
    if (v.t == JV_STR) return v;
    jbuf b = JB_SCRATCH(r);
    jv_write_str(r, &b, v);
    return jb_str(&b);
}

static void write_json_str(jrender *r, jbuf *b, const char *p, size_t n, bool ascii) {
    jb_put(r, b, "\"", 1);
    size_t st = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char tmp[16];
        const char *esc = NULL;
        size_t skip = 1;
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20 || (ascii && c == 0x7f)) { snprintf(tmp, sizeof tmp, "\\u%04x", c); esc = tmp; }
            else if (ascii && c >= 0x80) {
                uint32_t cp = 0;
                int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
                cp = len == 1 ? 0xFFFD : c & (0x3F >> (len - 1));
                for (int k = 1; k < len && i + (size_t)k < n; k++) cp = (cp << 6) | ((unsigned char)p[i + k] & 0x3F);
                skip = (size_t)len;
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
                } else snprintf(tmp, sizeof tmp, "\\u%04x", cp);
                esc = tmp;
            }
        }
        if (esc) {
            jb_put(r, b, p + st, i - st);
            jb_puts(r, b, esc);
            i += skip - 1;
            st = i + 1;
        }
    }
    if (st < n) jb_put(r, b, p + st, n - st);
    jb_put(r, b, "\"", 1);
}

static void json_nl(jrender *r, jbuf *b, const jjson_opt *o, int level) {
    jb_put(r, b, "\n", 1);
    for (int i = 0; i < o->indent * level; i++) jb_put(r, b, " ", 1);
}

static int key_cmp(const void *x, const void *y) {
    const jv *a = *(const jv *const *)x, *b = *(const jv *const *)y;
    if (a->t != JV_STR || b->t != JV_STR) return 0;
    size_t n = TERN_MIN(a->u.s.n, b->u.s.n);
    int c = memcmp(a->u.s.p, b->u.s.p, n);
    return c ? c : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
}

void jv_write_json(jrender *r, jbuf *b, jv v, const jjson_opt *o, int level) {
    if (level > r->lim.max_depth) jr_fail(r, TERN_EINVAL, "%s: tojson: value nested too deeply", r->tname);
    switch (v.t) {
    case JV_NONE: jb_puts(r, b, "null"); return;
    case JV_BOOL: jb_puts(r, b, v.u.b ? "true" : "false"); return;
    case JV_INT: write_int(r, b, v.u.i); return;
    case JV_FLOAT:
        if (isnan(v.u.f)) jb_puts(r, b, "NaN");
        else if (isinf(v.u.f)) jb_puts(r, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else jv_write_float(b, v.u.f, r);
        return;
    case JV_STR: write_json_str(r, b, v.u.s.p, v.u.s.n, o->ensure_ascii); return;
    case JV_LIST:
        if (!v.u.l->n) { jb_puts(r, b, "[]"); return; }
        jb_puts(r, b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jb_puts(r, b, o->item_sep);
            if (o->indent >= 0) json_nl(r, b, o, level + 1);
            jv_write_json(r, b, v.u.l->v[i], o, level + 1);
        }
        if (o->indent >= 0) json_nl(r, b, o, level);
        jb_puts(r, b, "]");
        return;
    case JV_DICT: {
        jdict *d = v.u.d;
        if (!d->n) { jb_puts(r, b, "{}"); return; }
        const jv **keys = jj_alloc(&r->arena, d->n * sizeof(jv *));
        for (size_t i = 0; i < d->n; i++) keys[i] = &d->k[i];
        if (o->sort_keys) qsort(keys, d->n, sizeof *keys, key_cmp); /* not stable; keys are unique */
        jb_puts(r, b, "{");
        for (size_t i = 0; i < d->n; i++) {
            size_t idx = (size_t)(keys[i] - d->k);
            if (i) jb_puts(r, b, o->item_sep);
            if (o->indent >= 0) json_nl(r, b, o, level + 1);
            jv k = d->k[idx];
            if (k.t == JV_STR) write_json_str(r, b, k.u.s.p, k.u.s.n, o->ensure_ascii);
            else if (k.t == JV_NONE) jb_puts(r, b, "\"null\"");
            else if (k.t == JV_BOOL) jb_puts(r, b, k.u.b ? "\"true\"" : "\"false\"");
            else if (k.t == JV_INT || k.t == JV_FLOAT) {
                jb_puts(r, b, "\"");
                jv_write_json(r, b, k, o, level + 1);
                jb_puts(r, b, "\"");
            } else jr_fail(r, TERN_EINVAL, "%s: tojson: keys must be str, int, float, bool or None", r->tname);
            jb_puts(r, b, o->key_sep);
            jv_write_json(r, b, d->v[idx], o, level + 1);
        }
        if (o->indent >= 0) json_nl(r, b, o, level);
        jb_puts(r, b, "}");
        return;
    }
    default:
        jr_fail(r, TERN_EINVAL, "%s:%d: tojson: object of type %s is not JSON serializable", r->tname, r->line,
                jv_type_name(v));
    }
}

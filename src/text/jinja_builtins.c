/*
 * jinja_builtins.c — globals, tests, filters and the Python methods that chat templates call.
 *
 * Globals: range, namespace, dict, raise_exception (-> TERN_EINVAL carrying the template's
 * message verbatim), strftime_now (local time, C strftime).
 * Methods: str.strip/lstrip/rstrip/split/rsplit/startswith/endswith/upper/lower/title/
 * capitalize/replace/find/count/join/format('{}')/splitlines/isdigit/isalpha/isspace,
 * dict.get/items/keys/values/update/pop/copy, list.append/extend/pop/insert/index/count,
 * loop.cycle.
 * Filters follow Jinja2 3.1 (defaults included: dictsort/sort/unique are case-insensitive,
 * default() only replaces undefined unless boolean=true, round() returns a float) with the
 * transformers `tojson` (json.dumps, ensure_ascii=False by default).
 * Unicode: case mapping via utf8proc (plus ß -> SS); whitespace = Python str.isspace().
 */
#include "text/jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#define A (&r->arena)
#define FAIL(...) jr_fail(r, TERN_EINVAL, __VA_ARGS__)

/* ---------------- small helpers ---------------- */

static bool eqs(const char *a, const char *b) { return !strcmp(a, b); }

static size_t u8dec(const char *p, size_t n, int32_t *cp) {
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)n, cp);
    if (k <= 0) { *cp = (unsigned char)p[0]; return 1; }
    return (size_t)k;
}
static void u8put(jrender *r, jbuf *b, int32_t cp) {
    utf8proc_uint8_t t[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, t);
    jb_put(r, b, (const char *)t, (size_t)k);
}
static bool py_space(int32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}
static bool cased(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

jv jj_str_case(jrender *r, jv s, int mode) {
    jbuf b = JB_SCRATCH(r);
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s.u.s.n;) {
        int32_t c;
        i += u8dec(s.u.s.p + i, s.u.s.n - i, &c);
        int32_t o;
        if (mode == CASE_UPPER || (mode == CASE_TITLE && !prev_cased) || (mode == CASE_CAP && first)) {
            if (c == 0xDF) { jb_put(r, &b, mode == CASE_UPPER ? "SS" : "Ss", 2); prev_cased = true; first = false; continue; }
            o = mode == CASE_UPPER ? utf8proc_toupper(c) : utf8proc_totitle(c);
        } else o = utf8proc_tolower(c);
        prev_cased = cased(c);
        first = false;
        u8put(r, &b, o);
    }
    return jb_str(&b);
}

jv jj_str_strip(jrender *r, jv s, jv chars, bool left, bool right) {
    const char *p = s.u.s.p;
    size_t lo = 0, hi = s.u.s.n;
    (void)r;
    bool any = chars.t == JV_STR;
    for (;;) { /* left */
        if (!left || lo >= hi) break;
        int32_t c;
        size_t k = u8dec(p + lo, hi - lo, &c);
        bool strip = any ? memmem(chars.u.s.p, chars.u.s.n, p + lo, k) != NULL : py_space(c);
        if (!strip) break;
        lo += k;
    }
    while (right && hi > lo) {
        size_t st = hi - 1;
        while (st > lo && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
        int32_t c;
        size_t k = u8dec(p + st, hi - st, &c);
        bool strip = any ? memmem(chars.u.s.p, chars.u.s.n, p + st, k) != NULL : py_space(c);
        if (!strip) break;
        hi = st;
    }
    return jv_strn(p + lo, hi - lo);
}

static jv str_split(jrender *r, jv s, jv sep, int64_t maxsplit, bool from_right) {
    jv out = jv_new_list(A);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (sep.t == JV_STR && !sep.u.s.n) FAIL("%s:%d: split: empty separator", r->tname, r->line);
    if (sep.t != JV_STR) { /* whitespace runs */
        size_t i = 0;
        int64_t count = 0;
        if (from_right) from_right = false; /* rsplit() without sep: same result unless maxsplit */
        while (i < n) {
            int32_t c;
            size_t k;
            while (i < n && (k = u8dec(p + i, n - i, &c), py_space(c))) i += k;
            if (i >= n) break;
            if (maxsplit >= 0 && count == maxsplit) {
                size_t e = n;
                while (e > i) { size_t st = e - 1; while (st > i && ((unsigned char)p[st] & 0xC0) == 0x80) st--; u8dec(p + st, e - st, &c); if (!py_space(c)) break; e = st; }
                jv_list_push(A, out.u.l, jv_strn(p + i, e - i));
                break;
            }
            size_t st = i;
            while (i < n && (k = u8dec(p + i, n - i, &c), !py_space(c))) i += k;
            jv_list_push(A, out.u.l, jv_strn(p + st, i - st));
            count++;
        }
        return out;
    }
    const char *sp = sep.u.s.p;
    size_t sn = sep.u.s.n;
    if (!from_right || maxsplit < 0) {
        size_t st = 0;
        int64_t count = 0;
        for (;;) {
            const char *f = maxsplit >= 0 && count >= maxsplit ? NULL : memmem(p + st, n - st, sp, sn);
            if (!f) { jv_list_push(A, out.u.l, jv_strn(p + st, n - st)); break; }
            jv_list_push(A, out.u.l, jv_strn(p + st, (size_t)(f - p) - st));
            st = (size_t)(f - p) + sn;
            count++;
        }
        return out;
    }
    /* rsplit with maxsplit: collect from the right, then reverse */
    jv rev = jv_new_list(A);
    size_t end = n;
    int64_t count = 0;
    for (;;) {
        const char *f = NULL;
        if (count < maxsplit && end >= sn)
            for (size_t i = end - sn + 1; i-- > 0;)
                if (!memcmp(p + i, sp, sn)) { f = p + i; break; }
        if (!f) { jv_list_push(A, rev.u.l, jv_strn(p, end)); break; }
        jv_list_push(A, rev.u.l, jv_strn(f + sn, end - (size_t)(f - p) - sn));
        end = (size_t)(f - p);
        count++;
    }
    for (size_t i = rev.u.l->n; i-- > 0;) jv_list_push(A, out.u.l, rev.u.l->v[i]);
    return out;
}

jv jj_str_replace(jrender *r, jv s, jv old, jv new_, int64_t count) {
    if (old.t != JV_STR || new_.t != JV_STR) FAIL("%s:%d: replace() needs string arguments", r->tname, r->line);
    jbuf b = JB_SCRATCH(r);
    size_t st = 0;
    int64_t done = 0;
    if (!old.u.s.n) { /* Python inserts new between every character */
        for (size_t i = 0; i <= s.u.s.n; done++) {
            if (count >= 0 && done >= count) { jb_put(r, &b, s.u.s.p + i, s.u.s.n - i); break; }
            jb_put(r, &b, new_.u.s.p, new_.u.s.n);
            if (i == s.u.s.n) break;
            size_t j = i + 1;
            while (j < s.u.s.n && ((unsigned char)s.u.s.p[j] & 0xC0) == 0x80) j++;
            jb_put(r, &b, s.u.s.p + i, j - i);
            i = j;
        }
        return jb_str(&b);
    }
    for (;;) {
        const char *f = count >= 0 && done >= count ? NULL : memmem(s.u.s.p + st, s.u.s.n - st, old.u.s.p, old.u.s.n);
        if (!f) break;
        jb_put(r, &b, s.u.s.p + st, (size_t)(f - s.u.s.p) - st);
        jb_put(r, &b, new_.u.s.p, new_.u.s.n);
        st = (size_t)(f - s.u.s.p) + old.u.s.n;
        done++;
    }
    jb_put(r, &b, s.u.s.p + st, s.u.s.n - st);
    return jb_str(&b);
}

static bool str_prefix(jv s, jv x, bool suffix) {
    if (x.t != JV_STR || x.u.s.n > s.u.s.n) return false;
    return !memcmp(s.u.s.p + (suffix ? s.u.s.n - x.u.s.n : 0), x.u.s.p, x.u.s.n);
}

jv jj_kwarg(const char **kwn, jv *kwv, int nkw, const char *name, jv *pos, int npos, int idx, jv def) {
    for (int i = 0; i < nkw; i++)
        if (eqs(kwn[i], name)) return kwv[i];
    if (idx >= 0 && idx < npos) return pos[idx];
    return def;
}
#define ARG(name, idx, def) jj_kwarg(kwn, kwv, nkw, name, pos, npos, idx, def)

int64_t jj_want_int(jrender *r, jv v, const char *what) {
    if (v.t == JV_INT) return v.u.i;
    if (v.t == JV_BOOL) return v.u.b;
    FAIL("%s:%d: %s must be an integer, got %s", r->tname, r->line, what, jv_type_name(v));
}

/* ---------------- globals ---------------- */

int jj_global_fn(const char *name, size_t len) {
    static const struct { const char *n; int fn; } g[] = {
        {"range", FN_RANGE}, {"namespace", FN_NAMESPACE}, {"dict", FN_DICT},
        {"raise_exception", FN_RAISE}, {"strftime_now", FN_STRFTIME}};
    for (size_t i = 0; i < TERN_ARRAY_LEN(g); i++)
        if (strlen(g[i].n) == len && !memcmp(g[i].n, name, len)) return g[i].fn;
    return 0;
}

jv jj_call_global(jrender *r, int fn, jv *pos, int npos, const char **kwn, jv *kwv, int nkw) {
    switch (fn) {
    case FN_RANGE: {
        if (npos < 1 || npos > 3) FAIL("%s:%d: range() takes 1 to 3 arguments", r->tname, r->line);
        int64_t a = 0, b, s = 1;
        if (npos == 1) b = jj_want_int(r, pos[0], "range() argument");
        else { a = jj_want_int(r, pos[0], "range() start"); b = jj_want_int(r, pos[1], "range() stop"); }
        if (npos == 3) s = jj_want_int(r, pos[2], "range() step");
        if (!s) FAIL("%s:%d: range() step must not be zero", r->tname, r->line);
        jv l = jv_new_list(A);
        uint64_t cnt = 0;
        for (int64_t i = a; s > 0 ? i < b : i > b;) {
            if (++cnt > r->lim.max_steps) FAIL("%s:%d: range() too large", r->tname, r->line);
            jv_list_push(A, l.u.l, jv_int(i));
            if (__builtin_add_overflow(i, s, &i)) break; /* range(0, 2**63-1, 2**62): no signed overflow */
        }
        return l;
    }
    case FN_NAMESPACE: case FN_DICT: {
        jv d = jv_new_dict(A);
        d.u.d->ns = fn == FN_NAMESPACE;
        for (int i = 0; i < npos; i++) {
            if (pos[i].t != JV_DICT) FAIL("%s:%d: %s() positional argument must be a mapping", r->tname, r->line, fn == FN_DICT ? "dict" : "namespace");
            for (size_t k = 0; k < pos[i].u.d->n; k++) jv_dict_set(A, d.u.d, pos[i].u.d->k[k], pos[i].u.d->v[k]);
        }
        for (int i = 0; i < nkw; i++) jv_dict_set(A, d.u.d, jv_cstr(kwn[i]), kwv[i]);
        return d;
    }
    case FN_RAISE: {
        jv m = npos ? jv_to_str(r, pos[0]) : jv_cstr("raise_exception() called");
        jr_fail(r, TERN_EINVAL, "%.*s", (int)TERN_MIN(m.u.s.n, 480), m.u.s.p);
    }
    case FN_STRFTIME: {
        if (npos < 1 || pos[0].t != JV_STR) FAIL("%s:%d: strftime_now() needs a format string", r->tname, r->line);
        char fmt[256], out[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)TERN_MIN(pos[0].u.s.n, 255), pos[0].u.s.p);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t k = strftime(out, sizeof out, fmt, &tm);
        return jv_str_copy(A, out, k);
    }
    }
    FAIL("%s:%d: unknown function", r->tname, r->line);
}

/* ---------------- methods ---------------- */

static const char *const str_methods[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
    "upper", "lower", "title", "capitalize", "replace", "find", "count", "join", "format", "splitlines", "isdigit",
    "isalpha", "isspace", NULL};
static const char *const dict_methods[] = {"get", "items", "keys", "values", "update", "pop", "copy", "setdefault", NULL};
static const char *const list_methods[] = {"append", "extend", "pop", "insert", "index", "count", "copy", NULL};

static bool in_set(const char *const *set, const char *name, size_t len) {
    for (int i = 0; set[i]; i++)
        if (strlen(set[i]) == len && !memcmp(set[i], name, len)) return true;
    return false;
}

bool jj_has_method(jv self, const char *name, size_t len) {
    if (self.t == JV_STR) return in_set(str_methods, name, len);
    if (self.t == JV_DICT && !self.u.d->ns) return in_set(dict_methods, name, len);
    if (self.t == JV_LIST) return in_set(list_methods, name, len);
    return false;
}

jv jj_dict_items(jrender *r, jdict *d) {
    jv l = jv_new_list(A);
    for (size_t i = 0; i < d->n; i++) {
        jv t = jv_new_list(A);
        t.u.l->tuple = true;
        jv_list_push(A, t.u.l, d->k[i]);
        jv_list_push(A, t.u.l, d->v[i]);
        jv_list_push(A, l.u.l, t);
    }
    return l;
}

jv jj_call_method(jrender *r, jv self, const char *name, jv *pos, int npos, const char **kwn, jv *kwv, int nkw) {
    jv none = jv_none();
    if (self.t == JV_LOOP) { /* loop.cycle */
        if (!npos) FAIL("%s:%d: loop.cycle() needs arguments", r->tname, r->line);
        return pos[self.u.lp->i % (size_t)npos];
    }
    if (self.t == JV_STR) {
        if (eqs(name, "strip")) return jj_str_strip(r, self, ARG("chars", 0, none), true, true);
        if (eqs(name, "lstrip")) return jj_str_strip(r, self, ARG("chars", 0, none), true, false);
        if (eqs(name, "rstrip")) return jj_str_strip(r, self, ARG("chars", 0, none), false, true);
        if (eqs(name, "split") || eqs(name, "rsplit")) {
            jv ms = ARG("maxsplit", 1, jv_int(-1));
            return str_split(r, self, ARG("sep", 0, none), jj_want_int(r, ms, "maxsplit"), name[0] == 'r');
        }
        if (eqs(name, "startswith") || eqs(name, "endswith")) {
            jv x = ARG("prefix", 0, none);
            bool suf = name[0] == 'e';
            if (x.t == JV_LIST) {
                for (size_t i = 0; i < x.u.l->n; i++)
                    if (str_prefix(self, x.u.l->v[i], suf)) return jv_bool(true);
                return jv_bool(false);
            }
            if (x.t != JV_STR) FAIL("%s:%d: %s() needs a string", r->tname, r->line, name);
            return jv_bool(str_prefix(self, x, suf));
        }
        if (eqs(name, "upper")) return jj_str_case(r, self, CASE_UPPER);
        if (eqs(name, "lower")) return jj_str_case(r, self, CASE_LOWER);
        if (eqs(name, "title")) return jj_str_case(r, self, CASE_TITLE);
        if (eqs(name, "capitalize")) return jj_str_case(r, self, CASE_CAP);
        if (eqs(name, "replace"))
            return jj_str_replace(r, self, ARG("old", 0, none), ARG("new", 1, none),
                               jj_want_int(r, ARG("count", 2, jv_int(-1)), "count"));
        if (eqs(name, "find") || eqs(name, "count")) {
            jv x = ARG("sub", 0, none);
            if (x.t != JV_STR) FAIL("%s:%d: %s() needs a string", r->tname, r->line, name);
            if (eqs(name, "find")) {
                if (!x.u.s.n) return jv_int(0);
                const char *f = memmem(self.u.s.p, self.u.s.n, x.u.s.p, x.u.s.n);
                return jv_int(f ? (int64_t)jj_utf8_len(self.u.s.p, (size_t)(f - self.u.s.p)) : -1);
            }
            if (!x.u.s.n) return jv_int((int64_t)jj_utf8_len(self.u.s.p, self.u.s.n) + 1);
            int64_t c = 0;
            for (const char *p = self.u.s.p, *e = p + self.u.s.n; (p = memmem(p, (size_t)(e - p), x.u.s.p, x.u.s.n)); p += x.u.s.n) c++;
            return jv_int(c);
        }
        if (eqs(name, "join")) {
            jv l = jj_as_list(r, ARG("iterable", 0, none));
            jbuf b = JB_SCRATCH(r);
            for (size_t i = 0; i < l.u.l->n; i++) {
                if (i) jb_put(r, &b, self.u.s.p, self.u.s.n);
                jv_write_str(r, &b, l.u.l->v[i]);
            }
            return jb_str(&b);
        }
        if (eqs(name, "format")) { /* '{}' and '{0}' placeholders only */
            jbuf b = JB_SCRATCH(r);
            int auto_i = 0;
            for (size_t i = 0; i < self.u.s.n; i++) {
                char c = self.u.s.p[i];
                if (c == '{' && i + 1 < self.u.s.n && self.u.s.p[i + 1] == '{') { jb_put(r, &b, "{", 1); i++; continue; }
                if (c == '}' && i + 1 < self.u.s.n && self.u.s.p[i + 1] == '}') { jb_put(r, &b, "}", 1); i++; continue; }
                if (c != '{') { jb_put(r, &b, &c, 1); continue; }
                const char *e = memchr(self.u.s.p + i, '}', self.u.s.n - i);
                if (!e) { FAIL("%s:%d: format(): unmatched '{'", r->tname, r->line); }
                size_t fl = (size_t)(e - self.u.s.p) - i - 1;
                jv v;
                if (!fl) v = auto_i < npos ? pos[auto_i++] : jv_undef();
                else if (self.u.s.p[i + 1] >= '0' && self.u.s.p[i + 1] <= '9') {
                    int k = atoi(self.u.s.p + i + 1);
                    v = k < npos ? pos[k] : jv_undef();
                } else v = ARG(jj_strndup(A, self.u.s.p + i + 1, fl), -1, jv_undef());
                jv_write_str(r, &b, v);
                i = (size_t)(e - self.u.s.p);
            }
            return jb_str(&b);
        }
        if (eqs(name, "splitlines")) {
            jv out = jv_new_list(A);
            size_t st = 0, n = self.u.s.n;
            const char *p = self.u.s.p;
            for (size_t i = 0; i < n; i++) {
                if (p[i] == '\n' || p[i] == '\r') {
                    jv_list_push(A, out.u.l, jv_strn(p + st, i - st));
                    if (p[i] == '\r' && i + 1 < n && p[i + 1] == '\n') i++;
                    st = i + 1;
                }
            }
            if (st < n) jv_list_push(A, out.u.l, jv_strn(p + st, n - st));
            return out;
        }
        if (eqs(name, "isdigit") || eqs(name, "isalpha") || eqs(name, "isspace")) {
            if (!self.u.s.n) return jv_bool(false);
            for (size_t i = 0; i < self.u.s.n;) {
                int32_t c;
                i += u8dec(self.u.s.p + i, self.u.s.n - i, &c);
                utf8proc_category_t k = utf8proc_category(c);
                bool ok = name[2] == 'd' ? k == UTF8PROC_CATEGORY_ND
                        : name[2] == 'a' ? (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) : py_space(c);
                if (!ok) return jv_bool(false);
            }
            return jv_bool(true);
        }
    }
    if (self.t == JV_DICT) {
        jdict *d = self.u.d;
        if (eqs(name, "get")) {
            bool f;
            jv v = jv_dict_get(d, ARG("key", 0, none), &f);
            return f ? v : ARG("default", 1, none);
        }
        if (eqs(name, "items")) return jj_dict_items(r, d);
        if (eqs(name, "keys") || eqs(name, "values")) {
            jv l = jv_new_list(A);
            for (size_t i = 0; i < d->n; i++) jv_list_push(A, l.u.l, name[0] == 'k' ? d->k[i] : d->v[i]);
            return l;
        }
        if (eqs(name, "update")) {
            for (int i = 0; i < npos; i++)
                if (pos[i].t == JV_DICT)
                    for (size_t k = 0; k < pos[i].u.d->n; k++) jv_dict_set(A, d, pos[i].u.d->k[k], pos[i].u.d->v[k]);
            for (int i = 0; i < nkw; i++) jv_dict_set(A, d, jv_cstr(kwn[i]), kwv[i]);
            return none;
        }
        if (eqs(name, "pop")) {
            bool f;
            jv k = ARG("key", 0, none), v = jv_dict_get(d, k, &f);
            if (!f) {
                if (npos > 1) return pos[1];
                FAIL("%s:%d: pop(): key not found", r->tname, r->line);
            }
            size_t i = 0;
            while (!jv_equal(d->k[i], k)) i++;
            memmove(d->k + i, d->k + i + 1, (d->n - i - 1) * sizeof(jv));
            memmove(d->v + i, d->v + i + 1, (d->n - i - 1) * sizeof(jv));
            d->n--;
            return v;
        }
        if (eqs(name, "setdefault")) {
            bool f;
            jv k = ARG("key", 0, none), v = jv_dict_get(d, k, &f);
            if (f) return v;
            v = ARG("default", 1, none);
            jv_dict_set(A, d, k, v);
            return v;
        }
        if (eqs(name, "copy")) {
            jv c = jv_new_dict(A);
            for (size_t i = 0; i < d->n; i++) jv_dict_set(A, c.u.d, d->k[i], d->v[i]);
            return c;
        }
    }
    if (self.t == JV_LIST) {
        jlist *l = self.u.l;
        if (eqs(name, "append")) { if (npos != 1) FAIL("%s:%d: append() takes one argument", r->tname, r->line); jv_list_push(A, l, pos[0]); return none; }
        if (eqs(name, "extend")) {
            jv x = jj_as_list(r, ARG("iterable", 0, none));
            size_t n = x.u.l->n;
            for (size_t i = 0; i < n; i++) jv_list_push(A, l, x.u.l->v[i]);
            return none;
        }
        if (eqs(name, "pop")) {
            if (!l->n) FAIL("%s:%d: pop from empty list", r->tname, r->line);
            int64_t i = jj_want_int(r, ARG("index", 0, jv_int(-1)), "index");
            if (i < 0) i += (int64_t)l->n;
            if (i < 0 || i >= (int64_t)l->n) FAIL("%s:%d: pop index out of range", r->tname, r->line);
            jv v = l->v[i];
            memmove(l->v + i, l->v + i + 1, (l->n - (size_t)i - 1) * sizeof(jv));
            l->n--;
            return v;
        }
        if (eqs(name, "insert")) {
            int64_t i = jj_want_int(r, ARG("index", 0, jv_int(0)), "index"), n = (int64_t)l->n;
            if (i < 0) i = i + n < 0 ? 0 : i + n;
            if (i > n) i = n;
            jv_list_push(A, l, none);
            memmove(l->v + i + 1, l->v + i, (size_t)(n - i) * sizeof(jv));
            l->v[i] = ARG("object", 1, none);
            return none;
        }
        if (eqs(name, "index") || eqs(name, "count")) {
            jv x = ARG("value", 0, none);
            int64_t c = 0;
            for (size_t i = 0; i < l->n; i++)
                if (jv_equal(l->v[i], x)) { if (name[0] == 'i') return jv_int((int64_t)i); c++; }
            if (name[0] == 'i') FAIL("%s:%d: index(): value not in list", r->tname, r->line);
            return jv_int(c);
        }
        if (eqs(name, "copy")) {
            jv c = jv_new_list(A);
            for (size_t i = 0; i < l->n; i++) jv_list_push(A, c.u.l, l->v[i]);
            return c;
        }
    }
    FAIL("%s:%d: %s has no method '%s'", r->tname, r->line, jv_type_name(self), name);
}

/* ---------------- tests ---------------- */

bool jj_apply_test(jrender *r, const char *name, jv v, jv *pos, int npos) {
    jv a = npos ? pos[0] : jv_undef();
    if (eqs(name, "defined")) return v.t != JV_UNDEF;
    if (eqs(name, "undefined")) return v.t == JV_UNDEF;
    if (eqs(name, "none")) return v.t == JV_NONE;
    if (eqs(name, "boolean")) return v.t == JV_BOOL;
    if (eqs(name, "true")) return v.t == JV_BOOL && v.u.b;
    if (eqs(name, "false")) return v.t == JV_BOOL && !v.u.b;
    if (eqs(name, "integer")) return v.t == JV_INT;
    if (eqs(name, "float")) return v.t == JV_FLOAT;
    if (eqs(name, "number")) return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
    if (eqs(name, "string")) return v.t == JV_STR;
    if (eqs(name, "mapping")) return v.t == JV_DICT && !v.u.d->ns;
    if (eqs(name, "iterable")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    if (eqs(name, "sequence")) return v.t == JV_STR || v.t == JV_LIST || (v.t == JV_DICT && !v.u.d->ns) || v.t == JV_UNDEF;
    if (eqs(name, "callable")) return v.t == JV_MACRO || v.t == JV_METHOD || v.t == JV_FUNC;
    if (eqs(name, "sameas")) {
        if (v.t != a.t) return false;
        if (v.t == JV_LIST) return v.u.l == a.u.l;
        if (v.t == JV_DICT) return v.u.d == a.u.d;
        if (v.t == JV_STR) return v.u.s.p == a.u.s.p && v.u.s.n == a.u.s.n;
        return jv_equal(v, a);
    }
    if (eqs(name, "eq") || eqs(name, "equalto") || eqs(name, "==")) return jv_equal(v, a);
    if (eqs(name, "ne") || eqs(name, "!=")) return !jv_equal(v, a);
    if (eqs(name, "lt") || eqs(name, "lessthan") || eqs(name, "<")) return jv_cmp(r, v, a) < 0;
    if (eqs(name, "le") || eqs(name, "<=")) return jv_cmp(r, v, a) <= 0;
    if (eqs(name, "gt") || eqs(name, "greaterthan") || eqs(name, ">")) return jv_cmp(r, v, a) > 0;
    if (eqs(name, "ge") || eqs(name, ">=")) return jv_cmp(r, v, a) >= 0;
    if (eqs(name, "in")) {
        if (a.t == JV_STR) return v.t == JV_STR && (!v.u.s.n || memmem(a.u.s.p, a.u.s.n, v.u.s.p, v.u.s.n));
        jv l = jj_as_list(r, a);
        for (size_t i = 0; i < l.u.l->n; i++)
            if (jv_equal(l.u.l->v[i], v)) return true;
        return false;
    }
    if (eqs(name, "odd") || eqs(name, "even")) {
        int64_t i = jj_want_int(r, v, "odd/even test value");
        return (i % 2 != 0) == (name[0] == 'o');
    }
    if (eqs(name, "divisibleby")) {
        int64_t d = jj_want_int(r, a, "divisibleby argument");
        if (!d) FAIL("%s:%d: divisibleby 0", r->tname, r->line);
        return jj_want_int(r, v, "divisibleby value") % d == 0;
    }
    if (eqs(name, "lower") || eqs(name, "upper")) {
        if (v.t != JV_STR) return false;
        jv c = jj_str_case(r, v, name[0] == 'l' ? CASE_LOWER : CASE_UPPER);
        return jv_equal(c, v);
    }
    if (eqs(name, "escaped")) return false;
    FAIL("%s:%d: unknown test '%s'", r->tname, r->line, name);
}

/* filters live in jinja_filters.c */

/*
 * jinja_filters.c — Jinja2 filters used by chat templates (semantics of Jinja2 3.1 plus the
 * transformers `tojson`):
 *   tojson(indent, ensure_ascii=False, separators, sort_keys)  trim/strip(chars)  upper lower
 *   capitalize title  length/count  items  dictsort(case_sensitive=False, by='key', reverse)
 *   join(d='', attribute)  first last  default/d(v='', boolean=False)  list string int float
 *   bool  replace(old, new, count)  map(filter, args | attribute=, default=)  select/reject(test,
 *   args)  selectattr/rejectattr(attr, test, args)  unique(case_sensitive=False, attribute)
 *   sort(reverse, case_sensitive, attribute)  reverse  sum(attribute, start)  min max  abs
 *   round(precision=0, method='common')  indent(width=4, first=False, blank=False)  wordcount
 *   batch(n, fill_with)  safe  escape/e  center(width).
 * Sorting is a stable merge sort; case-insensitive keys compare str.lower() of strings.
 */
#include "text/jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define A (&r->arena)
#define FAIL(...) jr_fail(r, TERN_EINVAL, __VA_ARGS__)
#define ARG(name, idx, def) jj_kwarg(kwn, kwv, nkw, name, pos, npos, idx, def)

static bool eqs(const char *a, const char *b) { return !strcmp(a, b); }

/* attribute path "a.b.0" */
static jv attr_path(jrender *r, jv v, jv path) {
    if (path.t == JV_INT) return jj_getitem(r, v, path);
    if (path.t != JV_STR) FAIL("%s:%d: attribute must be a string", r->tname, r->line);
    const char *p = path.u.s.p, *e = p + path.u.s.n;
    while (p <= e) {
        const char *d = memchr(p, '.', (size_t)(e - p));
        if (!d) d = e;
        size_t n = (size_t)(d - p);
        bool digits = n > 0;
        for (size_t i = 0; i < n; i++) digits &= p[i] >= '0' && p[i] <= '9';
        if (v.t == JV_UNDEF) return v;
        v = digits ? jj_getitem(r, v, jv_int(atoll(p))) : jj_getitem(r, v, jv_strn(p, n));
        p = d + 1;
    }
    return v;
}

typedef struct skey { jv key; size_t idx; } skey;
static int skey_cmp(jrender *r, const skey *a, const skey *b) {
    int c = jv_cmp(r, a->key, b->key);
    return c ? c : (a->idx > b->idx) - (a->idx < b->idx);
}
static void msort(jrender *r, skey *v, skey *tmp, size_t n, bool rev) {
    if (n < 2) return;
    size_t h = n / 2;
    msort(r, v, tmp, h, rev);
    msort(r, v + h, tmp, n - h, rev);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int c = jv_cmp(r, v[i].key, v[j].key);
        if (rev) c = -c;
        if (c <= 0) tmp[k++] = v[i++];
        else tmp[k++] = v[j++];
    }
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
    (void)skey_cmp;
}
static jv fold(jrender *r, jv k, bool cs) { return !cs && k.t == JV_STR ? jj_str_case(r, k, CASE_LOWER) : k; }

/* Sort list `l` by key(item) (stable); returns a new list. pair: 0 the item itself, 1 its
 * [0] (dictsort by key), 2 its [1] (by value). */
static jv sort_list(jrender *r, jlist *l, jv attr, int pair, bool cs, bool rev) {
    skey *v = jj_alloc(A, (l->n + 1) * sizeof *v), *tmp = jj_alloc(A, (l->n + 1) * sizeof *tmp);
    for (size_t i = 0; i < l->n; i++) {
        jv k = l->v[i];
        if (attr.t != JV_UNDEF && attr.t != JV_NONE) k = attr_path(r, k, attr);
        else if (pair) k = k.u.l->v[pair - 1];
        v[i].key = fold(r, k, cs);
        v[i].idx = i;
    }
    msort(r, v, tmp, l->n, rev);
    jv out = jv_new_list(A);
    for (size_t i = 0; i < l->n; i++) jv_list_push(A, out.u.l, l->v[v[i].idx]);
    return out;
}

static jv html_escape(jrender *r, jv s) {
    jbuf b = JB_SCRATCH(r);
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;"
                      : c == '\'' ? "&#39;" : NULL;
        if (e) jb_put(r, &b, e, strlen(e));
        else jb_put(r, &b, &c, 1);
    }
    return jb_str(&b);
}

static jv do_round(jrender *r, jv v, int64_t prec, const char *method) {
    double x = jv_num(v), m = pow(10.0, (double)prec), y;
    if (!jv_is_num(v)) FAIL("%s:%d: round of a %s", r->tname, r->line, jv_type_name(v));
    if (eqs(method, "common")) y = nearbyint(x * m) / m; /* Python round(): half to even */
    else if (eqs(method, "ceil")) y = ceil(x * m) / m;
    else if (eqs(method, "floor")) y = floor(x * m) / m;
    else FAIL("%s:%d: round: method must be common, ceil or floor", r->tname, r->line);
    return jv_float(y);
}

jv jj_apply_filter(jrender *r, jscope *sc, const char *name, jv v, jv *pos, int npos, const char **kwn, jv *kwv,
                   int nkw) {
    jv none = jv_none(), undef = jv_undef();
    (void)sc;
    if (eqs(name, "safe")) return v;
    if (eqs(name, "default") || eqs(name, "d")) {
        jv def = ARG("default_value", 0, jv_cstr(""));
        bool boolean = jv_truthy(ARG("boolean", 1, jv_bool(false)));
        if (v.t == JV_UNDEF || (boolean && !jv_truthy(v))) return def;
        return v;
    }
    if (eqs(name, "tojson")) {
        jjson_opt o = {false, false, -1, ", ", ": "};
        o.ensure_ascii = jv_truthy(ARG("ensure_ascii", -1, jv_bool(false)));
        o.sort_keys = jv_truthy(ARG("sort_keys", -1, jv_bool(false)));
        jv ind = ARG("indent", 0, none);
        if (ind.t == JV_INT) { o.indent = (int)TERN_MAX(0, TERN_MIN(ind.u.i, 64)); o.item_sep = ","; }
        else if (ind.t == JV_STR) FAIL("%s:%d: tojson: string indent is not supported", r->tname, r->line);
        jv sep = ARG("separators", -1, none);
        if (sep.t == JV_LIST && sep.u.l->n == 2 && sep.u.l->v[0].t == JV_STR && sep.u.l->v[1].t == JV_STR) {
            o.item_sep = jj_strndup(A, sep.u.l->v[0].u.s.p, sep.u.l->v[0].u.s.n);
            o.key_sep = jj_strndup(A, sep.u.l->v[1].u.s.p, sep.u.l->v[1].u.s.n);
        }
        if (v.t == JV_UNDEF) FAIL("%s:%d: tojson of an undefined value", r->tname, r->line);
        jbuf b = JB_SCRATCH(r);
        jv_write_json(r, &b, v, &o, 0);
        return jb_str(&b);
    }
    if (eqs(name, "string")) return jv_to_str(r, v);
    if (eqs(name, "length") || eqs(name, "count")) {
        switch (v.t) {
        case JV_STR: return jv_int((int64_t)jj_utf8_len(v.u.s.p, v.u.s.n));
        case JV_LIST: return jv_int((int64_t)v.u.l->n);
        case JV_DICT: return jv_int((int64_t)v.u.d->n);
        case JV_UNDEF: return jv_int(0);
        default: FAIL("%s:%d: object of type %s has no length", r->tname, r->line, jv_type_name(v));
        }
    }
    if (eqs(name, "list")) {
        jv l = jj_as_list(r, v), out = jv_new_list(A);
        for (size_t i = 0; i < l.u.l->n; i++) jv_list_push(A, out.u.l, l.u.l->v[i]);
        return out;
    }
    if (eqs(name, "items")) {
        if (v.t == JV_UNDEF) return jv_new_list(A);
        if (v.t != JV_DICT) FAIL("%s:%d: items filter needs a mapping, got %s", r->tname, r->line, jv_type_name(v));
        return jj_dict_items(r, v.u.d);
    }
    if (eqs(name, "dictsort")) {
        if (v.t != JV_DICT) FAIL("%s:%d: dictsort needs a mapping, got %s", r->tname, r->line, jv_type_name(v));
        bool cs = jv_truthy(ARG("case_sensitive", 0, jv_bool(false)));
        jv by = ARG("by", 1, jv_cstr("key"));
        bool rev = jv_truthy(ARG("reverse", 2, jv_bool(false)));
        bool by_val = by.t == JV_STR && by.u.s.n == 5 && !memcmp(by.u.s.p, "value", 5);
        return sort_list(r, jj_dict_items(r, v.u.d).u.l, undef, by_val ? 2 : 1, cs, rev);
    }
    if (eqs(name, "first") || eqs(name, "last")) {
        jv l = jj_as_list(r, v);
        if (!l.u.l->n) return undef;
        return l.u.l->v[name[0] == 'f' ? 0 : l.u.l->n - 1];
    }
    if (eqs(name, "join")) {
        jv l = jj_as_list(r, v), d = ARG("d", 0, jv_cstr("")), at = ARG("attribute", 1, undef);
        d = jv_to_str(r, d);
        jbuf b = JB_SCRATCH(r);
        for (size_t i = 0; i < l.u.l->n; i++) {
            if (i) jb_put(r, &b, d.u.s.p, d.u.s.n);
            jv x = l.u.l->v[i];
            if (at.t != JV_UNDEF) x = attr_path(r, x, at);
            jv_write_str(r, &b, x);
        }
        return jb_str(&b);
    }
    if (eqs(name, "int")) {
        jv def = ARG("default", 0, jv_int(0));
        if (v.t == JV_INT) return v;
        if (v.t == JV_BOOL) return jv_int(v.u.b);
        if (v.t == JV_FLOAT) return isfinite(v.u.f) ? jv_int((int64_t)v.u.f) : def;
        if (v.t == JV_STR) {
            char tmp[64];
            snprintf(tmp, sizeof tmp, "%.*s", (int)TERN_MIN(v.u.s.n, 63), v.u.s.p);
            char *end;
            long long i = strtoll(tmp, &end, jj_want_int(r, ARG("base", 1, jv_int(10)), "base"));
            while (*end == ' ' || *end == '\n' || *end == '\t') end++;
            if (end != tmp && !*end) return jv_int(i);
            double d = strtod(tmp, &end);
            if (end != tmp && !*end && isfinite(d)) return jv_int((int64_t)d);
        }
        return def;
    }
    if (eqs(name, "float")) {
        jv def = ARG("default", 0, jv_float(0));
        if (jv_is_num(v)) return jv_float(jv_num(v));
        if (v.t == JV_STR) {
            char tmp[64], *end;
            snprintf(tmp, sizeof tmp, "%.*s", (int)TERN_MIN(v.u.s.n, 63), v.u.s.p);
            double d = strtod(tmp, &end);
            if (end != tmp && !*end) return jv_float(d);
        }
        return def;
    }
    if (eqs(name, "bool")) return jv_bool(jv_truthy(v));
    if (eqs(name, "abs")) {
        if (v.t == JV_INT) return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.t == JV_FLOAT) return jv_float(fabs(v.u.f));
        if (v.t == JV_BOOL) return jv_int(v.u.b);
        FAIL("%s:%d: abs of a %s", r->tname, r->line, jv_type_name(v));
    }
    if (eqs(name, "round")) {
        jv m = ARG("method", 1, jv_cstr("common"));
        char meth[16];
        snprintf(meth, sizeof meth, "%.*s", m.t == JV_STR ? (int)TERN_MIN(m.u.s.n, 15) : 0, m.t == JV_STR ? m.u.s.p : "");
        return do_round(r, v, jj_want_int(r, ARG("precision", 0, jv_int(0)), "precision"), meth);
    }
    if (eqs(name, "reverse")) {
        if (v.t == JV_STR) {
            jv l = jj_as_list(r, v);
            jbuf b = JB_SCRATCH(r);
            for (size_t i = l.u.l->n; i-- > 0;) jb_put(r, &b, l.u.l->v[i].u.s.p, l.u.l->v[i].u.s.n);
            return jb_str(&b);
        }
        jv l = jj_as_list(r, v), out = jv_new_list(A);
        for (size_t i = l.u.l->n; i-- > 0;) jv_list_push(A, out.u.l, l.u.l->v[i]);
        return out;
    }
    if (eqs(name, "sort")) {
        jv l = jj_as_list(r, v);
        return sort_list(r, l.u.l, ARG("attribute", 2, undef), 0,
                         jv_truthy(ARG("case_sensitive", 1, jv_bool(false))), jv_truthy(ARG("reverse", 0, jv_bool(false))));
    }
    if (eqs(name, "unique")) {
        jv l = jj_as_list(r, v), out = jv_new_list(A), seen = jv_new_list(A);
        bool cs = jv_truthy(ARG("case_sensitive", 0, jv_bool(false)));
        jv at = ARG("attribute", 1, undef);
        for (size_t i = 0; i < l.u.l->n; i++) {
            jv k = l.u.l->v[i];
            if (at.t != JV_UNDEF) k = attr_path(r, k, at);
            k = fold(r, k, cs);
            bool dup = false;
            for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = jv_equal(seen.u.l->v[j], k);
            if (dup) continue;
            jv_list_push(A, seen.u.l, k);
            jv_list_push(A, out.u.l, l.u.l->v[i]);
        }
        return out;
    }
    if (eqs(name, "min") || eqs(name, "max")) {
        jv l = jj_as_list(r, v);
        if (!l.u.l->n) return undef;
        bool cs = jv_truthy(ARG("case_sensitive", 0, jv_bool(false)));
        jv at = ARG("attribute", 1, undef);
        size_t best = 0;
        jv bk = fold(r, at.t != JV_UNDEF ? attr_path(r, l.u.l->v[0], at) : l.u.l->v[0], cs);
        for (size_t i = 1; i < l.u.l->n; i++) {
            jv k = fold(r, at.t != JV_UNDEF ? attr_path(r, l.u.l->v[i], at) : l.u.l->v[i], cs);
            int c = jv_cmp(r, k, bk);
            if (name[1] == 'i' ? c < 0 : c > 0) { best = i; bk = k; }
        }
        return l.u.l->v[best];
    }
    if (eqs(name, "sum")) {
        jv l = jj_as_list(r, v), at = ARG("attribute", 0, undef), acc = ARG("start", 1, jv_int(0));
        for (size_t i = 0; i < l.u.l->n; i++) {
            jv x = at.t != JV_UNDEF ? attr_path(r, l.u.l->v[i], at) : l.u.l->v[i];
            if (!jv_is_num(x) || !jv_is_num(acc)) FAIL("%s:%d: sum of a %s", r->tname, r->line, jv_type_name(x));
            int64_t si;
            if (acc.t != JV_FLOAT && x.t != JV_FLOAT &&
                !__builtin_add_overflow(acc.t == JV_INT ? acc.u.i : acc.u.b, x.t == JV_INT ? x.u.i : x.u.b, &si))
                acc = jv_int(si);
            else acc = jv_float(jv_num(acc) + jv_num(x)); /* a float, or an int sum past int64 (as arith's +) */
        }
        return acc;
    }
    if (eqs(name, "map")) {
        jv l = jj_as_list(r, v), out = jv_new_list(A);
        jv at = ARG("attribute", -1, undef);
        if (at.t != JV_UNDEF) {
            jv def = ARG("default", -1, undef);
            for (size_t i = 0; i < l.u.l->n; i++) {
                jv x = attr_path(r, l.u.l->v[i], at);
                jv_list_push(A, out.u.l, x.t == JV_UNDEF ? def : x);
            }
            return out;
        }
        if (npos < 1 || pos[0].t != JV_STR) FAIL("%s:%d: map needs a filter name or attribute=", r->tname, r->line);
        const char *fname = jj_strndup(A, pos[0].u.s.p, pos[0].u.s.n);
        for (size_t i = 0; i < l.u.l->n; i++)
            jv_list_push(A, out.u.l, jj_apply_filter(r, sc, fname, l.u.l->v[i], pos + 1, npos - 1, kwn, kwv, nkw));
        return out;
    }
    if (eqs(name, "select") || eqs(name, "reject") || eqs(name, "selectattr") || eqs(name, "rejectattr")) {
        bool attr = name[6] == 'a', sel = name[0] == 's';
        int skip = attr ? 1 : 0;
        if (attr && npos < 1) FAIL("%s:%d: %s needs an attribute name", r->tname, r->line, name);
        jv l = jj_as_list(r, v), out = jv_new_list(A);
        const char *test = npos > skip && pos[skip].t == JV_STR ? jj_strndup(A, pos[skip].u.s.p, pos[skip].u.s.n) : NULL;
        for (size_t i = 0; i < l.u.l->n; i++) {
            jv x = attr ? attr_path(r, l.u.l->v[i], pos[0]) : l.u.l->v[i];
            bool ok = test ? jj_apply_test(r, test, x, pos + skip + 1, npos - skip - 1) : jv_truthy(x);
            if (ok == sel) jv_list_push(A, out.u.l, l.u.l->v[i]);
        }
        return out;
    }
    if (eqs(name, "batch")) {
        int64_t k = jj_want_int(r, ARG("linecount", 0, jv_int(1)), "linecount");
        if (k < 1) FAIL("%s:%d: batch size must be positive", r->tname, r->line);
        jv fill = ARG("fill_with", 1, undef);
        jv l = jj_as_list(r, v), out = jv_new_list(A), cur = jv_new_list(A);
        for (size_t i = 0; i < l.u.l->n; i++) {
            jv_list_push(A, cur.u.l, l.u.l->v[i]);
            if ((int64_t)cur.u.l->n == k) { jv_list_push(A, out.u.l, cur); cur = jv_new_list(A); }
        }
        if (cur.u.l->n) {
            if (fill.t != JV_UNDEF) while ((int64_t)cur.u.l->n < k) jv_list_push(A, cur.u.l, fill);
            jv_list_push(A, out.u.l, cur);
        }
        return out;
    }
    /* string filters */
    if (v.t == JV_UNDEF) v = jv_cstr("");
    jv s = jv_to_str(r, v);
    if (eqs(name, "trim") || eqs(name, "strip")) return jj_str_strip(r, s, ARG("chars", 0, none), true, true);
    if (eqs(name, "upper")) return jj_str_case(r, s, CASE_UPPER);
    if (eqs(name, "lower")) return jj_str_case(r, s, CASE_LOWER);
    if (eqs(name, "capitalize")) return jj_str_case(r, s, CASE_CAP);
    if (eqs(name, "title")) return jj_str_case(r, s, CASE_TITLE);
    if (eqs(name, "replace")) {
        jv c = ARG("count", 2, none);
        return jj_str_replace(r, s, jv_to_str(r, ARG("old", 0, none)), jv_to_str(r, ARG("new", 1, none)),
                              c.t == JV_NONE ? -1 : jj_want_int(r, c, "count"));
    }
    if (eqs(name, "escape") || eqs(name, "e")) return html_escape(r, s);
    if (eqs(name, "wordcount")) {
        int64_t c = 0;
        bool in = false;
        for (size_t i = 0; i < s.u.s.n; i++) {
            unsigned char ch = (unsigned char)s.u.s.p[i];
            bool w = ch >= 0x80 || ch == '_' || (ch >= '0' && ch <= '9') || ((ch | 32) >= 'a' && (ch | 32) <= 'z');
            if (w && !in) c++;
            in = w;
        }
        return jv_int(c);
    }
    if (eqs(name, "indent")) {
        jv w = ARG("width", 0, jv_int(4));
        bool first = jv_truthy(ARG("first", 1, jv_bool(false))), blank = jv_truthy(ARG("blank", 2, jv_bool(false)));
        jv ind;
        if (w.t == JV_STR) ind = w;
        else {
            int64_t k = TERN_MAX(0, TERN_MIN(jj_want_int(r, w, "width"), 1024));
            char *sp = jj_alloc(A, (size_t)k + 1);
            memset(sp, ' ', (size_t)k);
            ind = jv_strn(sp, (size_t)k);
        }
        jbuf b = JB_SCRATCH(r);
        size_t st = 0;
        bool firstline = true;
        for (;;) {
            const char *nl = memchr(s.u.s.p + st, '\n', s.u.s.n - st);
            size_t e = nl ? (size_t)(nl - s.u.s.p) : s.u.s.n;
            bool empty = e == st;
            if ((firstline ? first : true) && (blank || !empty)) jb_put(r, &b, ind.u.s.p, ind.u.s.n);
            jb_put(r, &b, s.u.s.p + st, e - st);
            if (!nl) break;
            jb_put(r, &b, "\n", 1);
            st = e + 1;
            firstline = false;
        }
        return jb_str(&b);
    }
    if (eqs(name, "center")) {
        int64_t w = jj_want_int(r, ARG("width", 0, jv_int(80)), "width");
        int64_t n = (int64_t)jj_utf8_len(s.u.s.p, s.u.s.n);
        if (w <= n) return s;
        int64_t left = (w - n) / 2 + ((w - n) & w & 1), right = w - n - left;
        jbuf b = JB_SCRATCH(r);
        for (int64_t i = 0; i < left; i++) jb_put(r, &b, " ", 1);
        jb_put(r, &b, s.u.s.p, s.u.s.n);
        for (int64_t i = 0; i < right; i++) jb_put(r, &b, " ", 1);
        return jb_str(&b);
    }
    FAIL("%s:%d: unknown filter '%s'", r->tname, r->line, name);
}

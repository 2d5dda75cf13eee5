/*
 * jinja_eval.c — the tree-walking renderer: statements write to an output buffer,
 * expressions return values (jinja_int.h). Also the public parse/render entry points.
 *
 * Scopes: a chain of small dicts. `for` bodies and macro calls get a fresh scope, so a plain
 * `set` inside a loop does not leak out (that is what namespace() is for), as in Jinja2.
 * Macros close over the scope they were defined in (live, not a copy).
 * Undefined follows Jinja2's default Undefined: falsy, prints "", iterates as empty, `is
 * defined` false; using an attribute/item of it, or arithmetic on it, is an error.
 * Errors (jr_fail) longjmp to tern_jinja_render, which frees the render arena and buffer.
 */
#include "text/jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jmacro { const jnode *node; jscope *closure; };

void jr_fail(jrender *r, tern_status code, const char *fmt, ...) {
    if (r->err) {
        va_list ap;
        va_start(ap, fmt);
        r->err->code = code;
        vsnprintf(r->err->msg, sizeof r->err->msg, fmt, ap);
        va_end(ap);
    }
    longjmp(r->jb, 1);
}

static void step(jrender *r) {
    if (++r->steps > r->lim.max_steps)
        jr_fail(r, TERN_EINVAL, "%s:%d: more than %llu loop iterations / calls", r->tname, r->line,
                (unsigned long long)r->lim.max_steps);
}

/* Capture buffers (macro bodies, block set, filter blocks) live in the arena and are chained
 * on r->caps so an error can free their malloc'd text. */
static jbuf *cap_begin(jrender *r) {
    jbuf *b = jj_alloc(&r->arena, sizeof *b);
    b->max = r->lim.max_output;
    b->prev = r->caps;
    b->saved_out = r->out;
    r->caps = b;
    r->out = b;
    return b;
}
static jv cap_end(jrender *r, jbuf *b) {
    r->out = b->saved_out;
    r->caps = b->prev;
    jv s = jv_str_copy(&r->arena, b->p ? b->p : "", b->n);
    free(b->p);
    b->p = NULL;
    return s;
}

static jscope *new_scope(jrender *r, jscope *parent) {
    jscope *s = jj_alloc(&r->arena, sizeof *s);
    s->parent = parent;
    s->vars = jv_new_dict(&r->arena).u.d;
    return s;
}

static void scope_set(jrender *r, jscope *sc, const char *name, jv v) {
    jv_dict_set(&r->arena, sc->vars, jv_cstr(name), v);
}

static jv lookup(jrender *r, jscope *sc, const char *name, size_t len) {
    jv key = jv_strn(name, len);
    for (; sc; sc = sc->parent) {
        bool f;
        jv v = jv_dict_get(sc->vars, key, &f);
        if (f) return v;
    }
    int fn = jj_global_fn(name, len);
    if (fn) { jv v = {JV_FUNC, {0}}; v.u.fn = fn; return v; }
    return jv_undef();
}

/* ---------------- attribute / item access ---------------- */

static jv loop_attr(jrender *r, jloop *lp, const char *name) {
    int64_t n = (int64_t)lp->items->n, i = (int64_t)lp->i;
    if (!strcmp(name, "index")) return jv_int(i + 1);
    if (!strcmp(name, "index0")) return jv_int(i);
    if (!strcmp(name, "revindex")) return jv_int(n - i);
    if (!strcmp(name, "revindex0")) return jv_int(n - i - 1);
    if (!strcmp(name, "first")) return jv_bool(i == 0);
    if (!strcmp(name, "last")) return jv_bool(i == n - 1);
    if (!strcmp(name, "length")) return jv_int(n);
    if (!strcmp(name, "depth")) return jv_int(lp->depth + 1);
    if (!strcmp(name, "depth0")) return jv_int(lp->depth);
    if (!strcmp(name, "previtem")) return i > 0 ? lp->items->v[i - 1] : jv_undef();
    if (!strcmp(name, "nextitem")) return i + 1 < n ? lp->items->v[i + 1] : jv_undef();
    if (!strcmp(name, "cycle")) {
        jv m = {JV_METHOD, {0}};
        m.u.me = jj_alloc(&r->arena, sizeof(jmethod));
        m.u.me->self.t = JV_LOOP; m.u.me->self.u.lp = lp; m.u.me->name = "cycle";
        return m;
    }
    return jv_undef();
}

jv jj_getattr(jrender *r, jv obj, const char *name, size_t len) {
    if (obj.t == JV_UNDEF)
        jr_fail(r, TERN_EINVAL, "%s:%d: '%.*s' of an undefined value", r->tname, r->line, (int)len, name);
    if (obj.t == JV_LOOP) return loop_attr(r, obj.u.lp, name);
    if (obj.t == JV_DICT) {
        bool f;
        jv v = jv_dict_get(obj.u.d, jv_strn(name, len), &f);
        if (f || obj.u.d->ns) return v;
    }
    if (jj_has_method(obj, name, len)) {
        jv m = {JV_METHOD, {0}};
        m.u.me = jj_alloc(&r->arena, sizeof(jmethod));
        m.u.me->self = obj;
        m.u.me->name = jj_strndup(&r->arena, name, len);
        return m;
    }
    return jv_undef();
}

jv jj_getitem(jrender *r, jv obj, jv key) {
    if (obj.t == JV_UNDEF) jr_fail(r, TERN_EINVAL, "%s:%d: subscript of an undefined value", r->tname, r->line);
    if (obj.t == JV_DICT) {
        bool f;
        jv v = jv_dict_get(obj.u.d, key, &f);
        if (f) return v;
        if (key.t == JV_STR) return jj_getattr(r, obj, key.u.s.p, key.u.s.n);
        return jv_undef();
    }
    if (obj.t == JV_LOOP && key.t == JV_STR) return loop_attr(r, obj.u.lp, jj_strndup(&r->arena, key.u.s.p, key.u.s.n));
    if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
        int64_t i = key.t == JV_INT ? key.u.i : key.u.b;
        if (obj.t == JV_LIST) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            return i >= 0 && i < n ? obj.u.l->v[i] : jv_undef();
        }
        int64_t n = (int64_t)jj_utf8_len(obj.u.s.p, obj.u.s.n);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return jv_undef();
        size_t a = jj_utf8_offset(obj.u.s.p, obj.u.s.n, i), b = jj_utf8_offset(obj.u.s.p, obj.u.s.n, i + 1);
        return jv_strn(obj.u.s.p + a, b - a);
    }
    if (key.t == JV_STR) return jj_getattr(r, obj, key.u.s.p, key.u.s.n);
    return jv_undef();
}

static jv do_slice(jrender *r, jv obj, jv a, jv b, jv c) {
    int64_t step_ = c.t == JV_INT ? c.u.i : 1;
    if (step_ == 0) jr_fail(r, TERN_EINVAL, "%s:%d: slice step cannot be zero", r->tname, r->line);
    if (obj.t != JV_LIST && obj.t != JV_STR)
        jr_fail(r, TERN_EINVAL, "%s:%d: cannot slice a %s", r->tname, r->line, jv_type_name(obj));
    int64_t n = obj.t == JV_LIST ? (int64_t)obj.u.l->n : (int64_t)jj_utf8_len(obj.u.s.p, obj.u.s.n);
    int64_t lo, hi;
    /* Python slice.indices */
    if (step_ > 0) {
        lo = a.t == JV_INT ? a.u.i : 0;
        hi = b.t == JV_INT ? b.u.i : n;
        if (lo < 0) lo = lo + n < 0 ? 0 : lo + n; else if (lo > n) lo = n;
        if (hi < 0) hi = hi + n < 0 ? 0 : hi + n; else if (hi > n) hi = n;
    } else {
        lo = a.t == JV_INT ? a.u.i : n - 1;
        hi = b.t == JV_INT ? b.u.i : -1 - n; /* sentinel: before index 0 */
        if (lo < 0) lo = lo + n < 0 ? -1 : lo + n; else if (lo >= n) lo = n - 1;
        if (b.t == JV_INT) { if (hi < 0) hi = hi + n < 0 ? -1 : hi + n; else if (hi >= n) hi = n - 1; }
        else hi = -1;
    }
    if (obj.t == JV_LIST) {
        jv out = jv_new_list(&r->arena);
        for (int64_t i = lo; step_ > 0 ? i < hi : i > hi;) { /* a step past int64 ends the walk (fuzzed: [::2**63-1]) */
            jv_list_push(&r->arena, out.u.l, obj.u.l->v[i]);
            if (__builtin_add_overflow(i, step_, &i)) break;
        }
        return out;
    }
    jbuf tmp = JB_SCRATCH(r);
    const char *p = obj.u.s.p;
    size_t sn = obj.u.s.n;
    if (step_ == 1) {
        size_t x = jj_utf8_offset(p, sn, lo), y = hi > lo ? jj_utf8_offset(p, sn, hi) : x;
        return jv_strn(p + x, y - x);
    }
    for (int64_t i = lo; step_ > 0 ? i < hi : i > hi;) {
        size_t x = jj_utf8_offset(p, sn, i), y = jj_utf8_offset(p, sn, i + 1);
        jb_put(r, &tmp, p + x, y - x);
        if (__builtin_add_overflow(i, step_, &i)) break;
    }
    return jb_str(&tmp);
}

/* ---------------- operators ---------------- */

static jv arith(jrender *r, int op, jv a, jv b) {
    if (op == OP_CAT) {
        jv x = jv_to_str(r, a), y = jv_to_str(r, b);
        char *p = jj_alloc(&r->arena, x.u.s.n + y.u.s.n + 1);
        memcpy(p, x.u.s.p, x.u.s.n);
        memcpy(p + x.u.s.n, y.u.s.p, y.u.s.n);
        return jv_strn(p, x.u.s.n + y.u.s.n);
    }
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) return arith(r, OP_CAT, a, b);
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST) {
        jv out = jv_new_list(&r->arena);
        for (size_t i = 0; i < a.u.l->n; i++) jv_list_push(&r->arena, out.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) jv_list_push(&r->arena, out.u.l, b.u.l->v[i]);
        return out;
    }
    if (op == OP_MUL && (a.t == JV_STR || a.t == JV_LIST) && b.t == JV_INT) {
        jv t = a; a = b; b = t;
    }
    if (op == OP_MUL && a.t == JV_INT && (b.t == JV_STR || b.t == JV_LIST)) {
        int64_t k = a.u.i < 0 ? 0 : a.u.i;
        size_t unit = b.t == JV_STR ? b.u.s.n : b.u.l->n;
        if (!unit || !k) return b.t == JV_STR ? jv_strn("", 0) : jv_new_list(&r->arena); /* '' * 10**18: no loop */
        if ((uint64_t)k > (r->lim.max_output / unit) + 1)
            jr_fail(r, TERN_EINVAL, "%s:%d: repetition too large", r->tname, r->line);
        if (b.t == JV_STR) {
            char *p = jj_alloc(&r->arena, unit * (size_t)k + 1);
            for (int64_t i = 0; i < k; i++) memcpy(p + unit * (size_t)i, b.u.s.p, unit);
            return jv_strn(p, unit * (size_t)k);
        }
        jv out = jv_new_list(&r->arena);
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < unit; j++) jv_list_push(&r->arena, out.u.l, b.u.l->v[j]);
        return out;
    }
    if (op == OP_MOD && a.t == JV_STR)
        jr_fail(r, TERN_EUNSUPPORTED, "%s:%d: %%-formatting of strings is not supported", r->tname, r->line);
    if (!jv_is_num(a) || !jv_is_num(b))
        jr_fail(r, TERN_EINVAL, "%s:%d: unsupported operand types for arithmetic: %s and %s", r->tname, r->line,
                jv_type_name(a), jv_type_name(b));
    bool ints = a.t != JV_FLOAT && b.t != JV_FLOAT;
    /* the int operands (bools count as 0 / 1); a float's union member is not a bool, so it is not read as one */
    int64_t x = a.t == JV_INT ? a.u.i : a.t == JV_BOOL ? a.u.b : 0, y = b.t == JV_INT ? b.u.i : b.t == JV_BOOL ? b.u.b : 0;
    double fx = jv_num(a), fy = jv_num(b);
    int64_t res;
    switch (op) {
    case OP_ADD:
        if (ints && !__builtin_add_overflow(x, y, &res)) return jv_int(res);
        return jv_float(fx + fy);
    case OP_SUB:
        if (ints && !__builtin_sub_overflow(x, y, &res)) return jv_int(res);
        return jv_float(fx - fy);
    case OP_MUL:
        if (ints && !__builtin_mul_overflow(x, y, &res)) return jv_int(res);
        return jv_float(fx * fy);
    case OP_DIV:
        if (fy == 0) jr_fail(r, TERN_EINVAL, "%s:%d: division by zero", r->tname, r->line);
        return jv_float(fx / fy);
    case OP_FDIV: case OP_MOD:
        if (ints) {
            if (y == 0) jr_fail(r, TERN_EINVAL, "%s:%d: integer division or modulo by zero", r->tname, r->line);
            if (x == INT64_MIN && y == -1) return op == OP_FDIV ? jv_float(-(double)x) : jv_int(0);
            int64_t q = x / y, m = x % y;
            if (m && ((m < 0) != (y < 0))) { q--; m += y; }
            return jv_int(op == OP_FDIV ? q : m);
        }
        if (fy == 0) jr_fail(r, TERN_EINVAL, "%s:%d: float division or modulo by zero", r->tname, r->line);
        if (op == OP_FDIV) return jv_float(floor(fx / fy));
        {
            double m = fmod(fx, fy);
            if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
            return jv_float(m);
        }
    case OP_POW:
        if (ints && y >= 0) {
            int64_t acc = 1;
            bool ovf = false;
            /* by squaring: O(log y) steps (a loop of y multiplications never overflowed for x in {-1, 0, 1}: fuzzed,
             * 0 ** 304121724 spun for seconds). Squaring overflows only where the result would too (|x| >= 2, bits left) */
            int64_t base = x;
            for (uint64_t e = (uint64_t)y; e && !ovf;) {
                if (e & 1) ovf = __builtin_mul_overflow(acc, base, &acc);
                e >>= 1;
                if (e && !ovf) ovf = __builtin_mul_overflow(base, base, &base);
            }
            if (!ovf) return jv_int(acc);
        }
        return jv_float(pow(fx, fy));
    }
    jr_fail(r, TERN_EINTERNAL, "%s: bad operator", r->tname);
}

static bool contains(jrender *r, jv hay, jv needle) {
    if (hay.t == JV_STR) {
        if (needle.t != JV_STR)
            jr_fail(r, TERN_EINVAL, "%s:%d: 'in <string>' requires a string, got %s", r->tname, r->line,
                    jv_type_name(needle));
        if (!needle.u.s.n) return true;
        return memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
    }
    if (hay.t == JV_LIST) {
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (jv_equal(hay.u.l->v[i], needle)) return true;
        return false;
    }
    if (hay.t == JV_DICT) { bool f; jv_dict_get(hay.u.d, needle, &f); return f; }
    if (hay.t == JV_UNDEF) jr_fail(r, TERN_EINVAL, "%s:%d: 'in' on an undefined value", r->tname, r->line);
    jr_fail(r, TERN_EINVAL, "%s:%d: argument of type %s is not iterable", r->tname, r->line, jv_type_name(hay));
}

static bool compare(jrender *r, int op, jv a, jv b) {
    switch (op) {
    case OP_EQ: return jv_equal(a, b);
    case OP_NE: return !jv_equal(a, b);
    case OP_LT: return jv_cmp(r, a, b) < 0;
    case OP_LE: return jv_cmp(r, a, b) <= 0;
    case OP_GT: return jv_cmp(r, a, b) > 0;
    case OP_GE: return jv_cmp(r, a, b) >= 0;
    case OP_IN: return contains(r, b, a);
    case OP_NOTIN: return !contains(r, b, a);
    }
    return false;
}

/* ---------------- calls ---------------- */

static void exec_body(jrender *r, jscope *sc, const jnode *body);

static jv call_macro(jrender *r, struct jmacro *m, jv *pos, int npos, const char **kwn, jv *kwv, int nkw) {
    const jnode *n = m->node;
    step(r);
    if (++r->depth > r->lim.max_depth)
        jr_fail(r, TERN_EINVAL, "%s:%d: macro recursion deeper than %d", r->tname, r->line, r->lim.max_depth);
    jscope *sc = new_scope(r, m->closure);
    jv caller = jv_undef();
    if (n->kind == N_MACRO) {
        int np = n->args.nkw;
        if (npos > np) jr_fail(r, TERN_EINVAL, "%s:%d: macro '%s' takes %d arguments, got %d", r->tname, r->line, n->str, np, npos);
        for (int i = 0; i < np; i++) {
            jv v = jv_undef();
            bool set = false;
            if (i < npos) { v = pos[i]; set = true; }
            for (int k = 0; k < nkw; k++)
                if (!strcmp(kwn[k], n->args.kwname[i])) { v = kwv[k]; set = true; }
            if (!set && n->args.kwval[i]) v = jj_eval(r, sc, n->args.kwval[i]);
            scope_set(r, sc, n->args.kwname[i], v);
        }
        for (int k = 0; k < nkw; k++) {
            bool known = !strcmp(kwn[k], "caller");
            for (int i = 0; i < np && !known; i++) known = !strcmp(kwn[k], n->args.kwname[i]);
            if (!known) jr_fail(r, TERN_EINVAL, "%s:%d: macro '%s' has no parameter '%s'", r->tname, r->line, n->str, kwn[k]);
            if (!strcmp(kwn[k], "caller")) caller = kwv[k];
        }
        if (caller.t != JV_UNDEF) scope_set(r, sc, "caller", caller);
    } else { /* caller() of a call block */
        for (int i = 0; i < n->nnames; i++) scope_set(r, sc, n->names[i], i < npos ? pos[i] : jv_undef());
    }
    int saved_ctl = r->loopctl;
    jbuf *buf = cap_begin(r);
    exec_body(r, sc, n->b);
    jv s = cap_end(r, buf);
    r->loopctl = saved_ctl;
    r->depth--;
    return s;
}

jv jj_call_value(jrender *r, jv fn, jv *pos, int npos, const char **kwn, jv *kwv, int nkw) {
    switch (fn.t) {
    case JV_MACRO: return call_macro(r, fn.u.m, pos, npos, kwn, kwv, nkw);
    case JV_FUNC: return jj_call_global(r, fn.u.fn, pos, npos, kwn, kwv, nkw);
    case JV_METHOD: return jj_call_method(r, fn.u.me->self, fn.u.me->name, pos, npos, kwn, kwv, nkw);
    case JV_UNDEF: jr_fail(r, TERN_EINVAL, "%s:%d: call of an undefined function", r->tname, r->line);
    default: jr_fail(r, TERN_EINVAL, "%s:%d: a %s is not callable", r->tname, r->line, jv_type_name(fn));
    }
}

typedef struct evargs { jv *pos; int npos; jv *kwv; int nkw; } evargs;
static evargs eval_args(jrender *r, jscope *sc, const jargs *a) {
    evargs e = {0};
    e.npos = a->npos;
    e.nkw = a->nkw;
    if (a->npos) e.pos = jj_alloc(&r->arena, (size_t)a->npos * sizeof(jv));
    if (a->nkw) e.kwv = jj_alloc(&r->arena, (size_t)a->nkw * sizeof(jv));
    for (int i = 0; i < a->npos; i++) e.pos[i] = jj_eval(r, sc, a->pos[i]);
    for (int i = 0; i < a->nkw; i++) e.kwv[i] = jj_eval(r, sc, a->kwval[i]);
    return e;
}

/* Apply a filter chain whose innermost operand is a placeholder (block set / filter block). */
static jv apply_chain(jrender *r, jscope *sc, const jnode *f, jv v) {
    if (!f || f->kind != N_FILTER) return v;
    v = apply_chain(r, sc, f->a, v);
    evargs e = eval_args(r, sc, &f->args);
    r->line = f->line;
    return jj_apply_filter(r, sc, f->str, v, e.pos, e.npos, f->args.kwname, e.kwv, e.nkw);
}

/* ---------------- expressions ---------------- */

jv jj_eval(jrender *r, jscope *sc, const jnode *n) {
    r->line = n->line;
    switch (n->kind) {
    case N_CONST: return n->val;
    case N_NAME: return lookup(r, sc, n->str, n->len);
    case N_LIST: case N_TUPLE: {
        jv l = jv_new_list(&r->arena);
        l.u.l->tuple = n->kind == N_TUPLE;
        for (int i = 0; i < n->nkids; i++) jv_list_push(&r->arena, l.u.l, jj_eval(r, sc, n->kids[i]));
        return l;
    }
    case N_DICT: {
        jv d = jv_new_dict(&r->arena);
        for (int i = 0; i + 1 < n->nkids; i += 2) {
            jv k = jj_eval(r, sc, n->kids[i]);
            jv_dict_set(&r->arena, d.u.d, k, jj_eval(r, sc, n->kids[i + 1]));
        }
        return d;
    }
    case N_GETATTR: { jv o = jj_eval(r, sc, n->a); r->line = n->line; return jj_getattr(r, o, n->str, n->len); }
    case N_GETITEM: {
        jv o = jj_eval(r, sc, n->a), k = jj_eval(r, sc, n->b);
        r->line = n->line;
        return jj_getitem(r, o, k);
    }
    case N_SLICE: {
        jv o = jj_eval(r, sc, n->a);
        jv x[3];
        for (int i = 0; i < 3; i++) x[i] = n->kids[i] ? jj_eval(r, sc, n->kids[i]) : jv_none();
        r->line = n->line;
        return do_slice(r, o, x[0], x[1], x[2]);
    }
    case N_CALL: {
        jv fn = jj_eval(r, sc, n->a);
        evargs e = eval_args(r, sc, &n->args);
        r->line = n->line;
        return jj_call_value(r, fn, e.pos, e.npos, n->args.kwname, e.kwv, e.nkw);
    }
    case N_FILTER: {
        jv v = jj_eval(r, sc, n->a);
        evargs e = eval_args(r, sc, &n->args);
        r->line = n->line;
        return jj_apply_filter(r, sc, n->str, v, e.pos, e.npos, n->args.kwname, e.kwv, e.nkw);
    }
    case N_TEST: {
        jv v = jj_eval(r, sc, n->a);
        evargs e = eval_args(r, sc, &n->args);
        r->line = n->line;
        bool res = jj_apply_test(r, n->str, v, e.pos, e.npos);
        return jv_bool(n->negate ? !res : res);
    }
    case N_UNARY: {
        jv v = jj_eval(r, sc, n->a);
        if (!jv_is_num(v)) jr_fail(r, TERN_EINVAL, "%s:%d: bad operand type for unary %c: %s", r->tname, n->line,
                                   n->op == OP_NEG ? '-' : '+', jv_type_name(v));
        if (n->op == OP_POS) return v.t == JV_BOOL ? jv_int(v.u.b) : v;
        if (v.t == JV_FLOAT) return jv_float(-v.u.f);
        int64_t i = v.t == JV_INT ? v.u.i : v.u.b;
        return i == INT64_MIN ? jv_float(-(double)i) : jv_int(-i);
    }
    case N_BINARY: {
        jv a = jj_eval(r, sc, n->a), b = jj_eval(r, sc, n->b);
        r->line = n->line;
        return arith(r, n->op, a, b);
    }
    case N_COMPARE: {
        jv a = jj_eval(r, sc, n->a), b = jj_eval(r, sc, n->b);
        r->line = n->line;
        return jv_bool(compare(r, n->op, a, b));
    }
    case N_AND: { jv a = jj_eval(r, sc, n->a); return jv_truthy(a) ? jj_eval(r, sc, n->b) : a; }
    case N_OR: { jv a = jj_eval(r, sc, n->a); return jv_truthy(a) ? a : jj_eval(r, sc, n->b); }
    case N_NOT: return jv_bool(!jv_truthy(jj_eval(r, sc, n->a)));
    case N_COND:
        if (jv_truthy(jj_eval(r, sc, n->a))) return jj_eval(r, sc, n->b);
        return n->c ? jj_eval(r, sc, n->c) : jv_undef();
    default: jr_fail(r, TERN_EINTERNAL, "%s:%d: bad expression node", r->tname, n->line);
    }
}

/* ---------------- statements ---------------- */

static jv as_list(jrender *r, jv v) {
    switch (v.t) {
    case JV_LIST: return v;
    case JV_UNDEF: case JV_NONE: {
        if (v.t == JV_NONE) jr_fail(r, TERN_EINVAL, "%s:%d: 'NoneType' object is not iterable", r->tname, r->line);
        return jv_new_list(&r->arena);
    }
    case JV_DICT: {
        jv l = jv_new_list(&r->arena);
        for (size_t i = 0; i < v.u.d->n; i++) jv_list_push(&r->arena, l.u.l, v.u.d->k[i]);
        return l;
    }
    case JV_STR: {
        jv l = jv_new_list(&r->arena);
        for (size_t i = 0; i < v.u.s.n;) {
            size_t j = i + 1;
            while (j < v.u.s.n && ((unsigned char)v.u.s.p[j] & 0xC0) == 0x80) j++;
            jv_list_push(&r->arena, l.u.l, jv_strn(v.u.s.p + i, j - i));
            i = j;
        }
        return l;
    }
    default: jr_fail(r, TERN_EINVAL, "%s:%d: a %s is not iterable", r->tname, r->line, jv_type_name(v));
    }
}
jv jj_as_list(jrender *r, jv v) { return as_list(r, v); }

static void assign(jrender *r, jscope *sc, const char *const *names, int nn, jv v) {
    if (nn == 1) { scope_set(r, sc, names[0], v); return; }
    jv l = as_list(r, v);
    if ((int)l.u.l->n != nn)
        jr_fail(r, TERN_EINVAL, "%s:%d: cannot unpack %zu values into %d names", r->tname, r->line, l.u.l->n, nn);
    for (int i = 0; i < nn; i++) scope_set(r, sc, names[i], l.u.l->v[i]);
}

static void exec_for(jrender *r, jscope *sc, const jnode *n) {
    jv src = as_list(r, jj_eval(r, sc, n->a));
    const jnode *filt = n->kids[0];
    jlist *items = src.u.l;
    if (filt) {
        jv fl = jv_new_list(&r->arena);
        for (size_t i = 0; i < src.u.l->n; i++) {
            jscope *fs = new_scope(r, sc);
            assign(r, fs, n->names, n->nnames, src.u.l->v[i]);
            if (jv_truthy(jj_eval(r, fs, filt))) jv_list_push(&r->arena, fl.u.l, src.u.l->v[i]);
        }
        items = fl.u.l;
    }
    if (!items->n) {
        if (n->c) exec_body(r, sc, n->c);
        return;
    }
    jloop *lp = jj_alloc(&r->arena, sizeof *lp);
    lp->items = items;
    bool f;
    jv outer = jv_undef();
    for (jscope *s = sc; s; s = s->parent) { outer = jv_dict_get(s->vars, jv_cstr("loop"), &f); if (f) break; }
    lp->depth = outer.t == JV_LOOP ? outer.u.lp->depth + 1 : 0;
    size_t n_items = items->n;
    for (size_t i = 0; i < n_items; i++) {
        step(r);
        lp->i = i;
        jscope *is = new_scope(r, sc);
        jv lv = {JV_LOOP, {0}};
        lv.u.lp = lp;
        scope_set(r, is, "loop", lv);
        assign(r, is, n->names, n->nnames, items->v[i]);
        exec_body(r, is, n->b);
        if (r->loopctl == 1) { r->loopctl = 0; break; }
        r->loopctl = 0;
    }
}

static void exec_body(jrender *r, jscope *sc, const jnode *body) {
    for (int k = 0; k < body->nkids && !r->loopctl; k++) {
        const jnode *n = body->kids[k];
        r->line = n->line;
        switch (n->kind) {
        case N_TEXT: jb_put(r, r->out, n->str, n->len); break;
        case N_OUT: jv_write_str(r, r->out, jj_eval(r, sc, n->a)); break;
        case N_IF: {
            const jnode *c = n;
            while (c && c->kind == N_IF && !jv_truthy(jj_eval(r, sc, c->a))) c = c->c;
            if (c) exec_body(r, sc, c->kind == N_IF ? c->b : c);
            break;
        }
        case N_FOR: exec_for(r, sc, n); break;
        case N_SET: {
            jv v = jj_eval(r, sc, n->a);
            if (n->str) {
                jv ns = lookup(r, sc, n->names[0], strlen(n->names[0]));
                if (ns.t != JV_DICT || !ns.u.d->ns)
                    jr_fail(r, TERN_EINVAL, "%s:%d: cannot assign attribute on '%s' (not a namespace)", r->tname,
                            n->line, n->names[0]);
                jv_dict_set(&r->arena, ns.u.d, jv_cstr(n->str), v);
            } else assign(r, sc, n->names, n->nnames, v);
            break;
        }
        case N_SETBLOCK: case N_FILTERBLOCK: {
            jbuf *buf = cap_begin(r);
            exec_body(r, sc, n->b);
            jv s = cap_end(r, buf);
            s = apply_chain(r, sc, n->c, s);
            if (n->kind == N_SETBLOCK) scope_set(r, sc, n->str, s);
            else jv_write_str(r, r->out, s);
            break;
        }
        case N_MACRO: {
            jv m = {JV_MACRO, {0}};
            m.u.m = jj_alloc(&r->arena, sizeof(struct jmacro));
            m.u.m->node = n;
            m.u.m->closure = sc;
            scope_set(r, sc, n->str, m);
            break;
        }
        case N_CALLBLOCK: {
            const jnode *call = n->a;
            jv fn = jj_eval(r, sc, call->a);
            evargs e = eval_args(r, sc, &call->args);
            jv caller = {JV_MACRO, {0}};
            caller.u.m = jj_alloc(&r->arena, sizeof(struct jmacro));
            caller.u.m->node = n;
            caller.u.m->closure = sc;
            int nkw = e.nkw + 1;
            const char **kwn = jj_alloc(&r->arena, (size_t)nkw * sizeof(char *));
            jv *kwv = jj_alloc(&r->arena, (size_t)nkw * sizeof(jv));
            for (int i = 0; i < e.nkw; i++) { kwn[i] = call->args.kwname[i]; kwv[i] = e.kwv[i]; }
            kwn[e.nkw] = "caller";
            kwv[e.nkw] = caller;
            jv_write_str(r, r->out, jj_call_value(r, fn, e.pos, e.npos, kwn, kwv, nkw));
            break;
        }
        case N_BREAK: r->loopctl = 1; break;
        case N_CONTINUE: r->loopctl = 2; break;
        case N_DO: jj_eval(r, sc, n->a); break;
        case N_BODY: exec_body(r, sc, n); break;
        default: jr_fail(r, TERN_EINTERNAL, "%s:%d: bad statement node", r->tname, n->line);
        }
    }
}

/* ---------------- public API ---------------- */

tern_status tern_jinja_parse(const char *src, size_t len, const char *name, tern_jinja_template **out,
                             tern_error *err) {
    *out = NULL;
    if (!src) return tern_err(err, TERN_EINVAL, "template: no source");
    tern_jinja_template *t = calloc(1, sizeof *t);
    if (!t) return tern_err(err, TERN_ENOMEM, "template: out of memory");
    snprintf(t->name, sizeof t->name, "%s", name ? name : "template");
    jmp_buf jb;
    t->arena.cap = (size_t)1 << 30;
    t->arena.jb = &jb;
    t->arena.err = err;
    if (setjmp(jb)) {
        tern_status st = err ? err->code : TERN_EFORMAT;
        tern_jinja_free(t);
        return st ? st : TERN_EFORMAT;
    }
    t->root = jj_parse(t, src, len, &jb, err);
    t->arena.jb = NULL;
    *out = t;
    return TERN_OK;
}

void tern_jinja_free(tern_jinja_template *t) {
    if (!t) return;
    jj_arena_free(&t->arena);
    free(t);
}

tern_status tern_jinja_render(const tern_jinja_template *t, const cJSON *ctx, const tern_jinja_limits *limits,
                              char **out, size_t *out_len, tern_error *volatile err) { /* volatile: live across setjmp */
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t) return tern_err(err, TERN_EINVAL, "template: NULL template");
    if (ctx && !cJSON_IsObject(ctx)) return tern_err(err, TERN_EINVAL, "%s: render context must be a JSON object", t->name);
    tern_error local;
    if (!err) err = &local;
    jrender *r = calloc(1, sizeof *r);
    jbuf *buf = calloc(1, sizeof *buf);
    if (!r || !buf) { free(r); free(buf); return tern_err(err, TERN_ENOMEM, "%s: out of memory", t->name); }
    r->lim.max_output = 64u << 20;
    r->lim.max_memory = 512u << 20;
    r->lim.max_steps = 10000000;
    r->lim.max_depth = 200;
    if (limits) {
        if (limits->max_output) r->lim.max_output = limits->max_output;
        if (limits->max_memory) r->lim.max_memory = limits->max_memory;
        if (limits->max_steps) r->lim.max_steps = limits->max_steps;
        if (limits->max_depth) r->lim.max_depth = limits->max_depth;
    }
    buf->max = r->lim.max_output;
    r->err = err;
    r->tname = t->name;
    r->out = buf;
    r->arena.cap = r->lim.max_memory;
    r->arena.jb = &r->jb;
    r->arena.err = err;
    tern_status st = TERN_OK;
    if (setjmp(r->jb)) {
        st = err->code ? err->code : TERN_EINTERNAL;
        for (jbuf *c = r->caps; c; c = c->prev) free(c->p);
        free(buf->p);
        goto done;
    }
    err->code = TERN_OK;
    r->globals = new_scope(r, NULL);
    if (ctx)
        for (const cJSON *c = ctx->child; c; c = c->next)
            if (c->string) scope_set(r, r->globals, jj_strndup(&r->arena, c->string, strlen(c->string)),
                                     jv_from_cjson(&r->arena, c));
    exec_body(r, new_scope(r, r->globals), t->root);
    if (!buf->p) { buf->p = malloc(1); if (buf->p) buf->p[0] = 0; }
    if (!buf->p) { st = tern_err(err, TERN_ENOMEM, "%s: out of memory", t->name); goto done; }
    *out = buf->p;
    if (out_len) *out_len = buf->n;
done:
    jj_arena_free(&r->arena);
    free(r);
    free(buf);
    return st;
}

char *tern_jinja_tojson(const cJSON *v) {
    jrender *volatile r = calloc(1, sizeof *r);
    jbuf *const b = calloc(1, sizeof *b); /* on the heap: its fields change after setjmp, and are read after a longjmp */
    if (!r || !b) { free(r); free(b); return NULL; }
    tern_error e;
    r->err = &e;
    r->tname = "tojson";
    r->lim.max_depth = 512;
    r->arena.cap = (size_t)1 << 30;
    r->arena.jb = &r->jb;
    r->arena.err = &e;
    char *volatile res = NULL; /* set after setjmp, read after a possible longjmp */
    if (!setjmp(r->jb)) {
        jjson_opt o = {false, false, -1, ", ", ": "};
        jv_write_json(r, b, jv_from_cjson(&r->arena, v), &o, 0);
        res = b->p ? b->p : strdup("");
        b->p = NULL;
    }
    free(b->p);
    free(b);
    jj_arena_free(&r->arena);
    free(r);
    return res;
}

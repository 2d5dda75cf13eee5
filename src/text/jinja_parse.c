/*
 * jinja_parse.c — lexer and parser: template text -> AST (jinja_int.h).
 *
 * Lexing applies Jinja2's whitespace rules the way HF configures them, in the lexer, so the
 * AST only holds final text:
 *   - `{%-` / `{{-` / `{#-` strip all whitespace before the tag; `-%}` / `-}}` / `-#}` after it;
 *   - trim_blocks: the first newline after a block or comment tag is removed;
 *   - lstrip_blocks: spaces/tabs between the start of a line and a block or comment tag are
 *     removed (not for `{{`, not with `{%+`);
 *   - keep_trailing_newline=False: one trailing newline of the template is dropped;
 *   - `{% raw %}…{% endraw %}` is text.
 * The parser is recursive descent with Jinja2's precedence: ternary, or, and, not, compare
 * (== != < <= > >= in, not in), + -, ~, * / // %, **, unary - +, then postfix (.attr [i]
 * [a:b:c] (call)) and filters / tests (`|f(args)`, `is [not] test args`).
 * Errors longjmp out with "NAME:LINE: message" (TERN_EFORMAT).
 */
#include "text/jinja_int.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { T_EOF, T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP } ttype;
typedef struct tok { ttype t; int line; const char *s; size_t n; int64_t i; double f; } tok;

typedef struct P {
    tern_jinja_template *tpl;
    jj_arena *a;
    jmp_buf *jb;
    tern_error *err;
    tok *toks; size_t ntok, cap, pos;
    int depth;
} P;

#define PFAIL(p, line, ...) pfail(p, line, __VA_ARGS__)
TERN_PRINTF(3, 4) _Noreturn static void pfail(P *p, int line, const char *fmt, ...) {
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    jj_fail(p->jb, p->err, TERN_EFORMAT, "%s:%d: %s", p->tpl->name, line, m);
}

static tok *push(P *p, ttype t, int line, const char *s, size_t n) {
    if (p->ntok == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 256;
        tok *nt = jj_alloc(p->a, nc * sizeof(tok));
        if (p->ntok) memcpy(nt, p->toks, p->ntok * sizeof(tok));
        p->toks = nt;
        p->cap = nc;
    }
    tok *k = &p->toks[p->ntok++];
    memset(k, 0, sizeof *k);
    k->t = t; k->line = line; k->s = s; k->n = n;
    return k;
}

static int count_nl(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Lex string literal at s[*i] (quote char); returns the unescaped text in the arena. */
static void lex_string(P *p, const char *s, size_t n, size_t *i, int line, tok *out) {
    char q = s[*i];
    size_t j = *i + 1;
    char *buf = jj_alloc(p->a, n - *i + 1);
    size_t bn = 0;
    while (j < n && s[j] != q) {
        if (s[j] == '\\' && j + 1 < n) {
            char c = s[j + 1];
            j += 2;
            switch (c) {
            case 'n': buf[bn++] = '\n'; break;
            case 't': buf[bn++] = '\t'; break;
            case 'r': buf[bn++] = '\r'; break;
            case 'b': buf[bn++] = '\b'; break;
            case 'f': buf[bn++] = '\f'; break;
            case 'v': buf[bn++] = '\v'; break;
            case '0': buf[bn++] = '\0'; break;
            case '\\': case '\'': case '"': buf[bn++] = c; break;
            case '\n': break;
            case 'x': case 'u': case 'U': {
                int len = c == 'x' ? 2 : c == 'u' ? 4 : 8;
                if (j + (size_t)len > n) PFAIL(p, line, "bad \\%c escape in string", c);
                char hex[9] = {0};
                memcpy(hex, s + j, (size_t)len);
                char *end;
                unsigned long cp = strtoul(hex, &end, 16);
                if (end != hex + len || cp > 0x10FFFF) PFAIL(p, line, "bad \\%c escape in string", c);
                j += (size_t)len;
                if (cp < 0x80) buf[bn++] = (char)cp;
                else if (cp < 0x800) { buf[bn++] = (char)(0xC0 | (cp >> 6)); buf[bn++] = (char)(0x80 | (cp & 0x3F)); }
                else if (cp < 0x10000) {
                    buf[bn++] = (char)(0xE0 | (cp >> 12)); buf[bn++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    buf[bn++] = (char)(0x80 | (cp & 0x3F));
                } else {
                    buf[bn++] = (char)(0xF0 | (cp >> 18)); buf[bn++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                    buf[bn++] = (char)(0x80 | ((cp >> 6) & 0x3F)); buf[bn++] = (char)(0x80 | (cp & 0x3F));
                }
                break;
            }
            default: buf[bn++] = '\\'; buf[bn++] = c; break; /* Python keeps unknown escapes */
            }
        } else buf[bn++] = s[j++];
    }
    if (j >= n) PFAIL(p, line, "unterminated string literal");
    out->t = T_STR; out->s = buf; out->n = bn;
    *i = j + 1;
}

/* Lex the inside of a tag starting at s[i]; stops after the closing delimiter. Returns the
 * index after the closer; *strip_after set when the closer had '-'. */
static size_t lex_tag(P *p, const char *s, size_t n, size_t i, int *line, char kind, bool *strip_after) {
    int braces = 0;
    for (;;) {
        while (i < n && is_ws(s[i])) { if (s[i] == '\n') (*line)++; i++; }
        if (i >= n) PFAIL(p, *line, "unexpected end of template inside a tag");
        char c = s[i];
        char close = kind == '{' ? '}' : '%';
        if (braces == 0) {
            if ((c == '-' || c == '+') && i + 2 < n + 0 && s[i + 1] == close && s[i + 2] == '}') {
                *strip_after = c == '-';
                push(p, kind == '{' ? T_VEND : T_BEND, *line, NULL, 0);
                return i + 3;
            }
            if (c == close && i + 1 < n && s[i + 1] == '}') {
                *strip_after = false;
                push(p, kind == '{' ? T_VEND : T_BEND, *line, NULL, 0);
                return i + 2;
            }
        }
        if (isalpha((unsigned char)c) || c == '_') {
            size_t j = i;
            while (j < n && (isalnum((unsigned char)s[j]) || s[j] == '_')) j++;
            push(p, T_NAME, *line, s + i, j - i);
            i = j;
        } else if (isdigit((unsigned char)c)) {
            size_t j = i;
            bool fl = false;
            while (j < n && (isdigit((unsigned char)s[j]) || s[j] == '_')) j++;
            if (j + 1 < n && s[j] == '.' && isdigit((unsigned char)s[j + 1])) {
                fl = true;
                j++;
                while (j < n && (isdigit((unsigned char)s[j]) || s[j] == '_')) j++;
            }
            if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < n && (s[k] == '+' || s[k] == '-')) k++;
                if (k < n && isdigit((unsigned char)s[k])) {
                    fl = true;
                    j = k;
                    while (j < n && isdigit((unsigned char)s[j])) j++;
                }
            }
            char num[64];
            size_t nn = 0;
            for (size_t k = i; k < j && nn < sizeof num - 1; k++)
                if (s[k] != '_') num[nn++] = s[k];
            num[nn] = 0;
            tok *t = push(p, fl ? T_FLOAT : T_INT, *line, s + i, j - i);
            if (fl) t->f = strtod(num, NULL);
            else t->i = strtoll(num, NULL, 10);
            i = j;
        } else if (c == '\'' || c == '"') {
            tok *t = push(p, T_STR, *line, NULL, 0);
            int l0 = *line;
            size_t st = i;
            lex_string(p, s, n, &i, l0, t);
            *line += count_nl(s + st, i - st);
        } else {
            static const char *ops2[] = {"//", "**", "==", "!=", "<=", ">="};
            size_t len = 1;
            for (size_t k = 0; k < TERN_ARRAY_LEN(ops2); k++)
                if (i + 1 < n && s[i] == ops2[k][0] && s[i + 1] == ops2[k][1]) len = 2;
            if (len == 1 && !strchr("+-*/%~<>=()[]{}.,:|!", c)) PFAIL(p, *line, "unexpected character '%c'", c);
            if (c == '{' ) braces++;
            if (c == '}' ) braces--;
            push(p, T_OP, *line, s + i, len);
            i += len;
        }
    }
}

static void lex(P *p, const char *s, size_t n) {
    if (n && s[n - 1] == '\n') n--; /* keep_trailing_newline=False */
    size_t i = 0;
    int line = 1;
    bool strip_next = false, line_start = true;
    while (i <= n) {
        /* find next tag opener */
        size_t j = i;
        while (j + 1 < n && !(s[j] == '{' && (s[j + 1] == '{' || s[j + 1] == '%' || s[j + 1] == '#'))) j++;
        if (j + 1 >= n) j = n;
        const char *txt = s + i;
        size_t tn = j - i;
        int tline = line;
        line += count_nl(txt, tn);
        if (strip_next) {
            while (tn && is_ws(*txt)) { txt++; tn--; }
            strip_next = false;
        }
        if (j >= n) {
            if (tn) push(p, T_TEXT, tline, txt, tn);
            break;
        }
        char kind = s[j + 1];
        char mod = j + 2 < n ? s[j + 2] : 0;
        if (mod == '-') {
            while (tn && is_ws(txt[tn - 1])) tn--;
        } else if (kind != '{' && mod != '+') {
            size_t l = tn;
            while (l && txt[l - 1] != '\n') l--;
            if (l > 0 || line_start) {
                size_t k = l;
                while (k < tn && (txt[k] == ' ' || txt[k] == '\t')) k++;
                if (k == tn) tn = l;
            }
        }
        if (tn) push(p, T_TEXT, tline, txt, tn);
        size_t k = j + 2 + (mod == '-' || mod == '+');
        bool strip_after = false;
        if (kind == '#') {
            const char *e = NULL;
            for (size_t q = k; q + 1 < n; q++)
                if (s[q] == '#' && s[q + 1] == '}') { e = s + q; break; }
            if (!e) PFAIL(p, line, "unterminated comment");
            line += count_nl(s + k, (size_t)(e - s) - k);
            strip_after = e > s + k && e[-1] == '-';
            i = (size_t)(e - s) + 2;
        } else {
            size_t first = p->ntok;
            push(p, kind == '{' ? T_VBEGIN : T_BBEGIN, line, NULL, 0);
            i = lex_tag(p, s, n, k, &line, kind, &strip_after);
            /* {% raw %}: everything up to {% endraw %} is text */
            if (kind == '%' && p->ntok == first + 3 && p->toks[first + 1].t == T_NAME &&
                p->toks[first + 1].n == 3 && !memcmp(p->toks[first + 1].s, "raw", 3)) {
                p->ntok = first;
                size_t q = i, st = i;
                const char *body_end = NULL;
                for (; q + 1 < n; q++) {
                    if (s[q] != '{' || s[q + 1] != '%') continue;
                    size_t w = q + 2;
                    if (w < n && (s[w] == '-' || s[w] == '+')) w++;
                    while (w < n && is_ws(s[w])) w++;
                    if (w + 6 <= n && !memcmp(s + w, "endraw", 6)) { body_end = s + q; break; }
                }
                if (!body_end) PFAIL(p, line, "missing {%% endraw %%}");
                size_t bn = (size_t)(body_end - s) - st;
                const char *bt = s + st;
                if (strip_after) while (bn && is_ws(*bt)) { bt++; bn--; }
                else if (bn && *bt == '\n') { bt++; bn--; }
                bool lstrip_end = body_end[2] == '-';
                if (lstrip_end) while (bn && is_ws(bt[bn - 1])) bn--;
                if (bn) push(p, T_TEXT, line, bt, bn);
                line += count_nl(s + st, (size_t)(body_end - s) - st);
                size_t close = (size_t)(body_end - s) + 2;
                while (close + 1 < n && !(s[close] == '%' && s[close + 1] == '}')) close++;
                if (close + 1 >= n) PFAIL(p, line, "unterminated endraw tag");
                strip_after = s[close - 1] == '-';
                i = close + 2;
            }
        }
        line_start = false;
        if (strip_after) strip_next = true;
        else if (kind != '{' && i < n && s[i] == '\n') { i++; line++; line_start = true; }
        else if (kind != '{' && i + 1 < n && s[i] == '\r' && s[i + 1] == '\n') { i += 2; line++; line_start = true; }
    }
    push(p, T_EOF, line, NULL, 0);
}

/* ---------------- parser helpers ---------------- */

static tok *cur(P *p) { return &p->toks[p->pos]; }
static tok *adv(P *p) { tok *t = &p->toks[p->pos]; if (t->t != T_EOF) p->pos++; return t; }
static bool is_op(tok *t, const char *op) { return t->t == T_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n); }
static bool is_name(tok *t, const char *nm) { return t->t == T_NAME && t->n == strlen(nm) && !memcmp(t->s, nm, t->n); }
static bool accept_op(P *p, const char *op) { if (is_op(cur(p), op)) { p->pos++; return true; } return false; }
static bool accept_name(P *p, const char *nm) { if (is_name(cur(p), nm)) { p->pos++; return true; } return false; }
static void expect_op(P *p, const char *op) {
    if (!accept_op(p, op)) PFAIL(p, cur(p)->line, "expected '%s'", op);
}
static const char *tokdesc(tok *t, char *buf, size_t n) {
    switch (t->t) {
    case T_EOF: return "end of template";
    case T_VEND: return "'}}'";
    case T_BEND: return "'%}'";
    default: snprintf(buf, n, "'%.*s'", (int)TERN_MIN(t->n, 40), t->s ? t->s : ""); return buf;
    }
}
static const char *expect_ident(P *p) {
    tok *t = cur(p);
    char b[64];
    if (t->t != T_NAME) PFAIL(p, t->line, "expected a name, got %s", tokdesc(t, b, sizeof b));
    p->pos++;
    return jj_strndup(p->a, t->s, t->n);
}
static void expect_bend(P *p) {
    char b[64];
    if (cur(p)->t != T_BEND) PFAIL(p, cur(p)->line, "expected '%%}', got %s", tokdesc(cur(p), b, sizeof b));
    p->pos++;
}

static jnode *mk(P *p, jnode_kind k, int line) {
    jnode *n = jj_alloc(p->a, sizeof *n);
    n->kind = k;
    n->line = line;
    return n;
}

typedef struct nvec { jnode **v; int n, cap; } nvec;
static void nv_push(P *p, nvec *v, jnode *x) {
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 4;
        jnode **nn = jj_alloc(p->a, (size_t)nc * sizeof *nn);
        if (v->n) memcpy(nn, v->v, (size_t)v->n * sizeof *nn);
        v->v = nn;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

/* ---------------- expressions ---------------- */

static jnode *p_expr(P *p);
static jnode *p_or(P *p);
static jnode *p_unary(P *p, bool with_filter);

static void p_args(P *p, jargs *a) { /* after '(' */
    nvec pos = {0}, kwv = {0};
    const char **kwn = NULL;
    int nkwn = 0, capk = 0;
    while (!accept_op(p, ")")) {
        if (pos.n || kwv.n) expect_op(p, ",");
        if (accept_op(p, ")")) break;
        tok *t = cur(p);
        if (t->t == T_NAME && is_op(&p->toks[p->pos + 1], "=")) {
            p->pos += 2;
            if (nkwn == capk) {
                capk = capk ? capk * 2 : 4;
                const char **nk = jj_alloc(p->a, (size_t)capk * sizeof *nk);
                if (nkwn) memcpy(nk, kwn, (size_t)nkwn * sizeof *nk);
                kwn = nk;
            }
            kwn[nkwn++] = jj_strndup(p->a, t->s, t->n);
            nv_push(p, &kwv, p_expr(p));
        } else {
            if (kwv.n) PFAIL(p, t->line, "positional argument after keyword argument");
            nv_push(p, &pos, p_expr(p));
        }
    }
    a->pos = pos.v; a->npos = pos.n; a->kwname = kwn; a->kwval = kwv.v; a->nkw = kwv.n;
}

static jnode *p_primary(P *p) {
    tok *t = adv(p);
    char b[64];
    jnode *n;
    switch (t->t) {
    case T_STR: {
        n = mk(p, N_CONST, t->line);
        /* adjacent string literals concatenate */
        size_t len = t->n;
        const char *s = t->s;
        while (cur(p)->t == T_STR) {
            tok *u = adv(p);
            char *c = jj_alloc(p->a, len + u->n + 1);
            memcpy(c, s, len);
            memcpy(c + len, u->s, u->n);
            s = c;
            len += u->n;
        }
        n->val = jv_strn(s, len);
        return n;
    }
    case T_INT: n = mk(p, N_CONST, t->line); n->val = jv_int(t->i); return n;
    case T_FLOAT: n = mk(p, N_CONST, t->line); n->val = jv_float(t->f); return n;
    case T_NAME:
        n = mk(p, N_CONST, t->line);
        if (is_name(t, "true") || is_name(t, "True")) n->val = jv_bool(true);
        else if (is_name(t, "false") || is_name(t, "False")) n->val = jv_bool(false);
        else if (is_name(t, "none") || is_name(t, "None")) n->val = jv_none();
        else { n->kind = N_NAME; n->str = jj_strndup(p->a, t->s, t->n); n->len = t->n; }
        return n;
    case T_OP:
        if (is_op(t, "(")) {
            if (accept_op(p, ")")) { n = mk(p, N_TUPLE, t->line); return n; }
            jnode *e = p_expr(p);
            if (accept_op(p, ")")) return e;
            nvec v = {0};
            nv_push(p, &v, e);
            while (accept_op(p, ",")) {
                if (is_op(cur(p), ")")) break;
                nv_push(p, &v, p_expr(p));
            }
            expect_op(p, ")");
            n = mk(p, N_TUPLE, t->line);
            n->kids = v.v; n->nkids = v.n;
            return n;
        }
        if (is_op(t, "[")) {
            nvec v = {0};
            while (!accept_op(p, "]")) {
                if (v.n) expect_op(p, ",");
                if (accept_op(p, "]")) break;
                nv_push(p, &v, p_expr(p));
            }
            n = mk(p, N_LIST, t->line);
            n->kids = v.v; n->nkids = v.n;
            return n;
        }
        if (is_op(t, "{")) {
            nvec v = {0};
            while (!accept_op(p, "}")) {
                if (v.n) expect_op(p, ",");
                if (accept_op(p, "}")) break;
                nv_push(p, &v, p_expr(p));
                expect_op(p, ":");
                nv_push(p, &v, p_expr(p));
            }
            n = mk(p, N_DICT, t->line);
            n->kids = v.v; n->nkids = v.n;
            return n;
        }
        /* fallthrough */
    default: PFAIL(p, t->line, "unexpected %s in expression", tokdesc(t, b, sizeof b));
    }
}

static jnode *p_postfix(P *p, jnode *e) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, ".")) {
            p->pos++;
            tok *nm = adv(p);
            jnode *n = mk(p, N_GETATTR, t->line);
            n->a = e;
            if (nm->t == T_NAME) { n->str = jj_strndup(p->a, nm->s, nm->n); n->len = nm->n; }
            else if (nm->t == T_INT) { n->kind = N_GETITEM; n->b = mk(p, N_CONST, t->line); n->b->val = jv_int(nm->i); }
            else PFAIL(p, t->line, "expected an attribute name after '.'");
            e = n;
        } else if (is_op(t, "[")) {
            p->pos++;
            jnode *idx[3] = {0};
            int ncolon = 0;
            for (;;) {
                if (is_op(cur(p), ":")) { p->pos++; if (++ncolon > 2) PFAIL(p, t->line, "bad slice"); continue; }
                if (is_op(cur(p), "]")) break;
                if (idx[ncolon]) PFAIL(p, t->line, "expected ']'");
                idx[ncolon] = p_expr(p);
            }
            expect_op(p, "]");
            jnode *n = mk(p, ncolon ? N_SLICE : N_GETITEM, t->line);
            n->a = e;
            if (ncolon) { n->kids = jj_alloc(p->a, 3 * sizeof(jnode *)); memcpy(n->kids, idx, sizeof idx); n->nkids = 3; }
            else { if (!idx[0]) PFAIL(p, t->line, "empty subscript"); n->b = idx[0]; }
            e = n;
        } else if (is_op(t, "(")) {
            p->pos++;
            jnode *n = mk(p, N_CALL, t->line);
            n->a = e;
            p_args(p, &n->args);
            e = n;
        } else return e;
    }
}

static jnode *p_filters(P *p, jnode *e) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, "|")) {
            p->pos++;
            jnode *n = mk(p, N_FILTER, t->line);
            n->a = e;
            n->str = expect_ident(p);
            while (accept_op(p, ".")) { /* dotted filter names are not used; keep the last part */
                n->str = expect_ident(p);
            }
            n->len = strlen(n->str);
            if (accept_op(p, "(")) p_args(p, &n->args);
            e = n;
        } else if (is_name(t, "is")) {
            p->pos++;
            jnode *n = mk(p, N_TEST, t->line);
            n->a = e;
            n->negate = accept_name(p, "not");
            tok *nm = cur(p);
            if (nm->t == T_NAME) { n->str = expect_ident(p); }
            else if (nm->t == T_OP && (is_op(nm, "==") || is_op(nm, "!=") || is_op(nm, "<") || is_op(nm, ">") ||
                                       is_op(nm, "<=") || is_op(nm, ">="))) {
                p->pos++;
                n->str = jj_strndup(p->a, nm->s, nm->n);
            } else PFAIL(p, nm->line, "expected a test name after 'is'");
            n->len = strlen(n->str);
            if (accept_op(p, "(")) p_args(p, &n->args);
            else {
                tok *a = cur(p);
                bool arg = a->t == T_STR || a->t == T_INT || a->t == T_FLOAT || is_op(a, "[") || is_op(a, "{") ||
                           (a->t == T_NAME && !is_name(a, "and") && !is_name(a, "or") && !is_name(a, "else") &&
                            !is_name(a, "if") && !is_name(a, "is") && !is_name(a, "in") && !is_name(a, "not"));
                if (arg) {
                    n->args.pos = jj_alloc(p->a, sizeof(jnode *));
                    n->args.pos[0] = p_postfix(p, p_primary(p));
                    n->args.npos = 1;
                }
            }
            e = n;
        } else return e;
    }
}

static jnode *binop(P *p, int op, jnode *a, jnode *b, int line) {
    jnode *n = mk(p, N_BINARY, line);
    n->op = op; n->a = a; n->b = b;
    return n;
}

static jnode *p_unary(P *p, bool with_filter) {
    tok *t = cur(p);
    if (++p->depth > 200) PFAIL(p, t->line, "expression nested too deeply");
    jnode *e;
    if (is_op(t, "-") || is_op(t, "+")) {
        p->pos++;
        e = mk(p, N_UNARY, t->line);
        e->op = is_op(t, "-") ? OP_NEG : OP_POS;
        e->a = p_unary(p, false);
    } else e = p_postfix(p, p_primary(p));
    if (with_filter) e = p_filters(p, e);
    p->depth--;
    return e;
}

static jnode *p_pow(P *p) {
    jnode *e = p_unary(p, true);
    while (is_op(cur(p), "**")) { int l = adv(p)->line; e = binop(p, OP_POW, e, p_unary(p, true), l); }
    return e;
}
static jnode *p_math2(P *p) {
    jnode *e = p_pow(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FDIV : is_op(t, "%") ? OP_MOD : 0;
        if (!op) return e;
        p->pos++;
        e = binop(p, op, e, p_pow(p), t->line);
    }
}
static jnode *p_concat(P *p) {
    jnode *e = p_math2(p);
    while (is_op(cur(p), "~")) { int l = adv(p)->line; e = binop(p, OP_CAT, e, p_math2(p), l); }
    return e;
}
static jnode *p_math1(P *p) {
    jnode *e = p_concat(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : 0;
        if (!op) return e;
        p->pos++;
        e = binop(p, op, e, p_concat(p), t->line);
    }
}
static jnode *p_compare(P *p) {
    jnode *e = p_math1(p);
    jnode *chain = NULL; /* a < b < c == (a < b) and (b < c) */
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "==") ? OP_EQ : is_op(t, "!=") ? OP_NE : is_op(t, "<") ? OP_LT : is_op(t, "<=") ? OP_LE
               : is_op(t, ">") ? OP_GT : is_op(t, ">=") ? OP_GE : is_name(t, "in") ? OP_IN : 0;
        if (!op && is_name(t, "not") && is_name(&p->toks[p->pos + 1], "in")) { op = OP_NOTIN; p->pos++; }
        if (!op) break;
        p->pos++;
        jnode *rhs = p_math1(p);
        jnode *c = mk(p, N_COMPARE, t->line);
        c->op = op;
        c->a = chain ? chain->b : e;
        c->b = rhs;
        if (!chain) e = c;
        else { jnode *a = mk(p, N_AND, t->line); a->a = e; a->b = c; e = a; }
        chain = c;
    }
    return e;
}
static jnode *p_not(P *p) {
    tok *t = cur(p);
    if (is_name(t, "not")) {
        p->pos++;
        if (++p->depth > 200) PFAIL(p, t->line, "expression nested too deeply");
        jnode *n = mk(p, N_NOT, t->line);
        n->a = p_not(p);
        p->depth--;
        return n;
    }
    return p_compare(p);
}
static jnode *p_and(P *p) {
    jnode *e = p_not(p);
    while (is_name(cur(p), "and")) { jnode *n = mk(p, N_AND, adv(p)->line); n->a = e; n->b = p_not(p); e = n; }
    return e;
}
static jnode *p_or(P *p) {
    jnode *e = p_and(p);
    while (is_name(cur(p), "or")) { jnode *n = mk(p, N_OR, adv(p)->line); n->a = e; n->b = p_and(p); e = n; }
    return e;
}
static jnode *p_expr(P *p) {
    if (++p->depth > 200) PFAIL(p, cur(p)->line, "expression nested too deeply");
    jnode *e = p_or(p);
    while (is_name(cur(p), "if")) {
        jnode *n = mk(p, N_COND, adv(p)->line);
        n->a = p_or(p);  /* condition */
        n->b = e;        /* then */
        n->c = accept_name(p, "else") ? p_expr(p) : NULL;
        e = n;
    }
    p->depth--;
    return e;
}
/* expression or bare tuple `a, b` (for `set x = 1, 2` and `for ... in a, b`) */
static jnode *p_tuple_expr(P *p) {
    jnode *e = p_expr(p);
    if (!is_op(cur(p), ",")) return e;
    nvec v = {0};
    nv_push(p, &v, e);
    while (accept_op(p, ",")) {
        if (cur(p)->t == T_BEND) break;
        nv_push(p, &v, p_expr(p));
    }
    jnode *n = mk(p, N_TUPLE, e->line);
    n->kids = v.v; n->nkids = v.n;
    return n;
}

/* ---------------- statements ---------------- */

static jnode *p_body(P *p, const char *const *ends, const char **ended);

static void p_targets(P *p, jnode *n) {
    const char *names[16];
    int k = 0;
    bool paren = accept_op(p, "(");
    do {
        if (k == 16) PFAIL(p, cur(p)->line, "too many loop targets");
        names[k++] = expect_ident(p);
    } while (accept_op(p, ","));
    if (paren) expect_op(p, ")");
    n->names = jj_alloc(p->a, (size_t)k * sizeof(char *));
    memcpy(n->names, names, (size_t)k * sizeof(char *));
    n->nnames = k;
}

static jnode *p_stmt(P *p) {
    tok *t = cur(p);
    int line = t->line;
    char b[64];
    if (t->t != T_NAME) PFAIL(p, line, "expected a statement name, got %s", tokdesc(t, b, sizeof b));
    p->pos++;
    jnode *n;
    if (is_name(t, "if")) {
        n = mk(p, N_IF, line);
        n->a = p_tuple_expr(p);
        expect_bend(p);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        const char *e;
        n->b = p_body(p, ends, &e);
        jnode *tail = n;
        while (!strcmp(e, "elif")) {
            jnode *el = mk(p, N_IF, cur(p)->line);
            el->a = p_tuple_expr(p);
            expect_bend(p);
            el->b = p_body(p, ends, &e);
            tail->c = el;
            tail = el;
        }
        if (!strcmp(e, "else")) {
            expect_bend(p);
            static const char *const ends2[] = {"endif", NULL};
            tail->c = p_body(p, ends2, &e);
        }
        expect_bend(p);
        return n;
    }
    if (is_name(t, "for")) {
        n = mk(p, N_FOR, line);
        p_targets(p, n);
        if (!accept_name(p, "in")) PFAIL(p, line, "expected 'in' in for statement");
        n->a = p_or(p); /* iterable (no ternary: `if` would be the loop filter) */
        if (is_op(cur(p), ",")) {
            jnode *tu = mk(p, N_TUPLE, line);
            nvec v = {0};
            nv_push(p, &v, n->a);
            while (accept_op(p, ",")) nv_push(p, &v, p_or(p));
            tu->kids = v.v; tu->nkids = v.n;
            n->a = tu;
        }
        jnode *filt = NULL;
        if (accept_name(p, "if")) filt = p_expr(p);
        if (accept_name(p, "recursive")) PFAIL(p, line, "recursive for loops are not supported");
        expect_bend(p);
        static const char *const ends[] = {"else", "endfor", NULL};
        const char *e;
        n->b = p_body(p, ends, &e);
        if (!strcmp(e, "else")) {
            expect_bend(p);
            static const char *const ends2[] = {"endfor", NULL};
            n->c = p_body(p, ends2, &e);
        }
        expect_bend(p);
        n->kids = jj_alloc(p->a, sizeof(jnode *));
        n->kids[0] = filt;
        n->nkids = 1;
        return n;
    }
    if (is_name(t, "set")) {
        const char *name = expect_ident(p);
        const char *attr = NULL;
        if (accept_op(p, ".")) attr = expect_ident(p);
        if (!attr && is_op(cur(p), ",")) { /* set a, b = ... */
            p->pos--;
            n = mk(p, N_SET, line);
            p_targets(p, n);
            expect_op(p, "=");
            n->a = p_tuple_expr(p);
            expect_bend(p);
            return n;
        }
        if (accept_op(p, "=")) {
            n = mk(p, N_SET, line);
            n->names = jj_alloc(p->a, sizeof(char *));
            n->names[0] = name;
            n->nnames = 1;
            n->str = attr;
            n->a = p_tuple_expr(p);
            expect_bend(p);
            return n;
        }
        if (attr) PFAIL(p, line, "block set cannot assign an attribute");
        n = mk(p, N_SETBLOCK, line);
        n->str = name;
        jnode *filt = NULL;
        if (is_op(cur(p), "|")) { /* {% set x | filter %} */
            jnode *ph = mk(p, N_CONST, line);
            filt = p_filters(p, ph);
        }
        expect_bend(p);
        static const char *const ends[] = {"endset", NULL};
        const char *e;
        n->b = p_body(p, ends, &e);
        n->c = filt;
        expect_bend(p);
        return n;
    }
    if (is_name(t, "macro")) {
        n = mk(p, N_MACRO, line);
        n->str = expect_ident(p);
        expect_op(p, "(");
        nvec defs = {0};
        const char *names[64];
        int k = 0;
        while (!accept_op(p, ")")) {
            if (k) expect_op(p, ",");
            if (accept_op(p, ")")) break;
            if (k == 64) PFAIL(p, line, "too many macro parameters");
            names[k++] = expect_ident(p);
            nv_push(p, &defs, accept_op(p, "=") ? p_expr(p) : NULL);
        }
        n->args.kwname = jj_alloc(p->a, (size_t)(k + 1) * sizeof(char *));
        memcpy(n->args.kwname, names, (size_t)k * sizeof(char *));
        n->args.kwval = defs.v;
        n->args.nkw = k;
        expect_bend(p);
        static const char *const ends[] = {"endmacro", NULL};
        const char *e;
        n->b = p_body(p, ends, &e);
        if (cur(p)->t == T_NAME) p->pos++; /* {% endmacro name %} */
        expect_bend(p);
        return n;
    }
    if (is_name(t, "call")) {
        n = mk(p, N_CALLBLOCK, line);
        if (accept_op(p, "(")) { /* caller parameters */
            jnode tmp = {0};
            if (!accept_op(p, ")")) { p_targets(p, &tmp); expect_op(p, ")"); }
            n->names = tmp.names; n->nnames = tmp.nnames;
        }
        n->a = p_expr(p);
        if (n->a->kind != N_CALL) PFAIL(p, line, "call block needs a macro call");
        expect_bend(p);
        static const char *const ends[] = {"endcall", NULL};
        const char *e;
        n->b = p_body(p, ends, &e);
        expect_bend(p);
        return n;
    }
    if (is_name(t, "filter")) {
        n = mk(p, N_FILTERBLOCK, line);
        jnode *f = mk(p, N_FILTER, line);
        f->a = mk(p, N_CONST, line);
        f->str = expect_ident(p);
        f->len = strlen(f->str);
        if (accept_op(p, "(")) p_args(p, &f->args);
        n->c = p_filters(p, f); /* chained: {% filter a|b %} */
        expect_bend(p);
        static const char *const ends[] = {"endfilter", NULL};
        const char *e;
        n->b = p_body(p, ends, &e);
        expect_bend(p);
        return n;
    }
    if (is_name(t, "generation")) { /* transformers' {% generation %}: render the body as is */
        expect_bend(p);
        static const char *const ends[] = {"endgeneration", NULL};
        const char *e;
        n = p_body(p, ends, &e);
        expect_bend(p);
        return n;
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        n = mk(p, is_name(t, "break") ? N_BREAK : N_CONTINUE, line);
        expect_bend(p);
        return n;
    }
    if (is_name(t, "do")) {
        n = mk(p, N_DO, line);
        n->a = p_tuple_expr(p);
        expect_bend(p);
        return n;
    }
    PFAIL(p, line, "unknown statement '%.*s'", (int)t->n, t->s);
}

/* Parse statements until a block tag whose name is in `ends` (NULL = until EOF). The end
 * keyword is consumed (its tag's remaining tokens are not). */
static jnode *p_body(P *p, const char *const *ends, const char **ended) {
    if (++p->depth > 200) PFAIL(p, cur(p)->line, "blocks nested too deeply");
    jnode *body = mk(p, N_BODY, cur(p)->line);
    nvec v = {0};
    for (;;) {
        tok *t = cur(p);
        if (t->t == T_EOF) {
            if (ends) PFAIL(p, t->line, "unexpected end of template (missing {%% %s %%})", ends[0]);
            break;
        }
        if (t->t == T_TEXT) {
            jnode *n = mk(p, N_TEXT, t->line);
            n->str = t->s; n->len = t->n;
            nv_push(p, &v, n);
            p->pos++;
        } else if (t->t == T_VBEGIN) {
            p->pos++;
            jnode *n = mk(p, N_OUT, t->line);
            n->a = p_tuple_expr(p);
            char b[64];
            if (cur(p)->t != T_VEND) PFAIL(p, cur(p)->line, "expected '}}', got %s", tokdesc(cur(p), b, sizeof b));
            p->pos++;
            nv_push(p, &v, n);
        } else if (t->t == T_BBEGIN) {
            tok *k = &p->toks[p->pos + 1];
            if (ends && k->t == T_NAME)
                for (int i = 0; ends[i]; i++)
                    if (is_name(k, ends[i])) {
                        p->pos += 2;
                        *ended = ends[i];
                        goto done;
                    }
            if (k->t == T_NAME && (is_name(k, "endif") || is_name(k, "endfor") || is_name(k, "else") ||
                                   is_name(k, "elif") || is_name(k, "endmacro") || is_name(k, "endset") ||
                                   is_name(k, "endcall") || is_name(k, "endfilter") || is_name(k, "endgeneration")))
                PFAIL(p, k->line, "unexpected '%.*s'", (int)k->n, k->s);
            p->pos++;
            nv_push(p, &v, p_stmt(p));
        } else {
            char b[64];
            PFAIL(p, t->line, "unexpected %s", tokdesc(t, b, sizeof b));
        }
    }
done:
    body->kids = v.v;
    body->nkids = v.n;
    p->depth--;
    return body;
}

jnode *jj_parse(tern_jinja_template *t, const char *src, size_t len, jmp_buf *jb, tern_error *err) {
    P p = {0};
    p.tpl = t; p.a = &t->arena; p.jb = jb; p.err = err;
    lex(&p, src, len);
    jnode *root = p_body(&p, NULL, NULL);
    return root;
}
